//! ingress-nginx's `ssl-passthrough` connections by client family and upstream family
//! (`none` when no target could be reached).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family as Series;
use prometheus_client::registry::Registry;

use super::{upstream_family_label, Metrics, FAMILIES};
use crate::table::Family;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PassthroughLabels {
    client_family: &'static str,
    upstream_family: &'static str,
}

/// The family of passthrough connections.
#[derive(Clone, Debug)]
pub(super) struct PassthroughFamilies {
    connections: Series<PassthroughLabels, Counter>,
}

impl PassthroughFamilies {
    pub(super) fn register(registry: &mut Registry) -> PassthroughFamilies {
        let f = PassthroughFamilies {
            connections: Series::default(),
        };
        for client in FAMILIES {
            for upstream in [Some(Family::V4), Some(Family::V6), None] {
                let _ = f.connections.get_or_create(&labels(client, upstream));
            }
        }
        registry.register(
            "duet_passthrough_connections",
            "HTTPS connections relayed unterminated by TLS server name (ssl-passthrough), by client address family and upstream address family (none: no target reachable, closed)",
            f.connections.clone(),
        );
        f
    }
}

fn labels(client: Family, upstream: Option<Family>) -> PassthroughLabels {
    PassthroughLabels {
        client_family: client.as_str(),
        upstream_family: upstream_family_label(upstream),
    }
}

impl Metrics {
    /// Counts a passthrough connection: relayed to an upstream of a family, or (`None`) closed
    /// because no target could be reached.
    pub fn passthrough_connection(&self, client: Family, upstream: Option<Family>) {
        self.passthrough
            .connections
            .get_or_create(&labels(client, upstream))
            .inc();
    }
}
