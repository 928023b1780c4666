//! Replicas in their images: the container engine (podman, with conmon and runc) behind
//! the shim. The shim supervises `podman run` as it supervises a host program: the
//! client's stdout and stderr are the container's (attached, not a log driver's copy),
//! a stop is `podman stop` (the image's stop signal to the container's init, SIGKILL
//! after the grace period), and when the client ends the container is removed, so that
//! nothing of the replica outlives it (L20).
//!
//! What the managed service does, and this module does the same:
//! - `containerSpec.command` replaces the image's ENTRYPOINT, `args` its CMD; absent,
//!   the image's own; the image's WORKDIR;
//! - host networking, so each replica keeps its own address and port (CLUSTER_SPEC);
//! - the project's buckets at `/gcs/<bucket>` (`gs://<bucket>/<path>` is
//!   `/gcs/<bucket>/<path>`), and nothing else of the host's storage;
//! - an init as PID 1 (`--init`, catatonit), so that a program without a SIGTERM handler
//!   is still stopped gracefully.
//!
//! Facts of the engine this relies on (podman 4.3, conmon 2.1):
//! - conmon writes its OOM marker, a file named `oom`, into its working directory, which
//!   is the client's (conmon issue 504): the client runs in `<run_dir>/engine`, and the
//!   marker there is the engine's own account of an OOM kill (L14), not a guess from 137;
//! - `--cgroup-parent` puts the container's and conmon's cgroups below the replica's
//!   cgroup, so a kill of the replica's cgroup reaches the container too (L20);
//! - `podman run` exits 125 when the engine failed before the container ran (the image is
//!   not known, a pull failed), with the engine's message as the last line of stderr;
//! - with `--init`, a command that cannot be executed makes catatonit print
//!   `failed to exec pid1` and exit 1.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde::{Deserialize, Serialize};

/// The directory of the run in which the engine client (and so conmon) runs.
pub const ENGINE_DIR: &str = "engine";
/// The environment file of the container, in the run directory (mode 0600).
pub const ENV_FILE: &str = "container.env";
/// Label carried by every container Trainyard starts: the run directory.
pub const RUN_DIR_LABEL: &str = "trainyard.run_dir";

/// When to pull an image that is not on the host.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Pull {
    /// Never: an image that is not on the host is the user's error (StartError).
    Never,
    /// When it is missing.
    #[default]
    Missing,
}

impl Pull {
    pub fn as_str(self) -> &'static str {
        match self {
            Pull::Never => "never",
            Pull::Missing => "missing",
        }
    }
}

/// How to reach the engine: its program, global options and environment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Engine {
    /// `podman`, looked up in `env`'s PATH, or a path.
    pub program: PathBuf,
    /// Options before the subcommand (`--runtime runc`).
    #[serde(default)]
    pub global_args: Vec<String>,
    /// The engine client's complete environment (PATH, HOME, CONTAINERS_CONF).
    #[serde(default)]
    pub env: Vec<(String, String)>,
    #[serde(default)]
    pub pull: Pull,
    /// How long a pull may go on failing (a registry that cannot be reached) before the
    /// run fails with a StartError (`[containers] pull_timeout_secs`).
    #[serde(default = "default_pull_timeout_secs")]
    pub pull_timeout_secs: u64,
    /// As `pull_timeout_secs`, for a registry that cannot be reached at all (see
    /// [`registry_unreachable`]); the smaller of the two applies then.
    #[serde(default = "default_offline_pull_timeout_secs")]
    pub offline_pull_timeout_secs: u64,
}

/// `[containers] pull_timeout_secs` when not set: ten minutes.
pub const DEFAULT_PULL_TIMEOUT_SECS: u64 = 600;

fn default_pull_timeout_secs() -> u64 {
    DEFAULT_PULL_TIMEOUT_SECS
}

/// `[containers] offline_pull_timeout_secs` when not set: a minute.
pub const DEFAULT_OFFLINE_PULL_TIMEOUT_SECS: u64 = 60;

