//! The access log: one JSON line per request, written by a dedicated thread from a queue bounded in
//! bytes, so a request never waits for a terminal or a pipe and long hosts or targets cannot make
//! the queue large. When the queue is full the line is dropped and counted
//! (`duet_access_log_dropped_total`).

use std::fmt;
use std::io::{self, Write};
use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, SyncSender};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::{HeaderValue, Method, Uri, Version};
use serde_json::ser::{CompactFormatter, Formatter};

use crate::metrics::Metrics;
use crate::table::{normalize_addr, Family, UnknownName};

/// Bytes of entries queued for the writer before new ones are dropped: 8 MiB (about 20,000
/// entries of a typical request; an entry counts its host, target and SNI).
pub const QUEUE_BYTES: usize = 8 << 20;

/// How long the writer lets lines gather after waking, so that a busy proxy wakes it once per
/// batch rather than once per request.
const BATCH_DELAY: Duration = Duration::from_millis(10);

/// One field of an access-log line: its JSON key, how its value is written and what it holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Field {
    /// The JSON key.
    pub name: &'static str,
    /// How the value is written.
    pub format: &'static str,
    /// What it holds.
    pub meaning: &'static str,
}

/// Every field of a JSON access-log line, in the order [`Entry::write_json`] writes them (a test
/// holds the two together; the reference page is rendered from this table).
pub const FIELDS: [Field; 21] = [
    Field {
        name: "time",
        format: "string, RFC 3339 UTC with milliseconds: `2026-11-29T20:34:47.123Z`",
        meaning: "When the request arrived.",
    },
    Field {
        name: "client_addr",
        format: "string: dotted IPv4 or RFC 5952 IPv6, without brackets",
        meaning: "The client's address (after PROXY protocol); an IPv4-mapped IPv6 peer is written as IPv4.",
    },
    Field {
        name: "client_port",
        format: "number",
        meaning: "The client's port.",
    },
    Field {
        name: "client_family",
        format: "`\"ipv4\"` or `\"ipv6\"`",
        meaning: "The client's address family.",
    },
    Field {
        name: "listener",
        format: "string: `ADDR:PORT`, IPv6 bracketed (`[::]:8443`)",
        meaning: "The local address the request was accepted on.",
    },
    Field {
        name: "host",
        format: "string or `null`",
        meaning: "The Host header (or HTTP/2 `:authority`) as received.",
    },
    Field {
        name: "method",
        format: "string",
        meaning: "The request method.",
    },
    Field {
        name: "path",
        format: "string",
        meaning: "The request path as received, without the query.",
    },
    Field {
        name: "protocol",
        format: "`\"HTTP/1.0\"`, `\"HTTP/1.1\"` or `\"HTTP/2.0\"`",
        meaning: "The client's HTTP version.",
    },
    Field {
        name: "status",
        format: "number",
        meaning: "The status code sent; 499 when the client went away before a response.",
    },
    Field {
        name: "bytes",
        format: "number",
        meaning: "Response body bytes sent.",
    },
    Field {
        name: "duration_seconds",
        format: "number (seconds, shortest decimal form)",
        meaning: "From the request's arrival to the last response byte.",
    },
    Field {
        name: "upstream_addr",
        format: "string `ADDR:PORT` (IPv6 bracketed) or `null`",
        meaning: "The pod address that answered, or failed after the request was sent; `null` when duet answered itself.",
    },
    Field {
        name: "upstream_family",
        format: "`\"ipv4\"`, `\"ipv6\"` or `null`",
        meaning: "The family of `upstream_addr`.",
    },
    Field {
        name: "upstream_protocol",
        format: "`\"http1\"`, `\"h2c\"`, `\"https\"`, `\"h2\"` or `null`",
        meaning: "The protocol spoken to the upstream (from the Service port's `appProtocol`).",
    },
    Field {
        name: "upstream_response_seconds",
        format: "number (seconds) or `null`",
        meaning: "From sending the request upstream to the upstream's response head.",
    },
    Field {
        name: "namespace",
        format: "string or `null`",
        meaning: "The namespace of the matched route's Ingress (or HTTPRoute).",
    },
    Field {
        name: "ingress",
        format: "string or `null`",
        meaning: "The name of the matched route's Ingress (or HTTPRoute).",
    },
    Field {
        name: "service",
        format: "string or `null`",
        meaning: "The Service of the matched route's backend.",
    },
    Field {
        name: "tls_version",
        format: "string, only over TLS: `\"TLSv1.2\"` or `\"TLSv1.3\"`",
        meaning: "The negotiated TLS version; absent on plain HTTP.",
    },
    Field {
        name: "sni",
        format: "string, only over TLS when the client sent one",
        meaning: "The TLS server name the client asked for.",
    },
];

/// `--access-log`: the format of the access log.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AccessLogFormat {
    /// One JSON object per line on stdout (the default).
    #[default]
    Json,
    /// No access log.
    Off,
}

