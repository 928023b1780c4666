//! The web console in a real headless Chromium (Debian's `chromium`), driven over the
//! DevTools protocol on a pipe (`--remote-debugging-pipe`: no port, no WebSocket, no extra
//! crate): every page loads without an error banner or a Content-Security-Policy
//! violation, the jobs list pages past 100 and filters, the job page draws its timeline
//! and streams its log (one request, the reader's scroll position kept), the cancel button
//! asks first and then cancels (real mouse clicks), the study page plots its trials, the
//! pipeline page links its CustomJob, the nodes page shows GPUs and the queue, and errors
//! (API, JavaScript, unhandled rejections) reach the banner. Hangs (TY4) show as a badge
//! on the jobs list and on the job page with their time and text; a job page opens on its
//! log's newest lines and loads earlier ones on demand. Screenshots go to
//! `target/console-screenshots/`; the first paint of a job page with a 10,000-line log is
//! measured and printed (not asserted).
//!
//! Without chromium the test is skipped with a printed reason, and fails in CI (`CI=true`).

mod common;

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

const PROJECT: &str = "console";
const WIDTH: u64 = 1280;
const HEIGHT: u64 = 900;

/// The chromium binary: `$CHROMIUM`, else `chromium` or `chromium-browser` on the PATH.
fn find_chromium() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("CHROMIUM") {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH")?;
    for dir in std::env::split_paths(&path) {
        for name in ["chromium", "chromium-browser"] {
            let p = dir.join(name);
            if p.is_file() {
                return Some(p);
            }
        }
    }
    None
}

fn screenshot_dir() -> PathBuf {
    // CARGO_TARGET_TMPDIR is <target>/tmp.
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).parent().unwrap_or(Path::new("target")).join("console-screenshots");
    std::fs::create_dir_all(&dir).expect("screenshot directory");
    dir
}

// ---------------------------------------------------------------------------------------
// A DevTools-protocol client on chromium's pipe: messages are JSON texts ended by a NUL
// byte, chromium reads them on its fd 3 and writes on its fd 4.

struct Chrome {
    child: Child,
    to: File,
    from: Receiver<Value>,
    next: u64,
    session: String,
    /// Events seen while waiting for answers (exceptions, console and log entries).
    events: Vec<Value>,
    stderr: PathBuf,
    _profile: tempfile::TempDir,
}

/// A pipe whose two ends are close-on-exec and numbered 10 or more (so that dup2 onto 3
/// and 4 in the child cannot overwrite one with the other).
fn pipe_high() -> (OwnedFd, OwnedFd) {
    let mut fds = [0i32; 2];
    // SAFETY: pipe2 writes two fds into the array; fcntl duplicates fds we own.
    unsafe {
        assert_eq!(libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC), 0, "pipe2");
        let r = libc::fcntl(fds[0], libc::F_DUPFD_CLOEXEC, 10);
        let w = libc::fcntl(fds[1], libc::F_DUPFD_CLOEXEC, 10);
        assert!(r >= 10 && w >= 10, "fcntl");
        libc::close(fds[0]);
        libc::close(fds[1]);
        (OwnedFd::from_raw_fd(r), OwnedFd::from_raw_fd(w))
    }
}

