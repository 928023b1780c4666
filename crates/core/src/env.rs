//! The environment every replica's program sees (L8): CLUSTER_SPEC, TF_CONFIG,
//! MASTER_ADDR/MASTER_PORT/WORLD_SIZE/RANK, AIP_* directories and CLOUD_ML_*.

use serde_json::{json, Map, Value};

/// One replica of the job as the cluster layout lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    pub pool: usize,
    pub index: u32,
    /// `HOST:PORT`, owned for the life of the job.
    pub address: String,
}

/// Everything the environment of one replica depends on.
#[derive(Clone, Debug)]
pub struct EnvInput<'a> {
    pub project: &'a str,
    pub region: &'a str,
    pub job_id: u64,
    pub trial_id: Option<&'a str>,
    /// The job spec as JSON text (CLUSTER_SPEC's and TF_CONFIG's `job`).
    pub job_spec_json: &'a str,
    /// Every replica of the job, in pool and index order.
    pub members: &'a [Member],
    /// Which member this replica is.
    pub this: usize,
    /// Local directory that `baseOutputDirectory` maps to (for a trial: `<base>/<trialId>`).
    pub base_output_dir: Option<&'a str>,
    /// TY10: the job's replica count at least and at most, when it has elastic pools
    /// (torchrun's `PET_*` variables are set).
    pub elastic: Option<(usize, usize)>,
    /// The pool's own `env` entries; they come last and win.
    pub pool_env: &'a [(String, String)],
}

const TF_TYPES: [&str; 4] = ["chief", "worker", "ps", "evaluator"];

fn task(kind: String, index: u32, trial: Option<&str>) -> Value {
    let mut t = Map::new();
    t.insert("type".into(), Value::String(kind));
    t.insert("index".into(), json!(index));
    if let Some(trial) = trial {
        t.insert("trial".into(), Value::String(trial.into()));
    }
    Value::Object(t)
}

fn dir(base: &str, sub: &str) -> String {
    format!("{}/{sub}/", base.trim_end_matches('/'))
}

/// L8: the environment of `input.members[input.this]`, as name/value pairs.
pub fn replica_env(input: &EnvInput<'_>) -> Vec<(String, String)> {
    let me = &input.members[input.this];
    let mut env: Vec<(String, String)> = Vec::new();

    let mut cluster = Map::new();
    for m in input.members {
        let list = cluster.entry(format!("workerpool{}", m.pool)).or_insert_with(|| Value::Array(Vec::new()));
        if let Value::Array(a) = list {
            a.push(Value::String(m.address.clone()));
        }
    }
    let cluster_spec = json!({
        "cluster": cluster,
        "environment": "cloud",
        "task": task(format!("workerpool{}", me.pool), me.index, input.trial_id),
        "job": input.job_spec_json,
    });
    env.push(("CLUSTER_SPEC".into(), cluster_spec.to_string()));

    if input.members.len() > 1 {
        // TF_CONFIG: pool 0 → chief, 1 → worker, 2 → ps, 3 → evaluator (not listed).
        let mut tf_cluster = Map::new();
        for m in input.members.iter().filter(|m| m.pool < 3) {
            let list = tf_cluster.entry(TF_TYPES[m.pool].to_string()).or_insert_with(|| Value::Array(Vec::new()));
            if let Value::Array(a) = list {
                a.push(Value::String(m.address.clone()));
            }
        }
        let kind = TF_TYPES.get(me.pool).copied().unwrap_or("worker").to_string();
        let tf = json!({
            "cluster": tf_cluster,
            "task": task(kind, me.index, input.trial_id),
            "environment": "cloud",
            "job": input.job_spec_json,
        });
        env.push(("TF_CONFIG".into(), tf.to_string()));
    }

    // PyTorch-style rendezvous: the primary's address; world = pools 0 and 1.
    if let Some(primary) = input.members.iter().find(|m| m.pool == 0) {
        let (host, port) = primary.address.rsplit_once(':').unwrap_or((primary.address.as_str(), ""));
        env.push(("MASTER_ADDR".into(), host.to_string()));
        env.push(("MASTER_PORT".into(), port.to_string()));
    }
    let world = input.members.iter().filter(|m| m.pool <= 1).count();
    env.push(("WORLD_SIZE".into(), world.to_string()));
    if me.pool <= 1 {
        let rank = if me.pool == 0 { 0 } else { 1 + me.index as usize };
        env.push(("RANK".into(), rank.to_string()));
    }

    if let Some((min, max)) = input.elastic {
        env.extend(torchrun_env(input, min, max));
    }
    if let Some(base) = input.base_output_dir {
        env.push(("AIP_MODEL_DIR".into(), dir(base, "model")));
        env.push(("AIP_CHECKPOINT_DIR".into(), dir(base, "checkpoints")));
        env.push(("AIP_TENSORBOARD_LOG_DIR".into(), dir(base, "logs")));
    }
    // Experiments: the job's run, which the SDK inside the job logs into (its
    // `aiplatform.log_params` and friends read these, as on the managed service).
    if let Ok(spec) = serde_json::from_str::<Value>(input.job_spec_json) {
        for (field, var) in [("experiment", "AIP_EXPERIMENT_NAME"), ("experimentRun", "AIP_EXPERIMENT_RUN_NAME")] {
            if let Some(v) = spec.get(field).and_then(Value::as_str).filter(|v| !v.is_empty()) {
                env.push((var.into(), v.to_string()));
            }
        }
    }
    env.push(("CLOUD_ML_PROJECT_ID".into(), input.project.to_string()));
    env.push(("CLOUD_ML_REGION".into(), input.region.to_string()));
    env.push(("CLOUD_ML_JOB_ID".into(), input.job_id.to_string()));
    if let Some(trial) = input.trial_id {
        env.push(("CLOUD_ML_TRIAL_ID".into(), trial.to_string()));
    }
    for (k, v) in input.pool_env {
        env.retain(|(name, _)| name != k);
        env.push((k.clone(), v.clone()));
    }
    env
}

