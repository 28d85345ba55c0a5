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

use kloop_path_io::{PathIo, PathIoExt};

use object::{Object, ObjectSection, ObjectSymbol, RelocationTarget, SectionFlags};
use sha2::{Digest, Sha256};

#[derive(Debug, thiserror::Error)]
pub enum ObjectError {
    #[error(transparent)]
    Io(#[from] PathIo),
    #[error("{path} is not an ELF object: {why}")]
    Parse { path: String, why: String },
}

/// sha256 (hex) over the loaded sections of the ELF object at `path`.
pub fn code_digest(path: &Path) -> Result<String, ObjectError> {
    let bytes = std::fs::read(path).at("reading", path)?;
    code_digest_of(&bytes).map_err(|e| ObjectError::Parse {
        path: path.display().to_string(),
        why: e.to_string(),
    })
}

/// [`code_digest`] of an object's bytes.
pub fn code_digest_of(bytes: &[u8]) -> Result<String, object::Error> {
    let file = object::File::parse(bytes)?;
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

/// Why a file could not be compiled alone.
#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    /// The compiler refused the text: its `error:` lines (at most 3).
    #[error("{0}")]
    Refused(String),
    /// The build directory has no record of how kbuild compiled the file
    /// (never built there, or not with this config).
    #[error("{cmd}: {why} (build the kernel in this output directory first)")]
    NoCommand { cmd: String, why: String },
    #[error(transparent)]
    Io(#[from] PathIo),
    #[error(transparent)]
    Object(#[from] ObjectError),
}

/// The code digest of `text` compiled as the tree's `file` (for example
/// `kernel/events/core.c`), exactly as kbuild compiled that file in the
/// build directory `out` (its `.core.o.cmd`), but from a copy under `work`
/// into an object under `work`: the tree and the build directory are only
/// read, so two compiles run at once and a build in `out` is untouched.
///
/// The copy's path is mapped back to the file's own in `__FILE__`
/// (`-fmacro-prefix-map`), so the strings WARN_ON puts in loaded sections
/// are those of a real build; objtool, which kbuild runs after the
/// compiler, is left out (it rewrites both objects alike). Through ccache
/// when installed: the copy's path is `work/<digest of the text>/`, the
/// same in every run (ccache hashes the command line, paths included), so
/// a second run of the same mutants with the same `work` compiles nothing;
/// an `flock` beside it keeps two processes from sharing one copy.
pub fn compile_alone(
    out: &Path,
    file: &str,
    text: &str,
    work: &Path,
) -> Result<String, CompileError> {
    let (dir, name) = file.rsplit_once('/').unwrap_or(("", file));
    let stem = name.strip_suffix(".c").unwrap_or(name);
    let SavedCommand {
        mut words,
        source_at,
        output_at,
    } = saved_command(out, file, dir, stem)?;

    let key = hex::encode(&Sha256::digest(format!("{file}\0{text}"))[..8]);
    let copy_dir = work.join(&key);
    std::fs::create_dir_all(work).doing(format!("creating {}", work.display()))?;
    let lock_path = work.join(format!("{key}.lock"));
    let lock =
        std::fs::File::create(&lock_path).doing(format!("creating {}", lock_path.display()))?;
    {
        use std::os::fd::AsRawFd;
        // SAFETY: a valid fd owned by `lock`, held until this returns. A
        // blocking lock: the other process compiles the same text, briefly.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(PathIo::doing(
                format!("locking {}", lock_path.display()),
                std::io::Error::last_os_error(),
            )
            .into());
        }
    }
    std::fs::create_dir_all(&copy_dir).doing(format!("creating {}", copy_dir.display()))?;
    let copy = copy_dir.join(name);
    std::fs::write(&copy, text).doing(format!("writing {}", copy.display()))?;
    let obj = copy_dir.join(format!("{stem}.o"));
    words[source_at] = copy.display().to_string();
    words[output_at + 1] = obj.display().to_string();
    // kbuild's dependency file would land beside the real object.
    words.retain(|w| !w.starts_with("-Wp,-MMD,") && !w.starts_with("-Wp,-MD,"));
    let map_to = if dir.is_empty() {
        String::new()
    } else {
        format!("{dir}/")
    };
    // After the compiler's name (`gcc`, or `ccache gcc` when kbuild ran
    // through ccache): before its first option.
    let first_option = words.iter().position(|w| w.starts_with('-')).unwrap_or(1);
    words.insert(
        first_option,
        format!("-fmacro-prefix-map={}/={map_to}", copy_dir.display()),
    );
    let mut shell = words.join(" ");
    let through_ccache = words[..first_option].iter().any(|w| w.ends_with("ccache"));
    if let (false, Some(cc)) = (through_ccache, super::which("ccache")) {
        shell = format!("{} {shell}", cc.display());
    }
    let result = std::process::Command::new("sh")
        .arg("-c")
        .arg(&shell)
        .current_dir(out)
        .env("LC_ALL", "C")
        .env("KBUILD_BUILD_TIMESTAMP", "kloop")
        .env("CCACHE_NOHASHDIR", "1")
        .stdin(std::process::Stdio::null())
        .output()
        .doing("running the compiler")
        .map_err(CompileError::from);
    let outcome = result.and_then(|o| {
        if o.status.success() {
            Ok(code_digest(&obj)?)
        } else {
            Err(refusal(&o, &copy, file))
        }
    });
    let _ = std::fs::remove_dir_all(&copy_dir);
    // The lock file stays: removing it could let a third process lock a new
    // file while a second still waits on this one.
    drop(lock);
    outcome
}

