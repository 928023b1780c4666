//! The server log's writer: one event is one line. tracing's formatter writes each event
//! with one `write_all` ending in a newline; any other line break or control character in
//! it (from user text such as a `displayName`, shown with `{}` somewhere) is written
//! escaped (`\n`, `\r`, `\u{1b}`...), so that no text can start a forged log line or send
//! terminal escape sequences. The colour codes of a terminal log are kept.
//!
//! [`init`] sets the log up: levels by target from `TRAINYARD_LOG` or `RUST_LOG`, text or
//! JSON lines (`[log] format`), and the audit lines in a file of their own rotated by size
//! (`[log] audit_file`, [`RotatingFile`]).

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::Context;
use trainyard_server::config::{Log, LogFormat};
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer, Registry};

/// The target of the audit lines (one per mutating request, see `http::guard`).
pub const AUDIT_TARGET: &str = "audit";

type BoxedLayer = Box<dyn Layer<Registry> + Send + Sync>;

/// Sets up the log: what `TRAINYARD_LOG` (or else `RUST_LOG`) asks, in `EnvFilter`'s
/// syntax (`info,trainyard_server::driver=debug`), or `default`; in `log.format`; the audit
/// lines in `log.audit_file` when set, whatever the levels asked (they are the record of
/// who changed what), and then not in the server log. Returns a note for the log when an
/// environment variable could not be used.
pub fn init(default: &str, log: &Log) -> anyhow::Result<Option<String>> {
    let (mut filter, note) = match ["TRAINYARD_LOG", "RUST_LOG"].iter().find_map(|v| Some((*v, std::env::var(v).ok()?))) {
        Some((var, spec)) => match EnvFilter::builder().parse(&spec) {
            Ok(f) => (f, None),
            Err(e) => (EnvFilter::new(default), Some(format!("{var}={spec:?} is not a level filter ({e}); logging at {default:?}"))),
        },
        None => (EnvFilter::new(default), None),
    };
    let mut layers: Vec<BoxedLayer> = Vec::new();
    if let Some(path) = &log.audit_file {
        let file = RotatingFile::open(path, log.audit_max_bytes, log.audit_keep)
            .with_context(|| format!("[log] audit_file {}", path.display()))?;
        filter = filter.add_directive(format!("{AUDIT_TARGET}=off").parse()?);
        let audit = tracing_subscriber::filter::Targets::new().with_target(AUDIT_TARGET, tracing::Level::INFO);
        layers.push(format_layer(log.format, Escaping::File(Arc::new(file)), false).with_filter(audit).boxed());
    }
    use std::io::IsTerminal;
    let ansi = log.format == LogFormat::Text && std::io::stderr().is_terminal();
    layers.insert(0, format_layer(log.format, Escaping::Stderr, ansi).with_filter(filter).boxed());
    tracing_subscriber::registry().with(layers).try_init().context("the log is already set up")?;
    Ok(note)
}

/// Text or JSON lines to `out`, one event per write. JSON lines carry the event's fields at
/// the top level beside `timestamp`, `level`, `target` and `message`.
fn format_layer(format: LogFormat, out: Escaping, ansi: bool) -> BoxedLayer {
    let base = tracing_subscriber::fmt::layer().with_writer(EscapingMaker { out, ansi }).with_ansi(ansi);
    match format {
        LogFormat::Text => base.boxed(),
        LogFormat::Json => base.json().flatten_event(true).with_current_span(false).with_span_list(false).boxed(),
    }
}

/// Where escaped events go.
#[derive(Clone)]
enum Escaping {
    Stderr,
    File(Arc<RotatingFile>),
}

/// Events escaped (see [`escape_event`]) to standard error or a file.
struct EscapingMaker {
    out: Escaping,
    ansi: bool,
}

impl<'a> MakeWriter<'a> for EscapingMaker {
    type Writer = EscapingWriter;

    fn make_writer(&'a self) -> Self::Writer {
        EscapingWriter { ansi: self.ansi, out: self.out.clone() }
    }
}

/// A file that is rotated before it grows past `max_bytes`: `path` is renamed `path.1`, an
/// older `path.1` `path.2`..., and the oldest of `keep` is removed. Lines are appended
/// whole: a line is never split across two files. A rotation that fails (a directory made
/// read-only) keeps appending to the current file, and says so once on standard error.
pub struct RotatingFile {
    path: PathBuf,
    max_bytes: u64,
    keep: u32,
    state: Mutex<Current>,
}

struct Current {
    file: File,
    len: u64,
    rotation_failed: bool,
}

