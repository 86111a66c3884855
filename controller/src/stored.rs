//! The slim form Services are stored in ([`StoredService`]): a k8s-openapi `Service` is about
//! 900 bytes before its strings (`ServiceSpec` alone has 20 optional fields), and the index keeps
//! one per Service of the cluster. A [`StoredService`] keeps what translation reads
//! ([`ServiceView`]): name, namespace and resource version (a [`StoredMeta`], 72 bytes where
//! the API's `ObjectMeta` is 360), owner references (the Gateway controller's Services are
//! recognised by them), the type, `externalName`, the cluster IPs and the ports (name, number,
//! `targetPort`, protocol, `appProtocol`). It is decoded straight from the API's JSON or YAML
//! (`#[serde(from = "Service")]`) by the manifest source, and converted from the API type by the
//! Service watcher, so nothing else of a Service is kept.
//!
//! Ingresses likewise ([`StoredIngress`]): the spec and status as the API gives them, and of the
//! metadata only what translation, the status writer and Events read (name, namespace, resource
//! version, uid, creation time, annotations). A k8s-openapi `ObjectMeta` is 360 bytes whatever
//! it holds, and exported manifests carry labels (a B-tree node of 544 bytes for one label),
//! finalizers, owner references and a generation on every Ingress.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ObjectReference, Service, ServicePort};
use k8s_openapi::api::networking::v1::{Ingress, IngressSpec, IngressStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
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

/// A stored Ingress (see the module documentation): its fields are named as the API type's, so
/// that what reads one reads the other.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(from = "Ingress")]
pub struct StoredIngress {
    /// What is kept of `metadata`.
    pub metadata: IngressMeta,
    /// `spec`.
    pub spec: Option<IngressSpec>,
    /// `status` (the status writer compares it with the addresses it would write).
    pub status: Option<IngressStatus>,
}

/// What a [`StoredIngress`] keeps of its metadata.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct IngressMeta {
    /// `metadata.name`.
    pub name: Option<String>,
    /// `metadata.namespace`.
    pub namespace: Option<String>,
    /// `metadata.resourceVersion` (the status writer's).
    pub resource_version: Option<String>,
    /// `metadata.uid` (Events' reference).
    pub uid: Option<String>,
    /// `metadata.creationTimestamp` (the older Ingress wins a conflict).
    pub creation_timestamp: Option<Time>,
    /// `metadata.annotations`.
    pub annotations: Option<Annotations>,
}

/// An object's annotations, by name in one boxed slice: 16 bytes and 32 an annotation, where a
/// `BTreeMap` takes a node of 544 bytes for the first (6 MB at 10,000 Ingresses of one
/// annotation each).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Annotations(Box<[(Box<str>, Box<str>)]>);

impl Annotations {
    /// The value of the annotation `name`.
    pub fn get(&self, name: &str) -> Option<&str> {
        let at = self.0.binary_search_by(|(k, _)| (**k).cmp(name)).ok()?;
        Some(&self.0[at].1)
    }

    /// Every annotation, by name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (&**k, &**v))
    }

    /// How many there are.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl From<BTreeMap<String, String>> for Annotations {
    fn from(map: BTreeMap<String, String>) -> Annotations {
        Annotations(map.into_iter().map(|(k, v)| (k.into(), v.into())).collect())
    }
}

impl FromIterator<(String, String)> for Annotations {
    fn from_iter<I: IntoIterator<Item = (String, String)>>(pairs: I) -> Annotations {
        pairs.into_iter().collect::<BTreeMap<_, _>>().into()
    }
}

impl From<Ingress> for StoredIngress {
    fn from(ingress: Ingress) -> StoredIngress {
        let meta = ingress.metadata;
        StoredIngress {
            metadata: IngressMeta {
                name: meta.name,
                namespace: meta.namespace,
                resource_version: meta.resource_version,
                uid: meta.uid,
                creation_timestamp: meta.creation_timestamp,
                annotations: meta.annotations.map(Annotations::from),
            },
            spec: ingress.spec,
            status: ingress.status,
        }
    }
}

