//! Properties of translation: the route table does not depend on the order of the input objects
//! (nor of the rules inside an Ingress), the route phase split over threads or planned host by
//! host after a Service change makes the plan of the whole route phase, and EndpointSlice joining
//! gives exactly one target per pod with each family's address and port from its own slice.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;

use controller::object::NsName;
use controller::stored::StoredIngress;
use controller::translate::{self, incremental, Config, Inputs};
use dataplane::{Target, TargetId};
use k8s_openapi::api::core::v1::{ObjectReference, Service, ServicePort, ServiceSpec};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::api::networking::v1::{
    HTTPIngressPath, HTTPIngressRuleValue, Ingress, IngressBackend, IngressRule,
    IngressServiceBackend, IngressSpec, ServiceBackendPort,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use proptest::prelude::*;

const HOSTS: &[Option<&str>] = &[
    None,
    Some("a.test"),
    Some("*.test"),
    Some("B.Test"),
    Some("x.a.test"),
];
const PATHS: &[&str] = &["/", "/x", "/x/y", "/xy", "/z/"];
const TYPES: &[&str] = &["Exact", "Prefix", "ImplementationSpecific", ""];
const SERVICES: &[&str] = &["web", "api", "ghost"];
const PORTS: &[(Option<i32>, Option<&str>)] =
    &[(Some(80), None), (None, Some("http")), (Some(81), None)];

#[derive(Clone, Debug)]
struct RuleSpec {
    host: usize,
    path: usize,
    path_type: usize,
    service: usize,
    port: usize,
}

#[derive(Clone, Debug)]
struct IngressSpecGen {
    namespace: &'static str,
    created: i64,
    rules: Vec<RuleSpec>,
    default_backend: Option<(usize, usize)>,
}

fn rule() -> impl Strategy<Value = RuleSpec> {
    (
        0..HOSTS.len(),
        0..PATHS.len(),
        0..TYPES.len(),
        0..SERVICES.len(),
        0..PORTS.len(),
    )
        .prop_map(|(host, path, path_type, service, port)| RuleSpec {
            host,
            path,
            path_type,
            service,
            port,
        })
}

fn ingress_spec() -> impl Strategy<Value = IngressSpecGen> {
    (
        prop_oneof![Just("a"), Just("b")],
        0i64..3,
        prop::collection::vec(rule(), 0..8),
        prop::option::of((0..SERVICES.len(), 0..PORTS.len())),
    )
        .prop_map(|(namespace, created, rules, default_backend)| {
            // Within one Ingress, the first of two rules with the same match wins by position
            // (an intended tie-break), so keep one rule per match to make order irrelevant.
            let mut seen = BTreeSet::new();
            let rules = rules
                .into_iter()
                .filter(|r| {
                    let host = HOSTS[r.host].map(str::to_ascii_lowercase);
                    let exact = TYPES[r.path_type] == "Exact";
                    let path = if exact {
                        PATHS[r.path].to_owned()
                    } else {
                        PATHS[r.path].trim_end_matches('/').to_owned()
                    };
                    seen.insert((host, exact, path))
                })
                .collect();
            IngressSpecGen {
                namespace,
                created,
                rules,
                default_backend,
            }
        })
}

fn backend(service: usize, port: usize) -> IngressBackend {
    let (number, name) = PORTS[port];
    IngressBackend {
        resource: None,
        service: Some(IngressServiceBackend {
            name: SERVICES[service].to_owned(),
            port: Some(ServiceBackendPort {
                number,
                name: name.map(str::to_owned),
            }),
        }),
    }
}

fn make_ingress(index: usize, spec: &IngressSpecGen, rule_order: &[usize]) -> StoredIngress {
    let rules = rule_order
        .iter()
        .map(|&i| {
            let r = &spec.rules[i];
            IngressRule {
                host: HOSTS[r.host].map(str::to_owned),
                http: Some(HTTPIngressRuleValue {
                    paths: vec![HTTPIngressPath {
                        backend: backend(r.service, r.port),
                        path: Some(PATHS[r.path].to_owned()),
                        path_type: TYPES[r.path_type].to_owned(),
                    }],
                }),
            }
        })
        .collect();
    StoredIngress::from(Ingress {
        metadata: ObjectMeta {
            name: Some(format!("ing-{index}")),
            namespace: Some(spec.namespace.to_owned()),
            creation_timestamp: Some(Time(
                Timestamp::from_second(1_700_000_000 + spec.created).unwrap(),
            )),
            ..Default::default()
        },
        spec: Some(IngressSpec {
            ingress_class_name: Some("duet".to_owned()),
            default_backend: spec.default_backend.map(|(s, p)| backend(s, p)),
            rules: Some(rules),
            tls: None,
        }),
        status: None,
    })
}

fn service(namespace: &str, name: &str) -> Service {
    Service {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(namespace.to_owned()),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            ports: Some(vec![ServicePort {
                name: Some("http".to_owned()),
                port: 80,
                ..Default::default()
            }]),
            ..Default::default()
        }),
        status: None,
    }
}

