//! The one way out of a job's network namespace: `[replicas] package_index`.
//!
//! With `network = "job"` a job's namespace has only a loopback interface, so a venv
//! build there would reach no index. The server listens on a Unix socket,
//! `<data_dir>/package-index.sock` (a path, so it is reached through the file system, not
//! the network: any namespace can connect to it), and acts as an HTTP proxy that lets
//! through requests to the index's host and port and nothing else:
//!
//! - `CONNECT host:port` (an `https://` index) is tunnelled when the authority is the
//!   index's;
//! - an absolute-form request (`GET http://host:port/path`, an `http://` index) is
//!   passed on in origin form, with `Connection: close`, when its host and port are the
//!   index's;
//! - anything else gets `403` with a line naming what may be reached.
//!
//! In the namespace, the build ([`crate::venv::BUILD_PROGRAM`]) forwards a loopback port
//! to the socket and gives it to pip as `PIP_PROXY`. A tenant's own program can use the
//! socket too; it reaches the index and nothing more, which is what `package_index` says
//! jobs may reach. Each connecting user has at most [`PER_USER`] connections at a time
//! (a tenant cannot take all of them), and a connection idle for [`IDLE`] is closed.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The socket's name in the data directory.
pub const SOCKET: &str = "package-index.sock";
/// Connections a user may have open at a time.
pub const PER_USER: usize = 16;
/// A connection with no byte either way for this long is closed.
pub const IDLE: Duration = Duration::from_secs(120);
/// The most a request's head may be.
const MAX_HEAD: usize = 16 * 1024;

/// The index's scheme, host and port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Index {
    pub https: bool,
    pub host: String,
    pub port: u16,
}

impl Index {
    /// The index of a `package_index` URL (None: "none", or not an http(s) URL).
    pub fn from_url(url: &str) -> Option<Index> {
        let uri: axum::http::Uri = url.parse().ok()?;
        let https = match uri.scheme_str()? {
            "https" => true,
            "http" => false,
            _ => return None,
        };
        let host = uri.host()?.trim_start_matches('[').trim_end_matches(']').to_ascii_lowercase();
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        Some(Index { https, host, port })
    }

    fn is(&self, host: &str, port: u16) -> bool {
        self.port == port && self.host.eq_ignore_ascii_case(host.trim_start_matches('[').trim_end_matches(']'))
    }

    fn shown(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }
}

/// What to do with a request's head.
#[derive(Debug, PartialEq, Eq)]
pub enum Decision {
    /// Tunnel to the index: reply 200, then pass bytes both ways.
    Tunnel,
    /// Send this head (origin form, `Connection: close`) to the index, then pass bytes.
    Forward(Vec<u8>),
    /// Reply 403 with this reason.
    Refuse(String),
    /// Not a whole head yet.
    Partial,
}

/// The decision for a request head (pure: the proxy's rule).
pub fn decide(head: &[u8], index: &Index) -> Decision {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut req = httparse::Request::new(&mut headers);
    let len = match req.parse(head) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Decision::Partial,
        Err(e) => return Decision::Refuse(format!("not an HTTP request: {e}")),
    };
    let (Some(method), Some(target)) = (req.method, req.path) else {
        return Decision::Refuse("not an HTTP request".into());
    };
    let refuse = |what: &str| {
        Decision::Refuse(format!(
            "{what} is not the package index; only {} is reachable from a job's network ([replicas] package_index)",
            index.shown()
        ))
    };
    if method == "CONNECT" {
        let Ok(authority) = target.parse::<axum::http::uri::Authority>() else {
            return Decision::Refuse(format!("CONNECT {target:?}: not host:port"));
        };
        return match authority.port_u16() {
            Some(port) if index.https && index.is(authority.host(), port) => Decision::Tunnel,
            _ => refuse(target),
        };
    }
    let Ok(uri) = target.parse::<axum::http::Uri>() else {
        return Decision::Refuse(format!("{target:?} is not a URL"));
    };
    let (Some("http"), Some(host)) = (uri.scheme_str(), uri.host()) else {
        return refuse(target);
    };
    if index.https || !index.is(host, uri.port_u16().unwrap_or(80)) {
        return refuse(target);
    }
    let path = uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
    let mut out = format!("{method} {path} HTTP/1.1\r\n").into_bytes();
    for h in req.headers.iter() {
        let name = h.name.to_ascii_lowercase();
        if ["connection", "proxy-connection", "keep-alive", "proxy-authorization"].contains(&name.as_str()) {
            continue;
        }
        out.extend_from_slice(h.name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(h.value);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"Connection: close\r\n\r\n");
    out.extend_from_slice(&head[len..]);
    Decision::Forward(out)
}

