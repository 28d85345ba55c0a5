//! The `spin-read` step: does the kernel write a record's bytes before it
//! publishes them (rule `published-bytes`)?
//!
//! The ring-buffer protocol (include/uapi/linux/perf_event.h, the comment
//! on `data_head`; kernel/events/ring_buffer.c, `perf_output_put_handle()`)
//! is that the kernel writes a record, issues `smp_wmb()`, then stores
//! `data_head`; a reader that loads `data_head` and then `smp_rmb()` may
//! read every byte below it. A kernel that stores `data_head` first and
//! writes part of the record after (a trailer written past
//! `perf_output_end()`) leaves a window in which a reader on another CPU
//! sees bytes the kernel has not written yet. Those bytes are whatever the
//! ring held before: zeros in a fresh ring (its pages are allocated with
//! `__GFP_ZERO`), past a lap what the reader read there one lap earlier,
//! which it keeps. User space cannot write the data pages to poison them
//! (the kernel refuses the write fault: `perf_mmap_pfn_mkwrite()`, before
//! 6.11 `perf_mmap_fault()`), and needs not: the trailer's words are
//! known. `id` and `identifier` are the event's id, `cpu` is the
//! listener's CPU with `res` 0, and `time` is newer than anything the
//! ring held. A word that is not what the kernel writes there, once
//! `data_head` covers it, was published before it was written. (`pid,
//! tid` is not judged: an idle task's record would carry 0/0.)
//!
//! The window is short, so the reader spins on `data_head` from CPU 1
//! while the loader, the plan's main thread, runs on CPU 0, where the
//! listener is. Right after seeing `data_head` move, before anything else,
//! it copies the sample_id trailer of the newest record (the trailer's
//! words right below the head: every record of this listener ends in one
//! of that length), the record the kernel may still be writing.
//!
//! Under TCG with one thread for all vCPUs (kloop's `-accel
//! tcg,thread=single`) the reader runs only while CPU 0 is stopped: QEMU
//! switches vCPUs when a timer of its main loop kicks the running one out,
//! about every guest tick, and the reader sees where CPU 0 stood then. So
//! the chance to catch a late write is the window's share of CPU 0's time.
//! The listener has a 1-byte wakeup watermark: every record's
//! `perf_output_put_handle()` queues the wake-up irq_work right after it
//! stores `data_head`, and the irq_work runs at once (a self-IPI), inside
//! that window. `waiters` epoll instances on the listener's fd make that
//! wake-up walk as many callbacks, which stretches the window to tens of
//! µs without waking any task; on 6.12 with 2000 of them, a KSYMBOL
//! trailer written after `perf_output_end()` was caught 92 and 173 times in
//! two runs of 300 cycles (2400 records, 193 and 363 head advances). A `cpu-clock` event on the reader's CPU to
//! switch vCPUs more often did the opposite: CPU 1 spent its turns in the
//! timer interrupt, and the reader saw the head move twice in 300 cycles.

use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use aya_obj::generated::perf_event_sample_format as fmt;
use kloop_protocol::{ListenerSpec, Message, SpinReading, TornRecord, TornWord, MAX_TORN};

use crate::bpf;
use crate::channel::send;
use crate::fixtures::{fixture_program, load_program, parse_fixture, unload_program};
use crate::perf::Ring;
use crate::sys::{self, OsContext};

/// Where the listener and the loader are.
const LISTENER_CPU: u32 = 0;
/// Where the reader spins.
const READER_CPU: u32 = 1;
/// `PERF_RECORD_LOST`: its body is `id, lost`.
const RECORD_LOST: u32 = 2;
/// How long the reader waits for a torn word to be written after all.
const LATE_WRITE_WAIT: Duration = Duration::from_millis(200);
/// The most trailer words (tid, time, id, stream_id, cpu, identifier).
const MAX_TRAILER: usize = 6;

