//! The command line: every command's arguments (clap), and the small
//! conversions from arguments to the library's option values. `main.rs`
//! dispatches; each `*_cmd` module runs one command family.

use std::path::PathBuf;

use anyhow::Result;
use clap::{Args, Parser, Subcommand};
use kloop::run::suite::EnvOptions;
use kloop::workspace::Layout;
use kloop_kernels::FetchOptions;
use kloop_qemu::accel::AccelChoice;

#[derive(Parser)]
#[command(
    name = "cargo xtask",
    bin_name = "cargo xtask",
    about = "kloop: kernel-in-the-loop tests of the KSYMBOL / BPF_EVENT stream",
    after_help = after_help()
)]
pub(crate) struct Cli {
    /// Log what kloop runs (QEMU's argv, apt, cargo) on stderr; -vv for
    /// more. RUST_LOG, when set, takes precedence.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub(crate) verbose: u8,
    #[command(subcommand)]
    pub(crate) cmd: Cmd,
}

/// `--help`'s examples, and the environment variables kloop reads (from
/// the one list, `kloop::session::docs::env_vars`).
fn after_help() -> String {
    format!(
        "\
Examples:
  cargo xtask vm-test                                   every pin × every scenario
  cargo xtask vm-test --kernel 6.12 --scenario basic    one trial
  cargo xtask vm-test --arch arm64                      the arm64 matrix
  cargo xtask vm-test --kernel path/to/bzImage --snapshot-as 6.12
  cargo xtask validate --source linux-source-6.12 --patch my-fix.patch
  cargo xtask bisect --scenario many-listeners --old 6.12.43-1~bpo12+1 --new 6.12.117-1
  cargo xtask clean --keep 3

Environment:
{}  RUST_LOG                     tracing filter for -v logs (e.g. kloop_qemu=debug)",
        kloop::session::docs::environment_help()
    )
}

#[derive(Subcommand)]
pub(crate) enum Cmd {
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
    /// Judge the KSYMBOL, BPF_EVENT and LOST records of a perf.data from
    /// any host (strict layout, BPF symbol shape, register/unregister
    /// pairing): exit 0 clean, 1 findings, 2 unreadable.
    CheckPerfData(CheckPerfDataArgs),
    /// Join the run directories of the shards of one run (`vm-test
    /// --shard K/N`) into one run directory with the whole run's reports.
    Merge(MergeArgs),
    /// Remove old run directories (never a running one); with
    /// --saved-vms / --kernels also those parts of the kernel cache.
    Clean(CleanArgs),
    /// Write a self-contained reproducer of a trial (RUN/KERNEL/SCENARIO
    /// under target/kloop/runs, `latest/KERNEL/SCENARIO`, or a trial
    /// directory): the kernel, the initramfs, the QEMU command as run.sh,
    /// a record decoder, expected and actual streams, a plain-text report.
    /// With --standalone ID: the known bug's stand-alone C reproducer.
    Repro(ReproArgs),
    /// Which served builds of which series still carry each ledger bug with
    /// a stand-alone reproducer: the newest build of every series, a
    /// bisection inside a series whose ends disagree (its first fixed
    /// build), backport gaps; writes audit.json and kcidb.json.
    Audit(AuditArgs),
    /// The mail for a known kernel bug with its fix (kernels/fixes/),
    /// ready for `git send-email`: the patch, and below its `---` the
    /// affected builds, validate's result, the reproducer and where it
    /// reproduces.
    ReportBug(ReportBugArgs),
    /// Check this machine: QEMU, firmware, KVM, clang, perf, apt tools, the
    /// mirror, the cache; one OK/WARN/FAIL line each, with the fix.
    Doctor(DoctorArgs),
    /// Mutation testing: mutants of the kernel code that emits the records
    /// (kernels/mutation-targets.toml), each built and judged against the
    /// unmutated build like `validate`; writes the score report.
    Mutants(MutantsArgs),
    /// Boot a kernel with a scenario's guest and get a shell on its console
    /// (`kloop-run` in it runs the scenario's steps; the host prints the records).
    VmShell(VmShellArgs),
    /// Which pin × scenario is expected to be SKIPPED: derived from each
    /// scenario's `requires` and each pin's config and release, compared
    /// with kernels/expected-skips.toml (`--write` rewrites it).
    Skips(SkipsArgs),
    /// Write the reference sections of the docs that the code knows
    /// (environment variables, requirements, rules, the scenario table,
    /// the matrix) between their marker lines; --check only compares.
    Docs(DocsArgs),
    /// The kernel catalog.
    Kernels {
        #[command(subcommand)]
        cmd: KernelsCmd,
    },
}

#[derive(Args)]
pub(crate) struct MergeArgs {
    /// The shards' run directories.
    #[arg(required = true)]
    pub(crate) dirs: Vec<PathBuf>,
    /// Where the merged run goes (default: a new run directory under
    /// target/kloop/runs).
    #[arg(long)]
    pub(crate) out: Option<PathBuf>,
    /// Succeed even when every trial of every shard was skipped (by
    /// default a run that tested nothing fails).
    #[arg(long)]
    pub(crate) allow_skipped: bool,
}

