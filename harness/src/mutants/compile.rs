//! Mutants decided by their code, and the schema kernel: each mutated
//! file compiled alone (Trivial Compiler Equivalence, duplicates, build
//! failures) and the mutants left built into one kernel, switched per
//! trial.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

use kloop_kernels::build::{BuildRequest, BuiltKernel};
use kloop_kernels::KernelCache;

use kloop_mutate::{schema, Mutant};

use super::data::Outcome;

/// Per mutant: its outcome when its code decides it (`None`: it must be
/// run), its code digest, and the seconds its compile took.
pub(super) type CompileOutcome = (Option<Outcome>, Option<String>, f64);

/// Compiles every mutant's file alone, `jobs` at a time, as kbuild
/// compiled the unmutated file in the unmutated build's output directory:
/// a compiler error is a build failure, the unmutated code is equivalence,
/// an earlier mutant's code a duplicate (of the earlier one, in order).
#[expect(clippy::too_many_lines)]
pub(super) fn compile_phase(
    cache: &KernelCache,
    req: &BuildRequest,
    baseline: &BuiltKernel,
    mutants: &[Mutant],
    jobs: usize,
    progress: &mut dyn FnMut(usize),
) -> Result<(f64, Vec<CompileOutcome>), String> {
    use kloop_kernels::build::objects::{compile_alone, CompileError};
    let out = kloop_kernels::build::objects_of(cache, req, baseline)
        .map_err(|e| e.to_string())?
        .ok_or("the unmutated build's output directory holds another build since")?;
    let tree = kloop_kernels::build::source_tree(cache, &req.source, &req.fetch)
        .map_err(|e| e.to_string())?;
    let tmp = cache.root().join("tmp");
    std::fs::create_dir_all(&tmp).map_err(|e| format!("creating {}: {e}", tmp.display()))?;
    // One path for every run (ccache keys on it; see compile_alone).
    let work = tmp.join("compile-alone");
    let started = Instant::now();
    let mut originals: BTreeMap<String, (String, String)> = BTreeMap::new();
    for m in mutants {
        if originals.contains_key(&m.file) {
            continue;
        }
        let path = tree.join(&m.file);
        let text = std::fs::read_to_string(&path)
            .map_err(|e| format!("reading {}: {e}", path.display()))?;
        let digest = compile_alone(&out, &m.file, &text, &work)
            .map_err(|e| format!("compiling the unmutated {} alone: {e}", m.file))?;
        originals.insert(m.file.clone(), (text, digest));
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    type Compiled = Option<(Result<String, CompileError>, f64)>;
    let compiled: std::sync::Mutex<Vec<Compiled>> =
        std::sync::Mutex::new((0..mutants.len()).map(|_| None).collect());
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    std::thread::scope(|scope| {
        for _ in 0..jobs.max(1) {
            let tx = tx.clone();
            let (next, originals, compiled, out, work) =
                (&next, &originals, &compiled, &out, &work);
            scope.spawn(move || loop {
                if crate::run::signals::interrupted() {
                    break;
                }
                let n = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let Some(m) = mutants.get(n) else { break };
                let t = Instant::now();
                let (original, _) = &originals[&m.file];
                let r = match schema::mutated_text(original, m) {
                    Ok(text) => compile_alone(out, &m.file, &text, work),
                    Err(e) => Err(CompileError::Refused(format!("kloop's own patch: {e}"))),
                };
                compiled.lock().unwrap_or_else(|p| p.into_inner())[n] =
                    Some((r, t.elapsed().as_secs_f64()));
                let _ = tx.send(());
            });
        }
        drop(tx);
        // Here, not in the workers: `progress` is the caller's.
        for (done, ()) in rx.iter().enumerate() {
            progress(done + 1);
        }
    });
    let compiled = compiled.into_inner().unwrap_or_else(|p| p.into_inner());
    let mut seen: BTreeMap<(String, String), String> = BTreeMap::new();
    let mut outcomes = Vec::new();
    for (m, c) in mutants.iter().zip(compiled) {
        outcomes.push(match c {
            None => (Some(Outcome::NotJudged("interrupted".into())), None, 0.0),
            Some((Err(CompileError::Refused(why)), secs)) => {
                (Some(Outcome::BuildFailed(why)), None, secs)
            }
            Some((Err(e), secs)) => (
                Some(Outcome::NotJudged(format!("compiling alone: {e}"))),
                None,
                secs,
            ),
            Some((Ok(d), secs)) => {
                let outcome = if d == originals[&m.file].1 {
                    Some(Outcome::CompilerEquivalent)
                } else if let Some(first) = seen.get(&(m.file.clone(), d.clone())) {
                    Some(Outcome::Duplicate(first.clone()))
                } else {
                    seen.insert((m.file.clone(), d.clone()), m.id.clone());
                    None
                };
                (outcome, Some(d), secs)
            }
        });
    }
    Ok((started.elapsed().as_secs_f64(), outcomes))
}

/// Builds one kernel holding the mutants `numbers` (indices into
/// `mutants`; the switch value of each is its index + 1). Returns the
/// kernel, the indices it holds, the mutants it cannot hold (`id: why`)
/// and the build's seconds.
pub(super) fn schema_build(
    cache: &KernelCache,
    req: &BuildRequest,
    mutants: &[Mutant],
    numbers: &[usize],
    patch_dir: &Path,
    on_build: &mut dyn FnMut(&str, kloop_kernels::build::BuildEvent),
) -> Result<(BuiltKernel, Vec<usize>, Vec<String>, f64), String> {
    let tree = kloop_kernels::build::source_tree(cache, &req.source, &req.fetch)
        .map_err(|e| e.to_string())?;
    let mut by_file: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for &n in numbers {
        by_file.entry(mutants[n].file.as_str()).or_default().push(n);
    }
    let mut patch = String::new();
    let mut included = Vec::new();
    let mut left_out = Vec::new();
    for (i, (file, ns)) in by_file.iter().enumerate() {
        let path = tree.join(file);
        let original = std::fs::read_to_string(&path)
            .map_err(|e| format!("reading {}: {e}", path.display()))?;
        let mut texts = Vec::new();
        for &n in ns {
            match schema::mutated_text(&original, &mutants[n]) {
                Ok(t) => texts.push((n, t)),
                Err(e) => left_out.push(format!("{}: {e}", mutants[n].id)),
            }
        }
        let variants: Vec<schema::Variant> = texts
            .iter()
            .map(|(n, t)| schema::Variant {
                number: *n as u32 + 1,
                function: &mutants[*n].function,
                mutated: t,
            })
            .collect();
        let s = schema::file_schema(&original, &variants, i == 0);
        included.extend(s.included.iter().map(|k| *k as usize - 1));
        left_out.extend(
            s.left_out
                .iter()
                .map(|(k, why)| format!("{}: {why}", mutants[*k as usize - 1].id)),
        );
        patch.push_str(&kloop_mutate::file_patch(file, &original, &s.text));
    }
    if included.is_empty() {
        return Err("no mutant fits a schema".into());
    }
    let path = patch_dir.join("schema.patch");
    std::fs::write(&path, &patch).map_err(|e| format!("writing {}: {e}", path.display()))?;
    let req = req.with_patches(vec![path]);
    let started = Instant::now();
    let built = kloop_kernels::build::build(cache, &req, &mut |e| on_build("schema", e))
        .map_err(|e| format!("building the schema kernel: {e}"))?;
    included.sort_unstable();
    Ok((built, included, left_out, started.elapsed().as_secs_f64()))
}

/// Trivial Compiler Equivalence: the unmutated build's object code of
/// each mutated file, and the object code of the mutants judged so far.
pub(super) struct Tce {
    /// file → digest of its unmutated object; empty when the unmutated
    /// build's objects are gone (its output directory was reused), and
    /// then every mutant is run.
    pub(super) base: BTreeMap<String, String>,
    /// (file, digest) → the first mutant judged with that code.
    pub(super) judged: BTreeMap<(String, String), String>,
}

impl Tce {
    pub(super) fn new(
        cache: &KernelCache,
        req: &BuildRequest,
        baseline: &BuiltKernel,
        mutants: &[Mutant],
    ) -> Tce {
        let mut base = BTreeMap::new();
        match kloop_kernels::build::objects_of(cache, req, baseline) {
            Ok(Some(out)) => {
                for m in mutants {
                    if base.contains_key(&m.file) {
                        continue;
                    }
                    match kloop_kernels::build::objects::code_digest(&out.join(object_of(&m.file))) {
                        Ok(d) => {
                            base.insert(m.file.clone(), d);
                        }
                        Err(e) => tracing::warn!("no compiler-equivalence check for {}: {e}", m.file),
                    }
                }
            }
            Ok(None) => tracing::warn!(
                "the unmutated build's objects were rebuilt since: every mutant is run (no compiler-equivalence check)"
            ),
            Err(e) => tracing::warn!("no compiler-equivalence check: {e}"),
        }
        Tce {
            base,
            judged: BTreeMap::new(),
        }
    }
}

/// `kernel/events/core.o` for `kernel/events/core.c`.
pub(super) fn object_of(file: &str) -> String {
    match file.strip_suffix(".c") {
        Some(stem) => format!("{stem}.o"),
        None => file.to_string(),
    }
}
