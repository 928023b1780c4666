//! Records: the resources that are documents rather than lifecycles, Vertex ML Metadata
//! (the ground Experiments stand on) and Vertex TensorBoard. Each is a JSON record of the
//! store's `records` table by resource name (`trainyard_store::records`); time series
//! points are the store's `points`.
//!
//! This module is pure: the collections ([`COLLECTIONS`]), resource paths ([`Target`]),
//! how a create or an update body becomes a record ([`created`], [`updated`]), how a
//! record is shown ([`shown`]) and the operations that answer long-running methods.
//! The verbs of each service are in [`metadata`] and [`tensorboard`]; `http::records`
//! routes the REST methods to them, reads on the API's read pool and writes through the
//! driver (the store's one writer) with [`crate::driver::Msg::Records`].
//!
//! A record's JSON is the resource as shown, with the server's own fields under keys that
//! start with `__` (never shown): `__contexts`, the contexts an artifact or execution is
//! attributed or associated to; `__events`, an execution's events.

pub mod dispatch;
pub mod events;
pub mod filter;
pub mod ingest;
pub mod metadata;
pub mod ops;
pub mod tensorboard;

use serde_json::{Map, Value};
use trainyard_api::{ApiError, Timestamp};
use trainyard_core::Micros;

/// The largest `metadata` of a context, artifact or execution, in bytes of JSON (as the
/// managed service: "should not exceed 200KB").
pub const MAX_METADATA: usize = 200 * 1024;

/// One collection of records.
#[derive(Debug)]
pub struct Collection {
    /// The path segment: `contexts`.
    pub segment: &'static str,
    /// The store's kind.
    pub kind: &'static str,
    /// The resource's name in the API: `Context`.
    pub api: &'static str,
    /// The field of a list's answer that holds the page (`contexts`, `tensorboardRuns`).
    pub list_key: &'static str,
    /// The query parameter of a create that names the id (`contextId`).
    pub id_param: &'static str,
    /// Whether the server chooses the id when the create names none (else it must).
    pub server_ids: bool,
    /// The segment of the parent collection; None: under the location.
    pub parent: Option<&'static str>,
    /// Fields a create or an update may set.
    pub fields: &'static [&'static str],
    /// Fields the server sets (taken and ignored in a body, as the service does).
    pub outputs: &'static [&'static str],
    /// Enum fields and their value names, by number.
    pub enums: &'static [(&'static str, &'static [&'static str])],
    /// `@type` of a create's operation metadata, when a create is long-running.
    pub create_lro: Option<&'static str>,
    /// `@type` of an update's operation metadata, when an update is long-running.
    pub update_lro: Option<&'static str>,
    /// Whether a delete answers with an operation (else with `{}`), and whether there is one.
    pub delete: Delete,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Delete {
    Operation,
    None,
}

const COMMON_OUT: &[&str] = &["name", "createTime", "updateTime"];
const ARTIFACT_STATES: &[&str] = &["STATE_UNSPECIFIED", "PENDING", "LIVE"];
const EXECUTION_STATES: &[&str] = &["STATE_UNSPECIFIED", "NEW", "RUNNING", "COMPLETE", "FAILED", "CACHED", "CANCELLED"];
const SCHEMA_TYPES: &[&str] = &["METADATA_SCHEMA_TYPE_UNSPECIFIED", "ARTIFACT_TYPE", "EXECUTION_TYPE", "CONTEXT_TYPE"];
const VALUE_TYPES: &[&str] = &["VALUE_TYPE_UNSPECIFIED", "SCALAR", "TENSOR", "BLOB_SEQUENCE"];

