//! `cargo xtask doctor`: one line per thing kloop needs on this machine,
//! OK / WARN / FAIL, with the command that fixes each problem. The checks
//! live in `kloop::doctor`; this prints them and sets the exit status.

use std::io::Write;
use std::process::ExitCode;

use anyhow::Result;
use clap::Args;
use kloop::doctor::{self, DoctorOptions};

use crate::{layout, FetchArgs};

#[derive(Args, Clone)]
pub(crate) struct DoctorArgs {
    /// Forget the cached KVM verdict and boot the probe guest again (after
    /// enabling virtualisation, say: the cache key, host kernel and QEMU
    /// version, has not changed).
    #[arg(long)]
    recheck: bool,
    /// Seconds one suite's Release file may take to arrive from the mirror.
    #[arg(long, default_value_t = 5)]
    mirror_timeout: u64,
    #[command(flatten)]
    fetch: FetchArgs,
}

/// Exit 0 when nothing FAILs (warnings included), 1 otherwise.
pub(crate) fn doctor(a: DoctorArgs) -> Result<ExitCode> {
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
