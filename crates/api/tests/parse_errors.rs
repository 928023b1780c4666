//! Request bodies the parser must refuse, with the service's error text.

use trainyard_api::{parse_custom_job, parse_hyperparameter_tuning_job, ApiError, Code};

fn refuse(body: &[u8]) -> ApiError {
    let err = parse_custom_job(body).expect_err("must be refused");
    assert_eq!(err.code, Code::InvalidArgument, "{}", err.message);
    assert_eq!(err.http_status(), 400);
    err
}

#[test]
fn unknown_field_at_top_level() {
    let err = refuse(br#"{"displayName": "x", "foo": 1}"#);
    assert_eq!(
        err.message,
        "Invalid JSON payload received. Unknown name \"foo\" at 'custom_job': Cannot find field."
    );
}

#[test]
fn unknown_field_nested_in_job_spec() {
    let err = refuse(
        br#"{"displayName": "x", "jobSpec": {"workerPoolSpecs": [], "foo": {"a": [1, 2]}}}"#,
    );
    assert_eq!(
        err.message,
        "Invalid JSON payload received. Unknown name \"foo\" at 'custom_job.job_spec': Cannot find field."
    );
}

#[test]
fn unknown_field_deep_in_a_pool_names_the_path() {
    let body = br#"{
  "displayName": "x",
  "jobSpec": {
    "workerPoolSpecs": [
      {"machineSpec": {"machineType": "n1-standard-4"}, "replicaCount": "1"},
      {"machineSpec": {"machineType": "n1-standard-4", "gpuCount": 2}}
    ]
  }
}"#;
    let err = refuse(body);
    assert_eq!(
        err.message,
        "Invalid JSON payload received. Unknown name \"gpuCount\" at \
         'custom_job.job_spec.worker_pool_specs[1].machine_spec': Cannot find field."
    );
}

