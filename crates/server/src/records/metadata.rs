//! Vertex ML Metadata's own methods, beside the ones every collection has: a context's
//! children, artifacts and executions, an execution's events, lineage queries and purges.
//!
//! A context's parents are its `parentContexts` (shown); the contexts an artifact or
//! execution is in are its `__contexts`, an execution's events its `__events` (not shown).

use serde_json::{json, Map, Value};
use trainyard_api::{ApiError, Timestamp};
use trainyard_core::Micros;
use trainyard_store::records::{Change, Put, Record};
use trainyard_store::Store;

use super::ops::{self, load, read_err, write_err, Request, Seen};
use super::filter::Subject;
use super::{body_of, coll, shown, target_of_name, Collection};

/// The most names one call adds (children, artifacts, executions, events).
pub const MAX_NAMES: usize = 1000;


/// Every record of `kind` under `parent`.
pub fn all(store: &Store, kind: &str, parent: &str) -> Result<Vec<Record>, ApiError> {
    let mut out = Vec::new();
    let mut after = 0;
    loop {
        let batch = store.records(kind, parent, after, 1024).map_err(read_err)?;
        let n = batch.len();
        if let Some(last) = batch.last() {
            after = last.seq;
        }
        out.extend(batch);
        if n < 1024 {
            return Ok(out);
        }
    }
}

/// The names a body's `field` lists, each a record of `c` in the same store as the
/// request's target, loaded; an error names the first that is not.
fn named(store: &Store, req: &Request, field: &str, c: &'static Collection) -> Result<Vec<(Record, Value)>, ApiError> {
    let list = match req.body.get(field) {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(items)) => items,
        Some(_) => return Err(ApiError::invalid_argument(format!("{field} must be a list of resource names."))),
    };
    if list.len() > MAX_NAMES {
        return Err(ApiError::invalid_argument(format!("{field} lists {} names; at most {MAX_NAMES} are taken in one call.", list.len())));
    }
    let t = &req.target;
    let mut out = Vec::new();
    for item in list {
        let name = item.as_str().ok_or_else(|| ApiError::invalid_argument(format!("{field}: {item} is not a resource name.")))?;
        let other = target_of_name(&t.project, &t.region, name, c).filter(|o| o.parent == t.parent).ok_or_else(|| {
            ApiError::invalid_argument(format!("{field}: {name:?} is not the name of a {} in {}.", c.api, t.parent))
        })?;
        out.push(load(store, c, &other.name())?);
    }
    Ok(out)
}

/// A record rewritten, as a change to write (owned: parent, name, JSON).
fn rewrite(r: &Record, v: &Value) -> (String, String, String, &'static str) {
    (r.parent.clone(), r.name.clone(), v.to_string(), of(r))
}

fn of(r: &Record) -> &'static str {
    super::of_kind(&r.kind).map_or("", |c| c.kind)
}

