//! Stand-alone reproducers of known kernel bugs (`kernels/repros/`): one
//! C file per bug family using only the perf_event_open and bpf system
//! calls, written out as a single file (`repro --standalone`), and proven
//! on each kernel (`--prove`) in two environments: inside kloop's guest (a
//! trial whose step runs it), and in a stock one ([`stock`]: the only
//! program of a plain busybox initramfs, default limits, no kloop agent),
//! which is how a maintainer runs it and what shows that it stands alone.
//!
//! A reproducer is named like a fix folder: after the ledger id it
//! reproduces, or the common prefix of the ids (`interpreted-prog-ksymbol`
//! covers `-register` and `-unregister`). Its exit status is the verdict:
//! 0 the bug does not show, 1 it shows (the offending records printed),
//! 77 it could not run on this kernel (the reason printed).

pub mod stock;

use std::path::{Path, PathBuf};

use kloop_path_io::{PathIo, PathIoExt};

use crate::judge::check::rule;
use crate::judge::known_issues::{Issue, Ledger};
use crate::run::trial::{TrialResult, Verdict};
use crate::scenario::Scenario;

/// Where reproducers live, under the catalog directory (`kernels/`).
pub const REPROS_DIR: &str = "repros";
/// The header every reproducer includes; pasted into the single file.
pub const SHARED_HEADER: &str = "repro.h";
/// Where the guest finds the reproducer.
pub const GUEST_PATH: &str = "/usr/bin/kloop-repro";

