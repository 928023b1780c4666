//! Gangs: every replica of an attempt in one Slurm allocation.
//!
//! A `launch` of two or more first runs of one attempt (L6) becomes one batch job that
//! holds the whole gang, so that two multi-replica jobs on a cluster with room for one
//! never each hold a part of it and wait for the rest for ever:
//!
//! ```text
//! sbatch --parsable --no-requeue --job-name=ty-<job>-<attempt>-gang --partition=P
//!        --ntasks=<replicas> --cpus-per-task=C [--mem-per-cpu=<MB>] [--gpus-per-task=K]
//!        [--time=M] --chdir=<gang> --output=<gang>/slurm.out <gang>/gang.sh
//! ```
//!
//! Every task has the largest replica's shape (CPUs, memory, GPUs): one homogeneous
//! allocation, which Slurm's main scheduler starts at once, unlike a heterogeneous job
//! (only the backfill scheduler starts those, after `bf_interval`). The batch script
//! (`<attempt>/.gang/gang.sh`) starts one job step per replica,
//!
//! ```text
//! srun --ntasks=1 --nodes=1 --exact --cpus-per-task=C [--mem-per-cpu=..] [--gpus-per-task=K]
//!      --output=<run>/slurm.out --open-mode=append
//!      sh -c 'echo "$SLURM_JOB_ID.$SLURM_STEP_ID" > <run>/slurm-step; exec "$@"' <run> <shim> <run>
//! ```
//!
//! each in the background, so that each replica's program starts as soon as its step
//! does (L6). The step's wrapper records the step's id; the step's cgroup limits the
//! replica's memory and the shim reads its OOM kills from it (L14). After its steps the
//! script keeps the allocation until the server writes `<gang>/release` (at most
//! [`HOLD_MAX_SECS`] without a server): a replica restarted in place (L10) is a new step
//! in the same allocation, `srun --jobid=<id> ...` from the server, detached from it.
//! The server releases a gang [`LINGER`] after its last run ended with no new one.
//!
//! A stop of one replica is `scancel --signal=TERM <id>.<step>` (its shim stops the
//! program with the grace period), then `scancel <id>.<step>` as the backstop; a stop
//! while the allocation is pending cancels the allocation, and every replica of it ends
//! as stopped (a pending gang is stopped as a whole: by a cancel, a timeout or a new
//! attempt). A node lost under the allocation ends every step: Slurm's report (NODE_FAIL)
//! makes every replica `Lost`.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde::{Deserialize, Serialize};

use super::{os, request_for, sh_quote, NodeSize, Request, SlurmOptions, SLURM_OUT_FILE};
use crate::seam::BackendError;
use crate::shim::ShimSpec;
use trainyard_core::RunId;

/// `<attempt>/.gang`: the gang's directory.
pub const GANG_DIR: &str = ".gang";
/// `<gang>/gang.json`.
pub const GANG_FILE: &str = "gang.json";
/// `<gang>/gang.sh`: the batch script.
pub const SCRIPT_FILE: &str = "gang.sh";
/// `<gang>/release`: its existence ends the batch script and with it the allocation.
pub const RELEASE_FILE: &str = "release";
/// `<run>/slurm-step`: `<job id>.<step id>` of the step the run's shim runs in.
pub const STEP_FILE: &str = "slurm-step";
/// How long an allocation is kept after the last run of its gang ended: a replica is
/// restarted in place at once (L10), so a restart comes well within this.
pub const LINGER: std::time::Duration = std::time::Duration::from_secs(5);
/// The longest a batch script keeps an allocation whose steps have all ended when no
/// server releases it (the server is down).
pub const HOLD_MAX_SECS: u64 = 300;

/// `<gang>/gang.json`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GangFile {
    /// `None` while `sbatch` runs (or if the server died during it).
    pub job_id: Option<u64>,
    pub job_name: String,
    /// The `srun` options of one replica's step (for a restart in place).
    pub step_args: Vec<String>,
    /// The first run of every replica, in order.
    pub runs: Vec<PathBuf>,
}

/// The gang directory of a run directory (`runs/<job>/<attempt>/<replica>/<restart>`).
pub fn dir_of(run_dir: &Path) -> Option<PathBuf> {
    Some(run_dir.parent()?.parent()?.join(GANG_DIR))
}

pub fn read_file(gang: &Path) -> Result<Option<GangFile>, BackendError> {
    super::read_record(gang, GANG_FILE)
}

pub fn write_file(gang: &Path, f: &GangFile) -> Result<(), BackendError> {
    super::write_record(gang, GANG_FILE, f)
}

