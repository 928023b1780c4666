//! Failover time of two servers on one PostgreSQL store, over 20 losses of the leader of
//! each kind, measured from the loss to the first job the new leader starts (a job
//! created through the follower right after the loss, RUNNING):
//!
//! - kill -9 on this host: the follower finds the holder's process gone and takes the
//!   lease over at once;
//! - a frozen leader (SIGSTOP, as a host that is gone or cut off): the follower waits for
//!   the lease to expire (`[store] lease_secs`, 2 here).
//!
//! The figures are printed (p50 and max); the only bound asserted is that a new leader
//! starts the job at all (within 60 s): timings on these machines are noisy.
//!
//! Needs `TRAINYARD_TEST_PG_URL` (scripts/pg/up.sh); CI always gives it.

mod common;

use std::time::{Duration, Instant};

use common::*;

const LOSSES: usize = 20;
const LEASE_SECS: u64 = 2;

/// Lose the leader of `a` and `b` (`freeze`: SIGSTOP, else kill -9); the seconds from the
/// loss to a job created through the other server RUNNING (its display name and name go
/// to `acknowledged`). The lost one is started again (as a follower).
fn lose_leader(a: &mut Server, b: &mut Server, freeze: bool, n: usize, acknowledged: &mut Vec<(String, String)>) -> f64 {
    let a_leads = healthz(a.port).contains("leader, epoch");
    let (lost, other) = if a_leads { (a, b) } else { (b, a) };
    assert!(healthz(other.port).contains("follower"), "{} / {}", healthz(lost.port), healthz(other.port));
    let pid = lost.pid().unwrap() as i32;
    let api = other.api();
    let t0 = Instant::now();
    if freeze {
        // SAFETY: kill(2) has no memory effects.
        unsafe { libc::kill(pid, libc::SIGSTOP) };
    } else {
        lost.kill9();
    }
    // The follower forwards to the lost leader (503) until it leads itself. A try whose
    // answer was lost (a cut connection) may have been done: each try has a name of its
    // own, and only the acknowledged one is checked.
    let mut tries = 0;
    let name = loop {
        tries += 1;
        let job = sh_job(&format!("after-{n}-{tries}"), "sleep 1").to_string();
        match api.try_call("POST", &api.jobs_url("p"), Some(&job)) {
            Ok((200, v)) => break name_of(&v),
            Ok((503, _)) | Err(_) => {}
            Ok((code, v)) => panic!("create through the follower: {code} {v}"),
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "no new leader 60 s after the loss");
        std::thread::sleep(Duration::from_millis(20));
    };
    loop {
        if other.get(&name)["state"] == "JOB_STATE_RUNNING" {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "the new leader has not started {name} 60 s after the loss");
        std::thread::sleep(Duration::from_millis(20));
    }
    let took = t0.elapsed().as_secs_f64();
    acknowledged.push((format!("after-{n}-{tries}"), name));
    if freeze {
        lost.kill9();
    }
    lost.spawn();
    took
}

#[test]
fn failover_time_over_twenty_losses_of_the_leader() {
    let Some(_) = pg_or_skip("the failover measure") else { return };
    let url = new_pg_store();
    let (_shared, mut a, mut b) = pair(&format!("[store]\nurl = \"{url}\"\nlease_secs = {LEASE_SECS}\n"));
    let mut acknowledged = Vec::new();
    let killed: Vec<f64> = (0..LOSSES).map(|n| lose_leader(&mut a, &mut b, false, n, &mut acknowledged)).collect();
    let frozen: Vec<f64> = (0..LOSSES).map(|n| lose_leader(&mut a, &mut b, true, LOSSES + n, &mut acknowledged)).collect();
    eprintln!(
        "failover to the first job started by the new leader, {LOSSES} losses each (lease {LEASE_SECS} s; goal lease + 2 s): \
         kill -9 p50 {:.2} s max {:.2} s; frozen leader (lease expiry) p50 {:.2} s max {:.2} s",
        percentile(&killed, 0.5),
        percentile(&killed, 1.0),
        percentile(&frozen, 0.5),
        percentile(&frozen, 1.0)
    );
    // Every job the leaders acknowledged is there once and ended.
    let leader = if healthz(a.port).contains("leader, epoch") { &a } else { &b };
    for (display, name) in &acknowledged {
        let (_, list) = leader.call("GET", &format!("{}?filter=display_name%3D%22{display}%22", leader.jobs_url("p")), None);
        let jobs = list["customJobs"].as_array().cloned().unwrap_or_default();
        assert_eq!(jobs.len(), 1, "{display}: {list}");
        assert_eq!(jobs[0]["name"], name.as_str(), "{display}: {list}");
        let ended = leader.wait_terminal(name, 60);
        assert_eq!(ended["state"], "JOB_STATE_SUCCEEDED", "{ended}");
    }
}
