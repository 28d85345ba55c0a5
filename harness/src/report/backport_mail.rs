//! `report-bug --backport ID --series X.Y`: the stable-list mail for a
//! backport gap `audit` found.
//!
//! A series whose newest Debian build still carries a bug another series
//! has fixed lacks a backport: the mail asks the stable maintainers for
//! the upstream commit on that branch. What it says is read from what kloop
//! keeps, never typed in: the audit's kept answers (replayed into the
//! audit's table, [`crate::run::audit::recall`]), the fix folder's patches
//! and whether one applies to the series' Debian source (asked now, as
//! `validate` applies patches), the ledger's records of `validate`, and
//! the stand-alone reproducer with its latest proof. Each check says what
//! was done and what was not: a patch that applies is not called
//! validated unless the ledger records a `validate` of it.

use crate::judge::known_issues::Issue;
use crate::report::bug_mail::{Recipients, Validation};
use crate::run::audit::plan::Gap;
use crate::run::audit::{Audit, UpstreamCommit};
use crate::run::standalone::ReproProof;

/// The list every stable backport goes to.
pub const STABLE_LIST: &str = "stable@vger.kernel.org";

/// What was found out about a backport patch for the series.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PatchCheck {
    /// `patch -p1 --forward --dry-run` accepted `patch` on the source tree.
    Applies {
        /// The patch, relative to the workspace.
        patch: String,
        /// The source as its pin names it (`linux-source-6.1 6.1.176-1`).
        source: String,
        /// What `patch` said (offsets, fuzz); empty lines dropped.
        said: String,
        /// The patch's text, as the fix folder keeps it.
        text: String,
    },
    /// Every patch of the fix folder was tried and none applies.
    NoneApplies {
        source: String,
        /// Each patch tried, with the first line of `patch`'s refusal.
        tried: Vec<(String, String)>,
    },
    /// Nothing was tried: why, and what would make it possible.
    NotChecked { why: String, next: String },
}

/// Everything the backport mail says.
#[derive(Debug, Clone)]
pub struct BackportMail<'a> {
    /// The ledger entries the reproducer answers for (the one asked first).
    pub issues: &'a [Issue],
    /// The series that lacks the backport (`6.1`).
    pub series: String,
    pub gap: Gap,
    /// The audit the table is drawn from (recalled from kept answers).
    pub audit: &'a Audit,
    /// The audit runs whose answers the table stands on.
    pub runs: Vec<String>,
    pub upstream: Option<UpstreamCommit>,
    pub recipients: Recipients,
    /// The fix folder (`kernels/fixes/<name>`), when there is one.
    pub fix_folder: Option<String>,
    pub check: PatchCheck,
    /// The ledger's `validate` records of the patch that applies.
    pub validations: Vec<Validation>,
    pub reproducer: Option<String>,
    pub proof: Option<ReproProof>,
}

impl BackportMail<'_> {
    /// The series' newest build that answered, with its `uname -r`.
    fn newest(&self) -> Option<(String, Option<String>)> {
        let s = self.audit.series.iter().find(|s| s.series == self.series)?;
        let f = s.findings.get(&self.gap.reproducer)?;
        let b = s.builds.get(f.newest_answered?)?;
        let release = self
            .audit
            .boots
            .iter()
            .find(|r| r.version == b.version)
            .and_then(|r| r.release.clone());
        Some((b.version.clone(), release))
    }
}

/// The subject: the branch, and the commit when it is known.
pub fn subject(m: &BackportMail<'_>) -> String {
    match &m.upstream {
        Some(c) => format!("{}.y: please backport {}", m.series, c.short()),
        None => format!(
            "{}.y: please backport the upstream fix of {}",
            m.series,
            m.issues.first().map_or("", |i| i.id.as_str())
        ),
    }
}

/// The stable process's recipients: the stable list To, everyone the
/// source tree's `get_maintainer.pl` names for the fix Cc (the list
/// itself once).
pub fn stable_recipients(r: &Recipients) -> Recipients {
    let mut cc: Vec<String> = Vec::new();
    for a in r.to.iter().chain(&r.cc) {
        if !a.contains(STABLE_LIST) && !cc.contains(a) {
            cc.push(a.clone());
        }
    }
    Recipients {
        to: vec![STABLE_LIST.to_string()],
        cc,
    }
}

/// The mail, headers first, as `git send-email` takes it.
pub fn render(m: &BackportMail<'_>) -> String {
    let mut out = format!("Subject: {}\n", subject(m));
    if !m.recipients.to.is_empty() {
        out.push_str(&format!("To: {}\n", m.recipients.to.join(",\n    ")));
    }
    if !m.recipients.cc.is_empty() {
        out.push_str(&format!("Cc: {}\n", m.recipients.cc.join(",\n    ")));
    }
    out.push('\n');
    out.push_str(&request(m));
    out.push_str(&audit_part(m));
    out.push_str(&check_part(m));
    out.push_str(&reproducer_part(m));
    if let PatchCheck::Applies { text, .. } = &m.check {
        // `git am --scissors` takes what follows as the patch, in-body
        // Subject included.
        out.push_str("\n-- >8 --\n");
        out.push_str(text.trim_end());
        out.push('\n');
    }
    out
}

