//! The Service duet manages for each Gateway of our classes, its EndpointSlices, and the
//! addresses read back from it: pure builders and readers.
//!
//! The Service lives in the Gateway's namespace, owned by the Gateway (the garbage collector
//! deletes it with the Gateway), `type: LoadBalancer`, `ipFamilyPolicy: PreferDualStack`, one
//! TCP port per valid listener port (named `port-N`) whose `targetPort` is the pod port duet
//! assigned ([`super::ports`]), and with HTTP/3 on, one UDP port per HTTPS listener port (named
//! `udp-N`, the same pod port: duet serves HTTP/3 there). The Gateway's `spec.infrastructure` labels and annotations are
//! copied onto it (duet's own two labels win), and the IP addresses of `spec.addresses` are asked
//! of the load balancer with the `metallb.io/loadBalancerIPs` annotation (MetalLB's, the one
//! bare-metal load balancers read), the Service then having exactly their families in their
//! order. It has no selector: duet's pods live in duet's namespace, which a
//! selector cannot reach, so duet writes the EndpointSlices itself, one per family of the
//! Service, listing duet's ready pods at the assigned ports.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use k8s_openapi::api::core::v1::{Pod, Service, ServicePort, ServiceSpec};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

pub use crate::gateway_api::names::{port_name, ports_held, service_name};
use crate::gateway_api::GatewaySpec;
use crate::gateway_api::GROUP;
use crate::translate::gateway::listeners::requested_addresses;

/// The label on every object duet manages for a Gateway.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// Its value.
pub const MANAGED_BY: &str = "duet-gateway";
/// The label naming the Gateway a Service serves (names longer than a label value are cut).
pub const GATEWAY_LABEL: &str = "gateway.networking.k8s.io/gateway-name";
/// `endpointslice.kubernetes.io/managed-by` of duet's slices.
pub const SLICE_MANAGER: &str = "gateway.duet.dev";

/// The annotation asking the load balancer for given addresses (MetalLB's; comma-separated, at
/// most one per family).
pub const REQUESTED_IPS_ANNOTATION: &str = "metallb.io/loadBalancerIPs";

/// What a Gateway asks of its Service beyond its ports.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Shape {
    /// `spec.infrastructure.labels`.
    pub labels: BTreeMap<String, String>,
    /// `spec.infrastructure.annotations`.
    pub annotations: BTreeMap<String, String>,
    /// The IP addresses of `spec.addresses`, in its order.
    pub addresses: Vec<IpAddr>,
}

impl Shape {
    /// The shape a Gateway spec asks for (addresses refused by
    /// [`requested_addresses`](crate::translate::gateway::listeners::requested_addresses) ask
    /// nothing: such a Gateway is not accepted and gets no Service).
    pub fn of(spec: &GatewaySpec) -> Shape {
        let infra = spec.infrastructure.as_ref();
        Shape {
            labels: infra.and_then(|i| i.labels.clone()).unwrap_or_default(),
            annotations: infra
                .and_then(|i| i.annotations.clone())
                .unwrap_or_default(),
            addresses: requested_addresses(spec).unwrap_or_default(),
        }
    }

    /// The families of the requested addresses, first seen first (`IPv4`, `IPv6`).
    pub fn families(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for ip in &self.addresses {
            let family = family_of(ip);
            if !out.iter().any(|f| f == family) {
                out.push(family.to_owned());
            }
        }
        out
    }
}

/// The Gateway a Service is built for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owner {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// uid.
    pub uid: String,
}

fn owner_reference(owner: &Owner) -> OwnerReference {
    OwnerReference {
        api_version: format!("{GROUP}/v1"),
        kind: "Gateway".to_owned(),
        name: owner.name.clone(),
        uid: owner.uid.clone(),
        controller: Some(true),
        block_owner_deletion: None,
    }
}

fn labels(gateway: &str, shape: &Shape) -> BTreeMap<String, String> {
    let value: String = gateway.chars().take(63).collect();
    let value = value.trim_end_matches(['-', '.']).to_owned();
    let mut labels = shape.labels.clone();
    labels.insert(MANAGED_BY_LABEL.to_owned(), MANAGED_BY.to_owned());
    labels.insert(GATEWAY_LABEL.to_owned(), value);
    labels
}

