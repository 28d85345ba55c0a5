//! `load`, `unload` and `wait-unloaded`: programs the plan holds by label.

use std::collections::HashSet;
use std::io;
use std::os::fd::AsFd;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use aya::programs::{Program, ProgramError};
use aya::Btf;
use kloop_protocol::Message;

use crate::channel::{log, send};
use crate::context::{Loaded, StepContext};
use crate::fixtures::{fixture_program, load_program, parse_fixture};
use crate::{bpf, kallsyms};

/// `load` of a program that needs no attach target at load time.
pub fn load(context: &mut StepContext, fixture: &str, program: &str, label: &str) -> Result<()> {
    load_with(context, fixture, program, label, load_program)
}

/// `load` with a `btf_target`: an fentry/fexit/LSM program verified against
/// that function in the kernel's BTF.
pub fn load_against_btf(
    context: &mut StepContext,
    fixture: &str,
    program: &str,
    label: &str,
    target: &str,
) -> Result<()> {
    load_with(context, fixture, program, label, |prog| {
        load_btf(prog, target)
    })
}

/// Loads `program` of `fixture` with `load` (which knows what the
/// program type needs at load time), reports its facts under `label` and
/// keeps it.
fn load_with(
    context: &mut StepContext,
    fixture: &str,
    program: &str,
    label: &str,
    load: impl FnOnce(&mut Program) -> Result<(), ProgramError>,
) -> Result<()> {
    if context.loaded.contains_key(label) {
        bail!("label {label:?} is already loaded");
    }
    let mut ebpf = parse_fixture(fixture)?;
    let prog = fixture_program(&mut ebpf, fixture, program)?;
    load(prog)
        .map_err(anyhow::Error::from)
        .with_context(|| format!("loading {fixture}/{program} (label {label:?})"))?;
    let info = bpf::prog_info(prog.fd()?.as_fd())
        .with_context(|| format!("bpf_prog_info of {fixture}/{program}"))?;
    let id = info.info.id;
    context.pending_facts.push((label.to_owned(), info));
    context.loaded.insert(
        label.to_owned(),
        Loaded {
            ebpf,
            program: program.to_owned(),
            id,
            others: Vec::new(),
            _links: Vec::new(),
        },
    );
    Ok(())
}

/// Reads a loaded program's `bpf_prog_info` and kallsyms lines and sends
/// them as `ProgFacts` under `label`; returns its id.
pub fn report_prog(label: &str, prog: &Program) -> Result<u32> {
    let info = bpf::prog_info(prog.fd()?.as_fd())?;
    let id = info.info.id;
    send_facts(vec![(label.to_owned(), info)])?;
    Ok(id)
}

/// Sends the `ProgFacts` of every program in `context.pending_facts`, with
/// their kallsyms lines from one read of /proc/kallsyms. The runner calls
/// it after a `load` step that no other `load` follows, so every program
/// is still loaded when its lines are read; a run of loads then costs one
/// read (0.2-0.4 s under TCG) instead of one each.
pub fn send_pending_facts(context: &mut StepContext) -> Result<()> {
    if context.pending_facts.is_empty() {
        return Ok(());
    }
    send_facts(std::mem::take(&mut context.pending_facts))
}

/// Sends each program's `ProgFacts` with its kallsyms lines, all from one
/// read of /proc/kallsyms.
fn send_facts(pending: Vec<(String, bpf::ProgInfo)>) -> Result<()> {
    let wanted: HashSet<u64> = pending
        .iter()
        .flat_map(|(_, info)| info.jited_ksyms.iter().copied())
        .collect();
    // An interpreted program's address is the kernel's own interpreter
    // (`__bpf_prog_run<N>`), which the reads after the core's lines do not
    // see: then the whole file, so the host can name the kernel text there
    // (arm64 has no fixed kernel image range to tell it by).
    let interpreted = pending.iter().any(|(_, info)| {
        !info.jited_func_lens.is_empty() && info.jited_func_lens.iter().all(|&l| l == 0)
    });
    let lines = if interpreted {
        kallsyms::read_all(|e| wanted.contains(&e.addr))?
    } else {
        kallsyms::read_filtered(|e| wanted.contains(&e.addr))?
    };
    for (label, info) in pending {
        let own: Vec<_> = lines
            .iter()
            .filter(|e| info.jited_ksyms.contains(&e.addr))
            .cloned()
            .collect();
        send(&Message::Prog(info.facts(label, &own)))?;
    }
    Ok(())
}

/// The kernel's BTF, parsed once: under TCG parsing vmlinux BTF takes
/// seconds, and every fentry/fexit/LSM load needs it.
pub(crate) fn kernel_btf() -> Result<&'static Btf> {
    static BTF: OnceLock<Btf> = OnceLock::new();
    if let Some(btf) = BTF.get() {
        return Ok(btf);
    }
    let btf = Btf::from_sys_fs().context("parsing the kernel's BTF (/sys/kernel/btf/vmlinux)")?;
    Ok(BTF.get_or_init(|| btf))
}

