//! Study algorithms for hyperparameter tuning, as pure functions.
//!
//! Everything here is deterministic: past trials, pending trials and a seed
//! go in, suggestions come out. There is no clock, no I/O, no threads and
//! no global random state; the same inputs always give the same outputs.
//!
//! * [`Space`] describes the parameters (DOUBLE, INTEGER, DISCRETE,
//!   CATEGORICAL, with scales and conditional children) and
//!   [`Space::validate`] checks it.
//! * [`suggest`] proposes new assignments with one of the [`Algorithm`]s:
//!   grid search, random search, or (the default) Bayesian optimisation with
//!   a Gaussian process.
//! * [`should_stop`] applies an early-stopping [`StoppingRule`] to a running
//!   trial.

#![allow(clippy::needless_range_loop, clippy::type_complexity)]

mod bo;
mod encode;
mod gp;
mod grid;
mod rng;
mod space;
mod stopping;

use std::collections::HashSet;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};

pub use bo::initial_design_size;
pub use rng::splitmix64;
pub use space::{
    Assignment, Conditional, Goal, ParamKind, ParamSpec, ParentValues, Scale, Space, Value,
};
pub use stopping::{predicted_final, should_stop, StoppingRule};

/// A study's search algorithm.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Algorithm {
    /// `ALGORITHM_UNSPECIFIED`: Bayesian optimisation with a Gaussian
    /// process (Matérn 5/2 ARD kernel, expected improvement).
    #[default]
    Unspecified,
    /// `GRID_SEARCH`: INTEGER, DISCRETE and CATEGORICAL parameters only.
    GridSearch,
    /// `RANDOM_SEARCH`: independent draws honouring each scale.
    RandomSearch,
}

/// A finished (or, for [`should_stop`], running) trial.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Trial {
    /// The assignment the trial ran with.
    pub params: Assignment,
    /// The final objective value; `None` marks an infeasible trial.
    pub value: Option<f64>,
    /// Intermediate measurements as `(step, value)`.
    pub intermediate: Vec<(u64, f64)>,
}

impl Trial {
    pub fn new(params: Assignment, value: Option<f64>) -> Self {
        Trial {
            params,
            value,
            intermediate: Vec::new(),
        }
    }
}

/// Why a suggestion could not be made.
#[derive(Clone, Debug, PartialEq)]
pub enum TunerError {
    /// The search space is invalid; `param` names the parameter.
    InvalidSpace { param: String, message: String },
    /// A completed trial's assignment does not fit the space.
    InvalidTrial { param: String, message: String },
    /// The algorithm cannot handle this space.
    Unsupported(String),
    /// Every point of a finite search space has been completed or is pending.
    Exhausted,
    /// The caller's stop flag was set (see [`suggest_until`]).
    Cancelled,
}

impl fmt::Display for TunerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TunerError::InvalidSpace { param, message } => {
                write!(f, "invalid parameter {param}: {message}")
            }
            TunerError::InvalidTrial { param, message } => {
                write!(
                    f,
                    "trial does not fit the search space at parameter {param}: {message}"
                )
            }
            TunerError::Unsupported(m) => f.write_str(m),
            TunerError::Exhausted => f.write_str("the search space is exhausted"),
            TunerError::Cancelled => f.write_str("the suggestion was cancelled"),
        }
    }
}

impl std::error::Error for TunerError {}

/// How noisy the trials' values are (the study spec's `observationNoise`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Noise {
    /// Unknown: the GP's noise variance is fitted freely (1e-6 to all of the variance).
    #[default]
    Unspecified,
    /// Deterministic trials: the noise variance stays at most 1e-4 of the variance, so
    /// the model interpolates the values.
    Low,
    /// Noisy trials: at least 1% of the variance is noise (10% expected), so the model
    /// smooths, and expected improvement is measured from the best posterior mean at the
    /// tried points rather than from the best (possibly lucky) value.
    High,
}

/// [`suggest_with`] for trials of unknown noise.
pub fn suggest(
    space: &Space,
    algorithm: Algorithm,
    goal: Goal,
    completed: &[Trial],
    pending: &[Assignment],
    count: usize,
    seed: u64,
) -> Result<Vec<Assignment>, TunerError> {
    suggest_with(space, algorithm, goal, completed, pending, count, seed, Noise::Unspecified)
}

