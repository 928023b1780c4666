//! Chaos, bounded in time and on loopback only: SIGKILLs of the server, of shims, of replica
//! programs and of node agents while clients create jobs (L23, L9, L10, L20); a data disk
//! that fills up and is freed again; damaged rows in the database; idle and slow clients
//! and filter bombs.
//!
//! Random choices come from a seed printed at the start of each test
//! (`TRAINYARD_CHAOS_SEED=N` replays them; timing is the machine's). Every loop is bounded
//! in count and time, every test has a watchdog, and everything started (servers, shims,
//! mounts) is stopped by guards, also when a test fails. Invariants are checked by
//! functions that return the violations, printed before the test asserts that there are
//! none.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

const PROJECT: &str = "chaos";
const DEFAULT_SEED: u64 = 20_240_601;

// ---------------------------------------------------------------------------------------
// Harness: one test at a time, a watchdog, a seeded generator.

/// The tests of this file run one at a time, whatever the harness's thread count: each of
/// them loads a 2-core machine on its own.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn one_at_a_time() -> MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner())
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A test's hard time bound. At the deadline it SIGKILLs every process whose command line
/// names one of the test's directories, lazily unmounts the test's mounts, and ends the
/// test binary with a failure, so that a hung test never hangs CI. Dropped in time, it
/// does nothing.
struct Watchdog {
    done: Arc<AtomicBool>,
    markers: Arc<Mutex<Vec<String>>>,
    mounts: Arc<Mutex<Vec<PathBuf>>>,
}

impl Watchdog {
    fn arm(test: &'static str, limit: Duration) -> Watchdog {
        let done = Arc::new(AtomicBool::new(false));
        let markers = Arc::new(Mutex::new(Vec::<String>::new()));
        let mounts = Arc::new(Mutex::new(Vec::<PathBuf>::new()));
        let (d, m, mo) = (Arc::clone(&done), Arc::clone(&markers), Arc::clone(&mounts));
        thread::spawn(move || {
            let deadline = Instant::now() + limit;
            while Instant::now() < deadline {
                if d.load(Ordering::SeqCst) {
                    return;
                }
                thread::sleep(Duration::from_millis(100));
            }
            if d.load(Ordering::SeqCst) {
                return;
            }
            eprintln!("TIMEOUT: {test} ran past its bound of {limit:?}; killing its processes and ending the test binary");
            for _ in 0..3 {
                for marker in lock(&m).iter() {
                    for pid in pids_with(marker) {
                        sigkill(pid);
                    }
                }
                thread::sleep(Duration::from_millis(100));
            }
            for mount in lock(&mo).iter() {
                let _ = Command::new("umount").arg("-l").arg(mount).stderr(Stdio::null()).status();
            }
            std::process::exit(1);
        });
        Watchdog { done, markers, mounts }
    }

    /// At the deadline, kill every process whose command line contains `dir`.
    fn watch_processes(&self, dir: &Path) {
        lock(&self.markers).push(dir.display().to_string());
    }

    /// At the deadline, unmount `dir` (lazily).
    fn watch_mount(&self, dir: &Path) {
        lock(&self.mounts).push(dir.to_path_buf());
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.done.store(true, Ordering::SeqCst);
    }
}

/// Sets a flag when dropped: threads that watch it stop also when the test panics.
struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// The project's seeded generator (`trainyard_core::rng`), one stream per actor of a test,
/// so that a printed seed replays its choices.
struct Rng(trainyard_core::rng::Rng);

impl Rng {
    fn new(seed: u64, stream: u64) -> Rng {
        Rng(trainyard_core::rng::Rng::new(trainyard_core::rng::mix(&[seed, stream])))
    }

    fn below(&mut self, n: u64) -> u64 {
        self.0.below(n.max(1) as usize) as u64
    }

    fn millis(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.below(hi.saturating_sub(lo) + 1))
    }

    fn percent(&mut self, p: u64) -> bool {
        self.0.chance(p as u32)
    }

    fn pick<T: Copy>(&mut self, items: &[T]) -> Option<T> {
        self.0.choose(items).copied()
    }
}

fn seed(test: &str) -> u64 {
    let seed = std::env::var("TRAINYARD_CHAOS_SEED").ok().and_then(|s| s.trim().parse().ok()).unwrap_or(DEFAULT_SEED);
    println!("{test}: seed {seed} (replay with TRAINYARD_CHAOS_SEED={seed})");
    seed
}

/// Print the violations and fail the test if there are any.
fn assert_none(test: &str, violations: &[String], context: impl FnOnce() -> String) {
    if violations.is_empty() {
        println!("{test}: no violation");
        return;
    }
    println!("{test}: {} violation(s):", violations.len());
    for v in violations {
        println!("  - {v}");
    }
    panic!("{test}: {} violation(s), first: {}\n{}", violations.len(), violations[0], context());
}

fn skip_without_root(test: &str) -> bool {
    if is_root() {
        return false;
    }
    if std::env::var("TRAINYARD_CHAOS_NO_ROOT").is_ok_and(|v| v == "1") {
        println!("SKIP {test}: needs root (TRAINYARD_CHAOS_NO_ROOT=1)");
        return true;
    }
    panic!(
        "{test} needs root (it mounts a tmpfs); CI runs as root. Set TRAINYARD_CHAOS_NO_ROOT=1 to skip it on a machine without root."
    );
}

// ---------------------------------------------------------------------------------------
// API helpers that never panic on a transport error.

fn is_terminal(job: &Value) -> bool {
    matches!(job["state"].as_str(), Some("JOB_STATE_SUCCEEDED" | "JOB_STATE_FAILED" | "JOB_STATE_CANCELLED"))
}

fn short_state(job: &Value) -> String {
    job["state"].as_str().unwrap_or("?").trim_start_matches("JOB_STATE_").to_string()
}

/// Percent-encode a query value; unreserved characters and parentheses stay as they are.
fn query_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~()".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A create, as the client saw it: the job, or what came back instead.
fn create(api: &Api, job: &Value) -> Result<Value, String> {
    match api.try_call("POST", &api.jobs_url(PROJECT), Some(&job.to_string())) {
        Ok((200, body)) if body["name"].is_string() => Ok(body),
        Ok((status, body)) => Err(format!("{status} {}: {}", body["error"]["status"], body["error"]["message"])),
        Err(e) => Err(format!("transport: {e}")),
    }
}

/// One page of the project's jobs: (jobs, unreachable names, next page token).
type Page = (Vec<Value>, Vec<String>, Option<String>);

