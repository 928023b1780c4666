//! The replica's memory cgroup: detection of the memory hierarchy (cgroup v1 or v2), a
//! per-replica cgroup with a memory limit, the kernel's OOM-kill counter (L14), and
//! killing everything in it (L20). Where that cgroup is a v1 one, the replica's task limit
//! (`pids_max`) needs a second cgroup in the v1 pids hierarchy: [`PidsSupport`] and
//! [`V1Cgroup`].
//!
//! Every file helper takes the cgroup directory as a parameter, so unit tests run against
//! a temporary directory holding fixture files.

use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

use crate::fsutil::{FileError, IoResultExt};

/// Directory made below the server's own cgroup; replica cgroups live inside it.
pub const BASE_DIR_NAME: &str = "trainyard";

/// How long `kill_all` keeps killing before it reports the cgroup as not empty.
const KILL_ALL_BOUND: Duration = Duration::from_secs(5);
/// How long `remove` retries `rmdir` on EBUSY (a killed process still exiting).
const REMOVE_BOUND: Duration = Duration::from_secs(2);
const RETRY_PAUSE: Duration = Duration::from_millis(10);

#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error(transparent)]
    File(#[from] FileError),
    #[error("invalid cgroup name {0:?}: must be non-empty and contain no '/'")]
    InvalidName(String),
    #[error("cgroup {} still has {remaining} process(es) after killing for {bound:?}", path.display())]
    NotEmpty { path: PathBuf, remaining: usize, bound: Duration },
    #[error("cgroup {} already exists and holds {processes} process(es)", path.display())]
    InUse { path: PathBuf, processes: usize },
    #[error("unsupported cgroup version {0} (expected 1 or 2)")]
    UnsupportedVersion(u8),
}

/// The cgroup hierarchy that holds the memory controller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CgroupVersion {
    V1,
    V2,
}

impl CgroupVersion {
    /// The number written into the shim's spec (`cgroup_version`).
    pub fn number(self) -> u8 {
        match self {
            CgroupVersion::V1 => 1,
            CgroupVersion::V2 => 2,
        }
    }

    pub fn from_number(n: u8) -> Result<Self, CgroupError> {
        match n {
            1 => Ok(CgroupVersion::V1),
            2 => Ok(CgroupVersion::V2),
            other => Err(CgroupError::UnsupportedVersion(other)),
        }
    }
}

/// What this host offers for replica cgroups. `base` is `<own cgroup>/trainyard`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CgroupSupport {
    V1 { base: PathBuf },
    V2 { base: PathBuf },
    /// No writable memory hierarchy: replicas run without a memory limit and their OOM
    /// kills are reported as unknown (never guessed from exit status 137, L14).
    Unavailable { reason: String },
}

impl CgroupSupport {
    /// Finds the memory hierarchy of this process (from `/proc/self/cgroup` and
    /// `/proc/self/mountinfo`), makes `<own cgroup>/trainyard`, and proves it usable by
    /// creating and removing a probe cgroup with a memory limit.
    pub fn detect() -> CgroupSupport {
        let read = |p: &str| fs::read_to_string(p).map_err(|e| format!("cannot read {p}: {e}"));
        let located = read("/proc/self/cgroup")
            .and_then(|cg| read("/proc/self/mountinfo").map(|mi| (cg, mi)))
            .and_then(|(cg, mi)| locate_memory_cgroup(&cg, &mi));
        match located.and_then(|(version, own)| prepare_base(version, &own)) {
            Ok(support) => support,
            Err(reason) => CgroupSupport::Unavailable { reason },
        }
    }

    /// The version and base directory, when available.
    pub fn base(&self) -> Option<(CgroupVersion, &Path)> {
        match self {
            CgroupSupport::V1 { base } => Some((CgroupVersion::V1, base)),
            CgroupSupport::V2 { base } => Some((CgroupVersion::V2, base)),
            CgroupSupport::Unavailable { .. } => None,
        }
    }
}

/// Finds the directory of this process's own memory cgroup from the texts of
/// `/proc/self/cgroup` and `/proc/self/mountinfo`. A v1 memory controller wins over v2
/// (on a hybrid host the unified hierarchy has no memory controller); for v2 the
/// controller must be listed in the cgroup's `cgroup.controllers`, which the caller checks.
pub fn locate_memory_cgroup(proc_cgroup: &str, mountinfo: &str) -> Result<(CgroupVersion, PathBuf), String> {
    let mut v2_path = None;
    for line in proc_cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        if id == "0" && controllers.is_empty() {
            v2_path = Some(path.to_string());
        }
    }
    let mounts: Vec<Mount> = mountinfo.lines().filter_map(parse_mountinfo_line).collect();
    if let Some(path) = v1_controller_path(proc_cgroup, "memory") {
        return v1_controller_dir(&mounts, "memory", &path).map(|p| (CgroupVersion::V1, p));
    }
    if let Some(path) = v2_path {
        let mount = mounts
            .iter()
            .find(|m| m.fstype == "cgroup2")
            .ok_or_else(|| "no cgroup2 mount found in /proc/self/mountinfo".to_string())?;
        return join_mount(mount, &path).map(|p| (CgroupVersion::V2, p));
    }
    Err("this process is in no memory cgroup (/proc/self/cgroup lists neither a v1 memory controller nor a v2 hierarchy)".into())
}

/// The OOM kills in the memory cgroup that another engine put this process in (a Slurm
/// job step): the `oom_kill` counters of that cgroup and of its parent, read at start and
/// compared at the end. Slurm's cgroup plugin limits memory at the job and the step level
/// and puts tasks in `.../job_J/step_S[/task_T]`, so the leaf and its parent cover the
/// step's limit; a kill at the job level by another step of the same job would be counted
/// too (a gang's replicas each have a step limit of their own, which is reached first).
#[derive(Debug)]
pub struct EngineCgroupOom {
    /// (counter file, its value at start).
    counters: Vec<(PathBuf, u64)>,
}

impl EngineCgroupOom {
    /// This process's memory cgroup from `/proc/self`; `None` when there is none or its
    /// counters cannot be read (then OOM kills stay unknown).
    pub fn find() -> Option<EngineCgroupOom> {
        let proc_cgroup = fs::read_to_string("/proc/self/cgroup").ok()?;
        let mountinfo = fs::read_to_string("/proc/self/mountinfo").ok()?;
        let (version, leaf) = locate_memory_cgroup(&proc_cgroup, &mountinfo).ok()?;
        EngineCgroupOom::at(version, &leaf)
    }

    /// The counters of `leaf` and its parent.
    pub fn at(version: CgroupVersion, leaf: &Path) -> Option<EngineCgroupOom> {
        let file = match version {
            CgroupVersion::V1 => "memory.oom_control",
            CgroupVersion::V2 => "memory.events",
        };
        let counters: Vec<(PathBuf, u64)> = [Some(leaf), leaf.parent()]
            .into_iter()
            .flatten()
            .filter_map(|dir| {
                let path = dir.join(file);
                let n = flat_keyed_value(&fs::read_to_string(&path).ok()?, "oom_kill")?;
                Some((path, n))
            })
            .collect();
        (!counters.is_empty()).then_some(EngineCgroupOom { counters })
    }

    /// OOM kills since [`EngineCgroupOom::at`]: the largest increase of one counter (a kill
    /// in the leaf counts in the leaf, one at the parent's limit in the parent).
    pub fn kills_since_start(&self) -> Option<u64> {
        let now: Vec<u64> = self
            .counters
            .iter()
            .filter_map(|(path, start)| {
                let n = flat_keyed_value(&fs::read_to_string(path).ok()?, "oom_kill")?;
                Some(n.saturating_sub(*start))
            })
            .collect();
        now.into_iter().max()
    }
}

