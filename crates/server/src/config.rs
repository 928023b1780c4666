//! The server's configuration: a TOML file, or the built-in default for a laptop or one
//! workstation when there is no file.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use trainyard_core::catalog::GIB;
use trainyard_core::schedule::{Fleet, Node, Quotas};
use trainyard_core::Settings;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("config file {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("config file {path}: {key}: {message}")]
    Invalid { path: PathBuf, key: String, message: String },
}

/// The config file as written. Every table refuses keys it does not know.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    listen: Option<String>,
    data_dir: Option<PathBuf>,
    storage_root: Option<PathBuf>,
    region: Option<String>,
    base_port: Option<u16>,
    tokens_file: Option<PathBuf>,
    #[serde(default)]
    lifecycle: Option<Settings>,
    node: Option<NodeFile>,
    #[serde(default)]
    quotas: QuotasFile,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NodeFile {
    name: Option<String>,
    cpus: Option<u32>,
    memory_gb: Option<f64>,
    #[serde(default)]
    accelerators: BTreeMap<String, u32>,
    overcommit: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct QuotasFile {
    #[serde(default)]
    default: BTreeMap<String, u64>,
    #[serde(default)]
    projects: BTreeMap<String, BTreeMap<String, u64>>,
}

/// The resolved configuration.
#[derive(Clone, Debug)]
pub struct Config {
    pub listen: String,
    pub data_dir: PathBuf,
    /// `gs://bucket/x` maps to `<storage_root>/bucket/x`.
    pub storage_root: PathBuf,
    pub region: String,
    /// First port of the replica addresses (L8).
    pub base_port: u16,
    /// Bearer tokens and the projects they may use; None: open, loopback only.
    pub tokens_file: Option<PathBuf>,
    pub settings: Settings,
    pub fleet: Fleet,
    pub quotas: Quotas,
    /// Where this configuration came from, for the start-up message.
    pub source: String,
}

fn host_cpus() -> u32 {
    std::thread::available_parallelism().map(|n| n.get() as u32).unwrap_or(1)
}

fn host_memory() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map(|kb| kb * 1024)
        .unwrap_or(8 * GIB)
}

pub fn default_data_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("TRAINYARD_DATA_DIR") {
        return PathBuf::from(d);
    }
    match std::env::var_os("HOME") {
        Some(h) => PathBuf::from(h).join(".local/share/trainyard"),
        None => PathBuf::from("trainyard-data"),
    }
}

impl Config {
    /// The built-in default: this host as one node that overcommits (CPU time-shared,
    /// memory limits as caps, missing accelerators tolerated with a warning), no quota
    /// limits, region us-central1.
    pub fn builtin(data_dir: Option<PathBuf>) -> Config {
        Config::from_file(File::default(), data_dir, "built-in defaults".into())
    }

    /// Read a config file; errors name the file, the line and the key.
    pub fn load(path: &Path, data_dir: Option<PathBuf>) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.to_owned(), source })?;
        let file: File = toml::from_str(&text).map_err(|e| ConfigError::Parse {
            path: path.to_owned(),
            message: describe_toml_error(&text, &e),
        })?;
        let invalid = |key: &str, message: String| ConfigError::Invalid { path: path.to_owned(), key: key.into(), message };
        if let Some(n) = &file.node {
            if n.cpus == Some(0) {
                return Err(invalid("node.cpus", "must be at least 1".into()));
            }
            if let Some(m) = n.memory_gb {
                if m.is_nan() || m <= 0.0 {
                    return Err(invalid("node.memory_gb", format!("must be positive, not {m}")));
                }
            }
            for (a, c) in &n.accelerators {
                if *c == 0 {
                    return Err(invalid(&format!("node.accelerators.{a}"), "must be at least 1".into()));
                }
            }
        }
        if let Some(r) = &file.region {
            if r.is_empty() {
                return Err(invalid("region", "must not be empty".into()));
            }
        }
        Ok(Config::from_file(file, data_dir, path.display().to_string()))
    }

    fn from_file(file: File, data_dir: Option<PathBuf>, source: String) -> Config {
        let data_dir = data_dir.or(file.data_dir).unwrap_or_else(default_data_dir);
        let storage_root = file.storage_root.unwrap_or_else(|| data_dir.join("storage"));
        let node_file = file.node;
        // Without a [node] table the host overcommits; with one, capacity is exact unless
        // it says otherwise.
        let overcommit = node_file.as_ref().map_or(true, |n| n.overcommit.unwrap_or(false));
        let node = Node {
            name: node_file.as_ref().and_then(|n| n.name.clone()).unwrap_or_else(|| "local".into()),
            cpus: node_file.as_ref().and_then(|n| n.cpus).unwrap_or_else(host_cpus),
            memory_bytes: node_file
                .as_ref()
                .and_then(|n| n.memory_gb)
                .map(|g| (g * GIB as f64) as u64)
                .unwrap_or_else(host_memory),
            accelerators: node_file.map(|n| n.accelerators).unwrap_or_default(),
            up: true,
            schedulable: true,
        };
        Config {
            listen: file.listen.unwrap_or_else(|| "127.0.0.1:8080".into()),
            data_dir,
            storage_root,
            region: file.region.unwrap_or_else(|| "us-central1".into()),
            base_port: file.base_port.unwrap_or(20000),
            tokens_file: file.tokens_file,
            settings: file.lifecycle.unwrap_or_default(),
            fleet: Fleet { nodes: vec![node], overcommit },
            quotas: Quotas { default: file.quotas.default, projects: file.quotas.projects },
            source,
        }
    }
}

