//! From a validated CustomJob to what the lifecycle and the scheduler need: replica
//! counts, quota demand, per-replica resources, the resolved scheduling policy; and from a
//! replica of a job to the program it runs and its environment (L8, L14).

use std::path::{Component, Path, PathBuf};

use crate::paths::{BeneathError, Confined};

use trainyard_api::{ApiError, CustomJob, Strategy};
use trainyard_core::capacity::{amount_text, NeverFit};
use trainyard_core::catalog::{accelerator_metric, Catalog, CPU_METRIC};
use trainyard_core::job::{Demand, Policy, ReplicaDemand, SECOND};
use trainyard_core::schedule::{Fleet, Quotas};
use trainyard_core::Settings;

/// The label that sets a job's hang detection: seconds of silence (0: off).
pub const HANG_AFTER_LABEL: &str = "trainyard-hang-after-secs";
/// The label that restarts a replica reported hung (`true`).
pub const HANG_RESTART_LABEL: &str = "trainyard-hang-restart";

/// What the lifecycle needs of a new job.
#[derive(Clone, Debug)]
pub struct Prepared {
    pub pools: Vec<u32>,
    pub demand: Demand,
    pub policy: Policy,
    /// The job has AIP_CHECKPOINT_DIR (L21).
    pub checkpoints: bool,
}

fn accelerator_of(job: &CustomJob, pool: usize) -> Option<(String, u32)> {
    let ms = job.job_spec.worker_pool_specs[pool].machine_spec.as_ref()?;
    if ms.accelerator_count > 0 && ms.accelerator_type != trainyard_api::AcceleratorType::Unspecified {
        Some((ms.accelerator_type.name().to_string(), ms.accelerator_count as u32))
    } else {
        None
    }
}

fn micros(d: &trainyard_api::Duration) -> i64 {
    d.seconds.saturating_mul(SECOND).saturating_add(d.nanos as i64 / 1000)
}

/// A job's own least run time before a preemption for priority (it may only raise
/// `[scheduler] min_runtime_secs`).
pub const MIN_RUNTIME_LABEL: &str = "trainyard-min-runtime-secs";

