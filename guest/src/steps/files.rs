//! The file steps that poke the kernel through its pseudo file systems
//! (tracefs, sysctls, cgroups): `write`, `mkdir`, `rmdir`, `read-file`.

use anyhow::Result;
use kloop_protocol::Message;

use crate::channel::send;
use crate::sys::{self, OsContext};

/// Writes `text` to `path`. With `may_fail` the outcome, error or not, is
/// reported as `FileWrite` instead of failing the step.
pub fn write(path: &str, text: &str, may_fail: bool) -> Result<()> {
    let result = std::fs::write(path, text);
    if may_fail {
        return send(&Message::FileWrite {
            path: path.to_owned(),
            error: result.err().map(|e| sys::Errno(&e).to_string()),
        });
    }
    result.os_ctx(format!("writing {text:?} to {path}"))
}

pub fn mkdir(path: &str) -> Result<()> {
    std::fs::create_dir(path).os_ctx(format!("mkdir {path}"))
}

pub fn rmdir(path: &str) -> Result<()> {
    std::fs::remove_dir(path).os_ctx(format!("rmdir {path}"))
}

/// Sends the text of `path` as a `FileSnapshot` under `label`.
pub fn read_file(path: &str, label: &str) -> Result<()> {
    let text = std::fs::read_to_string(path).os_ctx(format!("reading {path}"))?;
    send(&Message::FileSnapshot {
        label: label.to_owned(),
        path: path.to_owned(),
        text,
    })
}
