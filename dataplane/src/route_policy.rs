//! Plain data of the per-request choices of a route, a leaf of the snapshot contract (no I/O, no
//! other module of the crate): alternative backends chosen by a header or cookie match, then by
//! weight (ingress-nginx canaries today; Gateway API's header matches and weighted backendRefs
//! reuse it), how a target is chosen within a backend (a session-affinity cookie naming the pod,
//! or a consistent hash of a request key), and the `Host` sent upstream. Generic over the backend
//! identity so that the contract's `table` can name it without a cycle; the choosing logic is in
//! [`crate::policy`].

use std::sync::Arc;

use serde::{Serialize, Serializer};

/// What a route chooses per request, beyond its family policy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Choice<B> {
    /// How a target of the route's own backend (arm 0) is chosen.
    #[serde(skip_serializing_if = "Pinning::is_none")]
    pub primary: Pinning,
    /// Other backends: arm `k + 1` is `alternatives[k]`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub alternatives: Vec<Alternative<B>>,
    /// Tried in order: the first step whose condition holds sends the request to its arm.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<Step>,
    /// When no step decides: the alternatives' weights are out of this total and the remainder
    /// goes to arm 0 (each request drawn at random).
    pub weight_total: u32,
    /// The `Host` header sent upstream in place of the client's (`upstream-vhost`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upstream_host: Option<Arc<str>>,
    /// CORS: preflights answered by duet, headers added to responses (`enable-cors`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cors: Option<Arc<Cors>>,
}

impl<B> Default for Choice<B> {
    fn default() -> Self {
        Choice {
            primary: Pinning::None,
            alternatives: Vec::new(),
            steps: Vec::new(),
            weight_total: 100,
            upstream_host: None,
            cors: None,
        }
    }
}

/// ingress-nginx's CORS (`enable-cors` and the `cors-*` keys).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Cors {
    /// Allowed origins; `None` is `*` (every request gets `Access-Control-Allow-Origin: *`).
    pub origins: Option<Vec<OriginPattern>>,
    /// `Access-Control-Allow-Methods`.
    pub methods: Arc<str>,
    /// `Access-Control-Allow-Headers`.
    pub headers: Arc<str>,
    /// `Access-Control-Expose-Headers`, when set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expose: Option<Arc<str>>,
    /// `Access-Control-Allow-Credentials: true`.
    pub credentials: bool,
    /// `Access-Control-Max-Age`, seconds.
    pub max_age: u64,
    /// Gateway API's semantics (the HTTPRoute `CORS` filter) rather than ingress-nginx's: a
    /// `*.` origin covers one label or more; methods or headers of `*` answer with the
    /// preflight's requested ones; origins of `*` answer with the request's own `Origin` when
    /// credentials are allowed; and every preflight is answered by duet, an origin not allowed
    /// getting no `Access-Control-*` header.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub gateway: bool,
}

/// One allowed origin: `scheme://host[:port]`, the host possibly `*.suffix` (one label), or
/// `null`; lower case.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct OriginPattern {
    /// `http`, `https`, ... (empty for `null`).
    pub scheme: Arc<str>,
    /// The host, or `*.suffix` (`null` for the `null` origin).
    pub host: Arc<str>,
    /// The port, when written.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
}

