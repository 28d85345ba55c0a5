//! Per-record rules of one listener's stream: `record-type`, `sample-id`,
//! `time-order`.

use super::*;

/// Whether one of the listener's other side-band attributes asks for
/// records of type `type_` (kernel/events/core.c: `perf_event_mmap_match()`
/// takes `mmap` for executable mappings; `perf_event_task_match()` sends
/// FORK / EXIT to `comm`, `mmap`, `mmap2`, `mmap_data` and `task` events;
/// `perf_event_comm_match()` COMM to `comm`; NAMESPACES, CGROUP and
/// TEXT_POKE go to their own bits). kloop parses none of them: such a
/// record is counted by its header and otherwise left alone, so a
/// listener with these bits is held only to KSYMBOL / BPF_EVENT.
pub(super) fn asked_for(l: &ListenerInfo, type_: u32) -> bool {
    use kloop_protocol::SideBand;
    // PERF_RECORD_MMAP 1, COMM 3, EXIT 4, FORK 7, MMAP2 10, NAMESPACES 16,
    // CGROUP 19, TEXT_POKE 20 (include/uapi/linux/perf_event.h).
    l.side_band.iter().any(|b| match b {
        SideBand::Mmap => matches!(type_, 1 | 4 | 7),
        SideBand::Comm => matches!(type_, 3 | 4 | 7),
        SideBand::Task => matches!(type_, 4 | 7),
        SideBand::Namespaces => type_ == 16,
        SideBand::Cgroup => type_ == 19,
        SideBand::TextPoke => type_ == 20,
    })
}

/// Where x86-64's kernel half of the address space begins.
const KERNEL_HALF: u64 = 0xffff_8000_0000_0000;

/// record-type: a record's type and misc bits against what the listener
/// asked for.
fn record_type_problems<'r>(l: &ListenerInfo, r: &'r Record, types: &mut Vec<Found<'r>>) {
    // The types other side-band bits ask for carry their own misc
    // flags (TEXT_POKE: PERF_RECORD_MISC_KERNEL; COMM: COMM_EXEC, ...).
    let theirs = match r.body {
        RecordBody::Unknown { type_ } => asked_for(l, type_),
        RecordBody::Task { .. } => asked_for(l, r.header.type_),
        RecordBody::TextPoke { .. } => asked_for(l, kloop_records::PERF_RECORD_TEXT_POKE),
        _ => false,
    };
    if r.header.misc != 0 && !theirs {
        types.push(quoting(
            format!("{r}: header.misc is not 0 (the kernel writes 0 for side-band records)"),
            [r],
        ));
    }
    match &r.body {
        RecordBody::Unknown { type_ } if asked_for(l, *type_) => {}
        RecordBody::TextPoke { .. } | RecordBody::Task { .. } if theirs => {}
        RecordBody::Task { .. } => types.push(quoting(
            format!(
                "{r}: a FORK / EXIT on a listener that asked for none of attr.task, comm, \
                 mmap (perf_event_task_match)"
            ),
            [r],
        )),
        RecordBody::TextPoke { .. } => types.push(quoting(
            format!("{r}: TEXT_POKE on a listener that did not ask for attr.text_poke"),
            [r],
        )),
        RecordBody::Unknown { type_ } => types.push(quoting(
            format!(
                "{r}: record type {} is not one a ksymbol/bpf_event dummy listener receives{}",
                kloop_records::record_type_name(*type_).unwrap_or("(undefined)"),
                if l.side_band.is_empty() {
                    String::new()
                } else {
                    format!(
                        " (nor one its side-band attributes {:?} ask for)",
                        l.side_band
                    )
                }
            ),
            [r],
        )),
        RecordBody::Ksymbol { .. } => ksymbol_problems(l, r, types),
        RecordBody::BpfEvent {
            event_type, flags, ..
        } => {
            if !l.bpf_event {
                types.push(quoting(
                    format!("{r}: BPF_EVENT on a listener opened without bpf_event"),
                    [r],
                ));
            }
            if *event_type != BPF_EVENT_PROG_LOAD && *event_type != BPF_EVENT_PROG_UNLOAD {
                types.push(quoting(format!("{r}: BPF_EVENT type {event_type} (the kernel emits only PROG_LOAD and PROG_UNLOAD)"), [r]));
            }
            if *flags != 0 {
                types.push(quoting(
                    format!("{r}: undefined BPF_EVENT flags {flags:#x}"),
                    [r],
                ));
            }
        }
        RecordBody::Lost { .. } => {}
    }
}

