//! A Vizier study (`projects.locations.studies`) as a pure state machine: the study's
//! clients run their own training loops, ask it for trials, report measurements and
//! complete the trials; no CustomJob is involved.
//!
//! It runs on the same engine as a HyperparameterTuningJob's study: the study spec is
//! translated by [`StudyConfig::from_spec`], suggestions come from
//! `trainyard_tuner::suggest` (pure and seeded: a study read back from the store makes the
//! same suggestions), early stopping from `trainyard_tuner::should_stop`, and the final
//! measurement is chosen by the study's `measurementSelectionType` as for tuning jobs.
//! Several objectives are optimised together (ParEGO, see [`VizierStudy::suggest_inputs`])
//! and listed as a Pareto front; a safety metric (`safetyConfig`) makes a trial that
//! crosses its threshold infeasible to the optimiser and keeps it out of the optimal trials.
//!
//! A suggestion is computed off the driver thread, so the study records the request
//! ([`Pending`], with the id of the Operation that answers it) before the computation
//! starts, and the trials it made together with the done Operation afterwards: a server
//! killed in between computes it again after its restart.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use trainyard_api::hptuning::{
    Measurement, MeasurementMetric, ParameterSpec, Trial as ApiTrial, TrialParameter,
    TrialState as ApiTrialState,
};
use trainyard_api::vizier::{Study as ApiStudy, StudyState, TrialContext};
use trainyard_api::{ApiError, Duration, Timestamp};
use trainyard_core::Micros;
use trainyard_tuner as tuner;

use crate::kinds::tuning_jobs::{ParamValue, StudyConfig, TrialState};

/// The most trials one suggest request may ask for: every suggestion of a batch is a fit
/// of the optimiser's model.
pub const MAX_SUGGESTIONS: i32 = 100;

/// A study's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Phase {
    Active,
    /// Stopped by an internal error (`inactive_reason` says which).
    Inactive,
    /// The search space is exhausted, or `studyStoppingConfig.maxNumTrials` is reached.
    Completed,
}

impl Phase {
    pub fn api(self) -> StudyState {
        match self {
            Phase::Active => StudyState::Active,
            Phase::Inactive => StudyState::Inactive,
            Phase::Completed => StudyState::Completed,
        }
    }
}

/// One measurement as stored: every metric the client reported.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Measured {
    pub elapsed: Option<Duration>,
    pub step: i64,
    pub metrics: Vec<(String, f64)>,
}

impl Measured {
    pub fn value(&self, metric: &str) -> Option<f64> {
        self.metrics.iter().find(|(id, _)| id == metric).map(|m| m.1)
    }

    fn api(&self) -> Measurement {
        Measurement {
            elapsed_duration: self.elapsed,
            step_count: self.step,
            metrics: self.metrics.iter().map(|(id, v)| MeasurementMetric { metric_id: id.clone(), value: *v }).collect(),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VTrial {
    /// 1, 2, ... (never reused within a study, also after a delete).
    pub id: u64,
    pub params: Vec<(String, ParamValue)>,
    pub state: TrialState,
    pub client_id: String,
    pub measurements: Vec<Measured>,
    pub final_measurement: Option<Measured>,
    pub start_time: Micros,
    pub end_time: Option<Micros>,
    pub infeasible_reason: String,
}

/// A suggest request whose trials are being computed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Pending {
    /// The Operation that answers it.
    pub op: u64,
    pub client_id: String,
    /// How many new trials the optimiser is to make.
    pub count: usize,
    /// Trials already handed to the client for this request (REQUESTED ones it was given).
    pub assigned: Vec<u64>,
    /// Parameter values each suggestion must take (the request's contexts, in turn).
    pub contexts: Vec<Vec<(String, ParamValue)>>,
    pub start: Micros,
}

/// A Vizier study's state, stored as JSON next to its resource (the `Study` as created).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VizierStudy {
    pub id: u64,
    pub project: String,
    pub region: String,
    pub create_time: Micros,
    pub phase: Phase,
    pub inactive_reason: String,
    pub trials: Vec<VTrial>,
    pub next_trial: u64,
    pub pending: Vec<Pending>,
    pub seed: u64,
}

/// What a study's spec asks of the engine, checked.
#[derive(Clone, Debug)]
pub struct Engine {
    pub cfg: StudyConfig,
    /// The objectives: every metric without a safety config, with its goal.
    pub objectives: Vec<(String, tuner::Goal)>,
    /// The safety metrics: (metric, goal, threshold). A trial is unsafe when its final
    /// value of one of them is worse than the threshold.
    pub safety: Vec<(String, tuner::Goal, f64)>,
    /// Early stopping measures progress by elapsed time rather than by steps.
    pub use_elapsed: bool,
    /// `studyStoppingConfig.maxNumTrials`.
    pub max_trials: Option<usize>,
    pub params: Vec<ParameterSpec>,
}

/// The parts of a stopping config that are honoured (the rest is kept and echoed).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StoppingConfig {
    #[serde(default, alias = "max_num_trials", with = "trainyard_api::json::int32")]
    max_num_trials: i32,
}

impl Engine {
    /// Check a study at create (400 naming the field) and translate it for the tuner.
    pub fn new(study: &ApiStudy) -> Result<Engine, ApiError> {
        trainyard_api::validate::validate_display_name(&study.display_name)?;
        let spec = &study.study_spec;
        trainyard_api::validate_study_spec(spec, "studySpec")?;
        let stopping: StoppingConfig = match &spec.study_stopping_config {
            Some(v) => serde_json::from_value(v.clone())
                .map_err(|e| ApiError::invalid_argument(format!("studySpec.studyStoppingConfig: {e}")))?,
            None => StoppingConfig::default(),
        };
        if stopping.max_num_trials < 0 {
            return Err(ApiError::invalid_argument("studySpec.studyStoppingConfig.maxNumTrials must not be negative."));
        }
        let max_trials = (stopping.max_num_trials > 0).then_some(stopping.max_num_trials as usize);
        let mut cfg = StudyConfig::from_spec(spec, max_trials.unwrap_or(usize::MAX))?;
        let objectives: Vec<(String, tuner::Goal)> =
            spec.metrics.iter().filter(|m| m.safety_config.is_none()).map(|m| (m.metric_id.clone(), crate::kinds::tuning_jobs::goal_of(m.goal))).collect();
        // The optimiser and early stopping follow the first objective (a safety metric is
        // a constraint, not an objective).
        let Some((metric, goal)) = objectives.first().cloned() else {
            return Err(ApiError::invalid_argument("studySpec.metrics: at least one metric must be an objective (without safetyConfig)."));
        };
        cfg.metric_id = metric;
        cfg.goal = goal;
        let safety = spec
            .metrics
            .iter()
            .filter_map(|m| m.safety_config.as_ref().map(|c| (m.metric_id.clone(), crate::kinds::tuning_jobs::goal_of(m.goal), c.safety_threshold)))
            .collect();
        let use_elapsed = cfg.use_elapsed;
        Ok(Engine { cfg, objectives, safety, use_elapsed, max_trials, params: spec.parameters.clone() })
    }

