//! The Vizier service (`google.cloud.aiplatform.v1.VizierService`): `Study` and the
//! request and response messages of its methods. A study's trials are [`crate::Trial`]s
//! and their measurements [`crate::Measurement`]s, as in a HyperparameterTuningJob.

use serde::{Deserialize, Serialize};

use crate::error::ApiError;
use crate::hptuning::{Measurement, StudySpec, Trial, TrialParameter};
use crate::operation::GenericOperationMetadata;
use crate::types::Timestamp;

/// `@type` of the response of a suggest operation.
pub const SUGGEST_TRIALS_RESPONSE_TYPE: &str = "type.googleapis.com/google.cloud.aiplatform.v1.SuggestTrialsResponse";
/// `@type` of the metadata of a suggest operation.
pub const SUGGEST_TRIALS_METADATA_TYPE: &str = "type.googleapis.com/google.cloud.aiplatform.v1.SuggestTrialsMetadata";
/// `@type` of the response of an early-stopping check.
pub const CHECK_EARLY_STOPPING_RESPONSE_TYPE: &str =
    "type.googleapis.com/google.cloud.aiplatform.v1.CheckTrialEarlyStoppingStateResponse";
/// `@type` of the metadata of an early-stopping check (the proto's own spelling).
pub const CHECK_EARLY_STOPPING_METADATA_TYPE: &str =
    "type.googleapis.com/google.cloud.aiplatform.v1.CheckTrialEarlyStoppingStateMetatdata";

proto_enum! {
    /// `Study.State`.
    pub enum StudyState ("google.cloud.aiplatform.v1.Study.State") default Unspecified {
        Unspecified = 0 => "STATE_UNSPECIFIED",
        Active = 1 => "ACTIVE",
        Inactive = 2 => "INACTIVE",
        Completed = 3 => "COMPLETED",
    }
}

/// `google.cloud.aiplatform.v1.Study`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Study {
    /// `projects/{p}/locations/{l}/studies/{id}` (output only).
    #[serde(skip_serializing_if = "String::is_empty")]
    #[cfg_attr(feature = "schema", schemars(extend("readOnly" = true)))]
    pub name: String,
    /// Required, unique among the studies of a location.
    #[serde(alias = "display_name", skip_serializing_if = "String::is_empty")]
    pub display_name: String,
    /// Metrics, parameters, algorithm and stopping rules.
    #[serde(alias = "study_spec")]
    pub study_spec: StudySpec,
    /// Output only.
    #[serde(skip_serializing_if = "StudyState::is_unspecified")]
    #[cfg_attr(feature = "schema", schemars(extend("readOnly" = true)))]
    pub state: StudyState,
    /// Output only.
    #[serde(alias = "create_time", skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(extend("readOnly" = true)))]
    pub create_time: Option<Timestamp>,
    /// Output only: why the study is INACTIVE.
    #[serde(alias = "inactive_reason", skip_serializing_if = "String::is_empty")]
    #[cfg_attr(feature = "schema", schemars(extend("readOnly" = true)))]
    pub inactive_reason: String,
}

/// Parses a create-Study body with the service's error text; output-only fields are
/// cleared. Does not validate the study spec (see
/// [`crate::validate::validate_study_spec`]).
pub fn parse_study(body: &[u8]) -> Result<Study, ApiError> {
    let mut study: Study = crate::json::from_body(body, "study")?;
    study.name.clear();
    study.state = StudyState::Unspecified;
    study.create_time = None;
    study.inactive_reason.clear();
    Ok(study)
}

/// Answer of `studies.list`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ListStudiesResponse {
    /// The page.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub studies: Vec<Study>,
    /// Absent on the last page.
    #[serde(alias = "next_page_token", skip_serializing_if = "String::is_empty")]
    pub next_page_token: String,
}

/// Body of `studies:lookup`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct LookupStudyRequest {
    /// The parent (taken from the path when given in the body too).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub parent: String,
    /// The study's display name.
    #[serde(alias = "display_name", skip_serializing_if = "String::is_empty")]
    pub display_name: String,
}

/// `TrialContext`: a slice of the search space a suggestion must lie in.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct TrialContext {
    /// Free text.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub description: String,
    /// Values the suggested trial takes.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub parameters: Vec<TrialParameter>,
}

/// Body of `trials:suggest`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct SuggestTrialsRequest {
    /// The study (taken from the path).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub parent: String,
    /// Required, positive.
    #[cfg_attr(feature = "schema", schemars(with = "crate::schema::Int32"))]
    #[serde(alias = "suggestion_count", with = "crate::json::int32", skip_serializing_if = "crate::json::is_zero_i32")]
    pub suggestion_count: i32,
    /// Required: the worker asking. Its trials that have not ended are answered again.
    #[serde(alias = "client_id", skip_serializing_if = "String::is_empty")]
    pub client_id: String,
    /// Optional slices of the search space.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub contexts: Vec<TrialContext>,
}

/// `SuggestTrialsResponse`, the response of a suggest operation.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct SuggestTrialsResponse {
    /// The trials for the client.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub trials: Vec<Trial>,
    /// The study's state after the suggestion.
    #[serde(alias = "study_state", skip_serializing_if = "StudyState::is_unspecified")]
    pub study_state: StudyState,
    /// When the operation started.
    #[serde(alias = "start_time", skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Timestamp>,
    /// When it ended.
    #[serde(alias = "end_time", skip_serializing_if = "Option::is_none")]
    pub end_time: Option<Timestamp>,
}

