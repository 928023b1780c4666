//! `google.cloud.aiplatform.v1.TrainingPipeline` for the custom-task definition that the
//! SDK's training classes (`CustomTrainingJob`, `CustomContainerTrainingJob`,
//! `CustomPythonPackageTrainingJob`) create: its `trainingTaskInputs` is a
//! `google.protobuf.Struct` holding a CustomJobSpec (numbers arrive as doubles, keys in
//! snake_case and camelCase mixed), run as one CustomJob.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::ApiError;
use crate::types::{CustomJob, EncryptionSpec, Status, Timestamp};

proto_enum! {
    /// The state of a training pipeline (`google.cloud.aiplatform.v1.PipelineState`).
    pub enum PipelineState ("google.cloud.aiplatform.v1.PipelineState") default Unspecified {
        Unspecified = 0 => "PIPELINE_STATE_UNSPECIFIED",
        Queued = 1 => "PIPELINE_STATE_QUEUED",
        Pending = 2 => "PIPELINE_STATE_PENDING",
        Running = 3 => "PIPELINE_STATE_RUNNING",
        Succeeded = 4 => "PIPELINE_STATE_SUCCEEDED",
        Failed = 5 => "PIPELINE_STATE_FAILED",
        Cancelling = 6 => "PIPELINE_STATE_CANCELLING",
        Cancelled = 7 => "PIPELINE_STATE_CANCELLED",
        Paused = 8 => "PIPELINE_STATE_PAUSED",
    }
}

/// The one training task definition Trainyard runs: a custom job.
pub const CUSTOM_TASK_DEFINITION: &str = "gs://google-cloud-aiplatform/schema/trainingjob/definition/custom_task_1.0.0.yaml";

/// `google.cloud.aiplatform.v1.TrainingPipeline`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct TrainingPipeline {
    /// `projects/{p}/locations/{l}/trainingPipelines/{id}` (output only).
    #[serde(skip_serializing_if = "String::is_empty")]
    #[cfg_attr(feature = "schema", schemars(extend("readOnly" = true)))]
    pub name: String,
    /// Required, at most 128 characters.
    #[serde(alias = "display_name", skip_serializing_if = "String::is_empty")]
    pub display_name: String,
    /// Required: the custom task (`CUSTOM_TASK_DEFINITION`).
    #[serde(alias = "training_task_definition", skip_serializing_if = "String::is_empty")]
    pub training_task_definition: String,
    /// Required: a CustomJobSpec as a Struct.
    #[serde(alias = "training_task_inputs")]
    pub training_task_inputs: Value,
    /// Output only: `{"backingCustomJob": "projects/.../customJobs/N"}`.
    #[serde(alias = "training_task_metadata", skip_serializing_if = "Value::is_null")]
    #[cfg_attr(feature = "schema", schemars(extend("readOnly" = true)))]
    pub training_task_metadata: Value,
    /// Refused when set (no `models` resource here).
    #[serde(alias = "model_to_upload", skip_serializing_if = "Value::is_null")]
    pub model_to_upload: Value,
    /// Refused when set (no managed datasets here).
    #[serde(alias = "input_data_config", skip_serializing_if = "Value::is_null")]
    pub input_data_config: Value,
    /// Stored and echoed.
    #[serde(alias = "model_id", skip_serializing_if = "String::is_empty")]
    pub model_id: String,
    /// Stored and echoed.
    #[serde(alias = "parent_model", skip_serializing_if = "String::is_empty")]
    pub parent_model: String,
    /// Output only.
    #[serde(skip_serializing_if = "PipelineState::is_unspecified")]
    #[cfg_attr(feature = "schema", schemars(extend("readOnly" = true)))]
    pub state: PipelineState,
    /// Output only.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(extend("readOnly" = true)))]
    pub error: Option<Status>,
    /// Output only.
    #[serde(alias = "create_time", skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(extend("readOnly" = true)))]
    pub create_time: Option<Timestamp>,
    /// Output only: when it first ran.
    #[serde(alias = "start_time", skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(extend("readOnly" = true)))]
    pub start_time: Option<Timestamp>,
    /// Output only.
    #[serde(alias = "end_time", skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(extend("readOnly" = true)))]
    pub end_time: Option<Timestamp>,
    /// Output only.
    #[serde(alias = "update_time", skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(extend("readOnly" = true)))]
    pub update_time: Option<Timestamp>,
    /// User labels.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Stored and echoed; not honoured locally.
    #[serde(alias = "encryption_spec", skip_serializing_if = "Option::is_none")]
    pub encryption_spec: Option<EncryptionSpec>,
}

/// `ListTrainingPipelinesResponse`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", default)]
pub struct ListTrainingPipelinesResponse {
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub training_pipelines: Vec<TrainingPipeline>,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub next_page_token: String,
}

impl TrainingPipeline {
    pub fn clear_output_only(&mut self) {
        self.name.clear();
        self.state = PipelineState::Unspecified;
        self.error = None;
        self.create_time = None;
        self.start_time = None;
        self.end_time = None;
        self.update_time = None;
        self.training_task_metadata = Value::Null;
    }
}

/// Parses a create body.
pub fn parse_training_pipeline(body: &[u8]) -> Result<TrainingPipeline, ApiError> {
    let mut p: TrainingPipeline = crate::json::from_body(body, "training_pipeline")?;
    p.clear_output_only();
    Ok(p)
}

