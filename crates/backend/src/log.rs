//! `log.jsonl`: the replica's stdout and stderr, one JSON object per line (L22).
//!
//! The shim appends `{"time":"…Z","stream":"stdout"|"stderr","text":"…"}` entries; the
//! server reads them incrementally (`read_log`) and takes the stderr tail for error
//! messages (`stderr_tail`, L13).

use std::fs::File;
use std::io::{self, BufRead, BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::fsutil::{self, FileError, IoResultExt};

pub const LOG_FILE: &str = "log.jsonl";

/// The longest text of one entry, in bytes; a longer line is split into several entries
/// so that a program that never prints a newline cannot make the shim grow without bound.
pub const MAX_ENTRY_BYTES: usize = 64 * 1024;

/// How many bytes one `read_log` call consumes at most (it always returns at least one
/// complete line if there is one).
const READ_BUDGET: u64 = 4 * 1024 * 1024;

/// One line of a replica's output.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogEntry {
    /// RFC 3339 UTC with microseconds, taken when the shim read the line.
    pub time: String,
    /// `stdout` or `stderr`.
    pub stream: String,
    /// The line without its newline, lossy UTF-8.
    pub text: String,
}

/// Appends entries to `log.jsonl`. Shared by the two pump threads; the lock keeps entries
/// whole, and every entry is flushed so a reader sees it at once.
pub struct LogWriter {
    path: PathBuf,
    out: Mutex<BufWriter<File>>,
}

impl LogWriter {
    pub fn open(path: &Path) -> Result<LogWriter, FileError> {
        let file = fsutil::open_append(path)?;
        Ok(LogWriter { path: path.to_path_buf(), out: Mutex::new(BufWriter::new(file)) })
    }

    pub fn write_entry(&self, stream: &str, text: &[u8]) -> Result<(), FileError> {
        let mut out = self.out.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        // The time is taken under the lock, so times never go down in file order.
        let entry = LogEntry {
            time: fsutil::format_rfc3339_micros(fsutil::now_micros()),
            stream: stream.to_string(),
            text: String::from_utf8_lossy(text).into_owned(),
        };
        let mut line = serde_json::to_vec(&entry).map_err(io::Error::other).at("encode entry for", &self.path)?;
        line.push(b'\n');
        out.write_all(&line).at("append to", &self.path)?;
        out.flush().at("flush", &self.path)
    }

    pub fn flush(&self) -> Result<(), FileError> {
        let mut out = self.out.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        out.flush().at("flush", &self.path)?;
        out.get_ref().sync_data().at("fsync", &self.path)
    }
}

/// Reads `reader` to EOF and writes one entry per line (a final line without a newline
/// included). A write error is reported once on the shim's stderr and the pipe is still
/// drained, so the program never blocks on a full pipe.
pub fn pump(reader: impl Read, stream: &str, writer: &LogWriter) {
    let mut reader = BufReader::with_capacity(MAX_ENTRY_BYTES, reader);
    let mut line: Vec<u8> = Vec::new();
    let mut failed = false;
    let mut emit = |line: &mut Vec<u8>| {
        if let Err(e) = writer.write_entry(stream, line) {
            if !failed {
                failed = true;
                let _ = writeln!(io::stderr(), "trainyard shim: {e}; further {stream} output is lost");
            }
        }
        line.clear();
    };
    loop {
        let buf = match reader.fill_buf() {
            Ok(buf) => buf,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                let _ = writeln!(io::stderr(), "trainyard shim: reading the program's {stream}: {e}");
                break;
            }
        };
        if buf.is_empty() {
            if !line.is_empty() {
                emit(&mut line);
            }
            break;
        }
        let room = MAX_ENTRY_BYTES - line.len();
        match buf.iter().position(|&b| b == b'\n') {
            Some(i) if i <= room => {
                line.extend_from_slice(&buf[..i]);
                reader.consume(i + 1);
                emit(&mut line);
            }
            _ => {
                let take = buf.len().min(room);
                line.extend_from_slice(&buf[..take]);
                reader.consume(take);
                if line.len() >= MAX_ENTRY_BYTES {
                    emit(&mut line);
                }
            }
        }
    }
}

/// Reads the complete entries of `<run_dir>/log.jsonl` from byte `from_offset` on, and
/// the offset to continue from. A trailing partial line (being written) is left for the
/// next call; a missing file reads as empty. Malformed lines are skipped.
pub fn read_log(run_dir: &Path, from_offset: u64) -> Result<(Vec<LogEntry>, u64), FileError> {
    let path = run_dir.join(LOG_FILE);
    let mut file = match File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok((Vec::new(), from_offset)),
        Err(e) => return Err(FileError { op: "open", path, source: e }),
    };
    file.seek(SeekFrom::Start(from_offset)).at("seek in", &path)?;
    let mut reader = BufReader::new(file);
    let mut entries = Vec::new();
    let mut offset = from_offset;
    let mut line = Vec::new();
    while offset - from_offset < READ_BUDGET {
        line.clear();
        let n = reader.read_until(b'\n', &mut line).at("read", &path)?;
        if n == 0 || line.last() != Some(&b'\n') {
            break;
        }
        offset += n as u64;
        if let Ok(entry) = serde_json::from_slice::<LogEntry>(&line) {
            entries.push(entry);
        }
    }
    Ok((entries, offset))
}

