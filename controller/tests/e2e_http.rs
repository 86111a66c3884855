//! End to end, over real sockets on 127.0.0.1 and [::1]: what the proxy does to a request and a
//! response (forwarding headers, hop-by-hop headers, Host, path and query, `Server`), HTTP/2
//! clients with prior knowledge, and upgrade tunnelling.

use conformance::bytes::Bytes;
use conformance::client::{self, Conn};
use conformance::http::{self, Method};
use conformance::http_body_util::Full;
use conformance::{Duet, DuetBuilder, Family, Fleet, Ingress, ManifestDir, PodSpec};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const DUET: &str = env!("CARGO_BIN_EXE_duet");

async fn setup() -> anyhow::Result<(Fleet, ManifestDir, Duet)> {
    let fleet = Fleet::start("e2e", "echo", &[PodSpec::dual("dual")])?;
    let dir = ManifestDir::with_class()?;
    dir.write("echo.yaml", &fleet.manifests())?;
    // Bodies above the 1 MiB default are streamed in a test below.
    let ingress = Ingress::new("e2e", "echo")
        .annotation("duet.dev/proxy-body-size", "8m")
        .host("hdr.test", "echo")
        .host("h2.test", "echo")
        .host("ws.test", "echo");
    dir.write("ingress.yaml", &[ingress.build()])?;
    let duet = DuetBuilder::new(DUET, dir.path()).start().await?;
    Ok((fleet, dir, duet))
}

/// The `for=` value of the first element of a `Forwarded` header (quotes kept).
fn forwarded_for(header: &str) -> Option<&str> {
    header
        .split(',')
        .next()?
        .split(';')
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| k.eq_ignore_ascii_case("for"))
        .map(|(_, v)| v)
}

