//! duet's own HTTP/1.1 server for plain client connections: request heads read into one buffer
//! per connection and parsed by [`crate::h1`] (one pass, borrowed slices, framing decided once),
//! the request handed to the handler without hyper's dispatcher, the response head written once
//! into a reused buffer with the body behind it, keep-alive and pipelined requests answered in
//! order.
//!
//! The boundary: this path takes the common request, an HTTP/1.1 head without a body that keeps
//! the connection alive and asks for nothing more. Everything else goes to hyper's HTTP/1.1
//! server, with the bytes already read given back ([`crate::park::Rewind`]), and hyper serves the
//! connection from there on: a head this parser refuses (hyper refuses the same heads with the
//! same status, which the `h1_request` fuzz target checks, so hyper answers the refusal), a
//! request body (length or chunked), HTTP/1.0, `Connection: close`, upgrades and `CONNECT`
//! (WebSocket tunnels need hyper's upgrade machinery), `Expect: 100-continue`, a `TE` field
//! (trailers), and a head larger than [`MAX_HEAD`]. TLS connections and HTTP/2 stay on hyper.
//! Why: the requests this path takes are those whose exchange is one head each way and a
//! response body, where hyper's per-connection machinery (dispatcher, header maps built twice,
//! per-request futures and buffers) is most of the cost; the rest needs hyper's state machine
//! (body decoding with its limits, 100-continue, upgrades), which is kept as it is proven.
//!
//! The response is written as hyper's server writes it (`hyper::proto::h1::role`): the same
//! status line, the header fields in order with lower-case names, the framing fields decided
//! the same way (a length, chunked, or none for `HEAD`, 204 and 304), `connection: close` added
//! when the connection ends after it, and a `date` field.
//!
//! On by default; `DUET_H1_SERVER=0` switches it off (every plain connection then served by
//! hyper's server from its first byte, as before), to compare or to rule the path out.

use std::io::Write as _;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::{Buf, Bytes};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode, Uri, Version};
use http_body_util::BodyExt;
use hyper::body::Body;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;

use super::{stopped, wait_parked, Ended, Handler, Io};
use crate::client_body::ClientBody;
use crate::conn::ConnInfo;
use crate::h1::{self, Framing};
use crate::idle::{self, Activity};
use crate::metrics::ConnectionMetrics;

/// Longest request head this path takes; longer ones go to hyper (which refuses them past its
/// own limit).
pub const MAX_HEAD: usize = 16 * 1024;

/// Bytes read at a time.
const READ_SIZE: usize = 4096;

/// The longest head hyper's server reads before refusing it.
const HYPER_LIMIT: usize = crate::limits::MAX_HEADER_BYTES;

// A head this path takes is well within hyper's limit, so that it never takes one hyper would
// refuse as too large.
const _: () = assert!(MAX_HEAD + READ_SIZE <= HYPER_LIMIT);

/// Response bytes gathered before a write: the head and the first data of the body go together.
const GATHER: usize = 16 * 1024;

/// Whether the path is switched on (unless `DUET_H1_SERVER=0`, `off` or `false`).
pub fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        !matches!(
            std::env::var("DUET_H1_SERVER").as_deref(),
            Ok("0" | "off" | "false")
        )
    })
}

/// How serving a connection ended.
pub(crate) enum Served {
    /// The connection is done.
    Ended(Ended),
    /// hyper's server takes the connection from here, with the bytes read given back.
    HandOver(Io),
}

/// One connection's server: what every request on it is answered with.
pub(crate) struct Conn<'a, H> {
    handler: &'a H,
    info: &'a Arc<ConnInfo>,
    activity: &'a Activity,
}

/// What the next bytes of a connection held.
// Returned once per request and taken apart at once: boxing the request would allocate per request.
#[allow(clippy::large_enum_variant)]
enum Next {
    /// A request this path takes, and its head's length in the buffer.
    Request(Request<ClientBody>, usize),
    /// A request for hyper (or bytes it is to refuse).
    HandOver,
    /// The client closed between requests.
    Closed,
    /// The head was too slow.
    Expired,
}

