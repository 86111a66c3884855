//! Which stored EndpointSlices belong to which Service, kept as slices come, move and go, so that
//! an endpoint-only rebuild reads the slices of the Services that changed and no other.

use std::collections::HashMap;
use std::sync::Arc;

use crate::compact::{Slice, SliceView};
use crate::object::{slice_service, NsName};

/// The stored EndpointSlices of each Service (by its `kubernetes.io/service-name` label), sorted
/// by name: the store's own `Arc`s, so that a backend phase reads a Service's slices with one
/// hash lookup (it made a key and searched the store for each slice: 9 ms of CPU for the 10,000
/// Services of the 10k-Ingress size). A Service has few slices (one per family and 100 endpoints):
/// a sorted `Vec` of them costs 8 bytes a slice. Hashed with foldhash (seeded per process): the
/// map is only looked up, never walked.
#[derive(Debug, Default)]
pub struct SliceOwners(HashMap<NsName, Vec<Arc<Slice>>, foldhash::fast::RandomState>);

impl SliceOwners {
    /// Records that the slice `key`, stored as `old` (if any), is now `new` (`None`: deleted).
    pub fn moved(&mut self, key: &NsName, old: Option<&Slice>, new: Option<&Arc<Slice>>) {
        let at = |slices: &[Arc<Slice>]| slices.binary_search_by(|s| s.name().cmp(&key.name));
        if let Some(service) = old.and_then(slice_service) {
            if let Some(slices) = self.0.get_mut(&service) {
                if let Ok(at) = at(slices) {
                    slices.remove(at);
                }
                if slices.is_empty() {
                    self.0.remove(&service);
                }
            }
        }
        if let Some(new) = new {
            if let Some(service) = slice_service(&**new) {
                let slices = self.0.entry(service).or_default();
                match at(slices) {
                    Ok(at) => slices[at] = new.clone(),
                    Err(at) => {
                        slices.reserve_exact(1);
                        slices.insert(at, new.clone());
                    }
                }
            }
        }
    }

    /// The slices of `service`, by name.
    pub fn of(&self, service: &NsName) -> &[Arc<Slice>] {
        self.0.get(service).map_or(&[], Vec::as_slice)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::discovery::v1::EndpointSlice;

    fn slice(name: &str, service: &str) -> Arc<Slice> {
        let yaml = format!("metadata: {{name: {name}, namespace: ns, labels: {{kubernetes.io/service-name: {service}}}}}\naddressType: IPv4\n");
        Arc::new(Slice::from(
            serde_saphyr::from_str::<EndpointSlice>(&yaml).expect("a slice"),
        ))
    }

    fn of(owners: &SliceOwners, service: &str) -> Vec<String> {
        let service = NsName::new("ns", service);
        let slices = owners.of(&service).iter();
        slices.map(|s| s.name().to_owned()).collect()
    }

    #[test]
    fn slices_come_move_and_go() {
        let mut owners = SliceOwners::default();
        let key = |name: &str| NsName::new("ns", name);
        for name in ["web-b", "web-a", "web-c"] {
            owners.moved(&key(name), None, Some(&slice(name, "web")));
        }
        // Stored again (a resync): once, and the Service reads the object stored last.
        let a = slice("web-a", "web");
        owners.moved(&key("web-a"), Some(&slice("web-a", "web")), Some(&a));
        assert_eq!(of(&owners, "web"), ["web-a", "web-b", "web-c"]);
        let web = owners.of(&key("web"));
        assert!(Arc::ptr_eq(&web[0], &a), "the slice stored last is read");
        // Relabelled to another Service.
        owners.moved(
            &key("web-b"),
            Some(&*slice("web-b", "web")),
            Some(&slice("web-b", "api")),
        );
        assert_eq!(of(&owners, "web"), ["web-a", "web-c"]);
        assert_eq!(of(&owners, "api"), ["web-b"]);
        // Deleted.
        owners.moved(&key("web-b"), Some(&*slice("web-b", "api")), None);
        assert!(of(&owners, "api").is_empty());
        assert_eq!(owners.0.len(), 1, "a Service without slices is forgotten");
    }
}