fn list_page(api: &Api, page_size: u32, token: Option<&str>) -> Result<Page, String> {
    let mut url = format!("{}?pageSize={page_size}", api.jobs_url(PROJECT));
    if let Some(t) = token {
        url.push_str(&format!("&pageToken={}", query_escape(t)));
    }
    match api.try_call("GET", &url, None)? {
        (200, body) => {
            let jobs = body["customJobs"].as_array().cloned().unwrap_or_default();
            let unreachable = body["unreachable"]
                .as_array()
                .map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_owned)).collect())
                .unwrap_or_default();
            let next = body["nextPageToken"].as_str().filter(|t| !t.is_empty()).map(str::to_owned);
            Ok((jobs, unreachable, next))
        }
        (status, body) => Err(format!("list page answered {status}: {body}")),
    }
}

/// Every job of the project, page by page (at most `max_pages`): (jobs, unreachable, pages).
fn list_all(api: &Api, page_size: u32, max_pages: usize) -> Result<(Vec<Value>, Vec<String>, usize), String> {
    let (mut jobs, mut unreachable, mut token) = (Vec::new(), Vec::new(), None::<String>);
    for page in 1..=max_pages {
        let (j, u, next) = list_page(api, page_size, token.as_deref())?;
        jobs.extend(j);
        unreachable.extend(u);
        match next {
            Some(t) => token = Some(t),
            None => return Ok((jobs, unreachable, page)),
        }
    }
    Err(format!("more than {max_pages} pages of {page_size}"))
}

/// Poll until every job of the project is terminal, at most `bound`: the time it took, or
/// the jobs still live at the end.
fn wait_all_terminal(api: &Api, bound: Duration) -> Result<Duration, Vec<String>> {
    let t0 = Instant::now();
    loop {
        let live: Vec<String> = match list_all(api, 1000, 10) {
            Ok((jobs, _, _)) => {
                jobs.iter().filter(|j| !is_terminal(j)).map(|j| format!("{} {}", name_of(j), short_state(j))).collect()
            }
            Err(e) => vec![e],
        };
        if live.is_empty() {
            return Ok(t0.elapsed());
        }
        if t0.elapsed() > bound {
            return Err(live);
        }
        thread::sleep(Duration::from_millis(250));
    }
}

/// Poll one job until it is terminal (at most `bound`).
fn wait_job_terminal(api: &Api, name: &str, bound: Duration) -> Result<Value, String> {
    let t0 = Instant::now();
    let mut last = String::new();
    while t0.elapsed() < bound {
        match api.try_call("GET", &api.url(&format!("/v1/{name}")), None) {
            Ok((200, j)) if is_terminal(&j) => return Ok(j),
            Ok((status, j)) => last = format!("{status} {}", short_state(&j)),
            Err(e) => last = e,
        }
        thread::sleep(Duration::from_millis(100));
    }
    Err(format!("{name} not terminal after {bound:?} (last: {last})"))
}

fn healthz(api: &Api) -> Result<u16, String> {
    api.try_call("GET", &api.url("/healthz"), None).map(|(s, _)| s)
}

/// `runs/<job>/<attempt>/<replica>/<restart>` directories of a job.
fn job_runs(data: &Path, id: u64) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let children = |p: &Path| -> Vec<PathBuf> {
        std::fs::read_dir(p).map(|d| d.flatten().map(|e| e.path()).filter(|p| p.is_dir()).collect()).unwrap_or_default()
    };
    for attempt in children(&data.join("runs").join(id.to_string())) {
        for replica in children(&attempt) {
            out.extend(children(&replica));
        }
    }
    out
}

/// The replica cgroup a run's spec names, if the run has one.
fn run_cgroup(run: &Path) -> Option<PathBuf> {
    let spec: Value = serde_json::from_str(&std::fs::read_to_string(run.join("spec.json")).ok()?).ok()?;
    let (base, name) = (spec["cgroup_base"].as_str()?, spec["cgroup_name"].as_str()?);
    (!name.is_empty()).then(|| Path::new(base).join(name))
}

/// Shims of a data directory: `trainyard shim <data>/runs/...`.
fn shims_of(data: &Path) -> Vec<i32> {
    procs_with(&data.display().to_string())
        .into_iter()
        .filter(|(_, a)| a.get(1).is_some_and(|x| x == "shim"))
        .map(|(p, _)| p)
        .collect()
}

/// Node agents of a data directory: (pid, node).
fn agents_of(data: &Path) -> Vec<(i32, String)> {
    procs_with(&data.display().to_string())
        .into_iter()
        .filter(|(_, a)| a.get(1).is_some_and(|x| x == "node-agent"))
        .filter_map(|(p, a)| Some((p, Path::new(a.get(2)?).file_stem()?.to_string_lossy().into_owned())))
        .collect()
}

