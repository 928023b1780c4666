//! `records-bench`: Vertex ML Metadata lists with a filter at 100,000 artifacts, and the
//! cost of reading TensorBoard event files into time series.
//!
//! 1. A store with `--artifacts` artifacts (100,000) in `--contexts` contexts is filled
//!    through the server's own create and `addContextArtifactsAndExecutions` code, then
//!    list pages (`pageSize` 100, as the SDK asks) are timed with the filters the SDK and
//!    users send; the baseline, in the same run, is the same list without a filter on a
//!    store of 1,000 artifacts. The narrowing filters (`schema_title=`, `in_context()`,
//!    `display_name=`) read only the rows they name; a filter on metadata alone reads
//!    every artifact until the page is full.
//! 2. An event file of `--scalars` scalars: the reader's parse (TFRecord CRCs and the
//!    Event protos) against CRC-32C alone over the same bytes, and the driver's write of a
//!    pass of 10,000 scalars (series found, points and offsets written); the share of a
//!    core that 10,000 scalars a second cost.
//!
//! The machine is assumed noisy: read the ratios, not the absolute milliseconds.

use std::time::Instant;

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use trainyard_server::records::events;
use trainyard_server::records::ingest::{apply, Batch, FileRead};
use trainyard_server::records::ops::{Paging, Request};
use trainyard_server::records::{dispatch, target};
use trainyard_store::Store;

const USAGE: &str = "usage: records-bench [--quick] [--artifacts N] [--contexts N] [--scalars N] [-n N]";

fn req(path: &str, query: &[(&str, &str)], body: Value) -> Result<Request> {
    Ok(Request {
        target: target("bench", "us-central1", path).map_err(|e| anyhow::anyhow!(e.message))?,
        query: query.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        body,
        ints: false,
    })
}

fn write(s: &mut Store, method: dispatch::Method, r: &Request, now: i64) -> Result<Value> {
    dispatch::write(s, method, r, now).map_err(|e| anyhow::anyhow!("{}", e.message))
}

