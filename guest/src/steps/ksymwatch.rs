//! The emission-time symbol-state oracle: `watch-ksymbols` attaches the
//! `ksymwatch` fixture as a kprobe on `perf_event_ksymbol`, and
//! `read-ksymbol-watch` reads what it saw (one observation per call: the
//! arguments and what `%ps` resolved the address to at that instant) and
//! sends it as a `KsymbolWatch`. `failed-load` makes a `BPF_PROG_LOAD`
//! fail after the JIT, the path that deletes a program symbol that was
//! never added.

use anyhow::{anyhow, bail, Context, Result};
use aya::maps::Array;
use aya::programs::{KProbe, ProbeKind, Program};
use aya::Ebpf;
use aya_obj::generated::{bpf_cmd, bpf_prog_type};
use kloop_protocol::Message;

use crate::bpf::sys_bpf_fd;
use crate::bpf::PROG_LOAD_SIZE;
use crate::channel::{log, send};
use crate::context::{KsymbolWatch, StepContext};
use crate::fixtures::{fixture_program, load_object, object_bytes};
use crate::kallsyms;
use crate::steps::hooks::kprobe_event;
use crate::steps::load::kernel_btf;
use crate::sys::Errno;

const FIXTURE: &str = "ksymwatch";
const PROGRAM: &str = "kloop_ksymwatch";
const WATCHED: &str = "perf_event_ksymbol";

/// Loads the watch and attaches it; keeps both in the context.
pub fn watch(context: &mut StepContext) -> Result<()> {
    if context.ksymbol_watch.is_some() {
        bail!("watch-ksymbols ran twice: the watch is already attached");
    }
    // With the kernel's BTF: the kprobe page structs are CO-RE.
    let mut ebpf = load_object(
        &format!("fixture {FIXTURE:?}"),
        object_bytes(FIXTURE)?,
        Some(kernel_btf()?),
    )?;
    write_caches(&mut ebpf)?;
    let prog = fixture_program(&mut ebpf, FIXTURE, PROGRAM)?;
    let p: &mut KProbe = match prog {
        Program::KProbe(p) if matches!(p.kind(), ProbeKind::Entry) => p,
        other => bail!(
            "{FIXTURE}/{PROGRAM} is a {:?} program, not a kprobe",
            other.prog_type()
        ),
    };
    p.load()
        .with_context(|| format!("loading {FIXTURE}/{PROGRAM}"))?;
    let link = kprobe_event(p, WATCHED, 0).with_context(|| format!("kprobe on {WATCHED}"))?;
    log(format!("ksymbol watch attached to {WATCHED}"))?;
    context.ksymbol_watch = Some(KsymbolWatch {
        ebpf,
        _link: link,
        observations: Vec::new(),
    });
    Ok(())
}

/// The lists the watch walks, in the order of its `caches` map: the kprobe
/// instruction caches (their page lists) and ftrace's list of ops with a
/// trampoline of their own.
pub const CACHES: [&str; 3] = [
    "kprobe_insn_slots",
    "kprobe_optinsn_slots",
    "ftrace_ops_trampoline_list",
];

/// Writes the caches' addresses (data symbols: CONFIG_KALLSYMS_ALL) into
/// the watch's `caches` map; one the kernel lacks stays 0 and its pages
/// are reported as not looked at.
fn write_caches(ebpf: &mut Ebpf) -> Result<()> {
    // Static data: a restored guest has them from the read before the save.
    let found = kallsyms::core_by_name(&CACHES)?;
    let map = ebpf
        .map_mut("caches")
        .ok_or_else(|| anyhow!("{FIXTURE} has no map \"caches\""))?;
    let mut caches: Array<_, u64> = Array::try_from(map).context("map \"caches\" as an array")?;
    let mut missing = Vec::new();
    for (i, name) in CACHES.iter().enumerate() {
        match found.iter().find(|e| e.name == *name) {
            Some(e) => caches
                .set(i as u32, e.addr, 0)
                .with_context(|| format!("writing caches[{i}]"))?,
            None => missing.push(*name),
        }
    }
    if !missing.is_empty() {
        log(format!(
            "ksymbol watch: /proc/kallsyms has no {missing:?}: their pages cannot be looked up"
        ))?;
    }
    Ok(())
}

