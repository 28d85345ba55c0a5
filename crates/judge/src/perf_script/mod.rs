//! The real perf as a second, independent reader of the side-band records.
//!
//! A `perf-tool` scenario runs `perf record` in the guest next to kloop's
//! own listeners; the agent sends the text of `perf report -D --header` on
//! its data as a `PerfScript` message. That text is the only perf output
//! with every field of every record: the summary line perf prints for a
//! BPF_EVENT has no tag, but `-D` also dumps each record's raw bytes, and
//! `--header` names the events' `sample_type`, which says how to read the
//! `sample_id` trailer.
//!
//! [`parse`] reads that text strictly. [`check`] then holds perf's view to
//! three others, under the rule [`RULE`] (`second-reader`):
//!
//! 1. **perf's parse against kloop's.** Every KSYMBOL / BPF_EVENT / LOST raw
//!    dump is parsed by kloop's record parser ([`kloop_records`]) with
//!    perf's `sample_type`; the fields must equal the ones perf printed
//!    (addr, len, type, flags, name; type, flags, id; cpu and time).
//! 2. **Synthesis against the facts.** At start perf walks
//!    `BPF_PROG_GET_NEXT_ID` and writes, per program alive, one KSYMBOL per
//!    JITed function and one PROG_LOAD, all with time 0 (perf zeroes the
//!    trailer). Which programs are alive then follows from the plan: loaded
//!    before `perf-record-start` and not unloaded (with a `wait-unloaded`)
//!    before it. Their records must be exactly those, in `BPF_PROG_GET_NEXT_ID`
//!    order, with `jited_ksyms` / `jited_func_lens` / the kernel's own
//!    kallsyms name / id / tag from the program's facts. A program perf
//!    synthesises that the agent did not load must be one kloop saw in
//!    `/proc/kallsyms` before recording (same address and name).
//! 3. **Recording against the kernel's and kloop's records.** The agent
//!    enables perf's events through perf's control FIFO and waits for the
//!    ack before its next step, and stops perf only after a
//!    `wait-unloaded`, so the records perf must have seen are exactly those
//!    of the loads and unloads the plan ran between the two steps: per
//!    function a register (unregister) with the facts' address, length and
//!    kallsyms name, then PROG_LOAD (PROG_UNLOAD) with the facts' id and
//!    tag. Nothing else may appear. Each record perf recorded must also be
//!    the twin of a record kloop's CPU-wide listener on the same CPU
//!    received — same fields, same relative order — and lie in time between
//!    that twin's neighbours in kloop's ring: the kernel writes one record to
//!    every listening event of the CPU in one preemption-disabled pass,
//!    reading the clock once per event, so no other record of that CPU can
//!    fall between the two copies.
//!
//! Where kloop's own stream of a CPU stops at a parse error (rule `parse`,
//! already a violation), records perf saw on that CPU after the last record
//! kloop parsed are not twinned; [`normalise`] says how many.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::{self, Write as _};

use kloop_protocol::{ListenerInfo, ProgFacts, Step};
use thiserror::Error;

pub mod attribution;
mod dump;
mod expected;
mod file;

pub use dump::*;
use expected::*;
pub use file::{agree, FileReading, FILE_RULE};

use crate::check::{Analysis, Violation};
use crate::evidence::RunEvidence;
use crate::normalise::mask_tags;
use kloop_records::{
    self, Record, RecordContent, BPF_EVENT_PROG_LOAD, BPF_EVENT_PROG_UNLOAD,
    KSYMBOL_FLAGS_UNREGISTER, KSYM_TYPE_BPF, PERF_RECORD_BPF_EVENT, PERF_RECORD_KSYMBOL,
    PERF_RECORD_LOST, PERF_SAMPLE_CPU, PERF_SAMPLE_TIME,
};

/// perf, reading the same kernel next to kloop, sees the records kloop's listeners got.
pub const RULE: &str = "second-reader";

