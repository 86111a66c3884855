//! Slimming stored objects: what translation never reads is dropped from each object before it
//! is stored (by the manifest folder source and by the watchers, before the reflector caches it),
//! so that 100,000 pods' EndpointSlices do not keep node names, hostnames, hints, topology and
//! whole object references translation never looks at.
//!
//! What is kept of an EndpointSlice is exactly what [`join_targets`](crate::translate::join_targets)
//! and [`slice_service`](crate::object::slice_service) read: name, namespace, the
//! `kubernetes.io/service-name` label, the address type, each port's name, number and protocol,
//! and each endpoint's first address, `ready` and `terminating` conditions, zone and target
//! identity (the `targetRef` uid when set, else its kind, namespace and name).

use std::any::Any;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::object::SERVICE_NAME_LABEL;

/// Slims `object` when it is of a kind with fields translation never reads (EndpointSlices);
/// other kinds are left as they are.
pub fn slim<K: Any>(object: &mut K) {
    if let Some(slice) = (object as &mut dyn Any).downcast_mut::<EndpointSlice>() {
        slim_slice(slice);
    }
}

/// Keeps of a slice only what translation reads (see the module documentation).
pub fn slim_slice(slice: &mut EndpointSlice) {
    let meta = std::mem::take(&mut slice.metadata);
    let service = meta
        .labels
        .and_then(|mut labels| labels.remove_entry(SERVICE_NAME_LABEL));
    slice.metadata = ObjectMeta {
        name: meta.name,
        namespace: meta.namespace,
        labels: service.map(|entry| [entry].into_iter().collect()),
        ..ObjectMeta::default()
    };
    for port in slice.ports.iter_mut().flatten() {
        port.app_protocol = None;
    }
    if let Some(endpoints) = slice.endpoints.as_mut() {
        for endpoint in endpoints.iter_mut() {
            slim_endpoint(endpoint);
        }
        endpoints.shrink_to_fit();
    }
}

fn slim_endpoint(endpoint: &mut Endpoint) {
    endpoint.addresses.truncate(1);
    endpoint.addresses.shrink_to_fit();
    endpoint.conditions = endpoint.conditions.take().map(|c| EndpointConditions {
        ready: c.ready,
        terminating: c.terminating,
        serving: None,
    });
    endpoint.deprecated_topology = None;
    endpoint.hints = None;
    endpoint.hostname = None;
    endpoint.node_name = None;
    endpoint.target_ref = endpoint.target_ref.take().map(|r| {
        if r.uid.as_deref().is_some_and(|u| !u.is_empty()) {
            ObjectReference {
                uid: r.uid,
                ..ObjectReference::default()
            }
        } else {
            ObjectReference {
                kind: r.kind,
                namespace: r.namespace,
                name: r.name,
                ..ObjectReference::default()
            }
        }
    });
}
