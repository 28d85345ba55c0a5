//! The kernel's own checks as oracles: what a checked kernel (`--checks
//! memory,locking,ub`: KASAN, kmemleak, lockdep, DEBUG_ATOMIC_SLEEP,
//! UBSAN) reported while a plan's steps ran, read out of the kernel log and
//! kmemleak's list the agent sends ([`kloop_protocol::Message::KernelLog`]).
//! A leak, a use-after-free or a lock-order inversion on the paths a
//! scenario drives shows in no record, only here.
//!
//! | rule | a violation per | the kernel's own words |
//! |---|---|---|
//! | `kasan` | KASAN report | `BUG: KASAN: <kind> in <function>` (mm/kasan/report.c, `print_error_description`) |
//! | `ubsan` | UBSAN report | `UBSAN: <kind> in <file>:<line>:<col>` (lib/ubsan.c, `ubsan_prologue`) |
//! | `lockdep` | lockdep or atomic-sleep report | `WARNING: possible circular locking dependency detected` and lockdep's other headers (kernel/locking/lockdep.c), `BUG: sleeping function called from invalid context`, `BUG: scheduling while atomic` (kernel/sched/core.c) |
//! | `kmemleak` | unreferenced object | `unreferenced object 0x… (size N):` with its allocation backtrace (mm/kmemleak.c, `print_unreferenced`) |
//!
//! Each violation's message names the report without addresses, ages,
//! pids or offsets — its title and the first frames of its stack outside
//! the reporting machinery — so the same report on two kernels reads the
//! same, and an A/B tells a report the baseline also has from a new one.

use crate::check::detail::KernelReport;
use crate::check::{Detail, Gap, Unchecked, Violation};
use crate::evidence::RunEvidence;

/// Which of its own checks the kernel under test was built with, read by
/// the harness from its config (the judge reads no file). A check the
/// kernel has must leave its evidence: a log read whole, kmemleak's list,
/// lockdep's state. Without it the check's rules are [`Unchecked`], never
/// quiet.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct KernelChecks {
    /// `CONFIG_KASAN`: reports in the log.
    pub kasan: bool,
    /// `CONFIG_UBSAN`: reports in the log.
    pub ubsan: bool,
    /// `CONFIG_PROVE_LOCKING` (lockdep, `/proc/lockdep_stats`) or
    /// `CONFIG_DEBUG_ATOMIC_SLEEP`: reports in the log.
    pub locking: bool,
    /// `CONFIG_PROVE_LOCKING`: lockdep's `debug_locks` must be read.
    pub lockdep: bool,
    /// `CONFIG_DEBUG_KMEMLEAK`: its list must be scanned and read.
    pub kmemleak: bool,
}

impl KernelChecks {
    /// The checks a config with these options enabled (`y`) builds in.
    pub fn from_config(enabled: impl Fn(&str) -> bool) -> KernelChecks {
        KernelChecks {
            kasan: enabled("CONFIG_KASAN"),
            ubsan: enabled("CONFIG_UBSAN"),
            locking: enabled("CONFIG_PROVE_LOCKING") || enabled("CONFIG_DEBUG_ATOMIC_SLEEP"),
            lockdep: enabled("CONFIG_PROVE_LOCKING"),
            kmemleak: enabled("CONFIG_DEBUG_KMEMLEAK"),
        }
    }

