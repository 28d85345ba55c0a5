//! The real `perf`, run in the guest as a second reader.
//!
//! `perf-record-start` starts `perf record <args>` with its events disabled
//! (`--delay -1`) and a control FIFO, then asks it to enable them and waits
//! for its acknowledgement: from that moment on every side-band record the
//! kernel emits reaches perf's rings, and nothing the agent did before (the
//! loads perf must learn by synthesis) can race with perf's start-up. perf
//! synthesises records for the programs alive at start before it reads
//! commands, so the ack also means synthesis is over.
//!
//! `perf-record-stop` sends SIGINT, waits for perf to write its file and
//! exit, and runs `perf report -D --header` on it: that is the only perf
//! output that has every field of every record. `perf script
//! --show-bpf-events` (and `-D`'s summary lines) print a BPF_EVENT as
//! `type, flags, id` without its tag, while `-D` also dumps every record's
//! raw bytes (the tag and the `sample_id` trailer included); `--header`
//! adds the event attributes (`sample_type`) needed to read the trailer.

use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use kloop_protocol::Message;

use crate::channel::{log, send};
use crate::sys::OsContext;

const PERF: &str = "/usr/bin/perf";
const DATA: &str = "/tmp/perf.data";
const CTL: &str = "/tmp/perf-ctl.fifo";
const ACK: &str = "/tmp/perf-ack.fifo";
const RECORD_OUT: &str = "/tmp/perf-record.stdout";
const RECORD_ERR: &str = "/tmp/perf-record.stderr";
const REPORT_OUT: &str = "/tmp/perf-report.stdout";
const REPORT_ERR: &str = "/tmp/perf-report.stderr";

/// perf under TCG: start-up reads /proc/kallsyms and every thread's maps,
/// shutdown writes the file; both take seconds on a slow emulated CPU.
const START_DEADLINE: Duration = Duration::from_secs(60);
const STOP_DEADLINE: Duration = Duration::from_secs(60);
const REPORT_DEADLINE: Duration = Duration::from_secs(120);

/// What `PerfScript.text` may carry: the message travels as one frame.
const MAX_TEXT: usize = 900 * 1024;

struct Running {
    child: Child,
    command: String,
    /// Held open so perf's control channel stays valid until it exits.
    _ctl: File,
    _ack: File,
}

static PERF_RECORD: Mutex<Option<Running>> = Mutex::new(None);

fn perf_command(args: &[&str]) -> Command {
    let mut cmd = Command::new(PERF);
    cmd.args(args)
        .env_clear()
        .env("HOME", "/tmp")
        .env("PATH", "/usr/bin:/bin")
        .env("PAGER", "cat")
        .stdin(Stdio::null());
    cmd
}

/// perf's file as it wrote it, in pieces: the host keeps it in the
/// trial's artefacts and reads it with `check-perf-data`'s reader, a
/// second reader of the same bytes perf's dump shows.
fn send_data() -> Result<()> {
    let data = std::fs::read(DATA).os_ctx(format!("reading {DATA}"))?;
    if data.len() > MAX_DATA {
        log(format!(
            "perf.data is {} bytes, more than the {MAX_DATA} sent to the host: not sent",
            data.len()
        ))?;
        return Ok(());
    }
    for (i, piece) in data.chunks(kloop_protocol::PERF_DATA_PIECE).enumerate() {
        send(&Message::PerfData {
            offset: (i * kloop_protocol::PERF_DATA_PIECE) as u64,
            total: data.len() as u64,
            hex: hex::encode(piece),
        })?;
    }
    Ok(())
}

/// The largest perf.data sent to the host (the scenarios' files are a few
/// hundred KiB).
const MAX_DATA: usize = 16 << 20;

fn mkfifo(path: &str) -> Result<()> {
    let _ = std::fs::remove_file(path);
    let c = std::ffi::CString::new(path).expect("fifo paths have no NUL");
    // SAFETY: a valid NUL-terminated path.
    if unsafe { libc::mkfifo(c.as_ptr(), 0o600) } != 0 {
        return Err(crate::sys::last_os_error()).os_ctx(format!("mkfifo {path}"));
    }
    Ok(())
}

/// Opens a FIFO read-write: never blocks, and perf's own open of the other
/// end (write-only for the ack FIFO) finds a reader at once.
fn open_fifo(path: &str) -> Result<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(path)
        .os_ctx(format!("opening FIFO {path}"))
}

fn read_lossy(path: &str) -> String {
    std::fs::read(path)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_else(|e| format!("(cannot read {path}: {e})"))
}

