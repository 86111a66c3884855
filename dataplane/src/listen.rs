//! Dual-stack listeners: one socket per address (IPv6 sockets with `IPV6_V6ONLY`), and the accept
//! loop that serves HTTP/1.1 and HTTP/2 (prior knowledge, or ALPN `h2` over TLS) connections
//! until shutdown.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::{Body, Incoming};
use hyper::server::conn::{http1, http2};
use hyper::service::Service;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use socket2::{Domain, Protocol, Socket, Type};
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

pub use crate::conn::ConnInfo;
use crate::forwarded::TrustedProxies;
use crate::handshake::Handshake;
use crate::idle::{self, Activity, Wake, Watched};
use crate::metrics::{ConnectionMetrics, OpenConnection};
use crate::park::{self, Rewind};
use crate::proxy_protocol::{self, Header};
use crate::table::{normalize_addr, Family};

/// A listener that could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    /// The kernel has IPv6 disabled, so an IPv6 address cannot be bound.
    #[error("cannot listen on {addr}: IPv6 is disabled on this host ({source})")]
    Ipv6Unavailable {
        /// The address.
        addr: SocketAddr,
        /// What the kernel said.
        #[source]
        source: io::Error,
    },
    /// Any other failure to create, bind or listen.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// What the kernel said.
        #[source]
        source: io::Error,
    },
}

/// Binds one listening socket: `SO_REUSEADDR`, `IPV6_V6ONLY` on IPv6, non-blocking, backlog 1024.
pub fn bind(addr: SocketAddr) -> Result<std::net::TcpListener, BindError> {
    let v6 = addr.is_ipv6();
    let wrap = |source: io::Error| {
        let unavailable = v6
            && matches!(source.raw_os_error(), Some(code) if code == EAFNOSUPPORT || code == EADDRNOTAVAIL);
        if unavailable {
            BindError::Ipv6Unavailable { addr, source }
        } else {
            BindError::Bind { addr, source }
        }
    };
    let socket =
        Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP)).map_err(wrap)?;
    if v6 {
        socket.set_only_v6(true).map_err(wrap)?;
    }
    socket.set_reuse_address(true).map_err(wrap)?;
    socket.set_tcp_nodelay(true).map_err(wrap)?;
    socket.set_nonblocking(true).map_err(wrap)?;
    socket.bind(&addr.into()).map_err(wrap)?;
    socket.listen(1024).map_err(wrap)?;
    Ok(socket.into())
}

const EAFNOSUPPORT: i32 = 97;
const EADDRNOTAVAIL: i32 = 99;

/// Settings of the HTTP server side of a listener.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// Time a client has to send a complete request head: the first from the connection's
    /// start, later ones from their first byte.
    pub header_read_timeout: Duration,
    /// Time a connection may stay idle between requests (HTTP/1.1 keep-alive and HTTP/2).
    pub keepalive_timeout: Duration,
    /// How long to wait for open connections after shutdown starts.
    pub drain_timeout: Duration,
    /// Terminate TLS with this configuration (an HTTPS listener); the handshake must finish
    /// within `header_read_timeout`.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// Expect a PROXY protocol (v1 or v2) header first, within this time; a connection
    /// without a valid one is closed.
    pub proxy_protocol: Option<Duration>,
    /// Peers whose forwarding headers are appended to (after PROXY protocol, the carried
    /// client address is the peer).
    pub trusted_proxies: Arc<TrustedProxies>,
    /// Counters of accepted and open connections (`None`: not counted).
    pub connections: Option<ConnectionMetrics>,
    /// Peers allowed to send a PROXY protocol header (`None`: any); connections from others are
    /// closed unread.
    pub proxy_protocol_from: Option<Arc<TrustedProxies>>,
    /// Connections open at once, shared by the listeners holding the same limit (`None`:
    /// unlimited); past it a new connection is closed at once and counted as refused.
    pub max_connections: Option<ConnectionLimit>,
    /// With `tls`: pick the configuration per SNI, asking for client certificates where a route
    /// of the host verifies them (`None`: `tls` for every handshake).
    pub handshakes: Option<Arc<crate::handshake::Handshakes>>,
    /// The Gateway pod port this listener serves (`None`: an Ingress listener), recorded in each
    /// connection's [`ConnInfo::gateway_port`].
    pub gateway_port: Option<u16>,
}