#[derive(Args)]
pub(crate) struct AuditArgs {
    /// Ledger ids (kernels/known-issues.toml); default: every entry with a
    /// stand-alone reproducer (kernels/repros/).
    #[arg(value_name = "ID")]
    pub(crate) ids: Vec<String>,
    /// Only this series (`6.12`; repeatable); default: every series the
    /// mirror serves (`cargo xtask kernels available`).
    #[arg(long = "series", value_name = "X.Y")]
    pub(crate) series: Vec<String>,
    /// Boot every build the audit asks even when its answers are kept from
    /// an earlier audit (the new answers are kept).
    #[arg(long)]
    pub(crate) fresh: bool,
    /// VMs at once (default: from the host's cores).
    #[arg(long, short)]
    pub(crate) jobs: Option<usize>,
    /// The builds' architecture: `x86_64` (the default) or `arm64`
    /// (cloud-arm64 builds under TCG).
    #[arg(long, value_name = "ARCH", default_value = "x86_64", value_parser = arch_parser())]
    pub(crate) arch: ArchChoice,
    #[arg(long, default_value = "auto", value_parser = accel_parser())]
    pub(crate) accel: AccelChoice,
    #[command(flatten)]
    pub(crate) fetch: FetchArgs,
}

#[derive(Args)]
pub(crate) struct ReportBugArgs {
    /// The ledger id (kernels/known-issues.toml).
    #[arg(required_unless_present = "backport", conflicts_with = "backport")]
    pub(crate) id: Option<String>,
    /// The source whose patch to send (default: the newest series the fix
    /// has a patch for).
    #[arg(long, conflicts_with = "backport")]
    pub(crate) source: Option<String>,
    /// A ledger id: write the stable-list mail asking for its upstream fix
    /// on the --series branch, for a backport gap `audit` found (the
    /// audit's table from its kept answers, the fix folder's patch checked
    /// against linux-source-X.Y, the reproducer).
    #[arg(long, value_name = "ID", requires = "series")]
    pub(crate) backport: Option<String>,
    /// With --backport: the series that lacks the backport (`6.1`).
    #[arg(long, value_name = "X.Y", requires = "backport")]
    pub(crate) series: Option<String>,
    /// Where to write it (default: target/kloop/report-bug/<fix>-<source>.mail,
    /// with --backport <reproducer>-backport-<X.Y>.mail).
    #[arg(long)]
    pub(crate) out: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) fetch: FetchArgs,
}

#[derive(Args)]
pub(crate) struct ReproArgs {
    /// The trial, e.g. `latest/6.1/many-listeners`.
    #[arg(required_unless_present = "standalone", conflicts_with = "standalone")]
    pub(crate) trial: Option<String>,
    /// A ledger id (kernels/known-issues.toml): write its stand-alone C
    /// reproducer (perf_event_open and bpf system calls only; exit 0 no
    /// bug, 1 bug, 77 cannot run here) as one file.
    #[arg(long, value_name = "LEDGER_ID")]
    pub(crate) standalone: Option<String>,
    /// With --standalone: build it (gcc -static) and run it in the guest on
    /// every pin and on the builds of the entry's fix (kernels/fixes/):
    /// it must reproduce on every affected pin and unpatched build and not
    /// on the others or on a build carrying the fix.
    #[arg(long, requires = "standalone")]
    pub(crate) prove: bool,
    /// With --prove: only these kernels (pins, built:ID, bzImage paths).
    #[arg(long = "kernel", value_name = "KERNEL", requires = "prove")]
    pub(crate) kernels: Vec<String>,
    /// Where to write it (default: target/kloop/repro/…).
    #[arg(long)]
    pub(crate) out: Option<PathBuf>,
    /// The guests' architecture: `x86_64` (the default) or `arm64`
    /// (Debian's cloud-arm64 pins under TCG; `ci/setup.sh --arch arm64`).
    #[arg(long, value_name = "ARCH", default_value = "x86_64", value_parser = arch_parser())]
    pub(crate) arch: ArchChoice,
    #[arg(long, default_value = "auto", value_parser = accel_parser())]
    pub(crate) accel: AccelChoice,
    #[command(flatten)]
    pub(crate) fetch: FetchArgs,
}

#[derive(Args, Clone)]
pub(crate) struct FetchArgs {
    /// Debian mirror URL (default: from the host's apt sources, or $KLOOP_MIRROR).
    #[arg(long)]
    pub(crate) mirror: Option<String>,
    /// Never download: use only the cache.
    #[arg(long)]
    pub(crate) offline: bool,
}

impl FetchArgs {
    pub(crate) fn options(&self) -> FetchOptions {
        FetchOptions {
            mirror: self.mirror.clone(),
            offline: self.offline,
            ..FetchOptions::default()
        }
    }
}