/// Reads every observation the ring holds and sends all observed so far.
pub fn read(context: &mut StepContext) -> Result<()> {
    let watch = context
        .ksymbol_watch
        .as_mut()
        .ok_or_else(|| anyhow!("read-ksymbol-watch without an earlier watch-ksymbols"))?;
    let mut dropped = watch.collect()?;
    let counts = watch
        .ebpf
        .map("counts")
        .ok_or_else(|| anyhow!("{FIXTURE} has no map \"counts\""))?;
    let counts: Array<_, u64> = Array::try_from(counts).context("map \"counts\" as an array")?;
    dropped += counts.get(&0, 0).context("reading counts[0]")?;
    send(&Message::KsymbolWatch {
        observations: watch.observations.clone(),
        dropped,
    })
}

/// The verifier log of `failed-load`: the smallest size older kernels
/// accept (they refuse less than 128 bytes with EINVAL), far less than
/// the level-2 log of the program below.
const FAILED_LOAD_LOG: usize = 128;
/// `BPF_LOG_LEVEL2`: a line per instruction and state.
const LOG_LEVEL2: u32 = 2;

/// Loads a socket filter whose main function calls a subprogram, with a
/// verifier log too small: the verifier completes, `jit_subprogs` JITs
/// both functions and adds the subprograms to kallsyms, and only then does
/// `bpf_check` report the overflowed log as ENOSPC. The error path
/// (`__bpf_prog_put_noref`) deletes every ksym of the program, the main
/// program's too, which was never added.
pub fn failed_load() -> Result<()> {
    // BPF_JMP|BPF_CALL with src_reg BPF_PSEUDO_CALL, imm +1: calls insn 2.
    const CALL_NEXT_BUT_ONE: u64 = 0x0000_0001_0000_1085;
    const EXIT: u64 = 0x0000_0000_0000_0095;
    const R0_ZERO: u64 = 0x0000_0000_0000_00b7;
    let mut insns = vec![CALL_NEXT_BUT_ONE, EXIT];
    // A subprogram long enough that its level-2 log alone overflows 128 bytes.
    insns.extend(std::iter::repeat_n(R0_ZERO, 16));
    insns.push(EXIT);
    let mut log_buf = vec![0u8; FAILED_LOAD_LOG];
    let mut attr =
        crate::bpf::prog_load_attr(bpf_prog_type::BPF_PROG_TYPE_SOCKET_FILTER, &insns, "");
    attr.__bindgen_anon_3.log_level = LOG_LEVEL2;
    attr.__bindgen_anon_3.log_size = log_buf.len() as u32;
    attr.__bindgen_anon_3.log_buf = log_buf.as_mut_ptr() as u64;
    match sys_bpf_fd(bpf_cmd::BPF_PROG_LOAD, &mut attr, PROG_LOAD_SIZE) {
        Ok(fd) => {
            drop(fd);
            bail!(
                "failed-load: BPF_PROG_LOAD with a {FAILED_LOAD_LOG}-byte level-2 log succeeded; \
                 it must fail with ENOSPC"
            )
        }
        Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => log(format!(
            "failed-load: BPF_PROG_LOAD of a program with a subprogram failed with ENOSPC \
             (log of {FAILED_LOAD_LOG} bytes full), as intended"
        )),
        Err(e) => bail!(
            "failed-load: BPF_PROG_LOAD failed with {}, not ENOSPC; verifier log: {:?}",
            Errno(&e),
            String::from_utf8_lossy(&log_buf).trim_end_matches('\0')
        ),
    }
}
