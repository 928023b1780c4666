//! Vizier studies in the driver: each request reads the study's record, applies one change
//! of the pure state machine (`crate::kinds::studies`) and commits it with the Operation that
//! answers it, in one transaction, before the answer goes out. The optimiser's
//! suggestions are computed on a thread of their own, one request of a study at a time,
//! so that a long fit never holds up the lifecycle of jobs; the pending request is stored
//! first, so a restart computes it again.

use trainyard_api::hptuning::{Measurement, Trial as ApiTrial};
use trainyard_api::operation::GenericOperationMetadata;
use trainyard_api::vizier::{self as wire, Study as ApiStudy};
use trainyard_store::OtherState;
use trainyard_tuner as tuner;

use super::*;
use crate::kinds::studies::{parse_contexts, study_name as vizier_study_name, Begin, Engine, VizierStudy, MAX_SUGGESTIONS};

/// The store's kind of a Vizier study.
pub const KIND_VIZIER: &str = "vizier";

/// A Vizier request for the driver, under `projects/{project}/locations/{region}`.
pub struct VizierCall {
    pub project: String,
    pub region: String,
    pub op: VizierOp,
}

/// The writes of the Vizier API (reads go to the store's read connections).
pub enum VizierOp {
    CreateStudy(Box<ApiStudy>),
    DeleteStudy(u64),
    Suggest { study: u64, request: Box<wire::SuggestTrialsRequest> },
    CreateTrial { study: u64, trial: Box<ApiTrial> },
    Measure { study: u64, trial: u64, measurement: Box<Measurement> },
    Complete { study: u64, trial: u64, request: Box<wire::CompleteTrialRequest> },
    CheckEarlyStopping { study: u64, trial: u64 },
    Stop { study: u64, trial: u64 },
    DeleteTrial { study: u64, trial: u64 },
}

/// The driver's answer: the body, and for an Operation that is not done yet, where its
/// done body is sent once it is stored.
pub struct VizierAnswer {
    pub body: serde_json::Value,
    pub done: Option<tokio::sync::oneshot::Receiver<serde_json::Value>>,
}

impl VizierAnswer {
    fn now(body: serde_json::Value) -> VizierAnswer {
        VizierAnswer { body, done: None }
    }
}

/// The optimiser's answer for a pending suggest request.
pub type Suggested = Result<Vec<tuner::Assignment>, tuner::TunerError>;

/// A study as read from the store.
struct Loaded {
    resource: ApiStudy,
    engine: Engine,
    study: VizierStudy,
}

/// A Vizier study's record, read: its resource, engine and state, or why not.
fn read_record(id: u64, resource: &str, core: &str) -> Result<Loaded, String> {
    let resource: ApiStudy = serde_json::from_str(resource).map_err(|e| format!("its resource: {e}"))?;
    let engine = Engine::new(&resource).map_err(|e| format!("its study spec: {}", e.message))?;
    let study: VizierStudy = serde_json::from_str(core).map_err(|e| format!("its state: {e}"))?;
    if study.id != id {
        return Err(format!("its state is that of study {}", study.id));
    }
    Ok(Loaded { resource, engine, study })
}

fn ts(t: Micros) -> Timestamp {
    Timestamp::from_micros(t)
}

fn encode(v: &impl serde::Serialize) -> Result<String, StoreError> {
    serde_json::to_string(v).map_err(StoreError::Encode)
}

/// A suggest Operation: not done (`trials` None), done with trials, or done with an error.
fn suggest_op(st: &VizierStudy, op: u64, client: &str, start: Micros, now: Micros, outcome: Option<Result<&[u64], &ApiError>>) -> serde_json::Value {
    let metadata = wire::SuggestTrialsMetadata {
        generic_metadata: Some(GenericOperationMetadata { partial_failures: Vec::new(), create_time: Some(ts(start)), update_time: Some(ts(now)) }),
        client_id: client.to_string(),
    };
    let mut o = trainyard_api::Operation {
        name: format!("{}/operations/{op}", st.name()),
        metadata: Some(wire::to_any(wire::SUGGEST_TRIALS_METADATA_TYPE, &metadata)),
        ..Default::default()
    };
    match outcome {
        None => {}
        Some(Ok(trials)) => {
            o.done = true;
            let response = wire::SuggestTrialsResponse {
                trials: st.render_trials(trials),
                study_state: st.phase.api(),
                start_time: Some(ts(start)),
                end_time: Some(ts(now)),
            };
            o.response = Some(wire::to_any(wire::SUGGEST_TRIALS_RESPONSE_TYPE, &response));
        }
        Some(Err(e)) => {
            o.done = true;
            o.error = Some(trainyard_api::Status { code: e.code.number(), message: e.message.clone(), details: Vec::new() });
        }
    }
    serde_json::to_value(o).unwrap_or_default()
}

