//! Balancer pick over 1,000 targets (a third dual-stack, a third per single family).

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use dataplane::balance::LiveBackend;
use dataplane::{Family, FamilyPolicy, LbPolicy};

fn pick(c: &mut Criterion) {
    let mut g = c.benchmark_group("balancer_pick/1000_targets");
    for (name, lb) in [
        ("p2c", LbPolicy::P2c),
        ("round_robin", LbPolicy::RoundRobin),
    ] {
        let live = LiveBackend::new(benches::backend(1_000, lb), None);
        for (policy_name, policy) in [
            ("prefer_same", FamilyPolicy::PreferSameFamily),
            ("require_same", FamilyPolicy::RequireSameFamily),
        ] {
            g.bench_function(format!("{name}/{policy_name}/ipv6_client"), |b| {
                b.iter(|| live.pick(black_box(Family::V6), black_box(policy), &[]))
            });
        }
    }
    g.finish();
}

criterion_group!(benches, pick);
criterion_main!(benches);