/// Why a reproducer could not be found or written.
#[derive(Debug, thiserror::Error)]
pub enum StandaloneError {
    #[error("no ledger entry `{id}`; the ledger's ids: {known}")]
    UnknownId { id: String, known: String },
    #[error("no reproducer for {id} in {dir} (a `<id>.c`, or `<prefix>.c` for a prefix of it); the reproducers there: {known}")]
    NoReproducer {
        id: String,
        dir: PathBuf,
        known: String,
    },
    #[error("the reproducer's scenario: {message}")]
    Scenario { message: String },
    #[error("the plain init (stock environment): {0}")]
    Stock(String),
    #[error(transparent)]
    Io(#[from] PathIo),
    #[error(transparent)]
    Suite(#[from] crate::run::suite::SuiteError),
    #[error(transparent)]
    Kernel(#[from] kloop_kernels::KernelError),
    #[error(transparent)]
    Build(#[from] kloop_kernels::build::BuildError),
    #[error(transparent)]
    Fix(#[from] crate::run::fixes::FixError),
}

/// A reproducer found for a ledger id.
#[derive(Debug, Clone)]
pub struct Reproducer {
    /// Its name (the file's stem): an id, or the prefix of the ids.
    pub name: String,
    pub source: PathBuf,
    /// The ledger entries it reproduces (every id it names or prefixes).
    pub issues: Vec<Issue>,
}

/// Finds the reproducer of ledger entry `id`.
pub fn find(kernels: &Path, ledger: &Ledger, id: &str) -> Result<Reproducer, StandaloneError> {
    let ids: Vec<&str> = ledger.issues.iter().map(|i| i.id.as_str()).collect();
    if !ids.contains(&id) {
        return Err(StandaloneError::UnknownId {
            id: id.to_string(),
            known: ids.join(", "),
        });
    }
    let dir = kernels.join(REPROS_DIR);
    let names: Vec<String> =
        crate::run::fixes::list(&dir, |p| p.extension().is_some_and(|x| x == "c"))
            .into_iter()
            .map(|f| f.trim_end_matches(".c").to_string())
            .collect();
    let name = names
        .iter()
        .find(|n| crate::run::fixes::names_entry(n, id))
        .cloned()
        .ok_or_else(|| StandaloneError::NoReproducer {
            id: id.to_string(),
            dir: dir.clone(),
            known: if names.is_empty() {
                "none".into()
            } else {
                names.join(", ")
            },
        })?;
    let issues = ledger
        .issues
        .iter()
        .filter(|i| crate::run::fixes::names_entry(&name, &i.id))
        .cloned()
        .collect();
    Ok(Reproducer {
        source: dir.join(format!("{name}.c")),
        name,
        issues,
    })
}

impl Reproducer {
    /// The pins the ledger says the bug shows on (every entry's).
    pub fn affected_pins(&self) -> Vec<String> {
        let mut pins: Vec<String> = self
            .issues
            .iter()
            .flat_map(|i| i.pins.iter().cloned())
            .collect();
        pins.sort();
        pins.dedup();
        pins
    }

    /// The single C file: a header naming the bug and how to run it, the
    /// shared header pasted where the source includes it.
    pub fn single_file(&self) -> Result<String, StandaloneError> {
        let read = |path: &Path| std::fs::read_to_string(path).at("reading", path);
        let source = read(&self.source)?;
        let header_path = self.source.with_file_name(SHARED_HEADER);
        let header = read(&header_path)?;
        let include = format!("#include \"{SHARED_HEADER}\"");
        let body = source.replace(
            &include,
            &format!(
                "/* ---- {SHARED_HEADER}, pasted ---- */\n{}\n/* ---- end of {SHARED_HEADER} ---- */",
                header.trim_end()
            ),
        );
        let mut out = String::new();
        out.push_str(&format!(
            "/*\n * Stand-alone reproducer, written by kloop (`cargo xtask repro --standalone {}`).\n",
            self.issues.first().map_or(self.name.as_str(), |i| i.id.as_str())
        ));
        for i in &self.issues {
            out.push_str(&format!(
                " * Ledger entry {} ({} bug; affected pins: {}).\n",
                i.id,
                i.component,
                i.pins.join(", ")
            ));
        }
        out.push_str(&format!(
            " *\n * Build: gcc -static -O2 -Wall -o {0} {0}.c\n * Run as root: ./{0}; echo $?\n *   0  the bug does not show\n *   1  it shows (the offending records are printed)\n *  77  it cannot run on this kernel (the reason is printed)\n */\n",
            self.name
        ));
        out.push_str(&body);
        Ok(out)
    }

    /// The scenario that runs the single file `file` in the guest.
    pub fn scenario(
        &self,
        file: &Path,
        dir: &Path,
    ) -> Result<Scenario, crate::scenario::ScenarioInvalid> {
        let text = format!(
            "description = \"stand-alone reproducer {name}\"\nsnapshot = false\n\
             [[programs]]\nsource = {source:?}\nguest = \"{GUEST_PATH}\"\n\
             [[steps]]\nop = \"run-program\"\npath = \"{GUEST_PATH}\"\ntimeout_ms = 120000\n",
            name = self.name,
            source = file.display().to_string(),
        );
        Scenario::parse(&format!("repro-{}", self.name), dir, &text)
    }
}

/// What `repro --standalone --prove` found, kept as `repro-proof.json` in
/// its run directory (the bug report quotes it).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ReproProof {
    /// The reproducer's name.
    pub reproducer: String,
    pub kernels: Vec<KernelProof>,
    /// Every kernel answered as expected.
    pub as_expected: bool,
}

/// One kernel's answer.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct KernelProof {
    /// `6.1`, `linux-source-6.12 + the fix, built:…`.
    pub kernel: String,
    /// The guest's `uname -r`, when it booted.
    pub release: Option<String>,
    /// `reproduces`, `does not reproduce`, `cannot run`, `no answer`.
    pub outcome: String,
    /// `reproduce` or `not reproduce`.
    pub expected: String,
    /// Both environments answered as expected (kloop's guest and, when it
    /// ran, the stock one).
    pub as_expected: bool,
    /// The same kernel with the reproducer as the only program of a plain
    /// initramfs ([`stock`]); absent from proofs made before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stock: Option<StockProof>,
}

impl KernelProof {
    /// Whether kloop's guest answered as expected ([`KernelProof::as_expected`]
    /// covers both environments).
    pub fn expect_met_in_guest(&self) -> bool {
        match self.expected.as_str() {
            "reproduce" => self.outcome == "reproduces",
            "not reproduce" => self.outcome == "does not reproduce",
            "cannot run" => self.outcome == "cannot run",
            _ => true,
        }
    }
}

/// One kernel's answer in the stock environment.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StockProof {
    /// `reproduces`, `does not reproduce`, `cannot run`, `no answer`.
    pub outcome: String,
    /// The reproducer's exit status, as `/init` printed it.
    pub exit_status: Option<i32>,
    /// `ulimit -l` in `/init` (KiB): the kernel's default.
    pub memlock: Option<String>,
    pub as_expected: bool,
}

/// The file name of a proof in its run directory.
pub const PROOF_FILE: &str = "repro-proof.json";

/// Where the newest proof of each reproducer is kept beside the run
/// directories (`target/kloop/proofs/<name>.json`): run directories are
/// pruned past `KLOOP_KEEP_RUNS`, and a proof must outlive its run for
/// `report-bug` to quote it.
pub fn kept_proof_path(runs: &Path, name: &str) -> PathBuf {
    runs.parent()
        .unwrap_or(runs)
        .join("proofs")
        .join(format!("{name}.json"))
}

/// The newest proof of reproducer `name`: in the run directories under
/// `runs`, or the copy kept outside them ([`kept_proof_path`]). Returns
/// the file and the proof.
pub fn latest_proof(runs: &Path, name: &str) -> Option<(PathBuf, ReproProof)> {
    let kept = kept_proof_path(runs, name);
    let mut found: Vec<(std::time::SystemTime, PathBuf, ReproProof)> = std::fs::read_dir(runs)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join(PROOF_FILE))
        .chain(std::iter::once(kept))
        .filter_map(|path| {
            let modified = std::fs::metadata(&path).and_then(|m| m.modified()).ok()?;
            let proof: ReproProof =
                serde_json::from_str(&std::fs::read_to_string(&path).ok()?).ok()?;
            (proof.reproducer == name).then_some((modified, path, proof))
        })
        .collect();
    found.sort_by_key(|(t, _, _)| *t);
    found.pop().map(|(_, path, proof)| (path, proof))
}

/// What a kernel must do with the reproducer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// An affected pin, or a source without the fix.
    Reproduce,
    /// An unaffected pin, or a build carrying the fix.
    Pass,
    /// A kernel whose `.config` lacks an option the reproducer says it
    /// needs ([`Reproducer::needs`]): it must exit 77, whatever the
    /// ledger says of the kernel (the Debian pins have no fault
    /// injection, so a fail-nth reproducer cannot run there).
    CannotRun,
}

