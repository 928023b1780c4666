//! GPUs of a node: what `nvidia-smi` reports (devices and their interconnect matrix), the
//! API's accelerator type of each model, and which free devices a replica gets.
//!
//! The choice ([`choose`]) is a pure function: the devices asked for, never a device
//! twice, never one in use; a set whose devices are close (NVLink, then the same PCIe
//! switch, host bridge, NUMA node) when one is free; and, among equally close sets, the
//! one that leaves the free devices best connected, so that small replicas pack onto
//! devices whose neighbours are already taken and a later large replica still finds a
//! close set.

use std::collections::{BTreeMap, HashSet};

use serde::{Deserialize, Serialize};

use crate::job::Job;
use crate::step::{Effect, LogLine};

/// One GPU as `nvidia-smi --query-gpu=index,uuid,name,memory.total,pci.bus_id` reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Gpu {
    pub index: u32,
    pub uuid: String,
    /// The model, e.g. `NVIDIA A100-SXM4-40GB`.
    pub name: String,
    /// The API's accelerator type (`NVIDIA_TESLA_A100`), or the model's own name when the
    /// API has none for it.
    pub accelerator: String,
    pub memory_mib: u64,
    pub pci_bus_id: String,
}

/// How two GPUs are connected, closest first (the legend of `nvidia-smi topo -m`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Link {
    /// NVLink with this many links (`NV4`): more links are closer.
    NvLink(u8),
    /// One PCIe switch (`PIX`).
    Pix,
    /// Several PCIe switches, no host bridge (`PXB`).
    Pxb,
    /// A PCIe host bridge (`PHB`).
    Phb,
    /// Host bridges within one NUMA node (`NODE`).
    Node,
    /// Across NUMA nodes (`SYS`, or anything unknown).
    Sys,
}

impl Link {
    /// Distance for the choice: 0 for the best NVLink, larger is farther.
    pub fn distance(self) -> u32 {
        match self {
            Link::NvLink(n) => 18u32.saturating_sub(n.min(18) as u32),
            Link::Pix => 20,
            Link::Pxb => 30,
            Link::Phb => 40,
            Link::Node => 50,
            Link::Sys => 60,
        }
    }

    fn parse(cell: &str) -> Option<Link> {
        match cell {
            "PIX" => Some(Link::Pix),
            "PXB" => Some(Link::Pxb),
            "PHB" => Some(Link::Phb),
            "NODE" => Some(Link::Node),
            "SYS" | "SOC" => Some(Link::Sys),
            s => s.strip_prefix("NV").and_then(|n| n.parse().ok()).map(Link::NvLink),
        }
    }

    pub fn text(self) -> String {
        match self {
            Link::NvLink(n) => format!("NV{n}"),
            Link::Pix => "PIX".into(),
            Link::Pxb => "PXB".into(),
            Link::Phb => "PHB".into(),
            Link::Node => "NODE".into(),
            Link::Sys => "SYS".into(),
        }
    }
}

/// A node's GPUs and the links between them (`links[i][j]`, by position in `gpus`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Inventory {
    pub gpus: Vec<Gpu>,
    /// Missing or partial: every pair not in it is `Sys`.
    #[serde(default)]
    pub links: Vec<Vec<Link>>,
}

impl Inventory {
    pub fn link(&self, a: usize, b: usize) -> Link {
        self.links.get(a).and_then(|r| r.get(b)).copied().unwrap_or(Link::Sys)
    }

    /// How many GPUs of each accelerator type.
    pub fn counts(&self) -> BTreeMap<String, u32> {
        let mut m = BTreeMap::new();
        for g in &self.gpus {
            *m.entry(g.accelerator.clone()).or_insert(0) += 1;
        }
        m
    }

    /// Only the GPUs whose UUIDs are listed (in the inventory's order), with their links.
    pub fn restricted_to(&self, uuids: &[String]) -> Inventory {
        let keep: Vec<usize> = (0..self.gpus.len()).filter(|&i| uuids.contains(&self.gpus[i].uuid)).collect();
        Inventory {
            gpus: keep.iter().map(|&i| self.gpus[i].clone()).collect(),
            links: keep.iter().map(|&a| keep.iter().map(|&b| self.link(a, b)).collect()).collect(),
        }
    }
}