impl RotatingFile {
    /// Opens (creating it and its directory, for this user only) `path` to append to.
    pub fn open(path: &Path, max_bytes: u64, keep: u32) -> io::Result<RotatingFile> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let file = open_append(path)?;
        let len = file.metadata()?.len();
        Ok(RotatingFile { path: path.to_owned(), max_bytes, keep: keep.max(1), state: Mutex::new(Current { file, len, rotation_failed: false }) })
    }

    fn rotated(&self, n: u32) -> PathBuf {
        let mut s = self.path.clone().into_os_string();
        s.push(format!(".{n}"));
        PathBuf::from(s)
    }

    fn rotate(&self, cur: &mut Current) -> io::Result<()> {
        for n in (1..self.keep).rev() {
            match std::fs::rename(self.rotated(n), self.rotated(n + 1)) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
        std::fs::rename(&self.path, self.rotated(1))?;
        cur.file = open_append(&self.path)?;
        cur.len = 0;
        Ok(())
    }

    /// Appends one line, rotating first when it would not fit.
    pub fn append(&self, line: &[u8]) -> io::Result<()> {
        let mut cur = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if cur.len > 0 && cur.len + line.len() as u64 > self.max_bytes {
            if let Err(e) = self.rotate(&mut cur) {
                if !cur.rotation_failed {
                    cur.rotation_failed = true;
                    eprintln!("trainyard: cannot rotate {}: {e}; appending to it", self.path.display());
                }
            }
        }
        cur.file.write_all(line)?;
        cur.len += line.len() as u64;
        Ok(())
    }
}

fn open_append(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    OpenOptions::new().create(true).append(true).mode(0o600).open(path)
}

/// `bytes` with control characters escaped, but for a final newline and, when `ansi`, the
/// ESC of colour codes. C1 control characters (U+0080 to U+009F) are escaped too.
pub fn escape_event(bytes: &[u8], ansi: bool) -> Vec<u8> {
    let (body, newline) = match bytes.strip_suffix(b"\n") {
        Some(b) => (b, true),
        None => (bytes, false),
    };
    let mut out = Vec::with_capacity(bytes.len() + 8);
    let mut i = 0;
    while i < body.len() {
        let b = body[i];
        match b {
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b'\t' => out.push(b),
            0x1b if ansi => out.push(b),
            0x00..=0x1f | 0x7f => out.extend_from_slice(format!("\\u{{{b:x}}}").as_bytes()),
            // U+0080..U+009F are C2 80..C2 9F in UTF-8.
            0xc2 if body.get(i + 1).is_some_and(|n| (0x80..=0x9f).contains(n)) => {
                out.extend_from_slice(format!("\\u{{{:x}}}", body[i + 1]).as_bytes());
                i += 1;
            }
            _ => out.push(b),
        }
        i += 1;
    }
    if newline {
        out.push(b'\n');
    }
    out
}

/// One escaped event per write.
pub struct EscapingWriter {
    ansi: bool,
    out: Escaping,
}

impl Write for EscapingWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let line = escape_event(buf, self.ansi);
        match &self.out {
            Escaping::Stderr => io::stderr().lock().write_all(&line)?,
            Escaping::File(f) => f.append(&line)?,
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        match &self.out {
            Escaping::Stderr => io::stderr().flush(),
            Escaping::File(_) => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_event_is_one_line() {
        let forged = "INFO job 1 created: x\nINFO audit: holder=\"admin\"\r\u{1b}[2K\u{0}\u{9b}31m\n";
        let out = String::from_utf8(escape_event(forged.as_bytes(), false)).unwrap();
        assert_eq!(out, "INFO job 1 created: x\\nINFO audit: holder=\"admin\"\\r\\u{1b}[2K\\u{0}\\u{9b}31m\n");
        assert_eq!(out.lines().count(), 1);
        // Colour codes of a terminal stay; other characters pass unchanged.
        let coloured = "\u{1b}[32m INFO\u{1b}[0m ünïcödé\ttab\n";
        assert_eq!(escape_event(coloured.as_bytes(), true), coloured.as_bytes());
        assert_eq!(escape_event(b"no newline", false), b"no newline");
    }

    #[test]
    fn rotates_by_size_keeping_whole_lines_and_the_newest_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("logs/audit.log");
        let f = RotatingFile::open(&path, 100, 2).unwrap();
        let line = |i: usize| format!("{i:039}\n"); // 40 bytes
        for i in 0..7 {
            f.append(line(i).as_bytes()).unwrap();
        }
        let read = |p: &Path| std::fs::read_to_string(p).unwrap();
        // Two lines fit in 100 bytes; the third starts a new file.
        assert_eq!(read(&path), line(6));
        assert_eq!(read(&f.rotated(1)), line(4) + &line(5));
        assert_eq!(read(&f.rotated(2)), line(2) + &line(3));
        assert!(!f.rotated(3).exists(), "only `keep` rotated files are kept");
        // Opened again, it goes on from the file's length.
        drop(f);
        let f = RotatingFile::open(&path, 100, 2).unwrap();
        f.append(line(7).as_bytes()).unwrap();
        assert_eq!(read(&path), line(6) + &line(7));
        f.append(line(8).as_bytes()).unwrap();
        assert_eq!(read(&path), line(8));
        assert_eq!(read(&f.rotated(1)), line(6) + &line(7));
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        // A line longer than the limit is written whole, alone.
        let long = "x".repeat(150) + "\n";
        f.append(long.as_bytes()).unwrap();
        assert_eq!(read(&path), long);
    }
}
