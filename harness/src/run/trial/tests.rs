use super::judging::*;
use super::*;
use crate::judge::check::{rule, Violation};
use crate::judge::known_issues::{Ledger, Vocabulary};
use kloop_protocol::Requirement;

fn ledger() -> Ledger {
    let text = r#"
[[issue]]
id = "interp-reg"
rule = "load-symbols"
scenarios = ["interpreter"]
pins = ["6.1"]
summary = "registers a symbol\nfor interpreted programs"
evidence = "KSYMBOL len=0"
review_by = "2027-05-21"

[[issue.signature]]
fault = "interpreted-symbol"
len = 0
name = ""
kernel_text = true
"#;
    let vocab = Vocabulary {
        pins: vec!["6.1".into(), "6.12".into()],
        rules: crate::judge::known_issues::rule_names()
            .into_iter()
            .map(String::from)
            .collect(),
        scenarios: vec![],
    };
    Ledger::parse(text, Path::new("kernels/known-issues.toml"), &vocab).unwrap()
}

/// A violation of `rule`; a `load-symbols` one has the typed fields of
/// the interpreter's symbol, which the test ledger's signature names.
fn v(rule: &'static str) -> Violation {
    let v = Violation::new(rule, format!("{rule} broken: L0@0 KSYMBOL"));
    if rule != rule::LOAD_SYMBOLS {
        return v;
    }
    v.with(crate::judge::check::Detail::InterpretedSymbol(
        crate::judge::check::detail::InterpretedSymbol {
            event: "register".into(),
            addr: 0xffff_ffff_8100_0000,
            len: 0,
            name: String::new(),
            kernel_text: true,
            kernel_symbol: None,
        },
    ))
}

fn outcome(pin: Option<&str>, vs: &[Violation]) -> Result<Option<Verdict>, Verdict> {
    ledger_outcome(
        &ledger(),
        pin,
        &|_| true,
        "interpreter",
        vs,
        Path::new("n.txt"),
    )
}

#[test]
fn only_covered_violations_are_known() {
    let vs = [v(rule::LOAD_SYMBOLS), v(rule::LOAD_SYMBOLS)];
    let Ok(Some(k @ Verdict::Known(_))) = outcome(Some("6.1"), &vs) else {
        panic!("{:?}", outcome(Some("6.1"), &vs));
    };
    assert_eq!(k.headline(), "KNOWN (interp-reg)");
    let m = k.message().unwrap();
    assert!(m.starts_with("known bug: interp-reg\n"), "{m}");
    assert!(
        m.contains("registers a symbol; for interpreted programs"),
        "{m}"
    );
    assert_eq!(m.matches("[load-symbols]").count(), 2, "{m}");
    assert!(!k.fails_run());
}

#[test]
fn an_uncovered_violation_fails_and_names_the_known_ones() {
    let vs = [v(rule::LOAD_SYMBOLS), v(rule::LOST)];
    let Err(Verdict::Failed(f)) = outcome(Some("6.1"), &vs) else {
        panic!()
    };
    // Only the uncovered rule is the cause; the known one is named in text.
    assert_eq!(
        f.cause,
        FailureCause::Rules {
            rules: vec!["lost".into()]
        }
    );
    let m = f.message;
    assert!(m.starts_with("1 invariant violation(s)"), "{m}");
    assert!(m.contains("[lost]"), "{m}");
    assert!(
        m.contains("also known bugs of this pin:\n  interp-reg"),
        "{m}"
    );
    // Another pin: the entry does not apply, both violations fail.
    let Err(Verdict::Failed(f)) = outcome(Some("6.12"), &vs) else {
        panic!()
    };
    assert_eq!(
        f.cause,
        FailureCause::Rules {
            rules: vec!["load-symbols".into(), "lost".into()]
        }
    );
    assert!(f.message.starts_with("2 invariant violation(s)"), "{f:?}");
}

#[test]
fn rule_hits_name_the_entry_that_covers_them() {
    let vs = [v(rule::LOAD_SYMBOLS), v(rule::LOST)];
    let hits = rule_hits(&ledger(), Some("6.1"), "interpreter", &vs);
    let known: Vec<_> = hits
        .iter()
        .map(|h| (h.rule.as_str(), h.known_issue.as_deref()))
        .collect();
    assert_eq!(
        known,
        [("load-symbols", Some("interp-reg")), ("lost", None)]
    );
    // No ledger pin (a kernel of no known series): nothing is known.
    let hits = rule_hits(&ledger(), None, "interpreter", &vs);
    assert!(hits.iter().all(|h| h.known_issue.is_none()));
    // The typed fields travel with the hit (results.jsonl).
    let json = serde_json::to_string(&hits[0]).unwrap();
    assert_eq!(
        json,
        r#"{"rule":"load-symbols","message":"load-symbols broken: L0@0 KSYMBOL","detail":{"fault":"interpreted-symbol","event":"register","addr":18446744071578845184,"len":0,"name":"","kernel_text":true}}"#
    );
    let json = serde_json::to_string(&hits[1]).unwrap();
    assert_eq!(
        json,
        r#"{"rule":"lost","message":"lost broken: L0@0 KSYMBOL"}"#
    );
}

