//! `Alt-Svc` (RFC 7838) on HTTPS answers over TCP: `h3=":PORT"; ma=N` while the HTTP/3 listener of
//! the connection's family is up, so that clients of either family learn HTTP/3 only where duet
//! answers it. The Ingress HTTPS listeners share one value per family; each Gateway HTTPS port has
//! its own (its QUIC sockets come and go with its Gateway).

use arc_swap::{ArcSwap, ArcSwapOption};
use http::HeaderValue;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::table::Family;

/// The values of the Gateway ports: by port and family slot, with the token of the listener
/// that put it there.
type GatewayValues = BTreeMap<(u16, usize), (u64, HeaderValue)>;

/// The `Alt-Svc` value per client family (`None`: no HTTP/3 listener of that family is up), for
/// the Ingress HTTPS listeners and per Gateway HTTPS port.
#[derive(Debug, Default)]
pub struct AltSvc {
    values: [ArcSwapOption<HeaderValue>; 2],
    gateways: ArcSwap<GatewayValues>,
    tokens: AtomicU64,
}

fn slot(family: Family) -> usize {
    match family {
        Family::V4 => 0,
        Family::V6 => 1,
    }
}

fn value(port: u16, max_age: Duration) -> HeaderValue {
    let value = format!("h3=\":{port}\"; ma={}", max_age.as_secs());
    HeaderValue::from_str(&value).expect("a port and a number are a header value")
}

impl AltSvc {
    /// Advertises HTTP/3 on UDP `port` to clients of `family`, for `max_age`.
    pub fn up(&self, family: Family, port: u16, max_age: Duration) {
        self.values[slot(family)].store(Some(Arc::new(value(port, max_age))));
    }

    /// Stops advertising HTTP/3 to clients of `family`.
    pub fn down(&self, family: Family) {
        self.values[slot(family)].store(None);
    }

    /// The value for a client of `family` of an Ingress HTTPS listener, if HTTP/3 is up for it.
    pub fn get(&self, family: Family) -> Option<HeaderValue> {
        self.values[slot(family)].load().as_deref().cloned()
    }

    /// Advertises HTTP/3 on UDP `port` to the clients of `family` of the Gateway HTTPS port of
    /// the same number; the token returned takes it down ([`AltSvc::gateway_down`]), and only
    /// while no later listener of that port and family replaced it.
    pub fn gateway_up(&self, family: Family, port: u16, max_age: Duration) -> u64 {
        let token = self.tokens.fetch_add(1, Ordering::Relaxed);
        let v = value(port, max_age);
        self.gateways.rcu(|map| {
            let mut map = GatewayValues::clone(map);
            map.insert((port, slot(family)), (token, v.clone()));
            map
        });
        token
    }

    /// Stops advertising what [`AltSvc::gateway_up`] returned `token` for.
    pub fn gateway_down(&self, family: Family, port: u16, token: u64) {
        let key = (port, slot(family));
        self.gateways.rcu(|map| {
            let mut map = GatewayValues::clone(map);
            if map.get(&key).is_some_and(|(t, _)| *t == token) {
                map.remove(&key);
            }
            map
        });
    }

    /// The value for a client of `family` of Gateway HTTPS port `port`, if HTTP/3 is up there.
    pub fn gateway(&self, port: u16, family: Family) -> Option<HeaderValue> {
        let map = self.gateways.load();
        if map.is_empty() {
            return None;
        }
        map.get(&(port, slot(family))).map(|(_, v)| v.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advertises_per_family_until_down() {
        let alt = AltSvc::default();
        assert_eq!(alt.get(Family::V4), None);
        alt.up(Family::V6, 8443, Duration::from_secs(3600));
        assert_eq!(alt.get(Family::V4), None);
        assert_eq!(alt.get(Family::V6).unwrap(), "h3=\":8443\"; ma=3600");
        alt.down(Family::V6);
        assert_eq!(alt.get(Family::V6), None);
    }

    #[test]
    fn gateway_ports_advertise_apart_and_a_late_down_leaves_the_new_listener() {
        let alt = AltSvc::default();
        let hour = Duration::from_secs(3600);
        let old = alt.gateway_up(Family::V4, 9443, hour);
        assert_eq!(
            alt.gateway(9443, Family::V4).unwrap(),
            "h3=\":9443\"; ma=3600"
        );
        assert_eq!(alt.gateway(9443, Family::V6), None);
        assert_eq!(alt.gateway(9444, Family::V4), None);
        assert_eq!(alt.get(Family::V4), None, "the Ingress listeners' apart");
        // The port rebound: the new listener is up before the old one finished draining.
        let new = alt.gateway_up(Family::V4, 9443, hour);
        alt.gateway_down(Family::V4, 9443, old);
        assert!(alt.gateway(9443, Family::V4).is_some());
        alt.gateway_down(Family::V4, 9443, new);
        assert_eq!(alt.gateway(9443, Family::V4), None);
    }
}
