//! List methods of every resource kind: `pageSize`, `pageToken`, `filter` and `readMask`.

use std::sync::Arc;

use serde::Deserialize;
use serde_json::Value;
use trainyard_api::ApiError;

use crate::kinds::{Page, ResourceKind, View};
use crate::records::camel;
use super::common::{int_enums, json_response, ApiResult, AppState, Common};

const DEFAULT_PAGE: usize = 100;
const MAX_PAGE: usize = 1000;

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListQuery {
    #[serde(rename = "$alt")]
    alt: Option<String>,
    page_size: Option<String>,
    page_token: Option<String>,
    filter: Option<String>,
    read_mask: Option<String>,
}

/// One page of the list method of kind `K`: `pageSize`, a `pageToken` checked against its
/// query, the `filter` compiled to SQL, `readMask`; the rows are read and rendered by `K`.
pub(super) async fn page<K: ResourceKind>(state: &AppState, project: &str, region: &str, q: ListQuery) -> ApiResult {
    let ints = int_enums(&Common { alt: q.alt.clone() })?;
    let page_size = page_size(q.page_size.as_deref())?;
    let filter_text = q.filter.clone().unwrap_or_default();
    let compiled = trainyard_store::filter::compile(&filter_text, &STATE_NAMES, state.readers.dialect()).map_err(|e| ApiError::invalid_argument(e.to_string()))?;
    let mask = parse_read_mask(q.read_mask.as_deref().unwrap_or(""), K::API_NAME)?;
    let scope = format!("{}|{project}|{region}|{filter_text}", K::STORE_KIND);
    let before = match q.page_token.as_deref() {
        None | Some("") => None,
        Some(t) => Some(read_token(&state.token_key, &scope, t)?),
    };
    let (p, r) = (project.to_string(), region.to_string());
    let waiting = Arc::clone(&state.waiting);
    let rows = state
        .readers
        .with(move |s| {
            let filter = compiled.as_ref().map(|c| (c.sql.as_str(), c.params.as_slice()));
            K::read_page(s, &p, &r, &Page { filter, before, limit: page_size + 1 })
                .map_err(crate::reply::read_failed)?
                .iter()
                .filter(|row| crate::kinds::belongs(K::stored_place(row), &p, &r, K::API_NAME))
                .map(|row| Ok((K::id(row), K::render(row, &waiting, View::List)?)))
                .collect::<Result<Vec<(u64, Value)>, ApiError>>()
        })
        .await?;
    let more = rows.len() > page_size;
    let mut items = Vec::new();
    let mut last = None;
    for (id, mut v) in rows.into_iter().take(page_size) {
        if let Some(paths) = &mask {
            v = apply_read_mask(v, paths);
        }
        items.push(v);
        last = Some(id);
    }
    let mut resp = serde_json::Map::new();
    if !items.is_empty() {
        resp.insert(K::COLLECTION.into(), Value::Array(items));
    }
    if let (true, Some(last)) = (more, last) {
        resp.insert("nextPageToken".into(), Value::String(make_token(&state.token_key, &scope, last)));
    }
    json_response(Value::Object(resp), ints)
}

/// `pageSize`: 0 or absent for 100, at most 1000 (larger values are lowered).
pub(super) fn page_size(text: Option<&str>) -> Result<usize, ApiError> {
    match text {
        None => Ok(DEFAULT_PAGE),
        // `pageSize=` with no value is not an int32 (as the managed service answers it).
        Some(s) => match s.parse::<i32>() {
            Ok(n) if n < 0 => Err(ApiError::invalid_argument("pageSize must not be negative.")),
            Ok(0) => Ok(DEFAULT_PAGE),
            Ok(n) => Ok((n as usize).min(MAX_PAGE)),
            Err(_) => Err(ApiError::invalid_argument(format!("pageSize \"{s}\" is not a 32-bit integer."))),
        },
    }
}

/// An opaque page token: the position (the last id shown) and an HMAC-SHA256 over the
/// query it belongs to (kind, project, region, filter) with the server's key, so a token
/// that was altered or comes from another query is refused. Ids only grow, so jobs created
/// between pages do not move the position.
pub(super) fn make_token(key: &[u8], scope: &str, last_id: u64) -> String {
    format!("{last_id:x}.{}", hex(&token_mac(key, scope, last_id)))
}

