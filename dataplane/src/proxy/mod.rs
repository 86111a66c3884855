//! The reverse proxy. [`Proxy::forward`] takes a request through named phases, in the spirit of
//! pingora's `ProxyHttp`:
//!
//! 1. [`route`]: the validated host and normalised target select a route of the live snapshot;
//! 2. [`admit`]: the route's request policies (redirects, `rewrite-target`, a CORS preflight,
//!    source ranges, body limit), a list of checks; then its access policy (limits, basic and
//!    external auth: [`crate::policy::Gate`]), whose admission the exchange holds until the
//!    response is done;
//! 3. [`choose`]: the backend (steered: canaries, affinity), protocol, TLS settings and timeouts
//!    of the attempts;
//! 4. `send_with_fallback`: a target picked by client family (or pinned by the route's affinity
//!    cookie or hash), its addresses tried in policy order, then other targets, each attempt one
//!    [`Upstream::send`] to a [`Peer`]; a failed attempt is recorded in one place
//!    ([`attempt_failed`]);
//! 5. `respond`: the response head cleaned, WebSocket upgrades tunnelled, the body wrapped; the
//!    affinity cookie and CORS headers added.

mod admit;
mod body;
mod headers;
mod linger;
mod mirror;

use std::convert::Infallible;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use http::header::{self, HeaderMap, HeaderValue};
use http::{Request, Response, StatusCode, Uri};
use http_body_util::Either;
use hyper::body::Body;

use crate::client_body::ClientBody;
use hyper::upgrade::OnUpgrade;

pub use body::ProxyBody;

use crate::balance::{InFlight, LiveBackend};
use crate::conn::ConnInfo;
use crate::error::ProxyError;
use crate::host::ValidHost;
use crate::limits::Limited;
use crate::observe::Exchange;
use crate::policy::{Gate, Steered};
use crate::runtime::{Live, ProxyConfig, Runtime};
use crate::table::{Family, FamilyPolicy, Matched, UpstreamProtocol};
use crate::tunnel::Tunnels;
use crate::upstream::tls::LiveTls;
use crate::upstream::{Peer, SendError, Sent, Upstream, UpstreamBody};
use admit::{Admission, Stop};

