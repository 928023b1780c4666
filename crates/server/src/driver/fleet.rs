//! The fleet in the driver: nodes (drain, loss, L9), their agents, quotas, and the
//! administration views.

use super::*;
use trainyard_core::quarantine::Verdict;
use trainyard_core::schedule::UsageHistory;

impl Driver {
    pub(super) fn admin(&mut self, req: Admin, now: Micros) -> Result<serde_json::Value, ApiError> {
        match req {
            Admin::ListNodes => {
                let nodes: Vec<serde_json::Value> = self.fleet.nodes.iter().map(|n| self.node_view(n)).collect();
                Ok(serde_json::json!({ "nodes": nodes }))
            }
            Admin::GetNode(name) => Ok(self.node_view(self.node(&name)?)),
            Admin::Drain(name) => {
                self.node(&name)?;
                self.drain(&name, now).map_err(|e| self.store_err(e))?;
                Ok(self.node_view(self.node(&name)?))
            }
            Admin::Undrain(name) => {
                self.node(&name)?;
                if self.quarantined.remove(&name).is_some() {
                    tracing::info!("node {name}: quarantine lifted");
                    self.save_quarantine();
                }
                self.quarantine.clear(&name);
                let was_down = self.fleet.nodes.iter().any(|n| n.name == name && !n.up);
                if let Some(n) = self.fleet.nodes.iter_mut().find(|n| n.name == name) {
                    n.schedulable = true;
                    n.up = true;
                }
                if was_down {
                    // A lost node comes back: its agent is started again.
                    self.watch_node(&name);
                }
                tracing::info!("node {name} undrained");
                self.reschedule = true;
                Ok(self.node_view(self.node(&name)?))
            }
            Admin::Quotas => Ok(self.quota_view()),
            Admin::Usage(q) => self.usage_report(&q),
            Admin::ReloadQuotas => {
                let Some(path) = self.svc.cfg.path.clone() else {
                    return Err(ApiError::failed_precondition("The server runs on its built-in defaults: there is no config file to read quotas from."));
                };
                let cfg = Config::load(&path, Some(self.svc.cfg.data_dir.clone()))
                    .map_err(|e| ApiError::invalid_argument(format!("Quotas not changed: {e}")))?;
                self.quotas = cfg.quotas;
                self.priorities = cfg.priority_classes;
                self.svc.storage_usage.set_limits(cfg.storage_limits);
                tracing::info!("quotas read again from {}", path.display());
                // A larger limit may admit queued jobs at once.
                self.reschedule = true;
                Ok(self.quota_view())
            }
        }
    }

    /// Projects over their storage limit: their running jobs are stopped and fail with
    /// RESOURCE_EXHAUSTED naming the size and the limit (a job's writes cannot be refused
    /// on an ordinary filesystem, so this is how the limit holds for them).
    pub(super) fn storage_full(&mut self, full: Vec<crate::storage::usage::Full>, now: Micros) -> Result<(), StoreError> {
        for f in full {
            let running: Vec<u64> = self
                .jobs
                .iter()
                .filter(|(_, l)| l.job.project == f.project && matches!(l.job.phase, Phase::Running { .. }))
                .map(|(id, _)| *id)
                .collect();
            if !running.is_empty() {
                tracing::warn!("project {}: storage over its limit; stopping its {} running jobs", f.project, running.len());
            }
            for id in running {
                let message = format!("The job was stopped: {}", f.message(None));
                self.apply(id, Event::StorageFull { message }, now)?.ok();
            }
        }
        Ok(())
    }

    pub(super) fn node(&self, name: &str) -> Result<&trainyard_core::schedule::Node, ApiError> {
        self.fleet
            .nodes
            .iter()
            .find(|n| n.name == name)
            .ok_or_else(|| ApiError::not_found(format!("Node \"{name}\" does not exist.")))
    }

