//! Positive controls of a checked kernel (`--checks memory,locking,ub`): a
//! check's silence is trusted only once the same kernel, through the same
//! path every trial takes (agent, `/dev/kmsg` and kmemleak's list, the
//! judge's `kernel_log` rules), has reported something the check must
//! report. Each control is a module kloop built with the kernel
//! (`kernels/controls/`, [`kloop_kernels::build::controls`]) whose init
//! does one wrong thing; a trial boots the kernel, inserts it, and must
//! come out FAILED with the control's rule and a report naming one of the
//! module's own functions. Anything else (ok, a report without the
//! control's frames, another verdict) means the check is blind on this
//! kernel, and the run stops before any of that check's verdicts is given.
//!
//! Each control boots alone: lockdep turns itself off for the rest of the
//! boot after its first report (`debug_locks_off()` in
//! kernel/locking/lockdep.c), a KASAN report taints the kernel with
//! `LOCKDEP_NOW_UNRELIABLE`, which turns lockdep off too (`end_report()` in
//! mm/kasan/report.c, `add_taint()` in kernel/panic.c), and KASAN reports
//! only its first bug unless `kasan_multi_shot` (`report_enabled()`).
//!
//! The results of a kernel whose controls all came out as they must are
//! kept in the kernel cache (`controls/<kernel id>/<command line key>.json`)
//! and not run again; a blind check is run again next time.

use std::path::{Path, PathBuf};

use kloop_kernels::build::Check;
use kloop_kernels::config::KernelConfig;
use serde::{Deserialize, Serialize};

use crate::judge::check::detail::KernelReport;
use crate::judge::check::Detail;
use crate::judge::kernel_log::{KASAN, KMEMLEAK, LOCKDEP, UBSAN};
use crate::run::saved_vm::MakeSavedVm;
use crate::run::trial::{KernelUnderTest, TrialEnv, TrialResult, Verdict};
use crate::scenario::Scenario;

/// One check's positive control.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Control {
    /// Its name, the rule its report must be judged as: `kasan`, `ubsan`,
    /// `lockdep`, `kmemleak`.
    pub rule: &'static str,
    /// The `--checks` check it controls.
    pub check: Check,
    /// The option that builds the checker in: a kernel with it gets this
    /// control.
    pub option: &'static str,
    /// The module (`kernels/controls/<module>.c`).
    pub module: &'static str,
    /// The module's own functions, one of which the report must name.
    pub functions: &'static [&'static str],
    /// Boot with `panic_on_warn=0`: KASAN and UBSAN call
    /// `check_panic_on_warn()` after a report (mm/kasan/report.c
    /// `end_report()`, lib/ubsan.c `ubsan_epilogue()`), and kloop's
    /// `panic_on_warn=1` would make the trial a PANIC whose judge is the
    /// console, not the kernel log this control is for.
    pub no_panic_on_warn: bool,
    /// Idle time before the module goes in, so the wrong thing happens at
    /// the end of a plan of that length. kmemleak's: it lists an object
    /// only once it is 5 s old (`MSECS_MIN_AGE`, mm/kmemleak.c), so the
    /// agent must wait that long after the plan's last step, not its first.
    pub lead_ms: u64,
}

