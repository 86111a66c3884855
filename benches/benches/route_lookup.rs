//! Route lookup in a table of 10,000 hosts and 50,000 paths.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};

fn lookup(c: &mut Criterion) {
    let table = benches::route_table(10_000, 5);
    let mut g = c.benchmark_group("route_lookup/10k_hosts_50k_paths");
    g.bench_function("exact_host_prefix_path", |b| {
        b.iter(|| {
            table.find(
                black_box("host-7342.example.com"),
                black_box("/api/v4/items/42"),
            )
        })
    });
    g.bench_function("exact_host_mixed_case_with_port", |b| {
        b.iter(|| {
            table.find(
                black_box("Host-7342.Example.com:8080"),
                black_box("/static/3/index.html"),
            )
        })
    });
    g.bench_function("wildcard_host", |b| {
        b.iter(|| table.find(black_box("a.wild-4200.example.com"), black_box("/x")))
    });
    g.bench_function("miss_404", |b| {
        b.iter(|| table.find(black_box("nobody.example.org"), black_box("/")))
    });
    g.finish();
}

criterion_group!(benches, lookup);
criterion_main!(benches);
