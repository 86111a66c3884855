//! End to end in `--manifests` mode, over real TLS connections to 127.0.0.1 and [::1] with a
//! rustls client holding rcgen-made client certificates: a Gateway's client certificate
//! validation (`spec.tls.frontend`). Its HTTPS listeners ask for a certificate; in mode
//! `AllowValidOnly` a connection without one the port's CA (a ConfigMap's or a Secret's
//! `ca.crt`) issued is refused in the handshake, in `AllowInsecureFallback` it goes through; a
//! `perPort` entry overrides the default on its port only (and one without `validation` asks for
//! nothing). A Gateway whose CA reference does not resolve is not served on that listener, and
//! the other Gateway keeps serving. Pods are reached over the client's family.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::Context as _;
use conformance::client::{self, Conn, Reply};
use conformance::duet::free_port;
use conformance::manifests::gateway_class;
use conformance::rustls;
use conformance::tls::{self, TestCa, TestCert};
use conformance::{DuetBuilder, Family, Fleet, ManifestDir, PodSpec};
use dataplane::upstream::tls::AnyServerCert;
use rustls::client::ResolvesClientCert;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::sign::CertifiedKey;
use rustls::SignatureScheme;
use serde_json::{json, Value};

const DUET: &str = env!("CARGO_BIN_EXE_duet");
const NS: &str = "front";

/// Presents `key` (if any) when asked, and remembers whether it was asked.
#[derive(Debug)]
struct ClientCert {
    key: Option<Arc<CertifiedKey>>,
    asked: AtomicBool,
}

