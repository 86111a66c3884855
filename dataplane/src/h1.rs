//! duet's own HTTP/1.1 head parsers: request heads as a client sends them to duet, response heads
//! as a pod sends them to duet's client ([`crate::upstream`]'s `client`). Both parse with
//! `httparse` into borrowed slices and decide the body's framing once, in one pass over the
//! fields, with no header map and no allocation on the common path.
//!
//! The request side decides exactly what hyper's HTTP/1.1 server (`hyper::proto::h1::role`,
//! hyper 1.12) decides for the same bytes: the same heads are refused, with the same status (400,
//! 414 or 431, or a close without an answer), and the same heads are taken, with the same body
//! framing (none, a length, chunked), keep-alive, `Expect: 100-continue` and upgrade. The
//! `h1_request` fuzz target feeds the same bytes to both and requires it. Checks of duet's own
//! that hyper does not make (one Host, Host against an absolute-form target, ...) stay in the
//! proxy, which runs them on every request whichever parser read it.
//!
//! The response side frames as hyper's HTTP/1.1 client does, and refuses what hyper's client
//! refuses (the `h1_response` fuzz target requires that too), plus what hyper takes but a proxy
//! must not relay: HTTP/1.0 with `Transfer-Encoding` is refused by both.
//!
//! This file has no `crate::` paths: the fuzz targets compile it on its own.

use std::mem::MaybeUninit;

/// Header fields parsed at most in a head (hyper's default): more is refused (431 for a request).
pub const MAX_HEADERS: usize = 100;

/// Longest request target hyper's server takes (longer: 414).
const MAX_URI_LEN: usize = (u16::MAX - 1) as usize;

/// Largest body length hyper represents (longer `Content-Length`s are refused with 431).
const MAX_BODY_LEN: u64 = u64::MAX - 2;

/// How a message's body is delimited.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framing {
    /// No body.
    Empty,
    /// Exactly this many bytes (more than 0).
    Length(u64),
    /// Chunked coding.
    Chunked,
    /// Until the sender closes the connection (responses only).
    Close,
}

/// Why a request head is refused: the status to answer with before closing, or `None` to close
/// without an answer (as hyper's server does for the HTTP/2 preface on an HTTP/1.1 connection).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refused(pub Option<u16>);

const BAD_REQUEST: Refused = Refused(Some(400));
const URI_TOO_LONG: Refused = Refused(Some(414));
const TOO_LARGE: Refused = Refused(Some(431));

/// A parsed request head, borrowing the buffer it was parsed from.
#[derive(Debug)]
pub struct RequestHead<'h, 'b> {
    /// The method, as sent (a valid `http::Method`).
    pub method: &'b str,
    /// The request target, as sent (a valid `http::Uri`).
    pub target: &'b str,
    /// HTTP/1.1 (else HTTP/1.0).
    pub http11: bool,
    /// Every header field, in order.
    pub headers: &'h [httparse::Header<'b>],
    /// Bytes of the head (request line, fields and the empty line).
    pub len: usize,
    /// How the body is delimited (never [`Framing::Close`]).
    pub framing: Framing,
    /// The connection may carry another request after this one.
    pub keep_alive: bool,
    /// `Expect: 100-continue` (the last `Expect` field says so).
    pub expect_continue: bool,
    /// An upgrade is asked: `CONNECT`, or `Upgrade` (the last `Upgrade` field decides: on
    /// HTTP/1.0 none is).
    pub upgrade: bool,
}

/// Space for a head's fields, to parse into (left uninitialised: no 3 KiB cleared per head).
pub type HeaderSlots<'b> = [MaybeUninit<httparse::Header<'b>>; MAX_HEADERS];

/// Fresh space for a head's fields (inlined: built in the caller's frame, not moved into it).
#[inline(always)]
pub fn header_slots<'b>() -> HeaderSlots<'b> {
    [const { MaybeUninit::uninit() }; MAX_HEADERS]
}

/// How an HTTP/2 connection with prior knowledge begins.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Whether the bytes are, after empty lines, the whole HTTP/2 preface: hyper's server closes
/// without an answer when such bytes fail to parse as an HTTP/1.1 head.
fn h2_preface(buf: &[u8]) -> bool {
    let start = buf
        .iter()
        .take_while(|&&b| b == b'\r' || b == b'\n')
        .count();
    buf[start..].starts_with(H2_PREFACE)
}