/// Every rule this module reports (for the known-issues ledger's list).
pub const RULES: &[&str] = &[RULE, FILE_RULE, attribution::PERF_ATTRIBUTION];

/// At most this many violations of one kind are spelled out.
const MAX_PER_KIND: usize = 8;

fn push_capped(out: &mut Vec<Violation>, msgs: Vec<String>, what: &str) {
    let n = msgs.len();
    for m in msgs.into_iter().take(MAX_PER_KIND) {
        out.push(Violation::new(RULE, m));
    }
    if n > MAX_PER_KIND {
        out.push(Violation::new(
            RULE,
            format!("... and {} more {what}", n - MAX_PER_KIND),
        ));
    }
}

/// The second-reader comparison for one run; see the module docs. `steps`
/// is the plan the agent ran.
pub fn check(ev: &RunEvidence, analysis: &Analysis, steps: &[Step]) -> Vec<Violation> {
    let mut v = Vec::new();
    let runs_perf = steps
        .iter()
        .any(|s| matches!(s, Step::PerfRecordStart { .. }));
    if !runs_perf && ev.perf_scripts.is_empty() {
        return v;
    }
    let Some(dump) = one_dump(ev, &mut v) else {
        return v;
    };

    let mut parse_bad = Vec::new();
    let recs = perf_records(&dump, &mut parse_bad, &mut v);
    push_capped(&mut v, parse_bad, "disagreements between perf and kloop");

    let mut plan_bad = Vec::new();
    let lives = lives(steps, &ev.progs, &mut plan_bad);
    push_capped(&mut v, plan_bad, "plan problems");

    // 2. Synthesis.
    check_synthesis(ev, &lives, &recs, &mut v);

    // 3. Recording.
    let recorded: Vec<&PerfRecord> = recs.iter().filter(|r| !r.synthesised()).collect();
    check_recording(&lives, &recorded, &mut v);

    // Twins in kloop's own rings.
    let twin_bad = twins(ev, analysis, &recorded).violations;
    push_capped(&mut v, twin_bad, "twin mismatches");
    v
}

/// Step 1: the one perf output of the run, parsed, its events of one
/// sample_type (else a violation and `None`).
fn one_dump(ev: &RunEvidence, v: &mut Vec<Violation>) -> Option<PerfDump> {
    let script = match ev.perf_scripts.as_slice() {
        [one] => one,
        [] => {
            v.push(Violation::new(
                RULE,
                "the plan runs perf but the agent sent no perf output",
            ));
            return None;
        }
        more => {
            v.push(Violation::new(
                RULE,
                format!(
                    "{} perf outputs; a plan may record with perf once",
                    more.len()
                ),
            ));
            return None;
        }
    };
    let dump = match parse(&script.text) {
        Ok(d) => d,
        Err(e) => {
            v.push(Violation::new(
                RULE,
                format!("{e} (command: {})", script.command),
            ));
            return None;
        }
    };
    let distinct: BTreeSet<u64> = dump.sample_types.iter().copied().collect();
    if distinct.len() != 1 {
        v.push(Violation::new(RULE, format!(
                "perf's events have sample_types {:?}: one side-band record cannot be assigned to one of them",
                distinct.iter().map(|s| kloop_records::sample_type_names(*s)).collect::<Vec<_>>()
            )));
        return None;
    }
    Some(dump)
}

