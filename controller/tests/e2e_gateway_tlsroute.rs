//! End to end in `--manifests` mode, over real sockets on 127.0.0.1 and [::1]: Gateway listeners
//! of protocol `TLS` and their TLSRoutes. On a listener in mode `Passthrough` a TLS connection is
//! relayed unterminated, by its server name (SNI), to the TLSRoute whose hostnames take it (an
//! exact name, a wildcard): the client sees the upstream's certificate and completes a request
//! with it, nothing added by duet; the pod is reached over the client's family (the other family
//! when the pod has only that one), or as the route's family policy annotation says. On a
//! listener in mode `Terminate`, duet completes the handshake with the listener's certificate and
//! relays the decrypted stream to a plain pod of the client's family. An unknown server name and a ClientHello without one get no
//! relay; a Terminate listener without certificate serves nothing.

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

/// `N` distinct free ports (a port just released may be picked again).
fn free_ports<const N: usize>() -> anyhow::Result<[u16; N]> {
    let mut ports = [0u16; N];
    for i in 0..N {
        ports[i] = (0..20)
            .find_map(|_| free_port().ok().filter(|p| !ports[..i].contains(p)))
            .ok_or_else(|| anyhow::anyhow!("no distinct free port"))?;
    }
    Ok(ports)
}

/// A TLS listener: `(name, port, mode, hostname, certificate Secret)`.
type Listener<'a> = (&'a str, u16, &'a str, Option<&'a str>, Option<&'a str>);

fn gateway(listeners: &[Listener<'_>]) -> Value {
    let listeners: Vec<Value> = listeners
        .iter()
        .map(|(name, port, mode, host, cert)| {
            let mut l = json!({
                "name": name, "port": port, "protocol": "TLS", "tls": {"mode": mode},
                "allowedRoutes": {"kinds": [{"kind": "TLSRoute"}]}
            });
            if let Some(h) = host {
                l["hostname"] = json!(h);
            }
            if let Some(c) = cert {
                l["tls"]["certificateRefs"] = json!([{"name": c}]);
            }
            l
        })
        .collect();
    json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
        "metadata": {"name": "gw", "namespace": NS},
        "spec": {"gatewayClassName": "duet", "listeners": listeners}
    })
}

/// A TLSRoute on listener `section` with `hostnames`, to the Services `(name, weight)`.
fn route(name: &str, section: &str, hostnames: &[&str], backends: &[(&str, u32)]) -> Value {
    let refs: Vec<Value> = backends
        .iter()
        .map(|(n, w)| json!({"name": n, "port": 8080, "weight": w}))
        .collect();
    json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "TLSRoute",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"parentRefs": [{"name": "gw", "sectionName": section}],
                 "hostnames": hostnames, "rules": [{"backendRefs": refs}]}
    })
}

/// `route` with the family policy annotation.
fn with_policy(mut route: Value, policy: &str) -> Value {
    route["metadata"]["annotations"] = json!({"duet.dev/upstream-family": policy});
    route
}

struct Setup {
    duet: Duet,
    upstream: TestCert,
    duet_cert: TestCert,
    /// The ports of the passthrough listener, the terminate listener, the certificate-less one.
    ports: (u16, u16, u16),
    _fleets: Vec<Fleet>,
    _dir: ManifestDir,
}

/// TLS pods: `vault` (dual stack), `v6` (IPv6 only), `other` (dual stack, weight 0 next to
/// `vault`), and a plain pod `web`; TLSRoutes `vault.test` and `*.v6.test` on a passthrough
/// listener without hostname, `term.test` on a terminate listener of `term.test` (to `web`), and a route on a terminate listener without certificate.
async fn setup() -> anyhow::Result<Setup> {
    let upstream = tls::cert(&["vault.test", "*.v6.test"]);
    let duet_cert = tls::cert(&["term.test"]);
    let tls_pods = || EchoOptions {
        tls: Some(tls::server_config(&upstream, &["http/1.1"])),
        ..EchoOptions::default()
    };
    let fleets = vec![
        Fleet::start_with(NS, "vault", &[PodSpec::dual("vault-0")], tls_pods())?,
        Fleet::start_with(NS, "v6", &[PodSpec::v6_only("v6-0")], tls_pods())?,
        Fleet::start_with(NS, "other", &[PodSpec::dual("other-0")], tls_pods())?,
        Fleet::start(NS, "web", &[PodSpec::dual("web-0")])?,
    ];
    let dir = ManifestDir::new()?;
    for fleet in &fleets {
        dir.write(&format!("svc-{}.yaml", fleet.service()), &fleet.manifests())?;
    }
    dir.write("secret.yaml", &[tls::secret(NS, "term-cert", &duet_cert)])?;
    let [port, term, nocert] = free_ports::<3>()?;
    let docs = vec![
        gateway_class(),
        gateway(&[
            ("pass", port, "Passthrough", None, None),
            (
                "term",
                term,
                "Terminate",
                Some("term.test"),
                Some("term-cert"),
            ),
            ("nocert", nocert, "Terminate", None, None),
        ]),
        route(
            "vault",
            "pass",
            &["vault.test"],
            &[("vault", 1), ("other", 0)],
        ),
        route("v6", "pass", &["*.v6.test"], &[("v6", 1)]),
        with_policy(
            route("strict", "pass", &["only.v6.test"], &[("v6", 1)]),
            "RequireSameFamily",
        ),
        with_policy(
            route("pref6", "pass", &["pref.v6.test"], &[("vault", 1)]),
            "PreferIPv6",
        ),
        route("term", "term", &["term.test"], &[("web", 1)]),
        route("nocert", "nocert", &["vault.test"], &[("vault", 1)]),
    ];
    dir.write("gateway.yaml", &docs)?;
    let duet = DuetBuilder::new(DUET, dir.path()).start().await?;
    Ok(Setup {
        duet,
        upstream,
        duet_cert,
        ports: (port, term, nocert),
        _fleets: fleets,
        _dir: dir,
    })
}

