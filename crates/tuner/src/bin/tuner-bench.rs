//! Benchmark of the study algorithms on standard test functions.
//!
//! Runs Bayesian optimisation (`ALGORITHM_UNSPECIFIED`) and random search on
//! Branin (2-D), Hartmann-6, a shifted Ackley-5, Rosenbrock-4 and a mixed
//! space (log-scale double, integer, categorical, one conditional double),
//! all minimised, with sequential suggestions (count = 1). Prints the median
//! over seeds of log10 simple regret (best value so far − known optimum,
//! floored at 1e-12) after 10, 25 and 50 trials, and the mean time per BO
//! suggestion at 50 and at 100 trials.
//!
//! Usage: tuner-bench [--seeds N] [--trials N] [--tsv PATH] [--no-timing]

use std::time::Instant;

use trainyard_tuner::{
    suggest, Algorithm, Assignment, Goal, ParamSpec, ParentValues, Scale, Space, Trial,
};

struct Problem {
    name: &'static str,
    space: Space,
    f: fn(&Assignment) -> f64,
    optimum: f64,
}

fn x(a: &Assignment, id: &str) -> f64 {
    a[id].as_f64().expect("numeric parameter")
}

fn xs(a: &Assignment, n: usize) -> Vec<f64> {
    (0..n).map(|i| x(a, &format!("x{i}"))).collect()
}

fn box_space(n: usize, lo: f64, hi: f64) -> Space {
    Space::new(
        (0..n)
            .map(|i| ParamSpec::double(format!("x{i}"), lo, hi, Scale::Linear))
            .collect(),
    )
}

fn branin(a: &Assignment) -> f64 {
    let (x1, x2) = (x(a, "x0"), x(a, "x1"));
    let pi = std::f64::consts::PI;
    let b = 5.1 / (4.0 * pi * pi);
    let c = 5.0 / pi;
    let t = 1.0 / (8.0 * pi);
    (x2 - b * x1 * x1 + c * x1 - 6.0).powi(2) + 10.0 * (1.0 - t) * x1.cos() + 10.0
}

fn hartmann6(a: &Assignment) -> f64 {
    let v = xs(a, 6);
    let alpha = [1.0, 1.2, 3.0, 3.2];
    let am = [
        [10.0, 3.0, 17.0, 3.5, 1.7, 8.0],
        [0.05, 10.0, 17.0, 0.1, 8.0, 14.0],
        [3.0, 3.5, 1.7, 10.0, 17.0, 8.0],
        [17.0, 8.0, 0.05, 10.0, 0.1, 14.0],
    ];
    let pm = [
        [0.1312, 0.1696, 0.5569, 0.0124, 0.8283, 0.5886],
        [0.2329, 0.4135, 0.8307, 0.3736, 0.1004, 0.9991],
        [0.2348, 0.1451, 0.3522, 0.2883, 0.3047, 0.6650],
        [0.4047, 0.8828, 0.8732, 0.5743, 0.1091, 0.0381],
    ];
    let mut s = 0.0;
    for i in 0..4 {
        let mut inner = 0.0;
        for j in 0..6 {
            inner += am[i][j] * (v[j] - pm[i][j]).powi(2);
        }
        s += alpha[i] * (-inner).exp();
    }
    -s
}

const ACKLEY_SHIFT: [f64; 5] = [1.0, -1.5, 0.5, 2.0, -0.8];

fn ackley5(a: &Assignment) -> f64 {
    let v = xs(a, 5);
    let n = 5.0;
    let mut s1 = 0.0;
    let mut s2 = 0.0;
    for i in 0..5 {
        let z = v[i] - ACKLEY_SHIFT[i];
        s1 += z * z;
        s2 += (std::f64::consts::TAU * z).cos();
    }
    -20.0 * (-0.2 * (s1 / n).sqrt()).exp() - (s2 / n).exp() + 20.0 + std::f64::consts::E
}

fn rosenbrock4(a: &Assignment) -> f64 {
    let v = xs(a, 4);
    (0..3)
        .map(|i| 100.0 * (v[i + 1] - v[i] * v[i]).powi(2) + (1.0 - v[i]).powi(2))
        .sum()
}

/// Mixed space: `lr` log-scale double in [1e-4, 1], `layers` integer in
/// [1, 8], `optimizer` categorical, and `momentum` in [0, 0.99] active only
/// for `sgd`. Optimum 0 at optimizer = sgd, lr = 10^-1.5, layers = 5,
/// momentum = 0.9.
fn mixed(a: &Assignment) -> f64 {
    let lr = x(a, "lr").log10();
    let layers = x(a, "layers");
    let opt = a["optimizer"].as_str().expect("categorical");
    let (centre, penalty) = match opt {
        "sgd" => (-1.5, 0.0),
        "adam" => (-3.0, 0.3),
        _ => (-2.5, 0.6),
    };
    let mut f = (lr - centre).powi(2) + 0.1 * (layers - 5.0).powi(2) + penalty;
    if opt == "sgd" {
        f += 4.0 * (x(a, "momentum") - 0.9).powi(2);
    }
    f
}

fn mixed_space() -> Space {
    Space::new(vec![
        ParamSpec::double("lr", 1e-4, 1.0, Scale::Log),
        ParamSpec::integer("layers", 1, 8, Scale::Linear),
        ParamSpec::categorical("optimizer", ["sgd", "adam", "rmsprop"]).with_child(
            ParentValues::Categorical(vec!["sgd".into()]),
            ParamSpec::double("momentum", 0.0, 0.99, Scale::Linear),
        ),
    ])
}

