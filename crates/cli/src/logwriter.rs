//! The server log's writer: one event is one line. tracing's formatter writes each event
//! with one `write_all` ending in a newline; any other line break or control character in
//! it (from user text such as a `displayName`, shown with `{}` somewhere) is written
//! escaped (`\n`, `\r`, `\u{1b}`...), so that no text can start a forged log line or send
//! terminal escape sequences. The colour codes of a terminal log are kept.

use std::io::{self, Write};

use tracing_subscriber::fmt::MakeWriter;

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

/// Standard error, one escaped event per write.
pub struct EscapingStderr {
    pub ansi: bool,
}

pub struct EscapingWriter {
    ansi: bool,
}

impl Write for EscapingWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        io::stderr().lock().write_all(&escape_event(buf, self.ansi))?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        io::stderr().flush()
    }
}

impl<'a> MakeWriter<'a> for EscapingStderr {
    type Writer = EscapingWriter;

    fn make_writer(&'a self) -> Self::Writer {
        EscapingWriter { ansi: self.ansi }
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
}
