//! Job files: the YAML `--config` of the known CLI (a CustomJobSpec: `workerPoolSpecs`,
//! `scheduling`, `baseOutputDirectory`, ...), or a whole CustomJob (`displayName`,
//! `jobSpec`, `labels`).
//!
//! A job file's `command: [python3, train.py]` means `train.py` next to the job file:
//! `local-run` runs replicas in the job file's directory, and `custom-jobs create` turns
//! such paths into absolute ones when the server is on this host ([`local_paths`],
//! [`resolve_paths`]).

use std::path::{Path, PathBuf};

use anyhow::Context;
use serde_json::{json, Value};

/// Read a job file into the JSON of a CustomJob request.
pub fn read(path: &Path, display_name: Option<&str>) -> anyhow::Result<Value> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read job file {}", path.display()))?;
    let doc: Value = serde_norway::from_str(&text).with_context(|| format!("job file {} is not valid YAML", path.display()))?;
    let Value::Object(map) = doc else {
        anyhow::bail!("job file {}: expected a mapping with workerPoolSpecs (or jobSpec) at the top", path.display());
    };
    let is_job = map.contains_key("jobSpec") || map.contains_key("job_spec");
    let mut job = if is_job { Value::Object(map) } else { json!({ "jobSpec": Value::Object(map) }) };
    let default_name = default_display_name(path);
    if let Some(obj) = job.as_object_mut() {
        match display_name {
            Some(n) => {
                obj.insert("displayName".into(), Value::String(n.to_string()));
            }
            None => {
                if !obj.contains_key("displayName") && !obj.contains_key("display_name") {
                    obj.insert("displayName".into(), Value::String(default_name));
                }
            }
        }
    }
    // One reader for every command: the API's own parser takes camelCase and snake_case
    // names (as the known CLI's --config does) and gives the job back in the API's names,
    // so what follows (flags merged in, paths, the request) sees one spelling. A file the
    // parser refuses is kept as written, for `check` to name its mistake and line.
    if let Ok(parsed) = trainyard_api::parse_custom_job(job.to_string().as_bytes()) {
        if let Ok(normal) = serde_json::to_value(&parsed) {
            job = normal;
        }
    }
    Ok(job)
}

/// The job file's CustomJob checked by the API's own rules: an error is one line that
/// names the file, the line of the YAML it is about (where it can be found) and the field.
pub fn check(path: &Path, job: &Value) -> anyhow::Result<trainyard_api::CustomJob> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let at = |message: &str| match locate(&text, message) {
        Some(line) => format!("job file {}, line {line}: {message}", path.display()),
        None => format!("job file {}: {message}", path.display()),
    };
    let parsed = trainyard_api::parse_custom_job(job.to_string().as_bytes())
        .map_err(|e| anyhow::anyhow!(at(&trainyard_server::kinds::kind::with_suggestion(e).message)))?;
    trainyard_api::validate_custom_job(&parsed).map_err(|e| anyhow::anyhow!(at(&e.message)))?;
    Ok(parsed)
}

/// The 1-based line of `text` (a job file) that an API error `message` is about: the line
/// of an unknown field's name, else the start of the worker pool it names
/// (`workerPoolSpecs[N]` or `worker_pool_specs[N]`).
fn locate(text: &str, message: &str) -> Option<usize> {
    let lines: Vec<&str> = text.lines().collect();
    if let Some(name) = message.split("Unknown name \"").nth(1).and_then(|r| r.split('"').next()) {
        let key = format!("{name}:");
        if let Some(i) = lines.iter().position(|l| l.contains(&key)) {
            return Some(i + 1);
        }
    }
    let n: usize = ["workerPoolSpecs[", "worker_pool_specs["]
        .iter()
        .find_map(|k| message.split(k).nth(1))
        .and_then(|r| r.split(']').next())
        .and_then(|n| n.parse().ok())?;
    let start = lines.iter().position(|l| {
        let key = l.trim_start().trim_start_matches("- ");
        key.starts_with("workerPoolSpecs:") || key.starts_with("worker_pool_specs:")
    })?;
    // The list's items: lines starting with "- " at the first item's indentation.
    let mut indent = None;
    let mut seen = 0;
    for (i, l) in lines.iter().enumerate().skip(start + 1) {
        let trimmed = l.trim_start();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let col = l.len() - trimmed.len();
        if !trimmed.starts_with("- ") {
            if indent.is_some_and(|c| col < c) || (indent.is_none() && col == 0) {
                return None;
            }
            continue;
        }
        match indent {
            None => indent = Some(col),
            Some(c) if col < c => return None,
            Some(c) if col > c => continue,
            Some(_) => {}
        }
        if seen == n {
            return Some(i + 1);
        }
        seen += 1;
    }
    None
}