impl FromStr for AccessLogFormat {
    type Err = UnknownName;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "json" => Ok(AccessLogFormat::Json),
            "off" => Ok(AccessLogFormat::Off),
            other => Err(UnknownName {
                what: "access log format",
                given: other.to_owned(),
                expected: "json, off",
            }),
        }
    }
}

/// The TLS side of a request, when it came over TLS.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsInfo {
    /// The negotiated protocol version (`TLSv1.3`).
    pub version: &'static str,
    /// The server name the client asked for.
    pub sni: Option<Arc<str>>,
}

/// What is known of one request when its response is done.
#[derive(Clone, Debug)]
pub struct Entry {
    /// When the request arrived.
    pub time: SystemTime,
    /// The client's address.
    pub client: SocketAddr,
    /// The local address the request was accepted on.
    pub listener: SocketAddr,
    /// The Host header (or `:authority`) as received.
    pub host: Option<HeaderValue>,
    /// The request method.
    pub method: Method,
    /// The request target.
    pub uri: Uri,
    /// The client's HTTP version.
    pub version: Version,
    /// The status code sent (499: the client went away before a response).
    pub status: u16,
    /// Response body bytes sent.
    pub bytes: u64,
    /// Request arrival to the last response byte.
    pub duration: Duration,
    /// The upstream address that answered (or failed after the request was sent).
    pub upstream: Option<SocketAddr>,
    /// Upstream send to response head.
    pub upstream_time: Option<Duration>,
    /// The protocol spoken to the matched backend.
    pub upstream_protocol: Option<crate::table::UpstreamProtocol>,
    /// Namespace, Ingress and Service of the matched route.
    pub route: Option<[Arc<str>; 3]>,
    /// TLS version and SNI, for requests over TLS.
    pub tls: Option<TlsInfo>,
}

fn protocol(version: Version) -> &'static str {
    match version {
        Version::HTTP_09 => "HTTP/0.9",
        Version::HTTP_10 => "HTTP/1.0",
        Version::HTTP_11 => "HTTP/1.1",
        Version::HTTP_2 => "HTTP/2.0",
        Version::HTTP_3 => "HTTP/3.0",
        _ => "HTTP",
    }
}

impl Entry {
    /// Writes the entry as one JSON line (with the newline) straight into `out`: the fields in a
    /// fixed order, strings escaped in place, no intermediate strings. Addresses are normalised
    /// (IPv4-mapped IPv6 as IPv4) and IPv6 is written in RFC 5952 form, bracketed where a port
    /// follows.
    pub fn write_json(&self, out: &mut Vec<u8>) -> io::Result<()> {
        let client = normalize_addr(self.client);
        let upstream = self.upstream.map(normalize_addr);
        out.extend_from_slice(b"{\"time\":\"");
        write_rfc3339(out, self.time);
        out.extend_from_slice(b"\",\"client_addr\":\"");
        write_ip(out, client.ip())?;
        out.extend_from_slice(b"\",\"client_port\":");
        CompactFormatter.write_u16(out, client.port())?;
        out.extend_from_slice(b",\"client_family\":");
        write_family(out, Some(Family::of(&client)));
        out.extend_from_slice(b",\"listener\":\"");
        write_socket_addr(out, normalize_addr(self.listener))?;
        out.extend_from_slice(b"\",\"host\":");
        let host = self
            .host
            .as_ref()
            .map(|h| String::from_utf8_lossy(h.as_bytes()));
        write_opt_str(out, host.as_deref())?;
        out.extend_from_slice(b",\"method\":");
        write_str(out, self.method.as_str())?;
        out.extend_from_slice(b",\"path\":");
        write_str(out, self.uri.path())?;
        out.extend_from_slice(b",\"protocol\":\"");
        out.extend_from_slice(protocol(self.version).as_bytes());
        out.extend_from_slice(b"\",\"status\":");
        CompactFormatter.write_u16(out, self.status)?;
        out.extend_from_slice(b",\"bytes\":");
        CompactFormatter.write_u64(out, self.bytes)?;
        out.extend_from_slice(b",\"duration_seconds\":");
        write_seconds(out, Some(self.duration))?;
        self.write_upstream(out, upstream)?;
        let route = self.route.as_ref();
        for (name, i) in [
            (&b",\"namespace\":"[..], 0),
            (b",\"ingress\":", 1),
            (b",\"service\":", 2),
        ] {
            out.extend_from_slice(name);
            write_opt_str(out, route.map(|r| &*r[i]))?;
        }
        if let Some(tls) = &self.tls {
            out.extend_from_slice(b",\"tls_version\":");
            write_str(out, tls.version)?;
            if let Some(sni) = &tls.sni {
                out.extend_from_slice(b",\"sni\":");
                write_str(out, sni)?;
            }
        }
        out.extend_from_slice(b"}\n");
        Ok(())
    }

