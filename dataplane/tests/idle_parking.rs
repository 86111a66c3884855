//! Idle HTTP/1.1 client connections are parked (their HTTP server state and buffers released,
//! counted in `duet_connections_parked`) and serve their next requests as before, plain and over
//! TLS (where the TLS session stays); shutdown closes them. Over real sockets on 127.0.0.1 and
//! [::1], a listener served by `listen::serve` with a handler that answers with the scheme, the
//! request's target and the client address; TLS with a rustls configuration (ALPN `http/1.1`)
//! and a rustls client.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use dataplane::forwarded::TrustedProxies;
use dataplane::idle::PARK_AFTER;
use dataplane::listen::{self, ConnInfo, ServeOptions};
use dataplane::metrics::Metrics;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response};
use prometheus_client::registry::Registry;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio_rustls::client::TlsStream;

const KEEPALIVE: Duration = Duration::from_millis(4000);

/// A listener on `addr` answering every request with `scheme target client-address`, its
/// metrics, and (TLS) a client trusting its certificate.
struct Server {
    addr: SocketAddr,
    registry: Registry,
    stop: watch::Sender<bool>,
    served: tokio::task::JoinHandle<std::io::Result<()>>,
    client: Option<tokio_rustls::TlsConnector>,
}

async fn answer(
    req: Request<Incoming>,
    conn: Arc<ConnInfo>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let text = format!("{} {} {}", conn.scheme(), req.uri(), conn.peer);
    Ok(Response::new(Full::new(Bytes::from(text))))
}

/// A self-signed certificate for `park.test`: the server's configuration (ALPN `h2` and
/// `http/1.1`, as duet's) and a client trusting it (ALPN `http/1.1`).
fn tls_pair() -> (Arc<rustls::ServerConfig>, tokio_rustls::TlsConnector) {
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["park.test".to_owned()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let der = CertificateDer::from(cert.der().to_vec());
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut server = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![der.clone()],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )
        .unwrap();
    server.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let mut roots = rustls::RootCertStore::empty();
    roots.add(der).unwrap();
    let mut client = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    client.alpn_protocols = vec![b"http/1.1".to_vec()];
    (
        Arc::new(server),
        tokio_rustls::TlsConnector::from(Arc::new(client)),
    )
}

/// A plain listener.
fn server(ip: &str) -> Server {
    serve(ip, None)
}

/// A TLS listener for `park.test`.
fn tls_server(ip: &str) -> Server {
    let (config, client) = tls_pair();
    serve(ip, Some((config, client)))
}

fn serve(ip: &str, tls: Option<(Arc<rustls::ServerConfig>, tokio_rustls::TlsConnector)>) -> Server {
    let (tls, client) = tls.unzip();
    let listener = listen::bind(SocketAddr::new(ip.parse().unwrap(), 0)).unwrap();
    let addr = listener.local_addr().unwrap();
    let mut registry = Registry::default();
    let metrics = Metrics::register(&mut registry);
    let options = ServeOptions {
        header_read_timeout: Duration::from_secs(60),
        keepalive_timeout: KEEPALIVE,
        drain_timeout: Duration::from_secs(5),
        tls,
        proxy_protocol: None,
        trusted_proxies: Arc::new(TrustedProxies::default()),
        connections: Some(metrics.listener(addr)),
        proxy_protocol_from: None,
        max_connections: None,
        handshakes: None,
        gateway_port: None,
        forwarded_port: None,
    };
    let (stop, stopped) = watch::channel(false);
    let served = tokio::spawn(listen::serve(listener, options, answer, stopped));
    Server {
        addr,
        registry,
        stop,
        served,
        client,
    }
}

impl Server {
    /// A TLS connection to the listener (a TLS server), and the client's address.
    async fn connect_tls(&self) -> (TlsStream<TcpStream>, SocketAddr) {
        let tcp = TcpStream::connect(self.addr).await.unwrap();
        let me = tcp.local_addr().unwrap();
        let name = ServerName::try_from("park.test").unwrap();
        let client = self.client.as_ref().expect("a TLS server");
        (client.connect(name, tcp).await.unwrap(), me)
    }

