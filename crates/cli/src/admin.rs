//! `trainyard admin backup` (through the server: a consistent copy while it serves) and
//! `trainyard admin restore` (offline: a new data directory from a backup).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Subcommand;
use serde_json::json;

use crate::client::{Api, Target};
use crate::output::{print_value, ResourceFormat};

#[derive(Subcommand)]
pub enum AdminCommand {
    /// Write a consistent copy of the server's database to FILE on the server's host
    /// (SQLite's online backup) while the server keeps serving. FILE must not exist.
    Backup {
        /// Where the copy goes: an absolute path on the server's host (a relative path is
        /// taken from this directory when the server is on this host, and refused when it
        /// is on another).
        #[arg(long)]
        to: PathBuf,
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        format: ResourceFormat,
    },
    /// Make a new data directory from a backup (no server needed): a server started with
    /// `--data-dir DIR` has every job, study and pipeline of the backup, and recovers
    /// running jobs by the lifecycle's rules. DIR must be absent or empty.
    Restore {
        /// The backup file.
        #[arg(long)]
        from: PathBuf,
        /// The new data directory.
        #[arg(long)]
        data_dir: PathBuf,
        #[command(flatten)]
        format: ResourceFormat,
    },
}

pub fn run(cmd: AdminCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        AdminCommand::Backup { to, target, format } => {
            let api = Api::new(target)?;
            // A relative path names a place on this machine: the server's host only when
            // the server is here.
            if to.is_relative() && !crate::client::server_is_local(api.server()) {
                anyhow::bail!(
                    "--to {}: a relative path names a place on this machine, and the server at {} is on another host: give an absolute path on that host",
                    to.display(),
                    api.server()
                );
            }
            let to = std::path::absolute(&to)?;
            let v = api.send("POST", &api.admin_url("backup"), Some(&json!({ "to": to })))?;
            print_value(&v, format.format)?;
        }
        AdminCommand::Restore { from, data_dir, format } => {
            let copied = trainyard_store::backup::restore(&from, &data_dir)?;
            print_value(&serde_json::to_value(&copied)?, format.format)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}
