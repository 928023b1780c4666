//! Free capacity per node, indexed for best-fit gang placement.
//!
//! Nodes are grouped in classes: one class per accelerator type, and one class for nodes
//! without accelerators. Within a class, nodes sit in buckets by their free amount (free
//! accelerators, or free CPUs for CPU-only nodes), so that best fit is a scan of a few
//! buckets from the requested amount upwards, not a scan of the fleet. Every change is
//! journaled so that a trial placement can be rolled back in time proportional to what
//! it touched.

use std::collections::HashMap;

use crate::job::ReplicaDemand;
use crate::schedule::Fleet;

/// A node's position in the fleet (`Fleet::nodes[i]`).
pub type NodeIx = u32;

/// `Need::acc_type` of a replica that asks for no accelerator.
pub const NO_ACC: u16 = u16::MAX;
/// `Need::acc_type` of an accelerator type that no node of the fleet has.
pub const UNKNOWN_ACC: u16 = u16::MAX - 1;

/// What one replica needs from one node, with the accelerator type interned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Need {
    pub cpus: i64,
    pub mem: i64,
    pub acc_type: u16,
    pub acc: i64,
}

impl Need {
    /// At least as much as `o` in every dimension, of the same accelerator type.
    pub fn covers(&self, o: &Need) -> bool {
        self.acc_type == o.acc_type && self.cpus >= o.cpus && self.mem >= o.mem && self.acc >= o.acc
    }
}

/// The replicas of one attempt, in replica order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shape {
    pub needs: Vec<Need>,
    /// Every replica needs the same.
    pub uniform: bool,
}

impl Shape {
    pub fn new(needs: Vec<Need>) -> Shape {
        let uniform = needs.windows(2).all(|w| w[0] == w[1]);
        Shape { needs, uniform }
    }
    /// The componentwise largest need (used to estimate reservations of mixed gangs).
    pub fn max_need(&self) -> Need {
        let mut m = self.needs.first().copied().unwrap_or(Need { cpus: 0, mem: 0, acc_type: NO_ACC, acc: 0 });
        for n in &self.needs {
            m.cpus = m.cpus.max(n.cpus);
            m.mem = m.mem.max(n.mem);
            if n.acc_type != NO_ACC && (m.acc_type == NO_ACC || n.acc > m.acc) {
                m.acc_type = n.acc_type;
                m.acc = m.acc.max(n.acc);
            }
        }
        m
    }
}

/// The fleet's static description: names, sizes, classes, which nodes take work.
#[derive(Clone, Debug)]
pub struct NodeTable {
    pub names: Vec<String>,
    pub index: HashMap<String, NodeIx>,
    pub cap_cpus: Vec<i64>,
    pub cap_mem: Vec<i64>,
    pub cap_acc: Vec<i64>,
    /// The node's accelerator type (the one it has most of), or `NO_ACC`.
    pub acc_type: Vec<u16>,
    /// Up and schedulable.
    pub usable: Vec<bool>,
    pub acc_names: Vec<String>,
    /// Highest bucket level per class (`acc_names.len()` is the CPU-only class).
    pub max_level: Vec<usize>,
    /// Nodes down, and nodes up but drained (for stockout details, L15).
    pub down: usize,
    pub drained: usize,
}

