//! Clients the rate-limit zones forgot to stay within their bounds, by client family and by the
//! bound that was reached.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family as Series;
use prometheus_client::registry::Registry;

use super::{slot, Metrics, FAMILIES};
use crate::table::Family;

/// The bound a rate-limit zone reached when it forgot a client (the `bound` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EvictionBound {
    /// The zone (one Ingress) held as many clients as a zone may.
    Zone,
    /// All zones together held as many clients as the process may.
    Total,
}

impl EvictionBound {
    const ALL: [EvictionBound; 2] = [EvictionBound::Zone, EvictionBound::Total];

    fn label(self) -> &'static str {
        match self {
            EvictionBound::Zone => "zone",
            EvictionBound::Total => "total",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EvictionLabels {
    client_family: &'static str,
    bound: &'static str,
}

/// The eviction counter's series, one handle per bound and family (an eviction bumps an atomic).
#[derive(Clone, Debug)]
pub(super) struct RateLimitFamilies {
    evictions: [[Counter; 2]; 2],
}

impl RateLimitFamilies {
    pub(super) fn register(registry: &mut Registry) -> RateLimitFamilies {
        let series = Series::<EvictionLabels, Counter>::default();
        let handles = EvictionBound::ALL.map(|bound| {
            FAMILIES.map(|family| {
                series
                    .get_or_create(&EvictionLabels {
                        client_family: family.as_str(),
                        bound: bound.label(),
                    })
                    .clone()
            })
        });
        registry.register(
            "duet_rate_limit_evictions",
            "Clients a rate-limit zone forgot, least recently seen first, to make room for a new one, by client address family and the bound reached: zone (the clients one Ingress's zone may hold) or total (the clients all zones together may hold)",
            series,
        );
        RateLimitFamilies { evictions: handles }
    }
}

impl Metrics {
    /// Counts a client forgotten by a rate-limit zone.
    pub fn rate_limit_evicted(&self, family: Family, bound: EvictionBound) {
        self.rate_limit.evictions[bound as usize][slot(family)].inc();
    }

    /// Clients of a family forgotten so far at a bound.
    pub fn rate_limit_evictions(&self, family: Family, bound: EvictionBound) -> u64 {
        self.rate_limit.evictions[bound as usize][slot(family)].get()
    }
}