    /// `duet_connections_parked` of this listener and the family of its address.
    fn parked(&self) -> u64 {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry).unwrap();
        let family = if self.addr.is_ipv4() { "ipv4" } else { "ipv6" };
        let series = format!(
            "duet_connections_parked{{listener=\"{}\",family=\"{family}\"}} ",
            self.addr
        );
        text.lines()
            .find_map(|line| line.strip_prefix(&series))
            .unwrap_or_else(|| panic!("no {series} in {text}"))
            .parse()
            .unwrap()
    }

    /// Waits until `duet_connections_parked` is `n` (at most 10 s).
    async fn until_parked(&self, n: u64) {
        let start = Instant::now();
        while self.parked() != n {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "{}: {} parked, not {n}",
                self.addr,
                self.parked()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Reads one response (head and `Content-Length` body): its status line and body.
async fn response<S: AsyncRead + Unpin>(tcp: &mut S) -> (String, String) {
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        head.push(tcp.read_u8().await.expect("response head"));
    }
    let head = String::from_utf8(head).unwrap();
    let length: usize = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length: ")
                .map(str::to_owned)
        })
        .map_or(0, |l| l.trim().parse().unwrap());
    let mut body = vec![0; length];
    tcp.read_exact(&mut body).await.unwrap();
    let status = head.lines().next().unwrap().to_owned();
    (status, String::from_utf8(body).unwrap())
}

async fn send<S: AsyncWrite + Unpin>(stream: &mut S, bytes: &[u8]) {
    stream.write_all(bytes).await.unwrap();
    stream.flush().await.unwrap();
}