/// At most one warning per listener this often while connections are refused.
const LIMIT_WARNING_EVERY: Duration = Duration::from_secs(10);

/// A number of connections open at once, shared by several listeners.
#[derive(Clone, Debug)]
pub struct ConnectionLimit(Arc<tokio::sync::Semaphore>);

impl ConnectionLimit {
    /// A limit of `n` connections.
    pub fn new(n: usize) -> ConnectionLimit {
        ConnectionLimit(Arc::new(tokio::sync::Semaphore::new(n)))
    }

    /// A place for one more connection, held until dropped; `None` at the limit.
    pub(crate) fn admit(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        self.0.clone().try_acquire_owned().ok()
    }
}

/// What a listener serves each request with: a function of the request and its connection,
/// answering with any body hyper can send.
pub trait Handler: Clone + Send + Sync + 'static {
    /// The response body.
    type Body: hyper::body::Body<Data = Self::Data, Error = Self::Error> + Send + Unpin + 'static;
    /// The body's chunks.
    type Data: bytes::Buf + Send;
    /// The body's error.
    type Error: Into<Box<dyn std::error::Error + Send + Sync>>;
    /// The answer in the making.
    type Future: Future<Output = Result<Response<Self::Body>, std::convert::Infallible>>
        + Send
        + 'static;

    /// Answers one request.
    fn call(&self, req: Request<Incoming>, conn: Arc<ConnInfo>) -> Self::Future;
}

impl<H, F, B> Handler for H
where
    H: Fn(Request<Incoming>, Arc<ConnInfo>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Result<Response<B>, std::convert::Infallible>> + Send + 'static,
    B: hyper::body::Body + Send + Unpin + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Body = B;
    type Data = B::Data;
    type Error = B::Error;
    type Future = F;

    fn call(&self, req: Request<Incoming>, conn: Arc<ConnInfo>) -> F {
        self(req, conn)
    }
}

/// Serves HTTP/1.1 and HTTP/2 (prior knowledge) on a listener with a per-request handler until
/// `shutdown` turns true; then stops accepting and drains open connections gracefully.
pub async fn serve<H: Handler>(
    listener: std::net::TcpListener,
    options: ServeOptions,
    handler: H,
    mut shutdown: watch::Receiver<bool>,
) -> io::Result<()> {
    let listener = TcpListener::from_std(listener)?;
    let local_default = listener.local_addr()?;
    let each = Arc::new(PerConnection::new(&options, handler));
    // Each connection holds a receiver: `true` asks it to finish gracefully; once every receiver
    // is gone, all have.
    let (drain, draining) = watch::channel(false);
    let mut warned: Option<tokio::time::Instant> = None;
    while let Some((stream, peer)) = accept(&listener, local_default, &mut shutdown).await {
        let Some(permit) = admit(&options, peer, local_default, &mut warned) else {
            // Closed unread.
            continue;
        };
        let _ = stream.set_nodelay(true);
        let local = stream.local_addr().unwrap_or(local_default);
        let served = each.clone().serve(stream, (peer, local), draining.clone());
        tokio::spawn(async move {
            let _permit = permit;
            served.await;
        });
    }
    drop(listener);
    drop(draining);
    drain.send_replace(true);
    tokio::select! {
        _ = drain.closed() => {}
        _ = tokio::time::sleep(options.drain_timeout) => {
            tracing::warn!(listener = %local_default, "Drain timed out; closing remaining connections");
        }
    }
    Ok(())
}

