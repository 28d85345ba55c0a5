//! `report-bug ID`: the mail for a known kernel bug with its fix, from the
//! ledger, the fix folder, validate's and the reproducer's runs.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use kloop::report::bug_mail::{self, BugMail, Recipients, Validation};
use kloop::run::{fixes, standalone, suite};

use crate::{layout, ReportBugArgs};

pub(crate) fn report_bug(a: ReportBugArgs) -> Result<ExitCode> {
    let layout = layout();
    let ledger = suite::load_ledger(&layout)?;
    fixes::check_ids(&ledger, std::slice::from_ref(&a.id))?;
    let Some(folder) = fixes::folder_of(&layout.kernels(), &a.id) else {
        bail!(
            "no fix for {} under {}: write one (kernels/fixes/<id or prefix>/<source>.patch) and prove it with `cargo xtask validate --fix …` first",
            a.id,
            layout.kernels().join(fixes::FIXES_DIR).display()
        );
    };
    let patches = fixes::patches_of(&folder);
    let (source, patch) = match &a.source {
        Some(s) => patches
            .iter()
            .find(|(p, _)| p == s)
            .cloned()
            .with_context(|| {
                format!(
                    "{} has no patch for {s}; it has: {}",
                    folder.display(),
                    patches
                        .iter()
                        .map(|(p, _)| p.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            })?,
        // The newest series: closest to what maintainers apply.
        None => patches
            .last()
            .cloned()
            .with_context(|| format!("{} holds no patch", folder.display()))?,
    };
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
        validations: validations(&layout.root, &issues, &rel),
        reproducer: reproducer.as_ref().map(|r| r.single_file()).transpose()?,
        proof: reproducer
            .as_ref()
            .and_then(|r| standalone::latest_proof(&layout.root.join("target/kloop/runs"), &r.name))
            .map(|(_, p)| p),
    };
    if mail.validations.is_empty() {
        eprintln!("kloop: warning: the ledger records no validate of {rel}; run `cargo xtask validate --source {source} --fix {name} --record` so the mail can say how it was proven");
    }
    if mail.proof.is_none() {
        eprintln!("kloop: warning: the reproducer was never proven; run `cargo xtask repro --standalone {} --prove`", a.id);
    }
    let out = a.out.clone().unwrap_or_else(|| {
        layout
            .root
            .join("target/kloop/report-bug")
            .join(format!("{name}-{source}.mail"))
    });
    write_atomically(&out, &bug_mail::render(&mail))?;
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

fn write_atomically(path: &Path, text: &str) -> Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let tmp = path.with_extension(format!("{}.tmp", std::process::id()));
    std::fs::write(&tmp, text).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))
}

/// The recipients `scripts/get_maintainer.pl` of the source's own tree
/// names for the patch: people To, lists Cc; a stable backport
/// (`[PATCH 6.1.y]`) goes to the stable list with everyone else Cc.
fn recipients(layout: &suite::Layout, source: &str, patch: &Path, subject: &str) -> Recipients {
    let tree =
        kloop_kernels::build::SourceSpec::parse(source, &layout.kernels()).and_then(|spec| {
            let cache = kloop_kernels::KernelCache::default_location()?;
            kloop_kernels::build::source_tree(&cache, &spec, &Default::default())
        });
    let lines = tree.ok().and_then(|tree| {
        let out = std::process::Command::new("perl")
            .arg(tree.join("scripts/get_maintainer.pl"))
            .args(["--no-git", "--no-git-fallback", "--no-rolestats"])
            .arg(patch)
            .current_dir(&tree)
            .output()
            .ok()?;
        out.status.success().then(|| {
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
    });
    let Some(lines) = lines else {
        eprintln!("kloop: warning: scripts/get_maintainer.pl of {source} gave no recipients; add To: and Cc: by hand");
        return Recipients::default();
    };
    let (people, lists): (Vec<String>, Vec<String>) =
        lines.into_iter().partition(|l| l.contains('<'));
    if subject.contains(".y]") {
        Recipients {
            to: vec!["stable@vger.kernel.org".into()],
            cc: people.into_iter().chain(lists).collect(),
        }
    } else {
        Recipients {
            to: people,
            cc: lists,
        }
    }
}

/// The ledger's records of validate runs of this patch (one per run, though
/// each entry the fix ends carries it), with each run's ab.json.
fn validations(
    root: &Path,
    issues: &[kloop::judge::known_issues::Issue],
    patch: &str,
) -> Vec<Validation> {
    let mut seen: Vec<String> = Vec::new();
    let mut out = Vec::new();
    for f in issues
        .iter()
        .flat_map(|i| &i.fixes)
        .filter(|f| f.patch == patch)
    {
        if seen.contains(&f.run) {
            continue;
        }
        seen.push(f.run.clone());
        let ab: PathBuf = root.join(&f.run).join("ab.json");
        let outcomes = std::fs::read_to_string(&ab)
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
