//! The object stores every source feeds: Ingress, IngressClass, Service, EndpointSlice and Secret
//! keyed by namespace and name, and the decision whether a change matters for routes, only for
//! endpoints, or not at all.
//!
//! Sources (the manifest folder, the kube-rs watchers) send [`Change`]s; the index keeps the
//! latest state and the app rebuilds from that state, never from the deltas. Each stored type
//! says once, in its [`Stored`] impl, which [`Kind`] it is, which [`Object`] variant holds it,
//! which store keeps it and what a change of it means; everything else is generic over that
//! trait, and [`Kind`] meets the types in one place ([`for_kind`]).

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use k8s_openapi::api::networking::v1::IngressClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::class::{ClassConfig, Classes};
use crate::compact::Slice;
use crate::gateway_api::{
    BackendTlsPolicy, Gateway, GatewayClass, GrpcRoute, HttpRoute, ListenerSet, ReferenceGrant,
    TlsRoute,
};
pub use crate::object::{slice_service, Kind, NsName, ObjectKey, SERVICE_NAME_LABEL};
use crate::slices::SliceOwners;
use crate::stored::{StoredIngress, StoredService};
use crate::translate::Inputs;
pub use crate::translate::References;

/// An object of one of the kinds duet reads.
#[derive(Clone, Debug, PartialEq)]
pub enum Object {
    /// An Ingress.
    Ingress(Arc<StoredIngress>),
    /// An IngressClass.
    IngressClass(Arc<IngressClass>),
    /// A Service, in its slim stored form.
    Service(Arc<StoredService>),
    /// An EndpointSlice, in its compact stored form.
    EndpointSlice(Arc<Slice>),
    /// A Secret.
    Secret(Arc<Secret>),
    /// A Namespace.
    Namespace(Arc<Namespace>),
    /// A GatewayClass.
    GatewayClass(Arc<GatewayClass>),
    /// A Gateway.
    Gateway(Arc<Gateway>),
    /// An HTTPRoute.
    HttpRoute(Arc<HttpRoute>),
    /// A GRPCRoute.
    GrpcRoute(Arc<GrpcRoute>),
    /// A TLSRoute.
    TlsRoute(Arc<TlsRoute>),
    /// A ReferenceGrant.
    ReferenceGrant(Arc<ReferenceGrant>),
    /// A ListenerSet.
    ListenerSet(Arc<ListenerSet>),
    /// A BackendTLSPolicy.
    BackendTlsPolicy(Arc<BackendTlsPolicy>),
    /// A ConfigMap.
    ConfigMap(Arc<ConfigMap>),
}

/// A type of object the index stores: its kind, its [`Object`] variant, its store, and what a
/// change of one means for the snapshot.
pub trait Stored: Sized + PartialEq + Send + Sync + 'static {
    /// The kind.
    const KIND: Kind;
    /// The object as an [`Object`].
    fn wrap(object: Arc<Self>) -> Object;
    /// Its namespace and name, as written (either may be unset).
    fn names(&self) -> (Option<&str>, Option<&str>);
    /// The index's store of the type.
    fn store(index: &Index) -> &Store<Self>;
    /// The same, to change.
    fn store_mut(index: &mut Index) -> &mut Store<Self>;
    /// What replacing `old` by `new` (either absent) means for the snapshot.
    fn impact(index: &Index, key: &NsName, old: Option<&Self>, new: Option<&Self>) -> Impact;
}

macro_rules! stored {
    ($($ty:ty => $kind:ident, $store:ident, $impact:ident);* $(;)?) => {$(
        impl Stored for $ty {
            const KIND: Kind = Kind::$kind;
            fn wrap(object: Arc<Self>) -> Object {
                Object::$kind(object)
            }
            fn names(&self) -> (Option<&str>, Option<&str>) {
                (self.metadata.namespace.as_deref(), self.metadata.name.as_deref())
            }
            fn store(index: &Index) -> &Store<Self> {
                &index.$store
            }
            fn store_mut(index: &mut Index) -> &mut Store<Self> {
                &mut index.$store
            }
            fn impact(index: &Index, key: &NsName, old: Option<&Self>, new: Option<&Self>) -> Impact {
                index.$impact(key, old, new)
            }
        }
    )*};
}

