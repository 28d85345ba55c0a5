//! `vm-shell`: a kernel's console on this terminal, with a scenario's
//! guest around it (the work is `kloop::run::shell`).

use std::process::ExitCode;

use anyhow::{Context, Result};
use kloop::run::shell::ShellError;
use kloop::run::suite::{self, EnvOptions};
use kloop_kernels::Catalog;

use crate::*;

pub(crate) fn vm_shell(a: VmShellArgs) -> Result<ExitCode> {
    let layout = layout();
    let catalog = Catalog::load(&layout.kernels())?;
    let kernel = suite::resolve_kernel(&catalog, &a.kernel, None)?;
    let scenarios = kloop::scenario::load_all(&layout.scenarios())?;
    let scenario = kloop::scenario::select(&scenarios, std::slice::from_ref(&a.scenario))?
        .into_iter()
        .next()
        .with_context(|| format!("no scenario {}", a.scenario))?;
    // SIGTERM (or a Ctrl-C before QEMU's console has the terminal) kills
    // the VM; inside the shell Ctrl-C is the guest's.
    start_trials();
    let opts = EnvOptions {
        accel: a.accel,
        fetch: a.fetch.options(),
        cpus: a.cpus,
        memory_mib: a.memory,
        extra_cmdline: a.append.clone(),
        ..EnvOptions::default()
    };
    let env = suite::prepare_env(&layout, &opts, std::slice::from_ref(&kernel))?;
    eprintln!("kloop vm-shell: accelerator: {}", env.accel);
    let say = |line: &str| eprintln!("kloop vm-shell: {line}");
    let ended = kloop::run::shell::run_shell(&env, &kernel, &scenario, &say);
    // The guest's last line may lack its newline.
    eprintln!();
    match ended {
        Ok(outcome) => {
            eprintln!(
                "kloop vm-shell: the VM is gone (QEMU {}); {} kloop-run report(s); console and \
                 reports in {}",
                outcome.qemu_exit,
                outcome.by_hand_runs,
                outcome.artefacts.display()
            );
            if let Some(panic) = outcome.panic {
                eprintln!("kloop vm-shell: the guest kernel panicked:\n{panic}");
                return Ok(ExitCode::from(1));
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(
            e
            @ (ShellError::BootTimeout { .. } | ShellError::Panic(_) | ShellError::NoShell { .. }),
        ) => {
            eprintln!("kloop vm-shell: {e}");
            Ok(ExitCode::from(1))
        }
        Err(e) => Err(e.into()),
    }
}
