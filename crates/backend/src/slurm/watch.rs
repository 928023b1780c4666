//! The watcher thread: see "Watching" in the module docs of [`super`].

use super::*;

/// The watcher thread: see the module docs.
pub(super) fn watcher(shared: Arc<Shared>) {
    let opts = &shared.opts;
    let mut last_squeue: Option<Instant> = None;
    let mut last_warn: Option<Instant> = None;
    let mut last_sinfo: Option<Instant> = None;
    loop {
        // Wait for work.
        let (dirs, due): (Vec<(PathBuf, bool, bool)>, Vec<String>) = {
            let mut st = lock(&shared.state);
            while st.watches.is_empty() && st.kills.is_empty() && st.gangs.values().all(|g| g.last_end.is_none()) {
                st.last.clear();
                st = shared.wake.wait(st).unwrap_or_else(|p| p.into_inner());
            }
            let now = Instant::now();
            let due: Vec<String> = st.kills.iter().filter(|(at, _)| *at <= now).map(|(_, id)| id.clone()).collect();
            st.kills.retain(|(at, _)| *at > now);
            let dirs = st.watches.iter().map(|(d, w)| (d.clone(), w.started_sent, w.status_seen.is_some())).collect();
            (dirs, due)
        };
        for id in due {
            if let Err(m) = scancel(opts, &[&id]) {
                if !job_is_over(&m) {
                    tracing::warn!("scancel {id}: {m}");
                }
            }
        }
        gang_ticks(&shared);
        // Files: started.json and status.json.
        let mut events = Vec::new();
        let mut new_status = false;
        for (dir, started_sent, status_seen) in &dirs {
            let started = if !started_sent { shim::read_started(dir).ok().flatten() } else { None };
            let status_now = !status_seen && dir.join(shim::STATUS_FILE).exists();
            if started.is_none() && !status_now {
                continue;
            }
            let mut st = lock(&shared.state);
            let Some(w) = st.watches.get_mut(dir) else { continue };
            if let Some(s) = started {
                w.started_sent = true;
                events.push((w.sink.clone(), BackendEvent::Started { run: w.run.clone(), pid: s.pid }));
            }
            if status_now {
                w.status_seen = Some(Instant::now());
                new_status = true;
            }
        }
        for (sink, ev) in events {
            sink(ev);
        }
        let now = Instant::now();
        let since = last_squeue.map(|t| now.duration_since(t));
        let poll = since.is_none_or(|d| d >= opts.poll_interval || (new_status && d >= Duration::from_millis(100)))
            && !dirs.is_empty();
        if poll {
            last_squeue = Some(now);
            match run_cmd("squeue", &os(&["--json"]), opts.command_timeout) {
                Err(m) => {
                    if last_warn.is_none_or(|t| t.elapsed() > Duration::from_secs(10)) {
                        tracing::warn!("squeue --json: {m} (the runs keep being watched)");
                        last_warn = Some(Instant::now());
                    }
                }
                Ok(out) => match parse_squeue(&out) {
                    Ok((jobs, bad)) => {
                        if bad > 0 {
                            tracing::debug!("squeue --json: {bad} job entries did not parse");
                        }
                        settle(&shared, jobs);
                    }
                    Err(m) => {
                        let text = String::from_utf8_lossy(&out[..out.len().min(2000)]).into_owned();
                        tracing::error!("{m}; output: {text}");
                        unparseable(&shared, m);
                    }
                },
            }
        }
        if last_sinfo.is_none_or(|t| t.elapsed() >= DRAIN_CHECK) {
            last_sinfo = Some(Instant::now());
            check_drained(&shared);
        }
        let st = lock(&shared.state);
        let _ = shared.wake.wait_timeout(st, FILE_TICK);
    }
}

