//! `storage-bench`: the Cloud Storage endpoint's upload and download throughput against
//! `cp` of the same file on the same disk, measured in the same run, and the server's
//! memory while it streams.
//!
//! A real `trainyard serve` (`--server-bin`, default `trainyard` beside this program) with
//! its data directory (and storage root) in the bench's temporary directory, next to the
//! source file. Each repetition, after a `sync()` so that no earlier write is still being
//! flushed:
//!
//! - `cp SRC DST`, then `sync DST` (an fsync): the baselines `cp` and `cp + fsync`;
//! - upload: `curl -T SRC -X POST .../upload/storage/v1/b/bench/o?uploadType=media&name=big`
//!   (curl streams the file; the server streams it to a temporary file, computes its
//!   CRC32C, fsyncs and renames it into place, and answers; no MD5 was sent, so the
//!   server computes it after, in the background), and then the time until the object's
//!   metadata shows that MD5 (polled every 10 ms);
//! - upload with an MD5 (`X-Goog-Hash: md5=...`, as a client that wants it checked sends
//!   it): the server computes the MD5 as the bytes come and checks it before the commit;
//! - download: `curl -o DL .../download/storage/v1/b/bench/o/big?alt=media` (to a file on
//!   the same disk, not synced: compared with `cp`);
//! - for reference: `md5sum SRC` (MD5 alone), the download to /dev/null (the server's
//!   side without curl's writes), and the same curl upload to a sink of this program that
//!   reads the body and throws it away (what curl itself allows: no server can answer an
//!   upload faster than curl sends it).
//!
//! Each measurement starts once the server has nothing left to do from the one before
//! (the background MD5 is waited for). The medians are printed, with the ratios
//! `cp time / endpoint time` (1.0: as fast as cp). The server's resident memory is
//! sampled from `/proc/<pid>/status` (VmRSS) every 5 ms during each transfer (and the
//! background MD5); VmHWM is the high-water mark of the server's life. The MD5 the server
//! computed is compared with md5sum's, the downloaded bytes with the source.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};

const USAGE: &str = "\
usage: storage-bench [--size-mib N] [--reps N] [--dir DIR] [--server-bin PATH] [--quick] [--keep]

  --size-mib N    size of the file (default 1024)
  --reps N        repetitions of each measurement; medians are printed (default 3)
  --dir DIR       where the temporary directory goes (default $TMPDIR or /tmp): the
                  source, the copies and the server's data directory are all there
  --server-bin P  the server (default: trainyard beside this program)
  --quick         --size-mib 64 --reps 1 (a smoke test)
  --keep          keep the temporary directory

Build with `cargo build --release -p trainyard -p trainyard-bench`; run
target/release/storage-bench. Needs curl on PATH.";

struct Opts {
    size_mib: u64,
    reps: usize,
    dir: Option<PathBuf>,
    server_bin: Option<PathBuf>,
    keep: bool,
}

impl Opts {
    fn parse(args: &[String]) -> Result<Option<Opts>> {
        let mut o = Opts { size_mib: 1024, reps: 3, dir: None, server_bin: None, keep: false };
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let mut val = |name: &str| it.next().cloned().ok_or_else(|| anyhow!("{name} needs a value"));
            match a.as_str() {
                "--size-mib" => o.size_mib = val("--size-mib")?.parse().map_err(|_| anyhow!("--size-mib needs a number"))?,
                "--reps" => o.reps = val("--reps")?.parse::<usize>().map_err(|_| anyhow!("--reps needs a number"))?.max(1),
                "--dir" => o.dir = Some(PathBuf::from(val("--dir")?)),
                "--server-bin" => o.server_bin = Some(PathBuf::from(val("--server-bin")?)),
                "--quick" => {
                    o.size_mib = 64;
                    o.reps = 1;
                }
                "--keep" => o.keep = true,
                "-h" | "--help" => return Ok(None),
                other => bail!("unknown argument {other:?}"),
            }
        }
        if o.size_mib == 0 {
            bail!("--size-mib must be at least 1");
        }
        Ok(Some(o))
    }
}

#[path = "../shared/entry.rs"]
mod entry;

#[path = "../shared/row.rs"]
mod row;

fn main() -> ExitCode {
    entry::main_of("storage-bench", USAGE, Opts::parse, run)
}

#[path = "../shared/server.rs"]
mod server;
use server::{agent, Server};

/// `trainyard serve` on `dir` with its config and data directory there.
fn start_server(exe: &Path, dir: &Path) -> Result<Server> {
    let config = dir.join("trainyard.toml");
    std::fs::write(&config, "[containers]\nengine = \"none\"\n")?;
    Server::start(exe, &config, &dir.join("data"), Duration::from_secs(60), |c| {
        c.current_dir(dir);
    })
}

