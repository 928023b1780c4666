//! An object's metadata: kept in the extended attribute `user.trainyard.gcs` of its file
//! (set on the temporary file before the rename that publishes it, so data and metadata
//! appear together), or derived from the file alone (size, modification time) for files
//! that jobs wrote. Also the checksums computed while bytes stream by, and the object
//! resource of the JSON API.

use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, BorrowedFd};

use base64::Engine as _;
use md5::Digest as _;
use nix::sys::stat::FileStat;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// The extended attribute holding an object's metadata.
pub const XATTR: &str = "user.trainyard.gcs";
/// Largest metadata kept (an ext4 attribute must fit in one block with the others).
pub const MAX_XATTR: usize = 3500;

/// What is kept with an object's file.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoredMeta {
    pub generation: i64,
    pub metageneration: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_encoding: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_disposition: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_language: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_control: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
    /// Base64 of the MD5 and of the big-endian CRC32C of the bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub md5_hash: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crc32c: Option<String>,
    /// Creation time, µs since the epoch.
    pub created_us: i64,
    /// The file as it was when this was written: a file changed since (by a job) keeps
    /// its content type and metadata, not its hashes.
    pub size: u64,
    pub mtime_ns: i128,
}

/// What the client says about an object it uploads (the JSON metadata of multipart and
/// resumable uploads). Unknown fields are ignored, as the service ignores read-only ones.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct UploadMeta {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub content_type: Option<String>,
    #[serde(default)]
    pub content_encoding: Option<String>,
    #[serde(default)]
    pub content_disposition: Option<String>,
    #[serde(default)]
    pub content_language: Option<String>,
    #[serde(default)]
    pub cache_control: Option<String>,
    #[serde(default)]
    pub metadata: Option<BTreeMap<String, Value>>,
    #[serde(default)]
    pub crc32c: Option<String>,
    #[serde(default)]
    pub md5_hash: Option<String>,
}

impl UploadMeta {
    /// Parse the JSON metadata of an upload; an empty body is no metadata.
    pub fn parse(body: &[u8]) -> Result<UploadMeta, String> {
        if body.iter().all(|b| b.is_ascii_whitespace()) {
            return Ok(UploadMeta::default());
        }
        serde_json::from_slice(body).map_err(|e| format!("The object metadata is not valid JSON: {e}"))
    }

    /// The custom metadata as strings (the service turns other JSON values to text; a
    /// null removes a key).
    pub fn custom(&self) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        for (k, v) in self.metadata.iter().flatten() {
            match v {
                Value::Null => {}
                Value::String(s) => {
                    out.insert(k.clone(), s.clone());
                }
                other => {
                    out.insert(k.clone(), other.to_string());
                }
            }
        }
        out
    }
}

/// The CRC32C of bytes, computed as they pass, and their MD5 when it is wanted then: an
/// upload whose client sent an MD5 has it checked before the object is committed; any
/// other upload gets its MD5 after the commit, from the committed file ([`super::md5bg`]),
/// because MD5 costs several times what writing the bytes does.
#[derive(Clone, Default)]
pub struct Hashes {
    pub crc: u32,
    pub md5: Option<md5::Md5>,
    pub len: u64,
}

impl Hashes {
    /// CRC32C, and MD5 too when `md5`.
    pub fn new(md5: bool) -> Hashes {
        Hashes { crc: 0, md5: md5.then(md5::Md5::new), len: 0 }
    }

    pub fn update(&mut self, data: &[u8]) {
        self.crc = crc32c::crc32c_append(self.crc, data);
        if let Some(m) = &mut self.md5 {
            m.update(data);
        }
        self.len += data.len() as u64;
    }

    /// The CRC32C and the length only (the MD5, if any, is computed elsewhere).
    pub fn update_crc(&mut self, data: &[u8]) {
        self.crc = crc32c::crc32c_append(self.crc, data);
        self.len += data.len() as u64;
    }

    /// (base64 CRC32C, base64 MD5 if computed), as the API writes them.
    pub fn finish(&self) -> (String, Option<String>) {
        let b64 = base64::engine::general_purpose::STANDARD;
        (b64.encode(self.crc.to_be_bytes()), self.md5.as_ref().map(|m| md5_b64(m.clone())))
    }
}

