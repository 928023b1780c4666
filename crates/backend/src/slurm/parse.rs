//! What Slurm prints, read: `squeue --json` (openapi v0.0.38 in 22.05: only the fields
//! needed, unknown ones ignored), `sinfo`, and a run's outcome from its job's state and the
//! shim's status (L13, L14, L16).

use super::*;

#[derive(Debug, Deserialize)]
pub(super) struct SqueueDoc {
    #[serde(default)]
    jobs: Vec<serde_json::Value>,
}

/// One job of `squeue --json`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct SqJob {
    pub job_id: u64,
    #[serde(default)]
    pub job_state: String,
    #[serde(default)]
    pub state_reason: String,
    /// Raw wait status in 22.05 (an object in later versions: then ignored).
    #[serde(default)]
    pub exit_code: Option<serde_json::Value>,
    #[serde(default)]
    pub nodes: String,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub standard_output: String,
}

impl SqJob {
    pub fn raw_exit(&self) -> Option<i64> {
        self.exit_code.as_ref().and_then(|v| v.as_i64())
    }
}

/// Parses `squeue --json`. A job entry that does not parse is skipped (and counted); a
/// document that does not parse is an error.
pub fn parse_squeue(text: &[u8]) -> Result<(HashMap<u64, SqJob>, usize), String> {
    let doc: SqueueDoc = serde_json::from_slice(text).map_err(|e| format!("squeue --json output does not parse: {e}"))?;
    let mut out = HashMap::with_capacity(doc.jobs.len());
    let mut bad = 0;
    for v in doc.jobs {
        match serde_json::from_value::<SqJob>(v) {
            Ok(j) => {
                out.insert(j.job_id, j);
            }
            Err(_) => bad += 1,
        }
    }
    Ok((out, bad))
}

/// A wait status as Slurm reports it (`exit_code` of `squeue --json`): exit code in
/// bits 8-15, the signal in bits 0-6.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitStatus {
    Exited(i32),
    Signaled(i32),
}

pub fn decode_wait_status(raw: i64) -> WaitStatus {
    let signal = (raw & 0x7f) as i32;
    if signal != 0 {
        WaitStatus::Signaled(signal)
    } else {
        WaitStatus::Exited(((raw >> 8) & 0xff) as i32)
    }
}

/// States in which the job may still run or start.
pub fn is_live_state(state: &str) -> bool {
    matches!(
        state,
        "PENDING" | "RUNNING" | "COMPLETING" | "CONFIGURING" | "SUSPENDED" | "REQUEUED" | "REQUEUE_FED" | "REQUEUE_HOLD"
            | "RESIZING" | "SIGNALING" | "STAGE_OUT" | "RESV_DEL_HOLD" | "SPECIAL_EXIT" | "STOPPED"
    )
}

