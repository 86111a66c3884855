//! duet's own HTTP/1.1 client for the common request: a bodyless GET or HEAD over plain TCP. The
//! request head is written with one write from a reused buffer, the response head is parsed with
//! `httparse`, and the body ([`ClientBody`]) is read by the request's own task (no connection
//! task, no channel), framed by `Content-Length`, chunked coding or the connection's close. The
//! connection goes back to the pool when the body ends cleanly, never after a framing error, a
//! close-delimited body or `Connection: close`. Every byte from the pod is hostile: a head over
//! [`UPSTREAM_H1_BUF`], an invalid status line or header, obs-fold, differing or signed
//! `Content-Length`s, an unasked 101 or a bad chunk is an error (502 before the head is relayed,
//! an aborted body after), never a panic; `Transfer-Encoding` overrides `Content-Length`, and a
//! connection that carried both is closed. Other requests (bodies, upgrades, TLS) keep hyper's
//! client ([`super::h1`]).

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode, Version};
use hyper::body::{Body, Frame, SizeHint};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use super::h1::{ClientIdle, Pool};
use super::{PoolKey, UpstreamBody};
pub use crate::error::ClientError;
use crate::forwarded::Forwarding;
use crate::h1::{self, ResponseFields as Fields};
pub(crate) use crate::h1::{is_connection_option, role, Role};
use crate::limits::UPSTREAM_H1_BUF;
use crate::names::{CONNECTION, CONTENT_LENGTH, TRANSFER_ENCODING, UPGRADE};

/// Bytes asked of the socket per read.
const READ_SIZE: usize = 16 * 1024;

/// Bytes of a connection's first buffer for a response (the buffer is let go when the
/// connection goes back to the pool, its head and body sharing it): under jemalloc's smallest
/// "large" size (16 KiB), whose allocation and release cost about 2,000 instructions per
/// response against about 100 for a small one. A response that does not fit reads on in
/// [`READ_SIZE`] steps.
const FIRST_READ_SIZE: usize = 8 * 1024;

/// Whether a request takes this client: HTTP/1.1, GET or HEAD, no body, no upgrade, over plain
/// TCP (the caller checks the peer).
pub(super) fn takes(request: &Request<UpstreamBody>) -> bool {
    matches!(request.method().as_str(), "GET" | "HEAD")
        && request.version() == Version::HTTP_11
        && request.body().is_end_stream()
        && !super::has_any_field(
            request.headers(),
            [&UPGRADE, &CONTENT_LENGTH, &TRANSFER_ENCODING],
        )
}

/// Read buffers let go by responses whose connection went back to the pool, kept per thread
/// (at most [`SPARE_BUFFERS`], oldest first) for the next response to read into: once the bytes
/// the last response shared out of one (its head's values, its body's chunks) are all dropped,
/// it is taken back in place, without the allocation and release of a new buffer per response
/// (about 900 instructions). A buffer whose bytes are still held elsewhere is never written
/// over (see [`take_spare`]). An idle pooled connection holds no buffer; a thread at most these
/// few.
const SPARE_BUFFERS: usize = 8;

thread_local! {
    static SPARES: std::cell::RefCell<std::collections::VecDeque<BytesMut>> =
        const { std::cell::RefCell::new(std::collections::VecDeque::new()) };
}

/// A buffer for a connection's first read of a response: the oldest spare when nothing else
/// holds its bytes any more (taken back whole, `try_reclaim`), else a new, empty one (the spare
/// is let go: its allocation is freed with the last of its bytes, as without spares).
fn take_spare() -> BytesMut {
    let spare = SPARES
        .try_with(|spares| spares.borrow_mut().pop_front())
        .ok()
        .flatten();
    match spare {
        Some(mut buf) => {
            if buf.try_reclaim(FIRST_READ_SIZE) {
                buf
            } else {
                BytesMut::new()
            }
        }
        None => BytesMut::new(),
    }
}

/// Keeps the (empty) rest of a response's buffer for [`take_spare`], unless enough are kept.
fn keep_spare(buf: BytesMut) {
    let _ = SPARES.try_with(|spares| {
        let mut spares = spares.borrow_mut();
        if spares.len() < SPARE_BUFFERS {
            spares.push_back(buf);
        }
    });
}

/// An idle or busy upstream connection of this client.
pub(crate) struct ClientConn {
    stream: TcpStream,
    /// Bytes read and not yet used.
    buf: BytesMut,
    /// The request head being written (kept for its capacity).
    head: Vec<u8>,
    /// Where the response head's headers are (kept for its capacity).
    spans: Vec<Span>,
}

impl fmt::Debug for ClientConn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientConn").finish_non_exhaustive()
    }
}

/// What the exchange needs to know of the request.
#[derive(Clone, Copy, Debug)]
pub(super) struct Asked {
    /// It is a HEAD request (the response has no body).
    head: bool,
    /// It says `Connection: close`.
    close: bool,
}

