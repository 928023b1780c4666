//! The fork server: one small process, started by the server once, that forks a
//! supervisor (a shim, [`crate::shim`]) for each replica instead of the server exec'ing a
//! new shim program each time.
//!
//! Why: a replica's start was a `posix_spawn` of the shim's executable, and on a virtual
//! machine the start of a dynamically linked program is dear: the loader's relocations,
//! glibc's and libgcc's CPU feature probes (each `cpuid` a trap to the hypervisor), the
//! runtime's set-up and the teardown of all of it (measured here: 0.83-0.93 ms of CPU per
//! start and exit of the shim against 0.11 ms for the fork and exit of a small Rust
//! process). A fork of this single-threaded process, which did all of that once, costs a
//! fork.
//!
//! What a replica's supervisor is does not change: it leads a session of its own, its
//! stdin is /dev/null, its stdout the pipe of its `started` line, its stderr the run
//! directory's `shim.stderr`, it starts with the signals it waits for blocked, and its
//! command line is a spawned shim's (`trainyard-shim <run_dir>`, written over this
//! process's argument area, which the server pads for it). It survives the server and this
//! process alike: liveness stays the run directory's lock.
//!
//! The protocol, over a `SOCK_SEQPACKET` socket pair (the fork server's end is its stdin):
//! - server to fork server: a run directory's path, with two descriptors (`SCM_RIGHTS`):
//!   the supervisor's stdout and stderr;
//! - fork server to server: `P` and the pid of the supervisor forked for that request, or
//!   `E` and the errno of a fork that failed (one reply per request, in order); `X`, a
//!   pid and its wait status when a supervisor ended (this process is its parent and
//!   reaps it).
//!
//! When the server's end closes (the server exited), the fork server exits; its
//! supervisors go on. When the fork server is gone (killed), the server starts another for
//! later replicas, waits for the supervisors of the old one by their locks, and starts a
//! shim by `posix_spawn` if no fork server can be had.

use std::collections::HashMap;
use std::ffi::OsString;
use std::fs::File;
use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::ExitStatus;
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::socket::{
    recv, recvmsg, send, sendmsg, socketpair, AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags, SockFlag, SockType,
};
use nix::spawn::{PosixSpawnAttr, PosixSpawnFileActions, PosixSpawnFlags};
use nix::sys::wait::WaitPidFlag;
use nix::unistd::Pid;

use crate::lock;

/// The argument that makes `trainyard-shim` (or `trainyard shim`) a fork server.
pub const FORK_SERVER_ARG: &str = "--fork-server";

/// Bytes of argument area the server gives a fork server, so that each supervisor it
/// forks can show the shim command and its run directory as its command line.
const ARG_AREA: usize = 4096;

/// How long a launch waits for the fork server's reply before it kills it and starts the
/// shim itself: a fork takes well under a millisecond; only a stopped or wedged fork
/// server takes this long.
const REPLY_BOUND: Duration = Duration::from_secs(10);

/// Longest run directory path a request carries.
const MAX_REQUEST: usize = 4096;

/// A reply or report from the fork server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Message {
    Forked(i32),
    ForkFailed(i32),
    Exited(i32, i32),
}

impl Message {
    fn encode(self) -> [u8; 9] {
        let (tag, a, b) = match self {
            Message::Forked(pid) => (b'P', pid, 0),
            Message::ForkFailed(errno) => (b'E', errno, 0),
            Message::Exited(pid, status) => (b'X', pid, status),
        };
        let mut m = [0u8; 9];
        m[0] = tag;
        m[1..5].copy_from_slice(&a.to_ne_bytes());
        m[5..9].copy_from_slice(&b.to_ne_bytes());
        m
    }

    fn decode(m: &[u8]) -> Option<Message> {
        let m: &[u8; 9] = m.try_into().ok()?;
        let a = i32::from_ne_bytes([m[1], m[2], m[3], m[4]]);
        let b = i32::from_ne_bytes([m[5], m[6], m[7], m[8]]);
        match m[0] {
            b'P' => Some(Message::Forked(a)),
            b'E' => Some(Message::ForkFailed(a)),
            b'X' => Some(Message::Exited(a, b)),
            _ => None,
        }
    }
}

// ---------------------------------------------------------------------------------------
// The fork server's side.

