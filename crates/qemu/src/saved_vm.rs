//! Saving a booted guest to a file and restoring it: QMP `stop` + `migrate`
//! to descriptor 3 when the agent awaits its plan, `-incoming fd:3` and the
//! plan written to the data channel once the restored guest runs.
//!
//! Why the plan is written only after QMP says the guest runs: QEMU connects
//! the data chardev at start-up, before the saved state is loaded, and bytes
//! the serial port took into its FIFO then would be overwritten by the
//! loaded device state.

use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;

use std::time::{Duration, Instant};
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

use kloop_path_io::{PathIo, PathIoExt};
use kloop_protocol::{FrameDecoder, FrameKind, Message};

use crate::config::*;
use crate::process::Vm;
use crate::qmp::qmp_io;

/// The name QEMU knows the saved VM's file by while it writes it.
const SAVE_FD_NAME: &str = "kloop-vmstate";

/// How long QEMU gets to write the saved VM (a 512 MiB guest takes about
/// 0.5 s under TCG).
pub const SAVE_WAIT: Duration = Duration::from_secs(60);

/// How long a restoring QEMU gets to load the saved VM and run it.
pub const RESTORE_WAIT: Duration = Duration::from_secs(30);

/// Why saving a guest or resuming a restored one did not work. The
/// messages are what the runner reports; [`SavedVmError::Interrupted`] is
/// the user's Ctrl-C, not a failure of the saved VM.
#[derive(Debug, thiserror::Error)]
pub enum SavedVmError {
    #[error("save_when_awaiting on a VM that was not started to be saved")]
    NotToBeSaved,
    #[error("interrupted")]
    Interrupted,
    /// The data channel ended before the agent awaited its plan (the
    /// session end, as `Debug` shows it).
    #[error("before the agent awaited its plan: {0}")]
    BeforeAwaiting(String),
    #[error("QEMU {0} before the agent awaited its plan")]
    QemuExited(String),
    #[error("the agent did not await its plan within the boot deadline ({0} s)")]
    BootDeadline(u64),
    /// The agent broke the boot protocol (records, too many bytes, a frame
    /// that does not decode, a hello, writing after awaiting).
    #[error("{0}")]
    Protocol(String),
    #[error("the agent failed during boot: {0}")]
    AgentFailed(String),
    /// A QMP command (`step`) failed.
    #[error("{step}: {reason}")]
    Qmp { step: String, reason: String },
    #[error("saving the VM {status}: {reason}")]
    MigrationFailed { status: String, reason: String },
    #[error("saving the VM did not complete within {0} s")]
    SaveDeadline(u64),
    #[error(transparent)]
    Io(#[from] PathIo),
    /// QEMU exited while loading the saved VM, with its stderr's last line.
    #[error("{0}")]
    RestoreExited(String),
    #[error(
        "the saved VM was not running {secs} s after QEMU started (run state {state}, \
         incoming migration {incoming})"
    )]
    NotRunning {
        secs: u64,
        state: String,
        incoming: String,
    },
}

fn qmp_err(step: &str) -> impl FnOnce(qapi::ExecuteError) -> SavedVmError + '_ {
    move |e| SavedVmError::Qmp {
        step: step.to_string(),
        reason: e.to_string(),
    }
}

/// What saving a guest took.
#[derive(Debug, Clone, PartialEq)]
pub struct SaveReport {
    /// From QEMU's start to the agent's `AwaitingPlan`.
    pub boot_to_ready: Duration,
    /// From `stop` to the migration's completion.
    pub save: Duration,
    /// Guest uptime when the agent started waiting.
    pub guest_uptime_ns: u64,
    /// Fixture programs the warm-up loaded.
    pub warmed_up: u32,
    /// Messages before `AwaitingPlan` (none from a healthy agent).
    pub early_messages: Vec<Message>,
}

