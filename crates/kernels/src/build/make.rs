//! Running kbuild: argv only, output streamed to the log and to progress,
//! and a failure summarised by the compiler's own error lines.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use kloop_path_io::{PathIo, PathIoExt};

use super::{BuildError, BuildEvent};

/// One `make` invocation in `src` with the build directory `out`.
pub(super) struct Make<'a> {
    pub src: &'a Path,
    pub out: &'a Path,
    pub jobs: usize,
    pub log: &'a Path,
    /// The kernel's architecture: `ARCH=`, and for arm64 Debian's cross
    /// compiler (`CROSS_COMPILE=aarch64-linux-gnu-`).
    pub arch: kloop_protocol::Arch,
}

/// The cross compiler's prefix for `arch` (none for the host's x86-64).
pub(super) fn cross_prefix(arch: kloop_protocol::Arch) -> &'static str {
    match arch {
        kloop_protocol::Arch::X86_64 => "",
        kloop_protocol::Arch::Arm64 => "aarch64-linux-gnu-",
    }
}

impl Make<'_> {
    /// `make -C src O=out ARCH=x86_64 <targets>`; every output line goes to
    /// the log (appended) and to `progress`. `Err` carries the error lines.
    pub fn run(
        &self,
        targets: &[&str],
        progress: &mut dyn FnMut(BuildEvent),
    ) -> Result<(), BuildError> {
        let mut cmd = Command::new("make");
        cmd.arg("-C")
            .arg(self.src)
            .arg(format!("O={}", self.out.display()))
            .arg(format!("ARCH={}", self.arch.kbuild_arch()))
            .arg(format!("-j{}", self.jobs.max(1)))
            .args(targets)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .env("LC_ALL", "C")
            // Reproducible: the same inputs give the same image bytes.
            .env("KBUILD_BUILD_TIMESTAMP", "kloop")
            .env("KBUILD_BUILD_USER", "kloop")
            .env("KBUILD_BUILD_HOST", "kloop");
        let cross = cross_prefix(self.arch);
        if !cross.is_empty() {
            cmd.arg(format!("CROSS_COMPILE={cross}"));
        }
        if let Some(cc) = ccache() {
            cmd.arg(format!("CC={} {cross}gcc", cc.display()));
            // The build directory's path differs between slots; with it out
            // of the hash, a baseline and its patched copy share objects.
            cmd.env("CCACHE_BASEDIR", self.src)
                .env("CCACHE_NOHASHDIR", "1");
        }
        let mut log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log)
            .doing(format!("opening {}", self.log.display()))?;
        let _ = writeln!(log, "$ make {}", targets.join(" "));
        let mut child = cmd.spawn().map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                BuildError::ToolMissing {
                    tool: "make",
                    package: "make",
                }
            } else {
                PathIo::doing("running make", e).into()
            }
        })?;
        // stderr through a thread into a channel, so both streams reach the
        // log interleaved as they come and neither pipe fills up.
        let (tx, rx) = std::sync::mpsc::channel::<String>();
        let stderr = child.stderr.take().expect("piped");
        let tx_err = tx.clone();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx_err.send(line).is_err() {
                    break;
                }
            }
        });
        let stdout = child.stdout.take().expect("piped");
        let out_reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut errors = ErrorLines::default();
        for line in rx {
            let _ = writeln!(log, "{line}");
            errors.push(&line);
            progress(BuildEvent::Line(line));
        }
        let _ = reader.join();
        let _ = out_reader.join();
        let status = child.wait().doing("waiting for make")?;
        if status.success() {
            return Ok(());
        }
        Err(BuildError::Compile {
            target: targets.join(" "),
            status: status.to_string(),
            errors: errors.finish(),
            log: self.log.to_path_buf(),
        })
    }
}

pub(super) fn has_ccache() -> bool {
    ccache().is_some()
}

/// `ccache` when installed.
fn ccache() -> Option<PathBuf> {
    super::which("ccache")
}

/// The lines that say why a build failed: the compiler's `error:` lines
/// with the line before each (the `In function` context), the linker's
/// `undefined reference`, and make's `***` lines. At most 40.
#[derive(Default)]
struct ErrorLines {
    previous: Option<String>,
    kept: Vec<String>,
}

impl ErrorLines {
    const MAX: usize = 40;

    fn push(&mut self, line: &str) {
        let is_error = line.contains("error:")
            || line.contains("Error ")
            || line.contains("undefined reference")
            || line.contains("***");
        if is_error && self.kept.len() < Self::MAX {
            if let Some(prev) = self.previous.take() {
                if prev.contains("In function") || prev.contains("In file included") {
                    self.kept.push(prev);
                }
            }
            self.kept.push(line.to_string());
        }
        self.previous = Some(line.to_string());
    }

    fn finish(self) -> Vec<String> {
        self.kept
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_lines_keep_the_compiler_errors_and_their_function() {
        let mut e = ErrorLines::default();
        for l in [
            "  CC      kernel/events/core.o",
            "../kernel/events/core.c: In function 'perf_event_ksymbol':",
            "../kernel/events/core.c:9421:9: error: 'foo' undeclared (first use in this function)",
            "make[4]: *** [../scripts/Makefile.build:229: kernel/events/core.o] Error 1",
            "  CC      kernel/bpf/core.o",
        ] {
            e.push(l);
        }
        let kept = e.finish();
        assert_eq!(kept.len(), 3, "{kept:?}");
        assert!(kept[0].contains("In function"));
        assert!(kept[1].contains("error: 'foo'"));
    }
}
