//! Launch planning: the program, environment (L8) and memory limit (L14) of a run, and
//! handing committed effects to the executor.

use super::*;
use crate::executor::{PackageCheck, Planned, Work};
use crate::identity::Grant;
use trainyard_backend::container::{container_name, ContainerSpec, Mount};

/// A failed purge: its job, its failures so far, and when it is tried again (None: under
/// way).
pub(super) struct PurgeRetry {
    pub(super) job: u64,
    pub(super) tries: u32,
    pub(super) at: Option<Micros>,
}

/// Failures after which a purge is given up (`retry::PURGE`).
const PURGE_TRIES: u32 = match trainyard_core::retry::PURGE.give_up_after {
    Some(n) => n,
    None => u32::MAX,
};

/// A launch the engine could not take, to try again at `at`.
pub(super) struct Later {
    pub(super) at: Micros,
    pub(super) run: RunId,
    /// Its outbox entry, done once it is launched.
    pub(super) seq: i64,
    pub(super) tries: u32,
}

impl Driver {
    /// Hand committed effects to the executor (L23: each leaves the outbox when the
    /// executor reports it done, a stop when its run is seen gone).
    pub(super) fn execute(&mut self, id: u64, effects: Vec<(i64, Effect)>) {
        let mut done = Vec::with_capacity(effects.len());
        let mut gang = Vec::new();
        for (seq, effect) in effects {
            match effect {
                Effect::Launch { run, .. } => match self.plan(id, &run, seq) {
                    Some(p) => gang.push(p),
                    None => done.push(seq),
                },
                Effect::Stop { run, .. } => {
                    if !self.stop_run(seq, run) {
                        done.push(seq);
                    }
                }
                Effect::Log(_) => done.push(seq),
                Effect::Purge { job } => self.purge(seq, job),
                Effect::NodeFailed { node, replica, what } => {
                    self.node_failed(id, &node, replica, what);
                    done.push(seq);
                }
                Effect::Signal { run, signal } => {
                    let dir = run_dir(&self.svc.cfg.data_dir, &run);
                    self.exec.submit(Work::Signal { run, dir, signal, notice: None });
                    done.push(seq);
                }
                Effect::Notice { run, signal, reason, deadline } => {
                    // TY11: the notice file, then the warning signal.
                    let dir = run_dir(&self.svc.cfg.data_dir, &run);
                    let file = self.svc.cfg.data_dir.join(progress_rel(run.job, &run.replica)).join(NOTICE_FILE);
                    let name = trainyard_core::job::warning_signal_name(signal);
                    let text = serde_json::json!({
                        "reason": reason,
                        "deadline": trainyard_api::Timestamp::from_micros(deadline).to_rfc3339(),
                        "signal": name,
                    })
                    .to_string();
                    self.exec.submit(Work::Signal { run, dir, signal, notice: Some((file, text + "\n")) });
                    done.push(seq);
                }
            }
        }
        // L6: every replica of the attempt starts at once.
        if !gang.is_empty() {
            self.exec.submit(Work::Launch(gang));
        }
        self.effects_done(&done);
    }

    /// Remove a deleted job's directories (off this thread).
    fn purge(&mut self, seq: i64, job: u64) {
        let d = &self.svc.cfg.data_dir;
        let dirs = ["runs", "venvs", "trials", "progress"].iter().map(|k| d.join(k).join(job.to_string())).collect();
        self.purge_tries.entry(seq).or_insert(PurgeRetry { job, tries: 0, at: None }).at = None;
        self.exec.submit(Work::Purge { seq, dirs });
    }

    /// A purge failed (or panicked): tried again after the core's backoff
    /// (`retry::PURGE`: 1 s doubling to 60 s), and after its tries given up: its outbox entry is
    /// done, the error logged and counted (`trainyard_effects_failed_total`). The server
    /// goes on either way; a restart tries a pending purge again from the start.
    pub(super) fn purge_failed(&mut self, seq: i64, error: String, now: Micros) -> Result<(), StoreError> {
        let Some(p) = self.purge_tries.get_mut(&seq) else { return Ok(()) };
        p.tries += 1;
        let Some(backoff) = trainyard_core::retry::PURGE.delay(p.tries) else {
            let job = p.job;
            self.purge_tries.remove(&seq);
            tracing::error!(
                "job {job}: removing the deleted job's files failed {PURGE_TRIES} times; given up (remove runs/{job}, \
                 venvs/{job} and trials/{job} of the data directory by hand): {error}"
            );
            self.metrics.effect_failed("purge");
            return self.store.outbox_done(seq);
        };
        p.at = Some(now + backoff);
        tracing::warn!("job {}: removing the deleted job's files failed (try {} of {PURGE_TRIES}): {error}", p.job, p.tries);
        Ok(())
    }

    /// Purges whose backoff has passed, tried again.
    pub(super) fn retry_purges(&mut self, now: Micros) {
        let due: Vec<(i64, u64)> =
            self.purge_tries.iter().filter(|(_, p)| p.at.is_some_and(|at| at <= now)).map(|(s, p)| (*s, p.job)).collect();
        for (seq, job) in due {
            self.purge(seq, job);
        }
    }

