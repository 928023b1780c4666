//! What a round decides for each waiting job ([`Decision`]), the job as a round sees it
//! ([`Request`]), where it stands in its project's order ([`Position`]), and the kinds of
//! waiting reasons.

use std::collections::BTreeMap;
use std::sync::Arc;
use crate::capacity::{NodeIx, Shape};
use crate::job::Micros;

/// What the scheduler decided for one job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Admit (L5) or place again (L15): `nodes[i]` runs replica i. `warnings` say what an
    /// overcommitting node lacks (the replica runs anyway).
    Place { job: u64, nodes: Vec<String>, warnings: Vec<String> },
    /// L15: the fleet cannot hold the attempt for reasons outside the queue.
    Stockout { job: u64, detail: String },
    /// The job can never be placed on this fleet, not even with every node up and empty
    /// (the configuration lost nodes since it was created): feed `Event::Impossible`.
    /// `reason` names the job's pool and the largest node.
    Impossible { job: u64, reason: String },
    /// The job keeps waiting; `reason` says why in plain words (with numbers that move:
    /// what is in use, expected times), `position` where it stands in the order; see
    /// [`waiting_text`]. Jobs in the same situation share one `reason`. `kind` names the
    /// reason without its numbers: the server logs and stores a reason when its kind
    /// changes, not when a number moves.
    /// `reserved_at`: the job holds a reservation this round, and that is its expected
    /// start (the time no later job may delay).
    Wait { job: u64, kind: &'static str, reason: Arc<str>, position: Option<Position>, reserved_at: Option<Micros> },
    /// A SPOT job's capacity is needed by non-SPOT work: feed `Event::Preempt`. With
    /// `by_priority`, a job of a lower priority class whose capacity a job of that
    /// priority needs (`[scheduler] priority_preemption`): feed `Event::PreemptForPriority`.
    /// `reclaim`: a job running on quota borrowed from its cohort, whose lender needs it
    /// back: feed `Event::PreemptForPriority` with `requeue` (it gives its quota back).
    Preempt { job: u64, reason: String, by_priority: Option<i64>, reclaim: bool },
}

/// Where a waiting job stands in the scheduling order, among its own project's waiting
/// jobs (never counting other projects').
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Position {
    /// 1-based, among the project's waiting jobs.
    pub pos: u32,
    /// The project's waiting jobs.
    pub total: u32,
    /// FIFO order (else fair-share).
    pub fifo: bool,
}

/// One job waiting for placement, in the scheduler's compact form.
#[derive(Clone, Debug)]
pub struct Request<'a> {
    pub id: u64,
    pub project: &'a str,
    /// Creation time: FIFO order within a project, and the age for starvation.
    pub submitted: Micros,
    /// Quota is already held (L5): placement again after a stockout or a preemption.
    pub admitted: bool,
    pub spot: bool,
    pub shape: &'a Shape,
    /// Quota demand (L3).
    pub metrics: &'a BTreeMap<String, u64>,
    /// Expected run time once placed (timeout or hint): used for backfill.
    pub duration: Micros,
    /// Its priority class's value ([`PriorityClasses`]): higher is considered first.
    pub priority: i64,
    /// It may run on quota borrowed from its project's cohort.
    pub may_borrow: bool,
    /// Nodes its replicas failed on: placed elsewhere when another node fits.
    pub avoid: Vec<NodeIx>,
}

/// A waiting reason as shown: the reason, then where the job stands (in its own
/// project's words).
pub fn waiting_text(reason: &str, position: Option<Position>, project: &str) -> String {
    match position {
        Some(p) => {
            let order = if p.fifo { "FIFO order" } else { "fair-share order" };
            format!("{reason}; position {} of {} among project {project}'s waiting jobs ({order}).", p.pos, p.total)
        }
        None => format!("{reason}."),
    }
}

/// Kinds of waiting reasons (see [`Decision::Wait`]).
pub const KIND_QUOTA: &str = "quota";
pub const KIND_CAPACITY: &str = "capacity";
pub const KIND_RESERVED: &str = "reserved";
pub const KIND_BEHIND_RESERVATION: &str = "behind-reservation";
pub const KIND_BLOCKED: &str = "blocked";
pub const KIND_SPOT: &str = "spot";
pub const KIND_PREEMPTING: &str = "preempting";
pub const KIND_RECLAIM: &str = "reclaim";
pub const KIND_LENT: &str = "lent";