/// The step a run's shim runs in (`<job id>.<step id>`), once its wrapper wrote it.
pub fn step_of(run_dir: &Path) -> Option<String> {
    let text = std::fs::read_to_string(run_dir.join(STEP_FILE)).ok()?;
    let step = text.trim();
    let (job, id) = step.split_once('.')?;
    (job.parse::<u64>().is_ok() && id.parse::<u64>().is_ok()).then(|| step.to_string())
}

/// What one gang asks of Slurm.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    pub sbatch_args: Vec<OsString>,
    pub script: String,
    pub step_args: Vec<String>,
    pub name: String,
}

/// The job name of a gang.
pub fn job_name(run: &RunId) -> String {
    format!("ty-{}-{}-gang", run.job, run.attempt)
}

/// Every task's request: the largest of the replicas' (CPUs, memory, GPUs), and the
/// longest time limit; reduced to the partition's largest node with `fit_to_nodes`.
fn task_request(opts: &SlurmOptions, sizes: &std::collections::HashMap<String, NodeSize>, runs: &[(RunId, PathBuf, ShimSpec)]) -> (String, Request) {
    let mut req = Request::default();
    for (run, _, spec) in runs {
        let r = request_for(run, spec);
        req.cpus = req.cpus.max(r.cpus);
        req.memory_mb = req.memory_mb.max(r.memory_mb);
        req.gpus = req.gpus.max(r.gpus);
        req.time_minutes = req.time_minutes.max(r.time_minutes);
    }
    req.cpus = req.cpus.max(1);
    super::partition_for(opts, sizes, req)
}

/// The per-task resource options, shared by the allocation and its steps.
fn task_options(req: &Request) -> Vec<String> {
    let mut a = vec![format!("--cpus-per-task={}", req.cpus)];
    if let Some(mb) = req.memory_mb {
        a.push(format!("--mem-per-cpu={}M", mb.div_ceil(u64::from(req.cpus.max(1)))));
    }
    if req.gpus > 0 {
        a.push(format!("--gpus-per-task={}", req.gpus));
    }
    a
}

/// The `srun` options of one replica's step, before `--output`.
fn step_options(req: &Request) -> Vec<String> {
    let mut a: Vec<String> = ["--ntasks=1", "--nodes=1", "--exact"].iter().map(|s| s.to_string()).collect();
    a.extend(task_options(req));
    a
}

/// The command that starts one replica's step: `srun` with the step's options, its
/// output file, and the wrapper that records the step and execs the shim.
pub fn step_command(step_args: &[String], shim_command: &[OsString], run_dir: &Path) -> Vec<OsString> {
    let mut c: Vec<OsString> = step_args.iter().map(OsString::from).collect();
    let mut out = OsString::from("--output=");
    out.push(run_dir.join(SLURM_OUT_FILE));
    c.push(out);
    c.push("--open-mode=append".into());
    c.push("sh".into());
    c.push("-c".into());
    c.push(format!("echo \"$SLURM_JOB_ID.$SLURM_STEP_ID\" > \"$0/{STEP_FILE}.tmp\" && mv \"$0/{STEP_FILE}.tmp\" \"$0/{STEP_FILE}\"; exec \"$@\"").into());
    c.push(run_dir.as_os_str().to_owned());
    c.extend(shim_command.iter().cloned());
    c.push(run_dir.as_os_str().to_owned());
    c
}

/// The gang's `sbatch` arguments, batch script and step options.
pub fn plan(opts: &SlurmOptions, sizes: &std::collections::HashMap<String, NodeSize>, gang: &Path, runs: &[(RunId, PathBuf, ShimSpec)]) -> Plan {
    let (partition, req) = task_request(opts, sizes, runs);
    let name = runs.first().map(|(r, _, _)| job_name(r)).unwrap_or_else(|| "ty-gang".into());
    let mut a: Vec<OsString> = os(&["--parsable", "--no-requeue", "--open-mode=append"]);
    a.push(format!("--job-name={name}").into());
    a.push(format!("--partition={partition}").into());
    a.push(format!("--ntasks={}", runs.len()).into());
    a.extend(task_options(&req).into_iter().map(OsString::from));
    super::push_time_and_dirs(&mut a, req.time_minutes, gang);
    a.push(gang.join(SCRIPT_FILE).into_os_string());
    let step_args = step_options(&req);
    let quote = |s: &OsString| sh_quote(std::os::unix::ffi::OsStrExt::as_bytes(s.as_os_str()));
    let mut script = String::from("#!/bin/sh\n# Trainyard: one job step per replica; the allocation is kept until the server releases it.\n");
    for (_, dir, _) in runs {
        let mut line = String::from("srun");
        for part in step_command(&step_args, &opts.shim_command, dir) {
            line.push(' ');
            line.push_str(&quote(&part));
        }
        line.push_str(" &\n");
        script.push_str(&line);
    }
    script.push_str("wait\n");
    script.push_str(&format!(
        "n=0\nwhile [ ! -e {} ] && [ $n -lt {HOLD_MAX_SECS} ]; do sleep 1; n=$((n+1)); done\n",
        quote(&gang.join(RELEASE_FILE).into_os_string())
    ));
    Plan { sbatch_args: a, script, step_args, name }
}

