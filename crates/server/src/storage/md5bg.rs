//! MD5s computed after the commit. An upload whose client sent no MD5 is committed with
//! its CRC32C only and answered at once: MD5 costs several times what receiving and
//! writing the bytes does. One worker thread of the process then reads the committed file
//! and keeps its MD5 in the object's metadata, unless the name was written again or
//! deleted meanwhile ([`fsops::record_md5`]). Until then the object has no `md5Hash`,
//! as a composite object of the service has none: clients check such objects with their
//! CRC32C.
//!
//! Nothing of the queue is kept on disk. An object whose MD5 was never computed (the
//! queue was full, or the server stopped first) has fresh metadata with a CRC32C and no
//! MD5 ([`super::meta::ObjectInfo::md5_pending`]); reading it (its metadata, a listing
//! that shows it, or its bytes) asks for its MD5 again. That is enough: the MD5 can only
//! be seen by reading the object, and a read is never slowed by it.

use std::collections::HashSet;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};

use super::error::GcsError;
use super::fsops::{self, Ns, Recorded};

/// Objects waiting for their MD5, at most; more are left to be asked for again when read.
const QUEUE: usize = 1024;

/// An object whose MD5 is wanted: its project, bucket and name.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct Job {
    pub project: String,
    pub bucket: String,
    pub name: String,
}

#[derive(Debug, thiserror::Error)]
pub enum Md5Error {
    #[error("cannot open {what} of {job}: {message}")]
    Open { what: &'static str, job: String, message: String },
    #[error("cannot read {job} to compute its MD5: {source}")]
    Read { job: String, source: std::io::Error },
    #[error("cannot keep the MD5 of {job}: {message}")]
    Record { job: String, message: String },
}

impl std::fmt::Display for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "gs://{}/{} (project {})", self.bucket, self.name, self.project)
    }
}

/// The process's MD5 worker: a bounded queue and one thread, started with the first job.
pub struct Md5Worker {
    root: PathBuf,
    tx: Mutex<Option<SyncSender<Job>>>,
    /// Jobs in the queue (not yet started): the same object is queued once.
    queued: Arc<Mutex<HashSet<Job>>>,
}

impl Md5Worker {
    pub fn new(root: PathBuf) -> Md5Worker {
        Md5Worker { root, tx: Mutex::new(None), queued: Arc::new(Mutex::new(HashSet::new())) }
    }

    /// Ask for the MD5 of an object; never waits. Dropped when the queue is full (the
    /// object is asked for again when next read).
    pub fn request(&self, project: &str, bucket: &str, name: &str) {
        let job = Job { project: project.into(), bucket: bucket.into(), name: name.into() };
        let Some(tx) = self.sender() else { return };
        if !lock(&self.queued).insert(job.clone()) {
            return;
        }
        match tx.try_send(job) {
            Ok(()) => {}
            Err(TrySendError::Full(job) | TrySendError::Disconnected(job)) => {
                lock(&self.queued).remove(&job);
            }
        }
    }

