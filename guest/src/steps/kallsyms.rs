//! The kallsyms steps: `snapshot-kallsyms` (the generated symbols present
//! before recording) and `wait-kallsyms` (until a generated symbol appears
//! or goes). Reading `/proc/kallsyms` itself is [`crate::kallsyms`].

use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use kloop_protocol::Message;

use crate::channel::{log, send};
use crate::kallsyms::{is_side_band_symbol, read_filtered};

/// Sends every symbol that may show up in KSYMBOL records as `InitialKallsyms`.
pub fn snapshot() -> Result<()> {
    let entries = read_filtered(is_side_band_symbol)?;
    send(&Message::InitialKallsyms { entries })
}

/// Waits until a generated symbol starting with `prefix` is `present` (or,
/// with `present` false, until none is left).
pub fn wait(prefix: &str, present: bool, timeout_ms: u64) -> Result<()> {
    let started = Instant::now();
    let deadline = started + Duration::from_millis(timeout_ms);
    loop {
        // Only code the kernel generates (`[bpf]`, `[__builtin__*]`): kernel
        // functions share the prefixes (bpf_trampoline_link_prog...).
        let found = read_filtered(|e| is_side_band_symbol(e) && e.name.starts_with(prefix))?;
        if found.is_empty() != present {
            return log(format!(
                "kallsyms: {} symbol starting with {prefix:?} after {} ms",
                if present { "some" } else { "no" },
                started.elapsed().as_millis()
            ));
        }
        if Instant::now() >= deadline {
            let names: Vec<String> = found
                .iter()
                .map(|e| format!("{:#x} {}", e.addr, e.name))
                .collect();
            bail!(
                "after {timeout_ms} ms /proc/kallsyms still has {} symbol starting with {prefix:?}{}",
                if present { "no" } else { "a" },
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