/// A response head and the connection its body comes on.
pub(super) struct Head {
    pub response: Response<()>,
    framing: Framing,
    reusable: bool,
    conn: ClientConn,
}

impl Head {
    /// The response with its body, which returns the connection to `pool` when it ends cleanly.
    pub(super) fn into_response(
        self,
        pool: Arc<Pool<ClientConn>>,
        key: PoolKey,
    ) -> Response<ClientBody> {
        let body = ClientBody::new(self.conn, self.framing, self.reusable, pool, key);
        self.response.map(|()| body)
    }
}

/// How a response body is delimited.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Framing {
    /// No body (HEAD, 204, 304, `Content-Length: 0`).
    Empty,
    /// This many bytes more.
    Length(u64),
    /// Chunked coding, in the given state.
    Chunked(Chunk),
    /// Until the upstream closes the connection.
    Close,
}

/// Where a chunked body's reader is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Chunk {
    /// At a chunk-size line.
    Size,
    /// In a chunk's data, this many bytes more.
    Data(u64),
    /// At the CRLF after a chunk's data.
    DataEnd,
    /// In the trailer section after the last chunk.
    Trailers,
}

impl ClientIdle for ClientConn {
    fn is_idle_open(&mut self) -> bool {
        self.idle_open()
    }
}

impl ClientConn {
    /// A connection over a connected stream.
    pub(super) fn new(stream: TcpStream) -> ClientConn {
        ClientConn {
            stream,
            buf: BytesMut::new(),
            head: Vec::new(),
            spans: Vec::new(),
        }
    }

    /// Whether an idle connection can take a request: nothing came from the upstream while it
    /// was idle (no close, no stray bytes). Asks the socket only when the runtime saw it readable.
    fn idle_open(&mut self) -> bool {
        if !self.buf.is_empty() {
            return false;
        }
        let mut cx = Context::from_waker(std::task::Waker::noop());
        if self.stream.poll_read_ready(&mut cx).is_pending() {
            return true;
        }
        let mut byte = [0u8; 1];
        matches!(self.stream.try_read(&mut byte), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
    }

    /// Encodes the request's head into the connection's buffer (before any await: the request
    /// is not held across one); what [`ClientConn::exchange`] needs of it.
    pub(super) fn prepare(
        &mut self,
        request: &Request<UpstreamBody>,
        forwarding: Option<&Forwarding<'_>>,
    ) -> Asked {
        encode_head(request, forwarding, &mut self.head);
        Asked {
            head: request.method().as_str() == "HEAD",
            close: wants_close(request.headers()),
        }
    }

    /// Writes the prepared head and reads the response head (1xx responses skipped); the body
    /// follows through [`ClientBody`], which takes the connection.
    pub(super) async fn exchange(mut self, asked: Asked) -> Result<Head, ClientError> {
        self.stream
            .write_all(&self.head)
            .await
            .map_err(ClientError::Write)?;
        loop {
            let (response, fields) = self.read_head().await?;
            let status = response.status();
            if status == StatusCode::SWITCHING_PROTOCOLS {
                return Err(ClientError::Switched);
            }
            if status.is_informational() {
                continue;
            }
            let (framing, again) = framing(&response, &fields, asked.head)?;
            let reusable =
                again && !asked.close && response.version() == Version::HTTP_11 && !fields.close;
            return Ok(Head {
                response,
                framing,
                reusable,
                conn: self,
            });
        }
    }

    /// Reads until a whole response head is buffered, and takes it out of the buffer (with what
    /// its framing and hop-by-hop fields said).
    async fn read_head(&mut self) -> Result<(Response<()>, Fields), ClientError> {
        loop {
            if !self.buf.is_empty() {
                if let Some(parsed) = parse_head(&mut self.buf, &mut self.spans)? {
                    return Ok(parsed);
                }
                if self.buf.len() >= UPSTREAM_H1_BUF {
                    return Err(ClientError::HeadTooLarge);
                }
            }
            let had = self.buf.len();
            let n = std::future::poll_fn(|cx| self.poll_fill(cx))
                .await
                .map_err(ClientError::Read)?;
            if n == 0 {
                let what = if had == 0 {
                    "connection closed before a response"
                } else {
                    "connection closed within the response head"
                };
                return Err(ClientError::Read(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    what,
                )));
            }
        }
    }

    /// Reads more bytes into the buffer; 0 at the end of the stream.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        if self.buf.capacity() == 0 {
            self.buf = take_spare();
            self.buf.reserve(FIRST_READ_SIZE);
        } else if self.buf.capacity() - self.buf.len() < 1024 {
            self.buf.reserve(READ_SIZE);
        }
        // Through `AsyncRead`, not `try_read_buf`: a read shorter than the room offered tells
        // Tokio the socket is drained, so it clears the readiness. Otherwise the readiness stays
        // set after each response and `idle_open` asks the socket (an `EAGAIN` read) before the
        // connection's next request: one syscall in five per proxied request.
        tokio_util::io::poll_read_buf(Pin::new(&mut self.stream), cx, &mut self.buf)
    }
}

