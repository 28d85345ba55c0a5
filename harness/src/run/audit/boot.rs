//! One build booted once for every reproducer: the stock environment of
//! `repro --prove` ([`crate::run::standalone::stock`]: busybox as `/init`,
//! the kernel's default limits, no kloop agent), whose script runs each
//! reproducer in turn and prints its exit status under its name.
//!
//! Each reproducer restores what it changes (the interpreter's reproducer
//! puts `bpf_jit_enable` back), so running them one after another in one
//! boot answers as separate boots would, at the price of one boot.

use std::path::{Path, PathBuf};

use kloop_path_io::PathIoExt;

use super::AuditError;
use crate::run::payload;
use crate::run::standalone::stock::{self, PlainBoot};
use crate::run::standalone::{ReproOutcome, Reproducer};
use crate::run::trial::{KernelUnderTest, TrialEnv};
use crate::scenario::Scenario;

/// The line before each reproducer's marks: `KLOOP-AUDIT-PROGRAM <name>`.
pub const PROGRAM_MARK: &str = "KLOOP-AUDIT-PROGRAM";

/// A reproducer ready to boot: its name and its single C file.
#[derive(Debug, Clone)]
pub struct Program {
    pub name: String,
    pub file: PathBuf,
}

impl Program {
    /// Where the guest finds it.
    pub fn guest_path(&self) -> String {
        format!("/usr/bin/kloop-repro-{}", self.name)
    }

    /// Writes `r`'s single file into `dir` (`<name>.c`).
    pub fn write(r: &Reproducer, dir: &Path) -> Result<Program, AuditError> {
        let file = dir.join(format!("{}.c", r.name));
        let text = r.single_file()?;
        kloop_kernels::write_atomically(&file, text.as_bytes()).at("writing", &file)?;
        Ok(Program {
            name: r.name.clone(),
            file,
        })
    }
}

/// The `/init` that runs every program in `programs`' order, each between
/// its own marks, with no limit raised.
pub fn init_script(programs: &[Program]) -> String {
    let bb = payload::GUEST_BUSYBOX;
    let mut s = format!(
        "#!{bb} sh\n\
         # kloop audit: every reproducer in one boot of a plain init (busybox,\n\
         # nothing else; no limit is raised).\n\
         bb={bb}\n\
         $bb mount -t proc proc /proc\n\
         $bb mount -t sysfs sysfs /sys\n\
         $bb mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null\n\
         $bb mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null\n\
         echo \"{env} release=$($bb uname -r) uid=$($bb id -u) memlock=$(ulimit -l)\"\n",
        env = stock::ENV_MARK,
    );
    for p in programs {
        s.push_str(&format!(
            "echo \"{PROGRAM_MARK} {name}\"\necho {start}\n{path}\necho \"{exit} $?\"\n",
            name = p.name,
            start = stock::START_MARK,
            path = p.guest_path(),
            exit = stock::EXIT_MARK,
        ));
    }
    s.push_str("$bb poweroff -f\n");
    s
}

/// The scenario that puts every program into the guest (built by the
/// trial's payload code, `gcc -static`). Its one step is never run: the
/// plain init runs the programs.
pub fn scenario(programs: &[Program], dir: &Path) -> Result<Scenario, AuditError> {
    let mut text =
        String::from("description = \"kloop audit: every reproducer\"\nsnapshot = false\n");
    for p in programs {
        text.push_str(&format!(
            "[[programs]]\nsource = {:?}\nguest = \"{}\"\n",
            p.file.display().to_string(),
            p.guest_path()
        ));
    }
    let first = programs
        .first()
        .map(Program::guest_path)
        .unwrap_or_default();
    text.push_str(&format!(
        "[[steps]]\nop = \"run-program\"\npath = \"{first}\"\ntimeout_ms = 120000\n"
    ));
    Scenario::parse("audit", dir, &text).map_err(|e| AuditError::Scenario {
        message: e.to_string(),
    })
}

/// Each program's console answer, by name: the lines from its
/// [`PROGRAM_MARK`] to the next one, read as the stock environment reads
/// one program's ([`stock::parse_console`]).
pub fn parse_console(text: &str) -> Vec<(String, stock::ConsoleAnswer)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for raw in text.lines() {
        let line = raw.trim_end_matches('\r');
        if let Some(i) = line.find(PROGRAM_MARK) {
            let name = line[i + PROGRAM_MARK.len()..].trim().to_string();
            out.push((name, String::new()));
        } else if let Some((_, seg)) = out.last_mut() {
            seg.push_str(line);
            seg.push('\n');
        }
    }
    out.into_iter()
        .map(|(name, seg)| (name, stock::parse_console(&seg)))
        .collect()
}