    /// The upstream fields: address, family, protocol (`null` without an address) and time.
    fn write_upstream(&self, out: &mut Vec<u8>, upstream: Option<SocketAddr>) -> io::Result<()> {
        out.extend_from_slice(b",\"upstream_addr\":");
        match upstream {
            Some(addr) => {
                out.push(b'"');
                write_socket_addr(out, addr)?;
                out.push(b'"');
            }
            None => out.extend_from_slice(b"null"),
        }
        out.extend_from_slice(b",\"upstream_family\":");
        write_family(out, upstream.map(|a| Family::of(&a)));
        out.extend_from_slice(b",\"upstream_protocol\":");
        let protocol = upstream.and(self.upstream_protocol).map(|p| p.as_str());
        write_opt_str(out, protocol)?;
        out.extend_from_slice(b",\"upstream_response_seconds\":");
        write_seconds(out, self.upstream_time)
    }
}

/// A JSON string, escaped as `serde_json` escapes one (quotes, backslashes and control
/// characters); a plain copy when there is nothing to escape, as in almost every field.
fn write_str(out: &mut Vec<u8>, s: &str) -> io::Result<()> {
    if needs_escape(s.as_bytes()) {
        return serde_json::to_writer(&mut *out, s).map_err(io::Error::from);
    }
    out.reserve(s.len() + 2);
    out.push(b'"');
    out.extend_from_slice(s.as_bytes());
    out.push(b'"');
    Ok(())
}

/// Whether a string has a byte JSON escapes: a control character, `"` or `\`. Eight bytes at
/// a time (the usual "has a byte less than n" and "has a zero byte" word tricks, exact for the
/// question whether any byte is), as every line has eight strings or so to check.
fn needs_escape(s: &[u8]) -> bool {
    const ONES: u64 = u64::from_ne_bytes([1; 8]);
    const HIGH: u64 = u64::from_ne_bytes([0x80; 8]);
    let less_than = |x: u64, n: u8| x.wrapping_sub(ONES * u64::from(n)) & !x & HIGH;
    let zero = |x: u64| x.wrapping_sub(ONES) & !x & HIGH;
    let mut words = s.chunks_exact(8);
    for word in &mut words {
        let mut bytes = [0; 8];
        bytes.copy_from_slice(word);
        let x = u64::from_ne_bytes(bytes);
        let quote = zero(x ^ (ONES * u64::from(b'"')));
        let backslash = zero(x ^ (ONES * u64::from(b'\\')));
        if less_than(x, 0x20) | quote | backslash != 0 {
            return true;
        }
    }
    words
        .remainder()
        .iter()
        .any(|&b| b < 0x20 || b == b'"' || b == b'\\')
}

/// [`write_str`], or `null`.
fn write_opt_str(out: &mut Vec<u8>, s: Option<&str>) -> io::Result<()> {
    match s {
        Some(s) => write_str(out, s),
        None => {
            out.extend_from_slice(b"null");
            Ok(())
        }
    }
}

/// `"ipv4"`, `"ipv6"` (as `Family` serializes), or `null`.
fn write_family(out: &mut Vec<u8>, family: Option<Family>) {
    out.extend_from_slice(match family {
        Some(Family::V4) => b"\"ipv4\"",
        Some(Family::V6) => b"\"ipv6\"",
        None => b"null",
    });
}

/// Seconds as `serde_json` writes an `f64` (shortest round-trip form), or `null`.
fn write_seconds(out: &mut Vec<u8>, time: Option<Duration>) -> io::Result<()> {
    match time {
        Some(t) => CompactFormatter.write_f64(out, t.as_secs_f64()),
        None => {
            out.extend_from_slice(b"null");
            Ok(())
        }
    }
}

/// An address as `Display` writes it: dotted IPv4, RFC 5952 IPv6 (IPv4-mapped ones as
/// `::ffff:a.b.c.d`). Written digit by digit: `write!` (the formatting machinery) cost about
/// 400 instructions per IPv6 address and `itoa`'s per octet 50, three addresses a line.
fn write_ip(out: &mut Vec<u8>, ip: IpAddr) -> io::Result<()> {
    match ip {
        IpAddr::V4(v4) => write_ipv4(out, v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => {
                out.extend_from_slice(b"::ffff:");
                write_ipv4(out, v4);
            }
            None => write_ipv6(out, &v6.segments()),
        },
    }
    Ok(())
}

/// Dotted decimal.
fn write_ipv4(out: &mut Vec<u8>, ip: std::net::Ipv4Addr) {
    for (i, octet) in ip.octets().into_iter().enumerate() {
        if i > 0 {
            out.push(b'.');
        }
        if octet >= 100 {
            out.push(b'0' + octet / 100);
        }
        if octet >= 10 {
            out.push(b'0' + octet / 10 % 10);
        }
        out.push(b'0' + octet % 10);
    }
}

