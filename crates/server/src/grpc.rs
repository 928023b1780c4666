//! gRPC, the Vertex AI SDK's default transport, on the API's own address: every RPC of
//! `google.cloud.aiplatform.v1.JobService`, `PipelineService`, `VizierService`,
//! `MetadataService`, `TensorboardService` and
//! `google.longrunning.Operations` is answered by its REST twin.
//!
//! One implementation, two encodings. A request's protobuf is decoded as a dynamic message
//! of the SDK's own descriptors (`grpc/aiplatform_v1.binpb`, made from the installed SDK by
//! `scripts/gen-grpc-descriptors.py`), turned into the REST request its `google.api.http`
//! rule names (path fields into the path, the body field as JSON by the proto3 JSON
//! mapping, the other fields as query parameters), and served by the REST router: the same
//! auth (the `authorization` metadata), checks, audit lines and metrics (the latter under
//! method `GRPC` and the RPC's path, one series per RPC). The REST answer
//! comes back the same way: JSON into the response message, or the error (`{"error":
//! {code, message, status, details}}`) into a `google.rpc.Status` with its details.
//!
//! - Framing, compression and status trailers are tonic's.
//! - A method that is not offered: UNIMPLEMENTED, naming it.
//! - A malformed message: INVALID_ARGUMENT; one over [`MAX_MESSAGE`]: RESOURCE_EXHAUSTED.
//! - `grpc-timeout` is honoured: DEADLINE_EXCEEDED when the REST answer is later.
//! - gRPC server reflection (v1 and v1alpha) serves the same descriptors, for `grpcurl`.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderValue, Request, Response};
use prost::Message;
use prost_reflect::{DescriptorPool, DynamicMessage, MessageDescriptor, MethodDescriptor, ReflectMessage, Value};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::{Code, Status};
use tower::ServiceExt;

/// The SDK's descriptors: messages, the services and their HTTP rules.
pub const DESCRIPTORS: &[u8] = include_bytes!("../grpc/aiplatform_v1.binpb");

/// The largest request message (as the REST API's largest body).
pub const MAX_MESSAGE: usize = crate::reply::MAX_BODY;

/// The largest REST answer turned into a message.
const MAX_ANSWER: usize = 64 << 20;

/// `content-type: application/grpc` (and `application/grpc+proto`).
pub fn is_grpc<B>(req: &Request<B>) -> bool {
    req.headers().get(axum::http::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).is_some_and(|v| v.starts_with("application/grpc"))
}

/// How one RPC reaches its REST twin.
#[derive(Debug)]
struct Route {
    /// `/SERVICE/METHOD`, the RPC's path (its metrics' route).
    path: String,
    method: MethodDescriptor,
    verb: axum::http::Method,
    /// The path template, such as `/v1/{parent=projects/*/locations/*}/customJobs`.
    template: String,
    /// `*`, a field's name, or empty (no body).
    body: String,
}

struct Catalog {
    pool: DescriptorPool,
    routes: HashMap<String, Route>,
}

fn catalog() -> Result<&'static Catalog, Status> {
    static CATALOG: OnceLock<Result<Catalog, String>> = OnceLock::new();
    CATALOG.get_or_init(load).as_ref().map_err(|e| Status::internal(format!("the gRPC descriptors cannot be used: {e}")))
}

fn load() -> Result<Catalog, String> {
    let pool = DescriptorPool::decode(DESCRIPTORS).map_err(|e| e.to_string())?;
    let http = pool.get_extension_by_name("google.api.http").ok_or("google.api.http is not among the descriptors")?;
    let mut routes = HashMap::new();
    for service in pool.services() {
        for method in service.methods() {
            // A streaming RPC (TensorBoard's ReadTensorboardBlobData) has no one REST
            // answer: not offered (UNIMPLEMENTED naming it).
            if method.is_client_streaming() || method.is_server_streaming() {
                continue;
            }
            let path = format!("/{}/{}", service.full_name(), method.name());
            let route = if service.full_name() == "google.longrunning.Operations" {
                operations_route(&method)
            } else {
                http_route(&method, &http)
            };
            if let Some((verb, template, body)) = route {
                routes.insert(path.clone(), Route { path, method, verb, template, body });
            }
        }
    }
    Ok(Catalog { pool, routes })
}

