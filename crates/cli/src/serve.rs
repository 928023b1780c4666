//! `trainyard serve`: the API server, the driver and the scheduler.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context};
use clap::Args;
use trainyard_server::http::{AppState, ReadPool};
use trainyard_server::cluster::Member;
use trainyard_store::lease::Fence;
use trainyard_server::{Config, Msg};

#[derive(Args)]
pub struct ServeArgs {
    /// Config file (TOML); without one, the built-in defaults for one workstation.
    #[arg(long, env = "TRAINYARD_CONFIG")]
    config: Option<PathBuf>,
    /// Address to listen on.
    #[arg(long)]
    listen: Option<String>,
    /// Where the database, run directories and logs live.
    #[arg(long, env = "TRAINYARD_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// Tokens file (TOML): bearer tokens and the projects each may use.
    #[arg(long, env = "TRAINYARD_TOKENS")]
    tokens: Option<PathBuf>,
    /// The store: a PostgreSQL URL (postgres://user:password@host:port/db), over the
    /// config's `[store] url`; without either, SQLite in the data directory.
    #[arg(long, env = "TRAINYARD_STORE_URL", hide_env_values = true)]
    store_url: Option<String>,
    /// Where the other servers on the same PostgreSQL store reach this one's API
    /// (http://host:port), over the config's `[store] advertise_url`; default: http://
    /// and the listen address.
    #[arg(long, env = "TRAINYARD_ADVERTISE_URL")]
    advertise_url: Option<String>,
    /// Serve HTTPS and gRPC with a private CA and certificate made under
    /// <data_dir>/tls/ (as the config's `[tls] auto = true`).
    #[arg(long)]
    tls_auto: bool,
}

/// The config `serve` runs with: the file (or the built-in defaults) and the flags over it.
fn load(args: &ServeArgs) -> anyhow::Result<(Config, SocketAddr)> {
    let mut cfg = match &args.config {
        Some(p) => Config::load(p, args.data_dir.clone())?,
        None => Config::builtin(args.data_dir.clone()),
    };
    if let Some(l) = &args.listen {
        cfg.listen = l.clone();
    }
    let addr: SocketAddr = cfg
        .listen
        .parse()
        .with_context(|| format!("--listen {:?} is not an address such as 127.0.0.1:8080", cfg.listen))?;
    if let Some(t) = &args.tokens {
        cfg.tokens_file = Some(t.clone());
    }
    if args.tls_auto {
        if cfg.tls.cert_file.is_some() || cfg.tls.key_file.is_some() {
            bail!("--tls-auto and the config's [tls] cert_file/key_file exclude each other: give one or the other");
        }
        cfg.tls.auto = true;
    }
    if let Some(url) = &args.store_url {
        cfg.store = Some(trainyard_store::Location::from_url(url).map_err(|e| anyhow::anyhow!("--store-url (TRAINYARD_STORE_URL): {e}"))?);
    }
    if let Some(url) = &args.advertise_url {
        trainyard_server::config::check_advertise_url(url).map_err(|e| anyhow::anyhow!("--advertise-url (TRAINYARD_ADVERTISE_URL): {e}"))?;
        cfg.advertise_url = Some(url.clone());
    }
    if cfg.store.is_some() && cfg.advertise_url.is_none() && addr.ip().is_unspecified() {
        bail!(
            "listening on {addr} with a PostgreSQL store: set [store] advertise_url (or --advertise-url) to the address \
             the other servers reach this one at, such as http://10.0.0.5:{}",
            addr.port()
        );
    }
    Ok((cfg, addr))
}

