//! `perf-attribution`: the real perf as a consumer of the side band, with a
//! trampoline image right below a program that runs.
//!
//! perf turns each KSYMBOL register into a map `[addr, addr + len)` of the
//! kernel's address space (tools/perf/util/machine.c,
//! `machine__process_ksymbol_register`) and files a sample under the map
//! and symbol its IP falls in. A trampoline is announced with `PAGE_SIZE`
//! (`bpf_image_ksym_add()`, kernel/bpf/trampoline.c) while from 6.7 an x86
//! image is `im->size` bytes carved out of a `bpf_prog_pack`
//! (`arch_alloc_bpf_trampoline()`), so the page it announces covers
//! whatever the pack put after the image. This step makes that code a
//! program that runs, and lets perf say whose samples they are.
//!
//! The layout is made, not hoped for: `bpf_prog_pack_alloc()`
//! (kernel/bpf/core.c) walks `pack_list` in order and takes the first run
//! of free chunks that fits (`bitmap_find_next_zero_area()` from 0). So
//! one-chunk fillers go first until the first free chunk starts a run long
//! enough for the hole-maker and the workload; those two then land one
//! after the other; the hole-maker is unloaded and its chunks freed; the
//! fentry attach's image, at most as many chunks, is handed that hole,
//! the first free run, right below the workload. Every step of it is read
//! back from the books (the pack bitmaps, `bpf_kallsyms`, `im->size`), and
//! a layout that did not come out as modelled fails the step, naming it.
//! Where the kernel gives an image a page of its own (before 6.7) or has
//! no packs (before 5.18) there is nothing to arrange: the step says so
//! in its report and measures all the same.
//!
//! The workload is registered while perf records and the trampoline after
//! it, as a profiler attached to a running system sees them. It runs with
//! `BPF_PROG_TEST_RUN` and a large `repeat`, so most samples land inside
//! its image; `perf script -F ip,sym` then says which symbol perf gave
//! each one. The guest only parses perf's sample lines into (ip, symbol)
//! pairs; the host judges (rule `perf-attribution`).

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use aya::programs::Program;
use kloop_protocol::{
    ImageReading, Message, PackReading, PerfAttribution, ProgFacts, MAX_ATTRIBUTED_IPS,
};

use crate::bpf::{self, bpf_cmd, zeroed_attr};
use crate::channel::{log, send};
use crate::fixtures::{fixture_program, parse_fixture};
use crate::jit_books::Books;
use crate::kallsyms;
use crate::steps::load::{load_btf, load_socket_filter, EXIT, R0_IS_0};
use crate::steps::perf_tool;
use crate::sys::OsContext;

/// `BPF_PROG_CHUNK_SIZE` (kernel/bpf/core.c).
const CHUNK: u64 = 64;
/// What `bpf_jit_binary_pack_alloc()` adds to a program's code before
/// rounding up to whole chunks: `sizeof(struct bpf_binary_header)` (8) and
/// 16 bytes for the random hole of illegal instructions.
const PACK_OVERHEAD: u64 = 8 + 16;
/// x86-64 `PAGE_SIZE`: what a trampoline's KSYMBOL announces.
const PAGE: u64 = 4096;
/// `r0 += 1` (BPF_ALU64 | BPF_ADD | BPF_K, imm 1): 4 bytes of x86 code
/// (`add rax, 1`), so the program's length is the step's to choose.
const R0_PLUS_1: u64 = 0x0000_0001_0000_0007;
/// The hole-maker's adds: about 300 bytes of code, five chunks with the
/// header, more than a one-link trampoline image takes (180 to 185 bytes,
/// three chunks, on 6.12 to 7.3); the books check it.
const HOLE_ADDS: usize = 60;
/// The workload's adds: about 2.8 KiB of code, so that with the hole below
/// it the whole program lies inside the page the trampoline announces.
const WORK_ADDS: usize = 700;
/// The most one-chunk fillers loaded to reach a long free run.
const MAX_FILLERS: usize = 512;
/// BPF_PROG_TEST_RUN repetitions per call: each call stays well under a
/// second under TCG, so the deadline is kept.
const REPEAT: u32 = 2000;
/// A socket filter's test run needs at least an Ethernet header of data.
const PACKET: [u8; 64] = [0; 64];
/// An unloaded program's chunks come back after an RCU grace period, from
/// a worker (`bpf_prog_free_deferred`).
const FREE_WAIT: Duration = Duration::from_secs(15);
/// Lines of perf script's output that are no sample, quoted at most.
const MAX_UNPARSED: usize = 8;