impl Expect {
    /// `reproduce` / `not reproduce` / `cannot run`.
    pub fn label(self) -> &'static str {
        match self {
            Expect::Reproduce => "reproduce",
            Expect::Pass => "not reproduce",
            Expect::CannotRun => "cannot run",
        }
    }

    fn met_by(self, o: &ReproOutcome) -> bool {
        matches!(
            (self, o),
            (Expect::Reproduce, ReproOutcome::Reproduces(_))
                | (Expect::Pass, ReproOutcome::DoesNotReproduce)
                | (Expect::CannotRun, ReproOutcome::CannotRun(_))
        )
    }
}

/// The line of a reproducer's source that names the kernel options it
/// cannot run without: `kloop-needs: CONFIG_A CONFIG_B`.
pub const NEEDS_MARK: &str = "kloop-needs:";

/// The `CONFIG_` options `source` declares it needs ([`NEEDS_MARK`]).
pub fn needs_of(source: &str) -> Vec<String> {
    source
        .lines()
        .filter_map(|l| l.split_once(NEEDS_MARK).map(|(_, rest)| rest))
        .flat_map(|rest| rest.split_whitespace())
        .filter(|w| w.starts_with("CONFIG_"))
        .map(|w| w.trim_end_matches([',', '.', ')']).to_string())
        .collect()
}

/// `expect`, unless `config` lacks one of `needs`: then the reproducer
/// must say it cannot run (with the option it lacks, returned).
pub fn expectation_for(
    expect: Expect,
    needs: &[String],
    config: Option<&kloop_kernels::config::KernelConfig>,
) -> (Expect, Option<String>) {
    match config.and_then(|c| needs.iter().find(|n| !c.is_enabled(n))) {
        Some(missing) => (Expect::CannotRun, Some(missing.clone())),
        None => (expect, None),
    }
}

/// One kernel of a proof: the kernel, what it must do, how reports name it.
#[derive(Debug, Clone)]
pub struct ProofKernel {
    pub kernel: crate::run::trial::KernelUnderTest,
    /// `None`: a kernel the ledger and the fix say nothing about (a
    /// `--kernel built:ID` the user named): its answer is reported only.
    pub expect: Option<Expect>,
    pub label: String,
}

