//! The checkout kloop works in: where its data lives ([`Layout`]: the
//! kernels, the scenarios, the runs), the root it was built from, the
//! known-issues ledger read from it, and the run directories made under it.
//!
//! The floor under `run/`, `report/` and `session/`: each of them reads
//! the checkout through this module, and it imports none of them (only
//! `scenario/`, for the scenario names the ledger is checked against).
//!
//! - [`run_dirs`]: run directories, locked while live, pruned to the newest.

use std::path::{Path, PathBuf};

use crate::judge::known_issues::{Ledger, LedgerError};
use crate::scenario::{self, ScenarioError};
use kloop_kernels::{Catalog, KernelError};
use kloop_path_io::PathIo;

pub mod run_dirs;

/// Where the repository's data lives.
#[derive(Debug, Clone)]
pub struct Layout {
    pub root: PathBuf,
}

impl Layout {
    pub fn from_root(root: impl Into<PathBuf>) -> Self {
        Layout { root: root.into() }
    }
    pub fn kernels(&self) -> PathBuf {
        self.root.join("kernels")
    }
    pub fn scenarios(&self) -> PathBuf {
        self.root.join("scenarios")
    }
    pub fn runs(&self) -> PathBuf {
        self.root.join("target/kloop/runs")
    }
}

/// The workspace root this harness was built from.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("harness/ lives in the workspace root")
        .to_path_buf()
}

/// A new run directory under `root`, locked while this process lives
/// ([`run_dirs::create`]).
pub fn new_run_dir(root: &Path) -> std::io::Result<PathBuf> {
    run_dirs::create(root)
}

/// Why the ledger could not be loaded: the catalog, the scenarios, the
/// ledger's file or its text (each said as its own error says it).
#[derive(Debug, thiserror::Error)]
pub enum LoadLedgerError {
    #[error(transparent)]
    Kernel(#[from] KernelError),
    #[error(transparent)]
    Scenario(#[from] ScenarioError),
    #[error(transparent)]
    Io(#[from] PathIo),
    #[error(transparent)]
    Ledger(#[from] LedgerError),
}

/// The known-issues ledger (`kernels/known-issues.toml`), validated against
/// the catalog's pins, the scenarios and every rule name.
pub fn load_ledger(layout: &Layout) -> Result<Ledger, LoadLedgerError> {
    use crate::judge::known_issues::{rule_names, Vocabulary, FILE_NAME};
    let catalog = Catalog::load_all(&layout.kernels())?;
    let scenarios = scenario::load_all(&layout.scenarios())?;
    let vocab = Vocabulary {
        pins: catalog.pins().iter().map(|p| p.id.clone()).collect(),
        rules: rule_names().into_iter().map(String::from).collect(),
        scenarios: scenarios.iter().map(|s| s.name.clone()).collect(),
    };
    let path = layout.kernels().join(FILE_NAME);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => Some(t),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(source) => {
            return Err(PathIo::at("reading the known-issues ledger", path, source).into())
        }
    };
    Ok(Ledger::of_file(&path, text.as_deref(), &vocab)?)
}
