//! The Gateway controllers' reach under `--watch-namespace`: with one API (and so one watch and
//! one reflector store) per watched namespace ([`crate::namespaces`]), the stores of one kind
//! read as one. A store per namespace, because a relist replaces a store's whole content:
//! namespaces sharing one would wipe each other's objects.

use std::fmt::Debug;
use std::hash::Hash;
use std::sync::Arc;

use kube::runtime::reflector::{ObjectRef, Store};
use kube::Resource;
use serde::de::DeserializeOwned;

/// Reflector stores of one kind, one per API, read as one.
#[derive(Clone)]
pub struct Stores<K: Resource + 'static>(pub Vec<Store<K>>)
where
    K::DynamicType: Eq + Hash + Clone;

impl<K: Resource + Clone + 'static> Debug for Stores<K>
where
    K::DynamicType: Eq + Hash + Clone,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let sizes: Vec<usize> = self.0.iter().map(|s| s.state().len()).collect();
        f.debug_tuple("Stores").field(&sizes).finish()
    }
}

impl<K> Stores<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone,
{
    /// Every object of every store.
    pub fn state(&self) -> Vec<Arc<K>> {
        self.0.iter().flat_map(Store::state).collect()
    }

    /// The object, from whichever store holds it.
    pub fn get(&self, key: &ObjectRef<K>) -> Option<Arc<K>> {
        self.0.iter().find_map(|s| s.get(key))
    }

    /// Waits until every store has listed once (a store whose writer is gone never does: those
    /// are not waited for).
    pub async fn wait_until_ready(&self) {
        futures_util::future::join_all(self.0.iter().map(Store::wait_until_ready)).await;
    }
}