/// The request head, as hyper's client writes it: request line, each header as `name: value`;
/// with `forwarding`, the received forwarding headers replaced by its.
fn encode_head(
    request: &Request<UpstreamBody>,
    forwarding: Option<&Forwarding<'_>>,
    out: &mut Vec<u8>,
) {
    out.clear();
    out.extend_from_slice(request.method().as_str().as_bytes());
    out.push(b' ');
    let uri = request.uri();
    match uri.path_and_query() {
        Some(target) if uri.scheme().is_none() && uri.authority().is_none() => {
            out.extend_from_slice(target.as_str().as_bytes());
        }
        _ => {
            use std::io::Write;
            let _ = write!(out, "{uri}");
        }
    }
    out.extend_from_slice(b" HTTP/1.1\r\n");
    for (name, value) in request.headers() {
        if forwarding.is_some() && Forwarding::replaces(name) {
            continue;
        }
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if let Some(forwarding) = forwarding {
        forwarding.write(out);
    }
    out.extend_from_slice(b"\r\n");
}

/// Whether a message's `Connection` header says `close`.
fn wants_close(headers: &HeaderMap) -> bool {
    headers.get_all(&CONNECTION).iter().any(|v| {
        v.as_bytes()
            .split(|&b| b == b',')
            .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"close"))
    })
}

/// Where a header's name and value are in the head.
type Span = (usize, usize, usize, usize);

/// Whether a field (any case) is one duet writes itself on every hop: a framing field
/// (`Content-Length`, `Transfer-Encoding`) or a hop-by-hop one ([`role`]'s list). A header filter
/// naming one is refused by the controller.
pub fn is_hop_or_framing(name: &str) -> bool {
    role(name.as_bytes()) != Role::EndToEnd
}

/// A complete response head at the start of `buf`, taken out of it (header values share its
/// bytes, as hyper's do), with what its framing and hop-by-hop fields said; the map leaves those
/// out. `None` when more is needed. `spans` is scratch space, kept by the connection; the
/// parser's header array is left uninitialised (no 3 KiB cleared per response).
fn parse_head(
    buf: &mut BytesMut,
    spans: &mut Vec<Span>,
) -> Result<Option<(Response<()>, Fields)>, ClientError> {
    let mut slots = h1::header_slots();
    let (len, status, version, fields) = {
        let Some(parsed) = h1::parse_response(buf, &mut slots).map_err(ClientError::Invalid)?
        else {
            return Ok(None);
        };
        // The limit holds however the head arrived (reads of 8 KiB, then 16 KiB, can buffer
        // more than it before the head is complete).
        if parsed.len > UPSTREAM_H1_BUF {
            return Err(ClientError::HeadTooLarge);
        }
        let status =
            StatusCode::from_u16(parsed.status).map_err(|_| ClientError::Invalid("status code"))?;
        let version = if parsed.http11 {
            Version::HTTP_11
        } else {
            Version::HTTP_10
        };
        let start = buf.as_ptr() as usize;
        spans.clear();
        spans.extend(
            parsed
                .headers
                .iter()
                .filter(|h| parsed.fields.relays(h.name.as_bytes(), parsed.headers))
                .map(|h| {
                    let name = h.name.as_ptr() as usize - start;
                    let value = h.value.as_ptr() as usize - start;
                    (name, name + h.name.len(), value, value + h.value.len())
                }),
        );
        (parsed.len, status, version, parsed.fields)
    };
    let head = buf.split_to(len).freeze();
    // The map built in the response's own (empty, unallocated) one: not built beside it, moved
    // in and the empty one dropped.
    let mut response = Response::new(());
    *response.status_mut() = status;
    *response.version_mut() = version;
    let map = response.headers_mut();
    map.reserve(spans.len());
    for &(name_at, name_end, value_at, value_end) in spans.iter() {
        let name = HeaderName::from_bytes(&head[name_at..name_end])
            .map_err(|_| ClientError::Invalid("header name"))?;
        let value = HeaderValue::from_maybe_shared(head.slice(value_at..value_end))
            .map_err(|_| ClientError::Invalid("header value"))?;
        map.append(name, value);
    }
    Ok(Some((response, fields)))
}

/// The body's framing ([`h1::response_framing`]), and whether the connection may carry another
/// response after it.
fn framing(
    response: &Response<()>,
    fields: &Fields,
    head_request: bool,
) -> Result<(Framing, bool), ClientError> {
    let http11 = response.version() == Version::HTTP_11;
    let (framing, again) =
        h1::response_framing(response.status().as_u16(), http11, fields, head_request)
            .map_err(ClientError::Invalid)?;
    let framing = match framing {
        h1::Framing::Empty => Framing::Empty,
        h1::Framing::Length(n) => Framing::Length(n),
        h1::Framing::Chunked => Framing::Chunked(Chunk::Size),
        h1::Framing::Close => Framing::Close,
    };
    Ok((framing, again))
}