/// Every collection: Vertex ML Metadata, then TensorBoard.
pub const COLLECTIONS: &[Collection] = &[
    Collection {
        segment: "metadataStores",
        kind: "metadataStore",
        api: "MetadataStore",
        list_key: "metadataStores",
        id_param: "metadataStoreId",
        server_ids: true,
        parent: None,
        fields: &["description", "encryptionSpec", "dataplexConfig"],
        outputs: &["name", "createTime", "updateTime", "state"],
        enums: &[],
        create_lro: Some("CreateMetadataStoreOperationMetadata"),
        update_lro: None,
        delete: Delete::Operation,
    },
    Collection {
        segment: "contexts",
        kind: "context",
        api: "Context",
        list_key: "contexts",
        id_param: "contextId",
        server_ids: true,
        parent: Some("metadataStores"),
        fields: &["displayName", "etag", "labels", "schemaTitle", "schemaVersion", "metadata", "description"],
        outputs: &["name", "createTime", "updateTime", "parentContexts"],
        enums: &[],
        create_lro: None,
        update_lro: None,
        delete: Delete::Operation,
    },
    Collection {
        segment: "artifacts",
        kind: "artifact",
        api: "Artifact",
        list_key: "artifacts",
        id_param: "artifactId",
        server_ids: true,
        parent: Some("metadataStores"),
        fields: &["displayName", "uri", "etag", "labels", "state", "schemaTitle", "schemaVersion", "metadata", "description"],
        outputs: COMMON_OUT,
        enums: &[("state", ARTIFACT_STATES)],
        create_lro: None,
        update_lro: None,
        delete: Delete::Operation,
    },
    Collection {
        segment: "executions",
        kind: "execution",
        api: "Execution",
        list_key: "executions",
        id_param: "executionId",
        server_ids: true,
        parent: Some("metadataStores"),
        fields: &["displayName", "state", "etag", "labels", "schemaTitle", "schemaVersion", "metadata", "description"],
        outputs: COMMON_OUT,
        enums: &[("state", EXECUTION_STATES)],
        create_lro: None,
        update_lro: None,
        delete: Delete::Operation,
    },
    Collection {
        segment: "metadataSchemas",
        kind: "metadataSchema",
        api: "MetadataSchema",
        list_key: "metadataSchemas",
        id_param: "metadataSchemaId",
        server_ids: true,
        parent: Some("metadataStores"),
        fields: &["schemaVersion", "schema", "schemaType", "description"],
        outputs: &["name", "createTime"],
        enums: &[("schemaType", SCHEMA_TYPES)],
        create_lro: None,
        update_lro: None,
        delete: Delete::None,
    },
    Collection {
        segment: "tensorboards",
        kind: "tensorboard",
        api: "Tensorboard",
        list_key: "tensorboards",
        id_param: "tensorboardId",
        server_ids: true,
        parent: None,
        fields: &["displayName", "description", "encryptionSpec", "labels", "etag", "isDefault"],
        outputs: &["name", "createTime", "updateTime", "blobStoragePathPrefix", "runCount", "satisfiesPzs", "satisfiesPzi"],
        enums: &[],
        create_lro: Some("CreateTensorboardOperationMetadata"),
        update_lro: Some("UpdateTensorboardOperationMetadata"),
        delete: Delete::Operation,
    },
    Collection {
        segment: "experiments",
        kind: "tensorboardExperiment",
        api: "TensorboardExperiment",
        list_key: "tensorboardExperiments",
        id_param: "tensorboardExperimentId",
        server_ids: false,
        parent: Some("tensorboards"),
        fields: &["displayName", "description", "labels", "etag", "source"],
        outputs: COMMON_OUT,
        enums: &[],
        create_lro: None,
        update_lro: None,
        delete: Delete::Operation,
    },
    Collection {
        segment: "runs",
        kind: "tensorboardRun",
        api: "TensorboardRun",
        list_key: "tensorboardRuns",
        id_param: "tensorboardRunId",
        server_ids: false,
        parent: Some("experiments"),
        fields: &["displayName", "description", "labels", "etag"],
        outputs: COMMON_OUT,
        enums: &[],
        create_lro: None,
        update_lro: None,
        delete: Delete::Operation,
    },
    Collection {
        segment: "timeSeries",
        kind: "tensorboardTimeSeries",
        api: "TensorboardTimeSeries",
        list_key: "tensorboardTimeSeries",
        id_param: "tensorboardTimeSeriesId",
        server_ids: true,
        parent: Some("runs"),
        fields: &["displayName", "description", "valueType", "etag", "pluginName", "pluginData"],
        outputs: &["name", "createTime", "updateTime", "metadata"],
        enums: &[("valueType", VALUE_TYPES)],
        create_lro: None,
        update_lro: None,
        delete: Delete::Operation,
    },
];

/// The collection of this segment.
pub fn collection(segment: &str) -> Option<&'static Collection> {
    COLLECTIONS.iter().find(|c| c.segment == segment)
}

