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

//!
//! One module per family group: [`routes`] (requests, latencies, upstream failures by route and
//! Service), [`protocols`] (requests by HTTP version and client family), [`backends`] (targets
//! by kind), [`connections`], [`snapshot`] (version, certificate expiry), [`tunnels`],
//! [`passthrough`] and [`rate_limit`] (zone evictions); the access-log drop counter is here.

mod backends;
mod connections;
mod mirrors;
mod passthrough;
mod protocols;
mod rate_limit;
mod routes;
mod services;
mod snapshot;
mod specimen;
mod tunnels;

use std::sync::Arc;

use http::Method;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family as Series;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

pub use connections::{ConnectionMetrics, OpenConnection};
pub use mirrors::MirrorOutcome;
pub use protocols::protocol_index;
pub use rate_limit::EvictionBound;
pub use routes::{LiveMetrics, Observation, RouteMetrics};
pub use tunnels::TunnelEnd;

use crate::table::Family;

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

type HistogramSeries<L> = Series<L, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    Histogram::new(LATENCY_BUCKETS)
}

/// The labels of every family [`Metrics::register`] registers, by the family's name as exposed
/// (with its unit; without `_total`). A test holds it to the label sets the families write; the
/// metrics reference is rendered from the registry and this table.
pub const LABELS: [(&str, &[&str]); 22] = [
    ("duet_requests", &ROUTE_LABELS_WITH_CODE),
    ("duet_request_duration_seconds", &ROUTE_LABELS),
    ("duet_upstream_response_seconds", &ROUTE_LABELS),
    ("duet_upstream_connect_failures", &["service", "family"]),
    ("duet_family_fallbacks", &["service", "from", "to"]),
    ("duet_target_family_ejections", &["service", "family"]),
    ("duet_requests_by_protocol", &["protocol", "client_family"]),
    ("duet_backend_targets", &["namespace", "service", "kind"]),
    ("duet_connections_active", &["listener", "family"]),
    ("duet_connections_parked", &["listener", "family"]),
    ("duet_connections", &["listener", "family"]),
    ("duet_connections_refused", &["listener", "family"]),
    ("duet_snapshot_version", &[]),
    ("duet_snapshot_applied_timestamp_seconds", &[]),
    ("duet_tls_certificate_expiry_timestamp_seconds", &["secret"]),
    ("duet_access_log_dropped", &[]),
    ("duet_tunnels_active", &["client_family"]),
    ("duet_tunnels", &["client_family"]),
    ("duet_tunnels_closed", &["reason"]),
    (
        "duet_passthrough_connections",
        &["client_family", "upstream_family"],
    ),
    ("duet_rate_limit_evictions", &["client_family", "bound"]),
    ("duet_request_mirrors", &["outcome"]),
];

const ROUTE_LABELS: [&str; 7] = [
    "namespace",
    "ingress",
    "service",
    "host",
    "method",
    "client_family",
    "upstream_family",
];

const ROUTE_LABELS_WITH_CODE: [&str; 8] = [
    "namespace",
    "ingress",
    "service",
    "host",
    "method",
    "code",
    "client_family",
    "upstream_family",
];

/// The dataplane's metric families, registered once at start.
#[derive(Clone, Debug)]
pub struct Metrics {
    routes: routes::RouteFamilies,
    protocols: protocols::ProtocolFamilies,
    backends: backends::BackendFamilies,
    connections: connections::ConnectionFamilies,
    snapshot: snapshot::SnapshotFamilies,
    access_log_dropped: Counter,
    tunnels: tunnels::TunnelFamilies,
    passthrough: passthrough::PassthroughFamilies,
    rate_limit: rate_limit::RateLimitFamilies,
    mirrors: mirrors::MirrorFamilies,
}

