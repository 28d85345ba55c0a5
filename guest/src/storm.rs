//! The `storm` step: many load/unload cycles of one program while the
//! plan's listeners record, to push a large record stream through the
//! channel.
//!
//! As in `measure.rs`, the object is parsed once and each cycle is aya's
//! `load()` (one `BPF_PROG_LOAD`: a PROG_LOAD and one KSYMBOL register per
//! JITed function) and `unload()` (the close of the only program fd, which
//! emits the PROG_UNLOAD and the KSYMBOL unregisters before it returns).
//! So every cycle's records are in the rings when the cycle ends, and no
//! wait for the kernel to free the program is needed: a new load gets a new
//! id, and an address the JIT reuses is registered only after the previous
//! owner's unregister. Every `drain_every` cycles the rings are drained
//! through the agent's own `drain` (the same code path as the `drain` step),
//! and once more at the end.

use anyhow::{bail, Context, Result};
use kloop_protocol::Step;

use crate::agent::{fixture_program, parse_fixture};
use crate::measure::{load, unload};

/// Runs one `Step::Storm`; `drain` empties every listener ring to the host.
pub fn run(step: &Step, mut drain: impl FnMut() -> Result<()>) -> Result<()> {
    let Step::Storm {
        fixture,
        program,
        cycles,
        drain_every,
        ..
    } = step
    else {
        bail!("storm::run called with a step that is not storm: {step:?}");
    };
    if *drain_every == 0 {
        bail!("storm: drain_every must be at least 1");
    }
    let mut ebpf = parse_fixture(fixture)?;
    let prog = fixture_program(&mut ebpf, fixture, program)?;
    let what = format!("{fixture}/{program}");
    for i in 0..*cycles {
        load(prog).with_context(|| format!("storm: loading {what}, cycle {i}"))?;
        unload(prog).with_context(|| format!("storm: unloading {what}, cycle {i}"))?;
        if (i + 1) % drain_every == 0 {
            drain().with_context(|| format!("storm: draining after cycle {i}"))?;
        }
    }
    drain().context("storm: final drain")
}