/// The API's accelerator type of an NVIDIA model name; `None` for a model it has none for.
pub fn accelerator_type(model: &str) -> Option<&'static str> {
    let m = model.to_ascii_uppercase();
    let has = |s: &str| m.contains(s);
    Some(if has("H200") {
        "NVIDIA_H200_141GB"
    } else if has("H100") {
        if has("MEGA") {
            "NVIDIA_H100_MEGA_80GB"
        } else {
            "NVIDIA_H100_80GB"
        }
    } else if has("A100") {
        if has("80GB") {
            "NVIDIA_A100_80GB"
        } else {
            "NVIDIA_TESLA_A100"
        }
    } else if has(" L4") || m.ends_with("L4") {
        "NVIDIA_L4"
    } else if has("T4") {
        "NVIDIA_TESLA_T4"
    } else if has("V100") {
        "NVIDIA_TESLA_V100"
    } else if has("P100") {
        "NVIDIA_TESLA_P100"
    } else if has("P4") {
        "NVIDIA_TESLA_P4"
    } else {
        return None;
    })
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ParseError {
    #[error("line {line} of nvidia-smi's device list: {why}: {text:?}")]
    Device { line: usize, why: String, text: String },
    #[error("nvidia-smi topo -m: {0}")]
    Topology(String),
}

/// Parses `nvidia-smi --query-gpu=index,uuid,name,memory.total,pci.bus_id
/// --format=csv,noheader,nounits`.
pub fn parse_devices(text: &str) -> Result<Vec<Gpu>, ParseError> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let bad = |why: &str| ParseError::Device { line: i + 1, why: why.into(), text: line.to_string() };
        let f: Vec<&str> = line.split(',').map(str::trim).collect();
        let [index, uuid, name, memory, bus] = f.as_slice() else { return Err(bad("expected 5 fields")) };
        let index = index.parse().map_err(|_| bad("the index is not a number"))?;
        if !uuid.starts_with("GPU-") && !uuid.starts_with("MIG-") {
            return Err(bad("the UUID does not start with GPU-"));
        }
        let memory_mib = memory.parse().unwrap_or(0);
        let accelerator = accelerator_type(name).map(str::to_string).unwrap_or_else(|| name.to_string());
        out.push(Gpu { index, uuid: uuid.to_string(), name: name.to_string(), accelerator, memory_mib, pci_bus_id: bus.to_string() });
    }
    Ok(out)
}

/// Parses the GPU-to-GPU part of `nvidia-smi topo -m` for `gpus` (by their index): the
/// header names the columns (`GPU0 GPU1 ... CPU Affinity ...`), each `GPUi` row gives
/// `X` on the diagonal and a link elsewhere. Rows and columns of GPUs not in `gpus` are
/// ignored (a restricted set); pairs the matrix does not give are `Sys`.
pub fn parse_topology(text: &str, gpus: &[Gpu]) -> Result<Vec<Vec<Link>>, ParseError> {
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let header = lines.next().ok_or_else(|| ParseError::Topology("empty output".into()))?;
    let columns: Vec<Option<u32>> =
        header.split_whitespace().map(|c| c.strip_prefix("GPU").and_then(|n| n.parse().ok())).collect();
    let pos = |index: u32| gpus.iter().position(|g| g.index == index);
    let mut links = vec![vec![Link::Sys; gpus.len()]; gpus.len()];
    for line in lines {
        let mut cells = line.split_whitespace();
        let Some(row) = cells.next().and_then(|c| c.strip_prefix("GPU")).and_then(|n| n.parse::<u32>().ok()) else { continue };
        let Some(a) = pos(row) else { continue };
        for (col, cell) in columns.iter().zip(cells) {
            let Some(b) = col.and_then(pos) else { continue };
            if a == b {
                continue;
            }
            match Link::parse(cell) {
                Some(l) => links[a][b] = l,
                None if cell == "X" => {}
                None => return Err(ParseError::Topology(format!("unknown link {cell:?} between GPU{row} and GPU{}", gpus[b].index))),
            }
        }
    }
    Ok(links)
}

