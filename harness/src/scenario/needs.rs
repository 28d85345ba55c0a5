//! What a scenario needs from a kernel's build configuration, and the
//! preflight that skips a trial before boot when its kernel's `.config`
//! says a need is absent.
//!
//! Each need is read from the kernel source, not from one run: the file
//! that implements the feature is only built with the option (e.g.
//! `kernel/futex/` with `CONFIG_FUTEX`, `kernel/trace/trace_syscalls.c`
//! with `CONFIG_FTRACE_SYSCALLS`). The guest's probes stay the final word:
//! the preflight only skips what certainly cannot run.

use kloop_kernels::{KernelConfig, OptionState};
use kloop_protocol::{AttachTarget, Requirement, Step};

use super::Scenario;

/// One option test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Want {
    /// `=y` or `=m`.
    Enabled,
    /// `=y`: a module would not be there when it is needed.
    BuiltIn,
    /// Not set.
    Off,
}

/// An option a scenario needs, and what for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConfigNeed {
    pub option: &'static str,
    pub want: Want,
    pub why: &'static str,
}

const fn on(option: &'static str, why: &'static str) -> ConfigNeed {
    ConfigNeed {
        option,
        want: Want::Enabled,
        why,
    }
}

const fn builtin(option: &'static str, why: &'static str) -> ConfigNeed {
    ConfigNeed {
        option,
        want: Want::BuiltIn,
        why,
    }
}

/// What the agent needs in every scenario besides its data channel's
/// ([`preflight`] puts those second): to be started from the initramfs,
/// to load BPF programs and to open perf side-band events.
pub const AGENT_NEEDS: &[ConfigNeed] = &[
    builtin(
        "CONFIG_BLK_DEV_INITRD",
        "the agent starts from an initramfs",
    ),
    builtin("CONFIG_PROC_FS", "the agent reads /proc"),
    builtin("CONFIG_SYSFS", "the agent reads /sys"),
    builtin("CONFIG_BPF_SYSCALL", "every scenario loads BPF programs"),
    builtin(
        "CONFIG_PERF_EVENTS",
        "KSYMBOL and BPF_EVENT records come from perf events",
    ),
];

/// The data channel's needs on x86-64: the second 8250 UART.
const X86_64_CHANNEL_NEEDS: &[ConfigNeed] = &[builtin(
    "CONFIG_SERIAL_8250",
    "the agent talks to the host over /dev/ttyS1",
)];

/// On arm64: the virtio console's port on virtio-mmio (built in or a
/// module the host ships).
const ARM64_CHANNEL_NEEDS: &[ConfigNeed] = &[
    ConfigNeed {
        option: "CONFIG_VIRTIO_CONSOLE",
        want: Want::Enabled,
        why: "the agent talks to the host over a virtio-serial port",
    },
    ConfigNeed {
        option: "CONFIG_VIRTIO_MMIO",
        want: Want::Enabled,
        why: "QEMU's virt board puts its virtio devices on virtio-mmio",
    },
];

/// What fentry programs need: a JIT for their trampolines, BTF for their
/// targets, and the ftrace call site the trampolines attach at.
const FENTRY_NEEDS: &[ConfigNeed] = &[
    builtin("CONFIG_BPF_JIT", "trampolines are JIT-compiled"),
    builtin("CONFIG_DEBUG_INFO_BTF", "fentry targets are found in BTF"),
    // x86 bpf_arch_text_poke() patches the 5-byte nop ftrace leaves
    // at function entry, and register_fentry() goes through
    // register_ftrace_direct() for ftrace-managed functions.
    builtin(
        "CONFIG_DYNAMIC_FTRACE_WITH_DIRECT_CALLS",
        "trampolines attach at the ftrace call site",
    ),
];