impl Chrome {
    fn launch(bin: &Path, log_dir: &Path) -> Chrome {
        use std::os::fd::AsRawFd;
        let profile = tempfile::tempdir().expect("profile dir");
        let (cmd_r, cmd_w) = pipe_high(); // we write commands, chromium reads fd 3
        let (out_r, out_w) = pipe_high(); // chromium writes fd 4, we read
        let (child_in, child_out) = (cmd_r.as_raw_fd(), out_w.as_raw_fd());
        let stderr = log_dir.join("chromium.log");
        let mut cmd = Command::new(bin);
        cmd.args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-extensions",
            "--hide-scrollbars",
            "--mute-audio",
            "--remote-debugging-pipe",
            &format!("--window-size={WIDTH},{HEIGHT}"),
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg("about:blank")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(File::create(&stderr).expect("chromium log"));
        // SAFETY: only async-signal-safe calls (dup2) between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                if libc::dup2(child_in, 3) < 0 || libc::dup2(child_out, 4) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()));
        drop(cmd_r);
        drop(out_w);
        let (tx, rx) = std::sync::mpsc::channel();
        let mut reader = File::from(out_r);
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let mut chunk = vec![0u8; 1 << 16];
            loop {
                let n = match reader.read(&mut chunk) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                buf.extend_from_slice(&chunk[..n]);
                while let Some(end) = buf.iter().position(|b| *b == 0) {
                    let msg: Vec<u8> = buf.drain(..=end).collect();
                    if let Ok(v) = serde_json::from_slice::<Value>(&msg[..msg.len() - 1]) {
                        if tx.send(v).is_err() {
                            return;
                        }
                    }
                }
            }
        });
        let mut c = Chrome { child, to: File::from(cmd_w), from: rx, next: 0, session: String::new(), events: Vec::new(), stderr, _profile: profile };
        let target = c.send(None, "Target.createTarget", json!({"url": "about:blank"}));
        let target = target["targetId"].as_str().expect("targetId").to_string();
        let attached = c.send(None, "Target.attachToTarget", json!({"targetId": target, "flatten": true}));
        c.session = attached["sessionId"].as_str().expect("sessionId").to_string();
        for domain in ["Page.enable", "Runtime.enable", "Log.enable"] {
            c.call(domain, json!({}));
        }
        c.call("Emulation.setDeviceMetricsOverride", json!({"width": WIDTH, "height": HEIGHT, "deviceScaleFactor": 1, "mobile": false}));
        // Count the page's fetch() calls by URL (test instrumentation, before any script).
        c.call(
            "Page.addScriptToEvaluateOnNewDocument",
            json!({"source": "window.__fetches = []; const __f = window.fetch; window.fetch = function (u, o) { window.__fetches.push(String(u)); return __f.apply(this, arguments); };"}),
        );
        c
    }

    fn send(&mut self, session: Option<&str>, method: &str, params: Value) -> Value {
        self.next += 1;
        let id = self.next;
        let mut msg = json!({"id": id, "method": method, "params": params});
        if let Some(s) = session {
            msg["sessionId"] = json!(s);
        }
        let mut bytes = msg.to_string().into_bytes();
        bytes.push(0);
        self.to.write_all(&bytes).unwrap_or_else(|e| panic!("{method}: writing to chromium: {e}\n{}", self.log()));
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.from.recv_timeout(left) {
                Ok(v) if v["id"].as_u64() == Some(id) => {
                    if let Some(e) = v.get("error") {
                        panic!("{method} failed: {e}");
                    }
                    return v["result"].clone();
                }
                Ok(v) => self.events.push(v),
                Err(RecvTimeoutError::Timeout) => panic!("{method}: no answer from chromium in 60 s\n{}", self.log()),
                Err(RecvTimeoutError::Disconnected) => panic!("{method}: chromium went away\n{}", self.log()),
            }
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// A command to the page.
    fn call(&mut self, method: &str, params: Value) -> Value {
        let s = self.session.clone();
        self.send(Some(&s), method, params)
    }

    /// Evaluate `expr` in the page (promises awaited); its value, or a panic with the
    /// exception.
    fn eval(&mut self, expr: &str) -> Value {
        self.try_eval(expr).unwrap_or_else(|e| panic!("evaluating {expr}: {e}"))
    }

    /// Evaluate `expr`: its value, or the exception it threw.
    fn try_eval(&mut self, expr: &str) -> Result<Value, Value> {
        let r = self.call("Runtime.evaluate", json!({"expression": expr, "returnByValue": true, "awaitPromise": true}));
        match r.get("exceptionDetails") {
            Some(e) => Err(e.clone()),
            None => Ok(r["result"]["value"].clone()),
        }
    }

    /// Poll `expr` until it is truthy; its value. An exception counts as not yet (the
    /// page renders after its fetches: an element may not be there at the first look).
    /// Panics naming `what`, with the page's banner and errors, after `secs`.
    fn wait_for(&mut self, what: &str, expr: &str, secs: u64) -> Value {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let (v, threw) = match self.try_eval(expr) {
                Ok(v) => (v, false),
                Err(e) => (json!({ "exception": e }), true),
            };
            let truthy = match &v {
                _ if threw => false,
                Value::Null => false,
                Value::Bool(b) => *b,
                Value::Number(n) => n.as_f64() != Some(0.0),
                Value::String(s) => !s.is_empty(),
                _ => true,
            };
            if truthy {
                return v;
            }
            if Instant::now() > deadline {
                let banner = self.eval("document.getElementById('banner').innerText");
                let view = self.eval("document.getElementById('view').innerText.slice(0, 2000)");
                panic!("waited {secs} s for {what} ({expr}): got {v}\nbanner: {banner}\npage: {view}\nerrors: {:?}", self.errors());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Load `url` afresh (through about:blank, so that a hash route is a new document).
    fn open(&mut self, url: &str) {
        self.call("Page.navigate", json!({"url": "about:blank"}));
        self.call("Page.navigate", json!({"url": url}));
        self.wait_for("the console's script", "typeof route === 'function' && document.readyState === 'complete'", 30);
    }

    /// A real mouse click on the middle of the element `selector`.
    fn click(&mut self, selector: &str) {
        let sel = serde_json::to_string(selector).unwrap();
        let at = self.eval(&format!(
            "(() => {{ const e = document.querySelector({sel}); if (!e) return null; e.scrollIntoView({{block: 'center'}}); \
             const r = e.getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; }})()"
        ));
        let (x, y) = match (at[0].as_f64(), at[1].as_f64()) {
            (Some(x), Some(y)) => (x, y),
            _ => panic!("no element {selector} to click"),
        };
        for kind in ["mouseMoved", "mousePressed", "mouseReleased"] {
            self.call("Input.dispatchMouseEvent", json!({"type": kind, "x": x, "y": y, "button": "left", "clickCount": 1}));
        }
    }

    /// A real click on `selector` until `expr` holds: clicked again (while the element is
    /// there) when nothing came of a click within 5 s, for a page still laying itself out
    /// (a pane that scrolls as lines arrive can move the element between the measure and
    /// the press). Panics like `wait_for` after `secs`.
    fn click_until(&mut self, selector: &str, what: &str, expr: &str, secs: u64) {
        let deadline = Instant::now() + Duration::from_secs(secs);
        let sel = serde_json::to_string(selector).unwrap();
        loop {
            self.click(selector);
            let retry_at = Instant::now() + Duration::from_secs(5);
            while Instant::now() < retry_at.min(deadline) {
                if self.try_eval(expr).is_ok_and(|v| v == json!(true)) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            let there = self.eval(&format!("!!document.querySelector({sel})")) == json!(true);
            if Instant::now() >= deadline || !there {
                self.wait_for(what, expr, 1);
                return;
            }
        }
    }

    /// A PNG of the whole page (up to 4000 px tall) in target/console-screenshots: the
    /// window is made as tall as the page for the shot (captureBeyondViewport would not
    /// keep the log pane's scroll position), then set back.
    fn screenshot(&mut self, name: &str) -> PathBuf {
        // From the top: the header is sticky, and a click may have scrolled the page.
        self.eval("window.scrollTo(0, 0)");
        let mut h = HEIGHT;
        for _ in 0..3 {
            let metrics = self.call("Page.getLayoutMetrics", json!({}));
            let content = metrics["cssContentSize"]["height"].as_f64().unwrap_or(HEIGHT as f64).clamp(HEIGHT as f64, 4000.0) as u64;
            if content <= h {
                break;
            }
            h = content;
            self.call("Emulation.setDeviceMetricsOverride", json!({"width": WIDTH, "height": h, "deviceScaleFactor": 1, "mobile": false}));
            std::thread::sleep(Duration::from_millis(250));
        }
        let shot = self.call("Page.captureScreenshot", json!({"format": "png"}));
        if h != HEIGHT {
            self.call("Emulation.setDeviceMetricsOverride", json!({"width": WIDTH, "height": HEIGHT, "deviceScaleFactor": 1, "mobile": false}));
        }
        let png = base64_decode(shot["data"].as_str().expect("screenshot data"));
        assert!(png.starts_with(b"\x89PNG"), "not a PNG");
        let path = screenshot_dir().join(format!("{name}.png"));
        std::fs::write(&path, png).expect("write screenshot");
        path
    }

    /// Exceptions, console errors and CSP reports seen so far (favicon 404s left out),
    /// and forget them.
    fn errors(&mut self) -> Vec<String> {
        // Collect what arrived without an answer to wait for.
        while let Ok(v) = self.from.try_recv() {
            self.events.push(v);
        }
        let mut out = Vec::new();
        for e in self.events.drain(..) {
            let p = &e["params"];
            match e["method"].as_str() {
                Some("Runtime.exceptionThrown") => {
                    let d = &p["exceptionDetails"];
                    out.push(format!("exception: {}", d["exception"]["description"].as_str().or(d["text"].as_str()).unwrap_or("?")));
                }
                Some("Runtime.consoleAPICalled") if p["type"] == "error" => out.push(format!("console.error: {}", p["args"])),
                Some("Log.entryAdded") => {
                    let entry = &p["entry"];
                    let text = entry["text"].as_str().unwrap_or("");
                    let url = entry["url"].as_str().unwrap_or("");
                    if (entry["level"] == "error" || text.contains("Content Security Policy")) && !url.ends_with("/favicon.ico") {
                        out.push(format!("{}: {text} ({url})", entry["source"].as_str().unwrap_or("log")));
                    }
                }
                _ => {}
            }
        }
        out
    }

    fn assert_clean(&mut self, page: &str) {
        let banner_hidden = self.eval("document.getElementById('banner').hidden");
        let banner = self.eval("document.getElementById('banner').innerText");
        assert_eq!(banner_hidden, json!(true), "{page}: the error banner shows: {banner}");
        let errors = self.errors();
        assert!(errors.is_empty(), "{page}: errors in the page: {errors:#?}");
    }

    fn count(&mut self, selector: &str) -> u64 {
        let sel = serde_json::to_string(selector).unwrap();
        self.eval(&format!("document.querySelectorAll({sel}).length")).as_u64().unwrap_or(0)
    }
}

impl Drop for Chrome {
    fn drop(&mut self) {
        self.next += 1;
        let msg = format!("{{\"id\":{},\"method\":\"Browser.close\",\"params\":{{}}}}\0", self.next);
        let _ = self.to.write_all(msg.as_bytes());
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn base64_decode(text: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in text.bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => continue,
        };
        acc = (acc << 6) | v as u32;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    out
}

// ---------------------------------------------------------------------------------------
// The jobs the pages show.

/// A trial program: `accuracy = 1 - (x - 0.3)^2` at three steps (cloudml-hypertune file).
const TRIAL: &str = r#"
import json, os, sys, time
args = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--"))
x = float(args["x"])
path = os.environ["CLOUD_ML_HP_METRIC_FILE"]
lines = []
for step in (1, 2, 3):
    acc = 1 - (x - 0.3) ** 2 - 0.01 * (3 - step)
    lines.append(json.dumps({"global_step": str(step), "accuracy": str(acc), "timestamp": time.time()}))
    with open(path + ".tmp", "w") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(path + ".tmp", path)
    time.sleep(0.05)
print("trial", os.environ["CLOUD_ML_TRIAL_ID"], "x", x)
"#;

fn study() -> Value {
    json!({
        "displayName": "console-study",
        "studySpec": {
            "metrics": [{"metricId": "accuracy", "goal": "MAXIMIZE"}],
            "parameters": [
                {"parameterId": "x", "doubleValueSpec": {"minValue": 0.0, "maxValue": 1.0}, "scaleType": "UNIT_LINEAR_SCALE"},
                {"parameterId": "layers", "integerValueSpec": {"minValue": "1", "maxValue": "4"}}
            ],
            "algorithm": "RANDOM_SEARCH"
        },
        "maxTrialCount": 5,
        "parallelTrialCount": 2,
        "trialJobSpec": {
            "workerPoolSpecs": [{
                "machineSpec": {"machineType": "n1-standard-4"}, "replicaCount": "1",
                "containerSpec": {"imageUri": "python:3.11", "command": ["python3", "-c", TRIAL]}
            }],
            "baseOutputDirectory": {"outputUriPrefix": "gs://bucket/console-study"}
        }
    })
}

/// Two pools; each replica of the second is killed (SIGKILL) on its first two runs and
/// then succeeds: restarts (L11) on the timeline.
fn restarts_job(dir: &Path) -> Value {
    let worker = format!(
        "f={}/restart-marker-$RANK; n=$(cat $f 2>/dev/null || echo 0); echo $((n+1)) > $f; echo worker run $n; sleep 0.3; \
         if [ $n -lt 2 ]; then echo dying >&2; kill -9 $$; fi; sleep 1; echo worker done; touch {}/worker-done-$RANK",
        dir.display(),
        dir.display()
    );
    // The primary ends the job (L17): it waits for both workers' last runs (at most 60 s),
    // which on a busy machine may end after its own ten steps.
    let chief = format!(
        "for i in 1 2 3 4 5 6 7 8 9 10; do echo step $i; sleep 0.3; done; \
         for i in $(seq 600); do [ $(ls {}/worker-done-* 2>/dev/null | wc -l) -ge 2 ] && break; sleep 0.1; done",
        dir.display()
    );
    json!({
        "displayName": "restarts",
        "jobSpec": {"workerPoolSpecs": [
            {"machineSpec": {"machineType": "n1-standard-4"}, "replicaCount": "1",
             "containerSpec": {"imageUri": "python:3.11", "command": ["sh", "-c", chief]}},
            {"machineSpec": {"machineType": "n1-standard-4"}, "replicaCount": "2",
             "containerSpec": {"imageUri": "python:3.11", "command": ["sh", "-c", worker]}}
        ]}
    })
}

fn gpu_job(name: &str, gpus: u32, script: &str) -> Value {
    json!({"displayName": name, "jobSpec": {"workerPoolSpecs": [{
        "machineSpec": {"machineType": format!("a2-highgpu-{gpus}g"), "acceleratorType": "NVIDIA_TESLA_A100", "acceleratorCount": gpus},
        "replicaCount": "1",
        "containerSpec": {"imageUri": "python:3.11", "command": ["sh", "-c", script]}}]}})
}

/// A server whose PATH finds the tests' fake nvidia-smi (4 x A100, NVLink pairs).
fn server_with_gpus() -> Server {
    let mut s = Server::prepare("");
    let bin = s.dir.path().join("fake-gpu-bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::copy(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/fake-nvidia-smi"), bin.join("nvidia-smi")).unwrap();
    let devices: String = (0..4)
        .map(|i| format!("{i}, GPU-cccccccc-0000-0000-0000-00000000000{i}, NVIDIA A100-SXM4-40GB, 40960, 00000000:{:02X}:00.0\n", 7 + i * 4))
        .collect();
    std::fs::write(bin.join("devices.csv"), devices).unwrap();
    std::fs::write(
        bin.join("topo.txt"),
        "\tGPU0\tGPU1\tGPU2\tGPU3\tCPU Affinity\tNUMA Affinity\nGPU0\t X \tNV12\tSYS\tSYS\t0-31\t0\nGPU1\tNV12\t X \tSYS\tSYS\t0-31\t0\n\
         GPU2\tSYS\tSYS\t X \tNV12\t32-63\t1\nGPU3\tSYS\tSYS\tNV12\t X \t32-63\t1\n",
    )
    .unwrap();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    s.env.push(("PATH".into(), path));
    s.spawn();
    s
}

fn job_id(job: &Value) -> String {
    id_of(job).to_string()
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    v[v.len() / 2]
}

// ---------------------------------------------------------------------------------------

/// One browser at a time: the tests of this file share the machine's cores with their
/// servers and replicas, and some of them follow live logs against deadlines.
static ONE_BROWSER: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Chromium and the turn to use it, or None when the test is to be skipped (said why).
fn browser_turn() -> Option<(PathBuf, std::sync::MutexGuard<'static, ()>)> {
    let Some(chromium) = find_chromium() else {
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            panic!("chromium is not installed, and CI needs it for the console tests: apt-get install chromium (.ci/run installs it), or set CHROMIUM=/path/to/chromium");
        }
        eprintln!("SKIP console_e2e: chromium is not installed (Debian: apt-get install chromium; or set CHROMIUM=/path/to/chromium)");
        return None;
    };
    if skip_on_slurm("the console test uses a fake nvidia-smi on the local backend") || skip_in_containers("the console test runs host processes") {
        return None;
    }
    // A test that failed while holding the turn does not stop the others.
    Some((chromium, ONE_BROWSER.lock().unwrap_or_else(|e| e.into_inner())))
}

#[test]
fn console_in_headless_chromium() {
    let Some((chromium, _turn)) = browser_turn() else { return };
    let s = server_with_gpus();
    let dir = s.dir.path().to_path_buf();

    // The data: jobs that end quickly first, a study, a pipeline, a 10,000-line log, a
    // live job to follow and cancel, a failed job, GPU holders and a job waiting for GPUs,
    // and 101 jobs in another project for paging.
    let restarts = s.create(PROJECT, &restarts_job(&dir));
    let big = s.create(PROJECT, &sh_job("ten-thousand-lines", "seq -f 'log line %g of 10000: the quick brown fox jumps over the lazy dog' 1 10000"));
    let failed = s.create(PROJECT, &sh_job("fails", "echo about to fail; echo 'Traceback: boom' >&2; exit 3"));
    let live = s.create(PROJECT, &sh_job("live", "i=0; while true; do i=$((i+1)); echo tick $i; sleep 0.02; done"));
    let (st, study) = s.call("POST", &s.url(&format!("/v1/projects/{PROJECT}/locations/us-central1/hyperparameterTuningJobs")), Some(&study().to_string()));
    assert_eq!(st, 200, "{study}");
    let pipeline_body = json!({
        "displayName": "console-pipeline",
        "trainingTaskDefinition": "gs://google-cloud-aiplatform/schema/trainingjob/definition/custom_task_1.0.0.yaml",
        "trainingTaskInputs": {"worker_pool_specs": [{
            "containerSpec": {"imageUri": "python:3.11", "command": ["sh", "-c", "echo training; sleep 0.2; echo done"]},
            "machine_spec": {"machine_type": "n1-standard-4"}, "replica_count": 1.0}]}
    });
    let (st, pipeline) = s.call("POST", &s.url(&format!("/v1/projects/{PROJECT}/locations/us-central1/trainingPipelines")), Some(&pipeline_body.to_string()));
    assert_eq!(st, 200, "{pipeline}");
    for i in 0..101 {
        s.create("paging", &sh_job(&format!("page-{i:03}"), "exit 0"));
    }
    for j in [&restarts, &big, &failed] {
        s.wait_terminal(&name_of(j), 90);
    }
    s.wait_for(&name_of(&live), 30, |j| j["state"] == "JOB_STATE_RUNNING");
    assert_eq!(s.get(&name_of(&restarts))["state"], "JOB_STATE_SUCCEEDED", "{}", s.logs_text(&name_of(&restarts)));
    let study_name = study["name"].as_str().unwrap().to_string();
    let pname = pipeline["name"].as_str().unwrap().to_string();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let (j, p) = (s.get(&study_name), s.get(&pname));
        if j["state"] == "JOB_STATE_SUCCEEDED" && p["state"] == "PIPELINE_STATE_SUCCEEDED" {
            break;
        }
        assert!(Instant::now() < deadline, "the study and the pipeline did not succeed: {j:#}\n{p:#}\n{}", s.server_log());
        std::thread::sleep(Duration::from_millis(200));
    }
    // Last, so that nothing else waits behind it: a job holding 2 of the 4 GPUs, and one
    // that needs all 4 and waits.
    let holder = s.create(PROJECT, &gpu_job("gpu-holder", 2, "echo holding $CUDA_VISIBLE_DEVICES; sleep 600"));
    s.wait_for(&name_of(&holder), 30, |j| j["state"] == "JOB_STATE_RUNNING");
    let waiter = s.create(PROJECT, &gpu_job("gpu-waiter", 4, "sleep 1"));

    let mut c = Chrome::launch(&chromium, dir.as_path());
    let root = s.url(&format!("/?project={PROJECT}&region=us-central1"));

    // -- The jobs list: state counts, columns, filter, chips. ------------------------------
    c.open(&format!("{root}#/jobs"));
    c.wait_for("the jobs table", "document.querySelectorAll('table.list tr.row').length >= 6", 30);
    let all = c.wait_for("the state counts", "(document.querySelector('#state-chips a.chip.all b') || {}).textContent", 30);
    let listed = c.count("table.list tr.row");
    assert_eq!(all, json!(listed.to_string()), "the All chip counts every job of the project");
    let headers = c.eval("[...document.querySelectorAll('table.list th')].map(t => t.textContent.trim().toLowerCase()).join(',')");
    assert_eq!(headers, json!("name,display name,state,created,started,ended,elapsed"));
    assert!(c.count("#state-chips a.chip[data-state=FAILED]") == 1 && c.count("#state-chips a.chip[data-state=RUNNING]") == 1);
    c.assert_clean("jobs list");
    c.screenshot("01-jobs");
    // A state chip filters (state="JOB_STATE_FAILED" sent as the filter).
    c.click("#state-chips a.chip[data-state=FAILED]");
    c.wait_for("the failed jobs", "location.hash.includes('state=FAILED') && document.getElementById('filter-sent') !== null", 10);
    c.wait_for("only failed rows", "(() => { const r = [...document.querySelectorAll('table.list tr.row')]; return r.length > 0 && r.every(tr => tr.querySelector('.st').textContent === 'failed'); })()", 10);
    assert_eq!(c.eval("document.getElementById('filter-sent').textContent"), json!("state=\"JOB_STATE_FAILED\" AND (NOT labels.trainyard_study:*)"));
    // The AIP-160 filter box.
    c.eval("(() => { const i = document.querySelector('input.filter'); i.value = 'display_name:\"restarts\"'; i.form.requestSubmit(); })()");
    c.wait_for("the filtered list", "location.hash.includes('filter=') && (document.querySelector('table.list td.empty') || {}).textContent === 'No job matches this filter.'", 10);
    c.open(&format!("{root}#/jobs?filter={}", "display_name%3A%22restarts%22"));
    c.wait_for("one job named restarts", "(() => { const r = document.querySelectorAll('table.list tr.row'); return r.length === 1 && r[0].textContent.includes('restarts'); })()", 10);
    c.assert_clean("jobs list, filtered");

    // -- Paging past 100 with pageToken/nextPageToken. --------------------------------------
    c.open(&s.url("/?project=paging#/jobs"));
    c.wait_for("the first page", "document.querySelectorAll('table.list tr.row').length === 100", 30);
    c.wait_for("101 counted", "(document.querySelector('#state-chips a.chip.all b') || {}).textContent === '101'", 30);
    assert_eq!(c.eval("document.querySelector('button.next').disabled"), json!(false));
    c.click("button.next");
    c.wait_for("the second page", "document.querySelectorAll('table.list tr.row').length === 1", 10);
    assert_eq!(c.eval("document.querySelector('table.list tr.row td:nth-child(2)').textContent"), json!("page-000"), "the oldest job is on page 2");
    assert!(c.eval("window.__fetches.some(u => u.includes('pageToken='))").as_bool().unwrap_or(false));
    c.screenshot("02-jobs-page-2");
    c.click("button.prev");
    c.wait_for("the first page again", "document.querySelectorAll('table.list tr.row').length === 100", 10);
    c.assert_clean("jobs list, paging");

    // -- A job with restarts: fields, timeline, transitions, log, replica filter. ----------
    let rid = job_id(&restarts);
    c.open(&format!("{root}#/jobs/{rid}"));
    c.wait_for("the whole log", "((document.getElementById('log-status') || {}).textContent || '').startsWith('ended')", 30);
    c.wait_for("the timeline's bars", "document.querySelectorAll('#timeline svg rect.seg').length >= 7", 10);
    assert!(c.count("#timeline svg rect.seg-restarted") >= 4, "two restarts of each of two replicas");
    assert!(c.count("#timeline svg rect.seg-ok") >= 3, "every replica's last run succeeded");
    assert!(c.count("#timeline svg g.mk[data-rule~=L11]") >= 2, "L11 markers");
    // Every rule label is inside the drawing (the job's last ones are at its right edge).
    let clipped = c.eval("(svg => [...svg.querySelectorAll('text.rule')].filter(t => { const b = t.getBBox(); return b.x < 0 || b.x + b.width > svg.width.baseVal.value; }).map(t => t.textContent))(document.querySelector('#timeline svg'))");
    assert_eq!(clipped, json!([]), "rule labels cut at the edge");
    // The same for a job whose last events cluster at the right edge (preempted and
    // started again just before it ended): its long label goes left of its marker.
    let edge = c.eval(r#"(() => {
      const m = new TimelineModel(), t0 = Date.parse("2026-01-01T00:00:00Z"), at = (ms) => new Date(t0 + ms).toISOString();
      const ev = (ms, rule, text) => ({ time: at(ms), stream: "event", replica: "service", attempt: 0, restart: 0, text: `${rule}: ${text}`, rule });
      [ev(0, "L3", "Job queued."), ev(60000, "L15", "Preempted."), ev(60001, "L5", "Admitted."), ev(60002, "L6", "Provisioning."), ev(60003, "L7", "Running.")].forEach((e) => m.add(e));
      const box = document.createElement("div");
      box.style.width = "800px";
      document.body.append(box);
      drawTimeline(box, document.createElement("div"), m, { createTime: at(0), endTime: at(60003), state: "JOB_STATE_SUCCEEDED" });
      const svg = box.querySelector("svg");
      const out = [...svg.querySelectorAll("text.rule")].map((t) => { const b = t.getBBox(); return `${t.textContent}:${b.x >= 0 && b.x + b.width <= svg.width.baseVal.value}`; });
      box.remove();
      return out.join(",");
    })()"#);
    assert_eq!(edge, json!("L3:true,L15·L5·L6·L7:true"), "a label at the right edge");
    assert!(c.count("#timeline svg rect.ph-running") >= 1, "the job row shows running");
    let rows = c.eval("[...document.querySelectorAll('#timeline svg text.label')].map(t => t.textContent).join(',')");
    assert_eq!(rows, json!("job,workerpool0-0,workerpool1-0,workerpool1-1"));
    let transitions = c.eval("document.querySelector('details.transitions').textContent");
    let transitions = transitions.as_str().unwrap_or("");
    assert!(transitions.contains("L11") && transitions.contains("restarting it (2 of 5)") && transitions.contains("L17"), "{transitions}");
    let lines = c.count("#log .l");
    assert!(lines >= 20, "log lines shown: {lines}");
    assert!(c.eval("document.getElementById('log').textContent").as_str().unwrap_or("").contains("worker done"));
    // A long line wraps between words, a word only when it is longer than the line.
    let wrap = c.eval("(s => s.wordBreak + ' ' + s.overflowWrap)(getComputedStyle(document.querySelector('#log .l')))");
    assert_eq!(wrap, json!("normal anywhere"), "log lines wrapped mid-word");
    c.eval("document.querySelector('details.transitions').open = true");
    c.assert_clean("job page with restarts");
    c.screenshot("03-job-restarts");
    // The per-replica filter asks the logs API for that replica only.
    c.eval("(() => { const s = document.getElementById('replica-filter'); s.value = 'workerpool1-0'; s.dispatchEvent(new Event('change')); })()");
    c.wait_for("the replica's log", "document.getElementById('log-status').textContent.startsWith('ended') && document.querySelectorAll('#log .l').length > 0 && [...document.querySelectorAll('#log .l .r')].every(r => /workerpool1-0|service/.test(r.textContent))", 20);
    assert!(c.eval("window.__fetches.some(u => u.includes('/logs?follow=true&replica=workerpool1-0'))").as_bool().unwrap_or(false));
    assert!(c.count("#log .l") < lines, "fewer lines for one replica");
    assert!(c.count("#timeline svg rect.seg") >= 7, "the timeline keeps every replica");
    c.assert_clean("job page, one replica");

    // -- A failed job: its error. ------------------------------------------------------------
    c.open(&format!("{root}#/jobs/{}", job_id(&failed)));
    c.wait_for("the error", "(document.getElementById('job-error') || {}).textContent", 20);
    let error = c.eval("document.getElementById('job-error').textContent");
    assert!(error.as_str().unwrap_or("").contains("non-zero status of 3"), "{error}");
    // The code by name, not a number that means nothing to a user.
    assert!(error.as_str().unwrap_or("").starts_with("INVALID_ARGUMENT (3): "), "{error}");
    c.wait_for("the failed bar", "document.querySelectorAll('#timeline svg rect.seg-failed').length === 1", 20);
    // TY10: where its time went, as one bar and in words.
    c.wait_for("the goodput", "document.querySelectorAll('#goodput .goodput-bar .seg').length === 5", 20);
    let goodput = c.eval("document.getElementById('goodput').textContent");
    assert!(goodput.as_str().unwrap_or("").contains("% productive"), "{goodput}");
    c.assert_clean("failed job page");
    c.screenshot("04-job-failed");

    // -- First paint of a job page with a 10,000-line log (printed, not asserted): the
    //    page opens on the newest 1,000 lines (tail=1000); the whole log, as the console
    //    read it before, once for comparison. ---------------------------------------------
    let bid = job_id(&big);
    // Times after navigation start: first paint and first contentful paint (the browser's
    // paint timing), the job's fields on the page, its first log lines, the logs
    // response's end, the log's lines in the page (the console's own performance marks),
    // and the timeline's read of the whole log.
    let keys = ["fp", "fcp", "job", "first", "response", "complete", "history"];
    let measure = "(() => { const p = {}; for (const e of performance.getEntriesByType('paint')) p[e.name] = e.startTime; \
         const mark = (n) => (performance.getEntriesByName(n)[0] || {}).startTime; \
         const logs = performance.getEntriesByType('resource').find(e => e.name.includes('/logs?follow=true')); \
         return {fp: p['first-paint'], fcp: p['first-contentful-paint'], job: mark('trainyard:job-shown'), first: mark('trainyard:log-first'), \
         response: logs && logs.responseEnd, complete: mark('trainyard:log-complete'), history: mark('trainyard:history-complete'), \
         out: document.querySelectorAll('#log .l.out').length, lines: document.querySelectorAll('#log .l').length, \
         last: ([...document.querySelectorAll('#log .l.out')].pop() || {}).textContent}; })()";
    let mut runs: Vec<Vec<f64>> = vec![Vec::new(); keys.len()];
    for run in 0..3 {
        c.open(&format!("{root}#/jobs/{bid}"));
        c.wait_for("the log's tail and the timeline's whole log", "performance.getEntriesByName('trainyard:log-complete').length > 0 && performance.getEntriesByName('trainyard:history-complete').length > 0", 60);
        let m = c.eval(measure);
        assert_eq!(m["lines"], json!(1000), "the newest 1,000 entries are shown: {m}");
        assert!(m["last"].as_str().unwrap_or("").ends_with("log line 10000 of 10000: the quick brown fox jumps over the lazy dog"), "{m}");
        for (i, k) in keys.iter().enumerate() {
            runs[i].push(m[k].as_f64().unwrap_or(f64::NAN));
        }
        println!(
            "console: job page with a 10,000-line log opening on its last 1,000, load {}: first paint {:.0} ms, first contentful paint {:.0} ms, job fields {:.0} ms, first log lines {:.0} ms, logs response ended {:.0} ms, {} lines in the page {:.0} ms, timeline's whole log read {:.0} ms",
            run + 1, runs[0][run], runs[1][run], runs[2][run], runs[3][run], runs[4][run], m["lines"], runs[5][run], runs[6][run]
        );
    }
    let med: Vec<f64> = runs.iter_mut().map(|v| median(v)).collect();
    println!(
        "console: 10,000-line job page opening on its last 1,000 lines, median of 3 loads: first paint {:.0} ms (goal < 500 ms), first contentful paint {:.0} ms, job fields {:.0} ms, first log lines {:.0} ms, the 1,000 lines in the page {:.0} ms, timeline's whole log {:.0} ms",
        med[0], med[1], med[2], med[3], med[5], med[6]
    );
    // The timeline counts every line, also those the pane did not load.
    c.wait_for("the timeline's count of every line", "((document.querySelector('#timeline rect.seg title') || {}).textContent || '').includes('10000 log lines')", 10);
    c.assert_clean("10,000-line job page");
    c.screenshot("05-job-10000-lines");
    // The whole log, as before tails.
    c.eval("localStorage.setItem('trainyard.logTail', 'all')");
    c.open(&format!("{root}#/jobs/{bid}"));
    c.wait_for("all 10,000 lines", "performance.getEntriesByName('trainyard:log-complete').length > 0", 60);
    let m = c.eval(measure);
    assert_eq!(m["out"], json!(10000), "every stdout line is shown: {m}");
    assert_eq!(c.eval("window.__fetches.filter(u => u.includes('/logs')).join(' ')"), json!(format!("/v1/{}/logs?follow=true", name_of(&big))), "one request, no tail");
    println!(
        "console: the same page reading the whole log: first paint {:.0} ms, first log lines {:.0} ms, all {} lines in the page {:.0} ms",
        m["fp"].as_f64().unwrap_or(f64::NAN), m["first"].as_f64().unwrap_or(f64::NAN), m["lines"], m["complete"].as_f64().unwrap_or(f64::NAN)
    );
    c.eval("localStorage.removeItem('trainyard.logTail')");
    c.assert_clean("10,000-line job page, whole log");

    // -- A live job: the log follows by streaming (one request), the reader's position is
    //    kept unless at the bottom; cancel asks first, then cancels. -----------------------
    let lid = job_id(&live);
    c.open(&format!("{root}#/jobs/{lid}"));
    c.wait_for("a screenful of live lines", "document.querySelectorAll('#log .l.out').length >= 120", 30);
    let at_bottom = "(() => { const l = document.getElementById('log'); return l.scrollHeight - l.scrollTop - l.clientHeight < 24; })()";
    c.wait_for("the pane to follow the newest line", at_bottom, 10);
    // The reader scrolls up: new lines come, the position stays.
    c.eval("document.getElementById('log').scrollTop = 40");
    let n = c.count("#log .l.out");
    c.wait_for("more lines while scrolled up", &format!("document.querySelectorAll('#log .l.out').length >= {}", n + 50), 20);
    assert_eq!(c.eval("document.getElementById('log').scrollTop"), json!(40), "the reader's position is kept");
    // Back at the bottom, the pane follows again.
    c.eval("(() => { const l = document.getElementById('log'); l.scrollTop = l.scrollHeight; })()");
    let n = c.count("#log .l.out");
    c.wait_for("more lines at the bottom", &format!("document.querySelectorAll('#log .l.out').length >= {}", n + 50), 20);
    c.wait_for("the pane to follow again", at_bottom, 5);
    // One followed stream (besides, once the log is longer than the pane's 1,000 lines, one
    // read of the whole log for the timeline, not followed).
    let streams = c.eval(&format!("window.__fetches.filter(u => u.includes('/customJobs/{lid}/logs?follow=true')).length"));
    assert_eq!(streams, json!(1), "the log is one followed stream, never downloaded again");
    let reads = c.eval(&format!("window.__fetches.filter(u => u.includes('/customJobs/{lid}/logs') && !u.includes('follow=true')).length"));
    assert!(reads.as_u64().unwrap_or(9) <= 1, "at most one more read, for the timeline: {reads}");
    let shown = c.eval("[...document.querySelectorAll('#log .l.out')].map(l => +l.lastChild.textContent.replace('tick ', ''))");
    let ticks: Vec<u64> = shown.as_array().unwrap().iter().filter_map(Value::as_u64).collect();
    assert!(ticks.windows(2).all(|w| w[1] == w[0] + 1) && !ticks.is_empty(), "every line once, in order: {ticks:?}");
    assert!(c.count("#timeline svg rect.seg-live") == 1 && c.count("#timeline svg line.now") == 1, "a running bar up to now");
    c.assert_clean("live job page");
    c.screenshot("06-job-live");
    // Cancel, but say no: nothing happens.
    c.click("#cancel");
    c.wait_for("the confirmation", "!document.getElementById('cancel-confirm').hidden", 5);
    c.click("#cancel-no");
    c.wait_for("the confirmation to close", "document.getElementById('cancel-confirm').hidden", 5);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(s.get(&name_of(&live))["state"], "JOB_STATE_RUNNING", "no cancel without confirmation");
    // Cancel and confirm.
    c.click("#cancel");
    c.wait_for("the confirmation", "!document.getElementById('cancel-confirm').hidden", 5);
    c.screenshot("07-cancel-confirmation");
    c.click("#cancel-yes");
    let done = s.wait_terminal(&name_of(&live), 30);
    assert_eq!(done["state"], "JOB_STATE_CANCELLED", "{done}");
    c.wait_for("the cancelled job", "document.querySelector('.head .st').textContent === 'cancelled' && document.getElementById('log-status').textContent.startsWith('ended')", 20);
    assert_eq!(c.eval("document.getElementById('cancel').disabled"), json!(true));
    assert!(c.eval("document.getElementById('log').textContent").as_str().unwrap_or("").contains("Job cancelled."));
    c.wait_for("the cancelled bar", "document.querySelectorAll('#timeline svg rect.seg-cancelled').length === 1", 10);
    c.assert_clean("cancelled job page");
    c.screenshot("08-job-cancelled");

    // -- Tuning: the list, the study with its plot, best-so-far line and measurements. -----
    c.open(&format!("{root}#/tuning"));
    c.wait_for("the tuning jobs", "document.querySelectorAll('table.list tr.row').length === 1", 20);
    c.assert_clean("tuning list");
    c.screenshot("09-tuning-list");
    let sid = lastseg(&study_name);
    c.open(&format!("{root}#/tuning/{sid}"));
    c.wait_for("the trials plot", "document.querySelectorAll('#trials-plot svg circle.pt').length === 5", 20);
    assert_eq!(c.count("#trials-plot svg path.best"), 1, "the best-so-far line");
    assert_eq!(c.count("#trials-plot svg circle.pt-best"), 1, "the best trial");
    assert_eq!(c.count("#trials tr.trial"), 5);
    let best_row = c.eval("document.querySelector('#trials tr.trial.best').dataset.trial");
    let best_plot = c.eval("document.querySelector('#trials-plot svg circle.pt-best').dataset.trial");
    assert_eq!(best_row, best_plot, "the table and the plot agree on the best trial");
    c.click("#trials button.expander");
    c.wait_for("a trial's measurements", "document.querySelectorAll('#trials tr.measurements table tbody tr').length === 3", 5);
    assert_eq!(c.count("#trials tr.measurements svg.spark"), 1);
    c.assert_clean("study page");
    c.screenshot("10-study");
    // Tuning trials (they carry trainyard_study) are left out of the jobs list unless
    // asked for: the study's page lists them.
    let trial_rows = "[...document.querySelectorAll('table.list tr.row')].filter(tr => tr.textContent.includes('-trial-')).length";
    c.open(&format!("{root}#/jobs"));
    c.wait_for("the list without trials", &format!("document.querySelectorAll('table.list tr.row').length > 0 && {trial_rows} === 0"), 20);
    assert!(c.eval("document.getElementById('filter-sent').textContent").as_str().unwrap_or("").contains("NOT labels.trainyard_study:*"));
    c.assert_clean("jobs list without trials");
    c.click("#hide-trials input");
    c.wait_for("the trials in the list", &format!("location.hash.includes('trials=show') && {trial_rows} === 5"), 20);
    c.assert_clean("jobs list with trials");

    // -- A Vizier study: on the list, and its page with each trial's parameters and final
    //    measurement, the optimal one marked. ---------------------------------------------
    let studies = s.url(&format!("/v1/projects/{PROJECT}/locations/us-central1/studies"));
    let spec = r#"{"displayName": "console-vizier", "studySpec": {"metrics": [{"metricId": "acc", "goal": "MAXIMIZE"}],
        "parameters": [{"parameterId": "lr", "doubleValueSpec": {"minValue": 0.001, "maxValue": 0.1}}]}}"#;
    let (st, vstudy) = s.call("POST", &studies, Some(spec));
    assert_eq!(st, 200, "{vstudy}");
    let vid = lastseg(vstudy["name"].as_str().unwrap());
    for (lr, acc) in [(0.01, 0.8), (0.05, 0.9)] {
        let (st, t) = s.call("POST", &format!("{studies}/{vid}/trials"), Some(&json!({"parameters": [{"parameterId": "lr", "value": lr}]}).to_string()));
        assert_eq!(st, 200, "{t}");
        let done = json!({"finalMeasurement": {"metrics": [{"metricId": "acc", "value": acc}]}}).to_string();
        let (st, t) = s.call("POST", &s.url(&format!("/v1/{}:complete", t["name"].as_str().unwrap())), Some(&done));
        assert_eq!(st, 200, "{t}");
    }
    c.click("#nav a[data-section=studies]");
    c.wait_for("the study on the list", "[...document.querySelectorAll('table.list tr.row')].some(tr => tr.textContent.includes('console-vizier') && tr.textContent.includes('maximize acc'))", 20);
    c.assert_clean("Vizier studies");
    c.open(&format!("{root}#/studies/{vid}"));
    c.wait_for("the study's trials", "document.querySelectorAll('#vizier-trials tr.trial').length === 2", 20);
    let best = c.eval("[...document.querySelectorAll('#vizier-trials tr.trial.best')].map(tr => tr.textContent).join('|')");
    assert!(best.as_str().unwrap_or("").contains("0.05") && best.as_str().unwrap_or("").contains("0.9") && !best.as_str().unwrap_or("").contains("0.8"), "the optimal trial: {best}");
    assert_eq!(c.eval("document.getElementById('vizier-counts').textContent"), json!("2 (2 succeeded, 1 optimal)"));
    c.assert_clean("Vizier study page");
    c.screenshot("10b-vizier-study");

    // -- A training pipeline and its CustomJob. ----------------------------------------------
    let backing = s.get(&pname)["trainingTaskMetadata"]["backingCustomJob"].as_str().unwrap().to_string();
    c.open(&format!("{root}#/pipelines"));
    c.wait_for("the pipelines", "document.querySelectorAll('table.list tr.row').length === 1", 20);
    c.assert_clean("pipelines list");
    c.open(&format!("{root}#/pipelines/{}", lastseg(&pname)));
    let link = c.wait_for("the backing job's link", "(document.querySelector('#backing-job a') || {}).hash", 20);
    assert_eq!(link, json!(format!("#/jobs/{}", lastseg(&backing))));
    c.assert_clean("pipeline page");
    c.screenshot("11-pipeline");
    c.click("#backing-job a");
    c.wait_for("the backing job's page", "document.querySelectorAll('#timeline svg rect.seg').length === 1 && document.getElementById('log').textContent.includes('training')", 20);
    c.assert_clean("pipeline's job page");

    // -- Nodes, the queue (with waiting reasons) and quotas. ---------------------------------
    c.open(&format!("{root}#/nodes"));
    c.wait_for("the nodes", "document.querySelectorAll('#nodes tr.row').length === 1", 20);
    let waiting = c.wait_for("the waiting job", &format!("(document.querySelector('#queue tr[data-name=\"{}\"]') || {{}}).textContent", name_of(&waiter)), 20);
    assert!(waiting.as_str().unwrap_or("").contains("Waiting for GPUs"), "{waiting}");
    assert!(c.count("#quotas tr") >= 2, "quotas");
    // Past use: each number right-aligned under a right-aligned header that says what it is.
    c.wait_for("past use", "document.querySelectorAll('#usage-history tbody tr').length > 0", 20);
    let aligned = c.eval("[...document.querySelectorAll('#usage-history th')].map(t => getComputedStyle(t).textAlign + ':' + t.textContent).join(',')");
    assert_eq!(aligned, json!("left:Project,right:CPUs (average),right:Memory GiB (average),left:Accelerators (average)"));
    // TY10: the usage table's goodput of the jobs that ended, as a percentage.
    let goodput = c.wait_for(
        "the usage table's goodput",
        "(h => h && h.textContent === 'Goodput' && [...document.querySelectorAll('#usage-table tbody tr')].map(r => r.lastElementChild.textContent).join(','))(document.querySelector('#usage-table thead th:last-child'))",
        20,
    );
    assert!(goodput.as_str().unwrap_or("").split(',').any(|c| c.ends_with('%')), "{goodput}");
    c.assert_clean("nodes page");
    c.screenshot("12-nodes-and-queue");
    c.click("#nodes tr.row a");
    c.wait_for("the node's GPUs", "document.querySelectorAll('#gpus tbody tr').length === 4", 20);
    let held = c.eval("[...document.querySelectorAll('#gpus tbody tr')].filter(tr => tr.textContent.includes('workerpool0-0')).length");
    assert_eq!(held, json!(2), "two GPUs held by the holder");
    let href = c.eval("document.querySelector('#gpus a').hash");
    assert_eq!(href, json!(format!("#/jobs/{}", job_id(&holder))));
    c.assert_clean("node page");
    c.screenshot("13-node");

    // -- Errors reach the banner: an API error, a JavaScript error, a rejection. -----------
    // A page that cannot be shown says why once, on its card (not again in the banner).
    c.open(&format!("{root}#/jobs/987654"));
    let view = c.wait_for("the page's card", "(t => t.includes('This page could not be shown') && t)(document.getElementById('view').innerText)", 20);
    assert_eq!(view.as_str().unwrap_or("").matches("does not exist").count(), 1, "{view}");
    assert_eq!(c.eval("document.getElementById('banner').hidden"), json!(true), "the error is shown twice");
    // A bad filter: said once, in the list, in the API's words (no request line before them).
    c.open(&format!("{root}#/jobs?filter=state%3D"));
    let said = c.wait_for("the filter's error", "(document.querySelector('table.list td.errtext') || {}).textContent", 20);
    assert!(said.as_str().unwrap_or("").starts_with("INVALID_ARGUMENT: ") && said.as_str().unwrap_or("").contains("Invalid filter"), "{said}");
    assert_eq!(c.eval("document.getElementById('view').innerText.split('Invalid filter').length - 1"), json!(1), "said more than once on the page");
    std::thread::sleep(std::time::Duration::from_millis(500));
    assert_eq!(c.eval("document.getElementById('banner').hidden"), json!(true), "the filter's error is in the banner too");
    c.eval("setTimeout(() => { throw new Error('console-e2e thrown'); }, 0); Promise.reject(new Error('console-e2e rejected')); 0");
    let banner = c.wait_for("the script errors", "(t => t.includes('console-e2e thrown') && t.includes('console-e2e rejected') && t)(document.getElementById('banner').innerText)", 10);
    assert!(banner.as_str().unwrap_or("").contains("JavaScript error"), "{banner}");
    assert!(c.count("input.filter") == 1, "the page is still there, with its filter box to fix the filter");
    c.screenshot("14-error-banner");
    c.click("#banner-close");
    c.wait_for("the banner to close", "document.getElementById('banner').hidden", 5);
    let _ = c.errors();

    // -- With a tokens file: the token typed in the header is sent as a Bearer token and
    //    kept in sessionStorage (this tab only), never in localStorage. -------------------
    let mut t = Server::prepare("");
    let tokens = t.dir.path().join("tokens.toml");
    std::fs::write(&tokens, format!("[[tokens]]\nname = \"console\"\ntoken = \"{TOKEN}\"\nprojects = [\"{PROJECT}\"]\n")).unwrap();
    std::fs::set_permissions(&tokens, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    std::fs::write(&t.config, config_text(&format!("tokens_file = \"{}\"\n", tokens.display()))).unwrap();
    t.spawn();
    c.open(&t.url(&format!("/?project={PROJECT}#/jobs")));
    let banner = c.wait_for("the missing token", "!document.getElementById('banner').hidden && document.getElementById('banner').innerText", 20);
    assert!(banner.as_str().unwrap_or("").contains("UNAUTHENTICATED"), "{banner}");
    c.eval(&format!("(() => {{ const i = document.getElementById('token'); i.value = '{TOKEN}'; i.dispatchEvent(new Event('change')); }})()"));
    c.wait_for("the list with the token", "document.getElementById('banner').hidden && (document.querySelector('table.list td.empty') || {}).textContent === 'No jobs in project console (us-central1).'", 20);
    assert_eq!(c.eval("sessionStorage.getItem('trainyard.token')"), json!(TOKEN));
    assert_eq!(c.eval("localStorage.getItem('trainyard.token')"), Value::Null);
    let _ = c.errors();

    println!("console: screenshots in {}", screenshot_dir().display());
}