/// The collection of `segment`, one of [`COLLECTIONS`] (a name written in this module's
/// code, never one a client sent: those go through [`target`]).
pub(crate) fn coll(segment: &str) -> &'static Collection {
    collection(segment).unwrap_or(&COLLECTIONS[0])
}

/// The collection of a record's kind.
pub fn of_kind(kind: &str) -> Option<&'static Collection> {
    COLLECTIONS.iter().find(|c| c.kind == kind)
}

/// What a request's path names under `projects/{p}/locations/{r}/`.
#[derive(Clone, Debug)]
pub struct Target {
    pub project: String,
    pub region: String,
    /// The resource name of the parent of `coll` (the location for a top collection).
    pub parent: String,
    pub coll: &'static Collection,
    /// The resource's id; None for the collection.
    pub id: Option<String>,
    /// `:verb` after the last segment.
    pub verb: Option<String>,
}

impl Target {
    /// The resource name (of the collection when there is no id).
    pub fn name(&self) -> String {
        match &self.id {
            Some(id) => format!("{}/{}/{id}", self.parent, self.coll.segment),
            None => format!("{}/{}", self.parent, self.coll.segment),
        }
    }

    pub fn location(&self) -> String {
        format!("projects/{}/locations/{}", self.project, self.region)
    }
}

/// The target of `path` (`metadataStores/default/contexts/exp1:verb`), or 404 naming the
/// URL when it names no collection of these services.
pub fn target(project: &str, region: &str, path: &str) -> Result<Target, ApiError> {
    let unknown = || ApiError::not_found(format!("The requested URL /v1/projects/{project}/locations/{region}/{path} was not found on this server."));
    let (path, verb) = match path.rsplit_once(':') {
        Some((p, v)) if !p.contains(':') && !v.contains('/') => (p, Some(v.to_string())),
        Some(_) => return Err(unknown()),
        None => (path, None),
    };
    let segs: Vec<&str> = path.split('/').collect();
    let mut parent = format!("projects/{project}/locations/{region}");
    let mut above: Option<&'static str> = None;
    let mut i = 0;
    loop {
        let coll = collection(segs[i]).filter(|c| c.parent == above).ok_or_else(unknown)?;
        match segs.get(i + 1) {
            None => return Ok(Target { project: project.into(), region: region.into(), parent, coll, id: None, verb }),
            Some(&"") => return Err(unknown()),
            Some(id) if i + 2 == segs.len() => {
                return Ok(Target { project: project.into(), region: region.into(), parent, coll, id: Some((*id).to_string()), verb })
            }
            Some(id) => {
                parent = format!("{parent}/{}/{id}", coll.segment);
                above = Some(coll.segment);
                i += 2;
            }
        }
    }
}

/// Is `id` one a client may choose: `[a-z0-9][a-z0-9-]{0,127}` (the managed service's
/// rule for these ids)?
pub fn valid_id(id: &str) -> bool {
    let b = id.as_bytes();
    !b.is_empty() && b.len() <= 128 && (b[0].is_ascii_lowercase() || b[0].is_ascii_digit()) && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
}

/// The resource name `name` split into its target (the parent and the collection), when
/// it is a name of collection `coll` under `project` and `region`.
pub fn target_of_name(project: &str, region: &str, name: &str, coll: &'static Collection) -> Option<Target> {
    let rest = name.strip_prefix(&format!("projects/{project}/locations/{region}/"))?;
    let t = target(project, region, rest).ok()?;
    (std::ptr::eq(t.coll, coll) && t.id.is_some() && t.verb.is_none()).then_some(t)
}

fn time_text(micros: Micros) -> String {
    Timestamp::from_micros(micros).to_string()
}

/// An enum value of a body (a name or its number) as its name, or an error naming the
/// field.
fn enum_name(coll: &Collection, field: &str, names: &[&str], v: &Value) -> Result<Value, ApiError> {
    let bad = || ApiError::invalid_argument(format!("Invalid value at '{}.{field}': {v} is not one of {}.", lower_first(coll.api), names.join(", ")));
    match v {
        Value::String(s) if names.contains(&s.as_str()) => Ok(v.clone()),
        Value::Number(n) => n.as_u64().and_then(|i| names.get(i as usize)).map(|s| Value::String((*s).into())).ok_or_else(bad),
        _ => Err(bad()),
    }
}

fn lower_first(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_lowercase().chain(c).collect(),
        None => String::new(),
    }
}

