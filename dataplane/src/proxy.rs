//! The reverse proxy: route lookup, target pick by client family, pooled HTTP/1.1 upstream
//! connections with per-family fallback, forwarding headers and upgrade tunnels. HTTP/2 and TLS
//! upstreams go through [`crate::upstream`].

use std::collections::HashMap;
use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode, Uri, Version};
use http_body_util::{Either, Empty, Full};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::balance::InFlight;
use crate::host::{HostError, ValidHost};
use crate::limits::{self, Limited};
use crate::listen::ConnInfo;
use crate::observe::Exchange;
use crate::path::EncodedTraversal;
use crate::read_timeout::ReadTimeout;
use crate::runtime::Runtime;
use crate::table::{BackendId, Rewritten};
use crate::tunnel::Tunnels;
use crate::upstream::{H2Pool, UpstreamTls};

/// Why the proxy answered by itself; each variant knows its side and status.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// No host or path rule matched and there is no default backend (404).
    #[error("no route")]
    NoRoute,
    /// The backend has no target that the family policy admits for this client (503).
    #[error("no ready target in {0}")]
    NoTarget(BackendId),
    /// Every connection attempt to the backend's targets failed (502).
    #[error("cannot connect to {backend}")]
    Connect {
        /// The backend.
        backend: BackendId,
        /// The last connect error.
        #[source]
        source: io::Error,
    },
    /// The request body is larger than the route allows (413): declared, or counted before any
    /// response.
    #[error("request body too large")]
    BodyTooLarge,
    /// The route's source ranges refuse the client's address (403).
    #[error("client address not allowed")]
    Forbidden,
    /// The route's source ranges do not parse, so it admits nobody (503).
    #[error("invalid source ranges")]
    InvalidSourceRanges,
    /// The upstream did not send a response head in time (504).
    #[error("upstream timed out")]
    Timeout,
    /// The upstream connection failed while the request was in flight (502).
    #[error("upstream failed")]
    Upstream(#[source] hyper::Error),
    /// The request's host is missing, repeated, contradictory or not a host (400).
    #[error("bad host: {0}")]
    Host(#[from] HostError),
    /// The path climbs through percent-encoded dots or slashes (400).
    #[error("bad path: {0}")]
    Path(#[from] EncodedTraversal),
    /// A `rewrite-target` made a request target that does not parse (500).
    #[error("rewritten request target does not parse")]
    BadRewrite,
    /// The upstream switched protocols (101) without a WebSocket upgrade asked for (502).
    #[error("upstream switched protocols unasked")]
    UnaskedUpgrade,
}

impl ProxyError {
    /// A failed upstream request whose body passed the limit as it streamed (no declared length)
    /// was aborted before any response: that is the client's 413, not a 502.
    fn body_limit_checked(self) -> ProxyError {
        match self {
            ProxyError::Upstream(e) if limits::body_too_large(&e) => ProxyError::BodyTooLarge,
            other => other,
        }
    }

    /// The status code the client sees.
    pub fn status(&self) -> StatusCode {
        match self {
            ProxyError::NoRoute => StatusCode::NOT_FOUND,
            ProxyError::NoTarget(_) | ProxyError::InvalidSourceRanges => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            ProxyError::Forbidden => StatusCode::FORBIDDEN,
            ProxyError::Connect { .. } | ProxyError::Upstream(_) | ProxyError::UnaskedUpgrade => {
                StatusCode::BAD_GATEWAY
            }
            ProxyError::Host(_) | ProxyError::Path(_) => StatusCode::BAD_REQUEST,
            ProxyError::Timeout => StatusCode::GATEWAY_TIMEOUT,
            ProxyError::BodyTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ProxyError::BadRewrite => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn body(&self) -> &'static str {
        match self {
            ProxyError::NoRoute => "404 no route for this host and path\n",
            ProxyError::NoTarget(_) => "503 no ready upstream target\n",
            ProxyError::Forbidden => "403 client address not allowed\n",
            ProxyError::InvalidSourceRanges => "503 this route's source ranges are invalid\n",
            ProxyError::Connect { .. } => "502 cannot connect to upstream\n",
            ProxyError::Upstream(_) => "502 upstream connection failed\n",
            ProxyError::Timeout => "504 upstream timed out\n",
            ProxyError::BodyTooLarge => "413 request body too large\n",
            ProxyError::Host(_) => "400 invalid host\n",
            ProxyError::Path(_) => "400 invalid path\n",
            ProxyError::UnaskedUpgrade => "502 upstream switched protocols unasked\n",
            ProxyError::BadRewrite => "500 the rewritten request target is invalid\n",
        }
    }

    fn into_response(self) -> Response<ProxyBody> {
        let mut res = Response::new(ProxyBody::full(Bytes::from_static(self.body().as_bytes())));
        *res.status_mut() = self.status();
        res.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        res
    }
}

/// The body of a proxied response: the upstream's stream or a short local answer. It holds the
/// target's in-flight mark until the body is done, so balancing sees streaming responses.
#[derive(Debug)]
pub struct ProxyBody {
    inner: Either<ReadTimeout<Incoming>, Full<Bytes>>,
    _in_flight: Option<InFlight>,
    /// Records the request (metrics, access log) when the body is done or dropped.
    exchange: Option<Exchange>,
    /// The HTTP/1.1 upstream connection, back to the pool once this body is done.
    _pool_return: Option<PoolReturn>,
}

impl ProxyBody {
    fn full(bytes: Bytes) -> ProxyBody {
        ProxyBody {
            inner: Either::Right(Full::new(bytes)),
            _in_flight: None,
            exchange: None,
            _pool_return: None,
        }
    }
}

/// An HTTP/1.1 upstream connection whose response is being relayed; dropped with the response
/// body, it goes back to the pool. By then the connection has almost always read the whole
/// response and is ready for the next request, so it is pooled at once; otherwise a task waits
/// until it is ready (or closed, and then it is not pooled).
#[derive(Debug)]
struct PoolReturn {
    sender: Option<SendRequest<UpstreamBody>>,
    pool: Arc<Pool>,
    key: PoolKey,
    max: usize,
}

impl Drop for PoolReturn {
    fn drop(&mut self) {
        let Some(mut sender) = self.sender.take() else {
            return;
        };
        if sender.is_ready() {
            self.pool.put(self.key, sender, self.max);
        } else if !sender.is_closed() {
            let (pool, key, max) = (self.pool.clone(), self.key, self.max);
            tokio::spawn(async move {
                if sender.ready().await.is_ok() {
                    pool.put(key, sender, max);
                }
            });
        }
    }
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        let polled = match &mut this.inner {
            Either::Left(incoming) => Pin::new(incoming).poll_frame(cx),
            Either::Right(full) => Pin::new(full)
                .poll_frame(cx)
                .map_err(|never| match never {}),
        };
        if let (Poll::Ready(Some(Ok(frame))), Some(exchange)) = (&polled, &mut this.exchange) {
            exchange.add_bytes(frame.data_ref().map_or(0, Bytes::len));
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The body sent upstream: the client's stream (counted against the route's body limit), or
/// nothing for a replayed bodyless request.
pub(crate) type UpstreamBody = Either<Limited<Incoming>, Empty<Bytes>>;

/// A pooled connection and when it went idle.
type IdleConn = (SendRequest<UpstreamBody>, Instant);

/// Where a pooled connection goes: the address, and the TLS settings' key (0: plain TCP).
type PoolKey = (SocketAddr, u64);

/// Idle upstream HTTP/1.1 connections by address.
#[derive(Debug, Default)]
struct Pool {
    idle: Mutex<HashMap<PoolKey, Vec<IdleConn>>>,
}

impl Pool {
    fn take(&self, addr: PoolKey, max_idle: Duration) -> Option<SendRequest<UpstreamBody>> {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let list = idle.get_mut(&addr)?;
        while let Some((sender, since)) = list.pop() {
            if sender.is_ready() && since.elapsed() < max_idle {
                return Some(sender);
            }
        }
        None
    }

    fn put(&self, addr: PoolKey, sender: SendRequest<UpstreamBody>, max_per_addr: usize) {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let list = idle.entry(addr).or_default();
        if list.len() < max_per_addr {
            list.push((sender, Instant::now()));
        }
    }

    /// Drops closed and expired connections, and addresses with none left.
    fn reap(&self, max_idle: Duration) {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        idle.retain(|_, list| {
            list.retain(|(sender, since)| !sender.is_closed() && since.elapsed() < max_idle);
            !list.is_empty()
        });
    }
}

/// The proxy, shared by every listener.
#[derive(Debug)]
pub struct Proxy {
    runtime: Arc<Runtime>,
    pool: Arc<Pool>,
    h2: Arc<H2Pool>,
    tunnels: Arc<Tunnels>,
    gate: crate::policy::Gate,
}

/// The settings of an `Upgrade: h2c` request (RFC 7540 §3.2.1), never forwarded.
static HTTP2_SETTINGS: HeaderName = HeaderName::from_static("http2-settings");
static X_FORWARDED_PREFIX: HeaderName = HeaderName::from_static("x-forwarded-prefix");

/// Hop-by-hop headers (RFC 9110 7.6.1), never forwarded.
const HOP_BY_HOP_NAMES: usize = 7;
const HOP_BY_HOP: [HeaderName; HOP_BY_HOP_NAMES] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

impl Proxy {
    /// A proxy over a runtime. Must be called within a Tokio runtime (it starts the pool reaper).
    pub fn new(runtime: Arc<Runtime>) -> Arc<Proxy> {
        let pool = Arc::new(Pool::default());
        let h2 = Arc::new(H2Pool::default());
        let weak = Arc::downgrade(&pool);
        let weak_h2 = Arc::downgrade(&h2);
        let max_idle = runtime.config.upstream_idle_timeout;
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(max_idle.min(Duration::from_secs(30)));
            loop {
                tick.tick().await;
                match (weak.upgrade(), weak_h2.upgrade()) {
                    (Some(pool), Some(h2)) => {
                        pool.reap(max_idle);
                        h2.reap(max_idle);
                    }
                    _ => return,
                }
            }
        });
        let tunnels = Arc::new(Tunnels::new(runtime.telemetry().metrics().clone()));
        let gate = crate::policy::Gate::new(
            runtime.config.connect_timeout,
            runtime.config.response_timeout,
        );
        Arc::new(Proxy {
            runtime,
            pool,
            h2,
            tunnels,
            gate,
        })
    }

    /// The open WebSocket tunnels (drained on shutdown).
    pub fn tunnels(&self) -> &Arc<Tunnels> {
        &self.tunnels
    }

    /// Handles one client request; every response carries `Server: duet`.
    pub async fn handle(
        self: Arc<Self>,
        req: Request<Incoming>,
        conn: Arc<ConnInfo>,
    ) -> Result<Response<ProxyBody>, Infallible> {
        let mut exchange = self.runtime.telemetry().exchange(&req, &conn);
        let mut res = match self.forward(req, &conn, &mut exchange).await {
            Ok(res) => res,
            Err(error) => {
                tracing::trace!(%error, client.addr = %conn.peer, "Answered locally");
                error.into_response()
            }
        };
        res.headers_mut()
            .insert(header::SERVER, HeaderValue::from_static("duet"));
        if let Some(admission) = exchange.admission() {
            admission.decorate(res.status(), res.headers_mut());
        }
        exchange.set_status(res.status().as_u16());
        res.body_mut().exchange = Some(exchange);
        Ok(res)
    }

    async fn forward(
        &self,
        mut req: Request<Incoming>,
        conn: &ConnInfo,
        exchange: &mut Exchange,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        let live = self.runtime.load_full();
        let host = crate::host::request_host(&req)?;
        let target = origin_form(req.uri())?;
        let matched = live
            .snapshot
            .routes
            .find(host.as_str(), target.path())
            .ok_or(ProxyError::NoRoute)?;
        let action = matched.action;
        exchange.matched(&live, action);
        if let Some(res) = action
            .redirect
            .as_deref()
            .and_then(|r| redirect(r, path_and_query(&target), &host, req.headers(), conn))
        {
            return Ok(res);
        }
        // A full-URL rewrite answers before the HTTPS redirect (nginx's rewrite module runs before
        // ingress-nginx's Lua redirect); that one keeps the path as received.
        let upstream_target = match rewrite(&matched, &target, req.headers_mut())? {
            Rewrite::None => None,
            Rewrite::Target(uri) => Some(uri),
            Rewrite::Found(location) => return Ok(found(&location)),
        };
        let cors = crate::policy::cors_for(action, req.headers());
        if let Some(headers) = crate::policy::preflight(req.method(), cors.as_ref()) {
            let mut res = Response::new(ProxyBody::full(Bytes::new()));
            *res.status_mut() = StatusCode::NO_CONTENT;
            *res.headers_mut() = headers;
            return Ok(res);
        }
        if action.redirect_https && crate::forwarded::request_scheme(req.headers(), conn) != "https"
        {
            return Ok(self.redirect(&target, &host, conn));
        }
        // After the redirects, as nginx's access phase follows its rewrite phase.
        if let Some(ranges) = action.source_ranges.as_deref() {
            ranges
                .admit(conn.peer.ip())
                .map_err(|refusal| match refusal {
                    crate::table::Refusal::Forbidden => ProxyError::Forbidden,
                    crate::table::Refusal::Misconfigured => ProxyError::InvalidSourceRanges,
                })?;
        }
        if body_too_large(req.headers(), action.max_body_bytes) {
            return Err(ProxyError::BodyTooLarge);
        }
        // Limits, basic and external auth (crate::policy): refused requests are answered here.
        let client = crate::policy::Client {
            ip: conn.peer.ip(),
            scheme: conn.scheme(),
            pass_scheme: crate::forwarded::request_scheme(req.headers(), conn),
            host: host.as_str(),
        };
        let zone = (&*action.origin.namespace, &*action.origin.name);
        let access = action.access.as_deref();
        match self.gate.admit(access, zone, &mut req, client).await {
            Ok(admission) => exchange.hold(admission),
            Err(answer) => return Ok((*answer).map(ProxyBody::full)),
        }
        let preferred = action.policy.order(conn.family)[0].unwrap_or(conn.family);
        let steered = crate::policy::steer_request(
            action,
            req.headers(),
            &target,
            host.as_str(),
            conn.peer.ip(),
            &live.backends,
        );
        let https = crate::forwarded::request_scheme(req.headers(), conn) == "https";
        let backend = live
            .backends
            .get(steered.backend)
            .ok_or_else(|| ProxyError::NoTarget(steered.backend.clone()))?;

        let protocol = action.protocol.unwrap_or(backend.backend.protocol);
        exchange.upstream_protocol(protocol);
        let tls = action.upstream_tls.as_deref().filter(|_| protocol.is_tls());
        if let Some(reason) = tls.and_then(UpstreamTls::error) {
            tracing::trace!(backend = %action.backend, %reason, "Upstream TLS is not usable");
            let source = io::Error::other(reason.to_owned());
            let backend = action.backend.clone();
            return Err(ProxyError::Connect { backend, source });
        }
        let h2 = protocol.is_h2();
        let trailers = h2 && crate::upstream::wants_trailers(req.headers());
        let upgrade = is_websocket_upgrade(req.headers());
        let client_upgrade = upgrade.then(|| hyper::upgrade::on(&mut req));
        let length = req.body().size_hint().exact();
        let target = upstream_target.unwrap_or(target);
        prepare_request(&mut req, &host, target, conn, upgrade);
        crate::policy::set_upstream_host(action, req.headers_mut());
        declare_length(req.headers_mut(), length);
        if trailers {
            crate::upstream::keep_trailers(&mut req);
        }
        let tls_key = tls.map_or(0, UpstreamTls::key);

        let config = &self.runtime.config;
        let connect_timeout = action.timeouts.connect.unwrap_or(config.connect_timeout);
        let read_timeout = action.timeouts.read.unwrap_or(config.response_timeout);
        let mut tried: Vec<usize> = Vec::new();
        let mut last_error: Option<io::Error> = None;
        let mut req = Some(req.map(|body| {
            Either::Left(Limited::new(body, action.max_body_bytes).watched(action.timeouts.send))
        }));
        for _ in 0..config.max_target_attempts {
            let Some(pick) = steered.pick(backend, conn.family, action.policy, &tried) else {
                break;
            };
            let cookie = steered.set_cookie(backend, pick.index, https);
            tried.push(pick.index);
            let state = &backend.states[pick.index];
            for (family, addr) in pick.addrs.into_iter().flatten() {
                exchange.upstream_begin();
                if h2 {
                    let request = req.take().expect("request is present until sent");
                    let in_flight = state.start();
                    let sent = self
                        .h2
                        .send(addr, tls, request, connect_timeout, read_timeout)
                        .await;
                    match sent {
                        Ok((mut res, fresh)) => {
                            if fresh {
                                state.record_success(family);
                            }
                            exchange.upstream_done(family, addr, preferred);
                            if res.status() == StatusCode::SWITCHING_PROTOCOLS {
                                return Err(ProxyError::UnaskedUpgrade);
                            }
                            strip_hop_by_hop(res.headers_mut(), false);
                            crate::policy::respond(res.headers_mut(), cookie, cors.as_ref());
                            return Ok(res.map(|body| ProxyBody {
                                inner: Either::Left(ReadTimeout::new(body, read_timeout)),
                                _in_flight: Some(in_flight),
                                exchange: None,
                                _pool_return: None,
                            }));
                        }
                        Err(SendError::Failed(error)) => {
                            exchange.upstream_done(family, addr, preferred);
                            return Err(error.body_limit_checked());
                        }
                        Err(SendError::Unsent(request, error)) => {
                            tracing::trace!(%error, upstream.addr = %addr, "Connect failed");
                            req = Some(*request);
                            exchange.connect_failed(family);
                            if state.record_failure(family) {
                                exchange.ejected(family);
                            }
                            last_error = Some(error);
                            continue;
                        }
                    }
                }
                let (sender, fresh) = match self
                    .pool
                    .take((addr, tls_key), config.upstream_idle_timeout)
                {
                    Some(sender) => (sender, false),
                    None => match connect(addr, tls, connect_timeout).await {
                        Ok(sender) => {
                            state.record_success(family);
                            (sender, true)
                        }
                        Err(error) => {
                            tracing::trace!(%error, upstream.addr = %addr, "Connect failed");
                            exchange.connect_failed(family);
                            if state.record_failure(family) {
                                exchange.ejected(family);
                                tracing::warn!(
                                    backend = %backend.id(),
                                    target = %backend.backend.targets[pick.index].id,
                                    family = %family,
                                    "Ejected a failing family of a target for a while"
                                );
                            }
                            last_error = Some(error);
                            continue;
                        }
                    },
                };
                let request = req.take().expect("request is present until sent");
                let in_flight = state.start();
                match self
                    .send(
                        sender,
                        fresh,
                        addr,
                        tls,
                        request,
                        connect_timeout,
                        read_timeout,
                    )
                    .await
                {
                    Ok((mut res, pool_return)) => {
                        exchange.upstream_done(family, addr, preferred);
                        let switching = res.status() == StatusCode::SWITCHING_PROTOCOLS;
                        if switching && !is_websocket_accept(res.headers()) {
                            return Err(ProxyError::UnaskedUpgrade);
                        }
                        strip_hop_by_hop(res.headers_mut(), switching);
                        crate::policy::respond(res.headers_mut(), cookie, cors.as_ref());
                        if let (true, Some(client)) = (switching, client_upgrade) {
                            let upstream = hyper::upgrade::on(&mut res);
                            self.tunnels
                                .spawn(client, upstream, read_timeout, conn.family);
                        }
                        return Ok(res.map(|body| ProxyBody {
                            inner: Either::Left(ReadTimeout::new(body, read_timeout)),
                            _in_flight: Some(in_flight),
                            exchange: None,
                            _pool_return: pool_return,
                        }));
                    }
                    Err(SendError::Failed(error)) => {
                        exchange.upstream_done(family, addr, preferred);
                        return Err(error.body_limit_checked());
                    }
                    Err(SendError::Unsent(request, error)) => {
                        // Connecting to this address again failed: nothing was sent, so the
                        // request may go to the other family or another target.
                        req = Some(*request);
                        exchange.connect_failed(family);
                        if state.record_failure(family) {
                            exchange.ejected(family);
                        }
                        last_error = Some(error);
                    }
                }
            }
        }
        match last_error {
            Some(source) => Err(ProxyError::Connect {
                backend: action.backend.clone(),
                source,
            }),
            None => Err(ProxyError::NoTarget(action.backend.clone())),
        }
    }

    /// The 308 to HTTPS of a plain-HTTP request for a TLS host.
    fn redirect(&self, target: &Uri, host: &ValidHost, conn: &ConnInfo) -> Response<ProxyBody> {
        let port = self.runtime.config.https_port(conn.family);
        let path = target.path_and_query().map_or("/", |pq| pq.as_str());
        let location = crate::tls::redirect_location(host.as_str(), port, path);
        let mut res = Response::new(ProxyBody::full(Bytes::new()));
        *res.status_mut() = StatusCode::PERMANENT_REDIRECT;
        if let Ok(v) = HeaderValue::from_str(&location) {
            res.headers_mut().insert(header::LOCATION, v);
        }
        res
    }

    /// Sends on a connection. A pooled connection that turns out closed before the request was
    /// written is replaced by a fresh one to the same address. So is one that fails before any
    /// response byte when the request is idempotent and bodyless (the upstream closed an idle
    /// connection as we reused it): that request is replayed once, as nginx and Go's client do.
    #[allow(clippy::too_many_arguments)] // The connection, the request and its route's timeouts.
    async fn send(
        &self,
        mut sender: SendRequest<UpstreamBody>,
        mut fresh: bool,
        addr: SocketAddr,
        tls: Option<&UpstreamTls>,
        mut request: Request<UpstreamBody>,
        connect_timeout: Duration,
        read_timeout: Duration,
    ) -> Result<(Response<Incoming>, Option<PoolReturn>), SendError> {
        let config = &self.runtime.config;
        let mut replay = (!fresh).then(|| Replay::of(&request)).flatten();
        loop {
            let watch = body_watch(&request);
            let sending = crate::send_watch::guard(watch, sender.try_send_request(request));
            let sent = tokio::time::timeout(read_timeout, sending)
                .await
                .ok()
                .flatten()
                .ok_or(());
            match sent {
                Err(_) => return Err(SendError::Failed(ProxyError::Timeout)),
                Ok(Ok(res)) => {
                    let pool_return =
                        (res.status() != StatusCode::SWITCHING_PROTOCOLS).then(|| PoolReturn {
                            sender: Some(sender),
                            pool: self.pool.clone(),
                            key: (addr, tls.map_or(0, UpstreamTls::key)),
                            max: config.upstream_idle_per_addr,
                        });
                    return Ok((res, pool_return));
                }
                Ok(Err(mut error)) => match error.take_message() {
                    Some(unsent) if !fresh => {
                        request = unsent;
                        match connect(addr, tls, connect_timeout).await {
                            Ok(s) => {
                                sender = s;
                                fresh = true;
                            }
                            Err(e) => return Err(SendError::Unsent(Box::new(request), e)),
                        }
                    }
                    Some(unsent) => {
                        let e =
                            io::Error::new(io::ErrorKind::ConnectionAborted, error.into_error());
                        return Err(SendError::Unsent(Box::new(unsent), e));
                    }
                    None => match replay.take() {
                        Some(again) if !fresh => {
                            tracing::trace!(upstream.addr = %addr, error = %error.error(), "Replaying on a fresh connection");
                            request = again.into_request();
                            match connect(addr, tls, connect_timeout).await {
                                Ok(s) => {
                                    sender = s;
                                    fresh = true;
                                }
                                Err(e) => return Err(SendError::Unsent(Box::new(request), e)),
                            }
                        }
                        _ => {
                            return Err(SendError::Failed(ProxyError::Upstream(error.into_error())))
                        }
                    },
                },
            }
        }
    }
}

pub(crate) enum SendError {
    /// The request was not written; it can go elsewhere.
    Unsent(Box<Request<UpstreamBody>>, io::Error),
    /// The request may have reached the upstream; answer the client with this.
    Failed(ProxyError),
}

/// What it takes to send a bodyless idempotent request again.
pub(crate) struct Replay {
    parts: http::request::Parts,
}

impl Replay {
    pub(crate) fn of(request: &Request<UpstreamBody>) -> Option<Replay> {
        if !request.method().is_idempotent() || !request.body().is_end_stream() {
            return None;
        }
        let mut parts = Request::new(()).into_parts().0;
        parts.method = request.method().clone();
        parts.uri = request.uri().clone();
        parts.version = request.version();
        parts.headers = request.headers().clone();
        Some(Replay { parts })
    }

    pub(crate) fn into_request(self) -> Request<UpstreamBody> {
        Request::from_parts(self.parts, Either::Right(Empty::new()))
    }
}

async fn connect(
    addr: SocketAddr,
    tls: Option<&UpstreamTls>,
    timeout: Duration,
) -> io::Result<SendRequest<UpstreamBody>> {
    if let Some(tls) = tls {
        return crate::upstream::connect_h1_tls(addr, tls, timeout).await;
    }
    let stream = tokio::time::timeout(timeout, TcpStream::connect(addr))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "connect timed out"))??;
    let _ = stream.set_nodelay(true);
    let (sender, connection) = hyper::client::conn::http1::Builder::new()
        .max_buf_size(crate::limits::UPSTREAM_H1_BUF)
        .handshake(TokioIo::new(stream))
        .await
        .map_err(io::Error::other)?;
    tokio::spawn(async move {
        if let Err(error) = connection.with_upgrades().await {
            tracing::trace!(%error, upstream.addr = %addr, "Upstream connection ended");
        }
    });
    Ok(sender)
}