/// RFC 5952, as the standard library's `Display` writes it: lower-case hex without leading
/// zeros, the first longest run of two or more zero groups as `::`.
fn write_ipv6(out: &mut Vec<u8>, segments: &[u16; 8]) {
    // The first longest run of zero groups: (start, length).
    let (mut longest, mut current) = ((0, 0), (0, 0));
    for (i, &segment) in segments.iter().enumerate() {
        if segment == 0 {
            if current.1 == 0 {
                current.0 = i;
            }
            current.1 += 1;
            if current.1 > longest.1 {
                longest = current;
            }
        } else {
            current = (0, 0);
        }
    }
    let groups = |out: &mut Vec<u8>, part: &[u16]| {
        for (i, &segment) in part.iter().enumerate() {
            if i > 0 {
                out.push(b':');
            }
            write_hex(out, segment);
        }
    };
    if longest.1 > 1 {
        groups(out, &segments[..longest.0]);
        out.extend_from_slice(b"::");
        groups(out, &segments[longest.0 + longest.1..]);
    } else {
        groups(out, segments);
    }
}

/// A group in lower-case hex without leading zeros.
fn write_hex(out: &mut Vec<u8>, group: u16) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let digits = (16 - group.leading_zeros()).div_ceil(4).max(1);
    for k in (0..digits).rev() {
        out.push(HEX[usize::from((group >> (4 * k)) & 0xf)]);
    }
}

/// A normalised socket address (no flow label or scope) as `Display` writes it: `a.b.c.d:p`,
/// `[v6]:p`.
fn write_socket_addr(out: &mut Vec<u8>, addr: SocketAddr) -> io::Result<()> {
    let v6 = addr.is_ipv6();
    if v6 {
        out.push(b'[');
    }
    write_ip(out, addr.ip())?;
    out.extend_from_slice(if v6 { b"]:" } else { b":" });
    CompactFormatter.write_u16(out, addr.port())
}

impl Entry {
    /// About what the entry holds in memory while queued: itself, its host, target and SNI.
    pub fn queued_bytes(&self) -> usize {
        let uri = &self.uri;
        std::mem::size_of::<Entry>()
            + self.host.as_ref().map_or(0, HeaderValue::len)
            + uri.path_and_query().map_or(0, |p| p.as_str().len())
            + uri.authority().map_or(0, |a| a.as_str().len())
            + self
                .tls
                .as_ref()
                .and_then(|t| t.sni.as_ref())
                .map_or(0, |s| s.len())
    }
}

/// `2026-11-29T20:34:47.123Z`: UTC, milliseconds.
pub fn rfc3339(time: SystemTime) -> String {
    let at = jiff::Timestamp::try_from(time).unwrap_or(jiff::Timestamp::UNIX_EPOCH);
    format!("{at:.3}")
}

/// Seconds from 1970 to the last second `jiff` represents (9999-12-30T22:00:00Z): later times
/// (and times before 1970) take [`rfc3339`]'s general path.
const LAST_SECOND: u64 = 253_402_207_200;

/// [`rfc3339`] written into `out`: the date computed from the seconds since 1970 (Howard
/// Hinnant's `civil_from_days`) without formatting machinery.
fn write_rfc3339(out: &mut Vec<u8>, time: SystemTime) {
    let since = match time.duration_since(UNIX_EPOCH) {
        Ok(since) if since.as_secs() <= LAST_SECOND => since,
        _ => return out.extend_from_slice(rfc3339(time).as_bytes()),
    };
    let secs = since.as_secs();
    let (days, of_day) = (secs / 86_400, secs % 86_400);
    let (year, month, day) = civil_from_days(days);
    let mut text = *b"0000-00-00T00:00:00.000Z";
    put_digits(&mut text[0..4], year);
    put_digits(&mut text[5..7], month);
    put_digits(&mut text[8..10], day);
    put_digits(&mut text[11..13], of_day / 3600);
    put_digits(&mut text[14..16], of_day / 60 % 60);
    put_digits(&mut text[17..19], of_day % 60);
    put_digits(&mut text[20..23], u64::from(since.subsec_millis()));
    out.extend_from_slice(&text);
}

/// `n` in decimal, zero-padded to the width of `to`.
fn put_digits(to: &mut [u8], mut n: u64) {
    for digit in to.iter_mut().rev() {
        *digit = b'0' + (n % 10) as u8;
        n /= 10;
    }
}

/// Year, month and day of `days` after 1970-01-01 (proleptic Gregorian).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

enum Msg {
    /// An entry and the bytes it counts in the queue.
    Line(Box<Entry>, usize),
    Flush(SyncSender<()>),
}

/// The sending side of the access log; cheap to clone (one reference count: every logged
/// request holds a clone).
#[derive(Clone)]
pub struct AccessLog(Arc<Senders>);

/// What every clone of an [`AccessLog`] shares (its fields stay private).
pub struct Senders {
    tx: Sender<Msg>,
    queue: Arc<Queue>,
    metrics: Arc<Metrics>,
}

/// The bytes of queued entries, shared by the senders and the writer.
#[derive(Debug)]
struct Queue {
    bytes: AtomicUsize,
    capacity: usize,
}

impl Queue {
    /// Counts `n` more bytes in, unless that passes the capacity.
    fn reserve(&self, n: usize) -> bool {
        self.bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |queued| {
                queued
                    .checked_add(n)
                    .filter(|&total| total <= self.capacity)
            })
            .is_ok()
    }

    fn release(&self, n: usize) {
        self.bytes.fetch_sub(n, Ordering::AcqRel);
    }
}

