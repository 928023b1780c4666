//! The usage ledger: per project, accelerator type (empty: none) and hour, what jobs
//! reserved (CPU, accelerator and memory time), what their cgroups say they used, how
//! many ended in each state, and their preemptions with the work those lost.

use rusqlite::params;
use serde::Serialize;

use crate::{Result, Store};

/// Amounts of one project, accelerator type and hour (or a sum of them).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Amounts {
    pub cpu_seconds: f64,
    pub accelerator_seconds: f64,
    pub memory_gb_seconds: f64,
    pub used_cpu_seconds: f64,
    pub used_memory_gb_seconds: f64,
    pub succeeded: u64,
    pub failed: u64,
    pub cancelled: u64,
    pub preemptions: u64,
    pub lost_accelerator_seconds: f64,
}

impl Amounts {
    pub fn add(&mut self, o: &Amounts) {
        self.cpu_seconds += o.cpu_seconds;
        self.accelerator_seconds += o.accelerator_seconds;
        self.memory_gb_seconds += o.memory_gb_seconds;
        self.used_cpu_seconds += o.used_cpu_seconds;
        self.used_memory_gb_seconds += o.used_memory_gb_seconds;
        self.succeeded += o.succeeded;
        self.failed += o.failed;
        self.cancelled += o.cancelled;
        self.preemptions += o.preemptions;
        self.lost_accelerator_seconds += o.lost_accelerator_seconds;
    }
}

/// A row of the ledger: `hour` is the start of the hour, in seconds since the epoch.
#[derive(Clone, Debug, PartialEq)]
pub struct UsageRow {
    pub project: String,
    pub accelerator: String,
    pub hour: i64,
    pub amounts: Amounts,
}

impl Store {
    /// Add `rows` to the ledger and set meta `key` to `value`, in one transaction.
    pub fn add_usage(&mut self, rows: &[UsageRow], key: &str, value: &str) -> Result<()> {
        let tx = self.conn.transaction()?;
        {
            let mut st = tx.prepare_cached(
                "INSERT INTO usage (project, accelerator, hour, cpu_seconds, accelerator_seconds, memory_gb_seconds, \
                 used_cpu_seconds, used_memory_gb_seconds, succeeded, failed, cancelled, preemptions, lost_accelerator_seconds) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13) \
                 ON CONFLICT(project, accelerator, hour) DO UPDATE SET \
                 cpu_seconds = cpu_seconds + excluded.cpu_seconds, \
                 accelerator_seconds = accelerator_seconds + excluded.accelerator_seconds, \
                 memory_gb_seconds = memory_gb_seconds + excluded.memory_gb_seconds, \
                 used_cpu_seconds = used_cpu_seconds + excluded.used_cpu_seconds, \
                 used_memory_gb_seconds = used_memory_gb_seconds + excluded.used_memory_gb_seconds, \
                 succeeded = succeeded + excluded.succeeded, failed = failed + excluded.failed, \
                 cancelled = cancelled + excluded.cancelled, preemptions = preemptions + excluded.preemptions, \
                 lost_accelerator_seconds = lost_accelerator_seconds + excluded.lost_accelerator_seconds",
            )?;
            for r in rows {
                let a = &r.amounts;
                st.execute(params![
                    r.project,
                    r.accelerator,
                    r.hour,
                    a.cpu_seconds,
                    a.accelerator_seconds,
                    a.memory_gb_seconds,
                    a.used_cpu_seconds,
                    a.used_memory_gb_seconds,
                    a.succeeded as i64,
                    a.failed as i64,
                    a.cancelled as i64,
                    a.preemptions as i64,
                    a.lost_accelerator_seconds,
                ])?;
            }
        }
        tx.execute(
            "INSERT INTO meta (key, value) VALUES (?1, ?2) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            params![key, value],
        )?;
        tx.commit()?;
        Ok(())
    }

    /// The ledger's rows of hours in `[from, to)` (seconds), of one project or all, by
    /// project, accelerator type and hour.
    pub fn usage_rows(&self, from: i64, to: i64, project: Option<&str>) -> Result<Vec<UsageRow>> {
        let mut st = self.conn.prepare_cached(
            "SELECT project, accelerator, hour, cpu_seconds, accelerator_seconds, memory_gb_seconds, used_cpu_seconds, \
             used_memory_gb_seconds, succeeded, failed, cancelled, preemptions, lost_accelerator_seconds FROM usage \
             WHERE hour >= ?1 AND hour < ?2 AND (?3 IS NULL OR project = ?3) ORDER BY project, accelerator, hour",
        )?;
        let rows = st
            .query_map(params![from, to, project], |r| {
                Ok(UsageRow {
                    project: r.get(0)?,
                    accelerator: r.get(1)?,
                    hour: r.get(2)?,
                    amounts: Amounts {
                        cpu_seconds: r.get(3)?,
                        accelerator_seconds: r.get(4)?,
                        memory_gb_seconds: r.get(5)?,
                        used_cpu_seconds: r.get(6)?,
                        used_memory_gb_seconds: r.get(7)?,
                        succeeded: r.get::<_, i64>(8)?.max(0) as u64,
                        failed: r.get::<_, i64>(9)?.max(0) as u64,
                        cancelled: r.get::<_, i64>(10)?.max(0) as u64,
                        preemptions: r.get::<_, i64>(11)?.max(0) as u64,
                        lost_accelerator_seconds: r.get(12)?,
                    },
                })
            })?
            .collect::<std::result::Result<Vec<_>, _>>()?;
        Ok(rows)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_add_up_and_are_read_by_period_and_project() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Store::open(&dir.path().join("t.db")).unwrap();
        let row = |p: &str, hour: i64, gpu: f64| UsageRow {
            project: p.into(),
            accelerator: "NVIDIA_TESLA_T4".into(),
            hour,
            amounts: Amounts { accelerator_seconds: gpu, succeeded: 1, ..Amounts::default() },
        };
        s.add_usage(&[row("a", 0, 10.0), row("b", 3600, 5.0)], "k", "1").unwrap();
        s.add_usage(&[row("a", 0, 2.5)], "k", "2").unwrap();
        let all = s.usage_rows(0, 7200, None).unwrap();
        assert_eq!(all.len(), 2);
        assert_eq!(all[0].amounts.accelerator_seconds, 12.5);
        assert_eq!(all[0].amounts.succeeded, 2);
        assert_eq!(s.usage_rows(3600, 7200, None).unwrap().len(), 1);
        assert_eq!(s.usage_rows(0, 7200, Some("b")).unwrap()[0].hour, 3600);
        assert_eq!(s.meta("k").unwrap().as_deref(), Some("2"));
    }
}
