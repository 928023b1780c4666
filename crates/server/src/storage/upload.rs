//! Uploads: request bodies streamed to a file of the uploads directory by a blocking
//! writer (constant memory: at most a few of the connection's buffers in flight), with
//! the checksums computed on the way; and resumable sessions, kept on disk
//! (`<id>.json`, the session; `<id>.part`, the bytes received) so that they outlive a
//! restart, and removed once abandoned for `upload_expiry`.

use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use md5::Digest as _;
use nix::fcntl::{AtFlags, OFlag};
use nix::unistd::UnlinkatFlags;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::error::{GcsError, GcsResult};
use super::fsops::{Preconditions, TempFile};
use super::meta::{Expected, Hashes, StoredMeta};

/// Chunks in flight between the connection and the writer.
const IN_FLIGHT: usize = 4;

/// Where a writer keeps its checksums: its own (one request), or a resumable session's,
/// held locked until the writer is done (a new request of the session waits for it).
pub enum HashSink {
    Own(Hashes),
    Session(tokio::sync::OwnedMutexGuard<SessionMem>),
}

impl HashSink {
    pub fn hashes(&mut self) -> &mut Hashes {
        match self {
            HashSink::Own(h) => h,
            HashSink::Session(g) => &mut g.hashes,
        }
    }
}

/// A blocking writer of one request's bytes, at the file's current position. The CRC32C
/// is computed by the writer; the MD5, when one is wanted before the commit (the client
/// sent one), by a helper thread fed the same buffers, so that it runs beside the writes.
/// Written data is handed to the disk every [`WRITEBACK`] bytes (`sync_file_range`), so
/// that the fsync before the object is published has little left to wait for.
pub struct Writer {
    tx: Option<tokio::sync::mpsc::Sender<Bytes>>,
    done: tokio::sync::oneshot::Receiver<Written>,
    pub written: u64,
}

type Written = (TempFile, HashSink, std::io::Result<()>);

/// Bytes written between two starts of writeback.
const WRITEBACK: u64 = 8 << 20;

/// Where the MD5 of a writer's bytes is computed, if it is wanted.
enum Md5Side {
    None,
    Helper(std::thread::JoinHandle<md5::Md5>, std::sync::mpsc::SyncSender<Bytes>),
    /// No helper thread could be started: computed by the writer itself.
    Inline(md5::Md5),
}

impl Writer {
    /// Start the writer's thread (its own, not the runtime's blocking pool: it lives as
    /// long as the upload). `permit` is one of the server's transfer slots, held until the
    /// thread ends.
    pub fn start(mut tmp: TempFile, mut sink: HashSink, permit: TransferSlot) -> GcsResult<Writer> {
        let (tx, mut rx) = tokio::sync::mpsc::channel::<Bytes>(IN_FLIGHT);
        let (done_tx, done) = tokio::sync::oneshot::channel::<Written>();
        let body = move || {
            let _permit = permit;
            let mut side = match sink.hashes().md5.take() {
                None => Md5Side::None,
                Some(md5) => {
                    let backup = md5.clone();
                    let (mtx, mrx) = std::sync::mpsc::sync_channel::<Bytes>(IN_FLIGHT);
                    let helper = std::thread::Builder::new().name("storage-md5".into()).spawn(move || {
                        let mut m = md5;
                        for b in mrx {
                            m.update(&b);
                        }
                        m
                    });
                    match helper {
                        Ok(h) => Md5Side::Helper(h, mtx),
                        Err(_) => Md5Side::Inline(backup),
                    }
                }
            };
            let fd = std::os::fd::AsRawFd::as_raw_fd(&tmp.file);
            let mut pos = tmp.file.stream_position().unwrap_or(0);
            let mut flushed = pos;
            let mut r = Ok(());
            while let Some(b) = rx.blocking_recv() {
                if let Err(e) = tmp.file.write_all(&b) {
                    r = Err(e);
                    break;
                }
                pos += b.len() as u64;
                sink.hashes().update_crc(&b);
                match &mut side {
                    Md5Side::Helper(_, mtx) => {
                        if mtx.send(b).is_err() {
                            r = Err(std::io::Error::other("the MD5 thread stopped"));
                            break;
                        }
                    }
                    Md5Side::Inline(m) => m.update(&b),
                    Md5Side::None => {}
                }
                if pos - flushed >= WRITEBACK {
                    // SAFETY: a plain system call on an open descriptor; failure is harmless.
                    unsafe { nix::libc::sync_file_range(fd, flushed as i64, (pos - flushed) as i64, nix::libc::SYNC_FILE_RANGE_WRITE) };
                    flushed = pos;
                }
            }
            let md5 = match side {
                Md5Side::None => Ok(None),
                Md5Side::Inline(m) => Ok(Some(m)),
                Md5Side::Helper(h, mtx) => {
                    drop(mtx);
                    h.join().map(Some)
                }
            };
            match md5 {
                Ok(m) => sink.hashes().md5 = m,
                Err(_) => r = r.and(Err(std::io::Error::other("the MD5 thread failed"))),
            }
            if r.is_err() {
                if let HashSink::Session(g) = &mut sink {
                    g.valid = false;
                }
            }
            let _ = done_tx.send((tmp, sink, r));
        };
        std::thread::Builder::new()
            .name("storage-writer".into())
            .spawn(body)
            .map_err(|e| GcsError::new(503, "backendError", format!("Cannot start the upload's writer now: {e}.")))?;
        Ok(Writer { tx: Some(tx), done, written: 0 })
    }