    /// Everything a launch needs, or None when it will not happen (an outcome was
    /// reported instead).
    pub(super) fn plan(&mut self, id: u64, run: &RunId, seq: i64) -> Option<Planned> {
        let project = self.jobs.get(&id)?.job.project.clone();
        let run_as = match self.project_identity(&project) {
            Ok(id) => id,
            Err(message) => {
                (self.sink())(BackendEvent::Exited { run: run.clone(), outcome: Outcome::LaunchFailed { message }, stderr_tail: Vec::new() });
                return None;
            }
        };
        let live = self.jobs.get(&id)?;
        let node = live.job.replica(&run.replica).and_then(|r| r.node.clone()).unwrap_or_default();
        match launch_plan(&self.svc, live, run, run_as) {
            Ok((spec, dirs, grants, packages)) => {
                let credentials = credential_file(&self.svc, run)
                    .zip(credential_json(&self.svc, id, &project))
                    .map(|(path, contents)| crate::executor::SecretFile { path, contents });
                let launch = Launch { run: run.clone(), run_dir: run_dir(&self.svc.cfg.data_dir, run), spec, node };
                // L21: a restarted or retried replica is told of the newest checkpoint.
                let checkpoints = (run.attempt > 0 || run.restart > 0)
                    .then(|| {
                        let base = live.resource.job_spec.base_output_directory.as_ref()?;
                        resolve_uri(&base.output_uri_prefix, &project, &self.svc.cfg.storage_root, &self.svc.output_roots, "").ok()
                    })
                    .flatten()
                    .map(|b| b.join("checkpoints"));
                let trust = trust_file(&self.svc, run)
                    .zip(server_ca(&self.svc))
                    .map(|(path, server_ca)| crate::executor::TrustBundle { path, server_ca });
                let hosts = hosts_file(&self.svc, run)
                    .zip(hosts_lines(&self.svc))
                    .map(|(path, lines)| crate::executor::HostsFile { path, lines });
                Some(Planned { seq, launch, dirs, grants, credentials, trust, hosts, checkpoints, packages })
            }
            Err(outcome) => {
                (self.sink())(BackendEvent::Exited { run: run.clone(), outcome, stderr_tail: Vec::new() });
                None
            }
        }
    }

    /// The user a project's replicas run as (`[replicas]`, see `identity`): `None` when
    /// they run as the server's user; assigned at the project's first launch and kept.
    fn project_identity(&mut self, project: &str) -> Result<Option<trainyard_backend::RunAs>, String> {
        let Some((first, last)) = self.svc.cfg.replicas.uid_range else { return Ok(None) };
        match self.store.project_uid(project, first, last) {
            Ok(Some(uid)) => Ok(Some(trainyard_backend::RunAs { uid, gid: uid })),
            Ok(None) => Err(format!(
                "no uid is left for project {project:?}: every uid of [replicas] uid_range ({first}-{last}) is given to a \
                 project; widen the range"
            )),
            Err(e) => Err(format!("cannot assign project {project:?} its uid: {e}")),
        }
    }

    /// The engine could not take a run now: try it again later, with backoff, the job
    /// waiting PENDING with the reason (not an internal error, L16).
    pub(super) fn launch_later(&mut self, run: RunId, seq: i64, reason: String, now: Micros) -> Result<(), StoreError> {
        let job = run.job;
        let tries = self.later.iter().filter(|l| l.run == run).map(|l| l.tries).max().unwrap_or(0) + 1;
        self.later.retain(|l| l.run != run);
        let delay = trainyard_core::retry::LAUNCH_LATER.retry_after(tries);
        self.later.push(Later { at: now + delay, run, seq, tries });
        self.note_engine_waiting(job, format!("Waiting for the execution engine: {reason}; trying again in {}s.", delay / 1_000_000), now)
    }

    /// Launches put off while the engine could not take them, when their time has come,
    /// planned afresh; those of runs no longer current are dropped.
    pub(super) fn retry_later_launches(&mut self, now: Micros) {
        if self.later.is_empty() {
            return;
        }
        let (due, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut self.later).into_iter().partition(|l| l.at <= now);
        self.later = rest;
        let mut gang = Vec::new();
        let mut done = Vec::new();
        for Later { run, seq, .. } in due {
            let current = self.jobs.get(&run.job).is_some_and(|l| {
                l.job.attempt == run.attempt
                    && l.job
                        .replica(&run.replica)
                        .is_some_and(|r| r.restart == run.restart && r.state == trainyard_core::job::ReplicaState::Launching)
            });
            if !current {
                done.push(seq);
                continue;
            }
            match self.plan(run.job, &run, seq) {
                Some(p) => gang.push(p),
                None => done.push(seq),
            }
        }
        if !gang.is_empty() {
            self.exec.submit(Work::Launch(gang));
        }
        self.effects_done(&done);
    }
}

/// `/gcs/` where it starts a path in `arg` (at its start, or after a space, a quote, `=`
/// or `:`) replaced by `ns` (the project's namespace, ending in `/`).
pub(super) fn rewrite_gcs(arg: &str, ns: &str) -> String {
    let mut out = String::with_capacity(arg.len());
    let mut rest = arg;
    let mut prev: Option<char> = None;
    while let Some(i) = rest.find("/gcs/") {
        let before = rest[..i].chars().last().or(prev);
        out.push_str(&rest[..i]);
        if before.is_none_or(|c| c.is_whitespace() || "'\"=:(".contains(c)) {
            out.push_str(ns);
        } else {
            out.push_str("/gcs/");
        }
        prev = Some('/');
        rest = &rest[i + 5..];
    }
    out.push_str(rest);
    out
}

/// Where a python package job's packages are mounted in its container.
const PACKAGES_DIR: &str = "/trainyard/packages";