/// toml's error with the line number spelled out.
fn describe_toml_error(text: &str, e: &toml::de::Error) -> String {
    let msg = e.message().to_string();
    match e.span() {
        Some(span) => {
            let line = text[..span.start.min(text.len())].matches('\n').count() + 1;
            let key = text[span.clone()].trim().to_string();
            format!("line {line}: {msg} (at `{key}`)")
        }
        None => msg,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(text: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("trainyard.toml");
        std::fs::write(&p, text).unwrap();
        (dir, p)
    }

    #[test]
    fn builtin_overcommits_one_node() {
        let c = Config::builtin(Some("/tmp/x".into()));
        assert!(c.fleet.overcommit);
        assert_eq!(c.fleet.nodes.len(), 1);
        assert_eq!(c.listen, "127.0.0.1:8080");
        assert_eq!(c.settings.max_worker_restarts, 5);
        assert_eq!(c.storage_root, PathBuf::from("/tmp/x/storage"));
    }

    #[test]
    fn explicit_node_is_exact() {
        let (_d, p) = write(
            "region = \"europe-west4\"\n[node]\ncpus = 8\nmemory_gb = 32\naccelerators = { NVIDIA_TESLA_T4 = 2 }\n\
             [quotas.default]\ncustom_model_training_cpus = 16\n[lifecycle]\nmax_worker_restarts = 2\n",
        );
        let c = Config::load(&p, None).unwrap();
        assert!(!c.fleet.overcommit);
        assert_eq!(c.fleet.nodes[0].cpus, 8);
        assert_eq!(c.fleet.nodes[0].accelerators["NVIDIA_TESLA_T4"], 2);
        assert_eq!(c.quotas.limit("any", "custom_model_training_cpus"), Some(16));
        assert_eq!(c.settings.max_worker_restarts, 2);
        assert_eq!(c.settings.max_job_retries, 3, "unset settings keep their defaults");
        assert_eq!(c.region, "europe-west4");
    }

    #[test]
    fn unknown_key_names_line_and_key() {
        let (_d, p) = write("region = \"r\"\n[node]\ncpus = 4\nmemroy_gb = 3\n");
        let e = Config::load(&p, None).unwrap_err().to_string();
        assert!(e.contains("trainyard.toml"), "{e}");
        assert!(e.contains("line 4"), "{e}");
        assert!(e.contains("memroy_gb"), "{e}");
    }

    #[test]
    fn bad_values_are_refused() {
        let (_d, p) = write("[node]\ncpus = 0\n");
        let e = Config::load(&p, None).unwrap_err().to_string();
        assert!(e.contains("node.cpus"), "{e}");
        let (_d, p) = write("[node]\nmemory_gb = -1\n");
        assert!(Config::load(&p, None).unwrap_err().to_string().contains("node.memory_gb"));
        let (_d, p) = write("[lifecycle]\nmax_worker_restarts = \"five\"\n");
        let e = Config::load(&p, None).unwrap_err().to_string();
        assert!(e.contains("line 2"), "{e}");
        let (_d, p) = write("[node\n");
        assert!(Config::load(&p, None).is_err());
        assert!(Config::load(Path::new("/nonexistent/t.toml"), None).unwrap_err().to_string().contains("/nonexistent/t.toml"));
    }
}
