//! The stock environment of a proof: the reproducer as the only program of
//! a plain initramfs, the way a kernel maintainer would run it, with no
//! kloop agent.
//!
//! The guest agent sets up the guest for its steps and the reproducer
//! inherits that (its limits among them), so a proof in kloop's guest
//! alone cannot show that the reproducer stands alone: on 5.10 the
//! kernel's default `RLIMIT_MEMLOCK` (64 KiB) refuses a program the agent's
//! child could load. Here `/init` is a busybox shell script ([`init_script`])
//! that mounts proc, sysfs, debugfs and tracefs, raises no limit, runs the
//! reproducer, prints its exit status on the console ([`EXIT_MARK`]) and
//! powers off; the host reads the status back from `console.log`
//! ([`parse_console`]). The kernel file, its boot and the reproducer's
//! build are the trial's ([`crate::run::trial::guest_image`]).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kloop_path_io::PathIoExt;
use kloop_qemu::{Console, Vm, VmConfig};

use super::{ReproOutcome, Reproducer, StandaloneError, GUEST_PATH};
use crate::run::initramfs::Initramfs;
use crate::run::payload;
use crate::run::trial::guest_image::prepare_guest;
use crate::run::trial::{KernelUnderTest, TrialEnv};

/// What `/init` prints about the environment before the reproducer:
/// `KLOOP-STOCK-ENV release=… uid=… memlock=…` (`ulimit -l`, KiB).
pub const ENV_MARK: &str = "KLOOP-STOCK-ENV";
/// The line `/init` prints just before the reproducer runs.
pub const START_MARK: &str = "KLOOP-STOCK-START";
/// The line `/init` prints after it: `KLOOP-STOCK-EXIT <status>`, the
/// shell's `$?` (128 + the signal's number when a signal killed it).
pub const EXIT_MARK: &str = "KLOOP-STOCK-EXIT";

/// How `/init` runs the reproducer: busybox's shell as PID 1, the
/// kernel's default limits untouched.
pub fn init_script() -> String {
    format!(
        "#!{bb} sh\n\
         # kloop's stock environment for a stand-alone reproducer: busybox as\n\
         # init, nothing else; no limit is raised.\n\
         bb={bb}\n\
         $bb mount -t proc proc /proc\n\
         $bb mount -t sysfs sysfs /sys\n\
         $bb mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null\n\
         $bb mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null\n\
         echo \"{ENV_MARK} release=$($bb uname -r) uid=$($bb id -u) memlock=$(ulimit -l)\"\n\
         echo {START_MARK}\n\
         {GUEST_PATH}\n\
         echo \"{EXIT_MARK} $?\"\n\
         $bb poweroff -f\n",
        bb = payload::GUEST_BUSYBOX,
    )
}

/// What the console says about one run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConsoleAnswer {
    /// The reproducer's exit status, when `/init` printed it.
    pub status: Option<i32>,
    /// What it printed (the lines between the start and the exit marks).
    pub output: String,
    /// The guest's `uname -r`.
    pub release: Option<String>,
    /// `ulimit -l` in `/init`: `64` (KiB) on 5.10, `unlimited`, …
    pub memlock: Option<String>,
    pub uid: Option<String>,
}

/// Reads [`ConsoleAnswer`] from a console log. Marks are looked for
/// anywhere in a line (the kernel's own lines may share one); the last
/// exit mark with a number wins.
pub fn parse_console(text: &str) -> ConsoleAnswer {
    let mut a = ConsoleAnswer::default();
    let mut output: Option<Vec<&str>> = None;
    for raw in text.lines() {
        let line = raw.trim_end_matches('\r');
        if let Some(rest) = after(line, ENV_MARK) {
            for word in rest.split_whitespace() {
                match word.split_once('=') {
                    Some(("release", v)) => a.release = Some(v.to_string()),
                    Some(("uid", v)) => a.uid = Some(v.to_string()),
                    Some(("memlock", v)) => a.memlock = Some(v.to_string()),
                    _ => {}
                }
            }
        } else if after(line, START_MARK).is_some() {
            output = Some(Vec::new());
        } else if let Some(rest) = after(line, EXIT_MARK) {
            if let Some(n) = rest
                .split_whitespace()
                .next()
                .and_then(|w| w.parse::<i32>().ok())
            {
                a.status = Some(n);
                a.output = output.take().unwrap_or_default().join("\n");
            }
        } else if let Some(out) = output.as_mut() {
            out.push(line);
        }
    }
    if a.status.is_none() {
        a.output = output.unwrap_or_default().join("\n");
    }
    a
}

