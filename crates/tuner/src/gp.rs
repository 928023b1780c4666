//! Gaussian-process regression with a Matérn 5/2 ARD kernel, hyperparameters
//! fitted by maximising the log marginal likelihood plus weak log-normal
//! priors (a MAP estimate), with analytic gradients and a projected L-BFGS.

use crate::rng::Rng;
use crate::Noise;

const SQRT5: f64 = 2.236_067_977_499_79;
const LN_2PI: f64 = 1.837_877_066_409_345_5;

/// Log hyperparameters: `d` log length scales, log signal variance, log
/// noise variance (all on the standardised output scale).
#[derive(Clone, Debug)]
pub(crate) struct Hyper {
    pub theta: Vec<f64>,
}

impl Hyper {
    fn d(&self) -> usize {
        self.theta.len() - 2
    }
    pub(crate) fn sf2(&self) -> f64 {
        self.theta[self.d()].exp()
    }
    pub(crate) fn sn2(&self) -> f64 {
        self.theta[self.d() + 1].exp()
    }
    /// The length scale of feature `i`.
    pub(crate) fn length_scale(&self, i: usize) -> f64 {
        self.theta[i].exp()
    }
}

/// Bounds and prior of the log hyperparameters for `d` input dimensions.
struct Prior {
    lo: Vec<f64>,
    hi: Vec<f64>,
    mean: Vec<f64>,
    sd: Vec<f64>,
}

fn prior(d: usize, noise: Noise) -> Prior {
    let mut lo = vec![(0.01f64).ln(); d];
    let mut hi = vec![(20.0f64).ln(); d];
    // Length scales grow with the dimension (the typical distance between
    // points in [0,1]^d grows like sqrt(d)).
    let mut mean = vec![(0.5f64).ln() + 0.5 * (d as f64).ln(); d];
    let mut sd = vec![1.2; d];
    lo.push((0.02f64).ln());
    hi.push((50.0f64).ln());
    mean.push(0.0);
    sd.push(1.2);
    // The noise variance, as the study's observationNoise says: unknown (the
    // data decide, from 1e-6 to all of the variance), LOW (deterministic
    // trials: the model interpolates) or HIGH (at least 1% of the variance is
    // noise, 10% expected: the model smooths).
    let (nlo, nhi, nmean, nsd) = match noise {
        Noise::Unspecified => (1e-6, 1.0, 1e-3, 3.0),
        Noise::Low => (1e-8, 1e-4, 1e-6, 1.0),
        Noise::High => (1e-2, 1.0, 1e-1, 1.5),
    };
    lo.push(f64::ln(nlo));
    hi.push(f64::ln(nhi));
    mean.push(f64::ln(nmean));
    sd.push(nsd);
    Prior { lo, hi, mean, sd }
}

#[inline]
fn matern(r2: f64, sf2: f64) -> f64 {
    let r = r2.sqrt();
    sf2 * (1.0 + SQRT5 * r + (5.0 / 3.0) * r2) * (-SQRT5 * r).exp()
}

/// In-place Cholesky of the lower triangle of the row-major `n×n` matrix `a`.
/// Returns `false` when it is not positive definite.
fn cholesky(a: &mut [f64], n: usize) -> bool {
    for i in 0..n {
        for j in 0..=i {
            let (ri, rj) = (i * n, j * n);
            let s = a[ri + j] - dot(&a[ri..ri + j], &a[rj..rj + j]);
            if i == j {
                if s <= 0.0 || !s.is_finite() {
                    return false;
                }
                a[ri + i] = s.sqrt();
            } else {
                a[ri + j] = s / a[rj + j];
            }
        }
    }
    true
}

/// Solves `L v = b` in place (forward substitution).
fn solve_lower(l: &[f64], n: usize, b: &mut [f64]) {
    for i in 0..n {
        let row = &l[i * n..i * n + i];
        let mut s = b[i];
        for (k, lik) in row.iter().enumerate() {
            s -= lik * b[k];
        }
        b[i] = s / l[i * n + i];
    }
}

/// Solves `Lᵀ v = b` in place (back substitution).
fn solve_upper_t(l: &[f64], n: usize, b: &mut [f64]) {
    for i in (0..n).rev() {
        let bi = b[i] / l[i * n + i];
        b[i] = bi;
        let row = &l[i * n..i * n + i];
        for (k, lik) in row.iter().enumerate() {
            b[k] -= lik * bi;
        }
    }
}

/// Squared coordinate differences of all pairs `i > j`, `d` per pair.
pub(crate) struct PairDiffs {
    n: usize,
    d: usize,
    d2: Vec<f64>,
}

