//! A per-job Python virtual environment for `pythonPackageSpec` jobs: the job's
//! `packageUris` installed into a venv that sees the host's site packages.
//!
//! The build runs a job's code (a package's `setup.py`, its build backend), so it runs in
//! child processes with a minimal environment: `PATH` (and `LANG`/`LC_ALL` when the server
//! has them), `HOME` set to the job's venv directory, which is also their working
//! directory. Nothing else of the server's environment (`TRAINYARD_TOKENS`, `TRAINYARD_*`,
//! credentials) reaches them. They still run as the server's user, outside the replica's
//! cgroup: running them as the replica's user is part of the replica identity work.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use nix::sys::stat::SFlag;

use crate::paths::{BeneathError, Confined};

/// One build at a time per venv (replicas of one job share it); builds of different jobs
/// run side by side, so that one tenant's slow build never delays another's job.
static BUILDS: Mutex<Vec<(PathBuf, std::sync::Weak<Mutex<()>>)>> = Mutex::new(Vec::new());

/// The lock of the venv at `dir`.
fn build_lock(dir: &Path) -> std::sync::Arc<Mutex<()>> {
    let mut all = BUILDS.lock().unwrap_or_else(|p| p.into_inner());
    all.retain(|(_, w)| w.strong_count() > 0);
    if let Some(lock) = all.iter().find(|(d, _)| d == dir).and_then(|(_, w)| w.upgrade()) {
        return lock;
    }
    let lock = std::sync::Arc::new(Mutex::new(()));
    all.push((dir.to_path_buf(), std::sync::Arc::downgrade(&lock)));
    lock
}

const READY: &str = ".trainyard-ready";

/// Variables of the server's environment a build sees (besides `HOME`).
const BUILD_ENV: &[&str] = &["PATH", "LANG", "LC_ALL"];

/// A command of the build: minimal environment, in the venv directory.
fn build_command(program: impl AsRef<std::ffi::OsStr>, dir: &Path) -> Command {
    let mut cmd = Command::new(program);
    cmd.env_clear();
    for k in BUILD_ENV {
        if let Some(v) = std::env::var_os(k) {
            cmd.env(k, v);
        }
    }
    cmd.env("HOME", dir)
        .env("PIP_NO_INPUT", "1")
        .env("PIP_DISABLE_PIP_VERSION_CHECK", "1")
        .env("PYTHONNOUSERSITE", "1")
        .current_dir(dir)
        .stdin(std::process::Stdio::null());
    cmd
}

/// Runs a build command until `deadline` (`trainyard_backend::bounded`: in a process group
/// of its own, killed with whatever `setup.py` started when it ends or the deadline
/// passes); past the deadline the build fails, naming the limit.
fn run(cmd: &mut Command, what: &str, deadline: std::time::Instant, limit: std::time::Duration) -> Result<(), String> {
    let ran = trainyard_backend::bounded::run_until(cmd, deadline)
        .map_err(|e| format!("{what}: cannot run {:?}: {e}", cmd.get_program()))?;
    let Some(status) = ran.status else {
        return Err(format!(
            "{what} did not finish within {}s ([replicas] venv_build_timeout_secs); it was killed",
            limit.as_secs()
        ));
    };
    if status.success() {
        return Ok(());
    }
    let tail: Vec<&str> = ran.stderr.lines().rev().take(15).collect::<Vec<_>>().into_iter().rev().collect();
    Err(format!("{what} failed ({status}):\n{}", tail.join("\n")))
}