impl StoredIngress {
    /// A reference to the Ingress, for Events about it (as kube-rs's `Resource::object_ref`).
    pub fn object_ref(&self) -> ObjectReference {
        let meta = &self.metadata;
        ObjectReference {
            api_version: Some("networking.k8s.io/v1".to_owned()),
            kind: Some("Ingress".to_owned()),
            name: meta.name.clone(),
            namespace: meta.namespace.clone(),
            uid: meta.uid.clone(),
            ..ObjectReference::default()
        }
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

    const EXPORTED_INGRESS: &str = r#"
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: web
  namespace: shop
  resourceVersion: "1007"
  uid: 0d1c1d2e-0000-4000-8000-000000000002
  generation: 3
  creationTimestamp: "2026-02-02T01:01:07Z"
  labels: {app: web, tier: front}
  annotations:
    team: shop
    duet.dev/upstream-family: PreferIPv6
    nginx.ingress.kubernetes.io/proxy-body-size: 8m
  finalizers: [example.com/keep]
  ownerReferences: [{apiVersion: v1, kind: ConfigMap, name: owner, uid: o-1}]
spec:
  ingressClassName: duet
  tls: [{hosts: [web.example], secretName: web-tls}]
  rules:
    - host: web.example
      http:
        paths:
          - {path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}
          - {path: /api, pathType: Exact, backend: {service: {name: api, port: {name: http}}}}
status: {loadBalancer: {ingress: [{ip: 192.0.2.1}, {ip: "2001:db8::1"}]}}
"#;

    #[test]
    fn a_stored_ingress_keeps_what_is_read_and_nothing_else() {
        let api: Ingress = serde_saphyr::from_str(EXPORTED_INGRESS).expect("an Ingress");
        let stored: StoredIngress =
            serde_saphyr::from_str(EXPORTED_INGRESS).expect("a stored Ingress");
        assert_eq!(stored, StoredIngress::from(api.clone()));
        let (meta, kept) = (&api.metadata, &stored.metadata);
        assert_eq!(kept.name, meta.name);
        assert_eq!(kept.namespace, meta.namespace);
        assert_eq!(kept.resource_version, meta.resource_version);
        assert_eq!(kept.uid, meta.uid);
        assert_eq!(kept.creation_timestamp, meta.creation_timestamp);
        assert_eq!(stored.spec, api.spec);
        assert_eq!(stored.status, api.status);
        let annotations = kept.annotations.as_ref().expect("annotations");
        let written = meta.annotations.as_ref().expect("annotations");
        let pairs: Vec<(&str, &str)> = annotations.iter().collect();
        let expected: Vec<(&str, &str)> = written.iter().map(|(k, v)| (&**k, &**v)).collect();
        assert_eq!(pairs, expected);
        assert_eq!(
            annotations.get("duet.dev/upstream-family"),
            Some("PreferIPv6")
        );
        assert_eq!(annotations.get("team"), Some("shop"));
        assert_eq!(annotations.get("absent"), None);
        // Events name the Ingress as kube-rs would.
        let reference = stored.object_ref();
        assert_eq!(reference, kube::Resource::object_ref(&api, &()));
    }

    #[test]
    fn annotations_are_found_by_name_whatever_their_order() {
        let pairs = [("b", "2"), ("a", "1"), ("c", "3")].map(|(k, v)| (k.to_owned(), v.to_owned()));
        let annotations: Annotations = pairs.into_iter().collect();
        let names: Vec<&str> = annotations.iter().map(|(k, _)| k).collect();
        assert_eq!(names, ["a", "b", "c"]);
        assert_eq!(
            ["a", "b", "c", "d", ""].map(|n| annotations.get(n)),
            [Some("1"), Some("2"), Some("3"), None, None]
        );
        assert_eq!(annotations.len(), 3);
        assert!(Annotations::default().is_empty() && Annotations::default().get("a").is_none());
    }

    #[test]
    fn hostile_ingresses_decode_or_are_refused_without_panic() {
        for bad in [
            "metadata: {annotations: [a, b]}",
            "metadata: {annotations: {a: [1]}}",
            "metadata: {name: {x: 1}}",
            "metadata: {creationTimestamp: yesterday}",
            "spec: {rules: {host: a}}",
        ] {
            assert!(
                serde_saphyr::from_str::<StoredIngress>(bad).is_err(),
                "{bad}"
            );
            assert!(serde_saphyr::from_str::<Ingress>(bad).is_err(), "{bad}");
        }
        let bare: StoredIngress = serde_saphyr::from_str("metadata: {name: bare}\n").unwrap();
        assert_eq!(bare.metadata.name.as_deref(), Some("bare"));
        assert!(bare.metadata.annotations.is_none() && bare.spec.is_none());
    }

    #[test]
    fn a_stored_ingress_is_small() {
        // The API type carries a 360-byte `ObjectMeta` whatever it holds; the stored one keeps
        // six fields of it, annotations in one boxed slice.
        let (stored, api) = (
            std::mem::size_of::<StoredIngress>(),
            std::mem::size_of::<Ingress>(),
        );
        assert!(stored + 200 <= api, "{stored} bytes, the API type {api}");
        assert!(std::mem::size_of::<Option<Annotations>>() <= 16);
    }
}
