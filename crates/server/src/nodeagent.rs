//! Virtual nodes on this host have an agent: a small process (`trainyard node-agent`) that
//! holds an exclusive lock on `<data_dir>/nodes/<node>.lock` for as long as the node is up,
//! like a node's kubelet or slurmd. The server watches the lock from a thread; when the
//! agent dies (killed, crashed), the lock is released and the node is lost (L9): its
//! replicas are restarted on other nodes. Agents outlive a server restart, like shims: with
//! no server for a long time they keep running, and the next server adopts them.
//!
//! An agent does not outlive its purpose. Every second it checks, and exits (status 0)
//! when one of these holds:
//!
//! - its lock file is gone, or the path now names another file than the one it locked:
//!   the data directory was deleted or replaced;
//! - its node is not in the fleet file `<data_dir>/nodes/fleet.json`
//!   (`{"nodes": ["n1", "n2"]}`), which the server writes at start, before it starts or
//!   adopts any agent, with the names of the virtual nodes of its config (an empty list
//!   when the config declares none). A node removed from the config thus loses its agent
//!   at the next start. Without a fleet file, or with one that does not parse, the agent
//!   keeps running.
//!
//! With `stop_node_agents = true` in the config, the server stops its agents when it shuts
//! down cleanly (SIGTERM, Ctrl-C): it writes an empty fleet and waits for the agents to
//! let go of their locks ([`stop_agents`]). The next start writes the fleet again and
//! starts them anew.

use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

/// The fleet file's name in `<data_dir>/nodes/`.
pub const FLEET_FILE: &str = "fleet.json";

/// How often an agent checks that it still has a purpose.
const CHECK_INTERVAL: Duration = Duration::from_secs(1);

pub fn lock_path(data_dir: &Path, node: &str) -> PathBuf {
    data_dir.join("nodes").join(format!("{node}.lock"))
}

fn open(path: &Path) -> std::io::Result<File> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    OpenOptions::new().create(true).truncate(false).read(true).write(true).open(path)
}

/// Whether some process holds the lock exclusively (a live agent).
fn held(path: &Path) -> std::io::Result<bool> {
    match Flock::lock(open(path)?, FlockArg::LockSharedNonblock) {
        // Dropping the shared lock releases it.
        Ok(_shared) => Ok(false),
        Err((_, Errno::EWOULDBLOCK)) => Ok(true),
        Err((_, e)) => Err(e.into()),
    }
}

/// The fleet file of a data directory.
pub fn fleet_path(data_dir: &Path) -> PathBuf {
    data_dir.join("nodes").join(FLEET_FILE)
}

#[derive(serde::Serialize, serde::Deserialize)]
struct FleetFile {
    nodes: Vec<String>,
}

/// Write the fleet file (atomically): the virtual nodes that should have an agent. Agents
/// of other nodes exit within a second. Without agents and without a `nodes` directory
/// (no agent ever ran here) nothing is written.
pub fn write_fleet(data_dir: &Path, nodes: &[String]) -> std::io::Result<()> {
    let path = fleet_path(data_dir);
    let Some(dir) = path.parent() else { return Ok(()) };
    if nodes.is_empty() && !dir.exists() {
        return Ok(());
    }
    std::fs::create_dir_all(dir)?;
    let text = serde_json::to_string(&FleetFile { nodes: nodes.to_vec() }).map_err(std::io::Error::other)?;
    let tmp = dir.join(format!(".{FLEET_FILE}.{}", std::process::id()));
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, &path)
}

/// The node names in the fleet file; None without a readable, well-formed file.
fn read_fleet(path: &Path) -> Option<Vec<String>> {
    let text = std::fs::read_to_string(path).ok()?;
    serde_json::from_str::<FleetFile>(&text).ok().map(|f| f.nodes)
}

