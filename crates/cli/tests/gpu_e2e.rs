//! GPUs, driven by a fake `nvidia-smi` on the server's PATH (4 x A100, NVLink pairs
//! (0,1) and (2,3)): discovery, exclusive assignment by UUID, topology-aware choice,
//! waiting for GPUs, restarts that keep their devices (L10), GPUs that vanish (L9), a
//! failing nvidia-smi, and the refusal of a job no node could hold.

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

const UUIDS: [&str; 4] = [
    "GPU-aaaaaaaa-0000-0000-0000-000000000000",
    "GPU-aaaaaaaa-0000-0000-0000-000000000001",
    "GPU-aaaaaaaa-0000-0000-0000-000000000002",
    "GPU-aaaaaaaa-0000-0000-0000-000000000003",
];

fn devices_csv(present: &[usize]) -> String {
    present
        .iter()
        .map(|&i| format!("{i}, {}, NVIDIA A100-SXM4-40GB, 40960, 00000000:{:02X}:00.0\n", UUIDS[i], 7 + i * 4))
        .collect()
}

const TOPO: &str = "\tGPU0\tGPU1\tGPU2\tGPU3\tCPU Affinity\tNUMA Affinity\n\
GPU0\t X \tNV12\tSYS\tSYS\t0-31\t0\n\
GPU1\tNV12\t X \tSYS\tSYS\t0-31\t0\n\
GPU2\tSYS\tSYS\t X \tNV12\t32-63\t1\n\
GPU3\tSYS\tSYS\tNV12\t X \t32-63\t1\n\n\
Legend:\n\n  X    = Self\n  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes\n  NV#  = Connection traversing a bonded set of # NVLinks\n";

/// A server (not started) whose PATH finds the fake nvidia-smi; returns its directory.
fn gpu_server(extra: &str) -> (Server, PathBuf) {
    let mut s = Server::prepare(&format!("gpu_check_secs = 1\n{extra}"));
    let bin = s.dir.path().join("fake-gpu-bin");
    std::fs::create_dir_all(&bin).unwrap();
    let fixture = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/fake-nvidia-smi");
    std::fs::copy(&fixture, bin.join("nvidia-smi")).unwrap();
    std::fs::write(bin.join("devices.csv"), devices_csv(&[0, 1, 2, 3])).unwrap();
    std::fs::write(bin.join("topo.txt"), TOPO).unwrap();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    s.env.push(("PATH".into(), path));
    (s, bin)
}

fn gpu_job(name: &str, gpus: u32, script: &str) -> Value {
    json!({"displayName": name, "jobSpec": {"workerPoolSpecs": [{
        "machineSpec": {"machineType": format!("a2-highgpu-{gpus}g"), "acceleratorType": "NVIDIA_TESLA_A100", "acceleratorCount": gpus},
        "replicaCount": "1",
        "containerSpec": {"imageUri": "i", "command": ["sh", "-c", script]}}]}})
}

/// Prints the devices it sees, then waits.
const SHOW: &str = "echo \"cuda=$CUDA_VISIBLE_DEVICES nv=$NVIDIA_VISIBLE_DEVICES\"; sleep 300";

fn state(j: &Value) -> String {
    j["state"].as_str().unwrap_or("").to_string()
}

/// The `cuda=` lines of a job's log, in order.
fn seen(s: &Server, name: &str) -> Vec<Vec<String>> {
    s.logs_text(name)
        .lines()
        .filter_map(|l| l.split("cuda=").nth(1))
        .map(|rest| rest.split_whitespace().next().unwrap_or("").split(',').filter(|x| !x.is_empty()).map(str::to_string).collect())
        .collect()
}

fn wait_seen(s: &Server, name: &str, n: usize) -> Vec<Vec<String>> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let v = seen(s, name);
        if v.len() >= n {
            return v;
        }
        assert!(Instant::now() < deadline, "{name} printed no devices:\n{}", s.logs_text(name));
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn node(s: &Server) -> Value {
    let (status, body) = s.call("GET", &s.url("/v1/admin/nodes/local"), None);
    assert_eq!(status, 200, "{body}");
    body
}

fn cancel(s: &Server, name: &str) {
    let (status, body) = s.call("POST", &s.url(&format!("/v1/{name}:cancel")), Some("{}"));
    assert_eq!(status, 200, "{body}");
}

