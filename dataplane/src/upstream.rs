//! Upstream protocols other than plain HTTP/1.1: the TLS client settings of a route
//! ([`UpstreamTls`], built once per Ingress and Service when the snapshot is translated), TLS
//! connections for HTTP/1.1 over TLS, and one multiplexed HTTP/2 connection per upstream address
//! (cleartext prior knowledge or TLS with ALPN `h2`), reconnected when it closes.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use futures_util::future::{BoxFuture, FutureExt, Shared};
use http::header::{self, HeaderMap, HeaderValue};
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{Request, Response, Uri, Version};
use hyper::body::Incoming;
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, RootCertStore, SignatureScheme};
use serde::{Serialize, Serializer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use crate::clock::deadline;
use crate::proxy::{ProxyError, Replay, SendError, UpstreamBody};

/// What an upstream certificate is verified against.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum UpstreamTrust {
    /// The PEM certificates of a CA bundle (`ca.crt` of a Secret).
    Ca {
        /// Where the bundle came from (`namespace/name`), for logs and `/debug/routes`.
        source: Arc<str>,
        /// The PEM text.
        pem: Vec<u8>,
    },
    /// The system trust roots (the CA bundle of the machine or image duet runs on).
    SystemRoots,
    /// No verification at all (`duet.dev/backend-tls-skip-verify: "true"`).
    SkipVerify,
}

impl UpstreamTrust {
    fn label(&self) -> String {
        match self {
            UpstreamTrust::Ca { source, .. } => format!("secret {source}"),
            UpstreamTrust::SystemRoots => "system roots".to_owned(),
            UpstreamTrust::SkipVerify => "none (skip verify)".to_owned(),
        }
    }
}

/// Why TLS settings for an upstream could not be built.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamTlsError {
    /// The server name is neither a DNS name nor an IP address.
    #[error("invalid TLS server name {0:?}")]
    ServerName(String),
    /// The CA bundle holds no certificate rustls accepts.
    #[error("no usable CA certificate in {source_name}: {reason}")]
    Ca {
        /// The Secret.
        source_name: Arc<str>,
        /// What went wrong.
        reason: String,
    },
    /// rustls refused the configuration.
    #[error("TLS configuration: {0}")]
    Config(#[from] rustls::Error),
}

/// How duet speaks TLS to the targets of one route: the server name sent as SNI and checked in
/// the certificate, the trust, and the ready rustls client configuration (ALPN `h2` or
/// `http/1.1`). Immutable and shared by every request of the route; built when the snapshot is
/// translated, never per request. A route whose settings could not be built (a missing or invalid
/// CA Secret) carries the reason instead of a configuration and answers 502.
#[derive(Clone, Debug)]
pub struct UpstreamTls {
    server_name: ServerName<'static>,
    name: Arc<str>,
    trust: Arc<str>,
    config: Result<Arc<rustls::ClientConfig>, Arc<str>>,
    /// Distinguishes pooled connections of different settings to the same address (never 0).
    key: u64,
}

