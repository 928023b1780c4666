//! From a validated CustomJob to what the lifecycle and the scheduler need: replica
//! counts, quota demand, per-replica resources, the resolved scheduling policy; and from a
//! replica of a job to the program it runs and its environment (L8, L14).

use std::path::{Component, Path, PathBuf};

use trainyard_api::{ApiError, CustomJob, Strategy};
use trainyard_core::catalog::{accelerator_metric, Catalog, CPU_METRIC};
use trainyard_core::job::{Demand, Policy, ReplicaDemand, SECOND};
use trainyard_core::schedule::{Fleet, Quotas};
use trainyard_core::Settings;

/// What the lifecycle needs of a new job.
#[derive(Clone, Debug)]
pub struct Prepared {
    pub pools: Vec<u32>,
    pub demand: Demand,
    pub policy: Policy,
    /// The job has AIP_CHECKPOINT_DIR (L21).
    pub checkpoints: bool,
}

fn accelerator_of(job: &CustomJob, pool: usize) -> Option<(String, u32)> {
    let ms = job.job_spec.worker_pool_specs[pool].machine_spec.as_ref()?;
    if ms.accelerator_count > 0 && ms.accelerator_type != trainyard_api::AcceleratorType::Unspecified {
        Some((ms.accelerator_type.name().to_string(), ms.accelerator_count as u32))
    } else {
        None
    }
}

fn micros(d: &trainyard_api::Duration) -> i64 {
    d.seconds.saturating_mul(SECOND).saturating_add(d.nanos as i64 / 1000)
}

/// Check a validated job against the catalog, the fleet (L15: what the region does not
/// offer at all is refused) and the quota limits (L4), and derive its demand and policy.
pub fn prepare(
    job: &CustomJob,
    catalog: &Catalog,
    settings: &Settings,
    fleet: &Fleet,
    quotas: &Quotas,
    project: &str,
) -> Result<Prepared, ApiError> {
    let mut pools = Vec::new();
    let mut demand = Demand::default();
    for (i, pool) in job.job_spec.worker_pool_specs.iter().enumerate() {
        let Some(ms) = &pool.machine_spec else {
            pools.push(0);
            continue;
        };
        if pool.replica_count <= 0 {
            pools.push(0);
            continue;
        }
        let path = format!("jobSpec.workerPoolSpecs[{i}].machineSpec");
        let accel = accelerator_of(job, i);
        let mt = catalog
            .check(&ms.machine_type, accel.as_ref().map(|(a, c)| (a.as_str(), *c)))
            .map_err(|e| {
                let field = match e {
                    trainyard_core::catalog::CatalogError::UnknownMachineType(_) => "machineType",
                    trainyard_core::catalog::CatalogError::CountNotAllowed { .. } => "acceleratorCount",
                    _ => "acceleratorType",
                };
                ApiError::invalid_argument(format!("{path}.{field}: {e}"))
            })?;
        let count = pool.replica_count as u32;
        pools.push(count);
        let rd = ReplicaDemand { cpus: mt.vcpus, memory_bytes: mt.memory_bytes, accelerator: accel.clone() };
        if !fleet.overcommit {
            // L15: what no node of the region could ever hold is refused at create.
            let fits_somewhere = fleet.nodes.iter().any(|n| {
                n.cpus >= rd.cpus
                    && n.memory_bytes >= rd.memory_bytes
                    && rd.accelerator.as_ref().is_none_or(|(a, c)| n.accelerators.get(a).copied().unwrap_or(0) >= *c)
            });
            if !fits_somewhere {
                return Err(ApiError::invalid_argument(format!(
                    "{path}: machineType \"{}\"{} is not offered in this region: no node has {} vCPUs, {} GiB of memory{}",
                    ms.machine_type,
                    accel.as_ref().map(|(a, c)| format!(" with {c} x {a}")).unwrap_or_default(),
                    rd.cpus,
                    rd.memory_bytes / trainyard_core::catalog::GIB,
                    accel.as_ref().map(|(a, c)| format!(" and {c} x {a}")).unwrap_or_default(),
                )));
            }
        }
        *demand.metrics.entry(CPU_METRIC.to_string()).or_insert(0) += mt.vcpus as u64 * count as u64;
        if let Some((a, c)) = &accel {
            *demand.metrics.entry(accelerator_metric(a)).or_insert(0) += *c as u64 * count as u64;
        }
        demand.replicas.extend(std::iter::repeat_n(rd, count as usize));
    }
    // L4: a request above the limit could never run.
    let exceeded = quotas.exceeded_by(project, &demand.metrics);
    if !exceeded.is_empty() {
        return Err(ApiError::resource_exhausted(format!(
            "The following quota metrics exceed quota limits: {}",
            exceeded.join(", ")
        )));
    }
    let mut policy = Policy::defaults(settings);
    if let Some(s) = &job.job_spec.scheduling {
        if let Some(t) = &s.timeout {
            policy.timeout = micros(t);
        }
        policy.restart_job_on_worker_restart = s.restart_job_on_worker_restart;
        policy.disable_retries = s.disable_retries;
        policy.flex_start = s.strategy == Strategy::FlexStart;
        policy.spot = s.strategy == Strategy::Spot;
        if let Some(w) = &s.max_wait_duration {
            policy.max_wait = micros(w);
        }
    }
    Ok(Prepared { pools, demand, policy, checkpoints: job.job_spec.base_output_directory.is_some() })
}

