//! HyperparameterTuningJob documents and their validation.

use serde_json::{json, Value};
use trainyard_api::{
    encode_enums_as_int, parse_hyperparameter_tuning_job, validate_hyperparameter_tuning_job,
    Algorithm, GoalType, HyperparameterTuningJob, JobState, ScaleType, TrialState,
};

const SDK_HP_JOB: &str = r#"{
  "displayName": "mnist-hp",
  "studySpec": {
    "metrics": [{"metricId": "accuracy", "goal": "MAXIMIZE"}],
    "parameters": [
      {"parameterId": "learning_rate", "doubleValueSpec": {"minValue": 0.0001, "maxValue": 0.1, "defaultValue": 0.01}, "scaleType": "UNIT_LOG_SCALE"},
      {"parameterId": "batch_size", "discreteValueSpec": {"values": [16, 32, 64]}, "scaleType": 1},
      {"parameterId": "layers", "integerValueSpec": {"minValue": "1", "maxValue": 4}},
      {"parameterId": "optimizer", "categoricalValueSpec": {"values": ["adam", "sgd"]},
       "conditionalParameterSpecs": [
         {"parentCategoricalValues": {"values": ["sgd"]},
          "parameterSpec": {"parameterId": "momentum", "doubleValueSpec": {"minValue": 0.5, "maxValue": 0.99}}}
       ]}
    ],
    "algorithm": 3,
    "measurementSelectionType": "BEST_MEASUREMENT",
    "medianAutomatedStoppingSpec": {"useElapsedDuration": true}
  },
  "max_trial_count": 20,
  "parallelTrialCount": "4",
  "maxFailedTrialCount": 2,
  "trialJobSpec": {
    "workerPoolSpecs": [
      {"machineSpec": {"machineType": "n1-standard-4"}, "replicaCount": "1",
       "containerSpec": {"imageUri": "gcr.io/my-project/mnist:latest", "args": ["--epochs=5"]}}
    ],
    "baseOutputDirectory": {"outputUriPrefix": "gs://my-bucket/hp/mnist"}
  },
  "labels": {"team": "vision"}
}"#;

const SERVED_HP_JOB: &str = r#"{
  "name": "projects/p/locations/us-central1/hyperparameterTuningJobs/7",
  "displayName": "mnist-hp",
  "studySpec": {
    "metrics": [{"metricId": "loss", "goal": "MINIMIZE"}],
    "parameters": [{"parameterId": "layers", "integerValueSpec": {"minValue": "1", "maxValue": "4"}, "scaleType": "UNIT_LINEAR_SCALE"}],
    "algorithm": "GRID_SEARCH"
  },
  "maxTrialCount": 4,
  "parallelTrialCount": 2,
  "trialJobSpec": {
    "workerPoolSpecs": [
      {"machineSpec": {"machineType": "n1-standard-4"}, "replicaCount": "1", "containerSpec": {"imageUri": "gcr.io/p/mnist"}}
    ]
  },
  "trials": [
    {"id": "1", "state": "SUCCEEDED",
     "parameters": [{"parameterId": "layers", "value": 1}],
     "finalMeasurement": {"elapsedDuration": "61.5s", "stepCount": "1000", "metrics": [{"metricId": "loss", "value": 0.25}]},
     "measurements": [{"stepCount": "500", "metrics": [{"metricId": "loss", "value": 0.5}]}],
     "startTime": "2026-11-29T10:00:00Z", "endTime": "2026-11-29T10:01:01.500Z",
     "customJob": "projects/p/locations/us-central1/customJobs/8"},
    {"id": "2", "state": "INFEASIBLE", "parameters": [{"parameterId": "layers", "value": 2}],
     "infeasibleReason": "no metric was reported", "customJob": "projects/p/locations/us-central1/customJobs/9"},
    {"id": "3", "state": "ACTIVE", "parameters": [{"parameterId": "layers", "value": "3"}]}
  ],
  "state": "JOB_STATE_RUNNING",
  "createTime": "2026-11-29T09:59:59.999999Z",
  "startTime": "2026-11-29T10:00:00Z",
  "updateTime": "2026-11-29T10:01:01.500Z"
}"#;

fn valid() -> HyperparameterTuningJob {
    parse_hyperparameter_tuning_job(SDK_HP_JOB.as_bytes()).expect("parse")
}

