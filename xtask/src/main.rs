//! `cargo xtask`: a thin CLI over the `kloop` library.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use kloop::report::{self, Summary};
use kloop::run::suite::{self, EnvOptions, Layout, Selection};
use kloop_kernels::{Catalog, FetchOptions, KernelCache};
use kloop_qemu::accel::AccelChoice;

mod build_progress;

#[derive(Parser)]
#[command(
    name = "cargo xtask",
    about = "kloop: kernel-in-the-loop tests of the KSYMBOL / BPF_EVENT stream"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Boot kernels under QEMU, run scenarios, check records, compare snapshots.
    VmTest(VmTestArgs),
    /// Re-run trials and rewrite their golden snapshots from the real streams.
    Bless(BlessArgs),
    /// Time kloop itself: boot→hello and trial wall time per pin.
    Bench(BenchArgs),
    /// Patch validation: build a kernel source with and without patches,
    /// run the scenarios on both and compare (exit 0 only when nothing
    /// changed or broke).
    Validate(ValidateArgs),
    /// Find the first kernel build whose records changed (or were fixed):
    /// a binary search over every build the mirror serves between --old
    /// and --new.
    Bisect(BisectArgs),
    /// One step of `bisect --tree` (what `git bisect run` calls): build the
    /// worktree, run, exit 0 old, 1 new, 125 skip.
    #[command(hide = true)]
    BisectStep(BisectStepArgs),
    /// The kernel catalog.
    Kernels {
        #[command(subcommand)]
        cmd: KernelsCmd,
    },
}

#[derive(Args, Clone)]
struct FetchArgs {
    /// Debian mirror URL (default: from the host's apt sources, or $KLOOP_MIRROR).
    #[arg(long)]
    mirror: Option<String>,
    /// Never download: use only the cache.
    #[arg(long)]
    offline: bool,
}

impl FetchArgs {
    fn options(&self) -> FetchOptions {
        FetchOptions {
            mirror: self.mirror.clone(),
            offline: self.offline,
            ..FetchOptions::default()
        }
    }
}

#[derive(Args, Clone)]
struct VmTestArgs {
    /// Only these kernel pins (repeatable).
    #[arg(long = "kernel", value_name = "ID")]
    kernels: Vec<String>,
    /// Only these scenarios (repeatable).
    #[arg(long = "scenario", value_name = "NAME")]
    scenarios: Vec<String>,
    /// Boot this bzImage instead of the pinned kernels.
    #[arg(long, value_name = "PATH")]
    kernel_image: Option<PathBuf>,
    /// For a kernel that is not a pin (--kernel-image, --kernel built:ID or
    /// a path): also compare with the snapshots of this pin (or of a set
    /// blessed with `bless --as`).
    #[arg(long, value_name = "ID")]
    snapshot_as: Option<String>,
    /// A/B: run the scenarios on this kernel too (a pin id, built:ID or a
    /// bzImage) and report, per scenario, SAME, CHANGED, BROKEN or
    /// BASELINE-ONLY for the --kernel (or --kernel-image) candidate.
    #[arg(long, value_name = "KERNEL")]
    baseline: Option<String>,
    /// Accelerator: kvm, tcg or auto (KVM only if a probe guest boots).
    #[arg(long, default_value = "auto")]
    accel: AccelChoice,
    /// Parallel VMs (default: number of cores).
    #[arg(long, short)]
    jobs: Option<usize>,
    /// vCPUs per guest.
    #[arg(long, default_value_t = 2)]
    cpus: u32,
    /// Guest memory in MiB.
    #[arg(long, default_value_t = 512)]
    memory: u32,
    /// Append this word to every guest's kernel command line (repeatable),
    /// e.g. `--append initcall_debug`.
    #[arg(long, value_name = "ARG")]
    append: Vec<String>,
    /// How QEMU enters the kernel: `pvh` (the bzImage's own ELF, decompressed
    /// once on the host, entered at its PVH note: faster) or `bzimage`.
    #[arg(long, default_value = "pvh")]
    boot: kloop::run::trial::BootEntry,
    /// List the trials and exit.
    #[arg(long)]
    list: bool,
    /// Run every trial N times (round after round) and report per trial
    /// whether the verdict and the normalised stream were the same every
    /// time; a trial whose runs disagree is FLAKY and fails the run.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    repeat: u32,
    #[command(flatten)]
    fetch: FetchArgs,
}

#[derive(Args, Clone)]
struct ValidateArgs {
    /// `linux-source-X.Y` (pinned in kernels/sources/) or a kernel tree.
    #[arg(long)]
    source: String,
    /// The patches under test, applied in order (`patch -p1`).
    /// Without patches, validate compares the source with itself: the
    /// noise floor of the A/B (every scenario must come out SAME).
    #[arg(long = "patch", value_name = "FILE")]
    patches: Vec<PathBuf>,
    /// Config fragments for both builds, merged after kernels/configs/kloop.config.
    #[arg(long = "config", value_name = "FRAGMENT")]
    fragments: Vec<PathBuf>,
    #[arg(long, default_value = "tinyconfig")]
    base: kloop_kernels::build::ConfigBase,
    /// Only these scenarios (repeatable; default all).
    #[arg(long = "scenario", value_name = "NAME")]
    scenarios: Vec<String>,
    /// Parallel VMs and make -j (default: number of cores).
    #[arg(long, short)]
    jobs: Option<usize>,
    #[arg(long, default_value = "auto")]
    accel: AccelChoice,
    #[command(flatten)]
    fetch: FetchArgs,
}

#[derive(Args, Clone)]
struct BisectArgs {
    /// The scenario each step runs.
    #[arg(long)]
    scenario: String,
    /// The old end: a Debian version (`kernels available`) or a pin id;
    /// with --tree, a git revision.
    #[arg(long)]
    old: String,
    /// The new end: a Debian version or a pin id; with --tree, a revision.
    #[arg(long)]
    new: String,
    /// Bisect the commits of this git tree instead (`git bisect run` in a
    /// worktree kloop removes afterwards; each step builds, boots, runs).
    #[arg(long, value_name = "PATH")]
    tree: Option<PathBuf>,
    /// With --tree: config fragments merged after kernels/configs/kloop.config.
    #[arg(long = "config", value_name = "FRAGMENT")]
    fragments: Vec<PathBuf>,
    /// What "changed" means: snapshot, rule:NAME, field:<record>.<field>
    /// (with --label), overhead:<figure>.
    #[arg(long, default_value = "snapshot")]
    predicate: String,
    /// The program label a field predicate reads.
    #[arg(long)]
    label: Option<String>,
    /// Runs per step; a step is decided only when its runs that reached a
    /// verdict agree (INFRA, TIMEOUT and boot failures never count).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    repeat: u32,
    /// Parallel VMs for the runs of a step (default: number of cores).
    #[arg(long, short)]
    jobs: Option<usize>,
    #[arg(long, default_value = "auto")]
    accel: AccelChoice,
    #[command(flatten)]
    fetch: FetchArgs,
}

