//! Vertex TensorBoard's own methods, beside the ones every collection has: the default
//! TensorBoard, batch creates, writing a run's or an experiment's data, and reading time
//! series (one, a batch, or exported page by page).
//!
//! A time series' points are the store's `points` under the series' name, each the JSON of
//! a `TimeSeriesDataPoint` as written (checked: a step, a time, and the value its series'
//! type takes); the series' `metadata` (`maxStep`, `maxWallTime`) follows each write.

use serde_json::{json, Map, Value};
use trainyard_api::{ApiError, Timestamp};
use trainyard_core::Micros;
use trainyard_store::records::{Change, Put};
use trainyard_store::Store;

use super::metadata::all;
use super::ops::{self, load, read_err, write_err, Request};
use super::{body_of, coll, shown, target_of_name, Target};

/// The most points one write takes.
pub const MAX_POINTS_PER_WRITE: usize = 10_000;
/// The most time series a batch read takes (as the service).
pub const MAX_BATCH_READ: usize = 20;


/// A new TensorBoard with `isDefault` set: the project's other TensorBoards stop being its
/// default (there is one default per project and region, as the service has it).
pub fn create_tensorboard(store: &mut Store, req: &Request, now: Micros) -> Result<Value, ApiError> {
    let parent = req.target.parent.clone();
    ops::create(store, req, now, |s, body| {
        if body.get("isDefault") != Some(&Value::Bool(true)) {
            return Ok(Vec::new());
        }
        let mut out = Vec::new();
        for r in all(s, "tensorboard", &parent)? {
            let mut v = body_of(&r)?;
            if v.get("isDefault") == Some(&Value::Bool(true)) {
                v["isDefault"] = Value::Bool(false);
                out.push((r.parent, r.name, v.to_string()));
            }
        }
        Ok(out)
    })
}

/// A new time series: its display name is unique in its run (ALREADY_EXISTS otherwise, as
/// the service answers), and its `metadata` starts empty.
pub fn create_time_series(store: &mut Store, req: &Request, now: Micros) -> Result<Value, ApiError> {
    let t = &req.target;
    let display = req.body.get("displayName").and_then(Value::as_str).unwrap_or("").to_string();
    if !display.is_empty() {
        for r in all(store, "tensorboardTimeSeries", &t.parent)? {
            if body_of(&r)?.get("displayName").and_then(Value::as_str) == Some(display.as_str()) {
                return Err(ApiError::already_exists(format!("A TensorboardTimeSeries named {display:?} already exists in {}: {}.", t.parent, r.name)));
            }
        }
    }
    ops::create(store, req, now, |_, _| Ok(Vec::new()))
}