/// L8: the address of address slot `slot`: its own loopback address and a port that no
/// other live slot below 20,000 uses, so programs that bind the wildcard address do not
/// collide.
/// TY10: what `torchrun` with no arguments reads (`PET_*`, one per option): every replica
/// is a node of `min` to `max`, the rendezvous (c10d) is hosted by the primary's agent at
/// the primary's address, which no elastic change takes away (the primary pool is never
/// elastic), and a change of members restarts the workers in place (up to
/// `PET_MAX_RESTARTS` times) instead of failing them. `last_call_timeout`: how long a
/// rendezvous waits for more nodes once it has its minimum.
fn torchrun_env(input: &EnvInput<'_>, min: usize, max: usize) -> Vec<(String, String)> {
    let Some(primary) = input.members.iter().find(|m| m.pool == 0) else { return Vec::new() };
    let is_host = input.members[input.this].pool == 0;
    vec![
        ("PET_NNODES".into(), format!("{min}:{max}")),
        ("PET_NPROC_PER_NODE".into(), "1".into()),
        ("PET_RDZV_BACKEND".into(), "c10d".into()),
        ("PET_RDZV_ENDPOINT".into(), primary.address.clone()),
        ("PET_RDZV_ID".into(), format!("trainyard-{}", input.job_id)),
        ("PET_RDZV_CONF".into(), format!("is_host={},last_call_timeout={ELASTIC_LAST_CALL_SECS}", u8::from(is_host))),
        ("PET_MAX_RESTARTS".into(), ELASTIC_MAX_RESTARTS.to_string()),
        // The workers of each rendezvous round meet in a store of their own (rank 0's,
        // on a fresh port) rather than in the agents' shared one, where the keys of the
        // round before (the old ranks' addresses) are still there and a new round's
        // workers connect to processes that are gone (measured with torch 2.15: after a
        // node left, rounds failed over and over with "Connection refused").
        ("TORCH_DISABLE_SHARE_RDZV_TCP_STORE".into(), "1".into()),
    ]
}

/// TY10: seconds a torch rendezvous waits for more nodes once it has its minimum (torch's
/// default is 30: a shrunk job would wait that long at every change).
pub const ELASTIC_LAST_CALL_SECS: u32 = 3;
/// TY10: how many times torchrun restarts its workers in place (each change of members is
/// one); a replica's own failures beyond it end its run, and L10/L11 take over.
pub const ELASTIC_MAX_RESTARTS: u32 = 100;

