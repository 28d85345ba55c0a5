//! QMP through `qapi`: asking whether KVM is in use, and a polite `quit`.

use std::io::{self};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use crate::process::Vm;

impl Vm {
    pub(crate) fn qmp_connect(&self) -> io::Result<UnixStream> {
        let s = UnixStream::connect(&self.qmp_path)?;
        s.set_read_timeout(Some(Duration::from_secs(3)))?;
        s.set_write_timeout(Some(Duration::from_secs(3)))?;
        Ok(s)
    }

    /// Which accelerator QEMU really runs with, asked over QMP.
    pub fn qmp_query_kvm(&self) -> io::Result<bool> {
        let deadline = Instant::now() + Duration::from_secs(5);
        let stream = loop {
            match self.qmp_connect() {
                Ok(s) => break s,
                Err(e) if Instant::now() >= deadline => return Err(e),
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        };
        let mut qmp = qapi::Qmp::from_stream(&stream);
        qmp.handshake().map_err(qmp_io)?;
        let info = qmp.execute(&qapi::qmp::query_kvm {}).map_err(qmp_io)?;
        Ok(info.enabled && info.present)
    }

    pub(crate) fn qmp_quit(&self) -> io::Result<()> {
        let stream = self.qmp_connect()?;
        let mut qmp = qapi::Qmp::from_stream(&stream);
        qmp.handshake().map_err(qmp_io)?;
        // QEMU may close the socket before answering; either is fine.
        let _ = qmp.execute(&qapi::qmp::quit {});
        Ok(())
    }
}

pub(crate) fn qmp_io(e: qapi::ExecuteError) -> io::Error {
    io::Error::other(format!("QMP: {e}"))
}