impl NodeTable {
    pub fn new(fleet: &Fleet) -> NodeTable {
        let mut acc_names: Vec<String> = Vec::new();
        let mut t = NodeTable {
            names: Vec::with_capacity(fleet.nodes.len()),
            index: HashMap::with_capacity(fleet.nodes.len()),
            cap_cpus: Vec::with_capacity(fleet.nodes.len()),
            cap_mem: Vec::with_capacity(fleet.nodes.len()),
            cap_acc: Vec::with_capacity(fleet.nodes.len()),
            acc_type: Vec::with_capacity(fleet.nodes.len()),
            usable: Vec::with_capacity(fleet.nodes.len()),
            acc_names: Vec::new(),
            max_level: Vec::new(),
            down: fleet.nodes.iter().filter(|n| !n.up).count(),
            drained: fleet.nodes.iter().filter(|n| n.up && !n.schedulable).count(),
        };
        for (i, n) in fleet.nodes.iter().enumerate() {
            // A node offers its most numerous accelerator type (nodes with several types
            // offer only that one: never over-committed, at worst under-used).
            let best = n.accelerators.iter().filter(|(_, &c)| c > 0).max_by_key(|(_, &c)| c);
            let (ty, count) = match best {
                Some((name, &c)) => {
                    let ty = match acc_names.iter().position(|a| a == name) {
                        Some(p) => p,
                        None => {
                            acc_names.push(name.clone());
                            acc_names.len() - 1
                        }
                    };
                    (ty as u16, c as i64)
                }
                None => (NO_ACC, 0),
            };
            t.names.push(n.name.clone());
            t.index.entry(n.name.clone()).or_insert(i as NodeIx);
            t.cap_cpus.push(n.cpus as i64);
            t.cap_mem.push(n.memory_bytes as i64);
            t.cap_acc.push(count);
            t.acc_type.push(ty);
            t.usable.push(n.up && n.schedulable);
        }
        t.acc_names = acc_names;
        let classes = t.acc_names.len() + 1;
        t.max_level = vec![0; classes];
        for i in 0..t.names.len() {
            let c = t.class(i as NodeIx);
            let lvl = if c == classes - 1 { t.cap_cpus[i] } else { t.cap_acc[i] };
            t.max_level[c] = t.max_level[c].max(lvl.max(0) as usize);
        }
        t
    }

    pub fn len(&self) -> usize {
        self.names.len()
    }
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }
    pub fn cpu_class(&self) -> usize {
        self.acc_names.len()
    }
    pub fn class(&self, n: NodeIx) -> usize {
        match self.acc_type[n as usize] {
            NO_ACC => self.acc_names.len(),
            t => t as usize,
        }
    }

    /// Intern one replica's demand.
    pub fn need(&self, d: &ReplicaDemand) -> Need {
        let (acc_type, acc) = match &d.accelerator {
            Some((name, c)) if *c > 0 => {
                (self.acc_names.iter().position(|a| a == name).map_or(UNKNOWN_ACC, |p| p as u16), *c as i64)
            }
            _ => (NO_ACC, 0),
        };
        Need { cpus: d.cpus as i64, mem: d.memory_bytes.min(i64::MAX as u64) as i64, acc_type, acc }
    }

    pub fn shape(&self, replicas: &[ReplicaDemand]) -> Shape {
        Shape::new(replicas.iter().map(|d| self.need(d)).collect())
    }

    pub fn acc_name(&self, t: u16) -> &str {
        match t {
            NO_ACC => "none",
            UNKNOWN_ACC => "an accelerator no node has",
            t => &self.acc_names[t as usize],
        }
    }
}

/// How many replicas of `need` fit into free (cpus, mem, acc) of a node of type `node_type`.
pub fn slots(cpus: i64, mem: i64, acc: i64, node_type: u16, need: &Need) -> i64 {
    if need.acc_type != NO_ACC && need.acc_type != node_type {
        return 0;
    }
    let mut s = i64::MAX;
    if need.cpus > 0 {
        s = s.min(cpus / need.cpus);
    }
    if need.mem > 0 {
        s = s.min(mem / need.mem);
    }
    if need.acc_type != NO_ACC && need.acc > 0 {
        s = s.min(acc / need.acc);
    }
    if s == i64::MAX {
        s = 1 << 20; // a replica that asks for nothing fits anywhere
    }
    s.max(0)
}

/// Free capacity of every node, bucketed for best fit, with an undo journal.
#[derive(Clone, Debug)]
pub struct Work {
    pub cpus: Vec<i64>,
    pub mem: Vec<i64>,
    pub acc: Vec<i64>,
    /// `buckets[class][level]`: usable nodes of that class with that free level.
    buckets: Vec<Vec<Vec<NodeIx>>>,
    pos: Vec<u32>,
    level: Vec<u32>,
    journal: Vec<(NodeIx, i64, i64, i64)>,
}