/// Finds the directory of this process's own cgroup in the cgroup v1 pids hierarchy from
/// the texts of `/proc/self/cgroup` and `/proc/self/mountinfo`. For hosts whose replica
/// cgroups are v1 ones (memory hierarchy): there a replica's task limit needs a cgroup of
/// its own in this other hierarchy. An error says why there is none (a pure v2 host, a
/// v1 host that does not mount the pids controller).
pub fn locate_v1_pids_cgroup(proc_cgroup: &str, mountinfo: &str) -> Result<PathBuf, String> {
    locate_v1_cgroup("pids", proc_cgroup, mountinfo)
}

/// This process's cgroup directory in the v1 hierarchy of `controller`.
fn locate_v1_cgroup(controller: &str, proc_cgroup: &str, mountinfo: &str) -> Result<PathBuf, String> {
    let path = v1_controller_path(proc_cgroup, controller)
        .ok_or_else(|| format!("/proc/self/cgroup lists no cgroup v1 {controller} controller"))?;
    let mounts: Vec<Mount> = mountinfo.lines().filter_map(parse_mountinfo_line).collect();
    v1_controller_dir(&mounts, controller, &path)
}

/// This process's cgroup path in the v1 hierarchy that holds `controller`, as listed in
/// `/proc/self/cgroup` (`4:memory:/a/b`, or `6:cpu,cpuacct:/a` for co-mounted ones).
fn v1_controller_path(proc_cgroup: &str, controller: &str) -> Option<String> {
    proc_cgroup.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (Some(_id), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
            return None;
        };
        controllers.split(',').any(|c| c == controller).then(|| path.to_string())
    })
}

/// The directory of cgroup `path` in the v1 hierarchy mounted with `controller`.
fn v1_controller_dir(mounts: &[Mount], controller: &str, path: &str) -> Result<PathBuf, String> {
    let mount = mounts
        .iter()
        .find(|m| m.fstype == "cgroup" && m.super_options.split(',').any(|o| o == controller))
        .ok_or_else(|| {
            format!("the {controller} controller is listed in /proc/self/cgroup but no cgroup v1 {controller} mount was found")
        })?;
    join_mount(mount, path)
}

struct Mount {
    root: String,
    mount_point: String,
    fstype: String,
    super_options: String,
}

