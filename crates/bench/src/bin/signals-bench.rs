//! signals-bench: what watching running replicas costs the server, at N replicas (1,000 by
//! default): one look at each replica's progress signals (its log's and metric file's
//! modification times, its processes' CPU time and state from /proc, as hang detection
//! does) and one read of each job's progress file (as `trainyardProgress` does: what it
//! gained since the last read, here 25 lines of 200, 5 s at 5 steps a second), against
//! a baseline measured in the same run: a bare `stat` of the same files. Prints the time
//! of each pass, its ratio to the baseline, and the share of one core it takes at the
//! server's cadence (progress every 5 s; hang checks once per `hang_after`, 60 s here).
//!
//!     cargo run --release -p trainyard-bench --bin signals-bench -- [replicas]

use std::path::PathBuf;
use std::time::Instant;

use trainyard_server::executor::{observe, read_progress, ProgressSource, ReplicaWatch};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[path = "../shared/row.rs"]
mod row;

fn main() -> anyhow::Result<()> {
    let n: usize = std::env::args().nth(1).map(|a| a.parse()).transpose()?.unwrap_or(1000);
    let dir = tempfile::tempdir()?;
    let me = std::process::id();
    let mut watches = Vec::with_capacity(n);
    let mut sources = Vec::with_capacity(n);
    let mut files: Vec<PathBuf> = Vec::with_capacity(2 * n);
    for i in 0..n {
        let run = dir.path().join("runs").join(i.to_string());
        std::fs::create_dir_all(&run)?;
        std::fs::write(run.join("started.json"), format!("{{\"pid\": {me}, \"time_micros\": 0}}"))?;
        let log = run.join("log.jsonl");
        std::fs::write(&log, "{\"stream\":\"stdout\",\"text\":\"step\"}\n".repeat(20))?;
        let metric = run.join("output.metrics");
        std::fs::write(&metric, "")?;
        let progress = run.join("progress.jsonl");
        let lines: String = (1..=200).map(|s| format!("{{\"step\": {s}, \"total\": 1000}}\n")).collect();
        std::fs::write(&progress, &lines)?;
        // Read up to the last 25 lines before: a pass reads what 5 s added.
        let seen = lines.lines().take(175).map(|l| l.len() as u64 + 1).sum::<u64>();
        files.push(log.clone());
        files.push(metric.clone());
        watches.push(ReplicaWatch { replica: "workerpool0-0".into(), files: vec![log, metric], run_dir: run, dump: false });
        sources.push(ProgressSource { job: i as u64, replica: "workerpool0-0".into(), progress_file: progress, offset: seen, metric_file: None });
    }
    let rounds = 7;
    let (mut base, mut look, mut prog) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        let t = Instant::now();
        for f in &files {
            std::hint::black_box(std::fs::symlink_metadata(f).ok());
        }
        base.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        for (i, w) in watches.iter().enumerate() {
            std::hint::black_box(observe(i as u64, None, std::slice::from_ref(w)));
        }
        look.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        std::hint::black_box(read_progress(sources.clone()));
        prog.push(t.elapsed().as_secs_f64());
    }
    let (base, look, prog) = (median(base), median(look), median(prog));
    println!("signals-bench: {n} running replicas, median of {rounds} passes");
    println!("| pass | time | ratio to the baseline | share of one core at its cadence |");
    println!("|---|---|---|---|");
    println!("| baseline: stat of the {} log and metric files | {:.2} ms | 1.00x | - |", files.len(), base * 1e3);
    println!("| hang detection: one look at every replica (mtimes, /proc CPU and state) | {:.2} ms | {:.2}x | {:.3}% (every 60 s) |", look * 1e3, look / base, 100.0 * look / 60.0);
    println!("| progress: one read of every job's progress file (what it gained: 25 lines) | {:.2} ms | {:.2}x | {:.3}% (every 5 s) |", prog * 1e3, prog / base, 100.0 * prog / 5.0);
    row::row("signals-bench", &format!("hang detection pass, {n} replicas"), &format!("{:.2} ms", look * 1e3), &format!("{:.2} ms stat of the files", base * 1e3), look / base);
    row::row("signals-bench", &format!("progress read pass, {n} replicas"), &format!("{:.2} ms", prog * 1e3), &format!("{:.2} ms stat of the files", base * 1e3), prog / base);
    println!("together: {:.3}% of one core (goal: under 2%)", 100.0 * (look / 60.0 + prog / 5.0));
    Ok(())
}
