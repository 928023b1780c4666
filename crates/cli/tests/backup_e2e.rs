//! Online backup and restore (`trainyard admin backup|restore`, `POST /v1/admin/backup`):
//! a copy taken while the server serves has every job; a server started on the data
//! directory restored from it has them too; bad targets and bad backups are refused,
//! naming what is wrong, and change nothing.

mod common;

use std::process::{Command, Output, Stdio};

use common::*;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_trainyard");

fn trainyard(s: &Server, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env("TRAINYARD_SERVER", s.url(""))
        .env("TRAINYARD_CLI_CONFIG", s.dir.path().join("no-cli.toml"))
        .env_remove("TRAINYARD_TOKEN")
        .stdin(Stdio::null())
        .output()
        .expect("run trainyard")
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

fn names(s: &Server, project: &str) -> Vec<(String, String)> {
    let (status, body) = s.call("GET", &format!("{}?pageSize=100", s.jobs_url(project)), None);
    assert_eq!(status, 200, "{body}");
    let mut v: Vec<(String, String)> = body["customJobs"]
        .as_array()
        .map(|a| a.iter().map(|j| (j["name"].as_str().unwrap_or("").to_string(), j["state"].as_str().unwrap_or("").to_string())).collect())
        .unwrap_or_default();
    v.sort();
    v
}

#[test]
fn a_backup_taken_while_serving_restores_every_job() {
    let mut s = Server::start("");
    for i in 0..3 {
        let j = s.create("p", &sh_job(&format!("done-{i}"), "echo done"));
        s.wait_terminal(&name_of(&j), 60);
    }
    let long = name_of(&s.create("p", &sh_job("long", "sleep 600")));
    s.wait_for(&long, 60, |j| j["state"] == "JOB_STATE_RUNNING");
    let before = names(&s, "p");
    assert_eq!(before.len(), 4, "{before:?}");

    let backup = s.dir.path().join("backup.db");
    let o = trainyard(&s, &["admin", "backup", "--to", backup.to_str().unwrap(), "--format", "json"]);
    assert!(o.status.success(), "{}", text(&o));
    let v: Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(v["jobs"], 4, "{v}");
    assert!(v["bytes"].as_u64().unwrap_or(0) > 0, "{v}");
    // The copy is private, as the database is.
    assert_private_tree(&backup);

    // Never over an existing file: refused, naming it, the file unchanged.
    let kept = std::fs::read(&backup).unwrap();
    let o = trainyard(&s, &["admin", "backup", "--to", backup.to_str().unwrap()]);
    assert!(!o.status.success() && text(&o).contains("exists already") && text(&o).contains("backup.db"), "{}", text(&o));
    assert_eq!(std::fs::read(&backup).unwrap(), kept);
    // A relative path is this machine's: taken from the CLI's directory when the server is
    // here, refused (before anything is sent) when it is on another host.
    let o = Command::new(BIN)
        .args(["admin", "backup", "--to", "rel.db"])
        .current_dir(s.dir.path())
        .env("TRAINYARD_SERVER", s.url(""))
        .env("TRAINYARD_CLI_CONFIG", s.dir.path().join("no-cli.toml"))
        .env_remove("TRAINYARD_TOKEN")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert!(s.dir.path().join("rel.db").is_file(), "{}", text(&o));
    let o = trainyard(&s, &["admin", "backup", "--to", "elsewhere.db", "--server", "http://192.0.2.1:8080"]);
    assert!(!o.status.success() && text(&o).contains("is on another host: give an absolute path on that host"), "{}", text(&o));
    // The API says what is wrong in its error format.
    let (status, body) = s.call("POST", &s.url("/v1/admin/backup"), Some(r#"{"to": "relative.db"}"#));
    assert_eq!((status, body["error"]["status"].as_str()), (400, Some("INVALID_ARGUMENT")), "{body}");
    let (status, body) = s.call("POST", &s.url("/v1/admin/backup"), Some(r#"{"to": "/nonexistent-dir/x.db"}"#));
    assert_eq!(status, 400, "{body}");
    assert!(body["error"]["message"].as_str().unwrap_or("").contains("/nonexistent-dir"), "{body}");
    let (status, body) = s.call("POST", &s.url("/v1/admin/backup"), Some(r#"{"path": "/tmp/x.db"}"#));
    assert_eq!(status, 400, "{body}");

    // Restore into a new data directory; a server started there has every job.
    let restored = s.dir.path().join("restored");
    let o = trainyard(&s, &["admin", "restore", "--from", backup.to_str().unwrap(), "--data-dir", restored.to_str().unwrap(), "--format", "json"]);
    assert!(o.status.success(), "{}", text(&o));
    // The restored database is its owner's alone, whatever the CLI's umask: the data
    // directory is passable by the replicas' users.
    assert_private_tree(&restored);
    // Not into a directory that has something in it; not from a file that is no backup.
    let o = trainyard(&s, &["admin", "restore", "--from", backup.to_str().unwrap(), "--data-dir", restored.to_str().unwrap()]);
    assert!(!o.status.success() && text(&o).contains("not empty"), "{}", text(&o));
    let junk = s.dir.path().join("junk.db");
    std::fs::write(&junk, b"not a database at all, not even close to one").unwrap();
    let elsewhere = s.dir.path().join("elsewhere");
    let o = trainyard(&s, &["admin", "restore", "--from", junk.to_str().unwrap(), "--data-dir", elsewhere.to_str().unwrap()]);
    assert!(!o.status.success() && text(&o).contains("not a Trainyard backup") && text(&o).contains("junk.db"), "{}", text(&o));
    assert!(!elsewhere.exists());

    // The original's replica ends (the backup still says RUNNING).
    let (status, _) = s.call("POST", &s.url(&format!("/v1/{long}:cancel")), Some("{}"));
    assert_eq!(status, 200);
    s.wait_terminal(&long, 60);
    s.kill9();
    let mut r = Server::prepare("").with_data_dir(restored);
    r.spawn();
    let after = names(&r, "p");
    let ended = |v: &[(String, String)]| v.iter().filter(|(n, _)| *n != long).cloned().collect::<Vec<_>>();
    assert_eq!(ended(&after), ended(&before), "the ended jobs, as they were");
    // The job that was running goes on by the rules (its replica belongs to the other data
    // directory: lost, started again), never silently gone.
    assert!(after.iter().any(|(n, _)| *n == long), "{after:?}");
    let (status, _) = r.call("POST", &r.url(&format!("/v1/{long}:cancel")), Some("{}"));
    assert_eq!(status, 200);
    r.wait_terminal(&long, 60);
    // Both data directories, after a backup, a restore and a server's work on each: every
    // file private.
    assert_private_tree(&r.data_dir());
    assert_private_tree(&s.data_dir());
}
