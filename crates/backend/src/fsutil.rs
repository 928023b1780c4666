//! Small file and clock helpers shared by the shim and the server side: I/O errors that
//! name their file, atomic JSON writes, and RFC 3339 timestamps.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

/// An I/O error together with what was being done and to which file.
#[derive(Debug, thiserror::Error)]
#[error("cannot {op} {}: {source}", path.display())]
pub struct FileError {
    pub op: &'static str,
    pub path: PathBuf,
    #[source]
    pub source: io::Error,
}

impl FileError {
    pub fn kind(&self) -> io::ErrorKind {
        self.source.kind()
    }
}

/// `fs::read(&p).at("read", &p)?`: attach the operation and the path to an I/O error.
pub trait IoResultExt<T> {
    fn at(self, op: &'static str, path: &Path) -> Result<T, FileError>;
}

impl<T> IoResultExt<T> for io::Result<T> {
    fn at(self, op: &'static str, path: &Path) -> Result<T, FileError> {
        self.map_err(|source| FileError { op, path: path.to_path_buf(), source })
    }
}

/// Writes `bytes` to `path` so that a reader sees either the old file or the whole new
/// one, also after a crash: write a temporary file, fsync it, rename it over `path`, and
/// fsync the directory.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), FileError> {
    let mut tmp_name = path.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    tmp_name.push(".tmp");
    let tmp = path.with_file_name(tmp_name);
    {
        let mut file = File::create(&tmp).at("create", &tmp)?;
        file.write_all(bytes).at("write", &tmp)?;
        file.sync_all().at("fsync", &tmp)?;
    }
    fs::rename(&tmp, path).at("rename into place", path)?;
    sync_dir(path.parent().unwrap_or(Path::new(".")))
}

/// Writes `bytes` to `path` so that a reader sees either the old file or the whole new
/// one (write a temporary file, rename it over `path`), without forcing it to disk: for
/// files that only matter while the machine stays up (a power cut ends the replica too).
pub fn write_replace(path: &Path, bytes: &[u8]) -> Result<(), FileError> {
    let mut tmp_name = path.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    tmp_name.push(".tmp");
    let tmp = path.with_file_name(tmp_name);
    {
        let mut file = File::create(&tmp).at("create", &tmp)?;
        file.write_all(bytes).at("write", &tmp)?;
    }
    fs::rename(&tmp, path).at("rename into place", path)
}

/// Writes `bytes` to `path` in a directory its tenant may write (a replica's own), for
/// the tenant to read (mode 0644), replacing what was there: the temporary file is made
/// new (O_EXCL: a link planted under its name is removed, never followed) and renamed over
/// `path` (a rename replaces a link, never its target).
pub fn write_for_tenant(path: &Path, bytes: &[u8]) -> Result<(), FileError> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut tmp_name = path.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    tmp_name.push(".tmp");
    let tmp = path.with_file_name(tmp_name);
    match fs::remove_file(&tmp) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(FileError { op: "remove", path: tmp, source: e }),
    }
    {
        let mut file = fs::OpenOptions::new().write(true).create_new(true).mode(0o644).open(&tmp).at("create", &tmp)?;
        // Readable by the tenant whatever the server's umask.
        file.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o644)).at("chmod", &tmp)?;
        file.write_all(bytes).at("write", &tmp)?;
    }
    fs::rename(&tmp, path).at("rename into place", path)
}

/// Writes `bytes` to a new `path` readable by its owner alone (mode 0600), replacing
/// what was there.
pub fn write_private(path: &Path, bytes: &[u8]) -> Result<(), FileError> {
    use std::os::unix::fs::OpenOptionsExt;
    match fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(FileError { op: "remove", path: path.to_path_buf(), source: e }),
    }
    let mut file = fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path).at("create", path)?;
    file.write_all(bytes).at("write", path)
}

/// fsyncs a directory so that a rename or a create in it is durable.
pub fn sync_dir(dir: &Path) -> Result<(), FileError> {
    let dir = if dir.as_os_str().is_empty() { Path::new(".") } else { dir };
    File::open(dir).at("open directory", dir)?.sync_all().at("fsync directory", dir)
}

/// Opens (creating if needed) a file for appending.
pub fn open_append(path: &Path) -> Result<File, FileError> {
    OpenOptions::new().create(true).append(true).open(path).at("open for append", path)
}

/// Reads a file that may legitimately be absent: `Ok(None)` when it does not exist.
pub fn read_optional(path: &Path) -> Result<Option<Vec<u8>>, FileError> {
    match fs::read(path) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(FileError { op: "read", path: path.to_path_buf(), source: e }),
    }
}

/// Microseconds since the Unix epoch, by the wall clock.
pub fn now_micros() -> i64 {
    match SystemTime::now().duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_micros()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_micros()).unwrap_or(i64::MAX),
    }
}

/// Formats microseconds since the epoch as RFC 3339 in UTC with six fractional digits:
/// `2026-11-29T10:00:00.123456Z` (the epoch itself for an instant `time` cannot hold).
pub fn format_rfc3339_micros(micros: i64) -> String {
    trainyard_core::clock_text::rfc3339(micros, trainyard_core::clock_text::Digits::Micros)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_known_instants() {
        assert_eq!(format_rfc3339_micros(0), "1970-01-01T00:00:00.000000Z");
        // 2026-11-29T10:00:00.123456Z
        assert_eq!(format_rfc3339_micros(1_795_946_400_123_456), "2026-11-29T10:00:00.123456Z");
        // a leap day
        assert_eq!(format_rfc3339_micros(951_782_400_000_001), "2000-02-29T00:00:00.000001Z");
        assert_eq!(format_rfc3339_micros(-1), "1969-12-31T23:59:59.999999Z");
    }

    #[test]
    fn atomic_write_replaces_and_leaves_no_temp() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("status.json");
        write_atomic(&p, b"one").unwrap();
        write_atomic(&p, b"two").unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"two");
        assert!(!dir.path().join("status.json.tmp").exists());
    }

    #[test]
    fn file_errors_name_the_file() {
        let e = fs::read("/nonexistent/x.json").at("read", Path::new("/nonexistent/x.json")).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/x.json"), "{e}");
    }
}
