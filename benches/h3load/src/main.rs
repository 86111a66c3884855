//! `h3load`: an HTTP/3 load generator for `benches/load/` (instructions.sh, h2-bench.sh), the
//! HTTP/3 counterpart of `h2load -c C -m M -n N` (or `-D SECONDS`).
//!
//! ```text
//! h3load -c 20 -m 10 -n 20000 --sni bench.example https://[::1]:8443/
//! ```
//!
//! `-c` QUIC connections, each from its own UDP socket of the URL address's family, with `-m`
//! requests in flight at once (one per stream), until `-n` GET requests were sent in all (or
//! for `-D` seconds), each response read to its end. The URL's host is an IP address (or a
//! name, its first address used); `--sni` is the TLS server name and, unless `--authority` says
//! otherwise, the requests' `:authority`. The server's certificate is not verified (the
//! benches' self-signed one). Prints the requests done, the 2xx among them, the failures, the
//! time from the first handshake to the last response and requests per second; exits 1 if
//! fewer than `-n` requests got a 2xx (with `-D`: if any failed or was not 2xx), 64 on a bad
//! flag.
//!
//! Why our own: Debian's h2load (nghttp2 1.52) is built without HTTP/3 (no ngtcp2), Debian has
//! no other HTTP/3 load generator, and the one on crates.io with HTTP/3 (oha's `http3` feature,
//! experimental) builds quinn over aws-lc-rs, a C toolchain build the workspace keeps out. This
//! is quinn and h3 as the workspace already builds them (ring), a few hundred lines.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use bytes::{Buf, Bytes};
use clap::Parser;
use quinn::crypto::rustls::QuicClientConfig;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};

/// HTTP/3 load: N GET requests over C QUIC connections of M concurrent streams each.
#[derive(Debug, Parser)]
#[command(name = "h3load")]
struct Args {
    /// Requests in all.
    #[arg(short = 'n', long, default_value_t = 1)]
    requests: usize,
    /// Send requests for this many seconds instead of -n (answers still in flight then count).
    #[arg(short = 'D', long)]
    duration: Option<f64>,
    /// QUIC connections.
    #[arg(short = 'c', long, default_value_t = 1)]
    clients: usize,
    /// Requests in flight at once per connection (streams).
    #[arg(short = 'm', long = "max-concurrent-streams", default_value_t = 1)]
    streams: usize,
    /// Tokio worker threads of the client.
    #[arg(short = 't', long, default_value_t = 1)]
    threads: usize,
    /// TLS server name (SNI), and the requests' :authority unless --authority.
    #[arg(long)]
    sni: Option<String>,
    /// The requests' :authority (default: --sni, else the URL's).
    #[arg(long, alias = "host")]
    authority: Option<String>,
    /// https://HOST:PORT/PATH
    url: http::Uri,
}

/// Where to connect and what to ask.
#[derive(Debug)]
struct Target {
    addr: SocketAddr,
    server_name: String,
    uri: http::Uri,
}

impl Target {
    fn of(args: &Args) -> anyhow::Result<Target> {
        let url = &args.url;
        if url.scheme_str() != Some("https") {
            bail!("{url}: only https:// URLs (HTTP/3 is over QUIC with TLS)");
        }
        let authority = url.authority().context("the URL has no host")?;
        let host = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']');
        let port = authority.port_u16().unwrap_or(443);
        let addr = match host.parse::<IpAddr>() {
            Ok(ip) => SocketAddr::new(ip, port),
            Err(_) => (host, port)
                .to_socket_addrs()?
                .next()
                .with_context(|| format!("{host}: no address"))?,
        };
        let server_name = args
            .sni
            .clone()
            .or_else(|| args.authority.clone())
            .unwrap_or_else(|| host.to_owned());
        let request_authority = args
            .authority
            .clone()
            .or_else(|| args.sni.clone())
            .unwrap_or_else(|| authority.to_string());
        let path = url.path_and_query().map_or("/", |p| p.as_str());
        let uri = format!("https://{request_authority}{path}").parse()?;
        Ok(Target {
            addr,
            server_name,
            uri,
        })
    }
}