/// A complete request head at the start of `buf`; `Ok(None)` when more bytes are needed.
pub fn parse_request<'h, 'b>(
    buf: &'b [u8],
    slots: &'h mut HeaderSlots<'b>,
) -> Result<Option<RequestHead<'h, 'b>>, Refused> {
    let mut req = httparse::Request::new(&mut []);
    let config = httparse::ParserConfig::default();
    let len = match config.parse_request_with_uninit_headers(&mut req, buf, slots) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(_) if h2_preface(buf) => return Err(Refused(None)),
        Err(httparse::Error::TooManyHeaders) => return Err(TOO_LARGE),
        Err(httparse::Error::Status) => return Err(Refused(None)),
        Err(_) => return Err(BAD_REQUEST),
    };
    let (Some(method), Some(target), Some(version)) = (req.method, req.path, req.version) else {
        return Err(BAD_REQUEST);
    };
    if target.len() > MAX_URI_LEN {
        return Err(URI_TOO_LONG);
    }
    if http::Method::from_bytes(method.as_bytes()).is_err() {
        return Err(BAD_REQUEST);
    }
    if req.headers.iter().any(|h| h.name.len() >= 1 << 16) {
        return Err(TOO_LARGE);
    }
    // hyper takes the head out of its buffer before it reads the target and the fields: when
    // they are refused, what it looks for the HTTP/2 preface in is the bytes after the head.
    let after = |refused: Refused| {
        if h2_preface(&buf[len..]) {
            Refused(None)
        } else {
            refused
        }
    };
    if !valid_target(target.as_bytes()) {
        return Err(after(BAD_REQUEST));
    }
    let http11 = version == 1;
    let fields = RequestFields::read(req.headers, http11, method == "CONNECT").map_err(after)?;
    Ok(Some(RequestHead {
        method,
        target,
        http11,
        headers: req.headers,
        len,
        framing: fields.framing,
        keep_alive: fields.keep_alive,
        expect_continue: fields.expect_continue,
        upgrade: fields.upgrade,
    }))
}

/// What a request head's fields say of its framing and connection, read in order as hyper's
/// server reads them.
struct RequestFields {
    framing: Framing,
    keep_alive: bool,
    expect_continue: bool,
    upgrade: bool,
}

impl RequestFields {
    fn read(
        headers: &[httparse::Header<'_>],
        http11: bool,
        connect: bool,
    ) -> Result<RequestFields, Refused> {
        let mut framing = Framing::Empty;
        let mut keep_alive = http11;
        let mut saw_close = false;
        let mut length: Option<u64> = None;
        let (mut has_length, mut te, mut te_chunked) = (false, false, false);
        let (mut expect_continue, mut upgrade) = (false, connect);
        for h in headers {
            match role(h.name.as_bytes()) {
                Role::TransferEncoding => {
                    if !http11 {
                        return Err(BAD_REQUEST);
                    }
                    te = true;
                    if has_length {
                        length = None;
                    }
                    te_chunked = last_coding_is_chunked(h.value);
                    if te_chunked {
                        framing = Framing::Chunked;
                    }
                }
                Role::ContentLength => {
                    has_length = true;
                    if te {
                        continue;
                    }
                    let n = parse_decimal(h.value).ok_or(BAD_REQUEST)?;
                    match length {
                        Some(prev) if prev != n => return Err(BAD_REQUEST),
                        Some(_) => continue,
                        None => {}
                    }
                    if n > MAX_BODY_LEN {
                        return Err(TOO_LARGE);
                    }
                    framing = if n == 0 {
                        Framing::Empty
                    } else {
                        Framing::Length(n)
                    };
                    length = Some(n);
                }
                Role::Connection => {
                    if saw_close || has_token(h.value, b"close") {
                        saw_close = true;
                        keep_alive = false;
                    } else if !keep_alive {
                        keep_alive = has_token(h.value, b"keep-alive");
                    }
                }
                Role::HopByHop if h.name.eq_ignore_ascii_case("upgrade") => upgrade = http11,
                Role::EndToEnd if h.name.eq_ignore_ascii_case("expect") => {
                    expect_continue = h.value.eq_ignore_ascii_case(b"100-continue");
                }
                Role::HopByHop | Role::EndToEnd => {}
            }
        }
        if te && !te_chunked {
            return Err(BAD_REQUEST);
        }
        Ok(RequestFields {
            framing,
            keep_alive: keep_alive && !(te && has_length),
            expect_continue,
            upgrade,
        })
    }
}

/// Whether a request target is one `http::Uri` takes. The common origin-form target of visible
/// ASCII that needs no escaping is checked here; any other goes through `http::Uri` itself.
fn valid_target(target: &[u8]) -> bool {
    let plain =
        |b: &u8| matches!(b, b'!' | b'$'..=b';' | b'=' | b'?'..=b'_' | b'a'..=b'z' | b'|' | b'~');
    if target.first() == Some(&b'/') && target.iter().all(plain) {
        return true;
    }
    http::Uri::try_from(target).is_ok()
}

/// Whether a field value, read as hyper reads it (visible ASCII and tabs only, else it says
/// nothing), has `token` (any case) among its comma-separated elements.
fn has_token(value: &[u8], token: &[u8]) -> bool {
    visible(value)
        && value
            .split(|&b| b == b',')
            .any(|t| trim(t).eq_ignore_ascii_case(token))
}

/// Whether the last coding of a `Transfer-Encoding` value is `chunked` (as hyper reads it: the
/// text after the last comma, trimmed; a value with other than visible ASCII is not chunked).
pub fn last_coding_is_chunked(value: &[u8]) -> bool {
    visible(value)
        && value
            .rsplit(|&b| b == b',')
            .next()
            .is_some_and(|t| trim(t).eq_ignore_ascii_case(b"chunked"))
}

/// Visible ASCII and tabs only (what `HeaderValue::to_str` takes).
fn visible(value: &[u8]) -> bool {
    value
        .iter()
        .all(|&b| b == b'\t' || (b' '..=b'~').contains(&b))
}

/// Without leading and trailing whitespace (as `str::trim` on ASCII).
fn trim(s: &[u8]) -> &[u8] {
    s.trim_ascii()
}

/// Digits only, no sign, no overflow (hyper's `from_digits`).
pub fn parse_decimal(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() {
        return None;
    }
    digits.iter().try_fold(0u64, |n, &d| {
        if d.is_ascii_digit() {
            n.checked_mul(10)?.checked_add(u64::from(d - b'0'))
        } else {
            None
        }
    })
}

/// A parsed response head, borrowing the buffer it was parsed from.
#[derive(Debug)]
pub struct ResponseHead<'h, 'b> {
    /// The status code (100 to 999).
    pub status: u16,
    /// HTTP/1.1 (else HTTP/1.0).
    pub http11: bool,
    /// Every header field, in order.
    pub headers: &'h [httparse::Header<'b>],
    /// Bytes of the head (status line, fields and the empty line).
    pub len: usize,
    /// What its framing and hop-by-hop fields say.
    pub fields: ResponseFields,
}

