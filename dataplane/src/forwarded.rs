//! Trusted proxies: which peers may forward client addresses to us (`--trusted-proxies`, CIDRs
//! of both families), and how the forwarding headers are set for trusted and untrusted peers.

use std::borrow::Cow;
use std::net::IpAddr;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

pub use crate::cidr::{BadCidr, Cidr};
use crate::conn::{ConnInfo, PeerHeaders};
use crate::host::ValidHost;

/// The peers allowed to forward client addresses; empty (the default) trusts nobody.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TrustedProxies(pub Vec<Cidr>);

impl TrustedProxies {
    /// Whether a peer is trusted.
    pub fn trusts(&self, ip: IpAddr) -> bool {
        self.0.iter().any(|c| c.contains(ip))
    }
}

static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
static X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
static X_FORWARDED_PORT: HeaderName = HeaderName::from_static("x-forwarded-port");
static X_REAL_IP: HeaderName = HeaderName::from_static("x-real-ip");

/// The headers [`set_headers`] sets.
const FORWARDING_HEADERS: usize = 6;

/// The scheme the client used: `X-Forwarded-Proto` (`http` or `https`) from a trusted peer,
/// else the connection's. Decides the HTTPS redirects, as ingress-nginx's
/// `use-forwarded-headers` does, so a TLS-terminating load balancer causes no redirect loop.
pub fn request_scheme(headers: &HeaderMap, conn: &ConnInfo) -> &'static str {
    let forwarded = conn
        .trusted
        .then(|| headers.get(&X_FORWARDED_PROTO)?.to_str().ok())
        .flatten()
        .map(|v| v.split(',').next().unwrap_or_default().trim());
    match forwarded {
        Some(v) if v.eq_ignore_ascii_case("https") => "https",
        Some(v) if v.eq_ignore_ascii_case("http") => "http",
        _ => conn.scheme(),
    }
}

/// Sets `X-Forwarded-For`, `X-Real-IP`, `X-Forwarded-Proto`, `-Host`, `-Port` and `Forwarded`
/// (RFC 7239) for the upstream. From a trusted peer (`conn.trusted`), the incoming
/// `X-Forwarded-For` and `Forwarded` are appended to and incoming `X-Forwarded-Proto`, `-Host`
/// and `-Port` are kept; from anyone else, all of them are replaced.
pub fn set_headers(headers: &mut HeaderMap, host: &str, conn: &ConnInfo) {
    set(headers, host, HeaderValue::from_str(host).ok(), conn);
}

/// [`set_headers`] for a validated host, whose header value `X-Forwarded-Host` shares. Nothing is
/// allocated per request from an untrusted peer whose requests name one host: the values are
/// the connection's (formatted once), the host's and static ones, shared.
pub(crate) fn set_for_host(headers: &mut HeaderMap, host: &ValidHost, conn: &ConnInfo) {
    set(
        headers,
        host.as_str(),
        Some(host.header_value().clone()),
        conn,
    );
}

/// [`set_headers`] with the host's header value (`None`: no valid value, `X-Forwarded-Host` is
/// removed).
fn set(headers: &mut HeaderMap, host: &str, host_value: Option<HeaderValue>, conn: &ConnInfo) {
    let proto = conn.scheme();
    let peer = &conn.forwarded;
    // Room for the six headers at once: one growth of the map instead of one per insert.
    headers.reserve(FORWARDING_HEADERS);
    if conn.trusted {
        append(
            headers,
            &X_FORWARDED_FOR,
            peer.ip.to_str().unwrap_or_default(),
        );
        append(headers, &header::FORWARDED, &peer.element(host, proto));
    } else {
        headers.insert(&X_FORWARDED_FOR, peer.ip.clone());
        if let Some(v) = peer.element_value(host, proto) {
            headers.insert(header::FORWARDED, v);
        }
    }
    headers.insert(&X_REAL_IP, peer.ip.clone());
    let keep = |headers: &HeaderMap, name: &HeaderName| conn.trusted && headers.contains_key(name);
    if !keep(headers, &X_FORWARDED_PROTO) {
        headers.insert(&X_FORWARDED_PROTO, HeaderValue::from_static(proto));
    }
    if !keep(headers, &X_FORWARDED_HOST) {
        match host_value {
            Some(v) => {
                headers.insert(&X_FORWARDED_HOST, v);
            }
            None => {
                headers.remove(&X_FORWARDED_HOST);
            }
        }
    }
    if !keep(headers, &X_FORWARDED_PORT) {
        headers.insert(&X_FORWARDED_PORT, forwarded_port(conn).into_owned());
    }
}

