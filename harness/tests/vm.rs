//! The VM suite: one libtest-mimic trial per `<kernel pin>/<scenario>`.
//!
//! `cargo test -- 6.12` runs one kernel's trials; `cargo nextest run` runs each
//! trial in its own process. Real kernels under real QEMU: the first trial to
//! run builds the guest agent, fetches its kernel and decides the accelerator
//! (`KLOOP_ACCEL=kvm|tcg|auto`, default auto).
//!
//! Like `cargo xtask vm-test`, a run in which every trial that ran was
//! SKIPPED tested nothing and fails (exit 1) unless `KLOOP_ALLOW_SKIPPED=1`
//! says that is intended; filtered-out trials do not count.
#![allow(clippy::print_stdout, clippy::print_stderr)] // a test binary reports on the terminal

use std::sync::{Mutex, OnceLock};

use kloop::report::Summary;
use kloop::run::suite::{self, EnvOptions, Selection};
use kloop::run::trial::{KernelUnderTest, TrialEnv, TrialResult, Verdict};
use kloop::workspace::Layout;
use kloop_qemu::accel::AccelChoice;
use libtest_mimic::{Arguments, Completion, Failed, Trial};

static ENV: OnceLock<Result<TrialEnv, String>> = OnceLock::new();
static KERNELS: OnceLock<Vec<KernelUnderTest>> = OnceLock::new();
/// Every trial that ran, for the verdict on the whole run.
static RESULTS: Mutex<Vec<TrialResult>> = Mutex::new(Vec::new());

fn env(layout: &Layout) -> Result<&'static TrialEnv, String> {
    ENV.get_or_init(|| {
        let accel = std::env::var("KLOOP_ACCEL")
            .unwrap_or_else(|_| "auto".into())
            .parse::<AccelChoice>()?;
        let opts = EnvOptions {
            accel,
            ..EnvOptions::default()
        };
        let env = suite::prepare_env(layout, &opts, KERNELS.get().map_or(&[][..], |k| &k[..]))
            .map_err(|e| format!("preparing the VM environment: {e}"))?;
        eprintln!("kloop: accelerator: {}", env.accel.reason);
        for w in env
            .known_issues
            .warnings(kloop::judge::known_issues::Date::today())
        {
            eprintln!("kloop: {w}");
        }
        eprintln!("kloop: artefacts in {}", env.run_dir.display());
        Ok(env)
    })
    .as_ref()
    .map_err(Clone::clone)
}

fn main() {
    let args = Arguments::from_args();
    let layout = Layout::from_root(kloop::workspace::workspace_root());
    let planned = match suite::plan(&layout, &Selection::default()) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("kloop: cannot plan the VM trials: {e}");
            std::process::exit(2);
        }
    };
    kloop::run::signals::install();
    let _ = KERNELS.set(planned.iter().map(|t| t.kernel.clone()).collect());
    let mut trials: Vec<Trial> = planned
        .into_iter()
        .map(|t| {
            let layout = layout.clone();
            Trial::ignorable_test(t.id(), move || {
                let env = env(&layout)?;
                let r = kloop::run::trial::run_trial(env, &t.kernel, &t.scenario);
                eprintln!("{}", kloop::report::trial_line(&r));
                let outcome = match &r.verdict {
                    Verdict::Ok => Ok(Completion::Completed),
                    // Not passes and not failures: libtest's "ignored", with
                    // the reason shown next to the trial's name.
                    Verdict::Skipped(_) => Ok(Completion::ignored_with(r.verdict.headline())),
                    Verdict::Known(_) => Ok(Completion::ignored_with(format!(
                        "known bug: {}",
                        r.verdict.headline()
                    ))),
                    v => Err(Failed::from(format!(
                        "{}: {}\nartefacts: {}",
                        v.headline(),
                        v.message().unwrap_or(""),
                        r.artefacts.display()
                    ))),
                };
                RESULTS.lock().unwrap_or_else(|e| e.into_inner()).push(r);
                outcome
            })
            .with_kind("vm")
        })
        .collect();
    // The committed expected skips are what the pins' configs and releases
    // derive (the configs come with the pins' packages, which this suite
    // fetches anyway).
    let skips_layout = layout.clone();
    trials.push(
        Trial::test("expected-skips/derived", move || {
            let d = kloop::session::skips::derive(
                &skips_layout,
                &kloop_kernels::FetchOptions::default(),
            )
            .map_err(|e| format!("deriving the expected skips: {e}"))?;
            if d.matches() {
                return Ok(());
            }
            Err(format!(
                "kernels/expected-skips.toml differs from what the pins' configs and releases \
                 derive (`cargo xtask skips` shows how; `--write` rewrites it): {}\n{}",
                d.problems.join("; "),
                kloop::judge::ab::stream_diff(&d.committed.render(), &d.text()).join("\n")
            )
            .into())
        })
        .with_kind("vm"),
    );
    let conclusion = libtest_mimic::run(&args, trials);
    conclusion.exit_if_failed();
    let results = RESULTS.lock().unwrap_or_else(|e| e.into_inner());
    if nothing_ran_fails(&Summary::of(&results)) {
        eprintln!("kloop: {}", Summary::NOTHING_RAN);
        std::process::exit(1);
    }
    conclusion.exit();
}

/// Whether a run's trials all ended SKIPPED and that fails it, as it
/// fails `cargo xtask vm-test`: not when `KLOOP_ALLOW_SKIPPED=1`, and not
/// under nextest, whose processes run one trial each (a single trial's
/// skip says nothing about the run).
fn nothing_ran_fails(summary: &Summary) -> bool {
    summary.nothing_ran()
        && std::env::var_os("KLOOP_ALLOW_SKIPPED").is_none_or(|v| v != "1")
        && std::env::var_os("NEXTEST").is_none()
}