impl Driver {
    pub(super) fn vizier(&mut self, call: VizierCall, now: Micros) -> Result<VizierAnswer, ApiError> {
        let VizierCall { project, region, op } = call;
        let (p, r) = (project.as_str(), region.as_str());
        match op {
            VizierOp::CreateStudy(study) => self.vizier_create(p, r, *study, now).map(VizierAnswer::now),
            VizierOp::DeleteStudy(id) => self.vizier_delete(p, r, id).map(VizierAnswer::now),
            VizierOp::Suggest { study, request } => self.vizier_suggest(p, r, study, *request, now),
            VizierOp::CreateTrial { study, trial } => self
                .vizier_change(p, r, study, now, 0, |l, _| {
                    let id = l.study.create_trial(&l.engine, &trial, now)?;
                    Ok((trial_json(&l.study, id)?, Vec::new()))
                })
                .map(VizierAnswer::now),
            VizierOp::Measure { study, trial, measurement } => self
                .vizier_change(p, r, study, now, 0, |l, _| {
                    l.study.add_measurement(trial, &measurement)?;
                    Ok((trial_json(&l.study, trial)?, Vec::new()))
                })
                .map(VizierAnswer::now),
            VizierOp::Complete { study, trial, request } => self
                .vizier_change(p, r, study, now, 0, |l, _| {
                    let req = &request;
                    l.study.complete(&l.engine, trial, req.final_measurement.as_ref(), req.trial_infeasible, &req.infeasible_reason, now)?;
                    Ok((trial_json(&l.study, trial)?, Vec::new()))
                })
                .map(VizierAnswer::now),
            VizierOp::Stop { study, trial } => self
                .vizier_change(p, r, study, now, 0, |l, _| {
                    l.study.stop(trial)?;
                    Ok((trial_json(&l.study, trial)?, Vec::new()))
                })
                .map(VizierAnswer::now),
            VizierOp::DeleteTrial { study, trial } => self
                .vizier_change(p, r, study, now, 0, |l, _| {
                    l.study.delete_trial(trial)?;
                    Ok((serde_json::json!({}), Vec::new()))
                })
                .map(VizierAnswer::now),
            VizierOp::CheckEarlyStopping { study, trial } => self
                .vizier_change(p, r, study, now, 1, |l, ops| {
                    let should_stop = l.study.check_early_stopping(&l.engine, trial)?;
                    let metadata = wire::CheckTrialEarlyStoppingStateMetatdata {
                        generic_metadata: Some(GenericOperationMetadata { partial_failures: Vec::new(), create_time: Some(ts(now)), update_time: Some(ts(now)) }),
                        study: l.study.name(),
                        trial: trial.to_string(),
                    };
                    let op = trainyard_api::Operation {
                        name: format!("{}/trials/{trial}/operations/{}", l.study.name(), ops[0]),
                        metadata: Some(wire::to_any(wire::CHECK_EARLY_STOPPING_METADATA_TYPE, &metadata)),
                        done: true,
                        response: Some(wire::to_any(wire::CHECK_EARLY_STOPPING_RESPONSE_TYPE, &wire::CheckTrialEarlyStoppingStateResponse { should_stop })),
                        error: None,
                    };
                    let body = serde_json::to_value(&op).map_err(|e| ApiError::internal(format!("the operation: {e}")))?;
                    Ok((body.clone(), vec![(ops[0], body.to_string())]))
                })
                .map(VizierAnswer::now),
        }
    }

    /// The study `id` under its parent, read: 404 when there is none, an internal error
    /// naming the damage when its record cannot be read.
    fn vizier_load(&self, project: &str, region: &str, id: u64) -> Result<Loaded, ApiError> {
        let row = self.store.get_other(KIND_VIZIER, project, region, id).map_err(|e| self.store_err(e))?;
        let Some((_, resource, core)) = row else {
            return Err(ApiError::not_found(format!("The Study \"{}\" does not exist.", vizier_study_name(project, region, id))));
        };
        read_record(id, &resource, &core).map_err(|damage| {
            tracing::error!("study {id}: the stored record is damaged ({damage})");
            ApiError::internal(format!("Internal error: the stored record of this study is damaged and cannot be read ({damage}); delete the study."))
        })
    }

