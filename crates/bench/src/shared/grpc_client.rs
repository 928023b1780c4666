//! Clients of one HTTP stack (hyper on tokio) for the benches: gRPC unary calls over one
//! HTTP/2 connection (h2c, prior knowledge), messages as dynamic messages of the server's
//! own descriptors, and REST calls over one HTTP/1.1 keep-alive connection, so that the
//! two transports are compared with the same client code around them. The
//! length-prefixed message framing is gRPC's (1 byte compressed flag, 4 bytes length).

use anyhow::{anyhow, bail, Context, Result};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use prost::Message;
use prost_reflect::{DescriptorPool, DynamicMessage};

/// One HTTP/2 connection to `addr`.
pub struct Connection {
    send: hyper::client::conn::http2::SendRequest<Full<Bytes>>,
    authority: String,
}

impl Connection {
    pub async fn open(addr: &str) -> Result<Connection> {
        let tcp = tokio::net::TcpStream::connect(addr).await.with_context(|| format!("connecting to {addr}"))?;
        tcp.set_nodelay(true)?;
        let (send, conn) = hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), hyper_util::rt::TokioIo::new(tcp))
            .await
            .context("the HTTP/2 handshake")?;
        tokio::spawn(conn);
        Ok(Connection { send, authority: addr.to_string() })
    }

    /// Call `path` with the encoded request; the encoded answer, or the gRPC status.
    pub async fn unary(&mut self, path: &str, request: &[u8]) -> Result<Bytes> {
        let mut framed = Vec::with_capacity(request.len() + 5);
        framed.push(0);
        framed.extend_from_slice(&u32::try_from(request.len())?.to_be_bytes());
        framed.extend_from_slice(request);
        let req = hyper::Request::builder()
            .method("POST")
            .uri(format!("http://{}{path}", self.authority))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(Full::new(Bytes::from(framed)))?;
        self.send.ready().await.context("the connection")?;
        let resp = self.send.send_request(req).await.with_context(|| format!("calling {path}"))?;
        let head_status = resp.headers().get("grpc-status").cloned();
        let collected = resp.into_body().collect().await.context("reading the answer")?;
        let status = collected.trailers().and_then(|t| t.get("grpc-status").cloned()).or(head_status);
        let status = status.as_ref().and_then(|s| s.to_str().ok()).unwrap_or("");
        let body = collected.to_bytes();
        if status != "0" {
            bail!("{path}: grpc-status {status:?}");
        }
        if body.len() < 5 {
            bail!("{path}: an answer without a message");
        }
        Ok(body.slice(5..))
    }
}

/// One HTTP/1.1 keep-alive connection to `addr`.
pub struct Http1 {
    send: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    authority: String,
}

impl Http1 {
    pub async fn open(addr: &str) -> Result<Http1> {
        let tcp = tokio::net::TcpStream::connect(addr).await.with_context(|| format!("connecting to {addr}"))?;
        tcp.set_nodelay(true)?;
        let (send, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp)).await.context("the connection")?;
        tokio::spawn(conn);
        Ok(Http1 { send, authority: addr.to_string() })
    }

    /// POST `body` (JSON) to `path`; the answer, or its status.
    pub async fn post_json(&mut self, path: &str, body: Vec<u8>) -> Result<Bytes> {
        let req = hyper::Request::builder()
            .method("POST")
            .uri(path)
            .header("host", &self.authority)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body)))?;
        self.send.ready().await.context("the connection")?;
        json_answer(path, self.send.send_request(req).await).await
    }
}

impl Connection {
    /// POST `body` (JSON) to `path` over this HTTP/2 connection: REST over HTTP/2, to tell
    /// the protocol's cost from the gRPC bridge's.
    pub async fn post_json(&mut self, path: &str, body: Vec<u8>) -> Result<Bytes> {
        let req = hyper::Request::builder()
            .method("POST")
            .uri(format!("http://{}{path}", self.authority))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body)))?;
        self.send.ready().await.context("the connection")?;
        json_answer(path, self.send.send_request(req).await).await
    }
}

/// A REST answer's body, or its status as an error.
async fn json_answer(path: &str, sent: hyper::Result<hyper::Response<hyper::body::Incoming>>) -> Result<Bytes> {
    let resp = sent.with_context(|| format!("POST {path}"))?;
    let status = resp.status();
    let body = resp.into_body().collect().await.context("reading the answer")?.to_bytes();
    if !status.is_success() {
        bail!("POST {path} answered {status}: {}", String::from_utf8_lossy(&body));
    }
    Ok(body)
}

/// `CreateCustomJobRequest {parent, custom_job}` of the proto3 JSON `job`, encoded.
pub fn create_custom_job_request(pool: &DescriptorPool, parent: &str, job: &serde_json::Value) -> Result<Vec<u8>> {
    let desc = pool.get_message_by_name("google.cloud.aiplatform.v1.CreateCustomJobRequest").ok_or_else(|| anyhow!("no CreateCustomJobRequest"))?;
    let json = serde_json::json!({"parent": parent, "customJob": job});
    let msg = DynamicMessage::deserialize(desc, json).context("the request")?;
    Ok(msg.encode_to_vec())
}
