//! Round trips of realistic request and resource documents through the wire types.

use serde_json::{json, Value};
use trainyard_api::{
    encode_enums_as_int, parse_custom_job, AcceleratorType, CustomJob, Duration, JobState,
    ListCustomJobsResponse, Strategy, Timestamp,
};

/// What the Python SDK sends with `enum-encoding=int`: enums as numbers, int64 as
/// strings, durations as strings.
const SDK_GPU_JOB: &str = r#"{
  "displayName": "resnet50-imagenet",
  "jobSpec": {
    "workerPoolSpecs": [
      {
        "machineSpec": {"machineType": "n1-standard-8", "acceleratorType": 5, "acceleratorCount": 2},
        "replicaCount": "1",
        "containerSpec": {
          "imageUri": "us-docker.pkg.dev/vertex-ai/training/tf-gpu.2-12.py310:latest",
          "command": ["python3", "-m", "trainer.task"],
          "args": ["--epochs=90", "--batch-size=256"],
          "env": [{"name": "TF_CPP_MIN_LOG_LEVEL", "value": "2"}]
        },
        "diskSpec": {"bootDiskType": "pd-ssd", "bootDiskSizeGb": 200}
      },
      {
        "machineSpec": {"machineType": "n1-standard-8", "acceleratorType": "5", "acceleratorCount": "2"},
        "replicaCount": 3,
        "containerSpec": {
          "imageUri": "us-docker.pkg.dev/vertex-ai/training/tf-gpu.2-12.py310:latest",
          "command": ["python3", "-m", "trainer.task"]
        }
      }
    ],
    "scheduling": {"timeout": "86400s", "restartJobOnWorkerRestart": false, "strategy": 4},
    "serviceAccount": "trainer@my-project.iam.gserviceaccount.com",
    "baseOutputDirectory": {"outputUriPrefix": "gs://my-bucket/resnet/run-1"},
    "enableWebAccess": true
  },
  "labels": {"team": "vision", "env": "dev"}
}"#;

/// Raw proto field names (snake_case), as some clients and YAML configs use.
const SNAKE_CASE_JOB: &str = r#"{
  "display_name": "xgboost-census",
  "job_spec": {
    "worker_pool_specs": [
      {
        "machine_spec": {"machine_type": "n1-standard-4"},
        "replica_count": 1,
        "python_package_spec": {
          "executor_image_uri": "us-docker.pkg.dev/vertex-ai/training/xgboost-cpu.1-1:latest",
          "package_uris": ["gs://my-bucket/dist/trainer-0.1.tar.gz"],
          "python_module": "trainer.task",
          "args": ["--learning-rate", "0.1"],
          "env": [{"name": "_MODE", "value": "full"}]
        }
      },
      {},
      {
        "machine_spec": {"machine_type": "n1-highmem-2", "accelerator_type": "ACCELERATOR_TYPE_UNSPECIFIED"},
        "replica_count": "2",
        "python_package_spec": {
          "executor_image_uri": "us-docker.pkg.dev/vertex-ai/training/xgboost-cpu.1-1:latest",
          "package_uris": ["gs://my-bucket/dist/trainer-0.1.tar.gz"],
          "python_module": "trainer.eval"
        },
        "nfs_mounts": [{"server": "10.0.0.2", "path": "/exports/data", "mount_point": "data"}]
      }
    ],
    "scheduling": {"timeout": "1.5s", "max_wait_duration": "0s", "strategy": "FLEX_START", "disable_retries": true},
    "base_output_directory": {"output_uri_prefix": "/srv/trainyard/out/xgb"},
    "reserved_ip_ranges": ["range-a"],
    "protected_artifact_location_id": "us-central1"
  },
  "labels": {"owner": "data-eng"},
  "encryption_spec": {"kms_key_name": "projects/p/locations/l/keyRings/r/cryptoKeys/k"}
}"#;

