//! `trainyard doctor`: one line per check with ok / warn / fail and the fix, exit status 0
//! only when nothing fails, the same error as `serve` for a config that does not parse,
//! and a starting server logs the summary of the checks it runs.

mod common;

use std::process::{Command, Output, Stdio};

use common::*;

const BIN: &str = env!("CARGO_BIN_EXE_trainyard");

fn run(args: &[&str]) -> Output {
    Command::new(BIN).args(args).env("TRAINYARD_CONTAINER_ENGINE", "none").env_remove("TRAINYARD_CONFIG").stdin(Stdio::null()).output().expect("run trainyard")
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

#[test]
fn doctor_says_what_is_missing_and_fails_only_on_failures() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let port = free_port().to_string();
    let listen = format!("127.0.0.1:{port}");
    let o = run(&["doctor", "--data-dir", data.to_str().unwrap(), "--listen", &listen]);
    let out = text(&o);
    for check in ["data directory", "storage root", "replica users", "clock", "listen address", "containers"] {
        assert!(out.lines().any(|l| l.contains(check) && (l.starts_with("ok ") || l.starts_with("warn "))), "{check}:\n{out}");
    }
    assert!(out.contains(" failures"), "{out}");
    assert_eq!(o.status.success(), !out.contains("\nfail "), "{out}");
    assert!(!data.exists(), "doctor made the data directory");

    // The address is taken: a failure, with its fix, and exit status 1.
    let held = std::net::TcpListener::bind(&listen).unwrap();
    let o = run(&["doctor", "--data-dir", data.to_str().unwrap(), "--listen", &listen]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(out.contains("fail  listen address") && out.contains("fix: stop what listens there"), "{out}");
    drop(held);

    // A tokens file others may read: refused as the server refuses it.
    let tokens = tmp.path().join("tokens.toml");
    std::fs::write(&tokens, "[[tokens]]\ntoken = \"0123456789abcdef0123456789abcdef\"\nprojects = [\"p\"]\n").unwrap();
    std::fs::set_permissions(&tokens, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    let o = run(&["doctor", "--data-dir", data.to_str().unwrap(), "--listen", &listen, "--tokens", tokens.to_str().unwrap()]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(out.lines().any(|l| l.starts_with("fail  tokens file") && l.contains("tokens.toml")), "{out}");

    // A config that does not parse: the server's own error, and nothing checked.
    let bad = tmp.path().join("bad.toml");
    std::fs::write(&bad, "[node\ncpus = 4\n").unwrap();
    let doctor = run(&["doctor", "--config", bad.to_str().unwrap(), "--data-dir", data.to_str().unwrap()]);
    let serve = run(&["serve", "--config", bad.to_str().unwrap(), "--data-dir", data.to_str().unwrap()]);
    assert!(!doctor.status.success() && !serve.status.success());
    assert_eq!(String::from_utf8_lossy(&doctor.stderr), String::from_utf8_lossy(&serve.stderr));
    assert!(String::from_utf8_lossy(&doctor.stderr).contains("bad.toml"), "{}", text(&doctor));
}

/// A starting server logs its host checks; doctor on the data directory it holds says so,
/// as a failure naming its pid (a server started there would be refused).
#[test]
fn a_starting_server_logs_its_host_checks() {
    let s = Server::start("");
    let log = s.server_log();
    assert!(log.contains("host checks: ") && log.contains(" failures (trainyard doctor runs them all)"), "{log}");
    let listen = format!("127.0.0.1:{}", free_port());
    let o = run(&["doctor", "--data-dir", s.data_dir().to_str().unwrap(), "--listen", &listen]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    let pid = s.pid().expect("the server's pid");
    assert!(out.lines().any(|l| l.starts_with("fail  data directory in use") && l.contains(&format!("pid {pid}"))), "{out}");
}

/// Under a systemd unit of Type=notify (packaging/trainyard.service) the server says
/// READY=1 on NOTIFY_SOCKET once it serves, and STOPPING=1 when it is told to stop.
#[test]
fn a_server_tells_its_service_manager_when_it_is_ready_and_stopping() {
    use std::os::unix::net::UnixDatagram;
    let mut s = Server::prepare("");
    let path = s.dir.path().join("notify");
    let sock = UnixDatagram::bind(&path).unwrap();
    sock.set_read_timeout(Some(std::time::Duration::from_secs(30))).unwrap();
    s.env.push(("NOTIFY_SOCKET".into(), path.display().to_string()));
    s.spawn();
    let mut buf = [0u8; 256];
    let n = sock.recv(&mut buf).expect("READY=1 within 30 s");
    assert_eq!(std::str::from_utf8(&buf[..n]).unwrap(), "READY=1\n");
    assert!(s.server_log().contains("Trainyard serving region"), "ready only once it serves");
    let pid = s.pid().unwrap() as i32;
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGTERM).unwrap();
    let n = sock.recv(&mut buf).expect("STOPPING=1 within 30 s");
    assert_eq!(std::str::from_utf8(&buf[..n]).unwrap(), "STOPPING=1\n");
}

/// Where replicas cannot have a mount namespace of their own (a root server without
/// CAP_SYS_ADMIN, as in an unprivileged container): doctor warns with the fix, a server
/// without tokens starts, says so and runs jobs with /gcs/ rewritten (before, every job
/// failed at launch), and a server with tokens refuses to start, as its replicas would see
/// other tenants' processes.
#[test]
fn without_mount_namespaces_doctor_warns_jobs_run_and_tokens_are_refused() {
    if !is_root() {
        trainyard_backend::skip_test("a server that is not root makes no mount namespaces");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    // The server, as root without CAP_SYS_ADMIN (dropped from the bounding set).
    let wrapper = tmp.path().join("trainyard-no-sys-admin");
    std::fs::write(&wrapper, format!("#!/bin/sh\nexec setpriv --bounding-set -sys_admin {BIN} \"$@\"\n")).unwrap();
    std::fs::set_permissions(&wrapper, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let wrapper = wrapper.display().to_string();

    let data = tmp.path().join("data");
    let o = Command::new(&wrapper).args(["doctor", "--data-dir", data.to_str().unwrap()]).env("TRAINYARD_CONTAINER_ENGINE", "none").output().unwrap();
    let out = text(&o);
    assert!(out.lines().any(|l| l.starts_with("warn  mount namespaces") && l.contains("unshare(CLONE_NEWNS)")), "{out}");
    assert!(out.contains("fix: Run the server with CAP_SYS_ADMIN"), "{out}");

    let s = Server::start_with_bin(Some(wrapper.clone()), "");
    assert!(s.server_log().contains("replicas cannot have a mount namespace of their own on this host"), "{}", s.server_log());
    let job = s.create("p", &sh_job("no-mount-ns", "echo ran"));
    let done = s.wait_terminal(&name_of(&job), 30);
    assert_eq!(done["state"], "JOB_STATE_SUCCEEDED", "{done}\n{}", s.logs_text(&name_of(&job)));
    drop(s);

    let tokens = tmp.path().join("tokens.toml");
    std::fs::write(&tokens, "[[tokens]]\nname = \"ci\"\ntoken = \"ci-7f3a9d2c5e1b8046\"\nprojects = [\"p\"]\n").unwrap();
    std::fs::set_permissions(&tokens, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let listen = format!("127.0.0.1:{}", free_port());
    let o = Command::new(&wrapper)
        .args(["serve", "--data-dir", data.to_str().unwrap(), "--listen", &listen, "--tokens", tokens.to_str().unwrap()])
        .env("TRAINYARD_CONTAINER_ENGINE", "none")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let out = text(&o);
    assert!(!o.status.success(), "{out}");
    assert!(out.contains("refusing to serve tokens") && out.contains("CAP_SYS_ADMIN"), "{out}");
}