/// Discovery, exclusive assignment and the topology: two 1-GPU jobs get disjoint devices
/// (packed onto one NVLink pair), a 2-GPU job then gets the other NVLink pair, and a job
/// that needs more GPUs than are free waits QUEUED with a reason naming them. The node
/// shows which replica holds which GPU.
#[test]
fn gpus_are_exclusive_topology_aware_and_waited_for() {
    if skip_on_slurm("Slurm assigns GPUs itself (--gres)") {
        return;
    }
    let (mut s, _bin) = gpu_server("");
    s.spawn();
    let n = node(&s);
    assert_eq!(n["accelerators"]["NVIDIA_TESLA_A100"], 4, "{n}");
    assert_eq!(n["gpus"].as_array().map(Vec::len), Some(4), "{n}");
    assert_eq!(n["gpus"][0]["links"]["1"], "NV12", "{n}");

    let a = name_of(&s.create("p", &gpu_job("a", 1, SHOW)));
    let a_dev = wait_seen(&s, &a, 1)[0].clone();
    let b = name_of(&s.create("p", &gpu_job("b", 1, SHOW)));
    let b_dev = wait_seen(&s, &b, 1)[0].clone();
    assert_eq!((a_dev.len(), b_dev.len()), (1, 1));
    assert_ne!(a_dev, b_dev, "two replicas got the same GPU");
    let pair_of = |u: &str| UUIDS.iter().position(|x| *x == u).map(|i| i / 2);
    assert_eq!(pair_of(&a_dev[0]), pair_of(&b_dev[0]), "the second single packs next to the first: {a_dev:?} {b_dev:?}");

    let c = name_of(&s.create("p", &gpu_job("c", 2, SHOW)));
    let mut c_dev = wait_seen(&s, &c, 1)[0].clone();
    c_dev.sort();
    let other = pair_of(&a_dev[0]).map(|p| 1 - p).unwrap();
    assert_eq!(c_dev, vec![UUIDS[other * 2].to_string(), UUIDS[other * 2 + 1].to_string()], "an NVLink pair");
    assert!(s.logs_text(&c).contains("holds GPUs"), "{}", s.logs_text(&c));

    let d = s.create("p", &gpu_job("d", 1, SHOW));
    let d_name = name_of(&d);
    let waiting = s.wait_for(&d_name, 30, |j| j["trainyardWaitingReason"].as_str().is_some_and(|r| r.contains("GPU")));
    assert_eq!(state(&waiting), "JOB_STATE_QUEUED");
    let reason = waiting["trainyardWaitingReason"].as_str().unwrap();
    assert!(reason.contains("Waiting for GPUs") && reason.contains("NVIDIA_TESLA_A100") && reason.contains("0 of 4 free"), "{reason}");

    let n = node(&s);
    let holders: Vec<String> = n["gpus"].as_array().unwrap().iter().map(|g| g["heldBy"]["job"].as_str().unwrap_or("").to_string()).collect();
    for job in [&a, &b, &c] {
        assert!(holders.contains(job), "{job} in {holders:?}");
    }

    // Freed GPUs go to the waiting job.
    cancel(&s, &a);
    let d_dev = wait_seen(&s, &d_name, 1)[0].clone();
    assert_eq!(d_dev, a_dev, "the freed GPU");
    for j in [&b, &c, &d_name] {
        cancel(&s, j);
    }
}

/// Jobs placed in one scheduling round are applied together (one store transaction): each
/// gets GPUs that the jobs placed before it in the round do not hold. Four single-GPU jobs
/// wait behind a 4-GPU job; when it ends, the next round places all four at once.
#[test]
fn gpus_jobs_placed_in_one_round_never_share_a_gpu() {
    if skip_on_slurm("Slurm assigns GPUs itself (--gres)") {
        return;
    }
    let (mut s, _bin) = gpu_server("");
    s.spawn();
    let big = name_of(&s.create("p", &gpu_job("big", 4, SHOW)));
    wait_seen(&s, &big, 1);
    let singles: Vec<String> = (0..4).map(|i| name_of(&s.create("p", &gpu_job(&format!("s{i}"), 1, SHOW)))).collect();
    for j in &singles {
        s.wait_for(j, 30, |j| j["trainyardWaitingReason"].as_str().is_some_and(|r| r.contains("GPU")));
    }
    cancel(&s, &big);
    let mut devices: Vec<String> = singles.iter().map(|j| wait_seen(&s, j, 1)[0].clone()).inspect(|d| assert_eq!(d.len(), 1, "{d:?}")).map(|d| d[0].clone()).collect();
    devices.sort();
    devices.dedup();
    assert_eq!(devices.len(), 4, "two jobs of one round got the same GPU: {devices:?}");
    for j in &singles {
        cancel(&s, j);
    }
}

