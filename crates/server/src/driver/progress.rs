//! Progress and ETA of running jobs (`trainyardProgress`): their primary replica's
//! `$TRAINYARD_PROGRESS_FILE` (or a trial's cloudml-hypertune `global_step`), read every
//! few seconds on the observing thread, measured by `core::progress`, shown to readers
//! and at `/metrics`. Kept in memory only: a start reads the files again.

use super::*;
use trainyard_core::progress::Track;

/// How often running jobs' progress files are read.
pub(super) const PROGRESS_EVERY: Micros = 5_000_000;

impl Driver {
    /// Ask for the running jobs' progress, every `PROGRESS_EVERY`, one read at a time.
    pub(super) fn poll_progress(&mut self, now: Micros) {
        if self.progress_in_flight || now - self.last_progress_poll < PROGRESS_EVERY {
            return;
        }
        self.last_progress_poll = now;
        let data = &self.svc.cfg.data_dir;
        let sources: Vec<crate::executor::ProgressSource> = self
            .jobs
            .values()
            .filter(|l| matches!(l.job.phase, Phase::Running { .. }))
            .filter_map(|l| {
                let primary = l.job.replicas.iter().find(|r| r.is_primary())?;
                Some(crate::executor::ProgressSource {
                    job: l.job.id,
                    replica: primary.name.clone(),
                    progress_file: data.join(launch::progress_rel(l.job.id, &primary.name)).join(launch::PROGRESS_FILE),
                    offset: self.progress.get(&l.job.id).map_or(0, |p| p.offset),
                    metric_file: l.job.trial.is_some().then(|| self.metric_file_of(l.job.id, &primary.name)),
                })
            })
            .collect();
        if sources.is_empty() {
            if !self.progress.is_empty() {
                self.progress.clear();
                self.publish_progress(now);
            }
            return;
        }
        self.progress_in_flight = true;
        self.exec.submit(crate::executor::Work::ReadProgress(sources));
    }

    /// What was read: each job's latest report measured; a progress file's first line
    /// that is ignored is said once per job, in its log.
    pub(super) fn progress_read(&mut self, seen: Vec<crate::executor::ProgressSeen>, now: Micros) -> Result<(), StoreError> {
        self.progress_in_flight = false;
        for s in seen {
            // A job that ended meanwhile is no longer followed (see `remove_live`).
            let Some(live) = self.jobs.get(&s.job) else { continue };
            let p = self.progress.entry(s.job).or_default();
            p.offset = s.offset;
            if let Some(r) = s.report {
                p.track.push(now, r);
            }
            if let Some(bad) = s.bad.filter(|_| !std::mem::replace(&mut p.warned, true)) {
                let text = format!("Progress: a line of {}'s progress file is ignored ({bad}); later ones are ignored silently.", s.replica);
                let line = Effect::Log(trainyard_core::step::LogLine { attempt: live.job.attempt, replica: Some(s.replica.clone()), text });
                Driver::timed(&self.metrics, "commit", || self.store.commit(&live.job, &[line], now))?;
            }
        }
        self.publish_progress(now);
        Ok(())
    }

    /// Show what is measured to readers and at `/metrics`.
    fn publish_progress(&self, now: Micros) {
        let mut shown = HashMap::new();
        let mut gauges = Vec::new();
        for (id, p) in &self.progress {
            let (Some(v), Some(live)) = (p.track.view(now), self.jobs.get(id)) else { continue };
            shown.insert(
                *id,
                trainyard_api::types::TrainyardProgress {
                    step: v.step.to_string(),
                    total: v.total.map(|t| t.to_string()).unwrap_or_default(),
                    steps_per_second: v.steps_per_second.map(|r| (r * 1000.0).round() / 1000.0),
                    eta: v.eta.map(trainyard_api::Timestamp::from_micros),
                },
            );
            gauges.push((crate::metrics::JobIdLabels { project: live.job.project.clone(), job: id.to_string() }, v));
        }
        self.waiting_view.publish_progress(shown);
        self.metrics.set_progress(&gauges);
    }
}

/// What was read of a running job's progress file: its reports over time, how much of
/// the file, and whether an ignored line was said (once per job).
#[derive(Default)]
pub(super) struct JobProgress {
    track: Track,
    offset: u64,
    warned: bool,
}