/// A deterministic permutation from a seed (Fisher-Yates over a small LCG).
fn permutation(len: usize, mut seed: u64) -> Vec<usize> {
    let mut order: Vec<usize> = (0..len).collect();
    for i in (1..len).rev() {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let j = (seed >> 33) as usize % (i + 1);
        order.swap(i, j);
    }
    order
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn route_table_is_independent_of_input_order(
        specs in prop::collection::vec(ingress_spec(), 1..7),
        seed in any::<u64>(),
    ) {
        let services: Vec<Service> = ["a", "b"]
            .iter()
            .flat_map(|ns| [service(ns, "web"), service(ns, "api")])
            .collect();
        let build = |ingress_order: &[usize], service_order: &[usize], rule_seed: u64| {
            let ingresses: Vec<StoredIngress> = ingress_order
                .iter()
                .map(|&i| {
                    let order = permutation(specs[i].rules.len(), rule_seed ^ i as u64);
                    make_ingress(i, &specs[i], &order)
                })
                .collect();
            let inputs = Inputs {
                ingresses: ingresses.iter().collect(),
                services: service_order.iter().map(|&i| &services[i]).collect(),
                ..Inputs::default()
            };
            translate::build(&inputs, &Config::default())
        };
        let identity: Vec<usize> = (0..specs.len()).collect();
        let (first, first_diagnostics) =
            build(&identity, &(0..services.len()).collect::<Vec<_>>(), 0);
        let (second, second_diagnostics) = build(
            &permutation(specs.len(), seed),
            &permutation(services.len(), seed.rotate_left(17)),
            seed.rotate_left(31),
        );
        prop_assert_eq!(&*first.routes, &*second.routes);
        prop_assert_eq!(&first.backends, &second.backends);
        prop_assert_eq!(first_diagnostics, second_diagnostics);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// The route phase split over threads by groups of Ingresses sharing no host makes the plan
    /// one thread makes (`translate_incremental` holds a fixture with TLS, canaries and the rest
    /// to it).
    #[test]
    fn route_phase_split_over_threads_equals_one_thread(
        specs in prop::collection::vec(ingress_spec(), 1..9),
        parts in 1usize..5,
    ) {
        let services: Vec<Service> = ["a", "b"]
            .iter()
            .flat_map(|ns| [service(ns, "web"), service(ns, "api")])
            .collect();
        let ingresses: Vec<StoredIngress> = specs
            .iter()
            .enumerate()
            .map(|(i, spec)| make_ingress(i, spec, &(0..spec.rules.len()).collect::<Vec<_>>()))
            .collect();
        let inputs = Inputs {
            ingresses: ingresses.iter().collect(),
            services: services.iter().collect(),
            ..Inputs::default()
        };
        let config = Config::default();
        // Every Ingress oldest first on one thread; `parts` 1 is grouped on one core.
        let one = translate::plan_routes_in_parts(&inputs, &config, 1, usize::MAX);
        let split = translate::plan_routes_in_parts(&inputs, &config, parts, 1);
        same_plan(&split, &one)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// A change of one Service that Ingresses read, planned as a change of those Ingresses
    /// (`translate::incremental::changed_ingresses`, then the route phase over them and the
    /// Ingresses sharing their hosts), makes the plan the full route phase makes.
    #[test]
    fn a_service_change_planned_by_host_equals_the_full_route_phase(
        specs in prop::collection::vec(ingress_spec(), 1..9),
        namespace in prop_oneof![Just("a"), Just("b")],
        name in 0..SERVICES.len(),
        edit in 0u8..3,
    ) {
        let before: Vec<Service> = ["a", "b"]
            .iter()
            .flat_map(|ns| [service(ns, "web"), service(ns, "api")])
            .collect();
        let name = SERVICES[name];
        let is_it = |s: &Service| {
            s.metadata.namespace.as_deref() == Some(namespace) && s.metadata.name.as_deref() == Some(name)
        };
        let mut after: Vec<Service> = before.iter().filter(|s| !is_it(s)).cloned().collect();
        let mut edited = service(namespace, name);
        let port = &mut edited.spec.as_mut().unwrap().ports.as_mut().unwrap()[0];
        match edit {
            // Deleted (or "ghost", still missing).
            0 => {}
            // Renumbered: the routes naming port 80 lose it, those naming "http" follow it.
            1 => {
                port.port = 81;
                after.push(edited);
            }
            // Unnamed: the routes naming "http" lose it (and "ghost" is created).
            _ => {
                port.name = None;
                after.push(edited);
            }
        }
        let ingresses: Vec<StoredIngress> = specs
            .iter()
            .enumerate()
            .map(|(i, spec)| make_ingress(i, spec, &(0..spec.rules.len()).collect::<Vec<_>>()))
            .collect();
        fn inputs<'a>(ingresses: &'a [StoredIngress], services: &'a [Service]) -> Inputs<'a> {
            Inputs {
                ingresses: ingresses.iter().collect(),
                services: services.iter().collect(),
                ..Inputs::default()
            }
        }
        let config = Config::default();
        let previous = translate::plan_routes(&inputs(&ingresses, &before), &config);
        let full = translate::plan_routes(&inputs(&ingresses, &after), &config);
        let key = NsName::new(namespace, name);
        let none = BTreeSet::new();
        // The index reports a change of a Service the routes read (referenced, existing or not).
        prop_assume!(previous.references.services.contains(&key));
        let changed = incremental::changed_ingresses(&previous, &none, &BTreeSet::from([key]), &none);
        let changed = changed.expect("only Ingresses read the Services here");
        if let Some(plan) = incremental::plan_ingress_change(&previous, &mut inputs(&ingresses, &after), &config, &changed) {
            same_plan(&plan, &full)?;
        }
    }
}

/// Every part of the route plan `got` equals the one of `want`.
fn same_plan(got: &translate::RoutePlan, want: &translate::RoutePlan) -> Result<(), TestCaseError> {
    prop_assert_eq!(&*got.table, &*want.table);
    prop_assert_eq!(&got.backends, &want.backends);
    prop_assert_eq!(&got.references, &want.references);
    prop_assert_eq!(&got.diagnostics, &want.diagnostics);
    prop_assert_eq!(&got.annotations, &want.annotations);
    prop_assert_eq!(&*got.certs, &*want.certs);
    prop_assert_eq!(&*got.footprints, &*want.footprints);
    Ok(())
}

/// One pod of the joining model.
#[derive(Clone, Debug)]
struct Pod {
    /// (slice index, ready, terminating) of its IPv4 endpoint, if any.
    v4: Option<(usize, Option<bool>, Option<bool>)>,
    /// The same for IPv6.
    v6: Option<(usize, Option<bool>, Option<bool>)>,
    /// 0: targetRef with uid, 1: targetRef without uid (kind/namespace/name), 2: no targetRef.
    reference: u8,
}

fn endpoint_gen(
    slices: usize,
) -> impl Strategy<Value = Option<(usize, Option<bool>, Option<bool>)>> {
    prop::option::of((
        0..slices,
        prop::option::of(any::<bool>()),
        prop::option::of(prop::bool::weighted(0.2)),
    ))
}

fn pod_gen() -> impl Strategy<Value = Pod> {
    (endpoint_gen(3), endpoint_gen(3), 0u8..3).prop_map(|(v4, v6, reference)| Pod {
        v4,
        v6,
        reference,
    })
}

fn serving(e: &(usize, Option<bool>, Option<bool>)) -> bool {
    e.1.unwrap_or(true) && !e.2.unwrap_or(false)
}

fn slice_port(family: u8, slice: usize) -> u16 {
    8000 + u16::from(family) * 100 + slice as u16
}

fn make_slices(pods: &[Pod], seed: u64) -> Vec<EndpointSlice> {
    let mut slices = Vec::new();
    for (family, address_type) in [(4u8, "IPv4"), (6u8, "IPv6")] {
        for s in 0..3 {
            let mut endpoints = Vec::new();
            for (i, pod) in pods.iter().enumerate() {
                let endpoint = if family == 4 { &pod.v4 } else { &pod.v6 };
                let Some((slice, ready, terminating)) = endpoint else {
                    continue;
                };
                if *slice != s {
                    continue;
                }
                let address = if family == 4 {
                    format!("10.0.{s}.{i}")
                } else {
                    format!("fd00::{s}:{i}")
                };
                let target_ref = match pod.reference {
                    0 => Some(ObjectReference {
                        kind: Some("Pod".to_owned()),
                        namespace: Some("default".to_owned()),
                        name: Some(format!("pod-{i}")),
                        uid: Some(format!("uid-{i}")),
                        ..Default::default()
                    }),
                    1 => Some(ObjectReference {
                        kind: Some("Pod".to_owned()),
                        name: Some(format!("pod-{i}")),
                        ..Default::default()
                    }),
                    _ => None,
                };
                endpoints.push(Endpoint {
                    addresses: vec![address],
                    conditions: Some(EndpointConditions {
                        ready: *ready,
                        serving: None,
                        terminating: *terminating,
                    }),
                    target_ref,
                    ..Default::default()
                });
            }
            let order = permutation(endpoints.len(), seed ^ (u64::from(family) << 8) ^ s as u64);
            let endpoints = order.into_iter().map(|i| endpoints[i].clone()).collect();
            let http = EndpointPort {
                name: Some("http".to_owned()),
                port: Some(i32::from(slice_port(family, s))),
                ..Default::default()
            };
            let metrics = EndpointPort {
                name: Some("metrics".to_owned()),
                port: Some(9090),
                ..Default::default()
            };
            // The port list order differs per slice; matching is by name.
            let ports = if s % 2 == 0 {
                vec![metrics, http]
            } else {
                vec![http, metrics]
            };
            slices.push(EndpointSlice {
                metadata: ObjectMeta {
                    name: Some(format!("web-{address_type}-{s}").to_lowercase()),
                    namespace: Some("default".to_owned()),
                    ..Default::default()
                },
                address_type: address_type.to_owned(),
                endpoints: Some(endpoints),
                ports: Some(ports),
            });
        }
    }
    slices
}

/// What joining must produce, computed independently.
fn expected(pods: &[Pod]) -> Vec<Target> {
    let mut out: BTreeMap<String, Target> = BTreeMap::new();
    for (i, pod) in pods.iter().enumerate() {
        let v4 = pod.v4.filter(serving).map(|(s, _, _)| {
            SocketAddr::new(format!("10.0.{s}.{i}").parse().unwrap(), slice_port(4, s))
        });
        let v6 = pod.v6.filter(serving).map(|(s, _, _)| {
            SocketAddr::new(format!("fd00::{s}:{i}").parse().unwrap(), slice_port(6, s))
        });
        let mut add = |id: String, v4: Option<SocketAddr>, v6: Option<SocketAddr>| {
            let addrs = v4.into_iter().chain(v6);
            out.insert(
                id.clone(),
                Target::with_addrs(TargetId(id.into()), addrs, None),
            );
        };
        match pod.reference {
            0 | 1 => {
                if v4.is_some() || v6.is_some() {
                    let id = if pod.reference == 0 {
                        format!("uid-{i}")
                    } else {
                        format!("Pod/default/pod-{i}")
                    };
                    add(id, v4, v6);
                }
            }
            _ => {
                if let Some(a) = v4 {
                    add(a.to_string(), Some(a), None);
                }
                if let Some(a) = v6 {
                    add(a.to_string(), None, Some(a));
                }
            }
        }
    }
    out.into_values().collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn joining_gives_one_target_per_pod(
        pods in prop::collection::vec(pod_gen(), 0..10),
        seed in any::<u64>(),
    ) {
        let slices = make_slices(&pods, seed);
        let order = permutation(slices.len(), seed.rotate_left(7));
        let refs: Vec<&EndpointSlice> = order.iter().map(|&i| &slices[i]).collect();
        let (targets, diagnostics) = translate::join_targets(&refs, "http", false);
        prop_assert!(diagnostics.is_empty(), "{:?}", diagnostics);
        prop_assert_eq!(targets, expected(&pods));
    }
}

fn slice(
    name: &str,
    address_type: &str,
    port_name: Option<&str>,
    port: i32,
    endpoints: Vec<Endpoint>,
) -> EndpointSlice {
    EndpointSlice {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some("default".to_owned()),
            ..Default::default()
        },
        address_type: address_type.to_owned(),
        endpoints: Some(endpoints),
        ports: Some(vec![EndpointPort {
            name: port_name.map(str::to_owned),
            port: Some(port),
            ..Default::default()
        }]),
    }
}

fn pod_endpoint(address: &str, uid: &str) -> Endpoint {
    Endpoint {
        addresses: vec![address.to_owned()],
        target_ref: Some(ObjectReference {
            kind: Some("Pod".to_owned()),
            name: Some(uid.to_owned()),
            uid: Some(uid.to_owned()),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[test]
fn unnamed_service_port_matches_unnamed_slice_ports_only() {
    let unnamed = slice(
        "a",
        "IPv4",
        None,
        8080,
        vec![pod_endpoint("10.0.0.1", "p1")],
    );
    let named = slice(
        "b",
        "IPv6",
        Some("http"),
        8081,
        vec![pod_endpoint("fd00::1", "p1")],
    );
    let (targets, diagnostics) = translate::join_targets(&[&unnamed, &named], "", false);
    assert_eq!(targets.len(), 1);
    assert_eq!(targets[0].v4, Some("10.0.0.1:8080".parse().unwrap()));
    assert_eq!(targets[0].v6, None, "the IPv6 slice has no unnamed port");
    assert_eq!(diagnostics.len(), 1);
    assert_eq!(
        diagnostics[0].reason,
        translate::Reason::UnknownEndpointPort
    );
    assert_eq!(diagnostics[0].object.to_string(), "EndpointSlice default/b");
}

/// What kube-controller-manager writes for a family without endpoints (seen on the real control
/// plane: a dual-stack Service whose pods have only IPv6): `endpoints: []` and `ports: null`.
/// Nothing to route and no configuration problem.
#[test]
fn an_empty_slice_without_ports_is_no_problem() {
    for endpoints in [None, Some(Vec::new())] {
        let mut empty = slice("e", "IPv4", Some("http"), 8080, Vec::new());
        empty.endpoints = endpoints;
        empty.ports = None;
        let six = slice(
            "s",
            "IPv6",
            Some("http"),
            8080,
            vec![pod_endpoint("fd00::1", "p1")],
        );
        let (targets, diagnostics) = translate::join_targets(&[&empty, &six], "http", false);
        assert_eq!(diagnostics, vec![], "no diagnostic for an empty slice");
        assert_eq!(targets.len(), 1);
        assert_eq!(targets[0].v6, Some("[fd00::1]:8080".parse().unwrap()));
    }
}

#[test]
fn fqdn_and_wrong_family_addresses_are_diagnosed_and_skipped() {
    let fqdn = slice(
        "f",
        "FQDN",
        None,
        80,
        vec![pod_endpoint("example.org", "p1")],
    );
    let mixed = slice(
        "m",
        "IPv4",
        None,
        80,
        vec![
            pod_endpoint("fd00::1", "p2"),
            pod_endpoint("10.0.0.3", "p3"),
        ],
    );
    let (targets, diagnostics) = translate::join_targets(&[&fqdn, &mixed], "", false);
    let ids: Vec<String> = targets.iter().map(|t| t.id.to_string()).collect();
    assert_eq!(ids, ["p3"]);
    let reasons: Vec<_> = diagnostics.iter().map(|d| d.reason).collect();
    assert_eq!(
        reasons,
        [
            translate::Reason::UnsupportedAddressType,
            translate::Reason::InvalidEndpoint
        ]
    );
}

#[test]
fn forbidden_endpoint_addresses_are_dropped_over_both_families() {
    let v4 = slice(
        "v4",
        "IPv4",
        None,
        80,
        vec![
            pod_endpoint("169.254.169.254", "metadata"),
            pod_endpoint("127.0.0.1", "lo4"),
            pod_endpoint("10.0.0.1", "p1"),
        ],
    );
    let v6 = slice(
        "v6",
        "IPv6",
        None,
        80,
        vec![
            pod_endpoint("fe80::1", "linklocal"),
            pod_endpoint("::ffff:127.0.0.1", "mapped"),
            pod_endpoint("::1", "lo6"),
            pod_endpoint("ff02::1", "multicast"),
            pod_endpoint("fd00::1", "p1"),
        ],
    );
    let ids =
        |targets: &[Target]| -> Vec<String> { targets.iter().map(|t| t.id.to_string()).collect() };
    // Kubernetes mode: only the pod's routable addresses serve.
    let (targets, diagnostics) = translate::join_targets(&[&v4, &v6], "", false);
    assert_eq!(ids(&targets), ["p1"]);
    assert_eq!(targets[0].v4, Some("10.0.0.1:80".parse().unwrap()));
    assert_eq!(targets[0].v6, Some("[fd00::1]:80".parse().unwrap()));
    // An IPv4-mapped address in an IPv6 slice is not of the slice's family: refused as invalid.
    let invalid: Vec<&translate::Diagnostic> = diagnostics
        .iter()
        .filter(|d| d.reason == translate::Reason::InvalidEndpoint)
        .collect();
    assert_eq!(invalid.len(), 1, "{diagnostics:#?}");
    assert!(invalid[0].message.contains("::ffff:127.0.0.1"));
    let dropped: Vec<String> = diagnostics
        .iter()
        .filter(|d| d.reason == translate::Reason::ForbiddenEndpointAddress)
        .map(|d| format!("{} {}", d.object.name, d.message))
        .collect();
    assert_eq!(dropped.len(), 5, "{dropped:#?}");
    for (slice, address, class) in [
        ("v4", "169.254.169.254", "link-local"),
        ("v4", "127.0.0.1", "loopback"),
        ("v6", "fe80::1", "link-local"),
        ("v6", "::1", "loopback"),
        ("v6", "ff02::1", "multicast"),
    ] {
        let want = format!("{slice} address {address} is {class};");
        assert!(
            dropped.iter().any(|d| d.starts_with(&want)),
            "{want}: {dropped:#?}"
        );
    }
    // Loopback allowed (--manifests mode, or the test-only flag): link-local and multicast are not.
    let (targets, diagnostics) = translate::join_targets(&[&v4, &v6], "", true);
    assert_eq!(ids(&targets), ["lo4", "lo6", "p1"]);
    let forbidden = diagnostics
        .iter()
        .filter(|d| d.reason == translate::Reason::ForbiddenEndpointAddress)
        .count();
    assert_eq!(forbidden, 3, "{diagnostics:#?}");
}