/// The next accepted connection, or `None` once `shutdown` turns true. Accept errors (EMFILE and
/// friends) back off instead of spinning.
async fn accept(
    listener: &TcpListener,
    local: SocketAddr,
    shutdown: &mut watch::Receiver<bool>,
) -> Option<(TcpStream, SocketAddr)> {
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(pair) => return Some(pair),
                Err(error) => {
                    tracing::warn!(%error, listener = %local, "Accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            _ = stopped(shutdown) => return None,
        }
    }
}

/// What every connection of a listener is served with, shared by its connections.
struct PerConnection<H> {
    handler: H,
    http1: http1::Builder,
    http2: http2::Builder<TokioExecutor>,
    tls: Option<tokio_rustls::TlsAcceptor>,
    handshakes: Option<Arc<crate::handshake::Handshakes>>,
    timeouts: idle::Timeouts,
    proxy_protocol: Option<Duration>,
    proxy_protocol_from: Option<Arc<TrustedProxies>>,
    trusted_proxies: Arc<TrustedProxies>,
    connections: Option<ConnectionMetrics>,
    gateway_port: Option<u16>,
}

/// The stream hyper serves: the accepted one, watched for activity (and parked while idle),
/// with the bytes read to tell HTTP/2 from HTTP/1.1 (or left by a parked server) given back.
type Io = Rewind<Watched<Stream>>;

/// A client connection's service: each request answered by the handler, the connection active
/// from its head until its response body ends.
#[derive(Clone)]
struct ConnService<H> {
    handler: H,
    info: Arc<ConnInfo>,
    activity: Activity,
}

impl<H> std::fmt::Debug for ConnService<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnService")
            .field("info", &self.info)
            .finish_non_exhaustive()
    }
}

/// A response as the connection sends it.
type Answer<B> = Result<Response<idle::BusyBody<B>>, std::convert::Infallible>;

impl<H: Handler> Service<Request<Incoming>> for ConnService<H> {
    type Response = Response<idle::BusyBody<H::Body>>;
    type Error = std::convert::Infallible;
    /// Inline: HTTP/1.1's server keeps one in place per connection (dropped while parked).
    type Future = Answering<H::Future>;

    fn call(&self, req: Request<Incoming>) -> Self::Future {
        let busy = self.activity.begin_parkable(parkable(&req));
        Answering {
            response: self.handler.call(req, self.info.clone()),
            busy: Some(busy),
        }
    }
}

pin_project_lite::pin_project! {
    /// The handler's answer to one request; its response body keeps the connection busy.
    pub struct Answering<F> {
        #[pin]
        response: F,
        busy: Option<idle::Busy>,
    }
}

impl<F, B> Future for Answering<F>
where
    F: Future<Output = Result<Response<B>, std::convert::Infallible>>,
{
    type Output = Answer<B>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Answer<B>> {
        let this = self.project();
        let Poll::Ready(Ok(response)) = this.response.poll(cx) else {
            return Poll::Pending;
        };
        // Taken once: hyper polls no answer after it was ready.
        let busy = this.busy.take().unwrap_or_else(idle::Busy::none);
        Poll::Ready(Ok(response.map(|body| busy.body(body))))
    }
}

/// An HTTP/2 connection's service: [`ConnService`] with each answer boxed, so the task hyper
/// spawns per stream holds a pointer, not the handler's future (copied on each move).
#[derive(Clone, Debug)]
struct BoxedService<H>(ConnService<H>);

impl<H: Handler> Service<Request<Incoming>> for BoxedService<H> {
    type Response = Response<idle::BusyBody<H::Body>>;
    type Error = std::convert::Infallible;
    type Future = Pin<Box<Answering<H::Future>>>;

    fn call(&self, req: Request<Incoming>) -> Self::Future {
        Box::pin(self.0.call(req))
    }
}

/// Whether the connection may be parked once this request's response has ended: the request
/// has no body left for the server to read and asks for no protocol switch.
fn parkable<B: Body>(req: &Request<B>) -> bool {
    req.body().is_end_stream()
        && req.method() != hyper::Method::CONNECT
        && !crate::upstream::has_any_field(req.headers(), [&crate::names::UPGRADE])
}