fn default_offline_pull_timeout_secs() -> u64 {
    DEFAULT_OFFLINE_PULL_TIMEOUT_SECS
}

/// What a user can do about an image that is not on the host and cannot be pulled.
pub const IMAGE_FIXES: &str = "load it with `podman load -i IMAGE.tar`, build the stand-in images with \
                               `scripts/images/build.sh`, or run replicas as host processes with [containers] engine = \"none\"";

impl Engine {
    /// A command for `podman <global args> <args>`, in the engine's environment.
    pub fn command<I, S>(&self, args: I) -> Command
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        let mut cmd = Command::new(&self.program);
        cmd.env_clear().envs(self.env.iter().map(|(k, v)| (k, v))).args(&self.global_args).args(args);
        cmd
    }

    /// Runs `podman <args>` to its end, with stdin closed; the trimmed stdout, or the
    /// engine's message.
    pub fn output<I, S>(&self, args: I) -> Result<String, String>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        let mut cmd = self.command(args);
        let out = cmd
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("cannot run {}: {e}", self.program.display()))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
        } else {
            let err = String::from_utf8_lossy(&out.stderr);
            Err(last_error_line(&err).unwrap_or_else(|| format!("{} exited with {}", self.program.display(), out.status)))
        }
    }

    /// `podman image exists IMAGE`.
    pub fn image_exists(&self, image: &str) -> Result<bool, String> {
        let status = self
            .command(["image", "exists", image])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map_err(|e| format!("cannot run {}: {e}", self.program.display()))?;
        Ok(status.success())
    }

    /// `podman pull IMAGE`, ended after `bound`: `Err((message, the user's))`: `true` when
    /// the registry said the image does not exist or may not be had, or the reference can
    /// never resolve (a StartError), `false` when the registry could not be reached or the
    /// pull took too long (tried again until `pull_timeout_secs`).
    pub fn pull(&self, image: &str, bound: std::time::Duration) -> Result<(), (String, bool)> {
        let deadline = std::time::Instant::now() + bound;
        let ran = crate::bounded::run_until(self.command(["pull", "--quiet", image]).stdin(Stdio::null()), deadline)
            .map_err(|e| (format!("cannot run {} pull: {e}", self.program.display()), false))?;
        match ran.status {
            Some(s) if s.success() => Ok(()),
            Some(s) => {
                let message =
                    last_error_line(&ran.stderr).unwrap_or_else(|| format!("{} pull exited with {s}", self.program.display()));
                let users = pull_refused(&message);
                Err((message, users))
            }
            None => Err((format!("`{} pull {image}` did not finish within {}s", self.program.display(), bound.as_secs()), false)),
        }
    }

    /// Removes the container, killing whatever runs in it (`podman rm -f -t 0`); a
    /// container that does not exist is fine.
    pub fn remove(&self, name: &str) -> Result<(), String> {
        self.output(["rm", "--force", "--time", "0", "--ignore", name]).map(|_| ())
    }
}

/// A bind mount into the container.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mount {
    pub source: PathBuf,
    pub target: String,
    #[serde(default)]
    pub read_only: bool,
}

/// What runs in the container: written into the shim's spec.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerSpec {
    pub engine: Engine,
    pub image: String,
    /// The container's name: unique on the host for this run.
    pub name: String,
    /// Replaces the image's ENTRYPOINT when set.
    #[serde(default)]
    pub entrypoint: Option<Vec<String>>,
    /// Replace the image's CMD when `entrypoint` is set or when not empty.
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub mounts: Vec<Mount>,
    /// `uid:gid` inside the container; `None`: the image's user.
    #[serde(default)]
    pub user: Option<String>,
    #[serde(default)]
    pub memory_limit_bytes: Option<u64>,
    #[serde(default)]
    pub pids_max: Option<u64>,
    /// `RLIMIT_NOFILE` soft and hard, for `--ulimit` (the engine's defaults may be more
    /// than the host lets root set).
    #[serde(default)]
    pub nofile: Option<(u64, u64)>,
    /// Devices passed through (`--device`), e.g. GPUs.
    #[serde(default)]
    pub devices: Vec<String>,
    /// The working directory; `None`: the image's WORKDIR.
    #[serde(default)]
    pub workdir: Option<String>,
    /// The job's network namespace (see [`crate::netns`]) instead of the host's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netns: Option<PathBuf>,
    /// Names the container resolves to these addresses (`--add-host`): the managed
    /// service's host names, which lead to this server.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub add_hosts: Vec<(String, String)>,
}