impl PairDiffs {
    pub(crate) fn new(x: &[Vec<f64>]) -> Self {
        let n = x.len();
        let d = x.first().map_or(0, |r| r.len());
        let mut d2 = Vec::with_capacity(n * n.saturating_sub(1) / 2 * d);
        for i in 0..n {
            for j in 0..i {
                for k in 0..d {
                    let t = x[i][k] - x[j][k];
                    d2.push(t * t);
                }
            }
        }
        PairDiffs { n, d, d2 }
    }
}

/// `L⁻¹` of a lower-triangular row-major `n×n` matrix, built row by row:
/// row i = (e_i − Σ_{k<i} L_ik row_k) / L_ii.
fn lower_inverse(l: &[f64], n: usize) -> Vec<f64> {
    let mut linv = vec![0.0; n * n];
    let mut row = vec![0.0; n];
    for i in 0..n {
        let lii = l[i * n + i];
        row[..=i].fill(0.0);
        row[i] = 1.0;
        for kk in 0..i {
            let c = l[i * n + kk];
            if c != 0.0 {
                let rk = &linv[kk * n..kk * n + kk + 1];
                for (t, v) in rk.iter().enumerate() {
                    row[t] -= c * v;
                }
            }
        }
        for (t, v) in row[..=i].iter().enumerate() {
            linv[i * n + t] = v / lii;
        }
    }
    linv
}

/// Negative log posterior (−LML − log prior) and, when asked, its gradient.
fn objective(
    p: &PairDiffs,
    y: &[f64],
    theta: &[f64],
    pr: &Prior,
    grad: bool,
) -> Option<(f64, Vec<f64>)> {
    let (n, d) = (p.n, p.d);
    let inv_l2: Vec<f64> = theta[..d].iter().map(|t| (-2.0 * t).exp()).collect();
    let sf2 = theta[d].exp();
    let sn2 = theta[d + 1].exp();
    let npairs = n * n.saturating_sub(1) / 2;
    let mut k = vec![0.0; n * n];
    let mut rs = vec![0.0; if grad { npairs } else { 0 }];
    let mut q = 0;
    for i in 0..n {
        for j in 0..i {
            let dd = &p.d2[q * d..q * d + d];
            let mut r2 = 0.0;
            for t in 0..d {
                r2 += dd[t] * inv_l2[t];
            }
            k[i * n + j] = matern(r2, sf2);
            if grad {
                rs[q] = r2.sqrt();
            }
            q += 1;
        }
        k[i * n + i] = sf2 + sn2 + 1e-9;
    }
    let kraw: Vec<f64> = if grad { k.clone() } else { Vec::new() };
    if !cholesky(&mut k, n) {
        return None;
    }
    let l = k;
    let mut alpha = y.to_vec();
    solve_lower(&l, n, &mut alpha);
    let mut nll = 0.5 * alpha.iter().map(|a| a * a).sum::<f64>();
    solve_upper_t(&l, n, &mut alpha);
    for i in 0..n {
        nll += l[i * n + i].ln();
    }
    nll += 0.5 * n as f64 * LN_2PI;
    for (i, t) in theta.iter().enumerate() {
        let z = (t - pr.mean[i]) / pr.sd[i];
        nll += 0.5 * z * z;
    }
    if !nll.is_finite() {
        return None;
    }
    if !grad {
        return Some((nll, Vec::new()));
    }
    // K⁻¹ = L⁻ᵀ L⁻¹, built from the rows of L⁻¹.
    let linv = lower_inverse(&l, n);
    let mut kinv = vec![0.0; n * n]; // lower triangle
    for kk in 0..n {
        let rk = &linv[kk * n..kk * n + kk + 1];
        for i in 0..=kk {
            let a = rk[i];
            if a == 0.0 {
                continue;
            }
            let dst = &mut kinv[i * n..i * n + i + 1];
            for (j, v) in dst.iter_mut().enumerate() {
                *v += a * rk[j];
            }
        }
    }
    let mut g = vec![0.0; d + 2];
    let mut q = 0;
    let mut g_sf = 0.0;
    let mut g_sn = 0.0;
    for i in 0..n {
        for j in 0..i {
            let w = alpha[i] * alpha[j] - kinv[i * n + j];
            let r = rs[q];
            // dK/dlog l_t = sf2 (5/3)(1+√5 r) e^{-√5 r} d_t² / l_t²
            let c = w * sf2 * (5.0 / 3.0) * (1.0 + SQRT5 * r) * (-SQRT5 * r).exp();
            let dd = &p.d2[q * d..q * d + d];
            for t in 0..d {
                g[t] += c * dd[t] * inv_l2[t];
            }
            g_sf += w * kraw[i * n + j];
            q += 1;
        }
        let w = alpha[i] * alpha[i] - kinv[i * n + i];
        g_sf += 0.5 * w * sf2;
        g_sn += 0.5 * w * sn2;
    }
    // ∂LML/∂θ = ½ tr(W ∂K/∂θ), with off-diagonal pairs counted twice.
    for v in g.iter_mut().take(d) {
        *v = -*v;
    }
    g[d] = -g_sf;
    g[d + 1] = -g_sn;
    for (i, t) in theta.iter().enumerate() {
        g[i] += (t - pr.mean[i]) / (pr.sd[i] * pr.sd[i]);
    }
    Some((nll, g))
}

