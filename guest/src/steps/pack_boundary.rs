//! `pack-boundary`: a trampoline image whose size is a whole number of the
//! JIT pack's 64-byte chunks, with live code right after it.
//!
//! From 6.7 an x86 trampoline image is carved out of a `bpf_prog_pack`
//! with its exact size (`arch_alloc_bpf_trampoline()` →
//! `bpf_prog_pack_alloc(size)`), and given back with `im->size`
//! (`bpf_tramp_image_free()`, and `bpf_tramp_image_alloc()`'s error path
//! after a failed `percpu_ref_init()`): `bpf_prog_pack_free()` clears
//! `BPF_PROG_SIZE_TO_NBITS(size)` chunks, `round_up(size, 64) / 64`. A size
//! that is off by a byte or eight between allocation and free changes that
//! count only when the true size sits at a chunk boundary: then a chunk
//! stays marked used after the free (a leak), or the chunk after the image
//! is marked free under whatever lives there (the next allocation is
//! handed memory in use). Sizes elsewhere hide either mistake, so this
//! step makes the boundary happen.
//!
//! The size of a trampoline with N fentry programs is fixed by the kernel
//! build, but one part of each program's call sequence is the caller's to
//! choose: the `bpf_cookie` is loaded with `emit_mov_imm64()`
//! (arch/x86/net/bpf_jit_comp.c, `invoke_bpf_prog`), 2 bytes for 0
//! (`xor edi, edi`), 5 for a value that fits 32 bits unsigned, 7 for one
//! that fits signed, 10 otherwise. So the step measures the image with one
//! and two links (cookie 0), which gives the cost of a link, and attaches
//! further links with the cookies that bring the image to a multiple of
//! 64; every image's size is read back (`im->size` through /proc/kcore)
//! and must be the one predicted, so the model is checked, not trusted.
//!
//! Then the chunk right after the boundary image must hold live code: the
//! pack hands out the lowest free chunks first (`bitmap_find_next_zero_area`
//! from 0 in `bpf_prog_pack_alloc`), so `r0 = 0` socket filters, one chunk
//! each, are loaded until one lands there. The allocator is read with all
//! of it live, after the boundary image is freed, after every attempt of a
//! fail-nth sweep over the attach that rebuilds it (the hole it left is the
//! only one below the neighbour, so each attempt's image lands there), and
//! after every link is closed. The host judges the readings (rule
//! `jit-chunks`); the guest only collects.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use aya::Ebpf;
use aya_obj::generated::{
    bpf_attach_type, bpf_attr__bindgen_ty_14, bpf_attr__bindgen_ty_14__bindgen_ty_3__bindgen_ty_4,
    bpf_cmd,
};
use kloop_protocol::{BooksMoment, ImageReading, KsymReading, Message};

use crate::bpf::{self, sys_bpf_fd, zeroed_attr};
use crate::channel::{log, send};
use crate::context::StepContext;
use crate::fixtures::{fixture_program, parse_fixture};
use crate::jit_books::Books;
use crate::perf;
use crate::steps::fail_nth::{attempt_fd, sweep, FailNth, Knobs};
use crate::steps::load::load_btf;
use crate::sys::OsContext;

/// `BPF_PROG_CHUNK_SIZE` (kernel/bpf/core.c).
const CHUNK: u64 = 64;
/// `BPF_MAX_TRAMP_LINKS` (include/linux/bpf.h: 38 everywhere but s390x):
/// a trampoline takes no more fentry links.
const MAX_LINKS: usize = 38;
/// What a cookie adds to its link's code over cookie 0, per architecture.
/// x86-64: over cookie 0's 2-byte `xor edi, edi`, `mov edi, imm32` (5
/// bytes), `mov rdi, simm32` (7), `movabs rdi, imm64` (10). arm64
/// (arch/arm64/net/bpf_jit_comp.c, invoke_bpf_prog(), 6.12): cookie 0 is one
/// `str xzr`; any other is emit_a64_mov_i64() into x10 and that `str`: a
/// MOVZ and a MOVK for each further non-zero 16-bit block, 4 bytes each, so
/// one, two and three blocks add 4, 8 and 12 bytes (four would add 16).
fn cookies() -> [(u64, u32); 3] {
    match kloop_protocol::Arch::OF_THIS_BUILD {
        kloop_protocol::Arch::X86_64 => [(1, 3), (u64::MAX, 5), (1 << 32, 8)],
        kloop_protocol::Arch::Arm64 => [(1, 4), (0x1_0001, 8), (0x1_0001_0001, 12)],
    }
}
/// The most filler programs the step loads to reach the chunk after the
/// boundary image: each takes the lowest free chunk, and every hole below
/// the image is smaller than the image.
const MAX_FILLERS: usize = 512;
/// Drain the rings every this many fillers (each emits four records).
const DRAIN_EVERY: usize = 16;
/// A replaced image goes after RCU-tasks grace periods, from a worker.
const IMAGE_WAIT: Duration = Duration::from_secs(15);
/// The most attempts of the sweep (a trampoline attach passes about ten
/// slab allocations).
const MAX_ATTEMPTS: u32 = 200;