/// The proxy, shared by every listener.
#[derive(Debug)]
pub struct Proxy {
    runtime: Arc<Runtime>,
    upstream: Arc<Upstream>,
    tunnels: Arc<Tunnels>,
    /// The access policies' runtime state (rate-limit zones) and auth client.
    gate: Gate,
    /// Where request mirrors go (`RequestMirror`).
    mirrors: mirror::Mirrors,
    /// `Alt-Svc` for HTTPS answers over TCP, while HTTP/3 is up for the client's family.
    alt_svc: Arc<crate::alt_svc::AltSvc>,
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
    /// The CORS headers the route gives this request's response (`enable-cors`), if any (boxed,
    /// as the next: rare, and every request's future carries the field).
    pub cors: Option<Box<HeaderMap>>,
    /// The headers of the 204 answering a CORS preflight, when the request is one.
    pub preflight: Option<Box<HeaderMap>>,
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
    /// The backend the route's choices chose and what pins its target.
    pub steered: Steered<'a>,
    /// Whether the client's scheme is `https` (the affinity cookie's `Secure`).
    pub https: bool,
    /// When the response head must have come (Gateway API `timeouts.request`), if ever.
    pub deadline: Option<tokio::time::Instant>,
    /// Longest wait for the response head of one attempt (`timeouts.backendRequest`).
    pub attempt_timeout: Option<Duration>,
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
        let metrics = runtime.telemetry().metrics();
        let tunnels = Arc::new(Tunnels::new(metrics.clone()));
        let gate = Gate::new(
            upstream.clone(),
            config.auth_destinations.clone(),
            (config.connect_timeout, config.response_timeout),
            metrics.clone(),
        );
        let mirrors = mirror::Mirrors::new(upstream.clone(), metrics.clone());
        Arc::new(Proxy {
            runtime,
            upstream,
            tunnels,
            gate,
            mirrors,
            alt_svc: Default::default(),
        })
    }

    /// What HTTPS answers over TCP advertise of HTTP/3, per client family.
    pub fn alt_svc(&self) -> &Arc<crate::alt_svc::AltSvc> {
        &self.alt_svc
    }

    /// The open WebSocket tunnels (drained on shutdown).
    pub fn tunnels(&self) -> &Arc<Tunnels> {
        &self.tunnels
    }

    /// Handles one client request; every response carries `Server: duet`.
    pub async fn handle<B: Into<ClientBody>>(
        self: Arc<Self>,
        req: Request<B>,
        conn: Arc<ConnInfo>,
    ) -> Result<Response<ProxyBody>, Infallible> {
        let req = req.map(Into::into);
        // HTTPS over TCP learns of the HTTP/3 listener of its family: the Ingress listeners',
        // or that of its Gateway port.
        let alt_svc = (conn.tls && req.version() != http::Version::HTTP_3)
            .then(|| match conn.gateway_port {
                None => self.alt_svc.get(conn.family),
                Some(port) => self.alt_svc.gateway(port, conn.family, || {
                    let live = self.runtime.load();
                    live.snapshot.gateways.port(port).map(|p| p.listener_port)
                }),
            })
            .flatten();
        let mut exchange = self.runtime.telemetry().exchange(&req, &conn);
        let http2 = req.version() == http::Version::HTTP_2;
        let mut res = match self.forward(req, &conn, &mut exchange).await {
            Ok(res) => res,
            Err(error) => {
                tracing::trace!(%error, client.addr = %conn.peer, "Answered locally");
                ProxyBody::error(&error)
            }
        };
        res.headers_mut()
            .insert(header::SERVER, HeaderValue::from_static("duet"));
        if let Some(alt_svc) = alt_svc {
            res.headers_mut().insert(header::ALT_SVC, alt_svc);
        }
        if let Some(admission) = exchange.admission() {
            admission.decorate(res.status(), res.headers_mut());
        }
        if http2 {
            crate::upstream::own_values(res.headers_mut());
        }
        exchange.set_status(res.status().as_u16());
        res.body_mut().exchange = Some(exchange);
        Ok(res)
    }

    /// The phases of one request, in order.
    async fn forward(
        &self,
        mut req: Request<ClientBody>,
        conn: &ConnInfo,
        exchange: &mut Exchange,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        // Answered before its body is read, a request's body is discarded in the background
        // (`linger::unread`), so the answer reaches a client still sending.
        let live = self.runtime.load_full();
        let mut routed = match route_on(&live, &req, conn.gateway_port, conn.sni.as_deref()) {
            Ok(routed) => routed,
            Err(error) => return linger::unread(req, Err(error)),
        };
        exchange.matched(&live.metrics, routed.matched.action);
        let config = &self.runtime.config;
        let mut admission = Admission {
            routed: &mut routed,
            headers: req.headers_mut(),
            conn,
            config,
        };
        let mut verdict = admit::admit(&mut admission);
        if verdict.is_ok() && routed.matched.action.access.is_some() {
            // Boxed: the access checks' future (auth requests included) would otherwise be part
            // of every request's future, and moved with it, whether the route has a policy or not.
            verdict = Box::pin(admit::access(&self.gate, &routed, &mut req, conn, exchange)).await;
        }
        match verdict {
            Ok(()) => {}
            Err(Stop::Answer(answer)) => return linger::unread(req, Ok(*answer)),
            Err(Stop::Refuse(error)) => return linger::unread(req, Err(error)),
        }
        let plan = match choose(&live, &routed, req.headers(), conn, config, exchange) {
            Ok(plan) => plan,
            Err(error) => return linger::unread(req, Err(error)),
        };
        // With no filters to edit them after, an untrusted peer's forwarding headers are written
        // by the send (straight into the head by duet's client) instead of into the map here.
        let deferred = routed.matched.action.filters.is_none() && !conn.trusted;
        let (request, client_upgrade) = upstream_request(req, &mut routed, &plan, conn, deferred);
        let forwarding = deferred
            .then(|| crate::forwarded::Forwarding::untrusted(&routed.host, conn))
            .flatten();
        let filters = routed.matched.action.filters.as_deref();
        if let Some(choice) = routed.matched.action.choice.as_deref() {
            if !choice.mirrors.is_empty() {
                let client = mirror::Client::of(conn, &plan, client_upgrade.is_some());
                self.mirrors
                    .start(&live, &choice.mirrors, &request, client, config);
            }
        }
        let retry = filters.and_then(|f| f.retry.as_ref());
        let replay = retry.and_then(|_| mirror::copy(&request));
        let mut slot = Some(request);
        let mut tried = Tried::default();
        let mut outcome = self
            .send_with_fallback(&plan, &mut slot, forwarding, conn, exchange, &mut tried)
            .await;
        if let (Some(policy), Some(replay)) = (retry, replay) {
            // Boxed: the retry loop's state is not part of every request's future.
            let retrying = RetryState {
                policy,
                replay,
                tried,
            };
            outcome = Box::pin(self.retried(&plan, retrying, outcome, conn, exchange)).await;
        }
        let (sent, in_flight, served) = outcome?;
        let cookie = plan.steered.set_cookie(plan.backend, served, plan.https);
        let mut res = self.respond(sent, in_flight, client_upgrade, &plan, conn)?;
        crate::policy::respond(res.headers_mut(), cookie, routed.cors.as_deref());
        if let Some(filters) = filters {
            filters.respond(plan.steered.backend.as_str(), res.headers_mut());
        }
        Ok(res)
    }

    /// The rule's `retry`: while the outcome is a response with a retried code or a failure
    /// that got no answer (not the request's own deadline), and attempts are left, the response
    /// is read and dropped, `backoff` waited, and a copy of the request sent again through
    /// [`Proxy::send_with_fallback`] (the address of the client's family first), to a target
    /// not tried yet while there is one, else to any.
    async fn retried(
        &self,
        plan: &Plan<'_>,
        mut state: RetryState<'_>,
        mut outcome: Result<(Sent, InFlight, usize), ProxyError>,
        conn: &ConnInfo,
        exchange: &mut Exchange,
    ) -> Result<(Sent, InFlight, usize), ProxyError> {
        let policy = state.policy;
        for _ in 0..policy.attempts {
            let again = match &outcome {
                Ok((sent, _, _)) => policy.retries(sent.response.status().as_u16()),
                Err(error) => unanswered(error, plan),
            };
            if !again {
                break;
            }
            if let Ok((sent, in_flight, _)) = outcome {
                mirror::discard(sent, plan.read_timeout).await;
                drop(in_flight);
            }
            if let Some(backoff) = policy.backoff {
                let until = tokio::time::Instant::now() + backoff;
                let until = plan.deadline.map_or(until, |d| d.min(until));
                tokio::time::sleep_until(until).await;
            }
            if state.tried.as_slice().len() >= plan.backend.backend.targets.len() {
                state.tried = Tried::default();
            }
            let mut slot = mirror::copy(&state.replay);
            outcome = self
                .send_with_fallback(plan, &mut slot, None, conn, exchange, &mut state.tried)
                .await;
        }
        outcome
    }

    /// Phase 4: picks a target (pinned by the route's choices, else by client family; skipping
    /// those tried), tries its addresses in policy order, then another target, up to
    /// `--max-target-attempts`; only a request that was not sent goes on to the next address.
    /// The response comes with the index of the target that served it.
    async fn send_with_fallback(
        &self,
        plan: &Plan<'_>,
        request: &mut Option<Request<UpstreamBody>>,
        forwarding: Option<crate::forwarded::Forwarding<'_>>,
        conn: &ConnInfo,
        exchange: &mut Exchange,
        tried: &mut Tried,
    ) -> Result<(Sent, InFlight, usize), ProxyError> {
        let backend = plan.backend;
        let mut last_error: Option<io::Error> = None;
        for _ in 0..self.runtime.config.max_target_attempts {
            let Some(pick) = plan
                .steered
                .pick(backend, conn.family, plan.policy, tried.as_slice())
            else {
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
                    forwarding,
                };
                let in_flight = backend.states.start(pick.index);
                let deadline =
                    crate::filters::attempt_deadline(plan.deadline, plan.attempt_timeout);
                let outcome = match deadline {
                    // Awaited where it is made: a future held in a local first is copied (its
                    // whole size) into the await's slot.
                    None => self.upstream.send(&peer, request).await,
                    // Boxed: the timer is not part of every request's future.
                    Some(at) => {
                        let sending = self.upstream.send(&peer, request);
                        match Box::pin(tokio::time::timeout_at(at, sending)).await {
                            Ok(outcome) => outcome,
                            Err(_elapsed) => {
                                exchange.upstream_done(family, addr, plan.preferred);
                                return Err(ProxyError::Timeout);
                            }
                        }
                    }
                };
                match outcome {
                    Ok(sent) => {
                        if sent.connected {
                            state.record_success(family);
                        }
                        exchange.upstream_done(family, addr, plan.preferred);
                        return Ok((sent, in_flight, pick.index));
                    }
                    Err(SendError::Failed(error)) => {
                        exchange.upstream_done(family, addr, plan.preferred);
                        return Err(error.body_limit_checked());
                    }
                    Err(SendError::Unsent(error)) => {
                        attempt_failed(exchange, backend, pick.index, &peer, &error);
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
    #[inline(always)] // Called once; inlined, the response is not copied into and out of it.
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
        if !sent.stripped {
            headers::strip_hop_by_hop(res.headers_mut(), switching);
        }
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
#[cfg(test)]
pub(crate) fn route<'a, B>(live: &'a Live, req: &Request<B>) -> Result<Routed<'a>, ProxyError> {
    route_on(live, req, None, None)
}

/// Phase 1 on a listener: a Gateway pod port (`Some`) routes by that port's listeners
/// ([`crate::table::gateway`]), an Ingress listener by the Ingress routes. On a Gateway port,
/// a Host that selects another listener than the TLS server name `sni` did is misdirected (421).
#[inline(always)] // Called once; inlined, its result is built in place.
pub(crate) fn route_on<'a, B>(
    live: &'a Live,
    req: &Request<B>,
    gateway_port: Option<u16>,
    sni: Option<&str>,
) -> Result<Routed<'a>, ProxyError> {
    let host = crate::host::request_host(req)?;
    let target = headers::origin_form(req.uri())?;
    let view = crate::request_match::RequestView {
        method: Some(req.method()),
        headers: Some(req.headers()),
        path: target.path(),
        query: target.query(),
    };
    let matched = match gateway_port {
        None => live.snapshot.routes.find_request(host.as_str(), &view),
        Some(port) => {
            let port = live.snapshot.gateways.port(port);
            if port
                .zip(sni)
                .is_some_and(|(p, s)| p.misdirected(s, host.as_str()))
            {
                return Err(ProxyError::Misdirected);
            }
            port.and_then(|p| p.find_request(host.as_str(), &view))
        }
    };
    let matched = matched.ok_or(ProxyError::NoRoute)?;
    let cors = crate::policy::cors_for(matched.action, req.headers()).map(Box::new);
    let preflight =
        crate::policy::preflight(matched.action, req.method(), req.headers(), cors.as_deref())
            .map(Box::new);
    Ok(Routed {
        host,
        target,
        matched,
        upstream_target: None,
        cors,
        preflight,
    })
}

