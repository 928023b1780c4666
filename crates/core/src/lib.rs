//! The pure core of Trainyard: the job lifecycle (`step`), admission (`schedule`), the
//! machine-type catalog and the replica environment. No clock, no threads, no files.

pub mod capacity;
pub mod catalog;
pub mod clock_text;
pub mod collections;
pub mod env;
pub mod fleet;
pub mod goodput;
pub mod gpu;
pub mod replace;
pub mod retry;
pub mod rng;
pub mod job;
pub mod run;
pub mod preempt;
pub mod progress;
pub mod quarantine;
pub mod quota;
pub mod schedule;
pub mod step;

pub use job::{Job, Micros, Phase, Settings, State};
pub use run::{Outcome, RunId};
pub use step::{step, Effect, Event, Transition};