/// Projected L-BFGS on a box. Returns the best point and its value.
fn lbfgs(
    f: &mut dyn FnMut(&[f64]) -> Option<(f64, Vec<f64>)>,
    x0: &[f64],
    lo: &[f64],
    hi: &[f64],
    max_iter: usize,
) -> Option<(Vec<f64>, f64)> {
    let m = 7;
    let dim = x0.len();
    let proj = |x: &mut Vec<f64>| {
        for i in 0..dim {
            x[i] = x[i].clamp(lo[i], hi[i]);
        }
    };
    let mut x = x0.to_vec();
    proj(&mut x);
    let (mut fx, mut g) = f(&x)?;
    let mut ss: Vec<Vec<f64>> = Vec::new();
    let mut ys: Vec<Vec<f64>> = Vec::new();
    for _ in 0..max_iter {
        // Free variables: not pushed against an active bound.
        let free: Vec<bool> = (0..dim)
            .map(|i| !((x[i] <= lo[i] && g[i] > 0.0) || (x[i] >= hi[i] && g[i] < 0.0)))
            .collect();
        let gf: Vec<f64> = (0..dim).map(|i| if free[i] { g[i] } else { 0.0 }).collect();
        let gnorm = gf.iter().map(|v| v * v).sum::<f64>().sqrt();
        if gnorm < 1e-6 {
            break;
        }
        // Two-loop recursion.
        let mut qv = gf.clone();
        let mut alphas = vec![0.0; ss.len()];
        for k in (0..ss.len()).rev() {
            let rho = 1.0 / dot(&ys[k], &ss[k]);
            alphas[k] = rho * dot(&ss[k], &qv);
            for i in 0..dim {
                qv[i] -= alphas[k] * ys[k][i];
            }
        }
        let gamma = if let (Some(s), Some(y)) = (ss.last(), ys.last()) {
            dot(s, y) / dot(y, y)
        } else {
            1.0 / gnorm.max(1.0)
        };
        for v in qv.iter_mut() {
            *v *= gamma;
        }
        for k in 0..ss.len() {
            let rho = 1.0 / dot(&ys[k], &ss[k]);
            let b = rho * dot(&ys[k], &qv);
            for i in 0..dim {
                qv[i] += ss[k][i] * (alphas[k] - b);
            }
        }
        let mut p: Vec<f64> = (0..dim)
            .map(|i| if free[i] { -qv[i] } else { 0.0 })
            .collect();
        if dot(&p, &gf) >= 0.0 {
            ss.clear();
            ys.clear();
            p = gf.iter().map(|v| -v / gnorm.max(1.0)).collect();
        }
        // Backtracking (Armijo) line search on the projected path.
        let mut t = 1.0;
        let mut accepted = None;
        for _ in 0..25 {
            let mut xn: Vec<f64> = (0..dim).map(|i| x[i] + t * p[i]).collect();
            proj(&mut xn);
            let dx: Vec<f64> = (0..dim).map(|i| xn[i] - x[i]).collect();
            if dx.iter().all(|v| v.abs() < 1e-12) {
                break;
            }
            if let Some((fn_, gn)) = f(&xn) {
                if fn_ <= fx + 1e-4 * dot(&g, &dx) {
                    accepted = Some((xn, fn_, gn, dx));
                    break;
                }
            }
            t *= 0.5;
        }
        let Some((xn, fn_, gn, dx)) = accepted else {
            break;
        };
        let dy: Vec<f64> = (0..dim).map(|i| gn[i] - g[i]).collect();
        if dot(&dx, &dy) > 1e-10 {
            ss.push(dx);
            ys.push(dy);
            if ss.len() > m {
                ss.remove(0);
                ys.remove(0);
            }
        }
        let improvement = fx - fn_;
        x = xn;
        fx = fn_;
        g = gn;
        if improvement < 1e-9 * (1.0 + fx.abs()) {
            break;
        }
    }
    Some((x, fx))
}

