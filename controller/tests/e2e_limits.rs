//! End to end, over real sockets on 127.0.0.1 and [::1]: client-side limits. Request heads over
//! 32 KiB get 431 (HTTP/1.1) or are refused (HTTP/2); declared bodies over the route's limit get
//! 413 (1 MiB by default, per Ingress with `duet.dev/proxy-body-size`), and so do chunked bodies
//! once they pass it.

use std::net::SocketAddr;

use conformance::bytes::Bytes;
use conformance::client::{self, Conn};
use conformance::http::Method;
use conformance::http_body_util::Full;
use conformance::{DuetBuilder, Family, Fleet, Ingress, ManifestDir, PodSpec};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const DUET: &str = env!("CARGO_BIN_EXE_duet");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_heads_and_bodies_are_refused() -> anyhow::Result<()> {
    let fleet = Fleet::start("lim", "echo", &[PodSpec::dual("dual")])?;
    let dir = ManifestDir::with_class()?;
    dir.write("echo.yaml", &fleet.manifests())?;
    let default = Ingress::new("lim", "default").host("default.test", "echo");
    let small = Ingress::new("lim", "small")
        .annotation("duet.dev/proxy-body-size", "4k")
        .host("small.test", "echo");
    let unlimited = Ingress::new("lim", "unlimited")
        .annotation("duet.dev/proxy-body-size", "0")
        .host("unlimited.test", "echo");
    dir.write(
        "ingress.yaml",
        &[default.build(), small.build(), unlimited.build()],
    )?;
    let duet = DuetBuilder::new(DUET, dir.path()).start().await?;

    let big_header = "x".repeat(40 * 1024);
    let fits_header = "x".repeat(16 * 1024);
    for family in Family::BOTH {
        let to = duet.http(family);
        // Heads.
        let mut conn = Conn::http1(to).await?;
        let req = client::request(Method::GET, "default.test", "/")
            .header("x-fits", fits_header.as_str())
            .body(Full::new(Bytes::new()))?;
        client::expect_status(&conn.send(req).await?, 200)?;
        let mut conn = Conn::http1(to).await?;
        let req = client::request(Method::GET, "default.test", "/")
            .header("x-big", big_header.as_str())
            .body(Full::new(Bytes::new()))?;
        client::expect_status(&conn.send(req).await?, 431)?;
        let mut conn = Conn::http2(to).await?;
        let req = client::request(Method::GET, "default.test", "/")
            .header("x-big", big_header.as_str())
            .body(Full::new(Bytes::new()))?;
        // Refused with a stream reset (an error here) or an error status; never served.
        if let Ok(reply) = conn.send(req).await {
            assert_ne!(reply.status, 200, "{family}: h2 oversized head served");
        }

        // Bodies by declared length.
        for (host, size, want) in [
            ("default.test", 1024 * 1024, 200),
            ("default.test", 1024 * 1024 + 1, 413),
            ("small.test", 4096, 200),
            ("small.test", 4097, 413),
            ("unlimited.test", 3 * 1024 * 1024, 200),
        ] {
            let mut conn = Conn::http1(to).await?;
            let req = client::request(Method::PUT, host, "/up")
                .body(Full::new(Bytes::from(vec![b'b'; size])))?;
            let reply = conn.send(req).await?;
            assert_eq!(
                reply.status,
                want,
                "{family} {host} {size}: {}",
                reply.text()
            );
            if want == 200 {
                assert_eq!(reply.echo()?.body_length, size as u64);
            } else {
                assert_eq!(reply.header("server"), Some("duet"));
            }
        }

        // Bodies without a declared length are counted as they stream: past the limit the
        // upstream request is aborted and, with no response started yet, the client gets 413.
        for (host, size, want) in [
            ("small.test", 4096, "200"),
            ("small.test", 4097, "413"),
            ("small.test", 64 * 1024, "413"),
            ("default.test", 1024 * 1024 + 1, "413"),
            ("unlimited.test", 3 * 1024 * 1024, "200"),
        ] {
            let reply = chunked_put(to, host, size).await?;
            let status = reply.split(' ').nth(1).unwrap_or_default();
            assert_eq!(status, want, "{family} {host} chunked {size}: {reply}");
            if want == "200" {
                let length = format!("\"bodyLength\": {size}");
                assert!(reply.contains(&length), "{family} {host}: {reply}");
            }
        }
    }
    Ok(())
}

/// PUTs `size` bytes with `Transfer-Encoding: chunked` (in 1 KiB chunks) on a fresh connection
/// and returns the raw response (the server closes after it).
async fn chunked_put(to: SocketAddr, host: &str, size: usize) -> anyhow::Result<String> {
    let mut tcp = client::connect_tcp(to).await?;
    let mut out = format!(
        "PUT /up HTTP/1.1\r\nHost: {host}\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    )
    .into_bytes();
    let chunk = [b'c'; 1024];
    let mut left = size;
    while left > 0 {
        let n = left.min(chunk.len());
        out.extend_from_slice(format!("{n:x}\r\n").as_bytes());
        out.extend_from_slice(&chunk[..n]);
        out.extend_from_slice(b"\r\n");
        left -= n;
    }
    out.extend_from_slice(b"0\r\n\r\n");
    // The server may answer and close before reading everything: a failed write is fine, the
    // answer is what counts.
    let _ = tcp.write_all(&out).await;
    let mut reply = Vec::new();
    let _ = tokio::time::timeout(client::REQUEST_TIMEOUT, tcp.read_to_end(&mut reply)).await?;
    Ok(String::from_utf8_lossy(&reply).into_owned())
}