fn write(store: &mut Store, req: &Request, rewrites: &[(String, String, String, &'static str)], now: Micros) -> Result<(), ApiError> {
    let t = &req.target;
    let changes: Vec<Change<'_>> = rewrites
        .iter()
        .map(|(p, n, b, k)| Change::Put(Put { kind: k, project: &t.project, region: &t.region, parent: p, name: n, body: b }))
        .collect();
    store.change_records(&changes, now).map_err(write_err)
}

/// Adds `item` to the list `field` of `v` (once).
fn add_to(v: &mut Value, field: &str, item: &str) -> bool {
    let Some(map) = v.as_object_mut() else { return false };
    let list = map.entry(field.to_string()).or_insert_with(|| Value::Array(Vec::new()));
    match list {
        Value::Array(items) if !items.iter().any(|i| i == item) => {
            items.push(Value::String(item.into()));
            true
        }
        _ => false,
    }
}

fn remove_from(v: &mut Value, field: &str, item: &str) -> bool {
    let Some(Value::Array(items)) = v.get_mut(field) else { return false };
    let before = items.len();
    items.retain(|i| i != item);
    let changed = items.len() != before;
    if items.is_empty() {
        if let Some(m) = v.as_object_mut() {
            m.remove(field);
        }
    }
    changed
}

/// `contexts/{c}:addContextArtifactsAndExecutions`: attributions and associations.
pub fn add_artifacts_and_executions(store: &mut Store, req: &Request, now: Micros) -> Result<Value, ApiError> {
    let context = req.target.name();
    load(store, coll("contexts"), &context)?;
    let mut rewrites = Vec::new();
    for (field, c) in [("artifacts", coll("artifacts")), ("executions", coll("executions"))] {
        for (r, mut v) in named(store, req, field, c)? {
            if add_to(&mut v, "__contexts", &context) {
                rewrites.push(rewrite(&r, &v));
            }
        }
    }
    write(store, req, &rewrites, now)?;
    Ok(json!({}))
}

/// The ancestors of `context` (its parents, theirs, ...), `context` included.
fn ancestors(store: &Store, context: &str) -> Result<Vec<String>, ApiError> {
    let mut seen = vec![context.to_string()];
    let mut i = 0;
    while i < seen.len() && seen.len() <= 10_000 {
        if let Some(r) = store.record(&seen[i]).map_err(read_err)? {
            for p in body_of(&r)?.get("parentContexts").and_then(Value::as_array).into_iter().flatten() {
                if let Some(p) = p.as_str() {
                    if !seen.iter().any(|s| s == p) {
                        seen.push(p.to_string());
                    }
                }
            }
        }
        i += 1;
    }
    Ok(seen)
}

/// `contexts/{c}:addContextChildren`: the children name it among their `parentContexts`.
/// A child that is the context or one of its ancestors is refused (a cycle), as the
/// service does.
pub fn add_children(store: &mut Store, req: &Request, now: Micros) -> Result<Value, ApiError> {
    let parent = req.target.name();
    load(store, coll("contexts"), &parent)?;
    let above = ancestors(store, &parent)?;
    let mut rewrites = Vec::new();
    for (r, mut v) in named(store, req, "childContexts", coll("contexts"))? {
        if above.contains(&r.name) {
            return Err(ApiError::invalid_argument(format!("childContexts: {} is {parent} or one of its ancestors; a context cannot be its own descendant.", r.name)));
        }
        if v.get("parentContexts").and_then(Value::as_array).is_some_and(|p| p.len() >= 10 && !p.iter().any(|x| x == parent.as_str())) {
            return Err(ApiError::invalid_argument(format!("childContexts: {} has 10 parents already, the most a context may have.", r.name)));
        }
        if add_to(&mut v, "parentContexts", &parent) {
            rewrites.push(rewrite(&r, &v));
        }
    }
    write(store, req, &rewrites, now)?;
    Ok(json!({}))
}

/// `contexts/{c}:removeContextChildren`.
pub fn remove_children(store: &mut Store, req: &Request, now: Micros) -> Result<Value, ApiError> {
    let parent = req.target.name();
    load(store, coll("contexts"), &parent)?;
    let mut rewrites = Vec::new();
    for (r, mut v) in named(store, req, "childContexts", coll("contexts"))? {
        if remove_from(&mut v, "parentContexts", &parent) {
            rewrites.push(rewrite(&r, &v));
        }
    }
    write(store, req, &rewrites, now)?;
    Ok(json!({}))
}

const EVENT_TYPES: &[&str] = &["TYPE_UNSPECIFIED", "INPUT", "OUTPUT"];

/// `executions/{e}:addExecutionEvents`: each event names an artifact of the store and
/// INPUT or OUTPUT.
pub fn add_events(store: &mut Store, req: &Request, now: Micros) -> Result<Value, ApiError> {
    let t = &req.target;
    let execution = t.name();
    let (r, mut v) = load(store, coll("executions"), &execution)?;
    let events = match req.body.get("events") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(e)) => e.clone(),
        Some(_) => return Err(ApiError::invalid_argument("events must be a list of events.")),
    };
    if events.len() > MAX_NAMES {
        return Err(ApiError::invalid_argument(format!("events lists {}; at most {MAX_NAMES} are taken in one call.", events.len())));
    }
    let mut kept = v.get("__events").and_then(Value::as_array).cloned().unwrap_or_default();
    for (i, e) in events.iter().enumerate() {
        let artifact = e.get("artifact").and_then(Value::as_str).ok_or_else(|| ApiError::invalid_argument(format!("events[{i}].artifact is required.")))?;
        target_of_name(&t.project, &t.region, artifact, coll("artifacts"))
            .filter(|a| a.parent == t.parent)
            .ok_or_else(|| ApiError::invalid_argument(format!("events[{i}].artifact {artifact:?} is not an artifact of {}.", t.parent)))?;
        load(store, coll("artifacts"), artifact)?;
        let kind = match e.get("type") {
            Some(Value::String(s)) if EVENT_TYPES[1..].contains(&s.as_str()) => s.clone(),
            Some(Value::Number(n)) if matches!(n.as_u64(), Some(1 | 2)) => EVENT_TYPES[n.as_u64().unwrap_or(0) as usize].to_string(),
            other => return Err(ApiError::invalid_argument(format!("events[{i}].type {} is not INPUT or OUTPUT.", other.map_or("(none)".into(), Value::to_string)))),
        };
        let mut ev = Map::new();
        ev.insert("artifact".into(), Value::String(artifact.into()));
        ev.insert("execution".into(), Value::String(execution.clone()));
        ev.insert("eventTime".into(), Value::String(Timestamp::from_micros(now).to_string()));
        ev.insert("type".into(), Value::String(kind));
        if let Some(l) = e.get("labels").filter(|l| l.is_object()) {
            ev.insert("labels".into(), l.clone());
        }
        kept.push(Value::Object(ev));
    }
    v["__events"] = Value::Array(kept);
    write(store, req, &[rewrite(&r, &v)], now)?;
    Ok(json!({}))
}

