//! The upstream request and response heads: the request target in normalised origin form,
//! hop-by-hop headers removed (WebSocket upgrades kept), one body framing, forwarding headers set.

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Uri, Version};

use crate::conn::ConnInfo;
use crate::host::ValidHost;
use crate::path::EncodedTraversal;
use crate::upstream::{role, Role};

use crate::names::{CONTENT_LENGTH, UPGRADE};

/// The request target in origin form with its path normalised ([`crate::path`]) and its query
/// as received.
pub(super) fn origin_form(uri: &Uri) -> Result<Uri, EncodedTraversal> {
    let path = crate::path::normalize(uri.path())?;
    let unchanged = matches!(path, std::borrow::Cow::Borrowed(_));
    if unchanged && uri.scheme().is_none() && uri.authority().is_none() {
        return Ok(uri.clone());
    }
    if let (true, Some(origin)) = (unchanged, uri.path_and_query()) {
        // An HTTP/2 request's (or an absolute-form) target whose path needs no change: its path
        // and query as they are (shared, not formatted and parsed again).
        let mut parts = http::uri::Parts::default();
        parts.path_and_query = Some(origin.clone());
        // (`http://a.test` has an empty path-and-query, whose path is `/` only beside a scheme.)
        if let Ok(target) = Uri::from_parts(parts) {
            if target.path() == uri.path() && target.query() == uri.query() {
                return Ok(target);
            }
        }
    }
    let target = match uri.query() {
        Some(query) => format!("{path}?{query}"),
        None => path.into_owned(),
    };
    // Built from the parts of a parsed URI, so it parses again.
    Ok(Uri::try_from(target).unwrap_or_else(|_| Uri::from_static("/")))
}

/// Sends exactly one framing upstream: a client's `Content-Length` is replaced by the one length
/// of its body when known (hyper has checked it), and dropped otherwise (then the body goes
/// chunked).
pub(super) fn declare_length(headers: &mut HeaderMap, length: Option<u64>) {
    if headers.contains_key(&CONTENT_LENGTH) {
        match length {
            Some(len) => {
                headers.insert(&CONTENT_LENGTH, HeaderValue::from(len));
            }
            None => {
                headers.remove(&CONTENT_LENGTH);
            }
        }
    }
}

/// Whether a request asks for a WebSocket upgrade: `Connection: upgrade` and exactly one
/// `Upgrade: websocket`. Other upgrades (`h2c`, unknown tokens) are not tunnelled: their
/// `Upgrade`, `Connection` and `HTTP2-Settings` are removed and the request goes on as a plain one.
pub(super) fn is_websocket_upgrade(headers: &HeaderMap) -> bool {
    let mut upgrades = headers.get_all(&UPGRADE).iter();
    let websocket = upgrades
        .next()
        .is_some_and(|v| v.as_bytes().trim_ascii().eq_ignore_ascii_case(b"websocket"));
    websocket
        && upgrades.next().is_none()
        && headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
}

/// Whether a 101 answers the WebSocket upgrade asked for (`Upgrade: websocket`).
pub(super) fn is_websocket_accept(headers: &HeaderMap) -> bool {
    headers
        .get(&UPGRADE)
        .is_some_and(|v| v.as_bytes().trim_ascii().eq_ignore_ascii_case(b"websocket"))
}

/// Removes hop-by-hop headers, including those the Connection header names. With `keep_upgrade`,
/// `Connection: upgrade` and `Upgrade` survive (for upgrade requests and 101 responses).
pub(super) fn strip_hop_by_hop(headers: &mut HeaderMap, keep_upgrade: bool) {
    let hops = Hops::of(headers);
    strip_hops(headers, &hops, keep_upgrade);
}