fn problems() -> Vec<Problem> {
    vec![
        Problem {
            name: "branin",
            space: Space::new(vec![
                ParamSpec::double("x0", -5.0, 10.0, Scale::Linear),
                ParamSpec::double("x1", 0.0, 15.0, Scale::Linear),
            ]),
            f: branin,
            optimum: 0.397_887_357_729_738_16,
        },
        Problem {
            name: "hartmann6",
            space: box_space(6, 0.0, 1.0),
            f: hartmann6,
            optimum: -3.322_368_011_415_51,
        },
        Problem {
            name: "ackley5",
            space: box_space(5, -5.0, 5.0),
            f: ackley5,
            optimum: 0.0,
        },
        Problem {
            name: "rosenbrock4",
            space: box_space(4, -2.0, 2.0),
            f: rosenbrock4,
            optimum: 0.0,
        },
        Problem {
            name: "mixed",
            space: mixed_space(),
            f: mixed,
            optimum: 0.0,
        },
    ]
}

/// Runs one study; returns the best-so-far curve and per-suggestion times.
fn run(p: &Problem, alg: Algorithm, trials: usize, seed: u64) -> (Vec<f64>, Vec<f64>) {
    let mut done: Vec<Trial> = Vec::new();
    let mut curve = Vec::with_capacity(trials);
    let mut times = Vec::with_capacity(trials);
    let mut best = f64::INFINITY;
    for _ in 0..trials {
        let t0 = Instant::now();
        let s = suggest(&p.space, alg, Goal::Minimize, &done, &[], 1, seed).expect("suggest");
        times.push(t0.elapsed().as_secs_f64());
        let a = s.into_iter().next().expect("one suggestion");
        let v = (p.f)(&a);
        best = best.min(v);
        curve.push(best);
        done.push(Trial::new(a, Some(v)));
    }
    (curve, times)
}

fn log_regret(best: f64, optimum: f64) -> f64 {
    (best - optimum).max(1e-12).log10()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        0.5 * (v[n / 2 - 1] + v[n / 2])
    }
}

fn main() {
    let mut seeds = 10u64;
    let mut trials = 50usize;
    let mut tsv: Option<String> = None;
    let mut timing = true;
    let mut only: Option<String> = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--seeds" => seeds = args.next().and_then(|v| v.parse().ok()).expect("--seeds N"),
            "--trials" => {
                trials = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .expect("--trials N")
            }
            "--tsv" => tsv = args.next(),
            "--only" => only = args.next(),
            "--no-timing" => timing = false,
            _ => {
                eprintln!("usage: tuner-bench [--seeds N] [--trials N] [--tsv PATH] [--only NAME] [--no-timing]");
                std::process::exit(2);
            }
        }
    }
    let checkpoints: Vec<usize> = [10, 25, 35, 50]
        .into_iter()
        .filter(|c| *c <= trials)
        .collect();
    let mut rows = Vec::new();
    println!("median log10 simple regret over {seeds} seeds ({trials} trials, count=1)");
    println!(
        "{:<12} {:<7} {}",
        "function",
        "method",
        checkpoints
            .iter()
            .map(|c| format!("{:>8}", format!("@{c}")))
            .collect::<String>()
    );
    let mut t50 = Vec::new();
    for p in problems() {
        if only.as_deref().is_some_and(|o| o != p.name) {
            continue;
        }
        for (label, alg) in [
            ("bo", Algorithm::Unspecified),
            ("random", Algorithm::RandomSearch),
        ] {
            let mut at: Vec<Vec<f64>> = vec![Vec::new(); checkpoints.len()];
            for s in 0..seeds {
                let (curve, times) = run(&p, alg, trials, 1000 + s);
                for (i, c) in checkpoints.iter().enumerate() {
                    at[i].push(log_regret(curve[c - 1], p.optimum));
                }
                if alg == Algorithm::Unspecified && trials >= 50 {
                    t50.push(times[49]);
                }
            }
            let meds: Vec<f64> = at.into_iter().map(median).collect();
            println!(
                "{:<12} {:<7} {}",
                p.name,
                label,
                meds.iter().map(|m| format!("{m:>8.2}")).collect::<String>()
            );
            rows.push(format!(
                "{}\t{}\t{}",
                p.name,
                label,
                checkpoints
                    .iter()
                    .zip(&meds)
                    .map(|(c, m)| format!("{c}={m:.4}"))
                    .collect::<Vec<_>>()
                    .join("\t")
            ));
        }
    }
    if timing {
        let ms50 = if t50.is_empty() {
            f64::NAN
        } else {
            1e3 * t50.iter().sum::<f64>() / t50.len() as f64
        };
        // One extra 100-trial BO run per function; time the suggestions made
        // with 90–99 completed trials.
        let mut t100 = Vec::new();
        for p in problems() {
            if only.as_deref().is_some_and(|o| o != p.name) {
                continue;
            }
            let (_, times) = run(&p, Algorithm::Unspecified, 100, 7);
            t100.extend_from_slice(&times[90..100]);
        }
        let ms100 = 1e3 * t100.iter().sum::<f64>() / t100.len() as f64;
        println!(
            "mean BO time per suggestion: {ms50:.1} ms at 50 trials, {ms100:.1} ms at 100 trials"
        );
        rows.push(format!("timing\tbo\tms50={ms50:.3}\tms100={ms100:.3}"));
    }
    if let Some(path) = tsv {
        std::fs::write(&path, rows.join("\n") + "\n").expect("write tsv");
    }
}
