//! The simulator: deterministic runs, every job ends, baselines ordered as expected, and a
//! malformed trace row stops it with the row and the problem named.

use trainyard_core::job::SECOND;
use trainyard_sim::{cohort_quotas, default_policies, parse_trace, parse_trace_with, simulate, synthetic, table, TraceOptions};

#[test]
fn small_run_is_deterministic_and_complete() {
    let nodes = 100;
    let jobs = synthetic(7, 1500, nodes as u64 * 8, 0.95);
    assert_eq!(jobs, synthetic(7, 1500, nodes as u64 * 8, 0.95), "seeded workload");
    let mut reports = Vec::new();
    for p in default_policies() {
        let a = simulate(&jobs, nodes, &p, 10 * SECOND);
        let b = simulate(&jobs, nodes, &p, 10 * SECOND);
        assert_eq!((a.placements, a.preemptions, a.max_wait_s, a.wait), (b.placements, b.preemptions, b.max_wait_s, b.wait), "{}", p.name);
        assert_eq!(a.finished, jobs.len(), "{}: every job ends", p.name);
        assert_eq!(a.stockouts, 0);
        assert!(a.utilisation > 0.0 && a.utilisation <= 1.0, "{}", p.name);
        reports.push(a);
    }
    let fifo = &reports[0];
    let easy = &reports[1];
    let ours = &reports[2];
    // Backfill serves small jobs far better than strict FIFO.
    assert!(easy.wait[0].2 <= fifo.wait[0].2, "{}", table(&reports));
    assert!(ours.wait[0].2 <= fifo.wait[0].2 / 2.0, "{}", table(&reports));
    assert_eq!(fifo.preemptions + easy.preemptions, 0, "baselines never preempt");
}

#[test]
fn trace_rows_parse_and_errors_name_the_row() {
    let ok = "submit_time_s,duration_s,replicas,gpus_per_replica,project\n0,60,1,1,a\n5,3600,4,8,b\n";
    let jobs = parse_trace(ok).unwrap();
    assert_eq!(jobs.len(), 2);
    assert_eq!(jobs[1].gpus(), 32);
    assert_eq!(jobs[1].project, "b");
    let report = simulate(&jobs, 4, &default_policies()[2], 10 * SECOND);
    assert_eq!(report.finished, 2);

    let cases = [
        ("0,60,1,1,a\n5,abc,1,1,b\n", "trace row 2: duration_s is not a number"),
        ("0,60,1,1,a\n1,60,1,1\n", "trace row 2: expected 5 fields"),
        ("h1,h2,h3,h4,h5\n0,60,0,1,a\n", "trace row 2: replicas must be at least 1"),
        ("0,60,1,1,a\n0,60,1,1,a\n0,60,2,16,a\n", "trace row 3: gpus_per_replica 16 exceeds"),
        ("0,-5,1,1,a\n", "trace row 1: duration_s must be a finite number >= 0"),
        ("0,60,1,1,\n", "trace row 1: project is empty"),
    ];
    for (text, want) in cases {
        let err = parse_trace(text).unwrap_err();
        assert!(err.contains(want), "{err:?} should contain {want:?}");
    }
}

#[test]
fn malformed_trace_stops_the_binary() {
    let dir = std::env::temp_dir().join(format!("trainyard-sim-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("bad.csv");
    std::fs::write(&path, "0,60,1,1,a\n10,60,one,1,a\n").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_trainyard-sim")).arg("--trace").arg(&path).arg("--nodes").arg("4").output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("trace row 2: replicas is not a whole number: \"one\""), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Priority classes from a trace column (or by project), refused when unknown.
#[test]
fn priority_classes_come_from_a_column_or_the_project() {
    let text = "submit_time_s,duration_s,replicas,gpus_per_replica,project,qos\n0,60,1,1,a,high\n5,60,1,1,b,7\n";
    let classes = [("high".to_string(), 100)].into();
    let jobs = parse_trace_with(text, &TraceOptions { priority_from: Some("qos".into()), classes }).unwrap();
    assert_eq!((jobs[0].priority, jobs[1].priority), (100, 7));
    let by_project = TraceOptions { priority_from: None, classes: [("b".to_string(), -5)].into() };
    let jobs = parse_trace_with(text, &by_project).unwrap();
    assert_eq!((jobs[0].priority, jobs[1].priority), (0, -5));
    let err = parse_trace_with(text, &TraceOptions { priority_from: Some("qos".into()), classes: Default::default() }).unwrap_err();
    assert!(err.contains("row 2") && err.contains("\"high\""), "{err}");
    let err = parse_trace_with(text, &TraceOptions { priority_from: Some("tier".into()), classes: Default::default() }).unwrap_err();
    assert!(err.contains("tier") && err.contains("qos"), "{err}");
}

/// Cohorts in the simulator: projects borrow idle quota (counted in GPU-hours), only our
/// policy (with priority preemption) reclaims it, and every job still ends.
#[test]
fn cohorts_borrow_and_only_ours_reclaims() {
    let nodes = 60;
    let jobs = synthetic(3, 1200, nodes as u64 * 8, 0.95);
    let projects = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let cohorts = vec![
        ("research".to_string(), projects(&["vision", "speech", "recsys", "nlp"])),
        ("gen".to_string(), projects(&["llm", "rl", "foundation", "batch"])),
    ];
    let quotas = cohort_quotas(&cohorts, nodes as u64 * 8);
    let mut reports = Vec::new();
    for mut p in default_policies() {
        p.quotas = quotas.clone();
        if p.name == "trainyard" {
            p.cfg.priority_preemption = true;
        }
        let r = simulate(&jobs, nodes, &p, 10 * SECOND);
        assert_eq!(r.finished, jobs.len(), "{}: every job ends", p.name);
        reports.push(r);
    }
    assert!(reports.iter().all(|r| r.borrowed_gpu_h > 0.0), "{}", table(&reports));
    assert_eq!(reports[0].reclaims + reports[1].reclaims, 0, "{}", table(&reports));
    assert!(reports[2].reclaims > 0, "{}", table(&reports));
}
