//! The kallsyms steps: `snapshot-kallsyms` (the generated symbols present
//! before recording) and `wait-kallsyms` (until a generated symbol appears
//! or goes). Reading `/proc/kallsyms` itself is [`crate::kallsyms`].

use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use kloop_protocol::{KallsymsEntry, Message};

use crate::channel::{log, send};
use crate::kallsyms::{is_side_band_symbol, read_filtered};

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

/// Waits until a generated symbol starting with `prefix` is `present` (or,
/// with `present` false, until none is left).
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
    loop {
        // Only code the kernel generates (`[bpf]`, `[__builtin__*]`): kernel
        // functions share the prefixes (bpf_trampoline_link_prog...).
        let found = read_filtered(|e| is_side_band_symbol(e) && e.name.starts_with(prefix))?;
        let done = match count {
            Some(n) => found.len() == n as usize,
            None => found.is_empty() != present,
        };
        if done {
            return log(format!(
                "kallsyms: {wanted} symbol(s) starting with {prefix:?} after {} ms",
                started.elapsed().as_millis()
            ));
        }
        if Instant::now() >= deadline {
            let names: Vec<String> = found
                .iter()
                .map(|e| format!("{:#x} {}", e.addr, e.name))
                .collect();
            bail!(
                "after {timeout_ms} ms /proc/kallsyms has {} symbol(s) starting with {prefix:?}, not {wanted}{}",
                found.len(),
                if names.is_empty() {
                    String::new()
                } else {
                    format!(": {names:?}")
                }
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
