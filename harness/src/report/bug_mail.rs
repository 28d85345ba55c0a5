//! `report-bug`: the mail a maintainer reads, ready for `git send-email`.
//!
//! It is the fix's patch (subject, the why from the source, `Fixes:`), with
//! the measured facts in the notes below the `---` line, where `git am`
//! drops them: the affected builds from the ledger and from bisection, how
//! `validate` judged the fix, where the stand-alone reproducer reproduces,
//! and the reproducer itself. Everything in it is read from what kloop
//! wrote (the ledger, `ab.json`, `repro-proof.json`): no figure is typed in.

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

/// Splits a patch in the form the fix folders keep.
pub fn split_patch(text: &str) -> Result<PatchParts, String> {
    let mut lines = text.lines();
    let subject = lines
        .by_ref()
        .find_map(|l| l.strip_prefix("Subject: "))
        .ok_or("no `Subject:` line")?
        .to_string();
    let rest: Vec<&str> = lines.collect();
    let cut = rest
        .iter()
        .position(|l| *l == "---")
        .ok_or("no `---` line between the message and the diff")?;
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
        n.push_str(
            "\nvalidate (each source built without and with the fix's patch for it, every scenario on both):\n",
        );
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
        n.push_str("\nThe reproducer below, run in a QEMU guest on each kernel:\n");
        for k in &p.kernels {
            n.push_str(&format!(
                "  {:<56} {}{}\n",
                match &k.release {
                    Some(r) => format!("{} ({r})", k.kernel),
                    None => k.kernel.clone(),
                },
                k.outcome,
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
    }
}