impl<'a, H: Handler> Conn<'a, H> {
    /// The server of a connection answered by `handler`.
    pub(crate) fn new(handler: &'a H, info: &'a Arc<ConnInfo>, activity: &'a Activity) -> Self {
        Conn {
            handler,
            info,
            activity,
        }
    }

    /// Serves the connection until it ends or goes to hyper.
    pub(crate) async fn serve(
        self,
        mut io: Io,
        timeouts: idle::Timeouts,
        counts: Option<&ConnectionMetrics>,
        drain: &mut watch::Receiver<bool>,
    ) -> Served {
        let mut buf: Vec<u8> = Vec::new();
        let mut out: Vec<u8> = Vec::new();
        loop {
            if buf.is_empty() && !io.has_pending() {
                match self
                    .between(io, &mut buf, &mut out, timeouts, counts, drain)
                    .await
                {
                    Ok(woken) => io = woken,
                    Err(ended) => return Served::Ended(ended),
                }
            }
            let (req, len) = match self.next(&mut io, &mut buf, timeouts).await {
                Ok(Next::Request(req, len)) => (req, len),
                Ok(Next::HandOver) => return Served::HandOver(io.rewound(Bytes::from(buf))),
                Ok(Next::Closed) => return Served::Ended(Ok(false)),
                Ok(Next::Expired) => return Served::Ended(Ok(true)),
                Err(error) => return Served::Ended(Err(error.into())),
            };
            buf.drain(..len);
            match self.answer(&mut io, req, &mut buf, &mut out, drain).await {
                Ok(true) => {}
                Ok(false) => {
                    let _ = tokio::time::timeout(timeouts.header_read, io.shutdown()).await;
                    return Served::Ended(Ok(false));
                }
                Err(error) => return Served::Ended(Err(error.into())),
            }
        }
    }

    /// Waits between requests for the client's next bytes, with the buffers kept for
    /// [`idle::PARK_AFTER`] and then freed (the connection parked, as hyper's is); `Err` when the
    /// connection idled too long (`Ok(true)`) or the listener drains (`Ok(false)`).
    async fn between(
        &self,
        io: Io,
        buf: &mut Vec<u8>,
        out: &mut Vec<u8>,
        timeouts: idle::Timeouts,
        counts: Option<&ConnectionMetrics>,
        drain: &mut watch::Receiver<bool>,
    ) -> Result<Io, Ended> {
        let mut io = io;
        let parked = tokio::select! {
            readable = io.get_ref().get_ref().readable() => readable.is_err(),
            () = tokio::time::sleep(idle::PARK_AFTER) => true,
            () = self.activity.expired(timeouts) => return Err(Ok(true)),
            () = stopped(drain) => {
                let _ = tokio::time::timeout(timeouts.header_read, io.shutdown()).await;
                return Err(Ok(false));
            }
        };
        if !parked {
            return Ok(io);
        }
        *buf = Vec::new();
        *out = Vec::new();
        let counted = counts.map(|c| c.parked(self.info.family));
        let woken = wait_parked(io, self.activity, timeouts, drain).await;
        drop(counted);
        woken.ok_or(Ok(true))
    }

