//! A TrainingPipeline of the custom task: one CustomJob, run under the lifecycle rules,
//! whose state the pipeline follows (PIPELINE_STATE_*). A pure state machine; the driver
//! (`driver::pipelines`) commits it and acts on it.

use serde::{Deserialize, Serialize};
use trainyard_api::PipelineState;
use trainyard_core::{Micros, State};

/// The stored state of a pipeline (the `core` column of its row).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pipeline {
    pub id: u64,
    pub project: String,
    pub region: String,
    pub create_time: Micros,
    pub update_time: Micros,
    #[serde(default)]
    pub start_time: Option<Micros>,
    #[serde(default)]
    pub end_time: Option<Micros>,
    pub state: PipelineState,
    /// FAILED or CANCELLED: the code and message.
    #[serde(default)]
    pub error: Option<(i32, String)>,
    /// The backing CustomJob, once it exists.
    #[serde(default)]
    pub custom_job: Option<u64>,
}

/// What happens to a pipeline.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// Its CustomJob was created.
    JobCreated(u64),
    /// Its CustomJob is in this state now (with its error when it ended in one).
    Job { state: State, error: Option<(i32, String)> },
    /// Its CustomJob could not be created at all.
    JobRefused(String),
    /// A cancel was asked.
    Cancel,
}

/// What the driver does after a step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    CancelJob(u64),
    Log(String),
}

impl Pipeline {
    pub fn new(id: u64, project: String, region: String, now: Micros) -> Pipeline {
        Pipeline {
            id,
            project,
            region,
            create_time: now,
            update_time: now,
            start_time: None,
            end_time: None,
            state: PipelineState::Pending,
            error: None,
            custom_job: None,
        }
    }

    pub fn is_terminal(&self) -> bool {
        matches!(self.state, PipelineState::Succeeded | PipelineState::Failed | PipelineState::Cancelled)
    }

    pub fn state_name(&self) -> &'static str {
        self.state.name()
    }

    fn end(&mut self, state: PipelineState, error: Option<(i32, String)>, now: Micros) {
        self.state = state;
        self.error = error;
        self.end_time = Some(now);
    }

    /// One step: the next state and what to do.
    pub fn step(&self, event: Event, now: Micros) -> (Pipeline, Vec<Action>) {
        let mut p = self.clone();
        let mut actions = Vec::new();
        if p.is_terminal() {
            return (p, actions);
        }
        p.update_time = now;
        match event {
            Event::JobCreated(j) => {
                p.custom_job = Some(j);
                actions.push(Action::Log(format!("Training pipeline {}: its CustomJob is {j}.", p.id)));
            }
            Event::JobRefused(message) => {
                actions.push(Action::Log(format!("Training pipeline {}: its CustomJob could not be created: {message}", p.id)));
                p.end(PipelineState::Failed, Some((3, message)), now);
            }
            Event::Cancel => match p.custom_job {
                Some(j) => {
                    p.state = PipelineState::Cancelling;
                    actions.push(Action::CancelJob(j));
                }
                None => p.end(PipelineState::Cancelled, Some((1, "CANCELED".into())), now),
            },
            Event::Job { state, error } => match state {
                State::Running if p.state != PipelineState::Cancelling => {
                    p.state = PipelineState::Running;
                    p.start_time.get_or_insert(now);
                }
                State::Succeeded => p.end(PipelineState::Succeeded, None, now),
                State::Failed => p.end(PipelineState::Failed, error.or(Some((13, "the training job failed".into()))), now),
                State::Cancelled => p.end(PipelineState::Cancelled, error.or(Some((1, "CANCELED".into()))), now),
                _ => {}
            },
        }
        (p, actions)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn follows_its_custom_job_and_cascades_a_cancel() {
        let p = Pipeline::new(1, "p".into(), "r".into(), 0);
        let (p, _) = p.step(Event::JobCreated(2), 1);
        assert_eq!((p.state, p.custom_job), (PipelineState::Pending, Some(2)));
        let (p, _) = p.step(Event::Job { state: State::Running, error: None }, 2);
        assert_eq!((p.state, p.start_time), (PipelineState::Running, Some(2)));
        let (done, _) = p.step(Event::Job { state: State::Succeeded, error: None }, 3);
        assert_eq!((done.state, done.end_time), (PipelineState::Succeeded, Some(3)));
        let (c, actions) = p.step(Event::Cancel, 4);
        assert_eq!((c.state, actions), (PipelineState::Cancelling, vec![Action::CancelJob(2)]));
        let (c, _) = c.step(Event::Job { state: State::Cancelled, error: Some((1, "CANCELED".into())) }, 5);
        assert_eq!(c.state, PipelineState::Cancelled);
        // Ended is ended.
        let (same, a) = c.step(Event::Job { state: State::Running, error: None }, 6);
        assert_eq!((same.state, a.len()), (PipelineState::Cancelled, 0));
        let (failed, _) = Pipeline::new(3, "p".into(), "r".into(), 0).step(Event::JobRefused("quota".into()), 1);
        assert_eq!(failed.state, PipelineState::Failed);
    }
}
