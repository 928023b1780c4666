//! A session in a replica that runs on the Slurm cluster (`custom-jobs exec`,
//! `port-forward`): a step of the replica's own allocation on the replica's node, as
//! `srun --jobid=JOB --overlap --pty` gives one by hand:
//!
//! ```text
//! srun --jobid=<job> --overlap --nodes=1 --ntasks=1 --nodelist=<node> --quiet [--pty]
//!      <trainyard> shim enter <run_dir> --report-file <file> ...
//! ```
//!
//! The step shares the allocation's resources (`--overlap`), so it starts while the
//! replica holds them all; on the node, `enter` joins the replica's namespaces and takes its
//! identity as on the local backend. The step ends when its command does (Slurm kills what
//! the step started), and with the allocation.

use std::ffi::OsString;
use std::path::Path;

use crate::shim;

use super::{gang, read_job_file};

/// The `srun` command (program first) that runs a step in the allocation of the replica
/// whose run directory is `run_dir`, on its node; the command to run in the step follows
/// it. Why not, when the run has no job or node yet.
pub fn step_command(run_dir: &Path, tty: bool) -> Result<Vec<OsString>, String> {
    let job = job_of(run_dir)?;
    let node = match shim::read_started(run_dir) {
        Ok(Some(s)) => s.node.ok_or("the replica's node is not known (its supervisor did not say it)")?,
        Ok(None) => return Err("the replica's program has not started yet".into()),
        Err(e) => return Err(format!("the replica's start: {e}")),
    };
    let mut args: Vec<OsString> = ["srun", &format!("--jobid={job}"), "--overlap", "--nodes=1", "--ntasks=1", &format!("--nodelist={node}"), "--quiet"]
        .iter()
        .map(OsString::from)
        .collect();
    if tty {
        args.push("--pty".into());
    }
    Ok(args)
}

/// The Slurm job whose allocation the run is in: its own, or its gang's.
fn job_of(run_dir: &Path) -> Result<u64, String> {
    if let Some(step) = gang::step_of(run_dir) {
        if let Some(job) = step.split_once('.').and_then(|(j, _)| j.parse().ok()) {
            return Ok(job);
        }
    }
    let file = read_job_file(run_dir).map_err(|e| e.to_string())?.ok_or("the replica was not submitted to Slurm")?;
    let id = match &file.gang {
        Some(g) => gang::read_file(g).map_err(|e| e.to_string())?.and_then(|f| f.job_id),
        None => file.job_id,
    };
    id.ok_or_else(|| "the replica's Slurm job has no id yet (it is being submitted)".to_string())
}

/// Lines `srun` adds to a step's standard error about how its task ended
/// (`srun: error: n1: task 0: Exited with exit code 3`): the session says that itself, by
/// its status.
pub fn is_task_end_line(line: &[u8]) -> bool {
    let Some(rest) = line.strip_prefix(b"srun: error: ") else { return false };
    let text = String::from_utf8_lossy(rest);
    let mut parts = text.splitn(3, ": ");
    let (Some(_node), Some(task), Some(what)) = (parts.next(), parts.next(), parts.next()) else { return false };
    let what = what.trim_end();
    task.strip_prefix("task ").is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit() || b == b'-' || b == b','))
        && (what.starts_with("Exited with exit code ") || matches!(what, "Terminated" | "Killed" | "Aborted" | "Interrupt") || what.starts_with("Out Of Memory"))
}

/// A stream that carries `srun`'s own standard error (a step's stderr, or its terminal),
/// less the lines of [`is_task_end_line`]. Whole lines pass as they come; a last,
/// unfinished line that may be one of those waits for its end (or [`finish`](Self::finish)).
#[derive(Debug, Default)]
pub struct TaskEndFilter {
    pending: Vec<u8>,
}

impl TaskEndFilter {
    /// What of `chunk` (after what was held back) may be shown now.
    pub fn feed(&mut self, chunk: &[u8]) -> Vec<u8> {
        self.pending.extend_from_slice(chunk);
        let mut out = Vec::with_capacity(self.pending.len());
        let mut rest: &[u8] = &self.pending;
        while let Some(end) = rest.iter().position(|b| *b == b'\n') {
            let (line, tail) = rest.split_at(end + 1);
            if !is_task_end_line(line.strip_suffix(b"\n").unwrap_or(line)) {
                out.extend_from_slice(line);
            }
            rest = tail;
        }
        const PREFIX: &[u8] = b"srun: error: ";
        let n = rest.len().min(PREFIX.len());
        let held = if rest[..n] == PREFIX[..n] { rest.to_vec() } else {
            out.extend_from_slice(rest);
            Vec::new()
        };
        self.pending = held;
        out
    }

    /// What was held back, at the stream's end.
    pub fn finish(&mut self) -> Vec<u8> {
        let last = std::mem::take(&mut self.pending);
        if is_task_end_line(&last) {
            Vec::new()
        } else {
            last
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn srun_task_end_lines_are_told_apart() {
        assert!(is_task_end_line(b"srun: error: n2: task 0: Exited with exit code 3"));
        assert!(is_task_end_line(b"srun: error: n1: task 0: Terminated\r"));
        assert!(is_task_end_line(b"srun: error: n1: task 0: Killed"));
        assert!(!is_task_end_line(b"srun: error: Unable to create step for job 117: Requested node configuration is not available"));
        assert!(!is_task_end_line(b"my program: error: task 0: Terminated"));
        assert!(!is_task_end_line(b"srun: error: n1: task x: Killed"));
    }

    #[test]
    fn the_filter_drops_srun_task_end_lines_and_holds_only_what_may_be_one() {
        let mut f = TaskEndFilter::default();
        assert_eq!(f.feed(b"to-err\nsrun: err"), b"to-err\n");
        assert_eq!(f.feed(b"or: n1: task 0: Exited with exit code 7\r\nafter"), b"after");
        assert_eq!(f.feed(b"srun: error: Unable to create step\n"), b"srun: error: Unable to create step\n");
        assert_eq!(f.feed(b"srun: error: n1: task 0: Killed"), b"");
        assert_eq!(f.finish(), b"");
        assert_eq!(f.feed(b"sr"), b"");
        assert_eq!(f.finish(), b"sr");
        assert_eq!(f.feed(b"no newline at all"), b"no newline at all");
    }

    #[test]
    fn a_run_without_a_job_or_node_says_why() {
        let dir = std::env::temp_dir().join(format!("ty-slurm-session-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert!(step_command(&dir, false).unwrap_err().contains("not submitted"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