/// Step 2: perf's synthesised records are those of the agent's programs
/// alive when perf started, in id order; other programs' are held to
/// /proc/kallsyms.
fn check_synthesis(
    ev: &RunEvidence,
    lives: &[Life<'_>],
    recs: &[PerfRecord],
    v: &mut Vec<Violation>,
) {
    let synth: Vec<&PerfRecord> = recs.iter().filter(|r| r.synthesised()).collect();
    let mut alive: Vec<&Life> = lives
        .iter()
        .filter(|l| l.load == Phase::Before && l.unload != Some(Phase::Before))
        .collect();
    alive.sort_by_key(|l| l.facts.id);
    let mut expected: Vec<(RecordContent, String)> = Vec::new();
    for l in &alive {
        for s in expected_records(l.facts, false) {
            expected.push((s, l.facts.label.clone()));
        }
    }
    // Records of programs the agent did not load (by id, or by an address
    // none of its programs has) are checked against /proc/kallsyms instead.
    let ours = |r: &PerfRecord| match &r.side {
        RecordContent::BpfEvent { id, .. } => ev.progs.iter().any(|f| f.id == *id),
        RecordContent::Ksymbol { addr, .. } => {
            ev.progs.iter().any(|f| f.jited_ksyms.contains(addr))
        }
    };
    let mut synth_bad = Vec::new();
    let mut synth_typed = Vec::new();
    let (mine, foreign): (Vec<&PerfRecord>, Vec<&PerfRecord>) =
        synth.iter().copied().partition(|r| ours(r));
    for i in 0..mine.len().max(expected.len()) {
        match (mine.get(i), expected.get(i)) {
            (Some(r), Some((e, _))) if same(e, &r.side) => {}
            (Some(r), Some((e, label))) => {
                let msg = format!(
                    "perf synthesised {r} where the kernel's facts for {label:?} (alive when perf started) give {e}"
                );
                let facts = ev.progs.iter().find(|f| f.label == *label);
                match synthesised_ksymbol(&r.side, e, facts) {
                    Some(d) => synth_typed.push(Violation::new(RULE, msg).with(d)),
                    None => synth_bad.push(msg),
                }
            }
            (Some(r), None) => synth_bad.push(format!(
                "perf synthesised {r}, beyond the records of the programs alive when it started"
            )),
            (None, Some((e, label))) => synth_bad.push(format!(
                "perf did not synthesise {e} of {label:?}, which was alive when perf started"
            )),
            (None, None) => {}
        }
    }
    for r in &foreign {
        let known = match &r.side {
            RecordContent::Ksymbol { addr, name, .. } => ev
                .initial_kallsyms
                .iter()
                .any(|e| e.addr == *addr && e.name == *name),
            // Its symbols are checked on their own; its id has no other witness.
            RecordContent::BpfEvent { .. } => true,
        };
        if !known {
            synth_bad.push(format!(
                "perf synthesised {r} for a program the agent did not load and kloop did not see in /proc/kallsyms before recording"
            ));
        }
    }
    push_capped(v, synth_bad, "synthesis differences");
    v.extend(synth_typed);
}

/// Step 3: perf's recorded records are exactly those of the loads and
/// unloads the plan ran while perf recorded.
fn check_recording(lives: &[Life<'_>], recorded: &[&PerfRecord], v: &mut Vec<Violation>) {
    let mut want: Vec<(RecordContent, String)> = Vec::new();
    for l in lives {
        if l.load == Phase::During {
            for s in expected_records(l.facts, false) {
                want.push((s, l.facts.label.clone()));
            }
        }
        if l.unload == Some(Phase::During) {
            for s in expected_records(l.facts, true) {
                want.push((s, l.facts.label.clone()));
            }
        }
    }
    let mut rec_bad = Vec::new();
    let mut taken = vec![false; want.len()];
    for r in recorded {
        match want
            .iter()
            .enumerate()
            .position(|(i, (s, _))| !taken[i] && same(s, &r.side))
        {
            Some(i) => taken[i] = true,
            None => rec_bad.push(format!(
                "perf recorded {r}, which no load or unload the plan ran while perf recorded explains"
            )),
        }
    }
    for (i, (s, label)) in want.iter().enumerate() {
        if !taken[i] {
            rec_bad.push(format!(
                "perf did not record {s} of {label:?}, loaded or unloaded while perf recorded"
            ));
        }
    }
    push_capped(v, rec_bad, "recording differences");
}

/// The typed fields of a synthesised KSYMBOL that differs from the
/// kernel's: which fields, and whether perf's name is the one
/// `synthesize_bpf_prog_name()` (tools/perf/util/bpf-event.c) builds from
/// `prog_tags[0]` where the kernel named the symbol after the program's tag.
fn synthesised_ksymbol(
    perf: &RecordContent,
    kernel: &RecordContent,
    facts: Option<&ProgFacts>,
) -> Option<crate::check::Detail> {
    let (
        RecordContent::Ksymbol {
            addr: pa,
            len: pl,
            ksym_type: pt,
            flags: pf,
            name: pn,
        },
        RecordContent::Ksymbol {
            addr: ka,
            len: kl,
            ksym_type: kt,
            flags: kf,
            name: kn,
        },
    ) = (perf, kernel)
    else {
        return None;
    };
    let fields: Vec<String> = [
        ("addr", pa != ka),
        ("len", pl != kl),
        ("type", pt != kt),
        ("flags", pf != kf),
        ("name", pn != kn),
    ]
    .iter()
    .filter(|(_, differ)| *differ)
    .map(|(f, _)| f.to_string())
    .collect();
    // bpf_prog_<16 hex digits>_<rest>
    let rest = kn.strip_prefix("bpf_prog_").and_then(|t| t.get(16..));
    let first_function_tag = match (facts.and_then(|f| f.func_tags.first()), rest) {
        (Some(tag), Some(rest)) => *pn == format!("bpf_prog_{}{rest}", hex::encode(tag)),
        _ => false,
    };
    Some(crate::check::Detail::SynthesisedKsymbol(
        crate::check::detail::SynthesisedKsymbol {
            fields,
            perf_name: pn.clone(),
            kernel_name: kn.clone(),
            first_function_tag,
        },
    ))
}

/// Equal content; a tag missing on either side is not compared.
fn same(a: &RecordContent, b: &RecordContent) -> bool {
    match (a, b) {
        (
            RecordContent::BpfEvent {
                event_type: t1,
                flags: f1,
                id: i1,
                tag: g1,
            },
            RecordContent::BpfEvent {
                event_type: t2,
                flags: f2,
                id: i2,
                tag: g2,
            },
        ) => t1 == t2 && f1 == f2 && i1 == i2 && (g1.is_none() || g2.is_none() || g1 == g2),
        _ => a == b,
    }
}

struct TwinResult {
    violations: Vec<String>,
    /// Per CPU: perf records not twinned because kloop's stream of that CPU
    /// stopped at a parse error before them.
    untwinned_after_parse_error: BTreeMap<u32, usize>,
}

/// Per CPU, kloop's listener of `set` on it: its index, its records, and
/// whether its stream stopped at a parse error before its end.
fn streams_by_cpu<'a>(
    ev: &RunEvidence,
    analysis: &'a Analysis,
    set: &[u32],
) -> BTreeMap<u32, (u32, &'a [Record], bool)> {
    let mut by_cpu: BTreeMap<u32, (u32, &[Record], bool)> = BTreeMap::new();
    for idx in set {
        let Some(l) = ev.listeners.iter().find(|l| l.index == *idx) else {
            continue;
        };
        let Ok(cpu) = u32::try_from(l.cpu) else {
            continue;
        };
        let recs = analysis
            .records_per_listener
            .get(idx)
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        // The analysis keeps the records before a parse error; a stream that
        // holds more bytes than those records did not parse to its end.
        let bytes = ev.streams.get(idx).map(Vec::len).unwrap_or(0) as u64;
        let parsed_to = recs
            .last()
            .map(|r| r.offset + u64::from(r.header.size))
            .unwrap_or(0);
        by_cpu.insert(cpu, (*idx, recs, parsed_to < bytes));
    }
    by_cpu
}

/// Pairs each record perf recorded with its copy in kloop's first CPU-wide
/// listener set; see the module docs.
fn twins(ev: &RunEvidence, analysis: &Analysis, recorded: &[&PerfRecord]) -> TwinResult {
    let mut out = TwinResult {
        violations: Vec::new(),
        untwinned_after_parse_error: BTreeMap::new(),
    };
    let Some(set) = analysis.sets.first() else {
        if !recorded.is_empty() {
            out.violations.push(
                "perf recorded side-band records but kloop had no CPU-wide listener to compare them with"
                    .into(),
            );
        }
        return out;
    };
    let by_cpu = streams_by_cpu(ev, analysis, set);
    let mut used: BTreeSet<(u32, usize)> = BTreeSet::new();
    let mut last_index: BTreeMap<u32, usize> = BTreeMap::new();
    for r in recorded {
        let Some(cpu) = r.cpu else {
            out.violations.push(format!(
                "{r}: perf's events do not sample the cpu, so its record cannot be matched to kloop's listener of that CPU"
            ));
            continue;
        };
        let Some((idx, krecs, truncated)) = by_cpu.get(&cpu) else {
            out.violations.push(format!(
                "{r}: kloop had no listener on cpu {cpu} in its first CPU-wide set"
            ));
            continue;
        };
        let found = krecs.iter().enumerate().position(|(j, k)| {
            !used.contains(&(*idx, j))
                && RecordContent::of_record(k).is_some_and(|s| same(&s, &r.side))
        });
        let Some(j) = found else {
            if *truncated {
                *out.untwinned_after_parse_error.entry(cpu).or_default() += 1;
            } else {
                out.violations.push(format!(
                    "{r}: kloop's listener L{idx} on cpu {cpu} has no record with these fields"
                ));
            }
            continue;
        };
        used.insert((*idx, j));
        let k = &krecs[j];
        if let Some(prev) = last_index.insert(cpu, j) {
            if j < prev {
                out.violations.push(format!(
                    "{r} comes after {} in perf's stream but its twin {k} comes before it in kloop's ring",
                    krecs[prev]
                ));
            }
        }
        if let Some(t) = r.time {
            let lo = j
                .checked_sub(1)
                .and_then(|p| krecs.get(p))
                .and_then(Record::time);
            let hi = krecs.get(j + 1).and_then(Record::time);
            let after_lo = lo.is_none_or(|lo| lo <= t);
            let before_hi = hi.is_none_or(|hi| t <= hi);
            if !(after_lo && before_hi) {
                out.violations.push(format!(
                    "{r} at time {t} is not between the neighbours of its twin {k} in kloop's ring (times {lo:?} and {hi:?}): the kernel writes both copies in one pass"
                ));
            }
        }
    }
    out
}

/// The line that opens perf's view in the normalised stream, its last
/// section.
pub const PERF_VIEW_HEADER: &str = "perf (second reader):";

/// How perf's view names what the agent's programs are: tags are named
/// after the program the record belongs to (its address or id), so two
/// loads of one fixture, which share tags, stay apart.
struct PerfNames<'e> {
    progs: &'e [ProgFacts],
}

