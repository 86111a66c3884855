//! HTTP/2 upstreams: one multiplexed connection per address and TLS settings (cleartext prior
//! knowledge or TLS with ALPN `h2`), shared by every request to it and replaced when it closes,
//! and the HTTP/2 form of an upstream request.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::future::{BoxFuture, FutureExt, Shared};
use http::header::{self, HeaderMap, HeaderValue};
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{Request, Uri, Version};
use hyper::client::conn::http2;

use super::tls::LiveTls;
use super::{connect, PoolKey, PoolMap, UpstreamBody};

/// An HTTP/2 connection: its sender and its number in the pool, which tells it from a later
/// connection to the same address (so a failed one is let go, never its replacement).
#[derive(Clone)]
pub(super) struct H2Conn {
    pub(super) sender: http2::SendRequest<UpstreamBody>,
    id: u64,
}

/// A pooled HTTP/2 connection and when a request last took it.
type PooledH2 = (H2Conn, Instant);

/// A connection attempt that every request arriving meanwhile waits for.
type Connecting = Shared<BoxFuture<'static, Result<H2Conn, Arc<io::Error>>>>;

/// One multiplexed HTTP/2 connection per upstream address and TLS settings, shared by every
/// request to that address; a closed connection (GOAWAY, reset) is replaced on the next request,
/// and one a request failed on is let go at once (see [`Pool::forget`]). Requests that find no
/// connection while one is being made wait for that one. A connection no request has used for
/// the idle timeout is let go (its open streams still finish).
#[derive(Default)]
pub(super) struct Pool {
    conns: Mutex<PoolMap<PooledH2>>,
    connecting: Mutex<PoolMap<Connecting>>,
    /// The number of the next connection made.
    next_id: AtomicU64,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let conns = self.conns.lock().map_or(0, |c| c.len());
        f.debug_struct("H2Pool").field("conns", &conns).finish()
    }
}

impl Pool {
    /// The open connection to `key`, if there is one.
    pub(super) fn get(&self, key: PoolKey) -> Option<H2Conn> {
        let mut conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        let (conn, used) = conns.get_mut(&key).filter(|(c, _)| !c.sender.is_closed())?;
        *used = Instant::now();
        Some(conn.clone())
    }

    fn put(&self, key: PoolKey, conn: H2Conn) {
        let mut conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        conns.insert(key, (conn, Instant::now()));
    }

    /// Lets go of `conn`, which a request failed on, if the pool still offers it for `key`: the
    /// next request (a replay too) connects afresh instead of taking a connection whose end its
    /// own task has not marked yet. A newer connection to the key stays.
    pub(super) fn forget(&self, key: PoolKey, conn: &H2Conn) {
        let mut conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        if conns.get(&key).is_some_and(|(c, _)| c.id == conn.id) {
            conns.remove(&key);
        }
    }

    /// Drops closed connections, and lets go of those unused for `max_idle` (which closes them
    /// once their open streams are done).
    pub(super) fn reap(&self, max_idle: Duration) {
        let mut conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        conns.retain(|_, (c, used)| !c.sender.is_closed() && used.elapsed() < max_idle);
    }

    /// A new connection to the key's address, or the one another request is making right now.
    pub(super) async fn connect(
        &self,
        key: PoolKey,
        tls: Option<&Arc<LiveTls>>,
        timeout: Duration,
    ) -> io::Result<H2Conn> {
        let tls = tls.cloned();
        self.connect_with(key, move || {
            async move { connect::connect(key.0, tls.as_deref(), timeout).await }.boxed()
        })
        .await
    }

    /// Joins the attempt in progress for `key`, or starts one with `make`. However the wait ends
    /// (connected, failed, cancelled, or the attempt panicked), the attempt is no longer offered
    /// to later requests: the next one tries again.
    async fn connect_with<F>(&self, key: PoolKey, make: F) -> io::Result<H2Conn>
    where
        F: FnOnce() -> BoxFuture<'static, io::Result<http2::SendRequest<UpstreamBody>>>,
    {
        let attempt = {
            let mut connecting = self.connecting.lock().unwrap_or_else(|e| e.into_inner());
            // A request that found no connection may get here after another one's attempt has
            // finished and left the table: the connection it made is in the pool by now (put
            // before the attempt is forgotten), and is shared rather than doubled.
            if let Some(conn) = self.get(key) {
                return Ok(conn);
            }
            connecting
                .entry(key)
                .or_insert_with(|| {
                    // Numbered as the attempt starts: every request waiting for it gets the same.
                    let id = self.next_id.fetch_add(1, Ordering::Relaxed);
                    make()
                        .map(move |r| r.map(|sender| H2Conn { sender, id }).map_err(Arc::new))
                        .boxed()
                        .shared()
                })
                .clone()
        };
        let _forget = ForgetAttempt {
            pool: self,
            key,
            attempt: attempt.clone(),
        };
        let result = attempt.await;
        if let Ok(conn) = &result {
            self.put(key, conn.clone());
        }
        result.map_err(|e| io::Error::new(e.kind(), e.to_string()))
    }
}

