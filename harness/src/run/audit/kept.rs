//! Answers kept between audits: a (build × reproducer) pair judged once is
//! not booted again.
//!
//! The key is what decides the answer: the build (its package's sha256 from
//! the mirror's signed index, so a warm audit needs no download to find its
//! answers), the reproducer's single C file (its sha256: an
//! edited reproducer is a new question) and [`FORMAT`] (how the plain init
//! runs it). Only settled answers are kept (affected, clean, cannot run);
//! a boot with no answer is asked again. Each entry is one file under
//! `<kloop cache>/audit/`, written under a temporary name and renamed into
//! place, so two kloop processes that judge the same pair at once each
//! leave a whole file, and a reader never sees half of one.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::plan::Answer;

/// Bumped when the way a reproducer is run changes what it answers.
pub const FORMAT: u32 = 1;

/// One kept answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeptAnswer {
    pub answer: Answer,
    /// The build's Debian version and `uname -r` as booted.
    pub version: String,
    pub release: Option<String>,
    /// The image booted (as its pin verified it), for the KCIDB build id.
    #[serde(default)]
    pub image_sha256: Option<String>,
    /// The run directory that booted it (may have been pruned since).
    pub run: PathBuf,
}

/// The kept answers of one cache.
#[derive(Debug, Clone)]
pub struct Kept {
    dir: PathBuf,
}

impl Kept {
    /// The answers kept under the kernel cache `root`.
    pub fn in_cache(root: &Path) -> Kept {
        Kept {
            dir: root.join("audit"),
        }
    }

    /// The key of the build `identity` (its package's sha256 from the
    /// signed index, known without downloading it) × the reproducer whose
    /// single file is `program_text`.
    pub fn key(identity: &str, program_text: &str) -> String {
        let mut h = Sha256::new();
        h.update(format!("kloop-audit-{FORMAT}\0{identity}\0").as_bytes());
        h.update(program_text.as_bytes());
        hex::encode(h.finalize())
    }

    fn path(&self, key: &str) -> PathBuf {
        self.dir.join(format!("{key}.json"))
    }

    /// The answer kept under `key`, if any (an unreadable entry is none:
    /// the pair is booted again and the entry rewritten).
    pub fn get(&self, key: &str) -> Option<KeptAnswer> {
        let text = std::fs::read_to_string(self.path(key)).ok()?;
        serde_json::from_str::<KeptAnswer>(&text)
            .ok()
            .filter(|k| k.answer.settled())
    }

    /// Keeps `a` under `key` when it is settled.
    pub fn put(&self, key: &str, a: &KeptAnswer) -> std::io::Result<()> {
        if !a.answer.settled() {
            return Ok(());
        }
        let text = serde_json::to_string_pretty(a).map_err(std::io::Error::other)?;
        kloop_kernels::write_atomically(&self.path(key), text.as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kept(answer: Answer) -> KeptAnswer {
        KeptAnswer {
            answer,
            version: "6.12.113-1~deb12u1".into(),
            release: Some("6.12.113+deb12-cloud-amd64".into()),
            image_sha256: None,
            run: "/r".into(),
        }
    }

    #[test]
    fn settled_answers_are_kept_and_others_asked_again() {
        let dir = tempfile::tempdir().unwrap();
        let k = Kept::in_cache(dir.path());
        let key = Kept::key(&"a".repeat(64), "int main() {}");
        assert_ne!(key, Kept::key(&"a".repeat(64), "int main() { return 1; }"));
        assert_ne!(key, Kept::key(&"b".repeat(64), "int main() {}"));
        assert_eq!(k.get(&key), None);
        k.put(&key, &kept(Answer::NoAnswer("panic".into())))
            .unwrap();
        assert_eq!(k.get(&key), None, "no answer is not kept");
        k.put(&key, &kept(Answer::Clean)).unwrap();
        assert_eq!(k.get(&key).unwrap().answer, Answer::Clean);
        // A damaged entry is no entry.
        std::fs::write(dir.path().join(format!("audit/{key}.json")), "{").unwrap();
        assert_eq!(k.get(&key), None);
    }

    /// Two processes keeping the same pair at once: every reader sees a
    /// whole entry, never a torn one (each write is a rename into place).
    #[test]
    fn concurrent_writers_leave_a_whole_entry() {
        let dir = tempfile::tempdir().unwrap();
        let k = Kept::in_cache(dir.path());
        let key = Kept::key("c", "x");
        std::thread::scope(|s| {
            for n in 0..4 {
                let k = k.clone();
                let key = key.clone();
                s.spawn(move || {
                    for _ in 0..50 {
                        let a = if n % 2 == 0 {
                            Answer::Affected
                        } else {
                            Answer::CannotRun("CANNOT RUN: x".into())
                        };
                        k.put(&key, &kept(a)).unwrap();
                        if let Ok(text) = std::fs::read_to_string(k.path(&key)) {
                            serde_json::from_str::<KeptAnswer>(&text).expect("a whole entry");
                        }
                    }
                });
            }
        });
        assert!(k.get(&key).is_some());
        let left: Vec<_> = std::fs::read_dir(dir.path().join("audit"))
            .unwrap()
            .flatten()
            .collect();
        assert_eq!(left.len(), 1, "no temporary file left");
    }
}