/// No shim of `data`, no process naming `marker` (the replica programs), and no replica
/// cgroup of `runs` left; waits up to `bound` for stragglers that are still exiting.
fn check_nothing_left(data: &Path, marker: &Path, runs: &[PathBuf], bound: Duration) -> Vec<String> {
    let t0 = Instant::now();
    loop {
        let mut v = Vec::new();
        for pid in shims_of(data) {
            v.push(format!("a shim is still alive: pid {pid}"));
        }
        for (pid, args) in procs_with(&marker.display().to_string()) {
            v.push(format!(
                "a replica program is still alive: pid {pid} {}",
                args.join(" ").chars().take(120).collect::<String>()
            ));
        }
        for run in runs {
            if let Some(cg) = run_cgroup(run) {
                if cg.exists() {
                    let procs = std::fs::read_to_string(cg.join("cgroup.procs")).unwrap_or_default();
                    v.push(format!("cgroup {} is left ({} process(es))", cg.display(), procs.lines().count()));
                }
            }
        }
        if v.is_empty() || t0.elapsed() > bound {
            return v;
        }
        thread::sleep(Duration::from_millis(200));
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

// ---------------------------------------------------------------------------------------
// 1. SIGKILLs everywhere while clients create jobs.

const FLEET: &str = "[[nodes]]\nname = \"n1\"\ncpus = 16\nmemory_gb = 64\n\n\
                     [[nodes]]\nname = \"n2\"\ncpus = 16\nmemory_gb = 64\n\n\
                     [[nodes]]\nname = \"n3\"\ncpus = 16\nmemory_gb = 64\n";
const CREATORS: usize = 4;
const CREATES_PER_CREATOR: usize = 45;
const CHAOS_FOR: Duration = Duration::from_secs(40);

/// What a job's program does. Each run appends `start PID` to the job's token file and
/// prints `started TOKEN`; a run that finishes appends `done PID`.
#[derive(Clone, Copy, Debug)]
enum Program {
    Quick,
    Sleeps(u64),
    Fails(i32),
}

impl Program {
    fn choose(rng: &mut Rng) -> Program {
        match rng.below(10) {
            0..=4 => Program::Quick,
            5..=7 => Program::Sleeps(1 + rng.below(3)),
            // Not a transient code (6, 134, 11, 139): these fail at once (L13).
            _ => Program::Fails(rng.pick(&[1, 2, 3, 42]).unwrap_or(1)),
        }
    }

    fn script(self, token: &str, file: &Path) -> String {
        let f = file.display();
        let start = format!("echo \"start $$\" >> {f}; echo started {token}");
        match self {
            Program::Quick => format!("{start}; echo \"done $$\" >> {f}"),
            Program::Sleeps(s) => format!("{start}; sleep {s}; echo \"done $$\" >> {f}"),
            Program::Fails(code) => format!("{start}; echo {token} fails >&2; exit {code}"),
        }
    }
}

/// A create the server acknowledged (200 with a name).
#[derive(Clone, Debug)]
struct Acked {
    name: String,
    token: String,
    program: Program,
    cancel_sent: bool,
}

/// Every create the clients sent: the acknowledged ones, and what the others got.
#[derive(Default)]
struct Ledger {
    acked: Vec<Acked>,
    not_acked: BTreeMap<String, u32>,
}

impl Ledger {
    fn refused(&mut self, what: &str) {
        // Transport errors carry the URL and the OS's words; keep their kind.
        let kind = if what.starts_with("transport") { "transport error (server down)".to_string() } else { what.to_string() };
        *self.not_acked.entry(kind).or_default() += 1;
    }
}

/// A client that creates jobs until told to stop (or its bound), and records every
/// acknowledged create; some sleeping jobs are cancelled at once.
fn creator(i: usize, seed: u64, api: Api, tokens: PathBuf, ledger: Arc<Mutex<Ledger>>, stop: Arc<AtomicBool>) {
    let mut rng = Rng::new(seed, 100 + i as u64);
    for n in 0..CREATES_PER_CREATOR {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        thread::sleep(rng.millis(150, 800));
        let token = format!("c{i}-{n}");
        let program = Program::choose(&mut rng);
        let job = sh_job(&token, &program.script(&token, &tokens.join(&token)));
        match create(&api, &job) {
            Ok(body) => {
                let name = name_of(&body);
                let cancel_sent = matches!(program, Program::Sleeps(_)) && rng.percent(15);
                if cancel_sent {
                    let _ = api.try_call("POST", &api.url(&format!("/v1/{name}:cancel")), Some("{}"));
                }
                lock(&ledger).acked.push(Acked { name, token, program, cancel_sent });
            }
            Err(e) => lock(&ledger).refused(&e),
        }
    }
}

#[derive(Default, Debug)]
struct Kills {
    server: u32,
    shim: u32,
    replica: u32,
    agent: u32,
}

/// The chaos actor: at random intervals it SIGKILLs the server (and starts it again on the
/// same data directory), a shim, a replica program or a node agent (and brings the node
/// back a little later, keeping at most one node down at a time).
struct Chaos {
    rng: Rng,
    data: PathBuf,
    tokens: PathBuf,
    kills: Kills,
    /// Nodes whose agent was killed, and when to bring them back (undrain).
    down: Vec<(String, Instant)>,
    /// Time from a server's SIGKILL (less the chosen downtime) until its API lists again.
    recoveries: Vec<Duration>,
    last_server_kill: Instant,
}

impl Chaos {
    fn new(seed: u64, data: PathBuf, tokens: PathBuf) -> Chaos {
        Chaos {
            rng: Rng::new(seed, 1),
            data,
            tokens,
            kills: Kills::default(),
            down: Vec::new(),
            recoveries: Vec::new(),
            last_server_kill: Instant::now(),
        }
    }

    fn act(&mut self, s: &mut Server) {
        self.bring_back(&s.api(), false);
        // The server is killed at least every 8 s, besides the random choice.
        if self.last_server_kill.elapsed() > Duration::from_secs(8) {
            self.kill_server(s);
            return;
        }
        match self.rng.below(100) {
            0..=19 => self.kill_server(s),
            20..=44 => self.kill_shim(),
            45..=79 => self.kill_replica(),
            _ => self.kill_agent(),
        }
    }

    fn kill_server(&mut self, s: &mut Server) {
        let downtime = self.rng.millis(0, 300);
        let t0 = Instant::now();
        s.kill9();
        self.kills.server += 1;
        self.last_server_kill = t0;
        thread::sleep(downtime);
        s.spawn();
        let api = s.api();
        let url = format!("{}?pageSize=1", api.jobs_url(PROJECT));
        let deadline = Instant::now() + Duration::from_secs(30);
        while !matches!(api.try_call("GET", &url, None), Ok((200, _))) {
            assert!(Instant::now() < deadline, "the restarted server does not list jobs after 30 s:\n{}", s.server_log());
            thread::sleep(Duration::from_millis(20));
        }
        self.recoveries.push(t0.elapsed().saturating_sub(downtime));
    }

    fn kill_shim(&mut self) {
        if let Some(pid) = self.rng.pick(&shims_of(&self.data)) {
            if sigkill(pid) {
                self.kills.shim += 1;
            }
        }
    }

    fn kill_replica(&mut self) {
        let programs: Vec<i32> = procs_with(&self.tokens.display().to_string())
            .into_iter()
            .filter(|(_, a)| a.first().is_some_and(|x| x == "sh"))
            .map(|(p, _)| p)
            .collect();
        if let Some(pid) = self.rng.pick(&programs) {
            if sigkill(pid) {
                self.kills.replica += 1;
            }
        }
    }

    fn kill_agent(&mut self) {
        if !self.down.is_empty() {
            return;
        }
        let agents = agents_of(&self.data);
        let Some(i) = self.rng.pick(&(0..agents.len()).collect::<Vec<_>>()) else { return };
        let (pid, node) = agents[i].clone();
        if sigkill(pid) {
            self.kills.agent += 1;
            let back = Instant::now() + self.rng.millis(1000, 3000);
            self.down.push((node, back));
        }
    }

    /// Undrain the nodes whose time has come (all of them with `all`); keep those whose
    /// undrain did not get through.
    fn bring_back(&mut self, api: &Api, all: bool) {
        self.down.retain(|(node, at)| {
            if !all && Instant::now() < *at {
                return true;
            }
            !matches!(api.try_call("POST", &api.url(&format!("/v1/admin/nodes/{node}:undrain")), Some("{}")), Ok((200, _)))
        });
    }
}

/// What one acknowledged job left behind, as read after the chaos.
struct JobFacts {
    acked: Acked,
    job: Value,
    /// The service's lifecycle lines (`stream: "event"`).
    events: Vec<String>,
    /// `started TOKEN` lines on the program's stdout, as the logs API returns them.
    log_starts: usize,
    /// Run directories: launches of a replica.
    runs: Vec<PathBuf>,
    /// `start` and `done` lines in the token file: program runs that began and finished.
    starts: usize,
    dones: usize,
}

impl JobFacts {
    /// Runs that the events account for: the first, plus one per restart (L10, L9) and
    /// per job retry (L12, L16).
    fn explained_runs(&self) -> usize {
        1 + self
            .events
            .iter()
            .filter(|t| {
                t.contains("; restarting it (")
                    || t.contains("; restarting it on node")
                    || t.contains("restarted on node")
                    || t.starts_with("Job retry ")
            })
            .count()
    }
}

/// GET every acknowledged job with its logs, run directories and token file. A job that
/// is not found is a violation (L23: no acknowledged job is lost).
fn gather(api: &Api, data: &Path, tokens: &Path, acked: &[Acked]) -> (Vec<JobFacts>, Vec<String>) {
    let mut facts = Vec::new();
    let mut violations = Vec::new();
    for a in acked {
        let mut got = Err("not asked".to_string());
        for _ in 0..3 {
            got = api.try_call("GET", &api.url(&format!("/v1/{}", a.name)), None);
            if got.is_ok() {
                break;
            }
            thread::sleep(Duration::from_millis(200));
        }
        let job = match got {
            Ok((200, job)) => job,
            Ok((404, _)) => {
                violations.push(format!("{} ({}) was acknowledged and is lost: 404", a.name, a.token));
                continue;
            }
            Ok((status, body)) => {
                violations.push(format!("{} ({}): GET answered {status}: {body}", a.name, a.token));
                continue;
            }
            Err(e) => {
                violations.push(format!("{} ({}): {e}", a.name, a.token));
                continue;
            }
        };
        let logs = api.try_logs(&a.name).unwrap_or_else(|e| {
            violations.push(format!("{}: logs: {e}", a.name));
            Vec::new()
        });
        // Events as a person reads them: without the rule id their text starts with
        // ("L12: Job retry 1 of 3: ..."), which the entry's `rule` field keeps.
        let events = logs
            .iter()
            .filter(|e| e["stream"] == "event")
            .filter_map(|e| {
                let text = e["text"].as_str()?;
                let plain = e["rule"].as_str().and_then(|r| text.strip_prefix(r)).and_then(|t| t.strip_prefix(": ")).unwrap_or(text);
                Some(plain.to_owned())
            })
            .collect();
        let started = format!("started {}", a.token);
        let log_starts =
            logs.iter().filter(|e| e["stream"] == "stdout" && e["text"].as_str().is_some_and(|t| t.trim() == started)).count();
        let lines = std::fs::read_to_string(tokens.join(&a.token)).unwrap_or_default();
        let starts = lines.lines().filter(|l| l.starts_with("start ")).count();
        let dones = lines.lines().filter(|l| l.starts_with("done ")).count();
        let runs = job_runs(data, id_of(&job));
        facts.push(JobFacts { acked: a.clone(), job, events, log_starts, runs, starts, dones });
    }
    (facts, violations)
}

/// L1, L2: every job is terminal, in a state the rules allow for its program: SUCCEEDED
/// without an error, FAILED with one, CANCELLED with code 1; a program that always exits
/// non-zero never SUCCEEDED.
fn check_final_states(facts: &[JobFacts]) -> Vec<String> {
    let mut v = Vec::new();
    for f in facts {
        let (name, j) = (&f.acked.name, &f.job);
        let err = &j["error"];
        match j["state"].as_str().unwrap_or("") {
            "JOB_STATE_SUCCEEDED" => {
                if !err.is_null() {
                    v.push(format!("{name}: SUCCEEDED with an error {err}"));
                }
                if matches!(f.acked.program, Program::Fails(_)) {
                    v.push(format!("{name}: SUCCEEDED although its program always exits non-zero"));
                }
            }
            "JOB_STATE_FAILED" => {
                if err["message"].as_str().unwrap_or("").is_empty() || err["code"].as_i64().unwrap_or(0) == 0 {
                    v.push(format!("{name}: FAILED without an error code and message: {err}"));
                }
            }
            "JOB_STATE_CANCELLED" => {
                if err["code"].as_i64() != Some(1) {
                    v.push(format!("{name}: CANCELLED with error {err}, not code 1"));
                }
            }
            other => v.push(format!("{name}: not terminal at the end: {other}")),
        }
    }
    v
}

/// Nothing ran that the rules do not explain: every program start had its own run
/// directory (a shim never runs a program twice), every run directory is accounted for by
/// the first launch or a restart or retry event (a server restart never launches a finished
/// run again), the logs show no more starts than happened, and a job that SUCCEEDED
/// finished its program, more than once only if a restart or retry explains it.
fn check_runs_explained(facts: &[JobFacts]) -> Vec<String> {
    let mut v = Vec::new();
    for f in facts {
        let (name, token) = (&f.acked.name, &f.acked.token);
        let explained = f.explained_runs();
        if f.runs.len() > explained {
            v.push(format!("{name} ({token}): {} runs, but the events explain {explained}: {:?}", f.runs.len(), f.events));
        }
        if f.starts > f.runs.len() {
            v.push(format!("{name} ({token}): its program started {} times in {} runs", f.starts, f.runs.len()));
        }
        if f.log_starts > f.starts {
            v.push(format!("{name} ({token}): the logs show {} starts, the program made {}", f.log_starts, f.starts));
        }
        if f.job["state"] == "JOB_STATE_SUCCEEDED" {
            if f.dones == 0 {
                v.push(format!("{name} ({token}): SUCCEEDED but its program never finished"));
            }
            if f.dones > 1 && explained == 1 {
                v.push(format!("{name} ({token}): finished {} times with no restart or retry: ran twice", f.dones));
            }
        }
        if matches!(f.acked.program, Program::Fails(_)) && f.dones > 0 {
            v.push(format!("{name} ({token}): a failing program wrote done"));
        }
    }
    v
}

/// Every job of the project (also creates that were never acknowledged, which may exist)
/// is terminal.
fn check_all_listed_terminal(api: &Api) -> Vec<String> {
    match list_all(api, 1000, 10) {
        Ok((jobs, _, _)) => {
            jobs.iter().filter(|j| !is_terminal(j)).map(|j| format!("{} is listed as {}", name_of(j), short_state(j))).collect()
        }
        Err(e) => vec![format!("listing the jobs: {e}")],
    }
}

/// L23 under fire: while 4 clients create short jobs, the server, shims, replica programs
/// and node agents are SIGKILLed at random for about 40 s. No acknowledged job is lost,
/// every job ends in a state the rules allow, nothing ran that the rules do not explain
/// (L9, L10, L12), nothing is left running and no replica cgroup is left (L20).
#[test]
fn chaos_kills_keep_every_acknowledged_job() {
    const TEST: &str = "chaos_kills_keep_every_acknowledged_job";
    if skip_on_slurm("the chaos kills local processes: shims, node agents, replica programs") {
        return;
    }
    let _serial = one_at_a_time();
    let dog = Watchdog::arm(TEST, Duration::from_secs(150));
    let seed = seed(TEST);
    let mut s = Server::start(FLEET);
    dog.watch_processes(s.dir.path());
    let data = s.data_dir();
    let tokens = s.dir.path().join("tokens");
    std::fs::create_dir_all(&tokens).expect("tokens dir");
    // Replicas (per-project users under a root server) append their start marks here.
    std::fs::set_permissions(&tokens, std::os::unix::fs::PermissionsExt::from_mode(0o1777)).expect("tokens dir mode");

    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let stop_guard = StopOnDrop(Arc::clone(&stop));
    let creators: Vec<_> = (0..CREATORS)
        .map(|i| {
            let (api, tokens, ledger, stop) = (s.api(), tokens.clone(), Arc::clone(&ledger), Arc::clone(&stop));
            thread::spawn(move || creator(i, seed, api, tokens, ledger, stop))
        })
        .collect();

    let mut chaos = Chaos::new(seed, data.clone(), tokens.clone());
    let t0 = Instant::now();
    while t0.elapsed() < CHAOS_FOR {
        let pause = chaos.rng.millis(300, 1500);
        thread::sleep(pause);
        chaos.act(&mut s);
    }
    drop(stop_guard);
    for c in creators {
        c.join().expect("a creator thread panicked");
    }
    let api = s.api();
    chaos.bring_back(&api, true);
    // Any node still down (its agent killed while the server was restarting) comes back.
    if let Ok((200, nodes)) = api.try_call("GET", &api.url("/v1/admin/nodes"), None) {
        for n in nodes["nodes"].as_array().into_iter().flatten().filter(|n| n["state"] != "UP") {
            let node = n["name"].as_str().unwrap_or("");
            let _ = api.try_call("POST", &api.url(&format!("/v1/admin/nodes/{node}:undrain")), Some("{}"));
        }
    }
    let settled = wait_all_terminal(&api, Duration::from_secs(60));

    let ledger = std::mem::take(&mut *lock(&ledger));
    let (facts, mut violations) = gather(&api, &data, &tokens, &ledger.acked);
    if let Err(live) = &settled {
        violations.push(format!("{} job(s) not terminal 60 s after the chaos: {:?}", live.len(), live));
    }
    violations.extend(check_final_states(&facts));
    violations.extend(check_runs_explained(&facts));
    violations.extend(check_all_listed_terminal(&api));
    let all_runs: Vec<PathBuf> = facts.iter().flat_map(|f| f.runs.iter().cloned()).collect();
    violations.extend(check_nothing_left(&data, &tokens, &all_runs, Duration::from_secs(10)));
    match healthz(&api) {
        Ok(200) => {}
        other => violations.push(format!("/healthz after the chaos: {other:?}")),
    }

    // Figures.
    let mut by_state: BTreeMap<String, u32> = BTreeMap::new();
    for f in &facts {
        *by_state.entry(short_state(&f.job)).or_default() += 1;
    }
    let count = |pat: &str| facts.iter().flat_map(|f| f.events.iter()).filter(|t| t.contains(pat)).count();
    let runs: usize = facts.iter().map(|f| f.runs.len()).sum();
    let starts: usize = facts.iter().map(|f| f.starts).sum();
    let log_starts: usize = facts.iter().map(|f| f.log_starts).sum();
    let finished_twice = facts.iter().filter(|f| f.dones > 1).count();
    let max_recovery = chaos.recoveries.iter().max().copied().unwrap_or_default();
    println!("{TEST}: figures");
    println!(
        "  creates acknowledged: {} (cancel sent to {})",
        ledger.acked.len(),
        ledger.acked.iter().filter(|a| a.cancel_sent).count()
    );
    println!("  creates not acknowledged: {:?}", ledger.not_acked);
    println!(
        "  kills: server {}, shim {}, replica {}, agent {}",
        chaos.kills.server, chaos.kills.shim, chaos.kills.replica, chaos.kills.agent
    );
    println!("  jobs by final state: {by_state:?}");
    println!(
        "  runs {runs}, program starts {starts}, starts in the logs {log_starts}; restarts: L10 {}, L9 node lost {}; job retries {}; jobs whose program finished more than once {finished_twice}",
        count("; restarting it ("),
        count("; restarting it on node"),
        count("Job retry ")
    );
    let mut retry_reasons: BTreeMap<String, u32> = BTreeMap::new();
    for t in facts.iter().flat_map(|f| f.events.iter()).filter(|t| t.starts_with("Job retry ")) {
        let reason = t.split_once(": ").map(|(_, r)| r).unwrap_or(t);
        let reason: String = reason.chars().filter(|c| !c.is_ascii_digit()).take(200).collect();
        *retry_reasons.entry(reason).or_default() += 1;
    }
    println!("  job retries by reason: {retry_reasons:?}");
    let log_differs = facts.iter().filter(|f| f.log_starts != f.starts).count();
    println!("  jobs whose logs show fewer starts than their program made (output lost with a killed shim): {log_differs}");
    println!(
        "  server restarts: time to recover (SIGKILL to the API listing again, less the downtime) max {max_recovery:?}, all {:?}",
        chaos.recoveries
    );
    match settled {
        Ok(d) => println!("  all jobs terminal {d:?} after the chaos ended"),
        Err(_) => println!("  jobs still live after 60 s"),
    }
    let failing: Vec<&JobFacts> = facts.iter().filter(|f| matches!(f.acked.program, Program::Fails(_))).collect();
    let l13 = failing
        .iter()
        .filter(|f| {
            let Program::Fails(code) = f.acked.program else { return false };
            f.job["error"]["message"].as_str().is_some_and(|m| m.contains(&format!("exited with a non-zero status of {code}.")))
        })
        .count();
    println!("  failing programs FAILED with the L13 message naming their exit code: {l13} of {}", failing.len());
    for f in facts.iter().filter(|f| f.dones > 1).take(3) {
        println!(
            "  finished {} times in {} runs, explained by: {} {}: {:?}",
            f.dones,
            f.runs.len(),
            f.acked.name,
            f.acked.token,
            f.events
        );
    }
    for f in
        facts.iter().filter(|f| f.job["state"] == "JOB_STATE_FAILED" && !matches!(f.acked.program, Program::Fails(_))).take(5)
    {
        println!("  FAILED though its program succeeds: {} {}: {}", f.acked.name, f.acked.token, f.job["error"]["message"]);
    }
    assert!(!ledger.acked.is_empty(), "no create was acknowledged at all");
    assert_none(TEST, &violations, || format!("server log (tail):\n{}", tail(&s.server_log(), 60)));
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

// ---------------------------------------------------------------------------------------
// 2. A full data disk, freed again.

/// A tmpfs mounted on a fresh directory, unmounted when dropped (declare it before the
/// server that uses it, so that the server is gone first).
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size: &str) -> Result<Tmpfs, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .output()
            .map_err(|e| format!("mount: {e}"))?;
        if !out.status.success() {
            return Err(format!("mount -t tmpfs on {}: {}", dir.path().display(), String::from_utf8_lossy(&out.stderr)));
        }
        Ok(Tmpfs { dir })
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        for _ in 0..30 {
            let ok = Command::new("umount").arg(self.path()).stderr(Stdio::null()).status().is_ok_and(|s| s.success());
            if ok {
                return;
            }
            thread::sleep(Duration::from_millis(100));
        }
        eprintln!("umount {} failed for 3 s; detaching it lazily", self.path().display());
        let _ = Command::new("umount").arg("-l").arg(self.path()).status();
    }
}

