//! A trial's verdict as a KCIDB test status, for `results.jsonl` (so a CI
//! that submits to KernelCI's common database need not re-derive it).
//!
//! KCIDB's statuses say what a test found out about the tested code
//! (schema v5): FAIL (completed, the code is faulty), ERROR (did not
//! complete because of a failure in the test's own code, the code's
//! status unknown), MISS (did not run because the harness failed, both
//! unknown), PASS (completed, the code is correct), SKIP (did not run:
//! not applicable). Mapped from kloop's verdicts:
//!
//! | verdict | status | why |
//! |---|---|---|
//! | `ok` | PASS | every rule held and the stream matched its snapshot |
//! | `KNOWN` | FAIL, `known: true` | the kernel broke a rule: that is a real kernel bug, found as expected. Not PASS: the code is not correct, and a consumer counting PASS would count a bug as fixed. `known` (and each violation's `known_issue`) says the ledger explains it: it does not fail kloop's run and needs no new triage (KCIDB: an incident of a known issue) |
//! | `FIXED?` | PASS, or FAIL `known: true` while other known bugs still show | the kernel broke no rule the ledger expected it to break: the code behaves correctly; what is out of date is kloop's ledger (or the scenario no longer provokes the bug), which fails kloop's run but says nothing bad about the kernel |
//! | `FAILED` | FAIL | a rule no ledger entry covers, a snapshot drift or an overhead budget: a finding about the kernel. The verdict also covers the guest agent reporting an error or crashing, which can be a kloop bug rather than a kernel finding; the verdict does not tell them apart, so the status does not either (the message does) |
//! | `SKIPPED` | SKIP | the kernel lacks what the scenario requires (config preflight or the guest's probe): not applicable, nothing ran |
//! | `PANIC` | FAIL | the guest kernel panicked: whatever the test did, the kernel is faulty |
//! | `TIMEOUT` | ERROR | no hello within the boot deadline or the agent went silent: the test did not complete, and a starved host and a hung kernel look alike, so the kernel's status is unknown |
//! | `INFRA` | MISS before the agent's hello, ERROR after | before the hello (fetch, checksum, QEMU missing or killed at boot) the test never ran; after it, the test's own machinery (channel, QEMU) broke mid-run |
//! | `INTERRUPTED` | MISS | the user stopped the run: the trial did not run to an end through no fault of test or kernel |
//! | `FLAKY` | ERROR | `--repeat` runs disagreed: kloop promises one verdict per kernel, so the test failed to produce one; each run keeps its own status in `runs.jsonl` |
//!
//! A kernel source build that fails is not a trial: `vm-test` stops before
//! any trial runs and writes no `results.jsonl` (KCIDB would record it as a
//! build whose status is FAIL, not as a test).

use serde::Serialize;

use crate::run::trial::{TrialResult, Verdict};

/// KCIDB's test status (the values kloop produces; it never reports DONE).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Status {
    Fail,
    Error,
    Miss,
    Pass,
    Skip,
}

/// A trial's KCIDB status, and whether a failure is a known bug (see the
/// module docs for the mapping and its reasons).
pub fn status(r: &TrialResult) -> (Status, bool) {
    match &r.verdict {
        Verdict::Ok => (Status::Pass, false),
        Verdict::Known(_) => (Status::Fail, true),
        // Only violations the ledger covers can remain in a FIXED? trial
        // (an uncovered one would have made it FAILED).
        Verdict::Fixed(_) if r.violations.is_empty() => (Status::Pass, false),
        Verdict::Fixed(_) => (Status::Fail, true),
        Verdict::Failed(_) | Verdict::Panic(_) => (Status::Fail, false),
        Verdict::Skipped(_) => (Status::Skip, false),
        Verdict::Timeout(_) | Verdict::Flaky(_) => (Status::Error, false),
        Verdict::Infrastructure(_) if r.boot_to_hello_secs.is_some() => (Status::Error, false),
        Verdict::Infrastructure(_) | Verdict::Interrupted(_) => (Status::Miss, false),
    }
}

/// One line of `results.jsonl` / `runs.jsonl`: the trial as it is, plus
/// its KCIDB status (derived, so it is not kept in [`TrialResult`]).
#[derive(Serialize)]
pub(super) struct JsonLine<'a> {
    #[serde(flatten)]
    pub result: &'a TrialResult,
    pub kcidb_status: Status,
    /// A FAIL that is a known bug of the kernel (the ledger's).
    pub known: bool,
}

