//! The object stores every source feeds: Ingress, IngressClass, Service, EndpointSlice and Secret
//! keyed by namespace and name, and the decision whether a change matters for routes, only for
//! endpoints, or not at all.
//!
//! Sources (the manifest folder now, kube-rs watchers later) send [`Change`]s; the index keeps
//! the latest state and the app rebuilds from that state, never from the deltas.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::Path;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::{Ingress, IngressClass};
use serde::Serialize;

use crate::class::{ClassConfig, Classes};

/// The label tying an EndpointSlice to its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

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
        }
    }

    /// The `apiVersion` duet reads the kind at.
    pub fn api_version(self) -> &'static str {
        match self {
            Kind::Ingress | Kind::IngressClass => "networking.k8s.io/v1",
            Kind::Service | Kind::Secret => "v1",
            Kind::EndpointSlice => "discovery.k8s.io/v1",
        }
    }

    /// Whether objects of the kind live in a namespace.
    pub fn namespaced(self) -> bool {
        !matches!(self, Kind::IngressClass)
    }

    /// The kind of an `apiVersion` and `kind` pair, if duet reads it.
    pub fn from_type(api_version: &str, kind: &str) -> Option<Kind> {
        [
            Kind::Ingress,
            Kind::IngressClass,
            Kind::Service,
            Kind::EndpointSlice,
            Kind::Secret,
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

/// An object of one of the kinds duet reads.
#[derive(Clone, Debug, PartialEq)]
pub enum Object {
    /// An Ingress.
    Ingress(Arc<Ingress>),
    /// An IngressClass.
    IngressClass(Arc<IngressClass>),
    /// A Service.
    Service(Arc<Service>),
    /// An EndpointSlice.
    EndpointSlice(Arc<EndpointSlice>),
    /// A Secret.
    Secret(Arc<Secret>),
}

impl Object {
    /// The object's kind.
    pub fn kind(&self) -> Kind {
        match self {
            Object::Ingress(_) => Kind::Ingress,
            Object::IngressClass(_) => Kind::IngressClass,
            Object::Service(_) => Kind::Service,
            Object::EndpointSlice(_) => Kind::EndpointSlice,
            Object::Secret(_) => Kind::Secret,
        }
    }

    fn meta(&self) -> &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
        match self {
            Object::Ingress(o) => &o.metadata,
            Object::IngressClass(o) => &o.metadata,
            Object::Service(o) => &o.metadata,
            Object::EndpointSlice(o) => &o.metadata,
            Object::Secret(o) => &o.metadata,
        }
    }

    /// The object's key (a missing namespace is `default` for namespaced kinds).
    pub fn key(&self) -> ObjectKey {
        let kind = self.kind();
        let meta = self.meta();
        let namespace = if kind.namespaced() {
            meta.namespace.as_deref().unwrap_or("default")
        } else {
            ""
        };
        ObjectKey::new(kind, namespace, meta.name.as_deref().unwrap_or_default())
    }
}

/// One change from a source.
#[derive(Clone, Debug, PartialEq)]
pub enum Change {
    /// The object was created or modified; `file` is the manifest it came from, when known.
    Apply {
        /// The object's new state.
        object: Object,
        /// The manifest file it came from, for messages.
        file: Option<Arc<Path>>,
    },
    /// The object is gone.
    Delete(ObjectKey),
    /// The complete current set of one kind (a relist): objects of that kind not in the list are
    /// deleted. For sources that learn the whole state at once (a watcher's re-list after a
    /// `410 Gone` reports no deletes).
    Replace {
        /// The kind being replaced.
        kind: Kind,
        /// Every object of that kind, with its file when known.
        objects: Vec<(Object, Option<Arc<Path>>)>,
    },
}

/// What a change means for the snapshot.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Impact {
    /// Hosts, paths or which Services are used may have changed: rebuild the route table.
    pub routes: bool,
    /// Only these Services' endpoints changed: rebuild their backends, share the routes.
    pub endpoints: BTreeSet<NsName>,
}

impl Impact {
    /// Whether anything needs rebuilding.
    pub fn is_empty(&self) -> bool {
        !self.routes && self.endpoints.is_empty()
    }

    /// Adds another change's impact.
    pub fn merge(&mut self, other: Impact) {
        self.routes |= other.routes;
        self.endpoints.extend(other.endpoints);
    }

