//! Structural validation at create. Every message names the field path in camelCase,
//! e.g. `jobSpec.workerPoolSpecs[1].machineSpec.acceleratorCount`.
//!
//! Catalog checks (machine type known, accelerator combinations, quota) are not done
//! here: they need the machine-type catalog.

use std::collections::{BTreeMap, BTreeSet};

use crate::error::ApiError;
use crate::hptuning::{
    Algorithm, ConditionalParameterSpec, HyperparameterTuningJob, ParameterSpec, StudySpec,
};
use crate::imageref::parse_image_reference;
use crate::types::{AcceleratorType, CustomJob, CustomJobSpec, EnvVar, WorkerPoolSpec};

/// Longest `displayName`, in characters.
pub const MAX_DISPLAY_NAME_CHARS: usize = 128;
/// Most worker pools: primary, workers, parameter servers, evaluators.
pub const MAX_WORKER_POOLS: usize = 4;
/// Most replicas in one pool.
pub const MAX_REPLICA_COUNT: i64 = 1000;
/// Most labels on a resource.
pub const MAX_LABELS: usize = 64;
/// Longest label key or value, in characters.
pub const MAX_LABEL_CHARS: usize = 63;
/// Allowed boot disk sizes.
pub const BOOT_DISK_SIZE_GB: std::ops::RangeInclusive<i32> = 100..=64000;

type Result = std::result::Result<(), ApiError>;

fn bad(message: String) -> Result {
    Err(ApiError::invalid_argument(message))
}

/// Validates a CustomJob at create: display name, labels and the job spec.
pub fn validate_custom_job(job: &CustomJob) -> Result {
    validate_display_name(&job.display_name)?;
    validate_labels(&job.labels)?;
    validate_host_directories(&job.trainyard_host_directories)?;
    validate_job_spec(&job.job_spec, "jobSpec")
}

/// `trainyardHostDirectories`: at most 16 absolute, normal paths (no `.` or `..`
/// segment, no NUL), each at most 4096 bytes.
pub fn validate_host_directories(dirs: &[String]) -> Result {
    if dirs.len() > 16 {
        return bad(format!("trainyardHostDirectories has {} entries; at most 16 are allowed.", dirs.len()));
    }
    for (i, d) in dirs.iter().enumerate() {
        let normal = d.starts_with('/') && !d.split('/').any(|s| s == "." || s == "..") && !d.contains('\0') && d.len() <= 4096;
        if !normal {
            return bad(format!("trainyardHostDirectories[{i}]: {d:?} must be an absolute path without . or .. segments."));
        }
    }
    Ok(())
}

/// `displayName` present and at most 128 characters.
pub fn validate_display_name(display_name: &str) -> Result {
    if display_name.trim().is_empty() {
        return bad("displayName is required.".into());
    }
    let n = display_name.chars().count();
    if n > MAX_DISPLAY_NAME_CHARS {
        return bad(format!(
            "displayName must be at most {MAX_DISPLAY_NAME_CHARS} characters long, got {n}."
        ));
    }
    Ok(())
}

/// At most 64 labels; keys and values at most 63 characters of lowercase letters
/// (international ones included), digits, `_` and `-`; keys start with a lowercase letter.
pub fn validate_labels(labels: &BTreeMap<String, String>) -> Result {
    if labels.len() > MAX_LABELS {
        return bad(format!(
            "labels has {} entries; at most {MAX_LABELS} are allowed.",
            labels.len()
        ));
    }
    let allowed = |c: char| c.is_lowercase() || c.is_ascii_digit() || c == '_' || c == '-';
    for (key, value) in labels {
        if key.is_empty() {
            return bad("labels: a label key must not be empty.".into());
        }
        if key.chars().count() > MAX_LABEL_CHARS {
            return bad(format!(
                "labels: key {key:?} is longer than {MAX_LABEL_CHARS} characters."
            ));
        }
        if !key.chars().next().is_some_and(char::is_lowercase) {
            return bad(format!(
                "labels: key {key:?} must start with a lowercase letter."
            ));
        }
        if !key.chars().all(allowed) {
            return bad(format!(
                "labels: key {key:?} may contain only lowercase letters, digits, '_' and '-'."
            ));
        }
        if value.chars().count() > MAX_LABEL_CHARS {
            return bad(format!(
                "labels.{key}: value is longer than {MAX_LABEL_CHARS} characters."
            ));
        }
        if !value.chars().all(allowed) {
            return bad(format!(
                "labels.{key}: value {value:?} may contain only lowercase letters, digits, '_' and '-'."
            ));
        }
    }
    Ok(())
}

