//! A streaming parser of the `multipart/related` body of `uploadType=multipart`: exactly
//! two parts, the object's JSON metadata (small, held) and its bytes (streamed out as they
//! come, never held whole).
//!
//! ```text
//! --B\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n{...}\r\n--B\r\nContent-Type: T\r\n\r\nBYTES\r\n--B--
//! ```

use axum::body::Bytes;

/// Largest metadata part, and largest header block of a part.
pub const MAX_META: usize = 1024 * 1024;
const MAX_HEADERS: usize = 16 * 1024;

/// What the parser gives back, in this order: `Meta`, `MediaType`, then `Data` pieces.
#[derive(Debug, PartialEq, Eq)]
pub enum Piece {
    Meta(Vec<u8>),
    /// The media part's `Content-Type`, if it has one.
    MediaType(Option<String>),
    Data(Bytes),
}

#[derive(Debug, PartialEq, Eq)]
enum State {
    /// Before the first boundary (a preamble is allowed).
    Preamble,
    /// After a boundary: the rest of its line.
    BoundaryLine { part: u8 },
    Headers { part: u8 },
    Meta,
    Data,
    /// After the media part's closing delimiter: `--` (the end) must follow.
    AfterData,
    Done,
}

pub struct Multipart {
    /// `\r\n--BOUNDARY`
    delim: Vec<u8>,
    state: State,
    /// Bytes not yet consumed, outside the media part.
    buf: Vec<u8>,
    /// In the media part: the last bytes, which may begin the delimiter.
    carry: Bytes,
}

/// The boundary of a `multipart/related; boundary=...` content type.
pub fn boundary_of(content_type: &str) -> Option<String> {
    let mut parts = content_type.split(';');
    let mime = parts.next()?.trim().to_ascii_lowercase();
    if mime != "multipart/related" && mime != "multipart/mixed" && mime != "multipart/form-data" {
        return None;
    }
    for p in parts {
        let (k, v) = p.split_once('=')?;
        if k.trim().eq_ignore_ascii_case("boundary") {
            let v = v.trim().trim_matches('"');
            if !v.is_empty() && v.len() <= 200 {
                return Some(v.to_string());
            }
        }
    }
    None
}

impl Multipart {
    pub fn new(boundary: &str) -> Multipart {
        let mut delim = b"\r\n--".to_vec();
        delim.extend_from_slice(boundary.as_bytes());
        // The first boundary may open the body without a line break before it.
        Multipart { delim, state: State::Preamble, buf: b"\r\n".to_vec(), carry: Bytes::new() }
    }

    /// Feed the next bytes of the body; the pieces they complete are appended to `out`.
    pub fn feed(&mut self, chunk: Bytes, out: &mut Vec<Piece>) -> Result<(), String> {
        if self.state == State::Data {
            return self.data(chunk, out);
        }
        self.buf.extend_from_slice(&chunk);
        self.advance(out)
    }

    /// The body ended: it must have been complete.
    pub fn finish(&self) -> Result<(), String> {
        match self.state {
            State::Done => Ok(()),
            State::Preamble | State::BoundaryLine { part: 0 } | State::Headers { part: 0 } | State::Meta => {
                Err("The multipart body ends before its metadata part is complete.".into())
            }
            State::BoundaryLine { .. } | State::Headers { .. } => Err("The multipart body has no media part.".into()),
            State::Data | State::AfterData => Err("The multipart body ends before its closing boundary.".into()),
        }
    }

