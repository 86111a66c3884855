//! End to end, over real sockets on 127.0.0.1 and [::1]: TLS termination on the HTTPS listeners
//! (SNI exact, wildcard, default and IP-literal clients, TLS 1.2 and 1.3, ALPN h2 and
//! http/1.1), forwarding headers over TLS, the 308 redirect of plain HTTP, certificate rotation
//! under a live connection, and invalid certificates as per-host diagnostics.

use std::time::Duration;

use conformance::client::{self, Conn};
use conformance::http::Version;
use conformance::tls::{self, TestCert};
use conformance::{
    Duet, DuetBuilder, Family, Fleet, Ingress, ManifestDir, PathType, PodSpec, PortRef,
};

const DUET: &str = env!("CARGO_BIN_EXE_duet");

struct Certs {
    exact: TestCert,
    wild: TestCert,
    default: TestCert,
}

struct Setup {
    _fleet: Fleet,
    dir: ManifestDir,
    duet: Duet,
    certs: Certs,
}

fn ingresses() -> Vec<serde_json::Value> {
    let web = Ingress::new("tls", "web")
        .host("exact.test", "echo")
        .host("*.wild.test", "echo")
        .host("mismatch.test", "echo")
        .host("plain.test", "echo")
        .path(
            None,
            PathType::Prefix,
            "/",
            "echo",
            PortRef::Name("http".into()),
        )
        .tls(&["exact.test"], "exact-cert")
        .tls(&["*.wild.test"], "wild-cert")
        .tls(&["mismatch.test"], "exact-cert")
        .tls(&[], "exact-cert");
    let optout = Ingress::new("tls", "optout")
        .annotation("duet.dev/ssl-redirect", "false")
        .host("noredirect.test", "echo")
        .tls(&["noredirect.test"], "exact-cert");
    vec![web.build(), optout.build()]
}

