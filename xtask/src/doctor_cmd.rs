//! `cargo xtask doctor`: one line per thing kloop needs on this machine,
//! OK / WARN / FAIL, with the command that fixes each problem. The checks
//! live in `kloop::doctor`; this prints them and sets the exit status.

use std::io::Write;
use std::process::ExitCode;

use anyhow::Result;
use kloop::doctor::{self, DoctorOptions};

use crate::flags::*;
use crate::shared::*;

impl Run for DoctorArgs {
    fn run(self) -> Result<ExitCode> {
        doctor(self)
    }
}

/// Exit 0 when nothing FAILs (warnings included), 1 otherwise.
fn doctor(a: DoctorArgs) -> Result<ExitCode> {
    let opts = DoctorOptions {
        recheck_kvm: a.recheck,
        fetch: a.fetch.options(),
        mirror_deadline: std::time::Duration::from_secs(a.mirror_timeout.max(1)),
    };
    let d = kloop::session::doctor::run(&layout(), &opts, &mut |c| {
        println!("{c}");
        let _ = std::io::stdout().flush();
    });
    println!("doctor: {}", doctor::summary(&d.checks));
    Ok(if d.failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}
