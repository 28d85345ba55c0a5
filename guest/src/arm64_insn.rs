//! arm64 instructions where a kprobe goes: which ones its single-step
//! needs a `kprobe_insn_page` slot for, read from kernel text through
//! /proc/kcore. arm64 has no kprobes on ftrace: every probe decodes the
//! instruction it replaces (arch/arm64/kernel/probes/decode-insn.c).

use anyhow::{bail, Context, Result};

use crate::kallsyms;

/// On arm64, the address of `function` (where its instructions are read
/// from); `None` on x86-64, whose search asks the kernel alone.
pub fn entry(function: &str) -> Result<Option<u64>> {
    if kloop_protocol::Arch::OF_THIS_BUILD != kloop_protocol::Arch::Arm64 {
        return Ok(None);
    }
    let found = kallsyms::core_by_name(&[function])?;
    match found.first() {
        Some(e) => Ok(Some(e.addr)),
        None => bail!("{function} is not in /proc/kallsyms"),
    }
}

/// Why an arm64 kprobe at `entry + offset` would take no instruction slot
/// (or be refused), if it would: an offset inside an instruction (they are
/// 4 bytes), a hint (the patchable-entry NOPs, BTI, PACIASP: NOPs are
/// simulated from 6.3, and which hints are stepped changed between
/// series), or what arch/arm64/kernel/probes/decode-insn.c simulates or
/// rejects instead of stepping in a slot: branches, exception and system
/// instructions, PC-relative addressing, literal loads, exclusives.
pub fn no_slot(entry: u64, offset: u64) -> Result<Option<&'static str>> {
    if !offset.is_multiple_of(4) {
        return Ok(Some("inside an instruction"));
    }
    let bytes = crate::jit_books::kernel_bytes(entry + offset, 4)
        .with_context(|| format!("reading the instruction at {:#x}", entry + offset))?;
    let insn = u32::from_le_bytes(bytes.try_into().expect("4 bytes"));
    Ok(match insn {
        i if i & 0xffff_f01f == 0xd503_201f => Some("a hint"),
        i if i & 0x1c00_0000 == 0x1400_0000 => Some("branch, exception or system"),
        i if i & 0x1f00_0000 == 0x1000_0000 => Some("PC-relative address"),
        i if i & 0x3b00_0000 == 0x1800_0000 => Some("literal load"),
        i if i & 0x3f00_0000 == 0x0800_0000 => Some("exclusive load or store"),
        _ => None,
    })
}

/// The offset of the first B or BL in the first `within` bytes of the
/// function at `entry`: a kprobe there is simulated (simulate_b_bl(), every
/// series), so registering it takes no instruction slot.
pub fn first_branch(entry: u64, within: u64) -> Result<Option<u64>> {
    for offset in (0..within).step_by(4) {
        let bytes = crate::jit_books::kernel_bytes(entry + offset, 4)
            .with_context(|| format!("reading the instruction at {:#x}", entry + offset))?;
        let insn = u32::from_le_bytes(bytes.try_into().expect("4 bytes"));
        // B: 000101, BL: 100101 in bits 31..26.
        if insn & 0x7c00_0000 == 0x1400_0000 {
            return Ok(Some(offset));
        }
    }
    Ok(None)
}

/// Where a probe of `function` that only asks whether the kernel takes a
/// kprobe there can sit without making a `kprobe_insn_page`: its entry on
/// x86-64 (an ftrace site: no slot), its first branch on arm64. A page made
/// before the save would stay for good and take the KSYMBOL register that
/// the scenarios counting it expect from their own probe.
pub fn slot_free_offset(function: &str) -> Result<u64> {
    let Some(entry) = entry(function)? else {
        return Ok(0);
    };
    match first_branch(entry, 256)? {
        Some(offset) => Ok(offset),
        None => bail!("no branch in the first 256 bytes of {function} to probe without a slot"),
    }
}