/// record-type of a KSYMBOL: in kernel memory, on a listener that asked
/// for it, of a defined type and flags.
fn ksymbol_problems<'r>(l: &ListenerInfo, r: &'r Record, types: &mut Vec<Found<'r>>) {
    let RecordBody::Ksymbol {
        ksym_type,
        flags,
        addr,
        len,
        ..
    } = &r.body
    else {
        return;
    };
    // Every caller of perf_event_ksymbol() passes the start of
    // code in kernel memory (a program's bpf_func, a trampoline
    // or dispatcher image, a kprobe instruction page, an ftrace
    // trampoline): on x86-64 the upper half of the address
    // space. (A zero len is load-symbols' finding: the kernel
    // sends one for an interpreted program.)
    if *addr < KERNEL_HALF || addr.checked_add(u64::from(*len)).is_none() {
        types.push(quoting(
            format!(
                "{r}: addr {addr:#x} (len {len}) is not in kernel memory (x86-64 \
                 kernel addresses start at {KERNEL_HALF:#x})"
            ),
            [r],
        ));
    }
    if !l.ksymbol {
        types.push(quoting(
            format!("{r}: KSYMBOL on a listener opened without ksymbol"),
            [r],
        ));
    }
    if *ksym_type != KSYM_TYPE_BPF && *ksym_type != KSYM_TYPE_OOL {
        types.push(quoting(
            format!("{r}: ksym_type {ksym_type} (the kernel refuses UNKNOWN and undefined types)"),
            [r],
        ));
    }
    if flags & !KSYMBOL_FLAGS_UNREGISTER != 0 {
        types.push(quoting(
            format!(
                "{r}: undefined KSYMBOL flag bits {:#x}",
                flags & !KSYMBOL_FLAGS_UNREGISTER
            ),
            [r],
        ));
    }
}

/// sample-id of a parsed record: its cpu is the listener's, `res` is 0,
/// id and identifier agree, and with the listener's first record's.
fn sample_id_problems<'r>(
    l: &ListenerInfo,
    r: &'r Record,
    first_id: &mut Option<(u64, &'r Record)>,
    sids: &mut Vec<Found<'r>>,
) {
    if matches!(r.body, RecordBody::Unknown { .. }) {
        return;
    }
    let s = &r.sample;
    if let (Some(cpu), true) = (s.cpu, l.cpu >= 0) {
        if i64::from(cpu) != i64::from(l.cpu) {
            sids.push(quoting(
                format!(
                    "{r}: sample cpu {cpu} on the listener bound to CPU {}",
                    l.cpu
                ),
                [r],
            ));
        }
    }
    if let Some(res) = s.cpu_res.filter(|v| *v != 0) {
        sids.push(quoting(
            format!("{r}: the res half of {{cpu, res}} is {res:#x}, not 0"),
            [r],
        ));
    }
    if let (Some(a), Some(b)) = (s.id, s.identifier) {
        if a != b {
            sids.push(quoting(
                format!("{r}: sample id {a} != identifier {b}"),
                [r],
            ));
        }
    }
    if let Some(id) = s.id.or(s.identifier) {
        match *first_id {
            None => *first_id = Some((id, r)),
            Some((first, fr)) if first != id => sids.push(quoting(
                format!(
                    "{r}: sample id {id} differs from the listener's first record's {first} ({fr})"
                ),
                [r, fr],
            )),
            _ => {}
        }
    }
}

/// Per-record rules of one listener: record-type, sample-id, time-order.
pub(super) fn check_listener(l: &ListenerInfo, recs: &[Record], out: &mut Vec<Violation>) {
    let mut types = Vec::new();
    let mut sids = Vec::new();
    let mut times = Vec::new();
    let mut first_id: Option<(u64, &Record)> = None;
    let mut prev: Option<&Record> = None;
    for r in recs {
        record_type_problems(l, r, &mut types);
        sample_id_problems(l, r, &mut first_id, &mut sids);
        if let (Some(p), Some(t)) = (prev.and_then(|p| p.time().map(|t| (p, t))), r.time()) {
            if t < p.1 {
                times.push(quoting(
                    format!(
                        "time goes backwards within listener {}: {} then {r}",
                        l.index, p.0
                    ),
                    [p.0, r],
                ));
            }
        }
        if r.time().is_some() {
            prev = Some(r);
        }
    }
    push_capped(
        out,
        rule::RECORD_TYPE,
        "unexpected records on this listener",
        types,
    );
    push_capped(
        out,
        rule::SAMPLE_ID,
        "sample_id problems on this listener",
        sids,
    );
    push_capped(
        out,
        rule::TIME_ORDER,
        "backward steps on this listener",
        times,
    );
}
