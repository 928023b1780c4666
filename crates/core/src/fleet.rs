//! The fleet the scheduler places on: its nodes, their capacity and state. Shared by the
//! scheduler (`schedule`) and its capacity index (`capacity`), which both read it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A node that runs replicas.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Node {
    pub name: String,
    pub cpus: u32,
    pub memory_bytes: u64,
    /// Accelerator type (wire name) → count.
    pub accelerators: BTreeMap<String, u32>,
    /// False when the node is down (L9 node loss).
    pub up: bool,
    /// False when the node is drained (L9 maintenance): it takes no new work.
    pub schedulable: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fleet {
    pub nodes: Vec<Node>,
    /// CPU and memory are shared, not reserved, and missing accelerators do not stop a
    /// replica from running (the single-workstation default).
    pub overcommit: bool,
}