/// The replicas of one job hold disjoint GPUs: a job of a primary and three workers of
/// one GPU each on the 4-GPU node gets four different devices (a job's own siblings count as
/// holders, not only other jobs' replicas).
#[test]
fn gpus_the_replicas_of_one_job_never_share_a_gpu() {
    if skip_on_slurm("Slurm assigns GPUs itself (--gres)") {
        return;
    }
    let (mut s, _bin) = gpu_server("");
    s.spawn();
    let mut job = gpu_job("siblings", 1, SHOW);
    let mut workers = job["jobSpec"]["workerPoolSpecs"][0].clone();
    workers["replicaCount"] = json!("3");
    job["jobSpec"]["workerPoolSpecs"].as_array_mut().unwrap().push(workers);
    let name = name_of(&s.create("p", &job));
    let mut all: Vec<String> = wait_seen(&s, &name, 4).into_iter().flatten().collect();
    assert_eq!(all.len(), 4, "{all:?}");
    all.sort();
    all.dedup();
    assert_eq!(all.len(), 4, "two replicas of one job got the same GPU:\n{}", s.logs_text(&name));
    cancel(&s, &name);
}

/// A replica that asks for no GPU on a node with GPUs sees none.
#[test]
fn gpus_a_cpu_replica_sees_none() {
    if skip_on_slurm("Slurm assigns GPUs itself (--gres)") {
        return;
    }
    let (mut s, _bin) = gpu_server("");
    s.spawn();
    let j = s.create("p", &sh_job("cpu", "echo \"cuda=[$CUDA_VISIBLE_DEVICES] nv=$NVIDIA_VISIBLE_DEVICES\""));
    let done = s.wait_terminal(&name_of(&j), 60);
    assert_eq!(state(&done), "JOB_STATE_SUCCEEDED");
    assert!(s.logs_text(&name_of(&j)).contains("cuda=[] nv=void"), "{}", s.logs_text(&name_of(&j)));
}

/// More GPUs of a type than any node has: 400 at create, naming the type and the largest
/// node's count; nothing is stored.
#[test]
fn gpus_more_than_any_node_has_are_refused_at_create() {
    if skip_on_slurm("Slurm assigns GPUs itself (--gres)") {
        return;
    }
    let (mut s, _bin) = gpu_server("");
    s.spawn();
    let job = in_test_image(gpu_job("big", 8, "true"));
    let (status, body) = s.call("POST", &s.jobs_url("p"), Some(&job.to_string()));
    assert_eq!(status, 400, "{body}");
    let message = body["error"]["message"].as_str().unwrap_or("");
    assert!(message.contains("8 NVIDIA_TESLA_A100") && message.contains("has 4"), "{message}");
    let (_, list) = s.call("GET", &s.jobs_url("p"), None);
    assert!(list["customJobs"].as_array().is_none_or(|a| a.is_empty()), "{list}");
}

/// L10: a replica restarted after a non-permanent failure gets the same GPUs back.
#[test]
fn gpus_l10_a_restarted_replica_keeps_its_devices() {
    if skip_on_slurm("Slurm assigns GPUs itself (--gres)") {
        return;
    }
    let (mut s, _bin) = gpu_server("");
    s.spawn();
    let marker = s.dir.path().join("killed-once");
    let script = format!(
        "echo \"cuda=$CUDA_VISIBLE_DEVICES\"; if [ -e {m} ]; then exit 0; fi; touch {m}; kill -9 $$",
        m = marker.display()
    );
    let j = name_of(&s.create("p", &gpu_job("restart", 2, &script)));
    let done = s.wait_terminal(&j, 60);
    assert_eq!(state(&done), "JOB_STATE_SUCCEEDED", "{}", s.logs_text(&j));
    let runs = seen(&s, &j);
    assert_eq!(runs.len(), 2, "{}", s.logs_text(&j));
    assert_eq!(runs[0], runs[1], "the restart got other devices");
    assert!(s.logs_text(&j).contains("restarting it (1 of"), "{}", s.logs_text(&j));
}

