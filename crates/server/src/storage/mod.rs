//! A Cloud Storage JSON API endpoint on the API's listener, over the same files jobs see:
//! `gs://BUCKET/NAME` of project P is `<storage_root>/P/BUCKET/NAME`.
//!
//! - Buckets: `GET/DELETE /storage/v1/b/{bucket}`, `POST /storage/v1/b?project=P`
//!   (create), `GET /storage/v1/b?project=P` (list).
//! - Objects: `GET /storage/v1/b/{bucket}/o` (list: `prefix`, `delimiter`, `maxResults`,
//!   `pageToken`, `startOffset`, `endOffset`), `GET /storage/v1/b/{bucket}/o/{object}`
//!   (metadata; `alt=media`: the bytes), `GET /download/storage/v1/b/{bucket}/o/{object}`,
//!   `DELETE /storage/v1/b/{bucket}/o/{object}`; downloads take `Range: bytes=...`.
//! - Uploads: `POST /upload/storage/v1/b/{bucket}/o?uploadType=media|multipart|resumable`;
//!   a resumable session is `PUT` (chunks, `Content-Range`) and `DELETE` (cancel) on the
//!   session URI the start answered in `Location`.
//!
//! A write is atomic: the body streams into a temporary file of the project's
//! `.trainyard-uploads/` (constant memory), is checked against the checksums the client
//! sent, gets its metadata (extended attribute `user.trainyard.gcs`), is synced and then
//! renamed into place. Nothing is read or written through a symbolic link ([`fsops`]).
//! The CRC32C is computed as the bytes come; the MD5 too when the client sent one, else
//! after the commit, in the background ([`md5bg`]).
//!
//! Which project a bucket is: `[storage.buckets]` of the config; else, with a token, the
//! token's project whose namespace has the bucket; in open mode `[storage]
//! default_project`, else the only namespace that has it. See [`Storage::project_for`].

pub mod error;
mod fsops;
mod list;
mod md5bg;
mod meta;
mod multipart;
mod names;
mod upload;
pub mod usage;

use crate::shares::Share;
use std::collections::{BTreeMap, HashMap};
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, BodyDataStream, Bytes};
use axum::http::request::Parts;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use futures_util::StreamExt;
use serde::Deserialize;
use serde_json::{json, Value};
use trainyard_backend::RunAs;

use error::{GcsError, GcsResult};
use fsops::{Ns, Preconditions, TempFile};
use meta::{Expected, Hashes, StoredMeta, UploadMeta};
use names::{check_bucket, check_object, int_param, query, shown};
use upload::{ChunkRange, HashSink, SessionFile, Writer};

/// `[storage]` of the config file.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StorageFile {
    /// The project of buckets not in `buckets`, in open mode (no tokens file).
    pub default_project: Option<String>,
    /// Largest object, in bytes (default 5 TiB, the service's limit).
    pub max_object_bytes: Option<u64>,
    /// A resumable upload not touched for this long is removed (default one week).
    pub upload_expiry_secs: Option<u64>,
    /// `BUCKET = "project"`: the project of a bucket, whatever else holds.
    #[serde(default)]
    pub buckets: BTreeMap<String, String>,
}

impl StorageFile {
    /// The key at fault and why.
    pub fn check(&self) -> Result<(), (String, String)> {
        if let Some(p) = &self.default_project {
            if let Some(why) = names::project_problem(p) {
                return Err(("storage.default_project".into(), format!("{p:?} {why}")));
            }
        }
        if self.max_object_bytes == Some(0) {
            return Err(("storage.max_object_bytes".into(), "must be at least 1".into()));
        }
        if self.upload_expiry_secs == Some(0) {
            return Err(("storage.upload_expiry_secs".into(), "must be at least 1".into()));
        }
        for (b, p) in &self.buckets {
            if let Some(why) = names::bucket_problem(b) {
                return Err((format!("storage.buckets.{b}"), format!("{b:?} is not a bucket name: it {why}")));
            }
            if let Some(why) = names::project_problem(p) {
                return Err((format!("storage.buckets.{b}"), format!("project {p:?} {why}")));
            }
        }
        Ok(())
    }
}

/// `[storage]`, resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StorageConfig {
    pub default_project: Option<String>,
    pub max_object_bytes: u64,
    pub upload_expiry: Duration,
    pub buckets: BTreeMap<String, String>,
}

/// 5 TiB, the largest object of the service.
pub const DEFAULT_MAX_OBJECT_BYTES: u64 = 5 << 40;

impl Default for StorageConfig {
    fn default() -> Self {
        StorageConfig {
            default_project: None,
            max_object_bytes: DEFAULT_MAX_OBJECT_BYTES,
            // Hours, not the service's week: an open session's bytes hold its project's storage.
            upload_expiry: Duration::from_secs(6 * 3600),
            buckets: BTreeMap::new(),
        }
    }
}

impl StorageConfig {
    pub fn from_file(f: Option<&StorageFile>) -> StorageConfig {
        let d = StorageConfig::default();
        match f {
            None => d,
            Some(f) => StorageConfig {
                default_project: f.default_project.clone(),
                max_object_bytes: f.max_object_bytes.unwrap_or(d.max_object_bytes),
                upload_expiry: f.upload_expiry_secs.map(Duration::from_secs).unwrap_or(d.upload_expiry),
                buckets: f.buckets.clone(),
            },
        }
    }
}

/// Where object uploads are (`/upload/storage/v1/b/B/o`).
pub const UPLOAD_PREFIX: &str = "/upload/storage/";

/// The endpoint's state.
pub struct Storage {
    root: PathBuf,
    cfg: StorageConfig,
    region: String,
    tokens: Option<Arc<crate::auth::TokenStore>>,
    /// Per-project users: new files and directories are the project's uid's.
    uid_range: Option<(u32, u32)>,
    store: trainyard_store::Location,
    uids: Mutex<HashMap<String, u32>>,
    sessions: upload::Sessions,
    sweeps: upload::Sweeps,
    /// Uploads and downloads streaming at once (each has a thread or two and a few
    /// buffers); more wait for a slot.
    transfers: Arc<tokio::sync::Semaphore>,
    /// MD5s of objects committed without one.
    md5: md5bg::Md5Worker,
    /// Per-project storage limits and sizes (`storage_gb`).
    usage: Arc<usage::StorageUsage>,
    /// Each project's share of the transfers (`limits.max_storage_streams_per_project`).
    shares: Arc<crate::shares::Shares>,
}

pub use upload::TransferSlot;

/// Transfers streaming at once, at most.
pub const MAX_TRANSFERS: usize = 64;

impl Storage {
    pub fn new(
        cfg: &crate::Config,
        tokens: Option<Arc<crate::auth::TokenStore>>,
        usage: Arc<usage::StorageUsage>,
        shares: Arc<crate::shares::Shares>,
    ) -> Storage {
        let per_project = cfg.replicas.uid_range.filter(|_| nix::unistd::geteuid().is_root());
        Storage {
            root: cfg.storage_root.clone(),
            cfg: cfg.storage.clone(),
            region: cfg.region.to_ascii_uppercase(),
            tokens,
            uid_range: per_project,
            store: cfg.store_location(),
            uids: Mutex::new(HashMap::new()),
            sessions: Default::default(),
            sweeps: Default::default(),
            transfers: Arc::new(tokio::sync::Semaphore::new(MAX_TRANSFERS)),
            md5: md5bg::Md5Worker::new(cfg.storage_root.clone()),
            usage,
            shares,
        }
    }

    /// The region, as requests name it.
    pub fn region_name(&self) -> String {
        self.region.to_ascii_lowercase()
    }

    /// The projects' storage sizes and limits (`GET /v1/admin/quotas`).
    pub async fn usage_report(&self) -> Vec<(String, u64, Option<u64>)> {
        let usage = Arc::clone(&self.usage);
        tokio::task::spawn_blocking(move || usage.report()).await.unwrap_or_default()
    }

    /// One of `project`'s storage streams (429 naming `limits.max_storage_streams_per_project`
    /// when it has them all), then one of the server's (waited for).
    async fn transfer_slot(&self, project: &str) -> GcsResult<TransferSlot> {
        let mine = self.shares.take(Share::StorageStreams, project).map_err(|o| GcsError::from(o.api_error()))?;
        let server = Arc::clone(&self.transfers)
            .acquire_owned()
            .await
            .map_err(|_| GcsError::new(503, "backendError", "The server is shutting down."))?;
        Ok(TransferSlot { _project: mine, _server: server })
    }

