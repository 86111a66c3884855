//! The echo backend: one process serving several "pods", each on its own sockets, answering every
//! request with the upstream conformance echo JSON plus the addresses the request travelled over.
//!
//! The JSON follows `images/echoserver/echoserver.go` of ingress-controller-conformance (see
//! `shared/conformance/NOTES.md` §6): `path` (the raw request-target), `host`, `method`, `proto`,
//! `headers` (canonical names, every header but Host), `namespace`, `ingress`, `service`, `pod`,
//! with a one-space indent, `Content-Type: application/json`, `X-Content-Type-Options: nosniff`
//! and no `Server` header (so a test can check that the proxy adds one). duet's extensions come
//! after `pod`: `family` (`ipv4`/`ipv6`, of the socket the request arrived on), `local` (that
//! socket's address), `peer` (the address the request came from) and `bodyLength` (request body
//! bytes received).
//!
//! Test controls (request headers, duet extensions): `X-Echo-Delay-Ms: N` waits N milliseconds
//! (at most 60 s) before answering; `X-Echo-Set-Header: Name: value, Other: value` adds those
//! headers to the response.
//!
//! A request with `Content-Type: application/grpc...` is answered like a gRPC server-streaming
//! call: `X-Echo-Grpc-Messages: N` (default 1, at most 100) length-prefixed messages, each the
//! compact echo JSON, as separate DATA frames, then the trailers `grpc-status: 0` and
//! `grpc-message: ok` (`X-Echo-Grpc-Status: N` sets another status).
//!
//! With [`EchoOptions::tls`], pods serve TLS (ALPN `h2` and `http/1.1`) instead of plain TCP.
//!
//! `GET /health` answers `OK`. A request with `Upgrade: websocket` and `Connection: upgrade` is
//! answered `101 Switching Protocols` (with `X-Echo-Pod`, `X-Echo-Family`, `X-Echo-Local` and
//! `X-Echo-Peer` headers) and every byte then received is sent back, until the client closes.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, Method, Request, Response, StatusCode, Version};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use serde::{Deserialize, Serialize};
use socket2::{Domain, Protocol, Socket, Type};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// An address family: the dataplane's own type (`ipv4` / `ipv6` in the echo JSON).
pub use dataplane::table::Family;

/// What the echo backend saw of one request: the body of every echo response.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Echo {
    /// The raw request-target the backend received (path plus query, origin-form).
    pub path: String,
    /// The Host header (or HTTP/2 `:authority`) the backend received.
    pub host: String,
    /// The request method.
    pub method: String,
    /// The protocol of the hop into the backend: `HTTP/1.1`, `HTTP/1.0` or `HTTP/2.0`.
    pub proto: String,
    /// Every request header but Host, by Go-canonical name (`X-Forwarded-For`), in order of
    /// arrival per name.
    pub headers: BTreeMap<String, Vec<String>>,
    /// The pod's namespace.
    pub namespace: String,
    /// The Ingress name the pod was started for (may be empty).
    pub ingress: String,
    /// The Service the pod belongs to.
    pub service: String,
    /// The pod's name.
    pub pod: String,
    /// duet extension: the family of the socket the request arrived on.
    #[serde(default = "unknown_family")]
    pub family: Family,
    /// duet extension: the local address of that socket.
    #[serde(default = "unspecified")]
    pub local: SocketAddr,
    /// duet extension: the address the request came from (the proxy's side of the hop).
    #[serde(default = "unspecified")]
    pub peer: SocketAddr,
    /// duet extension: how many request body bytes arrived.
    #[serde(default)]
    pub body_length: u64,
}

fn unknown_family() -> Family {
    Family::V4
}

fn unspecified() -> SocketAddr {
    SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0))
}

impl Echo {
    /// The values of a request header, by case-insensitive name.
    pub fn header_values(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case(name))
            .flat_map(|(_, v)| v.iter().map(String::as_str))
            .collect()
    }

    /// The request header's values joined by `, ` (as one field), if it was sent at all.
    pub fn header(&self, name: &str) -> Option<String> {
        let values = self.header_values(name);
        (!values.is_empty()).then(|| values.join(", "))
    }
}

/// Go's `textproto.CanonicalMIMEHeaderKey`: `x-forwarded-for` becomes `X-Forwarded-For`; a name
/// holding a byte that is not a token character is returned unchanged.
pub fn canonical_header_key(name: &str) -> String {
    let token = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    if !name.bytes().all(token) {
        return name.to_owned();
    }
    let mut upper = true;
    name.chars()
        .map(|c| {
            let out = if upper {
                c.to_ascii_uppercase()
            } else {
                c.to_ascii_lowercase()
            };
            upper = c == '-';
            out
        })
        .collect()
}