/// Runs the fork server on the socket at fd 0 until the server's end closes. Called by
/// [`crate::shim::main_from_args`] with the supervisor's signals already blocked (every
/// supervisor forked here inherits the mask) and SIGPIPE ignored; `run` is a supervisor's
/// body, given its run directory, returning its exit code; `failed` is the exit code of
/// a supervisor or fork server that could not be set up. Returns this process's exit
/// code.
pub fn serve(run: fn(&Path) -> i32, failed: i32) -> i32 {
    // SAFETY: fd 0 is the socket the server gave us as stdin; nothing else owns it.
    let sock = unsafe { OwnedFd::from_raw_fd(0) };
    // The shim command this process was started as (`trainyard-shim`, or `trainyard
    // shim`): each supervisor shows it with its run directory, as a spawned shim does.
    let command: Vec<Vec<u8>> =
        std::env::args_os().take_while(|a| a != FORK_SERVER_ARG).map(|a| a.into_vec()).collect();
    let area = arg_area();
    let mut own: Vec<&[u8]> = command.iter().map(Vec::as_slice).collect();
    own.push(FORK_SERVER_ARG.as_bytes());
    set_cmdline(area, &own);
    let shim = Shim { command: &command, area, run, failed };
    let mut chld = SigSet::empty();
    chld.add(Signal::SIGCHLD);
    let sfd = match SignalFd::with_flags(&chld, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("trainyard fork server: signalfd: {e}");
            return failed;
        }
    };
    loop {
        let (sock_ready, chld_ready) = {
            let mut fds = [PollFd::new(sock.as_fd(), PollFlags::POLLIN), PollFd::new(sfd.as_fd(), PollFlags::POLLIN)];
            match poll(&mut fds, PollTimeout::NONE) {
                Ok(_) => {}
                Err(Errno::EINTR) => continue,
                Err(e) => {
                    eprintln!("trainyard fork server: poll: {e}");
                    return failed;
                }
            }
            let ready = |f: &PollFd| f.revents().is_some_and(|r| !r.is_empty());
            (ready(&fds[0]), ready(&fds[1]))
        };
        if chld_ready {
            while let Ok(Some(_)) = sfd.read_signal() {}
            if reap(&sock).is_err() {
                return 0;
            }
        }
        if sock_ready {
            match take_request(&sock, &sfd, &shim) {
                Ok(true) => {}
                // The server's end is closed: the server is gone.
                Ok(false) => return 0,
                Err(e) => {
                    eprintln!("trainyard fork server: {e}");
                    return failed;
                }
            }
        }
    }
}

/// Reaps every ended supervisor and reports it. An error: the server's end is gone.
fn reap(sock: &OwnedFd) -> io::Result<()> {
    loop {
        let mut status = 0;
        // SAFETY: waitpid writes only into our status variable.
        let pid = unsafe { libc::waitpid(-1, &mut status, WaitPidFlag::WNOHANG.bits()) };
        if pid <= 0 {
            return Ok(());
        }
        tell(sock, Message::Exited(pid, status))?;
    }
}

fn tell(sock: &OwnedFd, m: Message) -> io::Result<()> {
    loop {
        match send(sock.as_raw_fd(), &m.encode(), MsgFlags::MSG_NOSIGNAL) {
            Ok(_) => return Ok(()),
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// What a forked supervisor is made of.
struct Shim<'a> {
    /// The shim command this process was started as.
    command: &'a [Vec<u8>],
    /// This process's argument area, the same in its children.
    area: Option<(usize, usize)>,
    /// The supervisor's body.
    run: fn(&Path) -> i32,
    /// The exit code of a supervisor that could not be set up.
    failed: i32,
}

/// Takes one request and forks its supervisor. `Ok(false)`: end of file.
fn take_request(sock: &OwnedFd, sfd: &SignalFd, shim: &Shim<'_>) -> io::Result<bool> {
    let mut buf = vec![0u8; MAX_REQUEST];
    let mut space = nix::cmsg_space!([RawFd; 2]);
    let (len, fds) = loop {
        let mut iov = [IoSliceMut::new(&mut buf)];
        match recvmsg::<()>(sock.as_raw_fd(), &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC) {
            Ok(msg) => {
                let mut fds = Vec::new();
                for c in msg.cmsgs().map_err(io::Error::from)? {
                    if let ControlMessageOwned::ScmRights(r) = c {
                        // SAFETY: descriptors the kernel just installed for us.
                        fds.extend(r.into_iter().map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }));
                    }
                }
                break (msg.bytes, fds);
            }
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    };
    if len == 0 && fds.is_empty() {
        return Ok(false);
    }
    let run_dir = std::path::PathBuf::from(OsString::from_vec(buf[..len].to_vec()));
    let [stdout, stderr]: [OwnedFd; 2] = match fds.try_into() {
        Ok(f) => f,
        Err(_) => {
            tell(sock, Message::ForkFailed(libc::EINVAL))?;
            return Ok(true);
        }
    };
    // SAFETY: this process is single-threaded; the child only runs ordinary code of its
    // own from here (a fork of a single-threaded process is a whole process).
    match unsafe { libc::fork() } {
        -1 => tell(sock, Message::ForkFailed(io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)))?,
        0 => {
            let code = become_supervisor(sfd, [stdout, stderr], shim, &run_dir).unwrap_or(shim.failed);
            std::process::exit(code)
        }
        pid => tell(sock, Message::Forked(pid))?,
    }
    Ok(true)
}

