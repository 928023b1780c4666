//! A job's log (L22): every replica's stdout and stderr for every attempt and restart,
//! with the service's own lifecycle events, as one stream ordered by time.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;
use trainyard_api::Timestamp;
use trainyard_store::{Store, StoreError};

/// One entry as the logs API and the CLI show it (and as the CLI reads it back).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
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

/// The rule an event's text cites at its start (`L11: ...`, `L12a: ...`, or one of
/// Trainyard's own rules, `TY4: ...`; see docs/lifecycle.md).
pub fn cited_rule(text: &str) -> Option<String> {
    let (head, _) = text.split_once(": ")?;
    if let Some(n) = head.strip_prefix("TY") {
        return (!n.is_empty() && n.len() <= 2 && n.chars().all(|c| c.is_ascii_digit())).then(|| head.to_string());
    }
    let digits = head.strip_prefix('L')?;
    let n = digits.trim_end_matches(|c: char| c.is_ascii_lowercase());
    (!n.is_empty() && n.len() <= 2 && n.chars().all(|c| c.is_ascii_digit()) && digits.len() <= n.len() + 1).then(|| head.to_string())
}

/// An event's text as a person reads it: without the rule id it starts with (`L11: `),
/// which the entry's `rule` field keeps.
pub fn plain_text(text: &str) -> &str {
    match cited_rule(text) {
        Some(rule) => text[rule.len()..].trim_start_matches(':').trim_start(),
        None => text,
    }
}

/// Which entries a reader wants.
#[derive(Clone, Debug, Default)]
pub struct Selector {
    pub replica: Option<String>,
    pub attempt: Option<u32>,
}

/// Where a reader is in a job's log.
#[derive(Clone, Debug, Default)]
pub struct Cursor {
    event_seq: i64,
    offsets: BTreeMap<PathBuf, trainyard_backend::LogPos>,
    /// Entries read but not given out yet: later than what a source that may have more
    /// has given so far (see `read_new`).
    held: Vec<Entry>,
}

/// What one `read_new` gives.
#[derive(Debug, Default)]
pub struct Batch {
    /// In time order, and never earlier than anything given before.
    pub entries: Vec<Entry>,
    /// Nothing new was read: the reader has everything there is now (what was held is in
    /// `entries`).
    pub caught_up: bool,
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

/// Entries that arrived since `cursor`, ordered by time across every source.
///
/// Each run's log is read a bounded batch at a time, so one call may have read a long
/// log's first part only, while a short log and the events (read whole) already gave
/// entries from later on. Those are held back: an entry is given out once every source
/// that may have more (one that gave entries in this call) has given entries up to its
/// time. The next call reads on; a call that reads nothing new gives out what was held.
/// So the stream is in time order however long each run's log is, and `tail` takes the
/// true last entries.
pub fn read_new(store: &Store, data_dir: &Path, job: u64, sel: &Selector, cursor: &mut Cursor) -> Result<Batch, StoreError> {
    let mut out = std::mem::take(&mut cursor.held);
    let mut read_any = false;
    // The earliest "latest entry" of the sources that may have more.
    let mut watermark: Option<i64> = None;
    for e in store.events(job, cursor.event_seq)? {
        cursor.event_seq = e.seq;
        read_any = true;
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
        let mut latest: Option<i64> = None;
        for e in entries {
            let micros = Timestamp::parse_rfc3339(&e.time).map(|t| t.micros()).unwrap_or(0);
            latest = Some(latest.map_or(micros, |l| l.max(micros)));
            out.push(Entry { time: e.time, attempt, replica: replica.clone(), restart, stream: e.stream, text: e.text, rule: None, micros });
        }
        if let Some(l) = latest {
            read_any = true;
            watermark = Some(watermark.map_or(l, |w| w.min(l)));
        }
    }
    out.sort_by_key(|e| e.micros);
    if let Some(w) = watermark {
        let at = out.partition_point(|e| e.micros <= w);
        cursor.held = out.split_off(at);
    }
    Ok(Batch { entries: out, caught_up: !read_any })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_log(dir: &Path, lines: impl Iterator<Item = (i64, String)>) {
        use std::io::Write;
        std::fs::create_dir_all(dir).unwrap();
        let mut f = std::io::BufWriter::new(std::fs::File::create(dir.join(trainyard_backend::log::LOG_FILE)).unwrap());
        for (micros, text) in lines {
            let e = serde_json::json!({"time": Timestamp::from_micros(micros).to_rfc3339(), "stream": "stdout", "text": text});
            writeln!(f, "{e}").unwrap();
        }
    }

    /// L22: a long run log read batch by batch and a short one (and the events) come out
    /// as one stream in time order: the short log's late line is held until the long one
    /// has been read up to its time, and is not lost.
    #[test]
    fn l22_logs_of_very_different_lengths_merge_in_time_order() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::open(&tmp.path().join("t.db")).unwrap();
        let runs = tmp.path().join("runs/5/0");
        let t0 = 1_800_000_000_000_000i64;
        // 60,000 lines of 100 bytes: well over one read batch.
        let long = 60_000i64;
        write_log(&runs.join("workerpool0-0/0"), (0..long).map(|i| (t0 + i * 10, format!("{i:0>90}"))));
        write_log(&runs.join("workerpool0-1/0"), [(t0 + long * 5, "middle".to_string()), (t0 + long * 20, "last".to_string())].into_iter());
        let mut cursor = Cursor::default();
        let mut all = Vec::new();
        let mut calls = 0;
        loop {
            let b = read_new(&store, tmp.path(), 5, &Selector::default(), &mut cursor).unwrap();
            calls += 1;
            all.extend(b.entries);
            if b.caught_up {
                break;
            }
            assert!(calls < 1000);
        }
        assert!(calls > 2, "the long log took several batches ({calls})");
        assert_eq!(all.len(), long as usize + 2);
        assert!(all.windows(2).all(|w| w[0].micros <= w[1].micros), "not in time order");
        let middle = all.iter().position(|e| e.text == "middle").unwrap();
        assert_eq!(middle, long as usize / 2, "the short log's line sits among the long log's");
        assert_eq!(all.last().map(|e| e.text.as_str()), Some("last"));
    }

    #[test]
    fn events_name_the_rule_they_cite() {
        assert_eq!(cited_rule("L11: Replica workerpool0-0 was killed by signal 9; restarting it (2 of 5)."), Some("L11".into()));
        assert_eq!(cited_rule("L12a: x"), Some("L12a".into()));
        assert_eq!(cited_rule("Lx: y"), None);
        assert_eq!(cited_rule("loss: 0.5"), None);
        assert_eq!(cited_rule("L123: too long"), None);
        assert_eq!(cited_rule("TY4: Replica x may be hung"), Some("TY4".into()));
        assert_eq!(cited_rule("TYPO: x"), None);
        // In words, the rule left to the entry's field.
        assert_eq!(plain_text("L12a: Replica x is restarting."), "Replica x is restarting.");
        assert_eq!(plain_text("loss: 0.5"), "loss: 0.5");
    }
}