impl Work {
    /// Every usable node entirely free.
    pub fn new(t: &NodeTable) -> Work {
        let n = t.len();
        let mut w = Work {
            cpus: t.cap_cpus.clone(),
            mem: t.cap_mem.clone(),
            acc: t.cap_acc.clone(),
            buckets: t.max_level.iter().map(|&m| vec![Vec::new(); m + 1]).collect(),
            pos: vec![u32::MAX; n],
            level: vec![0; n],
            journal: Vec::new(),
        };
        for i in 0..n {
            if t.usable[i] {
                let c = t.class(i as NodeIx);
                let l = w.level_of(t, i as NodeIx);
                w.pos[i] = w.buckets[c][l].len() as u32;
                w.level[i] = l as u32;
                w.buckets[c][l].push(i as NodeIx);
            }
        }
        w
    }

    fn level_of(&self, t: &NodeTable, n: NodeIx) -> usize {
        let c = t.class(n);
        let v = if c == t.cpu_class() { self.cpus[n as usize] } else { self.acc[n as usize] };
        (v.max(0) as usize).min(t.max_level[c])
    }

    fn rebucket(&mut self, t: &NodeTable, n: NodeIx) {
        let i = n as usize;
        if self.pos[i] == u32::MAX {
            return;
        }
        let new = self.level_of(t, n);
        let old = self.level[i] as usize;
        if new == old {
            return;
        }
        let c = t.class(n);
        let p = self.pos[i] as usize;
        let b = &mut self.buckets[c][old];
        b.swap_remove(p);
        if p < b.len() {
            let moved = b[p];
            self.pos[moved as usize] = p as u32;
        }
        self.pos[i] = self.buckets[c][new].len() as u32;
        self.level[i] = new as u32;
        self.buckets[c][new].push(n);
    }

    /// Set a node's free amounts (journaled).
    pub fn set(&mut self, t: &NodeTable, n: NodeIx, cpus: i64, mem: i64, acc: i64) {
        let i = n as usize;
        self.journal.push((n, self.cpus[i], self.mem[i], self.acc[i]));
        self.cpus[i] = cpus;
        self.mem[i] = mem;
        self.acc[i] = acc;
        self.rebucket(t, n);
    }

    pub fn take(&mut self, t: &NodeTable, n: NodeIx, d: &Need) {
        let i = n as usize;
        let acc = if d.acc_type == NO_ACC { self.acc[i] } else { self.acc[i] - d.acc };
        self.set(t, n, self.cpus[i] - d.cpus, self.mem[i] - d.mem, acc);
    }

    pub fn give(&mut self, t: &NodeTable, n: NodeIx, d: &Need) {
        let i = n as usize;
        let acc = if d.acc_type == NO_ACC { self.acc[i] } else { self.acc[i] + d.acc };
        self.set(t, n, self.cpus[i] + d.cpus, self.mem[i] + d.mem, acc);
    }

    pub fn mark(&self) -> usize {
        self.journal.len()
    }

    /// Undo every change made since `mark`.
    pub fn rollback(&mut self, t: &NodeTable, mark: usize) {
        while self.journal.len() > mark {
            let (n, c, m, a) = self.journal.pop().expect("journal entry");
            let i = n as usize;
            self.cpus[i] = c;
            self.mem[i] = m;
            self.acc[i] = a;
            self.rebucket(t, n);
        }
    }

    /// Forget the journal (the changes stay).
    pub fn commit(&mut self) {
        self.journal.clear();
    }

    pub fn fits(&self, t: &NodeTable, n: NodeIx, d: &Need) -> bool {
        let i = n as usize;
        self.cpus[i] >= d.cpus
            && self.mem[i] >= d.mem
            && (d.acc_type == NO_ACC || (t.acc_type[i] == d.acc_type && self.acc[i] >= d.acc))
    }

    /// An upper bound of how many replicas of `d` fit now (accelerators only; CPU-only
    /// needs are not bounded). Used to reject quickly.
    pub fn slot_bound(&self, t: &NodeTable, d: &Need) -> i64 {
        if d.acc_type == NO_ACC {
            return i64::MAX;
        }
        if d.acc_type as usize >= t.acc_names.len() {
            return 0;
        }
        let c = d.acc_type as usize;
        let mut s = 0i64;
        for (lvl, b) in self.buckets[c].iter().enumerate().skip(d.acc.max(0) as usize) {
            s += b.len() as i64 * (lvl as i64 / d.acc.max(1));
        }
        s
    }