/// The request target in origin form with its path normalised ([`crate::path`]) and its query
/// as received.
fn origin_form(uri: &Uri) -> Result<Uri, EncodedTraversal> {
    let path = crate::path::normalize(uri.path())?;
    let unchanged = matches!(path, std::borrow::Cow::Borrowed(_));
    if unchanged && uri.scheme().is_none() && uri.authority().is_none() {
        return Ok(uri.clone());
    }
    let target = match uri.query() {
        Some(query) => format!("{path}?{query}"),
        None => path.into_owned(),
    };
    // Built from the parts of a parsed URI, so it parses again.
    Ok(Uri::try_from(target).unwrap_or_else(|_| Uri::from_static("/")))
}

/// Sends exactly one framing upstream: a client's `Content-Length` is replaced by the one length
/// of its body when known (hyper has checked it), and dropped otherwise (then the body goes
/// chunked).
fn declare_length(headers: &mut HeaderMap, length: Option<u64>) {
    if headers.contains_key(header::CONTENT_LENGTH) {
        match length {
            Some(len) => {
                headers.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
            }
            None => {
                headers.remove(header::CONTENT_LENGTH);
            }
        }
    }
}

/// The send-timeout watch of an upstream request's body, if its route sets one.
pub(crate) fn body_watch(
    request: &Request<UpstreamBody>,
) -> Option<Arc<crate::send_watch::SendWatch>> {
    match request.body() {
        Either::Left(limited) => limited.watch(),
        Either::Right(_) => None,
    }
}

