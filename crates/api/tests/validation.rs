//! One test per structural rule checked at create; each asserts the field path.

use trainyard_api::{
    parse_custom_job, parse_hyperparameter_tuning_job, validate_custom_job,
    validate_hyperparameter_tuning_job, AcceleratorType, ContainerSpec, CustomJob, DiskSpec,
    Duration, EnvVar, GcsDestination, MachineSpec, PythonPackageSpec, Scheduling, WorkerPoolSpec,
};

fn valid_job() -> CustomJob {
    parse_custom_job(
        br#"{
          "displayName": "train",
          "jobSpec": {
            "workerPoolSpecs": [
              {"machineSpec": {"machineType": "n1-standard-4"}, "replicaCount": "1",
               "containerSpec": {"imageUri": "python:3.12", "command": ["python", "-c", "print(1)"]}},
              {"machineSpec": {"machineType": "n1-standard-4", "acceleratorType": "NVIDIA_TESLA_T4", "acceleratorCount": 1},
               "replicaCount": "2",
               "containerSpec": {"imageUri": "python:3.12", "env": [{"name": "A_B", "value": "1"}]}}
            ],
            "scheduling": {"timeout": "3600s"},
            "baseOutputDirectory": {"outputUriPrefix": "gs://bucket/out"}
          },
          "labels": {"team": "nlp"}
        }"#,
    )
    .expect("valid document")
}

fn rejected(job: &CustomJob) -> String {
    let err = validate_custom_job(job).expect_err("must be rejected");
    assert_eq!(err.code, trainyard_api::Code::InvalidArgument);
    err.message
}

fn assert_rejected(job: &CustomJob, path: &str) {
    let message = rejected(job);
    assert!(message.contains(path), "expected {path:?} in {message:?}");
}

fn pool(job: &mut CustomJob, i: usize) -> &mut WorkerPoolSpec {
    &mut job.job_spec.worker_pool_specs[i]
}

fn machine(job: &mut CustomJob, i: usize) -> &mut MachineSpec {
    pool(job, i)
        .machine_spec
        .get_or_insert_with(Default::default)
}

fn container(job: &mut CustomJob, i: usize) -> &mut ContainerSpec {
    pool(job, i)
        .container_spec
        .get_or_insert_with(Default::default)
}

#[test]
fn the_reference_job_is_valid() {
    validate_custom_job(&valid_job()).expect("valid");
}

#[test]
fn display_name_is_required() {
    let mut job = valid_job();
    job.display_name.clear();
    assert_rejected(&job, "displayName is required");
}

#[test]
fn display_name_at_most_128_chars() {
    let mut job = valid_job();
    job.display_name = "é".repeat(128);
    validate_custom_job(&job).expect("128 characters are fine");
    job.display_name.push('x');
    assert_rejected(&job, "displayName must be at most 128");
}

#[test]
fn at_least_one_worker_pool() {
    let mut job = valid_job();
    job.job_spec.worker_pool_specs.clear();
    assert_rejected(&job, "jobSpec.workerPoolSpecs must contain at least one");
}

#[test]
fn at_most_four_worker_pools() {
    let mut job = valid_job();
    let extra = job.job_spec.worker_pool_specs[1].clone();
    job.job_spec
        .worker_pool_specs
        .extend([extra.clone(), extra.clone()]);
    validate_custom_job(&job).expect("four pools are fine");
    job.job_spec.worker_pool_specs.push(extra);
    assert_rejected(&job, "jobSpec.workerPoolSpecs has 5 pools");
}

#[test]
fn primary_pool_must_not_be_empty() {
    let mut job = valid_job();
    job.job_spec.worker_pool_specs[0] = WorkerPoolSpec::default();
    assert_rejected(&job, "jobSpec.workerPoolSpecs[0] must not be empty");
}

#[test]
fn empty_placeholder_pools_are_allowed_after_the_primary() {
    let mut job = valid_job();
    let workers = job.job_spec.worker_pool_specs[1].clone();
    job.job_spec.worker_pool_specs = vec![
        job.job_spec.worker_pool_specs[0].clone(),
        WorkerPoolSpec::default(),
        WorkerPoolSpec::default(),
        workers,
    ];
    validate_custom_job(&job).expect("placeholders in the middle");
}

