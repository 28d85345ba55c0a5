//! Skips are expectations: which pin × scenario is `SKIPPED`, and why, is
//! committed in `kernels/expected-skips.toml`. A skip is otherwise whatever
//! the guest's probe says, and a kloop probe bug or a kernel regression in
//! a probed feature would turn a trial `SKIPPED` and leave the run green.
//!
//! Each entry says how it is known:
//! - `config`: the pin's config lacks an option the requirement needs
//!   ([`super::needs::requirement_needs`]), derived;
//! - `release`: the pin's release predates the feature (the release each
//!   feature came in, read from the kernel source: [`since`]), derived;
//! - `probe`: only the guest's probe can tell (a kprobe the kernel refuses
//!   on a function, perf on the host): listed with the probe's answer and
//!   a reason, not derived.
//!
//! `cargo xtask skips --check` derives the `config` and `release` entries
//! from each pin's config and release and compares them with the file
//! (`--write` rewrites it); a pin trial that is `SKIPPED` but not listed
//! (or listed for another requirement) fails the run: "skipped where it is
//! expected to run". A listed skip that now runs is reported on the
//! trial's line.

use std::path::Path;

use kloop_kernels::KernelConfig;
use kloop_path_io::PathIo;
use kloop_protocol::Requirement;
use serde::{Deserialize, Serialize};

use super::needs::{is_met, requirement_needs, state_text};
use super::{requirement_name, Scenario};

/// The file, under the workspace's `kernels/`.
pub const FILE: &str = "expected-skips.toml";

/// How an expected skip is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum By {
    /// The pin's config lacks an option.
    Config,
    /// The pin's release predates the feature.
    Release,
    /// Only the guest's probe can tell.
    Probe,
}

/// One pin × scenario expected to be `SKIPPED`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ExpectedSkip {
    pub pin: String,
    pub scenario: String,
    /// The requirement the skip names (`fault-injection`).
    pub requirement: String,
    pub by: By,
    /// Why, in words: the option, the release, or the probe's answer.
    pub why: String,
}

/// The committed list.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExpectedSkips {
    #[serde(default, rename = "skip")]
    pub skips: Vec<ExpectedSkip>,
}

/// Why the list cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SkipsError {
    #[error(transparent)]
    Io(#[from] PathIo),
    #[error("{path}: {message}")]
    Parse {
        path: std::path::PathBuf,
        message: String,
    },
}

impl ExpectedSkips {
    /// The list in `kernels_dir`; an absent file is an empty list (every
    /// skip then fails, which says what to list).
    pub fn load(kernels_dir: &Path) -> Result<ExpectedSkips, SkipsError> {
        let path = kernels_dir.join(FILE);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Self::default()),
            Err(source) => return Err(PathIo::at("reading", path, source).into()),
        };
        Self::parse(&text).map_err(|message| SkipsError::Parse { path, message })
    }

    /// Parses the file's text.
    pub fn parse(text: &str) -> Result<ExpectedSkips, String> {
        toml::from_str(text).map_err(|e| e.to_string())
    }

    /// The entry for `pin` × `scenario`, if one.
    pub fn find(&self, pin: &str, scenario: &str) -> Option<&ExpectedSkip> {
        self.skips
            .iter()
            .find(|s| s.pin == pin && s.scenario == scenario)
    }

    /// The file's text: a header, then the entries sorted by pin and
    /// scenario.
    pub fn render(&self) -> String {
        let mut skips = self.skips.clone();
        skips.sort_by(|a, b| (&a.pin, &a.scenario).cmp(&(&b.pin, &b.scenario)));
        let mut out = String::from(HEADER);
        for s in skips {
            out.push_str(&format!(
                "\n[[skip]]\npin = {:?}\nscenario = {:?}\nrequirement = {:?}\nby = \"{}\"\nwhy = {:?}\n",
                s.pin,
                s.scenario,
                s.requirement,
                match s.by {
                    By::Config => "config",
                    By::Release => "release",
                    By::Probe => "probe",
                },
                s.why
            ));
        }
        out
    }
}

const HEADER: &str = "\
# Which pin x scenario is SKIPPED, and why (harness/src/scenario/skips.rs).
# `config` and `release` entries are derived from each scenario's `requires`
# and each pin's config and release: `cargo xtask skips --write` rewrites
# them, `cargo xtask skips --check` compares. `probe` entries only the
# guest's probe can decide; they are kept by hand, each with its reason.
# A pin trial SKIPPED but not listed here fails the run.
";

