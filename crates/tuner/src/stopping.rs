//! Automated early stopping of running trials.

use crate::space::Goal;
use crate::Trial;

/// An early-stopping rule.
#[derive(Clone, Debug, PartialEq)]
pub enum StoppingRule {
    /// Median automated stopping.
    ///
    /// Let `S` be the largest step the running trial has reported. For every
    /// completed, feasible trial (value not `None`) that reported at least
    /// one intermediate value at a step `<= S`, take the running average of
    /// its intermediate values at steps `<= S`. If at least `min_completed`
    /// such averages exist, the trial is stopped when its best intermediate
    /// value so far (the largest when maximising, the smallest when
    /// minimising) is strictly worse than their median.
    Median { min_completed: usize },
    /// Decay-curve stopping.
    ///
    /// Needs at least `min_measurements` intermediate values of the running
    /// trial and at least one completed feasible trial. The horizon `T` is
    /// the largest step reported by any completed trial (the trial's own
    /// last step if that is larger). Two curve families are fitted to the
    /// trial's `(step, value)` pairs by least squares — a power law
    /// `a + b·t^(−c)` and an exponential `a + b·e^(−c·t/T)`, each with `c`
    /// searched over a grid and `a`, `b` solved linearly — and the one with
    /// the smaller squared error predicts the value at `T`. The prediction is
    /// made optimistic by taking the better of it and the trial's best value
    /// so far. With `best` the best final value among completed feasible
    /// trials and `spread` the range of those values (or `|best|` when there
    /// is only one, or 1 when that is 0), the trial is stopped when the
    /// optimistic prediction is worse than `best` by more than
    /// `margin × spread`.
    DecayCurve {
        min_measurements: usize,
        margin: f64,
    },
    /// Convex stopping (the reference's `convexAutomatedStoppingSpec`).
    ///
    /// Considered only with at least `min_measurements + 1` completed feasible
    /// trials, when the running trial has at least `min_measurements` values
    /// (at least 2) and one of them at a step beyond `min_step` (default: a
    /// tenth of the horizon). The horizon `H` is `max_step`, or, when unset,
    /// the largest step any completed trial reported (the trial's own last
    /// step if larger); a trial at or past `H` is never stopped. The rule
    /// takes the slope of a least-squares line through the trial's last three
    /// values and extends it to `H`: for a learning curve that improves ever
    /// more slowly (convex in the direction of the goal) this overestimates
    /// the final value. A curve that is completely flat gives no estimate (the
    /// trial is not stopped); one that gets worse is estimated at its best
    /// value so far. The trial is stopped when that overestimate is strictly
    /// worse than the best final value of the completed trials; its final
    /// value is then predicted by [`predicted_final`].
    Convex {
        max_step: Option<u64>,
        min_step: Option<u64>,
        min_measurements: usize,
    },
    /// Asynchronous successive halving (ASHA), the multi-fidelity mode: most
    /// trials are judged on a few steps and only the best go on to more.
    ///
    /// The horizon `H` is `max_step`, or, when unset, the largest step any
    /// completed trial reported (the trial's own last step if larger); with
    /// neither, no trial is stopped. Rungs lie at `r·eta^k` below `H`, `r`
    /// being `min_step` or, when unset, `H / eta^3` (at least 1), so that a
    /// trial can be judged three times. A trial's value at a rung is its
    /// value at the first step at or past the rung. A running trial is
    /// judged at the highest rung it has reached (never at or past `H`): it
    /// is stopped when at least `eta` ended trials have a value at that rung
    /// and its own value is not among the best `⌈n / eta⌉` of the `n` values
    /// there, its own counted. So about one trial in `eta` goes on from each
    /// rung, and the steps a study spends fall by about that factor per rung,
    /// while a trial that is among the best at every rung runs to the end.
    SuccessiveHalving {
        max_step: Option<u64>,
        min_step: Option<u64>,
        eta: u64,
    },
}