impl<'a> JsonLine<'a> {
    pub fn of(result: &'a TrialResult) -> JsonLine<'a> {
        let (kcidb_status, known) = status(result);
        JsonLine {
            result,
            kcidb_status,
            known,
        }
    }
}

pub use crate::run::trial::Provenance;

/// The run around the tests: what the document's ids and environment need.
#[derive(Debug, Clone)]
pub struct RunContext {
    /// `git rev-parse HEAD` of kloop (`+dirty`), part of every test id.
    pub kloop_commit: String,
    /// The run directory's name.
    pub run: String,
}

/// A KCIDB I/O document of schema v5.3 (`kcidb-io`'s latest major).
#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq)]
pub struct Document {
    pub version: SchemaVersion,
    pub checkouts: Vec<serde_json::Value>,
    pub builds: Vec<serde_json::Value>,
    pub tests: Vec<serde_json::Value>,
}

impl Document {
    /// A document of the schema kloop writes, with nothing in it yet.
    pub fn empty() -> Document {
        Document {
            version: SchemaVersion { major: 5, minor: 3 },
            checkouts: Vec::new(),
            builds: Vec::new(),
            tests: Vec::new(),
        }
    }
}

/// `{"major": 5, "minor": 3}`.
#[derive(Debug, Clone, Copy, Serialize, serde::Deserialize, PartialEq)]
pub struct SchemaVersion {
    pub major: u32,
    pub minor: u32,
}

/// Objects of KCIDB are told apart by `<origin>:<id>`.
pub const ORIGIN: &str = "kloop";

fn id_of(parts: &[&str]) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    for p in parts {
        h.update(p.as_bytes());
        h.update([0]);
    }
    format!("{ORIGIN}:{}", &hex::encode(h.finalize())[..24])
}

fn file_url(path: &std::path::Path) -> String {
    // Absolute paths only: a URI needs them; percent-encode what a path
    // may hold that a URI may not.
    let abs = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir().unwrap_or_default().join(path)
    };
    let mut out = String::from("file://");
    for b in abs.to_string_lossy().bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'/' | b'-' | b'.' | b'_' | b'~' | b'+' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

impl Provenance {
    /// The checkout's id: the source (a Debian binary package's source is
    /// the package itself: the only identity kloop knows of it).
    fn checkout_id(&self) -> String {
        match self {
            Provenance::DebianBuild { deb_sha256, .. } => id_of(&["debian-package", deb_sha256]),
            Provenance::SourceBuild {
                source_identity,
                patches,
                ..
            } => {
                let mut parts = vec!["source", source_identity.as_str()];
                parts.extend(patches.iter().map(|(_, _, h)| h.as_str()));
                id_of(&parts)
            }
            Provenance::Image { sha256, .. } => id_of(&["image", sha256]),
        }
    }

    fn build_id(&self) -> String {
        match self {
            Provenance::DebianBuild { image_sha256, .. }
            | Provenance::SourceBuild { image_sha256, .. } => id_of(&["build", image_sha256]),
            Provenance::Image { sha256, .. } => id_of(&["build", sha256]),
        }
    }

    fn checkout(&self) -> serde_json::Value {
        use serde_json::json;
        let mut c = json!({"id": self.checkout_id(), "origin": ORIGIN, "valid": true});
        match self {
            Provenance::DebianBuild {
                package,
                version,
                suite,
                deb_sha256,
                ..
            } => {
                c["tree_name"] = json!("debian");
                c["comment"] = json!(format!(
                    "Debian's {package} {version} ({suite}), sha256-verified"
                ));
                c["misc"] = json!({"package": package, "version": version, "suite": suite, "deb_sha256": deb_sha256});
            }
            Provenance::SourceBuild {
                source,
                source_identity,
                patches,
                ..
            } => {
                c["tree_name"] = json!(source.split_whitespace().next().unwrap_or("tree"));
                c["comment"] = json!(format!("{source}, built by kloop"));
                if !patches.is_empty() {
                    // KCIDB: the sha256 of the patches' sha256s, in order.
                    use sha2::{Digest, Sha256};
                    let mut h = Sha256::new();
                    for (_, _, sha) in patches {
                        h.update(sha.as_bytes());
                        h.update(b"\n");
                    }
                    c["patchset_hash"] = json!(hex::encode(h.finalize()));
                    c["patchset_files"] = json!(patches
                        .iter()
                        .map(|(name, path, _)| json!({"name": name, "url": file_url(std::path::Path::new(path))}))
                        .collect::<Vec<_>>());
                }
                c["misc"] = json!({"source": source, "source_identity": source_identity});
            }
            Provenance::Image { path, sha256 } => {
                c["comment"] = json!(format!("a bzImage given to kloop: {path}"));
                c["misc"] = json!({"image": path, "image_sha256": sha256});
            }
        }
        c
    }