/// The ask: which commit, which branch, and why in one paragraph.
fn request(m: &BackportMail<'_>) -> String {
    let mut n = String::from("Hello,\n\n");
    match &m.upstream {
        Some(c) => {
            n.push_str(&format!(
                "please backport upstream commit\n\n  {}{}\n\n",
                c.id,
                c.subject
                    .as_ref()
                    .map_or(String::new(), |s| format!("\n  (\"{s}\")")),
            ));
        }
        None => n.push_str(&wrap(
            "please backport the upstream fix of the bug below. kloop's ledger \
             and fix folder do not name the upstream commit: find it and put it \
             here before sending.",
            72,
            "",
        )),
    }
    let newest = match m.newest() {
        Some((v, Some(r))) => format!("{v} ({r})"),
        Some((v, None)) => v,
        None => "-".into(),
    };
    let fixed: Vec<String> = m
        .gap
        .fixed_in
        .iter()
        .map(|f| match &f.first_fixed {
            Some(v) => format!("{} has it from {v}", f.series),
            None => format!("{} was clean in every build asked", f.series),
        })
        .collect();
    n.push_str(&wrap(
        &format!(
            "to {}.y. Debian's newest {} build, {newest}, still has the bug it \
             fixes; {}.",
            m.series,
            m.series,
            fixed.join(", ")
        ),
        72,
        "",
    ));
    n.push('\n');
    if let Some(i) = m.issues.first() {
        n.push_str(&format!("The bug (kloop ledger entry {}):\n\n", i.id));
        n.push_str(&wrap(&i.summary, 72, "  "));
        n.push('\n');
    }
    n
}

/// The audit's table and how its answers were obtained.
fn audit_part(m: &BackportMail<'_>) -> String {
    let mut n = String::from(
        "Which Debian builds carry it (cloud-amd64 flavour, per series). Each build\n\
         was booted under QEMU with the reproducer below as the only program of\n\
         a plain initramfs (busybox /init, the kernel's default limits): exit 1\n\
         affected, 0 clean, 77 cannot run. In each series the newest and the\n\
         oldest builds were booted and, where they disagree, a bisection over\n\
         the series' builds in Debian's version order found the first fixed\n\
         build; a build not booted is counted by the side of that change it\n\
         lies on (`asked`: builds booted for the series).\n",
    );
    if m.runs.is_empty() {
        n.push('\n');
    } else {
        n.push_str(&wrap(
            &format!(
                "The answers are those `cargo xtask audit` kept from its runs {}; \
                 nothing was booted to write this mail.",
                m.runs.join(", ")
            ),
            72,
            "",
        ));
        n.push('\n');
    }
    // The audit's table as `audit` prints it, with this series' gap line
    // only: the others are other mails.
    let mut audit = m.audit.clone();
    audit.gaps.retain(|g| g.series == m.series);
    n.push_str(&crate::report::audit::reproducer_table(
        &audit,
        &m.gap.reproducer,
    ));
    n.push_str(
        "\nThese are Debian's builds, which follow the stable releases with\n\
         Debian's own patches; kernel.org's stable trees were not tested.\n",
    );
    n
}

/// What was checked about a backport patch, and what was not.
fn check_part(m: &BackportMail<'_>) -> String {
    let folder = m.fix_folder.as_deref().unwrap_or("kernels/fixes/");
    let mut n = String::from("\nThe backport:\n");
    match &m.check {
        PatchCheck::Applies {
            patch,
            source,
            said,
            ..
        } => {
            let moved: Vec<&str> = said
                .lines()
                .filter(|l| l.contains("offset") || l.contains("fuzz"))
                .map(str::trim)
                .collect();
            let how = if moved.is_empty() {
                "cleanly (no offset, no fuzz)".to_string()
            } else {
                format!("with {}", moved.join("; "))
            };
            n.push_str(&item(&format!(
                "checked for this mail: {patch} applies to Debian's {source} \
                 (`patch -p1 --forward --dry-run`, as kloop's validate applies \
                 patches), {how}. It is below the scissors line."
            )));
            n.push_str(&validation_items(m, patch, source));
            if let Some(c) = &m.upstream {
                n.push_str(&item(&format!(
                    "not checked: whether upstream commit {} itself applies to {}.y \
                     (kloop has no stable git tree); the patch below is the fix \
                     folder's backport, its message says how it relates to the \
                     upstream commit.",
                    &c.id[..12.min(c.id.len())],
                    m.series
                )));
            }
        }
        PatchCheck::NoneApplies { source, tried } => {
            n.push_str(&item(&format!(
                "checked for this mail: no patch of {folder} applies to Debian's \
                 {source} (`patch -p1 --forward --dry-run`):"
            )));
            for (p, why) in tried {
                n.push_str(&format!("    {p}: {why}\n"));
            }
            n.push_str(&item(
                "no patch is included: the backport has to be written.",
            ));
        }
        PatchCheck::NotChecked { why, next } => {
            n.push_str(&item(&format!(
                "not checked: whether a patch of {folder} applies to {}.y: {why}. {next}",
                m.series
            )));
            n.push_str(&item("no patch is included."));
        }
    }
    n
}