    /// Best fit: the usable node with the least free room that still holds `d` and that
    /// `ok` accepts.
    pub fn pick(&self, t: &NodeTable, d: &Need, ok: &mut dyn FnMut(NodeIx) -> bool) -> Option<NodeIx> {
        if d.acc_type != NO_ACC {
            let c = d.acc_type as usize;
            if c >= t.acc_names.len() {
                return None;
            }
            for b in self.buckets[c].iter().skip(d.acc.max(0) as usize) {
                for &n in b {
                    if self.fits(t, n, d) && ok(n) {
                        return Some(n);
                    }
                }
            }
            return None;
        }
        // CPU-only: CPU nodes by best fit, then accelerator nodes whose accelerators are
        // all taken (their CPUs are of no other use), then the rest.
        let cc = t.cpu_class();
        for b in self.buckets[cc].iter().skip((d.cpus.max(0) as usize).min(t.max_level[cc])) {
            for &n in b {
                if self.fits(t, n, d) && ok(n) {
                    return Some(n);
                }
            }
        }
        for c in 0..cc {
            for b in &self.buckets[c] {
                for &n in b {
                    if self.fits(t, n, d) && ok(n) {
                        return Some(n);
                    }
                }
            }
        }
        None
    }

    /// Gang placement: every replica placed (taken from the free capacity) or none.
    /// `limit` caps what may be taken on some nodes (the slack of a reservation).
    pub fn place_gang(&mut self, t: &NodeTable, shape: &Shape, limit: Option<&HashMap<NodeIx, [i64; 3]>>) -> Option<Vec<NodeIx>> {
        self.place_gang_prefer(t, shape, limit, &[])
    }

    /// The same, trying the nodes of `prefer` first (best fit among them): a job that
    /// ends before a reservation goes onto the reserved nodes, keeping the others open.
    pub fn place_gang_prefer(
        &mut self,
        t: &NodeTable,
        shape: &Shape,
        limit: Option<&HashMap<NodeIx, [i64; 3]>>,
        prefer: &[NodeIx],
    ) -> Option<Vec<NodeIx>> {
        let m = self.mark();
        let mut out = Vec::with_capacity(shape.needs.len());
        let mut used: HashMap<NodeIx, [i64; 3]> = HashMap::new();
        for d in &shape.needs {
            let picked = {
                let mut ok = |n: NodeIx| match limit.and_then(|l| l.get(&n)) {
                    None => true,
                    Some(cap) => {
                        let u = used.get(&n).copied().unwrap_or([0; 3]);
                        let acc = if d.acc_type == NO_ACC { 0 } else { d.acc };
                        u[0] + d.cpus <= cap[0] && u[1] + d.mem <= cap[1] && u[2] + acc <= cap[2]
                    }
                };
                let mut best: Option<(i64, NodeIx)> = None;
                for &n in prefer {
                    if self.pos[n as usize] != u32::MAX && self.fits(t, n, d) && ok(n) {
                        let room = if d.acc_type == NO_ACC { self.cpus[n as usize] } else { self.acc[n as usize] };
                        if best.is_none_or(|(r, _)| room < r) {
                            best = Some((room, n));
                        }
                    }
                }
                match best {
                    Some((_, n)) => Some(n),
                    None => self.pick(t, d, &mut ok),
                }
            };
            match picked {
                Some(n) => {
                    self.take(t, n, d);
                    if limit.is_some_and(|l| l.contains_key(&n)) {
                        let u = used.entry(n).or_insert([0; 3]);
                        u[0] += d.cpus;
                        u[1] += d.mem;
                        u[2] += if d.acc_type == NO_ACC { 0 } else { d.acc };
                    }
                    out.push(n);
                }
                None => {
                    self.rollback(t, m);
                    return None;
                }
            }
        }
        Some(out)
    }
}
