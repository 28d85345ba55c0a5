//! The kallsyms steps: `snapshot-kallsyms` (the generated symbols present
//! before recording) and `wait-kallsyms` (until a generated symbol appears
//! or goes). Reading `/proc/kallsyms` itself is [`crate::kallsyms`].

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use kloop_protocol::{KallsymsEntry, ListenerInfo, Message};
use kloop_records::{RecordBody, KSYMBOL_FLAGS_UNREGISTER};

use crate::channel::{log, send};
use crate::kallsyms::{is_side_band_symbol, read_filtered};
use crate::perf::{wait_for_ksymbol, Ring};

/// Sends every symbol that may show up in KSYMBOL records as
/// `InitialKallsyms`: those read before the save when the runner still has
/// them (`at_save`, see [`crate::context::StepContext::kallsyms_at_save`]),
/// else read now. Reading the file costs 0.2-0.4 s under TCG, most of it
/// the kernel formatting the core kernel's 150,000 lines.
pub fn snapshot(at_save: Option<Vec<KallsymsEntry>>) -> Result<()> {
    let entries = match at_save {
        Some(entries) => {
            log(format!(
                "initial kallsyms: {} generated symbol(s) as read before the save (nothing has run since the restore)",
                entries.len()
            ))?;
            entries
        }
        None => read_side_band()?,
    };
    send(&Message::InitialKallsyms { entries })
}

/// The generated symbols now, for [`snapshot`] after a restore.
pub fn read_side_band() -> Result<Vec<KallsymsEntry>> {
    read_filtered(is_side_band_symbol)
}

/// Without a KSYMBOL record, how long [`wait`] sleeps before reading
/// `/proc/kallsyms` again: a record wakes it at once; this bounds the wait
/// where a symbol came or went without one.
const RECHECK: Duration = Duration::from_millis(1000);

/// Waits until a generated symbol starting with `prefix` is `present` (or,
/// with `present` false, until none is left; with `count`, until exactly
/// that many are). It reads `/proc/kallsyms` once and then follows the
/// KSYMBOL records of listeners of its own (one per online CPU, opened
/// before the read), instead of reading the file again every few
/// milliseconds: a read costs 0.2-0.4 s of a vCPU under TCG, which the
/// kernel's worker freeing a trampoline image then waits for. The records
/// are applied on top of what the read showed: for each symbol (address
/// and name) the last record says whether it is there, and without one
/// the read does (a record from before the read agrees with it, or a
/// later one of the same symbol follows). That holds whether the kernel
/// changes its list before the record (`bpf_ksym_add()`/`bpf_ksym_del()`
/// for trampoline images) or after (`collect_one_slot()` emits a kprobe
/// page's unregister, then `list_del_rcu()`s it). The bells' records
/// carry no time, so records are in order only within one CPU's ring:
/// when one symbol has records on two CPUs in one wake-up, or a record was
/// lost or does not parse, or no record came for a second, the file is
/// read again.
pub fn wait(prefix: &str, present: bool, count: Option<u32>, timeout_ms: u64) -> Result<()> {
    let started = Instant::now();
    let deadline = started + Duration::from_millis(timeout_ms);
    if count.is_some_and(|n| (n > 0) != present) {
        bail!("wait-kallsyms: count {count:?} contradicts present = {present}");
    }
    let wanted = match count {
        Some(n) => format!("exactly {n}"),
        None if present => "some".to_string(),
        None => "no".to_string(),
    };
    let bells = open_bells();
    let (mut reads, mut records) = (0u32, 0usize);
    let mut symbols: BTreeMap<(u64, String), bool> = BTreeMap::new();
    let mut read_again = true;
    loop {
        if read_again {
            // Only code the kernel generates (`[bpf]`, `[__builtin__*]`):
            // kernel functions share the prefixes (bpf_trampoline_link_prog...).
            symbols = read_filtered(|e| is_side_band_symbol(e) && e.name.starts_with(prefix))?
                .into_iter()
                .map(|e| ((e.addr, e.name), true))
                .collect();
            reads += 1;
            read_again = false;
        }
        let found: Vec<&(u64, String)> = symbols
            .iter()
            .filter(|(_, there)| **there)
            .map(|(k, _)| k)
            .collect();
        let done = match count {
            Some(n) => found.len() == n as usize,
            None => found.is_empty() != present,
        };
        if done {
            let how = match &bells {
                Ok(_) => format!("{records} KSYMBOL record(s) followed"),
                Err(why) => format!("polled every 20 ms: {why}"),
            };
            return log(format!(
                "kallsyms: {wanted} symbol(s) starting with {prefix:?} after {} ms ({reads} read(s) of /proc/kallsyms, {how})",
                started.elapsed().as_millis()
            ));
        }
        let now = Instant::now();
        if now >= deadline {
            // The file, not the records, in the failure.
            let names: Vec<String> =
                read_filtered(|e| is_side_band_symbol(e) && e.name.starts_with(prefix))?
                    .iter()
                    .map(|e| format!("{:#x} {}", e.addr, e.name))
                    .collect();
            bail!(
                "after {timeout_ms} ms /proc/kallsyms has {} symbol(s) starting with {prefix:?}, not {wanted}{}",
                names.len(),
                if names.is_empty() {
                    String::new()
                } else {
                    format!(": {names:?}")
                }
            );
        }
        match &bells {
            Ok(bells) => {
                let rung = wait_for_ksymbol(bells, RECHECK.min(deadline - now))?;
                match ksymbol_records(&rung) {
                    Some(seen) if !seen.is_empty() => {
                        records += seen.len();
                        for (addr, name, there) in seen {
                            if name.starts_with(prefix) {
                                symbols.insert((addr, name), there);
                            }
                        }
                    }
                    // Nothing for a second, or records that cannot be
                    // put in order.
                    _ => read_again = true,
                }
            }
            Err(_) => {
                std::thread::sleep(Duration::from_millis(20));
                read_again = true;
            }
        }
    }
}

