//! `[containers]` at start: which engine runs images, checked with a real `podman info`
//! (see `trainyard_backend::container`). A server never switches silently between
//! containers and host processes: with `engine = "podman"` a podman that does not work
//! stops the start; with no `engine` key the start line says which was chosen and why.

use std::path::{Path, PathBuf};

use trainyard_backend::container::{probe, Engine, EngineInfo, Mount};

use crate::config::{Config, EngineSetting};

/// The engine every replica with an image runs in.
#[derive(Clone, Debug)]
pub struct ContainerEngine {
    pub engine: Engine,
    /// `[containers] mounts`, for every container.
    pub mounts: Vec<Mount>,
    /// The containers' working directory, when not the image's.
    pub workdir: Option<String>,
    pub info: EngineInfo,
}

/// Chooses the engine when the config has no `[containers] engine` key.
pub const ENGINE_VAR: &str = "TRAINYARD_CONTAINER_ENGINE";

/// Environment variables of the server's passed on to the engine's client.
const ENGINE_ENV: &[&str] =
    &["PATH", "HOME", "XDG_RUNTIME_DIR", "XDG_CONFIG_HOME", "TMPDIR", "CONTAINERS_CONF", "CONTAINERS_STORAGE_CONF", "CONTAINERS_REGISTRIES_CONF"];

/// Resolves `[containers]`: `Ok(None)` runs replicas as host processes. The message of
/// `Err` names the key and what failed.
pub fn resolve(cfg: &Config) -> Result<Option<ContainerEngine>, String> {
    let mut c = cfg.containers.clone();
    let mut source = "[containers] engine";
    // Without an `engine` key, TRAINYARD_CONTAINER_ENGINE may choose (as the test suite
    // of host processes does on a machine with podman).
    if c.engine == EngineSetting::Auto {
        if let Ok(v) = std::env::var(ENGINE_VAR) {
            c.engine = match v.as_str() {
                "none" => EngineSetting::None,
                "podman" => EngineSetting::Podman,
                "" | "auto" => EngineSetting::Auto,
                other => return Err(format!("{ENGINE_VAR}={other:?}: must be \"podman\", \"none\" or \"auto\"")),
            };
            source = ENGINE_VAR;
        }
    }
    if c.engine == EngineSetting::None {
        tracing::info!("containers: none ({source} = \"none\"): imageUri is recorded, replicas run as host processes");
        return Ok(None);
    }
    // The configured mounts (local-run's job directory, its working directory, is the
    // user's own).
    for m in c.mounts.iter().filter(|m| c.workdir.as_deref() != Some(m.target.as_str())) {
        if m.source.starts_with(&cfg.data_dir) || cfg.data_dir.starts_with(&m.source) || cfg.storage_root.starts_with(&m.source) {
            return Err(format!(
                "[containers] mounts: {} must not be, hold or be inside the data directory or the storage root",
                m.source.display()
            ));
        }
    }
    let mut env: Vec<(String, String)> =
        ENGINE_ENV.iter().filter_map(|k| std::env::var(k).ok().map(|v| (k.to_string(), v))).collect();
    if !env.iter().any(|(k, _)| k == "PATH") {
        env.push(("PATH".into(), "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into()));
    }
    if let Some(conf) = &c.containers_conf {
        env.retain(|(k, _)| k != "CONTAINERS_CONF");
        env.push(("CONTAINERS_CONF".into(), absolute(conf).display().to_string()));
    }
    let mut engine = Engine {
        program: c.program.clone().unwrap_or_else(|| PathBuf::from("podman")),
        global_args: c.runtime.iter().flat_map(|r| ["--runtime".to_string(), r.clone()]).collect(),
        env,
        pull: c.pull,
        pull_timeout_secs: c.pull_timeout_secs,
        offline_pull_timeout_secs: c.offline_pull_timeout_secs,
    };
    let mut info = match probe(&engine) {
        Ok(info) => info,
        Err(e) if c.engine == EngineSetting::Podman => {
            return Err(format!("{source} = \"podman\", but `{} info` failed: {e}", engine.program.display()))
        }
        Err(e) => {
            tracing::warn!(
                "containers: none (no working podman: `{} info`: {e}); replicas run as host processes and imageUri is not run; \
                 set [containers] engine = \"none\" to say so, or install podman",
                engine.program.display()
            );
            return Ok(None);
        }
    };
    // crun cannot run containers with cgroup v1 controllers beside a v2 tree (hybrid
    // mode); runc can. Chosen here when nothing was configured, and said so.
    if c.runtime.is_none() && info.runtime == "crun" && info.cgroups == "v1" && on_path("runc", &engine.env) {
        engine.global_args = vec!["--runtime".into(), "runc".into()];
        info.runtime = "runc".into();
        tracing::info!("containers: cgroup v1 host: runc instead of crun (set [containers] runtime to choose)");
    }
    tracing::info!(
        "containers: podman {} (runtime {}, cgroups {}), pull = \"{}\"{}: every replica with an image runs in it",
        info.version,
        info.runtime,
        info.cgroups,
        engine.pull.as_str(),
        c.containers_conf.as_ref().map(|p| format!(", containers.conf {}", p.display())).unwrap_or_default()
    );
    Ok(Some(ContainerEngine { engine, mounts: c.mounts.clone(), workdir: c.workdir.clone(), info }))
}

fn absolute(p: &Path) -> PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}

fn on_path(program: &str, env: &[(String, String)]) -> bool {
    let path = env.iter().find(|(k, _)| k == "PATH").map(|(_, v)| v.as_str()).unwrap_or("");
    std::env::split_paths(path).any(|d| d.join(program).is_file())
}
