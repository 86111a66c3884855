//! Fixtures shared by duet's criterion benches: large route tables and backends built directly
//! from the dataplane types.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use dataplane::table::{HostRules, UpstreamProtocol};
use dataplane::{
    Backend, BackendId, FamilyPolicy, LbPolicy, Origin, PathMatch, PathRule, RouteAction,
    RouteTable, Target, TargetId,
};

/// A table of `hosts` exact hosts (`host-N.example.com`) with `paths_per_host` Prefix and Exact
/// paths each, plus one wildcard per 100 hosts.
pub fn route_table(hosts: usize, paths_per_host: usize) -> RouteTable {
    let mut table = RouteTable::default();
    for h in 0..hosts {
        let host = format!("host-{h}.example.com");
        let rules = (0..paths_per_host)
            .map(|p| {
                let matcher = if p % 2 == 0 {
                    PathMatch::prefix(&format!("/api/v{p}/items"))
                } else {
                    PathMatch::exact(&format!("/static/{p}/index.html"))
                };
                rule(matcher, &format!("ns-{}/svc-{h}:80", h % 50), h as i64)
            })
            .collect();
        table
            .exact
            .insert(host.clone().into(), HostRules::new(&host, rules).0);
        if h % 100 == 0 {
            let wildcard = format!("*.wild-{h}.example.com");
            let rules = vec![rule(PathMatch::prefix("/"), "ns/wild:80", 0)];
            table.wildcard.insert(
                wildcard[2..].to_owned().into(),
                HostRules::new(&wildcard, rules).0,
            );
        }
    }
    table
}

fn rule(matcher: PathMatch, backend: &str, created: i64) -> PathRule {
    PathRule {
        matcher,
        when: None,
        action: RouteAction {
            backend: backend.parse::<BackendId>().unwrap(),
            policy: FamilyPolicy::PreferSameFamily,
            origin: Origin {
                kind: Default::default(),
                namespace: "ns".into(),
                name: "ing".into(),
                created,
            }
            .into(),
            redirect_https: false,
            max_body_bytes: 0,
            upstream_tls: None,
            timeouts: Default::default(),
            protocol: None,
            redirect: None,
            source_ranges: None,
            rewrite: None,
            access: None,
            choice: None,
            filters: None,
            client_auth: None,
        },
    }
}

/// A backend of `n` targets: a third dual-stack, a third IPv4-only, a third IPv6-only.
pub fn backend(n: usize, lb: LbPolicy) -> Arc<Backend> {
    let targets: Vec<Target> = (0..n)
        .map(|i| {
            let v4 = SocketAddr::from((Ipv4Addr::from(0x0a00_0000 + i as u32), 8080));
            let v6 = SocketAddr::from((Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, i as u16), 8080));
            let addrs = [(i % 3 != 2).then_some(v4), (i % 3 != 1).then_some(v6)];
            Target::with_addrs(
                TargetId(format!("pod-{i}").into()),
                addrs.into_iter().flatten(),
                None,
            )
        })
        .collect();
    Arc::new(Backend {
        id: "ns/svc:80".parse::<BackendId>().unwrap(),
        targets: targets.into(),
        lb,
        protocol: UpstreamProtocol::Http1,
    })
}