#[derive(Args, Clone)]
pub(crate) struct VmTestArgs {
    /// Only these kernel pins (repeatable; arm64's are `arm64/<series>`).
    #[arg(long = "kernel", value_name = "ID")]
    pub(crate) kernels: Vec<String>,
    /// The guests' architecture: `x86_64` (the default), `arm64` (Debian's
    /// cloud-arm64 pins under TCG; `ci/setup.sh --arch arm64` installs what
    /// it needs) or `all`. Picks the pins when no --kernel names them.
    #[arg(long, value_name = "ARCH", default_value = "x86_64", value_parser = arch_parser())]
    pub(crate) arch: ArchChoice,
    /// Succeed even when every trial was skipped (by default a run that
    /// tested nothing fails: a kernel lacking what the scenarios need is
    /// not a pass).
    #[arg(long)]
    pub(crate) allow_skipped: bool,
    /// Only these scenarios (repeatable).
    #[arg(long = "scenario", value_name = "NAME")]
    pub(crate) scenarios: Vec<String>,
    /// Boot this bzImage instead of the pinned kernels.
    #[arg(long, value_name = "PATH")]
    pub(crate) kernel_image: Option<PathBuf>,
    /// For a kernel that is not a pin (--kernel-image, --kernel built:ID or
    /// a path): also compare with the snapshots of this pin (or of a set
    /// blessed with `bless --as`).
    #[arg(long, value_name = "ID")]
    pub(crate) snapshot_as: Option<String>,
    /// A/B: run the scenarios on this kernel too (a pin id, built:ID or a
    /// bzImage) and report, per scenario, SAME, CHANGED, BROKEN or
    /// BASELINE-ONLY for the --kernel (or --kernel-image) candidate.
    #[arg(long, value_name = "KERNEL")]
    pub(crate) baseline: Option<String>,
    /// Accelerator: `auto` uses KVM only if a probe guest boots under it
    /// (the verdict is cached per host, kernel and QEMU), else TCG.
    #[arg(long, default_value = "auto", value_parser = accel_parser())]
    pub(crate) accel: AccelChoice,
    /// Parallel VMs, exactly (default: one per core, and up to half as
    /// many again while the host idles).
    #[arg(long, short)]
    pub(crate) jobs: Option<usize>,
    /// vCPUs per guest.
    #[arg(long, default_value_t = 2)]
    pub(crate) cpus: u32,
    /// Guest memory in MiB.
    #[arg(long, default_value_t = 512)]
    pub(crate) memory: u32,
    /// Append this word to every guest's kernel command line (repeatable),
    /// e.g. `--append initcall_debug`.
    #[arg(long, value_name = "ARG")]
    pub(crate) append: Vec<String>,
    /// How each guest starts: `saved` restores the VM of its kernel × VM
    /// shape, saved once where the agent awaits its plan (made by one cold
    /// boot, kept in the kernel cache); `cold` boots every trial through
    /// the kernel's PVH entry; `bzimage` boots the bzImage as is.
    #[arg(long, default_value = "saved", value_parser = boot_mode_parser())]
    pub(crate) boot: kloop::run::trial::BootMode,
    /// List the trials and exit.
    #[arg(long)]
    pub(crate) list: bool,
    /// Run every trial N times (round after round) and report per trial
    /// whether the verdict and the normalised stream were the same every
    /// time; a trial whose runs disagree is FLAKY and fails the run.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) repeat: u32,
    /// Run only shard K of N of the trials (1 <= K <= N), for N machines
    /// (a CI matrix); `cargo xtask merge` joins the shards' run
    /// directories. Every shard must get the same --durations (or none).
    #[arg(long, value_name = "K/N")]
    pub(crate) shard: Option<kloop::run::shard::Shard>,
    /// With --shard: balance the shards by the trial times in this
    /// results.jsonl of an earlier run (default: by count).
    #[arg(long, value_name = "FILE", requires = "shard")]
    pub(crate) durations: Option<PathBuf>,
    /// Also write the run's KCIDB document (every run directory holds one,
    /// kcidb.json) here.
    #[arg(long, value_name = "FILE")]
    pub(crate) kcidb: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) fetch: FetchArgs,
    /// With --baseline: run the baseline's trials even when a kept result
    /// of the same kernel, scenario and kloop exists.
    #[arg(long, requires = "baseline")]
    pub(crate) rerun_baseline: bool,
}

impl VmTestArgs {
    /// The VM environment these arguments ask for.
    pub(crate) fn env_options(&self) -> EnvOptions {
        EnvOptions {
            accel: self.accel,
            fetch: self.fetch.options(),
            cpus: self.cpus,
            memory_mib: self.memory,
            extra_cmdline: self.append.clone(),
            boot: self.boot,
            bless: Default::default(),
            // The kernels the selection names bring their own.
            arches: Vec::new(),
        }
    }

    /// The trials these arguments select.
    pub(crate) fn selection(&self, new_snapshot_set: bool) -> kloop::run::suite::Selection {
        kloop::run::suite::Selection {
            kernels: self.kernels.clone(),
            arches: self.arch.arches(),
            scenarios: self.scenarios.clone(),
            kernel_image: self.kernel_image.clone(),
            snapshot_as: self.snapshot_as.clone(),
            new_snapshot_set,
        }
    }

    /// The run these arguments ask for (`bless`: what the trials write).
    pub(crate) fn vm_test_options(
        &self,
        new_snapshot_set: bool,
        bless: kloop::run::trial::Bless,
    ) -> kloop::session::vm_test::VmTestOptions {
        kloop::session::vm_test::VmTestOptions {
            selection: self.selection(new_snapshot_set),
            env: EnvOptions {
                bless,
                ..self.env_options()
            },
            repeat: self.repeat as usize,
            jobs: self.jobs,
            shard: self.shard,
            durations: self.durations.clone(),
            kcidb: self.kcidb.clone(),
            allow_skipped: self.allow_skipped,
        }
    }
}

