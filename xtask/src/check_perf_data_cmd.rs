//! `check-perf-data FILE`: the kloop-perf-data crate's judge over a
//! perf.data file from a production host.

use std::process::ExitCode;

use anyhow::Result;

use crate::flags::*;
use crate::shared::*;

impl Run for CheckPerfDataArgs {
    fn run(self) -> Result<ExitCode> {
        check_perf_data(&self.file, self.json)
    }
}

/// `check-perf-data FILE`: exit 0 clean (or known bugs only), 1 news,
/// 2 unreadable, cut short or nothing to judge.
fn check_perf_data(file: &std::path::Path, json: bool) -> Result<ExitCode> {
    let mut c = match kloop::perf_data::check(file) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return Ok(ExitCode::from(2));
        }
    };
    kloop::perf_data::recognise(&mut c, &kloop::workspace::load_ledger(&layout())?);
    if json {
        println!("{}", serde_json::to_string_pretty(&c)?);
    } else {
        print!("{}", kloop::report::perf_data::text(file, &c));
    }
    Ok(ExitCode::from(c.exit_code()))
}
