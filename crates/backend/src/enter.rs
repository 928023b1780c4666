//! `trainyard shim enter <run_dir> ...`: a command inside a running replica's own sandbox
//! (`custom-jobs exec`), as `nsenter` and `podman exec` give one: the replica's cgroups
//! (the command counts against its memory and task limits, and ends with it), its network,
//! IPC, cgroup and mount namespaces (its `/proc`, `/tmp`, `/gcs`, `/etc/hosts`), its
//! working directory and environment, then its user, task limits, nice value and system
//! call filter, in the order the shim gives them to the program (`shim.rs`). A replica in a
//! container is entered by its engine (`podman exec`).
//!
//! With `--connect PORT` (`custom-jobs port-forward`), it enters the replica's network
//! namespace only (a container's, found by its engine), takes the replica's user, connects
//! to the port on the replica's loopback and pumps its standard input and output to and
//! from that connection until both ends are done.
//!
//! The process is single-threaded from its start to its `execve` (`setns` of a mount
//! namespace needs that), and becomes the command. What keeps it from entering (the run
//! has ended, a namespace cannot be joined) is written to the report descriptor
//! (`--report-fd`, closed on exec: nothing read there means the command runs), and the
//! process exits with [`EXIT_NOT_ENTERED`]. Where no descriptor reaches (on the Slurm
//! backend the server starts `enter` on the replica's node through `srun --overlap` in the
//! replica's allocation), `--report-file` names a file in the run directory instead, which
//! gets the reason, or [`ENTERED`] once the command is about to run.

use std::ffi::{CString, OsString};
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

use crate::cgroup::{CgroupVersion, ReplicaCgroup};
use crate::shim::{self, ShimSpec};

/// `trainyard shim enter ...` (or `trainyard-shim enter ...`): the binaries send these
/// arguments here before the supervisor's own start (whose signal handling the command
/// would inherit).
pub const ENTER_ARG: &str = "enter";

/// The `oom_kill` counter of the replica's memory cgroup (host programs with a cgroup),
/// for a session to tell whether its command's SIGKILL was an OOM kill.
pub fn replica_oom_kills(run_dir: &Path) -> Option<u64> {
    let spec = shim::read_spec(run_dir).ok()??;
    if spec.container.is_some() {
        return None;
    }
    let version = CgroupVersion::from_number(spec.cgroup_version?).ok()?;
    ReplicaCgroup::open(version, spec.cgroup_base?.join(&spec.cgroup_name)).oom_kills()
}

/// What `--report-file` holds once the replica was entered (the command, or the
/// connection, is about to start).
pub const ENTERED: &str = "entered\n";

/// Where `enter` says why it could not enter, and (for a file) that it did.
struct Report {
    file: Option<File>,
    /// A file, not a pipe: entering is said in it, not by its closing on exec.
    says_entered: bool,
}

impl Report {
    fn open(req: &Request) -> Report {
        if let Some(path) = &req.report_file {
            // Opened before the replica's identity is taken (the server made the file).
            let file = std::fs::OpenOptions::new().write(true).open(path).ok();
            if let Some(f) = &file {
                // SAFETY: fcntl on a descriptor this process owns: closed on exec.
                unsafe { libc::fcntl(f.as_fd().as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) };
            }
            return Report { file, says_entered: true };
        }
        let file = req.report_fd.map(|fd| {
            // SAFETY: the descriptor was given to this process for this use alone; it is
            // closed on exec (set here), so the command never holds it.
            unsafe {
                libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
                File::from_raw_fd(fd)
            }
        });
        Report { file, says_entered: false }
    }

    /// The replica is entered: the command (or the connection) comes next.
    fn entered(&mut self) {
        if let (true, Some(f)) = (self.says_entered, self.file.as_mut()) {
            let _ = f.write_all(ENTERED.as_bytes());
        }
    }

    fn refused(&mut self, why: &str) {
        match self.file.as_mut() {
            Some(f) => {
                let _ = f.write_all(why.as_bytes());
            }
            None => eprintln!("trainyard: {why}"),
        }
    }
}

/// Exit code: the replica could not be entered (the reason is on the report descriptor).
pub const EXIT_NOT_ENTERED: i32 = 125;

