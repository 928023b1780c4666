//! The simulator: deterministic runs, every job ends, baselines ordered as expected, and a
//! malformed trace row stops it with the row and the problem named.

use trainyard_core::job::SECOND;
use trainyard_sim::{default_policies, parse_trace, simulate, synthetic, table};

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