/// Check a validated job against the catalog, the fleet (L15: what the region does not
/// offer at all is refused) and the quota limits (L4), and derive its demand and policy.
pub fn prepare(
    job: &CustomJob,
    catalog: &Catalog,
    settings: &Settings,
    fleet: &Fleet,
    quotas: &Quotas,
    priorities: &trainyard_core::schedule::PriorityClasses,
    project: &str,
) -> Result<Prepared, ApiError> {
    let mut pools = Vec::new();
    let mut demand = Demand::default();
    // Pools with replicas: index, machine type (with accelerators), count, demand.
    let mut placed_pools: Vec<(usize, String, u32, ReplicaDemand)> = Vec::new();
    for (i, pool) in job.job_spec.worker_pool_specs.iter().enumerate() {
        let Some(ms) = &pool.machine_spec else {
            pools.push(0);
            continue;
        };
        if pool.replica_count <= 0 {
            pools.push(0);
            continue;
        }
        let path = format!("jobSpec.workerPoolSpecs[{i}].machineSpec");
        let accel = accelerator_of(job, i);
        let mt = catalog
            .check(&ms.machine_type, accel.as_ref().map(|(a, c)| (a.as_str(), *c)))
            .map_err(|e| {
                let field = match e {
                    trainyard_core::catalog::CatalogError::UnknownMachineType(..) => "machineType",
                    trainyard_core::catalog::CatalogError::CountNotAllowed { .. } => "acceleratorCount",
                    _ => "acceleratorType",
                };
                ApiError::invalid_argument(format!("{path}.{field}: {e}"))
            })?;
        let count = pool.replica_count as u32;
        pools.push(count);
        let rd = ReplicaDemand { cpus: mt.vcpus, memory_bytes: mt.memory_bytes, accelerator: accel.clone() };
        let label = format!("{}{}", ms.machine_type, accel.as_ref().map(|(a, c)| format!(" with {c} x {a}")).unwrap_or_default());
        placed_pools.push((i, label, count, rd.clone()));
        *demand.metrics.entry(CPU_METRIC.to_string()).or_insert(0) += mt.vcpus as u64 * count as u64;
        if let Some((a, c)) = &accel {
            *demand.metrics.entry(accelerator_metric(a)).or_insert(0) += *c as u64 * count as u64;
        }
        demand.replicas.extend(std::iter::repeat_n(rd, count as usize));
    }
    // L15: a gang that no node, or no packing onto the whole fleet, could ever hold is
    // refused at create (what is missing only now is a stockout or a wait).
    if let Some((nf, detail)) = fleet.never_fits(&demand.replicas) {
        return Err(ApiError::invalid_argument(never_fit_message(&placed_pools, nf, &detail)));
    }
    // The overcommitting default shares CPU and memory, never GPUs: a job that asks for
    // more GPUs of a type than the node with most of them has could never run (a type no
    // node has runs without, with a warning).
    if fleet.overcommit {
        for (a, need) in demand.accelerators_by_type() {
            let best = fleet.nodes.iter().map(|n| (n.accelerators.get(a).copied().unwrap_or(0), n.name.as_str())).max();
            if let Some((have, node)) = best.filter(|(have, _)| *have > 0 && need > *have as u64) {
                return Err(ApiError::invalid_argument(format!(
                    "jobSpec.workerPoolSpecs: the job asks for {need} {a} GPUs in all, and the largest node, {node}, has {have}: \
                     its replicas run on one node here"
                )));
            }
        }
    }
    // L4: a request above the limit could never run.
    let exceeded = quotas.exceeded_by(project, &demand.metrics);
    if !exceeded.is_empty() {
        return Err(ApiError::resource_exhausted(format!(
            "The following quota metrics exceed quota limits: {}",
            exceeded.join(", ")
        )));
    }
    let mut policy = Policy::defaults(settings);
    if let Some(s) = &job.job_spec.scheduling {
        if let Some(t) = &s.timeout {
            policy.timeout = micros(t);
        }
        policy.restart_job_on_worker_restart = s.restart_job_on_worker_restart;
        policy.disable_retries = s.disable_retries;
        policy.flex_start = s.strategy == Strategy::FlexStart;
        policy.spot = s.strategy == Strategy::Spot;
        if let Some(w) = &s.max_wait_duration {
            policy.max_wait = micros(w);
        }
    }
    // Hang detection per job, by labels (the API has no field for it).
    if let Some(v) = job.labels.get(HANG_AFTER_LABEL) {
        let secs: u64 = v
            .parse()
            .map_err(|_| ApiError::invalid_argument(format!("labels.{HANG_AFTER_LABEL}: {v:?} is not a number of seconds")))?;
        policy.hang_after = (secs as i64).saturating_mul(SECOND);
    }
    if let Some(v) = job.labels.get(HANG_RESTART_LABEL) {
        policy.hang_restart = match v.as_str() {
            "true" => true,
            "false" => false,
            _ => return Err(ApiError::invalid_argument(format!("labels.{HANG_RESTART_LABEL}: {v:?} must be true or false"))),
        };
    }
    if let Some(v) = job.labels.get(MIN_RUNTIME_LABEL) {
        let secs: u64 = v
            .parse()
            .map_err(|_| ApiError::invalid_argument(format!("labels.{MIN_RUNTIME_LABEL}: {v:?} is not a number of seconds")))?;
        policy.min_runtime = trainyard_core::job::secs(secs);
    }
    if let Some(v) = job.labels.get(trainyard_core::job::TRANSIENT_CODES_LABEL) {
        let label = trainyard_core::job::TRANSIENT_CODES_LABEL;
        // Label values allow no commas: codes are separated by "-", "_" or "." too.
        for part in v.split([',', '-', '_', '.']).filter(|p| !p.is_empty()) {
            let code: i32 = part
                .parse()
                .ok()
                .filter(|c| (1..=255).contains(c))
                .ok_or_else(|| ApiError::invalid_argument(format!("labels.{label}: {part:?} is not an exit status (1 to 255)")))?;
            policy.transient_exit_codes.push(code);
        }
    }
    if let Some(v) = job.labels.get(trainyard_core::job::TIMEOUT_WARNING_LABEL) {
        let label = trainyard_core::job::TIMEOUT_WARNING_LABEL;
        let secs: u64 = v.parse().map_err(|_| ApiError::invalid_argument(format!("labels.{label}: {v:?} is not a number of seconds")))?;
        policy.timeout_warning = trainyard_core::job::secs(secs);
    }
    policy.elastic = elastic_pools(job, &pools)?;
    // Its priority class: its label's, else its project's, else the default.
    let label = job.labels.get(trainyard_core::schedule::PRIORITY_CLASS_LABEL).map(String::as_str);
    policy.priority = priorities.priority(label, project).map_err(|e| match e {
        trainyard_core::schedule::PriorityError::Unknown(m) => ApiError::invalid_argument(m),
        trainyard_core::schedule::PriorityError::NotAllowed(m) => ApiError::permission_denied(m),
    })?;
    Ok(Prepared { pools, demand, policy, checkpoints: job.job_spec.base_output_directory.is_some() })
}