/// Map an output URI to a local directory: `gs://bucket/x` → `<storage_root>/bucket/x`;
/// `file:///abs` and `/abs` as they are, if under one of `roots`. Errors name the field.
pub fn resolve_output_dir(uri: &str, storage_root: &Path, roots: &[PathBuf], field: &str) -> Result<PathBuf, ApiError> {
    let bad = |why: &str| ApiError::invalid_argument(format!("{field}: \"{uri}\" {why}"));
    let path = if let Some(rest) = uri.strip_prefix("gs://") {
        if rest.is_empty() || rest.starts_with('/') {
            return Err(bad("has no bucket name"));
        }
        storage_root.join(rest)
    } else if let Some(rest) = uri.strip_prefix("file://") {
        PathBuf::from(rest)
    } else {
        PathBuf::from(uri)
    };
    if !path.is_absolute() {
        return Err(bad("must be a gs:// URI, a file:// URI or an absolute path"));
    }
    if path.components().any(|c| matches!(c, Component::ParentDir)) {
        return Err(bad("must not contain \"..\""));
    }
    let inside = std::iter::once(storage_root).chain(roots.iter().map(PathBuf::as_path)).any(|r| path.starts_with(r));
    if !inside {
        return Err(bad(&format!(
            "is outside the output roots this server may write ({})",
            std::iter::once(storage_root)
                .chain(roots.iter().map(PathBuf::as_path))
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_dirs_map_and_refuse_escapes() {
        let root = Path::new("/data/storage");
        let roots = vec![PathBuf::from("/tmp")];
        let f = "jobSpec.baseOutputDirectory.outputUriPrefix";
        assert_eq!(resolve_output_dir("gs://b/x/y", root, &roots, f).unwrap(), PathBuf::from("/data/storage/b/x/y"));
        assert_eq!(resolve_output_dir("file:///tmp/o", root, &roots, f).unwrap(), PathBuf::from("/tmp/o"));
        assert_eq!(resolve_output_dir("/tmp/o", root, &roots, f).unwrap(), PathBuf::from("/tmp/o"));
        for bad in ["gs://b/../../etc", "/etc/passwd", "relative/dir", "gs://", "file:///tmp/../etc"] {
            let e = resolve_output_dir(bad, root, &roots, f).unwrap_err();
            assert!(e.message.contains(f), "{bad}: {}", e.message);
        }
    }
}
