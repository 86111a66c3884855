//! Prometheus metrics of the dataplane (`prometheus-client`, no global registry): requests and
//! latencies by route and address family, upstream connect failures, family fallbacks and
//! ejections, targets by kind, connections by listener, snapshot and certificate gauges.
//!
//! Label handles are made when a snapshot is applied ([`LiveMetrics::build`]): one
//! [`RouteMetrics`] per route (namespace, Ingress, Service, host entry as written), carried over
//! between snapshots, holding its Service's failure counters and a table of request handles
//! indexed by method, client family and upstream family. A request indexes arrays and bumps
//! atomics; the series of one label combination is created the first time a request has it and
//! is cached in the route's table for every later request. When a route leaves the table its
//! series leave the exposition (and a Service's failure counters once no route uses it), so
//! deleted Ingresses do not pile up in a long-running process. Every label value is bounded: host
//! entries of the table (never the Host header), nine methods plus `other`, families, status
//! codes.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::Method;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family as Series;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

use crate::ptr_key::{addr_of, AddrMap};
use crate::table::{BackendId, Family, RouteAction, RouteTable, Snapshot};

/// Buckets of the request and upstream latency histograms, in seconds: 0.5 ms to 60 s.
pub const LATENCY_BUCKETS: [f64; 16] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0,
];

/// The methods that get their own `method` label value; any other is `other`.
pub const METHODS: [Method; 9] = [
    Method::GET,
    Method::HEAD,
    Method::POST,
    Method::PUT,
    Method::DELETE,
    Method::CONNECT,
    Method::OPTIONS,
    Method::TRACE,
    Method::PATCH,
];
const METHOD_LABELS: [&str; 10] = [
    "GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH", "other",
];

/// The bounded index of a method (`METHODS` position, or 9 for `other`).
pub fn method_index(method: &Method) -> u8 {
    METHODS
        .iter()
        .position(|m| m == method)
        .unwrap_or(METHODS.len()) as u8
}

/// The `method` label of an index from [`method_index`].
pub fn method_label(index: u8) -> &'static str {
    METHOD_LABELS[usize::from(index).min(METHOD_LABELS.len() - 1)]
}

/// The `upstream_family` label: `ipv4`, `ipv6` or `none` (answered without an upstream).
pub fn upstream_family_label(family: Option<Family>) -> &'static str {
    family.map_or("none", Family::as_str)
}

const FAMILIES: [Family; 2] = [Family::V4, Family::V6];

