//! Per-client limits (ingress-nginx's `limit-connections`, `limit-rps`, `limit-rpm`,
//! `limit-burst-multiplier`, `limit-allowlist`), with nginx's algorithms: `limit_req` is a leaky
//! bucket counted in thousandths of a request (`burst = limit × multiplier`, `nodelay`: a request
//! is admitted at once or refused), `limit_conn` counts requests in progress. One zone per
//! Ingress, shared by its paths, per duet process.
//!
//! The client is the connection's peer (after PROXY protocol), IPv4-mapped IPv6 as IPv4. An IPv6
//! client is keyed by its network of `ipv6_prefix` bits: /128 (per address, as ingress-nginx)
//! unless the Ingress opts into /64 with `duet.dev/limit-ipv6-prefix`, because one IPv6 host
//! holds a whole /64 and gets a fresh bucket per address it rotates to.
//!
//! The zones of a process keep their clients in one [`Clients`] store, each zone's in
//! least-recently-seen order. A zone holds at most [`ZONE_KEYS`] clients and all zones together
//! [`TOTAL_KEYS`]: a new client past either bound makes a zone forget its least recently seen
//! client (as nginx does when a zone's memory is full), counted in
//! `duet_rate_limit_evictions_total`; every other client keeps its bucket.

use std::collections::HashMap;
use std::hash::RandomState;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use hashlink::LinkedHashMap;

use crate::access_policy::RateLimit;
use crate::metrics::{EvictionBound, Metrics};
use crate::table::Family;

/// Clients one zone remembers (nginx's 5 MB zone holds about this many).
pub const ZONE_KEYS: usize = 100_000;

/// Clients all zones of a process remember together: 5 full zones. A client costs about 110
/// bytes (a 96-byte node and its share of the hash table), at most 160 while zones take room
/// from each other: 76 MiB in all (`clients_cost_bounded_memory` in `tests/rate_limit_memory.rs`).
pub const TOTAL_KEYS: usize = 500_000;

/// The key a client is limited under: its IPv4 address, or its IPv6 network of `prefix` bits.
pub fn client_key(ip: IpAddr, ipv6_prefix: u8) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(a) => {
            let bits = u128::from(a);
            let prefix = u32::from(ipv6_prefix.clamp(1, 128));
            let mask = u128::MAX.checked_shl(128 - prefix).unwrap_or(0);
            IpAddr::V6((bits & mask).into())
        }
        v4 => v4,
    }
}

/// nginx's `limit_req` state of one key: the excess in thousandths of a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bucket {
    excess: u64,
    last: Instant,
}

/// A rate in thousandths of a request per second, and the burst in thousandths of a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rate {
    milli_per_sec: u64,
    burst_milli: u64,
}

impl Rate {
    /// `limit` requests per `per_secs` seconds with `burst` extra requests admitted at once.
    pub fn new(limit: u32, per_secs: u64, burst: u64) -> Rate {
        Rate {
            milli_per_sec: u64::from(limit) * 1000 / per_secs.max(1),
            burst_milli: burst.saturating_mul(1000),
        }
    }

    /// Whole milliseconds since the bucket last changed, and the excess at `now` with this
    /// request added (nginx: `excess - rate × ms / 1000 + 1000`, at least 0).
    fn excess_with(&self, bucket: &Bucket, now: Instant) -> (u64, u64) {
        let ms = u64::try_from(now.saturating_duration_since(bucket.last).as_millis())
            .unwrap_or(u64::MAX);
        let drain = self.milli_per_sec.saturating_mul(ms) / 1000;
        (ms, (bucket.excess + 1000).saturating_sub(drain))
    }

    /// Admits a request of a key (nginx's `ngx_http_limit_req_lookup` with `nodelay`): a new key
    /// is admitted with no excess; then each request adds one, drained at the rate, and is refused
    /// (leaving the bucket as it was) once the excess would pass the burst.
    pub fn admit(&self, bucket: &mut Option<Bucket>, now: Instant) -> bool {
        let Some(b) = bucket else {
            *bucket = Some(Bucket {
                excess: 0,
                last: now,
            });
            return true;
        };
        let (ms, excess) = self.excess_with(b, now);
        if excess > self.burst_milli {
            return false;
        }
        // Only whole milliseconds are spent, so no drain is lost to rounding.
        b.excess = excess;
        b.last += std::time::Duration::from_millis(ms);
        true
    }
}

