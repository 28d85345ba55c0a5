//! `report-bug`: the mail a maintainer reads, ready for `git send-email`.
//!
//! It is the fix's patch (subject, the why from the source, `Fixes:`), with
//! the measured facts in the notes below the `---` line, where `git am`
//! drops them: the affected builds from the ledger and from bisection, how
//! `validate` judged the fix, where the stand-alone reproducer reproduces,
//! and the reproducer itself. Everything in it is read from what kloop
//! wrote (the ledger, `ab.json`, `repro-proof.json`): no figure is typed in.

use kloop_path_io::{PathIo, PathIoExt};

use crate::judge::ab::{AbClass, AbOutcome};
use crate::judge::known_issues::Issue;
use crate::run::standalone::ReproProof;

/// A fix patch split where a mail needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PatchParts {
    /// The subject line's text (after `Subject: `).
    pub subject: String,
    /// The commit message, up to the `---` line.
    pub message: String,
    /// The diffstat and the diff, after the `---` line.
    pub diff: String,
}

/// Why a fix patch or a ledger id gives no mail.
#[derive(Debug, thiserror::Error)]
pub enum BugMailError {
    #[error("no `Subject:` line")]
    NoSubject,
    #[error("no `---` line between the message and the diff")]
    NoCut,
    #[error("{path}: {source}")]
    Patch {
        path: std::path::PathBuf,
        #[source]
        source: Box<BugMailError>,
    },
    #[error("no fix for {id} under {dir}: write one (kernels/fixes/<id or prefix>/<source>.patch) and prove it with `cargo xtask validate --fix …` first")]
    NoFix { id: String, dir: std::path::PathBuf },
    #[error("{folder} has no patch for {source_name}; it has: {known}")]
    NoPatchFor {
        folder: std::path::PathBuf,
        source_name: String,
        known: String,
    },
    #[error("{0} holds no patch")]
    Empty(std::path::PathBuf),
    #[error(transparent)]
    Io(#[from] PathIo),
    #[error(transparent)]
    Fix(#[from] crate::run::fixes::FixError),
    #[error(transparent)]
    Suite(#[from] crate::run::suite::SuiteError),
    #[error(transparent)]
    Standalone(#[from] crate::run::standalone::StandaloneError),
}

/// Splits a patch in the form the fix folders keep.
pub fn split_patch(text: &str) -> Result<PatchParts, BugMailError> {
    let mut lines = text.lines();
    let subject = lines
        .by_ref()
        .find_map(|l| l.strip_prefix("Subject: "))
        .ok_or(BugMailError::NoSubject)?
        .to_string();
    let rest: Vec<&str> = lines.collect();
    let cut = rest
        .iter()
        .position(|l| *l == "---")
        .ok_or(BugMailError::NoCut)?;
    Ok(PatchParts {
        subject,
        message: rest[..cut].join("\n").trim().to_string() + "\n",
        diff: rest[cut + 1..].join("\n") + "\n",
    })
}

/// Who the mail goes to (from the source tree's `scripts/get_maintainer.pl`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recipients {
    pub to: Vec<String>,
    pub cc: Vec<String>,
}

/// One `validate` of the fix, with its A/B outcomes when `ab.json` was
/// still there.
#[derive(Debug, Clone)]
pub struct Validation {
    pub source: String,
    pub result: String,
    pub run: String,
    /// The day it ran (`validated` in the ledger).
    pub validated: String,
    /// The counts the ledger kept (the run directory may be pruned).
    pub summary: String,
    pub outcomes: Option<Vec<AbOutcome>>,
}

/// Everything the mail says.
#[derive(Debug, Clone)]
pub struct BugMail<'a> {
    /// The ledger entries the fix ends.
    pub issues: &'a [Issue],
    pub patch: PatchParts,
    /// Which source the patch is for (`linux-source-6.12`).
    pub patch_source: String,
    pub recipients: Recipients,
    pub validations: Vec<Validation>,
    /// The reproducer's single file, when there is one.
    pub reproducer: Option<String>,
    /// Its newest proof, when it was proven.
    pub proof: Option<ReproProof>,
}

/// The recipients `scripts/get_maintainer.pl` of the source tree `tree`
/// names for `patch`: people To, lists Cc; a stable backport
/// (`[PATCH 6.1.y]`) goes to the stable list with everyone else Cc.
/// `None` when the script cannot say.
pub fn recipients(
    tree: &std::path::Path,
    patch: &std::path::Path,
    subject: &str,
) -> Option<Recipients> {
    let out = std::process::Command::new("perl")
        .arg(tree.join("scripts/get_maintainer.pl"))
        .args(["--no-git", "--no-git-fallback", "--no-rolestats"])
        .arg(patch)
        .current_dir(tree)
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let (people, lists): (Vec<String>, Vec<String>) = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .partition(|l| l.contains('<'));
    Some(if subject.contains(".y]") {
        Recipients {
            to: vec!["stable@vger.kernel.org".into()],
            cc: people.into_iter().chain(lists).collect(),
        }
    } else {
        Recipients {
            to: people,
            cc: lists,
        }
    })
}

/// The ledger's records of `validate` runs of `patch` (one per run, though
/// each entry the fix ends carries it), with each run's `ab.json` when the
/// run directory under `root` is still there.
pub fn validations(root: &std::path::Path, issues: &[Issue], patch: &str) -> Vec<Validation> {
    let mut seen: Vec<&str> = Vec::new();
    let mut out = Vec::new();
    for f in issues
        .iter()
        .flat_map(|i| &i.fixes)
        .filter(|f| f.patch == patch)
    {
        if seen.contains(&f.run.as_str()) {
            continue;
        }
        seen.push(&f.run);
        let outcomes = std::fs::read_to_string(root.join(&f.run).join("ab.json"))
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok());
        out.push(Validation {
            source: f.source.clone(),
            result: f.result.clone(),
            run: f.run.clone(),
            validated: f.validated.clone(),
            summary: f.summary.clone(),
            outcomes,
        });
    }
    out
}

/// The mail, in the form `git send-email` takes.
pub fn render(m: &BugMail<'_>) -> String {
    let mut out = String::new();
    out.push_str(&format!("Subject: {}\n", m.patch.subject));
    if !m.recipients.to.is_empty() {
        out.push_str(&format!("To: {}\n", m.recipients.to.join(",\n    ")));
    }
    if !m.recipients.cc.is_empty() {
        out.push_str(&format!("Cc: {}\n", m.recipients.cc.join(",\n    ")));
    }
    out.push('\n');
    out.push_str(&m.patch.message);
    out.push_str("---\n");
    out.push_str(&notes(m));
    out.push('\n');
    out.push_str(&m.patch.diff);
    out
}

/// A fix of perf (every entry it ends is `component = "perf"`), not of
/// the kernel: proven with perf built with it (`KLOOP_PERF`), not with
/// `validate`; no stand-alone reproducer (it is perf's output).
fn is_perf_fix(issues: &[Issue]) -> bool {
    !issues.is_empty() && issues.iter().all(|i| i.component == "perf")
}

/// The notes below `---`: measured facts only.
fn notes(m: &BugMail<'_>) -> String {
    let mut n = String::new();
    n.push_str(&format!(
        "Notes (not part of the commit; written by kloop from its ledger and runs).\n\
         Add your Signed-off-by above the --- line before sending.\n\
         This patch is against Debian's {}.\n\n",
        m.patch_source
    ));
    for i in m.issues {
        n.push_str(&format!(
            "Ledger entry {} (rule {}): shows on the pins {}.\n",
            i.id,
            i.rule,
            i.pins.join(", ")
        ));
        if !i.upstream_fix.is_empty() {
            n.push_str(&format!("  Upstream and bisection: {}\n", i.upstream_fix));
        }
    }
    if !m.validations.is_empty() {
        n.push_str(if is_perf_fix(m.issues) {
            "\nperf built with the fix's patch, shipped into the guest (KLOOP_PERF), the entry's scenarios on every pin:\n"
        } else {
            "\nvalidate (each source built without and with the fix's patch for it, every scenario on both):\n"
        });
        for v in &m.validations {
            n.push_str(&format!("  {}: {} (run {})\n", v.source, v.result, v.run));
            if !v.summary.is_empty() {
                n.push_str(&format!("    {}\n", v.summary));
            }
            if let Some(outcomes) = &v.outcomes {
                for o in outcomes.iter().filter(|o| o.class != AbClass::Same) {
                    let fixed = if o.fixed.is_empty() {
                        String::new()
                    } else {
                        format!(" ({})", o.fixed.join(", "))
                    };
                    n.push_str(&format!(
                        "    {:<24} {}{fixed}\n",
                        o.scenario,
                        o.class.label()
                    ));
                }
            }
        }
    }
    if let Some(p) = &m.proof {
        n.push_str("\nThe reproducer below, run in a QEMU guest on each kernel (kloop's guest; as the only program of a plain initramfs with default limits):\n");
        for k in &p.kernels {
            n.push_str(&format!(
                "  {:<56} {}{}\n",
                match &k.release {
                    Some(r) => format!("{} ({r})", k.kernel),
                    None => k.kernel.clone(),
                },
                match &k.stock {
                    Some(s) => format!("{}; plain init: {}", k.outcome, s.outcome),
                    None => k.outcome.clone(),
                },
                if k.as_expected {
                    ""
                } else {
                    "  (not as expected)"
                }
            ));
        }
    }
    if let Some(r) = &m.reproducer {
        n.push_str("\nReproducer (gcc -static -O2 -o repro repro.c; run as root; exit 1: the bug shows):\n\n");
        n.push_str(r.trim_end());
        n.push('\n');
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    const PATCH: &str = "Subject: [PATCH] perf, bpf: Don't emit X\n\nWhy.\n\nFixes: 6ee52e2a3fe4 (\"perf, bpf: Introduce PERF_RECORD_BPF_EVENT\")\n---\n kernel/events/core.c | 9 +++++++++\n 1 file changed\n\ndiff --git a/kernel/events/core.c b/kernel/events/core.c\n+x\n";

    #[test]
    fn the_patch_splits_at_its_subject_and_its_dashes() {
        let p = split_patch(PATCH).unwrap();
        assert_eq!(p.subject, "[PATCH] perf, bpf: Don't emit X");
        assert!(p.message.starts_with("Why.") && p.message.contains("Fixes: 6ee52e2a3fe4"));
        assert!(p.diff.starts_with(" kernel/events/core.c"));
        assert!(split_patch("no subject").is_err());
    }

    #[test]
    fn the_mail_keeps_facts_below_the_dashes_where_git_am_drops_them() {
        let issue: Issue = toml::from_str(
            r#"id = "interp-reg"
rule = "load-symbols"
pins = ["6.1", "7.3"]
summary = "s"
evidence = "e"
review_by = "2027-05-21""#,
        )
        .unwrap();
        let issues = [issue];
        let mail = BugMail {
            issues: &issues,
            patch: split_patch(PATCH).unwrap(),
            patch_source: "linux-source-6.12".into(),
            recipients: Recipients {
                to: vec!["Maintainer <m@example.org>".into()],
                cc: vec!["list@example.org".into()],
            },
            validations: vec![Validation {
                source: "linux-source-6.12 6.12.117-1~deb12u1".into(),
                result: "FIXED".into(),
                run: "target/kloop/runs/1".into(),
                validated: "2026-11-26".into(),
                summary: "1 scenario(s): 0 same, 1 fixed".into(),
                outcomes: Some(vec![AbOutcome {
                    scenario: "interpreter".into(),
                    class: AbClass::Fixed,
                    details: vec![],
                    diff: vec![],
                    figures: vec![],
                    baseline_issues: vec![],
                    baseline_known: vec!["interp-reg".into()],
                    fixed: vec!["interp-reg".into()],
                    gone: Vec::new(),
                }]),
            }],
            reproducer: Some("int main(void) { return 0; }\n".into()),
            proof: None,
        };
        let text = render(&mail);
        let (commit, notes) = text.split_once("\n---\n").unwrap();
        assert!(commit.starts_with("Subject: [PATCH] perf, bpf: Don't emit X\nTo: Maintainer <m@example.org>\nCc: list@example.org\n\nWhy."));
        assert!(
            commit.ends_with("Introduce PERF_RECORD_BPF_EVENT\")"),
            "{commit}"
        );
        assert!(notes
            .contains("Ledger entry interp-reg (rule load-symbols): shows on the pins 6.1, 7.3."));
        assert!(notes.contains("1 scenario(s): 0 same, 1 fixed"));
        assert!(notes.contains("interpreter              FIXED (interp-reg)"));
        assert!(notes.contains("int main(void)"));
        // The diff comes last, after the notes.
        assert!(text.trim_end().ends_with("+x"));
        assert!(!is_perf_fix(&issues));
    }

    #[test]
    fn a_perf_fix_says_how_perf_was_proven() {
        let issue: Issue = toml::from_str(
            r#"id = "perf-name"
rule = "second-reader"
pins = ["6.1"]
component = "perf"
summary = "s"
evidence = "e"
review_by = "2027-05-21""#,
        )
        .unwrap();
        let issues = [issue];
        assert!(is_perf_fix(&issues));
        let mail = BugMail {
            issues: &issues,
            patch: split_patch(PATCH).unwrap(),
            patch_source: "linux-source-6.12".into(),
            recipients: Recipients::default(),
            validations: vec![Validation {
                source: "perf 6.1.176".into(),
                result: "FIXED".into(),
                run: "target/kloop/runs/2".into(),
                validated: "2026-11-27".into(),
                summary: "s".into(),
                outcomes: None,
            }],
            reproducer: None,
            proof: None,
        };
        let text = render(&mail);
        assert!(
            text.contains("perf built with the fix's patch, shipped into the guest (KLOOP_PERF)")
        );
        assert!(!text.contains("validate (each source built"));
    }
}

/// A composed mail and what it is about.
#[derive(Debug, Clone)]
pub struct Composed {
    /// The mail, ready for `git send-email` once signed off.
    pub text: String,
    /// The ledger ids the fix ends.
    pub ids: Vec<String>,
    /// The fix folder's name and the source its patch is for.
    pub name: String,
    pub source: String,
    /// The patch, relative to the workspace.
    pub patch: String,
    /// What the mail cannot claim yet, each with the command that would
    /// prove it.
    pub warnings: Vec<String>,
}

/// The mail for ledger entry `id`: its fix folder's patch for `source`
/// (else the newest series', closest to what maintainers apply), the
/// ledger's facts, every validate of the fix's patches the ledger records,
/// the stand-alone reproducer and its latest proof, and the recipients
/// from the source tree's `get_maintainer.pl`.
pub fn compose(
    layout: &crate::workspace::Layout,
    id: &str,
    source: Option<&str>,
) -> Result<Composed, BugMailError> {
    use crate::run::{fixes, standalone};
    let ledger =
        crate::workspace::load_ledger(layout).map_err(crate::run::suite::SuiteError::from)?;
    fixes::check_ids(&ledger, &[id.to_string()])?;
    let folder = fixes::folder_of(&layout.kernels(), id).ok_or_else(|| BugMailError::NoFix {
        id: id.to_string(),
        dir: layout.kernels().join(fixes::FIXES_DIR),
    })?;
    let patches = fixes::patches_of(&folder);
    let (source, patch) = choose_patch(&folder, &patches, source)?;
    let name = folder
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let ids = fixes::ids_named(&ledger, &name)?;
    let issues: Vec<Issue> = ledger
        .issues
        .iter()
        .filter(|i| ids.contains(&i.id))
        .cloned()
        .collect();
    let text = std::fs::read_to_string(&patch).at("reading", &patch)?;
    let parts = split_patch(&text).map_err(|e| BugMailError::Patch {
        path: patch.clone(),
        source: Box::new(e),
    })?;
    let rel = |p: &std::path::Path| {
        p.strip_prefix(&layout.root)
            .unwrap_or(p)
            .display()
            .to_string()
    };
    let reproducer = standalone::find(&layout.kernels(), &ledger, id).ok();
    let mut warnings = Vec::new();
    let to = recipients_of(layout, &source, &patch, &parts.subject).unwrap_or_else(|| {
        warnings.push(format!(
            "scripts/get_maintainer.pl of {source} gave no recipients; add To: and Cc: by hand"
        ));
        Recipients::default()
    });
    let mail = BugMail {
        issues: &issues,
        recipients: to,
        patch: parts,
        patch_source: source.clone(),
        // Every source the fix has a patch for: the backports' proofs too.
        validations: patches
            .iter()
            .flat_map(|(_, p)| validations(&layout.root, &issues, &rel(p)))
            .collect(),
        reproducer: reproducer.as_ref().map(|r| r.single_file()).transpose()?,
        proof: reproducer
            .as_ref()
            .and_then(|r| standalone::latest_proof(&layout.root.join("target/kloop/runs"), &r.name))
            .map(|(_, p)| p),
    };
    let patch = rel(&patch);
    let perf_fix = is_perf_fix(&issues);
    if mail.validations.is_empty() && perf_fix {
        warnings.push(format!("the ledger records no run of perf built with {patch}; build perf with it and run `KLOOP_PERF=<that perf> cargo xtask vm-test` on the entry's scenarios (docs/usage.md, \"A perf fix\"), then record it under the entry"));
    } else if mail.validations.is_empty() {
        warnings.push(format!("the ledger records no validate of {patch}; run `cargo xtask validate --source {source} --fix {name} --record` so the mail can say how it was proven"));
    }
    if mail.proof.is_none() && !perf_fix {
        warnings.push(format!(
            "the reproducer was never proven; run `cargo xtask repro --standalone {id} --prove`"
        ));
    }
    Ok(Composed {
        text: render(&mail),
        ids,
        name,
        source,
        patch,
        warnings,
    })
}

/// The patch for `source`, else the newest series'.
fn choose_patch(
    folder: &std::path::Path,
    patches: &[(String, std::path::PathBuf)],
    source: Option<&str>,
) -> Result<(String, std::path::PathBuf), BugMailError> {
    match source {
        Some(s) => patches
            .iter()
            .find(|(p, _)| p == s)
            .cloned()
            .ok_or_else(|| BugMailError::NoPatchFor {
                folder: folder.to_path_buf(),
                source_name: s.to_string(),
                known: patches
                    .iter()
                    .map(|(p, _)| p.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            }),
        None => patches
            .last()
            .cloned()
            .ok_or_else(|| BugMailError::Empty(folder.to_path_buf())),
    }
}

/// The source's pristine tree, then its get_maintainer.pl's recipients.
pub(crate) fn recipients_of(
    layout: &crate::workspace::Layout,
    source: &str,
    patch: &std::path::Path,
    subject: &str,
) -> Option<Recipients> {
    let spec = kloop_kernels::build::SourceSpec::parse(source, &layout.kernels()).ok()?;
    let cache = kloop_kernels::KernelCache::default_location().ok()?;
    let tree = kloop_kernels::build::source_tree(&cache, &spec, &Default::default()).ok()?;
    recipients(&tree, patch, subject)
}