fn after<'a>(line: &'a str, mark: &str) -> Option<&'a str> {
    line.find(mark).map(|i| &line[i + mark.len()..])
}

/// The outcome of a run from its console's answer; `ended` says how the
/// VM ended when no status was printed (`QEMU exited with code 0`, a
/// panic's lines, `no exit status within 360 s`).
pub fn outcome(answer: &ConsoleAnswer, ended: &str) -> ReproOutcome {
    let said = |what: &str| {
        format!(
            "{GUEST_PATH} {what} in the plain init; its output:\n{}",
            answer.output
        )
    };
    match answer.status {
        Some(0) => ReproOutcome::DoesNotReproduce,
        Some(1) => ReproOutcome::Reproduces(said("exited 1")),
        Some(77) => ReproOutcome::CannotRun(said("exited 77")),
        Some(n) if n > 128 => ReproOutcome::NoAnswer(said(&format!(
            "was killed by signal {}",
            kloop_qemu::signal_name(n - 128)
        ))),
        Some(n) => ReproOutcome::NoAnswer(said(&format!("exited {n}"))),
        None => ReproOutcome::NoAnswer(format!(
            "no exit status on the console: {ended}\n{}",
            answer.output
        )),
    }
}

/// One kernel's run in the stock environment.
#[derive(Debug, Clone)]
pub struct StockRun {
    pub outcome: ReproOutcome,
    pub answer: ConsoleAnswer,
    /// Its `console.log` (and `initramfs.cpio`, `qemu.stderr`) directory.
    pub dir: PathBuf,
}

/// The initramfs of the stock environment: busybox, `init` as `/init`,
/// and the programs built for the trial (`payload`).
pub(crate) fn stock_initramfs(
    env: &TrialEnv,
    arch: kloop_protocol::Arch,
    payload: &crate::run::payload::Payload,
    init: &str,
) -> Result<Initramfs, StandaloneError> {
    let (busybox, _) = env
        .busybox(arch)
        .map_err(|e| StandaloneError::Stock(format!("it needs busybox: {e}")))?;
    let mut i = Initramfs::skeleton();
    i.add_file("init", 0o755, init.as_bytes().to_vec());
    for p in [&busybox, payload] {
        for d in p.dirs() {
            i.add_dir(&d);
        }
        for f in &p.files {
            let bytes = std::fs::read(&f.host_path).at("reading", &f.host_path)?;
            i.add_file(&f.guest_path, f.mode, bytes);
        }
    }
    Ok(i)
}

/// How a plain-init boot ended: its console, and a line on how QEMU ended
/// (with the panic or the console's tail when no status was printed).
pub(crate) enum PlainBoot {
    /// The guest could not be prepared (the kernel could not be had, a
    /// program did not build): the trial's verdict headline.
    NotPrepared(String),
    Ran {
        console: String,
        ended: String,
    },
}

