//! Scenarios: `scenarios/<name>/scenario.toml` turned into a guest [`Plan`].
//!
//! A scenario is data: its steps are the protocol's [`Step`]s written in TOML,
//! except that a listener names its `sample` fields (`["tid", "time", "cpu"]`)
//! where the wire carries `perf_event_attr.sample_type` bits. The translation
//! lives here so the guest never needs to know perf's ABI.

use std::path::{Path, PathBuf};

use kloop_path_io::{PathIo, PathIoExt};
use kloop_protocol::{Plan, Requirement, Step};

pub use kloop_judge::expectation;
pub mod needs;
pub mod skips;

use expectation::Expectation;

use serde::Deserialize;

#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    #[error(transparent)]
    Io(#[from] PathIo),
    #[error("{path}: {message}")]
    Invalid { path: PathBuf, message: String },
    #[error("unknown scenario `{name}`; known scenarios: {}", known.join(", "))]
    Unknown { name: String, known: Vec<String> },
}

/// `perf_event_attr.sample_type` bits a listener may ask for in its trailer,
/// by the names scenario files use.
pub const SAMPLE_FIELDS: &[(&str, u64)] = &[
    ("tid", kloop_records::PERF_SAMPLE_TID),
    ("time", kloop_records::PERF_SAMPLE_TIME),
    ("id", kloop_records::PERF_SAMPLE_ID),
    ("cpu", kloop_records::PERF_SAMPLE_CPU),
    ("stream_id", kloop_records::PERF_SAMPLE_STREAM_ID),
    ("identifier", kloop_records::PERF_SAMPLE_IDENTIFIER),
];

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ScenarioFile {
    description: String,
    #[serde(default)]
    vm: VmOptions,
    /// Kernel features the scenario needs; a kernel without one is reported
    /// skipped with the probe's reason.
    #[serde(default)]
    requires: Vec<Requirement>,
    /// Kernel modules (by name) the host copies from the pin's package into
    /// the initramfs, for `modprobe` steps.
    #[serde(default)]
    modules: Vec<String>,
    steps: Vec<toml::Value>,
    /// What the records and facts of this scenario must show beyond the
    /// rules of every run (`expect.rs`).
    #[serde(default)]
    expect: Vec<Expectation>,
    /// C programs built on the host (`gcc -static`) and shipped in the
    /// initramfs, for `run-program` steps.
    #[serde(default)]
    programs: Vec<GuestProgram>,
    /// Compare the normalised stream with golden snapshots (the default).
    /// `false` for a scenario whose verdict is its program's exit status
    /// and its rules, not its stream (a stand-alone reproducer's).
    #[serde(default = "yes")]
    snapshot: bool,
}

fn yes() -> bool {
    true
}

/// `[[programs]]`: a C source (relative to the scenario's folder, or
/// absolute) built statically and placed at `guest` in the initramfs.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GuestProgram {
    pub source: PathBuf,
    pub guest: String,
}

/// The kernel command line words of every scenario that does not set its
/// own `cmdline`: one VM shape, so one saved VM per pin serves them all
/// (a first run makes one saved VM per pin fewer than with a shape of
/// their own for the scenarios that need these words).
///
/// - `lsm=lockdown,yama,bpf`: BPF LSM programs run only when `bpf` is in
///   the active LSM list (security/security.c); Debian's 5.10 lacks it in
///   `CONFIG_LSM`. The LSMs left out (AppArmor, SELinux, …) load no policy
///   in kloop's initramfs and emit no perf record.
/// - `rcupdate.rcu_tasks_lazy_ms=0`, `rcupdate.rcu_tasks_trace_lazy_ms=0`:
///   a trampoline image is freed after a chain of RCU-tasks callbacks
///   (bpf_tramp_image_put() in kernel/bpf/trampoline.c), and from 6.12 each
///   call_rcu_tasks*() may wait a quarter of a second to batch
///   (kernel/rcu/tasks.h: lazy_jiffies = HZ/4); 0 turns the batching off
///   (Documentation/admin-guide/kernel-parameters.txt). The grace periods
///   themselves are the same; 6.1 and 5.10 ignore the words as unknown
///   module parameters.
/// - `rcupdate.rcu_expedited=1`: synchronize_rcu() and synchronize_srcu()
///   take their expedited forms (rcu_gp_is_expedited()), the same
///   guarantee sooner; symbol-state's kprobe detaches wait for one normal
///   grace period per probe without it (2.5-2.8 guest-s on 6.1 and 6.12).
///   Every rule already allows for grace-period timing.
/// - `kloop.kallsyms_files=8`: the saved VM keeps eight /proc/kallsyms
///   files positioned past the core kernel's lines (guest/src/kallsyms.rs);
///   trampolines reads generated symbols 6 times, symbol-state 8.
///
/// A scenario's own `cmdline` replaces these words (the icount shape's
/// timing scenarios keep a command line of their own).
pub const DEFAULT_CMDLINE: [&str; 5] = [
    "lsm=lockdown,yama,bpf",
    "rcupdate.rcu_tasks_lazy_ms=0",
    "rcupdate.rcu_tasks_trace_lazy_ms=0",
    "rcupdate.rcu_expedited=1",
    "kloop.kallsyms_files=8",
];

