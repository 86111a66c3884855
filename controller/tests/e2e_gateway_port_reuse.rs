//! End to end in `--manifests` mode, over real sockets on 127.0.0.1 and [::1]: a Gateway pod
//! port that changes hands. When the port of a deleted HTTP Gateway goes to a new Gateway's TLS
//! passthrough listener (and back), the new listener serves it at once, on both families, with no
//! other change needed to wake duet; a port another process holds when duet wants it is served
//! once that process lets it go.

use std::net::SocketAddr;
use std::time::Duration;

use conformance::client::{self, Conn, Reply};
use conformance::duet::free_port;
use conformance::echo::EchoOptions;
use conformance::http::Method;
use conformance::manifests::gateway_class;
use conformance::tls::{self, TestCert};
use conformance::{Duet, DuetBuilder, Family, Fleet, ManifestDir, PodSpec};
use serde_json::{json, Value};

const DUET: &str = env!("CARGO_BIN_EXE_duet");
const NS: &str = "e2e";

/// How long a port may take to serve its new listener: the manifest reload's debounce (up to
/// about 500 ms) and a margin for a loaded machine. Without the retry the port never serves.
const LIVE: Duration = Duration::from_secs(8);

/// Gateway `web-gw`, an HTTP listener on `port`, and its HTTPRoute `web.test` to Service `web`.
fn http_gateway(port: u16) -> Vec<Value> {
    vec![
        json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
            "metadata": {"name": "web-gw", "namespace": NS},
            "spec": {"gatewayClassName": "duet", "listeners": [
                {"name": "http", "port": port, "protocol": "HTTP"}]}
        }),
        json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
            "metadata": {"name": "web", "namespace": NS},
            "spec": {"parentRefs": [{"name": "web-gw"}], "hostnames": ["web.test"],
                     "rules": [{"backendRefs": [{"name": "web", "port": 8080}]}]}
        }),
    ]
}

/// Gateway `tls-gw`, a TLS passthrough listener on `port`, and its TLSRoute `vault.test` to
/// Service `vault`.
fn tls_gateway(port: u16) -> Vec<Value> {
    vec![
        json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
            "metadata": {"name": "tls-gw", "namespace": NS},
            "spec": {"gatewayClassName": "duet", "listeners": [
                {"name": "tls", "port": port, "protocol": "TLS", "tls": {"mode": "Passthrough"},
                 "allowedRoutes": {"kinds": [{"kind": "TLSRoute"}]}}]}
        }),
        json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "TLSRoute",
            "metadata": {"name": "vault", "namespace": NS},
            "spec": {"parentRefs": [{"name": "tls-gw"}], "hostnames": ["vault.test"],
                     "rules": [{"backendRefs": [{"name": "vault", "port": 8080}]}]}
        }),
    ]
}

struct Setup {
    duet: Duet,
    dir: ManifestDir,
    upstream: TestCert,
    _fleets: Vec<Fleet>,
}

/// A plain dual-stack pod `web`, a TLS dual-stack pod `vault`, `gateway` in the folder; duet.
async fn setup(gateway: Vec<Value>) -> anyhow::Result<Setup> {
    let upstream = tls::cert(&["vault.test"]);
    let fleets = vec![
        Fleet::start(NS, "web", &[PodSpec::dual("web-0")])?,
        Fleet::start_with(
            NS,
            "vault",
            &[PodSpec::dual("vault-0")],
            EchoOptions {
                tls: Some(tls::server_config(&upstream, &["http/1.1"])),
                ..EchoOptions::default()
            },
        )?,
    ];
    let dir = ManifestDir::new()?;
    for fleet in &fleets {
        dir.write(&format!("svc-{}.yaml", fleet.service()), &fleet.manifests())?;
    }
    write_gateway(&dir, gateway)?;
    let duet = DuetBuilder::new(DUET, dir.path()).start().await?;
    Ok(Setup {
        duet,
        dir,
        upstream,
        _fleets: fleets,
    })
}

