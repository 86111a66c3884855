//! The one way a request goes upstream: a [`Peer`] says where and how (address, family,
//! protocol, TLS, timeouts), and [`Upstream::send`] sends over a pooled connection of the peer's
//! protocol, HTTP/1.1 ([`h1`]) or HTTP/2 ([`h2`]), with one retry/replay policy for both
//! ([`after_failure`]) and one send timeout for both (`proxy-send-timeout`, watched by the
//! request body: [`crate::send_watch`]). Connections are made by [`connect`]; TLS client
//! configurations come from [`tls`]. A bodyless GET or HEAD to a plain HTTP/1.1 peer goes by
//! duet's own client instead ([`client`]: no connection task, the body read in the request's
//! task), under the same pool, timeouts and retry/replay rules.

mod client;
mod connect;
mod h1;
mod h2;
pub mod tls;

use std::collections::HashMap;
use std::future::Future;
use std::hash::{BuildHasherDefault, Hasher};
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode, Version};
use http_body_util::{Either, Empty};
use hyper::body::{Body, Incoming};
use hyper::client::conn::{http1, TrySendError};
use tokio::time::timeout;

pub(crate) use client::ClientError;
/// An HTTP/1.1 connection going back to the pool when its response is done.
pub(crate) type PoolReturn = h1::PoolReturn<client::ClientConn>;
pub use client::is_hop_or_framing;
pub(crate) use client::{is_connection_option, role, Role};
pub(crate) use h2::{keep_trailers, own_values, wants_trailers};

use crate::client_body::ClientBody;
use crate::error::ProxyError;
use crate::forwarded::Forwarding;
use crate::limits::Limited;
use crate::send_watch::{self, SendWatch};
use crate::table::{Family, UpstreamProtocol};
use tls::LiveTls;

/// The body sent upstream: the client's stream (counted against the route's body limit), or
/// nothing for a replayed bodyless request.
pub(crate) type UpstreamBody = Either<Limited<ClientBody>, Empty<Bytes>>;

/// Names a head has at most for [`has_any_field`] to compare them rather than hash: a request
/// carries a handful, and a name's comparison (a standard one's index) costs a few instructions
/// against the 60 to 80 of a hashed lookup.
const SCANNED_FIELDS: usize = 16;

/// Whether `headers` has a field of any of `names`: one pass over a small head's names, else
/// a hashed lookup each.
pub(crate) fn has_any_field<const N: usize>(
    headers: &http::HeaderMap,
    names: [&http::HeaderName; N],
) -> bool {
    if headers.keys_len() <= SCANNED_FIELDS {
        headers.keys().any(|key| names.contains(&key))
    } else {
        names.iter().any(|name| headers.contains_key(*name))
    }
}

/// hyper's HTTP/1.1 client frames a GET or HEAD whose body has no declared length as
/// `Content-Length: 0`, dropping the body: such a body still coming (an HTTP/2 stream its
/// HEADERS did not end, a chunked HTTP/1.1 GET) is declared chunked, as Envoy sends it, and the
/// pod answers once it has ended.
fn chunk_unknown_length_get(request: &mut Request<UpstreamBody>) {
    if matches!(request.method().as_str(), "GET" | "HEAD")
        && !request.body().is_end_stream()
        && request.body().size_hint().exact().is_none()
    {
        request.headers_mut().insert(
            http::header::TRANSFER_ENCODING,
            http::HeaderValue::from_static("chunked"),
        );
    }
}

/// Where a pooled connection goes: the address, and the TLS settings' key (0: plain TCP).
pub(crate) type PoolKey = (SocketAddr, u64);

/// A map by [`PoolKey`], hashed with [`PoolHasher`]: every request looks its connection up.
pub(crate) type PoolMap<V> = HashMap<PoolKey, V, BuildHasherDefault<PoolHasher>>;

/// Hashes a [`PoolKey`] a word at a time with one multiply each (FxHash's mix) instead of
/// SipHash: the keys are upstream addresses of the snapshot and settings' keys, never chosen by a
/// client, so flooding a map with colliding keys is not open to one.
#[derive(Debug, Default)]
pub(crate) struct PoolHasher(u64);