    fn advance(&mut self, out: &mut Vec<Piece>) -> Result<(), String> {
        loop {
            match self.state {
                State::Preamble => {
                    let Some(i) = find(&self.buf, &self.delim) else {
                        if self.buf.len() > MAX_HEADERS {
                            return Err("The multipart body does not start with its boundary.".into());
                        }
                        return Ok(());
                    };
                    self.buf.drain(..i + self.delim.len());
                    self.state = State::BoundaryLine { part: 0 };
                }
                State::BoundaryLine { part } => {
                    // `--` closes the body; else the line ends (transport padding allowed).
                    if self.buf.len() < 2 {
                        return Ok(());
                    }
                    if self.buf.starts_with(b"--") {
                        return Err(if part == 0 {
                            "The multipart body has no parts.".into()
                        } else {
                            "The multipart body has no media part: it must have two parts, the metadata and the media.".into()
                        });
                    }
                    let Some(i) = find(&self.buf, b"\r\n") else {
                        if self.buf.len() > MAX_HEADERS {
                            return Err("A multipart boundary line is too long.".into());
                        }
                        return Ok(());
                    };
                    if !self.buf[..i].iter().all(|b| *b == b' ' || *b == b'\t') {
                        return Err("A multipart boundary is followed by other text on its line.".into());
                    }
                    // Keep the line break: a part without headers is an empty line.
                    self.buf.drain(..i);
                    self.state = State::Headers { part };
                }
                State::Headers { part } => {
                    let Some(i) = find(&self.buf, b"\r\n\r\n") else {
                        if self.buf.len() > MAX_HEADERS {
                            return Err("A multipart part's headers are too long.".into());
                        }
                        return Ok(());
                    };
                    let headers = String::from_utf8_lossy(self.buf.get(2..i).unwrap_or_default()).into_owned();
                    self.buf.drain(..i + 4);
                    let mut content_type = None;
                    for line in headers.split("\r\n") {
                        let Some((k, v)) = line.split_once(':') else { continue };
                        let k = k.trim().to_ascii_lowercase();
                        if k == "content-type" {
                            content_type = Some(v.trim().to_string());
                        } else if k == "content-transfer-encoding"
                            && !matches!(v.trim().to_ascii_lowercase().as_str(), "binary" | "8bit" | "7bit")
                        {
                            return Err(format!("Content-Transfer-Encoding {:?} is not supported: send the bytes as binary.", v.trim()));
                        }
                    }
                    if part == 0 {
                        self.state = State::Meta;
                    } else {
                        out.push(Piece::MediaType(content_type));
                        self.state = State::Data;
                        let rest = Bytes::from(std::mem::take(&mut self.buf));
                        return self.data(rest, out);
                    }
                }
                State::Meta => {
                    let Some(i) = find(&self.buf, &self.delim) else {
                        if self.buf.len() > MAX_META + self.delim.len() {
                            return Err(format!("The multipart metadata part is larger than {MAX_META} bytes."));
                        }
                        return Ok(());
                    };
                    out.push(Piece::Meta(self.buf[..i].to_vec()));
                    self.buf.drain(..i + self.delim.len());
                    self.state = State::BoundaryLine { part: 1 };
                }
                State::AfterData => {
                    if self.buf.len() < 2 {
                        return Ok(());
                    }
                    if self.buf.starts_with(b"--") {
                        // The epilogue, if any, is ignored.
                        self.buf.clear();
                        self.state = State::Done;
                        return Ok(());
                    }
                    return Err("The multipart body has more than two parts: it must have the metadata and the media only.".into());
                }
                State::Done => {
                    self.buf.clear();
                    return Ok(());
                }
                State::Data => return Ok(()),
            }
        }
    }

    /// Bytes of the media part: everything up to the delimiter, which may straddle chunks.
    fn data(&mut self, chunk: Bytes, out: &mut Vec<Piece>) -> Result<(), String> {
        let d = self.delim.len();
        let carry = std::mem::take(&mut self.carry);
        // A delimiter that begins in the carried bytes lies within carry + d-1 bytes.
        if !carry.is_empty() {
            let mut joint = carry.to_vec();
            joint.extend_from_slice(&chunk[..chunk.len().min(d - 1)]);
            if let Some(i) = find(&joint, &self.delim) {
                let in_carry = i.min(carry.len());
                if in_carry > 0 {
                    out.push(Piece::Data(carry.slice(..in_carry)));
                }
                let after = i + d - carry.len();
                return self.after_data(chunk.slice(after..), out);
            }
            if chunk.len() < d - 1 {
                // Still no room to decide: carry everything that may begin a delimiter.
                let keep = joint.len().min(d - 1);
                let emit = joint.len() - keep;
                if emit > 0 {
                    out.push(Piece::Data(Bytes::copy_from_slice(&joint[..emit])));
                }
                self.carry = Bytes::copy_from_slice(&joint[emit..]);
                return Ok(());
            }
            out.push(Piece::Data(carry));
        }
        if let Some(i) = memchr::memmem::find(&chunk, &self.delim) {
            if i > 0 {
                out.push(Piece::Data(chunk.slice(..i)));
            }
            return self.after_data(chunk.slice(i + d..), out);
        }
        let keep = chunk.len().min(d - 1);
        let emit = chunk.len() - keep;
        if emit > 0 {
            out.push(Piece::Data(chunk.slice(..emit)));
        }
        self.carry = chunk.slice(emit..);
        Ok(())
    }