/// Whether the patch that applies was validated before, as the ledger
/// records it: the mail reports those runs, it does not re-run them.
fn validation_items(m: &BackportMail<'_>, patch: &str, source: &str) -> String {
    let mut n = String::new();
    if m.validations.is_empty() {
        n.push_str(&item(&format!(
            "not validated: the ledger records no `cargo xtask validate` of \
             {patch}; it was only checked to apply."
        )));
    }
    for v in &m.validations {
        let other = if v.source == source {
            String::new()
        } else {
            format!(
                " That was {}; the tree checked above is {source}, where the \
                 patch was only checked to apply.",
                v.source
            )
        };
        n.push_str(&item(&format!(
            "validated before, as the ledger records (not re-run for this \
             mail): {} on {}, {}, run {} (the source built without and with \
             the patch, every kloop scenario on both: {}).{other}",
            v.result,
            v.source,
            v.validated,
            v.run,
            if v.summary.is_empty() {
                "no counts kept"
            } else {
                &v.summary
            }
        )));
    }
    n
}

/// Where the reproducer reproduces, and the reproducer.
fn reproducer_part(m: &BackportMail<'_>) -> String {
    let mut n = String::new();
    if let Some(p) = &m.proof {
        n.push_str(
            "\nThe reproducer's latest proof (`cargo xtask repro --standalone --prove`;\n\
             kloop's guest, then the only program of a plain initramfs):\n",
        );
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
    match &m.reproducer {
        Some(r) => {
            n.push_str(
                "\nReproducer (gcc -static -O2 -o repro repro.c; run as root; exit 1:\n\
                 the bug shows, 0: it does not, 77: it cannot run here and says why):\n\n",
            );
            n.push_str(r.trim_end());
            n.push('\n');
        }
        None => n.push_str("\nNo stand-alone reproducer is attached.\n"),
    }
    n
}

/// `text` re-flowed to `width` columns, each line indented.
fn wrap(text: &str, width: usize, indent: &str) -> String {
    wrap_first(text, width, indent, indent)
}

/// `text` re-flowed to `width` columns, the first line after `first`,
/// the others after `indent` (a list item: `- ` then two spaces). A word
/// longer than the width (a path) gets a line of its own.
fn wrap_first(text: &str, width: usize, first: &str, indent: &str) -> String {
    let mut out = String::new();
    let mut line = String::new();
    let mut prefix = first;
    for word in text.split_whitespace() {
        if !line.is_empty() && prefix.len() + line.len() + 1 + word.len() > width {
            out.push_str(&format!("{prefix}{line}\n"));
            line.clear();
            prefix = indent;
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.is_empty() {
        out.push_str(&format!("{prefix}{line}\n"));
    }
    out
}

/// A list item of the check.
fn item(text: &str) -> String {
    wrap_first(text, 72, "- ", "  ")
}

/// Why no backport mail was written. Bad input (exit 2 at the edge) is
/// [`BackportError::is_bad_input`]: each says what exists or which
/// command answers it.
#[derive(Debug, thiserror::Error)]
pub enum BackportError {
    #[error(
        "series {series}: the mirror serves no cloud-amd64 build of it; series served: {served}"
    )]
    NoBuilds { series: String, served: String },
    #[error(
        "the kept audit answers do not answer series {series} for {id} (no kept answer for {versions}); \
         run `cargo xtask audit {id} --series {series}`, then this command again"
    )]
    NotKept {
        id: String,
        series: String,
        versions: String,
    },
    #[error("series {series} is not affected by {id}: its newest build {version} answers `{answer}`, so there is no backport gap to report")]
    NotAffected {
        id: String,
        series: String,
        version: String,
        answer: String,
    },
    #[error("series {series} is affected by {id}, but no audited series has the fix (no series' newest build answers clean{unasked}), so the audit names no backport gap")]
    NoGap {
        id: String,
        series: String,
        /// The series the kept answers do not settle, with the command.
        unasked: String,
    },
    #[error(transparent)]
    Audit(#[from] crate::run::audit::AuditError),
    #[error(transparent)]
    Fix(#[from] crate::run::fixes::FixError),
    #[error(transparent)]
    Suite(#[from] crate::run::suite::SuiteError),
    #[error(transparent)]
    Standalone(#[from] crate::run::standalone::StandaloneError),
    #[error(transparent)]
    Kernel(#[from] kloop_kernels::KernelError),
}

impl BackportError {
    /// The user asked for something that is not there (exit 2).
    pub fn is_bad_input(&self) -> bool {
        match self {
            BackportError::Audit(e) => e.is_bad_input(),
            BackportError::Fix(crate::run::fixes::FixError::UnknownId { .. }) => true,
            BackportError::Standalone(crate::run::standalone::StandaloneError::UnknownId {
                ..
            }) => true,
            BackportError::NoBuilds { .. }
            | BackportError::NotKept { .. }
            | BackportError::NotAffected { .. }
            | BackportError::NoGap { .. } => true,
            _ => false,
        }
    }
}

/// A composed backport mail and what it is about.
#[derive(Debug, Clone)]
pub struct ComposedBackport {
    pub text: String,
    /// The reproducer's name (the fix folder's, as a rule).
    pub name: String,
    pub series: String,
    /// The check's one-line verdict, for the terminal.
    pub check: String,
    /// A patch is included (below the scissors line).
    pub carries_patch: bool,
    /// What the mail cannot say yet, each with the command that would.
    pub warnings: Vec<String>,
}

/// The backport request for ledger entry `id` on series `series`: the
/// gap from the kept audit answers, the fix folder's patch checked against
/// `linux-source-<series>` where kloop pins it, the recipients from the
/// source tree of the fix's patch.
pub fn compose(
    layout: &crate::workspace::Layout,
    id: &str,
    series: &str,
    fetch: &kloop_kernels::FetchOptions,
) -> Result<ComposedBackport, BackportError> {
    use crate::run::{audit, fixes, standalone};
    let ledger =
        crate::workspace::load_ledger(layout).map_err(crate::run::suite::SuiteError::from)?;
    fixes::check_ids(&ledger, &[id.to_string()])?;
    let recalled = audit::recall::recall(layout, id, fetch)?;
    let a = &recalled.audit;
    let reproducer = a
        .reproducers
        .first()
        .ok_or(audit::AuditError::NothingToAudit)?;
    let name = reproducer.name.clone();
    let gap = gap_of(&recalled, id, series)?;

    let rel = |p: &std::path::Path| {
        p.strip_prefix(&layout.root)
            .unwrap_or(p)
            .display()
            .to_string()
    };
    let folder = fixes::folder_of(&layout.kernels(), id);
    let patches = folder.as_deref().map(fixes::patches_of).unwrap_or_default();
    let source_name = format!("linux-source-{series}");
    let cache = kloop_kernels::KernelCache::default_location()?;
    let (check, applied) = check_patches(
        layout,
        &cache,
        &source_name,
        &patches,
        folder.as_deref(),
        fetch,
    );
    let mut warnings = Vec::new();

    let recipients = backport_recipients(
        layout,
        applied.as_ref(),
        &patches,
        &source_name,
        &mut warnings,
    );

    let issues = answered_for(&ledger, id, &reproducer.ids);
    let validations = match &applied {
        Some((_, p)) => crate::report::bug_mail::validations(&layout.root, &issues, &rel(p)),
        None => Vec::new(),
    };
    let r = standalone::find(&layout.kernels(), &ledger, id)?;
    let (proof, upstream) = proof_and_upstream(layout, id, &r, &mut warnings);
    let check_line = check_line(&check, &validations);
    let mail = BackportMail {
        issues: &issues,
        series: series.to_string(),
        gap,
        audit: a,
        runs: recalled.runs.iter().map(|p| run_name(p)).collect(),
        upstream,
        recipients,
        fix_folder: folder.as_deref().map(rel),
        check,
        validations,
        reproducer: Some(r.single_file()?),
        proof,
    };
    Ok(ComposedBackport {
        carries_patch: matches!(mail.check, PatchCheck::Applies { .. }),
        text: render(&mail),
        name,
        series: series.to_string(),
        check: check_line,
        warnings,
    })
}

/// The reproducer's latest proof and the upstream commit of the fix, as far
/// as they are known; each one missing is a warning.
fn proof_and_upstream(
    layout: &crate::workspace::Layout,
    id: &str,
    r: &crate::run::standalone::Reproducer,
    warnings: &mut Vec<String>,
) -> (Option<ReproProof>, Option<UpstreamCommit>) {
    let proof =
        crate::run::standalone::latest_proof(&layout.root.join("target/kloop/runs"), &r.name)
            .map(|(_, p)| p);
    if proof.is_none() {
        warnings.push(format!(
            "the reproducer was never proven; run `cargo xtask repro --standalone {id} --prove`"
        ));
    }
    let upstream = crate::run::audit::upstream_commit(&layout.kernels(), r);
    if upstream.is_none() {
        warnings.push(format!(
            "no upstream commit is known for {id} (no `[ Upstream commit HASH` in its fix folder's patches): the mail asks for it by hand"
        ));
    }
    (proof, upstream)
}

/// The ledger entries the mail is about: the one asked for first, then the
/// others its reproducer answers for.
fn answered_for(
    ledger: &crate::judge::known_issues::Ledger,
    id: &str,
    reproducer_ids: &[String],
) -> Vec<Issue> {
    let mut v: Vec<Issue> = ledger
        .issues
        .iter()
        .filter(|i| i.id == id)
        .cloned()
        .collect();
    v.extend(
        ledger
            .issues
            .iter()
            .filter(|i| i.id != id && reproducer_ids.contains(&i.id))
            .cloned(),
    );
    v
}

/// A run as the mail names it: its directory's name.
fn run_name(p: &std::path::Path) -> String {
    p.file_name()
        .map_or_else(|| p.display().to_string(), |n| n.to_string_lossy().into())
}

/// Recipients as `report-bug` derives them: get_maintainer.pl of the fix's
/// source tree over the patch (the one that applies, else this series',
/// else the newest), then the stable list To. Without any, the stable list
/// alone, and a warning to add the maintainers by hand.
fn backport_recipients(
    layout: &crate::workspace::Layout,
    applied: Option<&(String, std::path::PathBuf)>,
    patches: &[(String, std::path::PathBuf)],
    source_name: &str,
    warnings: &mut Vec<String>,
) -> Recipients {
    let for_recipients = applied
        .cloned()
        .or_else(|| patches.iter().find(|(s, _)| *s == source_name).cloned())
        .or_else(|| patches.last().cloned());
    let derived = for_recipients.as_ref().and_then(|(src, p)| {
        let text = std::fs::read_to_string(p).ok()?;
        let subject = crate::report::bug_mail::split_patch(&text).ok()?.subject;
        crate::report::bug_mail::recipients_of(layout, src, p, &subject)
    });
    match derived {
        Some(r) => stable_recipients(&r),
        None => {
            warnings.push(match &for_recipients {
                Some((src, _)) => format!(
                    "scripts/get_maintainer.pl of {src} gave no recipients; add the fix's maintainers to Cc: by hand"
                ),
                None => "the fix folder has no patch to ask scripts/get_maintainer.pl about; add the fix's maintainers to Cc: by hand".to_string(),
            });
            stable_recipients(&Recipients::default())
        }
    }
}

/// The one line `compose` says about the patch check, for the terminal.
fn check_line(check: &PatchCheck, validations: &[Validation]) -> String {
    match check {
        PatchCheck::Applies { patch, source, .. } => format!(
            "{patch} applies to {source} (dry run); {}",
            if validations.is_empty() {
                "the ledger records no validate of it".to_string()
            } else {
                validations
                    .iter()
                    .map(|v| format!("validate {} on {}", v.result, v.source))
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        ),
        PatchCheck::NoneApplies { source, .. } => {
            format!("no patch of the fix folder applies to {source}")
        }
        PatchCheck::NotChecked { why, .. } => format!("patch not checked: {why}"),
    }
}

/// The gap of `series` in the recalled audit, or why there is none to
/// report: a series not served, not settled by the kept answers (with the
/// audit command that settles it), not affected, or affected with no
/// series that has the fix.
pub fn gap_of(
    recalled: &crate::run::audit::recall::Recalled,
    id: &str,
    series: &str,
) -> Result<Gap, BackportError> {
    use crate::run::audit::plan::Answer;
    let a = &recalled.audit;
    let Some(s) = a.series.iter().find(|s| s.series == series) else {
        return Err(BackportError::NoBuilds {
            series: series.to_string(),
            served: a
                .series
                .iter()
                .map(|s| s.series.as_str())
                .collect::<Vec<_>>()
                .join(", "),
        });
    };
    if let Some(nk) = recalled.not_kept.iter().find(|n| n.series == series) {
        return Err(BackportError::NotKept {
            id: id.to_string(),
            series: series.to_string(),
            versions: nk.versions.join(", "),
        });
    }
    let name = a.reproducers.first().map_or("", |r| r.name.as_str());
    let finding = s.findings.get(name);
    let newest = finding.and_then(|f| f.newest());
    if newest != Some(&Answer::Affected) {
        return Err(BackportError::NotAffected {
            id: id.to_string(),
            series: series.to_string(),
            version: finding
                .and_then(|f| f.newest_answered.or(f.builds.checked_sub(1)))
                .and_then(|i| s.builds.get(i))
                .map_or("-".into(), |b| b.version.clone()),
            answer: newest.map_or("no answer", |a| a.label()).to_string(),
        });
    }
    a.gaps
        .iter()
        .find(|g| g.series == series)
        .cloned()
        .ok_or_else(|| {
            let unasked: Vec<&str> = recalled
                .not_kept
                .iter()
                .map(|n| n.series.as_str())
                .collect();
            BackportError::NoGap {
                id: id.to_string(),
                series: series.to_string(),
                unasked: if unasked.is_empty() {
                    String::new()
                } else {
                    format!(
                        "; the kept answers do not settle {}: `cargo xtask audit {id}` asks them",
                        unasked.join(", ")
                    )
                },
            }
        })
}

/// Tries the fix folder's patches on `source_name`'s pristine tree: the
/// series' own patch first, then the others, newest first. Returns the
/// check and the (source, path) of the patch that applies.
fn check_patches(
    layout: &crate::workspace::Layout,
    cache: &kloop_kernels::KernelCache,
    source_name: &str,
    patches: &[(String, std::path::PathBuf)],
    folder: Option<&std::path::Path>,
    fetch: &kloop_kernels::FetchOptions,
) -> (PatchCheck, Option<(String, std::path::PathBuf)>) {
    use kloop_kernels::build::{self, SourceSpec};
    let rel = |p: &std::path::Path| {
        p.strip_prefix(&layout.root)
            .unwrap_or(p)
            .display()
            .to_string()
    };
    if patches.is_empty() {
        return (
            PatchCheck::NotChecked {
                why: match folder {
                    Some(f) => format!("{} holds no patch", rel(f)),
                    None => "kernels/fixes/ has no folder for this bug".to_string(),
                },
                next: "Write one (kernels/fixes/<id>/<source>.patch) and prove it with `cargo xtask validate --fix …`.".to_string(),
            },
            None,
        );
    }
    let spec = match SourceSpec::parse(source_name, &layout.kernels()) {
        Ok(s) => s,
        Err(e) => return (source_not_pinned(e, source_name, patches), None),
    };
    let label = spec.label();
    let tree = match build::source_tree(cache, &spec, fetch) {
        Ok(t) => t,
        Err(e) => {
            return (
                PatchCheck::NotChecked {
                    why: format!("{label} could not be unpacked here ({e})"),
                    next: "Run this command again where the source can be fetched.".to_string(),
                },
                None,
            )
        }
    };
    let mut order: Vec<&(String, std::path::PathBuf)> =
        patches.iter().filter(|(s, _)| s == source_name).collect();
    order.extend(patches.iter().rev().filter(|(s, _)| s != source_name));
    let mut tried = Vec::new();
    for (src, p) in order {
        match build::check_applies(&tree, p) {
            Ok(said) => {
                let text = std::fs::read_to_string(p).unwrap_or_default();
                return (
                    PatchCheck::Applies {
                        patch: rel(p),
                        source: label,
                        said,
                        text,
                    },
                    Some((src.clone(), p.clone())),
                );
            }
            Err(e) => tried.push((rel(p), refusal(&e))),
        }
    }
    (
        PatchCheck::NoneApplies {
            source: label,
            tried,
        },
        None,
    )
}

/// Why the patches cannot be tried when `source_name` is no source kloop
/// can unpack, and how to pin it.
fn source_not_pinned(
    e: kloop_kernels::build::BuildError,
    source_name: &str,
    patches: &[(String, std::path::PathBuf)],
) -> PatchCheck {
    let why = match e {
        kloop_kernels::build::BuildError::UnknownSource { known, .. } => format!(
            "kloop pins no Debian source package {source_name} to try them on \
             (kernels/sources/ pins {known}); the folder's patches are for {}",
            patches
                .iter()
                .map(|(s, _)| s.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ),
        other => format!("{source_name}: {other}"),
    };
    PatchCheck::NotChecked {
        why,
        next: format!(
            "Where Debian ships {source_name}, `cargo xtask kernels pin-source {source_name} --suite SUITE` pins it; then run this command again."
        ),
    }
}

/// The line of `patch`'s refusal worth reporting: the first that says what
/// failed, else its last.
fn refusal(e: &kloop_kernels::build::BuildError) -> String {
    match e {
        kloop_kernels::build::BuildError::PatchFailed { output, .. } => output
            .lines()
            .find(|l| l.contains("FAILED") || l.contains("failed"))
            .or_else(|| output.lines().last())
            .unwrap_or("refused")
            .trim()
            .to_string(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::audit::kept::KeptAnswer;
    use crate::run::audit::plan::Answer;
    use crate::run::audit::recall::tests::served;
    use crate::run::audit::recall::{replay, Recalled};
    use crate::run::audit::{AuditedReproducer, BuildRef};

    /// A recorded audit: 6.1 affected throughout, 6.12 fixed from
    /// 6.12.113, 6.18 affected, 7.3 clean; 6.19 never audited.
    fn recorded() -> Recalled {
        let mut all = served("6.1", &["6.1.170-3", "6.1.192-2"]);
        all.extend(served(
            "6.12",
            &["6.12.100-1", "6.12.111-1", "6.12.113-1", "6.12.118-1"],
        ));
        all.extend(served("6.18", &["6.18.5-1", "6.18.15-1"]));
        all.extend(served("6.19", &["6.19.6-2"]));
        all.extend(served("7.3", &["7.3.4-1"]));
        let (by, names) = crate::run::audit::by_series(all);
        let lookup = |b: &BuildRef| {
            let answer = match b.version.as_str() {
                "6.12.113-1" | "6.12.118-1" | "7.3.4-1" => Answer::Clean,
                "6.19.6-2" => return None,
                _ => Answer::Affected,
            };
            Some(KeptAnswer {
                answer,
                version: b.version.clone(),
                release: Some(b.release.clone()),
                image_sha256: None,
                run: "/w/target/kloop/runs/1795764689-22645".into(),
            })
        };
        let r = AuditedReproducer {
            name: "hdr".into(),
            ids: vec!["hdr".into()],
            upstream: Some("b9d1fdc6f4ac (\"perf: Replace X\")".into()),
        };
        replay(&r, &names, &by, &lookup)
    }

    fn issue() -> Issue {
        toml::from_str(
            r#"id = "hdr"
rule = "parse"
pins = ["6.1"]
summary = "Every listener after the first gets a header.size too large."
evidence = "e"
review_by = "2027-05-21""#,
        )
        .unwrap()
    }

    const PATCH: &str = "Subject: [PATCH 6.1.y] perf: Start from the record's own size\n\n[ Upstream commit b9d1fdc6f4ac ]\n---\n kernel/events/core.c | 1 +\n";

    fn mail<'a>(
        issues: &'a [Issue],
        recalled: &'a Recalled,
        series: &str,
        check: PatchCheck,
        validations: Vec<Validation>,
    ) -> String {
        let gap = gap_of(recalled, "hdr", series).unwrap();
        render(&BackportMail {
            issues,
            series: series.into(),
            gap,
            audit: &recalled.audit,
            runs: vec!["1795764689-22645".into()],
            upstream: Some(UpstreamCommit {
                id: "b9d1fdc6f4ac1b6e49f9deafaf137da1407d9af1".into(),
                subject: Some("perf: Replace X".into()),
            }),
            recipients: stable_recipients(&Recipients {
                to: vec!["Stable <stable@vger.kernel.org>".into()],
                cc: vec![
                    "Maintainer <m@example.org>".into(),
                    "list@example.org".into(),
                ],
            }),
            fix_folder: Some("kernels/fixes/hdr".into()),
            check,
            validations,
            reproducer: Some("int main(void) { return 1; }\n".into()),
            proof: None,
        })
    }

    /// The text with every run of white space one space: what prose
    /// says, wherever it was wrapped.
    fn flat(text: &str) -> String {
        text.split_whitespace().collect::<Vec<_>>().join(" ")
    }

    fn applies(said: &str) -> PatchCheck {
        PatchCheck::Applies {
            patch: "kernels/fixes/hdr/linux-source-6.1.patch".into(),
            source: "linux-source-6.1 6.1.176-1".into(),
            said: said.into(),
            text: PATCH.into(),
        }
    }

    fn validation(source: &str) -> Validation {
        Validation {
            source: source.into(),
            result: "FIXED".into(),
            run: "target/kloop/runs/1795675424-26658".into(),
            validated: "2026-11-26".into(),
            summary: "41 scenario(s): 35 same, 5 fixed".into(),
            outcomes: None,
        }
    }

    #[test]
    fn the_request_names_the_commit_the_branch_and_goes_to_the_stable_list() {
        let issues = [issue()];
        let r = recorded();
        let text = mail(
            &issues,
            &r,
            "6.1",
            applies("checking file kernel/events/core.c"),
            vec![validation("linux-source-6.1 6.1.176-1")],
        );
        let (headers, body) = text.split_once("\n\n").unwrap();
        assert_eq!(
            headers,
            "Subject: 6.1.y: please backport b9d1fdc6f4ac (\"perf: Replace X\")\n\
             To: stable@vger.kernel.org\n\
             Cc: Maintainer <m@example.org>,\n    list@example.org"
        );
        assert!(body.contains(
            "  b9d1fdc6f4ac1b6e49f9deafaf137da1407d9af1\n  (\"perf: Replace X\")\n\nto 6.1.y."
        ));
        let body = flat(body);
        assert!(body.contains(
            "to 6.1.y. Debian's newest 6.1 build, 6.1.192-2 (6.1.192-2-cloud-amd64), \
             still has the bug it fixes; 6.12 has it from 6.12.113-1, 7.3 was clean in \
             every build asked."
        ));
        assert!(body.contains("The bug (kloop ledger entry hdr): Every listener"));
    }

    #[test]
    fn the_table_is_the_audits_with_this_series_gap_only() {
        let issues = [issue()];
        let r = recorded();
        let text = mail(&issues, &r, "6.1", applies(""), vec![]);
        let table =
            &text[text.find("  series builds").unwrap()..text.find("  backport gap").unwrap()];
        let rows: Vec<String> = table.lines().skip(1).map(flat).collect();
        // 6.19 has no kept answer: no row, never a guessed one.
        assert_eq!(
            rows,
            [
                "6.1 2 6.1.192-2 affected 2 0 0 - 2",
                "6.12 4 6.12.118-1 clean 2 2 0 6.12.113-1 4",
                "6.18 2 6.18.15-1 affected 2 0 0 - 2",
                "7.3 1 7.3.4-1 clean 0 1 0 - 1",
            ]
        );
        assert!(text.contains("backport gap: hdr 6.1 (newest 6.1.192-2) is affected"));
        assert!(!text.contains("backport gap: hdr 6.18"));
        assert!(flat(&text).contains("kept from its runs 1795764689-22645; nothing was booted"));
        assert!(text.contains("kernel.org's stable trees were not tested"));
    }

    #[test]
    fn a_patch_that_applies_says_how_and_is_not_called_validated_without_a_record() {
        let issues = [issue()];
        let r = recorded();
        let raw = mail(&issues, &r, "6.1", applies(""), vec![]);
        let text = flat(&raw);
        assert!(text.contains("applies to Debian's linux-source-6.1 6.1.176-1"));
        assert!(text.contains("cleanly (no offset, no fuzz)"));
        assert!(text.contains("- not validated: the ledger records no `cargo xtask validate`"));
        assert!(!text.contains("validated before"));
        assert!(text.contains("- not checked: whether upstream commit b9d1fdc6f4ac itself"));
        // The patch comes last, after git am's scissors.
        let (_, patch) = raw.split_once("\n-- >8 --\n").unwrap();
        assert_eq!(patch, PATCH);
        // The reproducer is inline, before the scissors.
        assert!(raw.find("int main(void)").unwrap() < raw.find("-- >8 --").unwrap());

        let moved = flat(&mail(
            &issues,
            &r,
            "6.1",
            applies(
                "checking file kernel/events/core.c\nHunk #1 succeeded at 9240 (offset 8 lines).",
            ),
            vec![validation("linux-source-6.1 6.1.170-1")],
        ));
        assert!(
            moved.contains("with Hunk #1 succeeded at 9240 (offset 8 lines)."),
            "{moved}"
        );
        assert!(moved.contains("- validated before, as the ledger records (not re-run for this mail): FIXED on linux-source-6.1 6.1.170-1, 2026-11-26"));
        assert!(moved.contains("That was linux-source-6.1 6.1.170-1; the tree checked above is"));
        assert!(moved.contains("only checked to apply."));
    }

    #[test]
    fn without_a_source_the_patch_is_not_checked_and_not_included() {
        let issues = [issue()];
        let r = recorded();
        let text = mail(
            &issues,
            &r,
            "6.18",
            PatchCheck::NotChecked {
                why: "kloop pins no Debian source package linux-source-6.18".into(),
                next: "Pin it.".into(),
            },
            vec![],
        );
        assert!(text.starts_with("Subject: 6.18.y: please backport"));
        assert!(flat(&text).contains("- not checked: whether a patch of kernels/fixes/hdr applies to 6.18.y: kloop pins no Debian source package linux-source-6.18. Pin it. - no patch is included."), "{text}");
        assert!(!text.contains("-- >8 --"));
        assert!(!text.contains("validated"));

        let none = mail(
            &issues,
            &r,
            "6.18",
            PatchCheck::NoneApplies {
                source: "linux-source-6.18 6.18.15-1".into(),
                tried: vec![(
                    "kernels/fixes/hdr/linux-source-6.1.patch".into(),
                    "Hunk #1 FAILED at 9232.".into(),
                )],
            },
            vec![],
        );
        assert!(none
            .contains("    kernels/fixes/hdr/linux-source-6.1.patch: Hunk #1 FAILED at 9232.\n"));
        assert!(none.contains("- no patch is included: the backport has to be written."));
        assert!(!none.contains("-- >8 --"));
    }

    #[test]
    fn bad_series_say_why_and_what_to_run() {
        let r = recorded();
        let e = gap_of(&r, "hdr", "6.12").unwrap_err();
        assert!(e.is_bad_input());
        assert_eq!(
            e.to_string(),
            "series 6.12 is not affected by hdr: its newest build 6.12.118-1 answers `clean`, so there is no backport gap to report"
        );
        let e = gap_of(&r, "hdr", "6.19").unwrap_err();
        assert!(e.is_bad_input());
        assert!(
            e.to_string().contains(
                "no kept answer for 6.19.6-2); run `cargo xtask audit hdr --series 6.19`"
            ),
            "{e}"
        );
        let e = gap_of(&r, "hdr", "5.4").unwrap_err();
        assert!(
            e.to_string()
                .contains("series served: 6.1, 6.12, 6.18, 6.19, 7.3"),
            "{e}"
        );
        assert_eq!(gap_of(&r, "hdr", "6.18").unwrap().series, "6.18");
    }

    #[test]
    fn affected_everywhere_is_no_gap_and_names_the_series_to_audit() {
        let (by, names) = crate::run::audit::by_series(
            [served("6.1", &["6.1.1"]), served("6.19", &["6.19.1"])].concat(),
        );
        let lookup = |b: &BuildRef| {
            b.version.starts_with("6.1.").then(|| KeptAnswer {
                answer: Answer::Affected,
                version: b.version.clone(),
                release: None,
                image_sha256: None,
                run: "/r".into(),
            })
        };
        let r = AuditedReproducer {
            name: "hdr".into(),
            ids: vec!["hdr".into()],
            upstream: None,
        };
        let recalled = replay(&r, &names, &by, &lookup);
        let e = gap_of(&recalled, "hdr", "6.1").unwrap_err();
        assert!(e.is_bad_input());
        assert!(
            e.to_string().contains("no audited series has the fix"),
            "{e}"
        );
        assert!(
            e.to_string()
                .contains("do not settle 6.19: `cargo xtask audit hdr` asks them"),
            "{e}"
        );
    }

    #[test]
    fn the_stable_list_is_to_and_named_once() {
        let r = stable_recipients(&Recipients {
            to: vec!["P <p@example.org>".into()],
            cc: vec![
                "stable@vger.kernel.org".into(),
                "l@example.org".into(),
                "P <p@example.org>".into(),
            ],
        });
        assert_eq!(r.to, vec![STABLE_LIST]);
        assert_eq!(r.cc, vec!["P <p@example.org>", "l@example.org"]);
    }
}
