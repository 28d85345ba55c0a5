//! `cargo xtask skips`: the expected skips (`kernels/expected-skips.toml`,
//! [`crate::scenario::skips`]) derived from every pin's config and release
//! and compared with the committed list, or written into it.

use kloop_kernels::{Catalog, KernelCache, KernelError};

use crate::scenario::skips::{self, By, ExpectedSkip, ExpectedSkips, SkipsError};
use crate::scenario::{self, ScenarioError};
use crate::workspace::Layout;

/// Why the list could not be derived.
#[derive(Debug, thiserror::Error)]
pub enum SkipsSessionError {
    #[error(transparent)]
    Kernel(#[from] KernelError),
    #[error(transparent)]
    Scenario(#[from] ScenarioError),
    #[error(transparent)]
    Skips(#[from] SkipsError),
}

/// The derived list next to the committed one.
pub struct Derived {
    /// What the file should hold: every `config` and `release` skip the
    /// pins' configs and releases make certain, and the file's own `probe`
    /// entries.
    pub expected: ExpectedSkips,
    /// What it holds.
    pub committed: ExpectedSkips,
    /// Entries of the file no derivation can stand behind: a `probe`
    /// entry for a requirement the config or release decides, or naming a
    /// pin, scenario or requirement that does not exist.
    pub problems: Vec<String>,
}

impl Derived {
    /// The file's text as it should be.
    pub fn text(&self) -> String {
        self.expected.render()
    }

    /// Whether the file holds exactly what should be there.
    pub fn matches(&self) -> bool {
        self.problems.is_empty() && self.committed.render() == self.expected.render()
    }
}

/// Derives the list from every pin's config (fetched into the cache when
/// it is not there yet) and release.
pub fn derive(
    layout: &Layout,
    fetch: &kloop_kernels::FetchOptions,
) -> Result<Derived, SkipsSessionError> {
    let catalog = Catalog::load_all(&layout.kernels())?;
    let all = scenario::load_all(&layout.scenarios())?;
    let committed = ExpectedSkips::load(&layout.kernels())?;
    let cache = KernelCache::default_location()?;
    let mut expected = ExpectedSkips::default();
    for pin in catalog.pins() {
        let config = cache.ensure_config(pin, fetch)?;
        for s in &all {
            if let Some(skip) = skips::derive(&pin.id, &pin.release, &config, s) {
                expected.skips.push(skip);
            }
        }
    }
    let mut problems = Vec::new();
    for p in committed.skips.iter().filter(|s| s.by == By::Probe) {
        match probe_entry_problem(&catalog, &all, p) {
            Some(problem) => problems.push(problem),
            None if expected.find(&p.pin, &p.scenario).is_some() => problems.push(format!(
                "{} × {}: listed as `probe`, but the pin's config or release already decides it",
                p.pin, p.scenario
            )),
            None => expected.skips.push(p.clone()),
        }
    }
    Ok(Derived {
        expected,
        committed,
        problems,
    })
}

/// Why a `probe` entry cannot stand, if it cannot.
fn probe_entry_problem(
    catalog: &Catalog,
    all: &[scenario::Scenario],
    p: &ExpectedSkip,
) -> Option<String> {
    if !catalog.pins().iter().any(|k| k.id == p.pin) {
        return Some(format!("{} × {}: no pin {}", p.pin, p.scenario, p.pin));
    }
    let Some(s) = all.iter().find(|s| s.name == p.scenario) else {
        return Some(format!(
            "{} × {}: no scenario {}",
            p.pin, p.scenario, p.scenario
        ));
    };
    let Some(r) = s
        .plan
        .requires
        .iter()
        .find(|r| scenario::requirement_name(**r) == p.requirement)
    else {
        return Some(format!(
            "{} × {}: the scenario does not require {}",
            p.pin, p.scenario, p.requirement
        ));
    };
    (!skips::probe_only(*r)).then(|| {
        format!(
            "{} × {}: {} is decided by the config or the release, not by a probe",
            p.pin, p.scenario, p.requirement
        )
    })
}
