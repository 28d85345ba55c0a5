//! The known-issues ledger: `kernels/known-issues.toml`.
//!
//! A kernel that breaks a rule is a finding; once it is understood (the
//! kernel, not kloop, is wrong, and why) it goes into the ledger so that the
//! other trials of that pin stay useful. Each entry names one rule, the pins
//! (and optionally the scenarios) where the kernel breaks it, and a date by
//! which someone must look at it again:
//!
//! ```toml
//! [[issue]]
//! id = "short-kebab-id"
//! rule = "parse"                 # a rule name (check::rule::ALL and friends)
//! scenarios = ["many-listeners"] # where it shows (empty = any scenario)
//! pins = ["5.10", "6.1"]
//! summary = "what the kernel does wrong and why (file/function)"
//! evidence = """records quoted from a real run"""
//! upstream_fix = "commit subject / id, or empty"
//! review_by = "2027-05-21"
//!
//! [[issue.signature]]
//! fault = "oversized-record"
//! record_types = ["KSYMBOL", "BPF_EVENT"]
//! readers = ["kloop"]
//! excess = "accumulated-trailers"
//! ```
//!
//! Each entry also says what its violations look like: one or more
//! `[[issue.signature]]` tables ([`Signature`]) naming a fault class and
//! the typed fields a violation of it must show ([`Detail`]). A known bug
//! excuses only itself: another violation of the same rule is news.
//!
//! How a trial on a pin is judged ([`Ledger::judge`]):
//!
//! - a violation is *covered* when an entry for that pin (and scenario, if
//!   the entry lists any) names its rule and one of the entry's
//!   signatures matches its typed fields ([`Issue::covers`]);
//! - any violation not covered: `FAILED`, as without a ledger, with the
//!   covered ones printed beside it;
//! - only covered violations: `KNOWN (<ids>)`, a known bug: never ok,
//!   but it does not fail the exit status;
//! - an entry that lists the trial's scenario that no violation matches:
//!   `FIXED? <id> no longer shows on <pin>`, a failure, like a strict
//!   xfail: the ledger must be updated (the bug was fixed, or the scenario no
//!   longer provokes it). An entry without scenarios only excuses; it cannot
//!   be confirmed fixed, because not every scenario provokes every bug.
//!
//! A kernel that is not a pin (`--kernel-image`, a distro build a
//! bisection boots) is judged by the entries of the pin of its series
//! (same code, same known bugs), but an entry that does not show there is
//! a note, not a failure: that is what a developer fixing the bug boots to
//! see (`run::trial::judging` in the harness).
//!
//! Snapshots of a KNOWN trial are still compared (and `bless` writes them):
//! the normalised stream is built from every record read — a record whose
//! only fault is the zero-filled excess a signature can name is read past
//! (`kloop_records::parse_reading_on`), so a known bug does not cut a
//! stream short; a ledger entry excuses its signature, not a drift
//! anywhere else. When the kernel is fixed the trial turns
//! `FIXED?` and its snapshot drifts, and both are updated together.
//!
//! Validation refuses unknown pins, unknown rules, unknown scenarios,
//! duplicate ids, malformed dates and empty summaries or evidence; an entry
//! past its `review_by` date is not an error but a warning line in every run.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::check::{Detail, Violation};

/// The ledger's file name inside the kernels directory.
pub const FILE_NAME: &str = "known-issues.toml";

/// Every rule name, by the family (module) that defines it:
/// [`crate::check::rule::ALL`] and each module that adds violations with
/// rules of its own, so that ledger entries may name them and the docs
/// list them (`cargo xtask docs`).
pub const RULE_FAMILIES: &[(&str, &[&str])] = &[
    (
        "the records' stream, as the kernel promises it",
        crate::check::rule::ALL,
    ),
    (
        "perf as a consumer and a second reader",
        crate::perf_script::RULES,
    ),
    ("a scenario's `[[expect]]`", crate::expect::rule::ALL),
    ("the kernel's own reports", crate::kernel_log::RULES),
    ("the JIT's books", crate::jit_books::RULES),
    ("fault injection", crate::fault_recovery::RULES),
    (
        "bytes published to a spinning reader",
        crate::published::RULES,
    ),
];

/// Every rule name a ledger entry may use.
pub fn rule_names() -> Vec<&'static str> {
    RULE_FAMILIES
        .iter()
        .flat_map(|(_, s)| s.iter().copied())
        .collect()
}

/// Why the ledger's text cannot be used (reading the file is the running
/// side's, and so is its error).
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    /// It is not TOML of the ledger's shape.
    #[error("{path}: {message}")]
    Parse {
        /// The ledger's path.
        path: PathBuf,
        /// The parser's message.
        message: String,
    },
    /// It refers to pins, rules or scenarios that do not exist, or repeats
    /// an id, or has a malformed date.
    #[error("{path}: invalid known-issues ledger:\n  {}", problems.join("\n  "))]
    Invalid {
        /// The ledger's path.
        path: PathBuf,
        /// Every problem found.
        problems: Vec<String>,
    },
}

/// One ledger entry.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Issue {
    /// The entry's id (`ksymbol-bpf-event-header-size-accumulates`).
    pub id: String,
    /// The rule its violations break.
    pub rule: String,
    /// The scenarios that must show it (empty: it may show in any).
    #[serde(default)]
    pub scenarios: Vec<String>,
    /// The pins it shows on.
    pub pins: Vec<String>,
    /// Whose bug it is: `kernel` (the default) or the userspace tool a
    /// scenario runs next to kloop (`perf`). Reports name it.
    #[serde(default = "default_component")]
    pub component: String,
    /// What happens and why, from the source.
    pub summary: String,
    /// The violations seen, quoted from runs.
    pub evidence: String,
    /// The fix upstream, if one is known.
    #[serde(default)]
    pub upstream_fix: String,
    /// When the entry must be looked at again (`YYYY-MM-DD`).
    pub review_by: String,
    /// Fixes proven with `validate --fix … --record` (written by that
    /// command, never by hand): which patch, on which source, with what
    /// result.
    #[serde(default, rename = "fix")]
    pub fixes: Vec<FixRecord>,
    /// How the bug shows in a perf.data a host recorded
    /// (`check-perf-data`), where there is no pin, only a kernel release.
    #[serde(default)]
    pub perf_data: Option<PerfDataSign>,
    /// What its violations look like (`[[issue.signature]]`, at least
    /// one): a violation of the entry's rule is the entry's only if its
    /// typed fields match one of them.
    #[serde(default, rename = "signature")]
    pub signatures: Vec<Signature>,
}

