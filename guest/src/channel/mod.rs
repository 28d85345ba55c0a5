//! The data channel to the host: the data port ([`port`]) and what the rest
//! of the agent sends through it. The bottom layer: it imports nothing of
//! the agent but [`crate::sys`].

mod port;

use std::time::Duration;

use anyhow::Result;
use kloop_protocol::{FrameKind, Message, Plan, ToGuest, HEARTBEAT_INTERVAL_MS};

use crate::sys::{self, OsContext};

pub use port::{
    discard_input, drain, open_data_port, panic_mid_frame, receive_frame, release, send_frame,
    send_last_words, send_message, silence_forever,
};

/// How long a restored agent waits for its plan. The host sends it as soon
/// as the restored guest runs; this bound only keeps a guest whose host went
/// away from waiting forever.
const PLAN_WAIT: Duration = Duration::from_secs(120);

/// Waits for the host's [`ToGuest::Plan`] frame.
pub fn receive_plan() -> Result<Plan> {
    let frame = receive_frame(PLAN_WAIT).os_ctx("waiting for the plan on the data port")?;
    if frame.kind != FrameKind::Message {
        anyhow::bail!(
            "the host sent a {:?} frame where the plan belongs",
            frame.kind
        );
    }
    match serde_json::from_slice::<ToGuest>(&frame.payload) {
        Ok(ToGuest::Plan { plan }) => Ok(plan),
        Ok(other) => Err(anyhow::anyhow!(
            "the host sent {other:?} where the plan belongs"
        )),
        Err(e) => Err(anyhow::anyhow!(
            "the host's plan frame does not decode: {e}"
        )),
    }
}

/// Waits for the host's [`ToGuest::Report`] on the by-hand session `run`
/// (the `monotonic_ns` of its hello), skipping reports meant for earlier
/// sessions that ended before theirs came. `wait` bounds the whole wait.
pub fn receive_report(run: u64, wait: Duration) -> Result<String> {
    let deadline = std::time::Instant::now() + wait;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let frame = receive_frame(left).os_ctx("waiting for the host's report on the data port")?;
        if frame.kind != FrameKind::Message {
            continue;
        }
        match serde_json::from_slice::<ToGuest>(&frame.payload) {
            Ok(ToGuest::Report { run: r, text }) if r == run => return Ok(text),
            Ok(_) => continue,
            Err(e) => anyhow::bail!("the host's report frame does not decode: {e}"),
        }
    }
}

/// Sends `msg`; an error names the data port.
pub fn send(msg: &Message) -> Result<()> {
    send_message(msg).os_ctx("writing to the data port")
}

/// Sends `text` as a `Log` message.
pub fn log(text: impl Into<String>) -> Result<()> {
    send(&Message::Log { text: text.into() })
}

/// Sends a heartbeat every [`HEARTBEAT_INTERVAL_MS`] until power-off.
pub fn start_heartbeat() {
    std::thread::Builder::new()
        .name("heartbeat".into())
        .spawn(|| {
            let mut seq = 0u64;
            loop {
                std::thread::sleep(Duration::from_millis(HEARTBEAT_INTERVAL_MS));
                seq += 1;
                if let Err(e) = send_message(&Message::Heartbeat { seq }) {
                    eprintln!("kloop-guest: heartbeat {seq}: {}", sys::Errno(&e));
                }
            }
        })
        .expect("spawn heartbeat thread");
}
