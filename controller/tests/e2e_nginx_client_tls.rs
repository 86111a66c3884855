//! End to end, over real TLS connections to 127.0.0.1 and [::1] with a real rustls client
//! holding rcgen-made client certificates: ingress-nginx's `auth-tls-*`. A host whose Ingress
//! sets `auth-tls-secret` asks for a certificate (a host without it does not), and
//! `auth-tls-verify-client` decides as nginx: `on` answers 400 without a certificate or with one
//! the CA did not issue, `optional` admits none, `optional_no_ca` admits any and says
//! `FAILED:...`; the verification, the subject and issuer, and with
//! `auth-tls-pass-certificate-to-upstream` the URL-encoded PEM go upstream as `ssl-client-*`
//! headers (a client's own are replaced); `auth-tls-error-page` redirects instead of the 400;
//! a Host other than the TLS server name gets 421. No `ssl-client-*` header a client sends reaches
//! a backend, on any route, over TLS or plain HTTP (also behind a trusted proxy that says
//! `X-Forwarded-Proto: https`).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::Context as _;
use conformance::client::{self, Conn, Reply};
use conformance::rustls;
use conformance::tls::{self, TestCa, TestCert};
use conformance::{DuetBuilder, Family, Fleet, Ingress, ManifestDir, PodSpec};
use dataplane::upstream::tls::AnyServerCert;
use rustls::client::ResolvesClientCert;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::sign::CertifiedKey;
use rustls::SignatureScheme;

const DUET: &str = env!("CARGO_BIN_EXE_duet");
const HOSTS: [&str; 7] = [
    "cn.test",
    "on.test",
    "opt.test",
    "noca.test",
    "page.test",
    "plain.test",
    "off.test",
];

/// Presents `cert` (if any) when asked, and remembers whether it was asked.
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

/// An HTTP/1.1 connection over TLS to `to` with SNI `sni`, presenting `cert`; and whether the
/// server asked for a certificate.
async fn connect(
    to: SocketAddr,
    sni: &str,
    cert: Option<&TestCert>,
) -> anyhow::Result<(Conn, bool)> {
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
        .with_safe_default_protocol_versions()?
        .dangerous()
        // Any server certificate: the test is about the client's.
        .with_custom_certificate_verifier(Arc::new(AnyServerCert::new(provider.clone())))
        .with_client_cert_resolver(resolver.clone());
    let tcp = client::connect_tcp(to).await?;
    let local = tcp.local_addr()?;
    let name = ServerName::try_from(sni.to_owned())?;
    let stream = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .context("TLS handshake")?;
    let conn = Conn::over(stream, local, to, false).await?;
    Ok((conn, resolver.asked.load(Ordering::SeqCst)))
}

/// `GET /` for `host` over a connection with SNI `sni` presenting `cert`, with a forged
/// `ssl-client-verify: SUCCESS` and `ssl-client-subject-dn: CN=admin`; the reply and whether a certificate was asked for.
async fn get(
    to: SocketAddr,
    sni: &str,
    host: &str,
    cert: Option<&TestCert>,
) -> anyhow::Result<(Reply, bool)> {
    let (mut conn, asked) = connect(to, sni, cert).await?;
    let req = client::request(conformance::http::Method::GET, host, "/")
        .header("ssl-client-verify", "SUCCESS")
        .header("ssl-client-subject-dn", "CN=admin")
        .body(conformance::http_body_util::Full::new(
            conformance::bytes::Bytes::new(),
        ))?;
    Ok((conn.send(req).await?, asked))
}

fn header(reply: &Reply, name: &str) -> anyhow::Result<Option<String>> {
    Ok(reply.echo()?.header(name))
}