/// Validates a `CustomJobSpec`; `prefix` is its path (`jobSpec` or `trialJobSpec`).
pub fn validate_job_spec(spec: &CustomJobSpec, prefix: &str) -> Result {
    let pools = &spec.worker_pool_specs;
    if pools.is_empty() {
        return bad(format!(
            "{prefix}.workerPoolSpecs must contain at least one worker pool."
        ));
    }
    if pools.len() > MAX_WORKER_POOLS {
        return bad(format!(
            "{prefix}.workerPoolSpecs has {} pools; at most {MAX_WORKER_POOLS} are allowed \
             (primary, workers, parameter servers, evaluators).",
            pools.len()
        ));
    }
    for (i, pool) in pools.iter().enumerate() {
        validate_pool(pool, i, &format!("{prefix}.workerPoolSpecs[{i}]"))?;
    }
    if let Some(scheduling) = &spec.scheduling {
        if let Some(timeout) = &scheduling.timeout {
            if timeout.is_negative() {
                return bad(format!(
                    "{prefix}.scheduling.timeout must not be negative, got {timeout}."
                ));
            }
            if timeout.is_zero() {
                return bad(format!(
                    "{prefix}.scheduling.timeout must be greater than 0s."
                ));
            }
        }
        if let Some(wait) = &scheduling.max_wait_duration {
            if wait.is_negative() {
                return bad(format!(
                    "{prefix}.scheduling.maxWaitDuration must not be negative, got {wait}."
                ));
            }
        }
    }
    if let Some(dest) = &spec.base_output_directory {
        validate_output_uri(
            &dest.output_uri_prefix,
            &format!("{prefix}.baseOutputDirectory.outputUriPrefix"),
        )?;
    }
    Ok(())
}