/// `experiments/{e}/runs:batchCreate` (runs) and `experiments/{e}:batchCreate` (time series):
/// each request's parent must be under the experiment; all or nothing.
pub fn batch_create(store: &mut Store, req: &Request, now: Micros) -> Result<Value, ApiError> {
    let t = &req.target;
    let (child, field, out_key, id_param) = match (t.coll.segment, t.id.is_some()) {
        ("runs", false) => ("runs", "tensorboardRun", "tensorboardRuns", "tensorboardRunId"),
        ("experiments", true) => ("timeSeries", "tensorboardTimeSeries", "tensorboardTimeSeries", "tensorboardTimeSeriesId"),
        _ => return Err(ops::no_verb(t, "batchCreate")),
    };
    let experiment = if t.id.is_some() { t.name() } else { t.parent.clone() };
    load(store, coll("experiments"), &experiment)?;
    let requests = req.body.get("requests").and_then(Value::as_array).cloned().unwrap_or_default();
    if requests.is_empty() || requests.len() > 1000 {
        return Err(ApiError::invalid_argument("requests: between 1 and 1000 create requests are taken."));
    }
    // Checked first, all of them: a batch is all or nothing.
    let mut plans = Vec::new();
    for (i, r) in requests.iter().enumerate() {
        let parent = match child {
            "runs" => r.get("parent").and_then(Value::as_str).filter(|p| !p.is_empty()).unwrap_or(&experiment).to_string(),
            _ => r.get("parent").and_then(Value::as_str).unwrap_or("").to_string(),
        };
        let ok_parent = match child {
            "runs" => parent == experiment,
            _ => target_of_name(&t.project, &t.region, &parent, coll("runs")).is_some_and(|p| p.parent == experiment),
        };
        if !ok_parent {
            return Err(ApiError::invalid_argument(format!("requests[{i}].parent {parent:?} is not under {experiment}.")));
        }
        let rest = parent.strip_prefix(&format!("projects/{}/locations/{}/", t.project, t.region)).unwrap_or("");
        let target = super::target(&t.project, &t.region, &format!("{rest}/{child}"))?;
        let mut query = Vec::new();
        if let Some(id) = r.get(id_param).and_then(Value::as_str).filter(|s| !s.is_empty()) {
            query.push((id_param.to_string(), id.to_string()));
        }
        let body = r.get(field).cloned().unwrap_or(Value::Object(Map::new()));
        super::created(target.coll, "x", &body, now).map_err(|e| ApiError::invalid_argument(format!("requests[{i}]: {}", e.message)))?;
        plans.push(Request { target, query, body, ints: req.ints });
    }
    let mut made = Vec::new();
    for p in &plans {
        let one = match child {
            "runs" => ops::create(store, p, now, |_, _| Ok(Vec::new())),
            _ => create_time_series(store, p, now),
        };
        match one {
            Ok(v) => made.push(v),
            Err(e) => {
                // Undo what this batch made: all or nothing.
                let names: Vec<String> = made.iter().filter_map(|v: &Value| v["name"].as_str().map(String::from)).collect();
                let changes: Vec<Change<'_>> = names.iter().map(|n| Change::Delete(n)).collect();
                store.change_records(&changes, now).map_err(write_err)?;
                return Err(e);
            }
        }
    }
    let mut out = Map::new();
    out.insert(out_key.into(), Value::Array(made));
    Ok(Value::Object(out))
}

fn value_type(series: &Value) -> &str {
    series.get("valueType").and_then(Value::as_str).unwrap_or("VALUE_TYPE_UNSPECIFIED")
}

/// One point as written, checked against its series' type: its JSON to keep and its step.
fn point(v: &Value, kind: &str, at: &str) -> Result<(i64, Value), ApiError> {
    let step = match v.get("step") {
        Some(Value::String(s)) => s.parse::<i64>().ok(),
        Some(Value::Number(n)) => n.as_i64(),
        None => Some(0),
        _ => None,
    }
    .filter(|s| *s >= 0)
    .ok_or_else(|| ApiError::invalid_argument(format!("{at}.step must be a non-negative integer.")))?;
    let wall = match v.get("wallTime").and_then(Value::as_str) {
        Some(t) => Timestamp::parse_rfc3339(t).map_err(|_| ApiError::invalid_argument(format!("{at}.wall_time {t:?} is not an RFC 3339 time.")))?,
        None => return Err(ApiError::invalid_argument(format!("{at}.wall_time is required."))),
    };
    let (field, ok) = match kind {
        "SCALAR" => ("scalar", v.get("scalar").and_then(|s| s.get("value")).is_some_and(|x| x.is_number() || matches!(x.as_str(), Some("NaN" | "Infinity" | "-Infinity")))
            || v.get("scalar").is_some_and(|s| s.as_object().is_some_and(Map::is_empty))),
        "TENSOR" => ("tensor", v.get("tensor").and_then(|s| s.get("value")).is_some_and(Value::is_string)),
        "BLOB_SEQUENCE" => ("blobs", v.get("blobs").is_some_and(Value::is_object)),
        other => return Err(ApiError::failed_precondition(format!("{at}: the time series has no value type ({other})."))),
    };
    if !ok {
        return Err(ApiError::invalid_argument(format!("{at}: a point of a {kind} time series holds {field} (with its value).")));
    }
    let mut keep = Map::new();
    keep.insert("wallTime".into(), Value::String(wall.to_string()));
    keep.insert("step".into(), Value::String(step.to_string()));
    keep.insert(field.into(), v[field].clone());
    Ok((step, Value::Object(keep)))
}

/// The points of `data` (a `TimeSeriesData` of run `run`), checked, with the series'
/// record updated: (series name, series record's parent, new series JSON, points).
type Written = (String, String, String, Vec<(i64, String)>);

