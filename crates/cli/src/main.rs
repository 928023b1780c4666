//! `trainyard`: the server (`serve`), one job in the foreground (`local-run`), the
//! client commands shaped like the managed service's CLI (`custom-jobs ...`), and the
//! replica supervisor (`shim`, started by the server itself).

mod admin;
mod cliconfig;
mod client;
mod exec;
mod jobfile;
mod local_run;
mod logwriter;
mod output;
mod progress;
mod serve;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

#[derive(Parser)]
#[command(name = "trainyard", version, about = "Self-hosted training jobs that speak the managed service's API")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the API server and the scheduler.
    Serve(serve::ServeArgs),
    /// Check what this host gives `serve` with the same arguments (cgroups, users,
    /// directories, containers, GPUs, Slurm, tokens, the address, the clock), without
    /// starting it: one line each with ok / warn / fail and the fix.
    Doctor(serve::ServeArgs),
    /// Run one job in the foreground from a job file (the `--config` YAML of the known CLI).
    LocalRun(local_run::LocalRunArgs),
    /// Create, list, describe, cancel and delete CustomJobs, and stream their logs.
    #[command(name = "custom-jobs")]
    CustomJobs(CustomJobs),
    /// Create, list, describe, cancel and delete HyperparameterTuningJobs, and stream their
    /// trials' logs.
    #[command(name = "hp-tuning-jobs")]
    HpTuningJobs {
        #[command(subcommand)]
        command: client::StudyCommand,
    },
    /// Nodes of the fleet: list, describe, drain, undrain.
    Nodes {
        #[command(subcommand)]
        command: client::NodeCommand,
    },
    /// Usage accounting: CPU-, GPU- and memory-hours per project and accelerator type,
    /// job ends and preemptions (all projects, or the one --project names).
    Usage(client::UsageArgs),
    /// Quotas: limits, use and queued demand; reload the limits.
    Quotas {
        #[command(subcommand)]
        command: client::QuotaCommand,
    },
    /// Backup and restore of the server's database.
    Admin {
        #[command(subcommand)]
        command: admin::AdminCommand,
    },
    /// The CLI's own settings: server, project, region, token.
    Config {
        #[command(subcommand)]
        command: cliconfig::ConfigCommand,
    },
}

#[derive(Args)]
struct CustomJobs {
    #[command(subcommand)]
    command: client::JobCommand,
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    // The shim must set its signal mask before any thread exists.
    if args.get(1).map(String::as_str) == Some("shim") {
        // `shim enter ...` too: a command in a running replica (`custom-jobs exec`).
        let code = trainyard_backend::shim_program_main(args[2..].to_vec());
        return ExitCode::from(code.clamp(0, 255) as u8);
    }
    // A virtual node's agent: holds the node's lock until killed.
    if args.get(1).map(String::as_str) == Some("node-agent") {
        let Some(lock) = args.get(2) else {
            eprintln!("usage: trainyard node-agent LOCK_FILE");
            return ExitCode::from(64);
        };
        let code = trainyard_server::nodeagent::agent_main(std::path::Path::new(lock));
        return ExitCode::from(code.clamp(0, 255) as u8);
    }
    let cli = Cli::parse();
    if matches!(cli.command, Command::Serve(_) | Command::LocalRun(_)) {
        // Nothing the server inherited reaches what it starts (shims, replicas, builds).
        trainyard_server::datadir::cloexec_inherited_fds();
    }
    if !matches!(cli.command, Command::Serve(_) | Command::LocalRun(_)) {
        // A client command whose output is cut short (`... list | head -1`) ends quietly,
        // as other command-line tools do, instead of failing on the closed pipe.
        // SAFETY: no other thread exists yet; SIG_DFL installs no handler.
        let _ = unsafe { nix::sys::signal::signal(nix::sys::signal::Signal::SIGPIPE, nix::sys::signal::SigHandler::SigDfl) };
    }
    // The server logs what it does; `local-run` shows the job's own events (`[trainyard]`
    // lines) and only errors of its own; the client commands warnings too.
    let level = match cli.command {
        Command::Serve(_) => "info",
        Command::LocalRun(_) => "error",
        _ => "warn",
    };
    if !matches!(cli.command, Command::Serve(_)) {
        init_tracing(level);
    }
    let result = match cli.command {
        Command::Serve(a) => serve::run(a),
        Command::Doctor(a) => serve::doctor(a),
        Command::LocalRun(a) => local_run::run(a),
        Command::CustomJobs(c) => client::run(c.command),
        Command::Config { command } => cliconfig::run(command),
        Command::Nodes { command } => client::run_nodes(command),
        Command::HpTuningJobs { command } => client::run_studies(command),
        Command::Quotas { command } => client::run_quotas(command),
        Command::Usage(args) => client::run_usage(args),
        Command::Admin { command } => admin::run(command),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("ERROR: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// The log of commands other than `serve` (which sets its own up from its config).
fn init_tracing(default: &str) {
    if let Ok(Some(note)) = logwriter::init(default, &trainyard_server::config::Log::default()) {
        tracing::warn!("{note}");
    }
}

/// The command that starts a shim: this very binary with `shim`.
/// How replicas' supervisors are started: `trainyard-shim` beside this executable (built
/// from the same package, so never of another version; a smaller program, quicker to
/// start), else `trainyard shim`.
pub fn shim_command() -> anyhow::Result<Vec<std::ffi::OsString>> {
    let exe = std::env::current_exe().map_err(|e| anyhow::anyhow!("cannot find the trainyard executable: {e}"))?;
    let small = exe.with_file_name("trainyard-shim");
    if small.is_file() {
        return Ok(vec![small.into_os_string()]);
    }
    Ok(vec![exe.into_os_string(), "shim".into()])
}

pub fn cwd() -> PathBuf {
    std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"))
}
