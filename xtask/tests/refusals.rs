//! Inputs `vm-test` refuses before any VM starts, each with its message
//! and exit status 2 (issue 28): no network, no kernel cache needed.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

fn xtask(args: &[&str]) -> (i32, String) {
    kloop_test_support::run_plain(env!("CARGO_BIN_EXE_xtask"), &root(), args)
}

/// A file that is neither a bzImage nor a vmlinux with a PVH entry used to
/// start a trial that could only end INFRA; now it is refused up front,
/// given as a `--kernel` path or as `--kernel-image`.
#[test]
fn a_file_that_is_not_a_kernel_is_refused_before_booting() {
    let dir = tempfile::tempdir().unwrap();
    let text = dir.path().join("vmlinuz-not");
    std::fs::write(&text, "this is a text file, not a kernel\n".repeat(100)).unwrap();
    let elf = dir.path().join("vmlinux-no-pvh");
    // An ELF64 header with no program headers: an ELF, but not bootable.
    let mut e = vec![0u8; 64];
    e[..7].copy_from_slice(b"\x7fELF\x02\x01\x01");
    e[0x34..0x36].copy_from_slice(&64u16.to_le_bytes());
    std::fs::write(&elf, &e).unwrap();
    for (file, elf_why) in [(&text, "ELF header"), (&elf, "no PVH entry note")] {
        let f = file.to_str().unwrap();
        for args in [
            vec!["vm-test", "--kernel", f, "--scenario", "basic"],
            vec!["vm-test", "--kernel-image", f, "--scenario", "basic"],
        ] {
            let (code, out) = xtask(&args);
            assert_eq!(code, 2, "{out}");
            assert!(
                out.contains(&format!("{f} is not a kernel QEMU can boot: not a bzImage (no Linux boot-protocol header")),
                "{out}"
            );
            assert!(out.contains(elf_why), "{out}");
            assert!(
                !out.contains("running 1 trial"),
                "no trial may start: {out}"
            );
        }
    }
}
