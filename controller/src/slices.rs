//! Which stored EndpointSlices belong to which Service, kept as slices come, move and go, so that
//! an endpoint-only rebuild reads the slices of the Services that changed and no other.

use std::collections::BTreeMap;

use crate::compact::Slice;
use crate::object::{slice_service, NsName};

/// The EndpointSlice names of each Service (by its `kubernetes.io/service-name` label), sorted.
/// A Service has few slices (one per family and 100 endpoints): a sorted `Vec` of them costs
/// their names, where a `BTreeSet` would cost a 544-byte node per Service. A slice's namespace
/// is its Service's (the label names a Service of the slice's namespace), so only names are
/// kept: 16 bytes a slice where a key is 48 and a namespace string of its own.
#[derive(Debug, Default)]
pub struct SliceOwners(BTreeMap<NsName, Vec<Box<str>>>);

impl SliceOwners {
    /// Records that the slice `key`, stored as `old` (if any), is now `new` (`None`: deleted).
    pub fn moved(&mut self, key: &NsName, old: Option<&Slice>, new: Option<&Slice>) {
        if let Some(service) = old.and_then(slice_service) {
            if let Some(slices) = self.0.get_mut(&service) {
                if let Ok(at) = slices.binary_search_by(|s| (**s).cmp(&key.name)) {
                    slices.remove(at);
                }
                if slices.is_empty() {
                    self.0.remove(&service);
                }
            }
        }
        if let Some(service) = new.and_then(slice_service) {
            let slices = self.0.entry(service).or_default();
            if let Err(at) = slices.binary_search_by(|s| (**s).cmp(&key.name)) {
                slices.reserve_exact(1);
                slices.insert(at, key.name.as_str().into());
            }
        }
    }

    /// The keys of `service`'s slices.
    pub fn of<'a>(&'a self, service: &'a NsName) -> impl Iterator<Item = NsName> + 'a {
        let names = self.0.get(service).into_iter().flatten();
        names.map(|name| NsName::new(service.namespace.as_str(), &**name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::discovery::v1::EndpointSlice;

    fn slice(name: &str, service: &str) -> Slice {
        let yaml = format!("metadata: {{name: {name}, namespace: ns, labels: {{kubernetes.io/service-name: {service}}}}}\naddressType: IPv4\n");
        Slice::from(serde_saphyr::from_str::<EndpointSlice>(&yaml).expect("a slice"))
    }

    fn of(owners: &SliceOwners, service: &str) -> Vec<String> {
        let service = NsName::new("ns", service);
        owners.of(&service).map(|k| k.name.clone()).collect()
    }

    #[test]
    fn slices_come_move_and_go() {
        let mut owners = SliceOwners::default();
        let key = |name: &str| NsName::new("ns", name);
        for name in ["web-b", "web-a", "web-c"] {
            owners.moved(&key(name), None, Some(&slice(name, "web")));
        }
        // Stored again (a resync): once.
        let a = slice("web-a", "web");
        owners.moved(&key("web-a"), Some(&a), Some(&a));
        assert_eq!(of(&owners, "web"), ["web-a", "web-b", "web-c"]);
        // Relabelled to another Service.
        owners.moved(
            &key("web-b"),
            Some(&slice("web-b", "web")),
            Some(&slice("web-b", "api")),
        );
        assert_eq!(of(&owners, "web"), ["web-a", "web-c"]);
        assert_eq!(of(&owners, "api"), ["web-b"]);
        // Deleted.
        owners.moved(&key("web-b"), Some(&slice("web-b", "api")), None);
        assert!(of(&owners, "api").is_empty());
        assert_eq!(owners.0.len(), 1, "a Service without slices is forgotten");
    }
}