#[test]
fn primary_pool_has_exactly_one_replica() {
    for n in [0, 2] {
        let mut job = valid_job();
        pool(&mut job, 0).replica_count = n;
        let message = rejected(&job);
        assert!(
            message
                .contains("jobSpec.workerPoolSpecs[0].replicaCount must be 1 for the primary pool"),
            "{message}"
        );
    }
}

#[test]
fn replica_count_at_least_one_for_non_empty_pools() {
    let mut job = valid_job();
    pool(&mut job, 1).replica_count = 0;
    assert_rejected(
        &job,
        "jobSpec.workerPoolSpecs[1].replicaCount must be at least 1",
    );
    pool(&mut job, 1).replica_count = -3;
    assert_rejected(
        &job,
        "jobSpec.workerPoolSpecs[1].replicaCount must be at least 1",
    );
}

#[test]
fn replica_count_at_most_1000() {
    let mut job = valid_job();
    pool(&mut job, 1).replica_count = 1000;
    validate_custom_job(&job).expect("1000 is fine");
    pool(&mut job, 1).replica_count = 1001;
    assert_rejected(
        &job,
        "jobSpec.workerPoolSpecs[1].replicaCount must be at most 1000",
    );
}

#[test]
fn machine_spec_is_required() {
    let mut job = valid_job();
    pool(&mut job, 1).machine_spec = None;
    assert_rejected(&job, "jobSpec.workerPoolSpecs[1].machineSpec is required");
}

#[test]
fn machine_type_is_required() {
    let mut job = valid_job();
    machine(&mut job, 0).machine_type.clear();
    assert_rejected(
        &job,
        "jobSpec.workerPoolSpecs[0].machineSpec.machineType is required",
    );
}

#[test]
fn accelerator_count_not_negative() {
    let mut job = valid_job();
    machine(&mut job, 1).accelerator_count = -1;
    assert_rejected(
        &job,
        "jobSpec.workerPoolSpecs[1].machineSpec.acceleratorCount must not be negative",
    );
}

#[test]
fn accelerator_count_positive_when_type_set() {
    let mut job = valid_job();
    machine(&mut job, 1).accelerator_count = 0;
    assert_rejected(
        &job,
        "jobSpec.workerPoolSpecs[1].machineSpec.acceleratorCount must be greater than 0",
    );
}

#[test]
fn accelerator_type_required_when_count_set() {
    let mut job = valid_job();
    let m = machine(&mut job, 1);
    m.accelerator_type = AcceleratorType::Unspecified;
    m.accelerator_count = 2;
    let message = rejected(&job);
    assert!(
        message.contains("jobSpec.workerPoolSpecs[1].machineSpec.acceleratorCount"),
        "{message}"
    );
    assert!(
        message.contains("jobSpec.workerPoolSpecs[1].machineSpec.acceleratorType is not set"),
        "{message}"
    );
}

#[test]
fn exactly_one_of_container_and_python_package() {
    let mut job = valid_job();
    pool(&mut job, 1).container_spec = None;
    assert_rejected(
        &job,
        "jobSpec.workerPoolSpecs[1] must set one of containerSpec or pythonPackageSpec",
    );
    let mut job = valid_job();
    pool(&mut job, 0).python_package_spec = Some(PythonPackageSpec {
        executor_image_uri: "python:3.12".into(),
        package_uris: vec!["gs://b/p.tar.gz".into()],
        python_module: "trainer.task".into(),
        ..Default::default()
    });
    assert_rejected(
        &job,
        "jobSpec.workerPoolSpecs[0] must set exactly one of containerSpec and pythonPackageSpec",
    );
}

#[test]
fn container_image_uri_is_required() {
    let mut job = valid_job();
    container(&mut job, 1).image_uri.clear();
    assert_rejected(
        &job,
        "jobSpec.workerPoolSpecs[1].containerSpec.imageUri is required",
    );
}

