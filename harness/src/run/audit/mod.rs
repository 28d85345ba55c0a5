//! `audit`: which served builds of which series still carry each ledger
//! bug that has a stand-alone reproducer.
//!
//! For every series the mirror serves (`kloop_kernels::available`, the
//! catalog `bisect` walks, in its order) the newest build answers
//! "affected now?"; where the newest and the oldest disagree, `bisect`'s
//! search ([`crate::judge::bisect::search`], through [`plan::audit_series`])
//! finds the build where the series changed, so a series costs
//! O(log n) boots. A build is booted once for every reproducer
//! ([`boot`]: the stock environment of `repro --prove`, each program's exit
//! status its answer), and a settled answer is kept ([`kept`]) so no later
//! audit boots that (build × reproducer) pair again. Across series,
//! [`plan::gaps`] names each series still affected by a bug another series
//! has fixed. The result is typed data ([`Audit`], `audit.json`); the
//! table and the KCIDB document are `report`'s.

pub mod boot;
pub mod kept;
pub mod plan;
pub mod recall;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use kloop_kernels::available::{AvailableBuild, BisectLock};
use kloop_kernels::{Catalog, KernelPin, Needs};
use kloop_path_io::{PathIo, PathIoExt};
use serde::{Deserialize, Serialize};

use crate::run::standalone::{self, StandaloneError};
use crate::run::suite::{self, EnvOptions, SuiteError};
use crate::run::trial::{KernelUnderTest, TrialEnv};
use crate::workspace::Layout;
use boot::Program;
use kept::{Kept, KeptAnswer};
use plan::{Answer, Gap, SeriesFinding, SeriesView, Unanswerable, Unanswered};

/// The file the audit writes in its run directory.
pub const AUDIT_FILE: &str = "audit.json";

/// What `audit` is asked.
#[derive(Debug, Clone, Default)]
pub struct AuditOptions {
    /// Ledger ids; empty: every entry with a reproducer.
    pub ids: Vec<String>,
    /// Series (`6.12`); empty: every series the mirror serves.
    pub series: Vec<String>,
    /// VMs at once (boots of different builds).
    pub vms: usize,
    /// Boot every build asked even when its answers are kept (and keep
    /// the new answers): after a change the keys do not see, such as QEMU.
    pub fresh: bool,
    /// The builds' architecture (`cloud-arm64` ones for arm64).
    pub arch: kloop_protocol::Arch,
    pub env: EnvOptions,
}

/// Why an audit could not run. Input errors (an unknown id, a series with
/// no served build) are their own variants, for the caller's exit status.
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error("no ledger entry `{id}`; the ledger's ids: {known}")]
    UnknownId { id: String, known: String },
    #[error("{0}")]
    NoReproducer(String),
    #[error(
        "series {series}: the mirror serves no cloud-amd64 build of it; series served: {served}"
    )]
    NoBuilds { series: String, served: String },
    #[error("no ledger entry has a stand-alone reproducer (kernels/repros/)")]
    NothingToAudit,
    #[error("the audit's scenario: {message}")]
    Scenario { message: String },
    #[error(transparent)]
    Io(#[from] PathIo),
    #[error(transparent)]
    Standalone(#[from] StandaloneError),
    #[error(transparent)]
    Kernel(#[from] kloop_kernels::KernelError),
    #[error(transparent)]
    Suite(#[from] SuiteError),
}

impl AuditError {
    /// The user asked for something that does not exist (exit 2 with the
    /// list of what does).
    pub fn is_bad_input(&self) -> bool {
        matches!(
            self,
            AuditError::UnknownId { .. }
                | AuditError::NoReproducer(_)
                | AuditError::NoBuilds { .. }
        )
    }
}

/// What the caller hears while the audit runs.
#[derive(Debug)]
pub enum Event<'a> {
    /// A line for the person running kloop, for reading only.
    Note(String),
    /// A build was booted (or could not be had).
    Boot(&'a BootRecord),
}

/// A reproducer the audit asked, with the ledger ids it answers for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditedReproducer {
    pub name: String,
    pub ids: Vec<String>,
    /// The upstream commit, from the fix's patches (`[ Upstream commit
    /// HASH ]`) and the ledger's `upstream_fix`, when either knows it.
    pub upstream: Option<String>,
}

/// A series and what each reproducer found in it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditedSeries {
    pub series: String,
    /// Its builds in the catalog's order (oldest first).
    pub builds: Vec<BuildRef>,
    /// By reproducer name.
    pub findings: BTreeMap<String, SeriesFinding>,
}

/// One served build, as the audit names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BuildRef {
    pub version: String,
    pub package: String,
    pub suite: String,
    /// `uname -r` as the index names it.
    pub release: String,
    pub deb_sha256: Option<String>,
}

