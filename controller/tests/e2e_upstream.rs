//! End to end, over real sockets on 127.0.0.1 and [::1]: upstream protocols chosen by the Service
//! port's `appProtocol`: HTTP/2 cleartext (one multiplexed connection per pod address, the
//! client's family, per-family fallback), HTTP/1.1 over TLS (`kubernetes.io/wss`, WebSocket
//! upgrades too) verified against a CA Secret (wrong, missing or no CA: 502 for those routes
//! only; skip-verify), HTTP/2 over TLS with a server-name
//! annotation, and gRPC (unary and server-streaming, trailers kept) from h2 clients over
//! prior knowledge and TLS. In Kubernetes mode, an `Opaque` CA Secret is watched and used.

mod kube_support;

use conformance::bytes::Bytes;
use conformance::client::{self, Conn, Reply};
use conformance::echo::{grpc_frame, grpc_messages, EchoOptions};
use conformance::http::{Method, Request};
use conformance::http_body_util::Full;
use conformance::tls::{self, TestCa};
use conformance::{Duet, DuetBuilder, Echo, Family, Fleet, Ingress, ManifestDir, PodSpec, Port};

const DUET: &str = env!("CARGO_BIN_EXE_duet");
const NS: &str = "up";

struct Setup {
    _fleets: Vec<Fleet>,
    _dir: ManifestDir,
    duet: Duet,
    h2c: Fleet,
}

/// Services: `h2c` (appProtocol `kubernetes.io/h2c`, dual-stack pods), `fallback` (h2c, a pod
/// whose IPv4 port refuses), `secure` (`kubernetes.io/wss`: HTTP/1.1 over TLS, pods with a certificate for
/// `secure.up.svc` from the CA), `secure-h2` (`h2`, a certificate for `grpc.internal` only).
async fn setup() -> anyhow::Result<Setup> {
    let ca = TestCa::new("duet upstream test CA");
    let other_ca = TestCa::new("another CA");
    let secure_cert = ca.issue(&["secure.up.svc"]);
    let h2_cert = ca.issue(&["grpc.internal"]);
    let tls_options = |cert, alpn: &[&str]| EchoOptions {
        tls: Some(tls::server_config(cert, alpn)),
        ..EchoOptions::default()
    };
    let pods = [PodSpec::dual("a"), PodSpec::dual("b")];
    let h2c = Fleet::start(NS, "h2c", &pods)?;
    let fallback = Fleet::start(
        NS,
        "fallback",
        &[PodSpec::dual("only").with(Family::V4, Port::Closed)],
    )?;
    let secure = Fleet::start_with(
        NS,
        "secure",
        &pods,
        tls_options(&secure_cert, &["http/1.1"]),
    )?;
    let secure_h2 = Fleet::start_with(
        NS,
        "secure-h2",
        &pods,
        tls_options(&h2_cert, &["h2", "http/1.1"]),
    )?;

    let dir = ManifestDir::with_class()?;
    let mut services = h2c.manifests_with_app_protocol("kubernetes.io/h2c");
    services.extend(fallback.manifests_with_app_protocol("h2c"));
    services.extend(secure.manifests_with_app_protocol("kubernetes.io/wss"));
    services.extend(secure_h2.manifests_with_app_protocol("h2"));
    dir.write("services.yaml", &services)?;
    dir.write(
        "secrets.yaml",
        &[
            tls::ca_secret(NS, "upstream-ca", &ca.cert_pem),
            tls::ca_secret(NS, "other-ca", &other_ca.cert_pem),
        ],
    )?;
    let ca_ingress = |name: &str, host: &str, service: &str, secret: &str| {
        Ingress::new(NS, name)
            .annotation("duet.dev/backend-ca-secret", secret)
            .host(host, service)
            .build()
    };
    dir.write(
        "ingresses.yaml",
        &[
            Ingress::new(NS, "h2c")
                .host("h2c.test", "h2c")
                .host("fallback.test", "fallback")
                .build(),
            ca_ingress("secure", "secure.test", "secure", "upstream-ca"),
            ca_ingress("wrong-ca", "wrong-ca.test", "secure", "other-ca"),
            ca_ingress("missing-ca", "missing-ca.test", "secure", "no-such-secret"),
            Ingress::new(NS, "no-ca")
                .host("no-ca.test", "secure")
                .build(),
            Ingress::new(NS, "skip")
                .annotation("duet.dev/backend-tls-skip-verify", "true")
                .host("skip.test", "secure")
                .build(),
            Ingress::new(NS, "huge-timeouts")
                .annotation("duet.dev/backend-tls-skip-verify", "true")
                .annotation("duet.dev/proxy-connect-timeout", "18000000000000000000")
                .annotation("duet.dev/proxy-read-timeout", "2h")
                .host("huge.test", "secure")
                .build(),
            Ingress::new(NS, "secure-h2")
                .annotation("duet.dev/backend-ca-secret", "upstream-ca")
                .annotation("duet.dev/backend-tls-server-name", "grpc.internal")
                .host("h2.test", "secure-h2")
                .build(),
            Ingress::new(NS, "secure-h2-default-name")
                .annotation("duet.dev/backend-ca-secret", "upstream-ca")
                .host("h2-wrong-name.test", "secure-h2")
                .build(),
        ],
    )?;
    let duet = DuetBuilder::new(DUET, dir.path()).start().await?;
    Ok(Setup {
        _fleets: vec![fallback, secure, secure_h2],
        _dir: dir,
        duet,
        h2c,
    })
}

