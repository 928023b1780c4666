//! Attacks on the server's files, tokens, log and open mode, tried against a real server
//! (part of the tenant-escape suite): files for the server's user only, exposed or weak
//! tokens refused at start, tokens read again (SIGHUP, the admin call) all or nothing, an
//! audit line per mutating request naming the holder and never the token, no forged log
//! lines, DNS-rebinding `Host` names refused in open mode, and the console's headers.

mod common;

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

/// A response read off the wire: status, headers (lower-case names), body.
struct Raw {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Raw {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or(Value::Null)
    }
}

/// One HTTP/1.1 request with the `Host` header given (or none), on its own connection.
fn raw(port: u16, method: &str, path: &str, host: Option<&str>, token: Option<&str>, body: Option<&str>) -> Raw {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(20))).expect("timeout");
    let mut head = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\n");
    if let Some(h) = host {
        head.push_str(&format!("Host: {h}\r\n"));
    }
    if let Some(t) = token {
        head.push_str(&format!("Authorization: Bearer {t}\r\n"));
    }
    let body = body.unwrap_or("");
    if !body.is_empty() || method != "GET" {
        head.push_str(&format!("Content-Type: application/json\r\nContent-Length: {}\r\n", body.len()));
    }
    head.push_str("\r\n");
    head.push_str(body);
    s.write_all(head.as_bytes()).expect("write");
    let mut bytes = Vec::new();
    let _ = s.read_to_end(&mut bytes);
    let text = String::from_utf8_lossy(&bytes).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines.next().and_then(|l| l.split(' ').nth(1)).and_then(|c| c.parse().ok()).unwrap_or(0);
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect::<Vec<_>>();
    let chunked = headers.iter().any(|(n, v)| n == "transfer-encoding" && v.contains("chunked"));
    let body = if chunked { dechunk(body) } else { body.to_string() };
    Raw { status, headers, body }
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap_or_else(|e| panic!("{}: {e}", p.display())).permissions().mode() & 0o7777
}

/// A tokens file with mode 0600 (as the server demands).
fn write_tokens(path: &Path, text: &str) {
    std::fs::write(path, text).expect("write tokens");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).expect("chmod tokens");
}

fn token_entry(name: &str, token: &str, projects: &str) -> String {
    format!("[[tokens]]\nname = \"{name}\"\ntoken = \"{token}\"\nprojects = [{projects}]\n\n")
}

const ADMIN: &str = "adm-4e8f1c9b27d3a605";
const BOB: &str = "bob-9a3c7e5d1f0b2468";
const CAROL: &str = "car-1d5b9f3e7a2c6480";
const DAVE: &str = "dav-8c2e6a0f4b9d1357";

/// A server with a tokens file (kept under the server's temporary directory).
fn token_server(text: &str) -> (Server, PathBuf) {
    let mut s = Server::prepare("");
    let tokens = s.dir.path().join("tokens.toml");
    write_tokens(&tokens, text);
    std::fs::write(&s.config, config_text(&format!("tokens_file = \"{}\"\n", tokens.display()))).expect("config");
    s.spawn();
    (s, tokens)
}

/// `trainyard serve` that is expected to refuse to start: its stderr.
fn serve_refused(args: &[&std::ffi::OsStr]) -> String {
    let data = tempfile::tempdir().expect("tempdir");
    let out = Command::new(BIN)
        .args(["serve", "--listen", &format!("127.0.0.1:{}", free_port())])
        .arg("--data-dir")
        .arg(data.path())
        .args(args)
        .env_remove("TRAINYARD_CONFIG")
        .env_remove("TRAINYARD_TOKENS")
        .output()
        .expect("run serve");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "serve started: {err}");
    err
}