    fn routes() -> Impact {
        Impact {
            routes: true,
            endpoints: BTreeSet::new(),
        }
    }
}

/// What the current routes use: set after each route build, so that the index can tell whether
/// a change matters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct References {
    /// Our Ingresses.
    pub ingresses: BTreeSet<NsName>,
    /// Services our Ingresses name, whether they exist or not.
    pub services: BTreeSet<NsName>,
    /// TLS Secrets our Ingresses name, whether they exist or not.
    pub secrets: BTreeSet<NsName>,
}

/// A stored object with the file it came from.
#[derive(Clone, Debug)]
pub struct Entry<T> {
    /// The object.
    pub object: Arc<T>,
    /// The manifest file, when the source is a folder.
    pub file: Option<Arc<Path>>,
}

/// The objects of one kind by namespace and name.
pub type Store<T> = BTreeMap<NsName, Entry<T>>;

/// Every object the sources reported, by kind.
#[derive(Debug, Default)]
pub struct Index {
    class: ClassConfig,
    references: References,
    /// Ingresses.
    pub ingresses: Store<Ingress>,
    /// IngressClasses (namespace empty).
    pub ingress_classes: Store<IngressClass>,
    /// Services.
    pub services: Store<Service>,
    /// EndpointSlices.
    pub endpoint_slices: Store<EndpointSlice>,
    /// Secrets.
    pub secrets: Store<Secret>,
}

/// The Service an EndpointSlice belongs to (its `kubernetes.io/service-name` label).
pub fn slice_service(slice: &EndpointSlice) -> Option<NsName> {
    let name = slice.metadata.labels.as_ref()?.get(SERVICE_NAME_LABEL)?;
    let namespace = slice.metadata.namespace.as_deref().unwrap_or("default");
    Some(NsName::new(namespace, name.clone()))
}

impl Index {
    /// An empty index deciding ownership with `class`.
    pub fn new(class: ClassConfig) -> Index {
        Index {
            class,
            ..Index::default()
        }
    }

    /// Records what the current routes use (from the last route build).
    pub fn set_references(&mut self, references: References) {
        self.references = references;
    }

    /// What the current routes use.
    pub fn references(&self) -> &References {
        &self.references
    }

    /// The manifest file an object came from, when known.
    pub fn file_of(&self, key: &ObjectKey) -> Option<&Arc<Path>> {
        let k = key.ns_name();
        match key.kind {
            Kind::Ingress => self.ingresses.get(&k)?.file.as_ref(),
            Kind::IngressClass => self.ingress_classes.get(&k)?.file.as_ref(),
            Kind::Service => self.services.get(&k)?.file.as_ref(),
            Kind::EndpointSlice => self.endpoint_slices.get(&k)?.file.as_ref(),
            Kind::Secret => self.secrets.get(&k)?.file.as_ref(),
        }
    }

    /// Stores a change and says what it means for the snapshot. Re-applying an identical object
    /// (a resync) has no impact.
    pub fn apply(&mut self, change: Change) -> Impact {
        match change {
            Change::Replace { kind, objects } => {
                let keep: std::collections::BTreeSet<ObjectKey> =
                    objects.iter().map(|(o, _)| o.key()).collect();
                let gone: Vec<ObjectKey> = self.keys(kind).filter(|k| !keep.contains(k)).collect();
                let mut impact = Impact::default();
                for key in gone {
                    impact.merge(self.apply(Change::Delete(key)));
                }
                for (object, file) in objects {
                    impact.merge(self.apply(Change::Apply { object, file }));
                }
                impact
            }
            Change::Apply { object, file } => {
                let key = object.key().ns_name();
                match object {
                    Object::Ingress(new) => {
                        let old = put(&mut self.ingresses, key.clone(), new.clone(), file);
                        self.ingress_impact(&key, old.as_deref(), Some(&new))
                    }
                    Object::IngressClass(new) => {
                        let old = put(&mut self.ingress_classes, key, new.clone(), file);
                        self.class_impact(old.as_deref(), Some(&new))
                    }
                    Object::Service(new) => {
                        let old = put(&mut self.services, key.clone(), new.clone(), file);
                        self.service_impact(&key, old.as_deref(), Some(&new))
                    }
                    Object::EndpointSlice(new) => {
                        let old = put(&mut self.endpoint_slices, key, new.clone(), file);
                        self.slice_impact(old.as_deref(), Some(&new))
                    }
                    Object::Secret(new) => {
                        let old = put(&mut self.secrets, key.clone(), new.clone(), file);
                        self.secret_impact(&key, old.as_deref(), Some(&new))
                    }
                }
            }
            Change::Delete(key) => {
                let k = key.ns_name();
                match key.kind {
                    Kind::Ingress => {
                        let old = self.ingresses.remove(&k).map(|e| e.object);
                        self.ingress_impact(&k, old.as_deref(), None)
                    }
                    Kind::IngressClass => {
                        let old = self.ingress_classes.remove(&k).map(|e| e.object);
                        self.class_impact(old.as_deref(), None)
                    }
                    Kind::Service => {
                        let old = self.services.remove(&k).map(|e| e.object);
                        self.service_impact(&k, old.as_deref(), None)
                    }
                    Kind::EndpointSlice => {
                        let old = self.endpoint_slices.remove(&k).map(|e| e.object);
                        self.slice_impact(old.as_deref(), None)
                    }
                    Kind::Secret => {
                        let old = self.secrets.remove(&k).map(|e| e.object);
                        self.secret_impact(&k, old.as_deref(), None)
                    }
                }
            }
        }
    }