const FILL_NAME: &str = "kloop_fill";
const HOLE_NAME: &str = "kloop_hole";
const WORK_NAME: &str = "kloop_work";

/// `BPF_PROG_TEST_RUN` up to `test.duration`.
const TEST_RUN_SIZE: u32 = bpf::attr_size(
    std::mem::offset_of!(bpf::bpf_attr, test) + std::mem::offset_of!(TestAttr, duration) + 4,
);
type TestAttr = aya_obj::generated::bpf_attr__bindgen_ty_7;

/// A program loaded with the bpf syscall: its fd (loaded while held), id
/// and facts.
struct Raw {
    fd: OwnedFd,
    info: bpf::ProgInfo,
}

impl Raw {
    fn load(name: &str, adds: usize) -> Result<Raw> {
        let mut insns = vec![R0_IS_0];
        insns.extend(std::iter::repeat_n(R0_PLUS_1, adds));
        insns.push(EXIT);
        let fd = load_socket_filter(name, &insns).os_ctx(format!(
            "BPF_PROG_LOAD of {name} ({} instructions)",
            insns.len()
        ))?;
        let info = bpf::prog_info(fd.as_fd())?;
        Ok(Raw { fd, info })
    }
    fn id(&self) -> u32 {
        self.info.info.id
    }
    /// Where its code starts and how long it is.
    fn code(&self) -> Result<(u64, u64)> {
        match (
            self.info.jited_ksyms.first(),
            self.info.jited_func_lens.first(),
        ) {
            (Some(&start), Some(&len)) if start != 0 => Ok((start, u64::from(len))),
            _ => bail!(
                "program {} has no JITed code (jited_ksyms {:x?}): the step needs the JIT",
                self.id(),
                self.info.jited_ksyms
            ),
        }
    }
    /// The chunks `bpf_jit_binary_pack_alloc()` took for it.
    fn chunks(&self) -> Result<u64> {
        let (_, len) = self.code()?;
        Ok((len + PACK_OVERHEAD).div_ceil(CHUNK))
    }
}

/// Runs one `perf-attribution` step.
pub fn run(
    fixture: &str,
    program: &str,
    target: &str,
    perf_args: &[String],
    run_ms: u64,
) -> Result<()> {
    // The books, where the kernel has what the layout needs.
    let books = match Books::get() {
        Ok(b) => Some(b),
        Err(e) if e.not_in_kernel() => {
            log(format!("perf-attribution: no layout to arrange: {e}"))?;
            None
        }
        Err(e) => return Err(anyhow!("the JIT's books: {e}")),
    };
    let mut ebpf = parse_fixture(fixture)?;
    let prog = fixture_program(&mut ebpf, fixture, program)?;
    load_btf(prog, target)
        .map_err(anyhow::Error::from)
        .with_context(|| format!("loading {fixture}/{program} against {target}"))?;

    // The first free chunk must start a run that holds the hole-maker and
    // the workload; their sizes are measured on copies, which stay loaded
    // like the fillers (a free now would open a hole below, later).
    let mut fillers = vec![
        Raw::load(HOLE_NAME, HOLE_ADDS)?,
        Raw::load(WORK_NAME, WORK_ADDS)?,
    ];
    let (hole_chunks, work_chunks) = (fillers[0].chunks()?, fillers[1].chunks()?);
    if let Some(b) = &books {
        fill(b, hole_chunks + work_chunks, &mut fillers)?;
    }

    perf_tool::start(perf_args)?;
    let outcome = record(&mut ebpf, program, books.as_ref(), hole_chunks, run_ms);
    // perf stops whatever happened, so a failed layout leaves no perf behind.
    let stopped = perf_tool::stop_running();
    let recorded = outcome?;
    let (record_command, record_stderr) = stopped?;

    let (script_command, out, script_stderr) = perf_tool::script(&["-F", "ip,sym"])?;
    let parsed = parse_script(&out);
    log(format!(
        "perf-attribution: {} samples in {} distinct (ip, symbol) pairs, {} lines unparsed",
        parsed.samples.iter().map(|s| u64::from(s.2)).sum::<u64>() + parsed.dropped,
        parsed.samples.len(),
        parsed.unparsed.len()
    ))?;
    send(&Message::PerfAttribution(PerfAttribution {
        command: format!("{record_command}; {script_command}"),
        workload: recorded.work.id(),
        live: recorded.live,
        images: recorded.images,
        not_arranged: recorded.not_arranged,
        runs: recorded.runs,
        run_ns: recorded.run_ns,
        samples: parsed.samples,
        samples_dropped: parsed.dropped,
        unparsed: parsed.unparsed,
        stderr: format!("--- perf record ---\n{record_stderr}--- perf script ---\n{script_stderr}"),
    }))?;
    send(&Message::StormDone {
        fixture: "(none: straight-line socket filters)".to_owned(),
        program: FILL_NAME.to_owned(),
        functions: 1,
        ids: fillers.iter().map(Raw::id).chain([recorded.hole]).collect(),
    })?;
    drop(recorded.work);
    drop(ebpf);
    drop(fillers);
    Ok(())
}