fn write_gateway(dir: &ManifestDir, gateway: Vec<Value>) -> anyhow::Result<()> {
    let mut docs = vec![gateway_class()];
    docs.extend(gateway);
    Ok(dir.write("gateway.yaml", &docs)?)
}

/// `GET /` for `web.test` in plain HTTP reaches the pod `web-0` over the client's family, on
/// each family, within [`LIVE`].
async fn http_served(port: u16) -> anyhow::Result<()> {
    for family in Family::BOTH {
        let to = SocketAddr::new(family.loopback(), port);
        let reply = client::eventually(
            &format!("{family} HTTP client served on port {port}"),
            LIVE,
            || async {
                let reply = client::get(to, "web.test", "/").await?;
                client::expect_status(&reply, 200)?;
                Ok(reply)
            },
        )
        .await?;
        let echo = reply.echo()?;
        assert_eq!((echo.pod.as_str(), echo.family), ("web-0", family));
    }
    Ok(())
}

/// A TLS handshake with SNI `vault.test`, then `GET /`: the certificate the client saw and the
/// reply.
async fn tls_get(to: SocketAddr) -> anyhow::Result<(Vec<u8>, Reply)> {
    let (stream, hs) = tls::handshake(to, Some("vault.test"), &["http/1.1"], &[]).await?;
    let local = stream.get_ref().0.local_addr()?;
    let mut conn = Conn::over(stream, local, to, false).await?;
    let req = client::request(Method::GET, "vault.test", "/").body(
        conformance::http_body_util::Full::new(conformance::bytes::Bytes::new()),
    )?;
    Ok((hs.cert, conn.send(req).await?))
}

/// A TLS connection for `vault.test` is relayed unterminated to `vault-0` over the client's
/// family, on each family, within [`LIVE`].
async fn passthrough_served(port: u16, upstream: &TestCert) -> anyhow::Result<()> {
    for family in Family::BOTH {
        let to = SocketAddr::new(family.loopback(), port);
        let (cert, reply) = client::eventually(
            &format!("{family} TLS client relayed on port {port}"),
            LIVE,
            || tls_get(to),
        )
        .await?;
        assert_eq!(cert, upstream.der, "{family}: the upstream's certificate");
        client::expect_status(&reply, 200)?;
        let echo = reply.echo()?;
        assert_eq!((echo.pod.as_str(), echo.family), ("vault-0", family));
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_port_passed_between_an_http_and_a_tls_gateway_serves_the_new_one_at_once(
) -> anyhow::Result<()> {
    let port = free_port()?;
    let mut s = setup(http_gateway(port)).await?;
    http_served(port).await?;
    // An open keep-alive connection of each family to the old listener, as a suite's client
    // leaves behind.
    let mut old = Vec::new();
    for family in Family::BOTH {
        let mut conn = Conn::http1(SocketAddr::new(family.loopback(), port)).await?;
        client::expect_status(&conn.get("web.test", "/").await?, 200)?;
        old.push(conn);
    }

    // The HTTP Gateway is deleted and a TLS one takes its port: one change, nothing after it.
    write_gateway(&s.dir, tls_gateway(port))?;
    passthrough_served(port, &s.upstream).await?;

    // And back: the port goes from passthrough to plain HTTP.
    write_gateway(&s.dir, http_gateway(port))?;
    http_served(port).await?;
    s.duet.check_running()?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_port_held_by_another_process_is_served_once_freed() -> anyhow::Result<()> {
    let port = free_port()?;
    let held = [
        dataplane::listen::bind(SocketAddr::from(([0u8; 4], port)))?,
        dataplane::listen::bind(SocketAddr::from(([0u16; 8], port)))?,
    ];
    let mut s = setup(http_gateway(port)).await?;
    client::eventually("duet has tried the held port", LIVE, || {
        let logs = s.duet.logs();
        async move {
            anyhow::ensure!(
                logs.contains("Cannot bind a Gateway listener"),
                "no bind failure logged yet"
            );
            Ok(())
        }
    })
    .await?;
    // Freed, with no change to the manifests: duet binds it by itself, on both families.
    drop(held);
    http_served(port).await?;
    s.duet.check_running()?;
    Ok(())
}
