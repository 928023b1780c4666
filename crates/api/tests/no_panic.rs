//! No input crashes the parser or the validator: arbitrary bytes, arbitrary JSON, and
//! mutations of a real job document all end in Ok or in an error in the API's shape.

use proptest::prelude::*;
use serde_json::{json, Value};

fn arb_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(|f| json!(f)),
        ".{0,12}".prop_map(Value::String),
        Just(json!("JOB_STATE_RUNNING")),
        Just(json!("-5s")),
        Just(json!("99999999999999999999")),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(
                prop_oneof![
                    Just("displayName".to_string()),
                    Just("jobSpec".to_string()),
                    Just("workerPoolSpecs".to_string()),
                    Just("machineSpec".to_string()),
                    Just("replicaCount".to_string()),
                    Just("containerSpec".to_string()),
                    Just("scheduling".to_string()),
                    Just("labels".to_string()),
                    Just("timeout".to_string()),
                    Just("studySpec".to_string()),
                    Just("parameters".to_string()),
                    "[a-zA-Z_]{1,10}",
                    ".{1,6}",
                ],
                inner,
                0..5,
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn check(bytes: &[u8]) {
    match trainyard_api::parse_custom_job(bytes) {
        Ok(job) => {
            if let Err(e) = trainyard_api::validate_custom_job(&job) {
                assert_eq!(e.to_json()["error"]["code"], 400);
            }
        }
        Err(e) => {
            assert_eq!(e.http_status(), 400);
            assert!(!e.message.is_empty());
        }
    }
    match trainyard_api::parse_hyperparameter_tuning_job(bytes) {
        Ok(job) => {
            let _ = trainyard_api::validate_hyperparameter_tuning_job(&job);
        }
        Err(e) => assert_eq!(e.http_status(), 400),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        check(&bytes);
    }

    #[test]
    fn arbitrary_json_never_panics(v in arb_json()) {
        check(v.to_string().as_bytes());
    }

    #[test]
    fn mutated_job_never_panics(path in 0usize..12, v in arb_json()) {
        let mut job = json!({
            "displayName": "x",
            "labels": {"team": "nlp"},
            "jobSpec": {
                "workerPoolSpecs": [{"machineSpec": {"machineType": "n1-standard-4", "acceleratorCount": 1},
                    "replicaCount": "1", "containerSpec": {"imageUri": "i", "command": ["a"], "env": [{"name": "A", "value": "b"}]}}],
                "scheduling": {"timeout": "60s", "strategy": "SPOT"},
                "baseOutputDirectory": {"outputUriPrefix": "gs://b/x"}
            }
        });
        let slot = match path {
            0 => &mut job["displayName"],
            1 => &mut job["labels"],
            2 => &mut job["jobSpec"],
            3 => &mut job["jobSpec"]["workerPoolSpecs"],
            4 => &mut job["jobSpec"]["workerPoolSpecs"][0],
            5 => &mut job["jobSpec"]["workerPoolSpecs"][0]["machineSpec"],
            6 => &mut job["jobSpec"]["workerPoolSpecs"][0]["replicaCount"],
            7 => &mut job["jobSpec"]["workerPoolSpecs"][0]["containerSpec"],
            8 => &mut job["jobSpec"]["scheduling"],
            9 => &mut job["jobSpec"]["scheduling"]["timeout"],
            10 => &mut job["jobSpec"]["baseOutputDirectory"],
            _ => &mut job["jobSpec"]["workerPoolSpecs"][0]["machineSpec"]["acceleratorCount"],
        };
        *slot = v;
        check(job.to_string().as_bytes());
    }
}