async fn setup(default_secret: bool) -> anyhow::Result<Setup> {
    let fleet = Fleet::start("tls", "echo", &[PodSpec::dual("dual")])?;
    let dir = ManifestDir::with_class()?;
    dir.write("echo.yaml", &fleet.manifests())?;
    let certs = Certs {
        exact: tls::cert(&["exact.test", "noredirect.test"]),
        wild: tls::cert(&["*.wild.test"]),
        default: tls::cert(&["127.0.0.1", "::1"]),
    };
    dir.write(
        "secrets.yaml",
        &[
            tls::secret("tls", "exact-cert", &certs.exact),
            tls::secret("tls", "wild-cert", &certs.wild),
            tls::secret("tls", "default-cert", &certs.default),
        ],
    )?;
    dir.write("ingress.yaml", &ingresses())?;
    let mut builder = DuetBuilder::new(DUET, dir.path());
    if default_secret {
        builder = builder.args(["--default-tls-secret", "tls/default-cert"]);
    }
    let duet = builder.start().await?;
    Ok(Setup {
        _fleet: fleet,
        dir,
        duet,
        certs,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sni_picks_exact_then_wildcard_then_default() -> anyhow::Result<()> {
    let s = setup(true).await?;
    for family in Family::BOTH {
        let to = s.duet.https(family);
        for (sni, want, what) in [
            (Some("exact.test"), &s.certs.exact, "exact"),
            (Some("EXACT.test"), &s.certs.exact, "exact, other case"),
            (Some("a.wild.test"), &s.certs.wild, "wildcard"),
            (
                Some("a.b.wild.test"),
                &s.certs.default,
                "wildcard covers one label",
            ),
            (Some("unknown.test"), &s.certs.default, "no match"),
            (
                Some("mismatch.test"),
                &s.certs.default,
                "certificate not covering the host",
            ),
            (None, &s.certs.default, "IP-literal client without SNI"),
        ] {
            let (_, hs) = tls::handshake(to, sni, &[], &[]).await?;
            assert!(hs.cert == want.der, "{family} {what}: wrong certificate");
        }
    }
    let routes = s.duet.debug_routes().await?;
    let diagnostics = routes["diagnostics"].to_string();
    assert!(
        diagnostics.contains("CertificateHostMismatch") && diagnostics.contains("mismatch.test"),
        "{diagnostics}"
    );
    // The mismatched host still routes; only its certificate is the default one.
    let reply = client::get(s.duet.http(Family::V4), "plain.test", "/").await?;
    client::expect_status(&reply, 200)?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_requests_over_h2_and_http1_with_tls_12_and_13() -> anyhow::Result<()> {
    let s = setup(true).await?;
    for family in Family::BOTH {
        let to = s.duet.https(family);
        for (alpn, version) in [
            (&["h2", "http/1.1"][..], Version::HTTP_2),
            (&["http/1.1"][..], Version::HTTP_11),
            (&[][..], Version::HTTP_11),
        ] {
            let (mut conn, hs) = Conn::https(to, Some("exact.test"), alpn).await?;
            assert_eq!(hs.version, "TLSv1_3");
            let reply = conn.get("exact.test", "/p?q=1").await?;
            client::expect_status(&reply, 200)?;
            assert_eq!(reply.version, version, "{family} ALPN {alpn:?}");
            let echo = reply.echo()?;
            assert_eq!(echo.path, "/p?q=1");
            assert_eq!(echo.header("x-forwarded-proto").as_deref(), Some("https"));
            let forwarded = echo.header("forwarded").unwrap_or_default();
            assert!(forwarded.contains("proto=https"), "{forwarded}");
            let ip = conn.local_addr().ip().to_string();
            assert_eq!(echo.header("x-forwarded-for"), Some(ip), "{family}");
            assert_eq!(
                echo.header("x-forwarded-port"),
                Some(to.port().to_string()),
                "{family}"
            );
        }
        let (_, hs) = tls::handshake(
            to,
            Some("exact.test"),
            &["h2"],
            &[&conformance::rustls::version::TLS12],
        )
        .await?;
        assert_eq!(hs.version, "TLSv1_2", "{family}");
        assert_eq!(hs.alpn.as_deref(), Some("h2"), "{family}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_http_to_tls_hosts_is_redirected_with_308() -> anyhow::Result<()> {
    let s = setup(true).await?;
    for family in Family::BOTH {
        let http = s.duet.http(family);
        let https_port = s.duet.https(family).port();
        let reply = client::get(http, "exact.test", "/a/b?c=d").await?;
        client::expect_status(&reply, 308)?;
        assert_eq!(
            reply.header("location"),
            Some(format!("https://exact.test:{https_port}/a/b?c=d").as_str()),
            "{family}"
        );
        let reply = client::get(http, "x.wild.test:8080", "/").await?;
        client::expect_status(&reply, 308)?;
        assert_eq!(
            reply.header("location"),
            Some(format!("https://x.wild.test:{https_port}/").as_str())
        );
        // An IP-literal Host hits the host-less rule, whose TLS entry has no hosts.
        let literal = match family {
            Family::V4 => http.to_string(),
            Family::V6 => format!("[::1]:{}", http.port()),
        };
        let bare = match family {
            Family::V4 => "127.0.0.1",
            Family::V6 => "[::1]",
        };
        let reply = client::get(http, &literal, "/x").await?;
        client::expect_status(&reply, 308)?;
        assert_eq!(
            reply.header("location"),
            Some(format!("https://{bare}:{https_port}/x").as_str()),
            "{family}"
        );
        for host in ["plain.test", "noredirect.test"] {
            let reply = client::get(http, host, "/").await?;
            client::expect_status(&reply, 200)?;
            assert_eq!(
                reply.echo()?.header("x-forwarded-proto").as_deref(),
                Some("http")
            );
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificates_rotate_live_and_open_connections_keep_working() -> anyhow::Result<()> {
    let s = setup(true).await?;
    let mut live = Vec::new();
    for family in Family::BOTH {
        let (mut conn, hs) = Conn::https(s.duet.https(family), Some("exact.test"), &["h2"]).await?;
        assert!(hs.cert == s.certs.exact.der);
        client::expect_status(&conn.get("exact.test", "/").await?, 200)?;
        live.push(conn);
    }
    let rotated = tls::cert(&["exact.test", "noredirect.test"]);
    s.dir.write(
        "secrets.yaml",
        &[
            tls::secret("tls", "exact-cert", &rotated),
            tls::secret("tls", "wild-cert", &s.certs.wild),
            tls::secret("tls", "default-cert", &s.certs.default),
        ],
    )?;
    for family in Family::BOTH {
        let to = s.duet.https(family);
        client::eventually(
            "the rotated certificate",
            Duration::from_secs(10),
            || async {
                let (_, hs) = tls::handshake(to, Some("exact.test"), &[], &[]).await?;
                anyhow::ensure!(hs.cert == rotated.der, "still the old certificate");
                Ok(())
            },
        )
        .await?;
    }
    for conn in &mut live {
        assert!(!conn.is_closed());
        client::expect_status(&conn.get("exact.test", "/again").await?, 200)?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_default_secret_a_self_signed_certificate_is_served() -> anyhow::Result<()> {
    let s = setup(false).await?;
    for family in Family::BOTH {
        let to = s.duet.https(family);
        let (_, hs) = tls::handshake(to, None, &[], &[]).await?;
        assert!(hs.cert != s.certs.default.der && hs.cert != s.certs.exact.der);
        let (_, hs) = tls::handshake(to, Some("exact.test"), &[], &[]).await?;
        assert!(hs.cert == s.certs.exact.der, "{family}");
        // Garbage instead of a ClientHello closes the connection; the listener keeps serving.
        let mut raw = client::connect_tcp(to).await?;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        raw.write_all(b"GET / HTTP/1.1\r\nHost: exact.test\r\n\r\n")
            .await?;
        let mut buf = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(10), raw.read_to_end(&mut buf))
            .await
            .map_err(|_| anyhow::anyhow!("{family}: garbage did not close the connection"))?;
        // A clean close after one fatal TLS alert record (rustls: decode_error), not an HTTP
        // answer and not a reset.
        let read = read.map_err(|e| anyhow::anyhow!("{family}: reading after garbage: {e}"))?;
        assert_eq!(read, buf.len());
        assert!(
            matches!(buf[..], [0x15, 0x03, _, 0x00, 0x02, 0x02, _]),
            "{family}: not one fatal TLS alert: {buf:02x?} {:?}",
            String::from_utf8_lossy(&buf)
        );
        let (_, hs) = tls::handshake(to, Some("a.wild.test"), &[], &[]).await?;
        assert!(hs.cert == s.certs.wild.der, "{family}");
    }
    Ok(())
}
