//! Data separation, tried against a real server (part of the tenant-escape suite):
//! `gs://` paths in per-project namespaces of the storage root, output directories only
//! in the project's storage or under configured output roots (never the data directory,
//! the server's working directory, or an unconfigured `/tmp`), and symbolic links planted
//! under the storage root neither accepted at create nor followed at launch.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use serde_json::{json, Value};

const BASE_FIELD: &str = "jobSpec.baseOutputDirectory.outputUriPrefix";

fn state(j: &Value) -> &str {
    j["state"].as_str().unwrap_or("")
}

fn assert_invalid(status: u16, body: &Value, needle: &str) {
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["code"], 400, "{body}");
    assert_eq!(body["error"]["status"], "INVALID_ARGUMENT", "{body}");
    let m = body["error"]["message"].as_str().unwrap_or("");
    assert!(m.contains(needle), "message {m:?} does not name {needle:?}");
}

fn with_base(mut job: Value, uri: &str) -> Value {
    job["jobSpec"]["baseOutputDirectory"] = json!({ "outputUriPrefix": uri });
    job
}

fn job_count(s: &Server, project: &str) -> usize {
    let (status, body) = s.call("GET", &s.jobs_url(project), None);
    assert_eq!(status, 200, "{body}");
    body["customJobs"].as_array().map_or(0, Vec::len)
}

/// Entries below `dir`, recursively (links not followed).
fn entries_below(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            out.push(e.path());
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                out.extend(entries_below(&e.path()));
            }
        }
    }
    out
}

/// Project A's `gs://shared/...` and project B's `gs://shared/...` are different
/// directories: B does not find A's checkpoint through its own gs:// path.
#[test]
fn gs_paths_are_per_project_namespaces() {
    let s = Server::start("");
    let a = s.create(
        "proj-a",
        &with_base(sh_job("a", "echo dir=$AIP_CHECKPOINT_DIR; echo secret-of-a > $AIP_CHECKPOINT_DIR/ckpt"), "gs://shared/run"),
    );
    let done = s.wait_terminal(&name_of(&a), 30);
    assert_eq!(state(&done), "JOB_STATE_SUCCEEDED", "{}", s.logs_text(&name_of(&a)));
    let b = s.create(
        "proj-b",
        &with_base(
            sh_job("b", "echo dir=$AIP_CHECKPOINT_DIR; if [ -e $AIP_CHECKPOINT_DIR/ckpt ]; then cat $AIP_CHECKPOINT_DIR/ckpt; else echo no-checkpoint; fi"),
            "gs://shared/run",
        ),
    );
    let done = s.wait_terminal(&name_of(&b), 30);
    assert_eq!(state(&done), "JOB_STATE_SUCCEEDED", "{}", s.logs_text(&name_of(&b)));
    let (a_text, b_text) = (s.logs_text(&name_of(&a)), s.logs_text(&name_of(&b)));
    assert!(b_text.contains("no-checkpoint") && !b_text.contains("secret-of-a"), "{b_text}");
    let storage = s.data_dir().join("storage");
    let a_dir = storage.join("proj-a/shared/run/checkpoints");
    let b_dir = storage.join("proj-b/shared/run/checkpoints");
    assert!(a_text.contains(&format!("dir={}", a_dir.display())), "{a_text}");
    assert!(b_text.contains(&format!("dir={}", b_dir.display())), "{b_text}");
    assert_eq!(std::fs::read_to_string(a_dir.join("ckpt")).unwrap(), "secret-of-a\n");
    assert!(!b_dir.join("ckpt").exists());
    assert!(!storage.join("shared").exists(), "nothing in the shared layout of before");
}

