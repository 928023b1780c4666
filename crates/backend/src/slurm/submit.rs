//! The submitter thread: see "Submission" in the module docs of [`super`].

use super::*;

/// The submitter thread: see "Submission" in the module docs.
pub(super) fn submitter(shared: Arc<Shared>) {
    loop {
        let (dir, t) = next_submission(&shared);
        submit(&shared, &dir, t);
    }
}

/// Waits for a run that is due (queued, or stopped, and the controller's backoff over)
/// and marks it in flight.
pub(super) fn next_submission(shared: &Shared) -> (PathBuf, Try) {
    let mut st = lock(&shared.state);
    loop {
        let now = Instant::now();
        let open = st.ctld_retry_at.is_none_or(|t| t <= now);
        let due = st
            .submits
            .iter()
            .filter(|(_, s)| !s.in_flight && (open || (s.stopped && !s.maybe_submitted)))
            .min_by_key(|(_, s)| s.queued)
            .map(|(d, _)| d.clone());
        if let Some(dir) = due {
            st.in_flight_since = Some(now);
            let s = st.submits.get_mut(&dir).expect("present");
            s.in_flight = true;
            let t = Try {
                run: s.run.clone(),
                sink: s.sink.clone(),
                args: s.args.clone(),
                name: s.name.clone(),
                look_first: s.look_first,
                maybe_submitted: s.maybe_submitted,
                stopped: s.stopped,
                members: s.members.clone(),
            };
            return (dir, t);
        }
        let waiting = st.submits.values().any(|s| !s.in_flight);
        st = match st.ctld_retry_at {
            Some(t) if waiting => {
                let d = t.saturating_duration_since(now);
                shared.submit_wake.wait_timeout(st, d).unwrap_or_else(|p| p.into_inner()).0
            }
            _ => shared.submit_wake.wait(st).unwrap_or_else(|p| p.into_inner()),
        };
    }
}

/// The controller answered: no more backoff.
pub(super) fn controller_answered(shared: &Shared) {
    let mut st = lock(&shared.state);
    st.ctld_tries = 0;
    st.ctld_error = None;
    st.ctld_retry_at = None;
}

/// One try of one run: look its job up if it may exist, else `sbatch` it.
pub(super) fn submit(shared: &Shared, dir: &Path, t: Try) {
    let opts = &shared.opts;
    if t.stopped && !t.maybe_submitted {
        // Stopped before anything reached Slurm: nothing to cancel.
        t.forget(dir);
        end_submit(shared, dir, &t, outcome_for(None, None, false, true));
        return;
    }
    if t.look_first {
        let found = find_by_output(opts, dir);
        if found.as_ref().is_ok() {
            controller_answered(shared);
        }
        match found {
            Ok(Some(id)) => return submitted(shared, dir, &t, id),
            Ok(None) if t.stopped || t.shim_ran(dir) => {
                // Not in Slurm: stopped, or the shim ran and its job is gone. Never submit
                // it (again).
                t.forget(dir);
                {
                    let mut st = lock(&shared.state);
                    st.submits.remove(dir);
                    st.in_flight_since = None;
                }
                for (run, d) in t.runs(dir) {
                    if t.stopped && !shim_ran(&d) {
                        report_end(&run, &d, &t.sink, false, false, outcome_for(None, None, false, true));
                    } else {
                        report_from_dir(&run, &d, &t.sink, true);
                    }
                }
                return;
            }
            Ok(None) => {}
            Err(m) if is_transient(&m) => return retry(shared, dir, &t, m, false),
            Err(m) => {
                // The marker stays: whether a job exists is unknown.
                return end_submit(shared, dir, &t, Outcome::LaunchFailed { message: slurm_err("squeue --json", m).to_string() });
            }
        }
    }
    let result = run_cmd("sbatch", &t.args, opts.command_timeout);
    if !result.as_ref().is_err_and(|m| is_transient(m)) {
        controller_answered(shared);
    }
    match result {
        Ok(out) => {
            let text = String::from_utf8_lossy(&out);
            // --parsable: "<id>" or "<id>;<cluster>".
            match text.trim().split(';').next().and_then(|s| s.trim().parse::<u64>().ok()) {
                Some(id) => submitted(shared, dir, &t, id),
                None => {
                    tracing::error!(run = %t.run, "sbatch printed {text:?}, not a job id");
                    let e = slurm_err("sbatch", format!("unexpected output {:?}", text.trim()));
                    end_submit(shared, dir, &t, Outcome::LaunchFailed { message: e.to_string() });
                }
            }
        }
        Err(m) if is_transient(&m) => {
            // A try that timed out may have reached the controller.
            let maybe = m.contains("did not finish within") || m.to_ascii_lowercase().contains("timed out");
            retry(shared, dir, &t, m, maybe);
        }
        Err(m) => {
            // Refused: nothing was submitted (L16 for the driver).
            t.forget(dir);
            end_submit(shared, dir, &t, Outcome::LaunchFailed { message: slurm_err("sbatch", m).to_string() });
        }
    }
}