    /// Read study `id`, apply `change` (given the ids of `new_ops` new operations; it
    /// returns the answer and the operation bodies to write) and commit the result with
    /// those operations in one transaction. A refused change writes nothing.
    fn vizier_change<T>(
        &mut self,
        project: &str,
        region: &str,
        id: u64,
        now: Micros,
        new_ops: usize,
        change: impl FnOnce(&mut Loaded, &[u64]) -> Result<(T, Vec<(u64, String)>), ApiError>,
    ) -> Result<T, ApiError> {
        let mut loaded = self.vizier_load(project, region, id)?;
        let mut outcome: Option<Result<T, ApiError>> = None;
        let committed = Driver::timed(&self.metrics, "commit_other", || {
            self.store.commit_other_ops(id, (project, region), now, new_ops, |ops| match change(&mut loaded, ops) {
                Ok((answer, bodies)) => {
                    outcome = Some(Ok(answer));
                    Ok(Some(OtherState {
                        state: loaded.study.state_name().to_string(),
                        terminal: loaded.study.pending.is_empty(),
                        core: encode(&loaded.study)?,
                        ops: bodies,
                    }))
                }
                Err(e) => {
                    outcome = Some(Err(e));
                    Ok(None)
                }
            })
        });
        committed.map_err(|e| self.store_err(e))?;
        outcome.unwrap_or_else(|| Err(ApiError::internal("the study change was not made")))
    }

    fn vizier_create(&mut self, project: &str, region: &str, mut study: ApiStudy, now: Micros) -> Result<serde_json::Value, ApiError> {
        served_region(region, &self.svc.cfg.region)?;
        Engine::new(&study)?;
        study.name.clear();
        if let Some((other, _, _)) =
            self.store.find_other_by_name(KIND_VIZIER, project, region, &study.display_name).map_err(|e| self.store_err(e))?
        {
            return Err(ApiError::already_exists(format!(
                "A study with displayName \"{}\" exists already: {}.",
                study.display_name,
                vizier_study_name(project, region, other)
            )));
        }
        let text = serde_json::to_string(&study).map_err(|e| ApiError::internal(format!("encoding the study: {e}")))?;
        let (p, r) = (project.to_string(), region.to_string());
        let mut state = None;
        let id = self
            .store
            .insert_other(
                &NewJob { kind: KIND_VIZIER, project, region, display_name: &study.display_name, labels: &[], resource: &text },
                "ACTIVE",
                now,
                |id| {
                    let st = VizierStudy::new(id, p, r, now);
                    let core = serde_json::to_string(&st).unwrap_or_default();
                    state = Some(st);
                    core
                },
            )
            .map_err(|e| self.store_err(e))?;
        tracing::info!("study {id} created: {:?}", study.display_name);
        let st = state.unwrap_or_else(|| VizierStudy::new(id, project.to_string(), region.to_string(), now));
        serde_json::to_value(st.render(&study)).map_err(|e| ApiError::internal(format!("the study: {e}")))
    }

    /// `studies.delete`, whatever the study's state (a damaged record included); a pending
    /// suggest request is answered with an error.
    fn vizier_delete(&mut self, project: &str, region: &str, id: u64) -> Result<serde_json::Value, ApiError> {
        let row = self.store.get_other(KIND_VIZIER, project, region, id).map_err(|e| self.store_err(e))?;
        let Some((_, _, core)) = row else {
            return Err(ApiError::not_found(format!("The Study \"{}\" does not exist.", vizier_study_name(project, region, id))));
        };
        let now = self.now();
        let gone = ApiError::new(trainyard_api::Code::Aborted, "The study was deleted before the suggestions were made.");
        let answered: Vec<(u64, serde_json::Value)> = match serde_json::from_str::<VizierStudy>(&core) {
            Ok(st) => st
                .pending
                .iter()
                .map(|p| (p.op, suggest_op(&st, p.op, &p.client_id, p.start, now, Some(Err(&gone)))))
                .collect(),
            Err(_) => Vec::new(),
        };
        let bodies: Vec<(u64, String)> = answered.iter().map(|(op, b)| (*op, b.to_string())).collect();
        let deleted = self.store.delete_other(KIND_VIZIER, project, region, id, &bodies).map_err(|e| self.store_err(e))?;
        if !deleted {
            return Err(ApiError::not_found(format!("The Study \"{}\" does not exist.", vizier_study_name(project, region, id))));
        }
        for (op, body) in answered {
            self.vizier_notify(op, body);
        }
        // Its suggestion under way stops (its answer, a cancellation, finds no study).
        self.exec.submit(crate::executor::Work::CancelSuggest { study: id, vizier: true });
        tracing::info!("study {id} deleted");
        Ok(serde_json::json!({}))
    }

