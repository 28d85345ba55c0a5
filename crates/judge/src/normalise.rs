//! Normalisation of a checked run into a deterministic text for golden
//! snapshots (one snapshot per scenario × kernel pin).
//!
//! Run it after [`crate::check::analyse`]: addresses, ids and tags are only
//! replaced by symbols once they have been checked against the facts.
//!
//! - program ids become ordinals `prog#N` in order of PROG_LOAD in the merged
//!   stream (then programs only seen unloading, then facts never seen);
//! - a program's JITed functions become `prog#N.f<i>` in `jited_ksyms` order;
//!   other addresses `addr#N`, one per symbol lifetime (register …
//!   unregister) in order of appearance: an address the kernel hands out
//!   again after an unregister gets a new number, because whether a freed
//!   trampoline or insn page address is reused is allocator timing, not ABI
//!   (the rules still pair register and unregister by address);
//! - tags become `tag(prog#N)` when they equal the facts, else stay hex;
//! - `bpf_prog_<16 hex>` in names becomes `bpf_prog_<tag>`;
//! - times, pids, tids, cpus and listener indexes of records are dropped;
//!   lengths, names, types, flags and the record sequence are kept (they
//!   legitimately differ between kernels, which is what the snapshots show).
//!
//! The kernel version is not written: the snapshot file is per kernel.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::check::{facts_name_ok, known_at_start, Analysis, Model};
use crate::evidence::RunEvidence;
use kloop_records::{
    self, Record, RecordBody, BPF_EVENT_PROG_LOAD, BPF_EVENT_PROG_UNLOAD, KSYMBOL_FLAGS_UNREGISTER,
};

/// `enum bpf_prog_type` names (uapi `linux/bpf.h`), lowercase.
fn prog_type_name(t: u32) -> Option<&'static str> {
    const NAMES: [&str; 33] = [
        "unspec",
        "socket_filter",
        "kprobe",
        "sched_cls",
        "sched_act",
        "tracepoint",
        "xdp",
        "perf_event",
        "cgroup_skb",
        "cgroup_sock",
        "lwt_in",
        "lwt_out",
        "lwt_xmit",
        "sock_ops",
        "sk_skb",
        "cgroup_device",
        "sk_msg",
        "raw_tracepoint",
        "cgroup_sock_addr",
        "lwt_seg6local",
        "lirc_mode2",
        "sk_reuseport",
        "flow_dissector",
        "cgroup_sysctl",
        "raw_tracepoint_writable",
        "cgroup_sockopt",
        "tracing",
        "struct_ops",
        "ext",
        "lsm",
        "sk_lookup",
        "syscall",
        "netfilter",
    ];
    usize::try_from(t).ok().and_then(|i| NAMES.get(i)).copied()
}