    /// The rules whose reports come from the kernel log.
    fn log_rules(self) -> Vec<&'static str> {
        [
            (self.kasan, KASAN),
            (self.ubsan, UBSAN),
            (self.locking, LOCKDEP),
        ]
        .into_iter()
        .filter_map(|(on, r)| on.then_some(r))
        .collect()
    }

    /// How many times longer than its plain build such a kernel may take
    /// to boot and run a plan, for its deadlines: generic KASAN checks
    /// every memory access out of line (lib/Kconfig.kasan: "slowdown ~x3"
    /// for outline, more under TCG), lockdep validates every lock
    /// acquisition, kmemleak tracks every allocation and scans; UBSAN's
    /// bounds checks cost little. A KASAN 6.12 build missed the 60 s TCG
    /// boot deadline on a loaded 2-core host while its saved VM was made.
    pub fn slowdown(self) -> u32 {
        1 + 2 * u32::from(self.kasan) + u32::from(self.lockdep) + u32::from(self.kmemleak)
    }

    /// Whether the kernel has any check whose evidence is the log.
    pub fn any(self) -> bool {
        self.kasan || self.ubsan || self.locking || self.kmemleak
    }
}

/// The checks `checks` says this kernel has whose evidence did not arrive
/// whole: the log unread, overrun or cut; kmemleak not there or its list
/// cut; lockdep's state not shown. Each is [`Gap::Lost`]: the kernel was
/// built to check, and kloop did not see the check's answer.
pub fn unchecked(ev: &RunEvidence, checks: KernelChecks) -> Vec<Unchecked> {
    let mut out = Vec::new();
    if !checks.any() {
        return out;
    }
    let Some(log) = &ev.kernel_log else {
        out.push(Unchecked::new(
            RULES.join(", "),
            Gap::Lost,
            "the agent sent no kernel log (a run that stopped before its plan's end?)",
        ));
        return out;
    };
    let log_rules = checks.log_rules().join(", ");
    if !log_rules.is_empty() {
        if let Some(e) = &log.kmsg_error {
            out.push(Unchecked::new(
                &log_rules,
                Gap::Lost,
                format!("the kernel log could not be read: {e}"),
            ));
        }
        if log.overrun > 0 {
            out.push(Unchecked::new(
                &log_rules,
                Gap::Lost,
                format!(
                    "the kernel log overwrote {} record(s) before the agent read them                      (/dev/kmsg EPIPE): a report may be among them; boot with a larger                      log_buf_len=",
                    log.overrun
                ),
            ));
        }
        if log.truncated {
            out.push(Unchecked::new(
                &log_rules,
                Gap::Lost,
                format!(
                    "the kernel log passed the agent's cap of {} bytes and was cut there:                      what followed was not read (see the console for the rest)",
                    kloop_protocol::MAX_KERNEL_LOG
                ),
            ));
        }
    }
    if checks.kmemleak && log.kmemleak.is_none() && log.kmemleak_error.is_none() {
        out.push(Unchecked::new(
            KMEMLEAK,
            Gap::Lost,
            "the kernel is built with CONFIG_DEBUG_KMEMLEAK but /sys/kernel/debug/kmemleak              is not there: booted with kmemleak=off, or kmemleak turned itself off              (\"Kernel memory leak detector disabled\" on the console says why)",
        ));
    }
    if checks.kmemleak && log.kmemleak_truncated {
        out.push(Unchecked::new(
            KMEMLEAK,
            Gap::Lost,
            format!(
                "kmemleak's list passed the agent's cap of {} bytes and was cut there",
                kloop_protocol::MAX_KERNEL_LOG
            ),
        ));
    }
    if checks.lockdep && log.lockdep_on.is_none() {
        out.push(Unchecked::new(
            LOCKDEP,
            Gap::Lost,
            "the kernel is built with CONFIG_PROVE_LOCKING but /proc/lockdep_stats showed no              debug_locks: whether lockdep was on during the plan is unknown",
        ));
    }
    out
}

/// The rules this module reports (for the known-issues ledger's list).
pub const RULES: &[&str] = &[KASAN, UBSAN, LOCKDEP, KMEMLEAK];
/// A KASAN report.
pub const KASAN: &str = "kasan";
/// A UBSAN report.
pub const UBSAN: &str = "ubsan";
/// A lockdep (or atomic-context sleep) report.
pub const LOCKDEP: &str = "lockdep";
/// An object kmemleak found unreferenced.
pub const KMEMLEAK: &str = "kmemleak";