/// What a known bug's violations look like, as the typed fields
/// ([`Detail`]) the judge checks: `fault` names the fault class, the
/// other fields (each required for its class, refused for the others)
/// what a violation of that class must show to be this bug.
///
/// | fault | field | a violation matches when |
/// |---|---|---|
/// | `oversized-record` | `record_types` | its record type is one of these (`KSYMBOL`, `BPF_EVENT`, …) |
/// | | `readers` | its reader is one of these: `kloop` (a listener), `perf` (perf's file) |
/// | | `excess` | `accumulated-trailers`: the excess is exactly the trailers of the same write's copies written before it, plus events with no copy to show ([`crate::check::detail::Accumulation::explained`]) |
/// | `interpreted-symbol` | `len` | the KSYMBOL's len |
/// | | `name` | the KSYMBOL's name |
/// | | `kernel_text` | its address is in the kernel image's text (true) or not (false) |
/// | `synthesised-ksymbol` | `fields` | perf's synthesised KSYMBOL differs from the kernel's in exactly these fields |
/// | | `first_function_tag` | perf's name is built from `prog_tags[0]` (true) or not (false) |
/// | `kernel-report` | `title` | a checked kernel's report has this title (addresses and offsets dropped) |
/// | | `frames` | and these first frames |
/// | `fault-recovery` | `target` | the fail-nth sweep's target kind (`attach`, `xdp-attach`) |
/// | | `errno` | the errno name its attempt without an injected fault failed with (`EBUSY`) |
/// | `misattributed-sample` | `kind` | what perf filed the samples under (`trampoline`) |
/// | | `len` | every sample IP lies past that symbol's image and less than `len` bytes from its start |
/// | `ksymbol-overlap` | `trampoline_len` | one of the two symbols is a trampoline announced with this len |
/// | | `kind` (optional) | that symbol is of this kind instead (`struct-ops`: `check::ranges::symbol_kind`) |
/// | `ksymbol-extent` | `kind` | the symbol's kind (`trampoline`, `struct-ops`) |
/// | | `len` | the record's len, larger than the symbol's extent |
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Signature {
    /// The fault class: [`Detail`]'s variant, kebab-case.
    pub fault: String,
    /// `oversized-record`: record types.
    #[serde(default)]
    pub record_types: Option<Vec<String>>,
    /// `oversized-record`: readers.
    #[serde(default)]
    pub readers: Option<Vec<String>>,
    /// `oversized-record`: the excess's shape.
    #[serde(default)]
    pub excess: Option<String>,
    /// `interpreted-symbol`: the record's len.
    #[serde(default)]
    pub len: Option<u32>,
    /// `interpreted-symbol`: the record's name.
    #[serde(default)]
    pub name: Option<String>,
    /// `interpreted-symbol`: whether the address is the kernel's own text.
    #[serde(default)]
    pub kernel_text: Option<bool>,
    /// `synthesised-ksymbol`: the fields that differ.
    #[serde(default)]
    pub fields: Option<Vec<String>>,
    /// `synthesised-ksymbol`: whether perf's name uses `prog_tags[0]`.
    #[serde(default)]
    pub first_function_tag: Option<bool>,
    /// `kernel-report`: the report's title.
    #[serde(default)]
    pub title: Option<String>,
    /// `kernel-report`: its first frames.
    #[serde(default)]
    pub frames: Option<Vec<String>>,
    /// `fault-recovery`: the sweep's target kind.
    #[serde(default)]
    pub target: Option<String>,
    /// `fault-recovery`: the clean attempt's errno name.
    #[serde(default)]
    pub errno: Option<String>,
    /// `ksymbol-overlap`: one of the two symbols is a trampoline announced
    /// with this len (registered or live).
    #[serde(default)]
    pub trampoline_len: Option<u32>,
    /// `ksymbol-extent`: what the symbol is (`trampoline`, `struct-ops`);
    /// `misattributed-sample`: what perf filed the samples under;
    /// `ksymbol-overlap`, optional: what the side announced with
    /// `trampoline_len` is (`trampoline` when not given; `struct-ops` for
    /// a struct_ops trampoline, `check::ranges::symbol_kind`).
    #[serde(default)]
    pub kind: Option<String>,
}

/// The fault classes a signature may name, with the fields each needs.
pub const FAULTS: &[(&str, &[&str])] = &[
    ("oversized-record", &["record_types", "readers", "excess"]),
    ("interpreted-symbol", &["len", "name", "kernel_text"]),
    ("synthesised-ksymbol", &["fields", "first_function_tag"]),
    ("kernel-report", &["title", "frames"]),
    ("fault-recovery", &["target", "errno"]),
    ("ksymbol-overlap", &["trampoline_len"]),
    ("ksymbol-extent", &["kind", "len"]),
    ("misattributed-sample", &["kind", "len"]),
];

/// The fields a fault's signature may give beyond those it needs.
pub const OPTIONAL: &[(&str, &[&str])] = &[("ksymbol-overlap", &["kind"])];

/// The one excess shape `oversized-record` knows.
pub const ACCUMULATED_TRAILERS: &str = "accumulated-trailers";