/// Accepts any server certificate (the bench's is self-signed), checking only that the
/// handshake's signatures are made with its key.
#[derive(Debug)]
struct AnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let algorithms = &self.0.signature_verification_algorithms;
        rustls::crypto::verify_tls12_signature(message, cert, dss, algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let algorithms = &self.0.signature_verification_algorithms;
        rustls::crypto::verify_tls13_signature(message, cert, dss, algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// QUIC client configuration: TLS 1.3 with ring, ALPN `h3`, no certificate verification, and
/// the cipher suites in h2load's order (AES-128-GCM with SHA-256 first, where rustls puts
/// AES-256-GCM with SHA-384 first), so that HTTP/3 and HTTP/2 runs pay for the same suite.
fn client_config() -> anyhow::Result<quinn::ClientConfig> {
    let mut provider = rustls::crypto::ring::default_provider();
    provider.cipher_suites.sort_by_key(|suite| {
        let order = [
            rustls::CipherSuite::TLS13_AES_128_GCM_SHA256,
            rustls::CipherSuite::TLS13_AES_256_GCM_SHA384,
            rustls::CipherSuite::TLS13_CHACHA20_POLY1305_SHA256,
        ];
        order
            .iter()
            .position(|s| *s == suite.suite())
            .unwrap_or(order.len())
    });
    let provider = Arc::new(provider);
    let mut tls = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
        .with_no_client_auth();
    tls.alpn_protocols = vec![b"h3".to_vec()];
    Ok(quinn::ClientConfig::new(Arc::new(
        QuicClientConfig::try_from(tls)?,
    )))
}

/// What the run counted, shared by every stream.
#[derive(Debug)]
struct Tally {
    start: Instant,
    /// Nanoseconds from `start` to the end of the last response read.
    last: AtomicU64,
    /// Requests claimed so far (a stream claims one before sending it).
    claimed: AtomicUsize,
    /// Responses read to their end.
    done: AtomicUsize,
    ok: AtomicUsize,
    failed: AtomicUsize,
    first_error: Mutex<Option<String>>,
}

impl Tally {
    fn new() -> Tally {
        Tally {
            start: Instant::now(),
            last: AtomicU64::new(0),
            claimed: AtomicUsize::new(0),
            done: AtomicUsize::new(0),
            ok: AtomicUsize::new(0),
            failed: AtomicUsize::new(0),
            first_error: Mutex::new(None),
        }
    }

    /// Time from the start to the last response (closing the connections left out).
    fn elapsed(&self) -> Duration {
        Duration::from_nanos(self.last.load(Ordering::Relaxed))
    }

    fn fail(&self, error: impl std::fmt::Display) {
        self.failed.fetch_add(1, Ordering::Relaxed);
        let mut first = self.first_error.lock().unwrap_or_else(|e| e.into_inner());
        first.get_or_insert_with(|| error.to_string());
    }
}

type SendRequest = h3::client::SendRequest<h3_quinn::OpenStreams, Bytes>;

/// One GET, its response read to the end; the status.
async fn request(send: &mut SendRequest, uri: &http::Uri) -> anyhow::Result<http::StatusCode> {
    let req = http::Request::get(uri.clone()).body(())?;
    let mut stream = send.send_request(req).await?;
    stream.finish().await?;
    let response = stream.recv_response().await?;
    while let Some(mut chunk) = stream.recv_data().await? {
        chunk.advance(chunk.remaining());
    }
    Ok(response.status())
}

/// How much load: a number of requests, or requests until a deadline.
#[derive(Clone, Copy, Debug)]
enum Budget {
    Requests(usize),
    Until(Instant),
}

impl Budget {
    /// Whether one more request may be sent (claiming it).
    fn claim(self, tally: &Tally) -> bool {
        match self {
            Budget::Requests(n) => tally.claimed.fetch_add(1, Ordering::Relaxed) < n,
            Budget::Until(deadline) => Instant::now() < deadline,
        }
    }
}

/// One stream's loop: sends requests one after the other while the budget allows; stops at its
/// first error (the connection is likely gone).
async fn stream_loop(
    mut send: SendRequest,
    uri: Arc<http::Uri>,
    budget: Budget,
    tally: Arc<Tally>,
) {
    while budget.claim(&tally) {
        match request(&mut send, &uri).await {
            Ok(status) => {
                tally.done.fetch_add(1, Ordering::Relaxed);
                let now = u64::try_from(tally.start.elapsed().as_nanos()).unwrap_or(u64::MAX);
                tally.last.fetch_max(now, Ordering::Relaxed);
                if status.is_success() {
                    tally.ok.fetch_add(1, Ordering::Relaxed);
                }
            }
            Err(error) => {
                tally.fail(format!("request: {error:#}"));
                return;
            }
        }
    }
}

/// One connection: its handshake, `m` streams in a loop, then a clean close.
async fn connection(
    target: Arc<Target>,
    config: quinn::ClientConfig,
    m: usize,
    budget: Budget,
    tally: Arc<Tally>,
) -> anyhow::Result<()> {
    let local: IpAddr = match target.addr {
        SocketAddr::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
        SocketAddr::V6(_) => Ipv6Addr::UNSPECIFIED.into(),
    };
    let mut endpoint = quinn::Endpoint::client(SocketAddr::new(local, 0))?;
    endpoint.set_default_client_config(config);
    let conn = endpoint
        .connect(target.addr, &target.server_name)?
        .await
        .with_context(|| format!("QUIC handshake with {}", target.addr))?;
    let (mut driver, send) = h3::client::new(h3_quinn::Connection::new(conn.clone())).await?;
    let drive = tokio::spawn(async move {
        let _ = std::future::poll_fn(|cx| driver.poll_close(cx)).await;
    });
    let uri = Arc::new(target.uri.clone());
    let streams: Vec<_> = (0..m)
        .map(|_| {
            tokio::spawn(stream_loop(
                send.clone(),
                uri.clone(),
                budget,
                tally.clone(),
            ))
        })
        .collect();
    drop(send);
    for stream in streams {
        stream.await?;
    }
    conn.close(0u32.into(), b"done");
    drive.abort();
    let _ = tokio::time::timeout(Duration::from_secs(1), endpoint.wait_idle()).await;
    Ok(())
}

/// Runs the load; the time from the first handshake to the last response.
async fn run(args: &Args, tally: &Arc<Tally>) -> anyhow::Result<Duration> {
    let target = Arc::new(Target::of(args)?);
    let config = client_config()?;
    let start = tally.start;
    let budget = match args.duration {
        Some(seconds) => Budget::Until(start + Duration::from_secs_f64(seconds)),
        None => Budget::Requests(args.requests),
    };
    let connections: Vec<_> = (0..args.clients)
        .map(|_| {
            let (target, config, tally) = (target.clone(), config.clone(), tally.clone());
            let m = args.streams;
            tokio::spawn(async move {
                if let Err(error) = connection(target, config, m, budget, tally.clone()).await {
                    tally.fail(format!("{error:#}"));
                }
            })
        })
        .collect();
    for connection in connections {
        connection.await?;
    }
    Ok(tally.elapsed())
}

fn main() -> ExitCode {
    let args = match Args::try_parse() {
        Ok(args) => args,
        Err(error) => {
            let _ = error.print();
            return if error.use_stderr() {
                ExitCode::from(64)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    if args.clients == 0 || args.streams == 0 {
        eprintln!("h3load: -c and -m must be at least 1");
        return ExitCode::from(64);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.threads.max(1))
        .enable_all()
        .build()
        .expect("a Tokio runtime");
    let tally = Arc::new(Tally::new());
    let elapsed = match runtime.block_on(run(&args, &tally)) {
        Ok(elapsed) => elapsed,
        Err(error) => {
            eprintln!("h3load: {error:#}");
            return ExitCode::FAILURE;
        }
    };
    let (done, ok) = (
        tally.done.load(Ordering::Relaxed),
        tally.ok.load(Ordering::Relaxed),
    );
    let failed = tally.failed.load(Ordering::Relaxed);
    let secs = elapsed.as_secs_f64();
    println!("requests: {done} done, {ok} 2xx, {failed} failed");
    println!("elapsed: {secs:.3} s, {:.1} req/s", done as f64 / secs);
    if let Some(error) = tally
        .first_error
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take()
    {
        eprintln!("h3load: first error: {error}");
    }
    let wanted = if args.duration.is_some() {
        done.max(1)
    } else {
        args.requests
    };
    if ok < wanted || failed > 0 {
        eprintln!("h3load: {ok} of {wanted} requests got a 2xx, {failed} failed");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