#[test]
fn unknown_field_after_strings_with_brackets_and_escapes() {
    let err = refuse(br#"{"displayName": "a \"[{\" b", "labels": {"k": "v,}"}, "jobSpec": {"network": "n"}, "bogus_field": true}"#);
    assert!(
        err.message
            .contains("Unknown name \"bogus_field\" at 'custom_job':"),
        "{}",
        err.message
    );
}

#[test]
fn duplicate_field_via_alias_is_refused() {
    let err = refuse(br#"{"displayName": "a", "display_name": "b"}"#);
    assert!(err.message.contains("Duplicate field"), "{}", err.message);
    assert!(err.message.contains("'custom_job'"), "{}", err.message);
}

#[test]
fn wrong_types_name_the_field() {
    let cases: [(&[u8], &str); 6] = [
        (br#"{"displayName": 5}"#, "'custom_job.display_name'"),
        (br#"{"labels": {"team": 5}}"#, "'custom_job.labels[team]'"),
        (br#"{"jobSpec": {"workerPoolSpecs": {"a": 1}}}"#, "'custom_job.job_spec.worker_pool_specs'"),
        (
            br#"{"jobSpec": {"workerPoolSpecs": [{"containerSpec": {"args": ["a", 7]}}]}}"#,
            "'custom_job.job_spec.worker_pool_specs[0].container_spec.args[1]'",
        ),
        (br#"{"jobSpec": {"enableWebAccess": "yes"}}"#, "'custom_job.job_spec.enable_web_access'"),
        (
            br#"{"job_spec": {"worker_pool_specs": [{"disk_spec": {"boot_disk_size_gb": "big"}}]}}"#,
            "'custom_job.job_spec.worker_pool_specs[0].disk_spec.boot_disk_size_gb'",
        ),
    ];
    for (body, path) in cases {
        let err = refuse(body);
        assert!(
            err.message
                .starts_with("Invalid JSON payload received. Invalid value at"),
            "{}",
            err.message
        );
        assert!(err.message.contains(path), "{path}: {}", err.message);
    }
}

#[test]
fn syntax_errors_say_what_was_expected_and_where() {
    let err = refuse(br#"{"displayName": "x" "jobSpec": {}}"#);
    assert_eq!(
        err.message,
        "Invalid JSON payload received. Expected , or } after key:value pair. (line 1 column 21)"
    );
    let err = refuse(b"{\n  \"displayName\" \"x\"\n}");
    assert_eq!(
        err.message,
        "Invalid JSON payload received. Expected : between key:value pair. (line 2 column 17)"
    );
    let err = refuse(br#"{"labels": {"a": "b"}"#);
    assert!(
        err.message.contains("Unexpected end of string"),
        "{}",
        err.message
    );
    let err = refuse(br#"{"displayName": "x",}"#);
    assert!(err.message.contains("Trailing comma"), "{}", err.message);
    let err = refuse(br#"{"displayName": "x"} extra"#);
    assert!(
        err.message.contains("Unexpected data after the end"),
        "{}",
        err.message
    );
}

#[test]
fn nesting_deeper_than_64_levels_is_refused_before_parsing() {
    // pscInterfaceConfig is free-form JSON, so only the depth limit stops this.
    let deep = |levels: usize| {
        let inner = levels - 2; // the body object and the jobSpec object
        format!(
            r#"{{"jobSpec": {{"pscInterfaceConfig": {}{}}}}}"#,
            "[".repeat(inner),
            "]".repeat(inner)
        )
    };
    let ok = parse_custom_job(deep(64).as_bytes()).expect("64 levels are fine");
    assert!(ok.job_spec.psc_interface_config.is_some());
    let err = refuse(deep(65).as_bytes());
    assert!(
        err.message.contains("deeper than 64 levels"),
        "{}",
        err.message
    );
    // Brackets inside strings do not count.
    let in_string = format!(r#"{{"displayName": "{}"}}"#, "[".repeat(200));
    parse_custom_job(in_string.as_bytes()).expect("brackets in a string");
    // Very deep input never reaches serde (no stack overflow).
    let huge = "[".repeat(100_000);
    let err = refuse(huge.as_bytes());
    assert!(
        err.message.contains("deeper than 64 levels"),
        "{}",
        err.message
    );
}

#[test]
fn invalid_utf8_is_refused() {
    let err = refuse(b"{\"displayName\": \"caf\xc3\x28\"}");
    assert!(err.message.contains("not valid UTF-8"), "{}", err.message);
    assert!(err.message.contains("offset 20"), "{}", err.message);
    let err = refuse(b"\xff{}");
    assert!(err.message.contains("not valid UTF-8"), "{}", err.message);
}

#[test]
fn top_level_must_be_an_object() {
    for body in [&b"[]"[..], b"5", b"\"job\"", b"null"] {
        let err = refuse(body);
        assert!(
            err.message
                .contains("Expected a JSON object for 'custom_job'"),
            "{}",
            err.message
        );
    }
}

#[test]
fn empty_body_is_an_empty_job() {
    let job = parse_custom_job(b"").expect("empty body");
    assert_eq!(job, Default::default());
    let job = parse_custom_job(b"  \n ").expect("blank body");
    assert_eq!(job, Default::default());
    let err = trainyard_api::validate_custom_job(&job).expect_err("but not a valid one");
    assert!(err.message.contains("displayName"), "{}", err.message);
}

#[test]
fn hyperparameter_tuning_job_errors_use_its_own_root() {
    let err = parse_hyperparameter_tuning_job(
        br#"{"studySpec": {"metrics": [{"metricId": "a", "target": 1}]}}"#,
    )
    .expect_err("unknown field");
    assert_eq!(
        err.message,
        "Invalid JSON payload received. Unknown name \"target\" at \
         'hyperparameter_tuning_job.study_spec.metrics[0]': Cannot find field."
    );
    let err =
        parse_hyperparameter_tuning_job(br#"{"maxTrialCount": "many"}"#).expect_err("bad int");
    assert!(
        err.message
            .contains("'hyperparameter_tuning_job.max_trial_count'"),
        "{}",
        err.message
    );
}
