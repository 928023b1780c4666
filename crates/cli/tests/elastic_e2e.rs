//! TY10: elastic training with the real framework: `torchrun` with no arguments in a job
//! of four replicas (the primary and three elastic workers, at least one) on a fleet of
//! four nodes. A drained node takes one worker away and the others go on with three; an
//! undrain brings it back to four; the job SUCCEEDS with no retry or restart counted.
//!
//! Needs a venv with PyTorch: `TRAINYARD_TORCH_VENV` (scripts/test makes one). Without
//! it the test says so and passes, except under CI, where it fails.

mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

const FOUR_NODES: &str = "[[nodes]]\nname = \"n1\"\ncpus = 4\nmemory_gb = 16\n\n[[nodes]]\nname = \"n2\"\ncpus = 4\nmemory_gb = 16\n\n\
    [[nodes]]\nname = \"n3\"\ncpus = 4\nmemory_gb = 16\n\n[[nodes]]\nname = \"n4\"\ncpus = 4\nmemory_gb = 16\n";

/// The training program: one all-reduce a step, a checkpoint (the step, in
/// AIP_CHECKPOINT_DIR) written by rank 0 after each, resumed from on every (re)start; it
/// stops when rank 0 sees the stop file.
const TRAIN: &str = r#"
import os, time
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
ckpt, stop = os.path.join(os.environ["AIP_CHECKPOINT_DIR"], "step"), os.environ["ELASTIC_STOP"]
step = int(open(ckpt).read()) if os.path.exists(ckpt) else 0
if rank == 0:
    print(f"resumed step={step} world={world} restart={os.environ.get('TORCHELASTIC_RESTART_COUNT')}", flush=True)
while True:
    flag = torch.tensor([1.0 if rank == 0 and os.path.exists(stop) else 0.0])
    dist.all_reduce(flag)
    if flag.item() > 0:
        break
    x = torch.ones(1)
    dist.all_reduce(x)
    step += 1
    if rank == 0:
        with open(ckpt + ".tmp", "w") as f:
            f.write(str(step))
        os.replace(ckpt + ".tmp", ckpt)
        print(f"step={step} world={world} sum={int(x.item())}", flush=True)
    time.sleep(0.3)
dist.destroy_process_group()
"#;

fn torch_venv() -> Option<String> {
    match std::env::var("TRAINYARD_TORCH_VENV") {
        Ok(v) if !v.is_empty() => Some(v),
        _ => {
            assert!(std::env::var("CI").is_err(), "CI must set TRAINYARD_TORCH_VENV (scripts/test makes the venv)");
            eprintln!("skipped: TRAINYARD_TORCH_VENV is not set (a venv with torch; scripts/test makes one)");
            None
        }
    }
}

fn elastic_job(name: &str, workers: u32, min: &str, command: Vec<String>, env: Value) -> Value {
    let pool = |n: u32| {
        json!({"machineSpec": {"machineType": "n1-standard-4"}, "replicaCount": n.to_string(),
               "containerSpec": {"imageUri": "python:3.11", "command": command, "env": env}})
    };
    json!({"displayName": name, "labels": {"trainyard-min-replicas-workerpool1": min},
           "jobSpec": {"workerPoolSpecs": [pool(1), pool(workers)]}})
}

/// The world sizes rank 0 stepped with, in order.
fn worlds(log: &str) -> Vec<u32> {
    log.lines()
        .filter(|l| l.contains("step=") && !l.contains("resumed"))
        .filter_map(|l| l.split("world=").nth(1)?.split(' ').next()?.parse().ok())
        .collect()
}