impl Vm {
    /// Boots a [`GuestStart::BootAndSave`] guest to the agent's
    /// `AwaitingPlan`, saves it and quits QEMU. `Err` says why not (the
    /// caller boots cold instead). QEMU is gone on every return.
    pub fn save_when_awaiting(
        &mut self,
        interrupted: &dyn Fn() -> bool,
    ) -> Result<SaveReport, SavedVmError> {
        let result = self.save_inner(interrupted);
        if result.is_ok() {
            // `quit` was sent; the saved file is complete either way.
            let _ = self.wait_exit(QUIT_WAIT);
        }
        self.kill();
        result
    }

    fn save_inner(&mut self, interrupted: &dyn Fn() -> bool) -> Result<SaveReport, SavedVmError> {
        let GuestStart::BootAndSave { vmstate, .. } = &self.config.start else {
            return Err(SavedVmError::NotToBeSaved);
        };
        let vmstate = vmstate.clone();
        let deadline = self.started + self.config.deadlines.boot;
        let stream = self
            .accept_data(deadline, interrupted)
            .map_err(|end| SavedVmError::BeforeAwaiting(format!("{end:?}")))?;
        let (awaiting, early_messages) = self.read_until_awaiting(stream, deadline, interrupted)?;
        let boot_to_ready = self.started.elapsed();
        let Message::AwaitingPlan {
            monotonic_ns,
            warmed_up,
        } = awaiting
        else {
            unreachable!("read_until_awaiting returns only AwaitingPlan");
        };
        let save_started = Instant::now();
        self.qmp_save(&vmstate)?;
        Ok(SaveReport {
            boot_to_ready,
            save: save_started.elapsed(),
            guest_uptime_ns: monotonic_ns,
            warmed_up,
            early_messages,
        })
    }

    fn read_until_awaiting(
        &mut self,
        mut stream: UnixStream,
        deadline: Instant,
        interrupted: &dyn Fn() -> bool,
    ) -> Result<(Message, Vec<Message>), SavedVmError> {
        stream
            .set_read_timeout(Some(Duration::from_millis(50)))
            .doing("data socket")?;
        let protocol = |why: &str| SavedVmError::Protocol(why.to_string());
        let mut decoder = FrameDecoder::new();
        let mut early = Vec::new();
        let mut buf = vec![0u8; 16 * 1024];
        // A healthy agent sends one frame; a broken one is cut off here.
        const MOST_BYTES: usize = 1 << 20;
        let mut taken = 0usize;
        loop {
            if interrupted() {
                return Err(SavedVmError::Interrupted);
            }
            if let Some(status) = self.try_wait() {
                return Err(SavedVmError::QemuExited(crate::process::describe_exit(
                    &status,
                )));
            }
            if Instant::now() >= deadline {
                return Err(SavedVmError::BootDeadline(
                    self.config.deadlines.boot.as_secs(),
                ));
            }
            let n = match stream.read(&mut buf) {
                Ok(0) => return Err(protocol("QEMU closed the data channel during boot")),
                Ok(n) => n,
                Err(e)
                    if e.kind() == io::ErrorKind::WouldBlock
                        || e.kind() == io::ErrorKind::TimedOut =>
                {
                    continue
                }
                Err(e) => return Err(PathIo::doing("reading the data channel", e).into()),
            };
            taken += n;
            if taken > MOST_BYTES {
                return Err(protocol(&format!(
                    "the agent sent more than {MOST_BYTES} bytes before awaiting its plan"
                )));
            }
            decoder.push(&buf[..n]);
            while let Some(frame) = decoder
                .next_frame()
                .map_err(|e| protocol(&format!("data channel during boot: {e}")))?
            {
                if frame.kind != FrameKind::Message {
                    return Err(protocol("the agent sent records before awaiting its plan"));
                }
                let msg: Message = serde_json::from_slice(&frame.payload).map_err(|e| {
                    protocol(&format!("a message frame during boot does not decode: {e}"))
                })?;
                match msg {
                    Message::AwaitingPlan { .. } => {
                        if decoder.pending() > 0 {
                            return Err(protocol(
                                "the agent kept writing after it awaited its plan",
                            ));
                        }
                        return Ok((msg, early));
                    }
                    Message::AgentError { message, .. } => {
                        return Err(SavedVmError::AgentFailed(message))
                    }
                    Message::Hello { .. } => {
                        return Err(protocol(
                            "the agent said hello: its initramfs carried a plan, so it will not \
                             wait to be saved",
                        ))
                    }
                    other => early.push(other),
                }
            }
        }
    }