impl BuildRef {
    fn of(b: &AvailableBuild) -> BuildRef {
        BuildRef {
            version: b.version.clone(),
            package: b.package.clone(),
            suite: b.suite.clone(),
            release: b.release.clone(),
            deb_sha256: b.deb_sha256.clone(),
        }
    }

    /// What identifies the build's bytes without downloading it: the
    /// package's sha256 from the signed index, else its name and version
    /// (a Debian version is never rebuilt under the same name).
    fn identity(&self) -> String {
        match &self.deb_sha256 {
            Some(sha) => format!("deb:{sha}"),
            None => format!("package:{}={}", self.package, self.version),
        }
    }
}

/// One build's answers in this audit: booted now, or kept from before.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BootRecord {
    pub series: String,
    pub version: String,
    /// The guest's `uname -r`, when it booted and said it.
    pub release: Option<String>,
    /// By reproducer name.
    pub answers: BTreeMap<String, Answer>,
    /// Reproducers whose answer was kept from an earlier audit.
    pub kept: Vec<String>,
    /// The boot's files (console, initramfs); none when nothing booted.
    pub dir: Option<PathBuf>,
    pub secs: f64,
    /// The pin the build was booted as (for the KCIDB document).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_sha256: Option<String>,
    /// Companion packages the build was pinned without (the mirror does
    /// not serve them; the plain init needs no modules and no `.config`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pinned_without: Vec<String>,
}

/// A finished audit (`audit.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Audit {
    pub reproducers: Vec<AuditedReproducer>,
    /// Ledger ids without a reproducer, which the audit cannot answer.
    pub without_reproducer: Vec<String>,
    pub series: Vec<AuditedSeries>,
    /// Series the catalog's pins name that the mirror serves no build of.
    pub unserved_series: Vec<String>,
    pub gaps: Vec<Gap>,
    /// Each series left without an answer for a reproducer, with why.
    #[serde(default)]
    pub unanswered_series: Vec<Unanswered>,
    /// Every build asked, in the order asked.
    pub boots: Vec<BootRecord>,
    pub secs: f64,
    pub run_dir: PathBuf,
    pub accel: String,
}

impl Audit {
    /// Builds actually booted (not answered from kept results alone).
    pub fn booted(&self) -> usize {
        self.boots.iter().filter(|b| b.dir.is_some()).count()
    }

    /// Any build that was asked and gave no answer (a panic, a timeout,
    /// a download that failed, a package the mirror does not serve).
    pub fn unanswered(&self) -> usize {
        self.boots
            .iter()
            .filter(|b| b.answers.values().any(|a| !a.settled()))
            .count()
    }

    /// Series × reproducer left without an answer for a reason other
    /// than the mirror not serving the builds: what fails the audit.
    pub fn failed_series(&self) -> Vec<&Unanswered> {
        self.unanswered_series
            .iter()
            .filter(|u| u.cause == Unanswerable::NoAnswer)
            .collect()
    }

    /// Exit 0 when every series answered or only the mirror kept it from
    /// answering; a series left unanswered for another reason fails.
    pub fn passed(&self) -> bool {
        self.failed_series().is_empty()
    }
}