/// `perf-record-start`: starts `perf record <args>` and returns once perf
/// has acknowledged enabling its events.
pub fn start(args: &[String]) -> Result<()> {
    let mut slot = PERF_RECORD.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(r) = slot.as_ref() {
        bail!("perf record is already running ({})", r.command);
    }
    mkfifo(CTL)?;
    mkfifo(ACK)?;
    let ctl = open_fifo(CTL)?;
    let mut ack = open_fifo(ACK)?;
    let control = format!("fifo:{CTL},{ACK}");
    let mut full: Vec<&str> = vec!["record"];
    full.extend(args.iter().map(String::as_str));
    full.extend(["-o", DATA, "--delay", "-1", "--control", &control]);
    let command = format!("perf {}", full.join(" "));
    let _ = std::fs::remove_file(DATA);
    let stdout = File::create(RECORD_OUT).os_ctx(format!("creating {RECORD_OUT}"))?;
    let stderr = File::create(RECORD_ERR).os_ctx(format!("creating {RECORD_ERR}"))?;
    let mut child = perf_command(&full)
        .stdout(stdout)
        .stderr(stderr)
        .spawn()
        .with_context(|| format!("starting `{command}`"))?;

    // perf reads the control FIFO only once its events are open and the
    // synthesis is written; the command waits there until then.
    (&ctl)
        .write_all(b"enable\n")
        .os_ctx(format!("writing `enable` to {CTL}"))?;
    let started = Instant::now();
    let mut got = Vec::new();
    loop {
        if let Some(status) = child.try_wait().os_ctx("waiting for perf record")? {
            bail!(
                "`{command}` exited ({}) before enabling its events; its stderr:\n{}",
                describe(status),
                read_lossy(RECORD_ERR)
            );
        }
        if readable(&ack, Duration::from_millis(100))? {
            let mut buf = [0u8; 64];
            let n = ack.read(&mut buf).os_ctx(format!("reading {ACK}"))?;
            got.extend_from_slice(&buf[..n]);
            if got.contains(&b'\n') {
                break;
            }
        }
        if started.elapsed() > START_DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            bail!(
                "`{command}` did not acknowledge `enable` within {} s (got {:?}); its stderr:\n{}",
                START_DEADLINE.as_secs(),
                String::from_utf8_lossy(&got),
                read_lossy(RECORD_ERR)
            );
        }
    }
    // perf writes the ack with its C string terminator.
    if !matches!(got.as_slice(), b"ack\n" | b"ack\n\0") {
        let _ = child.kill();
        let _ = child.wait();
        bail!(
            "`{command}` answered `enable` with {:?} instead of \"ack\\n\"; its stderr:\n{}",
            String::from_utf8_lossy(&got),
            read_lossy(RECORD_ERR)
        );
    }
    log(format!(
        "perf record enabled after {} ms: {command}",
        started.elapsed().as_millis()
    ))?;
    *slot = Some(Running {
        child,
        command,
        _ctl: ctl,
        _ack: ack,
    });
    Ok(())
}

fn readable(f: &File, timeout: Duration) -> Result<bool> {
    use std::os::fd::AsRawFd;
    let mut pfd = libc::pollfd {
        fd: f.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    let n = unsafe { libc::poll(&mut pfd, 1, timeout.as_millis() as libc::c_int) };
    if n < 0 {
        let e = crate::sys::last_os_error();
        if e.kind() == std::io::ErrorKind::Interrupted {
            return Ok(false);
        }
        return Err(e).os_ctx("poll on the perf ack FIFO");
    }
    Ok(n > 0 && pfd.revents & libc::POLLIN != 0)
}

fn describe(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(c), _) => format!("exit status {c}"),
        (None, Some(s)) => format!("killed by signal {s}"),
        _ => status.to_string(),
    }
}

/// Waits for `child` until `deadline` (kills it after), checking every
/// `every` and calling `between` with its pid between checks.
fn wait_until(
    child: &mut Child,
    deadline: Duration,
    every: Duration,
    mut between: impl FnMut(libc::pid_t),
) -> Result<Option<ExitStatus>> {
    let pid = child.id() as libc::pid_t;
    let started = Instant::now();
    loop {
        if let Some(s) = child.try_wait().os_ctx("waiting for perf")? {
            return Ok(Some(s));
        }
        if started.elapsed() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Ok(None);
        }
        between(pid);
        std::thread::sleep(every);
    }
}

/// Sends SIGINT to each thread of the `perf record` `pid` (already sent
/// SIGINT) but the main one; its waiter calls this every 10 ms. perf
/// record's side-band thread (tools/perf/util/sideband_evlist.c, the one
/// that reads the BPF_EVENT side band for perf's own BPF program info)
/// loops on `evlist__poll(evlist, 1000)` and only looks at its `done` flag
/// between polls, while the main thread, on its way out, sets that flag and
/// joins it: up to a second idle per stop (980 ms of the step's 1.39 s
/// measured on 6.12). A signal ends the poll early (EINTR); perf's handler
/// for SIGINT only sets the flags the first SIGINT already set. Threads the
/// signal reaches before the flag is set simply poll again. A perf without
/// the thread has no other thread to signal.
fn nudge_side_band(pid: libc::pid_t) {
    // Not reaped yet (the waiter checked), so the pid and its tids are
    // still perf's.
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return;
    };
    for tid in tasks
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<libc::pid_t>().ok())
        .filter(|&tid| tid != pid)
    {
        // SAFETY: tgkill on a thread of our own unreaped child; a thread
        // that has exited meanwhile makes it fail (ESRCH).
        unsafe { libc::syscall(libc::SYS_tgkill, pid, tid, libc::SIGINT) };
    }
}

