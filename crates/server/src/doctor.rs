//! `trainyard doctor`: what this host gives the server for a config, checked without
//! starting it, one finding per line with what to do about it. The checks are the ones the
//! server's start makes (the same functions); the start logs the cheap ones' summary.
//!
//! Nothing is changed, with one exception said here: the cgroup checks prove a hierarchy
//! writable as the server does, by making `<own cgroup>/trainyard` (which the server keeps
//! anyway) and a probe cgroup below it that is removed again. (The per-project users'
//! check does not give the data directory the search bit, as the start does.)

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

use trainyard_backend::{CgroupSupport, CpuSupport, PidsSupport};

use crate::config::{BackendChoice, Config};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Status {
    Ok,
    Warn,
    Fail,
}

impl Status {
    pub fn word(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Fail => "fail",
        }
    }
}

/// One check's result: what was checked, what was found, and what to do when it is not ok.
#[derive(Clone, Debug)]
pub struct Finding {
    pub check: &'static str,
    pub status: Status,
    pub detail: String,
    pub fix: Option<String>,
}

impl Finding {
    fn ok(check: &'static str, detail: impl Into<String>) -> Finding {
        Finding { check, status: Status::Ok, detail: detail.into(), fix: None }
    }
    fn warn(check: &'static str, detail: impl Into<String>, fix: impl Into<String>) -> Finding {
        Finding { check, status: Status::Warn, detail: detail.into(), fix: Some(fix.into()) }
    }
    fn fail(check: &'static str, detail: impl Into<String>, fix: impl Into<String>) -> Finding {
        Finding { check, status: Status::Fail, detail: detail.into(), fix: Some(fix.into()) }
    }
}

/// Which checks: all of them (`trainyard doctor`), or those a starting server does not
/// make on its own way and that cost nothing (the output roots, the clock): its start
/// logs their summary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    Full,
    Start,
}

/// Every check for `cfg`; `listen` is the address the server would listen on.
/// `[tls]`: usable files, or (off) whether bearer tokens would cross the network in clear.
fn tls(cfg: &Config, addr: SocketAddr) -> Finding {
    if cfg.tls.enabled() {
        return match crate::tls::check(&cfg.tls, &cfg.data_dir) {
            Ok(detail) => Finding::ok("TLS", detail),
            Err(e) => Finding::fail("TLS", e.to_string(), "fix the file it names, or set [tls] auto = true for a certificate the server makes"),
        };
    }
    if cfg.tokens_file.is_some() && !addr.ip().is_loopback() {
        return Finding::warn(
            "TLS",
            format!("off while {addr} is beyond loopback with tokens: bearer tokens cross the network in clear text"),
            "set [tls] auto = true (or trainyard serve --tls-auto), or [tls] cert_file and key_file",
        );
    }
    Finding::ok("TLS", "off (plain HTTP; [tls] auto = true or cert_file/key_file turn it on)")
}

pub fn examine(cfg: &Config, listen: Option<SocketAddr>, scope: Scope) -> Vec<Finding> {
    let mut out: Vec<Finding> = cfg.output_roots.iter().map(|r| output_root(r)).collect();
    out.push(clock(&cfg.store_location()));
    if scope == Scope::Start {
        return out;
    }
    out.push(directory("data directory", &cfg.data_dir, cfg.replicas.uid_range.is_some()));
    out.push(data_dir_holder(&cfg.data_dir, cfg.store.is_some()));
    out.push(directory("storage root", &cfg.storage_root, cfg.replicas.uid_range.is_some()));
    out.push(replica_users(cfg));
    if let Some(location) = &cfg.store {
        out.push(store(location));
        out.push(leader(cfg, location));
    }
    if nix::unistd::geteuid().is_root() {
        out.push(mount_namespaces(cfg));
    }
    if let Some(dir) = cfg.log.audit_file.as_deref().and_then(Path::parent) {
        out.push(directory("audit file directory", dir, false));
    }
    if let Some(path) = &cfg.tokens_file {
        out.push(match crate::auth::TokenStore::open(path) {
            Ok(t) => Finding::ok("tokens file", format!("{}: {} tokens, readable by this user only", path.display(), t.current().len())),
            Err(e) => Finding::fail("tokens file", e.to_string(), "fix the file it names (mode 0600, valid TOML) or give another one with --tokens"),
        });
    }
    if let Some(addr) = listen {
        out.push(tls(cfg, addr));
        out.push(match std::net::TcpListener::bind(addr) {
            Ok(_) => Finding::ok("listen address", format!("{addr} is free")),
            Err(e) => Finding::fail("listen address", format!("{addr}: {e}"), "stop what listens there (another server?) or choose another address with --listen"),
        });
    }
    match &cfg.backend {
        BackendChoice::Local => {
            let memory = CgroupSupport::detect();
            out.push(cgroups(&memory));
            out.push(pids(&PidsSupport::detect(&memory)));
            out.push(cpu(&CpuSupport::detect(&memory, cfg.replicas.nice)));
            out.push(gpus());
        }
        BackendChoice::Slurm(s) => {
            out.push(slurm_partition("slurm partition", &s.partition));
            if let Some(p) = &s.gpu_partition {
                out.push(slurm_partition("slurm gpu partition", p));
            }
        }
    }
    out.push(containers(cfg));
    if let Some(f) = priority_classes(&cfg.priority_classes) {
        out.push(f);
    }
    out
}

