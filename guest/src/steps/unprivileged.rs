//! `unprivileged-attach`: a trampoline charged by a caller that is not
//! `bpf_capable()`, the one caller `net.core.bpf_jit_limit` binds
//! (bpf_jit_charge_modmem() in kernel/bpf/core.c lets CAP_BPF and
//! CAP_SYS_ADMIN past it). The attach runs in a thread of its own that
//! drops every capability first: capabilities are per thread, so the
//! agent's other threads keep theirs.

use std::os::fd::{AsRawFd, OwnedFd};

use anyhow::{anyhow, Result};
use aya_obj::generated::bpf_cmd;
use kloop_protocol::Message;

use crate::bpf::{sys_bpf_fd, zeroed_attr, RAW_TRACEPOINT_OPEN_SIZE};
use crate::channel::send;
use crate::context::StepContext;
use crate::sys::{self, errno_name, OsContext};

const JIT_LIMIT: &str = "/proc/sys/net/core/bpf_jit_limit";
const UNPRIVILEGED_BPF: &str = "/proc/sys/kernel/unprivileged_bpf_disabled";

/// `_LINUX_CAPABILITY_VERSION_3` (include/uapi/linux/capability.h).
const CAPABILITY_VERSION_3: u32 = 0x2008_0522;

/// A sysctl set for the step and put back when it ends.
struct Restore(&'static str, String);

impl Drop for Restore {
    fn drop(&mut self) {
        let _ = std::fs::write(self.0, &self.1);
    }
}

fn set(path: &'static str, value: &str) -> Result<Restore> {
    let old = sys::read_trimmed(path).os_ctx(format!("reading {path}"))?;
    std::fs::write(path, value).os_ctx(format!("writing {value} to {path}"))?;
    Ok(Restore(path, old))
}

pub fn attach(context: &mut StepContext, label: &str, over_limit: bool) -> Result<()> {
    let prog_fd = crate::steps::fail_nth::loaded_prog_fd(context, label)?;
    let _unprivileged = match sys::read_trimmed(UNPRIVILEGED_BPF).ok().as_deref() {
        // 1 is sticky: the kernel refuses every change back.
        Some("1") => {
            return Err(anyhow!(
                "{UNPRIVILEGED_BPF} is 1 (locked): a caller without CAP_BPF cannot use bpf() \
                 on this boot"
            ))
        }
        Some("2") => Some(set(UNPRIVILEGED_BPF, "0")?),
        _ => None,
    };
    let _limit = if over_limit {
        Some(set(JIT_LIMIT, "1")?)
    } else {
        None
    };
    let errno = std::thread::scope(|s| {
        s.spawn(|| attach_without_capabilities(&prog_fd))
            .join()
            .map_err(|_| anyhow!("the unprivileged attach thread panicked"))?
    })?;
    send(&Message::UnprivilegedAttach {
        label: label.to_owned(),
        over_limit,
        errno: errno.map(|e| {
            errno_name(e)
                .map(str::to_owned)
                .unwrap_or_else(|| format!("errno {e}"))
        }),
    })
}

/// In the calling thread: drops every capability, then attaches (and on
/// success detaches at once). Returns the attach's errno, `None` on success.
fn attach_without_capabilities(prog_fd: &OwnedFd) -> Result<Option<i32>> {
    let header = [CAPABILITY_VERSION_3, 0u32];
    let data = [0u32; 6];
    // SAFETY: capset(2) with a v3 header (pid 0: this thread) and two
    // zeroed __user_cap_data_struct; both outlive the call.
    let r = unsafe { libc::syscall(libc::SYS_capset, header.as_ptr(), data.as_ptr()) };
    if r != 0 {
        return Err(sys::last_os_error()).os_ctx("capset: dropping every capability");
    }
    let mut attr = zeroed_attr();
    attr.raw_tracepoint.prog_fd = prog_fd.as_raw_fd() as u32;
    match sys_bpf_fd(
        bpf_cmd::BPF_RAW_TRACEPOINT_OPEN,
        &mut attr,
        RAW_TRACEPOINT_OPEN_SIZE,
    ) {
        Ok(link) => {
            drop(link);
            Ok(None)
        }
        Err(e) => Ok(Some(e.raw_os_error().unwrap_or(0))),
    }
}
