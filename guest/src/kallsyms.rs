//! `/proc/kallsyms` reading.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use anyhow::{anyhow, Result};
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

/// Guest nanoseconds spent reading /proc/kallsyms since the agent started:
/// the runner reports each step's share (`StepDone.kallsyms_ns`), since
/// under TCG one read (the kernel formatting ~150,000 lines) costs 0.2-0.4 s
/// and is the largest cost of most trials.
static READ_NS: AtomicU64 = AtomicU64::new(0);

/// [`READ_NS`] now.
pub fn read_ns() -> u64 {
    READ_NS.load(Ordering::Relaxed)
}

/// `read`, its time added to [`READ_NS`].
fn timed<T>(read: impl FnOnce() -> T) -> T {
    let started = crate::sys::monotonic_ns();
    let out = read();
    READ_NS.fetch_add(
        crate::sys::monotonic_ns().saturating_sub(started),
        Ordering::Relaxed,
    );
    out
}

/// The whole file.
fn read_file() -> Result<Vec<u8>> {
    timed(|| std::fs::read("/proc/kallsyms").os_ctx("reading /proc/kallsyms"))
}

/// Files of /proc/kallsyms opened before the save, each already positioned
/// (`lseek`) at the start of the core kernel's last line, and that line:
/// a restored agent reads one to its end instead of reading the whole file.
///
/// Why this is the same file, read from the kernel's source
/// (kernel/kallsyms.c, fs/seq_file.c, 5.10 to 7.x): the file lists the core
/// kernel's symbols at positions below `kallsyms_num_syms`, then every
/// other kind (modules, BPF, kprobe and ftrace pages) from
/// `update_iter_mod()`, which looks each position up afresh on the current
/// lists unless the iterator cached where a kind ended (`pos_*_end`, cleared
/// only by a reset to position 0). `seq_lseek()` to a line's start runs
/// `traverse()`, which stops with an empty buffer and `m->index` at that
/// line; stopping at the core's last line (not past it) leaves the
/// iterator at a core position, so no `pos_*_end` was ever set, and the
/// next `read()` formats that line and then the other kinds as they are at
/// the read. The core part costs the kernel all of its formatting (~150,000
/// lines, 0.2-0.4 s of a TCG vCPU) and never changes after boot, so the
/// seek is paid once, before the save, and every restored copy has the
/// files. Each serves one read; more reads go to the whole file.
struct Positioned {
    files: Vec<File>,
    /// The core kernel's last line, with its newline: a positioned read
    /// must start with exactly it, or it is not trusted.
    last_core_line: Vec<u8>,
}

static POSITIONED: Mutex<Option<Positioned>> = Mutex::new(None);

/// Positioned files made before a save when the kernel command line does
/// not say (`kloop.kallsyms_files=N`): enough for the reads of every
/// scenario whose VM shape does not ask for more (the loads' facts, a wait
/// on symbols, the last drain's read: at most 3 per trial in kloop's). Each
/// costs one traversal of the core part before the save (0.3-0.5 s of a
/// TCG vCPU, once per saved VM) and spares a restored trial one, so a shape
/// whose scenarios read more (trampolines: 6, symbol-state: 8) asks for
/// them in its `cmdline`; the word is part of the shape, so of the saved
/// VM's key, and the kernel ignores it as an unused module parameter.
const POSITIONED_FILES: usize = 4;

/// The most positioned files a command line may ask for: each holds a
/// seq_file buffer in the saved guest.
const MAX_POSITIONED_FILES: usize = 32;

/// How many files to position: `kloop.kallsyms_files=N` on the command line
/// (the last such word), else [`POSITIONED_FILES`].
fn positioned_files(cmdline: &str) -> usize {
    cmdline
        .split_whitespace()
        .filter_map(|w| w.strip_prefix("kloop.kallsyms_files="))
        .filter_map(|n| n.parse::<usize>().ok())
        .next_back()
        .map_or(POSITIONED_FILES, |n| n.min(MAX_POSITIONED_FILES))
}

