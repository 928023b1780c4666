//! Bearer tokens over HTTP: 401 without or with an unknown token, 403 for a project the
//! token may not use or a write with a read-only token, 404 for another project's job.

mod common;

use std::process::Command;

use common::*;
use serde_json::Value;

const RW: &str = "rw-token-0123456789abcdef";
const RO: &str = "ro-token-0123456789abcdef";
const HOST: &str = "host-dirs-token-5f2a9c7e1b";

fn server() -> Server {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.toml");
    std::fs::write(
        &tokens,
        format!(
            "[[tokens]]\ntoken = \"{RW}\"\nprojects = [\"alpha\", \"beta\"]\nname = \"team\"\n\n\
             [[tokens]]\ntoken = \"{RO}\"\nprojects = [\"alpha\"]\naccess = \"read-only\"\n\n\
             [[tokens]]\ntoken = \"{HOST}\"\nprojects = [\"alpha\"]\nhost_directories = true\n"
        ),
    )
    .unwrap();
    // The server refuses a tokens file that other users may read.
    std::fs::set_permissions(&tokens, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let s = Server::start(&format!("tokens_file = \"{}\"\n", tokens.display()));
    std::mem::forget(dir);
    s
}

fn call(s: &Server, method: &str, url: &str, token: Option<&str>, body: Option<&str>) -> (u16, Value) {
    let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).max_idle_connections(0).build().into();
    let mut req = ureq::http::Request::builder().method(method).uri(url);
    if let Some(t) = token {
        req = req.header("Authorization", format!("Bearer {t}"));
    }
    req = req.header("Content-Type", "application/json");
    let mut resp = agent.run(req.body(body.unwrap_or("").to_string()).unwrap()).unwrap();
    let status = resp.status().as_u16();
    let text = resp.body_mut().read_to_string().unwrap_or_default();
    let _ = s;
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

#[test]
fn tokens_decide_who_may_do_what() {
    let s = server();
    let job = sh_job("auth", "exit 0").to_string();
    let alpha = s.jobs_url("alpha");
    // No token, unknown token: 401.
    let (st, b) = call(&s, "GET", &alpha, None, None);
    assert_eq!((st, b["error"]["status"].as_str()), (401, Some("UNAUTHENTICATED")), "{b}");
    let (st, _) = call(&s, "GET", &alpha, Some("not-a-known-token-at-all"), None);
    assert_eq!(st, 401);
    // A project the token may not use: 403, and nothing stored.
    let (st, b) = call(&s, "POST", &s.jobs_url("gamma"), Some(RW), Some(&job));
    assert_eq!((st, b["error"]["status"].as_str()), (403, Some("PERMISSION_DENIED")), "{b}");
    // Read-write creates; read-only reads but may not write.
    let (st, created) = call(&s, "POST", &alpha, Some(RW), Some(&job));
    assert_eq!(st, 200, "{created}");
    let name = name_of(&created);
    let (st, _) = call(&s, "GET", &s.url(&format!("/v1/{name}")), Some(RO), None);
    assert_eq!(st, 200);
    let (st, b) = call(&s, "POST", &alpha, Some(RO), Some(&job));
    assert_eq!(st, 403, "{b}");
    let (st, _) = call(&s, "POST", &s.url(&format!("/v1/{name}:cancel")), Some(RO), Some("{}"));
    assert_eq!(st, 403);
    // The job seen from another project the token may use: 404.
    let (st, b) = call(&s, "GET", &format!("{}/{}", s.jobs_url("beta"), id_of(&created)), Some(RW), None);
    assert_eq!((st, b["error"]["status"].as_str()), (404, Some("NOT_FOUND")), "{b}");
    // Health needs no token.
    let (st, _) = call(&s, "GET", &s.url("/healthz"), None, None);
    assert_eq!(st, 200);
    // The CLI passes TRAINYARD_TOKEN.
    let out = Command::new(BIN)
        .args(["custom-jobs", "list", "--format=json"])
        .env("TRAINYARD_SERVER", s.url(""))
        .env("TRAINYARD_PROJECT", "alpha")
        .env("TRAINYARD_TOKEN", RO)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let listed: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 1);
}

/// Without a tokens file the server refuses to listen on anything but loopback; a broken
/// tokens file is refused at start, naming the file and the line.
#[test]
fn open_only_on_loopback_and_broken_tokens_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .args(["serve", "--listen", &format!("0.0.0.0:{}", free_port())])
        .arg("--data-dir")
        .arg(dir.path())
        .env_remove("TRAINYARD_TOKENS")
        .env_remove("TRAINYARD_CONFIG")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("refusing to listen on 0.0.0.0"), "{err}");

    let bad = dir.path().join("tokens.toml");
    std::fs::write(&bad, "[[tokens]]\ntoken = \"k7Qz-2mWx-9fLp-4rTb\"\nprojets = [\"p\"]\n").unwrap();
    std::fs::set_permissions(&bad, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let out = Command::new(BIN)
        .args(["serve", "--listen", &format!("127.0.0.1:{}", free_port())])
        .arg("--data-dir")
        .arg(dir.path())
        .arg("--tokens")
        .arg(&bad)
        .env_remove("TRAINYARD_CONFIG")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("tokens.toml") && err.contains("line 3") && err.contains("projets"), "{err}");
}

/// `trainyardHostDirectories` (what `custom-jobs create --config` sends to a server on its
/// host) need a token the tokens file allows (`host_directories = true`): another token
/// gets 403 naming the key, and nothing is created; the allowed one creates the job; a
/// directory inside the data directory, or one that does not exist, is 400 naming the
/// field.
#[test]
fn host_directories_need_a_token_allowed_to_mount_them() {
    let s = server();
    let dir = tempfile::tempdir().unwrap();
    let url = s.jobs_url("alpha");
    let mut job = sh_job("host-dirs", "true");
    job["trainyardHostDirectories"] = serde_json::json!([dir.path().display().to_string()]);
    let (status, body) = call(&s, "POST", &url, Some(RW), Some(&job.to_string()));
    assert_eq!(status, 403, "{body}");
    assert!(body["error"]["message"].as_str().unwrap_or("").contains("host_directories = true"), "{body}");
    let (_, list) = call(&s, "GET", &url, Some(RW), None);
    assert!(list.get("customJobs").is_none(), "nothing created: {list}");
    let (status, body) = call(&s, "POST", &url, Some(HOST), Some(&job.to_string()));
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["trainyardHostDirectories"][0], dir.path().display().to_string());
    // A directory inside the data directory that exists (the job's run directories are
    // made by a launch thread, maybe not yet).
    std::fs::create_dir_all(s.data_dir().join("runs")).unwrap();
    for (bad, why) in [
        (s.data_dir().join("runs").display().to_string(), "data directory"),
        (dir.path().join("missing").display().to_string(), "cannot be used"),
        ("relative/dir".to_string(), "absolute path"),
    ] {
        job["trainyardHostDirectories"] = serde_json::json!([bad]);
        let (status, body) = call(&s, "POST", &url, Some(HOST), Some(&job.to_string()));
        assert_eq!(status, 400, "{bad}: {body}");
        let message = body["error"]["message"].as_str().unwrap_or("");
        assert!(message.contains("trainyardHostDirectories[0]") && message.contains(why), "{bad}: {message}");
    }
}
