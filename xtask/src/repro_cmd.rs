//! `repro RUN/TRIAL`: a reproducer directory for one trial;
//! `repro --standalone ID [--prove]`: a known bug's stand-alone C
//! reproducer, and its proof in the guest on each kernel.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use kloop::report::repro;
use kloop::run::suite::EnvOptions;
use kloop::session::repro::{Event, ProveOptions, Standalone};

use crate::flags::*;
use crate::shared::*;

impl Run for ReproArgs {
    fn run(self) -> Result<ExitCode> {
        repro(self)
    }
}

fn repro(a: ReproArgs) -> Result<ExitCode> {
    match (&a.trial, &a.standalone) {
        (_, Some(id)) => standalone_repro(&a, id),
        (Some(trial), None) => trial_repro(trial, a.out.clone()),
        (None, None) => unreachable!("clap requires a trial or --standalone"),
    }
}

fn trial_repro(trial: &str, out: Option<PathBuf>) -> Result<ExitCode> {
    let r = kloop::session::repro::trial(&layout(), trial, out.as_deref())?;
    let (dir, written) = (&r.trial, &r.written);
    println!(
        "kloop: reproducer of {} in {}: {}",
        dir.display(),
        written.dir.display(),
        written.files.join(", ")
    );
    println!(
        "kloop: run it with {}/run.sh (needs only the QEMU it names), then ./show-records.py data.bin; report.txt is the text for a mailing list",
        written.dir.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// Writes the single C file; with --prove, runs it on every kernel.
fn standalone_repro(a: &ReproArgs, id: &str) -> Result<ExitCode> {
    let layout = layout();
    let s = kloop::session::repro::standalone(&layout, id, a.out.as_deref())?;
    let (r, out) = (&s.reproducer, &s.file);
    println!(
        "kloop: stand-alone reproducer of {} in {}",
        r.issues
            .iter()
            .map(|i| i.id.as_str())
            .collect::<Vec<_>>()
            .join(", "),
        out.display()
    );
    println!(
        "kloop: build it with `gcc -static -O2 -Wall -o {0} {1}`, run it as root: exit 0 no bug, 1 bug, 77 cannot run here",
        r.name,
        out.display()
    );
    if !a.prove {
        return Ok(ExitCode::SUCCESS);
    }
    prove(&layout, a, &s)
}

/// Runs the reproducer on each kernel, in kloop's guest and as the only
/// program of a plain initramfs, and prints the answers.
fn prove(layout: &kloop::workspace::Layout, a: &ReproArgs, s: &Standalone) -> Result<ExitCode> {
    let opts = ProveOptions {
        kernels: a.kernels.clone(),
        arch: a.arch.one("repro --prove")?,
        env: EnvOptions {
            accel: a.accel,
            fetch: a.fetch.options(),
            ..EnvOptions::default()
        },
    };
    let mut build =
        |req: &kloop_kernels::build::BuildRequest, what: &str| build_kernel(req, what).ok();
    let Some(proven) = kloop::session::repro::prove(layout, &opts, s, &mut build, &print_event)?
    else {
        return Ok(ExitCode::from(EXIT_BUILD));
    };
    let run = &proven.run;
    let stock: Vec<_> = run.stock.iter().map(|s| s.outcome.clone()).collect();
    print!("\n{}", repro::proof_table(&run.proof, &run.guest, &stock));
    let all_as_expected = run.proof.as_expected;
    println!(
        "kloop: {} in {:.0} s; trials in {}",
        if all_as_expected {
            "the reproducer answers as the ledger and the fix say on every kernel, in kloop's guest and as the only program of a plain init"
        } else {
            "the reproducer does NOT answer as expected on every kernel (see above)"
        },
        proven.secs,
        proven.run_dir.display()
    );
    Ok(exit_code(all_as_expected))
}

/// What a proof says while it runs, as lines on stdout.
fn print_event(e: Event<'_>) {
    match e {
        Event::Built(binary) => println!("kloop: built {}", binary.display()),
        Event::Accel(accel) => println!("kloop: accelerator: {accel}"),
        Event::Trial(r) => println!("{}", kloop::report::trial_line(r)),
        Event::Stock(k, s) => println!(
            "kloop: {} in the plain init: {}{} ({})",
            k.label,
            s.outcome.label(),
            s.answer
                .status
                .map_or(String::new(), |n| format!(", exit {n}")),
            s.dir.display()
        ),
    }
}
