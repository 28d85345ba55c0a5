//! Scenario expectations: what one scenario's records and facts must show
//! beyond the rules every run obeys (`check.rs`).
//!
//! They are data, `[[expect]]` tables in `scenario.toml`, of a few generic
//! kinds, so a new scenario needs no harness code:
//!
//! | kind | what it checks |
//! |------|----------------|
//! | `symbol` | KSYMBOL registers whose name starts with `prefix` (of `ksym_type`, if given): at least `min_registers` (default 1), at most `max_registers`; with `unregistered = true` each of them is unregistered later in the run, with `kept = true` none of them is |
//! | `file` | the `read-file` snapshot `label` contains every string of `contains` and none of `lacks` |
//! | `counter` | the `read-counter` value(s) for `label`/`map`/`key`: each at least `min`, at most `max`, equal to `equals` |
//! | `attached` | the `attach` of `link` was reported, its detail containing every string of `contains` |
//! | `fail-nth` | a `fail-nth` sweep whose target contains `target` was reported, with at least `min_attempts` attempts and `min_failed` of them failed by the injected fault |
//! | `unload-after` | the program `label`'s PROG_UNLOAD (and its unregisters) is in no records drained before the step matching `step` (a partial table: `{ op = "detach", link = "clock" }`) started, and it is in the records after |
//!
//! Every kind takes `pins = [...]`: checked only on those kernel pins
//! (empty: all). A violation names its rule (`expect-<kind>`) and quotes the
//! records or facts, in the form `check.rs` uses.

use std::collections::BTreeMap;

use kloop_protocol::Plan;

use crate::check::{Analysis, Model, Violation};
use crate::evidence::RunEvidence;
use crate::expectation::matching_steps;
pub use crate::expectation::{Expectation, KsymKind};
use kloop_records::{Record, RecordBody, BPF_EVENT_PROG_UNLOAD};

/// Rule names of expectation violations.
pub mod rule {
    /// A `symbol` expectation: KSYMBOL counts and lifetimes by name.
    pub const SYMBOL: &str = "expect-symbol";
    /// A `file` expectation: what a read-file snapshot holds.
    pub const FILE: &str = "expect-file";
    /// A `counter` expectation: a BPF map counter's value.
    pub const COUNTER: &str = "expect-counter";
    /// An `attached` expectation: how an attach step went.
    pub const ATTACHED: &str = "expect-attached";
    /// An `unload-after` expectation: a program's unload records come after a step.
    pub const UNLOAD_AFTER: &str = "expect-unload-after";
    /// A `fail-nth` expectation: a fault sweep's attempts and failures.
    pub const FAIL_NTH: &str = "expect-fail-nth";

    /// Every expectation rule name.
    pub const ALL: &[&str] = &[SYMBOL, FILE, COUNTER, ATTACHED, UNLOAD_AFTER, FAIL_NTH];
}

/// Checks every expectation that applies to `pin` (`None`: a kernel with no
/// pin, where only pin-independent expectations apply).
pub fn check(
    expects: &[Expectation],
    plan: &Plan,
    ev: &RunEvidence,
    analysis: &Analysis,
    pin: Option<&str>,
) -> Vec<Violation> {
    let mut out = Vec::new();
    let model = Model::build(&analysis.merged, &ev.initial_kallsyms);
    for e in expects {
        let pins = e.pins();
        if !pins.is_empty() && !pin.is_some_and(|p| pins.iter().any(|q| q == p)) {
            continue;
        }
        match e {
            Expectation::Symbol {
                prefix,
                suffix,
                ksym_type,
                min_registers,
                max_registers,
                unregistered,
                kept,
                ..
            } => check_symbol(
                &model,
                &SymbolCheck {
                    prefix,
                    suffix: suffix.as_deref().unwrap_or(""),
                    ksym_type: *ksym_type,
                    min: *min_registers,
                    max: *max_registers,
                    unregistered: *unregistered,
                    kept: *kept,
                },
                &mut out,
            ),
            Expectation::File {
                label,
                contains,
                lacks,
                ..
            } => check_file(ev, label, contains, lacks, &mut out),
            Expectation::Counter {
                label,
                map,
                key,
                min,
                max,
                equals,
                ..
            } => check_counter(
                ev,
                &CounterCheck {
                    label,
                    map,
                    key: *key,
                    min: *min,
                    max: *max,
                    equals: *equals,
                },
                &mut out,
            ),
            Expectation::Attached { link, contains, .. } => {
                check_attached(ev, link, contains, &mut out)
            }
            Expectation::UnloadAfter { label, step, .. } => {
                check_unload_after(plan, ev, &model, label, step, &mut out)
            }
            Expectation::FailNth {
                target,
                min_attempts,
                min_failed,
                ..
            } => check_fail_nth(ev, target, *min_attempts, *min_failed, &mut out),
        }
    }
    out
}