    /// The queue's sender, the thread started when there is none yet.
    fn sender(&self) -> Option<SyncSender<Job>> {
        let mut tx = lock(&self.tx);
        if let Some(t) = tx.as_ref() {
            return Some(t.clone());
        }
        let (t, rx) = std::sync::mpsc::sync_channel::<Job>(QUEUE);
        let (root, queued) = (self.root.clone(), Arc::clone(&self.queued));
        match std::thread::Builder::new().name("storage-md5bg".into()).spawn(move || run(&root, rx, &queued)) {
            Ok(_) => {
                *tx = Some(t.clone());
                Some(t)
            }
            Err(e) => {
                tracing::warn!("storage: cannot start the MD5 worker now ({e}); MD5s are computed when objects are read");
                None
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn run(root: &Path, rx: Receiver<Job>, queued: &Mutex<HashSet<Job>>) {
    crate::priority::background_thread();
    for job in rx {
        // Out of the queue before it starts: a write of the name from now on is hashed
        // by a job of its own.
        lock(queued).remove(&job);
        match compute(root, &job) {
            Ok(Recorded::Yes) => tracing::debug!("storage: MD5 of {job} computed"),
            Ok(Recorded::Superseded) => tracing::debug!("storage: MD5 of {job} not kept: the object changed meanwhile"),
            Err(e) => tracing::warn!("storage: {e}"),
        }
    }
}

/// An object's file as hashed: the open file, its generation and its MD5.
pub struct Hashed {
    pub file: File,
    pub generation: i64,
    pub md5: String,
}

/// Compute and keep the MD5 of the job's object.
pub fn compute(root: &Path, job: &Job) -> Result<Recorded, Md5Error> {
    match hash(root, job)? {
        None => Ok(Recorded::Superseded),
        Some(h) => record(root, job, &h),
    }
}

fn open_bucket(root: &Path, job: &Job) -> Result<Option<std::os::fd::OwnedFd>, Md5Error> {
    let err = |what: &'static str| move |e: GcsError| Md5Error::Open { what, job: job.to_string(), message: e.message };
    let Some(ns) = Ns::open(root, &job.project, false, None).map_err(err("the namespace"))? else { return Ok(None) };
    ns.bucket(&job.bucket).map_err(err("the bucket"))
}

/// The MD5 of the job's object as it is now; None when there is nothing to compute (no
/// such object, or its MD5 is known, or it is not a committed upload).
pub fn hash(root: &Path, job: &Job) -> Result<Option<Hashed>, Md5Error> {
    let Some(bucket) = open_bucket(root, job)? else { return Ok(None) };
    let opened = fsops::open_object(std::os::fd::AsFd::as_fd(&bucket), &job.name)
        .map_err(|e| Md5Error::Open { what: "the object", job: job.to_string(), message: e.message })?;
    let Some(o) = opened else { return Ok(None) };
    if !o.info.md5_pending() {
        return Ok(None);
    }
    let md5 = super::upload::md5_of_file(&o.file, o.info.size).map_err(|source| Md5Error::Read { job: job.to_string(), source })?;
    Ok(Some(Hashed { file: o.file, generation: o.info.generation, md5 }))
}

/// Keep a computed MD5, if its object is still the one hashed.
pub fn record(root: &Path, job: &Job, h: &Hashed) -> Result<Recorded, Md5Error> {
    let Some(bucket) = open_bucket(root, job)? else { return Ok(Recorded::Superseded) };
    fsops::record_md5(std::os::fd::AsFd::as_fd(&bucket), &job.name, &h.file, h.generation, &h.md5)
        .map_err(|e| Md5Error::Record { job: job.to_string(), message: e.message })
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::os::fd::AsFd;
    use std::time::{Duration, Instant};

    use md5::Digest as _;

    use super::*;
    use crate::storage::fsops::{Preconditions, TempFile};
    use crate::storage::meta::{self, StoredMeta};

    struct Store {
        dir: tempfile::TempDir,
        ns: Ns,
        bucket: std::os::fd::OwnedFd,
        n: u32,
    }

    impl Store {
        /// A namespace `p` with a bucket `bkt`; None where the file system keeps no
        /// user attributes (then no object has hashes, and there is nothing to test).
        fn new() -> Option<Store> {
            let dir = tempfile::tempdir().expect("tempdir");
            let ns = Ns::open(dir.path(), "p", true, None).expect("namespace").expect("made");
            assert!(ns.create_bucket("bkt").expect("bucket"));
            let bucket = ns.bucket("bkt").expect("bucket").expect("exists");
            let mut s = Store { dir, ns, bucket, n: 0 };
            s.upload("probe", b"x");
            let probe = fsops::open_object(s.bucket.as_fd(), "probe").expect("open").expect("exists");
            probe.info.crc32c.is_some().then_some(s)
        }

        /// Commit `data` as `name` as an upload without a client MD5 does.
        fn upload(&mut self, name: &str, data: &[u8]) -> i64 {
            self.n += 1;
            let mut tmp = TempFile::create(self.ns.uploads().expect("uploads"), format!("tmp-{}", self.n)).expect("temp");
            tmp.file.write_all(data).expect("write");
            let mut h = meta::Hashes::new(false);
            h.update(data);
            let m = StoredMeta { crc32c: Some(h.finish().0), ..Default::default() };
            tmp.publish(self.bucket.as_fd(), name, None, m, &Preconditions::default()).expect("publish").generation
        }

        fn md5_of(&self, name: &str) -> Option<String> {
            fsops::open_object(self.bucket.as_fd(), name).expect("open").and_then(|o| o.info.md5)
        }

        fn job(&self, name: &str) -> Job {
            Job { project: "p".into(), bucket: "bkt".into(), name: name.into() }
        }
    }

    fn md5_b64(data: &[u8]) -> String {
        meta::md5_b64(md5::Md5::new_with_prefix(data))
    }

    #[test]
    fn the_md5_of_a_committed_object_is_computed_and_kept() {
        let Some(mut s) = Store::new() else { return };
        let data: Vec<u8> = (0..(9 << 20)).map(|i: u32| (i * 7 % 251) as u8).collect();
        s.upload("dir/big", &data);
        assert_eq!(s.md5_of("dir/big"), None);
        assert_eq!(compute(s.dir.path(), &s.job("dir/big")).expect("compute"), Recorded::Yes);
        assert_eq!(s.md5_of("dir/big"), Some(md5_b64(&data)));
        // Known now: nothing more to compute.
        assert!(hash(s.dir.path(), &s.job("dir/big")).expect("hash").is_none());
        assert!(hash(s.dir.path(), &s.job("no/such")).expect("hash").is_none());
    }

    #[test]
    fn a_newer_write_or_a_delete_wins_over_an_md5_being_computed() {
        let Some(mut s) = Store::new() else { return };
        let root = s.dir.path().to_path_buf();
        s.upload("x", b"old bytes");
        let old = hash(&root, &s.job("x")).expect("hash").expect("pending");
        assert_eq!(old.md5, md5_b64(b"old bytes"));
        // Written again while the old bytes were hashed: their MD5 is not kept.
        s.upload("x", b"new bytes");
        assert_eq!(record(&root, &s.job("x"), &old).expect("record"), Recorded::Superseded);
        assert_eq!(s.md5_of("x"), None);
        assert_eq!(compute(&root, &s.job("x")).expect("compute"), Recorded::Yes);
        assert_eq!(s.md5_of("x"), Some(md5_b64(b"new bytes")));

        // Deleted meanwhile.
        s.upload("y", b"y");
        let y = hash(&root, &s.job("y")).expect("hash").expect("pending");
        assert!(fsops::delete_object(s.bucket.as_fd(), "y", |_| Ok(())).expect("delete"));
        assert_eq!(record(&root, &s.job("y"), &y).expect("record"), Recorded::Superseded);

        // Changed in place (a job wrote the file) meanwhile.
        s.upload("z", b"zzz");
        let z = hash(&root, &s.job("z")).expect("hash").expect("pending");
        std::thread::sleep(Duration::from_millis(5));
        std::fs::write(root.join("p/bkt/z"), b"ZZZ").expect("write in place");
        assert_eq!(record(&root, &s.job("z"), &z).expect("record"), Recorded::Superseded);
        assert_eq!(s.md5_of("z"), None);
    }

    #[test]
    fn the_worker_computes_what_is_asked() {
        let Some(mut s) = Store::new() else { return };
        let w = Md5Worker::new(s.dir.path().to_path_buf());
        for i in 0..5 {
            s.upload(&format!("o{i}"), format!("bytes {i}").as_bytes());
            w.request("p", "bkt", &format!("o{i}"));
            // Asked twice: queued once, or computed twice to the same end.
            w.request("p", "bkt", &format!("o{i}"));
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        for i in 0..5 {
            while s.md5_of(&format!("o{i}")).is_none() {
                assert!(Instant::now() < deadline, "o{i} got no MD5");
                std::thread::sleep(Duration::from_millis(10));
            }
            assert_eq!(s.md5_of(&format!("o{i}")), Some(md5_b64(format!("bytes {i}").as_bytes())));
        }
    }
}
