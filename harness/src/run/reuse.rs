//! A baseline's trial results kept for the next A/B (issue 27): `validate`
//! builds the same baseline kernel run after run and only the candidate
//! changes, so a baseline trial whose every input is unchanged need not
//! run again.
//!
//! A result is kept under a key hashed from everything that decides it:
//! the kernel (its image's bytes, or the pin's image hash; the snapshot set
//! and ledger pin it is judged by), the scenario's folder (its
//! `scenario.toml`, snapshots and program sources), kloop itself (the
//! running executable, in which the rules, the judge and the trial code are
//! compiled, and the guest agent binary with its fixtures), the ledger's
//! text, QEMU's version, the accelerator, the VM's CPUs and memory, the
//! extra command line and the boot mode. Any change is a new key; nothing
//! is invalidated by hand. Only settled outcomes are kept (ok, known bug,
//! skipped): a failure, an infrastructure error or a timeout runs again.
//!
//! The entry is the trial's result and its artefacts directory, written
//! under a temporary name and renamed into place; a reused result's
//! artefacts are copied into the run that reuses it, so each run directory
//! stays whole.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use sha2::{Digest, Sha256};

use crate::run::trial::{KernelUnderTest, TrialEnv, TrialResult, Verdict};
use crate::scenario::Scenario;

/// The file inside an entry that holds the result.
const RESULT_FILE: &str = "result.json";

/// The part of a key every scenario of one kernel on one run shares:
/// hashed once, since the kernel image and kloop's executable are the
/// large inputs.
pub struct KernelKey(String);

impl KernelKey {
    /// `kernel` on `env`, with the ledger's text; none when an input cannot
    /// be read (then nothing is reused or kept) or when the run blesses (it
    /// writes what others compare with).
    pub fn of(env: &TrialEnv, ledger_text: &str, kernel: &KernelUnderTest) -> Option<KernelKey> {
        if env.bless.snapshots || env.bless.overhead {
            return None;
        }
        let mut h = Sha256::new();
        let mut part = |name: &str, bytes: &[u8]| {
            h.update(name.as_bytes());
            h.update((bytes.len() as u64).to_le_bytes());
            h.update(bytes);
        };
        part("kloop", executable_sha256()?.as_bytes());
        part("agent", file_sha256(&env.agent)?.as_bytes());
        part("kernel", kernel_identity(kernel)?.as_bytes());
        part("ledger", ledger_text.as_bytes());
        part("qemu", env.qemu_version.as_bytes());
        part("accel", env.accel.accel.as_bytes());
        part(
            "vm",
            format!(
                "{} {} {:?} {:?}",
                env.cpus, env.memory_mib, env.extra_cmdline, env.boot
            )
            .as_bytes(),
        );
        Some(KernelKey(hex::encode(h.finalize())))
    }

    /// The key of this kernel × `scenario` (its folder's every file).
    pub fn for_scenario(&self, scenario: &Scenario) -> Option<String> {
        let mut h = Sha256::new();
        h.update(self.0.as_bytes());
        h.update(tree_sha256(&scenario.dir)?.as_bytes());
        Some(hex::encode(&h.finalize()[..12]))
    }
}

/// Kept baseline results, beside the run directories
/// (`target/kloop/reuse/<key>/`).
pub struct ReuseStore {
    dir: PathBuf,
}

impl ReuseStore {
    /// The store beside the run directories under `runs_root`.
    pub fn beside(runs_root: &Path) -> ReuseStore {
        ReuseStore {
            dir: runs_root.parent().unwrap_or(runs_root).join("reuse"),
        }
    }

    /// The kept result under `key`, its artefacts copied to `artefacts`
    /// (the trial's directory in the run that reuses it) and a note saying
    /// where it came from.
    pub fn take(&self, key: &str, artefacts: &Path) -> Option<TrialResult> {
        let entry = self.dir.join(key);
        let text = std::fs::read_to_string(entry.join(RESULT_FILE)).ok()?;
        let mut r: TrialResult = serde_json::from_str(&text).ok()?;
        copy_tree(&entry.join("artefacts"), artefacts).ok()?;
        let from = r
            .artefacts
            .parent()
            .and_then(Path::parent)
            .and_then(Path::file_name)
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        r.reused_from = Some(from);
        r.artefacts = artefacts.to_path_buf();
        Some(r)
    }

    /// Whether a result is kept under `key`.
    pub fn holds(&self, key: &str) -> bool {
        self.dir.join(key).join(RESULT_FILE).is_file()
    }

