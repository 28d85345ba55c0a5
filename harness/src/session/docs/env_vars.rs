//! Every environment variable kloop, its tests and its scripts read: the
//! one list `cargo xtask --help` and docs/usage.md's table are written
//! from (`cargo xtask docs`). Defaults come from the constants the code
//! uses, so neither can drift from it; the docs test
//! (`xtask/src/docs_generated.rs`) fails when the source reads a `KLOOP_`
//! variable this list lacks, or this list names one nothing reads.

use crate::run::saved_vm;

/// Who reads a variable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reader {
    /// kloop itself (every command).
    Kloop,
    /// The test suites (`cargo test`) or the scripts under `ci/`.
    Tests,
}

/// One environment variable.
#[derive(Debug, Clone)]
pub struct EnvVar {
    pub name: &'static str,
    /// What it is when unset, in words; empty when unset means off.
    pub default: String,
    /// One sentence (Markdown).
    pub meaning: &'static str,
    pub reader: Reader,
}

/// Every variable: name, what it is when unset (empty: off; those the
/// code computes are filled in by [`computed_default`]), meaning, reader.
/// kloop's first, each group in the order a new user meets them.
const VARS: &[(&str, &str, &str, Reader)] = &[
    (
        kloop_kernels::MIRROR_ENV,
        "the host's apt sources (on Debian)",
        "Debian mirror URL, the archive root holding `dists/` and `pool/`; required on \
             other hosts, Ubuntu among them, and in the GitHub workflow (the repository \
             variable `KLOOP_MIRROR`)",
        Reader::Kloop,
    ),
    (
        kloop_kernels::KEYRING_ENV,
        kloop_kernels::DEFAULT_KEYRING,
        "archive keyring that verifies the suites' Release files when pinning",
        Reader::Kloop,
    ),
    (
        kloop_kernels::CACHE_DIR_ENV,
        "`$XDG_CACHE_HOME/kloop` or `~/.cache/kloop`",
        "kernel cache: fetched kernels, saved VMs, source builds (`build/`), guest tools",
        Reader::Kloop,
    ),
    (
        "KLOOP_QEMU",
        "`qemu-system-x86_64` on `PATH`",
        "QEMU binary for x86-64 guests",
        Reader::Kloop,
    ),
    (
        "KLOOP_QEMU_AARCH64",
        "`qemu-system-aarch64` on `PATH` (package `qemu-system-arm`)",
        "QEMU binary for arm64 guests",
        Reader::Kloop,
    ),
    (
        "KLOOP_QEMU_ARGS",
        "",
        "extra QEMU arguments, whitespace-separated, appended last (experiments)",
        Reader::Kloop,
    ),
    (
        "KLOOP_FIRMWARE",
        "qboot (`/usr/share/qemu/qboot.rom`) when installed",
        "x86-64's `-bios` image: `seabios` for QEMU's default, or a path",
        Reader::Kloop,
    ),
    (
        "KLOOP_AGENT",
        "built from `guest/`",
        "a prebuilt static x86-64 guest agent",
        Reader::Kloop,
    ),
    (
        "KLOOP_AGENT_ARM64",
        "cross-built from `guest/` with Debian's `/usr/bin/rustc`",
        "a prebuilt static aarch64 guest agent",
        Reader::Kloop,
    ),
    (
        "KLOOP_BUSYBOX",
        "`/bin/busybox` (`busybox-static`)",
        "the busybox of x86-64 guests' shell (`vm-shell`) and plain init (a reproducer's \
             stock boot); a dynamic one goes with its libraries",
        Reader::Kloop,
    ),
    (
        "KLOOP_BUSYBOX_ARM64",
        "Debian's `busybox-static:arm64`, pinned in `kernels/tools/arm64/`",
        "the static busybox of arm64 guests' shell and plain init",
        Reader::Kloop,
    ),
    (
        "KLOOP_PERF",
        "`/usr/bin/perf`, through Debian's or Ubuntu's wrapper script",
        "the perf shipped to `perf-tool` scenarios; when set, the ledger's perf bugs that \
             do not show are notes, not `FIXED?`",
        Reader::Kloop,
    ),
    (
        "KLOOP_CLANG",
        "`clang` on `PATH`",
        "the clang that compiles the BPF fixtures",
        Reader::Kloop,
    ),
    (
        "KLOOP_DEADLINE_SCALE",
        "1",
        "integer factor on every boot and session deadline (slow or loaded hosts)",
        Reader::Kloop,
    ),
    (
        kloop_qemu::CHANNEL_LIMIT_ENV,
        "",
        "most bytes one VM session may send on the data channel (`K`/`M`/`G` suffixes); \
             past it the trial is `INFRA` naming the limit",
        Reader::Kloop,
    ),
    (
        saved_vm::KEEP_ENV,
        "",
        "saved VMs of kernel pins the cache keeps, least recently used removed first",
        Reader::Kloop,
    ),
    (
        saved_vm::KEEP_OTHERS_ENV,
        "",
        "saved VMs of other kernels (validate's, bisection steps', mutants') kept apart \
             from the pins'",
        Reader::Kloop,
    ),
    (
        crate::workspace::run_dirs::KEEP_ENV,
        "",
        "run directories kept under `target/kloop/runs/`, the newest; older ones go when \
             a run starts",
        Reader::Kloop,
    ),
    (
        "KLOOP_NO_PREFLIGHT",
        "",
        "any value: skip the config preflight, so the guest's probes meet a kernel that \
             lacks a feature",
        Reader::Kloop,
    ),
    (
        "KLOOP_PROGRESS",
        "`live` when stderr is a terminal, else `plain`",
        "`live` or `plain` status output",
        Reader::Kloop,
    ),
    (
        "KLOOP_GUEST_NOT_PID1",
        "",
        "any value: let the guest agent run as an ordinary process (it refuses otherwise)",
        Reader::Kloop,
    ),
    (
        "KLOOP_SCENARIO",
        "",
        "set by `vm-shell`'s guest for `kloop-run`: the scenario whose steps it runs",
        Reader::Kloop,
    ),
    (
        "KLOOP_ACCEL",
        "`auto`",
        "the accelerator of the test suites (`auto`, `kvm`, `tcg`)",
        Reader::Tests,
    ),
    (
        "KLOOP_ALLOW_SKIPPED",
        "",
        "`1`: the matrix under `cargo test` may end with every trial that ran SKIPPED",
        Reader::Tests,
    ),
    (
        "KLOOP_ROOT_TESTS",
        "",
        "`require`: the root-only tests fail instead of skipping when not root (`.ci/run` \
             sets it)",
        Reader::Tests,
    ),
    (
        "KLOOP_KILLS",
        "30",
        "how many random kills the slow `kills` test makes",
        Reader::Tests,
    ),
    (
        "KLOOP_VALIDATE_KILLS",
        "30",
        "how many random kills the slow `validate_kills` test makes",
        Reader::Tests,
    ),
    (
        "KLOOP_KILL_SEED",
        "from the clock",
        "the seed of the kill tests' random moments, to replay a run",
        Reader::Tests,
    ),
    (
        "KLOOP_FUZZ_TARGETS",
        "`records frames analyse`",
        "the `cargo fuzz` targets `ci/fuzz.sh` runs",
        Reader::Tests,
    ),
    (
        "KLOOP_FUZZ_TOOLCHAIN",
        "`+nightly`",
        "the toolchain `ci/fuzz.sh` runs `cargo fuzz` with",
        Reader::Tests,
    ),
];

/// The defaults the code keeps as constants of its own.
fn computed_default(name: &str) -> Option<String> {
    Some(match name {
        kloop_qemu::CHANNEL_LIMIT_ENV => kloop_qemu::human_bytes(kloop_qemu::DEFAULT_CHANNEL_LIMIT),
        saved_vm::KEEP_ENV => saved_vm::DEFAULT_KEEP.to_string(),
        saved_vm::KEEP_OTHERS_ENV => saved_vm::DEFAULT_KEEP_OTHERS.to_string(),
        crate::workspace::run_dirs::KEEP_ENV => {
            format!("{} (0 keeps all)", crate::workspace::run_dirs::DEFAULT_KEEP)
        }
        _ => return None,
    })
}

/// Every variable, kloop's first.
pub fn vars() -> Vec<EnvVar> {
    VARS.iter()
        .map(|&(name, default, meaning, reader)| EnvVar {
            name,
            default: computed_default(name).unwrap_or_else(|| default.to_string()),
            meaning,
            reader,
        })
        .collect()
}