    fn build(&self) -> serde_json::Value {
        use serde_json::json;
        let mut b = json!({
            "id": self.build_id(),
            "checkout_id": self.checkout_id(),
            "origin": ORIGIN,
            "architecture": self.arch().kcidb(),
            "status": "PASS",
        });
        match self {
            Provenance::DebianBuild {
                image_sha256,
                release,
                ..
            } => {
                b["config_name"] = json!(format!("debian {}", self.arch().cloud_flavour()));
                b["comment"] = json!(format!("Debian's build, uname -r {release}"));
                b["misc"] = json!({"image_sha256": image_sha256, "release": release});
            }
            Provenance::SourceBuild {
                id,
                config_sha256,
                compiler,
                image_sha256,
                release,
                ..
            } => {
                b["config_name"] = json!("tinyconfig+kloop.config");
                b["compiler"] = json!(compiler);
                b["comment"] = json!(format!("built:{id}, uname -r {release}"));
                b["misc"] = json!({"built": id, "config_sha256": config_sha256, "image_sha256": image_sha256, "release": release});
            }
            Provenance::Image { sha256, .. } => {
                b["misc"] = json!({"image_sha256": sha256});
            }
        }
        b
    }
}

/// The KCIDB document of `results`, each trial's kernel described by
/// `provenance` (by the trial's kernel id). Ids are stable: the same
/// kernel gives the same checkout and build ids in every run and shard, and
/// a test's id is its build, scenario and kloop commit.
pub fn document(
    results: &[TrialResult],
    provenance: &std::collections::BTreeMap<String, Provenance>,
    ctx: &RunContext,
) -> Document {
    use serde_json::json;
    let mut doc = Document::empty();
    for r in results {
        // An A/B of two builds with one name prefixes the baseline's.
        let Some(p) = provenance.get(&r.kernel).or_else(|| {
            r.kernel
                .strip_prefix("baseline-")
                .and_then(|k| provenance.get(k))
        }) else {
            continue;
        };
        let (checkout, build) = (p.checkout(), p.build());
        if !doc.checkouts.iter().any(|c| c["id"] == checkout["id"]) {
            doc.checkouts.push(checkout);
        }
        if !doc.builds.iter().any(|b| b["id"] == build["id"]) {
            doc.builds.push(build);
        }
        let (status, known) = status(r);
        let ledger_ids: std::collections::BTreeSet<&str> = r
            .violations
            .iter()
            .filter_map(|v| v.known_issue.as_deref())
            .collect();
        let mut t = json!({
            "id": id_of(&["test", &p.build_id(), &r.scenario, &ctx.kloop_commit]),
            "build_id": p.build_id(),
            "origin": ORIGIN,
            "path": format!("kloop.{}", r.scenario.replace(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '-'), "_")),
            "status": status,
            "duration": r.wall_secs,
            "environment": {
                "comment": format!("QEMU ({}) on {}", r.accel, r.host_release),
                "misc": {"qemu": r.qemu_version, "accel": r.accel, "host_release": r.host_release},
            },
            "misc": {
                "kloop_verdict": r.verdict.label(),
                "kloop_headline": r.verdict.headline(),
                "known": known,
                "ledger_ids": ledger_ids,
                "kloop_commit": ctx.kloop_commit,
                "run": ctx.run,
                "trial": r.id,
            },
        });
        let console = r.artefacts.join("console.log");
        if console.is_file() {
            t["log_url"] = json!(file_url(&console));
        }
        let outputs: Vec<serde_json::Value> = ["result.json", "normalised.txt", "messages.jsonl", "data.bin"]
            .iter()
            .map(|f| r.artefacts.join(f))
            .filter(|p| p.is_file())
            .map(|p| {
                json!({"name": p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(), "url": file_url(&p)})
            })
            .collect();
        if !outputs.is_empty() {
            t["output_files"] = json!(outputs);
        }
        doc.tests.push(t);
    }
    doc
}

