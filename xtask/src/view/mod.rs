//! The terminal: what `cargo xtask` shows while it works.
//!
//! [`build::BuildProgress`] is a kernel build's live line.
//!
//! The libraries announce long steps as status events
//! ([`kloop_kernels::status`]); this module draws them. On a terminal
//! (stderr is a tty) every running step is a live line (`indicatif`): a
//! download with its bytes and rate, a trial with its time, the run's
//! trials done so far. Elsewhere (a CI log) each step is a plain line when
//! it starts and ends, a download prints its bytes every few seconds, and
//! when nothing was printed for a while a heartbeat line names what is
//! running. `-v` (or `RUST_LOG`) adds `tracing` logs of what kloop runs:
//! QEMU's argv, apt, cargo.

pub mod build;
pub mod views;

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::{IsTerminal, Write};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use kloop_kernels::status::TARGET;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// `KLOOP_PROGRESS=plain|live` overrides the terminal check.
pub const PROGRESS_ENV: &str = "KLOOP_PROGRESS";

/// Plain mode: a heartbeat after this long without a line.
const HEARTBEAT_AFTER: Duration = Duration::from_secs(10);
/// Plain mode: a download's bytes at most this often.
const PLAIN_PROGRESS_EVERY: Duration = Duration::from_secs(5);

static UI: OnceLock<Ui> = OnceLock::new();

struct Ui {
    live: Option<MultiProgress>,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    tasks: HashMap<String, Task>,
    /// The run's trials: (done, of, failed) and the live bar.
    trials: Option<(u64, u64, u64)>,
    overall: Option<ProgressBar>,
    last_line: Option<Instant>,
}

struct Task {
    message: String,
    started: Instant,
    bar: Option<ProgressBar>,
    last_progress_line: Option<Instant>,
}

/// Installs the status view and the `tracing` log (`verbose`: the number
/// of `-v`; `RUST_LOG` wins when set).
pub fn init(verbose: u8) {
    let live = match std::env::var(PROGRESS_ENV).as_deref() {
        Ok("plain") => false,
        Ok("live") => true,
        _ => std::io::stderr().is_terminal(),
    };
    let ui = UI.get_or_init(|| Ui {
        live: live.then(|| MultiProgress::with_draw_target(ProgressDrawTarget::stderr())),
        state: Mutex::new(State::default()),
    });
    if ui.live.is_none() {
        std::thread::spawn(heartbeat);
    }
    let default = match verbose {
        0 => "warn",
        1 => "warn,kloop=debug,kloop_kernels=debug,kloop_qemu=debug,xtask=debug",
        _ => "info,kloop=trace,kloop_kernels=trace,kloop_qemu=trace,xtask=trace",
    };
    let filter = std::env::var("RUST_LOG")
        .ok()
        .and_then(|v| EnvFilter::try_new(v).ok())
        .unwrap_or_else(|| EnvFilter::new(default))
        // Status events are drawn, not logged.
        .add_directive(format!("{TARGET}=off").parse().expect("a valid directive"));
    let log = tracing_subscriber::fmt::layer()
        .with_writer(|| LineWriter(Vec::new()))
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(true)
        .with_filter(filter);
    let status = StatusLayer.with_filter(tracing_subscriber::filter::filter_fn(|m| {
        m.target() == TARGET
    }));
    let _ = tracing_subscriber::registry()
        .with(status)
        .with(log)
        .try_init();
}

/// Prints `text` on stdout, above the live view.
pub fn line(text: impl std::fmt::Display) {
    let text = text.to_string();
    match UI.get() {
        Some(ui) => {
            ui.state().last_line = Some(Instant::now());
            match &ui.live {
                Some(multi) => multi.suspend(|| println!("{text}")),
                None => println!("{text}"),
            }
        }
        None => println!("{text}"),
    }
}

/// What `vm-test` tells while it runs: notes above the live view, a
/// trial's line (and what failed under it) as it ends, the live bar of
/// trials done.
pub fn vm_test_event(e: kloop::session::vm_test::Event<'_>) {
    use kloop::session::vm_test::Event;
    match e {
        Event::Note(text) => line(format!("kloop: {text}")),
        Event::TrialsStarted(n) => trials_started(n),
        Event::TrialEnded(r) => {
            line(kloop::report::trial_lines(r));
            trial_ended(r.verdict.fails_run());
        }
        Event::TrialsFinished => trials_finished(),
        Event::RepeatTable(table) => line(format!("\n{table}")),
        Event::Flaky(r) => line(kloop::report::trial_lines(r)),
    }
}