    /// Hand bytes to the writer; an error when it failed (a full disk).
    pub async fn write(&mut self, b: Bytes) -> GcsResult<()> {
        if b.is_empty() {
            return Ok(());
        }
        self.written += b.len() as u64;
        let sent = match &self.tx {
            Some(tx) => tx.send(b).await.is_ok(),
            None => false,
        };
        if sent {
            return Ok(());
        }
        // The writer stopped: its error says why.
        self.tx = None;
        match (&mut self.done).await {
            Ok((_, _, Err(e))) => Err(GcsError::io("cannot write the upload", &e)),
            _ => Err(GcsError::internal("the upload's writer stopped", "no reason given")),
        }
    }

    /// All bytes were handed over: wait for the writer, and say how it went.
    pub async fn finish(mut self) -> GcsResult<(TempFile, HashSink)> {
        self.tx = None;
        let (tmp, sink, r) = self.done.await.map_err(|e| GcsError::internal("the upload's writer failed", e))?;
        r.map_err(|e| GcsError::io("cannot write the upload", &e))?;
        Ok((tmp, sink))
    }
}

/// A random id (128 bits, hex) for temporary files and sessions.
pub fn random_id() -> String {
    let mut b = [0u8; 16];
    let ok = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b)).is_ok();
    if !ok {
        // Not secret then, but unique: time and a counter.
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let t = super::meta::now_us() as u64;
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        b[..8].copy_from_slice(&t.to_be_bytes());
        b[8..].copy_from_slice(&(n ^ std::process::id() as u64).to_be_bytes());
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}

pub fn valid_session_id(id: &str) -> bool {
    id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
}

/// A resumable session as kept in `<id>.json`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SessionFile {
    pub bucket: String,
    pub name: String,
    /// The object's metadata to be (content type, custom metadata).
    pub meta: StoredMeta,
    /// Checksums the client gave at the start (its metadata's `crc32c`, `md5Hash`).
    pub expected: Expected,
    /// The object's size when known (`X-Upload-Content-Length`, or a chunk's `/TOTAL`).
    pub total: Option<u64>,
    pub pre: Preconditions,
    pub created_us: i64,
    /// Once complete: the object resource answered then (and to later status queries).
    pub done: Option<Value>,
}

/// What the server holds in memory of a session: the checksums of the bytes in its data
/// file so far (computed again from the file after a restart). The MD5 is among them only
/// when the session's start named one (see [`catch_up`]).
#[derive(Default)]
pub struct SessionMem {
    pub hashes: Hashes,
    /// The hashes cover the first `hashes.len` bytes of the data file.
    pub valid: bool,
}

/// Sessions' in-memory state, one lock per session.
#[derive(Default)]
pub struct Sessions {
    map: std::sync::Mutex<HashMap<String, Arc<tokio::sync::Mutex<SessionMem>>>>,
}