/// Phase 3: the backend of the route as its choices steer the request (`headers` as received;
/// 503 when the snapshot has none), the protocol (the route's, else the backend's; recorded for
/// the access log), its TLS configuration (502 when unusable) and the timeouts (the route's,
/// else the flags').
#[inline(always)] // Called once; inlined, its result is built in place.
pub(crate) fn choose<'a>(
    live: &'a Live,
    routed: &Routed<'a>,
    headers: &HeaderMap,
    conn: &ConnInfo,
    config: &ProxyConfig,
    exchange: &mut Exchange,
) -> Result<Plan<'a>, ProxyError> {
    let action = routed.matched.action;
    let (host, ip) = (routed.host.as_str(), conn.peer.ip());
    let steered =
        crate::policy::steer_request(action, headers, &routed.target, host, ip, &live.backends);
    let backend = live.backends.get(steered.backend).ok_or_else(|| {
        if steered.backend.is_unresolved() {
            ProxyError::Unresolved(steered.backend.clone())
        } else {
            ProxyError::NoTarget(steered.backend.clone())
        }
    })?;
    let protocol = action.protocol.unwrap_or(backend.backend.protocol);
    exchange.upstream_protocol(protocol);
    let filters = action.filters.as_deref();
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
        steered,
        https: crate::forwarded::request_scheme(headers, conn) == "https",
        deadline: filters
            .and_then(|f| f.request_timeout)
            .map(|t| tokio::time::Instant::now() + t),
        attempt_timeout: filters.and_then(|f| f.backend_timeout),
    })
}