impl PerfNames<'_> {
    fn owner_of(&self, side: &RecordContent) -> Option<&ProgFacts> {
        self.progs.iter().find(|f| match side {
            RecordContent::Ksymbol { addr, .. } => f.jited_ksyms.contains(addr),
            RecordContent::BpfEvent { id, .. } => f.id == *id,
        })
    }

    fn tag_name(t: &[u8; 8], owner: Option<&ProgFacts>) -> String {
        if let Some(f) = owner {
            if f.tag == *t {
                return format!("tag({})", f.label);
            }
            if let Some(fi) = f.func_tags.iter().position(|x| x == t) {
                return format!("ftag({}.f{fi})", f.label);
            }
        }
        format!("tag({})", hex::encode(t))
    }

    fn name_of(n: &str, owner: Option<&ProgFacts>) -> String {
        if let Some(rest) = n.strip_prefix("bpf_prog_") {
            if let Some(t) = rest
                .get(..16)
                .and_then(|h| hex::decode(h).ok())
                .and_then(|b| <[u8; 8]>::try_from(b).ok())
            {
                return format!(
                    "bpf_prog_<{}>{}",
                    Self::tag_name(&t, owner),
                    mask_tags(&rest[16..])
                );
            }
        }
        mask_tags(n)
    }

    fn label_of(&self, side: &RecordContent) -> String {
        match (side, self.owner_of(side)) {
            (RecordContent::Ksymbol { addr, .. }, Some(f)) => {
                let fi = f.jited_ksyms.iter().position(|a| a == addr).unwrap_or(0);
                format!("{}.f{fi}", f.label)
            }
            (RecordContent::BpfEvent { .. }, Some(f)) => f.label.clone(),
            (RecordContent::Ksymbol { .. }, None) => "addr#?".into(),
            (RecordContent::BpfEvent { .. }, None) => "prog#?".into(),
        }
    }

    /// One record of perf's, named.
    fn write_record(&self, out: &mut String, side: &RecordContent) {
        let owner = self.owner_of(side);
        match side {
            RecordContent::Ksymbol {
                len,
                ksym_type,
                flags,
                name,
                ..
            } => {
                let _ = write!(
                    out,
                    "KSYMBOL {} {} {} len={len} name={}",
                    kloop_records::ksymbol_action(*flags),
                    kloop_records::ksym_type_name(*ksym_type),
                    self.label_of(side),
                    Self::name_of(name, owner)
                );
            }
            RecordContent::BpfEvent {
                event_type,
                flags,
                tag,
                ..
            } => {
                let tag = tag
                    .map(|t| Self::tag_name(&t, owner))
                    .unwrap_or_else(|| "tag(?)".into());
                let _ = write!(
                    out,
                    "BPF_EVENT {} {} {tag}",
                    kloop_records::bpf_event_type_name(*event_type),
                    self.label_of(side)
                );
                if *flags != 0 {
                    let _ = write!(out, " flags={flags:#x}");
                }
            }
        }
    }
}

