//! What the steps of one plan share: the listener rings, the programs the
//! plan loaded, the links it holds, and what it unloaded. The runner owns
//! one [`StepContext`] for the whole plan and lends it to each step.

use std::any::Any;
use std::collections::HashMap;

use anyhow::{anyhow, bail, Context, Result};
use aya::maps::RingBuf;
use aya::Ebpf;
use kloop_protocol::{KsymbolObservation, MAX_KSYMBOL_OBSERVATIONS};

use crate::perf;

/// A program a `load` or `load-object` step loaded, under its label.
pub struct Loaded {
    /// Owns the program fd (and the object's BTF fd); dropping it unloads.
    pub ebpf: Ebpf,
    /// The program's name in `ebpf`.
    pub program: String,
    pub id: u32,
    /// The other programs of a `load-object` (label, id): `ebpf` holds
    /// them, and their links, too.
    pub others: Vec<(String, u32)>,
    /// Links of a `load-object`'s programs: dropped (detached) with it.
    pub _links: Vec<Box<dyn Any>>,
}

/// A link an `attach` step took out of aya; dropping it detaches.
pub struct HeldLink {
    /// The program label it attaches.
    pub label: String,
    pub _link: Box<dyn Any>,
}

/// The `watch-ksymbols` kprobe: its object, its perf event (dropping it
/// detaches), and what `read-ksymbol-watch` has read out so far (each
/// reading sends them all).
pub struct KsymbolWatch {
    pub ebpf: Ebpf,
    pub _link: Box<dyn Any>,
    pub observations: Vec<KsymbolObservation>,
}

/// `struct observation` of `bpf/ksymwatch.bpf.c`.
const NAME_LEN: usize = 64;
const OBSERVATION_LEN: usize = 24 + 2 * NAME_LEN;

impl KsymbolWatch {
    /// Moves what the watch's ring holds into `observations`; returns how
    /// many it could not keep (past `MAX_KSYMBOL_OBSERVATIONS`).
    pub fn collect(&mut self) -> Result<u64> {
        let mut dropped = 0u64;
        let map = self
            .ebpf
            .map_mut("observations")
            .ok_or_else(|| anyhow!("the ksymbol watch has no map \"observations\""))?;
        let mut ring = RingBuf::try_from(map).context("map \"observations\" as a ring buffer")?;
        while let Some(item) = ring.next() {
            match parse(&item) {
                Some(o) if self.observations.len() < MAX_KSYMBOL_OBSERVATIONS => {
                    self.observations.push(o)
                }
                Some(_) => dropped += 1,
                None => bail!(
                    "ksymbol watch: an observation of {} bytes, not {OBSERVATION_LEN}",
                    item.len()
                ),
            }
        }
        Ok(dropped)
    }

    /// Out-of-line symbols named `name` registered minus unregistered in
    /// `observations[from..]`.
    pub fn net_registered(&self, from: usize, name: &str) -> i64 {
        self.observations
            .get(from..)
            .unwrap_or_default()
            .iter()
            .filter(|o| o.name == name)
            .map(|o| if o.unregister { -1 } else { 1 })
            .sum()
    }
}

fn parse(b: &[u8]) -> Option<KsymbolObservation> {
    if b.len() != OBSERVATION_LEN {
        return None;
    }
    let u64_at = |o: usize| u64::from_ne_bytes(b[o..o + 8].try_into().expect("8 bytes"));
    let text = |o: usize| {
        let s = &b[o..o + NAME_LEN];
        let end = s.iter().position(|&c| c == 0).unwrap_or(NAME_LEN);
        String::from_utf8_lossy(&s[..end]).into_owned()
    };
    Some(KsymbolObservation {
        addr: u64_at(0),
        len: u32::from_ne_bytes(b[8..12].try_into().expect("4 bytes")),
        ksym_type: u16::from_ne_bytes(b[12..14].try_into().expect("2 bytes")),
        unregister: b[14] != 0,
        listed: match b[15] {
            1 => Some(true),
            2 => Some(false),
            _ => None,
        },
        snprintf_ret: u64_at(16) as i64,
        symbolized: text(24),
        name: text(24 + NAME_LEN),
    })
}

