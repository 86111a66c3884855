//! End to end, over real sockets on 127.0.0.1 and [::1]: timeouts. Client connections idle
//! between requests longer than `--keepalive-timeout` are closed (HTTP/1.1 and HTTP/2) while busy
//! ones are not cut; request heads slower than `--header-read-timeout` are dropped.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use conformance::bytes::Bytes;
use conformance::client::{self, Conn};
use conformance::http::Method;
use conformance::http_body_util::Full;
use conformance::{DuetBuilder, Family, Fleet, Ingress, ManifestDir, PodSpec};
use futures_util::future::try_join_all;
use futures_util::FutureExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const DUET: &str = env!("CARGO_BIN_EXE_duet");

const KEEPALIVE: Duration = Duration::from_millis(1000);
const HEADER_READ: Duration = Duration::from_millis(400);

/// Polls until the server has closed `conn`; how long that took.
async fn closed_after(conn: &Conn, within: Duration) -> anyhow::Result<Duration> {
    let start = Instant::now();
    while !conn.is_closed() {
        anyhow::ensure!(start.elapsed() < within, "not closed within {within:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(start.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_are_closed_and_busy_ones_are_not() -> anyhow::Result<()> {
    let fleet = Fleet::start("ka", "echo", &[PodSpec::dual("dual")])?;
    let dir = ManifestDir::with_class()?;
    dir.write("echo.yaml", &fleet.manifests())?;
    dir.write(
        "ingress.yaml",
        &[Ingress::new("ka", "echo").host("ka.test", "echo").build()],
    )?;
    let duet = DuetBuilder::new(DUET, dir.path())
        .args([
            "--keepalive-timeout",
            "1s",
            "--header-read-timeout",
            "400ms",
        ])
        .start()
        .await?;

    // Every case waits for timers: run them all at once.
    let mut cases = Vec::new();
    for family in Family::BOTH {
        let to = duet.http(family);
        for h2 in [false, true] {
            cases.push(keepalive_case(to, h2).boxed());
        }
        for earlier in [false, true] {
            cases.push(slow_head_case(to, earlier).boxed());
        }
    }
    try_join_all(cases).await?;
    Ok(())
}

/// A busy connection is not cut; one idle past the header read timeout but within the keep-alive
/// timeout is kept; one idle past the keep-alive timeout is closed by the server.
async fn keepalive_case(to: SocketAddr, h2: bool) -> anyhow::Result<()> {
    let what = format!("{to} {}", if h2 { "h2" } else { "http/1.1" });
    let mut conn = if h2 {
        Conn::http2(to).await?
    } else {
        Conn::http1(to).await?
    };
    let slow = client::request(Method::GET, "ka.test", "/slow")
        .header("x-echo-delay-ms", "1200")
        .body(Full::new(Bytes::new()))?;
    client::expect_status(&conn.send(slow).await?, 200)?;
    tokio::time::sleep(HEADER_READ + Duration::from_millis(300)).await;
    assert!(
        !conn.is_closed(),
        "{what}: closed before the keep-alive timeout"
    );
    client::expect_status(&conn.get("ka.test", "/again").await?, 200)?;
    let after = closed_after(&conn, Duration::from_secs(10)).await?;
    assert!(
        after >= KEEPALIVE - Duration::from_millis(100),
        "{what}: closed after {after:?}"
    );
    Ok(())
}

/// A head that never completes is dropped after the header read timeout, on a new connection or
/// after an earlier request on it.
async fn slow_head_case(to: SocketAddr, earlier: bool) -> anyhow::Result<()> {
    let mut tcp = client::connect_tcp(to).await?;
    if earlier {
        // HEAD: the whole response is its head.
        tcp.write_all(b"HEAD / HTTP/1.1\r\nHost: ka.test\r\n\r\n")
            .await?;
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            head.push(tcp.read_u8().await?);
        }
        assert!(head.starts_with(b"HTTP/1.1 200"), "{to}");
    }
    let start = Instant::now();
    tcp.write_all(b"GET / HTTP/1.1\r\nHost: ka").await?;
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), tcp.read_to_end(&mut rest))
        .await
        .map_err(|_| anyhow::anyhow!("{to}: slow head not dropped"))?
        .ok();
    let after = start.elapsed();
    assert!(
        after >= HEADER_READ - Duration::from_millis(100) && after < KEEPALIVE,
        "{to} (earlier request: {earlier}): dropped after {after:?}"
    );
    assert!(rest.is_empty(), "{to}: {}", String::from_utf8_lossy(&rest));
    Ok(())
}