fn assert_rejected(job: &HyperparameterTuningJob, path: &str) {
    let err = validate_hyperparameter_tuning_job(job).expect_err("must be rejected");
    assert!(
        err.message.contains(path),
        "expected {path:?} in {:?}",
        err.message
    );
}

#[test]
fn sdk_document_round_trip() {
    let job = valid();
    validate_hyperparameter_tuning_job(&job).expect("valid");
    assert_eq!(job.max_trial_count, 20);
    assert_eq!(job.parallel_trial_count, 4);
    assert_eq!(job.study_spec.algorithm, Algorithm::RandomSearch);
    assert_eq!(job.study_spec.metrics[0].goal, GoalType::Maximize);
    assert_eq!(
        job.study_spec.parameters[1].scale_type,
        ScaleType::UnitLinearScale
    );
    let layers = job.study_spec.parameters[2]
        .integer_value_spec
        .as_ref()
        .expect("int spec");
    assert_eq!((layers.min_value, layers.max_value), (1, 4));

    let out = serde_json::to_value(&job).expect("serialise");
    assert_eq!(out["maxTrialCount"], 20);
    assert_eq!(out["parallelTrialCount"], 4);
    assert_eq!(out["studySpec"]["algorithm"], "RANDOM_SEARCH");
    assert_eq!(
        out["studySpec"]["parameters"][1]["scaleType"],
        "UNIT_LINEAR_SCALE"
    );
    assert_eq!(
        out["studySpec"]["parameters"][2]["integerValueSpec"],
        json!({"minValue": "1", "maxValue": "4"})
    );
    assert_eq!(
        out["studySpec"]["parameters"][1]["discreteValueSpec"]["values"],
        json!([16, 32, 64])
    );
    assert_eq!(
        out["studySpec"]["parameters"][3]["conditionalParameterSpecs"][0]
            ["parentCategoricalValues"],
        json!({"values": ["sgd"]})
    );
    assert_eq!(
        out["studySpec"]["medianAutomatedStoppingSpec"],
        json!({"useElapsedDuration": true})
    );
    assert_eq!(
        out["trialJobSpec"]["workerPoolSpecs"][0]["replicaCount"],
        "1"
    );
    let again: HyperparameterTuningJob = serde_json::from_value(out.clone()).expect("reparse");
    assert_eq!(again, job);

    let mut ints = out;
    encode_enums_as_int(&mut ints);
    assert_eq!(ints["studySpec"]["metrics"][0]["goal"], 1);
    assert_eq!(ints["studySpec"]["algorithm"], 3);
    assert_eq!(ints["studySpec"]["measurementSelectionType"], 2);
    assert_eq!(ints["studySpec"]["parameters"][0]["scaleType"], 2);
}

#[test]
fn served_document_with_trials_round_trips() {
    let job: HyperparameterTuningJob = serde_json::from_str(SERVED_HP_JOB).expect("parse");
    assert_eq!(job.state, JobState::Running);
    assert_eq!(job.trials.len(), 3);
    assert_eq!(job.trials[0].state, TrialState::Succeeded);
    let fm = job.trials[0]
        .final_measurement
        .as_ref()
        .expect("final measurement");
    assert_eq!(fm.step_count, 1000);
    assert_eq!(fm.metrics[0].value, 0.25);
    let out = serde_json::to_value(&job).expect("serialise");
    let original: Value = serde_json::from_str(SERVED_HP_JOB).expect("json");
    assert_eq!(out, original);

    // Job state is a JobState, a trial's state is a Trial.State.
    let mut ints = out;
    encode_enums_as_int(&mut ints);
    assert_eq!(ints["state"], 3);
    assert_eq!(ints["trials"][0]["state"], 4);
    assert_eq!(ints["trials"][1]["state"], 5);
    assert_eq!(ints["trials"][2]["state"], 2);
    assert_eq!(ints["trials"][2]["parameters"][0]["value"], "3");
    assert_eq!(ints["studySpec"]["algorithm"], 2);
    assert_eq!(ints["trials"][0]["finalMeasurement"]["stepCount"], "1000");

    // Create ignores the output-only fields, trials included.
    let created = parse_hyperparameter_tuning_job(SERVED_HP_JOB.as_bytes()).expect("parse");
    assert!(created.trials.is_empty());
    assert_eq!(created.state, JobState::Unspecified);
    assert!(created.name.is_empty() && created.create_time.is_none());
    validate_hyperparameter_tuning_job(&created).expect("valid");
}