stored!(
    StoredIngress => Ingress, ingresses, ingress_impact;
    IngressClass => IngressClass, ingress_classes, class_impact;
    StoredService => Service, services, service_impact;
    Slice => EndpointSlice, endpoint_slices, slice_impact;
    Secret => Secret, secrets, secret_impact;
    Namespace => Namespace, namespaces, namespace_impact;
    GatewayClass => GatewayClass, gateway_classes, gateway_impact;
    Gateway => Gateway, gateways, gateway_impact;
    HttpRoute => HttpRoute, http_routes, gateway_impact;
    GrpcRoute => GrpcRoute, grpc_routes, gateway_impact;
    TlsRoute => TlsRoute, tls_routes, gateway_impact;
    ReferenceGrant => ReferenceGrant, reference_grants, gateway_impact;
    ListenerSet => ListenerSet, listener_sets, gateway_impact;
    BackendTlsPolicy => BackendTlsPolicy, backend_tls_policies, gateway_impact;
    ConfigMap => ConfigMap, config_maps, config_map_impact;
);

/// Work to do on the stored type of a [`Kind`] only known at run time (see [`for_kind`]).
pub trait PerKind {
    /// What the work gives.
    type Output;
    /// Does the work for the type `K`.
    fn run<K: Stored>(self) -> Self::Output;
}

/// Runs `work` for the stored type of `kind`: the one place where kinds meet types.
pub fn for_kind<W: PerKind>(kind: Kind, work: W) -> W::Output {
    match kind {
        Kind::Ingress => work.run::<StoredIngress>(),
        Kind::IngressClass => work.run::<IngressClass>(),
        Kind::Service => work.run::<StoredService>(),
        Kind::EndpointSlice => work.run::<Slice>(),
        Kind::Secret => work.run::<Secret>(),
        Kind::Namespace => work.run::<Namespace>(),
        Kind::GatewayClass => work.run::<GatewayClass>(),
        Kind::Gateway => work.run::<Gateway>(),
        Kind::HttpRoute => work.run::<HttpRoute>(),
        Kind::GrpcRoute => work.run::<GrpcRoute>(),
        Kind::TlsRoute => work.run::<TlsRoute>(),
        Kind::ReferenceGrant => work.run::<ReferenceGrant>(),
        Kind::ListenerSet => work.run::<ListenerSet>(),
        Kind::BackendTlsPolicy => work.run::<BackendTlsPolicy>(),
        Kind::ConfigMap => work.run::<ConfigMap>(),
    }
}

impl Object {
    /// The object's kind, namespace and name (as written).
    fn parts(&self) -> (Kind, (Option<&str>, Option<&str>)) {
        fn of<K: Stored>(object: &K) -> (Kind, (Option<&str>, Option<&str>)) {
            (K::KIND, object.names())
        }
        match self {
            Object::Ingress(o) => of(&**o),
            Object::IngressClass(o) => of(&**o),
            Object::Service(o) => of(&**o),
            Object::EndpointSlice(o) => of(&**o),
            Object::Secret(o) => of(&**o),
            Object::Namespace(o) => of(&**o),
            Object::GatewayClass(o) => of(&**o),
            Object::Gateway(o) => of(&**o),
            Object::HttpRoute(o) => of(&**o),
            Object::GrpcRoute(o) => of(&**o),
            Object::TlsRoute(o) => of(&**o),
            Object::ReferenceGrant(o) => of(&**o),
            Object::ListenerSet(o) => of(&**o),
            Object::BackendTlsPolicy(o) => of(&**o),
            Object::ConfigMap(o) => of(&**o),
        }
    }

