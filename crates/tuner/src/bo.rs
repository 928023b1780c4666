//! Bayesian optimisation: GP surrogate + log expected improvement, with a
//! quasi-random initial design and kriging-believer batches.

use std::collections::HashSet;

use crate::encode::Encoder;
use crate::gp::{self, Gp};
use crate::rng::{mix, Halton, Rng};
use crate::space::{canonical_key, Assignment, Goal, ParamKind};
use crate::{Trial, TunerError};

/// Size of the quasi-random initial design: `max(5, 2 × parameters)`,
/// counting conditional parameters.
pub fn initial_design_size(n_params: usize) -> usize {
    (2 * n_params).max(5)
}

/// Complementary error function (Numerical Recipes' Chebyshev fit,
/// fractional error below 1.2e-7 everywhere).
fn erfc(x: f64) -> f64 {
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let r = t
        * (-z * z - 1.265_512_23
            + t * (1.000_023_68
                + t * (0.374_091_96
                    + t * (0.096_784_18
                        + t * (-0.186_288_06
                            + t * (0.278_868_07
                                + t * (-1.135_203_98
                                    + t * (1.488_515_87
                                        + t * (-0.822_152_23 + t * 0.170_872_77)))))))))
            .exp();
    if x >= 0.0 {
        r
    } else {
        2.0 - r
    }
}

fn norm_cdf(z: f64) -> f64 {
    0.5 * erfc(-z / std::f64::consts::SQRT_2)
}

fn ln_norm_pdf(z: f64) -> f64 {
    -0.5 * z * z - 0.918_938_533_204_672_8
}

/// `ln(z Φ(z) + φ(z))`, stable for very negative `z`.
fn ln_h(z: f64) -> f64 {
    if z > -5.0 {
        let h = z * norm_cdf(z) + ln_norm_pdf(z).exp();
        h.max(1e-300).ln()
    } else {
        let z2 = z * z;
        ln_norm_pdf(z) - 2.0 * (-z).ln() + (1.0 - 3.0 / z2 + 15.0 / (z2 * z2)).ln()
    }
}

/// Log expected improvement over `best` of a maximised quantity.
fn log_ei(mean: f64, var: f64, best: f64) -> f64 {
    let s = var.sqrt();
    ln_h((mean - best) / s) + s.ln()
}

struct Acq<'a, 'e> {
    enc: &'a Encoder<'e>,
    gp: &'a Gp,
    best: f64,
}

impl Acq<'_, '_> {
    fn eval(&self, z: &[f64]) -> (f64, Assignment) {
        let a = self.enc.decode(z, &|_| None);
        let v = match self.enc.features(&a) {
            Ok(x) => {
                let (m, var) = self.gp.predict(&x);
                log_ei(m, var, self.best)
            }
            Err(_) => f64::NEG_INFINITY,
        };
        (v, a)
    }
}