fn series_data(store: &Store, t: &Target, run: &str, data: &Value, at: &str, budget: &mut usize) -> Result<Written, ApiError> {
    let id = data.get("tensorboardTimeSeriesId").and_then(Value::as_str).filter(|s| !s.is_empty()).ok_or_else(|| ApiError::invalid_argument(format!("{at}.tensorboard_time_series_id is required.")))?;
    let name = format!("{run}/timeSeries/{id}");
    target_of_name(&t.project, &t.region, &name, coll("timeSeries")).ok_or_else(|| ApiError::invalid_argument(format!("{at}.tensorboard_time_series_id {id:?} is not a time series id.")))?;
    let (_, mut series) = load(store, coll("timeSeries"), &name)?;
    let kind = value_type(&series).to_string();
    if let Some(given) = data.get("valueType") {
        let given = super::enum_name(coll("timeSeries"), "valueType", super::VALUE_TYPES, given)?;
        if given != kind.as_str() {
            return Err(ApiError::invalid_argument(format!("{at}.value_type {given} is not the series' type {kind}.")));
        }
    }
    let values = data.get("values").and_then(Value::as_array).cloned().unwrap_or_default();
    if values.len() > *budget {
        return Err(ApiError::invalid_argument(format!("a write takes at most {MAX_POINTS_PER_WRITE} points.")));
    }
    *budget -= values.len();
    let meta = series.get("metadata").cloned().unwrap_or(json!({}));
    let mut max_step = meta.get("maxStep").and_then(Value::as_str).and_then(|s| s.parse::<i64>().ok()).unwrap_or(-1);
    let mut max_wall = meta.get("maxWallTime").and_then(Value::as_str).map(String::from).unwrap_or_default();
    let mut points = Vec::new();
    for (i, v) in values.iter().enumerate() {
        let (step, keep) = point(v, &kind, &format!("{at}.values[{i}]"))?;
        max_step = max_step.max(step);
        let wall = keep["wallTime"].as_str().unwrap_or("").to_string();
        if Timestamp::parse_rfc3339(&wall).ok().map(|w| w.micros()) > Timestamp::parse_rfc3339(&max_wall).ok().map(|w| w.micros()) {
            max_wall = wall;
        }
        points.push((step, keep.to_string()));
    }
    if !points.is_empty() {
        let mut m = Map::new();
        m.insert("maxStep".into(), Value::String(max_step.to_string()));
        m.insert("maxWallTime".into(), Value::String(max_wall));
        if let Some(b) = meta.get("maxBlobSequenceLength") {
            m.insert("maxBlobSequenceLength".into(), b.clone());
        }
        series["metadata"] = Value::Object(m);
    }
    Ok((name, run.to_string(), series.to_string(), points))
}

fn write_series(store: &mut Store, t: &Target, written: &[Written], now: Micros) -> Result<(), ApiError> {
    let mut changes = Vec::new();
    for (name, parent, body, points) in written {
        if points.is_empty() {
            continue;
        }
        changes.push(Change::Put(Put { kind: "tensorboardTimeSeries", project: &t.project, region: &t.region, parent, name, body }));
        changes.push(Change::Points(name, points));
    }
    store.change_records(&changes, now).map_err(write_err)
}

/// `runs/{r}:write`: `timeSeriesData` of the run's series.
pub fn write_run(store: &mut Store, req: &Request, now: Micros) -> Result<Value, ApiError> {
    let t = &req.target;
    let run = t.name();
    load(store, coll("runs"), &run)?;
    let mut budget = MAX_POINTS_PER_WRITE;
    let mut written = Vec::new();
    for (i, d) in req.body.get("timeSeriesData").and_then(Value::as_array).into_iter().flatten().enumerate() {
        written.push(series_data(store, t, &run, d, &format!("time_series_data[{i}]"), &mut budget)?);
    }
    write_series(store, t, &written, now)?;
    Ok(json!({}))
}

