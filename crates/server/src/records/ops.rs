//! The methods every collection of records has: create, get, list, update, delete; reads on
//! a read connection, writes on the driver's (see the module documentation).

use serde_json::{Map, Value};
use trainyard_api::ApiError;
use trainyard_core::Micros;
use trainyard_store::records::{Change, Put, Record};
use trainyard_store::Store;

use super::filter::{self, Filter, Subject};
use super::{body_of, collection, created, done_operation, not_found, shown, updated, valid_id, Collection, Delete, Target};

/// A request of these services, parsed from REST (or from gRPC by way of REST).
#[derive(Debug)]
pub struct Request {
    pub target: Target,
    /// Query parameters, each with its values.
    pub query: Vec<(String, String)>,
    pub body: Value,
    /// Enums as numbers in the answer.
    pub ints: bool,
}

impl Request {
    pub fn param(&self, key: &str) -> Option<&str> {
        self.query.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    pub fn params<'a>(&'a self, key: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.query.iter().filter(move |(k, _)| k == key).map(|(_, v)| v.as_str())
    }
}

/// A list page's place: after which record, and how many.
#[derive(Clone, Copy, Debug)]
pub struct Paging {
    pub after: i64,
    pub size: usize,
}

/// A store error of a read, as the API answers it.
pub fn read_err(e: trainyard_store::StoreError) -> ApiError {
    crate::reply::read_failed(e)
}

/// A store error of a write.
pub fn write_err(e: trainyard_store::StoreError) -> ApiError {
    if e.is_transient() {
        ApiError::unavailable(format!("The store cannot take the change now: {}. Try again.", e.reason()))
    } else {
        ApiError::internal(format!("The store failed to write the change: {}", e.reason()))
    }
}

/// The record named `name` of collection `coll`, or 404 naming it.
pub fn load(store: &Store, coll: &Collection, name: &str) -> Result<(Record, Value), ApiError> {
    let r = store.record(name).map_err(read_err)?.filter(|r| r.kind == coll.kind).ok_or_else(|| not_found(coll, name))?;
    let v = body_of(&r)?;
    Ok((r, v))
}

/// The parent of `t` must exist (the project's `default` metadata store is made on first
/// use, as the service does): the changes that make it, if any.
fn parent_puts(store: &Store, t: &Target, now: Micros) -> Result<Vec<(String, String, String)>, ApiError> {
    let Some(parent_seg) = t.coll.parent else { return Ok(Vec::new()) };
    let parent_coll = collection(parent_seg).ok_or_else(|| ApiError::internal("a collection's parent is not a collection"))?;
    if store.record(&t.parent).map_err(read_err)?.is_some_and(|r| r.kind == parent_coll.kind) {
        return Ok(Vec::new());
    }
    if parent_seg == "metadataStores" && t.parent.ends_with("/metadataStores/default") {
        let body = created(parent_coll, &t.parent, &Value::Object(Map::new()), now)?;
        return Ok(vec![(t.location(), t.parent.clone(), body.to_string())]);
    }
    Err(not_found(parent_coll, &t.parent))
}

/// The id a create names (`?{id_param}=`), checked, or a new one the server chooses.
fn new_id(store: &mut Store, t: &Target, req: &Request) -> Result<String, ApiError> {
    match req.param(t.coll.id_param).filter(|s| !s.is_empty()) {
        Some(id) if valid_id(id) => Ok(id.to_string()),
        Some(id) => Err(ApiError::invalid_argument(format!(
            "{}: {id:?} is not a valid id: it must match [a-z0-9][a-z0-9-]{{0,127}}.",
            t.coll.id_param
        ))),
        None if t.coll.server_ids => Ok(store.next_record_number().map_err(write_err)?.to_string()),
        None => Err(ApiError::invalid_argument(format!("{} is required.", t.coll.id_param))),
    }
}

/// Another record of the same collection that a create rewrites: (parent, name, JSON).
pub type Rewrite = (String, String, String);