/// What one pass over a head's names found: its hop-by-hop names (a bit each of [`HOP_NAMES`]:
/// a map's names are distinct and lowercase), and whether it has `Content-Length`,
/// `Transfer-Encoding` and `Upgrade`. Read once per request and used three times (the WebSocket
/// check, the strip and the framing) instead of a hashed lookup each; a few bytes, copied
/// freely (it held the names themselves: 270 bytes zeroed and moved per request).
#[derive(Clone, Copy, Default)]
pub(super) struct Hops {
    /// Bit `i` set: the head has `HOP_NAMES[i]`.
    found: u8,
    /// The head has a `Content-Length`.
    pub content_length: bool,
    /// The head has an `Upgrade`.
    pub upgrade: bool,
}

/// The hop-by-hop names ([`crate::upstream::role`]'s, but `Content-Length`), one bit each in
/// [`Hops`]; `Transfer-Encoding` and `Upgrade` at the bits [`Hops`] reads them from.
static HOP_NAMES: [HeaderName; 8] = [
    header::CONNECTION,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::TE,
    header::TRAILER,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    HeaderName::from_static("http2-settings"),
];
const TRANSFER_ENCODING_BIT: u8 = 1 << 1;
const UPGRADE_BIT: u8 = 1 << 2;

/// The bit of a (lowercase) hop-by-hop name in [`Hops`]; `None` for `Content-Length`'s and
/// end-to-end names, `Some(0)` never.
fn hop_bit(name: &str) -> Option<u8> {
    Some(match name {
        "connection" => 1,
        "transfer-encoding" => TRANSFER_ENCODING_BIT,
        "upgrade" => UPGRADE_BIT,
        "te" => 1 << 3,
        "trailer" => 1 << 4,
        "keep-alive" => 1 << 5,
        "proxy-connection" => 1 << 6,
        "http2-settings" => 1 << 7,
        _ => return None,
    })
}

impl Hops {
    /// One pass over the (few) names present, each classified by its length and bytes instead
    /// of a hashed lookup or removal per hop-by-hop name: most requests carry none of them, most
    /// responses only `Connection: keep-alive`.
    pub(super) fn of(headers: &HeaderMap) -> Hops {
        let mut hops = Hops::default();
        for name in headers.keys() {
            match role(name.as_str().as_bytes()) {
                Role::EndToEnd => continue,
                Role::ContentLength => hops.content_length = true,
                _ => hops.found |= hop_bit(name.as_str()).unwrap_or(0),
            }
        }
        hops.upgrade = hops.found & UPGRADE_BIT != 0;
        hops
    }
}

/// [`strip_hop_by_hop`] with the names already read.
fn strip_hops(headers: &mut HeaderMap, hops: &Hops, keep_upgrade: bool) {
    let found = hops.found;
    // A message framed by Transfer-Encoding carries no meaningful Content-Length (RFC 9112
    // §6.3); the body is re-framed on the way out, so the stale length must not survive.
    if hops.content_length && found & TRANSFER_ENCODING_BIT != 0 {
        headers.remove(&CONTENT_LENGTH);
    }
    if found == 0 {
        return;
    }
    let upgrade = if keep_upgrade {
        headers.get(&UPGRADE).cloned()
    } else {
        None
    };
    // Connection options name further hop-by-hop headers; `keep-alive`, `close` and `upgrade`
    // are options, not header names to look for (keep-alive and upgrade go anyway).
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|t| !t.is_empty() && !crate::upstream::is_connection_option(t.as_bytes()))
        .filter_map(|t| HeaderName::from_bytes(t.as_bytes()).ok())
        .collect();
    for name in &named {
        headers.remove(name);
    }
    for (i, name) in HOP_NAMES.iter().enumerate() {
        if found & (1 << i) != 0 {
            headers.remove(name);
        }
    }
    if let Some(upgrade) = upgrade {
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        headers.insert(header::UPGRADE, upgrade);
    }
}

