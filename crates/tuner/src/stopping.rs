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
}

impl StoppingRule {
    /// Median stopping with `min_completed = 3`.
    pub fn median() -> Self {
        StoppingRule::Median { min_completed: 3 }
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
            let horizon = done
                .iter()
                .flat_map(|t| t.intermediate.iter().map(|m| m.0))
                .max()
                .unwrap_or(own_last)
                .max(own_last);
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
    }
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
}