fn wait_until(what: &str, secs: u64, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn jobs_path(project: &str) -> String {
    format!("/v1/projects/{project}/locations/us-central1/customJobs")
}

/// The data directory, the database, a run directory, its spec.json (the job's env values)
/// and log are the server's user's only, whatever the umask of who started it; a data
/// directory that others could enter is tightened at start.
#[test]
fn data_files_are_private() {
    let mut s = Server::prepare("");
    let data = s.data_dir();
    std::fs::create_dir_all(&data).unwrap();
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).unwrap();
    s.spawn();
    let job = s.create("p", &sh_job("private", "echo secret-output"));
    s.wait_terminal(&name_of(&job), 60);
    // A root server's replicas run as per-project users, who may pass through (never
    // list) the directories on the way to their own.
    let private_dir = if is_root() { 0o711 } else { 0o700 };
    assert_eq!(mode(&data), private_dir, "data directory");
    assert_eq!(mode(&data.join("trainyard.db")) & 0o077, 0, "database");
    for side in ["trainyard.db-wal", "trainyard.db-shm"] {
        if data.join(side).exists() {
            assert_eq!(mode(&data.join(side)) & 0o077, 0, "{side}");
        }
    }
    assert_eq!(mode(&data.join("runs")), private_dir, "runs/");
    let run = run_dir(&data, id_of(&job), 0, "workerpool0-0", 0);
    assert_eq!(mode(&run), private_dir, "{}", run.display());
    for f in ["spec.json", "log.jsonl", "status.json"] {
        assert_eq!(mode(&run.join(f)) & 0o077, 0, "{f} of {}", run.display());
    }
    assert!(s.logs_text(&name_of(&job)).contains("secret-output"));
}

/// `local-run` keeps its run's data private too.
#[test]
fn local_run_data_is_private() {
    let dir = tempfile::tempdir().unwrap();
    let job = dir.path().join("job.yaml");
    std::fs::write(
        &job,
        "workerPoolSpecs:\n  - machineSpec: {machineType: n1-standard-4}\n    replicaCount: 1\n    \
         containerSpec: {imageUri: python:3.11, command: [sh, -c, 'echo done']}\n",
    )
    .unwrap();
    let data = dir.path().join("data");
    let out = Command::new(BIN)
        .arg("local-run")
        .arg(&job)
        .arg("--data-dir")
        .arg(&data)
        .env("TRAINYARD_STORAGE_ROOT", dir.path().join("storage"))
        .env_remove("TRAINYARD_CONFIG")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(mode(&data), 0o700);
    assert_eq!(mode(&data.join("trainyard.db")) & 0o077, 0);
    let run = run_dir(&data, 1, 0, "workerpool0-0", 0);
    for f in ["spec.json", "log.jsonl"] {
        assert_eq!(mode(&run.join(f)) & 0o077, 0, "{f}");
    }
}

/// A tokens file that other users may read is refused at start, naming the file, its mode
/// and the fix.
#[test]
fn an_exposed_tokens_file_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.toml");
    std::fs::write(&tokens, token_entry("ci", BOB, "\"p\"")).unwrap();
    std::fs::set_permissions(&tokens, std::fs::Permissions::from_mode(0o644)).unwrap();
    let err = serve_refused(&["--tokens".as_ref(), tokens.as_os_str()]);
    let path = tokens.display().to_string();
    assert!(err.contains(&path) && err.contains("mode 0644") && err.contains(&format!("chmod 600 {path}")), "{err}");
    assert!(!err.contains(BOB), "the token was shown: {err}");
}

/// Weak tokens are refused at start, naming the holder and the line, never the token.
#[test]
fn weak_tokens_are_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.toml");
    for weak in ["abc123xyz", "aaaaaaaaaaaaaaaaaaaa", "abcdefghabcdefgh", "abcdefghijklmnopqrst"] {
        write_tokens(&tokens, &format!("{}{}", token_entry("good", BOB, "\"p\""), token_entry("lab", weak, "\"p\"")));
        let err = serve_refused(&["--tokens".as_ref(), tokens.as_os_str()]);
        assert!(err.contains("\"lab\"") && err.contains("line 8") && err.contains("too weak"), "{weak}: {err}");
        assert!(!err.contains(weak) && !err.contains(BOB), "a token was shown: {err}");
    }
}