/// Stop every agent of the data directory: write an empty fleet, then wait up to
/// `timeout` for the agents to release their locks. Returns the nodes whose agents still
/// hold them.
pub fn stop_agents(data_dir: &Path, timeout: Duration) -> std::io::Result<Vec<String>> {
    write_fleet(data_dir, &[])?;
    let dir = data_dir.join("nodes");
    let locks: Vec<PathBuf> = match std::fs::read_dir(&dir) {
        Ok(entries) => entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "lock"))
            .collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let deadline = Instant::now() + timeout;
    loop {
        let mut left = Vec::new();
        for p in &locks {
            if held(p)? {
                left.push(p.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default());
            }
        }
        if left.is_empty() || Instant::now() >= deadline {
            return Ok(left);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Make sure the node's agent runs (start it if not), then call `on_loss` from a thread
/// when the agent goes away.
pub fn ensure_and_watch(
    data_dir: &Path,
    node: &str,
    agent_command: &[OsString],
    on_loss: impl FnOnce() + Send + 'static,
) -> std::io::Result<()> {
    let path = lock_path(data_dir, node);
    if !held(&path)? {
        let (program, args) = agent_command
            .split_first()
            .ok_or_else(|| std::io::Error::other("no node agent command"))?;
        let mut cmd = Command::new(program);
        cmd.args(args).arg(&path).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
        // SAFETY: `pre_exec` runs the closure between fork and exec, where only
        // async-signal-safe calls may be made: setsid is one, and allocates nothing. The
        // agent leaves the server's session (std has no safe way to ask for that).
        unsafe {
            cmd.pre_exec(|| {
                let _ = nix::unistd::setsid();
                Ok(())
            });
        }
        let mut child = cmd.spawn()?;
        let deadline = Instant::now() + Duration::from_secs(5);
        while !held(&path)? {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(std::io::Error::other(format!("the node agent of {node} exited at start ({status})")));
            }
            if Instant::now() > deadline {
                return Err(std::io::Error::other(format!("the node agent of {node} did not take its lock")));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        // Reap it when it ends, so that it does not linger as a zombie of this server.
        std::thread::spawn(move || {
            let _ = child.wait();
        });
    }
    let f = open(&path)?;
    std::thread::Builder::new().name(format!("node-{node}")).spawn(move || {
        // Blocks for as long as the agent holds its exclusive lock; the shared lock is
        // let go before the loss is reported.
        if let Ok(shared) = Flock::lock(f, FlockArg::LockShared) {
            drop(shared);
            on_loss();
        }
    })?;
    Ok(())
}

/// `trainyard node-agent LOCK`: hold the node's lock until killed, or until the agent has
/// no purpose left (see the module docs).
pub fn agent_main(lock: &Path) -> i32 {
    let f = match open(lock) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("node-agent: {}: {e}", lock.display());
            return 1;
        }
    };
    let held = match take_lock(f, LOCK_PATIENCE) {
        Ok(l) => l,
        Err(Errno::EWOULDBLOCK) => {
            eprintln!("node-agent: {} is held by another agent", lock.display());
            return 75;
        }
        Err(e) => {
            eprintln!("node-agent: cannot lock {}: {e}", lock.display());
            return 1;
        }
    };
    let locked = match held.metadata() {
        Ok(m) => (m.dev(), m.ino()),
        Err(e) => {
            eprintln!("node-agent: {}: {e}", lock.display());
            return 1;
        }
    };
    let node = lock.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let fleet = lock.with_file_name(FLEET_FILE);
    loop {
        std::thread::sleep(CHECK_INTERVAL);
        if let Some(why) = purpose_gone(lock, locked, &node, &fleet) {
            eprintln!("node-agent: {node}: {why}; exiting");
            return 0;
        }
    }
}

/// How long an agent tries for its lock at start. The server probes the lock with a shared
/// lock of an instant while it waits for a new agent; another agent holds it for good.
const LOCK_PATIENCE: Duration = Duration::from_secs(2);

/// Take the exclusive lock, trying again for up to `patience` while it is held.
fn take_lock(mut f: File, patience: Duration) -> Result<Flock<File>, Errno> {
    let deadline = Instant::now() + patience;
    loop {
        match Flock::lock(f, FlockArg::LockExclusiveNonblock) {
            Ok(l) => return Ok(l),
            Err((back, Errno::EWOULDBLOCK)) if Instant::now() < deadline => {
                f = back;
                std::thread::sleep(Duration::from_millis(5));
            }
            Err((_, e)) => return Err(e),
        }
    }
}

/// Why an agent that locked `locked` (device, inode) at `lock` should exit, if it should.
fn purpose_gone(lock: &Path, locked: (u64, u64), node: &str, fleet: &Path) -> Option<String> {
    match std::fs::metadata(lock) {
        Ok(m) if (m.dev(), m.ino()) != locked => return Some(format!("{} is another file now", lock.display())),
        Ok(_) => {}
        Err(e) if matches!(e.kind(), std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory) => {
            return Some(format!("{} is gone", lock.display()))
        }
        // Anything else (a permission changed, a transient error): keep the node up.
        Err(_) => {}
    }
    match read_fleet(fleet) {
        Some(nodes) if !nodes.iter().any(|n| n == node) => Some(format!("not in the fleet of {}", fleet.display())),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn purpose_is_gone_when_the_lock_file_goes_or_changes() {
        let dir = tempfile::tempdir().unwrap();
        let lock = lock_path(dir.path(), "n1");
        let _f = open(&lock).unwrap();
        let m = _f.metadata().unwrap();
        let id = (m.dev(), m.ino());
        let fleet = fleet_path(dir.path());
        assert_eq!(purpose_gone(&lock, id, "n1", &fleet), None, "no fleet file: keep running");
        std::fs::remove_file(&lock).unwrap();
        assert!(purpose_gone(&lock, id, "n1", &fleet).unwrap().contains("is gone"));
        // Another file at the same path (a data directory made again); `f` keeps the
        // first inode alive, so its number is not reused.
        let _f2 = open(&lock).unwrap();
        assert!(purpose_gone(&lock, id, "n1", &fleet).unwrap().contains("another file"));
        std::fs::remove_dir_all(dir.path().join("nodes")).unwrap();
        assert!(purpose_gone(&lock, id, "n1", &fleet).unwrap().contains("is gone"));
    }

    #[test]
    fn purpose_follows_the_fleet_file() {
        let dir = tempfile::tempdir().unwrap();
        let lock = lock_path(dir.path(), "n1");
        let m = open(&lock).unwrap().metadata().unwrap();
        let id = (m.dev(), m.ino());
        let fleet = fleet_path(dir.path());
        write_fleet(dir.path(), &["n1".into(), "n2".into()]).unwrap();
        assert_eq!(purpose_gone(&lock, id, "n1", &fleet), None);
        write_fleet(dir.path(), &["n2".into()]).unwrap();
        assert!(purpose_gone(&lock, id, "n1", &fleet).unwrap().contains("not in the fleet"));
        std::fs::write(&fleet, "{half").unwrap();
        assert_eq!(purpose_gone(&lock, id, "n1", &fleet), None, "a file that does not parse stops nothing");
    }

    #[test]
    fn no_fleet_file_is_made_where_no_agent_ever_ran() {
        let dir = tempfile::tempdir().unwrap();
        write_fleet(dir.path(), &[]).unwrap();
        assert!(!dir.path().join("nodes").exists());
        assert_eq!(stop_agents(dir.path(), Duration::from_millis(10)).unwrap(), Vec::<String>::new());
    }

    #[test]
    fn an_agent_waits_out_a_probe_but_not_another_agent() {
        let dir = tempfile::tempdir().unwrap();
        let lock = lock_path(dir.path(), "n1");
        // A probe (the server's shared lock of an instant) is waited out.
        let probe = Flock::lock(open(&lock).unwrap(), FlockArg::LockSharedNonblock).unwrap();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            drop(probe);
        });
        let agent = take_lock(open(&lock).unwrap(), Duration::from_secs(2)).unwrap();
        t.join().unwrap();
        // Another agent's lock is not.
        let t0 = Instant::now();
        assert_eq!(take_lock(open(&lock).unwrap(), Duration::from_millis(200)).unwrap_err(), Errno::EWOULDBLOCK);
        assert!(t0.elapsed() >= Duration::from_millis(200));
        drop(agent);
    }

    #[test]
    fn stop_agents_waits_for_the_locks() {
        let dir = tempfile::tempdir().unwrap();
        let lock = lock_path(dir.path(), "n1");
        let held = Flock::lock(open(&lock).unwrap(), FlockArg::LockExclusiveNonblock).unwrap();
        assert_eq!(stop_agents(dir.path(), Duration::from_millis(100)).unwrap(), vec!["n1".to_string()]);
        assert_eq!(read_fleet(&fleet_path(dir.path())), Some(vec![]));
        drop(held);
        assert_eq!(stop_agents(dir.path(), Duration::from_millis(100)).unwrap(), Vec::<String>::new());
    }
}