/// The replica's container name: `trainyard-<job>-<attempt>-<replica>-<restart>-<hash of
/// the run directory>`, unique on the host (two servers' job 1 differ by data directory)
/// and a valid name (`[a-zA-Z0-9][a-zA-Z0-9_.-]*`).
pub fn container_name(job: u64, attempt: u32, replica: &str, restart: u32, run_dir: &Path) -> String {
    let clean: String = replica.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' }).collect();
    format!("trainyard-{job}-{attempt}-{clean}-{restart}-{:08x}", fnv1a(run_dir.as_os_str().as_encoded_bytes()) as u32)
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ *b as u64).wrapping_mul(0x0100_0000_01b3))
}

/// The container's environment as an env file (`NAME=value` a line), and what cannot be
/// written so (a value with a newline), to pass as `--env` arguments.
pub fn env_file(env: &[(String, String)]) -> (String, Vec<String>) {
    let mut file = String::new();
    let mut args = Vec::new();
    // One entry per name, the last value wins (as for a host program).
    let mut seen = std::collections::BTreeMap::new();
    for (k, v) in env {
        seen.insert(k.as_str(), v.as_str());
    }
    for (k, v) in seen {
        if v.contains('\n') || v.contains('\r') {
            args.push(format!("--env={k}={v}"));
        } else {
            file.push_str(k);
            file.push('=');
            file.push_str(v);
            file.push('\n');
        }
    }
    (file, args)
}

/// The `podman run` arguments (after the engine's global options) for the replica.
/// `env_file` holds the environment, `extra_env` what could not go there.
pub fn run_args(c: &ContainerSpec, cgroup_parent: Option<&str>, env_file: &Path, extra_env: &[String], run_dir: &Path) -> Vec<OsString> {
    let mut a: Vec<OsString> = Vec::new();
    let mut push = |s: String| a.push(OsString::from(s));
    push("run".into());
    push(format!("--name={}", c.name));
    push(format!("--label={RUN_DIR_LABEL}={}", run_dir.display()));
    push(format!("--pull={}", c.engine.pull.as_str()));
    // Each replica keeps its own loopback address and port, as host processes do: in the
    // host's network, or in its job's namespace (shared by the job's replicas only).
    match &c.netns {
        Some(ns) => push(format!("--network=ns:{}", ns.display())),
        None => push("--network=host".into()),
    }
    for (name, addr) in &c.add_hosts {
        push(format!("--add-host={name}:{addr}"));
    }
    // PID 1 forwards signals and reaps: a program without a SIGTERM handler still stops.
    push("--init".into());
    // The output is attached (the shim logs it); no second copy in the engine's store.
    push("--log-driver=none".into());
    push("--security-opt=no-new-privileges".into());
    if let Some(user) = &c.user {
        push(format!("--user={user}"));
        // An unprivileged user has no use for capabilities; drop them from the bounding
        // set too.
        push("--cap-drop=all".into());
    }
    if let Some(parent) = cgroup_parent {
        push(format!("--cgroup-parent={parent}"));
    }
    if let Some(m) = c.memory_limit_bytes {
        // L14: the machine type's memory, swap included (no swap beyond it).
        push(format!("--memory={m}"));
        push(format!("--memory-swap={m}"));
    }
    if let Some(p) = c.pids_max {
        push(format!("--pids-limit={p}"));
        push(format!("--ulimit=nproc={p}:{p}"));
    }
    if let Some((soft, hard)) = c.nofile {
        push(format!("--ulimit=nofile={soft}:{hard}"));
    }
    if let Some(w) = &c.workdir {
        push(format!("--workdir={w}"));
    }
    for d in &c.devices {
        push(format!("--device={d}"));
    }
    for m in &c.mounts {
        let ro = if m.read_only { ",ro" } else { "" };
        push(format!("--mount=type=bind,source={},destination={}{ro}", m.source.display(), m.target));
    }
    a.push(OsString::from("--env-file"));
    a.push(env_file.as_os_str().to_owned());
    a.extend(extra_env.iter().map(OsString::from));
    if let Some(ep) = &c.entrypoint {
        // JSON array form: no shell splitting of the command.
        a.push(OsString::from(format!("--entrypoint={}", serde_json::to_string(ep).unwrap_or_else(|_| "[]".into()))));
    }
    // The image reference ends the options; what follows is CMD.
    a.push(OsString::from("--"));
    a.push(OsString::from(&c.image));
    a.extend(c.args.iter().map(OsString::from));
    a
}

