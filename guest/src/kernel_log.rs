//! What the kernel says about itself while a plan runs: the kernel log's
//! records from the first step on, and kmemleak's list on a kernel built
//! with it. Collected only; the host reads the checks' reports out of them
//! (`kloop_judge::kernel_log`).

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::time::{Duration, Instant};

use kloop_path_io::{PathIo, PathIoExt};
use kloop_protocol::{Message, MAX_KERNEL_LOG};

/// kmemleak's debugfs file (mm/kmemleak.c, `kmemleak_init_fs`).
const KMEMLEAK: &str = "/sys/kernel/debug/kmemleak";

/// kmemleak reports no object younger than this (`MSECS_MIN_AGE`, 5000 ms
/// in mm/kmemleak.c): a leak made in a plan's last seconds shows only once
/// it is this old, so the final scans wait for it, with a margin.
const KMEMLEAK_MIN_AGE: Duration = Duration::from_millis(5_500);

/// The log and kmemleak as they were when the plan's first step started.
pub struct Watch {
    /// `/dev/kmsg`, positioned after the last record before the plan; or
    /// why it could not be (the host then judges no log, and says so).
    kmsg: Result<File, String>,
    /// kmemleak: `Ok(true)` scanned and cleared before the plan, `Ok(false)`
    /// not in this kernel, `Err` there but unusable (its text reaches the
    /// host as the `KernelLog` message's `kmemleak_error`).
    kmemleak: Result<bool, PathIo>,
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
            .map_err(|e| format!("opening /dev/kmsg: {e}"))
            .and_then(|mut f| {
                // devkmsg_llseek(): SEEK_END places the reader after the
                // last record.
                f.seek(SeekFrom::End(0))
                    .map_err(|e| format!("seeking /dev/kmsg to its end: {e}"))?;
                Ok(f)
            });
        let kmemleak = if std::path::Path::new(KMEMLEAK).exists() {
            command("scan")
                .and_then(|()| command("clear"))
                .map(|()| true)
        } else {
            Ok(false)
        };
        Watch { kmsg, kmemleak }
    }

    /// What the kernel said since [`Watch::start`]: kmemleak scanned twice
    /// (its documentation's advice against transient false positives) once
    /// every object the plan could have leaked is old enough to be listed,
    /// then the log. `plan_ended` is when the plan's last step ended and
    /// what it made was closed: kmemleak lists no object younger than
    /// [`KMEMLEAK_MIN_AGE`] at a scan, so the scans wait that long after
    /// it, not after the plan's start (a leak in the last step of a short
    /// plan would otherwise never be listed).
    pub fn finish(self, plan_ended: Instant) -> Message {
        let (kmemleak, kmemleak_error, kmemleak_truncated) = match self.kmemleak {
            Ok(false) => (None, None, false),
            Err(e) => (None, Some(e), false),
            Ok(true) => {
                if let Some(wait) = KMEMLEAK_MIN_AGE.checked_sub(plan_ended.elapsed()) {
                    std::thread::sleep(wait);
                }
                match command("scan")
                    .and_then(|()| command("scan"))
                    .and_then(|()| read_capped(KMEMLEAK))
                {
                    Ok((text, cut)) => (Some(text), None, cut),
                    Err(e) => (None, Some(e), false),
                }
            }
        };
        let (kmsg, read) = match self.kmsg {
            Ok(f) => (read_records(f), None),
            Err(e) => (Records::default(), Some(e)),
        };
        Message::KernelLog {
            kmsg: kmsg.messages,
            truncated: kmsg.truncated,
            overrun: kmsg.overrun,
            kmsg_error: read.or(kmsg.error),
            kmemleak,
            kmemleak_error: kmemleak_error.map(|e| e.to_string()),
            kmemleak_truncated,
            lockdep_on: lockdep_on(),
        }
    }
}

/// Writes `what` to kmemleak's file.
fn command(what: &'static str) -> Result<(), PathIo> {
    OpenOptions::new()
        .write(true)
        .open(KMEMLEAK)
        .and_then(|mut f| f.write_all(what.as_bytes()))
        .at(format!("writing {what:?} to"), KMEMLEAK)
}