fn echo_of(reply: &Reply, what: &str) -> anyhow::Result<Echo> {
    anyhow::ensure!(
        reply.status == 200,
        "{what}: status {} body {:?}",
        reply.status,
        reply.text()
    );
    reply.echo()
}

#[tokio::test]
async fn h2c_upstream_speaks_http2_over_the_clients_family_on_one_connection() -> anyhow::Result<()>
{
    let s = setup().await?;
    for family in Family::BOTH {
        for h2_client in [false, true] {
            let to = s.duet.http(family);
            let mut conn = if h2_client {
                Conn::http2(to).await?
            } else {
                Conn::http1(to).await?
            };
            let mut peers = std::collections::BTreeSet::new();
            for _ in 0..6 {
                let echo = echo_of(&conn.get("h2c.test", "/x?y=1").await?, "h2c")?;
                assert_eq!(echo.proto, "HTTP/2.0", "{family} h2 client {h2_client}");
                assert_eq!(echo.family, family, "pod reached over the client's family");
                assert_eq!(echo.path, "/x?y=1");
                assert_eq!(echo.host, "h2c.test");
                let pod = s.h2c.pod(&echo.pod);
                assert_eq!(Some(echo.local), pod.addr(family));
                assert_eq!(
                    echo.header("X-Forwarded-For").as_deref(),
                    Some(&*conn.local_addr().ip().to_string())
                );
                peers.insert((echo.pod.clone(), echo.peer));
            }
            // Two pods, one multiplexed connection to each address: at most two source ports.
            assert!(peers.len() <= 2, "{family}: {peers:?}");
        }
    }
    Ok(())
}

#[tokio::test]
async fn concurrent_first_requests_share_one_h2_connection_per_address() -> anyhow::Result<()> {
    let s = setup().await?;
    for family in Family::BOTH {
        let to = s.duet.http(family);
        let requests = (0..16).map(|_| async move {
            let reply = Conn::http1(to).await?.get("h2c.test", "/").await?;
            echo_of(&reply, "concurrent")
        });
        let mut peers = std::collections::BTreeSet::new();
        for echo in futures_util::future::join_all(requests).await {
            let echo = echo?;
            assert_eq!(echo.family, family);
            peers.insert(echo.peer);
        }
        // Two pods, so at most two connections however many requests raced for them.
        assert!(peers.len() <= 2, "{family}: {peers:?}");
    }
    Ok(())
}

#[tokio::test]
async fn h2c_upstream_reconnects_after_the_pods_restart() -> anyhow::Result<()> {
    let mut s = setup().await?;
    for family in Family::BOTH {
        let mut conn = Conn::http1(s.duet.http(family)).await?;
        let mut before = std::collections::BTreeSet::new();
        for _ in 0..4 {
            let echo = echo_of(&conn.get("h2c.test", "/").await?, "before")?;
            before.insert(echo.peer);
        }
        // The pods' processes restart: every connection duet had to them is cut.
        s.h2c.restart().await?;
        for _ in 0..4 {
            let echo = echo_of(&conn.get("h2c.test", "/").await?, "after restart")?;
            assert_eq!(echo.proto, "HTTP/2.0");
            assert_eq!(echo.family, family);
            assert!(!before.contains(&echo.peer), "a new connection");
        }
    }
    Ok(())
}

