//! The request's host, validated once: a DNS name or an IP literal (IPv6 bracketed) with an
//! optional port, from the one Host header, the HTTP/2 `:authority` or the absolute-form target,
//! which must agree (RFC 9112 §3.2, RFC 9113 §8.3.1). Routing, the upstream Host and
//! `:authority`, redirects and forwarding headers use only this value. Also the one lookup of a
//! host name in exact and wildcard entries, shared by routes and certificates ([`lookup`]).

use std::collections::HashMap;
use std::net::{Ipv4Addr, Ipv6Addr};

use http::header::{self, HeaderValue};
use http::{Request, Version};

/// Why a request's host was refused (400).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    /// More than one Host header.
    #[error("more than one Host header")]
    Duplicate,
    /// An HTTP/1.1 or HTTP/2 request without any host.
    #[error("no Host header")]
    Missing,
    /// The Host header names another host than the absolute-form target or `:authority`.
    #[error("Host header disagrees with the request target")]
    Mismatch,
    /// Not a DNS name or IP literal with an optional port (or userinfo, or not ASCII).
    #[error("invalid host")]
    Invalid,
}

/// A host that passed [`request_host`]: safe in a header, a URI authority and a `Forwarded`
/// element, and unable to carry a path, query, userinfo or whitespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ValidHost(HeaderValue);

impl ValidHost {
    /// The host as received, with its port if it had one.
    pub fn as_str(&self) -> &str {
        self.0.to_str().unwrap_or_default()
    }

    /// The header value (for Host and `X-Forwarded-Host`).
    pub fn header_value(&self) -> &HeaderValue {
        &self.0
    }

    /// No host (HTTP/1.0 without Host): routed to the host-less rules.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The request's host. The URI authority (HTTP/2 `:authority`, HTTP/1.1 absolute-form) wins; a
/// Host header beside it must name the same host (ASCII case-insensitively). HTTP/1.0 may omit
/// both (then the host is empty).
pub fn request_host<B>(req: &Request<B>) -> Result<ValidHost, HostError> {
    let mut hosts = req.headers().get_all(header::HOST).iter();
    let header = hosts.next();
    if hosts.next().is_some() {
        return Err(HostError::Duplicate);
    }
    let authority = req.uri().authority().map(|a| a.as_str());
    // The header value to share when the host is the Host header itself (the common HTTP/1.1
    // request): not copied.
    let (chosen, shared) = match (authority, header) {
        (Some(a), Some(h)) => {
            if !h.as_bytes().eq_ignore_ascii_case(a.as_bytes()) {
                return Err(HostError::Mismatch);
            }
            (a.as_bytes(), None)
        }
        (Some(a), None) => (a.as_bytes(), None),
        (None, Some(h)) => (h.as_bytes(), Some(h)),
        (None, None) if req.version() <= Version::HTTP_10 => {
            return Ok(ValidHost(HeaderValue::from_static("")))
        }
        (None, None) => return Err(HostError::Missing),
    };
    if !is_valid_host(chosen) {
        return Err(HostError::Invalid);
    }
    match shared {
        Some(h) => Ok(ValidHost(h.clone())),
        None => HeaderValue::from_bytes(chosen)
            .map(ValidHost)
            .map_err(|_| HostError::Invalid),
    }
}

/// `host [":" port]`: a DNS name (letters, digits, `-` and `_`, dot-separated labels of 1 to 63
/// bytes, 253 in all, one trailing dot allowed), an IPv4 address, or `[IPv6]`; the port 1 to 5
/// digits up to 65535. Read as bytes (every host it accepts is ASCII, so anything else fails),
/// without a UTF-8 pass or a string search first: every request's host goes through it.
pub fn is_valid_host(host: &[u8]) -> bool {
    let (name, port) = split_port(host);
    if let Some(port) = port {
        if port.is_empty() || port.len() > 5 || !port.iter().all(u8::is_ascii_digit) {
            return false;
        }
        let value = port
            .iter()
            .fold(0u32, |value, &digit| value * 10 + u32::from(digit - b'0'));
        if value > 65535 {
            return false;
        }
    }
    if let Some(inner) = name.strip_prefix(b"[") {
        return inner
            .strip_suffix(b"]")
            .and_then(|ip| std::str::from_utf8(ip).ok())
            .is_some_and(|ip| ip.parse::<Ipv6Addr>().is_ok());
    }
    // Every IPv4 address is also a DNS name by these rules: the name check, one pass, goes first.
    is_dns_name(name)
        || std::str::from_utf8(name).is_ok_and(|name| name.parse::<Ipv4Addr>().is_ok())
}

/// Splits `host:port` (`[v6]:port`); the port is `None` without a colon after the host.
fn split_port(host: &[u8]) -> (&[u8], Option<&[u8]>) {
    if host.first() == Some(&b'[') {
        return match host.iter().position(|&b| b == b']') {
            Some(end) => match &host[end + 1..] {
                [] => (host, None),
                [b':', port @ ..] => (&host[..=end], Some(port)),
                // `[::1]x`: keep it whole so it fails as a name.
                _ => (host, None),
            },
            None => (host, None),
        };
    }
    match last_colon(host) {
        Some(i) => (&host[..i], Some(&host[i + 1..])),
        None => (host, None),
    }
}

/// The index of the last `:` in `host`: a plain backward loop (a host is a few dozen bytes, for
/// which `rfind`'s searcher costs more than it saves).
fn last_colon(host: &[u8]) -> Option<usize> {
    host.iter().rposition(|&b| b == b':')
}

/// Dot-separated labels of 1 to 63 letters, digits, `-` and `_`, 253 bytes in all, one trailing
/// dot allowed; checked in one pass (every request's host goes through it).
fn is_dns_name(name: &[u8]) -> bool {
    let name = name.strip_suffix(b".").unwrap_or(name);
    if name.is_empty() || name.len() > 253 {
        return false;
    }
    let mut label = 0usize;
    for &b in name {
        if b == b'.' {
            if label == 0 {
                return false;
            }
            label = 0;
        } else if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' {
            label += 1;
            if label > 63 {
                return false;
            }
        } else {
            return false;
        }
    }
    label > 0
}