impl UpstreamTls {
    /// Builds the settings: `server_name` (DNS name or IP address) is sent as SNI and checked in
    /// the certificate, whatever address the target is reached at; `h2` offers ALPN `h2` (else
    /// `http/1.1`).
    pub fn new(
        server_name: &str,
        trust: &UpstreamTrust,
        h2: bool,
    ) -> Result<UpstreamTls, UpstreamTlsError> {
        let name = ServerName::try_from(server_name.to_owned())
            .map_err(|_| UpstreamTlsError::ServerName(server_name.to_owned()))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?;
        let mut config = match trust {
            UpstreamTrust::SkipVerify => builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(NoVerify(provider)))
                .with_no_client_auth(),
            UpstreamTrust::SystemRoots => builder
                .with_root_certificates(system_roots())
                .with_no_client_auth(),
            UpstreamTrust::Ca { source, pem } => {
                let roots = ca_roots(pem).map_err(|reason| UpstreamTlsError::Ca {
                    source_name: source.clone(),
                    reason,
                })?;
                builder.with_root_certificates(roots).with_no_client_auth()
            }
        };
        config.alpn_protocols = vec![if h2 {
            b"h2".to_vec()
        } else {
            b"http/1.1".to_vec()
        }];
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        (server_name, trust, h2).hash(&mut hasher);
        Ok(UpstreamTls {
            server_name: name,
            name: server_name.into(),
            trust: trust.label().into(),
            config: Ok(Arc::new(config)),
            key: hasher.finish() | 1,
        })
    }

    /// Settings that cannot be used: requests of the route answer 502 and log `reason`.
    pub fn unusable(server_name: &str, trust: &UpstreamTrust, reason: &str) -> UpstreamTls {
        UpstreamTls {
            server_name: ServerName::try_from("invalid.invalid")
                .expect("a valid DNS name")
                .to_owned(),
            name: server_name.into(),
            trust: trust.label().into(),
            config: Err(reason.into()),
            key: 1,
        }
    }

    /// The server name sent as SNI and verified.
    pub fn server_name(&self) -> &str {
        &self.name
    }

    /// Why the settings are unusable, if they are.
    pub fn error(&self) -> Option<&str> {
        self.config.as_ref().err().map(|e| &**e)
    }

    /// The pool key of these settings (0 is plain TCP).
    pub(crate) fn key(&self) -> u64 {
        self.key
    }

    /// Completes a TLS handshake on a connected socket; with `h2`, fails unless the server chose
    /// ALPN `h2`.
    pub(crate) async fn handshake(
        &self,
        tcp: TcpStream,
        h2: bool,
    ) -> io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
        let config = self
            .config
            .as_ref()
            .map_err(|reason| io::Error::other(reason.to_string()))?;
        let connector = tokio_rustls::TlsConnector::from(config.clone());
        let stream = connector.connect(self.server_name.clone(), tcp).await?;
        if h2 && stream.get_ref().1.alpn_protocol() != Some(b"h2") {
            return Err(io::Error::other("the upstream did not choose ALPN h2"));
        }
        Ok(stream)
    }
}

impl PartialEq for UpstreamTls {
    /// Same server name, trust and ALPN (the key hashes them), and the same usability.
    fn eq(&self, other: &UpstreamTls) -> bool {
        self.key == other.key && self.name == other.name && self.error() == other.error()
    }
}

impl Eq for UpstreamTls {}

impl Serialize for UpstreamTls {
    /// Server name, trust and the error if unusable; never key material.
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut st = s.serialize_struct("UpstreamTls", 3)?;
        st.serialize_field("server_name", &*self.name)?;
        st.serialize_field("trust", &*self.trust)?;
        st.serialize_field("error", &self.error())?;
        st.end()
    }
}

/// Whether a TLS server name is a DNS name or an IP address rustls accepts.
pub fn valid_server_name(name: &str) -> bool {
    ServerName::try_from(name).is_ok()
}

fn ca_roots(pem: &[u8]) -> Result<RootCertStore, String> {
    use rustls::pki_types::pem::PemObject;
    let mut roots = RootCertStore::empty();
    let mut errors = Vec::new();
    for cert in CertificateDer::pem_slice_iter(pem) {
        match cert {
            Ok(cert) => {
                if let Err(e) = roots.add(cert) {
                    errors.push(e.to_string());
                }
            }
            Err(e) => errors.push(e.to_string()),
        }
    }
    if roots.is_empty() {
        let reason = errors
            .first()
            .cloned()
            .unwrap_or_else(|| "no PEM certificate".to_owned());
        return Err(reason);
    }
    Ok(roots)
}

/// The system trust roots, loaded once per process (an empty store where there are none).
fn system_roots() -> Arc<RootCertStore> {
    static ROOTS: OnceLock<Arc<RootCertStore>> = OnceLock::new();
    ROOTS
        .get_or_init(|| {
            let found = rustls_native_certs::load_native_certs();
            let mut roots = RootCertStore::empty();
            let (added, _) = roots.add_parsable_certificates(found.certs);
            tracing::info!(
                roots = added,
                errors = found.errors.len(),
                "Loaded the system trust roots for upstream TLS"
            );
            Arc::new(roots)
        })
        .clone()
}