impl StoppingRule {
    /// Median stopping with `min_completed = 3`.
    pub fn median() -> Self {
        StoppingRule::Median { min_completed: 3 }
    }
    /// Successive halving with `eta = 3` and the rungs from the horizon.
    pub fn successive_halving() -> Self {
        StoppingRule::SuccessiveHalving {
            max_step: None,
            min_step: None,
            eta: 3,
        }
    }
    /// Decay-curve stopping with `min_measurements = 4`, `margin = 0.1`.
    pub fn decay_curve() -> Self {
        StoppingRule::DecayCurve {
            min_measurements: 4,
            margin: 0.1,
        }
    }
}

/// Whether the running `trial` should be stopped now. Intermediate values
/// may come in any step order; non-finite values are ignored.
pub fn should_stop(rule: &StoppingRule, goal: Goal, trial: &Trial, completed: &[Trial]) -> bool {
    let mine = clean(&trial.intermediate);
    if mine.is_empty() {
        return false;
    }
    let done: Vec<&Trial> = completed
        .iter()
        .filter(|t| t.value.is_some_and(f64::is_finite))
        .collect();
    match rule {
        StoppingRule::Median { min_completed } => {
            let s = mine.last().map(|m| m.0).unwrap_or(0);
            let mut avgs: Vec<f64> = done
                .iter()
                .filter_map(|t| {
                    let vals: Vec<f64> = clean(&t.intermediate)
                        .iter()
                        .filter(|m| m.0 <= s)
                        .map(|m| m.1)
                        .collect();
                    (!vals.is_empty()).then(|| vals.iter().sum::<f64>() / vals.len() as f64)
                })
                .collect();
            if avgs.len() < (*min_completed).max(1) {
                return false;
            }
            avgs.sort_by(f64::total_cmp);
            let m = avgs.len();
            let median = if m % 2 == 1 {
                avgs[m / 2]
            } else {
                0.5 * (avgs[m / 2 - 1] + avgs[m / 2])
            };
            let best = best_of(goal, mine.iter().map(|m| m.1));
            goal.better(median, best)
        }
        StoppingRule::DecayCurve {
            min_measurements,
            margin,
        } => {
            if mine.len() < (*min_measurements).max(3) || done.is_empty() {
                return false;
            }
            let own_last = mine.last().map(|m| m.0).unwrap_or(0);
            let horizon = horizon(None, &done, own_last).unwrap_or(own_last);
            let Some(pred) = predict_final(&mine, horizon) else {
                return false;
            };
            let so_far = best_of(goal, mine.iter().map(|m| m.1));
            let optimistic = if goal.better(so_far, pred) {
                so_far
            } else {
                pred
            };
            let finals: Vec<f64> = done.iter().filter_map(|t| t.value).collect();
            let best = best_of(goal, finals.iter().copied());
            let lo = finals.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = finals.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let mut spread = hi - lo;
            if spread <= 0.0 {
                spread = best.abs();
            }
            if spread <= 0.0 {
                spread = 1.0;
            }
            let threshold = match goal {
                Goal::Maximize => best - margin * spread,
                Goal::Minimize => best + margin * spread,
            };
            goal.better(threshold, optimistic)
        }
        StoppingRule::Convex { .. } => convex(rule, goal, &mine, &done).is_some(),
        StoppingRule::SuccessiveHalving {
            max_step,
            min_step,
            eta,
        } => successive_halving(*max_step, *min_step, *eta, goal, &mine, &done),
    }
}

/// The step a trial's curve ends at: `max_step` when set, else the largest step any
/// completed trial reported (the trial's own last step if larger); `None` with neither.
fn horizon(max_step: Option<u64>, done: &[&Trial], own_last: u64) -> Option<u64> {
    max_step.filter(|h| *h > 0).or_else(|| {
        done.iter()
            .flat_map(|t| t.intermediate.iter().map(|m| m.0))
            .max()
            .map(|h| h.max(own_last))
    })
}