/// Proposes up to `count` new assignments.
///
/// * `completed`: finished trials (their `value` is the final objective,
///   `None` when infeasible); `pending`: assignments handed out and not yet
///   finished. Neither is proposed again.
/// * `seed`: together with the numbers of completed and pending trials it
///   determines every random choice, so a study can pass one fixed seed on
///   every call and still get fresh suggestions as it progresses, and the
///   same call always returns the same answer.
///
/// Algorithms:
/// * [`Algorithm::GridSearch`]: the next unused grid points in a fixed order
///   (see the crate's grid module docs); fewer than `count` when the grid
///   runs out, [`TunerError::Exhausted`] when none is left; a DOUBLE
///   parameter is refused with `GRID_SEARCH does not support DOUBLE
///   parameter <id>`.
/// * [`Algorithm::RandomSearch`]: each active parameter drawn independently
///   — uniform for a linear scale, log-uniform for a log scale, and mirrored
///   log-uniform (dense near the top) for a reverse-log scale; integers drawn
///   that way over `[min − 0.5, max + 0.5]` and rounded; discrete and
///   categorical values drawn uniformly. Conditional children appear only
///   when active.
/// * [`Algorithm::Unspecified`]: Bayesian optimisation. The first
///   [`initial_design_size`] suggestions of a study (counting completed and
///   pending trials) come from a randomised Halton design, the very first
///   taking the parameters' defaults where given. After that a GP with a
///   Matérn 5/2 ARD kernel is fitted to the completed trials — inputs mapped
///   to `[0,1]` through each scale (categoricals one-hot, inactive
///   conditional parameters at a fixed value), infeasible trials given the
///   worst feasible value, outputs warped (the worse half by the normal
///   quantiles of their ranks, then a mild log warp near the best) and
///   standardised with the prior mean at the worst value seen, length
///   scales, signal variance and noise fitted by maximising the log marginal
///   likelihood (with weak log-normal priors) using L-BFGS from two starts
///   (beyond 64 trials on a subset of 64: the best quarter and a random
///   rest) — and the suggestion maximises log expected improvement,
///   searched over 1,000 random points and perturbations of the best trials,
///   refined by hill climbing; steps that leave the unit cube are reflected
///   back into it (not clamped), so a DOUBLE value is not proposed exactly
///   on a bound. When the best value has not improved significantly (by
///   more than 1e-3 of the gap between the best value and the median of the
///   initial design) for `k = max(5, parameters)` trials, every k-th trial
///   of that run is kept out of a ball around the best trial, so that a
///   search stuck creeping next to its incumbent moves on. Integer, discrete and categorical values are
///   snapped to their domain inside the search, so the acquisition is
///   evaluated at points that can actually be run. Pending trials, and
///   suggestions already made in the same batch, are added as fantasy
///   observations at the posterior mean (kriging believer), so a batch
///   spreads out. `noise` bounds the GP's noise variance (see [`Noise`]); the
///   other algorithms ignore it. Improvement is measured from the best value
///   seen, or, with [`Noise::High`] or whenever the fitted noise is at least
///   1% of the signal variance, from the best posterior mean at the tried
///   points.
#[allow(clippy::too_many_arguments)]
pub fn suggest_with(
    space: &Space,
    algorithm: Algorithm,
    goal: Goal,
    completed: &[Trial],
    pending: &[Assignment],
    count: usize,
    seed: u64,
    noise: Noise,
) -> Result<Vec<Assignment>, TunerError> {
    let never = AtomicBool::new(false);
    suggest_until(space, algorithm, goal, completed, pending, count, seed, noise, &never)
}

/// [`suggest_with`] that gives up with [`TunerError::Cancelled`] once `stop` is set: it
/// is looked at before the model is fitted and before each suggestion of a batch, so
/// that a deleted study's work ends within one fit.
#[allow(clippy::too_many_arguments)]
pub fn suggest_until(
    space: &Space,
    algorithm: Algorithm,
    goal: Goal,
    completed: &[Trial],
    pending: &[Assignment],
    count: usize,
    seed: u64,
    noise: Noise,
    stop: &AtomicBool,
) -> Result<Vec<Assignment>, TunerError> {
    if stop.load(Ordering::Relaxed) {
        return Err(TunerError::Cancelled);
    }
    space.validate()?;
    if count == 0 {
        return Ok(Vec::new());
    }
    if space.params.is_empty() {
        return Err(TunerError::Unsupported(
            "the search space has no parameters".to_string(),
        ));
    }
    let flat = space.flatten();
    let used = || -> HashSet<String> {
        completed
            .iter()
            .map(|t| space::canonical_key(&flat, &t.params))
            .chain(pending.iter().map(|a| space::canonical_key(&flat, a)))
            .collect()
    };
    match algorithm {
        Algorithm::GridSearch => grid::suggest(&space.params, &flat, &used(), count),
        Algorithm::RandomSearch => {
            let enc = encode::Encoder::new(flat.clone());
            let mut used = used();
            let mut r = rng::Rng::new(rng::mix(&[
                seed,
                completed.len() as u64,
                pending.len() as u64,
                0x5A,
            ]));
            let mut out = Vec::with_capacity(count);
            for _ in 0..count {
                let mut a = Assignment::new();
                // Redraw a repeat a few times (it only happens in small
                // finite spaces); give up on uniqueness after that.
                for _ in 0..32 {
                    let z: Vec<f64> = (0..enc.n_params()).map(|_| r.f64()).collect();
                    a = enc.decode(&z, &|_| None);
                    if !used.contains(&space::canonical_key(&flat, &a)) {
                        break;
                    }
                }
                used.insert(space::canonical_key(&flat, &a));
                out.push(a);
            }
            Ok(out)
        }
        Algorithm::Unspecified => {
            let enc = encode::Encoder::new(flat.clone());
            bo::suggest(&enc, goal, completed, pending, count, seed, noise, stop)
        }
    }
}

/// Number of points in the grid that [`Algorithm::GridSearch`] walks, or an
/// error if the space has a DOUBLE parameter (saturates at `u128::MAX`).
pub fn grid_size(space: &Space) -> Result<u128, TunerError> {
    space.validate()?;
    grid::check(&space.params)?;
    Ok(grid::size(&space.params))
}
