//! A per-job Python virtual environment for host replicas of `pythonPackageSpec` jobs
//! (and commands that run pip): the job's `packageUris` installed into a venv that sees the
//! host's site packages.
//!
//! The build runs a job's code (a package's `setup.py`, its build backend), so it is the
//! replica's first step, never the server's: the replica's program is a small Python
//! program ([`BUILD_PROGRAM`]) that builds the venv `venvs/<job>` (once per job; the job's
//! replicas take turns with a lock in it), then execs the job's program. The build thus
//! runs as the replica runs: as its user, in its cgroup (the machine type's memory,
//! `pids.max`), its mount namespace (hidden pids, its own `/dev/shm`), its network
//! namespace with `network = "job"`, with its environment, and it is stopped with it (a
//! cancel kills it and all it started). `[replicas] venv_build_timeout_secs` bounds it:
//! past that the build is killed and the replica exits 1 with a last line naming the
//! packages and the limit. The server opens nothing in the venv directory, which is the
//! project's user's.

use std::path::{Path, PathBuf};

use nix::sys::stat::SFlag;

use crate::paths::{BeneathError, Confined};

/// The program a host replica of a package job starts with (see the module's doc).
pub const BUILD_PROGRAM: &str = include_str!("venv_build.py");

/// What the replica runs after the build.
pub enum Then {
    /// `python -m MODULE ARGS` in the venv.
    Module(Vec<String>),
    /// A command with the venv first on `PATH` (a command that runs pip installs into the
    /// venv, never into the host's Python).
    OnPath(Vec<String>),
}

/// Where the build finds packages.
#[derive(Clone, Debug, Default)]
pub struct PackageIndex<'a> {
    /// `[replicas] package_index` (None: pip's own configuration).
    pub url: Option<&'a str>,
    /// The socket of the server's proxy to it ([`crate::index_proxy`]), for a build in a
    /// job's network namespace.
    pub proxy: Option<PathBuf>,
}

/// The replica's argv: [`BUILD_PROGRAM`] with the venv, the limit, the package index
/// (`[replicas] package_index`) and its proxy, the packages, then the program.
pub fn replica_argv(venv: &Path, limit: std::time::Duration, index: &PackageIndex, packages: &[PathBuf], then: Then) -> Vec<String> {
    let mut argv = vec!["python3".to_string(), "-c".into(), BUILD_PROGRAM.into()];
    argv.push(venv.display().to_string());
    argv.push(limit.as_secs().to_string());
    argv.push(index.url.unwrap_or("").to_string());
    argv.push(index.proxy.as_ref().map(|p| p.display().to_string()).unwrap_or_default());
    argv.push(packages.len().to_string());
    argv.extend(packages.iter().map(|p| p.display().to_string()));
    let (mode, program) = match then {
        Then::Module(p) => ("module", p),
        Then::OnPath(p) => ("path", p),
    };
    argv.push(mode.into());
    argv.extend(program);
    argv
}

/// A package path as the job named it: a regular file or a directory below its root,
/// reached without a symbolic link.
pub fn check_package(p: &Confined, i: usize) -> Result<PathBuf, String> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