/// One mutant as the mutation run's KCIDB document says it.
#[derive(Debug, Clone)]
pub struct MutantEntry<'a> {
    /// `core.c:perf_event_ksymbol:9431:drop-call`.
    pub id: &'a str,
    pub what: &'a str,
    /// Its unified diff (the checkout's patchset).
    pub patch: &'a str,
    /// `killed`, `survived`, … and the first line of why.
    pub outcome: &'a str,
    pub detail: String,
    /// Killed: the suite found the fault (FAIL); survived: it did not
    /// (PASS); failed to build: the build FAILs and the test MISSes;
    /// equivalent or duplicate: SKIP; not judged: MISS.
    pub status: Status,
    pub build_failed: bool,
    pub secs: f64,
}

/// The KCIDB document of a mutation run: the unmutated source as one
/// checkout, each mutant a checkout of its own (the source with the
/// mutant as its patchset) with its build, and one test per mutant,
/// `kloop.mutant`, whose status says whether kloop's suite told the mutant
/// kernel from the unmutated one.
pub fn mutation_document(
    source: &str,
    source_identity: &str,
    baseline_kernel: &str,
    mutants: &[MutantEntry<'_>],
    ctx: &RunContext,
) -> Document {
    use serde_json::json;
    use sha2::{Digest, Sha256};
    let mut doc = Document::empty();
    for m in mutants {
        let patch_sha = hex::encode(Sha256::digest(m.patch.as_bytes()));
        let checkout_id = id_of(&["source", source_identity, &patch_sha]);
        let build_id = id_of(&["mutant-build", source_identity, &patch_sha]);
        doc.checkouts.push(json!({
            "id": checkout_id,
            "origin": ORIGIN,
            "tree_name": source.split_whitespace().next().unwrap_or("tree"),
            "patchset_hash": hex::encode(Sha256::digest(format!("{patch_sha}\n").as_bytes())),
            "comment": format!("{source} with mutant {}", m.id),
            "valid": true,
            "misc": {"source": source, "source_identity": source_identity, "mutant": m.id, "what": m.what},
        }));
        doc.builds.push(json!({
            "id": build_id,
            "checkout_id": checkout_id,
            "origin": ORIGIN,
            "architecture": "x86_64",
            "config_name": "tinyconfig+kloop.config",
            "status": if m.build_failed { "FAIL" } else { "PASS" },
            "misc": {"mutant": m.id, "baseline": baseline_kernel},
        }));
        doc.tests.push(json!({
            "id": id_of(&["mutant-test", &build_id, &ctx.kloop_commit]),
            "build_id": build_id,
            "origin": ORIGIN,
            "path": "kloop.mutant",
            "status": m.status,
            "duration": m.secs,
            "comment": format!("{}: {}", m.outcome, m.detail),
            "misc": {"mutant": m.id, "outcome": m.outcome, "kloop_commit": ctx.kloop_commit, "run": ctx.run},
        }));
    }
    doc
}

/// The KCIDB document of an audit: each Debian build asked as a checkout
/// and a build (the same ids `vm-test` gives it when the image is known),
/// and one test per (build × reproducer), `kloop.audit.<reproducer>`:
/// affected FAIL (`known: true`, with the ledger ids: the bug is the
/// ledger's), clean PASS, cannot run (exit 77) SKIP, no answer ERROR when
/// the build booted and MISS when it could not be had.
pub fn audit_document(audit: &crate::run::audit::Audit, ctx: &RunContext) -> Document {
    use crate::run::audit::plan::Answer;
    use serde_json::json;
    let mut doc = Document::empty();
    for b in &audit.boots {
        let Some(build) = audit
            .series
            .iter()
            .flat_map(|s| &s.builds)
            .find(|x| x.version == b.version)
        else {
            continue;
        };
        let (checkout, kbuild) = audited_build(build, b);
        let build_id = kbuild["id"].clone();
        if !doc.checkouts.iter().any(|c| c["id"] == checkout["id"]) {
            doc.checkouts.push(checkout);
        }
        if !doc.builds.iter().any(|x| x["id"] == build_id) {
            doc.builds.push(kbuild);
        }
        for (name, answer) in &b.answers {
            let ids: Vec<&str> = audit
                .reproducers
                .iter()
                .find(|r| &r.name == name)
                .map(|r| r.ids.iter().map(String::as_str).collect())
                .unwrap_or_default();
            let (status, known) = match answer {
                Answer::Affected => (Status::Fail, true),
                Answer::Clean => (Status::Pass, false),
                Answer::CannotRun(_) => (Status::Skip, false),
                Answer::NoAnswer(_) if b.dir.is_some() => (Status::Error, false),
                Answer::NoAnswer(_) | Answer::NotServed(_) => (Status::Miss, false),
            };
            let mut t = json!({
                "id": id_of(&["audit-test", build_id.as_str().unwrap_or(""), name, &ctx.kloop_commit]),
                "build_id": build_id,
                "origin": ORIGIN,
                "path": format!("kloop.audit.{}", name.replace(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '-'), "_")),
                "status": status,
                "comment": format!("stand-alone reproducer {name} in a plain init: {}", answer.label()),
                "misc": {
                    "answer": answer.label(),
                    "known": known,
                    "ledger_ids": if known { ids } else { Vec::new() },
                    "kept": b.kept.contains(name),
                    "series": b.series,
                    "version": b.version,
                    "kloop_commit": ctx.kloop_commit,
                    "run": ctx.run,
                },
            });
            if !b.kept.contains(name) && b.secs > 0.0 {
                t["duration"] = json!(b.secs);
            }
            if let Some(console) = b.dir.as_ref().map(|d| d.join("console.log")) {
                if console.is_file() {
                    t["log_url"] = json!(file_url(&console));
                }
            }
            doc.tests.push(t);
        }
    }
    doc
}