    fn auth<'a>(&self, headers: &'a HeaderMap) -> Option<&'a str> {
        headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok())
    }

    /// The project of `bucket` for this request, checked against its token: the
    /// config's `[storage.buckets]`; with tokens, the token's project whose namespace has
    /// the bucket (several: `default_project` among them, else 400), 403 when the token
    /// may only read it; in open mode `default_project`, else the only namespace that
    /// has it (several: 400). 404 when no namespace has it, and also when only projects
    /// the token may not read have it: the same answer for "not yours" and "not there",
    /// so that a name tells nothing of other projects' buckets.
    pub async fn project_for(&self, headers: &HeaderMap, uri: &axum::http::Uri, bucket: &str, write: bool) -> GcsResult<String> {
        check_bucket(bucket)?;
        let auth = self.auth(headers);
        let tokens = self.tokens.as_ref().map(|t| t.current());
        if let Some(t) = &tokens {
            if t.holder(auth).is_none() {
                return Err(t.check(auth, "", write).err().map(GcsError::from).unwrap_or_else(|| GcsError::new(401, "required", "Unauthenticated.")));
            }
        }
        let no_bucket = || GcsError::not_found(format!("The specified bucket {bucket:?} does not exist."));
        if let Some(p) = self.cfg.buckets.get(bucket) {
            if let Some(t) = &tokens {
                if t.check(auth, p, false).is_err() {
                    return Err(no_bucket());
                }
                t.check(auth, p, write).map_err(|e| self.refused(bucket, e))?;
            }
            return Ok(p.clone());
        }
        if tokens.is_none() {
            if let Some(p) = &self.cfg.default_project {
                return Ok(p.clone());
            }
        }
        let root = self.root.clone();
        let b = bucket.to_string();
        let have = blocking(move || fsops::projects_with_bucket(&root, &b)).await?;
        match &tokens {
            None => match have.as_slice() {
                [] => Err(no_bucket()),
                [p] => Ok(p.clone()),
                several => match caller_project(uri).filter(|c| several.contains(c)) {
                    Some(c) => Ok(c),
                    None => Err(ambiguous(bucket, several)),
                },
            },
            Some(t) => {
                let usable: Vec<&String> = have.iter().filter(|p| t.check(auth, p, write).is_ok()).collect();
                match usable.as_slice() {
                    [p] => Ok((*p).clone()),
                    [] if have.is_empty() => Err(no_bucket()),
                    [] => {
                        let readable = have.iter().find(|p| t.check(auth, p, false).is_ok());
                        match readable {
                            Some(p) if write => Err(self.refused(bucket, t.check(auth, p, true).err().unwrap_or_else(|| {
                                trainyard_api::ApiError::permission_denied("The token may only read this bucket.")
                            }))),
                            _ => Err(no_bucket()),
                        }
                    }
                    several => match (caller_project(uri).filter(|c| several.contains(&c)), &self.cfg.default_project) {
                        (Some(c), _) => Ok(c),
                        (None, Some(d)) if several.contains(&d) => Ok(d.clone()),
                        _ => Err(ambiguous(bucket, &several.iter().map(|p| (*p).clone()).collect::<Vec<_>>())),
                    },
                }
            }
        }
    }

    fn refused(&self, bucket: &str, e: trainyard_api::ApiError) -> GcsError {
        let mut g = GcsError::from(e);
        if g.code == 403 {
            g.message = format!("{} (bucket {bucket:?})", g.message);
        }
        g
    }

    /// The project of a new bucket: the config's mapping, the `project` parameter, the
    /// token's only project, or (open mode) `default_project`.
    fn project_for_new(&self, headers: &HeaderMap, bucket: &str, param: Option<&String>) -> GcsResult<String> {
        let auth = self.auth(headers);
        let tokens = self.tokens.as_ref().map(|t| t.current());
        let p = if let Some(m) = self.cfg.buckets.get(bucket) {
            if param.is_some_and(|p| p != m) {
                return Err(GcsError::invalid(format!(
                    "Bucket {bucket:?} belongs to project {m:?} ([storage.buckets] of the server's config), not {:?}.",
                    shown(param.map(String::as_str).unwrap_or(""))
                )));
            }
            m.clone()
        } else if let Some(p) = param.filter(|p| !p.is_empty()) {
            p.clone()
        } else if let Some(t) = &tokens {
            match t.projects_of(auth).as_deref() {
                Some([only]) if only != "*" => only.clone(),
                _ => return Err(GcsError::invalid("Name the bucket's project: ?project=PROJECT (the token is for several projects).")),
            }
        } else if let Some(d) = &self.cfg.default_project {
            d.clone()
        } else {
            return Err(GcsError::invalid("Name the bucket's project: ?project=PROJECT."));
        };
        if let Some(why) = names::project_problem(&p) {
            return Err(GcsError::invalid(format!("Project {:?} {why}.", shown(&p))));
        }
        if let Some(t) = &tokens {
            t.check(auth, &p, true).map_err(|e| self.refused(bucket, e))?;
        }
        Ok(p)
    }

    /// The owner of what the server creates in `project`'s namespace: with per-project
    /// users, the project's uid (assigned here if the project never ran a job, as its
    /// first launch would); else None (the server's user).
    async fn owner(&self, project: &str) -> GcsResult<Option<RunAs>> {
        let Some((first, last)) = self.uid_range else { return Ok(None) };
        if let Some(uid) = self.uids.lock().unwrap_or_else(|p| p.into_inner()).get(project) {
            return Ok(Some(RunAs { uid: *uid, gid: *uid }));
        }
        let db = self.store.clone();
        let p = project.to_string();
        let uid = tokio::task::spawn_blocking(move || -> Result<Option<u32>, String> {
            let mut last_err = String::new();
            for _ in 0..3 {
                match trainyard_store::Store::connect(&db).and_then(|mut s| s.project_uid(&p, first, last)) {
                    Ok(u) => return Ok(u),
                    Err(e) => last_err = e.to_string(),
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(last_err)
        })
        .await
        .map_err(|e| GcsError::internal("cannot find the project's user", e))?
        .map_err(|e| GcsError::internal("cannot find the project's user", e))?;
        let Some(uid) = uid else {
            return Err(GcsError::new(
                503,
                "backendError",
                format!("No uid is left for project {project:?} in [replicas] uid_range ({first}-{last})."),
            ));
        };
        self.uids.lock().unwrap_or_else(|p| p.into_inner()).insert(project.to_string(), uid);
        Ok(Some(RunAs { uid, gid: uid }))
    }

    /// Remove abandoned uploads of the namespace, now and then (in the background).
    fn maybe_sweep(self: &Arc<Self>, project: &str) {
        let every = self.cfg.upload_expiry.min(Duration::from_secs(600));
        if !self.sweeps.due(project, every) {
            return;
        }
        let me = Arc::clone(self);
        let p = project.to_string();
        tokio::task::spawn_blocking(move || {
            if let Ok(Some(ns)) = Ns::open(&me.root, &p, false, None) {
                if let Ok(up) = ns.uploads() {
                    let release = |id: &str| me.usage.release(&p, &usage::session_reservation(id));
                    let n = upload::sweep(up, &p, me.cfg.upload_expiry, &me.sessions, &release);
                    if n > 0 {
                        tracing::info!("storage: removed {n} abandoned uploads of project {p:?}");
                    }
                }
            }
        });
    }
}

fn ambiguous(bucket: &str, projects: &[String]) -> GcsError {
    GcsError::invalid(format!(
        "Bucket {bucket:?} exists in several projects ({}): name the caller's project (?userProject=PROJECT, as the \
         client's user_project does), map it in the server's config ([storage.buckets] {bucket} = \"PROJECT\") or set \
         [storage] default_project.",
        projects.join(", ")
    ))
}

/// The project the request names as its caller's: `userProject` (the clients' billing
/// project) or `project`.
fn caller_project(uri: &axum::http::Uri) -> Option<String> {
    let mut q = query(uri.query()).ok()?;
    ["userProject", "project"].iter().find_map(|key| q.remove(*key).filter(|v| !v.is_empty()))
}

/// Run blocking file work off the executor.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> GcsResult<T> + Send + 'static) -> GcsResult<T> {
    tokio::task::spawn_blocking(f).await.map_err(|e| GcsError::internal("a file operation failed", e))?
}

/// The routes, for `http::router` (outside the API's body limit: uploads are large).
pub fn routes<S: Clone + Send + Sync + 'static>(storage: Arc<Storage>) -> Router<S> {
    Router::new()
        .route("/storage/v1/b", get(list_buckets).post(create_bucket))
        .route("/storage/v1/b/{bucket}", get(get_bucket).delete(delete_bucket))
        .route("/storage/v1/b/{bucket}/iam", get(get_bucket_iam).put(set_bucket_iam))
        .route("/storage/v1/b/{bucket}/o", get(list_objects))
        .route("/storage/v1/b/{bucket}/o/{*object}", get(get_object).delete(delete_object))
        .route("/download/storage/v1/b/{bucket}/o/{*object}", get(download_object))
        .route("/upload/storage/v1/b/{bucket}/o", axum::routing::post(upload).put(resumable_put).delete(resumable_cancel))
        .with_state(storage)
}

type St = State<Arc<Storage>>;

fn respond(r: GcsResult<Response>) -> Response {
    r.unwrap_or_else(IntoResponse::into_response)
}

fn json_ok(v: Value) -> Response {
    (StatusCode::OK, [(header::CONTENT_TYPE, "application/json; charset=UTF-8")], v.to_string()).into_response()
}

use crate::reply::base_url;

/// The bucket of `<prefix>/b/{bucket}[/...]`.
fn bucket_of(path: &str, prefix: &str) -> GcsResult<String> {
    let rest = path.strip_prefix(prefix).and_then(|r| r.strip_prefix("/b/")).ok_or_else(|| GcsError::not_found("Not found."))?;
    let b = names::decode_segment(rest.split('/').next().unwrap_or(""))?;
    check_bucket(&b)?;
    Ok(b)
}

fn no_object(bucket: &str, name: &str) -> GcsError {
    GcsError::not_found(format!("No such object: {bucket}/{}", shown(name)))
}

