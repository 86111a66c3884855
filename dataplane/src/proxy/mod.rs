//! The reverse proxy. [`Proxy::forward`] takes a request through named phases, in the spirit of
//! pingora's `ProxyHttp`:
//!
//! 1. [`route`]: the validated host and normalised target select a route of the live snapshot;
//! 2. [`admit`]: the route's request policies (redirects, `rewrite-target`, source ranges, body
//!    limit), a list of checks;
//! 3. [`choose`]: the backend, protocol, TLS settings and timeouts of the attempts;
//! 4. `send_with_fallback`: a target picked by client family, its addresses tried in policy
//!    order, then other targets, each attempt one [`Upstream::send`] to a [`Peer`]; a failed
//!    attempt is recorded in one place ([`attempt_failed`]);
//! 5. `respond`: the response head cleaned, WebSocket upgrades tunnelled, the body wrapped.

mod admit;
mod body;
mod headers;

use std::convert::Infallible;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use http::header::{self, HeaderValue};
use http::{Request, Response, StatusCode, Uri};
use http_body_util::Either;
use hyper::body::{Body, Incoming};
use hyper::upgrade::OnUpgrade;

pub use body::ProxyBody;

use crate::balance::{InFlight, LiveBackend};
use crate::conn::ConnInfo;
use crate::error::ProxyError;
use crate::host::ValidHost;
use crate::limits::Limited;
use crate::observe::Exchange;
use crate::runtime::{Live, ProxyConfig, Runtime};
use crate::table::{Family, FamilyPolicy, Matched, UpstreamProtocol};
use crate::tunnel::Tunnels;
use crate::upstream::tls::LiveTls;
use crate::upstream::{Peer, SendError, Sent, Upstream, UpstreamBody};
use admit::Admission;

/// The proxy, shared by every listener.
#[derive(Debug)]
pub struct Proxy {
    runtime: Arc<Runtime>,
    upstream: Arc<Upstream>,
    tunnels: Arc<Tunnels>,
}

/// A request matched to a route: what the phases after [`route`] work on.
#[derive(Debug)]
pub(crate) struct Routed<'a> {
    /// The host, validated.
    pub host: ValidHost,
    /// The request target in normalised origin form.
    pub target: Uri,
    /// The route.
    pub matched: Matched<'a>,
    /// The target sent upstream in place of `target` (set by `rewrite-target`).
    pub upstream_target: Option<Uri>,
}

/// How the attempts of a routed request go: set by [`choose`].
#[derive(Debug)]
pub(crate) struct Plan<'a> {
    /// The backend balanced over.
    pub backend: &'a LiveBackend,
    /// The route's family policy.
    pub policy: FamilyPolicy,
    /// The family the policy prefers for this client (a request served over the other one
    /// counts as a fallback).
    pub preferred: Family,
    /// The protocol spoken to the targets.
    pub protocol: UpstreamProtocol,
    /// The TLS client configuration, for TLS protocols.
    pub tls: Option<&'a Arc<LiveTls>>,
    /// Connect timeout per attempt.
    pub connect_timeout: Duration,
    /// Response head (and body read) timeout.
    pub read_timeout: Duration,
}