/// The verb, path template and body of a method by its `google.api.http` option.
fn http_route(method: &MethodDescriptor, http: &prost_reflect::ExtensionDescriptor) -> Option<(axum::http::Method, String, String)> {
    let options = method.options();
    if !options.has_extension(http) {
        return None;
    }
    let rule = options.get_extension(http);
    let rule = rule.as_message()?;
    let text = |name: &str| rule.get_field_by_name(name).and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default();
    let (verb, template) = [("get", axum::http::Method::GET), ("post", axum::http::Method::POST), ("delete", axum::http::Method::DELETE), ("patch", axum::http::Method::PATCH), ("put", axum::http::Method::PUT)]
        .into_iter()
        .find_map(|(name, verb)| Some(text(name)).filter(|t| !t.is_empty()).map(|t| (verb, t)))?;
    Some((verb, template, text("body")))
}

/// `google.longrunning.Operations` on the service's own operation names
/// (`projects/*/locations/*/operations/*`), as the SDK's REST transport maps them.
/// None of them has a body.
fn operations_route(method: &MethodDescriptor) -> Option<(axum::http::Method, String, String)> {
    use axum::http::Method;
    let (verb, template) = match method.name() {
        "GetOperation" => (Method::GET, "/v1/{name}"),
        "DeleteOperation" => (Method::DELETE, "/v1/{name}"),
        "CancelOperation" => (Method::POST, "/v1/{name}:cancel"),
        "WaitOperation" => (Method::POST, "/v1/{name}:wait"),
        "ListOperations" => (Method::GET, "/v1/{name}/operations"),
        _ => return None,
    };
    Some((verb, template.into(), String::new()))
}

/// Answer one gRPC request (reflection, or an RPC through its REST twin).
pub async fn handle(app: axum::Router, req: Request<Body>) -> Response<Body> {
    let path = req.uri().path().to_string();
    let catalog = match catalog() {
        Ok(c) => c,
        Err(status) => return status.into_http::<Body>(),
    };
    if path.starts_with("/grpc.reflection.v1.ServerReflection/") || path.starts_with("/grpc.reflection.v1alpha.ServerReflection/") {
        return reflection(req).await;
    }
    let Some(route) = catalog.routes.get(&path) else {
        let (service, method) = path.trim_start_matches('/').split_once('/').unwrap_or((&path, ""));
        let why = if catalog.pool.get_service_by_name(service).is_some() {
            format!("Trainyard does not offer the method {method} of {service}")
        } else {
            format!(
                "Trainyard does not offer the gRPC service {service:?} (it offers JobService, PipelineService, VizierService, MetadataService and TensorboardService \
                 of google.cloud.aiplatform.v1, google.longrunning.Operations, and Projects.GetProject of \
                 google.cloud.resourcemanager.v3)"
            )
        };
        return Status::unimplemented(why).into_http::<Body>();
    };
    let deadline = req.headers().get("grpc-timeout").and_then(|v| v.to_str().ok()).and_then(grpc_timeout);
    let share = req.extensions().get::<Arc<crate::shares::ConnectionShare>>().cloned();
    let codec = DynamicCodec { input: route.method.input() };
    // tonic checks a message's length before it reads it: nothing larger is buffered.
    let mut grpc = tonic::server::Grpc::new(codec).max_decoding_message_size(MAX_MESSAGE).max_encoding_message_size(MAX_ANSWER);
    let rpc = Rpc { app, route, deadline, share };
    let mut answer = grpc.unary(rpc, req).await;
    too_large_is_resource_exhausted(&mut answer);
    answer.map(Body::new)
}