const TOKEN: &str = "con-5b7d9f1e3a6c8042";

fn lastseg(name: &str) -> String {
    name.rsplit('/').next().unwrap_or("").to_string()
}

/// The text of the `#log` pane's stdout lines (without their time and replica).
const OUT_LINES: &str = "[...document.querySelectorAll('#log .l.out')].map(l => l.lastChild.textContent)";

/// Hangs (label `trainyard-hang-after-secs`): two replicas that print once and then go
/// silent are reported (TY4); the jobs list shows a "hang" badge on their RUNNING jobs and
/// not on a job that keeps printing; one of the two prints again and loses its badge while
/// the list is shown; the other's page (reached by a click) says which replica is hung,
/// since when and the TY4 text, and marks it on the timeline (a marker with the time on
/// the replica's row, a band up to now).
#[test]
fn console_shows_hangs_on_the_list_and_the_job_page() {
    let Some((chromium, _turn)) = browser_turn() else { return };
    let s = Server::start("");
    let dir = s.dir.path().to_path_buf();
    let wake = dir.join("wake-up");
    let hang = json!({"trainyard-hang-after-secs": "2"});
    let mut hung = sh_job("stays-hung", "echo started; sleep 600");
    hung["labels"] = hang.clone();
    let mut waking = sh_job("wakes-up", &format!("echo started; while [ ! -e {w} ]; do sleep 0.2; done; while true; do echo awake again; sleep 0.3; done", w = wake.display()));
    waking["labels"] = hang.clone();
    let mut steady = sh_job("steady", "while true; do echo tick; sleep 0.3; done");
    steady["labels"] = hang;
    let (hung, waking, steady) = (s.create("hangs", &hung), s.create("hangs", &waking), s.create("hangs", &steady));
    let reported = |j: &Value| s.logs(&name_of(j)).into_iter().find(|e| e["stream"] == "event" && e["text"].as_str().unwrap_or("").contains("may be hung"));
    let deadline = Instant::now() + Duration::from_secs(60);
    while reported(&hung).is_none() || reported(&waking).is_none() {
        assert!(Instant::now() < deadline, "no hang reported:\n{}\n{}\n{}", s.logs_text(&name_of(&hung)), s.logs_text(&name_of(&waking)), s.server_log());
        std::thread::sleep(Duration::from_millis(200));
    }
    let report = reported(&hung).unwrap();
    assert_eq!(report["rule"], "TY4", "{report}");
    assert!(reported(&steady).is_none(), "a job that prints is not hung: {}", s.logs_text(&name_of(&steady)));
    for j in [&hung, &waking, &steady] {
        assert_eq!(s.get(&name_of(j))["state"], "JOB_STATE_RUNNING");
    }

    let mut c = Chrome::launch(&chromium, dir.as_path());
    let root = s.url("/?project=hangs&region=us-central1");
    let badge = |j: &Value| format!("document.querySelector('table.list tr.row[data-name=\"{}\"] .hang-badge')", name_of(j));

    // -- The list: badges on the two hung jobs, none on the steady one. ---------------------
    c.open(&format!("{root}#/jobs"));
    c.wait_for("the hang badges", &format!("{} && {}", badge(&hung), badge(&waking)), 30);
    // The steady job is looked at alongside (four at a time): give it time to be wrong.
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(c.eval(&format!("{} === null", badge(&steady))), json!(true), "no badge on a job that prints");
    let tip = c.eval(&format!("{}.title", badge(&hung)));
    assert!(tip.as_str().unwrap_or("").contains("workerpool0-0: reported hung at") && tip.as_str().unwrap_or("").contains("TY4: Replica workerpool0-0 may be hung"), "{tip}");
    assert_eq!(c.eval(&format!("{}.closest('td').querySelector('.st').textContent", badge(&hung))), json!("running"));
    c.assert_clean("jobs list with hangs");
    c.screenshot("15-jobs-hang-badge");

    // -- One wakes up: its badge goes, the other's stays. ------------------------------------
    std::fs::write(&wake, "").unwrap();
    c.wait_for("the woken job's badge to go", &format!("{} === null", badge(&waking)), 30);
    assert_eq!(c.eval(&format!("{} !== null", badge(&hung))), json!(true), "the hung job keeps its badge");
    c.assert_clean("jobs list after a wake-up");

    // -- The hung job's page, by a click: who, since when, the TY4 text, the timeline. -------
    c.click(&format!("table.list tr.row[data-name=\"{}\"] td.id a", name_of(&hung)));
    c.wait_for("the job page", &format!("location.hash === '#/jobs/{}'", job_id(&hung)), 10);
    let item = c.wait_for("the hang notice", "(document.querySelector('#job-hang .hang-item[data-replica=\"workerpool0-0\"]') || {}).textContent", 20);
    let item = item.as_str().unwrap_or("").to_string();
    // The report's time, as the page writes local times.
    let when = c.eval(&format!("dateTime(micros({}) / 1000)", serde_json::to_string(&report["time"]).unwrap()));
    let when = when.as_str().unwrap_or("?");
    assert!(item.contains(&format!("reported hung at {when}")), "{item} (report at {when})");
    assert!(item.contains(report["text"].as_str().unwrap()), "the TY4 text: {item}");
    assert_eq!(c.count("#hang-slot .hang-badge"), 1, "the badge by the job's state");
    c.wait_for("the hang on the timeline", "document.querySelectorAll('#timeline svg g.mk-hang[data-rule~=TY4]').length === 1 && document.querySelectorAll('#timeline svg rect.hang-span[data-replica=\"workerpool0-0\"]').length === 1", 10);
    // The marker is on the replica's row (row 1, under the job's), labelled with the time.
    let label = c.eval("document.querySelector('#timeline svg g.mk-hang text.hang-label').textContent");
    let clock = c.eval(&format!("'hung ' + clock(micros({}) / 1000)", serde_json::to_string(&report["time"]).unwrap()));
    assert_eq!(label, clock, "the marker says when");
    let row = c.eval(
        "(() => { const m = document.querySelector('#timeline svg g.mk-hang path').getBBox(); \
         const bands = [...document.querySelectorAll('#timeline svg rect.band')]; \
         const i = bands.findIndex(b => m.y >= +b.getAttribute('y') && m.y + m.height <= +b.getAttribute('y') + +b.getAttribute('height')); \
         return document.querySelectorAll('#timeline svg text.label')[i].textContent; })()",
    );
    assert_eq!(row, json!("workerpool0-0"), "the hang is marked on the replica's row");
    let mark_tip = c.eval("document.querySelector('#timeline svg g.mk-hang > title').textContent");
    assert!(mark_tip.as_str().unwrap_or("").contains("may be hung"), "{mark_tip}");
    c.eval("document.querySelector('details.transitions').open = true");
    let transitions = c.eval("document.querySelector('details.transitions').textContent");
    assert!(transitions.as_str().unwrap_or("").contains("TY4"), "{transitions}");
    c.assert_clean("hung job page");
    c.screenshot("16-job-hang");

    // -- The woken job's page: its report stays on the timeline, it is not hung now. --------
    c.open(&format!("{root}#/jobs/{}", job_id(&waking)));
    c.wait_for("the TY4 marker", "document.querySelectorAll('#timeline svg g.mk-hang').length === 1 && ((document.getElementById('log') || {}).textContent || '').includes('awake again')", 20);
    std::thread::sleep(Duration::from_millis(700));
    assert_eq!(c.count("#job-hang .hang-item"), 0, "not hung after printing again");
    assert_eq!(c.count("#hang-slot .hang-badge") + c.count("#timeline svg rect.hang-span"), 0);
    c.assert_clean("woken job page");
}