/// `36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue`
fn parse_mountinfo_line(line: &str) -> Option<Mount> {
    let (left, right) = line.split_once(" - ")?;
    let left: Vec<&str> = left.split(' ').collect();
    let right: Vec<&str> = right.split(' ').collect();
    Some(Mount {
        root: unescape_mountinfo(left.get(3)?),
        mount_point: unescape_mountinfo(left.get(4)?),
        fstype: right.first()?.to_string(),
        super_options: right.get(2).copied().unwrap_or("").to_string(),
    })
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo` octal.
pub(crate) fn unescape_mountinfo(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 4 <= bytes.len() && bytes[i + 1..i + 4].iter().all(|b| (b'0'..=b'7').contains(b)) {
            let v = (bytes[i + 1] - b'0') as u32 * 64 + (bytes[i + 2] - b'0') as u32 * 8 + (bytes[i + 3] - b'0') as u32;
            out.push(v as u8);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The directory of cgroup `path` (as listed in /proc/self/cgroup) below `mount`, whose
/// root may itself be a sub-cgroup (cgroup namespaces, bind mounts in containers).
fn join_mount(mount: &Mount, path: &str) -> Result<PathBuf, String> {
    let root = mount.root.trim_end_matches('/');
    let rel = if root.is_empty() {
        path
    } else if path == root {
        ""
    } else if let Some(rest) = path.strip_prefix(root).filter(|r| r.starts_with('/')) {
        rest
    } else {
        return Err(format!(
            "our cgroup {path} is not below the root {} of the cgroup mount at {}",
            mount.root, mount.mount_point
        ));
    };
    let mut dir = PathBuf::from(&mount.mount_point);
    for part in rel.split('/').filter(|p| !p.is_empty()) {
        dir.push(part);
    }
    Ok(dir)
}

/// Makes `<own>/trainyard` usable for replica cgroups, or says why it cannot be.
fn prepare_base(version: CgroupVersion, own: &Path) -> Result<CgroupSupport, String> {
    let base = own.join(BASE_DIR_NAME);
    if version == CgroupVersion::V2 {
        let controllers = read_file(&own.join("cgroup.controllers")).map_err(|e| e.to_string())?;
        if !controllers.split_whitespace().any(|c| c == "memory") {
            return Err(format!(
                "the memory controller is not available in the cgroup v2 hierarchy at {} (cgroup.controllers: {:?})",
                own.display(),
                controllers.trim()
            ));
        }
        enable_memory_controller(own)?;
    }
    match fs::create_dir(&base) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(format!("cannot create cgroup {}: {e}", base.display())),
    }
    if version == CgroupVersion::V2 {
        enable_memory_controller(&base)?;
        // Best effort: with the pids controller, a replica's pids.max is its cgroup's;
        // without, the shim falls back to RLIMIT_NPROC.
        for dir in [own, base.as_path()] {
            let ctl = dir.join("cgroup.subtree_control");
            if read_file(&ctl).is_ok_and(|c| !c.split_whitespace().any(|x| x == "pids")) {
                let _ = write_file(&ctl, "+pids");
            }
        }
    }
    // Prove it: a probe cgroup with a memory limit, removed again.
    let probe = ReplicaCgroup::create(version, &base, &probe_name(), Some(1 << 30))
        .map_err(|e| format!("cannot use cgroup base {}: {e}", base.display()))?;
    probe.remove().map_err(|e| format!("cannot remove probe cgroup: {e}"))?;
    Ok(match version {
        CgroupVersion::V1 => CgroupSupport::V1 { base },
        CgroupVersion::V2 => CgroupSupport::V2 { base },
    })
}

/// A probe cgroup's name, unique among the detections of all processes: detections that
/// run at once in one process (tests, benchmarks) must not share (and remove) one probe.
fn probe_name() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!("probe-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed))
}

/// v2: lets children of `dir` have the memory controller (`+memory` in
/// `cgroup.subtree_control`). Fails with a reason when the kernel refuses, e.g. because
/// `dir` holds processes itself (the "no internal processes" rule).
fn enable_memory_controller(dir: &Path) -> Result<(), String> {
    let ctl = dir.join("cgroup.subtree_control");
    let current = read_file(&ctl).map_err(|e| e.to_string())?;
    if current.split_whitespace().any(|c| c == "memory") {
        return Ok(());
    }
    write_file(&ctl, "+memory").map_err(|e| {
        format!(
            "{e} (a cgroup v2 directory that holds processes cannot delegate controllers: run the server in a \
             cgroup of its own, e.g. a systemd unit with Delegate=yes and the server moved into a leaf)"
        )
    })
}

/// One replica's cgroup.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaCgroup {
    version: CgroupVersion,
    path: PathBuf,
}

impl ReplicaCgroup {
    /// Creates `<base>/<name>` (or reuses it if it exists) and sets the memory limit:
    /// v1 `memory.limit_in_bytes` and, where it exists, `memory.memsw.limit_in_bytes` to
    /// the same value so that swap cannot hide the limit; v2 `memory.max` and
    /// `memory.swap.max` = 0 where it exists.
    pub fn create(
        version: CgroupVersion,
        base: &Path,
        name: &str,
        memory_limit_bytes: Option<u64>,
    ) -> Result<ReplicaCgroup, CgroupError> {
        let cg = ReplicaCgroup::make_idle(version, base, name)?;
        if let Some(limit) = memory_limit_bytes {
            let made = cg.set_memory_limit(limit);
            if let Err(e) = made {
                let _ = fs::remove_dir(&cg.path);
                return Err(e);
            }
        }
        Ok(cg)
    }

    /// Creates `<base>/<name>`, or reuses it if it exists and holds no process.
    fn make_idle(version: CgroupVersion, base: &Path, name: &str) -> Result<ReplicaCgroup, CgroupError> {
        if name.is_empty() || name.contains('/') || name == "." || name == ".." {
            return Err(CgroupError::InvalidName(name.to_string()));
        }
        let path = base.join(name);
        let existed = match fs::create_dir(&path) {
            Ok(()) => false,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => true,
            Err(e) => return Err(FileError { op: "create cgroup", path, source: e }.into()),
        };
        let cg = ReplicaCgroup { version, path };
        if existed {
            // Left over by a crash it may be; but never take over (and later kill) a
            // cgroup in which something runs.
            let procs = cg.procs_file();
            let busy = match read_pids(&procs) {
                Ok(pids) => pids.len(),
                Err(e) if e.kind() == io::ErrorKind::NotFound => 0,
                Err(e) => return Err(e.into()),
            };
            if busy > 0 {
                return Err(CgroupError::InUse { path: cg.path, processes: busy });
            }
        }
        Ok(cg)
    }

    /// An existing replica cgroup, e.g. named in a spec written by an earlier process.
    pub fn open(version: CgroupVersion, path: PathBuf) -> ReplicaCgroup {
        ReplicaCgroup { version, path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Names the same directory through another root: `from` (a prefix of the path)
    /// becomes `to`. False, and nothing changed, when the path is not below `from`.
    pub fn rebase(&mut self, from: &Path, to: &Path) -> bool {
        match self.path.strip_prefix(from) {
            Ok(rest) => {
                self.path = to.join(rest);
                true
            }
            Err(_) => false,
        }
    }

    pub fn version(&self) -> CgroupVersion {
        self.version
    }

    fn set_memory_limit(&self, limit: u64) -> Result<(), CgroupError> {
        let value = limit.to_string();
        match self.version {
            CgroupVersion::V1 => {
                // limit first: memsw must never be below it.
                write_file(&self.path.join("memory.limit_in_bytes"), &value)?;
                let memsw = self.path.join("memory.memsw.limit_in_bytes");
                if memsw.exists() {
                    write_file(&memsw, &value)?;
                }
            }
            CgroupVersion::V2 => {
                write_file(&self.path.join("memory.max"), &value)?;
                let swap = self.path.join("memory.swap.max");
                if swap.exists() {
                    write_file(&swap, "0")?;
                }
            }
        }
        Ok(())
    }

    /// v2: `pids.max`, the most tasks the cgroup may hold (forks beyond it fail with
    /// EAGAIN). An error where the pids controller is not enabled here; on v1 always (v1
    /// keeps pids in a hierarchy of its own: see [`V1Cgroup`]).
    pub fn set_pids_max(&self, max: u64) -> Result<(), CgroupError> {
        match self.version {
            CgroupVersion::V1 => Err(FileError {
                op: "set pids.max",
                path: self.path.join("pids.max"),
                source: io::Error::new(io::ErrorKind::Unsupported, "no pids controller in the v1 memory hierarchy"),
            }
            .into()),
            CgroupVersion::V2 => Ok(write_file(&self.path.join("pids.max"), &max.to_string())?),
        }
    }

    /// The file a process writes `0` into to join this cgroup.
    pub fn procs_file(&self) -> PathBuf {
        self.path.join("cgroup.procs")
    }

    /// The file through which a single-threaded process (a child between fork and exec)
    /// moves itself into this cgroup most cheaply, if the version has one: v1's `tasks`,
    /// which moves the writing thread only. Moving a whole process (`cgroup.procs`)
    /// takes the kernel's global threadgroup lock for writing, which waits for an RCU
    /// grace period: 4 to 17 ms per start on an idle 6.18 kernel, against 0.1 ms for
    /// `tasks`, where the kernel can skip that lock. For a process with one thread both
    /// end the same way. v2 offers this only in threaded cgroups: `None`.
    pub fn thread_attach_file(&self) -> Option<PathBuf> {
        match self.version {
            CgroupVersion::V1 => Some(self.path.join("tasks")),
            CgroupVersion::V2 => None,
        }
    }

    /// The pids now in the cgroup and the cgroups below it (a container's, which the
    /// engine creates below the replica's).
    pub fn pids(&self) -> Result<Vec<i32>, CgroupError> {
        let mut pids = read_pids(&self.procs_file())?;
        for dir in self.children() {
            match read_pids(&dir.join("cgroup.procs")) {
                Ok(more) => pids.extend(more),
                // Removed meanwhile.
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(pids)
    }

    /// Every cgroup below this one, deepest first.
    fn children(&self) -> Vec<PathBuf> {
        fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
            let Ok(entries) = fs::read_dir(dir) else { return };
            for e in entries.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    walk(&e.path(), out);
                    out.push(e.path());
                }
            }
        }
        let mut out = Vec::new();
        walk(&self.path, &mut out);
        out
    }

    /// How many processes the kernel's OOM killer killed in this cgroup: v2
    /// `memory.events` / v1 `memory.oom_control`, line `oom_kill N`. `None` when the
    /// kernel does not account it (unknown, not zero).
    pub fn oom_kills(&self) -> Option<u64> {
        let file = match self.version {
            CgroupVersion::V1 => "memory.oom_control",
            CgroupVersion::V2 => "memory.events",
        };
        let text = read_file(&self.path.join(file)).ok()?;
        flat_keyed_value(&text, "oom_kill")
    }

    /// Memory in use: v2 `memory.current` / v1 `memory.usage_in_bytes` (None: unreadable).
    pub fn memory_bytes(&self) -> Option<u64> {
        let file = match self.version {
            CgroupVersion::V1 => "memory.usage_in_bytes",
            CgroupVersion::V2 => "memory.current",
        };
        read_file(&self.path.join(file)).ok()?.trim().parse().ok()
    }

    /// CPU time used, in seconds: v2 `cpu.stat` `usage_usec`. v1's memory hierarchy
    /// accounts no CPU: there it is the sum, over the processes in the cgroup now, of their
    /// own time and their waited-for children's (so a child reaped by its parent still
    /// counts; what a process that left or was reaped by the shim used since the last
    /// reading is missed, and a sum that went down is taken as no use). None: no process.
    pub fn cpu_seconds(&self) -> Option<f64> {
        match self.version {
            CgroupVersion::V1 => {
                let pids = self.pids().ok().filter(|p| !p.is_empty())?;
                let ticks: u64 = pids
                    .iter()
                    .filter_map(|p| fs::read_to_string(format!("/proc/{p}/stat")).ok())
                    .filter_map(|s| crate::procfs::cpu_ticks_with_children(&s))
                    .sum();
                Some(ticks as f64 / crate::procfs::clock_ticks())
            }
            CgroupVersion::V2 => {
                let text = read_file(&self.path.join("cpu.stat")).ok()?;
                flat_keyed_value(&text, "usage_usec").map(|us| us as f64 / 1e6)
            }
        }
    }

    /// SIGKILLs every process in the cgroup and waits (bounded) until it is empty: v2
    /// `cgroup.kill` where the kernel has it, else reading `cgroup.procs` and killing each
    /// pid, again until none is left (a process may fork while we read).
    pub fn kill_all(&self) -> Result<(), CgroupError> {
        let started = Instant::now();
        let kill_file = self.path.join("cgroup.kill");
        let use_kill_file = self.version == CgroupVersion::V2 && kill_file.exists();
        loop {
            if use_kill_file {
                write_file(&kill_file, "1")?;
            }
            let pids = self.pids()?;
            if pids.is_empty() {
                return Ok(());
            }
            if !use_kill_file {
                kill_pids(&pids);
            }
            if started.elapsed() >= KILL_ALL_BOUND {
                return Err(CgroupError::NotEmpty { path: self.path.clone(), remaining: pids.len(), bound: KILL_ALL_BOUND });
            }
            thread::sleep(RETRY_PAUSE);
        }
    }

    /// One pass of killing: SIGKILL every pid listed now (or `cgroup.kill`). Returns how
    /// many processes were listed. For callers that reap between passes.
    pub fn kill_pass(&self) -> Result<usize, CgroupError> {
        let kill_file = self.path.join("cgroup.kill");
        if self.version == CgroupVersion::V2 && kill_file.exists() {
            write_file(&kill_file, "1")?;
        }
        let pids = self.pids()?;
        kill_pids(&pids);
        Ok(pids.len())
    }

    /// Kills what is left in the cgroup ([`Self::kill_all`]) and removes it; an empty or
    /// already removed cgroup costs one `rmdir`.
    pub fn kill_and_remove(&self) -> Result<(), CgroupError> {
        if self.try_remove()? {
            return Ok(());
        }
        match self.kill_all() {
            Ok(()) => {}
            // Removed meanwhile (by another cleanup of the same run): `remove` says so.
            Err(CgroupError::File(e)) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        self.remove()
    }

    /// One `rmdir`: whether the cgroup is gone (removed now, or before). `false` when the
    /// kernel refuses while it still holds a process or a cgroup below it (`EBUSY`).
    /// The common end of a replica: its cgroup is empty by then, and one system call
    /// replaces reading its processes and walking its directory.
    pub fn try_remove(&self) -> Result<bool, CgroupError> {
        match fs::remove_dir(&self.path) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(true),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => Ok(false),
            Err(e) => Err(FileError { op: "remove cgroup", path: self.path.clone(), source: e }.into()),
        }
    }

    /// Removes the cgroup directory, retrying briefly while the kernel still counts an
    /// exiting process in it. An already removed cgroup is fine.
    pub fn remove(&self) -> Result<(), CgroupError> {
        if self.try_remove()? {
            return Ok(());
        }
        // The cgroups below it first (a container engine's, left empty).
        for dir in self.children() {
            let _ = fs::remove_dir(&dir);
        }
        let started = Instant::now();
        loop {
            match fs::remove_dir(&self.path) {
                Ok(()) => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
                Err(e) if started.elapsed() < REMOVE_BOUND && e.raw_os_error() == Some(libc::EBUSY) => {
                    thread::sleep(RETRY_PAUSE);
                }
                Err(e) => return Err(FileError { op: "remove cgroup", path: self.path.clone(), source: e }.into()),
            }
        }
    }
}

/// Where a replica's task limit (`pids_max`) is enforced on this host, next to its memory
/// cgroup ([`CgroupSupport`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PidsSupport {
    /// cgroup v2: `pids.max` of the replica's own cgroup (the pids controller is enabled
    /// below the base).
    V2,
    /// cgroup v1: each replica also gets a cgroup `<base>/<replica cgroup name>` in the v1
    /// pids hierarchy, `base` being `<own pids cgroup>/trainyard`.
    V1 { base: PathBuf },
    /// No pids cgroup for replicas: the shim falls back to `RLIMIT_NPROC` of the program,
    /// which the kernel counts per uid (all running replicas of a project share it) and
    /// which is not set for a program that runs as the shim's own user.
    Unavailable { reason: String },
}

impl PidsSupport {
    /// What goes with `memory`: v1 locates this process's cgroup in the v1 pids hierarchy
    /// (from `/proc/self/cgroup` and `/proc/self/mountinfo`), makes `<it>/trainyard` and
    /// proves it usable with a probe cgroup that gets a `pids.max` and is removed again;
    /// v2 reads whether the base delegates the pids controller.
    pub fn detect(memory: &CgroupSupport) -> PidsSupport {
        let unavailable = |reason: String| PidsSupport::Unavailable { reason };
        match memory {
            CgroupSupport::V1 { .. } => {
                let read = |p: &str| fs::read_to_string(p).map_err(|e| format!("cannot read {p}: {e}"));
                read("/proc/self/cgroup")
                    .and_then(|cg| read("/proc/self/mountinfo").map(|mi| (cg, mi)))
                    .and_then(|(cg, mi)| locate_v1_pids_cgroup(&cg, &mi))
                    .and_then(|own| prepare_pids_base(&own))
                    .map_or_else(unavailable, |base| PidsSupport::V1 { base })
            }
            CgroupSupport::V2 { base } => match read_file(&base.join("cgroup.subtree_control")) {
                Ok(c) if c.split_whitespace().any(|x| x == "pids") => PidsSupport::V2,
                Ok(c) => unavailable(format!(
                    "the pids controller is not enabled below {} (cgroup.subtree_control: {:?})",
                    base.display(),
                    c.trim()
                )),
                Err(e) => unavailable(e.to_string()),
            },
            CgroupSupport::Unavailable { .. } => unavailable("replicas have no cgroup".into()),
        }
    }

    /// The base for replicas' v1 pids cgroups, when there is one.
    pub fn v1_base(&self) -> Option<&Path> {
        match self {
            PidsSupport::V1 { base } => Some(base),
            PidsSupport::V2 | PidsSupport::Unavailable { .. } => None,
        }
    }
}

/// Makes `<own>/trainyard` in the v1 pids hierarchy usable for replicas' pids cgroups, or
/// says why it cannot be.
fn prepare_pids_base(own: &Path) -> Result<PathBuf, String> {
    let base = own.join(BASE_DIR_NAME);
    match fs::create_dir(&base) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(format!("cannot create cgroup {}: {e}", base.display())),
    }
    let probe = V1Cgroup::pids(&base, &probe_name(), 64).map_err(|e| format!("cannot use cgroup base {}: {e}", base.display()))?;
    probe.remove().map_err(|e| format!("cannot remove probe cgroup: {e}"))?;
    Ok(base)
}

/// A replica's cgroup in a cgroup v1 hierarchy other than memory's, with one setting and
/// nothing else: in the pids hierarchy its `pids.max`, in the cpu hierarchy its
/// `cpu.shares` (below the replicas' CPU group). The program joins it next to its memory
/// cgroup; its processes are counted and killed through the memory cgroup, which holds
/// the same processes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct V1Cgroup {
    cg: ReplicaCgroup,
}

impl V1Cgroup {
    /// `<base>/<name>` in the pids hierarchy with `pids.max`.
    pub fn pids(base: &Path, name: &str, pids_max: u64) -> Result<V1Cgroup, CgroupError> {
        V1Cgroup::make(base, name, "pids.max", pids_max)
    }

    /// `<group>/<name>` in the cpu hierarchy with `cpu.shares`.
    pub fn cpu(group: &Path, name: &str, shares: u64) -> Result<V1Cgroup, CgroupError> {
        // `group` is a project's share of the replicas' CPU group (`cpu_share_name`),
        // made by the first of its replicas; the last one to end may be removing it, so a
        // share that went away meanwhile is made again.
        let mut tries = 0;
        loop {
            match fs::create_dir(group) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(FileError { op: "create the project's CPU share", path: group.to_path_buf(), source: e }.into()),
            }
            match V1Cgroup::make(group, name, "cpu.shares", shares) {
                Err(CgroupError::File(e)) if e.kind() == io::ErrorKind::NotFound && tries < 3 => tries += 1,
                made => return made,
            }
        }
    }

    /// Removes a project's share of the replicas' CPU group once no replica of the project
    /// has a cgroup in it (any other state leaves it: it is in use).
    pub fn remove_share_if_idle(group: &Path) {
        let _ = fs::remove_dir(group);
    }

    /// Creates `<base>/<name>` (or reuses it if it exists and holds no process, like
    /// [`ReplicaCgroup::create`]) and writes its setting.
    fn make(base: &Path, name: &str, file: &str, value: u64) -> Result<V1Cgroup, CgroupError> {
        let cg = ReplicaCgroup::make_idle(CgroupVersion::V1, base, name)?;
        if let Err(e) = write_file(&cg.path.join(file), &value.to_string()) {
            let _ = fs::remove_dir(&cg.path);
            return Err(e.into());
        }
        Ok(V1Cgroup { cg })
    }

    /// An existing one, e.g. named in a spec written by an earlier process.
    pub fn open(path: PathBuf) -> V1Cgroup {
        V1Cgroup { cg: ReplicaCgroup::open(CgroupVersion::V1, path) }
    }

    pub fn path(&self) -> &Path {
        self.cg.path()
    }

    /// See [`ReplicaCgroup::rebase`].
    pub fn rebase(&mut self, from: &Path, to: &Path) -> bool {
        self.cg.rebase(from, to)
    }

    /// See [`ReplicaCgroup::procs_file`].
    pub fn procs_file(&self) -> PathBuf {
        self.cg.procs_file()
    }

    /// v1's `tasks`: see [`ReplicaCgroup::thread_attach_file`].
    pub fn tasks_file(&self) -> PathBuf {
        self.cg.path.join("tasks")
    }

    /// Kills whatever is still in it (nothing, once the memory cgroup was emptied: the
    /// same processes) and removes it; an already removed one is fine.
    pub fn remove(&self) -> Result<(), CgroupError> {
        self.cg.kill_and_remove()
    }
}

/// The kernel's weight of a task at nice 0 to 19 (`sched_prio_to_weight` in
/// kernel/sched/core.c): a cgroup v1 `cpu.shares` of this value weighs, against the
/// server's threads, what one task at that nice value would.
const NICE_WEIGHT: [u64; 20] = [1024, 820, 655, 526, 423, 335, 272, 215, 172, 137, 110, 87, 70, 56, 45, 36, 29, 23, 18, 15];

/// The CPU weight of a task at `nice` (clamped to 0..=19: replicas are never raised above
/// the server).
pub fn nice_weight(nice: i32) -> u64 {
    NICE_WEIGHT[usize::try_from(nice.clamp(0, 19)).unwrap_or(0)]
}

/// Where replicas' host programs get their CPU share: one cgroup that holds all of them,
/// a sibling of the server's own threads, weighted like one task at `[replicas] nice`.
/// The control plane (the API, the scheduler, the shims starting replicas) thus gets the
/// CPU first however many processes tenants run (a per-process nice does not bound a fork
/// burst, and the kernel's autogroups give each replica's session the weight of the whole
/// server), and an otherwise idle machine is all the replicas' (shares are work-conserving).
/// Inside the group each replica is one unit of equal weight, so one replica's fork burst
/// takes its own share and not another tenant's replica's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CpuSupport {
    /// cgroup v1: `<own cpu cgroup>/trainyard` with `cpu.shares`; each replica gets a cgroup
    /// of its own there ([`V1Cgroup::cpu`]), which its program joins next to its memory cgroup.
    V1 { group: PathBuf, shares: u64 },
    /// cgroup v2: the replicas' base (`<own>/trainyard`, holding every replica's cgroup) has
    /// the cpu controller and `cpu.weight.nice`, and passes the controller on to the
    /// replicas' cgroups.
    V2 { group: PathBuf, nice: i32 },
    /// Replicas share the CPU with the server by their nice value alone.
    Unavailable { reason: String },
}

impl CpuSupport {
    /// Prepares the replicas' CPU group next to `memory`'s base, weighted by `nice`.
    pub fn detect(memory: &CgroupSupport, nice: i32) -> CpuSupport {
        let unavailable = |reason: String| CpuSupport::Unavailable { reason };
        match memory {
            CgroupSupport::V1 { .. } => {
                let read = |p: &str| fs::read_to_string(p).map_err(|e| format!("cannot read {p}: {e}"));
                read("/proc/self/cgroup")
                    .and_then(|cg| read("/proc/self/mountinfo").map(|mi| (cg, mi)))
                    .and_then(|(cg, mi)| locate_v1_cpu_cgroup(&cg, &mi))
                    .and_then(|own| prepare_v1_cpu_group(&own, nice_weight(nice)))
                    .map_or_else(unavailable, |(group, shares)| CpuSupport::V1 { group, shares })
            }
            CgroupSupport::V2 { base } => prepare_v2_cpu_group(base, nice).map_or_else(unavailable, |()| CpuSupport::V2 { group: base.clone(), nice }),
            CgroupSupport::Unavailable { .. } => unavailable("replicas have no cgroup".into()),
        }
    }

    /// The v1 group a replica's program joins, when there is one.
    pub fn v1_group(&self) -> Option<&Path> {
        match self {
            CpuSupport::V1 { group, .. } => Some(group),
            CpuSupport::V2 { .. } | CpuSupport::Unavailable { .. } => None,
        }
    }

    /// In words, for the server's description of itself and `doctor`.
    pub fn describe(&self) -> String {
        match self {
            CpuSupport::V1 { group, shares } => {
                format!("replicas share one CPU group weighted {shares} against the server's 1024 per thread, one equal share each inside it (cgroup v1 cpu.shares of {})", group.display())
            }
            CpuSupport::V2 { group, nice } => {
                format!("replicas share one CPU group weighted like one task at nice {nice} against the server, one equal share each inside it (cgroup v2 cpu.weight.nice of {})", group.display())
            }
            CpuSupport::Unavailable { reason } => format!("replicas' programs yield the CPU by their nice value only (no CPU group: {reason})"),
        }
    }
}

/// The name of a project's share of the replicas' CPU group (cgroup v1): `u<uid>` for a
/// replica of a per-project user, `server` for one of the server's own user. A project with
/// many replicas busy gets the same CPU as one with a single replica starting.
pub fn cpu_share_name(uid: Option<u32>) -> String {
    uid.map_or_else(|| "server".to_string(), |u| format!("u{u}"))
}

/// This process's cgroup directory in the v1 hierarchy of the cpu controller.
pub fn locate_v1_cpu_cgroup(proc_cgroup: &str, mountinfo: &str) -> Result<PathBuf, String> {
    locate_v1_cgroup("cpu", proc_cgroup, mountinfo)
}

/// Makes `<own>/trainyard` in the v1 cpu hierarchy with `cpu.shares`, read back (the kernel
/// bounds it to 2..).
fn prepare_v1_cpu_group(own: &Path, shares: u64) -> Result<(PathBuf, u64), String> {
    let group = own.join(BASE_DIR_NAME);
    match fs::create_dir(&group) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(format!("cannot create cgroup {}: {e}", group.display())),
    }
    let file = group.join("cpu.shares");
    write_file(&file, &shares.to_string()).map_err(|e| e.to_string())?;
    let set = read_file(&file).map_err(|e| e.to_string())?;
    let set = set.trim().parse::<u64>().map_err(|e| format!("{}: {e}", file.display()))?;
    Ok((group, set))
}

/// v2: the cpu controller for the replicas' base (`+cpu` in its parent's
/// `cgroup.subtree_control`, not below it: the replicas share the base's weight) and the
/// base's `cpu.weight.nice`.
fn prepare_v2_cpu_group(base: &Path, nice: i32) -> Result<(), String> {
    let own = base.parent().ok_or_else(|| format!("{} has no parent cgroup", base.display()))?;
    let ctl = own.join("cgroup.subtree_control");
    let current = read_file(&ctl).map_err(|e| e.to_string())?;
    if !current.split_whitespace().any(|c| c == "cpu") {
        write_file(&ctl, "+cpu").map_err(|e| e.to_string())?;
    }
    write_file(&base.join("cpu.weight.nice"), &nice.clamp(0, 19).to_string()).map_err(|e| e.to_string())?;
    // Below the base, each replica's cgroup is one unit with the default weight: replicas
    // share the group equally, whatever their numbers of processes.
    let below = base.join("cgroup.subtree_control");
    if !read_file(&below).map_err(|e| e.to_string())?.split_whitespace().any(|c| c == "cpu") {
        write_file(&below, "+cpu").map_err(|e| e.to_string())?;
    }
    Ok(())
}

fn kill_pids(pids: &[i32]) {
    for &pid in pids {
        if pid > 0 {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        }
    }
}

/// A cgroup directory's path relative to the root of its hierarchy (`/a/b` for
/// `/sys/fs/cgroup/memory/a/b`), from the mount table: what a container engine's
/// `--cgroup-parent` takes.
pub fn hierarchy_relative(path: &Path) -> Option<String> {
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").ok()?;
    let mount = mountinfo
        .lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let fstype = right.split_whitespace().next()?;
            if fstype != "cgroup" && fstype != "cgroup2" {
                return None;
            }
            Some(PathBuf::from(left.split_whitespace().nth(4)?))
        })
        .filter(|m| path.starts_with(m))
        .max_by_key(|m| m.as_os_str().len())?;
    let rel = path.strip_prefix(&mount).ok()?;
    Some(format!("/{}", rel.display()))
}

/// The value of `key` in a flat-keyed cgroup file (`key value` per line).
pub fn flat_keyed_value(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let mut it = line.split_whitespace();
        (it.next() == Some(key)).then(|| it.next()?.parse().ok()).flatten()
    })
}

/// Reads a cgroup file.
pub fn read_file(path: &Path) -> Result<String, FileError> {
    fs::read_to_string(path).at("read", path)
}

/// Writes a cgroup file. Like youki's `write_cgroup_file`, it never creates the file: a
/// missing file means the controller is missing, which must not pass silently.
pub fn write_file(path: &Path, data: &str) -> Result<(), FileError> {
    let mut f = OpenOptions::new().write(true).truncate(true).open(path).at("open cgroup file", path)?;
    f.write_all(data.as_bytes()).at("write cgroup file", path)
}

/// The pids in a `cgroup.procs` file.
pub fn read_pids(path: &Path) -> Result<Vec<i32>, FileError> {
    Ok(read_file(path)?.lines().filter_map(|l| l.trim().parse().ok()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(dir: &Path, files: &[(&str, &str)]) {
        fs::create_dir_all(dir).unwrap();
        for (name, content) in files {
            fs::write(dir.join(name), content).unwrap();
        }
    }

    #[test]
    fn v1_create_sets_limit_and_memsw() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("j1-a0-workerpool0-0-r0");
        fixture(
            &dir,
            &[
                ("memory.limit_in_bytes", "9223372036854771712\n"),
                ("memory.memsw.limit_in_bytes", "9223372036854771712\n"),
                ("memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n"),
                ("cgroup.procs", ""),
            ],
        );
        let cg = ReplicaCgroup::create(CgroupVersion::V1, tmp.path(), "j1-a0-workerpool0-0-r0", Some(100_000_000)).unwrap();
        assert_eq!(fs::read_to_string(dir.join("memory.limit_in_bytes")).unwrap(), "100000000");
        assert_eq!(fs::read_to_string(dir.join("memory.memsw.limit_in_bytes")).unwrap(), "100000000");
        assert_eq!(cg.oom_kills(), Some(2));
        assert_eq!(cg.procs_file(), dir.join("cgroup.procs"));
        cg.kill_all().unwrap(); // empty procs: returns at once
    }

    #[test]
    fn v1_without_memsw_file_sets_only_the_limit() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("r");
        fixture(&dir, &[("memory.limit_in_bytes", "0"), ("memory.oom_control", "oom_kill_disable 0\nunder_oom 0\n")]);
        let cg = ReplicaCgroup::create(CgroupVersion::V1, tmp.path(), "r", Some(5)).unwrap();
        assert_eq!(fs::read_to_string(dir.join("memory.limit_in_bytes")).unwrap(), "5");
        assert!(!dir.join("memory.memsw.limit_in_bytes").exists());
        // An old kernel without the oom_kill line: unknown, not zero.
        assert_eq!(cg.oom_kills(), None);
    }

    #[test]
    fn v2_create_sets_max_and_swap_and_reads_oom_kill() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("r");
        fixture(
            &dir,
            &[
                ("memory.max", "max\n"),
                ("memory.swap.max", "max\n"),
                ("memory.events", "low 0\nhigh 0\nmax 7\noom 1\noom_kill 1\noom_group_kill 0\n"),
                ("cgroup.procs", ""),
            ],
        );
        let cg = ReplicaCgroup::create(CgroupVersion::V2, tmp.path(), "r", Some(104_857_600)).unwrap();
        assert_eq!(fs::read_to_string(dir.join("memory.max")).unwrap(), "104857600");
        assert_eq!(fs::read_to_string(dir.join("memory.swap.max")).unwrap(), "0");
        assert_eq!(cg.oom_kills(), Some(1));
    }

    /// A child joins its cgroup through v1's `tasks` (one thread: no global lock), and
    /// through `cgroup.procs` on v2.
    #[test]
    fn children_join_v1_through_tasks_and_v2_through_procs() {
        let v1 = ReplicaCgroup::open(CgroupVersion::V1, PathBuf::from("/cg/memory/x/trainyard/r"));
        assert_eq!(v1.thread_attach_file(), Some(PathBuf::from("/cg/memory/x/trainyard/r/tasks")));
        assert_eq!(v1.procs_file(), PathBuf::from("/cg/memory/x/trainyard/r/cgroup.procs"));
        let v2 = ReplicaCgroup::open(CgroupVersion::V2, PathBuf::from("/cg/x/trainyard/r"));
        assert_eq!(v2.thread_attach_file(), None);
    }

    #[test]
    fn v2_kill_all_writes_cgroup_kill() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("r");
        fixture(&dir, &[("cgroup.kill", ""), ("cgroup.procs", "")]);
        let cg = ReplicaCgroup::open(CgroupVersion::V2, dir.clone());
        cg.kill_all().unwrap();
        assert_eq!(fs::read_to_string(dir.join("cgroup.kill")).unwrap(), "1");
    }

    #[test]
    fn missing_limit_file_is_an_error_naming_the_file_and_removes_the_dir() {
        let tmp = tempfile::tempdir().unwrap();
        let err = ReplicaCgroup::create(CgroupVersion::V2, tmp.path(), "r", Some(1)).unwrap_err();
        assert!(err.to_string().contains("memory.max"), "{err}");
        assert!(!tmp.path().join("r").exists());
    }

    #[test]
    fn an_existing_cgroup_with_processes_is_not_taken_over() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("r");
        fixture(&dir, &[("memory.max", "max\n"), ("cgroup.procs", "4242\n")]);
        let err = ReplicaCgroup::create(CgroupVersion::V2, tmp.path(), "r", Some(1)).unwrap_err();
        assert!(matches!(err, CgroupError::InUse { processes: 1, .. }), "{err}");
        assert_eq!(fs::read_to_string(dir.join("memory.max")).unwrap(), "max\n");
    }

    #[test]
    fn names_with_slashes_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        assert!(matches!(
            ReplicaCgroup::create(CgroupVersion::V1, tmp.path(), "../x", None),
            Err(CgroupError::InvalidName(_))
        ));
    }

    #[test]
    fn remove_tolerates_a_missing_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("r");
        fs::create_dir(&dir).unwrap();
        let cg = ReplicaCgroup::open(CgroupVersion::V1, dir.clone());
        cg.remove().unwrap();
        cg.remove().unwrap();
        assert!(!dir.exists());
    }

    #[test]
    fn read_pids_parses_procs() {
        let tmp = tempfile::tempdir().unwrap();
        fs::write(tmp.path().join("cgroup.procs"), "12\n345\n\n").unwrap();
        assert_eq!(read_pids(&tmp.path().join("cgroup.procs")).unwrap(), vec![12, 345]);
    }

    const HYBRID_CGROUP: &str = "9:name=systemd:/\n4:memory:/process_api/e7a3\n1:cpu:/\n0::/\n";
    const HYBRID_MOUNTINFO: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    #[test]
    fn locate_hybrid_prefers_v1_memory() {
        let (v, p) = locate_memory_cgroup(HYBRID_CGROUP, HYBRID_MOUNTINFO).unwrap();
        assert_eq!(v, CgroupVersion::V1);
        assert_eq!(p, PathBuf::from("/sys/fs/cgroup/memory/process_api/e7a3"));
    }

    #[test]
    fn locate_pure_v2() {
        let cg = "0::/user.slice/user-1000.slice/session-2.scope\n";
        let mi = "29 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot\n";
        let (v, p) = locate_memory_cgroup(cg, mi).unwrap();
        assert_eq!(v, CgroupVersion::V2);
        assert_eq!(p, PathBuf::from("/sys/fs/cgroup/user.slice/user-1000.slice/session-2.scope"));
    }

    #[test]
    fn locate_v1_with_mount_root_below_hierarchy_root() {
        // A container whose memory hierarchy is bind-mounted from /docker/abc.
        let cg = "5:memory:/docker/abc/inner\n0::/\n";
        let mi = "40 31 0:32 /docker/abc /sys/fs/cgroup/memory ro,nosuid - cgroup cgroup rw,memory\n";
        let (_, p) = locate_memory_cgroup(cg, mi).unwrap();
        assert_eq!(p, PathBuf::from("/sys/fs/cgroup/memory/inner"));
        let cg_outside = "5:memory:/elsewhere\n";
        assert!(locate_memory_cgroup(cg_outside, mi).unwrap_err().contains("not below"));
    }

    #[test]
    fn locate_without_any_memory_hierarchy_says_why() {
        let err = locate_memory_cgroup("1:cpu:/\n", "").unwrap_err();
        assert!(err.contains("no memory cgroup"), "{err}");
    }

    /// This host's kind: v1 hierarchies with pids among them; the server's memory cgroup
    /// is a sub-cgroup, its pids cgroup the root.
    const HYBRID_WITH_PIDS_CGROUP: &str = "9:name=systemd:/\n8:pids:/\n4:memory:/process_api/e7a3\n1:cpu:/\n0::/\n";
    const HYBRID_WITH_PIDS_MOUNTINFO: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
38 31 0:35 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    #[test]
    fn locate_v1_pids_on_a_hybrid_host() {
        let p = locate_v1_pids_cgroup(HYBRID_WITH_PIDS_CGROUP, HYBRID_WITH_PIDS_MOUNTINFO).unwrap();
        assert_eq!(p, PathBuf::from("/sys/fs/cgroup/pids"));
        // The memory cgroup is found as before.
        let (v, m) = locate_memory_cgroup(HYBRID_WITH_PIDS_CGROUP, HYBRID_WITH_PIDS_MOUNTINFO).unwrap();
        assert_eq!((v, m), (CgroupVersion::V1, PathBuf::from("/sys/fs/cgroup/memory/process_api/e7a3")));
    }

    #[test]
    fn locate_v1_pids_in_a_sub_cgroup_and_below_a_mount_root() {
        // A systemd service: its own pids cgroup, co-mounted with nothing else.
        let cg = "7:pids:/system.slice/trainyard.service\n4:memory:/system.slice/trainyard.service\n";
        let mi = "38 31 0:35 / /sys/fs/cgroup/pids rw,nosuid - cgroup cgroup rw,pids\n";
        assert_eq!(
            locate_v1_pids_cgroup(cg, mi).unwrap(),
            PathBuf::from("/sys/fs/cgroup/pids/system.slice/trainyard.service")
        );
        // A container whose pids hierarchy is bind-mounted from /docker/abc, the
        // controller listed together with another one.
        let cg = "5:cpu,pids:/docker/abc/inner\n";
        let mi = "40 31 0:32 /docker/abc /sys/fs/cgroup/cpu,pids ro,nosuid - cgroup cgroup rw,cpu,pids\n";
        assert_eq!(locate_v1_pids_cgroup(cg, mi).unwrap(), PathBuf::from("/sys/fs/cgroup/cpu,pids/inner"));
    }

    #[test]
    fn locate_v1_pids_says_why_there_is_none() {
        // Hybrid without the pids controller (the HYBRID_* host above).
        let err = locate_v1_pids_cgroup(HYBRID_CGROUP, HYBRID_MOUNTINFO).unwrap_err();
        assert!(err.contains("no cgroup v1 pids controller"), "{err}");
        // Listed, but not mounted where this process can see it.
        let err = locate_v1_pids_cgroup(HYBRID_WITH_PIDS_CGROUP, HYBRID_MOUNTINFO).unwrap_err();
        assert!(err.contains("no cgroup v1 pids mount"), "{err}");
        // Pure v2: the pids controller is in the unified hierarchy, not a v1 one.
        let mi = "29 23 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        assert!(locate_v1_pids_cgroup("0::/a\n", mi).is_err());
    }

    #[test]
    fn a_v1_cgroup_counts_the_cpu_of_its_processes() {
        let tmp = tempfile::tempdir().unwrap();
        fixture(tmp.path(), &[("cgroup.procs", &format!("{}\n", std::process::id()))]);
        let cg = ReplicaCgroup::open(CgroupVersion::V1, tmp.path().to_path_buf());
        let until = std::time::Instant::now() + Duration::from_millis(200);
        let mut x = 0u64;
        while std::time::Instant::now() < until {
            x = x.wrapping_add(std::hint::black_box(1));
        }
        assert!(cg.cpu_seconds().is_some_and(|s| s > 0.0), "{x}");
        fs::write(tmp.path().join("cgroup.procs"), "").unwrap();
        assert_eq!(cg.cpu_seconds(), None);
    }

    #[test]
    fn the_replicas_cpu_group_weighs_one_task_at_their_nice_value() {
        assert_eq!((nice_weight(0), nice_weight(10), nice_weight(19)), (1024, 110, 15));
        assert_eq!((nice_weight(-5), nice_weight(40)), (1024, 15), "never above the server, never below the kernel's least");
        // Co-mounted with cpuacct, as most v1 hosts have it.
        let cg = "3:cpu,cpuacct:/system.slice/trainyard.service\n4:memory:/system.slice/trainyard.service\n";
        let mi = "36 31 0:31 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid - cgroup cgroup rw,cpu,cpuacct\n";
        assert_eq!(locate_v1_cpu_cgroup(cg, mi).unwrap(), PathBuf::from("/sys/fs/cgroup/cpu,cpuacct/system.slice/trainyard.service"));
        assert_eq!(locate_v1_cpu_cgroup(HYBRID_CGROUP, HYBRID_MOUNTINFO).unwrap(), PathBuf::from("/sys/fs/cgroup/cpu"));
        let err = locate_v1_cpu_cgroup("4:memory:/a\n0::/\n", HYBRID_MOUNTINFO).unwrap_err();
        assert!(err.contains("no cgroup v1 cpu controller"), "{err}");
        let tmp = tempfile::tempdir().unwrap();
        fixture(&tmp.path().join(BASE_DIR_NAME), &[("cpu.shares", "1024\n")]);
        let (group, shares) = prepare_v1_cpu_group(tmp.path(), nice_weight(10)).unwrap();
        assert_eq!((group.clone(), shares), (tmp.path().join(BASE_DIR_NAME), 110));
        assert_eq!(fs::read_to_string(group.join("cpu.shares")).unwrap(), "110");
        // v2: the cpu controller is enabled in the base's parent, the base gets the nice value.
        let tmp = tempfile::tempdir().unwrap();
        let base = tmp.path().join(BASE_DIR_NAME);
        fixture(tmp.path(), &[("cgroup.subtree_control", "memory pids\n")]);
        fixture(&base, &[("cpu.weight.nice", "0\n"), ("cgroup.subtree_control", "memory\n")]);
        prepare_v2_cpu_group(&base, 10).unwrap();
        assert_eq!(fs::read_to_string(tmp.path().join("cgroup.subtree_control")).unwrap(), "+cpu");
        assert_eq!(fs::read_to_string(base.join("cgroup.subtree_control")).unwrap(), "+cpu");
        assert_eq!(fs::read_to_string(base.join("cpu.weight.nice")).unwrap(), "10");
    }

    #[test]
    fn pids_cgroup_create_writes_pids_max_and_remove_removes_it() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("j1-a0-workerpool0-0-r0-00000000");
        fixture(&dir, &[("pids.max", "max\n"), ("cgroup.procs", ""), ("tasks", "")]);
        let cg = V1Cgroup::pids(tmp.path(), "j1-a0-workerpool0-0-r0-00000000", 20).unwrap();
        assert_eq!(fs::read_to_string(dir.join("pids.max")).unwrap(), "20");
        assert_eq!(cg.path(), dir);
        assert_eq!(cg.tasks_file(), dir.join("tasks"));
        assert_eq!(cg.procs_file(), dir.join("cgroup.procs"));
        // A temporary directory is no cgroup: its files must go before rmdir can work.
        for f in ["pids.max", "cgroup.procs", "tasks"] {
            fs::remove_file(dir.join(f)).unwrap();
        }
        cg.remove().unwrap();
        assert!(!dir.exists());
        // Twice: already gone is fine.
        cg.remove().unwrap();
    }

    #[test]
    fn a_busy_pids_cgroup_is_not_taken_over() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("r");
        fixture(&dir, &[("pids.max", "max\n"), ("cgroup.procs", "4242\n")]);
        let err = V1Cgroup::pids(tmp.path(), "r", 20).unwrap_err();
        assert!(matches!(err, CgroupError::InUse { processes: 1, .. }), "{err}");
        assert_eq!(fs::read_to_string(dir.join("pids.max")).unwrap(), "max\n");
    }

    #[test]
    fn a_pids_cgroup_without_pids_max_is_an_error_and_is_removed() {
        let tmp = tempfile::tempdir().unwrap();
        let err = V1Cgroup::pids(tmp.path(), "r", 20).unwrap_err();
        assert!(err.to_string().contains("pids.max"), "{err}");
        assert!(!tmp.path().join("r").exists());
        assert!(matches!(V1Cgroup::pids(tmp.path(), "..", 20), Err(CgroupError::InvalidName(_))));
    }

    /// A v2 host's pids support is read from the base's `cgroup.subtree_control`.
    #[test]
    fn v2_pids_support_follows_subtree_control() {
        let tmp = tempfile::tempdir().unwrap();
        let base = tmp.path().to_path_buf();
        fixture(&base, &[("cgroup.subtree_control", "cpu memory pids\n")]);
        assert_eq!(PidsSupport::detect(&CgroupSupport::V2 { base: base.clone() }), PidsSupport::V2);
        fs::write(base.join("cgroup.subtree_control"), "memory\n").unwrap();
        let s = PidsSupport::detect(&CgroupSupport::V2 { base: base.clone() });
        assert!(matches!(&s, PidsSupport::Unavailable { reason } if reason.contains("not enabled")), "{s:?}");
        let s = PidsSupport::detect(&CgroupSupport::Unavailable { reason: "x".into() });
        assert!(matches!(s, PidsSupport::Unavailable { .. }));
        assert_eq!(s.v1_base(), None);
    }

    #[test]
    fn mountinfo_octal_escapes() {
        assert_eq!(unescape_mountinfo(r"/a\040b"), "/a b");
        assert_eq!(unescape_mountinfo("a\\134b"), "a\\b");
        assert_eq!(unescape_mountinfo("trailing\\04"), "trailing\\04");
    }

    /// A supervisor in an engine's cgroup (a Slurm step) sees the OOM kills of its own
    /// cgroup and of the parent's limit that happen after it started, not earlier ones.
    #[test]
    fn engine_cgroup_oom_counts_kills_after_start() {
        let dir = tempfile::tempdir().unwrap();
        let step = dir.path().join("job_5").join("step_0");
        let task = step.join("task_0");
        std::fs::create_dir_all(&task).unwrap();
        let write = |d: &Path, n: u64| std::fs::write(d.join("memory.oom_control"), format!("oom_kill_disable 0\nunder_oom 0\noom_kill {n}\n")).unwrap();
        write(&task, 0);
        write(&step, 2);
        let oom = EngineCgroupOom::at(CgroupVersion::V1, &task).expect("counters");
        assert_eq!(oom.kills_since_start(), Some(0), "the step's 2 earlier kills are not this run's");
        write(&step, 3);
        assert_eq!(oom.kills_since_start(), Some(1), "a kill at the step's limit");
        write(&task, 1);
        assert_eq!(oom.kills_since_start(), Some(1));
        let none = dir.path().join("elsewhere");
        std::fs::create_dir_all(&none).unwrap();
        assert!(EngineCgroupOom::at(CgroupVersion::V1, &none).is_none(), "no counters: unknown");
    }
}