/// `perf-record-stop`: stops perf record, runs `perf report -D --header` on
/// its file and sends the text as `PerfScript`.
pub fn stop() -> Result<()> {
    let (command, record_stderr) = stop_running()?;
    let (report, report_stderr) = run_report()?;
    send_data()?;
    let text = std::fs::read(REPORT_OUT).os_ctx(format!("reading {REPORT_OUT}"))?;
    if text.len() > MAX_TEXT {
        bail!(
            "`{report}` printed {} bytes, more than one message carries ({MAX_TEXT}); \
             record fewer events (e.g. `--synth=no`, `-e dummy`)",
            text.len()
        );
    }
    send(&Message::PerfScript {
        command: format!("{command}; {report}"),
        text: String::from_utf8_lossy(&text).into_owned(),
        stderr: format!("--- perf record ---\n{record_stderr}--- perf report ---\n{report_stderr}"),
    })
}

/// Stops the `perf record` [`start`] started; returns its command line
/// and stderr once it stopped cleanly and its file is written.
pub fn stop_running() -> Result<(String, String)> {
    let running = PERF_RECORD
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take()
        .ok_or_else(|| anyhow!("perf-record-stop without a running perf record"))?;
    let Running {
        mut child, command, ..
    } = running;
    let stderr = stop_recording(&mut child, &command)?;
    Ok((command, stderr))
}

/// SIGINT to the running `perf record` (`command`), waited for; returns
/// its stderr once it stopped cleanly.
fn stop_recording(child: &mut Child, command: &str) -> Result<String> {
    let pid = child.id() as libc::pid_t;
    // SAFETY: signalling our own child, which has not been reaped yet.
    if unsafe { libc::kill(pid, libc::SIGINT) } != 0 {
        return Err(crate::sys::last_os_error()).os_ctx(format!("SIGINT to perf record {pid}"));
    }
    let started = Instant::now();
    let status = wait_until(
        child,
        STOP_DEADLINE,
        Duration::from_millis(10),
        nudge_side_band,
    )?
    .ok_or_else(|| {
        anyhow!(
            "`{command}` did not exit within {} s of SIGINT (killed); its stderr:\n{}",
            STOP_DEADLINE.as_secs(),
            read_lossy(RECORD_ERR)
        )
    })?;
    // perf record re-raises the signal that stopped it, so a clean stop is
    // either status 0 or death by SIGINT.
    let clean = status.success() || status.signal() == Some(libc::SIGINT);
    if !clean {
        bail!(
            "`{command}` ended with {} after SIGINT; its stderr:\n{}",
            describe(status),
            read_lossy(RECORD_ERR)
        );
    }
    let record_stderr = read_lossy(RECORD_ERR);
    log(format!(
        "perf record stopped after {} ms ({})",
        started.elapsed().as_millis(),
        describe(status)
    ))?;
    Ok(record_stderr)
}

/// `perf report -D --header` on the recorded file, waited for; returns its
/// command line and its stderr once it succeeded.
fn run_report() -> Result<(String, String)> {
    run_on_data(
        &["report", "-D", "--header", "-i", DATA],
        REPORT_OUT,
        REPORT_ERR,
    )
}

/// `perf script <fields…>` on the recorded file, waited for; returns its
/// command line, its output and its stderr once it succeeded.
pub fn script(args: &[&str]) -> Result<(String, Vec<u8>, String)> {
    let mut full = vec!["script", "-i", DATA];
    full.extend_from_slice(args);
    let (command, stderr) = run_on_data(&full, REPORT_OUT, REPORT_ERR)?;
    let out = std::fs::read(REPORT_OUT).os_ctx(format!("reading {REPORT_OUT}"))?;
    Ok((command, out, stderr))
}

/// `perf <args>` with its stdout in `out` and stderr in `err`, waited for
/// (killed after [`REPORT_DEADLINE`]); returns its command line and its
/// stderr once it succeeded.
fn run_on_data(args: &[&str], out: &str, err: &str) -> Result<(String, String)> {
    let report = format!("perf {}", args.join(" "));
    let stdout = File::create(out).os_ctx(format!("creating {out}"))?;
    let stderr = File::create(err).os_ctx(format!("creating {err}"))?;
    let mut child = perf_command(args)
        .stdout(stdout)
        .stderr(stderr)
        .spawn()
        .with_context(|| format!("starting `{report}`"))?;
    let status = wait_until(
        &mut child,
        REPORT_DEADLINE,
        Duration::from_millis(20),
        |_| {},
    )?
    .ok_or_else(|| {
        anyhow!(
            "`{report}` did not finish within {} s (killed); its stderr:\n{}",
            REPORT_DEADLINE.as_secs(),
            read_lossy(err)
        )
    })?;
    let report_stderr = read_lossy(err);
    if !status.success() {
        bail!(
            "`{report}` failed ({}); its stderr:\n{report_stderr}",
            describe(status)
        );
    }
    Ok((report, report_stderr))
}
