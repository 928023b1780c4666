//! Bad nodes kept out (L9): a node on which replicas of jobs of at least two different
//! projects fail `after` times within `window` is quarantined (no new placements) until an
//! administrator lifts it. Only evidence about the node counts: the lifecycle reports lost
//! runs and launches the engine could not make (`Effect::NodeFailed`), never a failure a
//! tenant can cause on purpose (an exit, a death by a signal, an OOM, a failure rule's log
//! match), and one project's failures alone never quarantine a node, so no tenant can take
//! a node from the others. A quarantine that would leave no usable node is refused.

use std::collections::{BTreeMap, VecDeque};

use serde::{Deserialize, Serialize};

use crate::Micros;

/// One failure on a node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    pub job: u64,
    /// The job's project (failures stored before projects were kept have none).
    #[serde(default)]
    pub project: String,
    pub replica: String,
    pub at: Micros,
    /// What happened, in words ("killed by signal 9").
    pub what: String,
}

/// What a failure leads to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Counted; the node stays in.
    Counted,
    /// The node is quarantined, for these failures.
    Quarantine(Vec<Failure>),
    /// The failures would quarantine the node, but no other node would take placements:
    /// it stays in (the failures are forgotten, so the next ones count afresh).
    Refused(Vec<Failure>),
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

    /// L9: a failure on `node`; `others_usable`: whether another node would still take
    /// placements if this one were quarantined.
    pub fn record(&mut self, node: &str, f: Failure, others_usable: bool) -> Verdict {
        if self.after == 0 {
            return Verdict::Counted;
        }
        let q = self.recent.entry(node.to_string()).or_default();
        let since = f.at.saturating_sub(self.window);
        q.push_back(f);
        while q.front().is_some_and(|x| x.at < since) {
            q.pop_front();
        }
        let mut projects: Vec<&str> = q.iter().map(|x| x.project.as_str()).collect();
        projects.sort_unstable();
        projects.dedup();
        if q.len() < self.after as usize || projects.len() < 2 {
            return Verdict::Counted;
        }
        let failures: Vec<Failure> = q.drain(..).collect();
        if others_usable {
            Verdict::Quarantine(failures)
        } else {
            Verdict::Refused(failures)
        }
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

    fn f(project: &str, job: u64, at: Micros) -> Failure {
        Failure { job, project: project.into(), replica: "workerpool0-0".into(), at, what: "lost".into() }
    }

    fn quarantined(v: Verdict) -> Option<usize> {
        match v {
            Verdict::Quarantine(f) => Some(f.len()),
            _ => None,
        }
    }

    /// L9: three failures of two projects' jobs within the window quarantine; one
    /// project's failures alone (however many jobs), or failures spread beyond the
    /// window, do not.
    /// Holds TY8 (docs/lifecycle.md).
    #[test]
    fn l9_failures_of_two_projects_within_the_window_quarantine() {
        let mut t = Tracker::new(3, 3600 * SECOND);
        assert_eq!(t.record("n1", f("evil", 1, 0), true), Verdict::Counted);
        assert_eq!(t.record("n1", f("evil", 2, SECOND), true), Verdict::Counted);
        assert_eq!(t.record("n1", f("evil", 3, 2 * SECOND), true), Verdict::Counted, "one project's jobs alone");
        assert_eq!(t.record("n1", f("evil", 4, 3 * SECOND), true), Verdict::Counted, "one project's jobs alone");
        assert_eq!(quarantined(t.record("n1", f("victim", 5, 4 * SECOND), true)), Some(5));
        let mut t = Tracker::new(3, 60 * SECOND);
        assert_eq!(t.record("n1", f("a", 1, 0), true), Verdict::Counted);
        assert_eq!(t.record("n1", f("b", 2, 30 * SECOND), true), Verdict::Counted);
        assert_eq!(t.record("n1", f("c", 3, 100 * SECOND), true), Verdict::Counted, "the first is out of the window");
        assert_eq!(t.record("n2", f("d", 4, 101 * SECOND), true), Verdict::Counted, "another node");
        assert_eq!(t.record("n1", f("d", 4, 110 * SECOND), true), Verdict::Counted, "two within the window");
        assert_eq!(quarantined(t.record("n1", f("e", 5, 120 * SECOND), true)), Some(3));
        assert_eq!(Tracker::new(0, SECOND).record("n1", f("a", 1, 0), true), Verdict::Counted, "off");
    }

    /// L9: a quarantine that would leave no usable node is refused, and the failures that
    /// asked for it are forgotten.
    #[test]
    fn l9_a_quarantine_that_leaves_no_usable_node_is_refused() {
        let mut t = Tracker::new(2, 3600 * SECOND);
        assert_eq!(t.record("n1", f("a", 1, 0), false), Verdict::Counted);
        assert!(matches!(t.record("n1", f("b", 2, SECOND), false), Verdict::Refused(v) if v.len() == 2));
        assert_eq!(t.record("n1", f("c", 3, 2 * SECOND), true), Verdict::Counted, "counted afresh");
        assert_eq!(quarantined(t.record("n1", f("d", 4, 3 * SECOND), true)), Some(2));
    }
}
