//! The rate-limit zones' clients hold bounded memory: full zones, then zones taking room from
//! each other, stay within the bytes per client the README states for `TOTAL_KEYS` clients.
//! Measured as the growth of this process's resident memory (its own test binary, one test;
//! glibc's malloc, which keeps what it freed).

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use dataplane::access_policy::RateLimit;
use dataplane::metrics::Metrics;
use dataplane::policy::rate_limit::{Clients, Verdict, Zone, TOTAL_KEYS, ZONE_KEYS};

/// Resident bytes of this process (`/proc/self/statm`, pages of 4 KiB).
fn resident() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("statm");
    let pages: usize = statm
        .split(' ')
        .nth(1)
        .and_then(|p| p.parse().ok())
        .expect("rss");
    pages * 4096
}

/// Bytes per remembered client the README states at most (a 96-byte node, its share of the
/// hash table, the nodes a zone keeps after others took room from it; measured: 108 for full
/// zones, 139 at most while zones take room from each other).
const BYTES_PER_CLIENT: usize = 160;

/// Sends one request from each of `n` new clients (IPv6 /64s, distinct per zone and round).
fn arrive(zone: &Arc<Zone>, tag: u32, n: u32, now: Instant) {
    for i in 0..n {
        let net = (0x2001_0db8_u128 << 32) | (u128::from(tag) << 20) | u128::from(i);
        let ip = IpAddr::V6((net << 64).into());
        assert!(matches!(zone.admit(ip, now), Verdict::Admitted(_)));
    }
}

fn per_client(base: usize, clients: &Clients) -> usize {
    resident().saturating_sub(base) / clients.len().max(1)
}

#[test]
fn clients_cost_bounded_memory() {
    let now = Instant::now();
    let base = resident();
    let clients = Clients::new(ZONE_KEYS, TOTAL_KEYS, Metrics::unregistered());
    let limits = |rpm| RateLimit {
        rpm: Some(rpm),
        ..RateLimit::default()
    };
    let zones: Vec<_> = (1..=8)
        .map(|rpm| Arc::new(Zone::new(limits(rpm), &clients)))
        .collect();
    let per_zone = ZONE_KEYS as u32;
    // Five zones fill up: all zones together are full.
    for (tag, z) in zones.iter().take(5).enumerate() {
        arrive(z, tag as u32, per_zone, now);
    }
    assert_eq!(clients.len(), TOTAL_KEYS);
    let full = per_client(base, &clients);
    // Three more zones take room from them, then the first five take it back.
    for (tag, z) in zones.iter().enumerate() {
        arrive(z, 100 + tag as u32, per_zone, now);
        assert_eq!(clients.len(), TOTAL_KEYS);
        let bytes = per_client(base, &clients);
        assert!(bytes <= BYTES_PER_CLIENT, "{bytes} bytes per client");
    }
    let churned = per_client(base, &clients);
    println!("bytes per client: {full} full, {churned} after zones took room from each other");
    drop(zones);
    assert_eq!(clients.len(), 0);
}
