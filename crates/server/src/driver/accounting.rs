//! Usage accounting on the driver's thread: every job change goes into the ledger
//! (`accounting::Ledger`), which is stored every `FLUSH_EVERY`, at a clean stop and before
//! a report; a start goes on from what was stored (the jobs that held capacity meanwhile
//! count from then, the ones that ended meanwhile are counted by their end).

use std::collections::BTreeMap;

use serde_json::{json, Value};
use trainyard_api::ApiError;
use trainyard_core::job::ReplicaState;
use trainyard_core::schedule::rfc3339;
use trainyard_core::{Job, Micros, RunId};
use trainyard_store::StoreError;

use super::Driver;
use crate::accounting::{Amounts, FLUSHED_AT, FLUSH_EVERY};

/// `GET /v1/admin/usage`: hours that start in `[from, to)` (`from` rounded down to its
/// hour; all of them by default), of one project or all.
#[derive(Clone, Debug, Default)]
pub struct UsageQuery {
    pub from: Option<Micros>,
    pub to: Option<Micros>,
    pub project: Option<String>,
}

const HOUR_SECS: i64 = 3600;

fn hours(seconds: f64) -> f64 {
    (seconds / 3600.0 * 1e6).round() / 1e6
}

fn amounts_json(a: &Amounts) -> serde_json::Map<String, Value> {
    let mut m = serde_json::Map::new();
    m.insert("cpuHours".into(), json!(hours(a.cpu_seconds)));
    m.insert("gpuHours".into(), json!(hours(a.accelerator_seconds)));
    m.insert("memoryGbHours".into(), json!(hours(a.memory_gb_seconds)));
    m.insert("usedCpuHours".into(), json!(hours(a.used_cpu_seconds)));
    m.insert("usedMemoryGbHours".into(), json!(hours(a.used_memory_gb_seconds)));
    m.insert("jobsSucceeded".into(), json!(a.succeeded));
    m.insert("jobsFailed".into(), json!(a.failed));
    m.insert("jobsCancelled".into(), json!(a.cancelled));
    m.insert("preemptions".into(), json!(a.preemptions));
    m.insert("lostGpuHours".into(), json!(hours(a.lost_accelerator_seconds)));
    // TY10: the goodput of the jobs that ended, and its parts.
    m.insert("productiveHours".into(), json!(hours(a.productive_seconds)));
    m.insert("accountedHours".into(), json!(hours(a.accounted_seconds)));
    m.insert("productiveGpuHours".into(), json!(hours(a.productive_accelerator_seconds)));
    m.insert("accountedGpuHours".into(), json!(hours(a.accounted_accelerator_seconds)));
    if a.accounted_seconds > 0.0 {
        m.insert("goodput".into(), json!((a.productive_seconds / a.accounted_seconds * 1000.0).round() / 1000.0));
    }
    m
}

impl Driver {
    /// A job is new to the driver (created, or loaded at a start) or changed: the ledger
    /// counts what it held until now.
    pub(super) fn account(&mut self, old: Option<&Job>, new: &Job) {
        let now = self.now();
        let resumed = if old.is_none() { self.usage_resumed } else { None };
        self.ledger.job_changed(old, new, now, resumed);
    }