    /// Is a measurement safe: no safety metric in it worse than its threshold (a safety
    /// metric the measurement lacks is not held against it).
    pub fn is_safe(&self, m: &Measured) -> bool {
        crate::kinds::tuning_jobs::is_safe(self.safety.iter().map(|(id, goal, threshold)| (*goal, *threshold, m.value(id))))
    }

    /// The metric the optimiser and early stopping follow.
    fn primary(&self) -> (&str, tuner::Goal) {
        (self.cfg.metric_id.as_str(), self.cfg.goal)
    }
}

/// What a suggest request comes to at once.
#[derive(Debug, PartialEq)]
pub enum Begin {
    /// Answered now with these trials (the client's own that have not ended, REQUESTED
    /// trials given to it, or none when the study is COMPLETED).
    Done { trials: Vec<u64> },
    /// The optimiser is to make `count` trials (recorded as [`Pending`] under `op`).
    Compute,
}

fn trial_state_name(s: TrialState) -> &'static str {
    match s {
        TrialState::Requested => "REQUESTED",
        TrialState::Active => "ACTIVE",
        TrialState::Stopping => "STOPPING",
        TrialState::Succeeded => "SUCCEEDED",
        TrialState::Infeasible => "INFEASIBLE",
    }
}

impl VizierStudy {
    pub fn new(id: u64, project: String, region: String, now: Micros) -> VizierStudy {
        VizierStudy {
            id,
            project,
            region,
            create_time: now,
            phase: Phase::Active,
            inactive_reason: String::new(),
            trials: Vec::new(),
            next_trial: 1,
            pending: Vec::new(),
            // The same derivation as a tuning job's study.
            seed: id.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x5EED,
        }
    }

    pub fn name(&self) -> String {
        study_name(&self.project, &self.region, self.id)
    }

    pub fn trial(&self, id: u64) -> Result<&VTrial, ApiError> {
        self.trials.iter().find(|t| t.id == id).ok_or_else(|| self.no_trial(id))
    }

    fn trial_mut(&mut self, id: u64) -> Result<&mut VTrial, ApiError> {
        let missing = self.no_trial(id);
        self.trials.iter_mut().find(|t| t.id == id).ok_or(missing)
    }

    fn no_trial(&self, id: u64) -> ApiError {
        ApiError::not_found(format!("The Trial \"{}/trials/{id}\" does not exist.", self.name()))
    }

    /// Begin a suggest request of `client` for `count` trials (answered by Operation `op`).
    pub fn suggest_begin(
        &mut self,
        engine: &Engine,
        op: u64,
        client: &str,
        count: usize,
        contexts: Vec<Vec<(String, ParamValue)>>,
        now: Micros,
    ) -> Begin {
        // A client that has trials it has not finished gets them again (the reference:
        // "the service will return the identical suggested Trial if the Trial is pending").
        let own = self.unfinished(client);
        if !own.is_empty() {
            return Begin::Done { trials: own };
        }
        if self.phase != Phase::Active {
            return Begin::Done { trials: Vec::new() };
        }
        // REQUESTED trials (created by a client) are handed out before new ones are made,
        // each to the first request whose context it fits.
        let mut assigned = Vec::new();
        for t in self.trials.iter_mut() {
            if assigned.len() == count {
                break;
            }
            let fits = contexts.is_empty() || contexts.iter().any(|c| c.iter().all(|kv| t.params.contains(kv)));
            if t.state == TrialState::Requested && t.client_id.is_empty() && fits {
                t.state = TrialState::Active;
                t.client_id = client.to_string();
                t.start_time = now;
                assigned.push(t.id);
            }
        }
        let mut wanted = count - assigned.len();
        if let Some(max) = engine.max_trials {
            wanted = wanted.min(max.saturating_sub(self.trials.len()));
            if wanted == 0 && assigned.is_empty() {
                self.phase = Phase::Completed;
            }
        }
        if wanted == 0 {
            return Begin::Done { trials: assigned };
        }
        self.pending.push(Pending { op, client_id: client.to_string(), count: wanted, assigned, contexts, start: now });
        Begin::Compute
    }

    /// The client's trials that have been handed out and have not ended.
    fn unfinished(&self, client: &str) -> Vec<u64> {
        self.trials.iter().filter(|t| t.client_id == client && !t.state.is_terminal() && t.state != TrialState::Requested).map(|t| t.id).collect()
    }

    /// A pending request `op` whose client got trials meanwhile (from an earlier request
    /// of its own that was computed first) is answered with them, as a new request would
    /// be: it is removed and its client's unfinished trials returned, with the request.
    pub fn settle(&mut self, op: u64) -> Option<(Vec<u64>, Pending)> {
        let at = self.pending.iter().position(|p| p.op == op)?;
        let own = self.unfinished(&self.pending[at].client_id);
        if own.is_empty() {
            return None;
        }
        Some((own, self.pending.remove(at)))
    }

    /// The optimiser's inputs for the next computation: the ended trials (with their
    /// objective value, None when infeasible) and the points handed out and not ended.
    pub fn tuner_inputs(&self, engine: &Engine) -> (Vec<tuner::Trial>, Vec<tuner::Assignment>) {
        let (metric, _) = engine.primary();
        let completed = self
            .trials
            .iter()
            .filter(|t| t.state.is_terminal())
            .map(|t| tuner::Trial {
                params: assignment(&t.params),
                value: if t.state == TrialState::Succeeded { t.final_measurement.as_ref().and_then(|m| m.value(metric)) } else { None },
                intermediate: curve(t, metric, engine.use_elapsed),
            })
            .collect();
        let pending = self.trials.iter().filter(|t| !t.state.is_terminal()).map(|t| assignment(&t.params)).collect();
        (completed, pending)
    }