/// A `fail-nth` expectation: a sweep of a target containing `target` was
/// reported, with at least `min_attempts` attempts and `min_failed` failed.
fn check_fail_nth(
    ev: &RunEvidence,
    target: &str,
    min_attempts: u32,
    min_failed: u32,
    out: &mut Vec<Violation>,
) {
    match ev.fail_nth.iter().find(|f| f.target.contains(target)) {
        None => out.push(v(
            rule::FAIL_NTH,
            format!("no fail-nth sweep of a target containing {target:?} was reported"),
        )),
        Some(f) if f.attempts < min_attempts || f.failed < min_failed => out.push(v(
            rule::FAIL_NTH,
            format!(
                "the fail-nth sweep of {:?} took {} attempts, {} failed ({:?}); expected at least {min_attempts} attempts and {min_failed} failed",
                f.target, f.attempts, f.failed, f.errnos
            ),
        )),
        Some(_) => {}
    }
}

/// One `[[expect]] counter` table, as [`check_counter`] checks it: the
/// counter (`map[key]` of program `label`) and its bounds.
struct CounterCheck<'a> {
    label: &'a str,
    map: &'a str,
    key: u32,
    min: Option<u64>,
    max: Option<u64>,
    equals: Option<u64>,
}

/// A `counter` expectation: every value reported for the counter within
/// its bounds, and at least one reported.
fn check_counter(ev: &RunEvidence, check: &CounterCheck<'_>, out: &mut Vec<Violation>) {
    let &CounterCheck {
        label,
        map,
        key,
        min,
        max,
        equals,
    } = check;
    let seen: Vec<u64> = ev
        .counters
        .iter()
        .filter(|c| c.label == label && c.map == map && c.key == key)
        .map(|c| c.value)
        .collect();
    let who = format!("counter {label:?} {map:?}[{key}]");
    if seen.is_empty() {
        out.push(v(rule::COUNTER, format!("{who} was never reported")));
    }
    for value in seen {
        let mut why = Vec::new();
        if min.is_some_and(|m| value < m) {
            why.push(format!("below the minimum {}", min.unwrap_or_default()));
        }
        if max.is_some_and(|m| value > m) {
            why.push(format!("above the maximum {}", max.unwrap_or_default()));
        }
        if equals.is_some_and(|m| value != m) {
            why.push(format!("not {}", equals.unwrap_or_default()));
        }
        if !why.is_empty() {
            out.push(v(
                rule::COUNTER,
                format!("{who} = {value}: {}", why.join(", ")),
            ));
        }
    }
}

/// An `attached` expectation: the link was attached, its detail holding
/// every string of `contains`.
fn check_attached(ev: &RunEvidence, link: &str, contains: &[String], out: &mut Vec<Violation>) {
    match ev.attached.iter().find(|a| a.link == link) {
        None => out.push(v(
            rule::ATTACHED,
            format!("link {link:?} was never reported attached"),
        )),
        Some(a) => {
            let missing: Vec<&String> =
                contains.iter().filter(|s| !a.detail.contains(*s)).collect();
            if !missing.is_empty() {
                out.push(v(
                    rule::ATTACHED,
                    format!(
                        "link {link:?} of {:?} attached as {:?}, which lacks {missing:?}",
                        a.label, a.detail
                    ),
                ));
            }
        }
    }
}

fn v(rule: &'static str, message: String) -> Violation {
    Violation::new(rule, message)
}

