//! End to end in `--manifests` mode, over real sockets on 127.0.0.1 and [::1]: TLS listeners of
//! both modes on one port. The server name (SNI) of each connection picks the listener: the
//! passthrough listener's hostname is relayed unterminated (the client sees the upstream's
//! certificate), the terminate listener's is decrypted with the listener's certificate and
//! relayed as plain TCP; a name neither takes is closed. The pod is reached over the client's
//! family either way.

use std::net::SocketAddr;
use std::time::Duration;

use conformance::client::{self, Conn, Reply};
use conformance::duet::free_port;
use conformance::echo::EchoOptions;
use conformance::http::Method;
use conformance::manifests::gateway_class;
use conformance::tls;
use conformance::{DuetBuilder, Family, Fleet, ManifestDir, PodSpec};
use serde_json::json;

const DUET: &str = env!("CARGO_BIN_EXE_duet");
const NS: &str = "e2e";

/// A TLS handshake with `sni`, then `GET /` for it: the certificate the client saw and the reply.
async fn get(to: SocketAddr, sni: &str) -> anyhow::Result<(Vec<u8>, Reply)> {
    let (stream, hs) = tls::handshake(to, Some(sni), &["http/1.1"], &[]).await?;
    let local = stream.get_ref().0.local_addr()?;
    let mut conn = Conn::over(stream, local, to, false).await?;
    let req = client::request(Method::GET, sni, "/").body(
        conformance::http_body_util::Full::new(conformance::bytes::Bytes::new()),
    )?;
    Ok((hs.cert, conn.send(req).await?))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passthrough_and_terminate_listeners_share_a_port_by_server_name() -> anyhow::Result<()> {
    let upstream = tls::cert(&["vault.test"]);
    let duet_cert = tls::cert(&["term.test"]);
    let _fleets = [
        Fleet::start_with(
            NS,
            "vault",
            &[PodSpec::dual("vault-0")],
            EchoOptions {
                tls: Some(tls::server_config(&upstream, &["http/1.1"])),
                ..EchoOptions::default()
            },
        )?,
        Fleet::start(NS, "web", &[PodSpec::dual("web-0")])?,
    ];
    let dir = ManifestDir::new()?;
    for fleet in &_fleets {
        dir.write(&format!("svc-{}.yaml", fleet.service()), &fleet.manifests())?;
    }
    dir.write("secret.yaml", &[tls::secret(NS, "term-cert", &duet_cert)])?;
    let port = free_port()?;
    let route = |name: &str, section: &str, host: &str, backend: &str| {
        json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "TLSRoute",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"parentRefs": [{"name": "gw", "sectionName": section}],
                     "hostnames": [host],
                     "rules": [{"backendRefs": [{"name": backend, "port": 8080}]}]}
        })
    };
    dir.write(
        "gateway.yaml",
        &[
            gateway_class(),
            json!({
                "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
                "metadata": {"name": "gw", "namespace": NS},
                "spec": {"gatewayClassName": "duet", "listeners": [
                    {"name": "term", "port": port, "protocol": "TLS", "hostname": "term.test",
                     "tls": {"mode": "Terminate", "certificateRefs": [{"name": "term-cert"}]}},
                    {"name": "pass", "port": port, "protocol": "TLS", "hostname": "vault.test",
                     "tls": {"mode": "Passthrough"}}]}
            }),
            route("pass", "pass", "vault.test", "vault"),
            route("term", "term", "term.test", "web"),
        ],
    )?;
    let mut duet = DuetBuilder::new(DUET, dir.path()).start().await?;
    for family in Family::BOTH {
        let to = SocketAddr::new(family.loopback(), port);
        // The passthrough listener's name: unterminated, the upstream's certificate and pod.
        let (cert, reply) = client::eventually(
            "the passthrough listener relaying",
            Duration::from_secs(10),
            || get(to, "vault.test"),
        )
        .await?;
        assert_eq!(cert, upstream.der, "{family}: the upstream's certificate");
        client::expect_status(&reply, 200)?;
        let echo = reply.echo()?;
        assert_eq!((echo.pod.as_str(), echo.family), ("vault-0", family));

        // The terminate listener's name on the same port: duet's certificate, the decrypted
        // stream to the plain pod.
        let (cert, reply) = get(to, "term.test").await?;
        assert_eq!(cert, duet_cert.der, "{family}: the listener's certificate");
        client::expect_status(&reply, 200)?;
        let echo = reply.echo()?;
        assert_eq!((echo.pod.as_str(), echo.family), ("web-0", family));
        assert_eq!(echo.headers.get("X-Forwarded-For"), None, "{family}");

        // A name neither listener takes: closed, never terminated.
        let other = get(to, "other.test").await;
        assert!(other.is_err(), "{family}: served {other:?}");
    }
    duet.check_running()?;
    Ok(())
}