    /// What the optimiser is given for a suggestion: the ended trials each with one value
    /// to optimise and the goal for it (see [`crate::kinds::tuning_jobs::scalarise`]: with several
    /// objectives a ParEGO scalarisation whose weights change with every suggestion), and
    /// the trials handed out. A trial that is unsafe by a safety metric (`safetyConfig`)
    /// counts as infeasible: the optimiser gives it the worst value and moves away from it.
    pub fn suggest_inputs(&self, engine: &Engine) -> (Vec<tuner::Trial>, Vec<tuner::Assignment>, tuner::Goal) {
        let (mut completed, pending) = self.tuner_inputs(engine);
        let values: Vec<Option<Vec<f64>>> = self
            .trials
            .iter()
            .filter(|t| t.state.is_terminal())
            .map(|t| {
                let m = t.final_measurement.as_ref().filter(|_| t.state == TrialState::Succeeded)?;
                if !engine.is_safe(m) {
                    return None;
                }
                engine.objectives.iter().map(|(id, _)| m.value(id)).collect()
            })
            .collect();
        let goals: Vec<tuner::Goal> = engine.objectives.iter().map(|o| o.1).collect();
        let seed = self.seed ^ (self.trials.len() as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let (scalar, goal) = crate::kinds::tuning_jobs::scalarise(&goals, &values, seed);
        for (c, v) in completed.iter_mut().zip(scalar) {
            c.value = v;
        }
        (completed, pending, goal)
    }

    /// The optimiser's answer for Operation `op`: the trials it made are added, ACTIVE and
    /// given to the request's client. Returns the trials that answer the request and the
    /// error to answer it with, or None when the request is no longer pending.
    pub fn suggest_finish(
        &mut self,
        op: u64,
        result: Result<Vec<tuner::Assignment>, tuner::TunerError>,
        now: Micros,
    ) -> Option<(Vec<u64>, Option<ApiError>)> {
        let at = self.pending.iter().position(|p| p.op == op)?;
        let p = self.pending.remove(at);
        let mut trials = p.assigned.clone();
        let made = match result {
            Ok(v) => v,
            Err(tuner::TunerError::Exhausted) => Vec::new(),
            Err(e) => {
                // The assigned REQUESTED trials stay the client's; a repeated request gets them.
                return Some((trials, Some(ApiError::internal(format!("The optimiser failed: {e}.")))));
            }
        };
        if made.len() < p.count {
            // A finite search space ran out (grid search, or every point tried).
            self.phase = Phase::Completed;
        }
        for (k, a) in made.into_iter().enumerate() {
            let mut params: Vec<(String, ParamValue)> = a.iter().map(|(k, v)| (k.clone(), ParamValue::from_tuner(v))).collect();
            if !p.contexts.is_empty() {
                for (id, v) in &p.contexts[k % p.contexts.len()] {
                    match params.iter_mut().find(|(pid, _)| pid == id) {
                        Some(slot) => slot.1 = v.clone(),
                        None => params.push((id.clone(), v.clone())),
                    }
                }
                params.sort_by(|a, b| a.0.cmp(&b.0));
            }
            let id = self.next_trial;
            self.next_trial += 1;
            self.trials.push(VTrial {
                id,
                params,
                state: TrialState::Active,
                client_id: p.client_id.clone(),
                measurements: Vec::new(),
                final_measurement: None,
                start_time: now,
                end_time: None,
                infeasible_reason: String::new(),
            });
            trials.push(id);
        }
        Some((trials, None))
    }

    /// `trials.create`: a trial with the client's parameters; with a final measurement it
    /// is SUCCEEDED at once (a result obtained elsewhere), else REQUESTED (handed out by
    /// the next suggestion).
    pub fn create_trial(&mut self, engine: &Engine, trial: &ApiTrial, now: Micros) -> Result<u64, ApiError> {
        let params = parse_assignment(&engine.params, &trial.parameters, "trial.parameters", true)?;
        if self.trials.iter().any(|t| !t.state.is_terminal() && t.params == params) {
            return Err(ApiError::already_exists("A trial of this study that has not ended has these parameters already."));
        }
        let measurements = trial
            .measurements
            .iter()
            .enumerate()
            .map(|(i, m)| measured(m, &format!("trial.measurements[{i}]")))
            .collect::<Result<Vec<_>, _>>()?;
        let final_measurement = trial.final_measurement.as_ref().map(|m| measured(m, "trial.finalMeasurement")).transpose()?;
        if let Some(m) = &final_measurement {
            check_objectives(engine, m, "trial.finalMeasurement")?;
        }
        let (state, end_time) = match (&final_measurement, trial.state) {
            (Some(_), _) => (TrialState::Succeeded, Some(now)),
            (None, ApiTrialState::Infeasible) => (TrialState::Infeasible, Some(now)),
            _ => (TrialState::Requested, None),
        };
        let id = self.next_trial;
        self.next_trial += 1;
        self.trials.push(VTrial {
            id,
            params,
            state,
            client_id: String::new(),
            measurements,
            final_measurement,
            start_time: now,
            end_time,
            infeasible_reason: if state == TrialState::Infeasible { trial.infeasible_reason.clone() } else { String::new() },
        });
        Ok(id)
    }

    fn open_trial(&mut self, id: u64, verb: &str) -> Result<&mut VTrial, ApiError> {
        let name = self.name();
        let t = self.trial_mut(id)?;
        if t.state.is_terminal() {
            return Err(ApiError::failed_precondition(format!(
                "The Trial \"{name}/trials/{id}\" is {} and cannot be {verb}.",
                trial_state_name(t.state)
            )));
        }
        Ok(t)
    }

    /// `:addTrialMeasurement`.
    pub fn add_measurement(&mut self, trial: u64, m: &Measurement) -> Result<(), ApiError> {
        let m = measured(m, "measurement")?;
        let t = self.open_trial(trial, "measured")?;
        if t.state == TrialState::Requested {
            t.state = TrialState::Active;
        }
        t.measurements.push(m);
        Ok(())
    }

    /// `:complete`.
    pub fn complete(
        &mut self,
        engine: &Engine,
        trial: u64,
        final_measurement: Option<&Measurement>,
        infeasible: bool,
        reason: &str,
        now: Micros,
    ) -> Result<(), ApiError> {
        let given = final_measurement.map(|m| measured(m, "finalMeasurement")).transpose()?;
        if let (Some(m), false) = (&given, infeasible) {
            check_objectives(engine, m, "finalMeasurement")?;
        }
        let t = self.open_trial(trial, "completed")?;
        t.end_time = Some(now);
        if infeasible {
            t.state = TrialState::Infeasible;
            t.infeasible_reason = reason.to_string();
            t.final_measurement = given;
            return Ok(());
        }
        let chosen = given.or_else(|| {
            // As for a tuning job's trial: the last measurement, or the best one by the
            // first objective; only measurements that have every objective count.
            let mut full = t.measurements.iter().filter(|m| engine.objectives.iter().all(|(id, _)| m.value(id).is_some()));
            let (metric, goal) = engine.primary();
            if engine.cfg.best_measurement {
                full.cloned().reduce(|a, b| match (a.value(metric), b.value(metric)) {
                    (Some(x), Some(y)) if goal.better(y, x) => b,
                    _ => a,
                })
            } else {
                full.next_back().cloned()
            }
        });
        match chosen {
            Some(m) => {
                t.final_measurement = Some(m);
                t.state = TrialState::Succeeded;
            }
            None => {
                t.state = TrialState::Infeasible;
                t.infeasible_reason = "The trial was completed without a final measurement, and none of its measurements has every objective metric.".into();
            }
        }
        Ok(())
    }

    /// `:stop`: the trial should stop (its client completes it).
    pub fn stop(&mut self, trial: u64) -> Result<(), ApiError> {
        let t = self.open_trial(trial, "stopped")?;
        t.state = TrialState::Stopping;
        Ok(())
    }

    /// `trials.delete`.
    pub fn delete_trial(&mut self, trial: u64) -> Result<(), ApiError> {
        self.trial(trial)?;
        self.trials.retain(|t| t.id != trial);
        for p in &mut self.pending {
            p.assigned.retain(|t| *t != trial);
        }
        Ok(())
    }

    /// `:checkTrialEarlyStoppingState`: whether the trial should stop, by the study's
    /// automated stopping rule (none: only a trial already STOPPING should). A trial the
    /// rule stops becomes STOPPING.
    pub fn check_early_stopping(&mut self, engine: &Engine, trial: u64) -> Result<bool, ApiError> {
        let (metric, goal) = engine.primary();
        let (completed, _) = self.tuner_inputs(engine);
        let rule = engine.cfg.stopping.clone();
        let use_elapsed = engine.use_elapsed;
        let t = self.open_trial(trial, "checked for early stopping")?;
        if t.state == TrialState::Stopping {
            return Ok(true);
        }
        let Some(rule) = rule else { return Ok(false) };
        let running = tuner::Trial { params: assignment(&t.params), value: None, intermediate: curve(t, metric, use_elapsed) };
        // On the driver thread: a panic of the rule must not take the server down.
        let stop = std::panic::catch_unwind(|| tuner::should_stop(&rule, goal, &running, &completed)).map_err(|_| {
            ApiError::internal("The early-stopping rule failed on this trial's measurements; see the server log.")
        })?;
        if stop {
            t.state = TrialState::Stopping;
            // The convex rule adds its prediction for the end of the trial as the trial's
            // last measurement (as the reference does): at the horizon's step, or after
            // the horizon's elapsed time.
            if let Some((x, value)) = tuner::predicted_final(&rule, goal, &running, &completed) {
                let x = i64::try_from(x).unwrap_or(i64::MAX);
                let (step, elapsed) = if use_elapsed {
                    let last_step = t.measurements.last().map_or(0, |m| m.step);
                    (last_step, Some(Duration { seconds: x / 1000, nanos: ((x % 1000) * 1_000_000) as i32 }))
                } else {
                    (x, None)
                };
                t.measurements.push(Measured { elapsed, step, metrics: vec![(metric.to_string(), value)] });
            }
        }
        Ok(stop)
    }

    /// `trials:listOptimalTrials`: the SUCCEEDED trials with every objective that no other
    /// such trial dominates (at least as good in every objective, better in one). With
    /// one objective, the trials tied for the best value.
    pub fn optimal(&self, engine: &Engine) -> Vec<u64> {
        let points: Vec<(u64, Vec<f64>)> = self
            .trials
            .iter()
            .filter(|t| t.state == TrialState::Succeeded)
            .filter_map(|t| {
                let m = t.final_measurement.as_ref().filter(|m| engine.is_safe(m))?;
                let v: Option<Vec<f64>> = engine.objectives.iter().map(|(id, _)| m.value(id)).collect();
                Some((t.id, v?))
            })
            .collect();
        let dominates = |a: &[f64], b: &[f64]| {
            let mut strictly = false;
            for ((x, y), (_, goal)) in a.iter().zip(b).zip(&engine.objectives) {
                if goal.better(*y, *x) {
                    return false;
                }
                if goal.better(*x, *y) {
                    strictly = true;
                }
            }
            strictly
        };
        points.iter().filter(|(_, p)| !points.iter().any(|(_, q)| dominates(q, p))).map(|(id, _)| *id).collect()
    }

    /// A trial as the API shows it.
    pub fn render_trial(&self, t: &VTrial) -> ApiTrial {
        let ts = |m: Micros| Some(Timestamp::from_micros(m));
        ApiTrial {
            name: format!("{}/trials/{}", self.name(), t.id),
            id: t.id.to_string(),
            state: ApiTrialState::from_name(trial_state_name(t.state)).unwrap_or(ApiTrialState::Unspecified),
            parameters: t.params.iter().map(|(k, v)| TrialParameter { parameter_id: k.clone(), value: v.to_json() }).collect(),
            final_measurement: t.final_measurement.as_ref().map(Measured::api),
            measurements: t.measurements.iter().map(Measured::api).collect(),
            start_time: ts(t.start_time),
            end_time: t.end_time.and_then(ts),
            client_id: t.client_id.clone(),
            infeasible_reason: t.infeasible_reason.clone(),
            ..ApiTrial::default()
        }
    }

    /// The trials `ids` as the API shows them (those that still exist).
    pub fn render_trials(&self, ids: &[u64]) -> Vec<ApiTrial> {
        ids.iter().filter_map(|id| self.trials.iter().find(|t| t.id == *id)).map(|t| self.render_trial(t)).collect()
    }

    /// The study as the API shows it: its resource with the output fields.
    pub fn render(&self, resource: &ApiStudy) -> ApiStudy {
        ApiStudy {
            name: self.name(),
            state: self.phase.api(),
            create_time: Some(Timestamp::from_micros(self.create_time)),
            inactive_reason: self.inactive_reason.clone(),
            ..resource.clone()
        }
    }

    /// The store's state column.
    pub fn state_name(&self) -> &'static str {
        self.phase.api().name()
    }
}

