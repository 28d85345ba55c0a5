//! `repro RUN/TRIAL`: a reproducer directory for one trial;
//! `repro --standalone ID [--prove]`: a known bug's stand-alone C
//! reproducer, and its proof in the guest on each kernel.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use kloop::report::repro;
use kloop::run::standalone::{self, Reproducer};
use kloop::run::suite::{self, EnvOptions, Layout};
use kloop::run::trial::KernelUnderTest;

use crate::{layout, start_trials, ReproArgs};

pub(crate) fn repro(a: ReproArgs) -> Result<ExitCode> {
    match (&a.trial, &a.standalone) {
        (_, Some(id)) => standalone_repro(&a, id),
        (Some(trial), None) => trial_repro(trial, a.out.clone()),
        (None, None) => unreachable!("clap requires a trial or --standalone"),
    }
}

fn trial_repro(trial: &str, out: Option<PathBuf>) -> Result<ExitCode> {
    let layout = layout();
    let dir = repro::trial_dir(&layout, trial)?;
    let out = out.unwrap_or_else(|| {
        let name: Vec<String> = dir
            .components()
            .rev()
            .take(3)
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        layout.root.join("target/kloop/repro").join(name.join("-"))
    });
    let written = repro::write(&layout, &dir, &out)
        .with_context(|| format!("writing a reproducer of {}", dir.display()))?;
    println!(
        "kloop: reproducer of {} in {}: {}",
        dir.display(),
        written.dir.display(),
        written.files.join(", ")
    );
    println!(
        "kloop: run it with {}/run.sh (needs only qemu-system-x86_64), then ./show-records.py data.bin; report.txt is the text for a mailing list",
        written.dir.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// Writes the single C file; with --prove, runs it on every kernel.
fn standalone_repro(a: &ReproArgs, id: &str) -> Result<ExitCode> {
    let layout = layout();
    let ledger = suite::load_ledger(&layout)?;
    let r = standalone::find(&layout.kernels(), &ledger, id)?;
    let out = a.out.clone().unwrap_or_else(|| {
        layout
            .root
            .join("target/kloop/repro")
            .join(format!("{}.c", r.name))
    });
    kloop_kernels::write_atomically(&out, r.single_file()?.as_bytes())
        .with_context(|| format!("writing {}", out.display()))?;
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
    prove(&layout, a, &r, &out)
}

/// Runs the reproducer on each kernel, in kloop's guest and as the only
/// program of a plain initramfs, and checks the answers.
fn prove(
    layout: &Layout,
    a: &ReproArgs,
    r: &Reproducer,
    file: &std::path::Path,
) -> Result<ExitCode> {
    // Built on the host first, so a compile error is told as one.
    let cache = kloop_kernels::KernelCache::default_location()?;
    let binary = kloop::run::payload::c_program(file, &cache.root().join("programs"))?;
    println!("kloop: built {}", binary.display());
    let mut build =
        |req: &kloop_kernels::build::BuildRequest, what: &str| crate::build_kernel(req, what).ok();
    let fetch = a.fetch.options();
    let Some(kernels) = standalone::proof_kernels(layout, r, &a.kernels, &fetch, &mut build)?
    else {
        return Ok(ExitCode::from(crate::EXIT_BUILD));
    };
    start_trials();
    let opts = EnvOptions {
        accel: a.accel,
        fetch: a.fetch.options(),
        ..EnvOptions::default()
    };
    let ks: Vec<KernelUnderTest> = kernels.iter().map(|k| k.kernel.clone()).collect();
    let env = suite::prepare_env(layout, &opts, &ks)?;
    println!("kloop: accelerator: {}", env.accel);
    let started = std::time::Instant::now();
    let run = standalone::prove(
        r,
        file,
        &env,
        &kernels,
        &|r| {
            println!("{}", kloop::report::trial_line(r));
        },
        &|k, s| {
            println!(
                "kloop: {} in the plain init: {}{} ({})",
                k.label,
                s.outcome.label(),
                s.answer
                    .status
                    .map_or(String::new(), |n| format!(", exit {n}")),
                s.dir.display()
            );
        },
    )?;
    kloop::report::write_files(&env.run_dir, &run.results)?;
    let stock: Vec<_> = run.stock.iter().map(|s| s.outcome.clone()).collect();
    print!("\n{}", repro::proof_table(&run.proof, &run.guest, &stock));
    let proof = run.proof;
    let all_as_expected = proof.as_expected;
    println!(
        "kloop: {} in {:.0} s; trials in {}",
        if all_as_expected {
            "the reproducer answers as the ledger and the fix say on every kernel, in kloop's guest and as the only program of a plain init"
        } else {
            "the reproducer does NOT answer as expected on every kernel (see above)"
        },
        started.elapsed().as_secs_f64(),
        env.run_dir.display()
    );
    Ok(crate::exit_code(all_as_expected))
}
