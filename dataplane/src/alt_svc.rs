//! `Alt-Svc` (RFC 7838) on HTTPS answers over TCP: `h3=":PORT"; ma=N` while the HTTP/3 listener of
//! the connection's family is up, so that clients of either family learn HTTP/3 only where duet
//! answers it. The Ingress HTTPS listeners share one value per family; each Gateway HTTPS pod port
//! has its own (its QUIC sockets come and go with its Gateway), naming the port the Gateway's
//! listeners name (what clients reach through its Service), read from the live snapshot.

use arc_swap::{ArcSwap, ArcSwapOption};
use http::HeaderValue;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::table::Family;

/// The Gateway pod ports advertised: by port and family slot, the token of the listener that
/// put it there and its `ma`.
type GatewayValues = BTreeMap<(u16, usize), (u64, u64)>;

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

    /// Advertises HTTP/3 to the clients of `family` of the Gateway HTTPS pod port `port` (served
    /// over UDP on the same number); the token returned takes it down
    /// ([`AltSvc::gateway_down`]), and only while no later listener of that port and family
    /// replaced it.
    pub fn gateway_up(&self, family: Family, port: u16, max_age: Duration) -> u64 {
        let token = self.tokens.fetch_add(1, Ordering::Relaxed);
        self.gateways.rcu(|map| {
            let mut map = GatewayValues::clone(map);
            map.insert((port, slot(family)), (token, max_age.as_secs()));
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

    /// The value for a client of `family` of Gateway HTTPS pod port `port`, if HTTP/3 is up
    /// there: naming the port `advertised` says (the listeners' port), asked only then.
    pub fn gateway(
        &self,
        port: u16,
        family: Family,
        advertised: impl FnOnce() -> Option<u16>,
    ) -> Option<HeaderValue> {
        let map = self.gateways.load();
        if map.is_empty() {
            return None;
        }
        let &(_, max_age) = map.get(&(port, slot(family)))?;
        Some(value(advertised()?, Duration::from_secs(max_age)))
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
        // Pod port 20001 serves the listeners of port 443.
        let listeners = || Some(443);
        let old = alt.gateway_up(Family::V4, 20001, hour);
        assert_eq!(
            alt.gateway(20001, Family::V4, listeners).unwrap(),
            "h3=\":443\"; ma=3600"
        );
        assert_eq!(alt.gateway(20001, Family::V6, listeners), None);
        assert_eq!(alt.gateway(20002, Family::V4, listeners), None);
        assert_eq!(alt.get(Family::V4), None, "the Ingress listeners' apart");
        // The port rebound: the new listener is up before the old one finished draining.
        let new = alt.gateway_up(Family::V4, 20001, hour);
        alt.gateway_down(Family::V4, 20001, old);
        assert!(alt.gateway(20001, Family::V4, listeners).is_some());
        alt.gateway_down(Family::V4, 20001, new);
        assert_eq!(alt.gateway(20001, Family::V4, listeners), None);
    }
}