/// Dot product with four independent accumulators: the compiler may not
/// reorder a floating-point sum, so a single accumulator is one long chain
/// of dependent additions; four let the CPU (and SIMD) work in parallel.
pub(crate) fn dot(a: &[f64], b: &[f64]) -> f64 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0.0f64; 4];
    let ca = a.chunks_exact(4);
    let cb = b.chunks_exact(4);
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        acc[0] += x[0] * y[0];
        acc[1] += x[1] * y[1];
        acc[2] += x[2] * y[2];
        acc[3] += x[3] * y[3];
    }
    let mut s = (acc[0] + acc[1]) + (acc[2] + acc[3]);
    for (x, y) in ra.iter().zip(rb) {
        s += x * y;
    }
    s
}

/// Fits hyperparameters to standardised targets `y` at inputs `x` (in the
/// unit cube): L-BFGS from the prior mode and from the best of a few random
/// draws from the prior.
pub(crate) fn fit(x: &[Vec<f64>], y: &[f64], rng: &mut Rng, noise: Noise) -> Hyper {
    let d = x.first().map_or(0, |r| r.len());
    let pr = prior(d, noise);
    let pd = PairDiffs::new(x);
    let n = x.len();
    let mut f = |t: &[f64]| objective(&pd, y, t, &pr, true);
    let start0 = pr.mean.clone();
    // Random starts: score a few draws without gradients, keep the best.
    let mut best_rand: Option<(f64, Vec<f64>)> = None;
    for _ in 0..6 {
        let t: Vec<f64> = (0..d + 2)
            .map(|i| {
                (pr.mean[i] + pr.sd[i] * rng.normal() * if i == d + 1 { 0.5 } else { 1.0 })
                    .clamp(pr.lo[i], pr.hi[i])
            })
            .collect();
        if let Some((v, _)) = objective(&pd, y, &t, &pr, false) {
            if best_rand.as_ref().is_none_or(|(bv, _)| v < *bv) {
                best_rand = Some((v, t));
            }
        }
    }
    let iters = if n > 60 { 40 } else { 60 };
    let mut best: Option<(Vec<f64>, f64)> = None;
    let mut starts = vec![start0];
    if let Some((_, t)) = best_rand {
        starts.push(t);
    }
    for s in starts {
        if let Some((t, v)) = lbfgs(&mut f, &s, &pr.lo, &pr.hi, iters) {
            if best.as_ref().is_none_or(|(_, bv)| v < *bv) {
                best = Some((t, v));
            }
        }
    }
    let theta = match best {
        Some((t, _)) => t,
        None => {
            // Fall back to a heavily regularised setting.
            let mut t = pr.mean.clone();
            t[d + 1] = (1e-2f64).ln();
            t
        }
    };
    Hyper { theta }
}

/// A GP conditioned on data, with fixed hyperparameters.
pub(crate) struct Gp {
    x: Vec<f64>,
    n: usize,
    d: usize,
    inv_l2: Vec<f64>,
    sf2: f64,
    /// `L⁻¹` (row-major, lower triangle) of the Cholesky factor `L` of the
    /// kernel matrix: each prediction's variance is then row-by-row dot
    /// products instead of a triangular solve, whose every step waits for
    /// the one before.
    linv: Vec<f64>,
    alpha: Vec<f64>,
}

impl Gp {
    pub(crate) fn new(x: &[Vec<f64>], y: &[f64], h: &Hyper) -> Gp {
        let n = x.len();
        let d = h.d();
        let inv_l2: Vec<f64> = h.theta[..d].iter().map(|t| (-2.0 * t).exp()).collect();
        let sf2 = h.sf2();
        let mut jitter = 1e-9;
        loop {
            let mut k = vec![0.0; n * n];
            for i in 0..n {
                for j in 0..i {
                    let mut r2 = 0.0;
                    for t in 0..d {
                        let dd = x[i][t] - x[j][t];
                        r2 += dd * dd * inv_l2[t];
                    }
                    k[i * n + j] = matern(r2, sf2);
                }
                k[i * n + i] = sf2 + h.sn2() + jitter;
            }
            if cholesky(&mut k, n) {
                let mut alpha = y.to_vec();
                solve_lower(&k, n, &mut alpha);
                solve_upper_t(&k, n, &mut alpha);
                return Gp {
                    x: x.iter().flatten().copied().collect(),
                    n,
                    d,
                    inv_l2,
                    sf2,
                    linv: lower_inverse(&k, n),
                    alpha,
                };
            }
            jitter *= 10.0;
        }
    }