/// tonic refuses a message over the limit with OUT_OF_RANGE; gRPC's own servers (and the
/// service) say RESOURCE_EXHAUSTED, which clients know as "too large, do not retry as is".
fn too_large_is_resource_exhausted<B>(answer: &mut Response<B>) {
    let headers = answer.headers_mut();
    let out_of_range = headers.get("grpc-status").is_some_and(|s| s.as_bytes() == b"11");
    let too_large = headers.get("grpc-message").and_then(|m| m.to_str().ok()).is_some_and(|m| m.contains("message%20length%20too%20large") || m.contains("message length too large"));
    if out_of_range && too_large {
        headers.insert("grpc-status", HeaderValue::from_static("8"));
        let message = format!("the request message is larger than the limit of {MAX_MESSAGE} bytes");
        if let Ok(v) = HeaderValue::from_str(&percent_encoding::utf8_percent_encode(&message, GRPC_MESSAGE).to_string()) {
            headers.insert("grpc-message", v);
        }
    }
}

/// What `grpc-message` percent-encodes (the spec: anything outside printable ASCII, and `%`).
const GRPC_MESSAGE: &percent_encoding::AsciiSet = &percent_encoding::CONTROLS.add(b'%');

async fn reflection(req: Request<Body>) -> Response<Body> {
    let builder = tonic_reflection::server::Builder::configure().register_encoded_file_descriptor_set(DESCRIPTORS);
    let answer = if req.uri().path().starts_with("/grpc.reflection.v1.") {
        match builder.build_v1() {
            Ok(svc) => svc.oneshot(req).await,
            Err(e) => return Status::internal(format!("reflection: {e}")).into_http::<Body>(),
        }
    } else {
        match builder.build_v1alpha() {
            Ok(svc) => svc.oneshot(req).await,
            Err(e) => return Status::internal(format!("reflection: {e}")).into_http::<Body>(),
        }
    };
    match answer {
        Ok(r) => r.map(Body::new),
        Err(never) => match never {},
    }
}

/// `grpc-timeout`: digits and a unit (H, M, S, m, u, n).
fn grpc_timeout(v: &str) -> Option<Duration> {
    let (digits, unit) = v.split_at(v.len().checked_sub(1)?);
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.saturating_mul(3600)),
        "M" => Duration::from_secs(n.saturating_mul(60)),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

/// Messages as dynamic messages of the method's descriptors.
struct DynamicCodec {
    input: MessageDescriptor,
}

struct DynamicEncoder;

struct DynamicDecoder {
    input: MessageDescriptor,
}

impl Codec for DynamicCodec {
    type Encode = DynamicMessage;
    type Decode = DynamicMessage;
    type Encoder = DynamicEncoder;
    type Decoder = DynamicDecoder;

    fn encoder(&mut self) -> DynamicEncoder {
        DynamicEncoder
    }

    fn decoder(&mut self) -> DynamicDecoder {
        DynamicDecoder { input: self.input.clone() }
    }
}

impl Encoder for DynamicEncoder {
    type Item = DynamicMessage;
    type Error = Status;

    fn encode(&mut self, item: DynamicMessage, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        item.encode(dst).map_err(|e| Status::internal(format!("cannot encode the answer: {e}")))
    }
}

impl Decoder for DynamicDecoder {
    type Item = DynamicMessage;
    type Error = Status;

    /// A message over [`MAX_MESSAGE`] never gets here: tonic refuses it by its length
    /// (see [`too_large_is_resource_exhausted`]).
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<DynamicMessage>, Status> {
        DynamicMessage::decode(self.input.clone(), src)
            .map(Some)
            .map_err(|e| Status::invalid_argument(format!("the request is not a valid {}: {e}", self.input.full_name())))
    }
}

/// One RPC, answered by the REST router.
struct Rpc {
    app: axum::Router,
    route: &'static Route,
    deadline: Option<Duration>,
    share: Option<Arc<crate::shares::ConnectionShare>>,
}

type RpcFuture = std::pin::Pin<Box<dyn std::future::Future<Output = Result<tonic::Response<DynamicMessage>, Status>> + Send>>;

impl tonic::server::UnaryService<DynamicMessage> for Rpc {
    type Response = DynamicMessage;
    type Future = RpcFuture;

