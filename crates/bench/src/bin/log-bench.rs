//! `log-bench`: what capturing a replica's output costs (L22). A program writes N lines of
//! 100 bytes to stdout, run three ways in the same run, interleaved: writing to a file
//! itself (the baseline), writing to /dev/null (the program's own cost), and under
//! Trainyard's shim through the local backend (`log.jsonl`). Printed: wall time, MB/s, the
//! ratio against the baseline, and the bytes on disk per byte of output.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use trainyard_backend::{BackendEvent, CgroupSupport, LocalBackend, ShimSpec};
use trainyard_core::RunId;

const USAGE: &str = "\
usage: log-bench [--mb N] [--rounds N] [--python]
  --mb N       megabytes of output per run, in 100-byte lines (default 200)
  --python     the writer is a Python loop (print-like writes) instead of `yes | head`
  --rounds N   runs of each way, interleaved; the median is printed (default 3)
Build with `cargo build --release -p trainyard -p trainyard-bench`; the shim is
`trainyard-shim` (or `trainyard shim`) beside this program.";

struct Opts {
    mb: u64,
    rounds: usize,
    python: bool,
}

impl Opts {
    fn parse(args: &[String]) -> Result<Option<Opts>> {
        let mut o = Opts { mb: 200, rounds: 3, python: false };
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let mut num = |name: &str| -> Result<u64> {
                it.next().with_context(|| format!("{name} needs a value"))?.parse().with_context(|| format!("{name}: not a number"))
            };
            match a.as_str() {
                "--mb" => o.mb = num("--mb")?.max(1),
                "--rounds" => o.rounds = num("--rounds")?.max(1) as usize,
                "--python" => o.python = true,
                "-h" | "--help" => return Ok(None),
                other => bail!("unknown argument {other:?}"),
            }
        }
        Ok(Some(o))
    }
}

#[path = "../shared/entry.rs"]
mod entry;

#[path = "../shared/row.rs"]
mod row;

fn main() -> ExitCode {
    entry::main_of("log-bench", USAGE, Opts::parse, run)
}

/// The writer: N lines of 99 characters and a newline, from a small C-speed loop (`yes`
/// with a fixed line, cut by `head`), so that the program's own cost is small.
fn script(lines: u64, python: bool) -> String {
    let line = "x".repeat(99);
    if python {
        return format!("python3 -c \"import sys\nw = sys.stdout.write\nfor _ in range({lines}): w('{line}\\n')\"");
    }
    format!("yes {line} | head -n {lines}")
}

fn shim_command() -> Result<Vec<OsString>> {
    let me = std::env::current_exe()?;
    let dir = me.parent().context("no directory")?;
    for (name, args) in [("trainyard-shim", vec![]), ("trainyard", vec!["shim"])] {
        let p = dir.join(name);
        if p.exists() {
            return Ok(std::iter::once(p.into_os_string()).chain(args.into_iter().map(OsString::from)).collect());
        }
    }
    bail!("no trainyard-shim or trainyard beside {}", me.display())
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn time_sh(script: &str, out: Stdio) -> Result<Duration> {
    let t = Instant::now();
    let st = Command::new("sh").args(["-c", script]).stdout(out).status()?;
    if !st.success() {
        bail!("{script}: {st}");
    }
    Ok(t.elapsed())
}

fn time_shim(backend: &LocalBackend, dir: &Path, script: &str, n: usize) -> Result<(Duration, u64)> {
    let run_dir = dir.join(format!("run-{n}"));
    let spec = ShimSpec::new(
        vec!["sh".into(), "-c".into(), script.into()],
        vec![("PATH".into(), std::env::var("PATH").unwrap_or_else(|_| "/usr/bin:/bin".into()))],
    );
    let run = RunId { job: 1, attempt: 0, replica: "workerpool0-0".into(), restart: n as u32 };
    let (tx, rx) = std::sync::mpsc::channel();
    let sink: trainyard_backend::EventSink = std::sync::Arc::new(move |e| {
        let _ = tx.send(e);
    });
    let t = Instant::now();
    backend.launch(run, &run_dir, spec, sink)?;
    loop {
        match rx.recv_timeout(Duration::from_secs(600))? {
            BackendEvent::Exited { outcome, .. } => {
                let took = t.elapsed();
                if outcome != (trainyard_core::Outcome::Exited { code: 0 }) {
                    bail!("the program ended {outcome:?}");
                }
                let size = std::fs::metadata(run_dir.join("log.jsonl")).map(|m| m.len()).unwrap_or(0);
                std::fs::remove_dir_all(&run_dir).ok();
                return Ok((took, size));
            }
            BackendEvent::Started { .. } => {}
        }
    }
}

fn run(o: &Opts) -> Result<()> {
    let lines = o.mb * 1_000_000 / 100;
    let bytes = lines * 100;
    let tmp = tempfile::tempdir()?;
    let dir: PathBuf = tmp.path().to_path_buf();
    let script = script(lines, o.python);
    let backend = LocalBackend::new(shim_command()?, CgroupSupport::Unavailable { reason: "not measured here".into() });
    let (mut file_t, mut null_t, mut shim_t, mut disk) = (Vec::new(), Vec::new(), Vec::new(), 0);
    for n in 0..o.rounds {
        let out = dir.join("out.txt");
        file_t.push(time_sh(&script, Stdio::from(std::fs::File::create(&out)?))?);
        std::fs::remove_file(&out).ok();
        null_t.push(time_sh(&script, Stdio::null())?);
        let (t, size) = time_shim(&backend, &dir, &script, n)?;
        shim_t.push(t);
        disk = size;
    }
    let (f, z, s) = (median(file_t), median(null_t), median(shim_t));
    let mbps = |d: Duration| bytes as f64 / 1e6 / d.as_secs_f64();
    let writer = if o.python { "a Python loop" } else { "yes | head" };
    println!("log-bench: {} MB of output in {lines} lines of 100 bytes from {writer}, median of {} runs each", o.mb, o.rounds);
    println!("  {:<44} {:>9} {:>10} {:>8}", "", "seconds", "MB/s", "ratio");
    println!("  {:<44} {:>9.3} {:>10.0} {:>8}", "program > /dev/null (its own cost)", z.as_secs_f64(), mbps(z), format!("{:.2}x", z.as_secs_f64() / f.as_secs_f64()));
    println!("  {:<44} {:>9.3} {:>10.0} {:>8}", "program > file (baseline)", f.as_secs_f64(), mbps(f), "1.00x");
    println!("  {:<44} {:>9.3} {:>10.0} {:>8}", "under the shim, to log.jsonl", s.as_secs_f64(), mbps(s), format!("{:.2}x", s.as_secs_f64() / f.as_secs_f64()));
    row::row("log-bench", &format!("{} MB of output through the shim", o.mb), &format!("{:.3} s", s.as_secs_f64()), &format!("{:.3} s to a file", f.as_secs_f64()), s.as_secs_f64() / f.as_secs_f64());
    println!("  log.jsonl: {} bytes for {bytes} bytes of output ({:.2} bytes on disk per byte)", disk, disk as f64 / bytes as f64);
    Ok(())
}
