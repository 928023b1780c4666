//! One server per data directory: a second `trainyard serve` on the same directory is
//! refused at start, naming the directory and the pid of the server that holds it.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::*;

#[test]
fn a_second_server_on_the_same_data_dir_is_refused() {
    let s = Server::start("");
    let first_pid = s.child.as_ref().expect("running").id();
    let lock = std::fs::read_to_string(s.data_dir().join("server.lock")).expect("server.lock");
    assert_eq!(lock.trim(), first_pid.to_string(), "the lock file holds the holder's pid");
    let second_port = free_port();
    let mut second = Command::new(BIN)
        .args(["serve", "--listen", &format!("127.0.0.1:{second_port}"), "--config"])
        .arg(&s.config)
        .arg("--data-dir")
        .arg(s.data_dir())
        .env_remove("TRAINYARD_CONFIG")
        .current_dir(s.dir.path())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn the second server");
    // It must exit on its own; a second server that starts would serve for ever.
    let deadline = Instant::now() + Duration::from_secs(20);
    while second.try_wait().expect("try_wait").is_none() {
        if Instant::now() > deadline {
            let _ = second.kill();
            let _ = second.wait();
            panic!("the second server did not exit");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = second.wait_with_output().expect("output");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the second server must fail: {err}");
    assert!(err.contains(&s.data_dir().display().to_string()), "names the directory: {err}");
    assert!(err.contains(&format!("pid {first_pid}")), "names the holder's pid: {err}");
    assert!(err.contains("another Trainyard server"), "{err}");
    // It never listened, and the first one still answers.
    assert!(std::net::TcpStream::connect(("127.0.0.1", second_port)).is_err(), "the second server listened");
    let (status, _) = s.call("GET", &s.url("/healthz"), None);
    assert_eq!(status, 200);
    let (status, body) = s.call("GET", &s.jobs_url("p"), None);
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        std::fs::read_to_string(s.data_dir().join("server.lock")).expect("server.lock").trim(),
        first_pid.to_string(),
        "the refused server left the pid alone"
    );
}

/// The lock goes with the process: after a SIGKILL, a new server starts on the directory.
#[test]
fn the_lock_is_released_when_the_server_dies() {
    let mut s = Server::start("");
    s.kill9();
    s.spawn();
    let pid = s.child.as_ref().expect("running").id();
    let lock = std::fs::read_to_string(s.data_dir().join("server.lock")).expect("server.lock");
    assert_eq!(lock.trim(), pid.to_string());
}
