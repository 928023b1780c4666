//! Goodput (`trainyardGoodput`): where a job's time went, from what the lifecycle already
//! knows. Each transition of a job (`step`) adds the time since the last one to the bucket
//! of the state the job was in: queued (waiting for quota or placement), starting
//! (replicas launched, not all up), productive (running), idle (running while a replica is
//! hung, stopped, or being (re)started: allocated, no progress) or lost (an attempt being
//! shut down for a retry, a preemption or a failure). Productive time since the last
//! checkpoint is unsaved: when work is thrown away (a replica restarts, an elastic replica
//! leaves or joins, which restarts torch's workers from their checkpoint, or the job starts a
//! new attempt), it moves from productive to lost.
//!
//! Accelerator time is the same split weighted by the accelerators that the job's live
//! replicas hold. Nothing here reads a clock: `now` is passed in, and a reader adds the
//! time since the last transition with [`Goodput::until`].

pub use crate::job::{Goodput, Split};
use crate::job::{After, Job, Micros, Phase, ReplicaState, Wait};

impl Split {
    pub fn total(&self) -> Micros {
        self.queued + self.starting + self.productive + self.idle + self.lost
    }

    fn slot(&mut self, b: Bucket) -> Option<&mut Micros> {
        match b {
            Bucket::Queued => Some(&mut self.queued),
            Bucket::Starting => Some(&mut self.starting),
            Bucket::Productive => Some(&mut self.productive),
            Bucket::Idle => Some(&mut self.idle),
            Bucket::Lost => Some(&mut self.lost),
            Bucket::Ended => None,
        }
    }

    fn lose(&mut self, unsaved: Micros) {
        let moved = unsaved.min(self.productive);
        self.productive -= moved;
        self.lost += moved;
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Bucket {
    Queued,
    Starting,
    Productive,
    Idle,
    Lost,
    Ended,
}

fn bucket(job: &Job) -> Bucket {
    match &job.phase {
        Phase::Queued | Phase::Pending { wait: Wait::Placement { .. } | Wait::Capacity { .. }, .. } => Bucket::Queued,
        Phase::Pending { wait: Wait::Starting, .. } => Bucket::Starting,
        Phase::Running { .. } => {
            let stalled = job.replicas.iter().any(|r| {
                (r.state.is_live() && (r.hung_since.is_some() || r.suspended))
                    || matches!(r.state, ReplicaState::Launching | ReplicaState::Stopping { .. })
            });
            if stalled {
                Bucket::Idle
            } else {
                Bucket::Productive
            }
        }
        Phase::Stopping { then: After::Succeed, .. } => Bucket::Productive,
        Phase::Stopping { .. } => Bucket::Lost,
        Phase::Succeeded { .. } | Phase::Failed { .. } | Phase::Cancelled { .. } => Bucket::Ended,
    }
}

/// The accelerators the job's live replicas hold.
fn accelerators(job: &Job) -> i64 {
    job.replicas
        .iter()
        .zip(&job.demand.replicas)
        .filter(|(r, _)| r.state.is_live())
        .filter_map(|(_, d)| d.accelerator.as_ref().map(|(_, c)| *c as i64))
        .sum()
}

impl Goodput {
    /// `job`'s account with the time up to `now` added, in the bucket of the state `job` is
    /// in (its own account is `job.goodput`).
    pub fn until(job: &Job, now: Micros) -> Goodput {
        let mut g = job.goodput;
        let from = if g.at == 0 { job.create_time } else { g.at };
        let dt = now.saturating_sub(from).max(0);
        let b = bucket(job);
        let acc = dt.saturating_mul(accelerators(job));
        if let Some(w) = g.wall.slot(b) {
            *w += dt;
        }
        if let Some(a) = g.accelerator.slot(b) {
            *a += acc;
        }
        if b == Bucket::Productive {
            g.unsaved.0 += dt;
            g.unsaved.1 += acc;
        }
        g.at = now.max(from);
        g
    }

    /// The account after a transition from `old` to `new` at `now`: the time since the
    /// last one in `old`'s bucket, unsaved work lost if the transition threw it away, and
    /// nothing unsaved after a checkpoint (`checkpointed`).
    pub fn after(old: &Job, new: &Job, now: Micros, checkpointed: bool) -> Goodput {
        let mut g = Goodput::until(old, now);
        if threw_work_away(old, new) {
            g.wall.lose(g.unsaved.0);
            g.accelerator.lose(g.unsaved.1);
            g.unsaved = (0, 0);
        }
        if checkpointed {
            g.unsaved = (0, 0);
        }
        g
    }

    /// Productive wall time over all wall time so far (None before any time passed).
    pub fn ratio(&self) -> Option<f64> {
        let total = self.wall.total();
        (total > 0).then(|| self.wall.productive as f64 / total as f64)
    }
}

/// A new attempt, a replica's new run (a restart, a move, an elastic replica joining) or
/// an elastic replica leaving: the job's workers go back to their last checkpoint.
fn threw_work_away(old: &Job, new: &Job) -> bool {
    if new.attempt != old.attempt {
        return true;
    }
    old.replicas.iter().zip(&new.replicas).any(|(a, b)| {
        let away = |r: &crate::job::Replica| matches!(r.state, ReplicaState::Away { .. });
        b.restart != a.restart || (away(b) && a.state.is_live()) || (away(a) && !away(b))
    })
}