/// A `pythonPackageSpec` in a container: its packages installed for the container's
/// user (into `PYTHONUSERBASE` below /tmp, which any user may write; without build
/// isolation, which would fetch setuptools from an index), then
/// `python -m MODULE ARGS` as PID 1's child. `$0` is a name, `$1` the module.
const PYTHON_PACKAGE_SCRIPT: &str = r#"set -e
PY=$(command -v python3 || command -v python)
if [ -d /trainyard/packages ]; then
  export PYTHONUSERBASE=/tmp/trainyard-python
  # A copy: pip builds a source tree in place, and the mounts are read-only.
  rm -rf /tmp/trainyard-packages && cp -R /trainyard/packages /tmp/trainyard-packages
  "$PY" -m pip install --quiet --user --disable-pip-version-check --no-warn-script-location --no-input --no-build-isolation /tmp/trainyard-packages/* >&2
fi
exec "$PY" -m "$@""#;

/// The program, environment (L8) and memory limit (L14) of one run.
fn venv_timeout(svc: &Services) -> std::time::Duration {
    std::time::Duration::from_secs(svc.cfg.replicas.venv_build_timeout_secs)
}

/// The job's venv `venvs/<job>` (built by its replicas, see `venv`): the project's user's
/// with `run_as` (a grant), else made before the run starts.
fn job_venv(data_dir: &Path, job: u64, run_as: Option<trainyard_backend::RunAs>, dirs: &mut Vec<Confined>, grants: &mut Vec<Grant>) -> PathBuf {
    let rel = Path::new("venvs").join(job.to_string());
    let path = data_dir.join(&rel);
    match run_as {
        Some(_) => grants.push(Grant::new(data_dir, &rel, 1)),
        None => dirs.push(Confined { root: data_dir.to_path_buf(), rel }),
    }
    path
}

/// `[replicas] package_index`, for the builds of the job's venv, with the server's proxy
/// to it when the build is in a job's network namespace.
fn package_index(svc: &Services) -> crate::venv::PackageIndex<'_> {
    let url = svc.cfg.replicas.package_index.as_deref();
    let proxied = svc.cfg.replicas.network == crate::config::Network::Job && url.and_then(crate::index_proxy::Index::from_url).is_some();
    crate::venv::PackageIndex { url, proxy: proxied.then(|| svc.cfg.data_dir.join(crate::index_proxy::SOCKET)) }
}

/// The server's Cloud Storage endpoint as a replica reaches it (`http://ADDR:PORT`, a
/// wildcard listen address as loopback); `None` where replicas cannot reach the server
/// (a network namespace per job).
fn storage_endpoint(svc: &Services) -> Option<String> {
    if svc.cfg.replicas.network == crate::config::Network::Job {
        return None;
    }
    let addr: std::net::SocketAddr = svc.cfg.listen.parse().ok()?;
    let ip = match addr.ip() {
        std::net::IpAddr::V4(v4) if v4.is_unspecified() => std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
        std::net::IpAddr::V6(v6) if v6.is_unspecified() => std::net::IpAddr::V6(std::net::Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    let scheme = if svc.cfg.tls.enabled() { "https" } else { "http" };
    Some(format!("{scheme}://{}", std::net::SocketAddr::new(ip, addr.port())))
}

/// The server's CA, which its jobs must trust (`TlsSettings::clients_ca`).
fn server_ca(svc: &Services) -> Option<PathBuf> {
    svc.cfg.tls.clients_ca(&svc.cfg.data_dir)
}

/// Where the managed service's host names lead in this server's jobs: `[tls]
/// jobs_address` (port 443) and the names, once `serve` listens there and the replicas
/// can reach it (not from a network namespace of the job's own).
fn jobs_names(svc: &Services) -> Option<(std::net::IpAddr, Vec<String>)> {
    let at = svc.cfg.jobs_endpoint?;
    if svc.cfg.replicas.network == crate::config::Network::Job {
        return None;
    }
    Some((at.ip(), crate::tls::service_names(&svc.cfg.region)))
}

/// The run's hosts file (`<run_dir>/hosts`: the host's, and the service's names), for a
/// host program in a mount namespace of its own, where it replaces `/etc/hosts`.
fn hosts_file(svc: &Services, run: &RunId) -> Option<PathBuf> {
    if svc.containers.is_some() || !svc.gcs_mount {
        return None;
    }
    jobs_names(svc)?;
    Some(run_dir(&svc.cfg.data_dir, run).join("hosts"))
}

/// The lines a run's hosts file adds to the host's.
pub(super) fn hosts_lines(svc: &Services) -> Option<String> {
    let (ip, names) = jobs_names(svc)?;
    Some(format!("# The managed service's names, served by Trainyard to this job.\n{ip} {}\n", names.join(" ")))
}

/// Where a container sees its job's CA bundle.
const TRUST_IN_CONTAINER: &str = "/trainyard/ca-bundle.pem";

/// The run's CA bundle (`[tls] auto`, with a server endpoint the run can reach):
/// `<run_dir>/ca-bundle.pem`.
fn trust_file(svc: &Services, run: &RunId) -> Option<PathBuf> {
    server_ca(svc)?;
    storage_endpoint(svc)?;
    Some(run_dir(&svc.cfg.data_dir, run).join("ca-bundle.pem"))
}

/// Where a container sees its job's credential file.
const CREDENTIALS_IN_CONTAINER: &str = "/trainyard/credentials.json";

/// The run's credential file (tokens mode, with a server endpoint the run can reach):
/// `<run_dir>/credentials.json`, written before the run starts, its user's alone.
pub(super) fn credential_file(svc: &Services, run: &RunId) -> Option<PathBuf> {
    // Open mode: a credential for `google.auth.default()` where the job's clients reach
    // the service by its host names (any token is taken, from this host only).
    if svc.job_credentials.is_none() {
        jobs_names(svc)?;
    }
    storage_endpoint(svc)?;
    Some(run_dir(&svc.cfg.data_dir, run).join("credentials.json"))
}

/// The credential file of a job: an `authorized_user` file (what `gcloud auth
/// application-default login` writes) whose access token is the job's credential, with an
/// expiry far ahead: google-auth sends it as it is and never refreshes it (the refresh
/// fields are there because the format needs them). Its real lifetime is the job's: the
/// server refuses it once the job has ended.
pub(super) fn credential_json(svc: &Services, job: u64, project: &str) -> Option<String> {
    let credential = match svc.job_credentials.as_ref() {
        Some(c) => c.credential(job, project),
        None => format!("open-mode-job-{job}"),
    };
    let file = serde_json::json!({
        "type": "authorized_user",
        "token": credential,
        "expiry": "9999-12-31T23:59:59Z",
        "refresh_token": credential,
        "client_id": format!("trainyard-job-{job}"),
        "client_secret": "none",
    });
    serde_json::to_string_pretty(&file).ok()
}

/// Where a job's network namespace is bound (`[replicas] network = "job"`), made by the
/// executor before the job's first launch and removed once the job has ended.
pub(super) fn job_netns(svc: &Services, job: u64) -> Option<PathBuf> {
    (svc.cfg.replicas.network == crate::config::Network::Job).then(|| netns_dir(&svc.cfg.data_dir).join(job.to_string()))
}

/// The directory of the jobs' network namespaces.
pub fn netns_dir(data_dir: &std::path::Path) -> PathBuf {
    data_dir.join("netns")
}

/// What a launch needs: the shim's spec, the directories to make, (with `run_as`) what to
/// give the project's user, and the packages to look at first (all files: the executor's).
pub(super) type LaunchPlan = (ShimSpec, Vec<Confined>, Vec<Grant>, Vec<PackageCheck>);

/// With `run_as`, the program runs as its project's user (see `identity`): in
/// `<run_dir>/work`, with `HOME` and `TMPDIR` `<run_dir>/home` and a minimal environment;
/// the grants make those, the project's namespace, the output and metric directories and
/// the venv that user's. The steps are [`Planning`]'s.
pub(super) fn launch_plan(svc: &Services, live: &Live, run: &RunId, run_as: Option<trainyard_backend::RunAs>) -> Result<LaunchPlan, Outcome> {
    let mut p = Planning::new(svc, live, run, run_as)?;
    let env = p.environment()?;
    p.output_dirs();
    let grants = p.grants();
    let shim = p.shim(env);
    match svc.containers.as_ref() {
        Some(ce) => p.in_container(ce, shim, grants),
        None => p.on_host(shim, grants),
    }
}

/// One replica's launch being planned.
struct Planning<'a> {
    svc: &'a Services,
    live: &'a Live,
    run: &'a RunId,
    run_as: Option<trainyard_backend::RunAs>,
    /// The replica's position in the job.
    idx: usize,
    pool: &'a trainyard_api::types::WorkerPoolSpec,
    /// The job's base output directory (the project's namespace or an output root).
    base: Option<Confined>,
    /// The run's directory relative to the data directory.
    run_rel: PathBuf,
    mounts: Vec<Mount>,
    dirs: Vec<Confined>,
    /// The job's `packageUris`, looked at by the executor before the launch.
    packages: Vec<PackageCheck>,
}

impl<'a> Planning<'a> {
    fn new(svc: &'a Services, live: &'a Live, run: &'a RunId, run_as: Option<trainyard_backend::RunAs>) -> Result<Planning<'a>, Outcome> {
        let job = &live.job;
        let idx = job.replicas.iter().position(|r| r.name == run.replica).ok_or_else(|| Outcome::LaunchFailed {
            message: format!("no replica {} in job {}", run.replica, job.id),
        })?;
        let pool_ix = job.replicas[idx].pool;
        let pool = live.resource.job_spec.worker_pool_specs.get(pool_ix).ok_or_else(|| Outcome::LaunchFailed {
            message: format!("no worker pool {pool_ix}"),
        })?;
        // The project's namespace of the storage root, or an output root (checked at create).
        let base = live.resource.job_spec.base_output_directory.as_ref().and_then(|o| {
            resolve_uri(&o.output_uri_prefix, &job.project, &svc.cfg.storage_root, &svc.output_roots, "").ok()
        });
        Ok(Planning { svc, live, run, run_as, idx, pool, base, run_rel: run_dir(Path::new(""), run), mounts: Vec::new(), dirs: Vec::new(), packages: Vec::new() })
    }

    fn job(&self) -> &'a Job {
        &self.live.job
    }

    fn replica(&self) -> &'a trainyard_core::job::Replica {
        &self.live.job.replicas[self.idx]
    }

    fn data_dir(&self) -> &'a PathBuf {
        &self.svc.cfg.data_dir
    }

    /// The project's namespace of the storage root, unless the project's name could not
    /// be a directory's.
    fn namespace(&self) -> Option<Confined> {
        let project = self.job().project.as_str();
        let plain = !project.is_empty() && !project.contains('/') && project != "." && project != "..";
        plain.then(|| Confined { root: self.svc.cfg.storage_root.clone(), rel: PathBuf::from(project) })
    }

    /// The replica's environment: the base (a container's image has its own; a host
    /// program the server's, or a minimal one of its own user's), the trial's metric
    /// file, what the job's clients need to find this server, the managed service's
    /// variables (L8) and the replica's own GPUs.
    fn environment(&mut self) -> Result<Vec<(String, String)>, Outcome> {
        let (svc, job, replica) = (self.svc, self.job(), self.replica());
        let ce = svc.containers.as_ref();
        let mut env = match (ce, self.run_as) {
            (Some(_), _) => Vec::new(),
            (None, Some(_)) => crate::identity::minimal_env(&svc.base_env, &self.data_dir().join(&self.run_rel).join("home")),
            (None, None) => svc.base_env.clone(),
        };
        if let Some(node) = &replica.node {
            env.push(("TRAINYARD_NODE".into(), node.clone()));
        }
        if job.trial.is_some() {
            // cloudml-hypertune writes the trial's metrics here.
            let dir = Confined { root: self.data_dir().clone(), rel: Path::new("trials").join(job.id.to_string()).join(&replica.name) };
            let file = match ce {
                Some(_) => {
                    self.mounts.push(Mount { source: dir.path(), target: "/trainyard/trial".into(), read_only: false });
                    "/trainyard/trial/output.metrics".to_string()
                }
                None => dir.path().join("output.metrics").display().to_string(),
            };
            env.push(("CLOUD_ML_HP_METRIC_FILE".into(), file));
            self.dirs.push(dir);
        }
        // Progress and ETA: JSON lines {"step": N, "total": M} appended here.
        let progress = Confined { root: self.data_dir().clone(), rel: progress_rel(job.id, &replica.name) };
        let file = match ce {
            Some(_) => {
                self.mounts.push(Mount { source: progress.path(), target: "/trainyard/progress".into(), read_only: false });
                "/trainyard/progress/progress.jsonl".to_string()
            }
            None => progress.path().join(PROGRESS_FILE).display().to_string(),
        };
        env.push((PROGRESS_ENV.into(), file));
        // TY11: where the notice before a stop is written (beside the progress file).
        let notice = match ce {
            Some(_) => format!("/trainyard/progress/{NOTICE_FILE}"),
            None => progress.path().join(NOTICE_FILE).display().to_string(),
        };
        env.push((NOTICE_ENV.into(), notice));
        self.dirs.push(progress);
        set_all(&mut env, self.clients());
        set_all(&mut env, self.service_env());
        set_all(&mut env, self.gpu_env()?);
        Ok(env)
    }

    /// Where the replica sees a file of its run directory: its own path for a host
    /// program; in a container, `in_container`, mounted there read-only.
    fn seen_at(&mut self, file: PathBuf, in_container: &str) -> String {
        match self.svc.containers {
            Some(_) => {
                self.mounts.push(Mount { source: file, target: in_container.into(), read_only: true });
                in_container.to_string()
            }
            None => file.display().to_string(),
        }
    }

    /// What the job's Cloud Storage and Google clients need to find this server's
    /// storage unchanged, as on the managed service (the job's own env may say
    /// otherwise): the endpoint (not reachable from a job's own network namespace), the
    /// project and, in tokens mode, the job's credential.
    fn clients(&mut self) -> Vec<(String, String)> {
        let mut clients = vec![("GOOGLE_CLOUD_PROJECT".to_string(), self.job().project.clone())];
        match (storage_endpoint(self.svc), credential_file(self.svc, self.run)) {
            (Some(endpoint), Some(file)) => {
                // google-auth finds the credential by itself (an `authorized_user` file
                // whose access token is the job's credential), and google-cloud-storage
                // sends it to the endpoint of API_ENDPOINT_OVERRIDE (with
                // STORAGE_EMULATOR_HOST it would send none).
                let path = self.seen_at(file, CREDENTIALS_IN_CONTAINER);
                if self.svc.job_credentials.is_some() {
                    clients.push(("API_ENDPOINT_OVERRIDE".into(), endpoint));
                } else {
                    // Open mode: google-cloud-storage goes on sending no credential.
                    clients.push(("STORAGE_EMULATOR_HOST".into(), endpoint));
                }
                clients.push(("GOOGLE_APPLICATION_CREDENTIALS".into(), path));
            }
            (Some(endpoint), None) => clients.push(("STORAGE_EMULATOR_HOST".into(), endpoint)),
            (None, _) => {}
        }
        // Over TLS, the job's clients trust the server's CA besides the host's: requests
        // (google-cloud-storage, the SDK over REST), Python's ssl and OpenSSL, and gRPC.
        if let Some(file) = trust_file(self.svc, self.run) {
            let path = self.seen_at(file, TRUST_IN_CONTAINER);
            for var in ["REQUESTS_CA_BUNDLE", "SSL_CERT_FILE", "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH"] {
                clients.push((var.into(), path.clone()));
            }
        }
        // The service's host names lead here (a hosts file, or the container's): gRPC
        // reads it with the system's resolver.
        if hosts_file(self.svc, self.run).is_some() || (self.svc.containers.is_some() && jobs_names(self.svc).is_some()) {
            clients.push(("GRPC_DNS_RESOLVER".into(), "native".into()));
        }
        clients
    }

    /// The managed service's variables (L8): CLUSTER_SPEC, TF_CONFIG, AIP_* and the
    /// pool's own.
    fn service_env(&self) -> Vec<(String, String)> {
        let (svc, job) = (self.svc, self.job());
        let spec = &self.live.resource.job_spec;
        let members: Vec<Member> =
            job.replicas.iter().map(|r| Member { pool: r.pool, index: r.index, address: r.address.clone().unwrap_or_default() }).collect();
        let spec_json = serde_json::to_string(spec).unwrap_or_default();
        // In a container the project's buckets are at /gcs (gs://B/X is /gcs/B/X), and
        // an output root is mounted at its own path.
        let base_str = self.base.as_ref().map(|p| match svc.containers {
            Some(_) if p.root == svc.cfg.storage_root => {
                let in_project: PathBuf = p.rel.components().skip(1).collect();
                format!("/gcs/{}", in_project.display())
            }
            _ => p.path().display().to_string(),
        });
        let pool_env: Vec<(String, String)> = match (&self.pool.container_spec, &self.pool.python_package_spec) {
            (Some(c), _) => c.env.iter().map(|e| (e.name.clone(), e.value.clone())).collect(),
            (None, Some(p)) => p.env.iter().map(|e| (e.name.clone(), e.value.clone())).collect(),
            _ => Vec::new(),
        };
        replica_env(&EnvInput {
            project: &job.project,
            region: &job.region,
            job_id: job.id,
            trial_id: job.trial.as_ref().map(|t| t.trial.as_str()),
            job_spec_json: &spec_json,
            members: &members,
            this: self.idx,
            base_output_dir: base_str.as_deref(),
            pool_env: &pool_env,
            elastic: (!job.policy.elastic.is_empty()).then(|| (job.minimum().len(), job.replicas.len())),
        })
    }

    /// The replica's own GPUs, by UUID (CUDA numbers them 0.. in this order); a replica
    /// on a node with GPUs that asks for none sees none.
    fn gpu_env(&self) -> Result<Vec<(String, String)>, Outcome> {
        let (job, replica) = (self.job(), self.replica());
        let node_has_gpus = replica.node.as_ref().is_some_and(|n| self.svc.gpus.contains_key(n));
        if !node_has_gpus {
            return Ok(Vec::new());
        }
        let asks_gpus = job.demand.replicas.get(self.idx).is_some_and(|d| d.accelerator.is_some());
        if asks_gpus && replica.devices.is_empty() {
            return Err(Outcome::LaunchFailed { message: format!("no GPUs were given to replica {}", replica.name) });
        }
        let list = replica.devices.join(",");
        // Empty: no device (CUDA), `void`: none (the NVIDIA container runtime).
        let nvidia = if list.is_empty() { "void".to_string() } else { list.clone() };
        Ok(vec![("CUDA_VISIBLE_DEVICES".into(), list), ("NVIDIA_VISIBLE_DEVICES".into(), nvidia)])
    }

    /// The output directories the service makes (`model/`, `checkpoints/`, `logs/`); an
    /// output root is mounted at its own path in a container.
    fn output_dirs(&mut self) {
        let Some(b) = self.base.clone() else { return };
        for sub in ["model", "checkpoints", "logs"] {
            self.dirs.push(b.join(sub));
        }
        if self.svc.containers.is_some() && b.root != self.svc.cfg.storage_root {
            self.mounts.push(Mount { source: b.path(), target: b.path().display().to_string(), read_only: false });
        }
    }

    /// With a project's user: its work and home directories, its namespace, and the
    /// directories made so far (their tails only where a root may be shared).
    fn grants(&self) -> Vec<Grant> {
        let Some(_) = self.run_as else { return Vec::new() };
        let data_dir = self.data_dir();
        let depth = self.run_rel.components().count();
        let mut grants = vec![Grant::new(data_dir, self.run_rel.join("work"), depth), Grant::new(data_dir, self.run_rel.join("home"), depth)];
        if let Some(ns) = self.namespace() {
            grants.push(Grant::new(&ns.root, &ns.rel, 0));
        }
        for d in &self.dirs {
            let n = d.rel.components().count();
            let own_from = if d.root == *data_dir {
                // trials/<job>/<replica>
                n.saturating_sub(1)
            } else if d.root == self.svc.cfg.storage_root {
                // The project's namespace is the project's.
                0
            } else {
                // An output root may be shared: only model/, checkpoints/, logs/.
                n.saturating_sub(1)
            };
            grants.push(Grant::new(&d.root, &d.rel, own_from));
        }
        grants
    }

    /// The shim's spec but for what it runs: where, as whom, and within which limits
    /// (L14: the machine type's memory minus the reserved share).
    fn shim(&self, env: Vec<(String, String)>) -> ShimSpec {
        let (svc, job) = (self.svc, self.job());
        let mut shim = ShimSpec::new(Vec::new(), env);
        shim.cwd = Some(match self.run_as {
            Some(_) => self.data_dir().join(&self.run_rel).join("work"),
            None => svc.workdir.clone(),
        });
        shim.run_as = self.run_as;
        shim.pids_max = Some(svc.cfg.replicas.pids_max);
        shim.nice = Some(svc.cfg.replicas.nice).filter(|n| *n > 0);
        shim.memory_limit_bytes = self.memory();
        shim.resources = trainyard_backend::Resources {
            cpus: job.demand.replicas.get(self.idx).map(|d| d.cpus),
            accelerator: job.demand.replicas.get(self.idx).and_then(|d| d.accelerator.clone()),
            timeout_secs: self
                .live
                .resource
                .job_spec
                .scheduling
                .as_ref()
                .and_then(|s| s.timeout.as_ref())
                .map(|t| t.seconds.max(0) as u64),
        };
        shim.grace_seconds = svc.cfg.settings.grace_period_secs as f64;
        shim.log_max_bytes = Some(svc.cfg.settings.log_max_bytes_per_run).filter(|m| *m > 0);
        shim.netns = job_netns(svc, job.id);
        shim
    }

    /// L14: the machine type's memory minus the reserved share.
    fn memory(&self) -> Option<u64> {
        let catalog = &self.svc.catalog;
        self.pool.machine_spec.as_ref().and_then(|m| catalog.get(&m.machine_type)).map(|m| catalog.allocatable_memory(m))
    }

    /// In a container of the engine: the project's buckets at /gcs, the engine's own
    /// mounts, the job's host directories read-only, and the image's command (or
    /// `python -m MODULE` with `packageUris` installed in the container, never on the
    /// host).
    fn in_container(mut self, ce: &crate::containers::ContainerEngine, mut shim: ShimSpec, grants: Vec<Grant>) -> Result<LaunchPlan, Outcome> {
        let (svc, job, run) = (self.svc, self.job(), self.run);
        if let Some(ns) = self.namespace() {
            self.mounts.insert(0, Mount { source: ns.path(), target: "/gcs".into(), read_only: false });
            self.dirs.push(ns);
        }
        self.mounts.extend(ce.mounts.iter().cloned());
        // The engine resolves a relative source against its own working directory.
        for m in &mut self.mounts {
            if let Ok(abs) = std::path::absolute(&m.source) {
                m.source = abs;
            }
        }
        // The host directories the job asked for (checked at create), read-only at their
        // own paths: `create --config` on this host runs the job file's programs.
        for d in &self.live.resource.trainyard_host_directories {
            self.mounts.push(Mount { source: PathBuf::from(d), target: d.clone(), read_only: true });
        }
        let (image, entrypoint, args) = match (&self.pool.container_spec, &self.pool.python_package_spec) {
            (Some(c), _) => {
                // command replaces the image's ENTRYPOINT, args its CMD.
                shim.argv = c.command.iter().chain(&c.args).cloned().collect();
                (c.image_uri.clone(), (!c.command.is_empty()).then(|| c.command.clone()), c.args.clone())
            }
            (None, Some(p)) => {
                for (i, uri) in p.package_uris.iter().enumerate() {
                    let path = self.package(uri, i, false)?;
                    let name = path.rel.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "package".into());
                    let source = std::path::absolute(path.path()).unwrap_or_else(|_| path.path());
                    self.mounts.push(Mount { source, target: format!("{PACKAGES_DIR}/{i}-{name}"), read_only: true });
                }
                let mut entrypoint = vec!["/bin/sh".to_string(), "-c".into(), PYTHON_PACKAGE_SCRIPT.into(), "trainyard-python".into()];
                entrypoint.push(p.python_module.clone());
                shim.argv = entrypoint.clone();
                (p.executor_image_uri.clone(), Some(entrypoint), p.args.clone())
            }
            (None, None) => return Err(no_program()),
        };
        let run_dir_abs = self.data_dir().join(&self.run_rel);
        // The NVIDIA container toolkit's CDI names (`nvidia-ctk cdi generate`).
        let devices = self.replica().devices.iter().map(|u| format!("nvidia.com/gpu={u}")).collect();
        shim.container = Some(ContainerSpec {
            engine: ce.engine.clone(),
            image,
            name: container_name(job.id, run.attempt, &run.replica, run.restart, &run_dir_abs),
            entrypoint,
            args,
            mounts: self.mounts,
            user: self.run_as.map(|id| format!("{}:{}", id.uid, id.gid)),
            memory_limit_bytes: shim.memory_limit_bytes,
            pids_max: Some(svc.cfg.replicas.pids_max),
            nofile: nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).ok(),
            devices,
            workdir: ce.workdir.clone(),
            netns: job_netns(svc, job.id),
            add_hosts: jobs_names(svc).map(|(ip, names)| names.into_iter().map(|n| (n, ip.to_string())).collect()).unwrap_or_default(),
        });
        Ok((shim, self.dirs, grants, self.packages))
    }

    /// A `packageUris` entry: the project's storage or an output root, as checked at
    /// create (a job stored before that check is held to it now). That it names a file
    /// (or, for a build on the host, a directory) is looked at by the executor, off the
    /// driver's thread: the path is in a tenant's storage.
    fn package(&mut self, uri: &str, i: usize, on_host: bool) -> Result<Confined, Outcome> {
        let (svc, job) = (self.svc, self.job());
        let field = format!("pythonPackageSpec.packageUris[{i}]");
        let path = resolve_uri(uri, &job.project, &svc.cfg.storage_root, &svc.output_roots, &field)
            .map_err(|e| Outcome::StartError { message: e.message })?;
        self.packages.push(PackageCheck { path: path.clone(), uri: uri.to_string(), project: job.project.clone(), index: i, on_host });
        Ok(path)
    }

    /// A host program: /gcs is the project's namespace mounted there (a mount namespace
    /// of the replica's), or, where the server cannot mount, /gcs/ in command and args
    /// rewritten to the namespace's path. A package job, or a command that runs pip,
    /// builds the job's venv first (see `venv`).
    fn on_host(mut self, mut shim: ShimSpec, mut grants: Vec<Grant>) -> Result<LaunchPlan, Outcome> {
        let (svc, job) = (self.svc, self.job());
        let data_dir = self.data_dir();
        let mut gcs_rewrite = None;
        if let Some(ns) = self.namespace() {
            if svc.gcs_mount {
                shim.gcs_mount = Some(std::path::absolute(ns.path()).unwrap_or_else(|_| ns.path()));
                shim.hosts_file = hosts_file(svc, self.run);
                // A /tmp of the replica's own, in its run directory: TMPDIR and /tmp are
                // the same place, shared with no other replica.
                if svc.private_tmp && self.run_as.is_some() {
                    let rel = self.run_rel.join("tmp");
                    grants.push(Grant::new(data_dir, &rel, self.run_rel.components().count()));
                    let tmp = data_dir.join(&rel);
                    shim.private_tmp = Some(std::path::absolute(&tmp).unwrap_or(tmp));
                    // The default TMPDIR (its home) becomes /tmp; one the job set stays.
                    let home = data_dir.join(&self.run_rel).join("home").display().to_string();
                    for (k, v) in shim.env.iter_mut() {
                        if k == "TMPDIR" && *v == home {
                            *v = "/tmp".into();
                        }
                    }
                }
            } else {
                gcs_rewrite = Some(format!("{}/", ns.path().display()));
            }
            self.dirs.push(ns);
        }
        match (&self.pool.container_spec, &self.pool.python_package_spec) {
            (Some(c), _) => {
                if c.command.is_empty() {
                    return Err(Outcome::StartError {
                        message: format!(
                            "containerSpec.command is empty: Trainyard runs the command as a host process and does not run \
                             the image {:?}, so its entrypoint is unknown; set command",
                            c.image_uri
                        ),
                    });
                }
                shim.argv = c
                    .command
                    .iter()
                    .chain(&c.args)
                    .map(|a| match &gcs_rewrite {
                        Some(ns) => rewrite_gcs(a, ns),
                        None => a.clone(),
                    })
                    .collect();
                // A command that runs pip (as the SDK's from_local_script does: `pip
                // install --upgrade pip && pip3 install --user ...`) gets a venv of the
                // job's first on PATH and a home and user base of the replica's: the
                // host's Python and the server user's home are never changed.
                if shim.argv.iter().any(|a| a.contains("pip")) {
                    let home = data_dir.join(&self.run_rel).join("home");
                    if self.run_as.is_none() {
                        self.dirs.push(Confined { root: data_dir.clone(), rel: self.run_rel.join("home") });
                    }
                    set_all(
                        &mut shim.env,
                        vec![("HOME".into(), home.display().to_string()), ("PYTHONUSERBASE".into(), home.join(".local").display().to_string())],
                    );
                    let venv = job_venv(data_dir, job.id, self.run_as, &mut self.dirs, &mut grants);
                    let program = std::mem::take(&mut shim.argv);
                    shim.argv = crate::venv::replica_argv(&venv, venv_timeout(svc), &package_index(svc), &[], crate::venv::Then::OnPath(program));
                }
            }
            (None, Some(p)) => {
                let mut packages = Vec::new();
                for (i, uri) in p.package_uris.iter().enumerate() {
                    packages.push(self.package(uri, i, true)?.path());
                }
                let venv = job_venv(data_dir, job.id, self.run_as, &mut self.dirs, &mut grants);
                let module = std::iter::once(p.python_module.clone()).chain(p.args.iter().cloned()).collect();
                shim.argv = crate::venv::replica_argv(&venv, venv_timeout(svc), &package_index(svc), &packages, crate::venv::Then::Module(module));
            }
            (None, None) => return Err(no_program()),
        }
        Ok((shim, self.dirs, grants, self.packages))
    }
}

fn no_program() -> Outcome {
    Outcome::StartError { message: "the worker pool has no containerSpec or pythonPackageSpec".into() }
}

/// Each variable set, in place of any earlier value of the same name.
fn set_all(env: &mut Vec<(String, String)>, vars: Vec<(String, String)>) {
    for (k, v) in vars {
        env.retain(|(n, _)| *n != k);
        env.push((k, v));
    }
}

/// Where a replica's program appends its progress (`TRAINYARD_PROGRESS_FILE`).
pub(crate) const PROGRESS_ENV: &str = "TRAINYARD_PROGRESS_FILE";
pub(crate) const PROGRESS_FILE: &str = "progress.jsonl";
/// TY11: the notice before a stop (`TRAINYARD_NOTICE_FILE`): JSON with the reason, the
/// deadline (RFC 3339) and the signal sent with it.
pub(crate) const NOTICE_ENV: &str = "TRAINYARD_NOTICE_FILE";
pub(crate) const NOTICE_FILE: &str = "notice.json";

/// A replica's progress directory, below the data directory.
pub(crate) fn progress_rel(job: u64, replica: &str) -> PathBuf {
    Path::new("progress").join(job.to_string()).join(replica)
}

#[cfg(test)]
mod tests {
    use super::rewrite_gcs;

    #[test]
    fn gcs_paths_are_rewritten_where_a_path_starts() {
        let ns = "/srv/storage/p/";
        assert_eq!(rewrite_gcs("/gcs/b/x.tar.gz", ns), "/srv/storage/p/b/x.tar.gz");
        assert_eq!(
            rewrite_gcs("pip3 install -q --user /gcs/b/pkg.tar.gz && python3 -m t --out=/gcs/b/o", ns),
            "pip3 install -q --user /srv/storage/p/b/pkg.tar.gz && python3 -m t --out=/srv/storage/p/b/o"
        );
        assert_eq!(rewrite_gcs("'/gcs/b' \"/gcs/c\" path:/gcs/d", ns), "'/srv/storage/p/b' \"/srv/storage/p/c\" path:/srv/storage/p/d");
        // Not a path that starts with /gcs/.
        assert_eq!(rewrite_gcs("/data/gcs/b", ns), "/data/gcs/b");
        assert_eq!(rewrite_gcs("x/gcs/y", ns), "x/gcs/y");
    }
}