/// Write `file` until the file system says ENOSPC (1 MiB, then 4 KiB writes); the bytes
/// written.
fn fill_until_enospc(file: &Path) -> Result<u64, String> {
    let mut f = std::fs::File::create(file).map_err(|e| format!("create {}: {e}", file.display()))?;
    let mut written = 0u64;
    for chunk in [1 << 20, 4096] {
        let buf = vec![0xA5u8; chunk];
        for _ in 0..10_000 {
            match f.write(&buf) {
                Ok(0) => break,
                Ok(n) => written += n as u64,
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
                Err(e) => return Err(format!("write {}: {e}", file.display())),
            }
        }
    }
    let _ = f.sync_all();
    Ok(written)
}

/// What a request got, in a line.
fn answer(r: &Result<(u16, Value), String>) -> String {
    match r {
        Ok((s, b)) if b["error"].is_object() => {
            format!("{s} {} {}", b["error"]["status"].as_str().unwrap_or(""), b["error"]["message"])
        }
        Ok((s, b)) => format!("{s} {}", b["name"].as_str().or(b["state"].as_str()).unwrap_or("")),
        Err(e) => format!("transport error: {e}"),
    }
}

/// A full data disk: while the disk is full, a create is answered 503 UNAVAILABLE naming
/// the full disk (a store error is retried with backoff, not fatal); once the disk has
/// room again the server recovers by itself within 5 s: creates succeed, the job cancelled
/// meanwhile ends CANCELLED, the running jobs finish, /healthz answers.
#[test]
fn chaos_full_disk_then_freed() {
    const TEST: &str = "chaos_full_disk_then_freed";
    if skip_on_slurm("the data directory is a local tmpfs") || skip_without_root(TEST) {
        return;
    }
    let _serial = one_at_a_time();
    let dog = Watchdog::arm(TEST, Duration::from_secs(90));
    let disk = Tmpfs::mount("24m").unwrap_or_else(|e| panic!("{TEST}: {e}"));
    dog.watch_mount(disk.path());
    dog.watch_processes(disk.path());
    let mut s = Server::prepare("").with_data_dir(disk.path().join("data"));
    dog.watch_processes(s.dir.path());
    s.spawn();
    let api = s.api();
    let mut violations = Vec::new();

    // Jobs that run through the full disk, and one to cancel while it is full.
    let runners: Vec<String> = (0..2)
        .map(|i| name_of(&create(&api, &sh_job(&format!("runner-{i}"), "echo begin; sleep 8; echo end")).expect("create runner")))
        .collect();
    let victim = name_of(&create(&api, &sh_job("victim", "echo begin; sleep 120")).expect("create victim"));
    for name in runners.iter().chain([&victim]) {
        s.wait_for(name, 30, |j| j["state"] == "JOB_STATE_RUNNING");
    }

    let filler = disk.path().join("filler");
    let filled = fill_until_enospc(&filler).unwrap_or_else(|e| panic!("{TEST}: filling the disk: {e}"));
    let mut full_answers = Vec::new();
    let mut acked_while_full = Vec::new();
    for i in 0..5 {
        let r = api.try_call("POST", &api.jobs_url(PROJECT), Some(&sh_job(&format!("while-full-{i}"), "echo hi").to_string()));
        if let Ok((200, b)) = &r {
            acked_while_full.push(name_of(b));
        }
        full_answers.push(r);
        thread::sleep(Duration::from_millis(200));
    }
    let get_while_full = api.try_call("GET", &api.url(&format!("/v1/{victim}")), None);
    let health_while_full = api.try_call("GET", &api.url("/healthz"), None);
    let cancel_while_full = api.try_call("POST", &api.url(&format!("/v1/{victim}:cancel")), Some("{}"));

    std::fs::remove_file(&filler).expect("remove the filler");
    let freed = Instant::now();
    let mut recovered = None;
    let mut after_answers = Vec::new();
    let mut created_after = Vec::new();
    for i in 0..50 {
        if freed.elapsed() > Duration::from_secs(5) {
            break;
        }
        let r = api.try_call("POST", &api.jobs_url(PROJECT), Some(&sh_job(&format!("after-{i}"), "echo hi").to_string()));
        if let Ok((200, b)) = &r {
            recovered = Some(freed.elapsed());
            created_after.push(name_of(b));
            break;
        }
        after_answers.push(answer(&r));
        thread::sleep(Duration::from_millis(100));
    }

    println!("{TEST}: figures");
    println!("  filler: {} MiB until ENOSPC", filled >> 20);
    for r in &full_answers {
        println!("  create while full: {}", answer(r));
    }
    println!("  GET while full: {}", answer(&get_while_full));
    println!("  /healthz while full: {}", answer(&health_while_full));
    println!("  cancel while full: {}", answer(&cancel_while_full));
    println!("  creates after freeing that failed: {after_answers:?}");
    println!("  time to recover after freeing the disk: {recovered:?}");

    for r in &full_answers {
        match r {
            Ok((200, _)) => {}
            Ok((503, b))
                if b["error"]["status"] == "UNAVAILABLE"
                    && b["error"]["message"].as_str().is_some_and(|m| m.contains("disk is full")) => {}
            _ => violations.push(format!(
                "a create while the disk was full got {} (want 200, or 503 UNAVAILABLE naming the full disk)",
                answer(r)
            )),
        }
    }
    if !full_answers.iter().any(|r| matches!(r, Ok((503, _)))) {
        violations.push("no create was refused with 503 while the disk was full: the store never saw the full disk".into());
    }
    if recovered.is_none() {
        violations.push(format!("no create succeeded within 5 s of freeing the disk: {after_answers:?}"));
    }
    if !matches!(cancel_while_full, Ok((200, _))) {
        // Refused while full: it is asked again now that the disk has room.
        let again = api.try_call("POST", &api.url(&format!("/v1/{victim}:cancel")), Some("{}"));
        println!("  cancel again after freeing: {}", answer(&again));
    }
    match wait_job_terminal(&api, &victim, Duration::from_secs(30)) {
        Ok(j) if j["state"] == "JOB_STATE_CANCELLED" => {}
        Ok(j) => violations.push(format!("the cancelled job ended {}: {}", short_state(&j), j["error"])),
        Err(e) => violations.push(e),
    }
    for name in &runners {
        match wait_job_terminal(&api, name, Duration::from_secs(30)) {
            Ok(j) if j["state"] == "JOB_STATE_SUCCEEDED" => {}
            Ok(j) => violations.push(format!("{name}, running through the full disk, ended {}: {}", short_state(&j), j["error"])),
            Err(e) => violations.push(e),
        }
    }
    for name in acked_while_full.iter().chain(&created_after) {
        match wait_job_terminal(&api, name, Duration::from_secs(30)) {
            Ok(j) => println!("  {name} (acknowledged while full or just after): {}", short_state(&j)),
            Err(e) => violations.push(e),
        }
    }
    match healthz(&api) {
        Ok(200) => {}
        other => violations.push(format!("/healthz after freeing the disk: {other:?}")),
    }
    assert_none(TEST, &violations, || format!("server log (tail):\n{}", tail(&s.server_log(), 40)));
}