/// SIGHUP reads the tokens file again: a new token works, a removed one is refused; a
/// broken file changes nothing.
#[test]
fn sighup_reloads_tokens_all_or_nothing() {
    let (s, tokens) = token_server(&format!("{}{}", token_entry("admin", ADMIN, "\"*\""), token_entry("bob", BOB, "\"alpha\"")));
    let list = |t: &str| raw(s.port, "GET", &jobs_path("alpha"), Some("127.0.0.1"), Some(t), None).status;
    assert_eq!((list(BOB), list(CAROL)), (200, 401));
    let pid = s.pid().expect("pid") as i32;
    write_tokens(&tokens, &format!("{}{}", token_entry("admin", ADMIN, "\"*\""), token_entry("carol", CAROL, "\"alpha\"")));
    // SAFETY: kill(2) has no memory effects.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGHUP) }, 0);
    wait_until("carol's token works", 10, || list(CAROL) == 200);
    assert_eq!(list(BOB), 401, "a removed token still works");
    assert!(s.server_log().contains("SIGHUP: tokens read again"), "{}", s.server_log());
    // A broken file (a weak token) changes nothing; the server says why and lives on.
    write_tokens(&tokens, &format!("{}{}", token_entry("admin", ADMIN, "\"*\""), token_entry("weak", "w3ak-t0ken", "\"alpha\"")));
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGHUP) }, 0);
    wait_until("the refused reload is logged", 10, || s.server_log().contains("SIGHUP: tokens not changed"));
    assert_eq!((list(CAROL), list(ADMIN)), (200, 200));
    assert!(!s.server_log().contains("w3ak-t0ken"), "a token was logged");
}

/// `POST /v1/admin/tokens:reload` with a "*" token reads the file again and says what
/// changed; other tokens may not; a broken or exposed file changes nothing and the answer
/// says why.
#[test]
fn the_admin_call_reloads_tokens_all_or_nothing() {
    let (s, tokens) = token_server(&format!("{}{}", token_entry("admin", ADMIN, "\"*\""), token_entry("bob", BOB, "\"alpha\"")));
    let reload = |t: Option<&str>| raw(s.port, "POST", "/v1/admin/tokens:reload", Some("127.0.0.1"), t, Some(""));
    let list = |t: &str| raw(s.port, "GET", &jobs_path("alpha"), Some("127.0.0.1"), Some(t), None).status;
    write_tokens(
        &tokens,
        &format!("{}{}{}", token_entry("admin", ADMIN, "\"*\""), token_entry("bob", BOB, "\"alpha\""), token_entry("dave", DAVE, "\"alpha\"")),
    );
    // Not an administrator: refused, nothing read.
    let r = reload(Some(BOB));
    assert_eq!((r.status, r.json()["error"]["status"].as_str()), (403, Some("PERMISSION_DENIED")), "{}", r.body);
    assert_eq!(reload(None).status, 401);
    assert_eq!(list(DAVE), 401);
    let r = reload(Some(ADMIN));
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(r.json(), serde_json::json!({"tokens": 3, "added": 1, "removed": 0}));
    assert_eq!(list(DAVE), 200);
    // A file that does not parse: 400 naming the line; the tokens in force stay.
    write_tokens(&tokens, &format!("{}[[tokens]]\nname = \"x\"\ntokn = \"{CAROL}\"\n", token_entry("admin", ADMIN, "\"*\"")));
    let r = reload(Some(ADMIN));
    assert_eq!((r.status, r.json()["error"]["status"].as_str()), (400, Some("INVALID_ARGUMENT")), "{}", r.body);
    let msg = r.json()["error"]["message"].as_str().unwrap_or("").to_string();
    assert!(msg.contains("Tokens not changed") && msg.contains("line 8") && !msg.contains(CAROL), "{msg}");
    assert_eq!((list(BOB), list(DAVE)), (200, 200));
    // A file others may read: 400 naming the mode and the fix; nothing changes.
    write_tokens(&tokens, &token_entry("admin", ADMIN, "\"*\""));
    std::fs::set_permissions(&tokens, std::fs::Permissions::from_mode(0o640)).unwrap();
    let r = reload(Some(ADMIN));
    let msg = r.json()["error"]["message"].as_str().unwrap_or("").to_string();
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(msg.contains("mode 0640") && msg.contains("chmod 600"), "{msg}");
    assert_eq!((list(BOB), list(DAVE)), (200, 200));
}