/// One `[[expect]] symbol` table, as [`check_symbol`] checks it.
struct SymbolCheck<'a> {
    prefix: &'a str,
    suffix: &'a str,
    ksym_type: Option<KsymKind>,
    min: u32,
    max: Option<u32>,
    unregistered: bool,
    kept: bool,
}

fn check_symbol(model: &Model<'_>, check: &SymbolCheck<'_>, out: &mut Vec<Violation>) {
    let &SymbolCheck {
        prefix,
        suffix,
        ksym_type,
        min,
        max,
        unregistered,
        kept,
    } = check;
    let recs = model.recs;
    let fits = |r: &Record| match &r.body {
        RecordBody::Ksymbol {
            name, ksym_type: t, ..
        } => {
            name.starts_with(prefix)
                && name.ends_with(suffix)
                && ksym_type.is_none_or(|k| k.raw() == *t)
        }
        _ => false,
    };
    let what = format!(
        "KSYMBOL {}register(s) named {prefix}*{suffix}",
        ksym_type
            .map(|k| format!("{} ", kloop_records::ksym_type_name(k.raw())))
            .unwrap_or_default()
    );
    let regs: Vec<usize> = recs
        .iter()
        .enumerate()
        .filter(|(_, r)| r.is_register() && fits(r))
        .map(|(i, _)| i)
        .collect();
    let n = regs.len() as u32;
    if n < min || max.is_some_and(|m| n > m) {
        let others: Vec<&Record> = recs
            .iter()
            .filter(
                |r| matches!(&r.body, RecordBody::Ksymbol { name, .. } if name.starts_with(prefix)),
            )
            .collect();
        let range = match max {
            Some(m) if m == min => format!("exactly {m}"),
            Some(m) => format!("{min} to {m}"),
            None => format!("at least {min}"),
        };
        out.push(
            v(
                rule::SYMBOL,
                format!(
                    "{n} {what} in the run, expected {range}{}",
                    if others.is_empty() {
                        String::new()
                    } else {
                        format!(
                            "; records with that prefix: {}",
                            others
                                .iter()
                                .map(|r| r.to_string())
                                .collect::<Vec<_>>()
                                .join(" / ")
                        )
                    }
                ),
            )
            .quoting(others.iter().copied()),
        );
    }
    check_lifetimes(model, &regs, (unregistered, kept), out);
}

/// A `symbol` expectation's `kept` and `unregistered`: the registers
/// `regs` (indexes into the model's records) unregistered in the run, or
/// not.
fn check_lifetimes(
    model: &Model<'_>,
    regs: &[usize],
    (unregistered, kept): (bool, bool),
    out: &mut Vec<Violation>,
) {
    let recs = model.recs;
    if kept {
        for &i in regs {
            let unreg = model
                .syms
                .iter()
                .find(|s| s.reg == Some(i))
                .and_then(|s| s.unreg)
                .and_then(|u| recs.get(u));
            if let (Some(r), Some(u)) = (recs.get(i), unreg) {
                out.push(
                    v(
                        rule::SYMBOL,
                        format!("{r} is unregistered in the run ({u}), though the kernel keeps it"),
                    )
                    .quoting([r, u]),
                );
            }
        }
    }
    if unregistered {
        for &i in regs {
            let unreg = model
                .syms
                .iter()
                .find(|s| s.reg == Some(i))
                .and_then(|s| s.unreg);
            if unreg.is_none() {
                if let Some(r) = recs.get(i) {
                    out.push(v(
                        rule::SYMBOL,
                        format!("{r} is never unregistered in the run (the scenario removes what it made)"),
                    ).quoting([r]));
                }
            }
        }
    }
}