    fn after_data(&mut self, rest: Bytes, out: &mut Vec<Piece>) -> Result<(), String> {
        self.state = State::AfterData;
        self.buf = rest.to_vec();
        self.advance(out)
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    memchr::memmem::find(hay, needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(boundary: &str, meta: &str, ct: &str, data: &[u8], close: &str) -> Vec<u8> {
        let mut b = format!("--{boundary}\r\ncontent-type: application/json; charset=UTF-8\r\n\r\n{meta}\r\n--{boundary}\r\ncontent-type: {ct}\r\n\r\n").into_bytes();
        b.extend_from_slice(data);
        b.extend_from_slice(format!("\r\n--{boundary}{close}").as_bytes());
        b
    }

    /// (metadata, media type, data)
    type Parsed = (Vec<u8>, Option<String>, Vec<u8>);

    fn parse(body: &[u8], boundary: &str, step: usize) -> Result<Parsed, String> {
        let mut p = Multipart::new(boundary);
        let mut out = Vec::new();
        for c in body.chunks(step.max(1)) {
            p.feed(Bytes::copy_from_slice(c), &mut out)?;
        }
        p.finish()?;
        let (mut meta, mut ct, mut data) = (Vec::new(), None, Vec::new());
        for piece in out {
            match piece {
                Piece::Meta(m) => meta = m,
                Piece::MediaType(t) => ct = t,
                Piece::Data(d) => data.extend_from_slice(&d),
            }
        }
        Ok((meta, ct, data))
    }

    #[test]
    fn any_chunking_gives_the_same_parts() {
        let b = "===============7330845974216740156==";
        // Data with near-delimiters in it.
        let mut data = b"\r\n--=====\r\n--".to_vec();
        data.extend((0..5000u32).map(|i| (i % 251) as u8));
        data.extend_from_slice(format!("\r\n-{b}").as_bytes());
        for close in ["--", "--\r\n", "--\r\nepilogue"] {
            let whole = body(b, r#"{"name": "x"}"#, "text/plain", &data, close);
            for step in [1, 2, 3, 7, 64, 1000, whole.len()] {
                let (m, ct, d) = parse(&whole, b, step).unwrap();
                assert_eq!(m, br#"{"name": "x"}"#);
                assert_eq!(ct.as_deref(), Some("text/plain"));
                assert_eq!(d, data, "step {step}");
            }
        }
        let empty = body(b, "{}", "a/b", b"", "--");
        assert_eq!(parse(&empty, b, 5).unwrap().2, b"");
    }

    #[test]
    fn incomplete_or_extra_parts_are_errors() {
        let b = "BOUND";
        let whole = body(b, "{}", "a/b", b"abc", "--");
        // Cut anywhere before the closing `--`: an error at the end.
        for cut in 0..whole.len() - 2 {
            assert!(parse(&whole[..cut], b, 4).is_err(), "cut at {cut}");
        }
        let only_meta = format!("--{b}\r\ncontent-type: application/json\r\n\r\n{{}}\r\n--{b}--");
        assert!(parse(only_meta.as_bytes(), b, 3).unwrap_err().contains("no media part"));
        let three = format!("--{b}\r\n\r\n{{}}\r\n--{b}\r\n\r\nx\r\n--{b}\r\n\r\ny\r\n--{b}--");
        assert!(parse(three.as_bytes(), b, 3).unwrap_err().contains("more than two"));
        assert_eq!(boundary_of("multipart/related; boundary=\"==x==\""), Some("==x==".into()));
        assert_eq!(boundary_of("application/json"), None);
    }
}