fn bucket_resource(base: &str, bucket: &str, st: &nix::sys::stat::FileStat, region: &str) -> Value {
    let t = meta::rfc3339((meta::mtime_ns(st) / 1000) as i64);
    json!({
        "kind": "storage#bucket",
        "id": bucket,
        "selfLink": format!("{base}/storage/v1/b/{bucket}"),
        "name": bucket,
        "timeCreated": t,
        "updated": t,
        "metageneration": "1",
        "location": region,
        "locationType": "region",
        "storageClass": "STANDARD",
        "etag": "CAE=",
    })
}

/// A small request body (JSON), at most `limit` bytes.
async fn read_small(body: Body, limit: usize) -> GcsResult<Vec<u8>> {
    read_small_from(&mut body.into_data_stream(), limit).await
}

async fn read_small_from(s: &mut BodyDataStream, limit: usize) -> GcsResult<Vec<u8>> {
    let mut out = Vec::new();
    while let Some(chunk) = next_chunk(s).await? {
        if out.len() + chunk.len() > limit {
            return Err(GcsError::too_large(format!("The request's JSON body is larger than {limit} bytes.")));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

async fn next_chunk(s: &mut BodyDataStream) -> GcsResult<Option<Bytes>> {
    match s.next().await {
        None => Ok(None),
        Some(Ok(b)) => Ok(Some(b)),
        Some(Err(e)) => {
            let timeout = e.into_inner().downcast_ref::<crate::listen::BodyTimeout>().map(|t| t.to_string());
            Err(match timeout {
                Some(t) => GcsError::new(408, "requestTimeout", format!("The request body stopped: {t}.")),
                None => GcsError::invalid("The request body could not be read (the client went away?)."),
            })
        }
    }
}

// --- Buckets ---------------------------------------------------------------------------

async fn list_buckets(State(s): St, req: Request) -> Response {
    respond(async {
        let (parts, _body) = req.into_parts();
        let q = query(parts.uri.query())?;
        let headers = &parts.headers;
        let auth = s.auth(headers);
        let tokens = s.tokens.as_ref().map(|t| t.current());
        let project = match (q.get("project").filter(|p| !p.is_empty()), &tokens, &s.cfg.default_project) {
            (Some(p), _, _) => p.clone(),
            (None, Some(t), _) => match t.projects_of(auth).as_deref() {
                Some([only]) if only != "*" => only.clone(),
                _ => return Err(GcsError::invalid("Name the project: ?project=PROJECT.")),
            },
            (None, None, Some(d)) => d.clone(),
            (None, None, None) => return Err(GcsError::invalid("Name the project: ?project=PROJECT.")),
        };
        if let Some(t) = &tokens {
            t.check(auth, &project, false)?;
        }
        if let Some(why) = names::project_problem(&project) {
            return Err(GcsError::invalid(format!("Project {:?} {why}.", shown(&project))));
        }
        let root = s.root.clone();
        let base = base_url(headers);
        let region = s.region.clone();
        let mapped: BTreeMap<String, String> = s.cfg.buckets.clone();
        let items = blocking(move || {
            let Some(ns) = Ns::open(&root, &project, false, None)? else { return Ok(Vec::new()) };
            Ok(ns
                .list_buckets()?
                .into_iter()
                // A bucket mapped to another project is not this project's.
                .filter(|(b, _)| mapped.get(b).is_none_or(|p| *p == project))
                .map(|(b, st)| bucket_resource(&base, &b, &st, &region))
                .collect::<Vec<_>>())
        })
        .await?;
        let mut v = json!({"kind": "storage#buckets"});
        if !items.is_empty() {
            v["items"] = Value::Array(items);
        }
        Ok(json_ok(v))
    }
    .await)
}

async fn create_bucket(State(s): St, req: Request) -> Response {
    respond(async {
        let q = query(req.uri().query())?;
        let (parts, body) = req.into_parts();
        let text = read_small(body, multipart::MAX_META).await?;
        let v: Value = serde_json::from_slice(&text).map_err(|e| GcsError::invalid(format!("The bucket resource is not valid JSON: {e}")))?;
        let bucket = v.get("name").and_then(Value::as_str).ok_or_else(|| GcsError::invalid("The bucket resource needs a name."))?.to_string();
        check_bucket(&bucket)?;
        let project = s.project_for_new(&parts.headers, &bucket, q.get("project"))?;
        let owner = s.owner(&project).await?;
        let root = s.root.clone();
        let base = base_url(&parts.headers);
        let region = s.region.clone();
        let b = bucket.clone();
        let resource = blocking(move || {
            let ns = Ns::open(&root, &project, true, owner)?.ok_or_else(|| GcsError::internal("cannot make the namespace", "missing"))?;
            if !ns.create_bucket(&b)? {
                return Err(GcsError::conflict(format!("The bucket {b:?} already exists in project {project:?}.")));
            }
            let fd = ns.bucket(&b)?.ok_or_else(|| GcsError::internal("cannot open the new bucket", "missing"))?;
            let st = nix::sys::stat::fstat(std::os::fd::AsFd::as_fd(&fd)).map_err(|e| GcsError::errno("cannot stat the bucket", e))?;
            Ok(bucket_resource(&base, &b, &st, &region))
        })
        .await?;
        Ok(json_ok(resource))
    }
    .await)
}

async fn get_bucket(State(s): St, req: Request) -> Response {
    respond(async {
        let (parts, _body) = req.into_parts();
        let bucket = bucket_of(parts.uri.path(), "/storage/v1")?;
        let project = s.project_for(&parts.headers, &parts.uri, &bucket, false).await?;
        let root = s.root.clone();
        let base = base_url(&parts.headers);
        let region = s.region.clone();
        let v = blocking(move || {
            let missing = || GcsError::not_found(format!("The specified bucket {bucket:?} does not exist."));
            let ns = Ns::open(&root, &project, false, None)?.ok_or_else(missing)?;
            let fd = ns.bucket(&bucket)?.ok_or_else(missing)?;
            let st = nix::sys::stat::fstat(std::os::fd::AsFd::as_fd(&fd)).map_err(|e| GcsError::errno("cannot stat the bucket", e))?;
            Ok(bucket_resource(&base, &bucket, &st, &region))
        })
        .await?;
        Ok(json_ok(v))
    }
    .await)
}

/// Where a bucket's IAM policy is kept: beside the namespaces, in the storage root's own
/// directory (the server's, never a tenant's), `<root>/.trainyard-iam/<project>/<bucket>.json`.
fn iam_file(root: &std::path::Path, project: &str, bucket: &str) -> PathBuf {
    root.join(".trainyard-iam").join(project).join(format!("{bucket}.json"))
}

/// The policy a bucket has until one is set: its project's owners and editors own it, its
/// viewers read it (the service's legacy bucket roles).
fn default_policy(project: &str, bucket: &str) -> Value {
    json!({
        "kind": "storage#policy",
        "resourceId": format!("projects/_/buckets/{bucket}"),
        "version": 1,
        "bindings": [
            {"role": "roles/storage.legacyBucketOwner", "members": [format!("projectEditor:{project}"), format!("projectOwner:{project}")]},
            {"role": "roles/storage.legacyBucketReader", "members": [format!("projectViewer:{project}")]}
        ]
    })
}

/// A policy with its `etag`: derived from its bindings, so that it changes exactly when
/// they do (nothing to keep beside the policy).
fn with_etag(mut policy: Value) -> Value {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(policy["bindings"].to_string().as_bytes());
    let hex: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
    policy["etag"] = json!(hex);
    policy
}

/// The bucket's policy as kept (the default one until one is set), with its etag.
fn read_policy(root: &std::path::Path, project: &str, bucket: &str) -> GcsResult<Value> {
    let policy = match std::fs::read(iam_file(root, project, bucket)) {
        Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| GcsError::internal("the stored IAM policy", e.to_string()))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => default_policy(project, bucket),
        Err(e) => return Err(GcsError::io("cannot read the bucket's IAM policy", &e)),
    };
    Ok(with_etag(policy))
}

/// `GET /storage/v1/b/B/iam`: the bucket's policy (the default one until one is set).
async fn get_bucket_iam(State(s): St, req: Request) -> Response {
    respond(async {
        let (parts, _body) = req.into_parts();
        let bucket = bucket_of(parts.uri.path(), "/storage/v1")?;
        let project = s.project_for(&parts.headers, &parts.uri, &bucket, false).await?;
        let root = s.root.clone();
        let v = blocking(move || {
            open_bucket(&root, &project, &bucket)?;
            read_policy(&root, &project, &bucket)
        })
        .await?;
        Ok(json_ok(v))
    }
    .await)
}

/// `PUT /storage/v1/b/B/iam`: the policy is kept as given, durably (its `etag` must be the
/// current one when given: 412 otherwise), and answered with its new etag. A binding that
/// names another project (`projectViewer:OTHER`, ...) is refused: access to a bucket is its
/// project's tokens', which a policy cannot widen. Other members are kept, not enforced.
async fn set_bucket_iam(State(s): St, req: Request) -> Response {
    respond(async {
        let (parts, body) = req.into_parts();
        let bucket = bucket_of(parts.uri.path(), "/storage/v1")?;
        let project = s.project_for(&parts.headers, &parts.uri, &bucket, true).await?;
        let text = read_small(body, multipart::MAX_META).await?;
        let mut policy: Value =
            serde_json::from_slice(&text).map_err(|e| GcsError::invalid(format!("The IAM policy is not valid JSON: {e}")))?;
        let bindings = policy.get("bindings").cloned().unwrap_or_else(|| json!([]));
        let Some(list) = bindings.as_array() else { return Err(GcsError::invalid("bindings must be a list.")) };
        for (i, b) in list.iter().enumerate() {
            let role = b.get("role").and_then(Value::as_str).unwrap_or("");
            if role.is_empty() {
                return Err(GcsError::invalid(format!("bindings[{i}].role is required.")));
            }
            let members = b.get("members").and_then(Value::as_array).ok_or_else(|| GcsError::invalid(format!("bindings[{i}].members must be a list.")))?;
            for m in members {
                let m = m.as_str().ok_or_else(|| GcsError::invalid(format!("bindings[{i}].members holds a non-string.")))?;
                if let Some((kind, other)) = m.split_once(':') {
                    if matches!(kind, "projectOwner" | "projectEditor" | "projectViewer") && other != project {
                        return Err(GcsError::invalid(format!(
                            "bindings[{i}]: {m:?} names project {other:?}, but bucket {bucket:?} is project {project:?}'s and only \
                             its tokens reach it; a policy cannot grant it to another project."
                        )));
                    }
                }
            }
        }
        let root = s.root.clone();
        let v = blocking(move || {
            open_bucket(&root, &project, &bucket)?;
            let current = read_policy(&root, &project, &bucket)?;
            if let Some(given) = policy.get("etag").filter(|e| **e != current["etag"]) {
                return Err(GcsError::precondition(format!("The policy's etag {given} is not the current one.")));
            }
            if let Some(o) = policy.as_object_mut() {
                o.remove("etag");
            }
            policy["kind"] = json!("storage#policy");
            policy["resourceId"] = json!(format!("projects/_/buckets/{bucket}"));
            policy["bindings"] = bindings;
            let file = iam_file(&root, &project, &bucket);
            let dir = file.parent().ok_or_else(|| GcsError::internal("the IAM policy's directory", "none"))?;
            std::fs::create_dir_all(dir).map_err(|e| GcsError::io("cannot keep the bucket's IAM policy", &e))?;
            trainyard_backend::write_atomic(&file, policy.to_string().as_bytes())
                .map_err(|e| GcsError::io("cannot keep the bucket's IAM policy", &e.source))?;
            Ok(with_etag(policy))
        })
        .await?;
        Ok(json_ok(v))
    }
    .await)
}

async fn delete_bucket(State(s): St, req: Request) -> Response {
    respond(async {
        let (parts, _body) = req.into_parts();
        let bucket = bucket_of(parts.uri.path(), "/storage/v1")?;
        let project = s.project_for(&parts.headers, &parts.uri, &bucket, true).await?;
        let root = s.root.clone();
        blocking(move || {
            let missing = || GcsError::not_found(format!("The specified bucket {bucket:?} does not exist."));
            let ns = Ns::open(&root, &project, false, None)?.ok_or_else(missing)?;
            if !ns.delete_bucket(&bucket)? {
                return Err(missing());
            }
            // Its policy goes with it (a bucket made again starts from the default).
            let _ = std::fs::remove_file(iam_file(&root, &project, &bucket));
            Ok(())
        })
        .await?;
        Ok(StatusCode::NO_CONTENT.into_response())
    }
    .await)
}

/// Open the project's bucket (404 when it does not exist).
fn open_bucket(root: &std::path::Path, project: &str, bucket: &str) -> GcsResult<(Ns, OwnedFd)> {
    let missing = || GcsError::not_found(format!("The specified bucket {bucket:?} does not exist."));
    let ns = Ns::open(root, project, false, None)?.ok_or_else(missing)?;
    let fd = ns.bucket(bucket)?.ok_or_else(missing)?;
    Ok((ns, fd))
}

// --- Objects ---------------------------------------------------------------------------

async fn list_objects(State(s): St, req: Request) -> Response {
    respond(async {
        let (parts, _body) = req.into_parts();
        let bucket = bucket_of(parts.uri.path(), "/storage/v1")?;
        let q = query(parts.uri.query())?;
        if q.get("matchGlob").is_some_and(|g| !g.is_empty()) {
            return Err(GcsError::invalid("matchGlob is not supported by this server: use prefix, delimiter, startOffset and endOffset."));
        }
        let max = int_param(&q, "maxResults")?.map_or(1000, |n| n.clamp(1, 1000)) as usize;
        let lq = list::ListQuery {
            prefix: q.get("prefix").cloned().unwrap_or_default(),
            delimiter: q.get("delimiter").cloned().filter(|d| !d.is_empty()),
            start_offset: q.get("startOffset").cloned().filter(|d| !d.is_empty()),
            end_offset: q.get("endOffset").cloned().filter(|d| !d.is_empty()),
            page_token: q.get("pageToken").cloned().filter(|d| !d.is_empty()),
            max,
        };
        let project = s.project_for(&parts.headers, &parts.uri, &bucket, false).await?;
        let root = s.root.clone();
        let base = base_url(&parts.headers);
        let me = Arc::clone(&s);
        let v = blocking(move || {
            let (_ns, fd) = open_bucket(&root, &project, &bucket)?;
            let page = list::page(fd, &lq)?;
            for (n, info) in &page.items {
                if info.md5_pending() {
                    me.md5.request(&project, &bucket, n);
                }
            }
            let mut v = json!({"kind": "storage#objects"});
            if !page.items.is_empty() {
                v["items"] = page.items.iter().map(|(n, info)| info.resource(&base, &bucket, n)).collect();
            }
            if !page.prefixes.is_empty() {
                v["prefixes"] = json!(page.prefixes);
            }
            if let Some(t) = page.next_token {
                v["nextPageToken"] = Value::String(t);
            }
            Ok(v)
        })
        .await?;
        Ok(json_ok(v))
    }
    .await)
}

async fn get_object(State(s): St, req: Request) -> Response {
    respond(read_object(&s, req, "/storage/v1").await)
}

async fn download_object(State(s): St, req: Request) -> Response {
    respond(read_object(&s, req, "/download/storage/v1").await)
}

/// Metadata or (`alt=media`, and always below `/download`) the bytes.
async fn read_object(s: &Storage, req: Request, prefix: &str) -> GcsResult<Response> {
    let (parts, _body) = req.into_parts();
    let p = names::parse_object_path(parts.uri.path(), prefix)?;
    let q = query(parts.uri.query())?;
    let media = prefix.starts_with("/download") || q.get("alt").is_some_and(|a| a == "media");
    if let Some(alt) = q.get("alt").filter(|a| !matches!(a.as_str(), "json" | "media")) {
        return Err(GcsError::invalid(format!("Unsupported alt {:?}: use json or media.", shown(alt))));
    }
    let generation = int_param(&q, "generation")?;
    let pre = Preconditions::from_query(&q)?;
    let project = s.project_for(&parts.headers, &parts.uri, &p.bucket, false).await?;
    let root = s.root.clone();
    let (bucket, name) = (p.bucket.clone(), p.object.clone());
    let proj = project.clone();
    let opened = blocking(move || {
        let (_ns, fd) = open_bucket(&root, &project, &bucket)?;
        let o = fsops::open_object(std::os::fd::AsFd::as_fd(&fd), &name)?.ok_or_else(|| no_object(&bucket, &name))?;
        if generation.is_some_and(|g| g != o.info.generation) {
            return Err(GcsError::not_found(format!("No such object: {bucket}/{}#{}", shown(&name), generation.unwrap_or(0))));
        }
        pre.check(Some(&o.info))?;
        Ok(o)
    })
    .await?;
    if opened.info.md5_pending() {
        // Committed without its MD5, which is still to be computed (or was lost with a
        // restart): ask for it; this read answers without.
        s.md5.request(&proj, &p.bucket, &p.object);
    }
    if !media {
        return Ok(json_ok(opened.info.resource(&base_url(&parts.headers), &p.bucket, &p.object)));
    }
    let slot = s.transfer_slot(&proj).await?;
    download(opened, &parts.headers, &parts.method, slot)
}

/// What a `Range` header asks of an object of `size` bytes.
#[derive(Debug, PartialEq, Eq)]
enum Wanted {
    All,
    Part(u64, u64),
    Unsatisfiable,
}

/// `bytes=A-B`, `bytes=A-`, `bytes=-N`; anything else (several ranges, another unit,
/// garbage) is ignored and the whole object served, as HTTP allows.
fn wanted(range: Option<&str>, size: u64) -> Wanted {
    let Some(r) = range.and_then(|r| r.trim().strip_prefix("bytes=")) else { return Wanted::All };
    if r.contains(',') {
        return Wanted::All;
    }
    let Some((a, b)) = r.trim().split_once('-') else { return Wanted::All };
    let (a, b) = (a.trim(), b.trim());
    match (a.parse::<u64>(), b.parse::<u64>()) {
        (Ok(a), Ok(b)) if a <= b => {
            if a >= size {
                Wanted::Unsatisfiable
            } else {
                Wanted::Part(a, b.min(size - 1))
            }
        }
        (Ok(a), Err(_)) if b.is_empty() => {
            if a >= size {
                Wanted::Unsatisfiable
            } else {
                Wanted::Part(a, size - 1)
            }
        }
        (Err(_), Ok(n)) if a.is_empty() => {
            if n == 0 || size == 0 {
                Wanted::Unsatisfiable
            } else {
                Wanted::Part(size - n.min(size), size - 1)
            }
        }
        _ => Wanted::All,
    }
}

fn header_value(s: &str) -> Option<HeaderValue> {
    HeaderValue::from_str(s).ok()
}

/// The bytes of an opened object (all, or the asked range), streamed from the file by a
/// blocking reader: constant memory whatever the size.
fn download(o: fsops::Opened, headers: &HeaderMap, method: &Method, slot: TransferSlot) -> GcsResult<Response> {
    let info = o.info;
    let size = info.size;
    let range = headers.get(header::RANGE).and_then(|v| v.to_str().ok());
    let (status, first, len) = match wanted(range, size) {
        Wanted::All => (StatusCode::OK, 0, size),
        Wanted::Part(a, b) => (StatusCode::PARTIAL_CONTENT, a, b - a + 1),
        Wanted::Unsatisfiable => {
            let mut r = GcsError::new(416, "requestedRangeNotSatisfiable", "The requested range cannot be satisfied.").into_response();
            if let Some(v) = header_value(&format!("bytes */{size}")) {
                r.headers_mut().insert(header::CONTENT_RANGE, v);
            }
            return Ok(r);
        }
    };
    let body = if method == Method::HEAD || len == 0 { Body::empty() } else { stream_file(o.file, first, len, slot)? };
    let mut r = Response::new(body);
    *r.status_mut() = status;
    let h = r.headers_mut();
    let mut set = |k: header::HeaderName, v: Option<HeaderValue>| {
        if let Some(v) = v {
            h.insert(k, v);
        }
    };
    set(header::CONTENT_TYPE, header_value(&info.content_type).or_else(|| header_value(meta::DEFAULT_CONTENT_TYPE)));
    set(header::CONTENT_LENGTH, header_value(&len.to_string()));
    set(header::ACCEPT_RANGES, header_value("bytes"));
    set(header::ETAG, header_value(&format!("\"{}\"", info.etag())));
    if status == StatusCode::PARTIAL_CONTENT {
        set(header::CONTENT_RANGE, header_value(&format!("bytes {first}-{}/{size}", first + len - 1)));
    }
    set(header::HeaderName::from_static("x-goog-hash"), info.hash_header().as_deref().and_then(header_value));
    set(header::HeaderName::from_static("x-goog-generation"), header_value(&info.generation.to_string()));
    set(header::HeaderName::from_static("x-goog-metageneration"), header_value(&info.metageneration.to_string()));
    set(header::HeaderName::from_static("x-goog-stored-content-length"), header_value(&size.to_string()));
    set(
        header::HeaderName::from_static("x-goog-stored-content-encoding"),
        header_value(info.content_encoding.as_deref().unwrap_or("identity")),
    );
    set(header::HeaderName::from_static("x-goog-storage-class"), header_value("STANDARD"));
    set(header::CACHE_CONTROL, info.cache_control.as_deref().and_then(header_value));
    set(header::CONTENT_DISPOSITION, info.content_disposition.as_deref().and_then(header_value));
    set(header::CONTENT_LANGUAGE, info.content_language.as_deref().and_then(header_value));
    Ok(r)
}

/// Bytes read from the file at a time: large, so that the reader, the connection's task
/// and their hand-over cost little per byte; a download holds a few of them at most
/// ([`DOWNLOAD_AHEAD`] queued, one being read, one being sent: 4 MiB).
const DOWNLOAD_CHUNK: usize = 1 << 20;

/// Chunks read ahead of the connection.
const DOWNLOAD_AHEAD: usize = 2;

/// `len` bytes of `file` from `first`, read by a thread of its own a few chunks ahead
/// (it holds `slot` until it ends: the response was sent, or dropped).
fn stream_file(file: std::fs::File, first: u64, len: u64, slot: TransferSlot) -> GcsResult<Body> {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(DOWNLOAD_AHEAD);
    let _ = nix::fcntl::posix_fadvise(&file, first as i64, len as i64, nix::fcntl::PosixFadviseAdvice::POSIX_FADV_SEQUENTIAL);
    let reader = move || {
        let _slot = slot;
        let mut at = first;
        let end = first + len;
        while at < end {
            let n = (end - at).min(DOWNLOAD_CHUNK as u64) as usize;
            let r = match read_chunk(&file, at, n) {
                Ok(b) if b.is_empty() => Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "the object's file became shorter")),
                Ok(b) => {
                    at += b.len() as u64;
                    Ok(b)
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => Err(e),
            };
            let failed = r.is_err();
            if tx.blocking_send(r).is_err() || failed {
                return;
            }
        }
    };
    std::thread::Builder::new()
        .name("storage-reader".into())
        .spawn(reader)
        .map_err(|e| GcsError::new(503, "backendError", format!("Cannot start the download's reader now: {e}.")))?;
    Ok(Body::from_stream(futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))))
}