impl OriginPattern {
    /// Parses `scheme://host[:port]` (IPv6 literals in brackets), `https://*.example.com` or
    /// `null`.
    pub fn parse(written: &str) -> Option<OriginPattern> {
        let lower = written.trim().to_ascii_lowercase();
        if lower == "null" {
            return Some(OriginPattern {
                scheme: "".into(),
                host: "null".into(),
                port: None,
            });
        }
        let (scheme, rest) = lower.split_once("://")?;
        let scheme_ok = !scheme.is_empty()
            && scheme
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b));
        let (host, port) = split_port(rest)?;
        let label =
            |l: &str| !l.is_empty() && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
        let name = host.strip_prefix("*.").unwrap_or(host);
        let host_ok = if host.starts_with('[') {
            host.ends_with(']')
                && host[1..host.len() - 1]
                    .parse::<std::net::Ipv6Addr>()
                    .is_ok()
        } else {
            name.split('.').all(label)
        };
        (scheme_ok && host_ok).then(|| OriginPattern {
            scheme: scheme.into(),
            host: host.into(),
            port,
        })
    }

    /// Whether an `Origin` header value matches (case-insensitive; a `*.` host covers exactly
    /// one more label).
    pub fn matches(&self, origin: &str) -> bool {
        self.matches_labels(origin, false)
    }

    /// [`OriginPattern::matches`], a `*.` host covering one label or more when `any_depth` (as
    /// Gateway API's `allowOrigins`).
    pub fn matches_labels(&self, origin: &str, any_depth: bool) -> bool {
        let Some(other) = OriginPattern::parse(origin) else {
            return false;
        };
        if self.scheme != other.scheme || self.port != other.port {
            return false;
        }
        match self.host.strip_prefix("*.") {
            None => self.host == other.host,
            Some(suffix) if any_depth => other
                .host
                .strip_suffix(suffix)
                .and_then(|head| head.strip_suffix('.'))
                .is_some_and(|head| !head.is_empty() && !head.starts_with('[')),
            Some(suffix) => other
                .host
                .split_once('.')
                .is_some_and(|(first, rest)| !first.is_empty() && rest == suffix),
        }
    }
}

/// `host[:port]` with IPv6 brackets; `None` when the port does not parse or a path follows.
fn split_port(rest: &str) -> Option<(&str, Option<u16>)> {
    if rest.contains('/') || rest.is_empty() {
        return None;
    }
    let colon = if rest.starts_with('[') {
        let end = rest.find(']')?;
        rest[end..].find(':').map(|i| end + i)
    } else {
        rest.rfind(':')
    };
    match colon {
        Some(i) => Some((&rest[..i], Some(rest[i + 1..].parse().ok()?))),
        None => Some((rest, None)),
    }
}

/// A backend a request may go to instead of the route's own.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Alternative<B> {
    /// The backend.
    pub backend: B,
    /// Its share of [`Choice::weight_total`] when no step decides.
    pub weight: u32,
    /// How a target of it is chosen.
    #[serde(skip_serializing_if = "Pinning::is_none")]
    pub pinning: Pinning,
}

/// A condition and the arm it sends the request to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Step {
    /// When the step applies.
    pub when: Condition,
    /// 0 for the route's backend, `k + 1` for `alternatives[k]`.
    pub arm: usize,
}

/// A test on the request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Condition {
    /// A request header (name in lower case) has a matching value.
    Header {
        /// The header name, lower case.
        name: Arc<str>,
        /// How its value must match.
        value: ValueMatch,
    },
    /// A cookie of the request has a matching value.
    Cookie {
        /// The cookie name, as written (case-sensitive).
        name: Arc<str>,
        /// How its value must match.
        value: ValueMatch,
    },
}

/// How a value matches.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ValueMatch {
    /// Equal, byte for byte.
    Exact(Arc<str>),
    /// The regex matches somewhere in the value (unanchored, as nginx's `ngx.re.match`).
    Regex(ValueRegex),
}

impl ValueMatch {
    /// Whether a value matches.
    pub fn matches(&self, value: &str) -> bool {
        match self {
            ValueMatch::Exact(want) => value == &**want,
            ValueMatch::Regex(r) => r.regex.is_match(value),
        }
    }
}

/// A compiled value regex, compared and serialised by its pattern.
#[derive(Clone, Debug)]
pub struct ValueRegex {
    pattern: Arc<str>,
    regex: regex::Regex,
}