/// The HTTP/1.1 server of a client connection, boxed: dropped while the connection is parked.
type H1Conn<H> = Pin<Box<http1::UpgradeableConnection<TokioIo<Io>, ConnService<H>>>>;

/// A connection's end: `Ok(true)` when the watchdog closed it (idle or slow).
type Ended = Result<bool, Box<dyn std::error::Error + Send + Sync>>;

impl<H> PerConnection<H> {
    fn new(options: &ServeOptions, handler: H) -> PerConnection<H> {
        let mut http1 = http1::Builder::new();
        http1
            .timer(TokioTimer::new())
            // Head and idle times are watched by `idle` for both protocols.
            .header_read_timeout(None)
            .keep_alive(true);
        let mut http2 = http2::Builder::new(TokioExecutor::new());
        http2.timer(TokioTimer::new());
        crate::limits::apply(&mut http1, &mut http2);
        PerConnection {
            handler,
            http1,
            http2,
            tls: options.tls.clone().map(tokio_rustls::TlsAcceptor::from),
            handshakes: options.handshakes.clone(),
            timeouts: idle::Timeouts {
                keepalive: options.keepalive_timeout,
                header_read: options.header_read_timeout,
            },
            proxy_protocol: options.proxy_protocol,
            proxy_protocol_from: options.proxy_protocol_from.clone(),
            trusted_proxies: options.trusted_proxies.clone(),
            connections: options.connections.clone(),
            gateway_port: options.gateway_port,
        }
    }

    /// Serves one accepted connection (its peer and local addresses): its PROXY protocol header
    /// where expected, its TLS handshake on an HTTPS listener, then HTTP until it ends, idles or
    /// is too slow; finishes gracefully once `drain` turns true.
    async fn serve(
        self: Arc<Self>,
        stream: TcpStream,
        (peer, local): (SocketAddr, SocketAddr),
        mut drain: watch::Receiver<bool>,
    ) where
        H: Handler,
    {
        // Boxed: what opening the connection holds (its facts by value, a PROXY header read, a
        // rustls connection mid-handshake, its timer) is freed once done instead of sizing the
        // connection's task for its whole life, idle time included.
        let Some(opened) = Box::pin(self.open(stream, ConnInfo::new(peer, local))).await else {
            return;
        };
        let Opened {
            io,
            info,
            alpn_h2,
            counted: _open,
        } = opened;
        let client = info.peer;
        let activity = Activity::new();
        let io = Watched::new(io, activity.clone());
        let service = ConnService {
            handler: self.handler.clone(),
            info,
            activity: activity.clone(),
        };
        // ALPN `h2` promised HTTP/2 (RFC 7301): no sniffing for HTTP/1.1 there, so bytes that
        // are not the preface close the connection. Elsewhere HTTP/1.1 (with upgrades) or
        // HTTP/2 prior knowledge, by the first bytes.
        let sniffed = if alpn_h2 {
            Ok((true, Rewind::new(io, bytes::Bytes::new())))
        } else {
            tokio::select! {
                sniffed = park::sniff_h2(io) => sniffed,
                () = activity.expired(self.timeouts) => {
                    closed_idle(client);
                    return;
                }
                () = stopped(&mut drain) => return,
            }
        };
        let ended = match sniffed {
            Ok((true, io)) => self.serve_h2(io, service, &activity, &mut drain).await,
            Ok((false, io)) => self.serve_h1(io, service, &activity, &mut drain).await,
            Err(error) => Err(error.into()),
        };
        match ended {
            Ok(true) => closed_idle(client),
            Ok(false) => {}
            Err(error) => tracing::trace!(error = %error, "Connection ended with an error"),
        }
    }