    /// Reads until the buffer starts with a complete head, and decides who answers it.
    async fn next(
        &self,
        io: &mut Io,
        buf: &mut Vec<u8>,
        timeouts: idle::Timeouts,
    ) -> std::io::Result<Next> {
        loop {
            if !buf.is_empty() {
                let mut slots = h1::header_slots();
                match h1::parse_request(buf, &mut slots) {
                    Ok(Some(head)) => {
                        let fits = head.len <= MAX_HEAD;
                        return Ok(match taken(&head).filter(|_| fits) {
                            Some(req) => Next::Request(req, head.len),
                            None => Next::HandOver,
                        });
                    }
                    Ok(None) if buf.len() < HYPER_LIMIT => {}
                    Ok(None) | Err(_) => return Ok(Next::HandOver),
                }
            }
            // An incomplete head goes to hyper once it is as long as hyper's limit: hyper then
            // refuses it (431) from the bytes given back alone, as it would have from the socket.
            let room = (HYPER_LIMIT + READ_SIZE - buf.len()).min(READ_SIZE);
            buf.reserve(room);
            let mut limited = (&mut *io).take(room as u64);
            let read = tokio::select! {
                read = limited.read_buf(buf) => read?,
                () = self.activity.expired(timeouts) => return Ok(Next::Expired),
            };
            if read == 0 {
                return Ok(if buf.is_empty() {
                    Next::Closed
                } else {
                    Next::HandOver
                });
            }
        }
    }

    /// Answers one request; `Ok(true)` when the connection carries another.
    async fn answer(
        &self,
        io: &mut Io,
        req: Request<ClientBody>,
        buf: &mut Vec<u8>,
        out: &mut Vec<u8>,
        drain: &watch::Receiver<bool>,
    ) -> std::io::Result<bool> {
        let busy = self.activity.begin_parkable(true);
        let head_request = req.method() == Method::HEAD;
        let Some(answering) = self.handler.call_own(req, self.info.clone()) else {
            return Ok(false);
        };
        let Some(response) = answered(io, answering, buf).await else {
            // The client went away: the request is dropped (and counted so), as hyper does.
            return Ok(false);
        };
        let (mut parts, body) = response.into_parts();
        out.clear();
        let keep_alive = !*drain.borrow();
        let head = encode_head(&mut parts, &body, head_request, keep_alive, out);
        let complete = match head.framing {
            Some(framing) => write_body(io, out, body, framing).await?,
            None => {
                drop(body);
                io.write_all(out).await?;
                true
            }
        };
        io.flush().await?;
        drop(busy);
        Ok(complete && !head.last)
    }
}

/// The handler's answer, or `None` when the client closes the connection first. While nothing is
/// buffered, the connection is read meanwhile, as hyper's server does to notice a client that
/// went away: a pipelined request is kept for later, an end drops the answer in the making.
async fn answered<F, B>(io: &mut Io, answering: F, buf: &mut Vec<u8>) -> Option<Response<B>>
where
    F: std::future::Future<Output = Result<Response<B>, std::convert::Infallible>>,
{
    let mut answering = std::pin::pin!(answering);
    while buf.is_empty() {
        buf.reserve(READ_SIZE);
        let mut limited = (&mut *io).take(READ_SIZE as u64);
        tokio::select! {
            biased;
            Ok(response) = answering.as_mut() => return Some(response),
            read = limited.read_buf(buf) => match read {
                Ok(0) | Err(_) => return None,
                Ok(_) => {}
            },
        }
    }
    let Ok(response) = answering.await;
    Some(response)
}

/// The request, when this path takes the head (see the module docs); `None` for hyper.
fn taken(head: &h1::RequestHead<'_, '_>) -> Option<Request<ClientBody>> {
    if !head.http11
        || head.framing != Framing::Empty
        || !head.keep_alive
        || head.upgrade
        || head.expect_continue
        || head
            .headers
            .iter()
            .any(|h| h.name.eq_ignore_ascii_case("te"))
    {
        return None;
    }
    let method = Method::from_bytes(head.method.as_bytes()).ok()?;
    let uri: Uri = head.target.parse().ok()?;
    let mut headers = HeaderMap::with_capacity(head.headers.len());
    for field in head.headers {
        let name = HeaderName::from_bytes(field.name.as_bytes()).ok()?;
        headers.append(name, HeaderValue::from_bytes(field.value).ok()?);
    }
    let mut req = Request::new(ClientBody::Empty);
    *req.method_mut() = method;
    *req.uri_mut() = uri;
    *req.version_mut() = Version::HTTP_11;
    *req.headers_mut() = headers;
    Some(req)
}