/// The writable fields of `body` for `coll`, checked: an unknown field is an error naming
/// it (as the service's JSON parser answers), output fields are dropped, enums become
/// their names, and `metadata` must be an object within [`MAX_METADATA`].
pub fn fields_of(coll: &Collection, body: &Value) -> Result<Map<String, Value>, ApiError> {
    let what = lower_first(coll.api);
    let Value::Object(map) = body else {
        return Err(ApiError::invalid_argument(format!("Invalid JSON payload received: the {what} must be an object.")));
    };
    let mut out = Map::new();
    for (k, v) in map {
        if coll.outputs.contains(&k.as_str()) {
            continue;
        }
        if !coll.fields.contains(&k.as_str()) {
            return Err(ApiError::invalid_argument(format!(
                "Invalid JSON payload received. Unknown name \"{k}\" at '{what}': Cannot find field. ({} takes {}.)",
                coll.api,
                coll.fields.join(", ")
            )));
        }
        let v = match coll.enums.iter().find(|(f, _)| f == k) {
            Some((f, names)) => enum_name(coll, f, names, v)?,
            None => v.clone(),
        };
        match k.as_str() {
            "metadata" | "labels" | "pluginData" if k != "pluginData" && !v.is_object() && !v.is_null() => {
                return Err(ApiError::invalid_argument(format!("Invalid value at '{what}.{k}': it must be an object.")));
            }
            "metadata" if v.to_string().len() > MAX_METADATA => {
                return Err(ApiError::invalid_argument(format!(
                    "{what}.metadata is {} bytes; at most {MAX_METADATA} are taken.",
                    v.to_string().len()
                )));
            }
            "labels" => check_labels(&what, &v)?,
            "displayName" | "description" | "schemaTitle" | "schemaVersion" | "uri" | "etag" | "pluginName" | "source" | "schema" if !v.is_string() && !v.is_null() => {
                return Err(ApiError::invalid_argument(format!("Invalid value at '{what}.{k}': it must be a string.")));
            }
            "displayName" if v.as_str().is_some_and(|s| s.len() > 128) => {
                return Err(ApiError::invalid_argument(format!("{what}.display_name is longer than 128 characters.")));
            }
            _ => {}
        }
        if !v.is_null() {
            out.insert(k.clone(), v);
        }
    }
    Ok(out)
}

fn check_labels(what: &str, v: &Value) -> Result<(), ApiError> {
    let Some(map) = v.as_object() else { return Ok(()) };
    if map.len() > 64 {
        return Err(ApiError::invalid_argument(format!("{what}.labels has {} labels; at most 64 are taken.", map.len())));
    }
    for (k, val) in map {
        if !val.is_string() || k.is_empty() || k.len() > 63 || val.as_str().is_some_and(|s| s.len() > 63) {
            return Err(ApiError::invalid_argument(format!("{what}.labels: the label {k:?} is not a key and a value of at most 63 characters.")));
        }
    }
    Ok(())
}

/// A new record's JSON: its checked fields, its name, times and first etag.
pub fn created(coll: &Collection, name: &str, body: &Value, now: Micros) -> Result<Value, ApiError> {
    let mut out = fields_of(coll, body)?;
    if coll.segment == "metadataSchemas" {
        for f in ["schemaVersion", "schema"] {
            if out.get(f).and_then(Value::as_str).is_none_or(str::is_empty) {
                return Err(ApiError::invalid_argument(format!("metadata_schema.{f} is required.")));
            }
        }
    }
    if coll.segment == "timeSeries" && out.get("displayName").and_then(Value::as_str).is_none_or(str::is_empty) {
        return Err(ApiError::invalid_argument("tensorboard_time_series.display_name is required."));
    }
    if coll.segment == "timeSeries" && out.get("valueType").is_none_or(|v| v == "VALUE_TYPE_UNSPECIFIED") {
        return Err(ApiError::invalid_argument("tensorboard_time_series.value_type is required: SCALAR, TENSOR or BLOB_SEQUENCE."));
    }
    if coll.segment == "tensorboards" && out.get("displayName").and_then(Value::as_str).is_none_or(str::is_empty) {
        return Err(ApiError::invalid_argument("tensorboard.display_name is required."));
    }
    out.insert("name".into(), Value::String(name.into()));
    out.insert("createTime".into(), Value::String(time_text(now)));
    if coll.outputs.contains(&"updateTime") {
        out.insert("updateTime".into(), Value::String(time_text(now)));
    }
    if coll.fields.contains(&"etag") {
        out.insert("etag".into(), Value::String("1".into()));
    }
    Ok(Value::Object(out))
}

