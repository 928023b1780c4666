//! Quota (L3, L4, L5) and cohorts: projects that lend each other the quota they do not use.
//!
//! Each project has a quota per metric (`[quotas.projects.P]`, else `[quotas.default]`);
//! a metric without a limit is unlimited. Projects in one cohort (`[[quotas.cohorts]]`)
//! may run past their own quota on what the others leave unused: a project borrows at most
//! its `borrowing_limit` (unlimited by default) and lends at most its `lending_limit` (its
//! whole quota by default). Per metric, what the cohort's projects use above their quotas
//! must be covered by what the others lend and do not use themselves:
//!
//! ```text
//! borrowed(X) = max(0, used(X) - quota(X))
//! lendable(X) = max(0, min(lending_limit(X), quota(X) - used(X)))
//! sum of borrowed over the cohort <= sum of lendable over the cohort
//! ```
//!
//! A project that wants quota it owns back (within its own quota) while others borrow it
//! reclaims it: the cheapest set of the borrowers' jobs is preempted and goes back to the
//! queue without its quota (`[scheduler] priority_preemption`; without it, lent quota
//! comes back as the borrowing jobs end). Pure: no clock, no I/O.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::{Deserialize, Serialize};

use crate::job::Job;

/// Quota limits of one region: metric → limit, per project, with a default for projects
/// not listed. A metric without a limit is unlimited.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Quotas {
    pub default: BTreeMap<String, u64>,
    pub projects: BTreeMap<String, BTreeMap<String, u64>>,
    /// Groups of projects that lend each other their unused quota.
    #[serde(default)]
    pub cohorts: Vec<Cohort>,
    /// Per project and metric: at most this much above its own quota (unlimited if absent).
    #[serde(default)]
    pub borrowing_limits: BTreeMap<String, BTreeMap<String, u64>>,
    /// Per project and metric: at most this much of its quota lent (all of it if absent).
    #[serde(default)]
    pub lending_limits: BTreeMap<String, BTreeMap<String, u64>>,
}

/// A cohort: projects that lend each other quota (`[[quotas.cohorts]]`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cohort {
    pub name: String,
    pub projects: Vec<String>,
}

impl Quotas {
    pub fn limit(&self, project: &str, metric: &str) -> Option<u64> {
        self.projects
            .get(project)
            .and_then(|m| m.get(metric))
            .or_else(|| self.default.get(metric))
            .copied()
    }

    /// L4: the metrics whose limit the request exceeds on its own (it could never run):
    /// past its quota and whatever its cohort could lend it.
    pub fn exceeded_by(&self, project: &str, demand: &BTreeMap<String, u64>) -> Vec<String> {
        demand
            .iter()
            .filter(|(m, &need)| self.ceiling(project, m).is_some_and(|l| need > l))
            .map(|(m, _)| m.clone())
            .collect()
    }

    /// The most of `metric` that `project` could ever hold: its quota, plus what its
    /// cohort could lend it at most (within its borrowing limit). None: unlimited.
    pub fn ceiling(&self, project: &str, metric: &str) -> Option<u64> {
        let own = self.limit(project, metric)?;
        let Some(c) = self.cohort_of(project) else { return Some(own) };
        let mut lendable = 0u64;
        for x in c.projects.iter().filter(|x| x.as_str() != project) {
            match self.limit(x, metric) {
                Some(q) => lendable = lendable.saturating_add(self.lend_cap(x, metric, q)),
                None => return None,
            }
        }
        let borrow = self.borrow_cap(project, metric).map_or(lendable, |b| b.min(lendable));
        Some(own.saturating_add(borrow))
    }

    /// The cohort `project` is in.
    pub fn cohort_of(&self, project: &str) -> Option<&Cohort> {
        self.cohorts.iter().find(|c| c.projects.iter().any(|p| p == project))
    }

    /// What `project` lends of its quota `q` at most.
    fn lend_cap(&self, project: &str, metric: &str, q: u64) -> u64 {
        self.lending_limits.get(project).and_then(|m| m.get(metric)).map_or(q, |l| (*l).min(q))
    }

    fn borrow_cap(&self, project: &str, metric: &str) -> Option<u64> {
        self.borrowing_limits.get(project).and_then(|m| m.get(metric)).copied()
    }

