//! The simulator running the real engine (`trainyard_sim::engine`): every job goes through
//! the lifecycle's `step` (L1-L23) with the scheduler's rounds, in virtual time.

use trainyard_core::job::{HOUR, SECOND};
use trainyard_sim::engine::{simulate_engine, Faults};
use trainyard_sim::{default_policies, synthetic, Policy, GPUS_PER_NODE};

fn ours() -> Policy {
    default_policies().into_iter().find(|p| p.name == "trainyard").expect("our policy")
}

fn ended(r: &trainyard_sim::engine::EngineReport) -> usize {
    ["JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED"].iter().map(|s| r.by_state.get(s).copied().unwrap_or(0)).sum()
}

/// Without faults every job ends: SUCCEEDED when its work fits its time limit, FAILED by
/// L19 when it does not; every job is placed once and nothing restarts.
#[test]
fn l19_without_faults_every_job_ends_by_its_work_and_its_limit() {
    let nodes = 16;
    let jobs = synthetic(7, 300, nodes as u64 * GPUS_PER_NODE as u64, 0.9);
    let r = simulate_engine(&jobs, nodes, &ours(), 10 * SECOND, &Faults::none(), 1);
    assert_eq!(ended(&r), jobs.len(), "{:?}", r.by_state);
    // The launch takes 2 s before the work starts; L19 counts from admission.
    let fits = jobs.iter().filter(|j| j.duration + 2 * SECOND < j.limit).count();
    let over = jobs.iter().filter(|j| j.duration + 2 * SECOND > j.limit + SECOND).count();
    let ok = r.by_state.get("JOB_STATE_SUCCEEDED").copied().unwrap_or(0);
    assert!(ok >= fits && ok <= jobs.len() - over, "{ok} succeeded; {fits} fit their limit, {over} do not; {:?}", r.by_state);
    assert_eq!(r.restarts, 0);
    assert_eq!(r.retries, 0);
    assert!(r.placements as usize >= jobs.len() - r.by_state.get("JOB_STATE_QUEUED").copied().unwrap_or(0));
    assert!(r.steps as usize > 3 * jobs.len(), "place, started per replica, exited per replica: {}", r.steps);
}

/// L10, L11, L12, L13, L14 with faults: replicas killed by signals restart in place,
/// transient exits retry the job, OOM kills fail it with code 8; every job still ends.
#[test]
fn l10_l14_faults_restart_retry_and_fail_by_the_rules() {
    let nodes = 16;
    let jobs = synthetic(11, 400, nodes as u64 * GPUS_PER_NODE as u64, 0.8);
    let faults = Faults { signal: 0.2, transient: 0.05, oom: 0.03, ..Faults::none() };
    let r = simulate_engine(&jobs, nodes, &ours(), 10 * SECOND, &faults, 3);
    assert_eq!(ended(&r), jobs.len(), "{:?}", r.by_state);
    assert!(r.restarts > 0, "signals restart replicas in place (L10)");
    assert!(r.retries > 0, "transient exits retry the job (L12, L13)");
    assert!(r.by_state.get("JOB_STATE_FAILED").copied().unwrap_or(0) > 0, "OOM kills fail jobs (L14)");
    assert!(r.by_state.get("JOB_STATE_SUCCEEDED").copied().unwrap_or(0) > jobs.len() / 2, "{:?}", r.by_state);
    // The same seed makes the same run.
    let again = simulate_engine(&jobs, nodes, &ours(), 10 * SECOND, &faults, 3);
    assert_eq!((again.by_state.clone(), again.steps, again.restarts), (r.by_state.clone(), r.steps, r.restarts));
}

/// L9, L15: nodes lost under running jobs: their replicas restart on other nodes (not
/// counted against L11), and while a node is down the capacity it took is missing, which
/// the scheduler reports as stockouts that the lifecycle retries with backoff; every job
/// still ends.
#[test]
fn l9_l15_node_losses_move_replicas_and_make_stockouts() {
    let nodes = 16;
    let jobs = synthetic(5, 300, nodes as u64 * GPUS_PER_NODE as u64, 0.9);
    let faults = Faults { node_loss_per_day: 1.0, node_repair: 2 * HOUR, ..Faults::none() };
    let r = simulate_engine(&jobs, nodes, &ours(), 10 * SECOND, &faults, 9);
    assert_eq!(ended(&r), jobs.len(), "{:?}", r.by_state);
    assert!(r.node_losses > 0);
    assert!(r.restarts > 0, "replicas on lost nodes restarted elsewhere (L9)");
    assert!(r.stockouts + r.stockout_retries > 0, "capacity missing while nodes are down (L15): {r:?}");
}

/// TY10: the same workload with elastic jobs: every job still ends, none is retried,
/// elastic jobs start at their minimum, grow and give way (their replicas join and
/// leave), and the GPU time of the work never exceeds the GPU time held.
#[test]
fn ty10_elastic_jobs_end_grow_and_give_way_without_retries() {
    let nodes = 16;
    let jobs = synthetic(7, 300, nodes as u64 * GPUS_PER_NODE as u64, 0.9);
    let r = trainyard_sim::engine::simulate_engine_elastic(&jobs, nodes, &ours(), 10 * SECOND, &Faults::none(), 1, Some(0.5));
    assert_eq!(ended(&r), jobs.len(), "{:?}", r.by_state);
    assert_eq!(r.retries, 0);
    assert!(r.elastic_jobs > 0 && r.grows > 0, "{} elastic jobs, {} joins", r.elastic_jobs, r.grows);
    assert!(r.goodput > 0.0 && r.goodput <= 1.0 + 1e-9, "{}", r.goodput);
    assert!(r.gpu_utilisation > 0.0 && r.gpu_utilisation <= 1.0 + 1e-9, "{}", r.gpu_utilisation);
    let rigid = simulate_engine(&jobs, nodes, &ours(), 10 * SECOND, &Faults::none(), 1);
    assert_eq!((rigid.elastic_jobs, rigid.grows, rigid.leaves), (0, 0, 0));
}
