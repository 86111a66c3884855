//! The slim form Services are stored in ([`StoredService`]): a k8s-openapi `Service` is about
//! 900 bytes before its strings (`ServiceSpec` alone has 20 optional fields), and the index keeps
//! one per Service of the cluster. A [`StoredService`] keeps what translation reads
//! ([`ServiceView`]): name, namespace and resource version (a [`StoredMeta`], 72 bytes where
//! the API's `ObjectMeta` is 360), owner references (the Gateway controller's Services are
//! recognised by them), the type, `externalName`, the cluster IPs and the ports (name, number,
//! `targetPort`, protocol, `appProtocol`). It is decoded straight from the API's JSON or YAML
//! (`#[serde(from = "Service")]`) by the manifest source, and converted from the API type by the
//! Service watcher, so nothing else of a Service is kept.

use k8s_openapi::api::core::v1::{Service, ServicePort};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use serde::Deserialize;

use crate::compact::StoredMeta;

/// What translation reads of a Service, from the API type or from a [`StoredService`].
pub trait ServiceView {
    /// `metadata.name`.
    fn name(&self) -> Option<&str>;
    /// `metadata.namespace`.
    fn namespace(&self) -> Option<&str>;
    /// `metadata.ownerReferences` (none when unset).
    fn owner_references(&self) -> &[OwnerReference];
    /// `spec.type`.
    fn service_type(&self) -> Option<&str>;
    /// `spec.externalName`.
    fn external_name(&self) -> Option<&str>;
    /// `spec.ports` (none when unset).
    fn ports(&self) -> &[ServicePort];
    /// `spec.clusterIPs` when it lists any, else `spec.clusterIP`, as written.
    fn cluster_ips(&self) -> Vec<&str>;
}

impl ServiceView for Service {
    fn name(&self) -> Option<&str> {
        self.metadata.name.as_deref()
    }

    fn namespace(&self) -> Option<&str> {
        self.metadata.namespace.as_deref()
    }

    fn owner_references(&self) -> &[OwnerReference] {
        self.metadata
            .owner_references
            .as_deref()
            .unwrap_or_default()
    }

    fn service_type(&self) -> Option<&str> {
        self.spec.as_ref()?.type_.as_deref()
    }

    fn external_name(&self) -> Option<&str> {
        self.spec.as_ref()?.external_name.as_deref()
    }

    fn ports(&self) -> &[ServicePort] {
        let ports = self.spec.as_ref().and_then(|s| s.ports.as_deref());
        ports.unwrap_or_default()
    }

    fn cluster_ips(&self) -> Vec<&str> {
        let Some(spec) = self.spec.as_ref() else {
            return Vec::new();
        };
        match spec.cluster_ips.as_deref() {
            Some(listed) if !listed.is_empty() => listed.iter().map(String::as_str).collect(),
            _ => spec.cluster_ip.as_deref().into_iter().collect(),
        }
    }
}

/// A stored Service (see the module documentation).
#[derive(Clone, Debug, Deserialize)]
#[serde(from = "Service")]
pub struct StoredService {
    /// Name, namespace and resource version.
    pub metadata: StoredMeta,
    /// `metadata.ownerReferences`.
    owner_references: Box<[OwnerReference]>,
    service_type: Option<Box<str>>,
    external_name: Option<Box<str>>,
    /// `spec.clusterIPs` when it lists any, else `spec.clusterIP`.
    cluster_ips: Box<[Box<str>]>,
    /// Without `nodePort`, which nothing reads.
    ports: Box<[ServicePort]>,
}

impl From<Service> for StoredService {
    fn from(service: Service) -> StoredService {
        let meta = service.metadata;
        let spec = service.spec.unwrap_or_default();
        let listed = spec.cluster_ips.filter(|ips| !ips.is_empty());
        let cluster_ips = listed.unwrap_or_else(|| spec.cluster_ip.into_iter().collect());
        let ports = spec
            .ports
            .unwrap_or_default()
            .into_iter()
            .map(|p| ServicePort {
                node_port: None,
                ..p
            });
        StoredService {
            metadata: StoredMeta::of(meta.name, meta.namespace, meta.resource_version),
            owner_references: meta.owner_references.unwrap_or_default().into(),
            service_type: spec.type_.map(Into::into),
            external_name: spec.external_name.map(Into::into),
            cluster_ips: cluster_ips.into_iter().map(Into::into).collect(),
            ports: ports.collect(),
        }
    }
}

impl PartialEq for StoredService {
    /// Equal in all translation reads: the resource version is not compared. Every write of a
    /// Service bumps it, a change of its labels, annotations or status too (none of which is
    /// kept), and each referenced Service that compared unequal ran the route phase again (at
    /// the 10k-Ingress size 80 to 150 ms of build to publish nothing new).
    fn eq(&self, other: &StoredService) -> bool {
        // Destructured: a field added to the struct must be added here too.
        let StoredService {
            metadata,
            owner_references,
            service_type,
            external_name,
            cluster_ips,
            ports,
        } = self;
        (&metadata.name, &metadata.namespace) == (&other.metadata.name, &other.metadata.namespace)
            && *owner_references == other.owner_references
            && *service_type == other.service_type
            && *external_name == other.external_name
            && *cluster_ips == other.cluster_ips
            && *ports == other.ports
    }
}

impl ServiceView for StoredService {
    fn name(&self) -> Option<&str> {
        self.metadata.name.as_deref()
    }

    fn namespace(&self) -> Option<&str> {
        self.metadata.namespace.as_deref()
    }

    fn owner_references(&self) -> &[OwnerReference] {
        &self.owner_references
    }

