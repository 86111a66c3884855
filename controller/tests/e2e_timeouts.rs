//! End to end, over real sockets on 127.0.0.1 and [::1]: timeouts. Client connections idle
//! between requests longer than `--keepalive-timeout` are closed (HTTP/1.1 and HTTP/2) while busy
//! ones are not cut; request heads slower than `--header-read-timeout` are dropped. Upstream
//! connect and read timeouts apply per Ingress (`duet.dev/proxy-connect-timeout`,
//! `duet.dev/proxy-read-timeout`), else the flags.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use conformance::bytes::Bytes;
use conformance::client::{self, Conn};
use conformance::fleet::{silent_port, static_service, unanswered_port};
use conformance::http::Method;
use conformance::http_body_util::Full;
use conformance::{DuetBuilder, Family, Fleet, Ingress, ManifestDir, PodSpec};
use futures_util::future::try_join_all;
use futures_util::FutureExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

const DUET: &str = env!("CARGO_BIN_EXE_duet");

// Far apart, so that a bound of several times the header read timeout still tells the two apart
// (upper bounds only catch a timer that never fires or the wrong one; speed is for benchmarks).
const KEEPALIVE: Duration = Duration::from_millis(2500);
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
            "2500ms",
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
        .header("x-echo-delay-ms", "2700")
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

/// The flag's read timeout: 10 times the annotation's 300 ms, so the annotation cases' upper
/// bound can sit far above their target and still tell the two apart.
const GLOBAL_READ: Duration = Duration::from_millis(3000);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_timeouts_apply_per_ingress() -> anyhow::Result<()> {
    let fleet = Fleet::start("up", "echo", &[PodSpec::dual("dual")])?;
    let (silent4, _s4) = silent_port(Family::V4)?;
    let (silent6, _s6) = silent_port(Family::V6)?;
    let (hang4, _h4) = unanswered_port(Family::V4)?;
    let (hang6, _h6) = unanswered_port(Family::V6)?;
    let stall4 = stalling_upstream(Family::V4).await?;
    let stall6 = stalling_upstream(Family::V6).await?;
    let dir = ManifestDir::with_class()?;
    dir.write("echo.yaml", &fleet.manifests())?;
    dir.write(
        "silent.yaml",
        &static_service("up", "silent", silent4, silent6),
    )?;
    dir.write("hang.yaml", &static_service("up", "hang", hang4, hang6))?;
    dir.write("stall.yaml", &static_service("up", "stall", stall4, stall6))?;
    let read = "duet.dev/proxy-read-timeout";
    dir.write(
        "ingress.yaml",
        &[
            Ingress::new("up", "echo").host("echo.test", "echo").build(),
            Ingress::new("up", "read-fast")
                .annotation(read, "300ms")
                .host("read-fast.test", "silent")
                .build(),
            Ingress::new("up", "read-bad")
                .annotation(read, "soon")
                .host("read-bad.test", "silent")
                .build(),
            Ingress::new("up", "stall")
                .annotation(read, "0.3")
                .host("stall.test", "stall")
                .build(),
            Ingress::new("up", "connect-fast")
                .annotation("duet.dev/proxy-connect-timeout", "200ms")
                .host("connect-fast.test", "hang")
                .build(),
        ],
    )?;
    let duet = DuetBuilder::new(DUET, dir.path())
        .args(["--upstream-timeout", "3s", "--connect-timeout", "10s"])
        .start()
        .await?;

    let mut cases = Vec::new();
    for family in Family::BOTH {
        let to = duet.http(family);
        let ms = Duration::from_millis;
        // (host, status, took at least, took less than)
        for (host, status, min, max) in [
            // The annotation's read timeout: no response head in time.
            ("read-fast.test", 504, ms(300), GLOBAL_READ - ms(100)),
            // An invalid annotation: the Ingress is served with the flag's timeout.
            ("read-bad.test", 504, GLOBAL_READ, GLOBAL_READ * 3),
            // The annotation's connect timeout, on each family of the target, then 502 (the
            // flag's 10 s would take far longer; 5 s is 12 times the two attempts).
            ("connect-fast.test", 502, ms(200), ms(5000)),
            // Meanwhile an Ingress with the defaults is served.
            ("echo.test", 200, ms(0), ms(5000)),
        ] {
            cases.push(
                async move {
                    let start = Instant::now();
                    let reply = client::get(to, host, "/").await?;
                    let took = start.elapsed();
                    assert_eq!(reply.status, status, "{family} {host}: {}", reply.text());
                    assert!(
                        took >= min && took < max,
                        "{family} {host}: answered after {took:?}"
                    );
                    if status != 200 {
                        assert_eq!(reply.header("server"), Some("duet"), "{family} {host}");
                    }
                    anyhow::Ok(())
                }
                .boxed(),
            );
        }
        // A response body that stalls longer than the read timeout is cut short.
        cases.push(
            async move {
                let start = Instant::now();
                let reply = client::get(to, "stall.test", "/").await;
                let took = start.elapsed();
                assert!(
                    reply.is_err(),
                    "{family}: stalled body delivered: {:?}",
                    reply.map(|r| r.text())
                );
                assert!(
                    took >= Duration::from_millis(300) && took < GLOBAL_READ,
                    "{family}: cut after {took:?}"
                );
                anyhow::Ok(())
            }
            .boxed(),
        );
    }
    try_join_all(cases).await?;
    Ok(())
}

/// An upstream that answers every request with a head and the start of a 100-byte body, then
/// sends nothing more (and never closes).
async fn stalling_upstream(family: Family) -> anyhow::Result<SocketAddr> {
    let listener = TcpListener::bind(SocketAddr::new(family.loopback(), 0)).await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((mut tcp, _)) = listener.accept().await {
            let mut head = Vec::new();
            while !head.ends_with(b"\r\n\r\n") {
                match tcp.read_u8().await {
                    Ok(b) => head.push(b),
                    Err(_) => break,
                }
            }
            let _ = tcp
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nstart")
                .await;
            held.push(tcp);
        }
    });
    Ok(addr)
}