impl ResolvesClientCert for ClientCert {
    fn resolve(&self, _hints: &[&[u8]], _schemes: &[SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        self.asked.store(true, Ordering::SeqCst);
        self.key.clone()
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// `GET /` for `sni` over TLS to `to`, presenting `cert` when asked: the reply (`Err` when the
/// handshake or the exchange failed) and whether a certificate was asked for.
async fn get(to: SocketAddr, sni: &str, cert: Option<&TestCert>) -> (anyhow::Result<Reply>, bool) {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let key = cert.map(|c| {
        let chain = vec![CertificateDer::from(c.der.clone())];
        let key = PrivateKeyDer::from_pem_slice(c.key_pem.as_bytes()).expect("PEM key");
        Arc::new(CertifiedKey::from_der(chain, key, &provider).expect("usable key"))
    });
    let resolver = Arc::new(ClientCert {
        key,
        asked: AtomicBool::new(false),
    });
    let config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .dangerous()
        // Any server certificate: the test is about the client's.
        .with_custom_certificate_verifier(Arc::new(AnyServerCert::new(provider.clone())))
        .with_client_cert_resolver(resolver.clone());
    let reply = async {
        let tcp = client::connect_tcp(to).await?;
        let local = tcp.local_addr()?;
        let name = ServerName::try_from(sni.to_owned())?;
        let stream = tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(name, tcp)
            .await
            .context("TLS handshake")?;
        let mut conn = Conn::over(stream, local, to, false).await?;
        conn.get(sni, "/").await
    }
    .await;
    (reply, resolver.asked.load(Ordering::SeqCst))
}

/// A 200 from a pod reached over the client's family, the server having asked for a
/// certificate (`asks`) or not.
async fn admitted(
    family: Family,
    to: SocketAddr,
    sni: &str,
    cert: Option<&TestCert>,
    asks: bool,
) -> anyhow::Result<()> {
    let (reply, asked) = get(to, sni, cert).await;
    let reply = reply.with_context(|| format!("{family} {to} {sni}: refused"))?;
    client::expect_status(&reply, 200)?;
    let echo = reply.echo()?;
    anyhow::ensure!(
        echo.family == family,
        "{family}: pod reached over {}",
        echo.family
    );
    anyhow::ensure!(
        asked == asks,
        "{family} {to}: asked for a certificate: {asked}"
    );
    Ok(())
}

/// The connection fails (in the handshake or right after it), after a certificate was asked
/// for.
async fn refused(family: Family, to: SocketAddr, sni: &str, cert: Option<&TestCert>) {
    let (reply, asked) = get(to, sni, cert).await;
    assert!(
        reply.is_err(),
        "{family} {to} {sni}: answered without a valid certificate: {:?}",
        reply.map(|r| r.status)
    );
    assert!(asked, "{family} {to}: a certificate was asked for");
}

fn ca_map(name: &str, pem: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": NS},
        "data": {"ca.crt": pem}
    })
}

fn https(name: &str, port: u16) -> Value {
    json!({"name": name, "port": port, "protocol": "HTTPS",
           "tls": {"certificateRefs": [{"name": "server"}]}})
}

/// A `validation` with the CA bundle of the ConfigMap or Secret (`kind`) `ca`.
fn validation(kind: &str, ca: &str, mode: &str) -> Value {
    json!({"validation": {"mode": mode,
                          "caCertificateRefs": [{"group": "", "kind": kind, "name": ca}]}})
}

/// The GatewayClass, Gateway `gw` on ports `[strict, other, fallback, open]` (the default
/// validation with the CA of ConfigMap `ca-a`; `other` with Secret `ca-b`'s; `fallback` with `ca-a` in mode
/// AllowInsecureFallback; `open` without validation), Gateway `broken` on `bad` (its CA
/// ConfigMap missing), and a route to `web` on each.
fn gateways(ports: [u16; 4], bad: u16) -> Vec<Value> {
    let [strict, other, fallback, open] = ports;
    let route = |name: &str, gateway: &str| {
        json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"parentRefs": [{"name": gateway}],
                     "rules": [{"backendRefs": [{"name": "web", "port": 8080}]}]}
        })
    };
    vec![
        gateway_class(),
        json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
            "metadata": {"name": "gw", "namespace": NS},
            "spec": {
                "gatewayClassName": "duet",
                "tls": {"frontend": {
                    "default": validation("ConfigMap", "ca-a", "AllowValidOnly"),
                    "perPort": [
                        {"port": other, "tls": validation("Secret", "ca-b", "AllowValidOnly")},
                        {"port": fallback, "tls": validation("ConfigMap", "ca-a", "AllowInsecureFallback")},
                        {"port": open, "tls": {}},
                    ]
                }},
                "listeners": [https("strict", strict), https("other", other),
                              https("fallback", fallback), https("open", open)]
            }
        }),
        json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
            "metadata": {"name": "broken", "namespace": NS},
            "spec": {
                "gatewayClassName": "duet",
                "tls": {"frontend": {"default": validation("ConfigMap", "missing", "AllowValidOnly")}},
                "listeners": [https("bad", bad)]
            }
        }),
        route("to-gw", "gw"),
        route("to-broken", "broken"),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_client_certificate_validation_over_both_families() -> anyhow::Result<()> {
    let ca_a = TestCa::new("frontend CA A");
    let ca_b = TestCa::new("frontend CA B");
    let alice = ca_a.issue_client("alice", &[]);
    let bob = ca_b.issue_client("bob", &[]);
    let rogue = TestCa::new("rogue CA").issue_client("mallory", &[]);
    let server = tls::cert(&["*.example.test"]);
    let ports = [free_port()?, free_port()?, free_port()?, free_port()?];
    let bad = free_port()?;
    let fleet = Fleet::start(NS, "web", &[PodSpec::dual("pod")])?;
    let dir = ManifestDir::new()?;
    dir.write("fleet.yaml", &fleet.manifests())?;
    dir.write(
        "tls.yaml",
        &[
            tls::secret(NS, "server", &server),
            ca_map("ca-a", &ca_a.cert_pem),
            tls::ca_secret(NS, "ca-b", &ca_b.cert_pem),
        ],
    )?;
    dir.write("gateways.yaml", &gateways(ports, bad))?;
    let _duet = DuetBuilder::new(DUET, dir.path()).start().await?;
    let [strict, other, fallback, open] = ports;
    let sni = "a.example.test";
    for family in Family::BOTH {
        let at = |port: u16| SocketAddr::new(family.loopback(), port);
        // AllowValidOnly (the default): a certificate of CA A, and nothing else.
        admitted(family, at(strict), sni, Some(&alice), true).await?;
        refused(family, at(strict), sni, None).await;
        refused(family, at(strict), sni, Some(&bob)).await;
        refused(family, at(strict), sni, Some(&rogue)).await;
        // The port's own entry: CA B there, and only there.
        admitted(family, at(other), sni, Some(&bob), true).await?;
        refused(family, at(other), sni, Some(&alice)).await;
        refused(family, at(other), sni, None).await;
        // AllowInsecureFallback: asked for, never refused.
        admitted(family, at(fallback), sni, Some(&alice), true).await?;
        admitted(family, at(fallback), sni, None, true).await?;
        admitted(family, at(fallback), sni, Some(&rogue), true).await?;
        // A port entry without validation asks for nothing.
        admitted(family, at(open), sni, None, false).await?;
        // The Gateway whose CA does not resolve is not served.
        let (reply, _) = get(at(bad), sni, Some(&alice)).await;
        assert!(reply.is_err(), "{family}: the broken Gateway answered");
    }
    Ok(())
}