/// Every control, in the order they run.
pub const CONTROLS: [Control; 4] = [
    Control {
        rule: KASAN,
        check: Check::Memory,
        option: "CONFIG_KASAN",
        module: "kloop_control_kasan",
        functions: &["kloop_control_kasan_read", "kloop_control_kasan_init"],
        no_panic_on_warn: true,
        lead_ms: 0,
    },
    Control {
        rule: KMEMLEAK,
        check: Check::Memory,
        option: "CONFIG_DEBUG_KMEMLEAK",
        module: "kloop_control_kmemleak",
        functions: &["kloop_control_kmemleak_leak", "kloop_control_kmemleak_init"],
        no_panic_on_warn: false,
        lead_ms: 1000,
    },
    Control {
        rule: LOCKDEP,
        check: Check::Locking,
        option: "CONFIG_PROVE_LOCKING",
        module: "kloop_control_lockdep",
        functions: &[
            "kloop_control_lockdep_b_then_a",
            "kloop_control_lockdep_a_then_b",
            "kloop_control_lockdep_init",
        ],
        no_panic_on_warn: false,
        lead_ms: 0,
    },
    Control {
        rule: UBSAN,
        check: Check::Ub,
        option: "CONFIG_UBSAN_BOUNDS",
        module: "kloop_control_ubsan",
        functions: &["kloop_control_ubsan_index", "kloop_control_ubsan_init"],
        no_panic_on_warn: true,
        lead_ms: 0,
    },
];

impl Control {
    /// The trial's scenario name: `control-kasan`.
    pub fn name(&self) -> String {
        format!("control-{}", self.rule)
    }

    /// The controls a kernel with `config` gets: one per checker built in.
    pub fn for_config(config: &KernelConfig) -> Vec<Control> {
        CONTROLS
            .into_iter()
            .filter(|c| config.is_builtin(c.option))
            .collect()
    }

    /// The scenario that runs it: idle for `lead_ms`, then the module in.
    /// Not a file of `scenarios/`: it runs only on checked kernels, before
    /// their trials, and has no stream to keep in a snapshot.
    pub fn scenario(&self, dir: &Path) -> Scenario {
        let mut cmdline: Vec<String> = crate::scenario::DEFAULT_CMDLINE
            .iter()
            .map(|w| format!("{w:?}"))
            .collect();
        if self.no_panic_on_warn {
            // After the base command line's panic_on_warn=1: the last
            // value of a parameter wins (parse_args() sets each in turn).
            cmdline.push("\"panic_on_warn=0\"".into());
        }
        let lead = if self.lead_ms > 0 {
            format!(
                "[[steps]]\nop = \"trigger\"\nsleep_ms = {}\n\n",
                self.lead_ms
            )
        } else {
            String::new()
        };
        let text = format!(
            "description = \"The {rule} check's positive control: module {module} must be \
             reported as {rule}.\"\nmodules = [\"{module}\"]\nsnapshot = false\n\n[vm]\n\
             cmdline = [{cmdline}]\n\n{lead}[[steps]]\nop = \"modprobe\"\nname = \"{module}\"\n",
            rule = self.rule,
            module = self.module,
            cmdline = cmdline.join(", "),
        );
        Scenario::parse(&self.name(), dir, &text).expect("a control's scenario parses")
    }
}

/// What one control came to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ControlOutcome {
    /// The control's rule (`kasan`, …).
    pub control: String,
    /// The `--checks` check it controls.
    pub check: String,
    pub module: String,
    /// Its trial's verdict, as the trial line says it.
    pub verdict: String,
    /// The report that answered it, when one did.
    pub report: Option<KernelReport>,
    /// Why the check is blind, when it is.
    pub blind: Option<String>,
    /// The trial's artefacts.
    pub artefacts: PathBuf,
}

impl ControlOutcome {
    /// One line: `kasan control: FAILED (kasan: BUG: KASAN: … ← …)` or the
    /// blind sentence.
    pub fn line(&self) -> String {
        match (&self.blind, &self.report) {
            (Some(why), _) => why.clone(),
            (None, Some(r)) => format!(
                "the {} check sees on this kernel: the {} control came out {} ({}: {} ← {})",
                self.check,
                self.control,
                self.verdict,
                self.control,
                r.title,
                r.frames.join(" ← ")
            ),
            (None, None) => format!("the {} control came out {}", self.control, self.verdict),
        }
    }
}

