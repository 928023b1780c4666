//! Bad nodes kept out: a node on which replicas of at least two different jobs fail
//! `after` times within `window` is quarantined (no new placements) until an
//! administrator lifts it. Failures that are the user's own (a permanent error, L13, or
//! running out of memory, L14) do not count: the lifecycle reports only signal deaths
//! (L10), lost runs (L9) and exits a failure rule sends away from their node.

use std::collections::{BTreeMap, VecDeque};

use serde::{Deserialize, Serialize};

use crate::Micros;

/// One failure on a node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    pub job: u64,
    pub replica: String,
    pub at: Micros,
    /// What happened, in words ("killed by signal 9").
    pub what: String,
}

/// Recent failures per node.
#[derive(Clone, Debug, Default)]
pub struct Tracker {
    after: u32,
    window: Micros,
    recent: BTreeMap<String, VecDeque<Failure>>,
}

impl Tracker {
    /// `after` failures (0: never) within `window`.
    pub fn new(after: u32, window: Micros) -> Tracker {
        Tracker { after, window, recent: BTreeMap::new() }
    }

    /// A failure on `node`: the failures that quarantine it, if it is now quarantined.
    pub fn record(&mut self, node: &str, f: Failure) -> Option<Vec<Failure>> {
        if self.after == 0 {
            return None;
        }
        let q = self.recent.entry(node.to_string()).or_default();
        let since = f.at.saturating_sub(self.window);
        q.push_back(f);
        while q.front().is_some_and(|x| x.at < since) {
            q.pop_front();
        }
        let mut jobs: Vec<u64> = q.iter().map(|x| x.job).collect();
        jobs.sort_unstable();
        jobs.dedup();
        if q.len() >= self.after as usize && jobs.len() >= 2 {
            let failures: Vec<Failure> = q.drain(..).collect();
            return Some(failures);
        }
        None
    }

    /// The node was let back in: its past failures are forgotten.
    pub fn clear(&mut self, node: &str) {
        self.recent.remove(node);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::SECOND;

    fn f(job: u64, at: Micros) -> Failure {
        Failure { job, replica: "workerpool0-0".into(), at, what: "killed by signal 9".into() }
    }

    /// Three failures of two jobs within the window quarantine; one job's failures alone,
    /// or failures spread beyond the window, do not.
    #[test]
    fn failures_of_two_jobs_within_the_window_quarantine() {
        let mut t = Tracker::new(3, 3600 * SECOND);
        assert!(t.record("n1", f(1, 0)).is_none());
        assert!(t.record("n1", f(1, SECOND)).is_none());
        assert!(t.record("n1", f(1, 2 * SECOND)).is_none(), "one job's failures alone");
        assert_eq!(t.record("n1", f(2, 3 * SECOND)).map(|v| v.len()), Some(4));
        let mut t = Tracker::new(3, 60 * SECOND);
        assert!(t.record("n1", f(1, 0)).is_none());
        assert!(t.record("n1", f(2, 30 * SECOND)).is_none());
        assert!(t.record("n1", f(3, 100 * SECOND)).is_none(), "the first is out of the window");
        assert!(t.record("n2", f(4, 101 * SECOND)).is_none(), "another node");
        assert!(t.record("n1", f(4, 110 * SECOND)).is_none(), "two within the window");
        assert!(t.record("n1", f(5, 120 * SECOND)).is_some());
        assert!(Tracker::new(0, SECOND).record("n1", f(1, 0)).is_none(), "off");
    }
}
