//! `kloop-run`: a scenario's steps run by hand from the `vm-shell` guest
//! shell. The agent binary is linked as `/bin/kloop-run`; started under
//! that name (an ordinary process, not PID 1) it runs the whole plan of
//! [`kloop_protocol::SHELL_SETUP_PATH`], or the steps the user names, as
//! one session on the data port, then prints the host's report of it.
//!
//! The host parses the records and checks the rules, as for a trial: the
//! agent still knows no perf ABI, it only prints the text it is sent.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use kloop_protocol::{Message, Plan, ShellSetup, Step, RUN_BY_HAND, SHELL_SETUP_PATH};

use crate::channel;
use crate::init;
use crate::runner;
use crate::sys;

/// How long `kloop-run` waits for the host's report after its last frame.
/// The host answers as soon as it has parsed the records (well under a
/// second for kloop's scenarios); this only bounds a host that went away.
const REPORT_WAIT: Duration = Duration::from_secs(60);

const USAGE: &str = "usage: kloop-run [--list] [STEP|FIRST-LAST]...
  no argument   run every step of the scenario and print what the host made of it
  --list        print the scenario's steps, numbered
  STEP ...      run only these steps (numbers from --list, or ranges like 2-4), in plan order;
                the plan's open-listeners steps run first and a drain last when the
                chosen steps have none, so their records are seen";

/// `kloop-run ARGS`: the process's exit status.
pub fn main(args: &[String]) -> i32 {
    match run(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("{RUN_BY_HAND}: {}", sys::describe_chain(&e));
            1
        }
    }
}

fn run(args: &[String]) -> Result<i32> {
    let setup = read_setup()?;
    let plan = &setup.plan;
    let mut picked = Vec::new();
    for arg in args {
        match arg.as_str() {
            "--list" | "-l" => {
                print!("{}", list(plan));
                return Ok(0);
            }
            "--help" | "-h" => {
                println!("{USAGE}");
                return Ok(0);
            }
            a => picked.extend(parse_steps(a, plan.steps.len())?),
        }
    }
    let (plan, note) = if picked.is_empty() {
        (plan.clone(), None)
    } else {
        let (plan, note) = select(plan, &picked);
        (plan, note)
    };
    eprintln!(
        "{RUN_BY_HAND}: running {} step(s) of {}; the host parses the records",
        plan.steps.len(),
        plan.scenario
    );
    channel::open_data_port()
        .map_err(|e| anyhow::anyhow!("opening the data port: {}", sys::Errno(&e)))?;
    channel::discard_input()
        .map_err(|e| anyhow::anyhow!("emptying the data port's input: {}", sys::Errno(&e)))?;
    let session = runner::hello(note.into_iter().collect())?;
    // A failing step is reported as the PID 1 agent reports it, and the
    // host's report still comes: the steps and records up to the failure.
    let failed = match runner::run_steps(&plan, None) {
        Ok(()) => false,
        Err(err) => {
            let message = sys::describe_chain(&err);
            let at = init::current_step()
                .map_or_else(|| "before the steps".into(), |s| format!("step {s}"));
            eprintln!("{RUN_BY_HAND}: {at}: {message}");
            channel::send(&Message::AgentError {
                step: init::current_step(),
                message,
            })?;
            true
        }
    };
    let report = channel::receive_report(session, REPORT_WAIT)?;
    print!("{report}");
    if !report.ends_with('\n') {
        println!();
    }
    Ok(i32::from(failed))
}

fn read_setup() -> Result<ShellSetup> {
    let text = std::fs::read(SHELL_SETUP_PATH).with_context(|| {
        format!("reading {SHELL_SETUP_PATH} (kloop-run works in a `cargo xtask vm-shell` guest)")
    })?;
    serde_json::from_slice(&text).with_context(|| format!("parsing {SHELL_SETUP_PATH}"))
}

/// The plan's steps, one per line: `  3  load fixture=… label=main`.
pub fn list(plan: &Plan) -> String {
    let mut out = format!("scenario {}: {} step(s)\n", plan.scenario, plan.steps.len());
    if !plan.requires.is_empty() {
        let names: Vec<String> = plan
            .requires
            .iter()
            .map(|r| {
                serde_json::to_string(r)
                    .unwrap_or_default()
                    .trim_matches('"')
                    .to_string()
            })
            .collect();
        out.push_str(&format!("requires: {}\n", names.join(", ")));
    }
    for (i, step) in plan.steps.iter().enumerate() {
        out.push_str(&format!("{i:>3}  {}\n", step.one_line()));
    }
    out
}

/// `3` or `2-5` → step indexes, each checked against `count`.
fn parse_steps(arg: &str, count: usize) -> Result<Vec<usize>> {
    let parse = |s: &str| -> Result<usize> {
        let n: usize = s
            .parse()
            .with_context(|| format!("`{arg}` is not a step number or range\n{USAGE}"))?;
        if n >= count {
            bail!(
                "step {n} does not exist: the scenario has steps 0-{}",
                count.saturating_sub(1)
            );
        }
        Ok(n)
    };
    match arg.split_once('-') {
        Some((a, b)) => {
            let (a, b) = (parse(a)?, parse(b)?);
            if a > b {
                bail!("the range {arg} runs backwards");
            }
            Ok((a..=b).collect())
        }
        None => Ok(vec![parse(arg)?]),
    }
}

