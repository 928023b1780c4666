//! `trainyard custom-jobs exec JOB [--replica NAME] [--tty | --no-tty] [-- CMD ARGS...]`: a
//! command, or a shell on a terminal, inside a running replica (`kubectl exec`, `srun
//! --overlap --pty`), over the server's session WebSocket ([`trainyard_api::exec`],
//! docs/exec.md).
//!
//! With no command, or with `--tty`, the session is a terminal: this one is put in raw
//! mode (restored at the end, however it ends), its size is sent and sent again when it
//! changes, and every key (Ctrl-C, Ctrl-D included) goes to the replica. Otherwise the
//! command's stdout and stderr come back on this process's own, and its exit status is
//! this process's (128 + N for a signal), so that pipes work both ways.

use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{bail, Context};
use futures_util::{SinkExt, StreamExt};
use tokio::io::AsyncReadExt;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;
use trainyard_api::exec::{Size, Status, RESIZE, STATUS, STDERR, STDIN, STDOUT};

/// Where the session goes and how it is trusted and authorised (from the client's target).
pub struct Endpoint {
    /// The server's address as given (for messages).
    pub server: String,
    pub token: Option<String>,
    /// `--ca-file`'s certificates (DER); None: the public CAs.
    pub roots: Option<Vec<Vec<u8>>>,
    /// An error answer (status, body, URL) as the client says it, with its fixes.
    pub refusal: Box<dyn Fn(u16, &str, &str) -> String + Send + Sync>,
}

/// Exit status when the session ended without its command's (the replica ended, the
/// server refused or went away), as `ssh` does.
const EXIT_NO_STATUS: u8 = 255;

/// How the session's terminal is chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TtyChoice {
    /// A terminal when there is no command and this side has one.
    Auto,
    On,
    Off,
}

/// Opens the session and bridges it to this process's terminal or streams.
pub fn run(api: &Endpoint, job_url: &str, replica: Option<&str>, tty: TtyChoice, argv: &[String]) -> anyhow::Result<ExitCode> {
    let here = std::io::stdin().is_terminal() && std::io::stdout().is_terminal();
    let tty = match tty {
        TtyChoice::On => true,
        TtyChoice::Off => false,
        TtyChoice::Auto => argv.is_empty() && here,
    };
    if tty && !std::io::stdin().is_terminal() {
        bail!("--tty: standard input is not a terminal (leave --tty out, or run from a terminal)");
    }
    let size = if tty { terminal_size() } else { None };
    let url = session_url(job_url, "exec", replica, argv, tty.then(|| (size, std::env::var("TERM").ok())))?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting the session's runtime")?;
    let status = rt.block_on(session(api, &url, tty))?;
    // The runtime's blocking reader of stdin may still wait for a key: not waited for.
    rt.shutdown_background();
    if let Some(e) = &status.error {
        eprintln!("trainyard: {} ({})", e.message, e.status);
        return Ok(ExitCode::from(EXIT_NO_STATUS));
    }
    if !status.message.is_empty() {
        eprintln!("trainyard: {}", status.message);
    }
    Ok(ExitCode::from(u8::try_from(status.shell_status()).unwrap_or(EXIT_NO_STATUS)))
}