/// Up to `n` bytes of `file` at `at`, in a new buffer handed to the connection as it is
/// (no copy). The buffer is not zeroed first: `pread` fills it, and only what it filled
/// is kept (zeroing would cost as much as the read).
fn read_chunk(file: &std::fs::File, at: u64, n: usize) -> std::io::Result<Bytes> {
    let mut buf: Vec<u8> = Vec::with_capacity(n);
    let fd = std::os::fd::AsRawFd::as_raw_fd(file);
    // SAFETY: the buffer has room for `n` bytes, of which pread(2) writes at most `n`.
    let k = unsafe { nix::libc::pread(fd, buf.as_mut_ptr().cast(), n, at as nix::libc::off_t) };
    if k < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: pread(2) initialized the first `k` (<= n) bytes.
    unsafe { buf.set_len(k as usize) };
    Ok(Bytes::from(buf))
}

async fn delete_object(State(s): St, req: Request) -> Response {
    respond(async {
        let (parts, _body) = req.into_parts();
        let p = names::parse_object_path(parts.uri.path(), "/storage/v1")?;
        let q = query(parts.uri.query())?;
        let generation = int_param(&q, "generation")?;
        let pre = Preconditions::from_query(&q)?;
        let project = s.project_for(&parts.headers, &parts.uri, &p.bucket, true).await?;
        let root = s.root.clone();
        blocking(move || {
            let (_ns, fd) = open_bucket(&root, &project, &p.bucket)?;
            let gone = fsops::delete_object(std::os::fd::AsFd::as_fd(&fd), &p.object, |cur| {
                if generation.is_some_and(|g| g != cur.generation) {
                    return Err(no_object(&p.bucket, &p.object));
                }
                pre.check(Some(cur))
            })?;
            if !gone {
                return Err(no_object(&p.bucket, &p.object));
            }
            Ok(())
        })
        .await?;
        Ok(StatusCode::NO_CONTENT.into_response())
    }
    .await)
}