impl PoolHasher {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

impl Hasher for PoolHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
    }

    fn write_u8(&mut self, n: u8) {
        self.add(u64::from(n));
    }

    fn write_u16(&mut self, n: u16) {
        self.add(u64::from(n));
    }

    fn write_u32(&mut self, n: u32) {
        self.add(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.add(n);
    }

    fn write_usize(&mut self, n: usize) {
        self.add(n as u64);
    }
}

/// One upstream attempt: where, over which family and protocol, with which TLS settings and
/// timeouts (pingora's `HttpPeer`, as data).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Peer<'a> {
    /// The target's address of `family`.
    pub addr: SocketAddr,
    /// The family of `addr`.
    pub family: Family,
    /// The protocol spoken.
    pub protocol: UpstreamProtocol,
    /// TLS settings for `https` and `h2`; `None` speaks plain TCP.
    pub tls: Option<&'a Arc<LiveTls>>,
    /// TCP connect (and TLS handshake) timeout.
    pub connect_timeout: Duration,
    /// Time to wait for the response head.
    pub read_timeout: Duration,
    /// Forwarding headers the send sets (`None`: the request's map has them already): written
    /// into the head by duet's client, set in the map for the others.
    pub forwarding: Option<Forwarding<'a>>,
}

impl Peer<'_> {
    fn key(&self) -> PoolKey {
        (self.addr, self.tls.map_or(0, |t| t.key()))
    }
}

/// A connection to send one request on.
enum Conn {
    /// HTTP/1.1: one request at a time, back to the pool when the response body is done.
    H1(http1::SendRequest<UpstreamBody>),
    /// HTTP/2: shared by every request to the address.
    H2(h2::H2Conn),
}

/// The body of an upstream response: hyper's, or one read by duet's own client.
#[derive(Debug)]
pub enum UpstreamIncoming {
    /// From hyper's HTTP/1.1 or HTTP/2 client.
    Hyper(Incoming),
    /// From duet's HTTP/1.1 client.
    Client(client::ClientBody),
}

impl Body for UpstreamIncoming {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        fn boxed<E: std::error::Error + Send + Sync + 'static>(
            e: E,
        ) -> Box<dyn std::error::Error + Send + Sync> {
            Box::new(e)
        }
        match self.get_mut() {
            UpstreamIncoming::Hyper(body) => std::pin::Pin::new(body)
                .poll_frame(cx)
                .map(|frame| frame.map(|f| f.map_err(boxed))),
            UpstreamIncoming::Client(body) => std::pin::Pin::new(body)
                .poll_frame(cx)
                .map(|frame| frame.map(|f| f.map_err(boxed))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            UpstreamIncoming::Hyper(body) => body.is_end_stream(),
            UpstreamIncoming::Client(body) => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        match self {
            UpstreamIncoming::Hyper(body) => body.size_hint(),
            UpstreamIncoming::Client(body) => body.size_hint(),
        }
    }
}

/// A response from a peer.
#[derive(Debug)]
pub(crate) struct Sent {
    /// The response (an HTTP/2 one relabelled HTTP/1.1, as the client side frames it).
    pub response: Response<UpstreamIncoming>,
    /// Whether a new connection was made for it (the address works: its failures are cleared).
    pub connected: bool,
    /// The HTTP/1.1 connection, back to the pool when the response body is done.
    pub pool_return: Option<PoolReturn>,
    /// The response head comes without its hop-by-hop fields (duet's client left them out).
    pub stripped: bool,
}

/// Why a send gave no response.
#[derive(Debug)]
pub(crate) enum SendError {
    /// The request was not written (it is back in the caller's slot); it can go elsewhere.
    Unsent(io::Error),
    /// The request may have reached the upstream; answer the client with this.
    Failed(ProxyError),
}

/// What it takes to send a bodyless idempotent request again.
#[derive(Debug)]
pub(crate) struct Replay {
    parts: http::request::Parts,
}

impl Replay {
    /// The replay of a request, when it is idempotent and has no body.
    pub(crate) fn of(request: &Request<UpstreamBody>) -> Option<Replay> {
        if !request.method().is_idempotent() || !request.body().is_end_stream() {
            return None;
        }
        let mut parts = Request::new(()).into_parts().0;
        parts.method = request.method().clone();
        parts.uri = request.uri().clone();
        parts.version = request.version();
        parts.headers = request.headers().clone();
        Some(Replay { parts })
    }

    fn into_request(self) -> Request<UpstreamBody> {
        Request::from_parts(self.parts, Either::Right(Empty::new()))
    }
}

