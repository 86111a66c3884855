//! End to end in `--manifests` mode, over real sockets on 127.0.0.1 and [::1]: a ListenerSet's
//! listener, admitted by its Gateway's `allowedListeners`, serves the routes attached to the
//! ListenerSet and not those attached to the Gateway, and the other way round; a ListenerSet
//! its Gateway does not admit serves nothing.

use std::net::SocketAddr;
use std::time::Duration;

use conformance::client::{self, Conn};
use conformance::duet::free_port;
use conformance::manifests::gateway_class;
use conformance::{DuetBuilder, Family, Fleet, ManifestDir, PodSpec};
use serde_json::{json, Value};

const DUET: &str = env!("CARGO_BIN_EXE_duet");
const NS: &str = "e2e";

fn listener(name: &str, port: u16, host: &str) -> Value {
    json!({"name": name, "port": port, "protocol": "HTTP", "hostname": host})
}

/// Gateway `name` on `port` (hostname `gw.test`), admitting ListenerSets per `allowed`.
fn gateway(name: &str, port: u16, allowed: Option<&str>) -> Value {
    let mut g = json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"gatewayClassName": "duet",
                 "listeners": [listener("gw", port, &format!("{name}.gw.test"))]}
    });
    if let Some(from) = allowed {
        g["spec"]["allowedListeners"] = json!({"namespaces": {"from": from}});
    }
    g
}

fn listener_set(name: &str, gateway: &str, listeners: Vec<Value>) -> Value {
    json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "ListenerSet",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"parentRef": {"name": gateway}, "listeners": listeners}
    })
}

/// An HTTPRoute on `parent` sending `path` to Service `service`.
fn route(name: &str, parent: Value, path: &str, service: &str) -> Value {
    json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"parentRefs": [parent], "rules": [{
            "matches": [{"path": {"type": "PathPrefix", "value": path}}],
            "backendRefs": [{"name": service, "port": 8080}]}]}
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_sets_listener_serves_its_routes_not_the_gateways() -> anyhow::Result<()> {
    let (open, own, closed) = (free_port()?, free_port()?, free_port()?);
    let set_ref = |name: &str| json!({"kind": "ListenerSet", "name": name});
    let docs = vec![
        gateway_class(),
        gateway("open", open, Some("Same")),
        // One listener on the Gateway's port, one on a port of its own.
        listener_set(
            "extra",
            "open",
            vec![
                listener("ls", open, "ls.test"),
                listener("own", own, "own.test"),
            ],
        ),
        route("gw-route", json!({"name": "open"}), "/gw", "gw-svc"),
        route("ls-route", set_ref("extra"), "/ls", "ls-svc"),
        // Gateway `closed` admits no ListenerSet (the default): `refused` serves nothing.
        gateway("closed", closed, None),
        listener_set(
            "refused",
            "closed",
            vec![listener("ls", closed, "refused.test")],
        ),
        route("refused-route", set_ref("refused"), "/", "ls-svc"),
    ];
    let dir = ManifestDir::new()?;
    let mut fleets = Vec::new();
    for service in ["gw-svc", "ls-svc"] {
        let fleet = Fleet::start(NS, service, &[PodSpec::dual(&format!("{service}-pod"))])?;
        dir.write(&format!("svc-{service}.yaml"), &fleet.manifests())?;
        fleets.push(fleet);
    }
    dir.write("gateway.yaml", &docs)?;
    let _duet = DuetBuilder::new(DUET, dir.path()).start().await?;
    for family in Family::BOTH {
        let mut conn =
            client::eventually("Gateway listener bound", Duration::from_secs(10), || {
                Conn::http1(SocketAddr::new(family.loopback(), open))
            })
            .await?;
        for (host, path, service) in [
            ("ls.test", "/ls", "ls-svc"),
            ("open.gw.test", "/gw", "gw-svc"),
        ] {
            let reply = conn.get(host, path).await?;
            client::expect_status(&reply, 200)?;
            let echo = reply.echo()?;
            assert_eq!(echo.service, service, "{family} {host}{path}");
            assert_eq!(
                echo.family,
                conn.family(),
                "{family} {host}{path}: pod's family"
            );
        }
        // Each listener serves only its own parent's routes.
        for (host, path) in [("ls.test", "/gw"), ("open.gw.test", "/ls")] {
            let reply = conn.get(host, path).await?;
            client::expect_status(&reply, 404)?;
        }
        let mut conn =
            client::eventually("ListenerSet port bound", Duration::from_secs(10), || {
                Conn::http1(SocketAddr::new(family.loopback(), own))
            })
            .await?;
        let reply = conn.get("own.test", "/ls").await?;
        client::expect_status(&reply, 200)?;
        assert_eq!(reply.echo()?.service, "ls-svc", "{family} own.test/ls");
        let mut conn =
            client::eventually("Gateway listener bound", Duration::from_secs(10), || {
                Conn::http1(SocketAddr::new(family.loopback(), closed))
            })
            .await?;
        let reply = conn.get("refused.test", "/").await?;
        client::expect_status(&reply, 404)?;
    }
    Ok(())
}
