//! The CLI's own settings (`trainyard config set project my-project`), like the known
//! CLI's `config set`: a TOML file at `$TRAINYARD_CLI_CONFIG`, else
//! `$XDG_CONFIG_HOME/trainyard/cli.toml`, else `~/.config/trainyard/cli.toml`.
//!
//! The file may hold a token: it is written with mode 0600 (its directory, when created,
//! 0700), and an existing file that other users may read is tightened to 0600 when it is
//! read or written.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context};
use clap::Subcommand;
use serde::{Deserialize, Serialize};

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CliConfig {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// The CA certificate (PEM) an https server is trusted by.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<String>,
}

pub fn path() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("TRAINYARD_CLI_CONFIG") {
        return Some(PathBuf::from(p));
    }
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))?;
    Some(base.join("trainyard").join("cli.toml"))
}

/// The settings, or none when there is no file.
pub fn load() -> anyhow::Result<CliConfig> {
    let Some(p) = path() else { return Ok(CliConfig::default()) };
    match std::fs::read_to_string(&p) {
        Ok(text) => {
            tighten(&p);
            toml::from_str(&text).with_context(|| format!("CLI config file {}", p.display()))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(CliConfig::default()),
        Err(e) => Err(e).with_context(|| format!("cannot read CLI config file {}", p.display())),
    }
}

#[derive(Subcommand)]
pub enum ConfigCommand {
    /// Set a value: server, project, region, token or ca_file.
    Set {
        /// The setting: server, project, region, token or ca_file.
        key: String,
        /// Its value (e.g. http://127.0.0.1:8080 for server).
        value: String,
    },
    /// Remove a value.
    Unset {
        /// The setting: server, project, region, token or ca_file.
        key: String,
    },
    /// Show the settings (the token masked) and the file they are kept in.
    List {
        #[command(flatten)]
        format: crate::output::ResourceFormat,
    },
}

fn slot<'a>(c: &'a mut CliConfig, key: &str) -> anyhow::Result<&'a mut Option<String>> {
    Ok(match key {
        "server" => &mut c.server,
        "project" => &mut c.project,
        "region" => &mut c.region,
        "token" => &mut c.token,
        "ca_file" => &mut c.ca_file,
        other => bail!("unknown setting {other:?}: use server, project, region, token or ca_file"),
    })
}

pub fn run(cmd: ConfigCommand) -> anyhow::Result<ExitCode> {
    let p = path().context("no place for the CLI config file: set HOME or TRAINYARD_CLI_CONFIG")?;
    let mut c = load()?;
    match cmd {
        ConfigCommand::Set { key, value } => *slot(&mut c, &key)? = Some(value),
        ConfigCommand::Unset { key } => *slot(&mut c, &key)? = None,
        ConfigCommand::List { format } => {
            let mut m = serde_json::Map::new();
            m.insert("file".into(), p.display().to_string().into());
            for (k, v) in [("server", &c.server), ("project", &c.project), ("region", &c.region), ("ca_file", &c.ca_file)] {
                if let Some(v) = v {
                    m.insert(k.into(), v.clone().into());
                }
            }
            if c.token.is_some() {
                m.insert("token".into(), "(set)".into());
            }
            crate::output::print_value(&serde_json::Value::Object(m), format.format)?;
            return Ok(ExitCode::SUCCESS);
        }
    }
    write_private(&p, toml::to_string(&c)?.as_bytes())?;
    println!("Updated property in {}.", p.display());
    Ok(ExitCode::SUCCESS)
}

/// Make a CLI config file that other users may read or change this user's only (0600); a
/// failure is a warning, not an error (the file may belong to someone else).
fn tighten(p: &Path) {
    let Ok(meta) = std::fs::metadata(p) else { return };
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o077 != 0 {
        if let Err(e) = std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o600)) {
            eprintln!("WARNING: CLI config file {} has mode {mode:04o} and cannot be made 0600: {e}", p.display());
        }
    }
}

/// Write the file with mode 0600 whatever the umask: a temporary file created 0600 in the
/// same directory, renamed over the old one (which is replaced, with its mode).
fn write_private(p: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    // A symbolic link (a managed dotfile) keeps pointing at its file, which is replaced.
    let resolved = std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    let p = resolved.as_path();
    let dir = p.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("cannot create {}", dir.display()))?;
    let mut tmp_name = p.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    tmp_name.push(format!(".{}.tmp", std::process::id()));
    let tmp = p.with_file_name(tmp_name);
    let written = (|| {
        let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?;
        // `mode` applies only under the umask; say it again explicitly.
        f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, p)
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e).with_context(|| format!("cannot write {}", p.display()));
    }
    Ok(())
}
