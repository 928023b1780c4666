//! Per-project storage limits (`[quotas.default] storage_gb`, `[quotas.projects.P]
//! storage_gb`): how many bytes each project's namespace of the storage root holds, and
//! whether an upload fits.
//!
//! A namespace's size is the sum of the sizes of its regular files, found by a walk that
//! follows no link and never recurses (a tenant shapes the tree), plus its uploads under
//! way. Walks are cached for [`FRESH`]; an upload through the API adds its bytes to the
//! cached size at once, and what jobs write is seen at the next walk.
//!
//! An upload **reserves** its bytes before it writes them ([`StorageUsage::reserve`]): its
//! declared length when it starts, then its bytes as they arrive. What is reserved counts
//! for every other upload of the project, so concurrent uploads cannot pass the limit
//! together. A resumable session's bytes stay reserved from chunk to chunk until it is
//! published, cancelled or expired; a walk finds the sessions' data files on disk
//! (the server's own uploads directory, left out of the objects' walk), so that they count
//! after a restart too. The API refuses an upload that would pass the
//! limit (429); a job's writes cannot be refused on an ordinary filesystem, so the
//! watcher ([`watch`]) walks the limited namespaces every [`WATCH_EVERY`] and reports the
//! projects over their limit, whose running jobs the driver then stops.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, RwLock};
use std::time::{Duration, Instant};

/// Per-project limits of stored bytes (`storage_gb`, in GiB), from the quotas tables
/// (`[quotas.projects.P] storage_gb`, read by `config`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StorageLimits {
    pub default: Option<u64>,
    pub projects: std::collections::BTreeMap<String, u64>,
}

impl StorageLimits {
    /// The bytes `project` may store, if limited.
    pub fn limit(&self, project: &str) -> Option<u64> {
        self.projects.get(project).copied().or(self.default)
    }
}


/// How long a walked size is used before the namespace is walked again.
pub const FRESH: Duration = Duration::from_secs(10);
/// How often the watcher looks at the limited namespaces.
pub const WATCH_EVERY: Duration = Duration::from_secs(15);

/// The limits in force and the sizes last seen.
#[derive(Debug)]
pub struct StorageUsage {
    root: PathBuf,
    limits: RwLock<StorageLimits>,
    sizes: Mutex<HashMap<String, (u64, Instant)>>,
    /// Per project, the bytes of its uploads under way, by upload (`upload:ID` for a
    /// single request, `session:ID` for a resumable session).
    pending: Mutex<HashMap<String, HashMap<String, u64>>>,
}

/// The key of a resumable session's reservation.
pub fn session_reservation(id: &str) -> String {
    format!("session:{id}")
}

/// A project over (or about to pass) its limit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Full {
    pub project: String,
    pub used: u64,
    pub limit: u64,
}

impl Full {
    /// What the project is told: its size, its limit and where the limit is set.
    pub fn message(&self, adding: Option<u64>) -> String {
        let adding = adding.map(|n| format!(" and this upload adds {}", shown(n))).unwrap_or_default();
        format!(
            "Project \"{}\" stores {} of its storage limit of {} (storage_gb of [quotas.default] or \
             [quotas.projects.{}]){adding}; delete objects to make room.",
            self.project,
            shown(self.used),
            shown(self.limit),
            self.project
        )
    }
}

/// Bytes in GiB with two decimals (and the bytes, below 1 GiB).
pub fn shown(bytes: u64) -> String {
    let gib = bytes as f64 / trainyard_core::catalog::GIB as f64;
    if bytes < trainyard_core::catalog::GIB {
        format!("{gib:.2} GiB ({bytes} bytes)")
    } else {
        format!("{gib:.2} GiB")
    }
}

impl StorageUsage {
    pub fn new(root: PathBuf, limits: StorageLimits) -> StorageUsage {
        StorageUsage { root, limits: RwLock::new(limits), sizes: Mutex::new(HashMap::new()), pending: Mutex::new(HashMap::new()) }
    }

    /// The bytes of `project`'s uploads under way.
    fn pending_total(&self, project: &str) -> u64 {
        let pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        pending.get(project).map_or(0, |m| m.values().fold(0u64, |a, b| a.saturating_add(*b)))
    }