#[derive(Args, Clone)]
pub(crate) struct VmShellArgs {
    /// The kernel: a pin id, built:ID or a bzImage.
    #[arg(long, value_name = "ID")]
    pub(crate) kernel: String,
    /// The scenario whose fixtures, modules and steps the guest gets.
    #[arg(long, value_name = "NAME", default_value = "basic")]
    pub(crate) scenario: String,
    /// The guests' architecture: `x86_64` (the default) or `arm64`
    /// (Debian's cloud-arm64 pins under TCG; `ci/setup.sh --arch arm64`).
    #[arg(long, value_name = "ARCH", default_value = "x86_64", value_parser = arch_parser())]
    pub(crate) arch: ArchChoice,
    #[arg(long, default_value = "auto")]
    pub(crate) accel: AccelChoice,
    /// vCPUs.
    #[arg(long, default_value_t = 2)]
    pub(crate) cpus: u32,
    /// Guest memory in MiB.
    #[arg(long, default_value_t = 512)]
    pub(crate) memory: u32,
    /// Append this word to the kernel command line (repeatable).
    #[arg(long, value_name = "ARG")]
    pub(crate) append: Vec<String>,
    #[command(flatten)]
    pub(crate) fetch: FetchArgs,
}

#[derive(Args, Clone)]
pub(crate) struct ValidateArgs {
    /// `linux-source-X.Y` (pinned in kernels/sources/) or a kernel tree.
    #[arg(long)]
    pub(crate) source: String,
    /// The patches under test, applied in order (`patch -p1`).
    /// Without patches, validate compares the source with itself: the
    /// noise floor of the A/B (every scenario must come out SAME).
    #[arg(long = "patch", value_name = "FILE")]
    pub(crate) patches: Vec<PathBuf>,
    /// A fix of known bugs: a folder under kernels/fixes/ (named after the
    /// ledger id it fixes, or the common prefix of the ids) or a path to
    /// one. Its patch for --source is applied after --patch's, and the ids
    /// it names are expected fixed (unless --expect-fixed names them).
    #[arg(long, value_name = "NAME")]
    pub(crate) fix: Option<String>,
    /// A ledger entry the patches must fix (repeatable): exit 0 requires
    /// FIXED for each, in at least one scenario, and no other scenario
    /// changed, broken or fixed.
    #[arg(long = "expect-fixed", value_name = "ID")]
    pub(crate) expect_fixed: Vec<String>,
    /// Write the result into the ledger (kernels/known-issues.toml) under
    /// each expected entry: patch, source, FIXED or REJECTED, run.
    #[arg(long, requires = "fix")]
    pub(crate) record: bool,
    /// The kernel's own runtime checks to build into both kernels, comma-separated:
    /// `memory` (KASAN, kmemleak), `locking` (lockdep, atomic-sleep), `ub`
    /// (UBSAN bounds); each a fragment of kernels/configs/checks/, merged
    /// before --config's, and its reports judged as rules (kasan, kmemleak,
    /// lockdep, ubsan).
    #[arg(long, value_delimiter = ',', value_name = "CHECK")]
    pub(crate) checks: Vec<kloop_kernels::build::Check>,
    /// Config fragments for both builds, merged after kernels/configs/kloop.config.
    #[arg(long = "config", value_name = "FRAGMENT")]
    pub(crate) fragments: Vec<PathBuf>,
    #[arg(long, default_value = "tinyconfig")]
    pub(crate) base: kloop_kernels::build::ConfigBase,
    /// Only these scenarios (repeatable; default all).
    #[arg(long = "scenario", value_name = "NAME")]
    pub(crate) scenarios: Vec<String>,
    /// Parallel VMs and make -j, exactly (default: make -j one per core;
    /// VMs one per core and up to half as many again while the host idles).
    #[arg(long, short)]
    pub(crate) jobs: Option<usize>,
    #[arg(long, default_value = "auto", value_parser = accel_parser())]
    pub(crate) accel: AccelChoice,
    /// The architecture to build and run both kernels for (`arm64`: the
    /// cross compiler, and the guests under TCG on QEMU's `virt` board).
    #[arg(long, value_name = "ARCH", default_value = "x86_64", value_parser = arch_parser())]
    pub(crate) arch: ArchChoice,
    #[command(flatten)]
    pub(crate) fetch: FetchArgs,
    /// Run the baseline's trials even when a kept result of the same
    /// baseline kernel, scenario and kloop exists (by default such a
    /// baseline trial is reused and only the candidate runs).
    #[arg(long)]
    pub(crate) rerun_baseline: bool,
}