async fn get<S: AsyncRead + AsyncWrite + Unpin>(stream: &mut S, target: &str) -> (String, String) {
    let request = format!("GET {target} HTTP/1.1\r\nHost: park.test\r\n\r\n");
    send(stream, request.as_bytes()).await;
    response(stream).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_http1_connections_park_and_serve_their_next_requests() {
    for ip in ["127.0.0.1", "::1"] {
        let server = server(ip);
        let mut tcp = TcpStream::connect(server.addr).await.unwrap();
        let me = tcp.local_addr().unwrap();
        assert_eq!(
            get(&mut tcp, "/one").await,
            ("HTTP/1.1 200 OK".into(), format!("http /one {me}"))
        );
        assert_eq!(server.parked(), 0, "{ip}: parked at once");
        server.until_parked(1).await;
        // The next request on the parked connection, then two pipelined in one write.
        assert_eq!(get(&mut tcp, "/two").await.1, format!("http /two {me}"));
        assert_eq!(server.parked(), 0, "{ip}: still counted as parked");
        server.until_parked(1).await;
        tcp.write_all(
            b"GET /three HTTP/1.1\r\nHost: p\r\n\r\nGET /four HTTP/1.1\r\nHost: p\r\n\r\n",
        )
        .await
        .unwrap();
        assert_eq!(response(&mut tcp).await.1, format!("http /three {me}"));
        assert_eq!(response(&mut tcp).await.1, format!("http /four {me}"));
        // A head that arrives in pieces across the park time.
        server.until_parked(1).await;
        tcp.write_all(b"GET /fi").await.unwrap();
        tokio::time::sleep(PARK_AFTER * 2).await;
        tcp.write_all(b"ve HTTP/1.1\r\nHost: p\r\n\r\n")
            .await
            .unwrap();
        assert_eq!(response(&mut tcp).await.1, format!("http /five {me}"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_connection_refuses_a_64_kib_head_as_a_fresh_one_does() {
    for ip in ["127.0.0.1", "::1"] {
        let server = server(ip);
        let big = format!(
            "GET / HTTP/1.1\r\nHost: park.test\r\nX-Big: {}\r\n\r\n",
            "a".repeat(64 * 1024)
        );
        let mut fresh = TcpStream::connect(server.addr).await.unwrap();
        fresh.write_all(big.as_bytes()).await.unwrap();
        let refused = response(&mut fresh).await.0;
        assert!(refused.starts_with("HTTP/1.1 431"), "{ip}: {refused}");
        let mut tcp = TcpStream::connect(server.addr).await.unwrap();
        get(&mut tcp, "/").await;
        server.until_parked(1).await;
        tcp.write_all(big.as_bytes()).await.unwrap();
        assert_eq!(response(&mut tcp).await.0, refused, "{ip}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_connection_is_closed_after_the_keepalive_timeout_and_on_shutdown() {
    for ip in ["127.0.0.1", "::1"] {
        let server = server(ip);
        let mut idle = TcpStream::connect(server.addr).await.unwrap();
        get(&mut idle, "/").await;
        let since = Instant::now();
        server.until_parked(1).await;
        let mut rest = Vec::new();
        tokio::time::timeout(KEEPALIVE * 4, idle.read_to_end(&mut rest))
            .await
            .unwrap_or_else(|_| panic!("{ip}: parked connection not closed"))
            .unwrap();
        let after = since.elapsed();
        assert!(
            after >= KEEPALIVE - Duration::from_millis(100),
            "{ip}: closed after {after:?}"
        );
        assert!(rest.is_empty());
        assert_eq!(server.parked(), 0);

        let mut drained = TcpStream::connect(server.addr).await.unwrap();
        get(&mut drained, "/").await;
        server.until_parked(1).await;
        server.stop.send_replace(true);
        tokio::time::timeout(Duration::from_secs(4), drained.read_to_end(&mut rest))
            .await
            .unwrap_or_else(|_| panic!("{ip}: parked connection not closed on shutdown"))
            .unwrap();
        let served = tokio::time::timeout(Duration::from_secs(4), server.served).await;
        served.expect("listener did not finish").unwrap().unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_after_a_request_with_a_body_is_not_parked() {
    for ip in ["127.0.0.1", "::1"] {
        let server = server(ip);
        let mut tcp = TcpStream::connect(server.addr).await.unwrap();
        tcp.write_all(b"POST /form HTTP/1.1\r\nHost: p\r\nContent-Length: 3\r\n\r\nabc")
            .await
            .unwrap();
        assert_eq!(
            response(&mut tcp).await.1,
            format!("http /form {}", tcp.local_addr().unwrap())
        );
        tokio::time::sleep(PARK_AFTER * 3).await;
        assert_eq!(server.parked(), 0, "{ip}");
        assert!(get(&mut tcp, "/").await.0.starts_with("HTTP/1.1 200"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_tls_connections_park_and_serve_their_next_requests() {
    for ip in ["127.0.0.1", "::1"] {
        let server = tls_server(ip);
        let (mut tls, me) = server.connect_tls().await;
        assert_eq!(
            get(&mut tls, "/one").await,
            ("HTTP/1.1 200 OK".into(), format!("https /one {me}"))
        );
        server.until_parked(1).await;
        // The next request on the parked connection, then two pipelined in one TLS record.
        assert_eq!(get(&mut tls, "/two").await.1, format!("https /two {me}"));
        assert_eq!(server.parked(), 0, "{ip}: still counted as parked");
        server.until_parked(1).await;
        send(
            &mut tls,
            b"GET /three HTTP/1.1\r\nHost: p\r\n\r\nGET /four HTTP/1.1\r\nHost: p\r\n\r\n",
        )
        .await;
        assert_eq!(response(&mut tls).await.1, format!("https /three {me}"));
        assert_eq!(response(&mut tls).await.1, format!("https /four {me}"));
        // A head that arrives in two TLS records across the park time.
        server.until_parked(1).await;
        send(&mut tls, b"GET /fi").await;
        tokio::time::sleep(PARK_AFTER * 2).await;
        send(&mut tls, b"ve HTTP/1.1\r\nHost: p\r\n\r\n").await;
        assert_eq!(response(&mut tls).await.1, format!("https /five {me}"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parked_tls_connections_are_closed_on_shutdown() {
    for ip in ["127.0.0.1", "::1"] {
        let server = tls_server(ip);
        let (mut first, _) = server.connect_tls().await;
        let (mut second, _) = server.connect_tls().await;
        get(&mut first, "/").await;
        get(&mut second, "/").await;
        server.until_parked(2).await;
        server.stop.send_replace(true);
        for tls in [&mut first, &mut second] {
            let mut rest = Vec::new();
            // The server ends the session (close_notify, or the TCP end rustls reports as an
            // error without one); either way nothing more is sent and the stream ends.
            let ended = tokio::time::timeout(Duration::from_secs(4), tls.read_to_end(&mut rest))
                .await
                .unwrap_or_else(|_| panic!("{ip}: parked TLS connection not closed on shutdown"));
            assert!(rest.is_empty(), "{ip}: {ended:?} {rest:?}");
        }
        let served = tokio::time::timeout(Duration::from_secs(4), server.served).await;
        served.expect("listener did not finish").unwrap().unwrap();
    }
}
