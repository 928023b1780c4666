//! Benchmark of the study algorithms on standard test functions.
//!
//! Runs Bayesian optimisation (`ALGORITHM_UNSPECIFIED`) and random search,
//! all minimised, with sequential suggestions (count = 1) unless asked for
//! parallel ones, on:
//!
//! | name          | dims | shape                                             |
//! |---------------|------|---------------------------------------------------|
//! | branin        | 2    | smooth, three global optima                       |
//! | hartmann6     | 6    | smooth, multimodal                                |
//! | ackley5       | 5    | shifted; many shallow local optima, one funnel    |
//! | rosenbrock4   | 4    | narrow curved valley, heavy-tailed values         |
//! | rosenbrock4w  | 4    | the same on its usual domain [-5, 10]^4           |
//! | mixed         | 4    | log-scale double, integer, categorical, child     |
//! | levy10        | 10   | multimodal, high dimension                        |
//! | styblinski4   | 4    | separable, 2^d local optima, optimum off-centre   |
//! | michalewicz5  | 5    | steep ridges and flat plateaus                    |
//! | griewank6     | 6    | shifted; wide bowl with small ripples             |
//! | rastrigin4    | 4    | shifted; regular grid of local optima             |
//! | hartmann6n    | 6    | Hartmann-6 with Gaussian noise (sd 0.1)           |
//! | intheavy6     | 6    | five integers (two on a log scale) and one double |
//!
//! and the held-out set, which the optimiser's settings are never tuned on:
//! it was chosen once, before any change it is used to judge, from the
//! COCO/BBOB suite, the classic global-optimisation test functions and the
//! surrogates of HPO benchmarks, to cover shapes the tuning set has too few
//! of. A change is kept for what it does on the tuning set; the held-out set
//! then says whether it generalises, and is reported apart from it.
//!
//! | name          | dims | shape                                             |
//! |---------------|------|---------------------------------------------------|
//! | camel2        | 2    | six-hump camel: smooth, two global optima         |
//! | shekel4       | 4    | Shekel-10: ten narrow basins of different depths  |
//! | ellipsoid6    | 6    | BBOB f10: rotated ellipsoid, condition 1e3        |
//! | well6         | 6    | one narrow basin at the bottom of a wide one      |
//! | salomon5      | 5    | shifted Salomon: rings of local optima            |
//! | dixonprice5   | 5    | Dixon-Price: a curved valley                      |
//! | xgb6          | 6    | a boosting surrogate: log, integer, categorical   |
//!
//! No known optimum lies on a bound of its space (the shifts see to that),
//! so a proposal exactly on a bound is never needed to reach the optimum.
//!
//! Prints the median over seeds of log10 simple regret (best value so far −
//! known optimum, floored at 1e-12) after 10, 25, 50 and 100 trials; for the
//! noisy problem the best trial is the one with the best *observed* value
//! and its regret is measured on the noise-free function. Beside each row,
//! the share of proposed DOUBLE coordinates that lie exactly on a bound, and
//! within 0.1% of the range of one (0.2% for uniform draws); then the mean
//! time per BO suggestion at 50 and at 200 trials.
//!
//! Usage: tuner-bench [--seeds N] [--trials N] [--tsv PATH] [--only NAME,..]
//!        [--no-timing] [--per-seed] [--parallel N[,N..]]
//!
//! `--parallel 3,5` adds BO with 3 and with 5 trials in flight (rows
//! `bo-p3`, `bo-p5`), for the regret lost against sequential BO at the same
//! number of trials.
//!
//! `--per-seed` adds each seed's final log10 regret to the TSV rows, for
//! paired comparisons of two versions.

use std::collections::VecDeque;
use std::time::Instant;

// SplitMix64 (the project's, `trainyard_core::rng`): the noise source, reproduced exactly
// by `optuna_bench.py` so both sides see the same noise.
use trainyard_tuner::splitmix64;

use trainyard_tuner::{
    suggest, Algorithm, Assignment, Goal, ParamKind, ParamSpec, ParentValues, Scale, Space, Trial,
};