/// Accepts any certificate (signatures are still checked): `backend-tls-skip-verify`.
#[derive(Debug)]
struct NoVerify(Arc<CryptoProvider>);

impl ServerCertVerifier for NoVerify {
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
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// TCP connect within `timeout`, `TCP_NODELAY` set.
async fn tcp(addr: SocketAddr, timeout: Duration) -> io::Result<TcpStream> {
    let stream = tokio::time::timeout(timeout, TcpStream::connect(addr))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "connect timed out"))??;
    let _ = stream.set_nodelay(true);
    Ok(stream)
}

/// An HTTP/1.1 connection over TLS (`https` upstreams): TCP connect and handshake within
/// `timeout`.
pub(crate) async fn connect_h1_tls(
    addr: SocketAddr,
    tls: &UpstreamTls,
    timeout: Duration,
) -> io::Result<http1::SendRequest<UpstreamBody>> {
    let started = tokio::time::Instant::now();
    let stream = tcp(addr, timeout).await?;
    let stream = tokio::time::timeout_at(deadline(started, timeout), tls.handshake(stream, false))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "TLS handshake timed out"))??;
    handshake_h1(stream, addr).await
}

async fn handshake_h1<S>(
    stream: S,
    addr: SocketAddr,
) -> io::Result<http1::SendRequest<UpstreamBody>>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (sender, connection) = http1::Builder::new()
        .max_buf_size(crate::limits::UPSTREAM_H1_BUF)
        .handshake(TokioIo::new(stream))
        .await
        .map_err(io::Error::other)?;
    tokio::spawn(async move {
        if let Err(error) = connection.with_upgrades().await {
            tracing::trace!(%error, upstream.addr = %addr, "Upstream connection ended");
        }
    });
    Ok(sender)
}

/// A pooled HTTP/2 connection and when a request last took it.
type PooledH2 = (http2::SendRequest<UpstreamBody>, Instant);

/// A connection attempt that every request arriving meanwhile waits for.
type Connecting =
    Shared<BoxFuture<'static, Result<http2::SendRequest<UpstreamBody>, Arc<io::Error>>>>;

/// One multiplexed HTTP/2 connection per upstream address and TLS settings, shared by every
/// request to that address; a closed connection (GOAWAY, reset) is replaced on the next request.
/// Requests that find no connection while one is being made wait for that one. A connection no
/// request has used for the idle timeout is let go (its open streams still finish).
#[derive(Default)]
pub(crate) struct H2Pool {
    conns: Mutex<HashMap<(SocketAddr, u64), PooledH2>>,
    connecting: Mutex<HashMap<(SocketAddr, u64), Connecting>>,
}

impl std::fmt::Debug for H2Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let conns = self.conns.lock().map_or(0, |c| c.len());
        f.debug_struct("H2Pool").field("conns", &conns).finish()
    }
}

impl H2Pool {
    fn get(&self, key: (SocketAddr, u64)) -> Option<http2::SendRequest<UpstreamBody>> {
        let mut conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        let (sender, used) = conns.get_mut(&key).filter(|(s, _)| !s.is_closed())?;
        *used = Instant::now();
        Some(sender.clone())
    }

    fn put(&self, key: (SocketAddr, u64), sender: http2::SendRequest<UpstreamBody>) {
        let mut conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        conns.insert(key, (sender, Instant::now()));
    }

    /// Drops closed connections, and lets go of those unused for `max_idle` (which closes them
    /// once their open streams are done).
    pub(crate) fn reap(&self, max_idle: Duration) {
        let mut conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        conns.retain(|_, (s, used)| !s.is_closed() && used.elapsed() < max_idle);
    }

    /// A new connection to the address, or the one another request is making right now.
    async fn connect(
        &self,
        addr: SocketAddr,
        tls: Option<&UpstreamTls>,
        timeout: Duration,
    ) -> io::Result<http2::SendRequest<UpstreamBody>> {
        let key = (addr, tls.map_or(0, UpstreamTls::key));
        let tls = tls.cloned();
        self.connect_with(key, move || {
            async move { connect_h2(addr, tls.as_ref(), timeout).await }.boxed()
        })
        .await
    }