/// A record updated by `body`: the fields `mask` names (snake or camel case; all writable
/// fields when it is empty: an update carries the whole resource), a new etag and time.
/// An `etag` in the body that is not the record's is ABORTED, changing nothing.
pub fn updated(coll: &Collection, old: &Value, body: &Value, mask: &[String], now: Micros) -> Result<Value, ApiError> {
    let what = lower_first(coll.api);
    let new = fields_of(coll, body)?;
    if let (Some(given), Some(have)) = (new.get("etag").and_then(Value::as_str), old.get("etag").and_then(Value::as_str)) {
        if given != have {
            return Err(ApiError::new(
                trainyard_api::Code::Aborted,
                format!("The {what} {} was changed since it was read (etag {given:?}, now {have:?}); read it again.", old["name"].as_str().unwrap_or("")),
            ));
        }
    }
    let mut out = old.as_object().cloned().unwrap_or_default();
    let paths: Vec<String> = if mask.is_empty() {
        coll.fields.iter().map(|f| f.to_string()).collect()
    } else {
        let mut ps = Vec::new();
        for m in mask {
            let camel = camel(m);
            if !coll.fields.contains(&camel.as_str()) || camel == "etag" {
                return Err(ApiError::invalid_argument(format!("update_mask: {m:?} is not a field of {} that an update may set.", coll.api)));
            }
            ps.push(camel);
        }
        ps
    };
    for p in paths {
        if p == "etag" {
            continue;
        }
        match new.get(&p) {
            Some(v) => out.insert(p, v.clone()),
            None => out.remove(&p),
        };
    }
    if coll.outputs.contains(&"updateTime") {
        out.insert("updateTime".into(), Value::String(time_text(now)));
    }
    if coll.fields.contains(&"etag") {
        let n = old.get("etag").and_then(Value::as_str).and_then(|e| e.parse::<u64>().ok()).unwrap_or(0);
        out.insert("etag".into(), Value::String((n + 1).to_string()));
    }
    Ok(Value::Object(out))
}

/// snake_case to camelCase.
pub fn camel(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut up = false;
    for ch in s.chars() {
        if ch == '_' {
            up = true;
        } else if up {
            out.extend(ch.to_uppercase());
            up = false;
        } else {
            out.push(ch);
        }
    }
    out
}

/// A record as the API shows it: without the server's own fields, enums as numbers when
/// the client asked for them (`$alt=json;enum-encoding=int`).
pub fn shown(coll: &Collection, body: &Value, ints: bool) -> Value {
    let mut v = body.clone();
    if let Value::Object(map) = &mut v {
        map.retain(|k, _| !k.starts_with("__"));
        if ints {
            for (field, names) in coll.enums {
                if let Some(slot) = map.get_mut(*field) {
                    if let Some(i) = slot.as_str().and_then(|s| names.iter().position(|n| *n == s)) {
                        *slot = Value::from(i as u64);
                    }
                }
            }
        }
    }
    v
}

/// A done operation named under the location, answering with `response` (a resource
/// with its `@type`, or Empty).
pub fn done_operation(project: &str, region: &str, id: u64, metadata_type: &str, response: Option<(&str, &Value)>, now: Micros) -> Value {
    let t = time_text(now);
    let response = match response {
        Some((api, v)) => {
            let mut r = v.clone();
            if let Value::Object(m) = &mut r {
                m.insert("@type".into(), Value::String(format!("type.googleapis.com/google.cloud.aiplatform.v1.{api}")));
            }
            r
        }
        None => serde_json::json!({"@type": trainyard_api::operation::EMPTY_TYPE}),
    };
    serde_json::json!({
        "name": format!("projects/{project}/locations/{region}/operations/{id}"),
        "metadata": {
            "@type": format!("type.googleapis.com/google.cloud.aiplatform.v1.{metadata_type}"),
            "genericMetadata": {"createTime": t, "updateTime": t},
        },
        "done": true,
        "response": response,
    })
}

