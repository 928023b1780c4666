//! `CustomJob`: its names, how it is shown (the stored request with the lifecycle's state,
//! L1, L2, and the waiting reason readers see), and its [`ResourceKind`]. Its lifecycle is the
//! core's `step`.

use serde_json::Value;
use trainyard_api::{ApiError, CustomJob, JobState, Status, Timestamp};
use trainyard_core::Job;
use trainyard_store::{Store, StoredJob};

use super::kind::{checked, Create, Kind, Page, Reply, ResourceKind, View};
use super::waiting::WaitingView;
use crate::reply::internal;

/// Its key in the store.
pub const KIND_CUSTOM: &str = "custom";

pub fn job_name(project: &str, region: &str, id: u64) -> String {
    format!("projects/{project}/locations/{region}/customJobs/{id}")
}

/// The resource as the API shows it: the stored request with the output fields of the
/// lifecycle state (L1, L2).
pub fn render(resource: &CustomJob, job: &Job) -> CustomJob {
    let mut r = resource.clone();
    r.name = job_name(&job.project, &job.region, job.id);
    r.state = JobState::from_name(job.state().wire_name()).unwrap_or(JobState::Unspecified);
    r.create_time = Some(Timestamp::from_micros(job.create_time));
    r.update_time = Some(Timestamp::from_micros(job.update_time));
    r.start_time = job.start_time.map(Timestamp::from_micros);
    r.end_time = job.end_time().map(Timestamp::from_micros);
    r.error = job.error().map(|e| Status { code: e.code, message: e.message.clone(), details: Vec::new() });
    r.trainyard_waiting_reason = match job.state() {
        trainyard_core::State::Queued | trainyard_core::State::Pending => job.waiting_reason.clone().unwrap_or_default(),
        _ => String::new(),
    };
    r.trainyard_goodput = Some(goodput_of(job));
    r.trainyard_health = (job.state() == trainyard_core::State::Running).then(|| {
        use trainyard_core::job::Health;
        let (state, replica, since) = match job.health() {
            Health::Ok => ("ok", String::new(), None),
            Health::Straggler { replica, since } => ("straggler", replica, Some(since)),
            Health::Hang { replica, since } => ("hang", replica, Some(since)),
        };
        trainyard_api::types::TrainyardHealth { state: state.into(), replica, since: since.map(Timestamp::from_micros) }
    });
    r
}

/// TY10: the job's goodput up to its end, or up to now while it lives.
pub fn goodput_of(job: &Job) -> trainyard_api::types::TrainyardGoodput {
    use trainyard_api::types::{GoodputSplit, TrainyardGoodput};
    use trainyard_core::goodput::{Goodput, Split};
    let now = job.end_time().unwrap_or_else(|| Timestamp::now().micros());
    let g = Goodput::until(job, now.max(job.update_time));
    let secs = |us: i64| (us as f64 / 1e6 * 1000.0).round() / 1000.0;
    let split = |s: &Split| GoodputSplit {
        queued: secs(s.queued),
        starting: secs(s.starting),
        productive: secs(s.productive),
        idle: secs(s.idle),
        lost: secs(s.lost),
    };
    TrainyardGoodput {
        goodput: g.ratio().map_or(0.0, |r| (r * 1000.0).round() / 1000.0),
        wall_seconds: split(&g.wall),
        accelerator_seconds: split(&g.accelerator),
    }
}

/// `CustomJob`: rows read typed (`StoredJob`, whose lifecycle state the store decodes and
/// replaces by a FAILED stand-in when it is damaged); queued and pending jobs show the
/// waiting reason of the latest scheduling round.
pub enum CustomJobs {}

impl ResourceKind for CustomJobs {
    const COLLECTION: &'static str = "customJobs";
    const STORE_KIND: &'static str = KIND_CUSTOM;
    const KIND: Kind = Kind::CustomJob;
    const API_NAME: &'static str = "CustomJob";
    type New = CustomJob;
    type Created = CustomJob;
    type Row = StoredJob;