fn default_cmdline() -> Vec<String> {
    DEFAULT_CMDLINE.iter().map(|w| (*w).to_owned()).collect()
}

/// `[vm]` in scenario.toml: how the scenario's guest is run.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmOptions {
    /// Under TCG, run with `-icount shift=0,sleep=off` so the guest clock
    /// counts instructions (timing scenarios); ignored under KVM.
    #[serde(default)]
    pub icount: bool,
    /// vCPUs for this scenario's guest instead of the run's `--cpus`.
    #[serde(default)]
    pub cpus: Option<u32>,
    /// Kernel command line words; [`DEFAULT_CMDLINE`] when not set.
    #[serde(default = "default_cmdline")]
    pub cmdline: Vec<String>,
    /// How many /proc/kallsyms files the saved VM keeps positioned past
    /// the core kernel's lines (`kloop.kallsyms_files=N` after the
    /// command line's words, so it wins over [`DEFAULT_CMDLINE`]'s 8): a
    /// shape whose scenarios read generated symbols fewer times spares its
    /// saved VM's boot the rest (each costs one formatting of the whole
    /// core table, 0.15-0.5 s of a TCG vCPU).
    #[serde(default)]
    pub kallsyms_files: Option<u32>,
    /// The whole run's deadline in seconds, when shorter than the
    /// accelerator's default (a mutant's trial is held to a few times its
    /// unmutated run: a kernel that hangs is decided in a minute, not six).
    #[serde(default)]
    pub total_secs: Option<u64>,
}

impl VmOptions {
    /// The kernel command line words of this shape: `cmdline`, then
    /// `kallsyms_files`' word.
    pub fn cmdline_words(&self) -> Vec<String> {
        let mut words = self.cmdline.clone();
        if let Some(n) = self.kallsyms_files {
            words.push(format!("kloop.kallsyms_files={n}"));
        }
        words
    }
}

impl Default for VmOptions {
    fn default() -> Self {
        VmOptions {
            icount: false,
            cpus: None,
            cmdline: default_cmdline(),
            kallsyms_files: None,
            total_secs: None,
        }
    }
}

/// One scenario, ready to run.
#[derive(Debug, Clone)]
pub struct Scenario {
    pub name: String,
    pub dir: PathBuf,
    pub description: String,
    pub vm: VmOptions,
    pub modules: Vec<String>,
    pub plan: Plan,
    /// Scenario-specific expectations, checked after the rules.
    pub expect: Vec<Expectation>,
    /// C programs shipped in the guest (sources resolved against `dir`).
    pub programs: Vec<GuestProgram>,
    /// Whether the stream is compared with golden snapshots.
    pub snapshot: bool,
}

impl Scenario {
    pub fn load(dir: &Path) -> Result<Scenario, ScenarioError> {
        let path = dir.join("scenario.toml");
        let text = std::fs::read_to_string(&path).at("reading", &path)?;
        let name = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        Self::parse(&name, dir, &text).map_err(|e| ScenarioError::Invalid {
            path,
            message: e.to_string(),
        })
    }