/// With no command: the replica's `bash` where it has one, else `sh`.
pub const DEFAULT_SHELL: [&str; 3] = ["/bin/sh", "-c", "if command -v bash >/dev/null 2>&1; then exec bash; else exec sh; fi"];

/// What `enter` was asked.
#[derive(Debug, PartialEq, Eq)]
pub struct Request {
    pub run_dir: PathBuf,
    /// The command's standard streams are a terminal: it leads a session of its own with
    /// that terminal as its controlling one.
    pub tty: bool,
    /// `TERM` for a terminal session.
    pub term: Option<String>,
    /// Where the reason goes when the replica cannot be entered.
    pub report_fd: Option<RawFd>,
    /// A file for the same, where no descriptor reaches (a Slurm step started by `srun` on
    /// the replica's node): it gets the reason, or [`ENTERED`] once the command is about
    /// to run.
    pub report_file: Option<PathBuf>,
    /// The command; empty: the shell.
    pub argv: Vec<String>,
    /// Connect to this port on the replica's loopback instead of running a command.
    pub connect: Option<u16>,
}

impl Request {
    /// `<run_dir> [--tty] [--term T] [--report-fd N] [-- CMD ARGS...]`.
    pub fn parse(args: &[String]) -> Result<Request, String> {
        let mut it = args.iter();
        let run_dir = it
            .next()
            .ok_or("usage: trainyard shim enter <run_dir> [--tty] [--term T] [--report-fd N | --report-file F] [--connect PORT | -- CMD ARGS...]")?;
        let mut req =
            Request { run_dir: PathBuf::from(run_dir), tty: false, term: None, report_fd: None, report_file: None, argv: Vec::new(), connect: None };
        while let Some(a) = it.next() {
            match a.as_str() {
                "--tty" => req.tty = true,
                "--term" => req.term = Some(it.next().ok_or("--term needs a value")?.clone()),
                "--report-fd" => {
                    let n = it.next().ok_or("--report-fd needs a number")?;
                    req.report_fd = Some(n.parse().map_err(|_| format!("--report-fd: {n:?} is not a descriptor number"))?);
                }
                "--report-file" => req.report_file = Some(PathBuf::from(it.next().ok_or("--report-file needs a path")?)),
                "--connect" => {
                    let n = it.next().ok_or("--connect needs a port")?;
                    req.connect = Some(n.parse().ok().filter(|p| *p > 0).ok_or_else(|| format!("--connect: {n:?} is not a port (1 to 65535)"))?);
                }
                "--" => {
                    req.argv = it.cloned().collect();
                    break;
                }
                other => return Err(format!("unknown argument {other:?}")),
            }
        }
        Ok(req)
    }
}

/// The entry point: never returns when the command runs.
pub fn main_from_args(args: &[String]) -> i32 {
    let req = match Request::parse(args) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("trainyard shim enter: {e}");
            return shim::EXIT_USAGE;
        }
    };
    let mut report = Report::open(&req);
    let why = match req.connect {
        Some(port) => match connect(&req, port) {
            Ok(stream) => {
                // Connected: nothing to report (the server reads the end of the pipe).
                report.entered();
                drop(report);
                return pump(stream);
            }
            Err(e) => e,
        },
        None => enter(&req, &mut report),
    };
    report.refused(&why);
    EXIT_NOT_ENTERED
}

/// The spec of the replica's run, while it runs.
fn running_spec(run_dir: &Path) -> Result<ShimSpec, String> {
    let spec = match shim::read_spec(run_dir) {
        Ok(Some(s)) => s,
        Ok(None) => return Err("the replica's run has no spec (it was never started here)".into()),
        Err(e) => return Err(format!("the replica's spec: {e}")),
    };
    if run_dir.join(shim::STATUS_FILE).exists() {
        return Err("the replica has ended".into());
    }
    Ok(spec)
}

/// How long a session waits for a running replica's container to be there: the engine
/// creates it after its client (the replica's program, as the shim sees it) has started.
/// Within the server's bound on entering (10 s).
const CONTAINER_WAIT: std::time::Duration = std::time::Duration::from_secs(8);