/// The compiler's command kbuild saved for one object, split in words, with
/// where the source and the `-o` are.
struct SavedCommand {
    words: Vec<String>,
    source_at: usize,
    output_at: usize,
}

/// Reads the command kbuild compiled `file` (`dir/stem.c`) with from its
/// `.stem.o.cmd` in the build directory `out`.
fn saved_command(
    out: &Path,
    file: &str,
    dir: &str,
    stem: &str,
) -> Result<SavedCommand, CompileError> {
    let object = if dir.is_empty() {
        format!("{stem}.o")
    } else {
        format!("{dir}/{stem}.o")
    };
    let cmd_file = out.join(if dir.is_empty() {
        format!(".{stem}.o.cmd")
    } else {
        format!("{dir}/.{stem}.o.cmd")
    });
    let no_command = |why: &str| CompileError::NoCommand {
        cmd: cmd_file.display().to_string(),
        why: why.to_string(),
    };
    let saved = std::fs::read_to_string(&cmd_file).map_err(|e| no_command(&e.to_string()))?;
    let line = saved.lines().next().unwrap_or("");
    let command = line
        .split_once(" := ")
        .map(|(_, c)| c)
        .ok_or_else(|| no_command("no savedcmd line"))?;
    // The compiler's part, before kbuild's `; objtool …`.
    let compiler = command.split(" ; ").next().unwrap_or(command).trim();
    let words: Vec<String> = compiler.split_whitespace().map(str::to_string).collect();
    let source_at = words
        .iter()
        .rposition(|w| w.ends_with(&format!("/{file}")) || w == file)
        .ok_or_else(|| no_command("the command does not name the source"))?;
    let output_at = words
        .iter()
        .position(|w| w == "-o")
        .filter(|&i| words.get(i + 1) == Some(&object))
        .ok_or_else(|| no_command("the command does not name the object"))?;
    Ok(SavedCommand {
        words,
        source_at,
        output_at,
    })
}

