//! `trainyard local-run JOB.yaml`: one job in the foreground on an embedded store, its
//! logs streamed with replica prefixes; exits 0 on SUCCEEDED. Ctrl-C cancels the job
//! cleanly (L18); a second Ctrl-C leaves at once.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;
use trainyard_server::driver::{now_micros, Create, Kind, KIND_CUSTOM};
use trainyard_server::logs::{self, Cursor, Selector};
use trainyard_server::{Config, Msg};
use trainyard_store::Store;

/// `[containers] pull_timeout_secs` at most, for `local-run`.
const LOCAL_RUN_PULL_TIMEOUT_SECS: u64 = 30;

#[derive(Args)]
pub struct LocalRunArgs {
    /// The job file: a CustomJobSpec in YAML (workerPoolSpecs, scheduling, ...) or a whole CustomJob.
    job_file: PathBuf,
    /// Server config file (TOML) for lifecycle settings, node and catalog.
    #[arg(long, env = "TRAINYARD_CONFIG")]
    config: Option<PathBuf>,
    /// Keep the run's database and logs here (default: a temporary directory, removed at the end).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Project id the job runs under.
    #[arg(long, default_value = "local")]
    project: String,
    /// Display name (default: the job file's name).
    #[arg(long)]
    display_name: Option<String>,
}

