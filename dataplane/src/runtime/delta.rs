//! Applying a snapshot that differs from the live one only in some backends
//! ([`Runtime::apply_changed`](crate::runtime::Runtime::apply_changed)): work proportional to
//! what changed, everything else carried over by pointer.

use std::sync::Arc;

use super::Live;
use crate::balance::LiveBackend;
use crate::table::{BackendId, Snapshot};

/// Whether `snapshot` can be applied as a change of `base` over `live`: `base` is the live
/// snapshot and `snapshot` shares its routes, certificates and Gateway listeners and has as many
/// backends.
pub(crate) fn applies(live: &Live, snapshot: &Snapshot, base: &Arc<Snapshot>) -> bool {
    Arc::ptr_eq(&live.snapshot, base)
        && Arc::ptr_eq(&base.routes, &snapshot.routes)
        && Arc::ptr_eq(&base.certs, &snapshot.certs)
        && Arc::ptr_eq(&base.gateways, &snapshot.gateways)
        && base.backends.len() == snapshot.backends.len()
        && live.backends.len() == snapshot.backends.len()
}

/// The live backends of `snapshot`: those of `live`, with the `changed` ones rebuilt (carrying
/// per-target state over by `TargetId`) unless their `Arc` is the live one.
pub(crate) fn live_backends(
    live: &Live,
    snapshot: &Snapshot,
    changed: &[BackendId],
) -> crate::policy::Backends {
    let mut backends = live.backends.clone();
    for id in changed {
        let Some(backend) = snapshot.backends.get(id) else {
            continue;
        };
        let previous = live.backends.get(id);
        if previous.is_some_and(|p| Arc::ptr_eq(&p.backend, backend)) {
            continue;
        }
        let rebuilt = LiveBackend::new(backend.clone(), previous.map(|p| &**p));
        backends.insert(id.clone(), Arc::new(rebuilt));
    }
    backends
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;
    use std::sync::Arc;

    use crate::runtime::{Live, ProxyConfig, Runtime};
    use crate::table::{Backend, BackendId, Family, RouteTable, Snapshot, Target, TargetId};

    fn target(id: &str, v4: Option<&str>, v6: Option<&str>) -> Target {
        let addrs = [v4, v6].into_iter().flatten();
        let addrs = addrs.map(|a| a.parse::<SocketAddr>().unwrap());
        Target::with_addrs(TargetId(id.into()), addrs, None)
    }

    fn backend(id: &str, targets: Vec<Target>) -> Arc<Backend> {
        Arc::new(Backend {
            id: id.parse().unwrap(),
            targets: targets.into(),
            lb: Default::default(),
            protocol: Default::default(),
        })
    }

    fn with(base: &Snapshot, version: u64, replaced: &[Arc<Backend>]) -> Arc<Snapshot> {
        let mut next = Snapshot {
            version,
            ..base.clone()
        };
        for b in replaced {
            next.backends.insert(b.id.clone(), b.clone());
        }
        Arc::new(next)
    }

    fn metrics_text(runtime: &Runtime) -> String {
        let mut out = String::new();
        prometheus_client::encoding::prometheus_text::encode(
            &mut out,
            runtime.telemetry().registry(),
        )
        .unwrap();
        out
    }

    fn first() -> Arc<Snapshot> {
        let a = backend(
            "shop/a:80",
            vec![target("a-1", Some("10.0.0.1:80"), Some("[fd00::1]:80"))],
        );
        let b = backend(
            "shop/b:80",
            vec![
                target("b-1", Some("10.0.0.2:80"), Some("[fd00::2]:80")),
                target("b-2", Some("10.0.0.3:80"), None),
            ],
        );
        let mut snapshot = Snapshot {
            version: 1,
            ..Snapshot::default()
        };
        for x in [a, b] {
            snapshot.backends.insert(x.id.clone(), x);
        }
        Arc::new(snapshot)
    }

    #[test]
    fn only_the_changed_backends_are_rebuilt_and_their_state_carried_over() {
        let runtime = Runtime::new(ProxyConfig::default());
        let v1 = first();
        runtime.apply(v1.clone());
        let before = runtime.load_full();
        let b: BackendId = "shop/b:80".parse().unwrap();
        let a: BackendId = "shop/a:80".parse().unwrap();
        // b-1 has a request in flight and a failure on IPv4; b-2 leaves, b-3 (IPv6 only) comes.
        let _in_flight = before.backends[&b].states.start(0);
        before.backends[&b].states[0].record_failure(Family::V4);
        let new_b = backend(
            "shop/b:80",
            vec![
                target("b-1", Some("10.0.0.2:80"), Some("[fd00::2]:80")),
                target("b-3", None, Some("[fd00::4]:80")),
            ],
        );
        let v2 = with(&v1, 2, std::slice::from_ref(&new_b));
        runtime.apply_changed(v2.clone(), &v1, std::slice::from_ref(&b));

        let after = runtime.load_full();
        assert!(Arc::ptr_eq(&after.snapshot, &v2));
        assert!(
            Arc::ptr_eq(&after.backends[&a], &before.backends[&a]),
            "the unchanged backend keeps its live object"
        );
        assert!(Arc::ptr_eq(&after.backends[&b].backend, &new_b));
        assert!(
            std::ptr::eq(
                &after.backends[&b].states[0],
                &before.backends[&b].states[0]
            ),
            "b-1 keeps its state by TargetId"
        );
        assert_eq!(after.backends[&b].states[0].in_flight(), 1);
        assert_eq!(after.backends[&b].states[1].in_flight(), 0);
        let text = metrics_text(&runtime);
        for line in [
            r#"duet_backend_targets{namespace="shop",service="b",kind="dual"} 1"#,
            r#"duet_backend_targets{namespace="shop",service="b",kind="ipv4_only"} 0"#,
            r#"duet_backend_targets{namespace="shop",service="b",kind="ipv6_only"} 1"#,
            r#"duet_backend_targets{namespace="shop",service="a",kind="dual"} 1"#,
            "duet_snapshot_version 2",
        ] {
            assert!(text.contains(line), "{line}:\n{text}");
        }
        assert_eq!(*runtime.applied().borrow(), 2);
    }

    #[test]
    fn a_change_of_another_base_is_applied_whole() {
        let runtime = Runtime::new(ProxyConfig::default());
        let v1 = first();
        runtime.apply(v1.clone());
        let v2 = with(&v1, 2, &[backend("shop/a:80", vec![])]);
        runtime.apply(v2.clone());
        // Built on v1, naming only b: a's change in v2 must not survive as if v3 kept it.
        let new_b = backend("shop/b:80", vec![target("b-9", Some("10.0.0.9:80"), None)]);
        let v3 = with(&v1, 3, std::slice::from_ref(&new_b));
        let b: BackendId = "shop/b:80".parse().unwrap();
        runtime.apply_changed(v3.clone(), &v1, std::slice::from_ref(&b));
        let live = runtime.load_full();
        assert!(Arc::ptr_eq(&live.snapshot, &v3));
        let a: BackendId = "shop/a:80".parse().unwrap();
        assert_eq!(live.backends[&a].backend.targets.len(), 1, "a is v3's");
        assert!(Arc::ptr_eq(&live.backends[&b].backend, &new_b));
        let text = metrics_text(&runtime);
        let line = r#"duet_backend_targets{namespace="shop",service="a",kind="dual"} 1"#;
        assert!(text.contains(line), "{line}:\n{text}");
    }

    /// A table whose one route (the default backend) goes to `backend` for Ingress `ingress`.
    fn table_to(ingress: &str, backend: &str) -> Arc<RouteTable> {
        let origin = crate::table::Origin {
            kind: Default::default(),
            namespace: "shop".into(),
            name: ingress.into(),
            created: 0,
        };
        let action = crate::table::RouteAction {
            origin: origin.into(),
            ..crate::table::RouteAction::to(backend)
        };
        Arc::new(RouteTable {
            default_backend: Some(action),
            ..RouteTable::default()
        })
    }

    fn with_routes(base: &Snapshot, version: u64, routes: Arc<RouteTable>) -> Arc<Snapshot> {
        Arc::new(Snapshot {
            version,
            routes,
            ..base.clone()
        })
    }

    #[test]
    fn prepared_route_handles_are_used_only_when_made_from_the_live_state() {
        let runtime = Runtime::new(ProxyConfig::default());
        let v1 = first();
        runtime.apply(v1.clone());
        // The handles `metrics` holds for the one route of `snapshot`.
        let handles_of = |metrics: &crate::metrics::LiveMetrics, snapshot: &Snapshot| {
            let action = snapshot.routes.default_backend.as_ref().unwrap();
            metrics.route(action).expect("the route's handles").clone()
        };
        let handles = |live: &Live| handles_of(&live.metrics, &live.snapshot);

        // Made from v1's live state for v2's routes: v2 goes live with them.
        let v2 = with_routes(&v1, 2, table_to("web", "shop/a:80"));
        let prepared = runtime.prepare_routes(&v2.routes, &v2.gateways);
        let made = handles_of(&prepared.metrics, &v2);
        runtime.apply_prepared(v2.clone(), prepared);
        let live = runtime.load_full();
        assert!(Arc::ptr_eq(&live.snapshot, &v2));
        assert!(Arc::ptr_eq(&handles(&live), &made));
        assert_eq!(live.backends.len(), 2);

        // Made from v2's state, but v3 went live before v4 is applied: made again from v3's.
        let v4 = with_routes(&v2, 4, table_to("api", "shop/b:80"));
        let stale = runtime.prepare_routes(&v4.routes, &v4.gateways);
        let stale_made = handles_of(&stale.metrics, &v4);
        let v3 = with_routes(&v2, 3, table_to("shop", "shop/b:80"));
        runtime.apply(v3);
        runtime.apply_prepared(v4.clone(), stale);
        let live = runtime.load_full();
        assert!(Arc::ptr_eq(&live.snapshot, &v4));
        assert!(!Arc::ptr_eq(&handles(&live), &stale_made));
        assert_eq!(handles(&live).route_labels()[1].as_ref(), "api");

        // Made for other routes than the snapshot's: made again.
        let v5 = with_routes(&v4, 5, table_to("cart", "shop/a:80"));
        let other = runtime.prepare_routes(&table_to("cart", "shop/a:80"), &v5.gateways);
        runtime.apply_prepared(v5.clone(), other);
        let live = runtime.load_full();
        assert_eq!(handles(&live).route_labels()[1].as_ref(), "cart");
        assert_eq!(*runtime.applied().borrow(), 5);
    }
}
