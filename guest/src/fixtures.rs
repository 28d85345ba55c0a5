//! The BPF fixtures embedded in the agent (`guest/bpf/*.bpf.c`, compiled by
//! `build.rs`): finding one by stem, parsing it with aya, finding a program
//! in it, and loading or unloading the program types the fixtures use.

use std::sync::Mutex;

use anyhow::{anyhow, Context, Result};
use aya::programs::{Program, ProgramError};
use aya::{Btf, Ebpf, EbpfLoader};

mod embedded {
    include!(concat!(env!("OUT_DIR"), "/fixtures.rs"));
}

/// The object bytes of fixture `name` (its file stem).
pub fn object_bytes(name: &str) -> Result<&'static [u8]> {
    embedded::FIXTURES
        .iter()
        .find(|(stem, _)| *stem == name)
        .map(|(_, bytes)| *bytes)
        .ok_or_else(|| {
            let known: Vec<&str> = embedded::FIXTURES.iter().map(|(s, _)| *s).collect();
            anyhow!("no embedded fixture {name:?} (the agent has {known:?})")
        })
}

/// Every embedded fixture's stem, in build order.
pub fn all_stems() -> Vec<&'static str> {
    embedded::FIXTURES.iter().map(|(stem, _)| *stem).collect()
}

/// The one loader every object goes through. aya's `EbpfLoader::new()`
/// reads and parses the kernel's BTF (`/sys/kernel/btf/vmlinux`, several
/// MB) before `.btf(None)` can say it is not wanted: made anew per object,
/// that was most of a `load` step (~100 ms of the agent's CPU under TCG,
/// 25 ms natively). Made once instead, by the aya warm-up, so a saved VM
/// already holds it; `load` changes none of its settings, and `.btf()` is
/// set for each object under the lock.
static LOADER: Mutex<Option<EbpfLoader<'static>>> = Mutex::new(None);

/// Parses `bytes` with aya and creates its maps; `kernel_btf` for objects
/// whose programs are CO-RE or attach by BTF id, `None` otherwise (the
/// fixtures need no CO-RE, and relocating against vmlinux BTF is slow
/// under TCG).
pub fn load_object(what: &str, bytes: &[u8], kernel_btf: Option<&'static Btf>) -> Result<Ebpf> {
    let mut slot = LOADER.lock().unwrap_or_else(|e| e.into_inner());
    slot.get_or_insert_with(EbpfLoader::new)
        .btf(kernel_btf)
        .load(bytes)
        .with_context(|| format!("aya could not load the object of {what}"))
}

pub fn parse_fixture(name: &str) -> Result<Ebpf> {
    load_object(&format!("fixture {name:?}"), object_bytes(name)?, None)
}

/// The program `program` of a parsed fixture, or an error naming those it has.
pub fn fixture_program<'a>(
    ebpf: &'a mut Ebpf,
    fixture: &str,
    program: &str,
) -> Result<&'a mut Program> {
    let names: Vec<String> = ebpf.programs().map(|(n, _)| n.to_owned()).collect();
    ebpf.program_mut(program)
        .ok_or_else(|| anyhow!("fixture {fixture:?} has no program {program:?} (it has {names:?})"))
}

/// Loads a program of any type that needs no attach target at load time.
pub fn load_program(program: &mut Program) -> Result<(), ProgramError> {
    match program {
        Program::SocketFilter(p) => p.load(),
        Program::SchedClassifier(p) => p.load(),
        Program::Xdp(p) => p.load(),
        Program::TracePoint(p) => p.load(),
        Program::KProbe(p) => p.load(),
        Program::RawTracePoint(p) => p.load(),
        Program::CgroupSkb(p) => p.load(),
        Program::PerfEvent(p) => p.load(),
        Program::SockOps(p) => p.load(),
        Program::SkMsg(p) => p.load(),
        _ => Err(ProgramError::UnexpectedProgramType),
    }
}

/// `unload()` of the program types the load/unload loops (`measure`,
/// `storm`, `concurrent`) use: drops the program fd, the last reference to
/// the program.
pub fn unload_program(program: &mut Program) -> Result<(), ProgramError> {
    match program {
        Program::SocketFilter(p) => p.unload(),
        Program::SchedClassifier(p) => p.unload(),
        Program::Xdp(p) => p.unload(),
        Program::TracePoint(p) => p.unload(),
        Program::KProbe(p) => p.unload(),
        _ => Err(ProgramError::UnexpectedProgramType),
    }
}