/// TY10: the job's elastic pools, from its labels `trainyard-min-replicas-workerpoolN`
/// (`pools[i]`: the replica count of pool i). Refused naming the label: a value that is
/// not a number, below 1 or above the pool's `replicaCount`; the primary pool; a pool
/// with no replicas; a job without PyTorch-style ranks (parameter servers or evaluators,
/// pools 2 and 3, which `TF_CONFIG` names by role).
fn elastic_pools(job: &CustomJob, pools: &[u32]) -> Result<Vec<trainyard_core::job::ElasticPool>, ApiError> {
    use trainyard_core::job::{ElasticPool, ELASTIC_LABEL_PREFIX};
    let mut out = Vec::new();
    for (key, value) in &job.labels {
        let Some(n) = key.strip_prefix(ELASTIC_LABEL_PREFIX) else { continue };
        let bad = |why: String| Err(ApiError::invalid_argument(format!("labels.{key}: {why}")));
        let Some(pool) = n.parse::<usize>().ok().filter(|_| n.bytes().all(|b| b.is_ascii_digit())) else {
            return bad(format!("{n:?} is not a worker pool's index (the label is {ELASTIC_LABEL_PREFIX}N, N from 1 to 3)"));
        };
        if pool == 0 {
            return bad("the primary pool (workerPoolSpecs[0]) cannot be elastic: its replica hosts the job's rendezvous".into());
        }
        let count = pools.get(pool).copied().unwrap_or(0);
        if count == 0 {
            return bad(format!("workerPoolSpecs[{pool}] has no replicas"));
        }
        if pools.iter().skip(2).any(|&c| c > 0) {
            return bad(
                "elastic training needs PyTorch-style ranks (a primary and workers); this job has parameter servers or evaluators                  (workerPoolSpecs[2] or [3])"
                    .into(),
            );
        }
        let Ok(min) = value.parse::<u32>() else {
            return bad(format!("{value:?} is not a number of replicas"));
        };
        if min < 1 || min > count {
            return bad(format!("the minimum must be from 1 to workerPoolSpecs[{pool}].replicaCount ({count}), not {min}"));
        }
        out.push(ElasticPool { pool, min });
    }
    Ok(out)
}