/// The pid of the replica's container's first process, once the container runs (waited
/// for up to `CONTAINER_WAIT`, while the replica has not ended).
fn running_container(c: &crate::container::ContainerSpec, run_dir: &Path) -> Result<u32, String> {
    let deadline = std::time::Instant::now() + CONTAINER_WAIT;
    loop {
        let seen = c.engine.output(["inspect", "--format", "{{.State.Pid}}", &c.name]);
        if let Some(pid) = seen.as_ref().ok().and_then(|o| o.trim().parse::<u32>().ok()).filter(|p| *p > 0) {
            return Ok(pid);
        }
        if run_dir.join(shim::STATUS_FILE).exists() {
            return Err("the replica has ended".into());
        }
        if std::time::Instant::now() >= deadline {
            let why = seen.err().unwrap_or_else(|| "it is not running".into());
            return Err(format!("the replica's container {} is not there after {}s: {why}", c.name, CONTAINER_WAIT.as_secs()));
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// Enters the replica and execs the command; returns only the reason it could not.
fn enter(req: &Request, report: &mut Report) -> String {
    let spec = match running_spec(&req.run_dir) {
        Ok(s) => s,
        Err(e) => return e,
    };
    let argv: Vec<String> = if req.argv.is_empty() { DEFAULT_SHELL.iter().map(|s| s.to_string()).collect() } else { req.argv.clone() };
    if let Some(c) = &spec.container {
        // The replica is running once its engine client is; the container itself may be
        // a moment behind.
        if let Err(e) = running_container(c, &req.run_dir) {
            return e;
        }
        // The engine enters its container (its namespaces, cgroup, user and environment).
        let mut args: Vec<OsString> = vec!["exec".into(), "--interactive".into()];
        if req.tty {
            args.push("--tty".into());
            if let Some(t) = &req.term {
                args.push(format!("--env=TERM={t}").into());
            }
        }
        args.push(c.name.clone().into());
        args.extend(argv.iter().map(OsString::from));
        report.entered();
        let e = c.engine.command(args).exec();
        return format!("cannot run {}: {e}", c.engine.program.display());
    }
    let pid = match program_pid(&req.run_dir) {
        Ok(p) => p,
        Err(e) => return e,
    };
    match enter_host_program(&spec, pid, req, &argv, report) {
        Ok(never) => match never {},
        Err(e) => e,
    }
}

/// The replica's network namespace and user, then a connection to `port` on its loopback.
fn connect(req: &Request, port: u16) -> Result<std::net::TcpStream, String> {
    let spec = running_spec(&req.run_dir)?;
    let pid = match &spec.container {
        Some(c) => running_container(c, &req.run_dir)?,
        None => program_pid(&req.run_dir)?,
    };
    let ns = File::open(format!("/proc/{pid}/ns/net")).map_err(|e| format!("the replica's network namespace: {e}"))?;
    nix::sched::setns(ns.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET).map_err(|e| format!("cannot join the replica's network namespace: {e}"))?;
    // The connection is the replica's user's, as a program of its own would make it.
    if let (Some(id), None) = (spec.run_as, &spec.container) {
        // SAFETY: plain system calls on this single-threaded process.
        let dropped = unsafe {
            libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0
                && libc::setgroups(0, std::ptr::null()) == 0
                && libc::setgid(id.gid) == 0
                && libc::setuid(id.uid) == 0
        };
        if !dropped {
            return Err(format!("cannot take the replica's user: {}", std::io::Error::last_os_error()));
        }
    }
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_secs(5))
        .map_err(|e| format!("nothing answers on port {port} of the replica's loopback ({e})"))
}

/// Standard input to the connection and the connection to standard output, until both
/// are done; 0 when they ended cleanly.
fn pump(stream: std::net::TcpStream) -> i32 {
    let Ok(mut inbound) = stream.try_clone() else { return 1 };
    let writer = std::thread::spawn(move || {
        let copied = copy(&mut std::io::stdin().lock(), &mut inbound);
        // The client's end of input: the connection's write half closes too.
        let _ = inbound.shutdown(std::net::Shutdown::Write);
        copied.is_ok()
    });
    let mut outbound = stream;
    let read_ok = copy(&mut outbound, &mut std::io::stdout().lock()).is_ok();
    let _ = std::io::stdout().flush();
    // The replica's side closed: nothing more will be read, whatever stdin still holds.
    if !read_ok {
        return 1;
    }
    let _ = outbound.shutdown(std::net::Shutdown::Both);
    // The writer may wait for input that never comes: the process ends without it.
    if writer.is_finished() {
        let _ = writer.join();
    }
    0
}

/// `io::copy` with a buffer as large as a pipe holds (its own is 8 KiB): a forwarded
/// download moves in fewer, larger writes.
fn copy(from: &mut impl std::io::Read, to: &mut impl Write) -> std::io::Result<()> {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        to.write_all(&buf[..n])?;
    }
}

/// The pid of the replica's program: `started.json`'s, still a child of the shim that
/// runs the replica (not a pid reused since).
fn program_pid(run_dir: &Path) -> Result<u32, String> {
    let started = match shim::read_started(run_dir) {
        Ok(Some(s)) => s,
        Ok(None) => return Err("the replica's program has not started yet".into()),
        Err(e) => return Err(format!("the replica's start: {e}")),
    };
    let shim_pid = std::fs::read_to_string(run_dir.join(shim::PID_FILE)).map_err(|e| format!("the replica's supervisor: {e}"))?;
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", started.pid)).map_err(|_| "the replica has ended".to_string())?;
    // `pid (comm) state ppid ...`: the name may hold anything but ends at the last ')'.
    let ppid = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().nth(1)).unwrap_or("");
    if ppid != shim_pid.trim() {
        return Err("the replica has ended".into());
    }
    Ok(started.pid)
}

