//! A job's event files as TensorBoard time series, the driver's half: what the reader
//! (`crate::ingest`) found in one pass over a job's `AIP_TENSORBOARD_LOG_DIR` becomes
//! points of the job's TensorBoard, written with the files' new offsets in one
//! transaction (so a server killed between passes reads on from where the points end,
//! never twice).
//!
//! Where they go, as the managed service does it: the TensorBoard the job names
//! (`jobSpec.tensorboard`), else the project's default one (made on first use); an
//! experiment named by the job's id; a run per directory of event files (the log
//! directory itself is run `default`); a scalar time series per tag.

use serde_json::{json, Value};
use trainyard_api::{ApiError, Timestamp};
use trainyard_core::Micros;
use trainyard_store::records::{Change, Put};
use trainyard_store::Store;

use super::events::Scalar;
use super::metadata::all;
use super::ops::{read_err, write_err};
use super::{body_of, coll, created, target_of_name, valid_id};

/// What one pass read of one job.
#[derive(Debug, Default)]
pub struct Batch {
    pub job: u64,
    pub project: String,
    pub region: String,
    pub display_name: String,
    /// `jobSpec.tensorboard`, when set.
    pub tensorboard: Option<String>,
    /// Each file read: its path below the log directory, its new offset, its damage (a
    /// file that is skipped from now on) and its scalars.
    pub files: Vec<FileRead>,
}

#[derive(Debug, Default)]
pub struct FileRead {
    pub rel: String,
    pub offset: u64,
    pub damage: Option<String>,
    pub scalars: Vec<Scalar>,
}

/// Where a file's reading stands: the kind and name of its record.
pub const KIND_EVENT_FILE: &str = "eventFile";

/// The record of a job's file: under the job's resource name.
pub fn file_record(project: &str, region: &str, job: u64, rel: &str) -> String {
    format!("projects/{project}/locations/{region}/customJobs/{job}/eventFiles/{}", rel.replace('/', "%2F"))
}

/// The offsets (and damage) kept for a job's files: (path below the log directory,
/// offset, damaged).
pub fn offsets(store: &Store, project: &str, region: &str, job: u64) -> Result<Vec<(String, u64, bool)>, ApiError> {
    let parent = format!("projects/{project}/locations/{region}/customJobs/{job}");
    let mut out = Vec::new();
    for r in all(store, KIND_EVENT_FILE, &parent)? {
        let v = body_of(&r)?;
        let rel = v["path"].as_str().unwrap_or("").to_string();
        out.push((rel, v["offset"].as_u64().unwrap_or(0), v.get("damage").is_some()));
    }
    Ok(out)
}


/// A run id from a directory below the log directory: lower case, `[a-z0-9-]`, at most
/// 128 characters; the log directory itself is `default`.
pub fn run_id(dir: &str) -> String {
    let mut id: String = dir.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' }).collect();
    id = id.trim_matches('-').to_string();
    while id.contains("--") {
        id = id.replace("--", "-");
    }
    id.truncate(128);
    let id = id.trim_end_matches('-').to_string();
    if valid_id(&id) { id } else { "default".into() }
}