/// The reproducers `ids` ask for (every entry's with one when empty), one
/// per reproducer, and the ids left without one.
fn reproducers(
    layout: &Layout,
    ids: &[String],
) -> Result<(Vec<standalone::Reproducer>, Vec<String>), AuditError> {
    let ledger =
        crate::workspace::load_ledger(layout).map_err(crate::run::suite::SuiteError::from)?;
    let mut found: Vec<standalone::Reproducer> = Vec::new();
    let mut without = Vec::new();
    let asked: Vec<String> = if ids.is_empty() {
        ledger.issues.iter().map(|i| i.id.clone()).collect()
    } else {
        ids.to_vec()
    };
    for id in &asked {
        match standalone::find(&layout.kernels(), &ledger, id) {
            Ok(r) => {
                if !found.iter().any(|f| f.name == r.name) {
                    found.push(r);
                }
            }
            Err(StandaloneError::UnknownId { id, known }) => {
                return Err(AuditError::UnknownId { id, known })
            }
            Err(e @ StandaloneError::NoReproducer { .. }) if !ids.is_empty() => {
                return Err(AuditError::NoReproducer(e.to_string()))
            }
            Err(StandaloneError::NoReproducer { .. }) => without.push(id.clone()),
            Err(e) => return Err(e.into()),
        }
    }
    if found.is_empty() {
        return Err(AuditError::NothingToAudit);
    }
    Ok((found, without))
}

/// An upstream commit as the fix folder and the ledger name it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UpstreamCommit {
    /// The hash as written (`[ Upstream commit HASH`), 12 digits or more.
    pub id: String,
    /// Its subject: the ledger's `upstream_fix` up to its first
    /// parenthesis, else the quoted subject after the hash in the patch.
    pub subject: Option<String>,
}

impl UpstreamCommit {
    /// `b9d1fdc6f4ac ("subject")`: the form `Fixes:` tags and the
    /// stable list use.
    pub fn short(&self) -> String {
        let id = &self.id[..12.min(self.id.len())];
        match &self.subject {
            Some(s) => format!("{id} (\"{s}\")"),
            None => id.to_string(),
        }
    }
}

/// The upstream commit of reproducer `r`'s bug: `[ Upstream commit HASH`
/// in a patch of its fix folder (the stable form), with the ledger's
/// `upstream_fix` up to its first parenthesis as the subject (else the
/// patch's quoted subject). `None` when no patch names a hash.
pub fn upstream_commit(kernels: &Path, r: &standalone::Reproducer) -> Option<UpstreamCommit> {
    let folder = kernels.join(crate::run::fixes::FIXES_DIR).join(&r.name);
    let (id, quoted) = crate::run::fixes::patches_of(&folder)
        .into_iter()
        .filter_map(|(_, p)| std::fs::read_to_string(p).ok())
        .find_map(|text| {
            let at = text.find("Upstream commit ")?;
            let rest = &text[at + "Upstream commit ".len()..];
            let word: String = rest.chars().take_while(|c| c.is_ascii_hexdigit()).collect();
            // The subject is quoted after the hash, maybe on the next line.
            let quoted = rest
                .split_once("(\"")
                .and_then(|(_, q)| q.split_once("\")"))
                .map(|(q, _)| q.split_whitespace().collect::<Vec<_>>().join(" "));
            (word.len() >= 12).then_some((word, quoted))
        })?;
    Some(UpstreamCommit {
        id,
        subject: ledger_subject(r).or(quoted),
    })
}

/// The ledger's `upstream_fix` up to its first parenthesis.
fn ledger_subject(r: &standalone::Reproducer) -> Option<String> {
    r.issues
        .iter()
        .map(|i| i.upstream_fix.trim())
        .find(|s| !s.is_empty())
        .map(|s| {
            s.split(" (")
                .next()
                .unwrap_or(s)
                .trim_end_matches('.')
                .to_string()
        })
}

/// The upstream commit of reproducer `r`'s bug as the audit prints it:
/// [`upstream_commit`]'s short form, else the ledger's subject alone.
pub fn upstream_of(kernels: &Path, r: &standalone::Reproducer) -> Option<String> {
    match upstream_commit(kernels, r) {
        Some(c) => Some(c.short()),
        None => ledger_subject(r).map(|s| format!("\"{s}\"")),
    }
}