/// The buckets of one client: `limit-rps`, `limit-rpm`.
type Buckets = [Option<Bucket>; 2];

/// One zone's clients: their buckets, least recently seen first, and requests in progress.
#[derive(Debug, Default)]
struct Table {
    buckets: LinkedHashMap<IpAddr, Buckets, RandomState>,
    /// Nodes the map keeps for reuse since clients were taken from it for another zone.
    spare: usize,
    in_progress: HashMap<IpAddr, u32>,
}

#[derive(Debug, Default)]
struct State {
    /// Tables by zone id (ours, not a client's: hashed fast).
    zones: HashMap<u64, Table, foldhash::fast::RandomState>,
    /// Clients remembered by all zones.
    total: usize,
    next_id: u64,
}

impl State {
    fn table(&mut self, zone: u64) -> &mut Table {
        self.zones.entry(zone).or_default()
    }
}

/// The clients of every zone of a process, with the bounds they share.
#[derive(Debug)]
pub struct Clients {
    state: Mutex<State>,
    /// Clients per zone, and in all.
    bounds: (usize, usize),
    metrics: Arc<Metrics>,
}

impl Clients {
    /// A store holding `per_zone` clients per zone and `total` in all, counting evictions in
    /// `metrics` (the process uses [`ZONE_KEYS`] and [`TOTAL_KEYS`]).
    pub fn new(per_zone: usize, total: usize, metrics: Arc<Metrics>) -> Arc<Clients> {
        Arc::new(Clients {
            state: Mutex::default(),
            bounds: (per_zone.max(1), total.max(1)),
            metrics,
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Clients remembered by all zones.
    pub fn len(&self) -> usize {
        self.lock().total
    }

    /// Whether no zone remembers a client.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The buckets of a zone's client, now its most recently seen; a new client is given room.
    fn buckets<'a>(&self, state: &'a mut State, zone: u64, key: IpAddr) -> &'a mut Buckets {
        if state.table(zone).buckets.to_back(&key).is_none() {
            self.make_room(state, zone);
            state.total += 1;
            let table = state.table(zone);
            table.spare = table.spare.saturating_sub(1);
        }
        state
            .table(zone)
            .buckets
            .entry(key)
            .or_insert_with(Buckets::default)
    }

    /// Forgets a least recently seen client when a zone or all zones are full: the zone's own,
    /// or when it holds less than an equal share of the total, that of the zone holding most
    /// (found by a walk over the zones, only then).
    fn make_room(&self, state: &mut State, zone: u64) {
        let (per_zone, total) = self.bounds;
        let own = state.zones.get(&zone).map_or(0, |t| t.buckets.len());
        let (victim, bound) = if own >= per_zone {
            (zone, EvictionBound::Zone)
        } else if state.total >= total {
            let share = (total / state.zones.len().max(1)).max(1);
            let most = state.zones.iter().max_by_key(|(_, t)| t.buckets.len());
            let largest = most.map_or(zone, |(id, _)| *id);
            (
                if own >= share { zone } else { largest },
                EvictionBound::Total,
            )
        } else {
            return;
        };
        let Some(table) = state.zones.get_mut(&victim) else {
            return;
        };
        let Some((key, _)) = table.buckets.pop_front() else {
            return;
        };
        table.spare += 1;
        // Another zone's spare nodes are given back once they pass a quarter of its clients.
        if victim != zone && table.spare * 4 > table.buckets.len() {
            table.buckets.shrink_to_fit();
            table.spare = 0;
        }
        state.total -= 1;
        self.metrics.rate_limit_evicted(Family::of_ip(&key), bound);
    }
}

/// The runtime state of one route's limits (one Ingress's), kept while its limits are unchanged.
#[derive(Debug)]
pub struct Zone {
    config: RateLimit,
    rates: [Option<Rate>; 2],
    id: u64,
    clients: Arc<Clients>,
}

impl Drop for Zone {
    fn drop(&mut self) {
        let mut state = self.clients.lock();
        if let Some(table) = state.zones.remove(&self.id) {
            state.total -= table.buckets.len();
        }
    }
}

/// A request in progress, counted against `limit-connections` until dropped.
#[derive(Debug)]
pub struct Slot {
    zone: Arc<Zone>,
    key: IpAddr,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut state = self.zone.clients.lock();
        let Some(table) = state.zones.get_mut(&self.zone.id) else {
            return;
        };
        if let Some(n) = table.in_progress.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                table.in_progress.remove(&self.key);
            }
        }
    }
}

