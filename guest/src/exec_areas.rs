//! The kernel's own list of executable memory, read from /proc/vmallocinfo
//! before the first step, after every step and after the plan. No record
//! shows the memory behind the code the records announce: a kprobe
//! instruction page, an ftrace trampoline or a BPF image kept after its
//! symbol went (or freed while a record still announces it) is seen only
//! here; kmemleak does not reliably list an executable page nobody
//! references. Collected only; the host judges
//! (`kloop_judge::exec_areas`, `check::areas`).
//!
//! On x86-64 every executable allocation lies in the module mapping space
//! (arch/x86/include/asm/pgtable_64_types.h: MODULES_VADDR is
//! `__START_KERNEL_map + KERNEL_IMAGE_SIZE`, 512 MiB or 1 GiB up, to
//! MODULES_END `0xffffffffff000000`): module_alloc() (5.10, 6.1) and
//! execmem_alloc() (6.10 on) allocate there, for modules, BPF JIT images
//! and packs, trampolines, dispatchers, kprobe instruction pages and
//! ftrace trampolines alike. /proc/vmallocinfo prints each area with `%pK`
//! (lib/vsprintf.c, restricted_pointer()): `kptr_restrict` 0 hashes it as
//! `%p` does, 2 prints zeros, 1 prints it to a reader with CAP_SYSLOG.
//! The agent runs with the kernel's default 0 (other readers, such as an
//! unprivileged attach's `bpf_prog_info`, see what a user would), so it
//! sets 1 around each read and puts the old value back.
//!
//! arm64 puts them anywhere in the vmalloc space (BPF images since
//! 5.17's "arm64/bpf: Remove 128MB limit for BPF JIT programs", kprobe
//! pages always, modules past their 2 GiB region with
//! `CONFIG_ARM64_MODULE_PLTS`), beside memory that is never executable:
//! there an area is one when its allocating function is one of
//! [`kloop_protocol::exec::ARM64_CODE_ALLOCATORS`].

use std::sync::Mutex;
use std::time::{Duration, Instant};

use kloop_protocol::{AreaReading, ExecArea, KallsymsEntry, Message, Step};

use crate::channel::send;

/// The lowest MODULES_VADDR of x86-64 (a 512 MiB kernel image) and
/// MODULES_END.
const MODULE_SPACE: std::ops::Range<u64> = 0xffff_ffff_a000_0000..0xffff_ffff_ff00_0000;
const VMALLOCINFO: &str = "/proc/vmallocinfo";
const KPTR_RESTRICT: &str = "/proc/sys/kernel/kptr_restrict";
/// More areas than this in the module space in one reading is not what
/// these plans make (each frame carries one reading).
const MAX_AREAS: usize = 4000;
/// How long the end reading waits for areas nothing explains to go: a
/// program's image is freed from a workqueue after an RCU grace period
/// (bpf_prog_free_deferred), a trampoline's after an RCU-tasks one; the
/// JIT books have already waited for the charge counter before this.
const SETTLE: Duration = Duration::from_secs(3);
const POLL: Duration = Duration::from_millis(50);

/// The first reading that failed, if any: later readings are not taken.
static FAILED: Mutex<Option<String>> = Mutex::new(None);
/// The readings sent so far, for the end reading's settle.
static READINGS: Mutex<Vec<AreaReading>> = Mutex::new(Vec::new());

/// One line of /proc/vmallocinfo, when it is an area of the module space
/// that holds memory (`unpurged vm_area` lines are areas already freed and
/// waiting for a lazy TLB purge; `vm_map_ram` lines have no vm_struct).
fn parse_line(line: &str) -> Option<Result<ExecArea, String>> {
    if line.contains("unpurged vm_area") || line.contains("vm_map_ram") {
        return None;
    }
    let mut words = line.split_whitespace();
    let range = words.next()?;
    let (a, b) = range.split_once('-')?;
    let hex = |s: &str| u64::from_str_radix(s.strip_prefix("0x")?, 16).ok();
    let (Some(start), Some(end)) = (hex(a), hex(b)) else {
        return Some(Err(format!("unreadable line {line:?}")));
    };
    let x86 = kloop_protocol::Arch::OF_THIS_BUILD == kloop_protocol::Arch::X86_64;
    if x86 && !MODULE_SPACE.contains(&start) {
        return None;
    }
    let _size = words.next();
    let mut caller = None;
    let mut pages = None;
    for w in words {
        if let Some(n) = w.strip_prefix("pages=") {
            pages = n.parse().ok();
        } else if caller.is_none() && pages.is_none() && !w.contains('=') {
            caller = Some(w.to_owned());
        }
    }
    // arm64 has no space of its own for executable memory: it is known
    // by the function that allocated it (kloop_protocol::exec).
    if !x86 && !kloop_protocol::exec::arm64_allocates_code(caller.as_deref()) {
        return None;
    }
    Some(Ok(ExecArea {
        start,
        end,
        pages,
        caller,
    }))
}