/// Above this many candidate sets the choice is greedy instead of exhaustive.
const EXHAUSTIVE_LIMIT: u64 = 20_000;

/// The devices (positions in `inv.gpus`) a replica asking for `count` GPUs of type
/// `accelerator` gets, from those not `used`; `None` when fewer are free. The best set:
/// the closest (largest link distance within it, then the sum), then the one that takes
/// least connectivity from the devices left free (packing).
pub fn choose(inv: &Inventory, used: &[bool], accelerator: &str, count: usize) -> Option<Vec<usize>> {
    let free: Vec<usize> =
        (0..inv.gpus.len()).filter(|&i| !used.get(i).copied().unwrap_or(false) && inv.gpus[i].accelerator == accelerator).collect();
    if count == 0 {
        return Some(Vec::new());
    }
    if free.len() < count {
        return None;
    }
    let cost = |set: &[usize]| -> (u32, u32, u32) {
        let mut max = 0;
        let mut sum = 0;
        for (k, &a) in set.iter().enumerate() {
            for &b in &set[k + 1..] {
                let d = inv.link(a, b).distance();
                max = max.max(d);
                sum += d;
            }
        }
        // What the set takes from the devices left free: their closeness to it.
        let taken: u32 = set
            .iter()
            .flat_map(|&a| free.iter().filter(move |f| !set.contains(f)).map(move |&f| 60 - inv.link(a, f).distance().min(60)))
            .sum();
        (max, sum, taken)
    };
    if combinations(free.len() as u64, count as u64) <= EXHAUSTIVE_LIMIT {
        let mut best: Option<((u32, u32, u32), Vec<usize>)> = None;
        let mut idx: Vec<usize> = (0..count).collect();
        loop {
            let set: Vec<usize> = idx.iter().map(|&i| free[i]).collect();
            let c = cost(&set);
            if best.as_ref().is_none_or(|(b, _)| c < *b) {
                best = Some((c, set));
            }
            // Next combination in lexicographic order.
            let mut k = count;
            loop {
                if k == 0 {
                    return best.map(|(_, s)| s);
                }
                k -= 1;
                if idx[k] < free.len() - count + k {
                    idx[k] += 1;
                    for j in k + 1..count {
                        idx[j] = idx[j - 1] + 1;
                    }
                    break;
                }
            }
        }
    }
    // Greedy: from each free device, add the closest until `count`; the best result.
    free.iter()
        .map(|&start| {
            let mut set = vec![start];
            while set.len() < count {
                let next = free
                    .iter()
                    .filter(|f| !set.contains(f))
                    .min_by_key(|&&f| set.iter().map(|&s| inv.link(s, f).distance()).max().unwrap_or(0))
                    .copied();
                match next {
                    Some(n) => set.push(n),
                    None => break,
                }
            }
            set.sort_unstable();
            (cost(&set), set)
        })
        .filter(|(_, s)| s.len() == count)
        .min()
        .map(|(_, s)| s)
}

fn combinations(n: u64, k: u64) -> u64 {
    let k = k.min(n - k.min(n));
    (0..k).fold(1u64, |acc, i| acc.saturating_mul(n - i) / (i + 1))
}

