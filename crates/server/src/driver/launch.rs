//! Launch planning: the program, environment (L8) and memory limit (L14) of a run, and
//! carrying out committed effects.

use super::*;

impl Driver {
    /// Carry out committed effects; each leaves the outbox once done.
    pub(super) fn execute(&mut self, id: u64, effects: Vec<(i64, Effect)>) {
        let mut done = Vec::with_capacity(effects.len());
        let mut ready = Vec::new();
        for (seq, effect) in effects {
            match &effect {
                Effect::Launch { run, .. } => match self.prepare_launch(id, run, seq) {
                    Prepared::Ready(launch) => {
                        ready.push(launch);
                        done.push(seq);
                    }
                    Prepared::Deferred => {}
                    Prepared::Reported => done.push(seq),
                },
                Effect::Stop { run, .. } => {
                    let dir = run_dir(&self.svc.cfg.data_dir, run);
                    if let Err(e) = self.svc.backend.stop(run, dir) {
                        tracing::warn!("{run}: stop: {e}");
                    }
                    done.push(seq);
                }
                Effect::Log(_) => done.push(seq),
            }
        }
        // L6: every replica of the attempt starts at once.
        if !ready.is_empty() {
            do_launch(&self.svc, ready, self.sink(), &self.tx);
        }
        if let Err(e) = self.store.outbox_done_many(&done) {
            tracing::error!("outbox: {e}");
        }
    }

    /// Everything a launch needs, or the reason it will not happen here and now.
    pub(super) fn prepare_launch(&mut self, id: u64, run: &RunId, seq: i64) -> Prepared {
        let sink = self.sink();
        let Some(live) = self.jobs.get(&id) else { return Prepared::Reported };
        let dir = run_dir(&self.svc.cfg.data_dir, run);
        let node = live.job.replica(&run.replica).and_then(|r| r.node.clone()).unwrap_or_default();
        let plan = match launch_plan(&self.svc, live, run) {
            Ok(p) => p,
            Err(outcome) => {
                sink(BackendEvent::Exited { run: run.clone(), outcome, stderr_tail: Vec::new() });
                return Prepared::Reported;
            }
        };
        match plan {
            LaunchPlan::Ready(spec) => Prepared::Ready(Launch { run: run.clone(), run_dir: dir, spec, node }),
            LaunchPlan::NeedsVenv { spec, venv, packages, module_args } => {
                // Building a venv takes seconds: on its own thread, which reports
                // `EffectDone` when the launch is done.
                let (svc, tx, run) = (Arc::clone(&self.svc), self.tx.clone(), run.clone());
                let spawned = std::thread::Builder::new().name(format!("venv-{id}")).spawn(move || {
                    match crate::venv::ensure(&venv, &packages) {
                        Ok(python) => {
                            let mut spec = spec;
                            spec.argv = std::iter::once(python.display().to_string()).chain(module_args).collect();
                            do_launch(&svc, vec![Launch { run, run_dir: dir, spec, node }], sink, &tx);
                        }
                        Err(message) => {
                            sink(BackendEvent::Exited { run, outcome: Outcome::StartError { message }, stderr_tail: Vec::new() })
                        }
                    }
                    let _ = tx.send(Msg::EffectDone(seq));
                });
                match spawned {
                    Ok(_) => Prepared::Deferred,
                    Err(e) => {
                        tracing::error!("cannot start a thread to build a venv: {e}");
                        Prepared::Reported
                    }
                }
            }
        }
    }

    /// Launches put off while the engine was unreachable, when their time has come; those of
    /// runs no longer current are dropped (the launch is idempotent anyway).
    pub(super) fn retry_later_launches(&mut self, now: Micros) {
        if self.later.is_empty() {
            return;
        }
        let (due, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut self.later).into_iter().partition(|(t, _, _)| *t <= now);
        self.later = rest;
        let mut runs = Vec::new();
        for (_, launch, tries) in due {
            let current = self.jobs.get(&launch.run.job).and_then(|l| l.job.replica(&launch.run.replica)).is_some_and(|r| {
                r.restart == launch.run.restart && r.state == trainyard_core::job::ReplicaState::Launching
            }) && self.jobs.get(&launch.run.job).is_some_and(|l| l.job.attempt == launch.run.attempt);
            if current {
                runs.push(launch);
                let _ = tries;
            }
        }
        if !runs.is_empty() {
            do_launch(&self.svc, runs, self.sink(), &self.tx);
        }
    }
}

pub(super) enum Prepared {
    Ready(Launch),
    /// Another thread finishes it.
    Deferred,
    /// Nothing to launch: an outcome was reported instead.
    Reported,
}

pub(super) fn do_launch(svc: &Services, runs: Vec<Launch>, sink: EventSink, tx: &Sender<Msg>) {
    let keep: BTreeMap<RunId, Launch> = runs.iter().map(|l| (l.run.clone(), l.clone())).collect();
    for (run, result) in svc.backend.launch(runs, sink.clone()) {
        match result {
            Ok(()) => {}
            Err(trainyard_backend::BackendError::Unavailable { engine, message }) => {
                tracing::warn!("{run}: {engine} is unreachable ({message}); the launch is tried again later");
                if let Some(launch) = keep.get(&run) {
                    let _ = tx.send(Msg::LaunchLater { launch: Box::new(launch.clone()), reason: format!("{engine} is unreachable ({message})") });
                }
            }
            Err(e) => {
                // L16: the replica could not be launched for a reason that is not the user's.
                tracing::error!("{run}: launch failed: {e}");
                sink(BackendEvent::Exited { run, outcome: Outcome::LaunchFailed { message: e.to_string() }, stderr_tail: Vec::new() });
            }
        }
    }
}

