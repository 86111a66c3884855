//! The access log: one JSON line per request, written by a dedicated thread from a queue bounded in
//! bytes, so a request never waits for a terminal or a pipe and long hosts or targets cannot make
//! the queue large. When the queue is full the line is dropped and counted
//! (`duet_access_log_dropped_total`).

use std::fmt;
use std::io::{self, Write};
use std::net::SocketAddr;
use std::str::FromStr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, SyncSender};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http::{HeaderValue, Method, Uri, Version};
use serde::Serialize;

use crate::metrics::Metrics;
use crate::table::{normalize_addr, Family, UnknownName};

/// Bytes of entries queued for the writer before new ones are dropped: 8 MiB (about 20,000
/// entries of a typical request; an entry counts its host, target and SNI).
pub const QUEUE_BYTES: usize = 8 << 20;

/// How long the writer lets lines gather after waking, so that a busy proxy wakes it once per
/// batch rather than once per request.
const BATCH_DELAY: Duration = Duration::from_millis(10);

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

#[derive(Serialize)]
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
    /// Writes the entry as one JSON line (with the newline). Addresses are normalised
    /// (IPv4-mapped IPv6 as IPv4) and IPv6 is written in RFC 5952 form, bracketed where a port
    /// follows.
    pub fn write_json(&self, out: &mut Vec<u8>) -> io::Result<()> {
        let client = normalize_addr(self.client);
        let upstream = self.upstream.map(normalize_addr);
        let route = self.route.as_ref();
        let line = Line {
            time: rfc3339(self.time),
            client_addr: client.ip().to_string(),
            client_port: client.port(),
            client_family: Family::of(&client),
            listener: normalize_addr(self.listener).to_string(),
            host: self
                .host
                .as_ref()
                .map(|h| String::from_utf8_lossy(h.as_bytes()).into_owned()),
            method: self.method.as_str(),
            path: self.uri.path(),
            protocol: protocol(self.version),
            status: self.status,
            bytes: self.bytes,
            duration_seconds: self.duration.as_secs_f64(),
            upstream_addr: upstream.map(|a| a.to_string()),
            upstream_family: upstream.map(|a| Family::of(&a)),
            upstream_protocol: upstream.and(self.upstream_protocol).map(|p| p.as_str()),
            upstream_response_seconds: self.upstream_time.map(|t| t.as_secs_f64()),
            namespace: route.map(|r| &*r[0]),
            ingress: route.map(|r| &*r[1]),
            service: route.map(|r| &*r[2]),
            tls_version: self.tls.as_ref().map(|t| t.version),
            sni: self.tls.as_ref().and_then(|t| t.sni.as_deref()),
        };
        serde_json::to_writer(&mut *out, &line)?;
        out.push(b'\n');
        Ok(())
    }
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

enum Msg {
    /// An entry and the bytes it counts in the queue.
    Line(Box<Entry>, usize),
    Flush(SyncSender<()>),
}

/// The sending side of the access log; cheap to clone.
#[derive(Clone)]
pub struct AccessLog {
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

impl fmt::Debug for AccessLog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AccessLog").finish_non_exhaustive()
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
        Ok(AccessLog { tx, queue, metrics })
    }

    /// The access log on stdout.
    pub fn stdout(metrics: Arc<Metrics>) -> io::Result<AccessLog> {
        AccessLog::spawn(io::stdout(), QUEUE_BYTES, metrics)
    }

    /// Queues a line; never blocks. A full queue drops the line and counts it.
    pub fn log(&self, entry: Box<Entry>) {
        let size = entry.queued_bytes();
        if !self.queue.reserve(size) {
            self.metrics.access_log_dropped();
            return;
        }
        if self.tx.send(Msg::Line(entry, size)).is_err() {
            self.queue.release(size);
            self.metrics.access_log_dropped();
        }
    }

    /// Waits (at most `timeout`) until every line queued so far is written and flushed.
    pub fn flush(&self, timeout: Duration) -> bool {
        let (ack, done) = mpsc::sync_channel(1);
        self.tx.send(Msg::Flush(ack)).is_ok() && done.recv_timeout(timeout).is_ok()
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
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