/// `ws(s)://.../customJobs/ID/ENDPOINT?replica=...&command=...&tty=true&cols=&rows=&term=`
/// (ENDPOINT: `exec` or `portForward`).
fn session_url(job_url: &str, endpoint: &str, replica: Option<&str>, argv: &[String], tty: Option<(Option<Size>, Option<String>)>) -> anyhow::Result<String> {
    use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};
    let ws = if let Some(rest) = job_url.strip_prefix("https://") {
        format!("wss://{rest}")
    } else if let Some(rest) = job_url.strip_prefix("http://") {
        format!("ws://{rest}")
    } else {
        bail!("{job_url}: the server's address must start with http:// or https://");
    };
    let mut q: Vec<String> = Vec::new();
    let enc = |v: &str| utf8_percent_encode(v, NON_ALPHANUMERIC).to_string();
    if let Some(r) = replica {
        q.push(format!("replica={}", enc(r)));
    }
    for a in argv {
        if a.contains('\0') {
            bail!("the command's argument {a:?} holds a NUL byte");
        }
        q.push(format!("command={}", enc(a)));
    }
    if let Some((size, term)) = tty {
        q.push("tty=true".into());
        if let Some(s) = size {
            q.push(format!("cols={}&rows={}", s.cols, s.rows));
        }
        if let Some(t) = term.filter(|t| !t.is_empty() && t.chars().all(|c| c.is_ascii_alphanumeric() || "-_.+".contains(c))) {
            q.push(format!("term={}", enc(&t)));
        }
    }
    Ok(format!("{ws}/{endpoint}{}{}", if q.is_empty() { "" } else { "?" }, q.join("&")))
}

/// The session, from the handshake to its status.
async fn session(api: &Endpoint, url: &str, tty: bool) -> anyhow::Result<Status> {
    let ws = connect(api, url).await?;
    bridge(ws, tty).await
}

/// A stream a WebSocket runs on: TCP, or TLS over it.
trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Io for T {}

type Socket = tokio_tungstenite::WebSocketStream<Box<dyn Io>>;

/// The WebSocket handshake of a session's URL; an error answer says what the API said.
async fn connect(api: &Endpoint, url: &str) -> anyhow::Result<Socket> {
    let mut request = url.into_client_request().with_context(|| format!("{url}: not a valid session URL"))?;
    if let Some(t) = &api.token {
        let v = format!("Bearer {t}").parse().context("the token cannot be sent in a header")?;
        request.headers_mut().insert("Authorization", v);
    }
    let uri = request.uri().clone();
    let host = uri.host().unwrap_or("").trim_start_matches('[').trim_end_matches(']').to_string();
    let secure = uri.scheme_str() == Some("wss");
    let port = uri.port_u16().unwrap_or(if secure { 443 } else { 80 });
    let tcp = tokio::net::TcpStream::connect((host.as_str(), port))
        .await
        .with_context(|| format!("cannot reach the Trainyard server at {} (set --server or TRAINYARD_SERVER)", api.server))?;
    let _ = tcp.set_nodelay(true);
    let http_url = url.replacen("ws", "http", 1);
    let refused = |e: tokio_tungstenite::tungstenite::Error| -> anyhow::Error {
        match e {
            tokio_tungstenite::tungstenite::Error::Http(resp) => {
                let body = resp.body().as_deref().map(String::from_utf8_lossy).unwrap_or_default().to_string();
                anyhow::anyhow!("{}", (api.refusal)(resp.status().as_u16(), &body, &http_url))
            }
            other => anyhow::anyhow!("the session could not be opened at {}: {other}", api.server),
        }
    };
    if secure {
        let config = tls_config(api)?;
        let name = rustls::pki_types::ServerName::try_from(host.clone()).with_context(|| format!("{host:?} is not a server name"))?;
        let stream = tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(name, tcp)
            .await
            .with_context(|| format!("TLS with {} failed (is --ca-file, TRAINYARD_CA_FILE, the server's CA?)", api.server))?;
        let io: Box<dyn Io> = Box::new(stream);
        Ok(tokio_tungstenite::client_async(request, io).await.map_err(refused)?.0)
    } else {
        let io: Box<dyn Io> = Box::new(tcp);
        Ok(tokio_tungstenite::client_async(request, io).await.map_err(refused)?.0)
    }
}

/// The roots an https server is trusted by: `--ca-file`'s, else the public CAs.
fn tls_config(api: &Endpoint) -> anyhow::Result<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    match &api.roots {
        Some(certs) => {
            for c in certs {
                roots.add(rustls::pki_types::CertificateDer::from(c.clone())).context("--ca-file: a certificate it holds")?;
            }
        }
        None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
    }
    let config = rustls::ClientConfig::builder_with_provider(trainyard_server::tls::provider())
        .with_safe_default_protocol_versions()
        .context("TLS versions")?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(config)
}