/// Binds `<data_dir>/package-index.sock` (any user may connect: mode 0666, in a data
/// directory others may only pass through) and serves it on a thread of its own.
pub fn start(data_dir: &Path, index: Index) -> io::Result<PathBuf> {
    let path = data_dir.join(SOCKET);
    match std::fs::remove_file(&path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let listener = UnixListener::bind(&path)?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666))?;
    let index = Arc::new(index);
    let open: Arc<Mutex<HashMap<u32, usize>>> = Arc::default();
    std::thread::Builder::new().name("index-proxy".into()).spawn(move || {
        for conn in listener.incoming() {
            let conn = match conn {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!("package index proxy: accept: {e}");
                    std::thread::sleep(Duration::from_millis(100));
                    continue;
                }
            };
            let Some(uid) = nix::sys::socket::getsockopt(&conn, nix::sys::socket::sockopt::PeerCredentials).ok().map(|c| c.uid()) else {
                continue;
            };
            {
                let mut open = open.lock().unwrap_or_else(|e| e.into_inner());
                let n = open.entry(uid).or_default();
                if *n >= PER_USER {
                    drop(open);
                    let _ = refuse(&conn, &format!("uid {uid} has {PER_USER} connections to the package index open already"));
                    continue;
                }
                *n += 1;
            }
            let (index, open) = (Arc::clone(&index), Arc::clone(&open));
            let spawned = std::thread::Builder::new().name("index-conn".into()).spawn(move || {
                // The connection is counted off however its thread ends, a panic included.
                let _counted = Counted { open, uid };
                if let Err(e) = serve_one(conn, &index) {
                    tracing::debug!("package index proxy: uid {uid}: {e}");
                }
            });
            if let Err(e) = spawned {
                tracing::warn!("package index proxy: cannot start a connection's thread: {e}");
            }
        }
    })?;
    Ok(path)
}

/// A user's open connection, counted off when dropped.
struct Counted {
    open: Arc<Mutex<HashMap<u32, usize>>>,
    uid: u32,
}

impl Drop for Counted {
    fn drop(&mut self) {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = open.get_mut(&self.uid) {
            *n -= 1;
        }
    }
}