    fn call(&mut self, request: tonic::Request<DynamicMessage>) -> RpcFuture {
        let (app, route, deadline, share) = (self.app.clone(), self.route, self.deadline, self.share.clone());
        Box::pin(async move {
            let authorization = request.metadata().get("authorization").and_then(|v| v.to_str().ok()).map(str::to_string);
            let message = request.into_inner();
            let mut rest = transcode(route, &message)?;
            if let Some(a) = authorization {
                let value = HeaderValue::from_str(&a).map_err(|_| Status::unauthenticated("the authorization metadata is not a header value"))?;
                rest.headers_mut().insert(axum::http::header::AUTHORIZATION, value);
            }
            rest.extensions_mut().insert(crate::metrics::GrpcMethod(route.path.clone()));
            if let Some(share) = share {
                rest.extensions_mut().insert(share);
            }
            let call = app.oneshot(rest);
            let answer = match deadline {
                Some(d) => tokio::time::timeout(d, call)
                    .await
                    .map_err(|_| Status::deadline_exceeded(format!("no answer within the deadline of {} ms", d.as_millis())))?,
                None => call.await,
            };
            let answer = match answer {
                Ok(a) => a,
                Err(never) => match never {},
            };
            let status = answer.status();
            let retry_after = answer.headers().get(axum::http::header::RETRY_AFTER).and_then(|v| v.to_str().ok()).map(str::to_string);
            let bytes = axum::body::to_bytes(answer.into_body(), MAX_ANSWER)
                .await
                .map_err(|e| Status::internal(format!("cannot read the answer: {e}")))?;
            if !status.is_success() {
                return Err(rest_error(status, &bytes, retry_after.as_deref()));
            }
            let output = route.method.output();
            if output.full_name() == "google.protobuf.Empty" || bytes.is_empty() {
                return Ok(tonic::Response::new(DynamicMessage::new(output)));
            }
            let options = prost_reflect::DeserializeOptions::new().deny_unknown_fields(false);
            let cannot = |e: serde_json::Error| Status::internal(format!("cannot give the answer as {}: {e}", output.full_name()));
            let message = if memchr::memmem::find(&bytes, b"google.protobuf.Empty").is_some() {
                let mut json: serde_json::Value = serde_json::from_slice(&bytes).map_err(cannot)?;
                empty_any_values(&mut json);
                DynamicMessage::deserialize_with_options(output.clone(), json, &options).map_err(cannot)?
            } else {
                let mut de = serde_json::Deserializer::from_slice(&bytes);
                DynamicMessage::deserialize_with_options(output.clone(), &mut de, &options).map_err(cannot)?
            };
            Ok(tonic::Response::new(message))
        })
    }
}

/// An `Any` holding `google.protobuf.Empty` is `{"@type": ".../google.protobuf.Empty"}` in
/// the service's JSON (and Go's and Python's); prost-reflect reads Empty as a well-known
/// type whose `Any` form has a `value`: it is given one.
fn empty_any_values(json: &mut serde_json::Value) {
    match json {
        serde_json::Value::Object(m) => {
            if m.get("@type").and_then(|t| t.as_str()).is_some_and(|t| t.ends_with("/google.protobuf.Empty")) && !m.contains_key("value") {
                m.insert("value".into(), serde_json::json!({}));
            }
            m.values_mut().for_each(empty_any_values);
        }
        serde_json::Value::Array(a) => a.iter_mut().for_each(empty_any_values),
        _ => {}
    }
}