    /// Serves HTTP/2 until the connection ends.
    async fn serve_h2(
        &self,
        io: Io,
        service: ConnService<H>,
        activity: &Activity,
        drain: &mut watch::Receiver<bool>,
    ) -> Ended
    where
        H: Handler,
    {
        // Boxed: HTTP/2's connection state (codec, HPACK tables, streams) would otherwise size
        // the task of every connection, HTTP/1.1 ones too.
        let service = BoxedService(service);
        let io = TokioIo::new(crate::h2_write::Coalesced::new(io));
        let mut conn = Box::pin(self.http2.serve_connection(io, service));
        let mut draining = false;
        loop {
            tokio::select! {
                ended = conn.as_mut() => return ended.map(|()| false).map_err(Into::into),
                () = activity.expired(self.timeouts) => return Ok(true),
                () = stopped(drain), if !draining => {
                    draining = true;
                    conn.as_mut().graceful_shutdown();
                }
            }
        }
    }

    /// Serves HTTP/1.1 until the connection ends. Idle for [`idle::PARK_AFTER`] after a request
    /// without a body, the connection is parked: its hyper server is dropped (and its read and
    /// write buffers with it) and the socket waited on with no buffer; a new server takes it up
    /// when the client sends again.
    async fn serve_h1(
        &self,
        io: Io,
        service: ConnService<H>,
        activity: &Activity,
        drain: &mut watch::Receiver<bool>,
    ) -> Ended
    where
        H: Handler,
    {
        let mut conn: H1Conn<H> = Box::pin(
            self.http1
                .serve_connection(TokioIo::new(io), service)
                .with_upgrades(),
        );
        loop {
            let (io, service) = match self.until_parked(conn, activity, drain).await {
                Parking::Parked(io, service) => (io, service),
                Parking::Ended(ended) => return ended,
            };
            let family = service.info.family;
            let counted = self.connections.as_ref().map(|c| c.parked(family));
            let woken = wait_parked(io, activity, self.timeouts, drain).await;
            drop(counted);
            let Some(io) = woken else {
                return Ok(true);
            };
            conn = Box::pin(
                self.http1
                    .serve_connection(TokioIo::new(io), service)
                    .with_upgrades(),
            );
        }
    }

    /// Serves HTTP/1.1 until the connection ends or parks (then its stream, with the bytes the
    /// server read and did not use put back, and the service).
    async fn until_parked(
        &self,
        mut conn: H1Conn<H>,
        activity: &Activity,
        drain: &mut watch::Receiver<bool>,
    ) -> Parking<H>
    where
        H: Handler,
    {
        let Some(ended) = until_end(&mut conn, activity, self.timeouts, drain).await else {
            return Parking::Ended(Ok(true));
        };
        let parts = Pin::into_inner(conn).into_parts();
        match parts {
            Some(parts) if parts.io.inner().get_ref().is_parked() => {
                let mut io = parts.io.into_inner().rewound(parts.read_buf);
                io.get_mut().unpark();
                Parking::Parked(io, parts.service)
            }
            _ => Parking::Ended(ended.map(|()| false).map_err(Into::into)),
        }
    }
}

/// Polls an HTTP/1.1 server until it ends (`Some`), or until the watchdog expires (`None`);
/// meanwhile parks the connection when the watchdog says so, and finishes gracefully once `drain`
/// turns true. One hand-written poll instead of a `select!`: the watchdog and the drain signal
/// are woken through a [`idle::SideWake`] and polled only when it was woken, not on each of the
/// socket wake-ups of a request.
async fn until_end<H: Handler>(
    conn: &mut H1Conn<H>,
    activity: &Activity,
    timeouts: idle::Timeouts,
    drain: &mut watch::Receiver<bool>,
) -> Option<Result<(), hyper::Error>> {
    let side = idle::SideWake::new();
    let side_waker = std::task::Waker::from(side.clone());
    let mut draining = false;
    let mut next = std::pin::pin!(activity.next(timeouts, Some(idle::PARK_AFTER)));
    let mut stop = std::pin::pin!(stopped(drain));
    std::future::poll_fn(|cx| loop {
        if let Poll::Ready(ended) = conn.as_mut().poll(cx) {
            return Poll::Ready(Some(ended));
        }
        if !side.take_due(cx.waker()) {
            return Poll::Pending;
        }
        let mut side_cx = Context::from_waker(&side_waker);
        let mut changed = false;
        if let Poll::Ready(wake) = next.as_mut().poll(&mut side_cx) {
            match wake {
                Wake::Expired => return Poll::Ready(None),
                // The next poll of the server reads, and that read parks.
                Wake::Park => activity.request_park(),
            }
            changed = true;
        }
        if !draining && stop.as_mut().poll(&mut side_cx).is_ready() {
            draining = true;
            conn.as_mut().graceful_shutdown();
            changed = true;
        }
        if !changed {
            return Poll::Pending;
        }
        // Polled again at once, as a `select!` loop would: the server, then a fresh watchdog.
        next.set(activity.next(timeouts, (!draining).then_some(idle::PARK_AFTER)));
        side.mark_due();
    })
    .await
}