/// One boot's answers.
#[derive(Debug, Clone)]
pub struct BootAnswers {
    /// Each program's outcome, in `programs`' order.
    pub outcomes: Vec<ReproOutcome>,
    /// The guest's `uname -r`, when it said it.
    pub release: Option<String>,
    pub dir: PathBuf,
    pub secs: f64,
}

/// Boots `kernel` once with every program and reads each one's exit
/// status; a program the console has no status for has no answer (with
/// how the VM ended).
pub fn boot(
    env: &TrialEnv,
    kernel: &KernelUnderTest,
    programs: &[Program],
    dir: &Path,
) -> Result<BootAnswers, AuditError> {
    let started = std::time::Instant::now();
    let scenario = scenario(programs, &env.run_dir)?;
    let init = init_script(programs);
    let all_said = |text: &str| {
        let said = parse_console(text);
        programs
            .iter()
            .all(|p| said.iter().any(|(n, a)| *n == p.name && a.status.is_some()))
    };
    let booted = stock::boot_plain(env, kernel, &scenario, &init, dir, &all_said)?;
    let (outcomes, release) = match booted {
        PlainBoot::NotPrepared(headline) => (
            programs
                .iter()
                .map(|_| ReproOutcome::NoAnswer(headline.clone()))
                .collect(),
            None,
        ),
        PlainBoot::Ran { console, ended } => {
            let said = parse_console(&console);
            let release = stock::parse_console(&console).release;
            let outcomes = programs
                .iter()
                .map(|p| match said.iter().find(|(n, _)| *n == p.name) {
                    Some((_, a)) => stock::outcome(a, &ended),
                    None => {
                        ReproOutcome::NoAnswer(format!("{} never started: {ended}", p.guest_path()))
                    }
                })
                .collect();
            (outcomes, release)
        }
    };
    Ok(BootAnswers {
        outcomes,
        release,
        dir: dir.to_path_buf(),
        secs: started.elapsed().as_secs_f64(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn programs() -> Vec<Program> {
        [
            "interpreted-prog-ksymbol",
            "ksymbol-bpf-event-header-size-accumulates",
        ]
        .iter()
        .map(|n| Program {
            name: n.to_string(),
            file: PathBuf::from(format!("/x/{n}.c")),
        })
        .collect()
    }

    #[test]
    fn the_script_runs_every_program_between_its_marks() {
        let s = init_script(&programs());
        assert!(s.starts_with("#!/bin/busybox sh\n"));
        assert!(!s.contains("ulimit -l unlimited"));
        for p in programs() {
            assert!(s.contains(&format!(
                "{PROGRAM_MARK} {}\"\necho {}\n{}\necho \"{} $?\"",
                p.name,
                stock::START_MARK,
                p.guest_path(),
                stock::EXIT_MARK
            )));
        }
        assert!(s.ends_with("poweroff -f\n"));
    }

    #[test]
    fn the_console_is_split_by_program() {
        let console = "KLOOP-STOCK-ENV release=6.18.15+deb13-cloud-amd64 uid=0 memlock=8192\r\n\
            KLOOP-AUDIT-PROGRAM interpreted-prog-ksymbol\r\n\
            KLOOP-STOCK-START\r\n\
            KSYMBOL register BPF addr=0x1 len=0 name=\"\"\r\n\
            KLOOP-STOCK-EXIT 1\r\n\
            KLOOP-AUDIT-PROGRAM ksymbol-bpf-event-header-size-accumulates\r\n\
            KLOOP-STOCK-START\r\n\
            [    3.0] random: crng init done\r\n\
            KLOOP-STOCK-EXIT 0\r\n";
        let said = parse_console(console);
        assert_eq!(said.len(), 2);
        assert_eq!(said[0].0, "interpreted-prog-ksymbol");
        assert_eq!(said[0].1.status, Some(1));
        assert!(said[0].1.output.contains("len=0"));
        assert_eq!(said[1].1.status, Some(0));
        // A panic in the second program: it has no status, the first keeps its.
        let cut = "KLOOP-AUDIT-PROGRAM a\nKLOOP-STOCK-START\nKLOOP-STOCK-EXIT 77\n\
                   KLOOP-AUDIT-PROGRAM b\nKLOOP-STOCK-START\nKernel panic - not syncing\n";
        let said = parse_console(cut);
        assert_eq!(said[0].1.status, Some(77));
        assert_eq!(said[1].1.status, None);
    }
}