/// The refusal of a job that can never fit, naming its pool(s) and the largest node.
fn never_fit_message(pools: &[(usize, String, u32, ReplicaDemand)], nf: NeverFit, detail: &str) -> String {
    let each = |d: &ReplicaDemand| {
        amount_text(
            d.cpus as i64,
            d.memory_bytes.min(i64::MAX as u64) as i64,
            d.accelerator.as_ref().map(|(a, c)| (a.as_str(), *c as i64)),
        )
    };
    match nf {
        NeverFit::Replica(r) => {
            // Replica `r` is in the pool whose replicas it counts into.
            let mut first = 0usize;
            let pool = pools.iter().find(|(_, _, count, _)| {
                first += *count as usize;
                r < first
            });
            match pool {
                Some((i, label, _, _)) => format!("jobSpec.workerPoolSpecs[{i}]: a replica of {label} {detail}"),
                None => format!("jobSpec.workerPoolSpecs: a replica {detail}"),
            }
        }
        NeverFit::Gang => {
            let total: u32 = pools.iter().map(|p| p.2).sum();
            let same = pools.windows(2).all(|w| w[0].3 == w[1].3);
            let list: Vec<String> = pools
                .iter()
                .map(|(i, label, count, d)| {
                    if same {
                        format!("workerPoolSpecs[{i}]: {count} x {label}")
                    } else {
                        format!("workerPoolSpecs[{i}]: {count} x {label} of {}", each(d))
                    }
                })
                .collect();
            let what = match (same, pools.first()) {
                (true, Some((_, _, _, d))) => format!("{total} replicas of {}", each(d)),
                _ => format!("{total} replicas"),
            };
            let path = match pools {
                [(i, ..)] => format!("jobSpec.workerPoolSpecs[{i}]"),
                _ => "jobSpec.workerPoolSpecs".to_string(),
            };
            format!("{path}: the job's {what} ({}) {detail}", list.join("; "))
        }
    }
}

/// Where a URI a job names is on this host (its `baseOutputDirectory`, its
/// `packageUris`), decided from the text alone (nothing on disk is looked at, so a refusal
/// says nothing about the host's files):
/// - `gs://BUCKET/X` is `X` of `BUCKET` in the project's namespace of the storage root,
///   `<storage_root>/<project>/BUCKET/X`: one project's `gs://shared` is not another's;
/// - `/abs` and `file:///abs` only below one of the configured output roots (`roots`);
///   never the data directory or the server's working directory (refused as roots at
///   start), nor the storage root (other projects' namespaces).
///
/// No `..` or `.` segment. Errors are 400 naming `field`.
pub fn resolve_uri(uri: &str, project: &str, storage_root: &Path, roots: &[PathBuf], field: &str) -> Result<Confined, ApiError> {
    let bad = |why: &str| ApiError::invalid_argument(format!("{field}: \"{uri}\" {why}"));
    if uri.contains('\0') {
        return Err(bad("must not contain a NUL character"));
    }
    if let Some(rest) = uri.strip_prefix("gs://") {
        let segments: Vec<&str> = rest.split('/').filter(|s| !s.is_empty()).collect();
        if rest.starts_with('/') || segments.is_empty() {
            return Err(bad("has no bucket name"));
        }
        if segments.iter().any(|s| *s == ".." || *s == ".") {
            return Err(bad("must not contain \"..\" or \".\" segments"));
        }
        let plain = !project.is_empty() && project != "." && project != ".." && !project.contains(['/', '\0']);
        if !plain {
            return Err(bad(&format!("cannot be stored: the project id {project:?} cannot name a storage namespace")));
        }
        let rel: PathBuf = std::iter::once(project).chain(segments).collect();
        return Confined::new(storage_root, rel).ok_or_else(|| bad("is not a plain path"));
    }
    let path = PathBuf::from(uri.strip_prefix("file://").unwrap_or(uri));
    if !path.is_absolute() {
        return Err(bad("must be a gs:// URI, a file:// URI or an absolute path"));
    }
    if path.components().any(|c| matches!(c, Component::ParentDir)) {
        return Err(bad("must not contain \"..\""));
    }
    for root in roots {
        if let Ok(rel) = path.strip_prefix(root) {
            if let Some(c) = Confined::new(root, rel) {
                return Ok(c);
            }
        }
    }
    let allowed = if roots.is_empty() {
        "no output_roots are configured".to_string()
    } else {
        format!("output_roots: {}", roots.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", "))
    };
    Err(bad(&format!(
        "is outside what this server lets jobs use: a gs://BUCKET/... URI (the project's storage) or a path under an \
         output root ({allowed})"
    )))
}