pub(crate) fn suggest(
    enc: &Encoder<'_>,
    goal: Goal,
    completed: &[Trial],
    pending: &[Assignment],
    count: usize,
    seed: u64,
) -> Result<Vec<Assignment>, TunerError> {
    let p = enc.n_params();
    let n_init = initial_design_size(p);
    let mut used: HashSet<String> = completed
        .iter()
        .map(|t| canonical_key(&enc.flat, &t.params))
        .chain(pending.iter().map(|a| canonical_key(&enc.flat, a)))
        .collect();
    let halton = Halton::new(p, seed);
    let mut rng = Rng::new(mix(&[
        seed,
        completed.len() as u64,
        pending.len() as u64,
        0xB0,
    ]));

    // Observations: infeasible trials (no value, or a non-finite one) count
    // as the worst feasible value seen.
    let mut xs = Vec::with_capacity(completed.len());
    let mut raw: Vec<Option<f64>> = Vec::with_capacity(completed.len());
    for t in completed {
        xs.push(enc.features(&t.params)?);
        raw.push(t.value.filter(|v| v.is_finite()).map(|v| goal.to_max(v)));
    }
    let feasible: Vec<f64> = raw.iter().flatten().copied().collect();
    let mut out: Vec<Assignment> = Vec::with_capacity(count);
    let mut model: Option<(Vec<Vec<f64>>, Vec<f64>, gp::Hyper)> = None;

    for k in 0..count {
        let index = completed.len() + pending.len() + k;
        if index < n_init || feasible.len() < 2 {
            let a = design_point(enc, &halton, &mut rng, index, &used);
            used.insert(canonical_key(&enc.flat, &a));
            out.push(a);
            continue;
        }
        if model.is_none() {
            let worst = feasible.iter().copied().fold(f64::INFINITY, f64::min);
            let mut y: Vec<f64> = raw.iter().map(|v| v.unwrap_or(worst)).collect();
            standardise(&mut y);
            let h = gp::fit(&xs, &y, &mut rng);
            // Pending trials become fantasies at the posterior mean (kriging
            // believer); conditioning on the mean leaves the mean unchanged,
            // so all of them can be added at once.
            let gp0 = Gp::new(&xs, &y, &h);
            let mut fx = xs.clone();
            let mut fy = y.clone();
            for a in pending {
                if let Ok(x) = enc.features(a) {
                    fy.push(gp0.predict(&x).0);
                    fx.push(x);
                }
            }
            model = Some((fx, fy, h));
        }
        let (fx, fy, h) = model.as_mut().expect("model was just built");
        let gp = Gp::new(fx, fy, h);
        let best = fy.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        // Best observed points seed the local search.
        let mut order: Vec<usize> = (0..completed.len()).filter(|&i| raw[i].is_some()).collect();
        order.sort_by(|&a, &b| {
            raw[b]
                .partial_cmp(&raw[a])
                .unwrap_or(std::cmp::Ordering::Equal)
        });
        let incumbents: Vec<Vec<f64>> = order
            .iter()
            .take(3)
            .map(|&i| enc.coords(&completed[i].params, 0.5))
            .collect();
        let acq = Acq { enc, gp: &gp, best };
        let a = optimise_acquisition(&acq, &incumbents, &mut rng, &used)
            .unwrap_or_else(|| design_point(enc, &halton, &mut rng, index, &used));
        used.insert(canonical_key(&enc.flat, &a));
        if let Ok(x) = enc.features(&a) {
            let m = gp.predict(&x).0;
            fx.push(x);
            fy.push(m);
        }
        out.push(a);
    }
    Ok(out)
}

fn standardise(y: &mut [f64]) {
    let n = y.len() as f64;
    let mean = y.iter().sum::<f64>() / n;
    let var = y.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n;
    let sd = if var > 1e-300 { var.sqrt() } else { 1.0 };
    for v in y.iter_mut() {
        *v = (*v - mean) / sd;
    }
}

/// Point `index` of the randomised Halton design (the first point of a study
/// takes the parameters' defaults where given); a repeat of an earlier point
/// is replaced by a later design point or, failing that, a random one.
fn design_point(
    enc: &Encoder<'_>,
    halton: &Halton,
    rng: &mut Rng,
    index: usize,
    used: &HashSet<String>,
) -> Assignment {
    let p = enc.n_params();
    let defaults = |j: usize| {
        if index == 0 {
            enc.flat[j].spec.default.clone()
        } else {
            None
        }
    };
    let a = enc.decode(&halton.point(index as u64, p), &defaults);
    if !used.contains(&canonical_key(&enc.flat, &a)) {
        return a;
    }
    for t in 1..64u64 {
        let b = enc.decode(&halton.point(index as u64 + t * 7919, p), &|_| None);
        if !used.contains(&canonical_key(&enc.flat, &b)) {
            return b;
        }
    }
    let z: Vec<f64> = (0..p).map(|_| rng.f64()).collect();
    enc.decode(&z, &|_| None)
}