impl Sessions {
    pub fn get(&self, key: &str) -> Arc<tokio::sync::Mutex<SessionMem>> {
        let mut m = self.map.lock().unwrap_or_else(|p| p.into_inner());
        Arc::clone(m.entry(key.to_string()).or_default())
    }

    pub fn forget(&self, key: &str) {
        let mut m = self.map.lock().unwrap_or_else(|p| p.into_inner());
        m.remove(key);
    }

    /// Is a request of the session running now?
    fn busy(&self, key: &str) -> bool {
        let m = self.map.lock().unwrap_or_else(|p| p.into_inner());
        m.get(key).is_some_and(|l| l.try_lock().is_err())
    }
}

pub fn session_key(project: &str, id: &str) -> String {
    format!("{project}/{id}")
}

/// Write a session file atomically (a temporary file renamed over it).
pub fn save_session(uploads: &OwnedFd, id: &str, s: &SessionFile) -> GcsResult<()> {
    let tmp_name = format!("tmp-{}", random_id());
    let dup = uploads.try_clone().map_err(|e| GcsError::io("cannot save the upload session", &e))?;
    let mut tmp = TempFile::create(dup, tmp_name.clone())?;
    let text = serde_json::to_vec(s).map_err(|e| GcsError::internal("cannot save the upload session", e))?;
    tmp.file.write_all(&text).and_then(|_| tmp.file.sync_all()).map_err(|e| GcsError::io("cannot save the upload session", &e))?;
    nix::fcntl::renameat(uploads.as_fd(), tmp_name.as_str(), uploads.as_fd(), format!("{id}.json").as_str())
        .map_err(|e| GcsError::errno("cannot save the upload session", e))?;
    tmp.remove_on_drop(false);
    Ok(())
}

pub fn load_session(uploads: &OwnedFd, id: &str) -> GcsResult<Option<SessionFile>> {
    let fd = match crate::paths::open_beneath(uploads.as_fd(), Path::new(&format!("{id}.json")), OFlag::O_RDONLY | OFlag::O_NONBLOCK) {
        Ok(fd) => fd,
        Err(nix::errno::Errno::ENOENT) => return Ok(None),
        Err(e) => return Err(GcsError::errno("cannot read the upload session", e)),
    };
    let mut text = Vec::new();
    std::fs::File::from(fd).take(1 << 20).read_to_end(&mut text).map_err(|e| GcsError::io("cannot read the upload session", &e))?;
    serde_json::from_slice(&text).map(Some).map_err(|e| GcsError::internal("cannot read the upload session", e))
}

pub fn remove_session(uploads: &OwnedFd, id: &str) {
    for f in [format!("{id}.part"), format!("{id}.json")] {
        let _ = nix::unistd::unlinkat(uploads.as_fd(), f.as_str(), UnlinkatFlags::NoRemoveDir);
    }
}

/// Make the session's checksums cover its data file's `len` bytes, reading what they do
/// not cover yet (after a restart: all of it). `md5`: the session computes the MD5 as the
/// bytes come (its start named one); else only the CRC32C, and an MD5 that comes with the
/// last chunk is checked by reading the data file once then (see `finish_session`).
pub fn catch_up(mem: &mut SessionMem, file: &mut std::fs::File, len: u64, md5: bool) -> std::io::Result<()> {
    if !mem.valid || mem.hashes.len > len || mem.hashes.md5.is_some() != md5 {
        mem.hashes = Hashes::new(md5);
    }
    if mem.hashes.len < len {
        file.seek(SeekFrom::Start(mem.hashes.len))?;
        let mut buf = vec![0u8; READ_CHUNK];
        let mut left = len - mem.hashes.len;
        while left > 0 {
            let want = left.min(buf.len() as u64) as usize;
            let n = file.read(&mut buf[..want])?;
            if n == 0 {
                return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "the upload's data is shorter than expected"));
            }
            mem.hashes.update(&buf[..n]);
            left -= n as u64;
        }
    }
    mem.valid = true;
    Ok(())
}

