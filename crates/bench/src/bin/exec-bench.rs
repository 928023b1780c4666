//! `exec-bench`: what getting into a running job costs (`custom-jobs exec` and
//! `port-forward`), each against a baseline measured in the same run on the same replica:
//!
//! - `exec -- true` round trip (the CLI's start, the WebSocket, entering the replica, the
//!   command, its status) against a bare `nsenter` into the same namespaces as the same user
//!   (host programs);
//! - a terminal's keystroke echo (one byte to a session on a pty and its echo back) against
//!   the same byte through a TCP echo on loopback;
//! - port-forward: a 100 MB download and a small request's round trip from an HTTP server
//!   in the replica, through the forward and directly (the replica shares the host's
//!   network here).
//!
//! Printed: p50 and p99 of each, their ratios, and `bench-row:` lines for scripts/bench.

use std::io::{BufRead, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use trainyard_api::exec::frame;

const USAGE: &str = "\
usage: exec-bench [--quick] [--runs N] [--mb N]
  --runs N   round trips of each kind (default 20 for exec, 10x that for echo and requests)
  --mb N     megabytes downloaded through the forward and directly (default 100)
  --quick    few runs and 5 MB (a smoke test)
Build with `cargo build --release -p trainyard -p trainyard-bench`; the server is the
`trainyard` beside this program.";

struct Opts {
    runs: usize,
    mb: u64,
}

impl Opts {
    fn parse(args: &[String]) -> Result<Option<Opts>> {
        let mut o = Opts { runs: 20, mb: 100 };
        let mut it = args.iter();
        while let Some(a) = it.next() {
            match a.as_str() {
                "--runs" => o.runs = entry::number::<usize>(&mut it, "--runs")?.max(2),
                "--mb" => o.mb = entry::number::<u64>(&mut it, "--mb")?.max(1),
                "--quick" => {
                    o.runs = 5;
                    o.mb = 5;
                }
                "-h" | "--help" => return Ok(None),
                other => bail!("unknown argument {other:?}"),
            }
        }
        Ok(Some(o))
    }
}

#[path = "../shared/entry.rs"]
mod entry;

#[path = "../shared/row.rs"]
mod row;

#[path = "../shared/server.rs"]
mod server;

fn main() -> ExitCode {
    entry::main_of("exec-bench", USAGE, Opts::parse, run)
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn run(o: &Opts) -> Result<()> {
    let me = std::env::current_exe()?;
    let exe = me.parent().context("no directory")?.join("trainyard");
    let dir = tempfile::tempdir()?;
    let config = dir.path().join("trainyard.toml");
    std::fs::write(&config, "")?;
    let data = dir.path().join("data");
    let srv = server::Server::start(&exe, &config, &data, Duration::from_secs(60), |_| {})?;
    let port = server::free_port()?;
    // The files are the replica's own (a directory its user may read).
    let script = format!(
        "d=$(mktemp -d) && head -c {} /dev/zero > $d/big && echo ok > $d/small && \
         exec python3 -m http.server {port} --bind 127.0.0.1 --directory $d",
        o.mb * 1_000_000
    );
    let body = serde_json::json!({"displayName": "exec-bench", "jobSpec": {"workerPoolSpecs": [{
        "machineSpec": {"machineType": "n1-standard-4"}, "replicaCount": "1",
        "containerSpec": {"imageUri": "python:3.11", "command": ["sh", "-c", script]}}]}});
    let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
    let jobs = format!("{}/v1/projects/bench/locations/us-central1/customJobs", srv.base);
    let created: serde_json::Value = serde_json::from_str(&agent.post(&jobs).content_type("application/json").send(body.to_string())?.into_body().read_to_string()?)?;
    let name = created["name"].as_str().context("no job name")?.to_string();
    let id = name.rsplit('/').next().unwrap_or("").to_string();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let j: serde_json::Value = serde_json::from_str(&agent.get(&format!("{}/v1/{name}", srv.base)).call()?.into_body().read_to_string()?)?;
        if j["state"] == "JOB_STATE_RUNNING" && TcpStream::connect(("127.0.0.1", port)).is_ok() {
            break;
        }
        if Instant::now() > deadline {
            bail!("the job did not run its HTTP server: {j}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let cli = |args: &[&str]| {
        let mut c = Command::new(&exe);
        c.args(["custom-jobs"]).args(args).env("TRAINYARD_SERVER", &srv.base).env("TRAINYARD_PROJECT", "bench");
        c
    };

    // 1. exec -- true, against nsenter into the same namespaces as the same user.
    let run_dir = data.join("runs").join(&id).join("0").join("workerpool0-0").join("0");
    let pid = program_pid(&run_dir)?;
    let (uid, gid) = owner(pid)?;
    let mut ours = Vec::new();
    let mut bare = Vec::new();
    for i in 0..o.runs + 2 {
        let t = Instant::now();
        let st = cli(&["exec", &id, "--", "true"]).stdin(Stdio::null()).status()?;
        let a = t.elapsed();
        if !st.success() {
            bail!("exec -- true: {st}");
        }
        let t = Instant::now();
        let st = Command::new("nsenter")
            .args(["-t", &pid.to_string(), "--net", "--ipc", "--mount", "--cgroup", "-S", &uid.to_string(), "-G", &gid.to_string(), "--", "true"])
            .stdin(Stdio::null())
            .status()
            .context("nsenter (util-linux)")?;
        let b = t.elapsed();
        if !st.success() {
            bail!("nsenter: {st}");
        }
        // Two warm-up rounds of each.
        if i >= 2 {
            ours.push(ms(a));
            bare.push(ms(b));
        }
    }
    let (o50, o99, b50, b99) = (pct(&mut ours, 0.5), pct(&mut ours, 0.99), pct(&mut bare, 0.5), pct(&mut bare, 0.99));
    println!("exec -- true, {} runs: p50 {o50:.1} ms p99 {o99:.1} ms; bare nsenter p50 {b50:.1} ms p99 {b99:.1} ms", o.runs);
    row::row("exec-bench", "exec -- true round trip p99", &format!("{o99:.1} ms"), &format!("{b99:.1} ms (nsenter)"), o99 / b99);

    // 2. A keystroke's echo on a session's terminal, against a TCP echo on loopback.
    let echoes = o.runs * 10;
    let mut ws = session(&srv.base, &id)?;
    let mut keys = Vec::new();
    // The shell's prompt first, then `cat` reading each key as it comes and writing it
    // back (the terminal's own echo off): a key's way to the replica's program and back.
    wait_output(&mut ws, b"$ ", Duration::from_secs(10))?;
    ws.send(tungstenite::Message::Binary(frame(0, b"stty -icanon -echo; exec cat\r").into()))?;
    wait_output(&mut ws, b"\r\n", Duration::from_secs(10))?;
    std::thread::sleep(Duration::from_millis(300));
    for i in 0..echoes {
        let key = [b'a' + (i % 26) as u8];
        let t = Instant::now();
        ws.send(tungstenite::Message::Binary(frame(0, &key).into()))?;
        wait_output(&mut ws, &key, Duration::from_secs(10))?;
        keys.push(ms(t.elapsed()));
    }
    let _ = ws.close(None);
    let mut tcp = Vec::new();
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    std::thread::spawn(move || {
        if let Ok((mut c, _)) = listener.accept() {
            let mut b = [0u8; 64];
            while let Ok(n) = c.read(&mut b) {
                if n == 0 || c.write_all(&b[..n]).is_err() {
                    break;
                }
            }
        }
    });
    let mut c = TcpStream::connect(addr)?;
    c.set_nodelay(true)?;
    for _ in 0..echoes {
        let t = Instant::now();
        c.write_all(b"k")?;
        let mut b = [0u8; 1];
        c.read_exact(&mut b)?;
        tcp.push(ms(t.elapsed()));
    }
    let (k50, k99, t50, t99) = (pct(&mut keys, 0.5), pct(&mut keys, 0.99), pct(&mut tcp, 0.5), pct(&mut tcp, 0.99));
    println!("keystroke echo, {echoes} keys: p50 {k50:.2} ms p99 {k99:.2} ms; TCP echo on loopback p50 {t50:.3} ms p99 {t99:.3} ms");
    row::row("exec-bench", "terminal keystroke echo p99", &format!("{k99:.2} ms"), &format!("{t99:.3} ms (loopback TCP echo)"), k99 / t99);

    // 3. port-forward: throughput and a small request's round trip.
    let mut fwd = cli(&["port-forward", &id, &format!("0:{port}")]).stdout(Stdio::piped()).stderr(Stdio::null()).spawn()?;
    let mut line = String::new();
    std::io::BufReader::new(fwd.stdout.take().context("stdout")?).read_line(&mut line)?;
    let local: u16 = line.split_whitespace().nth(2).and_then(|a| a.rsplit(':').next()).and_then(|p| p.parse().ok()).context("the forward's port")?;
    let get = |p: u16, path: &str| -> Result<(usize, Duration)> {
        let t = Instant::now();
        let mut r = agent.get(&format!("http://127.0.0.1:{p}{path}")).call()?;
        let n = r.body_mut().with_config().limit(u64::MAX).read_to_vec()?.len();
        Ok((n, t.elapsed()))
    };
    // Warm both paths.
    get(local, "/small")?;
    get(port, "/small")?;
    let (n_fwd, d_fwd) = get(local, "/big")?;
    let (n_dir, d_dir) = get(port, "/big")?;
    if n_fwd != n_dir {
        bail!("the forward gave {n_fwd} bytes, the server {n_dir}");
    }
    let (mbs_fwd, mbs_dir) = (n_fwd as f64 / 1e6 / d_fwd.as_secs_f64(), n_dir as f64 / 1e6 / d_dir.as_secs_f64());
    println!("port-forward download of {} MB: {mbs_fwd:.0} MB/s; directly {mbs_dir:.0} MB/s", o.mb);
    row::row("exec-bench", "port-forward throughput", &format!("{mbs_fwd:.0} MB/s"), &format!("{mbs_dir:.0} MB/s (direct)"), mbs_fwd / mbs_dir);
    let mut small_fwd = Vec::new();
    let mut small_dir = Vec::new();
    for _ in 0..o.runs * 10 {
        small_fwd.push(ms(get(local, "/small")?.1));
        small_dir.push(ms(get(port, "/small")?.1));
    }
    let (f50, d50) = (pct(&mut small_fwd, 0.5), pct(&mut small_dir, 0.5));
    println!("a small request through the forward: p50 {f50:.2} ms (a new connection each, so a new session); directly {d50:.2} ms; added {:.2} ms", f50 - d50);
    row::row("exec-bench", "port-forward small request p50", &format!("{f50:.2} ms"), &format!("{d50:.2} ms (direct)"), f50 / d50);
    let _ = fwd.kill();
    let _ = fwd.wait();
    Ok(())
}

/// The replica's program, as its supervisor wrote it down.
fn program_pid(run_dir: &Path) -> Result<u32> {
    let started: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(run_dir.join("started.json")).context("started.json")?)?;
    started["pid"].as_u64().map(|p| p as u32).context("no pid in started.json")
}

/// The uid and gid a process runs as.
fn owner(pid: u32) -> Result<(u32, u32)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| status.lines().find(|l| l.starts_with(name)).and_then(|l| l.split_whitespace().nth(1)).and_then(|v| v.parse().ok());
    Ok((field("Uid:").context("Uid")?, field("Gid:").context("Gid")?))
}

type Ws = tungstenite::WebSocket<TcpStream>;

/// A terminal session with the replica's shell.
fn session(base: &str, id: &str) -> Result<Ws> {
    let host = base.trim_start_matches("http://");
    let url = format!("ws://{host}/v1/projects/bench/locations/us-central1/customJobs/{id}/exec?tty=true&cols=80&rows=24&term=dumb");
    let stream = TcpStream::connect(host)?;
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(Duration::from_millis(200)))?;
    let (ws, _) = tungstenite::client(url.as_str(), stream).map_err(|e| anyhow::anyhow!("the session's handshake: {e}"))?;
    Ok(ws)
}

/// Reads the session's output until it ends with `want` (what came before is dropped).
fn wait_output(ws: &mut Ws, want: &[u8], bound: Duration) -> Result<()> {
    let deadline = Instant::now() + bound;
    let mut seen = Vec::new();
    while Instant::now() < deadline {
        let msg = match ws.read() {
            Ok(m) => m,
            Err(tungstenite::Error::Io(e)) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => continue,
            Err(e) => return Err(e.into()),
        };
        match msg {
            tungstenite::Message::Binary(b) if b.first() == Some(&1) => {
                seen.extend_from_slice(&b[1..]);
                if seen.ends_with(want) {
                    return Ok(());
                }
            }
            tungstenite::Message::Binary(b) if b.first() == Some(&3) => bail!("the session ended: {}", String::from_utf8_lossy(&b[1..])),
            _ => {}
        }
    }
    bail!("no {:?} in the session's output: {:?}", String::from_utf8_lossy(want), String::from_utf8_lossy(&seen))
}