/// A resource as the server answers it, with every output-only field set.
const SERVED_JOB: &str = r#"{
  "name": "projects/my-project/locations/us-central1/customJobs/42",
  "displayName": "bert-finetune",
  "jobSpec": {
    "workerPoolSpecs": [
      {
        "machineSpec": {"machineType": "a2-highgpu-1g", "acceleratorType": "NVIDIA_TESLA_A100", "acceleratorCount": 1},
        "replicaCount": "1",
        "containerSpec": {"imageUri": "europe-docker.pkg.dev/my-project/train/bert:3", "args": ["--task=squad"]}
      }
    ],
    "scheduling": {"timeout": "3600s", "maxWaitDuration": "-5s"},
    "baseOutputDirectory": {"outputUriPrefix": "file:///data/out/bert"}
  },
  "state": "JOB_STATE_FAILED",
  "createTime": "2026-11-29T10:00:00.123456Z",
  "startTime": "2026-11-29T10:01:00Z",
  "endTime": "2026-11-29T11:00:00.500Z",
  "updateTime": "2026-11-29T11:00:00.500Z",
  "error": {"code": 3, "message": "The replica workerpool0-0 exited with a non-zero status of 1. Termination reason: Error."},
  "labels": {"team": "nlp"},
  "webAccessUris": {"workerpool0-0": "https://example.invalid/shell/0"}
}"#;

fn to_value(job: &CustomJob) -> Value {
    serde_json::to_value(job).expect("serialise")
}

#[test]
fn sdk_job_with_numeric_enums_and_int64_strings() {
    let job = parse_custom_job(SDK_GPU_JOB.as_bytes()).expect("parse");
    let pools = &job.job_spec.worker_pool_specs;
    assert_eq!(pools.len(), 2);
    assert_eq!(pools[0].replica_count, 1);
    assert_eq!(pools[1].replica_count, 3);
    let m0 = pools[0].machine_spec.as_ref().expect("machine spec");
    assert_eq!(m0.accelerator_type, AcceleratorType::NvidiaTeslaT4);
    let m1 = pools[1].machine_spec.as_ref().expect("machine spec");
    assert_eq!(
        (m1.accelerator_type, m1.accelerator_count),
        (AcceleratorType::NvidiaTeslaT4, 2)
    );
    let scheduling = job.job_spec.scheduling.as_ref().expect("scheduling");
    assert_eq!(scheduling.strategy, Strategy::Spot);
    assert_eq!(scheduling.timeout, Some(Duration::from_secs(86400)));
    assert_eq!(job.labels.get("team").map(String::as_str), Some("vision"));

    let out = to_value(&job);
    assert_eq!(out["displayName"], "resnet50-imagenet");
    assert_eq!(out["jobSpec"]["workerPoolSpecs"][0]["replicaCount"], "1");
    assert_eq!(out["jobSpec"]["workerPoolSpecs"][1]["replicaCount"], "3");
    assert_eq!(
        out["jobSpec"]["workerPoolSpecs"][0]["machineSpec"]["acceleratorType"],
        "NVIDIA_TESLA_T4"
    );
    assert_eq!(
        out["jobSpec"]["workerPoolSpecs"][0]["machineSpec"]["acceleratorCount"],
        2
    );
    assert_eq!(
        out["jobSpec"]["workerPoolSpecs"][0]["diskSpec"]["bootDiskSizeGb"],
        200
    );
    assert_eq!(
        out["jobSpec"]["scheduling"],
        json!({"timeout": "86400s", "strategy": "SPOT"})
    );
    assert_eq!(out["jobSpec"]["enableWebAccess"], true);
    // Defaults are omitted.
    assert!(out.get("state").is_none());
    assert!(out.get("name").is_none());
    assert!(out["jobSpec"].get("network").is_none());

    // Output parses back to the same job.
    let again: CustomJob = serde_json::from_value(out.clone()).expect("reparse");
    assert_eq!(again, job);

    let mut ints = out;
    encode_enums_as_int(&mut ints);
    assert_eq!(
        ints["jobSpec"]["workerPoolSpecs"][0]["machineSpec"]["acceleratorType"],
        5
    );
    assert_eq!(ints["jobSpec"]["scheduling"]["strategy"], 4);
    // int64 stay strings, labels stay as they are.
    assert_eq!(ints["jobSpec"]["workerPoolSpecs"][1]["replicaCount"], "3");
    assert_eq!(ints["labels"], json!({"team": "vision", "env": "dev"}));
}