impl Server {
    fn status_kib(&self, key: &str) -> u64 {
        let text = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap_or_default();
        text.lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    }
}

/// Samples the server's VmRSS every 5 ms while alive; the maximum seen, in KiB.
struct RssSampler {
    stop: Arc<AtomicBool>,
    max: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RssSampler {
    fn start(pid: u32) -> RssSampler {
        let stop = Arc::new(AtomicBool::new(false));
        let max = Arc::new(AtomicU64::new(0));
        let (s, m) = (Arc::clone(&stop), Arc::clone(&max));
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
                if let Some(kib) = text
                    .lines()
                    .find(|l| l.starts_with("VmRSS:"))
                    .and_then(|l| l.split_whitespace().nth(1))
                    .and_then(|v| v.parse::<u64>().ok())
                {
                    m.fetch_max(kib, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        RssSampler { stop, max, thread: Some(thread) }
    }

    fn finish(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.max.load(Ordering::Relaxed)
    }
}

fn sync_all() {
    // SAFETY: sync(2) has no preconditions.
    unsafe { libc::sync() };
}

/// Run a command to success; its wall time.
fn timed(cmd: &mut Command) -> Result<Duration> {
    let t = Instant::now();
    let out = cmd.stdout(Stdio::null()).stderr(Stdio::piped()).output().with_context(|| format!("running {cmd:?}"))?;
    let took = t.elapsed();
    if !out.status.success() {
        bail!("{cmd:?} failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr));
    }
    Ok(took)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn write_source(path: &Path, mib: u64) -> Result<()> {
    let mut f = std::fs::File::create(path)?;
    let mut rng = trainyard_core::rng::Rng::new(0x5EED);
    let mut buf = vec![0u8; 1 << 20];
    for _ in 0..mib {
        for c in buf.chunks_mut(8) {
            c.copy_from_slice(&rng.next_u64().to_le_bytes()[..c.len()]);
        }
        f.write_all(&buf)?;
    }
    f.sync_all()?;
    Ok(())
}

fn same_bytes(a: &Path, b: &Path) -> Result<bool> {
    let (mut fa, mut fb) = (std::fs::File::open(a)?, std::fs::File::open(b)?);
    let (mut ba, mut bb) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
    loop {
        let na = fa.read(&mut ba)?;
        let mut nb = 0;
        while nb < na {
            let k = fb.read(&mut bb[nb..na])?;
            if k == 0 {
                return Ok(false);
            }
            nb += k;
        }
        if na == 0 {
            return Ok(fb.read(&mut bb[..1])? == 0);
        }
        if ba[..na] != bb[..na] {
            return Ok(false);
        }
    }
}

/// An HTTP server on 127.0.0.1 that reads each request's body (Content-Length) and throws
/// it away, then answers 200: the ceiling of an upload with this client. Its URL.
fn start_sink() -> Result<String> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").context("binding the sink")?;
    let url = format!("http://{}/sink", l.local_addr()?);
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 4 << 20];
        for conn in l.incoming() {
            let Ok(mut c) = conn else { continue };
            let _ = sink_one(&mut c, &mut buf);
        }
    });
    Ok(url)
}

fn sink_one(c: &mut std::net::TcpStream, buf: &mut [u8]) -> Result<()> {
    let mut head = Vec::new();
    let end = loop {
        let n = c.read(buf)?;
        if n == 0 {
            bail!("the client went away");
        }
        head.extend_from_slice(&buf[..n]);
        if let Some(i) = head.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
    };
    let text = String::from_utf8_lossy(&head[..end]).to_ascii_lowercase();
    if text.contains("100-continue") {
        c.write_all(b"HTTP/1.1 100 Continue\r\n\r\n")?;
    }
    let len: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| anyhow!("no Content-Length"))?;
    let mut got = (head.len() - end) as u64;
    while got < len {
        let n = c.read(buf)?;
        if n == 0 {
            bail!("the body ended early");
        }
        got += n as u64;
    }
    c.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")?;
    Ok(())
}

/// The object's `md5Hash`, if its metadata has one.
fn md5_of_object(url: &str) -> Result<Option<String>> {
    let mut r = agent().get(url).call().with_context(|| format!("GET {url}"))?;
    if r.status() != 200 {
        bail!("GET {url}: {}", r.status());
    }
    let v: serde_json::Value = serde_json::from_str(&r.body_mut().read_to_string()?).context("the object's metadata")?;
    Ok(v["md5Hash"].as_str().map(str::to_string))
}