/// A 20,000-line log: the job page opens on its newest 1,000 lines (one request with
/// tail=1000, lines counted in the page), "Load earlier" (a click) puts the 1,000 before
/// them above, in order, the line in view staying where it was; opened on the last 20,000
/// lines, one more "Load earlier" reaches the start of the log.
#[test]
fn console_log_opens_on_its_tail_and_loads_earlier_lines() {
    let Some((chromium, _turn)) = browser_turn() else { return };
    let s = Server::start("");
    let job = s.create("tails", &sh_job("twenty-thousand", "seq -f 'line %g' 1 20000"));
    s.wait_terminal(&name_of(&job), 90);
    let total = s.logs(&name_of(&job)).len();
    assert!(total > 20000, "20,000 lines and the job's events: {total}");
    let mut c = Chrome::launch(&chromium, s.dir.path());
    let root = s.url("/?project=tails&region=us-central1");
    let id = job_id(&job);
    // The stdout lines shown, as numbers: one run, ascending by one, ending where it ends.
    let numbers = |c: &mut Chrome| -> Vec<u64> {
        let v = c.eval(&format!("{OUT_LINES}.map(t => +t.replace('line ', ''))"));
        v.as_array().unwrap().iter().filter_map(Value::as_u64).collect()
    };
    let in_order = |n: &[u64]| n.windows(2).all(|w| w[1] == w[0] + 1);

    c.open(&format!("{root}#/jobs/{id}"));
    c.wait_for("the log's tail", "((document.getElementById('log-status') || {}).textContent || '').startsWith('ended')", 30);
    assert_eq!(c.count("#log .l"), 1000, "the newest 1,000 entries, no more");
    let first = numbers(&mut c);
    assert!(in_order(&first) && first.last() == Some(&20000), "the newest lines, in order: {:?}..{:?}", first.first(), first.last());
    let fetched = c.eval("window.__fetches.filter(u => u.includes('/logs')).join(' ')");
    assert!(fetched.as_str().unwrap_or("").contains(&format!("/customJobs/{id}/logs?follow=true&tail=1000")), "{fetched}");
    assert_eq!(c.eval("document.getElementById('log-tail').value"), json!("1000"));
    // The timeline has read the whole log by itself.
    c.wait_for("the timeline's count of every line", "((document.querySelector('#timeline rect.seg title') || {}).textContent || '').includes('20000 log lines')", 30);
    c.assert_clean("job page on a tail");

    // "Load earlier", clicked: 1,000 more lines above, in order, the first line shown before
    // kept where the reader had it.
    let oldest = first[0];
    let offset_of = format!(
        "(() => {{ const l = [...document.querySelectorAll('#log .l.out')].find(l => l.lastChild.textContent === 'line {oldest}'); \
         return l.getBoundingClientRect().top - document.getElementById('log').getBoundingClientRect().top; }})()"
    );
    c.eval("document.getElementById('log-earlier').scrollIntoView({block: 'center'})");
    c.screenshot("17-job-log-tail");
    let before = c.eval(&offset_of).as_f64().unwrap();
    c.click("#log-earlier");
    c.wait_for("1,000 earlier lines", "document.querySelectorAll('#log .l').length === 2000", 20);
    let after = c.eval(&offset_of).as_f64().unwrap();
    assert!((after - before).abs() <= 2.0, "the line in view stays put: {before} -> {after}");
    assert!(c.eval("document.getElementById('log').scrollTop").as_f64().unwrap_or(0.0) > 1000.0, "the new lines are above");
    let two = numbers(&mut c);
    assert!(in_order(&two) && two.len() == 2000 - (1000 - first.len()) && two.last() == Some(&20000) && two[0] == oldest - 1000, "2,000 lines in order: {:?}..{:?}", two.first(), two.last());
    assert!(c.eval("window.__fetches.some(u => /\\/logs\\?tail=\\d+$/.test(u))").as_bool().unwrap_or(false), "asked by tail");
    assert_eq!(c.eval("document.getElementById('log-status').textContent"), json!(format!("ended · {} lines", 2000)));
    assert_eq!(c.eval("window.__fetches.filter(u => u.includes('follow=true')).length"), json!(1), "the followed stream is not read again");
    c.assert_clean("job page, earlier lines");
    c.screenshot("18-job-log-earlier");

    // Opened on the last 20,000 lines (the setting), one more load reaches the start.
    c.eval("(() => { const s = document.getElementById('log-tail'); s.value = '20000'; s.dispatchEvent(new Event('change')); })()");
    c.wait_for("the last 20,000", "((document.getElementById('log-status') || {}).textContent || '').startsWith('ended') && document.querySelectorAll('#log .l').length === 20000", 60);
    c.click_until("#log-earlier", "the start of the log", "(document.getElementById('log-top') || {}).textContent === 'Start of the log.'", 30);
    assert_eq!(c.count("#log .l"), total as u64, "the whole log");
    let all = numbers(&mut c);
    assert!(in_order(&all) && all.len() == 20000 && all[0] == 1, "every line once, in order");
    assert_eq!(c.count("#log-earlier"), 0, "nothing more to load");
    assert_eq!(c.eval("localStorage.getItem('trainyard.logTail')"), json!("20000"), "the setting is kept");
    c.assert_clean("job page, whole log by loads");
}

