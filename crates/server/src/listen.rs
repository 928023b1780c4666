//! The HTTP listener: an accept loop on hyper's HTTP/1 and HTTP/2 servers (HTTP/2 for
//! gRPC: ALPN `h2` over TLS, prior knowledge on a plain listener), with TLS when `[tls]` is
//! on, and limits against slow, idle and too many clients.
//!
//! - A request head (request line and headers) must arrive within `header_timeout` of its
//!   first byte, or of the connection's start: a client that trickles a head byte by byte
//!   is closed all the same.
//! - A request body must arrive within `body_timeout` of its head; a late body is an error
//!   for the handler (400) and the connection is closed.
//!   Object uploads (`/upload/storage/...`) may take longer: theirs is an error only when no
//!   part of it arrives for `body_timeout`.
//! - A keep-alive connection with no request is closed after `idle_timeout`, and so is a
//!   connection whose client has not taken any of the response for that long.
//! - At most `max_connections` connections are served at once; further clients wait in the
//!   kernel's listen backlog until one closes. Each connection carries a
//!   [`crate::shares::ConnectionShare`], the project it is counted for, so that one
//!   project cannot hold them all (`limits.max_connections_per_project`).
//! - Accept errors such as EMFILE (no file descriptor left) are tried again after a short
//!   backoff (10 ms doubling to 1 s) and logged at most every 5 s, never a busy loop and
//!   never the end of the server.
//! - At shutdown the listener closes, idle connections close, requests in flight finish,
//!   and whatever still runs after `shutdown_grace` (a `follow=true` log stream) is cut.
//!
//! - A client that begins a TLS handshake on a plain-HTTP port (the Vertex AI SDK with
//!   its default gRPC transport) is told of in the server's log, with what to change; it
//!   itself only sees its handshake fail. A client that sends plain HTTP to a TLS port gets
//!   a 400 that says to use https, and the connection closes.
//! - With TLS, the handshake must end within `header_timeout` of the connection's start.
//! - gRPC requests (`content-type: application/grpc...`) go to [`crate::grpc`], the rest to
//!   the REST router.
//!
//! One watcher per connection holds the deadlines: the connection's I/O and its requests
//! tell it where the connection is (waiting for a head, serving a request, idle), and it
//! drops the connection when the deadline of that state passes.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tower::ServiceExt;

/// A request that came in on the jobs' listener (`[tls] jobs_address`, reached through
/// the managed service's host names in jobs' hosts files).
#[derive(Clone, Copy, Debug)]
pub struct JobsListener;

/// Limits of the API's connections (`[http]` in the config).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    pub header_timeout: Duration,
    pub body_timeout: Duration,
    pub idle_timeout: Duration,
    pub max_connections: usize,
    pub shutdown_grace: Duration,
    /// Requests whose path starts with one of these (object uploads) may take longer than
    /// `body_timeout`: their bodies are only cut when they stall that long.
    pub stall_only_prefixes: Vec<&'static str>,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(60),
            max_connections: 1024,
            shutdown_grace: Duration::from_secs(5),
            stall_only_prefixes: Vec::new(),
        }
    }
}