    /// Whether both are the same stored object (the same `Arc`), without comparing values.
    pub fn same_arc(&self, other: &Object) -> bool {
        match (self, other) {
            (Object::Ingress(a), Object::Ingress(b)) => Arc::ptr_eq(a, b),
            (Object::IngressClass(a), Object::IngressClass(b)) => Arc::ptr_eq(a, b),
            (Object::Service(a), Object::Service(b)) => Arc::ptr_eq(a, b),
            (Object::EndpointSlice(a), Object::EndpointSlice(b)) => Arc::ptr_eq(a, b),
            (Object::Secret(a), Object::Secret(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }

    /// The object's kind.
    pub fn kind(&self) -> Kind {
        self.parts().0
    }

    /// The object's key (a missing namespace is `default` for namespaced kinds).
    pub fn key(&self) -> ObjectKey {
        let (kind, namespace, name) = self.key_parts();
        ObjectKey::new(kind, namespace, name)
    }

    /// The parts of [`Object::key`], borrowed from the object.
    fn key_parts(&self) -> (Kind, &str, &str) {
        let (kind, names) = self.parts();
        let (namespace, name) = store::stored_key(kind, names);
        (kind, namespace, name)
    }

    /// The object's key compared with `key`, in `ObjectKey`'s order, without copying it.
    pub fn cmp_key(&self, key: &ObjectKey) -> std::cmp::Ordering {
        self.key_parts()
            .cmp(&(key.kind, key.namespace.as_str(), key.name.as_str()))
    }

    /// The two objects' keys compared, in `ObjectKey`'s order, without copying them.
    pub fn cmp_object_key(&self, other: &Object) -> std::cmp::Ordering {
        self.key_parts().cmp(&other.key_parts())
    }

    /// Stores the object in `index`; what that means for the snapshot.
    fn store_in(self, index: &mut Index, file: Option<Arc<Path>>) -> Impact {
        let key = self.key().ns_name();
        match self {
            Object::Ingress(o) => index.put(key, o, file),
            Object::IngressClass(o) => index.put(key, o, file),
            Object::Service(o) => index.put(key, o, file),
            Object::EndpointSlice(o) => {
                let old = index.endpoint_slices.get(&key).map(|e| &*e.object);
                index.slice_owners.moved(&key, old, Some(&o));
                index.put(key, o, file)
            }
            Object::Secret(o) => index.put(key, o, file),
            Object::Namespace(o) => index.put(key, o, file),
            Object::GatewayClass(o) => index.put(key, o, file),
            Object::Gateway(o) => index.put(key, o, file),
            Object::HttpRoute(o) => index.put(key, o, file),
            Object::GrpcRoute(o) => index.put(key, o, file),
            Object::TlsRoute(o) => index.put(key, o, file),
            Object::ReferenceGrant(o) => index.put(key, o, file),
            Object::ListenerSet(o) => index.put(key, o, file),
            Object::BackendTlsPolicy(o) => index.put(key, o, file),
            Object::ConfigMap(o) => index.put(key, o, file),
        }
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
    /// The Ingresses whose change set `routes`; `all_routes`: something else did too, so the
    /// whole route phase must run (see `translate::incremental`).
    pub ingresses: BTreeSet<NsName>,
    /// The Services and Secrets whose change set `routes`: the route phase runs again for the
    /// Ingresses that read them, or whole when something else does (see
    /// `translate::incremental::changed_ingresses`).
    pub services: BTreeSet<NsName>,
    /// See `services`.
    pub secrets: BTreeSet<NsName>,
    /// Whether routes changed through anything but `ingresses`, `services` and `secrets`.
    pub all_routes: bool,
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
        self.ingresses.extend(other.ingresses);
        self.services.extend(other.services);
        self.secrets.extend(other.secrets);
        self.all_routes |= other.all_routes;
    }

    fn routes() -> Impact {
        Impact {
            routes: true,
            all_routes: true,
            ..Impact::default()
        }
    }
}

/// A stored object with the file it came from.
#[derive(Clone, Debug)]
pub struct Entry<T> {
    /// The object.
    pub object: Arc<T>,
    /// The manifest file, when the source is a folder.
    pub file: Option<Arc<Path>>,
}

mod store;
pub use store::Store;

/// Every object the sources reported, by kind.
#[derive(Debug, Default)]
pub struct Index {
    class: ClassConfig,
    references: Arc<References>,
    /// Ingresses.
    pub ingresses: Store<StoredIngress>,
    /// IngressClasses (namespace empty).
    pub ingress_classes: Store<IngressClass>,
    /// Services.
    pub services: Store<StoredService>,
    /// EndpointSlices (compact: see [`compact`](crate::compact)).
    pub endpoint_slices: Store<Slice>,
    /// Secrets.
    pub secrets: Store<Secret>,
    /// The EndpointSlices of each Service.
    slice_owners: SliceOwners,
    /// Namespaces (for Gateway listeners' route namespace selectors).
    pub namespaces: Store<Namespace>,
    /// GatewayClasses (namespace empty).
    pub gateway_classes: Store<GatewayClass>,
    /// Gateways.
    pub gateways: Store<Gateway>,
    /// HTTPRoutes.
    pub http_routes: Store<HttpRoute>,
    /// GRPCRoutes.
    pub grpc_routes: Store<GrpcRoute>,
    /// TLSRoutes.
    pub tls_routes: Store<TlsRoute>,
    /// ReferenceGrants.
    pub reference_grants: Store<ReferenceGrant>,
    /// ListenerSets.
    pub listener_sets: Store<ListenerSet>,
    /// BackendTLSPolicies.
    pub backend_tls_policies: Store<BackendTlsPolicy>,
    /// ConfigMaps (the CA certificates of BackendTLSPolicies).
    pub config_maps: Store<ConfigMap>,
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
    pub fn set_references(&mut self, references: Arc<References>) {
        self.references = references;
    }

    /// What the current routes use.
    pub fn references(&self) -> &References {
        &self.references
    }

    /// The manifest file an object came from, when known.
    pub fn file_of(&self, key: &ObjectKey) -> Option<&Arc<Path>> {
        struct FileOf<'a>(&'a Index, NsName);
        impl<'a> PerKind for FileOf<'a> {
            type Output = Option<&'a Arc<Path>>;
            fn run<K: Stored>(self) -> Self::Output {
                K::store(self.0).get(&self.1)?.file.as_ref()
            }
        }
        for_kind(key.kind, FileOf(self, key.ns_name()))
    }

    /// Stores a change and says what it means for the snapshot. Re-applying an identical object
    /// (a resync) has no impact.
    pub fn apply(&mut self, change: Change) -> Impact {
        match change {
            Change::Replace { kind, objects } => {
                let keep: BTreeSet<ObjectKey> = objects.iter().map(|(o, _)| o.key()).collect();
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
            Change::Apply { object, file } => object.store_in(self, file),
            Change::Delete(key) => {
                if key.kind == Kind::EndpointSlice {
                    let key = key.ns_name();
                    let old = self.endpoint_slices.get(&key).map(|e| &*e.object);
                    self.slice_owners.moved(&key, old, None);
                }
                struct Remove<'a>(&'a mut Index, NsName);
                impl PerKind for Remove<'_> {
                    type Output = Impact;
                    fn run<K: Stored>(self) -> Impact {
                        let Remove(index, key) = self;
                        let old = K::store_mut(index).remove(&key).map(|e| e.object);
                        K::impact(index, &key, old.as_deref(), None)
                    }
                }
                for_kind(key.kind, Remove(self, key.ns_name()))
            }
        }
    }

    /// Stores one object; the impact of replacing what was stored under its key.
    fn put<K: Stored>(&mut self, key: NsName, object: Arc<K>, file: Option<Arc<Path>>) -> Impact {
        let entry = Entry {
            object: object.clone(),
            file,
        };
        let old = K::store_mut(self).insert(entry);
        K::impact(self, &key, old.as_ref().map(|e| &*e.object), Some(&object))
    }

    fn ingress_impact(
        &self,
        key: &NsName,
        old: Option<&StoredIngress>,
        new: Option<&StoredIngress>,
    ) -> Impact {
        if same_routing(old, new) {
            // Unchanged, or only its status (which duet writes itself) or bookkeeping changed.
            return Impact::default();
        }
        let classes = Classes::new(self.ingress_classes.values().map(|e| &*e.object));
        let was_ours = self.references.ingresses.contains(key)
            || old.is_some_and(|o| self.class.is_ours(o, &classes));
        let is_ours = new.is_some_and(|n| self.class.is_ours(n, &classes));
        if was_ours || is_ours {
            Impact {
                routes: true,
                ingresses: BTreeSet::from([key.clone()]),
                ..Impact::default()
            }
        } else {
            Impact::default()
        }
    }

    fn class_impact(
        &self,
        _: &NsName,
        old: Option<&IngressClass>,
        new: Option<&IngressClass>,
    ) -> Impact {
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

    fn service_impact(
        &self,
        key: &NsName,
        old: Option<&StoredService>,
        new: Option<&StoredService>,
    ) -> Impact {
        if old != new && self.references.services.contains(key) {
            Impact {
                routes: true,
                services: BTreeSet::from([key.clone()]),
                ..Impact::default()
            }
        } else {
            Impact::default()
        }
    }

    fn slice_impact(&self, _: &NsName, old: Option<&Slice>, new: Option<&Slice>) -> Impact {
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
        // What translation reads of a Secret: its type and its data (`stringData` in a
        // manifest); its metadata (labels, annotations, resource version) is not read.
        let same = match (old, new) {
            (Some(a), Some(b)) => {
                a.type_ == b.type_ && a.data == b.data && a.string_data == b.string_data
            }
            (None, None) => true,
            _ => false,
        };
        if !same && self.references.secrets.contains(key) {
            Impact {
                routes: true,
                secrets: BTreeSet::from([key.clone()]),
                ..Impact::default()
            }
        } else {
            Impact::default()
        }
    }

    fn namespace_impact(
        &self,
        _: &NsName,
        old: Option<&Namespace>,
        new: Option<&Namespace>,
    ) -> Impact {
        let labels = |n: Option<&Namespace>| n.and_then(|n| n.metadata.labels.clone());
        if labels(old) != labels(new) && !self.gateways.is_empty() {
            Impact::routes()
        } else {
            Impact::default()
        }
    }

    /// A ConfigMap: its data changed while BackendTLSPolicies exist or a Gateway validates
    /// client certificates (both name their CA certificates' ConfigMaps).
    fn config_map_impact(
        &self,
        _: &NsName,
        old: Option<&ConfigMap>,
        new: Option<&ConfigMap>,
    ) -> Impact {
        let data = |c: Option<&ConfigMap>| c.map(|c| (c.data.clone(), c.binary_data.clone()));
        let named = !self.backend_tls_policies.is_empty()
            || self.gateways.values().any(|g| {
                let tls = g.object.spec.tls.as_ref();
                tls.is_some_and(|t| t.frontend.is_some())
            });
        if data(old) != data(new) && named {
            Impact::routes()
        } else {
            Impact::default()
        }
    }

    /// A Gateway API object: its spec, annotations, labels or age changed (not its status,
    /// which duet writes).
    fn gateway_impact<K: GatewayApiObject>(
        &self,
        _: &NsName,
        old: Option<&K>,
        new: Option<&K>,
    ) -> Impact {
        let routing = |o: Option<&K>| {
            o.map(|o| {
                let m = &o.meta_ref();
                (
                    o.spec_json(),
                    m.annotations.clone(),
                    m.labels.clone(),
                    m.creation_timestamp.clone(),
                    m.generation,
                    m.uid.clone(),
                )
            })
        };
        if routing(old) == routing(new) {
            Impact::default()
        } else {
            Impact::routes()
        }
    }

    /// The Gateway API objects and Namespaces as translation input.
    fn gateway_inputs(&self) -> crate::translate::gateway::GatewayInputs<'_> {
        crate::translate::gateway::GatewayInputs {
            namespaces: self.objects(),
            classes: self.objects(),
            gateways: self.objects(),
            http_routes: self.objects(),
            grpc_routes: self.objects(),
            tls_routes: self.objects(),
            grants: self.objects(),
            listener_sets: self.objects(),
            backend_tls_policies: self.objects(),
            config_maps: self.objects(),
        }
    }

    /// The keys of every stored object of a kind.
    pub fn keys(&self, kind: Kind) -> impl Iterator<Item = ObjectKey> + '_ {
        struct Keys<'a>(&'a Index);
        impl PerKind for Keys<'_> {
            type Output = Vec<ObjectKey>;
            fn run<K: Stored>(self) -> Vec<ObjectKey> {
                K::store(self.0)
                    .keys()
                    .map(|(namespace, name)| ObjectKey::new(K::KIND, namespace, name))
                    .collect()
            }
        }
        for_kind(kind, Keys(self)).into_iter()
    }

    /// The stored EndpointSlices of one Service (labelled with its name, in its namespace).
    pub fn slices_of(&self, service: &NsName) -> Vec<&Slice> {
        self.slice_owners.of(service).iter().map(|s| &**s).collect()
    }

    /// The stored objects of one type.
    fn objects<K: Stored>(&self) -> Vec<&K> {
        K::store(self).values().map(|e| &*e.object).collect()
    }

    /// The stored objects as translation input.
    pub fn inputs(&self) -> Inputs<'_> {
        Inputs {
            ingresses: self.objects(),
            ingress_classes: self.objects(),
            services: Vec::new(),
            stored_services: self.objects(),
            endpoint_slices: Vec::new(),
            stored_slices: self.objects(),
            secrets: self.objects(),
            names: None,
            gateway_api: self.gateway_inputs(),
            // Each store is a Vec in key order (`store`).
            sorted: true,
        }
    }
}

