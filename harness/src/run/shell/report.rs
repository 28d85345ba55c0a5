//! One `kloop-run` in the vm-shell guest, as the host sees it: the frames
//! of its session collected ([`ByHandRun`]) and turned into the text the
//! guest prints ([`render`]): the steps and their times, the programs, the
//! records of every listener set parsed and merged by time, and the rules
//! checked over the run, as a trial would check them.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use kloop_protocol::{Message, RecordsHeader, Step};
use kloop_records::{merge_by_time, Record};

use crate::judge::check::Analysis;
use crate::judge::evidence::RunEvidence;

/// Records shown per listener set in the guest; the report file on the
/// host has them all.
pub(crate) const RECORDS_SHOWN: usize = 200;

/// What one by-hand session sent.
#[derive(Debug, Default)]
pub(crate) struct ByHandRun {
    /// Its hello's `monotonic_ns`: the id the report carries back.
    pub hello_ns: u64,
    pub messages: Vec<Message>,
    pub streams: BTreeMap<u32, Vec<u8>>,
    pub step_marks: Vec<(u32, BTreeMap<u32, u64>)>,
    /// Channel bytes of this session.
    pub bytes: u64,
    /// What went wrong on the channel during the session (framing errors,
    /// streams out of order), in words.
    pub channel_notes: Vec<String>,
    /// What the kernel was built to check (its config), for the judge.
    pub kernel_checks: crate::judge::kernel_log::KernelChecks,
}

/// How a by-hand session ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RunEnd {
    /// `Done`.
    Done,
    /// The agent's own error (a step failed).
    AgentError(String),
}

impl ByHandRun {
    pub fn new(hello_ns: u64, kernel_checks: crate::judge::kernel_log::KernelChecks) -> Self {
        ByHandRun {
            hello_ns,
            kernel_checks,
            ..ByHandRun::default()
        }
    }

    /// Takes a `Records` frame's payload.
    pub fn records(&mut self, payload: &[u8]) {
        let Some((header, bytes)) = RecordsHeader::split(payload) else {
            self.channel_notes
                .push("a records frame shorter than its header".into());
            return;
        };
        let stream = self.streams.entry(header.listener).or_default();
        if header.stream_offset != stream.len() as u64 {
            self.channel_notes.push(format!(
                "listener {}: records at stream offset {} after {} bytes; the stream is cut there",
                header.listener,
                header.stream_offset,
                stream.len()
            ));
            return;
        }
        stream.extend_from_slice(bytes);
    }

    /// Takes a message; returns how the session ended if it ends it.
    pub fn message(&mut self, msg: Message) -> Option<RunEnd> {
        let end = match &msg {
            Message::Heartbeat { .. } => return None,
            Message::Done { .. } => Some(RunEnd::Done),
            Message::AgentError { step, message } => Some(RunEnd::AgentError(match step {
                Some(s) => format!("step {s}: {message}"),
                None => message.clone(),
            })),
            Message::StepStart { index, .. } => {
                let lens = self
                    .streams
                    .iter()
                    .map(|(l, s)| (*l, s.len() as u64))
                    .collect();
                self.step_marks.push((*index, lens));
                None
            }
            _ => None,
        };
        self.messages.push(msg);
        end
    }

    /// The evidence a trial's checks read.
    pub fn evidence(&self) -> RunEvidence {
        let mut ev = RunEvidence::from_messages(&self.messages, self.streams.clone());
        ev.step_marks = self.step_marks.clone();
        ev
    }
}