    /// Where `project` stands on `metric` using `used` of it: (what it borrows, what it
    /// has unused and may lend), by the module's formula; None when the metric has no limit.
    fn standing(&self, project: &str, metric: &str, used: u64) -> Option<(u64, u64)> {
        let q = self.limit(project, metric)?;
        Some(if used > q { (used - q, 0) } else { (0, self.lend_cap(project, metric, q).min(q - used)) })
    }
}

/// Quota in use per project and metric (L5: held from admission until terminal).
pub fn quota_usage<'a>(jobs: impl IntoIterator<Item = &'a Job>) -> BTreeMap<(String, String), u64> {
    let mut usage = BTreeMap::new();
    for j in jobs.into_iter().filter(|j| j.holds_quota()) {
        for (m, v) in &j.demand.metrics {
            *usage.entry((j.project.clone(), m.clone())).or_insert(0) += v;
        }
    }
    usage
}

/// A job that holds quota in a project of a cohort: what a reclaim may take back.
#[derive(Clone, Debug, PartialEq)]
pub struct Holder {
    pub id: u64,
    pub project: String,
    pub metrics: BTreeMap<String, u64>,
    /// Being stopped for a reclaim already: its quota is released soon.
    pub releasing: bool,
    /// May be preempted for a reclaim (not stopping, not preempted too often).
    pub reclaimable: bool,
    /// The work a preemption loses (since its last checkpoint); the cheapest go first.
    pub cost: u128,
    /// Its start, the youngest first among equal costs.
    pub start: i64,
}

/// The quota held when a round starts: per project and metric, and, in projects of
/// cohorts, by which jobs.
#[derive(Clone, Debug, Default)]
pub struct QuotaUse {
    pub used: BTreeMap<(String, String), u64>,
    pub holders: Vec<Holder>,
}

/// Borrowed and lent amounts of a cohort's projects (for `GET /v1/admin/quotas`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Lending {
    pub borrowed: BTreeMap<String, u64>,
    pub lent: BTreeMap<String, u64>,
}

/// Per project of every cohort: what it uses above its quota (borrowed), and what of its
/// unused quota the borrowers use (lent; the cohort's borrowed total shared among its
/// lenders in proportion to what each has unused and lendable).
pub fn lending(quotas: &Quotas, used: &BTreeMap<(String, String), u64>) -> BTreeMap<String, Lending> {
    let get = |p: &str, m: &str| used.get(&(p.to_string(), m.to_string())).copied().unwrap_or(0);
    let mut out: BTreeMap<String, Lending> = BTreeMap::new();
    for c in &quotas.cohorts {
        let metrics: std::collections::BTreeSet<&str> = c
            .projects
            .iter()
            .flat_map(|p| quotas.projects.get(p).into_iter().flat_map(|m| m.keys()).map(String::as_str))
            .chain(quotas.default.keys().map(String::as_str))
            .collect();
        for m in metrics {
            let mut borrowed = 0u64;
            let mut avail: Vec<(&str, u64)> = Vec::new();
            for p in &c.projects {
                let Some((b, l)) = quotas.standing(p, m, get(p, m)) else { continue };
                if b > 0 {
                    borrowed += b;
                    out.entry(p.clone()).or_default().borrowed.insert(m.to_string(), b);
                } else {
                    avail.push((p, l));
                }
            }
            let total: u64 = avail.iter().map(|a| a.1).sum();
            if borrowed == 0 || total == 0 {
                continue;
            }
            let share = borrowed.min(total);
            let mut given = 0u64;
            let mut parts: Vec<(&str, u64)> =
                avail.iter().map(|(p, a)| (*p, (share as u128 * *a as u128 / total as u128) as u64)).collect();
            given += parts.iter().map(|p| p.1).sum::<u64>();
            for (k, (_, a)) in avail.iter().enumerate() {
                if given >= share {
                    break;
                }
                if parts[k].1 < *a {
                    parts[k].1 += 1;
                    given += 1;
                }
            }
            for (p, v) in parts.into_iter().filter(|p| p.1 > 0) {
                out.entry(p.to_string()).or_default().lent.insert(m.to_string(), v);
            }
        }
    }
    out
}

/// A metric a request is short of: (metric, need, in use, limit).
pub type Short<'m> = (&'m str, u64, u64, u64);