/// The run has `total` trials: a live bar of those done.
fn trials_started(total: usize) {
    let Some(ui) = UI.get() else { return };
    let mut st = ui.state();
    st.trials = Some((0, total as u64, 0));
    if let Some(multi) = &ui.live {
        let bar = multi.add(ProgressBar::new(total as u64));
        bar.set_style(
            ProgressStyle::with_template("[{elapsed_precise}] {bar:30} {pos}/{len} trials {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        bar.enable_steady_tick(Duration::from_millis(500));
        st.overall = Some(bar);
    }
}

/// One more trial ended.
fn trial_ended(failed: bool) {
    let Some(ui) = UI.get() else { return };
    let mut st = ui.state();
    if let Some((done, _, f)) = st.trials.as_mut() {
        *done += 1;
        *f += u64::from(failed);
        let failed = *f;
        if let Some(bar) = &st.overall {
            bar.inc(1);
            if failed > 0 {
                bar.set_message(format!("· {failed} failed"));
            }
        }
    }
}

/// The run's trials are over: the live bars go away.
fn trials_finished() {
    let Some(ui) = UI.get() else { return };
    let mut st = ui.state();
    st.trials = None;
    if let Some(bar) = st.overall.take() {
        bar.finish_and_clear();
    }
}

impl Ui {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A status line on stderr (status is not the run's output).
    fn status_line(&self, st: &mut State, text: &str) {
        st.last_line = Some(Instant::now());
        match &self.live {
            Some(multi) => {
                let _ = multi.println(format!("kloop: {text}"));
            }
            None => eprintln!("kloop: {text}"),
        }
    }

    fn event(&self, ev: StatusEvent) {
        let mut st = self.state();
        match ev.state.as_str() {
            "start" => self.task_started(&mut st, ev),
            "progress" => self.task_progressed(&mut st, &ev),
            "update" => {
                if let Some(task) = st.tasks.get_mut(&ev.task) {
                    task.message = ev.message.clone();
                    match &task.bar {
                        Some(bar) => bar.set_message(ev.message),
                        None => self.status_line(&mut st, &ev.message),
                    }
                }
            }
            _ => self.task_ended(&mut st, ev),
        }
    }

    fn task_started(&self, st: &mut State, ev: StatusEvent) {
        // Trials have their own lines, printed by the command when they end.
        let is_trial = ev.task.starts_with("trial ");
        let bar = self.live.as_ref().map(|multi| {
            let bar = match &st.overall {
                Some(overall) => multi.insert_before(overall, ProgressBar::new_spinner()),
                None => multi.add(ProgressBar::new_spinner()),
            };
            bar.set_style(spinner_style());
            bar.set_message(ev.message.clone());
            bar.enable_steady_tick(Duration::from_millis(200));
            bar
        });
        if bar.is_none() && !is_trial {
            self.status_line(st, &ev.message);
        }
        st.tasks.insert(
            ev.task.clone(),
            Task {
                message: ev.message,
                started: Instant::now(),
                bar,
                last_progress_line: None,
            },
        );
    }

    /// Bytes moved: the bar's position, or without bars a line at most
    /// every [`PLAIN_PROGRESS_EVERY`].
    fn task_progressed(&self, st: &mut State, ev: &StatusEvent) {
        let Some(task) = st.tasks.get_mut(&ev.task) else {
            return;
        };
        let bytes = ev.bytes.unwrap_or(0);
        if let Some(bar) = &task.bar {
            if let Some(total) = ev.total {
                bar.set_length(total);
                bar.set_style(bytes_style());
            }
            bar.set_position(bytes);
            return;
        }
        if task
            .last_progress_line
            .is_some_and(|t| t.elapsed() < PLAIN_PROGRESS_EVERY)
        {
            return;
        }
        task.last_progress_line = Some(Instant::now());
        let secs = task.started.elapsed().as_secs_f64().max(0.001);
        let mut text = format!("{}: {:.1}", ev.task, bytes as f64 / 1e6);
        if let Some(total) = ev.total {
            let _ = write!(text, " of {:.1}", total as f64 / 1e6);
        }
        let _ = write!(text, " MB ({:.1} MB/s)", bytes as f64 / 1e6 / secs);
        self.status_line(st, &text);
    }

    fn task_ended(&self, st: &mut State, ev: StatusEvent) {
        if let Some(task) = st.tasks.remove(&ev.task) {
            if let Some(bar) = task.bar {
                bar.finish_and_clear();
            }
        }
        if !ev.message.is_empty() {
            let text = if ev.state == "failed" {
                format!("{} failed: {}", ev.task, ev.message)
            } else {
                ev.message
            };
            self.status_line(st, &text);
        }
    }
}

fn spinner_style() -> ProgressStyle {
    ProgressStyle::with_template("{spinner} [{elapsed:>4}] {wide_msg}")
        .unwrap_or_else(|_| ProgressStyle::default_spinner())
}

fn bytes_style() -> ProgressStyle {
    ProgressStyle::with_template(
        "{spinner} [{elapsed:>4}] {msg} {bar:20} {bytes}/{total_bytes} ({bytes_per_sec})",
    )
    .unwrap_or_else(|_| ProgressStyle::default_bar())
}

/// Plain mode: when nothing was printed for [`HEARTBEAT_AFTER`], one line
/// with the trials done and what is running, and how long it has run.
fn heartbeat() {
    let started = Instant::now();
    loop {
        std::thread::sleep(Duration::from_secs(1));
        let Some(ui) = UI.get() else { return };
        let mut st = ui.state();
        let quiet = st.last_line.is_none_or(|t| t.elapsed() >= HEARTBEAT_AFTER);
        if !quiet || st.tasks.is_empty() {
            continue;
        }
        let mut running: Vec<(&String, &Task)> = st.tasks.iter().collect();
        running.sort_by_key(|(_, t)| t.started);
        let running: Vec<String> = running
            .iter()
            .map(|(name, t)| {
                let what = name.strip_prefix("trial ").unwrap_or(&t.message);
                format!("{what} ({:.0} s)", t.started.elapsed().as_secs_f64())
            })
            .collect();
        let mut text = format!("[{:>4.0} s] ", started.elapsed().as_secs_f64());
        if let Some((done, of, failed)) = st.trials {
            let _ = write!(text, "{done}/{of} trials done");
            if failed > 0 {
                let _ = write!(text, " ({failed} failed)");
            }
            text.push_str("; ");
        }
        let _ = write!(text, "running: {}", running.join(", "));
        ui.status_line(&mut st, &text);
    }
}

/// One status event's fields.
#[derive(Default)]
struct StatusEvent {
    task: String,
    state: String,
    message: String,
    bytes: Option<u64>,
    total: Option<u64>,
}

impl tracing::field::Visit for StatusEvent {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        match field.name() {
            "task" => self.task = value.to_string(),
            "state" => self.state = value.to_string(),
            _ => {}
        }
    }
    fn record_u64(&mut self, field: &tracing::field::Field, value: u64) {
        match field.name() {
            "bytes" => self.bytes = Some(value),
            "total" => self.total = Some(value),
            _ => {}
        }
    }
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.message = format!("{value:?}");
        }
    }
}

struct StatusLayer;

impl<S: tracing::Subscriber> Layer<S> for StatusLayer {
    fn on_event(&self, event: &tracing::Event<'_>, _ctx: Context<'_, S>) {
        let mut ev = StatusEvent::default();
        event.record(&mut ev);
        if let Some(ui) = UI.get() {
            ui.event(ev);
        }
    }
}

/// A log line for `tracing`'s formatter, written above the live view when
/// it is complete (the formatter writes one event per writer).
struct LineWriter(Vec<u8>);

impl Write for LineWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for LineWriter {
    fn drop(&mut self) {
        let text = String::from_utf8_lossy(&self.0);
        let text = text.trim_end_matches('\n');
        if text.is_empty() {
            return;
        }
        match UI.get().and_then(|ui| ui.live.as_ref()) {
            Some(multi) => multi.suspend(|| eprintln!("{text}")),
            None => eprintln!("{text}"),
        }
    }
}
