//! The judge's one door: every rule family over one run's evidence. Trials,
//! `vm-shell`, the fuzz targets and the tests call [`judge`]; none of them
//! picks families, so a new rule is a change inside this crate only, and a
//! caller that lacks an input (a by-hand session has no scenario) says so
//! in [`Inputs`] rather than by skipping a family.
//!
//! What comes back is the analysis (records, sets, violations, notes) and
//! the rules that could not be judged for want of evidence
//! ([`Unchecked`]): never a pass.

use kloop_protocol::Plan;

use crate::check::{self, Analysis, Unchecked, Violation};
use crate::evidence::RunEvidence;
use crate::expectation::Expectation;
use crate::kernel_log::KernelChecks;
use crate::known_issues::{Issue, Ledger};
use crate::perf_script::{self, FileReading, FILE_RULE};

/// Everything the judge reads about one run, as values.
#[derive(Debug, Clone, Copy)]
pub struct Inputs<'a> {
    /// What the guest sent.
    pub evidence: &'a RunEvidence,
    /// The scenario the run played, when there was one (a by-hand session
    /// or a fuzz input has none: no declared expectations, and perf's
    /// output is held to the steps the evidence shows).
    pub scenario: Option<ScenarioInputs<'a>>,
    /// The checks the kernel was built with (from its config): their
    /// evidence must arrive.
    pub kernel_checks: KernelChecks,
    /// perf's own `perf.data`, as `check-perf-data`'s reader read it on
    /// the host (that reader builds on this crate, so the host runs it).
    pub perf_file: Option<&'a PerfFile>,
}

/// What a scenario declares, for [`Inputs::scenario`].
#[derive(Debug, Clone, Copy)]
pub struct ScenarioInputs<'a> {
    /// Its name (the ledger's entries name scenarios).
    pub name: &'a str,
    /// Its plan.
    pub plan: &'a Plan,
    /// Its `[[expect]]` tables.
    pub expect: &'a [Expectation],
    /// The pin whose snapshot and expectations apply (`6.12`), if any.
    pub pin: Option<&'a str>,
    /// The pin whose ledger entries judge the kernel (a local build's is
    /// the pin of its series), if any.
    pub ledger_pin: Option<&'a str>,
    /// The ledger, for what perf's file and kloop's second reader must
    /// agree on.
    pub ledger: &'a Ledger,
}

/// perf's `perf.data` of a run, read on the host.
#[derive(Debug, Clone, Default)]
pub struct PerfFile {
    /// Its size in bytes.
    pub bytes: usize,
    /// What `check-perf-data`'s reader read in it (`stopped` says why it
    /// could not read it, or keep it).
    pub reading: FileReading,
    /// The ledger entries that reader recognises in it.
    pub file_knows: Vec<String>,
}

/// What [`judge`] found.
#[derive(Debug, Clone)]
pub struct Judged {
    /// Records, sets, every violation of every family, notes.
    pub analysis: Analysis,
    /// The rules the evidence did not let the judge decide.
    pub unchecked: Vec<Unchecked>,
}

