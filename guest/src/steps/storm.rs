//! The `storm` step: many load/unload cycles of one program while the
//! plan's listeners record, to push a large record stream through the
//! channel, to overflow small rings on purpose, or to race a side-band
//! reader that looks every new program up by id.
//!
//! As in the `measure` step, the object is parsed once and each cycle is aya's
//! `load()` (one `BPF_PROG_LOAD`: a PROG_LOAD and one KSYMBOL register per
//! JITed function) and `unload()` (the close of the only program fd, which
//! emits the PROG_UNLOAD and the KSYMBOL unregisters before it returns).
//! So every cycle's records are in the rings when the cycle ends, and no
//! wait for the kernel to free the program is needed: a new load gets a new
//! id, and an address the JIT reuses is registered only after the previous
//! owner's unregister.
//!
//! Draining, by the step's options:
//! - `drain_every = K > 0`, no `lookup`: every K cycles the rings go to the
//!   host, and once more at the end (the channel load test).
//! - `drain_every = 0`: nothing is read until the storm ends, so small rings
//!   overflow. The kernel reports the dropped records only in a LOST record
//!   it writes in front of the *next* record that fits a ring
//!   (`perf_output_begin`); after the final drain nothing else would come,
//!   and the count would stay in the kernel. So the storm then loads and
//!   unloads the program once more on every online CPU (pinned there),
//!   which flushes each ring's pending LOST, and drains again. Those flush
//!   programs are storm programs like the others (their ids are in
//!   `StormDone`), so the host's accounting stays exact.
//! - `lookup`: a side-band thread owns the rings while the storm runs, as
//!   perf's side-band thread does: it drains them continuously, and for
//!   every PROG_LOAD it finds opens the id with `BPF_PROG_GET_FD_BY_ID` at
//!   once, counting found / ENOENT. The bytes still all go to the host.
//!
//! Every storm ends with `StormDone` (every id it loaded, the function count).

use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use aya::programs::Program;
use kloop_protocol::Message;

use crate::bpf;
use crate::channel::send;
use crate::fixtures::{fixture_program, load_program, parse_fixture, unload_program};
use crate::perf::{self, Ring};
use crate::sys::{self, OsContext};

/// At most this many distinct lookup errors other than ENOENT are reported.
const MAX_OTHER_ERRORS: usize = 8;

/// Runs one `storm` of `cycles` load/unload cycles of `fixture`/`program`
/// with the plan's listener `rings`; returns the record bytes sent to the
/// host.
pub fn run(
    rings: &mut [Ring],
    fixture: &str,
    program: &str,
    cycles: u32,
    drain_every: u32,
    lookup: bool,
) -> Result<u64> {
    let mut ebpf = parse_fixture(fixture)?;
    let prog = fixture_program(&mut ebpf, fixture, program)?;
    let what = format!("{fixture}/{program}");
    let mut storm = Storm {
        prog,
        what: &what,
        ids: Vec::with_capacity(cycles as usize),
        functions: None,
    };
    let mut sent = 0u64;
    if lookup {
        let done = AtomicBool::new(false);
        let (lookups, result) = std::thread::scope(|s| {
            let side = std::thread::Builder::new()
                .name("side-band".into())
                .spawn_scoped(s, || side_band(rings, &done))
                .context("spawning the side-band thread")?;
            let result = (0..cycles).try_for_each(|i| storm.cycle(i));
            done.store(true, Ordering::Release);
            let side = side
                .join()
                .map_err(|_| anyhow!("the side-band thread panicked"))?;
            anyhow::Ok((side, result))
        })?;
        let (bytes, lookups) = lookups?;
        result?;
        sent += bytes;
        send(&lookups)?;
    } else {
        for i in 0..cycles {
            storm.cycle(i)?;
            if drain_every > 0 && (i + 1) % drain_every == 0 {
                sent += perf::drain_all(rings)
                    .with_context(|| format!("storm: draining after cycle {i}"))?;
            }
        }
        sent += perf::drain_all(rings).context("storm: final drain")?;
        if drain_every == 0 {
            let cpus = sys::online_cpus().os_ctx("reading /sys/devices/system/cpu/online")?;
            for cpu in cpus {
                let saved = sys::pin_to(cpu)?;
                let r = storm.cycle(cycles + cpu);
                sys::set_affinity(&saved)?;
                r.with_context(|| format!("storm: flush cycle on CPU {cpu}"))?;
            }
            sent += perf::drain_all(rings).context("storm: drain after the flush cycles")?;
        }
    }
    send(&Message::StormDone {
        fixture: fixture.to_owned(),
        program: program.to_owned(),
        functions: storm.functions.unwrap_or(0),
        ids: storm.ids,
    })?;
    Ok(sent)
}

struct Storm<'a> {
    prog: &'a mut Program,
    what: &'a str,
    ids: Vec<u32>,
    functions: Option<u32>,
}

