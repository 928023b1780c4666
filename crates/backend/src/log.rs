//! `log.jsonl`: the replica's stdout and stderr, one JSON object per line (L22).
//!
//! The shim appends `{"time":"…Z","stream":"stdout"|"stderr","text":"…"}` entries; the
//! server reads them incrementally (`read_log`) and takes the stderr tail for error
//! messages (`stderr_tail`, L13).

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::fsutil::{self, FileError, IoResultExt};

pub const LOG_FILE: &str = "log.jsonl";

/// The longest text of one entry, in bytes; a longer line is split into several entries
/// so that a program that never prints a newline cannot make the shim grow without bound.
pub const MAX_ENTRY_BYTES: usize = 64 * 1024;

/// The log's previous file, after a rotation (see `LogWriter::open`'s `max_bytes`).
pub const ROTATED_FILE: &str = "log.1.jsonl";

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
/// whole, and every entry goes to the file in one `write` loop (no buffering), so a reader
/// sees it at once.
///
/// A write that fails (a full disk: `ENOSPC`, a quota, an I/O error) never stops the
/// replica: the entry is dropped and counted, the pumps keep draining the program's pipes
/// so that it never blocks, and the first entry that can be written again is preceded by
/// a `stderr` entry saying how many were dropped (L22: the log says where it has a gap).
/// An entry cut off by a failing write is ended with a newline before the next one, so
/// that the torn line is skipped by readers instead of swallowing the next entry.
pub struct LogWriter {
    path: PathBuf,
    /// At most this many bytes are kept: the file is rotated at half of it.
    max_bytes: Option<u64>,
    state: Mutex<WriterState>,
}

struct WriterState {
    file: File,
    /// Bytes in the current file.
    size: u64,
    /// Entries that could not be written since the last one that could.
    dropped: u64,
    /// The first error of the current failing streak.
    error: Option<String>,
    /// The last write stopped in the middle of an entry.
    torn: bool,
}

/// The text of the entry that reports a gap in the log.
pub fn dropped_note(dropped: u64, error: &str) -> String {
    let lines = if dropped == 1 { "line" } else { "lines" };
    format!("trainyard: {dropped} {lines} of output could not be written to the log ({error}) and were dropped")
}

fn encode_entry(stream: &str, text: &[u8], path: &Path) -> Result<Vec<u8>, FileError> {
    // The time is taken under the writer's lock, so times never go down in file order.
    let entry = LogEntry {
        time: fsutil::format_rfc3339_micros(fsutil::now_micros()),
        stream: stream.to_string(),
        text: String::from_utf8_lossy(text).into_owned(),
    };
    let mut line = serde_json::to_vec(&entry).map_err(io::Error::other).at("encode entry for", path)?;
    line.push(b'\n');
    Ok(line)
}

impl WriterState {
    /// Writes `bytes` whole, or records how far it got: `torn` when some but not all of
    /// them reached the file.
    fn write_whole(&mut self, bytes: &[u8], path: &Path) -> Result<(), FileError> {
        let mut written = 0;
        while written < bytes.len() {
            match self.file.write(&bytes[written..]) {
                Ok(0) => {
                    // A torn entry stays torn through failures that write nothing.
                    self.torn |= written > 0;
                    return Err(io::Error::from(io::ErrorKind::WriteZero)).at("append to", path);
                }
                Ok(n) => written += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    self.torn |= written > 0;
                    return Err(e).at("append to", path);
                }
            }
        }
        self.torn = false;
        Ok(())
    }

    /// Ends a torn entry, then writes the note about dropped entries, if any.
    fn catch_up(&mut self, path: &Path) -> Result<(), FileError> {
        if self.torn {
            self.write_whole(b"\n", path)?;
        }
        if self.dropped > 0 {
            let error = self.error.clone().unwrap_or_default();
            let note = dropped_note(self.dropped, &error);
            let line = encode_entry("stderr", note.as_bytes(), path)?;
            self.write_whole(&line, path)?;
            let _ = writeln!(io::stderr(), "trainyard shim: {} can be written again; {note}", path.display());
            self.dropped = 0;
            self.error = None;
        }
        Ok(())
    }

    fn note_failure(&mut self, e: &FileError) {
        self.dropped += 1;
        if self.error.is_none() {
            self.error = Some(e.source.to_string());
            let _ = writeln!(io::stderr(), "trainyard shim: {e}; output lines are dropped (and counted) until it can be written again");
        }
    }
}