/// POST of a collection: a new record (with its operation when the create is long-running).
/// `fix` may change the new body before it is written and name other records of the
/// collection it rewrites with it (a TensorBoard that stops being the default).
pub fn create(store: &mut Store, req: &Request, now: Micros, fix: impl FnOnce(&mut Store, &mut Value) -> Result<Vec<Rewrite>, ApiError>) -> Result<Value, ApiError> {
    let t = &req.target;
    let coll = t.coll;
    let parents = parent_puts(store, t, now)?;
    let id = new_id(store, t, req)?;
    let name = format!("{}/{}/{id}", t.parent, coll.segment);
    if store.record(&name).map_err(read_err)?.is_some() {
        return Err(ApiError::already_exists(format!("The {} \"{name}\" already exists.", coll.api)));
    }
    let mut body = created(coll, &name, &req.body, now)?;
    let rewrites = fix(store, &mut body)?;
    let text = body.to_string();
    let parent_coll = coll.parent.and_then(collection);
    let mut changes: Vec<Change<'_>> = parents
        .iter()
        .map(|(loc, n, b)| Change::Put(Put { kind: parent_coll.map_or("", |c| c.kind), project: &t.project, region: &t.region, parent: loc, name: n, body: b }))
        .collect();
    changes.push(Change::Put(Put { kind: coll.kind, project: &t.project, region: &t.region, parent: &t.parent, name: &name, body: &text }));
    for (p, n, b) in &rewrites {
        changes.push(Change::Put(Put { kind: coll.kind, project: &t.project, region: &t.region, parent: p, name: n, body: b }));
    }
    written(store, req, &changes, coll.create_lro, &body, now)
}

/// Write `changes` and answer with `body` as shown: as the response of a done operation
/// stored with them when the method is long-running (`lro`: its metadata's type), else as
/// it is.
fn written(store: &mut Store, req: &Request, changes: &[Change<'_>], lro: Option<&str>, body: &Value, now: Micros) -> Result<Value, ApiError> {
    let (t, coll) = (&req.target, req.target.coll);
    let out = shown(coll, body, req.ints);
    let Some(meta) = lro else {
        store.change_records(changes, now).map_err(write_err)?;
        return Ok(out);
    };
    let plain = shown(coll, body, false);
    let op = store
        .change_records_answered(changes, (&t.project, &t.region), now, |op| done_operation(&t.project, &t.region, op, meta, Some((coll.api, &plain)), now).to_string())
        .map_err(write_err)?;
    Ok(done_operation(&t.project, &t.region, op, meta, Some((coll.api, &out)), now))
}

/// GET of one record.
pub fn get(store: &Store, req: &Request) -> Result<Value, ApiError> {
    let name = req.target.name();
    let (_, v) = load(store, req.target.coll, &name)?;
    Ok(shown(req.target.coll, &v, req.ints))
}

/// A record as a filter sees it.
pub struct Seen<'a>(pub &'a Value);

impl Subject for Seen<'_> {
    fn json(&self) -> &Value {
        self.0
    }
    fn in_context(&self, context: &str) -> bool {
        self.0.get("__contexts").and_then(Value::as_array).is_some_and(|cs| cs.iter().any(|c| c == context))
    }
}

/// The filter of a list, parsed, or an error naming what is wrong.
pub fn parse_filter(text: Option<&str>) -> Result<Filter, ApiError> {
    filter::parse(text.unwrap_or("")).map_err(|e| ApiError::invalid_argument(format!("filter: {e}")))
}

/// The records of `coll` under `parent` that pass `f`, in the order they were made, from
/// `paging`: the page and the position of its last record when more follow.
pub fn matching(store: &Store, coll: &Collection, parent: &str, f: &Filter, paging: Paging) -> Result<(Vec<Value>, Option<i64>), ApiError> {
    const BATCH: usize = 512;
    let mut out = Vec::new();
    let mut after = paging.after;
    // The position of the page's last record.
    let mut last = paging.after;
    loop {
        let batch = store.records_narrowed(coll.kind, parent, f.narrow(), after, BATCH).map_err(read_err)?;
        let n = batch.len();
        for r in batch {
            after = r.seq;
            let v = body_of(&r)?;
            if f.matches(&Seen(&v)) {
                if out.len() == paging.size {
                    // One more passes: the page ends at the one before.
                    return Ok((out, Some(last)));
                }
                out.push(v);
                last = r.seq;
            }
        }
        if n < BATCH {
            return Ok((out, None));
        }
    }
}