impl fmt::Debug for Senders {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Senders").finish_non_exhaustive()
    }
}

impl fmt::Debug for AccessLog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AccessLog").finish_non_exhaustive()
    }
}

impl std::ops::Deref for AccessLog {
    type Target = Senders;

    fn deref(&self) -> &Senders {
        &self.0
    }
}

impl AccessLog {
    /// Starts the writer thread over `out` with a queue of `capacity` bytes of entries (as
    /// [`Entry::queued_bytes`] counts them).
    pub fn spawn<W: Write + Send + 'static>(
        out: W,
        capacity: usize,
        metrics: Arc<Metrics>,
    ) -> io::Result<AccessLog> {
        let (tx, rx) = mpsc::channel();
        let queue = Arc::new(Queue {
            bytes: AtomicUsize::new(0),
            capacity,
        });
        let writer = queue.clone();
        std::thread::Builder::new()
            .name("duet-access-log".into())
            .spawn(move || write_loop(rx, out, &writer))?;
        Ok(AccessLog(Arc::new(Senders { tx, queue, metrics })))
    }

    /// The access log on stdout.
    pub fn stdout(metrics: Arc<Metrics>) -> io::Result<AccessLog> {
        AccessLog::spawn(io::stdout(), QUEUE_BYTES, metrics)
    }

    /// Queues a line; never blocks. A full queue drops the line and counts it.
    pub fn log(&self, entry: Box<Entry>) {
        let log = &*self.0;
        let size = entry.queued_bytes();
        if !log.queue.reserve(size) {
            log.metrics.access_log_dropped();
            return;
        }
        if log.tx.send(Msg::Line(entry, size)).is_err() {
            log.queue.release(size);
            log.metrics.access_log_dropped();
        }
    }

    /// Waits (at most `timeout`) until every line queued so far is written and flushed.
    pub fn flush(&self, timeout: Duration) -> bool {
        let (ack, done) = mpsc::sync_channel(1);
        self.0.tx.send(Msg::Flush(ack)).is_ok() && done.recv_timeout(timeout).is_ok()
    }
}

fn write_loop<W: Write>(rx: Receiver<Msg>, out: W, queue: &Queue) {
    let mut out = io::BufWriter::with_capacity(64 * 1024, out);
    let mut buf = Vec::with_capacity(512);
    let mut acks = Vec::new();
    while let Ok(first) = rx.recv() {
        let mut next = Some(first);
        if matches!(next, Some(Msg::Line(..))) {
            std::thread::sleep(BATCH_DELAY);
        }
        while let Some(msg) = next.take().or_else(|| rx.try_recv().ok()) {
            match msg {
                Msg::Line(entry, size) => {
                    buf.clear();
                    if entry.write_json(&mut buf).is_ok() && out.write_all(&buf).is_err() {
                        // stdout is gone (closed pipe): nothing sensible to do but drop lines.
                    }
                    drop(entry);
                    queue.release(size);
                }
                Msg::Flush(ack) => acks.push(ack),
            }
        }
        let _ = out.flush();
        for ack in acks.drain(..) {
            let _ = ack.send(());
        }
    }
    let _ = out.flush();
}

/// The request's Host value as an entry keeps it: a copy. A clone would share, and keep alive
/// until the writer thread has written the line, the buffer the request was read into, so the
/// HTTP/1.1 server could not reuse it for the next request (a new read buffer per request, and
/// its release on the writer thread: about 4,000 instructions per request).
pub(crate) fn owned_host(value: &HeaderValue) -> HeaderValue {
    HeaderValue::from_bytes(value.as_bytes()).unwrap_or_else(|_| value.clone())
}