/// Base64 of a finished MD5, as the API writes it.
pub fn md5_b64(m: md5::Md5) -> String {
    base64::engine::general_purpose::STANDARD.encode(m.finalize())
}

/// Checksums a client sent (`X-Goog-Hash: crc32c=...,md5=...`, or the metadata's
/// `crc32c`/`md5Hash`): each must match what was received.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Expected {
    pub crc32c: Option<String>,
    pub md5: Option<String>,
}

impl Expected {
    pub fn from_meta(m: &UploadMeta) -> Expected {
        Expected { crc32c: m.crc32c.clone(), md5: m.md5_hash.clone() }
    }

    /// Add the values of `X-Goog-Hash` headers; a value that is not base64 of the right
    /// length is an error.
    pub fn add_header(&mut self, value: &str) -> Result<(), String> {
        for part in value.split(',') {
            let part = part.trim();
            if part.is_empty() {
                continue;
            }
            let (k, v) = part.split_once('=').ok_or_else(|| format!("X-Goog-Hash: {part:?} is not TYPE=BASE64"))?;
            match k.trim().to_ascii_lowercase().as_str() {
                "crc32c" => self.crc32c = Some(v.trim().to_string()),
                "md5" => self.md5 = Some(v.trim().to_string()),
                _ => {}
            }
        }
        Ok(())
    }

    /// Are the values well formed? (Checked before any byte is stored.)
    pub fn check_form(&self) -> Result<(), String> {
        let b64 = base64::engine::general_purpose::STANDARD;
        if let Some(c) = &self.crc32c {
            if b64.decode(c).map(|v| v.len()) != Ok(4) {
                return Err(format!("The crc32c {c:?} is not the base64 of 4 bytes."));
            }
        }
        if let Some(m) = &self.md5 {
            if b64.decode(m).map(|v| v.len()) != Ok(16) {
                return Err(format!("The md5Hash {m:?} is not the base64 of 16 bytes."));
            }
        }
        Ok(())
    }

    /// Must the upload's MD5 be known before it is committed?
    pub fn wants_md5(&self) -> bool {
        self.md5.is_some()
    }

    /// Compare with the computed crc32c and md5 (None: not computed, which the callers
    /// avoid when an MD5 was sent: see [`Expected::wants_md5`]); the mismatch's message.
    pub fn verify(&self, crc: &str, md5: Option<&str>) -> Result<(), String> {
        if let Some(c) = &self.crc32c {
            if c != crc {
                return Err(format!(
                    "Provided CRC32C \"{c}\" doesn't match calculated CRC32C \"{crc}\"; nothing was stored."
                ));
            }
        }
        match (&self.md5, md5) {
            (Some(m), Some(md5)) if m != md5 => {
                Err(format!("Provided MD5 hash \"{m}\" doesn't match calculated MD5 hash \"{md5}\"; nothing was stored."))
            }
            (Some(m), None) => Err(format!("Provided MD5 hash \"{m}\" could not be checked; nothing was stored.")),
            _ => Ok(()),
        }
    }
}

pub fn mtime_ns(st: &FileStat) -> i128 {
    st.st_mtime as i128 * 1_000_000_000 + st.st_mtime_nsec as i128
}

pub fn now_us() -> i64 {
    trainyard_backend::now_micros()
}

/// RFC 3339 with milliseconds, UTC, as the API writes times.
pub fn rfc3339(us: i64) -> String {
    trainyard_core::clock_text::rfc3339(us, trainyard_core::clock_text::Digits::Millis)
}