/// Runs the audit `opts` asks for.
#[expect(clippy::too_many_lines)]
pub fn run(
    layout: &Layout,
    opts: &AuditOptions,
    on: &(dyn Fn(Event<'_>) + Sync),
) -> Result<Audit, AuditError> {
    let started = std::time::Instant::now();
    let (found, without_reproducer) = reproducers(layout, &opts.ids)?;
    // The architecture's pins: a pin stands for the build it is.
    let catalog = Catalog::load_for(&layout.kernels(), &[opts.arch])?;
    let cache = kloop_kernels::KernelCache::default_location()?;
    let (served, notes) =
        kloop_kernels::available::list_cloud_builds_for(&cache, &opts.env.fetch, false, opts.arch)?;
    for n in notes {
        on(Event::Note(n));
    }
    let (by_series, names) = by_series(served);
    for s in &opts.series {
        if !by_series.contains_key(s) {
            return Err(AuditError::NoBuilds {
                series: s.clone(),
                served: names.join(", "),
            });
        }
    }
    let mut unserved_series: Vec<String> = catalog
        .pins()
        .iter()
        .map(|p| p.series.clone())
        .filter(|s| !by_series.contains_key(s))
        .collect();
    unserved_series.dedup();
    let chosen: Vec<String> = names
        .into_iter()
        .filter(|s| opts.series.is_empty() || opts.series.contains(s))
        .collect();

    // The pins of the chosen series are the kernels the environment probes
    // KVM with (they are cached after any vm-test).
    let probe: Vec<KernelUnderTest> = catalog
        .pins()
        .iter()
        .filter(|p| chosen.contains(&p.series))
        .cloned()
        .map(KernelUnderTest::Pin)
        .collect();
    let env_opts = EnvOptions {
        arches: vec![opts.arch],
        ..opts.env.clone()
    };
    let env = suite::prepare_env(layout, &env_opts, &probe)?;
    let programs_dir = env.run_dir.join("reproducers");
    let programs: Vec<Program> = found
        .iter()
        .map(|r| Program::write(r, &programs_dir))
        .collect::<Result<_, _>>()?;
    let reproducers: Vec<AuditedReproducer> = found
        .iter()
        .map(|r| AuditedReproducer {
            name: r.name.clone(),
            ids: r.issues.iter().map(|i| i.id.clone()).collect(),
            upstream: upstream_of(&layout.kernels(), r),
        })
        .collect();
    on(Event::Note(format!("accelerator: {}", env.accel)));
    on(Event::Note(format!(
        "audit of {} reproducer(s) ({}) over {} series ({} {} build(s), {}); artefacts in {}",
        programs.len(),
        programs
            .iter()
            .map(|p| p.name.as_str())
            .collect::<Vec<_>>()
            .join(", "),
        chosen.len(),
        chosen.iter().map(|s| by_series[s].len()).sum::<usize>(),
        opts.arch,
        opts.arch.cloud_flavour(),
        env.run_dir.display()
    )));

    let mut prober = Prober::new(layout, &env, &catalog, &programs, on)?;
    prober.fresh = opts.fresh;
    let series_builds: Vec<(&str, &[AvailableBuild])> = chosen
        .iter()
        .map(|s| (s.as_str(), by_series[s].as_slice()))
        .collect();
    let vms = opts.vms.max(1);
    // The ends of every series first, side by side: most series need
    // nothing else.
    let newest: Vec<&AvailableBuild> = series_builds.iter().filter_map(|(_, b)| b.last()).collect();
    prober.ensure_all(&newest, vms);
    let oldest: Vec<&AvailableBuild> = series_builds
        .iter()
        .filter(|(_, b)| b.len() > 1)
        .filter(|(_, b)| {
            let n = prober.answers_of(&b[b.len() - 1]);
            n.values().any(Answer::decisive)
        })
        .map(|(_, b)| &b[0])
        .collect();
    prober.ensure_all(&oldest, vms);
    // Then each series' searches, series side by side.
    let findings: Vec<BTreeMap<String, SeriesFinding>> =
        parallel_map(&series_builds, vms, |(_, builds)| {
            programs
                .iter()
                .map(|p| {
                    let f = plan::audit_series(builds.len(), &mut |i| {
                        prober.answer(&builds[i], &p.name)
                    });
                    (p.name.clone(), f)
                })
                .collect()
        });
    let series: Vec<AuditedSeries> = series_builds
        .iter()
        .zip(findings)
        .map(|((s, builds), findings)| AuditedSeries {
            series: s.to_string(),
            builds: builds.iter().map(BuildRef::of).collect(),
            findings,
        })
        .collect();
    let gaps = all_gaps(&reproducers, &series);
    let unanswered_series = all_unanswered(&reproducers, &series);
    let boots = prober.into_boots();
    let audit = Audit {
        reproducers,
        without_reproducer,
        series,
        unserved_series,
        gaps,
        unanswered_series,
        boots,
        secs: started.elapsed().as_secs_f64(),
        run_dir: env.run_dir.clone(),
        accel: env.accel.accel.clone(),
    };
    let path = env.run_dir.join(AUDIT_FILE);
    let text = serde_json::to_string_pretty(&audit).expect("an audit serialises");
    kloop_kernels::write_atomically(&path, text.as_bytes()).at("writing", path)?;
    Ok(audit)
}

/// The served builds by series (each in the listing's order, oldest
/// first), and the series' names in version order.
pub(crate) fn by_series(
    served: Vec<AvailableBuild>,
) -> (BTreeMap<String, Vec<AvailableBuild>>, Vec<String>) {
    let mut by_series: BTreeMap<String, Vec<AvailableBuild>> = BTreeMap::new();
    for b in served {
        by_series.entry(b.series.clone()).or_default().push(b);
    }
    let mut names: Vec<String> = by_series.keys().cloned().collect();
    names.sort_by(|a, b| plan::series_order(a, b));
    (by_series, names)
}

/// Every reproducer's gaps over the audited series.
pub fn all_gaps(reproducers: &[AuditedReproducer], series: &[AuditedSeries]) -> Vec<Gap> {
    let versions: Vec<Vec<String>> = series
        .iter()
        .map(|s| s.builds.iter().map(|b| b.version.clone()).collect())
        .collect();
    reproducers
        .iter()
        .flat_map(|r| {
            let views: Vec<SeriesView<'_>> = series
                .iter()
                .zip(&versions)
                .filter_map(|(s, v)| {
                    s.findings.get(&r.name).map(|f| SeriesView {
                        series: &s.series,
                        versions: v,
                        finding: f,
                    })
                })
                .collect();
            plan::gaps(&r.name, &views, r.upstream.as_deref())
        })
        .collect()
}

/// Every series left without an answer, per reproducer, with why.
pub fn all_unanswered(
    reproducers: &[AuditedReproducer],
    series: &[AuditedSeries],
) -> Vec<Unanswered> {
    reproducers
        .iter()
        .flat_map(|r| {
            series.iter().filter_map(|s| {
                let versions: Vec<String> = s.builds.iter().map(|b| b.version.clone()).collect();
                let finding = s.findings.get(&r.name)?;
                plan::unanswered(
                    &r.name,
                    &SeriesView {
                        series: &s.series,
                        versions: &versions,
                        finding,
                    },
                )
            })
        })
        .collect()
}

/// `f` over `items` on up to `workers` threads, results in `items`' order.
fn parallel_map<T: Sync, R: Send>(
    items: &[T],
    workers: usize,
    f: impl Fn(&T) -> R + Sync,
) -> Vec<R> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let next = AtomicUsize::new(0);
    let out: Mutex<Vec<Option<R>>> = Mutex::new((0..items.len()).map(|_| None).collect());
    std::thread::scope(|scope| {
        for _ in 0..workers.min(items.len()).max(1) {
            scope.spawn(|| loop {
                let n = next.fetch_add(1, Ordering::SeqCst);
                let Some(item) = items.get(n) else { return };
                let r = f(item);
                out.lock().unwrap_or_else(|e| e.into_inner())[n] = Some(r);
            });
        }
    });
    out.into_inner()
        .unwrap_or_else(|e| e.into_inner())
        .into_iter()
        .map(|r| r.expect("every item ran"))
        .collect()
}

/// Asks builds for their answers: from this audit's memory, from the kept
/// answers, or by booting the build once for every reproducer it lacks.
struct Prober<'a> {
    env: &'a TrialEnv,
    catalog: &'a Catalog,
    kernels_dir: PathBuf,
    programs: &'a [Program],
    /// Each program's single file, for the keys.
    texts: Vec<String>,
    kept: Kept,
    /// Ignore kept answers (`--fresh`).
    fresh: bool,
    /// `kernels/bisect.lock`: builds pinned on demand, as `bisect` pins
    /// them (one writer at a time).
    lock: Mutex<BisectLock>,
    /// Answers by build version, then by reproducer.
    answers: Mutex<BTreeMap<String, BTreeMap<String, Answer>>>,
    /// One lock per build being booted, so two searches that want the same
    /// build at once boot it once.
    booting: Mutex<BTreeMap<String, std::sync::Arc<Mutex<()>>>>,
    boots: Mutex<Vec<BootRecord>>,
    on: &'a (dyn Fn(Event<'_>) + Sync),
}