impl Metrics {
    /// Creates the families and registers them (names as exposed are in the README), in the
    /// order `/metrics` shows them.
    pub fn register(registry: &mut Registry) -> Arc<Metrics> {
        let routes = routes::RouteFamilies::register(registry);
        let protocols = protocols::ProtocolFamilies::register(registry);
        let backends = backends::BackendFamilies::register(registry);
        let connections = connections::ConnectionFamilies::register(registry);
        let snapshot = snapshot::SnapshotFamilies::register(registry);
        let access_log_dropped = Counter::default();
        registry.register(
            "duet_access_log_dropped",
            "Access-log lines dropped because the log writer could not keep up",
            access_log_dropped.clone(),
        );
        let tunnels = tunnels::TunnelFamilies::register(registry);
        let passthrough = passthrough::PassthroughFamilies::register(registry);
        let rate_limit = rate_limit::RateLimitFamilies::register(registry);
        let mirrors = mirrors::MirrorFamilies::register(registry);
        Arc::new(Metrics {
            routes,
            protocols,
            backends,
            connections,
            snapshot,
            access_log_dropped,
            tunnels,
            passthrough,
            rate_limit,
            mirrors,
        })
    }

    /// Families registered nowhere (for tests and tools that expose no metrics).
    pub fn unregistered() -> Arc<Metrics> {
        Metrics::register(&mut Registry::default())
    }

    /// Counts one access-log line dropped.
    pub fn access_log_dropped(&self) {
        self.access_log_dropped.inc();
    }

    /// Access-log lines dropped so far.
    pub fn dropped_lines(&self) -> u64 {
        self.access_log_dropped.get()
    }
}

/// The text exposition of `registry` (for tests).
#[cfg(test)]
pub(crate) fn exposition(registry: &Registry) -> String {
    let mut out = String::new();
    prometheus_client::encoding::prometheus_text::encode(&mut out, registry).unwrap();
    out
}

