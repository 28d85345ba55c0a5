//! The waiter of polled listeners (`ListenerSpec::poll`): a thread in
//! `poll(2)` on their rings' fds, noting when each returned readable, so
//! the host can hold every record to the wake-up the kernel promises for
//! it (rule `wakeups`).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use anyhow::{Context, Result};
use kloop_protocol::Message;

use crate::channel::send;

/// How long one `poll(2)` waits. A wake-up the kernel does not deliver
/// still ends the wait here: `do_poll()` looks at the fds once more when
/// its timeout expires, and `perf_poll()` then finds `rb->poll` set. So a
/// lost wake-up shows as one this late, past the host's deadline.
const POLL_MS: libc::c_int = 1_500;

/// How long a waiter of a listener with a watermark above 1 byte goes on
/// polling after the plan's end, once quiet: the host holds every wake-up
/// decision to a wake-up within 1 s (`kloop_judge` `wakeups::DEADLINE_NS`),
/// so the waiter must still be there that long after the last record, or
/// a wake-up the kernel delivered in time would read as missing. The
/// agent cannot tell which records decided a wake-up (that needs their
/// sizes, which the host replays), so it waits the whole deadline.
const QUIET_MS: libc::c_int = 1_100;

/// A running waiter.
pub struct Waiter {
    stop: Arc<AtomicBool>,
    /// Written at [`Waiter::finish`] to end the `poll(2)` in progress, but
    /// only when no wake-up is owed (see there).
    bell: OwnedFd,
    /// Set by the thread when every record in the rings has had a
    /// wake-up after it (1-byte watermark only).
    covered: Arc<AtomicBool>,
    watermark: u32,
    thread: JoinHandle<Vec<(u32, Vec<u64>)>>,
}

/// A ring's `data_head` word, read by the waiter thread. The ring's
/// mapping outlives the waiter ([`Waiter::start`]'s contract) and the
/// kernel only ever stores the word atomically.
struct Head(*const AtomicU64);

// SAFETY: the pointer is into a shared mapping that outlives the thread
// (see `Head`); the word is only read, atomically.
unsafe impl Send for Head {}

impl Waiter {
    /// Starts waiting on `rings` (listener index, fd, its `data_head`
    /// word), opened with a wakeup watermark of `watermark` bytes. The fds
    /// and words stay owned by their rings, which must outlive
    /// [`Waiter::finish`].
    pub fn start(rings: Vec<(u32, RawFd, &AtomicU64)>, watermark: u32) -> Result<Waiter> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let covered = Arc::new(AtomicBool::new(true));
        let all_covered = covered.clone();
        // SAFETY: eventfd has no pointer arguments.
        let bell = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if bell < 0 {
            return Err(std::io::Error::last_os_error()).context("eventfd for the poll waiter");
        }
        // SAFETY: a new fd this function owns.
        let bell = unsafe { OwnedFd::from_raw_fd(bell) };
        let bell_fd = bell.as_raw_fd();
        let rings: Vec<(u32, RawFd, Head)> = rings
            .into_iter()
            .map(|(i, fd, head)| (i, fd, Head(head)))
            .collect();
        let thread = std::thread::Builder::new()
            .name("kloop-waiter".into())
            .spawn(move || run(&rings, watermark, bell_fd, &flag, &all_covered))?;
        Ok(Waiter {
            stop,
            bell,
            covered,
            watermark,
            thread,
        })
    }

    /// Stops once every record in the rings has had a wake-up after it
    /// (or after the current `poll` times out, the case of a wake-up the
    /// kernel never delivers), and sends what it saw, a `Wakeups` per
    /// listener.
    ///
    /// The bell is rung only when no wake-up is owed: any return of
    /// `poll(2)`, the bell's too, runs `perf_poll()` on every ring, which
    /// reports (and clears) `rb->poll` whether or not the kernel's wake-up
    /// came. Rung while a record waits for its wake-up, the bell would
    /// make a lost wake-up look like one delivered now. So with records
    /// owed a wake-up (or a watermark above 1 byte, where the agent cannot
    /// tell which are) the thread ends on the kernel's own wake-up or its
    /// timeout.
    pub fn finish(self) -> Result<()> {
        self.stop.store(true, Ordering::SeqCst);
        if self.watermark <= 1 && self.covered.load(Ordering::SeqCst) {
            let one: u64 = 1;
            // SAFETY: writes 8 bytes from `one`, which outlives the call.
            unsafe { libc::write(self.bell.as_raw_fd(), (&one as *const u64).cast(), 8) };
        }
        let seen = self
            .thread
            .join()
            .map_err(|_| anyhow::anyhow!("the poll waiter panicked"))?;
        drop(self.bell);
        for (listener, times_ns) in seen {
            send(&Message::Wakeups { listener, times_ns })?;
        }
        Ok(())
    }
}

fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn run(
    rings: &[(u32, RawFd, Head)],
    watermark: u32,
    bell: RawFd,
    stop: &AtomicBool,
    all_covered: &AtomicBool,
) -> Vec<(u32, Vec<u64>)> {
    let mut seen: Vec<(u32, Vec<u64>)> = rings.iter().map(|(i, _, _)| (*i, Vec::new())).collect();
    // SAFETY: each word lives as long as its ring (`Head`).
    let head = |k: usize| unsafe { (*rings[k].2 .0).load(Ordering::Acquire) };
    // Each ring's data_head as read at its last wake-up, before the
    // wake-up's time was taken: every record below it was written before
    // that time, so it has a wake-up after it.
    let mut covered: Vec<u64> = (0..rings.len()).map(head).collect();
    let mut fds: Vec<libc::pollfd> = rings
        .iter()
        .map(|(_, fd, _)| libc::pollfd {
            fd: *fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .chain(std::iter::once(libc::pollfd {
            fd: bell,
            events: libc::POLLIN,
            revents: 0,
        }))
        .collect();
    let rung = fds.len() - 1;
    loop {
        let stopping = stop.load(Ordering::SeqCst);
        // With a 1-byte watermark every record is owed a wake-up: done
        // early once none waits for one, else on to the next wake-up or
        // the timeout. A larger watermark owes none to the last records
        // below it (rule `wakeup-watermark` bounds the count from above),
        // so the waiter only lingers [`QUIET_MS`] for a wake-up in flight.
        let timeout = if stopping && watermark > 1 {
            QUIET_MS
        } else {
            if stopping && (0..rings.len()).all(|k| head(k) == covered[k]) {
                break;
            }
            POLL_MS
        };
        // SAFETY: `fds` is a valid array of pollfd of that length.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout) };
        if n == 0 && stopping {
            // A full timeout after the plan's end: a wake-up still missing
            // is lost (the host says so).
            break;
        }
        if n <= 0 {
            continue;
        }
        let heads: Vec<u64> = (0..rings.len()).map(head).collect();
        let now = monotonic_ns();
        // A return the bell ended is not the kernel's wake-up, whatever
        // the rings say (see `Waiter::finish`): none counted.
        let bell_rang = fds[rung].revents & libc::POLLIN != 0;
        if bell_rang {
            let mut buf = [0u8; 8];
            // SAFETY: reads at most 8 bytes into `buf`.
            unsafe { libc::read(bell, buf.as_mut_ptr().cast(), 8) };
        }
        for (k, p) in fds.iter_mut().enumerate() {
            if k == rung {
                p.revents = 0;
                continue;
            }
            if p.revents & libc::POLLIN != 0 && !bell_rang {
                seen[k].1.push(now);
                covered[k] = heads[k];
            }
            // An fd that errs would end every poll at once: leave it out.
            if p.revents & (libc::POLLERR | libc::POLLNVAL | libc::POLLHUP) != 0 {
                p.fd = -1;
            }
            p.revents = 0;
        }
        all_covered.store(
            (0..rings.len()).all(|k| head(k) == covered[k]),
            Ordering::SeqCst,
        );
    }
    seen
}