#[test]
fn a_clean_trial_the_ledger_expects_to_fail_is_fixed() {
    let Ok(Some(f @ Verdict::Fixed(_))) = outcome(Some("6.1"), &[]) else {
        panic!()
    };
    assert_eq!(f.headline(), "FIXED? interp-reg no longer shows on 6.1");
    assert!(f.message().unwrap().contains("kernels/known-issues.toml"));
    assert!(f.fails_run());
    // Uncovered violations win over FIXED?, which is still mentioned.
    let Err(Verdict::Failed(Failure { message: m, .. })) = outcome(Some("6.1"), &[v(rule::LOST)])
    else {
        panic!()
    };
    assert!(
        m.contains("FIXED? interp-reg no longer shows on 6.1"),
        "{m}"
    );
    assert_eq!(outcome(Some("6.12"), &[]), Ok(None));
}

#[test]
fn an_entry_not_reported_fixed_leaves_the_trial_clean() {
    // A perf bug with another perf (KLOOP_PERF), a kernel bug on a local
    // kernel: the entry that does not show is a note, the trial is judged
    // on everything else.
    let not_reported = |pin| {
        ledger_outcome(
            &ledger(),
            pin,
            &|_| false,
            "interpreter",
            &[],
            Path::new("n.txt"),
        )
    };
    assert_eq!(not_reported(Some("6.1")), Ok(None));
    // Another violation still fails it.
    let vs = [v(rule::LOST)];
    let failed = ledger_outcome(
        &ledger(),
        Some("6.1"),
        &|_| false,
        "interpreter",
        &vs,
        Path::new("n.txt"),
    );
    let Err(Verdict::Failed(Failure { message: m, .. })) = failed else {
        panic!()
    };
    assert!(!m.contains("FIXED?"), "{m}");
}

#[test]
fn a_user_built_image_is_never_excused() {
    let vs = [v(rule::LOAD_SYMBOLS)];
    assert!(matches!(outcome(None, &vs), Err(Verdict::Failed(_))));
    assert_eq!(outcome(None, &[]), Ok(None));
}

fn scenario(requires: Vec<Requirement>) -> Scenario {
    Scenario {
        name: "interpreter".into(),
        dir: PathBuf::from("scenarios/interpreter"),
        description: String::new(),
        vm: Default::default(),
        modules: vec![],
        expect: vec![],
        programs: Vec::new(),
        snapshot: true,
        plan: kloop_protocol::Plan {
            scenario: "interpreter".into(),
            requires,
            params: Vec::new(),
            steps: vec![],
        },
    }
}

#[test]
fn unsupported_requirements() {
    let ev = RunEvidence {
        unsupported: Some((
            Requirement::JitOptional,
            "writing 0: EINVAL\n(CONFIG_BPF_JIT_ALWAYS_ON=y)".into(),
        )),
        ..Default::default()
    };
    let s = unsupported_verdict(
        &scenario(vec![Requirement::Btf, Requirement::JitOptional]),
        &ev,
    )
    .unwrap();
    assert_eq!(
        s,
        Verdict::Skipped("jit-optional: writing 0: EINVAL; (CONFIG_BPF_JIT_ALWAYS_ON=y)".into())
    );
    assert_eq!(
        s.headline(),
        "SKIPPED (jit-optional: writing 0: EINVAL; (CONFIG_BPF_JIT_ALWAYS_ON=y))"
    );
    assert!(!s.fails_run());
    // The guest claiming a requirement the plan never asked for is a bug.
    let f = unsupported_verdict(&scenario(vec![Requirement::Btf]), &ev).unwrap();
    assert!(
        matches!(&f, Verdict::Failed(Failure { cause: FailureCause::AgentBug, message })
        if message.contains("does not require it"))
    );
    assert!(unsupported_verdict(&scenario(vec![]), &RunEvidence::default()).is_none());
    assert_eq!(
        requirement_name(Requirement::FtraceInstances),
        "ftrace-instances"
    );
    assert_eq!(one_line(&"x".repeat(500)).chars().count(), 401);
}

#[test]
fn verdicts_keep_their_json_form_and_a_failure_its_cause() {
    let f = Verdict::failed(
        FailureCause::Rules {
            rules: vec!["lost".into()],
        },
        "1 invariant violation(s)",
    );
    let json = serde_json::to_string(&f).unwrap();
    assert_eq!(
        json,
        r#"{"class":"failed","message":"1 invariant violation(s)","cause":{"kind":"rules","rules":["lost"]}}"#
    );
    assert_eq!(serde_json::from_str::<Verdict>(&json).unwrap(), f);
    assert_eq!(
        serde_json::to_string(&Verdict::Ok).unwrap(),
        r#"{"class":"ok"}"#
    );
    let s = Verdict::Skipped("btf: none".into());
    assert_eq!(
        serde_json::to_string(&s).unwrap(),
        r#"{"class":"skipped","message":"btf: none"}"#
    );
    // A failure written before causes were recorded still reads.
    let old: Verdict = serde_json::from_str(r#"{"class":"failed","message":"x"}"#).unwrap();
    assert!(matches!(
        old,
        Verdict::Failed(Failure {
            cause: FailureCause::Unstated,
            ..
        })
    ));
    assert!(serde_json::from_str::<Verdict>(r#"{"class":"maybe"}"#).is_err());
}
