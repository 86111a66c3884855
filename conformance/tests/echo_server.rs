//! The echo backend and the client, against each other with no proxy in between, over both
//! families: the JSON contract, the family extensions, closed ports and upgrades.

use conformance::client::{self, Conn};
use conformance::fleet::{Fleet, PodSpec, Port};
use conformance::Family;
use http::Method;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::test]
async fn echo_reports_request_pod_and_family() -> anyhow::Result<()> {
    let fleet = Fleet::start("ns", "svc", &[PodSpec::dual("dual")])?;
    let pod = fleet.pod("dual").clone();
    for family in Family::BOTH {
        let addr = pod.addr(family).unwrap();
        let mut conn = Conn::http1(addr).await?;
        let req = client::request(Method::POST, "example.test", "/a/b%2Fc?x=1&y")
            .header("user-agent", "Go-http-client/1.1")
            .header("x-multi", "1")
            .header("x-multi", "2")
            .body(http_body_util::Full::new(bytes::Bytes::from_static(
                b"hello",
            )))?;
        let reply = conn.send(req).await?;
        assert_eq!(reply.status, 200);
        assert_eq!(reply.header("content-type"), Some("application/json"));
        assert_eq!(reply.header("x-content-type-options"), Some("nosniff"));
        assert!(
            reply.header("server").is_none(),
            "the echo must not send Server"
        );
        assert!(reply.header("date").is_some());
        assert!(reply.header("content-length").is_some());
        assert!(
            reply.text().starts_with("{\n \"path\": "),
            "{}",
            reply.text()
        );
        let echo = reply.echo()?;
        assert_eq!(echo.path, "/a/b%2Fc?x=1&y");
        assert_eq!(echo.host, "example.test");
        assert_eq!(echo.method, "POST");
        assert_eq!(echo.proto, "HTTP/1.1");
        assert_eq!(echo.namespace, "ns");
        assert_eq!(echo.service, "svc");
        assert_eq!(echo.pod, "dual");
        assert_eq!(echo.family, family);
        assert_eq!(echo.local, addr);
        assert_eq!(echo.peer, conn.local_addr());
        assert_eq!(echo.body_length, 5);
        assert_eq!(echo.header_values("User-Agent"), ["Go-http-client/1.1"]);
        assert_eq!(echo.header_values("x-multi"), ["1", "2"]);
        assert!(echo.headers.contains_key("X-Multi"), "{:?}", echo.headers);
        assert!(!echo.headers.contains_key("Host"));
        // Keep-alive: a second request on the same connection.
        let again = conn.get("example.test", "/health").await?;
        assert_eq!(again.text(), "OK");
    }
    Ok(())
}

#[tokio::test]
async fn http2_prior_knowledge_is_echoed_as_http2() -> anyhow::Result<()> {
    let fleet = Fleet::start("ns", "svc", &[PodSpec::dual("dual")])?;
    for family in Family::BOTH {
        let mut conn = Conn::http2(fleet.pod("dual").addr(family).unwrap()).await?;
        let echo = conn.get("h2.test", "/x?y=z").await?.echo()?;
        assert_eq!(echo.proto, "HTTP/2.0");
        assert_eq!(echo.host, "h2.test");
        assert_eq!(echo.path, "/x?y=z");
    }
    Ok(())
}

#[tokio::test]
async fn closed_ports_refuse_and_single_family_pods_have_one_address() -> anyhow::Result<()> {
    let fleet = Fleet::start(
        "ns",
        "svc",
        &[
            PodSpec::dual("broken").with(Family::V6, Port::Closed),
            PodSpec::v4_only("four"),
            PodSpec::v6_only("six"),
        ],
    )?;
    let broken = fleet.pod("broken");
    assert!(client::get(broken.v6.unwrap(), "h", "/").await.is_err());
    assert_eq!(client::get(broken.v4.unwrap(), "h", "/").await?.status, 200);
    assert!(fleet.pod("four").v6.is_none());
    assert!(fleet.pod("six").v4.is_none());
    // One Service, one IPv4 slice (broken and four share a port on addresses of their own) and
    // one IPv6 slice per pod (on ::1 each has its own port).
    assert_eq!(fleet.manifests().len(), 1 + 1 + 2);
    Ok(())
}

#[tokio::test]
async fn upgrades_echo_bytes_both_ways() -> anyhow::Result<()> {
    let fleet = Fleet::start("ns", "svc", &[PodSpec::dual("dual")])?;
    for family in Family::BOTH {
        let (reply, io) =
            client::upgrade(fleet.pod("dual").addr(family).unwrap(), "ws.test", "/ws").await?;
        assert_eq!(reply.status, 101);
        assert_eq!(reply.header("x-echo-pod"), Some("dual"));
        assert_eq!(reply.header("x-echo-family"), Some(family.as_str()));
        let mut io = io.unwrap();
        for msg in [&b"ping"[..], b"second message"] {
            io.write_all(msg).await?;
            let mut buf = vec![0; msg.len()];
            io.read_exact(&mut buf).await?;
            assert_eq!(buf, msg);
        }
    }
    Ok(())
}

#[tokio::test]
async fn stopped_fleet_cuts_connections() -> anyhow::Result<()> {
    let mut fleet = Fleet::start("ns", "svc", &[PodSpec::v4_only("a")])?;
    let addr = fleet.pod("a").v4.unwrap();
    let mut conn = Conn::http1(addr).await?;
    conn.get("h", "/").await?;
    fleet.stop();
    client::eventually("connection cut", std::time::Duration::from_secs(5), || {
        let closed = conn.is_closed();
        async move {
            if closed {
                Ok(())
            } else {
                anyhow::bail!("open")
            }
        }
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn test_controls_delay_and_set_response_headers() -> anyhow::Result<()> {
    let fleet = Fleet::start("ns", "svc", &[PodSpec::v6_only("six")])?;
    let addr = fleet.pod("six").v6.unwrap();
    let mut conn = Conn::http1(addr).await?;
    let started = std::time::Instant::now();
    let req = client::request(Method::GET, "h", "/")
        .header("x-echo-delay-ms", "300")
        .header("x-echo-set-header", "X-One: 1, X-Two: two words")
        .body(http_body_util::Full::new(bytes::Bytes::new()))?;
    let reply = conn.send(req).await?;
    assert!(started.elapsed() >= std::time::Duration::from_millis(300));
    assert_eq!(reply.header("x-one"), Some("1"));
    assert_eq!(reply.header("x-two"), Some("two words"));
    Ok(())
}

#[tokio::test]
async fn restarted_fleet_serves_on_the_same_addresses() -> anyhow::Result<()> {
    let mut fleet = Fleet::start("ns", "svc", &[PodSpec::dual("a")])?;
    let mut conn = Conn::http1(fleet.pod("a").v4.unwrap()).await?;
    conn.get("h", "/").await?;
    fleet.restart().await?;
    for family in Family::BOTH {
        let reply = client::get(fleet.pod("a").addr(family).unwrap(), "h", "/").await?;
        assert_eq!(reply.echo()?.pod, "a");
    }
    client::eventually(
        "old connection cut",
        std::time::Duration::from_secs(5),
        || {
            let closed = conn.is_closed();
            async move {
                if closed {
                    Ok(())
                } else {
                    anyhow::bail!("open")
                }
            }
        },
    )
    .await?;
    Ok(())
}
