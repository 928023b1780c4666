//! Attacks on the server's files, tried against a real server (part of the tenant-escape
//! suite): the data directory, the database, run files and logs, and the CLI config are
//! the user's only, whatever the umask; a tokens file that others may read is refused.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use common::*;

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap_or_else(|e| panic!("{}: {e}", p.display())).permissions().mode() & 0o7777
}

fn token_entry(name: &str, token: &str, projects: &str) -> String {
    format!("[[tokens]]\nname = \"{name}\"\ntoken = \"{token}\"\nprojects = [{projects}]\n\n")
}

const BOB: &str = "bob-9a3c7e5d1f0b2468";

/// `trainyard serve` that is expected to refuse to start: its stderr.
fn serve_refused(args: &[&std::ffi::OsStr]) -> String {
    let data = tempfile::tempdir().expect("tempdir");
    let out = Command::new(BIN)
        .args(["serve", "--listen", &format!("127.0.0.1:{}", free_port())])
        .arg("--data-dir")
        .arg(data.path())
        .args(args)
        .env_remove("TRAINYARD_CONFIG")
        .env_remove("TRAINYARD_TOKENS")
        .output()
        .expect("run serve");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "serve started: {err}");
    err
}

/// The data directory, the database, a run directory, its spec.json (the job's env values)
/// and log are the server's user's only, whatever the umask of who started it; a data
/// directory that others could enter is tightened at start.
#[test]
fn data_files_are_private() {
    let mut s = Server::prepare("");
    let data = s.data_dir();
    std::fs::create_dir_all(&data).unwrap();
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).unwrap();
    s.spawn();
    let job = s.create("p", &sh_job("private", "echo secret-output"));
    s.wait_terminal(&name_of(&job), 60);
    assert_eq!(mode(&data), 0o700, "data directory");
    assert_eq!(mode(&data.join("trainyard.db")) & 0o077, 0, "database");
    for side in ["trainyard.db-wal", "trainyard.db-shm"] {
        if data.join(side).exists() {
            assert_eq!(mode(&data.join(side)) & 0o077, 0, "{side}");
        }
    }
    assert_eq!(mode(&data.join("runs")), 0o700, "runs/");
    let run = run_dir(&data, id_of(&job), 0, "workerpool0-0", 0);
    assert_eq!(mode(&run), 0o700, "{}", run.display());
    for f in ["spec.json", "log.jsonl", "status.json"] {
        assert_eq!(mode(&run.join(f)) & 0o077, 0, "{f} of {}", run.display());
    }
    assert!(s.logs_text(&name_of(&job)).contains("secret-output"));
}

/// `local-run` keeps its run's data private too.
#[test]
fn local_run_data_is_private() {
    let dir = tempfile::tempdir().unwrap();
    let job = dir.path().join("job.yaml");
    std::fs::write(
        &job,
        "workerPoolSpecs:\n  - machineSpec: {machineType: n1-standard-4}\n    replicaCount: 1\n    \
         containerSpec: {imageUri: python:3.11, command: [sh, -c, 'echo done']}\n",
    )
    .unwrap();
    let data = dir.path().join("data");
    let out = Command::new(BIN)
        .arg("local-run")
        .arg(&job)
        .arg("--data-dir")
        .arg(&data)
        .env("TRAINYARD_STORAGE_ROOT", dir.path().join("storage"))
        .env_remove("TRAINYARD_CONFIG")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(mode(&data), 0o700);
    assert_eq!(mode(&data.join("trainyard.db")) & 0o077, 0);
    let run = run_dir(&data, 1, 0, "workerpool0-0", 0);
    for f in ["spec.json", "log.jsonl"] {
        assert_eq!(mode(&run.join(f)) & 0o077, 0, "{f}");
    }
}

/// A tokens file that other users may read is refused at start, naming the file, its mode
/// and the fix.
#[test]
fn an_exposed_tokens_file_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.toml");
    std::fs::write(&tokens, token_entry("ci", BOB, "\"p\"")).unwrap();
    std::fs::set_permissions(&tokens, std::fs::Permissions::from_mode(0o644)).unwrap();
    let err = serve_refused(&["--tokens".as_ref(), tokens.as_os_str()]);
    let path = tokens.display().to_string();
    assert!(err.contains(&path) && err.contains("mode 0644") && err.contains(&format!("chmod 600 {path}")), "{err}");
    assert!(!err.contains(BOB), "the token was shown: {err}");
}

/// `trainyard config set` writes the CLI config (which may hold a token) with mode 0600 in
/// a 0700 directory; an existing file others could read is tightened.
#[test]
fn cli_config_is_private() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("conf/trainyard/cli.toml");
    let cli = |args: &[&str]| {
        let out = Command::new(BIN).arg("config").args(args).env("TRAINYARD_CLI_CONFIG", &config).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    };
    cli(&["set", "token", BOB]);
    assert_eq!(mode(&config), 0o600);
    assert_eq!(mode(config.parent().unwrap()), 0o700);
    assert!(std::fs::read_to_string(&config).unwrap().contains(BOB));
    // An existing file with 0644: tightened when written...
    std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o644)).unwrap();
    cli(&["set", "project", "research"]);
    assert_eq!(mode(&config), 0o600);
    let text = std::fs::read_to_string(&config).unwrap();
    assert!(text.contains(BOB) && text.contains("research"), "{text}");
    // ...and when only read.
    std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o644)).unwrap();
    cli(&["list"]);
    assert_eq!(mode(&config), 0o600);
}

