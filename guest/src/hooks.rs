//! Attach, detach and the kernel-poking steps (tracefs, sysctls, triggers).

use anyhow::{bail, Result};
use kloop_protocol::Step;

pub fn run(_state: &mut crate::agent::State, step: &Step) -> Result<()> {
    bail!(
        "this agent does not implement the step yet: {}",
        serde_json::to_string(step).unwrap_or_default()
    )
}