    /// Live replicas per node: (job, replica index), including replicas moving there (L9).
    pub(super) fn placements(&self) -> BTreeMap<String, Vec<(u64, usize)>> {
        let mut out: BTreeMap<String, Vec<(u64, usize)>> = BTreeMap::new();
        for live in self.jobs.values() {
            for (i, r) in live.job.replicas.iter().enumerate() {
                if let trainyard_core::job::ReplicaState::Stopping {
                    then: trainyard_core::job::AfterReplicaStop::Move { node },
                    ..
                } = &r.state
                {
                    out.entry(node.clone()).or_default().push((live.job.id, i));
                }
                if r.state.is_live() {
                    if let Some(n) = &r.node {
                        out.entry(n.clone()).or_default().push((live.job.id, i));
                    }
                }
            }
        }
        out
    }

    pub(super) fn node_view(&self, n: &trainyard_core::schedule::Node) -> serde_json::Value {
        let placements = self.placements();
        let mine = placements.get(&n.name).cloned().unwrap_or_default();
        let (mut cpus, mut memory) = (0u64, 0u64);
        let mut accel: BTreeMap<String, u64> = BTreeMap::new();
        let mut replicas = Vec::new();
        for (job, i) in &mine {
            let Some(live) = self.jobs.get(job) else { continue };
            if let Some(d) = live.job.demand.replicas.get(*i) {
                cpus += d.cpus as u64;
                memory += d.memory_bytes;
                if let Some((a, c)) = &d.accelerator {
                    *accel.entry(a.clone()).or_insert(0) += *c as u64;
                }
            }
            replicas.push(serde_json::json!({
                "job": job_name(&live.job.project, &live.job.region, live.job.id),
                "replica": live.job.replicas[*i].name,
            }));
        }
        let missing = self.gpus_missing.get(&n.name).map(|m| m.len()).unwrap_or(0);
        let quarantine = self.quarantined.get(&n.name);
        let state = if !n.up {
            "DOWN"
        } else if quarantine.is_some() {
            "QUARANTINED"
        } else if !n.schedulable {
            "DRAINED"
        } else if missing > 0 {
            "DEGRADED"
        } else {
            "UP"
        };
        serde_json::json!({
            "name": n.name,
            "state": state,
            "cpus": n.cpus,
            "memoryBytes": n.memory_bytes.to_string(),
            "accelerators": n.accelerators,
            "allocated": {"cpus": cpus, "memoryBytes": memory.to_string(), "accelerators": accel},
            "overcommit": self.fleet.overcommit,
            "replicas": replicas,
            "gpus": self.gpu_view(&n.name),
            "degradedReason": (missing > 0).then(|| format!("{missing} GPU(s) gone from nvidia-smi (see gpus[].state)")),
            "quarantine": quarantine.map(|q| serde_json::json!({
                "since": trainyard_core::schedule::rfc3339(q.since),
                "reason": q.reason,
                "failures": q.failures.iter().map(|f| serde_json::json!({
                    "job": f.job.to_string(), "project": f.project, "replica": f.replica, "time": trainyard_core::schedule::rfc3339(f.at), "what": f.what,
                })).collect::<Vec<_>>(),
            })),
        })
    }

    /// The node's GPUs, each with the replica that holds it.
    fn gpu_view(&self, node: &str) -> Vec<serde_json::Value> {
        let Some(inv) = self.svc.gpus.get(node) else { return Vec::new() };
        inv.gpus
            .iter()
            .enumerate()
            .map(|(i, g)| {
                let holder = self.jobs.values().find_map(|live| {
                    live.job
                        .replicas
                        .iter()
                        .find(|r| r.state.is_live() && r.node.as_deref() == Some(node) && r.devices.contains(&g.uuid))
                        .map(|r| serde_json::json!({"job": job_name(&live.job.project, &live.job.region, live.job.id), "replica": r.name}))
                });
                let links: BTreeMap<String, String> = inv
                    .gpus
                    .iter()
                    .enumerate()
                    .filter(|(j, _)| *j != i)
                    .map(|(j, o)| (o.index.to_string(), inv.link(i, j).text()))
                    .collect();
                let missing = self.gpus_missing.get(node).is_some_and(|m| m.contains(&g.uuid));
                serde_json::json!({
                    "index": g.index,
                    "uuid": g.uuid,
                    "model": g.name,
                    "acceleratorType": g.accelerator,
                    "memoryMib": g.memory_mib,
                    "pciBusId": g.pci_bus_id,
                    "links": links,
                    "state": if missing { "MISSING" } else { "OK" },
                    "heldBy": holder,
                })
            })
            .collect()
    }