/// The paths of a job spec, checked at create from their text alone (`prefix` is
/// `jobSpec`, `trialJobSpec` or `trainingTaskInputs`): `baseOutputDirectory` and every
/// `pythonPackageSpec.packageUris[j]` in the project's storage or under an output root (a
/// refusal does not tell whether a host file exists). What is looked at on disk is
/// [`OnDisk`]'s, before the driver gets the create.
pub fn check_paths(
    spec: &trainyard_api::CustomJobSpec,
    prefix: &str,
    project: &str,
    storage_root: &Path,
    roots: &[PathBuf],
) -> Result<(), ApiError> {
    if let Some(out) = &spec.base_output_directory {
        let field = format!("{prefix}.baseOutputDirectory.outputUriPrefix");
        resolve_uri(&out.output_uri_prefix, project, storage_root, roots, &field)?;
    }
    for (i, pool) in spec.worker_pool_specs.iter().enumerate() {
        let Some(p) = &pool.python_package_spec else { continue };
        for (j, uri) in p.package_uris.iter().enumerate() {
            let field = format!("{prefix}.workerPoolSpecs[{i}].pythonPackageSpec.packageUris[{j}]");
            resolve_uri(uri, project, storage_root, roots, &field)?;
        }
    }
    Ok(())
}

/// Where a job's paths lead: the storage root, the output roots and the data directory.
#[derive(Clone, Debug, Default)]
pub struct PathRoots {
    pub storage_root: PathBuf,
    pub output_roots: Vec<PathBuf>,
    pub data_dir: PathBuf,
}

impl PathRoots {
    /// The configuration's storage root and data directory, with these output roots.
    pub fn new(cfg: &crate::config::Config, output_roots: Vec<PathBuf>) -> PathRoots {
        PathRoots { storage_root: cfg.storage_root.clone(), output_roots, data_dir: cfg.data_dir.clone() }
    }
}

/// What of a new job is looked at on disk at create: its output directory (no symbolic
/// link on the way that exists now: the server never follows one, see `paths`) and its
/// `trainyardHostDirectories`. Checked by the API's create (off the async executor) before
/// the driver gets the job, whose thread never touches a file.
#[derive(Clone, Debug, Default)]
pub struct OnDisk {
    /// The field's name and the output directory's URI.
    pub output: Option<(String, String)>,
    pub host_directories: Vec<String>,
}

impl OnDisk {
    /// Of a job spec (`prefix` as for [`check_paths`]) and the job's host directories.
    pub fn of(spec: &trainyard_api::CustomJobSpec, prefix: &str, host_directories: &[String]) -> OnDisk {
        let output =
            spec.base_output_directory.as_ref().map(|o| (format!("{prefix}.baseOutputDirectory.outputUriPrefix"), o.output_uri_prefix.clone()));
        OnDisk { output, host_directories: host_directories.to_vec() }
    }

    /// Nothing to look at.
    pub fn is_empty(&self) -> bool {
        self.output.is_none() && self.host_directories.is_empty()
    }

    /// Reads the disk: INVALID_ARGUMENT naming the field at fault.
    pub fn check(&self, project: &str, roots: &PathRoots) -> Result<(), ApiError> {
        if let Some((field, uri)) = &self.output {
            let dir = resolve_uri(uri, project, &roots.storage_root, &roots.output_roots, field)?;
            if let Err(BeneathError::Symlink { at }) = dir.check_no_symlinks() {
                let name = at.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                return Err(ApiError::invalid_argument(format!(
                    "{field}: \"{uri}\" passes through a symbolic link ({name:?}), which this server does not follow"
                )));
            }
        }
        check_host_directories(&self.host_directories, &roots.data_dir, &roots.storage_root)
    }
}