/// The longest DNS name, in bytes: longer names match no entry.
pub const MAX_NAME: usize = 255;

/// `name` as host entries are keyed: one trailing dot dropped, ASCII lower case (in `buf` when
/// it had upper case letters; nothing is allocated). `None` when longer than [`MAX_NAME`].
pub fn normalize_name<'b>(name: &'b str, buf: &'b mut [u8; MAX_NAME]) -> Option<&'b str> {
    let name = name.strip_suffix('.').unwrap_or(name);
    if name.len() > buf.len() {
        return None;
    }
    if !name.bytes().any(|b| b.is_ascii_uppercase()) {
        return Some(name);
    }
    let out = &mut buf[..name.len()];
    out.copy_from_slice(name.as_bytes());
    out.make_ascii_lowercase();
    // ASCII lowercasing keeps UTF-8 valid.
    std::str::from_utf8(out).ok()
}

/// The entry of a host name (from [`normalize_name`]): the exact entry, else the wildcard
/// `*.suffix` (keyed by `suffix`) covering exactly its first label. An empty first label
/// (`.example.com`) is no label, so no wildcard covers it, for routes and certificates alike.
pub fn lookup<'a, V>(
    exact: &'a HashMap<Box<str>, V>,
    wildcard: &'a HashMap<Box<str>, V>,
    name: &str,
) -> Option<&'a V> {
    if let Some(entry) = exact.get(name) {
        return Some(entry);
    }
    match name.split_once('.') {
        Some((label, suffix)) if !label.is_empty() => wildcard.get(suffix),
        _ => None,
    }
}

