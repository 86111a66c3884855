//! WebSocket tunnels by client family: opened, open, and how they ended.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family as Series;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::Metrics;
use crate::table::Family;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClientFamilyLabels {
    client_family: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TunnelEndLabels {
    reason: &'static str,
}

/// How a WebSocket tunnel ended (the `reason` of `duet_tunnels_closed_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TunnelEnd {
    /// The client or the upstream closed it.
    Closed,
    /// No byte either way for the idle timeout.
    Idle,
    /// Closed at the end of the drain on shutdown.
    Drain,
}

impl TunnelEnd {
    fn label(self) -> &'static str {
        match self {
            TunnelEnd::Closed => "closed",
            TunnelEnd::Idle => "idle",
            TunnelEnd::Drain => "drain",
        }
    }
}

/// The families of tunnels.
#[derive(Clone, Debug)]
pub(super) struct TunnelFamilies {
    tunnels_active: Series<ClientFamilyLabels, Gauge>,
    tunnels_total: Series<ClientFamilyLabels, Counter>,
    tunnels_closed: Series<TunnelEndLabels, Counter>,
}

impl TunnelFamilies {
    pub(super) fn register(registry: &mut Registry) -> TunnelFamilies {
        let f = TunnelFamilies {
            tunnels_active: Series::default(),
            tunnels_total: Series::default(),
            tunnels_closed: Series::default(),
        };
        for end in [TunnelEnd::Closed, TunnelEnd::Idle, TunnelEnd::Drain] {
            let _ = f.tunnels_closed.get_or_create(&TunnelEndLabels {
                reason: end.label(),
            });
        }
        registry.register(
            "duet_tunnels_active",
            "Open WebSocket tunnels, by client address family",
            f.tunnels_active.clone(),
        );
        registry.register(
            "duet_tunnels",
            "WebSocket tunnels opened (101 relayed), by client address family",
            f.tunnels_total.clone(),
        );
        registry.register(
            "duet_tunnels_closed",
            "WebSocket tunnels ended, by reason: closed (by a side), idle (idle timeout), drain (shutdown)",
            f.tunnels_closed.clone(),
        );
        f
    }
}

impl Metrics {
    /// Counts a tunnel as opened and open.
    pub fn tunnel_opened(&self, family: Family) {
        let labels = ClientFamilyLabels {
            client_family: family.as_str(),
        };
        self.tunnels.tunnels_total.get_or_create(&labels).inc();
        self.tunnels.tunnels_active.get_or_create(&labels).inc();
    }

    /// Counts a tunnel as no longer open.
    pub fn tunnel_left(&self, family: Family) {
        let labels = ClientFamilyLabels {
            client_family: family.as_str(),
        };
        self.tunnels.tunnels_active.get_or_create(&labels).dec();
    }

    /// Counts how a tunnel ended.
    pub fn tunnel_closed(&self, end: TunnelEnd) {
        let labels = TunnelEndLabels {
            reason: end.label(),
        };
        self.tunnels.tunnels_closed.get_or_create(&labels).inc();
    }
}
