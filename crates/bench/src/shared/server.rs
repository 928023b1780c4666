//! A `trainyard serve` for a bench: the real binary on a free loopback port with a config
//! file and a data directory, images run on the host (`TRAINYARD_CONTAINER_ENGINE=none`),
//! waited for until `/healthz` answers, killed when dropped.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

pub struct Server {
    pub child: Child,
    /// `http://127.0.0.1:PORT`.
    pub base: String,
}

impl Server {
    /// Starts `exe serve` with `config` and `data_dir`; `configure` adds what the bench
    /// wants of the process (environment, working directory, where its output goes:
    /// nowhere unless it says). Waits up to `wait` for `/healthz` (a server recovering a
    /// long queue takes a while); a server that exits meanwhile is an error at once.
    pub fn start(exe: &Path, config: &Path, data_dir: &Path, wait: Duration, configure: impl FnOnce(&mut Command)) -> Result<Server> {
        let port = free_port()?;
        let mut cmd = Command::new(exe);
        cmd.args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--config"])
            .arg(config)
            .arg("--data-dir")
            .arg(data_dir)
            .env("TRAINYARD_CONTAINER_ENGINE", "none")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        configure(&mut cmd);
        let child = cmd.spawn().with_context(|| format!("starting {} (build it: cargo build --release -p trainyard)", exe.display()))?;
        let mut server = Server { child, base: format!("http://127.0.0.1:{port}") };
        let agent = agent();
        let deadline = Instant::now() + wait;
        while Instant::now() < deadline {
            if let Some(status) = server.child.try_wait()? {
                bail!("the server exited ({status}) before it answered");
            }
            if agent.get(&format!("{}/healthz", server.base)).call().is_ok_and(|r| r.status().is_success()) {
                return Ok(server);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        server.stop();
        bail!("the server did not answer /healthz within {} s", wait.as_secs())
    }

    /// The server's user + system CPU time so far, in seconds.
    #[allow(dead_code)] // not every bench reads it
    pub fn cpu_secs(&self) -> Result<f64> {
        // utime is the 12th field after the command name, stime the 13th.
        stat_secs(self.child.id(), &[11, 12])
    }

    /// The user + system CPU time of the server's descendants so far, in seconds: those
    /// it reaped (with theirs), and its live children with what they reaped (the fork
    /// server and the supervisors it reaped). For the local backend, the replicas'
    /// supervisors and programs.
    #[allow(dead_code)] // not every bench reads it
    pub fn descendants_cpu_secs(&self) -> Result<f64> {
        let pid = self.child.id();
        // cutime is the 14th field after the command name, cstime the 15th.
        let mut secs = stat_secs(pid, &[13, 14])?;
        for task in std::fs::read_dir(format!("/proc/{pid}/task")).context("listing the server's threads")?.flatten() {
            let children = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
            for child in children.split_whitespace().filter_map(|c| c.parse::<u32>().ok()) {
                // A child that ended meanwhile counts once it is reaped.
                secs += stat_secs(child, &[11, 12, 13, 14]).unwrap_or(0.0);
            }
        }
        Ok(secs)
    }

    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

pub fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
    Ok(l.local_addr()?.port())
}

/// A client that gives error statuses back as answers, not as errors.
pub fn agent() -> ureq::Agent {
    ureq::Agent::config_builder().http_status_as_error(false).build().into()
}

/// `n` POSTs of `body(client, i)` to `url` from `clients` threads with keep-alive
/// connections, each waiting for its reply before the next; the latency of each in ms,
/// sorted. A reply that is not a success is an error.
#[allow(dead_code)] // not every bench creates jobs
pub fn timed_posts(url: &str, clients: usize, n: usize, body: impl Fn(usize, usize) -> String + Send + Sync + 'static) -> Result<Vec<f64>> {
    let url = std::sync::Arc::new(url.to_string());
    let body = std::sync::Arc::new(body);
    let handles: Vec<_> = (0..clients)
        .map(|c| {
            let (url, body) = (std::sync::Arc::clone(&url), std::sync::Arc::clone(&body));
            let count = n / clients + usize::from(c < n % clients);
            std::thread::spawn(move || -> Result<Vec<f64>> {
                let agent = agent();
                let mut lat = Vec::with_capacity(count);
                for i in 0..count {
                    let text = body(c, i);
                    let t = Instant::now();
                    let mut resp = agent.post(url.as_str()).header("Content-Type", "application/json").send(text.as_bytes()).with_context(|| format!("POST {url}"))?;
                    let status = resp.status();
                    let reply = resp.body_mut().read_to_string().context("reading the reply")?;
                    lat.push(t.elapsed().as_secs_f64() * 1000.0);
                    if !status.is_success() {
                        bail!("POST {url} answered {status}: {reply}");
                    }
                }
                Ok(lat)
            })
        })
        .collect();
    let mut lat = Vec::with_capacity(n);
    for h in handles {
        lat.extend(h.join().map_err(|_| anyhow::anyhow!("a client thread panicked"))??);
    }
    lat.sort_by(f64::total_cmp);
    Ok(lat)
}

/// The `p` quantile of sorted samples (nearest rank).
#[allow(dead_code)]
pub fn quantile(sorted: &[f64], p: f64) -> f64 {
    sorted.get(((sorted.len() as f64 - 1.0) * p).round() as usize).copied().unwrap_or(f64::NAN)
}

/// The sum of clock-tick fields of `/proc/PID/stat` (counted from 0 after the command
/// name, which ends with ')'), in seconds.
fn stat_secs(pid: u32, fields: &[usize]) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).with_context(|| format!("reading /proc/{pid}/stat"))?;
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = fields.iter().map(|&i| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0)).sum();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Ok(ticks / hz.max(1.0))
}