    /// Joins the attempt in progress for `key`, or starts one with `make`. However the wait ends
    /// (connected, failed, cancelled, or the attempt panicked), the attempt is no longer offered
    /// to later requests: the next one tries again.
    async fn connect_with<F>(
        &self,
        key: (SocketAddr, u64),
        make: F,
    ) -> io::Result<http2::SendRequest<UpstreamBody>>
    where
        F: FnOnce() -> BoxFuture<'static, io::Result<http2::SendRequest<UpstreamBody>>>,
    {
        let attempt = {
            let mut connecting = self.connecting.lock().unwrap_or_else(|e| e.into_inner());
            connecting
                .entry(key)
                .or_insert_with(|| make().map(|r| r.map_err(Arc::new)).boxed().shared())
                .clone()
        };
        let _forget = ForgetAttempt {
            pool: self,
            key,
            attempt: attempt.clone(),
        };
        let result = attempt.await;
        if let Ok(sender) = &result {
            self.put(key, sender.clone());
        }
        result.map_err(|e| io::Error::new(e.kind(), e.to_string()))
    }

    /// Sends a request over the address's HTTP/2 connection, connecting first when there is none
    /// (or it closed). A request the connection did not take (it was closing) goes once over a
    /// fresh connection; so does a bodyless idempotent one that failed before any response on a
    /// reused connection (the pod went away, or refused the stream on GOAWAY). Returns the
    /// response, and whether a new connection was made.
    pub(crate) async fn send(
        &self,
        addr: SocketAddr,
        tls: Option<&UpstreamTls>,
        mut request: Request<UpstreamBody>,
        connect_timeout: Duration,
        response_timeout: Duration,
    ) -> Result<(Response<Incoming>, bool), SendError> {
        to_h2_request(&mut request, tls.is_some());
        let key = (addr, tls.map_or(0, UpstreamTls::key));
        let (mut sender, mut fresh) = match self.get(key) {
            Some(sender) => (sender, false),
            None => match self.connect(addr, tls, connect_timeout).await {
                Ok(sender) => (sender, true),
                Err(error) => return Err(SendError::Unsent(Box::new(request), error)),
            },
        };
        let mut replay = (!fresh).then(|| Replay::of(&request)).flatten();
        loop {
            let watch = crate::proxy::body_watch(&request);
            let sending = crate::send_watch::guard(watch, sender.try_send_request(request));
            let sent = tokio::time::timeout(response_timeout, sending)
                .await
                .ok()
                .flatten()
                .ok_or(());
            match sent {
                Err(_) => return Err(SendError::Failed(ProxyError::Timeout)),
                Ok(Ok(mut res)) => {
                    *res.version_mut() = Version::HTTP_11;
                    return Ok((res, fresh));
                }
                Ok(Err(mut error)) => match error.take_message() {
                    Some(unsent) if !fresh => {
                        request = unsent;
                        match self.connect(addr, tls, connect_timeout).await {
                            Ok(s) => {
                                sender = s;
                                fresh = true;
                            }
                            Err(e) => return Err(SendError::Unsent(Box::new(request), e)),
                        }
                    }
                    Some(unsent) => {
                        let e =
                            io::Error::new(io::ErrorKind::ConnectionAborted, error.into_error());
                        return Err(SendError::Unsent(Box::new(unsent), e));
                    }
                    None => match replay.take() {
                        Some(again) if !fresh => {
                            tracing::trace!(upstream.addr = %addr, error = %error.error(), "Replaying on a fresh HTTP/2 connection");
                            request = again.into_request();
                            match self.connect(addr, tls, connect_timeout).await {
                                Ok(s) => {
                                    sender = s;
                                    fresh = true;
                                }
                                Err(e) => return Err(SendError::Unsent(Box::new(request), e)),
                            }
                        }
                        _ => {
                            return Err(SendError::Failed(ProxyError::Upstream(error.into_error())))
                        }
                    },
                },
            }
        }
    }
}

