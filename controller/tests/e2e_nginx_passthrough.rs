//! End to end, over real sockets on 127.0.0.1 and [::1]: ingress-nginx's `ssl-passthrough`
//! under `--enable-ssl-passthrough`. A TLS connection whose server name is a passthrough host
//! reaches a real TLS upstream unterminated (the client sees the upstream's certificate and
//! completes a request with it, no forwarding headers added), the upstream's family chosen by
//! the client's (the other family when the pod has only that one); on the same listener another
//! host, an unknown server name and a ClientHello without one are terminated by duet; a
//! garbage first packet is closed without harm; the connections are counted by client and
//! upstream family. Without the flag the annotation is reported and not applied. Silent clients
//! neither keep their relay past `--passthrough-idle-timeout` nor take the places that
//! `--max-connections` gives every listener (`--max-passthrough-connections`).

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context as _;
use conformance::client::{self, Conn, Reply};
use conformance::echo::EchoOptions;
use conformance::http::Method;
use conformance::tls::{self, TestCert};
use conformance::{Duet, DuetBuilder, Family, Fleet, Ingress, ManifestDir, PodSpec};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const DUET: &str = env!("CARGO_BIN_EXE_duet");

struct Setup {
    duet: Duet,
    upstream: TestCert,
    duet_cert: TestCert,
    _fleets: Vec<Fleet>,
    _dir: ManifestDir,
}