pub(super) enum LaunchPlan {
    Ready(ShimSpec),
    NeedsVenv { spec: ShimSpec, venv: PathBuf, packages: Vec<PathBuf>, module_args: Vec<String> },
}

/// The program, environment (L8) and memory limit (L14) of one run.
pub(super) fn launch_plan(svc: &Services, live: &Live, run: &RunId) -> Result<LaunchPlan, Outcome> {
    let job = &live.job;
    let spec = &live.resource.job_spec;
    let idx = job.replicas.iter().position(|r| r.name == run.replica).ok_or_else(|| Outcome::LaunchFailed {
        message: format!("no replica {} in job {}", run.replica, job.id),
    })?;
    let replica = &job.replicas[idx];
    let pool = spec.worker_pool_specs.get(replica.pool).ok_or_else(|| Outcome::LaunchFailed {
        message: format!("no worker pool {}", replica.pool),
    })?;
    let members: Vec<Member> = job
        .replicas
        .iter()
        .map(|r| Member { pool: r.pool, index: r.index, address: r.address.clone().unwrap_or_default() })
        .collect();
    let spec_json = serde_json::to_string(spec).unwrap_or_default();
    let base = live
        .resource
        .job_spec
        .base_output_directory
        .as_ref()
        .and_then(|o| resolve_output_dir(&o.output_uri_prefix, &svc.cfg.storage_root, &svc.output_roots, "").ok());
    let base_str = base.as_ref().map(|p| p.display().to_string());
    let pool_env: Vec<(String, String)> = match (&pool.container_spec, &pool.python_package_spec) {
        (Some(c), _) => c.env.iter().map(|e| (e.name.clone(), e.value.clone())).collect(),
        (None, Some(p)) => p.env.iter().map(|e| (e.name.clone(), e.value.clone())).collect(),
        _ => Vec::new(),
    };
    let mut env = svc.base_env.clone();
    if let Some(node) = &replica.node {
        env.push(("TRAINYARD_NODE".into(), node.clone()));
    }
    if job.trial.is_some() {
        // cloudml-hypertune writes the trial's metrics here.
        let dir = svc.cfg.data_dir.join("trials").join(job.id.to_string()).join(&replica.name);
        let _ = std::fs::create_dir_all(&dir);
        env.push(("CLOUD_ML_HP_METRIC_FILE".into(), dir.join("output.metrics").display().to_string()));
    }
    let input = EnvInput {
        project: &job.project,
        region: &job.region,
        job_id: job.id,
        trial_id: job.trial.as_ref().map(|t| t.trial.as_str()),
        job_spec_json: &spec_json,
        members: &members,
        this: idx,
        base_output_dir: base_str.as_deref(),
        pool_env: &pool_env,
    };
    for (k, v) in replica_env(&input) {
        env.retain(|(n, _)| *n != k);
        env.push((k, v));
    }
    if let Some(b) = &base {
        for sub in ["model", "checkpoints", "logs"] {
            let _ = std::fs::create_dir_all(b.join(sub));
        }
    }
    // L14: the machine type's memory minus the reserved share.
    let memory = pool
        .machine_spec
        .as_ref()
        .and_then(|m| svc.catalog.get(&m.machine_type))
        .map(|m| svc.catalog.allocatable_memory(m));
    let mut shim = ShimSpec::new(Vec::new(), env);
    shim.cwd = Some(svc.workdir.clone());
    shim.memory_limit_bytes = memory;
    shim.resources = trainyard_backend::Resources {
        cpus: job.demand.replicas.get(idx).map(|d| d.cpus),
        accelerator: job.demand.replicas.get(idx).and_then(|d| d.accelerator.clone()),
        timeout_secs: live
            .resource
            .job_spec
            .scheduling
            .as_ref()
            .and_then(|s| s.timeout.as_ref())
            .map(|t| t.seconds.max(0) as u64),
    };
    shim.grace_seconds = svc.cfg.settings.grace_period_secs as f64;
    match (&pool.container_spec, &pool.python_package_spec) {
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
            shim.argv = c.command.iter().chain(&c.args).cloned().collect();
            Ok(LaunchPlan::Ready(shim))
        }
        (None, Some(p)) => {
            let mut packages = Vec::new();
            for (i, uri) in p.package_uris.iter().enumerate() {
                let field = format!("pythonPackageSpec.packageUris[{i}]");
                let path = if uri.starts_with("gs://") {
                    resolve_output_dir(uri, &svc.cfg.storage_root, &[], &field)
                } else {
                    resolve_output_dir(uri, &svc.cfg.storage_root, &[PathBuf::from("/")], &field)
                }
                .map_err(|e| Outcome::StartError { message: e.message })?;
                packages.push(path);
            }
            let venv = svc.cfg.data_dir.join("venvs").join(job.id.to_string());
            let module_args = ["-m".to_string(), p.python_module.clone()].into_iter().chain(p.args.iter().cloned()).collect();
            Ok(LaunchPlan::NeedsVenv { spec: shim, venv, packages, module_args })
        }
        (None, None) => Err(Outcome::StartError { message: "the worker pool has no containerSpec or pythonPackageSpec".into() }),
    }
}