/// Whether the venv's ready marker is there: a regular file, looked at without following
/// a link or opening it (the directory is the project's user's: a FIFO or a link planted
/// there is an error naming it, never something the server blocks on).
fn ready(dir: &Path) -> Result<bool, String> {
    match std::fs::symlink_metadata(dir.join(READY)) {
        Ok(m) if m.file_type().is_file() => Ok(true),
        Ok(_) => Err(format!("{} is not a regular file (a link, FIFO, socket or device was put there)", dir.join(READY).display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(format!("{}: {e}", dir.join(READY).display())),
    }
}

/// A package path as the job named it: a regular file or a directory below its root,
/// reached without a symbolic link.
fn check_package(p: &Confined, i: usize) -> Result<PathBuf, String> {
    let shown = format!("pythonPackageSpec.packageUris[{i}]");
    match p.stat() {
        Ok(st) => {
            let kind = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT;
            if kind == SFlag::S_IFREG || kind == SFlag::S_IFDIR {
                Ok(p.path())
            } else {
                Err(format!("{shown}: {} is not a file or a directory", p.path().display()))
            }
        }
        Err(BeneathError::Symlink { .. }) => Err(format!(
            "{shown}: {} is or passes through a symbolic link, which the server does not follow",
            p.path().display()
        )),
        Err(BeneathError::Io(e)) => Err(format!("{shown}: {}: {e}", p.path().display())),
    }
}

/// A venv built before its project had a user of its own (by the server's user): the
/// project's user could not run it.
fn built_by_another(dir: &Path, uid: u32) -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(dir.join("bin")).is_ok_and(|m| m.uid() != uid)
}

/// Removes what `dir` holds (links as links, never followed), keeping `dir`.
fn empty_dir(dir: &Path) -> Result<(), String> {
    let what = |p: &Path, e: std::io::Error| format!("removing the job's old Python environment: {}: {e}", p.display());
    for entry in std::fs::read_dir(dir).map_err(|e| what(dir, e))? {
        let entry = entry.map_err(|e| what(dir, e))?;
        let path = entry.path();
        let is_dir = entry.file_type().map_err(|e| what(&path, e))?.is_dir();
        if is_dir {
            trainyard_backend::tree::remove_tree(&path).map_err(|e| format!("removing the job's old Python environment: {e}"))?;
        } else {
            std::fs::remove_file(&path).map_err(|e| what(&path, e))?;
        }
    }
    Ok(())
}

/// Make sure the venv at `dir` exists with `packages` installed; returns its python.
/// With `run_as`, the build's commands run as that user (the project's, see `identity`),
/// in `dir`, which is that user's.
pub fn ensure(
    dir: &Path,
    packages: &[Confined],
    run_as: Option<trainyard_backend::RunAs>,
    limit: std::time::Duration,
) -> Result<PathBuf, String> {
    use std::os::unix::process::CommandExt;
    let as_user = |mut cmd: Command| {
        if let Some(id) = run_as {
            // std drops the supplementary groups too when it switches a root parent's uid.
            cmd.uid(id.uid).gid(id.gid);
        }
        cmd
    };
    let lock = build_lock(dir);
    let _guard = lock.lock().unwrap_or_else(|p| p.into_inner());
    let deadline = std::time::Instant::now() + limit;
    let python = dir.join("bin").join("python3");
    if ready(dir)? {
        match run_as {
            Some(id) if built_by_another(dir, id.uid) => empty_dir(dir)?,
            _ => return Ok(python),
        }
    }
    let paths = packages.iter().enumerate().map(|(i, p)| check_package(p, i)).collect::<Result<Vec<_>, _>>()?;
    std::fs::create_dir_all(dir).map_err(|e| format!("creating the job's Python environment: {}: {e}", dir.display()))?;
    run(
        as_user(build_command("python3", dir)).args(["-m", "venv", "--system-site-packages"]).arg(dir),
        "creating the job's Python environment",
        deadline,
        limit,
    )?;
    // As the project's user, pip builds from copies of its own (a build writes into the
    // package's directory, which that user may only read).
    let paths = match run_as {
        Some(_) => {
            let src = dir.join("src");
            let mut copies = Vec::with_capacity(paths.len());
            for (i, p) in paths.iter().enumerate() {
                // `src/<i>/<name>`: a wheel or an archive keeps the name pip reads.
                let into = src.join(i.to_string());
                let name = p.file_name().ok_or_else(|| format!("packageUris[{i}]: {} has no file name", p.display()))?;
                run(as_user(build_command("rm", dir)).arg("-rf").arg(&into), "copying packageUris", deadline, limit)?;
                run(as_user(build_command("mkdir", dir)).arg("-p").arg(&into), "copying packageUris", deadline, limit)?;
                let mut cp = as_user(build_command("cp", dir));
                run(cp.arg("-R").arg("--no-dereference").arg(p).arg(&into), "copying packageUris", deadline, limit)?;
                copies.push(into.join(name));
            }
            copies
        }
        None => paths,
    };
    if !paths.is_empty() {
        run(
            as_user(build_command(&python, dir))
                .args(["-m", "pip", "install", "--no-input", "--disable-pip-version-check", "--quiet"])
                .args(&paths),
            "installing packageUris",
            deadline,
            limit,
        )?;
    }
    // The directory may be the project's user's: never through a link it planted.
    {
        use std::os::unix::fs::OpenOptionsExt;
        // What the build left there is looked at first; O_NONBLOCK: a FIFO planted after
        // that look fails the open (no reader) instead of blocking.
        ready(dir)?;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
            .open(dir.join(READY))
            .map_err(|e| format!("{}: {e}", dir.join(READY).display()))?;
        if !f.metadata().is_ok_and(|m| m.file_type().is_file()) {
            return Err(format!("{} is not a regular file (a FIFO, socket or device was put there)", dir.join(READY).display()));
        }
    }
    Ok(python)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The build's commands see PATH and HOME (the venv directory), run there, and see
    /// nothing else of the server's environment.
    #[test]
    fn build_commands_get_a_minimal_environment() {
        let t = tempfile::tempdir().unwrap();
        let out = build_command("sh", t.path()).args(["-c", "env; pwd"]).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains(&format!("HOME={}", t.path().display())), "{text}");
        assert!(text.lines().any(|l| l.starts_with("PATH=")), "{text}");
        assert!(text.lines().any(|l| l == t.path().display().to_string()), "the venv directory is the working directory: {text}");
        let names: Vec<&str> = text.lines().filter_map(|l| l.split_once('=').map(|(k, _)| k)).collect();
        for n in names {
            assert!(
                ["PATH", "HOME", "LANG", "LC_ALL", "PIP_NO_INPUT", "PIP_DISABLE_PIP_VERSION_CHECK", "PYTHONNOUSERSITE", "PWD", "SHLVL", "_"]
                    .contains(&n),
                "{n} leaked into the build: {text}"
            );
        }
    }

    #[test]
    fn packages_through_links_or_not_files_are_refused() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("storage");
        std::fs::create_dir_all(root.join("p/b")).unwrap();
        std::fs::write(root.join("p/b/pkg.tar.gz"), b"x").unwrap();
        std::os::unix::fs::symlink("/etc/hostname", root.join("p/b/evil.tar.gz")).unwrap();
        nix::unistd::mkfifo(&root.join("p/b/fifo"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        let c = |rel: &str| Confined::new(&root, rel).unwrap();
        assert_eq!(check_package(&c("p/b/pkg.tar.gz"), 0).unwrap(), root.join("p/b/pkg.tar.gz"));
        assert!(check_package(&c("p/b/evil.tar.gz"), 1).unwrap_err().contains("symbolic link"));
        assert!(check_package(&c("p/b/fifo"), 2).unwrap_err().contains("not a file or a directory"));
    }

    /// A venv built before its project had a user (by root) is emptied and built again
    /// by that user; one of that user's is kept.
    #[test]
    fn a_venv_of_another_user_is_built_again() {
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir(t.path().join("bin")).unwrap();
        std::fs::write(t.path().join("old"), "x").unwrap();
        std::os::unix::fs::symlink("/etc", t.path().join("link")).unwrap();
        assert!(built_by_another(t.path(), 200_400));
        assert!(!built_by_another(t.path(), 0));
        empty_dir(t.path()).unwrap();
        assert_eq!(std::fs::read_dir(t.path()).unwrap().count(), 0);
        assert!(std::path::Path::new("/etc/passwd").exists());
    }
}
