//! What kloop is doing right now, for the person waiting on it.
//!
//! Long steps (fetching a kernel, extracting it, building the agent, probing
//! KVM, making a saved VM, running a trial) announce themselves as `tracing`
//! events with the target [`TARGET`], so the libraries stay free of any
//! terminal code: the front end (`cargo xtask`) draws them as a live view on
//! a terminal or prints them as plain lines in a CI log, and a program that
//! installs no subscriber sees nothing.
//!
//! Every event carries a `task` (a stable key: `fetch 6.12`, `trial
//! 6.12/basic`) and a `state`: `start`, `progress` (with `bytes` and, when
//! known, `total`), `done` or `failed`. The message is for people. This
//! module lives in the lowest crate that has long steps, and the crates
//! above use it too, so there is one vocabulary.

/// The `tracing` target of status events.
pub const TARGET: &str = "kloop::status";

/// `task` has started; `message` says what it is doing.
pub fn start(task: &str, message: &str) {
    tracing::info!(target: TARGET, task, state = "start", "{message}");
}

/// `task` has moved `bytes` of `total` (when known).
pub fn progress(task: &str, bytes: u64, total: Option<u64>) {
    match total {
        Some(total) => tracing::info!(target: TARGET, task, state = "progress", bytes, total, ""),
        None => tracing::info!(target: TARGET, task, state = "progress", bytes, ""),
    }
}

/// `task` has a new message but is not finished.
pub fn update(task: &str, message: &str) {
    tracing::info!(target: TARGET, task, state = "update", "{message}");
}

/// `task` finished; `message` is its outcome.
pub fn done(task: &str, message: &str) {
    tracing::info!(target: TARGET, task, state = "done", "{message}");
}

/// `task` failed; `message` says why.
pub fn failed(task: &str, message: &str) {
    tracing::info!(target: TARGET, task, state = "failed", "{message}");
}