/// Read the metadata attribute of an open file; None when there is none, it does not
/// parse, or the file system has no extended attributes.
pub fn read_xattr(fd: BorrowedFd<'_>) -> Option<StoredMeta> {
    let name = std::ffi::CString::new(XATTR).ok()?;
    let mut buf = vec![0u8; 4096];
    // SAFETY: `buf` is valid for `buf.len()` bytes; the name is NUL-terminated.
    let n = unsafe { nix::libc::fgetxattr(fd.as_raw_fd(), name.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if n <= 0 {
        return None;
    }
    buf.truncate(n as usize);
    serde_json::from_slice(&buf).ok()
}

/// Set the metadata attribute of an open file. Err(ENOTSUP) where the file system has no
/// user attributes.
pub fn write_xattr(fd: BorrowedFd<'_>, meta: &StoredMeta) -> std::io::Result<()> {
    let value = serde_json::to_vec(meta).map_err(std::io::Error::other)?;
    let name = std::ffi::CString::new(XATTR).map_err(std::io::Error::other)?;
    // SAFETY: `value` is valid for its length; the name is NUL-terminated.
    let r = unsafe { nix::libc::fsetxattr(fd.as_raw_fd(), name.as_ptr(), value.as_ptr().cast(), value.len(), 0) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// An object as the API shows it: the file's size and times, with the kept metadata
/// where it still describes the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectInfo {
    pub size: u64,
    pub generation: i64,
    pub metageneration: i64,
    pub created_us: i64,
    pub updated_us: i64,
    pub content_type: String,
    pub content_encoding: Option<String>,
    pub content_disposition: Option<String>,
    pub content_language: Option<String>,
    pub cache_control: Option<String>,
    pub metadata: BTreeMap<String, String>,
    pub md5: Option<String>,
    pub crc32c: Option<String>,
}

pub const DEFAULT_CONTENT_TYPE: &str = "application/octet-stream";

impl ObjectInfo {
    /// From a regular file's status and its attribute, if any. A file that changed since
    /// the attribute was written (a job wrote it in place) keeps the content type and
    /// custom metadata but not the hashes, and its generation is its modification time.
    pub fn of(st: &FileStat, kept: Option<StoredMeta>) -> ObjectInfo {
        let size = st.st_size.max(0) as u64;
        let mtime = mtime_ns(st);
        let mtime_us = (mtime / 1000) as i64;
        match kept {
            Some(m) if m.size == size && m.mtime_ns == mtime => ObjectInfo {
                size,
                generation: m.generation,
                metageneration: m.metageneration.max(1),
                created_us: m.created_us,
                updated_us: m.created_us,
                content_type: m.content_type.unwrap_or_else(|| DEFAULT_CONTENT_TYPE.into()),
                content_encoding: m.content_encoding,
                content_disposition: m.content_disposition,
                content_language: m.content_language,
                cache_control: m.cache_control,
                metadata: m.metadata,
                md5: m.md5_hash,
                crc32c: m.crc32c,
            },
            stale => {
                // Never lower than a generation the API gave this name before.
                let generation = stale.as_ref().map_or(mtime_us, |m| mtime_us.max(m.generation + 1));
                let m = stale.unwrap_or_default();
                ObjectInfo {
                    size,
                    generation,
                    metageneration: 1,
                    created_us: mtime_us,
                    updated_us: mtime_us,
                    content_type: m.content_type.unwrap_or_else(|| DEFAULT_CONTENT_TYPE.into()),
                    content_encoding: m.content_encoding,
                    content_disposition: m.content_disposition,
                    content_language: m.content_language,
                    cache_control: m.cache_control,
                    metadata: m.metadata,
                    md5: None,
                    crc32c: None,
                }
            }
        }
    }

    /// Was the object committed by an upload whose MD5 is still to be computed? (Its kept
    /// metadata describes the file, so it has a CRC32C, but no MD5 yet.)
    pub fn md5_pending(&self) -> bool {
        self.crc32c.is_some() && self.md5.is_none()
    }

    /// `X-Goog-Hash` of a download, when the hashes are known.
    pub fn hash_header(&self) -> Option<String> {
        let parts: Vec<String> = [("crc32c", &self.crc32c), ("md5", &self.md5)]
            .iter()
            .filter_map(|(k, v)| v.as_ref().map(|v| format!("{k}={v}")))
            .collect();
        (!parts.is_empty()).then(|| parts.join(","))
    }

    pub fn etag(&self) -> String {
        base64::engine::general_purpose::STANDARD.encode(format!("{}/{}", self.generation, self.metageneration))
    }

    /// The object resource (`storage#object`); `base` is `http://HOST` of the request.
    pub fn resource(&self, base: &str, bucket: &str, name: &str) -> Value {
        let enc = super::names::encode(name);
        let mut v = json!({
            "kind": "storage#object",
            "id": format!("{bucket}/{name}/{}", self.generation),
            "selfLink": format!("{base}/storage/v1/b/{bucket}/o/{enc}"),
            "mediaLink": format!("{base}/download/storage/v1/b/{bucket}/o/{enc}?generation={}&alt=media", self.generation),
            "name": name,
            "bucket": bucket,
            "generation": self.generation.to_string(),
            "metageneration": self.metageneration.to_string(),
            "contentType": self.content_type,
            "storageClass": "STANDARD",
            "size": self.size.to_string(),
            "etag": self.etag(),
            "timeCreated": rfc3339(self.created_us),
            "updated": rfc3339(self.updated_us),
            "timeStorageClassUpdated": rfc3339(self.created_us),
        });
        let m = v.as_object_mut().expect("an object");
        let mut opt = |k: &str, val: &Option<String>| {
            if let Some(s) = val {
                m.insert(k.into(), Value::String(s.clone()));
            }
        };
        opt("md5Hash", &self.md5);
        opt("crc32c", &self.crc32c);
        opt("contentEncoding", &self.content_encoding);
        opt("contentDisposition", &self.content_disposition);
        opt("contentLanguage", &self.content_language);
        opt("cacheControl", &self.cache_control);
        if !self.metadata.is_empty() {
            m.insert("metadata".into(), json!(self.metadata));
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_as_the_api_writes_them() {
        let mut h = Hashes::new(true);
        h.update(b"hello ");
        h.update(b"world");
        let (crc, md5) = h.finish();
        // From the google-crc32c and hashlib reference values.
        assert_eq!(crc, "yZRlqg==");
        assert_eq!(md5.as_deref(), Some("XrY7u+Ae7tCTyyK7j1rNww=="));
        let mut e = Expected::default();
        e.add_header("crc32c=yZRlqg==, md5=XrY7u+Ae7tCTyyK7j1rNww==").unwrap();
        e.check_form().unwrap();
        assert!(e.wants_md5());
        e.verify(&crc, md5.as_deref()).unwrap();
        e.crc32c = Some("AAAAAA==".into());
        assert!(e.verify(&crc, md5.as_deref()).unwrap_err().contains("CRC32C"));
        assert!(Expected { crc32c: Some("abc".into()), md5: None }.check_form().is_err());
    }

    #[test]
    fn the_md5_is_computed_only_when_wanted() {
        let mut h = Hashes::new(false);
        h.update(b"hello world");
        assert_eq!(h.finish(), ("yZRlqg==".to_string(), None));
        assert_eq!(h.len, 11);
        // A client-sent MD5 is never taken as checked when none was computed.
        let e = Expected { crc32c: None, md5: Some("XrY7u+Ae7tCTyyK7j1rNww==".into()) };
        assert!(e.verify("yZRlqg==", None).unwrap_err().contains("could not be checked"));
        assert!(e.verify("yZRlqg==", Some("AAAAAAAAAAAAAAAAAAAAAA==")).unwrap_err().contains("doesn't match"));
        assert!(!Expected::default().wants_md5());
        Expected::default().verify("yZRlqg==", None).unwrap();
    }

    #[test]
    fn an_md5_is_pending_only_for_fresh_metadata_without_one() {
        // SAFETY: `stat` is plain integers, for which all zeros is a value.
        let st: FileStat = unsafe { std::mem::zeroed() };
        let kept = StoredMeta { generation: 5, crc32c: Some("yZRlqg==".into()), ..Default::default() };
        assert!(ObjectInfo::of(&st, Some(kept.clone())).md5_pending());
        let done = StoredMeta { md5_hash: Some("XrY7u+Ae7tCTyyK7j1rNww==".into()), ..kept.clone() };
        assert!(!ObjectInfo::of(&st, Some(done)).md5_pending());
        // A file changed since (a job wrote it in place) has no hashes: nothing to compute.
        let stale = StoredMeta { size: 3, ..kept };
        assert!(!ObjectInfo::of(&st, Some(stale)).md5_pending());
        // Nor has a file without the server's metadata.
        assert!(!ObjectInfo::of(&st, None).md5_pending());
    }

    #[test]
    fn times() {
        assert_eq!(rfc3339(1_700_000_000_123_456), "2023-11-14T22:13:20.123Z");
    }
}