/// A Gateway API kind, as the index compares versions of it.
trait GatewayApiObject {
    fn meta_ref(&self) -> &ObjectMeta;
    fn spec_json(&self) -> Option<serde_json::Value>;
}

macro_rules! gateway_api_object {
    ($($ty:ty),*) => {$(
        impl GatewayApiObject for $ty {
            fn meta_ref(&self) -> &ObjectMeta {
                &self.metadata
            }
            fn spec_json(&self) -> Option<serde_json::Value> {
                serde_json::to_value(&self.spec).ok()
            }
        }
    )*};
}

gateway_api_object!(
    GatewayClass,
    Gateway,
    HttpRoute,
    GrpcRoute,
    TlsRoute,
    ReferenceGrant,
    ListenerSet,
    BackendTlsPolicy
);

/// What of an Ingress translation reads: its spec, annotations and creation time; not its
/// status or resourceVersion, so that a status write does not rebuild routes.
fn same_routing(old: Option<&StoredIngress>, new: Option<&StoredIngress>) -> bool {
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

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Service;
    use k8s_openapi::api::networking::v1::{Ingress, IngressSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn meta(ns: &str, name: &str) -> ObjectMeta {
        ObjectMeta {
            namespace: Some(ns.to_owned()),
            name: Some(name.to_owned()),
            ..Default::default()
        }
    }

    fn ingress(name: &str, class: &str) -> Object {
        Object::Ingress(Arc::new(StoredIngress::from(Ingress {
            metadata: meta("default", name),
            spec: Some(IngressSpec {
                ingress_class_name: Some(class.to_owned()),
                ..Default::default()
            }),
            status: None,
        })))
    }

    fn slice(name: &str, service: &str, address: &str) -> Object {
        let mut m = meta("default", name);
        m.labels = Some(
            [(SERVICE_NAME_LABEL.to_owned(), service.to_owned())]
                .into_iter()
                .collect(),
        );
        Object::EndpointSlice(Arc::new(Slice::from(
            k8s_openapi::api::discovery::v1::EndpointSlice {
                metadata: m,
                address_type: "IPv4".to_owned(),
                endpoints: Some(vec![k8s_openapi::api::discovery::v1::Endpoint {
                    addresses: vec![address.to_owned()],
                    ..Default::default()
                }]),
                ports: None,
            },
        )))
    }

    fn apply(object: Object) -> Change {
        Change::Apply { object, file: None }
    }

    #[test]
    fn keys_default_the_namespace() {
        let mut m = meta("x", "web");
        m.namespace = None;
        let svc = Object::Service(Arc::new(StoredService::from(Service {
            metadata: m.clone(),
            ..Default::default()
        })));
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
        index.set_references(Arc::new(References {
            ingresses: [NsName::new("default", "a")].into_iter().collect(),
            ..Default::default()
        }));
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
        index.set_references(Arc::new(References {
            services: [NsName::new("default", "web")].into_iter().collect(),
            ..Default::default()
        }));
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
            apply(Object::Service(Arc::new(StoredService::from(Service {
                metadata: meta("default", name),
                ..Default::default()
            }))))
        };
        assert!(index.apply(svc("web")).is_empty());
        index.set_references(Arc::new(References {
            services: [NsName::new("default", "web")].into_iter().collect(),
            secrets: [NsName::new("default", "tls")].into_iter().collect(),
            ..Default::default()
        }));
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
    fn service_and_secret_writes_that_change_nothing_read_touch_no_routes() {
        use k8s_openapi::api::core::v1::{ServicePort, ServiceSpec};
        use k8s_openapi::ByteString;
        let mut index = Index::new(ClassConfig::default());
        index.set_references(Arc::new(References {
            services: [NsName::new("default", "web")].into_iter().collect(),
            secrets: [NsName::new("default", "tls")].into_iter().collect(),
            ..Default::default()
        }));
        // As the Service watcher converts what the API sends: a label or annotation change
        // arrives as a new resource version of an otherwise equal stored Service.
        let svc = |version: &str, labels: &[(&str, &str)], port: i32| {
            let mut metadata = meta("default", "web");
            metadata.resource_version = Some(version.to_owned());
            let labels = labels.iter().map(|(k, v)| (k.to_string(), v.to_string()));
            metadata.labels = Some(labels.collect());
            apply(Object::Service(Arc::new(StoredService::from(Service {
                metadata,
                spec: Some(ServiceSpec {
                    ports: Some(vec![ServicePort {
                        name: Some("http".to_owned()),
                        port,
                        ..Default::default()
                    }]),
                    ..Default::default()
                }),
                ..Default::default()
            }))))
        };
        assert!(index.apply(svc("1", &[], 80)).routes);
        assert_eq!(
            index.apply(svc("2", &[("team", "a")], 80)),
            Impact::default()
        );
        assert!(index.apply(svc("3", &[("team", "a")], 8080)).routes);

        let secret = |version: &str, annotation: &str, key: &str| {
            let mut metadata = meta("default", "tls");
            metadata.resource_version = Some(version.to_owned());
            metadata.annotations = Some([("note".to_owned(), annotation.to_owned())].into());
            apply(Object::Secret(Arc::new(Secret {
                metadata,
                type_: Some("kubernetes.io/tls".to_owned()),
                data: Some([("tls.key".to_owned(), ByteString(key.into()))].into()),
                ..Default::default()
            })))
        };
        assert!(index.apply(secret("1", "a", "k1")).routes);
        assert_eq!(index.apply(secret("2", "b", "k1")), Impact::default());
        assert!(index.apply(secret("3", "b", "k2")).routes);
    }

    #[test]
    fn replace_deletes_what_a_relist_no_longer_has() {
        let mut index = Index::new(ClassConfig::default());
        index.set_references(Arc::new(References {
            services: [NsName::new("default", "web")].into_iter().collect(),
            ..Default::default()
        }));
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
