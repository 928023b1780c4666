//! Bucket and object names, and the parts of a request that carry them.
//!
//! An object name is a relative path below its bucket's directory, so only names a file
//! can have are accepted: 1-1024 bytes of UTF-8 without NUL, CR or LF; no leading `/`, no
//! empty, `.` or `..` segment (so no trailing `/` either), no segment longer than 255
//! bytes, and no segment starting with `.trainyard` (the server's own files).

use std::collections::HashMap;

use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

use super::error::{GcsError, GcsResult};

/// What the server's own hidden entries start with.
pub const HIDDEN_PREFIX: &str = ".trainyard";

/// Longest object name, in bytes (the service's limit).
pub const MAX_NAME_BYTES: usize = 1024;

/// A bucket name: 3-63 characters of `[a-z0-9._-]`, starting and ending with a letter or a
/// digit. Returns why not.
pub fn bucket_problem(name: &str) -> Option<&'static str> {
    let b = name.as_bytes();
    if b.len() < 3 || b.len() > 63 {
        return Some("must have 3 to 63 characters");
    }
    if !b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, b'.' | b'_' | b'-')) {
        return Some("may only contain lowercase letters, digits, '.', '_' and '-'");
    }
    let alnum = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    if !alnum(&b[0]) || !alnum(&b[b.len() - 1]) {
        return Some("must start and end with a letter or a digit");
    }
    None
}

pub fn check_bucket(name: &str) -> GcsResult<()> {
    match bucket_problem(name) {
        None => Ok(()),
        Some(why) => Err(GcsError::invalid(format!("Invalid bucket name {:?}: it {why}.", shown(name)))),
    }
}

/// Why `name` cannot be an object name here, or None.
pub fn object_problem(name: &str) -> Option<String> {
    if name.is_empty() {
        return Some("is empty".into());
    }
    if name.len() > MAX_NAME_BYTES {
        return Some(format!("is longer than {MAX_NAME_BYTES} bytes"));
    }
    if name.contains(['\0', '\r', '\n']) {
        return Some("contains a NUL, carriage return or line feed character".into());
    }
    if name.starts_with('/') {
        return Some("starts with '/'".into());
    }
    for seg in name.split('/') {
        match seg {
            "" => return Some("has an empty segment ('//' or a trailing '/'), which a file cannot have on this server".into()),
            "." | ".." => return Some("has a '.' or '..' segment".into()),
            s if s.starts_with(HIDDEN_PREFIX) => return Some(format!("has a segment starting with {HIDDEN_PREFIX:?}, reserved for the server")),
            s if s.len() > 255 => return Some("has a segment longer than 255 bytes".into()),
            _ => {}
        }
    }
    None
}

pub fn check_object(name: &str) -> GcsResult<()> {
    match object_problem(name) {
        None => Ok(()),
        Some(why) => Err(GcsError::invalid(format!("Invalid object name {:?}: it {why}.", shown(name)))),
    }
}

/// A project id that can name a namespace directory below the storage root (as
/// `jobspec::resolve_uri` requires).
pub fn project_problem(project: &str) -> Option<&'static str> {
    if project.is_empty() || project == "." || project == ".." || project.contains(['/', '\0']) {
        return Some("cannot name a storage namespace");
    }
    if project.starts_with('.') {
        return Some("starts with '.'");
    }
    None
}

/// At most 200 characters of user text for a message.
pub fn shown(s: &str) -> String {
    s.chars().take(200).collect()
}

/// Percent-decode a path segment (strictly: the result must be UTF-8).
pub fn decode_segment(raw: &str) -> GcsResult<String> {
    percent_encoding::percent_decode_str(raw)
        .decode_utf8()
        .map(|c| c.into_owned())
        .map_err(|_| GcsError::invalid(format!("{:?} is not percent-encoded UTF-8.", shown(raw))))
}

/// Characters encoded in a name placed in a path (as the client library does).
const PATH_SET: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'_').remove(b'.').remove(b'~');

pub fn encode(name: &str) -> String {
    utf8_percent_encode(name, PATH_SET).to_string()
}

/// The parts of a request path below one of the API's prefixes.
#[derive(Debug, PartialEq, Eq)]
pub struct ObjectPath {
    pub bucket: String,
    pub object: String,
}