fn check_file(
    ev: &RunEvidence,
    label: &str,
    contains: &[String],
    lacks: &[String],
    out: &mut Vec<Violation>,
) {
    let Some(f) = ev.files.iter().find(|f| f.label == label) else {
        out.push(v(
            rule::FILE,
            format!("no read-file snapshot {label:?} was reported"),
        ));
        return;
    };
    let quote = |needle: &str| -> String {
        let lines: Vec<&str> = f.text.lines().filter(|l| l.contains(needle)).collect();
        if lines.is_empty() {
            format!("{} bytes, {} lines", f.text.len(), f.text.lines().count())
        } else {
            lines.join(" | ")
        }
    };
    for c in contains.iter().filter(|c| !f.text.contains(c.as_str())) {
        out.push(v(
            rule::FILE,
            format!(
                "{label:?} ({}) lacks {c:?} ({})",
                f.path,
                quote(c).replace('\n', " ")
            ),
        ));
    }
    for l in lacks.iter().filter(|l| f.text.contains(l.as_str())) {
        out.push(v(
            rule::FILE,
            format!("{label:?} ({}) has {l:?}: {}", f.path, quote(l)),
        ));
    }
}

fn check_unload_after(
    plan: &Plan,
    ev: &RunEvidence,
    model: &Model<'_>,
    label: &str,
    step: &toml::Table,
    out: &mut Vec<Violation>,
) {
    let index = match matching_steps(&plan.steps, step) {
        Ok(found) if found.len() == 1 => found[0] as u32,
        Ok(found) => {
            out.push(v(
                rule::UNLOAD_AFTER,
                format!(
                    "{} steps match {step}, the expectation needs exactly one",
                    found.len()
                ),
            ));
            return;
        }
        Err(e) => {
            out.push(v(rule::UNLOAD_AFTER, e));
            return;
        }
    };
    let Some(facts) = ev.progs.iter().find(|p| p.label == label) else {
        out.push(v(
            rule::UNLOAD_AFTER,
            format!("no program {label:?} was loaded"),
        ));
        return;
    };
    let Some((_, mark)) = ev.step_marks.iter().find(|(i, _)| *i == index) else {
        out.push(v(
            rule::UNLOAD_AFTER,
            format!("step {index} ({step}) never started, so nothing can be after it"),
        ));
        return;
    };
    let drained_before = |r: &Record| r.offset < mark.get(&r.listener).copied().unwrap_or(0);
    let recs = model.recs;
    let unload: Vec<&Record> = recs
        .iter()
        .filter(|r| {
            r.bpf_event(BPF_EVENT_PROG_UNLOAD)
                .is_some_and(|(id, _)| id == facts.id)
        })
        .collect();
    let who = format!("program {label:?} (id {})", facts.id);
    if unload.is_empty() {
        out.push(v(
            rule::UNLOAD_AFTER,
            format!("{who}: no PROG_UNLOAD in the run"),
        ));
    }
    let early_unregs = recs.iter().filter(|r| {
        r.is_unregister()
            && matches!(r.body, RecordBody::Ksymbol { addr, .. } if facts.jited_ksyms.contains(&addr))
    });
    let early: Vec<&Record> = unload
        .iter()
        .copied()
        .chain(early_unregs)
        .filter(|r| drained_before(r))
        .collect();
    if !early.is_empty() {
        out.push(
            v(
                rule::UNLOAD_AFTER,
                format!(
                    "{who} was gone before step {index} ({step}) started, which should have released it: {}",
                    early
                        .iter()
                        .map(|r| r.to_string())
                        .collect::<Vec<_>>()
                        .join(" / ")
                ),
            )
            .quoting(early.iter().copied()),
        );
    }
}

