use super::testrun::*;
use super::*;

/// `__bpf_prog_run32`: what `bpf_prog_info.jited_ksyms[0]` holds for a
/// program the interpreter runs.
const A_INTERP: u64 = 0xffff_ffff_8120_3a40;
const T_I1: [u8; 8] = [0x1e; 8];
const T_I2: [u8; 8] = [0x2e; 8];

fn interpreted(label: &str, id: u32, tag: [u8; 8]) -> ProgFacts {
    ProgFacts {
        label: label.into(),
        id,
        tag,
        name: "kloop_basic".into(),
        prog_type: 6,
        jited_ksyms: vec![A_INTERP],
        jited_func_lens: vec![0],
        func_tags: vec![tag],
        func_names: Vec::new(),
        kallsyms: vec![KallsymsEntry {
            addr: A_INTERP,
            kind: 't',
            name: "__bpf_prog_run32".into(),
            module: None,
        }],
    }
}

/// The synthetic run's JITed program "basic", plus interpreted programs.
fn run(script: &Script, interp: Vec<ProgFacts>) -> Analysis {
    let mut ev = evidence(script);
    ev.progs.retain(|p| p.label == "basic");
    ev.progs.extend(interp);
    analyse(&ev)
}

fn jited_basic() -> Script {
    use Ev::*;
    vec![
        (0, 300, Reg(A_BASIC, 0x48, KSYM_TYPE_BPF, name_basic())),
        (0, 301, Load(43, T_BASIC)),
        (1, 310, Unreg(A_BASIC, 0x48, KSYM_TYPE_BPF, name_basic())),
        (1, 311, Unload(43, T_BASIC)),
    ]
}

fn rules(a: &Analysis) -> BTreeSet<&'static str> {
    a.violations.iter().map(|v| v.rule).collect()
}

#[test]
fn interpreted_programs_with_only_bpf_events_pass() {
    use Ev::*;
    let mut script = vec![
        (0, 100, Load(50, T_I1)),
        (0, 110, Load(51, T_I2)),
        (1, 200, Unload(50, T_I1)),
        (1, 210, Unload(51, T_I2)),
    ];
    script.extend(jited_basic());
    let a = run(
        &script,
        vec![interpreted("i1", 50, T_I1), interpreted("i2", 51, T_I2)],
    );
    assert!(a.violations.is_empty(), "{:#?}", a.violations);
}

#[test]
fn a_symbol_for_an_interpreted_program_is_a_violation() {
    // What perf_event_bpf_emit_ksymbols sends for a program that is not
    // JITed: prog->bpf_func, jited_len 0 and the empty aux->ksym.name.
    use Ev::*;
    let mut script = vec![
        (0, 100, Reg(A_INTERP, 0, KSYM_TYPE_BPF, String::new())),
        (0, 101, Load(50, T_I1)),
        (1, 200, Unreg(A_INTERP, 0, KSYM_TYPE_BPF, String::new())),
        (1, 201, Unload(50, T_I1)),
    ];
    script.extend(jited_basic());
    let a = run(&script, vec![interpreted("i1", 50, T_I1)]);
    assert_eq!(
        rules(&a),
        BTreeSet::from([rule::LOAD_SYMBOLS, rule::UNLOAD_SYMBOLS]),
        "{:#?}",
        a.violations
    );
    assert_eq!(a.violations.len(), 2, "{:#?}", a.violations);
    for v in &a.violations {
        assert!(
            v.message.contains("interpreted program(s) \"i1\" (id 50)"),
            "{v}"
        );
        assert!(v.message.contains("not JIT-compiled"), "{v}");
    }
}

#[test]
fn bpf_events_of_interpreted_programs_are_still_checked() {
    use Ev::*;
    let mut script = vec![
        (0, 100, Load(50, [0xee; 8])),
        (1, 200, Unload(50, [0xee; 8])),
    ];
    script.extend(jited_basic());
    let a = run(&script, vec![interpreted("i1", 50, T_I1)]);
    assert_eq!(
        rules(&a),
        BTreeSet::from([rule::LOAD_MATCHES_INFO]),
        "{:#?}",
        a.violations
    );
    let mut script = vec![(0, 100, Load(50, T_I1))];
    script.extend(jited_basic());
    let a = run(&script, vec![interpreted("i1", 50, T_I1)]);
    assert_eq!(
        rules(&a),
        BTreeSet::from([rule::UNLOAD_MATCHES_LOAD]),
        "{:#?}",
        a.violations
    );
}

#[test]
fn a_jited_program_without_its_symbol_still_fails() {
    use Ev::*;
    let script = vec![(0, 301, Load(43, T_BASIC)), (1, 311, Unload(43, T_BASIC))];
    let a = run(&script, vec![]);
    assert_eq!(rules(&a), BTreeSet::from([rule::LOAD_SYMBOLS]));
    assert!(!is_interpreted(&evidence(&script).progs[1]));
}