/// Replaces every `bpf_prog_<16 lowercase hex digits>` with `bpf_prog_<tag>`.
pub fn mask_tags(name: &str) -> String {
    const PREFIX: &str = "bpf_prog_";
    let mut out = String::with_capacity(name.len());
    let mut rest = name;
    while let Some(pos) = rest.find(PREFIX) {
        let (head, tail) = rest.split_at(pos);
        out.push_str(head);
        let after = &tail[PREFIX.len()..];
        let is_tag = after.get(..16).is_some_and(|h| {
            h.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        });
        out.push_str(PREFIX);
        if is_tag {
            out.push_str("<tag>");
            rest = &after[16..];
        } else {
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// `bpf_trampoline_<key>` with the key numbered by first appearance in
/// the stream (`bpf_trampoline_<key#1>`). The key is the target's BTF id
/// (bpf_trampoline_compute_key, kernel/bpf/trampoline.c), and BTF ids are
/// not stable between two builds of the same source (pahole before 1.26
/// encodes in parallel without `reproducible_build`): validate saw the
/// same fentry target as 6442461886 on one 6.1 build and 6442489503 on the
/// next. Which trampolines are the same one stays visible.
fn trampoline_keys(name: &str, keys: &mut Vec<String>) -> String {
    const PREFIX: &str = "bpf_trampoline_";
    let Some(key) = name.strip_prefix(PREFIX) else {
        return name.to_string();
    };
    if key.is_empty() || !key.bytes().all(|b| b.is_ascii_digit()) {
        return name.to_string();
    }
    let n = match keys.iter().position(|k| k == key) {
        Some(i) => i + 1,
        None => {
            keys.push(key.to_string());
            keys.len()
        }
    };
    format!("{PREFIX}<key#{n}>")
}

/// `mask_tags`, except that a tag in `known` becomes its symbolic name
/// (`bpf_prog_<tag(prog#1)>_x`).
fn name_tags(name: &str, known: &BTreeMap<String, String>) -> String {
    if let Some(rest) = name.strip_prefix("bpf_prog_") {
        if let Some(sym) = rest.get(..16).and_then(|h| known.get(h)) {
            return format!("bpf_prog_<{sym}>{}", mask_tags(&rest[16..]));
        }
    }
    mask_tags(name)
}

/// Per function of an inventoried program: the KSYMBOL `perf record`
/// synthesises for it at start (`bpf_prog_<prog_tags[i]>_<name>`, the name
/// being the function's BTF name, which is also what the kernel's own
/// kallsyms name carries after its tag) next to the kallsyms names at that
/// address. The kernel names the main function after `prog_tags[0]` on some
/// versions and after the whole program's tag on others, so a recorder that
/// matches unregisters by name, not by address, sees them differ there.
fn synthesised_names(
    p: &kloop_protocol::ProgFacts,
    tags: &BTreeMap<String, String>,
) -> Vec<String> {
    let mut out = Vec::new();
    for (fi, addr) in p.jited_ksyms.iter().enumerate() {
        let mut names: Vec<&str> = p
            .kallsyms
            .iter()
            .filter(|e| e.addr == *addr)
            .map(|e| e.name.as_str())
            .collect();
        names.sort_unstable();
        let suffix = names
            .iter()
            .find(|n| crate::check::has_some_tag_prefix(n))
            .and_then(|n| n.get("bpf_prog_".len() + 16..));
        let perf = match (p.func_tags.get(fi), suffix) {
            (Some(t), Some(sfx)) => format!("bpf_prog_{}{sfx}", hex::encode(t)),
            _ => "(unknown: no prog_tags or no kallsyms line)".to_string(),
        };
        let same = names.contains(&perf.as_str());
        out.push(format!(
            "    f{fi} perf synthesises {}; kallsyms has {}{}",
            name_tags(&perf, tags),
            names
                .iter()
                .map(|n| name_tags(n, tags))
                .collect::<Vec<_>>()
                .join(" and "),
            if same { "" } else { " (differs)" }
        ));
    }
    out
}

/// In a plan with a `fail-nth` sweep, the records to fold: every
/// register + unregister pair of a symbol (same name and length, at one
/// address, back to back) that repeats the pair just before it. Each
/// attempt that fails after a trampoline image was registered gives one
/// such pair, and how many attempts get that far depends on how many
/// allocations the attach path makes after the registration, which varies
/// from run to run (kfree_rcu batches, per-CPU caches). The rules still
/// check every pair; the stream keeps the first of each run.
fn sweep_repeats(ev: &RunEvidence, recs: &[Record]) -> std::collections::BTreeSet<usize> {
    let mut folded = std::collections::BTreeSet::new();
    if !ev
        .steps
        .values()
        .any(|s| matches!(s, kloop_protocol::Step::FailNth { .. }))
    {
        return folded;
    }
    let pair = |i: usize| -> Option<(&str, u32)> {
        let (
            RecordBody::Ksymbol {
                addr: a,
                len,
                flags: f1,
                name,
                ..
            },
            RecordBody::Ksymbol {
                addr: b,
                len: len2,
                flags: f2,
                name: name2,
                ..
            },
        ) = (&recs.get(i)?.body, &recs.get(i + 1)?.body)
        else {
            return None;
        };
        let register = f1 & KSYMBOL_FLAGS_UNREGISTER == 0;
        let unregister = f2 & KSYMBOL_FLAGS_UNREGISTER != 0;
        (register && unregister && a == b && len == len2 && name == name2)
            .then_some((name.as_str(), *len))
    };
    let mut i = 0;
    let mut previous: Option<(&str, u32)> = None;
    while i < recs.len() {
        match pair(i) {
            Some(p) => {
                if previous == Some(p) {
                    folded.insert(i);
                    folded.insert(i + 1);
                }
                previous = Some(p);
                i += 2;
            }
            None => {
                previous = None;
                i += 1;
            }
        }
    }
    folded
}

/// What a record's ids, tags and addresses are called in the snapshot,
/// worked out before the first line is written: program ordinals, the
/// symbolic names of tags, and the labels of the facts programs' symbols.
struct Names<'a> {
    /// Program id → `N` of `prog#N`.
    ordinal: BTreeMap<u32, usize>,
    /// The facts of each program id (the first reported, as before).
    facts_by_id: BTreeMap<u32, &'a kloop_protocol::ProgFacts>,
    /// Tag hex → `tag(prog#N)` or `ftag(prog#N.fI)`.
    tag_names: BTreeMap<String, String>,
    /// Record index → `prog#N.fI` for the facts programs' KSYMBOLs.
    sym_label: BTreeMap<usize, String>,
}

impl<'a> Names<'a> {
    fn new(
        ev: &'a RunEvidence,
        recs: &[Record],
        batch_ids: &std::collections::BTreeSet<u32>,
    ) -> Self {
        let ordinal = program_ordinals(ev, recs, batch_ids);
        let facts_by_id = ev.progs.iter().rev().map(|f| (f.id, f)).collect();
        let tag_names = tag_names(ev, &ordinal);
        let model = Model::build(recs, &known_at_start(ev));
        let sym_label = symbol_labels(ev, &model, &ordinal);
        Names {
            ordinal,
            facts_by_id,
            tag_names,
            sym_label,
        }
    }
}

impl Names<'_> {
    /// A BPF_EVENT's program (`prog#N`) and tag: `tag(prog#N)` when it
    /// equals the facts, else its hex.
    fn program_and_tag(&self, id: u32, tag: &[u8; 8]) -> (String, String) {
        let prog = self
            .ordinal
            .get(&id)
            .map(|k| format!("prog#{k}"))
            .unwrap_or_else(|| "prog#?".into());
        let tag_s = match self.facts_by_id.get(&id) {
            Some(f) if f.tag == *tag => format!("tag({prog})"),
            _ => format!("tag({})", hex::encode(tag)),
        };
        (prog, tag_s)
    }
}

/// Program ordinals: in order of PROG_LOAD in the merged stream, then
/// programs only seen in other BPF_EVENTs (unloading), then facts never
/// seen. Batch programs get none: they are summarised.
fn program_ordinals(
    ev: &RunEvidence,
    recs: &[Record],
    batch_ids: &std::collections::BTreeSet<u32>,
) -> BTreeMap<u32, usize> {
    let mut ordinal: BTreeMap<u32, usize> = BTreeMap::new();
    let mut assign = |id: u32| {
        let next = ordinal.len() + 1;
        ordinal.entry(id).or_insert(next);
    };
    for r in recs {
        if let Some((id, _)) = r.bpf_event(BPF_EVENT_PROG_LOAD) {
            if !batch_ids.contains(&id) {
                assign(id);
            }
        }
    }
    for r in recs {
        if let RecordBody::BpfEvent { id, .. } = r.body {
            if !batch_ids.contains(&id) {
                assign(id);
            }
        }
    }
    for f in &ev.progs {
        assign(f.id);
    }
    ordinal
}

/// Tags that appear in symbol names, by hex: the program's own tag and its
/// functions' `prog_tags`. Kernels differ in which one names the main
/// function, and the snapshot should show which.
fn tag_names(ev: &RunEvidence, ordinal: &BTreeMap<u32, usize>) -> BTreeMap<String, String> {
    let mut tag_names: BTreeMap<String, String> = BTreeMap::new();
    for f in &ev.progs {
        let Some(k) = ordinal.get(&f.id) else {
            continue;
        };
        for (fi, t) in f.func_tags.iter().enumerate() {
            tag_names.insert(hex::encode(t), format!("ftag(prog#{k}.f{fi})"));
        }
    }
    // The program's own tag wins over a function's equal one.
    for f in &ev.progs {
        if let Some(k) = ordinal.get(&f.id) {
            tag_names.insert(hex::encode(f.tag), format!("tag(prog#{k})"));
        }
    }
    tag_names
}

/// Symbol labels of the facts programs' functions, by record index.
fn symbol_labels(
    ev: &RunEvidence,
    model: &Model<'_>,
    ordinal: &BTreeMap<u32, usize>,
) -> BTreeMap<usize, String> {
    let mut sym_label: BTreeMap<usize, String> = BTreeMap::new();
    for f in &ev.progs {
        let Some(k) = ordinal.get(&f.id) else {
            continue;
        };
        if ev.preexisting.contains(&f.id) {
            // Only its unregisters are in the stream.
            for (fi, addr) in f.jited_ksyms.iter().enumerate() {
                let old = model
                    .sym_by_addr
                    .get(addr)
                    .into_iter()
                    .flatten()
                    .filter_map(|l| model.syms.get(*l))
                    .find(|s| s.reg.is_none());
                if let Some(u) = old.and_then(|s| s.unreg) {
                    sym_label.insert(u, format!("prog#{k}.f{fi}"));
                }
            }
            continue;
        }
        let life = model
            .loads_of(f.id)
            .first()
            .and_then(|l| model.progs.get(*l))
            .cloned();
        let (load, unload) = life.map(|p| (p.load, p.unload)).unwrap_or((None, None));
        for (fi, addr) in f.jited_ksyms.iter().enumerate() {
            let sel = model.select_sym(*addr, load, unload, |n| facts_name_ok(f, n));
            if let Some(s) = sel.and_then(|l| model.syms.get(l)) {
                for i in [s.reg, s.unreg].into_iter().flatten() {
                    let label = format!("prog#{k}.f{fi}");
                    if load.is_some() {
                        sym_label.insert(i, label);
                    } else {
                        // A program this stream never saw load (a set
                        // closed before it, or one without BPF_EVENT) is
                        // placed by address alone, and the JIT may give a
                        // later program the address of a freed one (7.2
                        // did, in listener-lifetimes, on some runs): it
                        // never takes a label from a program placed before.
                        sym_label.entry(i).or_insert(label);
                    }
                }
            }
        }
    }
    sym_label
}

/// The `listeners:` section and the `merged:` line.
fn write_listeners(out: &mut String, ev: &RunEvidence, analysis: &Analysis) {
    out.push_str("listeners:\n");
    // Where a run closes listeners, which steps each was open for.
    let closes = ev
        .steps
        .values()
        .any(|s| matches!(s, kloop_protocol::Step::CloseListeners { .. }));
    let mut ls: Vec<&kloop_protocol::ListenerInfo> = ev.listeners.iter().collect();
    ls.sort_by_key(|l| l.index);
    for l in ls {
        let _ = write!(
            out,
            "  L{} cpu={} sample_type={}",
            l.index,
            l.cpu,
            kloop_records::sample_type_names(l.sample_type)
        );
        for (on, what) in [
            (l.sample_id_all, "sample_id_all"),
            (l.ksymbol, "ksymbol"),
            (l.bpf_event, "bpf_event"),
            (l.disabled, "disabled"),
            (l.backward, "backward"),
        ] {
            if on {
                let _ = write!(out, " {what}");
            }
        }
        let _ = write!(out, " ring_bytes={}", l.ring_bytes);
        if let Some(cpus) = &l.cpus {
            let _ = write!(out, " cpus={cpus:?}");
        }
        if !l.side_band.is_empty() {
            let bits: Vec<String> = l
                .side_band
                .iter()
                .map(|b| {
                    serde_json::to_value(b)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_string))
                        .unwrap_or_default()
                })
                .collect();
            let _ = write!(out, " side_band={}", bits.join(","));
        }
        if closes {
            let w = ev.window(l.index);
            let step = |s: Option<u32>| s.map_or("-".to_string(), |s| s.to_string());
            let _ = write!(out, " open=steps {}..{}", step(w.opened), step(w.closed));
        }
        out.push('\n');
    }
    let merged_from = if analysis.merged_from.is_empty() {
        "(none)".to_string()
    } else {
        analysis
            .merged_from
            .iter()
            .map(|i| format!("L{i}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let _ = writeln!(out, "merged: {merged_from}");
}

/// The `programs:` section and, when the agent took one, `inventory:`.
fn write_programs(out: &mut String, ev: &RunEvidence, names: &Names<'_>) {
    out.push_str("programs:\n");
    let mut by_ord: Vec<(usize, &kloop_protocol::ProgFacts)> = ev
        .progs
        .iter()
        .filter_map(|f| names.ordinal.get(&f.id).map(|k| (*k, f)))
        .collect();
    by_ord.sort_by_key(|(k, _)| *k);
    by_ord.dedup_by_key(|(k, _)| *k);
    for (k, f) in by_ord {
        let pt = match prog_type_name(f.prog_type) {
            Some(n) => n.to_string(),
            None => f.prog_type.to_string(),
        };
        let _ = writeln!(
            out,
            "  prog#{k} label={} name={} prog_type={pt} functions={}{}",
            f.label,
            f.name,
            f.jited_ksyms.len(),
            if ev.preexisting.contains(&f.id) {
                " loaded-before-recording"
            } else {
                ""
            }
        );
    }
    if ev.inventory.is_empty() {
        return;
    }
    out.push_str("inventory:\n");
    let mut inv: Vec<(String, Vec<String>)> = ev
        .inventory
        .iter()
        .map(|p| {
            let who = match names.ordinal.get(&p.id) {
                Some(k) => format!("prog#{k}"),
                None => "(not the agent's)".to_string(),
            };
            let head = format!(
                "  {who} name={} functions={} kallsyms_lines={}",
                p.name,
                p.jited_ksyms.len(),
                p.kallsyms.len()
            );
            (head, synthesised_names(p, &names.tag_names))
        })
        .collect();
    inv.sort();
    for (head, funcs) in inv {
        let _ = writeln!(out, "{head}");
        for f in funcs {
            let _ = writeln!(out, "{f}");
        }
    }
}

/// The `batches:` section and the `loss provoked:` lines.
fn write_batches_and_loss(out: &mut String, ev: &RunEvidence, analysis: &Analysis, lossy: bool) {
    if !ev.batches.is_empty() {
        out.push_str("batches:\n");
        for b in &ev.batches {
            let _ = writeln!(
                out,
                "  {}: {} program(s) x {} function(s)",
                b.what(),
                b.ids.len(),
                b.functions
            );
            if b.lookups.is_some() {
                // found / ENOENT vary from run to run; the report line has them.
                out.push_str("    side-band lookups: every PROG_LOAD looked up at once\n");
            }
        }
        if !lossy {
            let _ = writeln!(
                out,
                "  records accounted to them in the merged stream: {} (listed below: the rest)",
                analysis.accounted.len()
            );
        }
    }
    for l in &analysis.loss {
        let _ = writeln!(
            out,
            "loss provoked: set#{}: caused {} records; received + lost = {}",
            l.set,
            l.caused,
            l.received + l.lost
        );
    }
}

/// The `listener sets (records per kind):` section: what each CPU-wide set
/// and each task listener received, by KSYMBOL / BPF_EVENT kind.
fn write_set_counts(out: &mut String, ev: &RunEvidence, analysis: &Analysis) {
    out.push_str("listener sets (records per kind):\n");
    let mut members: Vec<(String, Vec<u32>)> = analysis
        .sets
        .iter()
        .enumerate()
        .map(|(k, set)| (format!("set#{k}"), set.clone()))
        .collect();
    let mut tasks: Vec<&kloop_protocol::ListenerInfo> =
        ev.listeners.iter().filter(|l| l.cpu < 0).collect();
    tasks.sort_by_key(|l| l.index);
    members.extend(
        tasks
            .iter()
            .map(|l| (format!("task L{}", l.index), vec![l.index])),
    );
    for (name, set) in members {
        let mut c = [0usize; 4];
        for r in set
            .iter()
            .filter_map(|i| analysis.records_per_listener.get(i))
            .flatten()
        {
            match &r.body {
                RecordBody::Ksymbol { flags, .. } if flags & KSYMBOL_FLAGS_UNREGISTER == 0 => {
                    c[0] += 1
                }
                RecordBody::Ksymbol { .. } => c[1] += 1,
                RecordBody::BpfEvent { event_type, .. } if *event_type == BPF_EVENT_PROG_LOAD => {
                    c[2] += 1
                }
                RecordBody::BpfEvent { .. } => c[3] += 1,
                _ => {}
            }
        }
        let ls = set
            .iter()
            .map(|i| format!("L{i}"))
            .collect::<Vec<_>>()
            .join(" ");
        let _ = writeln!(
            out,
            "  {name} ({ls}): KSYMBOL.register={} KSYMBOL.unregister={} BPF_EVENT.PROG_LOAD={} BPF_EVENT.other={}",
            c[0], c[1], c[2], c[3]
        );
    }
}

/// The kinds of the `counts:` line, in its fixed order.
const KINDS: [&str; 7] = [
    "KSYMBOL.register",
    "KSYMBOL.unregister",
    "BPF_EVENT.PROG_LOAD",
    "BPF_EVENT.PROG_UNLOAD",
    "BPF_EVENT.other",
    "LOST",
    "other",
];

/// The index in [`KINDS`] a record counts under, or `None` for a record
/// not counted.
fn kind_of(r: &Record) -> Option<usize> {
    Some(match &r.body {
        RecordBody::Ksymbol { flags, .. } if flags & KSYMBOL_FLAGS_UNREGISTER == 0 => 0,
        RecordBody::Ksymbol { .. } => 1,
        RecordBody::BpfEvent { event_type, .. } if *event_type == BPF_EVENT_PROG_LOAD => 2,
        RecordBody::BpfEvent { event_type, .. } if *event_type == BPF_EVENT_PROG_UNLOAD => 3,
        RecordBody::BpfEvent { .. } => 4,
        RecordBody::Lost { .. } => 5,
        // Kernel text is patched for reasons of its own (static keys,
        // call sites); trampoline-pokes holds the pokes that matter.
        RecordBody::TextPoke { .. } => return None,
        RecordBody::Unknown { .. } | RecordBody::Task { .. } => 6,
    })
}

/// Writes the `records:` lines one by one, numbering the lifetimes of
/// symbols that are not a facts program's as it meets them.
struct RecordWriter<'n> {
    names: &'n Names<'n>,
    /// Trampoline keys by first appearance (see `trampoline_keys`).
    tramp_keys: Vec<String>,
    /// Live lifetimes of non-program symbols by address …
    addr_label: BTreeMap<u64, String>,
    /// … and how many so far.
    addr_lives: usize,
}

impl<'n> RecordWriter<'n> {
    fn new(names: &'n Names<'n>) -> Self {
        RecordWriter {
            names,
            tramp_keys: Vec::new(),
            addr_label: BTreeMap::new(),
            addr_lives: 0,
        }
    }

    /// Whether record `r` has a line: not a poke outside every live
    /// symbol. Only the pokes of a live symbol's text (an ftrace
    /// trampoline's whole text as it comes and goes) are kept, call sites
    /// and static keys are patched whenever the kernel likes.
    fn shows(&self, r: &Record) -> bool {
        match &r.body {
            RecordBody::TextPoke { addr, .. } => self.addr_label.contains_key(addr),
            _ => true,
        }
    }

    /// Record `i`'s line.
    fn write(&mut self, out: &mut String, i: usize, r: &Record) {
        out.push_str("  ");
        match &r.body {
            RecordBody::Ksymbol {
                addr,
                len,
                ksym_type,
                flags,
                name,
            } => {
                let what = kloop_records::ksymbol_action(*flags);
                let label = self.ksymbol_label(i, *addr, *flags);
                let _ = write!(
                    out,
                    "KSYMBOL {what} {} {label} len={len} name={}",
                    kloop_records::ksym_type_name(*ksym_type),
                    trampoline_keys(
                        &name_tags(name, &self.names.tag_names),
                        &mut self.tramp_keys
                    )
                );
                let other = flags & !KSYMBOL_FLAGS_UNREGISTER;
                if other != 0 {
                    let _ = write!(out, " flags={flags:#x}");
                }
            }
            RecordBody::BpfEvent {
                event_type,
                flags,
                id,
                tag,
            } => {
                let (prog, tag_s) = self.names.program_and_tag(*id, tag);
                let _ = write!(
                    out,
                    "BPF_EVENT {} {prog} {tag_s}",
                    kloop_records::bpf_event_type_name(*event_type)
                );
                if *flags != 0 {
                    let _ = write!(out, " flags={flags:#x}");
                }
            }
            RecordBody::Lost { lost, .. } => {
                let _ = write!(out, "LOST lost={lost}");
            }
            RecordBody::TextPoke {
                addr,
                old_len,
                new_len,
            } => {
                let label = self.addr_label.get(addr).map_or("addr#?", String::as_str);
                let _ = write!(out, "TEXT_POKE {label} old_len={old_len} new_len={new_len}");
            }
            // Task records are shown as before they were parsed: their
            // pids and times differ from run to run.
            RecordBody::Unknown { type_: _ } | RecordBody::Task { .. } => {
                let type_ = &r.header.type_;
                let _ = write!(
                    out,
                    "type={type_}({}) size={}",
                    kloop_records::record_type_name(*type_).unwrap_or("undefined"),
                    r.header.size
                );
            }
        }
        if r.header.misc != 0 {
            let _ = write!(out, " misc={:#x}", r.header.misc);
        }
        out.push('\n');
    }

    /// A KSYMBOL's label: its facts program's function, else the lifetime
    /// at its address (a register opens a new one, an unregister closes
    /// the live one or, with none live, is a lifetime of its own).
    fn ksymbol_label(&mut self, i: usize, addr: u64, flags: u16) -> String {
        if let Some(l) = self.names.sym_label.get(&i) {
            return l.clone();
        }
        let live = if flags & KSYMBOL_FLAGS_UNREGISTER == 0 {
            None
        } else {
            self.addr_label.remove(&addr)
        };
        live.unwrap_or_else(|| {
            self.addr_lives += 1;
            let l = format!("addr#{}", self.addr_lives);
            if flags & KSYMBOL_FLAGS_UNREGISTER == 0 {
                self.addr_label.insert(addr, l.clone());
            }
            l
        })
    }
}

/// The deterministic text form of `analysis.merged`; see the module docs.
pub fn normalise(ev: &RunEvidence, analysis: &Analysis) -> String {
    let recs: &[Record] = &analysis.merged;
    // Programs of storm / concurrent batches are summarised, not listed:
    // their number is stable, their interleaving and addresses are not.
    let batch_ids: std::collections::BTreeSet<u32> = ev
        .batches
        .iter()
        .flat_map(|b| b.ids.iter().copied())
        .collect();
    // A run that provoked loss with task listeners alone has no set
    // accounting; what survived is as much a matter of timing.
    let lossy = analysis.loss.iter().any(|l| l.set == 0 && l.lost > 0)
        || (ev.provoked_loss && analysis.sets.is_empty() && analysis.lost > 0)
        || (ev.provoked_loss && ev.listeners.iter().any(|l| l.backward));
    let names = Names::new(ev, recs, &batch_ids);

    let mut out = String::new();
    out.push_str("# kloop normalised record stream\n");
    write_listeners(&mut out, ev, analysis);
    write_programs(&mut out, ev, &names);
    write_batches_and_loss(&mut out, ev, analysis, lossy);
    if !lossy && (analysis.sets.len() > 1 || ev.listeners.iter().any(|l| l.cpu < 0)) {
        write_set_counts(&mut out, ev, analysis);
    }

    let folded = sweep_repeats(ev, recs);
    // FORK and EXIT of the agent's `concurrent` threads only: a CPU-wide
    // listener with attr.task also hears every kernel thread that starts
    // or ends on its CPU (a workqueue adding a kworker when the guest runs
    // slowly, as with more VMs than host cores), which is the system's
    // business, not the scenario's. Rule task-records judges the agent's
    // threads' records; the snapshot keeps those.
    let loader_tids: std::collections::BTreeSet<u32> =
        ev.batches.iter().filter_map(|b| b.tid).collect();
    let foreign_task =
        |r: &Record| matches!(&r.body, RecordBody::Task { tid, .. } if !loader_tids.contains(tid));
    if lossy {
        // Which records survive an overflow, and how many LOST records
        // report them, depends on timing; the accounting above is exact.
        out.push_str("counts: (omitted: loss provoked)\nlost_total: (see loss provoked)\n");
        out.push_str("records: (omitted: loss provoked)\n");
        return out;
    }
    let mut counts = [0usize; KINDS.len()];
    for k in recs
        .iter()
        .enumerate()
        .filter(|(i, r)| !folded.contains(i) && !foreign_task(r))
        .filter_map(|(_, r)| kind_of(r))
    {
        if let Some(c) = counts.get_mut(k) {
            *c += 1;
        }
    }
    out.push_str("counts:");
    for (name, n) in KINDS.iter().zip(counts) {
        let _ = write!(out, " {name}={n}");
    }
    out.push('\n');
    let _ = writeln!(out, "lost_total: {}", analysis.lost);

    if !folded.is_empty() {
        out.push_str(
            "fail-nth: repeated lifetimes of one symbol folded into one (their number follows the sweep's fault points)\n",
        );
    }
    out.push_str("records:\n");
    let mut writer = RecordWriter::new(&names);
    for (i, r) in recs.iter().enumerate() {
        if analysis.accounted.contains(&i) || folded.contains(&i) || foreign_task(r) {
            continue;
        }
        if writer.shows(r) {
            writer.write(&mut out, i, r);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::analyse;
    use crate::check::testrun::*;

    #[test]
    fn trampoline_keys_are_numbered_by_first_appearance() {
        let mut keys = Vec::new();
        assert_eq!(
            trampoline_keys("bpf_trampoline_6442461886", &mut keys),
            "bpf_trampoline_<key#1>"
        );
        assert_eq!(
            trampoline_keys("bpf_trampoline_12", &mut keys),
            "bpf_trampoline_<key#2>"
        );
        assert_eq!(
            trampoline_keys("bpf_trampoline_6442461886", &mut keys),
            "bpf_trampoline_<key#1>"
        );
        assert_eq!(
            trampoline_keys("bpf_trampoline_x", &mut keys),
            "bpf_trampoline_x"
        );
        assert_eq!(
            trampoline_keys("bpf_dispatcher_xdp", &mut keys),
            "bpf_dispatcher_xdp"
        );
    }

    #[test]
    fn masks_tags() {
        assert_eq!(mask_tags("bpf_prog_0123456789abcdef_x"), "bpf_prog_<tag>_x");
        assert_eq!(mask_tags("bpf_prog_0123"), "bpf_prog_0123");
        assert_eq!(mask_tags("bpf_trampoline_6442"), "bpf_trampoline_6442");
        assert_eq!(
            mask_tags("bpf_prog_ABCDEF0123456789"),
            "bpf_prog_ABCDEF0123456789"
        );
        assert_eq!(
            mask_tags("bpf_prog_bpf_prog_0123456789abcdef"),
            "bpf_prog_bpf_prog_<tag>"
        );
    }

    #[test]
    fn normalised_good_run() {
        let ev = evidence(&good_script());
        let a = analyse(&ev);
        assert!(a.violations.is_empty());
        let text = normalise(&ev, &a);
        let expected = "\
# kloop normalised record stream
listeners:
  L0 cpu=0 sample_type=TID|TIME|CPU sample_id_all ksymbol bpf_event ring_bytes=65536
  L1 cpu=1 sample_type=TID|TIME|CPU sample_id_all ksymbol bpf_event ring_bytes=65536
merged: L0 L1
programs:
  prog#1 label=main name=kloop_subprogs prog_type=socket_filter functions=2
  prog#2 label=basic name=kloop_basic prog_type=xdp functions=1
counts: KSYMBOL.register=4 KSYMBOL.unregister=5 BPF_EVENT.PROG_LOAD=2 BPF_EVENT.PROG_UNLOAD=3 BPF_EVENT.other=0 LOST=0 other=0
lost_total: 0
records:
  KSYMBOL register BPF prog#1.f0 len=144 name=bpf_prog_<ftag(prog#1.f0)>_kloop_subprogs
  KSYMBOL register BPF prog#1.f1 len=56 name=bpf_prog_<ftag(prog#1.f1)>_helper
  BPF_EVENT PROG_LOAD prog#1 tag(prog#1)
  KSYMBOL register OOL addr#1 len=4096 name=kprobe_insn_page
  KSYMBOL register BPF prog#2.f0 len=72 name=bpf_prog_<tag(prog#2)>_kloop_basic
  BPF_EVENT PROG_LOAD prog#2 tag(prog#2)
  KSYMBOL unregister BPF prog#1.f0 len=144 name=bpf_prog_<ftag(prog#1.f0)>_kloop_subprogs
  KSYMBOL unregister BPF prog#1.f1 len=56 name=bpf_prog_<ftag(prog#1.f1)>_helper
  BPF_EVENT PROG_UNLOAD prog#1 tag(prog#1)
  KSYMBOL unregister OOL addr#1 len=4096 name=kprobe_insn_page
  KSYMBOL unregister BPF prog#2.f0 len=72 name=bpf_prog_<tag(prog#2)>_kloop_basic
  BPF_EVENT PROG_UNLOAD prog#2 tag(prog#2)
  KSYMBOL unregister BPF addr#2 len=64 name=bpf_prog_<tag>_old
  BPF_EVENT PROG_UNLOAD prog#3 tag(9999999999999999)
";
        assert_eq!(text, expected, "\n{text}");
    }

    /// A trampoline image freed and another allocated at the same address
    /// (allocator timing) normalise as two lifetimes, so the snapshot does
    /// not depend on whether the address came back.
    #[test]
    fn reused_addresses_are_new_lifetimes() {
        let image = |l: u32, t: u64, reg: bool| {
            let n = "bpf_trampoline_6442504781".to_string();
            let ev = if reg {
                Ev::Reg(A_OOL, 4096, kloop_records::KSYM_TYPE_BPF, n)
            } else {
                Ev::Unreg(A_OOL, 4096, kloop_records::KSYM_TYPE_BPF, n)
            };
            (l, t, ev)
        };
        let mut script = good_script();
        script.retain(|(_, _, e)| !matches!(e, Ev::Reg(a, ..) | Ev::Unreg(a, ..) if *a == A_OOL));
        script.extend([
            image(0, 300, true),
            image(1, 301, false),
            image(0, 302, true),
            image(1, 303, false),
        ]);
        let ev = evidence(&script);
        let a = analyse(&ev);
        assert!(a.violations.is_empty(), "{:?}", a.violations);
        let text = normalise(&ev, &a);
        let lines: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("bpf_trampoline_"))
            .map(str::trim)
            .collect();
        assert_eq!(
            lines,
            [
                "KSYMBOL register BPF addr#2 len=4096 name=bpf_trampoline_<key#1>",
                "KSYMBOL unregister BPF addr#2 len=4096 name=bpf_trampoline_<key#1>",
                "KSYMBOL register BPF addr#3 len=4096 name=bpf_trampoline_<key#1>",
                "KSYMBOL unregister BPF addr#3 len=4096 name=bpf_trampoline_<key#1>",
            ],
            "\n{text}"
        );
    }

    /// A fail-nth sweep's attempts that fail after the trampoline image is
    /// registered give one register + unregister pair each, and how many
    /// there are varies: two and three such lifetimes normalise alike, and
    /// without a fail-nth step nothing is folded.
    #[test]
    fn a_sweeps_repeated_lifetimes_fold_into_one() {
        let image = |t: u64, reg: bool| {
            let n = "bpf_trampoline_6442504781".to_string();
            let ev = if reg {
                Ev::Reg(A_OOL, 4096, kloop_records::KSYM_TYPE_BPF, n)
            } else {
                Ev::Unreg(A_OOL, 4096, kloop_records::KSYM_TYPE_BPF, n)
            };
            (0, t, ev)
        };
        let run = |lifetimes: u64, sweep: bool| {
            let mut script = good_script();
            script
                .retain(|(_, _, e)| !matches!(e, Ev::Reg(a, ..) | Ev::Unreg(a, ..) if *a == A_OOL));
            for k in 0..lifetimes {
                script.extend([image(300 + 2 * k, true), image(301 + 2 * k, false)]);
            }
            let mut ev = evidence(&script);
            if sweep {
                ev.steps.insert(
                    90,
                    kloop_protocol::Step::FailNth {
                        target: kloop_protocol::SweepTarget::Attach {
                            label: "fentry".into(),
                        },
                        max_attempts: 64,
                        page_allocations: false,
                    },
                );
            }
            let a = analyse(&ev);
            assert!(a.violations.is_empty(), "{:?}", a.violations);
            normalise(&ev, &a)
        };
        let (two, three) = (run(2, true), run(3, true));
        assert_eq!(two, three);
        assert_eq!(
            two.matches("name=bpf_trampoline_<key#1>").count(),
            2,
            "\n{two}"
        );
        assert!(two.contains("fail-nth: repeated lifetimes of one symbol folded"));
        assert!(
            two.contains("KSYMBOL.register=4 KSYMBOL.unregister=5"),
            "\n{two}"
        );
        // Without a sweep every lifetime is a fact of the stream.
        assert_ne!(run(2, false), run(3, false));
        assert_eq!(
            run(3, false).matches("name=bpf_trampoline_<key#1>").count(),
            6
        );
    }

    #[test]
    fn batches_are_summarised_and_provoked_loss_is_accounted_not_listed() {
        use crate::check::stream_tests::{batch, cycle, ev_of, storm_script};
        let mut ev = ev_of(&[(0, 0), (1, 1)], &storm_script());
        ev.batches = vec![batch(vec![50, 51, 52], None)];
        let a = analyse(&ev);
        assert!(a.violations.is_empty());
        let text = normalise(&ev, &a);
        assert!(
            text.contains("  storm basic/kloop_basic: 3 program(s) x 1 function(s)\n"),
            "{text}"
        );
        assert!(
            text.contains("records accounted to them in the merged stream: 12"),
            "{text}"
        );
        assert!(text.ends_with("records:\n"), "{text}");

        let mut s = cycle(1, 200, 51, 0xffff_ffff_c000_1000);
        s.push((0, 150, Ev::Lost(8)));
        let mut ev = ev_of(&[(0, 0), (1, 1)], &s);
        ev.batches = vec![batch(vec![50, 51, 52], None)];
        ev.provoked_loss = true;
        let a = analyse(&ev);
        assert!(a.violations.is_empty());
        let text = normalise(&ev, &a);
        assert!(
            text.contains("loss provoked: set#0: caused 12 records; received + lost = 12\n"),
            "{text}"
        );
        assert!(
            text.ends_with("records: (omitted: loss provoked)\n"),
            "{text}"
        );
    }
}