    /// A scenario from its TOML text, as if it were `dir/scenario.toml`
    /// (`repro --standalone --prove` builds one around a reproducer).
    pub fn parse(name: &str, dir: &Path, text: &str) -> Result<Scenario, ScenarioInvalid> {
        let file: ScenarioFile = toml::from_str(text)?;
        let steps = file
            .steps
            .into_iter()
            .enumerate()
            .map(|(i, v)| step_from_toml(v).map_err(|e| ScenarioInvalid::Step(i + 1, e)))
            .collect::<Result<Vec<Step>, ScenarioInvalid>>()?;
        if steps.is_empty() {
            return Err(ScenarioInvalid::NoSteps);
        }
        for (i, e) in file.expect.iter().enumerate() {
            e.validate(&steps)
                .map_err(|m| ScenarioInvalid::Expect(i + 1, m))?;
        }
        let programs: Vec<GuestProgram> = file
            .programs
            .into_iter()
            .map(|p| GuestProgram {
                source: dir.join(&p.source),
                guest: p.guest,
            })
            .collect();
        for step in &steps {
            if let Step::RunProgram { path, .. } = step {
                if !programs.iter().any(|p| &p.guest == path) {
                    return Err(ScenarioInvalid::NotShipped(path.clone()));
                }
            }
        }
        Ok(Scenario {
            name: name.to_string(),
            dir: dir.to_path_buf(),
            description: file.description,
            vm: file.vm,
            modules: file.modules,
            expect: file.expect,
            programs,
            snapshot: file.snapshot,
            plan: Plan {
                scenario: name.to_string(),
                requires: with_implied(file.requires, &steps),
                params: Vec::new(),
                steps,
            },
        })
    }

    pub fn snapshot_dir(&self) -> PathBuf {
        self.dir.join("snapshots")
    }
}