/// What the quota says of a request.
#[derive(Clone, Debug, PartialEq)]
pub enum Check<'m> {
    /// Covered (by its own quota, or borrowed from its cohort).
    Fits,
    /// L3: it waits; `note` says what its cohort could lend (no other project named).
    Short(Vec<Short<'m>>, Option<String>),
    /// Quota it owns is lent to its cohort: `victims` (borrowing jobs) are preempted for
    /// it now, `stopping` more are already stopping; it waits until their quota is back.
    Reclaim { victims: Vec<u64>, stopping: usize, cohort: String },
    /// Quota it owns is lent and cannot be taken back now (reclaim is off, or the
    /// borrowing jobs may not be preempted): it comes back as they end.
    Lent { cohort: String },
}

/// Quota through one scheduling round: the use when the round started, what the round
/// admitted, and the cohorts' reclaims.
pub struct Book<'r> {
    quotas: &'r Quotas,
    base: HashMap<(&'r str, &'r str), u64>,
    round: HashMap<(&'r str, &'r str), u64>,
    /// Quota of jobs stopping for a reclaim (before this round or chosen in it): it is
    /// back soon, and no other job is preempted for it.
    releasing: HashMap<(&'r str, &'r str), u64>,
    holders: &'r [Holder],
    chosen: HashSet<u64>,
    /// What waiting jobs ask for (not yet charged): a cohort does not lend quota that its
    /// own project's waiting jobs want.
    wanted: HashMap<(&'r str, &'r str), u64>,
    /// Reclaim by preemption (`[scheduler] priority_preemption`).
    reclaim: bool,
}

