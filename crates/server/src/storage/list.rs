//! Listing a bucket: its regular files, in the byte order of their names, below the
//! directory of the `prefix`, with `startOffset`/`endOffset`, a `delimiter` (common
//! prefixes) and pages.
//!
//! The walk is depth first, each directory's entries sorted by name with `/` appended to
//! directories' names: that order is the order of the full names (an entry name has no
//! `/`). Subtrees entirely below the lower bound, outside the prefix or at or above the
//! upper bound are not entered. Links are not followed, not listed; directories are not
//! objects, so an empty directory is no prefix either.

use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use base64::Engine as _;
use nix::fcntl::OFlag;

use super::error::{GcsError, GcsResult};
use super::fsops::{open_object, read_dir_entries};
use super::meta::ObjectInfo;

/// What names are wanted: `lower <= name`, `name` starting with `prefix`, `name < upper`.
#[derive(Clone, Debug, Default)]
pub struct Bounds {
    pub lower: Vec<u8>,
    pub prefix: Vec<u8>,
    pub upper: Option<Vec<u8>>,
}

struct Frame {
    dir: OwnedFd,
    /// The directory's path below the bucket, "" or ending with '/'.
    path: String,
    /// (sort key: the name, with '/' for a directory; is a directory)
    entries: Vec<(String, bool)>,
    idx: usize,
}

impl Frame {
    fn open(dir: OwnedFd, path: String, lower: &[u8]) -> Option<Frame> {
        let dup = dir.try_clone().ok()?;
        let mut d = nix::dir::Dir::from_fd(dup).ok()?;
        let mut entries: Vec<(String, bool)> =
            read_dir_entries(&mut d).into_iter().map(|(n, is_dir)| (if is_dir { format!("{n}/") } else { n }, is_dir)).collect();
        entries.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
        // Start at the first entry that can hold a name at or above `lower`.
        let full = |k: &str| [path.as_bytes(), k.as_bytes()].concat();
        let mut idx = entries.partition_point(|(k, _)| full(k).as_slice() < lower);
        if idx > 0 && entries[idx - 1].1 && lower.starts_with(&full(&entries[idx - 1].0)) {
            idx -= 1;
        }
        Some(Frame { dir, path, entries, idx })
    }
}

/// A depth-first walk of a bucket's files, in name order.
pub struct Walker {
    stack: Vec<Frame>,
    started: Option<(OwnedFd, String)>,
}

impl Walker {
    /// A walk of the directory `dir`, whose path below the bucket is `path` ("" or ending
    /// with '/').
    pub fn new(dir: OwnedFd, path: String) -> Walker {
        Walker { stack: Vec::new(), started: Some((dir, path)) }
    }

    /// The next file within `b` (whose lower bound may have risen since the last call):
    /// its name and what the API shows of it.
    pub fn next_file(&mut self, b: &Bounds) -> GcsResult<Option<(String, ObjectInfo)>> {
        if let Some((dir, path)) = self.started.take() {
            if let Some(f) = Frame::open(dir, path, &b.lower) {
                self.stack.push(f);
            }
        }
        loop {
            let Some(top) = self.stack.last_mut() else { return Ok(None) };
            let Some((key, is_dir)) = top.entries.get(top.idx).cloned() else {
                self.stack.pop();
                continue;
            };
            top.idx += 1;
            let full = format!("{}{key}", top.path);
            let fb = full.as_bytes();
            // At or above the upper bound: so is everything after.
            if b.upper.as_deref().is_some_and(|u| fb >= u) {
                self.stack.clear();
                return Ok(None);
            }
            if !(fb.starts_with(&b.prefix) || (is_dir && b.prefix.starts_with(fb))) {
                if fb > b.prefix.as_slice() {
                    // Past the prefix: so is everything after.
                    self.stack.clear();
                    return Ok(None);
                }
                continue;
            }
            if fb < b.lower.as_slice() && !(is_dir && b.lower.starts_with(fb)) {
                continue;
            }
            let name = key.trim_end_matches('/');
            if is_dir {
                let Ok(sub) = crate::paths::open_beneath(top.dir.as_fd(), Path::new(name), OFlag::O_RDONLY | OFlag::O_DIRECTORY) else {
                    continue;
                };
                if let Some(f) = Frame::open(sub, full, &b.lower) {
                    self.stack.push(f);
                }
                continue;
            }
            if let Some(o) = open_object(top.dir.as_fd(), name)? {
                return Ok(Some((full, o.info)));
            }
        }
    }
}

