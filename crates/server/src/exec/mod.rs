//! Sessions in running replicas (`custom-jobs exec`): a command, or a shell on a terminal,
//! inside a replica's own sandbox, bridged to a WebSocket (the protocol of
//! [`trainyard_api::exec`], docs/exec.md).
//!
//! A session is `trainyard shim enter <run dir>` ([`trainyard_backend::enter`]), started by
//! the server with nothing of its environment: the replica's cgroups, namespaces, user,
//! limits and environment, or its container's `podman exec`. What kept it from entering
//! comes back on a report pipe before anything is upgraded, as an error in the API's
//! format. It ends with its command, when the replica ends, after `[exec]
//! idle_timeout_secs` with no input or output, or when its client goes; each project holds
//! at most `[exec] max_sessions_per_project` at once. Every session is audited (holder,
//! job, replica, command, start, end, how it ended) and counted in metrics.

mod session;

use std::collections::HashMap;
use std::ffi::OsString;
use std::sync::{Arc, Mutex};

use trainyard_api::ApiError;

pub use session::{Request, Session, Slot};

/// What a session may use: the shim's command, the limits, the open sessions per project.
pub struct Exec {
    /// The shim's program and leading arguments; a session is `<shim> enter ...`.
    shim: Vec<OsString>,
    cfg: crate::config::Exec,
    /// Replicas run on the Slurm cluster: a session is a step of the replica's allocation.
    slurm: bool,
    open: Arc<Mutex<HashMap<String, usize>>>,
    metrics: Arc<crate::metrics::Metrics>,
    /// True once the server stops: every session ends, saying so.
    stopping: tokio::sync::watch::Sender<bool>,
}

impl Exec {
    pub fn new(shim: Vec<OsString>, cfg: &crate::config::Config, metrics: Arc<crate::metrics::Metrics>) -> Exec {
        let slurm = matches!(cfg.backend, crate::config::BackendChoice::Slurm(_));
        Exec { shim, cfg: cfg.exec.clone(), slurm, open: Arc::default(), metrics, stopping: tokio::sync::watch::Sender::new(false) }
    }

    /// One of the project's sessions, or 429 naming the limit.
    pub fn take_slot(&self, project: &str) -> Result<Slot, ApiError> {
        let mut open = self.open.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let all: usize = open.values().sum();
        if all >= self.cfg.max_sessions {
            return Err(ApiError::resource_exhausted(format!(
                "The server has {all} sessions in running replicas open, its limit (exec.max_sessions = {}); try again later.",
                self.cfg.max_sessions
            )));
        }
        let n = open.entry(project.to_string()).or_insert(0);
        if *n >= self.cfg.max_sessions_per_project {
            return Err(ApiError::resource_exhausted(format!(
                "Project \"{project}\" has {n} sessions in running replicas open, the limit (exec.max_sessions_per_project = {}); \
                 end one first.",
                self.cfg.max_sessions_per_project
            )));
        }
        *n += 1;
        Ok(Slot { open: Arc::clone(&self.open), metrics: Arc::clone(&self.metrics), project: project.to_string(), stopping: self.stopping.subscribe() })
    }

    /// The server stops: every open session ends with a status that says so (its command
    /// is killed; the replica goes on), and this waits up to `bound` for them to be gone.
    pub async fn stop(&self, bound: std::time::Duration) {
        self.stopping.send_replace(true);
        let deadline = tokio::time::Instant::now() + bound;
        while tokio::time::Instant::now() < deadline {
            if self.open.lock().map(|m| m.is_empty()).unwrap_or(true) {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }

    /// Starts the session's process and waits until it entered the replica (or says why it
    /// could not: FAILED_PRECONDITION with the reason).
    pub async fn start(&self, req: Request, slot: Slot) -> Result<Session, ApiError> {
        match Session::start(&self.shim, self.slurm, req, slot, self.cfg.idle_timeout).await {
            Ok(s) => {
                self.metrics.exec_opened();
                Ok(s)
            }
            Err((e, slot)) => {
                self.metrics.exec_ended(slot.project(), "refused", false);
                Err(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn exec(max: usize) -> Arc<Exec> {
        let cfg = crate::config::Config::builtin(None);
        let mut e = Exec::new(vec!["trainyard-shim".into()], &cfg, Arc::new(crate::metrics::Metrics::disabled()));
        e.cfg.max_sessions_per_project = max;
        Arc::new(e)
    }

    #[test]
    fn a_project_holds_at_most_its_sessions_and_gets_them_back() {
        let e = exec(2);
        let a = e.take_slot("evil").expect("first");
        let _b = e.take_slot("evil").expect("second");
        let over = e.take_slot("evil").err().expect("third refused");
        assert_eq!(over.code, trainyard_api::Code::ResourceExhausted);
        assert!(over.message.contains("exec.max_sessions_per_project = 2"), "{}", over.message);
        assert!(e.take_slot("victim").is_ok(), "another project's share is its own");
        drop(a);
        assert!(e.take_slot("evil").is_ok(), "a slot comes back when its session ends");
    }

    #[test]
    fn the_server_holds_at_most_its_sessions_whatever_the_projects() {
        let cfg = crate::config::Config::builtin(None);
        let mut e = Exec::new(vec!["trainyard-shim".into()], &cfg, Arc::new(crate::metrics::Metrics::disabled()));
        e.cfg.max_sessions = 3;
        let held: Vec<Slot> = (0..3).map(|i| e.take_slot(&format!("p{i}")).expect("under the limit")).collect();
        let over = e.take_slot("p9").err().expect("one more refused");
        assert!(over.message.contains("exec.max_sessions = 3"), "{}", over.message);
        drop(held);
        assert!(e.take_slot("p9").is_ok());
    }

    #[test]
    fn commands_are_audited_as_typed() {
        let r = |argv: &[&str]| Request {
            holder: "h".into(),
            project: "p".into(),
            job: 1,
            replica: "workerpool0-0".into(),
            run_dir: PathBuf::new(),
            argv: argv.iter().map(|s| s.to_string()).collect(),
            tty: None,
            connect: None,
        };
        assert_eq!(r(&[]).command_text(), "(shell)");
        assert_eq!(Request { connect: Some(8888), ..r(&[]) }.command_text(), "(port-forward to port 8888)");
        assert_eq!(r(&["sh", "-c", "echo hi"]).command_text(), "sh -c \"echo hi\"");
    }
}
