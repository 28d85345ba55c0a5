//! `audit [ID…] [--series X.Y]`: which served builds of which series
//! still carry each ledger bug with a stand-alone reproducer.

use std::process::ExitCode;

use anyhow::Result;
use kloop::run::audit::{AuditOptions, Event};
use kloop::run::suite::EnvOptions;

use crate::flags::*;
use crate::shared::*;

impl Run for AuditArgs {
    fn run(self) -> Result<ExitCode> {
        audit(self)
    }
}

/// Exit 0 when every series answered for every reproducer, or only
/// because the mirror does not serve its builds (the table says which and
/// what to do), 1 when a series was left without an answer for another
/// reason (every build asked panicked, hung, or could not be had for a
/// reason other than the mirror), 2 on bad input (an unknown id, a series
/// with no served build) or a setup error.
fn audit(a: AuditArgs) -> Result<ExitCode> {
    let layout = layout();
    let opts = AuditOptions {
        ids: a.ids.clone(),
        series: a.series.clone(),
        fresh: a.fresh,
        arch: a.arch.one("audit")?,
        vms: kloop::run::parallel::Parallel::from_flag(a.jobs).vms,
        env: EnvOptions {
            accel: a.accel,
            fetch: a.fetch.options(),
            ..EnvOptions::default()
        },
    };
    let on = |e: Event<'_>| match e {
        Event::Note(n) => println!("kloop: {n}"),
        Event::Boot(b) => println!("{}", kloop::report::audit::boot_line(b)),
    };
    let audited = match kloop::session::audit::run(&layout, &opts, &on) {
        Ok(r) => r,
        Err(e) if e.is_bad_input() => {
            eprintln!("error: {e}");
            return Ok(ExitCode::from(2));
        }
        Err(e) => return Err(e.into()),
    };
    let result = &audited.audit;
    print!("\n{}", kloop::report::audit::table(result));
    audited.kcidb?;
    println!("{}", kloop::report::audit::summary(result));
    Ok(exit_code(result.passed()))
}