/// What the recording left: the workload (still loaded), the programs live
/// throughout, the images, and the runs.
struct Recorded {
    work: Raw,
    /// The hole-maker's id (unloaded while perf recorded).
    hole: u32,
    live: Vec<ProgFacts>,
    images: Vec<ImageReading>,
    not_arranged: Option<String>,
    runs: u32,
    run_ns: u64,
}

/// While perf records: the hole-maker and the workload loaded, the hole
/// made, the fentry program attached into it, the layout checked, the
/// workload run for `run_ms`.
fn record(
    ebpf: &mut aya::Ebpf,
    program: &str,
    books: Option<&Books>,
    hole_chunks: u64,
    run_ms: u64,
) -> Result<Recorded> {
    let hole = Raw::load(HOLE_NAME, HOLE_ADDS)?;
    let work = Raw::load(WORK_NAME, WORK_ADDS)?;
    let (hole_start, _) = hole.code()?;
    let (work_start, work_len) = work.code()?;
    let hole_id = hole.id();
    if let Some(b) = books {
        let packs = read_packs(b)?;
        let (hp, hc) = chunk_of(&packs, hole_start)?;
        let (wp, wc) = chunk_of(&packs, work_start)?;
        if hp != wp || wc != hc + hole_chunks as u32 {
            bail!(
                "the workload's code at {work_start:#x} (pack {wp:#x}, chunk {wc}) is not right \
                 after the hole-maker's {hole_chunks} chunks at {hole_start:#x} (pack {hp:#x}, \
                 chunk {hc}): something allocated or freed pack chunks between the fill and \
                 these loads"
            );
        }
    }
    drop(hole);
    if let Some(b) = books {
        wait_freed(b, hole_start, hole_id)?;
    }

    let prog = ebpf
        .program_mut(program)
        .ok_or_else(|| anyhow!("the fixture has no program {program}"))?;
    let Program::FEntry(fentry) = prog else {
        bail!("{program} is not an fentry program");
    };
    fentry
        .attach()
        .map_err(anyhow::Error::from)
        .with_context(|| format!("attaching {program}"))?;
    let fentry_info = bpf::prog_info(prog.fd()?.as_fd())?;
    let live = facts(vec![
        ("fentry".to_owned(), fentry_info),
        ("work".to_owned(), bpf::prog_info(work.fd.as_fd())?),
    ])?;

    let (images, not_arranged) = match books {
        Some(b) => {
            let images = b
                .images()
                .map_err(|e| anyhow!("reading the trampoline images: {e}"))?;
            let image = arranged(&images, hole_start, work_start, work_len)?;
            log(format!(
                "perf-attribution: image {} at {:#x} ({} bytes), workload at {work_start:#x} \
                 ({work_len} bytes): {} bytes of the workload inside the announced page",
                image.name,
                image.start,
                image.size.unwrap_or(0),
                (image.start + PAGE).min(work_start + work_len) - work_start
            ))?;
            (images, None)
        }
        None => (
            Vec::new(),
            Some(
                "this kernel gives a trampoline image a page of its own (or has no JIT pack): \
                 no image lies in the page before the workload"
                    .to_owned(),
            ),
        ),
    };

    let (runs, run_ns) = run_workload(&work.fd, Duration::from_millis(run_ms))?;
    Ok(Recorded {
        hole: hole_id,
        live,
        work,
        images,
        not_arranged,
        runs,
        run_ns,
    })
}

/// Each program's facts with its kallsyms lines, from one read of
/// /proc/kallsyms while they are loaded.
fn facts(programs: Vec<(String, bpf::ProgInfo)>) -> Result<Vec<ProgFacts>> {
    let lines = kallsyms::read_filtered(|e| {
        programs
            .iter()
            .any(|(_, info)| info.jited_ksyms.contains(&e.addr))
    })?;
    Ok(programs
        .into_iter()
        .map(|(label, info)| {
            let own: Vec<_> = lines
                .iter()
                .filter(|e| info.jited_ksyms.contains(&e.addr))
                .cloned()
                .collect();
            info.facts(label, &own)
        })
        .collect())
}

