//! Rule `perf-attribution`: every sample whose IP lies inside a live BPF
//! program's image is filed by perf under that program's symbol.
//!
//! A `perf-attribution` step ([`kloop_protocol::PerfAttribution`]) ran the
//! real `perf record` while a workload program ran, and sent what `perf
//! script -F ip,sym` said of each sample. The truth comes from the
//! kernel, not from perf: a program's functions are `[jited_ksyms[i],
//! jited_ksyms[i] + jited_func_lens[i])` (`bpf_prog_info`), named as
//! /proc/kallsyms names them, and perf learns the same name and extent
//! from the program's KSYMBOL register (`bpf_prog_ksym_set_name()`,
//! `perf_event_bpf_emit_ksymbols()`). So a sample inside that range that
//! perf files under anything else was misled by some other record: a
//! KSYMBOL whose range covers code that is not its own. On 6.7+ x86 that
//! is a trampoline's, announced with `PAGE_SIZE` over a pack that holds
//! the program right after the image (`bpf_image_ksym_add()`,
//! kernel/bpf/trampoline.c).
//!
//! Fail closed: a workload with no sample in its image, or whose facts or
//! kallsyms name did not arrive, is a rule not checked, never a pass.

use std::collections::BTreeMap;

use kloop_protocol::{ImageReading, PerfAttribution, ProgFacts};

use crate::check::detail::{Detail, MisattributedSample};
use crate::check::{Gap, Unchecked, Violation};
use crate::evidence::RunEvidence;

/// perf files every sample inside a live program's image under that program's kallsyms name.
pub const PERF_ATTRIBUTION: &str = "perf-attribution";

/// x86-64 `PAGE_SIZE`: the length `bpf_image_ksym_add()` announces.
const PAGE: u64 = 4096;

/// One live function: where its code is and what kallsyms calls it.
#[derive(Debug, Clone)]
struct Function {
    program: u32,
    start: u64,
    len: u64,
    name: String,
}

/// What perf made of the samples inside one function's image.
#[derive(Debug, Default)]
struct Tally {
    /// Samples whose IP lies in the image.
    inside: u64,
    /// Of those, per other symbol perf named: how many, and the lowest and
    /// highest IP.
    elsewhere: BTreeMap<String, (u64, u64, u64)>,
}

/// The live functions of one report, from the facts of its `live`
/// programs; the workload without facts, and functions without a
/// kallsyms name, are returned apart.
fn functions(a: &PerfAttribution) -> (Vec<Function>, Vec<String>) {
    let mut out = Vec::new();
    let mut missing = Vec::new();
    if !a.live.iter().any(|p| p.id == a.workload) {
        missing.push(format!("program {}: no facts arrived", a.workload));
    }
    for facts in &a.live {
        let id = facts.id;
        for (i, (&start, &len)) in facts
            .jited_ksyms
            .iter()
            .zip(&facts.jited_func_lens)
            .enumerate()
        {
            match kallsyms_name(facts, start) {
                Some(name) => out.push(Function {
                    program: id,
                    start,
                    len: u64::from(len),
                    name,
                }),
                None => missing.push(format!(
                    "program {id} ({}) function {i} at {start:#x}: /proc/kallsyms named none",
                    facts.name
                )),
            }
        }
    }
    (out, missing)
}

fn kallsyms_name(facts: &ProgFacts, addr: u64) -> Option<String> {
    facts
        .kallsyms
        .iter()
        .find(|k| k.addr == addr)
        .map(|k| k.name.clone())
}

/// Each live function's tally over the report's samples.
fn tallies(functions: &[Function], a: &PerfAttribution) -> Vec<Tally> {
    let mut out: Vec<Tally> = functions.iter().map(|_| Tally::default()).collect();
    for (ip, sym, n) in &a.samples {
        let n = u64::from(*n);
        let Some(i) = functions
            .iter()
            .position(|f| (f.start..f.start + f.len).contains(ip))
        else {
            continue;
        };
        let t = &mut out[i];
        t.inside += n;
        if *sym != functions[i].name {
            let e = t.elsewhere.entry(sym.clone()).or_insert((0, *ip, *ip));
            e.0 += n;
            e.1 = e.1.min(*ip);
            e.2 = e.2.max(*ip);
        }
    }
    out
}

/// What kind of symbol perf named (`trampoline`, `program`, `unknown`:
/// perf resolved none, `other`: a kernel function).
fn kind_of(sym: &str) -> &'static str {
    if sym.starts_with("bpf_trampoline_") {
        "trampoline"
    } else if sym.starts_with("bpf_prog_") {
        "program"
    } else if sym == "[unknown]" {
        "unknown"
    } else {
        "other"
    }
}

/// Every misattribution in every report.
pub fn check(ev: &RunEvidence) -> Vec<Violation> {
    ev.perf_attributions.iter().flat_map(check_report).collect()
}

fn check_report(a: &PerfAttribution) -> Vec<Violation> {
    let (functions, _) = functions(a);
    let mut out = Vec::new();
    for (f, t) in functions.iter().zip(tallies(&functions, a)) {
        for (sym, &(n, lo, hi)) in &t.elsewhere {
            out.push(misattributed(f, t.inside, sym, n, (lo, hi), &a.images));
        }
    }
    if !a.unparsed.is_empty() {
        out.push(Violation::new(
            PERF_ATTRIBUTION,
            format!(
                "`{}` printed lines that are no `<ip> <symbol>` sample line, so their samples \
                 were not checked: {:?}",
                a.command, a.unparsed
            ),
        ));
    }
    out
}