/// `trainyard doctor`: what this host gives `serve` with these arguments, checked without
/// starting it (see `trainyard_server::doctor`). Exit status 0 only when nothing fails.
pub fn doctor(args: ServeArgs) -> anyhow::Result<ExitCode> {
    use trainyard_server::doctor;
    let (cfg, addr) = load(&args)?;
    println!("trainyard doctor: {} ({})", cfg.source, env!("CARGO_PKG_VERSION"));
    let findings = doctor::examine(&cfg, Some(addr), doctor::Scope::Full);
    print!("{}", doctor::render(&findings));
    Ok(if doctor::failed(&findings) { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}

pub fn run(args: ServeArgs) -> anyhow::Result<ExitCode> {
    // Before anything is created: the data directory, database, run directories and logs
    // (and what shims and node agents create) are for this user only.
    trainyard_server::datadir::set_private_umask();
    let (mut cfg, addr) = load(&args)?;
    // The log as the config asks (`[log]`), before anything is logged.
    if let Some(note) = crate::logwriter::init("info", &cfg.log)? {
        tracing::warn!("{note}");
    }
    // The host checks the start does not make on its own way (`trainyard doctor` has all;
    // the start's own ones fail or warn below as they always did).
    let findings = trainyard_server::doctor::examine(&cfg, None, trainyard_server::doctor::Scope::Start);
    for f in findings.iter().filter(|f| f.status != trainyard_server::doctor::Status::Ok) {
        tracing::warn!("host check: {} {}: {}; fix: {}", f.status.word(), f.check, f.detail, f.fix.as_deref().unwrap_or(""));
    }
    tracing::info!("host checks: {} (trainyard doctor runs them all)", trainyard_server::doctor::summary(&findings));
    let tokens = match &cfg.tokens_file {
        Some(path) => Some(std::sync::Arc::new(trainyard_server::auth::TokenStore::open(path)?)),
        None => None,
    };
    if tokens.is_none() && !addr.ip().is_loopback() {
        bail!(
            "refusing to listen on {addr} without authentication: give a tokens file (--tokens or tokens_file) \
             or listen on a loopback address such as 127.0.0.1:8080"
        );
    }
    let tls = trainyard_server::tls::Tls::start(&cfg.tls, &cfg.data_dir, addr)?;
    let jobs_listener = jobs_listener(&mut cfg)?;
    if tls.is_none() && tokens.is_some() && !addr.ip().is_loopback() {
        tracing::warn!(
            "listening on {addr} with bearer tokens and no TLS: tokens cross the network in clear text; \
             set [tls] auto = true (or --tls-auto), or [tls] cert_file and key_file"
        );
    }
    let scheme = if tls.is_some() { "https" } else { "http" };
    let tls_note = match tls.as_ref().map(|t| t.ca_file()) {
        Some(Some(ca)) => format!(
            "; TLS with the CA {ca} (clients: curl --cacert, REQUESTS_CA_BUNDLE for REST and storage, \
             GRPC_DEFAULT_SSL_ROOTS_FILE_PATH for gRPC, TRAINYARD_CA_FILE for the CLI)",
            ca = ca.display()
        ),
        Some(None) => "; TLS with [tls] cert_file (REST, storage, console and gRPC on this address)".to_string(),
        None => String::new(),
    };
    let auth_note = match &tokens {
        Some(t) => format!("{} bearer tokens from {} (SIGHUP reads them again)", t.current().len(), t.path().display()),
        None => "no tokens file: open to local clients only".to_string(),
    };
    let workdir = crate::cwd();
    // Jobs write outputs in their project's namespace of the storage root, and under the
    // configured output roots only: never the data directory or this working directory.
    if let Err(why) = cfg.check_workdir(&workdir) {
        bail!("{why}");
    }
    let roots = cfg.output_roots.clone();
    let region = cfg.region.clone();
    let source = cfg.source.clone();
    let data_dir = cfg.data_dir.clone();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    // Bound once: a follower serves on it, and the same socket serves once it leads.
    let listener = std::net::TcpListener::bind(addr).with_context(|| format!("cannot listen on {addr}"))?;
    listener.set_nonblocking(true).with_context(|| format!("cannot listen on {addr}"))?;
    // Several servers on one PostgreSQL store: this one follows until it holds the lease.
    let mut leading: Option<(std::sync::Arc<Member>, Fence)> = None;
    let mut token_key = None;
    if let Some(location @ trainyard_store::Location::Postgres(_)) = cfg.store.clone() {
        let mut store = trainyard_store::Store::connect(&location)?;
        let member = std::sync::Arc::new(Member::new(&cfg, location.clone()));
        member.check_agreement(&store).map_err(|why| anyhow::anyhow!("{why}"))?;
        let key = trainyard_server::token_key(&mut store)?;
        token_key = Some(key.clone());
        drop(store);
        // A lease that is free (a server alone on its store, or restarted after its
        // process ended) is taken at once; else this server follows until it is. It is
        // kept from then on (renewed while the driver starts).
        let fence = match member.try_lead()? {
            Some(epoch) => member.keep(epoch).context("cannot start the lease's threads")?,
            None => {
                let follower = follower_state(&cfg, &member, key, tokens.clone());
                let mut limits = cfg.http.clone();
                // Requests in flight to a leader that is gone are not waited for long.
                limits.shutdown_grace = limits.shutdown_grace.min(std::time::Duration::from_secs(1));
                let what = format!("region {region} on {scheme}://{addr} (config: {source}; data: {}); {auth_note}{tls_note}", data_dir.display());
                match rt.block_on(follow(std::sync::Arc::clone(&member), &listener, follower, limits, tls.clone(), what))? {
                    Some(fence) => fence,
                    None => return Ok(ExitCode::SUCCESS),
                }
            }
        };
        leading = Some((member, fence));
    }
    let fence = leading.as_ref().map(|(_, f)| f.clone());
    let epoch = fence.as_ref().map(|f| f.epoch);
    let shim = crate::shim_command()?;
    let engine = trainyard_server::start_leading(cfg, shim.clone(), workdir, roots, fence)?;
    if let Some((member, _)) = &leading {
        member.report_to(engine.metrics.clone());
    }
    // The key of page tokens (read already where this server followed).
    let token_key = match token_key {
        Some(key) => key,
        None => trainyard_server::token_key(&mut trainyard_store::Store::connect(&engine.store)?)?,
    };
    if let (Some(t), Some(jobs)) = (&tokens, &engine.services.job_credentials) {
        t.accept_job_credentials(std::sync::Arc::clone(jobs));
    }
    let shares = engine.services.cfg.limits.shares();
    let state = AppState {
        tx: engine.tx.clone(),
        readers: std::sync::Arc::new(ReadPool::new(engine.store.clone())),
        data_dir: data_dir.clone(),
        token_key,
        tokens: tokens.clone(),
        waiting: engine.waiting.clone(),
        health: engine.health.clone(),
        metrics: engine.metrics.clone(),
        writes: std::sync::Arc::new(trainyard_server::security::WriteLimiter::new(&engine.services.cfg.limits)),
        shares: std::sync::Arc::clone(&shares),
        storage: std::sync::Arc::new(trainyard_server::storage::Storage::new(
            &engine.services.cfg,
            tokens.clone(),
            std::sync::Arc::clone(&engine.services.storage_usage),
            shares,
        )),
        cluster: leading.as_ref().map(|(m, _)| std::sync::Arc::clone(&m.view)),
        forward: None,
        exec: Some(std::sync::Arc::new(trainyard_server::exec::Exec::new(shim, &engine.services.cfg, engine.metrics.clone()))),
        job_paths: std::sync::Arc::new(trainyard_server::jobspec::PathRoots::new(&engine.services.cfg, engine.services.output_roots.clone())),
    };
    let limits = engine.services.cfg.http.clone();
    let tx = engine.tx.clone();
    let health = engine.health.clone();
    let hangup_tokens = state.tokens.clone();
    let role = epoch.map(|e| format!(" as the leader (epoch {e})")).unwrap_or_default();
    rt.block_on(async move {
        reload_on_hangup(hangup_tokens, tls.clone())?;
        // The jobs' listener stops with the main one.
        let (stopped_tx, mut stopped_rx) = tokio::sync::watch::channel(false);
        let jobs = match jobs_listener {
            Some((listener, jobs_tls)) => {
                let listener = tokio::net::TcpListener::from_std(listener).context("cannot serve the jobs' address")?;
                let stopped = async move {
                    let _ = stopped_rx.wait_for(|s| *s).await;
                };
                Some(tokio::spawn(trainyard_server::http::serve(listener, state.clone(), limits.clone(), Some(jobs_tls), stopped)))
            }
            None => None,
        };
        let listener = tokio::net::TcpListener::from_std(listener.try_clone()?).with_context(|| format!("cannot listen on {addr}"))?;
        tracing::info!(
            "Trainyard serving region {region} on {scheme}://{addr}{role} (config: {source}; data: {}); {auth_note}{tls_note}",
            data_dir.display()
        );
        ready();
        let sessions = state.exec.clone();
        trainyard_server::http::serve(listener, state, limits, tls, shutdown_signal(health)).await?;
        let _ = stopped_tx.send(true);
        // Sessions in replicas end, each told why; the replicas go on.
        if let Some(exec) = sessions {
            exec.stop(std::time::Duration::from_secs(3)).await;
        }
        if let Some(jobs) = jobs {
            jobs.await.context("the jobs' listener")??;
        }
        let _ = sd_notify::notify(&[sd_notify::NotifyState::Stopping]);
        anyhow::Ok(())
    })?;
    // The replicas keep running under their shims; a restarted server adopts them.
    let _ = tx.send(Msg::Shutdown);
    let driver = engine.thread.join();
    if engine.services.cfg.stop_node_agents {
        stop_node_agents(&engine.services.cfg.data_dir);
    }
    // A leader that stops lets its lease go: a follower takes over at once.
    if let (Some((member, fence)), Ok(Ok(()))) = (&leading, &driver) {
        member.release(fence.epoch);
    }
    match driver {
        Ok(Ok(())) => Ok(ExitCode::SUCCESS),
        Ok(Err(e)) => Err(e.into()),
        Err(_) => bail!("the driver thread panicked"),
    }
}

/// The API of a follower: reads from the store and the shared data directory, the rest
/// forwarded to the leader (see `trainyard_server::cluster`).
fn follower_state(
    cfg: &Config,
    member: &std::sync::Arc<Member>,
    token_key: Vec<u8>,
    tokens: Option<std::sync::Arc<trainyard_server::auth::TokenStore>>,
) -> AppState {
    use std::sync::Arc;
    use trainyard_server::{metrics::Metrics, storage};
    let usage = Arc::new(storage::usage::StorageUsage::new(cfg.storage_root.clone(), cfg.storage_limits.clone()));
    let metrics = Arc::new(if cfg.metrics_enabled { Metrics::new() } else { Metrics::disabled() });
    member.report_to(Arc::clone(&metrics));
    let shares = cfg.limits.shares();
    AppState {
        // Nothing is asked of a driver here: what needs one is forwarded.
        tx: std::sync::mpsc::channel().0,
        readers: Arc::new(ReadPool::new(cfg.store_location())),
        data_dir: cfg.data_dir.clone(),
        token_key,
        tokens: tokens.clone(),
        waiting: Arc::default(),
        health: Arc::default(),
        metrics,
        writes: Arc::new(trainyard_server::security::WriteLimiter::new(&cfg.limits)),
        shares: Arc::clone(&shares),
        storage: Arc::new(storage::Storage::new(cfg, tokens, usage, shares)),
        cluster: Some(Arc::clone(&member.view)),
        exec: None,
        job_paths: Arc::new(trainyard_server::jobspec::PathRoots::new(cfg, cfg.output_roots.clone())),
        forward: Some(Arc::new(trainyard_server::http::forward::Forwarder::new(
            Arc::clone(&member.view),
            cfg.tls.auto.then(|| trainyard_server::tls::auto_ca_file(&cfg.data_dir)).as_deref(),
        ))),
    }
}

/// Serve as a follower until this server takes the lease (kept from that moment on: its
/// fence) or is told to stop (None).
async fn follow(
    member: std::sync::Arc<Member>,
    listener: &std::net::TcpListener,
    state: AppState,
    limits: trainyard_server::listen::Limits,
    tls: Option<std::sync::Arc<trainyard_server::tls::Tls>>,
    what: String,
) -> anyhow::Result<Option<Fence>> {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    let stop = Arc::new(AtomicBool::new(false));
    let won: Arc<Mutex<Option<std::io::Result<Fence>>>> = Arc::default();
    let following = {
        let (stop, health, member) = (Arc::clone(&stop), Arc::clone(&state.health), Arc::clone(&member));
        tokio::task::spawn_blocking(move || member.follow(&stop, &health))
    };
    let shutdown = {
        let (stop, won) = (Arc::clone(&stop), Arc::clone(&won));
        async move {
            tokio::select! {
                took = following => {
                    if let (Ok(Some(epoch)), Ok(mut w)) = (took, won.lock()) {
                        // Kept at once: the follower's requests in flight are let finish
                        // meanwhile, for a moment.
                        *w = Some(member.keep(epoch));
                    }
                }
                _ = terminated() => stop.store(true, Ordering::Relaxed),
            }
        }
    };
    let socket = tokio::net::TcpListener::from_std(listener.try_clone()?).context("cannot serve as a follower")?;
    tracing::info!("Trainyard serving {what}, as a follower until it holds the store's lease");
    ready();
    trainyard_server::http::serve(socket, state, limits, tls, shutdown).await?;
    let fence = won.lock().ok().and_then(|mut w| w.take()).transpose().context("cannot start the lease's threads")?;
    if let Some(f) = &fence {
        tracing::info!("this server holds the store's lease (epoch {}): it leads from now on", f.epoch);
    }
    Ok(fence)
}

/// A unit of Type=notify (packaging/trainyard.service) is started once the server serves
/// (as a follower or as the leader); without NOTIFY_SOCKET nothing is sent.
fn ready() {
    if let Err(e) = sd_notify::notify(&[sd_notify::NotifyState::Ready]) {
        tracing::warn!("cannot tell the service manager that the server is ready (NOTIFY_SOCKET): {e}");
    }
}

/// SIGHUP reads the tokens file again (as `POST /v1/admin/tokens:reload` does) and the TLS
/// certificate and key (`[tls]`); a file that cannot be used changes nothing and is
/// logged. Without a tokens file or TLS, SIGHUP is logged and ignored. The automatic
/// certificate is also looked at twice a day and renewed when due.
fn reload_on_hangup(
    tokens: Option<std::sync::Arc<trainyard_server::auth::TokenStore>>,
    tls: Option<std::sync::Arc<trainyard_server::tls::Tls>>,
) -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut hangup = signal(SignalKind::hangup()).context("cannot handle SIGHUP")?;
    if let Some(tls) = tls.clone() {
        tokio::spawn(async move {
            let mut every = tokio::time::interval(trainyard_server::tls::RENEW_CHECK);
            every.tick().await;
            loop {
                every.tick().await;
                reload_tls(&tls, "renewal check").await;
            }
        });
    }
    tokio::spawn(async move {
        while hangup.recv().await.is_some() {
            if let Some(tls) = &tls {
                reload_tls(tls, "SIGHUP").await;
            }
            match &tokens {
                Some(store) => {
                    let store = std::sync::Arc::clone(store);
                    match tokio::task::spawn_blocking(move || trainyard_server::security::reload_tokens_logged(&store, "SIGHUP")).await {
                        Ok(_) => {}
                        Err(e) => tracing::error!("SIGHUP: the tokens reload did not finish: {e}"),
                    }
                }
                None if tls.is_none() => tracing::warn!("SIGHUP: no tokens file or TLS certificate to read again; ignored"),
                None => {}
            }
        }
    });
    Ok(())
}

/// `stop_node_agents = true`: the virtual nodes' agents end with the server.
fn stop_node_agents(data_dir: &std::path::Path) {
    match trainyard_server::nodeagent::stop_agents(data_dir, std::time::Duration::from_secs(5)) {
        Ok(left) if left.is_empty() => tracing::info!("node agents stopped"),
        Ok(left) => tracing::warn!("node agents still running after 5 s: {}", left.join(", ")),
        Err(e) => tracing::warn!("cannot stop the node agents in {}: {e}", data_dir.display()),
    }
}

/// Ctrl-C, SIGTERM, or the driver ending (then the process exits non-zero with its reason,
/// so that a supervisor restarts it).
async fn shutdown_signal(health: std::sync::Arc<trainyard_server::health::Health>) {
    let driver_ended = async move {
        loop {
            tokio::time::sleep(std::time::Duration::from_millis(250)).await;
            if let Some(why) = health.unavailable().filter(|w| w.starts_with("the driver stopped")) {
                tracing::error!("{why}; shutting down");
                return;
            }
        }
    };
    tokio::select! {
        _ = terminated() => {},
        _ = driver_ended => return,
    }
    tracing::info!("shutting down; running replicas stay up and are adopted at the next start");
}

/// Ctrl-C or SIGTERM.
async fn terminated() {
    let ctrl_c = tokio::signal::ctrl_c();
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = ctrl_c => {},
                _ = term.recv() => {},
            }
        }
        Err(_) => {
            let _ = ctrl_c.await;
        }
    }
}