/// The KCIDB checkout and build of a Debian build an audit asked.
fn audited_build(
    build: &crate::run::audit::BuildRef,
    b: &crate::run::audit::BootRecord,
) -> (serde_json::Value, serde_json::Value) {
    use serde_json::json;
    match (&build.deb_sha256, &b.image_sha256) {
        (Some(deb), Some(image)) => {
            let p = Provenance::DebianBuild {
                package: build.package.clone(),
                version: build.version.clone(),
                suite: build.suite.clone(),
                deb_sha256: deb.clone(),
                image_sha256: image.clone(),
                release: build.release.clone(),
            };
            (p.checkout(), p.build())
        }
        // Never pinned (its download failed, say): named by package
        // and version, the only identity known.
        _ => {
            let c = id_of(&["debian-package", &build.package, &build.version]);
            (
                json!({"id": c, "origin": ORIGIN, "valid": true, "tree_name": "debian",
                    "comment": format!("Debian's {} {} ({})", build.package, build.version, build.suite),
                    "misc": {"package": build.package, "version": build.version, "suite": build.suite}}),
                json!({"id": id_of(&["build", &build.package, &build.version]), "checkout_id": c,
                    "origin": ORIGIN, "architecture": "x86_64", "config_name": "debian cloud-amd64",
                    "status": "PASS", "misc": {"release": build.release}}),
            )
        }
    }
}

/// Several documents as one (the shards of a run): objects with the same
/// id are the same object and kept once.
pub fn merge_documents(docs: &[Document]) -> Document {
    let mut out = Document::empty();
    for d in docs {
        for (from, to) in [
            (&d.checkouts, &mut out.checkouts),
            (&d.builds, &mut out.builds),
            (&d.tests, &mut out.tests),
        ] {
            for o in from {
                if !to.iter().any(|x| x["id"] == o["id"]) {
                    to.push(o.clone());
                }
            }
        }
    }
    out
}

/// The file every run directory holds.
pub const DOCUMENT_FILE: &str = "kcidb.json";

impl RunContext {
    /// The context of the run in `run_dir`, by the kloop checkout at `root`.
    pub fn of_run(root: &std::path::Path, run_dir: &std::path::Path) -> RunContext {
        RunContext {
            kloop_commit: crate::run::agent::kloop_commit(root),
            run: run_dir
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
        }
    }
}