/// [`StoppingRule::SuccessiveHalving`] for a running trial's clean curve.
fn successive_halving(
    max_step: Option<u64>,
    min_step: Option<u64>,
    eta: u64,
    goal: Goal,
    mine: &[(u64, f64)],
    done: &[&Trial],
) -> bool {
    let eta = eta.max(2);
    let Some(own_last) = mine.last().map(|m| m.0) else {
        return false;
    };
    let Some(horizon) = horizon(max_step, done, own_last) else {
        return false;
    };
    if own_last >= horizon {
        return false;
    }
    let first = min_step
        .filter(|m| *m > 0)
        .unwrap_or(horizon / eta.saturating_pow(3))
        .max(1);
    // The highest rung below the horizon that the trial has reached.
    let mut rung = None;
    let mut r = first;
    while r < horizon && r <= own_last {
        rung = Some(r);
        r = r.saturating_mul(eta);
    }
    let Some(rung) = rung else {
        return false;
    };
    let at_rung = |curve: &[(u64, f64)]| curve.iter().find(|m| m.0 >= rung).map(|m| m.1);
    let Some(own) = at_rung(mine) else {
        return false;
    };
    let others: Vec<f64> = done.iter().filter_map(|t| at_rung(&clean(&t.intermediate))).collect();
    if (others.len() as u64) < eta {
        return false;
    }
    let n = others.len() + 1;
    let keep = n.div_ceil(eta as usize);
    // Trials strictly better than this one; a tie keeps it.
    let ahead = others.iter().filter(|v| goal.better(**v, own)).count();
    ahead >= keep
}

/// The value a trial stopped by `rule` is expected to reach at the end, and that end's
/// step: for [`StoppingRule::Convex`], the better-fitting of a power law and an
/// exponential decay at the horizon, never better than the rule's overestimate (the
/// reference adds it to the stopped trial as its last measurement). `None` for the other
/// rules, or when the rule would not stop the trial.
pub fn predicted_final(rule: &StoppingRule, goal: Goal, trial: &Trial, completed: &[Trial]) -> Option<(u64, f64)> {
    let mine = clean(&trial.intermediate);
    let done: Vec<&Trial> = completed.iter().filter(|t| t.value.is_some_and(f64::is_finite)).collect();
    let (horizon, over) = convex(rule, goal, &mine, &done)?;
    let fitted = predict_final(&mine, horizon).unwrap_or(over);
    Some((horizon, if goal.better(fitted, over) { over } else { fitted }))
}

/// The convex rule: `Some((horizon, overestimate))` when the trial should stop.
fn convex(rule: &StoppingRule, goal: Goal, mine: &[(u64, f64)], done: &[&Trial]) -> Option<(u64, f64)> {
    let StoppingRule::Convex { max_step, min_step, min_measurements } = rule else { return None };
    if mine.len() < (*min_measurements).max(2) || done.len() < min_measurements + 1 {
        return None;
    }
    let own_last = mine.last().map(|m| m.0)?;
    let horizon = horizon(*max_step, done, own_last).unwrap_or(own_last);
    let min_step = min_step.unwrap_or(horizon / 10);
    if own_last >= horizon || !mine.iter().any(|m| m.0 > min_step) {
        return None;
    }
    let tail = &mine[mine.len().saturating_sub(3)..];
    if mine.iter().all(|m| m.1 == mine[0].1) {
        return None;
    }
    let so_far = best_of(goal, mine.iter().map(|m| m.1));
    let pts: Vec<(f64, f64)> = tail.iter().map(|&(s, v)| (s as f64, v)).collect();
    let over = match fit_linear(&pts, &|t| t) {
        Some((a, b, _)) => {
            let extended = a + b * horizon as f64;
            if extended.is_finite() && goal.better(extended, so_far) {
                extended
            } else {
                so_far
            }
        }
        // Every value at one step: no slope.
        None => so_far,
    };
    let best = best_of(goal, done.iter().filter_map(|t| t.value));
    goal.better(best, over).then_some((horizon, over))
}

fn clean(ms: &[(u64, f64)]) -> Vec<(u64, f64)> {
    let mut v: Vec<(u64, f64)> = ms.iter().copied().filter(|m| m.1.is_finite()).collect();
    v.sort_by_key(|m| m.0);
    v
}

fn best_of(goal: Goal, vals: impl Iterator<Item = f64>) -> f64 {
    vals.fold(None, |acc: Option<f64>, v| match acc {
        Some(b) if !goal.better(v, b) => Some(b),
        _ => Some(v),
    })
    .unwrap_or(f64::NAN)
}