/// Read the TLS certificate again (or renew the automatic one), off the runtime's threads.
async fn reload_tls(tls: &std::sync::Arc<trainyard_server::tls::Tls>, via: &'static str) {
    let tls = std::sync::Arc::clone(tls);
    match tokio::task::spawn_blocking(move || tls.reload()).await {
        Ok(Ok(what)) => tracing::info!("{via}: {what}"),
        Ok(Err(e)) => tracing::error!("{via}: the TLS certificate in use stays: {e}"),
        Err(e) => tracing::error!("{via}: the TLS reload did not finish: {e}"),
    }
}

/// `[tls] jobs_address` (with `auto`): port 443 of that loopback address, where the
/// managed service's host names lead in jobs, and its certificate (for those names, from
/// the automatic CA). A server that cannot listen there (not root, the port taken) says
/// so and goes on: its jobs get the endpoint variables only.
fn jobs_listener(cfg: &mut Config) -> anyhow::Result<Option<(std::net::TcpListener, std::sync::Arc<trainyard_server::tls::Tls>)>> {
    let Some(ip) = cfg.tls.jobs_address.filter(|_| cfg.tls.auto) else { return Ok(None) };
    let at = SocketAddr::new(ip, 443);
    let listener = match std::net::TcpListener::bind(at) {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(
                "[tls] jobs_address: cannot listen on {at} ({e}): jobs' clients reach this server through the endpoint \
                 variables (API_ENDPOINT_OVERRIDE, STORAGE_EMULATOR_HOST) only, not by the service's host names; \
                 run the server as root, or set [tls] jobs_address = \"off\" to say nothing"
            );
            return Ok(None);
        }
    };
    listener.set_nonblocking(true).with_context(|| format!("cannot listen on {at}"))?;
    let jobs_tls = trainyard_server::tls::Tls::for_jobs(&cfg.data_dir, ip, &cfg.region)?;
    cfg.jobs_endpoint = Some(at);
    tracing::info!(
        "jobs reach this server by the service's host names ({}) at {at}",
        trainyard_server::tls::service_names(&cfg.region).join(", ")
    );
    Ok(Some((listener, jobs_tls)))
}