/// The kernels a proof of `r` runs on. With `specs` (`--kernel`), those,
/// expected to reproduce or not when they are pins the ledger speaks of.
/// Otherwise every pin (affected ones must reproduce, the others not) and,
/// for each patch of the reproducer's fix folder, its source built without
/// it (must reproduce) and with it (must not), through `build` (which
/// draws the build and says why it failed); `None` when a build failed.
pub fn proof_kernels(
    layout: &crate::workspace::Layout,
    r: &Reproducer,
    specs: &[String],
    arch: kloop_protocol::Arch,
    fetch: &kloop_kernels::FetchOptions,
    build: &mut dyn FnMut(
        &kloop_kernels::build::BuildRequest,
        &str,
    ) -> Option<kloop_kernels::build::BuiltKernel>,
) -> Result<Option<Vec<ProofKernel>>, StandaloneError> {
    use crate::run::trial::KernelUnderTest;
    // Every architecture's pins: a built kernel is judged by the pin of
    // its series and architecture, and `--kernel arm64/6.12` names one.
    let catalog = kloop_kernels::Catalog::load_all(&layout.kernels())?;
    let affected = r.affected_pins();
    let pin_expect = |id: &str| {
        catalog.get(id).ok().map(|_| {
            if affected.iter().any(|p| p == id) {
                Expect::Reproduce
            } else {
                Expect::Pass
            }
        })
    };
    if !specs.is_empty() {
        return specs
            .iter()
            .map(|spec| {
                let spec = crate::run::suite::pin_id_for(&catalog, spec, arch);
                Ok(ProofKernel {
                    kernel: crate::run::suite::resolve_kernel(&catalog, &spec, None)?,
                    expect: pin_expect(&spec),
                    label: spec,
                })
            })
            .collect::<Result<Vec<_>, StandaloneError>>()
            .map(Some);
    }
    let mut kernels: Vec<ProofKernel> = catalog
        .pins()
        .iter()
        .filter(|p| p.arch() == arch)
        .map(|p| ProofKernel {
            kernel: KernelUnderTest::Pin(p.clone()),
            expect: pin_expect(&p.id),
            label: p.id.clone(),
        })
        .collect();
    let folder = layout
        .kernels()
        .join(crate::run::fixes::FIXES_DIR)
        .join(&r.name);
    for (source, patch) in crate::run::fixes::patches_of(&folder) {
        let spec = kloop_kernels::build::SourceSpec::parse(&source, &layout.kernels())?;
        let base_req = kloop_kernels::build::BuildRequest {
            fetch: fetch.clone(),
            ..kloop_kernels::build::BuildRequest::new(spec, &layout.kernels()).for_arch(arch)
        };
        // The fix's base (fix.toml) beneath both, as validate builds them.
        let beneath = crate::run::fixes::base_of(&layout.kernels(), &folder, &source)?;
        let base_req = base_req.with_patches(beneath.clone());
        let fixed_req = base_req.with_patches(beneath.into_iter().chain([patch.clone()]).collect());
        for (req, expect, what) in [
            (base_req, Expect::Reproduce, format!("{source} (unpatched)")),
            (fixed_req, Expect::Pass, format!("{source} + the fix")),
        ] {
            let Some(built) = build(&req, &what) else {
                return Ok(None);
            };
            kernels.push(ProofKernel {
                kernel: KernelUnderTest::Image(crate::run::trial::LocalKernel::built(
                    &built, None, &catalog,
                )),
                expect: Some(expect),
                label: format!("{what}, built:{}", built.record.id),
            });
        }
    }
    Ok(Some(kernels))
}

/// What a proof ran: the proof, and per kernel (in `kernels`' order) the
/// outcome in kloop's guest, in the stock environment, and the trial.
pub struct ProofRun {
    pub proof: ReproProof,
    pub guest: Vec<ReproOutcome>,
    pub stock: Vec<stock::StockRun>,
    pub results: Vec<TrialResult>,
}

/// Runs the single file `file` on every kernel of `kernels`, in the guest
/// (in parallel VMs) and then in the stock environment ([`stock::run`],
/// as many VMs at once), judges each answer against its expectation, and
/// keeps the proof as `repro-proof.json` in the run directory.
/// `on_result` sees each trial as it ends, `on_stock` each stock run.
/// `kernels` with each expectation fitted to the kernel's configuration: a
/// kernel built without what the reproducer needs must say so (77), whatever
/// the ledger expects of its code.
fn expecting_what_is_built(
    r: &Reproducer,
    env: &crate::run::trial::TrialEnv,
    kernels: &[ProofKernel],
) -> Vec<ProofKernel> {
    let needs = std::fs::read_to_string(&r.source)
        .map(|s| needs_of(&s))
        .unwrap_or_default();
    kernels
        .iter()
        .map(|k| {
            let mut k = k.clone();
            if let Some(e) = k.expect {
                let config = k.kernel.config(env).ok();
                let (e, missing) = expectation_for(e, &needs, config.as_deref());
                k.expect = Some(e);
                if let Some(m) = missing {
                    k.label = format!("{} ({m} not set)", k.label);
                }
            }
            k
        })
        .collect()
}