/// `experiments/{e}:write`: `writeRunDataRequests`, each a run of the experiment and its
/// data; all or nothing.
pub fn write_experiment(store: &mut Store, req: &Request, now: Micros) -> Result<Value, ApiError> {
    let t = &req.target;
    let experiment = t.name();
    load(store, coll("experiments"), &experiment)?;
    let mut budget = MAX_POINTS_PER_WRITE;
    let mut written = Vec::new();
    for (i, r) in req.body.get("writeRunDataRequests").and_then(Value::as_array).into_iter().flatten().enumerate() {
        let run = r.get("tensorboardRun").and_then(Value::as_str).unwrap_or("");
        if target_of_name(&t.project, &t.region, run, coll("runs")).is_none_or(|x| x.parent != experiment) {
            return Err(ApiError::invalid_argument(format!("write_run_data_requests[{i}].tensorboard_run {run:?} is not a run of {experiment}.")));
        }
        load(store, coll("runs"), run)?;
        for (j, d) in r.get("timeSeriesData").and_then(Value::as_array).into_iter().flatten().enumerate() {
            written.push(series_data(store, t, run, d, &format!("write_run_data_requests[{i}].time_series_data[{j}]"), &mut budget)?);
        }
    }
    write_series(store, t, &written, now)?;
    Ok(json!({}))
}

/// Every point of a series, by step (then as written).
fn points_of(store: &Store, series: &str) -> Result<Vec<Value>, ApiError> {
    let mut out = Vec::new();
    let mut after = 0;
    loop {
        let batch = store.points(series, after, 4096).map_err(read_err)?;
        let n = batch.len();
        for (seq, step, body) in batch {
            after = seq;
            let v: Value = serde_json::from_str(&body).map_err(|e| ApiError::internal(format!("a stored point of {series} is damaged: {e}")))?;
            out.push((step, seq, v));
        }
        if n < 4096 {
            break;
        }
    }
    out.sort_by_key(|(step, seq, _)| (*step, *seq));
    Ok(out.into_iter().map(|(_, _, v)| v).collect())
}

/// At most `max` of `points`, evenly spread, the last kept (as the service samples).
fn sampled(points: Vec<Value>, max: usize) -> Vec<Value> {
    if points.len() <= max || max == 0 {
        return points;
    }
    let n = points.len();
    (0..max).map(|i| points[if i + 1 == max { n - 1 } else { i * n / max }].clone()).collect()
}

fn series_data_of(store: &Store, name: &str, series: &Value, max: Option<usize>, ints: bool) -> Result<Value, ApiError> {
    let kind = value_type(series);
    let default_max = match kind {
        "SCALAR" => 1000,
        "TENSOR" => 100,
        _ => 10,
    };
    let points = sampled(points_of(store, name)?, max.unwrap_or(default_max));
    let id = name.rsplit('/').next().unwrap_or("");
    let shown_kind = if ints { super::VALUE_TYPES.iter().position(|v| *v == kind).map_or(json!(0), |i| json!(i)) } else { json!(kind) };
    let mut out = Map::new();
    out.insert("tensorboardTimeSeriesId".into(), json!(id));
    out.insert("valueType".into(), shown_kind);
    if !points.is_empty() {
        out.insert("values".into(), Value::Array(points));
    }
    Ok(Value::Object(out))
}

fn max_points(req: &Request) -> Result<Option<usize>, ApiError> {
    match req.param("maxDataPoints") {
        None | Some("") | Some("0") => Ok(None),
        Some(n) => n.parse::<usize>().map(|n| Some(n.min(100_000))).map_err(|_| ApiError::invalid_argument(format!("maxDataPoints: {n:?} is not a number."))),
    }
}

/// `timeSeries/{s}:read`: `{timeSeriesData}`.
pub fn read(store: &Store, req: &Request) -> Result<Value, ApiError> {
    let name = req.target.name();
    if req.param("filter").is_some_and(|f| !f.trim().is_empty()) {
        return Err(ApiError::invalid_argument("filter: reading a time series takes no filter here; all its points are read (maxDataPoints samples them)."));
    }
    let (_, series) = load(store, coll("timeSeries"), &name)?;
    Ok(json!({"timeSeriesData": series_data_of(store, &name, &series, max_points(req)?, req.ints)?}))
}