/// The console's terminal (issue 48): a job with `enableWebAccess` shows `webAccessUris`
/// while it runs, each the console's terminal for that replica; opened with the token typed
/// in the header (sent as the WebSocket's `bearer.` subprotocol), the page runs the
/// replica's shell in xterm.js: typed keys reach it (real key events), its output is drawn,
/// and no Content-Security-Policy rule is broken (the terminal's style elements carry the
/// page's nonce). The job page links each running replica's terminal.
#[test]
fn console_terminal_runs_a_shell_in_a_running_replica() {
    let Some((chromium, _turn)) = browser_turn() else { return };
    const TOKEN: &str = "console-terminal-token-7f3a9c";
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.toml");
    std::fs::write(&tokens, format!("[[tokens]]\nname = \"browser\"\ntoken = \"{TOKEN}\"\nprojects = [\"term\"]\n")).unwrap();
    std::fs::set_permissions(&tokens, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let s = Server::start(&format!("tokens_file = \"{}\"\n", tokens.display()));
    let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
    let call = |method: &str, url: &str, body: Option<&Value>| -> Value {
        let req = ureq::http::Request::builder().method(method).uri(url).header("Authorization", format!("Bearer {TOKEN}")).header("Content-Type", "application/json");
        let mut resp = agent.run(req.body(body.map(Value::to_string).unwrap_or_default()).unwrap()).expect("request");
        serde_json::from_str(&resp.body_mut().read_to_string().unwrap()).unwrap_or(Value::Null)
    };
    let mut body = sh_job("web-access", "echo ready; exec sleep 600");
    body["jobSpec"]["enableWebAccess"] = json!(true);
    let job = call("POST", &s.jobs_url("term"), Some(&body));
    let name = name_of(&job);
    let id = job_id(&job);
    let deadline = Instant::now() + Duration::from_secs(60);
    let running = loop {
        let j = call("GET", &s.url(&format!("/v1/{name}")), None);
        if j["state"] == "JOB_STATE_RUNNING" {
            break j;
        }
        assert!(Instant::now() < deadline, "the job never ran: {j:#}");
        std::thread::sleep(Duration::from_millis(100));
    };
    let uri = running["webAccessUris"]["workerpool0-0"].as_str().unwrap_or_else(|| panic!("no webAccessUris: {running:#}")).to_string();
    assert_eq!(uri, s.url(&format!("/console?project=term&region=us-central1#/jobs/{id}/terminal/workerpool0-0")));

    let mut c = Chrome::launch(&chromium, dir.path());
    c.open(&uri);
    // No token yet: the terminal cannot open, and the page says so.
    c.wait_for("the refusal", "!document.getElementById('banner').hidden", 20);
    let refused = c.errors();
    assert!(refused.iter().any(|e| e.contains("401")), "the refusal without a token: {refused:?}");
    c.eval(&format!("(() => {{ const i = document.getElementById('token'); i.value = '{TOKEN}'; i.dispatchEvent(new Event('change')); }})()"));
    c.eval("(() => { document.getElementById('banner-close').click(); })()");
    c.wait_for("the session", "(document.getElementById('terminal-status') || {}).textContent === 'connected'", 20);
    let screen = "(() => { const b = window.trainyardTerminal.buffer.active; let s = ''; for (let i = 0; i < b.length; i++) s += b.getLine(i).translateToString(true) + '\\n'; return s; })()";
    c.wait_for("the shell's prompt", &format!("{screen}.includes('$ ')"), 20);
    c.click("#terminal .xterm-screen");
    c.call("Input.insertText", json!({"text": "echo $((6*7))-from-the-browser; tty"}));
    for kind in ["rawKeyDown", "char", "keyUp"] {
        c.call("Input.dispatchKeyEvent", json!({"type": kind, "key": "Enter", "code": "Enter", "windowsVirtualKeyCode": 13, "text": "\r", "unmodifiedText": "\r"}));
    }
    let shown = c.wait_for("the command's output", &format!("{screen}.split('\\n').some(l => l.trim() === '42-from-the-browser') && {screen}"), 20);
    assert!(shown.as_str().unwrap_or("").contains("/dev/pts/"), "a terminal of its own: {shown}");
    c.screenshot("19-terminal");
    c.assert_clean("the terminal");

    // To the job's page by its crumb (a real click): the terminal's session ends with the
    // page, and the job page links the running replica's terminal.
    c.click(&format!(".crumbs a[href='#/jobs/{id}']"));
    c.wait_for("the terminal link", "document.querySelectorAll('a.terminal-link').length === 1", 20);
    assert_eq!(c.eval("document.querySelector('a.terminal-link').getAttribute('href')"), json!(format!("#/jobs/{id}/terminal/workerpool0-0")));
    c.assert_clean("the job page with its terminal link");
    // Leaving the page ended the session: audited with the token's holder.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !s.server_log().lines().any(|l| l.contains("exec session") && l.contains("holder=\"browser\"") && l.contains("outcome=\"disconnected\"")) {
        assert!(Instant::now() < deadline, "no audit line of the browser's session:\n{}", s.server_log());
        std::thread::sleep(Duration::from_millis(100));
    }
    call("POST", &s.url(&format!("/v1/{name}:cancel")), None);
}

