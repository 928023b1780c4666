//! L20 with a real server: a cancel whose stop the run's supervisor cannot answer (its shim
//! was stopped with SIGSTOP, and its program ignores SIGTERM) still ends: past the grace
//! period the stop becomes a kill that does not need the shim.

mod common;

use std::time::{Duration, Instant};

use common::*;

/// L20: a SIGSTOPped shim does not leave a cancel in CANCELLING for ever.
#[test]
fn l20_cancel_ends_even_when_the_shim_is_stopped() {
    let s = Server::start("");
    let job = s.create("p", &sh_job("stubborn", "trap '' TERM; sleep 600"));
    let name = name_of(&job);
    s.wait_for(&name, 30, |j| j["state"] == "JOB_STATE_RUNNING");
    let dir = run_dir(&s.data_dir(), id_of(&job), 0, "workerpool0-0", 0);
    let shim = procs_with(&dir.display().to_string())
        .into_iter()
        .find(|(_, argv)| argv.first().is_some_and(|a| a.ends_with("shim")) || argv.get(1).is_some_and(|a| a == "shim"))
        .map(|(pid, _)| pid)
        .expect("the run's shim");
    let started: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("started.json")).unwrap()).unwrap();
    let program = started["pid"].as_i64().expect("the program's pid") as i32;
    // SAFETY: kill(2) on a pid of this test's own server's shim.
    assert_eq!(unsafe { libc::kill(shim, libc::SIGSTOP) }, 0);
    let t0 = Instant::now();
    let (status, body) = s.call("POST", &s.url(&format!("/v1/{name}:cancel")), None);
    assert_eq!(status, 200, "{body}");
    // Grace (1 s in the tests' config) plus the margin (10 s), then the kill.
    let done = s.wait_terminal(&name, 40);
    assert_eq!(done["state"], "JOB_STATE_CANCELLED", "{done:#}");
    println!("cancel of a run whose shim was stopped ended after {:.1} s", t0.elapsed().as_secs_f64());
    assert!(t0.elapsed() >= Duration::from_secs(1), "not before the grace period");
    // Nothing of the run is left: not the shim, not the program.
    let deadline = Instant::now() + Duration::from_secs(10);
    let alive = |pid: i32| std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|st| !st.contains(") Z"));
    while !procs_with(&dir.display().to_string()).is_empty() || alive(program) {
        assert!(Instant::now() < deadline, "left: {:?}", procs_with(&dir.display().to_string()));
        std::thread::sleep(Duration::from_millis(100));
    }
}