    fn vizier_suggest(&mut self, project: &str, region: &str, id: u64, request: wire::SuggestTrialsRequest, now: Micros) -> Result<VizierAnswer, ApiError> {
        let wire::SuggestTrialsRequest { suggestion_count: count, client_id: client, contexts, .. } = request;
        if !(1..=MAX_SUGGESTIONS).contains(&count) {
            return Err(ApiError::invalid_argument(format!("suggestionCount must be between 1 and {MAX_SUGGESTIONS}, got {count}.")));
        }
        let mut computing = false;
        let body = self.vizier_change(project, region, id, now, 1, |l, ops| {
            let contexts = parse_contexts(&l.engine, &contexts)?;
            let op = ops[0];
            let begin = l.study.suggest_begin(&l.engine, op, &client, count as usize, contexts, now);
            let body = match &begin {
                Begin::Done { trials } => suggest_op(&l.study, op, &client, now, now, Some(Ok(trials))),
                Begin::Compute => suggest_op(&l.study, op, &client, now, now, None),
            };
            computing = begin == Begin::Compute;
            Ok((body.clone(), vec![(op, body.to_string())]))
        })?;
        if !computing {
            return Ok(VizierAnswer::now(body));
        }
        let op = op_id(&body);
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.vizier_waiters.entry(op).or_default().push(tx);
        self.vizier_start(project, region, id);
        Ok(VizierAnswer { body, done: Some(rx) })
    }

    /// Start computing the first pending suggest request of study `id`, unless one of its
    /// requests is being computed already.
    fn vizier_start(&mut self, project: &str, region: &str, id: u64) {
        if self.vizier_running.contains_key(&id) {
            return;
        }
        let loaded = loop {
            let loaded = match self.vizier_load(project, region, id) {
                Ok(l) => l,
                Err(e) => {
                    tracing::error!("study {id}: cannot compute its suggestions: {}", e.message);
                    return;
                }
            };
            let Some(op) = loaded.study.pending.first().map(|p| p.op) else { return };
            if loaded.study.clone().settle(op).is_none() {
                break loaded;
            }
            // A request whose client got trials meanwhile is answered with them.
            let now = self.now();
            let mut answer = None;
            let settled = self.vizier_change(project, region, id, now, 0, |l, _| {
                let (trials, p) = l.study.settle(op).ok_or_else(|| ApiError::not_found("not settled"))?;
                let body = suggest_op(&l.study, op, &p.client_id, p.start, now, Some(Ok(&trials)));
                answer = Some(body.clone());
                Ok(((), vec![(op, body.to_string())]))
            });
            match (settled, answer) {
                (Ok(()), Some(body)) => self.vizier_notify(op, body),
                (Err(e), _) if e.code == trainyard_api::Code::NotFound => break loaded,
                (Err(e), _) => {
                    tracing::error!("study {id}: suggest operation {op}: {}", e.message);
                    return;
                }
                (Ok(()), None) => return,
            }
        };
        let Some(pending) = loaded.study.pending.first() else { return };
        let (completed, handed_out, goal) = loaded.study.suggest_inputs(&loaded.engine);
        let (op, count, seed) = (pending.op, pending.count, loaded.study.seed);
        let cfg = &loaded.engine.cfg;
        let request = crate::kinds::tuning_jobs::SuggestRequest {
            space: cfg.space.clone(),
            algorithm: cfg.algorithm,
            goal,
            completed,
            pending: handed_out,
            count,
            seed,
            noise: cfg.noise,
        };
        self.vizier_running.insert(id, (project.to_string(), region.to_string(), op));
        // On the project's suggestion threads (see `tenant_work`): one project's studies
        // never hold up another's, and deleting the study stops it.
        self.exec.submit(crate::executor::Work::VizierSuggest { study: id, op, project: project.to_string(), request: Box::new(request) });
    }