/// A store of `n` artifacts spread over `contexts` contexts.
fn filled(dir: &std::path::Path, n: usize, contexts: usize) -> Result<Store> {
    let mut s = Store::open(&dir.join(format!("records-{n}.db"))).context("store")?;
    let store = "projects/bench/locations/us-central1/metadataStores/default";
    for c in 0..contexts {
        write(&mut s, dispatch::Method::Post, &req("metadataStores/default/contexts", &[("contextId", &format!("ctx-{c}"))], json!({"schemaTitle": "system.ExperimentRun"}))?, 1)?;
    }
    let titles = ["system.Metrics", "system.Model", "system.Dataset", "google.ClassificationMetrics"];
    // Artifact i is in context i % contexts; added to their contexts 500 at a time (as a
    // pipeline's tracking would).
    let mut pending: Vec<Vec<String>> = vec![Vec::new(); contexts.max(1)];
    let flush = |s: &mut Store, c: usize, names: &mut Vec<String>| -> Result<()> {
        if !names.is_empty() {
            let body = json!({"artifacts": std::mem::take(names)});
            write(s, dispatch::Method::Post, &req(&format!("metadataStores/default/contexts/ctx-{c}:addContextArtifactsAndExecutions"), &[], body)?, 3)?;
        }
        Ok(())
    };
    for i in 0..n {
        let id = format!("artifact-{i}");
        let body = json!({"displayName": id, "schemaTitle": titles[i % titles.len()], "state": "LIVE",
            "metadata": {"acc": (i % 1000) as f64 / 1000.0, "epochs": (i % 30) as f64, "framework": "torch"}});
        write(&mut s, dispatch::Method::Post, &req("metadataStores/default/artifacts", &[("artifactId", &id)], body)?, 2)?;
        let c = i % pending.len();
        pending[c].push(format!("{store}/artifacts/{id}"));
        if pending[c].len() == 500 {
            flush(&mut s, c, &mut pending[c])?;
        }
    }
    for (c, names) in pending.iter_mut().enumerate() {
        flush(&mut s, c, names)?;
    }
    Ok(s)
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

/// p50 and p99 (ms) of `n` list pages with `filter`, and how many rows the last one had.
fn time_list(s: &Store, filter: &str, n: usize) -> Result<(f64, f64, usize)> {
    let mut ms = Vec::with_capacity(n);
    let mut rows = 0;
    let q: Vec<(&str, &str)> = if filter.is_empty() { vec![] } else { vec![("filter", filter)] };
    let r = req("metadataStores/default/artifacts", &q, Value::Null)?;
    for _ in 0..n {
        let t = Instant::now();
        let v = dispatch::read(s, dispatch::Method::Get, &r, Paging { after: 0, size: 100 }, |seq| seq.to_string()).map_err(|e| anyhow::anyhow!("{}", e.message))?;
        ms.push(t.elapsed().as_secs_f64() * 1e3);
        rows = v["artifacts"].as_array().map_or(0, Vec::len);
    }
    Ok((percentile(&mut ms, 0.5), percentile(&mut ms, 0.99), rows))
}

fn main() -> Result<()> {
    let mut artifacts = 100_000usize;
    let mut contexts = 100usize;
    let mut scalars = 200_000usize;
    let mut n = 200usize;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut num = |what: &str| -> Result<usize> { args.next().and_then(|v| v.parse().ok()).with_context(|| format!("{what} takes a number\n{USAGE}")) };
        match a.as_str() {
            "--quick" => {
                artifacts = 2_000;
                contexts = 20;
                scalars = 20_000;
                n = 10;
            }
            "--artifacts" => artifacts = num("--artifacts")?,
            "--contexts" => contexts = num("--contexts")?.max(1),
            "--scalars" => scalars = num("--scalars")?,
            "-n" => n = num("-n")?.max(1),
            other => bail!("unknown argument {other}\n{USAGE}"),
        }
    }
    let dir = tempfile::tempdir()?;

    // -- 1. Lists with a filter. -----------------------------------------------------------
    let t = Instant::now();
    let big = filled(dir.path(), artifacts, contexts)?;
    println!("filled {artifacts} artifacts in {contexts} contexts in {:.1} s", t.elapsed().as_secs_f64());
    let small = filled(dir.path(), 1_000.min(artifacts), 10.min(contexts))?;
    let (b50, b99, brows) = time_list(&small, "", n)?;
    println!("baseline: 1,000 artifacts, no filter: p50 {b50:.2} ms, p99 {b99:.2} ms ({brows} rows)");
    let ctx = format!("projects/bench/locations/us-central1/metadataStores/default/contexts/ctx-{}", contexts / 2);
    let cases = [
        ("schema_title and in_context", format!(r#"schema_title="system.Dataset" AND in_context("{ctx}")"#)),
        ("display_name", format!(r#"display_name="artifact-{}""#, artifacts / 2)),
        ("schema_title, first page", r#"schema_title="system.Dataset""#.to_string()),
        ("metadata only (scans)", "metadata.acc.number_value >= 0.998".to_string()),
    ];
    for (what, filter) in &cases {
        let (p50, p99, rows) = time_list(&big, filter, n)?;
        println!("{what}: {filter}\n  p50 {p50:.2} ms, p99 {p99:.2} ms, {rows} rows");
        println!("bench-row: records-bench | metadata list p99, {artifacts} artifacts, filter {what} | {p99:.2} ms | {b99:.2} ms (1,000, no filter) | {:.2}x", p99 / b99);
    }

    // -- 2. Event files. ---------------------------------------------------------------------
    let mut file = Vec::new();
    for i in 0..scalars {
        file.extend(events::scalar_record(i as i64, 1_765_000_000.0 + i as f64, &[("loss", 1.0 / (1.0 + i as f32))]));
    }
    let t = Instant::now();
    let crc = crc_only(&file);
    let crc_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let read = events::read(&file, 0);
    let parse_s = t.elapsed().as_secs_f64();
    if read.scalars.len() != scalars || read.damage.is_some() {
        bail!("the reader found {} of {scalars} scalars ({:?})", read.scalars.len(), read.damage);
    }
    println!("event file: {scalars} scalars, {} bytes: parsed in {:.1} ms, CRC-32C alone {:.1} ms ({crc:x})", file.len(), parse_s * 1e3, crc_s * 1e3);
    // The driver's write of passes of 10,000 scalars.
    let mut s = Store::open(&dir.path().join("ingest.db"))?;
    let passes = (scalars / 10_000).max(1);
    let t = Instant::now();
    for (p, chunk) in read.scalars.chunks(10_000).take(passes).enumerate() {
        let b = Batch {
            job: 1,
            project: "bench".into(),
            region: "us-central1".into(),
            display_name: "bench".into(),
            tensorboard: None,
            files: vec![FileRead { rel: "events.out.tfevents.1".into(), offset: p as u64, damage: None, scalars: chunk.to_vec() }],
        };
        apply(&mut s, &b, 1).map_err(|e| anyhow::anyhow!("{}", e.message))?;
    }
    let write_s = t.elapsed().as_secs_f64() / passes as f64;
    let parse_10k = parse_s * 10_000.0 / scalars as f64;
    let share = parse_10k + write_s;
    println!("a pass of 10,000 scalars: parse {:.1} ms, write {:.1} ms: {:.1}% of a core at 10,000 scalars a second", parse_10k * 1e3, write_s * 1e3, share * 100.0);
    println!("bench-row: records-bench | event-file parse, {scalars} scalars | {:.1} ms | CRC-32C alone {:.1} ms | {:.2}x", parse_s * 1e3, crc_s * 1e3, parse_s / crc_s.max(1e-9));
    println!("bench-row: records-bench | ingest cost at 10,000 scalars/s (parse + write) | {:.1}% of a core | target 5% | {:.2}x", share * 100.0, share / 0.05);
    Ok(())
}

/// CRC-32C over every record as the reader checks them, nothing else.
fn crc_only(file: &[u8]) -> u32 {
    let mut at = 0;
    let mut acc = 0u32;
    while at + 12 <= file.len() {
        let len = u64::from_le_bytes(file[at..at + 8].try_into().unwrap_or([0; 8])) as usize;
        acc ^= crc32c(&file[at..at + 8]);
        acc ^= crc32c(&file[at + 12..at + 12 + len]);
        at += 16 + len;
    }
    acc
}

fn crc32c(b: &[u8]) -> u32 {
    crc32c::crc32c(b)
}