fn events_shown(events: &[Value], ints: bool) -> Vec<Value> {
    events
        .iter()
        .map(|e| {
            let mut e = e.clone();
            if ints {
                if let Some(i) = e.get("type").and_then(Value::as_str).and_then(|s| EVENT_TYPES.iter().position(|x| *x == s)) {
                    e["type"] = Value::from(i as u64);
                }
            }
            e
        })
        .collect()
}

/// A LineageSubgraph of these artifacts and executions, with the events between them.
fn subgraph(artifacts: &[Value], executions: &[Value], ints: bool) -> Value {
    let names: Vec<&str> = artifacts.iter().filter_map(|a| a["name"].as_str()).collect();
    let events: Vec<Value> = executions
        .iter()
        .flat_map(|e| e.get("__events").and_then(Value::as_array).cloned().unwrap_or_default())
        .filter(|ev| ev["artifact"].as_str().is_some_and(|a| names.contains(&a)))
        .collect();
    let mut out = Map::new();
    if !artifacts.is_empty() {
        out.insert("artifacts".into(), Value::Array(artifacts.iter().map(|a| shown(coll("artifacts"), a, ints)).collect()));
    }
    if !executions.is_empty() {
        out.insert("executions".into(), Value::Array(executions.iter().map(|e| shown(coll("executions"), e, ints)).collect()));
    }
    if !events.is_empty() {
        out.insert("events".into(), Value::Array(events_shown(&events, ints)));
    }
    Value::Object(out)
}

fn in_context(store: &Store, kind: &str, parent: &str, context: &str) -> Result<Vec<Value>, ApiError> {
    let mut out = Vec::new();
    for r in all(store, kind, parent)? {
        let v = body_of(&r)?;
        if ops::Seen(&v).in_context(context) {
            out.push(v);
        }
    }
    Ok(out)
}

/// `contexts/{c}:queryContextLineageSubgraph`: the artifacts and executions in the context,
/// and their events.
pub fn context_lineage(store: &Store, req: &Request) -> Result<Value, ApiError> {
    let t = &req.target;
    let context = t.name();
    load(store, coll("contexts"), &context)?;
    let artifacts = in_context(store, "artifact", &t.parent, &context)?;
    let executions = in_context(store, "execution", &t.parent, &context)?;
    Ok(subgraph(&artifacts, &executions, req.ints))
}

/// `executions/{e}:queryExecutionInputsAndOutputs`: its artifacts and events.
pub fn execution_io(store: &Store, req: &Request) -> Result<Value, ApiError> {
    let t = &req.target;
    let (_, v) = load(store, coll("executions"), &t.name())?;
    let mut artifacts = Vec::new();
    for ev in v.get("__events").and_then(Value::as_array).into_iter().flatten() {
        if let Some(a) = ev["artifact"].as_str() {
            if let Some(r) = store.record(a).map_err(read_err)? {
                if !artifacts.iter().any(|x: &Value| x["name"] == a) {
                    artifacts.push(body_of(&r)?);
                }
            }
        }
    }
    Ok(subgraph(&artifacts, &[v], req.ints))
}