/// `BPF_LINK_CREATE` up to `tracing.cookie`.
const LINK_CREATE_TRACING_SIZE: u32 = bpf::attr_size(
    std::mem::offset_of!(bpf_attr__bindgen_ty_14, __bindgen_anon_3)
        + std::mem::offset_of!(bpf_attr__bindgen_ty_14__bindgen_ty_3__bindgen_ty_4, cookie)
        + 8,
);

/// One loaded copy of the program and its link.
struct Copy {
    /// Owns the program (and its object's BTF); dropping it unloads.
    _ebpf: Ebpf,
    fd: OwnedFd,
    id: u32,
    functions: u32,
    cookie: u64,
    link: Option<OwnedFd>,
}

/// Runs one `pack-boundary` step.
pub fn run(
    context: &mut StepContext,
    fixture: &str,
    program: &str,
    target: &str,
    fail_nth: bool,
) -> Result<()> {
    let books = Books::get().map_err(|e| anyhow!("the JIT's books: {e}"))?;
    let books = Reader(books);
    let mut copies: Vec<Copy> = Vec::new();
    let mut moments: Vec<BooksMoment> = Vec::new();
    let of = CopyOf {
        fixture,
        program,
        target,
    };

    let (boundary, sizes) = grow_to_boundary(&books, &mut copies, &of)?;

    // Live code in the chunk right after it.
    let next = boundary.start + u64::from(boundary.size);
    let (neighbour, fillers) = neighbour_after(context, &books, next)?;
    moments.push(books.moment("the boundary image and the code after it live")?);

    // Free it: the last link goes, a smaller image replaces it.
    let last = copies.len() - 1;
    drop(copies[last].link.take());
    books.wait_images("the boundary image to go", |images| {
        !images.iter().any(|i| i.start == boundary.start) && images.len() == 1
    })?;
    moments.push(books.moment("after the boundary image was freed")?);
    context.records_bytes += perf::drain_all(&mut context.rings)?;

    let (mut sweep_attempts, mut sweep_failed) = (0, 0);
    if fail_nth {
        let s = sweep_rebuild(context, &books, &copies[last], &mut moments)?;
        (sweep_attempts, sweep_failed) = s;
    }

    // Every link closes, one at a time, each replaced image gone before
    // the next close (so the stream's order does not hang on grace-period
    // timing); the fillers stay until the allocator is read.
    for c in copies.iter_mut() {
        let Some(link) = c.link.take() else { continue };
        let was: Vec<u64> = books.images()?.iter().map(|i| i.start).collect();
        drop(link);
        books.wait_images("the replaced image to go", |images| {
            images.len() <= 1 && !images.iter().any(|i| was.contains(&i.start))
        })?;
    }
    moments.push(books.moment("after every link was closed")?);
    // Sent before anything goes: a free that trips over a chunk cleared
    // under live code may WARN (and, with panic_on_warn, end the VM), and
    // the readings that show the cause must be on the host by then.
    let filler_ids: Vec<u32> = fillers.iter().map(|(_, id)| *id).collect();
    let copy_ids: Vec<u32> = copies.iter().map(|c| c.id).collect();
    let functions = copies.first().map_or(1, |c| c.functions);
    send(&Message::PackBoundary {
        sizes,
        boundary: (boundary.start, boundary.size),
        neighbour,
        fillers: filler_ids.len() as u32,
        sweep_attempts,
        sweep_failed,
        moments,
    })?;
    send(&Message::StormDone {
        fixture: fixture.to_owned(),
        program: program.to_owned(),
        functions,
        ids: copy_ids,
    })?;
    if !filler_ids.is_empty() {
        send(&Message::StormDone {
            fixture: "(none: r0 = 0 socket filter)".to_owned(),
            program: FILLER_NAME.to_owned(),
            functions: 1,
            ids: filler_ids,
        })?;
    }
    drop(fillers);
    drop(copies);
    context.records_bytes += perf::drain_all(&mut context.rings)?;
    Ok(())
}

