//! Requests by HTTP version and client family, one counter per pair: the per-route series stay
//! as they are (a `protocol` label there would multiply each of them by the protocols served).

use http::Version;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family as Series;
use prometheus_client::registry::Registry;

use super::{slot, Metrics, FAMILIES};
use crate::table::Family;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProtocolLabels {
    protocol: &'static str,
    client_family: &'static str,
}

/// The `protocol` label values, by [`protocol_index`].
const PROTOCOLS: [&str; 4] = ["HTTP/1.0", "HTTP/1.1", "HTTP/2", "HTTP/3"];

/// The bounded index of a request's HTTP version in [`PROTOCOLS`] (HTTP/0.9, which no listener
/// accepts, would count as HTTP/1.0).
pub fn protocol_index(version: Version) -> u8 {
    match version {
        Version::HTTP_11 => 1,
        Version::HTTP_2 => 2,
        Version::HTTP_3 => 3,
        _ => 0,
    }
}

/// The family of requests by protocol: a handle per protocol and client family, made at start.
#[derive(Clone, Debug)]
pub(super) struct ProtocolFamilies {
    requests: [[Counter; 2]; PROTOCOLS.len()],
}

impl ProtocolFamilies {
    pub(super) fn register(registry: &mut Registry) -> ProtocolFamilies {
        let series: Series<ProtocolLabels, Counter> = Series::default();
        let requests = PROTOCOLS.map(|protocol| {
            FAMILIES.map(|family| {
                series
                    .get_or_create(&ProtocolLabels {
                        protocol,
                        client_family: family.as_str(),
                    })
                    .clone()
            })
        });
        registry.register(
            "duet_requests_by_protocol",
            "Requests answered, by HTTP version spoken by the client (HTTP/1.0, HTTP/1.1, HTTP/2, HTTP/3) and client address family; the same requests as duet_requests_total",
            series,
        );
        ProtocolFamilies { requests }
    }
}

impl Metrics {
    /// Counts a request answered over the protocol of `protocol` (from [`protocol_index`]) to a
    /// client of `family`.
    pub fn request_by_protocol(&self, protocol: u8, family: Family) {
        let row = &self.protocols.requests[usize::from(protocol).min(PROTOCOLS.len() - 1)];
        row[slot(family)].inc();
    }
}
