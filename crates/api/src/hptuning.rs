//! `HyperparameterTuningJob`, its `StudySpec` and its `Trial`s.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::ApiError;
use crate::types::{CustomJobSpec, Duration, EncryptionSpec, JobState, Status, Timestamp};

proto_enum! {
    /// `StudySpec.MetricSpec.GoalType`.
    pub enum GoalType ("google.cloud.aiplatform.v1.StudySpec.MetricSpec.GoalType") default Unspecified {
        Unspecified = 0 => "GOAL_TYPE_UNSPECIFIED",
        Maximize = 1 => "MAXIMIZE",
        Minimize = 2 => "MINIMIZE",
    }
}

proto_enum! {
    /// `StudySpec.ParameterSpec.ScaleType`.
    pub enum ScaleType ("google.cloud.aiplatform.v1.StudySpec.ParameterSpec.ScaleType") default Unspecified {
        Unspecified = 0 => "SCALE_TYPE_UNSPECIFIED",
        UnitLinearScale = 1 => "UNIT_LINEAR_SCALE",
        UnitLogScale = 2 => "UNIT_LOG_SCALE",
        UnitReverseLogScale = 3 => "UNIT_REVERSE_LOG_SCALE",
    }
}

impl ScaleType {
    /// Log and reverse-log scales need strictly positive bounds.
    pub fn is_logarithmic(self) -> bool {
        matches!(
            self,
            ScaleType::UnitLogScale | ScaleType::UnitReverseLogScale
        )
    }
}

proto_enum! {
    /// `StudySpec.Algorithm`; unspecified means Bayesian optimisation.
    pub enum Algorithm ("google.cloud.aiplatform.v1.StudySpec.Algorithm") default Unspecified {
        Unspecified = 0 => "ALGORITHM_UNSPECIFIED",
        GridSearch = 2 => "GRID_SEARCH",
        RandomSearch = 3 => "RANDOM_SEARCH",
    }
}

proto_enum! {
    /// `StudySpec.MeasurementSelectionType`.
    pub enum MeasurementSelectionType ("google.cloud.aiplatform.v1.StudySpec.MeasurementSelectionType") default Unspecified {
        Unspecified = 0 => "MEASUREMENT_SELECTION_TYPE_UNSPECIFIED",
        LastMeasurement = 1 => "LAST_MEASUREMENT",
        BestMeasurement = 2 => "BEST_MEASUREMENT",
    }
}

proto_enum! {
    /// `StudySpec.ObservationNoise` (stored; the tuner may use it as a hint).
    pub enum ObservationNoise ("google.cloud.aiplatform.v1.StudySpec.ObservationNoise") default Unspecified {
        Unspecified = 0 => "OBSERVATION_NOISE_UNSPECIFIED",
        Low = 1 => "LOW",
        High = 2 => "HIGH",
    }
}

proto_enum! {
    /// `Trial.State`.
    pub enum TrialState ("google.cloud.aiplatform.v1.Trial.State") default Unspecified {
        Unspecified = 0 => "STATE_UNSPECIFIED",
        Requested = 1 => "REQUESTED",
        Active = 2 => "ACTIVE",
        Stopping = 3 => "STOPPING",
        Succeeded = 4 => "SUCCEEDED",
        Infeasible = 5 => "INFEASIBLE",
    }
}