// --- Uploads ---------------------------------------------------------------------------

/// The metadata an upload will keep, from the client's metadata and content type; too
/// much custom metadata is refused before any byte is stored.
fn stored_meta(m: &UploadMeta, content_type: Option<String>) -> GcsResult<StoredMeta> {
    let meta = StoredMeta {
        content_type: m.content_type.clone().or(content_type).filter(|c| !c.is_empty()),
        content_encoding: m.content_encoding.clone(),
        content_disposition: m.content_disposition.clone(),
        content_language: m.content_language.clone(),
        cache_control: m.cache_control.clone(),
        metadata: m.custom(),
        ..Default::default()
    };
    let room = meta::MAX_XATTR - 300;
    if serde_json::to_vec(&meta).map(|v| v.len()).unwrap_or(usize::MAX) > room {
        return Err(GcsError::invalid(format!(
            "The object's metadata (content type, custom metadata, ...) is larger than this server keeps ({room} bytes)."
        )));
    }
    Ok(meta)
}

/// `X-Goog-Hash` headers of a request.
fn header_hashes(headers: &HeaderMap, into: &mut Expected) -> GcsResult<()> {
    for v in headers.get_all("x-goog-hash") {
        let v = v.to_str().map_err(|_| GcsError::invalid("X-Goog-Hash is not text."))?;
        into.add_header(v).map_err(GcsError::invalid)?;
    }
    into.check_form().map_err(GcsError::invalid)
}

fn content_length(headers: &HeaderMap) -> Option<u64> {
    headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.trim().parse().ok())
}

fn too_large(max: u64) -> GcsError {
    GcsError::too_large(format!("The object is larger than this server's limit of {max} bytes ([storage] max_object_bytes)."))
}

/// Where an upload goes, once the request is allowed.
struct Target {
    project: String,
    bucket: String,
    bucket_fd: OwnedFd,
    uploads: OwnedFd,
    owner: Option<RunAs>,
    /// The upload's bytes in its project's storage limit.
    reservation: Reservation,
}

impl Target {
    /// Reserve `bytes` (the upload's total so far) in the project's storage limit, or 429
    /// when they would pass it with what the project stores and its other uploads under
    /// way have reserved.
    fn fits(&self, bytes: u64) -> GcsResult<()> {
        self.reservation.grow(bytes)
    }