#[derive(Args, Clone)]
pub(crate) struct BisectArgs {
    /// The scenario each step runs.
    #[arg(long)]
    pub(crate) scenario: String,
    /// The old end: a Debian version (`kernels available`) or a pin id;
    /// with --tree, a git revision.
    #[arg(long)]
    pub(crate) old: String,
    /// The new end: a Debian version or a pin id; with --tree, a revision.
    #[arg(long)]
    pub(crate) new: String,
    /// Bisect the commits of this git tree instead (`git bisect run` in a
    /// worktree kloop removes afterwards; each step builds, boots, runs).
    #[arg(long, value_name = "PATH")]
    pub(crate) tree: Option<PathBuf>,
    /// With --tree: config fragments merged after kernels/configs/kloop.config.
    #[arg(long = "config", value_name = "FRAGMENT")]
    pub(crate) fragments: Vec<PathBuf>,
    /// What "changed" means: snapshot, rule:NAME, field:<record>.<field>
    /// (with --label), overhead:<figure>.
    #[arg(long, default_value = "snapshot")]
    pub(crate) predicate: String,
    /// The program label a field predicate reads.
    #[arg(long)]
    pub(crate) label: Option<String>,
    /// Runs per step; a step is decided only when its runs that reached a
    /// verdict agree (INFRA, TIMEOUT and boot failures never count).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) repeat: u32,
    /// Parallel VMs for the runs of a step (default: number of cores).
    #[arg(long, short)]
    pub(crate) jobs: Option<usize>,
    /// The guests' architecture: `x86_64` (the default) or `arm64`
    /// (Debian's cloud-arm64 pins under TCG; `ci/setup.sh --arch arm64`).
    #[arg(long, value_name = "ARCH", default_value = "x86_64", value_parser = arch_parser())]
    pub(crate) arch: ArchChoice,
    #[arg(long, default_value = "auto", value_parser = accel_parser())]
    pub(crate) accel: AccelChoice,
    #[command(flatten)]
    pub(crate) fetch: FetchArgs,
}

#[derive(Args, Clone)]
pub(crate) struct BisectStepArgs {
    #[arg(long)]
    pub(crate) tree: PathBuf,
    #[arg(long)]
    pub(crate) scenario: String,
    #[arg(long)]
    pub(crate) predicate: String,
    #[arg(long)]
    pub(crate) label: Option<String>,
    #[arg(long)]
    pub(crate) repeat: u32,
    /// The old end's observation (JSON).
    #[arg(long)]
    pub(crate) reference: PathBuf,
    #[arg(long)]
    pub(crate) band: f64,
    /// Appends one line per step.
    #[arg(long)]
    pub(crate) steps_log: PathBuf,
    #[arg(long = "config", value_name = "FRAGMENT")]
    pub(crate) fragments: Vec<PathBuf>,
    /// The guests' architecture: `x86_64` (the default) or `arm64`
    /// (Debian's cloud-arm64 pins under TCG; `ci/setup.sh --arch arm64`).
    #[arg(long, value_name = "ARCH", default_value = "x86_64", value_parser = arch_parser())]
    pub(crate) arch: ArchChoice,
    #[arg(long, default_value = "auto", value_parser = accel_parser())]
    pub(crate) accel: AccelChoice,
}

#[derive(Args, Clone)]
pub(crate) struct BlessArgs {
    #[command(flatten)]
    pub(crate) run: VmTestArgs,
    /// Also rewrite the overhead budgets (scenarios/<name>/budgets/<pin>.toml)
    /// from the measured figures; plain bless never touches them.
    #[arg(long)]
    pub(crate) overhead: bool,
    /// Bless a kernel that is not a pin (--kernel built:ID, --kernel-image)
    /// as a snapshot set of its own named NAME: a deliberate ABI change
    /// becomes a reviewed snapshot set, compared with `--snapshot-as NAME`.
    #[arg(long = "as", value_name = "NAME")]
    pub(crate) as_name: Option<String>,
}

