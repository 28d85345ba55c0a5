//! `vm-shell`: a kernel's console on this terminal, with a scenario's
//! guest around it (the work is `kloop::session::vm_shell`).

use std::process::ExitCode;

use anyhow::Result;
use kloop::run::shell::ShellError;
use kloop::run::suite::EnvOptions;
use kloop::session::vm_shell::{Event, VmShellOptions};

use crate::flags::*;
use crate::shared::*;

impl Run for VmShellArgs {
    fn run(self) -> Result<ExitCode> {
        vm_shell(self)
    }
}

fn vm_shell(a: VmShellArgs) -> Result<ExitCode> {
    let opts = VmShellOptions {
        kernel: a.kernel.clone(),
        arch: a.arch.one("vm-shell")?,
        scenario: a.scenario.clone(),
        env: EnvOptions {
            accel: a.accel,
            fetch: a.fetch.options(),
            cpus: a.cpus,
            memory_mib: a.memory,
            extra_cmdline: a.append.clone(),
            ..EnvOptions::default()
        },
    };
    let ended = kloop::session::vm_shell::run(&layout(), &opts, &|e| match e {
        Event::Accel(accel) => eprintln!("kloop vm-shell: accelerator: {accel}"),
        Event::Say(line) => eprintln!("kloop vm-shell: {line}"),
    })?;
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