/// `trainyardHostDirectories`, checked at create: each an existing directory (reached
/// without a symbolic link), neither inside nor holding the data directory or the storage
/// root (the server's own files and every project's storage stay out of reach).
pub fn check_host_directories(dirs: &[String], data_dir: &Path, storage_root: &Path) -> Result<(), ApiError> {
    let canon = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    let (data, storage) = (canon(data_dir), canon(storage_root));
    for (i, d) in dirs.iter().enumerate() {
        let field = format!("trainyardHostDirectories[{i}]");
        let path = Path::new(d);
        let real = std::fs::canonicalize(path)
            .map_err(|e| ApiError::invalid_argument(format!("{field}: {d:?} cannot be used on this server's host: {e}")))?;
        if real != path {
            return Err(ApiError::invalid_argument(format!(
                "{field}: {d:?} passes through a symbolic link (it is {}), which this server does not follow",
                real.display()
            )));
        }
        if !real.is_dir() {
            return Err(ApiError::invalid_argument(format!("{field}: {d:?} is not a directory")));
        }
        for (what, own) in [("data directory", &data), ("storage root", &storage)] {
            if real.starts_with(own) || own.starts_with(&real) {
                return Err(ApiError::invalid_argument(format!(
                    "{field}: {d:?} is, holds or is inside the server's {what}, which jobs never see whole"
                )));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use trainyard_core::schedule::Node;

    /// A pool: machine type, replica count, and an accelerator type and count.
    type Pool<'a> = (&'a str, u32, Option<(&'a str, u32)>);
    /// A node: name, CPUs, memory in GiB, and an accelerator type and count.
    type NodeSpec<'a> = (&'a str, u32, u64, Option<(&'a str, u32)>);

    fn job(pools: &[Pool<'_>]) -> CustomJob {
        let specs: Vec<serde_json::Value> = pools
            .iter()
            .map(|(mt, n, acc)| {
                let mut ms = serde_json::json!({"machineType": mt});
                if let Some((a, c)) = acc {
                    ms["acceleratorType"] = (*a).into();
                    ms["acceleratorCount"] = (*c).into();
                }
                serde_json::json!({"machineSpec": ms, "replicaCount": n.to_string(),
                                   "containerSpec": {"imageUri": "i", "command": ["true"]}})
            })
            .collect();
        let body = serde_json::json!({"displayName": "x", "jobSpec": {"workerPoolSpecs": specs}});
        trainyard_api::parse_custom_job(body.to_string().as_bytes()).expect("a valid job")
    }

    fn fleet(nodes: &[NodeSpec<'_>]) -> Fleet {
        let nodes = nodes
            .iter()
            .map(|(name, cpus, gib, acc)| Node {
                name: name.to_string(),
                cpus: *cpus,
                memory_bytes: gib << 30,
                accelerators: acc.iter().map(|(a, c)| (a.to_string(), *c)).collect(),
                up: true,
                schedulable: true,
            })
            .collect();
        Fleet { nodes, overcommit: false }
    }

    fn refusal(job: &CustomJob, fleet: &Fleet) -> String {
        match prepare(job, &Catalog::builtin(), &Settings::default(), fleet, &Quotas::default(), &Default::default(), "p") {
            Ok(_) => panic!("accepted"),
            Err(e) => {
                assert_eq!(e.code, trainyard_api::Code::InvalidArgument, "{}", e.message);
                e.message
            }
        }
    }

    /// L15: a job that can never be placed on the fleet is refused, naming the pool and
    /// the largest node; the overcommitting default refuses none of them.
    #[test]
    fn never_fitting_jobs_are_refused_naming_pool_and_largest_node() {
        let two = fleet(&[("n1", 4, 16, None), ("n2", 4, 16, None)]);
        let too_large = job(&[("n1-standard-4", 1, None), ("n1-standard-8", 1, None)]);
        assert_eq!(
            refusal(&too_large, &two),
            "jobSpec.workerPoolSpecs[1]: a replica of n1-standard-8 needs 8 CPUs and 30 GiB, but the largest node (n1) has 4 CPUs and 16 GiB"
        );
        let gang = job(&[("n1-standard-4", 1, None), ("n1-standard-4", 2, None)]);
        assert_eq!(
            refusal(&gang, &two),
            "jobSpec.workerPoolSpecs: the job's 3 replicas of 4 CPUs and 15 GiB (workerPoolSpecs[0]: 1 x n1-standard-4; \
             workerPoolSpecs[1]: 2 x n1-standard-4) cannot be placed together on the fleet: 2 nodes of 4 CPUs and 16 GiB; \
             the largest node (n1) has 4 CPUs and 16 GiB"
        );
        let gpus = fleet(&[("cpu", 16, 64, None), ("g1", 8, 32, Some(("NVIDIA_TESLA_T4", 1)))]);
        let t4 = job(&[("n1-standard-4", 1, Some(("NVIDIA_TESLA_T4", 2)))]);
        assert_eq!(
            refusal(&t4, &gpus),
            "jobSpec.workerPoolSpecs[0]: a replica of n1-standard-4 with 2 x NVIDIA_TESLA_T4 needs 4 CPUs, 15 GiB and \
             2 x NVIDIA_TESLA_T4, but the largest node with NVIDIA_TESLA_T4 (g1) has 8 CPUs, 32 GiB and 1 x NVIDIA_TESLA_T4"
        );
        let t4s = job(&[("n1-standard-4", 1, Some(("NVIDIA_TESLA_T4", 1))), ("n1-standard-4", 1, Some(("NVIDIA_TESLA_T4", 1)))]);
        let m = refusal(&t4s, &gpus);
        assert!(m.starts_with("jobSpec.workerPoolSpecs: the job's 2 replicas of 4 CPUs, 15 GiB and 1 x NVIDIA_TESLA_T4"), "{m}");
        // What fits is accepted; the default fleet overcommits and refuses nothing.
        let fits = job(&[("n1-standard-4", 1, None), ("n1-standard-4", 1, None)]);
        assert!(prepare(&fits, &Catalog::builtin(), &Settings::default(), &two, &Quotas::default(), &Default::default(), "p").is_ok());
        let mut laptop = fleet(&[("local", 2, 4, None)]);
        laptop.overcommit = true;
        for j in [&too_large, &gang, &t4, &t4s] {
            assert!(prepare(j, &Catalog::builtin(), &Settings::default(), &laptop, &Quotas::default(), &Default::default(), "p").is_ok());
        }
    }

    #[test]
    fn uris_map_into_the_project_namespace_and_refuse_escapes() {
        let root = Path::new("/data/storage");
        let roots = vec![PathBuf::from("/scratch")];
        let f = "jobSpec.baseOutputDirectory.outputUriPrefix";
        let ok = |uri: &str, project: &str| resolve_uri(uri, project, root, &roots, f).unwrap();
        assert_eq!(ok("gs://b/x/y", "p"), Confined { root: root.into(), rel: "p/b/x/y".into() });
        assert_eq!(ok("gs://b/x/y", "p").path(), PathBuf::from("/data/storage/p/b/x/y"));
        assert_eq!(ok("gs://b/x/y", "q").path(), PathBuf::from("/data/storage/q/b/x/y"), "another project, another place");
        assert_eq!(ok("gs://b//x/", "p").rel, PathBuf::from("p/b/x"));
        assert_eq!(ok("file:///scratch/o", "p"), Confined { root: "/scratch".into(), rel: "o".into() });
        assert_eq!(ok("/scratch/o/", "p").path(), PathBuf::from("/scratch/o"));
        for bad in [
            "gs://b/../../etc",
            "gs://../x",
            "gs://./x",
            "/etc/passwd",
            "/tmp/o",
            "/data/storage/q/b",
            "/data/trainyard.db",
            "relative/dir",
            "gs://",
            "gs:///x",
            "file:///scratch/../etc",
            "/scratchy/x",
        ] {
            let e = resolve_uri(bad, "p", root, &roots, f).unwrap_err();
            assert_eq!(e.code, trainyard_api::Code::InvalidArgument);
            assert!(e.message.starts_with(f), "{bad}: {}", e.message);
        }
        for project in ["..", ".", "a/b", ""] {
            let e = resolve_uri("gs://b/x", project, root, &roots, f).unwrap_err();
            assert!(e.message.contains("storage namespace"), "{project}: {}", e.message);
        }
        // Without output roots, only gs:// is usable.
        assert!(resolve_uri("/scratch/o", "p", root, &[], f).unwrap_err().message.contains("no output_roots are configured"));
    }
}