/// A complete response head at the start of `buf`; `Ok(None)` when more bytes are needed; else
/// why it is refused (as hyper's client refuses it).
pub fn parse_response<'h, 'b>(
    buf: &'b [u8],
    slots: &'h mut HeaderSlots<'b>,
) -> Result<Option<ResponseHead<'h, 'b>>, &'static str> {
    let mut parsed = httparse::Response::new(&mut []);
    let config = httparse::ParserConfig::default();
    let len = match config.parse_response_with_uninit_headers(&mut parsed, buf, slots) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => return Err("too many headers"),
        Err(_) => return Err("malformed status line or header"),
    };
    let (Some(code), Some(version)) = (parsed.code, parsed.version) else {
        return Err("malformed status line or header");
    };
    if !(100..=999).contains(&code) {
        return Err("status code");
    }
    Ok(Some(ResponseHead {
        status: code,
        http11: version == 1,
        headers: parsed.headers,
        len,
        fields: ResponseFields::read(parsed.headers),
    }))
}

/// What a response head's framing and hop-by-hop fields say, read in one pass over its fields.
#[derive(Clone, Copy, Debug)]
pub struct ResponseFields {
    /// The `Content-Length`, when given: every value (and list element) the same decimal
    /// number; else why not.
    length: Result<Option<u64>, &'static str>,
    /// `Transfer-Encoding` is present: whether the last one's last coding is `chunked`.
    chunked: Option<bool>,
    /// `Connection` says `close`.
    pub close: bool,
    /// `Connection` names other fields (hop-by-hop: left out too).
    names_fields: bool,
}

