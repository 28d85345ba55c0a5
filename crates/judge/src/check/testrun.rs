//! A synthetic run, built from the uapi layout (not recorded from a
//! kernel): two programs (one with two JITed functions, one with one)
//! loaded on CPU 0 and unloaded by a worker on CPU 1, an OOL symbol,
//! and the unload of a program that predates the recording.
use super::*;
use kloop_records::testutil::{self, Tr};
use kloop_records::{KSYM_TYPE_OOL, PERF_SAMPLE_CPU, PERF_SAMPLE_TID, PERF_SAMPLE_TIME};

pub const T_MAIN: [u8; 8] = [0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88];
pub const T_MAIN_F0: &str = "0102030405060708";
pub const T_MAIN_F1: &str = "a1a2a3a4a5a6a7a8";
pub const T_BASIC: [u8; 8] = [0xba, 0x51, 0xc0, 0, 0, 0, 0, 1];
pub const T_OLD: [u8; 8] = [0x99; 8];
pub const A_F0: u64 = 0xffff_ffff_c000_0800;
pub const A_F1: u64 = 0xffff_ffff_c000_0900;
pub const A_BASIC: u64 = 0xffff_ffff_c000_2000;
pub const A_OOL: u64 = 0xffff_ffff_c000_5000;
pub const A_OLD: u64 = 0xffff_ffff_c000_7000;

#[derive(Clone, Debug)]
pub enum Ev {
    Reg(u64, u32, u16, String),
    Unreg(u64, u32, u16, String),
    Load(u32, [u8; 8]),
    Unload(u32, [u8; 8]),
    Lost(u64),
}

/// (listener, time, event)
pub type Script = Vec<(u32, u64, Ev)>;

/// The 8 tag bytes a 16-digit hex string spells.
pub fn hex_tag(s: &str) -> [u8; 8] {
    hex::decode(s).unwrap().try_into().unwrap()
}

pub fn name_main_f0() -> String {
    format!("bpf_prog_{T_MAIN_F0}_kloop_subprogs")
}
pub fn name_main_f1() -> String {
    format!("bpf_prog_{T_MAIN_F1}_helper")
}
pub fn name_basic() -> String {
    format!("bpf_prog_{}_kloop_basic", hex::encode(T_BASIC))
}
pub fn name_old() -> String {
    format!("bpf_prog_{}_old", hex::encode(T_OLD))
}

pub fn good_script() -> Script {
    use Ev::*;
    vec![
        (0, 100, Reg(A_F0, 0x90, KSYM_TYPE_BPF, name_main_f0())),
        (0, 101, Reg(A_F1, 0x38, KSYM_TYPE_BPF, name_main_f1())),
        (0, 102, Load(42, T_MAIN)),
        (
            0,
            105,
            Reg(A_OOL, 4096, KSYM_TYPE_OOL, "kprobe_insn_page".into()),
        ),
        (0, 110, Reg(A_BASIC, 0x48, KSYM_TYPE_BPF, name_basic())),
        (0, 111, Load(43, T_BASIC)),
        (1, 200, Unreg(A_F0, 0x90, KSYM_TYPE_BPF, name_main_f0())),
        (1, 201, Unreg(A_F1, 0x38, KSYM_TYPE_BPF, name_main_f1())),
        (1, 202, Unload(42, T_MAIN)),
        (
            1,
            205,
            Unreg(A_OOL, 4096, KSYM_TYPE_OOL, "kprobe_insn_page".into()),
        ),
        (1, 210, Unreg(A_BASIC, 0x48, KSYM_TYPE_BPF, name_basic())),
        (1, 211, Unload(43, T_BASIC)),
        (1, 220, Unreg(A_OLD, 0x40, KSYM_TYPE_BPF, name_old())),
        (1, 221, Unload(5, T_OLD)),
    ]
}

fn entry(addr: u64, name: String) -> KallsymsEntry {
    KallsymsEntry {
        addr,
        kind: 't',
        name,
        module: Some("bpf".into()),
    }
}