/// Runs the step: opens the listener, starts the reader, loads and
/// unloads `cycles` times, stops the reader and sends its `SpinRead`.
pub fn run(
    spec: &ListenerSpec,
    fixture: &str,
    program: &str,
    cycles: u32,
    waiters: u32,
) -> Result<()> {
    // Opened disabled: its id is read before any record can land.
    let ring_spec = ListenerSpec {
        disabled: true,
        cpus: None,
        ..spec.clone()
    };
    let ring = Ring::open(u32::MAX, LISTENER_CPU, &ring_spec)?;
    let trailer = trailer_layout(spec, ring.event_id()?);
    if trailer.iter().all(|(_, c)| matches!(c, Check::Unjudged)) {
        bail!(
            "spin-read: the listener's trailer has no word to judge: ask for sample_id_all \
             with time, id, cpu or identifier (`sample`)"
        );
    }
    let _waiters = register_waiters(&ring, waiters)?;
    let mut ebpf = parse_fixture(fixture)?;
    let prog = fixture_program(&mut ebpf, fixture, program)?;
    let what = format!("{fixture}/{program}");
    let stop = AtomicBool::new(false);
    let ready = AtomicBool::new(false);
    let saved = sys::pin_to(LISTENER_CPU)?;
    // Enabled before the reader starts: it checks from data_tail on, so a
    // record written in between is checked too.
    ring.enable()?;
    let outcome = std::thread::scope(|s| {
        let (trailer, stop, ready) = (&trailer, &stop, &ready);
        // The reader owns the ring (and closes it when it is done).
        let reader = std::thread::Builder::new()
            .name("spin-reader".into())
            .spawn_scoped(s, move || -> Result<SpinReading> {
                sys::pin_to(READER_CPU)?;
                Ok(read(&ring, trailer, stop, ready))
            })
            .context("spawning the spin reader")?;
        let loaded = (|| -> Result<u32> {
            let started = Instant::now();
            while !ready.load(Ordering::Acquire) {
                if reader.is_finished() || started.elapsed() > Duration::from_secs(10) {
                    bail!("spin-read: the reader did not start");
                }
                std::thread::yield_now();
            }
            let mut functions = 0;
            for i in 0..cycles {
                load_program(prog)
                    .with_context(|| format!("spin-read: loading {what}, cycle {i}"))?;
                if i == 0 {
                    let info = bpf::prog_info(prog.fd()?.as_fd())
                        .with_context(|| format!("spin-read: bpf_prog_info of {what}"))?;
                    functions = info.info.nr_jited_ksyms;
                }
                unload_program(prog)
                    .with_context(|| format!("spin-read: unloading {what}, cycle {i}"))?;
            }
            Ok(functions)
        })();
        // Whatever the loads did, the reader stops (else the scope waits).
        stop.store(true, Ordering::Release);
        let reading = reader
            .join()
            .map_err(|_| anyhow!("the spin reader panicked"))??;
        anyhow::Ok((loaded?, reading))
    });
    sys::set_affinity(&saved)?;
    let (functions, mut reading) = outcome?;
    reading.cycles = cycles;
    reading.functions = functions;
    send(&Message::SpinRead(reading))
}

/// `n` epoll instances, each with the listener's fd in its interest list:
/// each puts one entry (`ep_poll_callback`) on the event's wait queue, and
/// the wake-up every record queues walks them all in the irq_work that
/// `perf_output_put_handle()` raises right after storing `data_head`.
/// Nobody waits on the epolls, so no task is woken: they only lengthen the
/// kernel's path between publishing a record and returning from
/// `perf_output_end()`, where a late trailer would be written.
fn register_waiters(ring: &Ring, n: u32) -> Result<Vec<std::os::fd::OwnedFd>> {
    use std::os::fd::FromRawFd;
    if n == 0 {
        return Ok(Vec::new());
    }
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit read and write the struct given.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return Err(std::io::Error::last_os_error()).os_ctx("getrlimit(RLIMIT_NOFILE)");
        }
        let want = u64::from(n) + 256;
        if lim.rlim_cur < want {
            lim.rlim_cur = want;
            lim.rlim_max = lim.rlim_max.max(want);
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                return Err(std::io::Error::last_os_error())
                    .os_ctx(format!("setrlimit(RLIMIT_NOFILE, {want})"));
            }
        }
    }
    let mut out = Vec::with_capacity(n as usize);
    for i in 0..n {
        // SAFETY: plain syscalls; the fd is ours from here on.
        let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if ep < 0 {
            return Err(std::io::Error::last_os_error())
                .os_ctx(format!("epoll_create1 (waiter {i})"));
        }
        let ep = unsafe { std::os::fd::OwnedFd::from_raw_fd(ep) };
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: 0,
        };
        // SAFETY: both fds are open; `ev` lives through the call.
        if unsafe {
            libc::epoll_ctl(
                std::os::fd::AsRawFd::as_raw_fd(&ep),
                libc::EPOLL_CTL_ADD,
                ring.raw_fd(),
                &mut ev,
            )
        } != 0
        {
            return Err(std::io::Error::last_os_error())
                .os_ctx(format!("epoll_ctl(ADD, the listener's fd) (waiter {i})"));
        }
        out.push(ep);
    }
    Ok(out)
}