/// Removes a connection attempt from the pool's table when its waiter is done with it, even by
/// unwinding or cancellation, so no failed or panicked attempt stays behind.
struct ForgetAttempt<'a> {
    pool: &'a Pool,
    key: PoolKey,
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
pub(super) fn to_h2_request(request: &mut Request<UpstreamBody>, tls: bool) {
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
    own_values(request.headers_mut());
}

/// Gives header values that an HTTP/2 connection's HPACK table may keep an allocation of their
/// own, one for all. The table keeps the values it indexes for as long as the connection lives,
/// and a value read by another connection shares the buffer that connection read it into (8 KiB
/// and more): a response's values for an HTTP/2 client share the upstream's read buffer, a
/// request's values for an HTTP/2 upstream the client's. Shared, they keep a whole read buffer
/// per idle HTTP/2 client, and per response whose values it indexed on a busy one (measured with
/// `idle-conns.sh` `KINDS=h2-tls-busy`: 311.5 KiB per connection shared, 56.5 KiB copied).
/// HTTP/1.x drops the values once written and HTTP/3's QPACK (static table only) keeps none:
/// they go as they are.
pub(crate) fn own_values(headers: &mut HeaderMap) {
    let total = headers.values().map(HeaderValue::len).sum();
    let mut all = bytes::BytesMut::with_capacity(total);
    for value in headers.values() {
        all.extend_from_slice(value.as_bytes());
    }
    let all = all.freeze();
    let mut at = 0;
    for value in headers.values_mut() {
        let end = at + value.len();
        // The same bytes, valid as they were: the check passes, and `value` stays if not.
        if let Ok(mut own) = HeaderValue::from_maybe_shared(all.slice(at..end)) {
            own.set_sensitive(value.is_sensitive());
            *value = own;
        }
        at = end;
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
    use crate::table::{Family, UpstreamProtocol};
    use crate::upstream::{Peer, Upstream};
    use bytes::Bytes;
    use http::Response;
    use hyper_util::rt::{TokioExecutor, TokioIo};
    use std::net::SocketAddr;
    use tokio::net::TcpStream;

    /// An h2c peer at `addr`.
    fn peer(addr: SocketAddr, timeout: Duration) -> Peer<'static> {
        Peer {
            addr,
            family: Family::of(&addr),
            protocol: UpstreamProtocol::H2c,
            tls: None,
            connect_timeout: timeout,
            read_timeout: timeout,
            forwarding: None,
        }
    }

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
            let upstream = Upstream::new(Duration::from_secs(60), 64);
            let request = Request::builder()
                .uri("/")
                .header(header::HOST, "h2.test")
                .body(UpstreamBody::Right(http_body_util::Empty::new()))
                .unwrap();
            let second = Duration::from_secs(5);
            let Ok(sent) = upstream.send(&peer(addr, second), &mut Some(request)).await else {
                panic!("request to {addr} failed");
            };
            let (res, fresh) = (sent.response, sent.connected);
            assert!(fresh);
            // Idle for "longer than the timeout" while a stream is still open.
            upstream.h2.reap(Duration::ZERO);
            assert!(upstream.h2.get((addr, 0)).is_none(), "let go");
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
    async fn a_connection_made_meanwhile_is_shared_not_doubled() {
        for ip in ["127.0.0.1", "::1"] {
            let (addr, go, _closed) = slow_server(ip.parse().unwrap()).await;
            let upstream = Upstream::new(Duration::from_secs(60), 64);
            let second = Duration::from_secs(5);
            // One request connects; its attempt is done and forgotten.
            let first = upstream.h2.connect((addr, 0), None, second).await;
            let first = first.unwrap_or_else(|e| panic!("{ip}: {e}"));
            // A request that looked before that connection was pooled now asks to connect: it
            // gets the pooled one, not a second connection.
            let raced = upstream
                .h2
                .connect_with((addr, 0), || {
                    async { Err(io::Error::other("a second connection")) }.boxed()
                })
                .await;
            let raced = raced.unwrap_or_else(|e| panic!("{ip}: {e}"));
            assert_eq!(raced.id, first.id, "{ip}: the same connection");
            assert!(raced.sender.is_ready() && !raced.sender.is_closed(), "{ip}");
            drop((first, raced));
            go.notify_one();
        }
    }

    #[tokio::test]
    async fn a_panicked_h2_connect_leaves_nothing_behind() {
        for ip in ["127.0.0.1", "::1"] {
            let (addr, go, _closed) = slow_server(ip.parse().unwrap()).await;
            let upstream = Arc::new(Upstream::new(Duration::from_secs(60), 64));
            let p = upstream.clone();
            let panicked = tokio::spawn(async move {
                p.h2.connect_with((addr, 0), || async { panic!("connect panicked") }.boxed())
                    .await
            })
            .await;
            assert!(panicked.is_err_and(|e| e.is_panic()), "{ip}");
            let failed = upstream
                .h2
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
                upstream
                    .send(&peer(addr, second), &mut Some(request))
                    .await
                    .map(|sent| (sent.response.status(), sent.connected))
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

    /// An HTTP/2 frame's head and payload.
    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let len = u32::try_from(payload.len()).unwrap().to_be_bytes();
        let mut frame = vec![len[1], len[2], len[3], kind, flags];
        frame.extend_from_slice(&stream.to_be_bytes());
        frame.extend_from_slice(payload);
        frame
    }

    /// An h2c peer that refuses (`RST_STREAM` `REFUSED_STREAM`) the second stream of its first
    /// connection, keeping that connection open, and answers every other stream `200`. Sends
    /// (connection number, stream) for each request it reads.
    async fn refusing_server(
        ip: std::net::IpAddr,
    ) -> (
        SocketAddr,
        tokio::sync::mpsc::UnboundedReceiver<(usize, u32)>,
    ) {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let listener = tokio::net::TcpListener::bind((ip, 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (seen_tx, seen) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            for number in 0.. {
                let (mut tcp, _) = listener.accept().await.unwrap();
                let seen = seen_tx.clone();
                tokio::spawn(async move {
                    let mut preface = [0u8; 24];
                    tcp.read_exact(&mut preface).await?;
                    tcp.write_all(&frame(0x4, 0, 0, &[])).await?;
                    let mut streams = 0;
                    loop {
                        let (kind, flags, stream, _) = read_frame(&mut tcp).await?;
                        let reply = match kind {
                            // SETTINGS (not an ACK): acknowledged.
                            0x4 if flags & 0x1 == 0 => frame(0x4, 0x1, 0, &[]),
                            // HEADERS: a request.
                            0x1 => {
                                streams += 1;
                                let _ = seen.send((number, stream));
                                if number == 0 && streams == 2 {
                                    frame(0x3, 0, stream, &7u32.to_be_bytes())
                                } else {
                                    // `:status: 200` (static table entry 8), ending the stream.
                                    frame(0x1, 0x5, stream, &[0x88])
                                }
                            }
                            _ => continue,
                        };
                        tcp.write_all(&reply).await?;
                    }
                    #[allow(unreachable_code)]
                    Ok::<_, io::Error>(())
                });
            }
        });
        (addr, seen)
    }

    #[tokio::test]
    async fn a_replay_goes_over_a_new_connection_and_the_failed_one_is_not_offered_again() {
        for ip in ["127.0.0.1", "::1"] {
            let (addr, mut seen) = refusing_server(ip.parse().unwrap()).await;
            let upstream = Upstream::new(Duration::from_secs(60), 64);
            let peer = peer(addr, Duration::from_secs(5));
            let get = || {
                Request::builder()
                    .uri("/")
                    .header(header::HOST, "h2.test")
                    .body(UpstreamBody::Right(http_body_util::Empty::new()))
                    .unwrap()
            };
            let send = async || {
                let sent = upstream.send(&peer, &mut Some(get())).await;
                let Ok(sent) = sent else {
                    panic!("{ip}: the request failed");
                };
                assert_eq!(sent.response.status(), http::StatusCode::OK, "{ip}");
                sent.connected
            };
            assert!(send().await, "{ip}: the first request connects");
            assert_eq!(seen.recv().await, Some((0, 1)));
            // The second takes the pooled connection, where its stream is refused: it is replayed
            // over a new connection (the refused one is still open, and not closed by its task).
            assert!(send().await, "{ip}: the replay connects");
            assert_eq!(seen.recv().await, Some((0, 3)));
            assert_eq!(
                seen.recv().await,
                Some((1, 1)),
                "{ip}: the replay's connection"
            );
            // Later requests share the new connection; the refused one is not offered again.
            assert!(!send().await, "{ip}: reused");
            assert_eq!(seen.recv().await, Some((1, 3)), "{ip}");
        }
    }

    /// Reads one HTTP/2 frame: (type, flags, stream, payload).
    async fn read_frame(tcp: &mut TcpStream) -> io::Result<(u8, u8, u32, Vec<u8>)> {
        use tokio::io::AsyncReadExt as _;
        let mut head = [0u8; 9];
        tcp.read_exact(&mut head).await?;
        let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
        let mut payload = vec![0u8; len];
        tcp.read_exact(&mut payload).await?;
        let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        Ok((head[3], head[4], stream, payload))
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
            let connecting = tokio::spawn(connect::connect::<http2::SendRequest<UpstreamBody>>(
                addr,
                None,
                Duration::from_secs(5),
            ));
            let (mut tcp, _) = listener.accept().await.unwrap();
            let mut preface = [0u8; 24];
            tcp.read_exact(&mut preface).await.unwrap();
            assert_eq!(&preface, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");
            let (kind, _, _, settings) = read_frame(&mut tcp).await.unwrap();
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
            let (kind, _, stream, increment) = read_frame(&mut tcp).await.unwrap();
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

    #[test]
    fn a_request_for_an_h2_upstream_keeps_no_client_read_buffer_alive() {
        // The client connection's read buffer, a value of the request sharing it: the upstream
        // connection's HPACK table keeps what it indexes, the request's values included.
        let read = bytes::Bytes::from(vec![b'a'; 8192]);
        let mut req = Request::builder()
            .uri("/")
            .header(header::HOST, "a.test")
            .body(UpstreamBody::Right(http_body_util::Empty::new()))
            .unwrap();
        let shared = HeaderValue::from_maybe_shared(read.slice(0..16)).unwrap();
        req.headers_mut().insert(header::USER_AGENT, shared);
        to_h2_request(&mut req, false);
        assert!(
            read.is_unique(),
            "the request's values still share the read buffer"
        );
        assert_eq!(req.headers()[header::USER_AGENT], "a".repeat(16));
    }

    #[test]
    fn values_for_an_http2_client_keep_no_upstream_read_buffer_alive() {
        // An upstream connection's read buffer, the response head in it, values sharing it.
        let read = bytes::Bytes::from(
            b"text/plain\0secret\0abc"
                .iter()
                .copied()
                .chain(std::iter::repeat_n(b'.', 8192))
                .collect::<Vec<u8>>(),
        );
        let mut h = HeaderMap::new();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_maybe_shared(read.slice(0..10)).unwrap(),
        );
        let mut secret = HeaderValue::from_maybe_shared(read.slice(11..17)).unwrap();
        secret.set_sensitive(true);
        h.insert(header::SET_COOKIE, secret);
        h.append(
            header::SET_COOKIE,
            HeaderValue::from_maybe_shared(read.slice(18..21)).unwrap(),
        );
        h.insert(header::SERVER, HeaderValue::from_static("duet"));
        assert!(!read.is_unique());
        own_values(&mut h);
        // What an HPACK table keeps of the values no longer holds the 8 KiB buffer.
        assert!(read.is_unique(), "the values still share the read buffer");
        assert_eq!(h[header::CONTENT_TYPE], "text/plain");
        let cookies: Vec<_> = h.get_all(header::SET_COOKIE).iter().collect();
        assert_eq!(cookies, ["secret", "abc"]);
        assert!(cookies[0].is_sensitive() && !cookies[1].is_sensitive());
        assert_eq!(h[header::SERVER], "duet");
    }
}