    /// Reserve `bytes` for the upload `key` of `project` (its total so far: a reservation
    /// only grows), or say that the project's objects, its other uploads under way and
    /// these bytes would pass its limit. No limit: nothing is kept. Does not walk: the
    /// size last seen is used ([`Self::used`] is called when an upload starts).
    pub fn reserve(&self, project: &str, key: &str, bytes: u64) -> Result<(), Full> {
        let Some(limit) = self.limit(project) else { return Ok(()) };
        let objects = self.sizes.lock().unwrap_or_else(|p| p.into_inner()).get(project).map_or(0, |(n, _)| *n);
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        let mine = pending.entry(project.to_string()).or_default();
        let held = mine.get(key).copied().unwrap_or(0);
        if bytes <= held {
            return Ok(());
        }
        let others = mine.iter().filter(|(k, _)| k.as_str() != key).fold(0u64, |a, (_, b)| a.saturating_add(*b));
        let used = objects.saturating_add(others);
        if used.saturating_add(bytes) > limit {
            return Err(Full { project: project.to_string(), used: used.saturating_add(held), limit });
        }
        mine.insert(key.to_string(), bytes);
        Ok(())
    }

    /// The upload `key` of `project` ended (published: its bytes were [`added`](Self::added)
    /// first; or given up).
    pub fn release(&self, project: &str, key: &str) {
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(m) = pending.get_mut(project) {
            m.remove(key);
            if m.is_empty() {
                pending.remove(project);
            }
        }
    }

    /// The resumable sessions' data on disk, as the walk found it: each session reserves
    /// at least that (more while a chunk is arriving), and sessions gone from disk
    /// (published, cancelled, expired) reserve nothing.
    fn sessions_seen(&self, project: &str, on_disk: HashMap<String, u64>) {
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        let mine = pending.entry(project.to_string()).or_default();
        mine.retain(|k, _| !k.starts_with("session:") || on_disk.contains_key(k));
        for (k, n) in on_disk {
            let v = mine.entry(k).or_insert(0);
            *v = (*v).max(n);
        }
        if mine.is_empty() {
            pending.remove(project);
        }
    }

    /// The limits read again (`POST /v1/admin/quotas:reload`).
    pub fn set_limits(&self, limits: StorageLimits) {
        *self.limits.write().unwrap_or_else(|p| p.into_inner()) = limits;
    }

    pub fn limit(&self, project: &str) -> Option<u64> {
        self.limits.read().unwrap_or_else(|p| p.into_inner()).limit(project)
    }

    /// Whether any project has a limit (else nothing is walked).
    pub fn any_limit(&self) -> bool {
        let l = self.limits.read().unwrap_or_else(|p| p.into_inner());
        l.default.is_some() || !l.projects.is_empty()
    }

    /// The bytes `project` stores and has reserved (walked when the last walk is older
    /// than [`FRESH`]). Blocking: call it off the async executor.
    pub fn used(&self, project: &str) -> u64 {
        let cached = self.sizes.lock().unwrap_or_else(|p| p.into_inner()).get(project).copied();
        let objects = match cached {
            Some((n, at)) if at.elapsed() < FRESH => n,
            _ => {
                let ns = self.root.join(project);
                let n = namespace_size(&ns);
                self.sessions_seen(project, session_sizes(&ns));
                self.sizes.lock().unwrap_or_else(|p| p.into_inner()).insert(project.to_string(), (n, Instant::now()));
                n
            }
        };
        objects.saturating_add(self.pending_total(project))
    }

    /// An upload of `bytes` to `project` was stored.
    pub fn added(&self, project: &str, bytes: u64) {
        if let Some((n, _)) = self.sizes.lock().unwrap_or_else(|p| p.into_inner()).get_mut(project) {
            *n = n.saturating_add(bytes);
        }
    }

    /// The room `project` has left (None: no limit), or that it is full. Blocking.
    pub fn room(&self, project: &str) -> Result<Option<u64>, Full> {
        let Some(limit) = self.limit(project) else { return Ok(None) };
        let used = self.used(project);
        if used >= limit {
            return Err(Full { project: project.to_string(), used, limit });
        }
        Ok(Some(limit - used))
    }