fn annotations(shape: &Shape) -> Option<BTreeMap<String, String>> {
    let mut out = shape.annotations.clone();
    if !shape.addresses.is_empty() {
        let ips: Vec<String> = shape.addresses.iter().map(IpAddr::to_string).collect();
        out.insert(REQUESTED_IPS_ANNOTATION.to_owned(), ips.join(","));
    }
    (!out.is_empty()).then_some(out)
}

/// `ipFamilyPolicy` and `ipFamilies`: both families when the Gateway asks no address, else
/// exactly the families of the addresses it asks, in their order.
fn family_policy(shape: &Shape) -> (String, Option<Vec<String>>) {
    match shape.families() {
        f if f.is_empty() => ("PreferDualStack".to_owned(), None),
        f if f.len() == 1 => ("SingleStack".to_owned(), Some(f)),
        f => ("RequireDualStack".to_owned(), Some(f)),
    }
}

/// The name of the UDP Service port of a listener port (HTTP/3).
pub fn udp_port_name(listener_port: u16) -> String {
    format!("udp-{listener_port}")
}

/// `(name, protocol, listener port, pod port)` of each Service port: TCP for every listener
/// port, UDP too for those of `udp` (HTTPS listeners with HTTP/3 on).
fn service_ports(
    ports: &BTreeMap<u16, u16>,
    udp: &BTreeSet<u16>,
) -> Vec<(String, &'static str, u16, u16)> {
    let tcp = ports.iter().map(|(&l, &p)| (port_name(l), "TCP", l, p));
    let udp = ports
        .iter()
        .filter(|(l, _)| udp.contains(l))
        .map(|(&l, &p)| (udp_port_name(l), "UDP", l, p));
    tcp.chain(udp).collect()
}

/// The Service for a Gateway with `ports` (listener port -> pod port), those of `udp` over UDP
/// too.
pub fn desired_service(
    owner: &Owner,
    ports: &BTreeMap<u16, u16>,
    udp: &BTreeSet<u16>,
    shape: &Shape,
) -> Service {
    let (policy, families) = family_policy(shape);
    Service {
        metadata: ObjectMeta {
            name: Some(service_name(&owner.name)),
            namespace: Some(owner.namespace.clone()),
            labels: Some(labels(&owner.name, shape)),
            annotations: annotations(shape),
            owner_references: Some(vec![owner_reference(owner)]),
            ..ObjectMeta::default()
        },
        spec: Some(ServiceSpec {
            type_: Some("LoadBalancer".to_owned()),
            ip_family_policy: Some(policy),
            ip_families: families,
            ports: Some(
                service_ports(ports, udp)
                    .into_iter()
                    .map(|(name, protocol, listener, pod)| ServicePort {
                        name: Some(name),
                        protocol: Some(protocol.to_owned()),
                        port: i32::from(listener),
                        target_port: Some(IntOrString::Int(i32::from(pod))),
                        ..ServicePort::default()
                    })
                    .collect(),
            ),
            ..ServiceSpec::default()
        }),
        status: None,
    }
}

/// listener port -> pod port as a Service holds them (ports named `port-N` with a numeric
/// `targetPort`; anything else is ignored).
pub fn held_ports(service: &Service) -> BTreeMap<u16, u16> {
    let ports = service.spec.as_ref().and_then(|s| s.ports.as_deref());
    ports_held(ports.unwrap_or_default())
}

/// The Service's families in its order (`IPv4`, `IPv6`).
pub fn families(service: &Service) -> Vec<String> {
    let spec = service.spec.as_ref();
    spec.and_then(|s| s.ip_families.clone()).unwrap_or_default()
}

fn family_of(ip: &IpAddr) -> &'static str {
    if ip.is_ipv4() {
        "IPv4"
    } else {
        "IPv6"
    }
}