fn validate_pool(pool: &WorkerPoolSpec, index: usize, path: &str) -> Result {
    if pool.is_empty() {
        if index == 0 {
            return bad(format!(
                "{path} must not be empty: pool 0 is the primary pool."
            ));
        }
        // An empty placeholder pool (e.g. no parameter servers but evaluators).
        return Ok(());
    }
    if index == 0 && pool.replica_count != 1 {
        return bad(format!(
            "{path}.replicaCount must be 1 for the primary pool, got {}.",
            pool.replica_count
        ));
    }
    if pool.replica_count < 1 {
        return bad(format!(
            "{path}.replicaCount must be at least 1, got {}.",
            pool.replica_count
        ));
    }
    if pool.replica_count > MAX_REPLICA_COUNT {
        return bad(format!(
            "{path}.replicaCount must be at most {MAX_REPLICA_COUNT}, got {}.",
            pool.replica_count
        ));
    }
    let Some(machine) = &pool.machine_spec else {
        return bad(format!("{path}.machineSpec is required."));
    };
    if machine.machine_type.trim().is_empty() {
        return bad(format!("{path}.machineSpec.machineType is required."));
    }
    if machine.accelerator_count < 0 {
        return bad(format!(
            "{path}.machineSpec.acceleratorCount must not be negative, got {}.",
            machine.accelerator_count
        ));
    }
    let has_type = machine.accelerator_type != AcceleratorType::Unspecified;
    if has_type && machine.accelerator_count == 0 {
        return bad(format!(
            "{path}.machineSpec.acceleratorCount must be greater than 0 when \
             {path}.machineSpec.acceleratorType is {}.",
            machine.accelerator_type
        ));
    }
    if !has_type && machine.accelerator_count > 0 {
        return bad(format!(
            "{path}.machineSpec.acceleratorCount is {} but {path}.machineSpec.acceleratorType \
             is not set.",
            machine.accelerator_count
        ));
    }
    match (&pool.container_spec, &pool.python_package_spec) {
        (Some(_), Some(_)) => {
            return bad(format!(
                "{path} must set exactly one of containerSpec and pythonPackageSpec, not both."
            ));
        }
        (None, None) => {
            return bad(format!(
                "{path} must set one of containerSpec or pythonPackageSpec."
            ));
        }
        (Some(c), None) => {
            let p = format!("{path}.containerSpec");
            if c.image_uri.trim().is_empty() {
                return bad(format!("{p}.imageUri is required."));
            }
            no_nul(&c.image_uri, &format!("{p}.imageUri"))?;
            validate_image(&c.image_uri, &format!("{p}.imageUri"))?;
            no_nul_in(&c.command, &format!("{p}.command"))?;
            no_nul_in(&c.args, &format!("{p}.args"))?;
            validate_env(&c.env, &format!("{p}.env"))?;
        }
        (None, Some(p)) => {
            if p.executor_image_uri.trim().is_empty() {
                return bad(format!(
                    "{path}.pythonPackageSpec.executorImageUri is required."
                ));
            }
            if p.python_module.trim().is_empty() {
                return bad(format!(
                    "{path}.pythonPackageSpec.pythonModule is required."
                ));
            }
            if p.package_uris.is_empty() {
                return bad(format!(
                    "{path}.pythonPackageSpec.packageUris must contain at least one package."
                ));
            }
            if let Some(k) = p.package_uris.iter().position(|u| u.trim().is_empty()) {
                return bad(format!(
                    "{path}.pythonPackageSpec.packageUris[{k}] must not be empty."
                ));
            }
            let pp = format!("{path}.pythonPackageSpec");
            no_nul(&p.executor_image_uri, &format!("{pp}.executorImageUri"))?;
            validate_image(&p.executor_image_uri, &format!("{pp}.executorImageUri"))?;
            no_nul(&p.python_module, &format!("{pp}.pythonModule"))?;
            no_nul_in(&p.package_uris, &format!("{pp}.packageUris"))?;
            no_nul_in(&p.args, &format!("{pp}.args"))?;
            validate_env(&p.env, &format!("{pp}.env"))?;
        }
    }
    if let Some(disk) = &pool.disk_spec {
        let size = disk.boot_disk_size_gb;
        if size != 0 && !BOOT_DISK_SIZE_GB.contains(&size) {
            return bad(format!(
                "{path}.diskSpec.bootDiskSizeGb must be between {} and {}, got {size}.",
                BOOT_DISK_SIZE_GB.start(),
                BOOT_DISK_SIZE_GB.end()
            ));
        }
    }
    for (k, mount) in pool.nfs_mounts.iter().enumerate() {
        let m = format!("{path}.nfsMounts[{k}]");
        if mount.server.trim().is_empty() {
            return bad(format!("{m}.server is required."));
        }
        if mount.path.trim().is_empty() {
            return bad(format!("{m}.path is required."));
        }
        if mount.mount_point.trim().is_empty() {
            return bad(format!("{m}.mountPoint is required."));
        }
        no_nul(&mount.server, &format!("{m}.server"))?;
        no_nul(&mount.path, &format!("{m}.path"))?;
        no_nul(&mount.mount_point, &format!("{m}.mountPoint"))?;
        if mount.mount_point.split('/').any(|s| s == "..") {
            return bad(format!("{m}.mountPoint must not contain a '..' segment."));
        }
    }
    Ok(())
}

/// A container image reference, `[domain/]path[:tag][@digest]` as podman and docker
/// read it (see [`crate::imageref`]): `{path} "Foo" is not a valid image reference: ...`.
fn validate_image(image: &str, path: &str) -> Result {
    match parse_image_reference(image) {
        Ok(_) => Ok(()),
        Err(e) => bad(format!("{path} {e}.")),
    }
}

/// A string handed to a process (argument, environment, path) cannot hold a NUL byte:
/// refused at create rather than failing at launch.
fn no_nul(text: &str, path: &str) -> Result {
    if text.contains('\0') {
        return bad(format!("{path} must not contain a NUL character."));
    }
    Ok(())
}

/// [`no_nul`] for each item of a list, with its index in the path (`command[1]`).
fn no_nul_in(items: &[String], path: &str) -> Result {
    for (k, item) in items.iter().enumerate() {
        no_nul(item, &format!("{path}[{k}]"))?;
    }
    Ok(())
}