/// How [`PerConnection::until_parked`] ended.
enum Parking<H> {
    /// The connection parked: its stream and service.
    Parked(Io, ConnService<H>),
    /// The connection ended.
    Ended(Ended),
}

/// Waits while a connection is parked: its stream once the client sends again (or bytes are
/// pending), `None` once it has been idle too long (dropped, as an idle served one is) or the
/// listener drains (shut down, as hyper closes an idle connection then).
async fn wait_parked(
    mut io: Io,
    activity: &Activity,
    timeouts: idle::Timeouts,
    drain: &mut watch::Receiver<bool>,
) -> Option<Io> {
    if io.has_pending() {
        return Some(io);
    }
    let readable = tokio::select! {
        readable = io.get_ref().get_ref().readable() => readable.is_ok(),
        () = activity.expired(timeouts) => return None,
        () = stopped(drain) => false,
    };
    if !readable {
        let _ = tokio::time::timeout(timeouts.header_read, io.shutdown()).await;
        return None;
    }
    Some(io)
}

/// Logs a connection the watchdog closed.
fn closed_idle(client: SocketAddr) {
    tracing::trace!(client.addr = %client, "Closed an idle or slow connection");
}

impl<H> PerConnection<H> {
    /// Opens an accepted connection: its PROXY protocol header where expected, then its TLS
    /// handshake on an HTTPS listener; `None` closes it.
    async fn open(&self, mut stream: TcpStream, info: ConnInfo) -> Option<Opened> {
        let mut info = self.proxy_header(&mut stream, info).await?;
        info.trusted = self.trusted_proxies.trusts(info.peer.ip());
        info.gateway_port = self.gateway_port;
        // Counted by the client's family, after a PROXY protocol header replaced it.
        let counted = self.connections.as_ref().map(|c| c.open(info.family));
        let (io, info, alpn_h2) = self.tls_handshake(stream, info).await?;
        Some(Opened {
            io,
            info: Arc::new(info),
            alpn_h2,
            counted,
        })
    }

    /// The connection as its PROXY protocol header describes it, where one is expected; `None`
    /// closes the connection (a peer not allowed to send one, or a bad header).
    async fn proxy_header(&self, stream: &mut TcpStream, info: ConnInfo) -> Option<ConnInfo> {
        let Some(timeout) = self.proxy_protocol else {
            return Some(info);
        };
        let from = self.proxy_protocol_from.as_ref();
        if from.is_some_and(|from| !from.trusts(info.peer.ip())) {
            tracing::trace!(client.addr = %info.peer, "Peer not allowed to send a PROXY protocol header; closing");
            return None;
        }
        match proxy_protocol::read_header(stream, timeout).await {
            Ok(Header::Proxied {
                source,
                destination,
            }) => Some(ConnInfo::new(source, destination)),
            Ok(Header::Local) => Some(info),
            Err(error) => {
                tracing::trace!(%error, client.addr = %info.peer, "PROXY protocol header refused; closing");
                None
            }
        }
    }

