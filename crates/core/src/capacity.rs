//! Free capacity per node, indexed for best-fit gang placement.
//!
//! Nodes are grouped in classes: one class per accelerator type, and one class for nodes
//! without accelerators. Within a class, nodes sit in buckets by their free amount (free
//! accelerators, or free CPUs for CPU-only nodes), so that best fit is a scan of a few
//! buckets from the requested amount upwards, not a scan of the fleet. Every change is
//! journaled so that a trial placement can be rolled back in time proportional to what
//! it touched.

use crate::collections::{HashMap, HashSet};

use crate::job::ReplicaDemand;
use crate::fleet::{Fleet, Node};

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

/// An amount of a node's resources: CPUs, memory bytes and accelerators (of the node's
/// one accelerator type).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Res {
    pub cpus: i64,
    pub mem: i64,
    pub acc: i64,
}

impl Res {
    pub const ZERO: Res = Res { cpus: 0, mem: 0, acc: 0 };

    pub fn new(cpus: i64, mem: i64, acc: i64) -> Res {
        Res { cpus, mem, acc }
    }

    /// No more than `cap` in any dimension.
    pub fn within(self, cap: Res) -> bool {
        self.cpus <= cap.cpus && self.mem <= cap.mem && self.acc <= cap.acc
    }

    /// The smaller of the two in each dimension.
    pub fn min(self, o: Res) -> Res {
        Res { cpus: self.cpus.min(o.cpus), mem: self.mem.min(o.mem), acc: self.acc.min(o.acc) }
    }

    /// The larger of the two in each dimension.
    pub fn max(self, o: Res) -> Res {
        Res { cpus: self.cpus.max(o.cpus), mem: self.mem.max(o.mem), acc: self.acc.max(o.acc) }
    }
}

impl std::ops::Add for Res {
    type Output = Res;
    fn add(self, o: Res) -> Res {
        Res { cpus: self.cpus + o.cpus, mem: self.mem + o.mem, acc: self.acc + o.acc }
    }
}

impl std::ops::Sub for Res {
    type Output = Res;
    fn sub(self, o: Res) -> Res {
        Res { cpus: self.cpus - o.cpus, mem: self.mem - o.mem, acc: self.acc - o.acc }
    }
}

impl std::ops::AddAssign for Res {
    fn add_assign(&mut self, o: Res) {
        *self = *self + o;
    }
}

impl std::ops::SubAssign for Res {
    fn sub_assign(&mut self, o: Res) {
        *self = *self - o;
    }
}

impl Need {
    /// What one replica of this need takes of a node (no accelerator when it asks for
    /// none, whatever the node has).
    pub fn res(&self) -> Res {
        Res { cpus: self.cpus, mem: self.mem, acc: if self.acc_type == NO_ACC { 0 } else { self.acc } }
    }

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
    /// The largest capacity of any node in each dimension.
    pub max_cap: Res,
}

impl NodeTable {
    /// Node `n`'s whole capacity.
    pub fn cap(&self, n: usize) -> Res {
        Res::new(self.cap_cpus[n], self.cap_mem[n], self.cap_acc[n])
    }