/// In the forked child: the descriptors and command line of a supervisor, then the
/// supervisor itself (which makes its own session first). Returns its exit code; None if
/// it could not be set up.
fn become_supervisor(sfd: &SignalFd, [stdout, stderr]: [OwnedFd; 2], shim: &Shim<'_>, run_dir: &Path) -> Option<i32> {
    // SAFETY: dup2 and close on descriptors this process owns; the fork server's socket
    // (fd 0, replaced by /dev/null here) and signalfd are its parent's business (closing
    // our copies leaves theirs open). No destructor of theirs runs in this process: it
    // ends in `process::exit`.
    unsafe {
        libc::close(sfd.as_raw_fd());
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY);
        if null < 0 || libc::dup2(null, 0) < 0 || libc::dup2(stdout.as_raw_fd(), 1) < 0 || libc::dup2(stderr.as_raw_fd(), 2) < 0 {
            return None;
        }
        if null > 2 {
            libc::close(null);
        }
    }
    drop((stdout, stderr));
    let mut args: Vec<&[u8]> = shim.command.iter().map(Vec::as_slice).collect();
    args.push(run_dir.as_os_str().as_bytes());
    set_cmdline(shim.area, &args);
    Some((shim.run)(run_dir))
}

/// Writes `args` over this process's argument `area` ([`arg_area`]: what
/// `/proc/PID/cmdline` and `ps` show), NUL-separated, cut to the area's size, the rest
/// NUL. The area is the initial stack's, this process's own memory; nothing reads the old
/// arguments after this.
fn set_cmdline(area: Option<(usize, usize)>, args: &[&[u8]]) {
    let Some((start, end)) = area else { return };
    let Some(len) = end.checked_sub(start).filter(|l| *l > 1) else { return };
    let mut bytes = Vec::with_capacity(len);
    for a in args {
        bytes.extend_from_slice(a);
        bytes.push(0);
    }
    bytes.resize(len, 0);
    bytes[len - 1] = 0;
    // SAFETY: [start, end) is this process's argument area as the kernel reports it:
    // mapped, writable and not otherwise used by this process at this point.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), start as *mut u8, len) };
}

/// This process's argument area, `arg_start` to `arg_end` (`/proc/self/stat` fields 48
/// and 49). A forked child's is the same.
fn arg_area() -> Option<(usize, usize)> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let field = |n: usize| crate::procfs::stat_field(&stat, n)?.parse::<usize>().ok();
    Some((field(48)?, field(49)?))
}

// ---------------------------------------------------------------------------------------
// The server's side.

/// The signals a shim blocks for its whole life (it takes them with `sigtimedwait`).
fn shim_blocked_signals() -> SigSet {
    let mut set = SigSet::empty();
    for sig in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP, Signal::SIGCHLD] {
        set.add(sig);
    }
    set
}

/// Starts `argv` with `posix_spawnp`, its standard streams `stdio`, in a session of its
/// own (it survives the server and a Ctrl-C in the server's terminal, and has no
/// controlling terminal), born with the signals a shim waits for blocked (a stop that
/// arrives while it starts stays pending for it) and every other disposition at its
/// default. The environment is this process's. An error means nothing was started.
pub(crate) fn spawn_detached(argv: &[OsString], stdio: [std::os::fd::RawFd; 3]) -> io::Result<Pid> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let cstring = |s: &std::ffi::OsStr| {
        CString::new(s.as_bytes()).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, format!("{s:?} contains a NUL byte")))
    };
    let Some(program) = argv.first() else {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "the shim command is empty"));
    };
    let program = cstring(program)?;
    let argv = argv.iter().map(|a| cstring(a)).collect::<io::Result<Vec<_>>>()?;
    let envp: Vec<CString> = std::env::vars_os()
        .filter_map(|(k, v)| {
            let mut kv = k.into_vec();
            kv.push(b'=');
            kv.extend_from_slice(v.as_bytes());
            CString::new(kv).ok()
        })
        .collect();
    let mut actions = PosixSpawnFileActions::init()?;
    for (target, fd) in stdio.into_iter().enumerate() {
        actions.add_dup2(fd, target as std::os::fd::RawFd)?;
    }
    let mut attr = PosixSpawnAttr::init()?;
    attr.set_flags(
        PosixSpawnFlags::POSIX_SPAWN_SETSIGMASK
            | PosixSpawnFlags::POSIX_SPAWN_SETSIGDEF
            | PosixSpawnFlags::from_bits_retain(libc::c_int::from(libc::POSIX_SPAWN_SETSID)),
    )?;
    attr.set_sigmask(&shim_blocked_signals())?;
    attr.set_sigdefault(&SigSet::all())?;
    Ok(nix::spawn::posix_spawnp(&program, &actions, &attr, &argv, &envp)?)
}