/// The controller could not be reached: every queued run waits for the backoff (2 s,
/// doubling up to 30 s), then this one is tried again, looking its job up first. The run
/// stays launching (its job PENDING) meanwhile.
pub(super) fn retry(shared: &Shared, dir: &Path, t: &Try, message: String, maybe_submitted: bool) {
    let mut st = lock(&shared.state);
    st.ctld_tries += 1;
    let delay = submit_backoff(st.ctld_tries);
    st.ctld_retry_at = Some(Instant::now() + delay);
    tracing::warn!(run = %t.run, "the Slurm controller is unreachable ({message}); trying again in {}s (try {})", delay.as_secs(), st.ctld_tries);
    st.ctld_error = Some((message, delay));
    st.in_flight_since = None;
    if let Some(s) = st.submits.get_mut(dir) {
        s.in_flight = false;
        s.look_first = true;
        s.maybe_submitted |= maybe_submitted;
    }
    drop(st);
    // A run stopped meanwhile may end now.
    shared.submit_wake.notify_all();
}

/// Ends a run that will not be submitted: reports `Exited` with the outcome.
pub(super) fn end_submit(shared: &Shared, dir: &Path, t: &Try, outcome: Outcome) {
    {
        let mut st = lock(&shared.state);
        st.submits.remove(dir);
        st.in_flight_since = None;
    }
    if !t.members.is_empty() {
        lock(&shared.state).gangs.remove(dir);
    }
    if let Outcome::LaunchFailed { message } = &outcome {
        tracing::error!(run = %t.run, "launch failed: {message}");
    }
    for (run, d) in t.runs(dir) {
        report_end(&run, &d, &t.sink, false, false, outcome.clone());
    }
}

/// The run has a job: records its id durably, then watches it (and stops it at once if
/// it was stopped meanwhile).
pub(super) fn submitted(shared: &Shared, dir: &Path, t: &Try, id: u64) {
    let gang = (!t.members.is_empty()).then(|| dir.to_path_buf());
    let recorded = (|| -> Result<(), BackendError> {
        if let Some(g) = &gang {
            let mut f = gang::read_file(g)?.ok_or_else(|| slurm_err("read gang.json", format!("{} is gone", g.display())))?;
            f.job_id = Some(id);
            gang::write_file(g, &f)?;
        }
        for (_, d) in t.runs(dir) {
            let f = SlurmJobFile { job_id: Some(id), job_name: t.name.clone(), submitted_micros: fsutil::now_micros(), gang: gang.clone() };
            write_job_file(&d, &f)?;
        }
        Ok(())
    })();
    if let Err(e) = recorded {
        // Without a durable id a restarted server could not find the job: cancel it.
        let _ = scancel(&shared.opts, &[&id.to_string()]);
        return end_submit(shared, dir, t, Outcome::LaunchFailed { message: e.to_string() });
    }
    let stopped = {
        let mut st = lock(&shared.state);
        if let Some(g) = gang.as_ref().and_then(|g| st.gangs.get_mut(g)) {
            g.job_id = Some(id);
        }
        st.submits.get(dir).is_some_and(|s| s.stopped)
    };
    for (run, d) in t.runs(dir) {
        watch(shared, run, d, id, t.sink.clone(), stopped, gang.clone());
    }
    {
        // The gang's own entry (its directory) is done with.
        let mut st = lock(&shared.state);
        if st.submits.remove(dir).is_some_and(|s| s.in_flight) {
            st.in_flight_since = None;
        }
    }
    if stopped {
        let first = t.runs(dir).into_iter().next();
        if let Some((run, d)) = first {
            if let Err(e) = stop_job(shared, &run, &d) {
                tracing::warn!(run = %run, "stop: {e}");
            }
        }
    }
}

/// Sends `Started` (if the program ran and it was not sent) and `Exited`.
pub(super) fn report_end(run: &RunId, run_dir: &Path, sink: &EventSink, ran: bool, started_sent: bool, outcome: Outcome) {
    if ran && !started_sent {
        if let Ok(Some(s)) = shim::read_started(run_dir) {
            sink(BackendEvent::Started { run: run.clone(), pid: s.pid });
        }
    }
    let stderr_tail = log::stderr_tail(run_dir, STDERR_TAIL_LINES).unwrap_or_default();
    sink(BackendEvent::Exited { run: run.clone(), outcome, stderr_tail });
}
