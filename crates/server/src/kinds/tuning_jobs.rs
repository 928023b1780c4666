//! A HyperparameterTuningJob's study as a pure state machine: trials in, actions out.
//!
//! `step(study, config, event, now) -> (study, actions)`. Suggestions come from
//! `trainyard_tuner::suggest_with` (pure, seeded), so a study replayed from its stored
//! state makes the same decisions. They are computed off the driver's thread (a GP fit
//! may take a while): `step` asks with [`Action::Suggest`], carrying the tuner's whole
//! input, and the answer comes back as [`Event::Suggested`]. Each trial is a CustomJob run
//! under the lifecycle rules, which the driver creates and reports on (actions and events).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use trainyard_api::hptuning::{
    Algorithm as ApiAlgorithm, ConvexAutomatedStoppingSpec, GoalType, HyperparameterTuningJob, MeasurementSelectionType, ObservationNoise, ParameterSpec, ScaleType, StudySpec,
};
use serde_json::Value;
use trainyard_api::{ApiError, CustomJob, Timestamp};
use trainyard_core::Micros;
use trainyard_store::Store;
use trainyard_tuner as tuner;

use super::custom_jobs::job_name;
use super::kind::{checked, Create, Kind, Page, Reply, ResourceKind, View};
use super::waiting::WaitingView;

/// A parameter value as stored.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ParamValue {
    Int(i64),
    Double(f64),
    Str(String),
}