/// What is wrong with a scenario's text (`ScenarioError::Invalid`'s
/// message).
#[derive(Debug, thiserror::Error)]
pub enum ScenarioInvalid {
    #[error("{0}")]
    Toml(#[from] toml::de::Error),
    #[error("step {0}: {1}")]
    Step(usize, StepInvalid),
    #[error("a scenario needs at least one step")]
    NoSteps,
    #[error("expect {0}: {1}")]
    Expect(usize, crate::judge::expectation::Unmeetable),
    #[error("run-program runs {0}, which no [[programs]] table ships")]
    NotShipped(String),
}

/// What is wrong with one step of a scenario.
#[derive(Debug, thiserror::Error)]
pub enum StepInvalid {
    #[error("listener.sample must be a list of field names")]
    SampleNotList,
    #[error("listener.sample entries are strings")]
    SampleNotString,
    #[error("unknown sample field `{name}`; known: {known}")]
    UnknownSample { name: String, known: String },
    #[error("{0}")]
    Toml(#[from] toml::de::Error),
}

fn step_from_toml(mut v: toml::Value) -> Result<Step, StepInvalid> {
    if let Some(listener) = v.get_mut("listener").and_then(|l| l.as_table_mut()) {
        if let Some(sample) = listener.remove("sample") {
            let names = sample.as_array().ok_or(StepInvalid::SampleNotList)?;
            let mut bits = 0u64;
            for n in names {
                let n = n.as_str().ok_or(StepInvalid::SampleNotString)?;
                let (_, b) = SAMPLE_FIELDS.iter().find(|(f, _)| *f == n).ok_or_else(|| {
                    StepInvalid::UnknownSample {
                        name: n.to_string(),
                        known: SAMPLE_FIELDS
                            .iter()
                            .map(|(f, _)| *f)
                            .collect::<Vec<_>>()
                            .join(", "),
                    }
                })?;
                bits |= b;
            }
            listener.insert("sample_type".into(), toml::Value::Integer(bits as i64));
        }
    }
    Ok(v.try_into::<Step>()?)
}

/// The scenario's own requirements and those its steps imply; the agent's
/// own need (threads) first, since nothing else can be probed without it.
fn with_implied(mut requires: Vec<Requirement>, steps: &[Step]) -> Vec<Requirement> {
    for r in needs::implied_requirements(steps) {
        if !requires.contains(&r) {
            if r == Requirement::Threads {
                requires.insert(0, r);
            } else {
                requires.push(r);
            }
        }
    }
    requires
}

/// `jit-optional` for [`Requirement::JitOptional`]: the name scenario files use.
pub fn requirement_name(r: Requirement) -> String {
    match serde_json::to_value(r) {
        Ok(serde_json::Value::String(s)) => s,
        _ => format!("{r:?}"),
    }
}

/// Every scenario under `root`, sorted by name.
pub fn load_all(root: &Path) -> Result<Vec<Scenario>, ScenarioError> {
    let entries = std::fs::read_dir(root).at("reading", root)?;
    let mut dirs: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.join("scenario.toml").is_file())
        .collect();
    dirs.sort();
    dirs.iter().map(|d| Scenario::load(d)).collect()
}

/// Picks scenarios by name, erroring with the known names for a typo.
/// The scenario `name` of those under `root`.
/// Every module some scenario of `all` ships (`modules`), sorted, once.
pub fn shipped_modules(all: &[Scenario]) -> Vec<String> {
    let mut modules: Vec<String> = all.iter().flat_map(|s| s.modules.clone()).collect();
    modules.sort();
    modules.dedup();
    modules
}

pub fn load_one(root: &Path, name: &str) -> Result<Scenario, ScenarioError> {
    let all = load_all(root)?;
    Ok(select(&all, &[name.to_string()])?.remove(0))
}

pub fn select(all: &[Scenario], names: &[String]) -> Result<Vec<Scenario>, ScenarioError> {
    if names.is_empty() {
        return Ok(all.to_vec());
    }
    names
        .iter()
        .map(|n| {
            all.iter()
                .find(|s| &s.name == n)
                .cloned()
                .ok_or_else(|| ScenarioError::Unknown {
                    name: n.clone(),
                    known: all.iter().map(|s| s.name.clone()).collect(),
                })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scenario without `[vm]` boots with the default words; its own
    /// `cmdline` replaces them; `kallsyms_files` comes last, so the guest
    /// (which takes the last such word) positions that many.
    #[test]
    fn the_default_command_line_and_its_kallsyms_files() {
        let parse = |vm: &str| {
            let text = format!("description = \"x\"\n{vm}\n[[steps]]\nop = \"drain\"\n");
            Scenario::parse("t", Path::new("/s"), &text).unwrap().vm
        };
        assert_eq!(parse("").cmdline_words(), DEFAULT_CMDLINE.map(String::from));
        assert_eq!(
            parse("[vm]\ncpus = 2").cmdline,
            VmOptions::default().cmdline
        );
        assert_eq!(
            parse("[vm]\ncmdline = [\"nokaslr\"]").cmdline_words(),
            ["nokaslr"]
        );
        let fewer = parse("[vm]\nkallsyms_files = 4").cmdline_words();
        assert_eq!(
            fewer[..DEFAULT_CMDLINE.len()],
            DEFAULT_CMDLINE.map(String::from)
        );
        assert_eq!(
            fewer.last().map(String::as_str),
            Some("kloop.kallsyms_files=4")
        );
    }

    fn listener_bits(s: &Scenario) -> u64 {
        match &s.plan.steps[0] {
            Step::OpenListeners { listener } => listener.sample_type,
            _ => 0,
        }
    }

    /// Every part of a scenario file that can be wrong is refused with a
    /// message naming what and where: a misspelt or unknown field anywhere
    /// (top level, `[vm]`, a step, its listener, an attach target, an
    /// `[[expect]]`, `[[programs]]`), a wrong type, an unknown step,
    /// requirement or sample field, no steps, an expectation about a step
    /// the plan lacks, a program no table ships.
    #[test]
    fn hostile_scenario_files_are_refused_naming_the_fault() {
        let ok_steps = r#"
[[steps]]
op = "open-listeners"
listener = { sample = ["tid", "time"], ksymbol = true, bpf_event = true }

[[steps]]
op = "load"
fixture = "basic"
program = "kloop_basic"
label = "main"
"#;
        let with = |head: &str, steps: &str| format!("description = \"d\"\n{head}\n{steps}");
        let cases: Vec<(&str, String, &str)> = vec![
            ("no description", ok_steps.to_string(), "missing field `description`"),
            ("unknown top-level key", with("descripton = \"x\"", ok_steps), "unknown field `descripton`"),
            ("no steps", with("steps = []", ""), "a scenario needs at least one step"),
            ("[vm] field misspelt", with("[vm]\nicoutn = true", ok_steps), "unknown field `icoutn`"),
            ("[vm] wrong type", with("[vm]\ncpus = \"two\"", ok_steps), "invalid type: string \"two\", expected u32"),
            ("unknown requirement", with("requires = [\"btf\", \"warp-drive\"]", ok_steps), "unknown variant `warp-drive`"),
            ("modules not a list", with("modules = \"veth\"", ok_steps), "invalid type: string \"veth\", expected a sequence"),
            ("unknown step", with("", "[[steps]]\nop = \"teleport\""), "step 1: unknown variant `teleport`"),
            ("step field misspelt", with("", "[[steps]]\nop = \"wait-unloaded\"\ntimout_ms = 5000"), "step 1: unknown field `timout_ms`"),
            ("step field wrong type", with("", "[[steps]]\nop = \"wait-unloaded\"\ntimeout_ms = \"soon\""), "step 1: invalid type: string \"soon\""),
            ("listener field misspelt", with("", "[[steps]]\nop = \"open-listeners\"\nlistener = { ksymbols = true }"), "step 1: unknown field `ksymbols`"),
            ("unknown sample field", with("", "[[steps]]\nop = \"open-listeners\"\nlistener = { sample = [\"tid\", \"weight\"] }"), "step 1: unknown sample field `weight`; known: tid, time, id, cpu, stream_id, identifier"),
            ("expect kind unknown", with("[[expect]]\nkind = \"vibes\"", ok_steps), "unknown variant `vibes`"),
            ("expect field misspelt", with("[[expect]]\nkind = \"symbol\"\nprefx = \"bpf_prog_\"", ok_steps), "unknown field `prefx`"),
            ("program without source", with("[[programs]]\nguest = \"/usr/bin/x\"", ok_steps), "missing field `source`"),
            ("run-program not shipped", with("", "[[steps]]\nop = \"run-program\"\npath = \"/usr/bin/x\""), "run-program runs /usr/bin/x, which no [[programs]] table ships"),
            ("snapshot wrong type", with("snapshot = \"no\"", ok_steps), "invalid type: string \"no\", expected a boolean"),
            ("not TOML", "description = ".to_string(), "TOML parse error at line 1, column 15"),
        ];
        for (what, text, says) in cases {
            let err = Scenario::parse("x", Path::new("/s/x"), &text)
                .err()
                .unwrap_or_else(|| panic!("{what}: accepted:\n{text}"));
            let err = err.to_string();
            assert!(err.contains(says), "{what}: {err:?} lacks {says:?}");
        }
    }

    #[test]
    fn sample_names_become_bits() {
        let text = r#"
description = "t"
[[steps]]
op = "open-listeners"
listener = { sample = ["tid", "time", "cpu"], ksymbol = true, bpf_event = false, ring_pages = 8 }
[[steps]]
op = "load"
fixture = "basic"
program = "kloop_basic"
label = "main"
"#;
        let s = Scenario::parse("t", Path::new("/x"), text).unwrap();
        match &s.plan.steps[0] {
            Step::OpenListeners { listener } => {
                assert_eq!(listener.sample_type, (1 << 1) | (1 << 2) | (1 << 7));
                assert!(listener.ksymbol && !listener.bpf_event);
                assert_eq!(listener.ring_pages, 8);
            }
            other => panic!("unexpected {other:?}"),
        }
        assert_eq!(
            kloop_records::sample_type_names(listener_bits(&s)),
            "TID|TIME|CPU"
        );
    }

    #[test]
    fn unknown_field_and_op_are_errors() {
        let bad_field = "description = \"t\"\n[[steps]]\nop = \"open-listeners\"\nlistener = { sample = [\"tim\"], ksymbol = true, bpf_event = true, ring_pages = 8 }\n";
        let e = Scenario::parse("t", Path::new("/x"), bad_field)
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown sample field `tim`"), "{e}");
        let bad_op = "description = \"t\"\n[[steps]]\nop = \"launch-missiles\"\n";
        let e = Scenario::parse("t", Path::new("/x"), bad_op)
            .unwrap_err()
            .to_string();
        assert!(e.contains("step 1"), "{e}");
    }

    #[test]
    fn committed_scenarios_load() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios");
        let all = load_all(&root).unwrap();
        let names: Vec<&str> = all.iter().map(|s| s.name.as_str()).collect();
        assert!(
            names.contains(&"basic") && names.contains(&"subprogs"),
            "{names:?}"
        );
        let err = select(&all, &["nope".into()]).unwrap_err().to_string();
        assert!(err.contains("basic") && err.contains("subprogs"), "{err}");
    }
}