    /// What each project's jobs hold now (their live replicas' resources).
    pub(super) fn holdings(&self) -> BTreeMap<String, UsageHistory> {
        let mut held: BTreeMap<String, UsageHistory> = BTreeMap::new();
        for live in self.jobs.values().filter(|l| l.job.holds_capacity()) {
            let h = held.entry(live.job.project.clone()).or_default();
            for (r, d) in live.job.replicas.iter().zip(&live.job.demand.replicas) {
                if r.state.is_live() {
                    h.cpus += d.cpus as f64;
                    h.memory_bytes += d.memory_bytes as f64;
                    if let Some((ty, n)) = &d.accelerator {
                        *h.accelerators.entry(ty.clone()).or_default() += *n as f64;
                    }
                }
            }
        }
        held
    }

    /// Fair share with memory (`[scheduler] usage_half_life_secs`): each project's past use
    /// aged to `now`, with what its jobs held since the last round (what they held after
    /// it: rounds run whenever that changes). Stored (meta `usage_history`) at most once a
    /// minute, read back at a start.
    pub(super) fn age_usage(&mut self, now: Micros) -> Result<(), StoreError> {
        let half = trainyard_core::job::secs(self.svc.cfg.scheduler.usage_half_life_secs);
        if half == 0 {
            return Ok(());
        }
        let elapsed = if self.history_at == 0 { 0 } else { now - self.history_at };
        self.history_at = now;
        let held = std::mem::take(&mut self.last_held);
        let projects: BTreeSet<String> = self.usage_history.keys().chain(held.keys()).cloned().collect();
        for p in projects {
            let past = self.usage_history.get(&p).cloned().unwrap_or_default();
            let aged = past.aged(held.get(&p).unwrap_or(&UsageHistory::default()), elapsed, half);
            if aged.is_negligible() && !held.contains_key(&p) {
                self.usage_history.remove(&p);
            } else {
                self.usage_history.insert(p, aged);
            }
        }
        if now - self.history_saved >= 60_000_000 {
            self.history_saved = now;
            let text = serde_json::json!({"at": now, "projects": self.usage_history}).to_string();
            self.store.set_meta(USAGE_HISTORY, &text)?;
        }
        Ok(())
    }

    /// The usage history stored last (a start goes on from it; a damaged one is dropped).
    pub(super) fn load_usage_history(&mut self) -> Result<(), StoreError> {
        let Some(text) = self.store.meta(USAGE_HISTORY)? else { return Ok(()) };
        #[derive(serde::Deserialize)]
        struct Stored {
            at: Micros,
            projects: BTreeMap<String, UsageHistory>,
        }
        match serde_json::from_str::<Stored>(&text) {
            Ok(s) => {
                self.usage_history = s.projects;
                self.history_at = s.at;
            }
            Err(e) => tracing::warn!("fair share: the stored usage history cannot be read ({e}); starting from none"),
        }
        Ok(())
    }

