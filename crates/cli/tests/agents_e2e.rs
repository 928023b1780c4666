//! Virtual nodes' agents do not outlive their purpose: they outlive a server (a restarted
//! server adopts them) but exit when their data directory is deleted, when their node is no
//! longer in the config, and with the server when `stop_node_agents = true`.

mod common;

use std::time::{Duration, Instant};

use common::*;

const TWO_NODES: &str = "[[nodes]]\nname = \"n1\"\ncpus = 4\nmemory_gb = 16\n\n[[nodes]]\nname = \"n2\"\ncpus = 4\nmemory_gb = 16\n";

/// The pid of the agent of `node`, waiting for it to appear.
fn agent_of(s: &Server, node: &str) -> i32 {
    let lock = s.data_dir().join("nodes").join(format!("{node}.lock"));
    let needle = format!("node-agent {}", lock.display());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let pids = pids_with(&needle);
        if pids.len() == 1 {
            return pids[0];
        }
        assert!(pids.len() < 2, "one agent per node: {pids:?}");
        assert!(Instant::now() < deadline, "no agent for {node}:\n{}", s.server_log());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A live process (not a zombie).
fn alive(pid: i32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    !stat.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
}

/// Wait up to `secs` for every pid to end; the time it took, or the pids left.
fn wait_gone(pids: &[i32], secs: u64) -> Result<Duration, Vec<i32>> {
    let t0 = Instant::now();
    loop {
        let left: Vec<i32> = pids.iter().copied().filter(|p| alive(*p)).collect();
        if left.is_empty() {
            return Ok(t0.elapsed());
        }
        if t0.elapsed() > Duration::from_secs(secs) {
            return Err(left);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// SIGTERM the server and wait for it: a clean shutdown.
fn terminate(s: &mut Server) -> std::process::ExitStatus {
    let mut child = s.child.take().expect("running");
    // SAFETY: kill(2) has no memory effects.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the server did not stop on SIGTERM:\n{}", s.server_log());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn agents_exit_when_the_data_dir_of_a_stopped_server_is_deleted() {
    let mut s = Server::start(TWO_NODES);
    let agents = [agent_of(&s, "n1"), agent_of(&s, "n2")];
    s.kill9();
    // With no server, agents keep running on purpose: the next start adopts them.
    std::thread::sleep(Duration::from_millis(1500));
    assert!(agents.iter().all(|p| alive(*p)), "the agents outlive the server");
    std::fs::remove_dir_all(s.data_dir()).expect("remove the data directory");
    match wait_gone(&agents, 5) {
        Ok(took) => eprintln!("agents exited {took:?} after their data directory was deleted"),
        Err(left) => panic!("agents still running 5 s after their data directory was deleted: {left:?}"),
    }
}

#[test]
fn the_agent_of_a_node_removed_from_the_config_exits_and_the_others_are_adopted() {
    let mut s = Server::start(TWO_NODES);
    let (n1, n2) = (agent_of(&s, "n1"), agent_of(&s, "n2"));
    // A clean stop leaves the agents running by default.
    assert!(terminate(&mut s).success(), "{}", s.server_log());
    std::thread::sleep(Duration::from_millis(1500));
    assert!(alive(n1) && alive(n2), "the agents outlive a clean stop by default");
    std::fs::write(&s.config, config_text("[[nodes]]\nname = \"n1\"\ncpus = 4\nmemory_gb = 16\n")).expect("config");
    s.spawn();
    match wait_gone(&[n2], 5) {
        Ok(took) => eprintln!("the removed node's agent exited {took:?} after the start"),
        Err(_) => panic!("the agent of n2, no longer configured, still runs:\n{}", s.server_log()),
    }
    assert!(alive(n1), "the agent of n1 lives on");
    assert_eq!(agent_of(&s, "n1"), n1, "adopted, not started again");
    let (status, body) = s.call("GET", &s.url("/v1/admin/nodes"), None);
    assert_eq!(status, 200, "{body}");
    let nodes = body["nodes"].as_array().expect("nodes");
    assert_eq!(nodes.len(), 1, "{body}");
    assert_eq!(nodes[0]["state"], "UP", "{body}");
    // Still up a while later: the fleet file lists it.
    std::thread::sleep(Duration::from_millis(1500));
    assert!(alive(n1));
    let (_, body) = s.call("GET", &s.url("/v1/admin/nodes/n1"), None);
    assert_eq!(body["state"], "UP", "{body}");
}

#[test]
fn stop_node_agents_stops_them_with_the_server() {
    let mut s = Server::start(&format!("stop_node_agents = true\n{TWO_NODES}"));
    let agents = [agent_of(&s, "n1"), agent_of(&s, "n2")];
    let t0 = Instant::now();
    let status = terminate(&mut s);
    assert!(status.success(), "{status}:\n{}", s.server_log());
    eprintln!("the server stopped with its agents in {:?}", t0.elapsed());
    if let Err(left) = wait_gone(&agents, 2) {
        panic!("agents still running after a clean stop with stop_node_agents: {left:?}\n{}", s.server_log());
    }
    // The next start brings them back.
    s.spawn();
    let again = [agent_of(&s, "n1"), agent_of(&s, "n2")];
    assert!(again.iter().all(|p| !agents.contains(p)), "new agents");
    let (_, body) = s.call("GET", &s.url("/v1/admin/nodes"), None);
    assert!(body["nodes"].as_array().is_some_and(|n| n.iter().all(|n| n["state"] == "UP")), "{body}");
}