/// Least-squares fit of `a + b·g(t)` for a given basis `g`; returns
/// `(a, b, sse)`.
fn fit_linear(pts: &[(f64, f64)], g: &dyn Fn(f64) -> f64) -> Option<(f64, f64, f64)> {
    let n = pts.len() as f64;
    let (mut sx, mut sy, mut sxx, mut sxy) = (0.0, 0.0, 0.0, 0.0);
    for &(t, y) in pts {
        let x = g(t);
        sx += x;
        sy += y;
        sxx += x * x;
        sxy += x * y;
    }
    let det = n * sxx - sx * sx;
    if det.abs() < 1e-12 * (1.0 + sxx * n) {
        return None;
    }
    let b = (n * sxy - sx * sy) / det;
    let a = (sy - b * sx) / n;
    let sse = pts.iter().map(|&(t, y)| (a + b * g(t) - y).powi(2)).sum();
    Some((a, b, sse))
}

/// Predicted value at `horizon` from the better-fitting of a power law and
/// an exponential decay. The rate `c` is searched on a log grid over
/// [0.01, 50] and refined by golden-section search.
pub(crate) fn predict_final(ms: &[(u64, f64)], horizon: u64) -> Option<f64> {
    // Steps may start at 0: shift by one then so that t^(−c) is defined.
    let shift = if ms.iter().any(|m| m.0 == 0) {
        1.0
    } else {
        0.0
    };
    let pts: Vec<(f64, f64)> = ms.iter().map(|&(s, v)| (s as f64 + shift, v)).collect();
    let t_end = horizon as f64 + shift;
    let families: [&dyn Fn(f64, f64) -> f64; 2] =
        [&|t, c| t.powf(-c), &|t, c| (-c * t / t_end).exp()];
    let mut best: Option<(f64, f64)> = None; // (sse, prediction)
    for fam in families {
        let sse = |c: f64| fit_linear(&pts, &|t| fam(t, c)).map_or(f64::INFINITY, |r| r.2);
        let grid: Vec<f64> = (0..=48)
            .map(|i| (0.01f64.ln() + i as f64 / 48.0 * (50.0f64 / 0.01).ln()).exp())
            .collect();
        let k = (0..grid.len()).min_by(|&a, &b| sse(grid[a]).total_cmp(&sse(grid[b])))?;
        let (mut lo, mut hi) = (grid[k.saturating_sub(1)], grid[(k + 1).min(grid.len() - 1)]);
        let phi = 0.618_033_988_749_895;
        for _ in 0..40 {
            let a = hi - phi * (hi - lo);
            let b = lo + phi * (hi - lo);
            if sse(a) < sse(b) {
                hi = b;
            } else {
                lo = a;
            }
        }
        let c = 0.5 * (lo + hi);
        if let Some((a, b, e)) = fit_linear(&pts, &|t| fam(t, c)) {
            let pred = a + b * fam(t_end, c);
            if pred.is_finite() && best.is_none_or(|(bs, _)| e < bs) {
                best = Some((e, pred));
            }
        }
    }
    best.map(|(_, p)| p)
}

#[cfg(test)]
mod tests {
    #[test]
    fn recovers_a_power_law_and_an_exponential() {
        let ms: Vec<(u64, f64)> = (1..=8u64)
            .map(|s| (s * 10, 0.15 + 6.0 / (s as f64).powf(0.7)))
            .collect();
        let p = super::predict_final(&ms, 1000).unwrap();
        let truth = 0.15 + 6.0 / 100f64.powf(0.7);
        assert!((p - truth).abs() < 1e-3, "{p} vs {truth}");
        let ms: Vec<(u64, f64)> = (0..8u64)
            .map(|s| (s * 50, 0.9 - 0.8 * (-(s as f64) / 3.0).exp()))
            .collect();
        let p = super::predict_final(&ms, 2000).unwrap();
        assert!((p - 0.9).abs() < 1e-3, "{p}");
    }

    use super::{predicted_final, should_stop, StoppingRule};
    use crate::space::Goal;
    use crate::Trial;

