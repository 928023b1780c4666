//! Records: resources that are documents rather than lifecycles (Vertex ML Metadata's
//! stores, contexts, executions, artifacts and schemas; TensorBoards with their
//! experiments, runs and time series), kept as JSON text by resource name, and the points
//! of time series. The server decides what a record holds; the store keeps them, finds
//! them by name or by parent, and deletes a record with everything named under it.

use trainyard_core::Micros;

use crate::db::Exec;
use crate::{values, Result, Store, StoreError};

/// One stored record.
#[derive(Clone, Debug, PartialEq)]
pub struct Record {
    /// The order of creation (the position of page tokens).
    pub seq: i64,
    /// What it is (`context`, `tensorboard`, ...), named by the server.
    pub kind: String,
    pub project: String,
    pub region: String,
    /// The resource name of its parent (a store, a TensorBoard, a run, or the location).
    pub parent: String,
    /// Its resource name, unique in the store.
    pub name: String,
    pub create_time: Micros,
    pub update_time: Micros,
    /// The resource as JSON text.
    pub body: String,
}

/// What a list may be narrowed by before its filter is applied to each record: fields
/// kept in indexed columns, read from the body as it is written (`schemaTitle`,
/// `displayName`), and the contexts a record is in (its `parentContexts` and
/// `__contexts`).
#[derive(Clone, Copy, Debug, Default)]
pub struct Narrow<'a> {
    pub schema_title: Option<&'a str>,
    pub display_name: Option<&'a str>,
    pub context: Option<&'a str>,
}

/// A record to write: created when its name is new, else its body replaced (its `seq` and
/// `create_time` kept).
#[derive(Clone, Copy)]
pub struct Put<'a> {
    pub kind: &'a str,
    pub project: &'a str,
    pub region: &'a str,
    pub parent: &'a str,
    pub name: &'a str,
    pub body: &'a str,
}