/// What failing the n-th allocation of a task needs: the fail-nth file and
/// both allocators as fault points, GFP_KERNEL allocations included.
const FAULT_INJECTION_NEEDS: &[ConfigNeed] = &[
    builtin(
        "CONFIG_FAULT_INJECTION",
        "/proc/<pid>/task/<tid>/fail-nth (fs/proc/base.c)",
    ),
    builtin(
        "CONFIG_FAILSLAB",
        "slab allocations as fault points (mm/failslab.c)",
    ),
    builtin(
        "CONFIG_FAIL_PAGE_ALLOC",
        "page allocations as fault points (mm/fail_page_alloc.c)",
    ),
    builtin(
        "CONFIG_FAULT_INJECTION_DEBUG_FS",
        "the ignore-gfp-wait knobs that make GFP_KERNEL allocations fault points",
    ),
];

/// What the `kprobe-fill` step's optimized probes need.
const OPTPROBES_NEEDS: &[ConfigNeed] = &[builtin(
    "CONFIG_OPTPROBES",
    "optimized kprobes and their kprobe_optinsn_page slots (HAVE_OPTPROBES: x86, arm, \
             powerpc; not arm64)",
)];

/// What an ftrace ops trampoline needs: x86's arch_ftrace_update_trampoline()
/// (arch/x86/kernel/ftrace.c; no other architecture kloop runs has one).
const FTRACE_TRAMPOLINES_NEEDS: &[ConfigNeed] = &[
    builtin(
        "CONFIG_X86_64",
        "ftrace ops trampolines are x86's alone (arch_ftrace_update_trampoline(), \
         arch/x86/kernel/ftrace.c; arm64 calls its ops from ftrace_caller)",
    ),
    builtin(
        "CONFIG_DYNAMIC_FTRACE",
        "an ftrace_ops of its own per tracer instance",
    ),
];

/// The options behind a requirement (all must hold).
pub fn requirement_needs(r: Requirement) -> Vec<ConfigNeed> {
    match r {
        Requirement::Btf => vec![builtin(
            "CONFIG_DEBUG_INFO_BTF",
            "/sys/kernel/btf/vmlinux (kernel/bpf/sysfs_btf.c)",
        )],
        Requirement::Jit => vec![builtin("CONFIG_BPF_JIT", "a JIT")],
        Requirement::JitOptional => vec![
            builtin("CONFIG_BPF_JIT", "a JIT to compare the interpreter with"),
            ConfigNeed {
                option: "CONFIG_BPF_JIT_ALWAYS_ON",
                want: Want::Off,
                why: "net.core.bpf_jit_enable cannot be set to 0 with it",
            },
        ],
        Requirement::Fentry => FENTRY_NEEDS.to_vec(),
        Requirement::LsmBpf => vec![
            builtin("CONFIG_BPF_LSM", "LSM programs"),
            builtin("CONFIG_SECURITYFS", "/sys/kernel/security/lsm"),
        ],
        Requirement::Kprobes => vec![
            builtin("CONFIG_KPROBES", "kprobes"),
            builtin(
                "CONFIG_KPROBE_EVENTS",
                "the kprobe PMU (kernel/trace/trace_event_perf.c)",
            ),
            builtin("CONFIG_DEBUG_FS", "/sys/kernel/debug/kprobes/list"),
        ],
        Requirement::Optprobes => OPTPROBES_NEEDS.to_vec(),
        Requirement::FtraceTrampolines => FTRACE_TRAMPOLINES_NEEDS.to_vec(),
        Requirement::FtraceInstances => vec![builtin(
            "CONFIG_FUNCTION_TRACER",
            "the function tracer in a tracefs instance",
        )],
        Requirement::Veth => vec![on("CONFIG_VETH", "veth pairs")],
        Requirement::PerfTool => vec![],
        // A kernel version, not an option: the guest's probe decides.
        Requirement::LongSymbolNames => vec![],
        // Whether the kernel takes a kprobe there: the guest's probe decides.
        Requirement::SideBandWalkKprobe => vec![],
        // The allocator is read through /proc/kcore; whether trampolines
        // come out of its packs is a kernel version: the guest decides.
        Requirement::TrampolinePacks => vec![builtin(
            "CONFIG_PROC_KCORE",
            "the JIT's books read through /proc/kcore",
        )],
        Requirement::StructOps => vec![
            builtin(
                "CONFIG_BPF_JIT",
                "a struct_ops trampoline is arch code (arch_prepare_bpf_trampoline()); \
                 before 6.x kernel/bpf/bpf_struct_ops.o and net/ipv4/bpf_tcp_ca.o are built \
                 only with it",
            ),
            builtin(
                "CONFIG_INET",
                "tcp_congestion_ops as a struct_ops type (net/ipv4/bpf_tcp_ca.c)",
            ),
            builtin(
                "CONFIG_DEBUG_INFO_BTF",
                "the map's value and the programs' targets are vmlinux BTF types",
            ),
        ],
        // Whether the kernel names struct_ops trampolines is a source
        // matter a backport can change: the guest's probe reads BTF.
        Requirement::StructOpsKsyms => vec![],
        Requirement::TwoCpus => vec![builtin(
            "CONFIG_SMP",
            "a second CPU to read a ring from while the first writes it",
        )],
        Requirement::Threads => vec![builtin(
            "CONFIG_FUTEX",
            "the agent's threads wait on futexes (kernel/futex/)",
        )],
        Requirement::SyscallTracepoints => vec![builtin(
            "CONFIG_FTRACE_SYSCALLS",
            "syscalls/sys_enter_* tracepoints (kernel/trace/trace_syscalls.c)",
        )],
        Requirement::FaultInjection => FAULT_INJECTION_NEEDS.to_vec(),
        // bpf_snprintf itself is in every 5.13+ BPF kernel (the guest
        // probes the version); the watch is a kprobe program.
        Requirement::BpfSnprintf => vec![
            builtin("CONFIG_KPROBES", "the kprobe on perf_event_ksymbol"),
            builtin(
                "CONFIG_KPROBE_EVENTS",
                "the kprobe PMU (kernel/trace/trace_event_perf.c)",
            ),
            builtin("CONFIG_BPF_EVENTS", "kprobe BPF programs"),
        ],
    }
}

