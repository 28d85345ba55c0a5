//! `run-program`: a program shipped in the initramfs (a scenario's
//! `[[programs]]`, such as a stand-alone reproducer) run to its end, its
//! output and exit status sent as a `ProgramRun`. The judge decides what
//! the status means; the agent only reports it.

use std::io::Read;
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use kloop_protocol::{Message, MAX_PROGRAM_OUTPUT};

use crate::channel::send;

const STDOUT: &str = "/tmp/program.stdout";
const STDERR: &str = "/tmp/program.stderr";

pub fn run(path: &str, args: &[String], timeout_ms: u64) -> Result<()> {
    let started = Instant::now();
    let out = std::fs::File::create(STDOUT).with_context(|| format!("creating {STDOUT}"))?;
    let err = std::fs::File::create(STDERR).with_context(|| format!("creating {STDERR}"))?;
    let mut child = Command::new(path)
        .args(args)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        // No current_dir: with one, std cannot use posix_spawn and forks
        // through a path that opens an AF_UNIX socket pair, which a
        // tinyconfig kernel without CONFIG_UNIX refuses (EAFNOSUPPORT).
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .with_context(|| format!("starting {path}"))?;
    let deadline = started + Duration::from_millis(timeout_ms);
    let (status, timed_out) = loop {
        if let Some(status) = child.try_wait().context("waiting for the program")? {
            break (status, false);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            break (child.wait().context("reaping the killed program")?, true);
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut output = read_capped(STDOUT);
    let stderr = read_capped(STDERR);
    if !stderr.is_empty() {
        output.push_str("\n[stderr]\n");
        output.push_str(&stderr);
    }
    output.truncate(floor_char_boundary(&output, MAX_PROGRAM_OUTPUT));
    send(&Message::ProgramRun {
        path: path.to_string(),
        exit_code: status.code(),
        signal: status.signal(),
        timed_out,
        output,
        elapsed_ns: started.elapsed().as_nanos() as u64,
    })
}

fn read_capped(path: &str) -> String {
    let mut bytes = Vec::new();
    if let Ok(f) = std::fs::File::open(path) {
        let _ = f.take(MAX_PROGRAM_OUTPUT as u64).read_to_end(&mut bytes);
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

fn floor_char_boundary(s: &str, max: usize) -> usize {
    let mut end = max.min(s.len());
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    end
}
