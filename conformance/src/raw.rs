//! Byte-level tools for framing tests: an upstream on both loopbacks that records exactly the
//! bytes it receives and answers with canned bytes, a strict HTTP/1.1 request checker (what "one
//! well-framed request" means), a raw HTTP/1.1 exchange, and a minimal HTTP/2 client writing
//! frames by hand (HPACK literals, so header values may hold anything, CRLF included).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::echo::Family;

/// What one upstream connection received, and whether it has ended.
#[derive(Clone, Debug, Default)]
pub struct Recorded {
    /// Every byte received, in order.
    pub bytes: Vec<u8>,
    /// The connection has closed (either side).
    pub closed: bool,
}

/// An upstream on `127.0.0.1` and `[::1]` that records each connection's bytes. Once a complete
/// request has arrived (by a lenient reading of its framing) it writes `response` and, unless the
/// response is a `101`, closes the connection.
#[derive(Debug)]
pub struct RawUpstream {
    addrs: [SocketAddr; 2],
    conns: Arc<Mutex<Vec<Arc<Mutex<Recorded>>>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl RawUpstream {
    /// Starts listening on both loopbacks; must be called inside a Tokio runtime.
    pub async fn start(response: &'static [u8]) -> anyhow::Result<RawUpstream> {
        let conns: Arc<Mutex<Vec<Arc<Mutex<Recorded>>>>> = Arc::default();
        let mut addrs = [SocketAddr::from(([0, 0, 0, 0], 0)); 2];
        let mut tasks = Vec::new();
        for (slot, family) in addrs.iter_mut().zip(Family::BOTH) {
            let listener = TcpListener::bind(SocketAddr::new(family.loopback(), 0)).await?;
            *slot = listener.local_addr()?;
            let conns = conns.clone();
            tasks.push(tokio::spawn(async move {
                while let Ok((stream, _)) = listener.accept().await {
                    let record = Arc::new(Mutex::new(Recorded::default()));
                    conns.lock().unwrap().push(record.clone());
                    tokio::spawn(serve(stream, record, response));
                }
            }));
        }
        Ok(RawUpstream {
            addrs,
            conns,
            tasks,
        })
    }

    /// The listening address of a family.
    pub fn addr(&self, family: Family) -> SocketAddr {
        match family {
            Family::V4 => self.addrs[0],
            Family::V6 => self.addrs[1],
        }
    }

    /// Forgets what was recorded so far.
    pub fn clear(&self) {
        self.conns.lock().unwrap().clear();
    }

    /// What every connection received, once each has closed (after a short grace for
    /// connections still on their way); fails after 10 s with a connection still open.
    pub async fn settled(&self) -> anyhow::Result<Vec<Recorded>> {
        tokio::time::sleep(Duration::from_millis(150)).await;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let now: Vec<Recorded> = self
                .conns
                .lock()
                .unwrap()
                .iter()
                .map(|r| r.lock().unwrap().clone())
                .collect();
            if now.iter().all(|r| r.closed) {
                return Ok(now);
            }
            if tokio::time::Instant::now() > deadline {
                bail!("an upstream connection stayed open: {now:?}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for RawUpstream {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

async fn serve(mut stream: TcpStream, record: Arc<Mutex<Recorded>>, response: &'static [u8]) {
    let mut buf = vec![0u8; 64 * 1024];
    let mut seen = Vec::new();
    loop {
        let n = match tokio::time::timeout(Duration::from_secs(20), stream.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => n,
            _ => break,
        };
        seen.extend_from_slice(&buf[..n]);
        record.lock().unwrap().bytes.extend_from_slice(&buf[..n]);
        if lenient_request_end(&seen).is_some() {
            let _ = stream.write_all(response).await;
            if response.starts_with(b"HTTP/1.1 101") {
                // A tunnel: echo whatever comes next.
                while let Ok(Ok(n)) =
                    tokio::time::timeout(Duration::from_secs(20), stream.read(&mut buf)).await
                {
                    if n == 0 || stream.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            }
            break;
        }
    }
    let _ = stream.shutdown().await;
    record.lock().unwrap().closed = true;
}

/// Where the first request in `bytes` ends, reading its framing leniently (to know when to
/// answer); `None` while incomplete.
fn lenient_request_end(bytes: &[u8]) -> Option<usize> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut req = httparse::Request::new(&mut headers);
    let httparse::Status::Complete(head) = req.parse(bytes).ok()? else {
        return None;
    };
    let value = |name: &str| {
        req.headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .map(|h| String::from_utf8_lossy(h.value).trim().to_ascii_lowercase())
    };
    if value("transfer-encoding").is_some_and(|v| v.ends_with("chunked")) {
        return chunked_end(&bytes[head..]).map(|n| head + n);
    }
    let len: usize = value("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    (bytes.len() >= head + len).then_some(head + len)
}

/// The length of a strict chunked body (CRLF everywhere, no trailers) at the start of `body`.
fn chunked_end(body: &[u8]) -> Option<usize> {
    match chunked_scan(body) {
        Chunked::Complete(n) => Some(n),
        Chunked::Partial | Chunked::Bad => None,
    }
}

/// How far a strict chunked body goes.
enum Chunked {
    /// Complete, this many bytes long.
    Complete(usize),
    /// Well-formed so far, cut short.
    Partial,
    /// Not strict chunked framing.
    Bad,
}

fn chunked_scan(body: &[u8]) -> Chunked {
    let mut at = 0;
    loop {
        let Some(line_end) = find(&body[at..], b"\r\n").map(|i| i + at) else {
            let rest = &body[at..];
            let partial = rest.len() < 16
                && rest
                    .iter()
                    .enumerate()
                    .all(|(i, b)| b.is_ascii_hexdigit() || (*b == b'\r' && i + 1 == rest.len()));
            return if partial {
                Chunked::Partial
            } else {
                Chunked::Bad
            };
        };
        let size = std::str::from_utf8(&body[at..line_end])
            .ok()
            .filter(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_hexdigit()))
            .and_then(|t| usize::from_str_radix(t, 16).ok());
        let Some(size) = size else {
            return Chunked::Bad;
        };
        at = line_end + 2;
        if body.len() < at + size + 2 {
            let tail = &body[(at + size).min(body.len())..];
            return if b"\r\n".starts_with(tail) {
                Chunked::Partial
            } else {
                Chunked::Bad
            };
        }
        if &body[at + size..at + size + 2] != b"\r\n" {
            return Chunked::Bad;
        }
        at += size + 2;
        if size == 0 {
            return Chunked::Complete(at);
        }
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// One request as an upstream received it, checked strictly.
#[derive(Clone, Debug)]
pub struct Request {
    /// The method.
    pub method: String,
    /// The request target.
    pub target: String,
    /// Header names (lower case) and values, in order.
    pub headers: Vec<(String, String)>,
    /// The body, de-chunked.
    pub body: Vec<u8>,
}

impl Request {
    /// Every value of a header (name in lower case).
    pub fn values(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
            .collect()
    }
}

/// What a connection's bytes are, checked strictly.
#[derive(Clone, Debug)]
pub enum Framed {
    /// Exactly one well-framed request.
    One(Request),
    /// A well-formed head and a body cut short of its framing (an aborted request).
    Truncated,
}

/// Checks that `bytes` are exactly one well-framed HTTP/1.1 request ([`one_request`]), or a
/// strictly well-formed prefix of one whose body stops short.
pub fn framed(bytes: &[u8]) -> anyhow::Result<Framed> {
    Ok(parse(bytes)?.map_or(Framed::Truncated, Framed::One))
}

/// Checks that `bytes` are exactly one well-framed HTTP/1.1 request: CRLF line ends only, no
/// obs-fold, exactly one Host, at most one Content-Length (digits only) and not with
/// Transfer-Encoding, Transfer-Encoding only `chunked` once, the body exactly as framed and no
/// byte after it.
pub fn one_request(bytes: &[u8]) -> anyhow::Result<Request> {
    parse(bytes)?.context("body shorter than its framing")
}

/// The request, `None` when its body stops short of its framing; an error for anything else.
fn parse(bytes: &[u8]) -> anyhow::Result<Option<Request>> {
    let head_end = find(bytes, b"\r\n\r\n").context("no end of head")? + 4;
    let head = &bytes[..head_end];
    for (i, b) in head.iter().enumerate() {
        if *b == b'\n' && (i == 0 || head[i - 1] != b'\r') {
            bail!("bare LF in the head");
        }
        if *b == b'\r' && head.get(i + 1) != Some(&b'\n') {
            bail!("bare CR in the head");
        }
    }
    let text = std::str::from_utf8(head).context("head is not UTF-8")?;
    let mut lines = text.split("\r\n");
    let request_line = lines.next().unwrap_or_default();
    let parts: Vec<&str> = request_line.split(' ').collect();
    let [method, target, "HTTP/1.1"] = parts[..] else {
        bail!("bad request line {request_line:?}");
    };
    let mut headers = Vec::new();
    for line in lines.filter(|l| !l.is_empty()) {
        if line.starts_with([' ', '\t']) {
            bail!("obs-fold line {line:?}");
        }
        let (name, value) = line.split_once(':').context("header without colon")?;
        let token = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
        if name.is_empty() || !name.chars().all(token) {
            bail!("bad header name {name:?}");
        }
        headers.push((name.to_ascii_lowercase(), value.trim().to_owned()));
    }
    let mut req = Request {
        method: method.to_owned(),
        target: target.to_owned(),
        headers,
        body: Vec::new(),
    };
    if req.values("host").len() != 1 {
        bail!("{} Host headers", req.values("host").len());
    }
    let te = req.values("transfer-encoding");
    let cl = req.values("content-length");
    let rest = &bytes[head_end..];
    let body_len = match (te.as_slice(), cl.as_slice()) {
        ([], []) => 0,
        ([], [len]) if !len.is_empty() && len.bytes().all(|b| b.is_ascii_digit()) => {
            let len: usize = len.parse()?;
            let Some(body) = rest.get(..len) else {
                return Ok(None);
            };
            req.body = body.to_vec();
            len
        }
        (["chunked"], []) => match chunked_scan(rest) {
            Chunked::Complete(end) => {
                req.body = dechunk(&rest[..end]);
                end
            }
            Chunked::Partial => return Ok(None),
            Chunked::Bad => bail!("bad chunked body"),
        },
        _ => bail!("framing headers TE {te:?} CL {cl:?}"),
    };
    if rest.len() != body_len {
        bail!(
            "{} bytes after the request: {:?}",
            rest.len() - body_len.min(rest.len()),
            String::from_utf8_lossy(&rest[body_len.min(rest.len())..])
        );
    }
    Ok(Some(req))
}

fn dechunk(mut body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(line) = find(body, b"\r\n") {
        let size = std::str::from_utf8(&body[..line])
            .ok()
            .and_then(|s| usize::from_str_radix(s, 16).ok())
            .unwrap_or(0);
        if size == 0 {
            break;
        }
        out.extend_from_slice(&body[line + 2..line + 2 + size]);
        body = &body[line + 2 + size + 2..];
    }
    out
}

/// Writes `bytes` on a fresh connection to `to` and reads until the server closes, or is silent
/// for 10 s before answering or 1 s after; returns what came back.
pub async fn exchange(to: SocketAddr, bytes: &[u8]) -> anyhow::Result<Vec<u8>> {
    let mut tcp = crate::client::connect_tcp(to).await?;
    tcp.write_all(bytes).await?;
    let mut out = Vec::new();
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        // 10 s for the answer; once some came, 1 s of silence ends it (a kept-alive connection).
        let wait = if out.is_empty() { 10_000 } else { 1_000 };
        match tokio::time::timeout(Duration::from_millis(wait), tcp.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) | Err(_) => return Ok(out),
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
        }
    }
}

/// The status codes of every HTTP/1.1 response in `bytes` (`HTTP/1.1 NNN` at line starts).
pub fn statuses(bytes: &[u8]) -> Vec<u16> {
    let text = String::from_utf8_lossy(bytes);
    text.match_indices("HTTP/1.1 ")
        .filter(|(i, _)| *i == 0 || text[..*i].ends_with('\n'))
        .filter_map(|(i, _)| text.get(i + 9..i + 12)?.parse().ok())
        .collect()
}

/// How an HTTP/2 server answered a hand-written stream 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum H2Outcome {
    /// A HEADERS frame came back on stream 1 (a response).
    Response,
    /// `RST_STREAM` on stream 1 with this code.
    Reset(u32),
    /// `GOAWAY` with this code.
    GoAway(u32),
    /// The connection closed without either.
    Closed,
}

/// An HPACK block of literal fields without indexing, names and values as given (no Huffman).
pub fn hpack_literals(fields: &[(&[u8], &[u8])]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, value) in fields {
        out.push(0x00);
        push_hpack_string(&mut out, name);
        push_hpack_string(&mut out, value);
    }
    out
}

fn push_hpack_string(out: &mut Vec<u8>, s: &[u8]) {
    // 7-bit prefix integer, no Huffman flag.
    let len = s.len();
    if len < 127 {
        out.push(len as u8);
    } else {
        out.push(127);
        let mut rest = len - 127;
        while rest >= 128 {
            out.push((rest % 128) as u8 | 0x80);
            rest /= 128;
        }
        out.push(rest as u8);
    }
    out.extend_from_slice(s);
}

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut out = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    out.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// Sends the HTTP/2 preface, an empty SETTINGS, one HEADERS frame on stream 1 with `fields`
/// (END_HEADERS; END_STREAM when there is no body) and the body as DATA frames (the last with
/// END_STREAM), over cleartext prior knowledge; then reads frames until stream 1 is answered,
/// reset, or the connection goes away.
pub async fn h2_request(
    to: SocketAddr,
    fields: &[(&[u8], &[u8])],
    body: &[&[u8]],
) -> anyhow::Result<H2Outcome> {
    let mut tcp = crate::client::connect_tcp(to).await?;
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend(frame(0x4, 0, 0, &[]));
    let end_stream = if body.is_empty() { 0x1 } else { 0 };
    out.extend(frame(0x1, 0x4 | end_stream, 1, &hpack_literals(fields)));
    for (i, chunk) in body.iter().enumerate() {
        let last = if i + 1 == body.len() { 0x1 } else { 0 };
        out.extend(frame(0x0, last, 1, chunk));
    }
    tcp.write_all(&out).await?;
    let read = async {
        let mut acked = false;
        loop {
            let mut head = [0u8; 9];
            if tcp.read_exact(&mut head).await.is_err() {
                return Ok(H2Outcome::Closed);
            }
            let len =
                (usize::from(head[0]) << 16) | (usize::from(head[1]) << 8) | usize::from(head[2]);
            let (kind, flags) = (head[3], head[4]);
            let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
            let mut payload = vec![0u8; len];
            if tcp.read_exact(&mut payload).await.is_err() {
                return Ok(H2Outcome::Closed);
            }
            let code = |at: usize| {
                payload
                    .get(at..at + 4)
                    .map_or(0, |b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
            };
            match (kind, stream) {
                (0x1, 1) => return Ok(H2Outcome::Response),
                (0x3, 1) => return Ok(H2Outcome::Reset(code(0))),
                (0x7, _) => return Ok(H2Outcome::GoAway(code(4))),
                (0x4, 0) if flags & 0x1 == 0 && !acked => {
                    acked = true;
                    tcp.write_all(&frame(0x4, 0x1, 0, &[])).await?;
                }
                _ => {}
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .context("no HTTP/2 answer within 10 s")?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strict_checker() {
        let good = b"POST /a HTTP/1.1\r\nhost: a.test\r\ncontent-length: 2\r\n\r\nhi";
        assert_eq!(one_request(good).unwrap().body, b"hi");
        let chunked = b"POST /a HTTP/1.1\r\nhost: a\r\ntransfer-encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n";
        assert_eq!(one_request(chunked).unwrap().body, b"hi");
        for bad in [
            &b"GET / HTTP/1.1\r\nhost: a\r\nhost: b\r\n\r\n"[..],
            b"GET / HTTP/1.1\r\n\r\n",
            b"GET / HTTP/1.1\nhost: a\r\n\r\n",
            b"GET / HTTP/1.1\r\nhost: a\r\nx: 1\r\n 2\r\n\r\n",
            b"POST / HTTP/1.1\r\nhost: a\r\ncontent-length: 1\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n",
            b"POST / HTTP/1.1\r\nhost: a\r\ncontent-length: 1\r\ncontent-length: 1\r\n\r\nx",
            b"POST / HTTP/1.1\r\nhost: a\r\ncontent-length: 1\r\n\r\nxGET / HTTP/1.1\r\n",
            b"POST / HTTP/1.1\r\nhost: a\r\ncontent-length: 5\r\n\r\nx",
        ] {
            assert!(one_request(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
        assert_eq!(lenient_request_end(chunked), Some(chunked.len()));
        let cut = b"POST /a HTTP/1.1\r\nhost: a\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhel";
        assert!(matches!(framed(cut), Ok(Framed::Truncated)));
        let cut = b"POST /a HTTP/1.1\r\nhost: a\r\ncontent-length: 5\r\n\r\nhel";
        assert!(matches!(framed(cut), Ok(Framed::Truncated)));
        let smuggled = b"POST /a HTTP/1.1\r\nhost: a\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\nGET /x HTTP/1.1\r\n";
        assert!(framed(smuggled).is_err());
        let bad = b"POST /a HTTP/1.1\r\nhost: a\r\ntransfer-encoding: chunked\r\n\r\n3\nabc";
        assert!(framed(bad).is_err());
        assert_eq!(
            statuses(b"HTTP/1.1 400 Bad\r\n\r\nHTTP/1.1 200 OK\r\n"),
            [400, 200]
        );
    }
}