impl ResponseFields {
    /// Reads the head's fields.
    fn read(headers: &[httparse::Header<'_>]) -> ResponseFields {
        let mut fields = ResponseFields {
            length: Ok(None),
            chunked: None,
            close: false,
            names_fields: false,
        };
        for h in headers {
            match role(h.name.as_bytes()) {
                Role::ContentLength => fields.add_length(h.value),
                Role::TransferEncoding => fields.chunked = Some(last_coding_is_chunked(h.value)),
                Role::Connection => {
                    for token in elements(h.value) {
                        if token.eq_ignore_ascii_case(b"close") {
                            fields.close = true;
                        } else if !is_connection_option(token) && visible(h.value) {
                            fields.names_fields = true;
                        }
                    }
                }
                Role::HopByHop | Role::EndToEnd => {}
            }
        }
        fields
    }

    /// One `Content-Length` value: every list element the same decimal number as before (as
    /// hyper's client reads them: visible ASCII only).
    fn add_length(&mut self, value: &[u8]) {
        let Ok(mut length) = self.length else { return };
        if !visible(value) {
            self.length = Err("Content-Length is not a number");
            return;
        }
        for part in value.split(|&b| b == b',') {
            let Some(n) = parse_decimal(trim(part)) else {
                self.length = Err("Content-Length is not a number");
                return;
            };
            if length.is_some_and(|l| l != n) {
                self.length = Err("differing Content-Lengths");
                return;
            }
            length = Some(n);
        }
        self.length = Ok(length);
    }

    /// Whether the field named `name` is relayed: not hop-by-hop, not named by `Connection`, not
    /// a `Content-Length` that `Transfer-Encoding` overrides.
    pub fn relays(&self, name: &[u8], headers: &[httparse::Header<'_>]) -> bool {
        match role(name) {
            Role::EndToEnd => !self.names_fields || !named_by_connection(name, headers),
            Role::ContentLength => {
                self.chunked.is_none()
                    && (!self.names_fields || !named_by_connection(name, headers))
            }
            Role::Connection | Role::TransferEncoding | Role::HopByHop => false,
        }
    }
}

/// Whether a `Connection` field of the head names `name`.
fn named_by_connection(name: &[u8], headers: &[httparse::Header<'_>]) -> bool {
    headers
        .iter()
        .filter(|h| role(h.name.as_bytes()) == Role::Connection && visible(h.value))
        .flat_map(|h| elements(h.value))
        .any(|token| !is_connection_option(token) && token.eq_ignore_ascii_case(name))
}

/// A response body's framing (RFC 9112 section 6.3, as hyper's client decides it), and whether
/// the connection may carry another response after it. `Transfer-Encoding` overrides
/// `Content-Length` (which is then ignored), but a response carrying both may be an attempt at
/// response splitting: its connection is closed after it. HTTP/1.0 with `Transfer-Encoding` is
/// refused.
pub fn response_framing(
    status: u16,
    http11: bool,
    fields: &ResponseFields,
    head_request: bool,
) -> Result<(Framing, bool), &'static str> {
    let chunked_and_length = fields.chunked.is_some() && !matches!(fields.length, Ok(None));
    if head_request || status == 204 || status == 304 {
        return Ok((Framing::Empty, !chunked_and_length));
    }
    if let Some(chunked) = fields.chunked {
        if !http11 {
            return Err("Transfer-Encoding in HTTP/1.0");
        }
        if !chunked {
            return Ok((Framing::Close, false));
        }
        return Ok((Framing::Chunked, !chunked_and_length));
    }
    Ok(match fields.length? {
        Some(0) => (Framing::Empty, true),
        Some(n) if n > MAX_BODY_LEN => return Err("Content-Length too large"),
        Some(n) => (Framing::Length(n), true),
        None => (Framing::Close, false),
    })
}

/// The elements of a comma-separated field value, trimmed, empty ones skipped.
fn elements(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value
        .split(|&b| b == b',')
        .map(trim)
        .filter(|t| !t.is_empty())
}

/// `Connection` options that are not field names (`keep-alive` and `upgrade` go anyway); one
/// list for duet's response heads and the proxy's `strip_hop_by_hop`.
pub fn is_connection_option(token: &[u8]) -> bool {
    [&b"keep-alive"[..], b"close", b"upgrade"]
        .iter()
        .any(|o| token.eq_ignore_ascii_case(o))
}

/// What a field is to the framing and to the hop-by-hop rules (RFC 9110 section 7.6.1): the one
/// list of hop-by-hop names, for duet's response heads and for the proxy's `strip_hop_by_hop` on
/// header maps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Connection,
    TransferEncoding,
    ContentLength,
    /// Another hop-by-hop field: `Keep-Alive`, `Proxy-Connection`, `TE`, `Trailer`, `Upgrade`,
    /// `HTTP2-Settings`.
    HopByHop,
    /// Relayed.
    EndToEnd,
}

/// The role of a field by its name (any case).
pub fn role(name: &[u8]) -> Role {
    let is = |known: &[u8]| name.eq_ignore_ascii_case(known);
    match name.len() {
        2 if is(b"te") => Role::HopByHop,
        7 if is(b"trailer") || is(b"upgrade") => Role::HopByHop,
        10 if is(b"connection") => Role::Connection,
        10 if is(b"keep-alive") => Role::HopByHop,
        14 if is(b"content-length") => Role::ContentLength,
        14 if is(b"http2-settings") => Role::HopByHop,
        16 if is(b"proxy-connection") => Role::HopByHop,
        17 if is(b"transfer-encoding") => Role::TransferEncoding,
        _ => Role::EndToEnd,
    }
}

#[cfg(test)]
#[path = "h1_tests.rs"]
mod tests;