    fn ingress_impact(&self, key: &NsName, old: Option<&Ingress>, new: Option<&Ingress>) -> Impact {
        if same_routing(old, new) {
            // Unchanged, or only its status (which duet writes itself) or bookkeeping changed.
            return Impact::default();
        }
        let classes = Classes::new(self.ingress_classes.values().map(|e| &*e.object));
        let was_ours = self.references.ingresses.contains(key)
            || old.is_some_and(|o| self.class.is_ours(o, &classes));
        let is_ours = new.is_some_and(|n| self.class.is_ours(n, &classes));
        if was_ours || is_ours {
            Impact::routes()
        } else {
            Impact::default()
        }
    }

    fn class_impact(&self, old: Option<&IngressClass>, new: Option<&IngressClass>) -> Impact {
        if old == new {
            return Impact::default();
        }
        if old.is_some_and(|c| self.class.concerns(c))
            || new.is_some_and(|c| self.class.concerns(c))
        {
            Impact::routes()
        } else {
            Impact::default()
        }
    }

    fn service_impact(&self, key: &NsName, old: Option<&Service>, new: Option<&Service>) -> Impact {
        if old != new && self.references.services.contains(key) {
            Impact::routes()
        } else {
            Impact::default()
        }
    }

    fn slice_impact(&self, old: Option<&EndpointSlice>, new: Option<&EndpointSlice>) -> Impact {
        let mut impact = Impact::default();
        if old == new {
            return impact;
        }
        for service in [old, new].into_iter().flatten().filter_map(slice_service) {
            if self.references.services.contains(&service) {
                impact.endpoints.insert(service);
            }
        }
        impact
    }

    fn secret_impact(&self, key: &NsName, old: Option<&Secret>, new: Option<&Secret>) -> Impact {
        if old != new && self.references.secrets.contains(key) {
            Impact::routes()
        } else {
            Impact::default()
        }
    }

    /// The keys of every stored object of a kind.
    pub fn keys(&self, kind: Kind) -> impl Iterator<Item = ObjectKey> + '_ {
        let names: Box<dyn Iterator<Item = &NsName>> = match kind {
            Kind::Ingress => Box::new(self.ingresses.keys()),
            Kind::IngressClass => Box::new(self.ingress_classes.keys()),
            Kind::Service => Box::new(self.services.keys()),
            Kind::EndpointSlice => Box::new(self.endpoint_slices.keys()),
            Kind::Secret => Box::new(self.secrets.keys()),
        };
        names.map(move |n| ObjectKey::new(kind, n.namespace.clone(), n.name.clone()))
    }

    /// The stored objects as translation input.
    pub fn inputs(&self) -> crate::translate::Inputs<'_> {
        crate::translate::Inputs {
            ingresses: self.ingresses.values().map(|e| &*e.object).collect(),
            ingress_classes: self.ingress_classes.values().map(|e| &*e.object).collect(),
            services: self.services.values().map(|e| &*e.object).collect(),
            endpoint_slices: self.endpoint_slices.values().map(|e| &*e.object).collect(),
            secrets: self.secrets.values().map(|e| &*e.object).collect(),
        }
    }
}

