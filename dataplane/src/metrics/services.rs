//! The per-Service upstream counters (connect failures, family fallbacks, ejections by family):
//! one entry per Service holding its six counters, shared by every route to that Service and
//! kept across snapshots, exposed as the three families `duet_upstream_connect_failures_total`,
//! `duet_family_fallbacks_total` and `duet_target_family_ejections_total` with the labels a
//! `Family` of each would show. One map insert per Service instead of six `Family` inserts per
//! route (each hashing its label set with SipHash): the first snapshot at 10,000 Services made
//! 120,000 label lookups here.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use prometheus_client::encoding::{EncodeLabelSet, EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;

use super::{slot, FAMILIES};

/// The hasher of maps keyed by names from the cluster's objects (never from a client): fast,
/// seeded per process.
pub(crate) type FastState = foldhash::fast::RandomState;

/// A map with [`FastState`].
pub(crate) type FastMap<K, V> = HashMap<K, V, FastState>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ServiceFamilyLabels {
    service: Arc<str>,
    family: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FallbackLabels {
    service: Arc<str>,
    from: &'static str,
    to: &'static str,
}

/// Counters of one Service, indexed by family slot: six atomics in the one allocation of the
/// Service's entry (a `prometheus-client` `Counter` is an `Arc` of its own: six more
/// allocations per Service, 60,000 at the 10k-Ingress size).
#[derive(Debug, Default)]
pub(super) struct ServiceCounters {
    pub(super) connect_failures: [Count; 2],
    /// Indexed by the family used; the preferred one is the other.
    pub(super) fallbacks: [Count; 2],
    pub(super) ejections: [Count; 2],
}

/// One counter of a Service, encoded as a `Counter` is.
#[derive(Debug, Default)]
pub(super) struct Count(AtomicU64);

impl Count {
    pub(super) fn inc(&self) {
        self.inc_by(1);
    }

    pub(super) fn inc_by(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }

    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        encoder.encode_counter::<NoLabelSet, _, u64>(&self.0.load(Ordering::Relaxed), None)
    }
}

type ByService = FastMap<Arc<str>, Arc<ServiceCounters>>;

/// The counters of every routed Service.
#[derive(Clone, Debug, Default)]
pub(super) struct ServiceSeries {
    by_service: Arc<RwLock<ByService>>,
}

impl ServiceSeries {
    /// The counters of `service`, made (at zero) when it has none.
    pub(super) fn get_or_create(&self, service: &Arc<str>) -> Arc<ServiceCounters> {
        let read = self.by_service.read().unwrap_or_else(|e| e.into_inner());
        if let Some(counters) = read.get(service) {
            return counters.clone();
        }
        drop(read);
        let mut write = self.by_service.write().unwrap_or_else(|e| e.into_inner());
        write.entry(service.clone()).or_default().clone()
    }

    /// Removes the series of `service` from the exposition.
    pub(super) fn remove(&self, service: &str) {
        let mut write = self.by_service.write().unwrap_or_else(|e| e.into_inner());
        write.remove(service);
    }

    /// The exposed family of one of the three counters.
    pub(super) fn family(&self, kind: CounterKind) -> ServiceFamily {
        ServiceFamily {
            series: self.clone(),
            kind,
        }
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.by_service.read().unwrap().len()
    }
}

/// Which counter of a Service a [`ServiceFamily`] exposes.
#[derive(Clone, Copy, Debug)]
pub(super) enum CounterKind {
    ConnectFailures,
    Fallbacks,
    Ejections,
}

/// One counter of every Service, encoded as a `Family` of counters by label set would be.
#[derive(Debug)]
pub(super) struct ServiceFamily {
    series: ServiceSeries,
    kind: CounterKind,
}

impl ServiceFamily {
    fn encode_service(
        &self,
        encoder: &mut MetricEncoder,
        service: &Arc<str>,
        counters: &ServiceCounters,
    ) -> Result<(), std::fmt::Error> {
        for family in FAMILIES {
            let k = slot(family);
            let service = service.clone();
            let from = family.other().as_str();
            let family = family.as_str();
            match self.kind {
                CounterKind::ConnectFailures => {
                    let labels = ServiceFamilyLabels { service, family };
                    counters.connect_failures[k].encode(encoder.encode_family(&labels)?)?;
                }
                CounterKind::Ejections => {
                    let labels = ServiceFamilyLabels { service, family };
                    counters.ejections[k].encode(encoder.encode_family(&labels)?)?;
                }
                CounterKind::Fallbacks => {
                    let labels = FallbackLabels {
                        service,
                        from,
                        to: family,
                    };
                    counters.fallbacks[k].encode(encoder.encode_family(&labels)?)?;
                }
            }
        }
        Ok(())
    }
}

impl EncodeMetric for ServiceFamily {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let by_service = self
            .series
            .by_service
            .read()
            .unwrap_or_else(|e| e.into_inner());
        for (service, counters) in by_service.iter() {
            self.encode_service(&mut encoder, service, counters)?;
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Counter
    }