/// Parses the whole file. Addresses that are not kernel addresses mean
/// `%pK` hid them.
fn parse(text: &str) -> Result<Vec<ExecArea>, String> {
    let mut out = Vec::new();
    let mut kernel_addresses = false;
    for line in text.lines() {
        if line.starts_with("0xffff") {
            kernel_addresses = true;
        }
        match parse_line(line) {
            Some(Ok(a)) => out.push(a),
            Some(Err(e)) => return Err(e),
            None => {}
        }
    }
    if !kernel_addresses && !text.trim().is_empty() {
        return Err(format!(
            "{VMALLOCINFO} shows no kernel address: %pK hid them (kptr_restrict)"
        ));
    }
    if out.len() > MAX_AREAS {
        return Err(format!(
            "{} areas in the module space, more than the {MAX_AREAS} one reading carries",
            out.len()
        ));
    }
    Ok(out)
}

/// Reads the module space's areas with `kptr_restrict` 1 for the read.
fn read() -> Result<Vec<ExecArea>, String> {
    let old = std::fs::read_to_string(KPTR_RESTRICT)
        .map_err(|e| format!("reading {KPTR_RESTRICT}: {e}"))?;
    let old = old.trim();
    if old != "1" {
        std::fs::write(KPTR_RESTRICT, "1")
            .map_err(|e| format!("writing 1 to {KPTR_RESTRICT}: {e}"))?;
    }
    let text = std::fs::read_to_string(VMALLOCINFO);
    if old != "1" {
        std::fs::write(KPTR_RESTRICT, old)
            .map_err(|e| format!("writing {old} back to {KPTR_RESTRICT}: {e}"))?;
    }
    parse(&text.map_err(|e| format!("reading {VMALLOCINFO}: {e}"))?)
}

/// Reads and sends one reading, unless an earlier one failed; `heads`
/// gives the rings' heads, asked right before the read and right after.
fn take(after_step: Option<u32>, heads: &dyn Fn() -> Vec<(u32, u64)>) -> Option<Vec<ExecArea>> {
    let mut failed = FAILED.lock().unwrap_or_else(|e| e.into_inner());
    if failed.is_some() {
        return None;
    }
    let seen_at = heads();
    let read = read();
    let read_until = heads();
    match read {
        Ok(areas) => {
            let reading = AreaReading {
                after_step,
                seen_at,
                read_until,
                areas: areas.clone(),
            };
            let sent = send(&Message::ExecAreaReading {
                reading: reading.clone(),
            });
            READINGS
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(reading);
            if let Err(e) = sent {
                *failed = Some(format!("sending a reading: {e:#}"));
                return None;
            }
            Some(areas)
        }
        Err(e) => {
            *failed = Some(e);
            None
        }
    }
}

/// After step `step`; `heads` gives the rings' heads (a record written
/// between the two asks may or may not have been before the read, and
/// the host allows for either).
pub fn sight(step: u32, heads: &dyn Fn() -> Vec<(u32, u64)>) {
    take(Some(step), heads);
}

/// The areas before the first step.
pub struct Watch {
    start: Option<Vec<ExecArea>>,
}

impl Watch {
    pub fn start() -> Watch {
        *FAILED.lock().unwrap_or_else(|e| e.into_inner()) = None;
        READINGS.lock().unwrap_or_else(|e| e.into_inner()).clear();
        Watch {
            start: take(None, &Vec::new),
        }
    }