    /// L9: a replica of job `job` failed on `node` in a way that is evidence about the
    /// node: counted (per project: one project's failures alone never quarantine), and the
    /// node quarantined when the count says so, unless no other node would take placements
    /// then (never the single node of a fleet that overcommits, the default workstation).
    pub(super) fn node_failed(&mut self, job: u64, node: &str, replica: String, what: String) {
        let now = self.now();
        if self.fleet.overcommit || self.quarantined.contains_key(node) || !self.fleet.nodes.iter().any(|n| n.name == node) {
            return;
        }
        let project = self.jobs.get(&job).map(|l| l.job.project.clone()).unwrap_or_default();
        let others_usable = self.fleet.nodes.iter().any(|n| n.name != node && n.schedulable && !self.quarantined.contains_key(&n.name));
        let f = trainyard_core::quarantine::Failure { job, project, replica, at: now, what };
        let q = self.svc.cfg.quarantine;
        let (failures, refused) = match self.quarantine.record(node, f, others_usable) {
            Verdict::Counted => return,
            Verdict::Quarantine(failures) => (failures, false),
            Verdict::Refused(failures) => (failures, true),
        };
        let count = |f: &[trainyard_core::quarantine::Failure], of: fn(&trainyard_core::quarantine::Failure) -> String| {
            f.iter().map(of).collect::<BTreeSet<String>>().len()
        };
        let reason = format!(
            "{} replica failures of {} jobs of {} projects within {} s ([fleet] quarantine_after_failures = {})",
            failures.len(),
            count(&failures, |f| f.job.to_string()),
            count(&failures, |f| f.project.clone()),
            q.window_secs,
            q.after_failures
        );
        if refused {
            tracing::warn!("node {node} is not quarantined ({reason}): no other node would take placements");
            self.metrics.quarantine_refused();
            let text = format!(
                "node {node} is not quarantined ({reason}): it is the last node that takes placements, and jobs would wait for \
                 none; an administrator can drain it (`trainyard nodes drain {node}`)."
            );
            self.tell_failed_jobs(&failures, "L9", &text, now);
            return;
        }
        self.quarantine_node(node, reason, failures, now);
    }

    /// A line in the log of each live job among `failures`.
    fn tell_failed_jobs(&mut self, failures: &[trainyard_core::quarantine::Failure], rule: &str, text: &str, now: Micros) {
        let mut told = BTreeSet::new();
        for f in failures {
            if !told.insert(f.job) {
                continue;
            }
            let Some(live) = self.jobs.get(&f.job) else { continue };
            let line = Effect::Log(trainyard_core::step::LogLine { attempt: live.job.attempt, replica: None, text: format!("{rule}: {text}") });
            if let Err(e) = self.store.commit(&live.job, &[line], now) {
                tracing::warn!("job {}: a line about node quarantine could not be logged: {e}", f.job);
            }
        }
    }

    /// No new placements on `node` until `nodes undrain` lifts it; what runs there is left
    /// to run.
    pub(super) fn quarantine_node(&mut self, node: &str, reason: String, failures: Vec<trainyard_core::quarantine::Failure>, now: Micros) {
        tracing::warn!("node {node} quarantined: {reason}; `trainyard nodes undrain {node}` lets it back in");
        if let Some(n) = self.fleet.nodes.iter_mut().find(|n| n.name == node) {
            n.schedulable = false;
        }
        self.metrics.node_quarantined();
        // The jobs that failed there are told, in their logs.
        self.tell_failed_jobs(&failures, "L9", &format!("node {node} is quarantined ({reason}): no new placements there."), now);
        self.quarantined.insert(node.to_string(), Quarantined { since: now, reason, failures });
        self.reschedule = true;
        self.save_quarantine();
    }

    /// The quarantined nodes, stored (meta `quarantined_nodes`): a restart keeps them out.
    pub(super) fn save_quarantine(&mut self) {
        let text = serde_json::to_string(&self.quarantined).unwrap_or_default();
        if let Err(e) = self.store.set_meta(QUARANTINED_NODES, &text) {
            tracing::warn!("the quarantined nodes could not be stored: {e}");
        }
    }

    /// At a start: the nodes quarantined before (still in the fleet) stay out.
    pub(super) fn load_quarantine(&mut self) -> Result<(), StoreError> {
        let Some(text) = self.store.meta(QUARANTINED_NODES)? else { return Ok(()) };
        match serde_json::from_str::<BTreeMap<String, Quarantined>>(&text) {
            Ok(q) => {
                for (name, info) in q {
                    if let Some(n) = self.fleet.nodes.iter_mut().find(|n| n.name == name) {
                        n.schedulable = false;
                        self.quarantined.insert(name, info);
                    }
                }
            }
            Err(e) => tracing::warn!("the stored quarantined nodes cannot be read ({e}); none are kept out"),
        }
        Ok(())
    }

