//! A job's TensorBoard event files read as they grow, the reading half (the writing half
//! is `records::ingest`, on the driver): a thread of its own at background priority looks
//! every [`EVERY`] at the log directory (`AIP_TENSORBOARD_LOG_DIR`, `<base output>/logs/`)
//! of each running CustomJob with a `baseOutputDirectory`, and once more after the job
//! ended, and sends what its files gained to the driver.
//!
//! Bounded and confined: files are found and read below the job's storage without
//! following a link ([`crate::paths::event_files`], [`crate::paths::read_file_from`]); a
//! link or a FIFO named like an event file is passed over and said once; a file whose
//! records fail their CRCs or claim a length over `events::MAX_RECORD` is skipped from
//! there on, said once in the job's log; each pass reads at most [`READ_BUDGET`] of a
//! file and [`JOB_BUDGET`] of a job, so a 10 GB file is read a slice a pass and never
//! held whole. Offsets are kept in the store with the points, so a restarted server reads
//! on where it was.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::mpsc::Sender;
use std::time::Duration;

use serde_json::Value;
use trainyard_store::{Location, Store};

use crate::driver::Msg;
use crate::paths::Confined;
use crate::records::events;
use crate::records::ingest::{Batch, FileRead};

/// How often the log directories are looked at.
pub const EVERY: Duration = Duration::from_secs(2);
/// The most bytes of one file one pass reads.
pub const READ_BUDGET: usize = 4 << 20;
/// The most bytes of one job's files one pass reads.
pub const JOB_BUDGET: usize = 16 << 20;
/// Entries and levels of a log directory looked at.
const MAX_ENTRIES: usize = 2_000;
const MAX_DEPTH: u32 = 4;

/// Where a job's reading stands.
struct Watched {
    project: String,
    region: String,
    display_name: String,
    tensorboard: Option<String>,
    logs: Confined,
    /// Offsets by path below the log directory; None: skipped for good.
    files: HashMap<PathBuf, Option<u64>>,
    loaded: bool,
    /// The job has ended: one more pass, then it is forgotten.
    ended: bool,
}

/// Where a job's files are read from: what `storage_root` and the output roots make of its
/// `baseOutputDirectory`.
pub struct Roots {
    pub storage_root: PathBuf,
    pub output_roots: Vec<PathBuf>,
}

/// Start the reading thread.
pub fn start(location: Location, roots: Roots, tx: Sender<Msg>) {
    let spawned = std::thread::Builder::new().name("tensorboard-ingest".into()).spawn(move || {
        crate::priority::background_thread();
        let mut watched: HashMap<u64, Watched> = HashMap::new();
        let mut store: Option<Store> = None;
        loop {
            std::thread::sleep(EVERY);
            if store.is_none() {
                store = Store::connect(&location).map_err(|e| tracing::warn!("TensorBoard event files: cannot read the store: {e}")).ok();
            }
            let Some(s) = store.as_ref() else { continue };
            match pass(s, &roots, &mut watched, &tx) {
                Ok(true) => {}
                Ok(false) => return,
                Err(e) => {
                    tracing::warn!("TensorBoard event files: {e}");
                    store = None;
                }
            }
        }
    });
    if let Err(e) = spawned {
        tracing::warn!("TensorBoard event files are not read: cannot start the thread: {e}");
    }
}

/// The log directory and TensorBoard of a stored CustomJob, if it has an output directory.
fn watched_of(resource: &str, project: &str, region: &str, roots: &Roots) -> Option<Watched> {
    let v: Value = serde_json::from_str(resource).ok()?;
    let spec = v.get("jobSpec")?;
    let uri = spec.get("baseOutputDirectory")?.get("outputUriPrefix")?.as_str()?;
    let base = crate::jobspec::resolve_uri(uri, project, &roots.storage_root, &roots.output_roots, "").ok()?;
    Some(Watched {
        project: project.into(),
        region: region.into(),
        display_name: v.get("displayName").and_then(Value::as_str).unwrap_or("").into(),
        tensorboard: spec.get("tensorboard").and_then(Value::as_str).filter(|t| !t.is_empty()).map(String::from),
        logs: base.join("logs"),
        files: HashMap::new(),
        loaded: false,
        ended: false,
    })
}