impl<'r> Book<'r> {
    pub fn new(quotas: &'r Quotas, use_: &'r QuotaUse, reclaim: bool) -> Book<'r> {
        let mut base = HashMap::with_capacity(use_.used.len());
        for ((p, m), v) in &use_.used {
            base.insert((p.as_str(), m.as_str()), *v);
        }
        let mut releasing: HashMap<(&str, &str), u64> = HashMap::new();
        for h in use_.holders.iter().filter(|h| h.releasing) {
            for (m, v) in &h.metrics {
                *releasing.entry((h.project.as_str(), m.as_str())).or_insert(0) += v;
            }
        }
        Book { quotas, base, round: HashMap::new(), releasing, holders: &use_.holders, chosen: HashSet::new(), wanted: HashMap::new(), reclaim }
    }

    /// A job waits for admission with `metrics`: if its project's own quota covers it,
    /// that quota is not lent to others while it waits (only projects of cohorts are
    /// counted). A job that needs to borrow itself claims nothing: two such jobs holding
    /// their own quotas against each other would wait for ever.
    pub fn want(&mut self, project: &'r str, metrics: &'r BTreeMap<String, u64>) {
        if self.quotas.cohort_of(project).is_none() {
            return;
        }
        let own = metrics.iter().all(|(m, v)| {
            self.quotas.limit(project, m).is_none_or(|q| {
                self.used(project, m) + self.wanted.get(&(project, m.as_str())).copied().unwrap_or(0) + v <= q
            })
        });
        if !own {
            return;
        }
        for (m, v) in metrics {
            *self.wanted.entry((project, m.as_str())).or_insert(0) += v;
        }
    }

    /// What `project`'s waiting jobs want of `metric` within its own quota.
    fn wanted_within(&self, project: &str, metric: &str) -> u64 {
        let w = self.wanted.get(&(project, metric)).copied().unwrap_or(0);
        let left = self.quotas.limit(project, metric).map_or(0, |q| q.saturating_sub(self.used(project, metric)));
        w.min(left)
    }

    /// In use by `project` (held when the round started, plus what it admitted since).
    pub fn used(&self, project: &str, metric: &str) -> u64 {
        self.base.get(&(project, metric)).copied().unwrap_or(0) + self.round.get(&(project, metric)).copied().unwrap_or(0)
    }

    /// The request's quota, counted for the rest of the round.
    pub fn charge(&mut self, project: &'r str, metrics: &'r BTreeMap<String, u64>) {
        for (m, v) in metrics {
            *self.round.entry((project, m.as_str())).or_insert(0) += v;
            if let Some(w) = self.wanted.get_mut(&(project, m.as_str())) {
                *w = w.saturating_sub(*v);
            }
        }
    }

    /// L3: may `project` take `metrics` more now? `may_borrow`: the job may run on
    /// borrowed quota (it can be reclaimed later).
    pub fn check<'m>(&mut self, project: &'r str, metrics: &'m BTreeMap<String, u64>, may_borrow: bool) -> Check<'m> {
        let short: Vec<Short<'m>> = metrics
            .iter()
            .filter_map(|(m, &need)| {
                let limit = self.quotas.limit(project, m)?;
                let used = self.used(project, m);
                (used + need > limit).then_some((m.as_str(), need, used, limit))
            })
            .collect();
        let Some(cohort) = self.quotas.cohort_of(project) else {
            return if short.is_empty() { Check::Fits } else { Check::Short(short, None) };
        };
        let cohort: &'r Cohort = cohort;
        if !short.is_empty() {
            return self.borrow(project, cohort, short, may_borrow);
        }
        // Within its own quota: anything its cohort borrows of it must come back.
        let add = |p: &str, m: &str| if p == project { metrics.get(m).copied().unwrap_or(0) } else { 0 };
        let deficit = self.deficits(cohort, metrics, &add, false, &HashSet::new());
        if deficit.is_empty() {
            let pending = self.deficits(cohort, metrics, &add, true, &HashSet::new());
            if pending.is_empty() {
                return Check::Fits;
            }
            let stopping = self.releasing_jobs(cohort);
            return Check::Reclaim { victims: Vec::new(), stopping, cohort: cohort.name.clone() };
        }
        if !self.reclaim {
            return Check::Lent { cohort: cohort.name.clone() };
        }
        match self.choose(project, cohort, metrics, &add) {
            Some(victims) => {
                for &id in &victims {
                    self.chosen.insert(id);
                    if let Some(h) = self.holders.iter().find(|h| h.id == id) {
                        for (m, v) in &h.metrics {
                            *self.releasing.entry((h.project.as_str(), m.as_str())).or_insert(0) += v;
                        }
                    }
                }
                let stopping = self.releasing_jobs(cohort).saturating_sub(victims.len());
                Check::Reclaim { victims, stopping, cohort: cohort.name.clone() }
            }
            None => Check::Lent { cohort: cohort.name.clone() },
        }
    }

    /// Past its own quota: what its cohort can lend it.
    fn borrow<'m>(
        &self,
        project: &str,
        cohort: &Cohort,
        short: Vec<Short<'m>>,
        may_borrow: bool,
    ) -> Check<'m> {
        if !may_borrow {
            let note = format!("it may not borrow from cohort {} (preempted too often to be reclaimed again)", cohort.name);
            return Check::Short(short, Some(note));
        }
        let mut notes = Vec::new();
        for &(m, need, used, limit) in &short {
            let after = used + need - limit;
            if let Some(cap) = self.quotas.borrow_cap(project, m) {
                if after > cap {
                    notes.push(format!("{m}: it may borrow at most {cap} from cohort {} (borrowing_limit)", cohort.name));
                    continue;
                }
            }
            // Quota that its owners' waiting jobs want is not lent.
            let add = |p: &str, mm: &str| match (p == project, mm == m) {
                (true, true) => need,
                (false, true) => self.wanted_within(p, m),
                _ => 0,
            };
            let one: BTreeMap<String, u64> = [(m.to_string(), need)].into();
            if !self.deficits(cohort, &one, &add, true, &HashSet::new()).is_empty() {
                let free = self.lendable(cohort, project, m);
                notes.push(format!("{m}: cohort {} has {free} unused to lend", cohort.name));
            }
        }
        if notes.is_empty() {
            Check::Fits
        } else {
            Check::Short(short, Some(notes.join("; ")))
        }
    }

    /// What the cohort's other projects lend of `metric` and do not use, less what is
    /// borrowed already.
    fn lendable(&self, cohort: &Cohort, project: &str, metric: &str) -> u64 {
        let (mut lend, mut borrowed) = (0u64, 0u64);
        for p in &cohort.projects {
            let u = self.used(p, metric) + if p == project { 0 } else { self.wanted_within(p, metric) };
            let Some((b, l)) = self.quotas.standing(p, metric, u) else { continue };
            borrowed += b;
            if p != project {
                lend += l;
            }
        }
        lend.saturating_sub(borrowed)
    }

    /// The metrics (of `metrics`) on which the cohort borrows more than it lends, with
    /// `add` more in use and the jobs of `gone` not; `with_releasing`: counting the quota
    /// of jobs stopping for a reclaim as still held.
    fn deficits(
        &self,
        cohort: &Cohort,
        metrics: &BTreeMap<String, u64>,
        add: &dyn Fn(&str, &str) -> u64,
        with_releasing: bool,
        gone: &HashSet<u64>,
    ) -> Vec<(String, u64)> {
        let mut out = Vec::new();
        for m in metrics.keys() {
            let (mut borrowed, mut lend) = (0u64, 0u64);
            for p in &cohort.projects {
                let mut u = self.used(p, m) + add(p, m);
                if !with_releasing {
                    u = u.saturating_sub(self.releasing.get(&(p.as_str(), m.as_str())).copied().unwrap_or(0));
                }
                for h in self.holders.iter().filter(|h| gone.contains(&h.id) && &h.project == p) {
                    u = u.saturating_sub(h.metrics.get(m).copied().unwrap_or(0));
                }
                let Some((b, l)) = self.quotas.standing(p, m, u) else { continue };
                borrowed += b;
                lend += l;
            }
            if borrowed > lend {
                out.push((m.clone(), borrowed - lend));
            }
        }
        out
    }

    /// Jobs of the cohort stopping for a reclaim.
    fn releasing_jobs(&self, cohort: &Cohort) -> usize {
        self.holders
            .iter()
            .filter(|h| (h.releasing || self.chosen.contains(&h.id)) && cohort.projects.contains(&h.project))
            .count()
    }

    /// The cheapest set of borrowing jobs (least work lost, then the youngest) whose
    /// quota covers the cohort's deficit, or None when no set does.
    fn choose(&self, project: &str, cohort: &Cohort, metrics: &BTreeMap<String, u64>, add: &dyn Fn(&str, &str) -> u64) -> Option<Vec<u64>> {
        let mut cands: Vec<&Holder> = self
            .holders
            .iter()
            .filter(|h| h.project != project && h.reclaimable && !h.releasing && !self.chosen.contains(&h.id))
            .filter(|h| cohort.projects.contains(&h.project))
            .filter(|h| h.metrics.iter().any(|(m, v)| *v > 0 && metrics.contains_key(m)))
            .collect();
        cands.sort_by_key(|h| (h.cost, std::cmp::Reverse(h.start), std::cmp::Reverse(h.id)));
        let mut gone: HashSet<u64> = HashSet::new();
        let mut order = Vec::new();
        for h in cands {
            let short = self.deficits(cohort, metrics, add, false, &gone);
            if short.is_empty() {
                break;
            }
            // Only a job of a project above its quota on a metric short gives back.
            let helps = short.iter().any(|(m, _)| {
                h.metrics.get(m).copied().unwrap_or(0) > 0
                    && self.quotas.limit(&h.project, m).is_some_and(|q| self.after(&h.project, m, &gone) > q)
            });
            if helps {
                gone.insert(h.id);
                order.push(h.id);
            }
        }
        if !self.deficits(cohort, metrics, add, false, &gone).is_empty() {
            return None;
        }
        // Drop what is not needed, most expensive first.
        for id in order.clone().into_iter().rev() {
            gone.remove(&id);
            if self.deficits(cohort, metrics, add, false, &gone).is_empty() {
                order.retain(|x| *x != id);
            } else {
                gone.insert(id);
            }
        }
        Some(order)
    }

    /// `project`'s use of `metric` with the jobs of `gone` and releasing ones gone.
    fn after(&self, project: &str, metric: &str, gone: &HashSet<u64>) -> u64 {
        let mut u = self.used(project, metric).saturating_sub(self.releasing.get(&(project, metric)).copied().unwrap_or(0));
        for h in self.holders.iter().filter(|h| gone.contains(&h.id) && h.project == project) {
            u = u.saturating_sub(h.metrics.get(metric).copied().unwrap_or(0));
        }
        u
    }
}

/// L3: the metrics the quota cannot cover, in plain words (with the shortfall).
pub fn quota_text(short: &[Short]) -> String {
    let parts: Vec<String> = short
        .iter()
        .map(|(m, need, used, limit)| format!("{m}: needs {need}, {used} of {limit} in use (short by {})", used + need - limit))
        .collect();
    parts.join("; ")
}