// ---------------------------------------------------------------------------------------
// 3. Damaged rows in the database.

fn damage(db: &Path, id: u64, column: &str, text: &str) {
    let conn = rusqlite::Connection::open(db).unwrap_or_else(|e| panic!("open {}: {e}", db.display()));
    conn.busy_timeout(Duration::from_secs(5)).expect("busy timeout");
    let n = conn
        .execute(&format!("UPDATE jobs SET {column} = ?2 WHERE id = ?1"), rusqlite::params![id as i64, text])
        .unwrap_or_else(|e| panic!("damage job {id}: {e}"));
    assert_eq!(n, 1, "job {id} has a row");
}

fn names_damage(message: &str) -> bool {
    let m = message.to_lowercase();
    ["damaged", "unreadable", "corrupt"].iter().any(|w| m.contains(w))
}

/// Damaged rows: with the server stopped, `core` of a terminal job and of a RUNNING job is
/// made garbage and `resource` of another terminal job is not JSON. The restarted server
/// starts, lists page by page past the damaged rows, shows each damaged job as FAILED with
/// an error naming the damage (or lists it as unreachable), deletes them, and stops the
/// processes of the damaged running job (L20).
#[test]
fn chaos_damaged_rows() {
    const TEST: &str = "chaos_damaged_rows";
    if skip_on_slurm("the damaged running job's processes are looked for on this host") {
        return;
    }
    let _serial = one_at_a_time();
    let dog = Watchdog::arm(TEST, Duration::from_secs(90));
    let mut s = Server::start("");
    dog.watch_processes(s.dir.path());
    let api = s.api();
    let marker = s.dir.path().join("running-started");

    // Oldest first; pages of 2 newest first cross every damaged row.
    let mut jobs: Vec<(String, String)> = Vec::new();
    for label in ["ok-0", "bad-core", "ok-1", "bad-resource", "ok-2", "running", "ok-3"] {
        let script = if label == "running" { format!("touch {}; sleep 300", marker.display()) } else { "echo ok".to_string() };
        let j = create(&api, &sh_job(label, &script)).unwrap_or_else(|e| panic!("create {label}: {e}"));
        jobs.push((label.to_string(), name_of(&j)));
    }
    let name = |label: &str| jobs.iter().find(|(l, _)| l == label).map(|(_, n)| n.clone()).expect("label");
    let id = |label: &str| name(label).rsplit('/').next().and_then(|s| s.parse::<u64>().ok()).expect("id");
    for (label, n) in &jobs {
        if label == "running" {
            s.wait_for(n, 30, |j| j["state"] == "JOB_STATE_RUNNING");
        } else {
            s.wait_terminal(n, 30);
        }
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while !marker.exists() && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(50));
    }
    let running_runs = job_runs(&s.data_dir(), id("running"));

    s.kill9();
    let db = s.data_dir().join("trainyard.db");
    damage(&db, id("bad-core"), "core", "{\"garbage");
    damage(&db, id("bad-resource"), "resource", "not json");
    damage(&db, id("running"), "core", "{\"garbage");
    let damaged = ["bad-core", "bad-resource", "running"];

    let mut violations = Vec::new();
    if let Err(e) = s.try_spawn() {
        let first = e.lines().next().unwrap_or("");
        violations.push(format!("the server does not start with damaged rows: {first}\n...\n{}", tail(&e, 3)));
        assert_none(TEST, &violations, String::new);
    }

    // Page through everything, 2 at a time.
    let mut listed: BTreeMap<String, Value> = BTreeMap::new();
    let mut unreachable: BTreeSet<String> = BTreeSet::new();
    let mut pages = 0;
    let mut token: Option<String> = None;
    loop {
        pages += 1;
        match list_page(&api, 2, token.as_deref()) {
            Ok((page, unr, next)) => {
                for j in page {
                    listed.insert(name_of(&j), j);
                }
                unreachable.extend(unr);
                match next {
                    Some(t) if pages < 20 => token = Some(t),
                    Some(_) => {
                        violations.push("more than 20 pages of 2 for 7 jobs".into());
                        break;
                    }
                    None => break,
                }
            }
            Err(e) => {
                violations.push(format!("page {pages} of the list: {e}"));
                break;
            }
        }
    }
    println!("{TEST}: figures");
    println!("  pages of 2: {pages}; listed {}; unreachable {:?}", listed.len(), unreachable);
    for (label, n) in &jobs {
        let shown =
            listed.get(n).map(|j| format!("{} {}", short_state(j), j["error"]["message"])).unwrap_or_else(|| "not listed".into());
        let got = api.try_call("GET", &api.url(&format!("/v1/{n}")), None);
        println!("  {label} {n}: listed {shown}; GET {}", answer(&got));
        if damaged.contains(&label.as_str()) {
            let shown_failed = listed
                .get(n)
                .is_some_and(|j| j["state"] == "JOB_STATE_FAILED" && j["error"]["message"].as_str().is_some_and(names_damage));
            if !shown_failed && !unreachable.contains(n) {
                violations
                    .push(format!("{label} ({n}) is neither listed as FAILED naming the damage nor as unreachable: {shown}"));
            }
        } else if !listed.contains_key(n) {
            violations.push(format!("{label} ({n}) is not listed"));
        }
    }

    // The damaged running job's processes are stopped.
    let data = s.data_dir();
    let left =
        check_nothing_left(&data.join("runs").join(id("running").to_string()), &marker, &running_runs, Duration::from_secs(15));
    violations.extend(left.into_iter().map(|l| format!("damaged running job: {l}")));

    // The damaged jobs can be deleted.
    for label in damaged {
        let n = name(label);
        let del = api.try_call("DELETE", &api.url(&format!("/v1/{n}")), None);
        println!("  DELETE {label}: {}", answer(&del));
        if !matches!(del, Ok((200, _))) {
            violations.push(format!("DELETE {label} ({n}): {}", answer(&del)));
            continue;
        }
        let after = api.try_call("GET", &api.url(&format!("/v1/{n}")), None);
        if !matches!(after, Ok((404, _))) {
            violations.push(format!("{label} ({n}) after its DELETE: {}", answer(&after)));
        }
    }
    match healthz(&api) {
        Ok(200) => {}
        other => violations.push(format!("/healthz: {other:?}")),
    }
    assert_none(TEST, &violations, || format!("server log (tail):\n{}", tail(&s.server_log(), 40)));
}

