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

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::access_policy::RateLimit;

/// Entries kept per zone and kind before drained ones are dropped (nginx's 5 MB zone holds
/// about this many); past it, a zone starts over rather than grow without bound.
const MAX_KEYS: usize = 100_000;

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

    /// Whether a bucket has drained to nothing at `now` (it may be forgotten).
    fn is_drained(&self, bucket: &Bucket, now: Instant) -> bool {
        self.excess_with(bucket, now).1 <= 1000
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

#[derive(Debug, Default)]
struct Counts {
    rps: HashMap<IpAddr, Bucket>,
    rpm: HashMap<IpAddr, Bucket>,
    in_progress: HashMap<IpAddr, u32>,
}

/// The runtime state of one route's limits (one Ingress's), kept while its limits are unchanged.
#[derive(Debug)]
pub struct Zone {
    config: RateLimit,
    rps: Option<Rate>,
    rpm: Option<Rate>,
    counts: Mutex<Counts>,
}

/// A request in progress, counted against `limit-connections` until dropped.
#[derive(Debug)]
pub struct Slot {
    zone: Arc<Zone>,
    key: IpAddr,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut counts = self.zone.lock();
        if let Some(n) = counts.in_progress.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                counts.in_progress.remove(&self.key);
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
    /// A zone with no history for `config`.
    pub fn new(config: RateLimit) -> Zone {
        let burst = |limit: u32| u64::from(limit) * u64::from(config.burst_multiplier);
        Zone {
            rps: config.rps.map(|l| Rate::new(l, 1, burst(l))),
            rpm: config.rpm.map(|l| Rate::new(l, 60, burst(l))),
            config,
            counts: Mutex::default(),
        }
    }

    /// The limits this zone applies.
    pub fn config(&self) -> &RateLimit {
        &self.config
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Counts> {
        self.counts.lock().unwrap_or_else(|e| e.into_inner())
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
        let mut guard = self.lock();
        let counts = &mut *guard;
        let in_progress = counts.in_progress.get(&key).copied().unwrap_or(0);
        if self
            .config
            .connections
            .is_some_and(|max| in_progress >= max)
        {
            return Verdict::Limited;
        }
        for (rate, table) in [(self.rps, &mut counts.rps), (self.rpm, &mut counts.rpm)] {
            let Some(rate) = rate else { continue };
            make_room(table, &rate, now);
            let mut bucket = table.get(&key).copied();
            let admitted = rate.admit(&mut bucket, now);
            if let Some(b) = bucket {
                table.insert(key, b);
            }
            if !admitted {
                return Verdict::Limited;
            }
        }
        if self.config.connections.is_none() {
            return Verdict::Admitted(None);
        }
        *counts.in_progress.entry(key).or_default() += 1;
        Verdict::Admitted(Some(Slot {
            zone: self.clone(),
            key,
        }))
    }
}

/// Drops drained buckets once a table is full; starts over if that is not enough.
fn make_room(table: &mut HashMap<IpAddr, Bucket>, rate: &Rate, now: Instant) {
    if table.len() < MAX_KEYS {
        return;
    }
    table.retain(|_, b| !rate.is_drained(b, now));
    if table.len() >= MAX_KEYS {
        tracing::warn!(
            keys = table.len(),
            "A rate-limit zone is full; it starts over"
        );
        table.clear();
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

    #[test]
    fn zone_limits_connections_rates_and_spares_the_allowlist() {
        let now = Instant::now();
        let zone = Arc::new(Zone::new(RateLimit {
            rps: Some(1),
            connections: Some(2),
            burst_multiplier: 2,
            allow: vec!["10.0.0.0/8".parse().unwrap(), "fd00::/8".parse().unwrap()],
            ..RateLimit::default()
        }));
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
        let broken = Arc::new(Zone::new(RateLimit {
            error: Some("bad".into()),
            ..RateLimit::default()
        }));
        assert!(matches!(
            broken.admit(ip("10.0.0.1"), now),
            Verdict::Misconfigured
        ));
    }
}