/// The path and query of an origin-form target.
fn path_and_query(target: &Uri) -> &str {
    target.path_and_query().map_or("/", |pq| pq.as_str())
}

/// The answer of a route's redirect annotations to a request, if they redirect it.
fn redirect(
    r: &crate::table::Redirect,
    path: &str,
    host: &ValidHost,
    headers: &HeaderMap,
    conn: &ConnInfo,
) -> Option<Response<ProxyBody>> {
    let scheme = crate::forwarded::request_scheme(headers, conn);
    let (code, location) = r.answer(path, scheme, host.as_str())?;
    let mut res = Response::new(ProxyBody::full(Bytes::new()));
    *res.status_mut() = StatusCode::from_u16(code).ok()?;
    res.headers_mut()
        .insert(header::LOCATION, HeaderValue::from_str(&location).ok()?);
    Some(res)
}

/// What a route's `rewrite-target` makes of a request.
enum Rewrite {
    /// No rewrite: the request target goes upstream.
    None,
    /// This target goes upstream.
    Target(Uri),
    /// A full-URL target: answer 302 with this `Location`.
    Found(String),
}

/// Applies a route's `rewrite-target`, setting `X-Forwarded-Prefix` when the route says so.
fn rewrite(
    matched: &crate::table::Matched<'_>,
    target: &Uri,
    headers: &mut HeaderMap,
) -> Result<Rewrite, ProxyError> {
    let (Some(rewrite), Some(matcher)) = (&matched.action.rewrite, matched.matcher) else {
        return Ok(Rewrite::None);
    };
    match rewrite.apply(matcher, target.path(), target.query()) {
        Rewritten::Redirect(location) => Ok(Rewrite::Found(location)),
        Rewritten::Target(rewritten) => {
            let uri = Uri::try_from(rewritten).map_err(|_| ProxyError::BadRewrite)?;
            if let Some(v) = rewrite
                .forwarded_prefix
                .as_deref()
                .and_then(|p| HeaderValue::from_str(p).ok())
            {
                headers.insert(X_FORWARDED_PREFIX.clone(), v);
            }
            Ok(Rewrite::Target(uri))
        }
    }
}