/// The report of `run`, ended by `end`: every record when `all`, else at
/// most [`RECORDS_SHOWN`] per listener set.
pub(crate) fn render(run: &ByHandRun, end: &RunEnd, all: bool) -> String {
    let ev = run.evidence();
    // The judge's one door, as for a trial; a by-hand session has no
    // scenario of its own (its steps are the user's), so no declared
    // expectations and no ledger.
    let judged = crate::judge::judge(&crate::judge::Inputs {
        evidence: &ev,
        scenario: None,
        kernel_checks: run.kernel_checks,
        perf_file: None,
    });
    let analysis = judged.analysis;
    let mut out = String::new();
    let scenario_steps: Vec<(u32, String, Option<u64>)> = steps(run);
    let _ = writeln!(
        out,
        "== kloop-run on {}: {} step(s) ==",
        ev.uname.release,
        scenario_steps.len()
    );
    for (index, what, elapsed) in &scenario_steps {
        let time = elapsed.map_or_else(|| "(did not finish)".to_string(), human_ns);
        let _ = writeln!(out, "  step {index:>2}  {what}  [{time}]");
    }
    for m in &run.messages {
        match m {
            Message::Log { text } => {
                let _ = writeln!(out, "  note: {text}");
            }
            Message::Unsupported {
                requirement,
                reason,
            } => {
                let _ = writeln!(
                    out,
                    "SKIPPED: requirement {} is not met: {reason}",
                    crate::scenario::requirement_name(*requirement)
                );
            }
            _ => {}
        }
    }
    for note in &run.channel_notes {
        let _ = writeln!(out, "  channel: {note}");
    }
    if let RunEnd::AgentError(e) = end {
        let _ = writeln!(out, "FAILED: {e}");
    }
    programs(&mut out, &ev);
    other_messages(&mut out, run);
    records(&mut out, &ev, &analysis, all);
    if analysis.violations.is_empty() {
        if !ev.listeners.is_empty() {
            let _ = writeln!(out, "rules: every rule held");
        }
    } else {
        let _ = writeln!(
            out,
            "rules: {} violation(s) (a by-hand selection of steps may break rules a whole plan keeps)",
            analysis.violations.len()
        );
        for v in &analysis.violations {
            let _ = writeln!(out, "  {v}");
        }
    }
    for u in &judged.unchecked {
        let _ = writeln!(
            out,
            "  {} ({})",
            u.line(),
            match u.gap {
                crate::judge::check::Gap::Lost => "evidence lost",
                crate::judge::check::Gap::NotInKernel => "not in this kernel",
            }
        );
    }
    for note in &analysis.notes {
        let _ = writeln!(out, "  {note}");
    }
    out
}

/// (index, the step in words, its time) from the session's step frames.
fn steps(run: &ByHandRun) -> Vec<(u32, String, Option<u64>)> {
    let mut out: Vec<(u32, String, Option<u64>)> = Vec::new();
    for m in &run.messages {
        match m {
            Message::StepStart { index, what } => {
                let what = serde_json::from_str::<Step>(what)
                    .map_or_else(|_| what.clone(), |s| s.one_line());
                out.push((*index, what, None));
            }
            Message::StepDone {
                index, elapsed_ns, ..
            } => {
                if let Some(s) = out.iter_mut().rev().find(|s| s.0 == *index) {
                    s.2 = Some(*elapsed_ns);
                }
            }
            _ => {}
        }
    }
    out
}

fn programs(out: &mut String, ev: &RunEvidence) {
    if ev.progs.is_empty() {
        return;
    }
    let _ = writeln!(out, "programs:");
    for p in &ev.progs {
        let functions: Vec<String> = p
            .jited_ksyms
            .iter()
            .zip(p.jited_func_lens.iter().chain(std::iter::repeat(&0)))
            .map(|(a, l)| format!("{a:#x}+{l}"))
            .collect();
        let _ = writeln!(
            out,
            "  {}: id {} tag {} name {:?} type {}, JITed functions {}",
            p.label,
            p.id,
            hex::encode(p.tag),
            p.name,
            p.prog_type,
            if functions.is_empty() {
                "none (interpreted?)".to_string()
            } else {
                functions.join(" ")
            }
        );
    }
}

/// Messages with no section of their own (attach details, counters, files
/// read, storm and lookup summaries, timings…), one JSON line each.
fn other_messages(out: &mut String, run: &ByHandRun) {
    let mut first = true;
    for m in &run.messages {
        let shown_elsewhere = matches!(
            m,
            Message::Hello { .. }
                | Message::KernelFacts { .. }
                | Message::StepStart { .. }
                | Message::StepDone { .. }
                | Message::Listener(_)
                | Message::Prog(_)
                | Message::Log { .. }
                | Message::Done { .. }
                | Message::AgentError { .. }
                | Message::Unsupported { .. }
                | Message::Heartbeat { .. }
                | Message::InitialKallsyms { .. }
        );
        if shown_elsewhere {
            continue;
        }
        if first {
            let _ = writeln!(out, "agent said:");
            first = false;
        }
        let mut line = serde_json::to_string(m).unwrap_or_default();
        if line.len() > 300 {
            let cut = (0..=300)
                .rev()
                .find(|&i| line.is_char_boundary(i))
                .unwrap_or(0);
            line.truncate(cut);
            line.push('…');
        }
        let _ = writeln!(out, "  {line}");
    }
}