/// The config option that builds module `name` (for local kernels, which
/// must have the modules a scenario loads built in).
pub fn module_option(name: &str) -> Option<&'static str> {
    match name {
        "veth" => Some("CONFIG_VETH"),
        "virtio" => Some("CONFIG_VIRTIO"),
        "virtio_mmio" => Some("CONFIG_VIRTIO_MMIO"),
        "virtio_console" => Some("CONFIG_VIRTIO_CONSOLE"),
        _ => None,
    }
}

/// The modules an arm64 guest's agent loads before anything else: its data
/// channel is a virtio-serial port (QEMU's `virt` board has one UART, the
/// console's) on the board's virtio-mmio transports, and Debian builds both
/// drivers as modules (`CONFIG_VIRTIO_MMIO=m`, `CONFIG_VIRTIO_CONSOLE=m`).
pub fn boot_modules(arch: kloop_protocol::Arch) -> &'static [&'static str] {
    match arch {
        kloop_protocol::Arch::X86_64 => &[],
        kloop_protocol::Arch::Arm64 => &["virtio_mmio", "virtio_console"],
    }
}

/// Requirements a plan's steps imply, whether or not the scenario file
/// lists them: threads for steps that run them, syscall tracepoints for an
/// attach to one.
pub fn implied_requirements(steps: &[Step]) -> Vec<Requirement> {
    let mut out = Vec::new();
    for s in steps {
        // A spin-read's reader is a thread on a CPU of its own.
        if let Step::SpinRead { .. } = s {
            for r in [Requirement::Threads, Requirement::TwoCpus] {
                if !out.contains(&r) {
                    out.push(r);
                }
            }
            continue;
        }
        let r = match s {
            Step::Concurrent { .. }
            | Step::UnprivilegedAttach { .. }
            | Step::Storm { lookup: true, .. }
            | Step::PerfRecordStart { .. } => Some(Requirement::Threads),
            Step::Attach {
                target: AttachTarget::Tracepoint { category, .. },
                ..
            } if category == "syscalls" => Some(Requirement::SyscallTracepoints),
            Step::WatchKsymbols => Some(Requirement::BpfSnprintf),
            Step::KprobeFill { .. } => Some(Requirement::Kprobes),
            Step::StructOps { .. } => Some(Requirement::StructOps),
            _ => None,
        };
        // A kprobe-fill fills optimized probes' pages.
        let also = matches!(s, Step::KprobeFill { .. }).then_some(Requirement::Optprobes);
        for r in r.into_iter().chain(also) {
            if !out.contains(&r) {
                out.push(r);
            }
        }
    }
    out
}