/// Who the pods of one echo process claim to be: the values upstream takes from the `NAMESPACE`,
/// `INGRESS_NAME` and `SERVICE_NAME` environment variables.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Identity {
    /// Namespace of the pods.
    pub namespace: String,
    /// The Ingress the pods serve (informational).
    pub ingress: String,
    /// The Service the pods belong to.
    pub service: String,
}

/// One pod to serve: a name and the sockets it listens on.
#[derive(Debug)]
pub struct PodListeners {
    /// The pod's name, echoed as `pod`.
    pub name: String,
    /// Listening sockets, one per address.
    pub listeners: Vec<std::net::TcpListener>,
}

impl PodListeners {
    /// Binds every address of every pod (see [`bind`]).
    pub fn bind(pods: &[(String, Vec<SocketAddr>)]) -> io::Result<Vec<PodListeners>> {
        pods.iter()
            .map(|(name, addrs)| {
                let listeners = addrs
                    .iter()
                    .map(|&a| {
                        bind(a).map_err(|e| {
                            io::Error::new(e.kind(), format!("cannot listen on {a}: {e}"))
                        })
                    })
                    .collect::<io::Result<Vec<_>>>()?;
                Ok(PodListeners {
                    name: name.clone(),
                    listeners,
                })
            })
            .collect()
    }
}

/// A pod being served, with the addresses its sockets are bound to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServedPod {
    /// The pod's name.
    pub name: String,
    /// The bound addresses (ports resolved when 0 was asked for).
    pub addrs: Vec<SocketAddr>,
}

/// Options of an echo process.
#[derive(Clone, Debug, Default)]
pub struct EchoOptions {
    /// Print one line per request on stderr.
    pub log: bool,
    /// Serve TLS with this configuration (its ALPN decides HTTP/2 or HTTP/1.1).
    pub tls: Option<Arc<rustls::ServerConfig>>,
}

/// The body of echo responses: whole, or a stream of frames with trailers (gRPC).
type EchoBody = BoxBody<Bytes, Infallible>;

fn full(bytes: Bytes) -> EchoBody {
    Full::new(bytes).boxed()
}

/// Binds one listening socket: `SO_REUSEADDR`, `IPV6_V6ONLY` on IPv6 addresses, non-blocking.
pub fn bind(addr: SocketAddr) -> io::Result<std::net::TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    if addr.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    socket.set_reuse_address(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    Ok(socket.into())
}

/// A running echo process: its pods serve until it is dropped (or [`EchoServer::shutdown`]),
/// which also cuts their open connections.
#[derive(Debug)]
pub struct EchoServer {
    pods: Vec<ServedPod>,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl EchoServer {
    /// Binds every address of every pod and serves them. Must be called inside a Tokio runtime.
    pub fn bind(
        identity: Identity,
        pods: &[(String, Vec<SocketAddr>)],
        options: EchoOptions,
    ) -> io::Result<EchoServer> {
        EchoServer::serve(identity, PodListeners::bind(pods)?, options)
    }

    /// Serves pods on sockets bound by the caller. Must be called inside a Tokio runtime.
    pub fn serve(
        identity: Identity,
        pods: Vec<PodListeners>,
        options: EchoOptions,
    ) -> io::Result<EchoServer> {
        let (stop, _) = watch::channel(false);
        let identity = Arc::new(identity);
        let mut served = Vec::with_capacity(pods.len());
        let mut tasks = Vec::new();
        for pod in pods {
            let name: Arc<str> = pod.name.as_str().into();
            let mut addrs = Vec::with_capacity(pod.listeners.len());
            for listener in pod.listeners {
                listener.set_nonblocking(true)?;
                let listener = TcpListener::from_std(listener)?;
                addrs.push(listener.local_addr()?);
                let ctx = PodContext {
                    identity: identity.clone(),
                    pod: name.clone(),
                    log: options.log,
                    tls: options.tls.clone(),
                };
                tasks.push(tokio::spawn(accept_loop(listener, ctx, stop.subscribe())));
            }
            served.push(ServedPod {
                name: pod.name,
                addrs,
            });
        }
        Ok(EchoServer {
            pods: served,
            stop,
            tasks,
        })
    }

    /// The pods with their bound addresses.
    pub fn pods(&self) -> &[ServedPod] {
        &self.pods
    }

    /// Stops accepting and cuts every open connection.
    pub fn shutdown(self) {
        drop(self);
    }

    /// Like [`EchoServer::shutdown`], returning once the listening sockets are closed (so their
    /// ports can be bound again).
    pub async fn close(mut self) {
        let _ = self.stop.send(true);
        for task in std::mem::take(&mut self.tasks) {
            task.abort();
            let _ = task.await;
        }
    }

    /// Waits until the server is stopped from elsewhere (never returns otherwise).
    pub async fn run_forever(&self) {
        stopped(&mut self.stop.subscribe()).await;
    }
}

impl Drop for EchoServer {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        for task in &self.tasks {
            task.abort();
        }
    }
}

