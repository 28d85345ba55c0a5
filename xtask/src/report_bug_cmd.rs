//! `report-bug ID`: the mail for a known kernel bug with its fix, from the
//! ledger, the fix folder, validate's and the reproducer's runs.

use std::path::Path;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use kloop::report::bug_mail::{self, BugMail, Recipients};
use kloop::run::{fixes, standalone, suite};

use crate::{layout, ReportBugArgs};

pub(crate) fn report_bug(a: ReportBugArgs) -> Result<ExitCode> {
    let layout = layout();
    let ledger = suite::load_ledger(&layout)?;
    fixes::check_ids(&ledger, std::slice::from_ref(&a.id))?;
    let folder = fix_folder(&layout, &a.id)?;
    let patches = fixes::patches_of(&folder);
    let (source, patch) = choose_patch(&folder, &patches, a.source.as_deref())?;
    let name = folder
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let ids = fixes::ids_named(&ledger, &name)?;
    let issues: Vec<_> = ledger
        .issues
        .iter()
        .filter(|i| ids.contains(&i.id))
        .cloned()
        .collect();
    let text =
        std::fs::read_to_string(&patch).with_context(|| format!("reading {}", patch.display()))?;
    let parts =
        bug_mail::split_patch(&text).map_err(|e| anyhow::anyhow!("{}: {e}", patch.display()))?;
    let rel = patch
        .strip_prefix(&layout.root)
        .unwrap_or(&patch)
        .display()
        .to_string();
    let reproducer = standalone::find(&layout.kernels(), &ledger, &a.id).ok();
    let mail = BugMail {
        issues: &issues,
        recipients: recipients(&layout, &source, &patch, &parts.subject),
        patch: parts,
        patch_source: source.clone(),
        // Every source the fix has a patch for: the backports' proofs too.
        validations: validations(&layout, &issues, &patches),
        reproducer: reproducer.as_ref().map(|r| r.single_file()).transpose()?,
        proof: reproducer
            .as_ref()
            .and_then(|r| standalone::latest_proof(&layout.root.join("target/kloop/runs"), &r.name))
            .map(|(_, p)| p),
    };
    warn_unproven(&mail, &rel, &source, &name, &a.id);
    let out = a.out.clone().unwrap_or_else(|| {
        layout
            .root
            .join("target/kloop/report-bug")
            .join(format!("{name}-{source}.mail"))
    });
    crate::write_atomically(&out, &bug_mail::render(&mail))?;
    println!(
        "kloop: the mail for {} ({}) is in {}",
        ids.join(", "),
        rel,
        out.display()
    );
    println!(
        "kloop: add your Signed-off-by, read it, then send it with `git send-email {}`",
        out.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// The fix folder `id` belongs to.
fn fix_folder(layout: &suite::Layout, id: &str) -> Result<std::path::PathBuf> {
    match fixes::folder_of(&layout.kernels(), id) {
        Some(folder) => Ok(folder),
        None => bail!(
            "no fix for {id} under {}: write one (kernels/fixes/<id or prefix>/<source>.patch) and prove it with `cargo xtask validate --fix …` first",
            layout.kernels().join(fixes::FIXES_DIR).display()
        ),
    }
}

/// Every source the fix has a patch for: the backports' proofs too.
fn validations(
    layout: &suite::Layout,
    issues: &[kloop::judge::known_issues::Issue],
    patches: &[(String, std::path::PathBuf)],
) -> Vec<bug_mail::Validation> {
    patches
        .iter()
        .flat_map(|(_, p)| {
            let rel = p
                .strip_prefix(&layout.root)
                .unwrap_or(p)
                .display()
                .to_string();
            bug_mail::validations(&layout.root, issues, &rel)
        })
        .collect()
}

/// The patch for `--source`, else the newest series' (closest to what
/// maintainers apply).
fn choose_patch(
    folder: &Path,
    patches: &[(String, std::path::PathBuf)],
    source: Option<&str>,
) -> Result<(String, std::path::PathBuf)> {
    let names = || {
        patches
            .iter()
            .map(|(p, _)| p.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    match source {
        Some(s) => patches
            .iter()
            .find(|(p, _)| p == s)
            .cloned()
            .with_context(|| {
                format!(
                    "{} has no patch for {s}; it has: {}",
                    folder.display(),
                    names()
                )
            }),
        None => patches
            .last()
            .cloned()
            .with_context(|| format!("{} holds no patch", folder.display())),
    }
}

/// Says what the mail cannot claim yet, and the command that would prove it.
fn warn_unproven(mail: &BugMail<'_>, rel: &str, source: &str, name: &str, id: &str) {
    if mail.validations.is_empty() {
        eprintln!("kloop: warning: the ledger records no validate of {rel}; run `cargo xtask validate --source {source} --fix {name} --record` so the mail can say how it was proven");
    }
    if mail.proof.is_none() {
        eprintln!("kloop: warning: the reproducer was never proven; run `cargo xtask repro --standalone {id} --prove`");
    }
}

/// The source's pristine tree, then its get_maintainer.pl's recipients;
/// a warning when there are none.
fn recipients(layout: &suite::Layout, source: &str, patch: &Path, subject: &str) -> Recipients {
    let tree =
        kloop_kernels::build::SourceSpec::parse(source, &layout.kernels()).and_then(|spec| {
            let cache = kloop_kernels::KernelCache::default_location()?;
            kloop_kernels::build::source_tree(&cache, &spec, &Default::default())
        });
    match tree
        .ok()
        .and_then(|t| bug_mail::recipients(&t, patch, subject))
    {
        Some(r) => r,
        None => {
            eprintln!("kloop: warning: scripts/get_maintainer.pl of {source} gave no recipients; add To: and Cc: by hand");
            Recipients::default()
        }
    }
}