/// kmemleak's list, at most [`MAX_KERNEL_LOG`] bytes, and whether it was
/// longer.
fn read_capped(path: &'static str) -> Result<(String, bool), PathIo> {
    let mut bytes = Vec::new();
    File::open(path)
        .and_then(|f| f.take(MAX_KERNEL_LOG as u64 + 1).read_to_end(&mut bytes))
        .at("reading", path)?;
    let cut = bytes.len() > MAX_KERNEL_LOG;
    bytes.truncate(MAX_KERNEL_LOG);
    Ok((String::from_utf8_lossy(&bytes).into_owned(), cut))
}

/// What [`read_records`] read, and what it could not.
#[derive(Default)]
struct Records {
    messages: Vec<String>,
    /// The cap cut the rest.
    truncated: bool,
    /// Reads that found their record overwritten (EPIPE).
    overrun: u32,
    /// A read failed otherwise: the rest of the log is unread.
    error: Option<String>,
}

/// The log's records after the reader's position: one `read` is one record,
/// `prio,seq,ts,flags;message\n` then its dictionary, one ` KEY=value\n`
/// line each (printk/printk.c devkmsg_read, info_print_ext_header and
/// info_print_ext_body: a newline inside the message is escaped as `\x0a`,
/// so the message is exactly the first line). A stack frame is a record of
/// its own whose message starts with a space (` perf_event_ksymbol+0x…`),
/// kept as such. EAGAIN is the end, EPIPE a record overwritten before it
/// was read (the reader moves on to the oldest kept, and the loss is
/// counted).
fn read_records(mut kmsg: File) -> Records {
    let mut out = Records::default();
    let mut bytes = 0usize;
    let mut buf = vec![0u8; 8192];
    loop {
        match kmsg.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                let Some(text) = record_message(&buf[..n]) else {
                    continue;
                };
                bytes += text.len();
                if bytes > MAX_KERNEL_LOG {
                    out.truncated = true;
                    break;
                }
                out.messages.push(text);
            }
            Err(e) if e.raw_os_error() == Some(libc::EPIPE) => out.overrun += 1,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                out.error = Some(format!("reading /dev/kmsg: {e}"));
                break;
            }
        }
    }
    out
}

/// The message of one /dev/kmsg record, without its header and dictionary
/// (see [`read_records`]); `None` for a record without the `;`.
fn record_message(rec: &[u8]) -> Option<String> {
    let rec = String::from_utf8_lossy(rec);
    let (_, rest) = rec.split_once(';')?;
    // devkmsg_read() escapes a newline inside the message as `\x0a`
    // (lockdep prints `\n-> #1 …` in one record): put it back, so each of
    // the message's lines is one line for the host.
    Some(rest.split('\n').next().unwrap_or("").replace("\\x0a", "\n"))
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
mod record_tests {
    use super::record_message;

    #[test]
    fn a_frame_record_keeps_its_leading_space_and_drops_the_dictionary() {
        // As devkmsg_read() formats them (a KASAN report's header record,
        // then one of its frames, then a record with a dictionary).
        assert_eq!(
            record_message(
                b"3,812,4031123,-;BUG: KASAN: slab-out-of-bounds in kloop_control_oob+0x2a/0x40\n"
            )
            .as_deref(),
            Some("BUG: KASAN: slab-out-of-bounds in kloop_control_oob+0x2a/0x40")
        );
        assert_eq!(
            record_message(b"4,815,4031190,c; kloop_control_oob+0x2a/0x40 [kloop_control]\n")
                .as_deref(),
            Some(" kloop_control_oob+0x2a/0x40 [kloop_control]")
        );
        assert_eq!(
            record_message(b"6,900,5000000,-;virtio_net virtio0 eth0: up\n SUBSYSTEM=virtio\n DEVICE=+virtio:virtio0\n")
                .as_deref(),
            Some("virtio_net virtio0 eth0: up")
        );
        assert_eq!(record_message(b"no header"), None);
        // A newline inside a message (lockdep's chain) comes escaped.
        assert_eq!(
            record_message(b"4,900,5000001,c;\\x0a-> #1 (&b){+.+.}-{4:4}:\n").as_deref(),
            Some("\n-> #1 (&b){+.+.}-{4:4}:")
        );
    }
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
