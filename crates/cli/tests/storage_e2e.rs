//! The Cloud Storage JSON API endpoint (`/storage/v1`, `/upload/storage/v1`,
//! `/download/storage/v1`) of a real server: uploads of every kind, downloads with ranges,
//! listings, deletes, buckets, bad input, symbolic links planted in a namespace, tokens,
//! interrupted and abandoned uploads, and files shared with jobs.

mod common;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

struct Resp {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Resp {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    /// The storage API's error shape, with its code and reason.
    fn assert_error(&self, code: u16, reason: &str) {
        let v = self.json();
        assert_eq!(self.status, code, "{v}");
        assert_eq!(v["error"]["code"], json!(code), "{v}");
        assert!(v["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
        assert_eq!(v["error"]["errors"][0]["reason"], json!(reason), "{v}");
        assert_eq!(v["error"]["errors"][0]["domain"], json!("global"), "{v}");
    }
}

/// An HTTP request with headers of our choice; redirects (308) are not followed.
fn req(s: &Server, method: &str, path: &str, headers: &[(&str, &str)], body: Option<Vec<u8>>) -> Resp {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .max_redirects(0)
        .max_idle_connections(0)
        .build()
        .into();
    let url = if path.starts_with("http") { path.to_string() } else { s.url(path) };
    let mut r = ureq::http::Request::builder().method(method).uri(&url);
    for (k, v) in headers {
        r = r.header(*k, *v);
    }
    let sent = match body {
        Some(b) => agent.run(r.body(b).unwrap()),
        None => agent.run(r.body(()).unwrap()),
    };
    let mut resp = sent.unwrap_or_else(|e| panic!("{method} {url}: {e}"));
    let status = resp.status().as_u16();
    let headers = resp.headers().iter().map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("").to_string())).collect();
    let body = resp.body_mut().with_config().limit(u64::MAX).read_to_vec().unwrap_or_default();
    Resp { status, headers, body }
}

fn root(s: &Server) -> PathBuf {
    s.data_dir().join("storage")
}

fn create_bucket(s: &Server, project: &str, bucket: &str) {
    let r = req(s, "POST", &format!("/storage/v1/b?project={project}"), &[], Some(json!({"name": bucket}).to_string().into_bytes()));
    assert_eq!(r.status, 200, "{}", r.json());
}

fn media(s: &Server, bucket: &str, name: &str, data: &[u8]) -> Resp {
    let path = format!("/upload/storage/v1/b/{bucket}/o?uploadType=media&name={}", enc(name));
    req(s, "POST", &path, &[("Content-Type", "application/octet-stream")], Some(data.to_vec()))
}

fn enc(name: &str) -> String {
    name.bytes()
        .map(|b| if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) { (b as char).to_string() } else { format!("%{b:02X}") })
        .collect()
}

fn get_media(s: &Server, bucket: &str, name: &str, headers: &[(&str, &str)]) -> Resp {
    req(s, "GET", &format!("/storage/v1/b/{bucket}/o/{}?alt=media", enc(name)), headers, None)
}

/// All names of a listing, page after page.
fn list_all(s: &Server, bucket: &str, query: &str) -> (Vec<String>, Vec<String>, usize) {
    let (mut names, mut prefixes, mut pages) = (Vec::new(), Vec::new(), 0);
    let mut token: Option<String> = None;
    loop {
        let mut q = query.to_string();
        if let Some(t) = &token {
            q.push_str(&format!("&pageToken={t}"));
        }
        let r = req(s, "GET", &format!("/storage/v1/b/{bucket}/o?{q}"), &[], None);
        assert_eq!(r.status, 200, "{}", r.json());
        let v = r.json();
        assert_eq!(v["kind"], "storage#objects");
        pages += 1;
        for i in v["items"].as_array().into_iter().flatten() {
            names.push(i["name"].as_str().unwrap().to_string());
        }
        for p in v["prefixes"].as_array().into_iter().flatten() {
            prefixes.push(p.as_str().unwrap().to_string());
        }
        match v["nextPageToken"].as_str() {
            Some(t) => token = Some(t.to_string()),
            None => return (names, prefixes, pages),
        }
    }
}

/// Files of the project's uploads directory (temporary files, sessions).
fn upload_files(s: &Server, project: &str) -> Vec<String> {
    match std::fs::read_dir(root(s).join(project).join(".trainyard-uploads")) {
        Ok(d) => d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect(),
        Err(_) => Vec::new(),
    }
}

fn wait_until(secs: u64, what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn crc32c_b64(data: &[u8]) -> String {
    // Castagnoli, bit by bit: the tests' own reference.
    let mut crc: u32 = !0;
    for &b in data {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 != 0 { (crc >> 1) ^ 0x82F6_3B78 } else { crc >> 1 };
        }
    }
    b64(&(!crc).to_be_bytes())
}

fn b64(bytes: &[u8]) -> String {
    const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for c in bytes.chunks(3) {
        let n = (c[0] as u32) << 16 | (*c.get(1).unwrap_or(&0) as u32) << 8 | *c.get(2).unwrap_or(&0) as u32;
        for i in 0..4 {
            if i <= c.len() {
                out.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// MD5 (RFC 1321) in base64: the tests' own reference.
fn md5_b64(data: &[u8]) -> String {
    const S: [u32; 16] = [7, 12, 17, 22, 5, 9, 14, 20, 4, 11, 16, 23, 6, 10, 15, 21];
    let k: Vec<u32> = (0..64).map(|i| ((i as f64 + 1.0).sin().abs() * 4_294_967_296.0) as u32).collect();
    let mut h: [u32; 4] = [0x6745_2301, 0xefcd_ab89, 0x98ba_dcfe, 0x1032_5476];
    let mut tail = data[data.len() / 64 * 64..].to_vec();
    tail.push(0x80);
    while tail.len() % 64 != 56 {
        tail.push(0);
    }
    tail.extend_from_slice(&(data.len() as u64).wrapping_mul(8).to_le_bytes());
    for block in data.chunks_exact(64).chain(tail.chunks_exact(64)) {
        let m: Vec<u32> = block.chunks_exact(4).map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]])).collect();
        let [mut a, mut b, mut c, mut d] = h;
        for i in 0..64 {
            let (f, g) = match i / 16 {
                0 => ((b & c) | (!b & d), i),
                1 => ((d & b) | (!d & c), (5 * i + 1) % 16),
                2 => (b ^ c ^ d, (3 * i + 5) % 16),
                _ => (c ^ (b | !d), (7 * i) % 16),
            };
            let f = f.wrapping_add(a).wrapping_add(k[i]).wrapping_add(m[g]);
            a = d;
            d = c;
            c = b;
            b = b.wrapping_add(f.rotate_left(S[i / 16 * 4 + i % 4]));
        }
        for (x, y) in h.iter_mut().zip([a, b, c, d]) {
            *x = x.wrapping_add(y);
        }
    }
    b64(&h.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>())
}

/// The object's metadata once it has its MD5 (computed after the commit of an upload
/// that sent none).
fn wait_md5(s: &Server, bucket: &str, name: &str) -> Value {
    let mut m = Value::Null;
    wait_until(30, &format!("{bucket}/{name} has its md5Hash"), || {
        let r = req(s, "GET", &format!("/storage/v1/b/{bucket}/o/{}", enc(name)), &[], None);
        assert_eq!(r.status, 200, "{}", r.json());
        m = r.json();
        m["md5Hash"].is_string()
    });
    m
}

fn pseudo_random(n: usize, seed: u64) -> Vec<u8> {
    let mut rng = trainyard_core::rng::Rng::new(seed);
    (0..n).map(|_| rng.next_u64() as u8).collect()
}

