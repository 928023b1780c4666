//! The admission round ([`plan`]): each job in order through the stages, on the cluster's
//! own free capacity (journaled, rolled back at the end).

use std::sync::Arc;
use crate::collections::{HashMap, HashSet};
use crate::capacity::{Need, NeverFit, NodeIx, Res, Work};
use crate::job::Micros;
use crate::quota::Book;
use super::cluster::{Cluster, Scratch};
use super::config::SchedulerConfig;
use super::decision::Decision;

pub(super) struct Round<'a, 'r> {
    pub(super) c: &'a Cluster,
    pub(super) cfg: &'a SchedulerConfig,
    pub(super) now: Micros,
    pub(super) w: Work,
    pub(super) out: Vec<Decision>,
    /// Reservations in the order they were made (the order of the jobs).
    pub(super) resvs: Vec<Resv>,
    /// This round's placements: expected end and what they hold (for the timeline).
    pub(super) placed: Vec<(Micros, Vec<(NodeIx, Need)>)>,
    /// Uniform shapes that did not fit (anything at least as big does not fit either).
    pub(super) failed: Vec<(Need, usize)>,
    /// The same, for jobs that would run past a reservation, with their expected end: a
    /// job that ends no earlier is bound by at least the same reservations.
    pub(super) failed_long: Vec<(Need, usize, Micros)>,
    pub(super) empty_fit: HashMap<(Need, usize), bool>,
    pub(super) empty_fit_mixed: HashMap<Vec<Need>, bool>,
    /// Mixed gangs that did not fit this round: as a job that ends before every
    /// reservation, and the earliest end of one that failed running past some.
    pub(super) failed_mixed: HashMap<Vec<Need>, (bool, Option<Micros>)>,
    /// Shapes that can never fit the fleet (see `Cluster::never_fits`), by shape.
    pub(super) never_uniform: HashMap<(Need, usize), Option<NeverFit>>,
    pub(super) never_mixed: HashMap<Vec<Need>, Option<NeverFit>>,
    pub(super) chosen: HashSet<u64>,
    pub(super) preempt_tries: usize,
    /// Strict order (no backfill): a job ahead does not fit, so nothing passes it.
    pub(super) blocked: bool,
    /// Quota through the round (L3), with the cohorts' reclaims.
    pub(super) book: Book<'r>,
    /// Reasons already written this round, by what they depend on; cleared whenever the
    /// round's state moves (a placement, a reservation, a preemption).
    pub(super) memo: HashMap<Memo, Arc<str>>,
    /// The highest priority of a job that waits for capacity so far this round.
    pub(super) waiting_max: Option<i64>,
    /// The job being decided waits behind a job of a higher priority class.
    pub(super) behind_higher: bool,
    /// The cluster's scratch space, for the reservations (see [`View`]).
    pub(super) scratch: Scratch,
}

/// Whether a round goes on after a job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Next {
    Continue,
    /// Strict order without explanations: nothing after it can start.
    Stop,
}

impl<'a, 'r> Round<'a, 'r> {
    /// A round on `c`, whose free capacity `w` is (taken out of `c` for the round).
    pub(super) fn new(c: &'a Cluster, w: Work, scratch: Scratch, cfg: &'a SchedulerConfig, now: Micros, book: Book<'r>) -> Round<'a, 'r> {
        Round {
            c,
            cfg,
            now,
            w,
            out: Vec::new(),
            resvs: Vec::new(),
            placed: Vec::new(),
            failed: Vec::new(),
            failed_long: Vec::new(),
            empty_fit: HashMap::default(),
            empty_fit_mixed: HashMap::default(),
            never_uniform: HashMap::default(),
            never_mixed: HashMap::default(),
            failed_mixed: HashMap::default(),
            chosen: HashSet::default(),
            preempt_tries: 0,
            blocked: false,
            book,
            memo: HashMap::default(),
            waiting_max: None,
            behind_higher: false,
            scratch,
        }
    }
}

/// What a memoised waiting reason depends on, besides the round's state.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) enum Memo {
    Quota(Vec<(String, u64, u64, u64)>),
    Blocked,
    Capacity(Vec<Need>, bool, bool),
}

impl Round<'_, '_> {
    /// The reason for `key`, written once per state of the round.
    pub(super) fn memo(&mut self, key: Memo, make: impl FnOnce(&mut Self) -> String) -> Arc<str> {
        if let Some(r) = self.memo.get(&key) {
            return Arc::clone(r);
        }
        let r: Arc<str> = make(self).into();
        self.memo.insert(key, Arc::clone(&r));
        r
    }
}

/// A reservation: for the head of the order (EASY backfill) and for every job past the
/// starvation bound.
#[derive(Clone, Debug)]
pub(super) struct Resv {
    /// When enough capacity is expected to be free (from expected ends).
    pub(super) time: Micros,
    pub(super) nodes: Vec<(NodeIx, i64)>,
    /// What a job that runs past `time` may still take on each reserved node.
    pub(super) slack: HashMap<NodeIx, Res>,
    /// The reserved job's replica need and expected end if it starts at `time`: a later
    /// reservation counts this capacity as held until then.
    pub(super) need: Need,
    pub(super) end: Micros,
}

/// What became of a job's try at a place this round.
pub(super) struct Miss {
    /// It was not even tried (a shape known not to fit this round).
    pub(super) skip: bool,
    /// When it would end if it started now.
    pub(super) end: Micros,
    /// It would still run when a reservation is due.
    pub(super) long: bool,
    /// Its one replica need and count, when every replica is alike.
    pub(super) uniform: Option<(Need, usize)>,
}