/// L9: a GPU that vanishes from nvidia-smi marks the node degraded and its replica is
/// restarted at once on other GPUs, not counted as a failure; the GPU back is capacity
/// again.
#[test]
fn gpus_l9_a_vanished_gpu_moves_its_replica() {
    if skip_on_slurm("Slurm assigns GPUs itself (--gres)") {
        return;
    }
    let (mut s, bin) = gpu_server("");
    s.spawn();
    let j = name_of(&s.create("p", &gpu_job("lose", 1, SHOW)));
    let first = wait_seen(&s, &j, 1)[0].clone();
    let gone = UUIDS.iter().position(|u| *u == first[0]).unwrap();
    let rest: Vec<usize> = (0..4).filter(|&i| i != gone).collect();
    std::fs::write(bin.join("devices.csv"), devices_csv(&rest)).unwrap();
    let runs = wait_seen(&s, &j, 2);
    assert_ne!(runs[1], runs[0], "restarted on another GPU");
    assert!(!runs[1].contains(&UUIDS[gone].to_string()));
    let text = s.logs_text(&j);
    assert!(text.contains("restarting it on node local"), "{text}");
    assert!(!text.contains("(1 of"), "not counted as a failure: {text}");
    assert_eq!(state(&s.get(&j)), "JOB_STATE_RUNNING");
    let n = node(&s);
    assert_eq!(n["state"], "DEGRADED", "{n}");
    assert_eq!(n["accelerators"]["NVIDIA_TESLA_A100"], 3, "{n}");
    assert_eq!(n["gpus"][gone]["state"], "MISSING", "{n}");
    std::fs::write(bin.join("devices.csv"), devices_csv(&[0, 1, 2, 3])).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while node(&s)["state"] != "UP" {
        assert!(Instant::now() < deadline, "{}", node(&s));
        std::thread::sleep(Duration::from_millis(100));
    }
    cancel(&s, &j);
}

/// nvidia-smi present but failing: the server starts with no GPUs and says why.
#[test]
fn gpus_a_failing_nvidia_smi_gives_no_gpus_and_says_why() {
    if skip_on_slurm("Slurm assigns GPUs itself (--gres)") {
        return;
    }
    let (mut s, bin) = gpu_server("");
    std::fs::write(bin.join("fail"), "").unwrap();
    s.spawn();
    assert!(s.server_log().contains("nvidia-smi failed"), "{}", s.server_log());
    let n = node(&s);
    assert!(n["gpus"].as_array().is_none_or(|g| g.is_empty()), "{n}");
}

/// L23: the assignment is durable: after the server is killed with SIGKILL and started
/// again, running replicas keep their GPUs (adopted, not restarted) and a new replica gets
/// a free one, never one of theirs.
#[test]
fn gpus_l23_assignments_survive_a_server_kill() {
    if skip_on_slurm("Slurm assigns GPUs itself (--gres)") {
        return;
    }
    let (mut s, _bin) = gpu_server("");
    s.spawn();
    let a = name_of(&s.create("p", &gpu_job("a", 2, SHOW)));
    let a_dev = wait_seen(&s, &a, 1)[0].clone();
    s.restart();
    let b = name_of(&s.create("p", &gpu_job("b", 2, SHOW)));
    let b_dev = wait_seen(&s, &b, 1)[0].clone();
    assert_eq!(b_dev.len(), 2);
    assert!(b_dev.iter().all(|d| !a_dev.contains(d)), "{a_dev:?} and {b_dev:?} share a GPU");
    assert_eq!(seen(&s, &a).len(), 1, "a was adopted, not started again: {}", s.logs_text(&a));
    assert_eq!(state(&s.get(&a)), "JOB_STATE_RUNNING");
    for j in [&a, &b] {
        cancel(&s, j);
    }
}

fn secs_between(a: &Value, b: &Value) -> f64 {
    let t = |v: &Value| {
        let s = v.as_str().unwrap_or_else(|| panic!("not a time: {v}"));
        trainyard_api::Timestamp::parse_rfc3339(s).unwrap_or_else(|_| panic!("not a time: {s}")).micros()
    };
    (t(b) - t(a)) as f64 / 1e6
}

