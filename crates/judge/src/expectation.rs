//! The `[[expect]]` tables of a `scenario.toml`, as data: their kinds and
//! fields, and which plan steps they name. `crate::expect` checks
//! them against a run.

use kloop_protocol::Step;
use serde::Deserialize;

fn one() -> u32 {
    1
}

/// One `[[expect]]` table.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Expectation {
    /// KSYMBOL registers whose name starts with `prefix`.
    Symbol {
        /// The names' start.
        prefix: String,
        /// The name also ends with this (a program's symbol is
        /// `bpf_prog_<tag>_<function>`: the tag is not known in advance,
        /// the function name is).
        #[serde(default)]
        suffix: Option<String>,
        /// `bpf` or `ool`.
        #[serde(default)]
        ksym_type: Option<KsymKind>,
        /// At least this many registers (default 1).
        #[serde(default = "one")]
        min_registers: u32,
        /// At most this many.
        #[serde(default)]
        max_registers: Option<u32>,
        /// Each register is unregistered later in the run.
        #[serde(default)]
        unregistered: bool,
        /// Each register stays: no unregister of it in the run (a symbol
        /// the kernel keeps for good, such as the XDP dispatcher's image).
        #[serde(default)]
        kept: bool,
        /// Checked only on these kernel pins (empty: all).
        #[serde(default)]
        pins: Vec<String>,
    },
    /// A `read-file` snapshot's contents.
    File {
        /// The snapshot's label.
        label: String,
        /// Strings it must hold.
        #[serde(default)]
        contains: Vec<String>,
        /// Strings it must not hold.
        #[serde(default)]
        lacks: Vec<String>,
        /// Checked only on these kernel pins (empty: all).
        #[serde(default)]
        pins: Vec<String>,
    },
    /// The value(s) a `read-counter` step read.
    Counter {
        /// The program's label.
        label: String,
        /// Its map.
        map: String,
        /// The map key.
        #[serde(default)]
        key: u32,
        /// At least this.
        #[serde(default)]
        min: Option<u64>,
        /// At most this.
        #[serde(default)]
        max: Option<u64>,
        /// Exactly this.
        #[serde(default)]
        equals: Option<u64>,
        /// Checked only on these kernel pins (empty: all).
        #[serde(default)]
        pins: Vec<String>,
    },
    /// An `attach` step was reported.
    Attached {
        /// The link's name.
        link: String,
        /// Strings its detail must hold.
        #[serde(default)]
        contains: Vec<String>,
        /// Checked only on these kernel pins (empty: all).
        #[serde(default)]
        pins: Vec<String>,
    },
    /// A program's unload records come only after a step started.
    UnloadAfter {
        /// The program's label.
        label: String,
        /// The step, as a partial table (`{ op = "detach", link = "clock" }`).
        step: toml::Table,
        /// Checked only on these kernel pins (empty: all).
        #[serde(default)]
        pins: Vec<String>,
    },
    /// A `fail-nth` sweep was reported.
    FailNth {
        /// A substring of the sweep's target (`attach fentry`, `kprobe`).
        target: String,
        /// At least this many attempts.
        #[serde(default)]
        min_attempts: u32,
        /// At least this many of them failed by the injected fault.
        #[serde(default)]
        min_failed: u32,
        /// Checked only on these kernel pins (empty: all).
        #[serde(default)]
        pins: Vec<String>,
    },
}

/// A KSYMBOL type by the name scenario files use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum KsymKind {
    /// `PERF_RECORD_KSYMBOL_TYPE_BPF`.
    Bpf,
    /// `PERF_RECORD_KSYMBOL_TYPE_OOL`.
    Ool,
}

impl KsymKind {
    pub(crate) fn raw(self) -> u16 {
        match self {
            KsymKind::Bpf => kloop_records::KSYM_TYPE_BPF,
            KsymKind::Ool => kloop_records::KSYM_TYPE_OOL,
        }
    }
}

impl Expectation {
    pub(crate) fn pins(&self) -> &[String] {
        match self {
            Expectation::Symbol { pins, .. }
            | Expectation::File { pins, .. }
            | Expectation::Counter { pins, .. }
            | Expectation::Attached { pins, .. }
            | Expectation::UnloadAfter { pins, .. }
            | Expectation::FailNth { pins, .. } => pins,
        }
    }

