//! HTTP/3 listeners: one QUIC endpoint per UDP socket (IPv6 sockets with `IPV6_V6ONLY`, as the
//! TCP listeners), serving each request through the same [`Proxy`] as HTTP/1.1 and HTTP/2, with
//! certificates by SNI from the same resolver (TLS 1.3, ALPN `h3`, no 0-RTT), and client
//! certificates asked for by SNI as on TCP ([`sni`]). The Ingress HTTPS listeners have theirs
//! (`--http3`), and so does each Gateway HTTPS port ([`crate::gateway_listen`]): the same port
//! over UDP, its listeners' certificates and routes.
//!
//! Limits: connections share `--max-connections` with the TCP listeners; streams per connection
//! and the idle timeout are QUIC transport parameters; above a number of handshakes in flight,
//! clients must prove their address with a Retry first. On shutdown each connection sends
//! GOAWAY, finishes its requests within the drain timeout, and closes.

mod request;
mod sni;

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use socket2::{Domain, Protocol, Socket, Type};
use tokio::sync::watch;

use crate::conn::ConnInfo;
use crate::forwarded::TrustedProxies;
use crate::handshake::Handshakes;
use crate::listen::{BindError, ConnectionLimit};
use crate::metrics::ConnectionMetrics;
use crate::proxy::Proxy;
use crate::table::Family;

/// Settings of the HTTP/3 listeners.
#[derive(Clone, Debug)]
pub struct Http3Options {
    /// A connection without a packet either way for this long is closed (QUIC's idle timeout).
    pub idle_timeout: Duration,
    /// Requests in flight at once per connection (concurrent bidirectional streams).
    pub max_streams: u32,
    /// Time a client has to finish its handshake.
    pub handshake_timeout: Duration,
    /// Time in-flight requests get after GOAWAY on shutdown.
    pub drain_timeout: Duration,
    /// Handshakes in flight past which a new client must first prove its address with a Retry
    /// (0: always).
    pub retry_above: usize,
    /// `ma` of the `Alt-Svc` HTTPS answers over TCP carry while the listener is up.
    pub alt_svc_max_age: Duration,
    /// Connections open at once, shared with the TCP listeners (`None`: unlimited).
    pub max_connections: Option<ConnectionLimit>,
    /// Counters of accepted, open and refused connections (`None`: not counted).
    pub connections: Option<ConnectionMetrics>,
    /// Peers whose forwarding headers are appended to.
    pub trusted_proxies: Arc<TrustedProxies>,
    /// The Gateway pod port this listener serves (`None`: the Ingress HTTPS listeners'
    /// counterpart): its connections are routed by that port's listeners, and `Alt-Svc` is
    /// advertised on that port's TCP answers.
    pub gateway_port: Option<u16>,
    /// The port clients reach this listener on, when not the bound one (a Gateway listener's
    /// port in front of its pod port): each connection's `X-Forwarded-Port`.
    pub forwarded_port: Option<u16>,
}

/// HTTP/3 frames' largest header section accepted (as hyper's HTTP/2 default, 16 KiB more).
const MAX_FIELD_SECTION: u64 = 64 * 1024;

/// Unidirectional streams a client may open: HTTP/3's control stream and QPACK's two, with room
/// for reserved (grease) stream types.
const MAX_UNI_STREAMS: u32 = 8;

/// Binds one UDP socket: `IPV6_V6ONLY` on IPv6, non-blocking.
pub fn bind(addr: SocketAddr) -> Result<std::net::UdpSocket, BindError> {
    let v6 = addr.is_ipv6();
    let wrap = |source: io::Error| BindError::new(addr, source);
    let socket =
        Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP)).map_err(wrap)?;
    if v6 {
        socket.set_only_v6(true).map_err(wrap)?;
    }
    socket.set_nonblocking(true).map_err(wrap)?;
    socket.bind(&addr.into()).map_err(wrap)?;
    Ok(socket.into())
}