/// A Gateway status address: `IPAddress` or `Hostname`, and its value.
pub type Address = (&'static str, String);

/// The Service's addresses for the Gateway's status: its load-balancer ingress entries (IPs in
/// the Service's family order, then host names), else its cluster IPs (in their order, which is
/// the Service's family order).
pub fn addresses(service: &Service) -> Vec<Address> {
    let order = families(service);
    let rank = |ip: &IpAddr| {
        order
            .iter()
            .position(|f| f == family_of(ip))
            .unwrap_or(order.len())
    };
    let mut ips = load_balancer_ips(service);
    ips.sort_by_key(|ip| rank(ip));
    let status = service
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref());
    let ingress = status
        .and_then(|lb| lb.ingress.as_deref())
        .unwrap_or_default();
    let hosts = ingress.iter().filter_map(|i| i.hostname.clone());
    let mut out: Vec<Address> = ips.iter().map(|ip| ("IPAddress", ip.to_string())).collect();
    out.extend(hosts.map(|h| ("Hostname", h)));
    if !out.is_empty() {
        return out;
    }
    let spec = service.spec.as_ref();
    let cluster_ips = spec.and_then(|s| s.cluster_ips.clone()).unwrap_or_default();
    cluster_ips
        .into_iter()
        .filter(|ip| ip.parse::<IpAddr>().is_ok())
        .map(|ip| ("IPAddress", ip))
        .collect()
}

/// The IP addresses the load balancer gave the Service (`status.loadBalancer.ingress`).
pub fn load_balancer_ips(service: &Service) -> Vec<IpAddr> {
    let status = service
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref());
    let ingress = status
        .and_then(|lb| lb.ingress.as_deref())
        .unwrap_or_default();
    ingress
        .iter()
        .filter_map(|i| i.ip.as_deref()?.parse().ok())
        .collect()
}

/// Whether a pod serves: Ready, not terminating.
fn pod_ready(pod: &Pod) -> bool {
    let terminating = pod.metadata.deletion_timestamp.is_some();
    let conditions = pod.status.as_ref().and_then(|s| s.conditions.as_ref());
    let ready = conditions
        .into_iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    ready && !terminating
}