impl LogWriter {
    pub fn open(path: &Path) -> Result<LogWriter, FileError> {
        LogWriter::open_capped(path, None)
    }

    /// A log that keeps at most `max_bytes` (L22 within a bound, so that a chatty program
    /// cannot fill the disk): when the file passes half of it, it becomes `log.1.jsonl`
    /// (replacing the one before) and a new file starts with a note saying so.
    pub fn open_capped(path: &Path, max_bytes: Option<u64>) -> Result<LogWriter, FileError> {
        let file = fsutil::open_append(path)?;
        let size = file.metadata().map(|m| m.len()).unwrap_or(0);
        Ok(LogWriter {
            path: path.to_path_buf(),
            max_bytes: max_bytes.filter(|m| *m > 0),
            state: Mutex::new(WriterState { file, size, dropped: 0, error: None, torn: false }),
        })
    }

    /// Rotates the file when `next` more bytes would take it past half the cap.
    fn rotate_if_full(&self, st: &mut WriterState, next: u64) -> Result<(), FileError> {
        let Some(max) = self.max_bytes else { return Ok(()) };
        if st.size == 0 || st.size + next <= max / 2 {
            return Ok(());
        }
        std::fs::rename(&self.path, self.path.with_file_name(ROTATED_FILE)).at("rotate", &self.path)?;
        st.file = fsutil::open_append(&self.path)?;
        st.size = 0;
        let note = format!(
            "trainyard: the log reached {} bytes and was rotated: at most {max} bytes of this run's output are kept, older lines are dropped",
            max / 2
        );
        let line = encode_entry("stderr", note.as_bytes(), &self.path)?;
        st.write_whole(&line, &self.path)?;
        st.size += line.len() as u64;
        Ok(())
    }

    fn state(&self) -> std::sync::MutexGuard<'_, WriterState> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Appends one entry. On failure the entry is dropped and counted (see the type's
    /// docs); the error is returned for the caller's information only.
    pub fn write_entry(&self, stream: &str, text: &[u8]) -> Result<(), FileError> {
        self.write_entries(stream, &[text])
    }

    /// Appends entries read at one moment, with one time and in one write (a line each,
    /// whole: a reader never sees half of one). On failure every one of them is dropped
    /// and counted.
    pub fn write_entries(&self, stream: &str, texts: &[&[u8]]) -> Result<(), FileError> {
        if texts.is_empty() {
            return Ok(());
        }
        let mut st = self.state();
        // Entries that reached the file, for the count of those dropped on a failure.
        let mut done = 0;
        let written = st.catch_up(&self.path).and_then(|()| {
            // The time is taken under the writer's lock, so times never go down in file order.
            let time = fsutil::format_rfc3339_micros(fsutil::now_micros());
            // With a cap, writes of at most a quarter of it, so that each file stays
            // within half of it.
            let piece = self.max_bytes.map_or(usize::MAX, |m| (m / 4).max(1) as usize);
            let mut buf = Vec::with_capacity(texts.iter().map(|t| t.len() + 72).sum::<usize>().min(1 << 20));
            for (i, t) in texts.iter().enumerate() {
                encode_into(&mut buf, &time, stream, t);
                if buf.len() >= piece || i + 1 == texts.len() {
                    self.rotate_if_full(&mut st, buf.len() as u64)?;
                    st.write_whole(&buf, &self.path)?;
                    st.size += buf.len() as u64;
                    buf.clear();
                    done = i + 1;
                }
            }
            Ok(())
        });
        if let Err(e) = &written {
            for _ in done..texts.len() {
                st.note_failure(e);
            }
        }
        written
    }

    /// How many entries were dropped since the last one that could be written.
    pub fn dropped(&self) -> u64 {
        self.state().dropped
    }