impl Signature {
    fn given(&self) -> Vec<&'static str> {
        [
            ("record_types", self.record_types.is_some()),
            ("readers", self.readers.is_some()),
            ("excess", self.excess.is_some()),
            ("len", self.len.is_some()),
            ("name", self.name.is_some()),
            ("kernel_text", self.kernel_text.is_some()),
            ("fields", self.fields.is_some()),
            ("first_function_tag", self.first_function_tag.is_some()),
            ("title", self.title.is_some()),
            ("frames", self.frames.is_some()),
            ("target", self.target.is_some()),
            ("errno", self.errno.is_some()),
            ("trampoline_len", self.trampoline_len.is_some()),
            ("kind", self.kind.is_some()),
        ]
        .into_iter()
        .filter_map(|(f, given)| given.then_some(f))
        .collect()
    }

    /// What is wrong with it, if anything.
    fn problems(&self) -> Vec<String> {
        let Some((_, needs)) = FAULTS.iter().find(|(f, _)| *f == self.fault) else {
            return vec![format!(
                "signature fault `{}` is unknown; faults: {}",
                self.fault,
                FAULTS
                    .iter()
                    .map(|(f, _)| *f)
                    .collect::<Vec<_>>()
                    .join(", ")
            )];
        };
        let given = self.given();
        let mut out = Vec::new();
        for n in *needs {
            if !given.contains(n) {
                out.push(format!("signature `{}` needs `{n}`", self.fault));
            }
        }
        let optional = OPTIONAL
            .iter()
            .find(|(f, _)| *f == self.fault)
            .map_or(&[][..], |(_, o)| *o);
        for g in &given {
            if !needs.contains(g) && !optional.contains(g) {
                out.push(format!(
                    "signature `{}` has no field `{g}` (it has {})",
                    self.fault,
                    needs.join(", ")
                ));
            }
        }
        if let Some(e) = &self.excess {
            if e != ACCUMULATED_TRAILERS {
                out.push(format!(
                    "signature excess `{e}` is unknown; the one shape is `{ACCUMULATED_TRAILERS}`"
                ));
            }
        }
        for r in self.readers.iter().flatten() {
            if r != "kloop" && r != "perf" {
                out.push(format!(
                    "signature reader `{r}` is neither `kloop` nor `perf`"
                ));
            }
        }
        for l in [&self.record_types, &self.readers, &self.fields]
            .into_iter()
            .flatten()
        {
            if l.is_empty() {
                out.push(format!("signature `{}` has an empty list", self.fault));
            }
        }
        out
    }

    /// Does a violation with these typed fields look like this bug?
    pub fn matches(&self, detail: Option<&Detail>) -> bool {
        let Some(detail) = detail else {
            return false;
        };
        match detail {
            Detail::OversizedRecord(o) if self.fault == "oversized-record" => {
                let reader = if o.reader == "perf" { "perf" } else { "kloop" };
                self.record_types
                    .as_ref()
                    .is_some_and(|t| t.contains(&o.record_type))
                    && self
                        .readers
                        .as_ref()
                        .is_some_and(|r| r.iter().any(|x| x == reader))
                    && self.excess.as_deref() == Some(ACCUMULATED_TRAILERS)
                    && o.accumulation.as_ref().is_some_and(|a| a.explained)
            }
            Detail::InterpretedSymbol(i) if self.fault == "interpreted-symbol" => {
                self.len == Some(i.len)
                    && self.name.as_deref() == Some(i.name.as_str())
                    && self.kernel_text == Some(i.kernel_text)
            }
            Detail::SynthesisedKsymbol(s) if self.fault == "synthesised-ksymbol" => {
                self.fields.as_ref() == Some(&s.fields)
                    && self.first_function_tag == Some(s.first_function_tag)
            }
            Detail::KernelReport(k) if self.fault == "kernel-report" => {
                self.title.as_ref() == Some(&k.title) && self.frames.as_ref() == Some(&k.frames)
            }
            Detail::FaultRecovery(f) if self.fault == "fault-recovery" => {
                self.target.as_ref() == Some(&f.target) && self.errno.as_ref() == Some(&f.errno)
            }
            Detail::KsymbolOverlap(o) if self.fault == "ksymbol-overlap" => {
                let page = self.trampoline_len;
                let kind = self.kind.as_deref().unwrap_or("trampoline");
                (o.registered == kind && Some(o.registered_len) == page)
                    || (o.live == kind && Some(o.live_len) == page)
            }
            Detail::KsymbolExtent(e) if self.fault == "ksymbol-extent" => {
                self.kind.as_ref() == Some(&e.kind) && self.len == Some(e.len) && e.extent < e.len
            }
            // Every IP past the symbol's own image and inside the `len`
            // bytes its KSYMBOL announced: the announcement, not perf,
            // put them there.
            Detail::MisattributedSample(m) if self.fault == "misattributed-sample" => {
                self.kind.as_ref() == Some(&m.attributed)
                    && match (m.offsets, m.extent, self.len) {
                        (Some((lo, hi)), Some(extent), Some(len)) => {
                            lo >= u64::from(extent) && hi < u64::from(len)
                        }
                        _ => false,
                    }
            }
            _ => false,
        }
    }
}

/// A ledger entry's sign in a host's perf.data: the `check-perf-data`
/// rule its findings break and where the bug lives — the kernel releases
/// known to have it (a kernel bug), the perf versions (a perf bug), or
/// both (a perf bug that shows only on kernels that emit what it
/// misreads). Each list given must hold the file's version.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PerfDataSign {
    /// The `check-perf-data` rule (`header-size`).
    pub rule: String,
    /// Kernel version ranges `A..B` (A ≤ version < B, `x.y[.z]`), or `A..`
    /// for no known end, with the bug; empty: any kernel.
    #[serde(default)]
    pub kernels: Vec<String>,
    /// The same for the perf that wrote the file (its `HEADER_VERSION`);
    /// empty: any perf.
    #[serde(default)]
    pub perf: Vec<String>,
    /// Where the bounds come from (the source, a bisection, pins, hosts).
    pub bounds: String,
}

/// A kernel version `x.y.z` as numbers (`6.12.107+deb13-cloud-amd64` is
/// 6.12.107, `6.1.0-50-cloud-amd64` is 6.1.0: Debian's ABI name, the series
/// is what counts there); `None` if it does not start with `x.y`.
pub fn kernel_version(release: &str) -> Option<(u32, u32, u32)> {
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let rest = release.get(release.find('.')? + 1..)?;
    let mut nums = rest
        .split(|c: char| !c.is_ascii_digit() && c != '.')
        .next()?
        .split('.');
    let minor = nums.next()?.parse().ok()?;
    let patch = nums.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    Some((major, minor, patch))
}

/// Is `version` inside one of `ranges`? `None`: a range or the version
/// does not read as a version.
fn in_ranges(ranges: &[String], version: &str) -> Option<bool> {
    let v = kernel_version(version)?;
    let mut hit = false;
    for r in ranges {
        let (lo, hi) = r.split_once("..")?;
        let lo = kernel_version(lo.trim())?;
        let hi = match hi.trim() {
            "" => None,
            h => Some(kernel_version(h)?),
        };
        hit |= lo <= v && hi.is_none_or(|h| v < h);
    }
    Some(hit)
}

impl PerfDataSign {
    /// Is a file of kernel `release` (`uname -r`) written by perf
    /// `perf_version` inside the sign's ranges? `None`: a range or a
    /// version it needs does not read as a version (or is unknown).
    pub fn affects(&self, release: &str, perf_version: Option<&str>) -> Option<bool> {
        let kernel = if self.kernels.is_empty() {
            true
        } else {
            in_ranges(&self.kernels, release)?
        };
        let perf = if self.perf.is_empty() {
            true
        } else {
            in_ranges(&self.perf, perf_version?)?
        };
        Some(kernel && perf)
    }

    /// Its ranges as a reader sees them (`kernels 5.1..6.12.113; perf 5.1..`).
    pub fn ranges(&self) -> String {
        let mut parts = Vec::new();
        if !self.kernels.is_empty() {
            parts.push(format!("kernels {}", self.kernels.join(", ")));
        }
        if !self.perf.is_empty() {
            parts.push(format!("perf {}", self.perf.join(", ")));
        }
        parts.join("; ")
    }
}

impl Ledger {
    /// Is `id` an entry that only excuses ([`Issue::only_excuses`])?
    pub fn only_excuses(&self, id: &str) -> bool {
        self.issues.iter().any(|i| i.id == id && i.only_excuses())
    }