/// A failed compile's refusal: its first errors, with the copy's path
/// named as the file's own, else its exit status.
fn refusal(o: &std::process::Output, copy: &Path, file: &str) -> CompileError {
    let stderr = String::from_utf8_lossy(&o.stderr);
    let copy_path = copy.display().to_string();
    let errors: Vec<String> = stderr
        .lines()
        .filter(|l| l.contains("error:"))
        .take(3)
        .map(|l| l.replace(&copy_path, file))
        .collect();
    CompileError::Refused(if errors.is_empty() {
        format!("the compiler failed ({})", o.status)
    } else {
        errors.join(" / ")
    })
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

    /// A tree and a build directory laid out as kbuild leaves them: the
    /// object's `.cmd` names the source by its path in the tree, maps the
    /// tree's prefix out of `__FILE__` and ends with kbuild's objtool.
    fn kbuild_like(src: &str) -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
        let root = tempfile::tempdir().unwrap();
        let tree = root.path().join("tree");
        let out = root.path().join("out");
        std::fs::create_dir_all(tree.join("kernel/events")).unwrap();
        std::fs::create_dir_all(out.join("kernel/events")).unwrap();
        std::fs::write(tree.join("kernel/events/core.c"), src).unwrap();
        std::fs::write(
            out.join("kernel/events/.core.o.cmd"),
            format!(
                "savedcmd_kernel/events/core.o := gcc -Wp,-MMD,kernel/events/.core.o.d -O2 \
                 -fmacro-prefix-map={}/= -c -o kernel/events/core.o {}   ; ./tools/objtool/objtool --uaccess kernel/events/core.o\n\nsource_kernel/events/core.o := x\n",
                tree.display(),
                tree.join("kernel/events/core.c").display()
            ),
        )
        .unwrap();
        (root, tree, out)
    }

    #[test]
    fn a_file_compiled_alone_is_the_code_kbuild_compiled() {
        // `__FILE__` reaches a loaded section (as WARN_ON's bug table
        // does): the copy's path must be mapped back to the file's.
        let src = "const char *where(void)\n{\n\treturn __FILE__;\n}\n";
        let (root, tree, out) = kbuild_like(src);
        let status = std::process::Command::new("gcc")
            .arg(format!("-fmacro-prefix-map={}/=", tree.display()))
            .args(["-O2", "-c", "-o", "kernel/events/core.o"])
            .arg(tree.join("kernel/events/core.c"))
            .current_dir(&out)
            .status()
            .expect("gcc runs");
        assert!(status.success());
        let kbuild = code_digest(&out.join("kernel/events/core.o")).unwrap();
        let work = root.path().join("work");
        let alone = compile_alone(&out, "kernel/events/core.c", src, &work).unwrap();
        assert_eq!(alone, kbuild);
        // The same text with the other string: other code.
        let other = src.replace("__FILE__", "\"kernel/events/core.h\"");
        assert_ne!(
            compile_alone(&out, "kernel/events/core.c", &other, &work).unwrap(),
            kbuild
        );
        // The copies are gone (their lock files stay), the tree untouched.
        assert!(std::fs::read_dir(&work).unwrap().all(|e| e
            .unwrap()
            .path()
            .extension()
            .is_some_and(|x| x == "lock")));
        assert_eq!(
            std::fs::read_to_string(tree.join("kernel/events/core.c")).unwrap(),
            src
        );
    }

    #[test]
    fn a_refused_text_says_the_compilers_error_and_no_command_says_build_first() {
        let (root, _tree, out) = kbuild_like("int x;\n");
        let work = root.path().join("work");
        match compile_alone(&out, "kernel/events/core.c", "int x = ;\n", &work) {
            Err(CompileError::Refused(why)) => assert!(why.contains("error:"), "{why}"),
            other => panic!("refused expected, got {other:?}"),
        }
        match compile_alone(&out, "kernel/bpf/core.c", "int x;\n", &work) {
            Err(e @ CompileError::NoCommand { .. }) => {
                assert!(e
                    .to_string()
                    .contains("build the kernel in this output directory first"))
            }
            other => panic!("no command expected, got {other:?}"),
        }
    }

    #[test]
    fn not_an_object_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.o");
        std::fs::write(&p, b"not elf").unwrap();
        assert!(matches!(code_digest(&p), Err(ObjectError::Parse { .. })));
    }
}