    /// The projects (namespaces of the storage root) and their sizes, limited ones walked
    /// as [`used`](Self::used) does; unlimited ones are listed with the size last seen, if
    /// any. Blocking.
    pub fn report(&self) -> Vec<(String, u64, Option<u64>)> {
        let mut out = Vec::new();
        for project in self.projects() {
            let limit = self.limit(&project);
            let used = match limit {
                Some(_) => self.used(&project),
                None => self.sizes.lock().unwrap_or_else(|p| p.into_inner()).get(&project).map(|(n, _)| *n).unwrap_or(0)
                    + self.pending_total(&project),
            };
            if limit.is_some() || used > 0 {
                out.push((project, used, limit));
            }
        }
        out
    }

    /// The projects over their limit now. Blocking.
    pub fn over(&self) -> Vec<Full> {
        if !self.any_limit() {
            return Vec::new();
        }
        self.projects()
            .into_iter()
            .filter_map(|p| {
                let limit = self.limit(&p)?;
                let used = self.used(&p);
                (used > limit).then_some(Full { project: p, used, limit })
            })
            .collect()
    }

    /// The namespaces of the storage root (its directories not starting with a dot).
    fn projects(&self) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(&self.root) else { return Vec::new() };
        let mut out: Vec<String> = entries
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| !n.starts_with('.'))
            .collect();
        out.sort();
        out
    }
}

/// The sum of the sizes of the regular files below `dir`: iterative, links not followed
/// (a link counts as nothing), one directory open at a time. The server's uploads
/// directory is left out: uploads under way count by their reservations.
pub fn namespace_size(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0u64;
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else { continue };
        for e in entries.flatten() {
            if d.as_path() == dir && e.file_name() == super::fsops::UPLOADS_DIR {
                continue;
            }
            let Ok(m) = std::fs::symlink_metadata(e.path()) else { continue };
            let t = m.file_type();
            if t.is_dir() {
                todo.push(e.path());
            } else if t.is_file() {
                total = total.saturating_add(m.size());
            }
        }
    }
    total
}

/// The resumable sessions' data files in a namespace's uploads directory (`ID.part`), by
/// their reservation's key.
fn session_sizes(ns: &Path) -> HashMap<String, u64> {
    let Ok(entries) = std::fs::read_dir(ns.join(super::fsops::UPLOADS_DIR)) else { return HashMap::new() };
    entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let id = name.strip_suffix(".part")?;
            let m = std::fs::symlink_metadata(e.path()).ok().filter(|m| m.file_type().is_file())?;
            Some((session_reservation(id), std::os::unix::fs::MetadataExt::size(&m)))
        })
        .collect()
}