    /// Limit, in use and queued demand per project and metric.
    pub(super) fn quota_view(&self) -> serde_json::Value {
        let mut rows: BTreeMap<(String, String), (u64, u64)> = BTreeMap::new();
        for live in self.jobs.values() {
            let j = &live.job;
            for (m, v) in &j.demand.metrics {
                let e = rows.entry((j.project.clone(), m.clone())).or_insert((0, 0));
                if j.holds_quota() {
                    e.0 += v;
                } else if matches!(j.phase, Phase::Queued) {
                    e.1 += v;
                }
            }
        }
        for (p, limits) in &self.quotas.projects {
            for m in limits.keys() {
                rows.entry((p.clone(), m.clone())).or_insert((0, 0));
            }
        }
        let mut out: Vec<serde_json::Value> = Vec::new();
        for m in self.quotas.default.keys() {
            if !rows.keys().any(|(_, rm)| rm == m) {
                out.push(serde_json::json!({"project": "*", "region": self.svc.cfg.region, "metric": m,
                    "limit": self.quotas.default[m].to_string(), "inUse": "0", "queued": "0"}));
            }
        }
        // Cohorts: what each project uses above its quota, and lends of what it does not use.
        let held: BTreeMap<(String, String), u64> = rows.iter().map(|(k, (u, _))| (k.clone(), *u)).collect();
        let loans = trainyard_core::quota::lending(&self.quotas, &held);
        for ((project, metric), (used, queued)) in rows {
            let mut row = serde_json::json!({"project": project, "region": self.svc.cfg.region, "metric": metric,
                "inUse": used.to_string(), "queued": queued.to_string()});
            if let Some(l) = self.quotas.limit(&project, &metric) {
                row["limit"] = serde_json::Value::String(l.to_string());
            }
            if let Some(c) = self.quotas.cohort_of(&project) {
                row["cohort"] = serde_json::Value::String(c.name.clone());
                let loan = loans.get(&project);
                let amount = |m: Option<&BTreeMap<String, u64>>| m.and_then(|m| m.get(&metric)).copied().unwrap_or(0).to_string();
                row["borrowed"] = serde_json::Value::String(amount(loan.map(|l| &l.borrowed)));
                row["lent"] = serde_json::Value::String(amount(loan.map(|l| &l.lent)));
                for (key, limits) in [("borrowingLimit", &self.quotas.borrowing_limits), ("lendingLimit", &self.quotas.lending_limits)] {
                    if let Some(v) = limits.get(&project).and_then(|m| m.get(&metric)) {
                        row[key] = serde_json::Value::String(v.to_string());
                    }
                }
            }
            out.push(row);
        }
        // Fair share with memory: each project's past use (see `age_usage`).
        let usage: Vec<serde_json::Value> = self
            .usage_history
            .iter()
            .map(|(p, h)| {
                serde_json::json!({"project": p, "cpus": round3(h.cpus), "memoryGb": round3(h.memory_bytes / (1u64 << 30) as f64),
                    "accelerators": h.accelerators.iter().map(|(k, v)| (k.clone(), serde_json::json!(round3(*v)))).collect::<serde_json::Map<_, _>>()})
            })
            .collect();
        serde_json::json!({ "quotas": out, "usageHistory": usage, "usageHalfLifeSecs": self.svc.cfg.scheduler.usage_half_life_secs.to_string() })
    }