#[test]
fn python_package_needs_image_module_and_packages() {
    let good = PythonPackageSpec {
        executor_image_uri: "python:3.12".into(),
        package_uris: vec!["gs://b/p.tar.gz".into()],
        python_module: "trainer.task".into(),
        ..Default::default()
    };
    let with = |spec: PythonPackageSpec| {
        let mut job = valid_job();
        pool(&mut job, 0).container_spec = None;
        pool(&mut job, 0).python_package_spec = Some(spec);
        job
    };
    validate_custom_job(&with(good.clone())).expect("valid python package");
    assert_rejected(
        &with(PythonPackageSpec {
            executor_image_uri: String::new(),
            ..good.clone()
        }),
        "jobSpec.workerPoolSpecs[0].pythonPackageSpec.executorImageUri is required",
    );
    assert_rejected(
        &with(PythonPackageSpec {
            python_module: String::new(),
            ..good.clone()
        }),
        "jobSpec.workerPoolSpecs[0].pythonPackageSpec.pythonModule is required",
    );
    assert_rejected(
        &with(PythonPackageSpec {
            package_uris: vec![],
            ..good.clone()
        }),
        "jobSpec.workerPoolSpecs[0].pythonPackageSpec.packageUris must contain at least one",
    );
    assert_rejected(
        &with(PythonPackageSpec {
            package_uris: vec!["a".into(), "".into()],
            ..good
        }),
        "jobSpec.workerPoolSpecs[0].pythonPackageSpec.packageUris[1] must not be empty",
    );
}

#[test]
fn labels_at_most_64() {
    let mut job = valid_job();
    job.labels = (0..64)
        .map(|i| (format!("k{i}"), "v".to_string()))
        .collect();
    validate_custom_job(&job).expect("64 labels are fine");
    job.labels.insert("k64".into(), "v".into());
    assert_rejected(&job, "labels has 65 entries");
}

#[test]
fn label_keys_and_values_at_most_63_chars() {
    let mut job = valid_job();
    job.labels = [("k".repeat(63), "v".repeat(63))].into_iter().collect();
    validate_custom_job(&job).expect("63 characters are fine");
    job.labels = [("k".repeat(64), "v".into())].into_iter().collect();
    assert_rejected(&job, "labels: key");
    job.labels = [("team".into(), "v".repeat(64))].into_iter().collect();
    assert_rejected(&job, "labels.team: value is longer than 63");
}

#[test]
fn label_key_starts_with_a_lowercase_letter() {
    for key in ["1team", "_team", "Team", ""] {
        let mut job = valid_job();
        job.labels = [(key.to_string(), "v".into())].into_iter().collect();
        assert_rejected(&job, "labels: ");
    }
    let mut job = valid_job();
    job.labels = [("équipe".to_string(), "données".into())]
        .into_iter()
        .collect();
    validate_custom_job(&job).expect("international lowercase letters are allowed");
}

#[test]
fn label_characters_are_restricted() {
    let mut job = valid_job();
    job.labels = [("team.name".to_string(), "v".into())]
        .into_iter()
        .collect();
    assert_rejected(&job, "labels: key \"team.name\" may contain only");
    job.labels = [("team".to_string(), "NLP".into())].into_iter().collect();
    assert_rejected(&job, "labels.team: value \"NLP\" may contain only");
    job.labels = [("team".to_string(), "".into())].into_iter().collect();
    validate_custom_job(&job).expect("an empty value is fine");
}

#[test]
fn timeout_must_be_positive() {
    let mut job = valid_job();
    job.job_spec.scheduling = Some(Scheduling {
        timeout: Some(Duration::from_secs(-5)),
        ..Default::default()
    });
    assert_rejected(&job, "jobSpec.scheduling.timeout must not be negative");
    job.job_spec.scheduling = Some(Scheduling {
        timeout: Some(Duration::from_secs(0)),
        ..Default::default()
    });
    assert_rejected(&job, "jobSpec.scheduling.timeout must be greater than 0");
}

#[test]
fn max_wait_duration_not_negative_but_zero_allowed() {
    let mut job = valid_job();
    job.job_spec.scheduling = Some(Scheduling {
        max_wait_duration: Some(Duration::from_secs(0)),
        ..Default::default()
    });
    validate_custom_job(&job).expect("0 waits forever");
    job.job_spec.scheduling = Some(Scheduling {
        max_wait_duration: Some(Duration::from_millis(-1)),
        ..Default::default()
    });
    assert_rejected(
        &job,
        "jobSpec.scheduling.maxWaitDuration must not be negative",
    );
}