/// `google.cloud.aiplatform.v1.HyperparameterTuningJob`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct HyperparameterTuningJob {
    /// `projects/{p}/locations/{l}/hyperparameterTuningJobs/{id}` (output only).
    #[serde(skip_serializing_if = "String::is_empty")]
    #[cfg_attr(feature = "schema", schemars(extend("readOnly" = true)))]
    pub name: String,
    /// Required, at most 128 characters.
    #[serde(alias = "display_name", skip_serializing_if = "String::is_empty")]
    pub display_name: String,
    /// Metrics, parameters and algorithm.
    #[serde(alias = "study_spec")]
    pub study_spec: StudySpec,
    /// Trials to run in total (> 0).
    #[cfg_attr(feature = "schema", schemars(with = "crate::schema::Int32"))]
    #[serde(
        alias = "max_trial_count",
        with = "crate::json::int32",
        skip_serializing_if = "crate::json::is_zero_i32"
    )]
    pub max_trial_count: i32,
    /// Trials to run at once (1..=maxTrialCount).
    #[cfg_attr(feature = "schema", schemars(with = "crate::schema::Int32"))]
    #[serde(
        alias = "parallel_trial_count",
        with = "crate::json::int32",
        skip_serializing_if = "crate::json::is_zero_i32"
    )]
    pub parallel_trial_count: i32,
    /// Failed trials tolerated before the job fails (0 = service default).
    #[cfg_attr(feature = "schema", schemars(with = "crate::schema::Int32"))]
    #[serde(
        alias = "max_failed_trial_count",
        with = "crate::json::int32",
        skip_serializing_if = "crate::json::is_zero_i32"
    )]
    pub max_failed_trial_count: i32,
    /// The job each trial runs.
    #[serde(alias = "trial_job_spec")]
    pub trial_job_spec: CustomJobSpec,
    /// Output only.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    #[cfg_attr(feature = "schema", schemars(extend("readOnly" = true)))]
    pub trials: Vec<Trial>,
    /// Output only.
    #[serde(skip_serializing_if = "JobState::is_unspecified")]
    #[cfg_attr(feature = "schema", schemars(extend("readOnly" = true)))]
    pub state: JobState,
    /// Output only.
    #[serde(alias = "create_time", skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(extend("readOnly" = true)))]
    pub create_time: Option<Timestamp>,
    /// Output only.
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
    /// Output only.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(extend("readOnly" = true)))]
    pub error: Option<Status>,
    /// User labels.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Stored, not honoured.
    #[serde(alias = "encryption_spec", skip_serializing_if = "Option::is_none")]
    pub encryption_spec: Option<EncryptionSpec>,
    /// A Trainyard extension, as on a CustomJob: directories of the server's host that
    /// every trial's containers see read-only at their own paths (`hp-tuning-jobs create
    /// --config` sends the config file's directory when the trials' command names files
    /// beside it); the same rules as `CustomJob.trainyardHostDirectories`.
    #[serde(alias = "trainyard_host_directories", skip_serializing_if = "Vec::is_empty")]
    pub trainyard_host_directories: Vec<String>,
}

impl HyperparameterTuningJob {
    /// Clears the output-only fields (what the service does with them on create).
    pub fn clear_output_only(&mut self) {
        self.name.clear();
        self.trials.clear();
        self.state = JobState::Unspecified;
        self.create_time = None;
        self.start_time = None;
        self.end_time = None;
        self.update_time = None;
        self.error = None;
    }
}

/// `google.cloud.aiplatform.v1.StudySpec`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct StudySpec {
    /// At least one.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub metrics: Vec<MetricSpec>,
    /// The search space.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub parameters: Vec<ParameterSpec>,
    /// Unspecified = Bayesian optimisation.
    #[serde(skip_serializing_if = "Algorithm::is_unspecified")]
    pub algorithm: Algorithm,
    /// Noise hint.
    #[serde(
        alias = "observation_noise",
        skip_serializing_if = "ObservationNoise::is_unspecified"
    )]
    pub observation_noise: ObservationNoise,
    /// Which measurement of a trial counts.
    #[serde(
        alias = "measurement_selection_type",
        skip_serializing_if = "MeasurementSelectionType::is_unspecified"
    )]
    pub measurement_selection_type: MeasurementSelectionType,
    /// Early stopping by decay curve.
    #[serde(
        alias = "decay_curve_stopping_spec",
        skip_serializing_if = "Option::is_none"
    )]
    pub decay_curve_stopping_spec: Option<DecayCurveAutomatedStoppingSpec>,
    /// Early stopping by median.
    #[serde(
        alias = "median_automated_stopping_spec",
        skip_serializing_if = "Option::is_none"
    )]
    pub median_automated_stopping_spec: Option<MedianAutomatedStoppingSpec>,
    /// Early stopping by convex regression.
    #[serde(
        alias = "convex_automated_stopping_spec",
        skip_serializing_if = "Option::is_none"
    )]
    pub convex_automated_stopping_spec: Option<ConvexAutomatedStoppingSpec>,
    /// Stored (`StudyStoppingConfig`, kept as JSON).
    #[serde(
        alias = "study_stopping_config",
        skip_serializing_if = "Option::is_none"
    )]
    pub study_stopping_config: Option<Value>,
}

/// `StudySpec.MetricSpec`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct MetricSpec {
    /// The metric's tag as reported by the trial.
    #[serde(alias = "metric_id", skip_serializing_if = "String::is_empty")]
    pub metric_id: String,
    /// MAXIMIZE or MINIMIZE.
    #[serde(skip_serializing_if = "GoalType::is_unspecified")]
    pub goal: GoalType,
    /// Safety metric settings.
    #[serde(alias = "safety_config", skip_serializing_if = "Option::is_none")]
    pub safety_config: Option<SafetyMetricConfig>,
}