/// The 302 of a `rewrite-target` that is a full URL.
fn found(location: &str) -> Response<ProxyBody> {
    let mut res = Response::new(ProxyBody::full(Bytes::new()));
    *res.status_mut() = StatusCode::FOUND;
    if let Ok(v) = HeaderValue::from_str(location) {
        res.headers_mut().insert(header::LOCATION, v);
    }
    res
}

/// Whether the declared `Content-Length` exceeds `max` (0: no limit).
fn body_too_large(headers: &HeaderMap, max: u64) -> bool {
    max > 0
        && headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .is_some_and(|len| len > max)
}

/// Whether a request asks for a WebSocket upgrade: `Connection: upgrade` and exactly one
/// `Upgrade: websocket`. Other upgrades (`h2c`, unknown tokens) are not tunnelled: their
/// `Upgrade`, `Connection` and `HTTP2-Settings` are removed and the request goes on as a plain one.
fn is_websocket_upgrade(headers: &HeaderMap) -> bool {
    let mut upgrades = headers.get_all(header::UPGRADE).iter();
    let websocket = upgrades
        .next()
        .is_some_and(|v| v.as_bytes().trim_ascii().eq_ignore_ascii_case(b"websocket"));
    websocket
        && upgrades.next().is_none()
        && headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
}