/// The experiments pages in headless Chromium: an experiment made as the SDK makes one
/// (contexts of the default metadata store, a TensorBoard with a series per run), listed;
/// its page shows each run's parameters and metrics, sorts by a metric when its header is
/// clicked, compares the chosen runs (a differing row marked), and plots their loss by
/// step, one line per run; unticking a run takes its line away.
#[test]
fn console_experiment_page_compares_runs_and_plots_their_series() {
    let Some((chromium, _turn)) = browser_turn() else { return };
    let s = Server::start("");
    let base = s.url("/v1/projects/exps/locations/us-central1");
    let post = |path: &str, body: Value| -> Value {
        let (status, v) = s.call("POST", &format!("{base}/{path}"), Some(&body.to_string()));
        assert_eq!(status, 200, "{path}: {v}");
        v
    };
    let tb = post("tensorboards", json!({"displayName": "Default Tensorboard", "isDefault": true}))["response"]["name"].as_str().unwrap().to_string();
    let tb_rel = tb.trim_start_matches("projects/exps/locations/us-central1/").to_string();
    let store = "projects/exps/locations/us-central1/metadataStores/default";
    post("metadataStores/default/contexts?contextId=sweep", json!({"displayName": "sweep", "schemaTitle": "system.Experiment", "description": "a sweep", "metadata": {"experiment_deleted": false, "backing_tensorboard_resource": tb}}));
    post(&format!("{tb_rel}/experiments?tensorboardExperimentId=sweep"), json!({"displayName": "sweep"}));
    for (run, lr, acc) in [("fast", 0.1, 0.81), ("slow", 0.01, 0.93), ("mid", 0.05, 0.88)] {
        post(&format!("metadataStores/default/contexts?contextId=sweep-{run}"), json!({"displayName": run, "schemaTitle": "system.ExperimentRun",
            "metadata": {"_params": {"lr": lr, "optimizer": "adam"}, "_metrics": {"accuracy": acc}, "_state": "COMPLETE"}}));
        post("metadataStores/default/contexts/sweep:addContextChildren", json!({"childContexts": [format!("{store}/contexts/sweep-{run}")]}));
        post(&format!("{tb_rel}/experiments/sweep/runs?tensorboardRunId={run}"), json!({"displayName": run}));
        let ts = post(&format!("{tb_rel}/experiments/sweep/runs/{run}/timeSeries"), json!({"displayName": "loss", "valueType": "SCALAR", "pluginName": "scalars"}));
        let sid = ts["name"].as_str().unwrap().rsplit('/').next().unwrap().to_string();
        let values: Vec<Value> = (1..=5).map(|step| json!({"wallTime": "2026-12-07T00:00:00Z", "step": step.to_string(), "scalar": {"value": 1.0 / (step as f64 * (1.0 + lr))}})).collect();
        post(&format!("{tb_rel}/experiments/sweep/runs/{run}:write"), json!({"timeSeriesData": [{"tensorboardTimeSeriesId": sid, "values": values}]}));
    }

    let mut c = Chrome::launch(&chromium, s.dir.path());
    let root = s.url("/?project=exps&region=us-central1");
    c.open(&format!("{root}#/experiments"));
    c.wait_for("the experiments list", "document.querySelectorAll('table.list tr.row').length === 1", 20);
    assert_eq!(c.eval("document.querySelector('table.list tr.row td.id').textContent"), json!("sweep"));
    c.click("table.list tr.row td.id a");
    c.wait_for("the runs table", "document.querySelectorAll('#runs tr.run').length === 3", 20);
    let headers = c.eval("[...document.querySelectorAll('#runs th.sortable')].map(t => t.dataset.key).join(',')");
    assert_eq!(headers, json!("run,state,param.lr,param.optimizer,metric.accuracy,created"));
    // Sorted by accuracy (ascending, then descending) with a click on its header.
    c.click("#runs th[data-key='metric.accuracy']");
    assert_eq!(c.eval("[...document.querySelectorAll('#runs tr.run')].map(r => r.dataset.run).join(',')"), json!("fast,mid,slow"));
    c.click("#runs th[data-key='metric.accuracy']");
    assert_eq!(c.eval("[...document.querySelectorAll('#runs tr.run')].map(r => r.dataset.run).join(',')"), json!("slow,mid,fast"));
    // Compare: lr differs between the runs, the optimizer does not.
    assert_eq!(c.eval("document.querySelector('#run-compare tr[data-key=\"param.lr\"]').classList.contains('differs')"), json!(true));
    assert_eq!(c.eval("document.querySelector('#run-compare tr[data-key=\"param.optimizer\"]').classList.contains('differs')"), json!(false));
    // The plot: a loss line per run, 5 points each.
    c.wait_for("the loss plot", "document.querySelectorAll('#series-plot-svg path.ts').length === 3", 20);
    assert_eq!(c.eval("document.getElementById('series-tag').value"), json!("loss"));
    let points = c.eval("document.querySelector('#series-plot-svg path.ts[data-run=\"fast\"]').getAttribute('d').split('L').length");
    assert_eq!(points, json!(5));
    c.click("#runs tr.run[data-run='mid'] input.pick");
    c.wait_for("the unticked run's line to go", "document.querySelectorAll('#series-plot-svg path.ts').length === 2 && !document.querySelector('#series-plot-svg path.ts[data-run=\"mid\"]')", 10);
    c.assert_clean("experiment page");
    c.screenshot("20-experiment");
}
