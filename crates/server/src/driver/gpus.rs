//! Which GPUs each replica holds: given when its run is launched, in the same
//! transaction as the launch (so a server killed at any moment neither loses nor doubles
//! an assignment, L23), kept across restarts on the same node (L10, L11), given afresh
//! on a new node (L9). The decision is `trainyard_core::gpu::assign_devices`.

use super::*;

impl Driver {
    /// The devices held on `node` by live replicas of other jobs than `except`.
    /// GPUs of `node` held by jobs other than `except`: as they are, or as `staged`
    /// (transitions decided but not installed yet) has them.
    fn gpus_held(&self, node: &str, except: u64, staged: &Staged) -> HashSet<String> {
        // A GPU gone from nvidia-smi is given to nobody.
        let mut held: HashSet<String> = self.gpus_missing.get(node).map(|m| m.iter().cloned().collect()).unwrap_or_default();
        for (id, live) in &self.jobs {
            if *id == except {
                continue;
            }
            let job = staged.get(id).map_or(&live.job, |(j, _)| j);
            for r in job.replicas.iter().filter(|r| r.state.is_live() && r.node.as_deref() == Some(node)) {
                held.extend(r.devices.iter().cloned());
            }
        }
        held
    }

    /// The devices of the replicas `effects` launch: part of the decision, in the core
    /// (`gpu::assign_devices`), with this node's inventory and what other jobs hold.
    pub(super) fn assign_gpus(&self, job: &mut Job, effects: &mut Vec<Effect>, staged: &Staged) {
        if self.svc.gpus.is_empty() {
            return;
        }
        let id = job.id;
        trainyard_core::gpu::assign_devices(job, effects, &self.svc.gpus, |node| self.gpus_held(node, id, staged));
    }
}

impl Driver {
    /// GPUs that report faults (uncorrectable ECC errors): their node is quarantined at
    /// once (not the single node of a fleet that overcommits: there it is said).
    pub(super) fn gpu_faults(&mut self, faults: Vec<(String, String)>, now: Micros) {
        for (uuid, what) in faults {
            let Some((node, g)) = self.svc.gpus.iter().find_map(|(n, inv)| inv.gpus.iter().find(|g| g.uuid == uuid).map(|g| (n.clone(), g.index))) else {
                continue;
            };
            if self.quarantined.contains_key(&node) {
                continue;
            }
            if self.fleet.overcommit {
                tracing::warn!("node {node}: GPU {g} ({uuid}) reports {what}; the node is not quarantined (the only node of an overcommitting fleet)");
                continue;
            }
            let reason = format!("GPU {g} ({uuid}) reports {what}");
            self.quarantine_node(&node, reason, Vec::new(), now);
        }
    }

    /// The health check's finding (`nvidia-smi`, every `gpu_check_secs`): a GPU gone from
    /// it (fell off the bus) marks its node degraded and takes it out of the node's
    /// capacity; the replicas that held it are lost (L9): restarted at once on other GPUs
    /// of the node or on another node, not counted (L11). A GPU that is back is capacity
    /// again. A failing `nvidia-smi` changes nothing (it is said, never guessed from).
    pub(super) fn gpus_seen(&mut self, present: Result<Vec<String>, String>, now: Micros) -> Result<(), StoreError> {
        let present = match present {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!("GPU health check: {e}; nothing is concluded from it");
                return Ok(());
            }
        };
        let inventories: Vec<(String, trainyard_core::gpu::Inventory)> =
            self.svc.gpus.iter().map(|(n, i)| (n.clone(), i.clone())).collect();
        for (node, inv) in inventories {
            let missing: BTreeSet<String> = inv.gpus.iter().filter(|g| !present.contains(&g.uuid)).map(|g| g.uuid.clone()).collect();
            let before = self.gpus_missing.get(&node).cloned().unwrap_or_default();
            if missing == before {
                continue;
            }
            for g in &inv.gpus {
                match (missing.contains(&g.uuid), before.contains(&g.uuid)) {
                    (true, false) => tracing::warn!("node {node}: GPU {} ({}) is gone from nvidia-smi: the node is degraded", g.index, g.uuid),
                    (false, true) => tracing::info!("node {node}: GPU {} ({}) is back", g.index, g.uuid),
                    _ => {}
                }
            }
            if let Some(n) = self.fleet.nodes.iter_mut().find(|n| n.name == node) {
                let mut counts = BTreeMap::new();
                for g in inv.gpus.iter().filter(|g| !missing.contains(&g.uuid)) {
                    *counts.entry(g.accelerator.clone()).or_insert(0u32) += 1;
                }
                n.accelerators = counts;
            }
            let newly: BTreeSet<String> = missing.difference(&before).cloned().collect();
            if missing.is_empty() {
                self.gpus_missing.remove(&node);
            } else {
                self.gpus_missing.insert(node.clone(), missing);
            }
            self.reschedule = true;
            if newly.is_empty() {
                continue;
            }
            let hit: Vec<(u64, usize)> = self
                .jobs
                .iter()
                .flat_map(|(id, live)| {
                    live.job
                        .replicas
                        .iter()
                        .enumerate()
                        .filter(|(_, r)| {
                            r.state.is_live() && r.node.as_deref() == Some(node.as_str()) && r.devices.iter().any(|d| newly.contains(d))
                        })
                        .map(move |(i, _)| (*id, i))
                })
                .collect();
            for (job, i) in hit {
                let Some(live) = self.jobs.get(&job) else { continue };
                let replica = live.job.replicas[i].name.clone();
                let need = live.job.demand.replicas.get(i).and_then(|d| d.accelerator.clone());
                // Other GPUs of this node, if enough are free; else another node (L9).
                let here = need.is_some_and(|(a, c)| {
                    let held = self.gpus_held(&node, job, &Staged::new());
                    let own: HashSet<&String> = live
                        .job
                        .replicas
                        .iter()
                        .enumerate()
                        .filter(|(k, r)| *k != i && r.state.is_live() && r.node.as_deref() == Some(node.as_str()))
                        .flat_map(|(_, r)| r.devices.iter())
                        .collect();
                    inv.gpus.iter().filter(|g| g.accelerator == a && !held.contains(&g.uuid) && !own.contains(&g.uuid)).count() >= c as usize
                });
                let replacement = if here { Some(node.clone()) } else { self.replacement_node(job, i, &node) };
                tracing::warn!("replica {replica} of job {job} lost its GPU on node {node}; restarting it");
                self.apply(job, Event::NodeLost { replica, replacement }, now)?.ok();
            }
        }
        Ok(())
    }
}
