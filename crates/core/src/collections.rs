//! Hash maps and sets of the scheduler's hot paths. Their keys are node indexes, job ids
//! and project names that Trainyard itself holds, and a round on a large fleet looks them
//! up millions of times: a fast hash with a fixed seed (foldhash) instead of SipHash with
//! a random one. The fixed seed also makes their iteration order the same on every run.

/// A `HashMap` with foldhash's fixed-seed hasher; build with `HashMap::default()`.
pub type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::FixedState>;

/// A `HashSet` with foldhash's fixed-seed hasher; build with `HashSet::default()`.
pub type HashSet<K> = std::collections::HashSet<K, foldhash::fast::FixedState>;