    /// The upload is the resumable session `id`: its bytes stay reserved from request to
    /// request, until the session is published, cancelled or expires.
    fn for_session(mut self, id: &str) -> Target {
        self.reservation.release_now();
        self.reservation.key = usage::session_reservation(id);
        self.reservation.keep = true;
        self
    }
}

/// An upload's bytes in its project's storage limit ([`usage::StorageUsage::reserve`]),
/// given back when dropped (a single request's upload) or kept (a resumable session's,
/// given back by [`Reservation::release_now`]).
struct Reservation {
    usage: Arc<usage::StorageUsage>,
    project: String,
    key: String,
    keep: bool,
}

impl Reservation {
    fn grow(&self, bytes: u64) -> GcsResult<()> {
        self.usage.reserve(&self.project, &self.key, bytes).map_err(|q| storage_full(&q, Some(bytes)))
    }

    /// What is reserved goes back to `bytes` (a chunk taken back).
    fn shrink(&self, bytes: u64) {
        self.usage.release(&self.project, &self.key);
        let _ = self.usage.reserve(&self.project, &self.key, bytes);
    }

    fn release_now(&self) {
        self.usage.release(&self.project, &self.key);
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if !self.keep {
            self.release_now();
        }
    }
}

/// The answer to an upload past its project's storage limit.
fn storage_full(q: &usage::Full, adding: Option<u64>) -> GcsError {
    GcsError::new(429, "quotaExceeded", q.message(adding))
}

async fn target(s: &Arc<Storage>, headers: &HeaderMap, uri: &axum::http::Uri, bucket: &str) -> GcsResult<Target> {
    let project = s.project_for(headers, uri, bucket, true).await?;
    let owner = s.owner(&project).await?;
    s.maybe_sweep(&project);
    let root = s.root.clone();
    let (p, b) = (project.clone(), bucket.to_string());
    let usage = Arc::clone(&s.usage);
    let reservation = Reservation {
        usage: Arc::clone(&usage),
        project: project.clone(),
        key: format!("upload:{}", upload::random_id()),
        keep: false,
    };
    let (bucket_fd, uploads) = blocking(move || {
        // The walk (when the size last seen is old) happens here, off the executor.
        let quota = usage.limit(&p).map(|limit| usage::Full { project: p.clone(), used: usage.used(&p), limit });
        if let Some(q) = quota.as_ref().filter(|q| q.used > q.limit) {
            return Err(storage_full(q, None));
        }
        let (ns, fd) = open_bucket(&root, &p, &b)?;
        Ok((fd, ns.uploads()?))
    })
    .await?;
    Ok(Target { project, bucket: bucket.to_string(), bucket_fd, uploads, owner, reservation })
}

fn new_temp(uploads: &OwnedFd) -> GcsResult<TempFile> {
    let dup = uploads.try_clone().map_err(|e| GcsError::io("cannot open the uploads directory", &e))?;
    TempFile::create(dup, format!("tmp-{}", upload::random_id()))
}

async fn upload(State(s): St, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let mut stream = body.into_data_stream();
    let r = async {
        let bucket = bucket_of(parts.uri.path(), "/upload/storage/v1")?;
        let q = query(parts.uri.query())?;
        let ct = parts.headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).map(str::to_string);
        let kind = match q.get("uploadType").map(String::as_str) {
            Some(k) => k.to_string(),
            None if ct.as_deref().and_then(multipart::boundary_of).is_some() => "multipart".into(),
            None => "media".into(),
        };
        match kind.as_str() {
            "media" => upload_media(&s, &parts, &mut stream, bucket, q).await,
            "multipart" => upload_multipart(&s, &parts, &mut stream, bucket, q).await,
            "resumable" => resumable_start(&s, &parts, &mut stream, bucket, q).await,
            other => Err(GcsError::invalid(format!("Unsupported uploadType {:?}: use media, multipart or resumable.", shown(other)))),
        }
    }
    .await;
    drain(r, &mut stream, &parts.headers).await
}

/// Answer an upload request once the rest of its body (if not too much) has been read
/// and dropped: a client still sending would otherwise see its connection reset instead
/// of the answer (a refusal, a 308 for a chunk sent again).
async fn drain(r: GcsResult<Response>, stream: &mut BodyDataStream, headers: &HeaderMap) -> Response {
    const DRAIN: u64 = 64 << 20;
    let skip = matches!(&r, Err(e) if matches!(e.code, 401 | 408 | 413)) || content_length(headers).is_some_and(|n| n > DRAIN);
    if !skip {
        let mut n = 0u64;
        while let Ok(Some(c)) = next_chunk(stream).await {
            n += c.len() as u64;
            if n > DRAIN {
                break;
            }
        }
    }
    respond(r)
}

/// Publish a finished upload after checking its checksums; without its MD5 (the client
/// sent none), which is then computed in the background.
#[allow(clippy::too_many_arguments)]
async fn publish(
    s: &Storage,
    t: Target,
    tmp: TempFile,
    hashes: &Hashes,
    expected: &Expected,
    mut meta: StoredMeta,
    name: String,
    pre: Preconditions,
    base: String,
) -> GcsResult<Response> {
    let (crc, md5) = hashes.finish();
    expected.verify(&crc, md5.as_deref()).map_err(GcsError::invalid)?;
    meta.crc32c = Some(crc);
    meta.md5_hash = md5;
    let Target { project, bucket, bucket_fd, owner, .. } = t;
    let (b, n) = (bucket.clone(), name.clone());
    let size = tmp.file.metadata().map(|m| m.len()).unwrap_or(0);
    let info = blocking(move || tmp.publish(std::os::fd::AsFd::as_fd(&bucket_fd), &name, owner, meta, &pre)).await?;
    s.usage.added(&project, size);
    if info.md5_pending() {
        s.md5.request(&project, &b, &n);
    }
    Ok(json_ok(info.resource(&base, &b, &n)))
}

async fn upload_media(s: &Arc<Storage>, parts: &Parts, stream: &mut BodyDataStream, bucket: String, q: HashMap<String, String>) -> GcsResult<Response> {
    let name = q.get("name").cloned().ok_or_else(|| GcsError::invalid("An upload needs the object's name: ?name=NAME."))?;
    check_object(&name)?;
    let max = s.cfg.max_object_bytes;
    if content_length(&parts.headers).is_some_and(|n| n > max) {
        return Err(too_large(max));
    }
    let mut expected = Expected::default();
    header_hashes(&parts.headers, &mut expected)?;
    let pre = Preconditions::from_query(&q)?;
    let ct = parts.headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).map(str::to_string);
    let meta = stored_meta(&UploadMeta::default(), ct)?;
    let t = target(s, &parts.headers, &parts.uri, &bucket).await?;
    t.fits(content_length(&parts.headers).unwrap_or(0))?;
    let hashes = Hashes::new(expected.wants_md5());
    let mut w = Writer::start(new_temp(&t.uploads)?, HashSink::Own(hashes), s.transfer_slot(&t.project).await?)?;
    while let Some(chunk) = next_chunk(stream).await? {
        if w.written + chunk.len() as u64 > max {
            return Err(too_large(max));
        }
        t.fits(w.written + chunk.len() as u64)?;
        w.write(chunk).await?;
    }
    let (tmp, mut sink) = w.finish().await?;
    let hashes = sink.hashes().clone();
    publish(s, t, tmp, &hashes, &expected, meta, name, pre, base_url(&parts.headers)).await
}

async fn upload_multipart(s: &Arc<Storage>, parts: &Parts, stream: &mut BodyDataStream, bucket: String, q: HashMap<String, String>) -> GcsResult<Response> {
    let ct = parts.headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    let boundary = multipart::boundary_of(ct)
        .ok_or_else(|| GcsError::invalid("A multipart upload needs Content-Type: multipart/related; boundary=..."))?;
    let max = s.cfg.max_object_bytes;
    if content_length(&parts.headers).is_some_and(|n| n > max.saturating_add(multipart::MAX_META as u64 + 64 * 1024)) {
        return Err(too_large(max));
    }
    let mut expected = Expected::default();
    header_hashes(&parts.headers, &mut expected)?;
    let pre = Preconditions::from_query(&q)?;
    let t = target(s, &parts.headers, &parts.uri, &bucket).await?;
    // The declared length (the object and its metadata part) is reserved at once.
    t.fits(content_length(&parts.headers).unwrap_or(0))?;
    // Started once the metadata part is read: whether the MD5 is computed as the bytes
    // come depends on its `md5Hash`.
    let mut w: Option<Writer> = None;
    let mut mp = multipart::Multipart::new(&boundary);
    let mut upload_meta: Option<UploadMeta> = None;
    let mut media_type: Option<String> = None;
    let mut pieces = Vec::new();
    while let Some(chunk) = next_chunk(stream).await? {
        mp.feed(chunk, &mut pieces).map_err(GcsError::invalid)?;
        for piece in pieces.drain(..) {
            match piece {
                multipart::Piece::Meta(m) => {
                    let m = UploadMeta::parse(&m).map_err(GcsError::invalid)?;
                    let name = m.name.clone().or_else(|| q.get("name").cloned()).ok_or_else(|| {
                        GcsError::invalid("A multipart upload needs the object's name in its metadata (or ?name=NAME).")
                    })?;
                    check_object(&name)?;
                    let e = Expected::from_meta(&m);
                    e.check_form().map_err(GcsError::invalid)?;
                    expected.crc32c = expected.crc32c.take().or(e.crc32c);
                    expected.md5 = expected.md5.take().or(e.md5);
                    upload_meta = Some(UploadMeta { name: Some(name), ..m });
                    let hashes = HashSink::Own(Hashes::new(expected.wants_md5()));
                    w = Some(Writer::start(new_temp(&t.uploads)?, hashes, s.transfer_slot(&t.project).await?)?);
                }
                multipart::Piece::MediaType(t) => media_type = t,
                multipart::Piece::Data(d) => {
                    // The parser gives the metadata part first, so the writer runs.
                    let Some(w) = w.as_mut() else { return Err(GcsError::invalid("The multipart body has no metadata part.")) };
                    if w.written + d.len() as u64 > max {
                        return Err(too_large(max));
                    }
                    t.fits(w.written + d.len() as u64)?;
                    w.write(d).await?;
                }
            }
        }
    }
    mp.finish().map_err(GcsError::invalid)?;
    let m = upload_meta.ok_or_else(|| GcsError::invalid("The multipart body has no metadata part."))?;
    let name = m.name.clone().unwrap_or_default();
    let meta = stored_meta(&m, media_type)?;
    let w = w.ok_or_else(|| GcsError::invalid("The multipart body has no metadata part."))?;
    let (tmp, mut sink) = w.finish().await?;
    let hashes = sink.hashes().clone();
    publish(s, t, tmp, &hashes, &expected, meta, name, pre, base_url(&parts.headers)).await
}