fn slot(family: Family) -> usize {
    match family {
        Family::V4 => 0,
        Family::V6 => 1,
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    namespace: Arc<str>,
    ingress: Arc<str>,
    service: Arc<str>,
    host: Arc<str>,
    method: &'static str,
    code: u16,
    client_family: &'static str,
    upstream_family: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LatencyLabels {
    namespace: Arc<str>,
    ingress: Arc<str>,
    service: Arc<str>,
    host: Arc<str>,
    method: &'static str,
    client_family: &'static str,
    upstream_family: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ServiceFamilyLabels {
    service: Arc<str>,
    family: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FallbackLabels {
    service: Arc<str>,
    from: &'static str,
    to: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TargetLabels {
    namespace: Arc<str>,
    service: Arc<str>,
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ListenerLabels {
    listener: Arc<str>,
    family: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SecretLabels {
    secret: Arc<str>,
}

type HistogramSeries<L> = Series<L, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    Histogram::new(LATENCY_BUCKETS)
}

/// The dataplane's metric families, registered once at start.
#[derive(Clone, Debug)]
pub struct Metrics {
    requests: Series<RequestLabels, Counter>,
    request_duration: HistogramSeries<LatencyLabels>,
    upstream_response: HistogramSeries<LatencyLabels>,
    connect_failures: Series<ServiceFamilyLabels, Counter>,
    fallbacks: Series<FallbackLabels, Counter>,
    ejections: Series<ServiceFamilyLabels, Counter>,
    backend_targets: Series<TargetLabels, Gauge>,
    connections_active: Series<ListenerLabels, Gauge>,
    connections_total: Series<ListenerLabels, Counter>,
    connections_refused: Series<ListenerLabels, Counter>,
    snapshot_version: Gauge,
    snapshot_applied: Gauge<f64, AtomicU64>,
    tls_expiry: Series<SecretLabels, Gauge>,
    access_log_dropped: Counter,
    tunnels_active: Series<ClientFamilyLabels, Gauge>,
    tunnels_total: Series<ClientFamilyLabels, Counter>,
    tunnels_closed: Series<TunnelEndLabels, Counter>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClientFamilyLabels {
    client_family: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TunnelEndLabels {
    reason: &'static str,
}

/// How a WebSocket tunnel ended (the `reason` of `duet_tunnels_closed_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TunnelEnd {
    /// The client or the upstream closed it.
    Closed,
    /// No byte either way for the idle timeout.
    Idle,
    /// Closed at the end of the drain on shutdown.
    Drain,
}

impl TunnelEnd {
    fn label(self) -> &'static str {
        match self {
            TunnelEnd::Closed => "closed",
            TunnelEnd::Idle => "idle",
            TunnelEnd::Drain => "drain",
        }
    }
}

impl Metrics {
    /// Creates the families and registers them (names as exposed are in the README).
    pub fn register(registry: &mut Registry) -> Arc<Metrics> {
        let m = Metrics {
            requests: Series::default(),
            request_duration: Series::new_with_constructor(latency_histogram),
            upstream_response: Series::new_with_constructor(latency_histogram),
            connect_failures: Series::default(),
            fallbacks: Series::default(),
            ejections: Series::default(),
            backend_targets: Series::default(),
            connections_active: Series::default(),
            connections_total: Series::default(),
            connections_refused: Series::default(),
            snapshot_version: Gauge::default(),
            snapshot_applied: Gauge::default(),
            tls_expiry: Series::default(),
            access_log_dropped: Counter::default(),
            tunnels_active: Series::default(),
            tunnels_total: Series::default(),
            tunnels_closed: Series::default(),
        };
        for end in [TunnelEnd::Closed, TunnelEnd::Idle, TunnelEnd::Drain] {
            let _ = m.tunnels_closed.get_or_create(&TunnelEndLabels {
                reason: end.label(),
            });
        }
        registry.register(
            "duet_requests",
            "Requests answered, by route (namespace, Ingress, Service, host entry of the table; empty when no route matched), method, status code, client address family and upstream address family (none when answered without an upstream)",
            m.requests.clone(),
        );
        registry.register_with_unit(
            "duet_request_duration",
            "Time from receiving a request to sending the last byte of its response, by route, method, client family and upstream family",
            Unit::Seconds,
            m.request_duration.clone(),
        );
        registry.register_with_unit(
            "duet_upstream_response",
            "Time from sending a request upstream (connect included) to receiving the response head, by route, method, client family and upstream family",
            Unit::Seconds,
            m.upstream_response.clone(),
        );
        registry.register(
            "duet_upstream_connect_failures",
            "Failed connection attempts to upstream targets, by Service and address family of the attempt",
            m.connect_failures.clone(),
        );
        registry.register(
            "duet_family_fallbacks",
            "Requests served over another address family than the family policy prefers for the client, by Service, preferred family (from) and family used (to)",
            m.fallbacks.clone(),
        );
        registry.register(
            "duet_target_family_ejections",
            "Times one address family of one target was skipped for a back-off window after consecutive connect failures, by Service and family",
            m.ejections.clone(),
        );
        registry.register(
            "duet_backend_targets",
            "Ready targets (pods) of a Service in the live snapshot, by kind: dual, ipv4_only, ipv6_only",
            m.backend_targets.clone(),
        );
        registry.register(
            "duet_connections_active",
            "Open client connections, by listener address and client address family",
            m.connections_active.clone(),
        );
        registry.register(
            "duet_connections",
            "Client connections accepted, by listener address and client address family",
            m.connections_total.clone(),
        );
        registry.register(
            "duet_connections_refused",
            "Client connections closed right after accept because --max-connections were open, by listener address and client address family",
            m.connections_refused.clone(),
        );
        registry.register(
            "duet_snapshot_version",
            "Version of the live routing snapshot",
            m.snapshot_version.clone(),
        );
        registry.register_with_unit(
            "duet_snapshot_applied_timestamp",
            "Unix time at which the live routing snapshot was applied",
            Unit::Seconds,
            m.snapshot_applied.clone(),
        );
        registry.register_with_unit(
            "duet_tls_certificate_expiry_timestamp",
            "Unix time at which a served TLS certificate expires, by Secret (namespace/name)",
            Unit::Seconds,
            m.tls_expiry.clone(),
        );
        registry.register(
            "duet_access_log_dropped",
            "Access-log lines dropped because the log writer could not keep up",
            m.access_log_dropped.clone(),
        );
        registry.register(
            "duet_tunnels_active",
            "Open WebSocket tunnels, by client address family",
            m.tunnels_active.clone(),
        );
        registry.register(
            "duet_tunnels",
            "WebSocket tunnels opened (101 relayed), by client address family",
            m.tunnels_total.clone(),
        );
        registry.register(
            "duet_tunnels_closed",
            "WebSocket tunnels ended, by reason: closed (by a side), idle (idle timeout), drain (shutdown)",
            m.tunnels_closed.clone(),
        );
        Arc::new(m)
    }

    /// Families registered nowhere (for tests and tools that expose no metrics).
    pub fn unregistered() -> Arc<Metrics> {
        Metrics::register(&mut Registry::default())
    }

    /// Counts a tunnel as opened and open.
    pub fn tunnel_opened(&self, family: Family) {
        let labels = ClientFamilyLabels {
            client_family: family.as_str(),
        };
        self.tunnels_total.get_or_create(&labels).inc();
        self.tunnels_active.get_or_create(&labels).inc();
    }

    /// Counts a tunnel as no longer open.
    pub fn tunnel_left(&self, family: Family) {
        let labels = ClientFamilyLabels {
            client_family: family.as_str(),
        };
        self.tunnels_active.get_or_create(&labels).dec();
    }

    /// Counts how a tunnel ended.
    pub fn tunnel_closed(&self, end: TunnelEnd) {
        let labels = TunnelEndLabels {
            reason: end.label(),
        };
        self.tunnels_closed.get_or_create(&labels).inc();
    }

    /// The connection handles of one listener.
    pub fn listener(&self, listener: SocketAddr) -> ConnectionMetrics {
        let name: Arc<str> = listener.to_string().into();
        let labels = |f: Family| ListenerLabels {
            listener: name.clone(),
            family: f.as_str(),
        };
        ConnectionMetrics {
            active: FAMILIES.map(|f| self.connections_active.get_or_create_owned(&labels(f))),
            total: FAMILIES.map(|f| self.connections_total.get_or_create_owned(&labels(f))),
            refused: FAMILIES.map(|f| self.connections_refused.get_or_create_owned(&labels(f))),
        }
    }

    /// Sets the expiry time of the certificate of a TLS Secret (`namespace/name`).
    pub fn set_certificate_expiry(&self, secret: &str, expires: SystemTime) {
        let at = expires
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        self.tls_expiry
            .get_or_create(&SecretLabels {
                secret: secret.into(),
            })
            .set(at);
    }

    /// Removes the per-Service series (connect failures, fallbacks, ejections) of `service`.
    fn forget_service(&self, service: &Arc<str>) {
        for family in FAMILIES {
            let labels = ServiceFamilyLabels {
                service: service.clone(),
                family: family.as_str(),
            };
            self.connect_failures.remove(&labels);
            self.ejections.remove(&labels);
            self.fallbacks.remove(&FallbackLabels {
                service: service.clone(),
                from: family.other().as_str(),
                to: family.as_str(),
            });
        }
    }

    /// Forgets every certificate expiry (before setting those of a new certificate table).
    pub fn clear_certificate_expiries(&self) {
        self.tls_expiry.clear();
    }

    /// Counts one access-log line dropped.
    pub fn access_log_dropped(&self) {
        self.access_log_dropped.inc();
    }

    /// Access-log lines dropped so far.
    pub fn dropped_lines(&self) -> u64 {
        self.access_log_dropped.get()
    }

    /// Records a snapshot as applied now: version, time, and targets by kind.
    pub fn snapshot_applied(
        &self,
        snapshot: &Snapshot,
        backends_changed: bool,
        certs_changed: bool,
    ) {
        self.snapshot_version.set(snapshot.version as i64);
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO);
        self.snapshot_applied.set(now.as_secs_f64());
        if backends_changed {
            self.set_backend_targets(snapshot);
        }
        if certs_changed {
            self.clear_certificate_expiries();
            for cert in snapshot.certs.certs() {
                let leaf = cert
                    .key
                    .cert
                    .first()
                    .and_then(|c| crate::x509::not_after(c));
                if let Some(expires) = leaf {
                    self.set_certificate_expiry(&cert.source, expires);
                }
            }
        }
    }

    fn set_backend_targets(&self, snapshot: &Snapshot) {
        // Several ports of one Service are several backends over the same pods: count the
        // Service once, by its backend with the most targets.
        let mut per_service: HashMap<(&str, &str), [i64; 3]> = HashMap::new();
        for backend in snapshot.backends.values() {
            let (namespace, service) = split_backend_id(&backend.id);
            let mut kinds = [0i64; 3];
            for t in backend.targets.iter() {
                match (t.v4.is_some(), t.v6.is_some()) {
                    (true, true) => kinds[0] += 1,
                    (true, false) => kinds[1] += 1,
                    (false, true) => kinds[2] += 1,
                    (false, false) => {}
                }
            }
            let entry = per_service.entry((namespace, service)).or_default();
            if kinds.iter().sum::<i64>() >= entry.iter().sum::<i64>() {
                *entry = kinds;
            }
        }
        self.backend_targets.clear();
        for ((namespace, service), kinds) in per_service {
            let (namespace, service): (Arc<str>, Arc<str>) = (namespace.into(), service.into());
            for (kind, n) in ["dual", "ipv4_only", "ipv6_only"].into_iter().zip(kinds) {
                self.backend_targets
                    .get_or_create(&TargetLabels {
                        namespace: namespace.clone(),
                        service: service.clone(),
                        kind,
                    })
                    .set(n);
            }
        }
    }
}

/// `namespace/service:port` -> (`namespace`, `service`).
fn split_backend_id(id: &BackendId) -> (&str, &str) {
    let (namespace, rest) = id.0.split_once('/').unwrap_or(("", &id.0));
    let service = rest.rsplit_once(':').map_or(rest, |(s, _)| s);
    (namespace, service)
}

/// The connection counters of one listener, per client family.
#[derive(Clone, Debug)]
pub struct ConnectionMetrics {
    active: [Gauge; 2],
    total: [Counter; 2],
    refused: [Counter; 2],
}

impl ConnectionMetrics {
    /// Counts a connection as accepted and open until the guard drops.
    pub fn open(&self, family: Family) -> OpenConnection {
        let i = slot(family);
        self.total[i].inc();
        self.active[i].inc();
        OpenConnection(self.active[i].clone())
    }

    /// Counts a connection refused by the connection limit.
    pub fn refused(&self, family: Family) {
        self.refused[slot(family)].inc();
    }
}

/// Keeps a connection counted in `duet_connections_active` while alive.
#[derive(Debug)]
pub struct OpenConnection(Gauge);

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// The labels of one route, shared by all its series.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct RouteKey {
    namespace: Arc<str>,
    ingress: Arc<str>,
    service: Arc<str>,
    host: Arc<str>,
}

/// Counters of a route's Service, made when the snapshot is applied.
#[derive(Debug)]
struct ServiceCounters {
    connect_failures: [Counter; 2],
    /// Indexed by the family used; the preferred one is the other.
    fallbacks: [Counter; 2],
    ejections: [Counter; 2],
}

/// Request handles of one method / client family / upstream family combination.
#[derive(Debug)]
struct Slot {
    labels: LatencyLabels,
    codes: [OnceLock<(u16, Counter)>; CODE_SLOTS],
    /// A code found no free cell and went through the family's map.
    overflowed: AtomicBool,
    duration: Histogram,
    upstream: Option<Histogram>,
}

/// Distinct status codes cached per slot; more (rare) go through the family's map.
const CODE_SLOTS: usize = 8;
const SLOTS: usize = METHOD_LABELS.len() * 2 * 3;

/// The metric handles of one route (or of the requests no route matched).
#[derive(Debug)]
pub struct RouteMetrics {
    key: RouteKey,
    metrics: Arc<Metrics>,
    service: Option<ServiceCounters>,
    slots: OnceLock<Box<[OnceLock<Box<Slot>>]>>,
}

/// What one finished request adds to the metrics.
#[derive(Clone, Copy, Debug)]
pub struct Observation {
    /// From [`method_index`].
    pub method: u8,
    /// The status code sent.
    pub code: u16,
    /// The client's family.
    pub client: Family,
    /// The upstream's family, when an upstream answered (or failed after the request was sent).
    pub upstream: Option<Family>,
    /// Request start to last response byte.
    pub duration: Duration,
    /// Upstream send to response head.
    pub upstream_time: Option<Duration>,
}

impl RouteMetrics {
    fn new(metrics: Arc<Metrics>, key: RouteKey, service_label: Option<Arc<str>>) -> RouteMetrics {
        let service = service_label.map(|service| {
            let per = |series: &Series<ServiceFamilyLabels, Counter>| {
                FAMILIES.map(|f| {
                    series.get_or_create_owned(&ServiceFamilyLabels {
                        service: service.clone(),
                        family: f.as_str(),
                    })
                })
            };
            ServiceCounters {
                connect_failures: per(&metrics.connect_failures),
                ejections: per(&metrics.ejections),
                fallbacks: FAMILIES.map(|to| {
                    metrics.fallbacks.get_or_create_owned(&FallbackLabels {
                        service: service.clone(),
                        from: to.other().as_str(),
                        to: to.as_str(),
                    })
                }),
            }
        });
        RouteMetrics {
            key,
            metrics,
            service,
            slots: OnceLock::new(),
        }
    }

    /// The handles of the requests that matched no route (empty route labels).
    pub fn unmatched(metrics: Arc<Metrics>) -> RouteMetrics {
        let empty: Arc<str> = Arc::from("");
        let key = RouteKey {
            namespace: empty.clone(),
            ingress: empty.clone(),
            service: empty.clone(),
            host: empty,
        };
        RouteMetrics::new(metrics, key, None)
    }

    /// Namespace, Ingress and Service of the route (for the access log).
    pub fn route_labels(&self) -> [Arc<str>; 3] {
        [
            self.key.namespace.clone(),
            self.key.ingress.clone(),
            self.key.service.clone(),
        ]
    }

    /// Counts a failed connection attempt over `family`.
    pub fn connect_failed(&self, family: Family) {
        if let Some(s) = &self.service {
            s.connect_failures[slot(family)].inc();
        }
    }

    /// Counts an ejection of `family` of a target.
    pub fn ejected(&self, family: Family) {
        if let Some(s) = &self.service {
            s.ejections[slot(family)].inc();
        }
    }

    /// Counts a request served over `to` while the policy preferred the other family.
    pub fn fell_back(&self, to: Family) {
        if let Some(s) = &self.service {
            s.fallbacks[slot(to)].inc();
        }
    }

    /// Records a finished request.
    pub fn observe(&self, o: &Observation) {
        let slot = self.slot(o.method, o.client, o.upstream);
        slot.duration.observe(o.duration.as_secs_f64());
        if let (Some(h), Some(t)) = (&slot.upstream, o.upstream_time) {
            h.observe(t.as_secs_f64());
        }
        self.count(slot, o);
    }

    fn count(&self, slot: &Slot, o: &Observation) {
        let start = usize::from(o.code) % CODE_SLOTS;
        for k in 0..CODE_SLOTS {
            let cell = &slot.codes[(start + k) % CODE_SLOTS];
            let (code, counter) = cell.get_or_init(|| {
                (
                    o.code,
                    self.metrics
                        .requests
                        .get_or_create_owned(&self.request_labels(o)),
                )
            });
            if *code == o.code {
                counter.inc();
                return;
            }
        }
        slot.overflowed.store(true, Ordering::Relaxed);
        self.metrics
            .requests
            .get_or_create(&self.request_labels(o))
            .inc();
    }

    fn request_labels(&self, o: &Observation) -> RequestLabels {
        RequestLabels {
            namespace: self.key.namespace.clone(),
            ingress: self.key.ingress.clone(),
            service: self.key.service.clone(),
            host: self.key.host.clone(),
            method: method_label(o.method),
            code: o.code,
            client_family: o.client.as_str(),
            upstream_family: upstream_family_label(o.upstream),
        }
    }

    /// Removes every series of this route from the exposition (the route left the table). A
    /// request still in flight on the old snapshot counts into handles no longer exposed.
    fn forget(&self) {
        let Some(slots) = self.slots.get() else {
            return;
        };
        let m = &self.metrics;
        for slot in slots.iter().filter_map(OnceLock::get) {
            let l = &slot.labels;
            let with_code = |code| RequestLabels {
                namespace: l.namespace.clone(),
                ingress: l.ingress.clone(),
                service: l.service.clone(),
                host: l.host.clone(),
                method: l.method,
                code,
                client_family: l.client_family,
                upstream_family: l.upstream_family,
            };
            if slot.overflowed.load(Ordering::Relaxed) {
                for code in 100..=999 {
                    m.requests.remove(&with_code(code));
                }
            } else {
                for (code, _) in slot.codes.iter().filter_map(OnceLock::get) {
                    m.requests.remove(&with_code(*code));
                }
            }
            m.request_duration.remove(l);
            m.upstream_response.remove(l);
        }
    }

    fn slot(&self, method: u8, client: Family, upstream: Option<Family>) -> &Slot {
        let slots = self
            .slots
            .get_or_init(|| (0..SLOTS).map(|_| OnceLock::new()).collect());
        let u = upstream.map_or(2, slot);
        let index = (usize::from(method).min(METHOD_LABELS.len() - 1) * 2 + slot(client)) * 3 + u;
        slots[index].get_or_init(|| {
            let labels = LatencyLabels {
                namespace: self.key.namespace.clone(),
                ingress: self.key.ingress.clone(),
                service: self.key.service.clone(),
                host: self.key.host.clone(),
                method: method_label(method),
                client_family: client.as_str(),
                upstream_family: upstream_family_label(upstream),
            };
            Box::new(Slot {
                codes: std::array::from_fn(|_| OnceLock::new()),
                overflowed: AtomicBool::new(false),
                duration: self.metrics.request_duration.get_or_create_owned(&labels),
                upstream: upstream
                    .map(|_| self.metrics.upstream_response.get_or_create_owned(&labels)),
                labels,
            })
        })
    }
}

#[derive(Debug, Default)]
struct RouteIndex {
    /// Route handles by the address of the route's `RouteAction` in the snapshot's table.
    by_action: AddrMap<Arc<RouteMetrics>>,
    /// The same handles by labels, to carry them over to the next snapshot.
    by_key: HashMap<RouteKey, Arc<RouteMetrics>>,
    /// The table the addresses belong to.
    table: Option<Arc<RouteTable>>,
}

/// The route handles of one applied snapshot.
#[derive(Clone, Debug, Default)]
pub struct LiveMetrics {
    index: Arc<RouteIndex>,
}

impl LiveMetrics {
    /// Makes the handles of every route of `snapshot`, reusing those of `previous` with the same
    /// labels (and the whole index when the route table is shared).
    pub fn build(
        metrics: &Arc<Metrics>,
        snapshot: &Snapshot,
        previous: &LiveMetrics,
    ) -> LiveMetrics {
        if let Some(table) = &previous.index.table {
            if Arc::ptr_eq(table, &snapshot.routes) {
                return previous.clone();
            }
        }
        let routes = &snapshot.routes;
        let mut index = RouteIndex {
            table: Some(routes.clone()),
            ..RouteIndex::default()
        };
        let mut services: HashMap<&BackendId, Arc<str>> = HashMap::new();
        let mut host_labels: HashMap<&str, Arc<str>> = HashMap::new();
        for (host, action) in routes.actions() {
            let service = services
                .entry(&action.backend)
                .or_insert_with(|| split_backend_id(&action.backend).1.into())
                .clone();
            let host = host_labels
                .entry(host)
                .or_insert_with(|| host.into())
                .clone();
            let key = RouteKey {
                namespace: action.origin.namespace.clone(),
                ingress: action.origin.name.clone(),
                service,
                host,
            };
            let handles = match index.by_key.get(&key) {
                Some(h) => h.clone(),
                None => {
                    let h = previous.index.by_key.get(&key).cloned().unwrap_or_else(|| {
                        Arc::new(RouteMetrics::new(
                            metrics.clone(),
                            key.clone(),
                            Some(key.service.clone()),
                        ))
                    });
                    index.by_key.insert(key, h.clone());
                    h
                }
            };
            index.by_action.insert(addr_of(action), handles);
        }
        // Routes that left the table take their series with them, and so do Services no
        // route uses any more: a long-running controller does not grow an exposition of dead
        // Ingresses.
        let services: HashSet<&Arc<str>> = index.by_key.keys().map(|k| &k.service).collect();
        let mut gone_services: HashSet<&Arc<str>> = HashSet::new();
        for (key, handles) in &previous.index.by_key {
            if !index.by_key.contains_key(key) {
                handles.forget();
                if !services.contains(&key.service) {
                    gone_services.insert(&key.service);
                }
            }
        }
        for service in gone_services {
            metrics.forget_service(service);
        }
        LiveMetrics {
            index: Arc::new(index),
        }
    }

    /// The handles of a matched route of this snapshot.
    pub fn route(&self, action: &RouteAction) -> Option<&Arc<RouteMetrics>> {
        self.index.by_action.get(&addr_of(action))
    }

    /// How many distinct routes (label sets) have handles.
    pub fn routes(&self) -> usize {
        self.index.by_key.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::{FamilyPolicy, HostRules, Origin, PathMatch, PathRule};

    fn encode(registry: &Registry) -> String {
        let mut out = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut out, registry).unwrap();
        out
    }

    fn action(ns: &str, ingress: &str, backend: &str) -> RouteAction {
        RouteAction {
            backend: BackendId(backend.into()),
            policy: FamilyPolicy::default(),
            origin: Origin {
                namespace: ns.into(),
                name: ingress.into(),
                created: 0,
            },
            redirect_https: false,
            max_body_bytes: 0,
            upstream_tls: None,
            timeouts: Default::default(),
            protocol: None,
            redirect: None,
            source_ranges: None,
            rewrite: None,
        }
    }

    fn table() -> Arc<RouteTable> {
        let mut t = RouteTable::default();
        let rule = |path: &str, a: RouteAction| PathRule {
            matcher: PathMatch::prefix(path),
            action: a,
        };
        t.exact.insert(
            "a.test".into(),
            HostRules::new(
                "a.test",
                vec![
                    rule("/", action("shop", "web", "shop/api:80")),
                    rule("/x", action("shop", "web", "shop/api:http")),
                ],
            )
            .0,
        );
        t.wildcard.insert(
            "b.test".into(),
            HostRules::new(
                "*.b.test",
                vec![rule("/", action("shop", "web", "shop/api:80"))],
            )
            .0,
        );
        t.default_backend = Some(action("shop", "dflt", "shop/api:80"));
        Arc::new(t)
    }

    #[test]
    fn handles_per_route_labels_and_carried_over() {
        let mut registry = Registry::default();
        let metrics = Metrics::register(&mut registry);
        let snapshot = Snapshot {
            version: 1,
            routes: table(),
            ..Snapshot::default()
        };
        let live = LiveMetrics::build(&metrics, &snapshot, &LiveMetrics::default());
        // a.test (two paths, same labels), *.b.test, the default backend (no host).
        assert_eq!(live.routes(), 3);
        let m = snapshot.routes.find("A.test:80", "/x/y").unwrap();
        let route = live.route(m.action).unwrap().clone();
        route.observe(&Observation {
            method: method_index(&Method::GET),
            code: 200,
            client: Family::V6,
            upstream: Some(Family::V4),
            duration: Duration::from_millis(3),
            upstream_time: Some(Duration::from_millis(2)),
        });
        route.fell_back(Family::V4);
        let text = encode(&registry);
        assert!(
            text.contains(r#"duet_requests_total{namespace="shop",ingress="web",service="api",host="a.test",method="GET",code="200",client_family="ipv6",upstream_family="ipv4"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"duet_family_fallbacks_total{service="api",from="ipv6",to="ipv4"} 1"#),
            "{text}"
        );
        assert!(
            text.contains("duet_upstream_response_seconds_count{"),
            "{text}"
        );

        // A new table with the same routes keeps the same handles (and counts).
        let again = Snapshot {
            version: 2,
            routes: table(),
            ..Snapshot::default()
        };
        let next = LiveMetrics::build(&metrics, &again, &live);
        let m = again.routes.find("x.b.test", "/").unwrap();
        assert_eq!(m.host, Some("*.b.test"));
        let wild = next.route(m.action).unwrap();
        let m = again.routes.find("a.test", "/").unwrap();
        assert!(Arc::ptr_eq(next.route(m.action).unwrap(), &route));
        wild.observe(&Observation {
            method: method_index(&Method::from_bytes(b"PURGE").unwrap()),
            code: 503,
            client: Family::V4,
            upstream: None,
            duration: Duration::from_millis(1),
            upstream_time: None,
        });
        let text = encode(&registry);
        assert!(text.contains(r#"host="*.b.test",method="other",code="503",client_family="ipv4",upstream_family="none"} 1"#), "{text}");
    }

    #[test]
    fn series_of_removed_routes_and_services_are_dropped() {
        let mut registry = Registry::default();
        let metrics = Metrics::register(&mut registry);
        let get = |code: u16, client: Family| Observation {
            method: method_index(&Method::GET),
            code,
            client,
            upstream: Some(client),
            duration: Duration::from_millis(1),
            upstream_time: Some(Duration::from_millis(1)),
        };
        let snapshot = Snapshot {
            version: 1,
            routes: table(),
            ..Snapshot::default()
        };
        let live = LiveMetrics::build(&metrics, &snapshot, &LiveMetrics::default());
        let a = snapshot.routes.find("a.test", "/").unwrap().action;
        let b = snapshot.routes.find("x.b.test", "/").unwrap().action;
        for code in [200, 404] {
            live.route(a).unwrap().observe(&get(code, Family::V4));
        }
        // More distinct codes than a slot caches: the overflow series go too.
        for code in 500..520 {
            live.route(b).unwrap().observe(&get(code, Family::V6));
        }
        live.route(b).unwrap().connect_failed(Family::V6);
        let text = encode(&registry);
        assert!(
            text.contains(r#"host="a.test",method="GET",code="404""#),
            "{text}"
        );
        assert!(
            text.contains(r#"host="*.b.test",method="GET",code="519""#),
            "{text}"
        );

        // *.b.test leaves the table; a.test stays with its counts.
        let mut routes = (*table()).clone();
        routes.wildcard.clear();
        let next = Snapshot {
            version: 2,
            routes: Arc::new(routes),
            ..Snapshot::default()
        };
        let live = LiveMetrics::build(&metrics, &next, &live);
        assert_eq!(live.routes(), 2);
        let text = encode(&registry);
        assert!(!text.contains("b.test"), "{text}");
        assert!(text.contains(r#"host="a.test",method="GET",code="404",client_family="ipv4",upstream_family="ipv4"} 1"#), "{text}");
        // Service api is still routed (a.test): its failure counters stay.
        assert!(
            text.contains(r#"duet_upstream_connect_failures_total{service="api",family="ipv6"} 1"#),
            "{text}"
        );

        // Every route gone: no request series and no Service series are left.
        let empty = Snapshot {
            version: 3,
            ..Snapshot::default()
        };
        let live = LiveMetrics::build(&metrics, &empty, &live);
        assert_eq!(live.routes(), 0);
        let text = encode(&registry);
        for series in [
            "duet_requests_total{",
            "duet_request_duration_seconds_count{",
            "duet_upstream_response_seconds_count{",
            "duet_upstream_connect_failures_total{",
            "duet_family_fallbacks_total{",
        ] {
            assert!(!text.contains(series), "{series}: {text}");
        }
    }

    #[test]
    fn many_status_codes_all_count() {
        let metrics = Metrics::unregistered();
        let route = RouteMetrics::unmatched(metrics.clone());
        let codes: Vec<u16> = (200..220).chain(200..220).collect();
        for &code in &codes {
            route.observe(&Observation {
                method: 0,
                code,
                client: Family::V4,
                upstream: None,
                duration: Duration::ZERO,
                upstream_time: None,
            });
        }
        let mut registry = Registry::default();
        registry.register("t", "t", metrics.requests.clone());
        let text = encode(&registry);
        for code in 200..220 {
            assert!(
                text.contains(&format!(
                    "code=\"{code}\",client_family=\"ipv4\",upstream_family=\"none\"}} 2"
                )),
                "{code}: {text}"
            );
        }
    }

    #[test]
    fn backend_targets_by_kind() {
        use crate::table::{Backend, Target, TargetId};
        let mut registry = Registry::default();
        let metrics = Metrics::register(&mut registry);
        let target = |id: &str, v4: Option<&str>, v6: Option<&str>| Target {
            id: TargetId(id.into()),
            v4: v4.map(|a| a.parse().unwrap()),
            v6: v6.map(|a| a.parse().unwrap()),
            zone: None,
        };
        let backend = Backend {
            id: BackendId("shop/api:80".into()),
            targets: vec![
                target("a", Some("10.0.0.1:80"), Some("[fd00::1]:80")),
                target("b", Some("10.0.0.2:80"), None),
                target("c", None, Some("[fd00::3]:80")),
                target("d", None, Some("[fd00::4]:80")),
            ]
            .into(),
            lb: Default::default(),
            protocol: Default::default(),
        };
        let mut snapshot = Snapshot {
            version: 7,
            ..Snapshot::default()
        };
        snapshot
            .backends
            .insert(backend.id.clone(), Arc::new(backend));
        metrics.snapshot_applied(&snapshot, true, false);
        let text = encode(&registry);
        for line in [
            r#"duet_backend_targets{namespace="shop",service="api",kind="dual"} 1"#,
            r#"duet_backend_targets{namespace="shop",service="api",kind="ipv4_only"} 1"#,
            r#"duet_backend_targets{namespace="shop",service="api",kind="ipv6_only"} 2"#,
            "duet_snapshot_version 7",
        ] {
            assert!(text.contains(line), "{line}: {text}");
        }
        assert!(
            text.contains("# HELP duet_snapshot_applied_timestamp_seconds"),
            "{text}"
        );
    }

    #[test]
    fn connections_by_listener_and_family() {
        let mut registry = Registry::default();
        let metrics = Metrics::register(&mut registry);
        let l = metrics.listener("[::1]:8080".parse().unwrap());
        let a = l.open(Family::V6);
        let _b = l.open(Family::V6);
        drop(a);
        let text = encode(&registry);
        assert!(
            text.contains(r#"duet_connections_active{listener="[::1]:8080",family="ipv6"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"duet_connections_total{listener="[::1]:8080",family="ipv6"} 2"#),
            "{text}"
        );
    }

    #[test]
    fn methods_are_bounded() {
        assert_eq!(method_label(method_index(&Method::PATCH)), "PATCH");
        assert_eq!(
            method_label(method_index(&Method::from_bytes(b"BREW").unwrap())),
            "other"
        );
    }
}