/// Priority classes above the default that every project may use: any tenant can give
/// its jobs that priority (and preempt the others' with it).
fn priority_classes(pc: &trainyard_core::schedule::PriorityClasses) -> Option<Finding> {
    if pc.classes.is_empty() {
        return None;
    }
    let default = pc.default.as_deref().and_then(|d| pc.value(d)).unwrap_or(0);
    let open: Vec<&str> = pc.classes.iter().filter(|(n, v)| *v > default && !pc.allowed.contains_key(n)).map(|(n, _)| n.as_str()).collect();
    Some(if open.is_empty() {
        Finding::ok("priority classes", "every class above the default is open only to the projects it lists")
    } else {
        Finding::warn(
            "priority classes",
            format!("{} above the default ({default}) and open to every project: any tenant may give its jobs that priority", open.join(", ")),
            "list the projects that may use each with `projects = [...]` in its [[scheduler.priority_classes]] table",
        )
    })
}

/// One line per finding (`ok    data directory  /var/lib/trainyard ...`), the fix below
/// a finding that is not ok.
pub fn render(findings: &[Finding]) -> String {
    let width = findings.iter().map(|f| f.check.len()).max().unwrap_or(0);
    let mut s = String::new();
    for f in findings {
        s.push_str(&format!("{:<5} {:<width$}  {}\n", f.status.word(), f.check, f.detail));
        if let Some(fix) = &f.fix {
            s.push_str(&format!("      {:<width$}  fix: {fix}\n", ""));
        }
    }
    s.push_str(&summary(findings));
    s.push('\n');
    s
}

/// `9 ok, 2 warnings, 0 failures`.
pub fn summary(findings: &[Finding]) -> String {
    let n = |st: Status| findings.iter().filter(|f| f.status == st).count();
    format!("{} ok, {} warnings, {} failures", n(Status::Ok), n(Status::Warn), n(Status::Fail))
}

pub fn failed(findings: &[Finding]) -> bool {
    findings.iter().any(|f| f.status == Status::Fail)
}

/// A directory the server makes or uses: there and ours to write, or makeable; with
/// per-project users, every directory above it passable by others (search bit).
fn directory(check: &'static str, dir: &Path, passable: bool) -> Finding {
    let existing = dir.ancestors().find(|a| a.exists()).unwrap_or(Path::new("/"));
    if existing == dir && !dir.is_dir() {
        return Finding::fail(check, format!("{} is not a directory", dir.display()), "give a directory (data_dir / storage_root in the config, or --data-dir)");
    }
    if nix::unistd::access(existing, nix::unistd::AccessFlags::W_OK | nix::unistd::AccessFlags::X_OK).is_err() {
        let what = if existing == dir { "is not writable by this user".to_string() } else { format!("cannot be made: {} is not writable by this user", existing.display()) };
        return Finding::fail(check, format!("{} {what}", dir.display()), format!("run the server as a user that may write {}, or choose another directory", existing.display()));
    }
    if passable {
        let closed: Vec<PathBuf> = dir
            .ancestors()
            .skip(1)
            .filter(|a| a.exists())
            .filter(|a| std::fs::metadata(a).is_ok_and(|m| m.permissions().mode() & 0o001 == 0))
            .map(Path::to_path_buf)
            .collect();
        if let Some(first) = closed.first() {
            return Finding::fail(
                check,
                format!("{}: {} cannot be passed by other users, so per-project users cannot reach their directories below it", dir.display(), first.display()),
                format!("chmod o+x {} (search only: nothing is listed)", closed.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(" ")),
            );
        }
    }
    if existing == dir {
        let mode = std::fs::metadata(dir).map(|m| m.permissions().mode() & 0o777).unwrap_or(0);
        let allowed = if passable { 0o711 } else { 0o700 };
        if check == "data directory" && mode & !allowed != 0 {
            return Finding::warn(check, format!("{} has mode {mode:04o}", dir.display()), format!("the server tightens it to {allowed:04o} at its start (or chmod {allowed:o} {})", dir.display()));
        }
        if check == "data directory" {
            // The database readable by others (a copy made by hand): the server makes it
            // its owner's at its start, unless it is not the server's user's.
            let open: Vec<String> = ["trainyard.db", "trainyard.db-wal", "trainyard.db-shm"]
                .iter()
                .map(|f| dir.join(f))
                .filter(|f| std::fs::symlink_metadata(f).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o077 != 0))
                .map(|f| f.display().to_string())
                .collect();
            if !open.is_empty() {
                return Finding::warn(check, format!("{} readable by other users", open.join(", ")), format!("chmod 600 {} (the server does it at its start when they are its user's)", open.join(" ")));
            }
        }
        Finding::ok(check, format!("{} (mode {mode:04o})", dir.display()))
    } else {
        Finding::ok(check, format!("{} (made at the start, in {})", dir.display(), existing.display()))
    }
}