/// The client request made into the upstream one (before phase 4): the routed target, clean
/// headers (`te: trailers` kept for HTTP/2; the route's `upstream-vhost` as `Host`), one
/// framing, the body counted against the route's limit and watched for its send timeout; and
/// the client's side of a WebSocket upgrade it asks for.
#[inline(always)] // Called once; inlined, the request is not copied into and out of it.
fn upstream_request(
    mut req: Request<ClientBody>,
    routed: &mut Routed<'_>,
    plan: &Plan<'_>,
    conn: &ConnInfo,
    deferred: bool,
) -> (Request<UpstreamBody>, Option<OnUpgrade>) {
    let trailers = plan.protocol.is_h2() && crate::upstream::wants_trailers(req.headers());
    let hops = headers::Hops::of(req.headers());
    let upgrade = hops.upgrade && headers::is_websocket_upgrade(req.headers());
    // Only a head that had a `Content-Length` (or that filters may have given one) has one to
    // replace or drop.
    let length_check = hops.content_length || routed.matched.action.filters.is_some();
    let client_upgrade = upgrade.then(|| hyper::upgrade::on(&mut req));
    let length = req.body().size_hint().exact();
    let target = match routed.upstream_target.take() {
        Some(rewritten) => rewritten,
        None => std::mem::take(&mut routed.target),
    };
    headers::prepare_request(
        &mut req,
        &routed.host,
        target,
        conn,
        (&hops, upgrade),
        deferred,
    );
    crate::policy::set_upstream_host(routed.matched.action, req.headers_mut());
    if let Some(filters) = routed.matched.action.filters.as_deref() {
        filters.prepare_upstream(plan.steered.backend.as_str(), req.headers_mut());
    }
    if length_check {
        headers::declare_length(req.headers_mut(), length);
    }
    if trailers {
        crate::upstream::keep_trailers(&mut req);
    }
    let action = routed.matched.action;
    let send_timeout = action.timeouts.send;
    let req = req
        .map(|body| Either::Left(Limited::new(body, action.max_body_bytes).watched(send_timeout)));
    (req, client_upgrade)
}