/// Environment variable names: non-empty identifiers (`[A-Za-z_][A-Za-z0-9_]*`, so no
/// `=`); names and values without NUL characters.
fn validate_env(env: &[EnvVar], path: &str) -> Result {
    for (k, var) in env.iter().enumerate() {
        if var.name.is_empty() {
            return bad(format!("{path}[{k}].name is required."));
        }
        no_nul(&var.name, &format!("{path}[{k}].name"))?;
        no_nul(&var.value, &format!("{path}[{k}].value"))?;
        let mut chars = var.name.chars();
        let first_ok = chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
        if !first_ok || !chars.all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return bad(format!(
                "{path}[{k}].name {:?} is not a valid environment variable name \
                 (letters, digits and '_', not starting with a digit).",
                var.name
            ));
        }
    }
    Ok(())
}

/// `gs://bucket[/...]`, `file:///abs/...` or `/abs/...`, with no `..` segment.
fn validate_output_uri(uri: &str, path: &str) -> Result {
    if uri.is_empty() {
        return bad(format!(
            "{path} is required when baseOutputDirectory is set."
        ));
    }
    if uri.contains('\0') {
        return bad(format!("{path} must not contain a NUL character."));
    }
    let rest = if let Some(rest) = uri.strip_prefix("gs://") {
        let bucket = rest.split('/').next().unwrap_or("");
        if bucket.is_empty() {
            return bad(format!(
                "{path} {uri:?} must name a bucket: gs://BUCKET/..."
            ));
        }
        rest
    } else if let Some(rest) = uri.strip_prefix("file://") {
        if !rest.starts_with('/') {
            return bad(format!(
                "{path} {uri:?} must be an absolute file URI: file:///path/..."
            ));
        }
        rest
    } else if uri.starts_with('/') {
        uri
    } else {
        return bad(format!(
            "{path} {uri:?} must be a gs:// URI, a file:/// URI or an absolute path."
        ));
    };
    let parent = |seg: &str| {
        let lower = seg.to_ascii_lowercase();
        lower == ".." || lower == "%2e%2e" || lower == ".%2e" || lower == "%2e."
    };
    if rest.split(['/', '\\']).any(parent) {
        return bad(format!("{path} {uri:?} must not contain a '..' segment."));
    }
    Ok(())
}

/// Validates a HyperparameterTuningJob at create: display name, labels, the study spec,
/// the trial counts and the trial job spec (paths `trialJobSpec.workerPoolSpecs[0]...`).
pub fn validate_hyperparameter_tuning_job(job: &HyperparameterTuningJob) -> Result {
    validate_display_name(&job.display_name)?;
    validate_labels(&job.labels)?;
    validate_host_directories(&job.trainyard_host_directories)?;
    validate_study_spec(&job.study_spec, "studySpec")?;
    if job.max_trial_count <= 0 {
        return bad(format!(
            "maxTrialCount must be greater than 0, got {}.",
            job.max_trial_count
        ));
    }
    if job.parallel_trial_count <= 0 {
        return bad(format!(
            "parallelTrialCount must be greater than 0, got {}.",
            job.parallel_trial_count
        ));
    }
    if job.parallel_trial_count > job.max_trial_count {
        return bad(format!(
            "parallelTrialCount ({}) must not be greater than maxTrialCount ({}).",
            job.parallel_trial_count, job.max_trial_count
        ));
    }
    if job.max_failed_trial_count < 0 {
        return bad(format!(
            "maxFailedTrialCount must not be negative, got {}.",
            job.max_failed_trial_count
        ));
    }
    validate_job_spec(&job.trial_job_spec, "trialJobSpec")
}

/// Validates a `StudySpec`; `prefix` is its path (`studySpec`).
pub fn validate_study_spec(spec: &StudySpec, prefix: &str) -> Result {
    if spec.metrics.is_empty() {
        return bad(format!(
            "{prefix}.metrics must contain at least one metric."
        ));
    }
    let mut metric_ids = BTreeSet::new();
    for (i, metric) in spec.metrics.iter().enumerate() {
        let path = format!("{prefix}.metrics[{i}]");
        if metric.metric_id.trim().is_empty() {
            return bad(format!("{path}.metricId is required."));
        }
        if !metric_ids.insert(metric.metric_id.as_str()) {
            return bad(format!(
                "{path}.metricId {:?} is used twice.",
                metric.metric_id
            ));
        }
        if metric.goal.is_unspecified() {
            return bad(format!("{path}.goal is required (MAXIMIZE or MINIMIZE)."));
        }
    }
    if spec.parameters.is_empty() {
        return bad(format!(
            "{prefix}.parameters must contain at least one parameter."
        ));
    }
    let mut ids = BTreeSet::new();
    for (i, param) in spec.parameters.iter().enumerate() {
        validate_parameter(
            param,
            &format!("{prefix}.parameters[{i}]"),
            spec.algorithm,
            &mut ids,
        )?;
    }
    let stopping = [
        spec.decay_curve_stopping_spec.is_some(),
        spec.median_automated_stopping_spec.is_some(),
        spec.convex_automated_stopping_spec.is_some(),
    ];
    if stopping.iter().filter(|&&s| s).count() > 1 {
        return bad(format!(
            "{prefix} must set at most one of decayCurveStoppingSpec, \
             medianAutomatedStoppingSpec and convexAutomatedStoppingSpec."
        ));
    }
    Ok(())
}