/// Reads of a file to hash it: large enough that the system calls cost nothing next to
/// the hashing.
pub const READ_CHUNK: usize = 4 << 20;

/// The MD5 (base64) of a file's first `len` bytes, read from `file` (its position is
/// not used). An error when it is shorter.
pub fn md5_of_file(file: &std::fs::File, len: u64) -> std::io::Result<String> {
    use std::os::unix::fs::FileExt;
    let _ = nix::fcntl::posix_fadvise(file, 0, len as i64, nix::fcntl::PosixFadviseAdvice::POSIX_FADV_SEQUENTIAL);
    let mut m = md5::Md5::new();
    let mut buf = vec![0u8; READ_CHUNK.min(len.max(1) as usize)];
    let mut at = 0u64;
    while at < len {
        let want = (len - at).min(buf.len() as u64) as usize;
        let n = match file.read_at(&mut buf[..want], at) {
            Ok(0) => return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "the file is shorter than expected")),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        m.update(&buf[..n]);
        at += n as u64;
    }
    Ok(super::meta::md5_b64(m))
}

/// `Content-Range` of a resumable PUT.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChunkRange {
    /// `bytes */TOTAL` or `bytes */*`: how far is the upload?
    Query { total: Option<u64> },
    /// `bytes FIRST-LAST/TOTAL` or `.../*`.
    Bytes { first: u64, last: u64, total: Option<u64> },
}

pub fn parse_content_range(v: &str) -> Result<ChunkRange, String> {
    let bad = || format!("Invalid Content-Range {v:?}: expected \"bytes FIRST-LAST/TOTAL\", \"bytes FIRST-LAST/*\" or \"bytes */TOTAL\".");
    let rest = v.trim().strip_prefix("bytes").ok_or_else(bad)?.trim_start();
    let (range, total) = rest.split_once('/').ok_or_else(bad)?;
    // Far above any object (5 TiB), and no arithmetic on them can overflow.
    let num = |s: &str| s.trim().parse::<u64>().ok().filter(|n| *n < 1 << 60).ok_or_else(bad);
    let total = match total.trim() {
        "*" => None,
        t => Some(num(t)?),
    };
    if range.trim() == "*" {
        return Ok(ChunkRange::Query { total });
    }
    let (a, b) = range.trim().split_once('-').ok_or_else(bad)?;
    let first = num(a)?;
    let last = num(b)?;
    if last < first {
        return Err(format!("Invalid Content-Range {v:?}: the last byte is before the first."));
    }
    if total.is_some_and(|t| last >= t) {
        return Err(format!("Invalid Content-Range {v:?}: the range goes past the total size."));
    }
    Ok(ChunkRange::Bytes { first, last, total })
}

/// Temporary files of single-request uploads are removed when the request ends; one
/// older than this was left by a server that was killed.
const STALE_TEMP: Duration = Duration::from_secs(3600);

/// When the uploads directories were last swept, per project.
#[derive(Default)]
pub struct Sweeps {
    last: std::sync::Mutex<HashMap<String, Instant>>,
}

impl Sweeps {
    /// Is a sweep of `project` due (at most every `every`)? Marks it done if so.
    pub fn due(&self, project: &str, every: Duration) -> bool {
        let mut m = self.last.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        match m.get(project) {
            Some(t) if now.duration_since(*t) < every => false,
            _ => {
                if m.len() > 10_000 {
                    m.clear();
                }
                m.insert(project.to_string(), now);
                true
            }
        }
    }
}

