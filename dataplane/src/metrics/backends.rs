//! Ready targets of each Service in the live snapshot, by kind (dual, IPv4 only, IPv6 only),
//! labelled by the backend's typed namespace and Service.

use std::collections::HashMap;
use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family as Series;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::Metrics;
use crate::table::Snapshot;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TargetLabels {
    namespace: Arc<str>,
    service: Arc<str>,
    kind: &'static str,
}

/// The family of targets by kind.
#[derive(Clone, Debug)]
pub(super) struct BackendFamilies {
    backend_targets: Series<TargetLabels, Gauge>,
}

impl BackendFamilies {
    pub(super) fn register(registry: &mut Registry) -> BackendFamilies {
        let f = BackendFamilies {
            backend_targets: Series::default(),
        };
        registry.register(
            "duet_backend_targets",
            "Ready targets (pods) of a Service in the live snapshot, by kind: dual, ipv4_only, ipv6_only",
            f.backend_targets.clone(),
        );
        f
    }
}

impl Metrics {
    pub(super) fn set_backend_targets(&self, snapshot: &Snapshot) {
        // Several ports of one Service are several backends over the same pods: count the
        // Service once, by its backend with the most targets.
        let mut per_service: HashMap<(&Arc<str>, &Arc<str>), [i64; 3]> = HashMap::new();
        for backend in snapshot.backends.values() {
            let mut kinds = [0i64; 3];
            for t in backend.targets.iter() {
                match (t.v4.is_some(), t.v6.is_some()) {
                    (true, true) => kinds[0] += 1,
                    (true, false) => kinds[1] += 1,
                    (false, true) => kinds[2] += 1,
                    (false, false) => {}
                }
            }
            let service = (backend.id.namespace(), backend.id.service());
            let entry = per_service.entry(service).or_default();
            if kinds.iter().sum::<i64>() >= entry.iter().sum::<i64>() {
                *entry = kinds;
            }
        }
        let series = &self.backends.backend_targets;
        series.clear();
        for ((namespace, service), kinds) in per_service {
            for (kind, n) in ["dual", "ipv4_only", "ipv6_only"].into_iter().zip(kinds) {
                let labels = TargetLabels {
                    namespace: namespace.clone(),
                    service: service.clone(),
                    kind,
                };
                series.get_or_create(&labels).set(n);
            }
        }
    }
}
