//! One session: the `enter` process (on pipes or a terminal) bridged to a WebSocket.

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::ws::{Message, WebSocket};
use nix::libc;
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use trainyard_api::exec::{Failure, Size, Status, RESIZE, STATUS, STDERR, STDIN, STDOUT};
use trainyard_api::ApiError;
use trainyard_backend::slurm::session::TaskEndFilter;

/// How long entering the replica may take (reading its spec, joining its namespaces).
const ENTER_BOUND: Duration = Duration::from_secs(10);
/// How often a session looks whether its replica has ended.
const REPLICA_CHECK: Duration = Duration::from_secs(1);
/// After the command exits, how long its last output may take to arrive.
const DRAIN_BOUND: Duration = Duration::from_secs(2);
/// How many times the processes an ended session left are looked for and killed.
const MEMBER_ROUNDS: usize = 50;
/// The most bytes read at once from the command (one WebSocket message): what a pipe
/// holds.
const CHUNK: usize = 64 * 1024;

/// The descriptor the `enter` process reports on.
const REPORT_FD: RawFd = 3;

/// Who enters which replica, and with what.
#[derive(Clone, Debug)]
pub struct Request {
    /// The token's holder, for the audit line.
    pub holder: String,
    pub project: String,
    pub job: u64,
    pub replica: String,
    pub run_dir: PathBuf,
    /// The command; empty: the replica's shell.
    pub argv: Vec<String>,
    /// A terminal of this size and `TERM`, else pipes.
    pub tty: Option<(Size, Option<String>)>,
    /// A connection to this port of the replica's loopback instead of a command
    /// (`port-forward`): its bytes are the session's input and output.
    pub connect: Option<u16>,
}

impl Request {
    /// The command as the audit line shows it.
    pub(super) fn command_text(&self) -> String {
        if let Some(port) = self.connect {
            format!("(port-forward to port {port})")
        } else if self.argv.is_empty() {
            "(shell)".into()
        } else {
            self.argv.iter().map(|a| if a.contains(char::is_whitespace) || a.is_empty() { format!("{a:?}") } else { a.clone() }).collect::<Vec<_>>().join(" ")
        }
    }
}

/// One open session of a project, given back when dropped.
pub struct Slot {
    pub(super) open: Arc<std::sync::Mutex<std::collections::HashMap<String, usize>>>,
    pub(super) metrics: Arc<crate::metrics::Metrics>,
    pub(super) project: String,
    /// Becomes true when the server stops.
    pub(super) stopping: tokio::sync::watch::Receiver<bool>,
}

impl Slot {
    fn metrics(&self) -> &crate::metrics::Metrics {
        &self.metrics
    }

    pub(super) fn project(&self) -> &str {
        &self.project
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self.open.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(n) = open.get_mut(&self.project) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                open.remove(&self.project);
            }
        }
    }
}

/// A started session, entered into its replica, not yet bridged.
pub struct Session {
    req: Request,
    slot: Slot,
    child: tokio::process::Child,
    /// The command's output (its stdout, or the terminal).
    out: Out,
    /// Its stderr (none with a terminal).
    err: Option<tokio::process::ChildStderr>,
    /// Where input goes.
    inp: In,
    idle_timeout: Duration,
    started: Instant,
    started_at: String,
    /// The replica cgroup's OOM kills when the session started (host programs).
    oom_before: Option<u64>,
    /// The pid of the session's first process: the id of its process group (a command) or
    /// of its session (a terminal), which what it starts keeps.
    leader: Option<i32>,
    /// On Slurm: the channel that carries srun's own standard error, and its filter.
    filter: Option<(u8, TaskEndFilter)>,
}

/// Where `enter` says whether it entered.
enum Report {
    /// A pipe whose write end `enter` gets as [`REPORT_FD`]: closed on its exec with
    /// nothing in it, it entered.
    Pipe(OwnedFd, OwnedFd),
    /// A file in the run directory (on Slurm, `enter` runs on the replica's node).
    File(PathBuf),
}

