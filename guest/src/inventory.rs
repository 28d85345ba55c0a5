//! The programs loaded before recording starts, as `perf record` inventories them.

use anyhow::{bail, Result};

pub fn run() -> Result<()> {
    bail!("this agent does not implement inventory yet")
}