    /// The stream to serve HTTP on, with the connection's TLS facts and whether ALPN chose `h2`;
    /// `None` when the TLS handshake failed or timed out (within the header read timeout).
    async fn tls_handshake(
        &self,
        stream: TcpStream,
        info: ConnInfo,
    ) -> Option<(Stream, ConnInfo, bool)> {
        let Some(acceptor) = &self.tls else {
            return Some((Stream::Plain(stream), info, false));
        };
        let handshake = async {
            match &self.handshakes {
                Some(h) => h.accept(stream).await,
                None => Ok(Handshake::Tls(Box::new(acceptor.accept(stream).await?))),
            }
        };
        match tokio::time::timeout(self.timeouts.header_read, handshake).await {
            Ok(Ok(Handshake::Passthrough(relay))) => {
                relay.run(info.family, info.peer).await;
                None
            }
            Ok(Ok(Handshake::Refused)) => {
                if let Some(c) = &self.connections {
                    c.refused(info.family);
                }
                tracing::debug!(client.addr = %info.peer, "Passthrough connection limit (--max-passthrough-connections) reached; closing");
                None
            }
            Ok(Ok(Handshake::Unrouted)) => {
                tracing::debug!(client.addr = %info.peer, "No TLSRoute for the server name on this Gateway port; closing");
                None
            }
            Ok(Ok(Handshake::Tls(tls))) => {
                let session = tls.get_ref().1;
                let alpn_h2 = session.alpn_protocol() == Some(b"h2");
                let info = info.with_tls(true).with_tls_session(session);
                Some((Stream::Tls(tls), info, alpn_h2))
            }
            Ok(Err(error)) => {
                tracing::trace!(%error, client.addr = %info.peer, "TLS handshake failed");
                None
            }
            Err(_) => {
                tracing::trace!(client.addr = %info.peer, "TLS handshake timed out");
                None
            }
        }
    }
}

/// Whether a new connection is served: with its place under `--max-connections` (held until
/// dropped; `None` when unlimited), or not at all (`None`) when the limit is reached, which is
/// counted and, at most every [`LIMIT_WARNING_EVERY`], logged.
fn admit(
    options: &ServeOptions,
    peer: SocketAddr,
    listener: SocketAddr,
    warned: &mut Option<tokio::time::Instant>,
) -> Option<Option<tokio::sync::OwnedSemaphorePermit>> {
    let Some(limit) = &options.max_connections else {
        return Some(None);
    };
    if let Some(permit) = limit.admit() {
        return Some(Some(permit));
    }
    if let Some(c) = &options.connections {
        c.refused(Family::of(&normalize_addr(peer)));
    }
    if warned.is_none_or(|at| at.elapsed() >= LIMIT_WARNING_EVERY) {
        *warned = Some(tokio::time::Instant::now());
        tracing::warn!(%listener, "Connection limit (--max-connections) reached; closing new connections");
    }
    None
}

/// A connection ready for HTTP: its stream, its facts, whether ALPN chose `h2`, and its place
/// in the open-connection gauge (held until the connection ends).
struct Opened {
    io: Stream,
    info: Arc<ConnInfo>,
    alpn_h2: bool,
    counted: Option<OpenConnection>,
}