/// nginx's `$ssl_client_escaped_cert` decoded.
fn unescape(escaped: &str) -> String {
    let bytes = escaped.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            out.push(u8::from_str_radix(&escaped[i + 1..i + 3], 16).unwrap());
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificates_as_ingress_nginx_over_both_families() -> anyhow::Result<()> {
    let ca = TestCa::new("duet client CA");
    let alice = ca.issue_client("alice", &["duet"]);
    let rogue = TestCa::new("rogue CA").issue_client("mallory", &[]);
    let bob = ca.issue_client("bob", &[]);
    let server = tls::cert(&HOSTS);
    let fleet = Fleet::start("mtls", "web", &[PodSpec::dual("pod")])?;
    let dir = ManifestDir::with_class()?;
    dir.write("fleet.yaml", &fleet.manifests())?;
    dir.write(
        "secrets.yaml",
        &[
            tls::secret("mtls", "web-tls", &server),
            tls::ca_secret("mtls", "client-ca", &ca.cert_pem),
        ],
    )?;
    let ingress = |host: &str, extra: &[(&str, &str)]| {
        let mut pairs = vec![("auth-tls-secret", "mtls/client-ca")];
        pairs.extend_from_slice(extra);
        Ingress::new("mtls", host.trim_end_matches(".test"))
            .nginx_annotations(&pairs)
            .host(host, "web")
            .tls(&[host], "web-tls")
    };
    let ingresses = [
        ingress(
            "on.test",
            &[("auth-tls-pass-certificate-to-upstream", "true")],
        ),
        ingress("opt.test", &[("auth-tls-verify-client", "optional")]),
        ingress("noca.test", &[("auth-tls-verify-client", "optional_no_ca")]),
        ingress(
            "page.test",
            &[("auth-tls-error-page", "https://errors.example/cert")],
        ),
        ingress("off.test", &[("auth-tls-verify-client", "off")]),
        ingress("cn.test", &[("auth-tls-match-cn", "CN=bob$")]),
        Ingress::new("mtls", "plain")
            .host("plain.test", "web")
            .tls(&["plain.test"], "web-tls"),
    ];
    dir.write("ingress.yaml", &ingresses.map(|i| i.build()))?;
    let duet = DuetBuilder::new(DUET, dir.path()).start().await?;

    for family in Family::BOTH {
        let to = duet.https(family);
        // on: a CA-issued certificate passes, with what nginx sends upstream.
        let (reply, asked) = get(to, "on.test", "on.test", Some(&alice)).await?;
        client::expect_status(&reply, 200)?;
        assert!(asked, "{family}: on.test asks for a certificate");
        assert_eq!(
            header(&reply, "ssl-client-verify")?.as_deref(),
            Some("SUCCESS"),
            "{family}"
        );
        assert_eq!(
            header(&reply, "ssl-client-subject-dn")?.as_deref(),
            Some("O=duet,CN=alice")
        );
        assert_eq!(
            header(&reply, "ssl-client-issuer-dn")?.as_deref(),
            Some("CN=duet client CA")
        );
        let escaped = header(&reply, "ssl-client-cert")?.context("ssl-client-cert sent")?;
        assert!(
            escaped.starts_with("-----BEGIN%20CERTIFICATE-----%0A"),
            "{escaped}"
        );
        assert!(
            !escaped.contains(['/', '+', '=', ' ', '\n']),
            "URL-encoded as nginx: {escaped}"
        );
        let pem = unescape(&escaped);
        let sent = CertificateDer::from_pem_slice(pem.as_bytes())?;
        assert_eq!(
            sent.as_ref(),
            alice.der.as_slice(),
            "{family}: the client's certificate"
        );
        assert!(
            pem.starts_with("-----BEGIN CERTIFICATE-----\n")
                && pem.ends_with("-----END CERTIFICATE-----\n")
        );
        // on: none, or one of another CA: 400 with nginx's words.
        let (reply, _) = get(to, "on.test", "on.test", None).await?;
        client::expect_status(&reply, 400)?;
        assert!(
            reply
                .text()
                .contains("No required SSL certificate was sent"),
            "{family}"
        );
        let (reply, _) = get(to, "on.test", "on.test", Some(&rogue)).await?;
        client::expect_status(&reply, 400)?;
        assert!(
            reply.text().contains("The SSL certificate error"),
            "{family}"
        );

        // auth-tls-match-cn: the subject DN must match, else 403 with nginx's words.
        let (reply, _) = get(to, "cn.test", "cn.test", Some(&bob)).await?;
        client::expect_status(&reply, 200)?;
        let (reply, _) = get(to, "cn.test", "cn.test", Some(&alice)).await?;
        client::expect_status(&reply, 403)?;
        assert!(
            reply.text().contains("client certificate unauthorized"),
            "{family}"
        );

        // optional: none is fine (the forged header replaced), a bad one is not.
        let (reply, _) = get(to, "opt.test", "opt.test", None).await?;
        client::expect_status(&reply, 200)?;
        assert_eq!(
            header(&reply, "ssl-client-verify")?.as_deref(),
            Some("NONE"),
            "{family}"
        );
        assert_eq!(
            header(&reply, "ssl-client-cert")?,
            None,
            "not passed unless asked"
        );
        assert_eq!(
            header(&reply, "ssl-client-subject-dn")?,
            None,
            "{family}: the forged one removed"
        );
        let (reply, _) = get(to, "opt.test", "opt.test", Some(&rogue)).await?;
        client::expect_status(&reply, 400)?;

        // optional_no_ca: any certificate passes, its verification result goes upstream.
        let (reply, _) = get(to, "noca.test", "noca.test", Some(&rogue)).await?;
        client::expect_status(&reply, 200)?;
        let verify = header(&reply, "ssl-client-verify")?.unwrap_or_default();
        assert!(verify.starts_with("FAILED:"), "{family}: {verify}");
        assert_eq!(
            header(&reply, "ssl-client-subject-dn")?.as_deref(),
            Some("CN=mallory")
        );

        // auth-tls-error-page: a redirect instead of the 400.
        let (reply, _) = get(to, "page.test", "page.test", None).await?;
        client::expect_status(&reply, 302)?;
        assert_eq!(
            reply.header("location"),
            Some("https://errors.example/cert"),
            "{family}"
        );

        // No auth-tls (or verify-client off): no certificate asked for, nothing sent upstream.
        for host in ["plain.test", "off.test"] {
            let (reply, asked) = get(to, host, host, Some(&alice)).await?;
            client::expect_status(&reply, 200)?;
            assert!(!asked, "{family}: {host} does not ask for a certificate");
            assert_eq!(
                header(&reply, "ssl-client-verify")?,
                None,
                "{family} {host}: the client's forged header removed"
            );
        }

        // The certificate is asked for by SNI: another Host on that connection gets 421.
        let (reply, _) = get(to, "plain.test", "on.test", Some(&alice)).await?;
        client::expect_status(&reply, 421)?;
    }
    let routes = duet.debug_routes().await?;
    let status = |ingress: &str, key: &str| conformance::duet::nginx_status(&routes, ingress, key);
    assert_eq!(
        status("on", "auth-tls-secret").as_deref(),
        Some("honoured-with-difference")
    );
    assert_eq!(
        status("on", "auth-tls-pass-certificate-to-upstream").as_deref(),
        Some("honoured")
    );
    assert_eq!(
        status("opt", "auth-tls-verify-client").as_deref(),
        Some("honoured")
    );
    Ok(())
}

/// Plain HTTP from a trusted proxy that says `X-Forwarded-Proto: https` is not redirected to
/// HTTPS and cannot present a certificate: the `ssl-client-*` headers it forged must not reach
/// the backend of an `auth-tls` host, nor of a host without client certificates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_client_certificate_headers_never_pass_over_plain_http() -> anyhow::Result<()> {
    let ca = TestCa::new("duet client CA");
    let server = tls::cert(&["on.test"]);
    let fleet = Fleet::start("mtls3", "web", &[PodSpec::dual("pod")])?;
    let dir = ManifestDir::with_class()?;
    dir.write("fleet.yaml", &fleet.manifests())?;
    dir.write(
        "secrets.yaml",
        &[
            tls::secret("mtls3", "web-tls", &server),
            tls::ca_secret("mtls3", "client-ca", &ca.cert_pem),
        ],
    )?;
    let ingresses = [
        Ingress::new("mtls3", "on")
            .nginx_annotations(&[("auth-tls-secret", "mtls3/client-ca")])
            .host("on.test", "web")
            .tls(&["on.test"], "web-tls"),
        Ingress::new("mtls3", "plain").host("plain.test", "web"),
    ];
    dir.write("ingress.yaml", &ingresses.map(|i| i.build()))?;
    let duet = DuetBuilder::new(DUET, dir.path())
        .args(["--trusted-proxies", "127.0.0.1,::1"])
        .start()
        .await?;
    for family in Family::BOTH {
        for host in ["on.test", "plain.test"] {
            let req = client::request(conformance::http::Method::GET, host, "/")
                .header("x-forwarded-proto", "https")
                .header("ssl-client-verify", "SUCCESS")
                .header("ssl-client-subject-dn", "CN=admin")
                .header("SSL-Client-Anything", "forged")
                .body(conformance::http_body_util::Full::new(
                    conformance::bytes::Bytes::new(),
                ))?;
            let reply = Conn::http1(duet.http(family)).await?.send(req).await?;
            client::expect_status(&reply, 200)?;
            for name in [
                "ssl-client-verify",
                "ssl-client-subject-dn",
                "ssl-client-anything",
            ] {
                assert_eq!(
                    header(&reply, name)?,
                    None,
                    "{family} {host}: {name} passed"
                );
            }
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_ca_secret_fails_closed() -> anyhow::Result<()> {
    let server = tls::cert(&["on.test", "web.test"]);
    let fleet = Fleet::start("mtls2", "web", &[PodSpec::dual("pod")])?;
    let dir = ManifestDir::with_class()?;
    dir.write("fleet.yaml", &fleet.manifests())?;
    dir.write("secrets.yaml", &[tls::secret("mtls2", "web-tls", &server)])?;
    let ingresses = [
        Ingress::new("mtls2", "on")
            .nginx_annotations(&[("auth-tls-secret", "mtls2/missing")])
            .host("on.test", "web")
            .tls(&["on.test"], "web-tls"),
        Ingress::new("mtls2", "web")
            .host("web.test", "web")
            .tls(&["web.test"], "web-tls"),
    ];
    dir.write("ingress.yaml", &ingresses.map(|i| i.build()))?;
    let duet = DuetBuilder::new(DUET, dir.path()).start().await?;
    for family in Family::BOTH {
        let (reply, _) = get(duet.https(family), "on.test", "on.test", None).await?;
        client::expect_status(&reply, 503)?;
        let (reply, _) = get(duet.https(family), "web.test", "web.test", None).await?;
        client::expect_status(&reply, 200)?;
    }
    Ok(())
}

/// `ca.crl` in the `auth-tls-secret` Secret: a revoked certificate gets nginx's 400 "The SSL
/// certificate error", an unrevoked one passes; a CRL that does not parse fails closed (503)
/// with a diagnostic, other hosts unharmed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoked_client_certificates_are_refused_as_nginx() -> anyhow::Result<()> {
    let ca = TestCa::new("duet CRL CA");
    let alice = ca.issue_client("alice", &[]);
    let eve = ca.issue_client("eve", &[]);
    let server = tls::cert(&["crl.test", "badcrl.test", "web.test"]);
    let fleet = Fleet::start("mtls3", "web", &[PodSpec::dual("pod")])?;
    let dir = ManifestDir::with_class()?;
    dir.write("fleet.yaml", &fleet.manifests())?;
    let crl = ca.crl(&[&eve]);
    dir.write(
        "secrets.yaml",
        &[
            tls::secret("mtls3", "web-tls", &server),
            tls::ca_crl_secret("mtls3", "with-crl", &ca.cert_pem, crl.as_bytes()),
            tls::ca_crl_secret(
                "mtls3",
                "bad-crl",
                &ca.cert_pem,
                b"-----BEGIN X509 CRL-----\nAAAA\n-----END X509 CRL-----\n",
            ),
        ],
    )?;
    let ingress = |name: &str, host: &str, secret: &str| {
        Ingress::new("mtls3", name)
            .nginx_annotations(&[("auth-tls-secret", secret)])
            .host(host, "web")
            .tls(&[host], "web-tls")
    };
    let ingresses = [
        ingress("crl", "crl.test", "mtls3/with-crl"),
        ingress("badcrl", "badcrl.test", "mtls3/bad-crl"),
        Ingress::new("mtls3", "web")
            .host("web.test", "web")
            .tls(&["web.test"], "web-tls"),
    ];
    dir.write("ingress.yaml", &ingresses.map(|i| i.build()))?;
    let duet = DuetBuilder::new(DUET, dir.path()).start().await?;
    for family in Family::BOTH {
        let to = duet.https(family);
        let (reply, _) = get(to, "crl.test", "crl.test", Some(&alice)).await?;
        client::expect_status(&reply, 200)?;
        let (reply, _) = get(to, "crl.test", "crl.test", Some(&eve)).await?;
        client::expect_status(&reply, 400)?;
        assert!(
            reply.text().contains("The SSL certificate error"),
            "{family}: {}",
            reply.text()
        );
        let (reply, _) = get(to, "badcrl.test", "badcrl.test", Some(&alice)).await?;
        client::expect_status(&reply, 503)?;
        let (reply, _) = get(to, "web.test", "web.test", None).await?;
        client::expect_status(&reply, 200)?;
    }
    let routes = duet.debug_routes().await?;
    assert!(
        routes["diagnostics"].to_string().contains("ca.crl"),
        "{}",
        routes["diagnostics"]
    );
    Ok(())
}
