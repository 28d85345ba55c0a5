//! Compiles the BPF fixtures in `bpf/*.bpf.c` with clang and generates
//! `$OUT_DIR/fixtures.rs`, a table of `(stem, object bytes)` embedded with
//! `include_bytes!`.

use std::env;
use std::fmt::Write as _;
use std::fs;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let manifest_dir = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets it"));
    let bpf_dir = manifest_dir.join("bpf");
    let clang = env::var_os("KLOOP_CLANG").unwrap_or_else(|| "clang".into());

    println!("cargo:rerun-if-changed={}", bpf_dir.display());
    println!("cargo:rerun-if-env-changed=KLOOP_CLANG");

    let mut sources: Vec<PathBuf> = fs::read_dir(&bpf_dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", bpf_dir.display()))
        .map(|entry| entry.expect("readable bpf/ entry").path())
        .filter(|p| p.to_str().is_some_and(|s| s.ends_with(".bpf.c")))
        .collect();
    sources.sort();

    let mut table = String::from("pub static FIXTURES: &[(&str, &[u8])] = &[\n");
    for src in &sources {
        println!("cargo:rerun-if-changed={}", src.display());
        let stem = stem(src);
        let obj = out_dir.join(format!("{stem}.bpf.o"));
        compile(&clang, src, &obj);
        writeln!(
            table,
            "    ({stem:?}, include_bytes!({:?})),",
            obj.to_str().expect("OUT_DIR is UTF-8")
        )
        .unwrap();
    }
    table.push_str("];\n");
    fs::write(out_dir.join("fixtures.rs"), table).expect("write fixtures.rs");
}

fn stem(src: &Path) -> String {
    let name = src.file_name().unwrap().to_str().unwrap();
    name.strip_suffix(".bpf.c").unwrap().to_owned()
}

/// Fixtures compiled without `-g`: their objects carry no `.BTF`, so aya
/// loads their programs without BTF func_info, and the kernel names their
/// symbols after `aux->name` (the program name; "F" for a subprogram)
/// instead of the BTF function name (bpf_prog_ksym_set_name() in
/// kernel/bpf/core.c).
const WITHOUT_BTF: &[&str] = &["nobtf"];

fn compile(clang: &std::ffi::OsStr, src: &Path, obj: &Path) {
    let debug: &[&str] = if WITHOUT_BTF.contains(&stem(src).as_str()) {
        &[]
    } else {
        &["-g"]
    };
    // The objects' DWARF and BTF name the source file and the compile
    // directory: mapped to one fixed prefix, so that every checkout builds
    // the same bytes and so the same agent, whose hash keys the saved VMs
    // (a second clone, e.g. CI's, then shares them instead of making and
    // pruning its own).
    let manifest_dir = env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let prefix_map = format!("-ffile-prefix-map={manifest_dir}=/kloop/guest");
    // The agent's target decides the kprobe context's layout (kloop_bpf.h).
    let arch = match env::var("CARGO_CFG_TARGET_ARCH").as_deref() {
        Ok("aarch64") => "-D__TARGET_ARCH_arm64",
        _ => "-D__TARGET_ARCH_x86",
    };
    let output = Command::new(clang)
        .args(["-target", "bpf"])
        .arg(arch)
        .args(debug)
        .arg(&prefix_map)
        .args(["-O2", "-Wall", "-Werror", "-c"])
        .arg(src)
        .arg("-o")
        .arg(obj)
        .output();
    match output {
        Err(e) if e.kind() == ErrorKind::NotFound => panic!(
            "kloop-guest needs clang to compile its BPF fixtures, and `{}` was not found: \
             install the Debian package `clang` (apt-get install clang) or point KLOOP_CLANG at one",
            clang.to_string_lossy()
        ),
        Err(e) => panic!("cannot run `{}`: {e}", clang.to_string_lossy()),
        Ok(out) if !out.status.success() => panic!(
            "clang failed to compile {} ({}):\n{}{}",
            src.display(),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
        Ok(_) => {}
    }
}