    /// The entry whose perf.data sign has `rule`, and whether the ledger
    /// says a file of kernel `release` written by `perf_version` has that
    /// bug.
    pub fn perf_data_sign(
        &self,
        rule: &str,
        release: &str,
        perf_version: Option<&str>,
    ) -> Option<(&Issue, Option<bool>)> {
        self.issues.iter().find_map(|i| {
            let sign = i.perf_data.as_ref().filter(|s| s.rule == rule)?;
            Some((i, sign.affects(release, perf_version)))
        })
    }
}

/// One `validate` of a fix, as `[[issue.fix]]` in the ledger.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FixRecord {
    /// The patch, relative to the workspace
    /// (`kernels/fixes/<id>/linux-source-6.12.patch`).
    pub patch: String,
    /// The source it was applied to, with its version.
    pub source: String,
    /// `FIXED` (validate accepted it: the entry's scenarios FIXED, every
    /// other scenario SAME) or `REJECTED`.
    pub result: String,
    /// The scenarios that came out FIXED for this entry.
    #[serde(default)]
    pub scenarios: Vec<String>,
    /// When (`YYYY-MM-DD`).
    pub validated: String,
    /// The run directory holding the A/B report (`ab.json`); run
    /// directories are pruned, so the counts are kept in `summary`.
    pub run: String,
    /// The A/B's counts (`40 scenario(s): 38 same, 1 fixed, …`).
    #[serde(default)]
    pub summary: String,
    /// Patches of other fixes applied beneath it, on the baseline and the
    /// candidate alike (the fix folder's `fix.toml`).
    #[serde(default)]
    pub base: Vec<String>,
}

/// Components a ledger entry may blame.
pub const COMPONENTS: &[&str] = &["kernel", "perf"];

fn default_component() -> String {
    "kernel".into()
}

impl Issue {
    /// Does this entry speak about `pin` × `scenario`?
    pub fn applies(&self, pin: &str, scenario: &str) -> bool {
        self.pins.iter().any(|p| p == pin)
            && (self.scenarios.is_empty() || self.scenarios.iter().any(|s| s == scenario))
    }

    /// Is `v` this bug: its rule, and typed fields one of the entry's
    /// signatures names? Another violation of the same rule is not.
    pub fn covers(&self, v: &Violation) -> bool {
        self.rule == v.rule && self.signatures.iter().any(|s| s.matches(v.detail.as_ref()))
    }

    /// Must `pin` × `scenario` reproduce it (the entry names the scenario)?
    pub fn expected(&self, pin: &str, scenario: &str) -> bool {
        self.pins.iter().any(|p| p == pin) && self.scenarios.iter().any(|s| s == scenario)
    }

    /// Does the entry only excuse (it names no scenario)? Its fault may show
    /// in one run and not the next (where a run's layout puts it), so it is
    /// never expected: its showing or going is no change, fix or flake.
    pub fn only_excuses(&self) -> bool {
        self.scenarios.is_empty()
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LedgerFile {
    #[serde(default)]
    issue: Vec<Issue>,
}

/// What the ledger may refer to.
#[derive(Debug, Clone, Default)]
pub struct Vocabulary {
    /// Known pin ids.
    pub pins: Vec<String>,
    /// Known rule names.
    pub rules: Vec<String>,
    /// Known scenario names; empty: scenario names are not checked.
    pub scenarios: Vec<String>,
}

/// The parsed ledger.
#[derive(Debug, Clone, Default)]
pub struct Ledger {
    /// Its entries, in file order.
    pub issues: Vec<Issue>,
    /// Where it was read from (none: empty, no file).
    pub path: Option<PathBuf>,
}

/// A civil date, `YYYY-MM-DD`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Date {
    /// The year.
    pub year: i32,
    /// 1 to 12.
    pub month: u32,
    /// 1 to 31.
    pub day: u32,
}

impl Date {
    /// A `YYYY-MM-DD` date, if it is a real one.
    pub fn parse(s: &str) -> Option<Date> {
        let mut it = s.split('-');
        let (y, m, d) = (it.next()?, it.next()?, it.next()?);
        if it.next().is_some() || y.len() != 4 || m.len() != 2 || d.len() != 2 {
            return None;
        }
        let date = Date {
            year: y.parse().ok()?,
            month: m.parse().ok()?,
            day: d.parse().ok()?,
        };
        let leap = (date.year % 4 == 0 && date.year % 100 != 0) || date.year % 400 == 0;
        let days = match date.month {
            1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
            4 | 6 | 9 | 11 => 30,
            2 if leap => 29,
            2 => 28,
            _ => return None,
        };
        (1..=days).contains(&date.day).then_some(date)
    }

    /// Today in UTC.
    pub fn today() -> Date {
        let secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        Date::from_days((secs / 86_400) as i64)
    }

    /// The date `days` days after 1970-01-01 (Howard Hinnant's
    /// civil-from-days).
    pub fn from_days(days: i64) -> Date {
        let z = days + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z.rem_euclid(146_097);
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
        let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
        let year = (yoe + era * 400 + i64::from(month <= 2)) as i32;
        Date { year, month, day }
    }
}

impl std::fmt::Display for Date {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:04}-{:02}-{:02}", self.year, self.month, self.day)
    }
}

/// How the ledger sees one trial's violations.
#[derive(Debug, Default)]
pub struct Judgement<'a> {
    /// Violations no entry covers: the trial fails as usual.
    pub uncovered: Vec<&'a Violation>,
    /// Entries that explain some of the violations, with those violations.
    pub known: Vec<(&'a Issue, Vec<&'a Violation>)>,
    /// Entries naming this scenario whose rule was not broken.
    pub fixed: Vec<&'a Issue>,
}

impl Ledger {
    /// The ledger of the file at `path` (`<kernels>/known-issues.toml`)
    /// whose text is `text`; no file (`None`) is an empty ledger. The
    /// running side reads the file.
    pub fn of_file(
        path: &Path,
        text: Option<&str>,
        vocab: &Vocabulary,
    ) -> Result<Ledger, LedgerError> {
        let Some(text) = text else {
            return Ok(Ledger::default());
        };
        let mut ledger = Ledger::parse(text, path, vocab)?;
        ledger.path = Some(path.to_path_buf());
        Ok(ledger)
    }

    /// Parses and validates ledger text (`origin` names it in errors).
    pub fn parse(text: &str, origin: &Path, vocab: &Vocabulary) -> Result<Ledger, LedgerError> {
        let file: LedgerFile = toml::from_str(text).map_err(|e| LedgerError::Parse {
            path: origin.to_path_buf(),
            message: e.to_string(),
        })?;
        let problems = validate(&file.issue, vocab);
        if !problems.is_empty() {
            return Err(LedgerError::Invalid {
                path: origin.to_path_buf(),
                problems,
            });
        }
        Ok(Ledger {
            issues: file.issue,
            path: Some(origin.to_path_buf()),
        })
    }