/// Each CPU-wide listener set merged by time, then each listener outside
/// the sets (task-bound ones) alone.
fn records(out: &mut String, ev: &RunEvidence, analysis: &Analysis, all: bool) {
    if ev.listeners.is_empty() {
        let _ = writeln!(out, "records: no listener was opened in this run");
        return;
    }
    let mut groups: Vec<(String, Vec<u32>)> = analysis
        .sets
        .iter()
        .enumerate()
        .map(|(i, set)| (format!("CPU-wide set {i}"), set.clone()))
        .collect();
    for l in &ev.listeners {
        if !analysis.sets.iter().any(|s| s.contains(&l.index)) {
            groups.push((format!("listener {} alone", l.index), vec![l.index]));
        }
    }
    for (name, listeners) in groups {
        let streams: Vec<Vec<Record>> = listeners
            .iter()
            .map(|i| {
                analysis
                    .records_per_listener
                    .get(i)
                    .cloned()
                    .unwrap_or_default()
            })
            .collect();
        let merged = merge_by_time(streams);
        let first = ev.listeners.iter().find(|l| listeners.contains(&l.index));
        let sample_type = first.map_or_else(String::new, |l| {
            kloop_records::sample_type_names(l.sample_type)
        });
        let _ = writeln!(
            out,
            "records of {name} (listeners {listeners:?}, sample_type {sample_type}): {}",
            merged.len()
        );
        let t0 = merged.iter().find_map(Record::time);
        let shown = if all { merged.len() } else { RECORDS_SHOWN };
        for r in merged.iter().take(shown) {
            let when = match (r.time(), t0) {
                (Some(t), Some(t0)) => format!("{:>+12.6} s", (t as f64 - t0 as f64) / 1e9),
                _ => format!("{:>14}", "-"),
            };
            let _ = writeln!(out, "  {when}  {r}");
        }
        if merged.len() > shown {
            let _ = writeln!(
                out,
                "  … {} more (every record is in the report file on the host)",
                merged.len() - shown
            );
        }
    }
}

/// `12.3 ms`, `1.20 s`, `850 µs`.
fn human_ns(ns: u64) -> String {
    let ns = ns as f64;
    if ns >= 1e9 {
        format!("{:.2} s", ns / 1e9)
    } else if ns >= 1e6 {
        format!("{:.1} ms", ns / 1e6)
    } else {
        format!("{:.0} µs", ns / 1e3)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kloop_protocol::ListenerInfo;
    use kloop_records::testutil as build;

    #[test]
    fn a_load_and_unload_shows_steps_programs_records_and_rules() {
        let l = build::listener(
            0,
            0,
            kloop_records::PERF_SAMPLE_TIME | kloop_records::PERF_SAMPLE_CPU,
        );
        let mut run = ByHandRun::new(7, Default::default());
        run.message(Message::StepStart {
            index: 0,
            what: r#"{"op":"drain"}"#.into(),
        });
        run.message(Message::StepDone {
            index: 0,
            elapsed_ns: 1_500_000,
            kallsyms_ns: 0,
            cpu: None,
        });
        run.message(Message::Listener(ListenerInfo { ..l.clone() }));
        let mut bytes = Vec::new();
        bytes.extend(build::ksymbol(
            &l,
            0xffff_ffff_c000_0000,
            64,
            1,
            false,
            "bpf_prog_0011223344556677_p",
            build::Tr {
                time: 10,
                ..Default::default()
            },
        ));
        let mut payload = RecordsHeader {
            listener: 0,
            stream_offset: 0,
        }
        .encode()
        .to_vec();
        payload.extend(&bytes);
        run.records(&payload);
        let end = run.message(Message::Done { records_bytes: 0 });
        assert_eq!(end, Some(RunEnd::Done));
        let text = render(&run, &RunEnd::Done, false);
        assert!(text.contains("step  0  drain  [1.5 ms]"), "{text}");
        assert!(text.contains("KSYMBOL register"), "{text}");
        assert!(text.contains("bpf_prog_0011223344556677_p"), "{text}");
        assert!(text.contains("rules:"), "{text}");
    }
}