/// Where the core kernel's last line starts in a whole read of the file,
/// and that line: the line before the first that names a module part, or
/// the last line when none does.
fn last_core_line(bytes: &[u8]) -> Option<(usize, &[u8])> {
    let mut start = 0;
    let mut last = None;
    while start < bytes.len() {
        let end = bytes[start..]
            .iter()
            .position(|&b| b == b'\n')
            .map_or(bytes.len(), |i| start + i + 1);
        let line = &bytes[start..end];
        if line.contains(&b'\t') {
            break;
        }
        last = Some((start, line));
        start = end;
    }
    last
}

/// Opens /proc/kallsyms and seeks it to `offset`.
fn open_at(offset: usize) -> std::io::Result<File> {
    let mut file = File::open("/proc/kallsyms")?;
    file.seek(SeekFrom::Start(offset as u64))?;
    Ok(file)
}

/// Before the save: makes the [`POSITIONED`] files from `whole` (a read of
/// the whole file made just now, with no module or program change since)
/// and proves the mechanism on this kernel with one more, read at once: it
/// must give the core's last line and then exactly the lines of `whole`
/// after it. Returns a note for the log.
fn position_files(whole: &[u8]) -> String {
    let Some((offset, line)) = last_core_line(whole) else {
        return "kallsyms: no core kernel line found; every read will be whole".into();
    };
    let check = || -> std::io::Result<bool> {
        let mut tail = Vec::new();
        open_at(offset)?.read_to_end(&mut tail)?;
        Ok(tail == whole[offset..])
    };
    match check() {
        Ok(true) => {}
        Ok(false) => {
            return "kallsyms: a read from the core's last line differed from the whole \
                    file's end; every read will be whole"
                .into()
        }
        Err(e) => {
            return format!(
                "kallsyms: seeking /proc/kallsyms failed ({}); every read will be whole",
                crate::sys::Errno(&e)
            )
        }
    }
    let count = positioned_files(&std::fs::read_to_string("/proc/cmdline").unwrap_or_default());
    let files: std::io::Result<Vec<File>> = (0..count).map(|_| open_at(offset)).collect();
    match files {
        Ok(files) => {
            *POSITIONED.lock().unwrap_or_else(|e| e.into_inner()) = Some(Positioned {
                files,
                last_core_line: line.to_vec(),
            });
            format!(
                "kallsyms: {count} files positioned at the core's last line \
                 (byte {offset}) for the first reads after the restore"
            )
        }
        Err(e) => format!(
            "kallsyms: positioning /proc/kallsyms failed ({}); every read will be whole",
            crate::sys::Errno(&e)
        ),
    }
}

/// The lines after the core kernel's (and possibly some of its): from a
/// positioned file while one is left, else the whole file.
fn read_after_core() -> Result<Vec<u8>> {
    let taken = {
        let mut guard = POSITIONED.lock().unwrap_or_else(|e| e.into_inner());
        guard
            .as_mut()
            .and_then(|p| Some((p.files.pop()?, p.last_core_line.clone())))
    };
    if let Some((mut file, line)) = taken {
        let mut bytes = Vec::new();
        let read = timed(|| file.read_to_end(&mut bytes));
        // Anything else than the core's last line first means the file
        // was not where it was put: not trusted, the whole file is read.
        if read.is_ok() && bytes.starts_with(&line) {
            return Ok(bytes);
        }
    }
    read_file()
}