pub fn study_name(project: &str, region: &str, id: u64) -> String {
    format!("projects/{project}/locations/{region}/studies/{id}")
}

fn assignment(params: &[(String, ParamValue)]) -> tuner::Assignment {
    params.iter().map(|(k, v)| (k.clone(), v.to_tuner())).collect()
}

/// A trial's measurements of `metric` as a learning curve: by step, or by elapsed
/// milliseconds when the study's stopping rule says so.
fn curve(t: &VTrial, metric: &str, use_elapsed: bool) -> Vec<(u64, f64)> {
    t.measurements
        .iter()
        .filter_map(|m| {
            let x = if use_elapsed {
                let d = m.elapsed.unwrap_or_default();
                d.seconds.saturating_mul(1000).saturating_add(i64::from(d.nanos) / 1_000_000)
            } else {
                m.step
            };
            Some((x.max(0) as u64, m.value(metric)?))
        })
        .collect()
}

/// A measurement from a request, checked: metric ids given once, values finite.
fn measured(m: &Measurement, path: &str) -> Result<Measured, ApiError> {
    let mut metrics: Vec<(String, f64)> = Vec::with_capacity(m.metrics.len());
    for (i, metric) in m.metrics.iter().enumerate() {
        let at = format!("{path}.metrics[{i}]");
        if metric.metric_id.trim().is_empty() {
            return Err(ApiError::invalid_argument(format!("{at}.metricId is required.")));
        }
        if !metric.value.is_finite() {
            return Err(ApiError::invalid_argument(format!("{at}.value must be a finite number, got {}.", metric.value)));
        }
        if metrics.iter().any(|(id, _)| *id == metric.metric_id) {
            return Err(ApiError::invalid_argument(format!("{at}.metricId \"{}\" is given twice.", metric.metric_id)));
        }
        metrics.push((metric.metric_id.clone(), metric.value));
    }
    if m.step_count < 0 {
        return Err(ApiError::invalid_argument(format!("{path}.stepCount must not be negative, got {}.", m.step_count)));
    }
    if m.elapsed_duration.is_some_and(|d| d.is_negative()) {
        return Err(ApiError::invalid_argument(format!("{path}.elapsedDuration must not be negative.")));
    }
    Ok(Measured { elapsed: m.elapsed_duration, step: m.step_count, metrics })
}

