//! goodput-bench: what goodput's bookkeeping (TY10, `trainyard_core::goodput`) costs the
//! driver at N running jobs (1,000 by default; four replicas each, one pool elastic): each
//! transition of a job adds the time since the last one to a bucket (`Goodput::after`),
//! and each read of a job shows it up to now (`Goodput::until`). The baseline, measured in
//! the same run on the same events: the whole `step` of those transitions (which includes
//! the bookkeeping). Prints each per pass over the N jobs, their ratio, and the share of one
//! core the bookkeeping takes at one transition and one read per job and second.
//!
//!     cargo run --release -p trainyard-bench --bin goodput-bench -- [jobs] [--quick]

use std::hint::black_box;
use std::time::Instant;

use trainyard_core::goodput::Goodput;
use trainyard_core::job::{Demand, ElasticPool, Policy, ReplicaDemand, SECOND};
use trainyard_core::{step, Event, Job, RunId, Settings};

#[path = "../shared/row.rs"]
mod row;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// A running job of four replicas (the primary and three elastic workers, at least one).
fn running(id: u64, s: &Settings) -> Job {
    let mut p = Policy::defaults(s);
    p.elastic = vec![ElasticPool { pool: 1, min: 1 }];
    let d = ReplicaDemand { cpus: 8, memory_bytes: 30 << 30, accelerator: Some(("NVIDIA_TESLA_T4".into(), 1)) };
    let demand = Demand { metrics: Default::default(), replicas: vec![d; 4] };
    let mut j = Job::new(id, "p".into(), "r".into(), &[1, 3], demand, p, true, 0);
    let nodes = (0..4).map(|i| format!("n{i}")).collect();
    j = step(&j, Event::Place { nodes, addresses: vec![], notes: vec![] }, SECOND, s).expect("place").job;
    for r in 0..4 {
        let name = j.replicas[r].name.clone();
        let run = RunId { job: id, attempt: 0, replica: name, restart: 0 };
        j = step(&j, Event::Started { run }, 2 * SECOND, s).expect("start").job;
    }
    j
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    let n: usize = args.iter().find_map(|a| a.parse().ok()).unwrap_or(if quick { 200 } else { 1000 });
    let passes = if quick { 20 } else { 200 };
    let s = Settings::default();
    let jobs: Vec<Job> = (1..=n as u64).map(|id| running(id, &s)).collect();
    // One transition per job: its replica workerpool1-0 seen writing (hang detection's
    // event, the most frequent one a running job gets).
    let mut t_step = Vec::new();
    let mut t_after = Vec::new();
    let mut t_until = Vec::new();
    for pass in 0..passes {
        let now = (10 + pass as i64) * SECOND;
        let t0 = Instant::now();
        let next: Vec<Job> = jobs
            .iter()
            .map(|j| step(j, Event::Activity { replica: "workerpool1-0".into(), at: now }, now, &s).expect("step").job)
            .collect();
        t_step.push(t0.elapsed().as_secs_f64());
        let t0 = Instant::now();
        for (old, new) in jobs.iter().zip(&next) {
            black_box(Goodput::after(old, new, now, false));
        }
        t_after.push(t0.elapsed().as_secs_f64());
        let t0 = Instant::now();
        for j in &next {
            black_box(Goodput::until(j, now + SECOND));
        }
        t_until.push(t0.elapsed().as_secs_f64());
    }
    let (step_s, after_s, until_s) = (median(t_step), median(t_after), median(t_until));
    let book = after_s + until_s;
    println!("{n} running jobs, {passes} passes (medians per pass over every job):");
    println!("  step() of one transition each:        {:>9.1} us (baseline; includes the bookkeeping)", step_s * 1e6);
    println!("  Goodput::after of each transition:    {:>9.1} us", after_s * 1e6);
    println!("  Goodput::until of each job (a read):  {:>9.1} us", until_s * 1e6);
    println!(
        "  at one transition and one read per job and second: {:.4}% of a core (target: under 1%)",
        book * 100.0
    );
    row::row(
        "goodput-bench",
        &format!("goodput bookkeeping per second, {n} running jobs (1 transition + 1 read each)"),
        &format!("{:.1} us ({:.4}% of a core)", book * 1e6, book * 100.0),
        &format!("{:.1} us step() of the transitions", step_s * 1e6),
        book / step_s.max(1e-12),
    );
}
