//! The starvation guarantee on generated workloads. Workloads are small fleets (2-4
//! nodes) with 1-8 GPU jobs and some gangs, from projects of very different sizes, with
//! time limits at most 4x the run time (the scheduler sees only the limits).
//!
//! What holds (the scheduler's module docs): the oldest starving job's reservation is
//! never made later from one round to the next, and the job starts by it, within one
//! round interval (rounds are at least that far apart). What does not: a bound against
//! EASY backfill's longest wait on the same workload (kept below with a counterexample).

use std::cell::Cell;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use trainyard_core::job::SECOND;
use trainyard_sim::guarantee::{check_reservations, Checked};
use trainyard_sim::{default_policies, simulate, table, SimJob};

const BOUND_SECS: u64 = 1800;
const INTERVAL: i64 = 10;

fn job() -> impl Strategy<Value = (u32, u32, u32, u8, u32, u8)> {
    // (arrival gap s, run time s, limit factor x10, size class, project, gang replicas)
    (0u32..1800, 60u32..20_000, 10u32..40, 0u8..10, 0u32..100, 1u8..3)
}

fn workload(raw: &[(u32, u32, u32, u8, u32, u8)], nodes: usize) -> Vec<SimJob> {
    let mut t = 0u64;
    raw.iter()
        .enumerate()
        .map(|(i, &(gap, run, factor, class, project, gang))| {
            t += gap as u64;
            // Mostly 1-GPU jobs, some 2-4, a fair share of whole-node jobs and, on
            // fleets of 3 nodes or more, a few 2-node gangs.
            let (replicas, per) = match class {
                0..=4 => (1, 1),
                5 => (1, 2),
                6 => (1, 4),
                7 | 8 => (1, 8),
                _ if nodes >= 3 => (gang as u32, 8),
                _ => (1, 8),
            };
            // Projects of very different sizes: 70%, 20%, 8%, 2% of the jobs.
            let project = match project {
                0..=69 => "big",
                70..=89 => "mid",
                90..=97 => "small",
                _ => "tiny",
            };
            let duration = run as i64 * SECOND;
            SimJob {
                id: i as u64 + 1,
                submit: t as i64 * SECOND,
                duration,
                limit: duration * factor as i64 / 10,
                replicas,
                gpus_per_replica: per,
                project: project.to_string(),
                spot: false,
                priority: 0,
            }
        })
        .collect()
}

// Not a guarantee: the two policies leave different jobs running, so a job can find the
// fleet in a worse state under ours than under EASY even though it holds a reservation
// from the bound on. Shrunk counterexample (2 nodes, all of one project, arrivals at 0):
// 1-GPU jobs of 2,269 s, 60 s, 60 s, 8,402 s (limit 3.5x) and an 8-GPU job of 6,850 s
// (limit 2.5x) and later ones: ours 33,739 s against EASY's 30,292 s. Run with --ignored
// to measure how often the per-workload bound holds.
proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]
    #[test]
    #[ignore = "per-workload comparison with EASY is not guaranteed; see the counterexample above"]
    fn longest_wait_within_easy_plus_bound(raw in prop::collection::vec(job(), 20..120), nodes in 2usize..5) {
        let jobs = workload(&raw, nodes);
        let mut policies = default_policies();
        for p in &mut policies {
            if p.name == "trainyard" {
                p.cfg.starvation_secs = Some(BOUND_SECS);
            }
        }
        let easy = simulate(&jobs, nodes, &policies[1], INTERVAL * SECOND);
        let ours = simulate(&jobs, nodes, &policies[2], INTERVAL * SECOND);
        prop_assert_eq!(ours.finished, jobs.len());
        let slack = (BOUND_SECS + INTERVAL as u64) as f64;
        prop_assert!(
            ours.max_wait_s <= easy.max_wait_s + slack,
            "ours {} s, EASY {} s, bound {} s\n{}",
            ours.max_wait_s,
            easy.max_wait_s,
            BOUND_SECS,
            table(&[easy.clone(), ours.clone()])
        );
    }
}

/// The guarantee that holds (see `trainyard_sim::guarantee`): the oldest starving job's
/// reservation never moves later from round to round, and the job starts by it within a
/// round interval. Checked on 96 generated workloads; fails if no workload ever had a
/// starving job with a reservation (the check would prove nothing).
#[test]
fn the_oldest_starving_jobs_reservation_only_moves_earlier_and_is_kept() {
    let mut runner = TestRunner::new(Config { cases: 96, ..Config::default() });
    let total = Cell::new(Checked::default());
    let result = runner.run(&(prop::collection::vec(job(), 20..120), 2usize..5), |(raw, nodes)| {
        let jobs = workload(&raw, nodes);
        let policy = default_policies().into_iter().find(|p| p.name == "trainyard").expect("our policy");
        let c = check_reservations(&jobs, nodes, &policy, INTERVAL * SECOND, BOUND_SECS).map_err(TestCaseError::fail)?;
        let t = total.get();
        total.set(Checked { rounds: t.rounds + c.rounds, jobs: t.jobs + c.jobs });
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    let t = total.get();
    assert!(t.rounds > 0 && t.jobs > 0, "no workload had a starving job with a reservation");
    eprintln!("checked {} rounds and {} starving jobs' starts", t.rounds, t.jobs);
}