/// A TLS handshake with `sni` (`None`: none sent), then `GET /` for `host`: the certificate the
/// client saw and the reply.
async fn get(to: SocketAddr, sni: Option<&str>, host: &str) -> anyhow::Result<(Vec<u8>, Reply)> {
    let (stream, hs) = tls::handshake(to, sni, &["http/1.1"], &[]).await?;
    let local = stream.get_ref().0.local_addr()?;
    let mut conn = Conn::over(stream, local, to, false).await?;
    let req = client::request(Method::GET, host, "/").body(
        conformance::http_body_util::Full::new(conformance::bytes::Bytes::new()),
    )?;
    Ok((hs.cert, conn.send(req).await?))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tlsroutes_relay_by_sni_passed_through_or_terminated_to_the_pod_of_the_client_family(
) -> anyhow::Result<()> {
    let mut s = setup().await?;
    let (pass, term, nocert) = s.ports;
    for family in Family::BOTH {
        let to = SocketAddr::new(family.loopback(), pass);
        let (cert, reply) = client::eventually(
            "Gateway passthrough listener relaying",
            Duration::from_secs(10),
            || get(to, Some("vault.test"), "vault.test"),
        )
        .await?;
        // The upstream's own certificate, a request completed with it, the pod of the client's
        // family (the weight-0 backendRef never chosen), nothing added by duet.
        assert_eq!(cert, s.upstream.der, "{family}: the upstream's certificate");
        client::expect_status(&reply, 200)?;
        let echo = reply.echo()?;
        assert_eq!(echo.pod, "vault-0", "{family}");
        assert_eq!(echo.family, family, "{family}: pod of the client's family");
        assert_eq!(echo.headers.get("X-Forwarded-For"), None, "{family}");
        for _ in 0..5 {
            let (_, reply) = get(to, Some("Vault.Test"), "vault.test").await?;
            assert_eq!(
                reply.echo()?.pod,
                "vault-0",
                "{family}: weight 0 never chosen"
            );
        }

        // A wildcard route hostname; an IPv6-only pod serves both families.
        let (cert, reply) = get(to, Some("a.b.v6.test"), "a.b.v6.test").await?;
        assert_eq!(cert, s.upstream.der, "{family}");
        client::expect_status(&reply, 200)?;
        let echo = reply.echo()?;
        assert_eq!((echo.pod.as_str(), echo.family), ("v6-0", Family::V6));

        // The route's family policy: RequireSameFamily leaves IPv4 clients of an IPv6-only pod
        // without a target (closed); PreferIPv6 takes a dual-stack pod's IPv6 address for both.
        let strict = get(to, Some("only.v6.test"), "only.v6.test").await;
        match family {
            Family::V4 => assert!(
                strict.is_err(),
                "v4 client relayed: {:?}",
                strict.map(|r| r.1.body)
            ),
            Family::V6 => assert_eq!(strict?.1.echo()?.pod, "v6-0"),
        }
        let (_, reply) = get(to, Some("pref.v6.test"), "pref.v6.test").await?;
        let echo = reply.echo()?;
        assert_eq!((echo.pod.as_str(), echo.family), ("vault-0", Family::V6));

        // No route for the server name, or none sent: closed, never terminated by duet.
        for sni in [Some("unknown.test"), Some("v6.test"), None] {
            let got = get(to, sni, "vault.test").await;
            assert!(got.is_err(), "{family} {sni:?}: relayed or served: {got:?}");
        }

        // The Terminate listener: duet's certificate, the decrypted stream relayed as it is to
        // the plain pod of the client's family.
        let at_term = SocketAddr::new(family.loopback(), term);
        let (cert, reply) = get(at_term, Some("term.test"), "term.test").await?;
        assert_eq!(
            cert, s.duet_cert.der,
            "{family}: the listener's certificate"
        );
        client::expect_status(&reply, 200)?;
        let echo = reply.echo()?;
        assert_eq!((echo.pod.as_str(), echo.family), ("web-0", family));
        assert_eq!(echo.headers.get("X-Forwarded-For"), None, "{family}");

        // A Terminate listener without certificate is not served: nothing listens on its port.
        let refused = get(
            SocketAddr::new(family.loopback(), nocert),
            Some("vault.test"),
            "vault.test",
        )
        .await;
        assert!(
            refused.is_err(),
            "{family}: terminate listener served: {refused:?}"
        );
        s.duet.check_running()?;
    }
    Ok(())
}