fn token_mac(key: &[u8], scope: &str, last_id: u64) -> Vec<u8> {
    use hmac::Mac;
    let mut mac = <hmac::Hmac<sha2::Sha256> as Mac>::new_from_slice(key).unwrap_or_else(|_| {
        // HMAC takes keys of any length; this branch is unreachable.
        <hmac::Hmac<sha2::Sha256> as Mac>::new_from_slice(b"trainyard").expect("hmac key")
    });
    mac.update(scope.as_bytes());
    mac.update(&last_id.to_be_bytes());
    mac.finalize().into_bytes()[..16].to_vec()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

pub(super) fn read_token(key: &[u8], scope: &str, token: &str) -> Result<u64, ApiError> {
    let bad = || ApiError::invalid_argument("Invalid pageToken: it was altered or belongs to another query.");
    let (pos, mac) = token.split_once('.').ok_or_else(bad)?;
    let last = u64::from_str_radix(pos, 16).map_err(|_| bad())?;
    if hex(&token_mac(key, scope, last)) != mac {
        return Err(bad());
    }
    Ok(last)
}

/// Top-level field names of each resource (`CustomJob`, `HyperparameterTuningJob`), read
/// from the JSON schemas of the wire types, so that they follow the types and their serde
/// names.
static RESOURCE_FIELDS: std::sync::LazyLock<std::collections::BTreeMap<String, std::collections::BTreeSet<String>>> =
    std::sync::LazyLock::new(|| {
        trainyard_api::components::component_schemas()
            .into_iter()
            .filter_map(|(name, schema)| {
                let fields = schema.get("properties")?.as_object()?.keys().cloned().collect();
                Some((name, fields))
            })
            .collect()
    });

/// The paths of a `readMask` (camelCase or snake_case, dotted for nested), each split
/// into camelCase segments; an empty mask is None. A path whose first segment is not a
/// field of `resource` is refused (a field that is merely unset in a resource is fine).
fn parse_read_mask(mask: &str, resource: &str) -> Result<Option<Vec<Vec<String>>>, ApiError> {
    let known = RESOURCE_FIELDS.get(resource);
    let mut paths = Vec::new();
    for text in mask.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let path: Vec<String> = text.split('.').map(camel).collect();
        let first = path.first().map(String::as_str).unwrap_or("");
        if known.is_some_and(|fields| !fields.contains(first)) {
            return Err(ApiError::invalid_argument(format!("Invalid readMask: \"{text}\" is not a field of {resource}.")));
        }
        paths.push(path);
    }
    Ok((!paths.is_empty()).then_some(paths))
}

/// `readMask`: keep only the fields at `paths` (from [`parse_read_mask`]).
fn apply_read_mask(job: Value, paths: &[Vec<String>]) -> Value {
    let mut out = serde_json::Map::new();
    for path in paths {
        let mut src = &job;
        let mut ok = true;
        for seg in path {
            match src.get(seg) {
                Some(v) => src = v,
                None => {
                    ok = false;
                    break;
                }
            }
        }
        if !ok {
            continue;
        }
        insert_path(&mut out, path, src.clone());
    }
    Value::Object(out)
}

/// Put `value` at `path` in `obj`, creating the objects on the way.
fn insert_path(obj: &mut serde_json::Map<String, Value>, path: &[String], value: Value) {
    match path {
        [] => {}
        [last] => {
            obj.insert(last.clone(), value);
        }
        [first, rest @ ..] => {
            let entry = obj.entry(first.clone()).or_insert_with(|| Value::Object(serde_json::Map::new()));
            if let Value::Object(next) = entry {
                insert_path(next, rest, value);
            }
        }
    }
}

/// Job state names by number, for filters (`state = 3`).
static STATE_NAMES: std::sync::LazyLock<Vec<&'static str>> = std::sync::LazyLock::new(|| {
    let mut v: Vec<trainyard_api::JobState> = trainyard_api::JobState::ALL.to_vec();
    v.sort_by_key(|s| s.number());
    v.into_iter().map(|s| s.name()).collect()
});