impl<'a> Prober<'a> {
    fn new(
        layout: &Layout,
        env: &'a TrialEnv,
        catalog: &'a Catalog,
        programs: &'a [Program],
        on: &'a (dyn Fn(Event<'_>) + Sync),
    ) -> Result<Prober<'a>, AuditError> {
        let texts = programs
            .iter()
            .map(|p| std::fs::read_to_string(&p.file).at("reading", &p.file))
            .collect::<Result<_, _>>()?;
        Ok(Prober {
            env,
            catalog,
            kernels_dir: layout.kernels(),
            programs,
            texts,
            kept: Kept::in_cache(env.cache.root()),
            fresh: false,
            lock: Mutex::new(BisectLock::load(&layout.kernels())?),
            answers: Mutex::new(BTreeMap::new()),
            booting: Mutex::new(BTreeMap::new()),
            boots: Mutex::new(Vec::new()),
            on,
        })
    }

    fn answers_of(&self, b: &AvailableBuild) -> BTreeMap<String, Answer> {
        self.answers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&b.version)
            .cloned()
            .unwrap_or_default()
    }

    /// `program`'s answer on `b`, booting `b` when this audit has none.
    fn answer(&self, b: &AvailableBuild, program: &str) -> Answer {
        if let Some(a) = self.answers_of(b).get(program) {
            return a.clone();
        }
        self.ensure(b);
        self.answers_of(b)
            .get(program)
            .cloned()
            .unwrap_or_else(|| Answer::NoAnswer("not asked".into()))
    }

    fn ensure_all(&self, builds: &[&AvailableBuild], vms: usize) {
        parallel_map(builds, vms, |b| self.ensure(b));
    }

    /// Every program's answer on `b`: kept ones taken, the others from one
    /// boot of `b`.
    fn ensure(&self, b: &AvailableBuild) {
        let gate = self
            .booting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(b.version.clone())
            .or_default()
            .clone();
        let _one_at_a_time = gate.lock().unwrap_or_else(|e| e.into_inner());
        let have = self.answers_of(b);
        if self.programs.iter().all(|p| have.contains_key(&p.name)) {
            return;
        }
        let identity = BuildRef::of(b).identity();
        let mut record = BootRecord {
            series: b.series.clone(),
            version: b.version.clone(),
            release: None,
            answers: BTreeMap::new(),
            kept: Vec::new(),
            dir: None,
            secs: 0.0,
            image_sha256: None,
            pinned_without: self
                .lock
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&b.pin_id())
                .map(|p| p.unserved.clone())
                .unwrap_or_default(),
        };
        let mut missing: Vec<(usize, &Program)> = Vec::new();
        for (n, p) in self.programs.iter().enumerate() {
            let kept = if self.fresh {
                None
            } else {
                self.kept.get(&Kept::key(&identity, &self.texts[n]))
            };
            match kept {
                Some(k) => {
                    record.release = record.release.or(k.release);
                    record.image_sha256 = record.image_sha256.or(k.image_sha256);
                    record.answers.insert(p.name.clone(), k.answer);
                    record.kept.push(p.name.clone());
                }
                None => missing.push((n, p)),
            }
        }
        if !missing.is_empty() {
            self.boot_missing(b, &identity, &missing, &mut record);
        }
        (self.on)(Event::Boot(&record));
        self.answers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(b.version.clone())
            .or_default()
            .extend(record.answers.clone());
        self.boots
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(record);
    }

    /// Boots `b` once for the `missing` programs and keeps their settled
    /// answers.
    fn boot_missing(
        &self,
        b: &AvailableBuild,
        identity: &str,
        missing: &[(usize, &Program)],
        record: &mut BootRecord,
    ) {
        let started = std::time::Instant::now();
        let none = |record: &mut BootRecord, a: Answer| {
            for (_, p) in missing {
                record.answers.insert(p.name.clone(), a.clone());
            }
        };
        let no_answer = |record: &mut BootRecord, why: String| none(record, Answer::NoAnswer(why));
        let kernel = match self.kernel_of(b) {
            Ok((k, without)) => {
                record.pinned_without = without;
                k
            }
            Err(a) => return none(record, a),
        };
        record.image_sha256 = kernel.pin().map(|p| p.image_sha256.clone());
        let programs: Vec<Program> = missing.iter().map(|(_, p)| (*p).clone()).collect();
        let dir = self.env.run_dir.join("boots").join(safe_name(&b.version));
        record.dir = Some(dir.clone());
        match boot::boot(self.env, &kernel, &programs, &dir) {
            Err(e) => no_answer(record, e.to_string()),
            Ok(booted) => {
                record.release = booted.release.clone();
                for ((n, p), o) in missing.iter().zip(&booted.outcomes) {
                    let a = Answer::of(o);
                    let keep = KeptAnswer {
                        answer: a.clone(),
                        version: b.version.clone(),
                        release: booted.release.clone(),
                        image_sha256: record.image_sha256.clone(),
                        run: self.env.run_dir.clone(),
                    };
                    if let Err(e) = self.kept.put(&Kept::key(identity, &self.texts[*n]), &keep) {
                        (self.on)(Event::Note(format!(
                            "keeping {} × {}: {e} (it will be booted again next time)",
                            b.version, p.name
                        )));
                    }
                    record.answers.insert(p.name.clone(), a);
                }
            }
        }
        record.secs = started.elapsed().as_secs_f64();
    }

    /// `b` as a kernel, its image at hand, and the companion packages it
    /// was pinned without: a pin's build as that pin, any other pinned in
    /// `kernels/bisect.lock` on the way (downloaded and verified) as
    /// `bisect` does, except that the plain init needs neither the modules
    /// nor the `.config` package ([`Needs::IMAGE_ONLY`]): one the mirror
    /// does not serve is skipped, with a note naming it. `Err`: the
    /// build's answer when it cannot be had ([`Answer::NotServed`] when
    /// the mirror does not serve its image package).
    fn kernel_of(&self, b: &AvailableBuild) -> Result<(KernelUnderTest, Vec<String>), Answer> {
        let failed = |what: &str, e: kloop_kernels::KernelError| {
            let why = format!("{what} {}: {e}", b.version);
            if e.is_unserved() {
                Answer::NotServed(why)
            } else {
                Answer::NoAnswer(format!("INFRA: {why}"))
            }
        };
        let (kernel, pin) = match self.catalog.pins().iter().find(|p| p.version == b.version) {
            Some(p) => (KernelUnderTest::Pin(p.clone()), p.clone()),
            None => {
                let pin: KernelPin = self
                    .lock
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .ensure(
                        &self.env.cache,
                        &self.kernels_dir,
                        b,
                        &self.env.fetch,
                        Needs::IMAGE_ONLY,
                    )
                    .map_err(|e| failed("pinning", e))?;
                (
                    KernelUnderTest::distro_build(pin.clone(), self.catalog),
                    pin,
                )
            }
        };
        if !pin.unserved.is_empty() {
            (self.on)(Event::Note(without_note(&b.version, &pin.unserved)));
        }
        self.env
            .cache
            .ensure_image(&pin, &self.env.fetch)
            .map_err(|e| failed("fetching", e))?;
        Ok((kernel, pin.unserved.clone()))
    }

    fn into_boots(self) -> Vec<BootRecord> {
        self.boots.into_inner().unwrap_or_else(|e| e.into_inner())
    }
}

/// The note of a build pinned without some of its companion packages.
pub fn without_note(version: &str, unserved: &[String]) -> String {
    format!(
        "{version}: booted without {} (the mirror does not serve {}; the audit's plain init \
         loads no module and runs no config preflight)",
        unserved.join(", "),
        if unserved.len() == 1 { "it" } else { "them" }
    )
}

/// A version as a directory name.
fn safe_name(version: &str) -> String {
    version
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' {
                c
            } else {
                '-'
            }
        })
        .collect()
}