/// What the retry loop carries: the rule's policy, the head to send again, the targets tried.
struct RetryState<'a> {
    policy: &'a crate::filters::RetryPolicy,
    replay: Request<UpstreamBody>,
    tried: Tried,
}

/// Whether a failed attempt got no answer from the backend (retried as a connection error):
/// refused or broken connections and a passed `timeouts.backendRequest`, not the request's
/// own deadline (`timeouts.request`) nor duet's refusals.
fn unanswered(error: &ProxyError, plan: &Plan<'_>) -> bool {
    match error {
        ProxyError::Connect { .. } | ProxyError::Upstream(_) | ProxyError::Client(_) => true,
        ProxyError::Timeout => plan
            .deadline
            .is_none_or(|d| tokio::time::Instant::now() < d),
        _ => false,
    }
}

/// The targets a request has tried: inline for the first few (no allocation per request; more
/// than [`TRIED_INLINE`] attempts, a rare `--max-target-attempts`, spill to the heap).
#[derive(Debug, Default)]
struct Tried {
    inline: [usize; TRIED_INLINE],
    len: usize,
    spilled: Vec<usize>,
}

const TRIED_INLINE: usize = 4;

impl Tried {
    fn push(&mut self, index: usize) {
        if self.len < TRIED_INLINE {
            self.inline[self.len] = index;
            self.len += 1;
        } else {
            if self.spilled.is_empty() {
                self.spilled.extend_from_slice(&self.inline);
            }
            self.spilled.push(index);
        }
    }