    /// One warning line per entry past its `review_by` date.
    pub fn warnings(&self, today: Date) -> Vec<String> {
        let file = self
            .path
            .as_ref()
            .map_or_else(|| FILE_NAME.to_string(), |p| p.display().to_string());
        self.issues
            .iter()
            .filter_map(|i| {
                let due = Date::parse(&i.review_by)?;
                (due < today).then(|| {
                    format!(
                        "warning: known issue `{}` ({}, pins {}) was due for review on {due}: \
                         check whether it still reproduces and update or remove it in {file}",
                        i.id,
                        i.rule,
                        i.pins.join(", ")
                    )
                })
            })
            .collect()
    }

    /// Sorts `violations` of a trial on `pin` × `scenario` into covered,
    /// uncovered and no-longer-reproduced entries.
    pub fn judge<'a>(
        &'a self,
        pin: &str,
        scenario: &str,
        violations: &'a [Violation],
    ) -> Judgement<'a> {
        let applicable: Vec<&Issue> = self
            .issues
            .iter()
            .filter(|i| i.applies(pin, scenario))
            .collect();
        let mut j = Judgement::default();
        for v in violations {
            if !applicable.iter().any(|i| i.covers(v)) {
                j.uncovered.push(v);
            }
        }
        // An entry that only excuses (no scenario) takes the violations no
        // entry naming this scenario covers: where the strict entry explains
        // a fault, the excuse is not the explanation.
        let strict: Vec<&Issue> = applicable
            .iter()
            .copied()
            .filter(|i| !i.only_excuses())
            .collect();
        for i in applicable {
            let hits: Vec<&Violation> = violations
                .iter()
                .filter(|v| i.covers(v))
                .filter(|v| !i.only_excuses() || !strict.iter().any(|s| s.covers(v)))
                .collect();
            if !hits.is_empty() {
                j.known.push((i, hits));
            } else if i.expected(pin, scenario) {
                j.fixed.push(i);
            }
        }
        j
    }
}