/// What the limits make of a request.
#[derive(Debug)]
pub enum Verdict {
    /// Admitted; the slot (if `limit-connections` is set) is held until the response is done.
    Admitted(Option<Slot>),
    /// Over a limit (503, as ingress-nginx's default `limit-req-status-code`).
    Limited,
    /// The limits do not parse: nobody is admitted (503).
    Misconfigured,
}

impl Zone {
    /// A zone with no history for `config`, keeping its clients in `clients`.
    pub fn new(config: RateLimit, clients: &Arc<Clients>) -> Zone {
        let burst = |limit: u32| u64::from(limit) * u64::from(config.burst_multiplier);
        let id = {
            let mut state = clients.lock();
            state.next_id += 1;
            state.next_id
        };
        Zone {
            rates: [
                config.rps.map(|l| Rate::new(l, 1, burst(l))),
                config.rpm.map(|l| Rate::new(l, 60, burst(l))),
            ],
            config,
            id,
            clients: clients.clone(),
        }
    }

    /// The limits this zone applies.
    pub fn config(&self) -> &RateLimit {
        &self.config
    }

    /// Checks a request of `client` at `now`: connections first, then the per-second and the
    /// per-minute rate (ingress-nginx's order).
    pub fn admit(self: &Arc<Self>, client: IpAddr, now: Instant) -> Verdict {
        if self.config.error.is_some() {
            return Verdict::Misconfigured;
        }
        if self.config.allow.iter().any(|c| c.contains(client)) {
            return Verdict::Admitted(None);
        }
        let key = client_key(client, self.config.ipv6_prefix);
        let mut state = self.clients.lock();
        let in_progress = state.table(self.id).in_progress.get(&key);
        let in_progress = in_progress.copied().unwrap_or(0);
        if self
            .config
            .connections
            .is_some_and(|max| in_progress >= max)
        {
            return Verdict::Limited;
        }
        if !self.admit_rates(&mut state, key, now) {
            return Verdict::Limited;
        }
        if self.config.connections.is_none() {
            return Verdict::Admitted(None);
        }
        *state.table(self.id).in_progress.entry(key).or_default() += 1;
        Verdict::Admitted(Some(Slot {
            zone: self.clone(),
            key,
        }))
    }