impl Proxy {
    /// A proxy over a runtime. Must be called within a Tokio runtime (it starts the pool reaper).
    pub fn new(runtime: Arc<Runtime>) -> Arc<Proxy> {
        let config = &runtime.config;
        let upstream = Arc::new(Upstream::new(
            config.upstream_idle_timeout,
            config.upstream_idle_per_addr,
        ));
        let weak = Arc::downgrade(&upstream);
        let every = config.upstream_idle_timeout.min(Duration::from_secs(30));
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            loop {
                tick.tick().await;
                match weak.upgrade() {
                    Some(upstream) => upstream.reap(),
                    None => return,
                }
            }
        });
        let tunnels = Arc::new(Tunnels::new(runtime.telemetry().metrics().clone()));
        Arc::new(Proxy {
            runtime,
            upstream,
            tunnels,
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
                ProxyBody::error(&error)
            }
        };
        res.headers_mut()
            .insert(header::SERVER, HeaderValue::from_static("duet"));
        exchange.set_status(res.status().as_u16());
        res.body_mut().exchange = Some(exchange);
        Ok(res)
    }

    /// The phases of one request, in order.
    async fn forward(
        &self,
        mut req: Request<Incoming>,
        conn: &ConnInfo,
        exchange: &mut Exchange,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        let live = self.runtime.load_full();
        let mut routed = route(&live, &req)?;
        exchange.matched(&live.metrics, routed.matched.action);
        let config = &self.runtime.config;
        let mut admission = Admission {
            routed: &mut routed,
            headers: req.headers_mut(),
            conn,
            config,
        };
        if let Some(answer) = admit::admit(&mut admission)? {
            return Ok(answer);
        }
        let plan = choose(&live, &routed, conn, config, exchange)?;
        let (request, client_upgrade) = upstream_request(req, routed, &plan, conn);
        let (sent, in_flight) = self
            .send_with_fallback(&plan, request, conn, exchange)
            .await?;
        self.respond(sent, in_flight, client_upgrade, &plan, conn)
    }

    /// Phase 4: picks a target (by client family, skipping those tried), tries its addresses in
    /// policy order, then another target, up to `--max-target-attempts`; only a request that was
    /// not sent goes on to the next address.
    async fn send_with_fallback(
        &self,
        plan: &Plan<'_>,
        mut request: Request<UpstreamBody>,
        conn: &ConnInfo,
        exchange: &mut Exchange,
    ) -> Result<(Sent, InFlight), ProxyError> {
        let backend = plan.backend;
        let mut tried: Vec<usize> = Vec::new();
        let mut last_error: Option<io::Error> = None;
        for _ in 0..self.runtime.config.max_target_attempts {
            let Some(pick) = backend.pick(conn.family, plan.policy, &tried) else {
                break;
            };
            tried.push(pick.index);
            let state = &backend.states[pick.index];
            for (family, addr) in pick.addrs.into_iter().flatten() {
                exchange.upstream_begin();
                let peer = Peer {
                    addr,
                    family,
                    protocol: plan.protocol,
                    tls: plan.tls,
                    connect_timeout: plan.connect_timeout,
                    read_timeout: plan.read_timeout,
                };
                let in_flight = state.start();
                match self.upstream.send(&peer, request).await {
                    Ok(sent) => {
                        if sent.connected {
                            state.record_success(family);
                        }
                        exchange.upstream_done(family, addr, plan.preferred);
                        return Ok((sent, in_flight));
                    }
                    Err(SendError::Failed(error)) => {
                        exchange.upstream_done(family, addr, plan.preferred);
                        return Err(error.body_limit_checked());
                    }
                    Err(SendError::Unsent(unsent, error)) => {
                        attempt_failed(exchange, backend, pick.index, &peer, &error);
                        request = *unsent;
                        last_error = Some(error);
                    }
                }
            }
        }
        Err(match last_error {
            Some(source) => ProxyError::Connect {
                backend: backend.id().clone(),
                source,
            },
            None => ProxyError::NoTarget(backend.id().clone()),
        })
    }

    /// Phase 5: the upstream's response for the client: a 101 only for the WebSocket upgrade
    /// asked for (then the tunnel starts), hop-by-hop headers removed, the body read under the
    /// read timeout and holding the target's in-flight mark.
    fn respond(
        &self,
        sent: Sent,
        in_flight: InFlight,
        client_upgrade: Option<OnUpgrade>,
        plan: &Plan<'_>,
        conn: &ConnInfo,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        let mut res = sent.response;
        let switching = res.status() == StatusCode::SWITCHING_PROTOCOLS;
        if switching && (plan.protocol.is_h2() || !headers::is_websocket_accept(res.headers())) {
            return Err(ProxyError::UnaskedUpgrade);
        }
        headers::strip_hop_by_hop(res.headers_mut(), switching);
        if let (true, Some(client)) = (switching, client_upgrade) {
            let upstream = hyper::upgrade::on(&mut res);
            self.tunnels
                .spawn(client, upstream, plan.read_timeout, conn.family);
        }
        let (read_timeout, pool_return) = (plan.read_timeout, sent.pool_return);
        Ok(res.map(|body| ProxyBody::upstream(body, read_timeout, in_flight, pool_return)))
    }
}