/// Serve `app` on `listener` until `shutdown` completes, then close the listener, let the
/// requests in flight finish for up to `limits.shutdown_grace`, cut the rest and return.
pub async fn serve(
    listener: TcpListener,
    app: axum::Router,
    limits: Limits,
    tls: Option<Arc<crate::tls::Tls>>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    let permits = Arc::new(Semaphore::new(limits.max_connections.clamp(1, Semaphore::MAX_PERMITS)));
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut conns = JoinSet::new();
    let mut shutdown = std::pin::pin!(shutdown);
    let mut failures = 0;
    let mut last_accept_warning: Option<Instant> = None;
    let mut last_full_warning: Option<Instant> = None;
    loop {
        while conns.try_join_next().is_some() {}
        if permits.available_permits() == 0 && due(&mut last_full_warning) {
            tracing::warn!(
                "{} connections open, the limit (http.max_connections): new clients wait until one closes",
                limits.max_connections
            );
        }
        let permit = tokio::select! {
            biased;
            _ = &mut shutdown => break,
            p = Arc::clone(&permits).acquire_owned() => match p {
                Ok(p) => p,
                // The semaphore is never closed.
                Err(_) => break,
            },
        };
        let accepted = tokio::select! {
            biased;
            _ = &mut shutdown => break,
            r = listener.accept() => r,
        };
        match accepted {
            Ok((stream, peer)) => {
                failures = 0;
                // Every response goes out at once: with Nagle's algorithm the last piece of
                // a chunked body waits for the client's delayed acknowledgement (about 40 ms
                // on a kept-alive connection, per request or per followed log line).
                if let Err(e) = stream.set_nodelay(true) {
                    tracing::debug!("TCP_NODELAY: {e}");
                }
                conns.spawn(connection(stream, peer, app.clone(), limits.clone(), tls.clone(), stop_rx.clone(), permit));
            }
            // The client went away before it was accepted: nothing to wait for.
            Err(e) if is_connection_error(&e) => {}
            Err(e) => {
                failures += 1;
                let backoff = ACCEPT_RETRY.pause(failures);
                if due(&mut last_accept_warning) {
                    tracing::warn!("cannot accept connections: {e}; trying again in {} ms", backoff.as_millis());
                }
                tokio::select! {
                    biased;
                    _ = &mut shutdown => break,
                    _ = tokio::time::sleep(backoff) => {}
                }
            }
        }
    }
    // New clients are refused from here on.
    drop(listener);
    let _ = stop_tx.send(true);
    let open = conns.len();
    let drained =
        tokio::time::timeout(limits.shutdown_grace, async { while conns.join_next().await.is_some() {} }).await;
    if drained.is_err() {
        tracing::info!(
            "{} of {open} connections still busy {} ms after shutdown began (log streams): closing them",
            conns.len(),
            limits.shutdown_grace.as_millis()
        );
        conns.shutdown().await;
    }
    Ok(())
}

/// Rate limit of repeated warnings: true at most once per 5 s.
fn due(last: &mut Option<Instant>) -> bool {
    if last.is_some_and(|t| t.elapsed() < Duration::from_secs(5)) {
        return false;
    }
    *last = Some(Instant::now());
    true
}

/// Errors of one connection (not of the listener) that `accept` may report.
fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused | io::ErrorKind::ConnectionAborted | io::ErrorKind::ConnectionReset
    )
}

/// Serve one connection until it ends, a deadline passes, or shutdown (gracefully).
async fn connection(
    stream: TcpStream,
    peer: std::net::SocketAddr,
    app: axum::Router,
    limits: Limits,
    tls: Option<Arc<crate::tls::Tls>>,
    stop: watch::Receiver<bool>,
    _permit: OwnedSemaphorePermit,
) {
    let watch = Arc::new(Watch::new());
    let Some(tls) = tls else {
        let io = TokioIo::new(Watched { inner: stream, watch: Arc::clone(&watch) });
        serve_connection(io, app, &limits, &watch, false, false, stop).await;
        if watch.tls_hello.load(Ordering::SeqCst) {
            tls_client(peer);
        }
        return;
    };
    // A TLS port: a client that speaks plain HTTP is told so, not left to time out.
    let mut first = [0u8; 1];
    match tokio::time::timeout(limits.header_timeout, stream.peek(&mut first)).await {
        Ok(Ok(1)) if first[0] == TLS_HANDSHAKE_RECORD => {}
        Ok(Ok(1)) => return refuse_plain_http(stream, &tls).await,
        _ => return,
    }
    let handshake = tls.acceptor().accept(Watched { inner: stream, watch: Arc::clone(&watch) });
    let stream = match tokio::time::timeout(limits.header_timeout, handshake).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            tracing::debug!("TLS handshake with {peer} failed: {e}");
            return;
        }
        Err(_) => {
            tracing::debug!("TLS handshake with {peer} did not end in time");
            return;
        }
    };
    if stream.get_ref().1.alpn_protocol() == Some(b"h2") {
        watch.http2.store(true, Ordering::SeqCst);
    }
    let for_jobs = tls.serves_jobs();
    serve_connection(TokioIo::new(stream), app, &limits, &watch, true, for_jobs, stop).await;
}