#[test]
fn snake_case_input_gives_camel_case_output() {
    let job = parse_custom_job(SNAKE_CASE_JOB.as_bytes()).expect("parse");
    assert_eq!(job.display_name, "xgboost-census");
    let pools = &job.job_spec.worker_pool_specs;
    assert_eq!(pools.len(), 3);
    assert!(pools[1].is_empty(), "an empty placeholder pool is accepted");
    assert_eq!(pools[2].replica_count, 2);
    assert_eq!(pools[2].nfs_mounts[0].mount_point, "data");
    let scheduling = job.job_spec.scheduling.as_ref().expect("scheduling");
    assert_eq!(
        scheduling.timeout,
        Some(Duration {
            seconds: 1,
            nanos: 500_000_000
        })
    );
    assert_eq!(scheduling.max_wait_duration, Some(Duration::from_secs(0)));
    assert_eq!(scheduling.strategy, Strategy::FlexStart);
    assert!(scheduling.disable_retries);

    let out = to_value(&job);
    let expected = json!({
        "displayName": "xgboost-census",
        "jobSpec": {
            "workerPoolSpecs": [
                {
                    "machineSpec": {"machineType": "n1-standard-4"},
                    "replicaCount": "1",
                    "pythonPackageSpec": {
                        "executorImageUri": "us-docker.pkg.dev/vertex-ai/training/xgboost-cpu.1-1:latest",
                        "packageUris": ["gs://my-bucket/dist/trainer-0.1.tar.gz"],
                        "pythonModule": "trainer.task",
                        "args": ["--learning-rate", "0.1"],
                        "env": [{"name": "_MODE", "value": "full"}]
                    }
                },
                {},
                {
                    "machineSpec": {"machineType": "n1-highmem-2"},
                    "replicaCount": "2",
                    "pythonPackageSpec": {
                        "executorImageUri": "us-docker.pkg.dev/vertex-ai/training/xgboost-cpu.1-1:latest",
                        "packageUris": ["gs://my-bucket/dist/trainer-0.1.tar.gz"],
                        "pythonModule": "trainer.eval"
                    },
                    "nfsMounts": [{"server": "10.0.0.2", "path": "/exports/data", "mountPoint": "data"}]
                }
            ],
            "scheduling": {"timeout": "1.5s", "strategy": "FLEX_START", "disableRetries": true, "maxWaitDuration": "0s"},
            "reservedIpRanges": ["range-a"],
            "baseOutputDirectory": {"outputUriPrefix": "/srv/trainyard/out/xgb"},
            "protectedArtifactLocationId": "us-central1"
        },
        "labels": {"owner": "data-eng"},
        "encryptionSpec": {"kmsKeyName": "projects/p/locations/l/keyRings/r/cryptoKeys/k"}
    });
    assert_eq!(out, expected);
    trainyard_api::validate_custom_job(&job).expect("valid");
}

#[test]
fn served_job_round_trips_exactly() {
    let job: CustomJob = serde_json::from_str(SERVED_JOB).expect("parse");
    assert_eq!(job.state, JobState::Failed);
    assert_eq!(
        job.create_time,
        Some(Timestamp::parse_rfc3339("2026-11-29T10:00:00.123456Z").expect("ts"))
    );
    assert_eq!(job.error.as_ref().map(|e| e.code), Some(3));
    let out = to_value(&job);
    let original: Value = serde_json::from_str(SERVED_JOB).expect("json");
    assert_eq!(out, original);

    let mut ints = out;
    encode_enums_as_int(&mut ints);
    assert_eq!(ints["state"], 5);
    assert_eq!(
        ints["jobSpec"]["workerPoolSpecs"][0]["machineSpec"]["acceleratorType"],
        8
    );
    assert_eq!(ints["error"]["code"], 3);

    // A list answer is walked too.
    let list = ListCustomJobsResponse {
        custom_jobs: vec![job.clone()],
        next_page_token: "t".into(),
    };
    let mut lv = serde_json::to_value(&list).expect("list");
    encode_enums_as_int(&mut lv);
    assert_eq!(lv["customJobs"][0]["state"], 5);
    assert_eq!(lv["nextPageToken"], "t");
}

#[test]
fn create_ignores_output_only_fields() {
    let job = parse_custom_job(SERVED_JOB.as_bytes()).expect("parse");
    assert_eq!(job.name, "");
    assert_eq!(job.state, JobState::Unspecified);
    assert_eq!(job.create_time, None);
    assert_eq!(job.start_time, None);
    assert_eq!(job.end_time, None);
    assert_eq!(job.update_time, None);
    assert_eq!(job.error, None);
    assert!(job.web_access_uris.is_empty());
    assert_eq!(job.display_name, "bert-finetune");
    assert_eq!(job.labels.len(), 1);
}