/// Phase 1: the request's host and normalised target, and the route of `live` they match (404
/// when none does).
pub(crate) fn route<'a, B>(live: &'a Live, req: &Request<B>) -> Result<Routed<'a>, ProxyError> {
    let host = crate::host::request_host(req)?;
    let target = headers::origin_form(req.uri())?;
    let matched = live
        .snapshot
        .routes
        .find(host.as_str(), target.path())
        .ok_or(ProxyError::NoRoute)?;
    Ok(Routed {
        host,
        target,
        matched,
        upstream_target: None,
    })
}

/// Phase 3: the backend of the route (503 when the snapshot has none), the protocol (the
/// route's, else the backend's; recorded for the access log), its TLS configuration (502 when
/// unusable) and the timeouts (the route's, else the flags').
pub(crate) fn choose<'a>(
    live: &'a Live,
    routed: &Routed<'_>,
    conn: &ConnInfo,
    config: &ProxyConfig,
    exchange: &mut Exchange,
) -> Result<Plan<'a>, ProxyError> {
    let action = routed.matched.action;
    let backend = live
        .backends
        .get(&action.backend)
        .ok_or_else(|| ProxyError::NoTarget(action.backend.clone()))?;
    let protocol = action.protocol.unwrap_or(backend.backend.protocol);
    exchange.upstream_protocol(protocol);
    let settings = action.upstream_tls.as_deref().filter(|_| protocol.is_tls());
    let tls = match settings {
        None => None,
        Some(settings) => {
            let live_tls = live.upstream_tls.get(settings);
            let unusable = live_tls.map_or(Some("no TLS configuration"), |t| t.error());
            if let Some(reason) = unusable {
                tracing::trace!(backend = %action.backend, %reason, "Upstream TLS is not usable");
                let source = io::Error::other(reason.to_owned());
                let backend = action.backend.clone();
                return Err(ProxyError::Connect { backend, source });
            }
            live_tls
        }
    };
    Ok(Plan {
        backend,
        policy: action.policy,
        preferred: action.policy.order(conn.family)[0].unwrap_or(conn.family),
        protocol,
        tls,
        connect_timeout: action.timeouts.connect.unwrap_or(config.connect_timeout),
        read_timeout: action.timeouts.read.unwrap_or(config.response_timeout),
    })
}

/// The client request made into the upstream one (before phase 4): the routed target, clean
/// headers (`te: trailers` kept for HTTP/2), one framing, the body counted against the route's
/// limit; and the client's side of a WebSocket upgrade it asks for.
fn upstream_request(
    mut req: Request<Incoming>,
    routed: Routed<'_>,
    plan: &Plan<'_>,
    conn: &ConnInfo,
) -> (Request<UpstreamBody>, Option<OnUpgrade>) {
    let trailers = plan.protocol.is_h2() && crate::upstream::wants_trailers(req.headers());
    let upgrade = headers::is_websocket_upgrade(req.headers());
    let client_upgrade = upgrade.then(|| hyper::upgrade::on(&mut req));
    let length = req.body().size_hint().exact();
    let target = routed.upstream_target.unwrap_or(routed.target);
    headers::prepare_request(&mut req, &routed.host, target, conn, upgrade);
    headers::declare_length(req.headers_mut(), length);
    if trailers {
        crate::upstream::keep_trailers(&mut req);
    }
    let max = routed.matched.action.max_body_bytes;
    let req = req.map(|body| Either::Left(Limited::new(body, max)));
    (req, client_upgrade)
}

/// The one place a failed attempt is recorded: a trace line, the Service's connect-failure
/// counter, and the health of the target's family, whose ejection is counted and warned about.
fn attempt_failed(
    exchange: &Exchange,
    backend: &LiveBackend,
    index: usize,
    peer: &Peer<'_>,
    error: &io::Error,
) {
    tracing::trace!(%error, upstream.addr = %peer.addr, "Connect failed");
    exchange.connect_failed(peer.family);
    if backend.states[index].record_failure(peer.family) {
        exchange.ejected(peer.family);
        tracing::warn!(
            backend = %backend.id(),
            target = %backend.backend.targets[index].id,
            family = %peer.family,
            "Ejected a failing family of a target for a while"
        );
    }
}
