//! How a guest session ended, as a verdict: interrupted, panicked, timed
//! out, QEMU gone, a protocol error, the agent's own failure. Only a
//! session that ended with the agent's `Done` goes on to be judged.

use std::path::{Path, PathBuf};

use kloop_protocol::Message;
use kloop_qemu::{GuestSession, SessionEnd};

use super::{FailureCause, Verdict};

/// The verdict of a session that did not end with `Done` (or that the user
/// interrupted); `None` when the evidence is to be judged.
pub(super) fn session_verdict(session: &GuestSession, artefacts: &Path) -> Option<Verdict> {
    let e = Ending {
        session,
        artefacts,
        console: artefacts.join("console.log"),
    };
    let end = session.end.clone().unwrap_or(SessionEnd::Infrastructure(
        "session ended without a reason".into(),
    ));
    if let Some(v) = e.interrupted(&end) {
        return Some(v);
    }
    if let Some(v) = e.kernel_died(&end) {
        return Some(v);
    }
    match end {
        SessionEnd::Done => None,
        SessionEnd::AgentError(m) => {
            Some(Verdict::failed(
                FailureCause::AgentError,
                format!(
                "the guest agent failed: {m}\n{}\n{}",
                last_report(&session.messages),
                e.tail()
            )))
        }
        SessionEnd::BootTimeout(d) => {
            Some(Verdict::Timeout(format!(
                "boot timeout: the guest agent did not say hello within {} s{}\n{}",
                d.as_secs_f64(),
                e.ran(),
                e.tail()
            )))
        }
        SessionEnd::Silent(d) => {
            Some(Verdict::Timeout(format!(
                "the guest agent went silent (no frame, not even a heartbeat, for {} s); VM killed{}\n{}\n{}",
                d.as_secs_f64(),
                e.ran(),
                last_report(&session.messages),
                e.tail()
            )))
        }
        SessionEnd::TotalTimeout(d) => {
            Some(Verdict::Timeout(format!(
                "the trial exceeded its {} s deadline; VM killed{}\n{}\n{}",
                d.as_secs_f64(),
                e.ran(),
                last_report(&session.messages),
                e.tail()
            )))
        }
        SessionEnd::QemuExited(status) => Some(e.qemu_exited(&status)),
        SessionEnd::Protocol(m) => {
            Some(Verdict::Infrastructure(format!(
                "data channel protocol error: {m}\nraw channel bytes: {} (stream offsets count from its first byte)\n{}",
                artefacts.join("data.bin").display(),
                last_report(&session.messages),
            )))
        }
        // A failed restore boots cold before any verdict; this only shows
        // if that path is bypassed.
        SessionEnd::RestoreFailed(m) => Some(Verdict::Infrastructure(format!(
            "restoring a saved VM failed: {m}"
        ))),
        SessionEnd::Infrastructure(m) => {
            Some(Verdict::Infrastructure(format!("{m}\n{}", e.tail())))
        }
        SessionEnd::Interrupted => {
            Some(Verdict::Interrupted("interrupted by signal; VM killed".into()))
        }
    }
}

/// A session that did not end with `Done`, as its verdicts quote it: the
/// session, its artefacts and its console.
struct Ending<'a> {
    session: &'a GuestSession,
    artefacts: &'a Path,
    console: PathBuf,
}