#[test]
fn double_min_not_above_max() {
    let mut job = valid();
    let d = job.study_spec.parameters[0]
        .double_value_spec
        .as_mut()
        .expect("double");
    d.min_value = 0.5;
    d.default_value = None;
    assert_rejected(
        &job,
        "studySpec.parameters[0].doubleValueSpec.minValue (0.5) must not be greater than",
    );
}

#[test]
fn integer_min_not_above_max() {
    let mut job = valid();
    let n = job.study_spec.parameters[2]
        .integer_value_spec
        .as_mut()
        .expect("int");
    n.min_value = 5;
    assert_rejected(
        &job,
        "studySpec.parameters[2].integerValueSpec.minValue (5) must not be greater than",
    );
}

#[test]
fn log_scale_bounds_positive() {
    let mut job = valid();
    let d = job.study_spec.parameters[0]
        .double_value_spec
        .as_mut()
        .expect("double");
    d.min_value = 0.0;
    d.default_value = None;
    assert_rejected(&job, "studySpec.parameters[0].doubleValueSpec.minValue must be greater than 0 for UNIT_LOG_SCALE");
    let mut job = valid();
    job.study_spec.parameters[2].scale_type = ScaleType::UnitReverseLogScale;
    job.study_spec.parameters[2]
        .integer_value_spec
        .as_mut()
        .expect("int")
        .min_value = 0;
    assert_rejected(
        &job,
        "studySpec.parameters[2].integerValueSpec.minValue must be greater than 0",
    );
}

#[test]
fn default_value_within_range() {
    let mut job = valid();
    job.study_spec.parameters[0]
        .double_value_spec
        .as_mut()
        .expect("double")
        .default_value = Some(1.0);
    assert_rejected(&job, "studySpec.parameters[0].doubleValueSpec.defaultValue");
}

#[test]
fn categorical_and_discrete_values_non_empty() {
    let mut job = valid();
    job.study_spec.parameters[3]
        .categorical_value_spec
        .as_mut()
        .expect("cat")
        .values
        .clear();
    assert_rejected(
        &job,
        "studySpec.parameters[3].categoricalValueSpec.values must not be empty",
    );
    let mut job = valid();
    job.study_spec.parameters[1]
        .discrete_value_spec
        .as_mut()
        .expect("disc")
        .values
        .clear();
    assert_rejected(
        &job,
        "studySpec.parameters[1].discreteValueSpec.values must not be empty",
    );
}

#[test]
fn exactly_one_value_spec() {
    let mut job = valid();
    job.study_spec.parameters[1].discrete_value_spec = None;
    assert_rejected(&job, "studySpec.parameters[1] must set exactly one of");
}

#[test]
fn parameter_ids_unique_across_conditionals() {
    let mut job = valid();
    let cond = &mut job.study_spec.parameters[3].conditional_parameter_specs[0];
    cond.parameter_spec.as_mut().expect("child").parameter_id = "layers".into();
    assert_rejected(
        &job,
        "studySpec.parameters[3].conditionalParameterSpecs[0].parameterSpec.parameterId \"layers\" is used twice",
    );
}

#[test]
fn conditional_parent_values_exist_in_the_parent() {
    let mut job = valid();
    let cond = &mut job.study_spec.parameters[3].conditional_parameter_specs[0];
    cond.parent_categorical_values
        .as_mut()
        .expect("cond")
        .values = vec!["rmsprop".into()];
    assert_rejected(
        &job,
        "studySpec.parameters[3].conditionalParameterSpecs[0].parentCategoricalValues.values[0] \"rmsprop\" is not a value of the parent",
    );
}

#[test]
fn conditional_parent_kind_matches() {
    let mut job = valid();
    let cond = &mut job.study_spec.parameters[3].conditional_parameter_specs[0];
    cond.parent_categorical_values = None;
    cond.parent_int_values = Some(trainyard_api::IntValueCondition { values: vec![2] });
    assert_rejected(
        &job,
        "studySpec.parameters[3].conditionalParameterSpecs[0].parentIntValues needs a parent with an integerValueSpec",
    );
}