/// Poll the object's metadata every 10 ms until it has its `md5Hash` (60 s at most).
fn wait_md5(url: &str) -> Result<String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(m) = md5_of_object(url)? {
            return Ok(m);
        }
        if Instant::now() > deadline {
            bail!("the object has no md5Hash 60 s after its upload");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Base64 of `md5sum`'s hex digest, as the API writes MD5s.
fn md5sum_b64(path: &Path) -> Result<String> {
    let out = Command::new("md5sum").arg(path).output().context("running md5sum")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let hex = text.split_whitespace().next().filter(|h| h.len() == 32).ok_or_else(|| anyhow!("md5sum said {text:?}"))?;
    let bytes: Vec<u8> = (0..16).map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16)).collect::<Result<_, _>>()?;
    const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for c in bytes.chunks(3) {
        let n = (c[0] as u32) << 16 | (*c.get(1).unwrap_or(&0) as u32) << 8 | *c.get(2).unwrap_or(&0) as u32;
        for i in 0..4 {
            out.push(if i <= c.len() { A[(n >> (18 - 6 * i) & 63) as usize] as char } else { '=' });
        }
    }
    Ok(out)
}

fn run(o: &Opts) -> Result<()> {
    let exe = match &o.server_bin {
        Some(p) => p.clone(),
        None => std::env::current_exe()?.parent().map(|d| d.join("trainyard")).ok_or_else(|| anyhow!("no directory of this program"))?,
    };
    if Command::new("curl").arg("--version").stdout(Stdio::null()).status().map(|s| !s.success()).unwrap_or(true) {
        bail!("curl is needed on PATH");
    }
    let mut tmp = match &o.dir {
        Some(d) => tempfile::Builder::new().prefix("storage-bench-").tempdir_in(d)?,
        None => tempfile::Builder::new().prefix("storage-bench-").tempdir()?,
    };
    if o.keep {
        tmp.disable_cleanup(true);
    }
    let dir = tmp.path().to_path_buf();
    let src = dir.join("src.bin");
    let bytes = o.size_mib << 20;
    println!("storage-bench: {} MiB, {} repetitions, in {}", o.size_mib, o.reps, dir.display());
    write_source(&src, o.size_mib)?;
    let server = start_server(&exe, &dir)?;
    let r = agent().post(&format!("{}/storage/v1/b?project=bench", server.base)).send(r#"{"name": "bench"}"#)?;
    if r.status() != 200 {
        bail!("cannot create the bucket: {}", r.status());
    }
    let idle_rss = server.status_kib("VmRSS:");
    let upload_url = format!("{}/upload/storage/v1/b/bench/o?uploadType=media&name=big", server.base);
    let download_url = format!("{}/download/storage/v1/b/bench/o/big?alt=media", server.base);
    let meta_url = format!("{}/storage/v1/b/bench/o/big", server.base);
    let sink_url = start_sink()?;
    let want_md5 = md5sum_b64(&src)?;
    let (dst, dl) = (dir.join("cp.bin"), dir.join("dl.bin"));
    let (mut cp, mut cp_sync, mut up, mut down) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut up_md5_ready, mut up_client_md5) = (Vec::new(), Vec::new());
    let (mut md5, mut null, mut sink) = (Vec::new(), Vec::new(), Vec::new());
    let (mut up_rss, mut up_md5_rss, mut down_rss) = (0u64, 0u64, 0u64);
    for rep in 0..o.reps {
        let _ = std::fs::remove_file(&dst);
        let _ = std::fs::remove_file(&dl);
        sync_all();
        let c = timed(Command::new("cp").arg(&src).arg(&dst))?;
        let s = timed(Command::new("sync").arg(&dst))?;
        cp.push(c.as_secs_f64());
        cp_sync.push((c + s).as_secs_f64());
        sync_all();
        let sampler = RssSampler::start(server.child.id());
        let t0 = Instant::now();
        let u = timed(
            Command::new("curl")
                .args(["-sS", "-f", "-X", "POST", "-H", "Content-Type: application/octet-stream", "-o", "/dev/null", "-T"])
                .arg(&src)
                .arg(&upload_url),
        )?;
        let got = wait_md5(&meta_url)?;
        let ready = t0.elapsed();
        up_rss = up_rss.max(sampler.finish());
        if got != want_md5 {
            bail!("the server's MD5 of the upload is {got}, md5sum's {want_md5}");
        }
        up.push(u.as_secs_f64());
        up_md5_ready.push(ready.as_secs_f64());
        sync_all();
        let sampler = RssSampler::start(server.child.id());
        let um = timed(
            Command::new("curl")
                .args(["-sS", "-f", "-X", "POST", "-H", "Content-Type: application/octet-stream", "-H"])
                .arg(format!("X-Goog-Hash: md5={want_md5}"))
                .args(["-o", "/dev/null", "-T"])
                .arg(&src)
                .arg(&upload_url),
        )?;
        up_md5_rss = up_md5_rss.max(sampler.finish());
        if md5_of_object(&meta_url)?.as_deref() != Some(want_md5.as_str()) {
            bail!("the upload with an MD5 is not answered with it");
        }
        up_client_md5.push(um.as_secs_f64());
        sync_all();
        let sampler = RssSampler::start(server.child.id());
        let d = timed(Command::new("curl").args(["-sS", "-f", "-o"]).arg(&dl).arg(&download_url))?;
        down_rss = down_rss.max(sampler.finish());
        down.push(d.as_secs_f64());
        let n = timed(Command::new("curl").args(["-sS", "-f", "-o", "/dev/null"]).arg(&download_url))?;
        null.push(n.as_secs_f64());
        let m = timed(Command::new("md5sum").arg(&src))?;
        md5.push(m.as_secs_f64());
        let k = timed(
            Command::new("curl")
                .args(["-sS", "-f", "-X", "POST", "-H", "Content-Type: application/octet-stream", "-o", "/dev/null", "-T"])
                .arg(&src)
                .arg(&sink_url),
        )?;
        sink.push(k.as_secs_f64());
        println!(
            "rep {}: cp {:.2} s, cp + fsync {:.2} s, upload {:.2} s (MD5 kept after {:.2} s), upload with an MD5 {:.2} s, download {:.2} s ({:.2} s to /dev/null), md5sum {:.2} s, curl to a sink {:.2} s",
            rep + 1,
            c.as_secs_f64(),
            (c + s).as_secs_f64(),
            u.as_secs_f64(),
            ready.as_secs_f64(),
            um.as_secs_f64(),
            d.as_secs_f64(),
            n.as_secs_f64(),
            m.as_secs_f64(),
            k.as_secs_f64()
        );
    }
    if !same_bytes(&src, &dl)? {
        bail!("the downloaded bytes differ from the source");
    }
    let object = dir.join("data/storage/bench/bench/big");
    if !same_bytes(&src, &object)? {
        bail!("the stored object differs from the source");
    }
    let hwm = server.status_kib("VmHWM:");
    let (cp, cp_sync, up, down) = (median(&mut cp), median(&mut cp_sync), median(&mut up), median(&mut down));
    let (up_ready, up_md5) = (median(&mut up_md5_ready), median(&mut up_client_md5));
    let (md5, null, sink) = (median(&mut md5), median(&mut null), median(&mut sink));
    let mibs = |secs: f64| bytes as f64 / (1 << 20) as f64 / secs;
    println!();
    println!("| {} MiB, median of {} | seconds | MiB/s | cp time / this |", o.size_mib, o.reps);
    println!("|---|---|---|---|");
    let mb = o.size_mib;
    row::row("storage-bench", &format!("upload {mb} MiB (fsync + rename)"), &format!("{up:.2} s"), &format!("{cp_sync:.2} s cp + fsync"), up / cp_sync);
    row::row("storage-bench", &format!("download {mb} MiB to a file"), &format!("{down:.2} s"), &format!("{cp:.2} s cp"), down / cp);
    println!("| [base] cp | {cp:.2} | {:.0} | 1.00 |", mibs(cp));
    println!("| [base] cp + fsync | {cp_sync:.2} | {:.0} | {:.2} |", mibs(cp_sync), cp / cp_sync);
    println!("| upload (media, no MD5 sent: CRC32C, fsync + rename, answered) | {up:.2} | {:.0} | {:.2} (vs cp + fsync: {:.2}) |", mibs(up), cp / up, cp_sync / up);
    println!("| [ref] upload until its background MD5 is kept | {up_ready:.2} | {:.0} | {:.2} |", mibs(up_ready), cp / up_ready);
    println!("| upload with a client MD5 (checked before the commit) | {up_md5:.2} | {:.0} | {:.2} (vs cp + fsync: {:.2}) |", mibs(up_md5), cp / up_md5, cp_sync / up_md5);
    println!("| download (to a file) | {down:.2} | {:.0} | {:.2} |", mibs(down), cp / down);
    println!("| [ref] download to /dev/null | {null:.2} | {:.0} | {:.2} |", mibs(null), cp / null);
    println!("| [ref] md5sum of the file | {md5:.2} | {:.0} | {:.2} |", mibs(md5), cp / md5);
    println!("| [ref] curl upload to a sink that throws the bytes away | {sink:.2} | {:.0} | {:.2} |", mibs(sink), cp / sink);
    println!();
    println!(
        "server memory: idle VmRSS {:.1} MiB; max VmRSS during upload and its background MD5 {:.1} MiB, during the upload with an MD5 {:.1} MiB, during download {:.1} MiB; VmHWM {:.1} MiB",
        idle_rss as f64 / 1024.0,
        up_rss as f64 / 1024.0,
        up_md5_rss as f64 / 1024.0,
        down_rss as f64 / 1024.0,
        hwm as f64 / 1024.0
    );
    drop(server);
    Ok(())
}