    /// Refuses an expectation that can never be met by this plan (checked
    /// when the scenario loads, so a typo fails before any VM boots).
    pub fn validate(&self, steps: &[Step]) -> Result<(), Unmeetable> {
        match self {
            Expectation::Symbol {
                prefix,
                min_registers,
                max_registers,
                unregistered,
                kept,
                ..
            } => {
                if prefix.is_empty() {
                    return Err(Unmeetable::EmptyPrefix);
                }
                if *unregistered && *kept {
                    return Err(Unmeetable::UnregisteredAndKept);
                }
                if max_registers.is_some_and(|m| m < *min_registers) {
                    return Err(Unmeetable::MaxBelowMin);
                }
            }
            Expectation::File { label, .. } => {
                if !steps
                    .iter()
                    .any(|s| matches!(s, Step::ReadFile { label: l, .. } if l == label))
                {
                    return Err(Unmeetable::NoReadFile {
                        label: label.clone(),
                    });
                }
            }
            Expectation::Counter {
                label, map, key, ..
            } => {
                if !steps.iter().any(|s| {
                    matches!(s, Step::ReadCounter { label: l, map: m, key: k }
                        if l == label && m == map && k == key)
                }) {
                    return Err(Unmeetable::NoReadCounter {
                        label: label.clone(),
                        map: map.clone(),
                        key: *key,
                    });
                }
            }
            Expectation::Attached { link, .. } => {
                if !steps
                    .iter()
                    .any(|s| matches!(s, Step::Attach { link: l, .. } if l == link))
                {
                    return Err(Unmeetable::NoAttach { link: link.clone() });
                }
            }
            Expectation::FailNth { .. } => {
                if !steps.iter().any(|s| matches!(s, Step::FailNth { .. })) {
                    return Err(Unmeetable::NoFailNth);
                }
            }
            Expectation::UnloadAfter { step, .. } => {
                let n = matching_steps(steps, step)
                    .map_err(Unmeetable::StepTable)?
                    .len();
                if n != 1 {
                    return Err(Unmeetable::UnloadAfterMatches {
                        matching: n,
                        step: step.to_string(),
                    });
                }
            }
        }
        Ok(())
    }
}

/// Why an expectation can never be met by its scenario's plan (refused
/// when the scenario loads, before any VM boots).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unmeetable {
    /// `symbol` with an empty prefix.
    #[error("symbol: empty prefix matches every symbol")]
    EmptyPrefix,
    /// `symbol` asking for both `unregistered` and `kept`.
    #[error("symbol: unregistered and kept contradict each other")]
    UnregisteredAndKept,
    /// `symbol` whose `max_registers` is below its `min_registers`.
    #[error("symbol: max_registers < min_registers")]
    MaxBelowMin,
    /// `file` naming a label no `read-file` step reads.
    #[error("file: no read-file step has label {label:?}")]
    NoReadFile {
        /// The label asked for.
        label: String,
    },
    /// `counter` naming a counter no `read-counter` step reads.
    #[error("counter: no read-counter step reads {label:?} {map:?}[{key}]")]
    NoReadCounter {
        /// The program label, map and key asked for.
        label: String,
        /// The map.
        map: String,
        /// The key.
        key: u32,
    },
    /// `attached` naming a link no `attach` step makes.
    #[error("attached: no attach step makes link {link:?}")]
    NoAttach {
        /// The link asked for.
        link: String,
    },
    /// `fail-nth` in a plan without a `fail-nth` step.
    #[error("fail-nth: the plan has no fail-nth step")]
    NoFailNth,
    /// `unload-after` whose step table matches no step or several.
    #[error("unload-after: {matching} steps match {step}, it must name exactly one")]
    UnloadAfterMatches {
        /// How many steps match.
        matching: usize,
        /// The step table, as written.
        step: String,
    },
    /// A step table that does not serialise.
    #[error("{0}")]
    StepTable(String),
}

/// Indexes of the plan's steps whose fields include every key of `partial`
/// with an equal value.
pub(crate) fn matching_steps(steps: &[Step], partial: &toml::Table) -> Result<Vec<usize>, String> {
    let want = serde_json::to_value(partial).map_err(|e| format!("step table: {e}"))?;
    let want = want.as_object().cloned().unwrap_or_default();
    Ok(steps
        .iter()
        .enumerate()
        .filter(|(_, s)| {
            let Ok(serde_json::Value::Object(have)) = serde_json::to_value(s) else {
                return false;
            };
            want.iter().all(|(k, v)| have.get(k) == Some(v))
        })
        .map(|(i, _)| i)
        .collect())
}