/// The EndpointSlice of one family (`IPv4`, `IPv6`) of a Gateway's Service: duet's ready pods'
/// addresses of that family, at the assigned pod ports. Sorted by pod name, so it only changes
/// when the pods do. The ports of `udp` over UDP too, as in the Service.
pub fn desired_slice(
    service: &Service,
    family: &str,
    (ports, udp): (&BTreeMap<u16, u16>, &BTreeSet<u16>),
    pods: &[Pod],
) -> Option<EndpointSlice> {
    let name = service.metadata.name.clone()?;
    let namespace = service.metadata.namespace.clone()?;
    let uid = service.metadata.uid.clone()?;
    let mut endpoints: Vec<Endpoint> = pods
        .iter()
        .filter(|p| pod_ready(p))
        .filter_map(|pod| {
            let ips = pod.status.as_ref()?.pod_ips.clone()?;
            let ip = ips.into_iter().find(|ip| {
                ip.ip
                    .parse::<IpAddr>()
                    .is_ok_and(|a| family_of(&a) == family)
            })?;
            Some(Endpoint {
                addresses: vec![ip.ip],
                conditions: Some(EndpointConditions {
                    ready: Some(true),
                    serving: Some(true),
                    terminating: Some(false),
                }),
                target_ref: Some(k8s_openapi::api::core::v1::ObjectReference {
                    kind: Some("Pod".to_owned()),
                    namespace: pod.metadata.namespace.clone(),
                    name: pod.metadata.name.clone(),
                    uid: pod.metadata.uid.clone(),
                    ..Default::default()
                }),
                ..Endpoint::default()
            })
        })
        .collect();
    endpoints.sort_by(|a, b| a.addresses.cmp(&b.addresses));
    let mut labels = service.metadata.labels.clone().unwrap_or_default();
    labels.insert("kubernetes.io/service-name".to_owned(), name.clone());
    labels.insert(
        "endpointslice.kubernetes.io/managed-by".to_owned(),
        SLICE_MANAGER.to_owned(),
    );
    Some(EndpointSlice {
        metadata: ObjectMeta {
            name: Some(format!("{name}-{}", family.to_ascii_lowercase())),
            namespace: Some(namespace),
            labels: Some(labels),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".to_owned(),
                kind: "Service".to_owned(),
                name,
                uid,
                controller: Some(true),
                block_owner_deletion: None,
            }]),
            ..ObjectMeta::default()
        },
        address_type: family.to_owned(),
        endpoints: Some(endpoints),
        ports: Some(
            service_ports(ports, udp)
                .into_iter()
                .map(|(name, protocol, _, pod)| EndpointPort {
                    name: Some(name),
                    port: Some(i32::from(pod)),
                    protocol: Some(protocol.to_owned()),
                    app_protocol: None,
                })
                .collect(),
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{LoadBalancerIngress, LoadBalancerStatus, ServiceStatus};

    fn owner(name: &str) -> Owner {
        Owner {
            namespace: "ns".to_owned(),
            name: name.to_owned(),
            uid: "u1".to_owned(),
        }
    }

    #[test]
    fn names_fit_a_service_and_ports_round_trip() {
        assert_eq!(service_name("web"), "duet-web");
        let long = "a.".repeat(100) + "b";
        let name = service_name(&long);
        assert!(crate::gateway::config::is_dns_label(&name), "{name}");
        assert_ne!(name, service_name(&("a.".repeat(100) + "c")));
        let ports = BTreeMap::from([(80, 20000), (443, 20001)]);
        let service = desired_service(&owner("web"), &ports, &BTreeSet::new(), &Shape::default());
        assert_eq!(held_ports(&service), ports);
        let spec = service.spec.as_ref().unwrap();
        assert_eq!(spec.ip_family_policy.as_deref(), Some("PreferDualStack"));
        assert_eq!(spec.type_.as_deref(), Some("LoadBalancer"));
        assert!(spec.selector.is_none());
        let owners = service.metadata.owner_references.unwrap();
        assert_eq!(
            (owners[0].kind.as_str(), owners[0].uid.as_str()),
            ("Gateway", "u1")
        );
    }

    #[test]
    fn https_listener_ports_are_listed_over_udp_too_with_http3() {
        let ports = BTreeMap::from([(80, 20000), (443, 20001)]);
        let service = desired_service(
            &owner("web"),
            &ports,
            &BTreeSet::from([443]),
            &Shape::default(),
        );
        let listed: Vec<(String, String, i32, Option<IntOrString>)> = service
            .spec
            .as_ref()
            .and_then(|s| s.ports.clone())
            .unwrap()
            .into_iter()
            .map(|p| (p.name.unwrap(), p.protocol.unwrap(), p.port, p.target_port))
            .collect();
        let port = |name: &str, proto: &str, port: i32, pod: i32| {
            (
                name.to_owned(),
                proto.to_owned(),
                port,
                Some(IntOrString::Int(pod)),
            )
        };
        assert_eq!(
            listed,
            [
                port("port-80", "TCP", 80, 20000),
                port("port-443", "TCP", 443, 20001),
                port("udp-443", "UDP", 443, 20001),
            ]
        );
        // The UDP port is no listener port of its own.
        assert_eq!(held_ports(&service), ports);
        let mut service = service;
        service.metadata.uid = Some("s1".to_owned());
        let slice = desired_slice(&service, "IPv4", (&ports, &BTreeSet::from([443])), &[]).unwrap();
        let slice_ports: Vec<(String, String, i32)> = slice
            .ports
            .unwrap()
            .into_iter()
            .map(|p| (p.name.unwrap(), p.protocol.unwrap(), p.port.unwrap()))
            .collect();
        assert_eq!(
            slice_ports[2],
            ("udp-443".to_owned(), "UDP".to_owned(), 20001),
            "{slice_ports:?}"
        );
        assert_eq!(slice_ports.len(), 3);
    }

    #[test]
    fn infrastructure_metadata_and_requested_addresses_shape_the_service() {
        let spec: GatewaySpec = serde_saphyr::from_str(
            "gatewayClassName: duet\n\
             infrastructure: {labels: {team: a, app.kubernetes.io/managed-by: x}, annotations: {k: v}}\n\
             addresses: [{value: 'fd00:10:250::9'}, {type: IPAddress, value: 10.250.0.9}]\n\
             listeners: [{name: a, port: 80, protocol: HTTP}]",
        )
        .unwrap();
        let service = desired_service(
            &owner("web"),
            &BTreeMap::from([(80, 20000)]),
            &BTreeSet::new(),
            &Shape::of(&spec),
        );
        let labels = service.metadata.labels.unwrap();
        assert_eq!(labels["team"], "a");
        assert_eq!(
            labels[MANAGED_BY_LABEL], MANAGED_BY,
            "duet's own labels win"
        );
        assert_eq!(labels[GATEWAY_LABEL], "web");
        let annotations = service.metadata.annotations.unwrap();
        assert_eq!(annotations["k"], "v");
        assert_eq!(
            annotations[REQUESTED_IPS_ANNOTATION],
            "fd00:10:250::9,10.250.0.9"
        );
        let spec_out = service.spec.unwrap();
        assert_eq!(
            spec_out.ip_family_policy.as_deref(),
            Some("RequireDualStack")
        );
        assert_eq!(
            spec_out.ip_families.unwrap(),
            ["IPv6", "IPv4"],
            "the spec's order"
        );
        let one: GatewaySpec = serde_saphyr::from_str(
            "gatewayClassName: duet\naddresses: [{value: 10.250.0.9}, {type: IPAddress}]\n\
             listeners: [{name: a, port: 80, protocol: HTTP}]",
        )
        .unwrap();
        let service = desired_service(
            &owner("web"),
            &BTreeMap::from([(80, 20000)]),
            &BTreeSet::new(),
            &Shape::of(&one),
        );
        let spec_out = service.spec.unwrap();
        assert_eq!(spec_out.ip_family_policy.as_deref(), Some("SingleStack"));
        assert_eq!(spec_out.ip_families.unwrap(), ["IPv4"]);
        let none = desired_service(
            &owner("web"),
            &BTreeMap::from([(80, 20000)]),
            &BTreeSet::new(),
            &Shape::default(),
        );
        assert!(none.metadata.annotations.is_none());
        assert!(none.spec.unwrap().ip_families.is_none());
    }

    #[test]
    fn addresses_follow_the_family_order_and_fall_back_to_cluster_ips() {
        let mut service = desired_service(
            &owner("web"),
            &BTreeMap::from([(80, 20000)]),
            &BTreeSet::new(),
            &Shape::default(),
        );
        let spec = service.spec.as_mut().unwrap();
        spec.ip_families = Some(vec!["IPv6".to_owned(), "IPv4".to_owned()]);
        spec.cluster_ips = Some(vec!["fd00:10:96::5".to_owned(), "10.96.0.5".to_owned()]);
        assert_eq!(
            addresses(&service),
            [
                ("IPAddress", "fd00:10:96::5".to_owned()),
                ("IPAddress", "10.96.0.5".to_owned())
            ]
        );
        let entry = |ip: Option<&str>, host: Option<&str>| LoadBalancerIngress {
            ip: ip.map(str::to_owned),
            hostname: host.map(str::to_owned),
            ..Default::default()
        };
        service.status = Some(ServiceStatus {
            load_balancer: Some(LoadBalancerStatus {
                ingress: Some(vec![
                    entry(Some("10.250.0.1"), None),
                    entry(None, Some("lb.example")),
                    entry(Some("fd00:10:250::1"), None),
                ]),
            }),
            ..Default::default()
        });
        assert_eq!(
            addresses(&service),
            [
                ("IPAddress", "fd00:10:250::1".to_owned()),
                ("IPAddress", "10.250.0.1".to_owned()),
                ("Hostname", "lb.example".to_owned())
            ]
        );
    }
}