/// Loads an fentry/fexit/LSM program against `target` in the kernel's BTF.
pub(crate) fn load_btf(prog: &mut Program, target: &str) -> Result<(), ProgramError> {
    let btf =
        kernel_btf().map_err(|e| ProgramError::IOError(io::Error::other(format!("{e:#}"))))?;
    match prog {
        Program::FEntry(p) => p.load(target, btf),
        Program::FExit(p) => p.load(target, btf),
        Program::Lsm(p) => p.load(target, btf),
        _ => Err(ProgramError::UnexpectedProgramType),
    }
}

/// Drops the program (and, for a `load-object`, its siblings and links)
/// held under `label`; `wait-unloaded` later waits for their ids to go.
/// `load-unnamed`: `r0 = 0; exit` as a socket filter, loaded without a
/// name and without BTF; its facts are reported under `label`.
pub fn load_unnamed(context: &mut StepContext, label: &str) -> Result<()> {
    use crate::sys::OsContext;
    if context.loaded.contains_key(label) || context.raw_loaded.contains_key(label) {
        bail!("label {label:?} is already loaded");
    }
    let fd = load_return_zero_filter("").os_ctx(format!(
        "BPF_PROG_LOAD of an unnamed socket filter (label {label:?})"
    ))?;
    let info = bpf::prog_info(fd.as_fd())
        .with_context(|| format!("bpf_prog_info of the unnamed program {label:?}"))?;
    let id = info.info.id;
    context.pending_facts.push((label.to_owned(), info));
    context.raw_loaded.insert(label.to_owned(), (fd, id));
    Ok(())
}

/// `r0 = 0; exit` loaded with the bpf syscall as a socket filter named
/// `name` (at most 15 bytes; empty: no name), without BTF: the smallest
/// program the JIT makes (its image, header and the 16 bytes of
/// `bpf_jit_binary_pack_alloc()`'s random hole fit one 64-byte chunk).
pub(crate) fn load_return_zero_filter(name: &str) -> io::Result<std::os::fd::OwnedFd> {
    load_socket_filter(name, &[R0_IS_0, EXIT])
}

/// `r0 = 0` (BPF_ALU64 | BPF_MOV | BPF_K).
pub(crate) const R0_IS_0: u64 = 0x0000_0000_0000_00b7;
/// `exit` (BPF_JMP | BPF_EXIT).
pub(crate) const EXIT: u64 = 0x0000_0000_0000_0095;

/// The socket filter `insns` loaded with the bpf syscall, named `name` (at
/// most 15 bytes; empty: no name), without BTF.
pub(crate) fn load_socket_filter(name: &str, insns: &[u64]) -> io::Result<std::os::fd::OwnedFd> {
    use crate::bpf::{bpf_cmd, prog_load_attr, sys_bpf_fd, PROG_LOAD_SIZE};
    use aya_obj::generated::bpf_prog_type;
    let mut attr = prog_load_attr(bpf_prog_type::BPF_PROG_TYPE_SOCKET_FILTER, insns, name);
    sys_bpf_fd(bpf_cmd::BPF_PROG_LOAD, &mut attr, PROG_LOAD_SIZE)
}

pub fn unload(context: &mut StepContext, label: &str) -> Result<()> {
    if let Some((fd, id)) = context.raw_loaded.remove(label) {
        context.unloaded.push((label.to_owned(), id));
        drop(fd);
        return Ok(());
    }
    let prog = context
        .loaded
        .remove(label)
        .ok_or_else(|| anyhow!("unload of {label:?}, which is not loaded"))?;
    context.unloaded.push((label.to_owned(), prog.id));
    context.unloaded.extend(prog.others.iter().cloned());
    drop(prog);
    Ok(())
}

/// Waits until no program unloaded so far is visible by id any more.
pub fn wait_unloaded(context: &mut StepContext, timeout_ms: u64) -> Result<()> {
    if !context.loaded.is_empty() {
        let mut held: Vec<&String> = context.loaded.keys().collect();
        held.sort();
        log(format!(
            "wait-unloaded waits for the programs unloaded so far; still held: {held:?}"
        ))?;
    }
    let deadline = Instant::now() + Duration::from_millis(timeout_ms);
    loop {
        let ids: HashSet<u32> = bpf::prog_ids()?.into_iter().collect();
        let left: Vec<&(String, u32)> = context
            .unloaded
            .iter()
            .filter(|(_, id)| ids.contains(id))
            .collect();
        if left.is_empty() {
            context.unloaded.clear();
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!("after {timeout_ms} ms these unloaded programs are still visible by id (label, id): {left:?}");
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}