    /// The end reading: `symbols` are /proc/kallsyms' lines of module
    /// parts, read after the plan (`None`: read them here), `steps` the
    /// plan's. Areas new since the start that nothing accounts for
    /// (`kloop_protocol::exec::owners`, the host's definition too) are
    /// given [`SETTLE`] to go (deferred frees); the reading sent is the
    /// last one taken.
    pub fn finish(self, symbols: Option<Vec<KallsymsEntry>>, steps: &[Step]) -> Message {
        let started = Instant::now();
        let failed = FAILED.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let (Some(start), None) = (self.start, failed.clone()) else {
            return Message::ExecAreasEnd {
                end: None,
                end_symbols: Vec::new(),
                settle_ns: 0,
                unreadable: failed.or(Some("the start reading failed".into())),
            };
        };
        let symbols = match symbols {
            Some(s) => s,
            None => match crate::kallsyms::read_filtered(|e| e.module.is_some()) {
                Ok(s) => s,
                Err(e) => {
                    return Message::ExecAreasEnd {
                        end: None,
                        end_symbols: Vec::new(),
                        settle_ns: 0,
                        unreadable: Some(format!("reading /proc/kallsyms: {e:#}")),
                    }
                }
            },
        };
        let readings = READINGS.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let unexplained = |areas: &[ExecArea]| {
            kloop_protocol::exec::owners(
                &start,
                areas,
                &readings,
                &|i| steps.get(i as usize),
                &symbols,
                kloop_protocol::Arch::OF_THIS_BUILD,
            )
            .iter()
            .any(|(_, owner)| owner.is_none())
        };
        let mut end = read();
        while let Ok(areas) = &end {
            if !unexplained(areas) || started.elapsed() >= SETTLE {
                break;
            }
            std::thread::sleep(POLL);
            end = read();
        }
        let settle_ns = started.elapsed().as_nanos() as u64;
        match end {
            Ok(areas) => Message::ExecAreasEnd {
                end: Some(AreaReading {
                    after_step: None,
                    seen_at: Vec::new(),
                    read_until: Vec::new(),
                    areas,
                }),
                end_symbols: symbols,
                settle_ns,
                unreadable: None,
            },
            Err(e) => Message::ExecAreasEnd {
                end: None,
                end_symbols: Vec::new(),
                settle_ns,
                unreadable: Some(e),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lines of 6.12.107+deb13-cloud-amd64's /proc/vmallocinfo after the
    /// trampolines scenario (kptr_restrict 1), and an area outside the
    /// module space and a lazily freed one.
    const REAL: &str = "\
0xffffa0c0c0000000-0xffffa0c0c0005000   20480 dup_task_struct+0x4c/0x1a0 pages=4 vmalloc N0=4
0xffffffffc0000000-0xffffffffc0201000 2101248 bpf_prog_pack_alloc+0x2b0/0x3c0 pages=512 vmalloc N0=512
0xffffffffc0201000-0xffffffffc0203000    8192 arch_ftrace_update_trampoline+0x164/0x340 pages=1 vmalloc N0=1
0xffffffffc0203000-0xffffffffc0205000    8192 unpurged vm_area
";

    #[test]
    fn reads_the_module_space_areas_of_a_real_kernel() {
        let areas = parse(REAL).unwrap();
        assert_eq!(areas.len(), 2, "{areas:#?}");
        assert_eq!(areas[0].start, 0xffffffffc0000000);
        assert_eq!(areas[0].end, 0xffffffffc0201000);
        assert_eq!(areas[0].pages, Some(512));
        assert_eq!(
            areas[0].caller.as_deref(),
            Some("bpf_prog_pack_alloc+0x2b0/0x3c0")
        );
        assert_eq!(
            areas[1].caller.as_deref(),
            Some("arch_ftrace_update_trampoline+0x164/0x340")
        );
    }

    #[test]
    fn hashed_addresses_are_not_a_reading() {
        let hashed =
            "0x00000000c0ffee12-0x00000000deadbeef 8192 alloc_insn_page+0x1/0x2 pages=1 vmalloc\n";
        assert!(parse(hashed).unwrap_err().contains("kptr_restrict"));
    }
}