#[test]
fn int64_accepts_numbers_strings_and_integral_floats() {
    for (text, expected) in [
        (r#""7""#, 7),
        ("7", 7),
        ("7.0", 7),
        (r#""1e3""#, 1000),
        (r#""-2""#, -2),
        (r#""9223372036854775807""#, i64::MAX),
    ] {
        let body = format!(r#"{{"jobSpec": {{"workerPoolSpecs": [{{"replicaCount": {text}}}]}}}}"#);
        let job = parse_custom_job(body.as_bytes()).expect(text);
        assert_eq!(
            job.job_spec.worker_pool_specs[0].replica_count, expected,
            "{text}"
        );
    }
    for bad in [
        r#""7.5""#,
        "7.5",
        r#""abc""#,
        r#""9223372036854775808""#,
        "true",
        r#""""#,
    ] {
        let body = format!(r#"{{"jobSpec": {{"workerPoolSpecs": [{{"replicaCount": {bad}}}]}}}}"#);
        let err = parse_custom_job(body.as_bytes()).expect_err(bad);
        assert!(
            err.message
                .contains("custom_job.job_spec.worker_pool_specs[0].replica_count"),
            "{bad}: {}",
            err.message
        );
    }
}

#[test]
fn enums_accept_names_numbers_and_numeric_strings() {
    for text in [r#""JOB_STATE_RUNNING""#, "3", r#""3""#] {
        let body = format!(r#"{{"state": {text}}}"#);
        let job: CustomJob = serde_json::from_str(&body).expect(text);
        assert_eq!(job.state, JobState::Running, "{text}");
    }
    let err = parse_custom_job(
        br#"{"jobSpec": {"workerPoolSpecs": [{"machineSpec": {"acceleratorType": "NVIDIA_TESLA_Z9"}}]}}"#,
    )
    .expect_err("unknown accelerator");
    assert!(err.message.contains("NVIDIA_TESLA_Z9"), "{}", err.message);
    assert!(
        err.message.contains("machine_spec.accelerator_type"),
        "{}",
        err.message
    );
    let err = parse_custom_job(br#"{"jobSpec": {"scheduling": {"strategy": 5}}}"#)
        .expect_err("5 is no strategy");
    assert!(err.message.contains("unknown value 5"), "{}", err.message);
}

#[test]
fn durations_and_timestamps_on_the_wire() {
    let job: CustomJob = serde_json::from_str(
        r#"{"jobSpec": {"scheduling": {"timeout": "0.000001s", "maxWaitDuration": "-1.5s"}},
            "createTime": "2026-11-29T19:00:00.5+09:00"}"#,
    )
    .expect("parse");
    let out = to_value(&job);
    assert_eq!(out["jobSpec"]["scheduling"]["timeout"], "0.000001s");
    assert_eq!(out["jobSpec"]["scheduling"]["maxWaitDuration"], "-1.5s");
    assert_eq!(out["createTime"], "2026-11-29T10:00:00.500Z");

    let err = parse_custom_job(br#"{"jobSpec": {"scheduling": {"timeout": "10m"}}}"#)
        .expect_err("10m is not a proto duration");
    assert!(err.message.contains("\"10m\""), "{}", err.message);
    assert!(
        err.message
            .contains("custom_job.job_spec.scheduling.timeout"),
        "{}",
        err.message
    );
    let err = parse_custom_job(br#"{"jobSpec": {"scheduling": {"timeout": 60}}}"#)
        .expect_err("a number is not a duration");
    assert!(
        err.message
            .contains("custom_job.job_spec.scheduling.timeout"),
        "{}",
        err.message
    );
}

#[test]
fn encode_enums_as_int_leaves_free_form_fields_alone() {
    let mut v = json!({
        "state": "JOB_STATE_QUEUED",
        "labels": {"state": "JOB_STATE_RUNNING", "strategy": "SPOT"},
        "jobSpec": {"scheduling": {"strategy": "NOT_A_STRATEGY"}},
        "error": {"code": 1, "details": [{"state": "JOB_STATE_RUNNING"}]}
    });
    encode_enums_as_int(&mut v);
    assert_eq!(
        v,
        json!({
            "state": 1,
            "labels": {"state": "JOB_STATE_RUNNING", "strategy": "SPOT"},
            "jobSpec": {"scheduling": {"strategy": "NOT_A_STRATEGY"}},
            "error": {"code": 1, "details": [{"state": "JOB_STATE_RUNNING"}]}
        })
    );
}