/// Usage accounting (`GET /v1/admin/usage`, `trainyard usage`, `/metrics`): the GPU-hours
/// reported for a project equal the sum over its jobs' runs (GPUs x time held), the jobs'
/// ends are counted by state, and all of it is kept across a restart; bad parameters are
/// 400 naming them.
#[test]
fn usage_report_gpu_hours_equal_the_sum_over_the_jobs_runs() {
    if skip_on_slurm("the fake nvidia-smi is on this host") {
        return;
    }
    let (mut s, _bin) = gpu_server("");
    s.spawn();
    let two = name_of(&s.create("p", &gpu_job("two", 2, "sleep 2")));
    let one = name_of(&s.create("p", &gpu_job("one", 1, "sleep 300")));
    s.wait_for(&one, 60, |j| j["state"] == "JOB_STATE_RUNNING");
    std::thread::sleep(Duration::from_secs(1));
    s.call("POST", &s.url(&format!("/v1/{one}:cancel")), Some("{}"));
    let two = s.wait_terminal(&two, 60);
    let one = s.wait_terminal(&one, 60);
    assert_eq!((state(&two).as_str(), state(&one).as_str()), ("JOB_STATE_SUCCEEDED", "JOB_STATE_CANCELLED"));
    // Held from placement until the replicas are down: a little more than RUNNING's span.
    let expected = 2.0 * secs_between(&two["startTime"], &two["endTime"]) + secs_between(&one["startTime"], &one["endTime"]);
    let row = |v: &Value| -> Value {
        v["usage"]
            .as_array()
            .and_then(|a| a.iter().find(|r| r["project"] == "p" && r["acceleratorType"] == "NVIDIA_TESLA_A100").cloned())
            .unwrap_or_else(|| panic!("no row for p: {v:#}"))
    };
    let (status, v) = s.call("GET", &s.url("/v1/admin/usage"), None);
    assert_eq!(status, 200, "{v}");
    let r = row(&v);
    let gpu_secs = r["gpuHours"].as_f64().unwrap_or(-1.0) * 3600.0;
    assert!(gpu_secs >= expected - 0.01 && gpu_secs <= expected + 3.0, "reported {gpu_secs} s, runs {expected} s: {r:#}");
    assert_eq!((r["jobsSucceeded"].as_u64(), r["jobsCancelled"].as_u64(), r["jobsFailed"].as_u64()), (Some(1), Some(1), Some(0)), "{r:#}");
    let cpu_secs = r["cpuHours"].as_f64().unwrap_or(0.0) * 3600.0;
    assert!(cpu_secs > gpu_secs, "a2-highgpu-1g has 12 vCPUs per GPU: {r:#}");
    assert!(v["series"].as_array().is_some_and(|a| !a.is_empty()), "{v:#}");
    // TY10: the ended jobs' goodput, summed from their own accounts.
    let (mut productive, mut accounted, mut gpu_productive) = (0.0, 0.0, 0.0);
    for j in [&two, &one] {
        let g = &j["trainyardGoodput"];
        let total = |s: &Value| ["queued", "starting", "productive", "idle", "lost"].iter().map(|k| s[*k].as_f64().unwrap_or(0.0)).sum::<f64>();
        productive += g["wallSeconds"]["productive"].as_f64().unwrap_or(-1.0);
        accounted += total(&g["wallSeconds"]);
        gpu_productive += g["acceleratorSeconds"]["productive"].as_f64().unwrap_or(-1.0);
    }
    let near = |hours: &Value, secs: f64| (hours.as_f64().unwrap_or(-1.0) * 3600.0 - secs).abs() < 0.05;
    assert!(productive > 0.0 && accounted > productive && gpu_productive > productive, "{two:#} {one:#}");
    assert!(near(&r["productiveHours"], productive) && near(&r["accountedHours"], accounted), "{r:#}\n{productive} of {accounted}");
    assert!(near(&r["productiveGpuHours"], gpu_productive), "{r:#}");
    let ratio = r["goodput"].as_f64().unwrap_or(-1.0);
    assert!((ratio - productive / accounted).abs() < 0.002, "{r:#}");

    s.restart();
    let (_, after) = s.call("GET", &s.url("/v1/admin/usage?project=p"), None);
    let r2 = row(&after);
    assert_eq!(r2["gpuHours"], r["gpuHours"], "kept across a restart: {after:#}");
    assert_eq!(r2["jobsCancelled"], r["jobsCancelled"]);
    assert_eq!(r2["goodput"], r["goodput"], "goodput kept across a restart: {after:#}");
    let metrics = ureq::get(&s.url("/metrics")).call().expect("GET /metrics").into_body().read_to_string().expect("body");
    let line = metrics
        .lines()
        .find(|l| l.starts_with("trainyard_usage_accelerator_seconds_total{") && l.contains("project=\"p\""))
        .unwrap_or_else(|| panic!("no usage counter:\n{metrics}"));
    let counted: f64 = line.rsplit(' ').next().and_then(|x| x.parse().ok()).unwrap_or(-1.0);
    assert!((counted - gpu_secs).abs() < 0.01, "{line} vs {gpu_secs}");

    let o = std::process::Command::new(BIN)
        .args(["usage", "--format", "csv"])
        .env("TRAINYARD_SERVER", s.url(""))
        .env_remove("TRAINYARD_PROJECT")
        .output()
        .expect("trainyard usage");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{out}{}", String::from_utf8_lossy(&o.stderr));
    assert!(out.starts_with("PROJECT,ACCELERATOR,CPU_HOURS,GPU_HOURS,") && out.contains("\np,NVIDIA_TESLA_A100,"), "{out}");

    for (q, named) in [
        ("from=2026-12-02T00:00:00Z&to=2026-12-01T00:00:00Z", "from"),
        ("from=yesterday", "from"),
        ("to=2026-13-01T00:00:00Z", "to"),
        ("projects=p", "projects"),
    ] {
        let (status, v) = s.call("GET", &s.url(&format!("/v1/admin/usage?{q}")), None);
        assert_eq!(status, 400, "{q}: {v}");
        assert!(v["error"]["message"].as_str().is_some_and(|m| m.contains(named)), "{q}: {v}");
    }
    let (_, none) = s.call("GET", &s.url("/v1/admin/usage?from=2000-01-01T00:00:00Z&to=2000-01-02T00:00:00Z"), None);
    assert_eq!(none["usage"], serde_json::json!([]), "{none}");
}