/// Whether a 101 answers the WebSocket upgrade asked for (`Upgrade: websocket`).
fn is_websocket_accept(headers: &HeaderMap) -> bool {
    headers
        .get(header::UPGRADE)
        .is_some_and(|v| v.as_bytes().trim_ascii().eq_ignore_ascii_case(b"websocket"))
}

/// Removes hop-by-hop headers, including those the Connection header names. With `keep_upgrade`,
/// `Connection: upgrade` and `Upgrade` survive (for upgrade requests and 101 responses).
fn strip_hop_by_hop(headers: &mut HeaderMap, keep_upgrade: bool) {
    // A message framed by Transfer-Encoding carries no meaningful Content-Length (RFC 9112
    // §6.3); the body is re-framed on the way out, so the stale length must not survive.
    if headers.contains_key(header::TRANSFER_ENCODING) {
        headers.remove(header::CONTENT_LENGTH);
    }
    headers.remove(&HTTP2_SETTINGS);
    // One pass over the (few) names present instead of a hashed removal per hop-by-hop name:
    // most requests carry none of them, most responses only `Connection: keep-alive`.
    let mut present = [false; HOP_BY_HOP_NAMES];
    for name in headers.keys() {
        if let Some(i) = HOP_BY_HOP.iter().position(|h| h == name) {
            present[i] = true;
        }
    }
    if !present.contains(&true) {
        return;
    }
    let upgrade = if keep_upgrade {
        headers.get(header::UPGRADE).cloned()
    } else {
        None
    };
    // Connection options name further hop-by-hop headers; `keep-alive`, `close` and `upgrade`
    // are options, not header names to look for (keep-alive and upgrade go anyway).
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|t| {
            !["keep-alive", "close", "upgrade", ""]
                .iter()
                .any(|o| t.eq_ignore_ascii_case(o))
        })
        .filter_map(|t| HeaderName::from_bytes(t.as_bytes()).ok())
        .collect();
    for name in &named {
        headers.remove(name);
    }
    for (name, _) in HOP_BY_HOP.iter().zip(present).filter(|(_, p)| *p) {
        headers.remove(name);
    }
    if let Some(upgrade) = upgrade {
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        headers.insert(header::UPGRADE, upgrade);
    }
}

