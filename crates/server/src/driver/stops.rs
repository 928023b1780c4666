//! L20: stops that are seen through. A stop's outbox entry stays until its run is seen
//! gone (its `Exited` report): a stop the engine refused is asked again with backoff, and
//! a stop not honoured within the grace period (a shim that does not answer, e.g. one
//! stopped with SIGSTOP) is escalated to a kill that does not need the shim, and that kill
//! is repeated until the run is gone. Nothing is marked done and forgotten.

use super::*;
use crate::executor::{Report, Work};
use trainyard_core::retry::{self, StopReport, StopStep};

/// A stop in flight: its outbox entry and run directory, and the core's track of it
/// (`retry::StopTrack`: what to send next and when).
pub(super) struct StopTrack {
    seq: i64,
    dir: PathBuf,
    rule: retry::StopTrack,
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
            if let Some(old) = self.stops.insert(run, StopTrack { seq, dir, rule: retry::StopTrack::default() }) {
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
        let (run, report, error) = match report {
            Report::StopSent { run } => (run, StopReport::StopSent, None),
            Report::Killed { run } => (run, StopReport::Killed, None),
            Report::StopFailed { run, error } => (run, StopReport::StopFailed, Some(error)),
            Report::KillFailed { run, error } => (run, StopReport::KillFailed, Some(error)),
            Report::Launched { .. }
            | Report::LaunchLater { .. }
            | Report::Purged { .. }
            | Report::LogsPurged { .. }
            | Report::Observed { .. }
            | Report::TrialMetrics { .. }
            | Report::EngineReasons(_)
            | Report::ProgressRead(_)
            | Report::Suggested { .. }
            | Report::VizierSuggested { .. }
            | Report::TenantCpu { .. } => return,
        };
        let Some(t) = self.stops.get_mut(&run) else { return };
        if let Some(delay) = t.rule.reported(report, grace, now) {
            let error = error.unwrap_or_default();
            tracing::warn!("{run}: stop not delivered ({error}); asking again in {} s (L20)", delay / 1_000_000);
        }
    }

    /// Stops whose time has come: asked again after a refusal, or escalated to a kill that
    /// does not need the run's supervisor.
    pub(super) fn stop_timers(&mut self, now: Micros) {
        let due: Vec<(RunId, StopStep, PathBuf)> =
            self.stops.iter_mut().filter_map(|(r, t)| t.rule.due(now).map(|step| (r.clone(), step, t.dir.clone()))).collect();
        for (run, step, dir) in due {
            match step {
                StopStep::Stop => self.exec.submit(Work::Stop { run, dir }),
                StopStep::Kill => {
                    tracing::warn!("{run}: not stopped within the grace period; killing it without its supervisor (L20)");
                    self.exec.submit(Work::Kill { run, dir });
                }
            }
        }
    }

    /// When a stop next needs attention.
    pub(super) fn next_stop_timer(&self) -> Option<Micros> {
        self.stops.values().filter_map(|t| t.rule.at()).min()
    }
}