    fn is_empty(&self) -> bool {
        let by_service = self
            .series
            .by_service
            .read()
            .unwrap_or_else(|e| e.into_inner());
        by_service.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use prometheus_client::metrics::counter::Counter;
    use prometheus_client::metrics::family::Family as Series;
    use prometheus_client::registry::Registry;

    use super::*;
    use crate::table::Family;

    use crate::metrics::sorted_exposition as encode;

    /// The three families as `prometheus-client` `Family`s of counters, as duet had them.
    struct Reference {
        connect_failures: Series<ServiceFamilyLabels, Counter>,
        fallbacks: Series<FallbackLabels, Counter>,
        ejections: Series<ServiceFamilyLabels, Counter>,
    }

    const NAMES: [(&str, &str); 3] = [
        ("duet_upstream_connect_failures", "connect failures"),
        ("duet_family_fallbacks", "fallbacks"),
        ("duet_target_family_ejections", "ejections"),
    ];

    fn reference(registry: &mut Registry) -> Reference {
        let r = Reference {
            connect_failures: Series::default(),
            fallbacks: Series::default(),
            ejections: Series::default(),
        };
        registry.register(NAMES[0].0, NAMES[0].1, r.connect_failures.clone());
        registry.register(NAMES[1].0, NAMES[1].1, r.fallbacks.clone());
        registry.register(NAMES[2].0, NAMES[2].1, r.ejections.clone());
        r
    }

    fn ours(registry: &mut Registry) -> ServiceSeries {
        let series = ServiceSeries::default();
        let kinds = [
            CounterKind::ConnectFailures,
            CounterKind::Fallbacks,
            CounterKind::Ejections,
        ];
        for ((name, help), kind) in NAMES.into_iter().zip(kinds) {
            registry.register(name, help, series.family(kind));
        }
        series
    }

    impl Reference {
        /// Creates the six series of `service` as `RouteMetrics::new` did.
        fn create(&self, service: &Arc<str>) {
            for f in FAMILIES {
                let labels = ServiceFamilyLabels {
                    service: service.clone(),
                    family: f.as_str(),
                };
                self.connect_failures.get_or_create_owned(&labels);
                self.ejections.get_or_create_owned(&labels);
                self.fallbacks.get_or_create_owned(&FallbackLabels {
                    service: service.clone(),
                    from: f.other().as_str(),
                    to: f.as_str(),
                });
            }
        }

        fn get(&self, service: &Arc<str>, f: Family) -> [Counter; 3] {
            let labels = ServiceFamilyLabels {
                service: service.clone(),
                family: f.as_str(),
            };
            let fallback = FallbackLabels {
                service: service.clone(),
                from: f.other().as_str(),
                to: f.as_str(),
            };
            [
                self.connect_failures.get_or_create_owned(&labels),
                self.fallbacks.get_or_create_owned(&fallback),
                self.ejections.get_or_create_owned(&labels),
            ]
        }

        fn remove(&self, service: &Arc<str>) {
            for f in FAMILIES {
                let labels = ServiceFamilyLabels {
                    service: service.clone(),
                    family: f.as_str(),
                };
                self.connect_failures.remove(&labels);
                self.ejections.remove(&labels);
                self.fallbacks.remove(&FallbackLabels {
                    service: service.clone(),
                    from: f.other().as_str(),
                    to: f.as_str(),
                });
            }
        }
    }

    #[test]
    fn exposition_equals_that_of_label_set_families() {
        let (mut theirs, mut mine) = (Registry::default(), Registry::default());
        let reference = reference(&mut theirs);
        let series = ours(&mut mine);
        assert_eq!(encode(&theirs), encode(&mine), "empty: no HELP or TYPE");

        let services: Vec<Arc<str>> = ["api", "web", "a\"b\\c"].map(Arc::from).into();
        for (n, service) in services.iter().enumerate() {
            reference.create(service);
            let counters = series.get_or_create(service);
            for f in FAMILIES {
                let k = slot(f);
                let theirs = reference.get(service, f);
                // Different counts per family, counter and Service.
                for (i, (counter, theirs)) in [
                    &counters.connect_failures[k],
                    &counters.fallbacks[k],
                    &counters.ejections[k],
                ]
                .into_iter()
                .zip(theirs)
                .enumerate()
                {
                    let times = (n * 6 + k * 3 + i) as u64;
                    counter.inc_by(times);
                    theirs.inc_by(times);
                }
            }
        }
        assert_eq!(encode(&theirs), encode(&mine));
        assert!(
            encode(&mine)
                .iter()
                .any(|l| l
                    == r#"duet_family_fallbacks_total{service="web",from="ipv4",to="ipv6"} 10"#)
        );

        // The same counters again: no new series, the counts kept.
        assert!(Arc::ptr_eq(
            &series.get_or_create(&services[1]),
            &series.get_or_create(&Arc::from("web"))
        ));
        series.remove("web");
        reference.remove(&services[1]);
        assert_eq!(encode(&theirs), encode(&mine));
        assert!(!encode(&mine).iter().any(|l| l.contains("\"web\"")));
        // A Service routed again starts from zero, as a removed label set does.
        series.get_or_create(&services[1]);
        reference.create(&services[1]);
        assert_eq!(encode(&theirs), encode(&mine));
        assert_eq!(series.len(), 3);

        for service in &services {
            series.remove(service);
            reference.remove(service);
        }
        assert_eq!(encode(&theirs), encode(&mine), "empty again");
    }
}