/// What a trailer word must hold once the kernel has written it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Check {
    /// Exactly this (the event's id; the listener's CPU with `res` 0).
    Is(u64),
    /// Something else than the ring held there before (a time: newer than
    /// every time written before it, and never a zero or another field).
    Fresh,
    /// Anything (`pid, tid`).
    Unjudged,
}

/// The trailer's words in order, as `__perf_event__output_id_sample()`
/// writes them for `spec`'s sample_type, each with its check; `id` is the
/// event's (`PERF_EVENT_IOC_ID`). Empty without `sample_id_all`.
fn trailer_layout(spec: &ListenerSpec, id: u64) -> Vec<(Option<TornWord>, Check)> {
    if !spec.sample_id_all {
        return Vec::new();
    }
    [
        (fmt::PERF_SAMPLE_TID, None, Check::Unjudged),
        (fmt::PERF_SAMPLE_TIME, Some(TornWord::Time), Check::Fresh),
        (fmt::PERF_SAMPLE_ID, Some(TornWord::Id), Check::Is(id)),
        (
            fmt::PERF_SAMPLE_STREAM_ID,
            Some(TornWord::StreamId),
            Check::Is(id),
        ),
        (
            fmt::PERF_SAMPLE_CPU,
            Some(TornWord::Cpu),
            Check::Is(u64::from(LISTENER_CPU)),
        ),
        (
            fmt::PERF_SAMPLE_IDENTIFIER,
            Some(TornWord::Identifier),
            Check::Is(id),
        ),
    ]
    .into_iter()
    .filter(|(bit, _, _)| spec.sample_type & (*bit as u64) != 0)
    .map(|(_, w, c)| (w, c))
    .collect()
}

/// The data area as words at stream positions (taken modulo its size),
/// and what each word held when the reader last read it (zeros at first,
/// as the kernel hands out a fresh ring).
struct Area {
    data: *mut u8,
    mask: u64,
    before: Vec<u64>,
}

impl Area {
    fn load(&self, pos: u64) -> u64 {
        // SAFETY: `pos & mask` is inside the area; every position used is
        // 8-aligned (records are, and the area is page-aligned). Atomic:
        // the kernel may be writing the word right now.
        unsafe { &*(self.data.add((pos & self.mask) as usize) as *const AtomicU64) }
            .load(Ordering::Relaxed)
    }

    fn before(&self, pos: u64) -> u64 {
        self.before[((pos & self.mask) / 8) as usize]
    }

    /// Whether `value`, read at `pos`, is not what the kernel writes there.
    fn torn(&self, pos: u64, value: u64, check: Check) -> bool {
        match check {
            Check::Is(want) => value != want,
            Check::Fresh => value == self.before(pos),
            Check::Unjudged => false,
        }
    }
}

/// Spins until `stop`, checking each record the moment `data_head` covers
/// it; see the module docs.
fn read(
    ring: &Ring,
    trailer: &[(Option<TornWord>, Check)],
    stop: &AtomicBool,
    ready: &AtomicBool,
) -> SpinReading {
    let (data, size) = ring.data_area();
    let mut area = Area {
        data,
        mask: size as u64 - 1,
        before: vec![0; size / 8],
    };
    let (head_word, tail_word) = (ring.head_word(), ring.tail_word());
    let n = trailer.len();
    let mut out = SpinReading {
        listener_cpu: LISTENER_CPU,
        reader_cpu: READER_CPU,
        ..SpinReading::default()
    };
    let mut tail = tail_word.load(Ordering::Relaxed);
    // Everything from the tail on is new, what came before the reader ran
    // included.
    let mut seen = tail;
    let mut last_pass = false;
    let mut snap = [0u64; MAX_TRAILER];
    ready.store(true, Ordering::Release);
    loop {
        // Acquire: pairs with the kernel's smp_wmb() before it stores the
        // head, so every byte below it must be the record's.
        let head = head_word.load(Ordering::Acquire);
        if head == seen {
            if last_pass {
                break;
            }
            // The loads are synchronous: once stop is set every record is
            // published; one more look at the head takes the last ones.
            last_pass = stop.load(Ordering::Acquire);
            std::hint::spin_loop();
            continue;
        }
        // First of all, the newest record's trailer: the bytes a kernel
        // that publishes early may still be writing.
        for (k, s) in snap.iter_mut().enumerate().take(n) {
            *s = area.load(head.wrapping_sub(8 * (n - k) as u64));
        }
        seen = head;
        out.head_advances += 1;
        if out.stopped.is_none() {
            if head.wrapping_sub(tail) > size as u64 {
                out.stopped = Some(format!(
                    "data_head {head} is {} bytes past data_tail {tail}, more than the \
                     {size}-byte ring: the kernel wrote past the reader",
                    head.wrapping_sub(tail)
                ));
            } else if let Err(why) = check(&area, trailer, tail, head, &snap, &mut out) {
                out.stopped = Some(why.to_string());
            }
        }
        // Remember what lies there now, for the next lap's checks, then
        // hand the stretch back (Release: read before the kernel reuses it).
        let mut pos = tail;
        while pos != head {
            let i = ((pos & area.mask) / 8) as usize;
            area.before[i] = area.load(pos);
            pos = pos.wrapping_add(8);
        }
        tail_word.store(head, Ordering::Release);
        tail = head;
    }
    out
}

