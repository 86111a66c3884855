//! `--watch-namespace` as Kubernetes APIs: one API of a namespaced kind per watched namespace,
//! or one over the cluster when none is given. The source's watchers and the Gateway
//! controllers both watch through these.

use k8s_openapi::NamespaceResourceScope;
use kube::api::{ApiResource, DynamicObject};
use kube::{Api, Client, Resource};

/// One API of `K` per watched namespace, or one for all namespaces when none is given.
pub fn apis<K>(client: &Client, namespaces: &[String]) -> Vec<Api<K>>
where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope>,
{
    if namespaces.is_empty() {
        vec![Api::all(client.clone())]
    } else {
        namespaces
            .iter()
            .map(|ns| Api::namespaced(client.clone(), ns))
            .collect()
    }
}

/// The same for a kind read as `DynamicObject`s.
pub fn dynamic_apis(
    client: &Client,
    namespaces: &[String],
    ar: &ApiResource,
) -> Vec<Api<DynamicObject>> {
    if namespaces.is_empty() {
        vec![Api::all_with(client.clone(), ar)]
    } else {
        namespaces
            .iter()
            .map(|ns| Api::namespaced_with(client.clone(), ns, ar))
            .collect()
    }
}