pub fn prove(
    r: &Reproducer,
    file: &Path,
    env: &crate::run::trial::TrialEnv,
    kernels: &[ProofKernel],
    on_result: &(dyn Fn(&TrialResult) + Sync),
    on_stock: &(dyn Fn(&ProofKernel, &stock::StockRun) + Sync),
) -> Result<ProofRun, StandaloneError> {
    let scenario = r
        .scenario(file, &env.run_dir)
        .map_err(|e| StandaloneError::Scenario {
            message: e.to_string(),
        })?;
    let trials: Vec<crate::run::suite::PlannedTrial> = kernels
        .iter()
        .map(|k| crate::run::suite::PlannedTrial {
            kernel: k.kernel.clone(),
            scenario: scenario.clone(),
        })
        .collect();
    let kernels = &expecting_what_is_built(r, env, kernels)[..];
    let parallel = crate::run::suite::Parallel::host_default();
    let results = crate::run::suite::run_all(env, &trials, parallel, on_result);
    let outcomes: Vec<ReproOutcome> = results.iter().map(ReproOutcome::of).collect();
    let stock_runs = run_stock(r, file, env, kernels, parallel.vms.max(1), on_stock)?;
    let proofs: Vec<KernelProof> = kernels
        .iter()
        .zip(&results)
        .zip(outcomes.iter().zip(&stock_runs))
        .map(|((k, result), (outcome, s))| {
            let guest_ok = k.expect.is_none_or(|e| e.met_by(outcome));
            let stock_ok = k.expect.is_none_or(|e| e.met_by(&s.outcome));
            KernelProof {
                kernel: k.label.clone(),
                release: result
                    .guest_release
                    .clone()
                    .or_else(|| s.answer.release.clone()),
                outcome: outcome.label().to_string(),
                expected: k
                    .expect
                    .map_or("(no expectation)", Expect::label)
                    .to_string(),
                as_expected: guest_ok && stock_ok,
                stock: Some(StockProof {
                    outcome: s.outcome.label().to_string(),
                    exit_status: s.answer.status,
                    memlock: s.answer.memlock.clone(),
                    as_expected: stock_ok,
                }),
            }
        })
        .collect();
    let proof = ReproProof {
        reproducer: r.name.clone(),
        as_expected: proofs.iter().all(|p| p.as_expected),
        kernels: proofs,
    };
    let json = serde_json::to_string_pretty(&proof).expect("a proof serialises");
    let runs = env.run_dir.parent().unwrap_or(&env.run_dir);
    for path in [env.run_dir.join(PROOF_FILE), kept_proof_path(runs, &r.name)] {
        kloop_kernels::write_atomically(&path, json.as_bytes()).at("writing", path)?;
    }
    Ok(ProofRun {
        proof,
        guest: outcomes,
        stock: stock_runs,
        results,
    })
}

/// [`stock::run`] on every kernel, `vms` at a time; each run's files in
/// `<run>/stock/<n>-<kernel id>/`.
fn run_stock(
    r: &Reproducer,
    file: &Path,
    env: &crate::run::trial::TrialEnv,
    kernels: &[ProofKernel],
    vms: usize,
    on_stock: &(dyn Fn(&ProofKernel, &stock::StockRun) + Sync),
) -> Result<Vec<stock::StockRun>, StandaloneError> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;
    let next = AtomicUsize::new(0);
    let done: Mutex<Vec<Option<Result<stock::StockRun, StandaloneError>>>> =
        Mutex::new((0..kernels.len()).map(|_| None).collect());
    std::thread::scope(|scope| {
        for _ in 0..vms.min(kernels.len()) {
            scope.spawn(|| loop {
                let n = next.fetch_add(1, Ordering::SeqCst);
                let Some(k) = kernels.get(n) else { return };
                let id: String = k
                    .kernel
                    .id()
                    .chars()
                    .map(|c| {
                        if c.is_ascii_alphanumeric() || c == '.' {
                            c
                        } else {
                            '-'
                        }
                    })
                    .collect();
                let dir = env.run_dir.join("stock").join(format!("{n}-{id}"));
                let run = stock::run(env, &k.kernel, r, file, &dir);
                if let Ok(s) = &run {
                    on_stock(k, s);
                }
                done.lock().expect("no panic holds it")[n] = Some(run);
            });
        }
    });
    done.into_inner()
        .expect("no panic holds it")
        .into_iter()
        .map(|r| r.expect("every kernel ran"))
        .collect()
}