/// The TLS side of the HTTP/3 listeners: TLS 1.3 only (QUIC has no other), ALPN `h3`,
/// certificates by SNI through `resolver` (the HTTPS listeners' own), and no early data: 0-RTT
/// requests could be replayed, so clients always complete the handshake first.
pub fn tls_config(
    resolver: Arc<dyn rustls::server::ResolvesServerCert>,
) -> Arc<rustls::ServerConfig> {
    let mut config = rustls::ServerConfig::builder_with_provider(crate::tls::provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("ring supports TLS 1.3")
        .with_no_client_auth()
        .with_cert_resolver(resolver);
    config.alpn_protocols = vec![b"h3".to_vec()];
    config.max_early_data_size = 0;
    Arc::new(config)
}

/// The QUIC server configuration: TLS picked per ClientHello by `handshakes` (whose base is a
/// [`tls_config`]), the stream and idle limits.
pub fn server_config(
    handshakes: Arc<Handshakes>,
    options: &Http3Options,
) -> Result<quinn::ServerConfig, String> {
    let crypto = sni::BySni::new(handshakes)?;
    let mut config = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    let mut transport = quinn::TransportConfig::default();
    transport
        .max_concurrent_bidi_streams(options.max_streams.into())
        .max_concurrent_uni_streams(MAX_UNI_STREAMS.into())
        .max_idle_timeout(Some(
            quinn::IdleTimeout::try_from(options.idle_timeout).map_err(|e| e.to_string())?,
        ));
    config.transport_config(Arc::new(transport));
    Ok(config)
}

/// The endpoint configuration every HTTP/3 listener shares (cloned): one stateless-reset key
/// for all, so that a reset one endpoint sends for a connection of another (a client that moved
/// to the other family) would be valid. quinn sends none for such short packets, so in practice
/// the moved client's packets go unanswered until it gives up (see the HTTP/3 guide page).
pub fn endpoint_config() -> quinn::EndpointConfig {
    quinn::EndpointConfig::default()
}

/// A QUIC endpoint on a bound socket.
pub fn endpoint(
    socket: std::net::UdpSocket,
    endpoint_config: quinn::EndpointConfig,
    config: quinn::ServerConfig,
) -> io::Result<quinn::Endpoint> {
    quinn::Endpoint::new(
        endpoint_config,
        Some(config),
        socket,
        Arc::new(quinn::TokioRuntime),
    )
}

/// What the connections of one listener share.
struct Shared {
    proxy: Arc<Proxy>,
    options: Http3Options,
    local: SocketAddr,
    handshakes: AtomicUsize,
}

/// Serves HTTP/3 on an endpoint until `shutdown` turns true, advertising it in `Alt-Svc` to the
/// listener's family meanwhile; then sends GOAWAY on every connection, waits for their requests
/// (at most the drain timeout) and closes the endpoint.
pub async fn serve(
    endpoint: quinn::Endpoint,
    proxy: Arc<Proxy>,
    options: Http3Options,
    mut shutdown: watch::Receiver<bool>,
) -> io::Result<()> {
    let local = endpoint.local_addr()?;
    let family = Family::of(&crate::table::normalize_addr(local));
    let advertised = advertise(&proxy, &options, family, local.port());
    let drain_timeout = options.drain_timeout;
    let shared = Arc::new(Shared {
        proxy,
        options,
        local,
        handshakes: AtomicUsize::new(0),
    });
    let (drain, draining) = watch::channel(false);
    loop {
        let incoming = tokio::select! {
            incoming = endpoint.accept() => incoming,
            () = stopped(&mut shutdown) => None,
        };
        let Some(incoming) = incoming else { break };
        shared.clone().admit(incoming, draining.clone());
    }
    match advertised {
        Some(token) => shared
            .proxy
            .alt_svc()
            .gateway_down(family, local.port(), token),
        None => shared.proxy.alt_svc().down(family),
    }
    drop(draining);
    drain.send_replace(true);
    tokio::select! {
        _ = drain.closed() => {}
        () = tokio::time::sleep(drain_timeout) => {
            tracing::warn!(listener = %local, "HTTP/3 drain timed out; closing remaining connections");
        }
    }
    endpoint.close(H3_NO_ERROR.into(), b"shutdown");
    let _ = tokio::time::timeout(Duration::from_secs(1), endpoint.wait_idle()).await;
    Ok(())
}

/// Advertises the listener in `Alt-Svc` to the TCP clients of its family: of the Ingress HTTPS
/// listeners, or of its Gateway port (then returns the token that takes it down).
fn advertise(proxy: &Proxy, options: &Http3Options, family: Family, port: u16) -> Option<u64> {
    let alt_svc = proxy.alt_svc();
    match options.gateway_port {
        Some(_) => Some(alt_svc.gateway_up(family, port, options.alt_svc_max_age)),
        None => {
            alt_svc.up(family, port, options.alt_svc_max_age);
            None
        }
    }
}

/// HTTP/3's `H3_NO_ERROR`: a connection closed on purpose.
const H3_NO_ERROR: u32 = 0x100;

impl Shared {
    /// Admits, validates or refuses a new connection attempt: past `--max-connections` it is
    /// refused; past the handshakes in flight allowed, an unvalidated client is sent a Retry.
    fn admit(self: Arc<Self>, incoming: quinn::Incoming, drain: watch::Receiver<bool>) {
        let family = Family::of(&crate::table::normalize_addr(incoming.remote_address()));
        let permit = match &self.options.max_connections {
            None => None,
            Some(limit) => match limit.admit() {
                Some(permit) => Some(permit),
                None => {
                    if let Some(c) = &self.options.connections {
                        c.refused(family);
                    }
                    tracing::debug!(listener = %self.local, "Connection limit (--max-connections) reached; refusing an HTTP/3 connection");
                    incoming.refuse();
                    return;
                }
            },
        };
        let in_flight = self.handshakes.load(Ordering::Relaxed);
        if in_flight >= self.options.retry_above && !incoming.remote_address_validated() {
            if incoming.may_retry() {
                let _ = incoming.retry();
            } else {
                incoming.ignore();
            }
            return;
        }
        tokio::spawn(async move {
            let _permit = permit;
            self.connection(incoming, drain).await;
        });
    }

    /// Serves one connection: its handshake (within the handshake timeout), then its requests
    /// until it closes, idles out or the listener drains (GOAWAY, then its requests finish).
    async fn connection(self: Arc<Self>, incoming: quinn::Incoming, drain: watch::Receiver<bool>) {
        self.handshakes.fetch_add(1, Ordering::Relaxed);
        let handshake = async {
            let connecting = incoming.accept()?;
            connecting.await
        };
        let timed = tokio::time::timeout(self.options.handshake_timeout, handshake).await;
        self.handshakes.fetch_sub(1, Ordering::Relaxed);
        let conn = match timed {
            Ok(Ok(conn)) => conn,
            Ok(Err(error)) => {
                tracing::trace!(%error, "QUIC handshake failed");
                return;
            }
            Err(_) => {
                tracing::trace!("QUIC handshake timed out");
                return;
            }
        };
        let info = Arc::new(self.conn_info(&conn));
        let _open = self
            .options
            .connections
            .as_ref()
            .map(|c| c.open(info.family));
        // `drain` is held until the connection is closed: the listener waits for that.
        let ended = request::serve_connection(conn.clone(), &self.proxy, info, drain.clone()).await;
        if let Err(error) = ended {
            tracing::trace!(%error, "HTTP/3 connection ended with an error");
        }
        conn.close(H3_NO_ERROR.into(), b"");
        drop(drain);
    }

    /// Who is on the other end of a QUIC connection: its addresses, TLS 1.3, its SNI and its
    /// client certificate.
    fn conn_info(&self, conn: &quinn::Connection) -> ConnInfo {
        let local = match conn.local_ip() {
            Some(ip) => SocketAddr::new(ip, self.local.port()),
            None => self.local,
        };
        let mut info = ConnInfo::new(conn.remote_address(), local).with_tls(true);
        if let Some(port) = self.options.forwarded_port {
            info = info.with_forwarded_port(port);
        }
        info.tls_version = Some("TLSv1.3");
        info.sni = conn
            .handshake_data()
            .and_then(|d| d.downcast::<quinn::crypto::rustls::HandshakeData>().ok())
            .and_then(|d| d.server_name)
            .map(Arc::from);
        if let Some(chain) = conn.peer_identity().and_then(|p| {
            p.downcast::<Vec<rustls_pki_types::CertificateDer<'static>>>()
                .ok()
        }) {
            info.client_certs = (*chain).into();
        }
        info.gateway_port = self.options.gateway_port;
        info.trusted = self.options.trusted_proxies.trusts(info.peer.ip());
        info
    }
}

/// Resolves once `shutdown` turns true (or its sender is gone).
async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|stop| *stop).await;
}