/// Every [`WATCH_EVERY`], the projects over their limit go to `report` (on a thread of
/// its own; it ends when `report` says so).
pub fn watch(usage: std::sync::Arc<StorageUsage>, report: impl Fn(Vec<Full>) -> bool + Send + 'static) {
    let spawned = std::thread::Builder::new().name("storage-usage".into()).spawn(move || {
        // See `tree::private_descriptors`: the tenants' directories it opens stay its own.
        if let Err(e) = trainyard_backend::tree::private_descriptors() {
            tracing::warn!("storage limits: the watcher has no descriptor table of its own: {e}");
        }
        loop {
            std::thread::sleep(WATCH_EVERY);
            // A walk that panics (a defect) is skipped, not the end of the watching.
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| usage.over())) {
                Ok(full) => {
                    if !report(full) {
                        return;
                    }
                }
                Err(_) => tracing::error!("storage limits: a walk of the namespaces panicked; tried again in {WATCH_EVERY:?}"),
            }
        }
    });
    if let Err(e) = spawned {
        tracing::error!("storage limits: cannot start the thread that watches them ({e}); jobs' writes are not checked");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_namespace_is_summed_without_following_links_or_recursing() {
        let t = tempfile::tempdir().unwrap();
        let ns = t.path().join("p");
        std::fs::create_dir_all(ns.join("b/deep")).unwrap();
        std::fs::write(ns.join("b/one"), vec![0u8; 1000]).unwrap();
        std::fs::write(ns.join("b/deep/two"), vec![0u8; 24]).unwrap();
        std::fs::write(t.path().join("outside"), vec![0u8; 5000]).unwrap();
        std::os::unix::fs::symlink(t.path().join("outside"), ns.join("b/link")).unwrap();
        std::os::unix::fs::symlink(t.path(), ns.join("b/loop")).unwrap();
        let mut deep = ns.join("b/deep");
        for _ in 0..1500 {
            deep = deep.join("d");
        }
        std::fs::create_dir_all(&deep).unwrap();
        std::fs::write(deep.join("f"), b"x").unwrap();
        assert_eq!(namespace_size(&ns), 1025);
    }

    #[test]
    fn room_is_the_limit_minus_what_is_stored_and_uploads_count_at_once() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(t.path().join("p/b")).unwrap();
        std::fs::write(t.path().join("p/b/o"), vec![0u8; 600]).unwrap();
        let limits = StorageLimits { default: Some(1000), projects: [("free".to_string(), 5000)].into() };
        let u = StorageUsage::new(t.path().to_path_buf(), limits);
        assert_eq!(u.room("p"), Ok(Some(400)));
        assert_eq!(u.room("free"), Ok(Some(5000)));
        u.added("p", 450);
        let full = u.room("p").unwrap_err();
        assert_eq!((full.used, full.limit), (1050, 1000));
        assert!(full.message(None).contains("storage_gb"), "{}", full.message(None));
        assert_eq!(u.over(), vec![Full { project: "p".into(), used: 1050, limit: 1000 }]);
        u.set_limits(StorageLimits::default());
        assert_eq!(u.room("p"), Ok(None));
        assert!(u.over().is_empty());
    }

    #[test]
    fn uploads_under_way_reserve_their_bytes_and_sessions_on_disk_count() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(t.path().join("p/b")).unwrap();
        std::fs::write(t.path().join("p/b/o"), vec![0u8; 100]).unwrap();
        let limits = StorageLimits { default: Some(1000), projects: Default::default() };
        let u = StorageUsage::new(t.path().to_path_buf(), limits);
        assert_eq!(u.used("p"), 100);
        // Two uploads of 500 declared at once: the first is reserved, the second would
        // pass the limit with it.
        u.reserve("p", "upload:a", 500).expect("first");
        let full = u.reserve("p", "upload:b", 500).unwrap_err();
        assert_eq!((full.used, full.limit), (600, 1000));
        assert_eq!(u.used("p"), 600, "what is reserved is in use");
        u.reserve("p", "upload:b", 400).expect("what is left");
        assert!(u.reserve("p", "upload:a", 300).is_ok(), "a reservation never shrinks by a smaller total");
        assert!(u.reserve("p", "upload:a", 501).is_err());
        // The first is published (its bytes are the object's now) and reserves no more.
        u.added("p", 500);
        u.release("p", "upload:a");
        assert_eq!(u.used("p"), 1000);
        u.release("p", "upload:b");
        // A resumable session's data on disk counts after a walk (a restart: nothing in
        // memory), and no longer once its files are gone.
        let ups = t.path().join("p").join(super::super::fsops::UPLOADS_DIR);
        std::fs::create_dir_all(&ups).unwrap();
        std::fs::write(ups.join("s1.part"), vec![0u8; 300]).unwrap();
        std::fs::write(ups.join("tmp-x"), vec![0u8; 50]).unwrap();
        let again = StorageUsage::new(t.path().to_path_buf(), StorageLimits { default: Some(1000), projects: Default::default() });
        assert_eq!(again.used("p"), 100 + 300, "objects and the open session; a temporary file is an upload's, reserved by it");
        assert!(again.reserve("p", "upload:c", 601).is_err());
        again.reserve("p", &session_reservation("s1"), 350).expect("the session grows");
        std::fs::remove_file(ups.join("s1.part")).unwrap();
        again.sizes.lock().unwrap().clear();
        assert_eq!(again.used("p"), 100, "a session gone from disk reserves nothing");
    }
}
