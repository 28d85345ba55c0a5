//! `vm-shell`: a kernel's console on this terminal, with a scenario's
//! guest around it ([`crate::run::shell`]).

use kloop_kernels::Catalog;

use crate::run::shell::{ShellError, ShellOutcome};
use crate::run::suite::{self, EnvOptions, SuiteError};
use crate::workspace::Layout;

/// What `vm-shell` is asked.
#[derive(Debug, Clone)]
pub struct VmShellOptions {
    /// A pin, `built:ID` or a bzImage.
    pub kernel: String,
    /// The architecture a bare pin id names (`6.12` with arm64: `arm64/6.12`).
    pub arch: kloop_protocol::Arch,
    pub scenario: String,
    /// The accelerator, the VM's CPUs and memory, the appended command line.
    pub env: EnvOptions,
}

/// What the caller hears while the shell runs.
#[derive(Debug)]
pub enum Event<'a> {
    /// The environment is ready: the accelerator chosen.
    Accel(&'a kloop_qemu::accel::AccelDecision),
    /// A line about the VM for the person at the terminal.
    Say(&'a str),
}

#[derive(Debug, thiserror::Error)]
pub enum VmShellError {
    #[error(transparent)]
    Kernel(#[from] kloop_kernels::KernelError),
    #[error(transparent)]
    Suite(#[from] SuiteError),
    #[error(transparent)]
    Scenario(#[from] crate::scenario::ScenarioError),
    #[error("no scenario {0}")]
    NoScenario(String),
}

/// Boots the kernel with the scenario's guest and hands the terminal to
/// its shell until the VM is gone: `Err` when it could not start, else
/// how the shell ended.
pub fn run(
    layout: &Layout,
    opts: &VmShellOptions,
    on: &dyn Fn(Event<'_>),
) -> Result<Result<ShellOutcome, ShellError>, VmShellError> {
    let catalog = Catalog::load_all(&layout.kernels())?;
    let spec = suite::pin_id_for(&catalog, &opts.kernel, opts.arch);
    let kernel = suite::resolve_kernel(&catalog, &spec, None)?;
    let scenarios = crate::scenario::load_all(&layout.scenarios())?;
    let scenario = crate::scenario::select(&scenarios, std::slice::from_ref(&opts.scenario))?
        .into_iter()
        .next()
        .ok_or_else(|| VmShellError::NoScenario(opts.scenario.clone()))?;
    // SIGTERM (or a Ctrl-C before QEMU's console has the terminal) kills
    // the VM; inside the shell Ctrl-C is the guest's.
    super::start_trials();
    let env = suite::prepare_env(layout, &opts.env, std::slice::from_ref(&kernel))?;
    on(Event::Accel(&env.accel));
    let say = |line: &str| on(Event::Say(line));
    Ok(crate::run::shell::run_shell(&env, &kernel, &scenario, &say))
}