/// How many frames name a report.
const FRAMES: usize = 4;

/// Report headers in the kernel log, by rule.
const HEADERS: &[(&str, &str)] = &[
    ("BUG: KASAN: ", KASAN),
    ("UBSAN: ", UBSAN),
    (
        "WARNING: possible circular locking dependency detected",
        LOCKDEP,
    ),
    ("WARNING: possible recursive locking detected", LOCKDEP),
    ("WARNING: inconsistent lock state", LOCKDEP),
    (
        "WARNING: possible irq lock inversion dependency detected",
        LOCKDEP,
    ),
    (
        "WARNING: HARDIRQ-safe -> HARDIRQ-unsafe lock order detected",
        LOCKDEP,
    ),
    (
        "WARNING: SOFTIRQ-safe -> SOFTIRQ-unsafe lock order detected",
        LOCKDEP,
    ),
    ("WARNING: bad unlock balance detected!", LOCKDEP),
    ("WARNING: bad contention detected!", LOCKDEP),
    ("WARNING: suspicious RCU usage", LOCKDEP),
    ("WARNING: lock held when returning to user space!", LOCKDEP),
    ("WARNING: held lock freed!", LOCKDEP),
    ("WARNING: Nested lock was not taken", LOCKDEP),
    ("BUG: held lock freed!", LOCKDEP),
    (
        "BUG: sleeping function called from invalid context",
        LOCKDEP,
    ),
    ("BUG: scheduling while atomic", LOCKDEP),
    ("BUG: workqueue leaked lock or atomic", LOCKDEP),
];

/// Frames of the reporting machinery itself, which name no culprit.
const MACHINERY: &[&str] = &[
    "dump_stack",
    "dump_stack_lvl",
    "print_report",
    "print_address_description",
    "kasan_report",
    "kasan_check_range",
    "__kasan_check_read",
    "__kasan_check_write",
    "ubsan_epilogue",
    "__might_resched",
    "__might_sleep",
    "___might_sleep",
    "lockdep_rcu_suspicious",
    "print_circular_bug",
    "check_noncircular",
    "check_prev_add",
    "validate_chain",
    "__lock_acquire",
    "lock_acquire",
    "kmemleak_alloc",
    "slab_post_alloc_hook",
    "__kmem_cache_alloc_node",
    "kmem_cache_alloc",
    "kmem_cache_alloc_trace",
    "kmalloc_trace",
    "__kmalloc",
    "__kmalloc_node",
    "kmalloc_node_trace",
    "__kmalloc_node_track_caller",
    "kmemdup",
    "kstrdup",
    "__vmalloc_node_range",
    "vmalloc",
    "vzalloc",
];

/// Every report in the run's kernel log and kmemleak list, as violations.
pub fn check(ev: &RunEvidence) -> Vec<Violation> {
    let Some(log) = &ev.kernel_log else {
        return Vec::new();
    };
    let mut out: Vec<Violation> = reports_in_log(&log.kmsg)
        .into_iter()
        .chain(
            log.kmemleak
                .as_deref()
                .map(kmemleak_reports)
                .unwrap_or_default(),
        )
        .map(violation)
        .collect();
    if let Some(e) = &log.kmemleak_error {
        out.push(Violation::new(
            KMEMLEAK,
            format!("kmemleak is in this kernel but could not be scanned: {e}"),
        ));
    }
    // lockdep stops for good after its first report (debug_locks_off() in
    // kernel/locking/lockdep.c) or when its tables fill: off at the end
    // with no report of its own in the plan's log, it was off for (part
    // of) the plan, whose locking then went unchecked.
    if log.lockdep_on == Some(false) && !out.iter().any(|v| v.rule == LOCKDEP) {
        out.push(Violation::new(
            LOCKDEP,
            "lockdep is in this kernel but was off after the plan (debug_locks 0 in \
             /proc/lockdep_stats) with no report of its own in the plan's log: it turned \
             itself off earlier in the boot (a report before the first step, on the console) \
             or its tables filled, so the plan's locking was not checked",
        ));
    }
    out
}