#[derive(Clone, Debug)]
struct PodContext {
    identity: Arc<Identity>,
    pod: Arc<str>,
    log: bool,
    tls: Option<Arc<rustls::ServerConfig>>,
}

#[derive(Debug)]
struct ConnContext {
    pod: PodContext,
    local: SocketAddr,
    peer: SocketAddr,
}

async fn accept_loop(listener: TcpListener, ctx: PodContext, mut stop: watch::Receiver<bool>) {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new()).keep_alive(true);
    builder.http2().timer(TokioTimer::new());
    let builder = Arc::new(builder);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            },
            _ = stopped(&mut stop) => return,
        };
        let _ = stream.set_nodelay(true);
        let local = match stream.local_addr() {
            Ok(local) => local,
            Err(_) => continue,
        };
        let conn = Arc::new(ConnContext {
            pod: ctx.clone(),
            local: canonical(local),
            peer: canonical(peer),
        });
        let builder = builder.clone();
        let mut stop = stop.clone();
        let tls = ctx.tls.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| handle(req, conn.clone()));
            match tls {
                None => {
                    let serving =
                        builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
                    tokio::select! {
                        _ = serving => {}
                        _ = stopped(&mut stop) => {}
                    }
                }
                Some(config) => {
                    let acceptor = tokio_rustls::TlsAcceptor::from(config);
                    let Ok(Ok(stream)) =
                        tokio::time::timeout(Duration::from_secs(10), acceptor.accept(stream))
                            .await
                    else {
                        return;
                    };
                    let serving =
                        builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
                    tokio::select! {
                        _ = serving => {}
                        _ = stopped(&mut stop) => {}
                    }
                }
            }
        });
    }
}

async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

fn canonical(addr: SocketAddr) -> SocketAddr {
    SocketAddr::new(addr.ip().to_canonical(), addr.port())
}

fn proto(version: Version) -> &'static str {
    match version {
        Version::HTTP_09 => "HTTP/0.9",
        Version::HTTP_10 => "HTTP/1.0",
        Version::HTTP_11 => "HTTP/1.1",
        Version::HTTP_2 => "HTTP/2.0",
        Version::HTTP_3 => "HTTP/3.0",
        _ => "HTTP/?",
    }
}

fn has_token(headers: &HeaderMap, name: header::HeaderName, token: &str) -> bool {
    headers.get_all(name).iter().any(|v| {
        v.to_str()
            .unwrap_or("")
            .split(',')
            .any(|t| t.trim().eq_ignore_ascii_case(token))
    })
}

/// Whether a request asks for a WebSocket upgrade (`Upgrade: websocket` and `Connection: upgrade`).
pub fn is_websocket_upgrade(headers: &HeaderMap) -> bool {
    has_token(headers, header::UPGRADE, "websocket")
        && has_token(headers, header::CONNECTION, "upgrade")
}

