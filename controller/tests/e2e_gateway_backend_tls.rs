//! End to end in `--manifests` mode, over real sockets on 127.0.0.1 and [::1]: BackendTLSPolicy.
//! An HTTPRoute's backends are Services whose dual-stack pods serve TLS with a certificate for
//! `abc.example.com` (and a SPIFFE URI) only, never for their addresses; a BackendTLSPolicy per
//! Service makes duet speak TLS to them, verified against a CA ConfigMap, with the policy's
//! hostname as SNI and as the name checked (or its subjectAltNames instead). Clients of each
//! family reach the pods over their own family, so the checks hold for pods reached over IPv6.

use std::net::SocketAddr;

use conformance::client::{self, Conn};
use conformance::duet::free_port;
use conformance::echo::EchoOptions;
use conformance::manifests::gateway_class;
use conformance::tls::{self, TestCa};
use conformance::{DuetBuilder, Family, Fleet, ManifestDir, PodSpec};
use serde_json::{json, Value};

const DUET: &str = env!("CARGO_BIN_EXE_duet");
const NS: &str = "btls";
const SPIFFE: &str = "spiffe://abc.example.com/test-identity";

fn gateway_docs(port: u16, services: &[&str]) -> Vec<Value> {
    let rules: Vec<Value> = services
        .iter()
        .map(|s| {
            json!({
                "matches": [{"path": {"type": "PathPrefix", "value": format!("/{s}")}}],
                "backendRefs": [{"name": s, "port": 8080}]
            })
        })
        .collect();
    vec![
        gateway_class(),
        json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
            "metadata": {"name": "gw", "namespace": NS},
            "spec": {"gatewayClassName": "duet",
                     "listeners": [{"name": "http", "port": port, "protocol": "HTTP"}]}
        }),
        json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
            "metadata": {"name": "route", "namespace": NS},
            "spec": {"parentRefs": [{"name": "gw"}], "rules": rules}
        }),
    ]
}

/// A BackendTLSPolicy for Service `service` (its port `http`): `ca` the CA ConfigMap, `extra`
/// merged into `validation`.
fn policy(service: &str, ca: &str, hostname: &str, extra: Value) -> Value {
    let mut validation = json!({
        "caCertificateRefs": [{"group": "", "kind": "ConfigMap", "name": ca}],
        "hostname": hostname,
    });
    if let (Some(v), Some(e)) = (validation.as_object_mut(), extra.as_object()) {
        v.extend(e.clone());
    }
    json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "BackendTLSPolicy",
        "metadata": {"name": service, "namespace": NS},
        "spec": {
            "targetRefs": [{"group": "", "kind": "Service", "name": service, "sectionName": "http"}],
            "validation": validation
        }
    })
}

fn ca_map(name: &str, pem: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": NS},
        "data": {"ca.crt": pem}
    })
}

/// The Services (each the same kind of TLS pods) and their policies.
const CASES: &[&str] = &[
    "verified",
    "wrong-host",
    "wrong-ca",
    "san-uri",
    "san-dns",
    "san-mismatch",
    "missing-ca",
];