/// Whether a failed send got nothing back: the connection closed or broke before a response
/// (not a malformed response, a timeout or duet's own error).
fn unanswered(error: &hyper::Error) -> bool {
    !(error.is_parse() || error.is_parse_status() || error.is_timeout() || error.is_user())
}

/// What the retry policy makes of a failed send.
#[derive(Debug)]
enum Retry {
    /// Send this again, over a fresh connection.
    Again(Request<UpstreamBody>),
    /// Nothing was written, and the connection was fresh: the address failed.
    Unsent(Request<UpstreamBody>, io::Error),
    /// The request may have been written: the client gets the error.
    Failed(hyper::Error),
}

/// The one retry/replay policy of both protocols. A reused connection that turns out closed
/// before the request was written is replaced by a fresh one to the same address. So is one that
/// fails before any response byte when the request is idempotent and bodyless (the upstream
/// closed an idle connection as we reused it, or refused the stream on GOAWAY): that request is
/// replayed once, as nginx and Go's client do. When a fresh connection fails that way too (a pod
/// whose server exits as it terminates), the address failed: such a request goes on to the next
/// address or target, as nginx's default `proxy_next_upstream error` does; any other is answered.
fn after_failure(
    mut error: TrySendError<Request<UpstreamBody>>,
    fresh: bool,
    replay: &mut Option<Replay>,
) -> Retry {
    match error.take_message() {
        Some(unsent) if !fresh => Retry::Again(unsent),
        Some(unsent) => Retry::Unsent(
            unsent,
            io::Error::new(io::ErrorKind::ConnectionAborted, error.into_error()),
        ),
        None => match replay.take() {
            Some(again) if !fresh => {
                tracing::trace!(error = %error.error(), "Replaying on a fresh connection");
                Retry::Again(again.into_request())
            }
            Some(again) if unanswered(error.error()) => Retry::Unsent(
                again.into_request(),
                io::Error::new(io::ErrorKind::ConnectionAborted, error.into_error()),
            ),
            _ => Retry::Failed(error.into_error()),
        },
    }
}

/// The send-timeout watch of an upstream request's body, if its route sets one.
fn body_watch(request: &Request<UpstreamBody>) -> Option<Arc<SendWatch>> {
    match request.body() {
        Either::Left(limited) => limited.watch(),
        Either::Right(_) => None,
    }
}

/// A send under the peer's read timeout and the body's send timeout (`proxy-send-timeout`:
/// the upstream stopped taking the body); `None` when either runs out.
async fn watched<F: Future>(peer: &Peer<'_>, watch: Arc<SendWatch>, send: F) -> Option<F::Output> {
    timeout(peer.read_timeout, send_watch::guard(Some(watch), send))
        .await
        .ok()
        .flatten()
}

/// An empty slot: nothing was sent (a caller's mistake, not the peer's).
fn no_request() -> SendError {
    SendError::Unsent(io::Error::other("no request to send"))
}

/// The upstream connection pools, shared by every listener.
#[derive(Debug)]
pub(crate) struct Upstream {
    h1: Arc<h1::Pool<client::ClientConn>>,
    h2: h2::Pool,
    idle_timeout: Duration,
}

impl Upstream {
    /// Pools that let connections idle for `idle_timeout`, at most `idle_per_addr` idle HTTP/1.1
    /// ones per address.
    pub(crate) fn new(idle_timeout: Duration, idle_per_addr: usize) -> Upstream {
        Upstream {
            h1: Arc::new(h1::Pool::new(idle_timeout, idle_per_addr)),
            h2: h2::Pool::default(),
            idle_timeout,
        }
    }

    /// Drops closed and expired connections.
    pub(crate) fn reap(&self) {
        self.h1.reap();
        self.h2.reap(self.idle_timeout);
    }

    /// Sends the request in `slot` to a peer over a pooled connection, or a new one when there is
    /// none, and applies [`after_failure`] when the send fails. After `Unsent` the request is back
    /// in `slot`, to be sent elsewhere. (The request stays in the caller's slot until hyper takes
    /// it: no future in between copies it.)
    pub(crate) async fn send(
        &self,
        peer: &Peer<'_>,
        slot: &mut Option<Request<UpstreamBody>>,
    ) -> Result<Sent, SendError> {
        let Some(request) = slot.as_ref() else {
            return Err(no_request());
        };
        if !peer.protocol.is_h2() && peer.tls.is_none() && client::takes(request) {
            return self.send_by_client(peer, slot).await;
        }
        // Boxed: hyper's futures (both protocols, under a timer or the send watch) are 1,500
        // bytes more than duet's client's, and inline they would size every request's future
        // (copied whole on each move: into hyper's task, its slot, the HTTP/2 stream's box).
        Box::pin(self.send_by_hyper(peer, slot)).await
    }