/// Writes a run's KCIDB document into its run directory (and to `extra`,
/// `--kcidb FILE`). Returns what could not be written: the document is a
/// by-product of the run, its failure is told, not fatal.
pub fn write_run_document(
    root: &std::path::Path,
    run_dir: &std::path::Path,
    kernels: &[crate::run::trial::KernelUnderTest],
    results: &[TrialResult],
    extra: Option<&std::path::Path>,
) -> Vec<String> {
    let cache = match kloop_kernels::KernelCache::default_location() {
        Ok(c) => c,
        Err(e) => return vec![format!("the KCIDB document: the kernel cache: {e}")],
    };
    let provenance: std::collections::BTreeMap<String, Provenance> = kernels
        .iter()
        .map(|k| (k.id(), k.provenance(&cache)))
        .collect();
    let doc = document(results, &provenance, &RunContext::of_run(root, run_dir));
    let text = match serde_json::to_string_pretty(&doc) {
        Ok(t) => t,
        Err(e) => return vec![format!("the KCIDB document: {e}")],
    };
    std::iter::once(run_dir.join(DOCUMENT_FILE))
        .chain(extra.map(|p| p.to_path_buf()))
        .filter_map(|path| {
            std::fs::write(&path, &text)
                .err()
                .map(|e| format!("writing the KCIDB document {}: {e}", path.display()))
        })
        .collect()
}

/// Points each test's log and output URLs into `run_dir/<trial id>/`,
/// where `merge` copied the trials (the shards' own directories are on
/// other machines).
pub fn relocate(doc: &mut Document, run_dir: &std::path::Path) {
    for t in &mut doc.tests {
        let Some(trial) = t["misc"]["trial"].as_str().map(str::to_string) else {
            continue;
        };
        let moved = |url: &str| -> Option<String> {
            let file = url.rsplit('/').next()?;
            Some(file_url(&run_dir.join(&trial).join(file)))
        };
        if let Some(new) = t["log_url"].as_str().and_then(moved) {
            t["log_url"] = serde_json::Value::String(new);
        }
        if let Some(files) = t["output_files"].as_array_mut() {
            for f in files {
                if let Some(new) = f["url"].as_str().and_then(moved) {
                    f["url"] = serde_json::Value::String(new);
                }
            }
        }
    }
}

#[cfg(test)]
mod document_tests {
    use super::*;
    use crate::run::trial::{RuleHit, Verdict};

    fn fix_patch() -> (String, String, String) {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../kernels/fixes/interpreted-prog-ksymbol/linux-source-6.12.patch");
        let bytes = std::fs::read(&path).unwrap();
        use sha2::{Digest, Sha256};
        (
            "linux-source-6.12.patch".into(),
            path.display().to_string(),
            hex::encode(Sha256::digest(&bytes)),
        )
    }

    fn built(id: &str, patches: Vec<(String, String, String)>) -> Provenance {
        Provenance::SourceBuild {
            id: id.into(),
            source: "linux-source-6.12 6.12.117-1~deb12u1".into(),
            source_identity: "e849faf31ca3555757f3a8877cb01af92122f744f75d1f3102734651c4e14703"
                .into(),
            patches,
            config_sha256: "0".repeat(64),
            compiler: "gcc (Debian 12.2.0-14+deb12u1) 12.2.0".into(),
            image_sha256: format!("{id:0>64}"),
            release: "6.12.117".into(),
        }
    }