#[test]
fn forwarded_for_parsing() {
    assert_eq!(
        forwarded_for("for=\"[::1]:5\";proto=http"),
        Some("\"[::1]:5\"")
    );
    assert_eq!(
        forwarded_for("proto=http; for=\"1.2.3.4:5\", for=x"),
        Some("\"1.2.3.4:5\"")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarding_headers_carry_the_real_client_address() -> anyhow::Result<()> {
    let (_fleet, _dir, duet) = setup().await?;
    for family in Family::BOTH {
        let mut conn = Conn::http1(duet.http(family)).await?;
        let client_addr = conn.local_addr();
        let ip = client_addr.ip().to_string(); // `::1`, no brackets
        let reply = conn.get("hdr.test", "/").await?;
        assert_eq!(reply.status, 200, "{}", reply.text());
        assert_eq!(
            reply.header("server"),
            Some("duet"),
            "{family}: Server on a proxied response"
        );
        let echo = reply.echo()?;
        let want_for = match family {
            Family::V4 => format!("\"{client_addr}\""),
            Family::V6 => format!("\"[{}]:{}\"", client_addr.ip(), client_addr.port()),
        };
        assert_eq!(
            echo.header("x-forwarded-for").as_deref(),
            Some(ip.as_str()),
            "{family}"
        );
        assert_eq!(
            echo.header("x-real-ip").as_deref(),
            Some(ip.as_str()),
            "{family}"
        );
        let forwarded = echo
            .header("forwarded")
            .ok_or_else(|| anyhow::anyhow!("{family}: no Forwarded header"))?;
        assert_eq!(
            forwarded_for(&forwarded),
            Some(want_for.as_str()),
            "{family}: Forwarded: {forwarded}"
        );
        assert_eq!(
            echo.header("x-forwarded-proto").as_deref(),
            Some("http"),
            "{family}"
        );
        assert_eq!(
            echo.header("x-forwarded-host").as_deref(),
            Some("hdr.test"),
            "{family}"
        );
        let port = duet.http(family).port().to_string();
        assert_eq!(
            echo.header("x-forwarded-port").as_deref(),
            Some(port.as_str()),
            "{family}"
        );
        assert_eq!(echo.host, "hdr.test", "{family}: Host preserved");
        assert_eq!(
            echo.family, family,
            "{family}: the dual-stack pod over the client's family"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_is_forwarded_normalised_minus_hop_by_hop_headers() -> anyhow::Result<()> {
    let (_fleet, _dir, duet) = setup().await?;
    let path = "/p/a%2Fb//c/./d/../e?x=1&y=%2F&&z=%20";
    for family in Family::BOTH {
        let mut conn = Conn::http1(duet.http(family)).await?;
        let req = client::request(Method::POST, "hdr.test", path)
            .header("user-agent", "Go-http-client/1.1")
            .header("connection", "keep-alive, X-Hop-Custom")
            .header("x-hop-custom", "must go")
            .header("keep-alive", "timeout=5")
            .header("proxy-connection", "keep-alive")
            .header("te", "trailers")
            .header("x-end-to-end", "stays")
            .header("content-type", "text/plain")
            .body(Full::new(Bytes::from_static(b"0123456789")))?;
        let reply = conn.send(req).await?;
        assert_eq!(reply.status, 200, "{}", reply.text());
        assert_eq!(reply.header("server"), Some("duet"));
        let echo = reply.echo()?;
        assert_eq!(
            echo.path, "/p/a%2Fb/c/e?x=1&y=%2F&&z=%20",
            "{family}: path normalised (slashes merged, dot segments resolved, %2F kept), query unchanged"
        );
        assert_eq!(echo.method, "POST");
        assert_eq!(echo.host, "hdr.test");
        assert_eq!(echo.proto, "HTTP/1.1");
        assert_eq!(echo.body_length, 10, "{family}: request body forwarded");
        assert_eq!(echo.header_values("user-agent"), ["Go-http-client/1.1"]);
        assert_eq!(echo.header_values("x-end-to-end"), ["stays"]);
        assert_eq!(echo.header_values("content-type"), ["text/plain"]);
        for hop in ["x-hop-custom", "keep-alive", "proxy-connection", "te"] {
            assert!(
                echo.header(hop).is_none(),
                "{family}: hop-by-hop {hop} forwarded: {:?}",
                echo.headers
            );
        }
        if let Some(connection) = echo.header("connection") {
            assert!(
                !connection.to_ascii_lowercase().contains("x-hop-custom"),
                "{family}: Connection forwarded: {connection}"
            );
        }
        // The connection is still good for another request.
        assert_eq!(conn.get("hdr.test", "/again").await?.status, 200);
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_prior_knowledge_clients_are_proxied_over_http1() -> anyhow::Result<()> {
    let (_fleet, _dir, duet) = setup().await?;
    for family in Family::BOTH {
        let mut conn = Conn::http2(duet.http(family)).await?;
        for i in 0..20 {
            let path = format!("/h2/{i}?q={i}");
            let reply = conn.get("h2.test", &path).await?;
            assert_eq!(reply.status, 200, "{}", reply.text());
            assert_eq!(reply.version, http::Version::HTTP_2);
            assert_eq!(reply.header("server"), Some("duet"));
            let echo = reply.echo()?;
            assert_eq!(echo.proto, "HTTP/1.1", "the upstream hop is HTTP/1.1");
            assert_eq!(echo.host, "h2.test", "the :authority becomes the Host");
            assert_eq!(echo.path, path);
            assert_eq!(echo.family, family);
            let ip = conn.local_addr().ip().to_string();
            assert_eq!(echo.header("x-forwarded-for").as_deref(), Some(ip.as_str()));
        }
        let missing = conn.get("nowhere.test", "/").await?;
        assert_eq!(missing.status, 404);
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgrades_are_tunnelled_both_ways() -> anyhow::Result<()> {
    let (fleet, _dir, duet) = setup().await?;
    for family in Family::BOTH {
        let (reply, io) = client::upgrade(duet.http(family), "ws.test", "/ws?room=1").await?;
        assert_eq!(reply.status, 101, "{family}: {}", reply.text());
        assert_eq!(reply.header("x-echo-pod"), Some("dual"));
        assert_eq!(reply.header("x-echo-family"), Some(family.as_str()));
        let local = fleet.pod("dual").addr(family).unwrap().to_string();
        assert_eq!(reply.header("x-echo-local"), Some(local.as_str()));
        let mut io = io.expect("101 without an upgraded stream");
        let big: Vec<u8> = (0..256 * 1024).map(|i| (i % 251) as u8).collect();
        for msg in [&b"hello"[..], b"second frame", &big] {
            let (mut rd, mut wr) = tokio::io::split(&mut io);
            let write = async {
                wr.write_all(msg).await?;
                wr.flush().await
            };
            let mut back = vec![0u8; msg.len()];
            let read = rd.read_exact(&mut back);
            let (w, r) =
                tokio::time::timeout(client::REQUEST_TIMEOUT, async { tokio::join!(write, read) })
                    .await?;
            w?;
            r?;
            assert!(
                back == msg,
                "{family}: {} bytes came back different",
                msg.len()
            );
        }
        // Closing our side closes theirs.
        io.shutdown().await?;
        let mut rest = Vec::new();
        tokio::time::timeout(client::REQUEST_TIMEOUT, io.read_to_end(&mut rest)).await??;
        assert!(rest.is_empty());
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarding_headers_from_untrusted_clients_are_replaced() -> anyhow::Result<()> {
    let (_fleet, _dir, duet) = setup().await?;
    for family in Family::BOTH {
        let mut conn = Conn::http1(duet.http(family)).await?;
        let ip = conn.local_addr().ip().to_string();
        let req = client::request(Method::GET, "hdr.test", "/")
            .header("x-forwarded-for", "203.0.113.66")
            .header("x-real-ip", "203.0.113.66")
            .header("forwarded", "for=203.0.113.66")
            .header("x-forwarded-proto", "https")
            .header("x-forwarded-host", "evil.test")
            .header("x-forwarded-port", "1")
            .body(Full::new(Bytes::new()))?;
        let echo = conn.send(req).await?.echo()?;
        // No peer is trusted by default: only what duet saw itself reaches the backend.
        assert_eq!(
            echo.header_values("x-forwarded-for"),
            [ip.as_str()],
            "{family}"
        );
        assert_eq!(echo.header_values("x-real-ip"), [ip.as_str()], "{family}");
        let forwarded = echo
            .header("forwarded")
            .ok_or_else(|| anyhow::anyhow!("{family}: no Forwarded header"))?;
        assert!(
            !forwarded.contains("203.0.113.66"),
            "{family}: Forwarded: {forwarded}"
        );
        assert_eq!(
            echo.header_values("x-forwarded-proto"),
            ["http"],
            "{family}"
        );
        assert_eq!(
            echo.header_values("x-forwarded-host"),
            ["hdr.test"],
            "{family}"
        );
        let port = duet.http(family).port().to_string();
        assert_eq!(
            echo.header_values("x-forwarded-port"),
            [port.as_str()],
            "{family}"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_hop_by_hop_headers_are_removed() -> anyhow::Result<()> {
    let (_fleet, _dir, duet) = setup().await?;
    for family in Family::BOTH {
        let mut conn = Conn::http1(duet.http(family)).await?;
        let req = client::request(Method::GET, "hdr.test", "/")
            .header(
                "x-echo-set-header",
                "Connection: X-Resp-Hop, X-Resp-Hop: 1, Keep-Alive: timeout=3, X-End: kept",
            )
            .body(Full::new(Bytes::new()))?;
        let reply = conn.send(req).await?;
        assert_eq!(reply.status, 200, "{}", reply.text());
        assert_eq!(reply.header("x-end"), Some("kept"), "{family}");
        for hop in ["x-resp-hop", "keep-alive"] {
            assert!(
                reply.header(hop).is_none(),
                "{family}: hop-by-hop {hop} in the response"
            );
        }
        if let Some(c) = reply.header("connection") {
            assert!(
                !c.to_ascii_lowercase().contains("x-resp-hop"),
                "{family}: Connection: {c}"
            );
        }
        assert_eq!(reply.header("server"), Some("duet"));
        assert_eq!(conn.get("hdr.test", "/again").await?.status, 200);
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_request_bodies_are_streamed_through() -> anyhow::Result<()> {
    let (_fleet, _dir, duet) = setup().await?;
    let body = Bytes::from(vec![b'x'; 4 * 1024 * 1024]);
    for family in Family::BOTH {
        let mut conn = Conn::http1(duet.http(family)).await?;
        let req =
            client::request(Method::PUT, "hdr.test", "/upload").body(Full::new(body.clone()))?;
        let echo = conn.send(req).await?.echo()?;
        assert_eq!(echo.body_length, body.len() as u64, "{family}");
        assert_eq!(echo.method, "PUT");
    }
    Ok(())
}

/// A GET (or HEAD) whose body has no declared length, the stream of an HTTP/2 client that did
/// not end it with the HEADERS or an HTTP/1.1 `Transfer-Encoding: chunked`, reaches the pod
/// whole, chunked: the upstream client must not read "GET" as "no body" and send
/// `Content-Length: 0` while the client's bytes are still coming (they were dropped, and the pod
/// answered before the request had ended).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_bodies_of_unknown_length_reach_the_pod_whole() -> anyhow::Result<()> {
    use conformance::http_body_util::{BodyExt, StreamBody};
    use hyper::body::Frame;
    use hyper_util::rt::{TokioExecutor, TokioIo};

    let (_fleet, _dir, duet) = setup().await?;
    for family in Family::BOTH {
        for h2 in [false, true] {
            let what = format!("{family} {}", if h2 { "HTTP/2" } else { "HTTP/1.1" });
            let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, std::io::Error>>(2);
            let mut rx = rx;
            let body = StreamBody::new(futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx)));
            let mut req = client::request(Method::GET, "hdr.test", "/streamed").body(body)?;
            let stream = client::connect_tcp(duet.http(family)).await?;
            let response = if h2 {
                let (mut sender, conn) = hyper::client::conn::http2::handshake(
                    TokioExecutor::new(),
                    TokioIo::new(stream),
                )
                .await?;
                tokio::spawn(conn);
                tokio::spawn(async move { sender.send_request(req).await })
            } else {
                req.headers_mut().insert(
                    "transfer-encoding",
                    http::HeaderValue::from_static("chunked"),
                );
                let (mut sender, conn) =
                    hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
                tokio::spawn(conn);
                tokio::spawn(async move { sender.send_request(req).await })
            };
            tx.send(Ok(Frame::data(Bytes::from_static(b"hello"))))
                .await?;
            // The pod answers only once the request has ended: not before the rest is sent.
            tokio::time::sleep(std::time::Duration::from_millis(300)).await;
            assert!(
                !response.is_finished(),
                "{what}: answered before the body ended"
            );
            tx.send(Ok(Frame::data(Bytes::from_static(b" world"))))
                .await?;
            drop(tx);
            let response = response.await??;
            assert_eq!(response.status(), 200, "{what}");
            let bytes = response.into_body().collect().await?.to_bytes();
            let echo: conformance::Echo = serde_json::from_slice(&bytes)?;
            assert_eq!(echo.method, "GET", "{what}");
            assert_eq!(
                echo.body_length, 11,
                "{what}: the whole body reached the pod"
            );
        }
    }
    Ok(())
}