    /// Keeps `r` under `key` when its outcome is settled; a failure to keep
    /// it costs only the next run's time, so it is logged, not returned.
    pub fn keep(&self, key: &str, r: &TrialResult) {
        if !matches!(
            r.verdict,
            Verdict::Ok | Verdict::Known(_) | Verdict::Skipped(_)
        ) {
            return;
        }
        let entry = self.dir.join(key);
        let tmp = self.dir.join(format!(".{key}.{}.tmp", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        let written = copy_tree(&r.artefacts, &tmp.join("artefacts")).and_then(|()| {
            let json = serde_json::to_string_pretty(r).map_err(std::io::Error::other)?;
            std::fs::write(tmp.join(RESULT_FILE), json)
        });
        // A kept entry is whole or absent: renamed into place, never
        // written where a reader looks.
        let placed = written.and_then(|()| {
            let _ = std::fs::remove_dir_all(&entry);
            std::fs::rename(&tmp, &entry)
        });
        if let Err(e) = placed {
            let _ = std::fs::remove_dir_all(&tmp);
            tracing::warn!("keeping the baseline result of {} for reuse: {e}", r.id);
        }
    }
}

/// The bytes that decide what kernel runs and how it is judged.
fn kernel_identity(kernel: &KernelUnderTest) -> Option<String> {
    Some(match kernel {
        KernelUnderTest::Pin(p) => format!("pin {} {}", p.id, p.image_sha256),
        KernelUnderTest::DistroBuild { pin, series_pin } => {
            format!("distro {} {series_pin:?}", pin.image_sha256)
        }
        KernelUnderTest::Image(k) => format!(
            "image {} {:?} {:?}",
            file_sha256(&k.path)?,
            k.snapshot_as,
            k.ledger_pin
        ),
    })
}

/// This executable's sha256, once per process.
fn executable_sha256() -> Option<String> {
    static SHA: OnceLock<Option<String>> = OnceLock::new();
    SHA.get_or_init(|| file_sha256(&std::env::current_exe().ok()?))
        .clone()
}

fn file_sha256(path: &Path) -> Option<String> {
    let mut f = std::fs::File::open(path).ok()?;
    let mut h = Sha256::new();
    std::io::copy(&mut f, &mut h).ok()?;
    Some(hex::encode(h.finalize()))
}

/// Every file under `dir` by relative path and content, in name order.
fn tree_sha256(dir: &Path) -> Option<String> {
    let mut files = Vec::new();
    collect(dir, dir, &mut files).ok()?;
    files.sort();
    let mut h = Sha256::new();
    for rel in files {
        h.update(rel.to_string_lossy().as_bytes());
        h.update(file_sha256(&dir.join(&rel))?.as_bytes());
    }
    Some(hex::encode(h.finalize()))
}

fn collect(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let path = e.path();
        // A pending snapshot (`.snap.new`) is a review's leftover, not an
        // input.
        if path.extension().is_some_and(|x| x == "new") {
            continue;
        }
        if e.file_type()?.is_dir() {
            collect(root, &path, out)?;
        } else {
            out.push(path.strip_prefix(root).unwrap_or(&path).to_path_buf());
        }
    }
    Ok(())
}

fn copy_tree(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for e in std::fs::read_dir(from)? {
        let e = e?;
        let target = to.join(e.file_name());
        if e.file_type()?.is_dir() {
            copy_tree(&e.path(), &target)?;
        } else {
            std::fs::copy(e.path(), &target)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(dir: &Path, verdict: Verdict) -> TrialResult {
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        std::fs::write(dir.join("normalised.txt"), "KSYMBOL register\n").unwrap();
        std::fs::write(dir.join("sub/x"), "x").unwrap();
        TrialResult::for_test("built-abc", "basic", verdict, dir.to_str().unwrap())
    }

    /// A settled result comes back whole (its artefacts copied into the run
    /// that reuses it, a note saying from which run); a failure or an
    /// infrastructure error is never kept; a key nothing was kept under
    /// gives nothing.
    #[test]
    fn kept_results_come_back_whole_and_only_settled_ones() {
        let target = tempfile::tempdir().unwrap();
        let runs = target.path().join("runs");
        let store = ReuseStore::beside(&runs);
        let ok = result(&runs.join("1-2/built-abc/basic"), Verdict::Ok);
        store.keep("k1", &ok);
        let into = runs.join("3-4/baseline-built-abc/basic");
        let back = store.take("k1", &into).expect("kept");
        assert_eq!(back.verdict, Verdict::Ok);
        assert_eq!(back.artefacts, into);
        assert_eq!(
            std::fs::read_to_string(into.join("normalised.txt")).unwrap(),
            "KSYMBOL register\n"
        );
        assert!(into.join("sub/x").is_file());
        assert_eq!(back.reused_from.as_deref(), Some("1-2"));
        for (key, verdict) in [
            ("k2", Verdict::Infrastructure("QEMU died".into())),
            ("k3", Verdict::Timeout("silence".into())),
        ] {
            store.keep(key, &result(&runs.join("5-6/built-abc/basic"), verdict));
            assert!(store.take(key, &runs.join("7-8/x")).is_none(), "{key} kept");
        }
        assert!(store.take("never", &runs.join("9/x")).is_none());
        // What `keep_baseline` asks before running a trial: kept or not.
        assert!(store.holds("k1"));
        assert!(!store.holds("k2") && !store.holds("k3") && !store.holds("never"));
        // Nothing half-written is left beside the entries.
        let names: Vec<_> = std::fs::read_dir(target.path().join("reuse"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names, ["k1"]);
    }

    /// The scenario's part of the key follows every file's name and bytes,
    /// and ignores a pending snapshot review.
    #[test]
    fn the_scenario_hash_follows_its_files() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("scenario.toml"), "a").unwrap();
        std::fs::create_dir(dir.path().join("snapshots")).unwrap();
        std::fs::write(dir.path().join("snapshots/6.1.snap"), "s").unwrap();
        let first = tree_sha256(dir.path()).unwrap();
        std::fs::write(dir.path().join("snapshots/6.1.snap.new"), "pending").unwrap();
        assert_eq!(tree_sha256(dir.path()).unwrap(), first);
        std::fs::write(dir.path().join("snapshots/6.1.snap"), "t").unwrap();
        let changed = tree_sha256(dir.path()).unwrap();
        assert_ne!(changed, first);
        std::fs::rename(
            dir.path().join("snapshots/6.1.snap"),
            dir.path().join("snapshots/6.12.snap"),
        )
        .unwrap();
        assert_ne!(tree_sha256(dir.path()).unwrap(), changed);
    }
}