/// Whether `config` meets `need`.
pub fn is_met(config: &KernelConfig, need: &ConfigNeed) -> bool {
    let state = config.state(need.option);
    match need.want {
        Want::Enabled => matches!(state, OptionState::BuiltIn | OptionState::Module),
        Want::BuiltIn => state == OptionState::BuiltIn,
        Want::Off => state == OptionState::NotSet,
    }
}

/// An option's state as a config line says it: `not set`, `=y`, `=m`,
/// `=<value>`.
pub fn state_text(state: &OptionState<'_>) -> String {
    match state {
        OptionState::NotSet => "not set".to_string(),
        OptionState::BuiltIn => "=y".to_string(),
        OptionState::Module => "=m".to_string(),
        OptionState::Value(v) => format!("={v}"),
    }
}

/// Why `config` cannot run `scenario`, or `None`. The reason is one line
/// that starts with the option: `CONFIG_FUTEX not set (…)`.
pub fn preflight(scenario: &Scenario, config: &KernelConfig) -> Option<String> {
    // An arm64 kernel's agent talks over the virtio console, not a UART;
    // the channel's needs follow the initramfs, as they always came second.
    let channel = if config.is_builtin("CONFIG_ARM64") {
        ARM64_CHANNEL_NEEDS
    } else {
        X86_64_CHANNEL_NEEDS
    };
    let mut needs: Vec<(String, ConfigNeed)> = AGENT_NEEDS[..1]
        .iter()
        .chain(channel)
        .chain(&AGENT_NEEDS[1..])
        .map(|n| ("the agent".to_string(), *n))
        .collect();
    for r in &scenario.plan.requires {
        let name = super::requirement_name(*r);
        needs.extend(
            requirement_needs(*r)
                .into_iter()
                .map(|n| (format!("requirement {name}"), n)),
        );
    }
    for (what, need) in needs {
        if !is_met(config, &need) {
            let is = match config.state(need.option) {
                OptionState::Module => "=m (a module; kloop needs it built in)".to_string(),
                state => state_text(&state),
            };
            let verb = if need.want == Want::Off {
                "must be off"
            } else {
                "needed"
            };
            return Some(format!(
                "{}{}{is} in {}: {verb} for {what}: {}",
                need.option,
                if is.starts_with('=') { "" } else { " " },
                config.source,
                need.why
            ));
        }
    }
    lsm_preflight(scenario, config)
}

/// BPF LSM programs only run when `bpf` is in the active LSM list: the
/// scenario's `lsm=` boot parameter, or else `CONFIG_LSM`.
fn lsm_preflight(scenario: &Scenario, config: &KernelConfig) -> Option<String> {
    if !scenario.plan.requires.contains(&Requirement::LsmBpf) {
        return None;
    }
    if scenario.vm.cmdline.iter().any(|w| w.starts_with("lsm=")) {
        return None;
    }
    let list = config.value("CONFIG_LSM")?;
    if list.trim_matches('"').split(',').any(|l| l == "bpf") {
        return None;
    }
    Some(format!(
        "CONFIG_LSM={list} in {} has no bpf and the scenario passes no lsm=: BPF LSM programs would never run",
        config.source
    ))
}