#[test]
fn conditional_int_and_discrete_parents() {
    let body = r#"{
      "displayName": "cond", "maxTrialCount": 2, "parallelTrialCount": 1,
      "studySpec": {"metrics": [{"metricId": "m", "goal": 2}], "parameters": [
        {"parameterId": "depth", "integerValueSpec": {"minValue": 1, "maxValue": 3},
         "conditionalParameterSpecs": [{"parentIntValues": {"values": ["2", 3]},
           "parameterSpec": {"parameterId": "width", "discreteValueSpec": {"values": [1, 2]},
             "conditionalParameterSpecs": [{"parentDiscreteValues": {"values": [4]},
               "parameterSpec": {"parameterId": "act", "categoricalValueSpec": {"values": ["relu"]}}}]}}]}
      ]},
      "trialJobSpec": {"workerPoolSpecs": [{"machineSpec": {"machineType": "m"}, "replicaCount": 1, "containerSpec": {"imageUri": "i"}}]}
    }"#;
    let job = parse_hyperparameter_tuning_job(body.as_bytes()).expect("parse");
    let out = serde_json::to_value(&job).expect("serialise");
    assert_eq!(
        out["studySpec"]["parameters"][0]["conditionalParameterSpecs"][0]["parentIntValues"],
        json!({"values": ["2", "3"]})
    );
    assert_rejected(
        &job,
        "studySpec.parameters[0].conditionalParameterSpecs[0].parameterSpec.conditionalParameterSpecs[0].parentDiscreteValues.values[0] (4) is not a value of the parent",
    );
}

#[test]
fn max_trial_count_positive() {
    let mut job = valid();
    job.max_trial_count = 0;
    assert_rejected(&job, "maxTrialCount must be greater than 0");
}

#[test]
fn parallel_trial_count_not_above_max() {
    let mut job = valid();
    job.parallel_trial_count = 21;
    assert_rejected(
        &job,
        "parallelTrialCount (21) must not be greater than maxTrialCount (20)",
    );
    job.parallel_trial_count = 0;
    assert_rejected(&job, "parallelTrialCount must be greater than 0");
}

#[test]
fn at_least_one_metric() {
    let mut job = valid();
    job.study_spec.metrics.clear();
    assert_rejected(&job, "studySpec.metrics must contain at least one metric");
    let mut job = valid();
    job.study_spec.metrics[0].goal = GoalType::Unspecified;
    assert_rejected(&job, "studySpec.metrics[0].goal is required");
}

#[test]
fn grid_search_refuses_double_parameters() {
    let mut job = valid();
    job.study_spec.algorithm = Algorithm::GridSearch;
    assert_rejected(
        &job,
        "studySpec.parameters[0].doubleValueSpec is not allowed with GRID_SEARCH",
    );
    // Also inside a conditional.
    job.study_spec.parameters.remove(0);
    assert_rejected(
        &job,
        "studySpec.parameters[2].conditionalParameterSpecs[0].parameterSpec.doubleValueSpec is not allowed with GRID_SEARCH",
    );
}

#[test]
fn at_most_one_stopping_spec() {
    let mut job = valid();
    job.study_spec.decay_curve_stopping_spec = Some(Default::default());
    assert_rejected(
        &job,
        "studySpec must set at most one of decayCurveStoppingSpec",
    );
}

#[test]
fn trial_job_spec_goes_through_the_job_spec_checks() {
    let mut job = valid();
    job.trial_job_spec.worker_pool_specs[0].replica_count = 2;
    assert_rejected(
        &job,
        "trialJobSpec.workerPoolSpecs[0].replicaCount must be 1 for the primary pool",
    );
    let mut job = valid();
    job.trial_job_spec.worker_pool_specs.clear();
    assert_rejected(
        &job,
        "trialJobSpec.workerPoolSpecs must contain at least one",
    );
}

#[test]
fn display_name_and_labels_checked() {
    let mut job = valid();
    job.display_name.clear();
    assert_rejected(&job, "displayName is required");
    let mut job = valid();
    job.labels.insert("Bad".into(), "v".into());
    assert_rejected(&job, "labels: key \"Bad\"");
}