/// An accepted connection, plain or TLS.
enum Stream {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

impl Stream {
    /// Waits until the socket has bytes (or an end) to read.
    async fn readable(&self) -> io::Result<()> {
        match self {
            Stream::Plain(s) => s.readable().await,
            Stream::Tls(s) => s.get_ref().0.readable().await,
        }
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Tls(s) => Pin::new(s).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Stream::Plain(s) => s.is_write_vectored(),
            Stream::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

/// Resolves once `shutdown` turns true (or its sender is gone). Holds no `watch::Ref` across an
/// await, so the accept loop's future stays `Send`.
async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|stop| *stop).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binds_each_family_separately_on_one_port() {
        // With IPV6_V6ONLY the IPv6 socket does not claim the IPv4 port space, so both bind. (The
        // IPv6 port may be taken by another process: then try another port, a few times.)
        let (_v4, v6, port) = (0..10)
            .find_map(|_| {
                let v4 = bind("127.0.0.1:0".parse().unwrap()).unwrap();
                let port = v4.local_addr().unwrap().port();
                match bind(SocketAddr::from(([0u16, 0, 0, 0, 0, 0, 0, 1], port))) {
                    Ok(v6) => Some((v4, v6, port)),
                    Err(BindError::Bind { source, .. })
                        if source.kind() == io::ErrorKind::AddrInUse =>
                    {
                        None
                    }
                    Err(e) => panic!("{e}"),
                }
            })
            .expect("a port free on both families");
        assert_eq!(v6.local_addr().unwrap().port(), port);
        let again = bind(SocketAddr::from(([127, 0, 0, 1], port)));
        assert!(matches!(again, Err(BindError::Bind { .. })), "{again:?}");
    }

    /// Accepts one pending connection on a non-blocking listener, waiting up to 5 s.
    fn accept_within(listener: &std::net::TcpListener) -> Option<SocketAddr> {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            match listener.accept() {
                Ok((_, peer)) => return Some(peer),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => panic!("accept: {e}"),
            }
            if std::time::Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Nothing is waiting on the listener (checked after the other family's accept succeeded,
    /// so a connection that went the wrong way would be queued by now).
    fn nothing_pending(listener: &std::net::TcpListener) -> bool {
        matches!(listener.accept(), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
    }

    #[test]
    fn wildcard_listeners_of_both_families_share_a_port_and_each_gets_its_own_family() {
        // The defaults `0.0.0.0:p` and `[::]:p`, both listening: without IPV6_V6ONLY the IPv6
        // wildcard would claim the IPv4 port too (bind fails, or it takes IPv4 clients).
        let (v4, v6, port) = (0..10)
            .find_map(|_| {
                let v4 = bind("0.0.0.0:0".parse().unwrap()).unwrap();
                let port = v4.local_addr().unwrap().port();
                match bind(SocketAddr::from(([0u16; 8], port))) {
                    Ok(v6) => Some((v4, v6, port)),
                    Err(BindError::Bind { source, .. })
                        if source.kind() == io::ErrorKind::AddrInUse =>
                    {
                        None
                    }
                    Err(e) => panic!("{e}"),
                }
            })
            .expect(
                "no port free on both wildcards: without IPV6_V6ONLY, [::] claims the IPv4 port",
            );
        let v6_socket = socket2::SockRef::from(&v6);
        assert!(
            v6_socket.only_v6().unwrap(),
            "IPV6_V6ONLY not set on [::]:{port}"
        );
        assert!(v6_socket.reuse_address().unwrap());
        // An IPv4 client lands on the IPv4 socket and only there.
        let _c4 = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let peer = accept_within(&v4).expect("IPv4 client not accepted on 0.0.0.0");
        assert_eq!(peer.ip(), std::net::IpAddr::from([127, 0, 0, 1]));
        assert!(
            nothing_pending(&v6),
            "an IPv4 client reached the IPv6 socket"
        );
        // An IPv6 client lands on the IPv6 socket and only there.
        let _c6 = std::net::TcpStream::connect(("::1", port)).unwrap();
        let peer = accept_within(&v6).expect("IPv6 client not accepted on [::]");
        assert_eq!(
            peer.ip(),
            std::net::IpAddr::from([0u16, 0, 0, 0, 0, 0, 0, 1])
        );
        assert!(
            nothing_pending(&v4),
            "an IPv6 client reached the IPv4 socket"
        );
    }

    #[test]
    fn mapped_peers_are_ipv4_clients() {
        let info = ConnInfo::new(
            "[::ffff:127.0.0.1]:5000".parse().unwrap(),
            "[::ffff:127.0.0.1]:80".parse().unwrap(),
        );
        assert_eq!(info.family, Family::V4);
        assert_eq!(info.peer.to_string(), "127.0.0.1:5000");
    }
}