    fn trial(curve: &[(u64, f64)], value: Option<f64>) -> Trial {
        Trial { params: Default::default(), value, intermediate: curve.to_vec() }
    }

    /// Completed trials that reached 0.9 by step 100.
    fn done(n: usize) -> Vec<Trial> {
        (0..n).map(|i| trial(&[(10, 0.5), (50, 0.8), (100, 0.85 + 0.01 * i as f64)], Some(0.85 + 0.01 * i as f64))).collect()
    }

    fn convex() -> StoppingRule {
        StoppingRule::Convex { max_step: None, min_step: None, min_measurements: 3 }
    }

    #[test]
    fn convex_stops_a_curve_whose_straight_extension_stays_below_the_best() {
        // Accuracy creeping up by 0.005 per 10 steps from 0.4: extended to step 100 it
        // reaches 0.44, below the completed trials' 0.88.
        let slow = trial(&[(10, 0.4), (20, 0.405), (30, 0.41), (40, 0.415)], None);
        assert!(should_stop(&convex(), Goal::Maximize, &slow, &done(4)));
        let (step, value) = predicted_final(&convex(), Goal::Maximize, &slow, &done(4)).expect("a prediction");
        assert_eq!(step, 100, "the horizon learnt from the completed trials");
        assert!((0.415..=0.4 + 0.005 * 9.0 + 1e-9).contains(&value), "{value}");
        // The same curve when minimising a loss that falls slowly from 2.0 (best 0.5).
        let loss = trial(&[(10, 2.0), (20, 1.99), (30, 1.98)], None);
        let done_loss: Vec<Trial> = (0..4).map(|_| trial(&[(100, 0.5)], Some(0.5))).collect();
        assert!(should_stop(&convex(), Goal::Minimize, &loss, &done_loss));
    }

    #[test]
    fn convex_keeps_a_curve_that_may_still_win() {
        // Rising by 0.1 per 10 steps: a straight line reaches 0.9+ at step 100.
        let steep = trial(&[(10, 0.3), (20, 0.4), (30, 0.5)], None);
        assert!(!should_stop(&convex(), Goal::Maximize, &steep, &done(4)));
        assert_eq!(predicted_final(&convex(), Goal::Maximize, &steep, &done(4)), None);
    }

    #[test]
    fn convex_waits_for_enough_trials_measurements_and_steps() {
        let slow = trial(&[(10, 0.4), (20, 0.405), (30, 0.41)], None);
        // min_measurements + 1 = 4 completed trials are needed.
        assert!(!should_stop(&convex(), Goal::Maximize, &slow, &done(3)));
        assert!(should_stop(&convex(), Goal::Maximize, &slow, &done(4)));
        // Three measurements are needed.
        let short = trial(&[(10, 0.4), (20, 0.405)], None);
        assert!(!should_stop(&convex(), Goal::Maximize, &short, &done(4)));
        // No measurement beyond min_step.
        let early = StoppingRule::Convex { max_step: Some(100), min_step: Some(30), min_measurements: 3 };
        assert!(!should_stop(&early, Goal::Maximize, &slow, &done(4)));
        // At the horizon: nothing left to save.
        let ends = StoppingRule::Convex { max_step: Some(30), min_step: Some(0), min_measurements: 3 };
        assert!(!should_stop(&ends, Goal::Maximize, &slow, &done(4)));
    }

    #[test]
    fn convex_makes_no_estimate_from_a_flat_curve_and_none_from_a_worsening_one_above_the_best() {
        let flat = trial(&[(10, 0.2), (20, 0.2), (30, 0.2)], None);
        assert!(!should_stop(&convex(), Goal::Maximize, &flat, &done(4)));
        // Getting worse: estimated at its best so far (0.95), above the best completed.
        let falling = trial(&[(10, 0.95), (20, 0.9), (30, 0.85)], None);
        assert!(!should_stop(&convex(), Goal::Maximize, &falling, &done(4)));
        // Getting worse from below the best: stopped.
        let bad = trial(&[(10, 0.5), (20, 0.45), (30, 0.4)], None);
        assert!(should_stop(&convex(), Goal::Maximize, &bad, &done(4)));
    }
}