fn validate_parameter(
    param: &ParameterSpec,
    path: &str,
    algorithm: Algorithm,
    ids: &mut BTreeSet<String>,
) -> Result {
    if param.parameter_id.trim().is_empty() {
        return bad(format!("{path}.parameterId is required."));
    }
    if !ids.insert(param.parameter_id.clone()) {
        return bad(format!(
            "{path}.parameterId {:?} is used twice.",
            param.parameter_id
        ));
    }
    let set = [
        param.double_value_spec.is_some(),
        param.integer_value_spec.is_some(),
        param.categorical_value_spec.is_some(),
        param.discrete_value_spec.is_some(),
    ];
    if set.iter().filter(|&&s| s).count() != 1 {
        return bad(format!(
            "{path} must set exactly one of doubleValueSpec, integerValueSpec, \
             categoricalValueSpec and discreteValueSpec."
        ));
    }
    let log = param.scale_type.is_logarithmic();
    if let Some(d) = &param.double_value_spec {
        let p = format!("{path}.doubleValueSpec");
        if algorithm == Algorithm::GridSearch {
            return bad(format!(
                "{p} is not allowed with GRID_SEARCH: use integerValueSpec, discreteValueSpec \
                 or categoricalValueSpec."
            ));
        }
        if !d.min_value.is_finite() || !d.max_value.is_finite() {
            return bad(format!(
                "{p}.minValue and {p}.maxValue must be finite numbers."
            ));
        }
        if d.min_value > d.max_value {
            return bad(format!(
                "{p}.minValue ({}) must not be greater than {p}.maxValue ({}).",
                d.min_value, d.max_value
            ));
        }
        if log && d.min_value <= 0.0 {
            return bad(format!(
                "{p}.minValue must be greater than 0 for {}, got {}.",
                param.scale_type, d.min_value
            ));
        }
        if let Some(v) = d.default_value {
            if !(d.min_value..=d.max_value).contains(&v) {
                return bad(format!(
                    "{p}.defaultValue ({v}) must be between minValue and maxValue."
                ));
            }
        }
    }
    if let Some(n) = &param.integer_value_spec {
        let p = format!("{path}.integerValueSpec");
        if n.min_value > n.max_value {
            return bad(format!(
                "{p}.minValue ({}) must not be greater than {p}.maxValue ({}).",
                n.min_value, n.max_value
            ));
        }
        if log && n.min_value <= 0 {
            return bad(format!(
                "{p}.minValue must be greater than 0 for {}, got {}.",
                param.scale_type, n.min_value
            ));
        }
        if let Some(v) = n.default_value {
            if !(n.min_value..=n.max_value).contains(&v) {
                return bad(format!(
                    "{p}.defaultValue ({v}) must be between minValue and maxValue."
                ));
            }
        }
    }
    if let Some(c) = &param.categorical_value_spec {
        let p = format!("{path}.categoricalValueSpec");
        if c.values.is_empty() {
            return bad(format!("{p}.values must not be empty."));
        }
        let mut seen = BTreeSet::new();
        for (k, v) in c.values.iter().enumerate() {
            if !seen.insert(v.as_str()) {
                return bad(format!("{p}.values[{k}] {v:?} is listed twice."));
            }
        }
        if let Some(v) = &c.default_value {
            if !c.values.contains(v) {
                return bad(format!("{p}.defaultValue {v:?} is not one of the values."));
            }
        }
        if !param.scale_type.is_unspecified() {
            return bad(format!(
                "{path}.scaleType must not be set for a categorical parameter."
            ));
        }
    }
    if let Some(d) = &param.discrete_value_spec {
        let p = format!("{path}.discreteValueSpec");
        if d.values.is_empty() {
            return bad(format!("{p}.values must not be empty."));
        }
        for (k, v) in d.values.iter().enumerate() {
            if !v.is_finite() {
                return bad(format!("{p}.values[{k}] must be a finite number."));
            }
            if log && *v <= 0.0 {
                return bad(format!(
                    "{p}.values[{k}] must be greater than 0 for {}, got {v}.",
                    param.scale_type
                ));
            }
            if d.values[..k].contains(v) {
                return bad(format!("{p}.values[{k}] ({v}) is listed twice."));
            }
        }
        if let Some(v) = d.default_value {
            if !d.values.contains(&v) {
                return bad(format!("{p}.defaultValue ({v}) is not one of the values."));
            }
        }
    }
    for (j, cond) in param.conditional_parameter_specs.iter().enumerate() {
        let cpath = format!("{path}.conditionalParameterSpecs[{j}]");
        validate_condition(param, cond, &cpath)?;
        match &cond.parameter_spec {
            Some(child) => {
                validate_parameter(child, &format!("{cpath}.parameterSpec"), algorithm, ids)?
            }
            None => return bad(format!("{cpath}.parameterSpec is required.")),
        }
    }
    Ok(())
}