impl Ending<'_> {
    /// The console's last lines, and where the whole of it is.
    fn tail(&self) -> String {
        format!(
            "last 30 console lines ({}):\n{}",
            self.console.display(),
            kloop_qemu::console_tail(&self.console, 30)
        )
    }

    /// For a deadline: how much QEMU ran while the host waited.
    fn ran(&self) -> String {
        let waited = self.session.wall.as_secs_f64();
        match self.session.qemu_cpu_at_end {
        Some(cpu) => format!(
            "; QEMU ran {cpu:.1} CPU-second(s) in the {waited:.1} s (a guest a loaded host starves runs little of it, a hung guest that spins runs most of it)"
        ),
        None => String::new(),
    }
    }

    /// Whatever else happened, a trial the user stopped is interrupted (QEMU
    /// may have died of the same signal, e.g. a SIGTERM to the whole cgroup).
    fn interrupted(&self, end: &SessionEnd) -> Option<Verdict> {
        if *end == SessionEnd::Done || !crate::run::signals::interrupted() {
            return None;
        }
        let what = match end {
            SessionEnd::Interrupted => "VM killed".to_string(),
            SessionEnd::QemuExited(s) => format!("QEMU {}", kloop_qemu::describe_exit(s)),
            _ => "VM stopped".to_string(),
        };
        Some(Verdict::Interrupted(format!(
            "interrupted by SIGINT/SIGTERM during {}; {what}; partial artefacts in {}",
            if self.session.hello_at.is_none() {
                "boot"
            } else {
                "the trial"
            },
            self.artefacts.display()
        )))
    }

    /// The guest kernel's death, which explains any other ending: a panic
    /// on the console (PID 1's death is the agent's crash), or an oops
    /// before QEMU ended by itself.
    fn kernel_died(&self, end: &SessionEnd) -> Option<Verdict> {
        let console = &self.console;
        // A panic explains any other ending, so look for it first.
        if let Some(panic) = kloop_qemu::console_panic(console) {
            if *end != SessionEnd::Done {
                if let Some(line) = panic.lines().find(|l| l.contains("Attempted to kill init")) {
                    return Some(agent_crashed(line.trim(), &self.session.messages, console));
                }
                return Some(Verdict::Panic(format!(
                    "guest kernel panicked:\n{panic}\nconsole: {}",
                    console.display()
                )));
            }
        }
        // Without a panic line, an oops before QEMU ended by itself is the
        // kernel's death too: it restarted (oops=panic panic=-1) before the
        // panic line reached the console, and QEMU (-no-reboot) stopped.
        if let SessionEnd::QemuExited(status) = end {
            if std::os::unix::process::ExitStatusExt::signal(status).is_none() {
                if let Some(oops) = kloop_qemu::console_oops(console) {
                    return Some(Verdict::Panic(format!(
                        "guest kernel oopsed; it restarted (oops=panic panic=-1) before its panic \
                         line reached the console, and QEMU (-no-reboot) {}:\n{oops}\nconsole: {}",
                        kloop_qemu::describe_exit(status),
                        console.display()
                    )));
                }
            }
        }
        None
    }

    /// QEMU ended before the agent finished: what QEMU said, whether a
    /// signal from outside kloop killed it, and a frame cut short.
    fn qemu_exited(&self, status: &std::process::ExitStatus) -> Verdict {
        let session = self.session;
        let stderr =
            std::fs::read_to_string(self.artefacts.join("qemu.stderr")).unwrap_or_default();
        let qemu_said = if stderr.trim().is_empty() {
            String::new()
        } else {
            format!("\nQEMU said: {}", stderr.trim())
        };
        let why = if std::os::unix::process::ExitStatusExt::signal(status).is_some() {
            "\nkloop did not send that signal: something outside it did (the OOM killer, \
             see `dmesg`; a CI job timeout; a user). Not a finding about the kernel: rerun the trial."
        } else {
            ""
        };
        let trailing = match session.trailing {
            Some((offset, len)) => format!(
                "\nthe data channel ended inside a frame: {len} byte(s) from stream offset {offset} never completed"
            ),
            None => String::new(),
        };
        Verdict::Infrastructure(format!(
            "QEMU {} before the guest agent finished{}{why}{qemu_said}{trailing}\n{}\n{}",
            kloop_qemu::describe_exit(status),
            if session.hello_at.is_none() {
                " (no hello: the guest crashed or never started the agent)"
            } else {
                ""
            },
            last_report(&session.messages),
            self.tail()
        ))
    }
}

/// PID 1 died: the kernel panics "Attempted to kill init". That is the
/// agent crashing (abort, a fatal signal, an exit), not a kernel finding.
pub(super) fn agent_crashed(line: &str, messages: &[Message], console: &Path) -> Verdict {
    let how = init_exit_code(line)
        .map(|code| {
            if code & 0x7f != 0 {
                format!(
                    "killed by {}",
                    kloop_qemu::signal_name((code & 0x7f) as i32)
                )
            } else {
                format!("exited with status {}", (code >> 8) & 0xff)
            }
        })
        .unwrap_or_else(|| "died".into());
    let text = std::fs::read(console).unwrap_or_default();
    let text = String::from_utf8_lossy(&text);
    let own: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("kloop-guest:"))
        .map(str::trim)
        .collect();
    let own = if own.is_empty() {
        "(none)".to_string()
    } else {
        own[own.len().saturating_sub(5)..].join("\n  ")
    };
    Verdict::failed(
        FailureCause::AgentCrash,
        format!(
        "the guest agent crashed: PID 1 {how} and the kernel stopped with `{line}`\n\
         a kloop agent bug, not a finding about the kernel; its last report and console output say where it was:\n\
         {}\nagent output on the console:\n  {own}\nconsole: {}",
        last_report(messages),
        console.display()
    ))
}

/// `exitcode=0x00000006` in the "Attempted to kill init" panic line.
pub(super) fn init_exit_code(line: &str) -> Option<u32> {
    let hex = line.split("exitcode=0x").nth(1)?;
    let hex: String = hex.chars().take_while(char::is_ascii_hexdigit).collect();
    u32::from_str_radix(&hex, 16).ok()
}

/// The agent's last step and last log line, for messages about a failure.
pub(super) fn last_report(messages: &[Message]) -> String {
    let mut step = None;
    let mut done = false;
    let mut logs: Vec<&str> = Vec::new();
    for m in messages {
        match m {
            Message::StepStart { index, what } => {
                step = Some((*index, what.as_str()));
                done = false;
            }
            Message::StepDone { index, .. } if step.is_some_and(|(i, _)| i == *index) => {
                done = true
            }
            Message::Log { text } => logs.push(text),
            _ => {}
        }
    }
    let step = match step {
        Some((i, what)) => format!(
            "step {i} {what} {}",
            if done {
                "finished"
            } else {
                "started, not finished"
            }
        ),
        None => "no step started (the agent was still setting up)".to_string(),
    };
    let short = |l: &str| {
        const MAX: usize = 300;
        if l.len() > MAX {
            let mut end = MAX;
            while !l.is_char_boundary(end) {
                end -= 1;
            }
            format!("{}…", &l[..end])
        } else {
            l.to_string()
        }
    };
    let logs = if logs.is_empty() {
        "(none)".to_string()
    } else {
        logs[logs.len().saturating_sub(3)..]
            .iter()
            .map(|l| short(l))
            .collect::<Vec<_>>()
            .join(" | ")
    };
    format!("agent's last report: {step}\nagent's last logs: {logs}")
}
