//! A per-job Python virtual environment for `pythonPackageSpec` jobs: the job's
//! `packageUris` installed into a venv that sees the host's site packages.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

/// One build at a time: replicas of one job share the venv.
static BUILD: Mutex<()> = Mutex::new(());

const READY: &str = ".trainyard-ready";

fn run(cmd: &mut Command, what: &str) -> Result<(), String> {
    let out = cmd.output().map_err(|e| format!("{what}: cannot run {:?}: {e}", cmd.get_program()))?;
    if out.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    let tail: Vec<&str> = stderr.lines().rev().take(15).collect::<Vec<_>>().into_iter().rev().collect();
    Err(format!("{what} failed ({}):\n{}", out.status, tail.join("\n")))
}

/// Make sure the venv at `dir` exists with `packages` installed; returns its python.
pub fn ensure(dir: &Path, packages: &[PathBuf]) -> Result<PathBuf, String> {
    let _guard = BUILD.lock().unwrap_or_else(|p| p.into_inner());
    let python = dir.join("bin").join("python3");
    if dir.join(READY).exists() {
        return Ok(python);
    }
    for p in packages {
        if !p.exists() {
            return Err(format!("package {} does not exist", p.display()));
        }
    }
    run(
        Command::new("python3").args(["-m", "venv", "--system-site-packages"]).arg(dir),
        "creating the job's Python environment",
    )?;
    if !packages.is_empty() {
        run(
            Command::new(&python)
                .args(["-m", "pip", "install", "--no-input", "--disable-pip-version-check", "--quiet"])
                .args(packages),
            "installing packageUris",
        )?;
    }
    std::fs::write(dir.join(READY), b"").map_err(|e| format!("{}: {e}", dir.join(READY).display()))?;
    Ok(python)
}