/// Text for the trial's normalised stream (appended after kloop's own):
/// perf's view with addresses, ids and tags named after the agent's
/// programs. Empty when the run has no perf output.
pub fn perf_view(ev: &RunEvidence, analysis: &Analysis) -> String {
    let Some(script) = ev.perf_scripts.first() else {
        return String::new();
    };
    let mut out = format!("{PERF_VIEW_HEADER}\n");
    let dump = match parse(&script.text) {
        Ok(d) => d,
        Err(e) => {
            let _ = writeln!(out, "  unreadable: {e}");
            return out;
        }
    };
    let _ = writeln!(
        out,
        "  sample_type={}{}",
        dump.sample_types
            .iter()
            .map(|s| kloop_records::sample_type_names(*s))
            .collect::<Vec<_>>()
            .join(","),
        if dump.sample_id_all {
            " sample_id_all"
        } else {
            ""
        }
    );
    let names = PerfNames { progs: &ev.progs };
    let (mut ignored, mut faults) = (Vec::new(), Vec::new());
    let recs = perf_records(&dump, &mut ignored, &mut faults);
    for (title, synth) in [("synthesised", true), ("recorded", false)] {
        let _ = writeln!(out, "  {title}:");
        for r in recs.iter().filter(|r| r.synthesised() == synth) {
            out.push_str("    ");
            names.write_record(&mut out, &r.side);
            out.push('\n');
        }
    }
    let recorded: Vec<&PerfRecord> = recs.iter().filter(|r| !r.synthesised()).collect();
    let t = twins(ev, analysis, &recorded);
    for (cpu, n) in &t.untwinned_after_parse_error {
        let _ = writeln!(
            out,
            "  not twinned: {n} record(s) on cpu {cpu}, after the point where kloop's own stream of that CPU failed to parse"
        );
    }
    out
}

#[cfg(test)]
mod tests;