/// Turns a client request into the upstream request: the normalised origin-form target, HTTP/1.1,
/// Host set to the validated host (and nothing else), hop-by-hop headers removed, forwarding
/// headers set from the real peer (unless `deferred`: then the send writes them, see
/// [`crate::forwarded::Forwarding`]).
pub(super) fn prepare_request<B>(
    req: &mut Request<B>,
    host: &ValidHost,
    target: Uri,
    conn: &ConnInfo,
    (hops, upgrade): (&Hops, bool),
    deferred: bool,
) {
    *req.uri_mut() = target;
    *req.version_mut() = Version::HTTP_11;
    let headers = req.headers_mut();
    strip_hops(headers, hops, upgrade);
    if host.is_empty() {
        headers.remove(header::HOST);
    } else {
        headers.insert(header::HOST, host.header_value().clone());
    }
    if !deferred {
        crate::forwarded::set_for_host(headers, host, conn);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_go_including_named_ones() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, x-secret"),
        );
        h.insert("x-secret", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert(header::TE, HeaderValue::from_static("trailers"));
        h.insert("x-kept", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut h, false);
        assert_eq!(h.len(), 1, "{h:?}");
        assert!(h.contains_key("x-kept"));
    }

    #[test]
    fn every_hop_by_hop_name_has_its_own_bit_and_is_stripped_alone() {
        let names = [
            "connection",
            "transfer-encoding",
            "upgrade",
            "te",
            "trailer",
            "keep-alive",
            "proxy-connection",
            "http2-settings",
            "content-length",
            "x-kept",
            "tee",
            "upgrades",
        ];
        let mut seen = 0u8;
        for name in names {
            let is_hop = matches!(
                role(name.as_bytes()),
                Role::Connection | Role::TransferEncoding | Role::HopByHop
            );
            let bit = hop_bit(name);
            assert_eq!(bit.is_some(), is_hop, "{name}");
            if let Some(bit) = bit {
                assert_eq!(bit.count_ones(), 1, "{name}");
                assert_eq!(seen & bit, 0, "{name} shares a bit");
                seen |= bit;
                assert_eq!(HOP_NAMES[bit.trailing_zeros() as usize], name);
            }
            // Alone beside end-to-end fields, it goes and they stay.
            let mut h = HeaderMap::new();
            h.insert(
                HeaderName::from_static("x-a"),
                HeaderValue::from_static("1"),
            );
            h.insert(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_static("1"),
            );
            h.insert(
                HeaderName::from_static("x-b"),
                HeaderValue::from_static("2"),
            );
            let hops = Hops::of(&h);
            assert_eq!(hops.upgrade, name == "upgrade", "{name}");
            assert_eq!(hops.content_length, name == "content-length", "{name}");
            strip_hop_by_hop(&mut h, false);
            assert_eq!(h.contains_key(name), !is_hop, "{name}");
            assert_eq!(h.len(), if is_hop { 2 } else { 3 }, "{name}");
        }
        assert_eq!(seen, u8::MAX, "all eight bits in use");
    }

    #[test]
    fn upgrade_headers_survive_for_upgrades() {
        let mut h = HeaderMap::new();
        h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        assert!(is_websocket_upgrade(&h));
        strip_hop_by_hop(&mut h, true);
        assert_eq!(h[header::CONNECTION], "upgrade");
        assert_eq!(h[header::UPGRADE], "websocket");
    }

    #[test]
    fn only_websocket_upgrades_are_upgrades() {
        for (upgrade, connection, want) in [
            ("websocket", "Upgrade", true),
            ("WebSocket", "keep-alive, upgrade", true),
            ("h2c", "Upgrade, HTTP2-Settings", false),
            ("websocket, h2c", "upgrade", false),
            ("foo", "upgrade", false),
            ("websocket", "keep-alive", false),
        ] {
            let mut h = HeaderMap::new();
            h.insert(header::UPGRADE, HeaderValue::from_static(upgrade));
            h.insert(header::CONNECTION, HeaderValue::from_static(connection));
            h.insert(
                "http2-settings",
                HeaderValue::from_static("AAMAAABkAAQAAP__"),
            );
            assert_eq!(is_websocket_upgrade(&h), want, "{upgrade} / {connection}");
            strip_hop_by_hop(&mut h, want);
            assert!(!h.contains_key("http2-settings"));
            assert_eq!(h.contains_key(header::UPGRADE), want);
        }
    }

    #[test]
    fn transfer_encoding_drops_content_length() {
        let mut h = HeaderMap::new();
        h.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("5"));
        strip_hop_by_hop(&mut h, false);
        assert!(h.is_empty(), "{h:?}");
        let mut h = HeaderMap::new();
        h.append(header::CONTENT_LENGTH, HeaderValue::from_static("5"));
        h.append(header::CONTENT_LENGTH, HeaderValue::from_static("5"));
        declare_length(&mut h, Some(5));
        assert_eq!(h.get_all(header::CONTENT_LENGTH).iter().count(), 1);
        declare_length(&mut h, None);
        assert!(h.is_empty());
    }

    #[test]
    fn targets_are_normalised_origin_form() {
        for (given, want) in [
            ("http://a.test//x/./y/../z?q=/../", "/x/z?q=/../"),
            ("/a/b?c", "/a/b?c"),
            ("/a//b", "/a/b"),
        ] {
            let uri: Uri = given.parse().unwrap();
            assert_eq!(origin_form(&uri).unwrap(), want, "{given}");
        }
        assert!(origin_form(&"/x/%2e%2e/y".parse().unwrap()).is_err());
    }

    #[test]
    fn absolute_targets_keep_their_path_and_query_exactly() {
        for (given, want) in [
            ("http://a.test", "/"),
            ("http://a.test/b?c=d", "/b?c=d"),
            ("http://a.test/b?", "/b?"),
            ("https://[::1]:8443/a/b?x", "/a/b?x"),
        ] {
            let target = origin_form(&given.parse().unwrap()).unwrap();
            assert_eq!(target, want, "{given}");
            assert_eq!(target.to_string(), want, "{given}");
            assert!(target.scheme().is_none() && target.authority().is_none());
        }
    }

    #[test]
    fn forwarding_headers_for_both_families() {
        for (peer, ip) in [
            ("[::ffff:127.0.0.1]:5000", "127.0.0.1"),
            ("[::1]:5000", "::1"),
        ] {
            let conn = ConnInfo::new(peer.parse().unwrap(), "[::1]:8080".parse().unwrap());
            let mut req = Request::builder()
                .uri("/a?b=c")
                .header(header::HOST, "example.com")
                .header("x-forwarded-for", "6.6.6.6")
                .body(())
                .unwrap();
            let host = crate::host::request_host(&req).unwrap();
            let target = origin_form(req.uri()).unwrap();
            let hops = Hops::of(req.headers());
            prepare_request(&mut req, &host, target, &conn, (&hops, false), false);
            let h = req.headers();
            assert_eq!(h["x-forwarded-for"], ip);
            assert_eq!(h["x-real-ip"], ip);
            assert_eq!(h["x-forwarded-port"], "8080");
            assert_eq!(h["x-forwarded-host"], "example.com");
            assert_eq!(req.uri(), "/a?b=c");
            let fwd = h[header::FORWARDED].to_str().unwrap();
            let expected = if ip.contains(':') {
                format!("for=\"[{ip}]:5000\"")
            } else {
                format!("for=\"{ip}:5000\"")
            };
            assert!(fwd.starts_with(&expected), "{fwd}");
        }
    }

    #[test]
    fn h2_requests_become_origin_form_with_host() {
        let conn = ConnInfo::new(
            "127.0.0.1:1".parse().unwrap(),
            "127.0.0.1:2".parse().unwrap(),
        );
        let mut req = Request::builder()
            .version(Version::HTTP_2)
            .uri("http://demo.local/x/y?z")
            .body(())
            .unwrap();
        let host = crate::host::request_host(&req).unwrap();
        let target = origin_form(req.uri()).unwrap();
        let hops = Hops::of(req.headers());
        prepare_request(&mut req, &host, target, &conn, (&hops, false), false);
        assert_eq!(req.uri(), "/x/y?z");
        assert_eq!(req.version(), Version::HTTP_11);
        assert_eq!(req.headers()[header::HOST], "demo.local");
    }
}
