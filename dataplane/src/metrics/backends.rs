//! Ready targets of each Service in the live snapshot, by kind (dual, IPv4 only, IPv6 only),
//! labelled by the backend's typed namespace and Service.

use std::collections::HashMap;
use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family as Series;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::Metrics;
use crate::table::{Backend, BackendId, Snapshot};

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

/// A Service's ready targets by kind, from its backend with the most targets: several ports of
/// one Service are several backends over the same pods, counted once.
type PerService<'a> = HashMap<(&'a Arc<str>, &'a Arc<str>), [i64; 3]>;

/// Adds one backend's targets by kind to its Service's count.
fn count<'a>(per_service: &mut PerService<'a>, backend: &'a Backend) {
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

impl Metrics {
    pub(super) fn set_backend_targets(&self, snapshot: &Snapshot) {
        let mut per_service = PerService::new();
        for backend in snapshot.backends.values() {
            count(&mut per_service, backend);
        }
        self.backends.backend_targets.clear();
        self.put_backend_targets(per_service);
    }

    /// Records that the backends `changed` of `snapshot` were replaced (every other one is as
    /// before): sets the target counts of their Services, and the snapshot's version and time.
    /// `changed` names every backend of each Service it touches.
    pub fn backends_replaced(&self, snapshot: &Snapshot, changed: &[BackendId]) {
        self.snapshot_applied(snapshot, false, false);
        let mut per_service = PerService::new();
        for backend in changed.iter().filter_map(|id| snapshot.backends.get(id)) {
            count(&mut per_service, backend);
        }
        self.put_backend_targets(per_service);
    }

    fn put_backend_targets(&self, per_service: PerService<'_>) {
        let series = &self.backends.backend_targets;
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