#[test]
fn buckets_uploads_downloads_listings_and_deletes() {
    let s = Server::start("");
    create_bucket(&s, "demo", "bkt");
    let again = req(&s, "POST", "/storage/v1/b?project=demo", &[], Some(br#"{"name": "bkt"}"#.to_vec()));
    again.assert_error(409, "conflict");
    let b = req(&s, "GET", "/storage/v1/b/bkt", &[], None);
    assert_eq!((b.status, b.json()["kind"].as_str(), b.json()["name"].as_str()), (200, Some("storage#bucket"), Some("bkt")));
    req(&s, "GET", "/storage/v1/b/nosuchbucket", &[], None).assert_error(404, "notFound");
    let listed = req(&s, "GET", "/storage/v1/b?project=demo", &[], None).json();
    assert_eq!(listed["items"][0]["name"], "bkt", "{listed}");

    // uploadType=media: the object resource as the API writes it.
    let r = media(&s, "bkt", "dir/hello.txt", b"hello world");
    let o = r.json();
    assert_eq!(r.status, 200, "{o}");
    assert_eq!(o["kind"], "storage#object");
    assert_eq!((o["name"].as_str(), o["bucket"].as_str(), o["size"].as_str()), (Some("dir/hello.txt"), Some("bkt"), Some("11")));
    assert_eq!(o["crc32c"], "yZRlqg==");
    // No MD5 was sent: it is computed after the commit, as `md5_after_the_commit` checks.
    assert_eq!(wait_md5(&s, "bkt", "dir/hello.txt")["md5Hash"], "XrY7u+Ae7tCTyyK7j1rNww==");
    assert!(o["generation"].as_str().unwrap().parse::<i64>().unwrap() > 0);
    assert_eq!(o["metageneration"], "1");
    assert_eq!(o["id"], format!("bkt/dir/hello.txt/{}", o["generation"].as_str().unwrap()));
    assert!(o["timeCreated"].as_str().unwrap().ends_with('Z') && o["updated"].is_string());
    assert!(o["mediaLink"].as_str().unwrap().contains("/download/storage/v1/b/bkt/o/dir%2Fhello.txt"), "{o}");
    assert!(o["selfLink"].as_str().unwrap().ends_with("/storage/v1/b/bkt/o/dir%2Fhello.txt"), "{o}");
    assert_eq!(std::fs::read(root(&s).join("demo/bkt/dir/hello.txt")).unwrap(), b"hello world", "a plain file");

    // Downloads: whole, ranges, through /download, HEAD.
    let d = get_media(&s, "bkt", "dir/hello.txt", &[]);
    assert_eq!((d.status, d.body.as_slice()), (200, b"hello world".as_slice()));
    assert_eq!(d.header("x-goog-hash"), Some("crc32c=yZRlqg==,md5=XrY7u+Ae7tCTyyK7j1rNww=="));
    assert_eq!(d.header("x-goog-generation"), o["generation"].as_str());
    assert_eq!(d.header("content-length"), Some("11"));
    let d = get_media(&s, "bkt", "dir/hello.txt", &[("Range", "bytes=2-4")]);
    assert_eq!((d.status, d.body.as_slice(), d.header("content-range")), (206, b"llo".as_slice(), Some("bytes 2-4/11")));
    let d = get_media(&s, "bkt", "dir/hello.txt", &[("Range", "bytes=-5")]);
    assert_eq!((d.status, d.body.as_slice()), (206, b"world".as_slice()));
    let d = get_media(&s, "bkt", "dir/hello.txt", &[("Range", "bytes=6-")]);
    assert_eq!((d.status, d.body.as_slice(), d.header("content-range")), (206, b"world".as_slice(), Some("bytes 6-10/11")));
    let d = get_media(&s, "bkt", "dir/hello.txt", &[("Range", "bytes=11-20")]);
    assert_eq!((d.status, d.header("content-range")), (416, Some("bytes */11")));
    let d = req(&s, "GET", "/download/storage/v1/b/bkt/o/dir%2Fhello.txt?alt=media", &[], None);
    assert_eq!((d.status, d.body.as_slice()), (200, b"hello world".as_slice()));
    let h = req(&s, "HEAD", "/download/storage/v1/b/bkt/o/dir%2Fhello.txt?alt=media", &[], None);
    assert_eq!((h.status, h.body.len(), h.header("content-length")), (200, 0, Some("11")));
    let m = req(&s, "GET", "/storage/v1/b/bkt/o/dir%2Fhello.txt", &[], None).json();
    assert_eq!((m["crc32c"].as_str(), m["contentType"].as_str()), (Some("yZRlqg=="), Some("application/octet-stream")), "{m}");
    req(&s, "GET", &format!("/storage/v1/b/bkt/o/dir%2Fhello.txt?generation={}", 1), &[], None).assert_error(404, "notFound");
    req(&s, "GET", "/storage/v1/b/bkt/o/dir%2Fhello.txt?ifGenerationMatch=1", &[], None).assert_error(412, "conditionNotMet");

    // uploadType=multipart: metadata (name, contentType, custom metadata, crc32c) and bytes.
    let data = pseudo_random(300_000, 7);
    let boundary = "===============1234567890==";
    let meta = json!({"name": "multi/part.bin", "contentType": "application/x-test", "metadata": {"k": "v"}, "crc32c": crc32c_b64(&data)});
    let mut body = format!("--{boundary}\r\ncontent-type: application/json; charset=UTF-8\r\n\r\n{meta}\r\n--{boundary}\r\ncontent-type: application/x-test\r\n\r\n").into_bytes();
    body.extend_from_slice(&data);
    body.extend_from_slice(format!("\r\n--{boundary}--").as_bytes());
    let ct = format!("multipart/related; boundary=\"{boundary}\"");
    let r = req(&s, "POST", "/upload/storage/v1/b/bkt/o?uploadType=multipart", &[("Content-Type", &ct)], Some(body));
    let o = r.json();
    assert_eq!(r.status, 200, "{o}");
    assert_eq!((o["size"].as_str(), o["contentType"].as_str(), o["metadata"]["k"].as_str()), (Some("300000"), Some("application/x-test"), Some("v")));
    let m = req(&s, "GET", "/storage/v1/b/bkt/o/multi%2Fpart.bin", &[], None).json();
    assert_eq!((m["metadata"]["k"].as_str(), m["crc32c"].as_str()), (Some("v"), Some(crc32c_b64(&data).as_str())), "kept: {m}");
    let d = get_media(&s, "bkt", "multi/part.bin", &[]);
    assert_eq!((d.status, d.header("content-type")), (200, Some("application/x-test")));
    assert!(d.body == data);

    // A new write of a name gets a higher generation.
    let g1: i64 = media(&s, "bkt", "gen.txt", b"1").json()["generation"].as_str().unwrap().parse().unwrap();
    let g2: i64 = media(&s, "bkt", "gen.txt", b"2").json()["generation"].as_str().unwrap().parse().unwrap();
    assert!(g2 > g1, "{g1} then {g2}");
    // ifGenerationMatch=0: only if there is none.
    let r = req(&s, "POST", "/upload/storage/v1/b/bkt/o?uploadType=media&name=gen.txt&ifGenerationMatch=0", &[], Some(b"3".to_vec()));
    r.assert_error(412, "conditionNotMet");
    assert_eq!(get_media(&s, "bkt", "gen.txt", &[]).body, b"2");

    // Listings: sorted names, prefix, delimiter, pages, offsets.
    for n in ["l/a", "l/b/c", "l/b/d", "l/b-x", "l/c", "l/d/e/f"] {
        assert_eq!(media(&s, "bkt", n, n.as_bytes()).status, 200);
    }
    let (names, _, _) = list_all(&s, "bkt", "prefix=l/");
    assert_eq!(names, ["l/a", "l/b-x", "l/b/c", "l/b/d", "l/c", "l/d/e/f"]);
    let (names, prefixes, pages) = list_all(&s, "bkt", "prefix=l/&delimiter=/&maxResults=2");
    assert_eq!((names, prefixes, pages), (vec!["l/a".into(), "l/b-x".into(), "l/c".into()], vec!["l/b/".into(), "l/d/".into()], 3));
    let (names, _, pages) = list_all(&s, "bkt", "maxResults=1");
    assert_eq!((names.len(), pages), (9, 9), "{names:?}");
    let (names, _, _) = list_all(&s, "bkt", "startOffset=l/b&endOffset=l/c");
    assert_eq!(names, ["l/b-x", "l/b/c", "l/b/d"]);
    let (_, prefixes, _) = list_all(&s, "bkt", "delimiter=/");
    assert_eq!(prefixes, ["dir/", "l/", "multi/"]);
    req(&s, "GET", "/storage/v1/b/bkt/o?pageToken=!!", &[], None).assert_error(400, "invalid");

    // A file a job wrote (plain file, no attribute) is an object too, without hashes.
    std::fs::write(root(&s).join("demo/bkt/from-job.txt"), b"written by a job").unwrap();
    let d = get_media(&s, "bkt", "from-job.txt", &[]);
    assert_eq!((d.status, d.body.as_slice(), d.header("x-goog-hash")), (200, b"written by a job".as_slice(), None));
    let m = req(&s, "GET", "/storage/v1/b/bkt/o/from-job.txt", &[], None).json();
    assert_eq!((m["size"].as_str(), m["crc32c"].as_str()), (Some("16"), None), "{m}");
    // Changed in place by a job after an upload: no stale hashes.
    std::fs::write(root(&s).join("demo/bkt/gen.txt"), b"changed").unwrap();
    let d = get_media(&s, "bkt", "gen.txt", &[]);
    assert_eq!((d.body.as_slice(), d.header("x-goog-hash")), (b"changed".as_slice(), None));

    // Deletes.
    let r = req(&s, "DELETE", "/storage/v1/b/bkt/o/l%2Fa", &[], None);
    assert_eq!(r.status, 204);
    get_media(&s, "bkt", "l/a", &[]).assert_error(404, "notFound");
    req(&s, "DELETE", "/storage/v1/b/bkt/o/l%2Fa", &[], None).assert_error(404, "notFound");
    assert!(!root(&s).join("demo/bkt/l/a").exists());
    // A non-empty bucket is not deleted; an empty one is.
    req(&s, "DELETE", "/storage/v1/b/bkt", &[], None).assert_error(409, "conflict");
    create_bucket(&s, "demo", "empty-bucket");
    assert_eq!(req(&s, "DELETE", "/storage/v1/b/empty-bucket", &[], None).status, 204);
    // A bucket holding only directories a job made (its output's model/, checkpoints/,
    // logs/, which no listing shows) is empty to a client, and is deleted with them; a
    // file appearing in one keeps the bucket.
    create_bucket(&s, "demo", "job-output");
    for d in ["run1/model", "run1/checkpoints", "run1/logs"] {
        std::fs::create_dir_all(root(&s).join("demo/job-output").join(d)).unwrap();
    }
    let listed = req(&s, "GET", "/storage/v1/b/job-output/o", &[], None).json();
    assert!(listed.get("items").is_none(), "{listed}");
    std::fs::write(root(&s).join("demo/job-output/run1/logs/.hidden"), b"x").unwrap();
    req(&s, "DELETE", "/storage/v1/b/job-output", &[], None).assert_error(409, "conflict");
    assert!(root(&s).join("demo/job-output/run1/logs/.hidden").exists());
    std::fs::remove_file(root(&s).join("demo/job-output/run1/logs/.hidden")).unwrap();
    assert_eq!(req(&s, "DELETE", "/storage/v1/b/job-output", &[], None).status, 204);
    assert!(!root(&s).join("demo/job-output").exists());

    // The same bucket name in two namespaces: open mode cannot tell which.
    create_bucket(&s, "other", "bkt");
    let r = req(&s, "GET", "/storage/v1/b/bkt/o", &[], None);
    r.assert_error(400, "invalid");
    assert!(r.json()["error"]["message"].as_str().unwrap().contains("demo, other"), "{}", r.json());
    // The caller's project (userProject, as the clients send their user_project) says which.
    let r = req(&s, "GET", "/storage/v1/b/bkt/o?userProject=demo", &[], None);
    assert_eq!(r.status, 200, "{}", r.json());
    assert!(r.json()["items"].as_array().is_some_and(|i| !i.is_empty()), "demo's bkt: {}", r.json());
    let r = req(&s, "GET", "/storage/v1/b/bkt/o?userProject=other", &[], None);
    assert_eq!(r.status, 200, "{}", r.json());
    assert!(r.json().get("items").is_none(), "other's empty bkt: {}", r.json());
    assert!(upload_files(&s, "demo").is_empty(), "{:?}", upload_files(&s, "demo"));
}

/// A multipart upload body: the metadata `meta`, then `data`.
fn multipart_body(meta: &Value, data: &[u8]) -> (String, Vec<u8>) {
    let boundary = "===============5551212==";
    let mut body = format!("--{boundary}\r\ncontent-type: application/json; charset=UTF-8\r\n\r\n{meta}\r\n--{boundary}\r\ncontent-type: application/octet-stream\r\n\r\n").into_bytes();
    body.extend_from_slice(data);
    body.extend_from_slice(format!("\r\n--{boundary}--").as_bytes());
    (format!("multipart/related; boundary=\"{boundary}\""), body)
}

fn multipart(s: &Server, meta: &Value, data: &[u8]) -> Resp {
    let (ct, body) = multipart_body(meta, data);
    req(s, "POST", "/upload/storage/v1/b/bkt/o?uploadType=multipart", &[("Content-Type", &ct)], Some(body))
}

/// A resumable upload of `data` in two requests: its start (with `meta`), the first
/// 256 KiB, then the rest with `last_headers`. The last answer.
fn resumable(s: &Server, meta: &Value, data: &[u8], last_headers: &[(&str, &str)]) -> Resp {
    let r = req(s, "POST", "/upload/storage/v1/b/bkt/o?uploadType=resumable", &[("Content-Type", "application/json")], Some(meta.to_string().into_bytes()));
    assert_eq!(r.status, 200, "{}", r.json());
    let loc = r.header("location").expect("a Location").to_string();
    let c = 262_144;
    assert!(data.len() > c);
    let r = req(s, "PUT", &loc, &[("Content-Range", &format!("bytes 0-{}/*", c - 1))], Some(data[..c].to_vec()));
    assert_eq!(r.status, 308);
    let range = format!("bytes {c}-{}/{}", data.len() - 1, data.len());
    let mut h = vec![("Content-Range", range.as_str())];
    h.extend_from_slice(last_headers);
    req(s, "PUT", &loc, &h, Some(data[c..].to_vec()))
}

/// Uploads without a client MD5 are answered once committed, with their CRC32C only; the
/// MD5 is computed after, and a newer write or a delete of the name wins over it.
#[test]
fn md5_after_the_commit() {
    let s = Server::start("");
    create_bucket(&s, "demo", "bkt");
    assert_eq!(md5_b64(b""), "1B2M2Y8AsgTpgAmY7PhCfg==");
    assert_eq!(md5_b64(b"hello world"), "XrY7u+Ae7tCTyyK7j1rNww==");
    let data = pseudo_random(3_000_000, 21);
    let (crc, want) = (crc32c_b64(&data), md5_b64(&data));
    let answers = [
        ("media.bin", media(&s, "bkt", "media.bin", &data)),
        ("multi.bin", multipart(&s, &json!({"name": "multi.bin"}), &data)),
        ("res.bin", resumable(&s, &json!({"name": "res.bin"}), &data, &[])),
    ];
    for (name, r) in &answers {
        let o = r.json();
        assert_eq!((r.status, o["crc32c"].as_str()), (200, Some(crc.as_str())), "{name}: {o}");
        assert!(o.get("md5Hash").is_none(), "{name} is answered before its MD5 is computed: {o}");
        let m = wait_md5(&s, "bkt", name);
        assert_eq!((m["md5Hash"].as_str(), m["generation"].as_str()), (Some(want.as_str()), o["generation"].as_str()), "{name}: {m}");
        let d = get_media(&s, "bkt", name, &[]);
        assert_eq!(d.header("x-goog-hash"), Some(format!("crc32c={crc},md5={want}").as_str()), "{name}");
        assert!(d.body == data);
    }
    let listed = req(&s, "GET", "/storage/v1/b/bkt/o", &[], None).json();
    for item in listed["items"].as_array().unwrap() {
        assert_eq!(item["md5Hash"].as_str(), Some(want.as_str()), "{item}");
    }

    // The name written again while the MD5 of its big first object is being computed:
    // the answer comes at once, the computation takes a while; the MD5 kept is the new
    // object's, never the old one's.
    for round in 0..3u64 {
        let big = pseudo_random(48 << 20, 100 + round);
        assert_eq!(media(&s, "bkt", "race.bin", &big).status, 200);
        let small = format!("round {round}").into_bytes();
        let r = media(&s, "bkt", "race.bin", &small);
        let o = r.json();
        assert_eq!(r.status, 200, "{o}");
        let want = (Some(md5_b64(&small)), o["generation"].as_str().map(str::to_string), Some(small.len().to_string()));
        let got = |m: &Value| (m["md5Hash"].as_str().map(str::to_string), m["generation"].as_str().map(str::to_string), m["size"].as_str().map(str::to_string));
        assert_eq!(got(&wait_md5(&s, "bkt", "race.bin")), want, "round {round}");
        // Still so once the big object's computation is surely over.
        std::thread::sleep(Duration::from_millis(700));
        assert_eq!(got(&req(&s, "GET", "/storage/v1/b/bkt/o/race.bin", &[], None).json()), want, "round {round}");
        assert_eq!(get_media(&s, "bkt", "race.bin", &[]).body, small);
    }
    // Deleted while its MD5 is being computed: it stays deleted.
    let big = pseudo_random(48 << 20, 7);
    assert_eq!(media(&s, "bkt", "gone.bin", &big).status, 200);
    assert_eq!(req(&s, "DELETE", "/storage/v1/b/bkt/o/gone.bin", &[], None).status, 204);
    std::thread::sleep(Duration::from_millis(700));
    req(&s, "GET", "/storage/v1/b/bkt/o/gone.bin", &[], None).assert_error(404, "notFound");
    assert!(!root(&s).join("demo/bkt/gone.bin").exists());
}

/// An MD5 the client sends is checked before the commit, whichever way it comes: a
/// mismatch is 400 and nothing is stored; a match is answered with the MD5.
#[test]
fn a_client_md5_is_checked_before_the_commit() {
    let s = Server::start("");
    create_bucket(&s, "demo", "bkt");
    let data = pseudo_random(2_000_000, 31);
    let (good, bad) = (md5_b64(&data), md5_b64(b"other bytes"));
    let refused = |name: &str, r: Resp| {
        r.assert_error(400, "invalid");
        assert!(r.json()["error"]["message"].as_str().unwrap().contains("MD5"), "{name}: {}", r.json());
        get_media(&s, "bkt", name, &[]).assert_error(404, "notFound");
        assert!(!root(&s).join("demo/bkt").join(name).exists(), "{name}");
    };
    let accepted = |name: &str, r: Resp| {
        let o = r.json();
        assert_eq!((r.status, o["md5Hash"].as_str()), (200, Some(good.as_str())), "{name}: {o}");
        assert!(get_media(&s, "bkt", name, &[]).body == data, "{name}");
    };
    let media_with = |name: &str, md5: &str| {
        let path = format!("/upload/storage/v1/b/bkt/o?uploadType=media&name={name}");
        req(&s, "POST", &path, &[("X-Goog-Hash", &format!("md5={md5}"))], Some(data.clone()))
    };
    // X-Goog-Hash of a media upload.
    refused("media-bad.bin", media_with("media-bad.bin", &bad));
    accepted("media.bin", media_with("media.bin", &good));
    // md5Hash of a multipart upload's metadata.
    refused("multi-bad.bin", multipart(&s, &json!({"name": "multi-bad.bin", "md5Hash": bad}), &data));
    accepted("multi.bin", multipart(&s, &json!({"name": "multi.bin", "md5Hash": good}), &data));
    // md5Hash of a resumable upload's start.
    refused("start-bad.bin", resumable(&s, &json!({"name": "start-bad.bin", "md5Hash": bad}), &data, &[]));
    accepted("start.bin", resumable(&s, &json!({"name": "start.bin", "md5Hash": good}), &data, &[]));
    // X-Goog-Hash with a resumable upload's last chunk only, as the Python client sends it.
    let last = |md5: &str| format!("md5={md5}");
    refused("last-bad.bin", resumable(&s, &json!({"name": "last-bad.bin"}), &data, &[("X-Goog-Hash", &last(&bad))]));
    accepted("last.bin", resumable(&s, &json!({"name": "last.bin"}), &data, &[("X-Goog-Hash", &last(&good))]));
    let (names, _, _) = list_all(&s, "bkt", "");
    assert_eq!(names, ["last.bin", "media.bin", "multi.bin", "start.bin"]);
    wait_until(10, "no temporary file is left", || !upload_files(&s, "demo").iter().any(|f| f.starts_with("tmp-") || f.ends_with(".part")));
}

/// Set the server's metadata attribute of a file as if its MD5 had never been computed.
fn forget_md5(path: &Path) {
    use std::os::unix::ffi::OsStrExt;
    let p = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    let attr = c"user.trainyard.gcs";
    let mut buf = vec![0u8; 4096];
    // SAFETY: valid NUL-terminated strings and a buffer of the given length.
    let n = unsafe { libc::getxattr(p.as_ptr(), attr.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    assert!(n > 0, "{} has the server's metadata", path.display());
    let mut meta: Value = serde_json::from_slice(&buf[..n as usize]).unwrap();
    assert!(meta.as_object_mut().unwrap().remove("md5Hash").is_some(), "{meta}");
    let text = meta.to_string();
    // SAFETY: as above.
    let r = unsafe { libc::setxattr(p.as_ptr(), attr.as_ptr(), text.as_ptr().cast(), text.len(), 0) };
    assert_eq!(r, 0, "setxattr {}", path.display());
}

/// Nothing of the MD5s to compute is lost with the server: an object committed without
/// its MD5 gets it when it is next read (its metadata, a listing, its bytes).
#[test]
fn an_md5_never_computed_before_a_restart_is_computed_when_the_object_is_read() {
    let mut s = Server::start("");
    create_bucket(&s, "demo", "bkt");
    let objects: Vec<(String, Vec<u8>)> = (0..3).map(|i| (format!("o{i}.bin"), pseudo_random(1_000_000 + i, 50 + i as u64))).collect();
    for (name, data) in &objects {
        assert_eq!(media(&s, "bkt", name, data).status, 200);
        wait_md5(&s, "bkt", name);
    }
    // Killed right after an answer: its MD5 may not have been computed yet.
    let late = pseudo_random(16 << 20, 59);
    assert_eq!(media(&s, "bkt", "late.bin", &late).status, 200);
    s.kill9();
    // And as if the others' had not been either.
    for (name, _) in &objects {
        forget_md5(&root(&s).join("demo/bkt").join(name));
    }
    s.spawn();
    let no_md5 = |v: &Value| v.get("md5Hash").is_none();
    // Its metadata.
    let m = req(&s, "GET", "/storage/v1/b/bkt/o/o0.bin", &[], None).json();
    assert!(no_md5(&m), "{m}");
    assert_eq!(wait_md5(&s, "bkt", "o0.bin")["md5Hash"].as_str(), Some(md5_b64(&objects[0].1).as_str()));
    // A listing.
    let item = |name: &str| {
        let v = req(&s, "GET", &format!("/storage/v1/b/bkt/o?prefix={name}"), &[], None).json();
        v["items"][0].clone()
    };
    assert!(no_md5(&item("o1.bin")), "{}", item("o1.bin"));
    wait_until(30, "the listing shows o1.bin's MD5", || item("o1.bin")["md5Hash"].is_string());
    assert_eq!(item("o1.bin")["md5Hash"].as_str(), Some(md5_b64(&objects[1].1).as_str()));
    // Its bytes.
    let hash = || get_media(&s, "bkt", "o2.bin", &[]).header("x-goog-hash").map(str::to_string);
    assert_eq!(hash(), Some(format!("crc32c={}", crc32c_b64(&objects[2].1))));
    wait_until(30, "a download of o2.bin has its MD5", || hash().is_some_and(|h| h.contains("md5=")));
    assert_eq!(hash(), Some(format!("crc32c={},md5={}", crc32c_b64(&objects[2].1), md5_b64(&objects[2].1))));
    // The object whose server was killed right after its answer.
    assert_eq!(wait_md5(&s, "bkt", "late.bin")["md5Hash"].as_str(), Some(md5_b64(&late).as_str()));
}

#[test]
fn resumable_uploads_chunked_resumed_queried_and_cancelled() {
    let s = Server::start("");
    create_bucket(&s, "demo", "bkt");
    let data = pseudo_random(1_000_000, 3);
    let total = data.len().to_string();
    let start = |name: &str, extra: &[(&str, &str)]| -> String {
        let mut h = vec![("Content-Type", "application/json; charset=UTF-8"), ("X-Upload-Content-Type", "text/x-data")];
        h.extend_from_slice(extra);
        let r = req(&s, "POST", "/upload/storage/v1/b/bkt/o?uploadType=resumable", &h, Some(json!({"name": name}).to_string().into_bytes()));
        assert_eq!(r.status, 200, "{}", r.json());
        let loc = r.header("location").expect("a Location").to_string();
        assert!(loc.contains("/upload/storage/v1/b/bkt/o?uploadType=resumable&upload_id="), "{loc}");
        loc
    };
    let put = |loc: &str, range: &str, body: &[u8]| req(&s, "PUT", loc, &[("Content-Range", range)], Some(body.to_vec()));
    let loc = start("res/one.bin", &[("X-Upload-Content-Length", &total)]);
    let c = 262_144;
    let r = put(&loc, &format!("bytes 0-{}/*", c - 1), &data[..c]);
    assert_eq!((r.status, r.header("range")), (308, Some("bytes=0-262143")));
    // Nothing is visible before the last chunk.
    get_media(&s, "bkt", "res/one.bin", &[]).assert_error(404, "notFound");
    // Status query.
    let r = req(&s, "PUT", &loc, &[("Content-Range", "bytes */*")], Some(Vec::new()));
    assert_eq!((r.status, r.header("range")), (308, Some("bytes=0-262143")));
    // A gap is refused; a chunk sent again is answered with what the server has.
    put(&loc, &format!("bytes {}-{}/*", 2 * c, 3 * c - 1), &data[2 * c..3 * c]).assert_error(400, "invalid");
    let r = put(&loc, &format!("bytes 0-{}/*", c - 1), &data[..c]);
    assert_eq!((r.status, r.header("range")), (308, Some("bytes=0-262143")));
    // A chunk whose length is not its range's: refused, nothing kept of it.
    put(&loc, &format!("bytes {c}-{}/*", 2 * c - 1), &data[c..c + 10]).assert_error(400, "invalid");
    // The client goes away in the middle of a chunk: what arrived may stay; ask, and go on from there.
    {
        let mut t = std::net::TcpStream::connect(("127.0.0.1", s.port)).unwrap();
        let path = loc.split_once(&format!("127.0.0.1:{}", s.port)).unwrap().1;
        let head = format!(
            "PUT {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Range: bytes {c}-{}/*\r\nContent-Length: {c}\r\n\r\n",
            s.port,
            2 * c - 1
        );
        t.write_all(head.as_bytes()).unwrap();
        t.write_all(&data[c..c + 100_000]).unwrap();
        t.flush().unwrap();
        std::thread::sleep(Duration::from_millis(200));
    }
    let mut have = 0;
    wait_until(10, "the server has taken the cut chunk", || {
        let r = req(&s, "PUT", &loc, &[("Content-Range", "bytes */*")], Some(Vec::new()));
        assert_eq!(r.status, 308);
        let end: usize = r.header("range").unwrap().trim_start_matches("bytes=0-").parse().unwrap();
        have = end + 1;
        // The request of the cut chunk is over once the session's lock is free again.
        have > c
    });
    assert!(have <= c + 100_000, "{have}");
    let last = data.len() - 1;
    let r = req(
        &s,
        "PUT",
        &loc,
        &[("Content-Range", &format!("bytes {have}-{last}/{total}")), ("X-Goog-Hash", &format!("crc32c={}", crc32c_b64(&data)))],
        Some(data[have..].to_vec()),
    );
    let o = r.json();
    assert_eq!(r.status, 200, "{o}");
    assert_eq!((o["size"].as_str(), o["crc32c"].as_str(), o["contentType"].as_str()), (Some("1000000"), Some(crc32c_b64(&data).as_str()), Some("text/x-data")));
    assert!(get_media(&s, "bkt", "res/one.bin", &[]).body == data);
    // A status query after the end answers the object.
    let r = req(&s, "PUT", &loc, &[("Content-Range", "bytes */*")], Some(Vec::new()));
    assert_eq!((r.status, r.json()["name"].as_str()), (200, Some("res/one.bin")));

    // An empty object: `bytes */0`.
    let loc = start("res/empty", &[]);
    let r = req(&s, "PUT", &loc, &[("Content-Range", "bytes */0")], Some(Vec::new()));
    assert_eq!((r.status, r.json()["size"].as_str()), (200, Some("0")), "{}", r.json());

    // A checksum that does not match: 400, nothing stored, the session is over.
    let loc = start("res/bad.bin", &[]);
    let r = req(&s, "PUT", &loc, &[("Content-Range", "bytes 0-9/10"), ("X-Goog-Hash", "crc32c=AAAAAA==")], Some(data[..10].to_vec()));
    r.assert_error(400, "invalid");
    get_media(&s, "bkt", "res/bad.bin", &[]).assert_error(404, "notFound");
    req(&s, "PUT", &loc, &[("Content-Range", "bytes */*")], Some(Vec::new())).assert_error(404, "notFound");

    // Cancelled: 499, its bytes gone, the session unknown after.
    let loc = start("res/cancelled.bin", &[]);
    assert_eq!(put(&loc, &format!("bytes 0-{}/*", c - 1), &data[..c]).status, 308);
    let id = loc.rsplit("upload_id=").next().unwrap().to_string();
    assert!(upload_files(&s, "demo").iter().any(|f| f.starts_with(&id)));
    assert_eq!(req(&s, "DELETE", &loc, &[], None).status, 499);
    req(&s, "PUT", &loc, &[("Content-Range", "bytes */*")], Some(Vec::new())).assert_error(404, "notFound");
    assert!(!upload_files(&s, "demo").iter().any(|f| f.starts_with(&id)), "{:?}", upload_files(&s, "demo"));
    get_media(&s, "bkt", "res/cancelled.bin", &[]).assert_error(404, "notFound");
    // A made-up session id is unknown.
    let bogus = format!("/upload/storage/v1/b/bkt/o?uploadType=resumable&upload_id={}", "0".repeat(32));
    req(&s, "PUT", &bogus, &[("Content-Range", "bytes */*")], Some(Vec::new())).assert_error(404, "notFound");
    req(&s, "PUT", "/upload/storage/v1/b/bkt/o?uploadType=resumable&upload_id=..%2F..%2Fx", &[], Some(Vec::new())).assert_error(404, "notFound");
}

#[test]
fn bad_input_is_refused_in_the_storage_error_shape_and_nothing_is_stored() {
    let s = Server::start("");
    create_bucket(&s, "demo", "bkt");
    let up = |q: &str, body: &[u8]| req(&s, "POST", &format!("/upload/storage/v1/b/bkt/o?{q}"), &[], Some(body.to_vec()));
    up("uploadType=media", b"x").assert_error(400, "invalid");
    for bad in ["a%2F..%2Fb", "..", "%2Fabs", "nul%00x", ".trainyard-uploads%2Fx", "x%2F.trainyard", "dir%2F", "a%2F%2Fb", "%FF"] {
        up(&format!("uploadType=media&name={bad}"), b"x").assert_error(400, "invalid");
    }
    req(&s, "GET", "/storage/v1/b/bkt/o/a%2F..%2F..%2Fetc%2Fpasswd?alt=media", &[], None).assert_error(400, "invalid");
    up("uploadType=sideways&name=x", b"x").assert_error(400, "invalid");
    // Checksums that do not match, on a media and a multipart upload.
    let r = req(&s, "POST", "/upload/storage/v1/b/bkt/o?uploadType=media&name=c.txt", &[("X-Goog-Hash", "crc32c=AAAAAA==")], Some(b"data".to_vec()));
    r.assert_error(400, "invalid");
    assert!(r.json()["error"]["message"].as_str().unwrap().contains("CRC32C"));
    let r = req(&s, "POST", "/upload/storage/v1/b/bkt/o?uploadType=media&name=c.txt", &[("X-Goog-Hash", "md5=AAAAAAAAAAAAAAAAAAAAAA==")], Some(b"data".to_vec()));
    r.assert_error(400, "invalid");
    req(&s, "POST", "/upload/storage/v1/b/bkt/o?uploadType=media&name=c.txt", &[("X-Goog-Hash", "crc32c=nonsense")], Some(b"data".to_vec()))
        .assert_error(400, "invalid");
    let b = "BOUNDARY";
    let ct = format!("multipart/related; boundary={b}");
    let multipart = |meta: &str, data: &str, close: bool| {
        let mut body = format!("--{b}\r\nContent-Type: application/json\r\n\r\n{meta}\r\n--{b}\r\nContent-Type: text/plain\r\n\r\n{data}\r\n--{b}");
        if close {
            body.push_str("--");
        }
        req(&s, "POST", "/upload/storage/v1/b/bkt/o?uploadType=multipart", &[("Content-Type", &ct)], Some(body.into_bytes()))
    };
    multipart(r#"{"name": "m.txt", "crc32c": "AAAAAA=="}"#, "data", true).assert_error(400, "invalid");
    multipart(r#"{"name": "m.txt"}"#, "data", false).assert_error(400, "invalid");
    multipart(r#"{"contentType": "text/plain"}"#, "data", true).assert_error(400, "invalid");
    multipart(r#"{"name": "../m.txt"}"#, "data", true).assert_error(400, "invalid");
    multipart(r#"{"name": "#, "data", true).assert_error(400, "invalid");
    let only_meta = format!("--{b}\r\nContent-Type: application/json\r\n\r\n{{\"name\": \"m.txt\"}}\r\n--{b}--");
    req(&s, "POST", "/upload/storage/v1/b/bkt/o?uploadType=multipart", &[("Content-Type", &ct)], Some(only_meta.into_bytes()))
        .assert_error(400, "invalid");
    req(&s, "POST", "/upload/storage/v1/b/bkt/o?uploadType=multipart", &[("Content-Type", "text/plain")], Some(b"x".to_vec()))
        .assert_error(400, "invalid");
    // Bucket names.
    for bad in ["BAD", "ab", "-abc", "a%2Fb", "has%20space"] {
        req(&s, "GET", &format!("/storage/v1/b/{bad}/o"), &[], None).assert_error(400, "invalid");
    }
    req(&s, "POST", "/storage/v1/b?project=demo", &[], Some(br#"{"name": "Not_Valid"}"#.to_vec())).assert_error(400, "invalid");
    req(&s, "POST", "/storage/v1/b?project=..", &[], Some(br#"{"name": "fine-name"}"#.to_vec())).assert_error(400, "invalid");
    req(&s, "POST", "/storage/v1/b?project=demo", &[], Some(b"{not json".to_vec())).assert_error(400, "invalid");
    // Unknown things.
    get_media(&s, "bkt", "nothing-here", &[]).assert_error(404, "notFound");
    req(&s, "GET", "/storage/v1/b/no-such-bucket/o", &[], None).assert_error(404, "notFound");
    media(&s, "no-such-bucket", "x", b"x").assert_error(404, "notFound");
    // Too large for the limit: see `limits_apply_to_uploads_only`.
    // Nothing of it is stored, and the server is still there.
    let bucket_dir: Vec<_> = std::fs::read_dir(root(&s).join("demo/bkt")).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(bucket_dir.is_empty(), "{bucket_dir:?}");
    wait_until(10, "no temporary file is left", || upload_files(&s, "demo").is_empty());
    assert_eq!(req(&s, "GET", "/healthz", &[], None).status, 200);
}

#[test]
fn symbolic_links_in_a_namespace_are_never_followed() {
    let s = Server::start("");
    create_bucket(&s, "demo", "bkt");
    create_bucket(&s, "other", "secret");
    let secret = root(&s).join("other/secret");
    std::fs::write(secret.join("s.txt"), b"other project's secret").unwrap();
    let bkt = root(&s).join("demo/bkt");
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("o.txt"), b"outside").unwrap();
    std::os::unix::fs::symlink("/etc", bkt.join("etc")).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", bkt.join("passwd")).unwrap();
    std::os::unix::fs::symlink(&secret, bkt.join("other")).unwrap();
    std::os::unix::fs::symlink(outside.path(), bkt.join("out")).unwrap();
    std::os::unix::fs::symlink(&secret, root(&s).join("demo/linked-bucket")).unwrap();
    std::fs::write(bkt.join("real.txt"), b"real").unwrap();
    let passwd = std::fs::read("/etc/passwd").unwrap();

    // Not served.
    for name in ["etc/passwd", "passwd", "other/s.txt", "out/o.txt", "etc/hostname"] {
        get_media(&s, "bkt", name, &[]).assert_error(404, "notFound");
        req(&s, "GET", &format!("/storage/v1/b/bkt/o/{}", enc(name)), &[], None).assert_error(404, "notFound");
    }
    req(&s, "GET", "/storage/v1/b/linked-bucket/o/s.txt?alt=media", &[], None).assert_error(404, "notFound");
    req(&s, "GET", "/storage/v1/b/linked-bucket/o", &[], None).assert_error(404, "notFound");
    // Not listed into.
    let (names, _, _) = list_all(&s, "bkt", "");
    assert_eq!(names, ["real.txt"]);
    for prefix in ["etc/", "other/", "out/", "etc"] {
        let (names, prefixes, _) = list_all(&s, "bkt", &format!("prefix={prefix}&delimiter=/"));
        assert!(names.is_empty() && prefixes.is_empty(), "{prefix}: {names:?} {prefixes:?}");
    }
    // Not written through.
    for name in ["etc/evil.txt", "other/evil.txt", "out/evil.txt", "out/deeper/evil.txt"] {
        media(&s, "bkt", name, b"evil").assert_error(400, "invalid");
    }
    media(&s, "linked-bucket", "evil.txt", b"evil").assert_error(404, "notFound");
    assert!(!Path::new("/etc/evil.txt").exists());
    assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 1, "nothing made outside");
    let mut in_secret: Vec<String> = std::fs::read_dir(&secret).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    in_secret.sort();
    assert_eq!(in_secret, ["s.txt"]);
    // Not deleted through.
    req(&s, "DELETE", "/storage/v1/b/bkt/o/other%2Fs.txt", &[], None).assert_error(404, "notFound");
    assert!(secret.join("s.txt").exists());
    // An upload over a link replaces the link itself, never its target.
    assert_eq!(media(&s, "bkt", "passwd", b"not the password file").status, 200);
    assert_eq!(std::fs::read("/etc/passwd").unwrap(), passwd);
    assert!(std::fs::symlink_metadata(bkt.join("passwd")).unwrap().file_type().is_file());
    // The uploads directory replaced by a link (by a job): not followed, made again.
    let up = root(&s).join("demo/.trainyard-uploads");
    std::fs::remove_dir_all(&up).unwrap();
    std::os::unix::fs::symlink(outside.path(), &up).unwrap();
    assert_eq!(media(&s, "bkt", "after.txt", b"after").status, 200);
    assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 1, "nothing made outside");
    assert!(std::fs::symlink_metadata(&up).unwrap().is_dir());
}

const RW_ALPHA: &str = "rw-alpha-7f3a9c2e41d8b605";
const RO_ALPHA: &str = "ro-alpha-e19b74c05a2f3d68";
const RW_BETA: &str = "rw-beta-5c0e8d2b7a4f9136";

#[test]
fn tokens_confine_buckets_to_their_projects() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.toml");
    std::fs::write(
        &tokens,
        format!(
            "[[tokens]]\ntoken = \"{RW_ALPHA}\"\nprojects = [\"alpha\"]\n\n\
             [[tokens]]\ntoken = \"{RO_ALPHA}\"\nprojects = [\"alpha\"]\naccess = \"read-only\"\n\n\
             [[tokens]]\ntoken = \"{RW_BETA}\"\nprojects = [\"beta\"]\n"
        ),
    )
    .unwrap();
    std::fs::set_permissions(&tokens, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let s = Server::start(&format!("tokens_file = \"{}\"\n[storage.buckets]\nmapped = \"beta\"\n", tokens.display()));
    let bearer = |t: &str| format!("Bearer {t}");
    let (rw_a, ro_a, rw_b) = (bearer(RW_ALPHA), bearer(RO_ALPHA), bearer(RW_BETA));
    let call = |method: &str, path: &str, token: Option<&str>, body: Option<&[u8]>| {
        let mut h = Vec::new();
        if let Some(t) = token {
            h.push(("Authorization", t));
        }
        req(&s, method, path, &h, body.map(<[u8]>::to_vec))
    };
    // No token, an unknown token: 401.
    call("GET", "/storage/v1/b/anything/o", None, None).assert_error(401, "required");
    call("GET", "/storage/v1/b/anything/o", Some("Bearer not-a-known-token-at-all"), None).assert_error(401, "required");
    // Buckets are made in the token's projects only; a token of one project needs no ?project=.
    let r = call("POST", "/storage/v1/b", Some(&rw_a), Some(br#"{"name": "data"}"#));
    assert_eq!(r.status, 200, "{}", r.json());
    assert!(root(&s).join("alpha/data").is_dir());
    call("POST", "/storage/v1/b?project=beta", Some(&rw_a), Some(br#"{"name": "sneaky"}"#)).assert_error(403, "forbidden");
    call("POST", "/storage/v1/b?project=alpha", Some(&ro_a), Some(br#"{"name": "readonly"}"#)).assert_error(403, "forbidden");
    assert_eq!(call("POST", "/storage/v1/b", Some(&rw_b), Some(br#"{"name": "data"}"#)).status, 200, "beta's own `data`");
    // Each token sees its own project's `data`.
    let up = |token: &str, bucket: &str, name: &str, body: &[u8]| {
        call("POST", &format!("/upload/storage/v1/b/{bucket}/o?uploadType=media&name={name}"), Some(token), Some(body))
    };
    assert_eq!(up(&rw_a, "data", "x.txt", b"alpha").status, 200);
    assert_eq!(up(&rw_b, "data", "x.txt", b"beta").status, 200);
    assert_eq!(call("GET", "/storage/v1/b/data/o/x.txt?alt=media", Some(&rw_a), None).body, b"alpha");
    assert_eq!(call("GET", "/storage/v1/b/data/o/x.txt?alt=media", Some(&ro_a), None).body, b"alpha");
    assert_eq!(call("GET", "/storage/v1/b/data/o/x.txt?alt=media", Some(&rw_b), None).body, b"beta");
    // Read-only: reads, never writes.
    up(&ro_a, "data", "y.txt", b"no").assert_error(403, "forbidden");
    call("DELETE", "/storage/v1/b/data/o/x.txt", Some(&ro_a), None).assert_error(403, "forbidden");
    let r = call("POST", "/upload/storage/v1/b/data/o?uploadType=resumable&name=z", Some(&ro_a), Some(b""));
    r.assert_error(403, "forbidden");
    // Another project's bucket: 404, the very answer to a bucket nobody has (no oracle
    // of other projects' bucket names).
    assert_eq!(call("POST", "/storage/v1/b", Some(&rw_a), Some(br#"{"name": "alpha-only"}"#)).status, 200);
    let theirs = call("GET", "/storage/v1/b/alpha-only/o", Some(&rw_b), None);
    theirs.assert_error(404, "notFound");
    call("GET", "/storage/v1/b/alpha-only", Some(&rw_b), None).assert_error(404, "notFound");
    up(&rw_b, "alpha-only", "w.txt", b"w").assert_error(404, "notFound");
    let nobodys = call("GET", "/storage/v1/b/alpha-onlz/o", Some(&rw_b), None);
    nobodys.assert_error(404, "notFound");
    assert_eq!(theirs.json()["error"]["message"].as_str().map(|m| m.replace("alpha-only", "X")), nobodys.json()["error"]["message"].as_str().map(|m| m.replace("alpha-onlz", "X")));
    // A bucket mapped to beta in the config is beta's whatever alpha's namespace holds.
    std::fs::create_dir_all(root(&s).join("alpha/mapped")).unwrap();
    std::fs::create_dir_all(root(&s).join("beta/mapped")).unwrap();
    up(&rw_a, "mapped", "m.txt", b"m").assert_error(404, "notFound");
    assert_eq!(up(&rw_b, "mapped", "m.txt", b"m").status, 200);
    assert!(root(&s).join("beta/mapped/m.txt").exists() && !root(&s).join("alpha/mapped/m.txt").exists());
    // ... and alpha's token can neither read it nor list it, whatever alpha's namespace holds.
    std::fs::write(root(&s).join("alpha/mapped/m.txt"), b"alpha's own").unwrap();
    call("GET", "/storage/v1/b/mapped/o/m.txt?alt=media", Some(&rw_a), None).assert_error(404, "notFound");
    call("GET", "/download/storage/v1/b/mapped/o/m.txt?alt=media", Some(&ro_a), None).assert_error(404, "notFound");
    call("GET", "/storage/v1/b/mapped/o/m.txt", Some(&rw_a), None).assert_error(404, "notFound");
    call("GET", "/storage/v1/b/mapped/o", Some(&rw_a), None).assert_error(404, "notFound");
    assert_eq!(call("GET", "/storage/v1/b/mapped/o/m.txt?alt=media", Some(&rw_b), None).body, b"m");
    std::fs::remove_file(root(&s).join("alpha/mapped/m.txt")).unwrap();
    // Listing buckets: one's own project only.
    let listed = call("GET", "/storage/v1/b?project=alpha", Some(&rw_a), None).json();
    let names: Vec<&str> = listed["items"].as_array().unwrap().iter().map(|b| b["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["alpha-only", "data"], "mapped is beta's: {listed}");
    call("GET", "/storage/v1/b?project=alpha", Some(&rw_b), None).assert_error(403, "forbidden");
    // Files the API made in alpha's namespace are alpha's user's (per-project users).
    if is_root() {
        use std::os::unix::fs::MetadataExt;
        let f = std::fs::metadata(root(&s).join("alpha/data/x.txt")).unwrap();
        let d = std::fs::metadata(root(&s).join("alpha/data")).unwrap();
        let b = std::fs::metadata(root(&s).join("beta/data/x.txt")).unwrap();
        assert!(f.uid() != 0 && f.uid() == d.uid() && f.uid() != b.uid(), "{} {} {}", f.uid(), d.uid(), b.uid());
        assert_eq!(f.mode() & 0o777, 0o600);
    }
    std::mem::forget(dir);
}

/// A raw request whose body stops after `sent` of `announced` bytes: the client goes away.
fn cut_upload(s: &Server, path: &str, extra_headers: &str, announced: usize, sent: &[u8]) {
    let mut t = std::net::TcpStream::connect(("127.0.0.1", s.port)).unwrap();
    let head = format!("POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\n{extra_headers}Content-Length: {announced}\r\n\r\n", s.port);
    t.write_all(head.as_bytes()).unwrap();
    t.write_all(sent).unwrap();
    t.flush().unwrap();
    std::thread::sleep(Duration::from_millis(300));
}

#[test]
fn interrupted_and_abandoned_uploads_leave_nothing() {
    let s = Server::start("[storage]\nupload_expiry_secs = 1\n");
    create_bucket(&s, "demo", "bkt");
    let data = pseudo_random(3_000_000, 11);
    cut_upload(&s, "/upload/storage/v1/b/bkt/o?uploadType=media&name=cut.bin", "", 10_000_000, &data);
    let b = "CUT";
    let mut mp = format!("--{b}\r\nContent-Type: application/json\r\n\r\n{{\"name\": \"cut2.bin\"}}\r\n--{b}\r\n\r\n").into_bytes();
    mp.extend_from_slice(&data);
    cut_upload(&s, "/upload/storage/v1/b/bkt/o?uploadType=multipart", &format!("Content-Type: multipart/related; boundary={b}\r\n"), 10_000_000, &mp);
    wait_until(10, "the temporary files are gone", || upload_files(&s, "demo").is_empty());
    get_media(&s, "bkt", "cut.bin", &[]).assert_error(404, "notFound");
    get_media(&s, "bkt", "cut2.bin", &[]).assert_error(404, "notFound");
    assert!(list_all(&s, "bkt", "").0.is_empty());

    // A resumable session left half way is removed once it expires (checked by later uploads).
    let r = req(&s, "POST", "/upload/storage/v1/b/bkt/o?uploadType=resumable&name=left.bin", &[], Some(Vec::new()));
    let loc = r.header("location").unwrap().to_string();
    let r = req(&s, "PUT", &loc, &[("Content-Range", "bytes 0-262143/*")], Some(data[..262_144].to_vec()));
    assert_eq!(r.status, 308);
    assert_eq!(upload_files(&s, "demo").len(), 2, "{:?}", upload_files(&s, "demo"));
    std::thread::sleep(Duration::from_millis(2100));
    wait_until(10, "the abandoned session is removed", || {
        assert_eq!(media(&s, "bkt", "later.txt", b"later").status, 200);
        upload_files(&s, "demo").is_empty()
    });
    req(&s, "PUT", &loc, &[("Content-Range", "bytes */*")], Some(Vec::new())).assert_error(404, "notFound");
    assert_eq!(list_all(&s, "bkt", "").0, ["later.txt"]);
    assert_eq!(req(&s, "GET", "/healthz", &[], None).status, 200);
}

#[test]
fn limits_apply_to_uploads_only() {
    // Uploads: larger than the API's 1 MiB body limit, slower than the body timeout as long
    // as bytes keep coming, up to max_object_bytes.
    let s = Server::start("[http]\nbody_timeout_secs = 1\n[storage]\nmax_object_bytes = 3000000\n");
    create_bucket(&s, "demo", "bkt");
    let data = pseudo_random(2_500_000, 5);
    let r = media(&s, "bkt", "big.bin", &data);
    assert_eq!((r.status, r.json()["size"].as_str()), (200, Some("2500000")), "{}", r.json());
    // Chunked transfer (no Content-Length): refused when the bytes pass the limit (the
    // audit line says 413; the server stops reading, so the client may not see it).
    {
        let mut t = std::net::TcpStream::connect(("127.0.0.1", s.port)).unwrap();
        let head = format!(
            "POST /upload/storage/v1/b/bkt/o?uploadType=media&name=chunked.bin HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nTransfer-Encoding: chunked\r\n\r\n",
            s.port
        );
        t.write_all(head.as_bytes()).unwrap();
        for _ in 0..31 {
            if t.write_all(format!("{:x}\r\n", 100_000).as_bytes()).is_err() {
                break;
            }
            let _ = t.write_all(&data[..100_000]);
            let _ = t.write_all(b"\r\n");
        }
        wait_until(10, "the upload is refused", || s.server_log().contains("path=\"/upload/storage/v1/b/bkt/o\" status=413"));
    }
    wait_until(10, "its temporary file is gone", || upload_files(&s, "demo").is_empty());
    get_media(&s, "bkt", "chunked.bin", &[]).assert_error(404, "notFound");
    let (status, body) = announced_post(&s, "/upload/storage/v1/b/bkt/o?uploadType=media&name=too-big.bin", 3_000_001);
    assert_eq!((status, body["error"]["errors"][0]["reason"].as_str()), (413, Some("uploadTooLarge")), "{body}");
    // 3 s of a slow body (a piece every 200 ms) with a 1 s body timeout: fine.
    let slow = {
        let mut t = std::net::TcpStream::connect(("127.0.0.1", s.port)).unwrap();
        let n = 15 * 1000;
        let head = format!("POST /upload/storage/v1/b/bkt/o?uploadType=media&name=slow.bin HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Length: {n}\r\nConnection: close\r\n\r\n", s.port);
        t.write_all(head.as_bytes()).unwrap();
        for i in 0..15 {
            t.write_all(&data[i * 1000..(i + 1) * 1000]).unwrap();
            std::thread::sleep(Duration::from_millis(200));
        }
        let mut answer = String::new();
        t.read_to_string(&mut answer).unwrap();
        answer
    };
    assert!(slow.starts_with("HTTP/1.1 200"), "{slow}");
    assert_eq!(get_media(&s, "bkt", "slow.bin", &[]).body, &data[..15_000]);
    // A body that stops for longer than the timeout: the upload fails, nothing is stored.
    {
        let mut t = std::net::TcpStream::connect(("127.0.0.1", s.port)).unwrap();
        let head = format!("POST /upload/storage/v1/b/bkt/o?uploadType=media&name=stalled.bin HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Length: 2000\r\n\r\n", s.port);
        t.write_all(head.as_bytes()).unwrap();
        t.write_all(&data[..1000]).unwrap();
        t.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut answer = String::new();
        let _ = t.read_to_string(&mut answer);
        assert!(answer.is_empty() || answer.starts_with("HTTP/1.1 408"), "{answer}");
    }
    wait_until(10, "the stalled upload's file is gone", || upload_files(&s, "demo").is_empty());
    get_media(&s, "bkt", "stalled.bin", &[]).assert_error(404, "notFound");
    // The rest of the API keeps its 1 MiB body limit.
    let (status, _) = announced_post(&s, "/v1/projects/demo/locations/us-central1/customJobs", 2 * 1024 * 1024);
    assert_eq!(status, 413);
}

/// A POST announcing `len` bytes of which 1 KiB is sent: the answer (status, JSON body).
fn announced_post(s: &Server, path: &str, len: usize) -> (u16, Value) {
    let mut c = std::net::TcpStream::connect(("127.0.0.1", s.port)).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let head = format!("POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {len}\r\n\r\n");
    c.write_all(head.as_bytes()).unwrap();
    let _ = c.write_all(&[b' '; 1024]);
    let mut text = String::new();
    let _ = c.read_to_string(&mut text);
    let status = text.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = text.split("\r\n\r\n").nth(1).and_then(|b| serde_json::from_str(b).ok()).unwrap_or(Value::Null);
    (status, body)
}

/// Objects uploaded through the API are the job's `/gcs/BUCKET/NAME` files, and what the
/// job writes there is an object.
#[test]
fn jobs_and_the_api_share_the_same_files() {
    if skip_on_slurm("the storage root is this host's") {
        return;
    }
    let s = Server::start("");
    create_bucket(&s, "demo", "bkt");
    assert_eq!(media(&s, "bkt", "in.txt", b"shared bytes").status, 200);
    let job = json!({
        "displayName": "gcs",
        "jobSpec": {"workerPoolSpecs": [{
            "machineSpec": {"machineType": "n1-standard-4"},
            "replicaCount": "1",
            "containerSpec": {"imageUri": "python:3.11", "command": ["sh", "-c", "tr a-z A-Z < \"$1\" > \"$2\"", "sh", "/gcs/bkt/in.txt", "/gcs/bkt/up.txt"]}
        }]}
    });
    let created = s.create("demo", &job);
    let done = s.wait_terminal(&name_of(&created), 60);
    assert_eq!(done["state"], "JOB_STATE_SUCCEEDED", "{done:#}\n{}", s.logs_text(&name_of(&created)));
    let d = get_media(&s, "bkt", "up.txt", &[]);
    assert_eq!((d.status, d.body.as_slice()), (200, b"SHARED BYTES".as_slice()));
    let (names, _, _) = list_all(&s, "bkt", "");
    assert_eq!(names, ["in.txt", "up.txt"]);
}
