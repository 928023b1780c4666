use std::collections::BTreeSet;

use trainyard_tuner::{
    grid_size, initial_design_size, should_stop, suggest, Algorithm, Assignment, Goal, ParamSpec,
    ParentValues, Scale, Space, StoppingRule, Trial, TunerError, Value,
};

fn err_param(r: Result<(), TunerError>) -> (String, String) {
    match r {
        Err(TunerError::InvalidSpace { param, message }) => (param, message),
        other => panic!("expected InvalidSpace, got {other:?}"),
    }
}

#[test]
fn validation_names_the_parameter() {
    let (p, m) =
        err_param(Space::new(vec![ParamSpec::double("lr", 1.0, 0.1, Scale::Linear)]).validate());
    assert_eq!(p, "lr");
    assert!(m.contains("above max"), "{m}");

    let (p, m) =
        err_param(Space::new(vec![ParamSpec::integer("n", 5, 2, Scale::Linear)]).validate());
    assert_eq!(p, "n");
    assert!(m.contains("above max"), "{m}");

    let (p, m) =
        err_param(Space::new(vec![ParamSpec::double("lr", 0.0, 1.0, Scale::Log)]).validate());
    assert_eq!(p, "lr");
    assert!(m.contains("positive"), "{m}");
    let (p, _) =
        err_param(Space::new(vec![ParamSpec::integer("k", -1, 4, Scale::ReverseLog)]).validate());
    assert_eq!(p, "k");
    let (p, _) = err_param(
        Space::new(vec![ParamSpec::discrete("d", vec![0.0, 1.0], Scale::Log)]).validate(),
    );
    assert_eq!(p, "d");

    let (p, m) =
        err_param(Space::new(vec![ParamSpec::categorical("opt", Vec::<String>::new())]).validate());
    assert_eq!(p, "opt");
    assert!(m.contains("no values"), "{m}");
    let (p, m) =
        err_param(Space::new(vec![ParamSpec::discrete("bs", vec![], Scale::Linear)]).validate());
    assert_eq!(p, "bs");
    assert!(m.contains("no values"), "{m}");

    let (p, m) = err_param(
        Space::new(vec![
            ParamSpec::double("a", 0.0, 1.0, Scale::Linear),
            ParamSpec::integer("a", 0, 1, Scale::Linear),
        ])
        .validate(),
    );
    assert_eq!(p, "a");
    assert!(m.contains("duplicate"), "{m}");

    // A duplicate id hidden in a conditional child.
    let (p, _) = err_param(
        Space::new(vec![
            ParamSpec::double("m", 0.0, 1.0, Scale::Linear),
            ParamSpec::categorical("opt", ["sgd"]).with_child(
                ParentValues::Categorical(vec!["sgd".into()]),
                ParamSpec::double("m", 0.0, 1.0, Scale::Linear),
            ),
        ])
        .validate(),
    );
    assert_eq!(p, "m");

    // Parent values the parent cannot take.
    let (p, m) = err_param(
        Space::new(vec![ParamSpec::categorical("opt", ["sgd", "adam"])
            .with_child(
                ParentValues::Categorical(vec!["lion".into()]),
                ParamSpec::double("momentum", 0.0, 1.0, Scale::Linear),
            )])
        .validate(),
    );
    assert_eq!(p, "momentum");
    assert!(m.contains("\"lion\"") && m.contains("opt"), "{m}");
    let (p, m) = err_param(
        Space::new(vec![ParamSpec::integer("layers", 1, 4, Scale::Linear)
            .with_child(
                ParentValues::Int(vec![9]),
                ParamSpec::double("w", 0.0, 1.0, Scale::Linear),
            )])
        .validate(),
    );
    assert_eq!(p, "w");
    assert!(m.contains('9'), "{m}");
    let (p, _) = err_param(
        Space::new(vec![ParamSpec::discrete(
            "bs",
            vec![16.0, 32.0],
            Scale::Linear,
        )
        .with_child(
            ParentValues::Discrete(vec![64.0]),
            ParamSpec::double("w", 0.0, 1.0, Scale::Linear),
        )])
        .validate(),
    );
    assert_eq!(p, "w");
    // Parent values of the wrong kind, and a DOUBLE parent.
    let (p, m) = err_param(
        Space::new(vec![ParamSpec::discrete(
            "bs",
            vec![16.0, 32.0],
            Scale::Linear,
        )
        .with_child(
            ParentValues::Int(vec![16]),
            ParamSpec::double("w", 0.0, 1.0, Scale::Linear),
        )])
        .validate(),
    );
    assert_eq!(p, "w");
    assert!(m.contains("DISCRETE"), "{m}");
    let (p, _) = err_param(
        Space::new(vec![ParamSpec::double("x", 0.0, 1.0, Scale::Linear)
            .with_child(
                ParentValues::Discrete(vec![0.5]),
                ParamSpec::double("w", 0.0, 1.0, Scale::Linear),
            )])
        .validate(),
    );
    assert_eq!(p, "w");

    // A default outside the domain.
    let (p, _) = err_param(
        Space::new(vec![
            ParamSpec::double("x", 0.0, 1.0, Scale::Linear).with_default(2.0)
        ])
        .validate(),
    );
    assert_eq!(p, "x");

    // Errors surface through suggest too, and display well.
    let bad = Space::new(vec![ParamSpec::double("lr", 1.0, 0.1, Scale::Linear)]);
    let e = suggest(
        &bad,
        Algorithm::RandomSearch,
        Goal::Maximize,
        &[],
        &[],
        1,
        0,
    )
    .unwrap_err();
    assert!(e.to_string().contains("lr"), "{e}");

    assert!(mixed_space().validate().is_ok());
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

fn grid_space() -> Space {
    Space::new(vec![
        ParamSpec::categorical("opt", ["sgd", "adam"]).with_child(
            ParentValues::Categorical(vec!["sgd".into()]),
            ParamSpec::discrete("momentum", vec![0.0, 0.9], Scale::Linear),
        ),
        ParamSpec::integer("layers", 1, 2, Scale::Linear),
    ])
}

fn show(a: &Assignment) -> String {
    a.iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

#[test]
fn grid_enumerates_in_order_and_exhausts() {
    let space = grid_space();
    assert_eq!(grid_size(&space).unwrap(), 6);
    let all = suggest(
        &space,
        Algorithm::GridSearch,
        Goal::Maximize,
        &[],
        &[],
        100,
        0,
    )
    .unwrap();
    let shown: Vec<String> = all.iter().map(show).collect();
    assert_eq!(
        shown,
        vec![
            "layers=1,momentum=0,opt=sgd",
            "layers=2,momentum=0,opt=sgd",
            "layers=1,momentum=0.9,opt=sgd",
            "layers=2,momentum=0.9,opt=sgd",
            "layers=1,opt=adam",
            "layers=2,opt=adam",
        ]
    );
    // Completed and pending points are skipped; the rest come in order.
    let completed = vec![
        Trial::new(all[0].clone(), Some(1.0)),
        Trial::new(all[2].clone(), None),
    ];
    let pending = vec![all[1].clone()];
    let next = suggest(
        &space,
        Algorithm::GridSearch,
        Goal::Maximize,
        &completed,
        &pending,
        2,
        0,
    )
    .unwrap();
    assert_eq!(next, vec![all[3].clone(), all[4].clone()]);
    // Fewer than asked near the end, then Exhausted.
    let pending: Vec<Assignment> = all[1..5].to_vec();
    let next = suggest(
        &space,
        Algorithm::GridSearch,
        Goal::Maximize,
        &completed,
        &pending,
        3,
        0,
    )
    .unwrap();
    assert_eq!(next, vec![all[5].clone()]);
    let pending: Vec<Assignment> = all[1..].to_vec();
    assert_eq!(
        suggest(
            &space,
            Algorithm::GridSearch,
            Goal::Maximize,
            &completed,
            &pending,
            1,
            0
        ),
        Err(TunerError::Exhausted)
    );
    // An integer given as a whole double in a completed trial still matches.
    let mut as_double = all[0].clone();
    as_double.insert("layers".into(), Value::Double(1.0));
    let next = suggest(
        &space,
        Algorithm::GridSearch,
        Goal::Maximize,
        &[Trial::new(as_double, Some(0.0))],
        &[],
        1,
        0,
    )
    .unwrap();
    assert_eq!(next, vec![all[1].clone()]);
}

#[test]
fn grid_refuses_double_and_handles_huge_grids() {
    let space = Space::new(vec![
        ParamSpec::integer("n", 1, 3, Scale::Linear),
        ParamSpec::categorical("c", ["a"]).with_child(
            ParentValues::Categorical(vec!["a".into()]),
            ParamSpec::double("x", 0.0, 1.0, Scale::Linear),
        ),
    ]);
    let e = suggest(
        &space,
        Algorithm::GridSearch,
        Goal::Maximize,
        &[],
        &[],
        1,
        0,
    )
    .unwrap_err();
    assert_eq!(
        e,
        TunerError::Unsupported("GRID_SEARCH does not support DOUBLE parameter x".into())
    );
    assert_eq!(
        e.to_string(),
        "GRID_SEARCH does not support DOUBLE parameter x"
    );

    let big = Space::new(vec![
        ParamSpec::integer("a", 0, 1_000_000_000, Scale::Linear),
        ParamSpec::integer("b", -5, 5, Scale::Linear).with_child(
            ParentValues::Int(vec![0]),
            ParamSpec::categorical("c", ["x", "y", "z"]),
        ),
    ]);
    assert_eq!(grid_size(&big).unwrap(), 1_000_000_001 * 13);
    let pts = suggest(&big, Algorithm::GridSearch, Goal::Minimize, &[], &[], 15, 0).unwrap();
    assert_eq!(show(&pts[0]), "a=0,b=-5");
    assert_eq!(show(&pts[5]), "a=0,b=0,c=x");
    assert_eq!(show(&pts[7]), "a=0,b=0,c=z");
    assert_eq!(show(&pts[8]), "a=0,b=1");
    assert_eq!(show(&pts[13]), "a=1,b=-5");
}

#[test]
fn random_respects_bounds_and_scales() {
    let space = Space::new(vec![
        ParamSpec::double("lin", -2.0, 3.0, Scale::Linear),
        ParamSpec::double("log", 1e-5, 1e-1, Scale::Log),
        ParamSpec::double("rlog", 1.0, 100.0, Scale::ReverseLog),
        ParamSpec::integer("ilog", 1, 1000, Scale::Log),
        ParamSpec::integer("i", 3, 5, Scale::Linear),
        ParamSpec::discrete("d", vec![0.5, 2.0, 8.0], Scale::Log),
    ]);
    let n = 4000;
    let pts = suggest(
        &space,
        Algorithm::RandomSearch,
        Goal::Maximize,
        &[],
        &[],
        n,
        11,
    )
    .unwrap();
    assert_eq!(pts.len(), n);
    let mut decades = [0usize; 4];
    let mut below_geo_mean = 0;
    let mut rlog_top = 0;
    let mut ints = [0usize; 3];
    let mut ilog_small = 0;
    for a in &pts {
        let lin = a["lin"].as_f64().unwrap();
        assert!((-2.0..=3.0).contains(&lin));
        let lg = a["log"].as_f64().unwrap();
        assert!((1e-5..=1e-1).contains(&lg));
        decades[((lg.log10() + 5.0).floor() as usize).min(3)] += 1;
        let r = a["rlog"].as_f64().unwrap();
        assert!((1.0..=100.0).contains(&r));
        if r > 100.0 + 1.0 - 10.0 {
            rlog_top += 1; // the mirror of log-uniform's [1, 10]
        }
        let il = a["ilog"].as_i64().unwrap();
        assert!((1..=1000).contains(&il));
        if il <= 31 {
            ilog_small += 1;
        }
        below_geo_mean += (lg < 1e-3) as usize;
        let i = match a["i"] {
            Value::Int(i) => i,
            ref v => panic!("integer parameter came back as {v:?}"),
        };
        assert!((3..=5).contains(&i));
        ints[(i - 3) as usize] += 1;
        assert!([0.5, 2.0, 8.0].contains(&a["d"].as_f64().unwrap()));
    }
    // Log-uniform: each of the four decades gets about a quarter.
    for c in decades {
        assert!(
            (c as f64 / n as f64 - 0.25).abs() < 0.035,
            "decades {decades:?}"
        );
    }
    assert!((below_geo_mean as f64 / n as f64 - 0.5).abs() < 0.04);
    // Reverse log: half of the mass in the top 10% ... of the log range.
    assert!(
        (rlog_top as f64 / n as f64 - 0.5).abs() < 0.04,
        "{rlog_top}"
    );
    // Integer on a log scale: about half at or below sqrt(1000).
    assert!(
        (ilog_small as f64 / n as f64 - 0.5).abs() < 0.05,
        "{ilog_small}"
    );
    // Linear integers: every value equally likely (endpoints included).
    for c in ints {
        assert!((c as f64 / n as f64 - 1.0 / 3.0).abs() < 0.04, "{ints:?}");
    }
}

fn branin(a: &Assignment) -> f64 {
    let (x1, x2) = (a["x0"].as_f64().unwrap(), a["x1"].as_f64().unwrap());
    let pi = std::f64::consts::PI;
    (x2 - 5.1 / (4.0 * pi * pi) * x1 * x1 + 5.0 / pi * x1 - 6.0).powi(2)
        + 10.0 * (1.0 - 1.0 / (8.0 * pi)) * x1.cos()
        + 10.0
}

fn branin_space() -> Space {
    Space::new(vec![
        ParamSpec::double("x0", -5.0, 10.0, Scale::Linear),
        ParamSpec::double("x1", 0.0, 15.0, Scale::Linear),
    ])
}

fn run(
    space: &Space,
    alg: Algorithm,
    f: fn(&Assignment) -> f64,
    n: usize,
    seed: u64,
) -> Vec<Trial> {
    let mut done = Vec::new();
    for _ in 0..n {
        let a = suggest(space, alg, Goal::Minimize, &done, &[], 1, seed)
            .unwrap()
            .remove(0);
        let v = f(&a);
        done.push(Trial::new(a, Some(v)));
    }
    done
}

fn best(t: &[Trial]) -> f64 {
    t.iter()
        .filter_map(|t| t.value)
        .fold(f64::INFINITY, f64::min)
}

#[test]
fn bo_beats_random_on_branin() {
    // Deterministic: fixed seeds, no clock, no threads.
    let mut bo_wins = 0;
    for seed in [1, 2, 3] {
        let bo = best(&run(
            &branin_space(),
            Algorithm::Unspecified,
            branin,
            30,
            seed,
        ));
        let rs = best(&run(
            &branin_space(),
            Algorithm::RandomSearch,
            branin,
            30,
            seed,
        ));
        assert!(bo - 0.397_887 < 0.05, "seed {seed}: BO best {bo}");
        bo_wins += (bo < rs) as usize;
    }
    assert_eq!(bo_wins, 3);
}

/// Once the basin of the best trial is found, BO refines it in a trust region around that
/// trial instead of spreading expected improvement over the rest of the cube: on Branin,
/// the median regret after 40 trials falls below 1e-5 (with the search over the whole cube
/// it stays near 1e-4 on these seeds).
#[test]
fn a_found_basin_is_refined_in_a_trust_region() {
    let mut regrets: Vec<f64> = [1000u64, 1001, 1002, 1003, 1004]
        .iter()
        .map(|&seed| best(&run(&branin_space(), Algorithm::Unspecified, branin, 40, seed)) - 0.397_887_357_729_738)
        .collect();
    regrets.sort_by(f64::total_cmp);
    assert!(regrets[2] < 1e-5, "median regret {:e} after 40 trials: {regrets:?}", regrets[2]);
}

/// No trust region in a space with a categorical parameter: a box on the shared numeric
/// parameters, centred on the best trial, holds them where the best trial's category wants
/// them, and another category, better at other values, then looks worse than it is. Here
/// `sgd` is best at a learning rate 30 times `adam`'s; on these seeds a box kept the search
/// on `adam` for all 50 trials.
#[test]
fn a_better_category_is_found_beside_a_refined_one() {
    let f = |a: &Assignment| {
        let lr = a["lr"].as_f64().unwrap().log10();
        let layers = a["layers"].as_f64().unwrap();
        let opt = a["optimizer"].as_str().unwrap();
        let (centre, penalty) = match opt {
            "sgd" => (-1.5, 0.0),
            "adam" => (-3.0, 0.3),
            _ => (-2.5, 0.6),
        };
        let mut v = (lr - centre).powi(2) + 0.1 * (layers - 5.0).powi(2) + penalty;
        if opt == "sgd" {
            v += 4.0 * (a["momentum"].as_f64().unwrap() - 0.9).powi(2);
        }
        v
    };
    for seed in [1000u64, 1007] {
        let t = run(&mixed_space(), Algorithm::Unspecified, f, 50, seed);
        let b = best(&t);
        assert!(b < 0.3, "seed {seed}: best {b}, not below adam's optimum");
    }
}

#[test]
fn same_seed_same_suggestions() {
    let space = mixed_space();
    let hist = run(
        &space,
        Algorithm::Unspecified,
        |a| a["lr"].as_f64().unwrap().ln().abs(),
        10,
        4,
    );
    for alg in [
        Algorithm::Unspecified,
        Algorithm::RandomSearch,
        Algorithm::GridSearch,
    ] {
        let s = if alg == Algorithm::GridSearch {
            grid_space()
        } else {
            space.clone()
        };
        let h: &[Trial] = if alg == Algorithm::GridSearch {
            &[]
        } else {
            &hist
        };
        let a = suggest(&s, alg, Goal::Minimize, h, &[], 3, 99).unwrap();
        let b = suggest(&s, alg, Goal::Minimize, h, &[], 3, 99).unwrap();
        assert_eq!(a, b, "{alg:?}");
        if alg != Algorithm::GridSearch {
            let c = suggest(&s, alg, Goal::Minimize, h, &[], 3, 100).unwrap();
            assert_ne!(
                a, c,
                "{alg:?}: a different seed should change the suggestions"
            );
        }
    }
    // A whole study replays identically.
    let again = run(
        &space,
        Algorithm::Unspecified,
        |a| a["lr"].as_f64().unwrap().ln().abs(),
        10,
        4,
    );
    assert_eq!(hist, again);
}

#[test]
fn batch_suggestions_are_distinct_and_avoid_pending() {
    let space = branin_space();
    let hist = run(&space, Algorithm::Unspecified, branin, 12, 5);
    let pending = suggest(
        &space,
        Algorithm::Unspecified,
        Goal::Minimize,
        &hist,
        &[],
        2,
        5,
    )
    .unwrap();
    let batch = suggest(
        &space,
        Algorithm::Unspecified,
        Goal::Minimize,
        &hist,
        &pending,
        4,
        5,
    )
    .unwrap();
    assert_eq!(batch.len(), 4);
    let keys: BTreeSet<String> = batch.iter().chain(&pending).map(show).collect();
    assert_eq!(keys.len(), 6, "batch and pending points must all differ");
    // Kriging believer spreads the batch: no two points nearly coincide.
    let all: Vec<&Assignment> = batch.iter().chain(&pending).collect();
    for i in 0..all.len() {
        for j in 0..i {
            let d = ((all[i]["x0"].as_f64().unwrap() - all[j]["x0"].as_f64().unwrap()) / 15.0)
                .hypot((all[i]["x1"].as_f64().unwrap() - all[j]["x1"].as_f64().unwrap()) / 15.0);
            assert!(d > 1e-3, "points {i} and {j} nearly coincide");
        }
    }
    // On a small finite space a batch never repeats a point.
    let small = Space::new(vec![
        ParamSpec::integer("a", 1, 3, Scale::Linear),
        ParamSpec::categorical("b", ["x", "y"]),
    ]);
    let hist = run(
        &small,
        Algorithm::Unspecified,
        |a| a["a"].as_f64().unwrap(),
        4,
        1,
    );
    let batch = suggest(
        &small,
        Algorithm::Unspecified,
        Goal::Minimize,
        &hist,
        &[],
        2,
        1,
    )
    .unwrap();
    let keys: BTreeSet<String> = hist
        .iter()
        .map(|t| show(&t.params))
        .chain(batch.iter().map(show))
        .collect();
    assert_eq!(keys.len(), 6);
}

#[test]
fn conditional_parameters_present_only_when_active() {
    let space = mixed_space();
    let check = |a: &Assignment| {
        assert!(a.contains_key("lr") && a.contains_key("layers") && a.contains_key("optimizer"));
        let sgd = a["optimizer"].as_str() == Some("sgd");
        assert_eq!(a.contains_key("momentum"), sgd, "{}", show(a));
        assert_eq!(a.len(), 3 + sgd as usize);
    };
    for a in suggest(
        &space,
        Algorithm::RandomSearch,
        Goal::Maximize,
        &[],
        &[],
        200,
        3,
    )
    .unwrap()
    {
        check(&a);
    }
    // BO, through the initial design and well past it.
    let f = |a: &Assignment| {
        let m = a.get("momentum").and_then(Value::as_f64).unwrap_or(0.0);
        (a["lr"].as_f64().unwrap().log10() + 2.0).powi(2) + (m - 0.9).powi(2)
    };
    let hist = run(
        &space,
        Algorithm::Unspecified,
        f,
        initial_design_size(4) + 8,
        2,
    );
    let mut saw = BTreeSet::new();
    for t in &hist {
        check(&t.params);
        saw.insert(t.params["optimizer"].as_str().unwrap().to_string());
    }
    assert_eq!(saw.len(), 3, "all categories explored");
    for a in suggest(
        &space,
        Algorithm::Unspecified,
        Goal::Minimize,
        &hist,
        &[],
        3,
        2,
    )
    .unwrap()
    {
        check(&a);
    }
    for a in suggest(
        &grid_space(),
        Algorithm::GridSearch,
        Goal::Maximize,
        &[],
        &[],
        10,
        0,
    )
    .unwrap()
    {
        assert_eq!(a.contains_key("momentum"), a["opt"].as_str() == Some("sgd"));
    }
}

#[test]
fn defaults_seed_the_first_bo_suggestion() {
    let space = Space::new(vec![
        ParamSpec::double("lr", 1e-4, 1.0, Scale::Log).with_default(0.01),
        ParamSpec::integer("n", 1, 9, Scale::Linear),
    ]);
    let a = suggest(
        &space,
        Algorithm::Unspecified,
        Goal::Maximize,
        &[],
        &[],
        2,
        0,
    )
    .unwrap();
    assert_eq!(a[0]["lr"], Value::Double(0.01));
    assert_ne!(a[1]["lr"], Value::Double(0.01));
}

#[test]
fn infeasible_trials_are_handled() {
    // Trials on the right half are infeasible; BO must keep working and
    // still find the optimum at the left edge of the feasible region.
    let space = Space::new(vec![ParamSpec::double("x", 0.0, 1.0, Scale::Linear)]);
    let mut done: Vec<Trial> = Vec::new();
    for _ in 0..15 {
        let a = suggest(
            &space,
            Algorithm::Unspecified,
            Goal::Maximize,
            &done,
            &[],
            1,
            8,
        )
        .unwrap()
        .remove(0);
        let x = a["x"].as_f64().unwrap();
        let v = if x > 0.5 {
            None
        } else {
            Some(-(x - 0.3).powi(2))
        };
        done.push(Trial::new(a, v));
    }
    let best = done
        .iter()
        .filter_map(|t| t.value)
        .fold(f64::NEG_INFINITY, f64::max);
    assert!(best > -1e-3, "best {best}");
    // All infeasible: still suggests.
    let all_bad: Vec<Trial> = done
        .iter()
        .map(|t| Trial::new(t.params.clone(), None))
        .collect();
    assert_eq!(
        suggest(
            &space,
            Algorithm::Unspecified,
            Goal::Maximize,
            &all_bad,
            &[],
            2,
            0
        )
        .unwrap()
        .len(),
        2
    );
    // A completed trial that does not fit the space is reported.
    let mut bad = Assignment::new();
    bad.insert("y".into(), Value::Double(0.1));
    let mut hist = done.clone();
    hist.push(Trial::new(bad, Some(0.0)));
    let e = suggest(
        &space,
        Algorithm::Unspecified,
        Goal::Maximize,
        &hist,
        &[],
        1,
        0,
    )
    .unwrap_err();
    assert!(
        matches!(e, TunerError::InvalidTrial { ref param, .. } if param == "x"),
        "{e:?}"
    );
}

fn curve_trial(final_value: Option<f64>, steps: &[(u64, f64)]) -> Trial {
    Trial {
        params: Assignment::new(),
        value: final_value,
        intermediate: steps.to_vec(),
    }
}

/// Accuracy-like curves rising towards `top`.
fn rising(top: f64, n: u64) -> Vec<(u64, f64)> {
    (1..=n)
        .map(|s| (s * 100, top - (top - 0.1) / (s as f64)))
        .collect()
}

#[test]
fn median_stopping_rule() {
    let rule = StoppingRule::median();
    let completed: Vec<Trial> = [0.9, 0.8, 0.85, 0.7]
        .iter()
        .map(|&top| curve_trial(Some(top), &rising(top, 10)))
        .collect();
    // At step 300 the completed running averages are ~0.47..0.58; a trial
    // whose best so far is 0.3 is below their median and is stopped.
    let poor = curve_trial(None, &[(100, 0.2), (200, 0.3), (300, 0.25)]);
    assert!(should_stop(&rule, Goal::Maximize, &poor, &completed));
    let good = curve_trial(None, &[(100, 0.4), (200, 0.6), (300, 0.7)]);
    assert!(!should_stop(&rule, Goal::Maximize, &good, &completed));
    // Minimising a loss mirrors it.
    let loss = |t: &Trial| {
        curve_trial(
            t.value.map(|v| -v),
            &t.intermediate
                .iter()
                .map(|&(s, v)| (s, -v))
                .collect::<Vec<_>>(),
        )
    };
    let completed_loss: Vec<Trial> = completed.iter().map(loss).collect();
    assert!(should_stop(
        &rule,
        Goal::Minimize,
        &loss(&poor),
        &completed_loss
    ));
    assert!(!should_stop(
        &rule,
        Goal::Minimize,
        &loss(&good),
        &completed_loss
    ));
    // Too few completed trials with measurements at or before the step.
    assert!(!should_stop(&rule, Goal::Maximize, &poor, &completed[..2]));
    let late: Vec<Trial> = completed
        .iter()
        .map(|t| curve_trial(t.value, &t.intermediate[5..]))
        .collect();
    assert!(!should_stop(&rule, Goal::Maximize, &poor, &late));
    // Infeasible completed trials are ignored.
    let mut with_bad = completed[..2].to_vec();
    with_bad.push(curve_trial(None, &rising(0.95, 10)));
    assert!(!should_stop(&rule, Goal::Maximize, &poor, &with_bad));
    // No measurements: never stop.
    assert!(!should_stop(
        &rule,
        Goal::Maximize,
        &curve_trial(None, &[]),
        &completed
    ));
}

#[test]
fn decay_curve_stopping_rule() {
    let rule = StoppingRule::decay_curve();
    // A loss curve decaying like 0.2 + 2/t reaches ~0.2 at step 1000.
    let loss = |a: f64, b: f64, n: u64| -> Vec<(u64, f64)> {
        (1..=n).map(|s| (s * 10, a + b / (s as f64))).collect()
    };
    let completed = vec![
        curve_trial(Some(0.2), &loss(0.2, 2.0, 100)),
        curve_trial(Some(0.35), &loss(0.35, 2.0, 100)),
        curve_trial(Some(0.5), &loss(0.5, 2.0, 100)),
    ];
    // Heading for 0.8: clearly worse than the best 0.2 although its current
    // value (1.2 at step 40, after 4 measurements) is still far from final.
    let doomed = curve_trial(None, &loss(0.8, 4.0, 8));
    assert!(should_stop(&rule, Goal::Minimize, &doomed, &completed));
    // Heading for 0.15: better than the best, keep it even though its
    // current value is worse than every completed trial's final value.
    let promising = curve_trial(None, &loss(0.15, 6.0, 8));
    assert!(promising.intermediate.last().unwrap().1 > 0.5);
    assert!(!should_stop(&rule, Goal::Minimize, &promising, &completed));
    // Heading for 0.22 at the horizon (step 1000) against a best final value
    // of 0.2: within the margin (0.1 × spread 0.3), so it goes on.
    let close = curve_trial(None, &loss(0.19, 3.0, 8));
    assert!(!should_stop(&rule, Goal::Minimize, &close, &completed));
    // Too few measurements.
    assert!(!should_stop(
        &rule,
        Goal::Minimize,
        &curve_trial(None, &loss(0.8, 4.0, 3)),
        &completed
    ));
    // Maximising: an exponential approach to 0.6 against a best of 0.9.
    let acc = |top: f64, n: u64| -> Vec<(u64, f64)> {
        (0..n)
            .map(|s| (s * 50, top - (top - 0.1) * (-(s as f64) / 4.0).exp()))
            .collect()
    };
    let completed = vec![
        curve_trial(Some(0.9), &acc(0.9, 40)),
        curve_trial(Some(0.7), &acc(0.7, 40)),
    ];
    assert!(should_stop(
        &rule,
        Goal::Maximize,
        &curve_trial(None, &acc(0.6, 10)),
        &completed
    ));
    assert!(!should_stop(
        &rule,
        Goal::Maximize,
        &curve_trial(None, &acc(0.95, 10)),
        &completed
    ));
    // Nothing completed: no reference, never stop.
    assert!(!should_stop(
        &rule,
        Goal::Maximize,
        &curve_trial(None, &acc(0.6, 10)),
        &[]
    ));
}

fn rosenbrock4(a: &Assignment) -> f64 {
    let v: Vec<f64> = (0..4)
        .map(|i| a[&format!("x{i}")].as_f64().unwrap())
        .collect();
    (0..3)
        .map(|i| 100.0 * (v[i + 1] - v[i] * v[i]).powi(2) + (1.0 - v[i]).powi(2))
        .sum()
}

fn rosenbrock_space() -> Space {
    Space::new(
        (0..4)
            .map(|i| ParamSpec::double(format!("x{i}"), -2.0, 2.0, Scale::Linear))
            .collect(),
    )
}

/// Share of the DOUBLE values of the trials that lie exactly on a bound of
/// `[lo, hi]`.
fn on_bound_share(trials: &[Trial], lo: &[f64], hi: &[f64]) -> f64 {
    let mut n = 0;
    let mut on = 0;
    for t in trials {
        for (i, (l, h)) in lo.iter().zip(hi).enumerate() {
            let v = t.params[&format!("x{i}")].as_f64().unwrap();
            n += 1;
            on += (v == *l || v == *h) as usize;
        }
    }
    on as f64 / n as f64
}

#[test]
fn bo_does_not_collapse_onto_bounds() {
    // Both problems have every optimum in the interior. Clamping the
    // acquisition search put 10-20% of the proposed values exactly on a
    // bound here; random search puts none there.
    for seed in [1, 2, 3] {
        let t = run(&branin_space(), Algorithm::Unspecified, branin, 30, seed);
        let share = on_bound_share(&t, &[-5.0, 0.0], &[10.0, 15.0]);
        assert_eq!(share, 0.0, "branin seed {seed}: {share}");
        let t = run(
            &rosenbrock_space(),
            Algorithm::Unspecified,
            rosenbrock4,
            30,
            seed,
        );
        let share = on_bound_share(&t, &[-2.0; 4], &[2.0; 4]);
        assert_eq!(share, 0.0, "rosenbrock seed {seed}: {share}");
    }
}

#[test]
fn bo_still_reaches_an_optimum_on_a_bound() {
    // Optimum at x0 = 0 (lower bound, linear slope) and x2 = 1 (upper bound),
    // x1 = 0.4 inside: the data push towards the bounds, and the search
    // follows them there.
    let space = Space::new(vec![
        ParamSpec::double("x0", 0.0, 1.0, Scale::Linear),
        ParamSpec::double("x1", 0.0, 1.0, Scale::Linear),
        ParamSpec::double("x2", -1.0, 1.0, Scale::Linear),
    ]);
    fn f(a: &Assignment) -> f64 {
        let g = |k: &str| a[k].as_f64().unwrap();
        g("x0") + (g("x1") - 0.4).powi(2) + (1.0 - g("x2"))
    }
    for seed in [1, 2, 3] {
        let t = run(&space, Algorithm::Unspecified, f, 30, seed);
        let best = t
            .iter()
            .min_by(|a, b| a.value.unwrap().total_cmp(&b.value.unwrap()))
            .unwrap();
        let v = best.value.unwrap();
        assert!(v < 1e-3, "seed {seed}: best {v} at {}", show(&best.params));
        assert!(best.params["x0"].as_f64().unwrap() < 1e-3);
        assert!(best.params["x2"].as_f64().unwrap() > 1.0 - 2e-3);
    }
}

/// Loss-like curves falling towards `last` over steps 1..=n.
fn falling(last: f64, n: u64) -> Vec<(u64, f64)> {
    (1..=n).map(|s| (s, last + 1.0 / s as f64)).collect()
}

/// Successive halving: rungs at 3, 9 and 27 below a horizon of 81 (eta 3); a trial is
/// judged at the highest rung it has reached against the ended trials' values there.
#[test]
fn successive_halving_keeps_the_best_third_at_each_rung() {
    let rule = StoppingRule::SuccessiveHalving {
        max_step: Some(81),
        min_step: None,
        eta: 3,
    };
    // Five ended trials; at step 9 their losses are 0.1 + 1/9 ... 0.5 + 1/9.
    let done: Vec<Trial> = [0.1, 0.2, 0.3, 0.4, 0.5]
        .iter()
        .map(|&v| curve_trial(Some(v), &falling(v, 81)))
        .collect();
    let running = |last: f64, upto: u64| curve_trial(None, &falling(last, upto));
    // At step 9 with 6 values the best 2 go on: second best goes on, third does not.
    assert!(!should_stop(&rule, Goal::Minimize, &running(0.15, 9), &done));
    assert!(should_stop(&rule, Goal::Minimize, &running(0.25, 9), &done));
    // Between rungs the highest one reached counts (9 until step 27).
    assert!(should_stop(&rule, Goal::Minimize, &running(0.25, 20), &done));
    // Before the first rung nothing is judged.
    assert!(!should_stop(&rule, Goal::Minimize, &running(0.9, 2), &done));
    // At the horizon nothing is stopped.
    assert!(!should_stop(&rule, Goal::Minimize, &running(0.9, 81), &done));
    // Fewer than eta ended trials at the rung: too early to judge.
    assert!(!should_stop(&rule, Goal::Minimize, &running(0.9, 9), &done[..2]));
    // The goal's direction counts: maximising, the lowest is the best no more.
    assert!(should_stop(&rule, Goal::Maximize, &running(0.05, 9), &done));
    // Without max_step the horizon is what the ended trials reached; without any
    // ended trial there is none, and nothing is stopped.
    let learnt = StoppingRule::successive_halving();
    assert!(should_stop(&learnt, Goal::Minimize, &running(0.25, 9), &done));
    assert!(!should_stop(&learnt, Goal::Minimize, &running(0.9, 9), &[]));
}

/// The multi-fidelity mode on a learning-curve benchmark: trials whose loss falls as
/// `final + spread·(1 + step)^-0.7` over 81 steps, the final loss a Branin-like function
/// of the parameters and the spread (how slowly a trial converges) varying with them, so
/// that the early ranking is only a hint of the final one. Random search proposes the
/// same trials in the same order with and without successive halving; with it, the best
/// final loss of 27 full-length trials is found at a fraction of their steps.
#[test]
fn successive_halving_finds_as_good_a_point_with_fewer_steps() {
    const HORIZON: u64 = 81;
    let space = Space::new(vec![
        ParamSpec::double("x0", -5.0, 10.0, Scale::Linear),
        ParamSpec::double("x1", 0.0, 15.0, Scale::Linear),
        ParamSpec::double("lr", 1e-4, 1.0, Scale::Log),
    ]);
    let loss = |a: &Assignment, step: u64| {
        let b = branin(a) / 50.0;
        let lr = a["lr"].as_f64().unwrap_or(1.0).log10();
        // A learning rate far from 1e-2 converges slowly (and ends a little worse).
        let spread = 0.5 + 0.4 * (lr + 2.0).powi(2);
        b + 0.05 * (lr + 2.0).powi(2) + spread * (1.0 + step as f64).powf(-0.7)
    };
    let mut out = Vec::new();
    for seed in [1u64, 2, 3, 4, 5] {
        // Without early stopping: 27 trials of 81 steps.
        let mut plain: Vec<Trial> = Vec::new();
        for _ in 0..27 {
            let a = suggest(&space, Algorithm::RandomSearch, Goal::Minimize, &plain, &[], 1, seed).unwrap().remove(0);
            let curve: Vec<(u64, f64)> = (1..=HORIZON).map(|t| (t, loss(&a, t))).collect();
            plain.push(Trial { value: Some(curve[curve.len() - 1].1), params: a, intermediate: curve });
        }
        let target = plain.iter().filter_map(|t| t.value).fold(f64::INFINITY, f64::min);
        let plain_steps = 27 * HORIZON;
        // With successive halving: the same proposals, until a trial that ran to the
        // end is as good.
        let rule = StoppingRule::successive_halving();
        let mut halving: Vec<Trial> = Vec::new();
        let mut steps = 0u64;
        let mut found = None;
        while found.is_none() && halving.len() < 27 {
            let a = suggest(&space, Algorithm::RandomSearch, Goal::Minimize, &halving, &[], 1, seed).unwrap().remove(0);
            let mut t = Trial { params: a, value: None, intermediate: Vec::new() };
            for step in 1..=HORIZON {
                t.intermediate.push((step, loss(&t.params, step)));
                steps += 1;
                if should_stop(&rule, Goal::Minimize, &t, &halving) {
                    break;
                }
            }
            let (last_step, last) = t.intermediate[t.intermediate.len() - 1];
            t.value = Some(last);
            if last_step == HORIZON && last <= target {
                found = Some(steps);
            }
            halving.push(t);
        }
        let found = found.unwrap_or_else(|| panic!("seed {seed}: no trial as good as {target} within 27 trials"));
        out.push((seed, found, plain_steps));
        assert!(found < plain_steps, "seed {seed}: {found} steps against {plain_steps}");
    }
    let spent: u64 = out.iter().map(|o| o.1).sum();
    let plain: u64 = out.iter().map(|o| o.2).sum();
    eprintln!("measure: successive halving reached the best of 27 full trials in {spent} steps against {plain} ({:.2}x), per seed {out:?}", spent as f64 / plain as f64);
    assert!(spent * 2 < plain, "{out:?}");
}

/// A deterministic function with one narrow basin at the bottom of a wide one: the GP's
/// likelihood tends to explain the basin's best trial as noise, and measured from that
/// trial's value the expected improvement was largest far from all data, so the search
/// went to the corners of the cube and stopped improving. Measured from the best
/// posterior mean (as the model, when it fits noise, says it should be), the search stays
/// with the data: few proposals next to a bound.
#[test]
fn a_narrow_basin_keeps_the_search_off_the_corners() {
    let centre = [0.63, 0.27, 0.71, 0.38, 0.55, 0.19];
    let f = |a: &Assignment| {
        let r2: f64 = (0..6).map(|i| (a[&format!("x{i}")].as_f64().unwrap() - centre[i]).powi(2)).sum();
        0.3 * (1.0 - (-r2 / 0.5).exp()) + 0.7 * (1.0 - (-r2 / 0.0072).exp())
    };
    let space = Space::new((0..6).map(|i| ParamSpec::double(format!("x{i}"), 0.0, 1.0, Scale::Linear)).collect());
    let (mut near, mut coords) = (0, 0);
    let mut bests = Vec::new();
    for seed in [1003u64, 1004, 1005] {
        let mut done: Vec<Trial> = Vec::new();
        for t in 0..45 {
            let a = suggest(&space, Algorithm::Unspecified, Goal::Minimize, &done, &[], 1, seed).unwrap().remove(0);
            if t >= 12 {
                for v in a.values() {
                    let v = v.as_f64().unwrap();
                    coords += 1;
                    near += usize::from(!(1e-3..=1.0 - 1e-3).contains(&v));
                }
            }
            let v = f(&a);
            done.push(Trial::new(a, Some(v)));
        }
        bests.push(done.iter().filter_map(|t| t.value).fold(f64::INFINITY, f64::min));
    }
    let share = near as f64 / coords as f64;
    assert!(share < 0.1, "{:.1}% of coordinates within 0.1% of a bound; best values {bests:?}", 100.0 * share);
}

/// A stop flag set before or while a batch is computed ends it with `Cancelled` (a
/// deleted study's work stops), and a flag never set changes nothing.
#[test]
fn a_set_stop_flag_cancels_a_suggestion() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use trainyard_tuner::{suggest_until, Noise};
    let space = branin_space();
    let done = run(&space, Algorithm::RandomSearch, branin, 20, 3);
    let stop = AtomicBool::new(false);
    let free = suggest_until(&space, Algorithm::Unspecified, Goal::Minimize, &done, &[], 3, 1, Noise::Unspecified, &stop);
    assert_eq!(free.expect("no stop: suggestions").len(), 3);
    stop.store(true, Ordering::SeqCst);
    for alg in [Algorithm::Unspecified, Algorithm::RandomSearch, Algorithm::GridSearch] {
        let r = suggest_until(&space, alg, Goal::Minimize, &done, &[], 3, 1, Noise::Unspecified, &stop);
        assert_eq!(r, Err(TunerError::Cancelled), "{alg:?}");
    }
    // Set while the batch runs: another thread sets it after the first fit.
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let setter = {
        let stop = std::sync::Arc::clone(&stop);
        std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(50));
            stop.store(true, Ordering::SeqCst);
        })
    };
    let r = suggest_until(&space, Algorithm::Unspecified, Goal::Minimize, &done, &[], 100_000, 1, Noise::Unspecified, &stop);
    setter.join().expect("setter");
    assert_eq!(r, Err(TunerError::Cancelled), "a batch under way stops at its next look");
}