/// One pass over every watched job; false when the driver is gone.
fn pass(store: &Store, roots: &Roots, watched: &mut HashMap<u64, Watched>, tx: &Sender<Msg>) -> Result<bool, trainyard_store::StoreError> {
    let active = store.active_jobs()?;
    let live: std::collections::HashSet<u64> = active.iter().map(|j| j.job.id).collect();
    for j in active.iter().filter(|j| j.kind == crate::kinds::custom_jobs::KIND_CUSTOM) {
        if let std::collections::hash_map::Entry::Vacant(slot) = watched.entry(j.job.id) {
            if let Some(w) = watched_of(&j.resource, &j.job.project, &j.job.region, roots) {
                slot.insert(w);
            }
        }
    }
    let mut done = Vec::new();
    for (id, w) in watched.iter_mut() {
        if !live.contains(id) {
            if w.ended {
                done.push(*id);
            }
            w.ended = true;
        }
        if !w.loaded {
            match crate::records::ingest::offsets(store, &w.project, &w.region, *id) {
                Ok(kept) => {
                    for (rel, offset, damaged) in kept {
                        w.files.insert(PathBuf::from(rel), (!damaged).then_some(offset));
                    }
                    w.loaded = true;
                }
                Err(e) => {
                    tracing::warn!("TensorBoard event files of job {id}: {}", e.message);
                    continue;
                }
            }
        }
        let Some(batch) = read_job(*id, w) else { continue };
        let (reply, answer) = tokio::sync::oneshot::channel();
        let sent = batch.files.iter().map(|f| (PathBuf::from(&f.rel), f.damage.is_none().then_some(f.offset))).collect::<Vec<_>>();
        if tx.send(Msg::Ingest { batch: Box::new(batch), reply }).is_err() {
            return Ok(false);
        }
        match answer.blocking_recv() {
            Ok(Ok(())) => w.files.extend(sent),
            Ok(Err(e)) if e.code == trainyard_api::Code::NotFound => {
                // The job names a TensorBoard that is not there: its files are skipped,
                // said in its log once.
                let files = sent.into_iter().map(|(rel, _)| FileRead { rel: rel.to_string_lossy().into_owned(), offset: 0, damage: Some(e.message.clone()), scalars: Vec::new() }).collect();
                let b = Batch { job: *id, project: w.project.clone(), region: w.region.clone(), display_name: w.display_name.clone(), tensorboard: None, files };
                let (reply, answer) = tokio::sync::oneshot::channel();
                if tx.send(Msg::Ingest { batch: Box::new(b), reply }).is_err() {
                    return Ok(false);
                }
                if matches!(answer.blocking_recv(), Ok(Ok(()))) {
                    for f in w.files.values_mut() {
                        *f = None;
                    }
                }
            }
            // Not written (the store is busy, the server stops): read again next pass.
            Ok(Err(e)) => tracing::warn!("TensorBoard event files of job {id}: {}", e.message),
            Err(_) => return Ok(false),
        }
    }
    for id in done {
        watched.remove(&id);
    }
    Ok(true)
}

/// What a job's files gained since the last pass, within the budgets; None when nothing.
fn read_job(id: u64, w: &mut Watched) -> Option<Batch> {
    let found = crate::paths::event_files(&w.logs, MAX_ENTRIES, MAX_DEPTH);
    let mut files = Vec::new();
    for rel in found.passed_over {
        if !w.files.contains_key(&rel) {
            files.push(FileRead { rel: rel.to_string_lossy().into_owned(), offset: 0, damage: Some("it is a link, a FIFO or a device, not a regular file: never read".into()), scalars: Vec::new() });
        }
    }
    let mut budget = JOB_BUDGET;
    for rel in found.files {
        let Some(offset) = w.files.get(&rel).copied().unwrap_or(Some(0)) else { continue };
        if budget == 0 {
            break;
        }
        let buf = match crate::paths::read_file_from(&w.logs, &rel, offset, READ_BUDGET.min(budget)) {
            Ok(b) => b,
            Err(e) => {
                files.push(FileRead { rel: rel.to_string_lossy().into_owned(), offset, damage: Some(format!("it cannot be read: {e}")), scalars: Vec::new() });
                continue;
            }
        };
        budget -= buf.len();
        let r = events::read(&buf, offset);
        if r.consumed == 0 && r.damage.is_none() {
            continue;
        }
        files.push(FileRead { rel: rel.to_string_lossy().into_owned(), offset: offset + r.consumed, damage: r.damage.map(|d| d.to_string()), scalars: r.scalars });
    }
    (!files.is_empty()).then(|| Batch { job: id, project: w.project.clone(), region: w.region.clone(), display_name: w.display_name.clone(), tensorboard: w.tensorboard.clone(), files })
}
