//! Feature probes for a plan's `requires`.

use anyhow::{bail, Result};
use kloop_protocol::Requirement;

/// The first requirement the running kernel does not meet, with the reason.
pub fn first_unmet(requires: &[Requirement]) -> Result<Option<(Requirement, String)>> {
    if requires.is_empty() {
        return Ok(None);
    }
    bail!("this agent cannot probe requirements yet: {requires:?}")
}
