//! The machine-type catalog: vCPUs, memory, allowed accelerators, the memory reserved
//! for system agents (L14), and the quota metrics a replica counts against (L3-L5).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub const GIB: u64 = 1024 * 1024 * 1024;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MachineType {
    pub name: String,
    pub vcpus: u32,
    /// Total memory in bytes.
    pub memory_bytes: u64,
    /// Accelerator type (wire name) → the counts allowed with this machine type.
    /// Machine types with built-in GPUs (a2, a3, g2) allow exactly their own count.
    #[serde(default)]
    pub accelerators: BTreeMap<String, Vec<u32>>,
    /// True when the machine type must be used with one of its accelerators.
    #[serde(default)]
    pub accelerator_required: bool,
}

/// One tier of the reserved-memory table: `fraction` of the memory between the previous
/// tier's bound and `up_to_bytes` is reserved for system agents.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReservedTier {
    pub up_to_bytes: u64,
    pub fraction: f64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Catalog {
    pub machine_types: BTreeMap<String, MachineType>,
    /// L14: reserved share by memory tier (up to 40% on the smallest machine types).
    pub reserved: Vec<ReservedTier>,
}

/// The candidate `name` is most likely a typo of: the nearest by edit distance (letters
/// swapped count once), if it is within a third of the name's length and nearer than any
/// other candidate.
pub fn closest<'c>(name: &str, candidates: impl Iterator<Item = &'c str>) -> Option<&'c str> {
    let bound = (name.chars().count() / 3).max(1);
    let mut best: Option<(usize, &str, bool)> = None;
    for c in candidates {
        let d = edit_distance(name, c);
        if d > bound {
            continue;
        }
        best = match best {
            Some((bd, bc, _)) if d > bd => Some((bd, bc, false)),
            Some((bd, bc, _)) if d == bd => Some((bd, bc, true)),
            _ => Some((d, c, false)),
        };
    }
    best.filter(|(_, _, tied)| !tied).map(|(_, c, _)| c)
}

/// The optimal string alignment distance: insertions, deletions, substitutions and
/// swaps of two neighbours, each counting one.
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut v = (d[i - 1][j] + 1).min(d[i][j - 1] + 1).min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                v = v.min(d[i - 2][j - 2] + 1);
            }
            d[i][j] = v;
        }
    }
    d[a.len()][b.len()]
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CatalogError {
    /// The name, and a hint: the offered name it is most likely a typo of, if any.
    #[error("machineType \"{0}\" is not offered in this region{1}")]
    UnknownMachineType(String, String),
    #[error("acceleratorType {accelerator} is not offered with machineType \"{machine}\"")]
    AcceleratorNotOffered { machine: String, accelerator: String },
    #[error("acceleratorCount {count} is not allowed for {accelerator} on machineType \"{machine}\"; allowed: {allowed:?}")]
    CountNotAllowed { machine: String, accelerator: String, count: u32, allowed: Vec<u32> },
    #[error("machineType \"{0}\" needs its accelerator: set acceleratorType and acceleratorCount")]
    AcceleratorRequired(String),
}

const T4: &str = "NVIDIA_TESLA_T4";
const V100: &str = "NVIDIA_TESLA_V100";
const P100: &str = "NVIDIA_TESLA_P100";
const P4: &str = "NVIDIA_TESLA_P4";
const A100: &str = "NVIDIA_TESLA_A100";
const A100_80: &str = "NVIDIA_A100_80GB";
const L4: &str = "NVIDIA_L4";
const H100: &str = "NVIDIA_H100_80GB";

fn mt(name: &str, vcpus: u32, memory_gb: f64) -> MachineType {
    MachineType {
        name: name.to_string(),
        vcpus,
        memory_bytes: (memory_gb * GIB as f64) as u64,
        accelerators: BTreeMap::new(),
        accelerator_required: false,
    }
}

fn with_gpus(mut m: MachineType, accelerator: &str, count: u32) -> MachineType {
    m.accelerators.insert(accelerator.to_string(), vec![count]);
    m.accelerator_required = true;
    m
}