#[derive(Args, Clone)]
struct BisectStepArgs {
    #[arg(long)]
    tree: PathBuf,
    #[arg(long)]
    scenario: String,
    #[arg(long)]
    predicate: String,
    #[arg(long)]
    label: Option<String>,
    #[arg(long)]
    repeat: u32,
    /// The old end's observation (JSON).
    #[arg(long)]
    reference: PathBuf,
    #[arg(long)]
    band: f64,
    /// Appends one line per step.
    #[arg(long)]
    steps_log: PathBuf,
    #[arg(long = "config", value_name = "FRAGMENT")]
    fragments: Vec<PathBuf>,
    #[arg(long, default_value = "auto")]
    accel: AccelChoice,
}

#[derive(Args, Clone)]
struct BlessArgs {
    #[command(flatten)]
    run: VmTestArgs,
    /// Also rewrite the overhead budgets (scenarios/<name>/budgets/<pin>.toml)
    /// from the measured figures; plain bless never touches them.
    #[arg(long)]
    overhead: bool,
    /// Bless a kernel that is not a pin (--kernel built:ID, --kernel-image)
    /// as a snapshot set of its own named NAME: a deliberate ABI change
    /// becomes a reviewed snapshot set, compared with `--snapshot-as NAME`.
    #[arg(long = "as", value_name = "NAME")]
    as_name: Option<String>,
}

#[derive(Args, Clone)]
struct BenchArgs {
    /// Boots per pin.
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Only these kernel pins (repeatable).
    #[arg(long = "kernel", value_name = "ID")]
    kernels: Vec<String>,
    /// The scenario to boot.
    #[arg(long, default_value = "basic")]
    scenario: String,
    /// Parallel VMs (default 1, so timings are not disturbed).
    #[arg(long, short, default_value_t = 1)]
    jobs: usize,
    #[arg(long, default_value = "auto")]
    accel: AccelChoice,
    /// Append this word to every guest's kernel command line (repeatable),
    /// e.g. to compare boot options.
    #[arg(long, value_name = "ARG")]
    append: Vec<String>,
    /// How QEMU enters the kernel: pvh or bzimage (see vm-test --help).
    #[arg(long, default_value = "pvh")]
    boot: kloop::run::trial::BootEntry,
    /// Load/unload cycles of the channel storm on the first pin (66 records
    /// each); 0 skips it.
    #[arg(long, default_value_t = 200)]
    channel_cycles: u32,
    /// Also time the whole matrix (`vm-test`, all pins × scenarios), cold
    /// from an empty kernel cache and then warm.
    #[arg(long)]
    matrix: bool,
}

#[derive(Subcommand)]
enum KernelsCmd {
    /// Show the catalog and what is cached.
    List,
    /// Download and verify pinned kernels (all by default).
    Fetch {
        ids: Vec<String>,
        #[command(flatten)]
        fetch: FetchArgs,
    },
    /// Re-pin ID to the newest build its suite serves (rewrites kernels/ID.toml).
    Update {
        id: String,
        #[command(flatten)]
        fetch: FetchArgs,
    },
    /// Build a kernel from a Debian source package or a local tree, with
    /// patches and config fragments; use it as `--kernel built:<id>`.
    Build(BuildArgs),
    /// The kernels `kernels build` made.
    Built,
    /// Every cloud-amd64 build the Debian suites serve, oldest first, with
    /// which are pinned (kernels/*.toml), in the bisection lock and cached.
    Available {
        /// Only this series (`6.12`).
        #[arg(long)]
        series: Option<String>,
        /// Ask the mirror even if the listing cached within the hour is fresh.
        #[arg(long)]
        refresh: bool,
        #[command(flatten)]
        fetch: FetchArgs,
    },
    /// Pin builds (Debian versions from `kernels available`) into
    /// kernels/bisect.lock, outside the default matrix.
    PinBuild {
        versions: Vec<String>,
        #[command(flatten)]
        fetch: FetchArgs,
    },
    /// Pin a Debian kernel source package (kernels/sources/PACKAGE.toml) at
    /// the newest version SUITE serves, for `kernels build --source PACKAGE`.
    PinSource {
        /// `linux-source-X.Y`.
        package: String,
        /// The Debian suite (`bookworm-security`, `trixie`, `sid`, …).
        #[arg(long)]
        suite: String,
        #[command(flatten)]
        fetch: FetchArgs,
    },
}

#[derive(Args, Clone)]
struct BuildArgs {
    /// `linux-source-X.Y` (pinned in kernels/sources/) or a kernel tree.
    #[arg(long)]
    source: String,
    /// Patches applied in order (`patch -p1`), on a copy: the source is never changed.
    #[arg(long = "patch", value_name = "FILE")]
    patches: Vec<PathBuf>,
    /// Config fragments merged after kernels/configs/kloop.config (a later one wins).
    #[arg(long = "config", value_name = "FRAGMENT")]
    fragments: Vec<PathBuf>,
    /// The base the fragments are merged onto.
    #[arg(long, default_value = "tinyconfig")]
    base: kloop_kernels::build::ConfigBase,
    /// make -j (default: number of cores).
    #[arg(long, short)]
    jobs: Option<usize>,
    #[command(flatten)]
    fetch: FetchArgs,
}

impl BuildArgs {
    fn request(&self, layout: &Layout) -> Result<kloop_kernels::build::BuildRequest> {
        Ok(kloop_kernels::build::BuildRequest {
            source: kloop_kernels::build::SourceSpec::parse(&self.source, &layout.kernels())?,
            patches: self.patches.clone(),
            kloop_fragment: layout.kernels().join("configs/kloop.config"),
            fragments: self.fragments.clone(),
            base: self.base,
            jobs: self.jobs.unwrap_or_else(suite::default_jobs),
            fetch: self.fetch.options(),
        })
    }
}

/// Exit status of a run whose kernel did not build (vs 1: a trial failed,
/// 2: kloop could not run).
const EXIT_BUILD: u8 = 3;

/// Builds `req`, showing progress; `Err(code)` after printing a BUILD or
/// setup failure.
fn build_kernel(
    req: &kloop_kernels::build::BuildRequest,
    what: &str,
) -> std::result::Result<kloop_kernels::build::BuiltKernel, ExitCode> {
    let cache = match KernelCache::default_location() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return Err(ExitCode::from(2));
        }
    };
    let mut progress = build_progress::BuildProgress::new(what);
    let result = kloop_kernels::build::build(&cache, req, &mut |e| progress.event(e));
    progress.finish();
    match result {
        Ok(k) => {
            let r = &k.record;
            println!(
                "kloop: built:{} {} ({}){}: {}",
                r.id,
                r.release,
                r.source,
                if r.patches.is_empty() {
                    String::new()
                } else {
                    format!(" + {} patch(es)", r.patches.len())
                },
                if k.cached {
                    "already built, from the cache".to_string()
                } else {
                    format!(
                        "{} build in {:.0} s",
                        if r.incremental { "incremental" } else { "full" },
                        r.build_secs
                    )
                }
            );
            println!(
                "kloop:   image {}, config {}, log {}",
                k.image().display(),
                k.config_path().display(),
                k.log().display()
            );
            for n in &r.notes {
                println!("kloop:   note: {n}");
            }
            Ok(k)
        }
        Err(e) if e.is_build_failure() => {
            eprintln!("BUILD FAILED ({what}): {e}");
            Err(ExitCode::from(EXIT_BUILD))
        }
        Err(e) => {
            eprintln!("error ({what}): {e}");
            Err(ExitCode::from(2))
        }
    }
}