/// This terminal in raw mode until dropped.
struct RawMode(Option<nix::sys::termios::Termios>);

impl RawMode {
    fn on() -> RawMode {
        let stdin = std::io::stdin();
        let Ok(saved) = nix::sys::termios::tcgetattr(&stdin) else { return RawMode(None) };
        let mut raw = saved.clone();
        nix::sys::termios::cfmakeraw(&mut raw);
        match nix::sys::termios::tcsetattr(&stdin, nix::sys::termios::SetArg::TCSANOW, &raw) {
            Ok(()) => RawMode(Some(saved)),
            Err(_) => RawMode(None),
        }
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        if let Some(saved) = &self.0 {
            let _ = nix::sys::termios::tcsetattr(std::io::stdin(), nix::sys::termios::SetArg::TCSANOW, saved);
        }
    }
}

/// This terminal's size (of standard output), if it has one.
fn terminal_size() -> Option<Size> {
    let mut ws = nix::libc::winsize { ws_row: 0, ws_col: 0, ws_xpixel: 0, ws_ypixel: 0 };
    // SAFETY: TIOCGWINSZ fills a winsize that lives across the call.
    let ok = unsafe { nix::libc::ioctl(1, nix::libc::TIOCGWINSZ, &mut ws) } == 0;
    (ok && ws.ws_col > 0 && ws.ws_row > 0).then(|| Size { cols: ws.ws_col.into(), rows: ws.ws_row.into() })
}

fn frame(channel: u8, data: &[u8]) -> Message {
    Message::Binary(trainyard_api::exec::frame(channel, data).into())
}

async fn bridge(ws: Socket, tty: bool) -> anyhow::Result<Status> {
    let _raw = tty.then(RawMode::on);
    let (mut sink, mut stream) = ws.split();
    let mut stdin = tokio::io::stdin();
    let mut stdin_open = true;
    let mut buf = vec![0u8; 16 * 1024];
    let mut winch = match tty {
        true => Some(tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change()).context("watching the terminal's size")?),
        false => None,
    };
    let mut status = None;
    loop {
        tokio::select! {
            n = stdin.read(&mut buf), if stdin_open => {
                let n = n.unwrap_or(0);
                if n == 0 {
                    stdin_open = false;
                }
                // An empty payload is the end of input.
                if sink.send(frame(STDIN, &buf[..n])).await.is_err() {
                    break;
                }
            }
            Some(()) = async { match winch.as_mut() { Some(w) => w.recv().await, None => std::future::pending().await } } => {
                if let Some(size) = terminal_size() {
                    let payload = serde_json::to_vec(&size).unwrap_or_default();
                    let _ = sink.send(frame(RESIZE, &payload)).await;
                }
            }
            msg = stream.next() => match msg {
                Some(Ok(Message::Binary(b))) => match b.split_first() {
                    Some((&STDOUT, data)) => {
                        let mut out = std::io::stdout().lock();
                        let _ = out.write_all(data);
                        let _ = out.flush();
                    }
                    Some((&STDERR, data)) => {
                        let mut err = std::io::stderr().lock();
                        let _ = err.write_all(data);
                        let _ = err.flush();
                    }
                    Some((&STATUS, data)) => {
                        status = serde_json::from_slice::<Status>(data).ok();
                    }
                    _ => {}
                },
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
                Some(Ok(_)) => {}
            },
        }
    }
    drop(_raw);
    Ok(status.unwrap_or_else(|| Status {
        message: "the session ended without its command's status (the server or the connection went away)".into(),
        ..Status::default()
    }))
}