/// Serve HTTP/1 or HTTP/2 (by the client's preface) on `io` until it ends, its deadline
/// passes or shutdown. On a TLS connection (`https`), requests carry
/// `x-forwarded-proto: https` (whatever the client said), so that the links the server
/// gives (Cloud Storage's `selfLink`, `mediaLink`, upload sessions) are https; an HTTP/2
/// request's `:authority` is its `Host`.
async fn serve_connection<I>(
    io: I,
    app: axum::Router,
    limits: &Limits,
    watch: &Arc<Watch>,
    https: bool,
    for_jobs: bool,
    mut stop: watch::Receiver<bool>,
)
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let body_timeout = limits.body_timeout;
    let stall_only_prefixes = limits.stall_only_prefixes.clone();
    let service_watch = Arc::clone(watch);
    // The project this connection is counted for ([`crate::shares`]), for as long as it lives.
    let share = Arc::new(crate::shares::ConnectionShare::default());
    let service = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
        let app = app.clone();
        let watch = Arc::clone(&service_watch);
        req.extensions_mut().insert(Arc::clone(&share));
        if https {
            req.headers_mut().insert("x-forwarded-proto", axum::http::HeaderValue::from_static("https"));
        }
        if for_jobs {
            req.extensions_mut().insert(JobsListener);
        }
        if !req.headers().contains_key(axum::http::header::HOST) {
            if let Some(host) = req.uri().authority().and_then(|a| axum::http::HeaderValue::from_str(a.as_str()).ok()) {
                req.headers_mut().insert(axum::http::header::HOST, host);
            }
        }
        watch.begin();
        let timer = (!req.body().is_end_stream()).then(|| Box::pin(tokio::time::sleep(body_timeout)));
        // Uploads of objects may take longer than the body timeout: theirs only stall.
        let stall_only = stall_only_prefixes.iter().any(|p| req.uri().path().starts_with(p));
        let req = req.map(|inner| axum::body::Body::new(TimedBody { inner, timer, limit: body_timeout, stall_only }));
        async move {
            let response = if crate::grpc::is_grpc(&req) { Ok(crate::grpc::handle(app, req).await) } else { app.oneshot(req).await };
            response.map(|r| r.map(|inner| EndNotice { inner, watch }))
        }
    });
    let mut builder = hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new());
    // The watcher keeps the head deadline (hyper's own also starts on idle connections).
    builder.http1().keep_alive(true).header_read_timeout(None);
    // With upgrades: a session in a replica (`.../exec`) is a WebSocket.
    let conn = builder.serve_connection_with_upgrades(io, service);
    let mut conn = std::pin::pin!(conn);
    let mut stopping = false;
    loop {
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(e) = r {
                    tracing::debug!("connection ended: {e}");
                }
                break;
            }
            why = watch.expired(limits), if !stopping => {
                // An idle HTTP/2 connection is told so (GOAWAY): its client opens a new
                // one for its next call rather than sending it into a closed socket.
                if why == IDLE_WHY && watch.http2.load(Ordering::SeqCst) {
                    tracing::debug!("closing an HTTP/2 connection: {why}");
                    stopping = true;
                    conn.as_mut().graceful_shutdown();
                    continue;
                }
                tracing::debug!("closing a connection: {why}");
                break;
            }
            _ = stop.wait_for(|s| *s), if !stopping => {
                stopping = true;
                conn.as_mut().graceful_shutdown();
            }
        }
    }
}

/// Plain HTTP on a TLS port: a 400 in the API's error format that says what to use.
async fn refuse_plain_http(mut stream: TcpStream, tls: &crate::tls::Tls) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // What the client sent is read first (a close with unread data would reset the
    // connection before the client reads the answer).
    let mut head = vec![0u8; 8192];
    let mut got = 0;
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        while got < head.len() && !head[..got].windows(4).any(|w| w == b"\r\n\r\n") {
            match stream.read(&mut head[got..]).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got += n,
            }
        }
    })
    .await;
    let trust = tls.ca_file().map(|ca| format!(", trusting {} (curl --cacert, REQUESTS_CA_BUNDLE)", ca.display())).unwrap_or_default();
    let message = format!("this server speaks HTTPS only: use https:// instead of http://{trust}");
    let body = serde_json::json!({"error": {"code": 400, "message": message, "status": "FAILED_PRECONDITION"}}).to_string();
    let reply = format!(
        "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout(Duration::from_secs(1), stream.write_all(reply.as_bytes())).await;
    let _ = stream.shutdown().await;
}