/// What a bell is to the record parser: a KSYMBOL-only CPU-wide listener
/// without a sample_id trailer ([`Ring::open_bell`]).
fn bell_listener(cpu: usize) -> ListenerInfo {
    ListenerInfo {
        index: u32::MAX,
        cpu: cpu as i32,
        ksymbol: true,
        // Named although it is the default: the parser reads no trailer.
        sample_id_all: false,
        ..ListenerInfo::default()
    }
}

/// The KSYMBOL records of the bells' bytes (one buffer per CPU) as
/// (address, name, registered), each CPU's in its ring's order; `None`
/// when one was lost or does not parse, or when one symbol has records
/// on two CPUs (their order is unknown).
fn ksymbol_records(rings: &[Vec<u8>]) -> Option<Vec<(u64, String, bool)>> {
    let mut out = Vec::new();
    let mut cpu_of: BTreeMap<(u64, String), usize> = BTreeMap::new();
    for (cpu, bytes) in rings.iter().enumerate() {
        for r in kloop_records::parse_stream(&bell_listener(cpu), bytes).ok()? {
            let RecordBody::Ksymbol {
                addr, flags, name, ..
            } = r.body
            else {
                // LOST: what the ring dropped is unknown.
                return None;
            };
            if *cpu_of.entry((addr, name.clone())).or_insert(cpu) != cpu {
                return None;
            }
            out.push((addr, name, flags & KSYMBOL_FLAGS_UNREGISTER == 0));
        }
    }
    Some(out)
}

/// One bell per online CPU (a side-band record goes only to the listeners
/// of the CPU it is emitted on); why there are none, if so.
fn open_bells() -> std::result::Result<Vec<Ring>, String> {
    let cpus = crate::sys::online_cpus().map_err(|e| format!("online CPUs: {e}"))?;
    cpus.into_iter()
        .map(|cpu| Ring::open_bell(cpu).map_err(|e| format!("{e:#}")))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use kloop_records::testutil::{self, Tr};

    /// A KSYMBOL record as a bell on `cpu` gets it (built from the uapi
    /// layout, no trailer).
    fn ksymbol(cpu: usize, addr: u64, name: &str, unregister: bool) -> Vec<u8> {
        testutil::ksymbol(
            &bell_listener(cpu),
            addr,
            4096,
            1, // PERF_RECORD_KSYMBOL_TYPE_BPF
            unregister,
            name,
            Tr::default(),
        )
    }

    #[test]
    fn bell_records_parse_in_ring_order_with_their_direction() {
        let mut cpu0 = ksymbol(0, 0xffff_a000, "bpf_trampoline_6442", false);
        cpu0.extend(ksymbol(0, 0xffff_a000, "bpf_trampoline_6442", true));
        let cpu1 = ksymbol(1, 0xffff_b000, "kprobe_optinsn_page", false);
        let got = ksymbol_records(&[cpu0, cpu1]).unwrap();
        assert_eq!(
            got,
            vec![
                (0xffff_a000, "bpf_trampoline_6442".to_string(), true),
                (0xffff_a000, "bpf_trampoline_6442".to_string(), false),
                (0xffff_b000, "kprobe_optinsn_page".to_string(), true),
            ]
        );
    }

    #[test]
    fn records_that_cannot_be_ordered_send_the_wait_back_to_the_file() {
        // One symbol on two CPUs: which came last is unknown.
        let cpu0 = ksymbol(0, 0xffff_a000, "bpf_trampoline_6442", false);
        let cpu1 = ksymbol(1, 0xffff_a000, "bpf_trampoline_6442", true);
        assert_eq!(ksymbol_records(&[cpu0, cpu1]), None);
        let lost = testutil::lost(&bell_listener(0), 0, 3, Tr::default());
        assert_eq!(ksymbol_records(&[lost]), None);
        let mut cut = ksymbol(0, 0xffff_a000, "bpf_trampoline_6442", false);
        cut.truncate(20);
        assert_eq!(ksymbol_records(&[cut]), None);
    }
}
