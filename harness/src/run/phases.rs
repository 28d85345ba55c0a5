//! Where a `vm-test` run's wall time went, as data: the phases the process
//! can measure, one after the other (setup, the guest agent's build, the
//! accelerator, the kernels, the trials, the reports), and within the
//! trials the saved VMs made. [`crate::report::phases`] draws them in the
//! run's closing lines; the run directory keeps them as [`Phases::FILE`].
//!
//! What happens before the process runs is not here: `cargo xtask` builds
//! the xtask (and with it the harness) before starting it, and that build
//! is cargo's to time (its `Finished … in` line).

use std::path::Path;
use std::time::Instant;

use serde::{Deserialize, Serialize};

/// The wall-clock split of one `vm-test` run. The sequential phases
/// (everything but [`TrialsPhase::saved_vms`]) are laps of one clock
/// ([`Laps`]), so they never sum to more than [`Phases::wall_secs`]; what
/// is left is [`Phases::other_secs`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Phases {
    /// From the start of the run (the trials planned) to its end (every
    /// report written).
    pub wall_secs: f64,
    /// The ledger, finding QEMU, checking the cache has room, the run
    /// directory, removing old run directories past their limit.
    pub setup_secs: f64,
    /// Waiting for the guest agent and its BPF fixtures to build (cargo's
    /// no-op when nothing changed): the part of the build that ran alone.
    pub agent_build_secs: f64,
    /// The part of the agent's build that ran beside the setup, the
    /// accelerator and the kernels' downloads (its own thread), hidden
    /// from the wall by them; not in [`Phases::accounted_secs`].
    #[serde(default)]
    pub agent_build_beside_secs: f64,
    /// Choosing the accelerator (the KVM probe), without fetching the
    /// kernel it probes with (in [`Phases::kernels`]).
    pub accel_secs: f64,
    pub kernels: KernelsPhase,
    pub trials: TrialsPhase,
    /// `--repeat`'s comparison, results, JUnit, summary, KCIDB and the
    /// overhead report.
    pub reports_secs: f64,
}

/// Fetching the kernels the trials need: each pin's package downloaded,
/// verified and its image extracted when missing, its config and modules,
/// each image's PVH ELF.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct KernelsPhase {
    pub secs: f64,
    /// Distinct kernels the trials run on.
    pub kernels: usize,
    /// Of those, the pins whose image was not in the cache when the run
    /// started (downloaded or extracted now).
    pub fetched: usize,
}

/// The trials, on parallel VMs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TrialsPhase {
    pub secs: f64,
    /// Runs of trials (`--repeat` runs each trial several times).
    pub runs: usize,
    /// Saved VMs this run made, during its trials (each by the first trial
    /// of its kernel × VM shape, while other VMs may run other trials).
    pub saved_vms: Vec<SavedVmMade>,
    /// Saved VMs removed past their budget while the trials ran.
    pub saved_vms_removed: usize,
}

/// One saved VM made by the run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SavedVmMade {
    pub kernel: String,
    pub key: String,
    pub pin: bool,
    /// The boot to the agent's plan request and the save.
    pub secs: f64,
}

impl TrialsPhase {
    /// The seconds the saved VMs made took, summed over the VMs (with
    /// parallel VMs they overlap one another and other trials).
    pub fn saved_vm_secs(&self) -> f64 {
        self.saved_vms.iter().map(|s| s.secs).sum::<f64>() + 0.0
    }
}

impl Phases {
    /// The file a `vm-test` leaves in its run directory.
    pub const FILE: &'static str = "phases.json";

    /// The sequential phases' seconds, summed.
    pub fn accounted_secs(&self) -> f64 {
        self.setup_secs
            + self.agent_build_secs
            + self.accel_secs
            + self.kernels.secs
            + self.trials.secs
            + self.reports_secs
    }

    /// The wall time no phase accounts for (announcing the run, planning
    /// the order, …); never negative.
    pub fn other_secs(&self) -> f64 {
        (self.wall_secs - self.accounted_secs()).max(0.0)
    }

    /// Writes [`Phases::FILE`] into `run_dir`, atomically.
    pub fn write(&self, run_dir: &Path) -> std::io::Result<()> {
        let text = serde_json::to_string_pretty(self).expect("phases serialise");
        kloop_kernels::write_atomically(&run_dir.join(Phases::FILE), text.as_bytes())
    }

    /// Reads [`Phases::FILE`] from `run_dir`.
    pub fn read(run_dir: &Path) -> std::io::Result<Phases> {
        let text = std::fs::read(run_dir.join(Phases::FILE))?;
        serde_json::from_slice(&text).map_err(std::io::Error::other)
    }
}

/// One clock read in laps: each lap is the time since the previous lap
/// (or the start), so laps never overlap and their sum is at most
/// [`Laps::total`].
#[derive(Debug, Clone, Copy)]
pub struct Laps {
    start: Instant,
    last: Instant,
}

