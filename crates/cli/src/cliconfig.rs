//! The CLI's own settings (`trainyard config set project my-project`), like the known
//! CLI's `config set`: a TOML file at `$TRAINYARD_CLI_CONFIG`, else
//! `$XDG_CONFIG_HOME/trainyard/cli.toml`, else `~/.config/trainyard/cli.toml`.

use std::path::PathBuf;
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
        Ok(text) => toml::from_str(&text).with_context(|| format!("CLI config file {}", p.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(CliConfig::default()),
        Err(e) => Err(e).with_context(|| format!("cannot read CLI config file {}", p.display())),
    }
}

#[derive(Subcommand)]
pub enum ConfigCommand {
    /// Set a value: server, project, region or token.
    Set { key: String, value: String },
    /// Remove a value.
    Unset { key: String },
    /// Show the settings (the token masked).
    List,
}

fn slot<'a>(c: &'a mut CliConfig, key: &str) -> anyhow::Result<&'a mut Option<String>> {
    Ok(match key {
        "server" => &mut c.server,
        "project" => &mut c.project,
        "region" => &mut c.region,
        "token" => &mut c.token,
        other => bail!("unknown setting {other:?}: use server, project, region or token"),
    })
}

pub fn run(cmd: ConfigCommand) -> anyhow::Result<ExitCode> {
    let p = path().context("no place for the CLI config file: set HOME or TRAINYARD_CLI_CONFIG")?;
    let mut c = load()?;
    match cmd {
        ConfigCommand::Set { key, value } => *slot(&mut c, &key)? = Some(value),
        ConfigCommand::Unset { key } => *slot(&mut c, &key)? = None,
        ConfigCommand::List => {
            println!("[{}]", p.display());
            for (k, v) in [("server", &c.server), ("project", &c.project), ("region", &c.region)] {
                if let Some(v) = v {
                    println!("{k} = {v}");
                }
            }
            if c.token.is_some() {
                println!("token = (set)");
            }
            return Ok(ExitCode::SUCCESS);
        }
    }
    if let Some(dir) = p.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    std::fs::write(&p, toml::to_string(&c)?).with_context(|| format!("cannot write {}", p.display()))?;
    println!("Updated property in {}.", p.display());
    Ok(ExitCode::SUCCESS)
}
