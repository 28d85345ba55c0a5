//! What the kernel says about itself while a plan runs: the kernel log's
//! records from the first step on, and kmemleak's list on a kernel built
//! with it. Collected only; the host reads the checks' reports out of them
//! (`kloop_judge::kernel_log`).

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::time::{Duration, Instant};

use kloop_protocol::{Message, MAX_KERNEL_LOG};

/// kmemleak's debugfs file (mm/kmemleak.c, `kmemleak_init_fs`).
const KMEMLEAK: &str = "/sys/kernel/debug/kmemleak";

/// kmemleak reports no object younger than this (`MSECS_MIN_AGE`, 5000 ms
/// in mm/kmemleak.c): a leak made in a plan's last seconds shows only once
/// it is this old, so the final scans wait for it, with a margin.
const KMEMLEAK_MIN_AGE: Duration = Duration::from_millis(5_500);

/// The log and kmemleak as they were when the plan's first step started.
pub struct Watch {
    /// `/dev/kmsg`, positioned after the last record before the plan.
    kmsg: Option<File>,
    /// kmemleak: `Ok(true)` scanned and cleared before the plan, `Ok(false)`
    /// not in this kernel, `Err` there but unusable.
    kmemleak: Result<bool, KmemleakError>,
    started: Instant,
}

impl Watch {
    /// Starts watching: the log from here on, and kmemleak with every leak
    /// it knows of now marked as seen (`scan`, then `clear`: "clear the list
    /// of all current possible memory leaks", Documentation/dev-tools/
    /// kmemleak.rst), so what it lists at the end is the plan's.
    pub fn start() -> Watch {
        let kmsg = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open("/dev/kmsg")
            .ok()
            .and_then(|mut f| {
                // devkmsg_llseek(): SEEK_END places the reader after the
                // last record.
                f.seek(SeekFrom::End(0)).ok()?;
                Some(f)
            });
        let kmemleak = if std::path::Path::new(KMEMLEAK).exists() {
            command("scan")
                .and_then(|()| command("clear"))
                .map(|()| true)
        } else {
            Ok(false)
        };
        Watch {
            kmsg,
            kmemleak,
            started: Instant::now(),
        }
    }

    /// What the kernel said since [`Watch::start`]: kmemleak scanned twice
    /// (its documentation's advice against transient false positives) once
    /// the plan's objects are old enough to be reported, then the log.
    pub fn finish(self) -> Message {
        let (kmemleak, kmemleak_error) = match self.kmemleak {
            Ok(false) => (None, None),
            Err(e) => (None, Some(e)),
            Ok(true) => {
                if let Some(wait) = KMEMLEAK_MIN_AGE.checked_sub(self.started.elapsed()) {
                    std::thread::sleep(wait);
                }
                match command("scan")
                    .and_then(|()| command("scan"))
                    .and_then(|()| read_capped(KMEMLEAK))
                {
                    Ok(text) => (Some(text), None),
                    Err(e) => (None, Some(e)),
                }
            }
        };
        let (kmsg, truncated) = self.kmsg.map(read_records).unwrap_or_default();
        Message::KernelLog {
            kmsg,
            truncated,
            kmemleak,
            kmemleak_error: kmemleak_error.map(|e| e.to_string()),
            lockdep_on: lockdep_on(),
        }
    }
}

/// Why kmemleak could not be used; its text reaches the host as the
/// `KernelLog` message's `kmemleak_error`.
#[derive(Debug, thiserror::Error)]
enum KmemleakError {
    #[error("writing {what:?} to {KMEMLEAK}: {source}")]
    Command {
        what: &'static str,
        source: std::io::Error,
    },
    #[error("reading {path}: {source}")]
    Read {
        path: &'static str,
        source: std::io::Error,
    },
}

/// Writes `what` to kmemleak's file.
fn command(what: &'static str) -> Result<(), KmemleakError> {
    OpenOptions::new()
        .write(true)
        .open(KMEMLEAK)
        .and_then(|mut f| f.write_all(what.as_bytes()))
        .map_err(|source| KmemleakError::Command { what, source })
}

fn read_capped(path: &'static str) -> Result<String, KmemleakError> {
    let mut text = String::new();
    File::open(path)
        .and_then(|f| f.take(MAX_KERNEL_LOG as u64).read_to_string(&mut text))
        .map_err(|source| KmemleakError::Read { path, source })?;
    Ok(text)
}

/// The log's records after the reader's position: one `read` is one record
/// (`prio,seq,ts,flags;message` then ` KEY=value` lines, printk/printk.c
/// devkmsg_read); EAGAIN is the end, EPIPE a record overwritten before it
/// was read (the reader moves on to the oldest kept).
fn read_records(mut kmsg: File) -> (Vec<String>, bool) {
    let mut out = Vec::new();
    let mut bytes = 0usize;
    let mut truncated = false;
    let mut buf = vec![0u8; 8192];
    loop {
        match kmsg.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                let rec = String::from_utf8_lossy(&buf[..n]);
                let Some((_, message)) = rec.split_once(';') else {
                    continue;
                };
                // Dictionary lines (SUBSYSTEM=, DEVICE=) start with a space.
                let text: Vec<&str> = message
                    .lines()
                    .take_while(|l| !l.starts_with(' '))
                    .collect();
                let text = text.join("\n");
                bytes += text.len();
                if bytes > MAX_KERNEL_LOG {
                    truncated = true;
                    break;
                }
                out.push(text);
            }
            Err(e) if e.raw_os_error() == Some(libc::EPIPE) => truncated = true,
            Err(_) => break,
        }
    }
    (out, truncated)
}

/// lockdep's statistics (kernel/locking/lockdep_proc.c), on a kernel built
/// with it.
const LOCKDEP_STATS: &str = "/proc/lockdep_stats";

/// `debug_locks` from [`LOCKDEP_STATS`]: whether lockdep still checks;
/// `None` without lockdep (or a file without the line).
fn lockdep_on() -> Option<bool> {
    let text = std::fs::read_to_string(LOCKDEP_STATS).ok()?;
    parse_debug_locks(&text)
}

fn parse_debug_locks(text: &str) -> Option<bool> {
    text.lines().find_map(|l| {
        let (key, value) = l.split_once(':')?;
        (key.trim() == "debug_locks").then(|| value.trim() != "0")
    })
}

#[cfg(test)]
mod lockdep_tests {
    use super::parse_debug_locks;

    #[test]
    fn debug_locks_is_read_from_lockdep_stats() {
        // The layout of lockdep_stats_show() (kernel/locking/lockdep_proc.c).
        let on = " lock-classes:                          612 [max: 8192]\n debug_locks:                             1\n";
        assert_eq!(parse_debug_locks(on), Some(true));
        let off = on.replace("     1", "     0");
        assert_eq!(parse_debug_locks(&off), Some(false));
        assert_eq!(parse_debug_locks(" lock-classes: 612\n"), None);
    }
}
