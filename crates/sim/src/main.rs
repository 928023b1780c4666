//! `trainyard-sim`: run the scheduler on a synthetic workload (default) or a trace, for our
//! policy and two baselines (strict FIFO, EASY backfill), and print the results table.

use std::process::ExitCode;

use trainyard_core::job::SECOND;
use trainyard_sim::engine::{simulate_engine, simulate_engine_elastic, EngineReport, Faults};
use trainyard_sim::guarantee::check_reservations;
use trainyard_sim::{
    cohort_quotas, default_policies, hms, parse_trace_with, simulate, synthetic, table, verdict, wait_table, worst_excess, TraceOptions, GPUS_PER_NODE,
};

const USAGE: &str = "usage: trainyard-sim [--nodes N] [--jobs N] [--seed N] [--load F] [--interval SECS] [--trace FILE.csv] [--quick]
  --nodes     nodes of 8 GPUs (default 10000)
  --jobs      synthetic jobs (default 100000)
  --seed      workload seed (default 1)
  --load      offered load as a fraction of the fleet's GPUs (default 0.95)
  --interval  least simulated seconds between scheduling rounds (default 10)
  --priority-from COL  a trace column whose value is each job's priority class (a number,
              or a name of --priority-classes)
  --priority-classes NAME=VALUE,...  class values; without --priority-from, by project
  --cohort NAME=P1,P2,...  projects that lend each other their GPU quota (repeatable); each
              project of a cohort gets an equal share of the fleet's GPUs as its quota
  --sharing   the synthetic workload with classes (foundation 100, batch -100) and two
              cohorts (research: vision, speech, recsys, nlp; gen: llm, rl, foundation, batch)
  --max-reservations N  at most N jobs hold a reservation at once (our policy; default 64)
  --starvation  seconds after which a waiting job goes ahead of the fair order (our policy)
  --trace     CSV: submit_time_s,duration_s,replicas,gpus_per_replica,project[,more columns]
  --compress F  divide a trace's submission times by F (its arrivals F times as dense)
  --quick     500 nodes, 5000 jobs
  --check-guarantee  check the starvation guarantee on this workload (our policy, the
              --starvation bound or 7200 s): the oldest starving job's reservation never
              moves later and the job starts by it
  --engine    run our policy with the real lifecycle (trainyard_core::step) and faults,
              against the plan-only model of the same run
  --elastic F  with --engine: the same workload run rigid and then elastic (TY10: every job
              of 3 replicas or more, its workers at least ceil(F x workers)), side by side";

