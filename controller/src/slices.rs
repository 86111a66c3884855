//! Which stored EndpointSlices belong to which Service, kept as slices come, move and go, so that
//! an endpoint-only rebuild reads the slices of the Services that changed and no other.

use std::collections::{BTreeMap, BTreeSet};

use crate::compact::Slice;
use crate::object::{slice_service, NsName};

/// The EndpointSlice keys of each Service (by its `kubernetes.io/service-name` label).
#[derive(Debug, Default)]
pub struct SliceOwners(BTreeMap<NsName, BTreeSet<NsName>>);

impl SliceOwners {
    /// Records that the slice `key`, stored as `old` (if any), is now `new` (`None`: deleted).
    pub fn moved(&mut self, key: &NsName, old: Option<&Slice>, new: Option<&Slice>) {
        if let Some(service) = old.and_then(slice_service) {
            if let Some(slices) = self.0.get_mut(&service) {
                slices.remove(key);
                if slices.is_empty() {
                    self.0.remove(&service);
                }
            }
        }
        if let Some(service) = new.and_then(slice_service) {
            self.0.entry(service).or_default().insert(key.clone());
        }
    }

    /// The keys of `service`'s slices.
    pub fn of(&self, service: &NsName) -> impl Iterator<Item = &NsName> {
        self.0.get(service).into_iter().flatten()
    }
}