impl ParamValue {
    pub(crate) fn from_tuner(v: &tuner::Value) -> ParamValue {
        match v {
            tuner::Value::Int(i) => ParamValue::Int(*i),
            tuner::Value::Double(d) => ParamValue::Double(*d),
            tuner::Value::Str(s) => ParamValue::Str(s.clone()),
        }
    }
    pub(crate) fn to_tuner(&self) -> tuner::Value {
        match self {
            ParamValue::Int(i) => tuner::Value::Int(*i),
            ParamValue::Double(d) => tuner::Value::Double(*d),
            ParamValue::Str(s) => tuner::Value::Str(s.clone()),
        }
    }
    /// As the program sees it in `--ID=VALUE`.
    pub fn arg(&self) -> String {
        match self {
            ParamValue::Int(i) => i.to_string(),
            ParamValue::Double(d) => format!("{d}"),
            ParamValue::Str(s) => s.clone(),
        }
    }
    pub fn to_json(&self) -> serde_json::Value {
        match self {
            // An INTEGER parameter's value is an integer in JSON (`4`, not `4.0`).
            ParamValue::Int(i) => serde_json::json!(*i),
            // A double with no fraction prints without one, as the service prints doubles.
            ParamValue::Double(d) if d.fract() == 0.0 && d.abs() < 1e15 => serde_json::json!(*d as i64),
            ParamValue::Double(d) => serde_json::json!(d),
            ParamValue::Str(s) => serde_json::json!(s),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TrialState {
    Requested,
    Active,
    Stopping,
    Succeeded,
    Infeasible,
}

impl TrialState {
    pub fn is_terminal(self) -> bool {
        matches!(self, TrialState::Succeeded | TrialState::Infeasible)
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StudyTrial {
    /// "1", "2", ...
    pub id: String,
    pub params: Vec<(String, ParamValue)>,
    pub state: TrialState,
    /// The trial's CustomJob, once created.
    pub custom_job: Option<u64>,
    /// (step, value) of the study's metric, as reported so far.
    pub measurements: Vec<(i64, f64)>,
    pub final_measurement: Option<(i64, f64)>,
    pub start_time: Micros,
    pub end_time: Option<Micros>,
    pub infeasible_reason: String,
    /// The trial's job failed (counted against maxFailedTrialCount).
    pub failed: bool,
    /// (step, value) the convex stopping rule predicted for the end of a trial it
    /// stopped: added as the trial's last measurement when it ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub predicted_final: Option<(i64, f64)>,
    /// Stopped by the study's early-stopping rule (its CustomJob was cancelled for it).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stopped_early: bool,
    /// The study's other metrics (objectives after the first, safety metrics) in the final
    /// measurement: each one's value reported at the final measurement's step, or the
    /// last one before it, or its last one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub final_others: Vec<(String, f64)>,
    /// Milliseconds from the trial job's start to each measurement (aligned with
    /// `measurements`; `None` where the line had no `timestamp`), for early stopping with
    /// `useElapsedDuration`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub elapsed_ms: Vec<Option<u64>>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum StudyPhase {
    Pending,
    Running,
    Succeeded { end: Micros },
    Failed { end: Micros, code: i32, message: String },
    Cancelled { end: Micros },
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Study {
    pub id: u64,
    pub project: String,
    pub region: String,
    pub phase: StudyPhase,
    pub create_time: Micros,
    pub update_time: Micros,
    pub start_time: Option<Micros>,
    pub trials: Vec<StudyTrial>,
    pub seed: u64,
    /// A suggestion is being computed ([`Action::Suggest`]); not stored: a study read
    /// back asks again.
    #[serde(skip)]
    pub suggesting: bool,
}

impl Study {
    pub fn new(id: u64, project: String, region: String, now: Micros) -> Study {
        Study {
            id,
            project,
            region,
            phase: StudyPhase::Pending,
            create_time: now,
            update_time: now,
            start_time: None,
            trials: Vec::new(),
            seed: id.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x5EED,
            suggesting: false,
        }
    }

    pub fn is_terminal(&self) -> bool {
        matches!(self.phase, StudyPhase::Succeeded { .. } | StudyPhase::Failed { .. } | StudyPhase::Cancelled { .. })
    }

    pub fn state_name(&self) -> &'static str {
        match self.phase {
            StudyPhase::Pending => "JOB_STATE_PENDING",
            StudyPhase::Running => "JOB_STATE_RUNNING",
            StudyPhase::Succeeded { .. } => "JOB_STATE_SUCCEEDED",
            StudyPhase::Failed { .. } => "JOB_STATE_FAILED",
            StudyPhase::Cancelled { .. } => "JOB_STATE_CANCELLED",
        }
    }

    pub fn trial_mut(&mut self, id: &str) -> Option<&mut StudyTrial> {
        self.trials.iter_mut().find(|t| t.id == id)
    }
}

/// What the study's resource asks for, checked and translated for the tuner.
#[derive(Clone, Debug)]
pub struct StudyConfig {
    pub space: tuner::Space,
    pub algorithm: tuner::Algorithm,
    pub goal: tuner::Goal,
    pub metric_id: String,
    pub max_trials: usize,
    pub parallel: usize,
    pub max_failed: usize,
    pub best_measurement: bool,
    pub stopping: Option<tuner::StoppingRule>,
    /// `observationNoise`.
    pub noise: tuner::Noise,
    /// The study's other metrics, after the first objective (`metric_id`): more
    /// objectives (threshold `None`) and safety metrics (their `safetyThreshold`).
    pub others: Vec<(String, tuner::Goal, Option<f64>)>,
    /// Early stopping measures progress by elapsed time rather than by steps
    /// (`useElapsedDuration` of the stopping spec).
    pub use_elapsed: bool,
}

fn param(p: &ParameterSpec, path: &str) -> Result<tuner::ParamSpec, ApiError> {
    let scale = match p.scale_type {
        ScaleType::UnitLogScale => tuner::Scale::Log,
        ScaleType::UnitReverseLogScale => tuner::Scale::ReverseLog,
        _ => tuner::Scale::Linear,
    };
    let mut spec = if let Some(d) = &p.double_value_spec {
        let mut s = tuner::ParamSpec::double(&p.parameter_id, d.min_value, d.max_value, scale);
        if let Some(v) = d.default_value {
            s = s.with_default(tuner::Value::Double(v));
        }
        s
    } else if let Some(i) = &p.integer_value_spec {
        let mut s = tuner::ParamSpec::integer(&p.parameter_id, i.min_value, i.max_value, scale);
        if let Some(v) = i.default_value {
            s = s.with_default(tuner::Value::Int(v));
        }
        s
    } else if let Some(c) = &p.categorical_value_spec {
        let mut s = tuner::ParamSpec::categorical(&p.parameter_id, c.values.clone());
        if let Some(v) = &c.default_value {
            s = s.with_default(tuner::Value::Str(v.clone()));
        }
        s
    } else if let Some(d) = &p.discrete_value_spec {
        let mut s = tuner::ParamSpec::discrete(&p.parameter_id, d.values.clone(), scale);
        if let Some(v) = d.default_value {
            s = s.with_default(tuner::Value::Double(v));
        }
        s
    } else {
        return Err(ApiError::invalid_argument(format!("{path}: a parameter needs one of doubleValueSpec, integerValueSpec, categoricalValueSpec, discreteValueSpec.")));
    };
    for (i, c) in p.conditional_parameter_specs.iter().enumerate() {
        let cpath = format!("{path}.conditionalParameterSpecs[{i}]");
        let Some(child) = &c.parameter_spec else {
            return Err(ApiError::invalid_argument(format!("{cpath}.parameterSpec is required.")));
        };
        let parent = if let Some(v) = &c.parent_discrete_values {
            tuner::ParentValues::Discrete(v.values.clone())
        } else if let Some(v) = &c.parent_int_values {
            tuner::ParentValues::Int(v.values.clone())
        } else if let Some(v) = &c.parent_categorical_values {
            tuner::ParentValues::Categorical(v.values.clone())
        } else {
            return Err(ApiError::invalid_argument(format!("{cpath}: give the parent's values.")));
        };
        spec = spec.with_child(parent, param(child, &format!("{cpath}.parameterSpec"))?);
    }
    Ok(spec)
}

/// The label that turns a tuning job's multi-fidelity mode on; its one value is
/// [`SUCCESSIVE_HALVING`].
pub const MULTI_FIDELITY_LABEL: &str = "trainyard-multi-fidelity";
/// Asynchronous successive halving over the trials' reported steps (see
/// `tuner::StoppingRule::SuccessiveHalving`).
pub const SUCCESSIVE_HALVING: &str = "successive-halving";

/// The multi-fidelity mode of a tuning job labelled [`MULTI_FIDELITY_LABEL`]: successive
/// halving takes the place of the early-stopping rule. `convexAutomatedStoppingSpec`'s
/// `maxStepCount` and `minStepCount`, when given, set its horizon and first rung (else the
/// horizon is learnt from the completed trials); a median or decay-curve spec beside the
/// label is refused, as two rules for one decision.
fn multi_fidelity(job: &HyperparameterTuningJob) -> Result<Option<tuner::StoppingRule>, ApiError> {
    let Some(mode) = job.labels.get(MULTI_FIDELITY_LABEL) else { return Ok(None) };
    if mode != SUCCESSIVE_HALVING {
        return Err(ApiError::invalid_argument(format!(
            "labels.{MULTI_FIDELITY_LABEL}: unknown mode \"{mode}\"; the mode is \"{SUCCESSIVE_HALVING}\"."
        )));
    }
    let s = &job.study_spec;
    if s.median_automated_stopping_spec.is_some() || s.decay_curve_stopping_spec.is_some() {
        return Err(ApiError::invalid_argument(format!(
            "labels.{MULTI_FIDELITY_LABEL}: successive halving decides which trials stop; drop studySpec.medianAutomatedStoppingSpec and studySpec.decayCurveStoppingSpec, or the label."
        )));
    }
    let (max_step, min_step) = match s.convex_automated_stopping_spec.as_ref().map(convex_rule) {
        Some(tuner::StoppingRule::Convex { max_step, min_step, .. }) => (max_step, min_step),
        _ => (None, None),
    };
    Ok(Some(tuner::StoppingRule::SuccessiveHalving { max_step, min_step, eta: 3 }))
}

impl StudyConfig {
    pub fn from_job(job: &HyperparameterTuningJob) -> Result<StudyConfig, ApiError> {
        let max_trials = job.max_trial_count.max(1) as usize;
        let mut cfg = StudyConfig::from_spec(&job.study_spec, max_trials)?;
        if let Some(rule) = multi_fidelity(job)? {
            cfg.stopping = Some(rule);
        }
        cfg.parallel = (job.parallel_trial_count.max(1) as usize).min(max_trials);
        // 0: the service decides; here: half of the trials may fail.
        cfg.max_failed = if job.max_failed_trial_count > 0 { job.max_failed_trial_count as usize } else { max_trials.div_ceil(2) };
        Ok(cfg)
    }

    /// The study spec alone (a Vizier study has no trial counts: its clients ask for
    /// trials), with room for `max_trials` trials, one at a time.
    pub fn from_spec(s: &StudySpec, max_trials: usize) -> Result<StudyConfig, ApiError> {
        let params = s
            .parameters
            .iter()
            .enumerate()
            .map(|(i, p)| param(p, &format!("studySpec.parameters[{i}]")))
            .collect::<Result<Vec<_>, _>>()?;
        let space = tuner::Space::new(params);
        space.validate().map_err(|e| ApiError::invalid_argument(format!("studySpec.parameters: {e}")))?;
        let algorithm = match s.algorithm {
            ApiAlgorithm::GridSearch => tuner::Algorithm::GridSearch,
            ApiAlgorithm::RandomSearch => tuner::Algorithm::RandomSearch,
            _ => tuner::Algorithm::Unspecified,
        };
        if algorithm == tuner::Algorithm::GridSearch {
            tuner::grid_size(&space).map_err(|e| ApiError::invalid_argument(format!("studySpec.algorithm: {e}")))?;
        }
        if s.metrics.is_empty() {
            return Err(ApiError::invalid_argument("studySpec.metrics: at least one metric is required."));
        }
        let metric = primary_metric(s)
            .ok_or_else(|| ApiError::invalid_argument("studySpec.metrics: at least one metric must be an objective (without safetyConfig)."))?;
        let goal = goal_of(metric.goal);
        let others = s
            .metrics
            .iter()
            .filter(|m| m.metric_id != metric.metric_id)
            .map(|m| (m.metric_id.clone(), goal_of(m.goal), m.safety_config.as_ref().map(|c| c.safety_threshold)))
            .collect();
        let stopping = if s.median_automated_stopping_spec.is_some() {
            Some(tuner::StoppingRule::median())
        } else if s.decay_curve_stopping_spec.is_some() {
            Some(tuner::StoppingRule::decay_curve())
        } else {
            s.convex_automated_stopping_spec.as_ref().map(convex_rule)
        };
        Ok(StudyConfig {
            space,
            algorithm,
            goal,
            metric_id: metric.metric_id.clone(),
            max_trials,
            parallel: 1,
            max_failed: max_trials,
            best_measurement: s.measurement_selection_type == MeasurementSelectionType::BestMeasurement,
            stopping,
            noise: match s.observation_noise {
                ObservationNoise::Low => tuner::Noise::Low,
                ObservationNoise::High => tuner::Noise::High,
                _ => tuner::Noise::Unspecified,
            },
            others,
            use_elapsed: s.median_automated_stopping_spec.as_ref().is_some_and(|c| c.use_elapsed_duration)
                || s.decay_curve_stopping_spec.as_ref().is_some_and(|c| c.use_elapsed_duration)
                || s.convex_automated_stopping_spec.as_ref().is_some_and(|c| c.use_elapsed_duration),
        })
    }
}

/// The metric a study optimises first (and its early stopping follows): its first metric
/// without `safetyConfig`.
pub fn primary_metric(s: &StudySpec) -> Option<&trainyard_api::hptuning::MetricSpec> {
    s.metrics.iter().find(|m| m.safety_config.is_none())
}

pub(crate) fn goal_of(g: GoalType) -> tuner::Goal {
    if g == GoalType::Minimize {
        tuner::Goal::Minimize
    } else {
        tuner::Goal::Maximize
    }
}

/// Is a trial safe by the study's safety metrics: none of its final values worse than the
/// metric's threshold (a value it did not report is not held against it).
pub(crate) fn is_safe(safety: impl IntoIterator<Item = (tuner::Goal, f64, Option<f64>)>) -> bool {
    safety.into_iter().all(|(goal, threshold, value)| value.is_none_or(|v| !goal.better(threshold, v)))
}

/// One value per ended trial for the optimiser, and the goal for it, from each trial's
/// objective values (`None`: infeasible, unsafe, or an objective missing).
///
/// * One objective: its values, with its goal.
/// * Several (ParEGO, Knowles 2006): each objective scaled to [0, 1] over the trials
///   (1 the best), and the augmented Chebyshev scalarisation `min_i(w_i f_i) + 0.05 Σ
///   w_i f_i` maximised, with weights `w` drawn uniformly from the simplex by `seed` (a
///   study passes a seed that changes with every suggestion, so that successive trials
///   spread along the Pareto front).
pub(crate) fn scalarise(goals: &[tuner::Goal], values: &[Option<Vec<f64>>], seed: u64) -> (Vec<Option<f64>>, tuner::Goal) {
    if goals.len() < 2 {
        let goal = goals.first().copied().unwrap_or(tuner::Goal::Maximize);
        return (values.iter().map(|v| v.as_ref().and_then(|v| v.first().copied())).collect(), goal);
    }
    let k = goals.len();
    let (mut lo, mut hi) = (vec![f64::INFINITY; k], vec![f64::NEG_INFINITY; k]);
    for v in values.iter().flatten() {
        for i in 0..k {
            lo[i] = lo[i].min(v[i]);
            hi[i] = hi[i].max(v[i]);
        }
    }
    let weights = simplex_weights(k, seed);
    let scalar = |v: &Vec<f64>| {
        let weighted: Vec<f64> = (0..k)
            .map(|i| {
                let span = hi[i] - lo[i];
                let f = if span > 0.0 { (v[i] - lo[i]) / span } else { 0.5 };
                let f = if goals[i] == tuner::Goal::Minimize { 1.0 - f } else { f };
                f * weights[i]
            })
            .collect();
        weighted.iter().copied().fold(f64::INFINITY, f64::min) + 0.05 * weighted.iter().sum::<f64>()
    };
    (values.iter().map(|v| v.as_ref().map(scalar)).collect(), tuner::Goal::Maximize)
}

/// `k` weights drawn uniformly from the simplex (normalised exponentials), from `seed`.
fn simplex_weights(k: usize, seed: u64) -> Vec<f64> {
    let mut state = seed;
    let mut next = || ((tuner::splitmix64(&mut state) >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
    let e: Vec<f64> = (0..k).map(|_| -next().ln()).collect();
    let sum: f64 = e.iter().sum();
    e.iter().map(|x| x / sum).collect()
}

/// `convexAutomatedStoppingSpec` for the tuner. With `useElapsedDuration` the counts are
/// seconds and a learning curve's x axis is in milliseconds (see the Vizier engine's
/// `curve`); a count of 0 (proto3 cannot tell it from unset) takes the reference's
/// default: the horizon learnt from the completed trials, a tenth of it, 5 measurements.
fn convex_rule(c: &ConvexAutomatedStoppingSpec) -> tuner::StoppingRule {
    let unit: u64 = if c.use_elapsed_duration { 1000 } else { 1 };
    let count = |v: i64| (v > 0).then(|| (v as u64).saturating_mul(unit));
    tuner::StoppingRule::Convex {
        max_step: count(c.max_step_count),
        min_step: count(c.min_step_count),
        min_measurements: if c.min_measurement_count > 0 { c.min_measurement_count as usize } else { 5 },
    }
}

/// What happened to a study.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// Make progress: start the study, ask for trials while there is room.
    Advance,
    /// A trial's CustomJob started running.
    TrialRunning { trial: String },
    /// New measurements of a running trial (the whole list read from its metric file).
    /// `elapsed_ms`: see [`StudyTrial::elapsed_ms`].
    Measurements { trial: String, measurements: Vec<(i64, f64)>, elapsed_ms: Vec<Option<u64>> },
    /// A trial's CustomJob ended. `succeeded`: it ended SUCCEEDED (or was stopped by the
    /// study); `error`: its error message otherwise.
    /// `others`: what the trial reported of the study's other metrics, by metric.
    TrialEnded {
        trial: String,
        succeeded: bool,
        error: Option<String>,
        measurements: Vec<(i64, f64)>,
        elapsed_ms: Vec<Option<u64>>,
        others: Vec<(String, Vec<(i64, f64)>)>,
    },
    /// What the tuner suggested for an [`Action::Suggest`] (an error: its message).
    Suggested(Result<Vec<tuner::Assignment>, String>),
    Cancel,
}

/// A suggestion to compute: the tuner's whole input, so that it is computed off the
/// driver's thread (a GP fit may take a while) with the same result as in place.
#[derive(Clone, Debug, PartialEq)]
pub struct SuggestRequest {
    pub space: tuner::Space,
    pub algorithm: tuner::Algorithm,
    pub goal: tuner::Goal,
    pub completed: Vec<tuner::Trial>,
    pub pending: Vec<tuner::Assignment>,
    pub count: usize,
    pub seed: u64,
    pub noise: tuner::Noise,
}

impl SuggestRequest {
    /// The tuner's answer, as [`Event::Suggested`] carries it (a finite space that has
    /// run out answers with none).
    /// `stop`: set when the study is deleted or ended (the work stops at its next look).
    pub fn run(&self, stop: &std::sync::atomic::AtomicBool) -> Result<Vec<tuner::Assignment>, String> {
        match self.compute(stop) {
            Ok(v) => Ok(v),
            Err(tuner::TunerError::Exhausted) => Ok(Vec::new()),
            Err(e) => Err(e.to_string()),
        }
    }

    /// The tuner's own answer.
    pub fn compute(&self, stop: &std::sync::atomic::AtomicBool) -> Result<Vec<tuner::Assignment>, tuner::TunerError> {
        tuner::suggest_until(&self.space, self.algorithm, self.goal, &self.completed, &self.pending, self.count, self.seed, self.noise, stop)
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Compute a suggestion and answer with [`Event::Suggested`].
    Suggest(Box<SuggestRequest>),
    /// Create the trial's CustomJob (the trial is already stored as REQUESTED).
    CreateTrialJob { trial: String },
    /// Stop a trial's CustomJob (early stopping, or the study ended).
    StopTrialJob { custom_job: u64 },
    Log(String),
}

fn is_better(goal: tuner::Goal, a: f64, b: f64) -> bool {
    goal.better(a, b)
}

/// Apply one event to a study.
pub fn step(study: &Study, cfg: &StudyConfig, event: Event, now: Micros) -> Result<(Study, Vec<Action>), ApiError> {
    let mut s = study.clone();
    let mut actions = Vec::new();
    match event {
        Event::Cancel => {
            if s.is_terminal() {
                return Err(ApiError::failed_precondition(format!(
                    "The HyperparameterTuningJob is in state {} and cannot be cancelled.",
                    s.state_name()
                )));
            }
            for t in s.trials.iter_mut().filter(|t| !t.state.is_terminal()) {
                if let Some(j) = t.custom_job {
                    actions.push(Action::StopTrialJob { custom_job: j });
                }
                t.state = TrialState::Stopping;
            }
            s.phase = StudyPhase::Cancelled { end: now };
            actions.push(Action::Log("HyperparameterTuningJob cancelled.".into()));
        }
        Event::TrialRunning { trial } => {
            if let Some(t) = s.trial_mut(&trial) {
                if t.state == TrialState::Requested {
                    t.state = TrialState::Active;
                }
            }
            if matches!(s.phase, StudyPhase::Pending) {
                s.phase = StudyPhase::Running;
                s.start_time.get_or_insert(now);
            }
        }
        Event::Measurements { trial, measurements, elapsed_ms } => {
            let goal = cfg.goal;
            let completed = completed_trials(&s, cfg);
            let Some(t) = s.trial_mut(&trial) else { return Ok((s, actions)) };
            t.measurements = measurements;
            t.elapsed_ms = elapsed_ms;
            if let (Some(rule), TrialState::Active) = (&cfg.stopping, t.state) {
                let running = tuner::Trial { params: assignment(&t.params), value: None, intermediate: curve(t, cfg.use_elapsed) };
                if tuner::should_stop(rule, goal, &running, &completed) {
                    t.state = TrialState::Stopping;
                    t.stopped_early = true;
                    t.predicted_final = tuner::predicted_final(rule, goal, &running, &completed).map(|(x, v)| {
                        // By elapsed time, the prediction is for the trial's last step.
                        let last_step = t.measurements.last().map_or(0, |m| m.0);
                        (if cfg.use_elapsed { last_step } else { x as i64 }, v)
                    });
                    actions.push(Action::Log(format!("Trial {} stopped early: it is clearly worse than the trials so far.", t.id)));
                    if let Some(j) = t.custom_job {
                        actions.push(Action::StopTrialJob { custom_job: j });
                    }
                }
            }
        }
        Event::TrialEnded { trial, succeeded, error, measurements, elapsed_ms, others } => {
            let best = cfg.best_measurement;
            let goal = cfg.goal;
            if let Some(t) = s.trial_mut(&trial) {
                if !t.state.is_terminal() {
                    if !measurements.is_empty() {
                        t.measurements = measurements;
                        t.elapsed_ms = elapsed_ms;
                    }
                    // The convex rule's prediction for a trial it stopped is its last
                    // measurement (as the reference does), unless the trial got there.
                    let reached = |l: &(i64, f64), p: &(i64, f64)| if cfg.use_elapsed { false } else { l.0 >= p.0 };
                    if let Some(p) = t.predicted_final.filter(|p| t.measurements.last().is_none_or(|l| !reached(l, p))) {
                        t.measurements.push(p);
                        if !t.elapsed_ms.is_empty() {
                            t.elapsed_ms.push(None);
                        }
                    }
                    t.end_time = Some(now);
                    let stopped = t.state == TrialState::Stopping;
                    let last = t.measurements.last().copied();
                    let chosen = if best {
                        t.measurements.iter().copied().reduce(|a, b| if is_better(goal, b.1, a.1) { b } else { a })
                    } else {
                        last
                    };
                    if succeeded || stopped {
                        match chosen {
                            Some(m) => {
                                t.final_measurement = Some(m);
                                t.final_others = others
                                    .iter()
                                    .filter_map(|(id, series)| {
                                        let at = series.iter().rev().find(|(st, _)| *st <= m.0).or(series.last())?;
                                        Some((id.clone(), at.1))
                                    })
                                    .collect();
                                t.state = TrialState::Succeeded;
                            }
                            None => {
                                t.state = TrialState::Infeasible;
                                t.infeasible_reason = "The trial reported no value of the metric.".into();
                            }
                        }
                    } else {
                        t.state = TrialState::Infeasible;
                        t.failed = true;
                        t.infeasible_reason = error.unwrap_or_else(|| "The trial's job failed.".into());
                    }
                    actions.push(Action::Log(format!("Trial {} ended: {:?}.", t.id, t.state)));
                }
            }
        }
        Event::Advance => {}
        Event::Suggested(result) => {
            // The answer goes no further than its trials: the next event advances again
            // (a space that has run out is not asked again and again).
            s.suggesting = false;
            if !s.is_terminal() {
                match result {
                    Ok(suggestions) => add_trials(&mut s, cfg, suggestions, now, &mut actions),
                    Err(e) => actions.push(Action::Log(format!("The tuner failed ({e}); it is asked again at the next event."))),
                }
            }
            s.update_time = now;
            return Ok((s, actions));
        }
    }
    if !s.is_terminal() {
        advance(&mut s, cfg, now, &mut actions)?;
    }
    s.update_time = now;
    Ok((s, actions))
}

fn assignment(params: &[(String, ParamValue)]) -> tuner::Assignment {
    params.iter().map(|(k, v)| (k.clone(), v.to_tuner())).collect()
}

fn completed_trials(s: &Study, cfg: &StudyConfig) -> Vec<tuner::Trial> {
    s.trials
        .iter()
        .filter(|t| t.state.is_terminal())
        .map(|t| tuner::Trial { params: assignment(&t.params), value: t.final_measurement.map(|m| m.1), intermediate: curve(t, cfg.use_elapsed) })
        .collect()
}

/// A trial's measurements as a learning curve: by step, or by the milliseconds since its
/// job started (measurements without a time are left out).
fn curve(t: &StudyTrial, use_elapsed: bool) -> Vec<(u64, f64)> {
    if use_elapsed {
        t.measurements.iter().zip(&t.elapsed_ms).filter_map(|((_, v), ms)| Some(((*ms)?, *v))).collect()
    } else {
        t.measurements.iter().map(|(st, v)| ((*st).max(0) as u64, *v)).collect()
    }
}

/// The ended trials for a suggestion: each with the one value the optimiser sees (see
/// [`scalarise`]; an unsafe trial is infeasible), and the goal for that value.
fn suggest_trials(s: &Study, cfg: &StudyConfig) -> (Vec<tuner::Trial>, tuner::Goal) {
    let mut completed = completed_trials(s, cfg);
    let objectives: Vec<&(String, tuner::Goal, Option<f64>)> = cfg.others.iter().filter(|o| o.2.is_none()).collect();
    if cfg.others.is_empty() {
        return (completed, cfg.goal);
    }
    let mut goals = vec![cfg.goal];
    goals.extend(objectives.iter().map(|o| o.1));
    let values: Vec<Option<Vec<f64>>> = s
        .trials
        .iter()
        .filter(|t| t.state.is_terminal())
        .map(|t| {
            let first = t.final_measurement.filter(|_| t.state == TrialState::Succeeded)?.1;
            let other = |id: &str| t.final_others.iter().find(|(o, _)| o == id).map(|o| o.1);
            let safety = cfg.others.iter().filter_map(|(id, goal, th)| th.map(|th| (*goal, th, other(id))));
            if !is_safe(safety) {
                return None;
            }
            std::iter::once(Some(first)).chain(objectives.iter().map(|o| other(&o.0))).collect()
        })
        .collect();
    let seed = s.seed ^ (s.trials.len() as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let (scalar, goal) = scalarise(&goals, &values, seed);
    for (c, v) in completed.iter_mut().zip(scalar) {
        c.value = v;
    }
    (completed, goal)
}

/// Ask for trials while there is room; end the study when it is done.
fn advance(s: &mut Study, cfg: &StudyConfig, now: Micros, actions: &mut Vec<Action>) -> Result<(), ApiError> {
    let failed = s.trials.iter().filter(|t| t.failed).count();
    let active: Vec<&StudyTrial> = s.trials.iter().filter(|t| !t.state.is_terminal()).collect();
    if failed > cfg.max_failed {
        for t in &active {
            if let Some(j) = t.custom_job {
                actions.push(Action::StopTrialJob { custom_job: j });
            }
        }
        let message = format!("{failed} trials failed, more than maxFailedTrialCount ({}).", cfg.max_failed);
        actions.push(Action::Log(format!("HyperparameterTuningJob failed: {message}")));
        s.phase = StudyPhase::Failed { end: now, code: 9, message };
        return Ok(());
    }
    let ended = s.trials.iter().filter(|t| t.state.is_terminal()).count();
    if ended >= cfg.max_trials {
        finish(s, now, actions);
        return Ok(());
    }
    let room = cfg.parallel.saturating_sub(active.len()).min(cfg.max_trials - s.trials.len());
    if room == 0 || s.suggesting {
        return Ok(());
    }
    let (completed, goal) = suggest_trials(s, cfg);
    let pending: Vec<tuner::Assignment> = active.iter().map(|t| assignment(&t.params)).collect();
    actions.push(Action::Suggest(Box::new(SuggestRequest {
        space: cfg.space.clone(),
        algorithm: cfg.algorithm,
        goal,
        completed,
        pending,
        count: room,
        seed: s.seed,
        noise: cfg.noise,
    })));
    s.suggesting = true;
    Ok(())
}

/// The tuner's suggestions as trials (REQUESTED, their jobs to create), as many as there
/// is room for now; none while no trial is active: the space has run out.
fn add_trials(s: &mut Study, cfg: &StudyConfig, suggestions: Vec<tuner::Assignment>, now: Micros, actions: &mut Vec<Action>) {
    let active = s.trials.iter().filter(|t| !t.state.is_terminal()).count();
    if suggestions.is_empty() && active == 0 {
        // A finite grid ran out before maxTrialCount.
        actions.push(Action::Log("Every point of the search space has been tried.".into()));
        finish(s, now, actions);
        return;
    }
    let room = cfg.parallel.saturating_sub(active).min(cfg.max_trials.saturating_sub(s.trials.len()));
    for a in suggestions.into_iter().take(room) {
        let id = (s.trials.len() + 1).to_string();
        let params: Vec<(String, ParamValue)> = a.iter().map(|(k, v)| (k.clone(), ParamValue::from_tuner(v))).collect();
        actions.push(Action::Log(format!(
            "Trial {id} requested: {}.",
            params.iter().map(|(k, v)| format!("{k}={}", v.arg())).collect::<Vec<_>>().join(", ")
        )));
        actions.push(Action::CreateTrialJob { trial: id.clone() });
        s.trials.push(StudyTrial {
            id,
            params,
            state: TrialState::Requested,
            custom_job: None,
            measurements: Vec::new(),
            final_measurement: None,
            start_time: now,
            end_time: None,
            infeasible_reason: String::new(),
            stopped_early: false,
            failed: false,
            predicted_final: None,
            final_others: Vec::new(),
            elapsed_ms: Vec::new(),
        });
    }
}

/// The study's end when no more trials are to run: SUCCEEDED if one trial succeeded.
fn finish(s: &mut Study, now: Micros, actions: &mut Vec<Action>) {
    if s.trials.iter().any(|t| t.state == TrialState::Succeeded) {
        s.phase = StudyPhase::Succeeded { end: now };
        actions.push(Action::Log("HyperparameterTuningJob completed successfully.".into()));
    } else {
        let message = "No trial succeeded: every trial was infeasible or failed.".to_string();
        actions.push(Action::Log(format!("HyperparameterTuningJob failed: {message}")));
        s.phase = StudyPhase::Failed { end: now, code: 9, message };
    }
}

/// What [`read_metric_file`] read.
#[derive(Debug, Default)]
pub struct MetricFile {
    /// (step, value) of each metric asked for, in order.
    pub series: Vec<Vec<(i64, f64)>>,
    /// Each value's `timestamp` (seconds since the epoch), aligned with `series`.
    pub times: Vec<Vec<Option<f64>>>,
    /// Malformed lines: (line number, why).
    pub bad: Vec<(usize, String)>,
}

/// Read a cloudml-hypertune metric file: JSON lines of string values, one metric per line,
/// e.g. `{"global_step": "1000", "accuracy": "0.98", "timestamp": 1525851440.1, "trial": "0"}`.
/// Gives (step, value) of each of `ids`, in their order (the library's default tag
/// `training/hptuning/metric` counts as the first), and the malformed lines, to log: a
/// line that is not JSON or has none of them.
pub fn read_metric_file(text: &str, ids: &[&str]) -> MetricFile {
    const DEFAULT_TAG: &str = "training/hptuning/metric";
    let mut out: Vec<Vec<(i64, f64)>> = vec![Vec::new(); ids.len()];
    let mut times: Vec<Vec<Option<f64>>> = vec![Vec::new(); ids.len()];
    let mut bad = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let v: serde_json::Value = match serde_json::from_str(line) {
            Ok(v) => v,
            Err(e) => {
                bad.push((i + 1, format!("not JSON: {e}")));
                continue;
            }
        };
        let num = |x: &serde_json::Value| x.as_f64().or_else(|| x.as_str().and_then(|s| s.trim().parse::<f64>().ok()));
        let mut found = false;
        for (k, id) in ids.iter().enumerate() {
            let raw = v.get(*id).or_else(|| if k == 0 { v.get(DEFAULT_TAG) } else { None });
            let Some(value) = raw.and_then(num).filter(|x| x.is_finite()) else { continue };
            let step = v.get("global_step").and_then(num).map(|s| s as i64).unwrap_or(out[k].len() as i64 + 1);
            out[k].push((step, value));
            times[k].push(v.get("timestamp").and_then(num).filter(|t| t.is_finite()));
            found = true;
        }
        if !found {
            let names: Vec<String> = ids.iter().map(|id| format!("\"{id}\"")).collect();
            bad.push((i + 1, format!("no numeric value for metric {}", names.join(" or "))));
        }
    }
    MetricFile { series: out, times, bad }
}

/// The trials as the API shows them.
pub fn render_trials(s: &Study, metric_id: &str, job_name: impl Fn(u64) -> String) -> Vec<serde_json::Value> {
    let metric = |id: &str, v: f64| serde_json::json!({"metricId": id, "value": v});
    let ts = |t: Micros| trainyard_api::Timestamp::from_micros(t).to_rfc3339();
    s.trials
        .iter()
        .map(|t| {
            let state = match t.state {
                TrialState::Requested => "REQUESTED",
                TrialState::Active => "ACTIVE",
                TrialState::Stopping => "STOPPING",
                TrialState::Succeeded => "SUCCEEDED",
                TrialState::Infeasible => "INFEASIBLE",
            };
            let measurement = |(step, v): (i64, f64)| serde_json::json!({"stepCount": step.to_string(), "metrics": [metric(metric_id, v)]});
            let mut o = serde_json::json!({
                "id": t.id,
                "state": state,
                "parameters": t.params.iter().map(|(k, v)| serde_json::json!({"parameterId": k, "value": v.to_json()})).collect::<Vec<_>>(),
                "startTime": ts(t.start_time),
            });
            if !t.measurements.is_empty() {
                o["measurements"] = serde_json::Value::Array(t.measurements.iter().map(|m| measurement(*m)).collect());
            }
            if let Some(m) = t.final_measurement {
                let mut f = measurement(m);
                if let Some(metrics) = f["metrics"].as_array_mut() {
                    metrics.extend(t.final_others.iter().map(|(id, v)| metric(id, *v)));
                }
                o["finalMeasurement"] = f;
            }
            if let Some(e) = t.end_time {
                o["endTime"] = serde_json::json!(ts(e));
            }
            if !t.infeasible_reason.is_empty() {
                o["infeasibleReason"] = serde_json::json!(t.infeasible_reason);
            }
            // A Trainyard extension: the trial ended by early stopping (its CustomJob shows
            // CANCELLED for it).
            if t.stopped_early {
                o["trainyardStoppedEarly"] = serde_json::json!(true);
            }
            if let Some(j) = t.custom_job {
                o["customJob"] = serde_json::json!(job_name(j));
            }
            o
        })
        .collect()
}

/// The labels a tuning job's trial CustomJobs get besides the tuning job's own: which
/// tuning job they belong to (`trainyard_study`), so that lists can leave them out.
pub fn trial_labels(study: u64) -> BTreeMap<String, String> {
    [("trainyard_study".to_string(), study.to_string())].into()
}

// ---------------------------------------------------------------------------------------
// The resource: names, rendering, the trials' CustomJobs, and its kind.

/// Its key in the store.
pub const KIND_STUDY: &str = "hptuning";

pub fn study_name(project: &str, region: &str, id: u64) -> String {
    format!("projects/{project}/locations/{region}/hyperparameterTuningJobs/{id}")
}

/// A trial's CustomJob: the trial job spec with `--ID=VALUE` appended to every replica's
/// args, and its own output directory `<base>/<trialId>/`.
pub fn trial_resource(hp: &HyperparameterTuningJob, trial: &str, params: &[(String, ParamValue)]) -> CustomJob {
    let mut spec = hp.trial_job_spec.clone();
    let args: Vec<String> = params.iter().map(|(k, v)| format!("--{k}={}", v.arg())).collect();
    for pool in &mut spec.worker_pool_specs {
        if let Some(c) = &mut pool.container_spec {
            c.args.extend(args.iter().cloned());
        }
        if let Some(p) = &mut pool.python_package_spec {
            p.args.extend(args.iter().cloned());
        }
    }
    if let Some(out) = &mut spec.base_output_directory {
        out.output_uri_prefix = format!("{}/{trial}", out.output_uri_prefix.trim_end_matches('/'));
    }
    let mut name = format!("{}-trial-{trial}", hp.display_name);
    name.truncate(128);
    CustomJob {
        display_name: name,
        job_spec: spec,
        labels: hp.labels.clone(),
        trainyard_host_directories: hp.trainyard_host_directories.clone(),
        ..CustomJob::default()
    }
}

/// The HyperparameterTuningJob as the API shows it (with or without its trials).
pub fn render_study(resource: &HyperparameterTuningJob, st: &Study, with_trials: bool) -> serde_json::Value {
    let mut v = serde_json::to_value(resource).unwrap_or_else(|_| serde_json::json!({}));
    let ts = |t: Micros| serde_json::Value::String(Timestamp::from_micros(t).to_rfc3339());
    v["name"] = serde_json::Value::String(study_name(&st.project, &st.region, st.id));
    v["state"] = serde_json::Value::String(st.state_name().to_string());
    v["createTime"] = ts(st.create_time);
    v["updateTime"] = ts(st.update_time);
    if let Some(t) = st.start_time {
        v["startTime"] = ts(t);
    }
    match &st.phase {
        StudyPhase::Succeeded { end } => v["endTime"] = ts(*end),
        StudyPhase::Failed { end, code, message } => {
            v["endTime"] = ts(*end);
            v["error"] = serde_json::json!({"code": code, "message": message});
        }
        StudyPhase::Cancelled { end } => {
            v["endTime"] = ts(*end);
            v["error"] = serde_json::json!({"code": 1, "message": "CANCELED"});
        }
        _ => {}
    }
    if with_trials && !st.trials.is_empty() {
        let metric = primary_metric(&resource.study_spec).map(|m| m.metric_id.clone()).unwrap_or_default();
        let trials = render_trials(st, &metric, |j| job_name(&st.project, &st.region, j));
        v["trials"] = serde_json::Value::Array(trials);
    } else if let Some(o) = v.as_object_mut() {
        o.remove("trials");
    }
    v
}

/// `HyperparameterTuningJob`: rows read as text (`get_other`/`list_other`: the resource
/// and the study's state) and decoded here; a GET shows the trials, a list does not.
pub enum TuningJobs {}

/// A stored HyperparameterTuningJob: its resource and study, or what is wrong with its
/// record.
pub struct TuningJobRow {
    id: u64,
    project: String,
    region: String,
    record: Result<(HyperparameterTuningJob, Study), String>,
}

impl TuningJobRow {
    pub(super) fn new(project: &str, region: &str, (id, resource, core): (u64, String, String)) -> TuningJobRow {
        TuningJobRow { id, project: project.to_string(), region: region.to_string(), record: Self::read(id, &resource, &core) }
    }

    fn read(id: u64, resource: &str, core: &str) -> Result<(HyperparameterTuningJob, Study), String> {
        let resource = serde_json::from_str(resource).map_err(|e| format!("record of job {id}: its resource: {e}"))?;
        let study = serde_json::from_str(core).map_err(|e| format!("record of job {id}: {e}"))?;
        Ok((resource, study))
    }
}

impl ResourceKind for TuningJobs {
    const COLLECTION: &'static str = "hyperparameterTuningJobs";
    const STORE_KIND: &'static str = KIND_STUDY;
    const KIND: Kind = Kind::TuningJob;
    const API_NAME: &'static str = "HyperparameterTuningJob";
    type New = HyperparameterTuningJob;
    type Created = Value;
    type Row = TuningJobRow;

    fn parse(body: &[u8]) -> Result<HyperparameterTuningJob, ApiError> {
        checked(body, trainyard_api::parse_hyperparameter_tuning_job, trainyard_api::validate_hyperparameter_tuning_job)
    }

    fn create(resource: Self::New, reply: Reply<Self::Created>) -> Create {
        Create::TuningJob { resource: Box::new(resource), reply }
    }

    fn on_disk(resource: &HyperparameterTuningJob) -> crate::jobspec::OnDisk {
        crate::jobspec::OnDisk::of(&resource.trial_job_spec, "trialJobSpec", &resource.trainyard_host_directories)
    }

    fn stored_place(row: &TuningJobRow) -> Option<(String, String)> {
        row.record.as_ref().ok().and_then(|(r, _)| super::kind::place_of(&r.name))
    }

    fn read(store: &Store, project: &str, region: &str, id: u64) -> trainyard_store::Result<Option<TuningJobRow>> {
        Ok(store.get_other(KIND_STUDY, project, region, id)?.map(|row| TuningJobRow::new(project, region, row)))
    }

    fn read_page(store: &Store, project: &str, region: &str, page: &Page<'_>) -> trainyard_store::Result<Vec<TuningJobRow>> {
        let rows = store.list_other(KIND_STUDY, project, region, page.filter, page.before, page.limit)?;
        Ok(rows.into_iter().map(|row| TuningJobRow::new(project, region, row)).collect())
    }

    fn id(row: &TuningJobRow) -> u64 {
        row.id
    }

    fn live_state(row: &TuningJobRow) -> Option<&'static str> {
        match &row.record {
            Ok((_, study)) if !study.is_terminal() => Some(study.state_name()),
            _ => None,
        }
    }

    fn render(row: &TuningJobRow, _waiting: &WaitingView, view: View) -> Result<Value, ApiError> {
        Ok(match &row.record {
            Ok((resource, study)) => render_study(resource, study, view == View::Get),
            Err(damage) => serde_json::json!({
                "name": Self::name(&row.project, &row.region, row.id),
                "state": "JOB_STATE_FAILED",
                "error": {"code": 13, "message": format!("Internal error: the stored record of this job is damaged and cannot be read ({damage}).")},
            }),
        })
    }
}

/// [`step`] with its suggestions computed in place, answered at once (tests, replays).
#[cfg(test)]
pub(crate) fn step_now(study: &Study, cfg: &StudyConfig, event: Event, now: Micros) -> Result<(Study, Vec<Action>), ApiError> {
    let (mut s, actions) = step(study, cfg, event, now)?;
    let mut out = Vec::new();
    for a in actions {
        match a {
            Action::Suggest(request) => {
                let (next, more) = step(&s, cfg, Event::Suggested(request.run(&Default::default())), now)?;
                s = next;
                out.extend(more);
            }
            a => out.push(a),
        }
    }
    Ok((s, out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(max: usize, parallel: usize, max_failed: usize) -> StudyConfig {
        StudyConfig {
            space: tuner::Space::new(vec![tuner::ParamSpec::double("lr", 0.001, 0.1, tuner::Scale::Log)]),
            algorithm: tuner::Algorithm::RandomSearch,
            goal: tuner::Goal::Maximize,
            metric_id: "accuracy".into(),
            max_trials: max,
            parallel,
            max_failed,
            best_measurement: false,
            stopping: None,
            noise: tuner::Noise::Unspecified,
            others: Vec::new(),
            use_elapsed: false,
        }
    }

    fn ended(s: &Study, c: &StudyConfig, trial: &str, ok: bool, m: &[(i64, f64)], now: Micros) -> (Study, Vec<Action>) {
        let ev = Event::TrialEnded {
            trial: trial.into(),
            succeeded: ok,
            error: (!ok).then(|| "boom".into()),
            measurements: m.to_vec(),
            elapsed_ms: Vec::new(),
            others: Vec::new(),
        };
        step_now(s, c, ev, now).unwrap()
    }

    #[test]
    fn runs_at_most_parallel_trials_and_ends_after_max() {
        let c = cfg(3, 2, 3);
        let (s, a) = step_now(&Study::new(1, "p".into(), "r".into(), 0), &c, Event::Advance, 1).unwrap();
        assert_eq!(s.trials.len(), 2);
        assert_eq!(a.iter().filter(|x| matches!(x, Action::CreateTrialJob { .. })).count(), 2);
        let (s, a) = ended(&s, &c, "1", true, &[(1, 0.5), (2, 0.7)], 2);
        assert_eq!(s.trials[0].final_measurement, Some((2, 0.7)));
        assert_eq!(s.trials.len(), 3, "a third trial once one ended");
        assert!(a.iter().any(|x| matches!(x, Action::CreateTrialJob { trial } if trial == "3")));
        let (s, _) = ended(&s, &c, "2", true, &[], 3);
        assert_eq!(s.trials[1].state, TrialState::Infeasible, "no metric: infeasible");
        assert!(!s.is_terminal());
        let (s, _) = ended(&s, &c, "3", true, &[(1, 0.1)], 4);
        assert!(matches!(s.phase, StudyPhase::Succeeded { .. }));
        assert_eq!(s.trials.len(), 3, "never more than maxTrialCount");
    }

    /// A suggestion is asked for, not computed by `step`: the request carries the tuner's
    /// whole input, no other is asked while it is out, its answer makes the trials (as
    /// many as there is room for), and a tuner's error is logged and asked again later.
    #[test]
    fn suggestions_are_asked_for_then_answered() {
        let c = cfg(5, 2, 3);
        let (s, a) = step(&Study::new(1, "p".into(), "r".into(), 0), &c, Event::Advance, 1).unwrap();
        assert!(s.suggesting && s.trials.is_empty(), "no trial before the answer");
        let [Action::Suggest(request)] = a.as_slice() else { panic!("one request: {a:?}") };
        assert_eq!(request.count, 2);
        let (s, a) = step(&s, &c, Event::Advance, 2).unwrap();
        assert!(a.is_empty(), "none asked while one is out: {a:?}");
        let (s, a) = step(&s, &c, Event::Suggested(Err("singular matrix".into())), 3).unwrap();
        assert!(!s.suggesting && s.trials.is_empty());
        assert!(matches!(a.as_slice(), [Action::Log(l)] if l.contains("singular matrix")), "{a:?}");
        let (s, a) = step(&s, &c, Event::Advance, 4).unwrap();
        let [Action::Suggest(request)] = a.as_slice() else { panic!("asked again: {a:?}") };
        let mut answer = request.run(&Default::default()).unwrap();
        answer.push(answer[0].clone());
        let (s, a) = step(&s, &c, Event::Suggested(Ok(answer)), 5).unwrap();
        assert_eq!(s.trials.len(), 2, "as many as there is room for");
        assert_eq!(a.iter().filter(|x| matches!(x, Action::CreateTrialJob { .. })).count(), 2);
        let stored: Study = serde_json::from_str(&serde_json::to_string(&Study { suggesting: true, ..s }).unwrap()).unwrap();
        assert!(!stored.suggesting, "a study read back asks again");
    }

    #[test]
    fn fails_after_too_many_failures() {
        let c = cfg(10, 3, 1);
        let (s, _) = step_now(&Study::new(1, "p".into(), "r".into(), 0), &c, Event::Advance, 1).unwrap();
        let mut s = s;
        for (i, t) in s.trials.iter_mut().enumerate() {
            t.custom_job = Some(100 + i as u64);
        }
        let (s, _) = ended(&s, &c, "1", false, &[], 2);
        assert!(!s.is_terminal());
        let (s, a) = ended(&s, &c, "2", false, &[], 3);
        assert!(matches!(&s.phase, StudyPhase::Failed { message, .. } if message.contains("maxFailedTrialCount")));
        assert!(a.iter().any(|x| matches!(x, Action::StopTrialJob { custom_job: 102 })));
    }

    /// convexAutomatedStoppingSpec in a tuning job: the spec becomes the convex rule; a
    /// trial it stops ends with the rule's prediction as its last (and final) measurement.
    #[test]
    fn convex_stopping_in_a_tuning_job() {
        let spec: StudySpec = serde_json::from_value(serde_json::json!({
            "metrics": [{"metricId": "accuracy", "goal": "MAXIMIZE"}],
            "parameters": [{"parameterId": "lr", "doubleValueSpec": {"minValue": 0.001, "maxValue": 0.1}}],
            "convexAutomatedStoppingSpec": {"maxStepCount": "100", "minMeasurementCount": "2", "useElapsedDuration": false}
        }))
        .expect("spec");
        let mut c = StudyConfig::from_spec(&spec, 4).expect("config");
        assert_eq!(c.stopping, Some(tuner::StoppingRule::Convex { max_step: Some(100), min_step: None, min_measurements: 2 }));
        c.parallel = 4;
        c.algorithm = tuner::Algorithm::RandomSearch;
        let (mut s, _) = step_now(&Study::new(1, "p".into(), "r".into(), 0), &c, Event::Advance, 1).unwrap();
        for (i, t) in s.trials.iter_mut().enumerate() {
            t.custom_job = Some(100 + i as u64);
            t.state = TrialState::Active;
        }
        for (i, trial) in ["1", "2", "3"].iter().enumerate() {
            s = ended(&s, &c, trial, true, &[(10, 0.5), (50, 0.8), (100, 0.9 + 0.01 * i as f64)], 2 + i as Micros).0;
        }
        let slow = vec![(10, 0.4), (20, 0.405), (30, 0.41)];
        let (s, a) = step_now(&s, &c, Event::Measurements { trial: "4".into(), measurements: slow.clone(), elapsed_ms: Vec::new() }, 10).unwrap();
        assert_eq!(s.trials[3].state, TrialState::Stopping);
        assert!(a.iter().any(|x| matches!(x, Action::StopTrialJob { custom_job: 103 })));
        let (s, _) = ended(&s, &c, "4", true, &slow, 11);
        let (step_count, value) = s.trials[3].final_measurement.expect("final");
        assert_eq!(step_count, 100);
        assert!((0.41..=0.445).contains(&value), "{value}");
        assert_eq!(s.trials[3].measurements.len(), 4, "the three reported and the prediction");
    }

    /// The label `trainyard-multi-fidelity: successive-halving` makes successive halving
    /// the job's stopping rule (the convex spec's step counts, when given, its horizon and
    /// first rung); a trial behind the best third at a rung is stopped and ends with its
    /// last measurement. Another value, or a median spec beside it, is refused by name.
    #[test]
    fn the_multi_fidelity_label_stops_trials_by_successive_halving() {
        let job = |labels: serde_json::Value, extra: serde_json::Value| -> HyperparameterTuningJob {
            let mut spec = serde_json::json!({
                "metrics": [{"metricId": "loss", "goal": "MINIMIZE"}],
                "parameters": [{"parameterId": "lr", "doubleValueSpec": {"minValue": 0.001, "maxValue": 0.1}}],
                "algorithm": "RANDOM_SEARCH"
            });
            if let (Some(m), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
                m.extend(e.clone());
            }
            serde_json::from_value(serde_json::json!({
                "displayName": "mf", "maxTrialCount": 8, "parallelTrialCount": 8, "labels": labels,
                "studySpec": spec,
                "trialJobSpec": {"workerPoolSpecs": [{"machineSpec": {"machineType": "n1-standard-4"}, "replicaCount": "1",
                    "containerSpec": {"imageUri": "x"}}]}
            }))
            .expect("job")
        };
        let on = serde_json::json!({"trainyard-multi-fidelity": "successive-halving"});
        let c = StudyConfig::from_job(&job(on.clone(), serde_json::json!({}))).expect("config");
        assert_eq!(c.stopping, Some(tuner::StoppingRule::SuccessiveHalving { max_step: None, min_step: None, eta: 3 }));
        let c = StudyConfig::from_job(&job(on.clone(), serde_json::json!({"convexAutomatedStoppingSpec": {"maxStepCount": "81", "minStepCount": "3"}})))
            .expect("config");
        assert_eq!(c.stopping, Some(tuner::StoppingRule::SuccessiveHalving { max_step: Some(81), min_step: Some(3), eta: 3 }));
        let e = StudyConfig::from_job(&job(serde_json::json!({"trainyard-multi-fidelity": "hyperbands"}), serde_json::json!({}))).unwrap_err();
        assert!(e.message.contains("labels.trainyard-multi-fidelity") && e.message.contains("hyperbands"), "{}", e.message);
        let e = StudyConfig::from_job(&job(on, serde_json::json!({"medianAutomatedStoppingSpec": {}}))).unwrap_err();
        assert!(e.message.contains("medianAutomatedStoppingSpec"), "{}", e.message);
        assert_eq!(StudyConfig::from_job(&job(serde_json::json!({}), serde_json::json!({}))).expect("config").stopping, None);

        let (mut s, _) = step_now(&Study::new(1, "p".into(), "r".into(), 0), &c, Event::Advance, 1).unwrap();
        for (i, t) in s.trials.iter_mut().enumerate() {
            t.custom_job = Some(100 + i as u64);
            t.state = TrialState::Active;
        }
        // Five trials end with losses 0.1 .. 0.5 (+ 1/step on the way).
        let curve = |last: f64, upto: i64| (1..=upto).map(|st| (st, last + 1.0 / st as f64)).collect::<Vec<_>>();
        for (i, trial) in ["1", "2", "3", "4", "5"].iter().enumerate() {
            s = ended(&s, &c, trial, true, &curve(0.1 * (i + 1) as f64, 81), 2 + i as Micros).0;
        }
        let (s, a) = step_now(&s, &c, Event::Measurements { trial: "6".into(), measurements: curve(0.15, 9), elapsed_ms: Vec::new() }, 10).unwrap();
        assert_eq!(s.trials[5].state, TrialState::Active, "second best of six at step 9 goes on");
        assert!(a.is_empty(), "{a:?}");
        let (s, a) = step_now(&s, &c, Event::Measurements { trial: "7".into(), measurements: curve(0.25, 9), elapsed_ms: Vec::new() }, 11).unwrap();
        assert_eq!(s.trials[6].state, TrialState::Stopping, "third of six stops");
        assert!(a.iter().any(|x| matches!(x, Action::StopTrialJob { custom_job: 106 })));
        let (s, _) = ended(&s, &c, "7", true, &curve(0.25, 9), 12);
        assert_eq!(s.trials[6].final_measurement, Some((9, 0.25 + 1.0 / 9.0)));
    }

    /// useElapsedDuration in a tuning job: the stopping rule reads the learning curve by
    /// the milliseconds since the trial's job started (from the metric file's timestamps),
    /// not by steps: here the steps (1-3) are all below the convex rule's minimum (a tenth
    /// of 100), the times (10-30 s of 100 s) are not.
    #[test]
    fn elapsed_duration_in_a_tuning_job() {
        let spec: StudySpec = serde_json::from_value(serde_json::json!({
            "metrics": [{"metricId": "accuracy", "goal": "MAXIMIZE"}],
            "parameters": [{"parameterId": "lr", "doubleValueSpec": {"minValue": 0.001, "maxValue": 0.1}}],
            "convexAutomatedStoppingSpec": {"maxStepCount": "100", "minMeasurementCount": "2", "useElapsedDuration": true}
        }))
        .expect("spec");
        let mut c = StudyConfig::from_spec(&spec, 4).expect("config");
        assert!(c.use_elapsed);
        assert_eq!(c.stopping, Some(tuner::StoppingRule::Convex { max_step: Some(100_000), min_step: None, min_measurements: 2 }));
        c.parallel = 4;
        c.algorithm = tuner::Algorithm::RandomSearch;
        let run = |c: &StudyConfig| {
            let (mut s, _) = step_now(&Study::new(1, "p".into(), "r".into(), 0), c, Event::Advance, 1).unwrap();
            for (i, t) in s.trials.iter_mut().enumerate() {
                t.custom_job = Some(100 + i as u64);
                t.state = TrialState::Active;
            }
            for trial in ["1", "2", "3"] {
                let ev = Event::TrialEnded {
                    trial: trial.into(),
                    succeeded: true,
                    error: None,
                    measurements: vec![(1, 0.5), (2, 0.8), (3, 0.9)],
                    elapsed_ms: vec![Some(10_000), Some(50_000), Some(100_000)],
                    others: Vec::new(),
                };
                s = step_now(&s, c, ev, 2).unwrap().0;
            }
            let ev = Event::Measurements { trial: "4".into(), measurements: vec![(1, 0.4), (2, 0.405), (3, 0.41)], elapsed_ms: vec![Some(10_000), Some(20_000), Some(30_000)] };
            step_now(&s, c, ev, 10).unwrap().0
        };
        let s = run(&c);
        assert_eq!(s.trials[3].state, TrialState::Stopping, "by time: 30 s of 100 s, far too slow");
        assert_eq!(s.trials[3].predicted_final.map(|p| p.0), Some(3), "the prediction is for the last step");
        c.use_elapsed = false;
        c.stopping = Some(tuner::StoppingRule::Convex { max_step: Some(100), min_step: None, min_measurements: 2 });
        assert_eq!(run(&c).trials[3].state, TrialState::Active, "by steps: no step past the minimum yet");
    }

    #[test]
    fn best_measurement_selection() {
        let mut c = cfg(1, 1, 1);
        c.best_measurement = true;
        let (s, _) = step_now(&Study::new(1, "p".into(), "r".into(), 0), &c, Event::Advance, 1).unwrap();
        let (s, _) = ended(&s, &c, "1", true, &[(1, 0.5), (2, 0.9), (3, 0.7)], 2);
        assert_eq!(s.trials[0].final_measurement, Some((2, 0.9)));
    }

    #[test]
    fn cancel_stops_running_trials() {
        let c = cfg(4, 2, 4);
        let (mut s, _) = step_now(&Study::new(1, "p".into(), "r".into(), 0), &c, Event::Advance, 1).unwrap();
        s.trials[0].custom_job = Some(7);
        let (s, a) = step_now(&s, &c, Event::Cancel, 2).unwrap();
        assert!(matches!(s.phase, StudyPhase::Cancelled { .. }));
        assert!(a.contains(&Action::StopTrialJob { custom_job: 7 }));
        assert!(step_now(&s, &c, Event::Cancel, 3).is_err());
    }

    /// Several metrics in a tuning job: the first objective is followed, the others are
    /// read from the same file (one metric per line, as cloudml-hypertune writes them) and
    /// kept in the final measurement at its step; a trial that crosses a safety threshold
    /// is infeasible to the optimiser, and two objectives are scalarised for it.
    #[test]
    fn several_metrics_in_a_tuning_job() {
        let spec: StudySpec = serde_json::from_value(serde_json::json!({
            "metrics": [
                {"metricId": "memory_gb", "goal": "MINIMIZE", "safetyConfig": {"safetyThreshold": 16}},
                {"metricId": "accuracy", "goal": "MAXIMIZE"},
                {"metricId": "latency_ms", "goal": "MINIMIZE"}
            ],
            "parameters": [{"parameterId": "lr", "doubleValueSpec": {"minValue": 0.001, "maxValue": 0.1}}],
            "algorithm": "RANDOM_SEARCH"
        }))
        .expect("spec");
        let mut c = StudyConfig::from_spec(&spec, 3).expect("config");
        assert_eq!(c.metric_id, "accuracy", "the first metric without safetyConfig");
        assert_eq!(c.goal, tuner::Goal::Maximize);
        assert_eq!(
            c.others,
            vec![("memory_gb".to_string(), tuner::Goal::Minimize, Some(16.0)), ("latency_ms".to_string(), tuner::Goal::Minimize, None)]
        );
        c.parallel = 3;
        let text = "{\"global_step\": \"1\", \"accuracy\": \"0.5\"}\n{\"global_step\": \"1\", \"latency_ms\": \"30\"}\n\
                    {\"global_step\": \"2\", \"accuracy\": \"0.7\"}\n{\"global_step\": \"2\", \"memory_gb\": \"12\"}\n{\"global_step\": \"3\", \"other\": \"1\"}\n";
        let f = read_metric_file(text, &["accuracy", "memory_gb", "latency_ms"]);
        assert_eq!(f.series, vec![vec![(1, 0.5), (2, 0.7)], vec![(2, 12.0)], vec![(1, 30.0)]]);
        assert_eq!(f.bad.iter().map(|b| b.0).collect::<Vec<_>>(), vec![5], "only the line with none of the metrics");
        let (mut s, _) = step_now(&Study::new(1, "p".into(), "r".into(), 0), &c, Event::Advance, 1).unwrap();
        assert_eq!(s.trials.len(), 3);
        for (trial, acc, mem, lat) in [("1", 0.7, 12.0, 30.0), ("2", 0.9, 40.0, 10.0), ("3", 0.8, 16.0, 20.0)] {
            let others = vec![("memory_gb".to_string(), vec![(2, mem)]), ("latency_ms".to_string(), vec![(1, lat + 5.0), (2, lat), (3, 99.0)])];
            let ev = Event::TrialEnded { trial: trial.into(), succeeded: true, error: None, measurements: vec![(1, 0.5), (2, acc)], elapsed_ms: Vec::new(), others };
            s = step_now(&s, &c, ev, 2).unwrap().0;
        }
        assert_eq!(s.trials[0].final_others, vec![("memory_gb".to_string(), 12.0), ("latency_ms".to_string(), 30.0)], "the values at step 2");
        let rendered = render_trials(&s, "accuracy", |j| j.to_string());
        let ids: Vec<&str> = rendered[0]["finalMeasurement"]["metrics"].as_array().expect("metrics").iter().filter_map(|m| m["metricId"].as_str()).collect();
        assert_eq!(ids, vec!["accuracy", "memory_gb", "latency_ms"]);
        let (done, goal) = suggest_trials(&s, &c);
        assert_eq!(goal, tuner::Goal::Maximize, "two objectives: a scalarisation to maximise");
        assert_eq!(done[1].value, None, "trial 2 uses 40 GB, over the 16 GB threshold");
        let (a, b) = (done[0].value.expect("safe"), done[2].value.expect("at the threshold: safe"));
        assert!((0.0..=1.05).contains(&a) && (0.0..=1.05).contains(&b), "{a} {b}");
        // Only safety metrics: nothing to optimise.
        let only_safety: StudySpec = serde_json::from_value(serde_json::json!({
            "metrics": [{"metricId": "m", "goal": "MINIMIZE", "safetyConfig": {"safetyThreshold": 1}}],
            "parameters": [{"parameterId": "lr", "doubleValueSpec": {"minValue": 0.001, "maxValue": 0.1}}]
        }))
        .expect("spec");
        let e = StudyConfig::from_spec(&only_safety, 3).expect_err("no objective");
        assert!(e.message.contains("at least one metric must be an objective"), "{}", e.message);
    }

    #[test]
    fn metric_file_lines() {
        let text = "{\"global_step\": \"1\", \"accuracy\": \"0.5\", \"timestamp\": 1.0, \"trial\": \"1\"}\nnot json\n{\"global_step\": \"2\", \"loss\": \"3\"}\n{\"global_step\": \"3\", \"accuracy\": 0.75}\n";
        let f = read_metric_file(text, &["accuracy"]);
        assert_eq!(f.series, vec![vec![(1, 0.5), (3, 0.75)]]);
        assert_eq!(f.times, vec![vec![Some(1.0), None]]);
        assert_eq!(f.bad.iter().map(|b| b.0).collect::<Vec<_>>(), vec![2, 3]);
        let f = read_metric_file("{\"training/hptuning/metric\": \"0.25\", \"global_step\": \"5\"}\n", &["accuracy"]);
        assert_eq!(f.series, vec![vec![(5, 0.25)]]);
    }
}

/// A study is stored as JSON and read back before every step: its doubles must come back
/// bit for bit, so that a replayed study makes the same decisions as the original.
#[cfg(test)]
mod replay {
    use super::*;
    use proptest::prelude::*;

    fn cfg() -> StudyConfig {
        StudyConfig {
            space: tuner::Space::new(vec![
                tuner::ParamSpec::double("lr", 0.001, 0.1, tuner::Scale::Log),
                tuner::ParamSpec::double("x", -5.0, 5.0, tuner::Scale::Linear),
            ]),
            algorithm: tuner::Algorithm::Unspecified,
            goal: tuner::Goal::Maximize,
            metric_id: "accuracy".into(),
            max_trials: 40,
            parallel: 3,
            max_failed: 40,
            best_measurement: false,
            stopping: Some(tuner::StoppingRule::median()),
            noise: tuner::Noise::Unspecified,
            others: Vec::new(),
            use_elapsed: false,
        }
    }

    /// Every double of a study, as bits, in order.
    fn bits(s: &Study) -> Vec<u64> {
        let mut out = Vec::new();
        for t in &s.trials {
            for (_, v) in &t.params {
                if let ParamValue::Double(d) = v {
                    out.push(d.to_bits());
                }
            }
            out.extend(t.measurements.iter().map(|m| m.1.to_bits()));
            out.extend(t.final_measurement.iter().map(|m| m.1.to_bits()));
        }
        out
    }

    fn stored(s: &Study) -> Study {
        let text = serde_json::to_string(s).expect("a study serializes");
        serde_json::from_str(&text).expect("a stored study reads back")
    }

    fn trial(id: usize, params: Vec<(String, ParamValue)>, measurements: Vec<(i64, f64)>, done: bool) -> StudyTrial {
        StudyTrial {
            id: id.to_string(),
            params,
            state: if done { TrialState::Succeeded } else { TrialState::Active },
            custom_job: Some(100 + id as u64),
            final_measurement: if done { measurements.last().copied() } else { None },
            measurements,
            start_time: id as Micros,
            end_time: done.then_some(id as Micros + 1),
            infeasible_reason: String::new(),
            stopped_early: false,
            failed: false,
            predicted_final: None,
            final_others: Vec::new(),
            elapsed_ms: Vec::new(),
        }
    }

    fn finite() -> impl Strategy<Value = f64> {
        prop_oneof![
            any::<u64>().prop_map(f64::from_bits).prop_filter("finite", |f| f.is_finite()),
            -1e6..1e6f64,
            0.0..1.0f64,
        ]
    }

    fn measurements(values: impl Strategy<Value = f64>) -> impl Strategy<Value = Vec<(i64, f64)>> {
        prop::collection::vec(values, 1..5).prop_map(|v| v.into_iter().enumerate().map(|(i, x)| (i as i64 * 100 + 100, x)).collect())
    }

    /// A running study: completed trials (enough for the Gaussian process) and one active.
    fn study() -> impl Strategy<Value = Study> {
        let point = (0.001..=0.1f64, -5.0..=5.0f64);
        let done = (point.clone(), measurements(-1e3..1e3f64));
        (prop::collection::vec(done, 5..9), point, measurements(-1e3..1e3f64)).prop_map(|(done, (lr, x), running)| {
            let mut s = Study::new(7, "p".into(), "r".into(), 0);
            s.phase = StudyPhase::Running;
            s.start_time = Some(1);
            let params = |lr: f64, x: f64| vec![("lr".to_string(), ParamValue::Double(lr)), ("x".to_string(), ParamValue::Double(x))];
            for (i, ((lr, x), m)) in done.into_iter().enumerate() {
                s.trials.push(trial(i + 1, params(lr, x), m, true));
            }
            let n = s.trials.len() + 1;
            s.trials.push(trial(n, params(lr, x), running, false));
            s
        })
    }

    #[test]
    fn known_doubles_come_back_exactly() {
        let mut s = Study::new(1, "p".into(), "r".into(), 0);
        let values = [0.1 + 0.2, 0.30000000000000004, 1e-300, 5e-324, 9.441791986927227e-169, -0.0, f64::MAX];
        let params = values.iter().enumerate().map(|(i, v)| (format!("p{i}"), ParamValue::Double(*v))).collect();
        s.trials.push(trial(1, params, values.iter().enumerate().map(|(i, v)| (i as i64, *v)).collect(), true));
        let back = stored(&s);
        assert_eq!(bits(&back), bits(&s));
        assert_eq!(back, s);
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        /// Arbitrary doubles in parameters and measurements come back bit for bit.
        #[test]
        fn stored_study_is_equal_bit_for_bit(
            params in prop::collection::vec(finite(), 1..4),
            ms in measurements(finite()),
            int in any::<i64>(),
        ) {
            let mut s = Study::new(3, "p".into(), "r".into(), 0);
            let mut p: Vec<(String, ParamValue)> = params.iter().enumerate().map(|(i, v)| (format!("d{i}"), ParamValue::Double(*v))).collect();
            p.push(("n".into(), ParamValue::Int(int)));
            p.push(("c".into(), ParamValue::Str("adam".into())));
            s.trials.push(trial(1, p, ms, true));
            let back = stored(&s);
            prop_assert_eq!(bits(&back), bits(&s));
            prop_assert_eq!(back, s);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        /// The study read back from its stored form suggests exactly the same trials,
        /// makes the same early-stopping call and ends trials the same way as the original.
        #[test]
        fn replayed_study_makes_the_same_decisions(s in study(), more in measurements(-1e3..1e3f64)) {
            let c = cfg();
            let back = stored(&s);
            prop_assert_eq!(bits(&back), bits(&s));
            let active = s.trials.last().map(|t| t.id.clone()).unwrap_or_default();
            let events = [
                Event::Advance,
                Event::Measurements { trial: active.clone(), measurements: more.clone(), elapsed_ms: Vec::new() },
                Event::TrialEnded { trial: active, succeeded: true, error: None, measurements: more, elapsed_ms: Vec::new(), others: Vec::new() },
            ];
            let (mut a, mut b) = (s, back);
            for (k, e) in events.into_iter().enumerate() {
                let now = 1000 + k as Micros;
                let (sa, aa) = step_now(&a, &c, e.clone(), now).expect("the original steps");
                let (sb, ab) = step_now(&b, &c, e, now).expect("the replay steps");
                // Debug shows each double exactly (shortest text that reads back to it).
                prop_assert_eq!(format!("{aa:?}"), format!("{ab:?}"));
                prop_assert_eq!(bits(&sa), bits(&sb));
                prop_assert_eq!(format!("{sa:?}"), format!("{sb:?}"));
                // The replay goes on from the stored form, as the server does; the
                // original never leaves memory.
                a = sa;
                b = stored(&sb);
            }
        }
    }
}
