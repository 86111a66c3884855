//! The per-request cost of metrics and the access log: what the proxy adds to one request
//! (start an exchange, match a route, upstream begin/done, status, body bytes, then recording on
//! drop), over a table of 10,000 hosts and 50,000 paths with its handles made at apply time.

use std::hint::black_box;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion};
use dataplane::access_log::AccessLog;
use dataplane::listen::ConnInfo;
use dataplane::metrics::Metrics;
use dataplane::observe::Telemetry;
use dataplane::{Family, ProxyConfig, Runtime, Snapshot};
use prometheus_client::registry::Registry;

fn runtime(access_log: bool) -> Arc<Runtime> {
    let mut registry = Registry::default();
    let metrics = Metrics::register(&mut registry);
    let log = access_log.then(|| {
        AccessLog::spawn(
            std::io::sink(),
            dataplane::access_log::QUEUE_BYTES,
            metrics.clone(),
        )
        .expect("log thread")
    });
    let runtime = Runtime::with_telemetry(
        ProxyConfig::default(),
        Telemetry::new(registry, metrics, log),
    );
    runtime.apply(Arc::new(Snapshot {
        version: 1,
        routes: Arc::new(benches::route_table(10_000, 5)),
        ..Snapshot::default()
    }));
    runtime
}

fn request(c: &mut Criterion) {
    let req = http::Request::builder()
        .uri("/api/v4/items/42")
        .header("host", "host-7342.example.com")
        .body(())
        .unwrap();
    let conn = ConnInfo::new(
        "[::1]:50000".parse().unwrap(),
        "[::1]:8080".parse().unwrap(),
    );
    let upstream = "[fd00::7]:8080".parse().unwrap();
    let mut g = c.benchmark_group("request_metrics/10k_hosts_50k_paths");
    for (name, log) in [("metrics_only", false), ("metrics_and_access_log", true)] {
        let runtime = runtime(log);
        let telemetry = runtime.telemetry();
        g.bench_function(name, |b| {
            b.iter(|| {
                let live = runtime.load();
                let matched = live
                    .snapshot
                    .routes
                    .find("host-7342.example.com", black_box(req.uri().path()))
                    .expect("route");
                let mut exchange = telemetry.exchange(black_box(&req), &conn);
                exchange.matched(&live.metrics, matched.action);
                exchange.upstream_begin();
                exchange.upstream_done(Family::V6, upstream, Family::V6);
                exchange.set_status(200);
                exchange.add_bytes(100);
                drop(exchange);
            })
        });
        if let Some(log) = telemetry.access_log() {
            log.flush(std::time::Duration::from_secs(10));
        }
    }
    // The same route lookup alone, for scale.
    let runtime = runtime(false);
    g.bench_function("route_lookup_alone", |b| {
        b.iter(|| {
            let live = runtime.load();
            live.snapshot
                .routes
                .find("host-7342.example.com", black_box(req.uri().path()))
                .map(|m| m.action.origin.created)
        })
    });
    g.finish();
}

criterion_group!(benches, request);
criterion_main!(benches);
