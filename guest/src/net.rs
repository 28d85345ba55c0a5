//! Kernel modules and virtual network devices.

use anyhow::{bail, Result};
use kloop_protocol::Step;

pub fn run(step: &Step) -> Result<()> {
    bail!(
        "this agent does not implement the step yet: {}",
        serde_json::to_string(step).unwrap_or_default()
    )
}