/// Every POST/PUT/PATCH/DELETE leaves an audit line with the holder's name, the method,
/// the path and the status; never the token. Reads leave none.
#[test]
fn audit_lines_name_the_holder_and_never_the_token() {
    let (s, _) = token_server(&format!("{}{}", token_entry("admin", ADMIN, "\"*\""), token_entry("bob", BOB, "\"alpha\"")));
    let job = sh_job("audited", "exit 0").to_string();
    let created = raw(s.port, "POST", &jobs_path("alpha"), Some("127.0.0.1"), Some(BOB), Some(&job));
    assert_eq!(created.status, 200, "{}", created.body);
    let name = name_of(&created.json());
    assert_eq!(raw(s.port, "POST", &jobs_path("beta"), Some("127.0.0.1"), Some(BOB), Some(&job)).status, 403);
    assert_eq!(raw(s.port, "POST", &jobs_path("alpha"), Some("127.0.0.1"), Some(CAROL), Some(&job)).status, 401);
    assert_eq!(raw(s.port, "DELETE", &format!("/v1/{name}"), Some("127.0.0.1"), None, None).status, 401);
    assert_eq!(raw(s.port, "GET", &format!("/v1/{name}"), Some("127.0.0.1"), Some(BOB), None).status, 200);
    let expected = [
        format!("holder=\"bob\" method=\"POST\" path=\"{}\" status=200", jobs_path("alpha")),
        format!("holder=\"bob\" method=\"POST\" path=\"{}\" status=403", jobs_path("beta")),
        format!("holder=\"(unknown token)\" method=\"POST\" path=\"{}\" status=401", jobs_path("alpha")),
        format!("holder=\"(no token)\" method=\"DELETE\" path=\"/v1/{name}\" status=401"),
    ];
    wait_until("the audit lines are written", 10, || {
        let log = s.server_log();
        expected.iter().all(|e| log.lines().any(|l| l.contains(" audit: ") && l.contains(e.as_str())))
    });
    let log = s.server_log();
    let audit: Vec<&str> = log.lines().filter(|l| l.contains(" audit: ")).collect();
    assert_eq!(audit.len(), expected.len(), "one line per mutating request, none for reads:\n{log}");
    for t in [ADMIN, BOB, CAROL] {
        assert!(!log.contains(t), "a token is in the log:\n{log}");
    }
}

/// `[log] format = "json"`: every line of the server log is one JSON object with
/// `timestamp`, `level`, `target` and `message`; `RUST_LOG` sets levels by target; with
/// `[log] audit_file` the audit lines go to that file alone (JSON too), whatever the levels
/// ask, and the file is rotated by size keeping `audit_keep` older files.
#[test]
fn json_log_levels_by_target_and_a_rotated_audit_file() {
    let mut s = Server::prepare("");
    let audit = s.dir.path().join("audit/audit.log");
    let text = std::fs::read_to_string(&s.config).unwrap()
        + &format!("[log]\nformat = \"json\"\naudit_file = \"{}\"\naudit_max_bytes = 4096\naudit_keep = 2\n", audit.display());
    std::fs::write(&s.config, text).unwrap();
    // The serve module's start line at info, the server library's info lines off; the
    // audit lines asked for too, yet they go to their file alone.
    s.env.push(("RUST_LOG".into(), "warn,trainyard::serve=info,audit=info".into()));
    s.spawn();
    let path = jobs_path("alpha");
    for i in 0..45 {
        let r = raw(s.port, "POST", &path, Some("127.0.0.1"), None, Some(&format!("{{\"displayName\": {i}}}")));
        assert_eq!(r.status, 400, "{}", r.body);
    }
    let read = |p: &std::path::Path| std::fs::read_to_string(p).unwrap_or_default();
    let rotated = |n: u32| std::path::PathBuf::from(format!("{}.{n}", audit.display()));
    let all_audit = || [rotated(2), rotated(1), audit.clone()].iter().map(|p| read(p)).collect::<String>();
    wait_until("the audit lines are written", 10, || all_audit().lines().count() == 45);
    assert!(!rotated(3).exists(), "two rotated files are kept");
    for p in [rotated(2), rotated(1), audit.clone()] {
        let len = std::fs::metadata(&p).unwrap().len();
        assert!(len > 0 && len <= 4096, "{}: {len} bytes", p.display());
    }
    for line in all_audit().lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert_eq!((v["target"].as_str(), v["holder"].as_str(), v["method"].as_str()), (Some("audit"), Some("(open mode)"), Some("POST")), "{line}");
        assert_eq!((v["path"].as_str(), v["status"].as_u64()), (Some(path.as_str()), Some(400)), "{line}");
    }
    let log = s.server_log();
    assert!(!log.is_empty());
    for line in log.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}\n{log}"));
        for k in ["timestamp", "level", "target", "message"] {
            assert!(v[k].is_string(), "no {k}: {line}");
        }
        assert_ne!(v["target"], "audit", "an audit line in the server log: {line}");
        assert!(v["level"] != "INFO" || v["target"] == "trainyard::serve", "RUST_LOG keeps other targets at warn: {line}");
    }
    assert!(log.contains("Trainyard serving region"), "{log}");
}