/// One page of a listing.
#[derive(Debug, Default)]
pub struct Page {
    pub items: Vec<(String, ObjectInfo)>,
    pub prefixes: Vec<String>,
    pub next_token: Option<String>,
}

/// The listing's query, checked.
#[derive(Clone, Debug, Default)]
pub struct ListQuery {
    pub prefix: String,
    pub delimiter: Option<String>,
    pub start_offset: Option<String>,
    pub end_offset: Option<String>,
    pub page_token: Option<String>,
    pub max: usize,
}

/// The smallest byte string above every string that starts with `p`.
fn past(p: &str) -> Vec<u8> {
    let mut v = p.as_bytes().to_vec();
    while let Some(last) = v.pop() {
        if last < 0xFF {
            v.push(last + 1);
            return v;
        }
    }
    vec![0xFF; 1025]
}

fn encode_token(lower: &[u8]) -> String {
    let mut t = b"1".to_vec();
    t.extend_from_slice(lower);
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(t)
}

fn decode_token(token: &str) -> GcsResult<Vec<u8>> {
    let bad = || GcsError::invalid(format!("Invalid pageToken {:?}.", super::names::shown(token)));
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(token.trim_end_matches('=')).map_err(|_| bad())?;
    match raw.split_first() {
        Some((b'1', rest)) if rest.len() <= 2048 => Ok(rest.to_vec()),
        _ => Err(bad()),
    }
}