/// GET of a collection: `{<segment>: [...], nextPageToken}`, the token made by `token`
/// from the position of the page's last record.
pub fn list(store: &Store, req: &Request, paging: Paging, token: impl FnOnce(i64) -> String) -> Result<Value, ApiError> {
    let t = &req.target;
    if req.param("orderBy").is_some_and(|o| !o.trim().is_empty()) {
        return Err(ApiError::invalid_argument(format!("orderBy: {}s are listed in the order they were made; another order is not offered.", t.coll.api)));
    }
    let f = parse_filter(req.param("filter"))?;
    let (items, next) = matching(store, t.coll, &t.parent, &f, paging)?;
    let mut out = Map::new();
    if !items.is_empty() {
        out.insert(t.coll.list_key.into(), Value::Array(items.iter().map(|v| shown(t.coll, v, req.ints)).collect()));
    }
    if let Some(seq) = next {
        out.insert("nextPageToken".into(), Value::String(token(seq)));
    }
    Ok(Value::Object(out))
}

/// The field mask of an update (`updateMask=a,b`).
pub fn mask(req: &Request) -> Vec<String> {
    req.param("updateMask").map(|m| m.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect()).unwrap_or_default()
}

/// PATCH of one record; with `allowMissing=true`, a record that does not exist is created.
pub fn update(store: &mut Store, req: &Request, now: Micros) -> Result<Value, ApiError> {
    let t = &req.target;
    let coll = t.coll;
    let name = t.name();
    if let Some(given) = req.body.get("name").and_then(Value::as_str) {
        if given != name && !given.is_empty() {
            return Err(ApiError::invalid_argument(format!("{}.name {given:?} is not the name in the URL ({name}).", coll.api)));
        }
    }
    let found = store.record(&name).map_err(read_err)?.filter(|r| r.kind == coll.kind);
    let Some(r) = found else {
        if req.param("allowMissing") == Some("true") {
            let id = t.id.clone().unwrap_or_default();
            if !valid_id(&id) {
                return Err(not_found(coll, &name));
            }
            let mut q = req.query.clone();
            q.push((coll.id_param.to_string(), id));
            let creq = Request { target: Target { id: None, verb: None, ..t.clone() }, query: q, body: req.body.clone(), ints: req.ints };
            return create(store, &creq, now, |_, _| Ok(Vec::new()));
        }
        return Err(not_found(coll, &name));
    };
    let old = body_of(&r)?;
    let new = updated(coll, &old, &req.body, &mask(req), now)?;
    let text = new.to_string();
    let changes = [Change::Put(Put { kind: coll.kind, project: &t.project, region: &t.region, parent: &t.parent, name: &name, body: &text })];
    written(store, req, &changes, coll.update_lro, &new, now)
}