/// `custom-jobs port-forward`: connections to `address:local` each become a session to
/// port `remote` of the replica's loopback, until Ctrl-C.
pub fn port_forward(api: Endpoint, job_url: &str, replica: Option<&str>, address: &str, local: u16, remote: u16) -> anyhow::Result<ExitCode> {
    let ws = session_url(job_url, "portForward", replica, &[], None)?;
    let url = format!("{ws}{}port={remote}", if ws.contains('?') { "&" } else { "?" });
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting the forwarder's runtime")?;
    let api = Arc::new(api);
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind((address, local)).await.with_context(|| format!("cannot listen on {address}:{local}"))?;
        let bound = listener.local_addr().context("the local address")?;
        println!("Forwarding from {bound} to port {remote} of replica {} (Ctrl-C to stop)", replica.unwrap_or(trainyard_api::exec::DEFAULT_REPLICA));
        let _ = std::io::stdout().flush();
        loop {
            tokio::select! {
                accepted = listener.accept() => {
                    let Ok((conn, peer)) = accepted else { continue };
                    let _ = conn.set_nodelay(true);
                    let (api, url) = (Arc::clone(&api), url.clone());
                    // Each connection its own session, side by side.
                    tokio::spawn(async move {
                        if let Err(e) = forward_one(&api, &url, conn).await {
                            eprintln!("trainyard: a connection from {peer}: {e:#}");
                        }
                    });
                }
                _ = tokio::signal::ctrl_c() => return Ok::<(), anyhow::Error>(()),
            }
        }
    })?;
    Ok(ExitCode::SUCCESS)
}

/// One local connection through its own session: its bytes in as input, the replica's
/// port's bytes out, until both sides are done.
async fn forward_one(api: &Endpoint, url: &str, conn: tokio::net::TcpStream) -> anyhow::Result<()> {
    use tokio::io::AsyncWriteExt;
    let ws = connect(api, url).await?;
    let (mut sink, mut stream) = ws.split();
    let (mut rd, mut wr) = conn.into_split();
    let mut buf = vec![0u8; 64 * 1024];
    let mut local_open = true;
    loop {
        tokio::select! {
            n = rd.read(&mut buf), if local_open => {
                let n = n.unwrap_or(0);
                if n == 0 {
                    local_open = false;
                }
                if sink.send(frame(STDIN, &buf[..n])).await.is_err() {
                    break;
                }
            }
            msg = stream.next() => match msg {
                Some(Ok(Message::Binary(b))) => match b.split_first() {
                    Some((&STDOUT, data)) => {
                        if wr.write_all(data).await.is_err() {
                            break;
                        }
                    }
                    Some((&STATUS, data)) => {
                        if let Some(e) = serde_json::from_slice::<Status>(data).ok().and_then(|s| s.error) {
                            bail!("{} ({})", e.message, e.status);
                        }
                    }
                    Some((&STDERR, data)) => eprint!("{}", String::from_utf8_lossy(data)),
                    _ => {}
                },
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
                Some(Ok(_)) => {}
            },
        }
    }
    let _ = wr.shutdown().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_session_url_carries_the_command_and_the_terminal() {
        let u = session_url(
            "http://127.0.0.1:8080/v1/projects/p/locations/l/customJobs/7",
            "exec",
            Some("workerpool1-0"),
            &["sh".into(), "-c".into(), "echo a&b".into()],
            None,
        )
        .unwrap();
        assert_eq!(u, "ws://127.0.0.1:8080/v1/projects/p/locations/l/customJobs/7/exec?replica=workerpool1%2D0&command=sh&command=%2Dc&command=echo%20a%26b");
        let t = session_url("https://h:1/x", "exec", None, &[], Some((Some(Size { cols: 80, rows: 24 }), Some("xterm-256color".into())))).unwrap();
        assert_eq!(t, "wss://h:1/x/exec?tty=true&cols=80&rows=24&term=xterm%2D256color");
        assert!(session_url("ftp://h/x", "exec", None, &[], None).is_err());
        assert!(session_url("http://h/x", "exec", None, &["a\0b".into()], None).is_err());
        assert_eq!(session_url("http://h/exec-proxy/x", "portForward", None, &[], None).unwrap(), "ws://h/exec-proxy/x/portForward");
    }
}