fn wait_log(s: &Server, name: &str, secs: u64, what: &str, pred: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let text = s.logs_text(name);
        if pred(&text) {
            return text;
        }
        let job = s.get(name);
        assert!(Instant::now() < deadline && job["state"] != "JOB_STATE_FAILED", "{what}: {job}\n{text}\n{}", s.server_log());
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Microseconds since the epoch of a time the API shows.
fn ts(v: &Value) -> i64 {
    trainyard_api::Timestamp::parse_rfc3339(v.as_str().expect("a time")).expect("RFC 3339").micros()
}

/// TY10, L9, L11, L12: torchrun with no arguments; a drain takes a worker away and the job
/// goes on with three (no restart, no retry), an undrain brings it back to four, and the
/// job succeeds from its checkpoints.
#[test]
fn ty10_l9_torchrun_job_shrinks_on_drain_and_grows_back() {
    let Some(venv) = torch_venv() else { return };
    if skip_on_slurm("the fleet's nodes are virtual nodes of this host") || skip_in_containers("torch is in a host venv") {
        return;
    }
    let s = Server::start(FOUR_NODES);
    let script = s.dir.path().join("train.py");
    std::fs::write(&script, TRAIN).unwrap();
    let stop = s.dir.path().join("stop");
    let env = json!([{"name": "ELASTIC_STOP", "value": stop.display().to_string()}]);
    let command = vec![format!("{venv}/bin/torchrun"), script.display().to_string()];
    let mut job = elastic_job("elastic", 3, "1", command, env);
    job["jobSpec"]["baseOutputDirectory"] = json!({"outputUriPrefix": "gs://b/elastic"});
    let j = s.create("p", &job);
    let name = name_of(&j);
    wait_log(&s, &name, 180, "four workers step", |t| worlds(t).contains(&4));
    let victim = node_of(&s, &j, "workerpool1-2", 0);
    let (st, body) = s.call("POST", &s.url(&format!("/v1/admin/nodes/{victim}:drain")), Some("{}"));
    assert_eq!(st, 200, "{body}");
    let drained = Instant::now();
    let text = wait_log(&s, &name, 120, "three workers step after the drain", |t| worlds(t).last() == Some(&3));
    let shrink = drained.elapsed();
    assert!(text.contains("Replica workerpool1-2 left the job (its node went into maintenance); workerpool1 goes on with 2 of 3"), "{text}");
    assert_eq!(s.get(&name)["state"], "JOB_STATE_RUNNING");
    let (st, body) = s.call("POST", &s.url(&format!("/v1/admin/nodes/{victim}:undrain")), Some("{}"));
    assert_eq!(st, 200, "{body}");
    let undrained = Instant::now();
    let text = wait_log(&s, &name, 120, "four workers step again", |t| {
        let w = worlds(t);
        w.iter().position(|&x| x == 3).is_some_and(|i| w[i..].contains(&4))
    });
    let grow = undrained.elapsed();
    assert!(text.contains("Replica workerpool1-2 joins the elastic job on node"), "{text}");
    // Another project's job needs a node: an extra replica gives it way (not a restart,
    // not a retry), and joins again once that job is done.
    let other = s.create("q", &sh_job("needs-a-node", "sleep 2"));
    let text = wait_log(&s, &name, 120, "an extra replica gives way", |t| t.contains("left the job (preempted"));
    assert!(text.contains("its capacity is needed by work that waits for it"), "{text}");
    assert_eq!(s.wait_terminal(&name_of(&other), 120)["state"], "JOB_STATE_SUCCEEDED");
    let joins = |t: &str| t.matches("joins the elastic job on node").count();
    let before = joins(&text);
    wait_log(&s, &name, 120, "four workers again after the other job", |t| joins(t) > before && worlds(t).last() == Some(&4));
    std::fs::write(&stop, "").unwrap();
    let done = s.wait_terminal(&name, 120);
    let text = s.logs_text(&name);
    assert_eq!(done["state"], "JOB_STATE_SUCCEEDED", "{text}");
    assert!(!text.contains("restarting it (") && !text.contains("Job retry"), "no restart or retry counted: {text}");
    // Every step went on from the last checkpoint: the steps rank 0 printed count up by one.
    let steps: Vec<u64> = text
        .lines()
        .filter(|l| l.contains("step=") && !l.contains("resumed"))
        .filter_map(|l| l.split("step=").nth(1)?.split(' ').next()?.parse().ok())
        .collect();
    assert!(steps.windows(2).all(|w| w[1] == w[0] + 1), "{steps:?}");
    // Where its time went: it adds up to its life, and the work thrown away by the
    // changes (each restarts the workers from their checkpoint) is lost, not productive.
    let g = &done["trainyardGoodput"]["wallSeconds"];
    let sum: f64 = ["queued", "starting", "productive", "idle", "lost"].iter().map(|k| g[k].as_f64().unwrap()).sum();
    let life = (ts(&done["endTime"]) - ts(&done["createTime"])) as f64 / 1e6;
    assert!((sum - life).abs() < 0.01, "{g} adds up to {sum}, the job lived {life}");
    assert!(g["productive"].as_f64().unwrap() > 0.0 && g["lost"].as_f64().unwrap() > 0.0, "{g}");
    eprintln!("TY10 figures: drain to three workers stepping {shrink:?}; undrain to four stepping {grow:?}; goodput {}: {g}", done["trainyardGoodput"]["goodput"]);
}

/// TY10: bad elastic labels are refused with 400 naming the label, and nothing is made.
#[test]
fn ty10_bad_elastic_labels_are_refused_naming_the_label() {
    let s = Server::start(FOUR_NODES);
    let cmd = vec!["true".to_string()];
    let label = "trainyard-min-replicas-workerpool1";
    for (min, why) in [("4", "from 1 to workerPoolSpecs[1].replicaCount (3), not 4"), ("0", "not 0"), ("two", "\"two\" is not a number")] {
        let (st, body) = s.call("POST", &s.jobs_url("p"), Some(&elastic_job("bad", 3, min, cmd.clone(), json!([])).to_string()));
        assert_eq!(st, 400, "{body}");
        let m = body["error"]["message"].as_str().unwrap_or_default();
        assert!(m.contains(&format!("labels.{label}")) && m.contains(why), "{m}");
    }
    let mut job = elastic_job("bad", 3, "1", cmd.clone(), json!([]));
    job["labels"] = json!({"trainyard-min-replicas-workerpool0": "1"});
    let (st, body) = s.call("POST", &s.jobs_url("p"), Some(&job.to_string()));
    assert!(st == 400 && body["error"]["message"].as_str().unwrap_or_default().contains("primary pool"), "{body}");
    job["labels"] = json!({"trainyard-min-replicas-workerpool2": "1"});
    let (st, body) = s.call("POST", &s.jobs_url("p"), Some(&job.to_string()));
    assert!(st == 400 && body["error"]["message"].as_str().unwrap_or_default().contains("workerPoolSpecs[2] has no replicas"), "{body}");
    // Parameter servers: no PyTorch-style ranks.
    let mut ps = elastic_job("bad", 2, "1", cmd, json!([]));
    let primary = ps["jobSpec"]["workerPoolSpecs"][0].clone();
    ps["jobSpec"]["workerPoolSpecs"].as_array_mut().unwrap().push(primary);
    let (st, body) = s.call("POST", &s.jobs_url("p"), Some(&ps.to_string()));
    assert!(st == 400 && body["error"]["message"].as_str().unwrap_or_default().contains("PyTorch-style ranks"), "{body}");
    let (_, list) = s.call("GET", &s.jobs_url("p"), None);
    assert!(list["customJobs"].as_array().is_none_or(Vec::is_empty), "nothing was made: {list}");
}