// --- Resumable uploads -----------------------------------------------------------------

async fn resumable_start(s: &Arc<Storage>, parts: &Parts, stream: &mut BodyDataStream, bucket: String, q: HashMap<String, String>) -> GcsResult<Response> {
    let text = read_small_from(stream, multipart::MAX_META).await?;
    let m = UploadMeta::parse(&text).map_err(GcsError::invalid)?;
    let name = m.name.clone().or_else(|| q.get("name").cloned()).ok_or_else(|| {
        GcsError::invalid("An upload needs the object's name: in its metadata or as ?name=NAME.")
    })?;
    check_object(&name)?;
    let expected = Expected::from_meta(&m);
    expected.check_form().map_err(GcsError::invalid)?;
    let h = |k: &str| parts.headers.get(k).and_then(|v| v.to_str().ok()).map(str::to_string);
    let total = match h("x-upload-content-length") {
        None => None,
        Some(v) => Some(v.trim().parse::<u64>().map_err(|_| GcsError::invalid(format!("Invalid X-Upload-Content-Length {:?}.", shown(&v))))?),
    };
    let max = s.cfg.max_object_bytes;
    if total.is_some_and(|t| t > max) {
        return Err(too_large(max));
    }
    let meta = stored_meta(&m, h("x-upload-content-type"))?;
    let pre = Preconditions::from_query(&q)?;
    let id = upload::random_id();
    let t = target(s, &parts.headers, &parts.uri, &bucket).await?.for_session(&id);
    // A declared size is reserved from the start; else the bytes are, as they come.
    t.fits(total.unwrap_or(0))?;
    let session = SessionFile { bucket: bucket.clone(), name, meta, expected, total, pre, created_us: meta::now_us(), done: None };
    let uploads = t.uploads;
    let sid = id.clone();
    let made = blocking(move || {
        let dup = uploads.try_clone().map_err(|e| GcsError::io("cannot start the upload", &e))?;
        let mut part = TempFile::create(dup, format!("{sid}.part"))?;
        upload::save_session(&uploads, &sid, &session)?;
        part.remove_on_drop(false);
        Ok(())
    })
    .await;
    if made.is_err() {
        t.reservation.release_now();
    }
    made?;
    let location = format!(
        "{}/upload/storage/v1/b/{}/o?uploadType=resumable&upload_id={id}",
        base_url(&parts.headers),
        names::encode(&bucket)
    );
    let mut r = (StatusCode::OK, [(header::CONTENT_LENGTH, "0")]).into_response();
    if let Some(v) = header_value(&location) {
        r.headers_mut().insert(header::LOCATION, v);
    }
    Ok(r)
}

/// 308 with how much of the upload the server has.
fn resume_incomplete(len: u64) -> Response {
    let mut r = Response::new(Body::empty());
    *r.status_mut() = StatusCode::PERMANENT_REDIRECT;
    if len > 0 {
        if let Some(v) = header_value(&format!("bytes=0-{}", len - 1)) {
            r.headers_mut().insert(header::RANGE, v);
        }
    }
    r.headers_mut().insert(header::CONTENT_LENGTH, HeaderValue::from_static("0"));
    r
}

fn session_id(q: &HashMap<String, String>) -> GcsResult<String> {
    let id = q.get("upload_id").ok_or_else(|| GcsError::invalid("A resumable upload request needs ?upload_id=ID."))?;
    if !upload::valid_session_id(id) {
        return Err(GcsError::not_found("No such upload session."));
    }
    Ok(id.clone())
}

/// `PUT` on a session URI: a chunk (`Content-Range: bytes A-B/TOTAL` or `.../*`), a
/// status query (`bytes */TOTAL`, `bytes */*`), or without `Content-Range` the whole
/// object. A chunk must start where the server's data ends: a chunk starting before (a
/// chunk sent again after a lost answer) is answered 308 with the range the server has,
/// as the service does, and nothing is written; one starting after (a gap) is 400.
async fn resumable_put(State(s): St, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let mut stream = body.into_data_stream();
    let r = resumable_put_inner(&s, &parts, &mut stream).await;
    drain(r, &mut stream, &parts.headers).await
}

async fn resumable_put_inner(s: &Arc<Storage>, parts: &Parts, stream: &mut BodyDataStream) -> GcsResult<Response> {
    let bucket = bucket_of(parts.uri.path(), "/upload/storage/v1")?;
    let q = query(parts.uri.query())?;
    let id = session_id(&q)?;
    let range = match parts.headers.get(header::CONTENT_RANGE) {
        None => None,
        Some(v) => Some(upload::parse_content_range(v.to_str().unwrap_or("")).map_err(GcsError::invalid)?),
    };
    let mut extra = Expected::default();
    header_hashes(&parts.headers, &mut extra)?;
    let t = target(s, &parts.headers, &parts.uri, &bucket).await?.for_session(&id);
    let key = upload::session_key(&t.project, &id);
    let lock = s.sessions.get(&key);
    let guard = lock.lock_owned().await;
    let uploads = t.uploads.try_clone().map_err(|e| GcsError::io("cannot open the uploads directory", &e))?;
    let sid = id.clone();
    let (session, part, len, guard) = blocking(move || {
        let mut guard = guard;
        let Some(session) = upload::load_session(&uploads, &sid)? else { return Err(GcsError::not_found("No such upload session.")) };
        if session.done.is_some() {
            return Ok((session, None, 0, guard));
        }
        let mut part = TempFile::open_existing(uploads, format!("{sid}.part"))?.ok_or_else(|| GcsError::not_found("No such upload session."))?;
        let len = part.file.metadata().map_err(|e| GcsError::io("cannot stat the upload's data", &e))?.len();
        let md5 = session.expected.wants_md5();
        upload::catch_up(&mut guard, &mut part.file, len, md5).map_err(|e| GcsError::io("cannot read the upload's data", &e))?;
        Ok((session, Some(part), len, guard))
    })
    .await?;
    if session.bucket != bucket {
        return Err(GcsError::not_found("No such upload session."));
    }
    if let Some(done) = session.done {
        return Ok(json_ok(done));
    }
    let Some(mut part) = part else { return Err(GcsError::not_found("No such upload session.")) };
    let max = s.cfg.max_object_bytes;
    let check_total = |total: Option<u64>| -> GcsResult<Option<u64>> {
        match (total, session.total) {
            (Some(a), Some(b)) if a != b => Err(GcsError::invalid(format!("The upload's total size was given as {b}, now as {a}."))),
            (Some(a), _) if a > max => Err(too_large(max)),
            (a, b) => Ok(a.or(b)),
        }
    };
    let (first, expect_len, total) = match range {
        Some(ChunkRange::Query { total }) => {
            let total = check_total(total)?;
            return match total {
                Some(tot) if len > tot => Err(GcsError::invalid(format!("The server has {len} bytes of this upload, more than its total {tot}."))),
                Some(tot) if len == tot => {
                    let hashes = guard.hashes.clone();
                    finish_session(s, t, part, &hashes, &extra, session, &id, &parts.headers, &key).await
                }
                _ => Ok(resume_incomplete(len)),
            };
        }
        Some(ChunkRange::Bytes { first, last, total }) => (first, Some(last - first + 1), check_total(total)?),
        None => (0, None, None),
    };
    if first > len {
        return Err(GcsError::invalid(format!(
            "The chunk starts at byte {first} but the server has {len} bytes of this upload: send from byte {len} (ask with Content-Range: bytes */*)."
        )));
    }
    if first < len {
        return Ok(resume_incomplete(len));
    }
    if let (Some(e), Some(c)) = (expect_len, content_length(&parts.headers)) {
        if e != c {
            return Err(GcsError::invalid(format!("Content-Range names {e} bytes but Content-Length is {c}.")));
        }
    }
    let limit = match (expect_len, total) {
        (Some(e), _) => e,
        (None, Some(t)) => t.saturating_sub(len),
        (None, None) => max.saturating_sub(len),
    };
    if len + limit > max && expect_len.is_some() {
        return Err(too_large(max));
    }
    let before = guard.hashes.clone();
    part.file.seek_to(len).map_err(|e| GcsError::io("cannot write the upload", &e))?;
    let slot = s.transfer_slot(&t.project).await?;
    let mut w = Writer::start(part, HashSink::Session(guard), slot)?;
    let mut over = false;
    let mut full = None;
    while let Some(chunk) = next_chunk(stream).await? {
        if w.written + chunk.len() as u64 > limit {
            over = true;
            break;
        }
        // The session's bytes so far and this chunk's, reserved.
        if let Err(e) = t.fits(len + w.written + chunk.len() as u64) {
            full = Some(e);
            break;
        }
        w.write(chunk).await?;
    }
    let got = w.written;
    let (part, mut sink) = w.finish().await?;
    let short = expect_len.is_some_and(|e| got != e);
    if let Some(full) = full {
        // Take the chunk back: the session stays as it was, to go on once there is room.
        if let HashSink::Session(g) = &mut sink {
            g.hashes = before;
        }
        let _ = nix::unistd::ftruncate(&part.file, len as i64);
        t.reservation.shrink(len);
        return Err(full);
    }
    if over || short {
        // Take the chunk back: the session stays as it was.
        if let HashSink::Session(g) = &mut sink {
            g.hashes = before;
        }
        let _ = nix::unistd::ftruncate(&part.file, len as i64);
        t.reservation.shrink(len);
        return Err(if over && expect_len.is_none() {
            too_large(max)
        } else {
            GcsError::invalid(format!(
                "The chunk has {}{got} bytes, not the {} its Content-Range names; nothing of it was kept.",
                if over { "more than " } else { "" },
                expect_len.unwrap_or(0)
            ))
        });
    }
    let new_len = len + got;
    let total = if range.is_none() { Some(new_len) } else { total };
    let hashes = sink.hashes().clone();
    match total {
        Some(tot) if new_len == tot => finish_session(s, t, part, &hashes, &extra, session, &id, &parts.headers, &key).await,
        _ => {
            let synced = blocking(move || part.file.sync_data().map_err(|e| GcsError::io("cannot sync the upload", &e))).await;
            drop(sink);
            synced?;
            Ok(resume_incomplete(new_len))
        }
    }
}

