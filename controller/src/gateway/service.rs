//! The Service duet manages for each Gateway of our classes, its EndpointSlices, and the
//! addresses read back from it: pure builders and readers.
//!
//! The Service lives in the Gateway's namespace, owned by the Gateway (the garbage collector
//! deletes it with the Gateway), `type: LoadBalancer`, `ipFamilyPolicy: PreferDualStack`, one
//! TCP port per valid listener port (named `port-N`) whose `targetPort` is the pod port duet
//! assigned ([`super::ports`]). It has no selector: duet's pods live in duet's namespace, which a
//! selector cannot reach, so duet writes the EndpointSlices itself, one per family of the
//! Service, listing duet's ready pods at the assigned ports.

use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::{Pod, Service, ServicePort, ServiceSpec};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

pub use crate::gateway_api::names::{port_name, ports_held, service_name};
use crate::gateway_api::GROUP;

/// The label on every object duet manages for a Gateway.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// Its value.
pub const MANAGED_BY: &str = "duet-gateway";
/// The label naming the Gateway a Service serves (names longer than a label value are cut).
pub const GATEWAY_LABEL: &str = "gateway.networking.k8s.io/gateway-name";
/// `endpointslice.kubernetes.io/managed-by` of duet's slices.
pub const SLICE_MANAGER: &str = "gateway.duet.dev";

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

fn labels(gateway: &str) -> BTreeMap<String, String> {
    let value: String = gateway.chars().take(63).collect();
    let value = value.trim_end_matches(['-', '.']).to_owned();
    BTreeMap::from([
        (MANAGED_BY_LABEL.to_owned(), MANAGED_BY.to_owned()),
        (GATEWAY_LABEL.to_owned(), value),
    ])
}

/// The Service for a Gateway with `ports` (listener port -> pod port).
pub fn desired_service(owner: &Owner, ports: &BTreeMap<u16, u16>) -> Service {
    Service {
        metadata: ObjectMeta {
            name: Some(service_name(&owner.name)),
            namespace: Some(owner.namespace.clone()),
            labels: Some(labels(&owner.name)),
            owner_references: Some(vec![owner_reference(owner)]),
            ..ObjectMeta::default()
        },
        spec: Some(ServiceSpec {
            type_: Some("LoadBalancer".to_owned()),
            ip_family_policy: Some("PreferDualStack".to_owned()),
            ports: Some(
                ports
                    .iter()
                    .map(|(&listener, &pod)| ServicePort {
                        name: Some(port_name(listener)),
                        protocol: Some("TCP".to_owned()),
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
    let ingress = service
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.clone())
        .unwrap_or_default();
    let mut ips: Vec<IpAddr> = ingress
        .iter()
        .filter_map(|i| i.ip.as_deref()?.parse().ok())
        .collect();
    ips.sort_by_key(|ip| rank(ip));
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
/// when the pods do.
pub fn desired_slice(
    service: &Service,
    family: &str,
    ports: &BTreeMap<u16, u16>,
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
            ports
                .iter()
                .map(|(&listener, &pod)| EndpointPort {
                    name: Some(port_name(listener)),
                    port: Some(i32::from(pod)),
                    protocol: Some("TCP".to_owned()),
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
        let service = desired_service(&owner("web"), &ports);
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
    fn addresses_follow_the_family_order_and_fall_back_to_cluster_ips() {
        let mut service = desired_service(&owner("web"), &BTreeMap::from([(80, 20000)]));
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