/// A response body read from its connection by whoever polls it; the connection goes back to
/// the pool when the body ended cleanly and the connection can be reused.
pub struct ClientBody {
    conn: Option<ClientConn>,
    /// Trailer fields of a chunked body, as they come (boxed: rare, and a map is large).
    trailers: Option<Box<HeaderMap>>,
    framing: Framing,
    reusable: bool,
    pool: Arc<Pool<ClientConn>>,
    key: PoolKey,
}

impl fmt::Debug for ClientBody {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientBody")
            .field("framing", &self.framing)
            .finish_non_exhaustive()
    }
}

impl ClientBody {
    /// The body of a response head read on `conn`.
    fn new(
        conn: ClientConn,
        framing: Framing,
        reusable: bool,
        pool: Arc<Pool<ClientConn>>,
        key: PoolKey,
    ) -> ClientBody {
        let mut body = ClientBody {
            conn: Some(conn),
            trailers: None,
            framing,
            reusable,
            pool,
            key,
        };
        if framing == Framing::Empty {
            body.finish();
        }
        body
    }

    /// The body ended cleanly: the connection goes back to the pool when it can be reused and
    /// nothing follows the response.
    fn finish(&mut self) {
        self.framing = Framing::Empty;
        if let Some(mut conn) = self.conn.take() {
            if self.reusable && conn.buf.is_empty() {
                keep_spare(std::mem::take(&mut conn.buf));
                self.pool.put_client(self.key, conn);
            }
        }
    }