    pub fn new(fleet: &Fleet) -> NodeTable {
        let mut acc_names: Vec<String> = Vec::new();
        let mut t = NodeTable {
            names: Vec::with_capacity(fleet.nodes.len()),
            index: HashMap::with_capacity_and_hasher(fleet.nodes.len(), Default::default()),
            cap_cpus: Vec::with_capacity(fleet.nodes.len()),
            cap_mem: Vec::with_capacity(fleet.nodes.len()),
            cap_acc: Vec::with_capacity(fleet.nodes.len()),
            acc_type: Vec::with_capacity(fleet.nodes.len()),
            usable: Vec::with_capacity(fleet.nodes.len()),
            acc_names: Vec::new(),
            max_level: Vec::new(),
            down: fleet.nodes.iter().filter(|n| !n.up).count(),
            drained: fleet.nodes.iter().filter(|n| n.up && !n.schedulable).count(),
            max_cap: Res::ZERO,
        };
        for (i, n) in fleet.nodes.iter().enumerate() {
            let (ty, count) = match offered(n) {
                Some((name, c)) => {
                    let ty = match acc_names.iter().position(|a| a == name) {
                        Some(p) => p,
                        None => {
                            acc_names.push(name.to_string());
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
            t.max_cap = t.max_cap.max(Res::new(n.cpus as i64, n.memory_bytes as i64, count));
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

    /// Node `n`, entirely free, holds one replica of `d`.
    pub fn holds(&self, n: usize, d: &Need) -> bool {
        self.cap_cpus[n] >= d.cpus
            && self.cap_mem[n] >= d.mem
            && (d.acc_type == NO_ACC || (self.acc_type[n] == d.acc_type && self.cap_acc[n] >= d.acc))
    }

    /// Replica indices, largest first: replicas that need accelerators, then by their
    /// dominant share of the largest node; replica order among equals.
    pub fn largest_first(&self, needs: &[Need]) -> Vec<usize> {
        let share = |d: &Need| {
            let f = |v: i64, m: i64| if m > 0 { v as f64 / m as f64 } else { 0.0 };
            let acc = if d.acc_type == NO_ACC { 0.0 } else { f(d.acc, self.max_cap.acc) };
            f(d.cpus, self.max_cap.cpus).max(f(d.mem, self.max_cap.mem)).max(acc)
        };
        let mut order: Vec<usize> = (0..needs.len()).collect();
        order.sort_by(|&a, &b| {
            let (da, db) = (&needs[a], &needs[b]);
            (db.acc_type != NO_ACC).cmp(&(da.acc_type != NO_ACC)).then(share(db).total_cmp(&share(da)))
        });
        order
    }

    /// The largest node that could hold `d` by its kind: of `d`'s accelerator type when it
    /// asks for one (None when no node offers that type), else any node; largest by
    /// accelerators, then CPUs, then memory.
    pub fn largest_for(&self, d: &Need) -> Option<NodeIx> {
        (0..self.len())
            .filter(|&n| d.acc_type == NO_ACC || self.acc_type[n] == d.acc_type)
            .max_by_key(|&n| (self.cap_acc[n], self.cap_cpus[n], self.cap_mem[n], std::cmp::Reverse(n)))
            .map(|n| n as NodeIx)
    }

    /// The largest node of all (by CPUs, then memory, then accelerators).
    pub fn largest(&self) -> Option<NodeIx> {
        (0..self.len())
            .max_by_key(|&n| (self.cap_cpus[n], self.cap_mem[n], self.cap_acc[n], std::cmp::Reverse(n)))
            .map(|n| n as NodeIx)
    }

    /// A node's capacity in words: `8 CPUs, 32 GiB and 2 x NVIDIA_TESLA_T4`.
    pub fn node_text(&self, n: NodeIx) -> String {
        let i = n as usize;
        let acc = (self.acc_type[i] != NO_ACC).then(|| (self.acc_name(self.acc_type[i]), self.cap_acc[i]));
        amount_text(self.cap_cpus[i], self.cap_mem[i], acc)
    }

    /// The fleet in words, nodes of the same size together: `2 nodes of 4 CPUs and 16 GiB`.
    pub fn fleet_text(&self) -> String {
        let mut groups: Vec<(usize, usize)> = Vec::new(); // (first node, count)
        for n in 0..self.len() {
            let same = |m: usize| {
                self.cap_cpus[m] == self.cap_cpus[n]
                    && self.cap_mem[m] == self.cap_mem[n]
                    && self.acc_type[m] == self.acc_type[n]
                    && self.cap_acc[m] == self.cap_acc[n]
            };
            match groups.iter_mut().find(|(m, _)| same(*m)) {
                Some(g) => g.1 += 1,
                None => groups.push((n, 1)),
            }
        }
        if groups.is_empty() {
            return "no nodes".to_string();
        }
        let shown: Vec<String> = groups
            .iter()
            .take(3)
            .map(|&(n, k)| format!("{k} node{} of {}", if k == 1 { "" } else { "s" }, self.node_text(n as NodeIx)))
            .collect();
        let more: usize = groups.iter().skip(3).map(|g| g.1).sum();
        let mut s = shown.join(", ");
        if more > 0 {
            s.push_str(&format!(" and {more} more node{}", if more == 1 { "" } else { "s" }));
        }
        s
    }

    pub fn acc_name(&self, t: u16) -> &str {
        match t {
            NO_ACC => "none",
            UNKNOWN_ACC => "an accelerator no node has",
            t => &self.acc_names[t as usize],
        }
    }
}

/// The accelerators a node offers: its most numerous type (nodes with several types offer
/// only that one: never over-committed, at worst under-used).
pub fn offered(n: &Node) -> Option<(&str, u32)> {
    n.accelerators.iter().filter(|(_, &c)| c > 0).max_by_key(|(_, &c)| c).map(|(a, &c)| (a.as_str(), c))
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
#[derive(Clone, Debug, Default)]
pub struct Work {
    pub cpus: Vec<i64>,
    pub mem: Vec<i64>,
    pub acc: Vec<i64>,
    /// `buckets[class][level]`: usable nodes of that class with that free level.
    buckets: Vec<Vec<Vec<NodeIx>>>,
    pos: Vec<u32>,
    level: Vec<u32>,
    journal: Vec<Undo>,
}

/// One journaled change: a node's free amounts before it and, when it moved the node to
/// another bucket, the bucket level and position it came from (so that a rollback puts
/// every node back in its place and the state after it is the state before, bit for bit).
#[derive(Clone, Copy, Debug)]
struct Undo {
    n: NodeIx,
    cpus: i64,
    mem: i64,
    acc: i64,
    from: Option<(u32, u32)>,
}

impl Work {
    /// Every usable node entirely free.
    pub fn new(t: &NodeTable) -> Work {
        Work::build(t, |i| t.usable[i])
    }

    /// Every node entirely free, usable or not: the fleet as it is when every node is up
    /// and undrained again.
    pub fn all(t: &NodeTable) -> Work {
        Work::build(t, |_| true)
    }

    fn build(t: &NodeTable, take: impl Fn(usize) -> bool) -> Work {
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
            if take(i) {
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

    /// Move a node to the bucket of its free level; returns the level and position it
    /// left, if it moved.
    fn rebucket(&mut self, t: &NodeTable, n: NodeIx) -> Option<(u32, u32)> {
        let i = n as usize;
        if self.pos[i] == u32::MAX {
            return None;
        }
        let new = self.level_of(t, n);
        let old = self.level[i] as usize;
        if new == old {
            return None;
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
        Some((old as u32, p as u32))
    }

    /// The inverse of the `rebucket` that moved `n` from `(level, pos)`: `n` is last in
    /// its bucket (later moves are undone first); the node that took its place goes back
    /// to the end of the old bucket, where it was.
    fn unbucket(&mut self, t: &NodeTable, n: NodeIx, (level, pos): (u32, u32)) {
        let i = n as usize;
        let c = t.class(n);
        let popped = self.buckets[c][self.level[i] as usize].pop();
        debug_assert_eq!(popped, Some(n), "a node moved later was not put back first");
        let b = &mut self.buckets[c][level as usize];
        let p = pos as usize;
        if p < b.len() {
            let moved = b[p];
            self.pos[moved as usize] = b.len() as u32;
            b.push(moved);
            b[p] = n;
        } else {
            b.push(n);
        }
        self.pos[i] = pos;
        self.level[i] = level;
    }

    /// Set a node's free amounts (journaled).
    pub fn set(&mut self, t: &NodeTable, n: NodeIx, cpus: i64, mem: i64, acc: i64) {
        let i = n as usize;
        let (c0, m0, a0) = (self.cpus[i], self.mem[i], self.acc[i]);
        self.cpus[i] = cpus;
        self.mem[i] = mem;
        self.acc[i] = acc;
        let from = self.rebucket(t, n);
        self.journal.push(Undo { n, cpus: c0, mem: m0, acc: a0, from });
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

    /// Undo every change made since `mark`, exactly: amounts, buckets and the order
    /// within them are as they were at `mark`.
    pub fn rollback(&mut self, t: &NodeTable, mark: usize) {
        while self.journal.len() > mark {
            let Some(u) = self.journal.pop() else { break };
            let i = u.n as usize;
            self.cpus[i] = u.cpus;
            self.mem[i] = u.mem;
            self.acc[i] = u.acc;
            if let Some(from) = u.from {
                self.unbucket(t, u.n, from);
            }
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

    /// Usable nodes that may hold a replica of `d` now, in no particular order: for an
    /// accelerator need, those with at least `d.acc` free accelerators of its type (no
    /// other node holds one, and taking capacity away cannot change that); for a CPU-only
    /// need, every usable node.
    pub fn candidates(&self, t: &NodeTable, d: &Need) -> Vec<NodeIx> {
        if d.acc_type == NO_ACC {
            return self.buckets.iter().flatten().flatten().copied().collect();
        }
        let c = d.acc_type as usize;
        if c >= t.acc_names.len() {
            return Vec::new();
        }
        self.buckets[c].iter().skip(d.acc.max(0) as usize).flatten().copied().collect()
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
    pub fn place_gang(&mut self, t: &NodeTable, shape: &Shape, limit: Option<&HashMap<NodeIx, Res>>) -> Option<Vec<NodeIx>> {
        self.place_gang_prefer(t, shape, limit, &[])
    }

    /// The same, trying the nodes of `prefer` first (best fit among them): a job that
    /// ends before a reservation goes onto the reserved nodes, keeping the others open.
    pub fn place_gang_prefer(
        &mut self,
        t: &NodeTable,
        shape: &Shape,
        limit: Option<&HashMap<NodeIx, Res>>,
        prefer: &[NodeIx],
    ) -> Option<Vec<NodeIx>> {
        if let Some(out) = self.place_in_order(t, shape, None, limit, prefer) {
            return Some(out);
        }
        // Replica order failed: a mixed gang may still fit largest first (the replicas
        // that need accelerators, then by their dominant share of the largest node), as a
        // small replica placed first can take the one node a large one needs.
        if shape.uniform {
            return None;
        }
        let order = t.largest_first(&shape.needs);
        if order.iter().enumerate().all(|(i, &o)| i == o) {
            return None;
        }
        self.place_in_order(t, shape, Some(&order), limit, prefer)
    }

    /// `place_gang`, and where that fails on a mixed gang, an exact search for a packing
    /// into the free capacity (within `limit`), bounded by `budget` nodes tried: the
    /// greedy passes can miss a packing that exists (a small replica placed first on the
    /// only node with the memory a large one needs). Identical replicas need no search:
    /// the greedy pass fills every free slot.
    pub fn place_gang_exact(
        &mut self,
        t: &NodeTable,
        shape: &Shape,
        limit: Option<&HashMap<NodeIx, Res>>,
        budget: u64,
    ) -> Option<Vec<NodeIx>> {
        if let Some(out) = self.place_gang(t, shape, limit) {
            return Some(out);
        }
        if shape.uniform {
            return None;
        }
        let free: Vec<Option<Res>> = (0..t.len())
            .map(|i| {
                if self.pos[i] == u32::MAX {
                    return None;
                }
                let f = Res::new(self.cpus[i], self.mem[i], self.acc[i]);
                Some(match limit.and_then(|l| l.get(&(i as NodeIx))) {
                    Some(cap) => f.min(*cap),
                    None => f,
                })
            })
            .collect();
        match exact_search(t, &free, &shape.needs, budget) {
            Search::Found(nodes) => {
                for (n, d) in nodes.iter().zip(&shape.needs) {
                    self.take(t, *n, d);
                }
                Some(nodes)
            }
            Search::Impossible | Search::Undecided => None,
        }
    }

    /// One greedy pass: the replicas in `order` (replica order without it), each on its
    /// best-fit node. The result is in replica order.
    fn place_in_order(
        &mut self,
        t: &NodeTable,
        shape: &Shape,
        order: Option<&[usize]>,
        limit: Option<&HashMap<NodeIx, Res>>,
        prefer: &[NodeIx],
    ) -> Option<Vec<NodeIx>> {
        let m = self.mark();
        let mut out = vec![0 as NodeIx; shape.needs.len()];
        let mut used: HashMap<NodeIx, Res> = HashMap::default();
        for k in 0..shape.needs.len() {
            let i = order.map_or(k, |o| o[k]);
            let d = &shape.needs[i];
            let picked = {
                let mut ok = |n: NodeIx| match limit.and_then(|l| l.get(&n)) {
                    None => true,
                    Some(cap) => (used.get(&n).copied().unwrap_or_default() + d.res()).within(*cap),
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
                        *used.entry(n).or_default() += d.res();
                    }
                    out[i] = n;
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

/// Memory in GiB, without trailing zeros: `16`, `3.75`.
pub fn gib_text(bytes: i64) -> String {
    let g = bytes as f64 / (1u64 << 30) as f64;
    let s = format!("{g:.2}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    s.to_string()
}

/// An amount of resources in words: `1 CPU and 3.75 GiB`, `8 CPUs, 30 GiB and 2 x NVIDIA_TESLA_T4`.
pub fn amount_text(cpus: i64, mem: i64, acc: Option<(&str, i64)>) -> String {
    let cpus = format!("{cpus} CPU{}", if cpus == 1 { "" } else { "s" });
    match acc {
        Some((name, count)) => format!("{cpus}, {} GiB and {count} x {name}", gib_text(mem)),
        None => format!("{cpus} and {} GiB", gib_text(mem)),
    }
}

/// Why a gang can never be placed: not even on the whole fleet with every node up and
/// empty (drained and down nodes come back; only a smaller configuration shrinks the
/// fleet). Capacity missing for other reasons is a stockout (L15), not this.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NeverFit {
    /// This replica (the first such) is larger than every node that could hold it.
    Replica(usize),
    /// Every replica fits some node alone, but the gang does not fit the fleet together.
    Gang,
}

impl NeverFit {
    /// What is missing, naming the largest node. For a replica: `needs 8 CPUs and 30 GiB,
    /// but the largest node (n1) has 4 CPUs and 16 GiB`; for a gang: `cannot be placed
    /// together on the fleet: 2 nodes of 4 CPUs and 16 GiB; the largest node (n1) has 4
    /// CPUs and 16 GiB`. `acc_name` names a replica's accelerator (the table knows only
    /// the types its nodes offer).
    pub fn detail(&self, t: &NodeTable, shape: &Shape, acc_name: &dyn Fn(usize) -> Option<String>) -> String {
        match *self {
            NeverFit::Replica(i) => {
                let Some(d) = shape.needs.get(i) else { return String::new() };
                let name = acc_name(i).unwrap_or_else(|| t.acc_name(d.acc_type).to_string());
                let acc = (d.acc_type != NO_ACC).then_some((name.as_str(), d.acc));
                let need = amount_text(d.cpus, d.mem, acc);
                let largest = |n: NodeIx| format!("({}) has {}", t.names[n as usize], t.node_text(n));
                match (d.acc_type == NO_ACC, t.largest_for(d)) {
                    (true, Some(n)) => format!("needs {need}, but the largest node {}", largest(n)),
                    (false, Some(n)) => format!("needs {need}, but the largest node with {name} {}", largest(n)),
                    (_, None) => match t.largest() {
                        Some(n) => format!("needs {need}, but no node offers {name}; the largest node {}", largest(n)),
                        None => format!("needs {need}, but the fleet has no nodes"),
                    },
                }
            }
            NeverFit::Gang => {
                let largest = t
                    .largest_for(&shape.max_need())
                    .or_else(|| t.largest())
                    .map(|n| format!("; the largest node ({}) has {}", t.names[n as usize], t.node_text(n)))
                    .unwrap_or_default();
                format!("cannot be placed together on the fleet: {}{largest}", t.fleet_text())
            }
        }
    }
}

/// How many nodes the scheduler's exact search may try for one gang before it gives up
/// (see [`Work::place_gang_exact`]).
pub const PLACE_SEARCH_BUDGET: u64 = 20_000;
/// How many nodes the never-fit check's exact search may try: a job is refused only when
/// the search shows that it cannot fit; undecided, it is accepted.
pub const PROOF_SEARCH_BUDGET: u64 = 200_000;
/// Gangs larger than this are not searched exactly (the totals still refuse them).
const EXACT_SEARCH_MAX_REPLICAS: usize = 512;

/// Can `shape` never be placed on the fleet of `t`, with every node up and empty? A
/// refusal is certain: a replica larger than every node, a gang larger than the fleet's
/// total CPUs, memory or accelerators of a type, or one that neither the scheduler's
/// placement (`Work::place_gang` on every node) nor an exact search (bounded by
/// [`PROOF_SEARCH_BUDGET`]) can pack. Deterministic, so the check at create and the
/// scheduler's later ones agree.
pub fn never_fits(t: &NodeTable, shape: &Shape) -> Option<NeverFit> {
    let needs = &shape.needs;
    if needs.is_empty() {
        return None;
    }
    // Each replica alone.
    let mut seen: Vec<Need> = Vec::new();
    for (i, d) in needs.iter().enumerate() {
        if seen.contains(d) {
            continue;
        }
        if !(0..t.len()).any(|n| t.holds(n, d)) {
            return Some(NeverFit::Replica(i));
        }
        seen.push(*d);
        if shape.uniform {
            break;
        }
    }
    // Identical replicas: the greedy placement fills every free slot, so the slots of the
    // empty fleet decide exactly.
    if shape.uniform {
        let d = &needs[0];
        let mut total = 0i64;
        for n in 0..t.len() {
            total = total.saturating_add(slots(t.cap_cpus[n], t.cap_mem[n], t.cap_acc[n], t.acc_type[n], d));
            if total >= needs.len() as i64 {
                return None;
            }
        }
        return Some(NeverFit::Gang);
    }
    // The scheduler's placement on the empty fleet, then the exact search (which also
    // refuses a gang above the fleet's totals at once).
    if Work::all(t).place_gang(t, shape, None).is_some() {
        return None;
    }
    let empty: Vec<Option<Res>> = (0..t.len()).map(|n| Some(t.cap(n))).collect();
    match exact_search(t, &empty, needs, PROOF_SEARCH_BUDGET) {
        Search::Impossible => Some(NeverFit::Gang),
        Search::Found(_) | Search::Undecided => None,
    }
}

/// What an exact search found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Search {
    /// A packing: `nodes[i]` holds replica i.
    Found(Vec<NodeIx>),
    /// No packing exists.
    Impossible,
    /// The budget ran out first.
    Undecided,
}

/// Does a packing of `needs` onto the empty nodes of `t` exist? None: undecided within
/// `budget` nodes tried.
pub fn exact_fit(t: &NodeTable, needs: &[Need], budget: u64) -> Option<bool> {
    let empty: Vec<Option<Res>> = (0..t.len()).map(|n| Some(t.cap(n))).collect();
    match exact_search(t, &empty, needs, budget) {
        Search::Found(_) => Some(true),
        Search::Impossible => Some(false),
        Search::Undecided => None,
    }
}

/// An exact search for a packing of `needs` into the free capacity `free` of each node
/// (CPUs, memory, accelerators; None: the node takes no work), within `budget` nodes
/// tried. Replicas are tried largest first; identical replicas go to nodes in increasing
/// order, and nodes in the same state are tried once (both cut only symmetric branches);
/// the remaining free totals bound each branch.
pub fn exact_search(t: &NodeTable, free: &[Option<Res>], needs: &[Need], budget: u64) -> Search {
    if needs.len() > EXACT_SEARCH_MAX_REPLICAS || free.len() != t.len() {
        return Search::Undecided;
    }
    // Kinds of replicas (equal needs), largest first, with their replica indices.
    let mut kinds: Vec<(Need, Vec<usize>)> = Vec::new();
    for i in t.largest_first(needs) {
        match kinds.iter_mut().find(|(d, _)| *d == needs[i]) {
            Some(k) => k.1.push(i),
            None => kinds.push((needs[i], vec![i])),
        }
    }
    let dims = 2 + t.acc_names.len();
    let mut s = Exact {
        t,
        counts: kinds.iter().map(|k| k.1.len()).collect(),
        kinds: kinds.iter().map(|k| k.0).collect(),
        open: free.iter().map(Option::is_some).collect(),
        free: free.iter().map(|f| f.unwrap_or_default()).collect(),
        have: vec![0; dims],
        want: vec![0; dims],
        path: Vec::with_capacity(needs.len()),
        budget,
    };
    for n in 0..t.len() {
        if !s.open[n] {
            continue;
        }
        let f = s.free[n];
        s.have[0] = s.have[0].saturating_add(f.cpus);
        s.have[1] = s.have[1].saturating_add(f.mem);
        if t.acc_type[n] != NO_ACC {
            let a = 2 + t.acc_type[n] as usize;
            s.have[a] = s.have[a].saturating_add(f.acc);
        }
    }
    for (d, reps) in &kinds {
        if d.acc_type != NO_ACC && d.acc_type as usize >= t.acc_names.len() {
            return Search::Impossible; // an accelerator no node offers
        }
        let k = reps.len() as i64;
        s.want[0] = s.want[0].saturating_add(k.saturating_mul(d.cpus));
        s.want[1] = s.want[1].saturating_add(k.saturating_mul(d.mem));
        if d.acc_type != NO_ACC {
            let a = 2 + d.acc_type as usize;
            s.want[a] = s.want[a].saturating_add(k.saturating_mul(d.acc));
        }
    }
    if s.want.iter().zip(&s.have).any(|(w, h)| w > h) {
        // (Saturated sums are compared here, before any placement moves them.)
        return Search::Impossible;
    }
    let first = s.counts.first().copied().unwrap_or(0);
    match s.search(0, first, 0) {
        Some(true) => {
            let mut out = vec![0 as NodeIx; needs.len()];
            let mut path = s.path.iter();
            for (_, reps) in &kinds {
                for &i in reps {
                    out[i] = *path.next().unwrap_or(&0);
                }
            }
            Search::Found(out)
        }
        Some(false) => Search::Impossible,
        None => Search::Undecided,
    }
}

struct Exact<'a> {
    t: &'a NodeTable,
    kinds: Vec<Need>,
    counts: Vec<usize>,
    open: Vec<bool>,
    free: Vec<Res>,
    /// Free totals of the open nodes, and what the replicas not yet placed want: CPUs,
    /// memory, then accelerators per type.
    have: Vec<i64>,
    want: Vec<i64>,
    /// The nodes chosen so far, kind after kind.
    path: Vec<NodeIx>,
    budget: u64,
}

impl Exact<'_> {
    /// Place the `left` remaining replicas of kind `kind` (on nodes from `from` on), then
    /// the later kinds. None: out of budget.
    fn search(&mut self, kind: usize, left: usize, from: usize) -> Option<bool> {
        if left == 0 {
            let next = kind + 1;
            return match self.counts.get(next) {
                None => Some(true),
                Some(&k) => self.search(next, k, 0),
            };
        }
        if self.want.iter().zip(&self.have).any(|(w, h)| w > h) {
            return Some(false);
        }
        let d = self.kinds[kind];
        let mut tried: HashSet<(u16, Res)> = HashSet::default();
        for n in from..self.t.len() {
            if self.budget == 0 {
                return None;
            }
            self.budget -= 1;
            let f = self.free[n];
            let ty = self.t.acc_type[n];
            if !self.open[n] || (d.acc_type != NO_ACC && ty != d.acc_type) || !d.res().within(f) || !tried.insert((ty, f)) {
                continue;
            }
            self.free[n] = f - d.res();
            self.move_totals(&d, ty, -1);
            self.path.push(n as NodeIx);
            let r = self.search(kind, left - 1, n);
            if r == Some(true) {
                return r;
            }
            self.path.pop();
            self.move_totals(&d, ty, 1);
            self.free[n] = f;
            r?;
        }
        Some(false)
    }

    /// One replica of `d` placed (`sign` -1) on or taken back (+1) from a node of
    /// accelerator type `ty`.
    fn move_totals(&mut self, d: &Need, ty: u16, sign: i64) {
        self.have[0] += sign * d.cpus;
        self.have[1] += sign * d.mem;
        self.want[0] += sign * d.cpus;
        self.want[1] += sign * d.mem;
        if d.acc_type != NO_ACC {
            self.have[2 + ty as usize] += sign * d.acc;
            self.want[2 + d.acc_type as usize] += sign * d.acc;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn node(i: usize, gpus: u32) -> Node {
        let mut accelerators = BTreeMap::new();
        if gpus > 0 {
            accelerators.insert("NVIDIA_TESLA_T4".to_string(), gpus);
        }
        Node { name: format!("n{i}"), cpus: 16, memory_bytes: 64 << 30, accelerators, up: true, schedulable: i % 7 != 3 }
    }

    /// Free CPUs, memory and accelerators, the buckets, positions and levels.
    type State = (Vec<i64>, Vec<i64>, Vec<i64>, Vec<Vec<Vec<NodeIx>>>, Vec<u32>, Vec<u32>);

    /// Everything a placement reads: amounts, buckets and the order within them.
    fn state(w: &Work) -> State {
        (w.cpus.clone(), w.mem.clone(), w.acc.clone(), w.buckets.clone(), w.pos.clone(), w.level.clone())
    }

    /// A rollback restores the exact state, bucket order included, so a round that works
    /// on the cluster's own free capacity and rolls it back leaves it as it found it.
    #[test]
    fn rollback_restores_bucket_order_exactly() {
        let fleet = Fleet { nodes: (0..40).map(|i| node(i, [0, 1, 4, 8][i % 4])).collect(), overcommit: false };
        let t = NodeTable::new(&fleet);
        let mut w = Work::new(&t);
        let mut rng = crate::rng::Rng::new(0x5EED);
        let mut rnd = move |m: u64| rng.below(m as usize) as u64;
        let gpu = Need { cpus: 1, mem: 1 << 30, acc_type: 0, acc: 1 };
        let cpu = Need { cpus: 2, mem: 1 << 30, acc_type: NO_ACC, acc: 0 };
        for round in 0..50 {
            // A history that is not the build order, committed.
            for _ in 0..10 {
                let n = rnd(40) as NodeIx;
                let d = if rnd(2) == 0 { gpu } else { cpu };
                if w.fits(&t, n, &d) {
                    w.take(&t, n, &d);
                } else {
                    w.give(&t, n, &d);
                }
            }
            w.commit();
            let before = state(&w);
            let m = w.mark();
            for _ in 0..(round % 30) {
                let n = rnd(40) as NodeIx;
                match rnd(3) {
                    0 => w.take(&t, n, &gpu),
                    1 => w.give(&t, n, &cpu),
                    _ => w.set(&t, n, 0, 0, 0),
                }
            }
            let shape = Shape::new(vec![gpu; 1 + rnd(6) as usize]);
            let _ = w.place_gang(&t, &shape, None);
            w.rollback(&t, m);
            assert_eq!(state(&w), before, "round {round}");
        }
    }
}
