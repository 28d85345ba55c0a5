//! The stand-alone reproducers stand alone on 5.10 (issue 48): the
//! header-size reproducer, as the only program of a plain busybox
//! initramfs with the kernel's default limits and no kloop agent
//! (`run::standalone::stock`), exits 1 on the 5.10 pin (the bug shown),
//! not 77. As a control, the same file without its `raise_memlock()` call
//! exits 77 there with BPF_PROG_LOAD's EPERM: 5.10 charges BPF programs to
//! RLIMIT_MEMLOCK, whose default (64 KiB) the perf rings already fill, so
//! the environment is one that tells a reproducer needing kloop's limits
//! from one that raises its own.
//!
//! Needs the kernel pin 5.10 in the kernel cache (`~/.cache/kloop`, or
//! `KLOOP_CACHE_DIR`; fetched when missing, from the Debian mirror of the
//! host's apt sources), QEMU, gcc with a static libc, and busybox-static
//! (`ci/setup.sh`). Two boots of about 5 s each under TCG once the agent
//! is built.
#![allow(clippy::print_stderr)] // a test binary reports on the terminal

use kloop::run::standalone::{self, stock, ReproOutcome};
use kloop::run::suite::{self, EnvOptions};
use kloop::workspace::Layout;
use kloop_qemu::accel::AccelChoice;

const PIN: &str = "5.10";
const ID: &str = "ksymbol-bpf-event-header-size-accumulates";

#[test]
fn the_header_size_reproducer_shows_the_bug_on_5_10_as_the_only_program_of_a_plain_init() {
    let layout = Layout::from_root(kloop::workspace::workspace_root());
    let ledger = kloop::workspace::load_ledger(&layout).expect("the ledger loads");
    let r = standalone::find(&layout.kernels(), &ledger, ID).expect("the reproducer is found");
    let catalog = kloop_kernels::Catalog::load(&layout.kernels()).expect("the catalog loads");
    let kernel = suite::resolve_kernel(&catalog, PIN, None).expect("the pin resolves");
    let accel = std::env::var("KLOOP_ACCEL")
        .unwrap_or_else(|_| "auto".into())
        .parse::<AccelChoice>()
        .expect("KLOOP_ACCEL is auto, kvm or tcg");
    let opts = EnvOptions {
        accel,
        ..EnvOptions::default()
    };
    let env = suite::prepare_env(&layout, &opts, std::slice::from_ref(&kernel))
        .expect("preparing the VM environment");
    let dir = env.run_dir.join("standalone-stock");
    std::fs::create_dir_all(&dir).unwrap();
    let text = r.single_file().expect("the single file is written");

    let file = dir.join(format!("{}.c", r.name));
    std::fs::write(&file, &text).unwrap();
    let run = stock::run(&env, &kernel, &r, &file, &dir.join("as-written")).unwrap();
    eprintln!(
        "standalone_stock: {PIN} as written: {} ({:?}), console in {}",
        run.outcome.label(),
        run.answer,
        run.dir.display()
    );
    assert_eq!(
        run.answer.memlock.as_deref(),
        Some("64"),
        "the plain init must leave 5.10's default RLIMIT_MEMLOCK (64 KiB): {:?}",
        run.answer
    );
    assert_eq!(run.answer.uid.as_deref(), Some("0"));
    assert!(
        matches!(&run.outcome, ReproOutcome::Reproduces(m) if m.contains("BUG:")),
        "on {PIN} the reproducer must exit 1 (bug shown) in the plain init, not 77: {:?}",
        run.outcome
    );

    // The control: without raising RLIMIT_MEMLOCK, 5.10 refuses the program.
    let call = "\n\traise_memlock();\n";
    assert!(text.contains(call), "repro_setup() calls raise_memlock()");
    let control = dir.join("no-raise").join(format!("{}.c", r.name));
    std::fs::create_dir_all(control.parent().unwrap()).unwrap();
    std::fs::write(&control, text.replacen(call, "\n", 1)).unwrap();
    let run = stock::run(&env, &kernel, &r, &control, &dir.join("no-raise-run")).unwrap();
    eprintln!(
        "standalone_stock: {PIN} without raise_memlock(): {} ({:?})",
        run.outcome.label(),
        run.answer
    );
    assert!(
        matches!(&run.outcome, ReproOutcome::CannotRun(m)
            if m.contains("CANNOT RUN: BPF_PROG_LOAD") && m.contains("charged to RLIMIT_MEMLOCK, 64 KiB")),
        "without raising RLIMIT_MEMLOCK the reproducer must exit 77 on {PIN} (BPF_PROG_LOAD \
         refused): {:?}",
        run.outcome
    );
}