/// The lines of [`exposition`], sorted (for tests comparing series whatever their order).
#[cfg(test)]
pub(crate) fn sorted_exposition(registry: &Registry) -> Vec<String> {
    let mut lines: Vec<String> = exposition(registry).lines().map(str::to_owned).collect();
    lines.sort();
    lines
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::{
        BackendId, HostRules, Origin, PathMatch, PathRule, RouteAction, RouteTable, Snapshot,
    };
    use std::time::Duration;

    use super::exposition as encode;

    fn action(ns: &str, ingress: &str, backend: &str) -> RouteAction {
        RouteAction {
            origin: Origin {
                kind: Default::default(),
                namespace: ns.into(),
                name: ingress.into(),
                created: 0,
            }
            .into(),
            ..RouteAction::to(backend)
        }
    }

    fn table() -> Arc<RouteTable> {
        let mut t = RouteTable::default();
        let rule = |path: &str, a: RouteAction| PathRule {
            matcher: PathMatch::prefix(path),
            when: None,
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
    fn service_counters_are_shared_by_routes_and_kept_across_rebuilds() {
        let mut registry = Registry::default();
        let metrics = Metrics::register(&mut registry);
        let failures = |n: u64| {
            format!(r#"duet_upstream_connect_failures_total{{service="api",family="ipv4"}} {n}"#)
        };
        let snapshot = Snapshot {
            version: 1,
            routes: table(),
            ..Snapshot::default()
        };
        let live = LiveMetrics::build(&metrics, &snapshot, &LiveMetrics::default());
        // Two routes with different labels to one Service count into its series.
        let a = snapshot.routes.find("a.test", "/").unwrap().action;
        let b = snapshot.routes.find("x.b.test", "/").unwrap().action;
        live.route(a).unwrap().connect_failed(Family::V4);
        live.route(b).unwrap().connect_failed(Family::V4);
        live.route(b).unwrap().fell_back(Family::V6);
        assert!(encode(&registry).contains(&failures(2)));

        // A table where a.test is gone and a new host routes to api: the new route's handles
        // are made now, and count on from the Service's counts.
        let mut routes = (*table()).clone();
        routes.exact.clear();
        routes.exact.insert(
            "c.test".into(),
            HostRules::new(
                "c.test",
                vec![PathRule {
                    matcher: PathMatch::prefix("/"),
                    when: None,
                    action: action("shop", "other", "shop/api:80"),
                }],
            )
            .0,
        );
        let next = Snapshot {
            version: 2,
            routes: Arc::new(routes),
            ..Snapshot::default()
        };
        let live = LiveMetrics::build(&metrics, &next, &live);
        let c = next.routes.find("c.test", "/").unwrap().action;
        live.route(c).unwrap().connect_failed(Family::V4);
        live.route(c).unwrap().ejected(Family::V6);
        let text = encode(&registry);
        assert!(text.contains(&failures(3)), "{text}");
        assert!(
            text.contains(r#"duet_family_fallbacks_total{service="api",from="ipv4",to="ipv6"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"duet_target_family_ejections_total{service="api",family="ipv6"} 1"#),
            "{text}"
        );
        assert!(!text.contains(r#"host="a.test""#), "{text}");

        // Handles built from scratch for the same snapshot are the same series.
        let fresh = LiveMetrics::build(&metrics, &next, &LiveMetrics::default());
        fresh.route(c).unwrap().connect_failed(Family::V4);
        assert!(encode(&registry).contains(&failures(4)));
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
        registry.register("t", "t", metrics.routes.requests.clone());
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
            id: "shop/api:80".parse::<BackendId>().unwrap(),
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
        let snapshot = Arc::new(snapshot);
        metrics.snapshot_applied(&snapshot, false);
        metrics.set_backend_targets(&snapshot);
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
    fn requests_by_protocol_and_client_family() {
        let mut registry = Registry::default();
        let metrics = Metrics::register(&mut registry);
        metrics.request_by_protocol(protocol_index(http::Version::HTTP_3), Family::V6);
        metrics.request_by_protocol(protocol_index(http::Version::HTTP_3), Family::V6);
        metrics.request_by_protocol(protocol_index(http::Version::HTTP_2), Family::V4);
        metrics.request_by_protocol(protocol_index(http::Version::HTTP_10), Family::V4);
        let text = encode(&registry);
        for line in [
            r#"duet_requests_by_protocol_total{protocol="HTTP/3",client_family="ipv6"} 2"#,
            r#"duet_requests_by_protocol_total{protocol="HTTP/3",client_family="ipv4"} 0"#,
            r#"duet_requests_by_protocol_total{protocol="HTTP/2",client_family="ipv4"} 1"#,
            r#"duet_requests_by_protocol_total{protocol="HTTP/1.1",client_family="ipv4"} 0"#,
            r#"duet_requests_by_protocol_total{protocol="HTTP/1.0",client_family="ipv4"} 1"#,
        ] {
            assert!(text.contains(line), "{line}: {text}");
        }
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

    /// Every series of `text` as (family, label names), the family being the `# TYPE` name the
    /// series belongs to; histogram buckets' `le` left out.
    fn series_labels(text: &str) -> Vec<(String, Vec<String>)> {
        let mut family = String::new();
        let mut out = Vec::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                family = rest.split(' ').next().unwrap().to_owned();
            } else if let Some((_, labels)) = line.split_once('{') {
                let labels = labels.rsplit_once('}').unwrap().0;
                let names = labels
                    .split(',')
                    .filter_map(|l| l.split_once('=').map(|(n, _)| n.to_owned()))
                    .filter(|n| n != "le")
                    .collect();
                out.push((family.clone(), names));
            } else if !line.starts_with('#') && !line.is_empty() {
                out.push((family.clone(), Vec::new()));
            }
        }
        out
    }

    #[test]
    fn labels_table_matches_every_family_registered_and_written() {
        let mut registry = Registry::default();
        let _metrics = Metrics::specimen(&mut registry);
        // OpenMetrics: family names without `_total`, as LABELS has them.
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        let written = series_labels(&text);
        let families: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .map(|l| l.split(' ').next().unwrap())
            .collect();
        let table: Vec<&str> = LABELS.iter().map(|(name, _)| *name).collect();
        assert_eq!(
            families, table,
            "LABELS (metrics/mod.rs) or Metrics::specimen lacks a family"
        );
        // Every family registered, with or without a series (the registry's descriptors).
        let registered = format!("{registry:?}");
        let names: Vec<&str> = registered
            .split("Descriptor { name: \"")
            .skip(1)
            .map(|rest| &rest[..rest.find('"').unwrap()])
            .collect();
        assert_eq!(names.len(), LABELS.len(), "{registered}");
        for name in names {
            let known = table
                .iter()
                .any(|t| *t == name || *t == format!("{name}_seconds"));
            assert!(
                known,
                "{name}: not in LABELS (metrics/mod.rs) and Metrics::specimen"
            );
        }
        for (family, labels) in LABELS {
            for (_, names) in written.iter().filter(|(f, _)| f == family) {
                assert_eq!(names, labels, "{family}: LABELS (metrics/mod.rs) differs");
            }
        }
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