/// `StudySpec.MetricSpec.SafetyMetricConfig`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct SafetyMetricConfig {
    /// Threshold of the safe region.
    #[cfg_attr(feature = "schema", schemars(with = "crate::schema::Double"))]
    #[serde(
        alias = "safety_threshold",
        with = "crate::json::double",
        skip_serializing_if = "crate::json::is_zero_f64"
    )]
    pub safety_threshold: f64,
    /// Fraction of trials that must be safe.
    #[cfg_attr(feature = "schema", schemars(with = "Option<crate::schema::Double>"))]
    #[serde(
        alias = "desired_min_safe_trials_fraction",
        with = "crate::json::double::option",
        skip_serializing_if = "Option::is_none"
    )]
    pub desired_min_safe_trials_fraction: Option<f64>,
}

/// `StudySpec.ParameterSpec`: one of the four value specs.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ParameterSpec {
    /// Name, passed to the trial as `--PARAMETER_ID=VALUE`.
    #[serde(alias = "parameter_id", skip_serializing_if = "String::is_empty")]
    pub parameter_id: String,
    /// A real range.
    #[serde(alias = "double_value_spec", skip_serializing_if = "Option::is_none")]
    pub double_value_spec: Option<DoubleValueSpec>,
    /// An integer range.
    #[serde(alias = "integer_value_spec", skip_serializing_if = "Option::is_none")]
    pub integer_value_spec: Option<IntegerValueSpec>,
    /// A set of strings.
    #[serde(
        alias = "categorical_value_spec",
        skip_serializing_if = "Option::is_none"
    )]
    pub categorical_value_spec: Option<CategoricalValueSpec>,
    /// A set of numbers.
    #[serde(alias = "discrete_value_spec", skip_serializing_if = "Option::is_none")]
    pub discrete_value_spec: Option<DiscreteValueSpec>,
    /// How the range is searched.
    #[serde(
        alias = "scale_type",
        skip_serializing_if = "ScaleType::is_unspecified"
    )]
    pub scale_type: ScaleType,
    /// Child parameters active for some values of this one.
    #[serde(
        alias = "conditional_parameter_specs",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub conditional_parameter_specs: Vec<ConditionalParameterSpec>,
}

/// `ParameterSpec.DoubleValueSpec`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct DoubleValueSpec {
    /// Inclusive lower bound.
    #[cfg_attr(feature = "schema", schemars(with = "crate::schema::Double"))]
    #[serde(
        alias = "min_value",
        with = "crate::json::double",
        skip_serializing_if = "crate::json::is_zero_f64"
    )]
    pub min_value: f64,
    /// Inclusive upper bound.
    #[cfg_attr(feature = "schema", schemars(with = "crate::schema::Double"))]
    #[serde(
        alias = "max_value",
        with = "crate::json::double",
        skip_serializing_if = "crate::json::is_zero_f64"
    )]
    pub max_value: f64,
    /// First value to try.
    #[cfg_attr(feature = "schema", schemars(with = "Option<crate::schema::Double>"))]
    #[serde(
        alias = "default_value",
        with = "crate::json::double::option",
        skip_serializing_if = "Option::is_none"
    )]
    pub default_value: Option<f64>,
}

/// `ParameterSpec.IntegerValueSpec` (int64 strings on output).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct IntegerValueSpec {
    /// Inclusive lower bound.
    #[cfg_attr(feature = "schema", schemars(with = "crate::schema::Int64"))]
    #[serde(
        alias = "min_value",
        with = "crate::json::int64",
        skip_serializing_if = "crate::json::is_zero_i64"
    )]
    pub min_value: i64,
    /// Inclusive upper bound.
    #[cfg_attr(feature = "schema", schemars(with = "crate::schema::Int64"))]
    #[serde(
        alias = "max_value",
        with = "crate::json::int64",
        skip_serializing_if = "crate::json::is_zero_i64"
    )]
    pub max_value: i64,
    /// First value to try.
    #[cfg_attr(feature = "schema", schemars(with = "Option<crate::schema::Int64>"))]
    #[serde(
        alias = "default_value",
        with = "crate::json::int64::option",
        skip_serializing_if = "Option::is_none"
    )]
    pub default_value: Option<i64>,
}

/// `ParameterSpec.CategoricalValueSpec`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct CategoricalValueSpec {
    /// The categories.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<String>,
    /// First value to try.
    #[serde(alias = "default_value", skip_serializing_if = "Option::is_none")]
    pub default_value: Option<String>,
}