/// Boots `kernel` with `scenario`'s programs in a plain initramfs whose
/// `/init` is `init`, waits for QEMU to end (or the deadline, or an
/// interruption), and returns the console. `dir` gets the run's files.
/// `has_status` tells from the console whether `init` printed what it was
/// meant to (otherwise the console's tail is added to `ended`).
pub(crate) fn boot_plain(
    env: &TrialEnv,
    kernel: &KernelUnderTest,
    scenario: &crate::scenario::Scenario,
    init: &str,
    dir: &Path,
    has_status: &dyn Fn(&str) -> bool,
) -> Result<PlainBoot, StandaloneError> {
    // Another architecture's QEMU (TCG) and busybox.
    let env = match env.for_arch(kernel.arch()) {
        Ok(env) => env,
        Err(why) => return Ok(PlainBoot::NotPrepared(why)),
    };
    let env = &*env;
    let parts = match prepare_guest(env, kernel, scenario, dir) {
        Ok(p) => p,
        Err(v) => return Ok(PlainBoot::NotPrepared(v.headline())),
    };
    let initramfs = dir.join("initramfs.cpio");
    stock_initramfs(env, kernel.arch(), &parts.payload, init)?
        .write_file(&initramfs)
        .at("writing", &initramfs)?;
    // PID 1 is busybox's shell reading /init, started by the kernel as
    // `rdinit=/bin/busybox -- sh /init` rather than through /init's `#!`
    // line: kloop's own builds (tinyconfig) have no CONFIG_BINFMT_SCRIPT,
    // and there the kernel refuses a script as init ("Failed to execute
    // /init (error -8)", ENOEXEC) and panics.
    let mut cmdline = parts.vm.cmdline.clone();
    cmdline.push(format!("rdinit={}", payload::GUEST_BUSYBOX));
    cmdline.extend(["--", "sh", "/init"].map(String::from));
    let config = VmConfig {
        initramfs: Some(initramfs),
        data_channel: false,
        console: Console::File,
        cmdline,
        ..parts.vm
    };
    let total = config.deadlines.total;
    let mut vm =
        Vm::spawn(config).map_err(|e| StandaloneError::Stock(format!("starting QEMU: {e}")))?;
    let console = vm.console_path();
    let until = vm.started + total;
    let ended = loop {
        if let Some(status) = vm.try_wait() {
            break format!("QEMU {}", kloop_qemu::describe_exit(&status));
        }
        if crate::run::signals::interrupted() {
            vm.kill();
            break "interrupted: QEMU was killed".to_string();
        }
        if Instant::now() >= until {
            vm.kill();
            break format!(
                "no exit status within {} s; QEMU was killed",
                total.as_secs()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let text = String::from_utf8_lossy(&std::fs::read(&console).unwrap_or_default()).into_owned();
    let ended = match kloop_qemu::console_panic(&console) {
        Some(panic) => format!("the kernel panicked ({ended}):\n{panic}"),
        None if !has_status(&text) => format!(
            "{ended}; the console's last lines ({}):\n{}",
            console.display(),
            kloop_qemu::console_tail(&console, 15)
        ),
        None => ended,
    };
    Ok(PlainBoot::Ran {
        console: text,
        ended,
    })
}

/// Boots `kernel` with the reproducer `file` (the single C file, built
/// as the trial builds it) as the only program of a plain initramfs, and
/// reads its exit status from the console. `dir` gets the run's files.
pub fn run(
    env: &TrialEnv,
    kernel: &KernelUnderTest,
    r: &Reproducer,
    file: &Path,
    dir: &Path,
) -> Result<StockRun, StandaloneError> {
    let scenario = r
        .scenario(file, &env.run_dir)
        .map_err(|e| StandaloneError::Scenario {
            message: e.to_string(),
        })?;
    let has_status = |text: &str| parse_console(text).status.is_some();
    match boot_plain(env, kernel, &scenario, &init_script(), dir, &has_status)? {
        PlainBoot::NotPrepared(headline) => Ok(StockRun {
            outcome: ReproOutcome::NoAnswer(headline),
            answer: ConsoleAnswer::default(),
            dir: dir.to_path_buf(),
        }),
        PlainBoot::Ran { console, ended } => {
            let answer = parse_console(&console);
            Ok(StockRun {
                outcome: outcome(&answer, &ended),
                answer,
                dir: dir.to_path_buf(),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONSOLE_510: &str = "\x1bc\x1b[?7l\rSeaBIOS (version 1.16)\r\n\
        [    0.000000] Linux version 5.10.0-32-cloud-amd64\r\n\
        KLOOP-STOCK-ENV release=5.10.0-32-cloud-amd64 uid=0 memlock=64\r\n\
        KLOOP-STOCK-START\r\n\
        listener TID|TIME|CPU, cpu 1: KSYMBOL register addr=0x1 len=20 name=\"x\": header.size 128\r\n\
        BUG: 4 of 8 KSYMBOL/BPF_EVENT records have a header.size that is not …\r\n\
        KLOOP-STOCK-EXIT 1\r\n\
        [    3.100000] reboot: Power down\r\n";

    #[test]
    fn the_console_gives_the_status_the_output_and_the_limits() {
        let a = parse_console(CONSOLE_510);
        assert_eq!(a.status, Some(1));
        assert_eq!(a.release.as_deref(), Some("5.10.0-32-cloud-amd64"));
        assert_eq!(a.memlock.as_deref(), Some("64"));
        assert_eq!(a.uid.as_deref(), Some("0"));
        assert_eq!(a.output.lines().count(), 2);
        assert!(
            a.output.starts_with("listener TID|TIME|CPU"),
            "{}",
            a.output
        );
        let o = outcome(&a, "QEMU exited with code 0");
        assert!(
            matches!(&o, ReproOutcome::Reproduces(m) if m.lines().nth(1).is_some_and(|l| l.starts_with("listener"))),
            "{o:?}"
        );
    }

    #[test]
    fn each_status_is_an_outcome() {
        let with = |status: &str| {
            parse_console(&format!(
                "{START_MARK}\nCANNOT RUN: BPF_PROG_LOAD …: Operation not permitted\n{EXIT_MARK} {status}\n"
            ))
        };
        assert_eq!(outcome(&with("0"), ""), ReproOutcome::DoesNotReproduce);
        assert!(matches!(
            outcome(&with("77"), ""),
            ReproOutcome::CannotRun(m) if m.contains("exited 77") && m.contains("CANNOT RUN: BPF_PROG_LOAD")
        ));
        assert!(matches!(
            outcome(&with("139"), ""),
            ReproOutcome::NoAnswer(m) if m.contains("killed by signal") && m.contains("SEGV")
        ));
        assert!(matches!(
            outcome(&with("2"), ""),
            ReproOutcome::NoAnswer(m) if m.contains("exited 2")
        ));
    }

    #[test]
    fn no_status_is_no_answer_with_how_the_vm_ended() {
        // The kernel panicked while the reproducer ran: the exit line never came.
        let a = parse_console(&format!(
            "{START_MARK}\nlistener a\n[ 2.0] Kernel panic - not syncing: x\n"
        ));
        assert_eq!(a.status, None);
        assert!(a.output.contains("listener a"));
        assert!(matches!(
            outcome(&a, "the kernel panicked"),
            ReproOutcome::NoAnswer(m) if m.starts_with("no exit status on the console: the kernel panicked")
        ));
        // Nothing at all (the init never ran).
        let a = parse_console("SeaBIOS\r\n");
        assert_eq!(a, ConsoleAnswer::default());
        // A mark shares its line with a kernel message; a mark without a
        // number is not a status.
        let a = parse_console(&format!(
            "{START_MARK}\nx\n{EXIT_MARK} \n[ 1.0] random: crng init done{EXIT_MARK} 0\r\n"
        ));
        assert_eq!(a.status, Some(0));
        assert_eq!(a.output, "x");
    }

    #[test]
    fn the_init_raises_no_limit_and_prints_the_marks() {
        let s = init_script();
        assert!(s.starts_with("#!/bin/busybox sh\n"));
        assert!(!s.contains("ulimit -l unlimited") && !s.contains("prlimit"));
        for mark in [ENV_MARK, START_MARK, EXIT_MARK] {
            assert!(s.contains(mark), "{mark}");
        }
        assert!(s.contains(&format!("{GUEST_PATH}\necho \"{EXIT_MARK} $?\"")));
        assert!(s.ends_with("poweroff -f\n"));
    }
}