    /// Posterior mean and variance (of the latent function) at `xs`.
    pub(crate) fn predict(&self, xs: &[f64]) -> (f64, f64) {
        let (n, d) = (self.n, self.d);
        let mut kv = vec![0.0; n];
        for i in 0..n {
            let row = &self.x[i * d..i * d + d];
            let mut r2 = 0.0;
            for t in 0..d {
                let dd = xs[t] - row[t];
                r2 += dd * dd * self.inv_l2[t];
            }
            kv[i] = matern(r2, self.sf2);
        }
        let mean = dot(&kv, &self.alpha);
        let mut q = 0.0;
        for i in 0..n {
            let w = dot(&self.linv[i * n..i * n + i + 1], &kv[..i + 1]);
            q += w * w;
        }
        let var = (self.sf2 - q).max(1e-12);
        (mean, var)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gradient_matches_finite_differences() {
        let mut rng = Rng::new(3);
        let x: Vec<Vec<f64>> = (0..12)
            .map(|_| (0..3).map(|_| rng.f64()).collect())
            .collect();
        let y: Vec<f64> = x
            .iter()
            .map(|r| (3.0 * r[0]).sin() + r[1] * r[1] - 0.5)
            .collect();
        let pd = PairDiffs::new(&x);
        let pr = prior(3, Noise::Unspecified);
        let theta = vec![-0.7, -0.2, 0.3, 0.1, (1e-2f64).ln()];
        let (_, g) = objective(&pd, &y, &theta, &pr, true).unwrap();
        for i in 0..theta.len() {
            let h = 1e-5;
            let mut tp = theta.clone();
            tp[i] += h;
            let mut tm = theta.clone();
            tm[i] -= h;
            let fp = objective(&pd, &y, &tp, &pr, false).unwrap().0;
            let fm = objective(&pd, &y, &tm, &pr, false).unwrap().0;
            let fd = (fp - fm) / (2.0 * h);
            assert!(
                (fd - g[i]).abs() < 1e-4 * (1.0 + fd.abs()),
                "dim {i}: fd {fd} vs analytic {}",
                g[i]
            );
        }
    }

    #[test]
    fn gp_interpolates_smooth_function() {
        let mut rng = Rng::new(5);
        let x: Vec<Vec<f64>> = (0..25).map(|_| vec![rng.f64(), rng.f64()]).collect();
        let f = |r: &[f64]| (4.0 * r[0]).sin() + (3.0 * r[1]).cos();
        let y: Vec<f64> = x.iter().map(|r| f(r)).collect();
        let h = fit(&x, &y, &mut rng, Noise::Unspecified);
        let gp = Gp::new(&x, &y, &h);
        let (m, v) = gp.predict(&x[3]);
        assert!((m - y[3]).abs() < 1e-2 && v < 1e-2);
        let p = [0.37, 0.61];
        let (m, _) = gp.predict(&p);
        assert!((m - f(&p)).abs() < 0.1, "prediction {m} vs {}", f(&p));
    }

    /// observationNoise: LOW keeps the noise variance at most 1e-4 even on noisy data
    /// (the model interpolates), HIGH at least 1e-2 even on exact data (it smooths).
    #[test]
    fn observation_noise_bounds_the_fitted_noise() {
        let mut rng = Rng::new(9);
        let x: Vec<Vec<f64>> = (0..30).map(|_| vec![rng.f64(), rng.f64()]).collect();
        let f = |r: &[f64]| (4.0 * r[0]).sin() + (3.0 * r[1]).cos();
        let exact: Vec<f64> = x.iter().map(|r| f(r)).collect();
        let noisy: Vec<f64> = exact.iter().map(|v| v + 0.5 * rng.normal()).collect();
        let fitted = |y: &[f64], noise: Noise, rng: &mut Rng| fit(&x, y, rng, noise).sn2();
        let free_noisy = fitted(&noisy, Noise::Unspecified, &mut rng);
        assert!(free_noisy > 1e-2, "the data decide: {free_noisy}");
        assert!(fitted(&noisy, Noise::Low, &mut rng) <= 1e-4 * (1.0 + 1e-9));
        assert!(fitted(&exact, Noise::High, &mut rng) >= 1e-2 * (1.0 - 1e-9));
    }
}