/// The release a requirement's feature came in, `(major, minor)`, and
/// where the kernel source says so; `None`: not a matter of the release.
pub fn since(r: Requirement, arch: kloop_protocol::Arch) -> Option<((u32, u32), &'static str)> {
    match r {
        Requirement::BpfSnprintf => Some((
            (5, 13),
            "the bpf_snprintf helper (%ps in BPF programs) came in 5.13 (kernel/bpf/helpers.c)",
        )),
        Requirement::LongSymbolNames => Some((
            (6, 1),
            "KSYM_NAME_LEN grew from 128 to 512 in 6.1 (include/linux/kallsyms.h)",
        )),
        // arm64's own arch_alloc_bpf_trampoline() came later and at
        // another release: its guest probe decides (the arm64 6.12 pin
        // has it; 5.10 and 6.1 have no trampolines at all).
        Requirement::TrampolinePacks if arch == kloop_protocol::Arch::X86_64 => Some((
            (6, 7),
            "x86 carves trampoline images out of bpf_prog_pack from 6.7 \
             (arch_alloc_bpf_trampoline(), arch/x86/net/bpf_jit_comp.c)",
        )),
        _ => None,
    }
}

/// Whether only the guest's probe can decide `r` (not the config, not the
/// release).
pub fn probe_only(r: Requirement) -> bool {
    matches!(
        r,
        Requirement::SideBandWalkKprobe
            | Requirement::PerfTool
            | Requirement::TwoCpus
            | Requirement::Veth
            | Requirement::LsmBpf
            | Requirement::StructOpsKsyms
    )
}

/// The skip `config` and `release` make certain for `scenario` on the pin
/// `pin`, or `None`. In the order a trial meets them: the preflight reads
/// every requirement's options before any boot
/// ([`super::needs::preflight`]), so the first requirement with an unmet
/// option decides; then the guest's probes, of which the release-bound
/// ones fail first on an older kernel.
pub fn derive(
    pin: &str,
    release: &str,
    config: &KernelConfig,
    scenario: &Scenario,
) -> Option<ExpectedSkip> {
    let entry = |r: Requirement, by: By, why: String| ExpectedSkip {
        pin: pin.to_string(),
        scenario: scenario.name.clone(),
        requirement: requirement_name(r),
        by,
        why,
    };
    for r in &scenario.plan.requires {
        let unmet = requirement_needs(*r)
            .into_iter()
            .find(|n| !is_met(config, n));
        if let Some(n) = unmet {
            let is = state_text(&config.state(n.option));
            return Some(entry(
                *r,
                By::Config,
                format!("{} {is}: {}", n.option, n.why),
            ));
        }
    }
    let version = crate::judge::known_issues::kernel_version(release).map(|(a, b, _)| (a, b))?;
    scenario.plan.requires.iter().find_map(|r| {
        let (at, why) = since(*r, kloop_protocol::Arch::of_id(pin).0)?;
        (version < at).then(|| {
            entry(
                *r,
                By::Release,
                format!("{release} predates {}.{}: {why}", at.0, at.1),
            )
        })
    })
}