fn main() -> ExitCode {
    let mut nodes = 10_000usize;
    let mut jobs = 100_000usize;
    let mut seed = 1u64;
    let mut load = 0.95f64;
    let mut interval = 10u64;
    let mut trace: Option<String> = None;
    let mut starvation: Option<u64> = None;
    let mut engine = false;
    let mut elastic: Option<f64> = None;
    let mut check = false;
    let mut compress = 1.0f64;
    let mut max_resv: Option<usize> = None;
    let mut topts = TraceOptions::default();
    let mut cohorts: Vec<(String, Vec<String>)> = Vec::new();
    let mut sharing = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = |name: &str| args.next().ok_or_else(|| format!("{name} needs a value"));
        let r: Result<(), String> = (|| {
            match a.as_str() {
                "--nodes" => nodes = val("--nodes")?.parse().map_err(|e| format!("--nodes: {e}"))?,
                "--jobs" => jobs = val("--jobs")?.parse().map_err(|e| format!("--jobs: {e}"))?,
                "--seed" => seed = val("--seed")?.parse().map_err(|e| format!("--seed: {e}"))?,
                "--load" => load = val("--load")?.parse().map_err(|e| format!("--load: {e}"))?,
                "--interval" => interval = val("--interval")?.parse().map_err(|e| format!("--interval: {e}"))?,
                "--trace" => trace = Some(val("--trace")?),
                "--compress" => {
                    compress = val("--compress")?.parse().map_err(|e| format!("--compress: {e}"))?;
                    if !(compress.is_finite() && compress > 0.0) {
                        return Err("--compress must be a number above 0".into());
                    }
                }
                "--starvation" => starvation = Some(val("--starvation")?.parse().map_err(|e| format!("--starvation: {e}"))?),
                "--engine" => engine = true,
                "--elastic" => {
                    let f: f64 = val("--elastic")?.parse().map_err(|e| format!("--elastic: {e}"))?;
                    if !(f > 0.0 && f <= 1.0) {
                        return Err("--elastic must be a fraction above 0 and at most 1".into());
                    }
                    elastic = Some(f);
                }
                "--priority-from" => topts.priority_from = Some(val("--priority-from")?),
                "--priority-classes" => {
                    for kv in val("--priority-classes")?.split(',').filter(|x| !x.is_empty()) {
                        let (k, v) = kv.split_once('=').ok_or_else(|| format!("--priority-classes: {kv:?} is not NAME=VALUE"))?;
                        let v: i64 = v.parse().map_err(|e| format!("--priority-classes {k}: {e}"))?;
                        topts.classes.insert(k.to_string(), v);
                    }
                }
                "--cohort" => {
                    let c = val("--cohort")?;
                    let (name, ps) = c.split_once('=').ok_or_else(|| format!("--cohort: {c:?} is not NAME=P1,P2"))?;
                    let ps: Vec<String> = ps.split(',').filter(|x| !x.is_empty()).map(String::from).collect();
                    if name.is_empty() || ps.is_empty() {
                        return Err(format!("--cohort: {c:?} needs a name and projects"));
                    }
                    if let Some(p) = ps.iter().find(|p| cohorts.iter().any(|(_, q)| q.contains(p))) {
                        return Err(format!("--cohort: project {p} is in two cohorts"));
                    }
                    cohorts.push((name.to_string(), ps));
                }
                "--sharing" => sharing = true,
                "--max-reservations" => max_resv = Some(val("--max-reservations")?.parse().map_err(|e| format!("--max-reservations: {e}"))?),
                "--check-guarantee" => check = true,
                "--quick" => {
                    nodes = 500;
                    jobs = 5_000;
                }
                "-h" | "--help" => return Err(String::new()),
                other => return Err(format!("unknown argument {other}")),
            }
            Ok(())
        })();
        if let Err(e) = r {
            if !e.is_empty() {
                eprintln!("trainyard-sim: {e}");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    }
    let workload = match &trace {
        Some(path) => {
            let text = match std::fs::read_to_string(path) {
                Ok(t) => t,
                Err(e) => {
                    eprintln!("trainyard-sim: cannot read {path}: {e}");
                    return ExitCode::from(2);
                }
            };
            match parse_trace_with(&text, &topts) {
                Ok(mut w) => {
                    for j in &mut w {
                        j.submit = (j.submit as f64 / compress) as i64;
                    }
                    w
                }
                Err(e) => {
                    eprintln!("trainyard-sim: {path}: {e}");
                    return ExitCode::from(2);
                }
            }
        }
        None => {
            let mut w = synthetic(seed, jobs, nodes as u64 * GPUS_PER_NODE as u64, load);
            if sharing {
                topts.classes.entry("foundation".into()).or_insert(100);
                topts.classes.entry("batch".into()).or_insert(-100);
                if cohorts.is_empty() {
                    let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
                    cohorts.push(("research".into(), names(&["vision", "speech", "recsys", "nlp"])));
                    cohorts.push(("gen".into(), names(&["llm", "rl", "foundation", "batch"])));
                }
            }
            for j in &mut w {
                j.priority = topts.classes.get(&j.project).copied().unwrap_or(0);
            }
            w
        }
    };
    let gpu_h: f64 = workload.iter().map(|j| j.gpus() as f64 * j.duration as f64 / 3.6e9).sum();
    let span = workload.last().map_or(0, |j| j.submit) as f64 / SECOND as f64;
    println!(
        "workload: {} jobs ({}), {} SPOT, {:.0} GPU-hours over {:.1} days of arrivals; fleet: {} nodes x {} GPUs; round interval {} s",
        workload.len(),
        trace.as_deref().map_or_else(|| format!("synthetic, seed {seed}, offered load {load}"), |p| format!("trace {p}, arrivals compressed {compress}x")),
        workload.iter().filter(|j| j.spot).count(),
        gpu_h,
        span / 86400.0,
        nodes,
        GPUS_PER_NODE,
        interval
    );
    let mut reports = Vec::new();
    let mut policies = default_policies();
    if let Some(s) = starvation {
        for p in policies.iter_mut().filter(|p| p.name == "trainyard") {
            p.cfg.starvation_secs = Some(s);
        }
    }
    // Classes and cohorts: the same quotas for every policy; ours preempts by priority and
    // reclaims lent quota.
    let quotas = cohort_quotas(&cohorts, nodes as u64 * GPUS_PER_NODE as u64);
    let classes = workload.iter().any(|j| j.priority != 0);
    for p in policies.iter_mut() {
        p.quotas = quotas.clone();
        if p.name == "trainyard" && (classes || !cohorts.is_empty()) {
            p.cfg.priority_preemption = true;
        }
    }
    if !cohorts.is_empty() || classes {
        println!(
            "sharing: {} jobs of a priority class other than 0; cohorts {}",
            workload.iter().filter(|j| j.priority != 0).count(),
            if cohorts.is_empty() { "none".to_string() } else { cohorts.iter().map(|(n, ps)| format!("{n} ({})", ps.join(", "))).collect::<Vec<_>>().join("; ") }
        );
    }
    if let Some(m) = max_resv {
        for p in policies.iter_mut().filter(|p| p.name == "trainyard") {
            p.cfg.max_reservations = m.max(1);
        }
    }
    if check {
        let Some(ours) = policies.iter().find(|p| p.name == "trainyard") else { return ExitCode::FAILURE };
        let bound = starvation.unwrap_or(7200);
        return match check_reservations(&workload, nodes, ours, interval as i64 * SECOND, bound) {
            Ok(c) => {
                println!(
                    "starvation guarantee (bound {bound} s): held in {} rounds with a starving job's reservation; {} starving jobs started by it",
                    c.rounds, c.jobs
                );
                ExitCode::SUCCESS
            }
            Err(e) => {
                println!("starvation guarantee (bound {bound} s) BROKEN: {e}");
                ExitCode::FAILURE
            }
        };
    }
    if let (true, Some(f)) = (engine, elastic) {
        let Some(ours) = policies.iter().find(|p| p.name == "trainyard") else { return ExitCode::FAILURE };
        let faults = Faults::none();
        let rigid = simulate_engine(&workload, nodes, ours, interval as i64 * SECOND, &faults, seed);
        let el = simulate_engine_elastic(&workload, nodes, ours, interval as i64 * SECOND, &faults, seed, Some(f));
        println!("{}", elastic_table(&[("rigid", &rigid), (&format!("elastic (min {f} of workers)"), &el)]));
        let what = format!("{nodes} nodes, {} jobs", workload.len());
        println!(
            "bench-row: trainyard-sim | GPU utilisation, elastic jobs, {what} | {:.3} | {:.3} rigid | {:.3}x",
            el.gpu_utilisation,
            rigid.gpu_utilisation,
            el.gpu_utilisation / rigid.gpu_utilisation.max(1e-9)
        );
        println!(
            "bench-row: trainyard-sim | 1-GPU p99 wait, elastic jobs, {what} | {:.0} s | {:.0} s rigid | {:.3}x",
            el.wait_1gpu_p99,
            rigid.wait_1gpu_p99,
            el.wait_1gpu_p99 / rigid.wait_1gpu_p99.max(1e-9)
        );
        return ExitCode::SUCCESS;
    }
    if engine {
        let Some(ours) = policies.iter().find(|p| p.name == "trainyard") else { return ExitCode::FAILURE };
        let model = simulate(&workload, nodes, ours, interval as i64 * SECOND);
        let faults = Faults::default();
        let r = simulate_engine(&workload, nodes, ours, interval as i64 * SECOND, &faults, seed);
        println!(
            "real engine ({:.1}% of runs killed by a signal, {:.1}% transient exits, {:.1}% OOM kills; launch {} s; {} node losses per node and day, down {} h):",
            faults.signal * 100.0,
            faults.transient * 100.0,
            faults.oom * 100.0,
            faults.launch / SECOND,
            faults.node_loss_per_day,
            faults.node_repair / (3600 * SECOND)
        );
        println!("  jobs by state: {:?}", r.by_state);
        println!(
            "  {} steps, {} placements, {} rounds, {} replica restarts, {} job retries, {} preemptions, {} log lines ({:.1} per job)",
            r.steps,
            r.placements,
            r.rounds,
            r.restarts,
            r.retries,
            r.preemptions,
            r.log_lines,
            r.log_lines as f64 / r.jobs.max(1) as f64
        );
        println!("  {} nodes lost, {} stockout decisions, {} stockout retries", r.node_losses, r.stockouts, r.stockout_retries);
        println!(
            "  wait to RUNNING: p50 {}, p99 {}, max {}; makespan {}",
            hms(r.wait.0),
            hms(r.wait.1),
            hms(r.wait.2),
            hms(r.makespan_s)
        );
        println!(
            "  wall {:.1} s ({:.1} s in plan): {:.0} admissions/s, {:.0} steps/s; the plan-only model of the same run: {:.1} s, {:.0} admissions/s (ratio {:.2})",
            r.wall_secs,
            r.plan_secs,
            r.admissions_per_sec(),
            r.steps_per_sec(),
            model.wall_secs,
            model.admissions_per_sec(),
            r.wall_secs / model.wall_secs.max(1e-9)
        );
        return ExitCode::SUCCESS;
    }
    for p in policies {
        let r = simulate(&workload, nodes, &p, interval as i64 * SECOND);
        eprintln!("{}: {:.1} s wall, {} placements, {} rounds", r.policy, r.wall_secs, r.placements, r.rounds);
        reports.push(r);
    }
    println!("{}", table(&reports));
    println!("{}", wait_table(&reports, &workload, 6));
    let find = |n: &str| reports.iter().find(|r| r.policy == n);
    if let (Some(o), Some(e)) = (find("trainyard"), find("easy backfill")) {
        if let Some((d, i)) = worst_excess(o, e) {
            let j = &workload[i];
            println!(
                "largest excess of trainyard's wait over EASY's, job by job: {} (job {}, project {}, {} GPUs: {} vs {})\n",
                if d < 0.0 { format!("-{}", hms(-d)) } else { hms(d) },
                j.id,
                j.project,
                j.gpus(),
                hms(o.job_wait_s[i].unwrap_or(0.0)),
                hms(e.job_wait_s[i].unwrap_or(0.0))
            );
        }
    }
    println!("targets (trainyard vs the baselines of this run):\n{}", verdict(&reports, "trainyard"));
    // The lines `scripts/bench` collects: our round against EASY backfill's in this run.
    let find = |n: &str| reports.iter().find(|r| r.policy == n);
    if let (Some(o), Some(easy)) = (find("trainyard"), find("easy backfill")) {
        let what = format!("{nodes} nodes, {} jobs", workload.len());
        println!(
            "bench-row: trainyard-sim | admissions per wall second, {what} | {:.0}/s | {:.0}/s EASY backfill | {:.3}x",
            o.admissions_per_sec(),
            easy.admissions_per_sec(),
            o.admissions_per_sec() / easy.admissions_per_sec().max(1e-9)
        );
        println!(
            "bench-row: trainyard-sim | scheduling round p99, {what} | {:.0} us | {:.0} us EASY backfill | {:.3}x",
            o.round_p99_us,
            easy.round_p99_us,
            o.round_p99_us / easy.round_p99_us.max(1e-9)
        );
    }
    ExitCode::SUCCESS
}

/// TY10: rigid against elastic on the same workload (the real lifecycle, no faults).
fn elastic_table(rows: &[(&str, &EngineReport)]) -> String {
    let mut out = String::from(
        "| run | elastic jobs | GPU utilisation | goodput (work / GPU time held) | wait p50 | wait p99 | 1-GPU wait p99 | makespan | joins | leaves |\n|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for (name, r) in rows {
        out.push_str(&format!(
            "| {name} | {} | {:.1}% | {:.1}% | {} | {} | {} | {} | {} | {} |\n",
            r.elastic_jobs,
            r.gpu_utilisation * 100.0,
            r.goodput * 100.0,
            hms(r.wait.0),
            hms(r.wait.1),
            hms(r.wait_1gpu_p99),
            hms(r.makespan_s),
            r.grows,
            r.leaves
        ));
    }
    out
}