/// The `X-Forwarded-Port` value: the listener's, formatted once, unless the connection's local
/// port is another (a PROXY header's destination).
fn forwarded_port(conn: &ConnInfo) -> Cow<'_, HeaderValue> {
    match &conn.local_port {
        (port, value) if *port == conn.local.port() => Cow::Borrowed(value),
        _ => Cow::Owned(HeaderValue::from(conn.local.port())),
    }
}

/// The forwarding headers of a request from an untrusted peer (all six replaced), written
/// straight into the upstream request head by duet's HTTP/1.1 client instead of inserted into
/// the request's header map (six inserts and a growth of the map per request): the same values
/// [`set_for_host`] sets. A send that does not go by that client [`Forwarding::apply`]s them to
/// the map instead.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Forwarding<'a> {
    host: &'a ValidHost,
    conn: &'a ConnInfo,
}

/// The names [`Forwarding`] replaces, as they are written (lowercase).
static FORWARDING_NAMES: [&HeaderName; FORWARDING_HEADERS] = [
    &X_FORWARDED_FOR,
    &header::FORWARDED,
    &X_REAL_IP,
    &X_FORWARDED_PROTO,
    &X_FORWARDED_HOST,
    &X_FORWARDED_PORT,
];

impl<'a> Forwarding<'a> {
    /// The forwarding headers of a request from `conn` naming `host`, when they replace every
    /// incoming one (an untrusted peer); `None` for a trusted peer (whose headers are appended
    /// to and kept: [`set_for_host`] on the map).
    pub(crate) fn untrusted(host: &'a ValidHost, conn: &'a ConnInfo) -> Option<Forwarding<'a>> {
        (!conn.trusted).then_some(Forwarding { host, conn })
    }

    /// Sets them in a header map, as [`set_for_host`] does.
    pub(crate) fn apply(&self, headers: &mut HeaderMap) {
        set_for_host(headers, self.host, self.conn);
    }

    /// Whether a received header is one of those replaced (not written from the map).
    pub(crate) fn replaces(name: &HeaderName) -> bool {
        FORWARDING_NAMES.contains(&name)
    }

    /// Writes the six header lines (`name: value\r\n`), in the order [`set_for_host`] inserts
    /// them: for the host of the connection's memo, the lines its first such request wrote (the
    /// same bytes: they depend on the connection, the host and the scheme only).
    pub(crate) fn write(&self, out: &mut Vec<u8>) {
        let (proto, peer, host) = (self.conn.scheme(), &self.conn.forwarded, self.host.as_str());
        let memo = &peer.memo;
        if peer.is_memo_for(host, proto) {
            if let Some(lines) = memo.1.get() {
                out.extend_from_slice(lines);
                return;
            }
        }
        let start = out.len();
        self.write_lines(out);
        // The memo is the first host's, set by the first request (maybe this one).
        if peer.is_memo_for(host, proto) {
            let _ = memo.1.set(out[start..].into());
        }
    }

    /// [`Forwarding::write`] without the memo.
    fn write_lines(&self, out: &mut Vec<u8>) {
        let conn = self.conn;
        let (proto, peer, host) = (conn.scheme(), &conn.forwarded, self.host.as_str());
        line(out, b"x-forwarded-for: ", peer.ip.as_bytes());
        // The map's value, the connection's memo of it included: none when it is not a valid
        // header value (never, for a validated host), as in the map.
        if let Some(value) = peer.element_value(host, proto) {
            line(out, b"forwarded: ", value.as_bytes());
        }
        line(out, b"x-real-ip: ", peer.ip.as_bytes());
        line(out, b"x-forwarded-proto: ", proto.as_bytes());
        line(
            out,
            b"x-forwarded-host: ",
            self.host.header_value().as_bytes(),
        );
        line(out, b"x-forwarded-port: ", forwarded_port(conn).as_bytes());
    }
}