// ---------------------------------------------------------------------------------------
// 4. Idle and slow clients, filter bombs.

/// A connection that sends a request head one byte a second, and connects again when the
/// server closes it; until `stop` (and at most 120 bytes). Returns how often it was closed.
fn slowloris(port: u16, stop: Arc<AtomicBool>) -> u32 {
    let mut closed = 0;
    let mut sent = 0;
    'connect: while !stop.load(Ordering::SeqCst) && sent < 120 {
        let Ok(mut t) = TcpStream::connect(("127.0.0.1", port)) else { return closed };
        if t.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ").is_err() {
            closed += 1;
            continue;
        }
        while !stop.load(Ordering::SeqCst) && sent < 120 {
            thread::sleep(Duration::from_secs(1));
            sent += 1;
            if t.write_all(b"a").is_err() {
                closed += 1;
                continue 'connect;
            }
        }
    }
    closed
}

/// Did the server close this (otherwise silent) connection?
fn closed_by_server(mut t: &TcpStream) -> bool {
    let _ = t.set_nonblocking(true);
    let mut buf = [0u8; 64];
    match t.read(&mut buf) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => e.kind() != ErrorKind::WouldBlock,
    }
}

/// 200 idle connections and 20 slowloris connections do not keep normal clients out:
/// creates and lists answer (each within 10 s; p50/p99 printed); a filter of 10,000 nested
/// parentheses and one of 1,000 NOTs are refused with 400, and the server still answers.
#[test]
fn chaos_slow_and_idle_clients_and_filter_bomb() {
    const TEST: &str = "chaos_slow_and_idle_clients_and_filter_bomb";
    let _serial = one_at_a_time();
    let dog = Watchdog::arm(TEST, Duration::from_secs(90));
    let s = Server::start("");
    dog.watch_processes(s.dir.path());
    let api = s.api();
    let mut violations = Vec::new();

    let mut idle: Vec<TcpStream> = Vec::new();
    for _ in 0..200 {
        match TcpStream::connect(("127.0.0.1", s.port)) {
            Ok(t) => idle.push(t),
            Err(e) => {
                violations.push(format!("idle connection {}: {e}", idle.len() + 1));
                break;
            }
        }
    }
    let stop = Arc::new(AtomicBool::new(false));
    let stop_guard = StopOnDrop(Arc::clone(&stop));
    let slow: Vec<_> = (0..20)
        .map(|_| {
            let (port, stop) = (s.port, Arc::clone(&stop));
            thread::spawn(move || slowloris(port, stop))
        })
        .collect();
    thread::sleep(Duration::from_secs(1));

    // Normal clients meanwhile: 2 threads, each 15 creates and 15 lists.
    let failures = Arc::new(AtomicU32::new(0));
    let clients: Vec<_> = (0..2)
        .map(|c| {
            let (api, failures) = (api.clone(), Arc::clone(&failures));
            thread::spawn(move || {
                let mut took = Vec::new();
                let mut bad = Vec::new();
                for i in 0..15 {
                    let t0 = Instant::now();
                    let r = api.try_call(
                        "POST",
                        &api.jobs_url(PROJECT),
                        Some(&sh_job(&format!("normal-{c}-{i}"), "true").to_string()),
                    );
                    took.push(t0.elapsed());
                    if !matches!(r, Ok((200, _))) {
                        bad.push(format!("create: {}", answer(&r)));
                    }
                    let t0 = Instant::now();
                    let r = api.try_call("GET", &format!("{}?pageSize=10", api.jobs_url(PROJECT)), None);
                    took.push(t0.elapsed());
                    if !matches!(r, Ok((200, _))) {
                        bad.push(format!("list: {}", answer(&r)));
                    }
                }
                failures.fetch_add(bad.len() as u32, Ordering::SeqCst);
                (took, bad)
            })
        })
        .collect();
    let mut took = Vec::new();
    for c in clients {
        let (t, bad) = c.join().expect("a client thread panicked");
        took.extend(t);
        violations.extend(bad.into_iter().map(|b| format!("a normal client's request failed among slow ones: {b}")));
    }
    took.sort();
    let slow_requests = took.iter().filter(|d| **d > Duration::from_secs(10)).count();
    if slow_requests > 0 {
        violations.push(format!("{slow_requests} normal request(s) took more than 10 s"));
    }

    // Filter bombs, still among the slow clients.
    let bombs = [
        ("10,000 nested parentheses", format!("{}display_name=\"a\"{}", "(".repeat(10_000), ")".repeat(10_000))),
        ("1,000 NOTs", format!("{}display_name=\"a\"", "NOT ".repeat(1_000))),
        (
            "4,000 nested parentheses (under the length limit)",
            format!("{}display_name=\"a\"{}", "(".repeat(4_000), ")".repeat(4_000)),
        ),
    ];
    let mut bomb_answers = Vec::new();
    for (what, filter) in &bombs {
        let url = format!("{}?filter={}", api.jobs_url(PROJECT), query_escape(filter));
        let t0 = Instant::now();
        let r = api.try_call("GET", &url, None);
        bomb_answers.push(format!("{what}: {} in {:?}", answer(&r).chars().take(160).collect::<String>(), t0.elapsed()));
        match &r {
            Ok((400, b)) if b["error"]["status"] == "INVALID_ARGUMENT" => {}
            _ => violations.push(format!(
                "filter of {what}: {} (want 400 INVALID_ARGUMENT)",
                answer(&r).chars().take(200).collect::<String>()
            )),
        }
        match healthz(&api) {
            Ok(200) => {}
            other => violations.push(format!("/healthz after the filter of {what}: {other:?}")),
        }
    }

    let idle_closed = idle.iter().filter(|t| closed_by_server(t)).count();
    drop(stop_guard);
    let slow_closed: u32 = slow.into_iter().map(|h| h.join().unwrap_or(0)).sum();
    drop(idle);
    match healthz(&api) {
        Ok(200) => {}
        other => violations.push(format!("/healthz at the end: {other:?}")),
    }

    println!("{TEST}: figures");
    println!(
        "  normal requests: {} (failed {}), p50 {:?}, p99 {:?}, max {:?} (bound 10 s each)",
        took.len(),
        failures.load(Ordering::SeqCst),
        percentile(&took, 0.50),
        percentile(&took, 0.99),
        took.last().copied().unwrap_or_default()
    );
    println!(
        "  idle connections closed by the server by the end: {idle_closed} of 200; slowloris connections closed: {slow_closed}"
    );
    for a in &bomb_answers {
        println!("  filter bomb: {a}");
    }
    assert_none(TEST, &violations, || format!("server log (tail):\n{}", tail(&s.server_log(), 40)));
}
