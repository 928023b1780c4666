//! What a run asks of Slurm: its resources (L14: memory; CPUs, GPUs and the time limit of
//! L19 as a backstop) and the `sbatch` arguments they become.

use super::*;

/// The resources of one run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Request {
    pub cpus: u32,
    pub memory_mb: Option<u64>,
    pub gpus: u32,
    /// `--time` in minutes.
    pub time_minutes: Option<u64>,
}

/// `--time` for a job timeout: the timeout plus the grace period plus a minute, in whole
/// minutes (Slurm's limit is only a backstop behind Trainyard's own L19 deadline).
pub(super) fn time_limit_minutes(timeout_secs: f64, grace_seconds: f64) -> u64 {
    let total = timeout_secs.max(0.0) + grace_seconds.max(0.0) + 60.0;
    (total / 60.0).ceil() as u64
}

/// The run's request: the memory limit of the spec, and the vCPUs, accelerator count and
/// job timeout of `spec.resources`, which the driver sets for every run. A spec without
/// them (written by an older server, read again on adoption or a resumed submission) falls
/// back to the job spec that the program's `CLUSTER_SPEC` carries (`"job"`), with the
/// built-in machine-type catalog.
pub fn request_for(run: &RunId, spec: &ShimSpec) -> Request {
    let memory_mb = spec.memory_limit_bytes.map(|b| b.div_ceil(1024 * 1024));
    let res = &spec.resources;
    if *res != crate::shim::Resources::default() {
        return Request {
            cpus: res.cpus.unwrap_or(1).max(1),
            memory_mb,
            gpus: res.accelerator.as_ref().map(|(_, n)| *n).unwrap_or(0),
            time_minutes: res.timeout_secs.map(|t| time_limit_minutes(t as f64, spec.grace_seconds)),
        };
    }
    request_from_cluster_spec(run, spec, memory_mb)
}

/// The fallback of [`request_for`]: machine type, accelerator count and timeout read from
/// `CLUSTER_SPEC`.
pub(super) fn request_from_cluster_spec(run: &RunId, spec: &ShimSpec, memory_mb: Option<u64>) -> Request {
    let mut r = Request { cpus: 1, memory_mb, gpus: 0, time_minutes: None };
    let pool: Option<usize> =
        run.replica.strip_prefix("workerpool").and_then(|s| s.split('-').next()).and_then(|p| p.parse().ok());
    let job: Option<serde_json::Value> = spec
        .env
        .iter()
        .find(|(k, _)| k == "CLUSTER_SPEC")
        .and_then(|(_, v)| serde_json::from_str::<serde_json::Value>(v).ok())
        .and_then(|cs| match &cs["job"] {
            serde_json::Value::String(s) => serde_json::from_str(s).ok(),
            v @ serde_json::Value::Object(_) => Some(v.clone()),
            _ => None,
        });
    let Some(job) = job else { return r };
    let pools = job.get("workerPoolSpecs").or_else(|| job.get("worker_pool_specs"));
    if let (Some(pool), Some(pools)) = (pool, pools) {
        let machine = &pools[pool]["machineSpec"];
        if let Some(mt) = machine["machineType"].as_str() {
            if let Some(m) = trainyard_core::catalog::Catalog::builtin().get(mt) {
                r.cpus = m.vcpus.max(1);
            }
        }
        let count = &machine["acceleratorCount"];
        r.gpus = count.as_u64().or_else(|| count.as_str().and_then(|s| s.parse().ok())).unwrap_or(0) as u32;
    }
    if let Some(t) = job["scheduling"]["timeout"].as_str() {
        if let Some(secs) = t.strip_suffix('s').and_then(|s| s.parse::<f64>().ok()) {
            r.time_minutes = Some(time_limit_minutes(secs, spec.grace_seconds));
        }
    }
    r
}

/// The partition of a request (`gpu_partition` for one with GPUs), and the request reduced
/// to the partition's largest node with `fit_to_nodes`.
pub(super) fn partition_for(opts: &SlurmOptions, sizes: &HashMap<String, NodeSize>, mut req: Request) -> (String, Request) {
    let partition = match (&opts.gpu_partition, req.gpus) {
        (Some(g), n) if n > 0 => g.clone(),
        _ => opts.partition.clone(),
    };
    if opts.fit_to_nodes {
        if let Some(size) = sizes.get(&partition) {
            req.cpus = req.cpus.min(size.cpus.max(1));
            req.memory_mb = req.memory_mb.map(|m| m.min(size.memory_mb.max(1)));
        }
    }
    (partition, req)
}

/// The `sbatch` arguments of a run (see the module docs).
pub(super) fn sbatch_args(opts: &SlurmOptions, sizes: &HashMap<String, NodeSize>, run: &RunId, run_dir: &Path, spec: &ShimSpec) -> Vec<OsString> {
    let (partition, req) = partition_for(opts, sizes, request_for(run, spec));
    let mut a: Vec<OsString> = os(&["--parsable", "--no-requeue", "--open-mode=append"]);
    a.push(format!("--job-name={}", job_name(run)).into());
    a.push(format!("--partition={partition}").into());
    if let Some(mb) = req.memory_mb {
        a.push(format!("--mem={mb}M").into());
    }
    a.push(format!("--cpus-per-task={}", req.cpus).into());
    if req.gpus > 0 {
        a.push(format!("--gres=gpu:{}", req.gpus).into());
    }
    push_time_and_dirs(&mut a, req.time_minutes, run_dir);
    let mut wrap = String::from("exec");
    for part in opts.shim_command.iter().map(|s| s.as_bytes()).chain([run_dir.as_os_str().as_bytes()]) {
        wrap.push(' ');
        wrap.push_str(&sh_quote(part));
    }
    a.push("--wrap".into());
    a.push(wrap.into());
    a
}

/// `--time`, `--chdir=<dir>` and `--output=<dir>/slurm.out` of a batch job.
pub(super) fn push_time_and_dirs(a: &mut Vec<OsString>, time_minutes: Option<u64>, dir: &Path) {
    if let Some(m) = time_minutes {
        a.push(format!("--time={m}").into());
    }
    let mut chdir = OsString::from("--chdir=");
    chdir.push(dir);
    a.push(chdir);
    let mut out = OsString::from("--output=");
    out.push(dir.join(SLURM_OUT_FILE));
    a.push(out);
}