fn is_kebab(s: &str) -> bool {
    !s.is_empty()
        && !s.starts_with('-')
        && !s.ends_with('-')
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

/// An entry's rule, pins and scenarios, held to the names the project
/// knows.
fn vocabulary_problems(who: &str, i: &Issue, vocab: &Vocabulary) -> Vec<String> {
    let mut problems = Vec::new();
    if !vocab.rules.contains(&i.rule) {
        problems.push(format!(
            "{who}: unknown rule `{}`; rules: {}",
            i.rule,
            vocab.rules.join(", ")
        ));
    }
    if i.pins.is_empty() {
        problems.push(format!("{who}: pins is empty (name the affected pins)"));
    }
    for p in &i.pins {
        if !vocab.pins.iter().any(|k| k == p) {
            problems.push(format!(
                "{who}: unknown pin `{p}`; pins: {}",
                vocab.pins.join(", ")
            ));
        }
    }
    if !vocab.scenarios.is_empty() {
        for s in &i.scenarios {
            if !vocab.scenarios.iter().any(|k| k == s) {
                problems.push(format!(
                    "{who}: unknown scenario `{s}`; scenarios: {}",
                    vocab.scenarios.join(", ")
                ));
            }
        }
    }
    problems
}

/// An entry's `[issue.perf_data]` sign: it names kernels or perf versions,
/// as version ranges.
fn perf_data_problems(who: &str, sign: &PerfDataSign) -> Vec<String> {
    let mut problems = Vec::new();
    if sign.kernels.is_empty() && sign.perf.is_empty() {
        problems.push(format!(
            "{who}: perf_data names neither kernels nor perf versions"
        ));
    }
    for (what, ranges) in [("kernels", &sign.kernels), ("perf", &sign.perf)] {
        if !ranges.is_empty() && in_ranges(ranges, "1.0").is_none() {
            problems.push(format!(
                "{who}: perf_data.{what} must be ranges `A..B` or `A..` of versions x.y[.z]"
            ));
        }
    }
    problems
}

fn validate(issues: &[Issue], vocab: &Vocabulary) -> Vec<String> {
    let mut problems = Vec::new();
    let mut ids = BTreeSet::new();
    for (n, i) in issues.iter().enumerate() {
        let who = if i.id.is_empty() {
            format!("issue #{}", n + 1)
        } else {
            format!("issue `{}`", i.id)
        };
        if !is_kebab(&i.id) {
            problems.push(format!(
                "{who}: id must be lowercase kebab-case (a-z, 0-9, -)"
            ));
        }
        if !ids.insert(i.id.as_str()) {
            problems.push(format!("{who}: id used twice"));
        }
        problems.extend(vocabulary_problems(&who, i, vocab));
        if i.signatures.is_empty() {
            problems.push(format!(
                "{who}: no [[issue.signature]] (say what its violations look like: a signature's fault and fields)"
            ));
        }
        for sig in &i.signatures {
            for p in sig.problems() {
                problems.push(format!("{who}: {p}"));
            }
        }
        if let Some(sign) = &i.perf_data {
            problems.extend(perf_data_problems(&who, sign));
        }
        if Date::parse(&i.review_by).is_none() {
            problems.push(format!(
                "{who}: review_by {:?} is not a date YYYY-MM-DD",
                i.review_by
            ));
        }
        if !COMPONENTS.contains(&i.component.as_str()) {
            problems.push(format!(
                "{who}: unknown component `{}`; components: {}",
                i.component,
                COMPONENTS.join(", ")
            ));
        }
        if i.summary.trim().is_empty() {
            problems.push(format!("{who}: summary is empty"));
        }
        if i.evidence.trim().is_empty() {
            problems.push(format!(
                "{who}: evidence is empty (quote the records of a real run)"
            ));
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::rule;

    fn vocab() -> Vocabulary {
        Vocabulary {
            pins: ["5.10", "6.1", "6.12", "7.2", "7.3"]
                .map(String::from)
                .to_vec(),
            rules: rule_names().into_iter().map(String::from).collect(),
            scenarios: ["basic", "many-listeners", "subprogs"]
                .map(String::from)
                .to_vec(),
        }
    }

    const ENTRY: &str = r#"
[[issue]]
id = "sideband-size-grows"
rule = "parse"
scenarios = ["many-listeners"]
pins = ["5.10", "6.1"]
summary = "header.size grows"
evidence = """KSYMBOL size 0x58"""
upstream_fix = ""
review_by = "2027-05-21"

[[issue.signature]]
fault = "oversized-record"
record_types = ["KSYMBOL", "BPF_EVENT"]
readers = ["kloop"]
excess = "accumulated-trailers"

[[issue]]
id = "lost-anywhere"
rule = "load-symbols"
pins = ["6.12"]
summary = "registers the interpreter"
evidence = "KSYMBOL len 0"
review_by = "2020-01-01"

[[issue.signature]]
fault = "interpreted-symbol"
len = 0
name = ""
kernel_text = true
"#;

    fn ledger() -> Ledger {
        Ledger::parse(ENTRY, Path::new("known-issues.toml"), &vocab()).unwrap()
    }

    fn v(rule: &'static str) -> Violation {
        Violation::new(rule, format!("a {rule} violation"))
    }

    /// An oversized KSYMBOL of listener `l` with `excess`, explained or not.
    fn grown(l: u32, excess: u32, explained: bool) -> Violation {
        let mut v = Violation::new(rule::PARSE, format!("L{l} KSYMBOL {excess} bytes too long"))
            .at(l, Some(0))
            .with(Detail::OversizedRecord(
                crate::check::detail::OversizedRecord {
                    reader: format!("L{l}"),
                    record_type: "KSYMBOL".into(),
                    size: 96 + excess,
                    trailer_len: 24,
                    excess,
                    accumulation: Some(crate::check::detail::Accumulation {
                        before: vec![("L5".into(), 24)],
                        unseen: Vec::new(),
                        explained,
                    }),
                },
            ));
        v.offset = Some(u64::from(excess));
        v
    }

    fn interpreted(len: u32, name: &str, kernel_text: bool) -> Violation {
        Violation::new(
            rule::LOAD_SYMBOLS,
            "KSYMBOL register of an interpreted program",
        )
        .with(Detail::InterpretedSymbol(
            crate::check::detail::InterpretedSymbol {
                event: "register".into(),
                addr: 0xffff_ffff_84df_6230,
                len,
                name: name.into(),
                kernel_text,
                kernel_symbol: None,
            },
        ))
    }

    fn invalid(text: &str) -> String {
        match Ledger::parse(text, Path::new("k.toml"), &vocab()) {
            Err(e @ LedgerError::Invalid { .. }) => e.to_string(),
            other => panic!("expected invalid, got {other:?}"),
        }
    }

    #[test]
    fn a_perf_data_sign_reads_releases_as_versions() {
        assert_eq!(
            kernel_version("6.12.107+deb13-cloud-amd64"),
            Some((6, 12, 107))
        );
        assert_eq!(kernel_version("6.1.0-50-cloud-amd64"), Some((6, 1, 0)));
        assert_eq!(kernel_version("6.18.44-fc-v657"), Some((6, 18, 44)));
        assert_eq!(kernel_version("7.3"), Some((7, 3, 0)));
        assert_eq!(kernel_version("linux"), None);
        let sign = PerfDataSign {
            rule: "header-size".into(),
            kernels: vec!["5.1..6.12.113".into(), "6.13..7.2".into()],
            perf: Vec::new(),
            bounds: String::new(),
        };
        let any_perf = |r: &str| sign.affects(r, None);
        assert_eq!(any_perf("5.10.0-32-cloud-amd64"), Some(true));
        assert_eq!(any_perf("6.12.111+deb13-cloud-amd64"), Some(true));
        assert_eq!(any_perf("6.12.113+deb13-cloud-amd64"), Some(false));
        assert_eq!(any_perf("6.18.44-fc-v657"), Some(true));
        assert_eq!(any_perf("7.2.0"), Some(false));
        assert_eq!(any_perf("4.19.0"), Some(false));
        assert_eq!(any_perf("?"), None);
        let open = PerfDataSign {
            kernels: vec!["6.1..".into()],
            ..sign.clone()
        };
        assert_eq!(open.affects("9.0", None), Some(true));
        // A perf bug: keyed on perf's version, and the kernel's too when
        // both are given; an unknown perf version is no match.
        let perf_bug = PerfDataSign {
            kernels: vec!["6.1..".into()],
            perf: vec!["5.1..6.20".into()],
            ..sign
        };
        assert_eq!(perf_bug.affects("6.12.107", Some("6.1.192")), Some(true));
        assert_eq!(perf_bug.affects("6.12.107", Some("6.20.1")), Some(false));
        assert_eq!(perf_bug.affects("5.10.0-32", Some("6.1.192")), Some(false));
        assert_eq!(perf_bug.affects("6.12.107", None), None);
        assert_eq!(perf_bug.ranges(), "kernels 6.1..; perf 5.1..6.20");
    }

    #[test]
    fn parses_and_the_empty_file_is_an_empty_ledger() {
        assert_eq!(ledger().issues.len(), 2);
        let empty = Ledger::parse("# nothing yet\n", Path::new("k.toml"), &vocab()).unwrap();
        assert!(empty.issues.is_empty());
        let none = Ledger::of_file(Path::new("kernels/known-issues.toml"), None, &vocab()).unwrap();
        assert!(none.issues.is_empty() && none.path.is_none());
    }

    #[test]
    fn validation_names_every_problem() {
        let bad = ENTRY
            .replace("\"5.10\", \"6.1\"", "\"5.10\", \"4.19\"")
            .replace("rule = \"load-symbols\"", "rule = \"lots\"")
            .replace("2027-05-21", "2027-02-30")
            .replace("many-listeners\"]", "many-listener\"]");
        let msg = invalid(&bad);
        assert!(msg.contains("unknown pin `4.19`"), "{msg}");
        assert!(msg.contains("unknown rule `lots`"), "{msg}");
        assert!(msg.contains("\"2027-02-30\" is not a date"), "{msg}");
        assert!(msg.contains("unknown scenario `many-listener`"), "{msg}");
        let dup = ENTRY.replace("lost-anywhere", "sideband-size-grows");
        assert!(invalid(&dup).contains("id used twice"));
        assert!(invalid(&ENTRY.replace("lost-anywhere", "Lost_Anywhere")).contains("kebab-case"));
        assert!(
            invalid(&ENTRY.replace("\"KSYMBOL len 0\"", "\"  \"")).contains("evidence is empty")
        );
        let gcc = ENTRY.replace(
            "pins = [\"6.12\"]",
            "pins = [\"6.12\"]\ncomponent = \"gcc\"",
        );
        assert!(invalid(&gcc).contains("unknown component `gcc`"));
        let perf = ENTRY.replace(
            "pins = [\"6.12\"]",
            "pins = [\"6.12\"]\ncomponent = \"perf\"",
        );
        let l = Ledger::parse(&perf, Path::new("k.toml"), &vocab()).unwrap();
        assert_eq!(l.issues[0].component, "kernel");
        assert_eq!(l.issues[1].component, "perf");
        let typo = ENTRY.replace("upstream_fix", "upstream_fixed");
        assert!(matches!(
            Ledger::parse(&typo, Path::new("k.toml"), &vocab()),
            Err(LedgerError::Parse { .. })
        ));
    }

    #[test]
    fn rule_list_is_extensible() {
        let names = rule_names();
        for r in rule::ALL {
            assert!(names.contains(r));
        }
        let mut vocab = vocab();
        let text = ENTRY.replace("rule = \"load-symbols\"", "rule = \"perf-script\"");
        assert!(Ledger::parse(&text, Path::new("k.toml"), &vocab).is_err());
        vocab.rules.push("perf-script".into());
        assert!(Ledger::parse(&text, Path::new("k.toml"), &vocab).is_ok());
    }

    #[test]
    fn expired_entries_warn_by_name() {
        let l = ledger();
        let w = l.warnings(Date::parse("2026-11-21").unwrap());
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].contains("`lost-anywhere`") && w[0].contains("2020-01-01"));
        assert_eq!(l.warnings(Date::parse("2019-12-31").unwrap()).len(), 0);
        assert_eq!(l.warnings(Date::parse("2027-05-22").unwrap()).len(), 2);
    }

    #[test]
    fn matching_covers_only_listed_pin_scenario_rule_and_signature() {
        let l = ledger();
        let vs = [grown(1, 24, true), grown(3, 64, true)];
        let j = l.judge("6.1", "many-listeners", &vs);
        assert!(j.uncovered.is_empty() && j.fixed.is_empty());
        assert_eq!(j.known.len(), 1);
        assert_eq!(j.known[0].0.id, "sideband-size-grows");
        assert_eq!(j.known[0].1.len(), 2);
        // Another pin, another scenario: not covered.
        assert_eq!(l.judge("6.12", "many-listeners", &vs).uncovered.len(), 2);
        assert_eq!(l.judge("6.1", "basic", &vs).uncovered.len(), 2);
        // The same rule, another fault: not covered, and shown beside the
        // known one.
        let second = [grown(1, 24, true), v(rule::PARSE), grown(8, 96, false)];
        let j = l.judge("6.1", "many-listeners", &second);
        assert_eq!(j.uncovered.len(), 2, "{:?}", j.uncovered);
        assert!(j.uncovered[0].detail.is_none());
        assert_eq!(j.uncovered[1].listener, Some(8));
        assert_eq!(j.known.len(), 1);
        assert_eq!(j.known[0].1.len(), 1);
        // Another rule beside it: not covered.
        let mixed = [grown(1, 24, true), v(rule::LOAD_SYMBOLS)];
        let j = l.judge("6.1", "many-listeners", &mixed);
        assert_eq!(j.uncovered.len(), 1);
        assert_eq!(j.uncovered[0].rule, rule::LOAD_SYMBOLS);
        // An entry without scenarios covers its signature in any scenario,
        // and only its signature.
        let interp = [interpreted(0, "", true)];
        let j = l.judge("6.12", "basic", &interp);
        assert!(j.uncovered.is_empty());
        assert_eq!(j.known[0].0.id, "lost-anywhere");
        for other in [
            interpreted(8, "", true),
            interpreted(0, "bpf_prog_x", true),
            interpreted(0, "", false),
        ] {
            let j = l.judge("6.12", "basic", std::slice::from_ref(&other));
            assert_eq!(j.uncovered.len(), 1, "{:?}", other.detail);
        }
    }

    #[test]
    fn signatures_are_validated() {
        let no_sig = ENTRY.replace(
            "[[issue.signature]]\nfault = \"interpreted-symbol\"\nlen = 0\nname = \"\"\nkernel_text = true\n",
            "",
        );
        assert!(invalid(&no_sig).contains("`lost-anywhere`: no [[issue.signature]]"));
        let unknown = ENTRY.replace("fault = \"interpreted-symbol\"", "fault = \"bad-symbol\"");
        assert!(invalid(&unknown).contains("signature fault `bad-symbol` is unknown"));
        let missing = ENTRY.replace("kernel_text = true\n", "");
        assert!(invalid(&missing).contains("signature `interpreted-symbol` needs `kernel_text`"));
        let foreign = ENTRY.replace("len = 0\n", "len = 0\nexcess = \"accumulated-trailers\"\n");
        assert!(invalid(&foreign).contains("signature `interpreted-symbol` has no field `excess`"));
        let shape = ENTRY.replace("excess = \"accumulated-trailers\"", "excess = \"any\"");
        assert!(invalid(&shape).contains("signature excess `any` is unknown"));
        let reader = ENTRY.replace("readers = [\"kloop\"]", "readers = [\"bpftrace\"]");
        assert!(invalid(&reader).contains("signature reader `bpftrace`"));
    }

    #[test]
    fn a_fault_recovery_signature_covers_its_target_and_errno_only() {
        let entry = r#"
[[issue]]
id = "stuck-attach"
rule = "fault-recovery"
scenarios = ["basic"]
pins = ["5.10"]
summary = "a failed trampoline update leaves the program linked"
evidence = "EBUSY"
review_by = "2027-05-21"

[[issue.signature]]
fault = "fault-recovery"
target = "attach"
errno = "EBUSY"
"#;
        let l = Ledger::parse(entry, Path::new("known-issues.toml"), &vocab()).unwrap();
        let stuck = |target: &str, errno: &str| {
            Violation::new(
                crate::fault_recovery::FAULT_RECOVERY,
                "the clean attempt failed",
            )
            .with(Detail::FaultRecovery(crate::check::detail::FaultRecovery {
                target: target.into(),
                errno: errno.into(),
                swept: format!("{target} fentry"),
                attempts: 9,
                failed: 8,
            }))
        };
        let known = [stuck("attach", "EBUSY")];
        let j = l.judge("5.10", "basic", &known);
        assert!(j.uncovered.is_empty() && j.fixed.is_empty());
        assert_eq!(j.known[0].0.id, "stuck-attach");
        // Another errno (a leak that exhausts something: ENOMEM) or
        // another sweep is another bug.
        for other in [stuck("attach", "ENOMEM"), stuck("xdp-attach", "EBUSY")] {
            let j = l.judge("5.10", "basic", std::slice::from_ref(&other));
            assert_eq!(j.uncovered.len(), 1, "{:?}", other.detail);
            assert_eq!(j.fixed.len(), 1, "{:?}", other.detail);
        }
        // The clean attach succeeding is the entry fixed.
        assert_eq!(l.judge("5.10", "basic", &[]).fixed[0].id, "stuck-attach");
        let missing = entry.replace("errno = \"EBUSY\"\n", "");
        let e = Ledger::parse(&missing, Path::new("k.toml"), &vocab())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("signature `fault-recovery` needs `errno`"),
            "{e}"
        );
    }

    #[test]
    fn a_clean_trial_where_an_entry_expects_its_bug_is_fixed() {
        let l = ledger();
        let j = l.judge("5.10", "many-listeners", &[]);
        assert_eq!(j.fixed.len(), 1);
        assert_eq!(j.fixed[0].id, "sideband-size-grows");
        // Other rules failing do not count as the bug showing, nor does
        // the same rule failing another way.
        for other in [v(rule::LOST), grown(1, 32, false)] {
            let j = l.judge("5.10", "many-listeners", std::slice::from_ref(&other));
            assert_eq!(j.fixed.len(), 1);
            assert_eq!(j.uncovered.len(), 1);
        }
        // Not listed there: nothing to confirm.
        assert!(l.judge("6.12", "many-listeners", &[]).fixed.is_empty());
        assert!(l.judge("5.10", "basic", &[]).fixed.is_empty());
        // An entry without scenarios can never be confirmed fixed.
        assert!(l.judge("6.12", "basic", &[]).fixed.is_empty());
    }

    #[test]
    fn dates() {
        assert_eq!(Date::from_days(0).to_string(), "1970-01-01");
        assert_eq!(Date::from_days(20_413).to_string(), "2025-11-21");
        assert_eq!(Date::from_days(-1).to_string(), "1969-12-31");
        assert_eq!(Date::parse("2024-02-29").unwrap().day, 29);
        assert!(Date::parse("2023-02-29").is_none());
        assert!(Date::parse("2023-2-28").is_none());
        assert!(Date::parse("2023-13-01").is_none());
        assert!(Date::parse("2026-11-21").unwrap() < Date::parse("2027-01-01").unwrap());
    }

    /// A strict entry and one that only excuses, for the same fault.
    const STRICT_AND_EXCUSE: &str = r#"
[[issue]]
id = "page-len-overlap"
rule = "ksymbol-overlap"
scenarios = ["basic"]
pins = ["6.12"]
summary = "s"
evidence = "e"
upstream_fix = ""
review_by = "2099-01-01"
[[issue.signature]]
fault = "ksymbol-overlap"
trampoline_len = 4096

[[issue]]
id = "page-len-overlap-by-layout"
rule = "ksymbol-overlap"
scenarios = []
pins = ["6.12"]
summary = "s"
evidence = "e"
upstream_fix = ""
review_by = "2099-01-01"
[[issue.signature]]
fault = "ksymbol-overlap"
trampoline_len = 4096
"#;

    fn overlap(registered: &str, live: &str) -> Violation {
        Violation::new(crate::check::rule::KSYMBOL_OVERLAP, "overlap").with(Detail::KsymbolOverlap(
            crate::check::detail::KsymbolOverlap {
                registered: registered.into(),
                registered_len: if registered == "trampoline" { 4096 } else { 96 },
                live: live.into(),
                live_len: if live == "trampoline" { 4096 } else { 96 },
            },
        ))
    }

    #[test]
    fn an_entry_that_only_excuses_takes_what_no_strict_entry_covers() {
        let l = Ledger::parse(STRICT_AND_EXCUSE, Path::new("k.toml"), &vocab()).unwrap();
        let v = vec![
            overlap("program", "trampoline"),
            overlap("trampoline", "trampoline"),
        ];
        // In the strict entry's scenario: the strict entry alone.
        let j = l.judge("6.12", "basic", &v);
        let ids: Vec<&str> = j.known.iter().map(|(i, _)| i.id.as_str()).collect();
        assert_eq!(ids, ["page-len-overlap"]);
        assert!(j.uncovered.is_empty() && j.fixed.is_empty());
        // Elsewhere: the excuse, which never turns FIXED? where it does
        // not show.
        let j = l.judge("6.12", "subprogs", &v);
        let ids: Vec<&str> = j.known.iter().map(|(i, _)| i.id.as_str()).collect();
        assert_eq!(ids, ["page-len-overlap-by-layout"]);
        assert!(l.judge("6.12", "subprogs", &[]).fixed.is_empty());
        // Another fault of the rule is covered by neither.
        let two_programs = overlap("program", "program");
        assert_eq!(
            l.judge("6.12", "subprogs", std::slice::from_ref(&two_programs))
                .uncovered
                .len(),
            1
        );
        // A strict entry that does not show is FIXED?.
        assert_eq!(l.judge("6.12", "basic", &[]).fixed.len(), 1);
        // Two struct_ops trampolines are neither entry's: they name no kind.
        let struct_ops = overlap("struct-ops", "struct-ops");
        assert_eq!(
            l.judge("6.12", "basic", std::slice::from_ref(&struct_ops))
                .uncovered
                .len(),
            1
        );
    }

    #[test]
    fn an_overlap_signature_may_name_the_kind_announced_with_the_page() {
        let text = STRICT_AND_EXCUSE.replace(
            "[[issue.signature]]\nfault = \"ksymbol-overlap\"\ntrampoline_len = 4096\n\n",
            "[[issue.signature]]\nfault = \"ksymbol-overlap\"\ntrampoline_len = 4096\nkind = \"struct-ops\"\n\n",
        );
        assert_ne!(text, STRICT_AND_EXCUSE);
        let l = Ledger::parse(&text, Path::new("k.toml"), &vocab()).unwrap();
        let mut struct_ops = overlap("struct-ops", "struct-ops");
        if let Some(Detail::KsymbolOverlap(o)) = &mut struct_ops.detail {
            o.registered_len = 4096;
            o.live_len = 4096;
        }
        let j = l.judge("6.12", "basic", std::slice::from_ref(&struct_ops));
        let ids: Vec<&str> = j.known.iter().map(|(i, _)| i.id.as_str()).collect();
        assert_eq!(ids, ["page-len-overlap"]);
        // The strict entry now names struct_ops: a trampoline's overlap in
        // its scenario is the excuse's.
        let tramp = [overlap("program", "trampoline")];
        let j = l.judge("6.12", "basic", &tramp);
        let ids: Vec<&str> = j.known.iter().map(|(i, _)| i.id.as_str()).collect();
        assert_eq!(ids, ["page-len-overlap-by-layout"]);
        // A kind on another fault's signature is still refused.
        let bad = STRICT_AND_EXCUSE.replace(
            "fault = \"ksymbol-overlap\"\ntrampoline_len = 4096\n\n",
            "fault = \"ksymbol-overlap\"\ntrampoline_len = 4096\nlen = 1\n\n",
        );
        assert!(Ledger::parse(&bad, Path::new("k.toml"), &vocab()).is_err());
    }
}
