//! The code of a compiled object file, as a digest: what Trivial Compiler
//! Equivalence compares (two sources whose objects have the same code are
//! the same program, whatever their text says).
//!
//! Only what is loaded counts: every `SHF_ALLOC` section's name, bytes and
//! relocations (offset, kind, the symbol or section they name, addend).
//! Debug information, the symbol table's order and `.comment` do not run,
//! and the DWARF line table differs between two sources that compile to
//! the same code whenever lines move. Line numbers that do reach loaded
//! sections (WARN_ON's `__bug_table`) are kept: the mutants keep every line
//! where it was, so a difference there is a real one.

use std::path::Path;

use object::{Object, ObjectSection, ObjectSymbol, RelocationTarget, SectionFlags};
use sha2::{Digest, Sha256};

#[derive(Debug, thiserror::Error)]
pub enum ObjectError {
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not an ELF object: {why}")]
    Parse { path: String, why: String },
}

/// sha256 (hex) over the loaded sections of the ELF object at `path`.
pub fn code_digest(path: &Path) -> Result<String, ObjectError> {
    let bytes = std::fs::read(path).map_err(|source| ObjectError::Read {
        path: path.display().to_string(),
        source,
    })?;
    code_digest_of(&bytes).map_err(|why| ObjectError::Parse {
        path: path.display().to_string(),
        why,
    })
}

/// [`code_digest`] of an object's bytes.
pub fn code_digest_of(bytes: &[u8]) -> Result<String, String> {
    let file = object::File::parse(bytes).map_err(|e| e.to_string())?;
    let mut h = Sha256::new();
    let target_name = |t: RelocationTarget| -> String {
        match t {
            RelocationTarget::Symbol(i) => file
                .symbol_by_index(i)
                .ok()
                .map(|s| {
                    // A section symbol has no name of its own: its section's.
                    let name = s.name().unwrap_or("");
                    if name.is_empty() {
                        s.section_index()
                            .and_then(|si| file.section_by_index(si).ok())
                            .and_then(|sec| sec.name().ok().map(|n| format!("section {n}")))
                            .unwrap_or_default()
                    } else {
                        format!("symbol {name}")
                    }
                })
                .unwrap_or_default(),
            RelocationTarget::Section(si) => file
                .section_by_index(si)
                .ok()
                .and_then(|s| s.name().ok().map(|n| format!("section {n}")))
                .unwrap_or_default(),
            RelocationTarget::Absolute => "absolute".into(),
            _ => "other".into(),
        }
    };
    for section in file.sections() {
        let alloc = match section.flags() {
            SectionFlags::Elf { sh_flags } => sh_flags & u64::from(object::elf::SHF_ALLOC) != 0,
            _ => false,
        };
        if !alloc {
            continue;
        }
        h.update(section.name().unwrap_or("").as_bytes());
        h.update([0]);
        h.update(section.size().to_le_bytes());
        // NOBITS (.bss) has a size and no bytes.
        if let Ok(data) = section.data() {
            h.update(data);
        }
        for (offset, r) in section.relocations() {
            h.update(offset.to_le_bytes());
            h.update(format!("{:?}", r.flags()).as_bytes());
            h.update(target_name(r.target()).as_bytes());
            h.update(r.addend().to_le_bytes());
        }
    }
    Ok(hex::encode(h.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Compiles `src` with the host's gcc (the kernel's compiler here) and
    /// digests the object.
    fn compile(src: &str, dir: &Path, name: &str) -> String {
        let c = dir.join(format!("{name}.c"));
        let o = dir.join(format!("{name}.o"));
        std::fs::write(&c, src).unwrap();
        let status = std::process::Command::new("gcc")
            .args(["-O2", "-g", "-c"])
            .arg(&c)
            .arg("-o")
            .arg(&o)
            .status()
            .expect("gcc runs (ci/setup.sh --kernel-build installs it)");
        assert!(status.success());
        code_digest(&o).unwrap()
    }

    #[test]
    fn same_code_same_digest_other_code_other_digest() {
        let dir = tempfile::tempdir().unwrap();
        let base =
            "int nr_a, nr_b;\nint gate(void)\n{\n\tif (!nr_a)\n\t\treturn 0;\n\treturn 1;\n}\n";
        // Lines moved and a comment added: the same code (the DWARF line
        // table differs, and is not loaded).
        let moved = "int nr_a, nr_b;\n\n/* a comment */\nint gate(void)\n{\n\tif (!nr_a) return 0;\n\n\treturn 1;\n}\n";
        // An equivalent rewrite the compiler folds: `!x` and `x == 0`.
        let folded =
            "int nr_a, nr_b;\nint gate(void)\n{\n\tif (nr_a == 0)\n\t\treturn 0;\n\treturn 1;\n}\n";
        // The other counter: other code (a relocation to another symbol).
        let other =
            "int nr_a, nr_b;\nint gate(void)\n{\n\tif (!nr_b)\n\t\treturn 0;\n\treturn 1;\n}\n";
        let d = compile(base, dir.path(), "base");
        assert_eq!(d, compile(moved, dir.path(), "moved"));
        assert_eq!(d, compile(folded, dir.path(), "folded"));
        assert_ne!(d, compile(other, dir.path(), "other"));
    }

    #[test]
    fn not_an_object_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.o");
        std::fs::write(&p, b"not elf").unwrap();
        assert!(matches!(code_digest(&p), Err(ObjectError::Parse { .. })));
    }
}
