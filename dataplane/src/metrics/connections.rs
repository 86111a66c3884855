//! Client connections by listener address and client family: accepted, open, parked while idle,
//! refused at the connection limit.

use std::net::SocketAddr;
use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family as Series;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::{slot, Metrics, FAMILIES};
use crate::table::Family;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ListenerLabels {
    listener: Arc<str>,
    family: &'static str,
}

/// The families of client connections.
#[derive(Clone, Debug)]
pub(super) struct ConnectionFamilies {
    connections_active: Series<ListenerLabels, Gauge>,
    connections_parked: Series<ListenerLabels, Gauge>,
    connections_total: Series<ListenerLabels, Counter>,
    connections_refused: Series<ListenerLabels, Counter>,
}

impl ConnectionFamilies {
    pub(super) fn register(registry: &mut Registry) -> ConnectionFamilies {
        let f = ConnectionFamilies {
            connections_active: Series::default(),
            connections_parked: Series::default(),
            connections_total: Series::default(),
            connections_refused: Series::default(),
        };
        registry.register(
            "duet_connections_active",
            "Open client connections, by listener address and client address family",
            f.connections_active.clone(),
        );
        registry.register(
            "duet_connections_parked",
            "Open client connections parked while idle (HTTP/1.1, no server state or buffers held), by listener address and client address family",
            f.connections_parked.clone(),
        );
        registry.register(
            "duet_connections",
            "Client connections accepted, by listener address and client address family",
            f.connections_total.clone(),
        );
        registry.register(
            "duet_connections_refused",
            "Client connections closed right after accept because --max-connections were open (or, for ssl-passthrough hosts, --max-passthrough-connections relays), by listener address and client address family",
            f.connections_refused.clone(),
        );
        f
    }
}

impl Metrics {
    /// The connection handles of one listener.
    pub fn listener(&self, listener: SocketAddr) -> ConnectionMetrics {
        self.listener_named(&listener.to_string())
    }

    /// The connection handles of an HTTP/3 listener: labelled `ADDR/udp`, apart from the TCP
    /// listener on the same address.
    pub fn quic_listener(&self, listener: SocketAddr) -> ConnectionMetrics {
        self.listener_named(&format!("{listener}/udp"))
    }

    fn listener_named(&self, name: &str) -> ConnectionMetrics {
        let name: Arc<str> = name.into();
        let labels = |f: Family| ListenerLabels {
            listener: name.clone(),
            family: f.as_str(),
        };
        ConnectionMetrics {
            active: FAMILIES.map(|f| {
                self.connections
                    .connections_active
                    .get_or_create_owned(&labels(f))
            }),
            parked: FAMILIES.map(|f| {
                self.connections
                    .connections_parked
                    .get_or_create_owned(&labels(f))
            }),
            total: FAMILIES.map(|f| {
                self.connections
                    .connections_total
                    .get_or_create_owned(&labels(f))
            }),
            refused: FAMILIES.map(|f| {
                self.connections
                    .connections_refused
                    .get_or_create_owned(&labels(f))
            }),
        }
    }
}

/// The connection counters of one listener, per client family.
#[derive(Clone, Debug)]
pub struct ConnectionMetrics {
    active: [Gauge; 2],
    parked: [Gauge; 2],
    total: [Counter; 2],
    refused: [Counter; 2],
}

impl ConnectionMetrics {
    /// Counts a connection as accepted and open until the guard drops.
    pub fn open(&self, family: Family) -> OpenConnection {
        let i = slot(family);
        self.total[i].inc();
        self.active[i].inc();
        OpenConnection(self.active[i].clone())
    }

    /// Counts a connection as parked while idle until the guard drops.
    pub fn parked(&self, family: Family) -> OpenConnection {
        let gauge = &self.parked[slot(family)];
        gauge.inc();
        OpenConnection(gauge.clone())
    }

    /// Counts a connection refused by the connection limit.
    pub fn refused(&self, family: Family) {
        self.refused[slot(family)].inc();
    }
}

/// Keeps a connection counted in a gauge (`duet_connections_active`, `duet_connections_parked`)
/// while alive.
#[derive(Debug)]
pub struct OpenConnection(Gauge);

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.dec();
    }
}