    /// [`Upstream::send`] through hyper's connections (HTTP/2, TLS, a request with a body or an
    /// upgrade).
    async fn send_by_hyper(
        &self,
        peer: &Peer<'_>,
        slot: &mut Option<Request<UpstreamBody>>,
    ) -> Result<Sent, SendError> {
        let Some(request) = slot.as_mut() else {
            return Err(no_request());
        };
        if let Some(forwarding) = &peer.forwarding {
            forwarding.apply(request.headers_mut());
        }
        if peer.protocol.is_h2() {
            h2::to_h2_request(request, peer.tls.is_some());
        } else {
            chunk_unknown_length_get(request);
        }
        let (mut conn, mut fresh) = match self.checkout(peer) {
            Some(conn) => (conn, false),
            // Boxed, here and below: a connect (TCP, TLS and HTTP handshakes) is rare on pooled
            // connections, and inline its state would size every request's future.
            None => (
                Box::pin(self.connect(peer))
                    .await
                    .map_err(SendError::Unsent)?,
                true,
            ),
        };
        let mut replay = slot.as_ref().and_then(Replay::of);
        loop {
            let request = slot.take().ok_or_else(no_request)?;
            // Each protocol's future awaited in place: no wrapper moves the request or response
            // (but for a body watched for its send timeout).
            let sent = match (&mut conn, body_watch(&request)) {
                (Conn::H1(s), None) => timeout(peer.read_timeout, s.try_send_request(request))
                    .await
                    .ok(),
                (Conn::H2(c), None) => {
                    timeout(peer.read_timeout, c.sender.try_send_request(request))
                        .await
                        .ok()
                }
                (Conn::H1(s), Some(w)) => watched(peer, w, s.try_send_request(request)).await,
                (Conn::H2(c), Some(w)) => {
                    watched(peer, w, c.sender.try_send_request(request)).await
                }
            };
            let error = match sent {
                None => return Err(SendError::Failed(ProxyError::Timeout)),
                Some(Ok(response)) => return Ok(self.sent(peer, conn, response, fresh)),
                Some(Err(error)) => error,
            };
            let retry = after_failure(error, fresh, &mut replay);
            if let (Conn::H2(failed), Retry::Again(_) | Retry::Unsent(..)) = (&conn, &retry) {
                // Judged dead: the replay, and every later request, connects afresh.
                self.h2.forget(peer.key(), failed);
            }
            match retry {
                Retry::Again(again) => {
                    // Kept for the fresh connection too: if it fails unanswered, the request
                    // goes on to the next address.
                    replay = Replay::of(&again);
                    *slot = Some(again);
                }
                Retry::Unsent(unsent, e) => {
                    *slot = Some(unsent);
                    return Err(SendError::Unsent(e));
                }
                Retry::Failed(e) => return Err(SendError::Failed(ProxyError::Upstream(e))),
            }
            (conn, fresh) = (
                Box::pin(self.connect(peer))
                    .await
                    .map_err(SendError::Unsent)?,
                true,
            );
        }
    }

