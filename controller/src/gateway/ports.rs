//! Pod ports for Gateway listeners: every listener port of every Gateway of our classes gets a
//! port on duet's pods, unique across Gateways (the pods are shared), from
//! [`FIRST_POD_PORT`]..=[`LAST_POD_PORT`].
//!
//! The assignment is written into each Gateway's Service (`targetPort`) and read back from
//! there, so it survives restarts and every replica reads the same one. [`allocate`] is pure and
//! deterministic: Gateways in order (oldest first, then namespace/name) first keep the ports
//! their Service already holds (unless an earlier Gateway holds the same port, or it is outside
//! the range), then new listener ports take the lowest free port.

use std::collections::{BTreeMap, BTreeSet};

/// The first pod port given to a Gateway listener.
pub const FIRST_POD_PORT: u16 = 20000;
/// The last one: 10 000 listener ports in all.
pub const LAST_POD_PORT: u16 = 29999;

/// `namespace/name` of a Gateway.
pub type GatewayKey = (String, String);

/// One Gateway's listener ports, and the assignment its Service holds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Claim {
    /// The Gateway.
    pub gateway: GatewayKey,
    /// The ports of its valid listeners.
    pub listener_ports: BTreeSet<u16>,
    /// listener port -> pod port, as its Service holds them now.
    pub held: BTreeMap<u16, u16>,
}

/// listener port -> pod port per Gateway; a listener port missing from its map found no free
/// pod port.
pub type Allocation = BTreeMap<GatewayKey, BTreeMap<u16, u16>>;

/// Assigns pod ports to every claim, `claims` in priority order (oldest Gateway first).
pub fn allocate(claims: &[Claim]) -> Allocation {
    let mut taken = BTreeSet::new();
    let mut out: Allocation = BTreeMap::new();
    for claim in claims {
        let kept = out.entry(claim.gateway.clone()).or_default();
        for (&listener, &pod) in &claim.held {
            let usable = claim.listener_ports.contains(&listener)
                && (FIRST_POD_PORT..=LAST_POD_PORT).contains(&pod)
                && !taken.contains(&pod);
            if usable {
                taken.insert(pod);
                kept.insert(listener, pod);
            }
        }
    }
    let mut free = (FIRST_POD_PORT..=LAST_POD_PORT).filter(|p| !taken.contains(p));
    for claim in claims {
        let assigned = out.entry(claim.gateway.clone()).or_default();
        for &listener in &claim.listener_ports {
            if assigned.contains_key(&listener) {
                continue;
            }
            match free.next() {
                Some(pod) => {
                    assigned.insert(listener, pod);
                }
                None => break,
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(name: &str, ports: &[u16], held: &[(u16, u16)]) -> Claim {
        Claim {
            gateway: ("ns".to_owned(), name.to_owned()),
            listener_ports: ports.iter().copied().collect(),
            held: held.iter().copied().collect(),
        }
    }

    fn of(a: &Allocation, name: &str) -> Vec<(u16, u16)> {
        a[&("ns".to_owned(), name.to_owned())]
            .iter()
            .map(|(l, p)| (*l, *p))
            .collect()
    }

    #[test]
    fn held_ports_are_kept_and_new_ones_take_the_lowest_free() {
        let a = allocate(&[claim("old", &[80, 443], &[]), claim("new", &[80], &[])]);
        assert_eq!(of(&a, "old"), [(80, 20000), (443, 20001)]);
        assert_eq!(of(&a, "new"), [(80, 20002)]);
        // The old Gateway drops 80 and adds 8080; the new one keeps what its Service holds.
        let b = allocate(&[
            claim("old", &[443, 8080], &[(80, 20000), (443, 20001)]),
            claim("new", &[80], &[(80, 20002)]),
        ]);
        assert_eq!(of(&b, "old"), [(443, 20001), (8080, 20000)]);
        assert_eq!(of(&b, "new"), [(80, 20002)]);
    }

    #[test]
    fn a_port_held_twice_goes_to_the_older_gateway_and_bad_ones_are_replaced() {
        let a = allocate(&[
            claim("old", &[80], &[(80, 20005)]),
            claim("new", &[80, 81], &[(80, 20005), (81, 1)]),
        ]);
        assert_eq!(of(&a, "old"), [(80, 20005)]);
        assert_eq!(of(&a, "new"), [(80, 20000), (81, 20001)]);
    }

    #[test]
    fn exhaustion_leaves_listeners_without_a_port() {
        let ports: Vec<u16> = (1..=10_001).collect();
        let a = allocate(&[claim("big", &ports, &[])]);
        assert_eq!(a[&("ns".to_owned(), "big".to_owned())].len(), 10_000);
    }
}
