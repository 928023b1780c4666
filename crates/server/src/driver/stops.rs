//! L20: stops that are seen through. A stop's outbox entry stays until its run is seen
//! gone (its `Exited` report): a stop the engine refused is asked again with backoff, and
//! a stop not honoured within the grace period (a shim that does not answer, e.g. one
//! stopped with SIGSTOP) is escalated to a kill that does not need the shim, and that kill
//! is repeated until the run is gone. Nothing is marked done and forgotten.

use super::*;
use crate::executor::{Report, Work};

/// Past the grace period, how long a stop may take before it is escalated to a kill.
const STOP_MARGIN: Micros = 10_000_000;
/// After a kill, how long before it is asked again.
const KILL_AGAIN: Micros = 10_000_000;
/// Backoff of a stop or kill the engine refused: 1 s doubling to 30 s.
const RETRY_FIRST: Micros = 1_000_000;
const RETRY_MAX: Micros = 30_000_000;

/// A stop in flight.
pub(super) struct StopTrack {
    /// Its outbox entry.
    seq: i64,
    dir: PathBuf,
    /// Refusals so far (stop or kill).
    tries: u32,
    /// What to send next, and when (None: waiting for the executor's report).
    next: Option<(Micros, Step)>,
}

/// The next step of a stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    /// The stop was refused: ask again.
    Stop,
    /// The stop was delivered and not honoured in time, or a kill was: kill.
    Kill,
}

fn backoff(tries: u32) -> Micros {
    (RETRY_FIRST << tries.saturating_sub(1).min(5)).min(RETRY_MAX)
}

impl Driver {
    /// Send a committed stop to the executor and follow it until the run is gone. Returns
    /// false when the run is not live any more (the stop is still sent, and its outbox
    /// entry is done at once).
    pub(super) fn stop_run(&mut self, seq: i64, run: RunId) -> bool {
        // A launch put off while the engine could not take it has started nothing: it is
        // dropped, and the run ends here (L18: a cancel does not wait for the engine).
        if let Some(pos) = self.later.iter().position(|l| l.run == run) {
            let put_off = self.later.remove(pos);
            if let Err(e) = self.store.outbox_done(put_off.seq) {
                tracing::error!("outbox: {e}");
            }
            let message = "stopped before it was launched (it was waiting for the execution engine)".to_string();
            (self.sink())(BackendEvent::Exited { run, outcome: Outcome::LaunchFailed { message }, stderr_tail: Vec::new() });
            return false;
        }
        let dir = run_dir(&self.svc.cfg.data_dir, &run);
        self.exec.submit(Work::Stop { run: run.clone(), dir: dir.clone() });
        let live = self.jobs.get(&run.job).is_some_and(|l| {
            l.job.attempt == run.attempt
                && l.job.replica(&run.replica).is_some_and(|r| r.restart == run.restart && r.state.is_live())
        });
        if live {
            if let Some(old) = self.stops.insert(run, StopTrack { seq, dir, tries: 0, next: None }) {
                // The same run stopped twice (e.g. a cancel during a stop): one entry is enough.
                if let Err(e) = self.store.outbox_done(old.seq) {
                    tracing::error!("outbox: {e}");
                }
            }
        }
        live
    }

    /// The run is gone (its `Exited` report): its stop is done.
    pub(super) fn run_gone(&mut self, run: &RunId) -> Result<(), StoreError> {
        if let Some(t) = self.stops.remove(run) {
            self.store.outbox_done(t.seq)?;
        }
        Ok(())
    }

    /// What the executor did with a stop or kill.
    pub(super) fn stop_report(&mut self, report: Report, now: Micros) {
        let grace = self.svc.cfg.settings.grace_period_secs as Micros * 1_000_000;
        let (run, next) = match report {
            Report::StopSent { run } => (run, Ok((grace + STOP_MARGIN, Step::Kill))),
            Report::Killed { run } => (run, Ok((KILL_AGAIN, Step::Kill))),
            Report::StopFailed { run, error } => (run, Err((error, Step::Stop))),
            Report::KillFailed { run, error } => (run, Err((error, Step::Kill))),
            Report::Launched { .. }
            | Report::LaunchLater { .. }
            | Report::Purged { .. }
            | Report::Observed { .. }
            | Report::TrialMetrics { .. }
            | Report::EngineReasons(_)
            | Report::Suggested { .. } => return,
        };
        let Some(t) = self.stops.get_mut(&run) else { return };
        t.next = Some(match next {
            Ok((after, step)) => (now + after, step),
            Err((error, step)) => {
                t.tries += 1;
                let delay = backoff(t.tries);
                tracing::warn!("{run}: stop not delivered ({error}); asking again in {} s (L20)", delay / 1_000_000);
                (now + delay, step)
            }
        });
    }

    /// Stops whose time has come: asked again after a refusal, or escalated to a kill that
    /// does not need the run's supervisor.
    pub(super) fn stop_timers(&mut self, now: Micros) {
        let due: Vec<(RunId, Step, PathBuf)> = self
            .stops
            .iter_mut()
            .filter_map(|(r, t)| match t.next {
                Some((at, step)) if at <= now => {
                    t.next = None;
                    Some((r.clone(), step, t.dir.clone()))
                }
                _ => None,
            })
            .collect();
        for (run, step, dir) in due {
            match step {
                Step::Stop => self.exec.submit(Work::Stop { run, dir }),
                Step::Kill => {
                    tracing::warn!("{run}: not stopped within the grace period; killing it without its supervisor (L20)");
                    self.exec.submit(Work::Kill { run, dir });
                }
            }
        }
    }

    /// When a stop next needs attention.
    pub(super) fn next_stop_timer(&self) -> Option<Micros> {
        self.stops.values().filter_map(|t| t.next.map(|(at, _)| at)).min()
    }
}