/// A displayName (or any user text) with line breaks and control characters cannot start
/// a line of its own in the server log, nor reach a terminal raw.
#[test]
fn a_display_name_cannot_forge_a_log_line() {
    let s = Server::start("");
    let forged = "x\nFORGED INFO audit: holder=\"admin\" method=\"DELETE\"\r\u{1b}[2Kreal";
    let job = s.create("p", &sh_job(forged, "exit 0"));
    assert_eq!(job["displayName"].as_str(), Some(forged), "the name itself is kept");
    wait_until("the creation is logged", 10, || s.server_log().contains("created: "));
    let log = s.server_log();
    for line in log.lines() {
        assert!(!line.starts_with("FORGED") && !line.contains('\r') && !line.contains('\u{1b}'), "forged line: {line:?}\n{log}");
    }
    let created = log.lines().find(|l| l.contains("created: ")).unwrap_or("");
    assert!(created.contains("FORGED") && created.contains("\\n"), "{created}");
    // The audit line of the create is there, with the open-mode holder.
    assert!(log.lines().any(|l| l.contains(" audit: ") && l.contains("holder=\"(open mode)\"") && l.contains("status=200")), "{log}");
}

/// Open mode: a request addressed to another name (DNS rebinding: a page on
/// evil.example whose name now points at 127.0.0.1) is refused with 403 and a clear
/// message, and changes nothing; loopback names are served.
#[test]
fn open_mode_refuses_dns_rebinding_hosts() {
    let s = Server::start("");
    let job = sh_job("rebind", "exit 0").to_string();
    for host in ["evil.example:8080", "evil.example", &format!("attacker.test:{}", s.port), "10.1.2.3", "[::2]:80"] {
        let r = raw(s.port, "POST", &jobs_path("p"), Some(host), None, Some(&job));
        let e = r.json();
        assert_eq!((r.status, e["error"]["status"].as_str()), (403, Some("PERMISSION_DENIED")), "{host}: {}", r.body);
        let msg = e["error"]["message"].as_str().unwrap_or("");
        assert!(msg.contains(&format!("{host:?}")) && msg.contains("DNS rebinding") && msg.contains("loopback"), "{msg}");
        assert_eq!(raw(s.port, "GET", "/", Some(host), None, None).status, 403, "{host}: the console");
        assert_eq!(raw(s.port, "GET", &jobs_path("p"), Some(host), None, None).status, 403, "{host}: a read");
    }
    let listed = raw(s.port, "GET", &jobs_path("p"), Some("127.0.0.1"), None, None);
    assert_eq!((listed.status, listed.json()), (200, serde_json::json!({})), "a refused create stored a job");
    let port = s.port;
    for host in [
        "localhost".to_string(),
        format!("localhost:{port}"),
        format!("127.0.0.1:{port}"),
        "127.3.4.5".to_string(),
        format!("[::1]:{port}"),
        "LOCALHOST".to_string(),
    ] {
        assert_eq!(raw(port, "GET", &jobs_path("p"), Some(&host), None, None).status, 200, "{host}");
        assert_eq!(raw(port, "GET", "/healthz", Some(&host), None, None).status, 200, "{host}");
    }
    let r = raw(port, "POST", &jobs_path("p"), Some(&format!("localhost:{port}")), None, Some(&job));
    assert_eq!(r.status, 200, "{}", r.body);
    // With tokens the Host is not checked (the token is what counts).
    let (t, _) = token_server(&token_entry("bob", BOB, "\"p\""));
    assert_eq!(raw(t.port, "GET", &jobs_path("p"), Some("trainyard.internal:8080"), Some(BOB), None).status, 200);
}