/// `<prefix>/b/{bucket}/o/{object}` with the object percent-encoded (`/` as `%2F`, or
/// left as is); the bucket is checked, the object too.
pub fn parse_object_path(path: &str, prefix: &str) -> GcsResult<ObjectPath> {
    let rest = path.strip_prefix(prefix).and_then(|r| r.strip_prefix("/b/")).ok_or_else(|| GcsError::not_found("Not found."))?;
    let (bucket, object) = rest.split_once("/o/").ok_or_else(|| GcsError::not_found("Not found."))?;
    let bucket = decode_segment(bucket)?;
    check_bucket(&bucket)?;
    let object = decode_segment(object)?;
    check_object(&object)?;
    Ok(ObjectPath { bucket, object })
}

/// The query string as a map (form encoding: `+` is a space; the last value of a key
/// wins). A value that is not percent-encoded UTF-8 is refused, never made into
/// something else.
pub fn query(raw: Option<&str>) -> GcsResult<HashMap<String, String>> {
    let mut out = HashMap::new();
    for pair in raw.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let dec = |s: &str| decode_segment(&s.replace('+', " "));
        out.insert(dec(k)?, dec(v)?);
    }
    Ok(out)
}

/// A non-negative integer query parameter.
pub fn int_param(q: &HashMap<String, String>, key: &str) -> GcsResult<Option<i64>> {
    match q.get(key) {
        None => Ok(None),
        Some(v) if v.is_empty() => Ok(None),
        Some(v) => v
            .parse::<i64>()
            .ok()
            .filter(|n| *n >= 0)
            .map(Some)
            .ok_or_else(|| GcsError::invalid(format!("Invalid value for {key}: {:?} is not a non-negative integer.", shown(v)))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_names() {
        for ok in ["abc", "my-bucket", "a.b_c-9", "0ab", &"a".repeat(63)] {
            assert_eq!(bucket_problem(ok), None, "{ok}");
        }
        for bad in ["ab", &"a".repeat(64), "Abc", "-abc", "abc-", ".abc", "ab/c", "a b", "ab..", "..."] {
            assert!(bucket_problem(bad).is_some(), "{bad}");
        }
    }

    #[test]
    fn object_names() {
        for ok in ["a", "a/b/c.txt", "dir/ünïcode", "x..y", "a/.hidden", "with space"] {
            assert_eq!(object_problem(ok), None, "{ok}");
        }
        for bad in [
            "",
            "/abs",
            "a/../b",
            "..",
            "a/./b",
            "a//b",
            "dir/",
            "nul\0x",
            "cr\rx",
            ".trainyard-uploads/x",
            "a/.trainyard",
            &"x".repeat(1025),
            &format!("{}/y", "x".repeat(256)),
        ] {
            assert!(object_problem(bad).is_some(), "{bad:?}");
        }
    }

    #[test]
    fn paths_decode_names() {
        let p = parse_object_path("/storage/v1/b/bkt/o/a%2Fb%20c", "/storage/v1").unwrap();
        assert_eq!(p, ObjectPath { bucket: "bkt".into(), object: "a/b c".into() });
        let p = parse_object_path("/download/storage/v1/b/bkt/o/a/b", "/download/storage/v1").unwrap();
        assert_eq!(p.object, "a/b");
        assert_eq!(parse_object_path("/storage/v1/b/bkt/o/%2E%2E%2Fx", "/storage/v1").unwrap_err().code, 400);
        assert_eq!(parse_object_path("/storage/v1/b/bkt/o/a%00", "/storage/v1").unwrap_err().code, 400);
        assert_eq!(parse_object_path("/storage/v1/b/bkt/o/%FF", "/storage/v1").unwrap_err().code, 400);
        assert_eq!(parse_object_path("/storage/v1/b/BAD/o/x", "/storage/v1").unwrap_err().code, 400);
        assert_eq!(encode("a/b c+d"), "a%2Fb%20c%2Bd");
        assert_eq!(query(Some("name=a+b%2Bc&x=1")).unwrap()["name"], "a b+c");
        assert_eq!(query(Some("name=%FF")).unwrap_err().code, 400);
    }
}
