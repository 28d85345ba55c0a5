//! What a kernel build shows while it runs: the phase, how many objects
//! kbuild has made and the last one, and the time, on one live line on a
//! terminal (indicatif) or a line every 15 s otherwise (CI logs).

use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use kloop_kernels::build::BuildEvent;

pub struct BuildProgress {
    bar: Option<ProgressBar>,
    phase: String,
    objects: u64,
    started: Instant,
    last_print: Instant,
}

impl BuildProgress {
    pub fn new(what: &str) -> BuildProgress {
        let bar = if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
            let bar = ProgressBar::new_spinner();
            bar.set_style(
                ProgressStyle::with_template("{spinner} [{elapsed_precise}] {prefix}: {wide_msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_spinner()),
            );
            bar.set_prefix(what.to_string());
            bar.enable_steady_tick(Duration::from_millis(200));
            Some(bar)
        } else {
            eprintln!("kloop: building {what}");
            None
        };
        BuildProgress {
            bar,
            phase: String::new(),
            objects: 0,
            started: Instant::now(),
            last_print: Instant::now(),
        }
    }

    pub fn event(&mut self, e: BuildEvent) {
        match e {
            BuildEvent::Phase(p) => {
                self.phase = p.clone();
                match &self.bar {
                    Some(bar) => bar.println(format!("kloop: {p}")),
                    None => eprintln!(
                        "kloop: [{:>4.0} s] {p}",
                        self.started.elapsed().as_secs_f64()
                    ),
                }
            }
            BuildEvent::Line(line) => {
                // kbuild's quiet lines: `  CC      kernel/bpf/core.o`.
                let t = line.trim_start();
                let made = ["CC ", "AS ", "LD ", "AR ", "BTF ", "OBJCOPY ", "GEN "]
                    .iter()
                    .any(|p| t.starts_with(p));
                if made {
                    self.objects += 1;
                }
                let msg = format!("{} · {} objects · {}", self.phase, self.objects, t);
                match &self.bar {
                    Some(bar) => bar.set_message(msg),
                    None => {
                        if self.last_print.elapsed() >= Duration::from_secs(15) {
                            self.last_print = Instant::now();
                            eprintln!(
                                "kloop: [{:>4.0} s] {msg}",
                                self.started.elapsed().as_secs_f64()
                            );
                        }
                    }
                }
            }
        }
    }

    pub fn finish(self) {
        if let Some(bar) = self.bar {
            bar.finish_and_clear();
        }
    }
}