/// The one trampoline image live, checked to lie where the hole-maker was,
/// below the workload and within a page of it.
fn arranged(
    images: &[ImageReading],
    hole_start: u64,
    work_start: u64,
    work_len: u64,
) -> Result<&ImageReading> {
    let [image] = images else {
        bail!(
            "{} trampoline images are live after one attach, not one: {:x?}",
            images.len(),
            images
                .iter()
                .map(|i| (&i.name, i.start))
                .collect::<Vec<_>>()
        );
    };
    let size = u64::from(
        image
            .size
            .ok_or_else(|| anyhow!("the image at {:#x} has no im->size", image.start))?,
    );
    let hole_chunk = hole_start & !(CHUNK - 1);
    if image.start != hole_chunk
        || image.start + size > work_start
        || work_start >= image.start + PAGE
    {
        bail!(
            "the trampoline image {} at {:#x} ({size} bytes) did not land in the hole at \
             {hole_chunk:#x} right below the workload at {work_start:#x} ({work_len} bytes): \
             the pack handed out another free run first",
            image.name,
            image.start
        );
    }
    Ok(image)
}

/// Loads one-chunk fillers until the first free chunk of the packs (in
/// `pack_list` order, the order `bpf_prog_pack_alloc()` tries them) starts
/// a run of at least `need` free chunks, onto `fillers` (held: they keep
/// the holes filled).
fn fill(books: &Books, need: u64, fillers: &mut Vec<Raw>) -> Result<()> {
    let before = fillers.len();
    loop {
        let packs = read_packs(books)?;
        if first_free_run(&packs).is_some_and(|run| u64::from(run) >= need) {
            log(format!(
                "perf-attribution: {} fillers until the first free run holds {need} chunks",
                fillers.len() - before
            ))?;
            return Ok(());
        }
        if fillers.len() - before == MAX_FILLERS {
            bail!(
                "{MAX_FILLERS} fillers and the first free run of the packs is still shorter \
                 than {need} chunks"
            );
        }
        fillers.push(Raw::load(FILL_NAME, 0)?);
    }
}

/// The length of the run that starts at the packs' first free chunk, if
/// any is free.
fn first_free_run(packs: &[PackReading]) -> Option<u32> {
    packs.iter().find_map(|p| {
        let first = (0..p.chunks).find(|&c| !p.is_used(c))?;
        Some((first..p.chunks).take_while(|&c| !p.is_used(c)).count() as u32)
    })
}

fn read_packs(books: &Books) -> Result<Vec<PackReading>> {
    books
        .packs()
        .map_err(|e| anyhow!("reading the pack bitmaps: {e}"))
}

/// The pack (by base) and chunk holding `addr`.
fn chunk_of(packs: &[PackReading], addr: u64) -> Result<(u64, u32)> {
    packs
        .iter()
        .find_map(|p| p.chunk_of(addr).map(|c| (p.base, c)))
        .ok_or_else(|| anyhow!("{addr:#x} is in no bpf_prog_pack"))
}

