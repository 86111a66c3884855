//! Request mirrors (Gateway API `RequestMirror`): for each mirror of the route its sampling
//! picks, a copy of the upstream request (its head as the route's filters left it) goes to the
//! mirror backend on a task of its own; the answer is read and discarded. The client's answer
//! never waits for a mirror, and a mirror that fails or is slow changes nothing for it.
//!
//! - Body: only a request without a body is mirrored (its head is all there is to copy). One with
//!   a body, or asking for an upgrade, is not mirrored at all rather than mirrored without its
//!   body: a copy would mean holding the body back from the primary or buffering it, and a mirror
//!   given a request the client did not send (a `POST` with no body) misleads more than a missing
//!   one. Such requests count as `skipped`.
//! - Bound: at most [`MAX_IN_FLIGHT`] mirrors in flight per process; a mirror over it is not
//!   sent and counts as `shed` (`duet_request_mirrors_total`).
//! - Addresses: the balancer picks one target of the mirror backend for the client's family under
//!   the route's family policy, exactly as for the primary; its address of the client's family is
//!   tried, then (if the policy allows) the other. A mirror is never sent to a second target and
//!   never replayed: it goes through the address fallback once.
//! - Protocols: plain HTTP/1.1 and h2c; a mirror backend speaking TLS is `skipped`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use http::Request;
use http_body_util::{BodyExt, Either, Empty};
use hyper::body::Body;

use crate::metrics::{Metrics, MirrorOutcome};
use crate::route_policy::Mirror;
use crate::runtime::{Live, ProxyConfig};
use crate::table::{BackendId, Family, FamilyPolicy};
use crate::upstream::{Peer, SendError, Sent, Upstream, UpstreamBody};

/// Mirrors in flight per process at most.
pub(crate) const MAX_IN_FLIGHT: usize = 512;

/// Most response bytes a mirror reads (and discards) so that its connection can be reused;
/// beyond them the connection is closed.
const MAX_DRAINED: usize = 1 << 20;

/// What a mirror needs beyond the request: shared by every request of a proxy.
#[derive(Debug)]
pub(crate) struct Mirrors {
    upstream: Arc<Upstream>,
    metrics: Arc<Metrics>,
    in_flight: Arc<AtomicUsize>,
    limit: usize,
}

/// One mirror's place among those in flight, given back when dropped.
struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The client side of a request its mirrors need.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Client {
    /// The client's address family.
    pub family: Family,
    /// The route's family policy.
    pub policy: FamilyPolicy,
    /// Whether the request asks for an upgrade.
    pub upgrade: bool,
}

impl Client {
    /// The client side of a request on `conn` planned as `plan`.
    pub(crate) fn of(
        conn: &crate::conn::ConnInfo,
        plan: &super::Plan<'_>,
        upgrade: bool,
    ) -> Client {
        Client {
            family: conn.family,
            policy: plan.policy,
            upgrade,
        }
    }
}

impl Mirrors {
    /// Mirrors sent over `upstream`, counted in `metrics`.
    pub(crate) fn new(upstream: Arc<Upstream>, metrics: Arc<Metrics>) -> Mirrors {
        Mirrors::with_limit(upstream, metrics, MAX_IN_FLIGHT)
    }

    /// As [`Mirrors::new`] with another bound on those in flight.
    pub(crate) fn with_limit(
        upstream: Arc<Upstream>,
        metrics: Arc<Metrics>,
        limit: usize,
    ) -> Mirrors {
        Mirrors {
            upstream,
            metrics,
            in_flight: Arc::new(AtomicUsize::new(0)),
            limit,
        }
    }

    fn slot(&self) -> Option<Slot> {
        let before = self.in_flight.fetch_add(1, Ordering::AcqRel);
        let slot = Slot(self.in_flight.clone());
        (before < self.limit).then_some(slot)
    }

    /// Starts the mirrors of `request` its route's sampling picks (each on a task of its own).
    pub(crate) fn start(
        &self,
        live: &Arc<Live>,
        mirrors: &[Mirror<BackendId>],
        request: &Request<UpstreamBody>,
        client: Client,
        config: &ProxyConfig,
    ) {
        for mirror in mirrors {
            if !mirror.sampled() {
                continue;
            }
            let copy = match copy(request) {
                Some(copy) if !client.upgrade => copy,
                _ => {
                    self.metrics.mirror(MirrorOutcome::Skipped);
                    continue;
                }
            };
            let Some(slot) = self.slot() else {
                self.metrics.mirror(MirrorOutcome::Shed);
                continue;
            };
            let job = Job {
                upstream: self.upstream.clone(),
                live: live.clone(),
                backend: mirror.backend.clone(),
                request: copy,
                client,
                config: (config.connect_timeout, config.response_timeout),
            };
            let metrics = self.metrics.clone();
            tokio::spawn(async move {
                let outcome = job.run().await;
                metrics.mirror(outcome);
                drop(slot);
            });
        }
    }
}

