//! Inputs `vm-test` refuses before any VM starts, each with its message
//! and exit status 2 (issue 28): no network, no kernel cache needed.

use kloop_test_support::workspace_root;

fn xtask(args: &[&str]) -> (i32, String) {
    kloop_test_support::run_plain(env!("CARGO_BIN_EXE_xtask"), &workspace_root(), args)
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

/// A patch file that cannot be one (empty, binary, not a unified diff) is
/// a usage error before anything is fetched or built, exit 2: it used to
/// build the baseline first and end as BUILD FAILED (exit 3) as if the
/// kernel had not built.
#[test]
fn a_file_that_is_not_a_patch_is_refused_before_building() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&str, &[u8], &str); 4] = [
        ("empty.patch", b"\n \n", "it is empty"),
        (
            "nul.patch",
            b"--- a/x\n+++ b/x\n\0\0",
            "it is binary (NUL bytes)",
        ),
        (
            "latin1.patch",
            b"\xff\xfe caf\xe9",
            "it is binary (not UTF-8 text)",
        ),
        (
            "prose.patch",
            b"Please change the kernel.\n",
            "it is not a unified diff",
        ),
    ];
    for (name, bytes, why) in cases {
        let p = dir.path().join(name);
        std::fs::write(&p, bytes).unwrap();
        let p = p.to_str().unwrap();
        for args in [
            vec!["validate", "--source", "linux-source-6.12", "--patch", p],
            vec![
                "kernels",
                "build",
                "--source",
                "linux-source-6.12",
                "--patch",
                p,
            ],
        ] {
            let (code, out) = xtask(&args);
            assert_eq!(code, 2, "{out}");
            assert!(
                out.contains(&format!("error: {p} is not a patch: {why}")),
                "{out}"
            );
            assert!(!out.contains("BUILD FAILED"), "{out}");
        }
    }
}

/// Names kloop does not know are listed with the ones it does.
#[test]
fn unknown_names_list_the_known_ones() {
    let (code, out) = xtask(&["vm-test", "--scenario", "no-such-scenario"]);
    assert_eq!(code, 2, "{out}");
    assert!(
        out.contains("unknown scenario `no-such-scenario`; known scenarios: alloc-failures, "),
        "{out}"
    );
    let (code, out) = xtask(&["vm-test", "--kernel", "9.9"]);
    assert_eq!(code, 2, "{out}");
    assert!(
        out.contains(
            "`9.9` is neither a kernel pin (5.10, 6.1, 6.12, 7.2, 7.3, arm64/5.10, arm64/6.1, \
             arm64/6.12, arm64/7.2, arm64/7.3)"
        ),
        "{out}"
    );
    let (code, out) = xtask(&["report-bug", "no-such-bug"]);
    assert_eq!(code, 2, "{out}");
    assert!(
        out.contains(
            "`no-such-bug` is no ledger entry; the ledger's ids: interpreted-prog-ksymbol-register"
        ),
        "{out}"
    );
}

/// `clean --saved-vms` / `--kernels` leave the cache alone while another
/// kloop process uses it (every trial-running command registers), naming
/// it; once it is gone they clean.
#[test]
fn clean_leaves_a_cache_in_use_alone() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path();
    std::fs::create_dir_all(cache.join("saved-vms/0123456789abcdef")).unwrap();
    let user = kloop_kernels::lock::register_user(cache).unwrap();
    let clean = || {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_xtask"))
            .args(["clean", "--keep", "1000", "--saved-vms"])
            .current_dir(workspace_root())
            .env("KLOOP_CACHE_DIR", cache)
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.code().unwrap_or(-1), text)
    };
    let (code, out) = clean();
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(&format!(
            "kloop: not removing saved-vms from {}: in use by pid {} (",
            cache.display(),
            std::process::id()
        )),
        "{out}"
    );
    assert!(cache.join("saved-vms/0123456789abcdef").is_dir());
    drop(user);
    let (code, out) = clean();
    assert_eq!(code, 0, "{out}");
    assert!(!cache.join("saved-vms").exists(), "{out}");
}

/// A `--source` that is not a kernel tree, and a config fragment with a
/// line that sets no option, are refused before anything is configured or
/// built, exit 2, naming the file (and line).
#[test]
fn a_source_or_fragment_that_cannot_be_one_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("README"), "not a kernel\n").unwrap();
    let tree = dir.path().display().to_string();
    for cmd in [
        vec!["kernels", "build", "--source", tree.as_str()],
        vec!["validate", "--source", tree.as_str(), "--scenario", "basic"],
    ] {
        let (code, out) = xtask(&cmd);
        assert_eq!(code, 2, "{cmd:?}: {out}");
        assert!(
            out.contains(&format!(
                "{tree} is not a kernel source tree (no Makefile and Kconfig at its top)"
            )),
            "{cmd:?}: {out}"
        );
    }
    let fragment = dir.path().join("bad.config");
    std::fs::write(&fragment, "CONFIG_BPF=y\nnot a config line\n").unwrap();
    let (code, out) = xtask(&[
        "kernels",
        "build",
        "--source",
        "linux-source-6.12",
        "--config",
        fragment.to_str().unwrap(),
    ]);
    assert_eq!(code, 2, "{out}");
    assert!(
        out.contains(&format!(
            "{}:2: `not a config line` is neither `CONFIG_X=value` nor `# CONFIG_X is not set`",
            fragment.display()
        )),
        "{out}"
    );
    assert!(
        !out.contains("configuring"),
        "refused only after configuring began: {out}"
    );
}