/// A Struct's numbers are doubles: whole ones become integers again, so that the
/// CustomJobSpec's integer fields (`replicaCount`, `acceleratorCount`, ...) take them.
fn integral(v: &mut Value) {
    match v {
        Value::Number(n) => {
            if let Some(f) = n.as_f64().filter(|f| n.is_f64() && f.fract() == 0.0 && f.abs() < 9.0e15) {
                *v = Value::from(f as i64);
            }
        }
        Value::Array(a) => a.iter_mut().for_each(integral),
        Value::Object(m) => m.values_mut().for_each(integral),
        _ => {}
    }
}

/// The CustomJob a pipeline runs: its `trainingTaskInputs` as the job spec, checked by
/// the CustomJob's wire rules (errors name `trainingTaskInputs.` fields).
pub fn pipeline_custom_job(p: &TrainingPipeline) -> Result<CustomJob, ApiError> {
    let mut inputs = p.training_task_inputs.clone();
    integral(&mut inputs);
    let rename = |e: ApiError| ApiError::new(e.code, e.message.replace("jobSpec.", "trainingTaskInputs.").replace("'job_spec'", "'training_task_inputs'"));
    let body = serde_json::json!({"displayName": format!("{}-custom-job", p.display_name.chars().take(100).collect::<String>()), "jobSpec": inputs, "labels": p.labels});
    let job = crate::parse_custom_job(body.to_string().as_bytes()).map_err(rename)?;
    crate::validate_custom_job(&job).map_err(rename)?;
    Ok(job)
}

/// The wire rules of a create: the display name, the custom task definition, inputs that
/// make a valid CustomJobSpec, and no model to upload.
pub fn validate_training_pipeline(p: &TrainingPipeline) -> Result<(), ApiError> {
    crate::validate::validate_display_name(&p.display_name)?;
    if p.training_task_definition != CUSTOM_TASK_DEFINITION {
        return Err(ApiError::invalid_argument(format!(
            "trainingTaskDefinition: {:?} is not supported; Trainyard runs the custom task, {CUSTOM_TASK_DEFINITION}.",
            p.training_task_definition
        )));
    }
    if !p.training_task_inputs.is_object() {
        return Err(ApiError::invalid_argument("trainingTaskInputs is required: a CustomJobSpec (workerPoolSpecs, ...)."));
    }
    if !p.model_to_upload.is_null() {
        return Err(ApiError::invalid_argument(
            "modelToUpload: Trainyard has no models resource; leave it out (the SDK does when no serving container is given) \
             and take the model from baseOutputDirectory.",
        ));
    }
    if !p.input_data_config.is_null() {
        return Err(ApiError::invalid_argument("inputDataConfig: managed datasets are not supported here; leave it out."));
    }
    pipeline_custom_job(p).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `CustomTrainingJob.run()` sends (measured).
    fn sdk_body() -> Value {
        serde_json::json!({
            "displayName": "train",
            "trainingTaskDefinition": CUSTOM_TASK_DEFINITION,
            "trainingTaskInputs": {"worker_pool_specs": [{"python_package_spec": {"package_uris": ["gs://bucket/pkg.tar.gz"],
                "python_module": "aiplatform_custom_trainer_script.task", "executor_image_uri": "python:3.11"},
              "machine_spec": {"machine_type": "n1-standard-4"},
              "disk_spec": {"boot_disk_size_gb": 100.0, "boot_disk_type": "pd-ssd"}, "replica_count": 1.0}],
             "base_output_directory": {"output_uri_prefix": "gs://bucket/out"}}
        })
    }

    #[test]
    fn the_sdks_custom_task_becomes_a_custom_job() {
        let p = parse_training_pipeline(sdk_body().to_string().as_bytes()).unwrap();
        validate_training_pipeline(&p).unwrap();
        let job = pipeline_custom_job(&p).unwrap();
        let pool = &job.job_spec.worker_pool_specs[0];
        assert_eq!(pool.replica_count, 1);
        assert_eq!(pool.python_package_spec.as_ref().unwrap().python_module, "aiplatform_custom_trainer_script.task");
        assert_eq!(job.display_name, "train-custom-job");
        // The container variant mixes cases.
        let mut b = sdk_body();
        b["trainingTaskInputs"]["worker_pool_specs"][0] = serde_json::json!({
            "containerSpec": {"imageUri": "python:3.11", "command": ["python3", "-c", "print(1)"]},
            "machine_spec": {"machine_type": "n1-standard-4"}, "replica_count": 1.0});
        let p = parse_training_pipeline(b.to_string().as_bytes()).unwrap();
        validate_training_pipeline(&p).unwrap();
    }

    #[test]
    fn bad_pipelines_name_the_field() {
        let mut b = sdk_body();
        b["trainingTaskDefinition"] = "gs://google-cloud-aiplatform/schema/trainingjob/definition/automl_tables_1.0.0.yaml".into();
        let e = validate_training_pipeline(&parse_training_pipeline(b.to_string().as_bytes()).unwrap()).unwrap_err();
        assert!(e.message.starts_with("trainingTaskDefinition"), "{}", e.message);
        let mut b = sdk_body();
        b["modelToUpload"] = serde_json::json!({"displayName": "m"});
        let e = validate_training_pipeline(&parse_training_pipeline(b.to_string().as_bytes()).unwrap()).unwrap_err();
        assert!(e.message.starts_with("modelToUpload"), "{}", e.message);
        let mut b = sdk_body();
        b["trainingTaskInputs"]["worker_pool_specs"][0]["machine_spec"]["machine_type"] = "".into();
        let e = validate_training_pipeline(&parse_training_pipeline(b.to_string().as_bytes()).unwrap()).unwrap_err();
        assert!(e.message.contains("trainingTaskInputs.workerPoolSpecs[0]"), "{}", e.message);
    }
}