#[test]
fn env_var_names_are_identifiers() {
    for (name, expected) in [
        (
            "",
            "jobSpec.workerPoolSpecs[1].containerSpec.env[0].name is required",
        ),
        (
            "1ABC",
            "jobSpec.workerPoolSpecs[1].containerSpec.env[0].name \"1ABC\" is not a valid",
        ),
        (
            "A-B",
            "jobSpec.workerPoolSpecs[1].containerSpec.env[0].name \"A-B\" is not a valid",
        ),
        (
            "A B",
            "jobSpec.workerPoolSpecs[1].containerSpec.env[0].name \"A B\" is not a valid",
        ),
    ] {
        let mut job = valid_job();
        container(&mut job, 1).env = vec![EnvVar {
            name: name.into(),
            value: "x".into(),
        }];
        assert_rejected(&job, expected);
    }
}

#[test]
fn base_output_directory_forms() {
    for ok in [
        "gs://bucket",
        "gs://bucket/a/b",
        "file:///data/out",
        "/data/out",
        "/data/a..b",
    ] {
        let mut job = valid_job();
        job.job_spec.base_output_directory = Some(GcsDestination {
            output_uri_prefix: ok.into(),
        });
        validate_custom_job(&job).unwrap_or_else(|e| panic!("{ok}: {e}"));
    }
    for bad in [
        "relative/dir",
        "s3://bucket/x",
        "gs:///x",
        "file://host/x",
        "",
        "http://x/y",
    ] {
        let mut job = valid_job();
        job.job_spec.base_output_directory = Some(GcsDestination {
            output_uri_prefix: bad.into(),
        });
        assert_rejected(&job, "jobSpec.baseOutputDirectory.outputUriPrefix");
    }
}

#[test]
fn base_output_directory_has_no_parent_segment() {
    for bad in [
        "gs://bucket/../other",
        "/data/out/..",
        "file:///data/../etc",
        "/data/%2E%2E/etc",
    ] {
        let mut job = valid_job();
        job.job_spec.base_output_directory = Some(GcsDestination {
            output_uri_prefix: bad.into(),
        });
        let message = rejected(&job);
        assert!(
            message.contains("jobSpec.baseOutputDirectory.outputUriPrefix"),
            "{message}"
        );
        assert!(message.contains("'..'"), "{message}");
    }
}

#[test]
fn boot_disk_size_in_range() {
    for (size, ok) in [
        (0, true),
        (100, true),
        (64000, true),
        (99, false),
        (64001, false),
        (-1, false),
    ] {
        let mut job = valid_job();
        pool(&mut job, 0).disk_spec = Some(DiskSpec {
            boot_disk_type: "pd-ssd".into(),
            boot_disk_size_gb: size,
        });
        if ok {
            validate_custom_job(&job).unwrap_or_else(|e| panic!("{size}: {e}"));
        } else {
            assert_rejected(
                &job,
                "jobSpec.workerPoolSpecs[0].diskSpec.bootDiskSizeGb must be between 100 and 64000",
            );
        }
    }
}

#[test]
fn nfs_mount_fields_are_required() {
    let mut job = valid_job();
    pool(&mut job, 1).nfs_mounts = vec![trainyard_api::NfsMount {
        server: "10.0.0.1".into(),
        path: "/export".into(),
        mount_point: String::new(),
    }];
    assert_rejected(
        &job,
        "jobSpec.workerPoolSpecs[1].nfsMounts[0].mountPoint is required",
    );
}

// ---- NUL characters: refused at create (they cannot reach a process) ----

fn python_job(spec: PythonPackageSpec) -> CustomJob {
    let mut job = valid_job();
    pool(&mut job, 0).container_spec = None;
    pool(&mut job, 0).python_package_spec = Some(spec);
    job
}

fn good_python() -> PythonPackageSpec {
    PythonPackageSpec {
        executor_image_uri: "python:3.12".into(),
        package_uris: vec!["gs://b/p.tar.gz".into()],
        python_module: "trainer.task".into(),
        args: vec!["--epochs=5".into()],
        env: vec![EnvVar {
            name: "MODE".into(),
            value: "fast".into(),
        }],
    }
}

const NUL: &str = "must not contain a NUL character";

#[test]
fn container_command_and_args_have_no_nul() {
    let mut job = valid_job();
    container(&mut job, 0).command = vec!["python".into(), "-c\0".into()];
    assert_rejected(
        &job,
        &format!("jobSpec.workerPoolSpecs[0].containerSpec.command[1] {NUL}"),
    );
    let mut job = valid_job();
    container(&mut job, 1).args = vec!["\0".into()];
    assert_rejected(
        &job,
        &format!("jobSpec.workerPoolSpecs[1].containerSpec.args[0] {NUL}"),
    );
    let mut job = valid_job();
    container(&mut job, 0).image_uri = "python:3.12\0".into();
    assert_rejected(
        &job,
        &format!("jobSpec.workerPoolSpecs[0].containerSpec.imageUri {NUL}"),
    );
}