impl ValueRegex {
    /// Compiles a pattern (Rust's `regex` syntax, bounded size: it comes from an object).
    pub fn new(pattern: &str) -> Result<ValueRegex, regex::Error> {
        let regex = regex::RegexBuilder::new(pattern)
            .size_limit(1 << 20)
            .dfa_size_limit(1 << 20)
            .build()?;
        Ok(ValueRegex {
            pattern: pattern.into(),
            regex,
        })
    }
}

impl PartialEq for ValueRegex {
    fn eq(&self, other: &ValueRegex) -> bool {
        self.pattern == other.pattern
    }
}

impl Eq for ValueRegex {}

impl Serialize for ValueRegex {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.pattern)
    }
}

/// How a target is chosen within a backend.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Pinning {
    /// The backend's balancer (`--lb`).
    #[default]
    None,
    /// A cookie names the target (the pod, whatever family reached it).
    Cookie(Arc<AffinityCookie>),
    /// A consistent hash of a request key picks the target.
    Hash(Arc<HashKey>),
}

impl Pinning {
    /// Whether targets are left to the balancer.
    pub fn is_none(&self) -> bool {
        matches!(self, Pinning::None)
    }
}

/// The session-affinity cookie (ingress-nginx's `affinity: cookie` and `session-cookie-*`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct AffinityCookie {
    /// Its name (`INGRESSCOOKIE` by default).
    pub name: Arc<str>,
    /// Its `Path` (the rule's path unless `session-cookie-path`).
    pub path: Arc<str>,
    /// Its `Domain`, if set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub domain: Option<Arc<str>>,
    /// Its `SameSite`, if set: `None`, `Lax` or `Strict`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub same_site: Option<Arc<str>>,
    /// `Secure` even on plain HTTP (it is always set over HTTPS).
    pub secure: bool,
    /// `Max-Age` in seconds, if set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_age: Option<u64>,
    /// `Expires` this many seconds from now, if set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires: Option<u64>,
    /// After the named target failed, name the one that served instead.
    pub change_on_failure: bool,
}

/// A request key hashed onto a backend's targets (ingress-nginx's `upstream-hash-by`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct HashKey {
    /// The key as written (`$remote_addr`, `$host$request_uri`, ...).
    pub written: Arc<str>,
    /// The key's parts, concatenated.
    #[serde(skip)]
    pub parts: Vec<KeyPart>,
    /// `upstream-hash-by-subset`: the key picks a group of this many targets, a random one of
    /// which serves.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub subset: Option<u32>,
}

/// One part of a hash key: text, or an nginx variable's value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyPart {
    /// Literal text.
    Literal(Arc<str>),
    /// `$remote_addr` / `$binary_remote_addr`: the client address (IPv4-mapped IPv6 as IPv4).
    RemoteAddr,
    /// `$request_uri`: the path and query as received.
    RequestUri,
    /// `$uri`: the normalised path.
    Uri,
    /// `$host`: the request host, lower case, without port.
    Host,
    /// `$http_NAME`: a request header (name in lower case, `_` as `-`).
    Header(Arc<str>),
    /// `$cookie_NAME`: a cookie.
    Cookie(Arc<str>),
    /// `$arg_NAME`: a query parameter.
    Arg(Arc<str>),
}

/// The `Location` of a `from-to-www-redirect`: the request's scheme, the other spelling `to` of
/// its host with the port the client wrote (IPv6 literals keep their brackets), the target kept.
pub fn www_location(scheme: &str, host: &str, to: &str, target: &str) -> String {
    let port = match host.rsplit_once(':') {
        Some((name, port))
            if !name.is_empty()
                && (name.ends_with(']') || !name.contains(':'))
                && port.bytes().all(|b| b.is_ascii_digit()) =>
        {
            Some(port)
        }
        _ => None,
    };
    match port {
        Some(port) => format!("{scheme}://{to}:{port}{target}"),
        None => format!("{scheme}://{to}{target}"),
    }
}