/// The REST request of `message` by its route: the path's fields in the path, the body
/// field (or the whole message) as JSON, the other fields as query parameters. Only what
/// goes into the query is built as a JSON tree; the body is written straight from the
/// message.
fn transcode(route: &Route, message: &DynamicMessage) -> Result<Request<Body>, Status> {
    let options = prost_reflect::SerializeOptions::new();
    let unreadable = |e: serde_json::Error| Status::invalid_argument(format!("the request cannot be read: {e}"));
    let mut path = String::new();
    let mut used: Vec<String> = Vec::new();
    let mut rest = route.template.as_str();
    while let Some(open) = rest.find('{') {
        path.push_str(&rest[..open]);
        let close = rest[open..].find('}').map(|c| open + c).ok_or_else(|| Status::internal("a malformed path template"))?;
        let variable = &rest[open + 1..close];
        let field = variable.split('=').next().unwrap_or(variable);
        let value = path_field(message, field)?;
        if !field.contains('.') {
            used.push(field.to_string());
        }
        path.push_str(&percent_encoding::utf8_percent_encode(&value, PATH_VALUE).to_string());
        rest = &rest[close + 1..];
    }
    path.push_str(rest);
    let body: Option<Vec<u8>> = match route.body.as_str() {
        "" => None,
        "*" => {
            let mut whole = message.clone();
            for f in &used {
                whole.clear_field_by_name(f);
            }
            used.extend(message.descriptor().fields().map(|f| f.name().to_string()));
            let mut out = Vec::new();
            whole.serialize_with_options(&mut serde_json::Serializer::new(&mut out), &options).map_err(unreadable)?;
            Some(out)
        }
        field => {
            used.push(field.to_string());
            let mut out = Vec::new();
            match message.get_field_by_name(field).as_deref() {
                Some(Value::Message(m)) => {
                    m.serialize_with_options(&mut serde_json::Serializer::new(&mut out), &options).map_err(unreadable)?;
                }
                // A scalar body (not among the methods served): its JSON by way of the message's.
                _ => {
                    let json = message.serialize_with_options(serde_json::value::Serializer, &options).map_err(unreadable)?;
                    let name = message.descriptor().get_field_by_name(field).map(|f| f.json_name().to_string()).unwrap_or_else(|| field.to_string());
                    out = json.get(&name).cloned().unwrap_or_else(|| serde_json::json!({})).to_string().into_bytes();
                }
            }
            Some(out)
        }
    };
    // The fields left, and only they, as query parameters.
    let mut left = DynamicMessage::new(message.descriptor());
    for (field, value) in message.fields() {
        if !used.iter().any(|u| u == field.name()) {
            left.set_field(&field, value.clone());
        }
    }
    let mut query = String::new();
    if left.fields().next().is_some() {
        if let serde_json::Value::Object(fields) = left.serialize_with_options(serde_json::value::Serializer, &options).map_err(unreadable)? {
            query = url_query(&fields);
        }
    }
    let uri = if query.is_empty() { path } else { format!("{path}?{query}") };
    let mut builder = Request::builder().method(route.verb.clone()).uri(&uri);
    let body = match body {
        Some(b) => {
            builder = builder.header(axum::http::header::CONTENT_TYPE, "application/json");
            Body::from(b)
        }
        None => Body::empty(),
    };
    builder.body(body).map_err(|e| Status::invalid_argument(format!("the request makes no valid path ({uri}): {e}")))
}

/// Characters kept as they are in a path field's value (its slashes stay separators).
const PATH_VALUE: &percent_encoding::AsciiSet =
    &percent_encoding::NON_ALPHANUMERIC.remove(b'/').remove(b'-').remove(b'_').remove(b'.').remove(b'~').remove(b':').remove(b'@');

/// A path field's value (`name`, or `custom_job.name`); an empty one is INVALID_ARGUMENT.
fn path_field(message: &DynamicMessage, field: &str) -> Result<String, Status> {
    let required = || Status::invalid_argument(format!("{field} is required"));
    let mut current = message.clone();
    let parts: Vec<&str> = field.split('.').collect();
    for (i, part) in parts.iter().enumerate() {
        let Some(desc) = current.descriptor().get_field_by_name(part) else {
            return Err(Status::internal(format!("the path names a field {field} the request does not have")));
        };
        let value = current.get_field(&desc).into_owned();
        if i + 1 == parts.len() {
            let text = match value {
                Value::String(s) => s,
                other => other.to_string(),
            };
            return if text.is_empty() { Err(required()) } else { Ok(text) };
        }
        current = match value {
            Value::Message(m) => m,
            _ => return Err(required()),
        };
    }
    Err(required())
}