/// Ends a session whose upload failed a check: its files are removed, its bytes no longer
/// reserved, and it is forgotten.
async fn drop_session(s: &Storage, t: &Target, uploads: OwnedFd, sid: String, key: &str) -> GcsResult<()> {
    blocking(move || {
        upload::remove_session(&uploads, &sid);
        Ok(())
    })
    .await?;
    t.reservation.release_now();
    s.sessions.forget(key);
    Ok(())
}

/// The upload's bytes are all there: check, publish, and remember the answer. A check
/// that fails ends the session with nothing stored.
#[allow(clippy::too_many_arguments)]
async fn finish_session(
    s: &Arc<Storage>,
    t: Target,
    mut part: TempFile,
    hashes: &Hashes,
    extra: &Expected,
    mut session: SessionFile,
    id: &str,
    headers: &HeaderMap,
    key: &str,
) -> GcsResult<Response> {
    let uploads = t.uploads.try_clone().map_err(|e| GcsError::io("cannot open the uploads directory", &e))?;
    let mut expected = session.expected.clone();
    if extra.crc32c.is_some() {
        expected.crc32c = extra.crc32c.clone();
    }
    if extra.md5.is_some() {
        expected.md5 = extra.md5.clone();
    }
    let (crc, mut md5) = hashes.finish();
    // From here on the data file is the object to be, or goes.
    part.remove_on_drop(true);
    let sid = id.to_string();
    if md5.is_none() && expected.wants_md5() {
        // The MD5 came with the last chunk only (as clients send it): the session did
        // not compute it, so the data file is read once now to check it.
        let (p, len) = (part, hashes.len);
        let (p, computed) = blocking(move || {
            let m = upload::md5_of_file(&p.file, len).map_err(|e| GcsError::io("cannot read the upload's data", &e));
            Ok((p, m))
        })
        .await?;
        part = p;
        match computed {
            Ok(m) => md5 = Some(m),
            Err(e) => {
                drop_session(s, &t, uploads, sid, key).await?;
                return Err(e);
            }
        }
    }
    if let Err(why) = expected.verify(&crc, md5.as_deref()) {
        drop_session(s, &t, uploads, sid, key).await?;
        return Err(GcsError::invalid(why));
    }
    let mut meta = session.meta.clone();
    meta.crc32c = Some(crc);
    meta.md5_hash = md5;
    let base = base_url(headers);
    let size = hashes.len;
    let Target { project, bucket, bucket_fd, owner, reservation, .. } = t;
    let name = session.name.clone();
    let pre = session.pre.clone();
    let r = blocking(move || {
        let r = part.publish(std::os::fd::AsFd::as_fd(&bucket_fd), &name, owner, meta, &pre);
        match r {
            Ok(info) => {
                let v = info.resource(&base, &bucket, &name);
                session.done = Some(v.clone());
                // The bytes are gone from the data file's name; keep the answer for status
                // queries (removed with the session when it expires).
                let _ = upload::save_session(&uploads, &sid, &session);
                Ok((v, info.md5_pending(), bucket, name))
            }
            Err(e) => {
                upload::remove_session(&uploads, &sid);
                Err(e)
            }
        }
    })
    .await;
    s.sessions.forget(key);
    if r.is_ok() {
        s.usage.added(&project, size);
    }
    // Published (its bytes counted as the object's) or removed: reserved no more.
    reservation.release_now();
    let (v, pending, bucket, name) = r?;
    if pending {
        s.md5.request(&project, &bucket, &name);
    }
    Ok(json_ok(v))
}

/// `DELETE` on a session URI: the upload is cancelled and its bytes removed; answered 499
/// as the service does.
async fn resumable_cancel(State(s): St, req: Request) -> Response {
    respond(async {
        let (parts, _body) = req.into_parts();
        let bucket = bucket_of(parts.uri.path(), "/upload/storage/v1")?;
        let q = query(parts.uri.query())?;
        let id = session_id(&q)?;
        let t = target(&s, &parts.headers, &parts.uri, &bucket).await?.for_session(&id);
        let key = upload::session_key(&t.project, &id);
        let lock = s.sessions.get(&key);
        let _guard = lock.lock().await;
        let uploads = t.uploads;
        let found = blocking(move || {
            let Some(session) = upload::load_session(&uploads, &id)? else { return Ok(false) };
            if session.bucket != bucket {
                return Ok(false);
            }
            upload::remove_session(&uploads, &id);
            Ok(true)
        })
        .await?;
        s.sessions.forget(&key);
        if found {
            t.reservation.release_now();
        }
        if !found {
            return Err(GcsError::not_found("No such upload session."));
        }
        Ok((StatusCode::from_u16(499).unwrap_or(StatusCode::NO_CONTENT), [(header::CONTENT_LENGTH, "0")]).into_response())
    }
    .await)
}

trait SeekTo {
    fn seek_to(&mut self, at: u64) -> std::io::Result<()>;
}

impl SeekTo for std::fs::File {
    fn seek_to(&mut self, at: u64) -> std::io::Result<()> {
        use std::io::Seek;
        self.seek(std::io::SeekFrom::Start(at)).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges() {
        assert_eq!(wanted(None, 10), Wanted::All);
        assert_eq!(wanted(Some("bytes=0-4"), 10), Wanted::Part(0, 4));
        assert_eq!(wanted(Some("bytes=5-"), 10), Wanted::Part(5, 9));
        assert_eq!(wanted(Some("bytes=-3"), 10), Wanted::Part(7, 9));
        assert_eq!(wanted(Some("bytes=-30"), 10), Wanted::Part(0, 9));
        assert_eq!(wanted(Some("bytes=8-100"), 10), Wanted::Part(8, 9));
        assert_eq!(wanted(Some("bytes=10-20"), 10), Wanted::Unsatisfiable);
        assert_eq!(wanted(Some("bytes=0-5242879"), 0), Wanted::Unsatisfiable);
        assert_eq!(wanted(Some("bytes=0-1,3-4"), 10), Wanted::All);
        assert_eq!(wanted(Some("items=0-1"), 10), Wanted::All);
        assert_eq!(wanted(Some("bytes=4-2"), 10), Wanted::All);
    }

    #[test]
    fn config_is_checked() {
        let f: StorageFile = toml::from_str("default_project = \"demo\"\n[buckets]\ndata = \"research\"\n").unwrap();
        assert!(f.check().is_ok());
        let c = StorageConfig::from_file(Some(&f));
        assert_eq!(c.max_object_bytes, DEFAULT_MAX_OBJECT_BYTES);
        assert_eq!(c.buckets["data"], "research");
        let bad: StorageFile = toml::from_str("[buckets]\nBAD = \"p\"\n").unwrap();
        assert_eq!(bad.check().unwrap_err().0, "storage.buckets.BAD");
        let bad: StorageFile = toml::from_str("default_project = \"..\"\n").unwrap();
        assert_eq!(bad.check().unwrap_err().0, "storage.default_project");
        assert!(toml::from_str::<StorageFile>("nope = 1\n").is_err());
    }
}
