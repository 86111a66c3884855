//! End to end, over real sockets on 127.0.0.1 and [::1]: what sits in front of duet. PROXY
//! protocol v1 and v2 with IPv4 and IPv6 sources on HTTP and HTTPS listeners (the carried client
//! becomes the client for headers and family choice; garbage closes the connection; peers outside
//! `--proxy-protocol-from` are closed), and trusted proxies whose forwarding headers are appended
//! to.

use std::net::SocketAddr;
use std::time::Duration;

use conformance::client::{self, Conn};
use conformance::tls;
use conformance::{Duet, DuetBuilder, Family, Fleet, Ingress, ManifestDir, PodSpec};
use dataplane::proxy_protocol::{encode_v1, encode_v2};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const DUET: &str = env!("CARGO_BIN_EXE_duet");

async fn setup(args: &[&str]) -> anyhow::Result<(Fleet, ManifestDir, Duet)> {
    let fleet = Fleet::start("edge", "echo", &[PodSpec::dual("dual")])?;
    let dir = ManifestDir::with_class()?;
    dir.write("echo.yaml", &fleet.manifests())?;
    let cert = tls::cert(&["edge.test"]);
    dir.write("secret.yaml", &[tls::secret("edge", "edge-cert", &cert)])?;
    let ingress = Ingress::new("edge", "echo")
        .annotation("duet.dev/ssl-redirect", "false")
        .host("edge.test", "echo")
        .tls(&["edge.test"], "edge-cert");
    dir.write("ingress.yaml", &[ingress.build()])?;
    let duet = DuetBuilder::new(DUET, dir.path())
        .args(args.iter().copied())
        .start()
        .await?;
    Ok((fleet, dir, duet))
}

fn sources() -> [(SocketAddr, SocketAddr); 2] {
    [
        (
            "192.0.2.33:4711".parse().unwrap(),
            "198.51.100.1:443".parse().unwrap(),
        ),
        (
            "[2001:db8::33]:4711".parse().unwrap(),
            "[2001:db8::1]:443".parse().unwrap(),
        ),
    ]
}

fn forwarded_node(addr: SocketAddr) -> String {
    match addr {
        SocketAddr::V4(a) => format!("for=\"{a}\""),
        SocketAddr::V6(a) => format!("for=\"[{}]:{}\"", a.ip(), a.port()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_protocol_carries_the_client_on_both_families() -> anyhow::Result<()> {
    let (_fleet, _dir, duet) = setup(&["--proxy-protocol"]).await?;
    for family in Family::BOTH {
        for (source, destination) in sources() {
            for (version, header) in [
                ("v1", encode_v1(source, destination)),
                ("v2", encode_v2(source, destination)),
            ] {
                let what = format!("{family} listener, {version}, source {source}");
                // Plain HTTP.
                let to = duet.http(family);
                let mut tcp = client::connect_tcp(to).await?;
                tcp.write_all(&header).await?;
                let local = tcp.local_addr()?;
                let mut conn = Conn::over(tcp, local, to, false).await?;
                let reply = conn.get("edge.test", "/").await?;
                client::expect_status(&reply, 200)?;
                let echo = reply.echo()?;
                assert_eq!(
                    echo.header("x-forwarded-for"),
                    Some(source.ip().to_string()),
                    "{what}"
                );
                let forwarded = echo
                    .header("forwarded")
                    .ok_or_else(|| anyhow::anyhow!("{what}: no Forwarded header"))?;
                assert!(
                    forwarded.starts_with(&forwarded_node(source)),
                    "{what}: {forwarded}"
                );
                assert_eq!(echo.header("x-forwarded-port").as_deref(), Some("443"));
                // The carried client's family chooses the pod address (PreferSameFamily).
                assert_eq!(
                    echo.family,
                    Family::of(&source),
                    "{what}: upstream family follows the carried client"
                );
                // HTTPS: the header comes before the TLS handshake.
                let to = duet.https(family);
                let mut tcp = client::connect_tcp(to).await?;
                tcp.write_all(&header).await?;
                let local = tcp.local_addr()?;
                let (stream, hs) =
                    tls::handshake_on(tcp, to, Some("edge.test"), &["h2"], &[]).await?;
                assert_eq!(hs.alpn.as_deref(), Some("h2"));
                let mut conn = Conn::over(stream, local, to, true).await?;
                let reply = conn.get("edge.test", "/").await?;
                client::expect_status(&reply, 200)?;
                let echo = reply.echo()?;
                assert_eq!(
                    echo.header("x-forwarded-for"),
                    Some(source.ip().to_string()),
                    "{what} over TLS"
                );
                assert_eq!(echo.header("x-forwarded-proto").as_deref(), Some("https"));
            }
        }
    }
    Ok(())
}

/// Bytes from hex digits, ignoring spaces and newlines.
fn hex(text: &str) -> Vec<u8> {
    let digits: Vec<u8> = text.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
    digits
        .chunks(2)
        .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).unwrap(), 16).unwrap())
        .collect()
}

