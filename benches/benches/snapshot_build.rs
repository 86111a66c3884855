//! Snapshot build from 5,000 Ingresses and 50,000 endpoints (1,000 Services of 25 dual-stack
//! pods, each in an IPv4 and an IPv6 EndpointSlice), whole and endpoint-only.

use std::hint::black_box;

use controller::stored::StoredIngress;
use controller::translate::{self, build_backends, plan_routes, Config, Inputs};
use criterion::{criterion_group, criterion_main, Criterion};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::IngressClass;
use serde_json::json;

const SERVICES: usize = 1_000;
const PODS: usize = 25;
const INGRESSES: usize = 5_000;

struct World {
    ingresses: Vec<StoredIngress>,
    classes: Vec<IngressClass>,
    services: Vec<Service>,
    slices: Vec<EndpointSlice>,
}

fn from<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
    serde_json::from_value(v).expect("bench fixture is a valid object")
}

fn world() -> World {
    let classes = vec![from(json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "IngressClass",
        "metadata": {"name": "duet"}, "spec": {"controller": "duet.dev/ingress-controller"}
    }))];
    let mut services = Vec::new();
    let mut slices = Vec::new();
    for s in 0..SERVICES {
        let ns = format!("ns-{}", s % 20);
        let name = format!("svc-{s}");
        services.push(from(json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"ports": [{"name": "http", "port": 80, "targetPort": 8080}]}
        })));
        for (family, addr) in [
            (
                "IPv4",
                Box::new(|p: usize| format!("10.{}.{}.{}", s / 250, s % 250, p + 1))
                    as Box<dyn Fn(usize) -> String>,
            ),
            (
                "IPv6",
                Box::new(|p: usize| format!("fd00::{s:x}:{:x}", p + 1)),
            ),
        ] {
            let endpoints: Vec<_> = (0..PODS)
                .map(|p| json!({
                    "addresses": [addr(p)],
                    "conditions": {"ready": true},
                    "targetRef": {"kind": "Pod", "namespace": ns, "name": format!("{name}-{p}"), "uid": format!("uid-{s}-{p}")}
                }))
                .collect();
            slices.push(from(json!({
                "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "metadata": {"name": format!("{name}-{family}"), "namespace": ns,
                             "labels": {"kubernetes.io/service-name": name}},
                "addressType": family,
                "ports": [{"name": "http", "port": 8080}],
                "endpoints": endpoints
            })));
        }
    }
    let ingresses = (0..INGRESSES)
        .map(|i| {
            let s = i % SERVICES;
            from(json!({
                "apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
                "metadata": {"name": format!("ing-{i}"), "namespace": format!("ns-{}", s % 20),
                             "creationTimestamp": "2026-01-01T00:00:00Z"},
                "spec": {"ingressClassName": "duet", "rules": [{
                    "host": format!("host-{i}.example.com"),
                    "http": {"paths": [
                        {"path": "/", "pathType": "Prefix",
                         "backend": {"service": {"name": format!("svc-{s}"), "port": {"name": "http"}}}},
                        {"path": "/api/v1", "pathType": "Exact",
                         "backend": {"service": {"name": format!("svc-{s}"), "port": {"number": 80}}}}
                    ]}
                }]}
            }))
        })
        .collect();
    World {
        ingresses,
        classes,
        services,
        slices,
    }
}

fn build(c: &mut Criterion) {
    let w = world();
    let inputs = Inputs {
        ingresses: w.ingresses.iter().collect(),
        ingress_classes: w.classes.iter().collect(),
        services: w.services.iter().collect(),
        endpoint_slices: w.slices.iter().collect(),
        secrets: Vec::new(),
        names: None,
        ..Inputs::default()
    };
    let config = Config::default();
    let (snapshot, diagnostics) = translate::build(&inputs, &config);
    assert!(diagnostics.is_empty(), "{diagnostics:?}");
    assert_eq!(snapshot.routes.exact.len(), INGRESSES);
    let endpoints: usize = snapshot
        .backends
        .values()
        .map(|b| b.targets.len())
        .sum::<usize>();
    assert_eq!(
        endpoints,
        2 * SERVICES * PODS,
        "dual-stack pods counted once per Service port"
    );

    let mut g = c.benchmark_group("snapshot_build/5k_ingresses_50k_endpoints");
    g.sample_size(10);
    g.bench_function("full", |b| {
        b.iter(|| translate::build(black_box(&inputs), &config))
    });
    let plan = plan_routes(&inputs, &config);
    g.bench_function("routes_only", |b| {
        b.iter(|| plan_routes(black_box(&inputs), &config))
    });
    let previous = snapshot.backends.clone();
    g.bench_function("endpoints_only_reusing_unchanged", |b| {
        b.iter(|| build_backends(black_box(&plan), &inputs, &config, &previous))
    });
    g.finish();
}

criterion_group!(benches, build);
criterion_main!(benches);
