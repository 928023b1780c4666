//! GPU discovery through `nvidia-smi` (where the driver is; a fake one on PATH drives the
//! tests), and the GPU inventory of each node: discovered GPUs are exact capacity, even
//! on the overcommitting single-node default. Assignment of devices to replicas is in
//! `driver::gpus`; the choice itself is `trainyard_core::gpu::choose`.

use std::collections::BTreeMap;
use std::process::{Command, Stdio};

use trainyard_core::gpu::{parse_devices, parse_topology, Inventory};

/// The query `nvidia-smi` answers with one CSV line per GPU.
pub const QUERY: &[&str] = &["--query-gpu=index,uuid,name,memory.total,pci.bus_id", "--format=csv,noheader,nounits"];

/// What discovery found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Discovery {
    /// No `nvidia-smi` on PATH: no NVIDIA driver, no GPUs.
    NoDriver,
    /// `nvidia-smi` is there and said what GPUs there are (maybe none).
    Found(Inventory),
    /// `nvidia-smi` is there but failed: no GPUs are used, and the reason is said.
    Failed(String),
}

fn on_path(program: &str) -> bool {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path).any(|d| d.join(program).is_file())
}

fn run(args: &[&str]) -> Result<String, String> {
    let out = Command::new("nvidia-smi")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run nvidia-smi: {e}"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let msg = String::from_utf8_lossy(&out.stdout);
        let text = if err.trim().is_empty() { msg } else { err };
        return Err(format!("nvidia-smi {} exited with {}: {}", args.join(" "), out.status, text.trim()));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs `nvidia-smi` for the devices and `nvidia-smi topo -m` for their links. A
/// topology that cannot be read leaves every pair as far apart as can be (said once).
pub fn discover() -> Discovery {
    if !on_path("nvidia-smi") {
        return Discovery::NoDriver;
    }
    let devices = match run(QUERY).and_then(|t| parse_devices(&t).map_err(|e| e.to_string())) {
        Ok(d) => d,
        Err(e) => return Discovery::Failed(e),
    };
    let links = if devices.len() > 1 {
        match run(&["topo", "-m"]).and_then(|t| parse_topology(&t, &devices).map_err(|e| e.to_string())) {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!("GPUs: cannot read their interconnect ({e}); devices are chosen without it");
                Vec::new()
            }
        }
    } else {
        Vec::new()
    };
    Discovery::Found(Inventory { gpus: devices, links })
}

/// The UUIDs that `nvidia-smi` lists now (for the health check), or why not.
/// The health query: each GPU's uncorrectable ECC errors since the driver loaded.
pub const HEALTH_QUERY: &[&str] = &["--query-gpu=uuid,ecc.errors.uncorrected.volatile.total", "--format=csv,noheader,nounits"];

/// GPUs that report faults (uncorrectable ECC errors), with what: a node with one is
/// quarantined. A query that fails, or a GPU that does not count ECC errors
/// (`[N/A]`, `[Not Supported]`), says nothing.
pub fn faults() -> Vec<(String, String)> {
    let Ok(text) = run(HEALTH_QUERY) else { return Vec::new() };
    parse_faults(&text)
}

fn parse_faults(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|l| {
            let (uuid, n) = l.split_once(',')?;
            let n: u64 = n.trim().parse().ok()?;
            (n > 0).then(|| (uuid.trim().to_string(), format!("{n} uncorrectable ECC error(s) (nvidia-smi)")))
        })
        .collect()
}

pub fn present() -> Result<Vec<String>, String> {
    let text = run(QUERY)?;
    parse_devices(&text).map(|d| d.into_iter().map(|g| g.uuid).collect()).map_err(|e| e.to_string())
}

/// Applies discovery to the fleet: the GPUs of this host go to the built-in single node,
/// or to the declared nodes that list them (`gpus = [uuid, ...]`), and their counts
/// become those nodes' accelerators (exact). Returns the inventories by node, or the
/// error naming a listed UUID that was not discovered.
pub fn apply(
    discovery: &Discovery,
    fleet: &mut trainyard_core::schedule::Fleet,
    node_gpus: &BTreeMap<String, Vec<String>>,
    single_node: bool,
) -> Result<BTreeMap<String, Inventory>, String> {
    let mut out = BTreeMap::new();
    let host = match discovery {
        Discovery::Found(inv) => inv,
        Discovery::NoDriver => {
            if let Some((node, _)) = node_gpus.iter().find(|(_, u)| !u.is_empty()) {
                return Err(format!("node {node:?} lists gpus, but there is no nvidia-smi on PATH to find them"));
            }
            return Ok(out);
        }
        Discovery::Failed(why) => {
            tracing::warn!("GPUs: none used: nvidia-smi failed: {why}");
            return Ok(out);
        }
    };
    for (node, uuids) in node_gpus {
        if let Some(missing) = uuids.iter().find(|u| !host.gpus.iter().any(|g| &g.uuid == *u)) {
            return Err(format!("node {node:?} lists GPU {missing}, which nvidia-smi does not report on this host"));
        }
    }
    for n in fleet.nodes.iter_mut() {
        let inv = match node_gpus.get(&n.name) {
            Some(uuids) => host.restricted_to(uuids),
            None if single_node => host.clone(),
            None => continue,
        };
        if inv.gpus.is_empty() {
            continue;
        }
        // Discovered GPUs replace what the config declared for the node.
        n.accelerators = inv.counts();
        out.insert(n.name.clone(), inv);
    }
    for (node, inv) in &out {
        let list: Vec<String> = inv.gpus.iter().map(|g| format!("{} {} ({})", g.index, g.accelerator, g.uuid)).collect();
        tracing::info!("GPUs of node {node}: {}", list.join(", "));
    }
    Ok(out)
}
