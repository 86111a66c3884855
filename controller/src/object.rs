//! Object identities, a leaf every other module may name: the [`Kind`]s duet reads, a
//! namespace and name ([`NsName`]), one object's key ([`ObjectKey`]), and the rules object names
//! follow (DNS-1123 subdomains and labels).

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::Metadata;
use serde::Serialize;

use crate::compact::SliceView;
pub use crate::compact::SERVICE_NAME_LABEL;

/// The kinds of object duet reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum Kind {
    /// `networking.k8s.io/v1` Ingress.
    Ingress,
    /// `networking.k8s.io/v1` IngressClass (cluster-scoped).
    IngressClass,
    /// `v1` Service.
    Service,
    /// `discovery.k8s.io/v1` EndpointSlice.
    EndpointSlice,
    /// `v1` Secret.
    Secret,
    /// `v1` Namespace (cluster-scoped; its labels select Gateway API routes).
    Namespace,
    /// `gateway.networking.k8s.io/v1` GatewayClass (cluster-scoped).
    GatewayClass,
    /// `gateway.networking.k8s.io/v1` Gateway.
    Gateway,
    /// `gateway.networking.k8s.io/v1` HTTPRoute.
    HttpRoute,
    /// `gateway.networking.k8s.io/v1` GRPCRoute.
    GrpcRoute,
    /// `gateway.networking.k8s.io/v1` TLSRoute.
    TlsRoute,
    /// `gateway.networking.k8s.io/v1` ReferenceGrant.
    ReferenceGrant,
    /// `gateway.networking.k8s.io/v1` ListenerSet.
    ListenerSet,
    /// `gateway.networking.k8s.io/v1` BackendTLSPolicy.
    BackendTlsPolicy,
    /// `v1` ConfigMap (BackendTLSPolicy CA certificates).
    ConfigMap,
}

impl Kind {
    /// The kind's name as in manifests.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Ingress => "Ingress",
            Kind::IngressClass => "IngressClass",
            Kind::Service => "Service",
            Kind::EndpointSlice => "EndpointSlice",
            Kind::Secret => "Secret",
            Kind::Namespace => "Namespace",
            Kind::GatewayClass => "GatewayClass",
            Kind::Gateway => "Gateway",
            Kind::HttpRoute => "HTTPRoute",
            Kind::GrpcRoute => "GRPCRoute",
            Kind::TlsRoute => "TLSRoute",
            Kind::ReferenceGrant => "ReferenceGrant",
            Kind::ListenerSet => "ListenerSet",
            Kind::BackendTlsPolicy => "BackendTLSPolicy",
            Kind::ConfigMap => "ConfigMap",
        }
    }

    /// The `apiVersion` duet reads the kind at.
    pub fn api_version(self) -> &'static str {
        match self {
            Kind::Ingress | Kind::IngressClass => "networking.k8s.io/v1",
            Kind::Service | Kind::Secret | Kind::Namespace | Kind::ConfigMap => "v1",
            Kind::EndpointSlice => "discovery.k8s.io/v1",
            Kind::GatewayClass
            | Kind::Gateway
            | Kind::HttpRoute
            | Kind::GrpcRoute
            | Kind::TlsRoute
            | Kind::ReferenceGrant
            | Kind::ListenerSet
            | Kind::BackendTlsPolicy => "gateway.networking.k8s.io/v1",
        }
    }

    /// Whether objects of the kind live in a namespace.
    pub fn namespaced(self) -> bool {
        !matches!(
            self,
            Kind::IngressClass | Kind::Namespace | Kind::GatewayClass
        )
    }

    /// The kind of an `apiVersion` and `kind` pair, if duet reads it.
    pub fn from_type(api_version: &str, kind: &str) -> Option<Kind> {
        [
            Kind::Ingress,
            Kind::IngressClass,
            Kind::Service,
            Kind::EndpointSlice,
            Kind::Secret,
            Kind::Namespace,
            Kind::GatewayClass,
            Kind::Gateway,
            Kind::HttpRoute,
            Kind::GrpcRoute,
            Kind::TlsRoute,
            Kind::ReferenceGrant,
            Kind::ListenerSet,
            Kind::BackendTlsPolicy,
            Kind::ConfigMap,
        ]
        .into_iter()
        .find(|k| k.api_version() == api_version && k.as_str() == kind)
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A namespace and a name (the namespace is empty for cluster-scoped objects).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct NsName {
    /// The namespace; empty for cluster-scoped objects.
    pub namespace: String,
    /// The name.
    pub name: String,
}

impl NsName {
    /// A namespaced name.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> NsName {
        NsName {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl NsName {
    /// The namespace (`default` when unset) and name of a namespaced object.
    pub fn of(meta: &ObjectMeta) -> NsName {
        let (namespace, name) = NsName::borrowed(meta);
        NsName::new(namespace, name)
    }

    /// [`NsName::of`] without allocating: the namespace (`default` when unset) and the name.
    pub fn borrowed(meta: &ObjectMeta) -> (&str, &str) {
        let namespace = meta.namespace.as_deref().unwrap_or("default");
        (namespace, meta.name.as_deref().unwrap_or_default())
    }
}

/// Namespaced objects by namespace and name, for the lookups of one translation.
pub fn by_name<'a, T: Metadata<Ty = ObjectMeta>>(objects: &[&'a T]) -> BTreeMap<NsName, &'a T> {
    objects
        .iter()
        .map(|o| (NsName::of(o.metadata()), *o))
        .collect()
}

impl fmt::Display for NsName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.namespace.is_empty() {
            f.write_str(&self.name)
        } else {
            write!(f, "{}/{}", self.namespace, self.name)
        }
    }
}

/// One object's identity: kind, namespace and name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct ObjectKey {
    /// The kind.
    pub kind: Kind,
    /// The namespace; empty for cluster-scoped objects.
    pub namespace: String,
    /// The name.
    pub name: String,
}

impl ObjectKey {
    /// A key from its parts.
    pub fn new(kind: Kind, namespace: impl Into<String>, name: impl Into<String>) -> ObjectKey {
        ObjectKey {
            kind,
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    /// The namespace and name.
    pub fn ns_name(&self) -> NsName {
        NsName::new(self.namespace.clone(), self.name.clone())
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.namespace.is_empty() {
            write!(f, "{} {}", self.kind, self.name)
        } else {
            write!(f, "{} {}/{}", self.kind, self.namespace, self.name)
        }
    }
}

/// Whether `s` is a DNS-1123 subdomain (the name of most objects, e.g. a Lease): dot-separated
/// labels, at most 253.
pub fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253
        && s.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

/// Whether `s` is a DNS label (a namespace or Service name): lowercase letters, digits and `-`,
/// at most 63, not starting or ending with `-`.
pub fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// The Service an EndpointSlice belongs to (its `kubernetes.io/service-name` label).
pub fn slice_service<S: SliceView + ?Sized>(slice: &S) -> Option<NsName> {
    Some(NsName::new(slice.namespace(), slice.service()?))
}