fn output_root(root: &Path) -> Finding {
    if root.is_dir() {
        Finding::ok("output root", root.display().to_string())
    } else {
        Finding::warn("output root", format!("{} does not exist", root.display()), "make it, or remove it from output_roots: jobs cannot write there")
    }
}

fn replica_users(cfg: &Config) -> Finding {
    match crate::identity::check_only(cfg) {
        Ok(note) if cfg.replicas.uid_range.is_some() || cfg.replicas.insecure_shared_user => Finding::ok("replica users", note),
        Ok(note) => Finding::warn("replica users", note, "run the server as root with [replicas] uid_range for a user per project"),
        Err(why) => Finding::fail("replica users", why, "see [replicas] in docs/configuration.md"),
    }
}

/// A PostgreSQL store (`[store] url`): reachable, and of a schema this build can use.
fn store(location: &trainyard_store::Location) -> Finding {
    const CHECK: &str = "store";
    match trainyard_store::schema_version_at(location) {
        Ok(v) if v > trainyard_store::SCHEMA_VERSION => Finding::fail(
            CHECK,
            format!("{location}: schema version {v}, newer than this Trainyard knows ({})", trainyard_store::SCHEMA_VERSION),
            "run the Trainyard release that wrote it, or a newer one",
        ),
        Ok(v) => Finding::ok(CHECK, format!("PostgreSQL at {location}, schema version {v} (this build migrates to {})", trainyard_store::SCHEMA_VERSION)),
        Err(e) => Finding::fail(CHECK, e.to_string(), "check [store] url (host, port, user, password, database) and that PostgreSQL accepts this host"),
    }
}

/// Several servers on one PostgreSQL store: who leads, and whether this config is the
/// leader's (a server of another config is refused at start).
fn leader(cfg: &Config, location: &trainyard_store::Location) -> Finding {
    const CHECK: &str = "leader";
    match trainyard_store::lease::lease_at(location) {
        Ok(None) => Finding::ok(CHECK, "no server has led this store yet: the first to start leads".to_string()),
        Ok(Some(l)) if l.expired() => Finding::ok(CHECK, format!("none now (the lease of epoch {} expired): the next server to start leads", l.epoch)),
        Ok(Some(l)) => {
            let led = format!("{} at {} leads (epoch {}, renewed {:.1} s ago)", l.holder, l.address, l.epoch, l.renewed_ago_us as f64 / 1e6);
            let differ = crate::config::differing_keys(&cfg.agreed(), &l.config);
            if differ.is_empty() {
                Finding::ok(CHECK, format!("{led}; this server would follow it"))
            } else {
                Finding::fail(
                    CHECK,
                    format!("{led} with another config: {}", differ.join("; ")),
                    crate::config::ONE_CONFIG,
                )
            }
        }
        Err(e) => Finding::warn(CHECK, format!("cannot read the store's lease: {e}"), "see the store check"),
    }
}