/// How a response's body is sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Sending {
    /// Exactly this many bytes.
    Length(u64),
    /// Chunked coding.
    Chunked,
    /// Until the connection closes (an HTTP/1.0 answer of unknown length).
    Close,
}

/// A response head as written: how its body goes (`None`: no body), and whether the connection
/// ends after it.
struct Head {
    framing: Option<Sending>,
    last: bool,
}

/// The body's length as hyper's dispatcher tells its encoder: `None` for an ended body.
fn body_length<B: Body>(body: &B) -> Option<Option<u64>> {
    if body.is_end_stream() {
        None
    } else {
        Some(body.size_hint().exact())
    }
}

/// Writes the response head into `out` as hyper's server does (see the module docs).
fn encode_head<B: Body>(
    parts: &mut http::response::Parts,
    body: &B,
    head_request: bool,
    keep_alive: bool,
    out: &mut Vec<u8>,
) -> Head {
    let mut last = !keep_alive;
    let mut length = body_length(body);
    if parts.status.is_informational() {
        // hyper sends no 1xx as a final answer: a 500 instead, and the connection closes.
        parts.status = StatusCode::INTERNAL_SERVER_ERROR;
        parts.version = Version::HTTP_11;
        parts.headers.clear();
        parts.extensions = http::Extensions::new();
        length = None;
        last = true;
    }
    if last {
        add_close(&mut parts.headers);
    }
    status_line(parts, out);
    // Whether the answer has a body at all (hyper's `can_chunked`), and may be chunked: an
    // HTTP/1.0 answer (a pod's, relayed) is not, and its body of unknown length ends with the
    // connection.
    let has_body = !head_request && !matches!(parts.status.as_u16(), 204 | 304);
    let chunkable = has_body && parts.version != Version::HTTP_10;
    let mut fields = Fields {
        framing: None,
        wrote_len: false,
        wrote_date: false,
        last,
    };
    fields.write(&parts.headers, length, head_request, chunkable, out);
    if !fields.wrote_len {
        fields.framing = implicit_framing(parts.status, length, head_request, chunkable, out);
    }
    if !has_body {
        fields.framing = None;
    }
    if fields.framing == Some(Sending::Close) {
        fields.last = true;
    }
    if !fields.wrote_date {
        out.extend_from_slice(b"date: ");
        date(out);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    Head {
        framing: fields.framing.filter(|f| *f != Sending::Length(0)),
        last: fields.last,
    }
}

/// The framing of an answer whose fields set none, and the field that says it.
fn implicit_framing(
    status: StatusCode,
    length: Option<Option<u64>>,
    head_request: bool,
    chunkable: bool,
    out: &mut Vec<u8>,
) -> Option<Sending> {
    let with_length = !matches!(status.as_u16(), 204 | 304);
    match length {
        Some(None) if chunkable => {
            out.extend_from_slice(b"transfer-encoding: chunked\r\n");
            Some(Sending::Chunked)
        }
        Some(None) => Some(Sending::Close),
        None | Some(Some(0)) => {
            if with_length && !head_request {
                out.extend_from_slice(b"content-length: 0\r\n");
            }
            None
        }
        Some(Some(n)) if with_length => {
            out.extend_from_slice(b"content-length: ");
            out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
            out.extend_from_slice(b"\r\n");
            Some(Sending::Length(n))
        }
        Some(Some(_)) => None,
    }
}

/// Adds `close` to the `Connection` field unless it says so already.
fn add_close(headers: &mut HeaderMap) {
    let close = headers
        .get_all(header::CONNECTION)
        .iter()
        .any(|v| has_token(v, "close"));
    if !close {
        headers.append(header::CONNECTION, HeaderValue::from_static("close"));
    }
}

/// Whether a comma-separated field value lists `token`.
fn has_token(value: &HeaderValue, token: &str) -> bool {
    value
        .to_str()
        .is_ok_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
}

/// The status line, with the response's own reason phrase if it carries one.
fn status_line(parts: &http::response::Parts, out: &mut Vec<u8>) {
    let reason = parts.extensions.get::<hyper::ext::ReasonPhrase>();
    let http10 = parts.version == Version::HTTP_10;
    if parts.status == StatusCode::OK && reason.is_none() && !http10 {
        out.extend_from_slice(b"HTTP/1.1 200 OK\r\n");
        return;
    }
    out.extend_from_slice(if http10 { b"HTTP/1.0 " } else { b"HTTP/1.1 " });
    out.extend_from_slice(parts.status.as_str().as_bytes());
    out.push(b' ');
    match reason {
        Some(reason) => out.extend_from_slice(reason.as_bytes()),
        None => out.extend_from_slice(
            parts
                .status
                .canonical_reason()
                .unwrap_or("<none>")
                .as_bytes(),
        ),
    }
    out.extend_from_slice(b"\r\n");
}

/// The header fields' pass of [`encode_head`].
struct Fields {
    framing: Option<Sending>,
    wrote_len: bool,
    wrote_date: bool,
    last: bool,
}

impl Fields {
    /// Writes the fields in order; the values of a framing or `Connection` field are joined on
    /// one line, as hyper does.
    fn write(
        &mut self,
        headers: &HeaderMap,
        length: Option<Option<u64>>,
        head_request: bool,
        chunkable: bool,
        out: &mut Vec<u8>,
    ) {
        // The joined field whose line is open, and whether `chunked` must end it.
        let mut open: Option<(&HeaderName, bool)> = None;
        for (name, value) in headers {
            if let Some((open_name, chunked)) = open {
                if open_name == name {
                    out.extend_from_slice(b", ");
                    out.extend_from_slice(value.as_bytes());
                    if *name == header::TRANSFER_ENCODING {
                        open = Some((open_name, !is_chunked(value)));
                    }
                    continue;
                }
                end_line(out, chunked);
                open = None;
            }
            if self.joined(name, value, length, head_request, chunkable) {
                out.extend_from_slice(name.as_str().as_bytes());
                out.extend_from_slice(b": ");
                out.extend_from_slice(value.as_bytes());
                let chunked = *name == header::TRANSFER_ENCODING && !is_chunked(value);
                open = Some((name, chunked));
                continue;
            }
            if *name == header::CONTENT_LENGTH
                || *name == header::TRANSFER_ENCODING
                || *name == header::TRAILER
            {
                continue;
            }
            out.extend_from_slice(name.as_str().as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(value.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        if let Some((_, chunked)) = open {
            end_line(out, chunked);
        }
    }

    /// Whether the field opens a joined line (its framing recorded), as opposed to being written
    /// plainly or skipped (framing fields hyper drops).
    fn joined(
        &mut self,
        name: &HeaderName,
        value: &HeaderValue,
        length: Option<Option<u64>>,
        head_request: bool,
        chunkable: bool,
    ) -> bool {
        match *name {
            header::CONTENT_LENGTH => {
                let declared = match length {
                    Some(Some(n)) => Some(n),
                    Some(None) => value.to_str().ok().and_then(|v| v.parse::<u64>().ok()),
                    // An ended body: the field stays only for `HEAD`.
                    None if head_request => {
                        self.wrote_len = true;
                        return true;
                    }
                    None => return false,
                };
                self.wrote_len = true;
                self.framing = declared.map(Sending::Length);
                true
            }
            header::TRANSFER_ENCODING if chunkable => {
                self.wrote_len = true;
                self.framing = Some(Sending::Chunked);
                true
            }
            header::CONNECTION => {
                if has_token(value, "close") {
                    self.last = true;
                }
                true
            }
            header::TRAILER => chunkable,
            header::DATE => {
                self.wrote_date = true;
                false
            }
            _ => false,
        }
    }
}

/// Ends a joined field's line.
fn end_line(out: &mut Vec<u8>, chunked: bool) {
    if chunked {
        out.extend_from_slice(b", chunked\r\n");
    } else {
        out.extend_from_slice(b"\r\n");
    }
}

/// Whether a `Transfer-Encoding` value ends with `chunked`.
fn is_chunked(value: &HeaderValue) -> bool {
    value
        .to_str()
        .ok()
        .and_then(|v| v.rsplit(',').next())
        .is_some_and(|last| last.trim().eq_ignore_ascii_case("chunked"))
}

/// Sends the gathered head and the body after it; `Ok(false)` when the body ended early or
/// failed (the connection cannot carry another response then).
async fn write_body<B: Body + Unpin>(
    io: &mut Io,
    out: &mut Vec<u8>,
    mut body: B,
    framing: Sending,
) -> std::io::Result<bool> {
    let mut left = match framing {
        Sending::Length(n) => n,
        Sending::Chunked | Sending::Close => u64::MAX,
    };
    loop {
        // The body's error (not `Send` for every handler) is dropped at once, before any wait.
        let ready = futures_util::FutureExt::now_or_never(body.frame()).map(data_of);
        let data = match ready {
            Some(data) => data,
            None => {
                io.write_all(out).await?;
                io.flush().await?;
                out.clear();
                data_of(body.frame().await)
            }
        };
        let data = match data {
            Polled::End => break,
            Polled::Data(data) => Some(data),
            Polled::Other => continue,
            Polled::Failed => None,
        };
        let Some(mut data) = data else {
            io.write_all(out).await?;
            return Ok(false);
        };
        let len = data.remaining();
        if len == 0 {
            continue;
        }
        if let Sending::Length(_) = framing {
            if len as u64 > left {
                io.write_all(out).await?;
                return Ok(false);
            }
            left -= len as u64;
        } else if framing == Sending::Chunked {
            let _ = write!(out, "{len:X}\r\n");
        }
        gather(io, out, &mut data).await?;
        if framing == Sending::Chunked {
            out.extend_from_slice(b"\r\n");
        }
    }
    if framing == Sending::Chunked {
        out.extend_from_slice(b"0\r\n\r\n");
    }
    io.write_all(out).await?;
    Ok(match framing {
        Sending::Length(_) => left == 0,
        Sending::Chunked | Sending::Close => true,
    })
}

/// A polled body frame, its error dropped.
enum Polled<D> {
    End,
    Data(D),
    Other,
    Failed,
}

/// What a body frame was.
fn data_of<D, E>(frame: Option<Result<hyper::body::Frame<D>, E>>) -> Polled<D> {
    match frame {
        None => Polled::End,
        Some(Ok(frame)) => match frame.into_data() {
            Ok(data) => Polled::Data(data),
            Err(_) => Polled::Other,
        },
        Some(Err(_)) => Polled::Failed,
    }
}

/// Adds a body chunk to the gathered bytes, or writes both when they are too many to gather.
async fn gather<D: Buf>(io: &mut Io, out: &mut Vec<u8>, data: &mut D) -> std::io::Result<()> {
    if out.len() + data.remaining() <= GATHER {
        while data.has_remaining() {
            let chunk = data.chunk();
            out.extend_from_slice(chunk);
            let n = chunk.len();
            data.advance(n);
        }
        return Ok(());
    }
    io.write_all(out).await?;
    out.clear();
    while data.has_remaining() {
        let n = io.write(data.chunk()).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        data.advance(n);
    }
    Ok(())
}

/// Appends the current date as an HTTP date, formatted at most once a second per thread.
fn date(out: &mut Vec<u8>) {
    thread_local! {
        static CACHED: std::cell::RefCell<(u64, String)> = const { std::cell::RefCell::new((u64::MAX, String::new())) };
    }
    let now = SystemTime::now();
    let secs = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_secs();
    CACHED.with(|cached| {
        let mut cached = cached.borrow_mut();
        if cached.0 != secs {
            *cached = (secs, httpdate::fmt_http_date(now));
        }
        out.extend_from_slice(cached.1.as_bytes());
    });
}