impl Catalog {
    /// The built-in catalog: n1-standard, n1-highmem, e2-standard, a2-highgpu,
    /// a2-ultragpu, a3-highgpu and g2-standard, with the managed service's figures.
    pub fn builtin() -> Catalog {
        let mut v = Vec::new();
        let n1_gpus = |m: &mut MachineType| {
            for (a, counts) in [(T4, vec![1, 2, 4]), (V100, vec![1, 2, 4, 8]), (P100, vec![1, 2, 4]), (P4, vec![1, 2, 4])] {
                m.accelerators.insert(a.to_string(), counts);
            }
        };
        for n in [1u32, 2, 4, 8, 16, 32, 64, 96] {
            let mut m = mt(&format!("n1-standard-{n}"), n, 3.75 * n as f64);
            n1_gpus(&mut m);
            v.push(m);
        }
        for n in [2u32, 4, 8, 16, 32, 64, 96] {
            let mut m = mt(&format!("n1-highmem-{n}"), n, 6.5 * n as f64);
            n1_gpus(&mut m);
            v.push(m);
        }
        for n in [2u32, 4, 8, 16, 32] {
            v.push(mt(&format!("e2-standard-{n}"), n, 4.0 * n as f64));
        }
        for (g, cpus, mem) in [(1u32, 12u32, 85.0), (2, 24, 170.0), (4, 48, 340.0), (8, 96, 680.0)] {
            v.push(with_gpus(mt(&format!("a2-highgpu-{g}g"), cpus, mem), A100, g));
        }
        v.push(with_gpus(mt("a2-megagpu-16g", 96, 1360.0), A100, 16));
        for (g, cpus, mem) in [(1u32, 12u32, 170.0), (2, 24, 340.0), (4, 48, 680.0), (8, 96, 1360.0)] {
            v.push(with_gpus(mt(&format!("a2-ultragpu-{g}g"), cpus, mem), A100_80, g));
        }
        v.push(with_gpus(mt("a3-highgpu-8g", 208, 1872.0), H100, 8));
        for (n, gpus, mem) in [
            (4u32, 1u32, 16.0),
            (8, 1, 32.0),
            (12, 1, 48.0),
            (16, 1, 64.0),
            (24, 2, 96.0),
            (32, 1, 128.0),
            (48, 4, 192.0),
            (96, 8, 384.0),
        ] {
            v.push(with_gpus(mt(&format!("g2-standard-{n}"), n, mem), L4, gpus));
        }
        Catalog {
            machine_types: v.into_iter().map(|m| (m.name.clone(), m)).collect(),
            reserved: vec![
                ReservedTier { up_to_bytes: 4 * GIB, fraction: 0.40 },
                ReservedTier { up_to_bytes: 8 * GIB, fraction: 0.20 },
                ReservedTier { up_to_bytes: 16 * GIB, fraction: 0.10 },
                ReservedTier { up_to_bytes: 128 * GIB, fraction: 0.06 },
                ReservedTier { up_to_bytes: u64::MAX, fraction: 0.02 },
            ],
        }
    }

    pub fn get(&self, name: &str) -> Option<&MachineType> {
        self.machine_types.get(name)
    }

    /// Check a machine type and its accelerators against the catalog. `accelerator` is
    /// the wire name and count, None when the request sets no accelerator.
    pub fn check(&self, machine: &str, accelerator: Option<(&str, u32)>) -> Result<&MachineType, CatalogError> {
        let m = self.get(machine).ok_or_else(|| {
            let hint = closest(machine, self.machine_types.keys().map(String::as_str)).map(|c| format!(" (did you mean \"{c}\"?)")).unwrap_or_default();
            CatalogError::UnknownMachineType(machine.to_string(), hint)
        })?;
        match accelerator {
            None if m.accelerator_required => Err(CatalogError::AcceleratorRequired(machine.to_string())),
            None => Ok(m),
            Some((a, count)) => {
                let allowed = m.accelerators.get(a).ok_or_else(|| CatalogError::AcceleratorNotOffered {
                    machine: machine.to_string(),
                    accelerator: a.to_string(),
                })?;
                if allowed.contains(&count) {
                    Ok(m)
                } else {
                    Err(CatalogError::CountNotAllowed {
                        machine: machine.to_string(),
                        accelerator: a.to_string(),
                        count,
                        allowed: allowed.clone(),
                    })
                }
            }
        }
    }