/// A root server gives each host replica a mount namespace of its own (/gcs, a /proc
/// that hides other tenants' processes, its own /dev/shm).
fn mount_namespaces(cfg: &Config) -> Finding {
    const CHECK: &str = "mount namespaces";
    match trainyard_backend::shim::probe_mount_namespace() {
        Ok(()) => Finding::ok(CHECK, "each replica gets its own (/gcs, a /proc hiding other tenants' processes)"),
        Err(why) if cfg.tokens_file.is_some() => {
            Finding::fail(CHECK, format!("{why}: with tokens the server refuses to start (replicas would see other tenants' processes)"), crate::MOUNT_NAMESPACE_FIX)
        }
        Err(why) => Finding::warn(CHECK, format!("{why}: /gcs/ in command and args is rewritten instead, and replicas see the host's /proc"), crate::MOUNT_NAMESPACE_FIX),
    }
}

/// The clock is not behind the newest change in the database (time going backwards would
/// make timeouts and backoffs wrong, L19).
fn clock(db: &trainyard_store::Location) -> Finding {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_micros() as i64).unwrap_or(0);
    match trainyard_store::newest_update(db) {
        Ok(Some(newest)) if newest > now + 1_000_000 => Finding::fail(
            "clock",
            format!("the clock is {:.0} s behind the newest change in {db}", (newest - now) as f64 / 1e6),
            "set the clock right (NTP) before starting the server",
        ),
        Ok(_) => Finding::ok("clock", "not behind the database's newest change"),
        Err(e) => Finding::warn("clock", format!("cannot read {db}: {e}"), "check the database file's owner and mode, or that the store can be reached"),
    }
}

fn cgroups(memory: &CgroupSupport) -> Finding {
    match memory.base() {
        Some((version, base)) => Finding::ok("memory cgroup", format!("v{} at {} (replicas get their memory limit, OOM kills are told apart)", version.number(), base.display())),
        None => Finding::warn(
            "memory cgroup",
            match memory {
                CgroupSupport::Unavailable { reason } => format!("none writable ({reason}): replicas run without a memory limit"),
                _ => "none writable: replicas run without a memory limit".to_string(),
            },
            "run the server as root on a host with a writable memory cgroup (v1 memory hierarchy or v2 with the memory controller delegated)",
        ),
    }
}

fn pids(pids: &PidsSupport) -> Finding {
    match pids {
        PidsSupport::V1 { base } => Finding::ok("pids cgroup", format!("v1 at {}", base.display())),
        PidsSupport::V2 => Finding::ok("pids cgroup", "v2 (pids.max of each replica's cgroup)"),
        PidsSupport::Unavailable { reason } => Finding::warn("pids cgroup", reason.clone(), "mount the v1 pids hierarchy or delegate the v2 pids controller; else a replica's task limit is RLIMIT_NPROC"),
    }
}

fn cpu(cpu: &CpuSupport) -> Finding {
    match cpu {
        CpuSupport::Unavailable { .. } => Finding::warn(
            "replicas' CPU group",
            cpu.describe(),
            "mount the v1 cpu hierarchy or delegate the v2 cpu controller; else many processes of a tenant can slow the server's answers",
        ),
        _ => Finding::ok("replicas' CPU group", cpu.describe()),
    }
}

fn gpus() -> Finding {
    match crate::gpus::discover() {
        crate::gpus::Discovery::NoDriver => Finding::ok("gpus", "none (no nvidia-smi on PATH)"),
        crate::gpus::Discovery::Found(inv) => {
            let names: Vec<String> = inv.gpus.iter().map(|g| format!("{} {}", g.index, g.name)).collect();
            Finding::ok("gpus", if names.is_empty() { "nvidia-smi lists none".to_string() } else { format!("{} GPUs: {}", names.len(), names.join(", ")) })
        }
        crate::gpus::Discovery::Failed(e) => Finding::fail("gpus", format!("nvidia-smi failed: {e}"), "fix the NVIDIA driver (nvidia-smi must list the GPUs)"),
    }
}

fn slurm_partition(check: &'static str, partition: &str) -> Finding {
    match Command::new("sinfo").args(["-h", "-p", partition, "-o", "%a %D"]).output() {
        Ok(o) if o.status.success() && !o.stdout.is_empty() => {
            Finding::ok(check, format!("{partition}: {}", String::from_utf8_lossy(&o.stdout).trim()))
        }
        Ok(o) if o.status.success() => Finding::fail(check, format!("sinfo lists no partition {partition:?}"), "name a partition `sinfo` lists ([slurm] partition)"),
        Ok(o) => Finding::fail(check, format!("sinfo: {}", String::from_utf8_lossy(&o.stderr).trim()), "start slurmctld or point SLURM_CONF at the cluster's slurm.conf"),
        Err(e) => Finding::fail(check, format!("cannot run sinfo: {e}"), "install Slurm's client commands (sinfo, sbatch, squeue, scancel) on this host"),
    }
}