fn violation(r: KernelReport) -> Violation {
    let frames = if r.frames.is_empty() {
        String::new()
    } else {
        format!(" ← {}", r.frames.join(" ← "))
    };
    Violation::new(rule_of(&r.check), format!("{}{frames}", r.title)).with(Detail::KernelReport(r))
}

fn rule_of(check: &str) -> &'static str {
    RULES
        .iter()
        .copied()
        .find(|r| *r == check)
        .unwrap_or(LOCKDEP)
}

/// The function a stack line names (` func+0x1a/0x40 [mod]`, `? func+…`,
/// `[<ffffffff81000000>] func+0x1a/0x40`), if it is one.
fn frame(line: &str) -> Option<&str> {
    let mut l = line.trim_start();
    if let Some(rest) = l.strip_prefix("[<") {
        l = rest.split_once(">] ")?.1;
    }
    if l.starts_with("? ") {
        return None; // unreliable, left on the stack
    }
    let (name, off) = l.split_once('+')?;
    let ok = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
        && off.starts_with("0x");
    // Compiler clones (`func.cold`, `func.isra.0`) are the function.
    ok.then(|| name.split('.').next().unwrap_or(name))
}

/// Drops what changes from run to run or patch to patch: ` at addr
/// ffff…`, `+0x…/0x…`, a source position's `:line:col`.
fn stable_title(line: &str) -> String {
    line.split_whitespace()
        .map(|w| match w.split_once("+0x") {
            Some((f, _)) => f,
            None => match w.find(".c:").or_else(|| w.find(".h:")) {
                Some(i) => &w[..i + 2],
                None => w,
            },
        })
        .take_while(|w| *w != "at" && !w.starts_with("0x") && !w.starts_with("ffff"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The reports in the log's messages: from a header to the next header, a
/// `====` rule after its first lines, or 80 lines.
fn reports_in_log(kmsg: &[String]) -> Vec<KernelReport> {
    let mut out = Vec::new();
    let lines: Vec<&str> = kmsg.iter().flat_map(|m| m.lines()).collect();
    let mut i = 0;
    while i < lines.len() {
        let Some((_, check)) = HEADERS.iter().find(|(h, _)| lines[i].starts_with(h)) else {
            i += 1;
            continue;
        };
        let title = stable_title(lines[i]);
        let mut frames = Vec::new();
        let mut j = i + 1;
        while j < lines.len() && j < i + 80 {
            let l = lines[j];
            if HEADERS.iter().any(|(h, _)| l.starts_with(h)) || l.starts_with("=====") {
                break;
            }
            if let Some(f) = frame(l) {
                if frames.len() < FRAMES && !MACHINERY.contains(&f) {
                    frames.push(f.to_string());
                }
            }
            j += 1;
        }
        out.push(KernelReport {
            check: check.to_string(),
            title,
            frames,
        });
        i = j.max(i + 1);
    }
    out
}

/// kmemleak's list: a block per `unreferenced object 0x… (size N):`.
fn kmemleak_reports(text: &str) -> Vec<KernelReport> {
    let mut out: Vec<KernelReport> = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("unreferenced object ") {
            let size = rest
                .split_once("(size ")
                .and_then(|(_, s)| s.split_once(')'))
                .map(|(n, _)| n.to_string())
                .unwrap_or_else(|| "?".into());
            out.push(KernelReport {
                check: KMEMLEAK.into(),
                title: format!("unreferenced object (size {size})"),
                frames: Vec::new(),
            });
            continue;
        }
        let Some(r) = out.last_mut() else { continue };
        if let Some(f) = frame(line) {
            if r.frames.len() < FRAMES && !MACHINERY.contains(&f) {
                r.frames.push(f.to_string());
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_and_titles_drop_what_changes() {
        assert_eq!(
            frame(" perf_event_ksymbol+0x1a5/0x2c0"),
            Some("perf_event_ksymbol")
        );
        assert_eq!(
            frame("    [<ffffffff8120f3b2>] bpf_prog_load+0x4e2/0xb40"),
            Some("bpf_prog_load")
        );
        assert_eq!(frame(" ? perf_event_ksymbol+0x1a5/0x2c0"), None);
        assert_eq!(frame(" kfree.cold+0x1/0x2"), Some("kfree"));
        assert_eq!(frame("CPU: 0 PID: 1 Comm: kloop-guest"), None);
        assert_eq!(frame(" <TASK>"), None);
        assert_eq!(
            stable_title("BUG: KASAN: slab-use-after-free in perf_event_ksymbol+0x1a5/0x2c0"),
            "BUG: KASAN: slab-use-after-free in perf_event_ksymbol"
        );
    }

    #[test]
    fn log_reports_are_cut_at_the_next_header_or_rule() {
        let kmsg: Vec<String> = [
            "bpf: something harmless",
            "==================================================================",
            "BUG: KASAN: slab-out-of-bounds in perf_event_ksymbol+0x1a5/0x2c0",
            "Read of size 8 at addr ffff888003c4c440 by task kloop-guest/1",
            "Call Trace:",
            " <TASK>",
            " dump_stack_lvl+0x45/0x5d",
            " print_report+0x17d/0x4a0",
            " kasan_report+0xb1/0xe0",
            " perf_event_ksymbol+0x1a5/0x2c0",
            " ? perf_event_bpf_event+0x10/0x20",
            " bpf_prog_kallsyms_add+0x1b0/0x210",
            " bpf_prog_load+0x9e2/0xc40",
            " __sys_bpf+0x11e/0x2c0",
            " __x64_sys_bpf+0x1a/0x30",
            "==================================================================",
            "WARNING: possible circular locking dependency detected",
            "6.1.176 #1 Not tainted",
            "stack backtrace:",
            " dump_stack_lvl+0x45/0x5d",
            " check_noncircular+0x1/0x2",
            " perf_event_ksymbol+0x1a5/0x2c0",
            "BUG: sleeping function called from invalid context at mm/slab.h:723",
        ]
        .map(String::from)
        .to_vec();
        let r = reports_in_log(&kmsg);
        assert_eq!(r.len(), 3, "{r:#?}");
        assert_eq!(r[0].check, KASAN);
        assert_eq!(
            r[0].title,
            "BUG: KASAN: slab-out-of-bounds in perf_event_ksymbol"
        );
        assert_eq!(
            r[0].frames,
            [
                "perf_event_ksymbol",
                "bpf_prog_kallsyms_add",
                "bpf_prog_load",
                "__sys_bpf"
            ]
        );
        assert_eq!(r[1].check, LOCKDEP);
        assert_eq!(r[1].frames, ["perf_event_ksymbol"]);
        assert_eq!(r[2].check, LOCKDEP);
        assert_eq!(
            r[2].title,
            "BUG: sleeping function called from invalid context"
        );
        // A WARN_ON()'s own line is not a lockdep report (it panics the
        // guest: panic_on_warn).
        let warn = vec!["WARNING: CPU: 0 PID: 1 at kernel/x.c:1 f+0x1/0x2".to_string()];
        assert!(reports_in_log(&warn).is_empty());
    }

    #[test]
    fn kmemleak_objects_are_named_by_size_and_allocating_frames() {
        let text = "\
unreferenced object 0xffff888005a2b800 (size 64):
  comm \"kloop-guest\", pid 1, jiffies 4294670092 (age 8.164s)
  hex dump (first 32 bytes):
    62 70 66 5f 70 72 6f 67 5f 00 00 00 00 00 00 00  bpf_prog_.......
  backtrace:
    [<ffffffff8135a2b0>] __kmem_cache_alloc_node+0x1d0/0x330
    [<ffffffff812f1b2e>] kmalloc_trace+0x2e/0xb0
    [<ffffffff8120f3b2>] perf_event_ksymbol+0x72/0x2c0
    [<ffffffff8120f000>] bpf_prog_load+0x9e2/0xc40
unreferenced object 0xffff888005a2c000 (size 128):
  comm \"swapper/0\", pid 0, jiffies 4294670000 (age 9.000s)
  backtrace:
    [<ffffffff81000000>] __kmalloc+0x1/0x2
";
        let r = kmemleak_reports(text);
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].title, "unreferenced object (size 64)");
        assert_eq!(r[0].frames, ["perf_event_ksymbol", "bpf_prog_load"]);
        assert_eq!(r[1].frames, Vec::<String>::new());
        let v = violation(r[0].clone());
        assert_eq!(v.rule, KMEMLEAK);
        assert_eq!(
            v.message,
            "unreferenced object (size 64) ← perf_event_ksymbol ← bpf_prog_load"
        );
    }

    #[test]
    fn the_agents_message_becomes_violations() {
        use kloop_protocol::Message;
        let msg = Message::KernelLog {
            kmsg: vec![
                "UBSAN: array-index-out-of-bounds in kernel/events/core.c:9120:7".into(),
                "index 2 is out of range for type 'char [2]'".into(),
                " perf_event_ksymbol+0x1a5/0x2c0".into(),
            ],
            truncated: false,
            overrun: 0,
            kmsg_error: None,
            kmemleak: Some(String::new()),
            kmemleak_error: None,
            kmemleak_truncated: false,
            lockdep_on: None,
        };
        let ev = RunEvidence::from_messages(&[msg], Default::default());
        let v = check(&ev);
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!(v[0].rule, UBSAN);
        assert_eq!(
            v[0].message,
            "UBSAN: array-index-out-of-bounds in kernel/events/core.c ← perf_event_ksymbol"
        );
        // No log at all (an agent that sent none): nothing to judge.
        assert!(check(&RunEvidence::default()).is_empty());
        // kmemleak there but unusable: said, not silently passed.
        let broken = Message::KernelLog {
            kmsg: Vec::new(),
            truncated: false,
            overrun: 0,
            kmsg_error: None,
            kmemleak: None,
            kmemleak_error: Some("writing \"scan\": EBUSY".into()),
            kmemleak_truncated: false,
            lockdep_on: None,
        };
        let ev = RunEvidence::from_messages(&[broken], Default::default());
        assert_eq!(check(&ev)[0].rule, KMEMLEAK);
    }

    #[test]
    fn lockdep_off_after_the_plan_without_its_own_report_is_a_check_not_made() {
        let ev = |on: Option<bool>, kmsg: &[&str]| RunEvidence {
            kernel_log: Some(crate::evidence::KernelLog {
                kmsg: kmsg.iter().map(|l| l.to_string()).collect(),
                lockdep_on: on,
                ..Default::default()
            }),
            ..RunEvidence::default()
        };
        assert!(check(&ev(Some(true), &[])).is_empty());
        assert!(check(&ev(None, &[])).is_empty());
        let v = check(&ev(Some(false), &[]));
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].rule, LOCKDEP);
        assert!(v[0].message.contains("debug_locks 0"), "{}", v[0].message);
    }

    #[test]
    fn a_checked_kernel_without_its_evidence_is_unchecked_never_quiet() {
        let all = KernelChecks::from_config(|o| {
            matches!(
                o,
                "CONFIG_KASAN" | "CONFIG_UBSAN" | "CONFIG_PROVE_LOCKING" | "CONFIG_DEBUG_KMEMLEAK"
            )
        });
        assert!(all.kasan && all.ubsan && all.locking && all.lockdep && all.kmemleak);
        let whole = crate::evidence::KernelLog {
            kmemleak: Some(String::new()),
            lockdep_on: Some(true),
            ..Default::default()
        };
        let ev = |log: Option<crate::evidence::KernelLog>| RunEvidence {
            kernel_log: log,
            ..RunEvidence::default()
        };
        // Everything arrived: judged.
        assert!(unchecked(&ev(Some(whole.clone())), all).is_empty());
        // An unchecked kernel claims nothing, so nothing is missing.
        assert!(unchecked(&ev(None), KernelChecks::default()).is_empty());
        // No log at all from a checked kernel.
        let u = unchecked(&ev(None), all);
        assert_eq!(u.len(), 1);
        assert_eq!(u[0].gap, Gap::Lost);
        // kmemleak=off: the file is not there, and no error was met.
        let off = crate::evidence::KernelLog {
            kmemleak: None,
            ..whole.clone()
        };
        let u = unchecked(&ev(Some(off)), all);
        assert_eq!(u.len(), 1, "{u:?}");
        assert_eq!(u[0].rule, KMEMLEAK);
        assert!(u[0].reason.contains("kmemleak=off"), "{u:?}");
        // The log overran, was cut, or could not be read.
        for broken in [
            crate::evidence::KernelLog {
                overrun: 3,
                ..whole.clone()
            },
            crate::evidence::KernelLog {
                truncated: true,
                ..whole.clone()
            },
            crate::evidence::KernelLog {
                kmsg_error: Some("opening /dev/kmsg: ENOENT".into()),
                ..whole.clone()
            },
        ] {
            let u = unchecked(&ev(Some(broken)), all);
            assert_eq!(u.len(), 1, "{u:?}");
            assert_eq!(u[0].rule, "kasan, ubsan, lockdep");
        }
        // lockdep built in but its state not shown.
        let u = unchecked(
            &ev(Some(crate::evidence::KernelLog {
                lockdep_on: None,
                ..whole.clone()
            })),
            all,
        );
        assert_eq!(u.len(), 1);
        assert_eq!(u[0].rule, LOCKDEP);
        // kmemleak's list cut at the cap.
        let u = unchecked(
            &ev(Some(crate::evidence::KernelLog {
                kmemleak_truncated: true,
                ..whole
            })),
            all,
        );
        assert_eq!(u.len(), 1);
        assert_eq!(u[0].rule, KMEMLEAK);
    }

    #[test]
    fn frames_that_arrive_as_records_of_their_own_name_the_report() {
        // The guest sends a record per /dev/kmsg record: a report's header,
        // then each frame as a record whose message starts with a space
        // (as devkmsg_read() gives them).
        let kmsg: Vec<String> = [
            "BUG: sleeping function called from invalid context at kernel/locking/mutex.c:580",
            "in_atomic(): 1, irqs_disabled(): 0, non_block: 0, pid: 1, name: kloop-guest",
            "Call Trace:",
            " <TASK>",
            " dump_stack_lvl+0x45/0x5d",
            " __might_resched+0x1a5/0x2c0",
            " mutex_lock+0x1a/0x40",
            " bpf_trampoline_link_prog+0x2e/0x90",
            " </TASK>",
            "BUG: sleeping function called from invalid context at kernel/locking/mutex.c:580",
            " mutex_lock+0x1a/0x40",
            " perf_event_ksymbol+0x1a/0x40",
        ]
        .map(String::from)
        .to_vec();
        let r = reports_in_log(&kmsg);
        assert_eq!(r.len(), 2, "{r:#?}");
        assert_eq!(r[0].frames, ["mutex_lock", "bpf_trampoline_link_prog"]);
        assert_eq!(r[1].frames, ["mutex_lock", "perf_event_ksymbol"]);
        // One title, two places: two reports an A/B tells apart.
        assert_ne!(
            violation(r[0].clone()).detail,
            violation(r[1].clone()).detail
        );
    }
}