/// Judges one control's trial: its report, or why the check is blind.
pub fn judge(
    control: &Control,
    verdict: &Verdict,
    violations: &[KernelReport],
) -> Result<KernelReport, String> {
    let names_control = |r: &KernelReport| {
        r.check == control.rule
            && control
                .functions
                .iter()
                .any(|f| r.frames.iter().any(|fr| fr == f) || r.title.contains(f))
    };
    let blind = |detail: String| {
        format!(
            "the {} check is blind on this kernel: the {} control ({}) came out {}{detail}",
            control.check.name(),
            control.rule,
            control.module,
            verdict.headline()
        )
    };
    if !matches!(verdict, Verdict::Failed(_)) {
        let why = verdict
            .message()
            .and_then(|m| m.lines().find(|l| !l.trim().is_empty()))
            .map(|l| format!(": {}", l.trim()))
            .unwrap_or_default();
        // A headline that already is the message's first line says it once.
        let why = if verdict.headline().contains(why.trim_start_matches(": ")) {
            String::new()
        } else {
            why
        };
        return Err(blind(why));
    }
    if let Some(r) = violations.iter().find(|r| names_control(r)) {
        return Ok(r.clone());
    }
    let same_rule: Vec<String> = violations
        .iter()
        .filter(|r| r.check == control.rule)
        .map(|r| format!("{} ← {}", r.title, r.frames.join(" ← ")))
        .collect();
    Err(blind(if same_rule.is_empty() {
        // What the trial did say of the rule (kmemleak not scanned, …).
        let tag = format!("[{}] ", control.rule);
        let said: Vec<&str> = verdict
            .message()
            .into_iter()
            .flat_map(str::lines)
            .filter_map(|l| l.trim().strip_prefix(tag.as_str()))
            .collect();
        format!(
            ", without a {} report (expected one naming {}){}",
            control.rule,
            control.functions.join(" or "),
            if said.is_empty() {
                String::new()
            } else {
                format!("; the trial said: {}", said.join("; "))
            }
        )
    } else {
        format!(
            ", its {} reports naming none of {}: {}",
            control.rule,
            control.functions.join(", "),
            same_rule.join("; ")
        )
    }))
}

/// The kernel reports among a trial's violations.
pub fn reports_of(result: &TrialResult) -> Vec<KernelReport> {
    result
        .violations
        .iter()
        .filter_map(|v| match &v.detail {
            Some(Detail::KernelReport(r)) => Some(r.clone()),
            _ => None,
        })
        .collect()
}

/// Why the controls stopped the run.
#[derive(Debug, thiserror::Error)]
pub enum ControlsError {
    /// One or more checks are blind: a sentence each.
    #[error("{}", .0.join("\n"))]
    Blind(Vec<String>),
    #[error("the kernel has no .config, so which checks it has is unknown: {0}")]
    NoConfig(String),
}

/// Where a kernel's passed controls are kept: one file per kernel and
/// extra command line (`--append kmemleak=off` is another answer).
fn cache_file(cache_root: &Path, kernel_id: &str, extra_cmdline: &[String]) -> PathBuf {
    use sha2::{Digest, Sha256};
    let key = hex::encode(Sha256::digest(extra_cmdline.join(" ").as_bytes()));
    cache_root
        .join("controls")
        .join(kernel_id)
        .join(format!("{}.json", &key[..16]))
}

/// The outcomes kept for `kernel_id` booted with `extra_cmdline`, when an
/// earlier run found every check of `config` seeing; `None`: run them.
pub fn kept(
    cache_root: &Path,
    kernel_id: &str,
    extra_cmdline: &[String],
    config: &KernelConfig,
) -> Option<Vec<ControlOutcome>> {
    let controls = Control::for_config(config);
    std::fs::read(cache_file(cache_root, kernel_id, extra_cmdline))
        .ok()
        .and_then(|b| serde_json::from_slice::<Vec<ControlOutcome>>(&b).ok())
        .filter(|o| {
            o.len() == controls.len()
                && o.iter().all(|c| c.blind.is_none())
                && controls
                    .iter()
                    .all(|c| o.iter().any(|k| k.control == c.rule))
        })
}