/// Which devices each replica that `effects` launch gets, on a node with an inventory
/// (part of the transition's decision, committed with the launch, L23): a replica that
/// keeps its node keeps its devices while they are free (a restart, L10, L11); one on a
/// new node (L9), or whose devices are taken, gets a free set by [`choose`]. Said in the
/// job's log. `held(node)`: the devices other jobs' live replicas hold there (and those
/// gone from `nvidia-smi`). None free (the scheduler counted them free: only a replica
/// still stopping can hold one) leaves the replica without devices, and its launch fails
/// (L16) and is retried.
pub fn assign_devices(job: &mut Job, effects: &mut Vec<Effect>, inventories: &BTreeMap<String, Inventory>, held: impl Fn(&str) -> HashSet<String>) {
    let launched: Vec<(String, String)> = effects
        .iter()
        .filter_map(|e| match e {
            Effect::Launch { run, node } => Some((run.replica.clone(), node.clone())),
            _ => None,
        })
        .collect();
    for (replica, node) in launched {
        let Some(inv) = inventories.get(&node) else { continue };
        let Some(idx) = job.replicas.iter().position(|r| r.name == replica) else { continue };
        let Some((accelerator, count)) = job.demand.replicas.get(idx).and_then(|d| d.accelerator.clone()) else {
            continue;
        };
        let mut taken = held(&node);
        for (i, r) in job.replicas.iter().enumerate() {
            if i != idx && r.state.is_live() && r.node.as_deref() == Some(node.as_str()) {
                taken.extend(r.devices.iter().cloned());
            }
        }
        let r = &job.replicas[idx];
        let keep = r.devices.len() == count as usize
            && r.devices.iter().all(|d| inv.gpus.iter().any(|g| &g.uuid == d && g.accelerator == accelerator) && !taken.contains(d));
        if keep {
            continue;
        }
        let used: Vec<bool> = inv.gpus.iter().map(|g| taken.contains(&g.uuid)).collect();
        let text = match choose(inv, &used, &accelerator, count as usize) {
            Some(set) => {
                job.replicas[idx].devices = set.iter().map(|&i| inv.gpus[i].uuid.clone()).collect();
                let list: Vec<String> = set.iter().map(|&i| format!("{} ({})", inv.gpus[i].index, inv.gpus[i].uuid)).collect();
                let s = if count == 1 { "" } else { "s" };
                format!("Replica {replica} holds GPU{s} {} of node {node}.", list.join(", "))
            }
            None => {
                job.replicas[idx].devices = Vec::new();
                format!("Replica {replica}: {count} {accelerator} GPU(s) of node {node} are not free yet.")
            }
        };
        effects.push(Effect::Log(LogLine { attempt: job.attempt, replica: Some(replica.clone()), text }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// 4 x A100 as a fake nvidia-smi reports them: NVLink pairs (0,1) and (2,3), PCIe
    /// between the pairs.
    pub const DEVICES: &str = "0, GPU-aaaaaaaa-0000-0000-0000-000000000000, NVIDIA A100-SXM4-40GB, 40960, 00000000:07:00.0\n\
                               1, GPU-aaaaaaaa-0000-0000-0000-000000000001, NVIDIA A100-SXM4-40GB, 40960, 00000000:0B:00.0\n\
                               2, GPU-aaaaaaaa-0000-0000-0000-000000000002, NVIDIA A100-SXM4-40GB, 40960, 00000000:48:00.0\n\
                               3, GPU-aaaaaaaa-0000-0000-0000-000000000003, NVIDIA A100-SXM4-40GB, 40960, 00000000:4C:00.0\n";
    pub const TOPO: &str = "\tGPU0\tGPU1\tGPU2\tGPU3\tCPU Affinity\tNUMA Affinity\n\
                            GPU0\t X \tNV12\tSYS\tSYS\t0-31\t0\n\
                            GPU1\tNV12\t X \tSYS\tSYS\t0-31\t0\n\
                            GPU2\tSYS\tSYS\t X \tNV12\t32-63\t1\n\
                            GPU3\tSYS\tSYS\tNV12\t X \t32-63\t1\n\
                            \n\
                            Legend:\n\
                            \n\
                              X    = Self\n";

    fn inventory() -> Inventory {
        let gpus = parse_devices(DEVICES).unwrap();
        let links = parse_topology(TOPO, &gpus).unwrap();
        Inventory { gpus, links }
    }

    /// A job of one replica asking for `count` A100s, launched on `node` (its effects).
    fn launched(count: u32, node: &str, devices: &[&str]) -> (Job, Vec<Effect>) {
        use crate::job::{Demand, Policy, ReplicaDemand, Settings};
        let demand = Demand {
            metrics: BTreeMap::new(),
            replicas: vec![ReplicaDemand { cpus: 4, memory_bytes: 1 << 30, accelerator: Some(("NVIDIA_TESLA_A100".into(), count)) }],
        };
        let mut job = Job::new(7, "p".into(), "r".into(), &[1], demand, Policy::defaults(&Settings::default()), false, 0);
        job.replicas[0].devices = devices.iter().map(|d| d.to_string()).collect();
        job.replicas[0].node = Some(node.into());
        let run = crate::RunId { job: 7, attempt: 0, replica: job.replicas[0].name.clone(), restart: 1 };
        (job, vec![Effect::Launch { run, node: node.into() }])
    }

    fn uuid(i: u32) -> String {
        format!("GPU-aaaaaaaa-0000-0000-0000-00000000000{i}")
    }

    /// L10, L11: a replica restarted on its node keeps its devices while they are free;
    /// L9: one whose devices another job holds now (or on a node it never ran on) gets a
    /// free, close set, said in the job's log; none free leaves it none (its launch fails,
    /// L16).
    #[test]
    fn l9_l10_devices_are_kept_on_a_restart_and_chosen_afresh_elsewhere() {
        let inventories = BTreeMap::from([("n1".to_string(), inventory())]);
        let (u2, u3) = (uuid(2), uuid(3));
        let (mut job, mut effects) = launched(2, "n1", &[&u2, &u3]);
        assign_devices(&mut job, &mut effects, &inventories, |_| HashSet::new());
        assert_eq!(job.replicas[0].devices, [u2.clone(), u3.clone()], "kept");
        assert_eq!(effects.len(), 1, "nothing to say");

        let (mut job, mut effects) = launched(2, "n1", &[&u2, &u3]);
        assign_devices(&mut job, &mut effects, &inventories, |_| HashSet::from([u3.clone()]));
        assert_eq!(job.replicas[0].devices, [uuid(0), uuid(1)], "the free NVLink pair");
        assert!(matches!(&effects[1], Effect::Log(l) if l.text.contains("holds GPUs 0")), "{effects:?}");

        let (mut job, mut effects) = launched(2, "n1", &[]);
        assign_devices(&mut job, &mut effects, &inventories, |_| [0, 1, 2].map(uuid).into_iter().collect());
        assert!(job.replicas[0].devices.is_empty());
        assert!(matches!(&effects[1], Effect::Log(l) if l.text.contains("not free yet")), "{effects:?}");

        let (mut job, mut effects) = launched(1, "elsewhere", &[]);
        assign_devices(&mut job, &mut effects, &inventories, |_| HashSet::new());
        assert!(job.replicas[0].devices.is_empty(), "a node without an inventory: Slurm's gres assigns");
    }

    #[test]
    fn parses_devices_and_topology_and_maps_models() {
        let inv = inventory();
        assert_eq!(inv.gpus.len(), 4);
        assert_eq!(inv.gpus[2].uuid, "GPU-aaaaaaaa-0000-0000-0000-000000000002");
        assert_eq!(inv.gpus[0].accelerator, "NVIDIA_TESLA_A100");
        assert_eq!(inv.link(0, 1), Link::NvLink(12));
        assert_eq!(inv.link(1, 2), Link::Sys);
        assert_eq!(inv.counts()["NVIDIA_TESLA_A100"], 4);
        for (model, ty) in [
            ("Tesla T4", Some("NVIDIA_TESLA_T4")),
            ("NVIDIA L4", Some("NVIDIA_L4")),
            ("NVIDIA A100-SXM4-80GB", Some("NVIDIA_A100_80GB")),
            ("NVIDIA H100 80GB HBM3", Some("NVIDIA_H100_80GB")),
            ("Tesla V100-SXM2-16GB", Some("NVIDIA_TESLA_V100")),
            ("NVIDIA GeForce RTX 4090", None),
        ] {
            assert_eq!(accelerator_type(model), ty, "{model}");
        }
        let odd = parse_devices("0, GPU-x, NVIDIA GeForce RTX 4090, 24564, 00000000:01:00.0\n").unwrap();
        assert_eq!(odd[0].accelerator, "NVIDIA GeForce RTX 4090", "unknown models keep their own name");
        assert!(matches!(parse_devices("0, nonsense\n"), Err(ParseError::Device { line: 1, .. })));
        let restricted = inv.restricted_to(&[inv.gpus[1].uuid.clone(), inv.gpus[3].uuid.clone()]);
        assert_eq!(restricted.gpus.len(), 2);
        assert_eq!(restricted.link(0, 1), Link::Sys);
    }

    #[test]
    fn a_pair_gets_an_nvlink_pair_and_singles_pack() {
        let inv = inventory();
        let a100 = "NVIDIA_TESLA_A100";
        let pair = choose(&inv, &[false; 4], a100, 2).unwrap();
        assert!(pair == vec![0, 1] || pair == vec![2, 3], "{pair:?}");
        // One in use: a single goes next to it, keeping the other NVLink pair whole.
        let single = choose(&inv, &[true, false, false, false], a100, 1).unwrap();
        assert_eq!(single, vec![1]);
        let pair = choose(&inv, &[true, false, false, false], a100, 2).unwrap();
        assert_eq!(pair, vec![2, 3]);
        assert_eq!(choose(&inv, &[true, true, true, false], a100, 2), None);
        assert_eq!(choose(&inv, &[false; 4], "NVIDIA_TESLA_T4", 1), None);
    }

    fn arb_inventory() -> impl Strategy<Value = (Inventory, Vec<bool>)> {
        (1usize..10).prop_flat_map(|n| {
            let links = proptest::collection::vec(0u8..8, n * n);
            let used = proptest::collection::vec(any::<bool>(), n);
            (Just(n), links, used)
        })
        .prop_map(|(n, raw, used)| {
            let gpus = (0..n)
                .map(|i| Gpu {
                    index: i as u32,
                    uuid: format!("GPU-{i}"),
                    name: "NVIDIA A100-SXM4-40GB".into(),
                    accelerator: "NVIDIA_TESLA_A100".into(),
                    memory_mib: 40960,
                    pci_bus_id: String::new(),
                })
                .collect();
            let kind = |v: u8| match v {
                0 => Link::NvLink(12),
                1 => Link::NvLink(4),
                2 => Link::Pix,
                3 => Link::Pxb,
                4 => Link::Phb,
                5 => Link::Node,
                _ => Link::Sys,
            };
            // Symmetric.
            let mut links = vec![vec![Link::Sys; n]; n];
            for a in 0..n {
                for b in 0..n {
                    let v = raw[a.min(b) * n + a.max(b)];
                    links[a][b] = kind(v);
                }
            }
            (Inventory { gpus, links }, used)
        })
    }

    proptest! {
        /// Never a device twice, never one in use, exactly the count, and `None` only when
        /// too few are free.
        #[test]
        fn choice_is_exact_and_exclusive((inv, used) in arb_inventory(), count in 0usize..6) {
            let free = used.iter().filter(|u| !**u).count();
            match choose(&inv, &used, "NVIDIA_TESLA_A100", count) {
                None => prop_assert!(free < count),
                Some(set) => {
                    prop_assert_eq!(set.len(), count);
                    let mut s = set.clone();
                    s.dedup();
                    prop_assert_eq!(s.len(), count);
                    for &d in &set {
                        prop_assert!(!used[d]);
                    }
                }
            }
        }

        /// When a set whose every pair is NVLink-connected is free, the choice is such a set.
        #[test]
        fn a_topology_preferred_set_is_chosen_when_one_is_free((inv, used) in arb_inventory(), count in 2usize..4) {
            let free: Vec<usize> = (0..inv.gpus.len()).filter(|&i| !used[i]).collect();
            let nv = |a: usize, b: usize| matches!(inv.link(a, b), Link::NvLink(_));
            let exists = free.iter().any(|&a| free.iter().filter(|&&b| b != a && nv(a, b)).count() >= count - 1
                && (count == 2 || free.iter().any(|&b| b != a && nv(a, b) && free.iter().any(|&c| c != a && c != b && nv(a, c) && nv(b, c)))));
            if exists && free.len() >= count {
                let set = choose(&inv, &used, "NVIDIA_TESLA_A100", count).unwrap();
                for (k, &a) in set.iter().enumerate() {
                    for &b in &set[k + 1..] {
                        prop_assert!(nv(a, b), "{:?} chosen, an all-NVLink set exists", set);
                    }
                }
            }
        }
    }
}
