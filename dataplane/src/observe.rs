//! What a request leaves behind: [`Exchange`] follows one request through the proxy and, when its
//! response is done (or the client went away), records its metrics and queues its access-log
//! line. [`Telemetry`] holds the registry, the metric families and the access log.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use http::{header, Request};
use prometheus_client::registry::Registry;

use crate::access_log::{AccessLog, Entry, TlsInfo};
use crate::conn::ConnInfo;
use crate::metrics::{
    method_index, protocol_index, LiveMetrics, Metrics, Observation, RouteMetrics,
};
use crate::table::{Family, RouteAction};

/// The metric registry (everything `/metrics` shows), the dataplane's families and the access log.
#[derive(Debug)]
pub struct Telemetry {
    registry: Registry,
    metrics: Arc<Metrics>,
    access_log: Option<AccessLog>,
    unmatched: Arc<RouteMetrics>,
}

impl Telemetry {
    /// Telemetry over a registry in which `metrics` (and any other component's families) are
    /// registered.
    pub fn new(
        registry: Registry,
        metrics: Arc<Metrics>,
        access_log: Option<AccessLog>,
    ) -> Telemetry {
        Telemetry {
            registry,
            unmatched: Arc::new(RouteMetrics::unmatched(metrics.clone())),
            metrics,
            access_log,
        }
    }

    /// A registry with the dataplane's families only, and no access log.
    pub fn standalone() -> Telemetry {
        let mut registry = Registry::default();
        let metrics = Metrics::register(&mut registry);
        Telemetry::new(registry, metrics, None)
    }

    /// Everything `/metrics` shows.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The dataplane's families.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// The access log, when enabled.
    pub fn access_log(&self) -> Option<&AccessLog> {
        self.access_log.as_ref()
    }

    /// Starts following a request.
    pub fn exchange<B>(&self, req: &Request<B>, conn: &ConnInfo) -> Exchange {
        let log = self.access_log.as_ref().map(|log| {
            let host = match req.uri().authority() {
                Some(a) => http::HeaderValue::from_str(a.as_str()).ok(),
                None => req
                    .headers()
                    .get(header::HOST)
                    .map(crate::access_log::owned_host),
            };
            (
                log.clone(),
                Box::new(Entry {
                    time: SystemTime::now(),
                    client: conn.peer,
                    listener: conn.local,
                    host,
                    method: req.method().clone(),
                    uri: crate::access_log::owned_uri(req.uri()),
                    version: req.version(),
                    status: 0,
                    bytes: 0,
                    duration: Duration::ZERO,
                    upstream: None,
                    upstream_time: None,
                    upstream_protocol: None,
                    route: None,
                    tls: conn.tls_version.map(|version| TlsInfo {
                        version,
                        sni: conn.sni.clone(),
                    }),
                }),
            )
        });
        Exchange {
            start: Instant::now(),
            method: method_index(req.method()),
            protocol: protocol_index(req.version()),
            client: conn.family,
            route: self.unmatched.clone(),
            upstream: None,
            upstream_started: None,
            upstream_time: None,
            status: 0,
            bytes: 0,
            log,
            admission: None,
        }
    }
}

/// One request on its way through the proxy; records itself when dropped (which the proxy
/// arranges for when the response body is done). A request dropped before a status was set is
/// recorded as 499 (the client went away), as nginx does.
#[derive(Debug)]
pub struct Exchange {
    start: Instant,
    method: u8,
    /// From [`protocol_index`].
    protocol: u8,
    client: Family,
    route: Arc<RouteMetrics>,
    upstream: Option<(Family, SocketAddr)>,
    upstream_started: Option<Instant>,
    upstream_time: Option<Duration>,
    status: u16,
    bytes: u64,
    log: Option<(AccessLog, Box<Entry>)>,
    /// What the access policy holds until the response is done.
    admission: Option<crate::policy::Admission>,
}

impl Exchange {
    /// Keeps what the access policy admitted the request with until the response is done.
    pub fn hold(&mut self, admission: crate::policy::Admission) {
        self.admission = Some(admission);
    }

    /// What the access policy admitted the request with, if it was checked.
    pub fn admission(&self) -> Option<&crate::policy::Admission> {
        self.admission.as_ref()
    }

    /// The request matched a route of the snapshot whose metric handles are `metrics`.
    pub fn matched(&mut self, metrics: &LiveMetrics, action: &RouteAction) {
        if let Some(route) = metrics.route(action) {
            self.route = route.clone();
        }
        if let Some((_, entry)) = &mut self.log {
            entry.route = Some(self.route.route_labels());
        }
    }

    /// The matched backend speaks `protocol` (for the access log).
    pub fn upstream_protocol(&mut self, protocol: crate::table::UpstreamProtocol) {
        if let Some((_, entry)) = &mut self.log {
            entry.upstream_protocol = Some(protocol);
        }
    }

    /// A connection attempt over `family` failed.
    pub fn connect_failed(&self, family: Family) {
        self.route.connect_failed(family);
    }

    /// A family of a target was ejected after failures.
    pub fn ejected(&self, family: Family) {
        self.route.ejected(family);
    }

    /// The request is about to go to an upstream address (connect included).
    pub fn upstream_begin(&mut self) {
        self.upstream_started = Some(Instant::now());
    }

    /// The request was sent to `addr` over `family` and answered (or failed after being sent);
    /// `preferred` is the family the policy prefers for this client.
    pub fn upstream_done(&mut self, family: Family, addr: SocketAddr, preferred: Family) {
        self.upstream = Some((family, addr));
        self.upstream_time = self.upstream_started.map(|s| s.elapsed());
        if family != preferred {
            self.route.fell_back(family);
        }
    }

    /// The status code sent to the client.
    pub fn set_status(&mut self, status: u16) {
        self.status = status;
    }

    /// Response body bytes sent.
    pub fn add_bytes(&mut self, n: usize) {
        self.bytes += n as u64;
    }
}

impl Drop for Exchange {
    fn drop(&mut self) {
        let duration = self.start.elapsed();
        let status = if self.status == 0 { 499 } else { self.status };
        self.route.observe(&Observation {
            method: self.method,
            code: status,
            client: self.client,
            upstream: self.upstream.map(|(f, _)| f),
            duration,
            upstream_time: self.upstream_time,
        });
        self.route.count_protocol(self.protocol, self.client);
        if let Some((log, mut entry)) = self.log.take() {
            entry.status = status;
            entry.bytes = self.bytes;
            entry.duration = duration;
            entry.upstream = self.upstream.map(|(_, a)| a);
            entry.upstream_time = self.upstream_time;
            log.log(entry);
        }
    }
}