/// `tensorboards/{t}:batchRead?timeSeries=...`: up to 20 series of the TensorBoard.
pub fn batch_read(store: &Store, req: &Request) -> Result<Value, ApiError> {
    let t = &req.target;
    let tb = t.name();
    load(store, coll("tensorboards"), &tb)?;
    let names: Vec<&str> = req.params("timeSeries").collect();
    if names.len() > MAX_BATCH_READ {
        return Err(ApiError::invalid_argument(format!("time_series: at most {MAX_BATCH_READ} time series are read at once; {} were asked.", names.len())));
    }
    let mut out = Vec::new();
    for name in names {
        if !name.starts_with(&format!("{tb}/")) || target_of_name(&t.project, &t.region, name, coll("timeSeries")).is_none() {
            return Err(ApiError::invalid_argument(format!("time_series: {name:?} is not a time series of {tb}.")));
        }
        let (_, series) = load(store, coll("timeSeries"), name)?;
        out.push(series_data_of(store, name, &series, None, req.ints)?);
    }
    Ok(json!({"timeSeriesData": out}))
}

/// `timeSeries/{s}:exportTensorboardTimeSeries`: every point, by step, page by page
/// (`pageSize` up to 10,000; the token is the place of the page's last point).
pub fn export(store: &Store, req: &Request, after: usize, token: impl FnOnce(i64) -> String) -> Result<Value, ApiError> {
    let name = req.target.name();
    load(store, coll("timeSeries"), &name)?;
    if req.body.get("filter").and_then(Value::as_str).is_some_and(|f| !f.trim().is_empty()) {
        return Err(ApiError::invalid_argument("filter: exporting a time series takes no filter here."));
    }
    let size = match req.body.get("pageSize") {
        None | Some(Value::Null) => 1000,
        Some(v) => v.as_u64().or_else(|| v.as_str().and_then(|s| s.parse().ok())).filter(|n| *n > 0).map_or(1000, |n| n.min(10_000) as usize),
    };
    let points = points_of(store, &name)?;
    let page: Vec<Value> = points.iter().skip(after).take(size).cloned().collect();
    let mut out = Map::new();
    if !page.is_empty() {
        out.insert("timeSeriesDataPoints".into(), Value::Array(page));
    }
    if after + size < points.len() {
        out.insert("nextPageToken".into(), Value::String(token((after + size) as i64)));
    }
    Ok(Value::Object(out))
}

/// `tensorboards/{t}:readSize`: the bytes of its points.
pub fn read_size(store: &Store, req: &Request) -> Result<Value, ApiError> {
    let tb = req.target.name();
    load(store, coll("tensorboards"), &tb)?;
    let mut bytes = 0usize;
    for e in all(store, "tensorboardExperiment", &tb)? {
        for r in all(store, "tensorboardRun", &e.name)? {
            for s in all(store, "tensorboardTimeSeries", &r.name)? {
                bytes += points_of(store, &s.name)?.iter().map(|p| p.to_string().len()).sum::<usize>();
            }
        }
    }
    Ok(json!({"storageSizeByte": bytes.to_string()}))
}