/// The record's JSON, or an internal error naming the damaged record.
pub fn body_of(r: &trainyard_store::records::Record) -> Result<Value, ApiError> {
    serde_json::from_str(&r.body).map_err(|e| ApiError::internal(format!("the stored record of {} is damaged and cannot be read: {e}", r.name)))
}

/// 404 naming the resource.
pub fn not_found(coll: &Collection, name: &str) -> ApiError {
    ApiError::not_found(format!("The {} \"{name}\" does not exist.", coll.api))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Paths name collections in their places only; a verb is split off.
    #[test]
    fn targets() {
        let t = target("p", "r", "metadataStores/default/contexts/exp1:addContextChildren").unwrap();
        assert_eq!((t.coll.segment, t.id.as_deref(), t.verb.as_deref()), ("contexts", Some("exp1"), Some("addContextChildren")));
        assert_eq!(t.name(), "projects/p/locations/r/metadataStores/default/contexts/exp1");
        let t = target("p", "r", "tensorboards/7/experiments/e/runs/r1/timeSeries").unwrap();
        assert_eq!((t.coll.segment, t.parent.as_str()), ("timeSeries", "projects/p/locations/r/tensorboards/7/experiments/e/runs/r1"));
        let t = target("p", "r", "metadataStores/default/contexts:purge").unwrap();
        assert_eq!((t.id, t.verb.as_deref()), (None, Some("purge")));
        for bad in ["metadataStores/default/runs/x", "contexts/x", "tensorboards/7/contexts", "metadataStores//contexts", "metadataStores/a:b/contexts/c:d"] {
            assert!(target("p", "r", bad).is_err(), "{bad}");
        }
        assert!(target_of_name("p", "r", "projects/p/locations/r/metadataStores/default/artifacts/a", collection("artifacts").unwrap()).is_some());
        assert!(target_of_name("q", "r", "projects/p/locations/r/metadataStores/default/artifacts/a", collection("artifacts").unwrap()).is_none());
        assert!(target_of_name("p", "r", "projects/p/locations/r/metadataStores/default/contexts/a", collection("artifacts").unwrap()).is_none());
        assert!(valid_id("exp1-run-1") && !valid_id("Exp") && !valid_id("-a") && !valid_id(&"a".repeat(129)));
    }

    /// A create keeps writable fields, drops output ones, names an unknown one, turns
    /// enum numbers into names; an update takes the whole resource or its mask, checks
    /// the etag, and counts it up.
    #[test]
    fn create_and_update() {
        let c = collection("artifacts").unwrap();
        let v = created(c, "n", &json!({"state": 2, "createTime": "x", "schemaTitle": "system.Artifact", "metadata": {"a": 1}}), 1_000_000).unwrap();
        assert_eq!((v["state"].as_str(), v["etag"].as_str(), v["createTime"].as_str()), (Some("LIVE"), Some("1"), Some("1970-01-01T00:00:01Z")));
        assert_eq!(shown(c, &v, true)["state"], 2);
        let e = created(c, "n", &json!({"nope": 1}), 0).unwrap_err();
        assert!(e.message.contains("Unknown name \"nope\" at 'artifact'"), "{}", e.message);
        let e = created(c, "n", &json!({"state": 9}), 0).unwrap_err();
        assert!(e.message.contains("artifact.state"), "{}", e.message);
        let e = created(c, "n", &json!({"metadata": {"x": "y".repeat(MAX_METADATA)}}), 0).unwrap_err();
        assert!(e.message.contains("metadata") && e.message.contains("at most"), "{}", e.message);
        let u = updated(c, &v, &json!({"etag": "1", "displayName": "d", "metadata": {"b": 2}}), &[], 2_000_000).unwrap();
        assert_eq!((u["etag"].as_str(), u["displayName"].as_str(), u.get("schemaTitle")), (Some("2"), Some("d"), None));
        let u2 = updated(c, &u, &json!({"description": "x"}), &["description".into()], 3_000_000).unwrap();
        assert_eq!((u2["displayName"].as_str(), u2["description"].as_str()), (Some("d"), Some("x")));
        let e = updated(c, &u, &json!({"etag": "1"}), &[], 0).unwrap_err();
        assert_eq!(e.code, trainyard_api::Code::Aborted);
        assert!(updated(c, &u, &json!({}), &["name".into()], 0).is_err());
        let hidden = json!({"name": "n", "__contexts": ["c"]});
        assert!(shown(c, &hidden, false).get("__contexts").is_none());
    }
}