impl Report {
    /// Waits for the report: None once `enter` entered, else why not.
    async fn wait(self, child: &mut tokio::process::Child) -> Option<String> {
        match self {
            Report::Pipe(r, w) => {
                drop(w);
                match tokio::time::timeout(ENTER_BOUND, read_report(r)).await {
                    Ok(Ok(text)) if text.is_empty() => None,
                    Ok(Ok(text)) => Some(text),
                    Ok(Err(e)) => Some(format!("its report could not be read: {e}")),
                    Err(_) => Some(format!("entering it did not finish within {}s", ENTER_BOUND.as_secs())),
                }
            }
            Report::File(path) => {
                let deadline = Instant::now() + ENTER_BOUND;
                let why = loop {
                    let text = std::fs::read_to_string(&path).unwrap_or_default();
                    if text == trainyard_backend::enter::ENTERED {
                        break None;
                    }
                    if !text.is_empty() && !trainyard_backend::enter::ENTERED.starts_with(text.as_str()) {
                        break Some(text);
                    }
                    if let Ok(Some(status)) = child.try_wait() {
                        let said = std::fs::read_to_string(&path).unwrap_or_default();
                        break Some(if said.is_empty() || said == trainyard_backend::enter::ENTERED {
                            format!("a step in its Slurm allocation could not be started (srun: {status})")
                        } else {
                            said
                        });
                    }
                    if Instant::now() > deadline {
                        break Some(format!("entering it did not finish within {}s", ENTER_BOUND.as_secs()));
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                };
                let _ = std::fs::remove_file(&path);
                why
            }
        }
    }

    /// The report's file, when the session is not started after all.
    fn remove(&self) {
        if let Report::File(path) = self {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// A report file of its own in the run directory.
fn report_path(run_dir: &Path) -> PathBuf {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    run_dir.join(format!(".exec-{}-{n}.report", std::process::id()))
}

enum Out {
    Pipe(tokio::process::ChildStdout),
    Pty(Arc<AsyncFd<OwnedFd>>),
}

enum In {
    /// The command's stdin; `None` once the client ended its input.
    Pipe(Option<tokio::process::ChildStdin>),
    Pty(Arc<AsyncFd<OwnedFd>>),
}

/// How a session ended, for its client, the audit line and the metrics.
struct End {
    status: Status,
    outcome: &'static str,
}

impl Session {
    /// Starts `<shim> enter` for the request and waits for its report: nothing (it runs the
    /// command) or why it could not enter.
    pub(super) async fn start(shim: &[std::ffi::OsString], slurm: bool, req: Request, slot: Slot, idle_timeout: Duration) -> Result<Session, (ApiError, Slot)> {
        let fail = |e: ApiError, slot: Slot| Err((e, slot));
        let Some((program, lead)) = shim.split_first() else {
            return fail(ApiError::internal("no shim program to enter replicas with"), slot);
        };
        let refused = |why: &str| ApiError::failed_precondition(format!("Cannot enter replica {} of job {}: {why}.", req.replica, req.job));
        // Local replicas: `enter` here, reporting on a pipe. Slurm's: `enter` on the
        // replica's node in a step of its allocation, reporting in a file of its run.
        let (mut cmd, report) = if slurm {
            let step = match trainyard_backend::slurm::session::step_command(&req.run_dir, req.tty.is_some()) {
                Ok(s) => s,
                Err(why) => return fail(refused(&why), slot),
            };
            let Some((srun, opts)) = step.split_first() else { return fail(ApiError::internal("no srun command"), slot) };
            let path = report_path(&req.run_dir);
            if let Err(e) = std::fs::File::create(&path) {
                return fail(ApiError::unavailable(format!("cannot start a session: {}: {e}", path.display())), slot);
            }
            let mut cmd = tokio::process::Command::new(srun);
            cmd.args(opts).arg(program).args(lead).arg(trainyard_backend::enter::ENTER_ARG).arg(&req.run_dir);
            cmd.arg("--report-file").arg(&path);
            (cmd, Report::File(path))
        } else {
            let mut cmd = tokio::process::Command::new(program);
            cmd.args(lead).arg(trainyard_backend::enter::ENTER_ARG).arg(&req.run_dir);
            let (report_r, report_w) = match nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC) {
                Ok(p) => p,
                Err(e) => return fail(ApiError::unavailable(format!("cannot start a session: a pipe: {e}")), slot),
            };
            cmd.arg("--report-fd").arg(REPORT_FD.to_string());
            (cmd, Report::Pipe(report_r, report_w))
        };
        let mut pty_master = None;
        match &req.tty {
            Some((size, term)) => {
                cmd.arg("--tty");
                if let Some(t) = term {
                    cmd.arg("--term").arg(t);
                }
                let (master, slave) = match open_pty(*size) {
                    Ok(p) => p,
                    Err(e) => return fail(ApiError::unavailable(format!("cannot start a session: a terminal: {e}")), slot),
                };
                let (Ok(a), Ok(b)) = (slave.try_clone(), slave.try_clone()) else {
                    return fail(ApiError::unavailable("cannot start a session: the terminal's descriptors"), slot);
                };
                cmd.stdin(Stdio::from(slave)).stdout(Stdio::from(a)).stderr(Stdio::from(b));
                pty_master = Some(master);
            }
            None => {
                // A process group of its own, killed whole when the session ends.
                cmd.process_group(0).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
            }
        }
        if let Some(port) = req.connect {
            cmd.arg("--connect").arg(port.to_string());
        } else if !req.argv.is_empty() {
            cmd.arg("--").args(&req.argv);
        }
        // Nothing of the server's environment reaches the session (the replica's is given by
        // `enter`), but what `srun` needs to reach the cluster.
        cmd.env_clear().kill_on_drop(true);
        if slurm {
            for key in ["SLURM_CONF", "PATH"] {
                if let Some(v) = std::env::var_os(key) {
                    cmd.env(key, v);
                }
            }
        }
        if let Report::Pipe(_, report_w) = &report {
            let report_fd = report_w.as_raw_fd();
            // SAFETY: between fork and exec only dup2(2), which is async-signal-safe; the
            // descriptor stays open in the parent until the spawn returns.
            unsafe {
                cmd.pre_exec(move || {
                    if libc::dup2(report_fd, REPORT_FD) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        if slurm && req.tty.is_some() {
            // srun leads a session with the terminal as its controlling one, so that a new
            // size reaches it (SIGWINCH) and it passes it on to the step's terminal.
            // SAFETY: between fork and exec only setsid(2) and ioctl(2), which are
            // async-signal-safe.
            unsafe {
                cmd.pre_exec(|| {
                    if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let spawned = cmd.spawn();
        let mut child = match spawned {
            Ok(c) => c,
            Err(e) => {
                report.remove();
                let what = if slurm { "srun" } else { &program.to_string_lossy() };
                return fail(ApiError::unavailable(format!("cannot start a session ({what}): {e}")), slot);
            }
        };
        let oom_before = trainyard_backend::enter::replica_oom_kills(&req.run_dir);
        let why = report.wait(&mut child).await;
        if let Some(why) = why {
            kill(&mut child);
            let _ = child.wait().await;
            return fail(refused(&why), slot);
        }
        let (out, err, inp) = match pty_master {
            Some(master) => match nonblocking(master) {
                Ok(m) => {
                    let m = Arc::new(m);
                    (Out::Pty(Arc::clone(&m)), None, In::Pty(m))
                }
                Err(e) => {
                    kill(&mut child);
                    return fail(ApiError::unavailable(format!("cannot start a session: the terminal: {e}")), slot);
                }
            },
            None => match (child.stdin.take(), child.stdout.take(), child.stderr.take()) {
                (stdin, Some(stdout), Some(stderr)) => (Out::Pipe(stdout), Some(stderr), In::Pipe(stdin)),
                _ => {
                    kill(&mut child);
                    return fail(ApiError::unavailable("cannot start a session: its pipes"), slot);
                }
            },
        };
        let leader = child.id().and_then(|p| i32::try_from(p).ok());
        // srun's own lines about how the task ended are left out: the status says it.
        let filter = slurm.then(|| (if err.is_some() { STDERR } else { STDOUT }, TaskEndFilter::default()));
        Ok(Session { req, slot, child, out, err, inp, idle_timeout, started: Instant::now(), started_at: now_text(), oom_before, leader, filter })
    }

    /// Bridges the session to `ws` until it ends, then says how on the STATUS channel,
    /// closes, audits and counts it.
    pub async fn run(mut self, mut ws: WebSocket) {
        let end = self.bridge(&mut ws).await;
        let payload = serde_json::to_vec(&end.status).unwrap_or_default();
        let _ = tokio::time::timeout(Duration::from_secs(2), async {
            let _ = send(&mut ws, STATUS, &payload).await;
            let _ = ws.send(Message::Close(None)).await;
        })
        .await;
        let r = &self.req;
        tracing::info!(
            target: "audit",
            holder = r.holder.as_str(),
            project = r.project.as_str(),
            job = r.job,
            replica = r.replica.as_str(),
            command = r.command_text().as_str(),
            tty = r.tty.is_some(),
            start = self.started_at.as_str(),
            end = now_text().as_str(),
            seconds = self.started.elapsed().as_secs_f64(),
            outcome = end.outcome,
            exit_status = end.status.exit_status.map_or_else(String::new, |s| s.to_string()).as_str(),
            signal = end.status.signal.map_or_else(String::new, |s| s.to_string()).as_str(),
            "exec session"
        );
        self.slot.metrics().exec_ended(&self.req.project, end.outcome, true);
    }

    async fn bridge(&mut self, ws: &mut WebSocket) -> End {
        let mut out_buf = vec![0u8; CHUNK];
        let mut err_buf = vec![0u8; CHUNK];
        let mut out_open = true;
        let mut err_open = self.err.is_some();
        let mut last_activity = Instant::now();
        let mut stopping = self.slot.stopping.clone();
        let mut replica_check = tokio::time::interval(REPLICA_CHECK);
        replica_check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let ended = loop {
            let idle_at = tokio::time::Instant::from_std(last_activity + self.idle_timeout);
            tokio::select! {
                status = self.child.wait() => break Ok(status),
                n = read_out(&mut self.out, &mut out_buf), if out_open => match n {
                    Ok(0) | Err(_) => out_open = false,
                    Ok(n) => {
                        last_activity = Instant::now();
                        if pass(ws, &mut self.filter, STDOUT, &out_buf[..n]).await.is_err() {
                            break Err(client_gone());
                        }
                    }
                },
                n = read_err(&mut self.err, &mut err_buf), if err_open => match n {
                    Ok(0) | Err(_) => err_open = false,
                    Ok(n) => {
                        last_activity = Instant::now();
                        if pass(ws, &mut self.filter, STDERR, &err_buf[..n]).await.is_err() {
                            break Err(client_gone());
                        }
                    }
                },
                msg = ws.recv() => {
                    last_activity = Instant::now();
                    match msg {
                        Some(Ok(Message::Binary(b))) => {
                            if let Err(e) = self.input(&b).await {
                                break Err(End { status: failure(e), outcome: "refused" });
                            }
                        }
                        Some(Ok(Message::Ping(_) | Message::Pong(_))) => {}
                        Some(Ok(Message::Text(_))) => {
                            let e = ApiError::invalid_argument("Session messages are binary: a channel byte, then the payload (docs/exec.md).");
                            break Err(End { status: failure(e), outcome: "refused" });
                        }
                        Some(Err(e)) if too_large(&e) => {
                            let e = ApiError::invalid_argument(format!(
                                "A session message was larger than {} bytes, the most one may carry (docs/exec.md); the session ended. Send input in smaller messages.",
                                trainyard_api::exec::MAX_MESSAGE
                            ));
                            break Err(End { status: failure(e), outcome: "refused" });
                        }
                        Some(Ok(Message::Close(_))) | Some(Err(_)) | None => {
                            break Err(client_gone());
                        }
                    }
                }
                _ = tokio::time::sleep_until(idle_at) => {
                    let e = ApiError::new(trainyard_api::Code::DeadlineExceeded, format!(
                        "The session had no input and no output for {}s (exec.idle_timeout_secs) and was ended.",
                        self.idle_timeout.as_secs()
                    ));
                    break Err(End { status: failure(e), outcome: "idle" });
                }
                _ = async { let _ = stopping.wait_for(|s| *s).await; } => {
                    let e = ApiError::unavailable("The server is stopping (a restart or a shutdown): the session ends, and the replica goes on; open another once it is back.");
                    break Err(End { status: failure(e), outcome: "server_stopped" });
                }
                _ = replica_check.tick() => {
                    if replica_ended(&self.req.run_dir) {
                        let e = ApiError::failed_precondition(format!("Replica {} of job {} ended, and the session with it.", self.req.replica, self.req.job));
                        break Err(End { status: failure(e), outcome: "replica_ended" });
                    }
                }
            }
        };
        match ended {
            Ok(status) => {
                // What the command left running ends with the session, as a step's
                // processes end with the step on Slurm: the output they wrote is read below.
                self.end_members().await;
                // The command's last output, which may still be in the pipes or the terminal.
                let _ = tokio::time::timeout(DRAIN_BOUND, async {
                    while out_open || err_open {
                        tokio::select! {
                            n = read_out(&mut self.out, &mut out_buf), if out_open => match n {
                                Ok(0) | Err(_) => out_open = false,
                                Ok(n) => { let _ = pass(ws, &mut self.filter, STDOUT, &out_buf[..n]).await; }
                            },
                            n = read_err(&mut self.err, &mut err_buf), if err_open => match n {
                                Ok(0) | Err(_) => err_open = false,
                                Ok(n) => { let _ = pass(ws, &mut self.filter, STDERR, &err_buf[..n]).await; }
                            },
                        }
                    }
                })
                .await;
                if let Some((channel, filter)) = &mut self.filter {
                    let rest = filter.finish();
                    if !rest.is_empty() {
                        let _ = send(ws, *channel, &rest).await;
                    }
                }
                use std::os::unix::process::ExitStatusExt;
                let (exit_status, signal) = match &status {
                    Ok(s) => (s.code(), s.signal()),
                    Err(_) => (None, None),
                };
                let mut message = if exit_status.is_none() && signal.is_none() { "its end could not be read".to_string() } else { String::new() };
                if signal == Some(libc::SIGKILL) && self.oom_killed() {
                    message = "the command was killed for going past the replica's memory limit; the replica itself goes on".into();
                }
                End { status: Status { exit_status, signal, error: None, message }, outcome: "exited" }
            }
            Err(end) => {
                kill(&mut self.child);
                let _ = tokio::time::timeout(DRAIN_BOUND, self.child.wait()).await;
                self.end_members().await;
                end
            }
        }
    }

    /// Kills what is left of the session once its first process has ended: the processes
    /// of its process group and of its session (a shell's background jobs), over and over
    /// until none is left (one may fork meanwhile). A process that left both with setsid(2)
    /// lives on, until its replica ends. In a container, the session's processes are the
    /// engine's client; what the command started in the container is the engine's.
    async fn end_members(&self) {
        let Some(leader) = self.leader else { return };
        let left = tokio::task::spawn_blocking(move || {
            for _ in 0..MEMBER_ROUNDS {
                let members = trainyard_backend::procfs::members_of(leader);
                if members.is_empty() {
                    return 0;
                }
                for pid in &members {
                    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(*pid), nix::sys::signal::Signal::SIGKILL);
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            trainyard_backend::procfs::members_of(leader).len()
        })
        .await
        .unwrap_or(0);
        if left > 0 {
            tracing::warn!("job {} replica {}: {left} processes of an ended session are still there", self.req.job, self.req.replica);
        }
    }

    /// Was the command's SIGKILL the replica cgroup's OOM killer? Then the kill is written
    /// down as a session's, so that the replica's supervisor does not count it as its
    /// program's (L14).
    fn oom_killed(&self) -> bool {
        let after = trainyard_backend::enter::replica_oom_kills(&self.req.run_dir);
        let rose = matches!((self.oom_before, after), (Some(b), Some(a)) if a > b);
        if rose {
            if let Err(e) = trainyard_backend::shim::note_exec_oom_kill(&self.req.run_dir) {
                tracing::warn!("job {} replica {}: a session's OOM kill could not be written down: {e}", self.req.job, self.req.replica);
            }
        }
        rose
    }

    /// A message from the client: input, its end, or a new terminal size.
    async fn input(&mut self, msg: &[u8]) -> Result<(), ApiError> {
        let Some((&channel, payload)) = msg.split_first() else {
            return Err(ApiError::invalid_argument("An empty session message (it needs a channel byte)."));
        };
        match (channel, &mut self.inp) {
            (STDIN, In::Pipe(stdin)) => {
                if payload.is_empty() {
                    // The end of input.
                    *stdin = None;
                } else if let Some(w) = stdin {
                    if w.write_all(payload).await.is_err() {
                        *stdin = None;
                    }
                }
                Ok(())
            }
            (STDIN, In::Pty(master)) => {
                // A terminal's end of input is its EOF character (Ctrl-D).
                let bytes: &[u8] = if payload.is_empty() { &[4] } else { payload };
                write_all_fd(master, bytes).await.map_err(|e| ApiError::unavailable(format!("the terminal: {e}")))
            }
            (RESIZE, In::Pty(master)) => {
                let size: Size = serde_json::from_slice(payload)
                    .map_err(|e| ApiError::invalid_argument(format!("A resize message: {e} (it is {{\"cols\": N, \"rows\": N}})")))?;
                let size = size.check().map_err(|e| ApiError::invalid_argument(format!("A resize message: {e}")))?;
                // A size the terminal refuses leaves it as it was.
                let _ = set_size(master.get_ref(), size);
                Ok(())
            }
            (RESIZE, In::Pipe(_)) => Ok(()),
            (other, _) => Err(ApiError::invalid_argument(format!("Unknown session channel {other} (0 is input, 4 a terminal's size)."))),
        }
    }
}

/// Was a client's message or frame over the session's limit?
fn too_large(e: &axum::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = source {
        if matches!(err.downcast_ref::<tungstenite::Error>(), Some(tungstenite::Error::Capacity(_))) {
            return true;
        }
        source = err.source();
    }
    false
}

/// The client closed the session or its connection.
fn client_gone() -> End {
    End { status: failure(ApiError::new(trainyard_api::Code::Cancelled, "The client went away.")), outcome: "disconnected" }
}

fn failure(e: ApiError) -> Status {
    Status { error: Some(Failure::from(&e)), message: e.message.clone(), ..Status::default() }
}

async fn send(ws: &mut WebSocket, channel: u8, data: &[u8]) -> Result<(), axum::Error> {
    ws.send(Message::Binary(trainyard_api::exec::frame(channel, data).into())).await
}

/// Reads the report pipe to its end (closed when `enter` execs or exits).
async fn read_report(fd: OwnedFd) -> std::io::Result<String> {
    tokio::task::spawn_blocking(move || {
        use std::io::Read;
        let mut f = std::fs::File::from(fd);
        let mut text = String::new();
        f.by_ref().take(16 * 1024).read_to_string(&mut text)?;
        Ok(text.trim().to_string())
    })
    .await
    .map_err(std::io::Error::other)?
}

/// The command's output: the terminal's, or its stdout pipe.
async fn read_out(out: &mut Out, buf: &mut [u8]) -> std::io::Result<usize> {
    match out {
        Out::Pipe(stdout) => stdout.read(buf).await,
        Out::Pty(master) => read_fd(master, buf).await,
    }
}

/// Its stderr pipe (a terminal has none: never ready).
async fn read_err(err: &mut Option<tokio::process::ChildStderr>, buf: &mut [u8]) -> std::io::Result<usize> {
    match err {
        Some(e) => e.read(buf).await,
        None => std::future::pending().await,
    }
}

async fn read_fd(fd: &AsyncFd<OwnedFd>, buf: &mut [u8]) -> std::io::Result<usize> {
    loop {
        let mut guard = fd.readable().await?;
        // SAFETY: read(2) into a buffer of buf.len() bytes that lives across the call.
        let r = guard.try_io(|inner| match unsafe { libc::read(inner.get_ref().as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) } {
            n if n >= 0 => Ok(n as usize),
            _ => Err(std::io::Error::last_os_error()),
        });
        match r {
            // The terminal's other side is closed (the command and its children ended).
            Ok(Err(e)) if e.raw_os_error() == Some(libc::EIO) => return Ok(0),
            Ok(r) => return r,
            Err(_would_block) => continue,
        }
    }
}

/// Output of the command to the client: through the filter of srun's own lines where the
/// channel has one; nothing is sent for what the filter holds back.
async fn pass(ws: &mut WebSocket, filter: &mut Option<(u8, TaskEndFilter)>, channel: u8, data: &[u8]) -> Result<(), axum::Error> {
    match filter {
        Some((ch, f)) if *ch == channel => {
            let shown = f.feed(data);
            if shown.is_empty() {
                return Ok(());
            }
            send(ws, channel, &shown).await
        }
        _ => send(ws, channel, data).await,
    }
}

async fn write_all_fd(fd: &AsyncFd<OwnedFd>, mut data: &[u8]) -> std::io::Result<()> {
    while !data.is_empty() {
        let mut guard = fd.writable().await?;
        // SAFETY: write(2) of data.len() bytes from a live slice.
        let r = guard.try_io(|inner| match unsafe { libc::write(inner.get_ref().as_raw_fd(), data.as_ptr().cast(), data.len()) } {
            n if n >= 0 => Ok(n as usize),
            _ => Err(std::io::Error::last_os_error()),
        });
        match r {
            Ok(Ok(n)) => data = &data[n..],
            Ok(Err(e)) => return Err(e),
            Err(_would_block) => continue,
        }
    }
    Ok(())
}

fn nonblocking(fd: OwnedFd) -> std::io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: fcntl(2) on a descriptor this function owns.
    unsafe {
        let flags = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
        if flags < 0 || libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK) < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    // SAFETY: the descriptor is owned by the AsyncFd from here on and never replaced.
    unsafe { AsyncFd::register(fd) }.map_err(|e| e.into_parts().1)
}

/// A terminal pair of this size, both ends closed on exec from their first moment: the
/// server starts other processes (sessions of other projects, replicas' supervisors) at any
/// time, and none may inherit a session's terminal (openpty(3) gives descriptors without
/// that flag). The session's process gets the other end as its standard streams.
fn open_pty(size: Size) -> nix::Result<(OwnedFd, OwnedFd)> {
    use nix::fcntl::OFlag;
    let master = nix::pty::posix_openpt(OFlag::O_RDWR | OFlag::O_NOCTTY | OFlag::O_CLOEXEC)?;
    nix::pty::grantpt(&master)?;
    nix::pty::unlockpt(&master)?;
    let name = nix::pty::ptsname_r(&master)?;
    let slave = nix::fcntl::open(name.as_str(), OFlag::O_RDWR | OFlag::O_NOCTTY | OFlag::O_CLOEXEC, nix::sys::stat::Mode::empty())?;
    let master = OwnedFd::from(master);
    set_size(&master, size)?;
    Ok((master, slave))
}

/// The terminal's size (TIOCSWINSZ on its master).
fn set_size(master: &OwnedFd, size: Size) -> nix::Result<()> {
    let c = |n: u32| u16::try_from(n).unwrap_or(u16::MAX);
    let ws = nix::pty::Winsize { ws_row: c(size.rows), ws_col: c(size.cols), ws_xpixel: 0, ws_ypixel: 0 };
    // SAFETY: TIOCSWINSZ with a pointer to a winsize that lives across the call.
    if unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSWINSZ, &ws) } != 0 {
        return Err(nix::errno::Errno::last());
    }
    Ok(())
}

/// Kills the session's processes: its process group (a terminal session leads its own
/// session, whose group has its id), then the process itself.
fn kill(child: &mut tokio::process::Child) {
    if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
        let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
    }
    let _ = child.start_kill();
}

/// The replica's run has an outcome: it ended.
fn replica_ended(run_dir: &Path) -> bool {
    run_dir.join(trainyard_backend::shim::STATUS_FILE).exists()
}

fn now_text() -> String {
    trainyard_api::Timestamp::from_micros(trainyard_backend::now_micros()).to_string()
}