/// Connections whose first byte began a TLS handshake (see [`tls_client`]).
pub static TLS_HANDSHAKES: AtomicU64 = AtomicU64::new(0);

/// A client spoke TLS to this plain-HTTP port: said in the server's log (at most every 5
/// s), since all the client itself can show is a failed handshake.
fn tls_client(peer: std::net::SocketAddr) {
    static LAST: std::sync::Mutex<Option<Instant>> = std::sync::Mutex::new(None);
    TLS_HANDSHAKES.fetch_add(1, Ordering::Relaxed);
    let due = LAST.lock().map(|mut last| due(&mut last)).unwrap_or(false);
    if due {
        tracing::warn!(
            "a client at {peer} began a TLS handshake on this port, which serves plain HTTP: it sees \"Ssl handshake failed ... \
             WRONG_VERSION_NUMBER\". The Vertex AI SDK does this with its default transport (gRPC over TLS): start the \
             server with TLS ([tls] auto = true, or trainyard serve --tls-auto) and give the client its CA \
             (GRPC_DEFAULT_SSL_ROOTS_FILE_PATH), or pass api_transport=\"rest\" and api_endpoint=\"http://HOST:PORT\" to aiplatform.init"
        );
    }
}

/// An accept that failed (out of descriptors) is tried again after 10 ms, doubling, at
/// most 1 s.
const ACCEPT_RETRY: trainyard_core::retry::Backoff = trainyard_core::retry::Backoff::of(Duration::from_millis(10), Duration::from_secs(1));

/// The first byte of a TLS handshake record (a ClientHello); no HTTP request starts with it.
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// Why an idle connection is closed.
const IDLE_WHY: &str = "idle";

/// Where a connection is: waiting for (or reading) a request head, serving a request, or
/// idle between requests.
const HEAD: u64 = 0;
const BUSY: u64 = 1;
const IDLE: u64 = 2;

/// The state of one connection, shared by its I/O, its requests and its watcher.
struct Watch {
    epoch: Instant,
    /// `(milliseconds since epoch when the phase began) << 2 | phase`.
    state: AtomicU64,
    /// 0, or 1 + the milliseconds since epoch when a write began to wait for the client.
    write_blocked: AtomicU64,
    notify: Notify,
    /// Has the connection's first byte been read, and was it a TLS handshake record's
    /// (0x16)?
    first_read: std::sync::atomic::AtomicBool,
    tls_hello: std::sync::atomic::AtomicBool,
    /// An HTTP/2 connection: its requests overlap, and frames between them (pings,
    /// settings) begin no request head.
    http2: std::sync::atomic::AtomicBool,
    /// Requests being served.
    busy: AtomicU64,
}

impl Watch {
    fn new() -> Watch {
        Watch {
            epoch: Instant::now(),
            state: AtomicU64::new(HEAD),
            write_blocked: AtomicU64::new(0),
            notify: Notify::new(),
            first_read: std::sync::atomic::AtomicBool::new(false),
            tls_hello: std::sync::atomic::AtomicBool::new(false),
            http2: std::sync::atomic::AtomicBool::new(false),
            busy: AtomicU64::new(0),
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX >> 2)
    }

    fn set(&self, phase: u64) {
        self.state.store(self.now_ms() << 2 | phase, Ordering::SeqCst);
        self.notify.notify_one();
    }

    /// A request begins.
    fn begin(&self) {
        self.busy.fetch_add(1, Ordering::SeqCst);
        self.set(BUSY);
    }

    /// A request's response is done with: the connection is idle once none is left.
    fn end(&self) {
        if self.busy.fetch_sub(1, Ordering::SeqCst) <= 1 {
            self.set(IDLE);
        }
    }