/// `artifacts/{a}:queryArtifactLineageSubgraph`: the artifact, the executions with an event
/// of it, and their other artifacts (one hop each way; `maxHops` of 0 is the artifact
/// alone).
pub fn artifact_lineage(store: &Store, req: &Request) -> Result<Value, ApiError> {
    let t = &req.target;
    let name = t.name();
    let (_, a) = load(store, coll("artifacts"), &name)?;
    if req.param("maxHops") == Some("0") {
        return Ok(subgraph(&[a], &[], req.ints));
    }
    let mut executions = Vec::new();
    let mut artifacts = vec![a];
    for r in all(store, "execution", &t.parent)? {
        let v = body_of(&r)?;
        let events: Vec<Value> = v.get("__events").and_then(Value::as_array).cloned().unwrap_or_default();
        if events.iter().any(|e| e["artifact"] == name.as_str()) {
            for e in &events {
                if let Some(other) = e["artifact"].as_str() {
                    if !artifacts.iter().any(|x| x["name"] == other) {
                        if let Some(r) = store.record(other).map_err(read_err)? {
                            artifacts.push(body_of(&r)?);
                        }
                    }
                }
            }
            executions.push(v);
        }
    }
    Ok(subgraph(&artifacts, &executions, req.ints))
}

/// `{contexts,artifacts,executions}:purge`: the records that pass `filter` (required), deleted
/// when `force` is true, else counted; answered with a done operation whose response is the
/// count and a sample of up to 100 names.
pub fn purge(store: &mut Store, req: &Request, now: Micros) -> Result<Value, ApiError> {
    let t = &req.target;
    let c = t.coll;
    let text = req.body.get("filter").and_then(Value::as_str).unwrap_or("");
    if text.trim().is_empty() {
        return Err(ApiError::invalid_argument("filter is required: a purge names what it deletes."));
    }
    let f = ops::parse_filter(Some(text))?;
    let force = req.body.get("force").and_then(Value::as_bool).unwrap_or(false);
    let mut names = Vec::new();
    for r in all(store, c.kind, &t.parent)? {
        if f.matches(&Seen(&body_of(&r)?)) {
            names.push(r.name);
        }
    }
    let changes: Vec<Change<'_>> = if force { names.iter().map(|n| Change::Delete(n)).collect() } else { Vec::new() };
    let response_type = format!("Purge{}sResponse", c.api);
    let sample: Vec<&String> = names.iter().take(100).collect();
    let response = json!({
        "purgeCount": names.len().to_string(),
        "purgeSample": sample,
    });
    let meta = format!("Purge{}sMetadata", c.api);
    let op = store
        .change_records_answered(&changes, (&t.project, &t.region), now, |op| {
            super::done_operation(&t.project, &t.region, op, &meta, Some((&response_type, &response)), now).to_string()
        })
        .map_err(write_err)?;
    Ok(super::done_operation(&t.project, &t.region, op, &meta, Some((&response_type, &response)), now))
}

/// What deleting a context rewrites: its children lose it from `parentContexts`, the
/// artifacts and executions in it lose it from `__contexts`.
pub fn context_references(store: &Store, req: &Request) -> Result<Vec<(String, String, String, &'static str)>, ApiError> {
    let t = &req.target;
    let context = t.name();
    let mut out = Vec::new();
    for (kind, field) in [("context", "parentContexts"), ("artifact", "__contexts"), ("execution", "__contexts")] {
        for r in all(store, kind, &t.parent)? {
            let mut v = body_of(&r)?;
            if remove_from(&mut v, field, &context) {
                out.push(rewrite(&r, &v));
            }
        }
    }
    Ok(out)
}

/// DELETE of a context, with the references to it.
pub fn delete_context(store: &mut Store, req: &Request, now: Micros) -> Result<Value, ApiError> {
    let refs = context_references(store, req)?;
    let t = &req.target;
    let changes: Vec<Change<'_>> = refs
        .iter()
        .map(|(p, n, b, k)| Change::Put(Put { kind: k, project: &t.project, region: &t.region, parent: p, name: n, body: b }))
        .collect();
    ops::delete(store, req, now, &changes)
}

#[cfg(test)]
mod tests {
    use super::super::ops::tests::{req, store};
    use super::super::ops::{create, get, list, Paging};
    use super::*;

    const S: &str = "projects/p/locations/r/metadataStores/default";

    fn mk(s: &mut Store, coll: &str, id: &str, body: Value) {
        create(s, &req(&format!("metadataStores/default/{coll}"), &[(super::super::collection(coll).unwrap().id_param, id)], body), 1, |_, _| Ok(Vec::new())).unwrap();
    }