pub fn run(args: LocalRunArgs) -> anyhow::Result<ExitCode> {
    // Before anything is created: the run's data is for this user only.
    trainyard_server::datadir::set_private_umask();
    let body = crate::jobfile::read(&args.job_file, args.display_name.as_deref())?;
    let job = crate::jobfile::check(&args.job_file, &body)?;

    let temporary = args.data_dir.is_none();
    let data_dir = args.data_dir.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("trainyard-local-run-{}-{}", std::process::id(), now_micros()))
    });
    let mut cfg = match &args.config {
        Some(p) => Config::load(p, Some(data_dir.clone()))?,
        None => Config::builtin(Some(data_dir.clone())),
    };
    if args.config.is_none() {
        // gs:// outputs outlive the temporary run directory.
        cfg.storage_root = std::env::var_os("TRAINYARD_STORAGE_ROOT")
            .map(PathBuf::from)
            .unwrap_or_else(|| trainyard_server::config::default_data_dir().join("storage"));
    }
    let region = cfg.region.clone();
    let job_dir = std::path::absolute(&args.job_file)
        .ok()
        .and_then(|p| p.parent().map(PathBuf::from))
        .unwrap_or_else(crate::cwd);
    // One user's own job in the foreground: besides its project's gs:// namespace it may
    // write next to its job file, here, in /tmp and its data directory, and under the
    // config's output roots.
    let mut roots = vec![job_dir.clone(), crate::cwd(), PathBuf::from("/tmp"), data_dir.clone()];
    roots.extend(cfg.output_roots.iter().cloned());
    // A foreground tool: an image that cannot be pulled fails the job within 30 s
    // instead of keeping the user waiting for the server's default.
    cfg.containers.pull_timeout_secs = cfg.containers.pull_timeout_secs.min(LOCAL_RUN_PULL_TIMEOUT_SECS);
    // No API or storage endpoint is served: replicas are not pointed at one.
    cfg.listen = String::new();
    // One user's own job in the foreground: it runs as that user.
    cfg.replicas.uid_range = None;
    cfg.replicas.insecure_shared_user = true;
    // In a container, as the known CLI's local-run: the job file's directory is there, at
    // its own path, and is the working directory (so `command: [python3, train.py]` runs).
    cfg.containers.mounts.push(trainyard_backend::container::Mount {
        source: job_dir.clone(),
        target: job_dir.display().to_string(),
        read_only: false,
    });
    cfg.containers.workdir = Some(job_dir.display().to_string());
    // What the job's paths lead to on disk is looked at before the engine gets the job,
    // as the API's create does.
    let paths = trainyard_server::jobspec::PathRoots::new(&cfg, roots.clone());
    trainyard_server::jobspec::OnDisk::of(&job.job_spec, "jobSpec", &job.trainyard_host_directories)
        .check(&args.project, &paths)
        .map_err(|e| anyhow::anyhow!("{}: {}", args.job_file.display(), e.message))?;
    let engine = trainyard_server::start(cfg, crate::shim_command()?, job_dir, roots)?;

    let (reply, rx) = tokio::sync::oneshot::channel();
    engine
        .tx
        .send(Msg::Create { project: args.project.clone(), region: region.clone(), new: Create::CustomJob { resource: Box::new(job), reply } })
        .map_err(|_| anyhow::anyhow!("the engine stopped"))?;
    let created = rx.blocking_recv().context("the engine stopped")?.map_err(|e| anyhow::anyhow!("{}", e.message))?;
    let id: u64 = created.name.rsplit('/').next().and_then(|s| s.parse().ok()).context("the created job has no id")?;
    eprintln!("[trainyard] CustomJob {} created ({}).", created.name, created.display_name);
    let started = std::time::Instant::now();

    // Ctrl-C: the first cancels the job, the second leaves at once.
    let interrupts = Arc::new(AtomicU32::new(0));
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    {
        let interrupts = Arc::clone(&interrupts);
        let tx = engine.tx.clone();
        let (project, region) = (args.project.clone(), region.clone());
        std::thread::Builder::new().name("signals".into()).spawn(move || {
            rt.block_on(async move {
                loop {
                    if tokio::signal::ctrl_c().await.is_err() {
                        return;
                    }
                    if interrupts.fetch_add(1, Ordering::SeqCst) == 0 {
                        eprintln!("\n[trainyard] Cancelling the job (Ctrl-C again to leave at once)...");
                        let (reply, _rx) = tokio::sync::oneshot::channel();
                        let _ = tx.send(Msg::Cancel { kind: Kind::CustomJob, project: project.clone(), region: region.clone(), id, reply });
                    } else {
                        eprintln!("\n[trainyard] Leaving; replicas still stopping keep their shims.");
                        std::process::exit(130);
                    }
                }
            })
        })?;
    }

    let store = Store::connect(&engine.store)?;
    let mut cursor = Cursor::default();
    let mut printed = Printed::default();
    let sel = Selector::default();
    // Where the job is, on one line of stderr (redrawn in place on a terminal, a line per
    // change elsewhere).
    let mut progress = crate::progress::Progress::stderr("[trainyard] ");
    let what = format!("CustomJob {id}");
    let final_job = loop {
        let current = store.get_job(KIND_CUSTOM, &args.project, &region, id)?;
        let done = current.as_ref().filter(|j| j.job.is_terminal()).cloned();
        // Drain everything written so far (after the job ended too).
        loop {
            let batch = logs::read_new(&store, &engine.services.cfg.data_dir, id, &sel, &mut cursor)?;
            if !batch.entries.is_empty() {
                progress.clear();
                print_entries(&batch.entries, &mut printed);
            }
            if batch.caught_up {
                break;
            }
        }
        if let Some(j) = done {
            progress.clear();
            break j;
        }
        if let Some(j) = &current {
            let state = j.job.state();
            let reason = match state {
                trainyard_core::State::Queued | trainyard_core::State::Pending => j.job.waiting_reason.clone().unwrap_or_default(),
                _ => String::new(),
            };
            progress.update(&what, state.wire_name(), &reason, "");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    drop(progress);
    let _ = engine.tx.send(Msg::Shutdown);
    let _ = engine.thread.join();
    let state = final_job.job.state();
    eprintln!("[trainyard] CustomJob {} ended: {} after {}.", created.name, state.wire_name(), crate::progress::duration(started.elapsed()));
    if let Some(e) = final_job.job.error() {
        // The replica's stderr was printed as it came (and a StartError's message with the
        // job's failure event): the error's copy of its last lines is not printed again.
        let (first, tail) = printed.shorten(&e.message);
        eprintln!("[trainyard] {}", error_line(i64::from(e.code), first, tail));
    }
    if temporary {
        let _ = std::fs::remove_dir_all(&data_dir);
    } else {
        eprintln!("[trainyard] database and logs kept in {}", data_dir.display());
    }
    Ok(match state {
        trainyard_core::State::Succeeded => ExitCode::SUCCESS,
        trainyard_core::State::Cancelled => ExitCode::from(130),
        trainyard_core::State::Failed => ExitCode::from(1),
        other => bail!("the job ended in a state that is not terminal: {}", other.wire_name()),
    })
}

/// `[workerpool0-0] line`, with attempt and restart when they are not the first.
pub fn prefix(e: &logs::Entry) -> String {
    if e.stream == "event" {
        return if e.replica == "service" { "[trainyard]".into() } else { format!("[trainyard {}]", e.replica) };
    }
    if e.attempt == 0 && e.restart == 0 {
        format!("[{}]", e.replica)
    } else {
        format!("[{} attempt {} restart {}]", e.replica, e.attempt, e.restart)
    }
}

/// Said in place of a job error's last lines of stderr already printed.
const ABOVE: &str = "(its last lines of stderr are above)";

/// A job's error as the last line of a command that waited on it: what happened first, in
/// the error's words, then the service's code (`3 (INVALID_ARGUMENT)` is the API's code,
/// not the program's exit status, which the message gives). `cut`: the message's last
/// lines of stderr were printed already and are left out.
pub(crate) fn error_line(code: i64, message: &str, cut: bool) -> String {
    let code = trainyard_api::Code::describe_number(code);
    format!("error: {message}{} [error code {code}]", if cut { format!(" {ABOVE}") } else { String::new() })
}

/// The stderr lines printed so far (the newest few thousand): a job error's copy of its
/// replica's last lines of stderr is not printed again when they were all printed already
/// (a StartError's message, which no program printed, is).
#[derive(Default)]
pub(crate) struct Printed {
    lines: std::collections::VecDeque<String>,
}

impl Printed {
    const KEEP: usize = 4096;

    fn saw(&mut self, line: &str) {
        if self.lines.len() == Self::KEEP {
            self.lines.pop_front();
        }
        self.lines.push_back(line.to_string());
    }

    /// `message` without the `Last lines of stderr:` it ends with when every one of them
    /// was printed, and whether it was cut.
    pub(crate) fn shorten<'a>(&self, message: &'a str) -> (&'a str, bool) {
        match trainyard_core::step::split_stderr_tail(message) {
            (first, Some(tail)) if tail.lines().filter(|l| !l.is_empty()).all(|l| self.lines.iter().any(|p| p == l)) => (first, true),
            _ => (message, false),
        }
    }
}

pub(crate) fn print_entries(entries: &[logs::Entry], printed: &mut Printed) {
    let stdout = std::io::stdout();
    let stderr = std::io::stderr();
    let mut out = stdout.lock();
    let mut err = stderr.lock();
    for e in entries {
        // An event in words, without its rule id (the logs API and `describe
        // --format=json` keep it).
        let line = match (e.stream.as_str(), printed.shorten(&e.text)) {
            ("event", (first, true)) => format!("{} {} {ABOVE}", prefix(e), logs::plain_text(first)),
            ("event", _) => format!("{} {}", prefix(e), logs::plain_text(&e.text)),
            _ => format!("{} {}", prefix(e), e.text),
        };
        if e.stream == "stderr" {
            printed.saw(&e.text);
        } else if let (_, Some(tail)) = trainyard_core::step::split_stderr_tail(&e.text) {
            // Printed whole here (a StartError's message): not again at the end.
            tail.lines().for_each(|l| printed.saw(l));
        }
        let _ = if e.stream == "stdout" { writeln!(out, "{line}") } else { writeln!(err, "{line}") };
    }
    let _ = out.flush();
}