/// Query parameters of the fields left (`pageSize=10&filter=...`; a nested field as
/// `a.b=...`, a repeated one once per value).
fn url_query(fields: &serde_json::Map<String, serde_json::Value>) -> String {
    fn add(prefix: &str, value: &serde_json::Value, out: &mut Vec<(String, String)>) {
        match value {
            serde_json::Value::Object(m) => m.iter().for_each(|(k, v)| add(&format!("{prefix}.{k}"), v, out)),
            serde_json::Value::Array(a) => a.iter().for_each(|v| add(prefix, v, out)),
            serde_json::Value::String(s) => out.push((prefix.to_string(), s.clone())),
            serde_json::Value::Null => {}
            other => out.push((prefix.to_string(), other.to_string())),
        }
    }
    let mut pairs = Vec::new();
    for (k, v) in fields {
        add(k, v, &mut pairs);
    }
    let enc = |s: &str| percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string();
    pairs.iter().map(|(k, v)| format!("{}={}", enc(k), enc(v))).collect::<Vec<_>>().join("&")
}

/// A REST error answer as a gRPC status: the code by its `status` name (else by the HTTP
/// status), the message, and the details as a `google.rpc.Status`.
fn rest_error(http: axum::http::StatusCode, body: &[u8], retry_after: Option<&str>) -> Status {
    let parsed: Option<serde_json::Value> = serde_json::from_slice(body).ok();
    let error = parsed.as_ref().and_then(|v| v.get("error"));
    let message = error
        .and_then(|e| e.get("message"))
        .and_then(|m| m.as_str())
        .map(str::to_string)
        .unwrap_or_else(|| String::from_utf8_lossy(body).chars().take(500).collect());
    let code = error.and_then(|e| e.get("status")).and_then(|s| s.as_str()).map(code_of_name).unwrap_or_else(|| code_of_http(http));
    let message = match retry_after {
        Some(secs) if code == Code::ResourceExhausted && !message.contains("retry") => format!("{message} (retry after {secs} s)"),
        _ => message,
    };
    let details = error.and_then(|e| status_details(code, &message, e));
    match details {
        Some(d) => Status::with_details(code, message, d.into()),
        None => Status::new(code, message),
    }
}

/// The error's `details` (RetryInfo, BadRequest, ...) as an encoded `google.rpc.Status`.
fn status_details(code: Code, message: &str, error: &serde_json::Value) -> Option<Vec<u8>> {
    let details = error.get("details")?.as_array()?;
    if details.is_empty() {
        return None;
    }
    let desc = catalog().ok()?.pool.get_message_by_name("google.rpc.Status")?;
    let json = serde_json::json!({"code": code as i32, "message": message, "details": details});
    let options = prost_reflect::DeserializeOptions::new().deny_unknown_fields(false);
    let status = DynamicMessage::deserialize_with_options(desc, json, &options).ok()?;
    Some(status.encode_to_vec())
}

fn code_of_name(name: &str) -> Code {
    match name {
        "CANCELLED" => Code::Cancelled,
        "INVALID_ARGUMENT" => Code::InvalidArgument,
        "DEADLINE_EXCEEDED" => Code::DeadlineExceeded,
        "NOT_FOUND" => Code::NotFound,
        "ALREADY_EXISTS" => Code::AlreadyExists,
        "PERMISSION_DENIED" => Code::PermissionDenied,
        "RESOURCE_EXHAUSTED" => Code::ResourceExhausted,
        "FAILED_PRECONDITION" => Code::FailedPrecondition,
        "ABORTED" => Code::Aborted,
        "OUT_OF_RANGE" => Code::OutOfRange,
        "UNIMPLEMENTED" => Code::Unimplemented,
        "INTERNAL" => Code::Internal,
        "UNAVAILABLE" => Code::Unavailable,
        "DATA_LOSS" => Code::DataLoss,
        "UNAUTHENTICATED" => Code::Unauthenticated,
        _ => Code::Unknown,
    }
}