/// A job's name when neither the file nor the command line gives one: the file's stem,
/// or for a file named `job.yaml` its directory's name (`examples/checkpoint/job.yaml` is
/// `checkpoint`), so that the examples' jobs are told apart.
fn default_display_name(path: &Path) -> String {
    let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("job");
    if stem == "job" {
        let dir = std::path::absolute(path).ok().and_then(|p| p.parent().and_then(|d| d.file_name()).map(|n| n.to_string_lossy().into_owned()));
        if let Some(dir) = dir.filter(|d| !d.is_empty()) {
            return dir;
        }
    }
    stem.to_string()
}

/// A relative path of a job's program (an element of a pool's `command` or `args`, or a
/// `packageUris` entry) that names a file or directory in `dir`.
#[derive(Debug, Clone, PartialEq)]
pub struct LocalPath {
    /// Where it is: `workerPoolSpecs[0].containerSpec.command[1]`.
    pub field: String,
    /// As written: `train.py`.
    pub written: String,
    /// What it names: `/home/me/project/train.py`.
    pub absolute: PathBuf,
}

/// The JSON pointers (and their display names) of the lists that may hold program paths.
fn path_lists(job: &Value) -> Vec<(String, String)> {
    let get = |v: &Value, a: &str, b: &str| -> Option<(String, Value)> {
        if let Some(x) = v.get(a) {
            return Some((a.to_string(), x.clone()));
        }
        v.get(b).map(|x| (b.to_string(), x.clone()))
    };
    let mut out = Vec::new();
    // A CustomJob's `jobSpec`, or a HyperparameterTuningJob's `trialJobSpec`.
    let Some((spec_key, spec)) = get(job, "jobSpec", "job_spec").or_else(|| get(job, "trialJobSpec", "trial_job_spec")) else {
        return out;
    };
    let Some((pools_key, Value::Array(pools))) = get(&spec, "workerPoolSpecs", "worker_pool_specs") else { return out };
    for (i, pool) in pools.iter().enumerate() {
        for (a, b, lists) in [
            ("containerSpec", "container_spec", &["command", "args"][..]),
            ("pythonPackageSpec", "python_package_spec", &["args", "packageUris", "package_uris"][..]),
        ] {
            let Some((spec_name, spec)) = get(pool, a, b) else { continue };
            for list in lists {
                if spec.get(*list).is_some_and(Value::is_array) {
                    out.push((
                        format!("/{spec_key}/{pools_key}/{i}/{spec_name}/{list}"),
                        format!("{pools_key}[{i}].{spec_name}.{list}"),
                    ));
                }
            }
        }
    }
    out
}

/// Does `arg` look like a relative path (not a flag, not an absolute path or URI, not
/// `KEY=VALUE`, no spaces) and name something in `dir`?
fn names_local(arg: &str, dir: &Path) -> Option<PathBuf> {
    if arg.is_empty()
        || arg.starts_with(['/', '-', '~', '$'])
        || arg.contains("://")
        || arg.contains(['=', ' ', '\t', '\n'])
        || arg == "."
        || arg == ".."
    {
        return None;
    }
    let p = dir.join(arg);
    std::fs::symlink_metadata(&p).ok()?;
    Some(std::path::absolute(&p).unwrap_or(p))
}

/// The relative paths of a CustomJob's programs that name files in `dir`.
pub fn local_paths(job: &Value, dir: &Path) -> Vec<LocalPath> {
    let mut out = Vec::new();
    for (pointer, shown) in path_lists(job) {
        let Some(Value::Array(items)) = job.pointer(&pointer) else { continue };
        for (j, item) in items.iter().enumerate() {
            let Some(arg) = item.as_str() else { continue };
            if let Some(absolute) = names_local(arg, dir) {
                out.push(LocalPath { field: format!("{shown}[{j}]"), written: arg.to_string(), absolute });
            }
        }
    }
    out
}

/// Make every path [`local_paths`] finds absolute; returns them.
pub fn resolve_paths(job: &mut Value, dir: &Path) -> Vec<LocalPath> {
    let mut out = Vec::new();
    for (pointer, shown) in path_lists(job) {
        let Some(Value::Array(items)) = job.pointer_mut(&pointer) else { continue };
        for (j, item) in items.iter_mut().enumerate() {
            let Some(arg) = item.as_str().map(str::to_string) else { continue };
            if let Some(absolute) = names_local(&arg, dir) {
                *item = Value::String(absolute.display().to_string());
                out.push(LocalPath { field: format!("{shown}[{j}]"), written: arg, absolute });
            }
        }
    }
    out
}