/// Removes a `:port` from a Host value, keeping IPv6 literals in brackets (`[::1]:80` -> `[::1]`).
pub fn strip_port(host: &str) -> &str {
    let bytes = host.as_bytes();
    if bytes.first() == Some(&b'[') {
        return match bytes.iter().position(|&b| b == b']') {
            Some(end) => &host[..=end],
            None => host,
        };
    }
    // The cut is at an ASCII byte, so a character boundary.
    match last_colon(bytes) {
        Some(i) if bytes[i + 1..].iter().all(u8::is_ascii_digit) => &host[..i],
        _ => host,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_literals_of_both_families_pass() {
        for good in [
            "example.com",
            "EXAMPLE.com.",
            "a-b_c.example:8080",
            "192.0.2.1",
            "192.0.2.1:443",
            "[::1]",
            "[2001:db8::1]:8443",
            "[::ffff:192.0.2.1]:80",
            "localhost:65535",
        ] {
            assert!(is_valid_host(good.as_bytes()), "{good}");
        }
    }

    #[test]
    fn anything_else_fails() {
        let long_label = format!("{}.com", "a".repeat(64));
        let long_name = format!("{}com", "abcdefghi.".repeat(26));
        for bad in [
            "",
            "x/admin?",
            "x?y",
            "x#y",
            "user@example.com",
            "exa mple.com",
            "example.com:",
            "example.com:65536",
            "example.com:123456",
            "example.com:8o",
            "a..b",
            ".example.com",
            "example.com..",
            "2001:db8::1",
            "[2001:db8::1",
            "[2001:db8::1]x",
            "[2001:db8::zz]:80",
            "[192.0.2.1]",
            "exa%6dple.com",
            "ex\\ample.com",
            "münchen.de",
            long_label.as_str(),
            long_name.as_str(),
        ] {
            assert!(!is_valid_host(bad.as_bytes()), "{bad}");
        }
    }

    /// The rules of [`is_dns_name`] as written before its one-pass form.
    fn dns_name_by_split(name: &str) -> bool {
        let name = name.strip_suffix('.').unwrap_or(name);
        !name.is_empty()
            && name.len() <= 253
            && name.split('.').all(|label| {
                (1..=63).contains(&label.len())
                    && label
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            })
    }

    /// [`is_valid_host`] as written before its byte-wise form (a UTF-8 pass, then `rsplit_once`).
    fn valid_host_by_str(host: &[u8]) -> bool {
        let Ok(host) = std::str::from_utf8(host) else {
            return false;
        };
        let (name, port) = if host.starts_with('[') {
            match host.find(']') {
                Some(end) => match &host[end + 1..] {
                    "" => (host, None),
                    rest => match rest.strip_prefix(':') {
                        Some(port) => (&host[..=end], Some(port)),
                        None => (host, None),
                    },
                },
                None => (host, None),
            }
        } else {
            match host.rsplit_once(':') {
                Some((name, port)) => (name, Some(port)),
                None => (host, None),
            }
        };
        if let Some(port) = port {
            let digits =
                !port.is_empty() && port.len() <= 5 && port.bytes().all(|b| b.is_ascii_digit());
            if !digits || port.parse::<u32>().map_or(true, |p| p > 65535) {
                return false;
            }
        }
        if let Some(inner) = name.strip_prefix('[') {
            return inner
                .strip_suffix(']')
                .is_some_and(|ip| ip.parse::<Ipv6Addr>().is_ok());
        }
        dns_name_by_split(name) || name.parse::<Ipv4Addr>().is_ok()
    }

    /// [`strip_port`] as written before (`rfind`).
    fn strip_port_by_str(host: &str) -> &str {
        if host.starts_with('[') {
            return match host.find(']') {
                Some(end) => &host[..=end],
                None => host,
            };
        }
        match host.rfind(':') {
            Some(i) if host[i + 1..].bytes().all(|b| b.is_ascii_digit()) => &host[..i],
            _ => host,
        }
    }

    /// Hosts of both families, ports, brackets and bytes that are not ASCII (or not UTF-8).
    fn host_bytes() -> impl proptest::strategy::Strategy<Value = Vec<u8>> {
        let byte = proptest::sample::select(b"aZ09-_.:[]%/ \xffe\xc3\xbc\x80ab1:2::f[]".to_vec());
        proptest::collection::vec(byte, 0..40)
    }

    #[test]
    fn the_byte_wise_host_check_agrees_on_literals_of_both_families() {
        for host in [
            "[2001:db8::1]:8443",
            "[2001:db8::1]:65536",
            "[::1]x",
            "[::1]:",
            "[::ffff:192.0.2.1]",
            "192.0.2.1:00443",
            "192.0.2.256",
            "256.1.1.1:80",
            "a.test:123456",
            "a.test::80",
            "münchen.de:80",
            "[::1",
        ] {
            assert_eq!(
                is_valid_host(host.as_bytes()),
                valid_host_by_str(host.as_bytes()),
                "{host}"
            );
            assert_eq!(strip_port(host), strip_port_by_str(host), "{host}");
        }
    }

    proptest::proptest! {
        #[test]
        fn the_byte_wise_host_check_agrees_with_the_str_one(host in host_bytes()) {
            proptest::prop_assert_eq!(is_valid_host(&host), valid_host_by_str(&host), "{:?}", host);
            if let Ok(host) = std::str::from_utf8(&host) {
                proptest::prop_assert_eq!(strip_port(host), strip_port_by_str(host));
            }
        }
    }

    proptest::proptest! {
        #[test]
        fn the_one_pass_name_check_agrees_with_the_rules(name in "[a-zA-Z0-9._ -]{0,300}") {
            proptest::prop_assert_eq!(is_dns_name(name.as_bytes()), dns_name_by_split(&name), "{}", name);
        }

        #[test]
        fn the_one_pass_name_check_agrees_on_long_labels(a in 0usize..70, b in 0usize..70, dot in proptest::bool::ANY) {
            let name = format!("{}.{}{}", "a".repeat(a), "b".repeat(b), if dot { "." } else { "" });
            proptest::prop_assert_eq!(is_dns_name(name.as_bytes()), dns_name_by_split(&name));
        }
    }

    fn req(version: Version, uri: &str, hosts: &[&str]) -> Request<()> {
        let mut b = Request::builder().version(version).uri(uri);
        for h in hosts {
            b = b.header(header::HOST, *h);
        }
        b.body(()).unwrap()
    }

    #[test]
    fn one_host_and_agreement() {
        let v11 = Version::HTTP_11;
        let host = |r: &Request<()>| request_host(r).map(|h| h.as_str().to_owned());
        assert_eq!(host(&req(v11, "/", &["a.test"])), Ok("a.test".into()));
        assert_eq!(
            host(&req(v11, "/", &["a.test", "a.test"])),
            Err(HostError::Duplicate)
        );
        assert_eq!(host(&req(v11, "/", &[])), Err(HostError::Missing));
        assert_eq!(host(&req(Version::HTTP_10, "/", &[])), Ok(String::new()));
        assert_eq!(
            host(&req(v11, "http://api.test/public", &["x/admin?"])),
            Err(HostError::Mismatch)
        );
        assert_eq!(
            host(&req(v11, "http://API.test:80/p", &["api.TEST:80"])),
            Ok("API.test:80".into())
        );
        assert_eq!(
            host(&req(Version::HTTP_2, "http://[::1]:8080/p", &[])),
            Ok("[::1]:8080".into())
        );
        assert_eq!(host(&req(v11, "/", &["x/admin?"])), Err(HostError::Invalid));
        assert_eq!(
            host(&req(v11, "http://u@api.test/", &[])),
            Err(HostError::Invalid)
        );
    }

    #[test]
    fn lookup_is_exact_then_one_label_wildcard() {
        let exact: HashMap<Box<str>, &str> = [("a.test".into(), "exact")].into();
        let wildcard: HashMap<Box<str>, &str> = [("test".into(), "wild")].into();
        let mut buf = [0u8; MAX_NAME];
        let find = |name: &str, buf: &mut [u8; MAX_NAME]| {
            normalize_name(name, buf).and_then(|n| lookup(&exact, &wildcard, n).copied())
        };
        assert_eq!(find("a.test", &mut buf), Some("exact"));
        assert_eq!(find("A.TEST.", &mut buf), Some("exact"));
        assert_eq!(find("b.test", &mut buf), Some("wild"));
        assert_eq!(find(".test", &mut buf), None, "an empty label");
        assert_eq!(find("test", &mut buf), None);
        assert_eq!(find("x.b.test", &mut buf), None);
        assert_eq!(find(&"a".repeat(256), &mut buf), None, "longer than a name");
    }
}