/// The outcome of an ended run, from the shim's `status.json` (when it wrote one) and the
/// job's final Slurm state:
/// - the shim's start and launch errors first (StartError is the user's, L13);
/// - `OUT_OF_MEMORY` → `OomKilled` (L14), with the status the shim saw (137 for SIGKILL);
/// - `NODE_FAIL` (or reason `NodeDown`), `BOOT_FAIL`, `PREEMPTED`, `DEADLINE`, `TIMEOUT` →
///   `Lost`: the engine took the replica away; the driver restarts it (L9/L10, not
///   counted against L11). TIMEOUT is Lost rather than `Signaled 15`: the limit is set
///   past Trainyard's own L19 deadline, so it only fires when the server was not there to
///   enforce L19, and then the recovered driver applies L19 itself; it is not the
///   program's fault and must not use up its restarts;
/// - otherwise the shim's status, as on the local backend;
/// - no status: a job stopped by Trainyard → `Signaled 15`; `JobLaunchFailure` or a job
///   that never ran the program → `LaunchFailed` (L16); a program that ran → `Lost`.
pub fn outcome_for(job: Option<&SqJob>, status: Option<&ShimStatus>, started: bool, stopped: bool) -> Outcome {
    if let Some(s) = status {
        if s.start_error.is_some() || s.launch_error.is_some() {
            return outcome_from_status(s);
        }
    }
    let state = job.map(|j| j.job_state.as_str()).unwrap_or("");
    let reason = job.map(|j| j.state_reason.as_str()).unwrap_or("");
    let nodes = job.map(|j| j.nodes.as_str()).unwrap_or("");
    let id = job.map(|j| j.job_id).unwrap_or(0);
    if state == "OUT_OF_MEMORY" {
        let status = match status.map(|s| (s.exit_code, s.signal)) {
            Some((_, Some(sig))) => 128 + sig,
            Some((Some(code), None)) if code != 0 => code,
            _ => 137,
        };
        return Outcome::OomKilled { status };
    }
    if matches!(state, "NODE_FAIL" | "BOOT_FAIL" | "PREEMPTED" | "DEADLINE") || reason == "NodeDown" {
        return Outcome::Lost { message: format!("Slurm job {id} on node {nodes} ended {state} ({reason})") };
    }
    if state == "TIMEOUT" {
        return Outcome::Lost { message: format!("Slurm job {id} reached its time limit (TIMEOUT)") };
    }
    if let Some(s) = status {
        return outcome_from_status(s);
    }
    if stopped {
        return Outcome::Signaled { signal: 15 };
    }
    let raw = job.and_then(|j| j.raw_exit());
    let how = match raw.map(decode_wait_status) {
        Some(WaitStatus::Exited(c)) => format!("exit status {c}"),
        Some(WaitStatus::Signaled(s)) => format!("signal {s}"),
        None => "no exit status".into(),
    };
    let what = if job.is_none() { "is no longer known to Slurm".to_string() } else { format!("ended {state} ({reason}, {how})") };
    if !started {
        return Outcome::LaunchFailed { message: format!("Slurm job {id} {what} before the program started") };
    }
    Outcome::Lost { message: format!("Slurm job {id} {what} without the shim recording an outcome") }
}

/// One node of `sinfo --json`: only the fields used, unknown ones ignored.
#[derive(Deserialize)]
pub(super) struct SinfoNode {
    #[serde(default)]
    name: String,
    #[serde(default)]
    cpus: u32,
    #[serde(default)]
    real_memory: u64,
    #[serde(default)]
    partitions: Vec<String>,
    #[serde(default)]
    state: String,
    #[serde(default)]
    state_flags: Vec<String>,
}

pub(super) fn sinfo_nodes(text: &[u8]) -> Result<Vec<SinfoNode>, String> {
    #[derive(Deserialize)]
    struct Doc {
        #[serde(default)]
        nodes: Vec<SinfoNode>,
    }
    let doc: Doc = serde_json::from_slice(text).map_err(|e| format!("sinfo --json output does not parse: {e}"))?;
    Ok(doc.nodes)
}

/// The partitions' largest node, from `sinfo --json`.
pub fn partition_sizes(text: &[u8]) -> Result<HashMap<String, NodeSize>, String> {
    let mut out: HashMap<String, NodeSize> = HashMap::new();
    for n in sinfo_nodes(text)? {
        for p in n.partitions {
            let e = out.entry(p).or_default();
            e.cpus = e.cpus.max(n.cpus);
            e.memory_mb = e.memory_mb.max(n.real_memory);
        }
    }
    Ok(out)
}

/// The nodes that are drained, draining or down, from `sinfo --json`.
pub fn unavailable_nodes(text: &[u8]) -> Result<Vec<String>, String> {
    Ok(sinfo_nodes(text)?
        .into_iter()
        .filter(|n| n.state_flags.iter().any(|f| f.starts_with("DRAIN")) || n.state.eq_ignore_ascii_case("down"))
        .map(|n| n.name)
        .collect())
}
