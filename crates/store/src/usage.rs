//! The usage ledger: per project, accelerator type (empty: none) and hour, what jobs
//! reserved (CPU, accelerator and memory time), what their cgroups say they used, how
//! many ended in each state, their preemptions with the work those lost, and the goodput
//! of the jobs that ended (TY10: productive time over all time accounted, wall and
//! accelerator).

use serde::Serialize;

use crate::{values, Result, Store};

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
    /// TY10, of the jobs that ended: productive wall time, and all wall time accounted
    /// (from create to end); the same in accelerator time.
    pub productive_seconds: f64,
    pub accounted_seconds: f64,
    pub productive_accelerator_seconds: f64,
    pub accounted_accelerator_seconds: f64,
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
        self.productive_seconds += o.productive_seconds;
        self.accounted_seconds += o.accounted_seconds;
        self.productive_accelerator_seconds += o.productive_accelerator_seconds;
        self.accounted_accelerator_seconds += o.accounted_accelerator_seconds;
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
        self.write(|tx| {
            for r in rows {
                let a = &r.amounts;
                tx.execute(
                    "INSERT INTO usage (project, accelerator, hour, cpu_seconds, accelerator_seconds, memory_gb_seconds, \
                     used_cpu_seconds, used_memory_gb_seconds, succeeded, failed, cancelled, preemptions, lost_accelerator_seconds, \
                     productive_seconds, accounted_seconds, productive_accelerator_seconds, accounted_accelerator_seconds) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17) \
                     ON CONFLICT(project, accelerator, hour) DO UPDATE SET \
                     cpu_seconds = usage.cpu_seconds + excluded.cpu_seconds, \
                     accelerator_seconds = usage.accelerator_seconds + excluded.accelerator_seconds, \
                     memory_gb_seconds = usage.memory_gb_seconds + excluded.memory_gb_seconds, \
                     used_cpu_seconds = usage.used_cpu_seconds + excluded.used_cpu_seconds, \
                     used_memory_gb_seconds = usage.used_memory_gb_seconds + excluded.used_memory_gb_seconds, \
                     succeeded = usage.succeeded + excluded.succeeded, failed = usage.failed + excluded.failed, \
                     cancelled = usage.cancelled + excluded.cancelled, preemptions = usage.preemptions + excluded.preemptions, \
                     lost_accelerator_seconds = usage.lost_accelerator_seconds + excluded.lost_accelerator_seconds, \
                     productive_seconds = usage.productive_seconds + excluded.productive_seconds, \
                     accounted_seconds = usage.accounted_seconds + excluded.accounted_seconds, \
                     productive_accelerator_seconds = usage.productive_accelerator_seconds + excluded.productive_accelerator_seconds, \
                     accounted_accelerator_seconds = usage.accounted_accelerator_seconds + excluded.accounted_accelerator_seconds",
                    values![
                        r.project.as_str(),
                        r.accelerator.as_str(),
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
                        a.productive_seconds,
                        a.accounted_seconds,
                        a.productive_accelerator_seconds,
                        a.accounted_accelerator_seconds,
                    ],
                )?;
            }
            crate::set_meta(tx, key, value)
        })
    }

    /// The ledger's rows of hours in `[from, to)` (seconds), of one project or all, by
    /// project, accelerator type and hour.
    pub fn usage_rows(&self, from: i64, to: i64, project: Option<&str>) -> Result<Vec<UsageRow>> {
        let rows = self.read(|e| {
            e.rows(
                "SELECT project, accelerator, hour, cpu_seconds, accelerator_seconds, memory_gb_seconds, used_cpu_seconds, \
                 used_memory_gb_seconds, succeeded, failed, cancelled, preemptions, lost_accelerator_seconds, productive_seconds, \
                 accounted_seconds, productive_accelerator_seconds, accounted_accelerator_seconds FROM usage \
                 WHERE hour >= ?1 AND hour < ?2 AND (CAST(?3 AS TEXT) IS NULL OR project = ?3) ORDER BY project, accelerator, hour",
                values![from, to, project],
            )
        })?;
        let count = |r: &crate::sql::Row, i: usize| -> Result<u64> { Ok(r.int(i)?.max(0) as u64) };
        rows.iter()
            .map(|r| {
                Ok(UsageRow {
                    project: r.text(0)?,
                    accelerator: r.text(1)?,
                    hour: r.int(2)?,
                    amounts: Amounts {
                        cpu_seconds: r.real(3)?,
                        accelerator_seconds: r.real(4)?,
                        memory_gb_seconds: r.real(5)?,
                        used_cpu_seconds: r.real(6)?,
                        used_memory_gb_seconds: r.real(7)?,
                        succeeded: count(r, 8)?,
                        failed: count(r, 9)?,
                        cancelled: count(r, 10)?,
                        preemptions: count(r, 11)?,
                        lost_accelerator_seconds: r.real(12)?,
                        productive_seconds: r.real(13)?,
                        accounted_seconds: r.real(14)?,
                        productive_accelerator_seconds: r.real(15)?,
                        accounted_accelerator_seconds: r.real(16)?,
                    },
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_add_up_and_are_read_by_period_and_project() {
        crate::testdb::each(|_, s| {
            let row = |p: &str, hour: i64, gpu: f64| UsageRow {
                project: p.into(),
                accelerator: "NVIDIA_TESLA_T4".into(),
                hour,
                amounts: Amounts { accelerator_seconds: gpu, succeeded: 1, productive_seconds: 3.0, accounted_seconds: 4.0, ..Amounts::default() },
            };
            s.add_usage(&[row("a", 0, 10.0), row("b", 3600, 5.0)], "k", "1").unwrap();
            s.add_usage(&[row("a", 0, 2.5)], "k", "2").unwrap();
            let all = s.usage_rows(0, 7200, None).unwrap();
            assert_eq!(all.len(), 2);
            assert_eq!(all[0].amounts.accelerator_seconds, 12.5);
            assert_eq!(all[0].amounts.succeeded, 2);
            // TY10: goodput's parts add up too.
            assert_eq!((all[0].amounts.productive_seconds, all[0].amounts.accounted_seconds), (6.0, 8.0));
            assert_eq!(s.usage_rows(3600, 7200, None).unwrap().len(), 1);
            assert_eq!(s.usage_rows(0, 7200, Some("b")).unwrap()[0].hour, 3600);
            assert_eq!(s.meta("k").unwrap().as_deref(), Some("2"));
        });
    }
}
