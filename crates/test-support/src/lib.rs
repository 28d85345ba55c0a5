//! Test support shared by the tests that drive kloop as a process
//! (`harness/tests/faults.rs`, `xtask/tests/*.rs`): the workspace they run
//! in, running the binary, and what `/proc` says about the QEMU processes a
//! run started and left.

use std::path::{Path, PathBuf};

/// The workspace's root (this crate sits at `crates/test-support`): where
/// the binaries under test run, as a user runs them.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("crates/test-support sits two levels below the workspace root")
        .to_path_buf()
}

/// One process as `/proc/<pid>/stat` and `cmdline` describe it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proc {
    pub pid: i32,
    pub ppid: i32,
    /// The state letter (`R`, `S`, `Z`, …).
    pub state: char,
    /// The arguments; empty for a zombie or a kernel thread.
    pub cmdline: Vec<String>,
}

/// Process `pid`, or `None` once it is gone.
pub fn read_proc(pid: i32) -> Option<Proc> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "pid (comm) S ppid ...": comm may hold spaces and parentheses.
    let rest = &stat[stat.rfind(')')? + 2..];
    let mut f = rest.split(' ');
    let state = f.next()?.chars().next()?;
    let ppid = f.next()?.parse().ok()?;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let cmdline = cmdline
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    Some(Proc {
        pid,
        ppid,
        state,
        cmdline,
    })
}

/// Whether process `pid` still exists (a zombie does).
pub fn alive(pid: i32) -> bool {
    read_proc(pid).is_some()
}

/// Every QEMU process (`qemu-system-*`), zombies included: a zombie has
/// no command line left, its `comm` says what it was.
pub fn qemu_processes() -> Vec<Proc> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(read_proc)
        .filter(|p| {
            p.cmdline.first().is_some_and(|a| a.contains("qemu-system"))
                || (p.state == 'Z'
                    && std::fs::read_to_string(format!("/proc/{}/comm", p.pid))
                        .is_ok_and(|c| c.starts_with("qemu-system")))
        })
        .collect()
}

/// QEMU processes whose parent is `parent`, zombies included.
pub fn qemu_children(parent: i32) -> Vec<Proc> {
    qemu_processes()
        .into_iter()
        .filter(|p| p.ppid == parent)
        .collect()
}

/// QEMU guests (not `qemu --version` probes) whose parent is `parent`.
pub fn qemu_guests(parent: i32) -> Vec<Proc> {
    qemu_children(parent)
        .into_iter()
        .filter(|p| p.cmdline.iter().any(|a| a == "-kernel"))
        .collect()
}

/// The private socket directory (`kloop-vm-*`) in a QEMU command line.
pub fn socket_dir(cmdline: &[String]) -> Option<PathBuf> {
    let at = cmdline.iter().position(|a| a == "-qmp")?;
    let spec = cmdline.get(at + 1)?.strip_prefix("unix:")?;
    let sock = spec.split(",server").next()?;
    Path::new(sock).parent().map(Path::to_path_buf)
}

/// Runs `binary` (a test's `CARGO_BIN_EXE_xtask`) in `root` with plain
/// progress lines; its exit code and stdout then stderr, echoed to the
/// test's stderr so a failing assertion shows what the command said.
pub fn run_plain(binary: &str, root: &std::path::Path, args: &[&str]) -> (i32, String) {
    let out = std::process::Command::new(binary)
        .args(args)
        .current_dir(root)
        .env("KLOOP_PROGRESS", "plain")
        .output()
        .expect("running the binary under test");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    #[allow(clippy::print_stderr)] // test support: the test's own output
    {
        eprintln!("$ {binary} {}\n{text}", args.join(" "));
    }
    (out.status.code().unwrap_or(-1), text)
}

/// The seeded moments of the kill tests (xorshift), so a failing run can
/// be replayed: `KLOOP_KILL_SEED`, else one from the clock.
pub struct KillMoments {
    pub seed: u64,
    state: u64,
}

impl KillMoments {
    /// From `KLOOP_KILL_SEED` when set, else from the clock.
    pub fn from_env() -> KillMoments {
        let seed = std::env::var("KLOOP_KILL_SEED")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(1, |d| d.as_nanos() as u64)
                    | 1
            });
        KillMoments { seed, state: seed }
    }

    /// The next moment into a run expected to take `expected`: a draw in
    /// [0, 1) of it, in steps of a thousandth.
    pub fn next(&mut self, expected: std::time::Duration) -> std::time::Duration {
        self.state ^= self.state << 13;
        self.state ^= self.state >> 7;
        self.state ^= self.state << 17;
        expected.mul_f64((self.state % 1000) as f64 / 1000.0)
    }
}

