//! `repro RUN/TRIAL`: a reproducer directory for one trial
//! ([`crate::report::repro`]); `repro --standalone ID [--prove]`: a known
//! bug's stand-alone C reproducer as one file, and its proof in the guest
//! and in a plain init on each kernel ([`crate::run::standalone`]).

use std::path::{Path, PathBuf};
use std::time::Instant;

use kloop_kernels::build::{BuildRequest, BuiltKernel};
use kloop_path_io::{PathIo, PathIoExt};

use crate::report::repro::{self, ReproError};
use crate::run::standalone::{self, stock::StockRun, ProofKernel, ProofRun, Reproducer};
use crate::run::suite::{self, EnvOptions, SuiteError};
use crate::run::trial::{KernelUnderTest, TrialResult};
use crate::workspace::{Layout, LoadLedgerError};

#[derive(Debug, thiserror::Error)]
pub enum ReproRunError {
    #[error(transparent)]
    Repro(#[from] ReproError),
    #[error("writing a reproducer of {}", .dir.display())]
    WriteTrial {
        dir: PathBuf,
        #[source]
        source: Box<ReproError>,
    },
    #[error(transparent)]
    Ledger(#[from] LoadLedgerError),
    #[error(transparent)]
    Standalone(#[from] standalone::StandaloneError),
    #[error(transparent)]
    Io(#[from] PathIo),
    #[error(transparent)]
    Kernel(#[from] kloop_kernels::KernelError),
    #[error(transparent)]
    Payload(#[from] crate::run::payload::PayloadError),
    #[error(transparent)]
    Suite(#[from] SuiteError),
    /// The run's reports could not be written.
    #[error(transparent)]
    Reports(std::io::Error),
}

/// A trial's reproducer directory: the trial's and what was written.
#[derive(Debug)]
pub struct TrialRepro {
    pub trial: PathBuf,
    pub written: repro::Reproducer,
}

/// Writes the reproducer of `trial` (RUN/KERNEL/SCENARIO, `latest/…` or a
/// trial directory) to `out`, by default
/// `target/kloop/repro/<run>-<kernel>-<scenario>`.
pub fn trial(
    layout: &Layout,
    trial: &str,
    out: Option<&Path>,
) -> Result<TrialRepro, ReproRunError> {
    let dir = repro::trial_dir(layout, trial)?;
    let out = out.map_or_else(
        || {
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
        },
        Path::to_path_buf,
    );
    let written = repro::write(layout, &dir, &out).map_err(|source| ReproRunError::WriteTrial {
        dir: dir.clone(),
        source: Box::new(source),
    })?;
    Ok(TrialRepro {
        trial: dir,
        written,
    })
}

/// A known bug's stand-alone reproducer, written as one file.
#[derive(Debug)]
pub struct Standalone {
    pub reproducer: Reproducer,
    pub file: PathBuf,
}

/// Writes ledger `id`'s reproducer as one C file to `out`, by default
/// `target/kloop/repro/<name>.c`.
pub fn standalone(
    layout: &Layout,
    id: &str,
    out: Option<&Path>,
) -> Result<Standalone, ReproRunError> {
    let ledger = crate::workspace::load_ledger(layout)?;
    let r = standalone::find(&layout.kernels(), &ledger, id)?;
    let file = out.map_or_else(
        || {
            layout
                .root
                .join("target/kloop/repro")
                .join(format!("{}.c", r.name))
        },
        Path::to_path_buf,
    );
    kloop_kernels::write_atomically(&file, r.single_file()?.as_bytes()).at("writing", &file)?;
    Ok(Standalone {
        reproducer: r,
        file,
    })
}

/// What `repro --standalone ID --prove` is asked besides the reproducer.
#[derive(Debug, Clone)]
pub struct ProveOptions {
    /// `--kernel`: the kernels to prove it on; empty: those the ledger
    /// and the fix name.
    pub kernels: Vec<String>,
    /// The guests' architecture: its pins, its builds, the program built
    /// by its compiler.
    pub arch: kloop_protocol::Arch,
    pub env: EnvOptions,
}

/// What the caller hears while a proof runs.
#[derive(Debug)]
pub enum Event<'a> {
    /// The reproducer built on the host.
    Built(&'a Path),
    /// The environment is ready: the accelerator chosen.
    Accel(&'a kloop_qemu::accel::AccelDecision),
    /// A trial in kloop's guest ended.
    Trial(&'a TrialResult),
    /// A run in the plain init ended.
    Stock(&'a ProofKernel, &'a StockRun),
}

/// A proof's runs, where they are and how long they took.
pub struct Proven {
    pub run: ProofRun,
    pub run_dir: PathBuf,
    /// From the environment's readiness to the reports written.
    pub secs: f64,
}

/// Runs the reproducer on each kernel, in kloop's guest and as the only
/// program of a plain initramfs, and checks the answers; `None` when a
/// kernel to prove it on could not be built (`build` said why).
pub fn prove(
    layout: &Layout,
    opts: &ProveOptions,
    s: &Standalone,
    build: &mut dyn FnMut(&BuildRequest, &str) -> Option<BuiltKernel>,
    on: &(dyn Fn(Event<'_>) + Sync),
) -> Result<Option<Proven>, ReproRunError> {
    let (r, file) = (&s.reproducer, s.file.as_path());
    // Built on the host first, so a compile error is told as one.
    let cache = kloop_kernels::KernelCache::default_location()?;
    let binary =
        crate::run::payload::c_program_for(file, &cache.root().join("programs"), opts.arch)?;
    on(Event::Built(&binary));
    let Some(kernels) =
        standalone::proof_kernels(layout, r, &opts.kernels, opts.arch, &opts.env.fetch, build)?
    else {
        return Ok(None);
    };
    super::start_trials();
    let ks: Vec<KernelUnderTest> = kernels.iter().map(|k| k.kernel.clone()).collect();
    let env = suite::prepare_env(layout, &opts.env, &ks)?;
    on(Event::Accel(&env.accel));
    let started = Instant::now();
    let run = standalone::prove(
        r,
        file,
        &env,
        &kernels,
        &|r| on(Event::Trial(r)),
        &|k, s| on(Event::Stock(k, s)),
    )?;
    crate::report::write_files(&env.run_dir, &run.results).map_err(ReproRunError::Reports)?;
    Ok(Some(Proven {
        run,
        secs: started.elapsed().as_secs_f64(),
        run_dir: env.run_dir,
    }))
}
