//! `/proc/kallsyms` reading.

use std::sync::OnceLock;

use anyhow::Result;
use kloop_protocol::KallsymsEntry;

use crate::sys::OsContext;

/// Parses one line: `addr type name` or `addr type name\t[module]`.
pub fn parse_line(line: &str) -> Option<KallsymsEntry> {
    let mut parts = line.split_whitespace();
    let addr = u64::from_str_radix(parts.next()?, 16).ok()?;
    let mut kind_chars = parts.next()?.chars();
    let kind = kind_chars.next()?;
    if kind_chars.next().is_some() {
        return None;
    }
    let name = parts.next()?.to_owned();
    let module = match parts.next() {
        Some(m) => Some(m.strip_prefix('[')?.strip_suffix(']')?.to_owned()),
        None => None,
    };
    Some(KallsymsEntry {
        addr,
        kind,
        name,
        module,
    })
}

/// Streams every parsable line of /proc/kallsyms that names a module part
/// (`\t[bpf]`, `\t[__builtin__kprobes]`, a module's `\t[veth]`) through
/// `keep`. Every reader wants only those: BPF programs, trampolines and
/// out-of-line code are never in the core kernel's table, which is most of
/// the file (about 150,000 lines on a Debian kernel); skipping its lines
/// before parsing them saves the agent most of its share of a read under
/// TCG (the kernel's own formatting remains).
pub fn read_filtered(mut keep: impl FnMut(&KallsymsEntry) -> bool) -> Result<Vec<KallsymsEntry>> {
    let bytes = std::fs::read("/proc/kallsyms").os_ctx("reading /proc/kallsyms")?;
    Ok(bytes
        .split(|&b| b == b'\n')
        .filter(|line| line.contains(&b'\t'))
        .filter_map(|line| std::str::from_utf8(line).ok())
        .filter_map(parse_line)
        .filter(|e| keep(e))
        .collect())
}

/// Like [`read_filtered`], but over every line, the core kernel's too:
/// for the few readers that want kernel functions or data symbols.
pub fn read_all(mut keep: impl FnMut(&KallsymsEntry) -> bool) -> Result<Vec<KallsymsEntry>> {
    let bytes = std::fs::read("/proc/kallsyms").os_ctx("reading /proc/kallsyms")?;
    Ok(bytes
        .split(|&b| b == b'\n')
        .filter_map(|line| std::str::from_utf8(line).ok())
        .filter_map(parse_line)
        .filter(|e| keep(e))
        .collect())
}

/// Core-kernel symbols looked up by name before the VM was saved: the
/// names asked for and the entries found. The core kernel's table never
/// changes after boot (KASLR is fixed in the saved memory image), so a
/// restored copy may answer from it for ever.
static CORE_AT_SAVE: OnceLock<(Vec<String>, Vec<KallsymsEntry>)> = OnceLock::new();

/// One read of /proc/kallsyms before the save: returns the generated
/// symbols (as [`is_side_band_symbol`] keeps them) and keeps the
/// core-kernel symbols named `core_names` for [`core_by_name`].
pub fn read_before_save(core_names: &[&str]) -> Result<Vec<KallsymsEntry>> {
    let mut core = Vec::new();
    let side_band = read_all(|e| {
        if e.module.is_none() && core_names.contains(&e.name.as_str()) {
            core.push(e.clone());
        }
        is_side_band_symbol(e)
    })?;
    let _ = CORE_AT_SAVE.set((core_names.iter().map(|n| n.to_string()).collect(), core));
    Ok(side_band)
}

/// The core-kernel symbols named `names` (none for a name the kernel lacks):
/// from the read before the save when it looked for every one of them, else
/// from a read now (0.2-0.4 s under TCG).
pub fn core_by_name(names: &[&str]) -> Result<Vec<KallsymsEntry>> {
    if let Some((asked, found)) = CORE_AT_SAVE.get() {
        if names.iter().all(|n| asked.iter().any(|a| a == n)) {
            return Ok(found
                .iter()
                .filter(|e| names.contains(&e.name.as_str()))
                .cloned()
                .collect());
        }
    }
    read_all(|e| e.module.is_none() && names.contains(&e.name.as_str()))
}

/// Symbols that may show up as KSYMBOL records: BPF programs, trampolines
/// and dispatchers (`[bpf]`), and out-of-line code such as kprobe insn pages
/// and ftrace trampolines (`[__builtin__kprobes]`, `[__builtin__ftrace]`).
pub fn is_side_band_symbol(e: &KallsymsEntry) -> bool {
    match e.module.as_deref() {
        Some("bpf") => true,
        Some(m) => m.starts_with("__builtin__"),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines() {
        let e = parse_line("ffffffffc0201234 t bpf_prog_6deef7357e7b4530_kloop\t[bpf]").unwrap();
        assert_eq!(e.addr, 0xffffffffc0201234);
        assert_eq!(e.kind, 't');
        assert_eq!(e.name, "bpf_prog_6deef7357e7b4530_kloop");
        assert_eq!(e.module.as_deref(), Some("bpf"));
        assert!(is_side_band_symbol(&e));
        let k = parse_line("ffffffff81000000 T _stext").unwrap();
        assert_eq!(k.module, None);
        assert!(!is_side_band_symbol(&k));
        assert!(parse_line("garbage").is_none());
    }
}
