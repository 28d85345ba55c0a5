//! `doctor`: this machine's checks ([`crate::doctor`]), each told as it
//! ends, and their verdict.

use crate::doctor::{self, Check, DoctorOptions};
use crate::workspace::Layout;

/// Every check, in order, and whether any failed.
#[derive(Debug)]
pub struct Doctor {
    pub checks: Vec<Check>,
    /// Some check is `FAIL`: some runs cannot work on this machine.
    pub failed: bool,
}

/// Runs the checks, `on` hearing each as it ends.
pub fn run(layout: &Layout, opts: &DoctorOptions, on: &mut dyn FnMut(&Check)) -> Doctor {
    let checks = doctor::run(layout, opts, on);
    let failed = doctor::any_failed(&checks);
    Doctor { checks, failed }
}