/// The bytes of one scripted record as listener `l` receives it.
fn record_bytes(l: &ListenerInfo, e: &Ev, t: Tr) -> Vec<u8> {
    match e {
        Ev::Reg(a, len, ty, n) => testutil::ksymbol(l, *a, *len, *ty, false, n, t),
        Ev::Unreg(a, len, ty, n) => testutil::ksymbol(l, *a, *len, *ty, true, n, t),
        Ev::Load(id, tag) => testutil::bpf_event(l, BPF_EVENT_PROG_LOAD, *id, *tag, t),
        Ev::Unload(id, tag) => testutil::bpf_event(l, BPF_EVENT_PROG_UNLOAD, *id, *tag, t),
        Ev::Lost(n) => testutil::lost(l, 0, *n, t),
    }
}

/// `ev` plus inherited task listeners (one per CPU, pid 1, TID|TIME) that
/// got the records of `script` except those `skip` names (by position).
pub fn with_inherited(mut ev: RunEvidence, script: &Script, skip: &[usize]) -> RunEvidence {
    let st = PERF_SAMPLE_TID | PERF_SAMPLE_TIME;
    let inherited: Vec<ListenerInfo> = [(2, 0), (3, 1)]
        .into_iter()
        .map(|(index, cpu)| ListenerInfo {
            inherit: true,
            pid: Some(1),
            ..testutil::listener(index, cpu, st)
        })
        .collect();
    for (n, (li, time, e)) in script.iter().enumerate() {
        if skip.contains(&n) {
            continue;
        }
        let l = &inherited[*li as usize];
        let t = trailer(*li, *time, 0);
        ev.streams
            .entry(l.index)
            .or_default()
            .extend(record_bytes(l, e, t));
    }
    ev.listeners.extend(inherited);
    ev
}

/// The sample_id trailer of a scripted record: pid 1, the main thread (tid
/// 1) for listener 0's records and thread 33 for the others'.
fn trailer(listener: u32, time: u64, cpu: u32) -> Tr {
    Tr {
        pid: 1,
        tid: if listener == 0 { 1 } else { 33 },
        time,
        id: 0,
        stream_id: 0,
        cpu,
    }
}

pub fn evidence(script: &Script) -> RunEvidence {
    let st = PERF_SAMPLE_TID | PERF_SAMPLE_TIME | PERF_SAMPLE_CPU;
    let listeners = vec![testutil::listener(0, 0, st), testutil::listener(1, 1, st)];
    let mut streams: BTreeMap<u32, Vec<u8>> = BTreeMap::new();
    for (li, time, ev) in script {
        let l = &listeners[*li as usize];
        let t = trailer(*li, *time, l.cpu as u32);
        streams
            .entry(*li)
            .or_default()
            .extend(record_bytes(l, ev, t));
    }
    RunEvidence {
        online_cpus: vec![0, 1],
        listeners,
        streams,
        progs: vec![
            ProgFacts {
                label: "main".into(),
                id: 42,
                tag: T_MAIN,
                name: "kloop_subprogs".into(),
                prog_type: 1,
                jited_ksyms: vec![A_F0, A_F1],
                jited_func_lens: vec![0x90, 0x38],
                func_tags: vec![hex_tag(T_MAIN_F0), hex_tag(T_MAIN_F1)],
                func_names: Vec::new(),
                kallsyms: vec![entry(A_F0, name_main_f0()), entry(A_F1, name_main_f1())],
            },
            ProgFacts {
                label: "basic".into(),
                id: 43,
                tag: T_BASIC,
                name: "kloop_basic".into(),
                prog_type: 6,
                jited_ksyms: vec![A_BASIC],
                jited_func_lens: vec![0x48],
                func_tags: vec![T_BASIC],
                func_names: Vec::new(),
                kallsyms: vec![entry(A_BASIC, name_basic())],
            },
        ],
        initial_kallsyms: vec![entry(A_OLD, name_old())],
        ..RunEvidence::default()
    }
}