/// The parent condition matches the parent's kind and names values the parent has.
fn validate_condition(
    parent: &ParameterSpec,
    cond: &ConditionalParameterSpec,
    path: &str,
) -> Result {
    let set = [
        cond.parent_discrete_values.is_some(),
        cond.parent_int_values.is_some(),
        cond.parent_categorical_values.is_some(),
    ];
    if set.iter().filter(|&&s| s).count() != 1 {
        return bad(format!(
            "{path} must set exactly one of parentDiscreteValues, parentIntValues and \
             parentCategoricalValues."
        ));
    }
    if let Some(c) = &cond.parent_discrete_values {
        let p = format!("{path}.parentDiscreteValues");
        let Some(spec) = &parent.discrete_value_spec else {
            return bad(format!("{p} needs a parent with a discreteValueSpec."));
        };
        if c.values.is_empty() {
            return bad(format!("{p}.values must not be empty."));
        }
        for (k, v) in c.values.iter().enumerate() {
            if !spec.values.contains(v) {
                return bad(format!(
                    "{p}.values[{k}] ({v}) is not a value of the parent parameter."
                ));
            }
        }
    }
    if let Some(c) = &cond.parent_int_values {
        let p = format!("{path}.parentIntValues");
        let Some(spec) = &parent.integer_value_spec else {
            return bad(format!("{p} needs a parent with an integerValueSpec."));
        };
        if c.values.is_empty() {
            return bad(format!("{p}.values must not be empty."));
        }
        for (k, v) in c.values.iter().enumerate() {
            if !(spec.min_value..=spec.max_value).contains(v) {
                return bad(format!(
                    "{p}.values[{k}] ({v}) is not a value of the parent parameter ({}..={}).",
                    spec.min_value, spec.max_value
                ));
            }
        }
    }
    if let Some(c) = &cond.parent_categorical_values {
        let p = format!("{path}.parentCategoricalValues");
        let Some(spec) = &parent.categorical_value_spec else {
            return bad(format!("{p} needs a parent with a categoricalValueSpec."));
        };
        if c.values.is_empty() {
            return bad(format!("{p}.values must not be empty."));
        }
        for (k, v) in c.values.iter().enumerate() {
            if !spec.values.contains(v) {
                return bad(format!(
                    "{p}.values[{k}] {v:?} is not a value of the parent parameter."
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{parse_custom_job, parse_hyperparameter_tuning_job};

    const MACHINE: &str = r#""machineSpec": {"machineType": "n1-standard-4"}, "replicaCount": "1""#;

    fn container(image: &str) -> String {
        let image = serde_json::to_string(image).unwrap();
        format!(r#"{{{MACHINE}, "containerSpec": {{"imageUri": {image}}}}}"#)
    }

    fn python(image: &str) -> String {
        let image = serde_json::to_string(image).unwrap();
        format!(
            r#"{{{MACHINE}, "pythonPackageSpec": {{"executorImageUri": {image},
              "packageUris": ["gs://b/p.tar.gz"], "pythonModule": "t.task"}}}}"#
        )
    }

    fn custom_job(pools: &[String]) -> Result {
        let doc = format!(
            r#"{{"displayName": "t", "jobSpec": {{"workerPoolSpecs": [{}]}}}}"#,
            pools.join(",")
        );
        validate_custom_job(&parse_custom_job(doc.as_bytes()).expect("parses"))
    }

    fn tuning_job(pool: &str) -> Result {
        let doc = format!(
            r#"{{"displayName": "hp",
              "studySpec": {{"metrics": [{{"metricId": "loss", "goal": "MINIMIZE"}}],
                "parameters": [{{"parameterId": "n", "integerValueSpec": {{"minValue": 1, "maxValue": 4}}}}]}},
              "maxTrialCount": 4, "parallelTrialCount": 2,
              "trialJobSpec": {{"workerPoolSpecs": [{pool}]}}}}"#
        );
        validate_hyperparameter_tuning_job(
            &parse_hyperparameter_tuning_job(doc.as_bytes()).expect("parses"),
        )
    }

    fn message(result: Result) -> String {
        let err = result.expect_err("must be rejected");
        assert_eq!(err.code, crate::Code::InvalidArgument);
        err.message
    }

    #[test]
    fn image_references_are_checked_at_every_place() {
        let digest = format!("sha256:{}", "ab".repeat(32));
        for good in [
            "python:3.11".to_string(),
            "us-docker.pkg.dev/vertex-ai/training/tf-cpu.2-17.py310:latest".into(),
            format!("gcr.io/my-project/trainer@{digest}"),
            "localhost/trainyard/python:test".into(),
            "localhost:5000/a/b".into(),
            "i".into(),
            "x".into(),
            "busybox".into(),
        ] {
            custom_job(&[container(&good)]).unwrap_or_else(|e| panic!("{good}: {e}"));
            custom_job(&[python(&good)]).unwrap_or_else(|e| panic!("{good}: {e}"));
            tuning_job(&container(&good)).unwrap_or_else(|e| panic!("{good}: {e}"));
            tuning_job(&python(&good)).unwrap_or_else(|e| panic!("{good}: {e}"));
        }
        let ok = container("python:3.11");
        for bad in [
            "Foo",
            "Foo Bar",
            "a b",
            "docker://x",
            "x:",
            "x:-bad",
            "/x",
            "x/",
            "x//y",
            "x@sha256:zz",
        ] {
            let not_valid = format!("{bad:?} is not a valid image reference: ");
            for (result, path) in [
                (
                    custom_job(&[container(bad)]),
                    "jobSpec.workerPoolSpecs[0].containerSpec.imageUri",
                ),
                (
                    custom_job(&[ok.clone(), container(bad)]),
                    "jobSpec.workerPoolSpecs[1].containerSpec.imageUri",
                ),
                (
                    custom_job(&[python(bad)]),
                    "jobSpec.workerPoolSpecs[0].pythonPackageSpec.executorImageUri",
                ),
                (
                    tuning_job(&container(bad)),
                    "trialJobSpec.workerPoolSpecs[0].containerSpec.imageUri",
                ),
                (
                    tuning_job(&python(bad)),
                    "trialJobSpec.workerPoolSpecs[0].pythonPackageSpec.executorImageUri",
                ),
            ] {
                let m = message(result);
                assert!(m.starts_with(&format!("{path} {not_valid}")), "{m}");
                assert!(m.ends_with('.'), "{m}");
            }
        }
        assert_eq!(
            message(custom_job(&[container("docker://x")])),
            "jobSpec.workerPoolSpecs[0].containerSpec.imageUri \"docker://x\" is not a valid \
             image reference: it starts with a URL scheme (\"docker://\"); an image reference \
             has none, e.g. \"gcr.io/project/image:tag\"."
        );
    }

    #[test]
    fn empty_and_nul_images_keep_their_own_messages() {
        assert_eq!(
            message(custom_job(&[container("")])),
            "jobSpec.workerPoolSpecs[0].containerSpec.imageUri is required."
        );
        assert_eq!(
            message(custom_job(&[container("x\0")])),
            "jobSpec.workerPoolSpecs[0].containerSpec.imageUri must not contain a NUL character."
        );
        assert_eq!(
            message(custom_job(&[python("x\0")])),
            "jobSpec.workerPoolSpecs[0].pythonPackageSpec.executorImageUri must not contain \
             a NUL character."
        );
    }
}