#[derive(Default)]
pub struct StepContext {
    /// The plan's listeners, in `Listener` index order.
    /// The waiters of polled listeners, by the `open-listeners` step that
    /// opened them.
    pub waiters: std::collections::BTreeMap<u32, crate::wakeups::Waiter>,
    pub rings: Vec<perf::Ring>,
    /// Listeners opened without a ring (`ring_pages = 0`), held open.
    pub unmapped: Vec<std::os::fd::OwnedFd>,
    /// The index the next announced listener gets (indexes are never
    /// reused after a `close-listeners`).
    pub next_listener: u32,
    /// The listener indexes each `open-listeners` step opened, by plan
    /// step index, while they are open.
    pub opened_by: std::collections::BTreeMap<u32, Vec<u32>>,
    pub loaded: HashMap<String, Loaded>,
    /// Programs a `load-unnamed` step loaded with the bpf syscall, by
    /// label: the fd (closing it unloads) and the id.
    pub raw_loaded: HashMap<String, (std::os::fd::OwnedFd, u32)>,
    /// Links taken out of aya by `attach` steps, by link name: they keep
    /// the program attached (and alive) until `detach`.
    pub links: HashMap<String, HeldLink>,
    /// Programs unloaded by the plan and not yet confirmed gone.
    pub unloaded: Vec<(String, u32)>,
    /// Record bytes sent to the host so far (reported in `Done`).
    pub records_bytes: u64,
    /// The generated symbols as read just before the VM was saved, while
    /// nothing has run since the restore that could change them: the
    /// plan's first step, when it is `snapshot-kallsyms`, sends these
    /// instead of reading /proc/kallsyms again. The runner clears it once
    /// any step has run.
    pub kallsyms_at_save: Option<Vec<kloop_protocol::KallsymsEntry>>,
    /// Programs `load` steps loaded whose facts wait for their kallsyms
    /// lines: consecutive loads share one read of /proc/kallsyms, made
    /// after the last of them (see `steps::load::send_pending_facts`).
    pub pending_facts: Vec<(String, crate::bpf::ProgInfo)>,
    /// The `watch-ksymbols` kprobe, once attached.
    pub ksymbol_watch: Option<KsymbolWatch>,
}

impl StepContext {
    /// Each open ring's `data_head` now (listener index, bytes the kernel
    /// has written to it: the stream offset its next record gets).
    pub fn ring_heads(&self) -> Vec<(u32, u64)> {
        self.rings
            .iter()
            .map(|r| {
                (
                    r.index,
                    r.head_word().load(std::sync::atomic::Ordering::Acquire),
                )
            })
            .collect()
    }

    /// The program loaded under `label`, or an error naming those loaded.
    pub fn loaded_mut(&mut self, label: &str) -> Result<&mut Loaded> {
        loaded_entry(&mut self.loaded, label)
    }
}

/// [`StepContext::loaded_mut`] for a step that holds other fields of the
/// context at the same time.
pub fn loaded_entry<'a>(
    loaded: &'a mut HashMap<String, Loaded>,
    label: &str,
) -> Result<&'a mut Loaded> {
    let known: Vec<String> = loaded.keys().cloned().collect();
    loaded
        .get_mut(label)
        .ok_or_else(|| anyhow!("no loaded program {label:?} (loaded: {known:?})"))
}

impl Loaded {
    /// The program itself, out of the object that holds it.
    pub fn program_mut(&mut self) -> Result<&mut aya::programs::Program> {
        let name = &self.program;
        self.ebpf
            .program_mut(name)
            .ok_or_else(|| anyhow!("program {name:?} vanished from its object"))
    }
}