    /// Writes the note about dropped entries now, if there are any (e.g. after the
    /// program ended, once space is back). `Ok(())` when nothing is owed.
    pub fn write_dropped_note(&self) -> Result<(), FileError> {
        self.state().catch_up(&self.path)
    }

    /// Writes what is owed (see [`LogWriter::write_dropped_note`]) and forces the file to disk.
    pub fn flush(&self) -> Result<(), FileError> {
        let mut st = self.state();
        st.catch_up(&self.path)?;
        st.file.sync_data().at("fsync", &self.path)
    }

    /// Test seam: writes go to `file` from now on (e.g. `/dev/full`, then a real file).
    #[cfg(test)]
    fn replace_file(&self, file: File) {
        self.state().file = file;
    }
}

fn memchr_newline(b: &[u8]) -> Option<usize> {
    b.iter().position(|&c| c == b'\n')
}

/// Appends one entry as `encode_entry` does, with a time already formatted.
fn encode_into(buf: &mut Vec<u8>, time: &str, stream: &str, text: &[u8]) {
    buf.extend_from_slice(b"{\"time\":\"");
    buf.extend_from_slice(time.as_bytes());
    buf.extend_from_slice(b"\",\"stream\":\"");
    buf.extend_from_slice(stream.as_bytes());
    buf.extend_from_slice(b"\",\"text\":");
    // A string always encodes.
    let _ = serde_json::to_writer(&mut *buf, &String::from_utf8_lossy(text));
    buf.extend_from_slice(b"}\n");
}

/// One line splitter per stream, for [`Pump`].
struct Splitter {
    stream: &'static str,
    line: Vec<u8>,
    open: bool,
}

impl Splitter {
    fn new(stream: &'static str) -> Splitter {
        Splitter { stream, line: Vec::new(), open: true }
    }

    /// Writes every complete line of `bytes` (and overlong pieces) as one batch, stamped
    /// with one time (they were read at one moment), and keeps the rest.
    fn feed(&mut self, bytes: &[u8], writer: &LogWriter) {
        let mut batch: Vec<std::borrow::Cow<'_, [u8]>> = Vec::new();
        let mut rest = bytes;
        while !rest.is_empty() {
            let room = MAX_ENTRY_BYTES - self.line.len();
            match memchr_newline(rest) {
                Some(i) if i <= room => {
                    if self.line.is_empty() {
                        batch.push(std::borrow::Cow::Borrowed(&rest[..i]));
                    } else {
                        self.line.extend_from_slice(&rest[..i]);
                        batch.push(std::borrow::Cow::Owned(std::mem::take(&mut self.line)));
                    }
                    rest = &rest[i + 1..];
                }
                _ => {
                    let take = rest.len().min(room);
                    self.line.extend_from_slice(&rest[..take]);
                    rest = &rest[take..];
                    if self.line.len() >= MAX_ENTRY_BYTES {
                        batch.push(std::borrow::Cow::Owned(std::mem::take(&mut self.line)));
                    }
                }
            }
        }
        if !batch.is_empty() {
            let texts: Vec<&[u8]> = batch.iter().map(|c| c.as_ref()).collect();
            // A failure is counted and reported by the writer itself.
            let _ = writer.write_entries(self.stream, &texts);
        }
    }

    /// At EOF: the last line, if it has no newline, is an entry too.
    fn finish(&mut self, writer: &LogWriter) {
        if !self.line.is_empty() {
            // A failure is counted and reported by the writer itself.
            let _ = writer.write_entry(self.stream, &self.line);
            self.line.clear();
        }
        self.open = false;
    }
}

/// L22: one reader over both of the program's pipes, so that its stdout and stderr lines
/// keep the order in which it wrote them as far as the kernel can tell: each entry is
/// stamped when it is read, and whichever pipe has data first is read first (when both
/// have, stdout before stderr). The supervisor polls the pipes beside its signals, in its
/// one thread, and hands over which are ready: an output reader of its own would be a
/// thread (its stack, a malloc arena, and TLB shootdowns at exit) per replica.
pub struct Pump {
    files: [File; 2],
    split: [Splitter; 2],
    /// Never zeroed: a program that writes little never touches most of it.
    buf: Vec<u8>,
}

