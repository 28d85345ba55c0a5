//! How the events of the longer commands are drawn: `mutants`' builds and
//! decided mutants, a tree bisection's builds and trials.

use kloop::mutants::{MutantResult, Outcome};
use kloop::run::bisect::tree::TreeEvent;
use kloop::session::mutants::Event;

use super::build::BuildProgress;

/// The live line of the kernel being built (the unmutated one, the
/// compile-alone phase, the schema kernel, a mutant built alone), ended
/// when the next begins or a mutant is decided; a line per decided mutant.
pub struct MutantsView {
    source: String,
    started: std::time::Instant,
    building: Option<(String, BuildProgress)>,
}

impl MutantsView {
    pub fn new(source: String) -> MutantsView {
        MutantsView {
            source,
            started: std::time::Instant::now(),
            building: None,
        }
    }

    pub fn event(&mut self, e: Event<'_>) {
        match e {
            Event::Note(text) => eprintln!("kloop: {text}"),
            Event::Build(what, e) => {
                if self.building.as_ref().is_none_or(|(w, _)| w != what) {
                    self.finish();
                    let label = match what {
                        "unmutated" => format!("the unmutated {}", self.source),
                        "compile-alone" => "every mutated file, compiled alone".to_string(),
                        "schema" => {
                            "the schema kernel (every mutant behind its switch)".to_string()
                        }
                        _ => format!("mutant {what}"),
                    };
                    self.building = Some((what.to_string(), BuildProgress::new(&label)));
                }
                if let Some((_, progress)) = self.building.as_mut() {
                    progress.event(e);
                }
            }
            Event::Decided { results, total } => {
                self.finish();
                if let Some(r) = results.last() {
                    super::line(self.decided_line(r, results, total));
                }
            }
        }
    }

    /// Ends the live build line, if one is drawn.
    pub fn finish(&mut self) {
        if let Some((_, done)) = self.building.take() {
            done.finish();
        }
    }

    /// One decided mutant's line.
    fn decided_line(&self, r: &MutantResult, results: &[MutantResult], total: usize) -> String {
        format!(
            "[{}/{total} {:>5.0} s] {} ... {}{} (build {:.0} s, judge {:.0} s)",
            results.len(),
            self.started.elapsed().as_secs_f64(),
            r.mutant.id,
            r.outcome.label(),
            match &r.outcome {
                Outcome::Killed(why) | Outcome::BuildFailed(why) | Outcome::NotJudged(why) =>
                    format!(": {why}"),
                Outcome::Survived | Outcome::CompilerEquivalent => format!(": {}", r.mutant.what),
                Outcome::Duplicate(of) => format!(" of {of}: {}", r.resolved(results).label()),
            },
            r.build_secs,
            r.judge_secs
        )
    }
}

/// Draws a tree bisection's events: the build's live line, the end's
/// build time, each run's trial line.
pub fn tree_bisection() -> impl FnMut(TreeEvent<'_>) {
    let mut progress: Option<super::build::BuildProgress> = None;
    move |e| match e {
        TreeEvent::BuildStarted { dir } => {
            progress = Some(super::build::BuildProgress::new(&dir.display().to_string()))
        }
        TreeEvent::Build(e) => {
            if let Some(p) = progress.as_mut() {
                p.event(e)
            }
        }
        TreeEvent::BuildEnded => {
            if let Some(p) = progress.take() {
                p.finish()
            }
        }
        TreeEvent::Built { rev, id, secs } => {
            println!("kloop: {rev} built as built:{id} in {secs:.0} s")
        }
        TreeEvent::Trial(r) => println!("{}", kloop::report::trial_line(r)),
    }
}