/// One header line.
fn line(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

impl PeerHeaders {
    /// The `Forwarded` element of one request: `for="…";host=…;proto=…` (the host as a token,
    /// or quoted when it is not one, as an IPv6 literal with its brackets and port).
    fn element(&self, host: &str, proto: &str) -> String {
        let mut out = String::with_capacity(self.element_len(host, proto));
        out.push_str(&self.for_node);
        if !host.is_empty() {
            out.push_str(";host=");
            push_token_or_quoted(&mut out, host);
        }
        out.push_str(";proto=");
        out.push_str(proto);
        out
    }

    /// The length of [`PeerHeaders::element`]'s value, exactly (its buffer becomes a header
    /// value without a copy or a second allocation).
    fn element_len(&self, host: &str, proto: &str) -> usize {
        let host_len = match host {
            "" => 0,
            token if token.bytes().all(is_tchar) => ";host=".len() + token.len(),
            quoted => {
                let escapes = quoted.bytes().filter(|&c| c == b'"' || c == b'\\').count();
                ";host=\"\"".len() + quoted.len() + escapes
            }
        };
        self.for_node.len() + host_len + ";proto=".len() + proto.len()
    }

    /// Whether the connection's memo is that of `host` and `proto`.
    fn is_memo_for(&self, host: &str, proto: &'static str) -> bool {
        matches!(self.memo.0.get(), Some((for_host, for_proto, _)) if **for_host == *host && *for_proto == proto)
    }

    /// [`PeerHeaders::element`] as a header value: the connection's memo of it when the request
    /// names the memo's host.
    fn element_value(&self, host: &str, proto: &'static str) -> Option<HeaderValue> {
        let memo = &self.memo.0;
        if let Some((for_host, for_proto, value)) = memo.get() {
            if **for_host == *host && *for_proto == proto {
                return Some(value.clone());
            }
        }
        // The element's buffer becomes the value (checked, not copied): it is ASCII, as the
        // peer's address, the validated host and the scheme are.
        let element = self.element(host, proto);
        let value = HeaderValue::from_maybe_shared(bytes::Bytes::from(element)).ok()?;
        if memo.get().is_none() {
            // The host copied (once per connection): a header value would share, and keep for
            // the connection's life, the buffer the request was read into.
            let _ = memo.set((host.into(), proto, value.clone()));
        }
        Some(value)
    }
}

fn is_tchar(c: u8) -> bool {
    c.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&c)
}

fn push_token_or_quoted(out: &mut String, value: &str) {
    if !value.is_empty() && value.bytes().all(is_tchar) {
        out.push_str(value);
    } else {
        out.push('"');
        for c in value.chars() {
            if c == '"' || c == '\\' {
                out.push('\\');
            }
            out.push(c);
        }
        out.push('"');
    }
}