    /// Bytes came in: on an idle HTTP/1 connection, a new request head begins.
    fn bytes_read(&self) {
        let s = self.state.load(Ordering::SeqCst);
        if s & 3 == IDLE
            && !self.http2.load(Ordering::SeqCst)
            && self.state.compare_exchange(s, self.now_ms() << 2 | HEAD, Ordering::SeqCst, Ordering::SeqCst).is_ok()
        {
            self.notify.notify_one();
        }
    }

    /// A write went through, or waits for the client to read.
    fn wrote(&self, waiting: bool) {
        if waiting {
            if self.write_blocked.load(Ordering::SeqCst) == 0 {
                self.write_blocked.store(self.now_ms() + 1, Ordering::SeqCst);
                self.notify.notify_one();
            }
        } else if self.write_blocked.load(Ordering::SeqCst) != 0 {
            self.write_blocked.store(0, Ordering::SeqCst);
        }
    }

    /// Completes when the deadline of the connection's current state passes, with why.
    async fn expired(&self, limits: &Limits) -> &'static str {
        loop {
            let s = self.state.load(Ordering::SeqCst);
            let since = s >> 2;
            let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX >> 4);
            let mut deadline = match s & 3 {
                HEAD => Some((since.saturating_add(ms(limits.header_timeout)), "no complete request head in time")),
                IDLE => Some((since.saturating_add(ms(limits.idle_timeout)), IDLE_WHY)),
                _ => None,
            };
            let blocked = self.write_blocked.load(Ordering::SeqCst);
            if blocked != 0 {
                let d = (blocked - 1).saturating_add(ms(limits.idle_timeout));
                if deadline.is_none_or(|(e, _)| d < e) {
                    deadline = Some((d, "the client takes none of the response"));
                }
            }
            match deadline {
                Some((d, why)) if d <= self.now_ms() => return why,
                Some((d, _)) => {
                    let at = self.epoch + Duration::from_millis(d);
                    tokio::select! {
                        _ = tokio::time::sleep_until(at.into()) => {}
                        _ = self.notify.notified() => {}
                    }
                }
                None => self.notify.notified().await,
            }
        }
    }
}

/// A connection's socket that reports its reads and blocked writes to the watcher.
struct Watched {
    inner: TcpStream,
    watch: Arc<Watch>,
}

impl AsyncRead for Watched {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            if !self.watch.first_read.swap(true, Ordering::SeqCst) {
                let first = &buf.filled()[before..];
                if first[0] == TLS_HANDSHAKE_RECORD {
                    self.watch.tls_hello.store(true, Ordering::SeqCst);
                } else if first.starts_with(b"PRI ") {
                    // The HTTP/2 connection preface (h2c with prior knowledge).
                    self.watch.http2.store(true, Ordering::SeqCst);
                }
            }
            self.watch.bytes_read();
        }
        r
    }
}

impl AsyncWrite for Watched {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.watch.wrote(r.is_pending());
        r
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.watch.wrote(r.is_pending());
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A request body that must arrive before its timer runs out.
struct TimedBody {
    inner: Incoming,
    /// None for a request without a body.
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    limit: Duration,
    /// The timer starts again with each part of the body that arrives (a large upload
    /// must keep coming, not arrive whole within `limit`).
    stall_only: bool,
}

/// The error of a body that did not arrive in time.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive within {} s", .0.as_secs_f64())]
pub struct BodyTimeout(Duration);

impl Body for TimedBody {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if this.stall_only {
                    if let Some(t) = this.timer.as_mut() {
                        let deadline = tokio::time::Instant::now() + this.limit;
                        // Moved at most every 100 ms: a frame is often a few KiB.
                        if deadline > t.deadline() + Duration::from_millis(100) {
                            t.as_mut().reset(deadline);
                        }
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => {
                this.timer = None;
                Poll::Ready(None)
            }
            Poll::Pending => {
                let late = this.timer.as_mut().is_some_and(|t| t.as_mut().poll(cx).is_ready());
                if late {
                    Poll::Ready(Some(Err(BodyTimeout(this.limit).into())))
                } else {
                    Poll::Pending
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A response body that tells the watcher when it is done with (sent, or dropped).
struct EndNotice {
    inner: axum::body::Body,
    watch: Arc<Watch>,
}

impl Drop for EndNotice {
    fn drop(&mut self) {
        self.watch.end();
    }
}

impl Body for EndNotice {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