/// Remove what abandoned uploads left in a namespace's uploads directory: sessions not
/// touched for `expiry` (their data and session files; not one a request is using now),
/// and temporary files older than an hour (a server killed during an upload).
/// `expired` is told each session removed (its reservation is given back at once).
pub fn sweep(uploads: OwnedFd, project: &str, expiry: Duration, sessions: &Sessions, expired: &dyn Fn(&str)) -> usize {
    let Ok(dup) = uploads.try_clone() else { return 0 };
    let Ok(mut d) = nix::dir::Dir::from_fd(dup) else { return 0 };
    let now = std::time::SystemTime::now();
    let age = |name: &str| -> Option<Duration> {
        let st = nix::sys::stat::fstatat(uploads.as_fd(), name, AtFlags::AT_SYMLINK_NOFOLLOW).ok()?;
        let t = std::time::UNIX_EPOCH + Duration::new(st.st_mtime.max(0) as u64, st.st_mtime_nsec.clamp(0, 999_999_999) as u32);
        Some(now.duration_since(t).unwrap_or_default())
    };
    let names: Vec<String> = d.iter().flatten().filter_map(|e| std::str::from_utf8(e.file_name().to_bytes()).ok().map(String::from)).collect();
    let mut removed = 0;
    for name in &names {
        if name.starts_with("tmp-") {
            if age(name).is_some_and(|a| a > STALE_TEMP) && nix::unistd::unlinkat(uploads.as_fd(), name.as_str(), UnlinkatFlags::NoRemoveDir).is_ok() {
                removed += 1;
            }
            continue;
        }
        let Some(id) = name.strip_suffix(".json") else { continue };
        if !valid_session_id(id) {
            continue;
        }
        let part = format!("{id}.part");
        let newest = [age(name), age(&part)].into_iter().flatten().min();
        let key = session_key(project, id);
        if newest.is_some_and(|a| a > expiry) && !sessions.busy(&key) {
            remove_session(&uploads, id);
            sessions.forget(&key);
            expired(id);
            removed += 1;
        }
    }
    // Data files whose session file is gone.
    for name in &names {
        if let Some(id) = name.strip_suffix(".part") {
            if !names.iter().any(|n| n == &format!("{id}.json")) && age(name).is_some_and(|a| a > expiry) {
                let _ = nix::unistd::unlinkat(uploads.as_fd(), name.as_str(), UnlinkatFlags::NoRemoveDir);
            }
        }
    }
    removed
}

/// A transfer's place: one of its project's storage streams and one of the server's, held
/// while its bytes move.
pub struct TransferSlot {
    pub(super) _project: crate::shares::Held,
    pub(super) _server: tokio::sync::OwnedSemaphorePermit,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_ranges() {
        assert_eq!(parse_content_range("bytes 0-9/100"), Ok(ChunkRange::Bytes { first: 0, last: 9, total: Some(100) }));
        assert_eq!(parse_content_range("bytes 10-19/*"), Ok(ChunkRange::Bytes { first: 10, last: 19, total: None }));
        assert_eq!(parse_content_range("bytes */100"), Ok(ChunkRange::Query { total: Some(100) }));
        assert_eq!(parse_content_range("bytes */*"), Ok(ChunkRange::Query { total: None }));
        for bad in ["bytes 0-18446744073709551615/*", "bytes 9-0/100", "bytes 0-100/100", "items 0-1/2", "bytes 0-1", "bytes a-b/*", "bytes -1/2"] {
            assert!(parse_content_range(bad).is_err(), "{bad}");
        }
        assert!(valid_session_id(&random_id()));
        assert!(!valid_session_id("../../etc/passwd"));
    }

    /// An expired session is removed and said (its reservation is given back then, not
    /// at the next walk); a fresh one stays.
    #[test]
    fn a_swept_session_is_said() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (old, fresh) = (random_id(), random_id());
        for id in [&old, &fresh] {
            std::fs::write(dir.path().join(format!("{id}.json")), "{}").expect("session");
            std::fs::write(dir.path().join(format!("{id}.part")), "data").expect("part");
        }
        let past = std::time::SystemTime::now() - Duration::from_secs(7200);
        for f in [format!("{old}.json"), format!("{old}.part")] {
            let file = std::fs::File::options().write(true).open(dir.path().join(f)).expect("open");
            file.set_modified(past).expect("mtime");
        }
        let fd: OwnedFd = std::fs::File::open(dir.path()).expect("dir").into();
        let said = std::sync::Mutex::new(Vec::new());
        let n = sweep(fd, "p", Duration::from_secs(3600), &Sessions::default(), &|id| said.lock().unwrap().push(id.to_string()));
        assert_eq!((n, said.into_inner().unwrap()), (1, vec![old.clone()]));
        assert!(!dir.path().join(format!("{old}.part")).exists() && dir.path().join(format!("{fresh}.part")).exists());
    }
}