/// Starts `cmd` and SIGKILLs it `after` into its run; `false` when it
/// ended on its own before, so there was nothing to kill.
pub fn kill_after(cmd: &mut std::process::Command, after: std::time::Duration) -> bool {
    let mut child = cmd.spawn().expect("starting the command to kill");
    let started = std::time::Instant::now();
    while started.elapsed() < after {
        if child.try_wait().unwrap().is_some() {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    true
}

/// The last `kloop:` status line of a killed run's stderr, in `err`.
pub fn last_status(err: &std::path::Path) -> Option<String> {
    let text = std::fs::read_to_string(err).unwrap_or_default();
    text.lines()
        .rev()
        .find(|l| l.starts_with("kloop:"))
        .map(str::to_string)
}

/// The environment variable that makes a root-only test fail instead of
/// skip when not root: `.ci/run` sets it (CI runs as root), so a CI whose
/// root-only tests did not run cannot pass.
pub const ROOT_TESTS_ENV: &str = "KLOOP_ROOT_TESTS";

/// Whether this process runs as root (effective uid 0, from
/// `/proc/self/status`).
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|ids| ids.split_whitespace().nth(1).map(|e| e == "0"))
        })
        .unwrap_or(false)
}

/// What a root-only test does here: `Ok(None)` run it (root);
/// `Ok(Some(reason))` skip it, reported as ignored with the reason
/// (`needs root: WHY`); `Err(message)` fail, when not root but
/// `KLOOP_ROOT_TESTS=require` says the caller needs it run.
pub fn root_only(why: &str) -> Result<Option<String>, String> {
    root_only_as(
        is_root(),
        std::env::var(ROOT_TESTS_ENV).ok().as_deref(),
        why,
    )
}

fn root_only_as(root: bool, env: Option<&str>, why: &str) -> Result<Option<String>, String> {
    match (root, env) {
        (true, _) => Ok(None),
        (false, Some("require")) => Err(format!(
            "needs root ({why}), and {ROOT_TESTS_ENV}=require says it must run: run as root"
        )),
        (false, _) => Ok(Some(format!(
            "needs root: {why}; {ROOT_TESTS_ENV}=require makes this a failure"
        ))),
    }
}

/// Whether the raw channel bytes (a trial's `data.bin`, or what a test
/// read from the channel) hold the agent's complete hello frame.
pub fn said_hello(data: &[u8]) -> bool {
    use kloop_protocol::{FrameDecoder, FrameKind, Message};
    let mut d = FrameDecoder::new();
    d.push(data);
    while let Ok(Some(f)) = d.next_frame() {
        if f.kind == FrameKind::Message
            && matches!(
                serde_json::from_slice(&f.payload),
                Ok(Message::Hello { .. })
            )
        {
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_root_only_test_runs_as_root_and_skips_or_fails_otherwise() {
        assert_eq!(root_only_as(true, Some("require"), "x"), Ok(None));
        assert_eq!(root_only_as(true, None, "x"), Ok(None));
        let skip = root_only_as(false, None, "mounts a tmpfs")
            .unwrap()
            .unwrap();
        assert!(skip.starts_with("needs root: mounts a tmpfs"), "{skip}");
        let fail = root_only_as(false, Some("require"), "mounts a tmpfs").unwrap_err();
        assert!(fail.contains("KLOOP_ROOT_TESTS=require"), "{fail}");
    }

    #[test]
    fn reads_this_process_and_its_parent() {
        let me = std::process::id() as i32;
        let p = read_proc(me).expect("this process is in /proc");
        assert_eq!(p.pid, me);
        assert!(p.ppid > 0);
        assert!(!p.cmdline.is_empty());
        assert!(alive(me));
        assert!(!alive(i32::MAX));
    }

    #[test]
    fn finds_the_socket_directory_of_a_qemu_command_line() {
        let args: Vec<String> = [
            "qemu-system-x86_64",
            "-qmp",
            "unix:/tmp/kloop-vm-x/qmp.sock,server=on,wait=off",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(socket_dir(&args), Some(PathBuf::from("/tmp/kloop-vm-x")));
        assert_eq!(socket_dir(&args[..1]), None);
    }
}