    /// The experiment flow's graph: a run context child of an experiment, an artifact in
    /// the run, an execution with events; filters `parent_contexts:` and `in_context()`
    /// find them; lineage shows them; deleting the experiment leaves the run parentless.
    #[test]
    fn contexts_children_artifacts_events_and_lineage() {
        let (_d, mut s) = store();
        mk(&mut s, "contexts", "exp", json!({"schemaTitle": "system.Experiment"}));
        mk(&mut s, "contexts", "exp-run", json!({"schemaTitle": "system.ExperimentRun"}));
        mk(&mut s, "artifacts", "a1", json!({"schemaTitle": "system.Metrics"}));
        mk(&mut s, "executions", "e1", json!({"schemaTitle": "system.Run", "state": "RUNNING"}));
        let exp = format!("{S}/contexts/exp");
        let run = format!("{S}/contexts/exp-run");
        add_children(&mut s, &req("metadataStores/default/contexts/exp:addContextChildren", &[], json!({"childContexts": [run]})), 2).unwrap();
        let e = add_children(&mut s, &req("metadataStores/default/contexts/exp-run:addContextChildren", &[], json!({"childContexts": [exp]})), 2).unwrap_err();
        assert!(e.message.contains("own descendant"), "{}", e.message);
        add_artifacts_and_executions(
            &mut s,
            &req("metadataStores/default/contexts/exp-run:addContextArtifactsAndExecutions", &[], json!({"artifacts": [format!("{S}/artifacts/a1")], "executions": [format!("{S}/executions/e1")]})),
            3,
        )
        .unwrap();
        add_events(&mut s, &req("metadataStores/default/executions/e1:addExecutionEvents", &[], json!({"events": [{"artifact": format!("{S}/artifacts/a1"), "type": 2}]})), 4).unwrap();
        let e = add_events(&mut s, &req("metadataStores/default/executions/e1:addExecutionEvents", &[], json!({"events": [{"artifact": "projects/q/locations/r/metadataStores/default/artifacts/a1", "type": "INPUT"}]})), 4).unwrap_err();
        assert!(e.message.contains("is not an artifact of"), "{}", e.message);
        let f = format!("schema_title=\"system.ExperimentRun\" AND parent_contexts:\"{exp}\"");
        let runs = list(&s, &req("metadataStores/default/contexts", &[("filter", &f)], Value::Null), Paging { after: 0, size: 10 }, |_| String::new()).unwrap();
        assert_eq!(runs["contexts"].as_array().map(Vec::len), Some(1));
        let f = format!("in_context(\"{run}\")");
        let arts = list(&s, &req("metadataStores/default/artifacts", &[("filter", &f)], Value::Null), Paging { after: 0, size: 10 }, |_| String::new()).unwrap();
        assert_eq!(arts["artifacts"][0]["name"], format!("{S}/artifacts/a1"));
        assert!(arts["artifacts"][0].get("__contexts").is_none());
        let g = context_lineage(&s, &req("metadataStores/default/contexts/exp-run:queryContextLineageSubgraph", &[], Value::Null)).unwrap();
        assert_eq!((g["artifacts"].as_array().map(Vec::len), g["executions"].as_array().map(Vec::len), g["events"][0]["type"].as_str()), (Some(1), Some(1), Some("OUTPUT")));
        let io = execution_io(&s, &req("metadataStores/default/executions/e1:queryExecutionInputsAndOutputs", &[], Value::Null)).unwrap();
        assert_eq!(io["artifacts"].as_array().map(Vec::len), Some(1));
        let al = artifact_lineage(&s, &req("metadataStores/default/artifacts/a1:queryArtifactLineageSubgraph", &[], Value::Null)).unwrap();
        assert_eq!(al["executions"].as_array().map(Vec::len), Some(1));
        delete_context(&mut s, &req("metadataStores/default/contexts/exp", &[], Value::Null), 5).unwrap();
        let r = get(&s, &req("metadataStores/default/contexts/exp-run", &[], Value::Null)).unwrap();
        assert!(r.get("parentContexts").is_none(), "{r}");
        let p = purge(&mut s, &req("metadataStores/default/artifacts:purge", &[], json!({"filter": "schema_title=\"system.Metrics\"", "force": true})), 6).unwrap();
        assert_eq!(p["response"]["purgeCount"], "1");
        assert!(get(&s, &req("metadataStores/default/artifacts/a1", &[], Value::Null)).is_err());
    }
}
