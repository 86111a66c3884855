//! End to end, over real sockets on 127.0.0.1 and [::1]: client-side limits. Request heads over
//! 32 KiB get 431 (HTTP/1.1) or are refused (HTTP/2); declared bodies over the route's limit get
//! 413 (1 MiB by default, per Ingress with `duet.dev/proxy-body-size`), and so do chunked bodies
//! once they pass it. HTTP/2 connections advertise 128 concurrent streams and end with GOAWAY
//! `ENHANCE_YOUR_CALM` under a rapid-reset flood (CVE-2023-44487), while the proxy goes on
//! serving. Connections past `--max-connections` are closed and counted; 128 HTTP/2 streams of a
//! client that never reads hold bounded memory.

use std::net::SocketAddr;

use anyhow::Context as _;
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

/// A client that goes on sending a declared body after duet refused it (413 for 10 MiB over the
/// 1 MiB limit; 404 for an unknown host) still reads the answer: duet reads and discards the
/// rest of the body instead of closing on a client still sending (whose kernel would then get a
/// reset that destroys the answer), and the connection stays usable. Both families.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_before_the_body_reaches_a_client_still_sending() -> anyhow::Result<()> {
    let fleet = Fleet::start("linger", "echo", &[PodSpec::dual("dual")])?;
    let dir = ManifestDir::with_class()?;
    dir.write("echo.yaml", &fleet.manifests())?;
    let ingress = Ingress::new("linger", "default").host("default.test", "echo");
    dir.write("ingress.yaml", &[ingress.build()])?;
    let duet = DuetBuilder::new(DUET, dir.path()).start().await?;
    let declared = 10 * 1024 * 1024;
    for family in Family::BOTH {
        for (host, want) in [("default.test", "413"), ("unknown.test", "404")] {
            let mut tcp = client::connect_tcp(duet.http(family)).await?;
            let head =
                format!("PUT /up HTTP/1.1\r\nHost: {host}\r\nContent-Length: {declared}\r\n\r\n");
            tcp.write_all(head.as_bytes()).await?;
            tcp.write_all(&vec![b'b'; 64 * 1024]).await?;
            // duet has answered by now; the client, not reading yet, sends the rest.
            tokio::time::sleep(std::time::Duration::from_millis(300)).await;
            let rest = vec![b'b'; declared - 64 * 1024];
            tcp.write_all(&rest)
                .await
                .with_context(|| format!("{family} {host}: the body after the answer"))?;
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            let mut reply = vec![0u8; 4096];
            let n = tcp
                .read(&mut reply)
                .await
                .with_context(|| format!("{family} {host}: reading the answer"))?;
            let reply = String::from_utf8_lossy(&reply[..n]).into_owned();
            let status = reply.split(' ').nth(1).unwrap_or_default();
            assert_eq!(status, want, "{family} {host}: {reply}");
            // The body was read to its end: the connection serves the next request.
            tcp.write_all(b"GET / HTTP/1.1\r\nHost: default.test\r\nConnection: close\r\n\r\n")
                .await?;
            let mut next = Vec::new();
            tokio::time::timeout(client::REQUEST_TIMEOUT, tcp.read_to_end(&mut next)).await??;
            let next = String::from_utf8_lossy(&next);
            assert!(
                next.starts_with("HTTP/1.1 200"),
                "{family} {host}: next request: {next}"
            );
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

/// One HTTP/2 frame: 9-byte header (length, type, flags, stream id) and payload.
fn h2_frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len())
        .expect("small frame")
        .to_be_bytes();
    let mut f = vec![len[1], len[2], len[3], kind, flags];
    f.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// Reads one frame: (type, flags, payload); `None` at the end of the connection.
async fn read_h2_frame(
    tcp: &mut tokio::net::TcpStream,
) -> anyhow::Result<Option<(u8, u8, Vec<u8>)>> {
    let mut head = [0u8; 9];
    match tcp.read_exact(&mut head).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
    let mut payload = vec![0u8; len];
    tcp.read_exact(&mut payload).await?;
    Ok(Some((head[3], head[4], payload)))
}

const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const SETTINGS: u8 = 0x4;
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const GOAWAY: u8 = 0x7;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_streams_are_limited_and_a_rapid_reset_flood_ends_the_connection(
) -> anyhow::Result<()> {
    let fleet = Fleet::start("lim", "echo", &[PodSpec::dual("dual")])?;
    let dir = ManifestDir::with_class()?;
    dir.write("echo.yaml", &fleet.manifests())?;
    dir.write(
        "ingress.yaml",
        &[Ingress::new("lim", "web").host("a.test", "echo").build()],
    )?;
    let duet = DuetBuilder::new(DUET, dir.path()).start().await?;
    // GET / for a.test: indexed :method GET, :scheme http, :path /, and :authority as a literal
    // without indexing, so every block is the same.
    let mut block = vec![0x82, 0x86, 0x84, 0x01, 6];
    block.extend_from_slice(b"a.test");
    const FLOOD: u32 = 500;
    for family in Family::BOTH {
        let mut tcp = client::connect_tcp(duet.http(family)).await?;
        let mut hello = H2_PREFACE.to_vec();
        hello.extend(h2_frame(SETTINGS, 0, 0, &[]));
        tcp.write_all(&hello).await?;
        // The server's SETTINGS carry the stream limit.
        let settings = loop {
            match read_h2_frame(&mut tcp).await? {
                Some((SETTINGS, 0, payload)) => break payload,
                Some(_) => continue,
                None => anyhow::bail!("{family}: closed before SETTINGS"),
            }
        };
        let max_streams = settings.chunks_exact(6).find_map(|e| {
            (u16::from_be_bytes([e[0], e[1]]) == 0x3)
                .then(|| u32::from_be_bytes([e[2], e[3], e[4], e[5]]))
        });
        assert_eq!(max_streams, Some(128), "{family}: SETTINGS {settings:?}");
        // Request bodies a client may send ahead: 256 KiB per stream.
        let stream_window = settings.chunks_exact(6).find_map(|e| {
            (u16::from_be_bytes([e[0], e[1]]) == 0x4)
                .then(|| u32::from_be_bytes([e[2], e[3], e[4], e[5]]))
        });
        assert_eq!(
            stream_window,
            Some(256 * 1024),
            "{family}: SETTINGS {settings:?}"
        );
        tcp.write_all(&h2_frame(SETTINGS, 0x1, 0, &[])).await?;

        // Rapid reset: each stream opened and cancelled at once, many times over.
        let mut flood = Vec::new();
        for i in 0..FLOOD {
            let stream = 2 * i + 1;
            flood.extend(h2_frame(HEADERS, 0x1 | 0x4, stream, &block));
            flood.extend(h2_frame(RST_STREAM, 0, stream, &0x8u32.to_be_bytes()));
        }
        // The server may close before reading it all.
        let _ = tcp.write_all(&flood).await;
        let goaway = tokio::time::timeout(client::REQUEST_TIMEOUT, async {
            loop {
                match read_h2_frame(&mut tcp).await? {
                    Some((GOAWAY, _, payload)) => return anyhow::Ok(Some(payload)),
                    Some(_) => continue,
                    None => return Ok(None),
                }
            }
        })
        .await??;
        let goaway = goaway.with_context(|| format!("{family}: closed without GOAWAY"))?;
        let code = u32::from_be_bytes([goaway[4], goaway[5], goaway[6], goaway[7]]);
        assert_eq!(
            code, 0xb,
            "{family}: GOAWAY {goaway:?} is not ENHANCE_YOUR_CALM"
        );
        let last = u32::from_be_bytes([goaway[0], goaway[1], goaway[2], goaway[3]]) & 0x7fff_ffff;
        assert!(
            last < 2 * FLOOD - 1,
            "{family}: every stream was taken ({last})"
        );

        // Other clients are still served, over HTTP/2 too.
        let mut conn = Conn::http2(duet.http(family)).await?;
        let req = client::request(Method::GET, "a.test", "/").body(Full::new(Bytes::new()))?;
        client::expect_status(&conn.send(req).await?, 200)?;
    }
    Ok(())
}

/// The value of `duet_connections_refused_total` for a client family, summed over listeners.
async fn refused(duet: &conformance::Duet, family: Family) -> anyhow::Result<f64> {
    let text = duet.admin_get(Family::V4, "/metrics").await?.text();
    let label = format!("family=\"{}\"", family.as_str());
    Ok(text
        .lines()
        .filter(|l| l.starts_with("duet_connections_refused_total{") && l.contains(&label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_the_limit_are_refused_and_counted() -> anyhow::Result<()> {
    let fleet = Fleet::start("lim", "echo", &[PodSpec::dual("dual")])?;
    let dir = ManifestDir::with_class()?;
    dir.write("echo.yaml", &fleet.manifests())?;
    dir.write(
        "ingress.yaml",
        &[Ingress::new("lim", "web").host("a.test", "echo").build()],
    )?;
    let duet = DuetBuilder::new(DUET, dir.path())
        .args(["--max-connections", "2"])
        .start()
        .await?;
    // One open connection per family takes both places.
    let mut held = Vec::new();
    for family in Family::BOTH {
        let mut conn = Conn::http1(duet.http(family)).await?;
        client::expect_status(&conn.get("a.test", "/").await?, 200)?;
        held.push(conn);
    }
    for family in Family::BOTH {
        let before = refused(&duet, family).await?;
        let mut tcp = client::connect_tcp(duet.http(family)).await?;
        let _ = tcp
            .write_all(b"GET / HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n")
            .await;
        let mut answer = Vec::new();
        let _ = tokio::time::timeout(client::REQUEST_TIMEOUT, tcp.read_to_end(&mut answer)).await?;
        assert!(
            answer.is_empty(),
            "{family}: served past the limit: {}",
            String::from_utf8_lossy(&answer)
        );
        assert_eq!(refused(&duet, family).await?, before + 1.0, "{family}");
    }
    let logs = duet.logs();
    assert!(
        logs.contains("Connection limit (--max-connections) reached"),
        "{logs}"
    );
    // A closed connection frees its place.
    for family in Family::BOTH {
        held.pop();
        let to = duet.http(family);
        let reply = client::eventually("a freed place", client::REQUEST_TIMEOUT, || async move {
            let mut conn = Conn::http1(to).await?;
            conn.get("a.test", "/").await
        })
        .await?;
        client::expect_status(&reply, 200)?;
    }
    Ok(())
}

/// A raw HTTP/1.1 upstream on both families answering every request with a `size`-byte body;
/// returns its addresses and the count of connections it accepted.
async fn big_upstream(
    size: usize,
) -> anyhow::Result<(
    [SocketAddr; 2],
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
)> {
    let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut addrs = Vec::new();
    for family in Family::BOTH {
        let listener = tokio::net::TcpListener::bind((family.loopback(), 0)).await?;
        addrs.push(listener.local_addr()?);
        let accepted = accepted.clone();
        tokio::spawn(async move {
            while let Ok((mut tcp, _)) = listener.accept().await {
                accepted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut buf = [0u8; 4096];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        match tcp.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    let reply = format!("HTTP/1.1 200 OK\r\nContent-Length: {size}\r\n\r\n");
                    if tcp.write_all(reply.as_bytes()).await.is_err() {
                        return;
                    }
                    let chunk = vec![b'x'; 64 * 1024];
                    let mut left = size;
                    while left > 0 {
                        let n = left.min(chunk.len());
                        if tcp.write_all(&chunk[..n]).await.is_err() {
                            return;
                        }
                        left -= n;
                    }
                });
            }
        });
    }
    Ok(([addrs[0], addrs[1]], accepted))
}

/// Resident memory of a process in KiB (`VmRSS` of /proc/PID/status).
fn rss_kib(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .context("no VmRSS")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_http2_streams_hold_bounded_memory() -> anyhow::Result<()> {
    const STREAMS: u32 = 128;
    let (upstream, accepted) = big_upstream(8 << 20).await?;
    let dir = ManifestDir::with_class()?;
    dir.write(
        "big.yaml",
        &conformance::fleet::static_service("lim", "big", upstream[0], upstream[1]),
    )?;
    dir.write(
        "ingress.yaml",
        &[Ingress::new("lim", "big").host("a.test", "big").build()],
    )?;
    let duet = DuetBuilder::new(DUET, dir.path())
        .args(["--access-log", "off"])
        .start()
        .await?;
    // Warm up: one full response per family, so the baseline has the pools and buffers made.
    for family in Family::BOTH {
        let mut conn = Conn::http2(duet.http(family)).await?;
        let req = client::request(Method::GET, "a.test", "/").body(Full::new(Bytes::new()))?;
        let reply = conn.send(req).await?;
        client::expect_status(&reply, 200)?;
        assert_eq!(reply.body.len(), 8 << 20);
    }
    let before = rss_kib(duet.pid())?;
    let seen = accepted.load(std::sync::atomic::Ordering::SeqCst);
    // Per family: huge flow-control windows, 128 streams, and a socket that is never read.
    let mut block = vec![0x82, 0x86, 0x84, 0x01, 6];
    block.extend_from_slice(b"a.test");
    let mut sockets = Vec::new();
    for family in Family::BOTH {
        let mut tcp = client::connect_tcp(duet.http(family)).await?;
        let mut hello = H2_PREFACE.to_vec();
        // SETTINGS_INITIAL_WINDOW_SIZE = 2^31 - 1, and the connection window as large.
        let mut settings = vec![0, 4];
        settings.extend_from_slice(&0x7fff_ffffu32.to_be_bytes());
        hello.extend(h2_frame(SETTINGS, 0, 0, &settings));
        hello.extend(h2_frame(0x8, 0, 0, &0x7fff_0000u32.to_be_bytes()));
        for i in 0..STREAMS {
            hello.extend(h2_frame(HEADERS, 0x1 | 0x4, 2 * i + 1, &block));
        }
        tcp.write_all(&hello).await?;
        sockets.push(tcp);
    }
    client::eventually(
        "every stream reaches the upstream",
        std::time::Duration::from_secs(30),
        || {
            let n = accepted.load(std::sync::atomic::Ordering::SeqCst) - seen;
            async move {
                anyhow::ensure!(n >= 2 * STREAMS as usize, "{n} upstream connections");
                Ok(())
            }
        },
    )
    .await?;
    // Let the buffers fill, then take the largest resident size over a while.
    let mut peak = 0;
    for _ in 0..20 {
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        peak = peak.max(rss_kib(duet.pid())?);
    }
    let grown_mib = peak.saturating_sub(before) / 1024;
    eprintln!(
        "RSS before {before} KiB, with 2 x {STREAMS} slow streams {peak} KiB (+{grown_mib} MiB)"
    );
    // Measured: +33 MiB with duet's buffer limits, +229 MiB with hyper's defaults (400 KiB of
    // send buffer per stream, upstream read buffers growing to 400 KiB).
    assert!(
        grown_mib < 64,
        "2 x {STREAMS} slow streams grew duet by {grown_mib} MiB"
    );
    drop(sockets);
    Ok(())
}