#[test]
fn container_env_has_no_nul() {
    let mut job = valid_job();
    container(&mut job, 1).env[0].value = "a\0b".into();
    assert_rejected(
        &job,
        &format!("jobSpec.workerPoolSpecs[1].containerSpec.env[0].value {NUL}"),
    );
    let mut job = valid_job();
    container(&mut job, 1).env.push(EnvVar {
        name: "A\0".into(),
        value: "x".into(),
    });
    assert_rejected(
        &job,
        &format!("jobSpec.workerPoolSpecs[1].containerSpec.env[1].name {NUL}"),
    );
}

#[test]
fn env_var_names_are_not_empty_and_have_no_equals_sign() {
    for (name, expected) in [
        (
            "",
            "jobSpec.workerPoolSpecs[0].pythonPackageSpec.env[0].name is required",
        ),
        (
            "A=B",
            "jobSpec.workerPoolSpecs[0].pythonPackageSpec.env[0].name \"A=B\" is not a valid",
        ),
        (
            "=",
            "jobSpec.workerPoolSpecs[0].pythonPackageSpec.env[0].name \"=\" is not a valid",
        ),
    ] {
        let mut spec = good_python();
        spec.env[0].name = name.into();
        assert_rejected(&python_job(spec), expected);
    }
}

#[test]
fn python_package_fields_have_no_nul() {
    validate_custom_job(&python_job(good_python())).expect("valid python package");
    let p = "jobSpec.workerPoolSpecs[0].pythonPackageSpec";
    type Case = (fn(&mut PythonPackageSpec), String);
    let cases: [Case; 7] = [
        (
            |s| s.python_module = "trainer\0task".into(),
            format!("{p}.pythonModule {NUL}"),
        ),
        (
            |s| s.package_uris.push("gs://b/\0".into()),
            format!("{p}.packageUris[1] {NUL}"),
        ),
        (|s| s.args = vec!["\0".into()], format!("{p}.args[0] {NUL}")),
        (
            |s| s.env[0].value = "\0".into(),
            format!("{p}.env[0].value {NUL}"),
        ),
        (
            |s| s.env[0].name = "MO\0DE".into(),
            format!("{p}.env[0].name {NUL}"),
        ),
        (
            |s| s.executor_image_uri.push('\0'),
            format!("{p}.executorImageUri {NUL}"),
        ),
        (|s| s.args.push("ok".into()), String::new()),
    ];
    for (change, expected) in cases {
        let mut spec = good_python();
        change(&mut spec);
        if expected.is_empty() {
            validate_custom_job(&python_job(spec)).expect("valid");
        } else {
            assert_rejected(&python_job(spec), &expected);
        }
    }
}

/// A NUL written as `\u0000` in the request body reaches validation and is refused.
#[test]
fn nul_escape_in_the_document_is_refused() {
    let job = parse_custom_job(
        br#"{"displayName": "t", "jobSpec": {"workerPoolSpecs": [
          {"machineSpec": {"machineType": "n1-standard-4"}, "replicaCount": "1",
           "containerSpec": {"imageUri": "python:3.12", "command": ["python3", "-c", "print(1)\u0000"]}}]}}"#,
    )
    .expect("parses");
    assert_rejected(
        &job,
        &format!("jobSpec.workerPoolSpecs[0].containerSpec.command[2] {NUL}"),
    );
}