#[tokio::test]
async fn backend_tls_policies_verify_the_pods_of_both_families_by_name_never_address(
) -> anyhow::Result<()> {
    let ca = TestCa::new("backend CA");
    let other = TestCa::new("another CA");
    let cert = ca.issue_with_uris(&["abc.example.com"], &[SPIFFE]);
    let options = || EchoOptions {
        tls: Some(tls::server_config(&cert, &["http/1.1"])),
        ..EchoOptions::default()
    };
    let dir = ManifestDir::new()?;
    let mut fleets = Vec::new();
    for name in CASES {
        let pods = [PodSpec::dual("a"), PodSpec::dual("b")];
        let fleet = Fleet::start_with(NS, name, &pods, options())?;
        dir.write(&format!("svc-{name}.yaml"), &fleet.manifests())?;
        fleets.push(fleet);
    }
    let port = free_port()?;
    let mut docs = gateway_docs(port, CASES);
    docs.extend([
        ca_map("ca", &ca.cert_pem),
        ca_map("other-ca", &other.cert_pem),
        policy("verified", "ca", "abc.example.com", json!({})),
        policy("wrong-host", "ca", "mismatch.example.com", json!({})),
        policy("wrong-ca", "other-ca", "abc.example.com", json!({})),
        policy(
            "san-uri",
            "ca",
            "abc.example.com",
            json!({"subjectAltNames": [{"type": "URI", "uri": SPIFFE}]}),
        ),
        // The certificate is checked for the subjectAltNames, not the hostname (only SNI).
        policy(
            "san-dns",
            "ca",
            "sni-only.example.com",
            json!({"subjectAltNames": [{"type": "Hostname", "hostname": "abc.example.com"}]}),
        ),
        policy(
            "san-mismatch",
            "ca",
            "abc.example.com",
            json!({"subjectAltNames": [{"type": "Hostname", "hostname": "dce.example.com"},
                                       {"type": "URI", "uri": "spiffe://def.example.com/x"}]}),
        ),
        policy(
            "missing-ca",
            "no-such-configmap",
            "abc.example.com",
            json!({}),
        ),
    ]);
    dir.write("gateway.yaml", &docs)?;
    let _duet = DuetBuilder::new(DUET, dir.path()).start().await?;
    for family in Family::BOTH {
        let addr = SocketAddr::new(family.loopback(), port);
        let mut conn = client::eventually("the Gateway listener", client::REQUEST_TIMEOUT, || {
            Conn::http1(addr)
        })
        .await?;
        for service in ["verified", "san-uri", "san-dns"] {
            let reply = conn.get("any.test", &format!("/{service}")).await?;
            client::expect_status(&reply, 200)?;
            let echo = reply.echo()?;
            assert_eq!(echo.service, service, "{family}");
            assert_eq!(
                echo.family, family,
                "{service}: pod reached over {}",
                echo.family
            );
            assert_eq!(echo.local.ip().is_ipv6(), family == Family::V6, "{service}");
        }
        for service in ["wrong-host", "wrong-ca", "san-mismatch", "missing-ca"] {
            let reply = conn.get("any.test", &format!("/{service}")).await?;
            assert_eq!(reply.status, 502, "{family} {service}: {}", reply.text());
        }
        // The refusals are per backend: the verified one still answers on the same connection.
        client::expect_status(&conn.get("any.test", "/verified").await?, 200)?;
    }
    Ok(())
}

/// A Gateway `name` with one HTTP listener on `port`, presenting the Secret `client_cert` (if
/// any) to TLS backends.
fn gateway(name: &str, port: u16, client_cert: Option<&str>) -> Value {
    let mut g = json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"gatewayClassName": "duet",
                 "listeners": [{"name": "http", "port": port, "protocol": "HTTP"}]}
    });
    if let Some(secret) = client_cert {
        g["spec"]["tls"] = json!({"backend": {"clientCertificateRef": {"group": "", "kind": "Secret", "name": secret}}});
    }
    g
}

#[tokio::test]
async fn a_gateway_presents_its_client_certificate_to_backends_that_require_one(
) -> anyhow::Result<()> {
    let ca = TestCa::new("backend CA");
    let clients = TestCa::new("client CA");
    let server = ca.issue(&["abc.example.com"]);
    let client = clients.issue_client("duet", &[]);
    let options = EchoOptions {
        tls: Some(tls::server_config_requiring_clients(
            &server,
            &clients.cert_pem,
            &["http/1.1"],
        )),
        ..EchoOptions::default()
    };
    let dir = ManifestDir::new()?;
    let pods = [PodSpec::dual("a"), PodSpec::dual("b")];
    let fleet = Fleet::start_with(NS, "mtls", &pods, options)?;
    dir.write("svc.yaml", &fleet.manifests())?;
    let (with_cert, without) = (free_port()?, free_port()?);
    let mut docs = gateway_docs(with_cert, &["mtls"]);
    // The route attaches to both Gateways; only one presents a certificate.
    docs[1] = gateway("gw", with_cert, Some("client-cert"));
    docs.push(gateway("plain", without, None));
    docs[2]["spec"]["parentRefs"] = json!([{"name": "gw"}, {"name": "plain"}]);
    docs.extend([
        ca_map("ca", &ca.cert_pem),
        policy("mtls", "ca", "abc.example.com", json!({})),
        tls::secret(NS, "client-cert", &client),
    ]);
    dir.write("gateway.yaml", &docs)?;
    let _duet = DuetBuilder::new(DUET, dir.path()).start().await?;
    for family in Family::BOTH {
        let connect = |port| {
            let addr = SocketAddr::new(family.loopback(), port);
            client::eventually("the Gateway listener", client::REQUEST_TIMEOUT, move || {
                Conn::http1(addr)
            })
        };
        let mut conn = connect(with_cert).await?;
        let reply = conn.get("any.test", "/mtls").await?;
        client::expect_status(&reply, 200)?;
        let echo = reply.echo()?;
        assert_eq!(echo.family, family, "pod reached over {}", echo.family);
        // Without a client certificate the pods refuse the handshake.
        let reply = connect(without).await?.get("any.test", "/mtls").await?;
        assert_eq!(reply.status, 502, "{family}: {}", reply.text());
    }
    Ok(())
}