/// Per-listener stream lengths at one step's start (`RunEvidence::step_marks`).
pub type StreamMark = BTreeMap<u32, u64>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::analyse;
    use crate::check::testrun::{evidence, good_script, Ev};
    use crate::evidence::{CounterValue, FailNthSweep, FileSnapshot};
    use kloop_protocol::Step;
    use serde::Deserialize;

    fn plan(steps: Vec<Step>) -> Plan {
        Plan {
            scenario: "t".into(),
            requires: Vec::new(),
            params: Vec::new(),
            steps,
        }
    }

    fn parse(text: &str) -> Vec<Expectation> {
        #[derive(Deserialize)]
        struct F {
            expect: Vec<Expectation>,
        }
        toml::from_str::<F>(text).unwrap().expect
    }

    #[test]
    fn tables_parse_and_typos_are_refused() {
        let e = parse(
            r#"
[[expect]]
kind = "symbol"
prefix = "bpf_trampoline_"
ksym_type = "bpf"
unregistered = true
[[expect]]
kind = "unload-after"
label = "sampler"
step = { op = "detach", link = "clock" }
"#,
        );
        assert!(matches!(
            &e[0],
            Expectation::Symbol {
                min_registers: 1,
                unregistered: true,
                ksym_type: Some(KsymKind::Bpf),
                ..
            }
        ));
        assert!(toml::from_str::<toml::Table>("x = 1").is_ok());
        #[derive(Debug, Deserialize)]
        #[allow(dead_code)]
        struct F {
            expect: Vec<Expectation>,
        }
        let typo = "[[expect]]\nkind = \"symbol\"\nprefx = \"x\"\n";
        assert!(toml::from_str::<F>(typo).is_err());
    }

    #[test]
    fn validate_names_missing_steps() {
        let steps = vec![
            Step::Detach {
                link: "clock".into(),
            },
            Step::Drain,
        ];
        let e = parse(
            "[[expect]]\nkind = \"unload-after\"\nlabel = \"p\"\nstep = { op = \"detach\", link = \"clock\" }\n",
        );
        assert_eq!(e[0].validate(&steps), Ok(()));
        let e = parse(
            "[[expect]]\nkind = \"unload-after\"\nlabel = \"p\"\nstep = { op = \"detach\", link = \"other\" }\n",
        );
        assert!(e[0]
            .validate(&steps)
            .unwrap_err()
            .to_string()
            .contains("0 steps"));
        let e = parse("[[expect]]\nkind = \"file\"\nlabel = \"after\"\nlacks = [\"x\"]\n");
        assert!(e[0]
            .validate(&steps)
            .unwrap_err()
            .to_string()
            .contains("read-file"));
    }

    // The synthetic good run of check.rs: program "main" loads and unloads,
    // and an OOL kprobe_insn_page is registered and unregistered.
    #[test]
    fn symbol_expectations_on_the_synthetic_run() {
        let ev = evidence(&good_script());
        let a = analyse(&ev);
        assert!(a.violations.is_empty(), "{:?}", a.violations);
        let ok = parse(
            "[[expect]]\nkind = \"symbol\"\nprefix = \"kprobe_insn_page\"\nksym_type = \"ool\"\nunregistered = true\n",
        );
        assert_eq!(check(&ok, &plan(vec![]), &ev, &a, Some("6.1")), vec![]);
        let wrong_type = parse(
            "[[expect]]\nkind = \"symbol\"\nprefix = \"kprobe_insn_page\"\nksym_type = \"bpf\"\n",
        );
        let got = check(&wrong_type, &plan(vec![]), &ev, &a, Some("6.1"));
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(got[0].rule, rule::SYMBOL);
        assert!(
            got[0].message.contains("0 KSYMBOL BPF register(s)"),
            "{}",
            got[0].message
        );
        assert!(
            got[0].message.contains("kprobe_insn_page"),
            "{}",
            got[0].message
        );
        let absent = parse(
            "[[expect]]\nkind = \"symbol\"\nprefix = \"bpf_trampoline_\"\npins = [\"6.1\"]\n",
        );
        assert_eq!(check(&absent, &plan(vec![]), &ev, &a, Some("6.1")).len(), 1);
        // Pinned elsewhere: not checked here.
        assert!(check(&absent, &plan(vec![]), &ev, &a, Some("5.10")).is_empty());
        let too_many = parse(
            "[[expect]]\nkind = \"symbol\"\nprefix = \"bpf_prog_\"\nmax_registers = 0\nmin_registers = 0\n",
        );
        let got = check(&too_many, &plan(vec![]), &ev, &a, None);
        assert_eq!(got.len(), 1, "{got:?}");
        assert!(
            got[0].message.contains("expected exactly 0"),
            "{}",
            got[0].message
        );
        // The synthetic page is unregistered, so `kept` finds it, quoting
        // both records; a symbol never unregistered would pass.
        let kept =
            parse("[[expect]]\nkind = \"symbol\"\nprefix = \"kprobe_insn_page\"\nkept = true\n");
        let got = check(&kept, &plan(vec![]), &ev, &a, None);
        assert_eq!(got.len(), 1, "{got:?}");
        assert!(
            got[0].message.contains("though the kernel keeps it"),
            "{}",
            got[0].message
        );
        assert_eq!(got[0].records.len(), 2, "{got:?}");
        // A suffix holds the name's end: the whole function name passes,
        // a name cut short (as a smaller KSYM_NAME_LEN would) does not.
        let whole = parse(
            "[[expect]]\nkind = \"symbol\"\nprefix = \"bpf_prog_\"\nsuffix = \"_kloop_basic\"\nmax_registers = 1\nunregistered = true\n",
        );
        assert_eq!(check(&whole, &plan(vec![]), &ev, &a, None), vec![]);
        let longer = parse(
            "[[expect]]\nkind = \"symbol\"\nprefix = \"bpf_prog_\"\nsuffix = \"_kloop_basic_and_more\"\n",
        );
        let got = check(&longer, &plan(vec![]), &ev, &a, None);
        assert_eq!(got.len(), 1, "{got:?}");
        assert!(
            got[0]
                .message
                .contains("named bpf_prog_*_kloop_basic_and_more"),
            "{}",
            got[0].message
        );
        let both = parse(
            "[[expect]]\nkind = \"symbol\"\nprefix = \"x\"\nkept = true\nunregistered = true\n",
        );
        assert!(both[0]
            .validate(&[])
            .unwrap_err()
            .to_string()
            .contains("contradict"));
    }

    #[test]
    fn never_unregistered_symbol_is_named() {
        // Cut the synthetic run before its unloads: the program's symbol
        // stays registered.
        let mut script = good_script();
        let keep = script
            .iter()
            .position(|(_, _, e)| matches!(e, Ev::Unreg(..) | Ev::Unload(..)))
            .unwrap_or(script.len());
        script.truncate(keep);
        let ev = evidence(&script);
        let a = analyse(&ev);
        let e =
            parse("[[expect]]\nkind = \"symbol\"\nprefix = \"bpf_prog_\"\nunregistered = true\n");
        let got = check(&e, &plan(vec![]), &ev, &a, None);
        assert!(
            got.iter().any(|v| v.message.contains("never unregistered")),
            "{got:?}"
        );
    }

    // The alloc-failures sweeps as a fault-injection build reported them.
    #[test]
    fn fail_nth_sweeps_are_found_by_target_and_sized() {
        let mut ev = evidence(&good_script());
        ev.fail_nth = vec![
            FailNthSweep {
                target: "kprobe hrtimer_nanosleep+0x5 (perf_event_open)".into(),
                attempts: 14,
                failed: 12,
                errnos: vec![("ENOMEM".into(), 12)],
                detail: String::new(),
                ..Default::default()
            },
            FailNthSweep {
                target: "attach fentry (BPF_RAW_TRACEPOINT_OPEN)".into(),
                attempts: 20,
                failed: 19,
                errnos: vec![("ENOMEM".into(), 19)],
                detail: String::new(),
                ..Default::default()
            },
        ];
        let a = analyse(&ev);
        let e = parse("[[expect]]\nkind = \"fail-nth\"\ntarget = \"kprobe\"\nmin_failed = 2\n\n[[expect]]\nkind = \"fail-nth\"\ntarget = \"attach fentry\"\nmin_attempts = 20\n");
        assert_eq!(check(&e, &plan(vec![]), &ev, &a, None), vec![]);
        let e = parse("[[expect]]\nkind = \"fail-nth\"\ntarget = \"attach fentry\"\nmin_failed = 20\n\n[[expect]]\nkind = \"fail-nth\"\ntarget = \"attach lsm\"\n");
        let got = check(&e, &plan(vec![]), &ev, &a, None);
        assert_eq!(got.len(), 2, "{got:?}");
        assert!(got.iter().all(|v| v.rule == rule::FAIL_NTH), "{got:?}");
        assert!(got[0].message.contains("19 failed"), "{got:?}");
        assert!(got[1].message.contains("\"attach lsm\""), "{got:?}");
    }

    // Recorded on a real 6.1 guest (kprobes scenario, first run): the three
    // kprobes list snapshots and the counters the agent sent.
    fn real_kprobes_run() -> RunEvidence {
        RunEvidence {
            files: vec![
            FileSnapshot {
                label: "kprobes-before".into(),
                path: "/sys/kernel/debug/kprobes/list".into(),
                text: String::new(),
            },
            FileSnapshot {
                label: "kprobes-attached".into(),
                path: "/sys/kernel/debug/kprobes/list".into(),
                text: "ffffffffadf46b55  k  hrtimer_nanosleep+0x5    [OPTIMIZED]\nffffffffadf46b50  r  hrtimer_nanosleep+0x0    [FTRACE]\nffffffffadf46b50  k  hrtimer_nanosleep+0x0    [FTRACE]\n".into(),
            },
            FileSnapshot {
                label: "kprobes-after".into(),
                path: "/sys/kernel/debug/kprobes/list".into(),
                text: String::new(),
            },
            ],
            counters: vec![
            CounterValue {
                label: "at-entry".into(),
                map: "counts".into(),
                key: 0,
                value: 22,
            },
            CounterValue {
                label: "return".into(),
                map: "counts".into(),
                key: 1,
                value: 21,
            },
            ],
            ..RunEvidence::default()
        }
    }

    #[test]
    fn files_and_counters_from_a_real_run() {
        let ev = real_kprobes_run();
        let a = Analysis::default();
        let good = parse(
            r#"
[[expect]]
kind = "file"
label = "kprobes-attached"
contains = ["hrtimer_nanosleep+0x0", "[OPTIMIZED]"]
[[expect]]
kind = "file"
label = "kprobes-after"
lacks = ["hrtimer_nanosleep"]
[[expect]]
kind = "counter"
label = "at-entry"
map = "counts"
min = 1
"#,
        );
        assert_eq!(check(&good, &plan(vec![]), &ev, &a, Some("6.1")), vec![]);
        let bad = parse(
            r#"
[[expect]]
kind = "file"
label = "kprobes-attached"
lacks = ["hrtimer_nanosleep"]
[[expect]]
kind = "counter"
label = "return"
map = "counts"
key = 1
min = 100
[[expect]]
kind = "counter"
label = "missing"
map = "counts"
"#,
        );
        let got = check(&bad, &plan(vec![]), &ev, &a, Some("6.1"));
        assert_eq!(got.len(), 3, "{got:?}");
        assert!(
            got[0]
                .message
                .contains("hrtimer_nanosleep+0x5    [OPTIMIZED]"),
            "{}",
            got[0].message
        );
        assert!(
            got[1].message.contains("= 21: below the minimum 100"),
            "{}",
            got[1].message
        );
        assert!(
            got[2].message.contains("never reported"),
            "{}",
            got[2].message
        );
    }

    #[test]
    fn unload_after_uses_the_step_marks() {
        let ev0 = evidence(&good_script());
        let a = analyse(&ev0);
        let steps = vec![
            Step::Drain,
            Step::Detach {
                link: "clock".into(),
            },
            Step::Drain,
        ];
        let e = parse(
            "[[expect]]\nkind = \"unload-after\"\nlabel = \"main\"\nstep = { op = \"detach\", link = \"clock\" }\n",
        );
        // Every byte arrived after the detach started: fine.
        let mut ev = ev0.clone();
        ev.step_marks = vec![(0, StreamMark::new()), (1, StreamMark::new())];
        assert_eq!(check(&e, &plan(steps.clone()), &ev, &a, None), vec![]);
        // Every byte arrived before it: the unload came too early.
        let mut ev = ev0.clone();
        let all: StreamMark = ev
            .streams
            .iter()
            .map(|(l, s)| (*l, s.len() as u64))
            .collect();
        ev.step_marks = vec![(0, StreamMark::new()), (1, all)];
        let got = check(&e, &plan(steps.clone()), &ev, &a, None);
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(got[0].rule, rule::UNLOAD_AFTER);
        assert!(got[0].message.contains("PROG_UNLOAD"), "{}", got[0].message);
        // The step never ran.
        let mut ev = ev0;
        ev.step_marks = vec![(0, StreamMark::new())];
        let got = check(&e, &plan(steps), &ev, &a, None);
        assert!(got[0].message.contains("never started"), "{got:?}");
    }
}