/// DELETE of one record with everything under it (a store's contexts, a TensorBoard's
/// experiments, runs, time series and points), and `more` changes of the caller's (the
/// references others hold to it); answered with a done operation.
pub fn delete(store: &mut Store, req: &Request, now: Micros, more: &[Change<'_>]) -> Result<Value, ApiError> {
    let t = &req.target;
    let coll = t.coll;
    let name = t.name();
    if coll.delete == Delete::None {
        return Err(ApiError::unimplemented(format!("{}s cannot be deleted.", coll.api)));
    }
    let (_, old) = load(store, coll, &name)?;
    if let (Some(given), Some(have)) = (req.param("etag"), old.get("etag").and_then(Value::as_str)) {
        if given != have {
            return Err(ApiError::new(trainyard_api::Code::Aborted, format!("The {} {name} was changed since it was read (etag {given:?}, now {have:?}).", coll.api)));
        }
    }
    let mut changes = vec![Change::Delete(&name)];
    changes.extend(more.iter().cloned());
    let op = store
        .change_records_answered(&changes, (&t.project, &t.region), now, |op| {
            done_operation(&t.project, &t.region, op, "DeleteOperationMetadata", None, now).to_string()
        })
        .map_err(write_err)?;
    Ok(done_operation(&t.project, &t.region, op, "DeleteOperationMetadata", None, now))
}

/// 404 for a verb a resource or collection does not have.
pub fn no_verb(t: &Target, verb: &str) -> ApiError {
    let what = if t.id.is_some() { t.coll.api.to_string() } else { format!("{} collection", t.coll.api) };
    ApiError::not_found(format!("The {what} has no method \":{verb}\" (URL {}:{verb}).", t.name()))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde_json::json;

    pub fn store() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = Store::open(&dir.path().join("t.db")).expect("store");
        (dir, s)
    }

    pub fn req(path: &str, query: &[(&str, &str)], body: Value) -> Request {
        Request {
            target: super::super::target("p", "r", path).expect("target"),
            query: query.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            body,
            ints: false,
        }
    }

    /// The default store is made on first use; a second create of a name is
    /// ALREADY_EXISTS; a list pages through what passes its filter; a delete takes what is
    /// under the record.
    #[test]
    fn create_get_list_update_delete() {
        let (_d, mut s) = store();
        let base = "metadataStores/default/contexts";
        for i in 0..5 {
            let title = if i % 2 == 0 { "system.ExperimentRun" } else { "system.Experiment" };
            let id = format!("c{i}");
            create(&mut s, &req(base, &[("contextId", &id)], json!({"schemaTitle": title})), 10, |_, _| Ok(Vec::new())).unwrap();
        }
        assert!(load(&s, collection("metadataStores").unwrap(), "projects/p/locations/r/metadataStores/default").is_ok());
        let e = create(&mut s, &req(base, &[("contextId", "c1")], json!({})), 10, |_, _| Ok(Vec::new())).unwrap_err();
        assert_eq!(e.code, trainyard_api::Code::AlreadyExists);
        let e = create(&mut s, &req("metadataStores/other/contexts", &[], json!({})), 10, |_, _| Ok(Vec::new())).unwrap_err();
        assert!(e.message.contains("MetadataStore") && e.message.contains("other"), "{}", e.message);
        let q = [("filter", "schema_title=\"system.ExperimentRun\"")];
        let page = list(&s, &req(base, &q, Value::Null), Paging { after: 0, size: 2 }, |seq| seq.to_string()).unwrap();
        let names: Vec<&str> = page["contexts"].as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap()).collect();
        assert!(names[0].ends_with("/c0") && names[1].ends_with("/c2") && names.len() == 2);
        let after: i64 = page["nextPageToken"].as_str().unwrap().parse().unwrap();
        let rest = list(&s, &req(base, &q, Value::Null), Paging { after, size: 2 }, |seq| seq.to_string()).unwrap();
        assert_eq!(rest["contexts"].as_array().unwrap().len(), 1);
        assert!(rest.get("nextPageToken").is_none());
        let u = update(&mut s, &req(&format!("{base}/c0"), &[], json!({"displayName": "x", "etag": "1"})), 20).unwrap();
        assert_eq!(u["etag"], "2");
        let op = delete(&mut s, &req(&format!("{base}/c0"), &[], Value::Null), 30, &[]).unwrap();
        assert_eq!(op["done"], true);
        assert!(get(&s, &req(&format!("{base}/c0"), &[], Value::Null)).unwrap_err().message.contains("does not exist"));
        let created_by_patch = update(&mut s, &req(&format!("{base}/new"), &[("allowMissing", "true")], json!({"displayName": "n"})), 40).unwrap();
        assert_eq!(created_by_patch["displayName"], "n");
    }
}
