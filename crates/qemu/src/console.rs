//! The guest console (`console.log`): its tail for humans, and the kernel's
//! panic lines.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::Path;

/// The last `n` lines of a console log (lossy UTF-8).
pub fn console_tail(path: &Path, n: usize) -> String {
    let Ok(f) = File::open(path) else {
        return format!("(no console log at {})", path.display());
    };
    let lines: Vec<String> = BufReader::new(f)
        .split(b'\n')
        .map_while(Result::ok)
        .map(|l| printable(&String::from_utf8_lossy(&l)))
        .collect();
    let start = lines.len().saturating_sub(n);
    lines[start..].join("\n")
}

/// A console line without terminal escape sequences (the firmware clears
/// the screen) or other control characters.
pub(crate) fn printable(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\x1b' => {
                // CSI: parameters and intermediates up to a final byte;
                // otherwise a two-character escape such as `ESC c`.
                if chars.next() == Some('[') {
                    for c in chars.by_ref() {
                        if ('\x40'..='\x7e').contains(&c) {
                            break;
                        }
                    }
                }
            }
            '\t' => out.push(c),
            c if c.is_control() => {}
            c => out.push(c),
        }
    }
    out
}

/// The first lines of a kernel oops in a console log that has no panic
/// line: with `oops=panic panic=-1` the kernel restarts the moment it
/// panics, and the serial console can lose everything after the first
/// lines of the oops (QEMU, started with `-no-reboot`, then exits 0). The
/// markers are the kernel's own (`Oops:` from `__die`, `BUG:` and `kernel
/// BUG at` from the bug and fault handlers); a WARN's `cut here` is not
/// one, since a WARN does not stop the kernel.
pub fn console_oops(path: &Path) -> Option<String> {
    const LINES: usize = 12;
    let text = std::fs::read(path).ok()?;
    let text = String::from_utf8_lossy(&text);
    let lines: Vec<String> = text.lines().map(printable).collect();
    let at = lines
        .iter()
        .position(|l| l.contains("Oops:") || l.contains("BUG:") || l.contains("kernel BUG at"))?;
    Some(lines[at..(at + LINES).min(lines.len())].join("\n"))
}

/// The panic lines of a console log, if the kernel panicked.
pub fn console_panic(path: &Path) -> Option<String> {
    let text = std::fs::read(path).ok()?;
    let text = String::from_utf8_lossy(&text);
    let lines: Vec<String> = text.lines().map(printable).collect();
    let at = lines
        .iter()
        .position(|l| l.contains("Kernel panic - not syncing"))?;
    // Oops details come before the panic line; keep some context.
    let start = lines[..at]
        .iter()
        .rposition(|l| {
            l.contains("BUG:") || l.contains("Oops") || l.contains("------------[ cut here")
        })
        .unwrap_or(at.saturating_sub(5));
    let end = (at + 3).min(lines.len());
    let mut out = lines[start..end].to_vec();
    // The firmware's last words often share the kernel's first line: put the
    // panic's timestamp at the start of its own line.
    let panic = &mut out[at - start];
    let p = panic.find("Kernel panic - not syncing").unwrap_or(0);
    if let Some(i) = panic[..p].rfind('[').filter(|&i| i > 0) {
        let rest = panic.split_off(i);
        out.insert(at - start + 1, rest);
    }
    Some(out.join("\n"))
}