/// A restart in place: a new step for `run_dir` in allocation `job_id`, started by an
/// `srun` detached from the server (`setsid -f`: it outlives a server restart, and the
/// server never waits for it).
pub fn start_step(opts: &SlurmOptions, job_id: u64, step_args: &[String], run_dir: &Path) -> Result<(), String> {
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(run_dir.join(SLURM_OUT_FILE))
        .map_err(|e| format!("{}: {e}", run_dir.join(SLURM_OUT_FILE).display()))?;
    let err = out.try_clone().map_err(|e| e.to_string())?;
    let mut args: Vec<OsString> = vec!["-f".into(), "srun".into(), format!("--jobid={job_id}").into()];
    args.extend(step_command(step_args, &opts.shim_command, run_dir));
    let status = Command::new("setsid")
        .args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::from(out))
        .stderr(Stdio::from(err))
        .status()
        .map_err(|e| format!("setsid srun: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("setsid srun exited with {status}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn spec(cpus: u32, mem_mb: u64, gpus: u32) -> ShimSpec {
        let mut s = ShimSpec::new(vec!["true".into()], Vec::new());
        s.memory_limit_bytes = Some(mem_mb * 1024 * 1024);
        s.resources.cpus = Some(cpus);
        if gpus > 0 {
            s.resources.accelerator = Some(("NVIDIA_TESLA_T4".into(), gpus));
        }
        s
    }

    fn run(replica: &str) -> RunId {
        RunId { job: 7, attempt: 1, replica: replica.into(), restart: 0 }
    }

    #[test]
    fn a_gang_is_one_homogeneous_allocation_of_the_largest_shape() {
        let opts = SlurmOptions::new("debug", vec!["/bin/trainyard".into(), "shim".into()]);
        let gang = PathBuf::from("/data/runs/7/1/.gang");
        let runs = vec![
            (run("workerpool0-0"), PathBuf::from("/data/runs/7/1/workerpool0-0/0"), spec(2, 1000, 0)),
            (run("workerpool1-0"), PathBuf::from("/data/runs/7/1/workerpool1-0/0"), spec(4, 3000, 1)),
            (run("workerpool1-1"), PathBuf::from("/data/runs/7/1/workerpool1-1/0"), spec(4, 3000, 1)),
        ];
        let p = plan(&opts, &HashMap::new(), &gang, &runs);
        let args: Vec<String> = p.sbatch_args.iter().map(|a| a.to_string_lossy().into_owned()).collect();
        for want in ["--job-name=ty-7-1-gang", "--ntasks=3", "--cpus-per-task=4", "--mem-per-cpu=750M", "--gpus-per-task=1"] {
            assert!(args.contains(&want.to_string()), "{want} in {args:?}");
        }
        assert_eq!(args.last().map(String::as_str), Some("/data/runs/7/1/.gang/gang.sh"));
        assert_eq!(p.script.matches("srun ").count(), 3, "{}", p.script);
        assert!(p.script.contains("'/data/runs/7/1/workerpool1-1/0'"), "{}", p.script);
        assert!(p.script.contains("--exact") && p.script.contains("wait\n"), "{}", p.script);
        assert!(p.script.contains("/data/runs/7/1/.gang/release"), "{}", p.script);
        let sh = std::process::Command::new("sh").args(["-n", "-c", &p.script]).status().expect("sh");
        assert!(sh.success(), "the script parses:\n{}", p.script);
    }

    #[test]
    fn step_files_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(step_of(dir.path()), None);
        std::fs::write(dir.path().join(STEP_FILE), "41.2\n").unwrap();
        assert_eq!(step_of(dir.path()).as_deref(), Some("41.2"));
        std::fs::write(dir.path().join(STEP_FILE), "41.2; rm -rf /\n").unwrap();
        assert_eq!(step_of(dir.path()), None, "only <job>.<step> is ever passed to scancel");
        assert_eq!(dir_of(Path::new("/d/runs/7/1/workerpool0-0/2")), Some(PathBuf::from("/d/runs/7/1/.gang")));
    }
}