/// Passthrough hosts `vault.test` (a dual-stack TLS pod) and `v6.test` (an IPv6-only TLS pod),
/// `web.test` terminated by duet (a plain pod); duet started with `args`.
async fn setup(args: &[&str]) -> anyhow::Result<Setup> {
    let upstream = tls::cert(&["vault.test", "v6.test"]);
    let duet_cert = tls::cert(&["web.test", "vault.test", "v6.test"]);
    let tls_pods = || EchoOptions {
        tls: Some(tls::server_config(&upstream, &["http/1.1"])),
        ..EchoOptions::default()
    };
    let fleets = vec![
        Fleet::start_with("pt", "vault", &[PodSpec::dual("vault-0")], tls_pods())?,
        Fleet::start_with("pt", "v6", &[PodSpec::v6_only("v6-0")], tls_pods())?,
        Fleet::start("pt", "web", &[PodSpec::dual("web-0")])?,
    ];
    let dir = ManifestDir::with_class()?;
    for (i, fleet) in fleets.iter().enumerate() {
        dir.write(&format!("fleet-{i}.yaml"), &fleet.manifests())?;
    }
    dir.write("secrets.yaml", &[tls::secret("pt", "duet-tls", &duet_cert)])?;
    let passthrough = |name: &str, host: &str| {
        Ingress::new("pt", name)
            .nginx_annotations(&[("ssl-passthrough", "true"), ("proxy-body-size", "1k")])
            .host(host, name)
    };
    let ingresses = [
        passthrough("vault", "vault.test"),
        passthrough("v6", "v6.test"),
        Ingress::new("pt", "web")
            .host("web.test", "web")
            .tls(&["web.test"], "duet-tls"),
    ];
    dir.write("ingress.yaml", &ingresses.map(|i| i.build()))?;
    let duet = DuetBuilder::new(DUET, dir.path())
        .args(args.iter().copied())
        .start()
        .await?;
    Ok(Setup {
        duet,
        upstream,
        duet_cert,
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

/// The value of the sample of `name` with exactly these labels (Prometheus text).
fn sample(text: &str, name: &str, labels: &str) -> f64 {
    let prefix = format!("{name}{{{labels}}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passthrough_hosts_reach_their_tls_upstream_unterminated_over_both_families(
) -> anyhow::Result<()> {
    let mut s = setup(&["--enable-ssl-passthrough"]).await?;
    for family in Family::BOTH {
        let to = s.duet.https(family);

        // The passthrough host: the upstream's own certificate, a request completed with it,
        // the pod of the client's family, nothing added by duet.
        let (cert, reply) = get(to, Some("vault.test"), "vault.test").await?;
        assert_eq!(cert, s.upstream.der, "{family}: the upstream's certificate");
        client::expect_status(&reply, 200)?;
        let echo = reply.echo()?;
        assert_eq!(echo.pod, "vault-0");
        assert_eq!(
            echo.family, family,
            "{family}: upstream of the client's family"
        );
        assert_eq!(
            echo.headers.get("X-Forwarded-For"),
            None,
            "{family}: unterminated"
        );
        assert_eq!(echo.peer.ip(), family.loopback(), "{family}");

        // An IPv6-only pod serves clients of both families (the other family as fallback).
        let (cert, reply) = get(to, Some("V6.Test"), "v6.test").await?;
        assert_eq!(cert, s.upstream.der, "{family}: SNI is case-insensitive");
        client::expect_status(&reply, 200)?;
        assert_eq!(reply.echo()?.family, Family::V6, "{family}");

        // A terminated host on the same listener: duet's certificate, proxied as HTTP.
        let (cert, reply) = get(to, Some("web.test"), "web.test").await?;
        assert_eq!(cert, s.duet_cert.der, "{family}: duet terminates web.test");
        client::expect_status(&reply, 200)?;
        let echo = reply.echo()?;
        assert_eq!(echo.pod, "web-0");
        assert!(echo.headers.contains_key("X-Forwarded-For"), "{family}");

        // An unknown server name and none at all: terminated by duet (its fallback certificate),
        // never relayed.
        for sni in [Some("unknown.test"), None] {
            let (cert, reply) = get(to, sni, "vault.test").await?;
            assert_ne!(cert, s.upstream.der, "{family} {sni:?}: not relayed");
            assert_ne!(
                cert, s.duet_cert.der,
                "{family} {sni:?}: the fallback certificate"
            );
            let status = reply.status;
            assert!(
                status != 200 || reply.echo()?.pod != "vault-0",
                "{family} {sni:?}: {status}"
            );
        }

        // A first packet that is not TLS: closed (an alert at most), duet keeps serving.
        let mut tcp = client::connect_tcp(to).await?;
        tcp.write_all(b"GET / HTTP/1.1\r\nHost: vault.test\r\n\r\n")
            .await?;
        let mut answer = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(10), tcp.read_to_end(&mut answer))
            .await
            .context("garbage connection closed")?;
        assert!(read.is_ok() || answer.is_empty(), "{family}: {read:?}");
        assert!(!answer.starts_with(b"HTTP/"), "{family}: {answer:?}");
        assert!(
            answer.len() < 16,
            "{family}: at most a TLS alert: {answer:?}"
        );
        s.duet.check_running()?;
        let (cert, _) = get(to, Some("vault.test"), "vault.test").await?;
        assert_eq!(cert, s.upstream.der, "{family}: still relaying");
    }

    // Counted by client and upstream family: per family, vault.test twice and v6.test once.
    let metrics = s.duet.admin_get(Family::V4, "/metrics").await?.text();
    let name = "duet_passthrough_connections_total";
    let count = |client: &str, upstream: &str| {
        let labels = format!("client_family=\"{client}\",upstream_family=\"{upstream}\"");
        sample(&metrics, name, &labels)
    };
    assert_eq!(count("ipv4", "ipv4"), 2.0, "{metrics}");
    assert_eq!(count("ipv4", "ipv6"), 1.0);
    assert_eq!(count("ipv6", "ipv6"), 3.0);
    assert_eq!(count("ipv6", "ipv4"), 0.0);
    assert_eq!(count("ipv4", "none"), 0.0);

    // The report: honoured with its difference; the other keys say they miss the relay.
    let routes = s.duet.debug_routes().await?;
    let finding =
        |key: &str| conformance::duet::nginx_finding(&routes, "vault", key).unwrap_or_default();
    assert_eq!(
        finding("ssl-passthrough")["status"],
        "honoured-with-difference"
    );
    let body = finding("proxy-body-size");
    assert_eq!(body["status"], "honoured");
    assert!(
        body["detail"]
            .as_str()
            .unwrap_or_default()
            .contains("not applied to the HTTPS connections relayed by ssl-passthrough"),
        "{body}"
    );
    Ok(())
}

/// Four ClientHellos for a passthrough host, then silence, under `--max-connections 4`: one is
/// relayed (a quarter of the places), the others are closed at once, plain HTTP is still served,
/// and the relay is closed once no byte has moved for the idle timeout; over both families.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_passthrough_clients_neither_stay_nor_starve_the_other_listeners(
) -> anyhow::Result<()> {
    let s = setup(&[
        "--enable-ssl-passthrough",
        "--max-connections",
        "4",
        "--passthrough-idle-timeout",
        "2s",
    ])
    .await?;
    let hello = tls::client_hello("vault.test")?;
    for family in Family::BOTH {
        let mut silent = Vec::new();
        for _ in 0..4 {
            let mut tcp = client::connect_tcp(s.duet.https(family)).await?;
            tcp.write_all(&hello).await?;
            silent.push(tcp);
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let req = client::request(Method::GET, "web.test", "/").body(
            conformance::http_body_util::Full::new(conformance::bytes::Bytes::new()),
        )?;
        let reply = Conn::http1(s.duet.http(family)).await?.send(req).await;
        let reply = reply.with_context(|| format!("{family}: plain HTTP refused"))?;
        assert_eq!(reply.status, 308, "{family}: served (the HTTPS redirect)");
        for (i, tcp) in silent.iter_mut().enumerate() {
            let mut answer = Vec::new();
            let closed = tokio::time::timeout(Duration::from_secs(6), tcp.read_to_end(&mut answer));
            let closed = closed.await;
            assert!(closed.is_ok(), "{family}: silent connection {i} still open");
        }
    }
    let metrics = s.duet.admin_get(Family::V4, "/metrics").await?.text();
    let refused: f64 = metrics
        .lines()
        .filter(|l| l.starts_with("duet_connections_refused_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(refused, 6.0, "three relays refused per family: {metrics}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_flag_passthrough_hosts_are_terminated_and_reported() -> anyhow::Result<()> {
    let s = setup(&[]).await?;
    for family in Family::BOTH {
        let (cert, reply) = get(s.duet.https(family), Some("vault.test"), "vault.test").await?;
        assert_ne!(cert, s.upstream.der, "{family}: terminated by duet");
        // The pod speaks TLS, duet sends it plain HTTP: not the pod's answer.
        assert_ne!(reply.status, 200, "{family}");
    }
    let routes = s.duet.debug_routes().await?;
    let text = routes["annotations"].to_string();
    assert!(
        text.contains("no effect without duet's --enable-ssl-passthrough"),
        "{text}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_passthrough_host_without_a_root_rule_is_terminated() -> anyhow::Result<()> {
    let upstream = tls::cert(&["api.test"]);
    let duet_cert = tls::cert(&["api.test"]);
    let fleet = Fleet::start_with(
        "pt2",
        "api",
        &[PodSpec::dual("api-0")],
        EchoOptions {
            tls: Some(tls::server_config(&upstream, &["http/1.1"])),
            ..EchoOptions::default()
        },
    )?;
    let dir = ManifestDir::with_class()?;
    dir.write("fleet.yaml", &fleet.manifests())?;
    dir.write(
        "secrets.yaml",
        &[tls::secret("pt2", "duet-tls", &duet_cert)],
    )?;
    let ingress = Ingress::new("pt2", "api")
        .nginx_annotations(&[("ssl-passthrough", "true")])
        .path(
            Some("api.test"),
            conformance::PathType::Prefix,
            "/v1",
            "api",
            conformance::PortRef::Name("http".into()),
        )
        .tls(&["api.test"], "duet-tls");
    dir.write("ingress.yaml", &[ingress.build()])?;
    let duet = DuetBuilder::new(DUET, dir.path())
        .args(["--enable-ssl-passthrough"])
        .start()
        .await?;
    for family in Family::BOTH {
        let (_, hs) = tls::handshake(duet.https(family), Some("api.test"), &[], &[]).await?;
        assert_eq!(hs.cert, duet_cert.der, "{family}: only a / rule is relayed");
    }
    let routes = duet.debug_routes().await?;
    assert!(
        routes.to_string().contains("has no rule for path /"),
        "{routes}"
    );
    Ok(())
}
