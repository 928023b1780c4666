//! The pure core of Trainyard: the job lifecycle (`step`), admission (`schedule`), the
//! machine-type catalog and the replica environment. No clock, no threads, no files.

pub mod run;

pub use run::{Outcome, RunId};