/// Maximises log EI over search coordinates: 1,000 uniform candidates plus
/// perturbations of the incumbents, then a stochastic hill climb (adaptive
/// Gaussian steps on a random subset of coordinates) from the five best
/// distinct candidates. Points already observed, pending, or chosen earlier in
/// the batch are skipped.
fn optimise_acquisition(
    acq: &Acq<'_, '_>,
    incumbents: &[Vec<f64>],
    rng: &mut Rng,
    used: &HashSet<String>,
) -> Option<Assignment> {
    let p = acq.enc.n_params();
    let mut cands: Vec<(f64, Vec<f64>, String)> = Vec::new();
    let push = |z: Vec<f64>, cands: &mut Vec<(f64, Vec<f64>, String)>| {
        let (v, a) = acq.eval(&z);
        let key = canonical_key(&acq.enc.flat, &a);
        if v.is_finite() && !used.contains(&key) {
            cands.push((v, z, key));
        }
    };
    for _ in 0..1000 {
        let z: Vec<f64> = (0..p).map(|_| rng.f64()).collect();
        push(z, &mut cands);
    }
    for inc in incumbents {
        for s in [0.2, 0.05, 0.01] {
            for _ in 0..15 {
                let z: Vec<f64> = inc
                    .iter()
                    .map(|v| (v + s * rng.normal()).clamp(0.0, 1.0))
                    .collect();
                push(z, &mut cands);
            }
        }
    }
    cands.sort_by(|a, b| b.0.partial_cmp(&a.0).unwrap_or(std::cmp::Ordering::Equal));
    let mut starts: Vec<(f64, Vec<f64>)> = Vec::new();
    let mut seen = HashSet::new();
    for (v, z, key) in &cands {
        if seen.insert(key.clone()) {
            starts.push((*v, z.clone()));
            if starts.len() == 5 {
                break;
            }
        }
    }
    let mut best: Option<(f64, Vec<f64>)> = None;
    for (v0, z0) in starts {
        let (v, z) = hill_climb(acq, z0, v0, rng, used);
        if best.as_ref().is_none_or(|(bv, _)| v > *bv) {
            best = Some((v, z));
        }
    }
    best.map(|(_, z)| acq.enc.decode(&z, &|_| None))
}

fn hill_climb(
    acq: &Acq<'_, '_>,
    mut z: Vec<f64>,
    mut v: f64,
    rng: &mut Rng,
    used: &HashSet<String>,
) -> (f64, Vec<f64>) {
    let p = z.len();
    let mut sigma = 0.05;
    let prob = (2.0 / p as f64).min(1.0);
    // Parameters whose coordinate is discrete-valued need steps of at
    // least one cell to move at all.
    let cell: Vec<f64> = acq
        .enc
        .flat
        .iter()
        .map(|fp| match &fp.spec.kind {
            ParamKind::Categorical { values } => 1.0 / values.len() as f64,
            ParamKind::Discrete { values, .. } => 1.0 / values.len() as f64,
            ParamKind::Integer { min, max, .. } => 1.0 / ((max - min + 1) as f64),
            ParamKind::Double { .. } => 0.0,
        })
        .collect();
    for _ in 0..300 {
        let mut zn = z.clone();
        let mut moved = false;
        for j in 0..p {
            if rng.f64() < prob {
                let step = sigma * rng.normal();
                let step = if cell[j] > 0.0 && step.abs() < cell[j] {
                    cell[j] * step.signum()
                } else {
                    step
                };
                zn[j] = (zn[j] + step).clamp(0.0, 1.0);
                moved = true;
            }
        }
        if !moved {
            let j = rng.below(p);
            zn[j] = (zn[j] + sigma.max(cell[j]) * rng.normal()).clamp(0.0, 1.0);
        }
        let (vn, a) = acq.eval(&zn);
        if vn > v && !used.contains(&canonical_key(&acq.enc.flat, &a)) {
            v = vn;
            z = zn;
            sigma = (sigma * 1.5).min(0.3);
        } else {
            sigma *= 0.85;
        }
        if sigma < 1e-6 {
            break;
        }
    }
    (v, z)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_ei_is_monotone_and_finite() {
        let mut prev = f64::NEG_INFINITY;
        for i in 0..200 {
            let m = -40.0 + i as f64 * 0.25;
            let v = log_ei(m, 1.0, 0.0);
            assert!(v.is_finite());
            assert!(v > prev - 1e-3, "m {m}: {v} < {prev}");
            prev = v;
        }
        // EI(0, 1, 0) = φ(0).
        assert!((log_ei(0.0, 1.0, 0.0) - (0.398_942_280_4f64).ln()).abs() < 1e-6);
    }
}