    /// Admits a request of a key at each rate in turn; false at the first that refuses it.
    fn admit_rates(&self, state: &mut State, key: IpAddr, now: Instant) -> bool {
        if self.rates == [None, None] {
            return true;
        }
        let buckets = self.clients.buckets(state, self.id, key);
        for (rate, bucket) in self.rates.iter().zip(buckets) {
            if let Some(rate) = rate {
                if !rate.admit(bucket, now) {
                    return false;
                }
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn ipv6_clients_are_keyed_by_their_prefix_and_mapped_ones_as_ipv4() {
        assert_eq!(
            client_key(ip("2001:db8:1:2:aaaa::1"), 64),
            ip("2001:db8:1:2::")
        );
        assert_eq!(
            client_key(ip("2001:db8:1:2:aaaa::1"), 64),
            client_key(ip("2001:db8:1:2:ffff:ffff:ffff:ffff"), 64)
        );
        assert_ne!(
            client_key(ip("2001:db8:1:2::1"), 64),
            client_key(ip("2001:db8:1:3::1"), 64)
        );
        assert_eq!(client_key(ip("2001:db8::7"), 128), ip("2001:db8::7"));
        assert_eq!(client_key(ip("::ffff:192.0.2.9"), 64), ip("192.0.2.9"));
        assert_eq!(client_key(ip("192.0.2.9"), 64), ip("192.0.2.9"));
    }

    #[test]
    fn bucket_admits_one_plus_burst_then_drains_at_the_rate() {
        let t0 = Instant::now();
        // limit-rps 2, burst 2 × 3 = 6: 7 at once, then one per 500 ms.
        let rate = Rate::new(2, 1, 6);
        let mut b = None;
        let admitted = (0..10).filter(|_| rate.admit(&mut b, t0)).count();
        assert_eq!(admitted, 7);
        assert!(!rate.admit(&mut b, t0 + Duration::from_millis(499)));
        assert!(rate.admit(&mut b, t0 + Duration::from_millis(500)));
        assert!(!rate.admit(&mut b, t0 + Duration::from_millis(500)));
        // After 10 s it is empty again.
        let later = t0 + Duration::from_secs(10);
        assert_eq!((0..10).filter(|_| rate.admit(&mut b, later)).count(), 7);
        // Per minute: 60/min is one per second.
        let rpm = Rate::new(60, 60, 0);
        let mut b = None;
        assert!(rpm.admit(&mut b, t0));
        assert!(!rpm.admit(&mut b, t0 + Duration::from_millis(999)));
        assert!(rpm.admit(&mut b, t0 + Duration::from_millis(1000)));
    }

    fn clients(per_zone: usize, total: usize) -> (Arc<Clients>, Arc<Metrics>) {
        let metrics = Metrics::unregistered();
        (Clients::new(per_zone, total, metrics.clone()), metrics)
    }

    /// A zone of `limit-rpm` with a burst multiplier of 1, keying IPv6 clients by their /64.
    fn rpm_zone(clients: &Arc<Clients>, rpm: u32) -> Arc<Zone> {
        let config = RateLimit {
            rpm: Some(rpm),
            burst_multiplier: 1,
            ipv6_prefix: 64,
            ..RateLimit::default()
        };
        Arc::new(Zone::new(config, clients))
    }

    fn limited(zone: &Arc<Zone>, client: &str, now: Instant) -> bool {
        matches!(zone.admit(ip(client), now), Verdict::Limited)
    }

    /// Sends requests of a client until it is limited: `1 + burst` are admitted.
    fn exhaust(zone: &Arc<Zone>, client: &str, now: Instant) {
        let rpm = zone.config().rpm.unwrap_or(0);
        for _ in 0..=rpm {
            assert!(!limited(zone, client, now), "{client}");
        }
        assert!(limited(zone, client, now), "{client}");
    }

    /// The `n`th new client: IPv4 for even `n`, an IPv6 /64 for odd.
    fn newcomer(n: u32) -> IpAddr {
        if n.is_multiple_of(2) {
            IpAddr::V4((0x0a00_0000 + n).into())
        } else {
            IpAddr::V6(((0x2001_0db8_1000_0000_u128 + u128::from(n)) << 64).into())
        }
    }

    #[test]
    fn a_full_zone_forgets_its_least_recently_seen_client_and_keeps_the_others_buckets() {
        let (clients, metrics) = clients(ZONE_KEYS, TOTAL_KEYS);
        let zone = rpm_zone(&clients, 1);
        let now = Instant::now();
        // Two clients at their limit: an IPv4 address and an IPv6 /64.
        exhaust(&zone, "192.0.2.1", now);
        exhaust(&zone, "2001:db8:1:2::1", now);
        // New clients of both families fill the zone and go on arriving; the two limited
        // clients retry now and then, and stay limited throughout.
        let arriving = ZONE_KEYS as u32 + 1000;
        for n in 0..arriving {
            assert!(matches!(zone.admit(newcomer(n), now), Verdict::Admitted(_)));
            if n.is_multiple_of(10_000) || n + 1 == arriving {
                assert!(limited(&zone, "192.0.2.1", now), "after {n} new clients");
                assert!(limited(&zone, "2001:db8:1:2::ffff", now), "after {n}");
            }
        }
        assert_eq!(clients.len(), ZONE_KEYS);
        // The 1,002 new clients seen least recently were forgotten, half of each family.
        for family in Family::BOTH {
            assert_eq!(
                metrics.rate_limit_evictions(family, EvictionBound::Zone),
                501
            );
            assert_eq!(
                metrics.rate_limit_evictions(family, EvictionBound::Total),
                0
            );
        }
    }

    #[test]
    fn all_zones_share_one_bound_and_the_zone_holding_most_pays_for_another() {
        let (clients, metrics) = clients(4, 6);
        let (x, y) = (rpm_zone(&clients, 1), rpm_zone(&clients, 2));
        let now = Instant::now();
        // x: a limited IPv4 client, then three more; x is full.
        exhaust(&x, "192.0.2.1", now);
        for c in ["192.0.2.2", "2001:db8:2::1", "2001:db8:3::1"] {
            assert!(!limited(&x, c, now));
        }
        assert!(limited(&x, "192.0.2.1", now));
        // y: a limited IPv6 client and another: all zones together are full.
        exhaust(&y, "2001:db8:a::1", now);
        assert!(!limited(&y, "192.0.2.20", now));
        assert_eq!(clients.len(), 6);
        // y's third client: y holds less than its share (3 of 6), so x, holding most, forgets
        // its least recently seen client (192.0.2.2); the limited ones keep their buckets.
        assert!(!limited(&y, "192.0.2.21", now));
        assert_eq!(clients.len(), 6);
        assert_eq!(
            metrics.rate_limit_evictions(Family::V4, EvictionBound::Total),
            1
        );
        assert!(limited(&x, "192.0.2.1", now));
        assert!(limited(&y, "2001:db8:a::1", now));
        // y now holds its share: its own least recently seen client (192.0.2.20) goes.
        assert!(!limited(&y, "2001:db8:b::1", now));
        assert_eq!(
            metrics.rate_limit_evictions(Family::V4, EvictionBound::Total),
            2
        );
        assert_eq!(
            metrics.rate_limit_evictions(Family::V6, EvictionBound::Total),
            0
        );
        assert!(limited(&x, "192.0.2.1", now));
        assert!(limited(&y, "2001:db8:a::1", now));
        assert_eq!(
            metrics.rate_limit_evictions(Family::V4, EvictionBound::Zone),
            0
        );
        // A zone dropped (its Ingress's limits changed) gives its clients back.
        drop(y);
        assert_eq!(clients.len(), 3);
    }

    #[test]
    fn zone_limits_connections_rates_and_spares_the_allowlist() {
        let now = Instant::now();
        let (clients, _) = clients(ZONE_KEYS, TOTAL_KEYS);
        let zone = Arc::new(Zone::new(
            RateLimit {
                rps: Some(1),
                connections: Some(2),
                burst_multiplier: 2,
                allow: vec!["10.0.0.0/8".parse().unwrap(), "fd00::/8".parse().unwrap()],
                ..RateLimit::default()
            },
            &clients,
        ));
        let admit = |c: &str| zone.admit(ip(c), now);
        let a = admit("2001:db8::1");
        let b = admit("2001:db8::2"); // same /64: same key
        assert!(matches!(a, Verdict::Admitted(Some(_))));
        assert!(matches!(b, Verdict::Admitted(Some(_))));
        assert!(
            matches!(admit("2001:db8::3"), Verdict::Limited),
            "third in progress"
        );
        drop(a);
        assert!(matches!(admit("2001:db8::3"), Verdict::Admitted(Some(_))));
        // The third request of the /64 used the burst (1 + 2); the fourth is over.
        assert!(matches!(admit("2001:db8::4"), Verdict::Limited));
        // Another /64, an IPv4 client, and the allow-list are separate.
        assert!(matches!(admit("2001:db8:0:1::1"), Verdict::Admitted(_)));
        assert!(matches!(admit("192.0.2.1"), Verdict::Admitted(_)));
        for _ in 0..10 {
            assert!(matches!(admit("10.1.2.3"), Verdict::Admitted(None)));
            assert!(matches!(admit("::ffff:10.1.2.3"), Verdict::Admitted(None)));
            assert!(matches!(admit("fd00::9"), Verdict::Admitted(None)));
        }
        let broken = Arc::new(Zone::new(
            RateLimit {
                error: Some("bad".into()),
                ..RateLimit::default()
            },
            &clients,
        ));
        assert!(matches!(
            broken.admit(ip("10.0.0.1"), now),
            Verdict::Misconfigured
        ));
    }
}
