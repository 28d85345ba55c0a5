//! The `inventory` step: the programs loaded before recording starts, as
//! `perf record` inventories them.
//!
//! A recorder that starts after programs were loaded sees no records for
//! them, yet later sees their unloads. perf learns them at start by walking
//! `BPF_PROG_GET_NEXT_ID`, opening each with `BPF_PROG_GET_FD_BY_ID` and
//! reading `BPF_OBJ_GET_INFO_BY_FD` (`jited_ksyms`, `jited_func_lens`,
//! `prog_tags`), and synthesises a KSYMBOL per JITed function from that. The
//! agent does the same walk and sends what it found, with the
//! `/proc/kallsyms` lines at those addresses, so the host can reconcile the
//! unregisters of symbols the stream never registered. A program that is
//! unloaded between the walk and the open (`ENOENT`) is skipped, as perf
//! skips it.

use std::os::fd::AsFd;

use anyhow::{Context, Result};
use kloop_protocol::{Message, ProgFacts};

use crate::channel::{log, send};
use crate::sys::OsContext;
use crate::{bpf, kallsyms};

/// Walks every loaded program and sends what it found as `Inventory`.
pub fn run() -> Result<()> {
    let mut infos = Vec::new();
    let mut gone = Vec::new();
    for id in bpf::prog_ids()? {
        let fd = match bpf::prog_fd_by_id(id) {
            Ok(fd) => fd,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                gone.push(id);
                continue;
            }
            Err(e) => return Err(e).os_ctx(format!("BPF_PROG_GET_FD_BY_ID({id})")),
        };
        let info = bpf::prog_info(fd.as_fd())
            .with_context(|| format!("bpf_prog_info of program id {id}"))?;
        infos.push(info);
    }
    // One kallsyms read for all of them, after the walk, like perf's own
    // symbol resolution later on.
    let progs: Vec<ProgFacts> = {
        let text =
            kallsyms::read_filtered(|e| infos.iter().any(|i| i.jited_ksyms.contains(&e.addr)))?;
        infos
            .iter()
            .map(|info| info.facts(format!("inventory#{}", info.info.id), &text))
            .collect()
    };
    if !gone.is_empty() {
        log(format!(
            "inventory: programs {gone:?} went away between BPF_PROG_GET_NEXT_ID and BPF_PROG_GET_FD_BY_ID"
        ))?;
    }
    send(&Message::Inventory { progs })
}