/// The violation for `n` of the `inside` samples in `f`'s image that perf
/// filed under `sym`, their IPs from `ips.0` to `ips.1`.
fn misattributed(
    f: &Function,
    inside: u64,
    sym: &str,
    n: u64,
    ips: (u64, u64),
    images: &[ImageReading],
) -> Violation {
    let kind = kind_of(sym);
    let image = images.iter().find(|i| i.name == sym);
    let (offsets, extent) = match image {
        Some(i) => (
            Some((ips.0.wrapping_sub(i.start), ips.1.wrapping_sub(i.start))),
            i.size,
        ),
        None => (None, None),
    };
    let mut message = format!(
        "perf attributed {n} of the {inside} samples whose IP lies in {}'s image [{:#x}, {:#x}) \
         (program {}, jited_ksyms / jited_func_lens) to {sym} (IPs {:#x} to {:#x})",
        f.name,
        f.start,
        f.start + f.len,
        f.program,
        ips.0,
        ips.1
    );
    if let (Some(i), Some((lo, hi))) = (image, offsets) {
        let size = extent.map_or("no im->size".to_owned(), |s| format!("{s} bytes"));
        message.push_str(&format!(
            ": the trampoline image at {:#x} is {size}, and those IPs lie {lo} to {hi} bytes \
             past its start, inside the {PAGE} bytes its KSYMBOL announces \
             (bpf_image_ksym_add(), kernel/bpf/trampoline.c: PAGE_SIZE whatever im->size)",
            i.start
        ));
    }
    Violation::new(PERF_ATTRIBUTION, message).with(Detail::MisattributedSample(
        MisattributedSample {
            attributed: kind.to_owned(),
            offsets,
            extent,
            samples: n,
            inside,
        },
    ))
}

/// The reports whose workload perf gave no sample to check, or whose
/// truth did not arrive: not checked, never a pass.
pub fn unchecked(ev: &RunEvidence) -> Vec<Unchecked> {
    let mut out = Vec::new();
    for a in &ev.perf_attributions {
        let (functions, missing) = functions(a);
        if !missing.is_empty() {
            out.push(Unchecked::new(
                PERF_ATTRIBUTION,
                Gap::Lost,
                format!(
                    "the images of the programs live while perf recorded are not all known: {}",
                    missing.join("; ")
                ),
            ));
        }
        let inside: u64 = functions
            .iter()
            .zip(tallies(&functions, a))
            .filter(|(f, _)| f.program == a.workload)
            .map(|(_, t)| t.inside)
            .sum();
        if inside == 0 {
            let total: u64 = a.samples.iter().map(|s| u64::from(s.2)).sum();
            out.push(Unchecked::new(
                PERF_ATTRIBUTION,
                Gap::Lost,
                format!(
                    "perf recorded no sample whose IP lies in the workload's image (program {}; \
                     {total} samples in all, {} test runs in {} ms): nothing to check",
                    a.workload,
                    a.runs,
                    a.run_ns / 1_000_000
                ),
            ));
        }
    }
    out
}

/// The figure: per report, the samples in the workload's image and how
/// many perf filed elsewhere, and the layout.
pub fn notes(ev: &RunEvidence) -> Vec<String> {
    ev.perf_attributions
        .iter()
        .map(|a| {
            let (functions, _) = functions(a);
            let tallies = tallies(&functions, a);
            let mut inside = 0;
            let mut elsewhere: BTreeMap<&str, u64> = BTreeMap::new();
            let mut name = format!("program {}", a.workload);
            for (f, t) in functions.iter().zip(&tallies) {
                if f.program != a.workload {
                    continue;
                }
                name.clone_from(&f.name);
                inside += t.inside;
                for (sym, (n, _, _)) in &t.elsewhere {
                    *elsewhere.entry(sym).or_default() += n;
                }
            }
            let total: u64 = a.samples.iter().map(|s| u64::from(s.2)).sum();
            let wrong: u64 = elsewhere.values().sum();
            let whom: Vec<String> = elsewhere
                .iter()
                .map(|(s, n)| format!("{n} to {s}"))
                .collect();
            let layout = match (&a.not_arranged, a.images.first()) {
                (Some(why), _) => format!("no image below it: {why}"),
                (None, Some(i)) => format!(
                    "trampoline {} at {:#x} ({} bytes) right below it",
                    i.name,
                    i.start,
                    i.size.map_or("?".to_owned(), |s| s.to_string())
                ),
                (None, None) => "no image read".to_owned(),
            };
            let mut note = format!(
                "{PERF_ATTRIBUTION}: {inside} of {total} samples in {name}'s image, {wrong} \
                 attributed by perf to another symbol{}; {layout}; {} test runs in {} ms",
                if whom.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", whom.join(", "))
                },
                a.runs,
                a.run_ns / 1_000_000
            );
            if a.samples_dropped > 0 {
                note.push_str(&format!(
                    "; {} samples past the message's cap were not checked",
                    a.samples_dropped
                ));
            }
            note
        })
        .collect()
}

#[cfg(test)]
mod tests;
