//! Ready targets of each Service in the live snapshot, by kind (dual, IPv4 only, IPv6 only),
//! labelled by the backend's typed namespace and Service, encoded as a `Family` of gauges would
//! be. Counted when scraped, from the snapshot the series holds: a publish only swaps a pointer.
//! Counting at publish walked every target of every backend (100,000 at the 10k-Ingress size, long
//! out of cache by then) on the apply's critical path, for a figure read once per scrape.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use prometheus_client::encoding::{EncodeLabelSet, EncodeMetric, MetricEncoder};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use super::services::FastState;
use super::Metrics;
use crate::table::{Backend, Snapshot};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TargetLabels {
    namespace: Arc<str>,
    service: Arc<str>,
    kind: &'static str,
}

const KINDS: [&str; 3] = ["dual", "ipv4_only", "ipv6_only"];

/// A Service's targets by kind, in the order of [`KINDS`].
type Kinds = [i64; 3];

/// The live snapshot, whose targets by kind are counted when scraped.
#[derive(Clone, Debug, Default)]
struct TargetSeries {
    live: Arc<RwLock<Option<Arc<Snapshot>>>>,
}

impl TargetSeries {
    fn live(&self) -> Option<Arc<Snapshot>> {
        self.live.read().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl EncodeMetric for TargetSeries {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let Some(snapshot) = self.live() else {
            return Ok(());
        };
        let mut per_service =
            PerService::with_capacity_and_hasher(snapshot.backends.len(), FastState::default());
        for backend in snapshot.backends.values() {
            count(&mut per_service, backend);
        }
        for ((namespace, service), kinds) in per_service {
            for (kind, n) in KINDS.into_iter().zip(kinds) {
                let labels = TargetLabels {
                    namespace: namespace.clone(),
                    service: service.clone(),
                    kind,
                };
                encoder.encode_family(&labels)?.encode_gauge(&n)?;
            }
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Gauge
    }

    fn is_empty(&self) -> bool {
        self.live().is_none_or(|s| s.backends.is_empty())
    }
}

/// The family of targets by kind.
#[derive(Clone, Debug)]
pub(super) struct BackendFamilies {
    backend_targets: TargetSeries,
}

impl BackendFamilies {
    pub(super) fn register(registry: &mut Registry) -> BackendFamilies {
        let f = BackendFamilies {
            backend_targets: TargetSeries::default(),
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
type PerService<'a> = HashMap<(&'a Arc<str>, &'a Arc<str>), Kinds, FastState>;

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
    /// `snapshot` is live: `duet_backend_targets` counts its targets from now on.
    pub fn set_backend_targets(&self, snapshot: &Arc<Snapshot>) {
        let live = &self.backends.backend_targets.live;
        *live.write().unwrap_or_else(|e| e.into_inner()) = Some(snapshot.clone());
    }
}

#[cfg(test)]
mod tests {
    use prometheus_client::metrics::family::Family as Series;
    use prometheus_client::metrics::gauge::Gauge;

    use super::*;
    use crate::table::{Target, TargetId};

    use crate::metrics::sorted_exposition as encode;

    fn backend(id: &str, dual: usize, v4: usize, v6: usize) -> Arc<Backend> {
        let addr = |n: usize, v6: bool| {
            let ip = if v6 {
                format!("[fd00::{n}]")
            } else {
                format!("10.0.0.{n}")
            };
            format!("{ip}:80").parse::<std::net::SocketAddr>().unwrap()
        };
        let mut targets = Vec::new();
        for n in 0..dual + v4 + v6 {
            let four = (n < dual + v4).then(|| addr(n, false));
            let six = (n < dual || n >= dual + v4).then(|| addr(n, true));
            let id = TargetId(format!("t{n}").into());
            targets.push(Target::with_addrs(id, four.into_iter().chain(six), None));
        }
        Arc::new(Backend {
            id: id.parse().unwrap(),
            targets: targets.into(),
            lb: Default::default(),
            protocol: Default::default(),
        })
    }

    fn snapshot(backends: &[&Arc<Backend>]) -> Arc<Snapshot> {
        let mut snapshot = Snapshot::default();
        for b in backends {
            snapshot.backends.insert(b.id.clone(), Arc::clone(b));
        }
        Arc::new(snapshot)
    }

    /// `duet_backend_targets` as a `Family` of gauges set the way duet set it before.
    fn reference(registry: &mut Registry, counts: &[(&str, &str, Kinds)]) {
        let family = Series::<TargetLabels, Gauge>::default();
        registry.register(
            "duet_backend_targets",
            "Ready targets (pods) of a Service in the live snapshot, by kind: dual, ipv4_only, ipv6_only",
            family.clone(),
        );
        for (namespace, service, kinds) in counts {
            for (kind, n) in KINDS.into_iter().zip(kinds) {
                let labels = TargetLabels {
                    namespace: Arc::from(*namespace),
                    service: Arc::from(*service),
                    kind,
                };
                family.get_or_create(&labels).set(*n);
            }
        }
    }

    fn exposed(registry: &Registry) -> Vec<String> {
        encode(registry)
            .into_iter()
            .filter(|l| l.contains("duet_backend_targets"))
            .collect()
    }

    #[test]
    fn targets_by_service_as_a_family_of_gauges_shows_them() {
        let mut registry = Registry::default();
        let metrics = Metrics::register(&mut registry);
        let api = backend("shop/api:80", 2, 1, 0);
        // A second port of the same Service, fewer ready targets: the larger counts.
        let api_admin = backend("shop/api:9090", 1, 0, 0);
        let web = backend("shop/web:80", 0, 0, 3);
        let db = backend("data/db:5432", 1, 0, 1);
        metrics.set_backend_targets(&snapshot(&[&api, &api_admin, &web, &db]));
        let expect = |counts: &[(&str, &str, Kinds)]| {
            let mut r = Registry::default();
            reference(&mut r, counts);
            encode(&r)
        };
        assert_eq!(
            exposed(&registry),
            expect(&[
                ("shop", "api", [2, 1, 0]),
                ("shop", "web", [0, 0, 3]),
                ("data", "db", [1, 0, 1]),
            ])
        );

        // An endpoint-only change of web: only its counts move.
        let web2 = backend("shop/web:80", 1, 0, 0);
        let next = snapshot(&[&api, &api_admin, &web2, &db]);
        metrics.set_backend_targets(&next);
        assert_eq!(
            exposed(&registry),
            expect(&[
                ("shop", "api", [2, 1, 0]),
                ("shop", "web", [1, 0, 0]),
                ("data", "db", [1, 0, 1]),
            ])
        );

        // A full apply without db: its series leave the exposition.
        metrics.set_backend_targets(&snapshot(&[&api, &web2]));
        assert_eq!(
            exposed(&registry),
            expect(&[("shop", "api", [2, 1, 0]), ("shop", "web", [1, 0, 0])])
        );
        // No backends at all: no HELP or TYPE either, as an empty family.
        metrics.set_backend_targets(&Arc::default());
        assert_eq!(exposed(&registry), expect(&[]));
    }
}