#[tokio::test]
async fn h2c_upstream_falls_back_to_the_pods_other_family() -> anyhow::Result<()> {
    let s = setup().await?;
    for family in Family::BOTH {
        let mut conn = Conn::http1(s.duet.http(family)).await?;
        for _ in 0..4 {
            let echo = echo_of(&conn.get("fallback.test", "/").await?, "fallback")?;
            assert_eq!(
                echo.family,
                Family::V6,
                "{family} client: the IPv4 port refuses"
            );
            assert_eq!(echo.proto, "HTTP/2.0");
        }
    }
    Ok(())
}

#[tokio::test]
async fn out_of_range_timeout_annotations_fall_back_with_a_diagnostic() -> anyhow::Result<()> {
    let s = setup().await?;
    for family in Family::BOTH {
        let mut conn = Conn::http1(s.duet.http(family)).await?;
        let echo = echo_of(&conn.get("huge.test", "/").await?, "huge.test")?;
        assert_eq!(echo.family, family);
    }
    let routes = s.duet.debug_routes().await?.to_string();
    for annotation in ["proxy-connect-timeout", "proxy-read-timeout"] {
        let reported = format!("duet.dev/{annotation}: ");
        assert!(
            routes.contains(&reported) && routes.contains("maximum, 1h"),
            "{annotation}: {routes}"
        );
    }
    Ok(())
}

#[tokio::test]
async fn https_upstreams_verify_against_the_ca_secret_per_route() -> anyhow::Result<()> {
    let s = setup().await?;
    for family in Family::BOTH {
        let mut conn = Conn::http1(s.duet.http(family)).await?;
        for host in ["secure.test", "skip.test"] {
            let echo = echo_of(&conn.get(host, "/tls").await?, host)?;
            assert_eq!(echo.proto, "HTTP/1.1", "{host}");
            assert_eq!(echo.family, family, "{host}");
            assert_eq!(echo.service, "secure");
        }
        for host in ["wrong-ca.test", "missing-ca.test", "no-ca.test"] {
            let reply = conn.get(host, "/tls").await?;
            assert_eq!(reply.status, 502, "{host}: {}", reply.text());
            assert_eq!(reply.header("server"), Some("duet"));
        }
        // The failures are per route: the verified route still answers on the same connection.
        echo_of(&conn.get("secure.test", "/again").await?, "secure again")?;
    }
    // The access log names the upstream protocol of requests a pod answered.
    let logged = client::eventually(
        "access log lines",
        std::time::Duration::from_secs(10),
        || {
            let logs = s.duet.logs();
            async move {
                let lines: Vec<serde_json::Value> = logs
                    .lines()
                    .filter(|l| l.starts_with('{'))
                    .filter_map(|l| serde_json::from_str(l).ok())
                    .filter(|v: &serde_json::Value| v["path"] == "/again")
                    .collect();
                anyhow::ensure!(lines.len() == 2, "{logs}");
                Ok(lines)
            }
        },
    )
    .await?;
    for line in logged {
        assert_eq!(line["upstream_protocol"], "https", "{line}");
    }
    let routes = s.duet.debug_routes().await?;
    let diagnostics = routes["diagnostics"].to_string();
    for expected in ["MissingSecret", "no-such-secret", "InsecureBackendTls"] {
        assert!(diagnostics.contains(expected), "{expected}: {diagnostics}");
    }
    Ok(())
}

#[tokio::test]
async fn websocket_upgrades_tunnel_to_wss_upstreams() -> anyhow::Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let s = setup().await?;
    for family in Family::BOTH {
        let (reply, io) = client::upgrade(s.duet.http(family), "secure.test", "/ws").await?;
        assert_eq!(reply.status, 101, "{family}: {}", reply.text());
        assert_eq!(reply.header("x-echo-family"), Some(family.as_str()));
        let mut io = io.expect("101 without an upgraded stream");
        let exchange = async {
            io.write_all(b"over tls").await?;
            io.flush().await?;
            let mut back = [0u8; 8];
            io.read_exact(&mut back).await?;
            anyhow::Ok(back)
        };
        let back = tokio::time::timeout(client::REQUEST_TIMEOUT, exchange).await??;
        assert_eq!(&back, b"over tls");
    }
    Ok(())
}