    /// L14: the memory a replica of this machine type may use: its memory minus the
    /// share reserved for system agents.
    pub fn allocatable_memory(&self, m: &MachineType) -> u64 {
        let mut reserved = 0f64;
        let mut lower = 0u64;
        for tier in &self.reserved {
            if m.memory_bytes <= lower {
                break;
            }
            let upper = tier.up_to_bytes.min(m.memory_bytes);
            reserved += (upper - lower) as f64 * tier.fraction;
            lower = tier.up_to_bytes;
        }
        m.memory_bytes.saturating_sub(reserved as u64)
    }
}

/// The managed service's quota metric for CPUs.
pub const CPU_METRIC: &str = "custom_model_training_cpus";

/// The quota metric of an accelerator type, as the managed service names it
/// (`NVIDIA_TESLA_A100` → `custom_model_training_nvidia_a100_gpus`).
pub fn accelerator_metric(accelerator: &str) -> String {
    let short = match accelerator {
        "NVIDIA_A100_80GB" => "nvidia_a100_80gb".to_string(),
        "NVIDIA_H100_80GB" => "nvidia_h100".to_string(),
        "NVIDIA_H100_MEGA_80GB" => "nvidia_h100_mega".to_string(),
        "NVIDIA_H200_141GB" => "nvidia_h200".to_string(),
        a if a.starts_with("TPU_") => return format!("custom_model_training_{}_cores", a.to_ascii_lowercase()),
        a => a.to_ascii_lowercase().replace("_tesla", ""),
    };
    format!("custom_model_training_{short}_gpus")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn l14_reserved_share_is_larger_on_small_machines() {
        let c = Catalog::builtin();
        let share = |name: &str| {
            let m = c.get(name).unwrap();
            1.0 - c.allocatable_memory(m) as f64 / m.memory_bytes as f64
        };
        assert!((share("n1-standard-1") - 0.40).abs() < 1e-6, "{}", share("n1-standard-1"));
        assert!(share("n1-standard-4") < 0.40 && share("n1-standard-4") > 0.15);
        assert!(share("a2-highgpu-1g") < share("n1-standard-4"));
        assert!(share("a3-highgpu-8g") < 0.05);
    }

    #[test]
    fn catalog_checks_accelerators() {
        let c = Catalog::builtin();
        assert!(c.check("n1-standard-4", None).is_ok());
        assert!(c.check("n1-standard-4", Some(("NVIDIA_TESLA_T4", 2))).is_ok());
        assert!(matches!(c.check("n1-standard-4", Some(("NVIDIA_TESLA_T4", 3))), Err(CatalogError::CountNotAllowed { .. })));
        assert!(matches!(c.check("e2-standard-4", Some(("NVIDIA_TESLA_T4", 1))), Err(CatalogError::AcceleratorNotOffered { .. })));
        assert!(matches!(c.check("a2-highgpu-1g", None), Err(CatalogError::AcceleratorRequired(_))));
        assert!(c.check("a2-highgpu-1g", Some(("NVIDIA_TESLA_A100", 1))).is_ok());
        assert!(matches!(c.check("n9-giant", None), Err(CatalogError::UnknownMachineType(_, _))));
        let typo = c.check("n1-standrad-4", None).unwrap_err().to_string();
        assert!(typo.ends_with("(did you mean \"n1-standard-4\"?)"), "{typo}");
        assert!(!c.check("n9-giant", None).unwrap_err().to_string().contains("did you mean"), "no guess far from every name");
        assert_eq!(c.get("g2-standard-24").unwrap().accelerators["NVIDIA_L4"], vec![2]);
    }

    #[test]
    fn metric_names_follow_the_managed_service() {
        assert_eq!(accelerator_metric("NVIDIA_TESLA_A100"), "custom_model_training_nvidia_a100_gpus");
        assert_eq!(accelerator_metric("NVIDIA_TESLA_T4"), "custom_model_training_nvidia_t4_gpus");
        assert_eq!(accelerator_metric("NVIDIA_L4"), "custom_model_training_nvidia_l4_gpus");
        assert_eq!(accelerator_metric("NVIDIA_A100_80GB"), "custom_model_training_nvidia_a100_80gb_gpus");
    }
}
