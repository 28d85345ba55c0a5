//! The waiter of polled listeners (`ListenerSpec::poll`): a thread in
//! `poll(2)` on their rings' fds, noting when each returned readable, so
//! the host can hold every record to the wake-up the kernel promises for
//! it (rule `wakeups`).

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use anyhow::Result;
use kloop_protocol::Message;

use crate::channel::send;

/// How long one `poll(2)` waits. A wake-up the kernel does not deliver
/// still ends the wait here: `do_poll()` looks at the fds once more when
/// its timeout expires, and `perf_poll()` then finds `rb->poll` set. So a
/// lost wake-up shows as one this late, past the host's deadline.
const POLL_MS: libc::c_int = 1_500;

/// A running waiter.
pub struct Waiter {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Vec<(u32, Vec<u64>)>>,
}

impl Waiter {
    /// Starts waiting on `rings` (listener index, fd). The fds stay owned
    /// by their rings, which must outlive [`Waiter::finish`].
    pub fn start(rings: Vec<(u32, RawFd)>) -> Result<Waiter> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("kloop-waiter".into())
            .spawn(move || run(&rings, &flag))?;
        Ok(Waiter { stop, thread })
    }

    /// Stops after the current `poll` and sends what it saw, a `Wakeups`
    /// per listener.
    pub fn finish(self) -> Result<()> {
        self.stop.store(true, Ordering::SeqCst);
        let seen = self
            .thread
            .join()
            .map_err(|_| anyhow::anyhow!("the poll waiter panicked"))?;
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

fn run(rings: &[(u32, RawFd)], stop: &AtomicBool) -> Vec<(u32, Vec<u64>)> {
    let mut seen: Vec<(u32, Vec<u64>)> = rings.iter().map(|(i, _)| (*i, Vec::new())).collect();
    let mut fds: Vec<libc::pollfd> = rings
        .iter()
        .map(|(_, fd)| libc::pollfd {
            fd: *fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    while !stop.load(Ordering::SeqCst) {
        // SAFETY: `fds` is a valid array of pollfd of that length.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, POLL_MS) };
        if n <= 0 {
            continue;
        }
        let now = monotonic_ns();
        for (k, p) in fds.iter_mut().enumerate() {
            if p.revents & libc::POLLIN != 0 {
                seen[k].1.push(now);
            }
            // An fd that errs would end every poll at once: leave it out.
            if p.revents & (libc::POLLERR | libc::POLLNVAL | libc::POLLHUP) != 0 {
                p.fd = -1;
            }
            p.revents = 0;
        }
    }
    seen
}
