//! A job's log (L22): every replica's stdout and stderr for every attempt and restart,
//! with the service's own lifecycle events, as one stream ordered by time.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;
use trainyard_api::Timestamp;
use trainyard_store::{Store, StoreError};

/// One entry as the logs API and the CLI show it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Entry {
    pub time: String,
    pub attempt: u32,
    /// The replica's name, or `service` for lifecycle events.
    pub replica: String,
    pub restart: u32,
    /// `stdout`, `stderr` or `event`.
    pub stream: String,
    pub text: String,
    /// For a lifecycle event: the rule that made it (`L11`), as its text cites it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    #[serde(skip)]
    pub micros: i64,
}

/// The rule an event's text cites at its start (`L11: ...`, `L12a: ...`).
pub fn cited_rule(text: &str) -> Option<String> {
    let (head, _) = text.split_once(": ")?;
    let digits = head.strip_prefix('L')?;
    let n = digits.trim_end_matches(|c: char| c.is_ascii_lowercase());
    (!n.is_empty() && n.len() <= 2 && n.chars().all(|c| c.is_ascii_digit()) && digits.len() <= n.len() + 1).then(|| head.to_string())
}

/// Which entries a reader wants.
#[derive(Clone, Debug, Default)]
pub struct Selector {
    pub replica: Option<String>,
    pub attempt: Option<u32>,
}

/// Where a reader is in the job's log.
#[derive(Clone, Debug, Default)]
pub struct Cursor {
    event_seq: i64,
    offsets: BTreeMap<PathBuf, trainyard_backend::LogPos>,
}

/// `<runs>/<job>/<attempt>/<replica>/<restart>` directories of a job.
fn run_dirs(job_dir: &Path) -> Vec<(u32, String, u32, PathBuf)> {
    let mut out = Vec::new();
    let Ok(attempts) = std::fs::read_dir(job_dir) else { return out };
    for a in attempts.flatten() {
        let Some(attempt) = a.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        let Ok(replicas) = std::fs::read_dir(a.path()) else { continue };
        for r in replicas.flatten() {
            let Some(replica) = r.file_name().to_str().map(str::to_owned) else { continue };
            let Ok(restarts) = std::fs::read_dir(r.path()) else { continue };
            for x in restarts.flatten() {
                let Some(restart) = x.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
                out.push((attempt, replica.clone(), restart, x.path()));
            }
        }
    }
    out
}

/// Entries that arrived since `cursor`, ordered by time.
pub fn read_new(store: &Store, data_dir: &Path, job: u64, sel: &Selector, cursor: &mut Cursor) -> Result<Vec<Entry>, StoreError> {
    let mut out = Vec::new();
    for e in store.events(job, cursor.event_seq)? {
        cursor.event_seq = e.seq;
        if sel.attempt.is_some_and(|a| a != e.attempt) {
            continue;
        }
        if let Some(r) = &sel.replica {
            if e.replica.as_deref() != Some(r.as_str()) && e.replica.is_some() {
                continue;
            }
        }
        out.push(Entry {
            time: Timestamp::from_micros(e.time).to_rfc3339(),
            attempt: e.attempt,
            replica: e.replica.unwrap_or_else(|| "service".into()),
            restart: 0,
            stream: "event".into(),
            rule: cited_rule(&e.text),
            text: e.text,
            micros: e.time,
        });
    }
    for (attempt, replica, restart, dir) in run_dirs(&data_dir.join("runs").join(job.to_string())) {
        if sel.attempt.is_some_and(|a| a != attempt) || sel.replica.as_ref().is_some_and(|r| *r != replica) {
            continue;
        }
        let pos = cursor.offsets.get(&dir).copied().unwrap_or_default();
        let Ok((entries, next)) = trainyard_backend::read_log_from(&dir, pos) else { continue };
        cursor.offsets.insert(dir, next);
        for e in entries {
            let micros = Timestamp::parse_rfc3339(&e.time).map(|t| t.micros()).unwrap_or(0);
            out.push(Entry { time: e.time, attempt, replica: replica.clone(), restart, stream: e.stream, text: e.text, rule: None, micros });
        }
    }
    out.sort_by_key(|e| e.micros);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::cited_rule;

    #[test]
    fn events_name_the_rule_they_cite() {
        assert_eq!(cited_rule("L11: Replica workerpool0-0 was killed by signal 9; restarting it (2 of 5)."), Some("L11".into()));
        assert_eq!(cited_rule("L12a: x"), Some("L12a".into()));
        assert_eq!(cited_rule("Lx: y"), None);
        assert_eq!(cited_rule("loss: 0.5"), None);
        assert_eq!(cited_rule("L123: too long"), None);
    }
}