/// The accelerator decision, and how long the KVM probe took if one ran.
fn accel_line(d: &kloop_qemu::accel::AccelDecision) -> String {
    match d.probe_ms {
        Some(ms) => format!("{} [KVM probe took {:.1} s]", d.reason, ms as f64 / 1000.0),
        None if d.from_cache => format!("{} [cached verdict]", d.reason),
        None => d.reason.clone(),
    }
}

fn layout() -> Layout {
    Layout::from_root(kloop::run::agent::workspace_root())
}

fn main() -> ExitCode {
    match run() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run() -> Result<ExitCode> {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::VmTest(a) => vm_test(a, false),
        Cmd::Bless(BlessArgs {
            run: mut a,
            overhead,
            as_name,
        }) => {
            if overhead {
                std::env::set_var(kloop::judge::overhead::BLESS_ENV, "1");
            }
            let catalog = Catalog::load(&layout().kernels())?;
            let local =
                a.kernel_image.is_some() || a.kernels.iter().any(|k| catalog.get(k).is_err());
            match (&as_name, local) {
                (None, true) => bail!("a kernel that is not a pin is blessed as a snapshot set of its own: add `--as <name>` (then compare with `vm-test --snapshot-as <name>`); it never rewrites a pin's snapshots"),
                (Some(_), false) => bail!("--as names the snapshot set of a kernel that is not a pin (--kernel built:ID or --kernel-image); a pin is blessed under its own id"),
                (Some(name), true) => {
                    if catalog.get(name).is_ok() {
                        bail!("--as {name} is a pin's id: a local kernel's stream never overwrites a pin's golden snapshots; choose a new name");
                    }
                    if a.baseline.is_some() {
                        bail!("bless does not take --baseline");
                    }
                    a.snapshot_as = Some(name.clone());
                }
                (None, false) => {}
            }
            if a.repeat > 1 {
                bail!("bless writes each snapshot from one run; check that a trial is stable with `cargo xtask vm-test --repeat N` first, then bless it once");
            }
            // insta rewrites the .snap files instead of failing; invariant
            // violations still fail: only a clean stream can be blessed.
            std::env::set_var("INSTA_UPDATE", "always");
            vm_test(a, as_name.is_some())
        }
        Cmd::Kernels { cmd } => kernels(cmd),
        Cmd::Validate(a) => validate(a),
        Cmd::Bisect(a) if a.tree.is_some() => bisect_tree(a),
        Cmd::Bisect(a) => bisect(a),
        Cmd::BisectStep(a) => bisect_step(a),
        Cmd::Bench(a) => bench(a),
    }
}