impl Storm<'_> {
    /// One load, its id and function count read back, one unload.
    fn cycle(&mut self, i: u32) -> Result<()> {
        let what = self.what;
        load_program(self.prog).with_context(|| format!("storm: loading {what}, cycle {i}"))?;
        let info = bpf::prog_info(self.prog.fd()?.as_fd())
            .with_context(|| format!("storm: bpf_prog_info of {what}, cycle {i}"))?;
        self.ids.push(info.info.id);
        let n = info.info.nr_jited_ksyms;
        match self.functions {
            None => self.functions = Some(n),
            Some(f) if f != n => {
                bail!("storm: {what} has {n} JITed functions in cycle {i} but {f} before")
            }
            Some(_) => {}
        }
        unload_program(self.prog).with_context(|| format!("storm: unloading {what}, cycle {i}"))
    }
}

/// The side-band reader: drains every ring to the host until the storm is
/// over (then once more), looking up each PROG_LOAD id as soon as it is
/// read. Returns the bytes sent and the `Lookups`.
fn side_band(rings: &mut [Ring], done: &AtomicBool) -> Result<(u64, Message)> {
    let (mut seen, mut found, mut enoent) = (0u32, 0u32, 0u32);
    let mut other_errors: Vec<String> = Vec::new();
    let mut sent = 0u64;
    loop {
        // Read `done` before the pass: a pass that starts after the storm
        // ended sees every record it wrote.
        let last = done.load(Ordering::Acquire);
        let mut any = false;
        for ring in rings.iter_mut() {
            let bytes = perf::drain_ring(ring)?;
            any |= !bytes.is_empty();
            sent += bytes.len() as u64;
            for id in prog_load_ids(&bytes).with_context(|| {
                format!("side-band: walking the ring of listener {}", ring.index)
            })? {
                seen += 1;
                match bpf::prog_fd_by_id(id) {
                    Ok(fd) => {
                        found += 1;
                        drop(fd);
                    }
                    Err(e) if e.raw_os_error() == Some(libc::ENOENT) => enoent += 1,
                    Err(e) => {
                        let e = format!("id {id}: {}", sys::Errno(&e));
                        if other_errors.len() < MAX_OTHER_ERRORS {
                            other_errors.push(e);
                        }
                    }
                }
            }
        }
        if last {
            break;
        }
        if !any {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    Ok((
        sent,
        Message::Lookups {
            seen,
            found,
            enoent,
            other_errors,
        },
    ))
}

/// The program ids of the PROG_LOAD records in a chunk of ring bytes.
///
/// The guest otherwise never interprets records (the host's parser is the
/// one that judges them); this reads only what perf's side-band thread
/// needs to react in time: each `perf_event_header` (type, size) to step
/// to the next record, and for BPF_EVENT the event type and id at the
/// start of the body. A drained chunk always ends on a record boundary
/// (the kernel publishes `data_head` after whole records), and a walk that
/// does not fit the chunk is an error here rather than a guess.
fn prog_load_ids(bytes: &[u8]) -> Result<Vec<u32>> {
    const PERF_RECORD_BPF_EVENT: u32 = 18;
    const PERF_BPF_EVENT_PROG_LOAD: u16 = 1;
    let u16_at = |o: usize| {
        bytes
            .get(o..o + 2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
    };
    let u32_at = |o: usize| {
        bytes
            .get(o..o + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    let mut ids = Vec::new();
    let mut off = 0usize;
    while off < bytes.len() {
        let (Some(ty), Some(size)) = (u32_at(off), u16_at(off + 6)) else {
            bail!("a record header is cut at byte {off} of {}", bytes.len());
        };
        let size = size as usize;
        if size < 8 || off + size > bytes.len() {
            bail!(
                "record at byte {off} has size {size}, outside the {} bytes read",
                bytes.len()
            );
        }
        if ty == PERF_RECORD_BPF_EVENT
            && size >= 16
            && u16_at(off + 8) == Some(PERF_BPF_EVENT_PROG_LOAD)
        {
            if let Some(id) = u32_at(off + 12) {
                ids.push(id);
            }
        }
        off += size;
    }
    Ok(ids)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_prog_load_ids() {
        let mut b = Vec::new();
        // KSYMBOL (17), size 16: skipped.
        b.extend(17u32.to_le_bytes());
        b.extend(0u16.to_le_bytes());
        b.extend(16u16.to_le_bytes());
        b.extend([0u8; 8]);
        // BPF_EVENT PROG_LOAD id 7, size 24.
        b.extend(18u32.to_le_bytes());
        b.extend(0u16.to_le_bytes());
        b.extend(24u16.to_le_bytes());
        b.extend(1u16.to_le_bytes());
        b.extend(0u16.to_le_bytes());
        b.extend(7u32.to_le_bytes());
        b.extend([0u8; 8]);
        assert_eq!(prog_load_ids(&b).unwrap(), vec![7]);
        assert!(prog_load_ids(&b[..20]).is_err());
    }
}