enum Never {}

/// The replica's cgroups, namespaces, working directory and identity, then the command.
fn enter_host_program(spec: &ShimSpec, pid: u32, req: &Request, argv: &[String], report: &mut Report) -> Result<Never, String> {
    // Namespaces are opened before anything is joined: after the mount namespace, the
    // host's /proc and /sys/fs/cgroup may be out of sight.
    const KINDS: [(&str, nix::sched::CloneFlags); 4] = [
        ("net", nix::sched::CloneFlags::CLONE_NEWNET),
        ("ipc", nix::sched::CloneFlags::CLONE_NEWIPC),
        ("cgroup", nix::sched::CloneFlags::CLONE_NEWCGROUP),
        ("mnt", nix::sched::CloneFlags::CLONE_NEWNS),
    ];
    let mut namespaces = Vec::new();
    for (kind, flag) in KINDS {
        let theirs = format!("/proc/{pid}/ns/{kind}");
        let file = File::open(&theirs).map_err(|e| format!("the replica's {kind} namespace: {e}"))?;
        let same = match (file.metadata(), std::fs::metadata(format!("/proc/self/ns/{kind}"))) {
            (Ok(a), Ok(b)) => a.ino() == b.ino() && a.dev() == b.dev(),
            _ => false,
        };
        if !same {
            namespaces.push((kind, flag, file));
        }
    }
    // The replica's cgroups: its memory (and v2 every controller), v1 pids and CPU. This
    // process has one thread: on v1 it moves through `tasks`, which spares the global
    // lock (and its RCU grace period) that moving through `cgroup.procs` takes.
    if let (Some(base), Some(version)) = (&spec.cgroup_base, spec.cgroup_version.and_then(|v| CgroupVersion::from_number(v).ok())) {
        let cg = ReplicaCgroup::open(version, base.join(&spec.cgroup_name));
        join(&cg.thread_attach_file().unwrap_or_else(|| cg.procs_file()))?;
    }
    if let (Some(base), Some(_)) = (&spec.pids_cgroup_base, spec.pids_max) {
        join(&base.join(&spec.cgroup_name).join("tasks"))?;
    }
    if let Some(group) = &spec.cpu_cgroup {
        join(&group.join(&spec.cgroup_name).join("tasks"))?;
    }
    for (kind, flag, file) in &namespaces {
        nix::sched::setns(file.as_fd(), *flag).map_err(|e| format!("cannot join the replica's {kind} namespace: {e}"))?;
    }
    let cwd = spec.cwd.clone().unwrap_or_else(|| PathBuf::from("/"));
    std::env::set_current_dir(&cwd).map_err(|e| format!("the replica's working directory {}: {e}", cwd.display()))?;
    let mut env: std::collections::BTreeMap<&str, &str> = spec.env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    if let Some(t) = req.term.as_deref().filter(|_| req.tty) {
        env.insert("TERM", t);
    }
    let c = |s: &str| CString::new(s).map_err(|_| format!("a NUL byte in {s:?}"));
    let args: Vec<CString> = argv.iter().map(|a| c(a)).collect::<Result<_, _>>()?;
    let envp: Vec<CString> = env.iter().map(|(k, v)| c(&format!("{k}={v}"))).collect::<Result<_, _>>()?;
    let candidates = shim::exec_candidates(&argv[0], &env).map_err(|e| format!("{:?}: {e}", argv[0]))?;
    if req.tty {
        // A session of its own, with the terminal on its standard input as its controlling
        // terminal (a shell's job control and Ctrl-C need one).
        // SAFETY: plain system calls on this process.
        unsafe {
            libc::setsid();
            if libc::ioctl(0, libc::TIOCSCTTY, 0) != 0 {
                return Err(format!("the session's terminal: {}", std::io::Error::last_os_error()));
            }
        }
    }
    shim::limit_entered(spec).map_err(|e| format!("cannot take the replica's identity and limits: {e}"))?;
    report.entered();
    let mut last = std::io::Error::from_raw_os_error(libc::ENOENT);
    for path in &candidates {
        // SAFETY: execve with NUL-terminated arrays of pointers into CStrings that live
        // until the call (it returns only on failure).
        let mut a: Vec<*const libc::c_char> = args.iter().map(|s| s.as_ptr()).collect();
        a.push(std::ptr::null());
        let mut e: Vec<*const libc::c_char> = envp.iter().map(|s| s.as_ptr()).collect();
        e.push(std::ptr::null());
        unsafe { libc::execve(path.as_ptr(), a.as_ptr(), e.as_ptr()) };
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::ENOENT) {
            last = err;
        }
    }
    // Past the filter and the identity: the command's own failure, as a shell says it.
    let code = if last.raw_os_error() == Some(libc::ENOENT) { 127 } else { 126 };
    eprintln!("trainyard: {}: {}", argv[0], if code == 127 { "command not found".to_string() } else { last.to_string() });
    std::process::exit(code);
}