fn containers(cfg: &Config) -> Finding {
    match crate::containers::resolve(cfg) {
        Ok(Some(c)) => Finding::ok(
            "containers",
            format!(
                "{} {} with {} (cgroups {}): replicas run in their images",
                c.engine.program.display(),
                c.info.version,
                c.info.runtime,
                c.info.cgroups
            ),
        ),
        Ok(None) => Finding::ok("containers", "none: replicas run as host processes (imageUri is recorded)"),
        Err(e) => Finding::fail("containers", e, "install podman with runc, or set [containers] engine = \"none\""),
    }
}

/// Is the data directory free for a server of this config (`shared`: servers of one
/// PostgreSQL store share it), or held by another one?
fn data_dir_holder(dir: &Path, shared: bool) -> Finding {
    const CHECK: &str = "data directory in use";
    match crate::datadir::DataDirLock::probe(dir, shared) {
        Ok(()) => Finding::ok(CHECK, if shared { "by no server of another store" } else { "by no other server" }),
        Err(e @ crate::datadir::LockError::Busy { pid, .. }) => Finding::fail(
            CHECK,
            e.to_string(),
            match pid {
                Some(pid) => format!("a server started with this config would be refused: stop that one (systemctl stop trainyard, or kill {pid}) or give this one another data_dir"),
                None => "a server started with this config would be refused: stop the other one or give this one another data_dir".to_string(),
            },
        ),
        Err(e) => Finding::warn(CHECK, e.to_string(), "check the data directory's owner and mode"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A data directory another server holds is a failure naming its pid; once it is
    /// free, ok.
    #[test]
    fn a_data_directory_held_by_another_server_is_reported() {
        let tmp = tempfile::tempdir().unwrap();
        assert_eq!(data_dir_holder(tmp.path(), false).status, Status::Ok);
        let held = crate::datadir::DataDirLock::take(tmp.path()).unwrap();
        let f = data_dir_holder(tmp.path(), false);
        assert_eq!(f.status, Status::Fail, "{f:?}");
        assert!(f.detail.contains(&format!("pid {}", std::process::id())) && f.fix.as_deref().unwrap_or("").contains("kill"), "{f:?}");
        drop(held);
        assert_eq!(data_dir_holder(tmp.path(), false).status, Status::Ok);
    }

    #[test]
    fn an_open_priority_class_above_the_default_is_warned_about() {
        let mut pc = trainyard_core::schedule::PriorityClasses {
            classes: vec![("urgent".into(), 1000), ("batch".into(), 0)],
            default: Some("batch".into()),
            ..Default::default()
        };
        let f = priority_classes(&pc).expect("a finding");
        assert!(f.status == Status::Warn && f.detail.contains("urgent"), "{f:?}");
        pc.allowed.insert("urgent".into(), vec!["ops".into()]);
        assert_eq!(priority_classes(&pc).map(|f| f.status), Some(Status::Ok));
        assert!(priority_classes(&Default::default()).is_none(), "no classes, nothing to say");
    }

    #[test]
    fn directories_say_what_is_wrong_and_the_fix() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("file");
        std::fs::write(&file, "x").unwrap();
        let f = directory("data directory", &file, false);
        assert_eq!(f.status, Status::Fail, "{f:?}");
        let open = tmp.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
        let f = directory("data directory", &open, false);
        assert_eq!(f.status, Status::Warn, "{f:?}");
        assert!(f.fix.as_deref().unwrap_or("").contains("0700"), "{f:?}");
        let new = tmp.path().join("a/b/c");
        assert_eq!(directory("storage root", &new, false).status, Status::Ok);
        // Per-project users must pass through every directory above.
        let closed = tmp.path().join("closed");
        std::fs::create_dir(&closed).unwrap();
        std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o700)).unwrap();
        let f = directory("data directory", &closed.join("data"), true);
        assert_eq!(f.status, Status::Fail, "{f:?}");
        assert!(f.fix.as_deref().unwrap_or("").contains(&format!("chmod o+x {}", closed.display())), "{f:?}");
        let r = render(&[f, Finding::ok("clock", "fine")]);
        assert!(r.contains("fail ") && r.contains("fix: chmod o+x") && r.ends_with("1 ok, 0 warnings, 1 failures\n"), "{r}");
    }
}