/// A final measurement must have a value of every objective.
fn check_objectives(engine: &Engine, m: &Measured, path: &str) -> Result<(), ApiError> {
    for (id, _) in &engine.objectives {
        if m.value(id).is_none() {
            return Err(ApiError::invalid_argument(format!(
                "{path}.metrics has no value of the study's metric \"{id}\"; report it, or complete the trial with trialInfeasible."
            )));
        }
    }
    Ok(())
}

/// Every parameter spec of the space, conditional children included, by id.
fn all_specs(params: &[ParameterSpec]) -> BTreeMap<&str, &ParameterSpec> {
    let mut out = BTreeMap::new();
    let mut stack: Vec<&ParameterSpec> = params.iter().collect();
    while let Some(p) = stack.pop() {
        out.insert(p.parameter_id.as_str(), p);
        stack.extend(p.conditional_parameter_specs.iter().filter_map(|c| c.parameter_spec.as_deref()));
    }
    out
}

/// A parameter value from a request, as its spec's type: an INTEGER's value a whole
/// number in range, a DOUBLE's a number in range, a DISCRETE's one of its values, a
/// CATEGORICAL's one of its strings.
fn parse_value(spec: &ParameterSpec, v: &Value, path: &str) -> Result<ParamValue, ApiError> {
    let bad = |why: String| Err(ApiError::invalid_argument(format!("{path}: {why}")));
    let id = &spec.parameter_id;
    if let Some(d) = &spec.double_value_spec {
        return match v.as_f64() {
            Some(x) if x.is_finite() && x >= d.min_value && x <= d.max_value => Ok(ParamValue::Double(x)),
            Some(x) => bad(format!("{x} is outside [{}, {}] of DOUBLE parameter \"{id}\".", d.min_value, d.max_value)),
            None => bad(format!("the DOUBLE parameter \"{id}\" takes a number, got {v}.")),
        };
    }
    if let Some(i) = &spec.integer_value_spec {
        let n = v.as_i64().or_else(|| v.as_f64().filter(|x| x.fract() == 0.0 && x.abs() < 9.0e15).map(|x| x as i64));
        return match n {
            Some(n) if n >= i.min_value && n <= i.max_value => Ok(ParamValue::Int(n)),
            Some(n) => bad(format!("{n} is outside [{}, {}] of INTEGER parameter \"{id}\".", i.min_value, i.max_value)),
            None => bad(format!("the INTEGER parameter \"{id}\" takes a whole number, got {v}.")),
        };
    }
    if let Some(d) = &spec.discrete_value_spec {
        let found = v.as_f64().and_then(|x| d.values.iter().copied().find(|y| (x - y).abs() <= 1e-9 * y.abs().max(1.0)));
        return match found {
            Some(x) => Ok(ParamValue::Double(x)),
            None => bad(format!("{v} is not one of the values {:?} of DISCRETE parameter \"{id}\".", d.values)),
        };
    }
    if let Some(c) = &spec.categorical_value_spec {
        return match v.as_str() {
            Some(s) if c.values.iter().any(|x| x == s) => Ok(ParamValue::Str(s.to_string())),
            _ => bad(format!("{v} is not one of the values {:?} of CATEGORICAL parameter \"{id}\".", c.values)),
        };
    }
    bad(format!("the parameter \"{id}\" has no value spec."))
}

/// Whether a conditional child is active for its parent's value.
fn child_active(c: &trainyard_api::ConditionalParameterSpec, parent: &ParamValue) -> bool {
    match parent {
        ParamValue::Int(i) => c.parent_int_values.as_ref().is_some_and(|v| v.values.contains(i)),
        ParamValue::Double(d) => c.parent_discrete_values.as_ref().is_some_and(|v| v.values.iter().any(|x| (x - d).abs() <= 1e-9 * x.abs().max(1.0))),
        ParamValue::Str(s) => c.parent_categorical_values.as_ref().is_some_and(|v| v.values.contains(s)),
    }
}

/// Parameters from a request (`path` names the list). `complete`: they must be a whole
/// point of the space (every parameter, conditional ones exactly when active); else any
/// parameters without conditional children (a context's slice).
pub fn parse_assignment(
    params: &[ParameterSpec],
    given: &[TrialParameter],
    path: &str,
    complete: bool,
) -> Result<Vec<(String, ParamValue)>, ApiError> {
    let specs = all_specs(params);
    let mut values: BTreeMap<String, ParamValue> = BTreeMap::new();
    for (i, p) in given.iter().enumerate() {
        let at = format!("{path}[{i}]");
        let Some(spec) = specs.get(p.parameter_id.as_str()) else {
            return Err(ApiError::invalid_argument(format!(
                "{at}.parameterId: \"{}\" is not a parameter of the study; its parameters are {:?}.",
                p.parameter_id,
                specs.keys().collect::<Vec<_>>()
            )));
        };
        if !complete && !spec.conditional_parameter_specs.is_empty() {
            return Err(ApiError::invalid_argument(format!(
                "{at}.parameterId: \"{}\" has conditional parameters; a context may fix only parameters without them.",
                p.parameter_id
            )));
        }
        if !complete && !params.iter().any(|top| top.parameter_id == p.parameter_id) {
            return Err(ApiError::invalid_argument(format!(
                "{at}.parameterId: \"{}\" is a conditional parameter; a context may fix only top-level parameters.",
                p.parameter_id
            )));
        }
        let v = parse_value(spec, &p.value, &format!("{at}.value"))?;
        if values.insert(p.parameter_id.clone(), v).is_some() {
            return Err(ApiError::invalid_argument(format!("{at}.parameterId: \"{}\" is given twice.", p.parameter_id)));
        }
    }
    if complete {
        // Walk the space from the top: every active parameter must be there, and nothing else.
        let mut active: Vec<&ParameterSpec> = params.iter().collect();
        let mut seen = 0;
        while let Some(spec) = active.pop() {
            let Some(v) = values.get(&spec.parameter_id) else {
                return Err(ApiError::invalid_argument(format!("{path}: the parameter \"{}\" is missing.", spec.parameter_id)));
            };
            seen += 1;
            for c in &spec.conditional_parameter_specs {
                if let Some(child) = c.parameter_spec.as_deref().filter(|_| child_active(c, v)) {
                    active.push(child);
                }
            }
        }
        if seen != values.len() {
            return Err(ApiError::invalid_argument(format!(
                "{path}: a conditional parameter is given that its parent's value does not activate."
            )));
        }
    }
    Ok(values.into_iter().collect())
}