/// Moves this process into a cgroup (through `cgroup.procs`, or v1's `tasks`).
fn join(procs: &Path) -> Result<(), String> {
    std::fs::write(procs, b"0").map_err(|e| format!("cannot join the replica's cgroup {}: {e}", procs.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_are_parsed_and_wrong_ones_named() {
        let a = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let r = Request::parse(&a(&["/r", "--tty", "--term", "xterm", "--report-fd", "3", "--", "ls", "--tty"])).unwrap();
        assert_eq!(r.run_dir, PathBuf::from("/r"));
        assert!(r.tty);
        assert_eq!(r.term.as_deref(), Some("xterm"));
        assert_eq!(r.report_fd, Some(3));
        assert_eq!(r.argv, ["ls", "--tty"]);
        assert!(Request::parse(&a(&["/r"])).unwrap().argv.is_empty());
        assert!(Request::parse(&a(&[])).is_err());
        assert!(Request::parse(&a(&["/r", "--report-fd", "x"])).unwrap_err().contains("--report-fd"));
        assert!(Request::parse(&a(&["/r", "--nope"])).unwrap_err().contains("--nope"));
        assert_eq!(Request::parse(&a(&["/r", "--connect", "8888"])).unwrap().connect, Some(8888));
        assert_eq!(Request::parse(&a(&["/r", "--report-file", "/r/x"])).unwrap().report_file, Some(PathBuf::from("/r/x")));
        assert!(Request::parse(&a(&["/r", "--report-file"])).unwrap_err().contains("--report-file"));
        for bad in ["0", "65536", "x"] {
            assert!(Request::parse(&a(&["/r", "--connect", bad])).unwrap_err().contains("--connect"), "{bad}");
        }
    }
}