/// The plan with only the `picked` steps, in plan order. Listeners live in
/// this process only, so without an `open-listeners` among them the plan's
/// own run first, and a `drain` ends a selection that has none after its
/// last step: otherwise the run would show no record. Returns what was
/// added, in words.
fn select(plan: &Plan, picked: &[usize]) -> (Plan, Option<String>) {
    let mut picked: Vec<usize> = picked.to_vec();
    picked.sort_unstable();
    picked.dedup();
    let is_listeners = |s: &Step| matches!(s, Step::OpenListeners { .. });
    let mut added = Vec::new();
    if !picked.iter().any(|&i| is_listeners(&plan.steps[i])) {
        let listeners: Vec<usize> = (0..plan.steps.len())
            .filter(|&i| is_listeners(&plan.steps[i]))
            .collect();
        if !listeners.is_empty() {
            added.push(format!(
                "the plan's open-listeners step(s) {listeners:?} first"
            ));
        }
        picked = listeners.into_iter().chain(picked).collect();
    }
    // A close-listeners names its open-listeners by plan index: renumber it
    // into the selection, or leave it out when that step is not selected.
    let mut steps: Vec<Step> = Vec::new();
    for &i in &picked {
        match &plan.steps[i] {
            Step::CloseListeners { step } => {
                match picked.iter().position(|p| p == &(*step as usize)) {
                    Some(at) => steps.push(Step::CloseListeners { step: at as u32 }),
                    None => added.push(format!(
                    "step {i} (close-listeners) left out: the step {step} it closes is not selected"
                )),
                }
            }
            other => steps.push(other.clone()),
        }
    }
    let opened = steps.iter().any(is_listeners);
    if opened && !matches!(steps.last(), Some(Step::Drain)) {
        steps.push(Step::Drain);
        added.push("a drain last".to_string());
    }
    let note = (!added.is_empty()).then(|| {
        format!(
            "steps {picked:?} of {}, with {} (listeners live only as long as one kloop-run)",
            plan.scenario,
            added.join(" and ")
        )
    });
    (
        Plan {
            scenario: plan.scenario.clone(),
            requires: plan.requires.clone(),
            params: plan.params.clone(),
            steps,
        },
        note,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use kloop_protocol::ListenerSpec;

    fn plan() -> Plan {
        Plan {
            scenario: "basic".into(),
            requires: vec![],
            params: vec![],
            steps: vec![
                Step::SnapshotKallsyms,
                Step::OpenListeners {
                    listener: ListenerSpec {
                        sample_type: 0,
                        ksymbol: true,
                        bpf_event: true,
                        ring_pages: 8,
                        scope: Default::default(),
                        inherit: false,
                        cpus: None,
                        side_band: Vec::new(),
                        disabled: false,
                        backward: false,
                        poll: false,
                        poll_watermark: 0,
                        sample_id_all: true,
                    },
                },
                Step::Load {
                    fixture: "minimal".into(),
                    program: "p".into(),
                    label: "main".into(),
                    btf_target: None,
                },
                Step::Unload {
                    label: "main".into(),
                },
                Step::Drain,
            ],
        }
    }

    #[test]
    fn a_load_alone_gets_the_listeners_before_it_and_a_drain_after() {
        let (p, note) = select(&plan(), &parse_steps("2", 5).unwrap());
        assert!(matches!(p.steps[0], Step::OpenListeners { .. }));
        assert!(matches!(p.steps[1], Step::Load { .. }));
        assert!(matches!(p.steps[2], Step::Drain));
        assert_eq!(p.steps.len(), 3);
        assert!(note.unwrap().contains("open-listeners step(s) [1]"));
    }

    #[test]
    fn a_close_listeners_is_renumbered_into_the_selection() {
        let mut p = plan();
        p.steps.insert(4, Step::CloseListeners { step: 1 });
        // Steps 2 and 4 (load, close): the open-listeners step 1 comes
        // first, so the close now names step 0.
        let (sel, _) = select(&p, &[2, 4]);
        assert_eq!(sel.steps[2], Step::CloseListeners { step: 0 });
        // Another plan's second open-listeners, selected without the first:
        // the close of the first is left out.
        let mut p = plan();
        p.steps.insert(2, p.steps[1].clone());
        p.steps.insert(5, Step::CloseListeners { step: 1 });
        let (sel, note) = select(&p, &[2, 5]);
        assert!(!sel
            .steps
            .iter()
            .any(|s| matches!(s, Step::CloseListeners { .. })));
        assert!(note.unwrap().contains("close-listeners) left out"));
    }

    #[test]
    fn ranges_keep_plan_order_and_add_nothing_they_have() {
        let mut picked = parse_steps("3-4", 5).unwrap();
        picked.extend(parse_steps("1", 5).unwrap());
        let (p, note) = select(&plan(), &picked);
        let all = plan().steps;
        assert_eq!(
            p.steps,
            vec![all[1].clone(), all[3].clone(), all[4].clone()]
        );
        assert_eq!(note, None);
    }

    #[test]
    fn step_numbers_out_of_range_are_refused() {
        assert!(parse_steps("5", 5).is_err());
        assert!(parse_steps("3-1", 5).is_err());
        assert!(parse_steps("x", 5).is_err());
    }

    #[test]
    fn the_list_numbers_each_step() {
        let text = list(&plan());
        assert!(text.contains("  2  load"), "{text}");
        assert!(text.contains("label=main"), "{text}");
    }
}