/// Attaches copies until the trampoline image is a whole number of chunks:
/// two links with cookie 0 give the cost of a link, then the cookies
/// [`plan_cookies`] picks, every image's size checked against the one
/// predicted. Returns that boundary image and the sizes of all the images.
fn grow_to_boundary(
    books: &Reader,
    copies: &mut Vec<Copy>,
    of: &CopyOf<'_>,
) -> Result<(Image, Vec<u32>)> {
    let mut sizes: Vec<u32> = Vec::new();
    // The cost of a link with cookie 0, from the images of one and two.
    let mut image = None;
    for _ in 0..2 {
        let i = attach_copy(books, copies, of, 0)?;
        sizes.push(i.size);
        image = Some(i);
    }
    let per_link = sizes[1]
        .checked_sub(sizes[0])
        .filter(|d| *d > 0)
        .ok_or_else(|| {
            anyhow!(
                "the image of two links is {} bytes and of one {}: a link must add code",
                sizes[1],
                sizes[0]
            )
        })?;
    let plan = plan_cookies(sizes[1], per_link, MAX_LINKS - copies.len()).ok_or_else(|| {
        anyhow!(
            "no set of at most {} more links brings the {}-byte image to a multiple of {CHUNK} \
             ({per_link} bytes a link)",
            MAX_LINKS - copies.len(),
            sizes[1]
        )
    })?;
    for (cookie, extra) in plan {
        let before = image.as_ref().map_or(0, |i: &Image| i.size);
        let want = before + per_link + extra;
        let i = attach_copy(books, copies, of, cookie)?;
        sizes.push(i.size);
        if i.size != want {
            bail!(
                "a link with cookie {cookie:#x} made a {}-byte image where {want} was predicted \
                 ({before} + {per_link} a link + {extra} for the cookie; sizes so far {sizes:?}): \
                 this kernel's trampoline code is not what the step models",
                i.size
            );
        }
        image = Some(i);
    }
    let boundary = image.expect("at least two links");
    log(format!(
        "pack-boundary: image sizes {sizes:?}; {} bytes at {:#x}, {} chunks, with {} links",
        boundary.size,
        boundary.start,
        u64::from(boundary.size) / CHUNK,
        copies.len()
    ))?;
    Ok((boundary, sizes))
}

/// A loaded filler program: its fd (it stays loaded while held) and id.
type Filler = (OwnedFd, u32);

/// Loads filler programs (`r0 = 0` socket filters, a chunk each) until the
/// chunk at `next`, right after the boundary image, is used. Returns the
/// live symbol covering that chunk, if any, and the fillers, which must
/// stay loaded until the allocator is read.
fn neighbour_after(
    context: &mut StepContext,
    books: &Reader,
    next: u64,
) -> Result<(Option<KsymReading>, Vec<Filler>)> {
    let mut fillers: Vec<Filler> = Vec::new();
    let neighbour = loop {
        let ksyms = books.ksyms()?;
        if let Some(k) = ksyms
            .iter()
            .find(|k| k.start < next + CHUNK && k.end > next)
        {
            break Some(k.clone());
        }
        if chunk_used(&books.packs()?, next)? {
            // Used by an allocation whose code starts in a later chunk (a
            // program's header chunk), or by nothing live: no neighbour
            // whose symbol the host could hold to the bitmap.
            log(format!(
                "pack-boundary: the chunk at {next:#x} after the image is used, but no live \
                 symbol covers it"
            ))?;
            break None;
        }
        if fillers.len() == MAX_FILLERS {
            bail!("{MAX_FILLERS} filler programs and the chunk at {next:#x} is still free");
        }
        fillers.push(load_filler()?);
        if fillers.len().is_multiple_of(DRAIN_EVERY) {
            context.records_bytes += perf::drain_all(&mut context.rings)?;
        }
    };
    Ok((neighbour, fillers))
}

/// A trampoline image as the step needs it.
struct Image {
    start: u64,
    size: u32,
}

/// The books, with errors as the step reports them.
struct Reader(Books);

impl Reader {
    fn images(&self) -> Result<Vec<ImageReading>> {
        self.0
            .images()
            .map_err(|e| anyhow!("reading the trampoline images: {e}"))
    }
    fn ksyms(&self) -> Result<Vec<KsymReading>> {
        self.0
            .ksyms()
            .map_err(|e| anyhow!("reading bpf_kallsyms: {e}"))
    }
    fn packs(&self) -> Result<Vec<kloop_protocol::PackReading>> {
        self.0
            .packs()
            .map_err(|e| anyhow!("reading the pack bitmaps: {e}"))
    }
    fn moment(&self, what: &str) -> Result<BooksMoment> {
        self.0
            .moment(what)
            .map_err(|e| anyhow!("reading the JIT's books ({what}): {e}"))
    }