    fn as_slice(&self) -> &[usize] {
        if self.spilled.is_empty() {
            &self.inline[..self.len]
        } else {
            &self.spilled
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::{
        Backend, BackendId, HostRules, PathMatch, PathRule, Rewrite, RouteAction, RouteTable,
        Snapshot, SourceRanges, Target, TargetId,
    };
    use crate::upstream_tls::{UpstreamTls, UpstreamTrust};
    use std::net::SocketAddr;

    fn action(backend: &str) -> RouteAction {
        RouteAction::to(backend)
    }

    /// A runtime whose table routes `a.test` to `action` (and whose backend `ns/svc:80` has one
    /// target at `v4`/`v6`).
    fn runtime(
        action: RouteAction,
        v4: Option<SocketAddr>,
        v6: Option<SocketAddr>,
    ) -> Arc<Runtime> {
        let mut routes = RouteTable::default();
        let rule = PathRule {
            matcher: PathMatch::prefix("/"),
            when: None,
            action,
        };
        routes
            .exact
            .insert("a.test".into(), HostRules::new("a.test", vec![rule]).0);
        let backend = Backend {
            id: "ns/svc:80".parse::<BackendId>().unwrap(),
            targets: vec![Target::with_addrs(
                TargetId("pod".into()),
                v4.into_iter().chain(v6),
                None,
            )]
            .into(),
            lb: Default::default(),
            protocol: UpstreamProtocol::Http1,
        };
        let snapshot = Snapshot {
            version: 1,
            routes: Arc::new(routes),
            backends: [(backend.id.clone(), Arc::new(backend))].into(),
            certs: Default::default(),
            gateways: Default::default(),
        };
        let config = ProxyConfig {
            https_listen: vec![
                "127.0.0.1:8443".parse().unwrap(),
                "[::1]:9443".parse().unwrap(),
            ],
            ..ProxyConfig::default()
        };
        let runtime = Runtime::new(config);
        runtime.apply(Arc::new(snapshot));
        runtime
    }

    fn conn(peer: &str) -> ConnInfo {
        let local = if peer.starts_with('[') {
            "[::1]:80"
        } else {
            "127.0.0.1:80"
        };
        ConnInfo::new(peer.parse().unwrap(), local.parse().unwrap())
    }

    fn get(host: &str, target: &str) -> Request<()> {
        Request::builder()
            .uri(target)
            .header(header::HOST, host)
            .body(())
            .unwrap()
    }

    /// Runs the admit phase on a request; the status and `Location` of an answer.
    fn admitted(
        runtime: &Runtime,
        mut req: Request<()>,
        conn: &ConnInfo,
    ) -> Result<Option<(u16, String)>, ProxyError> {
        let live = runtime.load_full();
        let mut routed = route(&live, &req)?;
        let mut admission = Admission {
            routed: &mut routed,
            headers: req.headers_mut(),
            conn,
            config: &runtime.config,
        };
        match admit::admit(&mut admission) {
            Ok(()) => Ok(None),
            Err(Stop::Refuse(error)) => Err(error),
            Err(Stop::Answer(res)) => {
                let location = res.headers().get(header::LOCATION);
                let location = location.map_or("", |v| v.to_str().unwrap()).to_owned();
                Ok(Some((res.status().as_u16(), location)))
            }
        }
    }

    #[test]
    fn tried_targets_are_all_remembered_past_the_inline_ones() {
        let mut tried = Tried::default();
        assert!(tried.as_slice().is_empty());
        for (n, index) in [7, 3, 9, 0, 5, 11].into_iter().enumerate() {
            tried.push(index);
            assert_eq!(tried.as_slice(), &[7, 3, 9, 0, 5, 11][..=n]);
        }
    }

    #[test]
    fn route_finds_the_host_and_normalises_the_target() {
        let runtime = runtime(action("ns/svc:80"), None, None);
        let live = runtime.load_full();
        let routed = route(&live, &get("A.test:80", "/x/../y?q")).unwrap();
        assert_eq!(routed.target, "/y?q");
        assert_eq!(routed.matched.action.backend.as_str(), "ns/svc:80");
        let no_route = route(&live, &get("b.test", "/")).unwrap_err();
        assert_eq!(no_route.status(), StatusCode::NOT_FOUND);
        let bad_host = route(&live, &get("a test", "/")).unwrap_err();
        assert_eq!(bad_host.status(), StatusCode::BAD_REQUEST);
        let bad_path = route(&live, &get("a.test", "/%2e%2e/x")).unwrap_err();
        assert_eq!(bad_path.status(), StatusCode::BAD_REQUEST);
    }

    #[test]
    fn admit_redirects_to_https_on_the_port_of_the_client_family() {
        let mut a = action("ns/svc:80");
        a.redirect_https = true;
        let runtime = runtime(a, None, None);
        for (peer, location) in [
            ("192.0.2.1:5000", "https://a.test:8443/p?q"),
            ("[2001:db8::1]:5000", "https://a.test:9443/p?q"),
        ] {
            let answer = admitted(&runtime, get("a.test", "/p?q"), &conn(peer)).unwrap();
            assert_eq!(answer, Some((308, location.to_owned())), "{peer}");
        }
        let tls = conn("192.0.2.1:5000").with_tls(true);
        assert_eq!(admitted(&runtime, get("a.test", "/"), &tls).unwrap(), None);
    }

    #[test]
    fn admit_runs_rewrite_before_the_https_redirect_and_source_ranges_after_both() {
        let mut a = action("ns/svc:80");
        a.redirect_https = true;
        a.rewrite = Some(Arc::new(Rewrite {
            target: "https://elsewhere.test/".into(),
            forwarded_prefix: None,
        }));
        a.source_ranges = Some(Arc::new(SourceRanges {
            allow: Some(vec!["10.0.0.0/8".parse().unwrap()]),
            ..SourceRanges::default()
        }));
        let outsider = conn("192.0.2.1:5000");
        let rewriting = runtime(a.clone(), None, None);
        let answer = admitted(&rewriting, get("a.test", "/p"), &outsider).unwrap();
        assert_eq!(answer, Some((302, "https://elsewhere.test/".to_owned())));
        a.rewrite = None;
        let redirecting = runtime(a.clone(), None, None);
        let answer = admitted(&redirecting, get("a.test", "/p"), &outsider).unwrap();
        assert_eq!(answer.map(|(code, _)| code), Some(308));
        a.redirect_https = false;
        let guarded = runtime(a, None, None);
        for peer in ["192.0.2.1:5000", "[2001:db8::1]:5000"] {
            let refused = admitted(&guarded, get("a.test", "/p"), &conn(peer)).unwrap_err();
            assert_eq!(refused.status(), StatusCode::FORBIDDEN, "{peer}");
        }
        let insider = conn("10.1.2.3:5000");
        assert_eq!(
            admitted(&guarded, get("a.test", "/p"), &insider).unwrap(),
            None
        );
    }

    #[test]
    fn admit_refuses_declared_bodies_over_the_limit() {
        let mut a = action("ns/svc:80");
        a.max_body_bytes = 10;
        let runtime = runtime(a, None, None);
        let mut req = get("a.test", "/");
        req.headers_mut()
            .insert(header::CONTENT_LENGTH, HeaderValue::from_static("11"));
        let refused = admitted(&runtime, req, &conn("192.0.2.1:5000")).unwrap_err();
        assert_eq!(refused.status(), StatusCode::PAYLOAD_TOO_LARGE);
        let mut req = get("a.test", "/");
        req.headers_mut()
            .insert(header::CONTENT_LENGTH, HeaderValue::from_static("10"));
        assert_eq!(admitted(&runtime, req, &conn("[::1]:5000")).unwrap(), None);
    }

    #[test]
    fn choose_needs_a_backend_and_usable_tls_and_takes_the_route_timeouts() {
        let req = get("a.test", "/");
        let c = conn("[::1]:5000");
        let missing_backend = runtime(action("ns/gone:80"), None, None);
        let live = missing_backend.load_full();
        let mut exchange = missing_backend.telemetry().exchange(&req, &c);
        let routed = route(&live, &req).unwrap();
        let config = &missing_backend.config;
        let missing = choose(&live, &routed, req.headers(), &c, config, &mut exchange).unwrap_err();
        assert_eq!(missing.status(), StatusCode::SERVICE_UNAVAILABLE);

        let mut a = action("ns/svc:80");
        a.protocol = Some(UpstreamProtocol::Https);
        let reason = "CA Secret ns/ca does not exist";
        let trust = UpstreamTrust::SystemRoots;
        a.upstream_tls = Some(Arc::new(UpstreamTls::unusable(
            "svc.ns.svc",
            &trust,
            reason,
        )));
        a.timeouts.read = Some(Duration::from_secs(7));
        let unusable_tls = runtime(a.clone(), None, None);
        let live = unusable_tls.load_full();
        let routed = route(&live, &req).unwrap();
        let config = &unusable_tls.config;
        let unusable =
            choose(&live, &routed, req.headers(), &c, config, &mut exchange).unwrap_err();
        assert_eq!(unusable.status(), StatusCode::BAD_GATEWAY);

        let skip = UpstreamTrust::SkipVerify;
        a.upstream_tls = Some(Arc::new(
            UpstreamTls::new("svc.ns.svc", &skip, false).unwrap(),
        ));
        let usable_tls = runtime(a, None, None);
        let live = usable_tls.load_full();
        let routed = route(&live, &req).unwrap();
        let config = &usable_tls.config;
        let plan = choose(&live, &routed, req.headers(), &c, config, &mut exchange).unwrap();
        assert!(plan.tls.is_some());
        assert_eq!(plan.protocol, UpstreamProtocol::Https);
        assert_eq!(plan.read_timeout, Duration::from_secs(7));
        assert_eq!(plan.connect_timeout, config.connect_timeout);
        assert_eq!(plan.preferred, Family::V6);
    }

    /// An HTTP/1.1 server on `ip` answering 200 to everything.
    async fn ok_server(ip: &str) -> SocketAddr {
        let listener = tokio::net::TcpListener::bind((ip, 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let service = hyper::service::service_fn(|_req| async {
                    let empty = http_body_util::Empty::<bytes::Bytes>::new();
                    Ok::<_, Infallible>(Response::new(empty))
                });
                let io = hyper_util::rt::TokioIo::new(stream);
                let builder = hyper::server::conn::http1::Builder::new();
                tokio::spawn(builder.serve_connection(io, service));
            }
        });
        addr
    }

    #[tokio::test]
    async fn a_closed_family_falls_back_and_every_failed_attempt_counts_toward_ejection() {
        // A pod whose IPv4 port is closed and whose IPv6 port answers, and the other way round;
        // the client is of the closed family, so that family is tried first.
        for (closed, open, client) in [
            ("127.0.0.1", "::1", "192.0.2.1:5000"),
            ("::1", "127.0.0.1", "[2001:db8::1]:5000"),
        ] {
            let closed_addr = std::net::TcpListener::bind((closed, 0))
                .unwrap()
                .local_addr()
                .unwrap();
            let open_addr = ok_server(open).await;
            let (v4, v6) = match Family::of(&closed_addr) {
                Family::V4 => (closed_addr, open_addr),
                Family::V6 => (open_addr, closed_addr),
            };
            let runtime = runtime(action("ns/svc:80"), Some(v4), Some(v6));
            let proxy = Proxy::new(runtime.clone());
            let client = conn(client);
            let live = runtime.load_full();
            let req = get("a.test", "/");
            let routed = route(&live, &req).unwrap();
            let mut exchange = runtime.telemetry().exchange(&req, &client);
            let plan = choose(
                &live,
                &routed,
                req.headers(),
                &client,
                &runtime.config,
                &mut exchange,
            )
            .unwrap();
            let state = &plan.backend.states[0];
            for attempt in 1..=crate::balance::EJECT_AFTER_FAILURES {
                let request = Request::builder()
                    .uri("/")
                    .header(header::HOST, "a.test")
                    .body(Either::Right(http_body_util::Empty::new()))
                    .unwrap();
                let sent = proxy
                    .send_with_fallback(
                        &plan,
                        &mut Some(request),
                        None,
                        &client,
                        &mut exchange,
                        &mut Tried::default(),
                    )
                    .await;
                let (sent, _in_flight, _served) = sent.unwrap_or_else(|e| panic!("{closed}: {e}"));
                assert_eq!(sent.response.status(), StatusCode::OK, "{closed}");
                let ejected = state.is_ejected(Family::of(&closed_addr));
                let last = attempt == crate::balance::EJECT_AFTER_FAILURES;
                assert_eq!(ejected, last, "{closed}: attempt {attempt}");
            }
        }
    }
}