/// `ParameterSpec.DiscreteValueSpec`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct DiscreteValueSpec {
    /// The feasible values.
    #[cfg_attr(feature = "schema", schemars(with = "Vec<crate::schema::Double>"))]
    #[serde(
        with = "crate::json::double::vec",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub values: Vec<f64>,
    /// First value to try.
    #[cfg_attr(feature = "schema", schemars(with = "Option<crate::schema::Double>"))]
    #[serde(
        alias = "default_value",
        with = "crate::json::double::option",
        skip_serializing_if = "Option::is_none"
    )]
    pub default_value: Option<f64>,
}

/// `ParameterSpec.ConditionalParameterSpec`: a child parameter and the parent values
/// for which it is active (one of the three conditions).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ConditionalParameterSpec {
    /// The child parameter.
    #[serde(alias = "parameter_spec", skip_serializing_if = "Option::is_none")]
    pub parameter_spec: Option<Box<ParameterSpec>>,
    /// Parent is a discrete parameter.
    #[serde(
        alias = "parent_discrete_values",
        skip_serializing_if = "Option::is_none"
    )]
    pub parent_discrete_values: Option<DiscreteValueCondition>,
    /// Parent is an integer parameter.
    #[serde(alias = "parent_int_values", skip_serializing_if = "Option::is_none")]
    pub parent_int_values: Option<IntValueCondition>,
    /// Parent is a categorical parameter.
    #[serde(
        alias = "parent_categorical_values",
        skip_serializing_if = "Option::is_none"
    )]
    pub parent_categorical_values: Option<CategoricalValueCondition>,
}

/// `ConditionalParameterSpec.DiscreteValueCondition`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct DiscreteValueCondition {
    /// Parent values that activate the child.
    #[cfg_attr(feature = "schema", schemars(with = "Vec<crate::schema::Double>"))]
    #[serde(
        with = "crate::json::double::vec",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub values: Vec<f64>,
}

/// `ConditionalParameterSpec.IntValueCondition` (int64 strings on output).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct IntValueCondition {
    /// Parent values that activate the child.
    #[cfg_attr(feature = "schema", schemars(with = "Vec<crate::schema::Int64>"))]
    #[serde(
        with = "crate::json::int64::vec",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub values: Vec<i64>,
}

/// `ConditionalParameterSpec.CategoricalValueCondition`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct CategoricalValueCondition {
    /// Parent values that activate the child.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<String>,
}

/// `StudySpec.DecayCurveAutomatedStoppingSpec`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct DecayCurveAutomatedStoppingSpec {
    /// Use elapsed time instead of steps as the x axis.
    #[serde(
        alias = "use_elapsed_duration",
        skip_serializing_if = "crate::json::is_false"
    )]
    pub use_elapsed_duration: bool,
}

/// `StudySpec.MedianAutomatedStoppingSpec`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct MedianAutomatedStoppingSpec {
    /// Use elapsed time instead of steps as the x axis.
    #[serde(
        alias = "use_elapsed_duration",
        skip_serializing_if = "crate::json::is_false"
    )]
    pub use_elapsed_duration: bool,
}

/// `StudySpec.ConvexAutomatedStoppingSpec`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ConvexAutomatedStoppingSpec {
    /// Steps (or seconds) after which a trial may be stopped.
    #[cfg_attr(feature = "schema", schemars(with = "crate::schema::Int64"))]
    #[serde(
        alias = "max_step_count",
        with = "crate::json::int64",
        skip_serializing_if = "crate::json::is_zero_i64"
    )]
    pub max_step_count: i64,
    /// Steps (or seconds) before which a trial is never stopped.
    #[cfg_attr(feature = "schema", schemars(with = "crate::schema::Int64"))]
    #[serde(
        alias = "min_step_count",
        with = "crate::json::int64",
        skip_serializing_if = "crate::json::is_zero_i64"
    )]
    pub min_step_count: i64,
    /// Measurements needed before stopping is considered.
    #[cfg_attr(feature = "schema", schemars(with = "crate::schema::Int64"))]
    #[serde(
        alias = "min_measurement_count",
        with = "crate::json::int64",
        skip_serializing_if = "crate::json::is_zero_i64"
    )]
    pub min_measurement_count: i64,
    /// Parameter holding the learning rate, if any.
    #[serde(
        alias = "learning_rate_parameter_name",
        skip_serializing_if = "String::is_empty"
    )]
    pub learning_rate_parameter_name: String,
    /// Use elapsed time instead of steps as the x axis.
    #[serde(
        alias = "use_elapsed_duration",
        skip_serializing_if = "crate::json::is_false"
    )]
    pub use_elapsed_duration: bool,
    /// Re-examine already stopped trials.
    #[serde(
        alias = "update_all_stopped_trials",
        skip_serializing_if = "Option::is_none"
    )]
    pub update_all_stopped_trials: Option<bool>,
}