/// A suggest request's contexts, checked (`contexts[i].parameters[j]`).
pub fn parse_contexts(engine: &Engine, contexts: &[TrialContext]) -> Result<Vec<Vec<(String, ParamValue)>>, ApiError> {
    contexts
        .iter()
        .enumerate()
        .map(|(i, c)| parse_assignment(&engine.params, &c.parameters, &format!("contexts[{i}].parameters"), false))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn engine(extra: Value) -> Engine {
        let mut spec = json!({
            "metrics": [{"metricId": "loss", "goal": "MINIMIZE"}],
            "parameters": [
                {"parameterId": "x", "doubleValueSpec": {"minValue": -5, "maxValue": 5}},
                {"parameterId": "n", "integerValueSpec": {"minValue": "1", "maxValue": "8"}},
                {"parameterId": "opt", "categoricalValueSpec": {"values": ["adam", "sgd"]},
                 "conditionalParameterSpecs": [{"parentCategoricalValues": {"values": ["sgd"]},
                   "parameterSpec": {"parameterId": "momentum", "discreteValueSpec": {"values": [0.5, 0.9]}}}]}
            ],
            "algorithm": "RANDOM_SEARCH"
        });
        if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
            s.extend(e.clone());
        }
        let study: ApiStudy = serde_json::from_value(json!({"displayName": "s", "studySpec": spec})).expect("study");
        Engine::new(&study).expect("engine")
    }

    fn params(v: Value) -> Vec<TrialParameter> {
        serde_json::from_value(v).expect("params")
    }

    fn m(step: i64, pairs: &[(&str, f64)]) -> Measurement {
        Measurement {
            step_count: step,
            metrics: pairs.iter().map(|(k, v)| MeasurementMetric { metric_id: k.to_string(), value: *v }).collect(),
            ..Measurement::default()
        }
    }

    fn suggest(s: &mut VizierStudy, e: &Engine, op: u64, client: &str, n: usize) -> Vec<u64> {
        match s.suggest_begin(e, op, client, n, Vec::new(), 1) {
            Begin::Done { trials } => trials,
            Begin::Compute => {
                let p = s.pending.last().expect("pending").clone();
                let (done, pending, goal) = s.suggest_inputs(e);
                let r = tuner::suggest(&e.cfg.space, e.cfg.algorithm, goal, &done, &pending, p.count, s.seed);
                s.suggest_finish(op, r, 2).expect("finished").0
            }
        }
    }

    #[test]
    fn assignments_are_checked_against_the_space() {
        let e = engine(json!({}));
        let ok = parse_assignment(&e.params, &params(json!([{"parameterId": "x", "value": 1.5}, {"parameterId": "n", "value": 3.0}, {"parameterId": "opt", "value": "adam"}])), "p", true).expect("ok");
        assert_eq!(ok, vec![("n".into(), ParamValue::Int(3)), ("opt".into(), ParamValue::Str("adam".into())), ("x".into(), ParamValue::Double(1.5))]);
        let err = |v: Value| parse_assignment(&e.params, &params(v), "p", true).expect_err("refused").message;
        assert!(err(json!([{"parameterId": "y", "value": 1}])).contains("p[0].parameterId: \"y\" is not a parameter"));
        assert!(err(json!([{"parameterId": "x", "value": 9}, {"parameterId": "n", "value": 3}, {"parameterId": "opt", "value": "adam"}])).contains("p[0].value"));
        assert!(err(json!([{"parameterId": "x", "value": 1}, {"parameterId": "n", "value": 2.5}, {"parameterId": "opt", "value": "adam"}])).contains("whole number"));
        assert!(err(json!([{"parameterId": "x", "value": 1}, {"parameterId": "n", "value": 2}])).contains("\"opt\" is missing"));
        assert!(err(json!([{"parameterId": "x", "value": 1}, {"parameterId": "n", "value": 2}, {"parameterId": "opt", "value": "sgd"}])).contains("\"momentum\" is missing"));
        assert!(err(json!([{"parameterId": "x", "value": 1}, {"parameterId": "n", "value": 2}, {"parameterId": "opt", "value": "adam"}, {"parameterId": "momentum", "value": 0.9}])).contains("does not activate"));
        let sgd = parse_assignment(&e.params, &params(json!([{"parameterId": "x", "value": 1}, {"parameterId": "n", "value": 2}, {"parameterId": "opt", "value": "sgd"}, {"parameterId": "momentum", "value": 0.9}])), "p", true).expect("sgd");
        assert_eq!(sgd.len(), 4);
        // A context fixes top-level parameters without children.
        assert!(parse_assignment(&e.params, &params(json!([{"parameterId": "n", "value": 4}])), "c", false).is_ok());
        assert!(parse_assignment(&e.params, &params(json!([{"parameterId": "opt", "value": "sgd"}])), "c", false).is_err());
    }

    #[test]
    fn integer_parameters_render_as_integers() {
        let mut s = VizierStudy::new(3, "p".into(), "r".into(), 0);
        let e = engine(json!({}));
        let ids = suggest(&mut s, &e, 1, "w", 3);
        assert_eq!(ids, vec![1, 2, 3]);
        for t in s.render_trials(&ids) {
            let v = serde_json::to_value(&t).expect("json");
            let n = v["parameters"].as_array().and_then(|ps| ps.iter().find(|p| p["parameterId"] == "n")).cloned().expect("n");
            assert!(n["value"].is_i64(), "{n}");
            assert_eq!(v["state"], "ACTIVE");
            assert_eq!(v["clientId"], "w");
        }
    }

    #[test]
    fn a_client_gets_its_unfinished_trials_again() {
        let mut s = VizierStudy::new(3, "p".into(), "r".into(), 0);
        let e = engine(json!({}));
        let first = suggest(&mut s, &e, 1, "w1", 2);
        assert_eq!(s.suggest_begin(&e, 2, "w1", 1, Vec::new(), 3), Begin::Done { trials: first.clone() });
        let other = suggest(&mut s, &e, 3, "w2", 1);
        assert_eq!(other, vec![3]);
        for id in &first {
            s.add_measurement(*id, &m(1, &[("loss", 0.5)])).expect("measured");
            s.complete(&e, *id, None, false, "", 4).expect("completed");
        }
        assert_eq!(suggest(&mut s, &e, 4, "w1", 1), vec![4], "a new trial once the old ones ended");
    }

    #[test]
    fn a_second_pending_request_of_a_client_is_settled_with_the_first_ones_trials() {
        let mut s = VizierStudy::new(3, "p".into(), "r".into(), 0);
        let e = engine(json!({}));
        assert_eq!(s.suggest_begin(&e, 1, "w", 2, Vec::new(), 1), Begin::Compute);
        assert_eq!(s.suggest_begin(&e, 2, "w", 2, Vec::new(), 1), Begin::Compute, "the first is not computed yet");
        assert_eq!(s.settle(2), None, "nothing to settle with yet");
        let (done, pending) = s.tuner_inputs(&e);
        let r = tuner::suggest(&e.cfg.space, e.cfg.algorithm, e.cfg.goal, &done, &pending, 2, s.seed);
        let (first, _) = s.suggest_finish(1, r, 2).expect("first");
        let (again, p) = s.settle(2).expect("settled");
        assert_eq!((again, p.op), (first, 2));
        assert!(s.pending.is_empty());
    }

    #[test]
    fn complete_chooses_and_refuses() {
        let mut s = VizierStudy::new(3, "p".into(), "r".into(), 0);
        let e = engine(json!({"measurementSelectionType": "BEST_MEASUREMENT"}));
        let ids = suggest(&mut s, &e, 1, "w", 3);
        s.add_measurement(ids[0], &m(1, &[("loss", 0.5)])).expect("m");
        s.add_measurement(ids[0], &m(2, &[("loss", 0.2)])).expect("m");
        s.add_measurement(ids[0], &m(3, &[("loss", 0.4)])).expect("m");
        s.complete(&e, ids[0], None, false, "", 5).expect("complete");
        assert_eq!(s.trial(ids[0]).expect("t").final_measurement.as_ref().map(|m| m.step), Some(2), "best by MINIMIZE");
        let again = s.complete(&e, ids[0], None, false, "", 6).expect_err("twice");
        assert_eq!(again.code, trainyard_api::Code::FailedPrecondition);
        // No measurement at all: infeasible.
        s.complete(&e, ids[1], None, false, "", 6).expect("complete");
        assert_eq!(s.trial(ids[1]).expect("t").state, TrialState::Infeasible);
        // A final measurement without the objective is refused, naming the field.
        let err = s.complete(&e, ids[2], Some(&m(1, &[("acc", 1.0)])), false, "", 7).expect_err("no loss");
        assert!(err.message.starts_with("finalMeasurement.metrics"), "{}", err.message);
        assert!(s.add_measurement(ids[2], &m(1, &[("loss", f64::NAN)])).is_err());
        assert_eq!(s.complete(&e, 99, None, false, "", 7).expect_err("unknown").code, trainyard_api::Code::NotFound);
    }

    #[test]
    fn optimal_trials_single_and_pareto() {
        let mut s = VizierStudy::new(3, "p".into(), "r".into(), 0);
        let single = engine(json!({}));
        let ids = suggest(&mut s, &single, 1, "w", 3);
        for (id, loss) in ids.iter().zip([0.3, 0.1, 0.1]) {
            s.complete(&single, *id, Some(&m(1, &[("loss", loss), ("time", 10.0 * loss)])), false, "", 2).expect("c");
        }
        assert_eq!(s.optimal(&single), vec![ids[1], ids[2]], "ties for the best");
        let two = engine(json!({"metrics": [{"metricId": "loss", "goal": "MINIMIZE"}, {"metricId": "acc", "goal": "MAXIMIZE"}]}));
        let mut p = VizierStudy::new(4, "p".into(), "r".into(), 0);
        let ids = suggest(&mut p, &two, 1, "w", 4);
        for (id, (loss, acc)) in ids.iter().zip([(0.1, 0.5), (0.2, 0.9), (0.3, 0.4), (0.1, 0.6)]) {
            p.complete(&two, *id, Some(&m(1, &[("loss", loss), ("acc", acc)])), false, "", 2).expect("c");
        }
        assert_eq!(p.optimal(&two), vec![ids[1], ids[3]], "the Pareto front");
    }

    /// `safetyConfig`: an unsafe trial (its safety metric worse than the threshold) is
    /// infeasible to the optimiser and never among the optimal trials, even when its
    /// objective is the best.
    #[test]
    fn unsafe_trials_are_infeasible_and_not_optimal() {
        let e = engine(json!({"metrics": [
            {"metricId": "loss", "goal": "MINIMIZE"},
            {"metricId": "memory_gb", "goal": "MINIMIZE", "safetyConfig": {"safetyThreshold": 16}}
        ]}));
        assert_eq!(e.objectives.len(), 1, "a safety metric is not an objective");
        let mut s = VizierStudy::new(3, "p".into(), "r".into(), 0);
        let ids = suggest(&mut s, &e, 1, "w", 3);
        for (id, (loss, mem)) in ids.iter().zip([(0.05, 40.0), (0.2, 8.0), (0.3, 16.0)]) {
            s.complete(&e, *id, Some(&m(1, &[("loss", loss), ("memory_gb", mem)])), false, "", 2).expect("c");
        }
        assert_eq!(s.optimal(&e), vec![ids[1]], "the best loss is unsafe (40 GB > 16 GB); 16 GB is at the threshold, safe");
        let (done, _, goal) = s.suggest_inputs(&e);
        assert_eq!(goal, tuner::Goal::Minimize);
        let values: Vec<Option<f64>> = done.iter().map(|t| t.value).collect();
        assert_eq!(values, vec![None, Some(0.2), Some(0.3)]);
    }

    /// Several objectives: the optimiser maximises a ParEGO scalarisation in [0, 1.05]
    /// whose weights change from suggestion to suggestion; a dominated trial scores below
    /// the trial that dominates it whatever the weights.
    #[test]
    fn several_objectives_are_scalarised_for_the_optimiser() {
        let e = engine(json!({"metrics": [{"metricId": "loss", "goal": "MINIMIZE"}, {"metricId": "acc", "goal": "MAXIMIZE"}]}));
        let mut s = VizierStudy::new(4, "p".into(), "r".into(), 0);
        let ids = suggest(&mut s, &e, 1, "w", 4);
        for (id, (loss, acc)) in ids.iter().zip([(0.1, 0.5), (0.2, 0.9), (0.3, 0.4), (0.1, 0.6)]) {
            s.complete(&e, *id, Some(&m(1, &[("loss", loss), ("acc", acc)])), false, "", 2).expect("c");
        }
        let mut seen = Vec::new();
        for extra in 0..6 {
            let (done, _, goal) = s.suggest_inputs(&e);
            assert_eq!(goal, tuner::Goal::Maximize);
            let v: Vec<f64> = done.iter().map(|t| t.value.expect("every trial has both")).collect();
            assert!(v.iter().all(|x| (0.0..=1.05).contains(x)), "{v:?}");
            // Trial 4 (0.1, 0.6) dominates trials 1 (0.1, 0.5) and 3 (0.3, 0.4).
            assert!(v[3] >= v[0] && v[3] > v[2], "{v:?}");
            seen.push(v);
            // One more (unfinished) trial: the next suggestion draws other weights.
            let more = suggest(&mut s, &e, 10 + extra, &format!("c{extra}"), 1);
            assert_eq!(more.len(), 1);
        }
        seen.dedup();
        assert!(seen.len() > 1, "the weights change between suggestions");
    }

    /// `convexAutomatedStoppingSpec`: a trial whose learning curve, extended in a straight
    /// line, stays below the best completed trial is stopped, and the rule's prediction
    /// for its end is added as its last measurement (at the horizon's step).
    #[test]
    fn early_stopping_by_the_convex_rule_adds_its_prediction() {
        let e = engine(json!({
            "metrics": [{"metricId": "acc", "goal": "MAXIMIZE"}],
            "convexAutomatedStoppingSpec": {"maxStepCount": "100", "minMeasurementCount": "3"}
        }));
        let mut s = VizierStudy::new(3, "p".into(), "r".into(), 0);
        let ids = suggest(&mut s, &e, 1, "w", 5);
        for id in &ids[..4] {
            for (step, acc) in [(10, 0.5), (50, 0.8), (100, 0.9)] {
                s.add_measurement(*id, &m(step, &[("acc", acc)])).expect("m");
            }
            s.complete(&e, *id, None, false, "", 2).expect("c");
        }
        let slow = ids[4];
        for (step, acc) in [(10, 0.4), (20, 0.405), (30, 0.41)] {
            s.add_measurement(slow, &m(step, &[("acc", acc)])).expect("m");
        }
        assert!(s.check_early_stopping(&e, slow).expect("check"));
        let t = s.trials.iter().find(|t| t.id == slow).expect("trial");
        let last = t.measurements.last().expect("a prediction");
        assert_eq!(last.step, 100);
        let v = last.value("acc").expect("acc");
        assert!((0.41..=0.445).contains(&v), "{v}");
        // Completed without a final measurement: the prediction is its final one.
        s.complete(&e, slow, None, false, "", 3).expect("c");
        let t = s.trials.iter().find(|t| t.id == slow).expect("trial");
        assert_eq!(t.final_measurement.as_ref().map(|m| m.step), Some(100));
    }

    #[test]
    fn early_stopping_by_the_median_rule() {
        let e = engine(json!({"medianAutomatedStoppingSpec": {}}));
        let mut s = VizierStudy::new(3, "p".into(), "r".into(), 0);
        let ids = suggest(&mut s, &e, 1, "w", 4);
        for id in &ids[..3] {
            s.add_measurement(*id, &m(1, &[("loss", 0.1)])).expect("m");
            s.complete(&e, *id, None, false, "", 2).expect("c");
        }
        s.add_measurement(ids[3], &m(1, &[("loss", 0.9)])).expect("m");
        assert!(s.check_early_stopping(&e, ids[3]).expect("check"));
        assert_eq!(s.trial(ids[3]).expect("t").state, TrialState::Stopping);
        let none = engine(json!({}));
        let mut t = VizierStudy::new(5, "p".into(), "r".into(), 0);
        let ids = suggest(&mut t, &none, 1, "w", 1);
        assert!(!t.check_early_stopping(&none, ids[0]).expect("check"));
        t.stop(ids[0]).expect("stop");
        assert!(t.check_early_stopping(&none, ids[0]).expect("check"), "a stopped trial should stop");
    }

    #[test]
    fn requested_trials_are_handed_out_first_and_max_num_trials_completes() {
        let e = engine(json!({"studyStoppingConfig": {"maxNumTrials": 3}}));
        let mut s = VizierStudy::new(3, "p".into(), "r".into(), 0);
        let t: ApiTrial = serde_json::from_value(json!({"parameters": [{"parameterId": "x", "value": 0}, {"parameterId": "n", "value": 1}, {"parameterId": "opt", "value": "adam"}]})).expect("t");
        let created = s.create_trial(&e, &t, 1).expect("created");
        assert_eq!(s.trial(created).expect("t").state, TrialState::Requested);
        assert_eq!(s.create_trial(&e, &t, 1).expect_err("twice").code, trainyard_api::Code::AlreadyExists);
        let got = suggest(&mut s, &e, 1, "w", 3);
        assert_eq!(got, vec![created, 2, 3]);
        assert_eq!(s.suggest_begin(&e, 2, "w2", 1, Vec::new(), 2), Begin::Done { trials: Vec::new() });
        assert_eq!(s.phase, Phase::Completed);
    }

    #[test]
    fn grid_search_exhaustion_completes_the_study() {
        let study: ApiStudy = serde_json::from_value(json!({"displayName": "g", "studySpec": {
            "metrics": [{"metricId": "m", "goal": "MAXIMIZE"}],
            "parameters": [{"parameterId": "k", "integerValueSpec": {"minValue": 1, "maxValue": 2}}],
            "algorithm": "GRID_SEARCH"}})).expect("study");
        let e = Engine::new(&study).expect("engine");
        let mut s = VizierStudy::new(3, "p".into(), "r".into(), 0);
        let got = suggest(&mut s, &e, 1, "w", 5);
        assert_eq!(got.len(), 2);
        assert_eq!(s.phase, Phase::Completed);
    }

    #[test]
    fn bad_specs_name_the_field() {
        let bad = |spec: Value| {
            let study: ApiStudy = serde_json::from_value(json!({"displayName": "s", "studySpec": spec})).expect("study");
            Engine::new(&study).expect_err("refused").message
        };
        assert!(bad(json!({"parameters": [{"parameterId": "x", "doubleValueSpec": {"minValue": 0, "maxValue": 1}}]})).contains("studySpec.metrics"));
        assert!(bad(json!({"metrics": [{"metricId": "m", "goal": "MAXIMIZE"}], "parameters": [{"parameterId": "x", "doubleValueSpec": {"minValue": 2, "maxValue": 1}}]})).contains("studySpec.parameters[0]"));
    }

    /// The state is stored as JSON and read back before every change.
    #[test]
    fn stored_state_reads_back() {
        let e = engine(json!({}));
        let mut s = VizierStudy::new(3, "p".into(), "r".into(), 0);
        let ids = suggest(&mut s, &e, 1, "w", 2);
        s.add_measurement(ids[0], &Measurement { elapsed_duration: Some(Duration::from_millis(1500)), ..m(7, &[("loss", 0.1 + 0.2)]) }).expect("m");
        let back: VizierStudy = serde_json::from_str(&serde_json::to_string(&s).expect("ser")).expect("de");
        assert_eq!(back, s);
    }
}