impl Pump {
    pub fn new(stdout: File, stderr: File) -> Pump {
        Pump {
            files: [stdout, stderr],
            split: [Splitter::new("stdout"), Splitter::new("stderr")],
            buf: Vec::with_capacity(64 * 1024),
        }
    }

    /// Whether a pipe is still open (its writers may still write).
    pub fn is_open(&self) -> bool {
        self.split.iter().any(|s| s.open)
    }

    /// The pipes still open, to poll for input: 0 is stdout, 1 stderr.
    pub fn pipes(&self) -> impl Iterator<Item = (usize, BorrowedFd<'_>)> {
        self.files.iter().enumerate().filter(|(i, _)| self.split[*i].open).map(|(i, f)| (i, f.as_fd()))
    }

    /// Reads once from each pipe marked ready (stdout first) and writes its complete
    /// lines; at EOF, the last line without a newline too, and the pipe is closed for
    /// good. A line that cannot be written is dropped and counted by the writer, and the
    /// pipe is still drained, so the program never blocks on a full pipe.
    pub fn read_ready(&mut self, ready: [bool; 2], writer: &LogWriter) {
        for (i, ready) in ready.into_iter().enumerate() {
            if !ready || !self.split[i].open {
                continue;
            }
            match read_into(&self.files[i], &mut self.buf) {
                Ok(0) => self.split[i].finish(writer),
                Ok(n) => self.split[i].feed(&self.buf[..n], writer),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    let _ = writeln!(io::stderr(), "trainyard shim: reading the program's {}: {e}", self.split[i].stream);
                    self.split[i].open = false;
                }
            }
        }
    }
}

/// One `read(2)` of `file` into `buf`'s capacity, which it then holds (its length is what
/// was read).
fn read_into(file: &File, buf: &mut Vec<u8>) -> io::Result<usize> {
    use std::os::fd::AsRawFd;
    buf.clear();
    // SAFETY: read(2) writes at most `capacity` bytes into the vector's own allocation;
    // the length is set to the count it reports, all of them written by it.
    let n = unsafe { libc::read(file.as_raw_fd(), buf.as_mut_ptr().cast(), buf.capacity()) };
    let n = usize::try_from(n).map_err(|_| io::Error::last_os_error())?;
    // SAFETY: n <= capacity, and those n bytes were written by the read above.
    unsafe { buf.set_len(n) };
    Ok(n)
}

/// Reads the complete entries of `<run_dir>/log.jsonl` from byte `from_offset` on, and
/// the offset to continue from. A trailing partial line (being written) is left for the
/// next call; a missing file reads as empty. Malformed lines are skipped.
pub fn read_log(run_dir: &Path, from_offset: u64) -> Result<(Vec<LogEntry>, u64), FileError> {
    read_path(&run_dir.join(LOG_FILE), from_offset)
}

/// Where a reader is in a run's log, across rotations: the file (its inode) and the
/// offset in it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LogPos {
    pub inode: u64,
    pub offset: u64,
}