/// Streams every parsable line of /proc/kallsyms that names a module part
/// (`\t[bpf]`, `\t[__builtin__kprobes]`, a module's `\t[veth]`) through
/// `keep`. Every reader wants only those: BPF programs, trampolines and
/// out-of-line code are never in the core kernel's table, which is most of
/// the file (about 150,000 lines on a Debian kernel); skipping its lines
/// before parsing them saves the agent most of its share of a read under
/// TCG (the kernel's own formatting remains).
pub fn read_filtered(mut keep: impl FnMut(&KallsymsEntry) -> bool) -> Result<Vec<KallsymsEntry>> {
    let bytes = read_after_core()?;
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
pub fn read_all(keep: impl FnMut(&KallsymsEntry) -> bool) -> Result<Vec<KallsymsEntry>> {
    Ok(parse_all(&read_file()?, keep))
}

fn parse_all(bytes: &[u8], mut keep: impl FnMut(&KallsymsEntry) -> bool) -> Vec<KallsymsEntry> {
    bytes
        .split(|&b| b == b'\n')
        .filter_map(|line| std::str::from_utf8(line).ok())
        .filter_map(parse_line)
        .filter(|e| keep(e))
        .collect()
}

/// Core-kernel symbols looked up by name before the VM was saved: the
/// names asked for and the entries found. The core kernel's table never
/// changes after boot (KASLR is fixed in the saved memory image), so a
/// restored copy may answer from it for ever.
static CORE_AT_SAVE: OnceLock<(Vec<String>, Vec<KallsymsEntry>)> = OnceLock::new();

/// One read of /proc/kallsyms before the save: returns the generated
/// symbols (as [`is_side_band_symbol`] keeps them) and a note on the
/// positioned files it made for the restored copies' reads, and keeps the
/// core-kernel symbols named `core_names` for [`core_by_name`].
pub fn read_before_save(core_names: &[&str]) -> Result<(Vec<KallsymsEntry>, String)> {
    let bytes = read_file()?;
    let mut core = Vec::new();
    let side_band = parse_all(&bytes, |e| {
        if e.module.is_none() && core_names.contains(&e.name.as_str()) {
            core.push(e.clone());
        }
        is_side_band_symbol(e)
    });
    let _ = CORE_AT_SAVE.set((core_names.iter().map(|n| n.to_string()).collect(), core));
    let note = position_files(&bytes);
    Ok((side_band, note))
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

/// `function` if /proc/kallsyms has it, else its one compiler clone
/// (`function.<suffix>`, a text symbol of the core kernel).
pub fn resolve_clone(function: &str) -> Result<String> {
    let prefix = format!("{function}.");
    let found = read_all(|e| {
        e.module.is_none()
            && matches!(e.kind, 't' | 'T')
            && (e.name == function || e.name.starts_with(&prefix))
    })?;
    if found.iter().any(|e| e.name == function) {
        return Ok(function.to_owned());
    }
    let mut names: Vec<String> = found.into_iter().map(|e| e.name).collect();
    names.sort();
    names.dedup();
    match names.as_slice() {
        [one] => Ok(one.clone()),
        [] => Err(anyhow!(
            "/proc/kallsyms has neither {function} nor a compiler clone of it: \
             inlined into its callers in this build, there is nothing to probe"
        )),
        many => Err(anyhow!(
            "{function} has several compiler clones in this build ({}); a kprobe on one \
             would not see the calls of the others",
            many.join(", ")
        )),
    }
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
    fn the_command_line_sets_how_many_files_are_positioned() {
        assert_eq!(positioned_files("console=ttyS0 panic=-1"), POSITIONED_FILES);
        assert_eq!(positioned_files("lsm=bpf kloop.kallsyms_files=8 quiet"), 8);
        // The last word wins, as the kernel's own parameters do; nonsense
        // is ignored and a huge count is capped.
        assert_eq!(
            positioned_files("kloop.kallsyms_files=2 kloop.kallsyms_files=6"),
            6
        );
        assert_eq!(positioned_files("kloop.kallsyms_files=x"), POSITIONED_FILES);
        assert_eq!(
            positioned_files("kloop.kallsyms_files=100000"),
            MAX_POSITIONED_FILES
        );
    }

    /// The core's last line is the one before the first module-part line
    /// (a tab), or the file's last when none has one.
    #[test]
    fn last_core_line_is_before_the_first_module_part() {
        let file = b"ffffffff81000000 T _stext\nffffffff81000010 t b\n\
                     ffffffffc0200000 t bpf_prog_1_x\t[bpf]\nffffffffc0201000 t y\t[veth]\n";
        let (offset, line) = last_core_line(file).unwrap();
        assert_eq!(offset, 26);
        assert_eq!(line, b"ffffffff81000010 t b\n");
        let core_only = b"ffffffff81000000 T _stext\nffffffff81000010 t b\n";
        assert_eq!(last_core_line(core_only).unwrap().0, 26);
        let unterminated = b"ffffffff81000000 T _stext\nffffffff81000010 t b";
        assert_eq!(
            last_core_line(unterminated).unwrap().1,
            b"ffffffff81000010 t b"
        );
        assert!(last_core_line(b"").is_none());
        assert!(last_core_line(b"ffffffffc0200000 t p\t[bpf]\n").is_none());
    }

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