#[derive(Args, Clone)]
pub(crate) struct MutantsArgs {
    /// `linux-source-X.Y` (pinned in kernels/sources/) or a kernel tree.
    #[arg(long)]
    pub(crate) source: String,
    /// Only the targets of these files (repeatable), e.g. `kernel/bpf/core.c`.
    #[arg(long = "only", value_name = "FILE")]
    pub(crate) only: Vec<String>,
    /// Judge at most N mutants, a balanced sample over files and operators.
    #[arg(long, value_name = "N", default_value_t = 48)]
    pub(crate) max: usize,
    /// Build a kernel per mutant instead of compiling each mutated file
    /// alone (compiler equivalence, duplicates, build failures) and
    /// switching the rest inside one schema kernel.
    #[arg(long)]
    pub(crate) build_each: bool,
    /// Go on from the data beside --report (a run stopped or cut short):
    /// the mutants it decided whose patch is unchanged (the same source)
    /// are kept as they are, the rest are judged, and the report covers
    /// both (its phase times are this run's).
    #[arg(long, requires = "report")]
    pub(crate) resume: bool,
    /// With --resume: judge the carried-over survivors again too (after a
    /// new scenario, rule or kernel command line that may kill them).
    #[arg(long, requires = "resume")]
    pub(crate) again_survivors: bool,
    /// List the mutants that would be judged and exit.
    #[arg(long)]
    pub(crate) list: bool,
    /// Judge only these mutants (ids as `--list` prints them; repeatable),
    /// e.g. to check that a new scenario kills a survivor.
    #[arg(long = "mutant", value_name = "ID")]
    pub(crate) mutants: Vec<String>,
    /// Only these scenarios (repeatable; default all, cheap ones first).
    #[arg(long = "scenario", value_name = "NAME")]
    pub(crate) scenarios: Vec<String>,
    /// Where to write the Markdown report (default: the run directory's
    /// mutation-score.md).
    #[arg(long, value_name = "PATH")]
    pub(crate) report: Option<PathBuf>,
    /// Judge nothing: write the report again from the mutants the run in
    /// RUN_DIR judged (its mutants.json), or from the data a --report run
    /// left beside its report (mutation-score.json beside
    /// mutation-score.md; run directories are pruned, that file is not),
    /// with the notes as they are now, e.g. after adding notes for its
    /// survivors. Give the same --source, --max and --only as that run,
    /// for the report's command line.
    #[arg(long = "from", value_name = "RUN_DIR|DATA.json")]
    pub(crate) from: Option<PathBuf>,
    /// The kernel's own runtime checks to build in, comma-separated:
    /// `memory` (KASAN, kmemleak), `locking` (lockdep, atomic-sleep), `ub`
    /// (UBSAN bounds); each a fragment of kernels/configs/checks/, merged
    /// before --config's, and its reports judged as rules (kasan, kmemleak,
    /// lockdep, ubsan).
    #[arg(long, value_delimiter = ',', value_name = "CHECK")]
    pub(crate) checks: Vec<kloop_kernels::build::Check>,
    /// Config fragments merged after kernels/configs/kloop.config.
    #[arg(long = "config", value_name = "FRAGMENT")]
    pub(crate) fragments: Vec<PathBuf>,
    #[arg(long, default_value = "tinyconfig")]
    pub(crate) base: kloop_kernels::build::ConfigBase,
    /// Parallel VMs and make -j, exactly (default: make -j one per core;
    /// VMs one per core and up to half as many again while the host idles).
    #[arg(long, short)]
    pub(crate) jobs: Option<usize>,
    /// The guests' architecture: `x86_64` (the default) or `arm64`
    /// (Debian's cloud-arm64 pins under TCG; `ci/setup.sh --arch arm64`).
    #[arg(long, value_name = "ARCH", default_value = "x86_64", value_parser = arch_parser())]
    pub(crate) arch: ArchChoice,
    #[arg(long, default_value = "auto", value_parser = accel_parser())]
    pub(crate) accel: AccelChoice,
    /// Judge only shard K of N of the chosen mutants (by count, in id
    /// order), for N machines; `--merge` joins their data into one report.
    #[arg(long, value_name = "K/N")]
    pub(crate) shard: Option<kloop::run::shard::Shard>,
    /// Join the data files (`<report>.json`, beside each shard's --report)
    /// of every shard of one mutation run into --report, with one score.
    #[arg(long = "merge", value_name = "DATA.json", requires = "report", num_args = 1..)]
    pub(crate) merge: Vec<PathBuf>,
    #[command(flatten)]
    pub(crate) fetch: FetchArgs,
}

#[derive(Args, Clone)]
pub(crate) struct CleanArgs {
    /// Keep the newest N run directories (each run keeps the newest
    /// KLOOP_KEEP_RUNS, default 10, by itself).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub(crate) keep: usize,
    /// Also remove every saved VM (made again by the next run's first
    /// trial of each kernel × VM shape).
    #[arg(long)]
    pub(crate) saved_vms: bool,
    /// Also remove fetched kernel packages, images and PVH ELFs (fetched
    /// again on use); built kernels stay.
    #[arg(long)]
    pub(crate) kernels: bool,
}

#[derive(Args, Clone)]
pub(crate) struct BenchArgs {
    /// Boots per pin.
    #[arg(long, default_value_t = 5)]
    pub(crate) runs: usize,
    /// Only these kernel pins (repeatable).
    #[arg(long = "kernel", value_name = "ID")]
    pub(crate) kernels: Vec<String>,
    /// The scenario to boot.
    #[arg(long, default_value = "basic")]
    pub(crate) scenario: String,
    /// Parallel VMs (default 1, so timings are not disturbed).
    #[arg(long, short, default_value_t = 1)]
    pub(crate) jobs: usize,
    #[arg(long, default_value = "auto", value_parser = accel_parser())]
    pub(crate) accel: AccelChoice,
    /// Append this word to every guest's kernel command line (repeatable),
    /// e.g. to compare boot options.
    #[arg(long, value_name = "ARG")]
    pub(crate) append: Vec<String>,
    /// How each guest starts: saved, cold or bzimage (see vm-test --help).
    #[arg(long, default_value = "saved", value_parser = boot_mode_parser())]
    pub(crate) boot: kloop::run::trial::BootMode,
    /// Load/unload cycles of the channel storm on the first pin (66 records
    /// each); 0 skips it.
    #[arg(long, default_value_t = 200)]
    pub(crate) channel_cycles: u32,
    /// Also time the whole matrix (`vm-test`, all pins × scenarios) with
    /// cold boots and from saved VMs, and print restore→hello per pin and
    /// where the trials' time went.
    #[arg(long)]
    pub(crate) matrix: bool,
    /// With --matrix: only the warm round (saved VMs as they are), once per
    /// architecture of --arch.
    #[arg(long, requires = "matrix")]
    pub(crate) warm: bool,
    /// With --matrix: the guests' architecture, `all` for both matrices
    /// one after the other (`x86_64` by default).
    #[arg(long, value_name = "ARCH", default_value = "x86_64", value_parser = arch_parser())]
    pub(crate) arch: ArchChoice,
    /// Only time `check-perf-data` on a perf.data of this many GiB (made
    /// once from a real recording under target/kloop/bench/): records/s,
    /// MB/s and the check's peak memory. No VM boots.
    #[arg(long, value_name = "GIB")]
    pub(crate) perf_data_gib: Option<f64>,
    /// Only say where a finished run's agent phase went: per scenario, its
    /// agent seconds summed over the kernels and its steps' seconds by
    /// step kind (from the run's results.jsonl; default: the newest run
    /// that is not running). No VM boots.
    #[arg(long, value_name = "RUN_DIR", num_args = 0..=1, default_missing_value = "latest")]
    pub(crate) steps: Option<PathBuf>,
    /// Only time `validate --source SOURCE --patch P` of a new one-line
    /// patch (a comment atop kernel/events/core.c, different every run),
    /// --runs times, with every scenario: each run's wall split into the
    /// builds, the A/B's trials (each side's trial-seconds, the baseline's
    /// reused trials) and the reports. Warm figures need the baseline built
    /// first (`cargo xtask kernels build --source SOURCE`)
    #[arg(long, value_name = "SOURCE")]
    pub(crate) validate: Option<String>,
    /// Only time a new user's first run, --runs times: the committed tree
    /// cloned into a scratch directory with an empty kloop cache and its
    /// own target directory, then `ci/setup.sh`, the host build and
    /// `vm-test` over the whole matrix (the agent build, the pins fetched,
    /// every saved VM made), each part's wall and vm-test's phase split.
    /// Needs the package mirror (the pins are downloaded again) and some
    /// 6 GiB of scratch space; cargo's registry is shared
    #[arg(long)]
    pub(crate) fresh: bool,
}