/// A page of the bucket (its directory `bucket`).
pub fn page(bucket: OwnedFd, q: &ListQuery) -> GcsResult<Page> {
    let mut b = Bounds { lower: q.prefix.as_bytes().to_vec(), prefix: q.prefix.as_bytes().to_vec(), upper: None };
    if let Some(s) = &q.start_offset {
        b.lower = b.lower.max(s.as_bytes().to_vec());
    }
    if let Some(t) = &q.page_token {
        b.lower = b.lower.max(decode_token(t)?);
    }
    if let Some(e) = &q.end_offset {
        b.upper = Some(e.as_bytes().to_vec());
    }
    // Start in the prefix's directory; a prefix whose directory part cannot be a path of
    // objects names nothing.
    let dir_part = match q.prefix.rfind('/') {
        Some(i) => &q.prefix[..=i],
        None => "",
    };
    let segments_ok = dir_part.is_empty()
        || dir_part[..dir_part.len() - 1]
            .split('/')
            .all(|s| !s.is_empty() && s != "." && s != ".." && !s.starts_with(super::names::HIDDEN_PREFIX));
    let mut page = Page::default();
    if !segments_ok {
        return Ok(page);
    }
    let start = if dir_part.is_empty() {
        bucket
    } else {
        match crate::paths::open_beneath(bucket.as_fd(), Path::new(dir_part.trim_end_matches('/')), OFlag::O_RDONLY | OFlag::O_DIRECTORY) {
            Ok(fd) => fd,
            Err(_) => return Ok(page),
        }
    };
    let mut w = Walker::new(start, dir_part.to_string());
    let delim = q.delimiter.as_deref().filter(|d| !d.is_empty());
    let mut count = 0;
    while let Some((name, info)) = w.next_file(&b)? {
        let rest = &name[q.prefix.len().min(name.len())..];
        let rolled = delim.and_then(|d| rest.find(d).map(|i| format!("{}{}", q.prefix, &rest[..i + d.len()])));
        if count == q.max {
            page.next_token = Some(encode_token(&b.lower));
            break;
        }
        count += 1;
        match rolled {
            Some(p) => {
                b.lower = past(&p);
                page.prefixes.push(p);
            }
            None => {
                let mut l = name.as_bytes().to_vec();
                l.push(0);
                b.lower = l;
                page.items.push((name, info));
            }
        }
    }
    Ok(page)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(root: &Path, q: &ListQuery) -> (Vec<String>, Vec<String>, Option<String>) {
        let fd = nix::fcntl::open(root, OFlag::O_RDONLY | OFlag::O_DIRECTORY, nix::sys::stat::Mode::empty()).unwrap();
        let p = page(fd, q).unwrap();
        (p.items.into_iter().map(|(n, _)| n).collect(), p.prefixes, p.next_token)
    }

    fn q() -> ListQuery {
        ListQuery { max: 1000, ..Default::default() }
    }

    #[test]
    fn names_in_byte_order_with_prefixes_pages_and_offsets() {
        let t = tempfile::tempdir().unwrap();
        let r = t.path();
        for f in ["a0", "a-c", "a/b", "a/b2/x", "a/c", "b", "b0/z", "c/d/e/f", ".trainyard-x", "z/.trainyard/q"] {
            let p = r.join(f);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, f).unwrap();
        }
        std::fs::create_dir_all(r.join("empty/deeper")).unwrap();
        std::os::unix::fs::symlink("/etc", r.join("link")).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", r.join("a/passwd")).unwrap();
        let all = names(r, &q()).0;
        assert_eq!(all, ["a-c", "a/b", "a/b2/x", "a/c", "a0", "b", "b0/z", "c/d/e/f"]);
        let mut sorted = all.clone();
        sorted.sort();
        assert_eq!(all, sorted);
        let (items, prefixes, _) = names(r, &ListQuery { delimiter: Some("/".into()), ..q() });
        assert_eq!(items, ["a-c", "a0", "b"]);
        assert_eq!(prefixes, ["a/", "b0/", "c/"], "an empty directory is no prefix");
        let (items, prefixes, _) = names(r, &ListQuery { prefix: "a/".into(), delimiter: Some("/".into()), ..q() });
        assert_eq!((items, prefixes), (vec!["a/b".to_string(), "a/c".into()], vec!["a/b2/".to_string()]));
        assert_eq!(names(r, &ListQuery { prefix: "a/b".into(), ..q() }).0, ["a/b", "a/b2/x"]);
        assert_eq!(names(r, &ListQuery { prefix: "nothing/".into(), ..q() }).0, Vec::<String>::new());
        assert_eq!(names(r, &ListQuery { prefix: "../".into(), ..q() }).0, Vec::<String>::new());
        assert_eq!(names(r, &ListQuery { prefix: "link/".into(), ..q() }).0, Vec::<String>::new());
        assert_eq!(
            names(r, &ListQuery { start_offset: Some("a/b2".into()), end_offset: Some("b0".into()), ..q() }).0,
            ["a/b2/x", "a/c", "a0", "b"]
        );
        // Pages of 3, then the rest; with a delimiter a prefix counts as one entry.
        let (p1, _, tok) = names(r, &ListQuery { max: 3, ..q() });
        assert_eq!(p1, ["a-c", "a/b", "a/b2/x"]);
        let (p2, _, tok2) = names(r, &ListQuery { max: 3, page_token: tok, ..q() });
        assert_eq!(p2, ["a/c", "a0", "b"]);
        let (p3, _, tok3) = names(r, &ListQuery { max: 3, page_token: tok2, ..q() });
        assert_eq!((p3, tok3), (vec!["b0/z".to_string(), "c/d/e/f".into()], None));
        let d = ListQuery { delimiter: Some("/".into()), max: 2, ..q() };
        let (i1, p1, t1) = names(r, &d);
        assert_eq!((i1, p1), (vec!["a-c".to_string()], vec!["a/".to_string()]));
        let (i2, p2, t2) = names(r, &ListQuery { page_token: t1, ..d.clone() });
        assert_eq!((i2, p2), (vec!["a0".to_string(), "b".into()], vec![]));
        let (i3, p3, t3) = names(r, &ListQuery { page_token: t2, ..d.clone() });
        assert_eq!((i3, p3, t3), (vec![], vec!["b0/".to_string(), "c/".into()], None));
        assert!(decode_token("!!").is_err());
    }
}