/// PROXY v2 headers written from proxy-protocol.txt (the same bytes as the parser's unit tests):
/// the signature, version/command, family, length, addresses of [`sources`], then TLVs as load
/// balancers send them. `None` for LOCAL (a health check: the socket's address stays the client).
fn spec_headers() -> [(&'static str, Vec<u8>, Option<SocketAddr>); 3] {
    const SIG: &str = "0d0a0d0a000d0a515549540a";
    let [(v4, _), (v6, _)] = sources();
    [
        (
            "AWS NLB: TCP4 + ALPN, AUTHORITY, AWS VPCE id, NOOP",
            hex(&format!(
                "{SIG} 21 11 003d  c0000221 c6336401 1267 01bb
                 01 0002 6832
                 02 0009 656467652e74657374
                 ea 0017 01 767063652d3038643262663135666163353030316339
                 04 0003 000000"
            )),
            Some(v4),
        ),
        (
            "GCP: TCP6 + ALPN, PSC connection id, NOOP",
            hex(&format!(
                "{SIG} 21 21 003e
                 20010db8000000000000000000000033 20010db8000000000000000000000001 1267 01bb
                 01 0008 687474702f312e31
                 e0 0008 0000000000002a17
                 04 0001 00"
            )),
            Some(v6),
        ),
        ("LOCAL", hex(&format!("{SIG} 20 00 0000")), None),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_protocol_v2_as_load_balancers_send_it() -> anyhow::Result<()> {
    let (_fleet, _dir, duet) = setup(&["--proxy-protocol"]).await?;
    for family in Family::BOTH {
        for (name, header, carried) in spec_headers() {
            let what = format!("{family} listener, {name}");
            // Plain HTTP: the request right after the header's last TLV byte.
            let to = duet.http(family);
            let mut tcp = client::connect_tcp(to).await?;
            tcp.write_all(&header).await?;
            let local = tcp.local_addr()?;
            let client_ip = carried.unwrap_or(local).ip().to_string();
            let mut conn = Conn::over(tcp, local, to, false).await?;
            let reply = conn.get("edge.test", "/").await?;
            client::expect_status(&reply, 200)?;
            let echo = reply.echo()?;
            assert_eq!(
                echo.header("x-forwarded-for"),
                Some(client_ip.clone()),
                "{what}"
            );
            let forwarded = echo
                .header("forwarded")
                .ok_or_else(|| anyhow::anyhow!("{what}: no Forwarded header"))?;
            assert!(
                forwarded.starts_with(&forwarded_node(carried.unwrap_or(local))),
                "{what}: {forwarded}"
            );
            // HTTPS: the TLS handshake starts right after the TLVs.
            let to = duet.https(family);
            let mut tcp = client::connect_tcp(to).await?;
            tcp.write_all(&header).await?;
            let local = tcp.local_addr()?;
            let client_ip = carried.unwrap_or(local).ip().to_string();
            let (stream, _) = tls::handshake_on(tcp, to, Some("edge.test"), &[], &[]).await?;
            let mut conn = Conn::over(stream, local, to, true).await?;
            let reply = conn.get("edge.test", "/").await?;
            client::expect_status(&reply, 200)?;
            let echo = reply.echo()?;
            assert_eq!(
                echo.header("x-forwarded-for"),
                Some(client_ip),
                "{what} over TLS"
            );
        }
    }
    duet_still_runs(duet)
}

/// Sends bytes and reads until the server closes; returns what came back.
async fn send_and_drain(to: SocketAddr, bytes: &[u8]) -> anyhow::Result<Vec<u8>> {
    let mut tcp = client::connect_tcp(to).await?;
    tcp.write_all(bytes).await?;
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), tcp.read_to_end(&mut out))
        .await
        .map_err(|_| anyhow::anyhow!("{to}: connection not closed"))?
        .ok();
    Ok(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_proxy_headers_close_the_connection() -> anyhow::Result<()> {
    let (_fleet, _dir, duet) = setup(&["--proxy-protocol=http"]).await?;
    let mut v2_bad_version = encode_v2(sources()[1].0, sources()[1].1);
    v2_bad_version[12] = 0x31;
    for family in Family::BOTH {
        let to = duet.http(family);
        for garbage in [
            &b"GET / HTTP/1.1\r\nHost: edge.test\r\n\r\n"[..],
            b"PROXY TCP4 1.2.3.4 ::1 1 2\r\nGET / HTTP/1.1\r\nHost: edge.test\r\n\r\n",
            b"PROXY TCP6 2001:db8::1 2001:db8::2 99999 1\r\nGET / HTTP/1.1\r\n\r\n",
            &v2_bad_version,
            &[0xffu8; 300],
        ] {
            let answer = send_and_drain(to, garbage).await?;
            assert!(
                answer.is_empty(),
                "{family}: {:?}",
                String::from_utf8_lossy(&answer)
            );
        }
        // Still serving, with a good header; and the HTTPS listener needs none.
        let mut good = encode_v1(sources()[0].0, sources()[0].1);
        good.extend_from_slice(b"GET / HTTP/1.1\r\nHost: edge.test\r\nConnection: close\r\n\r\n");
        let answer = send_and_drain(to, &good).await?;
        assert!(answer.starts_with(b"HTTP/1.1 200"), "{family}");
        let (mut conn, _) = Conn::https(duet.https(family), Some("edge.test"), &[]).await?;
        client::expect_status(&conn.get("edge.test", "/").await?, 200)?;
    }
    duet_still_runs(duet)
}

fn duet_still_runs(mut duet: Duet) -> anyhow::Result<()> {
    duet.check_running()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trusted_proxies_are_appended_to_and_others_replaced() -> anyhow::Result<()> {
    // 127.0.0.1 is trusted, ::1 is not; then the other way round.
    for (trusted, trusted_family) in [("127.0.0.1/32", Family::V4), ("::1/128", Family::V6)] {
        let (_fleet, _dir, duet) = setup(&["--trusted-proxies", trusted]).await?;
        for family in Family::BOTH {
            let mut conn = Conn::http1(duet.http(family)).await?;
            let ip = conn.local_addr().ip().to_string();
            let req = client::request(conformance::http::Method::GET, "edge.test", "/")
                .header("x-forwarded-for", "203.0.113.9")
                .header("forwarded", "for=203.0.113.9;proto=https")
                .header("x-forwarded-proto", "https")
                .body(conformance::http_body_util::Full::new(
                    conformance::bytes::Bytes::new(),
                ))?;
            let echo = conn.send(req).await?.echo()?;
            let xff = echo.header("x-forwarded-for").unwrap_or_default();
            let forwarded = echo
                .header("forwarded")
                .ok_or_else(|| anyhow::anyhow!("{family}: no Forwarded header"))?;
            let proto = echo.header("x-forwarded-proto").unwrap_or_default();
            if family == trusted_family {
                assert_eq!(xff, format!("203.0.113.9, {ip}"), "{family} trusted");
                assert!(
                    forwarded.starts_with("for=203.0.113.9;proto=https, for=\""),
                    "{family} trusted: {forwarded}"
                );
                assert_eq!(proto, "https", "{family} trusted keeps the proto");
            } else {
                assert_eq!(xff, ip, "{family} untrusted");
                assert!(!forwarded.contains("203.0.113.9"), "{forwarded}");
                assert_eq!(
                    forwarded,
                    format!(
                        "{};host=edge.test;proto=http",
                        forwarded_node(conn.local_addr())
                    ),
                    "{family} untrusted: duet's own element only"
                );
                assert_eq!(proto, "http", "{family} untrusted");
            }
            assert_eq!(echo.header("x-real-ip"), Some(ip));
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_protocol_is_accepted_only_from_allowed_peers_of_both_families() -> anyhow::Result<()>
{
    // 127.0.0.1 may send PROXY headers and ::1 may not; then the other way round.
    for (allowed, allowed_family) in [("127.0.0.1/32", Family::V4), ("::1/128", Family::V6)] {
        let (_fleet, _dir, duet) = setup(&[
            "--proxy-protocol=http",
            "--proxy-protocol-from",
            &format!("192.0.2.0/24,{allowed}"),
        ])
        .await?;
        let (source, destination) = sources()[1];
        for family in Family::BOTH {
            let mut request = encode_v2(source, destination);
            request.extend_from_slice(
                b"GET / HTTP/1.1\r\nHost: edge.test\r\nConnection: close\r\n\r\n",
            );
            let answer = send_and_drain(duet.http(family), &request).await?;
            let text = String::from_utf8_lossy(&answer);
            if family == allowed_family {
                assert!(text.starts_with("HTTP/1.1 200"), "{family} allowed: {text}");
                assert!(
                    text.contains("2001:db8::33"),
                    "{family}: carried client: {text}"
                );
            } else {
                assert!(answer.is_empty(), "{family} not allowed: {text}");
            }
        }
        let logs = duet.logs();
        assert!(!logs.contains("accepted from any peer"), "{logs}");
        duet_still_runs(duet)?;
    }
    // Without the flag any peer may, with a warning at start.
    let (_fleet, _dir, duet) = setup(&["--proxy-protocol=http"]).await?;
    assert!(
        duet.logs().contains("accepted from any peer"),
        "{}",
        duet.logs()
    );
    Ok(())
}