/// The TensorBoard the job's points go to: its own (of its project), else the project's
/// default, made when there is none (the puts that make it).
fn tensorboard(store: &mut Store, b: &Batch, now: Micros, puts: &mut Vec<(String, String, String, &'static str)>) -> Result<String, ApiError> {
    let location = format!("projects/{}/locations/{}", b.project, b.region);
    if let Some(tb) = b.tensorboard.as_deref().filter(|t| !t.is_empty()) {
        if target_of_name(&b.project, &b.region, tb, coll("tensorboards")).is_none() || store.record(tb).map_err(read_err)?.is_none() {
            return Err(ApiError::not_found(format!("jobSpec.tensorboard {tb:?} is not a TensorBoard of project {}", b.project)));
        }
        return Ok(tb.to_string());
    }
    for r in all(store, "tensorboard", &location)? {
        if body_of(&r)?.get("isDefault") == Some(&Value::Bool(true)) {
            return Ok(r.name);
        }
    }
    let id = store.next_record_number().map_err(write_err)?;
    let name = format!("{location}/tensorboards/{id}");
    let body = created(coll("tensorboards"), &name, &json!({"displayName": "Default Tensorboard", "isDefault": true}), now)?;
    puts.push((location, name.clone(), body.to_string(), "tensorboard"));
    Ok(name)
}

/// A series' name, its new points (step, JSON) and their largest step and time.
type SeriesPoints = (String, Vec<(i64, String)>, (i64, String));

/// Apply what a pass read: resources made as needed, points appended, offsets kept, a
/// log line of the job for each file found damaged. An error writes nothing.
pub fn apply(store: &mut Store, b: &Batch, now: Micros) -> Result<(), ApiError> {
    let mut puts: Vec<(String, String, String, &'static str)> = Vec::new();
    // Per series: its new points, and the largest step and time among them.
    let mut points: Vec<SeriesPoints> = Vec::new();
    let mut lines: Vec<String> = Vec::new();
    let job_name = format!("projects/{}/locations/{}/customJobs/{}", b.project, b.region, b.job);
    let has_scalars = b.files.iter().any(|f| !f.scalars.is_empty());
    if has_scalars {
        let tb = tensorboard(store, b, now, &mut puts)?;
        let experiment = format!("{tb}/experiments/{}", b.job);
        if store.record(&experiment).map_err(read_err)?.is_none() {
            let body = created(coll("experiments"), &experiment, &json!({"displayName": b.display_name, "source": "trainyard-event-files"}), now)?;
            puts.push((tb.clone(), experiment.clone(), body.to_string(), "tensorboardExperiment"));
        }
        // Series by (run, tag): those there are, then those made now.
        let mut series: Vec<(String, String, String, Value)> = Vec::new(); // run, tag, name, body
        for f in b.files.iter().filter(|f| !f.scalars.is_empty()) {
            let dir = f.rel.rsplit_once('/').map_or("", |(d, _)| d);
            let run = format!("{experiment}/runs/{}", run_id(dir));
            if !puts.iter().any(|p| p.1 == run) && store.record(&run).map_err(read_err)?.is_none() {
                let body = created(coll("runs"), &run, &json!({"displayName": if dir.is_empty() { "default" } else { dir }}), now)?;
                puts.push((experiment.clone(), run.clone(), body.to_string(), "tensorboardRun"));
            }
            if !series.iter().any(|s| s.0 == run) {
                for r in all(store, "tensorboardTimeSeries", &run)? {
                    let v = body_of(&r)?;
                    let tag = v["displayName"].as_str().unwrap_or("").to_string();
                    series.push((run.clone(), tag, r.name, v));
                }
            }
            for s in &f.scalars {
                let i = match series.iter().position(|x| x.0 == run && x.1 == s.tag) {
                    Some(i) => i,
                    None => {
                        let id = store.next_record_number().map_err(write_err)?;
                        let name = format!("{run}/timeSeries/{id}");
                        let body = created(coll("timeSeries"), &name, &json!({"displayName": s.tag, "valueType": "SCALAR", "pluginName": "scalars"}), now)?;
                        series.push((run.clone(), s.tag.clone(), name, body));
                        series.len() - 1
                    }
                };
                let wall = Timestamp::from_micros((s.wall_time * 1e6) as i64).to_string();
                let value = if s.value.is_finite() { s.value.to_string() } else { format!("{:?}", s.value.to_string().replace("inf", "Infinity")) };
                let point = format!(r#"{{"wallTime":"{wall}","step":"{}","scalar":{{"value":{value}}}}}"#, s.step);
                let name = &series[i].2;
                match points.iter_mut().find(|(n, _, _)| n == name) {
                    Some((_, p, top)) => {
                        p.push((s.step, point));
                        top.0 = top.0.max(s.step);
                        if wall > top.1 {
                            top.1 = wall;
                        }
                    }
                    None => points.push((name.clone(), vec![(s.step, point)], (s.step, wall))),
                }
            }
        }
        // Each series' metadata follows its points once per pass.
        for (run, _, name, mut body) in series {
            let Some((_, _, (step, wall))) = points.iter().find(|(n, _, _)| *n == name) else { continue };
            let meta = body.get("metadata").cloned().unwrap_or(json!({}));
            let max_step = meta.get("maxStep").and_then(Value::as_str).and_then(|x| x.parse::<i64>().ok()).unwrap_or(-1).max(*step);
            let max_wall = match meta.get("maxWallTime").and_then(Value::as_str) {
                Some(w) if w >= wall.as_str() => w.to_string(),
                _ => wall.clone(),
            };
            body["metadata"] = json!({"maxStep": max_step.to_string(), "maxWallTime": max_wall});
            puts.push((run, name, body.to_string(), "tensorboardTimeSeries"));
        }
    }
    for f in &b.files {
        let mut v = json!({"path": f.rel, "offset": f.offset});
        if let Some(d) = &f.damage {
            v["damage"] = Value::String(d.clone());
            lines.push(format!("TensorBoard: the event file {} is skipped: {d}.", f.rel));
        }
        puts.push((job_name.clone(), file_record(&b.project, &b.region, b.job, &f.rel), v.to_string(), KIND_EVENT_FILE));
    }
    let mut changes: Vec<Change<'_>> = puts
        .iter()
        .map(|(parent, name, body, kind)| Change::Put(Put { kind, project: &b.project, region: &b.region, parent, name, body }))
        .collect();
    for (name, p, _) in &points {
        changes.push(Change::Points(name, p));
    }
    for l in &lines {
        changes.push(Change::JobEvent(b.job, l));
    }
    store.change_records(&changes, now).map_err(write_err)
}

#[cfg(test)]
mod tests {
    use super::super::ops::tests::store;
    use super::*;

    fn scalar(tag: &str, step: i64, value: f64) -> Scalar {
        Scalar { tag: tag.into(), step, wall_time: 1_765_000_000.0 + step as f64, value }
    }

    /// Two passes over a job's files: the default TensorBoard is made once, an experiment
    /// named by the job, a run per directory, a series per tag; the offsets are kept; a
    /// damaged file is a log line of the job.
    #[test]
    fn passes_become_series_of_the_default_tensorboard() {
        let (_d, mut s) = store();
        let settings = trainyard_core::Settings::default();
        s.insert_job(&trainyard_store::NewJob { kind: "custom", project: "p", region: "r", display_name: "j", labels: &[], resource: "{}" }, |id| {
            use trainyard_core::job::{Demand, Policy};
            trainyard_core::Job::new(id, "p".into(), "r".into(), &[1], Demand::default(), Policy::defaults(&settings), false, 5)
        })
        .unwrap();
        let mut b = Batch { job: 1, project: "p".into(), region: "r".into(), display_name: "train".into(), tensorboard: None, files: vec![] };
        b.files.push(FileRead { rel: "events.out.tfevents.1".into(), offset: 100, damage: None, scalars: vec![scalar("loss", 1, 0.5), scalar("acc", 1, 0.1)] });
        b.files.push(FileRead { rel: "eval/events.out.tfevents.2".into(), offset: 50, damage: None, scalars: vec![scalar("loss", 1, 0.7)] });
        apply(&mut s, &b, 10).unwrap();
        b.files = vec![FileRead { rel: "events.out.tfevents.1".into(), offset: 150, damage: None, scalars: vec![scalar("loss", 2, 0.25)] }];
        b.files.push(FileRead { rel: "bad.tfevents".into(), offset: 0, damage: Some("the record at byte 0 fails its data CRC".into()), scalars: vec![] });
        apply(&mut s, &b, 20).unwrap();
        let tbs = all(&s, "tensorboard", "projects/p/locations/r").unwrap();
        assert_eq!(tbs.len(), 1);
        let exp = format!("{}/experiments/1", tbs[0].name);
        let runs: Vec<String> = all(&s, "tensorboardRun", &exp).unwrap().into_iter().map(|r| r.name.rsplit('/').next().unwrap().to_string()).collect();
        assert_eq!(runs, vec!["default", "eval"]);
        let series = all(&s, "tensorboardTimeSeries", &format!("{exp}/runs/default")).unwrap();
        assert_eq!(series.len(), 2);
        let loss = series.iter().find(|r| r.body.contains("\"loss\"")).unwrap();
        assert_eq!(s.points(&loss.name, 0, 10).unwrap().len(), 2);
        assert!(body_of(loss).unwrap()["metadata"]["maxStep"] == "2");
        let mut offs = offsets(&s, "p", "r", 1).unwrap();
        offs.sort();
        assert_eq!(offs, vec![("bad.tfevents".into(), 0, true), ("eval/events.out.tfevents.2".into(), 50, false), ("events.out.tfevents.1".into(), 150, false)]);
        let lines = s.events(1, 0).unwrap();
        assert!(lines.iter().any(|l| l.text.contains("bad.tfevents is skipped") && l.text.contains("CRC")), "{lines:?}");
        assert_eq!(run_id("Train/Run_1"), "train-run-1");
        assert_eq!(run_id(""), "default");
        let mut other = Batch { tensorboard: Some("projects/q/locations/r/tensorboards/1".into()), ..Batch::default() };
        other.project = "p".into();
        other.region = "r".into();
        other.files.push(FileRead { rel: "e.tfevents".into(), offset: 1, damage: None, scalars: vec![scalar("x", 1, 1.0)] });
        assert!(apply(&mut s, &other, 30).unwrap_err().message.contains("not a TensorBoard of project p"));
    }
}