#[tokio::test]
async fn h2_over_tls_upstream_checks_the_server_name() -> anyhow::Result<()> {
    let s = setup().await?;
    for family in Family::BOTH {
        let mut conn = Conn::http1(s.duet.http(family)).await?;
        for _ in 0..3 {
            let echo = echo_of(&conn.get("h2.test", "/").await?, "h2 over TLS")?;
            assert_eq!(echo.proto, "HTTP/2.0");
            assert_eq!(echo.family, family);
        }
        // Same pods and CA, but the default name secure-h2.up.svc is not in the certificate.
        let reply = conn.get("h2-wrong-name.test", "/").await?;
        assert_eq!(reply.status, 502, "{}", reply.text());
    }
    Ok(())
}

fn grpc_request(host: &str, messages: usize, status: u32) -> anyhow::Result<Request<Full<Bytes>>> {
    Ok(client::request(Method::POST, host, "/echo.Echo/Stream")
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("x-echo-grpc-messages", messages.to_string())
        .header("x-echo-grpc-status", status.to_string())
        .body(Full::new(grpc_frame(b"hello")))?)
}

fn check_grpc(reply: &Reply, messages: usize, status: &str, family: Family) -> anyhow::Result<()> {
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(reply.header("content-type"), Some("application/grpc"));
    let trailers = &reply.trailers;
    assert_eq!(
        trailers.get("grpc-status").map(|v| v.to_str().unwrap()),
        Some(status),
        "trailers {trailers:?}"
    );
    let got = grpc_messages(&reply.body).expect("well-framed gRPC messages");
    assert_eq!(got.len(), messages);
    for message in got {
        let echo: Echo = serde_json::from_slice(&message)?;
        assert_eq!(echo.proto, "HTTP/2.0");
        assert_eq!(echo.family, family);
        assert_eq!(echo.body_length, 10);
        assert_eq!(echo.header("Te").as_deref(), Some("trailers"));
    }
    Ok(())
}

#[tokio::test]
async fn grpc_round_trips_keep_trailers_over_prior_knowledge_and_tls() -> anyhow::Result<()> {
    let s = setup().await?;
    for family in Family::BOTH {
        let prior = Conn::http2(s.duet.http(family)).await?;
        let (tls, handshake) = Conn::https(s.duet.https(family), Some("h2c.test"), &["h2"]).await?;
        assert_eq!(handshake.alpn.as_deref(), Some("h2"));
        for mut conn in [prior, tls] {
            // Unary, then server streaming, then a failing call: the status is in the trailers.
            check_grpc(
                &conn.send(grpc_request("h2c.test", 1, 0)?).await?,
                1,
                "0",
                family,
            )?;
            check_grpc(
                &conn.send(grpc_request("h2c.test", 3, 0)?).await?,
                3,
                "0",
                family,
            )?;
            check_grpc(
                &conn.send(grpc_request("h2c.test", 0, 7)?).await?,
                0,
                "7",
                family,
            )?;
            // gRPC to an HTTP/2-over-TLS upstream too.
            check_grpc(
                &conn.send(grpc_request("h2.test", 2, 0)?).await?,
                2,
                "0",
                family,
            )?;
        }
    }
    Ok(())
}

/// Kubernetes mode on the real control plane (`kube_support`): a Service port's `appProtocol:
/// h2` and an Opaque CA Secret named by the Ingress make duet speak HTTP/2 over TLS to the pod.
#[tokio::test]
async fn kubernetes_mode_reads_appprotocol_and_an_opaque_ca_secret() -> anyhow::Result<()> {
    let env = kube_support::env(conformance::cluster::Stack::Dual, &["upstream"]).await?;
    let ca = TestCa::new("kube CA");
    let cert = ca.issue(&["secure.upstream.svc"]);
    let options = EchoOptions {
        tls: Some(tls::server_config(&cert, &["h2", "http/1.1"])),
        ..EchoOptions::default()
    };
    let _pod = kube_support::tls_pod(&env, 10, "h2", options).await?;
    env.apply(&[
        tls::ca_secret("upstream", "ca", &ca.cert_pem),
        Ingress::new("upstream", "secure")
            .annotation("duet.dev/backend-ca-secret", "ca")
            .host("kube-secure.test", "secure")
            .build(),
    ])
    .await?;
    let duet = env.duet(Family::V6, &[]).await?;
    kube_support::until_status(&duet, "kube-secure.test", 200).await?;
    for family in Family::BOTH {
        let reply = client::get(duet.http(family), "kube-secure.test", "/").await?;
        let echo = echo_of(&reply, "upstream")?;
        assert_eq!((echo.proto.as_str(), echo.family), ("HTTP/2.0", family));
    }
    Ok(())
}