/// How a supervisor that a fork server forked is waited for.
pub(crate) struct Forked {
    pub pid: Pid,
    /// Its wait status, from the fork server's report; closed without one when that fork
    /// server is gone (then `pidfd` tells when the supervisor ends).
    pub exit: mpsc::Receiver<ExitStatus>,
    /// A pidfd of the supervisor (Linux 5.3), when one could be opened.
    pub pidfd: Option<OwnedFd>,
}

/// A pidfd of `pid` (`pidfd_open(2)`); None where the kernel has none or the process is
/// gone.
fn pidfd_open(pid: i32) -> Option<OwnedFd> {
    // SAFETY: pidfd_open(2) takes a pid and flags; the descriptor it returns is ours.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    // SAFETY: a descriptor just returned, owned by nobody else.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Blocks until the process of `pidfd` has ended.
pub(crate) fn wait_pidfd(pidfd: &OwnedFd) {
    loop {
        let mut fds = [PollFd::new(pidfd.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::NONE) {
            Err(Errno::EINTR) => continue,
            _ => return,
        }
    }
}

/// Supervisors' ends, reported by one fork server.
#[derive(Default)]
struct Exits {
    waiting: HashMap<i32, mpsc::SyncSender<ExitStatus>>,
    /// Ended before their launch registered.
    early: HashMap<i32, ExitStatus>,
    /// The fork server is gone: no more reports.
    closed: bool,
}

/// One running fork server.
struct Conn {
    sock: OwnedFd,
    pid: Pid,
    replies: mpsc::Receiver<Message>,
    exits: Arc<Mutex<Exits>>,
}

/// After a fork server could not be started, how long shims are spawned before another
/// is tried.
const RETRY_AFTER: Duration = Duration::from_secs(60);

/// The server's handle on its fork server, started on first use and again when it died.
pub(crate) struct ForkServer {
    /// The shim command (`trainyard-shim`, or `trainyard shim`).
    command: Vec<OsString>,
    state: Mutex<State>,
}

enum State {
    /// None started yet, or the last one is gone.
    Idle,
    Running(Conn),
    /// The last one could not be started or did not answer, at this time.
    Failed(Instant),
}

impl ForkServer {
    pub fn new(command: Vec<OsString>) -> ForkServer {
        ForkServer { command, state: Mutex::new(State::Idle) }
    }

    /// Forks a supervisor for `run_dir` with `stdout` and `stderr`. `None` when no fork
    /// server can be had or it did not answer (the caller starts the shim itself); an
    /// error is the fork's own (the host is out of processes or memory).
    pub fn fork(&self, run_dir: &Path, stdout: &OwnedFd, stderr: &File) -> Option<io::Result<Forked>> {
        let mut state = lock(&self.state);
        match &*state {
            State::Running(c) if lock(&c.exits).closed => *state = State::Idle,
            State::Failed(t) if t.elapsed() >= RETRY_AFTER => *state = State::Idle,
            _ => {}
        }
        if let State::Idle = &*state {
            *state = match start(&self.command) {
                Ok(c) => State::Running(c),
                Err(e) => {
                    tracing::warn!("cannot start the fork server ({e}); starting each shim by itself");
                    State::Failed(Instant::now())
                }
            };
        }
        let State::Running(conn) = &*state else { return None };
        let fds = [stdout.as_raw_fd(), stderr.as_raw_fd()];
        let sent = loop {
            match sendmsg::<()>(
                conn.sock.as_raw_fd(),
                &[IoSlice::new(run_dir.as_os_str().as_bytes())],
                &[ControlMessage::ScmRights(&fds)],
                MsgFlags::MSG_NOSIGNAL,
                None,
            ) {
                Err(Errno::EINTR) => continue,
                other => break other,
            }
        };
        if let Err(e) = sent {
            tracing::warn!("the fork server does not take requests ({e}); starting another");
            *state = State::Idle;
            return None;
        }
        match conn.replies.recv_timeout(REPLY_BOUND) {
            Ok(Message::Forked(pid)) => {
                // The pid is the supervisor's until the fork server reaps it (after this
                // reply); if that already happened, its report comes on `exit`.
                let pidfd = pidfd_open(pid);
                let (tx, rx) = mpsc::sync_channel(1);
                let mut exits = lock(&conn.exits);
                if let Some(status) = exits.early.remove(&pid) {
                    let _ = tx.send(status);
                } else if !exits.closed {
                    exits.waiting.insert(pid, tx);
                }
                Some(Ok(Forked { pid: Pid::from_raw(pid), exit: rx, pidfd }))
            }
            Ok(Message::ForkFailed(errno)) => Some(Err(io::Error::from_raw_os_error(errno))),
            Ok(Message::Exited(..)) | Err(_) => {
                tracing::warn!("the fork server did not answer; starting shims by themselves for a while");
                let _ = nix::sys::signal::kill(conn.pid, Signal::SIGKILL);
                *state = State::Failed(Instant::now());
                None
            }
        }
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        // Ends both the fork server (end of file on its stdin; its supervisors go on) and
        // our reader (which holds a copy of this end).
        let _ = nix::sys::socket::shutdown(self.sock.as_raw_fd(), nix::sys::socket::Shutdown::Both);
    }
}

/// Starts a fork server: `command` + `--fork-server` + padding, its stdin one end of a
/// new socket pair, a reader thread on the other.
fn start(command: &[OsString]) -> io::Result<Conn> {
    let (ours, theirs) = socketpair(AddressFamily::Unix, SockType::SeqPacket, None, SockFlag::SOCK_CLOEXEC)?;
    let mut argv: Vec<OsString> = command.to_vec();
    argv.push(FORK_SERVER_ARG.into());
    argv.push(" ".repeat(ARG_AREA).into());
    let null = File::open("/dev/null")?;
    let pid = spawn_detached(&argv, [theirs.as_raw_fd(), null.as_raw_fd(), 2])?;
    drop(theirs);
    let reader_sock = ours.try_clone()?;
    let (tx, replies) = mpsc::channel();
    let exits = Arc::new(Mutex::new(Exits::default()));
    let exits2 = Arc::clone(&exits);
    std::thread::Builder::new().name("fork-server".into()).spawn(move || read_reports(reader_sock, pid, tx, exits2))?;
    Ok(Conn { sock: ours, pid, replies, exits })
}

/// The reader of one fork server's messages: replies to the launch waiting for one,
/// exits to their supervisors' watchers. Ends when the fork server is gone; it reaps it.
fn read_reports(sock: OwnedFd, pid: Pid, replies: mpsc::Sender<Message>, exits: Arc<Mutex<Exits>>) {
    let mut buf = [0u8; 16];
    loop {
        let n = match recv(sock.as_raw_fd(), &mut buf, MsgFlags::empty()) {
            Ok(n) => n,
            Err(Errno::EINTR) => continue,
            Err(_) => break,
        };
        match Message::decode(&buf[..n]) {
            Some(Message::Exited(child, status)) => {
                let status = ExitStatus::from_raw(status);
                let mut e = lock(&exits);
                match e.waiting.remove(&child) {
                    Some(tx) => {
                        let _ = tx.send(status);
                    }
                    None => {
                        e.early.insert(child, status);
                    }
                }
            }
            Some(m) => {
                let _ = replies.send(m);
            }
            // End of file (0 bytes) or nonsense: the fork server is gone or broken.
            None => break,
        }
    }
    {
        let mut e = lock(&exits);
        e.closed = true;
        e.waiting.clear();
    }
    let _ = nix::sys::signal::kill(pid, Signal::SIGKILL);
    let _ = nix::sys::wait::waitpid(pid, None);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip() {
        for m in [Message::Forked(4242), Message::ForkFailed(libc::EAGAIN), Message::Exited(7, 0x0900)] {
            assert_eq!(Message::decode(&m.encode()), Some(m));
        }
        assert_eq!(Message::decode(b"P1234"), None);
        assert_eq!(Message::decode(&[b'Z'; 9]), None);
    }
}