/// `SuggestTrialsMetadata`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct SuggestTrialsMetadata {
    /// Times of the operation.
    #[serde(alias = "generic_metadata", skip_serializing_if = "Option::is_none")]
    pub generic_metadata: Option<GenericOperationMetadata>,
    /// The client that asked.
    #[serde(alias = "client_id", skip_serializing_if = "String::is_empty")]
    pub client_id: String,
}

/// Body of `{trial}:addTrialMeasurement`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct AddTrialMeasurementRequest {
    /// The trial (taken from the path).
    #[serde(alias = "trial_name", skip_serializing_if = "String::is_empty")]
    pub trial_name: String,
    /// Required.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub measurement: Option<Measurement>,
}

/// Body of `{trial}:complete`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct CompleteTrialRequest {
    /// The trial (taken from the path).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// The measurement that counts; without it one of the trial's measurements is chosen
    /// (by the study's measurementSelectionType).
    #[serde(alias = "final_measurement", skip_serializing_if = "Option::is_none")]
    pub final_measurement: Option<Measurement>,
    /// The trial could not be evaluated.
    #[serde(alias = "trial_infeasible", skip_serializing_if = "crate::json::is_false")]
    pub trial_infeasible: bool,
    /// Why, when infeasible.
    #[serde(alias = "infeasible_reason", skip_serializing_if = "String::is_empty")]
    pub infeasible_reason: String,
}

/// Bodies with nothing but the resource's name (`:stop`, `:checkTrialEarlyStoppingState`,
/// `trials:listOptimalTrials`): the name, when given, is taken from the path.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct NameOnlyRequest {
    /// `name` (`:stop`).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// `trialName` (`:checkTrialEarlyStoppingState`).
    #[serde(alias = "trial_name", skip_serializing_if = "String::is_empty")]
    pub trial_name: String,
    /// `parent` (`trials:listOptimalTrials`).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub parent: String,
}

/// `CheckTrialEarlyStoppingStateResponse`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct CheckTrialEarlyStoppingStateResponse {
    /// The trial should stop.
    #[serde(alias = "should_stop", skip_serializing_if = "crate::json::is_false")]
    pub should_stop: bool,
}

/// `CheckTrialEarlyStoppingStateMetatdata` (sic).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct CheckTrialEarlyStoppingStateMetatdata {
    /// Times of the operation.
    #[serde(alias = "generic_metadata", skip_serializing_if = "Option::is_none")]
    pub generic_metadata: Option<GenericOperationMetadata>,
    /// The study's name.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub study: String,
    /// The trial's id.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub trial: String,
}

/// Answer of `trials.list`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ListTrialsResponse {
    /// The page.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub trials: Vec<Trial>,
    /// Absent on the last page.
    #[serde(alias = "next_page_token", skip_serializing_if = "String::is_empty")]
    pub next_page_token: String,
}

/// Answer of `trials:listOptimalTrials`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ListOptimalTrialsResponse {
    /// The best trial of a single-objective study (every trial tied for best), the
    /// Pareto-optimal trials of a multi-objective one.
    #[serde(alias = "optimal_trials", skip_serializing_if = "Vec::is_empty")]
    pub optimal_trials: Vec<Trial>,
}

/// A message as a JSON `Any`: its fields plus `"@type"`.
pub fn to_any<T: Serialize>(type_url: &str, message: &T) -> serde_json::Value {
    let mut m = serde_json::Map::new();
    m.insert("@type".into(), serde_json::Value::String(type_url.into()));
    if let Ok(serde_json::Value::Object(fields)) = serde_json::to_value(message) {
        m.extend(fields);
    }
    serde_json::Value::Object(m)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn study_round_trip_and_output_only_cleared() {
        let body = br#"{"name": "x", "displayName": "s", "state": "ACTIVE", "studySpec": {
            "metrics": [{"metricId": "acc", "goal": "MAXIMIZE"}],
            "parameters": [{"parameterId": "lr", "doubleValueSpec": {"minValue": 0.001, "maxValue": 0.1}}]}}"#;
        let s = parse_study(body).expect("parse");
        assert_eq!(s.name, "");
        assert_eq!(s.state, StudyState::Unspecified);
        assert_eq!(s.study_spec.metrics[0].metric_id, "acc");
        let err = parse_study(br#"{"displayName": "s", "bogus": 1}"#).expect_err("unknown field");
        assert!(err.message.contains("bogus"), "{}", err.message);
    }

    #[test]
    fn suggest_request_names() {
        let r: SuggestTrialsRequest =
            serde_json::from_value(json!({"suggestionCount": 2, "clientId": "w1", "contexts": [{"parameters": [{"parameterId": "a", "value": 3}]}]}))
                .expect("parse");
        assert_eq!(r.suggestion_count, 2);
        assert_eq!(r.client_id, "w1");
        assert_eq!(r.contexts[0].parameters[0].value, json!(3));
        let any = to_any(SUGGEST_TRIALS_RESPONSE_TYPE, &SuggestTrialsResponse { study_state: StudyState::Active, ..Default::default() });
        assert_eq!(any, json!({"@type": SUGGEST_TRIALS_RESPONSE_TYPE, "studyState": "ACTIVE"}));
    }
}