/// One change of [`Store::change_records`].
#[derive(Clone, Copy)]
pub enum Change<'a> {
    Put(Put<'a>),
    /// The record, every record named under it (`name/...`) and their points.
    Delete(&'a str),
    /// Points appended to the series of this name: (step, JSON text).
    Points(&'a str, &'a [(i64, String)]),
    /// A line of a job's log (its events), written with the records.
    JobEvent(u64, &'a str),
}

const COLUMNS: &str = "seq, kind, project, region, parent, name, create_time, update_time, body";
/// The same columns of `records r`.
const R_COLUMNS: &str = "r.seq, r.kind, r.project, r.region, r.parent, r.name, r.create_time, r.update_time, r.body";

fn record_of(r: &crate::sql::Row) -> Result<Record> {
    Ok(Record {
        seq: r.int(0)?,
        kind: r.text(1)?,
        project: r.text(2)?,
        region: r.text(3)?,
        parent: r.text(4)?,
        name: r.text(5)?,
        create_time: r.int(6)?,
        update_time: r.int(7)?,
        body: r.text(8)?,
    })
}

/// The bounds of the names under `name`: `name/` up to `name0` ('0' follows '/' in byte
/// order), so that a range scan of the name's index finds them.
fn under(name: &str) -> (String, String) {
    (format!("{name}/"), format!("{name}0"))
}

impl Store {
    /// The record of this name, if there is one.
    pub fn record(&self, name: &str) -> Result<Option<Record>> {
        let row = self.read(|e| e.row(&format!("SELECT {COLUMNS} FROM records WHERE name = ?1"), values![name]))?;
        row.as_ref().map(record_of).transpose()
    }

    /// Records of `kind` under `parent`, in the order they were made, after `after` (a
    /// `seq`), at most `limit`.
    pub fn records(&self, kind: &str, parent: &str, after: i64, limit: usize) -> Result<Vec<Record>> {
        let rows = self.read(|e| {
            e.rows(
                &format!("SELECT {COLUMNS} FROM records WHERE kind = ?1 AND parent = ?2 AND seq > ?3 ORDER BY seq LIMIT ?4"),
                values![kind, parent, after, limit.min(i64::MAX as usize) as i64],
            )
        })?;
        rows.iter().map(record_of).collect()
    }

    /// As [`Store::records`], only those `narrow` lets through.
    pub fn records_narrowed(&self, kind: &str, parent: &str, narrow: Narrow<'_>, after: i64, limit: usize) -> Result<Vec<Record>> {
        // With a context, its links lead (a context holds few of the parent's records);
        // else the parent's index, by schema title or display name where given.
        let mut sql = match narrow.context {
            // CROSS JOIN: SQLite keeps the links as the outer loop (PostgreSQL plans it).
            Some(_) => format!("SELECT {R_COLUMNS} FROM record_links l CROSS JOIN records r WHERE l.context = ?4 AND r.name = l.name AND r.kind = ?1 AND r.parent = ?2 AND r.seq > ?3"),
            None => format!("SELECT {R_COLUMNS} FROM records r WHERE r.kind = ?1 AND r.parent = ?2 AND r.seq > ?3"),
        };
        let mut params = vec![crate::Value::from(kind), crate::Value::from(parent), crate::Value::from(after)];
        if let Some(c) = narrow.context {
            params.push(c.into());
        }
        if let Some(t) = narrow.schema_title {
            params.push(t.into());
            sql.push_str(&format!(" AND r.schema_title = ?{}", params.len()));
        }
        if let Some(d) = narrow.display_name {
            params.push(d.into());
            sql.push_str(&format!(" AND r.display_name = ?{}", params.len()));
        }
        params.push((limit.min(i64::MAX as usize) as i64).into());
        sql.push_str(&format!(" ORDER BY r.seq LIMIT ?{}", params.len()));
        let rows = self.read(|e| e.rows(&sql, &params))?;
        rows.iter().map(record_of).collect()
    }

    /// How many records of `kind` are under `parent`.
    pub fn count_records(&self, kind: &str, parent: &str) -> Result<u64> {
        let row = self.read(|e| e.row("SELECT COUNT(*) FROM records WHERE kind = ?1 AND parent = ?2", values![kind, parent]))?;
        Ok(row.map(|r| r.int(0)).transpose()?.unwrap_or(0).max(0) as u64)
    }

    /// Apply `changes` in one transaction, at `now`.
    pub fn change_records(&mut self, changes: &[Change<'_>], now: Micros) -> Result<()> {
        self.write(|tx| {
            for c in changes {
                apply(tx, c, now)?;
            }
            Ok(())
        })
    }

    /// Apply `changes` with a long-running operation that answers them, in one
    /// transaction: the operation is made under `project` and `region`, `make` gets its id
    /// and returns its body. Returns the operation's id.
    pub fn change_records_answered(
        &mut self,
        changes: &[Change<'_>],
        (project, region): (&str, &str),
        now: Micros,
        make: impl FnOnce(u64) -> String,
    ) -> Result<u64> {
        self.write(|tx| {
            let op = tx.insert("INSERT INTO operations (project, region, body) VALUES (?1, ?2, '')", values![project, region], "id")? as u64;
            tx.execute("UPDATE operations SET body = ?2 WHERE id = ?1", values![op as i64, make(op)])?;
            for c in changes {
                apply(tx, c, now)?;
            }
            Ok(op)
        })
    }

    /// A new number for a record whose id the server chooses (a TensorBoard, a time
    /// series): never given twice, deletes included.
    pub fn next_record_number(&mut self) -> Result<u64> {
        self.write(|tx| {
            let now = tx.row("SELECT value FROM meta WHERE key = 'records_next'", &[])?.map(|r| r.text(0)).transpose()?;
            let n: u64 = match now {
                None => 1,
                Some(t) => t.parse().map_err(|_| StoreError::Decode(format!("meta records_next is not a number: {t:?}")))?,
            };
            tx.execute(
                "INSERT INTO meta (key, value) VALUES ('records_next', ?1) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                values![(n + 1).to_string()],
            )?;
            Ok(n)
        })
    }

    /// Points of the series `series`: (seq, step, JSON text), in the order they came,
    /// after `after` (a `seq`), at most `limit`.
    pub fn points(&self, series: &str, after: i64, limit: usize) -> Result<Vec<(i64, i64, String)>> {
        let rows = self.read(|e| {
            e.rows(
                "SELECT seq, step, body FROM points WHERE series = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3",
                values![series, after, limit.min(i64::MAX as usize) as i64],
            )
        })?;
        rows.iter().map(|r| Ok((r.int(0)?, r.int(1)?, r.text(2)?))).collect()
    }
}

fn apply(tx: &mut dyn Exec, change: &Change<'_>, now: Micros) -> Result<()> {
    match change {
        Change::Put(p) => {
            let (title, display, contexts) = indexed(p.body);
            tx.execute(
                "INSERT INTO records (kind, project, region, parent, name, create_time, update_time, schema_title, display_name, body)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?6, ?7, ?8, ?9)
                 ON CONFLICT(name) DO UPDATE SET body = excluded.body, update_time = excluded.update_time,
                    schema_title = excluded.schema_title, display_name = excluded.display_name",
                values![p.kind, p.project, p.region, p.parent, p.name, now, title.as_str(), display.as_str(), p.body],
            )?;
            tx.execute("DELETE FROM record_links WHERE name = ?1", values![p.name])?;
            for c in contexts {
                tx.execute("INSERT INTO record_links (context, name) VALUES (?1, ?2) ON CONFLICT DO NOTHING", values![c.as_str(), p.name])?;
            }
        }
        Change::Delete(name) => {
            let (lo, hi) = under(name);
            tx.execute("DELETE FROM records WHERE name = ?1 OR (name >= ?2 AND name < ?3)", values![*name, lo.as_str(), hi.as_str()])?;
            tx.execute("DELETE FROM record_links WHERE name = ?1 OR (name >= ?2 AND name < ?3)", values![*name, lo.as_str(), hi.as_str()])?;
            tx.execute("DELETE FROM points WHERE series = ?1 OR (series >= ?2 AND series < ?3)", values![*name, lo.as_str(), hi.as_str()])?;
        }
        Change::Points(series, points) => {
            for (step, body) in points.iter() {
                tx.execute("INSERT INTO points (series, step, body) VALUES (?1, ?2, ?3)", values![*series, *step, body])?;
            }
        }
        Change::JobEvent(job, text) => crate::insert_event(tx, *job, now, 0, None, text)?,
    }
    Ok(())
}

/// The indexed fields of a record's JSON: its schema title, display name and the contexts
/// it is in.
fn indexed(body: &str) -> (String, String, Vec<String>) {
    let Ok(v) = serde_json::from_str::<serde_json::Value>(body) else { return Default::default() };
    let text = |k: &str| v.get(k).and_then(serde_json::Value::as_str).unwrap_or("").to_string();
    let mut contexts: Vec<String> = ["parentContexts", "__contexts"]
        .iter()
        .filter_map(|k| v.get(*k).and_then(serde_json::Value::as_array))
        .flatten()
        .filter_map(|c| c.as_str().map(String::from))
        .collect();
    contexts.sort();
    contexts.dedup();
    (text("schemaTitle"), text("displayName"), contexts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put<'a>(kind: &'a str, parent: &'a str, name: &'a str, body: &'a str) -> Change<'a> {
        Change::Put(Put { kind, project: "p", region: "r", parent, name, body })
    }

    /// A record is found by name and by parent; a second put replaces its body and keeps
    /// its place; a delete takes what is named under it and its points, and nothing else.
    #[test]
    fn records_by_name_and_parent_and_deleted_with_what_is_under_them() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Store::open(&dir.path().join("t.db")).unwrap();
        let st = "projects/p/locations/r/metadataStores/default";
        let a = format!("{st}/contexts/a");
        let ab = format!("{st}/contexts/ab");
        s.change_records(&[put("store", "projects/p/locations/r", st, "{}"), put("context", st, &a, "1"), put("context", st, &ab, "2")], 10).unwrap();
        let child = format!("{a}/runs/x");
        s.change_records(&[put("run", &a, &child, "3"), Change::Points(&child, &[(1, "p1".into()), (2, "p2".into())])], 20).unwrap();
        s.change_records(&[put("context", st, &a, "1b")], 30).unwrap();
        let got = s.record(&a).unwrap().unwrap();
        assert_eq!((got.body.as_str(), got.create_time, got.update_time), ("1b", 10, 30));
        let listed: Vec<String> = s.records("context", st, 0, 10).unwrap().into_iter().map(|r| r.name).collect();
        assert_eq!(listed, vec![a.clone(), ab.clone()], "kept in the order made");
        let after = s.records("context", st, got.seq, 10).unwrap();
        assert_eq!(after.len(), 1);
        assert_eq!(s.points(&child, 0, 10).unwrap().len(), 2);
        s.change_records(&[Change::Delete(&a)], 40).unwrap();
        assert!(s.record(&a).unwrap().is_none() && s.record(&child).unwrap().is_none());
        assert!(s.points(&child, 0, 10).unwrap().is_empty());
        assert!(s.record(&ab).unwrap().is_some(), "a name that only starts alike stays");
        assert_eq!(s.count_records("context", st).unwrap(), 1);
        assert_eq!((s.next_record_number().unwrap(), s.next_record_number().unwrap()), (1, 2));
        let x = format!("{st}/artifacts/x");
        let y = format!("{st}/artifacts/y");
        let ctx = format!("{st}/contexts/c");
        let bx = format!(r#"{{"schemaTitle": "system.Metrics", "displayName": "x", "__contexts": ["{ctx}"]}}"#);
        s.change_records(&[put("artifact", st, &x, &bx), put("artifact", st, &y, r#"{"schemaTitle": "system.Model"}"#)], 60).unwrap();
        let names = |s: &Store, n: Narrow<'_>| -> Vec<String> { s.records_narrowed("artifact", st, n, 0, 10).unwrap().into_iter().map(|r| r.name).collect() };
        assert_eq!(names(&s, Narrow { schema_title: Some("system.Metrics"), ..Narrow::default() }), vec![x.clone()]);
        assert_eq!(names(&s, Narrow { display_name: Some("x"), context: Some(&ctx), ..Narrow::default() }), vec![x.clone()]);
        assert_eq!(names(&s, Narrow::default()).len(), 2);
        s.change_records(&[put("artifact", st, &x, r#"{"schemaTitle": "system.Metrics"}"#)], 70).unwrap();
        assert!(names(&s, Narrow { context: Some(&ctx), ..Narrow::default() }).is_empty(), "a rewrite takes its old links away");
        let op = s.change_records_answered(&[Change::Delete(&ab)], ("p", "r"), 50, |id| format!("{{\"name\": \"op {id}\"}}")).unwrap();
        assert_eq!(s.get_operation("p", "r", op).unwrap().unwrap(), format!("{{\"name\": \"op {op}\"}}"));
        assert!(s.record(&ab).unwrap().is_none());
    }
}