    /// The document of a `validate` A/B (the interpreter fix's, as run on
    /// linux-source-6.12): two builds of one source, the candidate's
    /// checkout with the fix as its patchset; ids stable across calls.
    /// Written to target/kloop/kcidb-samples/ for `.ci/run`, which checks
    /// it with kcidb-io's validator.
    #[test]
    fn a_validate_runs_document_has_both_builds_and_the_patchset() {
        let base = TrialResult {
            violations: vec![RuleHit {
                rule: "load-symbols".into(),
                message: "m".into(),
                listener: None,
                offset: None,
                records: vec![],
                known_issue: Some("interpreted-prog-ksymbol-register".into()),
                detail: None,
            }],
            ..TrialResult::for_test(
                "built-53e347db1de9",
                "interpreter",
                Verdict::Known("known bug: x".into()),
                "/nonexistent",
            )
        };
        let cand = TrialResult::for_test(
            "built-e1623823759d",
            "interpreter",
            Verdict::Ok,
            "/nonexistent",
        );
        let provenance = std::collections::BTreeMap::from([
            (
                "built-53e347db1de9".to_string(),
                built("53e347db1de9", vec![]),
            ),
            (
                "built-e1623823759d".to_string(),
                built("e1623823759d", vec![fix_patch()]),
            ),
        ]);
        let ctx = RunContext {
            kloop_commit: "0123456789abcdef0123456789abcdef01234567".into(),
            run: "1795663955-19724".into(),
        };
        let doc = document(&[base.clone(), cand.clone()], &provenance, &ctx);
        assert_eq!(
            doc,
            document(&[base, cand], &provenance, &ctx),
            "same inputs, same ids"
        );
        assert_eq!(
            (doc.checkouts.len(), doc.builds.len(), doc.tests.len()),
            (2, 2, 2)
        );
        assert_ne!(doc.checkouts[0]["id"], doc.checkouts[1]["id"]);
        assert_eq!(
            doc.checkouts[1]["patchset_files"][0]["name"],
            "linux-source-6.12.patch"
        );
        assert_eq!(doc.tests[0]["status"], "FAIL");
        assert_eq!(
            doc.tests[0]["misc"]["ledger_ids"][0],
            "interpreted-prog-ksymbol-register"
        );
        assert_eq!(doc.tests[1]["status"], "PASS");
        assert_eq!(doc.tests[1]["path"], "kloop.interpreter");
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/kloop/kcidb-samples");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("validate.json"),
            serde_json::to_string_pretty(&doc).unwrap(),
        )
        .unwrap();
    }

    #[test]
    fn shard_documents_merge_without_duplicates() {
        let p = std::collections::BTreeMap::from([(
            "6.1".to_string(),
            Provenance::DebianBuild {
                package: "linux-image-6.1.0-50-cloud-amd64".into(),
                version: "6.1.176-1".into(),
                suite: "bookworm".into(),
                deb_sha256: "a".repeat(64),
                image_sha256: "b".repeat(64),
                release: "6.1.0-50-cloud-amd64".into(),
            },
        )]);
        let ctx = RunContext {
            kloop_commit: "c".into(),
            run: "r".into(),
        };
        let one = document(
            &[TrialResult::for_test("6.1", "basic", Verdict::Ok, "/x")],
            &p,
            &ctx,
        );
        let two = document(
            &[TrialResult::for_test("6.1", "subprogs", Verdict::Ok, "/x")],
            &p,
            &ctx,
        );
        let m = merge_documents(&[one, two]);
        assert_eq!(
            (m.checkouts.len(), m.builds.len(), m.tests.len()),
            (1, 1, 2)
        );
    }
}

#[cfg(test)]
mod audit_tests {
    use crate::run::audit::plan::{audit_series, Answer};
    use crate::run::audit::{Audit, AuditedReproducer, AuditedSeries, BootRecord, BuildRef};

    /// A Debian build as the audit names it; `deb` repeated is its sha256.
    fn build_ref(v: &str, deb: Option<&str>) -> BuildRef {
        BuildRef {
            version: v.into(),
            package: format!("linux-image-{v}-cloud-amd64"),
            suite: "bookworm-backports".into(),
            release: format!("{v}-cloud-amd64"),
            deb_sha256: deb.map(|d| d.repeat(64)),
        }
    }

    /// A build's boot: booted now (`kept` false, in a directory) or answered
    /// from kept answers; `image` repeated is its image's sha256.
    fn boot_record(
        series: &str,
        v: &str,
        answers: Vec<(&str, Answer)>,
        kept: bool,
        image: Option<&str>,
    ) -> BootRecord {
        BootRecord {
            series: series.into(),
            version: v.into(),
            release: None,
            answers: answers
                .into_iter()
                .map(|(n, a)| (n.to_string(), a))
                .collect(),
            kept: if kept {
                vec!["hs".into(), "ip".into()]
            } else {
                vec![]
            },
            dir: (!kept).then(|| "/nonexistent/boot".into()),
            secs: 4.5,
            image_sha256: image.map(|i| i.repeat(64)),
            pinned_without: vec![],
        }
    }