#[derive(Subcommand)]
pub(crate) enum KernelsCmd {
    /// Show the catalog and what is cached.
    List,
    /// Download and verify pinned kernels (every x86-64 pin by default; `arm64/<series>` names an arm64 one).
    Fetch {
        ids: Vec<String>,
        #[command(flatten)]
        fetch: FetchArgs,
    },
    /// Re-pin ID to the newest build its suite serves (rewrites kernels/ID.toml).
    Update {
        id: String,
        /// Keep the pinned Debian version and fill in what the pin format
        /// has gained since it was made (7.x's modules and .config
        /// packages), checking that the package's sha256 is unchanged.
        #[arg(long)]
        same_version: bool,
        #[command(flatten)]
        fetch: FetchArgs,
    },
    /// Build a kernel from a Debian source package or a local tree, with
    /// patches and config fragments; use it as `--kernel built:<id>`.
    Build(BuildArgs),
    /// The kernels `kernels build` made.
    Built,
    /// Every cloud-amd64 (with --arch arm64: cloud-arm64) build the Debian
    /// suites serve, oldest first, with which are pinned (kernels/*.toml,
    /// kernels/arm64/*.toml), in the bisection lock and cached.
    Available {
        /// Only this series (`6.12`).
        #[arg(long)]
        series: Option<String>,
        /// The builds of this architecture (`x86_64` or `arm64`).
        #[arg(long, value_name = "ARCH", default_value = "x86_64", value_parser = arch_parser())]
        arch: ArchChoice,
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
        /// The builds' architecture (`arm64`: locked as `arm64/<version>`).
        #[arg(long, value_name = "ARCH", default_value = "x86_64", value_parser = arch_parser())]
        arch: ArchChoice,
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
pub(crate) struct BuildArgs {
    /// `linux-source-X.Y` (pinned in kernels/sources/) or a kernel tree.
    #[arg(long)]
    pub(crate) source: String,
    /// Patches applied in order (`patch -p1`), on a copy: the source is never changed.
    #[arg(long = "patch", value_name = "FILE")]
    pub(crate) patches: Vec<PathBuf>,
    /// The kernel's own runtime checks to build in, comma-separated:
    /// `memory` (KASAN, kmemleak), `locking` (lockdep, atomic-sleep), `ub`
    /// (UBSAN bounds); each a fragment of kernels/configs/checks/, merged
    /// before --config's, and its reports judged as rules (kasan, kmemleak,
    /// lockdep, ubsan).
    #[arg(long, value_delimiter = ',', value_name = "CHECK")]
    pub(crate) checks: Vec<kloop_kernels::build::Check>,
    /// Config fragments merged after kernels/configs/kloop.config (a later one wins).
    #[arg(long = "config", value_name = "FRAGMENT")]
    pub(crate) fragments: Vec<PathBuf>,
    /// The base the fragments are merged onto.
    #[arg(long, default_value = "tinyconfig")]
    pub(crate) base: kloop_kernels::build::ConfigBase,
    /// make -j (default: number of cores).
    #[arg(long, short)]
    pub(crate) jobs: Option<usize>,
    /// The architecture to build for: `x86_64`, or `arm64` with Debian's
    /// cross compiler (gcc-aarch64-linux-gnu) and kernels/configs/kloop-arm64.config.
    #[arg(long, value_name = "ARCH", default_value = "x86_64", value_parser = arch_parser())]
    pub(crate) arch: ArchChoice,
    #[command(flatten)]
    pub(crate) fetch: FetchArgs,
}

impl BuildArgs {
    pub(crate) fn request(&self, layout: &Layout) -> Result<kloop_kernels::build::BuildRequest> {
        // A file that cannot be a patch is a usage error, found before any
        // build: not a BUILD FAILED after the baseline.
        for p in &self.patches {
            kloop_kernels::build::check_patch(p)?;
        }
        // A fragment line that is no option setting is refused now, not
        // after the base configuration ran.
        // The checks' fragments first: a user's --config may still refine them.
        let mut checks = self.checks.clone();
        checks.sort();
        checks.dedup();
        let fragments: Vec<PathBuf> = checks
            .iter()
            .map(|c| c.fragment(&layout.kernels()))
            .chain(self.fragments.iter().cloned())
            .collect();
        kloop_kernels::build::read_fragments(&fragments)?;
        let source = kloop_kernels::build::SourceSpec::parse(&self.source, &layout.kernels())?;
        let arch = match self.arch {
            ArchChoice::One(arch) => arch,
            ArchChoice::All => {
                anyhow::bail!("a kernel is built for one architecture: --arch x86_64 or arm64")
            }
        };
        let plain =
            kloop_kernels::build::BuildRequest::new(source, &layout.kernels()).for_arch(arch);
        Ok(kloop_kernels::build::BuildRequest {
            fragments,
            base: self.base,
            jobs: self.jobs.unwrap_or(plain.jobs),
            fetch: self.fetch.options(),
            // Each check's positive control is built with the kernel
            // (kernels/controls/, run by kloop::run::controls).
            controls: (!checks.is_empty()).then(|| layout.kernels().join("controls")),
            ..plain.with_patches(self.patches.clone())
        })
    }
}

/// `--accel`: one of [`AccelChoice::NAMES`], listed in `--help`.
fn accel_parser() -> impl clap::builder::TypedValueParser<Value = AccelChoice> {
    use clap::builder::TypedValueParser;
    clap::builder::PossibleValuesParser::new(AccelChoice::NAMES).map(|s| {
        s.parse()
            .expect("PossibleValuesParser passes only listed names")
    })
}

/// `--boot`: one of [`kloop::run::trial::BootMode::NAMES`], listed in
/// `--help` and in clap's error for anything else.
/// `--arch`: one guest architecture, or every one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ArchChoice {
    One(kloop::Arch),
    All,
}

impl ArchChoice {
    /// The one architecture a command that runs on one takes.
    pub(crate) fn one(self, command: &str) -> anyhow::Result<kloop::Arch> {
        match self {
            ArchChoice::One(a) => Ok(a),
            ArchChoice::All => {
                anyhow::bail!("{command} runs on one architecture: --arch x86_64 or arm64")
            }
        }
    }