/// The last `Error: ...` line of the engine's stderr, without the prefix.
pub fn last_error_line(stderr: &str) -> Option<String> {
    stderr.lines().rev().find_map(|l| l.trim().strip_prefix("Error: ").map(str::to_string))
}

/// A pull the registry refused (no such image, no access): the user's. Anything else (a
/// registry that cannot be reached, a timeout) is not.
/// Does a failed pull's message say the registry could not be reached at all (no
/// network, a name that does not resolve, nothing listening), rather than a slow or
/// interrupted transfer? Such a pull is given up after `offline_pull_timeout_secs`.
pub fn registry_unreachable(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    [
        "no such host",
        "temporary failure in name resolution",
        "network is unreachable",
        "no route to host",
        "connection refused",
        "server misbehaving",
        "dial tcp",
    ]
    .iter()
    .any(|s| m.contains(s))
}

pub fn pull_refused(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    [
        "manifest unknown",
        "not found",
        "unauthorized",
        "denied",
        "name unknown",
        "invalid reference format",
        // A short name with no alias and no search registry, a name the engine rejects:
        // no later try can resolve them.
        "did not resolve to an alias",
        "invalid image name",
    ]
        .iter()
        .any(|s| m.contains(s))
}

/// How the engine failed a run, from its exit status and the tail of stderr.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Failure {
    /// The user's (StartError): the image is not on the host and pulls are off, the
    /// registry has no such image, or the command cannot be executed.
    Start(String),
    /// Not the user's (L16): the engine failed, a registry could not be reached.
    Launch(String),
}

/// Classifies a `podman run` that ended with `code` and whose stderr ended with `tail`,
/// when the container `existed` afterwards (or not): `None` when it is the program's own
/// exit status.
pub fn classify(c: &ContainerSpec, code: i32, existed: bool, tail: &[String]) -> Option<Failure> {
    let engine_error = tail.iter().rev().find_map(|l| last_error_line(l));
    if code == 125 && !existed {
        let message = engine_error.unwrap_or_else(|| "the container engine failed before the container was created".into());
        return Some(if message.contains("image not known") || message.contains("no such image") {
            Failure::Start(format!(
                "the image {:?} is not on this host and Trainyard does not pull it ([containers] pull = \"{}\"): load it with \
                 `podman load -i IMAGE.tar` or `podman pull {}` on the host, or set pull = \"missing\" ({message})",
                c.image,
                c.engine.pull.as_str(),
                c.image
            ))
        } else if message.contains("pull")
            || message.contains("initializing source")
            || message.contains("registry")
            || pull_refused(&message)
        {
            if pull_refused(&message) {
                Failure::Start(format!("the image {:?} cannot be pulled: {message}", c.image))
            } else {
                Failure::Launch(format!("the image {:?} could not be pulled: {message}", c.image))
            }
        } else {
            Failure::Launch(format!("the container engine failed: {message}"))
        });
    }
    // catatonit (--init) could not execute the command.
    if code == 1 {
        if let Some(line) = tail.iter().rev().find(|l| l.contains("catatonit") && l.contains("failed to exec pid1")) {
            let why = line.rsplit("failed to exec pid1:").next().unwrap_or("").trim();
            let what = c.entrypoint.as_ref().and_then(|e| e.first()).or(c.args.first());
            let what = what.map(|w| format!(" {w:?}")).unwrap_or_else(|| " the image's entrypoint".into());
            return Some(Failure::Start(format!("cannot start{what} in the image {:?}: {why}", c.image)));
        }
    }
    if (code == 126 || code == 127 || code == 125) && existed {
        if let Some(message) = engine_error.filter(|m| m.contains("OCI runtime") || m.contains("executable file")) {
            return Some(Failure::Start(format!("cannot start the container of the image {:?}: {message}", c.image)));
        }
    }
    None
}