/// The shown form of a write's answer for `coll` (batch creates answer with resources).
pub fn shown_batch(v: Value, ints: bool) -> Value {
    let mut v = v;
    for (key, segment) in [("tensorboardRuns", "runs"), ("tensorboardTimeSeries", "timeSeries")] {
        if let Some(Value::Array(items)) = v.get_mut(key) {
            for i in items.iter_mut() {
                *i = shown(coll(segment), i, ints);
            }
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::super::ops::tests::{req, store};
    use super::super::ops::{create, list, Paging};
    use super::*;

    /// The SDK's time-series path: a default TensorBoard (a second default takes over), an
    /// experiment, a run, a scalar series; points written through the run and the
    /// experiment, read one by one and in a batch, by step; bad points name their place.
    #[test]
    fn default_tensorboard_series_written_and_read() {
        let (_d, mut s) = store();
        let op = create_tensorboard(&mut s, &req("tensorboards", &[], json!({"displayName": "d1", "isDefault": true})), 1).unwrap();
        let tb1 = op["response"]["name"].as_str().unwrap().to_string();
        let op2 = create_tensorboard(&mut s, &req("tensorboards", &[], json!({"displayName": "d2", "isDefault": true})), 2).unwrap();
        let tb2 = op2["response"]["name"].as_str().unwrap().to_string();
        let defaults = list(&s, &req("tensorboards", &[("filter", "is_default=true")], Value::Null), Paging { after: 0, size: 10 }, |_| String::new()).unwrap();
        assert_eq!(defaults["tensorboards"].as_array().map(Vec::len), Some(1));
        assert_eq!(defaults["tensorboards"][0]["name"], tb2.as_str());
        assert_ne!(tb1, tb2);
        let tb = tb2.trim_start_matches("projects/p/locations/r/").to_string();
        create(&mut s, &req(&format!("{tb}/experiments"), &[("tensorboardExperimentId", "exp")], json!({"displayName": "exp"})), 3, |_, _| Ok(Vec::new())).unwrap();
        let e = create(&mut s, &req(&format!("{tb}/experiments"), &[], json!({})), 3, |_, _| Ok(Vec::new())).unwrap_err();
        assert!(e.message.contains("tensorboardExperimentId is required"), "{}", e.message);
        let runs = batch_create(&mut s, &req(&format!("{tb}/experiments/exp/runs:batchCreate"), &[], json!({"requests": [{"tensorboardRunId": "r1", "tensorboardRun": {"displayName": "r1"}}]})), 4).unwrap();
        let run = runs["tensorboardRuns"][0]["name"].as_str().unwrap().to_string();
        let ts = create_time_series(&mut s, &req(&format!("{tb}/experiments/exp/runs/r1/timeSeries"), &[], json!({"displayName": "loss", "valueType": 1, "pluginName": "scalars"})), 5).unwrap();
        let e = create_time_series(&mut s, &req(&format!("{tb}/experiments/exp/runs/r1/timeSeries"), &[], json!({"displayName": "loss", "valueType": 1})), 5).unwrap_err();
        assert_eq!(e.code, trainyard_api::Code::AlreadyExists);
        let id = ts["name"].as_str().unwrap().rsplit('/').next().unwrap().to_string();
        let data = |step: &str, v: f64| json!({"tensorboardTimeSeriesId": id, "valueType": 1, "values": [{"wallTime": "2026-12-07T04:00:00Z", "step": step, "scalar": {"value": v}}]});
        write_run(&mut s, &req(&format!("{tb}/experiments/exp/runs/r1:write"), &[], json!({"timeSeriesData": [data("2", 0.4)]})), 6).unwrap();
        write_experiment(&mut s, &req(&format!("{tb}/experiments/exp:write"), &[], json!({"writeRunDataRequests": [{"tensorboardRun": run, "timeSeriesData": [data("1", 0.5)]}]})), 7).unwrap();
        let bad = json!({"tensorboardTimeSeriesId": id, "values": [{"wallTime": "2026-12-07T04:00:00Z", "step": "3", "tensor": {"value": "AA=="}}]});
        let e = write_run(&mut s, &req(&format!("{tb}/experiments/exp/runs/r1:write"), &[], json!({"timeSeriesData": [bad]})), 8).unwrap_err();
        assert!(e.message.contains("time_series_data[0].values[0]") && e.message.contains("scalar"), "{}", e.message);
        let one = read(&s, &req(&format!("{tb}/experiments/exp/runs/r1/timeSeries/{id}:read"), &[], Value::Null)).unwrap();
        let steps: Vec<&str> = one["timeSeriesData"]["values"].as_array().unwrap().iter().map(|p| p["step"].as_str().unwrap()).collect();
        assert_eq!(steps, vec!["1", "2"]);
        let series_name = ts["name"].as_str().unwrap().to_string();
        let batch = batch_read(&s, &req(&format!("{tb}:batchRead"), &[("timeSeries", &series_name)], Value::Null)).unwrap();
        assert_eq!(batch["timeSeriesData"][0]["values"][1]["scalar"]["value"], 0.4);
        let e = batch_read(&s, &req(&format!("{tb}:batchRead"), &[("timeSeries", &series_name.replace(&tb2, &tb1))], Value::Null)).unwrap_err();
        assert!(e.message.contains("is not a time series of"), "{}", e.message);
        let (_, series) = load(&s, coll("timeSeries"), &series_name).unwrap();
        assert_eq!(series["metadata"]["maxStep"], "2");
        let page = export(&s, &req(&format!("{tb}/experiments/exp/runs/r1/timeSeries/{id}:exportTensorboardTimeSeries"), &[], json!({"pageSize": 1})), 0, |n| n.to_string()).unwrap();
        assert_eq!((page["timeSeriesDataPoints"].as_array().map(Vec::len), page["nextPageToken"].as_str()), (Some(1), Some("1")));
        assert_eq!(sampled((0..10).map(|i| json!(i)).collect(), 3), vec![json!(0), json!(3), json!(9)]);
    }
}
