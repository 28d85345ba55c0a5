//! What the steps of one plan share: the listener rings, the programs the
//! plan loaded, the links it holds, and what it unloaded. The runner owns
//! one [`StepContext`] for the whole plan and lends it to each step.

use std::any::Any;
use std::collections::HashMap;

use anyhow::{anyhow, Result};
use aya::Ebpf;

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
    pub observations: Vec<kloop_protocol::KsymbolObservation>,
}

#[derive(Default)]
pub struct StepContext {
    /// The plan's listeners, in `Listener` index order.
    pub rings: Vec<perf::Ring>,
    /// Listeners opened without a ring (`ring_pages = 0`), held open.
    pub unmapped: Vec<std::os::fd::OwnedFd>,
    pub loaded: HashMap<String, Loaded>,
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
    /// The program loaded under `label`, or an error naming those loaded.
    pub fn loaded_mut(&mut self, label: &str) -> Result<&mut Loaded> {
        let known: Vec<String> = self.loaded.keys().cloned().collect();
        self.loaded
            .get_mut(label)
            .ok_or_else(|| anyhow!("no loaded program {label:?} (loaded: {known:?})"))
    }
}