    /// Start or find a virtual node's agent and watch it (a no-op without node agents).
    pub(super) fn watch_node(&mut self, name: &str) {
        let Some(cmd) = self.svc.node_agent.clone() else { return };
        // A resync after a store outage recovers again: one watcher per agent is enough.
        if !self.watched_nodes.insert(name.to_string()) {
            return;
        }
        let tx = Mutex::new(self.tx.clone());
        let node = name.to_string();
        let r = crate::nodeagent::ensure_and_watch(&self.svc.cfg.data_dir, name, &cmd, move || {
            if let Ok(tx) = tx.lock() {
                let _ = tx.send(Msg::NodeLost(node));
            }
        });
        if let Err(e) = r {
            self.watched_nodes.remove(name);
            tracing::error!("node {name}: cannot start or watch its agent, marking it down: {e}");
            if let Some(n) = self.fleet.nodes.iter_mut().find(|n| n.name == name) {
                n.up = false;
            }
        }
    }

    /// L9: a node is lost: it takes no work, and each of its replicas is restarted at once
    /// on another node with the same name and address (or, with none, a stockout, L15).
    pub(super) fn lose_node(&mut self, name: &str, now: Micros) -> Result<(), StoreError> {
        let Some(n) = self.fleet.nodes.iter_mut().find(|n| n.name == name) else { return Ok(()) };
        if !n.up {
            return Ok(());
        }
        n.up = false;
        tracing::warn!("node {name} lost: its agent stopped answering");
        let on_node: Vec<(u64, usize)> = self
            .placements()
            .remove(name)
            .unwrap_or_default()
            .into_iter()
            .filter(|(job, i)| self.jobs.get(job).is_some_and(|l| l.job.replicas[*i].node.as_deref() == Some(name)))
            .collect();
        for (job, i) in on_node {
            let replacement = self.replacement_node(job, i, name);
            let Some(replica) = self.jobs.get(&job).map(|l| l.job.replicas[i].name.clone()) else { continue };
            self.apply(job, Event::NodeLost { replica, replacement }, now)?.ok();
        }
        self.reschedule = true;
        Ok(())
    }

    /// L9: drain a node: it takes no new work, and each of its replicas gets SIGTERM and
    /// the grace period, then restarts on another node (or, with none, a stockout, L15).
    pub(super) fn drain(&mut self, name: &str, now: Micros) -> Result<(), StoreError> {
        if let Some(n) = self.fleet.nodes.iter_mut().find(|n| n.name == name) {
            n.schedulable = false;
        }
        tracing::info!("node {name} drained");
        let on_node: Vec<(u64, usize)> = self
            .placements()
            .remove(name)
            .unwrap_or_default()
            .into_iter()
            .filter(|(job, i)| {
                self.jobs.get(job).is_some_and(|l| {
                    l.job.replicas[*i].node.as_deref() == Some(name)
                        && matches!(
                            l.job.replicas[*i].state,
                            trainyard_core::job::ReplicaState::Launching | trainyard_core::job::ReplicaState::Running { .. }
                        )
                })
            })
            .collect();
        for (job, i) in on_node {
            let replacement = self.replacement_node(job, i, name);
            let Some(replica) = self.jobs.get(&job).map(|l| l.job.replicas[i].name.clone()) else { continue };
            self.apply(job, Event::NodeMaintenance { replica, replacement }, now)?.ok();
        }
        Ok(())
    }

    /// L9: a node for replica `i` of `job` other than `exclude`, by the scheduler's own
    /// placement on the capacity the other live replicas leave (`place_replacement`).
    pub(super) fn replacement_node(&self, job: u64, i: usize, exclude: &str) -> Option<String> {
        let live: Vec<&Job> = self.jobs.values().map(|l| &l.job).collect();
        trainyard_core::replace::place_replacement(&live, &self.fleet, job, i, exclude, self.now())
    }
}

/// The meta key of the stored usage history (fair share with memory).
const USAGE_HISTORY: &str = "usage_history";
const QUARANTINED_NODES: &str = "quarantined_nodes";

/// A figure shown with three decimals.
fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

/// A quarantined node: since when, why, and the failures that did it.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Quarantined {
    pub since: Micros,
    pub reason: String,
    pub failures: Vec<trainyard_core::quarantine::Failure>,
}