#[test]
fn trial_job_spec_has_no_nul() {
    let doc = |pool: &str| {
        format!(
            r#"{{"displayName": "hp",
              "studySpec": {{"metrics": [{{"metricId": "loss", "goal": "MINIMIZE"}}],
                "parameters": [{{"parameterId": "n", "integerValueSpec": {{"minValue": 1, "maxValue": 4}}}}]}},
              "maxTrialCount": 4, "parallelTrialCount": 2,
              "trialJobSpec": {{"workerPoolSpecs": [{pool}]}}}}"#
        )
    };
    let machine = r#""machineSpec": {"machineType": "n1-standard-4"}, "replicaCount": "1""#;
    let container =
        |c: &str| format!(r#"{{{machine}, "containerSpec": {{"imageUri": "python:3.12", {c}}}}}"#);
    let python = |c: &str| {
        format!(
            r#"{{{machine}, "pythonPackageSpec": {{"executorImageUri": "python:3.12",
              "packageUris": ["gs://b/p.tar.gz"], "pythonModule": "t.task", {c}}}}}"#
        )
    };
    let p = "trialJobSpec.workerPoolSpecs[0]";
    for (pool, expected) in [
        (container(r#""command": ["a"]"#), String::new()),
        (
            container(r#""command": ["a", "b\u0000"]"#),
            format!("{p}.containerSpec.command[1] {NUL}"),
        ),
        (
            container(r#""args": ["\u0000"]"#),
            format!("{p}.containerSpec.args[0] {NUL}"),
        ),
        (
            container(r#""env": [{"name": "A", "value": "\u0000"}]"#),
            format!("{p}.containerSpec.env[0].value {NUL}"),
        ),
        (
            container(r#""env": [{"name": "A=B", "value": "1"}]"#),
            format!("{p}.containerSpec.env[0].name \"A=B\" is not a valid"),
        ),
        (python(r#""args": ["x"]"#), String::new()),
        (
            python(r#""args": ["x", "\u0000"]"#),
            format!("{p}.pythonPackageSpec.args[1] {NUL}"),
        ),
        (
            python(r#""env": [{"name": "\u0000", "value": "1"}]"#),
            format!("{p}.pythonPackageSpec.env[0].name {NUL}"),
        ),
        (
            python(r#""env": [{"name": "", "value": "1"}]"#),
            format!("{p}.pythonPackageSpec.env[0].name is required"),
        ),
    ] {
        let job = parse_hyperparameter_tuning_job(doc(&pool).as_bytes()).expect("parses");
        let result = validate_hyperparameter_tuning_job(&job);
        if expected.is_empty() {
            result.expect("valid");
        } else {
            let err = result.expect_err("must be rejected");
            assert_eq!(err.code, trainyard_api::Code::InvalidArgument);
            assert!(
                err.message.contains(&expected),
                "expected {expected:?} in {:?}",
                err.message
            );
        }
    }
    // pythonModule and packageUris of a trial's python package.
    let pool = python(r#""args": []"#).replace("t.task", "t.\\u0000task");
    let job = parse_hyperparameter_tuning_job(doc(&pool).as_bytes()).expect("parses");
    let err = validate_hyperparameter_tuning_job(&job).expect_err("must be rejected");
    assert!(
        err.message
            .contains(&format!("{p}.pythonPackageSpec.pythonModule {NUL}")),
        "{}",
        err.message
    );
    let pool = python(r#""args": []"#).replace("p.tar.gz\"", "p.tar.gz\", \"\\u0000\"");
    let job = parse_hyperparameter_tuning_job(doc(&pool).as_bytes()).expect("parses");
    let err = validate_hyperparameter_tuning_job(&job).expect_err("must be rejected");
    assert!(
        err.message
            .contains(&format!("{p}.pythonPackageSpec.packageUris[1] {NUL}")),
        "{}",
        err.message
    );
}

#[test]
fn nfs_mount_fields_have_no_nul() {
    let mount = trainyard_api::NfsMount {
        server: "10.0.0.1".into(),
        path: "/export".into(),
        mount_point: "data".into(),
    };
    let mut job = valid_job();
    pool(&mut job, 1).nfs_mounts = vec![mount.clone()];
    validate_custom_job(&job).expect("valid mount");
    for (m, field) in [
        (
            trainyard_api::NfsMount {
                server: "10.0.0.1\0".into(),
                ..mount.clone()
            },
            "server",
        ),
        (
            trainyard_api::NfsMount {
                path: "/ex\0port".into(),
                ..mount.clone()
            },
            "path",
        ),
        (
            trainyard_api::NfsMount {
                mount_point: "\0data".into(),
                ..mount.clone()
            },
            "mountPoint",
        ),
    ] {
        let mut job = valid_job();
        pool(&mut job, 1).nfs_mounts = vec![m];
        assert_rejected(
            &job,
            &format!("jobSpec.workerPoolSpecs[1].nfsMounts[0].{field} {NUL}"),
        );
    }
}