    pub(crate) fn arches(self) -> Vec<kloop::Arch> {
        match self {
            ArchChoice::One(a) => vec![a],
            ArchChoice::All => kloop::Arch::ALL.to_vec(),
        }
    }
}

fn arch_parser() -> impl clap::builder::TypedValueParser<Value = ArchChoice> {
    use clap::builder::TypedValueParser;
    clap::builder::PossibleValuesParser::new(["x86_64", "arm64", "all"])
        .map(|s| kloop::Arch::parse(&s).map_or(ArchChoice::All, ArchChoice::One))
}

fn boot_mode_parser() -> impl clap::builder::TypedValueParser<Value = kloop::run::trial::BootMode> {
    use clap::builder::TypedValueParser;
    clap::builder::PossibleValuesParser::new(kloop::run::trial::BootMode::NAMES).map(|s| {
        s.parse()
            .expect("PossibleValuesParser passes only listed names")
    })
}

#[derive(Args, Clone)]
pub(crate) struct DoctorArgs {
    /// Forget the cached KVM verdict and boot the probe guest again (after
    /// enabling virtualisation, say: the cache key, host kernel and QEMU
    /// version, has not changed).
    #[arg(long)]
    pub(crate) recheck: bool,
    /// Seconds one suite's Release file may take to arrive from the mirror.
    #[arg(long, default_value_t = 5)]
    pub(crate) mirror_timeout: u64,
    #[command(flatten)]
    pub(crate) fetch: FetchArgs,
}

#[derive(Args, Clone)]
pub(crate) struct SkipsArgs {
    /// Rewrite kernels/expected-skips.toml with the derived list (its
    /// `probe` entries kept).
    #[arg(long, conflicts_with = "check")]
    pub(crate) write: bool,
    /// Compare only (the default): exit 1 when the file differs.
    #[arg(long)]
    pub(crate) check: bool,
    #[command(flatten)]
    pub(crate) fetch: FetchArgs,
}

#[derive(Args, Clone)]
pub(crate) struct CheckPerfDataArgs {
    /// The perf.data file.
    pub(crate) file: PathBuf,
    /// The result as JSON on stdout.
    #[arg(long)]
    pub(crate) json: bool,
}

/// One command of the xtask: what runs its flags. Each command's file
/// (`<command>_cmd.rs`) implements it for its own flags, so main.rs's
/// dispatch names no module and cannot call another command's.
pub(crate) trait Run {
    fn run(self) -> anyhow::Result<std::process::ExitCode>;
}

#[derive(Args, Clone)]
pub(crate) struct DocsArgs {
    /// Write nothing: exit 1 when a generated section is stale.
    #[arg(long)]
    pub(crate) check: bool,
}