/// Every rule family over `inputs`: the stream's invariants, the
/// scenario's expectations, perf as a second reader and its file, the
/// kernel's own checks, the JIT's books and the executable areas, the
/// spin reader's bytes, fault
/// recovery, and the oversized copies' account. Pure.
pub fn judge(inputs: &Inputs) -> Judged {
    let ev = inputs.evidence;
    let mut analysis = check::analyse(ev);
    let mut unchecked = Vec::new();
    let mut found: Vec<Violation> = Vec::new();
    if let Some(s) = &inputs.scenario {
        found.extend(crate::expect::check(s.expect, s.plan, ev, &analysis, s.pin));
    }
    let steps = inputs
        .scenario
        .map(|s| s.plan.steps.as_slice())
        .unwrap_or(&[]);
    found.extend(perf_script::check(ev, &analysis, steps));
    // perf as a consumer: samples in a live program's image filed under
    // its symbol.
    found.extend(perf_script::attribution::check(ev));
    unchecked.extend(perf_script::attribution::unchecked(ev));
    analysis.notes.extend(perf_script::attribution::notes(ev));
    // A checked kernel's own reports (KASAN, UBSAN, lockdep, kmemleak), and
    // what of their evidence did not arrive.
    found.extend(crate::kernel_log::check(ev));
    unchecked.extend(crate::kernel_log::unchecked(ev, inputs.kernel_checks));
    // The JIT's books: every charge returned, every chunk given back.
    found.extend(crate::jit_books::check(ev));
    unchecked.extend(crate::jit_books::unchecked(ev));
    // All executable memory: nothing kept unexplained, nothing listed
    // where no memory is.
    found.extend(crate::exec_areas::check(ev, &analysis));
    unchecked.extend(crate::exec_areas::unchecked(ev));
    // A spin reader's torn records: bytes published before written.
    found.extend(crate::published::check(ev));
    unchecked.extend(crate::published::unchecked(ev));
    analysis.notes.extend(crate::published::notes(ev));
    // A fail-nth sweep whose clean attempt failed: an injected failure the
    // kernel did not undo.
    found.extend(crate::fault_recovery::check(ev));
    analysis.violations.extend(found);
    if let (Some(file), Some(s)) = (inputs.perf_file, &inputs.scenario) {
        if let Some(note) = perf_file(ev, file, s, &mut analysis.violations) {
            analysis.notes.push(note);
        }
    } else if let Some(Err(why)) = &ev.perf_data {
        analysis.violations.push(Violation::new(
            FILE_RULE,
            format!("perf.data did not arrive whole: {why}"),
        ));
    }
    // Oversized copies, kloop's and perf's: do the write's other copies'
    // accumulated trailers account for each one's excess?
    let mut violations = std::mem::take(&mut analysis.violations);
    crate::emissions::annotate(ev, &analysis, &mut violations);
    analysis.violations = violations;
    Judged {
        analysis,
        unchecked,
    }
}

/// perf's own file, held to perf's dump of it and to kloop's own judging
/// of perf's records (rule `perf-data`): the ledger entries with a
/// perf.data sign the file reader recognises must be those kloop's
/// second-reader violations are known as. Returns what the reader read.
fn perf_file(
    ev: &RunEvidence,
    file: &PerfFile,
    s: &ScenarioInputs,
    violations: &mut Vec<Violation>,
) -> Option<String> {
    if let Some(Err(why)) = &ev.perf_data {
        violations.push(Violation::new(
            FILE_RULE,
            format!("perf.data did not arrive whole: {why}"),
        ));
        return None;
    }
    let dump = perf_script::parse(&ev.perf_scripts.first()?.text).ok()?;
    violations.extend(perf_script::agree(&dump, &file.reading));
    // kloop's own verdict on perf's records: its second-reader violations
    // as the ledger knows them. Compared: perf's bugs a perf.data can show
    // (component perf, a perf_data sign); the kernel's bugs in this
    // scenario hit kloop's listeners, not perf's copy, which is exact
    // (perf's events are iterated first) and checked by the rules above.
    let perf_bug = |i: &Issue| i.component != "kernel" && i.perf_data.is_some();
    let second: Vec<Violation> = violations
        .iter()
        .filter(|v| v.rule == perf_script::RULE)
        .cloned()
        .collect();
    let judgement = s.ledger.judge(s.ledger_pin.unwrap_or(""), s.name, &second);
    let kloop_knows: Vec<String> = judgement
        .known
        .iter()
        .filter(|(i, _)| perf_bug(i))
        .map(|(i, _)| i.id.clone())
        .collect();
    let file_knows: Vec<String> = file
        .file_knows
        .iter()
        .filter(|id| s.ledger.issues.iter().any(|i| i.id == **id && perf_bug(i)))
        .cloned()
        .collect();
    if s.ledger_pin.is_some() && file_knows != kloop_knows {
        violations.push(Violation::new(
            FILE_RULE,
            format!(
                "check-perf-data on perf's file knows [{}], kloop's second reader of the same records knows [{}]",
                file_knows.join(", "),
                kloop_knows.join(", ")
            ),
        ));
    }
    Some(format!(
        "perf.data: {} bytes, {} KSYMBOL/BPF_EVENT read by check-perf-data{}",
        file.bytes,
        file.reading.side_band.len(),
        if file_knows.is_empty() {
            String::new()
        } else {
            format!(", known: {}", file_knows.join(", "))
        }
    ))
}