/// The head of a request without a body, with an empty body (`None` when it has a body).
pub(crate) fn copy(request: &Request<UpstreamBody>) -> Option<Request<UpstreamBody>> {
    if !request.body().is_end_stream() {
        return None;
    }
    let mut copy = Request::new(Either::Right(Empty::new()));
    *copy.method_mut() = request.method().clone();
    *copy.uri_mut() = request.uri().clone();
    *copy.version_mut() = request.version();
    *copy.headers_mut() = request.headers().clone();
    Some(copy)
}

/// Reads a response that is not passed on to its end (within `read_timeout`) and drops it, so
/// that its connection can serve again.
pub(crate) async fn discard(sent: Sent, read_timeout: std::time::Duration) {
    let _pool_return = sent.pool_return;
    let _ = tokio::time::timeout(read_timeout, drain(sent.response.into_body())).await;
}

/// One mirror on its way.
struct Job {
    upstream: Arc<Upstream>,
    live: Arc<Live>,
    backend: BackendId,
    request: Request<UpstreamBody>,
    client: Client,
    /// Connect and response timeouts.
    config: (std::time::Duration, std::time::Duration),
}

impl Job {
    async fn run(self) -> MirrorOutcome {
        let (connect_timeout, read_timeout) = self.config;
        let bound = connect_timeout.saturating_mul(2) + read_timeout;
        match tokio::time::timeout(bound, self.send()).await {
            Ok(outcome) => outcome,
            Err(_elapsed) => MirrorOutcome::Failed,
        }
    }

    async fn send(self) -> MirrorOutcome {
        let Some(backend) = self.live.backends.get(&self.backend) else {
            return MirrorOutcome::Failed;
        };
        let protocol = backend.backend.protocol;
        if protocol.is_tls() {
            return MirrorOutcome::Skipped;
        }
        let Some(pick) = backend.pick(self.client.family, self.client.policy, &[]) else {
            return MirrorOutcome::Failed;
        };
        let mut slot = Some(self.request);
        for (family, addr) in pick.addrs.into_iter().flatten() {
            let peer = Peer {
                addr,
                family,
                protocol,
                tls: None,
                connect_timeout: self.config.0,
                read_timeout: self.config.1,
                forwarding: None,
            };
            match self.upstream.send(&peer, &mut slot).await {
                Ok(sent) => {
                    discard(sent, self.config.1).await;
                    return MirrorOutcome::Answered;
                }
                Err(SendError::Unsent(_)) => continue,
                Err(SendError::Failed(_)) => return MirrorOutcome::Failed,
            }
        }
        MirrorOutcome::Failed
    }
}

/// Reads a mirror's response body to its end (up to [`MAX_DRAINED`] bytes) and drops it.
async fn drain<B: Body + Unpin>(mut body: B) {
    let mut read = 0;
    while read <= MAX_DRAINED {
        match body.frame().await {
            Some(Ok(frame)) => read += frame.data_ref().map_or(0, remaining),
            _ => return,
        }
    }
}

fn remaining<D: bytes::Buf>(data: &D) -> usize {
    data.remaining()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn mirrors(limit: usize) -> (Mirrors, Arc<Metrics>) {
        let metrics = Metrics::unregistered();
        let upstream = Arc::new(Upstream::new(Duration::from_secs(1), 1));
        (
            Mirrors::with_limit(upstream, metrics.clone(), limit),
            metrics,
        )
    }

    #[test]
    fn mirrors_over_the_bound_are_refused_until_one_ends() {
        let (m, _) = mirrors(2);
        let (a, b) = (m.slot(), m.slot());
        assert!(a.is_some() && b.is_some());
        assert!(m.slot().is_none(), "a third mirror in flight");
        drop(a);
        assert!(
            m.slot().is_some(),
            "a slot is given back when its mirror ends"
        );
        assert_eq!(m.in_flight.load(Ordering::Acquire), 1);
    }
}