/// The console, its script, an API response and an error all carry the CSP, the frame and
/// sniffing headers; the page has no inline script or style; the script keeps the token
/// in sessionStorage and never reads it from the URL.
#[test]
fn security_headers_on_every_response() {
    let s = Server::start("");
    s.create("p", &sh_job("headers", "exit 0"));
    let host = Some("127.0.0.1");
    let page = raw(s.port, "GET", "/", host, None, None);
    let script = raw(s.port, "GET", "/console.js", host, None, None);
    let style = raw(s.port, "GET", "/console.css", host, None, None);
    let api = raw(s.port, "GET", &jobs_path("p"), host, None, None);
    let not_found = raw(s.port, "GET", "/no/such/thing", host, None, None);
    let refused = raw(s.port, "GET", "/", Some("evil.example"), None, None);
    let bad = raw(s.port, "POST", &jobs_path("p"), host, None, Some("{"));
    for (what, r, status) in [
        ("/", &page, 200),
        ("/console.js", &script, 200),
        ("/console.css", &style, 200),
        ("an API response", &api, 200),
        ("a 404", &not_found, 404),
        ("a refused Host", &refused, 403),
        ("a 400", &bad, 400),
    ] {
        assert_eq!(r.status, status, "{what}: {}", r.body);
        let csp = r.header("content-security-policy").unwrap_or_else(|| panic!("{what}: no CSP"));
        for directive in ["default-src 'none'", "script-src 'self'", "style-src 'self'", "connect-src 'self'", "frame-ancestors 'none'"] {
            assert!(csp.contains(directive), "{what}: {csp}");
        }
        assert!(!csp.contains("unsafe-inline") && !csp.contains("unsafe-eval"), "{what}: {csp}");
        assert_eq!(r.header("x-frame-options"), Some("DENY"), "{what}");
        assert_eq!(r.header("x-content-type-options"), Some("nosniff"), "{what}");
    }
    assert!(script.header("content-type").is_some_and(|c| c.starts_with("text/javascript")));
    assert!(style.header("content-type").is_some_and(|c| c.starts_with("text/css")));
    // No inline script, style element or style attribute that the CSP would block.
    let html = &page.body;
    assert!(html.contains("<script src=\"/console.js\"></script>"), "{html}");
    assert_eq!(html.matches("<script").count(), 1, "{html}");
    assert!(!html.contains("<style") && !html.contains("style=") && !has_event_attribute(html), "{html}");
    let js = &script.body;
    assert!(!js.contains("style=") && !js.contains("localStorage.setItem(\"trainyard.token"), "{js}");
    assert!(js.contains("token: sessionStorage") && !js.contains("params.get(\"token\")"), "{js}");
}

/// Does the HTML have an inline event handler (` onclick=`, ` onload=`...)?
fn has_event_attribute(html: &str) -> bool {
    html.match_indices(" on").any(|(i, _)| {
        let rest = &html[i + 3..];
        let name_len = rest.bytes().take_while(u8::is_ascii_alphabetic).count();
        name_len > 0 && rest[name_len..].trim_start().starts_with('=')
    })
}

/// `trainyard config set` writes the CLI config (which may hold a token) with mode 0600 in
/// a 0700 directory; an existing file others could read is tightened.
#[test]
fn cli_config_is_private() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("conf/trainyard/cli.toml");
    let cli = |args: &[&str]| {
        let out = Command::new(BIN).arg("config").args(args).env("TRAINYARD_CLI_CONFIG", &config).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    };
    cli(&["set", "token", BOB]);
    assert_eq!(mode(&config), 0o600);
    assert_eq!(mode(config.parent().unwrap()), 0o700);
    assert!(std::fs::read_to_string(&config).unwrap().contains(BOB));
    // An existing file with 0644: tightened when written...
    std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o644)).unwrap();
    cli(&["set", "project", "research"]);
    assert_eq!(mode(&config), 0o600);
    let text = std::fs::read_to_string(&config).unwrap();
    assert!(text.contains(BOB) && text.contains("research"), "{text}");
    // ...and when only read.
    std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o644)).unwrap();
    cli(&["list"]);
    assert_eq!(mode(&config), 0o600);
}