/// What of an Ingress translation reads: its spec, annotations and creation time; not its
/// status or resourceVersion, so that a status write does not rebuild routes.
fn same_routing(old: Option<&Ingress>, new: Option<&Ingress>) -> bool {
    match (old, new) {
        (Some(a), Some(b)) => {
            a.spec == b.spec
                && a.metadata.annotations == b.metadata.annotations
                && a.metadata.creation_timestamp == b.metadata.creation_timestamp
        }
        (None, None) => true,
        _ => false,
    }
}

fn put<T>(
    store: &mut Store<T>,
    key: NsName,
    object: Arc<T>,
    file: Option<Arc<Path>>,
) -> Option<Arc<T>> {
    store.insert(key, Entry { object, file }).map(|e| e.object)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::networking::v1::IngressSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn meta(ns: &str, name: &str) -> ObjectMeta {
        ObjectMeta {
            namespace: Some(ns.to_owned()),
            name: Some(name.to_owned()),
            ..Default::default()
        }
    }

    fn ingress(name: &str, class: &str) -> Object {
        Object::Ingress(Arc::new(Ingress {
            metadata: meta("default", name),
            spec: Some(IngressSpec {
                ingress_class_name: Some(class.to_owned()),
                ..Default::default()
            }),
            status: None,
        }))
    }

    fn slice(name: &str, service: &str, address: &str) -> Object {
        let mut m = meta("default", name);
        m.labels = Some(
            [(SERVICE_NAME_LABEL.to_owned(), service.to_owned())]
                .into_iter()
                .collect(),
        );
        Object::EndpointSlice(Arc::new(EndpointSlice {
            metadata: m,
            address_type: "IPv4".to_owned(),
            endpoints: Some(vec![k8s_openapi::api::discovery::v1::Endpoint {
                addresses: vec![address.to_owned()],
                ..Default::default()
            }]),
            ports: None,
        }))
    }

    fn apply(object: Object) -> Change {
        Change::Apply { object, file: None }
    }

    #[test]
    fn keys_default_the_namespace() {
        let mut m = meta("x", "web");
        m.namespace = None;
        let svc = Object::Service(Arc::new(Service {
            metadata: m.clone(),
            ..Default::default()
        }));
        assert_eq!(svc.key(), ObjectKey::new(Kind::Service, "default", "web"));
        m.namespace = Some("ignored".to_owned());
        let class = Object::IngressClass(Arc::new(IngressClass {
            metadata: m,
            spec: None,
        }));
        assert_eq!(class.key(), ObjectKey::new(Kind::IngressClass, "", "web"));
        assert_eq!(class.key().to_string(), "IngressClass web");
    }

    #[test]
    fn only_our_ingresses_touch_routes() {
        let mut index = Index::new(ClassConfig::default());
        assert!(index.apply(apply(ingress("a", "duet"))).routes);
        assert!(index.apply(apply(ingress("b", "nginx"))).is_empty());
        // Same object again: a resync, nothing to do.
        assert!(index.apply(apply(ingress("a", "duet"))).is_empty());
        // Moving an Ingress away from our class is a route change (its routes go).
        index.set_references(References {
            ingresses: [NsName::new("default", "a")].into_iter().collect(),
            ..Default::default()
        });
        assert!(index.apply(apply(ingress("a", "nginx"))).routes);
        assert!(index
            .apply(Change::Delete(ObjectKey::new(
                Kind::Ingress,
                "default",
                "b"
            )))
            .is_empty());
    }

    #[test]
    fn status_and_resource_version_changes_do_not_touch_routes() {
        use k8s_openapi::api::networking::v1::{
            IngressLoadBalancerIngress, IngressLoadBalancerStatus, IngressStatus,
        };
        let mut index = Index::new(ClassConfig::default());
        assert!(index.apply(apply(ingress("a", "duet"))).routes);
        let Object::Ingress(stored) = ingress("a", "duet") else {
            unreachable!()
        };
        let mut written = (*stored).clone();
        written.metadata.resource_version = Some("42".to_owned());
        written.status = Some(IngressStatus {
            load_balancer: Some(IngressLoadBalancerStatus {
                ingress: Some(vec![IngressLoadBalancerIngress {
                    ip: Some("2001:db8::1".to_owned()),
                    ..Default::default()
                }]),
            }),
        });
        assert!(index
            .apply(apply(Object::Ingress(Arc::new(written))))
            .is_empty());
        assert!(index.ingresses[&NsName::new("default", "a")]
            .object
            .status
            .is_some());
    }

    #[test]
    fn slices_of_referenced_services_are_endpoint_only() {
        let mut index = Index::new(ClassConfig::default());
        index.set_references(References {
            services: [NsName::new("default", "web")].into_iter().collect(),
            ..Default::default()
        });
        let impact = index.apply(apply(slice("web-1", "web", "10.0.0.1")));
        assert!(!impact.routes);
        assert_eq!(
            impact.endpoints.into_iter().collect::<Vec<_>>(),
            vec![NsName::new("default", "web")]
        );
        assert!(index
            .apply(apply(slice("other-1", "other", "10.0.0.2")))
            .is_empty());
        // A slice relabelled from an unused Service to ours counts for ours.
        let moved = index.apply(apply(slice("other-1", "web", "10.0.0.2")));
        assert_eq!(moved.endpoints.len(), 1);
        let gone = index.apply(Change::Delete(ObjectKey::new(
            Kind::EndpointSlice,
            "default",
            "web-1",
        )));
        assert_eq!(gone.endpoints.len(), 1);
        assert!(!gone.routes);
    }

    #[test]
    fn services_and_secrets_matter_when_referenced() {
        let mut index = Index::new(ClassConfig::default());
        let svc = |name: &str| {
            apply(Object::Service(Arc::new(Service {
                metadata: meta("default", name),
                ..Default::default()
            })))
        };
        assert!(index.apply(svc("web")).is_empty());
        index.set_references(References {
            services: [NsName::new("default", "web")].into_iter().collect(),
            secrets: [NsName::new("default", "tls")].into_iter().collect(),
            ..Default::default()
        });
        assert!(
            index
                .apply(Change::Delete(ObjectKey::new(
                    Kind::Service,
                    "default",
                    "web"
                )))
                .routes
        );
        assert!(index.apply(svc("unused")).is_empty());
        let secret = apply(Object::Secret(Arc::new(Secret {
            metadata: meta("default", "tls"),
            ..Default::default()
        })));
        assert!(index.apply(secret).routes);
    }

    #[test]
    fn replace_deletes_what_a_relist_no_longer_has() {
        let mut index = Index::new(ClassConfig::default());
        index.set_references(References {
            services: [NsName::new("default", "web")].into_iter().collect(),
            ..Default::default()
        });
        index.apply(apply(slice("web-1", "web", "10.0.0.1")));
        index.apply(apply(slice("web-2", "web", "10.0.0.2")));
        index.apply(apply(ingress("a", "duet")));
        let impact = index.apply(Change::Replace {
            kind: Kind::EndpointSlice,
            objects: vec![(slice("web-2", "web", "10.0.0.2"), None)],
        });
        let keys: Vec<String> = index
            .keys(Kind::EndpointSlice)
            .map(|k| k.to_string())
            .collect();
        assert_eq!(keys, ["EndpointSlice default/web-2"]);
        assert!(!impact.routes);
        assert_eq!(impact.endpoints.len(), 1, "web-1 went away");
        // Other kinds are untouched.
        assert_eq!(index.ingresses.len(), 1);
        // Replacing with the same set again changes nothing.
        assert!(index
            .apply(Change::Replace {
                kind: Kind::EndpointSlice,
                objects: vec![(slice("web-2", "web", "10.0.0.2"), None)],
            })
            .is_empty());
    }

    #[test]
    fn files_are_remembered() {
        let mut index = Index::new(ClassConfig::default());
        let file: Arc<Path> = Arc::from(Path::new("/m/web.yaml"));
        index.apply(Change::Apply {
            object: ingress("a", "duet"),
            file: Some(file.clone()),
        });
        assert_eq!(
            index.file_of(&ObjectKey::new(Kind::Ingress, "default", "a")),
            Some(&file)
        );
        assert_eq!(index.inputs().ingresses.len(), 1);
    }
}