/// The code of an HTTP status, as the service's REST mapping has it.
fn code_of_http(http: axum::http::StatusCode) -> Code {
    match http.as_u16() {
        400 => Code::InvalidArgument,
        401 => Code::Unauthenticated,
        403 => Code::PermissionDenied,
        404 => Code::NotFound,
        405 | 501 => Code::Unimplemented,
        409 => Code::Aborted,
        413 | 429 => Code::ResourceExhausted,
        499 => Code::Cancelled,
        503 => Code::Unavailable,
        504 => Code::DeadlineExceeded,
        _ => Code::Internal,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_descriptors_hold_the_services_and_their_rules() {
        let c = catalog().expect("descriptors");
        let create = &c.routes["/google.cloud.aiplatform.v1.JobService/CreateCustomJob"];
        assert_eq!(create.verb, axum::http::Method::POST);
        assert_eq!(create.template, "/v1/{parent=projects/*/locations/*}/customJobs");
        assert_eq!(create.body, "custom_job");
        for m in ["GetHyperparameterTuningJob", "ListCustomJobs", "CancelCustomJob", "DeleteCustomJob"] {
            assert!(c.routes.contains_key(&format!("/google.cloud.aiplatform.v1.JobService/{m}")), "{m}");
        }
        assert!(c.routes.contains_key("/google.cloud.aiplatform.v1.VizierService/SuggestTrials"));
        assert!(c.routes.contains_key("/google.cloud.aiplatform.v1.MetadataService/AddContextChildren"));
        assert!(c.routes.contains_key("/google.cloud.aiplatform.v1.TensorboardService/BatchReadTensorboardTimeSeriesData"));
        assert!(!c.routes.contains_key("/google.cloud.aiplatform.v1.TensorboardService/ReadTensorboardBlobData"), "a streaming RPC is not offered");
        assert!(c.routes.contains_key("/google.cloud.aiplatform.v1.PipelineService/CreateTrainingPipeline"));
        assert!(c.routes.contains_key("/google.longrunning.Operations/GetOperation"));
    }

    #[test]
    fn a_request_becomes_its_rest_twin() {
        let c = catalog().expect("descriptors");
        let list = &c.routes["/google.cloud.aiplatform.v1.JobService/ListCustomJobs"];
        let mut m = DynamicMessage::new(list.method.input());
        m.set_field_by_name("parent", Value::String("projects/p/locations/us-central1".into()));
        m.set_field_by_name("filter", Value::String("state=JOB_STATE_RUNNING".into()));
        m.set_field_by_name("page_size", Value::I32(5));
        let req = transcode(list, &m).expect("transcoded");
        assert_eq!(req.method(), axum::http::Method::GET);
        assert_eq!(req.uri().to_string(), "/v1/projects/p/locations/us-central1/customJobs?filter=state%3DJOB%5FSTATE%5FRUNNING&pageSize=5");
        let create = &c.routes["/google.cloud.aiplatform.v1.JobService/CreateCustomJob"];
        let mut m = DynamicMessage::new(create.method.input());
        let job_desc = c.pool.get_message_by_name("google.cloud.aiplatform.v1.CustomJob").expect("CustomJob");
        let mut job = DynamicMessage::new(job_desc);
        job.set_field_by_name("display_name", Value::String("x".into()));
        m.set_field_by_name("custom_job", Value::Message(job));
        let missing = transcode(create, &m).expect_err("no parent");
        assert_eq!(missing.code(), Code::InvalidArgument);
        assert!(missing.message().contains("parent"), "{}", missing.message());
        m.set_field_by_name("parent", Value::String("projects/p/locations/r".into()));
        let req = transcode(create, &m).expect("transcoded");
        assert_eq!(req.uri().path(), "/v1/projects/p/locations/r/customJobs");
        assert_eq!(req.uri().query(), None);
    }

    #[test]
    fn rest_errors_become_statuses() {
        let body = br#"{"error":{"code":404,"message":"customJobs 7 not found","status":"NOT_FOUND"}}"#;
        let s = rest_error(axum::http::StatusCode::NOT_FOUND, body, None);
        assert_eq!((s.code(), s.message()), (Code::NotFound, "customJobs 7 not found"));
        let body = br#"{"error":{"code":429,"message":"slow down","status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"2s"}]}}"#;
        let s = rest_error(axum::http::StatusCode::TOO_MANY_REQUESTS, body, Some("2"));
        assert_eq!(s.code(), Code::ResourceExhausted);
        assert!(!s.details().is_empty(), "RetryInfo is passed on");
        assert_eq!(rest_error(axum::http::StatusCode::CONFLICT, b"", None).code(), Code::Aborted);
        assert_eq!(grpc_timeout("250m"), Some(Duration::from_millis(250)));
        assert_eq!(grpc_timeout("x"), None);
    }
}