    /// Waits until `done(images)`, at most [`IMAGE_WAIT`].
    fn wait_images(&self, what: &str, done: impl Fn(&[ImageReading]) -> bool) -> Result<()> {
        let deadline = Instant::now() + IMAGE_WAIT;
        loop {
            let images = self.images()?;
            if done(&images) {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "waited {} s for {what}; images now: {:x?}",
                    IMAGE_WAIT.as_secs(),
                    images.iter().map(|i| (i.start, i.size)).collect::<Vec<_>>()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The program [`attach_copy`] loads copies of: its fixture, its name
/// there, and the function it attaches to.
struct CopyOf<'a> {
    fixture: &'a str,
    program: &'a str,
    target: &'a str,
}

/// Loads another copy of the program, attaches it with `cookie` and
/// returns the image that attach made, once the image it replaced is gone.
fn attach_copy(
    books: &Reader,
    copies: &mut Vec<Copy>,
    of: &CopyOf<'_>,
    cookie: u64,
) -> Result<Image> {
    let &CopyOf {
        fixture,
        program,
        target,
    } = of;
    let mut ebpf = parse_fixture(fixture)?;
    let prog = fixture_program(&mut ebpf, fixture, program)?;
    load_btf(prog, target)
        .map_err(anyhow::Error::from)
        .with_context(|| format!("loading {fixture}/{program} against {target}"))?;
    let fd = prog
        .fd()?
        .as_fd()
        .try_clone_to_owned()
        .context("duplicating the program fd")?;
    let info = bpf::prog_info(fd.as_fd())?;
    let before = books.images()?;
    let link = link_create(&fd, cookie)?;
    let after = books.images()?;
    let made: Vec<&ImageReading> = after
        .iter()
        .filter(|i| !before.iter().any(|b| b.start == i.start))
        .collect();
    let [new] = made.as_slice() else {
        bail!(
            "the attach of link {} made {} new trampoline images, not one",
            copies.len() + 1,
            made.len()
        );
    };
    let image = Image {
        start: new.start,
        size: new
            .size
            .ok_or_else(|| anyhow!("the image at {:#x} has no im->size", new.start))?,
    };
    copies.push(Copy {
        _ebpf: ebpf,
        fd,
        id: info.info.id,
        functions: info.jited_ksyms.len() as u32,
        cookie,
        link: Some(link),
    });
    let keep = image.start;
    books.wait_images("the replaced image to go", |images| {
        images.len() == 1 && images[0].start == keep
    })?;
    Ok(image)
}

fn link_create_attr(prog: &OwnedFd, cookie: u64) -> bpf::bpf_attr {
    let mut attr = zeroed_attr();
    attr.link_create.__bindgen_anon_1.prog_fd = prog.as_raw_fd() as u32;
    attr.link_create.attach_type = bpf_attach_type::BPF_TRACE_FENTRY as u32;
    // target_fd and target_btf_id stay 0: the program attaches where it
    // was loaded for (bpf_tracing_prog_attach).
    attr.link_create.__bindgen_anon_3.tracing.cookie = cookie;
    attr
}

fn link_create(prog: &OwnedFd, cookie: u64) -> Result<OwnedFd> {
    let mut attr = link_create_attr(prog, cookie);
    sys_bpf_fd(
        bpf_cmd::BPF_LINK_CREATE,
        &mut attr,
        LINK_CREATE_TRACING_SIZE,
    )
    .os_ctx(format!("BPF_LINK_CREATE (fentry, cookie {cookie:#x})"))
}

/// The cookies of the links to add (with what each adds over cookie 0)
/// that bring an image of `size` bytes, `per_link` more a link, to a
/// multiple of [`CHUNK`], with the fewest links; at most `room` links.
fn plan_cookies(size: u32, per_link: u32, room: usize) -> Option<Vec<(u64, u32)>> {
    for m in 1..=room as u32 {
        let base = size + m * per_link;
        let need = (CHUNK as u32 - base % CHUNK as u32) % CHUNK as u32;
        // m links, each adding 0 or one of the three costs: counts of the
        // largest, middle and smallest.
        let costs = cookies();
        let [(_, small), (_, middle), (_, large)] = costs;
        for eights in 0..=m {
            for fives in 0..=m - eights {
                for threes in 0..=m - eights - fives {
                    let extra = large * eights + middle * fives + small * threes;
                    if extra % CHUNK as u32 != need {
                        continue;
                    }
                    let mut plan = Vec::new();
                    for (count, (cookie, add)) in [threes, fives, eights].into_iter().zip(costs) {
                        plan.extend((0..count).map(|_| (cookie, add)));
                    }
                    plan.resize(m as usize, (0, 0));
                    return Some(plan);
                }
            }
        }
    }
    None
}

/// Whether the pack chunk holding `addr` is marked used.
fn chunk_used(packs: &[kloop_protocol::PackReading], addr: u64) -> Result<bool> {
    packs
        .iter()
        .find_map(|p| p.chunk_of(addr).map(|c| p.is_used(c)))
        .ok_or_else(|| anyhow!("{addr:#x} is in no bpf_prog_pack"))
}

const FILLER_NAME: &str = "kloop_fill";

/// A filler: `r0 = 0; exit` named [`FILLER_NAME`], one pack chunk.
fn load_filler() -> Result<(OwnedFd, u32)> {
    let fd = crate::steps::load::load_return_zero_filter(FILLER_NAME)
        .os_ctx("BPF_PROG_LOAD of a filler socket filter")?;
    let id = bpf::prog_info(fd.as_fd())?.info.id;
    Ok((fd, id))
}

/// Sweeps the attach that rebuilds the boundary image (the last copy's
/// program and cookie), slab allocations only, reading the allocator after
/// every attempt; returns (attempts, failed).
fn sweep_rebuild(
    context: &mut StepContext,
    books: &Reader,
    copy: &Copy,
    moments: &mut Vec<BooksMoment>,
) -> Result<(u32, u32)> {
    let knobs = Knobs::set(false)?;
    let outcome = (|| {
        let fail = FailNth::open()?;
        let mut attr = link_create_attr(&copy.fd, copy.cookie);
        // Warm the call path unarmed with an fd that is no program (EBADF).
        let mut bad = attr;
        bad.link_create.__bindgen_anon_1.prog_fd = u32::MAX;
        let _ = sys_bpf_fd(bpf_cmd::BPF_LINK_CREATE, &mut bad, LINK_CREATE_TRACING_SIZE);
        let settle = || books.wait_images("the attempt's image to go", |images| images.len() == 1);
        let summary = sweep(MAX_ATTEMPTS, |n| {
            let a = attempt_fd(
                context,
                &fail,
                n,
                || {
                    sys_bpf_fd(
                        bpf_cmd::BPF_LINK_CREATE,
                        &mut attr,
                        LINK_CREATE_TRACING_SIZE,
                    )
                },
                settle,
            )?;
            moments.push(books.moment(&format!("after attempt {n} of the sweep"))?);
            Ok(a)
        })?;
        if let Some(errno) = summary.last_errno {
            bail!(
                "the attach without an injected fault (attempt {}) failed with errno {errno}",
                summary.attempts
            );
        }
        Ok((summary.attempts, summary.failed))
    })();
    let restored = knobs.restore();
    let out = outcome?;
    restored?;
    context.records_bytes += perf::drain_all(&mut context.rings)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plan_reaches_a_chunk_boundary_with_the_fewest_links() {
        for size in [500u32, 513, 575, 639, 700] {
            for per_link in [61u32, 64, 67, 70, 93] {
                let plan = plan_cookies(size, per_link, 36).expect("a plan");
                let total: u32 =
                    size + plan.len() as u32 * per_link + plan.iter().map(|(_, a)| a).sum::<u32>();
                assert_eq!(total % 64, 0, "size {size}, per link {per_link}: {plan:?}");
                // No shorter plan exists: with one link fewer the sums
                // reachable do not hit the boundary.
                let m = plan.len() as u32 - 1;
                if m > 0 {
                    let need = (64 - (size + m * per_link) % 64) % 64;
                    let reachable = (0..=m).any(|e| {
                        (0..=m - e)
                            .any(|f| (0..=m - e - f).any(|t| (8 * e + 5 * f + 3 * t) % 64 == need))
                    });
                    assert!(!reachable, "size {size}, per link {per_link}: {plan:?}");
                }
            }
        }
    }

    #[test]
    fn an_impossible_boundary_has_no_plan() {
        // 64 bytes a link and 1 byte short: one link adds at most 8.
        assert_eq!(plan_cookies(63, 64, 1), None);
        assert_eq!(plan_cookies(64, 64, 1), Some(vec![(0, 0)]));
    }
}
