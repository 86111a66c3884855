//! Requests by route: counts by status, request and upstream latencies by method and both
//! families, and the per-Service upstream counters (connect failures, family fallbacks,
//! ejections). [`LiveMetrics`] makes one [`RouteMetrics`] per route when a snapshot is applied.

use std::collections::hash_map::Entry;
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family as Series;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

use super::services::{CounterKind, FastMap, FastState, ServiceCounters, ServiceSeries};
use super::{
    latency_histogram, method_label, slot, upstream_family_label, HistogramSeries, Metrics,
    METHOD_LABELS,
};
use crate::ptr_key::{addr_of, AddrMap};
use crate::table::gateway::GatewayTable;
use crate::table::{Family, RouteAction, RouteTable, Snapshot};

mod update;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct RequestLabels {
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

/// The families of requests by route and of the per-Service upstream counters.
#[derive(Clone, Debug)]
pub(super) struct RouteFamilies {
    pub(super) requests: Series<RequestLabels, Counter>,
    request_duration: HistogramSeries<LatencyLabels>,
    upstream_response: HistogramSeries<LatencyLabels>,
    /// Connect failures, fallbacks and ejections by Service.
    services: ServiceSeries,
}

impl RouteFamilies {
    pub(super) fn register(registry: &mut Registry) -> RouteFamilies {
        let f = RouteFamilies {
            requests: Series::default(),
            request_duration: Series::new_with_constructor(latency_histogram),
            upstream_response: Series::new_with_constructor(latency_histogram),
            services: ServiceSeries::default(),
        };
        registry.register(
            "duet_requests",
            "Requests answered, by route (namespace, Ingress, Service, host entry of the table; empty when no route matched), method, status code, client address family and upstream address family (none when answered without an upstream)",
            f.requests.clone(),
        );
        registry.register_with_unit(
            "duet_request_duration",
            "Time from receiving a request to sending the last byte of its response, by route, method, client family and upstream family",
            Unit::Seconds,
            f.request_duration.clone(),
        );
        registry.register_with_unit(
            "duet_upstream_response",
            "Time from sending a request upstream (connect included) to receiving the response head, by route, method, client family and upstream family",
            Unit::Seconds,
            f.upstream_response.clone(),
        );
        registry.register(
            "duet_upstream_connect_failures",
            "Failed connection attempts to upstream targets, by Service and address family of the attempt",
            f.services.family(CounterKind::ConnectFailures),
        );
        registry.register(
            "duet_family_fallbacks",
            "Requests served over another address family than the family policy prefers for the client, by Service, preferred family (from) and family used (to)",
            f.services.family(CounterKind::Fallbacks),
        );
        registry.register(
            "duet_target_family_ejections",
            "Times one address family of one target was skipped for a back-off window after consecutive connect failures, by Service and family",
            f.services.family(CounterKind::Ejections),
        );
        f
    }
}

impl Metrics {
    /// Removes the per-Service series (connect failures, fallbacks, ejections) of `service`.
    fn forget_service(&self, service: &Arc<str>) {
        self.routes.services.remove(service);
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
    /// The counters of the route's Service, shared by every route to it.
    service: Option<Arc<ServiceCounters>>,
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
        let service = service_label.map(|service| metrics.routes.services.get_or_create(&service));
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

    /// Counts a finished request by protocol (from [`super::protocol_index`]) and client family.
    pub fn count_protocol(&self, protocol: u8, client: Family) {
        self.metrics.request_by_protocol(protocol, client);
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
                        .routes
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
            .routes
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
                    m.routes.requests.remove(&with_code(code));
                }
            } else {
                for (code, _) in slot.codes.iter().filter_map(OnceLock::get) {
                    m.routes.requests.remove(&with_code(*code));
                }
            }
            m.routes.request_duration.remove(l);
            m.routes.upstream_response.remove(l);
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
                duration: self
                    .metrics
                    .routes
                    .request_duration
                    .get_or_create_owned(&labels),
                upstream: upstream.map(|_| {
                    self.metrics
                        .routes
                        .upstream_response
                        .get_or_create_owned(&labels)
                }),
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
    by_key: FastMap<RouteKey, Arc<RouteMetrics>>,
    /// The table the addresses belong to.
    table: Option<Arc<RouteTable>>,
    /// The Gateway listener tables the addresses belong to.
    gateways: Option<Arc<GatewayTable>>,
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
        if let (Some(table), Some(gateways)) = (&previous.index.table, &previous.index.gateways) {
            if Arc::ptr_eq(table, &snapshot.routes) && Arc::ptr_eq(gateways, &snapshot.gateways) {
                return previous.clone();
            }
        }
        if let Some(updated) = update::update(metrics, snapshot, previous) {
            return updated;
        }
        let routes = &snapshot.routes;
        let mut index = RouteIndex {
            table: Some(routes.clone()),
            gateways: Some(snapshot.gateways.clone()),
            ..RouteIndex::default()
        };
        let mut host_labels: FastMap<&str, Arc<str>> = FastMap::default();
        // Gateway API routes are labelled like Ingress ones: `ingress` is the route's name.
        let actions = || routes.actions().chain(snapshot.gateways.host_actions());
        // One handle per route (20,000 at the 10k-Ingress size), sized once: no growth rehashing
        // every address. Not `by_key`: routes share keys (an Ingress's paths to one Service:
        // 10,000 there), and sized for every route it took 1.2 MB more.
        index.by_action.reserve(actions().count());
        for (host, action) in actions() {
            let service = action.backend.service().clone();
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
            // The key hashed once here (a lookup, then an insert, hashed it twice).
            let handles = match index.by_key.entry(key) {
                Entry::Occupied(known) => known.get().clone(),
                Entry::Vacant(new) => {
                    let key = new.key();
                    let h = previous.index.by_key.get(key).cloned().unwrap_or_else(|| {
                        Arc::new(RouteMetrics::new(
                            metrics.clone(),
                            key.clone(),
                            Some(key.service.clone()),
                        ))
                    });
                    new.insert(h).clone()
                }
            };
            index.by_action.insert(addr_of(action), handles);
        }
        // Routes that left the table take their series with them, and so do Services no
        // route uses any more: a long-running controller does not grow an exposition of dead
        // Ingresses.
        let services: HashSet<&Arc<str>, FastState> =
            index.by_key.keys().map(|k| &k.service).collect();
        let mut gone_services: HashSet<&Arc<str>, FastState> = HashSet::default();
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