/// As `read_log`, across a rotation (`log.jsonl` renamed `log.1.jsonl`): a reader from
/// the start (`LogPos::default()`) begins with the rotated file; a reader in the file that
/// was rotated reads it to its end, then the new one from its start. A reader that was two
/// rotations behind goes on with the current file (what was between is gone).
pub fn read_log_from(run_dir: &Path, pos: LogPos) -> Result<(Vec<LogEntry>, LogPos), FileError> {
    use std::os::unix::fs::MetadataExt;
    let current = run_dir.join(LOG_FILE);
    let inode = match std::fs::metadata(&current) {
        Ok(m) => m.ino(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok((Vec::new(), pos)),
        Err(e) => return Err(FileError { op: "stat", path: current, source: e }),
    };
    let old = run_dir.join(ROTATED_FILE);
    // A reader from the start reads what is kept of the rotated file first.
    let pos = match (pos.inode, std::fs::metadata(&old)) {
        (0, Ok(m)) => LogPos { inode: m.ino(), offset: 0 },
        _ => pos,
    };
    if pos.inode == 0 || pos.inode == inode {
        let (entries, offset) = read_path(&current, pos.offset)?;
        return Ok((entries, LogPos { inode, offset }));
    }
    if std::fs::metadata(&old).is_ok_and(|m| m.ino() == pos.inode) {
        let (entries, offset) = read_path(&old, pos.offset)?;
        if !entries.is_empty() || offset != pos.offset {
            return Ok((entries, LogPos { inode: pos.inode, offset }));
        }
    }
    let (entries, offset) = read_path(&current, 0)?;
    Ok((entries, LogPos { inode, offset }))
}

fn read_path(path: &Path, from_offset: u64) -> Result<(Vec<LogEntry>, u64), FileError> {
    let path = path.to_path_buf();
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

    /// `input` written into a pipe by a thread and read by a [`Pump`] to its end, as the
    /// program's stdout (its stderr is closed at once).
    fn split_all(input: &[u8], w: &LogWriter) {
        let (out_r, out_w) = nix::unistd::pipe().unwrap();
        let (err_r, err_w) = nix::unistd::pipe().unwrap();
        drop(err_w);
        let input = input.to_vec();
        let writer = std::thread::spawn(move || File::from(out_w).write_all(&input).unwrap());
        let mut pump = Pump::new(File::from(out_r), File::from(err_r));
        while pump.is_open() {
            let ready = [pump.pipes().any(|(i, _)| i == 0), pump.pipes().any(|(i, _)| i == 1)];
            pump.read_ready(ready, w);
        }
        writer.join().unwrap();
    }

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

    /// L22 on a full disk: entries that cannot be written are dropped and counted, the
    /// pump keeps draining, and the first entry written afterwards is preceded by a note
    /// with the count; a torn entry does not swallow the next one.
    #[test]
    fn l22_a_full_disk_drops_and_counts_lines_then_notes_the_gap() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(LOG_FILE);
        let w = LogWriter::open(&path).unwrap();
        w.write_entry("stdout", b"before").unwrap();
        // The disk fills up in the middle of an entry (as a short write leaves it) ...
        {
            let mut f = fsutil::open_append(&path).unwrap();
            f.write_all(br#"{"time":"2026-11-29T10:00:00.000000Z","stream":"std"#).unwrap();
        }
        w.state().torn = true;
        // ... and stays full for a while.
        w.replace_file(File::options().write(true).open("/dev/full").unwrap());
        let input: Vec<u8> = (0..1000).flat_map(|i| format!("lost {i}\n").into_bytes()).collect();
        split_all(&input, &w);
        let e = w.write_entry("stderr", b"also lost").unwrap_err();
        assert_eq!(e.source.raw_os_error(), Some(libc::ENOSPC), "{e}");
        assert_eq!(w.dropped(), 1001);
        assert!(w.flush().is_err(), "the note cannot be written yet");
        // Space is back.
        w.replace_file(fsutil::open_append(&path).unwrap());
        w.write_entry("stdout", b"after").unwrap();
        assert_eq!(w.dropped(), 0);
        let (es, _) = read_log(dir.path(), 0).unwrap();
        let texts: Vec<&str> = es.iter().map(|e| e.text.as_str()).collect();
        assert_eq!(texts.len(), 3, "{texts:?}");
        assert_eq!(texts[0], "before");
        assert_eq!(es[1].stream, "stderr");
        assert!(texts[1].contains("1001 lines of output could not be written") && texts[1].contains("No space left"), "{}", texts[1]);
        assert_eq!(texts[2], "after");
        // Nothing is owed any more.
        w.write_dropped_note().unwrap();
        w.flush().unwrap();
        assert_eq!(read_log(dir.path(), 0).unwrap().0.len(), 3);
    }

    #[test]
    fn pump_splits_lines_flushes_partial_and_bounds_entries() {
        let dir = tempfile::tempdir().unwrap();
        let w = LogWriter::open(&dir.path().join(LOG_FILE)).unwrap();
        let mut input = b"one\n\ntwo \xff\n".to_vec();
        input.extend(std::iter::repeat_n(b'y', MAX_ENTRY_BYTES + 10));
        input.extend_from_slice(b"\nlast");
        split_all(&input, &w);
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