struct Problem {
    name: &'static str,
    space: Space,
    f: fn(&Assignment) -> f64,
    optimum: f64,
    /// Standard deviation of Gaussian noise added to each observation.
    noise: f64,
    /// In the held-out set: never used to choose the optimiser's settings.
    held_out: bool,
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

/// Levy in 10-D on [-10, 10]^10; optimum 0 at x = 1.
fn levy10(a: &Assignment) -> f64 {
    let v = xs(a, 10);
    let pi = std::f64::consts::PI;
    let w: Vec<f64> = v.iter().map(|x| 1.0 + (x - 1.0) / 4.0).collect();
    let d = w.len();
    let mut f = (pi * w[0]).sin().powi(2);
    for wi in &w[..d - 1] {
        f += (wi - 1.0).powi(2) * (1.0 + 10.0 * (pi * wi + 1.0).sin().powi(2));
    }
    f + (w[d - 1] - 1.0).powi(2) * (1.0 + (2.0 * pi * w[d - 1]).sin().powi(2))
}

/// Styblinski-Tang in 4-D on [-5, 5]^4; optimum −39.16616570377142·4 at
/// x = −2.903534 in every coordinate.
fn styblinski4(a: &Assignment) -> f64 {
    xs(a, 4)
        .iter()
        .map(|x| 0.5 * (x.powi(4) - 16.0 * x * x + 5.0 * x))
        .sum()
}

/// Michalewicz (m = 10) in 5-D on [0, π]^5; optimum −4.687658179.
fn michalewicz5(a: &Assignment) -> f64 {
    let pi = std::f64::consts::PI;
    -xs(a, 5)
        .iter()
        .enumerate()
        .map(|(i, x)| x.sin() * ((i as f64 + 1.0) * x * x / pi).sin().powi(20))
        .sum::<f64>()
}

const GRIEWANK_SHIFT: [f64; 6] = [73.3, -121.7, 45.1, -210.9, 160.2, -12.4];

/// Shifted Griewank in 6-D on [-600, 600]^6; optimum 0.
fn griewank6(a: &Assignment) -> f64 {
    let v = xs(a, 6);
    let mut s = 0.0;
    let mut p = 1.0;
    for i in 0..6 {
        let z = v[i] - GRIEWANK_SHIFT[i];
        s += z * z / 4000.0;
        p *= (z / (i as f64 + 1.0).sqrt()).cos();
    }
    1.0 + s - p
}

const RASTRIGIN_SHIFT: [f64; 4] = [1.2, -0.7, 2.1, -1.6];

/// Shifted Rastrigin in 4-D on [-5.12, 5.12]^4; optimum 0.
fn rastrigin4(a: &Assignment) -> f64 {
    let v = xs(a, 4);
    (0..4)
        .map(|i| {
            let z = v[i] - RASTRIGIN_SHIFT[i];
            z * z - 10.0 * (std::f64::consts::TAU * z).cos() + 10.0
        })
        .sum()
}

/// Integer-heavy: `k0` in [0, 50], `k1` in [1, 64] (log), `k2` in
/// [-20, 20], `k3` in [0, 10], `k4` in [1, 1000] (log), `x5` double in
/// [0, 1]. Optimum 0 at (31, 12, 7, 3, 150, 0.3).
fn intheavy6(a: &Assignment) -> f64 {
    let u0 = (x(a, "k0") - 31.0) / 8.0;
    let u1 = (x(a, "k1") / 12.0).ln();
    let u2 = (x(a, "k2") - 7.0) / 5.0;
    let u3 = x(a, "k3") - 3.0 + u2;
    let u4 = (x(a, "k4") / 150.0).ln();
    let u5 = x(a, "x5") - 0.3;
    u0 * u0 + u1 * u1 + 0.3 * u0 * u1 + u2 * u2 + 0.5 * u3 * u3 + u4 * u4 + 4.0 * u5 * u5
}

fn intheavy_space() -> Space {
    Space::new(vec![
        ParamSpec::integer("k0", 0, 50, Scale::Linear),
        ParamSpec::integer("k1", 1, 64, Scale::Log),
        ParamSpec::integer("k2", -20, 20, Scale::Linear),
        ParamSpec::integer("k3", 0, 10, Scale::Linear),
        ParamSpec::integer("k4", 1, 1000, Scale::Log),
        ParamSpec::double("x5", 0.0, 1.0, Scale::Linear),
    ])
}

/// Six-hump camel on [-3, 3] × [-2, 2]; two global optima.
fn camel2(a: &Assignment) -> f64 {
    let (x0, x1) = (x(a, "x0"), x(a, "x1"));
    (4.0 - 2.1 * x0 * x0 + x0.powi(4) / 3.0) * x0 * x0 + x0 * x1 + (-4.0 + 4.0 * x1 * x1) * x1 * x1
}

const SHEKEL_A: [[f64; 4]; 10] = [
    [4.0, 4.0, 4.0, 4.0],
    [1.0, 1.0, 1.0, 1.0],
    [8.0, 8.0, 8.0, 8.0],
    [6.0, 6.0, 6.0, 6.0],
    [3.0, 7.0, 3.0, 7.0],
    [2.0, 9.0, 2.0, 9.0],
    [5.0, 5.0, 3.0, 3.0],
    [8.0, 1.0, 8.0, 1.0],
    [6.0, 2.0, 6.0, 2.0],
    [7.0, 3.6, 7.0, 3.6],
];
const SHEKEL_C: [f64; 10] = [0.1, 0.2, 0.2, 0.4, 0.4, 0.6, 0.3, 0.7, 0.5, 0.5];
/// Found by a local search from (4, 4, 4, 4) (at about (4.00075, 4.00059,
/// 3.99966, 3.99951)).
const SHEKEL4_OPTIMUM: f64 = -10.536_409_816_692_046;

/// Shekel (m = 10) in 4-D on [0, 10]^4: ten narrow basins of different depths.
fn shekel4(a: &Assignment) -> f64 {
    let v = xs(a, 4);
    -(0..10)
        .map(|i| {
            let d: f64 = (0..4).map(|j| (v[j] - SHEKEL_A[i][j]).powi(2)).sum();
            1.0 / (d + SHEKEL_C[i])
        })
        .sum::<f64>()
}

const ELLIPSOID_SHIFT: [f64; 6] = [1.3, -2.1, 0.7, 2.6, -0.4, -1.8];

/// Rotated ellipsoid in 6-D on [-5, 5]^6 (BBOB f10 with condition 1e3):
/// `Σ 10^(3k/5) z_k²`, `z` the shifted point turned by fixed Givens
/// rotations in every plane; optimum 0.
fn ellipsoid6(a: &Assignment) -> f64 {
    let mut z: Vec<f64> = xs(a, 6).iter().zip(ELLIPSOID_SHIFT).map(|(v, s)| v - s).collect();
    for i in 0..6 {
        for j in i + 1..6 {
            let t = 0.3 + 0.5 * i as f64 + 0.25 * j as f64;
            let (c, s) = (t.cos(), t.sin());
            let (zi, zj) = (z[i], z[j]);
            z[i] = c * zi - s * zj;
            z[j] = s * zi + c * zj;
        }
    }
    (0..6).map(|k| 10f64.powf(3.0 * k as f64 / 5.0) * z[k] * z[k]).sum()
}

const WELL_CENTRE: [f64; 6] = [0.63, 0.27, 0.71, 0.38, 0.55, 0.19];

/// One narrow basin at the bottom of a wide one in 6-D on [0, 1]^6:
/// `0.3 (1 − e^(−r²/0.5)) + 0.7 (1 − e^(−r²/0.0072))`, `r` the distance to
/// the centre (widths 0.5 and 0.06); optimum 0.
fn well6(a: &Assignment) -> f64 {
    let r2: f64 = xs(a, 6).iter().zip(WELL_CENTRE).map(|(v, c)| (v - c).powi(2)).sum();
    0.3 * (1.0 - (-r2 / 0.5).exp()) + 0.7 * (1.0 - (-r2 / 0.0072).exp())
}

const SALOMON_SHIFT: [f64; 5] = [2.1, -3.4, 1.7, -0.6, 3.3];

/// Shifted Salomon in 5-D on [-10, 10]^5: `1 − cos(2π r) + 0.1 r`, rings of
/// local optima around the optimum 0.
fn salomon5(a: &Assignment) -> f64 {
    let r = xs(a, 5)
        .iter()
        .zip(SALOMON_SHIFT)
        .map(|(v, s)| (v - s).powi(2))
        .sum::<f64>()
        .sqrt();
    1.0 - (std::f64::consts::TAU * r).cos() + 0.1 * r
}

/// Dixon-Price in 5-D on [-10, 10]^5: a curved valley; optimum 0.
fn dixonprice5(a: &Assignment) -> f64 {
    let v = xs(a, 5);
    (v[0] - 1.0).powi(2)
        + (1..5)
            .map(|i| (i as f64 + 1.0) * (2.0 * v[i] * v[i] - v[i - 1]).powi(2))
            .sum::<f64>()
}

/// A gradient-boosting validation error, shaped like the surrogates of
/// HPO benchmarks: `eta` (log), `max_depth` (integer), `min_child_weight`
/// (log), `subsample`, `colsample`, `booster` (categorical); a learning
/// rate that interacts with the depth, a cliff where the learning rate is
/// too high. Optimum 0.12 at (10^-1.2, 6, 8, 0.8, 0.6, gbtree).
fn xgb6(a: &Assignment) -> f64 {
    let ue = x(a, "eta").log10() + 1.2;
    let ud = (x(a, "max_depth") - 6.0) / 4.0;
    let um = (x(a, "min_child_weight").log2() - 3.0) / 3.0;
    let us = (x(a, "subsample") - 0.8) / 0.2;
    let uc = (x(a, "colsample") - 0.6) / 0.3;
    let booster = match a["booster"].as_str().expect("categorical") {
        "gbtree" => 0.0,
        "dart" => 0.008,
        _ => 0.04,
    };
    let cliff = if ue > 0.8 { 0.2 * (ue - 0.8) } else { 0.0 };
    0.12 + 0.04 * (ue + 0.4 * ud).powi(2)
        + 0.02 * ud * ud
        + 0.01 * um * um
        + 0.015 * us * us
        + 0.01 * uc * uc
        + cliff
        + booster
}

fn xgb_space() -> Space {
    Space::new(vec![
        ParamSpec::double("eta", 1e-3, 1.0, Scale::Log),
        ParamSpec::integer("max_depth", 1, 15, Scale::Linear),
        ParamSpec::double("min_child_weight", 1.0, 128.0, Scale::Log),
        ParamSpec::double("subsample", 0.5, 1.0, Scale::Linear),
        ParamSpec::double("colsample", 0.3, 1.0, Scale::Linear),
        ParamSpec::categorical("booster", ["gbtree", "dart", "gblinear"]),
    ])
}

fn problems() -> Vec<Problem> {
    let p = |name, space, f, optimum| Problem {
        name,
        space,
        f,
        optimum,
        noise: 0.0,
        held_out: false,
    };
    let h = |name, space, f, optimum| Problem {
        held_out: true,
        ..p(name, space, f, optimum)
    };
    vec![
        p(
            "branin",
            Space::new(vec![
                ParamSpec::double("x0", -5.0, 10.0, Scale::Linear),
                ParamSpec::double("x1", 0.0, 15.0, Scale::Linear),
            ]),
            branin,
            0.397_887_357_729_738_16,
        ),
        p(
            "hartmann6",
            box_space(6, 0.0, 1.0),
            hartmann6,
            -3.322_368_011_415_51,
        ),
        p("ackley5", box_space(5, -5.0, 5.0), ackley5, 0.0),
        p("rosenbrock4", box_space(4, -2.0, 2.0), rosenbrock4, 0.0),
        p("rosenbrock4w", box_space(4, -5.0, 10.0), rosenbrock4, 0.0),
        p("mixed", mixed_space(), mixed, 0.0),
        p("levy10", box_space(10, -10.0, 10.0), levy10, 0.0),
        p(
            "styblinski4",
            box_space(4, -5.0, 5.0),
            styblinski4,
            -39.166_165_703_771_42 * 4.0,
        ),
        p(
            "michalewicz5",
            box_space(5, 0.0, std::f64::consts::PI),
            michalewicz5,
            -4.687_658_179,
        ),
        p("griewank6", box_space(6, -600.0, 600.0), griewank6, 0.0),
        p("rastrigin4", box_space(4, -5.12, 5.12), rastrigin4, 0.0),
        Problem {
            noise: 0.1,
            ..p(
                "hartmann6n",
                box_space(6, 0.0, 1.0),
                hartmann6,
                -3.322_368_011_415_51,
            )
        },
        p("intheavy6", intheavy_space(), intheavy6, 0.0),
        // The held-out set (see the module docs).
        h(
            "camel2",
            Space::new(vec![
                ParamSpec::double("x0", -3.0, 3.0, Scale::Linear),
                ParamSpec::double("x1", -2.0, 2.0, Scale::Linear),
            ]),
            camel2,
            -1.031_628_453_489_877,
        ),
        h("shekel4", box_space(4, 0.0, 10.0), shekel4, SHEKEL4_OPTIMUM),
        h("ellipsoid6", box_space(6, -5.0, 5.0), ellipsoid6, 0.0),
        h("well6", box_space(6, 0.0, 1.0), well6, 0.0),
        h("salomon5", box_space(5, -10.0, 10.0), salomon5, 0.0),
        h("dixonprice5", box_space(5, -10.0, 10.0), dixonprice5, 0.0),
        h("xgb6", xgb_space(), xgb6, 0.12),
    ]
}

/// Standard normal noise for trial `t` of the study with `seed`.
fn noise(seed: u64, t: usize) -> f64 {
    let mut st = seed.wrapping_mul(1_000_003).wrapping_add(t as u64);
    let u1 = ((splitmix64(&mut st) >> 11) as f64 + 1.0) / (1u64 << 53) as f64;
    let u2 = (splitmix64(&mut st) >> 11) as f64 / (1u64 << 53) as f64;
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

struct Study {
    /// Noise-free value of the best trial so far (by observed value).
    curve: Vec<f64>,
    times: Vec<f64>,
    /// DOUBLE coordinates proposed, how many lay exactly on a bound, and
    /// how many within 0.1% of the range of one, on the parameter's scale
    /// (random search: 0.2%).
    coords: usize,
    on_bound: usize,
    near_bound: usize,
}

fn double_bounds(space: &Space) -> Vec<(String, f64, f64, Scale)> {
    fn walk(p: &ParamSpec, out: &mut Vec<(String, f64, f64, Scale)>) {
        if let ParamKind::Double { min, max, scale } = p.kind {
            out.push((p.id.clone(), min, max, scale));
        }
        for c in &p.children {
            walk(&c.spec, out);
        }
    }
    let mut out = Vec::new();
    for p in &space.params {
        walk(p, &mut out);
    }
    out
}

/// Runs one study with `parallel` trials in flight: it starts with that many
/// suggestions at once, and each time the oldest one ends asks for one more
/// with the others still pending (as a tuning job with `parallelTrialCount`
/// does); `parallel = 1` is sequential.
fn run(p: &Problem, alg: Algorithm, trials: usize, seed: u64, parallel: usize) -> Study {
    let bounds = double_bounds(&p.space);
    let mut done: Vec<Trial> = Vec::new();
    let mut st = Study {
        curve: Vec::with_capacity(trials),
        times: Vec::with_capacity(trials),
        coords: 0,
        on_bound: 0,
        near_bound: 0,
    };
    let mut best_obs = f64::INFINITY;
    let mut best_true = f64::INFINITY;
    let mut pending: VecDeque<Assignment> = VecDeque::new();
    for t in 0..trials {
        let want = parallel.max(1).min(trials - t).saturating_sub(pending.len());
        if want > 0 {
            let t0 = Instant::now();
            let flying: Vec<Assignment> = pending.iter().cloned().collect();
            let s = suggest(&p.space, alg, Goal::Minimize, &done, &flying, want, seed).expect("suggest");
            st.times.push(t0.elapsed().as_secs_f64());
            assert_eq!(s.len(), want, "{}: a suggestion per trial asked for", p.name);
            pending.extend(s);
        }
        let a = pending.pop_front().expect("a trial in flight");
        for (id, lo, hi, scale) in &bounds {
            if let Some(v) = a.get(id).and_then(|v| v.as_f64()) {
                st.coords += 1;
                st.on_bound += (v == *lo || v == *hi) as usize;
                // "Near" is measured on the parameter's scale, where the
                // search moves.
                let u = match scale {
                    Scale::Linear => (v - lo) / (hi - lo),
                    Scale::Log => (v / lo).ln() / (hi / lo).ln(),
                    Scale::ReverseLog => 1.0 - ((hi + lo - v) / lo).ln() / (hi / lo).ln(),
                };
                st.near_bound += (u <= 1e-3 || u >= 1.0 - 1e-3) as usize;
            }
        }
        let truth = (p.f)(&a);
        let obs = if p.noise > 0.0 {
            truth + p.noise * noise(seed, t)
        } else {
            truth
        };
        if obs < best_obs {
            best_obs = obs;
            best_true = truth;
        }
        st.curve.push(best_true);
        done.push(Trial::new(a, Some(obs)));
    }
    st
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

fn mean_ms(v: &[f64]) -> f64 {
    if v.is_empty() {
        f64::NAN
    } else {
        1e3 * v.iter().sum::<f64>() / v.len() as f64
    }
}

fn main() {
    let mut seeds = 10u64;
    let mut trials = 50usize;
    let mut tsv: Option<String> = None;
    let mut timing = true;
    let mut per_seed = false;
    let mut only: Option<String> = None;
    let mut parallel: Vec<usize> = Vec::new();
    let mut args = std::env::args().skip(1);
    let usage = || -> ! {
        eprintln!(
            "usage: tuner-bench [--seeds N] [--trials N] [--tsv PATH] [--only NAME[,NAME..]] [--no-timing] [--per-seed] [--parallel N[,N..]]"
        );
        std::process::exit(2);
    };
    while let Some(a) = args.next() {
        match a.as_str() {
            "--seeds" => {
                seeds = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or_else(|| usage())
            }
            "--trials" => {
                trials = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or_else(|| usage())
            }
            "--tsv" => tsv = args.next(),
            "--only" => only = args.next(),
            "--no-timing" => timing = false,
            "--per-seed" => per_seed = true,
            "--parallel" => {
                parallel = args
                    .next()
                    .and_then(|v| v.split(',').map(|n| n.parse().ok().filter(|n: &usize| *n >= 2)).collect())
                    .unwrap_or_else(|| usage())
            }
            _ => usage(),
        }
    }
    let selected = |name: &str| {
        only.as_deref()
            .is_none_or(|o| o.split(',').any(|n| n == name))
    };
    let checkpoints: Vec<usize> = [10, 25, 50, 100]
        .into_iter()
        .filter(|c| *c <= trials)
        .collect();
    let mut rows = Vec::new();
    println!("median log10 simple regret over {seeds} seeds ({trials} trials, count=1)");
    println!(
        "{:<13} {:<7} {}  {:>8} {:>8}",
        "function",
        "method",
        checkpoints
            .iter()
            .map(|c| format!("{:>8}", format!("@{c}")))
            .collect::<String>(),
        "on bound",
        "near"
    );
    let mut t50 = Vec::new();
    let mut methods: Vec<(String, Algorithm, usize)> = vec![
        ("bo".into(), Algorithm::Unspecified, 1),
        ("random".into(), Algorithm::RandomSearch, 1),
    ];
    methods.extend(parallel.iter().map(|&n| (format!("bo-p{n}"), Algorithm::Unspecified, n)));
    let mut bound_totals = vec![(0usize, 0usize, 0usize); methods.len()];
    for p in problems() {
        if !selected(p.name) {
            continue;
        }
        for (ai, (label, alg, par)) in methods.iter().enumerate() {
            let (alg, par) = (*alg, *par);
            let mut at: Vec<Vec<f64>> = vec![Vec::new(); checkpoints.len()];
            let mut last = Vec::new();
            let (mut coords, mut on_bound, mut near_bound) = (0, 0, 0);
            for s in 0..seeds {
                let st = run(&p, alg, trials, 1000 + s, par);
                for (i, c) in checkpoints.iter().enumerate() {
                    at[i].push(log_regret(st.curve[c - 1], p.optimum));
                }
                last.push(log_regret(st.curve[trials - 1], p.optimum));
                if alg == Algorithm::Unspecified && par == 1 && trials >= 50 {
                    t50.push(st.times[49]);
                }
                coords += st.coords;
                on_bound += st.on_bound;
                near_bound += st.near_bound;
            }
            bound_totals[ai].0 += coords;
            bound_totals[ai].1 += on_bound;
            bound_totals[ai].2 += near_bound;
            let pct = |k: usize| {
                if coords > 0 {
                    100.0 * k as f64 / coords as f64
                } else {
                    f64::NAN
                }
            };
            let (share, near) = (pct(on_bound), pct(near_bound));
            let meds: Vec<f64> = at.into_iter().map(median).collect();
            println!(
                "{:<13} {:<7} {}  {:>7.1}% {:>7.1}%",
                p.name,
                label,
                meds.iter().map(|m| format!("{m:>8.2}")).collect::<String>(),
                share,
                near
            );
            rows.push(format!(
                "{}\t{}\t{}\tbound={share:.3}\tnear={near:.3}\theld_out={}{}",
                p.name,
                label,
                checkpoints
                    .iter()
                    .zip(&meds)
                    .map(|(c, m)| format!("{c}={m:.4}"))
                    .collect::<Vec<_>>()
                    .join("\t"),
                u8::from(p.held_out),
                if per_seed {
                    last.iter()
                        .enumerate()
                        .map(|(s, v)| format!("\tseed{}={v:.4}", 1000 + s))
                        .collect::<String>()
                } else {
                    String::new()
                }
            ));
        }
    }
    for (ai, (label, _, _)) in methods.iter().enumerate() {
        let (c, b, nb) = bound_totals[ai];
        if c > 0 {
            println!(
                "{label}: {b} of {c} proposed DOUBLE coordinates on a bound ({:.2}%), \
                 {nb} within 0.1% of the range of one ({:.2}%)",
                100.0 * b as f64 / c as f64,
                100.0 * nb as f64 / c as f64
            );
        }
    }
    if timing {
        let ms50 = mean_ms(&t50);
        // One extra 200-trial BO run per function; time the suggestions
        // made with 190–199 completed trials.
        let mut t200 = Vec::new();
        for p in problems() {
            if !selected(p.name) {
                continue;
            }
            let st = run(&p, Algorithm::Unspecified, 200, 7, 1);
            t200.extend_from_slice(&st.times[190..200]);
        }
        let ms200 = mean_ms(&t200);
        println!(
            "mean BO time per suggestion: {ms50:.1} ms at 50 trials, {ms200:.1} ms at 200 trials"
        );
        rows.push(format!("timing\tbo\tms50={ms50:.3}\tms200={ms200:.3}"));
    }
    if let Some(path) = tsv {
        if let Err(e) = std::fs::write(&path, rows.join("\n") + "\n") {
            eprintln!("cannot write {path}: {e}");
            std::process::exit(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use trainyard_tuner::Value;

    fn point(pairs: &[(&str, f64)]) -> Assignment {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), if *k == "max_depth" { Value::Int(*v as i64) } else { Value::Double(*v) }))
            .collect()
    }

    fn box_point(v: &[f64]) -> Assignment {
        let names: Vec<String> = (0..v.len()).map(|i| format!("x{i}")).collect();
        point(&names.iter().map(String::as_str).zip(v.iter().copied()).collect::<Vec<_>>())
    }

    /// The held-out functions as `optuna_bench.py` computes them at the same
    /// points: the two sides must score the same objective.
    #[test]
    fn held_out_functions_match_the_python_peer_and_their_optima() {
        let mut xgb = point(&[
            ("eta", 0.2),
            ("max_depth", 9.0),
            ("min_child_weight", 3.0),
            ("subsample", 0.9),
            ("colsample", 0.45),
        ]);
        xgb.insert("booster".into(), Value::Str("dart".into()));
        let cases: [(&str, Assignment, f64); 7] = [
            ("camel2", point(&[("x0", 0.5), ("x1", -0.3)]), 0.396_358_333_333_333_37),
            ("shekel4", box_point(&[3.1, 4.7, 5.2, 2.9]), -0.624_355_188_269_365),
            ("ellipsoid6", box_point(&[0.5, -1.0, 2.0, 1.5, -3.0, 0.1]), 1_150.341_221_241_910_3),
            ("well6", box_point(&[0.6, 0.3, 0.7, 0.4, 0.5, 0.2]), 0.348_490_709_290_859_4),
            ("salomon5", box_point(&[1.0, -2.0, 3.0, -1.0, 2.0]), 2.102_127_559_398_541_6),
            ("dixonprice5", box_point(&[1.5, -0.5, 0.8, 0.3, -1.2]), 46.574_800_000_000_01),
            ("xgb6", xgb, 0.173_390_774_518_543_46),
        ];
        let all = problems();
        for (name, a, want) in cases {
            let p = all.iter().find(|p| p.name == name).expect("problem");
            assert!(p.held_out, "{name}");
            let got = (p.f)(&a);
            assert!((got - want).abs() <= 1e-12 * want.abs().max(1.0), "{name}: {got} != {want}");
            assert!(got > p.optimum, "{name}");
        }
        // Each stated optimum is reached at its stated point.
        let at = |name: &str, a: &Assignment| {
            let p = all.iter().find(|p| p.name == name).expect("problem");
            (p.f)(a) - p.optimum
        };
        assert!(at("ellipsoid6", &box_point(&ELLIPSOID_SHIFT)).abs() < 1e-12);
        assert!(at("well6", &box_point(&WELL_CENTRE)).abs() < 1e-12);
        assert!(at("salomon5", &box_point(&SALOMON_SHIFT)).abs() < 1e-12);
        let dp: Vec<f64> = (0..5)
            .map(|i| 2f64.powf(-((1u32 << (i + 1)) as f64 - 2.0) / (1u32 << (i + 1)) as f64))
            .collect();
        assert!(at("dixonprice5", &box_point(&dp)).abs() < 1e-12);
        assert!(at("camel2", &point(&[("x0", 0.089_842_007_446_289_08), ("x1", -0.712_656_403_875_350_8)])).abs() < 1e-12);
        assert!(at("shekel4", &box_point(&[4.000_746_531_486_511, 4.000_592_935_085_296_5, 3.999_663_400_650_024_7, 3.999_509_801_864_624])).abs() < 1e-12);
        let mut best = point(&[
            ("eta", 10f64.powf(-1.2)),
            ("max_depth", 6.0),
            ("min_child_weight", 8.0),
            ("subsample", 0.8),
            ("colsample", 0.6),
        ]);
        best.insert("booster".into(), Value::Str("gbtree".into()));
        assert!(at("xgb6", &best).abs() < 1e-12);
    }
}