    fn service_type(&self) -> Option<&str> {
        self.service_type.as_deref()
    }

    fn external_name(&self) -> Option<&str> {
        self.external_name.as_deref()
    }

    fn ports(&self) -> &[ServicePort] {
        &self.ports
    }

    fn cluster_ips(&self) -> Vec<&str> {
        self.cluster_ips.iter().map(|ip| &**ip).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    const FULL: &str = r#"
apiVersion: v1
kind: Service
metadata:
  name: web
  namespace: shop
  resourceVersion: "9"
  uid: 6b1c1d2e-0000-4000-8000-000000000001
  labels: {app: web}
  annotations: {note: dropped}
  ownerReferences: [{apiVersion: gateway.networking.k8s.io/v1, kind: Gateway, name: gw, uid: g-1}]
spec:
  type: ClusterIP
  clusterIP: 10.96.0.7
  clusterIPs: [10.96.0.7, "fd00:96::7"]
  ipFamilies: [IPv4, IPv6]
  ipFamilyPolicy: RequireDualStack
  selector: {app: web}
  sessionAffinity: None
  ports:
    - {name: http, port: 80, targetPort: http, protocol: TCP, appProtocol: kubernetes.io/h2c, nodePort: 30080}
    - {name: admin, port: 9000, targetPort: 9001}
status: {loadBalancer: {ingress: [{ip: 192.0.2.1}]}}
"#;

    fn both(yaml: &str) -> (Service, StoredService) {
        let api: Service = serde_saphyr::from_str(yaml).expect("a Service");
        let stored: StoredService = serde_saphyr::from_str(yaml).expect("a stored Service");
        (api, stored)
    }

    fn read(view: &dyn ServiceView) -> impl PartialEq + std::fmt::Debug + '_ {
        let ports: Vec<_> = view
            .ports()
            .iter()
            .map(|p| {
                (
                    &p.name,
                    p.port,
                    &p.target_port,
                    &p.protocol,
                    &p.app_protocol,
                )
            })
            .collect();
        (
            (view.name(), view.namespace()),
            view.owner_references(),
            view.service_type(),
            view.external_name(),
            view.cluster_ips(),
            ports,
        )
    }

    #[test]
    fn a_stored_service_reads_as_the_api_object() {
        let (api, stored) = both(FULL);
        assert_eq!(read(&stored), read(&api));
        assert_eq!(stored.cluster_ips(), ["10.96.0.7", "fd00:96::7"]);
        assert_eq!(
            stored.ports()[0].app_protocol.as_deref(),
            Some("kubernetes.io/h2c")
        );
        // Only what translation reads is kept: the metadata's name, namespace and resource
        // version (no labels, annotations or uid: `StoredMeta` has no room for them).
        assert_eq!(
            stored.metadata,
            StoredMeta {
                name: Some("web".into()),
                namespace: Some("shop".into()),
                resource_version: Some("9".into()),
            }
        );
        assert_eq!(stored.owner_references()[0].uid, "g-1");
        assert_eq!(stored.ports()[0].node_port, None);
    }

    #[test]
    fn cluster_ip_is_the_fallback_of_cluster_ips() {
        let (api, stored) = both(&FULL.replace("  clusterIPs: [10.96.0.7, \"fd00:96::7\"]\n", ""));
        assert_eq!(stored.cluster_ips(), ["10.96.0.7"]);
        assert_eq!(api.cluster_ips(), ["10.96.0.7"]);
        let (api, stored) = both(&FULL.replace("[10.96.0.7, \"fd00:96::7\"]", "[]"));
        assert_eq!(
            (api.cluster_ips(), stored.cluster_ips()),
            (vec!["10.96.0.7"], vec!["10.96.0.7"])
        );
        let (api, stored) = both("metadata: {name: bare}\n");
        assert_eq!(read(&stored), read(&api));
        assert!(stored.cluster_ips().is_empty() && stored.ports().is_empty());
    }

    #[test]
    fn hostile_services_decode_or_are_refused_without_panic() {
        // Types the API declares are enforced as k8s-openapi does: a refusal, never a panic.
        for bad in [
            "spec: {ports: [{port: eighty}]}",
            "spec: {ports: {name: http}}",
            "spec: {clusterIPs: 10.0.0.1}",
            "spec: {type: [ExternalName]}",
            "metadata: {name: [x]}",
        ] {
            assert!(
                serde_saphyr::from_str::<StoredService>(bad).is_err(),
                "{bad}"
            );
            assert!(serde_saphyr::from_str::<Service>(bad).is_err(), "{bad}");
        }
        // Values are data: odd ones decode as written and translation judges them.
        let odd = "metadata: {name: x}\nspec: {type: ExternalName, externalName: \"not a name!\", clusterIPs: [\"\", bogus], ports: [{port: -1}]}\n";
        let (api, stored) = both(odd);
        assert_eq!(read(&stored), read(&api));
        assert_eq!(stored.external_name(), Some("not a name!"));
        assert_eq!(stored.cluster_ips(), ["", "bogus"]);
    }

    #[test]
    fn a_stored_service_is_small() {
        // Three strings of metadata and five boxed fields; the API type adds about 600 bytes of
        // spec and status to its 360 of `ObjectMeta`.
        let (stored, api) = (
            std::mem::size_of::<StoredService>(),
            std::mem::size_of::<Service>(),
        );
        assert!(
            stored <= std::mem::size_of::<ObjectMeta>() + 64,
            "{stored} bytes, the API type {api}"
        );
        assert!(stored <= 128, "{stored} bytes");
    }
}