    /// Store what accrued, every `FLUSH_EVERY` (or now, with `force`), with what the
    /// running replicas' cgroups say they used.
    pub(super) fn flush_usage(&mut self, now: Micros, force: bool) -> Result<(), StoreError> {
        if !force && now - self.usage_flushed < FLUSH_EVERY {
            return Ok(());
        }
        self.usage_flushed = now;
        let data_dir = self.svc.cfg.data_dir.clone();
        let mut samples = Vec::new();
        for id in self.ledger.holding().collect::<Vec<_>>() {
            let Some(live) = self.jobs.get(&id) else { continue };
            let j = &live.job;
            let (mut memory, mut cpus, mut any) = (0u64, Vec::new(), false);
            for r in j.replicas.iter().filter(|r| matches!(r.state, ReplicaState::Running { .. })) {
                let run = RunId { job: id, attempt: j.attempt, replica: r.name.clone(), restart: r.restart };
                if let Some((m, c)) = crate::metrics::cgroup_sample(&data_dir, &run) {
                    any = true;
                    memory += m.unwrap_or(0);
                    if let Some(c) = c {
                        cpus.push((run.to_string(), c));
                    }
                }
            }
            if any {
                samples.push(crate::accounting::UsedSample { job: id, memory_bytes: memory, cpu_seconds: cpus });
            }
        }
        self.ledger.sample_used(&samples, now);
        let rows = self.ledger.rows(now);
        if rows.is_empty() {
            return Ok(());
        }
        self.store.add_usage(&rows, FLUSHED_AT, &now.to_string())?;
        self.ledger.stored();
        self.metrics.usage_stored(&rows);
        Ok(())
    }

    /// At a start: the time up to which usage was stored (jobs loaded now count from
    /// there), and the stored totals for `/metrics`.
    pub(super) fn resume_usage(&mut self) -> Result<(), StoreError> {
        self.ledger = crate::accounting::Ledger::default();
        self.usage_resumed = self.store.meta(FLUSHED_AT)?.and_then(|v| v.parse::<Micros>().ok());
        let totals = self.store.usage_rows(i64::MIN, i64::MAX, None)?;
        self.metrics.usage_totals(&totals);
        Ok(())
    }

    /// After loading the live jobs at a start: jobs that ended while the server was down
    /// are counted, then usage goes on from now.
    pub(super) fn usage_resumed(&mut self) -> Result<(), StoreError> {
        let Some(t) = self.usage_resumed.take() else { return Ok(()) };
        let now = self.now();
        for id in self.store.ended_between("custom", t, now)? {
            if let Some(stored) = self.store.get_job_by_id(id)? {
                self.ledger.ended_while_down(&stored.job, t);
            }
        }
        self.flush_usage(now, true)
    }

    /// `GET /v1/admin/usage`: per project and accelerator type, and per project and hour.
    pub(super) fn usage_report(&mut self, q: &UsageQuery) -> Result<Value, ApiError> {
        let now = self.now();
        if let Err(e) = self.flush_usage(now, true) {
            return Err(self.store_err(e));
        }
        let from = q.from.map_or(i64::MIN, |f| f.div_euclid(1_000_000).div_euclid(HOUR_SECS) * HOUR_SECS);
        let to = q.to.map_or(i64::MAX, |t| t.div_euclid(1_000_000) + i64::from(t.rem_euclid(1_000_000) > 0));
        let rows = self.store.usage_rows(from, to, q.project.as_deref()).map_err(|e| self.store_err(e))?;
        let mut totals: BTreeMap<(&str, &str), Amounts> = BTreeMap::new();
        let mut series: BTreeMap<(&str, i64), Amounts> = BTreeMap::new();
        for r in &rows {
            totals.entry((&r.project, &r.accelerator)).or_default().add(&r.amounts);
            series.entry((&r.project, r.hour)).or_default().add(&r.amounts);
        }
        let usage: Vec<Value> = totals
            .iter()
            .map(|((p, acc), a)| {
                let mut m = amounts_json(a);
                m.insert("project".into(), json!(p));
                m.insert("acceleratorType".into(), json!(if acc.is_empty() { "NONE" } else { acc }));
                Value::Object(m)
            })
            .collect();
        let series: Vec<Value> = series
            .iter()
            .map(|((p, hour), a)| {
                json!({"project": p, "hour": rfc3339(hour.saturating_mul(1_000_000)), "cpuHours": hours(a.cpu_seconds),
                    "gpuHours": hours(a.accelerator_seconds), "memoryGbHours": hours(a.memory_gb_seconds)})
            })
            .collect();
        let mut out = json!({"usage": usage, "series": series, "to": rfc3339(q.to.unwrap_or(now))});
        if q.from.is_some() {
            out["from"] = json!(rfc3339(from.saturating_mul(1_000_000)));
        }
        Ok(out)
    }
}