impl Default for Laps {
    fn default() -> Self {
        Laps::new()
    }
}

impl Laps {
    pub fn new() -> Laps {
        let now = Instant::now();
        Laps {
            start: now,
            last: now,
        }
    }

    /// Seconds since the previous lap; starts the next.
    pub fn lap(&mut self) -> f64 {
        let now = Instant::now();
        let secs = now.duration_since(self.last).as_secs_f64();
        self.last = now;
        secs
    }

    /// Seconds since the start, up to the last lap: every lap's sum.
    pub fn total(&self) -> f64 {
        self.last.duration_since(self.start).as_secs_f64()
    }
}

/// Seconds spent inside one part of a lap (the probe kernel's fetch inside
/// the accelerator's): added up here, then moved from that lap to the
/// phase they belong to.
#[derive(Debug, Default)]
pub struct Within {
    secs: std::sync::Mutex<f64>,
}

impl Within {
    /// Runs `f`, adding its seconds.
    pub fn time<T>(&self, f: impl FnOnce() -> T) -> T {
        let started = Instant::now();
        let out = f();
        *self.secs.lock().unwrap_or_else(|e| e.into_inner()) += started.elapsed().as_secs_f64();
        out
    }

    pub fn secs(&self) -> f64 {
        *self.secs.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The setup phases [`crate::run::suite::prepare_env_timed`] measures.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SetupPhases {
    pub setup_secs: f64,
    /// The wait for the agent's build after everything beside it ended.
    pub agent_build_secs: f64,
    /// The rest of the agent's build, hidden by the work beside it.
    pub agent_build_beside_secs: f64,
    pub accel_secs: f64,
    /// Fetching kernels while the agent built: the one the KVM probe boots
    /// and the others the caller named (part of the kernels' phase).
    pub probe_fetch_secs: f64,
    /// The pins among them that were missing from the cache.
    pub probe_fetched: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Laps of one clock never sum to more than its total, nor do the
    /// phases built from them to more than the wall; the rest is `other`.
    #[test]
    fn laps_and_phases_never_exceed_the_wall() {
        let mut laps = Laps::new();
        let mut sum = 0.0;
        for n in 0..5u64 {
            std::thread::sleep(std::time::Duration::from_millis(n));
            sum += laps.lap();
        }
        assert!(sum <= laps.total() + 1e-9, "{sum} > {}", laps.total());
        let mut laps = Laps::new();
        let setup = laps.lap();
        std::thread::sleep(std::time::Duration::from_millis(3));
        let trials = laps.lap();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let rest = laps.lap();
        let phases = Phases {
            wall_secs: laps.total(),
            setup_secs: setup,
            trials: TrialsPhase {
                secs: trials,
                ..TrialsPhase::default()
            },
            ..Phases::default()
        };
        assert!(phases.accounted_secs() <= phases.wall_secs);
        assert!((phases.other_secs() - rest).abs() < 1e-9);
    }

    /// Saved VMs made are inside the trials: however many seconds they
    /// sum to over parallel VMs, they add nothing to the accounted wall;
    /// `other` is never negative.
    #[test]
    fn saved_vms_are_inside_the_trials_and_other_is_never_negative() {
        let made = |secs| SavedVmMade {
            kernel: "6.1".into(),
            key: "0123456789abcdef".into(),
            pin: true,
            secs,
        };
        let phases = Phases {
            wall_secs: 10.0,
            agent_build_secs: 1.0,
            trials: TrialsPhase {
                secs: 8.0,
                runs: 4,
                saved_vms: vec![made(6.0), made(7.0)],
                saved_vms_removed: 0,
            },
            ..Phases::default()
        };
        assert_eq!(phases.accounted_secs(), 9.0);
        assert_eq!(phases.trials.saved_vm_secs(), 13.0);
        assert_eq!(phases.other_secs(), 1.0);
        let rounded_over = Phases {
            wall_secs: 8.999,
            ..phases
        };
        assert_eq!(rounded_over.other_secs(), 0.0);
    }

    /// `Within` moves a part's seconds out of the lap it ran in.
    #[test]
    fn within_adds_up_what_it_timed() {
        let w = Within::default();
        assert_eq!(w.time(|| 7), 7);
        w.time(|| std::thread::sleep(std::time::Duration::from_millis(2)));
        assert!(w.secs() >= 0.002);
    }

    #[test]
    fn phases_read_back_as_written() {
        let dir = tempfile::tempdir().unwrap();
        let phases = Phases {
            wall_secs: 88.0,
            kernels: KernelsPhase {
                secs: 1.5,
                kernels: 5,
                fetched: 1,
            },
            ..Phases::default()
        };
        phases.write(dir.path()).unwrap();
        assert_eq!(Phases::read(dir.path()).unwrap(), phases);
    }
}