async fn handle(
    mut req: Request<Incoming>,
    conn: Arc<ConnContext>,
) -> Result<Response<EchoBody>, Infallible> {
    let family = Family::of(&conn.local);
    if conn.pod.log {
        eprintln!(
            "duet-echo: pod={} family={} local={} peer={} {} {} host={}",
            conn.pod.pod,
            family,
            conn.local,
            conn.peer,
            req.method(),
            req.uri(),
            host_of(&req),
        );
    }
    if req.version() <= Version::HTTP_11 && is_websocket_upgrade(req.headers()) {
        let upgrade = hyper::upgrade::on(&mut req);
        tokio::spawn(async move {
            if let Ok(upgraded) = upgrade.await {
                echo_bytes(TokioIo::new(upgraded)).await;
            }
        });
        let mut res = Response::new(full(Bytes::new()));
        *res.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
        let h = res.headers_mut();
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
        let mut put = |name: &'static str, value: String| {
            if let Ok(v) = HeaderValue::from_str(&value) {
                h.insert(name, v);
            }
        };
        put("x-echo-pod", conn.pod.pod.to_string());
        put("x-echo-family", family.to_string());
        put("x-echo-local", conn.local.to_string());
        put("x-echo-peer", conn.peer.to_string());
        return Ok(res);
    }
    if req.uri().path() == "/health" && req.method() == Method::GET {
        let mut res = Response::new(full(Bytes::from_static(b"OK")));
        res.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        return Ok(res);
    }
    let delay = header_text(req.headers(), "x-echo-delay-ms")
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(|ms| Duration::from_millis(ms.min(60_000)));
    let extra = response_headers(req.headers());
    let grpc = header_text(req.headers(), "content-type")
        .filter(|t| t.starts_with("application/grpc"))
        .map(|_| {
            let count = header_text(req.headers(), "x-echo-grpc-messages")
                .and_then(|v| v.trim().parse::<usize>().ok())
                .unwrap_or(1)
                .min(100);
            let status = header_text(req.headers(), "x-echo-grpc-status")
                .and_then(|v| v.trim().parse::<u32>().ok())
                .unwrap_or(0);
            (count, status)
        });
    let (parts, body) = req.into_parts();
    let body = match body.collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => Bytes::new(),
    };
    let body_length = body.len() as u64;
    if let Some(raw) = raw_answer(&parts.headers, body, (&conn.pod.pod, family)) {
        return Ok(raw);
    }
    let mut headers: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (name, value) in &parts.headers {
        if name == header::HOST {
            continue;
        }
        headers
            .entry(canonical_header_key(name.as_str()))
            .or_default()
            .push(String::from_utf8_lossy(value.as_bytes()).into_owned());
    }
    let path = if parts.version == Version::HTTP_2 {
        parts
            .uri
            .path_and_query()
            .map(|p| p.as_str().to_owned())
            .unwrap_or_default()
    } else {
        parts.uri.to_string()
    };
    let echo = Echo {
        path,
        host: host_from(&parts.headers, &parts.uri),
        method: parts.method.as_str().to_owned(),
        proto: proto(parts.version).to_owned(),
        headers,
        namespace: conn.pod.identity.namespace.clone(),
        ingress: conn.pod.identity.ingress.clone(),
        service: conn.pod.identity.service.clone(),
        pod: conn.pod.pod.to_string(),
        family,
        local: conn.local,
        peer: conn.peer,
        body_length,
    };
    let mut body = Vec::with_capacity(1024);
    let formatter = serde_json::ser::PrettyFormatter::with_indent(b" ");
    let mut ser = serde_json::Serializer::with_formatter(&mut body, formatter);
    if echo.serialize(&mut ser).is_err() {
        let mut res = Response::new(full(Bytes::from_static(
            b"{\"message\": \"cannot encode\"}\n",
        )));
        *res.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
        return Ok(res);
    }
    body.push(b'\n');
    if let Some(delay) = delay {
        tokio::time::sleep(delay).await;
    }
    if let Some(grpc) = grpc {
        return Ok(grpc_response(&echo, grpc));
    }
    let mut res = Response::new(full(Bytes::from(body)));
    let h = res.headers_mut();
    for (name, value) in extra {
        h.append(name, value);
    }
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    Ok(res)
}

/// A gRPC answer: `count` length-prefixed messages (the compact echo JSON), each its own DATA
/// frame, then `grpc-status` and `grpc-message` trailers.
fn grpc_response(echo: &Echo, (count, status): (usize, u32)) -> Response<EchoBody> {
    let message = serde_json::to_vec(echo).unwrap_or_default();
    let mut frames: Vec<Result<Frame<Bytes>, Infallible>> = Vec::with_capacity(count + 1);
    for _ in 0..count {
        frames.push(Ok(Frame::data(grpc_frame(&message))));
    }
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from(status));
    let text = if status == 0 { "ok" } else { "failed" };
    trailers.insert("grpc-message", HeaderValue::from_static(text));
    frames.push(Ok(Frame::trailers(trailers)));
    let body = StreamBody::new(futures_util::stream::iter(frames)).boxed();
    let mut res = Response::new(body);
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    res
}

/// One gRPC length-prefixed message: a zero compression flag, the length (big endian), the bytes.
pub fn grpc_frame(message: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(5 + message.len());
    out.push(0);
    out.extend_from_slice(&(message.len() as u32).to_be_bytes());
    out.extend_from_slice(message);
    Bytes::from(out)
}

/// Splits a body into its gRPC length-prefixed messages; `None` when it is not well framed.
pub fn grpc_messages(mut body: &[u8]) -> Option<Vec<Bytes>> {
    let mut out = Vec::new();
    while !body.is_empty() {
        if body.len() < 5 || body[0] != 0 {
            return None;
        }
        let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
        let rest = &body[5..];
        if rest.len() < len {
            return None;
        }
        out.push(Bytes::copy_from_slice(&rest[..len]));
        body = &rest[len..];
    }
    Some(out)
}