/// The engine's answer at start: what it is, for the server's start line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineInfo {
    pub version: String,
    pub runtime: String,
    pub cgroups: String,
}

/// `podman info`: the engine works, and how.
pub fn probe(engine: &Engine) -> Result<EngineInfo, String> {
    let out = engine.output(["info", "--format", "{{.Version.Version}}|{{.Host.OCIRuntime.Name}}|{{.Host.CgroupsVersion}}"])?;
    let mut parts = out.split('|');
    let mut next = || parts.next().unwrap_or("").trim().to_string();
    Ok(EngineInfo { version: next(), runtime: next(), cgroups: next() })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An offline registry is told from a slow or refused pull.
    #[test]
    fn an_unreachable_registry_is_told_from_other_pull_failures() {
        for offline in [
            "pinging container registry registry-1.docker.io: dial tcp: lookup registry-1.docker.io: no such host",
            "Get \"https://quay.io/v2/\": dial tcp 1.2.3.4:443: connect: network is unreachable",
            "lookup ghcr.io on 127.0.0.53:53: server misbehaving",
        ] {
            assert!(registry_unreachable(offline), "{offline}");
        }
        for other in ["reading manifest latest in docker.io/library/nosuch: manifest unknown", "unexpected EOF", "context deadline exceeded"] {
            assert!(!registry_unreachable(other), "{other}");
        }
    }

    fn spec() -> ContainerSpec {
        ContainerSpec {
            engine: Engine {
                program: "podman".into(),
                global_args: vec![],
                env: vec![],
                pull: Pull::Never,
                pull_timeout_secs: DEFAULT_PULL_TIMEOUT_SECS,
                offline_pull_timeout_secs: DEFAULT_OFFLINE_PULL_TIMEOUT_SECS,
            },
            image: "localhost/img:1".into(),
            name: "trainyard-1-0-workerpool0-0-0-00000000".into(),
            entrypoint: Some(vec!["python3".into(), "-c".into(), "print(1)".into()]),
            args: vec!["--epochs".into(), "2".into()],
            mounts: vec![Mount { source: "/srv/p".into(), target: "/gcs".into(), read_only: false }],
            user: Some("200001:200001".into()),
            memory_limit_bytes: Some(1 << 30),
            pids_max: Some(4096),
            nofile: Some((1024, 4096)),
            devices: vec![],
            workdir: None,
            netns: None,
            add_hosts: Vec::new(),
        }
    }

    #[test]
    fn command_replaces_the_entrypoint_and_args_the_cmd_after_the_image() {
        let a: Vec<String> = run_args(&spec(), Some("/x/trainyard/r"), Path::new("/run/container.env"), &[], Path::new("/run"))
            .into_iter()
            .map(|s| s.into_string().unwrap())
            .collect();
        let image = a.iter().position(|s| s == "localhost/img:1").unwrap();
        assert_eq!(a[image - 1], "--");
        assert_eq!(&a[image + 1..], ["--epochs", "2"]);
        assert!(a.contains(&r#"--entrypoint=["python3","-c","print(1)"]"#.to_string()));
        for want in ["--network=host", "--init", "--pull=never", "--user=200001:200001", "--cap-drop=all", "--cgroup-parent=/x/trainyard/r"] {
            assert!(a.contains(&want.to_string()), "{want} in {a:?}");
        }
        assert!(a.contains(&format!("--memory={}", 1u64 << 30)));
        assert!(a.contains(&"--mount=type=bind,source=/srv/p,destination=/gcs".to_string()));
        // Without a command the image's ENTRYPOINT stays.
        let mut s = spec();
        s.entrypoint = None;
        let a = run_args(&s, None, Path::new("/e"), &[], Path::new("/run"));
        assert!(!a.iter().any(|x| x.to_string_lossy().starts_with("--entrypoint")));
        // In its job's network namespace instead of the host's.
        s.netns = Some(PathBuf::from("/data/netns/7"));
        let a = run_args(&s, None, Path::new("/e"), &[], Path::new("/run"));
        assert!(a.contains(&OsString::from("--network=ns:/data/netns/7")) && !a.contains(&OsString::from("--network=host")), "{a:?}");
        // The managed service's host names lead to the server's jobs' address.
        s.add_hosts = vec![("storage.googleapis.com".into(), "127.255.0.1".into())];
        let a = run_args(&s, None, Path::new("/e"), &[], Path::new("/run"));
        assert!(a.contains(&OsString::from("--add-host=storage.googleapis.com:127.255.0.1")), "{a:?}");
    }

    #[test]
    fn env_file_keeps_the_last_value_and_passes_newlines_as_arguments() {
        let env = vec![("A".into(), "1".into()), ("B".into(), "x\ny".into()), ("A".into(), "2".into())];
        let (file, args) = env_file(&env);
        assert_eq!(file, "A=2\n");
        assert_eq!(args, ["--env=B=x\ny"]);
    }

    #[test]
    fn names_are_unique_per_run_directory_and_valid() {
        let a = container_name(1, 0, "workerpool0-0", 0, Path::new("/a/runs/1/0/workerpool0-0/0"));
        let b = container_name(1, 0, "workerpool0-0", 0, Path::new("/b/runs/1/0/workerpool0-0/0"));
        assert_ne!(a, b);
        assert!(a.starts_with("trainyard-1-0-workerpool0-0-0-"));
        assert!(a.chars().all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c)));
    }

    #[test]
    fn l13_engine_failures_are_classified() {
        let s = spec();
        let tail = |l: &str| vec![l.to_string()];
        match classify(&s, 125, false, &tail("Error: localhost/img:1: image not known")) {
            Some(Failure::Start(m)) => assert!(m.contains("podman load") && m.contains("localhost/img:1"), "{m}"),
            other => panic!("{other:?}"),
        }
        let unreachable = "Error: initializing source docker://r.example/x:v1: pinging container registry r.example: dial tcp: \
                           lookup r.example: no such host";
        assert!(matches!(classify(&s, 125, false, &tail(unreachable)), Some(Failure::Launch(_))));
        let missing = "Error: initializing source docker://r.example/x:v1: reading manifest v1 in r.example/x: manifest unknown";
        assert!(matches!(classify(&s, 125, false, &tail(missing)), Some(Failure::Start(_))));
        let exec = "ERROR (catatonit:7): failed to exec pid1: No such file or directory";
        match classify(&s, 1, true, &tail(exec)) {
            Some(Failure::Start(m)) => assert!(m.contains("\"python3\"") && m.contains("No such file"), "{m}"),
            other => panic!("{other:?}"),
        }
        // The program's own statuses, 125 included once the container ran.
        assert_eq!(classify(&s, 1, true, &tail("Traceback: boom")), None);
        assert_eq!(classify(&s, 125, true, &tail("my own message")), None);
        assert_eq!(classify(&s, 137, true, &[]), None);
    }
}