/// Output directories in the data directory, the server's working directory, another
/// project's namespace or an unconfigured /tmp are refused at create with 400 naming the
/// field, and nothing is stored; a configured output root is used; an output root that
/// is or contains the data directory is refused at start.
#[test]
fn output_dirs_outside_the_roots_are_refused() {
    let s = Server::start("");
    let data = s.data_dir();
    let cases = [
        data.display().to_string(),
        format!("{}/runs/1/0/workerpool0-0/0", data.display()),
        format!("file://{}/trials", data.display()),
        s.dir.path().display().to_string(),
        format!("{}/work", s.dir.path().display()),
        format!("{}/storage/other-project/bucket", data.display()),
        "/tmp/trainyard-outputs".to_string(),
        "file:///tmp/trainyard-outputs".to_string(),
        "gs://bucket/../../../etc".to_string(),
    ];
    for uri in &cases {
        let (status, body) = s.call("POST", &s.jobs_url("p"), Some(&with_base(sh_job("o", "true"), uri).to_string()));
        assert_invalid(status, &body, BASE_FIELD);
    }
    // The trial spec of a tuning job alike.
    let study = json!({
        "displayName": "t", "maxTrialCount": 1, "parallelTrialCount": 1,
        "studySpec": {"metrics": [{"metricId": "m", "goal": "MAXIMIZE"}],
                      "parameters": [{"parameterId": "x", "doubleValueSpec": {"minValue": 0.0, "maxValue": 1.0}}]},
        "trialJobSpec": with_base(sh_job("o", "true"), &data.display().to_string())["jobSpec"].clone()
    });
    let (status, body) =
        s.call("POST", &s.url("/v1/projects/p/locations/us-central1/hyperparameterTuningJobs"), Some(&study.to_string()));
    assert_invalid(status, &body, "trialJobSpec.baseOutputDirectory.outputUriPrefix");
    assert_eq!(job_count(&s, "p"), 0, "nothing stored");

    // A configured output root is used.
    let scratch = tempfile::tempdir().unwrap();
    let root = scratch.path().join("scratch");
    std::fs::create_dir_all(&root).unwrap();
    let mut t = Server::prepare("");
    std::fs::write(&t.config, config_text(&format!("output_roots = [{:?}]", root.display().to_string()))).unwrap();
    t.spawn();
    let out = root.join("o");
    let j = t.create("p", &with_base(sh_job("o", "echo w > $AIP_MODEL_DIR/m"), &out.display().to_string()));
    let done = t.wait_terminal(&name_of(&j), 30);
    assert_eq!(state(&done), "JOB_STATE_SUCCEEDED", "{}", t.logs_text(&name_of(&j)));
    assert_eq!(std::fs::read_to_string(out.join("model/m")).unwrap(), "w\n");
    let (status, body) = t.call("POST", &t.jobs_url("p"), Some(&with_base(sh_job("o", "true"), "/tmp/x").to_string()));
    assert_invalid(status, &body, BASE_FIELD);
    drop(t);

    // An output root that is, or contains, the data directory: refused at start.
    for bad in [|d: &Path| d.to_path_buf(), |d: &Path| d.parent().unwrap().to_path_buf()] {
        let mut u = Server::prepare("");
        let root = bad(&u.data_dir());
        std::fs::write(&u.config, config_text(&format!("output_roots = [{:?}]", root.display().to_string()))).unwrap();
        let e = u.try_spawn().expect_err("the server must refuse the output root");
        assert!(e.contains("output_roots") && e.contains("data directory"), "{e}");
    }
}

/// A symbolic link planted under the storage root that points out of it makes a create
/// through it 400, and at launch the server creates nothing through a link: a job that
/// replaces its output directory with a link out and dies is not restarted into it (its
/// restart is a StartError naming the link) and nothing appears at the link's target.
#[test]
fn symlinks_under_the_storage_root_are_refused_and_never_followed() {
    if skip_on_slurm("the storage root is read on the server's host") {
        return;
    }
    let s = Server::start("");
    let outside = tempfile::tempdir().unwrap();
    let bucket = s.data_dir().join("storage/p/bucket");
    std::fs::create_dir_all(&bucket).unwrap();
    std::os::unix::fs::symlink(outside.path(), bucket.join("evil")).unwrap();
    for uri in ["gs://bucket/evil", "gs://bucket/evil/run", "gs://bucket/evil/run/deeper"] {
        let (status, body) = s.call("POST", &s.jobs_url("p"), Some(&with_base(sh_job("l", "true"), uri).to_string()));
        assert_invalid(status, &body, BASE_FIELD);
        assert_invalid(status, &body, "symbolic link");
    }
    assert_eq!(job_count(&s, "p"), 0);

    // At launch: the job's own program swaps its output directory for a link out of the
    // root, then dies; the restart must not create model/, checkpoints/, logs/ there.
    let script = r#"b=$(dirname "$AIP_MODEL_DIR"); if [ ! -L "$b" ]; then mv "$b" "$b.old" && ln -s "$OUT" "$b" && echo planted && kill -9 $$; fi; echo second-run"#;
    let mut job = with_base(sh_job("swap", script), "gs://bucket/swap");
    job["jobSpec"]["workerPoolSpecs"][0]["containerSpec"]["env"] = json!([{"name": "OUT", "value": outside.path().display().to_string()}]);
    let j = s.create("p", &job);
    let done = s.wait_terminal(&name_of(&j), 30);
    let text = s.logs_text(&name_of(&j));
    assert!(text.contains("planted"), "{text}");
    assert!(!text.contains("second-run"), "{text}");
    assert_eq!(state(&done), "JOB_STATE_FAILED", "{text}");
    let error = done["error"]["message"].as_str().unwrap_or("");
    assert!(error.contains("symbolic link") && error.contains("bucket/swap"), "{error}");
    assert_eq!(entries_below(outside.path()), Vec::<PathBuf>::new(), "nothing created through the link");
}