    /// The audit the test below describes.
    fn two_series_audit() -> Audit {
        let finding = audit_series(2, &mut |i| {
            if i == 0 {
                Answer::Affected
            } else {
                Answer::Clean
            }
        });
        Audit {
            reproducers: vec![
                AuditedReproducer {
                    name: "hs".into(),
                    ids: vec!["ksymbol-bpf-event-header-size-accumulates".into()],
                    upstream: Some("b9d1fdc6f4ac".into()),
                },
                AuditedReproducer {
                    name: "ip".into(),
                    ids: vec!["interpreted-prog-ksymbol-register".into()],
                    upstream: None,
                },
            ],
            without_reproducer: vec![],
            series: vec![
                AuditedSeries {
                    series: "6.12".into(),
                    builds: vec![
                        build_ref("6.12.43-1", Some("a")),
                        build_ref("6.12.118-1", Some("b")),
                    ],
                    findings: [("hs".to_string(), finding)].into_iter().collect(),
                },
                AuditedSeries {
                    series: "6.16".into(),
                    builds: vec![build_ref("6.16.3-1", None)],
                    findings: Default::default(),
                },
            ],
            unserved_series: vec![],
            gaps: vec![],
            unanswered_series: vec![],
            boots: vec![
                boot_record(
                    "6.12",
                    "6.12.118-1",
                    vec![("hs", Answer::Clean), ("ip", Answer::Affected)],
                    false,
                    Some("c"),
                ),
                boot_record(
                    "6.12",
                    "6.12.43-1",
                    vec![
                        ("hs", Answer::Affected),
                        ("ip", Answer::CannotRun("CANNOT RUN: x".into())),
                    ],
                    true,
                    Some("d"),
                ),
                boot_record(
                    "6.16",
                    "6.16.3-1",
                    vec![("hs", Answer::NoAnswer("INFRA: pinning".into()))],
                    true,
                    None,
                ),
            ],
            secs: 12.0,
            run_dir: "/nonexistent".into(),
            accel: "tcg".into(),
        }
    }

    /// An audit of two 6.12 builds (one booted, one answered from kept
    /// answers) and a 6.16 build that could not be had: one checkout and
    /// build per Debian build, one test per (build × reproducer), statuses
    /// by answer. Written to target/kloop/kcidb-samples/ for `.ci/run`'s
    /// kcidb-io validation.
    #[test]
    fn an_audits_document_has_a_test_per_build_and_reproducer() {
        let audit = two_series_audit();
        let ctx = super::RunContext {
            kloop_commit: "0123456789abcdef0123456789abcdef01234567".into(),
            run: "1795764689-22645".into(),
        };
        let doc = super::audit_document(&audit, &ctx);
        assert_eq!(doc, super::audit_document(&audit, &ctx), "stable ids");
        assert_eq!(
            (doc.checkouts.len(), doc.builds.len(), doc.tests.len()),
            (3, 3, 5)
        );
        let status: Vec<&str> = doc
            .tests
            .iter()
            .map(|t| t["status"].as_str().unwrap())
            .collect();
        assert_eq!(status, vec!["PASS", "FAIL", "FAIL", "SKIP", "MISS"]);
        assert_eq!(
            doc.tests[1]["misc"]["ledger_ids"][0],
            "interpreted-prog-ksymbol-register"
        );
        assert_eq!(doc.tests[1]["misc"]["known"], true);
        assert_eq!(doc.tests[1]["misc"]["kept"], false);
        assert_eq!(doc.tests[2]["misc"]["kept"], true);
        assert_eq!(
            doc.tests[4]["misc"]["ledger_ids"].as_array().unwrap().len(),
            0
        );
        assert_eq!(doc.tests[0]["path"], "kloop.audit.hs");
        // The same build ids vm-test gives a Debian build.
        let p = super::Provenance::DebianBuild {
            package: "linux-image-6.12.118-1-cloud-amd64".into(),
            version: "6.12.118-1".into(),
            suite: "bookworm-backports".into(),
            deb_sha256: "b".repeat(64),
            image_sha256: "c".repeat(64),
            release: "6.12.118-1-cloud-amd64".into(),
        };
        assert_eq!(doc.builds[0]["id"], p.build()["id"]);
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/kloop/kcidb-samples");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("audit.json"),
            serde_json::to_string_pretty(&doc).unwrap(),
        )
        .unwrap();
    }
}