fn header_text<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// The headers `X-Echo-Set-Header` asks for: `Name: value` pairs separated by commas.
/// A raw answer instead of the echo JSON: `x-echo-body` sends the request body back as it came,
/// `x-echo-response-bytes: N` sends N bytes (at most 64 MiB; byte i is `i % 251`); both with the
/// pod and family in `x-echo-pod` and `x-echo-family`.
fn raw_answer(
    headers: &HeaderMap,
    body: Bytes,
    (pod, family): (&str, Family),
) -> Option<Response<EchoBody>> {
    let body = if headers.contains_key("x-echo-body") {
        body
    } else {
        let n = header_text(headers, "x-echo-response-bytes")?
            .trim()
            .parse::<usize>()
            .ok()?
            .min(64 << 20);
        (0..n).map(|i| (i % 251) as u8).collect::<Vec<u8>>().into()
    };
    let mut res = Response::new(full(body));
    let h = res.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    if let Ok(v) = HeaderValue::from_str(pod) {
        h.insert("x-echo-pod", v);
    }
    if let Ok(v) = HeaderValue::from_str(&family.to_string()) {
        h.insert("x-echo-family", v);
    }
    Some(res)
}

fn response_headers(headers: &HeaderMap) -> Vec<(header::HeaderName, HeaderValue)> {
    headers
        .get_all("x-echo-set-header")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|pair| {
            let (name, value) = pair.split_once(':')?;
            let name = header::HeaderName::from_bytes(name.trim().as_bytes()).ok()?;
            let value = HeaderValue::from_str(value.trim()).ok()?;
            Some((name, value))
        })
        .collect()
}

fn host_of(req: &Request<Incoming>) -> String {
    host_from(req.headers(), req.uri())
}

fn host_from(headers: &HeaderMap, uri: &http::Uri) -> String {
    headers
        .get(header::HOST)
        .map(|h| String::from_utf8_lossy(h.as_bytes()).into_owned())
        .or_else(|| uri.authority().map(|a| a.as_str().to_owned()))
        .unwrap_or_default()
}

async fn echo_bytes<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(mut io: T) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match io.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if io.write_all(&buf[..n]).await.is_err() || io.flush().await.is_err() {
                    return;
                }
            }
        }
    }
    let _ = io.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_keys_follow_go() {
        assert_eq!(canonical_header_key("x-forwarded-for"), "X-Forwarded-For");
        assert_eq!(canonical_header_key("USER-AGENT"), "User-Agent");
        assert_eq!(canonical_header_key("x-real-ip"), "X-Real-Ip");
        assert_eq!(canonical_header_key("te"), "Te");
        assert_eq!(canonical_header_key("bad header"), "bad header");
    }

    #[test]
    fn echo_json_keeps_upstream_key_order() {
        let echo = Echo {
            path: "/a?b=c".into(),
            host: "h".into(),
            method: "GET".into(),
            proto: "HTTP/1.1".into(),
            headers: BTreeMap::new(),
            namespace: "ns".into(),
            ingress: "ing".into(),
            service: "svc".into(),
            pod: "p".into(),
            family: Family::V6,
            local: "[::1]:80".parse().unwrap(),
            peer: "[::1]:4711".parse().unwrap(),
            body_length: 0,
        };
        let text = serde_json::to_string(&echo).unwrap();
        let keys = [
            "\"path\"",
            "\"host\"",
            "\"method\"",
            "\"proto\"",
            "\"headers\"",
            "\"namespace\"",
            "\"ingress\"",
            "\"service\"",
            "\"pod\"",
            "\"family\"",
            "\"local\"",
            "\"peer\"",
            "\"bodyLength\"",
        ];
        let positions: Vec<usize> = keys.iter().map(|k| text.find(k).unwrap()).collect();
        assert!(positions.windows(2).all(|w| w[0] < w[1]), "{text}");
        assert!(text.contains("\"family\":\"ipv6\""), "{text}");
        assert!(text.contains("\"local\":\"[::1]:80\""), "{text}");
        let back: Echo = serde_json::from_str(&text).unwrap();
        assert_eq!(back, echo);
    }

    #[test]
    fn upstream_json_without_extensions_parses() {
        let text = r#"{"path":"/","host":"h","method":"GET","proto":"HTTP/1.1","headers":{},
            "namespace":"n","ingress":"i","service":"s","pod":"p"}"#;
        let echo: Echo = serde_json::from_str(text).unwrap();
        assert_eq!(echo.pod, "p");
    }
}