/// What a reproducer did on one kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReproOutcome {
    /// It exited 1: the bug shows. Its output.
    Reproduces(String),
    /// It exited 0.
    DoesNotReproduce,
    /// It exited 77, with its reason.
    CannotRun(String),
    /// The trial reached no answer from the program (boot failure,
    /// timeout, panic, another exit status): its verdict's headline.
    NoAnswer(String),
}

impl ReproOutcome {
    /// From the trial that ran the reproducer: its `program-exit`
    /// violation (exit 1) or its verdict.
    pub fn of(r: &TrialResult) -> ReproOutcome {
        let exit = r.violations.iter().find(|v| v.rule == rule::PROGRAM_EXIT);
        match (&r.verdict, exit) {
            (_, Some(v)) if v.message.contains(" exited 1;") => {
                ReproOutcome::Reproduces(v.message.clone())
            }
            (Verdict::Ok, None) => ReproOutcome::DoesNotReproduce,
            (Verdict::Skipped(m), None) => ReproOutcome::CannotRun(m.clone()),
            (v, _) => ReproOutcome::NoAnswer(v.headline()),
        }
    }

    /// `reproduces`, `does not reproduce`, …
    pub fn label(&self) -> &'static str {
        match self {
            ReproOutcome::Reproduces(_) => "reproduces",
            ReproOutcome::DoesNotReproduce => "does not reproduce",
            ReproOutcome::CannotRun(_) => "cannot run",
            ReproOutcome::NoAnswer(_) => "no answer",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kernel_without_what_the_reproducer_needs_must_say_it_cannot_run() {
        let needs = needs_of(
            "/*\n * kloop-needs: CONFIG_FAULT_INJECTION CONFIG_FAILSLAB\n * kloop-needs: CONFIG_FAULT_INJECTION_DEBUG_FS.\n */\nint x;\n",
        );
        assert_eq!(
            needs,
            vec![
                "CONFIG_FAULT_INJECTION",
                "CONFIG_FAILSLAB",
                "CONFIG_FAULT_INJECTION_DEBUG_FS"
            ]
        );
        let debian = kloop_kernels::KernelConfig::parse(
            "# CONFIG_FAULT_INJECTION is not set\nCONFIG_BPF=y\n",
            "debian",
        );
        let built = kloop_kernels::KernelConfig::parse(
            "CONFIG_FAULT_INJECTION=y\nCONFIG_FAILSLAB=y\nCONFIG_FAULT_INJECTION_DEBUG_FS=y\n",
            "built",
        );
        assert_eq!(
            expectation_for(Expect::Reproduce, &needs, Some(&debian)),
            (Expect::CannotRun, Some("CONFIG_FAULT_INJECTION".into()))
        );
        assert_eq!(
            expectation_for(Expect::Pass, &needs, Some(&built)),
            (Expect::Pass, None)
        );
        // No config to read: the ledger's expectation stands.
        assert_eq!(
            expectation_for(Expect::Reproduce, &needs, None),
            (Expect::Reproduce, None)
        );
        assert!(Expect::CannotRun.met_by(&ReproOutcome::CannotRun("77".into())));
        assert!(!Expect::CannotRun.met_by(&ReproOutcome::DoesNotReproduce));
    }
    use crate::run::trial::RuleHit;

    fn result(verdict: Verdict, exit_message: Option<&str>) -> TrialResult {
        TrialResult {
            violations: exit_message
                .map(|m| RuleHit {
                    rule: rule::PROGRAM_EXIT.into(),
                    message: m.into(),
                    listener: None,
                    offset: None,
                    records: vec![],
                    known_issue: None,
                    detail: None,
                })
                .into_iter()
                .collect(),
            ..TrialResult::for_test("6.1", "repro-x", verdict, "/tmp")
        }
    }

    #[test]
    fn the_exit_status_decides_the_outcome() {
        let bug = "/usr/bin/kloop-repro exited 1; its output:\nKSYMBOL register BPF addr=0xffffffff84df6230 len=0 name=\"\"";
        assert!(matches!(
            ReproOutcome::of(&result(Verdict::failed(crate::run::trial::FailureCause::Rules { rules: vec![] }, "x"), Some(bug))),
            ReproOutcome::Reproduces(m) if m.contains("len=0")
        ));
        assert_eq!(
            ReproOutcome::of(&result(Verdict::Ok, None)),
            ReproOutcome::DoesNotReproduce
        );
        assert!(matches!(
            ReproOutcome::of(&result(
                Verdict::Skipped("program …: CANNOT RUN: JIT always on".into()),
                None
            )),
            ReproOutcome::CannotRun(_)
        ));
        // Exit 2, a crash of the reproducer: no answer about the bug.
        let crashed = "/usr/bin/kloop-repro was killed by signal 11; its output:\n";
        assert!(matches!(
            ReproOutcome::of(&result(
                Verdict::failed(
                    crate::run::trial::FailureCause::Rules { rules: vec![] },
                    "x"
                ),
                Some(crashed)
            )),
            ReproOutcome::NoAnswer(_)
        ));
        assert!(matches!(
            ReproOutcome::of(&result(Verdict::Timeout("t".into()), None)),
            ReproOutcome::NoAnswer(_)
        ));
    }

    #[test]
    fn the_single_file_pastes_the_header_and_builds() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../kernels");
        let ledger_text = std::fs::read_to_string(root.join("known-issues.toml")).unwrap();
        let ledger: Ledger = Ledger {
            issues: toml::from_str::<toml::Table>(&ledger_text)
                .unwrap()
                .get("issue")
                .and_then(|v| v.as_array())
                .unwrap()
                .iter()
                .map(|v| v.clone().try_into().unwrap())
                .collect(),
            path: None,
        };
        let r = find(&root, &ledger, "interpreted-prog-ksymbol-unregister").unwrap();
        assert_eq!(r.name, "interpreted-prog-ksymbol");
        assert_eq!(r.issues.len(), 2);
        let text = r.single_file().unwrap();
        assert!(!text.contains("#include \"repro.h\""));
        assert!(text.contains("static inline void listener_open"));
        assert!(text.contains("Ledger entry interpreted-prog-ksymbol-register"));
        // The single file is what a maintainer builds: it must build alone.
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("interpreted-prog-ksymbol.c");
        std::fs::write(&file, &text).unwrap();
        let binary = crate::run::payload::c_program(&file, &dir.path().join("bin")).expect(
            "the single file builds with gcc -static (ci/setup.sh installs gcc and libc6-dev)",
        );
        assert!(binary.is_file());
        let e = find(&root, &ledger, "no-such-id").unwrap_err().to_string();
        assert!(
            e.contains("the ledger's ids: interpreted-prog-ksymbol-register"),
            "{e}"
        );
        let e = find(&root, &ledger, "perf-synthesised-main-function-name")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("no reproducer for perf-synthesised-main-function-name"),
            "{e}"
        );
    }

    /// A proof outlives its run directory: once the run is pruned, the
    /// copy kept beside the runs is found; the newest proof wins.
    #[test]
    fn a_proof_outlives_its_pruned_run() {
        let target = tempfile::tempdir().unwrap();
        let runs = target.path().join("runs");
        let proof = |as_expected: bool| ReproProof {
            reproducer: "x".into(),
            kernels: Vec::new(),
            as_expected,
        };
        let write = |path: &Path, p: &ReproProof| {
            kloop_kernels::write_atomically(path, serde_json::to_string(p).unwrap().as_bytes())
                .unwrap()
        };
        let run = runs.join("1-2");
        write(&run.join(PROOF_FILE), &proof(false));
        write(&kept_proof_path(&runs, "x"), &proof(false));
        std::fs::remove_dir_all(&run).unwrap(); // pruned
        let (path, found) = latest_proof(&runs, "x").unwrap();
        assert_eq!(path, target.path().join("proofs/x.json"));
        assert!(!found.as_expected);
        std::thread::sleep(std::time::Duration::from_millis(20));
        let newer = runs.join("3-4");
        write(&newer.join(PROOF_FILE), &proof(true));
        let (path, found) = latest_proof(&runs, "x").unwrap();
        assert_eq!(path, newer.join(PROOF_FILE));
        assert!(found.as_expected);
        assert!(latest_proof(&runs, "y").is_none());
    }
}
