//! The `fault` step (fault-injection tests only): breaks something on
//! purpose, so the host's handling of a crashed, hung, panicking or
//! garbling guest can be tested.

use anyhow::{bail, Result};
use kloop_protocol::{Fault, Message};

use crate::channel::{self, log};
use crate::sys::OsContext;

/// Bytes the `garbage-frame` fault writes: no frame magic anywhere in them,
/// so the host must report a framing error at their first byte.
const GARBAGE: &[u8] = b"\x00kloop-guest fault injection: these bytes are not a frame\r\n";

/// Breaks something on purpose (fault-injection tests only).
pub fn inject(fault: Fault) -> Result<()> {
    match fault {
        Fault::KernelPanic => {
            // sysrq may be restricted by the kernel's default mask; 1 allows all.
            std::fs::write("/proc/sys/kernel/sysrq", "1")
                .os_ctx("enabling sysrq (/proc/sys/kernel/sysrq)")?;
            log("fault: triggering a kernel crash through /proc/sysrq-trigger")?;
            channel::drain().os_ctx("draining the data port")?;
            std::fs::write("/proc/sysrq-trigger", "c")
                .os_ctx("writing c to /proc/sysrq-trigger")?;
            bail!("the kernel survived `echo c > /proc/sysrq-trigger`")
        }
        Fault::Hang => {
            log("fault: hanging: no heartbeat or other frame from now on")?;
            channel::silence_forever()
        }
        Fault::Abort => {
            log("fault: calling abort() in PID 1")?;
            channel::drain().os_ctx("draining the data port")?;
            // SAFETY: abort has no preconditions; it does not return.
            unsafe { libc::abort() }
        }
        Fault::AgentPanic => panic!("fault injection: deliberate agent panic"),
        Fault::GarbageFrame => {
            channel::send_frame(GARBAGE).os_ctx("writing garbage to the data port")?;
            log("fault: wrote non-frame bytes to the data port")
        }
        Fault::PanicMidFrame => {
            log("fault: panicking in the middle of a frame")?;
            channel::drain().os_ctx("draining the data port")?;
            let frame = Message::Log {
                text: "x".repeat(4000),
            }
            .to_frame();
            channel::panic_mid_frame(&frame, 100)
        }
        Fault::Flood => {
            log("fault: flooding the data channel with records")?;
            let chunk = vec![0u8; 64 * 1024];
            let mut offset = 0u64;
            loop {
                for f in kloop_protocol::records_frames(u32::MAX, offset, &chunk) {
                    channel::send_frame(&f).os_ctx("flooding the data port")?;
                }
                offset += chunk.len() as u64;
            }
        }
    }
}
