//! Job files: the YAML `--config` of the known CLI (a CustomJobSpec: `workerPoolSpecs`,
//! `scheduling`, `baseOutputDirectory`, ...), or a whole CustomJob (`displayName`,
//! `jobSpec`, `labels`).

use std::path::Path;

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
    let default_name = path.file_stem().and_then(|s| s.to_str()).unwrap_or("job").to_string();
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
    Ok(job)
}

#[cfg(test)]
mod tests {
    use super::*;

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