/// `google.cloud.aiplatform.v1.Trial` (output only).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Trial {
    /// Resource name of the trial, if any.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// `"1"`, `"2"`, ...
    #[serde(skip_serializing_if = "String::is_empty")]
    pub id: String,
    /// Trial state.
    #[serde(skip_serializing_if = "TrialState::is_unspecified")]
    pub state: TrialState,
    /// The suggested values.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub parameters: Vec<TrialParameter>,
    /// The measurement that counts.
    #[serde(alias = "final_measurement", skip_serializing_if = "Option::is_none")]
    pub final_measurement: Option<Measurement>,
    /// Intermediate measurements.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub measurements: Vec<Measurement>,
    /// When the trial started.
    #[serde(alias = "start_time", skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Timestamp>,
    /// When the trial ended.
    #[serde(alias = "end_time", skip_serializing_if = "Option::is_none")]
    pub end_time: Option<Timestamp>,
    /// The client that asked for the trial (a Vizier study's).
    #[serde(alias = "client_id", skip_serializing_if = "String::is_empty")]
    pub client_id: String,
    /// Why the trial is INFEASIBLE.
    #[serde(alias = "infeasible_reason", skip_serializing_if = "String::is_empty")]
    pub infeasible_reason: String,
    /// Name of the CustomJob that ran the trial.
    #[serde(alias = "custom_job", skip_serializing_if = "String::is_empty")]
    pub custom_job: String,
    /// Replica name → interactive shell URI.
    #[serde(alias = "web_access_uris", skip_serializing_if = "BTreeMap::is_empty")]
    pub web_access_uris: BTreeMap<String, String>,
}

/// `Trial.Parameter`: a number or a string.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct TrialParameter {
    /// The parameter.
    #[serde(alias = "parameter_id", skip_serializing_if = "String::is_empty")]
    pub parameter_id: String,
    /// `google.protobuf.Value`: a JSON number or string.
    #[serde(skip_serializing_if = "Value::is_null")]
    #[cfg_attr(feature = "schema", schemars(with = "crate::schema::NumberOrString"))]
    pub value: Value,
}

/// `google.cloud.aiplatform.v1.Measurement`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Measurement {
    /// Time since the trial started.
    #[serde(alias = "elapsed_duration", skip_serializing_if = "Option::is_none")]
    pub elapsed_duration: Option<Duration>,
    /// int64: a string on output.
    #[cfg_attr(feature = "schema", schemars(with = "crate::schema::Int64"))]
    #[serde(
        alias = "step_count",
        with = "crate::json::int64",
        skip_serializing_if = "crate::json::is_zero_i64"
    )]
    pub step_count: i64,
    /// Reported values.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub metrics: Vec<MeasurementMetric>,
}

/// `Measurement.Metric`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct MeasurementMetric {
    /// The metric.
    #[serde(alias = "metric_id", skip_serializing_if = "String::is_empty")]
    pub metric_id: String,
    /// Its value.
    #[cfg_attr(feature = "schema", schemars(with = "crate::schema::Double"))]
    #[serde(
        with = "crate::json::double",
        skip_serializing_if = "crate::json::is_zero_f64"
    )]
    pub value: f64,
}

/// Answer of `hyperparameterTuningJobs.list` (its jobs carry no `trials`).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ListHyperparameterTuningJobsResponse {
    /// The page.
    #[serde(
        alias = "hyperparameter_tuning_jobs",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub hyperparameter_tuning_jobs: Vec<HyperparameterTuningJob>,
    /// Absent on the last page.
    #[serde(alias = "next_page_token", skip_serializing_if = "String::is_empty")]
    pub next_page_token: String,
}

/// Parses a create-HyperparameterTuningJob request body with the service's error text,
/// and clears the output-only fields (`name`, `state`, times, `error`, `trials`).
///
/// Does not validate: see [`crate::validate::validate_hyperparameter_tuning_job`].
pub fn parse_hyperparameter_tuning_job(body: &[u8]) -> Result<HyperparameterTuningJob, ApiError> {
    let mut job: HyperparameterTuningJob =
        crate::json::from_body(body, "hyperparameter_tuning_job")?;
    job.clear_output_only();
    Ok(job)
}