/// What a trial's verdict means against the list, for a pin: `Err` with
/// the failure's message when it skipped where it is expected to run (or
/// for another requirement than listed), `Ok(Some(note))` when a listed
/// skip ran, `Ok(None)` when all is as listed.
pub fn judge(
    list: &ExpectedSkips,
    pin: &str,
    scenario: &str,
    skipped: Option<&str>,
) -> Result<Option<String>, String> {
    let listed = list.find(pin, scenario);
    match (skipped, listed) {
        (Some(why), Some(l)) if why.contains(&l.requirement) => Ok(None),
        (Some(why), Some(l)) => Err(format!(
            "skipped for another reason than kernels/{FILE} lists ({}: {}): {why}",
            l.requirement, l.why
        )),
        (Some(why), None) => Err(format!(
            "skipped where it is expected to run ({pin} × {scenario} is not in kernels/{FILE}): \
             {why}; a kloop probe bug or a regression of the kernel's feature — if the pin \
             really lacks it, list it (`cargo xtask skips --write` for a config or release \
             reason)"
        )),
        (None, Some(l)) => Ok(Some(format!(
            "expected to be SKIPPED ({}: {}) but ran: take it out of kernels/{FILE}",
            l.requirement, l.why
        ))),
        (None, None) => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scenario(requires: Vec<Requirement>) -> Scenario {
        super::super::needs::scenario_requiring(requires)
    }

    #[test]
    fn config_and_release_derive_the_skip_of_the_first_unmet_requirement() {
        let c = KernelConfig::parse(
            "CONFIG_DEBUG_INFO_BTF=y\nCONFIG_BPF_JIT=y\nCONFIG_PROC_KCORE=y\n",
            "test .config",
        );
        let s = scenario(vec![Requirement::Btf, Requirement::FaultInjection]);
        let d = derive("6.12", "6.12.107+deb13-cloud-amd64", &c, &s).unwrap();
        assert_eq!(d.by, By::Config);
        assert_eq!(d.requirement, "fault-injection");
        assert!(d.why.starts_with("CONFIG_FAULT_INJECTION not set"), "{d:?}");
        // An unmet option decides before an older release: the preflight
        // reads every option before any probe runs.
        let s = scenario(vec![
            Requirement::TrampolinePacks,
            Requirement::FaultInjection,
        ]);
        let d = derive("5.10", "5.10.0-32-cloud-amd64", &c, &s).unwrap();
        assert_eq!(d.requirement, "fault-injection");
        let s = scenario(vec![Requirement::Btf, Requirement::LongSymbolNames]);
        let d = derive("5.10", "5.10.0-32-cloud-amd64", &c, &s).unwrap();
        assert_eq!(d.by, By::Release);
        assert!(d.why.contains("predates 6.1"), "{d:?}");
        assert_eq!(derive("6.12", "6.12.107+deb13-cloud-amd64", &c, &s), None);
        // A probe-only requirement derives nothing.
        let s = scenario(vec![Requirement::SideBandWalkKprobe]);
        assert_eq!(derive("5.10", "5.10.0-32-cloud-amd64", &c, &s), None);
    }

    #[test]
    fn an_unlisted_skip_fails_and_a_listed_one_that_ran_is_reported() {
        let list = ExpectedSkips {
            skips: vec![ExpectedSkip {
                pin: "5.10".into(),
                scenario: "long-names".into(),
                requirement: "long-symbol-names".into(),
                by: By::Release,
                why: "5.10.0-32-cloud-amd64 predates 6.1".into(),
            }],
        };
        let probe = "long-symbol-names: kernel 5.10.0-32-cloud-amd64 predates 6.1";
        assert_eq!(judge(&list, "5.10", "long-names", Some(probe)), Ok(None));
        let e = judge(&list, "6.1", "long-names", Some(probe)).unwrap_err();
        assert!(e.starts_with("skipped where it is expected to run"), "{e}");
        let e = judge(
            &list,
            "5.10",
            "long-names",
            Some("btf: no /sys/kernel/btf/vmlinux"),
        )
        .unwrap_err();
        assert!(e.starts_with("skipped for another reason"), "{e}");
        let n = judge(&list, "5.10", "long-names", None).unwrap().unwrap();
        assert!(n.contains("but ran"), "{n}");
        assert_eq!(judge(&list, "6.12", "basic", None), Ok(None));
        // The text round-trips.
        assert_eq!(ExpectedSkips::parse(&list.render()).unwrap(), list);
    }

    /// The committed list names real pins, scenarios and requirements, and
    /// each entry's `by` is how its requirement can be known. (That the
    /// `config` and `release` entries are exactly what the pins derive is
    /// the VM suite's `expected-skips/derived`, which has the pins'
    /// configs.)
    #[test]
    fn the_committed_list_names_what_exists_and_says_how_it_is_known() {
        // The workspace root, from this crate's (harness/) manifest.
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("harness/ lives in the workspace root")
            .to_path_buf();
        let list = ExpectedSkips::load(&root.join("kernels")).unwrap();
        assert!(!list.skips.is_empty());
        let catalog = kloop_kernels::Catalog::load_all(&root.join("kernels")).unwrap();
        let all = super::super::load_all(&root.join("scenarios")).unwrap();
        for e in &list.skips {
            assert!(
                catalog.pins().iter().any(|p| p.id == e.pin),
                "{e:?}: no such pin"
            );
            let s = all
                .iter()
                .find(|s| s.name == e.scenario)
                .unwrap_or_else(|| panic!("{e:?}: no such scenario"));
            let r = s
                .plan
                .requires
                .iter()
                .find(|r| requirement_name(**r) == e.requirement)
                .unwrap_or_else(|| panic!("{e:?}: the scenario does not require it"));
            match e.by {
                By::Config => assert!(!requirement_needs(*r).is_empty(), "{e:?}"),
                By::Release => assert!(
                    since(*r, kloop_protocol::Arch::of_id(&e.pin).0).is_some(),
                    "{e:?}"
                ),
                By::Probe => assert!(probe_only(*r), "{e:?}"),
            }
            assert!(!e.why.is_empty());
        }
        // Written as `render` writes it (sorted, one form).
        let text = std::fs::read_to_string(root.join("kernels").join(FILE)).unwrap();
        assert_eq!(text, list.render());
    }
}