/// A scenario that requires `requires` and does nothing else, for tests.
#[cfg(test)]
pub(super) fn scenario_requiring(requires: Vec<Requirement>) -> Scenario {
    let mut s = Scenario::parse(
        "t",
        std::path::Path::new("/nonexistent"),
        "description = \"t\"\n[[steps]]\nop = \"drain\"\n",
    )
    .expect("a one-step scenario parses");
    s.plan.requires = requires;
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scenario(requires: Vec<Requirement>) -> Scenario {
        scenario_requiring(requires)
    }

    const GOOD: &str = "CONFIG_BLK_DEV_INITRD=y\nCONFIG_SERIAL_8250=y\nCONFIG_PROC_FS=y\nCONFIG_SYSFS=y\nCONFIG_BPF_SYSCALL=y\nCONFIG_PERF_EVENTS=y\nCONFIG_FUTEX=y\nCONFIG_BPF_JIT=y\n";

    #[test]
    fn a_missing_option_is_named_with_its_source() {
        let c = KernelConfig::parse(GOOD, "test .config");
        assert_eq!(preflight(&scenario(vec![Requirement::Threads]), &c), None);
        let no_futex = KernelConfig::parse(&GOOD.replace("CONFIG_FUTEX=y\n", ""), "test .config");
        let why = preflight(&scenario(vec![Requirement::Threads]), &no_futex).unwrap();
        assert!(
            why.starts_with("CONFIG_FUTEX not set in test .config"),
            "{why}"
        );
        let why = preflight(&scenario(vec![Requirement::SyscallTracepoints]), &c).unwrap();
        assert!(why.starts_with("CONFIG_FTRACE_SYSCALLS"), "{why}");
        // A Debian cloud kernel: no fault injection at all.
        let why = preflight(&scenario(vec![Requirement::FaultInjection]), &c).unwrap();
        assert!(
            why.starts_with("CONFIG_FAULT_INJECTION not set in test .config"),
            "{why}"
        );
    }

    #[test]
    fn the_ksymbol_watch_and_kprobe_fill_imply_their_probes() {
        let steps = vec![
            Step::WatchKsymbols,
            Step::KprobeFill {
                label: "p".into(),
                link: "l".into(),
                prefix: "__x64_sys_".into(),
                optinsn_pages: 2,
                max_probes: 10,
            },
        ];
        assert_eq!(
            implied_requirements(&steps),
            vec![
                Requirement::BpfSnprintf,
                Requirement::Kprobes,
                Requirement::Optprobes
            ]
        );
        let c = KernelConfig::parse(GOOD, "c");
        let why = preflight(&scenario(vec![Requirement::BpfSnprintf]), &c).unwrap();
        assert!(why.starts_with("CONFIG_KPROBES"), "{why}");
    }

    #[test]
    fn jit_always_on_rules_out_the_interpreter() {
        let c = KernelConfig::parse(&format!("{GOOD}CONFIG_BPF_JIT_ALWAYS_ON=y\n"), "c");
        let why = preflight(&scenario(vec![Requirement::JitOptional]), &c).unwrap();
        assert!(
            why.starts_with("CONFIG_BPF_JIT_ALWAYS_ON=y in c: must be off"),
            "{why}"
        );
    }

    #[test]
    fn a_module_is_not_built_in() {
        let c = KernelConfig::parse(&GOOD.replace("SERIAL_8250=y", "SERIAL_8250=m"), "c");
        let why = preflight(&scenario(vec![]), &c).unwrap();
        assert!(why.contains("CONFIG_SERIAL_8250=m"), "{why}");
        // veth may be a module: pins ship it from their package.
        let c = KernelConfig::parse(&format!("{GOOD}CONFIG_VETH=m\n"), "c");
        assert_eq!(preflight(&scenario(vec![Requirement::Veth]), &c), None);
    }

    #[test]
    fn steps_imply_threads_and_syscall_tracepoints() {
        let s = Scenario::parse(
            "t",
            std::path::Path::new("/nonexistent"),
            "description = \"t\"\n[[steps]]\nop = \"concurrent\"\nfixture = \"basic\"\nprogram = \"p\"\ncycles = 1\n\n[[steps]]\nop = \"attach\"\nlabel = \"x\"\nlink = \"l\"\ntarget = { kind = \"tracepoint\", category = \"syscalls\", name = \"sys_enter_nanosleep\" }\n",
        );
        let s = match s {
            Ok(s) => s,
            Err(e) => panic!("{e}"),
        };
        assert!(s.plan.requires.contains(&Requirement::Threads));
        assert!(s.plan.requires.contains(&Requirement::SyscallTracepoints));
    }
}