/// Removes a connection attempt from the pool's table when its waiter is done with it, even by
/// unwinding or cancellation, so no failed or panicked attempt stays behind.
struct ForgetAttempt<'a> {
    pool: &'a H2Pool,
    key: (SocketAddr, u64),
    attempt: Connecting,
}

impl Drop for ForgetAttempt<'_> {
    fn drop(&mut self) {
        let mut connecting = self
            .pool
            .connecting
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if connecting
            .get(&self.key)
            .is_some_and(|c| c.ptr_eq(&self.attempt))
        {
            connecting.remove(&self.key);
        }
    }
}

async fn connect_h2(
    addr: SocketAddr,
    tls: Option<&UpstreamTls>,
    timeout: Duration,
) -> io::Result<http2::SendRequest<UpstreamBody>> {
    let started = tokio::time::Instant::now();
    let stream = tcp(addr, timeout).await?;
    match tls {
        None => handshake_h2(stream, addr).await,
        Some(tls) => {
            let stream =
                tokio::time::timeout_at(deadline(started, timeout), tls.handshake(stream, true))
                    .await
                    .map_err(|_| {
                        io::Error::new(io::ErrorKind::TimedOut, "TLS handshake timed out")
                    })??;
            handshake_h2(stream, addr).await
        }
    }
}

async fn handshake_h2<S>(
    stream: S,
    addr: SocketAddr,
) -> io::Result<http2::SendRequest<UpstreamBody>>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (sender, connection) = http2::Builder::new(TokioExecutor::new())
        .timer(TokioTimer::new())
        .initial_stream_window_size(crate::limits::H2_UPSTREAM_STREAM_WINDOW)
        .initial_connection_window_size(crate::limits::H2_UPSTREAM_CONNECTION_WINDOW)
        .max_send_buf_size(crate::limits::H2_MAX_SEND_BUF)
        .keep_alive_interval(Duration::from_secs(30))
        .keep_alive_timeout(Duration::from_secs(10))
        .handshake(TokioIo::new(stream))
        .await
        .map_err(io::Error::other)?;
    tokio::spawn(async move {
        if let Err(error) = connection.await {
            tracing::trace!(%error, upstream.addr = %addr, "Upstream HTTP/2 connection ended");
        }
    });
    Ok(sender)
}

/// Whether the client asked for trailers (`TE: trailers`), which gRPC servers expect; checked
/// before hop-by-hop headers are removed, for HTTP/2 upstreams only.
pub(crate) fn wants_trailers(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::TE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("trailers"))
}

/// Turns a prepared HTTP/1.1 upstream request into an HTTP/2 one: absolute URI with the Host as
/// `:authority`, no connection-specific headers, `te: trailers` kept when asked for.
fn to_h2_request(request: &mut Request<UpstreamBody>, tls: bool) {
    *request.version_mut() = Version::HTTP_2;
    let headers = request.headers_mut();
    headers.remove(header::CONNECTION);
    headers.remove(header::UPGRADE);
    let host = headers.get(header::HOST).cloned();
    // The Host was validated ([`crate::host`]): it cannot hold a path, query or userinfo. The URI is
    // built from parts so `:path` is the request's path and query, never text from a header.
    let authority = host.and_then(|h| Authority::try_from(h.as_bytes()).ok());
    if let Some(authority) = authority {
        let path = request.uri().path_and_query().cloned();
        let scheme = if tls { Scheme::HTTPS } else { Scheme::HTTP };
        let uri = Uri::builder()
            .scheme(scheme)
            .authority(authority)
            .path_and_query(path.unwrap_or_else(|| PathAndQuery::from_static("/")))
            .build();
        if let Ok(uri) = uri {
            *request.uri_mut() = uri;
            request.headers_mut().remove(header::HOST);
        }
    }
}