    /// The optimiser answered suggest request `op` of study `id`: its trials and the done
    /// Operation are stored together, then its waiters hear of it and the study's next
    /// request is started.
    pub(super) fn vizier_suggested(&mut self, id: u64, op: u64, result: Suggested, now: Micros) {
        let running = self.vizier_running.get(&id).cloned();
        // A result for another request than the one running comes from before a resync;
        // it is still the study's answer if that request is pending (the optimiser is
        // deterministic), and ignored otherwise.
        let place = match running {
            Some((p, r, running_op)) => {
                if running_op == op {
                    self.vizier_running.remove(&id);
                }
                Some((p, r))
            }
            None => None,
        };
        let place = match place {
            Some(pr) => pr,
            None => match self.store.active_other(KIND_VIZIER) {
                Ok(rows) => match rows.into_iter().find(|(i, _, _)| *i == id).and_then(|(_, _, core)| serde_json::from_str::<VizierStudy>(&core).ok()) {
                    Some(st) => (st.project, st.region),
                    None => return,
                },
                Err(e) => {
                    self.store_err(e);
                    return;
                }
            },
        };
        let (project, region) = place;
        let mut answer = None;
        let done = self.vizier_change(&project, &region, id, now, 0, |l, _| {
            let Some(client) = l.study.pending.iter().find(|p| p.op == op).map(|p| (p.client_id.clone(), p.start)) else {
                return Err(ApiError::not_found("no longer pending"));
            };
            let Some((trials, error)) = l.study.suggest_finish(op, result, now) else {
                return Err(ApiError::not_found("no longer pending"));
            };
            if let Some(e) = &error {
                tracing::error!("study {id}: suggest operation {op}: {}", e.message);
            }
            let outcome = match &error {
                Some(e) => Err(e),
                None => Ok(trials.as_slice()),
            };
            let body = suggest_op(&l.study, op, &client.0, client.1, now, Some(outcome));
            answer = Some(body.clone());
            Ok(((), vec![(op, body.to_string())]))
        });
        match (done, answer) {
            (Ok(()), Some(body)) => self.vizier_notify(op, body),
            (Err(e), _) if e.code != trainyard_api::Code::NotFound => tracing::error!("study {id}: storing suggestions: {}", e.message),
            _ => {}
        }
        self.vizier_start(&project, &region, id);
    }

    fn vizier_notify(&mut self, op: u64, body: serde_json::Value) {
        for w in self.vizier_waiters.remove(&op).unwrap_or_default() {
            let _ = w.send(body.clone());
        }
    }

    /// After a start: the suggest requests that were pending are computed again.
    pub(super) fn recover_vizier(&mut self) -> Result<(), StoreError> {
        self.vizier_running.clear();
        self.vizier_waiters.clear();
        for (id, _, core) in self.store.active_other(KIND_VIZIER)? {
            match serde_json::from_str::<VizierStudy>(&core) {
                Ok(st) if !st.pending.is_empty() => {
                    tracing::info!("study {id}: computing {} pending suggest request(s) again", st.pending.len());
                    self.vizier_start(&st.project, &st.region, id);
                }
                Ok(_) => {}
                Err(e) => tracing::error!("study {id}: the stored record is damaged ({e}); its pending suggestions are not computed"),
            }
        }
        Ok(())
    }
}

/// A trial as the API shows it, as JSON.
fn trial_json(st: &VizierStudy, id: u64) -> Result<serde_json::Value, ApiError> {
    serde_json::to_value(st.render_trial(st.trial(id)?)).map_err(|e| ApiError::internal(format!("the trial: {e}")))
}

/// The id at the end of an Operation's name.
fn op_id(body: &serde_json::Value) -> u64 {
    body["name"].as_str().and_then(|n| n.rsplit('/').next()).and_then(|s| s.parse().ok()).unwrap_or(0)
}

/// A stored Vizier study as the API shows it, or the error that says its record is
/// damaged (for the readers).
pub fn render_vizier_study(id: u64, resource: &str, core: &str) -> Result<serde_json::Value, String> {
    let l = read_record(id, resource, core)?;
    serde_json::to_value(l.study.render(&l.resource)).map_err(|e| e.to_string())
}

/// A stored Vizier study, read (for the readers): its resource, engine and state.
pub fn read_vizier_study(id: u64, resource: &str, core: &str) -> Result<(ApiStudy, Engine, VizierStudy), String> {
    read_record(id, resource, core).map(|l| (l.resource, l.engine, l.study))
}
