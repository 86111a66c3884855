//! Metrics holding one series of every family, for the metrics reference: the registry exposes a
//! family only once it has a series, so the reference reads names, types, help and labels from
//! these.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use prometheus_client::registry::Registry;

use super::{LiveMetrics, Metrics, Observation, TunnelEnd};
use crate::table::{
    Backend, Family, HostRules, PathMatch, PathRule, RouteAction, RouteTable, Snapshot, Target,
    TargetId,
};

/// A snapshot with one route (`shop.example.com/` of Ingress ns/ing) to one dual-stack pod.
fn snapshot() -> Arc<Snapshot> {
    let action = RouteAction::to("shop/api:80");
    let host = "shop.example.com";
    let rules = vec![PathRule::new(PathMatch::prefix("/"), action)];
    let mut routes = RouteTable::default();
    routes
        .exact
        .insert(host.into(), HostRules::new(host, rules).0);
    let addrs =
        ["10.244.1.12:8080", "[fd00:10:244:1::12]:8080"].map(|a| a.parse::<SocketAddr>().unwrap());
    let backend = Backend {
        id: "shop/api:80".parse().unwrap(),
        targets: vec![Target::with_addrs(TargetId("a".into()), addrs, None)].into(),
        lb: Default::default(),
        protocol: Default::default(),
    };
    let mut snapshot = Snapshot {
        version: 1,
        routes: Arc::new(routes),
        ..Snapshot::default()
    };
    snapshot
        .backends
        .insert(backend.id.clone(), Arc::new(backend));
    Arc::new(snapshot)
}

impl Metrics {
    /// Registers the families in `registry` and gives each one series (example label values).
    pub fn specimen(registry: &mut Registry) -> Arc<Metrics> {
        let metrics = Metrics::register(registry);
        let snapshot = snapshot();
        let live = LiveMetrics::build(&metrics, &snapshot, &LiveMetrics::default());
        let action = snapshot
            .routes
            .find("shop.example.com", "/")
            .unwrap()
            .action;
        let route = live.route(action).unwrap();
        route.observe(&Observation {
            method: 0,
            code: 200,
            client: Family::V6,
            upstream: Some(Family::V6),
            duration: Duration::from_millis(2),
            upstream_time: Some(Duration::from_millis(1)),
        });
        route.connect_failed(Family::V4);
        route.fell_back(Family::V6);
        route.ejected(Family::V4);
        let listener = metrics.listener("[::]:8443".parse().unwrap());
        drop((listener.open(Family::V6), listener.parked(Family::V6)));
        listener.refused(Family::V6);
        metrics.snapshot_applied(&snapshot, false);
        metrics.set_backend_targets(&snapshot);
        metrics.set_certificate_expiry("shop/shop-tls", SystemTime::now());
        metrics.tunnel_opened(Family::V4);
        metrics.tunnel_left(Family::V4);
        metrics.tunnel_closed(TunnelEnd::Closed);
        metrics.passthrough_connection(Family::V4, Some(Family::V4));
        metrics
    }
}