    /// [`Upstream::send`] by duet's own client, for a bodyless GET or HEAD to a plain HTTP/1.1
    /// peer: the request stays in `slot` (its head is encoded again for a retry, nothing is
    /// cloned for a replay). A reused connection that fails (closed as it was reused, or before
    /// the response) is replaced by a fresh one once; a fresh one that gets nothing back sends
    /// the request on to the next address, any other failure is the answer.
    async fn send_by_client(
        &self,
        peer: &Peer<'_>,
        slot: &mut Option<Request<UpstreamBody>>,
    ) -> Result<Sent, SendError> {
        let key = peer.key();
        let (mut conn, mut fresh) = match self.h1.take_client(key) {
            Some(conn) => (conn, false),
            None => (
                Box::pin(client::connect(peer.addr, peer.connect_timeout))
                    .await
                    .map_err(SendError::Unsent)?,
                true,
            ),
        };
        loop {
            let asked = match slot.as_ref() {
                Some(request) => conn.prepare(request, peer.forwarding.as_ref()),
                None => return Err(no_request()),
            };
            let error = match timeout(peer.read_timeout, conn.exchange(asked)).await {
                Err(_elapsed) => return Err(SendError::Failed(ProxyError::Timeout)),
                Ok(Ok(head)) => {
                    let response = head.into_response(self.h1.clone(), key);
                    return Ok(Sent {
                        response: response.map(UpstreamIncoming::Client),
                        connected: fresh,
                        pool_return: None,
                        stripped: true,
                    });
                }
                Ok(Err(error)) => error,
            };
            if let ClientError::Switched = error {
                // A response, not a failure: answered as an unasked upgrade, never retried.
                return Err(SendError::Failed(ProxyError::UnaskedUpgrade));
            }
            if fresh {
                return Err(match error {
                    // Nothing came back to this bodyless GET or HEAD: the address failed, and
                    // the request goes on to the next one (see `after_failure`).
                    ClientError::Write(e) | ClientError::Read(e) => SendError::Unsent(e),
                    other => SendError::Failed(ProxyError::Client(other)),
                });
            }
            tracing::trace!(%error, "Replaying on a fresh connection");
            conn = Box::pin(client::connect(peer.addr, peer.connect_timeout))
                .await
                .map_err(SendError::Unsent)?;
            fresh = true;
        }
    }

    /// An idle (HTTP/1.1) or open (HTTP/2) connection to the peer.
    fn checkout(&self, peer: &Peer<'_>) -> Option<Conn> {
        if peer.protocol.is_h2() {
            self.h2.get(peer.key()).map(Conn::H2)
        } else {
            self.h1.take(peer.key()).map(Conn::H1)
        }
    }

    /// A new connection to the peer (HTTP/2: or the one another request is making).
    async fn connect(&self, peer: &Peer<'_>) -> io::Result<Conn> {
        let timeout = peer.connect_timeout;
        if peer.protocol.is_h2() {
            return Ok(Conn::H2(
                self.h2.connect(peer.key(), peer.tls, timeout).await?,
            ));
        }
        let tls = peer.tls.map(|t| &**t);
        Ok(Conn::H1(connect::connect(peer.addr, tls, timeout).await?))
    }

    /// The response of a connection: an HTTP/1.1 one goes back to the pool with its body (not
    /// after a 101: the connection becomes the tunnel); an HTTP/2 one stays shared.
    #[inline(always)] // Called once; inlined, the response is not copied into and out of it.
    fn sent(&self, peer: &Peer<'_>, conn: Conn, response: Response<Incoming>, fresh: bool) -> Sent {
        let mut response = response.map(UpstreamIncoming::Hyper);
        let pool_return = match conn {
            Conn::H1(sender) => (response.status() != StatusCode::SWITCHING_PROTOCOLS)
                .then(|| PoolReturn::new(self.h1.clone(), peer.key(), sender)),
            Conn::H2(_) => {
                *response.version_mut() = Version::HTTP_11;
                None
            }
        };
        Sent {
            response,
            connected: fresh,
            pool_return,
            stripped: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::header::{self, HeaderMap, HeaderName, HeaderValue};

    #[test]
    fn a_scan_of_few_names_and_a_lookup_of_many_agree() {
        let asked = [&header::UPGRADE, &header::CONTENT_LENGTH];
        for size in [
            0,
            1,
            SCANNED_FIELDS - 1,
            SCANNED_FIELDS,
            SCANNED_FIELDS + 1,
            40,
        ] {
            for with in [None, Some(&header::UPGRADE), Some(&header::CONTENT_LENGTH)] {
                let mut h = HeaderMap::new();
                for i in 0..size {
                    let name = HeaderName::from_bytes(format!("x-f{i}").as_bytes()).unwrap();
                    h.insert(name, HeaderValue::from_static("1"));
                }
                h.insert(header::TRANSFER_ENCODING, HeaderValue::from_static("x"));
                if let Some(name) = with {
                    h.insert(name.clone(), HeaderValue::from_static("1"));
                }
                let want = asked.iter().any(|n| h.contains_key(*n));
                assert_eq!(want, with.is_some());
                assert_eq!(has_any_field(&h, asked), want, "{size} {with:?}");
            }
        }
    }
}