/// The directory relative paths of a job file are read against: the file's own.
pub fn dir_of(path: &Path) -> PathBuf {
    std::path::absolute(path).ok().and_then(|p| p.parent().map(PathBuf::from)).unwrap_or_else(crate::cwd)
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_error_names_the_line_it_is_about() {
        let text = "# a job\nworkerPoolSpecs:\n  - machineSpec: {machineType: n1-standard-4}\n    replicaCount: 1\n  \
                    - replicaCount: 2\n    containerSpec: {imageUri: x, command: [\"true\"]}\n";
        assert_eq!(super::locate(text, "jobSpec.workerPoolSpecs[1].machineSpec is required."), Some(5));
        assert_eq!(super::locate(text, "jobSpec.workerPoolSpecs[0].containerSpec is required."), Some(3));
        let typo = "workerPoolSpecs:\n  - machineSpec: {machineTyp: n1-standard-4}\n";
        let m = "Invalid JSON payload received. Unknown name \"machineTyp\" at 'custom_job.job_spec.worker_pool_specs[0].machine_spec': Cannot find field.";
        assert_eq!(super::locate(typo, m), Some(2));
        assert_eq!(super::locate(text, "displayName is required."), None);
    }

    #[test]
    fn a_job_yaml_is_named_after_its_directory() {
        use std::path::Path;
        assert_eq!(super::default_display_name(Path::new("examples/checkpoint/job.yaml")), "checkpoint");
        assert_eq!(super::default_display_name(Path::new("/x/train-small.yaml")), "train-small");
    }

    use super::*;

    #[test]
    fn relative_program_paths_are_found_and_resolved() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("train.py"), "print(1)\n").unwrap();
        std::fs::create_dir(dir.path().join("data")).unwrap();
        let mut job = json!({"jobSpec": {"workerPoolSpecs": [
            {"containerSpec": {"imageUri": "i", "command": ["python3", "train.py"], "args": ["--data", "data", "--n=3", "missing.py"]}},
            {"pythonPackageSpec": {"executorImageUri": "i", "pythonModule": "m", "packageUris": ["train.py", "gs://b/p.tar.gz"]}}
        ]}});
        let found = local_paths(&job, dir.path());
        let fields: Vec<&str> = found.iter().map(|p| p.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "workerPoolSpecs[0].containerSpec.command[1]",
                "workerPoolSpecs[0].containerSpec.args[1]",
                "workerPoolSpecs[1].pythonPackageSpec.packageUris[0]"
            ]
        );
        resolve_paths(&mut job, dir.path());
        let abs = dir.path().join("train.py").display().to_string();
        assert_eq!(job["jobSpec"]["workerPoolSpecs"][0]["containerSpec"]["command"], json!(["python3", abs]));
        assert_eq!(job["jobSpec"]["workerPoolSpecs"][0]["containerSpec"]["args"][3], "missing.py");
        assert!(local_paths(&job, dir.path()).is_empty());
    }

    #[test]
    fn spec_file_is_wrapped() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("train.yaml");
        std::fs::write(&p, "workerPoolSpecs:\n  - machineSpec: {machineType: n1-standard-4}\n    replicaCount: 1\n    containerSpec: {imageUri: x, command: [python3, t.py]}\n").unwrap();
        let v = read(&p, None).unwrap();
        assert_eq!(v["displayName"], "train");
        assert_eq!(v["jobSpec"]["workerPoolSpecs"][0]["machineSpec"]["machineType"], "n1-standard-4");
        let job = trainyard_api::parse_custom_job(v.to_string().as_bytes()).unwrap();
        assert_eq!(job.job_spec.worker_pool_specs.len(), 1);
    }

    /// One reader: a snake_case file (as the SDK and many YAML files write it) reads as
    /// the camelCase one, labels' own keys untouched.
    #[test]
    fn a_snake_case_file_reads_as_the_camel_case_one() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("snake.yaml");
        std::fs::write(
            &p,
            "worker_pool_specs:\n  - machine_spec: {machine_type: n1-standard-4}\n    replica_count: 1\n    container_spec: {image_uri: x, command: [python3, t.py]}\n",
        )
        .unwrap();
        let v = read(&p, None).unwrap();
        assert_eq!(v["jobSpec"]["workerPoolSpecs"][0]["machineSpec"]["machineType"], "n1-standard-4", "{v}");
        assert_eq!(v["jobSpec"]["workerPoolSpecs"][0]["containerSpec"]["command"], json!(["python3", "t.py"]), "{v}");
        let q = dir.path().join("job.yaml");
        std::fs::write(&q, "display_name: d\nlabels: {my_team: a}\njob_spec:\n  worker_pool_specs:\n  - machine_spec: {machine_type: n1-standard-4}\n    replica_count: 1\n    container_spec: {image_uri: x}\n").unwrap();
        let v = read(&q, None).unwrap();
        assert_eq!((v["displayName"].as_str(), v["labels"]["my_team"].as_str()), (Some("d"), Some("a")), "{v}");
    }

    #[test]
    fn broken_file_names_itself() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("bad.yaml");
        std::fs::write(&p, "workerPoolSpecs: [\n").unwrap();
        let e = format!("{:#}", read(&p, None).unwrap_err());
        assert!(e.contains("bad.yaml"), "{e}");
        std::fs::write(&p, "- a\n- b\n").unwrap();
        assert!(format!("{:#}", read(&p, None).unwrap_err()).contains("expected a mapping"));
    }
}