/// GPU health: a GPU that reports uncorrectable ECC errors (here from the fake nvidia-smi)
/// quarantines its node at once: `nodes` shows it QUARANTINED with the reason, and the
/// next GPU job lands on the other node.
/// Holds TY8 (docs/lifecycle.md).
#[test]
fn a_gpu_with_ecc_errors_quarantines_its_node() {
    if skip_on_slurm("the fake nvidia-smi is on this host") {
        return;
    }
    let (mut s, bin) = gpu_server(&format!(
        "[[nodes]]\nname = \"g1\"\ncpus = 48\nmemory_gb = 340\ngpus = [\"{}\", \"{}\"]\n[[nodes]]\nname = \"g2\"\ncpus = 48\nmemory_gb = 340\ngpus = [\"{}\", \"{}\"]\n",
        UUIDS[0], UUIDS[1], UUIDS[2], UUIDS[3]
    ));
    s.spawn();
    std::fs::write(bin.join("health.csv"), format!("{}, 0\n{}, 0\n{}, 0\n{}, 2\n", UUIDS[0], UUIDS[1], UUIDS[2], UUIDS[3])).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let g2 = loop {
        let (_, n) = s.call("GET", &s.url("/v1/admin/nodes/g2"), None);
        if n["state"] == "QUARANTINED" {
            break n;
        }
        assert!(Instant::now() < deadline, "g2 not quarantined: {n:#}\n{}", s.server_log());
        std::thread::sleep(Duration::from_millis(200));
    };
    let reason = g2["quarantine"]["reason"].as_str().unwrap_or("");
    assert!(reason.contains(UUIDS[3]) && reason.contains("2 uncorrectable ECC error(s)"), "{g2:#}");
    let (_, g1) = s.call("GET", &s.url("/v1/admin/nodes/g1"), None);
    assert_ne!(g1["state"], "QUARANTINED", "{g1:#}");
    let j = name_of(&s.create("p", &gpu_job("after", 2, "echo on $TRAINYARD_NODE; sleep 1")));
    let done = s.wait_terminal(&j, 60);
    assert_eq!(state(&done), "JOB_STATE_SUCCEEDED", "{done:#}");
    assert!(s.logs_text(&j).contains("on g1"), "{}", s.logs_text(&j));
}