/// Turns a client request into the upstream request: the normalised origin-form target, HTTP/1.1,
/// Host set to the validated host (and nothing else), hop-by-hop headers removed, forwarding
/// headers set from the real peer.
fn prepare_request<B>(
    req: &mut Request<B>,
    host: &ValidHost,
    target: Uri,
    conn: &ConnInfo,
    upgrade: bool,
) {
    *req.uri_mut() = target;
    *req.version_mut() = Version::HTTP_11;
    let headers = req.headers_mut();
    strip_hop_by_hop(headers, upgrade);
    if host.is_empty() {
        headers.remove(header::HOST);
    } else {
        headers.insert(header::HOST, host.header_value().clone());
    }
    crate::forwarded::set_headers(headers, host.as_str(), conn);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_go_including_named_ones() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, x-secret"),
        );
        h.insert("x-secret", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert(header::TE, HeaderValue::from_static("trailers"));
        h.insert("x-kept", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut h, false);
        assert_eq!(h.len(), 1, "{h:?}");
        assert!(h.contains_key("x-kept"));
    }

    #[test]
    fn upgrade_headers_survive_for_upgrades() {
        let mut h = HeaderMap::new();
        h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        assert!(is_websocket_upgrade(&h));
        strip_hop_by_hop(&mut h, true);
        assert_eq!(h[header::CONNECTION], "upgrade");
        assert_eq!(h[header::UPGRADE], "websocket");
    }

    #[test]
    fn only_websocket_upgrades_are_upgrades() {
        for (upgrade, connection, want) in [
            ("websocket", "Upgrade", true),
            ("WebSocket", "keep-alive, upgrade", true),
            ("h2c", "Upgrade, HTTP2-Settings", false),
            ("websocket, h2c", "upgrade", false),
            ("foo", "upgrade", false),
            ("websocket", "keep-alive", false),
        ] {
            let mut h = HeaderMap::new();
            h.insert(header::UPGRADE, HeaderValue::from_static(upgrade));
            h.insert(header::CONNECTION, HeaderValue::from_static(connection));
            h.insert(
                "http2-settings",
                HeaderValue::from_static("AAMAAABkAAQAAP__"),
            );
            assert_eq!(is_websocket_upgrade(&h), want, "{upgrade} / {connection}");
            strip_hop_by_hop(&mut h, want);
            assert!(!h.contains_key("http2-settings"));
            assert_eq!(h.contains_key(header::UPGRADE), want);
        }
    }

    #[test]
    fn transfer_encoding_drops_content_length() {
        let mut h = HeaderMap::new();
        h.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("5"));
        strip_hop_by_hop(&mut h, false);
        assert!(h.is_empty(), "{h:?}");
        let mut h = HeaderMap::new();
        h.append(header::CONTENT_LENGTH, HeaderValue::from_static("5"));
        h.append(header::CONTENT_LENGTH, HeaderValue::from_static("5"));
        declare_length(&mut h, Some(5));
        assert_eq!(h.get_all(header::CONTENT_LENGTH).iter().count(), 1);
        declare_length(&mut h, None);
        assert!(h.is_empty());
    }

    #[test]
    fn targets_are_normalised_origin_form() {
        for (given, want) in [
            ("http://a.test//x/./y/../z?q=/../", "/x/z?q=/../"),
            ("/a/b?c", "/a/b?c"),
            ("/a//b", "/a/b"),
        ] {
            let uri: Uri = given.parse().unwrap();
            assert_eq!(origin_form(&uri).unwrap(), want, "{given}");
        }
        assert!(origin_form(&"/x/%2e%2e/y".parse().unwrap()).is_err());
    }

    #[test]
    fn forwarding_headers_for_both_families() {
        for (peer, ip) in [
            ("[::ffff:127.0.0.1]:5000", "127.0.0.1"),
            ("[::1]:5000", "::1"),
        ] {
            let conn = ConnInfo::new(peer.parse().unwrap(), "[::1]:8080".parse().unwrap());
            let mut req = Request::builder()
                .uri("/a?b=c")
                .header(header::HOST, "example.com")
                .header("x-forwarded-for", "6.6.6.6")
                .body(())
                .unwrap();
            let host = crate::host::request_host(&req).unwrap();
            let target = origin_form(req.uri()).unwrap();
            prepare_request(&mut req, &host, target, &conn, false);
            let h = req.headers();
            assert_eq!(h["x-forwarded-for"], ip);
            assert_eq!(h["x-real-ip"], ip);
            assert_eq!(h["x-forwarded-port"], "8080");
            assert_eq!(h["x-forwarded-host"], "example.com");
            assert_eq!(req.uri(), "/a?b=c");
            let fwd = h[header::FORWARDED].to_str().unwrap();
            let expected = if ip.contains(':') {
                format!("for=\"[{ip}]:5000\"")
            } else {
                format!("for=\"{ip}:5000\"")
            };
            assert!(fwd.starts_with(&expected), "{fwd}");
        }
    }

    #[test]
    fn h2_requests_become_origin_form_with_host() {
        let conn = ConnInfo::new(
            "127.0.0.1:1".parse().unwrap(),
            "127.0.0.1:2".parse().unwrap(),
        );
        let mut req = Request::builder()
            .version(Version::HTTP_2)
            .uri("http://demo.local/x/y?z")
            .body(())
            .unwrap();
        let host = crate::host::request_host(&req).unwrap();
        let target = origin_form(req.uri()).unwrap();
        prepare_request(&mut req, &host, target, &conn, false);
        assert_eq!(req.uri(), "/x/y?z");
        assert_eq!(req.version(), Version::HTTP_11);
        assert_eq!(req.headers()[header::HOST], "demo.local");
    }
}