/// The request target as an entry keeps it: an origin-form target copied, for the reason of
/// [`owned_host`]; other forms (HTTP/2's, absolute ones) as they are.
pub(crate) fn owned_uri(uri: &Uri) -> Uri {
    match uri.path_and_query() {
        Some(origin) if uri.scheme().is_none() && uri.authority().is_none() => {
            let copy = bytes::Bytes::copy_from_slice(origin.as_str().as_bytes());
            http::uri::PathAndQuery::from_maybe_shared(copy)
                .map(Uri::from)
                .unwrap_or_else(|_| uri.clone())
        }
        _ => uri.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    proptest::proptest! {
        #[test]
        fn strings_are_escaped_exactly_when_serde_json_would(
            s in proptest::string::string_regex("[ -~\\x00-\\x1f\\x7f\\u{80}-\\u{3000}]{0,40}").unwrap(),
        ) {
            let plain = !s.bytes().any(|b| b < 0x20 || b == b'"' || b == b'\\');
            proptest::prop_assert_eq!(needs_escape(s.as_bytes()), !plain);
            let mut out = Vec::new();
            write_str(&mut out, &s).unwrap();
            proptest::prop_assert_eq!(out, serde_json::to_vec(&s).unwrap());
        }
    }

    /// An address written by `write_ip` (and `write_socket_addr`) as `Display` writes it.
    fn check_ip(ip: IpAddr) {
        let mut out = Vec::new();
        write_ip(&mut out, ip).unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), ip.to_string());
        let addr = SocketAddr::new(ip, 8443);
        let mut out = Vec::new();
        write_socket_addr(&mut out, addr).unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), addr.to_string());
    }

    #[test]
    fn addresses_of_both_families_are_written_as_display_writes_them() {
        for ip in [
            "0.0.0.0",
            "127.0.0.1",
            "10.9.99.100",
            "255.255.255.255",
            "::",
            "::1",
            "1::",
            "2001:db8::1",
            "2001:db8:0:0:1:0:0:1",
            "2001:0:0:1:0:0:0:1",
            "1:0:2:0:3:0:4:0",
            "0:1:0:0:2:0:0:0",
            "fe80::abcd:ef01:2345:6789",
            "::ffff:192.0.2.1",
            "::192.0.2.1",
            "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
        ] {
            check_ip(ip.parse().unwrap());
        }
    }

    proptest::proptest! {
        #[test]
        fn any_address_is_written_as_display_writes_it(
            bits in proptest::prelude::any::<u128>(),
            zeros in proptest::prelude::any::<u8>(),
            v4 in proptest::prelude::any::<u32>(),
        ) {
            // Groups zeroed by the mask's bits, so runs of zeros of every length and place occur.
            let mut segments = std::net::Ipv6Addr::from(bits).segments();
            for (i, segment) in segments.iter_mut().enumerate() {
                if zeros & (1 << i) != 0 {
                    *segment = 0;
                }
            }
            check_ip(IpAddr::V6(segments.into()));
            check_ip(IpAddr::V4(v4.into()));
            check_ip(IpAddr::V6(std::net::Ipv4Addr::from(v4).to_ipv6_mapped()));
        }
    }

    #[test]
    fn entries_do_not_share_the_buffer_the_request_was_read_into() {
        let read = bytes::Bytes::from_static(b"/a/b?c=d a.test");
        let uri = Uri::from_maybe_shared(read.slice(0..8)).unwrap();
        let host = HeaderValue::from_maybe_shared(read.slice(9..)).unwrap();
        let within = |p: *const u8| read.as_ptr_range().contains(&p);
        assert!(within(uri.path().as_ptr()) && within(host.as_bytes().as_ptr()));
        let (owned_uri, owned_host) = (owned_uri(&uri), owned_host(&host));
        assert_eq!((&owned_uri, &owned_host), (&uri, &host));
        assert_eq!(owned_uri.to_string(), "/a/b?c=d");
        assert!(
            !within(owned_uri.path().as_ptr()),
            "the target shares the read buffer"
        );
        assert!(
            !within(owned_host.as_bytes().as_ptr()),
            "the host shares the read buffer"
        );
    }
    use std::time::UNIX_EPOCH;

    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);

    impl Write for Shared {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn entry(client: &str, upstream: Option<&str>) -> Entry {
        Entry {
            time: UNIX_EPOCH + Duration::from_millis(1_764_448_487_123),
            client: client.parse().unwrap(),
            listener: "[::ffff:127.0.0.1]:8080".parse().unwrap(),
            host: Some(HeaderValue::from_static("demo.test")),
            method: Method::GET,
            uri: "/a/b?secret=1".parse().unwrap(),
            version: Version::HTTP_11,
            status: 200,
            bytes: 42,
            duration: Duration::from_micros(1500),
            upstream: upstream.map(|u| u.parse().unwrap()),
            upstream_time: Some(Duration::from_millis(1)),
            upstream_protocol: Some(crate::table::UpstreamProtocol::H2c),
            route: Some(["e2e".into(), "web".into(), "echo".into()]),
            tls: None,
        }
    }

    #[test]
    fn json_lines_normalise_addresses() {
        let mut out = Vec::new();
        entry("[2001:0db8:0:0:0:0:0:1]:4711", Some("[::ffff:10.0.0.1]:80"))
            .write_json(&mut out)
            .unwrap();
        assert_eq!(*out.last().unwrap(), b'\n');
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["time"], "2025-11-29T20:34:47.123Z");
        assert_eq!(v["client_addr"], "2001:db8::1");
        assert_eq!(v["client_port"], 4711);
        assert_eq!(v["client_family"], "ipv6");
        assert_eq!(v["listener"], "127.0.0.1:8080");
        assert_eq!(v["upstream_addr"], "10.0.0.1:80");
        assert_eq!(v["upstream_family"], "ipv4");
        assert_eq!(v["upstream_protocol"], "h2c");
        assert_eq!(v["path"], "/a/b", "the query is not logged");
        assert_eq!(v["namespace"], "e2e");
        assert_eq!(v["duration_seconds"], 0.0015);
        assert!(v.get("tls_version").is_none());

        let mut out = Vec::new();
        let mut e = entry("[::ffff:192.0.2.7]:1", None);
        e.tls = Some(TlsInfo {
            version: "TLSv1.3",
            sni: Some("demo.test".into()),
        });
        e.write_json(&mut out).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["client_addr"], "192.0.2.7");
        assert_eq!(v["client_family"], "ipv4");
        assert_eq!(v["upstream_addr"], serde_json::Value::Null);
        assert_eq!(v["upstream_protocol"], serde_json::Value::Null);
        assert_eq!(v["tls_version"], "TLSv1.3");
        assert_eq!(v["sni"], "demo.test");
    }

    /// The line as `serde_json` wrote it before `write_json` wrote fields by hand: the reference
    /// its bytes must equal.
    fn serde_line(e: &Entry) -> Vec<u8> {
        #[derive(serde::Serialize)]
        struct Line<'a> {
            time: String,
            client_addr: String,
            client_port: u16,
            client_family: Family,
            listener: String,
            host: Option<String>,
            method: &'a str,
            path: &'a str,
            protocol: &'static str,
            status: u16,
            bytes: u64,
            duration_seconds: f64,
            upstream_addr: Option<String>,
            upstream_family: Option<Family>,
            upstream_protocol: Option<&'static str>,
            upstream_response_seconds: Option<f64>,
            namespace: Option<&'a str>,
            ingress: Option<&'a str>,
            service: Option<&'a str>,
            #[serde(skip_serializing_if = "Option::is_none")]
            tls_version: Option<&'static str>,
            #[serde(skip_serializing_if = "Option::is_none")]
            sni: Option<&'a str>,
        }
        let client = normalize_addr(e.client);
        let upstream = e.upstream.map(normalize_addr);
        let route = e.route.as_ref();
        let line = Line {
            time: rfc3339(e.time),
            client_addr: client.ip().to_string(),
            client_port: client.port(),
            client_family: Family::of(&client),
            listener: normalize_addr(e.listener).to_string(),
            host: e
                .host
                .as_ref()
                .map(|h| String::from_utf8_lossy(h.as_bytes()).into_owned()),
            method: e.method.as_str(),
            path: e.uri.path(),
            protocol: protocol(e.version),
            status: e.status,
            bytes: e.bytes,
            duration_seconds: e.duration.as_secs_f64(),
            upstream_addr: upstream.map(|a| a.to_string()),
            upstream_family: upstream.map(|a| Family::of(&a)),
            upstream_protocol: upstream.and(e.upstream_protocol).map(|p| p.as_str()),
            upstream_response_seconds: e.upstream_time.map(|t| t.as_secs_f64()),
            namespace: route.map(|r| &*r[0]),
            ingress: route.map(|r| &*r[1]),
            service: route.map(|r| &*r[2]),
            tls_version: e.tls.as_ref().map(|t| t.version),
            sni: e.tls.as_ref().and_then(|t| t.sni.as_deref()),
        };
        let mut out = serde_json::to_vec(&line).unwrap();
        out.push(b'\n');
        out
    }

    #[test]
    fn fields_table_names_every_key_in_order() {
        let mut e = entry("[2001:db8::1]:4711", Some("[2001:db8::2]:80"));
        e.tls = Some(TlsInfo {
            version: "TLSv1.3",
            sni: Some("a.test".into()),
        });
        let mut out = Vec::new();
        e.write_json(&mut out).unwrap();
        let line: serde_json::Map<String, serde_json::Value> =
            serde_json::from_slice(&out).unwrap();
        let mut keys: Vec<&str> = line.keys().map(String::as_str).collect();
        let mut table: Vec<&str> = FIELDS.iter().map(|f| f.name).collect();
        let text = String::from_utf8(out).unwrap();
        let at: Vec<usize> = table
            .iter()
            .map(|name| text.find(&format!("\"{name}\":")).unwrap())
            .collect();
        assert!(at.is_sorted(), "FIELDS is not in the line's order: {text}");
        keys.sort();
        table.sort();
        assert_eq!(
            keys, table,
            "FIELDS (access_log.rs) differs from the line: {text}"
        );
    }

    #[test]
    fn json_lines_are_byte_for_byte_what_serde_json_writes() {
        let mut entries = Vec::new();
        for (client, upstream) in [
            ("127.0.0.1:1", Some("10.0.0.1:80")),
            ("[2001:0db8:0:0:0:0:0:1]:4711", Some("[::ffff:10.0.0.1]:80")),
            ("[::ffff:192.0.2.7]:65535", Some("[fe80::1:0:0:2]:8080")),
            ("[::]:0", None),
            ("255.255.255.255:9", Some("[2001:db8:0:1:1:1:1:1]:1")),
        ] {
            entries.push(entry(client, upstream));
        }
        let mut e = entry("[::1]:2", Some("[::1]:3"));
        e.host = Some(HeaderValue::from_bytes(b"a\"b\\c\xff\xfe\tz").unwrap());
        e.method = Method::from_bytes(b"PURGE").unwrap();
        e.uri = "/%22a/b%5C?x".parse().unwrap();
        e.version = Version::HTTP_2;
        e.status = 599;
        e.bytes = u64::MAX;
        e.duration = Duration::new(12_345, 678_901_234);
        e.upstream_time = None;
        e.route = Some(["n\"s".into(), "in\ngress".into(), "s\u{1}vc".into()]);
        e.tls = Some(TlsInfo {
            version: "TLSv1.2",
            sni: Some("\"sni\u{2028}é".into()),
        });
        entries.push(e);
        let mut e = entry("127.0.0.1:1", Some("127.0.0.1:2"));
        (e.host, e.route, e.upstream_protocol) = (None, None, None);
        e.version = Version::HTTP_10;
        e.duration = Duration::from_nanos(1);
        e.upstream_time = Some(Duration::from_secs(3));
        e.tls = Some(TlsInfo {
            version: "TLSv1.3",
            sni: None,
        });
        entries.push(e);
        for (i, mut e) in entries.into_iter().enumerate() {
            for time in [
                UNIX_EPOCH,
                UNIX_EPOCH + Duration::new(1_764_448_487, 999_999_999),
                UNIX_EPOCH + Duration::new(951_782_400 + 86_399, 1_000_000),
                UNIX_EPOCH + Duration::new(4_102_444_799, 500_000),
                UNIX_EPOCH + Duration::new(LAST_SECOND, 999_999_999),
                UNIX_EPOCH + Duration::from_secs(LAST_SECOND + 1),
                UNIX_EPOCH - Duration::from_secs(1),
            ] {
                e.time = time;
                let mut out = Vec::new();
                e.write_json(&mut out).unwrap();
                let (got, want) = (String::from_utf8_lossy(&out), serde_line(&e));
                assert_eq!(got, String::from_utf8_lossy(&want), "entry {i}");
            }
        }
    }

    #[test]
    fn dates_match_the_general_path_every_day_for_ten_thousand_years() {
        let mut out = Vec::new();
        let last = u64::try_from(jiff::Timestamp::MAX.as_second()).unwrap();
        assert_eq!(last, LAST_SECOND);
        for day in (0..LAST_SECOND / 86_400).step_by(13) {
            let time = UNIX_EPOCH + Duration::new(day * 86_400 + day % 86_400, (day as u32) * 7);
            out.clear();
            write_rfc3339(&mut out, time);
            assert_eq!(out, rfc3339(time).as_bytes(), "day {day}");
        }
    }

    /// A writer that blocks until `gate` says go (or is dropped).
    struct Gated(Mutex<mpsc::Receiver<()>>);

    impl Write for Gated {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            let _ = self.0.lock().unwrap().recv();
            Ok(b.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn the_queue_is_bounded_in_bytes_not_lines() {
        let (gate, wait) = mpsc::channel();
        let metrics = Metrics::unregistered();
        let capacity = 256 * 1024;
        let log = AccessLog::spawn(Gated(Mutex::new(wait)), capacity, metrics).unwrap();
        // Entries with 16 KiB targets while the writer is stuck: 16 fit in 256 KiB (and the
        // writer takes a few into its 64 KiB buffer before it blocks).
        let long = format!("/{}", "a".repeat(16 * 1024));
        for _ in 0..1000 {
            let mut e = entry("[2001:db8::1]:1", None);
            e.uri = long.parse().unwrap();
            log.log(Box::new(e));
        }
        let dropped = log.metrics.dropped_lines() as usize;
        assert!((1000 - 24..1000).contains(&dropped), "dropped {dropped}");
        assert!(log.queue.bytes.load(Ordering::Acquire) <= capacity);
        drop(gate);
        assert!(log.flush(Duration::from_secs(5)));
        assert_eq!(log.queue.bytes.load(Ordering::Acquire), 0);
    }

    #[test]
    fn dates() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400); // 2000-02-29
        assert_eq!(rfc3339(leap), "2000-02-29T00:00:00.000Z");
        let end = UNIX_EPOCH + Duration::from_secs(4_102_444_799); // 2099-12-31T23:59:59
        assert_eq!(rfc3339(end), "2099-12-31T23:59:59.000Z");
    }

    #[test]
    fn writer_thread_writes_and_full_queue_drops() {
        let out = Shared::default();
        let metrics = Metrics::unregistered();
        let one = entry("127.0.0.1:1", None).queued_bytes();
        let log = AccessLog::spawn(out.clone(), 4 * one, metrics).unwrap();
        for _ in 0..3 {
            log.log(Box::new(entry("127.0.0.1:1", Some("[::1]:2"))));
        }
        assert!(log.flush(Duration::from_secs(5)));
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        assert_eq!(text.lines().count(), 3, "{text}");
        for line in text.lines() {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            assert_eq!(v["upstream_addr"], "[::1]:2");
        }
        // Flood a tiny queue: some lines are dropped, none is lost silently, nothing blocks.
        for _ in 0..10_000 {
            log.log(Box::new(entry("127.0.0.1:1", None)));
        }
        assert!(log.flush(Duration::from_secs(5)));
        let written = String::from_utf8(out.0.lock().unwrap().clone())
            .unwrap()
            .lines()
            .count()
            - 3;
        let dropped = log.metrics.dropped_lines() as usize;
        assert!(dropped > 0);
        assert_eq!(written + dropped, 10_000);
    }
}