/// Why the stream cannot be walked further (the reading carries its text
/// to the host).
#[derive(Debug, thiserror::Error)]
enum Unwalkable {
    #[error(
        "the record header at {pos} (below data_head {head}) was never written \
         within {LATE_WRITE_WAIT:?}"
    )]
    HeaderNeverWritten { pos: u64, head: u64 },
    #[error(
        "record at {pos}: header.size {size} does not fit a record with a {tlen}-byte \
         trailer below data_head {head}"
    )]
    SizeDoesNotFit {
        pos: u64,
        size: u16,
        tlen: u64,
        head: u64,
    },
}

/// Checks the records in `[tail, head)`; `snap` is the newest record's
/// trailer as read right after the head. `Err`: the stream cannot be
/// walked further.
fn check(
    area: &Area,
    trailer: &[(Option<TornWord>, Check)],
    tail: u64,
    head: u64,
    snap: &[u64; MAX_TRAILER],
    out: &mut SpinReading,
) -> std::result::Result<(), Unwalkable> {
    let tlen = 8 * trailer.len() as u64;
    let mut pos = tail;
    while pos != head {
        let mut words = Vec::new();
        let mut places = Vec::new();
        let mut header = area.load(pos);
        // A fresh ring's header word is 0 until the kernel writes it; a
        // reused one cannot be told from the record before.
        if header == 0 && area.before(pos) == 0 {
            words.push(TornWord::Header);
            header = wait_header(area, pos).ok_or(Unwalkable::HeaderNeverWritten { pos, head })?;
        }
        let record_type = header as u32;
        let size = (header >> 48) as u16;
        let len = u64::from(size);
        if len < 8 + tlen || len % 8 != 0 || len > head.wrapping_sub(pos) {
            return Err(Unwalkable::SizeDoesNotFit {
                pos,
                size,
                tlen,
                head,
            });
        }
        let end = pos.wrapping_add(len);
        let body_end = end.wrapping_sub(tlen);
        for (k, (word, c)) in trailer.iter().enumerate() {
            let Some(word) = word else { continue };
            let at = body_end.wrapping_add(8 * k as u64);
            let early = end == head && area.torn(at, snap[k], *c);
            if early || area.torn(at, area.load(at), *c) {
                words.push(*word);
                places.push((at, *c));
            }
        }
        if record_type == RECORD_LOST && len >= 8 + 16 + tlen {
            out.lost = out.lost.saturating_add(area.load(pos.wrapping_add(16)));
        }
        if !words.is_empty() {
            out.torn_total += 1;
            if out.torn.len() < MAX_TORN {
                out.torn.push(TornRecord {
                    offset: pos,
                    head,
                    record_type,
                    size,
                    words,
                    written_later: written_later(area, &places),
                });
            }
        }
        out.records += 1;
        out.bytes += len;
        pos = end;
    }
    Ok(())
}

/// The header at `pos` once it is no longer 0, waiting at most
/// [`LATE_WRITE_WAIT`].
fn wait_header(area: &Area, pos: u64) -> Option<u64> {
    let started = Instant::now();
    while started.elapsed() < LATE_WRITE_WAIT {
        let w = area.load(pos);
        if w != 0 {
            return Some(w);
        }
        std::hint::spin_loop();
    }
    None
}

/// Whether every torn trailer word holds what the kernel writes there by
/// now (waiting at most [`LATE_WRITE_WAIT`]): the kernel wrote it after
/// publishing it, rather than never.
fn written_later(area: &Area, places: &[(u64, Check)]) -> bool {
    let started = Instant::now();
    loop {
        if places
            .iter()
            .all(|(at, c)| !area.torn(*at, area.load(*at), *c))
        {
            return true;
        }
        if started.elapsed() > LATE_WRITE_WAIT {
            return false;
        }
        std::hint::spin_loop();
    }
}