/// Waits until the chunk of the unloaded program `id`'s code at `start` is
/// free again.
fn wait_freed(books: &Books, start: u64, id: u32) -> Result<()> {
    let deadline = Instant::now() + FREE_WAIT;
    loop {
        let packs = read_packs(books)?;
        let (base, chunk) = chunk_of(&packs, start)?;
        let pack = packs.iter().find(|p| p.base == base).expect("found above");
        if !pack.is_used(chunk) {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "program {id} was unloaded {} s ago and its chunk at {start:#x} is still used",
                FREE_WAIT.as_secs()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `BPF_PROG_TEST_RUN` of `prog` with [`REPEAT`] repetitions, again and
/// again until `how_long` has passed; returns the calls and the time.
fn run_workload(prog: &OwnedFd, how_long: Duration) -> Result<(u32, u64)> {
    let started = Instant::now();
    let mut calls = 0u32;
    while started.elapsed() < how_long {
        let mut attr = zeroed_attr();
        attr.test.prog_fd = prog.as_raw_fd() as u32;
        attr.test.data_in = PACKET.as_ptr() as u64;
        attr.test.data_size_in = PACKET.len() as u32;
        attr.test.repeat = REPEAT;
        bpf::sys_bpf(bpf_cmd::BPF_PROG_TEST_RUN, &mut attr, TEST_RUN_SIZE)
            .os_ctx("BPF_PROG_TEST_RUN of the workload")?;
        calls += 1;
    }
    Ok((calls, started.elapsed().as_nanos() as u64))
}

/// perf script's sample lines, as (ip, symbol, count).
#[derive(Debug, Default, PartialEq)]
struct Parsed {
    samples: Vec<(u64, String, u32)>,
    dropped: u64,
    unparsed: Vec<String>,
}

/// Reads `perf script -F ip,sym` output: one sample a line, the IP in hex,
/// then the symbol perf resolved it to (`[unknown]` for none). Anything
/// else is kept as unparsed (quoted, the first few), never guessed at.
fn parse_script(out: &[u8]) -> Parsed {
    let mut counts: std::collections::BTreeMap<(u64, String), u32> = Default::default();
    let mut parsed = Parsed::default();
    for line in String::from_utf8_lossy(out).lines() {
        let t = line.trim();
        if t.is_empty() {
            continue;
        }
        let (ip, sym) = t.split_once(char::is_whitespace).unwrap_or((t, ""));
        match u64::from_str_radix(ip, 16) {
            Ok(ip) if !sym.trim().is_empty() => {
                *counts.entry((ip, sym.trim().to_owned())).or_default() += 1;
            }
            _ => {
                if parsed.unparsed.len() < MAX_UNPARSED {
                    parsed.unparsed.push(line.to_owned());
                }
            }
        }
    }
    for ((ip, sym), n) in counts {
        if parsed.samples.len() < MAX_ATTRIBUTED_IPS {
            parsed.samples.push((ip, sym, n));
        } else {
            parsed.dropped += u64::from(n);
        }
    }
    parsed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn perf_script_lines_become_counted_pairs_and_the_rest_is_quoted() {
        let out = b"    ffffffffc0000a3c bpf_prog_6deef7357e7b4530_kloop_work\n\
            ffffffffc0000a3c bpf_prog_6deef7357e7b4530_kloop_work\n\
            ffffffff8108e2f0 [unknown]\n\
            \n\
            ffffffffc0000a40 bpf_trampoline_6442523898\n\
            Warning: something\n\
            ffffffff81000000\n";
        let p = parse_script(out);
        assert_eq!(
            p.samples,
            vec![
                (0xffffffff8108e2f0, "[unknown]".to_owned(), 1),
                (
                    0xffffffffc0000a3c,
                    "bpf_prog_6deef7357e7b4530_kloop_work".to_owned(),
                    2
                ),
                (
                    0xffffffffc0000a40,
                    "bpf_trampoline_6442523898".to_owned(),
                    1
                ),
            ]
        );
        assert_eq!(p.unparsed, vec!["Warning: something", "ffffffff81000000"]);
        assert_eq!(p.dropped, 0);
    }

    #[test]
    fn the_first_free_run_is_the_one_the_allocator_tries_first() {
        let pack = |base, used| PackReading {
            base,
            chunk_size: 64,
            chunks: 16,
            used,
        };
        // Pack 1 is full: the run starts in pack 2 at chunk 3, 5 long.
        let packs = [
            pack(0x1000, vec![(0, 16)]),
            pack(0x9000, vec![(0, 3), (8, 8)]),
        ];
        assert_eq!(first_free_run(&packs), Some(5));
        // A one-chunk hole comes first, however long the run after it.
        assert_eq!(first_free_run(&[pack(0, vec![(0, 2), (3, 1)])]), Some(1));
        assert_eq!(first_free_run(&[pack(0, vec![(0, 16)])]), None);
    }

    #[test]
    fn the_image_must_lie_in_the_hole_below_the_workload() {
        let image = |start| ImageReading {
            name: "bpf_trampoline_1".into(),
            start,
            end: start + 180,
            size: Some(180),
            seen_at: vec![],
        };
        let ok = [image(0x1000)];
        assert!(arranged(&ok, 0x1010, 0x1150, 2800).is_ok());
        // Elsewhere in the pack, or two images.
        assert!(arranged(&[image(0x8000)], 0x1010, 0x1150, 2800).is_err());
        assert!(arranged(&[image(0x1000), image(0x8000)], 0x1010, 0x1150, 2800).is_err());
        // Overlapping the workload's code.
        assert!(arranged(&ok, 0x1010, 0x1080, 2800).is_err());
    }
}