    /// One trailer field line (`name: value`); as many as a head may have.
    fn add_trailer(&mut self, line: &[u8]) -> Result<(), &'static str> {
        let trailers = self.trailers.get_or_insert_with(Box::default);
        let colon = line
            .iter()
            .position(|&b| b == b':')
            .ok_or("bad trailer line")?;
        let name = HeaderName::from_bytes(&line[..colon]).map_err(|_| "bad trailer name")?;
        let value = HeaderValue::from_bytes(line[colon + 1..].trim_ascii())
            .map_err(|_| "bad trailer value")?;
        if trailers.len() >= h1::MAX_HEADERS {
            return Err("too many trailer fields");
        }
        trailers.append(name, value);
        Ok(())
    }

    fn fail(&mut self, why: &'static str) -> Poll<Option<Result<Frame<Bytes>, ClientError>>> {
        self.conn = None;
        self.framing = Framing::Empty;
        Poll::Ready(Some(Err(ClientError::Body(why))))
    }

    /// The next frame; `None` at the clean end.
    fn poll_next(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, ClientError>>> {
        loop {
            let Some(conn) = self.conn.as_mut() else {
                return Poll::Ready(None);
            };
            match self.framing {
                Framing::Empty => {
                    self.finish();
                    return Poll::Ready(None);
                }
                Framing::Length(left) | Framing::Chunked(Chunk::Data(left))
                    if !conn.buf.is_empty() =>
                {
                    let n = conn
                        .buf
                        .len()
                        .min(usize::try_from(left).unwrap_or(usize::MAX));
                    let data = conn.buf.split_to(n).freeze();
                    let left = left - n as u64;
                    self.framing = match self.framing {
                        Framing::Length(_) if left == 0 => Framing::Empty,
                        Framing::Length(_) => Framing::Length(left),
                        _ if left == 0 => Framing::Chunked(Chunk::DataEnd),
                        _ => Framing::Chunked(Chunk::Data(left)),
                    };
                    if self.framing == Framing::Empty {
                        self.finish();
                    }
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Framing::Close if !conn.buf.is_empty() => {
                    let data = conn.buf.split().freeze();
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Framing::Chunked(state) if !conn.buf.is_empty() => {
                    match step_chunked(state, &mut conn.buf) {
                        Ok(Step::Next(next)) => {
                            self.framing = Framing::Chunked(next);
                            continue;
                        }
                        Ok(Step::Trailer(line)) => match self.add_trailer(&line) {
                            Ok(()) => continue,
                            Err(why) => return self.fail(why),
                        },
                        Ok(Step::End) => {
                            self.finish();
                            return Poll::Ready(
                                self.trailers.take().map(|t| Ok(Frame::trailers(*t))),
                            );
                        }
                        Err(Need::More) => {}
                        Err(Need::Bad(why)) => return self.fail(why),
                    }
                }
                _ => {}
            }
            let conn = self.conn.as_mut().expect("checked above");
            match ready!(conn.poll_fill(cx)) {
                Ok(0) if self.framing == Framing::Close => {
                    self.conn = None;
                    self.framing = Framing::Empty;
                    return Poll::Ready(None);
                }
                Ok(0) => return self.fail("connection closed within the body"),
                Ok(_) => {}
                Err(_) => return self.fail("connection failed within the body"),
            }
        }
    }
}

/// Why a chunked step could not go on.
enum Need {
    /// More bytes are needed.
    More,
    /// The coding is broken.
    Bad(&'static str),
}

/// Longest chunk-size line (with extensions) and trailer line accepted.
const MAX_CHUNK_LINE: usize = 4096;

/// What a step of the chunked coding found.
enum Step {
    /// Go on in this state.
    Next(Chunk),
    /// A trailer field line.
    Trailer(Bytes),
    /// The empty line ending the trailer section: the body's clean end.
    End,
}

/// One step of the chunked coding over the buffered bytes.
fn step_chunked(state: Chunk, buf: &mut BytesMut) -> Result<Step, Need> {
    match state {
        Chunk::Size => {
            let line = take_line(buf)?;
            let size = line
                .split(|&b| b == b';')
                .next()
                .unwrap_or_default()
                .trim_ascii();
            if size.is_empty() || size.len() > 15 || !size.iter().all(u8::is_ascii_hexdigit) {
                return Err(Need::Bad("bad chunk size"));
            }
            let n = size.iter().fold(0u64, |n, &d| {
                n * 16 + u64::from((d as char).to_digit(16).unwrap_or(0))
            });
            Ok(Step::Next(if n == 0 {
                Chunk::Trailers
            } else {
                Chunk::Data(n)
            }))
        }
        Chunk::DataEnd => {
            if buf.len() < 2 {
                return Err(Need::More);
            }
            if &buf[..2] != b"\r\n" {
                return Err(Need::Bad("chunk data not followed by CRLF"));
            }
            buf.advance(2);
            Ok(Step::Next(Chunk::Size))
        }
        Chunk::Trailers => {
            let line = take_line(buf)?;
            if line.is_empty() {
                return Ok(Step::End);
            }
            if line[0] == b' ' || line[0] == b'\t' {
                return Err(Need::Bad("obs-fold in the trailers"));
            }
            Ok(Step::Trailer(line))
        }
        Chunk::Data(_) => Err(Need::More),
    }
}

/// The next CRLF-terminated line (without it), taken out of `buf`.
fn take_line(buf: &mut BytesMut) -> Result<Bytes, Need> {
    let Some(end) = buf.windows(2).position(|w| w == b"\r\n") else {
        if buf.len() > MAX_CHUNK_LINE || buf.contains(&b'\n') {
            return Err(Need::Bad("chunk line too long or not ended by CRLF"));
        }
        return Err(Need::More);
    };
    if end > MAX_CHUNK_LINE {
        return Err(Need::Bad("chunk line too long"));
    }
    let line = buf.split_to(end).freeze();
    buf.advance(2);
    Ok(line)
}

impl Body for ClientBody {
    type Data = Bytes;
    type Error = ClientError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, ClientError>>> {
        self.get_mut().poll_next(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.conn.is_none() || self.framing == Framing::Empty
    }

    fn size_hint(&self) -> SizeHint {
        match self.framing {
            Framing::Empty => SizeHint::with_exact(0),
            Framing::Length(n) => SizeHint::with_exact(n),
            _ => SizeHint::default(),
        }
    }
}

/// A connection to `addr` for this client (TCP within `timeout`, `TCP_NODELAY`).
pub(super) async fn connect(
    addr: SocketAddr,
    timeout: std::time::Duration,
) -> io::Result<ClientConn> {
    Ok(ClientConn::new(super::connect::tcp(addr, timeout).await?))
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;
    use std::time::Duration;

    use http::header;

    use http::Method;
    use http_body_util::{BodyExt, Either, Empty};
    use tokio::io::AsyncReadExt;
    use tokio::net::TcpListener;

    use super::super::{Peer, SendError, Sent, Upstream};
    use super::*;
    use crate::error::ProxyError;
    use crate::table::{Family, UpstreamProtocol};

    const FAMILIES: [&str; 2] = ["127.0.0.1", "::1"];

    /// One answer of a pod: the bytes written after a request head, and whether the pod closes
    /// the connection after them.
    type Answer = (&'static [u8], bool);

    /// A pod on `ip` answering each request head it reads with the next answer; the number of
    /// connections it accepted.
    async fn pod(ip: &str, answers: Vec<Answer>) -> (SocketAddr, Arc<AtomicUsize>) {
        let listener = TcpListener::bind((ip, 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let answers = Arc::new(Mutex::new(VecDeque::from(answers)));
        let count = accepted.clone();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                let answers = answers.clone();
                tokio::spawn(async move {
                    let mut seen = Vec::new();
                    let mut buf = [0u8; 4096];
                    loop {
                        while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                            match stream.read(&mut buf).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => seen.extend_from_slice(&buf[..n]),
                            }
                        }
                        seen.clear();
                        let next = answers.lock().unwrap().pop_front();
                        let Some((bytes, close)) = next else { return };
                        if stream.write_all(bytes).await.is_err() || close {
                            return;
                        }
                    }
                });
            }
        });
        (addr, accepted)
    }

    fn request(method: Method) -> Request<UpstreamBody> {
        Request::builder()
            .method(method)
            .uri("/p?q")
            .header(header::HOST, "a.test")
            .body(Either::Right(Empty::new()))
            .unwrap()
    }

    /// A plain HTTP/1.1 pod at `addr`, with 5 s timeouts.
    fn http1_peer(addr: SocketAddr, forwarding: Option<Forwarding<'_>>) -> Peer<'_> {
        Peer {
            addr,
            family: Family::of(&addr),
            protocol: UpstreamProtocol::Http1,
            tls: None,
            connect_timeout: Duration::from_secs(5),
            read_timeout: Duration::from_secs(5),
            forwarding,
        }
    }

    async fn send(
        upstream: &Upstream,
        addr: SocketAddr,
        method: Method,
    ) -> Result<Sent, SendError> {
        let peer = http1_peer(addr, None);
        let mut slot = Some(request(method));
        upstream.send(&peer, &mut slot).await
    }

    /// The status and whole body (or the body's error) of a response.
    async fn answer(sent: Sent) -> (u16, Result<Vec<u8>, String>, Option<HeaderMap>) {
        let status = sent.response.status().as_u16();
        match sent.response.into_body().collect().await {
            Ok(all) => {
                let trailers = all.trailers().cloned();
                (status, Ok(all.to_bytes().to_vec()), trailers)
            }
            Err(e) => (status, Err(e.to_string()), None),
        }
    }

    fn upstream() -> Upstream {
        Upstream::new(Duration::from_secs(60), 8)
    }

    #[test]
    fn spare_buffers_are_taken_back_only_once_their_bytes_are_let_go() {
        // A response's buffer: its head and body split off and shared, the empty rest kept.
        let mut buf = take_spare();
        buf.reserve(FIRST_READ_SIZE);
        let start = buf.as_ptr();
        buf.extend_from_slice(b"head and body");
        let held = buf.split_to(13).freeze();
        keep_spare(std::mem::take(&mut buf));
        // Still held: the next response gets another buffer, and the held bytes stay as read.
        let mut next = take_spare();
        next.reserve(FIRST_READ_SIZE);
        next.extend_from_slice(b"other bytes!!");
        assert_eq!(&held[..], b"head and body");
        assert_ne!(next.as_ptr(), start);
        // Let go: the next buffer is the same allocation, whole.
        let rest = next.split_to(13).freeze();
        let second = rest.as_ptr();
        keep_spare(next);
        drop(rest);
        let reused = take_spare();
        assert_eq!(reused.as_ptr(), second);
        assert!(reused.capacity() >= FIRST_READ_SIZE);
        assert!(reused.is_empty());
        drop(held);
    }

    #[tokio::test]
    async fn a_held_response_body_is_not_overwritten_by_the_next_response() {
        for ip in FAMILIES {
            let answers = vec![
                (
                    &b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nfirst"[..],
                    false,
                ),
                (b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nnext!", false),
                (b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nthird", false),
            ];
            let (addr, accepted) = pod(ip, answers).await;
            let upstream = upstream();
            // The bodies as read: `Bytes` sharing the buffer they were read into.
            let mut bodies = Vec::new();
            for _ in 0..2 {
                let sent = send(&upstream, addr, Method::GET).await.unwrap();
                let body = sent.response.into_body().collect().await.unwrap();
                bodies.push(body.to_bytes());
            }
            let (first, next) = (bodies.remove(0), bodies.remove(0));
            assert_eq!(
                (&first[..], &next[..]),
                (&b"first"[..], &b"next!"[..]),
                "{ip}"
            );
            drop(next);
            let third = send(&upstream, addr, Method::GET).await.unwrap();
            let (status, body, _) = answer(third).await;
            assert_eq!((status, body), (200, Ok(b"third".to_vec())), "{ip}");
            assert_eq!(&first[..], b"first", "{ip}");
            assert_eq!(
                accepted.load(Ordering::SeqCst),
                1,
                "{ip}: one pooled connection"
            );
        }
    }

    #[tokio::test]
    async fn hostile_response_heads_are_refused_with_a_502() {
        let big: &'static [u8] = Box::leak(
            format!(
                "HTTP/1.1 200 OK\r\nx-big: {}\r\ncontent-length: 0\r\n\r\n",
                "a".repeat(UPSTREAM_H1_BUF)
            )
            .into_bytes()
            .into_boxed_slice(),
        );
        let cases: [(&str, &'static [u8]); 7] = [
            (
                "differing Content-Lengths",
                b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\nhello!",
            ),
            (
                "a Content-Length list that differs",
                b"HTTP/1.1 200 OK\r\ncontent-length: 5, 6\r\n\r\nhello!",
            ),
            (
                "a signed Content-Length",
                b"HTTP/1.1 200 OK\r\ncontent-length: +5\r\n\r\nhello",
            ),
            (
                "obs-fold",
                b"HTTP/1.1 200 OK\r\nx-a: b\r\n folded\r\ncontent-length: 0\r\n\r\n",
            ),
            ("not HTTP", b"SSH-2.0-OpenSSH_9.2\r\n\r\n"),
            (
                "an unasked 101",
                b"HTTP/1.1 101 Switching Protocols\r\nupgrade: x\r\n\r\n",
            ),
            ("a head over the buffer", big),
        ];
        for ip in FAMILIES {
            for (what, bytes) in cases {
                let (addr, _) = pod(ip, vec![(bytes, false)]).await;
                match send(&upstream(), addr, Method::GET).await {
                    Err(SendError::Failed(
                        error @ (ProxyError::Client(_) | ProxyError::UnaskedUpgrade),
                    )) => {
                        assert_eq!(error.status(), StatusCode::BAD_GATEWAY, "{ip}: {what}");
                    }
                    other => panic!("{ip}: {what}: {other:?}"),
                }
            }
        }
    }

    #[tokio::test]
    async fn broken_chunked_bodies_fail_and_their_connection_is_not_reused() {
        let cases: [(&str, &'static [u8]); 4] = [
            (
                "a chunk size that is not hex",
                b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n",
            ),
            (
                "a chunk size that overflows",
                b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n10000000000000000\r\nx\r\n0\r\n\r\n",
            ),
            (
                "a chunk longer than its size",
                b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nhello\r\n0\r\n\r\n",
            ),
            (
                "a body cut short",
                b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nhello",
            ),
        ];
        for ip in FAMILIES {
            for (what, bytes) in cases {
                let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                let (addr, accepted) =
                    pod(ip, vec![(bytes, what == "a body cut short"), (ok, false)]).await;
                let upstream = upstream();
                let sent = send(&upstream, addr, Method::GET).await.unwrap();
                let (status, body, _) = answer(sent).await;
                assert_eq!(status, 200, "{ip}: {what}");
                assert!(body.is_err(), "{ip}: {what}: {body:?}");
                let sent = send(&upstream, addr, Method::GET).await.unwrap();
                assert_eq!(answer(sent).await.1.unwrap(), b"ok", "{ip}: {what}");
                assert_eq!(accepted.load(Ordering::SeqCst), 2, "{ip}: {what}");
            }
        }
    }

    #[tokio::test]
    async fn clean_bodies_return_their_connection_and_close_ones_do_not() {
        for ip in FAMILIES {
            let answers: Vec<Answer> = vec![
                (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello", false),
                (b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nx-sum: 42\r\n\r\n", false),
                (b"HTTP/1.1 200 OK\r\ncontent-length: 99\r\n\r\n", false),
                (b"HTTP/1.1 204 No Content\r\ncontent-length: 3\r\n\r\n", false),
                (b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\ntransfer-encoding: chunked\r\n\r\nb\r\nhello world\r\n0\r\n\r\n", false),
                (b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\nconnection: close\r\n\r\nlast", false),
                (b"HTTP/1.1 200 OK\r\n\r\nuntil close", true),
            ];
            let (addr, accepted) = pod(ip, answers).await;
            let upstream = upstream();
            // Transfer-Encoding overrides Content-Length (the response is relayed, as hyper
            // did), but that connection is not used again.
            let expected: [(Method, &[u8], usize); 7] = [
                (Method::GET, b"hello", 1),
                (Method::GET, b"hello world", 1),
                (Method::HEAD, b"", 1),
                (Method::GET, b"", 1),
                (Method::GET, b"hello world", 1),
                (Method::GET, b"last", 2),
                (Method::GET, b"until close", 3),
            ];
            for (i, (method, body, connections)) in expected.into_iter().enumerate() {
                let sent = send(&upstream, addr, method).await.unwrap();
                let (_, got, trailers) = answer(sent).await;
                assert_eq!(got.unwrap(), body, "{ip}: answer {i}");
                assert_eq!(
                    accepted.load(Ordering::SeqCst),
                    connections,
                    "{ip}: answer {i}"
                );
                if i == 1 {
                    assert_eq!(trailers.unwrap()["x-sum"], "42", "{ip}");
                }
            }
        }
    }

    /// A pod on `ip` answering one request with an empty 200; the request head it read.
    async fn recording_pod(ip: &str) -> (SocketAddr, tokio::sync::oneshot::Receiver<Vec<u8>>) {
        let listener = TcpListener::bind((ip, 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut seen = Vec::new();
            let mut buf = [0u8; 4096];
            while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                match stream.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => seen.extend_from_slice(&buf[..n]),
                }
            }
            let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
            let _ = stream.write_all(answer).await;
            let _ = tx.send(seen);
        });
        (addr, rx)
    }

    /// The header lines of a request head, lowercase names, sorted.
    fn header_lines(head: &[u8]) -> Vec<(String, Vec<u8>)> {
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut req = httparse::Request::new(&mut headers);
        assert!(req.parse(head).unwrap().is_complete());
        let mut lines: Vec<_> = req
            .headers
            .iter()
            .map(|h| (h.name.to_ascii_lowercase(), h.value.to_vec()))
            .collect();
        lines.sort();
        lines
    }

    #[tokio::test]
    async fn forwarding_headers_written_into_the_head_are_those_the_map_would_carry() {
        use crate::conn::ConnInfo;
        for (ip, client) in [
            ("127.0.0.1", "192.0.2.7:4711"),
            ("::1", "[2001:db8::7]:4711"),
        ] {
            for host in ["a.test", "[::1]:8443"] {
                let (addr, head) = recording_pod(ip).await;
                let conn = ConnInfo::new(client.parse().unwrap(), "[::1]:8080".parse().unwrap());
                // A client's own forwarding headers, all replaced for an untrusted peer.
                let mut request = request(Method::GET);
                let headers = request.headers_mut();
                headers.insert(header::HOST, HeaderValue::from_static(host));
                for (name, value) in [
                    ("x-forwarded-for", "6.6.6.6"),
                    ("x-forwarded-for", "6.6.6.7"),
                    ("forwarded", "for=6.6.6.6"),
                    ("x-real-ip", "6.6.6.6"),
                    ("x-forwarded-proto", "https"),
                    ("x-forwarded-host", "evil.test"),
                    ("x-forwarded-port", "1"),
                    ("x-kept", "1"),
                ] {
                    headers.append(name, HeaderValue::from_static(value));
                }
                let valid = crate::host::request_host(&request).unwrap();
                let forwarding = Forwarding::untrusted(&valid, &conn).unwrap();
                let mut expected = request.headers().clone();
                forwarding.apply(&mut expected);
                let peer = http1_peer(addr, Some(forwarding));
                let sent = upstream().send(&peer, &mut Some(request)).await.unwrap();
                assert_eq!(sent.response.status(), StatusCode::OK);
                let mut want: Vec<_> = expected
                    .iter()
                    .map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec()))
                    .collect();
                want.sort();
                let got = header_lines(&head.await.unwrap());
                assert_eq!(got, want, "{client} {host}");
                assert!(got
                    .iter()
                    .any(|(n, v)| n == "forwarded" && v.starts_with(b"for=\"")));
            }
        }
    }

    /// Header fields, name and value.
    type Relayed = &'static [(&'static str, &'static [u8])];

    #[tokio::test]
    async fn response_heads_come_without_the_fields_the_proxy_would_strip() {
        // Every hop-by-hop field, fields named by `Connection` (one in a value that is not
        // visible ASCII, so not read), and a `Content-Length` that `Transfer-Encoding` overrides.
        // What `proxy::headers::strip_hop_by_hop` leaves of each head's fields (sorted).
        let heads: [(&'static [u8], Relayed); 3] = [
            (
                b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: keep-alive, X-Secret\r\nx-secret: 1\r\nKeep-Alive: timeout=5\r\nProxy-Connection: keep-alive\r\nTE: trailers\r\nTrailer: x-sum\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\nx-kept: 1\r\nx-kept: 2\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
                &[("content-type", b"text/plain"), ("x-kept", b"1"), ("x-kept", b"2")],
            ),
            (
                b"HTTP/1.1 200 OK\r\nconnection: x-a\r\nconnection: \xe9, x-b\r\nx-a: 1\r\nx-b: 2\r\ncontent-length: 5\r\ndate: today\r\n\r\nhello",
                &[("content-length", b"5"), ("date", b"today"), ("x-b", b"2")],
            ),
            (
                b"HTTP/1.1 200 OK\r\nconnection: content-length, upgrade\r\ncontent-length: 5\r\nx-kept: 1\r\n\r\nhello",
                &[("x-kept", b"1")],
            ),
        ];
        for ip in FAMILIES {
            for (head, want) in heads {
                let (addr, _) = pod(ip, vec![(head, false)]).await;
                let sent = send(&upstream(), addr, Method::GET).await.unwrap();
                assert!(sent.stripped, "{ip}");
                let mut got: Vec<_> = sent
                    .response
                    .headers()
                    .iter()
                    .map(|(n, v)| (n.to_string(), v.as_bytes().to_vec()))
                    .collect();
                got.sort();
                let want: Vec<_> = want
                    .iter()
                    .map(|(n, v)| (n.to_string(), v.to_vec()))
                    .collect();
                assert_eq!(got, want, "{ip}: {}", String::from_utf8_lossy(head));
                let (status, body, _) = answer(sent).await;
                assert_eq!((status, body.unwrap()), (200, b"hello".to_vec()), "{ip}");
            }
        }
    }

    #[tokio::test]
    async fn a_reused_connection_the_pod_closed_is_replayed_on_a_fresh_one() {
        for ip in FAMILIES {
            let ok: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
            // The pod answers the first request, then closes the connection when the second
            // comes on it (an idle close racing a reuse); the replay gets the third answer.
            let (addr, accepted) = pod(ip, vec![(ok, false), (b"", true), (ok, false)]).await;
            let upstream = upstream();
            for _ in 0..2 {
                let sent = send(&upstream, addr, Method::GET).await.unwrap();
                assert_eq!(answer(sent).await.1.unwrap(), b"ok", "{ip}");
            }
            assert_eq!(accepted.load(Ordering::SeqCst), 2, "{ip}");
        }
    }
}