fn bench(a: BenchArgs) -> Result<ExitCode> {
    let layout = layout();
    let sel = Selection {
        kernels: a.kernels.clone(),
        scenarios: vec![a.scenario.clone()],
        ..Selection::default()
    };
    let planned = suite::plan(&layout, &sel)?;
    kloop::run::signals::install();
    let opts = EnvOptions {
        accel: a.accel,
        extra_cmdline: a.append.clone(),
        boot: a.boot,
        ..EnvOptions::default()
    };
    let kernels: Vec<_> = planned.iter().map(|t| t.kernel.clone()).collect();
    let env = suite::prepare_env(&layout, &opts, &kernels)?;
    println!("kloop bench: accelerator: {}", accel_line(&env.accel));
    if !a.append.is_empty() {
        println!(
            "kloop bench: appended to the kernel command line: {}",
            a.append.join(" ")
        );
    }
    let show = |s: &Option<kloop::run::bench::Spread>| {
        s.map(|s| s.to_string()).unwrap_or_else(|| "-".into())
    };
    let mut boot_rows = Vec::new();
    let mut phase_rows = Vec::new();
    for t in &planned {
        let repeated = vec![t.clone(); a.runs];
        let results = suite::run_all(&env, &repeated, a.jobs, &|_| {});
        let failed = results.iter().filter(|r| r.verdict.fails_run()).count();
        let hello: Vec<f64> = results
            .iter()
            .filter_map(|r| r.boot_to_hello_secs)
            .collect();
        let wall: Vec<f64> = results.iter().map(|r| r.wall_secs).collect();
        let rss_mib: Vec<f64> = results
            .iter()
            .filter_map(|r| r.qemu_peak_rss_kib)
            .map(|k| k as f64 / 1024.0)
            .collect();
        boot_rows.push((
            t.id(),
            kloop::run::bench::Spread::of(&hello),
            kloop::run::bench::Spread::of(&wall),
            kloop::run::bench::Spread::of(&rss_mib),
            failed,
        ));
        phase_rows.push((t.id(), kloop::run::bench::PhaseSpreads::of(&results)));
    }
    println!(
        "{:<16} {:>5} {:>26} {:>26} {:>30} {:>6}",
        "trial",
        "runs",
        "boot→hello s (med min-max)",
        "trial wall s (med min-max)",
        "QEMU peak RSS MiB (med min-max)",
        "failed"
    );
    for (id, hello, wall, rss, failed) in &boot_rows {
        println!(
            "{id:<16} {:>5} {:>26} {:>26} {:>30} {failed:>6}",
            a.runs,
            show(hello),
            show(wall),
            show(rss)
        );
    }
    println!();
    println!(
        "QEMU CPU seconds (user+sys; steady on a busy host, unlike wall time), median (min-max):"
    );
    println!("{:<16} {:>22} {:>22}", "trial", "start→hello", "hello→done");
    for (id, p) in &phase_rows {
        println!(
            "{id:<16} {:>22} {:>22}",
            show(&p.qemu_cpu_to_hello),
            show(&p.qemu_cpu_agent)
        );
    }
    println!();
    println!("where the time goes, seconds, median (min-max):");
    println!(
        "{:<16} {:>22} {:>22} {:>22} {:>22} {:>22} {:>22}",
        "trial",
        "host prepare",
        "QEMU+fw+decompress",
        "kernel boot→hello",
        "agent plan",
        "power-off",
        "host checks"
    );
    for (id, p) in &phase_rows {
        println!(
            "{id:<16} {:>22} {:>22} {:>22} {:>22} {:>22} {:>22}",
            show(&p.prepare),
            show(&p.before_kernel_clock),
            show(&p.kernel_to_hello),
            show(&p.agent),
            show(&p.shutdown),
            show(&p.host_checks)
        );
    }

    if a.channel_cycles > 0 {
        if let Some(t) = planned.first() {
            let storm = kloop::run::bench::storm_scenario(
                &t.scenario,
                "bench-channel",
                &env.run_dir.join("no-snapshots"),
                a.channel_cycles,
                4,
            );
            // The pin's image without its snapshots: the storm has none,
            // its verdict is the invariants alone.
            let kernel = match &t.kernel {
                kloop::run::trial::KernelUnderTest::Pin(pin) => {
                    kloop::run::trial::KernelUnderTest::Image(
                        kloop::run::trial::LocalKernel::from_pin_image(
                            env.cache.ensure_image(pin, &env.fetch)?,
                            env.cache.ensure_config(pin, &env.fetch).ok(),
                        ),
                    )
                }
                other => other.clone(),
            };
            let trial = suite::PlannedTrial {
                scenario: storm,
                kernel,
            };
            let r = suite::run_all(&env, &[trial], 1, &|_| {});
            println!();
            match r.first() {
                Some(r) if r.verdict == kloop::run::trial::Verdict::Ok => {
                    match kloop::run::bench::TrialArtefacts::read(&r.artefacts)
                        .and_then(|t| kloop::run::bench::Throughput::of(&t))
                    {
                        Ok(tp) => println!(
                            "channel ({}): {} records, {} bytes, {} lost in {:.2} s of guest time \
                             (storm of funcs32 + final drain): {:.0} records/s, {:.2} MB/s",
                            t.kernel.id(),
                            tp.records,
                            tp.bytes,
                            tp.lost,
                            tp.secs,
                            tp.records_per_sec(),
                            tp.mb_per_sec()
                        ),
                        Err(e) => println!("channel: cannot read the storm's artefacts: {e}"),
                    }
                }
                Some(r) => println!(
                    "channel: storm trial {}: {}",
                    r.verdict.label(),
                    r.verdict.message().unwrap_or_default()
                ),
                None => {}
            }
        }
    }

    if a.matrix {
        println!();
        matrix_bench(&a)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Times `cargo xtask vm-test` over the whole matrix twice, as a user runs
/// it: cold (a fresh, empty kernel cache: every pin fetched, verified and
/// extracted, the KVM probe run again) and then warm (the same cache).
fn matrix_bench(a: &BenchArgs) -> Result<()> {
    let exe = std::env::current_exe().context("locating the xtask binary")?;
    let cold_cache = tempfile::Builder::new()
        .prefix("kloop-bench-cache-")
        .tempdir()
        .context("creating an empty cache directory for the cold run")?;
    let mut rows = Vec::new();
    for (label, cache) in [
        ("cold (empty cache)", Some(cold_cache.path())),
        ("warm", Some(cold_cache.path())),
    ] {
        let mut cmd = std::process::Command::new(&exe);
        cmd.arg("vm-test").arg("--accel").arg(a.accel.to_string());
        for w in &a.append {
            cmd.arg("--append").arg(w);
        }
        if a.boot == kloop::run::trial::BootEntry::BzImage {
            cmd.arg("--boot").arg("bzimage");
        }
        if let Some(c) = cache {
            cmd.env(kloop_kernels::CACHE_DIR_ENV, c);
        }
        cmd.stdout(std::process::Stdio::null());
        println!("kloop bench: matrix, {label} …");
        let started = std::time::Instant::now();
        let status = cmd.status().context("running vm-test")?;
        let secs = started.elapsed().as_secs_f64();
        rows.push((label, secs, status));
    }
    println!("{:<20} {:>10} {:>10}", "whole matrix", "wall s", "exit");
    for (label, secs, status) in rows {
        println!(
            "{label:<20} {secs:>10.1} {:>10}",
            status.code().map_or("signal".into(), |c| c.to_string())
        );
    }
    Ok(())
}

/// `vm-test`; `new_snapshot_set`: `bless --as`, whose `--snapshot-as`
/// names a set that does not exist yet.
fn vm_test(a: VmTestArgs, new_snapshot_set: bool) -> Result<ExitCode> {
    let layout = layout();
    let sel = Selection {
        kernels: a.kernels.clone(),
        scenarios: a.scenarios.clone(),
        kernel_image: a.kernel_image.clone(),
        snapshot_as: a.snapshot_as.clone(),
        new_snapshot_set,
    };
    if let Some(baseline) = &a.baseline {
        return ab_test(&layout, &a, &sel, baseline);
    }
    let trials = suite::plan(&layout, &sel)?;
    if a.list {
        for t in &trials {
            println!("{}", t.id());
        }
        return Ok(ExitCode::SUCCESS);
    }
    if trials.is_empty() {
        bail!("no trials selected");
    }
    kloop::run::signals::install();
    if std::env::var_os("INSTA_OUTPUT").is_none() {
        // Each failing trial prints its own short diff; insta's full diff
        // would interleave between parallel trials (`cargo insta review`
        // shows it on demand).
        std::env::set_var("INSTA_OUTPUT", "none");
    }
    let opts = EnvOptions {
        accel: a.accel,
        fetch: a.fetch.options(),
        cpus: a.cpus,
        memory_mib: a.memory,
        extra_cmdline: a.append.clone(),
        boot: a.boot,
    };
    let started = std::time::Instant::now();
    let kernels: Vec<_> = trials.iter().map(|t| t.kernel.clone()).collect();
    let env =
        suite::prepare_env(&layout, &opts, &kernels).context("preparing the test environment")?;
    println!("kloop: accelerator: {}", accel_line(&env.accel));
    for note in suite::config_notes(&env, &trials) {
        println!("kloop: {note}");
    }
    let ledger_warnings = env
        .known_issues
        .warnings(kloop::judge::known_issues::Date::today());
    for w in &ledger_warnings {
        println!("kloop: {w}");
    }
    let repeat = a.repeat as usize;
    if repeat > 1 {
        println!(
            "kloop: running {} trial(s) {repeat} times each ({} runs), artefacts in {}",
            trials.len(),
            trials.len() * repeat,
            env.run_dir.display()
        );
    } else {
        println!(
            "kloop: running {} trial(s), artefacts in {}",
            trials.len(),
            env.run_dir.display()
        );
    }
    // Round after round, so each trial's runs meet different neighbours
    // and host load.
    let runs: Vec<_> = (0..repeat).flat_map(|_| trials.iter().cloned()).collect();
    let jobs = a.jobs.unwrap_or_else(suite::default_jobs);
    let all_runs = suite::run_all(&env, &runs, jobs, &|r| {
        println!("{}", report::trial_line(r));
        if let Some(d) = report::failure_details(r) {
            println!("{d}");
        }
    });
    let artefacts: Vec<PathBuf> = all_runs.iter().map(|r| r.artefacts.clone()).collect();
    let results = if repeat > 1 {
        report::write_runs(&env.run_dir, &all_runs)
            .with_context(|| format!("writing runs.jsonl into {}", env.run_dir.display()))?;
        let grouped = kloop::run::repeat::group(all_runs);
        kloop::run::repeat::write_report(&env.run_dir, &grouped)
            .with_context(|| format!("writing repeat.json into {}", env.run_dir.display()))?;
        println!();
        println!("{}", kloop::run::repeat::table(&grouped));
        let combined: Vec<_> = grouped.iter().filter_map(|t| t.combined()).collect();
        for r in combined.iter().filter(|r| r.verdict.label() == "FLAKY") {
            println!("{}", report::trial_line(r));
            if let Some(d) = report::failure_details(r) {
                println!("{d}");
            }
        }
        combined
    } else {
        all_runs
    };
    report::write_files(&env.run_dir, &results)
        .with_context(|| format!("writing reports into {}", env.run_dir.display()))?;
    let run_name = env
        .run_dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let report_dir = layout.root.join("target/kloop/report");
    match kloop::report::overhead::write_run_report(&report_dir, &run_name, &artefacts) {
        Ok(Some((md, svg))) => println!(
            "kloop: overhead table {} and plot {}",
            md.display(),
            svg.display()
        ),
        Ok(None) => {}
        Err(e) => eprintln!(
            "kloop: writing the overhead report into {}: {e}",
            report_dir.display()
        ),
    }
    let summary = Summary::of(&results);
    println!();
    // Skipped and known-bug trials do not fail the run: list them at the end
    // so they are seen anyway.
    for line in report::not_passed_lines(&results) {
        println!("kloop: {line}");
    }
    for w in &ledger_warnings {
        println!("kloop: {w}");
    }
    println!(
        "kloop: {} in {:.1} s ({}); reports: {}",
        summary.line(),
        started.elapsed().as_secs_f64(),
        env.accel.accel,
        env.run_dir.display()
    );
    Ok(if summary.all_ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn kernels(cmd: KernelsCmd) -> Result<ExitCode> {
    let layout = layout();
    match cmd {
        KernelsCmd::List => {
            let catalog = Catalog::load(&layout.kernels())?;
            let cache = KernelCache::default_location()?;
            println!(
                "{:<8} {:<7} {:<40} {:<28} {:<16} cached",
                "id", "series", "package", "version", "image sha256"
            );
            for p in catalog.pins() {
                println!(
                    "{:<8} {:<7} {:<40} {:<28} {:<16} {}",
                    p.id,
                    p.series,
                    p.package,
                    p.version,
                    &p.image_sha256[..16.min(p.image_sha256.len())],
                    if cache.is_cached(p) { "yes" } else { "no" }
                );
            }
            println!("cache: {}", cache.root().display());
        }
        KernelsCmd::Fetch { ids, fetch } => {
            let catalog = Catalog::load(&layout.kernels())?;
            let cache = KernelCache::default_location()?;
            let pins: Vec<_> = if ids.is_empty() {
                catalog.pins().to_vec()
            } else {
                ids.iter()
                    .map(|id| catalog.get(id).cloned())
                    .collect::<Result<_, _>>()?
            };
            for p in pins {
                let t = std::time::Instant::now();
                let path = cache.ensure_image(&p, &fetch.options())?;
                println!(
                    "{} {} {}: {} ({:.1} s)",
                    p.id,
                    p.package,
                    p.version,
                    path.display(),
                    t.elapsed().as_secs_f64()
                );
                // Scenarios with `modules` need the modules package too (its
                // own .deb from 7.x on); fetch it now so later runs work offline.
                if let Some(package) = &p.modules_package {
                    let t = std::time::Instant::now();
                    let path = cache.ensure_modules_deb(&p, &fetch.options())?;
                    println!(
                        "{} {package} {}: {} ({:.1} s)",
                        p.id,
                        p.version,
                        path.display(),
                        t.elapsed().as_secs_f64()
                    );
                }
            }
        }
        KernelsCmd::Build(a) => {
            let req = a.request(&layout)?;
            let what = req.source.label();
            return Ok(match build_kernel(&req, &what) {
                Ok(k) => {
                    println!(
                        "kloop: run it with `cargo xtask vm-test --kernel built:{}`",
                        k.record.id
                    );
                    ExitCode::SUCCESS
                }
                Err(code) => code,
            });
        }
        KernelsCmd::Built => {
            let cache = KernelCache::default_location()?;
            let all = kloop_kernels::build::list(&cache);
            if all.is_empty() {
                println!("no built kernels; build one with `cargo xtask kernels build --source linux-source-6.12`");
            }
            for k in all {
                let r = &k.record;
                println!(
                    "built:{}  {:<28} {}{}  config {}",
                    r.id,
                    r.release,
                    r.source,
                    r.patches
                        .iter()
                        .map(|p| format!(" +{}", p.path.display()))
                        .collect::<String>(),
                    &r.config_sha256[..12]
                );
            }
        }
        KernelsCmd::Available {
            series,
            refresh,
            fetch,
        } => {
            let cache = KernelCache::default_location()?;
            let (builds, notes) = available_builds(&cache, &fetch, refresh)?;
            let catalog = Catalog::load(&layout.kernels())?;
            let lock = kloop_kernels::available::BisectLock::load(&layout.kernels())?;
            println!(
                "{:<26} {:<7} {:<20} {:<44} pinned",
                "version", "series", "suite", "package"
            );
            let mut shown = 0;
            for b in builds
                .iter()
                .filter(|b| series.as_ref().is_none_or(|s| &b.series == s))
            {
                shown += 1;
                let pin = catalog.pins().iter().find(|p| p.version == b.version);
                let mark = match (pin, lock.get(&b.version)) {
                    (Some(p), _) => format!(
                        "pin {}{}",
                        p.id,
                        if cache.is_cached(p) { ", cached" } else { "" }
                    ),
                    (None, Some(p)) => format!(
                        "bisect.lock{}",
                        if cache.is_cached(p) { ", cached" } else { "" }
                    ),
                    (None, None) => "-".into(),
                };
                println!(
                    "{:<26} {:<7} {:<20} {:<44} {mark}",
                    b.version, b.series, b.suite, b.package
                );
            }
            println!("{shown} build(s)");
            for n in notes {
                println!("note: {n}");
            }
        }
        KernelsCmd::PinBuild { versions, fetch } => {
            let cache = KernelCache::default_location()?;
            let (builds, _) = available_builds(&cache, &fetch, false)?;
            let mut lock = kloop_kernels::available::BisectLock::load(&layout.kernels())?;
            for v in versions {
                let b = builds
                    .iter()
                    .find(|b| b.version == v)
                    .with_context(|| format!("no build {v} in `cargo xtask kernels available`"))?;
                let pin = lock.ensure(&cache, &layout.kernels(), b, &fetch.options())?;
                println!(
                    "{}: {} {} (deb sha256 {}, image sha256 {}) in kernels/bisect.lock",
                    pin.id, pin.package, pin.suite, pin.deb_sha256, pin.image_sha256
                );
            }
        }
        KernelsCmd::PinSource {
            package,
            suite,
            fetch,
        } => {
            let cache = KernelCache::default_location()?;
            let pin = kloop_kernels::build::pin_source(
                &cache,
                &layout.kernels(),
                &package,
                &suite,
                &fetch.options(),
            )?;
            println!(
                "{}: pinned {} from {} (deb sha256 {})",
                pin.package, pin.version, pin.suite, pin.deb_sha256
            );
        }
        KernelsCmd::Update { id, fetch } => {
            let pin = kloop_kernels::update_pin(&layout.kernels(), &id, &fetch.options())?;
            println!(
                "{}: pinned {} {} (deb sha256 {}, image sha256 {})",
                pin.id, pin.package, pin.version, pin.deb_sha256, pin.image_sha256
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `vm-test --baseline`: the candidate (the one kernel --kernel or
/// --kernel-image names) against the baseline, scenario by scenario.
fn ab_test(layout: &Layout, a: &VmTestArgs, sel: &Selection, baseline: &str) -> Result<ExitCode> {
    if a.repeat > 1 {
        bail!("--baseline compares one run of each side; check stability with --repeat on each kernel first");
    }
    let candidates = suite::resolve_kernels(layout, sel)?;
    let candidate = match (candidates.as_slice(), sel.kernels.is_empty() && sel.kernel_image.is_none()) {
        ([one], false) => one.clone(),
        _ => bail!("--baseline compares one candidate: name it with one --kernel (a pin, built:ID or a bzImage) or --kernel-image"),
    };
    let catalog = Catalog::load(&layout.kernels())?;
    let baseline = suite::resolve_kernel(&catalog, baseline, None)?;
    let opts = EnvOptions {
        accel: a.accel,
        fetch: a.fetch.options(),
        cpus: a.cpus,
        memory_mib: a.memory,
        extra_cmdline: a.append.clone(),
        boot: a.boot,
    };
    let jobs = a.jobs.unwrap_or_else(suite::default_jobs);
    run_ab(layout, &baseline, &candidate, &a.scenarios, &opts, jobs)
}

/// Runs an A/B and prints its report; exit 0 only when no scenario
/// changed, broke or could not be compared.
fn run_ab(
    layout: &Layout,
    baseline: &kloop::run::trial::KernelUnderTest,
    candidate: &kloop::run::trial::KernelUnderTest,
    scenarios: &[String],
    opts: &EnvOptions,
    jobs: usize,
) -> Result<ExitCode> {
    kloop::run::signals::install();
    if std::env::var_os("INSTA_OUTPUT").is_none() {
        std::env::set_var("INSTA_OUTPUT", "none");
    }
    let started = std::time::Instant::now();
    let ab = kloop::run::ab::run(
        layout,
        baseline,
        candidate,
        scenarios,
        opts,
        jobs,
        &|env, base, cand| {
            println!("kloop: accelerator: {}", accel_line(&env.accel));
            println!(
                "kloop: A/B: baseline {base}, candidate {cand}; artefacts in {}",
                env.run_dir.display()
            );
        },
        &|r| println!("{}", report::trial_line(r)),
    )
    .context("preparing the A/B run")?;
    report::write_files(&ab.run_dir, &ab.results)
        .with_context(|| format!("writing reports into {}", ab.run_dir.display()))?;
    let json = kloop::report::ab::write_json(&ab.run_dir, &ab.outcomes)
        .with_context(|| format!("writing ab.json into {}", ab.run_dir.display()))?;
    println!();
    println!(
        "{}",
        kloop::report::ab::render(
            &ab.baseline,
            &ab.candidate,
            &ab.outcomes,
            kloop::report::ab::Colour::for_stdout()
        )
    );
    println!(
        "kloop: A/B in {:.1} s ({}); report {}",
        started.elapsed().as_secs_f64(),
        ab.accel,
        json.display()
    );
    Ok(if ab.accepted {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// `validate`: the source built without and with the patches (both
/// cached), then the A/B.
fn validate(a: ValidateArgs) -> Result<ExitCode> {
    let layout = layout();
    let build = BuildArgs {
        source: a.source.clone(),
        patches: Vec::new(),
        fragments: a.fragments.clone(),
        base: a.base,
        jobs: a.jobs,
        fetch: a.fetch.clone(),
    };
    let base_req = build.request(&layout)?;
    let cand_req = kloop_kernels::build::BuildRequest {
        patches: a.patches.clone(),
        ..base_req.clone()
    };
    let what = base_req.source.label();
    let baseline = match build_kernel(&base_req, &format!("baseline: {what}")) {
        Ok(k) => k,
        Err(code) => return Ok(code),
    };
    let candidate = match build_kernel(
        &cand_req,
        &format!(
            "candidate: {what} + {}",
            a.patches
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(" + ")
        ),
    ) {
        Ok(k) => k,
        Err(code) => return Ok(code),
    };
    let catalog = Catalog::load(&layout.kernels())?;
    let local = |k: &kloop_kernels::build::BuiltKernel| {
        kloop::run::trial::KernelUnderTest::Image(
            kloop::run::trial::LocalKernel::built(k, None)
                .with_series_of(&k.record.release, &catalog),
        )
    };
    let opts = EnvOptions {
        accel: a.accel,
        fetch: a.fetch.options(),
        ..EnvOptions::default()
    };
    let jobs = a.jobs.unwrap_or_else(suite::default_jobs);
    let code = run_ab(
        &layout,
        &local(&baseline),
        &local(&candidate),
        &a.scenarios,
        &opts,
        jobs,
    )?;
    let verdict = match (code == ExitCode::SUCCESS, a.patches.is_empty()) {
        (true, false) => "the patches change nothing kloop checks",
        (false, false) => "REJECTED: the patches change or break the records (see above)",
        (true, true) => "no patches: the source against itself is the same (the A/B's noise floor holds)",
        (false, true) => "no patches, yet the source differs from itself: runs of this kernel are not reproducible (see above)",
    };
    println!("kloop: validate: {verdict}");
    Ok(code)
}

/// Every build the Debian suites serve (cached listing unless `refresh`).
fn available_builds(
    cache: &KernelCache,
    fetch: &FetchArgs,
    refresh: bool,
) -> Result<(Vec<kloop_kernels::available::AvailableBuild>, Vec<String>)> {
    let suites: Vec<String> = kloop_kernels::available::DEBIAN_SUITES
        .iter()
        .map(|s| s.to_string())
        .collect();
    Ok(kloop_kernels::available::list_available(
        cache,
        &suites,
        "cloud-amd64",
        &fetch.options(),
        refresh,
    )?)
}

/// `bisect` over the builds the mirror serves.
fn bisect(a: BisectArgs) -> Result<ExitCode> {
    use kloop::judge::bisect::{Predicate, StepVerdict};
    let layout = layout();
    let predicate =
        Predicate::parse(&a.predicate, a.label.as_deref()).map_err(anyhow::Error::msg)?;
    let cache = KernelCache::default_location()?;
    let catalog = Catalog::load(&layout.kernels())?;
    let (builds, _) = available_builds(&cache, &a.fetch, false)?;
    // A pin id names its build.
    let version_of = |end: &str| -> String {
        catalog
            .get(end)
            .map(|p| p.version.clone())
            .unwrap_or_else(|_| end.to_string())
    };
    let (old, new) = (version_of(&a.old), version_of(&a.new));
    let index_of = |v: &str| {
        builds.iter().position(|b| b.version == v).with_context(|| {
            format!("{v} is not a build the mirror serves; see `cargo xtask kernels available`")
        })
    };
    let (i_old, i_new) = (index_of(&old)?, index_of(&new)?);
    let range: Vec<_> = if i_old <= i_new {
        builds[i_old..=i_new].to_vec()
    } else {
        // Old may be the later build (a fix searched backwards): the
        // search runs from old to new either way.
        builds[i_new..=i_old].iter().rev().cloned().collect()
    };
    let names: Vec<String> = range.iter().map(|b| b.version.clone()).collect();
    let all = kloop::scenario::load_all(&layout.scenarios())?;
    let scenario = kloop::scenario::select(&all, std::slice::from_ref(&a.scenario))?.remove(0);
    kloop::run::signals::install();
    std::env::set_var("INSTA_OUTPUT", "none");
    let opts = EnvOptions {
        accel: a.accel,
        fetch: a.fetch.options(),
        ..EnvOptions::default()
    };
    // The first end that can be had probes KVM.
    let first = catalog
        .pins()
        .iter()
        .find(|p| p.version == old)
        .cloned()
        .map(kloop::run::trial::KernelUnderTest::Pin);
    let env = suite::prepare_env(&layout, &opts, first.as_slice())?;
    let band = match env.accel.accel() {
        _ if !scenario.vm.icount => kloop::judge::overhead::REAL_TIME_MEDIAN_TOLERANCE,
        kloop_qemu::Accel::Tcg => kloop::judge::overhead::ICOUNT_TOLERANCE,
        _ => kloop::judge::overhead::REAL_TIME_MEDIAN_TOLERANCE,
    };
    println!("kloop: accelerator: {}", accel_line(&env.accel));
    println!(
        "kloop: bisect {} over {} build(s) from {old} (old) to {new} (new), predicate {}, {} run(s) per step; artefacts in {}",
        scenario.name,
        names.len(),
        a.predicate,
        a.repeat,
        env.run_dir.display()
    );
    let mut lock = kloop_kernels::available::BisectLock::load(&layout.kernels())?;
    let fetch = a.fetch.options();
    let mut kernel_at =
        |i: usize| -> std::result::Result<kloop::run::trial::KernelUnderTest, String> {
            let b = &range[i];
            if let Some(p) = catalog.pins().iter().find(|p| p.version == b.version) {
                return Ok(kloop::run::trial::KernelUnderTest::Pin(p.clone()));
            }
            lock.ensure(&cache, &layout.kernels(), b, &fetch)
                .map(|pin| kloop::run::trial::KernelUnderTest::build(pin, &catalog))
                .map_err(|e| format!("INFRA: pinning {}: {e}", b.version))
        };
    let started = std::time::Instant::now();
    let mut step_no = 0;
    let outcome = kloop::run::bisect::bisect(
        &env,
        &scenario,
        &names,
        &mut kernel_at,
        &predicate,
        a.repeat as usize,
        a.jobs.unwrap_or_else(suite::default_jobs),
        band,
        &mut |s| {
            step_no += 1;
            let verdict = match &s.verdict {
                StepVerdict::Old => "old".to_string(),
                StepVerdict::New => "new".to_string(),
                StepVerdict::Skip(why) => format!("skip ({why})"),
            };
            println!(
                "step {step_no}: {} → {verdict} ({:.1} s; {})",
                s.kernel,
                s.secs,
                s.runs
                    .iter()
                    .map(|r| r.1.split('\n').next().unwrap_or("").to_string())
                    .collect::<Vec<_>>()
                    .join(" | ")
            );
        },
    );
    let outcome = match outcome {
        Ok(o) => o,
        Err(e) => {
            eprintln!("bisect: {e}");
            return Ok(ExitCode::from(2));
        }
    };
    let s = &outcome.search;
    println!();
    println!(
        "first new build: {} ({})",
        names[s.first_new], range[s.first_new].package
    );
    println!(
        "last old build:  {} ({})",
        names[s.last_old], range[s.last_old].package
    );
    if !s.skipped_between.is_empty() {
        println!(
            "ambiguous: skipped build(s) between them: {}",
            s.skipped_between
                .iter()
                .map(|&i| names[i].clone())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    for line in &outcome.difference {
        println!("  {line}");
    }
    println!(
        "kloop: {} step(s) ({} runs), {:.0} s, confidence {:.0}%",
        outcome.steps.len(),
        outcome.steps.iter().map(|s| s.runs.len()).sum::<usize>(),
        started.elapsed().as_secs_f64(),
        outcome.confidence * 100.0
    );
    let path = env.run_dir.join("bisect.json");
    std::fs::write(&path, serde_json::to_string_pretty(&outcome)?)
        .with_context(|| format!("writing {}", path.display()))?;
    println!("kloop: report {}", path.display());
    Ok(ExitCode::SUCCESS)
}

/// Builds the tree at `dir` (kloop.config + fragments) quietly, printing
/// phases; `Err(msg)` on any failure, with BUILD failures marked.
fn build_tree(
    layout: &Layout,
    dir: &std::path::Path,
    fragments: &[PathBuf],
) -> std::result::Result<kloop_kernels::build::BuiltKernel, String> {
    let req = kloop_kernels::build::BuildRequest {
        source: kloop_kernels::build::SourceSpec::Tree(dir.to_path_buf()),
        patches: Vec::new(),
        kloop_fragment: layout.kernels().join("configs/kloop.config"),
        fragments: fragments.to_vec(),
        base: Default::default(),
        jobs: suite::default_jobs(),
        fetch: Default::default(),
    };
    let cache = KernelCache::default_location().map_err(|e| e.to_string())?;
    let mut progress = build_progress::BuildProgress::new(&dir.display().to_string());
    let r = kloop_kernels::build::build(&cache, &req, &mut |e| progress.event(e));
    progress.finish();
    r.map_err(|e| {
        if e.is_build_failure() {
            format!("BUILD FAILED: {e}")
        } else {
            e.to_string()
        }
    })
}

fn tree_kernel(
    layout: &Layout,
    k: &kloop_kernels::build::BuiltKernel,
) -> Result<kloop::run::trial::KernelUnderTest> {
    let catalog = Catalog::load(&layout.kernels())?;
    Ok(kloop::run::trial::KernelUnderTest::Image(
        kloop::run::trial::LocalKernel::built(k, None).with_series_of(&k.record.release, &catalog),
    ))
}

/// `bisect --tree`: the ends evaluated here, then `git bisect run` with
/// `bisect-step` in a worktree.
fn bisect_tree(a: BisectArgs) -> Result<ExitCode> {
    use kloop::judge::bisect::{classify, Observation, Predicate, RunClass};
    use kloop_kernels::build::git::{git, Worktree};
    let layout = layout();
    let repo = a
        .tree
        .clone()
        .expect("checked by the caller")
        .canonicalize()?;
    let predicate =
        Predicate::parse(&a.predicate, a.label.as_deref()).map_err(anyhow::Error::msg)?;
    let all = kloop::scenario::load_all(&layout.scenarios())?;
    let scenario = kloop::scenario::select(&all, std::slice::from_ref(&a.scenario))?.remove(0);
    let old = git(
        &repo,
        &["rev-parse", "--verify", &format!("{}^{{commit}}", a.old)],
    )?;
    let new = git(
        &repo,
        &["rev-parse", "--verify", &format!("{}^{{commit}}", a.new)],
    )?;
    let cache = KernelCache::default_location()?;
    let slot: String = {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        repo.hash(&mut h);
        format!("{:016x}", h.finish())
    };
    let wt_dir = cache.root().join("build/bisect").join(slot).join("tree");
    kloop::run::signals::install();
    std::env::set_var("INSTA_OUTPUT", "none");
    let worktree = Worktree::add(&repo, &wt_dir, &old)?;
    let opts = EnvOptions {
        accel: a.accel,
        ..EnvOptions::default()
    };
    let env = suite::prepare_env(&layout, &opts, &[])?;
    println!("kloop: accelerator: {}", accel_line(&env.accel));
    println!(
        "kloop: bisect {} over {}..{} in a worktree of {} ({}); predicate {}, {} run(s) per step",
        scenario.name,
        &old[..12],
        &new[..12],
        repo.display(),
        worktree.dir.display(),
        a.predicate,
        a.repeat
    );
    let band = if scenario.vm.icount && env.accel.accel() == kloop_qemu::Accel::Tcg {
        kloop::judge::overhead::ICOUNT_TOLERANCE
    } else {
        kloop::judge::overhead::REAL_TIME_MEDIAN_TOLERANCE
    };
    let jobs = a.jobs.unwrap_or_else(suite::default_jobs);
    let started = std::time::Instant::now();
    let observe_end = |rev: &str| -> Result<Vec<Observation>> {
        git(&worktree.dir, &["checkout", "--quiet", "--detach", rev])?;
        let t = std::time::Instant::now();
        let built = build_tree(&layout, &worktree.dir, &a.fragments)
            .map_err(|e| anyhow::anyhow!("the end {rev} must build: {e}"))?;
        println!(
            "kloop: {} built as built:{} in {:.0} s",
            &rev[..12],
            built.record.id,
            t.elapsed().as_secs_f64()
        );
        let kernel = tree_kernel(&layout, &built)?;
        let (obs, results) = kloop::run::bisect::observe_kernel(
            &env,
            &scenario,
            &kernel,
            &predicate,
            a.repeat as usize,
            jobs,
        );
        for r in &results {
            println!("{}", report::trial_line(r));
        }
        Ok(obs)
    };
    let old_obs = observe_end(&old)?;
    let reference = old_obs
        .iter()
        .find(|o| !matches!(o, Observation::NoVerdict(_)))
        .cloned()
        .with_context(|| format!("the old end {} reached no verdict", &old[..12]))?;
    let new_obs = observe_end(&new)?;
    if !new_obs
        .iter()
        .any(|o| classify(&reference, o, band) == RunClass::New)
    {
        bail!(
            "the new end {} is not new under {}: nothing to bisect",
            &new[..12],
            a.predicate
        );
    }
    let reference_path = env.run_dir.join("bisect-reference.json");
    std::fs::write(&reference_path, serde_json::to_string(&reference)?)?;
    let steps_log = env.run_dir.join("bisect-steps.log");
    git(
        &worktree.dir,
        &[
            "bisect",
            "start",
            "--term-old=old",
            "--term-new=new",
            &new,
            &old,
        ],
    )?;
    let exe = std::env::current_exe()?;
    let mut cmd = std::process::Command::new("git");
    cmd.arg("-C")
        .arg(&worktree.dir)
        .args(["bisect", "run"])
        .arg(&exe)
        .arg("bisect-step")
        .arg("--tree")
        .arg(&worktree.dir)
        .args(["--scenario", &scenario.name, "--predicate", &a.predicate])
        .args([
            "--repeat",
            &a.repeat.to_string(),
            "--band",
            &band.to_string(),
        ])
        .arg("--reference")
        .arg(&reference_path)
        .arg("--steps-log")
        .arg(&steps_log)
        .args(["--accel", &a.accel.to_string()]);
    if let Some(l) = &a.label {
        cmd.args(["--label", l]);
    }
    for f in &a.fragments {
        cmd.arg("--config")
            .arg(f.canonicalize().unwrap_or_else(|_| f.clone()));
    }
    let status = cmd.status().context("running git bisect run")?;
    let log = git(&worktree.dir, &["bisect", "log"]).unwrap_or_default();
    std::fs::write(env.run_dir.join("bisect.log"), &log)?;
    let first = git(&worktree.dir, &["rev-parse", "refs/bisect/new"]).ok();
    println!();
    if !status.success() {
        println!(
            "kloop: git bisect run ended with {status}; see {}",
            env.run_dir.display()
        );
    }
    if let Some(first) = first {
        let subject = git(&repo, &["log", "-1", "--format=%h %s", &first])?;
        println!("first new commit: {subject}");
    }
    println!(
        "kloop: {:.0} s; steps in {}, git's log in {}",
        started.elapsed().as_secs_f64(),
        steps_log.display(),
        env.run_dir.join("bisect.log").display()
    );
    drop(worktree);
    Ok(ExitCode::SUCCESS)
}

/// `bisect-step`: what `git bisect run` calls. Exit 0 old, 1 new, 125 skip.
fn bisect_step(a: BisectStepArgs) -> Result<ExitCode> {
    use kloop::judge::bisect::{classify, decide, Observation, Predicate, StepVerdict};
    use kloop_kernels::build::git::git;
    let layout = layout();
    let head = git(&a.tree, &["log", "-1", "--format=%h %s"])?;
    let log_line = |line: &str| {
        use std::io::Write;
        println!("kloop: step {line}");
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&a.steps_log)
        {
            let _ = writeln!(f, "{line}");
        }
    };
    let t = std::time::Instant::now();
    let built = match build_tree(&layout, &a.tree, &a.fragments) {
        Ok(k) => k,
        Err(e) => {
            log_line(&format!(
                "{head} → skip (build: {})",
                e.lines().next().unwrap_or("")
            ));
            return Ok(ExitCode::from(125));
        }
    };
    let build_secs = t.elapsed().as_secs_f64();
    let predicate =
        Predicate::parse(&a.predicate, a.label.as_deref()).map_err(anyhow::Error::msg)?;
    let reference: Observation = serde_json::from_str(&std::fs::read_to_string(&a.reference)?)?;
    let all = kloop::scenario::load_all(&layout.scenarios())?;
    let scenario = kloop::scenario::select(&all, std::slice::from_ref(&a.scenario))?.remove(0);
    let opts = EnvOptions {
        accel: a.accel,
        ..EnvOptions::default()
    };
    let kernel = tree_kernel(&layout, &built)?;
    let env = suite::prepare_env(&layout, &opts, std::slice::from_ref(&kernel))?;
    std::env::set_var("INSTA_OUTPUT", "none");
    let t = std::time::Instant::now();
    let (obs, _) = kloop::run::bisect::observe_kernel(
        &env,
        &scenario,
        &kernel,
        &predicate,
        a.repeat as usize,
        suite::default_jobs(),
    );
    let classes: Vec<_> = obs
        .iter()
        .map(|o| classify(&reference, o, a.band))
        .collect();
    let verdict = decide(&classes);
    let (word, code) = match &verdict {
        StepVerdict::Old => ("old".to_string(), 0),
        StepVerdict::New => ("new".to_string(), 1),
        StepVerdict::Skip(why) => (format!("skip ({why})"), 125),
    };
    log_line(&format!(
        "{head} → {word} (build {build_secs:.0} s, built:{}; runs {:.1} s)",
        built.record.id,
        t.elapsed().as_secs_f64()
    ));
    Ok(ExitCode::from(code))
}