/// L9, node maintenance: a running replica on a drained node gets SIGTERM and its grace
/// period (`scancel --signal=TERM --full`, then the backstop cancel) while the node is
/// still up, and ends `Lost`, so that the driver restarts it elsewhere (the drained node
/// takes no new work).
pub(super) fn check_drained(shared: &Shared) {
    let running: Vec<(PathBuf, u64, String)> = {
        let st = lock(&shared.state);
        st.watches
            .iter()
            // A gang's replicas share one allocation: Slurm lets it finish on a draining
            // node (moving one replica would take the whole allocation down).
            .filter(|(_, w)| w.drained.is_none() && !w.stopped && w.gang.is_none())
            .filter_map(|(d, w)| {
                let j = st.last.get(&w.job_id)?;
                (j.job_state == "RUNNING" && !j.nodes.is_empty()).then(|| (d.clone(), w.job_id, j.nodes.clone()))
            })
            .collect()
    };
    if running.is_empty() {
        return;
    }
    let Ok(out) = run_cmd("sinfo", &os(&["--json"]), shared.opts.command_timeout) else { return };
    let Ok(down) = unavailable_nodes(&out) else { return };
    for (dir, id, node) in running {
        if !down.contains(&node) {
            continue;
        }
        tracing::info!("Slurm job {id}: node {node} is drained or down; moving the replica (L9)");
        let grace = shim::read_spec(&dir).ok().flatten().map(|s| s.grace_seconds).unwrap_or(30.0);
        {
            let mut st = lock(&shared.state);
            let Some(w) = st.watches.get_mut(&dir) else { continue };
            w.drained = Some(node.clone());
            let at = Instant::now() + Duration::try_from_secs_f64(grace.max(0.0) + 1.0).unwrap_or(Duration::from_secs(31));
            st.kills.push((at, id.to_string()));
        }
        if scancel(&shared.opts, &["--signal=TERM", "--full", &id.to_string()]).is_err() {
            let _ = scancel(&shared.opts, &[&id.to_string()]);
        }
    }
}

/// After a good `squeue`: ends the runs whose jobs ended.
pub(super) fn settle(shared: &Shared, jobs: HashMap<u64, SqJob>) {
    let now = Instant::now();
    let mut ended = Vec::new();
    let mut cancel = Vec::new();
    {
        let mut st = lock(&shared.state);
        st.unparseable_since = None;
        let ids: Vec<u64> = st.watches.values().map(|w| w.job_id).collect();
        st.last = ids.iter().filter_map(|id| jobs.get(id).map(|j| (*id, j.clone()))).collect();
        let dirs: Vec<PathBuf> = st.watches.keys().cloned().collect();
        for dir in dirs {
            let Some(w) = st.watches.get_mut(&dir) else { continue };
            let job = jobs.get(&w.job_id);
            let done = match job {
                Some(j) if !is_live_state(&j.job_state) => true,
                // A gang's replica ends with its step, while the allocation goes on.
                Some(_) => w.status_seen.is_some_and(|t| w.gang.is_some() || now.duration_since(t) >= STATUS_WITHOUT_END),
                None => {
                    w.missing_since.get_or_insert(now);
                    if w.status_seen.is_some() {
                        true
                    } else if w.missing_since.is_some_and(|t| now.duration_since(t) >= MISSING_BOUND) {
                        cancel.push(w.job_id);
                        true
                    } else {
                        false
                    }
                }
            };
            if job.is_some() {
                w.missing_since = None;
            }
            if done {
                let w = st.watches.remove(&dir).expect("present");
                if let Some(g) = w.gang.as_ref().and_then(|g| st.gangs.get_mut(g)) {
                    g.last_end = Some(now);
                }
                ended.push((dir, w, job.cloned()));
            }
        }
    }
    for id in cancel {
        let _ = scancel(&shared.opts, &[&id.to_string()]);
    }
    for (dir, w, job) in ended {
        let status = shim::read_status(&dir).ok().flatten();
        let started = w.started_sent || dir.join(shim::STARTED_FILE).exists();
        let mut outcome = outcome_for(job.as_ref(), status.as_ref(), started, w.stopped);
        if let Some(node) = &w.drained {
            if !matches!(outcome, Outcome::StartError { .. } | Outcome::LaunchFailed { .. } | Outcome::OomKilled { .. }) {
                outcome = Outcome::Lost { message: format!("node {node} was drained for maintenance") };
            }
        }
        let ran = !matches!(outcome, Outcome::StartError { .. } | Outcome::LaunchFailed { .. });
        report_end(&w.run, &dir, &w.sink, ran && started, w.started_sent, outcome);
    }
}

/// `squeue` printed something that does not parse: after a while, end every watched run
/// as an internal error (L16), cancelling its job first.
pub(super) fn unparseable(shared: &Shared, message: String) {
    let mut st = lock(&shared.state);
    let since = *st.unparseable_since.get_or_insert_with(Instant::now);
    if since.elapsed() < UNPARSEABLE_BOUND {
        return;
    }
    st.unparseable_since = None;
    let all: Vec<(PathBuf, Watch)> = st.watches.drain().collect();
    drop(st);
    for (dir, w) in all {
        let _ = scancel(&shared.opts, &[&w.job_id.to_string()]);
        let outcome = Outcome::LaunchFailed { message: format!("cannot read the state of Slurm job {}: {message}", w.job_id) };
        report_end(&w.run, &dir, &w.sink, false, w.started_sent, outcome);
    }
}