/// The texts of the last `n` stderr entries of `<run_dir>/log.jsonl`, oldest first. Reads
/// the file backwards in blocks, so a long log costs only its tail.
pub fn stderr_tail(run_dir: &Path, n: usize) -> Result<Vec<String>, FileError> {
    const BLOCK: u64 = 64 * 1024;
    let path = run_dir.join(LOG_FILE);
    let mut file = match File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(FileError { op: "open", path, source: e }),
    };
    let mut pos = file.metadata().at("stat", &path)?.len();
    let mut tail: Vec<String> = Vec::new(); // newest first
    // Bytes [pos, processed) not yet turned into entries.
    let mut carry: Vec<u8> = Vec::new();
    let mut skipping_partial = true;
    let consider = |line: &[u8], tail: &mut Vec<String>| {
        if let Ok(entry) = serde_json::from_slice::<LogEntry>(line) {
            if entry.stream == "stderr" {
                tail.push(entry.text);
            }
        }
    };
    while tail.len() < n && (pos > 0 || !carry.is_empty()) {
        if pos > 0 {
            let start = pos.saturating_sub(BLOCK);
            let mut block = vec![0u8; (pos - start) as usize];
            file.seek(SeekFrom::Start(start)).at("seek in", &path)?;
            file.read_exact(&mut block).at("read", &path)?;
            block.extend_from_slice(&carry);
            carry = block;
            pos = start;
        }
        if skipping_partial {
            // Text after the last newline is an entry still being written.
            match carry.iter().rposition(|&b| b == b'\n') {
                Some(i) => {
                    carry.truncate(i + 1);
                    skipping_partial = false;
                }
                None => {
                    carry.clear();
                    continue;
                }
            }
        }
        // carry ends with '\n'; take whole lines from its end.
        while tail.len() < n && !carry.is_empty() {
            let body_end = carry.len() - 1;
            match carry[..body_end].iter().rposition(|&b| b == b'\n') {
                Some(i) => {
                    consider(&carry[i + 1..body_end], &mut tail);
                    carry.truncate(i + 1);
                }
                None if pos == 0 => {
                    consider(&carry[..body_end], &mut tail);
                    carry.clear();
                }
                None => break,
            }
        }
    }
    tail.truncate(n);
    tail.reverse();
    Ok(tail)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(stream: &str, text: &str) -> String {
        let e = LogEntry { time: "2026-11-29T10:00:00.000000Z".into(), stream: stream.into(), text: text.into() };
        let mut s = serde_json::to_string(&e).unwrap();
        s.push('\n');
        s
    }

    #[test]
    fn read_log_is_incremental_and_skips_a_partial_line() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join(LOG_FILE);
        let first = entry("stdout", "a");
        std::fs::write(&p, format!("{first}{}", &entry("stderr", "b")[..10])).unwrap();
        let (es, off) = read_log(dir.path(), 0).unwrap();
        assert_eq!(es.len(), 1);
        assert_eq!(off, first.len() as u64);
        std::fs::write(&p, format!("{first}{}{}", entry("stderr", "b"), entry("stdout", "c"))).unwrap();
        let (es, off2) = read_log(dir.path(), off).unwrap();
        assert_eq!(es.iter().map(|e| e.text.as_str()).collect::<Vec<_>>(), ["b", "c"]);
        assert_eq!(off2, std::fs::metadata(&p).unwrap().len());
        let (es, off3) = read_log(dir.path(), off2).unwrap();
        assert!(es.is_empty());
        assert_eq!(off3, off2);
    }

    #[test]
    fn read_log_of_a_missing_file_is_empty() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read_log(dir.path(), 7).unwrap(), (Vec::new(), 7));
    }

    #[test]
    fn stderr_tail_takes_the_last_stderr_lines_across_blocks() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = String::new();
        for i in 0..5000 {
            s += &entry("stderr", &format!("err {i}"));
            s += &entry("stdout", &"x".repeat(50));
        }
        s += &entry("stdout", "partial")[..12];
        std::fs::write(dir.path().join(LOG_FILE), s).unwrap();
        let tail = stderr_tail(dir.path(), 20).unwrap();
        let want: Vec<String> = (4980..5000).map(|i| format!("err {i}")).collect();
        assert_eq!(tail, want);
        let all = stderr_tail(dir.path(), 100_000).unwrap();
        assert_eq!(all.len(), 5000);
        assert_eq!(all[0], "err 0");
        assert!(stderr_tail(dir.path(), 0).unwrap().is_empty());
    }

    #[test]
    fn pump_splits_lines_flushes_partial_and_bounds_entries() {
        let dir = tempfile::tempdir().unwrap();
        let w = LogWriter::open(&dir.path().join(LOG_FILE)).unwrap();
        let mut input = b"one\n\ntwo \xff\n".to_vec();
        input.extend(std::iter::repeat_n(b'y', MAX_ENTRY_BYTES + 10));
        input.extend_from_slice(b"\nlast");
        pump(&input[..], "stdout", &w);
        let (es, _) = read_log(dir.path(), 0).unwrap();
        let texts: Vec<&str> = es.iter().map(|e| e.text.as_str()).collect();
        assert_eq!(texts[..3], ["one", "", "two \u{fffd}"]);
        assert_eq!(texts[3].len(), MAX_ENTRY_BYTES);
        assert_eq!(texts[4], "y".repeat(10));
        assert_eq!(texts[5], "last");
        assert_eq!(texts.len(), 6);
        assert!(es.iter().all(|e| e.stream == "stdout" && e.time.ends_with('Z')));
    }
}