fn refuse(mut conn: &UnixStream, why: &str) -> io::Result<()> {
    let body = format!("trainyard: {why}\n");
    write!(conn, "HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len())
}

fn serve_one(mut conn: UnixStream, index: &Index) -> io::Result<()> {
    conn.set_read_timeout(Some(IDLE))?;
    conn.set_write_timeout(Some(IDLE))?;
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    let decision = loop {
        let n = conn.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
        match decide(&head, index) {
            Decision::Partial if head.len() < MAX_HEAD => continue,
            Decision::Partial => break Decision::Refuse(format!("a request head over {MAX_HEAD} bytes")),
            d => break d,
        }
    };
    let first = match decision {
        Decision::Refuse(why) => return refuse(&conn, &why),
        Decision::Tunnel => {
            // What followed the head (a client may send its TLS hello at once).
            let end = head.windows(4).position(|w| w == b"\r\n\r\n").map_or(head.len(), |p| p + 4);
            head.split_off(end)
        }
        Decision::Forward(out) => out,
        Decision::Partial => return Ok(()),
    };
    let upstream = match (index.host.as_str(), index.port).to_socket_addrs().and_then(|mut addrs| {
        addrs.next().ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no address"))
    }) {
        Ok(addr) => TcpStream::connect_timeout(&addr, Duration::from_secs(10)),
        Err(e) => Err(e),
    };
    let mut upstream = match upstream {
        Ok(u) => u,
        Err(e) => {
            let body = format!("trainyard: cannot reach the package index {}: {e}\n", index.shown());
            return write!(conn, "HTTP/1.1 502 Bad Gateway\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
        }
    };
    upstream.set_read_timeout(Some(IDLE))?;
    upstream.set_write_timeout(Some(IDLE))?;
    if head.starts_with(b"CONNECT") {
        conn.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")?;
    }
    upstream.write_all(&first)?;
    let (mut up_read, mut conn_write) = (upstream.try_clone()?, conn.try_clone()?);
    let back = std::thread::Builder::new().name("index-conn".into()).spawn(move || {
        let _ = io::copy(&mut up_read, &mut conn_write);
        let _ = conn_write.shutdown(Shutdown::Write);
    })?;
    let _ = io::copy(&mut conn, &mut upstream);
    let _ = upstream.shutdown(Shutdown::Write);
    let _ = back.join();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn http_index() -> Index {
        Index::from_url("http://127.0.0.1:8123/simple").unwrap()
    }

    #[test]
    fn index_urls() {
        assert_eq!(http_index(), Index { https: false, host: "127.0.0.1".into(), port: 8123 });
        assert_eq!(Index::from_url("https://Pkgs.Example/simple/"), Some(Index { https: true, host: "pkgs.example".into(), port: 443 }));
        assert_eq!(Index::from_url("none"), None);
        assert_eq!(Index::from_url("ftp://x/"), None);
    }

    #[test]
    fn only_the_index_is_let_through() {
        let https = Index::from_url("https://pkgs.example/simple").unwrap();
        assert_eq!(decide(b"CONNECT pkgs.example:443 HTTP/1.1\r\nHost: pkgs.example:443\r\n\r\n", &https), Decision::Tunnel);
        assert_eq!(decide(b"CONNECT PKGS.example:443 HTTP/1.1\r\n\r\n", &https), Decision::Tunnel);
        for other in ["CONNECT pkgs.example:22 HTTP/1.1\r\n\r\n", "CONNECT 127.0.0.1:443 HTTP/1.1\r\n\r\n", "CONNECT pkgs.example HTTP/1.1\r\n\r\n"] {
            assert!(matches!(decide(other.as_bytes(), &https), Decision::Refuse(_)), "{other}");
        }
        // Plain http to an https index is not the index.
        assert!(matches!(decide(b"GET http://pkgs.example:443/ HTTP/1.1\r\n\r\n", &https), Decision::Refuse(_)));

        let http = http_index();
        let Decision::Forward(out) = decide(
            b"GET http://127.0.0.1:8123/simple/x/?a=1 HTTP/1.1\r\nHost: 127.0.0.1:8123\r\nProxy-Connection: keep-alive\r\nConnection: keep-alive\r\n\r\n",
            &http,
        ) else {
            panic!("not forwarded")
        };
        assert_eq!(String::from_utf8(out).unwrap(), "GET /simple/x/?a=1 HTTP/1.1\r\nHost: 127.0.0.1:8123\r\nConnection: close\r\n\r\n");
        for other in [
            "GET http://127.0.0.1:8124/ HTTP/1.1\r\n\r\n",
            "GET http://localhost:8123/ HTTP/1.1\r\n\r\n",
            "GET /simple/ HTTP/1.1\r\nHost: 127.0.0.1:8123\r\n\r\n",
            "CONNECT 127.0.0.1:8123 HTTP/1.1\r\n\r\n",
        ] {
            assert!(matches!(decide(other.as_bytes(), &http), Decision::Refuse(_)), "{other}");
        }
        assert_eq!(decide(b"GET http://127.0.0.1:8123/ HTTP/1.1\r\nHost: x", &http), Decision::Partial);
        assert!(matches!(decide(b"\x16\x03\x01garbage\r\n\r\n", &http), Decision::Refuse(_)));
    }
}