    /// `getfd` (the file, over the socket), `stop`, `migrate` to it, wait
    /// for the migration, `quit`.
    fn qmp_save(&self, vmstate: &std::path::Path) -> Result<(), SavedVmError> {
        let file =
            std::fs::File::create(vmstate).doing(format!("creating {}", vmstate.display()))?;
        let stream = self.qmp_connect().doing("QMP connect")?;
        let mut qmp = qapi::Qmp::from_stream(&stream);
        qmp.handshake().map_err(qmp_err("QMP handshake"))?;
        // The descriptor travels as SCM_RIGHTS with the command's bytes;
        // qapi writes plain bytes, so this one command is sent by hand and
        // its answer read through qapi.
        let getfd = serde_json::json!({
            "execute": <qapi::qmp::getfd as qapi::Command>::NAME,
            "arguments": qapi::qmp::getfd { fdname: SAVE_FD_NAME.into() },
        });
        let mut line = serde_json::to_vec(&getfd).map_err(|e| SavedVmError::Qmp {
            step: "QMP getfd".into(),
            reason: e.to_string(),
        })?;
        line.push(b'\n');
        stream
            .send_with_fd(&line[..], file.as_raw_fd())
            .map_err(|e| SavedVmError::Qmp {
                step: "QMP getfd: sending the descriptor".into(),
                reason: e.to_string(),
            })?;
        drop(file);
        qmp.read_response::<qapi::qmp::getfd>()
            .map_err(qmp_err("QMP getfd"))?;
        qmp.execute(&qapi::qmp::stop {})
            .map_err(qmp_err("QMP stop"))?;
        ignore_shared_ram(&mut qmp)?;
        qmp.execute(&qapi::qmp::migrate {
            uri: Some(format!("fd:{SAVE_FD_NAME}")),
            channels: None,
            detach: None,
            resume: None,
        })
        .map_err(qmp_err("QMP migrate"))?;
        let deadline = Instant::now() + SAVE_WAIT;
        loop {
            let info = qmp
                .execute(&qapi::qmp::query_migrate {})
                .map_err(qmp_err("QMP query-migrate"))?;
            match info.status {
                Some(qapi::qmp::MigrationStatus::completed) => break,
                Some(
                    s
                    @ (qapi::qmp::MigrationStatus::failed | qapi::qmp::MigrationStatus::cancelled),
                ) => {
                    return Err(SavedVmError::MigrationFailed {
                        status: format!("{s:?}"),
                        reason: info.error_desc.unwrap_or_else(|| "no reason given".into()),
                    })
                }
                _ => {}
            }
            if Instant::now() >= deadline {
                return Err(SavedVmError::SaveDeadline(SAVE_WAIT.as_secs()));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = qmp.execute(&qapi::qmp::quit {});
        Ok(())
    }

    /// For a [`GuestStart::Restore`] guest: waits until QMP says the loaded
    /// guest runs, then writes the plan frame to the data channel.
    pub(crate) fn resume_restored(
        &mut self,
        stream: &mut UnixStream,
        interrupted: &dyn Fn() -> bool,
    ) -> Result<(), SavedVmError> {
        let GuestStart::Restore { to_guest, .. } = &self.config.start else {
            return Ok(());
        };
        let to_guest = to_guest.clone();
        let deadline = Instant::now() + RESTORE_WAIT;
        let stream_qmp = loop {
            match self.qmp_connect() {
                Ok(s) => break s,
                Err(e) => {
                    if let Some(status) = self.try_wait() {
                        return Err(restore_exit(self, &status));
                    }
                    if interrupted() {
                        return Err(SavedVmError::Interrupted);
                    }
                    if Instant::now() >= deadline {
                        return Err(PathIo::doing("QMP connect", e).into());
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
        };
        let mut qmp = qapi::Qmp::from_stream(&stream_qmp);
        qmp.handshake().map_err(|e| SavedVmError::Qmp {
            step: "QMP handshake".into(),
            reason: qmp_io(e).to_string(),
        })?;
        ignore_shared_ram(&mut qmp)?;
        qmp.execute(&qapi::qmp::migrate_incoming {
            uri: Some(format!("fd:{VMSTATE_FD}")),
            channels: None,
            exit_on_error: None,
        })
        .map_err(qmp_err("QMP migrate-incoming"))?;
        let mut last_status;
        loop {
            if interrupted() {
                return Err(SavedVmError::Interrupted);
            }
            match qmp.execute(&qapi::qmp::query_status {}) {
                Ok(info) if info.running => break,
                // The VM was stopped when it was saved, and the loaded run
                // state says so: QEMU does not start it by itself.
                Ok(info) if info.status == qapi::qmp::RunState::paused => {
                    qmp.execute(&qapi::qmp::cont {})
                        .map_err(qmp_err("QMP cont after loading the saved VM"))?;
                    last_status = "paused, then cont".into();
                }
                Ok(info) => last_status = format!("{:?}", info.status),
                Err(e) => {
                    if let Some(status) = self.try_wait() {
                        return Err(restore_exit(self, &status));
                    }
                    return Err(qmp_err("QMP query-status")(e));
                }
            }
            if let Some(status) = self.try_wait() {
                return Err(restore_exit(self, &status));
            }
            if Instant::now() >= deadline {
                let incoming = qmp
                    .execute(&qapi::qmp::query_migrate {})
                    .map(|m| format!("{:?} {}", m.status, m.error_desc.unwrap_or_default()))
                    .unwrap_or_else(|e| e.to_string());
                return Err(SavedVmError::NotRunning {
                    secs: RESTORE_WAIT.as_secs(),
                    state: last_status,
                    incoming,
                });
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        stream
            .write_all(&to_guest)
            .doing("writing the plan to the data channel")?;
        Ok(())
    }
}

/// Sets `x-ignore-shared`: the saved VM's RAM is its own file (mapped
/// shared by the save, private by a restore, see [`GuestStart`]), so the
/// stream carries only the device state. Both sides need it: it also
/// changes the stream's RAM section header.
fn ignore_shared_ram<S>(qmp: &mut qapi::Qmp<S>) -> Result<(), SavedVmError>
where
    S: io::BufRead + io::Write,
{
    qmp.execute(&qapi::qmp::migrate_set_capabilities {
        capabilities: vec![qapi::qmp::MigrationCapabilityStatus {
            capability: qapi::qmp::MigrationCapability::x_ignore_shared,
            state: true,
        }],
    })
    .map(drop)
    .map_err(qmp_err("QMP migrate-set-capabilities x-ignore-shared"))
}

/// Why a restoring QEMU exited, with its stderr's last line (where QEMU
/// says what did not match).
fn restore_exit(vm: &Vm, status: &std::process::ExitStatus) -> SavedVmError {
    let stderr =
        std::fs::read_to_string(vm.config.artefacts.join("qemu.stderr")).unwrap_or_default();
    let last = stderr.lines().rev().find(|l| !l.trim().is_empty());
    SavedVmError::RestoreExited(format!(
        "QEMU {} while loading the saved VM{}",
        crate::process::describe_exit(status),
        last.map(|l| format!(": {}", l.trim())).unwrap_or_default()
    ))
}