pub fn slot_address(slot: u32, base_port: u16) -> String {
    let n = slot + 2; // 127.0.0.2 upward; 127.0.0.1 stays the host's own
    let port = base_port as u32 + slot % 20_000;
    format!("127.{}.{}.{}:{}", (n >> 16) & 0xff, (n >> 8) & 0xff, n & 0xff, port)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members() -> Vec<Member> {
        vec![
            Member { pool: 0, index: 0, address: "127.0.0.2:20000".into() },
            Member { pool: 1, index: 0, address: "127.0.0.3:20001".into() },
            Member { pool: 1, index: 1, address: "127.0.0.4:20002".into() },
            Member { pool: 2, index: 0, address: "127.0.0.5:20003".into() },
            Member { pool: 3, index: 0, address: "127.0.0.6:20004".into() },
        ]
    }

    fn get<'a>(env: &'a [(String, String)], k: &str) -> Option<&'a str> {
        env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str())
    }

    /// L8: the environment of a worker in a 4-pool job.
    #[test]
    fn l8_multi_pool_environment() {
        let m = members();
        let pool_env = vec![("FOO".to_string(), "bar".to_string())];
        let input = EnvInput {
            project: "p",
            region: "us-central1",
            job_id: 42,
            trial_id: None,
            job_spec_json: "{\"workerPoolSpecs\":[]}",
            members: &m,
            this: 2,
            base_output_dir: Some("/data/out/bucket/dir"),
            pool_env: &pool_env,
            elastic: None,
        };
        let env = replica_env(&input);
        let cs: Value = serde_json::from_str(get(&env, "CLUSTER_SPEC").unwrap()).unwrap();
        assert_eq!(cs["cluster"]["workerpool1"], json!(["127.0.0.3:20001", "127.0.0.4:20002"]));
        assert_eq!(cs["task"], json!({"type": "workerpool1", "index": 1}));
        assert_eq!(cs["environment"], "cloud");
        assert_eq!(cs["job"], "{\"workerPoolSpecs\":[]}");
        let tf: Value = serde_json::from_str(get(&env, "TF_CONFIG").unwrap()).unwrap();
        assert_eq!(tf["cluster"]["chief"], json!(["127.0.0.2:20000"]));
        assert_eq!(tf["cluster"]["ps"], json!(["127.0.0.5:20003"]));
        assert!(tf["cluster"].get("evaluator").is_none(), "the evaluator is not listed");
        assert_eq!(tf["task"], json!({"type": "worker", "index": 1}));
        assert_eq!(get(&env, "MASTER_ADDR"), Some("127.0.0.2"));
        assert_eq!(get(&env, "MASTER_PORT"), Some("20000"));
        assert_eq!(get(&env, "WORLD_SIZE"), Some("3"));
        assert_eq!(get(&env, "RANK"), Some("2"));
        assert_eq!(get(&env, "AIP_MODEL_DIR"), Some("/data/out/bucket/dir/model/"));
        assert_eq!(get(&env, "AIP_CHECKPOINT_DIR"), Some("/data/out/bucket/dir/checkpoints/"));
        assert_eq!(get(&env, "AIP_TENSORBOARD_LOG_DIR"), Some("/data/out/bucket/dir/logs/"));
        assert_eq!(get(&env, "CLOUD_ML_JOB_ID"), Some("42"));
        assert_eq!(get(&env, "FOO"), Some("bar"));
        assert_eq!(get(&env, "CLOUD_ML_TRIAL_ID"), None);
    }

    /// L8: a job run into an experiment run tells its program which
    /// (AIP_EXPERIMENT_NAME, AIP_EXPERIMENT_RUN_NAME); a job without one gets neither.
    #[test]
    fn l8_experiment_run_names() {
        let m = vec![Member { pool: 0, index: 0, address: "127.0.0.9:20007".into() }];
        let spec = r#"{"experiment": "projects/p/locations/r/metadataStores/default/contexts/e", "experimentRun": "projects/p/locations/r/metadataStores/default/contexts/e-r"}"#;
        let input = EnvInput { project: "p", region: "r", job_id: 1, trial_id: None, job_spec_json: spec, members: &m, this: 0, base_output_dir: None, pool_env: &[], elastic: None };
        let env = replica_env(&input);
        assert_eq!(get(&env, "AIP_EXPERIMENT_NAME"), Some("projects/p/locations/r/metadataStores/default/contexts/e"));
        assert_eq!(get(&env, "AIP_EXPERIMENT_RUN_NAME"), Some("projects/p/locations/r/metadataStores/default/contexts/e-r"));
        let env = replica_env(&EnvInput { job_spec_json: "{}", ..input });
        assert!(get(&env, "AIP_EXPERIMENT_NAME").is_none() && get(&env, "AIP_EXPERIMENT_RUN_NAME").is_none());
    }

    /// L8: a one-replica job gets no TF_CONFIG; a trial gets its id.
    #[test]
    fn l8_single_replica_trial() {
        let m = vec![Member { pool: 0, index: 0, address: "127.0.0.9:20007".into() }];
        let input = EnvInput {
            project: "p",
            region: "r",
            job_id: 1,
            trial_id: Some("3"),
            job_spec_json: "{}",
            members: &m,
            this: 0,
            base_output_dir: None,
            pool_env: &[],
            elastic: None,
        };
        let env = replica_env(&input);
        assert!(get(&env, "TF_CONFIG").is_none());
        assert!(get(&env, "AIP_MODEL_DIR").is_none());
        assert_eq!(get(&env, "CLOUD_ML_TRIAL_ID"), Some("3"));
        assert_eq!(get(&env, "RANK"), Some("0"));
        let cs: Value = serde_json::from_str(get(&env, "CLUSTER_SPEC").unwrap()).unwrap();
        assert_eq!(cs["task"]["trial"], "3");
    }

    /// L8: distinct slots get distinct addresses and ports.
    #[test]
    fn l8_slot_addresses_are_distinct() {
        let a: std::collections::BTreeSet<String> = (0..20_000).map(|s| slot_address(s, 20000)).collect();
        assert_eq!(a.len(), 20_000);
        let ports: std::collections::BTreeSet<&str> = a.iter().map(|x| x.rsplit_once(':').unwrap().1).collect();
        assert_eq!(ports.len(), 20_000);
        assert_eq!(slot_address(0, 20000), "127.0.0.2:20000");
        assert_eq!(slot_address(300, 20000), "127.0.1.46:20300");
    }

    /// TY10, L8: an elastic job's replicas get what torchrun reads; the primary hosts the
    /// rendezvous at its own address; a job that is not elastic gets none of it.
    #[test]
    fn ty10_l8_elastic_jobs_get_torchrun_variables() {
        let m = members();
        let input = EnvInput {
            project: "p",
            region: "r",
            job_id: 7,
            trial_id: None,
            job_spec_json: "{}",
            members: &m[..3],
            this: 2,
            base_output_dir: None,
            pool_env: &[("PET_NPROC_PER_NODE".to_string(), "4".to_string())],
            elastic: Some((2, 3)),
        };
        let env = replica_env(&input);
        assert_eq!(get(&env, "PET_NNODES"), Some("2:3"));
        assert_eq!(get(&env, "PET_RDZV_BACKEND"), Some("c10d"));
        assert_eq!(get(&env, "PET_RDZV_ENDPOINT"), Some("127.0.0.2:20000"));
        assert_eq!(get(&env, "PET_RDZV_ID"), Some("trainyard-7"));
        assert_eq!(get(&env, "PET_RDZV_CONF"), Some("is_host=0,last_call_timeout=3"));
        assert_eq!(get(&env, "PET_MAX_RESTARTS"), Some("100"));
        // The pool's own env wins.
        assert_eq!(get(&env, "PET_NPROC_PER_NODE"), Some("4"));
        let primary = replica_env(&EnvInput { this: 0, ..input.clone() });
        assert_eq!(get(&primary, "PET_RDZV_CONF"), Some("is_host=1,last_call_timeout=3"));
        let rigid = replica_env(&EnvInput { elastic: None, ..input });
        assert!(rigid.iter().all(|(k, _)| !k.starts_with("PET_") || k == "PET_NPROC_PER_NODE"), "{rigid:?}");
    }
}