/// Appends `value` to a list header, joining every incoming line with `, ` into one.
fn append(headers: &mut HeaderMap, name: &HeaderName, value: &str) {
    let mut joined = String::new();
    for v in headers.get_all(name) {
        if let Ok(v) = v.to_str() {
            if !v.trim().is_empty() {
                joined.push_str(v.trim());
                joined.push_str(", ");
            }
        }
    }
    joined.push_str(value);
    if let Ok(v) = HeaderValue::from_str(&joined) {
        headers.insert(name, v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;

    #[test]
    fn forwarded_quotes_and_brackets() {
        let v6: SocketAddr = "[2001:db8::1]:4711".parse().unwrap();
        assert_eq!(
            PeerHeaders::new(v6).element("example.com", "http"),
            "for=\"[2001:db8::1]:4711\";host=example.com;proto=http"
        );
        let v4: SocketAddr = "192.0.2.60:4711".parse().unwrap();
        assert_eq!(
            PeerHeaders::new(v4).element("example.com:8080", "https"),
            "for=\"192.0.2.60:4711\";host=\"example.com:8080\";proto=https"
        );
        assert_eq!(
            PeerHeaders::new(v4).element("[::1]:8080", "http"),
            "for=\"192.0.2.60:4711\";host=\"[::1]:8080\";proto=http"
        );
    }

    #[test]
    fn cidrs_of_both_families() {
        let list: Vec<Cidr> = ["10.0.0.0/8", "2001:db8::/32", "192.0.2.7", "::1"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        let trusted = TrustedProxies(list);
        for (ip, want) in [
            ("10.1.2.3", true),
            ("11.0.0.1", false),
            ("::ffff:10.9.9.9", true),
            ("2001:db8:1::5", true),
            ("2001:db9::5", false),
            ("192.0.2.7", true),
            ("192.0.2.8", false),
            ("::1", true),
            ("::2", false),
        ] {
            assert_eq!(trusted.trusts(ip.parse().unwrap()), want, "{ip}");
        }
        assert!(TrustedProxies::default().0.is_empty());
        let all: Cidr = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains("203.0.113.1".parse().unwrap()));
        assert!(!all.contains("2001:db8::1".parse().unwrap()));
        assert_eq!(
            "10.1.2.3/8".parse::<Cidr>().unwrap().to_string(),
            "10.0.0.0/8"
        );
        for bad in [
            "",
            "10.0.0.0/33",
            "::/129",
            "host/8",
            "10.0.0.0/x",
            "1.2.3.4/-1",
        ] {
            assert!(bad.parse::<Cidr>().is_err(), "{bad}");
        }
    }

    fn conn(peer: &str, trusted: bool) -> ConnInfo {
        let mut c = ConnInfo::new(peer.parse().unwrap(), "[::1]:8443".parse().unwrap());
        c.trusted = trusted;
        c
    }

    fn incoming() -> HeaderMap {
        let mut h = HeaderMap::new();
        h.append("x-forwarded-for", HeaderValue::from_static("203.0.113.9"));
        h.append("x-forwarded-for", HeaderValue::from_static("2001:db8::9"));
        h.insert("forwarded", HeaderValue::from_static("for=203.0.113.9"));
        h.insert("x-forwarded-proto", HeaderValue::from_static("https"));
        h
    }

    #[test]
    fn trusted_peers_are_appended_to() {
        for (peer, ip, node) in [
            ("10.0.0.1:5000", "10.0.0.1", "\"10.0.0.1:5000\""),
            (
                "[2001:db8::1]:5000",
                "2001:db8::1",
                "\"[2001:db8::1]:5000\"",
            ),
        ] {
            let mut h = incoming();
            set_headers(&mut h, "a.test", &conn(peer, true));
            assert_eq!(
                h["x-forwarded-for"],
                format!("203.0.113.9, 2001:db8::9, {ip}")
            );
            assert_eq!(
                h["forwarded"],
                format!("for=203.0.113.9, for={node};host=a.test;proto=http")
            );
            assert_eq!(
                h["x-forwarded-proto"], "https",
                "kept from the trusted proxy"
            );
            assert_eq!(h["x-real-ip"], ip);
        }
    }

    #[test]
    fn a_connections_requests_to_different_hosts_each_forward_their_own() {
        for (peer, node) in [
            ("10.0.0.1:5000", "\"10.0.0.1:5000\""),
            ("[2001:db8::1]:5000", "\"[2001:db8::1]:5000\""),
        ] {
            // One connection (one memo), hosts alternating; plain and TLS connections.
            for (tls, proto) in [(false, "http"), (true, "https")] {
                let c = conn(peer, false).with_tls(tls);
                for host in ["a.test", "B.test", "a.test", "[::1]:8443", "", "a.test"] {
                    let mut h = incoming();
                    set_headers(&mut h, host, &c);
                    let expected = match host {
                        "" => format!("for={node};proto={proto}"),
                        "[::1]:8443" => format!("for={node};host=\"{host}\";proto={proto}"),
                        _ => format!("for={node};host={host};proto={proto}"),
                    };
                    assert_eq!(h["forwarded"], expected, "{peer} {host:?}");
                    assert_eq!(h.get_all("forwarded").iter().count(), 1);
                    assert_eq!(h["x-forwarded-host"], host, "{peer} {host:?}");
                }
            }
        }
    }

    #[test]
    fn lines_written_from_the_memo_are_those_of_their_own_host() {
        for peer in ["10.0.0.1:5000", "[2001:db8::1]:5000"] {
            for tls in [false, true] {
                // One connection (one memo), hosts alternating, against a fresh connection each.
                let c = conn(peer, false).with_tls(tls);
                for host in ["a.test", "B.test", "a.test", "[::1]:8443", "a.test"] {
                    let req = http::Request::builder()
                        .header("host", host)
                        .body(())
                        .unwrap();
                    let valid = crate::host::request_host(&req).unwrap();
                    let (mut got, mut want) = (b"x\r\n".to_vec(), b"x\r\n".to_vec());
                    Forwarding::untrusted(&valid, &c).unwrap().write(&mut got);
                    let fresh = conn(peer, false).with_tls(tls);
                    Forwarding::untrusted(&valid, &fresh)
                        .unwrap()
                        .write(&mut want);
                    assert_eq!(
                        String::from_utf8(got).unwrap(),
                        String::from_utf8(want).unwrap(),
                        "{peer} {tls} {host}"
                    );
                    assert!(c.forwarded.memo.1.get().is_some(), "{peer}: kept");
                }
            }
        }
    }

    #[test]
    fn untrusted_peers_are_replaced() {
        for (peer, ip) in [("10.0.0.1:5000", "10.0.0.1"), ("[::1]:5000", "::1")] {
            let mut h = incoming();
            set_headers(&mut h, "a.test", &conn(peer, false));
            assert_eq!(h["x-forwarded-for"], ip);
            assert_eq!(h.get_all("x-forwarded-for").iter().count(), 1);
            assert!(!h["forwarded"].to_str().unwrap().contains("203.0.113.9"));
            assert_eq!(h["x-forwarded-proto"], "http");
            assert_eq!(h["x-forwarded-port"], "8443");
        }
    }
}