/// Puts `te: trailers` back on a request for an HTTP/2 upstream.
pub(crate) fn keep_trailers<B>(request: &mut Request<B>) {
    request
        .headers_mut()
        .insert(header::TE, HeaderValue::from_static("trailers"));
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    /// An h2c server on `ip` answering every request with "a", then "b" once `go` is notified;
    /// `closed` is notified when the connection ends.
    async fn slow_server(
        ip: std::net::IpAddr,
    ) -> (
        SocketAddr,
        Arc<tokio::sync::Notify>,
        tokio::sync::oneshot::Receiver<()>,
    ) {
        use http_body_util::BodyExt as _;
        let listener = tokio::net::TcpListener::bind((ip, 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let go = Arc::new(tokio::sync::Notify::new());
        let (closed_tx, closed) = tokio::sync::oneshot::channel();
        let gate = go.clone();
        tokio::spawn(async move {
            let (stream, _) = listener.accept().await.unwrap();
            let service = hyper::service::service_fn(move |_req| {
                let gate = gate.clone();
                async move {
                    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(2);
                    tokio::spawn(async move {
                        let _ = tx.send(Bytes::from_static(b"a")).await;
                        gate.notified().await;
                        let _ = tx.send(Bytes::from_static(b"b")).await;
                    });
                    let frames = futures_util::stream::unfold(rx, |mut rx| async move {
                        let chunk = rx.recv().await?;
                        Some((
                            Ok::<_, std::convert::Infallible>(hyper::body::Frame::data(chunk)),
                            rx,
                        ))
                    });
                    Ok::<_, std::convert::Infallible>(Response::new(
                        http_body_util::StreamBody::new(frames).boxed(),
                    ))
                }
            });
            let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await;
            let _ = closed_tx.send(());
        });
        (addr, go, closed)
    }

    #[tokio::test]
    async fn idle_h2_connections_are_let_go_after_their_streams_end() {
        use http_body_util::BodyExt as _;
        for ip in ["127.0.0.1", "::1"] {
            let (addr, go, closed) = slow_server(ip.parse().unwrap()).await;
            let pool = H2Pool::default();
            let request = Request::builder()
                .uri("/")
                .header(header::HOST, "h2.test")
                .body(UpstreamBody::Right(http_body_util::Empty::new()))
                .unwrap();
            let second = Duration::from_secs(5);
            let Ok((res, fresh)) = pool.send(addr, None, request, second, second).await else {
                panic!("request to {addr} failed");
            };
            assert!(fresh);
            // Idle for "longer than the timeout" while a stream is still open.
            pool.reap(Duration::ZERO);
            assert!(pool.get((addr, 0)).is_none(), "let go");
            go.notify_one();
            let body = tokio::time::timeout(second, res.into_body().collect())
                .await
                .expect("the open stream finishes")
                .expect("body");
            assert_eq!(body.to_bytes(), "ab");
            tokio::time::timeout(second, closed)
                .await
                .expect("the connection closes once its last stream is done")
                .unwrap();
        }
    }

    #[tokio::test]
    async fn a_panicked_h2_connect_leaves_nothing_behind() {
        for ip in ["127.0.0.1", "::1"] {
            let (addr, go, _closed) = slow_server(ip.parse().unwrap()).await;
            let pool = Arc::new(H2Pool::default());
            let p = pool.clone();
            let panicked = tokio::spawn(async move {
                p.connect_with((addr, 0), || async { panic!("connect panicked") }.boxed())
                    .await
            })
            .await;
            assert!(panicked.is_err_and(|e| e.is_panic()), "{ip}");
            let failed = pool
                .connect_with((addr, 0), || {
                    async { Err(io::Error::other("connect failed")) }.boxed()
                })
                .await;
            assert!(failed.is_err(), "{ip}");
            // The next request connects afresh and is answered.
            let request = Request::builder()
                .uri("/")
                .header(header::HOST, "h2.test")
                .body(UpstreamBody::Right(http_body_util::Empty::new()))
                .unwrap();
            let second = Duration::from_secs(5);
            let sent = tokio::spawn(async move {
                pool.send(addr, None, request, second, second)
                    .await
                    .map(|(res, fresh)| (res.status(), fresh))
                    .map_err(|_| "send failed")
            })
            .await;
            go.notify_one();
            assert!(
                matches!(sent, Ok(Ok((http::StatusCode::OK, true)))),
                "{ip}: {sent:?}"
            );
        }
    }

    /// Reads one HTTP/2 frame: (type, stream, payload).
    async fn read_frame(tcp: &mut TcpStream) -> (u8, u32, Vec<u8>) {
        use tokio::io::AsyncReadExt as _;
        let mut head = [0u8; 9];
        tcp.read_exact(&mut head).await.unwrap();
        let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
        let mut payload = vec![0u8; len];
        tcp.read_exact(&mut payload).await.unwrap();
        let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        (head[3], stream, payload)
    }

    #[tokio::test]
    async fn h2_upstream_connections_offer_bounded_windows() {
        use tokio::io::AsyncReadExt as _;
        for ip in ["127.0.0.1", "::1"] {
            let listener =
                tokio::net::TcpListener::bind((ip.parse::<std::net::IpAddr>().unwrap(), 0))
                    .await
                    .unwrap();
            let addr = listener.local_addr().unwrap();
            let connecting = tokio::spawn(connect_h2(addr, None, Duration::from_secs(5)));
            let (mut tcp, _) = listener.accept().await.unwrap();
            let mut preface = [0u8; 24];
            tcp.read_exact(&mut preface).await.unwrap();
            assert_eq!(&preface, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");
            let (kind, _, settings) = read_frame(&mut tcp).await;
            assert_eq!(kind, 0x4, "{ip}: SETTINGS first");
            let stream_window = settings.chunks_exact(6).find_map(|e| {
                (u16::from_be_bytes([e[0], e[1]]) == 0x4)
                    .then(|| u32::from_be_bytes([e[2], e[3], e[4], e[5]]))
            });
            assert_eq!(
                stream_window,
                Some(crate::limits::H2_UPSTREAM_STREAM_WINDOW),
                "{ip}"
            );
            // The connection window grows from the protocol's 65,535 by one WINDOW_UPDATE.
            let (kind, stream, increment) = read_frame(&mut tcp).await;
            assert_eq!((kind, stream), (0x8, 0), "{ip}: connection WINDOW_UPDATE");
            let increment =
                u32::from_be_bytes([increment[0], increment[1], increment[2], increment[3]]);
            assert_eq!(
                65_535 + increment,
                crate::limits::H2_UPSTREAM_CONNECTION_WINDOW,
                "{ip}"
            );
            connecting.abort();
        }
    }

    #[test]
    fn settings_compare_by_name_trust_and_alpn() {
        let a = UpstreamTls::new("web.shop.svc", &UpstreamTrust::SkipVerify, false).unwrap();
        let b = UpstreamTls::new("web.shop.svc", &UpstreamTrust::SkipVerify, false).unwrap();
        let c = UpstreamTls::new("web.shop.svc", &UpstreamTrust::SkipVerify, true).unwrap();
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_ne!(a.key(), 0);
        assert!(UpstreamTls::new("bad name!", &UpstreamTrust::SkipVerify, false).is_err());
        let ip = UpstreamTls::new("2001:db8::1", &UpstreamTrust::SystemRoots, false).unwrap();
        assert_eq!(ip.server_name(), "2001:db8::1");
    }

    #[test]
    fn garbage_ca_is_an_error() {
        let trust = UpstreamTrust::Ca {
            source: "ns/ca".into(),
            pem: b"not a certificate".to_vec(),
        };
        let error = UpstreamTls::new("a.b.svc", &trust, false).unwrap_err();
        assert!(error.to_string().contains("ns/ca"), "{error}");
    }

    #[test]
    fn h2_requests_carry_the_authority() {
        let mut req = Request::builder()
            .uri("/pkg.Svc/Call?x")
            .header(header::HOST, "[::1]:8080")
            .header(header::CONNECTION, "upgrade")
            .body(UpstreamBody::Right(http_body_util::Empty::new()))
            .unwrap();
        to_h2_request(&mut req, false);
        assert_eq!(req.uri(), "http://[::1]:8080/pkg.Svc/Call?x");
        assert!(req.headers().get(header::HOST).is_none());
        assert!(req.headers().get(header::CONNECTION).is_none());
        assert_eq!(req.version(), Version::HTTP_2);
    }
}
