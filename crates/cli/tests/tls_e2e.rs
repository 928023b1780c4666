//! TLS (`[tls]`): `--tls-auto` serves HTTPS with a private CA kept across restarts; plain
//! HTTP to it gets a 400 that says https; the CLI trusts it with `--ca-file`; a job's
//! clients trust it with nothing set; certificate files are read again on SIGHUP, and a
//! pair that cannot be used is refused at start naming its key (and kept out on SIGHUP);
//! `ca_file`, the CA of those files, is checked against them and given to jobs.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

fn plain_get(port: u16, path: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes()).expect("write");
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

#[test]
fn tls_auto_serves_https_the_cli_and_jobs_trust_it_and_plain_http_is_told_to_use_https() {
    let mut s = Server::prepare("");
    s.tls = true;
    s.spawn();
    let ca = s.data_dir().join("tls/ca.pem");
    let log = s.server_log();
    assert!(log.contains(&format!("on https://127.0.0.1:{}", s.port)), "{log}");
    assert!(log.contains("GRPC_DEFAULT_SSL_ROOTS_FILE_PATH") && log.contains(&ca.display().to_string()), "{log}");
    let (status, _) = s.call("GET", &s.url("/healthz"), None);
    assert_eq!(status, 200);

    // Plain HTTP on the TLS port: an answer, never a hang.
    let t0 = Instant::now();
    let answer = plain_get(s.port, "/healthz");
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(answer.contains("use https://") && answer.contains("FAILED_PRECONDITION"), "{answer}");
    assert!(t0.elapsed() < Duration::from_secs(5));

    // The CLI: untrusted without the CA (saying how to trust it), fine with it.
    let cli = |args: &[&str]| {
        Command::new(BIN)
            .args(args)
            .args(["--server", &s.url(""), "--project", "p"])
            .env_remove("TRAINYARD_CA_FILE")
            .env("TRAINYARD_CLI_CONFIG", s.dir.path().join("cli.toml"))
            .output()
            .expect("cli")
    };
    let out = cli(&["custom-jobs", "list"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("--ca-file"), "{err}");
    let out = cli(&["custom-jobs", "list", "--ca-file", &ca.display().to_string()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    // A job reaches the server over TLS with the endpoint and bundle it is given.
    let job = s.create(
        "p",
        &sh_job(
            "tls-job",
            "python3 -c 'import os, urllib.request; print(\"health\", urllib.request.urlopen(os.environ[\"STORAGE_EMULATOR_HOST\"] + \"/healthz\").status)'",
        ),
    );
    let done = s.wait_terminal(&name_of(&job), 60);
    let logs = s.logs_text(&name_of(&job));
    assert_eq!(done["state"], "JOB_STATE_SUCCEEDED", "{logs}\n{}", s.server_log());
    assert!(logs.contains("health 200"), "{logs}");

    // The CA is kept across restarts.
    let before = std::fs::read(&ca).expect("ca");
    s.restart();
    assert_eq!(std::fs::read(&ca).expect("ca"), before);
    assert_eq!(s.call("GET", &s.url("/healthz"), None).0, 200);
}

#[test]
fn tls_files_are_refused_at_start_naming_the_key_and_read_again_on_sighup() {
    // A certificate and key to use: those of an automatic server elsewhere.
    let mut maker = Server::prepare("");
    maker.tls = true;
    maker.spawn();
    let made = maker.data_dir().join("tls");
    // The certificate of its listen address (`server-<host>-<port>.pem`), not the one of
    // its jobs' address (`server-jobs-...`).
    let port_suffix = format!("-{}.pem", maker.port);
    let pem = std::fs::read_dir(&made)
        .expect("tls dir")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| {
            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("server-") && !n.starts_with("server-jobs-") && n.ends_with(&port_suffix))
        })
        .expect("a server certificate");
    let key = pem.with_extension("key");
    // Kept here: the maker's directory goes with it.
    let keep = tempfile::tempdir().expect("tempdir");
    let (pem, key, made) = {
        for f in [&pem, &key, &made.join("ca.pem"), &made.join("ca.key")] {
            std::fs::copy(f, keep.path().join(f.file_name().expect("name"))).expect("copy");
        }
        let at = |f: &std::path::Path| keep.path().join(f.file_name().expect("name"));
        (at(&pem), at(&key), keep.path().to_path_buf())
    };
    drop(maker);

    let missing = serve_refused("[tls]\ncert_file = \"/nonexistent/cert.pem\"\nkey_file = \"/nonexistent/key.pem\"\n");
    assert!(missing.contains("cert_file") && missing.contains("cannot read"), "{missing}");
    let half = serve_refused(&format!("[tls]\ncert_file = \"{}\"\n", pem.display()));
    assert!(half.contains("key_file"), "{half}");
    let wrong_key = serve_refused(&format!("[tls]\ncert_file = \"{}\"\nkey_file = \"{}\"\n", pem.display(), made.join("ca.key").display()));
    assert!(wrong_key.contains("key_file") && wrong_key.contains("does not go with"), "{wrong_key}");

    let dir = tempfile::tempdir().expect("tempdir");
    let (cert_file, key_file) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::copy(&pem, &cert_file).expect("copy");
    std::fs::copy(&key, &key_file).expect("copy");
    std::fs::set_permissions(&key_file, std::os::unix::fs::PermissionsExt::from_mode(0o644)).expect("chmod");
    let open = serve_refused(&format!("[tls]\ncert_file = \"{}\"\nkey_file = \"{}\"\n", cert_file.display(), key_file.display()));
    assert!(open.contains("key_file") && open.contains("chmod 600"), "{open}");
    std::fs::set_permissions(&key_file, std::os::unix::fs::PermissionsExt::from_mode(0o600)).expect("chmod");
    // `ca_file`: the CA of cert_file, checked at start (the chain must lead to it).
    let pair = format!("[tls]\ncert_file = \"{}\"\nkey_file = \"{}\"\n", cert_file.display(), key_file.display());
    // The leaf alone (the certificate file holds its chain, the CA included).
    let text = std::fs::read_to_string(&pem).expect("pem");
    let end = "-----END CERTIFICATE-----";
    let leaf_only = dir.path().join("leaf.pem");
    std::fs::write(&leaf_only, format!("{}{end}\n", text.split(end).next().unwrap_or(""))).expect("leaf");
    let not_its_ca = serve_refused(&format!("{pair}ca_file = \"{}\"\n", leaf_only.display()));
    assert!(not_its_ca.contains("ca_file") && not_its_ca.contains("is not the CA of cert_file"), "{not_its_ca}");
    let no_cert = serve_refused(&format!("{pair}ca_file = \"{}\"\n", key.display()));
    assert!(no_cert.contains("ca_file") && no_cert.contains("no CA certificate"), "{no_cert}");
    let with_auto = serve_refused(&format!("[tls]\nauto = true\nca_file = \"{}\"\n", made.join("ca.pem").display()));
    assert!(with_auto.contains("ca_file"), "{with_auto}");

    let mut s = Server::prepare(&format!("{pair}ca_file = \"{}\"\n", made.join("ca.pem").display()));
    s.tls = true;
    // The client trusts the maker's CA; the server serves the files (not --tls-auto).
    let ca = made.join("ca.pem");
    let agent = tls_agent(&ca);
    let url = s.url("/healthz");
    let health = || {
        agent.get(&url).config().timeout_global(Some(Duration::from_secs(5))).build().call().map(|r| r.status().as_u16()).unwrap_or(0)
    };
    // Spawned by hand: `tls` makes the test client speak https, the config gives the files.
    let child = Command::new(BIN)
        .args(["serve", "--listen", &format!("127.0.0.1:{}", s.port), "--config"])
        .arg(&s.config)
        .arg("--data-dir")
        .arg(s.data_dir())
        .env("TRAINYARD_CONTAINER_ENGINE", "none")
        .stderr(std::fs::File::create(s.dir.path().join("server.log")).expect("log"))
        .spawn()
        .expect("serve");
    s.child = Some(child);
    let deadline = Instant::now() + Duration::from_secs(30);
    while health() != 200 {
        assert!(Instant::now() < deadline, "no HTTPS: {}", s.server_log());
        std::thread::sleep(Duration::from_millis(50));
    }
    let pid = nix::unistd::Pid::from_raw(s.pid().expect("pid") as i32);
    let wait_log = |what: &str| {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !s.server_log().contains(what) {
            assert!(Instant::now() < deadline, "no {what:?} in the log: {}", s.server_log());
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    // A key that is not the certificate's, on SIGHUP: refused, the one in use stays.
    std::fs::copy(made.join("ca.key"), &key_file).expect("copy");
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP).expect("SIGHUP");
    wait_log("the TLS certificate in use stays");
    assert_eq!(health(), 200);
    // The pair mended: read again.
    std::fs::copy(&key, &key_file).expect("copy");
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP).expect("SIGHUP");
    wait_log("SIGHUP: TLS certificate valid until");
    assert_eq!(health(), 200);

    // A job trusts the administrator's CA (`ca_file`, in the bundle it is given) and
    // reaches the server over TLS.
    let body = sh_job(
        "ca-file-job",
        "python3 -c 'import os, urllib.request; print(\"health\", urllib.request.urlopen(os.environ[\"STORAGE_EMULATOR_HOST\"] + \"/healthz\").status)'",
    );
    let jobs = s.url("/v1/projects/p/locations/us-central1/customJobs");
    let created: Value = agent
        .post(&jobs)
        .header("content-type", "application/json")
        .send(body.to_string())
        .expect("create")
        .body_mut()
        .read_json()
        .expect("json");
    let name = created["name"].as_str().unwrap_or_else(|| panic!("{created}")).to_string();
    let deadline = Instant::now() + Duration::from_secs(60);
    let done = loop {
        let j: Value = agent.get(&s.url(&format!("/v1/{name}"))).call().expect("get").body_mut().read_json().expect("json");
        if matches!(j["state"].as_str(), Some("JOB_STATE_SUCCEEDED" | "JOB_STATE_FAILED" | "JOB_STATE_CANCELLED")) {
            break j;
        }
        assert!(Instant::now() < deadline, "{j}");
        std::thread::sleep(Duration::from_millis(100));
    };
    let logs = agent.get(&s.url(&format!("/v1/{name}/logs"))).call().expect("logs").body_mut().read_to_string().expect("text");
    assert_eq!(done["state"], "JOB_STATE_SUCCEEDED", "{logs}\n{}", s.server_log());
    assert!(logs.contains("health 200"), "{logs}");
}