    fn parse(body: &[u8]) -> Result<CustomJob, ApiError> {
        checked(body, trainyard_api::parse_custom_job, trainyard_api::validate_custom_job)
    }

    fn create(resource: Self::New, reply: Reply<Self::Created>) -> Create {
        Create::CustomJob { resource: Box::new(resource), reply }
    }

    fn on_disk(resource: &CustomJob) -> crate::jobspec::OnDisk {
        crate::jobspec::OnDisk::of(&resource.job_spec, "jobSpec", &resource.trainyard_host_directories)
    }

    fn stored_place(row: &StoredJob) -> Option<(String, String)> {
        Some((row.job.project.clone(), row.job.region.clone()))
    }

    fn read(store: &Store, project: &str, region: &str, id: u64) -> trainyard_store::Result<Option<StoredJob>> {
        store.get_job(KIND_CUSTOM, project, region, id)
    }

    fn read_page(store: &Store, project: &str, region: &str, page: &Page<'_>) -> trainyard_store::Result<Vec<StoredJob>> {
        store.list_jobs(KIND_CUSTOM, project, region, page.filter, page.before, page.limit)
    }

    fn id(row: &StoredJob) -> u64 {
        row.job.id
    }

    fn live_state(row: &StoredJob) -> Option<&'static str> {
        (!row.job.is_terminal()).then(|| row.job.state().wire_name())
    }

    fn render(row: &StoredJob, waiting: &WaitingView, _view: View) -> Result<Value, ApiError> {
        serde_json::to_value(show_custom_job(row, waiting)).map_err(internal)
    }

    /// `webAccessUris` of a running job with `enableWebAccess`: each replica's terminal in
    /// the console (the managed service gives each replica an interactive shell's URI).
    fn add_links(row: &StoredJob, shown: &mut Value, base: &str) {
        let uris = web_access_uris(row, shown, base);
        if let (false, Some(m)) = (uris.is_empty(), shown.as_object_mut()) {
            m.insert("webAccessUris".into(), Value::Object(uris));
        }
    }
}

/// Each replica's terminal page of a running job that asked for web access (none else),
/// by the replicas the job has.
fn web_access_uris(row: &StoredJob, shown: &Value, base: &str) -> serde_json::Map<String, Value> {
    if shown["jobSpec"]["enableWebAccess"] != Value::Bool(true) || shown["state"] != "JOB_STATE_RUNNING" {
        return serde_json::Map::new();
    }
    // A query value: what is not unreserved (RFC 3986) escaped.
    const VALUE: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC.remove(b'-').remove(b'_').remove(b'.').remove(b'~');
    let enc = |s: &str| percent_encoding::utf8_percent_encode(s, VALUE).to_string();
    let job = &row.job;
    let page = format!("{base}/console?project={}&region={}#/jobs/{}/terminal/", enc(&job.project), enc(&job.region), job.id);
    job.replicas.iter().map(|r| (r.name.clone(), Value::String(format!("{page}{}", r.name)))).collect()
}

/// A stored CustomJob as the API shows it. A resource that cannot be read is shown, not
/// hidden behind an error: its stand-in says FAILED with the damage, under its display name.
fn show_custom_job(stored: &StoredJob, waiting: &WaitingView) -> CustomJob {
    let mut job = match serde_json::from_str::<CustomJob>(&stored.resource) {
        Ok(r) => render(&r, &stored.job),
        Err(e) => {
            let j = &stored.job;
            let damaged = trainyard_core::Job::damaged(j.id, j.project.clone(), j.region.clone(), j.create_time, j.update_time, &format!("its resource: {e}"));
            render(&CustomJob { display_name: stored.display_name.clone(), ..CustomJob::default() }, &damaged)
        }
    };
    if !job.trainyard_waiting_reason.is_empty() {
        if let Some(reason) = waiting.get(stored.job.id, &stored.job.project) {
            job.trainyard_waiting_reason = reason;
        }
    }
    if job.trainyard_health.is_some() {
        job.trainyard_progress = waiting.progress(stored.job.id);
    }
    job
}