/// Runs every control `kernel`'s config calls for (each its own boot),
/// or finds them kept; `on` hears each outcome (and whether it was kept).
/// `Ok` when every check sees; `Err(Blind)` names each blind one.
pub fn run(
    env: &TrialEnv,
    kernel: &KernelUnderTest,
    controls_dir: &Path,
    on: &dyn Fn(&ControlOutcome, bool),
) -> Result<Vec<ControlOutcome>, ControlsError> {
    let config = kernel.config(env).map_err(ControlsError::NoConfig)?;
    let controls = Control::for_config(&config);
    let kernel_id = kernel.id();
    if let Some(outcomes) = kept(env.cache.root(), &kernel_id, &env.extra_cmdline, &config) {
        for o in &outcomes {
            on(o, true);
        }
        return Ok(outcomes);
    }
    let shipped: Vec<String> = match kernel {
        KernelUnderTest::Image(k) => k.modules.iter().map(|(n, _)| n.clone()).collect(),
        _ => Vec::new(),
    };
    let mut outcomes = Vec::new();
    for control in &controls {
        let outcome = if shipped.iter().any(|m| m == control.module) {
            let scenario = control.scenario(controls_dir);
            let trial = || {
                crate::run::trial::run_trial_with(env, kernel, &scenario, MakeSavedVm::NotForFew(1))
            };
            let mut result = trial();
            // A boot a loaded host starved past its deadline, or QEMU
            // failing, says nothing of the check: asked once more.
            if matches!(
                result.verdict,
                Verdict::Timeout(_) | Verdict::Infrastructure(_)
            ) {
                tracing::info!(
                    "{}: {}; running the control once more",
                    scenario.name,
                    result.verdict.headline()
                );
                result = trial();
            }
            let judged = judge(control, &result.verdict, &reports_of(&result));
            ControlOutcome {
                control: control.rule.into(),
                check: control.check.name().into(),
                module: control.module.into(),
                verdict: result.verdict.headline(),
                report: judged.as_ref().ok().cloned(),
                blind: judged.err(),
                artefacts: result.artefacts.clone(),
            }
        } else {
            ControlOutcome {
                control: control.rule.into(),
                check: control.check.name().into(),
                module: control.module.into(),
                verdict: "not run".into(),
                report: None,
                blind: Some(format!(
                    "the {} check is blind on this kernel: the {} control ({}) came out not run: \
                     the kernel was built without it (build it with `cargo xtask kernels build \
                     --checks …`, which builds kernels/controls/ with the kernel)",
                    control.check.name(),
                    control.rule,
                    control.module
                )),
                artefacts: PathBuf::new(),
            }
        };
        on(&outcome, false);
        outcomes.push(outcome);
    }
    let blind: Vec<String> = outcomes.iter().filter_map(|o| o.blind.clone()).collect();
    if !blind.is_empty() {
        return Err(ControlsError::Blind(blind));
    }
    if let Ok(bytes) = serde_json::to_vec_pretty(&outcomes) {
        // Costs only a rerun of the controls when it cannot be written.
        let file = cache_file(env.cache.root(), &kernel_id, &env.extra_cmdline);
        let _ = kloop_kernels::write_atomically(&file, &bytes);
    }
    Ok(outcomes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::trial::{Failure, FailureCause};

    fn failed() -> Verdict {
        Verdict::Failed(Failure {
            cause: FailureCause::Rules {
                rules: vec!["kasan".into()],
            },
            message: "kasan: BUG: KASAN: slab-out-of-bounds in kloop_control_kasan_read".into(),
        })
    }

    fn report(check: &str, title: &str, frames: &[&str]) -> KernelReport {
        KernelReport {
            check: check.into(),
            title: title.into(),
            frames: frames.iter().map(|f| (*f).to_string()).collect(),
        }
    }

    #[test]
    fn each_control_runs_its_module_after_its_lead_with_panic_on_warn_where_needed() {
        for c in CONTROLS {
            let s = c.scenario(Path::new("/k/controls"));
            assert_eq!(s.modules, [c.module]);
            assert!(!s.snapshot);
            let last = s.plan.steps.last().unwrap();
            assert!(
                matches!(last, kloop_protocol::Step::Modprobe { name } if name == c.module),
                "{last:?}"
            );
            assert_eq!(s.plan.steps.len(), if c.lead_ms > 0 { 2 } else { 1 });
            assert_eq!(
                s.vm.cmdline.last().map(String::as_str) == Some("panic_on_warn=0"),
                c.no_panic_on_warn,
                "{:?}",
                s.vm.cmdline
            );
        }
        // kmemleak's object is made at the end of a 1-second plan.
        let kmemleak = CONTROLS.iter().find(|c| c.rule == KMEMLEAK).unwrap();
        assert_eq!(kmemleak.lead_ms, 1000);
    }

    #[test]
    fn a_control_passes_only_failed_with_its_rule_naming_its_own_function() {
        let kasan = CONTROLS[0];
        let own = report(
            KASAN,
            "BUG: KASAN: slab-out-of-bounds in kloop_control_kasan_read [kloop_control_kasan]",
            &[
                "__asan_load1",
                "kloop_control_kasan_read",
                "kloop_control_kasan_init",
            ],
        );
        let lockdep_off = report(LOCKDEP, "lockdep off", &[]);
        assert_eq!(
            judge(&kasan, &failed(), &[lockdep_off.clone(), own.clone()]),
            Ok(own.clone())
        );

        // Passed: blind, and the sentence says which check and how.
        let blind = judge(&kasan, &Verdict::Ok, &[]).unwrap_err();
        assert_eq!(
            blind,
            "the memory check is blind on this kernel: the kasan control (kloop_control_kasan) \
             came out ok"
        );
        // Failed for another rule only.
        let blind = judge(&kasan, &failed(), &[lockdep_off]).unwrap_err();
        assert!(blind.contains("without a kasan report"), "{blind}");
        // Failed for its rule, but with no report: what the trial said of it
        // is in the sentence (kmemleak=off: its file refuses the scan).
        let kmemleak = CONTROLS[1];
        let off = Verdict::Failed(Failure {
            cause: FailureCause::Rules {
                rules: vec!["kmemleak".into()],
            },
            message: "1 invariant violation(s) (normalised stream: n):\n  [kmemleak] kmemleak is \
                      in this kernel but could not be scanned: writing \"scan\" to \
                      /sys/kernel/debug/kmemleak: Operation not permitted (os error 1)"
                .into(),
        });
        assert_eq!(
            judge(&kmemleak, &off, &[]).unwrap_err(),
            "the memory check is blind on this kernel: the kmemleak control \
             (kloop_control_kmemleak) came out FAILED, without a kmemleak report (expected one \
             naming kloop_control_kmemleak_leak or kloop_control_kmemleak_init); the trial said: \
             kmemleak is in this kernel but could not be scanned: writing \"scan\" to \
             /sys/kernel/debug/kmemleak: Operation not permitted (os error 1)"
        );
        // Its rule, but someone else's frames.
        let other = report(
            KASAN,
            "BUG: KASAN: slab-out-of-bounds in perf_event_ksymbol",
            &["perf_event_ksymbol"],
        );
        let blind = judge(&kasan, &failed(), &[other]).unwrap_err();
        assert!(
            blind.contains("naming none of kloop_control_kasan_read"),
            "{blind}"
        );
        // A panic is not the kernel log's answer.
        let blind = judge(
            &kasan,
            &Verdict::Panic("Kernel panic - not syncing: KASAN".into()),
            &[own],
        )
        .unwrap_err();
        assert!(blind.contains("came out PANIC"), "{blind}");
    }
}
