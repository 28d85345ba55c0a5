//! A `vm-test` run's phases ([`crate::run::phases::Phases`]) as the lines
//! that close the run.

use crate::run::phases::Phases;

/// Two lines: the wall-clock split (every sequential phase, what no phase
/// accounts for, the wall), then the saved VMs the trials made and
/// removed. cargo's build of the xtask before the process started is not
/// the process's to measure, and the first line says it is not counted.
pub fn lines(p: &Phases) -> Vec<String> {
    let fetched = match p.kernels.fetched {
        0 => "none fetched".to_string(),
        n => format!("{n} fetched"),
    };
    // The agent builds beside the setup and the kernels' downloads: only
    // the wait for it is a phase of the wall; the rest is said beside it.
    let beside = if p.agent_build_beside_secs >= 0.05 {
        format!(
            " (and {:.1} s beside the kernels)",
            p.agent_build_beside_secs
        )
    } else {
        String::new()
    };
    let split = format!(
        "phases (after cargo's build of the xtask, not counted): setup {:.1} s, agent build \
         {:.1} s{beside}, accelerator {:.1} s, kernels {:.1} s ({}, {fetched}), trials {:.1} s ({} \
         run{}), reports {:.1} s, other {:.1} s; {:.1} s in all",
        p.setup_secs,
        p.agent_build_secs,
        p.accel_secs,
        p.kernels.secs,
        p.kernels.kernels,
        p.trials.secs,
        p.trials.runs,
        if p.trials.runs == 1 { "" } else { "s" },
        p.reports_secs,
        p.other_secs(),
        p.wall_secs,
    );
    let made = &p.trials.saved_vms;
    let mut saved = if made.is_empty() {
        "saved VMs: none made (every trial's VM shape was saved already, or booted cold)"
            .to_string()
    } else {
        let pins = made.iter().filter(|m| m.pin).count();
        let longest = made.iter().map(|m| m.secs).fold(0.0, f64::max);
        format!(
            "saved VMs: {} made during the trials ({pins} of pins), {:.1} s of VM time summed \
             over the VMs that made them (longest {longest:.1} s)",
            made.len(),
            p.trials.saved_vm_secs(),
        )
    };
    if p.trials.saved_vms_removed > 0 {
        saved.push_str(&format!(
            "; {} removed past their budget",
            p.trials.saved_vms_removed
        ));
    }
    vec![split, saved]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::phases::{KernelsPhase, SavedVmMade, TrialsPhase};

    fn phases(saved_vms: Vec<SavedVmMade>, removed: usize) -> Phases {
        Phases {
            wall_secs: 100.04,
            setup_secs: 0.12,
            agent_build_secs: 55.0,
            agent_build_beside_secs: 0.0,
            accel_secs: 0.31,
            kernels: KernelsPhase {
                secs: 20.5,
                kernels: 5,
                fetched: 2,
            },
            trials: TrialsPhase {
                secs: 23.0,
                runs: 205,
                saved_vms,
                saved_vms_removed: removed,
            },
            reports_secs: 0.9,
        }
    }

    #[test]
    fn a_warm_run_made_no_saved_vm() {
        assert_eq!(
            lines(&phases(Vec::new(), 0)),
            [
                "phases (after cargo's build of the xtask, not counted): setup 0.1 s, agent build \
                 55.0 s, accelerator 0.3 s, kernels 20.5 s (5, 2 fetched), trials 23.0 s (205 \
                 runs), reports 0.9 s, other 0.2 s; 100.0 s in all",
                "saved VMs: none made (every trial's VM shape was saved already, or booted cold)",
            ]
        );
    }

    /// The part of the agent's build the downloads hid is said beside its
    /// wait, and is not a phase of the wall.
    #[test]
    fn the_agent_build_beside_the_kernels_is_said_apart() {
        let mut p = phases(Vec::new(), 0);
        p.agent_build_secs = 4.0;
        p.agent_build_beside_secs = 27.5;
        let l = lines(&p);
        assert!(
            l[0].contains("agent build 4.0 s (and 27.5 s beside the kernels), accelerator"),
            "{l:?}"
        );
        assert!(l[0].contains("other 51.2 s; 100.0 s in all"), "{l:?}");
    }

    #[test]
    fn a_first_run_says_the_saved_vms_it_made() {
        let made = |kernel: &str, pin, secs| SavedVmMade {
            kernel: kernel.into(),
            key: "0123456789abcdef".into(),
            pin,
            secs,
        };
        let mut p = phases(
            vec![made("6.1", true, 8.2), made("built-0123", false, 9.5)],
            3,
        );
        p.kernels = KernelsPhase {
            secs: 0.04,
            kernels: 1,
            fetched: 0,
        };
        p.trials.runs = 1;
        let l = lines(&p);
        assert!(
            l[0].contains("kernels 0.0 s (1, none fetched), trials 23.0 s (1 run), "),
            "{l:?}"
        );
        assert_eq!(
            l[1],
            "saved VMs: 2 made during the trials (1 of pins), 17.7 s of VM time summed over the \
             VMs that made them (longest 9.5 s); 3 removed past their budget"
        );
    }
}
