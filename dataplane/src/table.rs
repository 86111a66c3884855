//! The routing snapshot: plain, immutable data handed from the controller to the dataplane,
//! plus host and path matching. No I/O here.

use std::cmp::Ordering;
use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize, Serializer};

pub use backend_map::BackendMap;

pub mod backend_map;
pub mod gateway;
pub mod key;
pub mod passthrough;

pub use key::TargetKey;

/// An address family: of a client, of a listener, of an upstream address. Serialised as
/// `ipv4` / `ipv6`, as in logs, JSON and metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Family {
    /// IPv4 (including IPv4-mapped IPv6 addresses, which are normalised to IPv4).
    #[serde(rename = "ipv4")]
    V4,
    /// IPv6.
    #[serde(rename = "ipv6")]
    V6,
}

impl Family {
    /// Both families, IPv4 first.
    pub const BOTH: [Family; 2] = [Family::V4, Family::V6];

    /// The loopback address of the family: `127.0.0.1` or `::1`.
    pub fn loopback(self) -> IpAddr {
        match self {
            Family::V4 => IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
            Family::V6 => IpAddr::V6(std::net::Ipv6Addr::LOCALHOST),
        }
    }

    /// The family of an address, after normalising IPv4-mapped IPv6 addresses.
    pub fn of(addr: &SocketAddr) -> Family {
        Family::of_ip(&addr.ip())
    }

    /// The family of an IP address, after normalising IPv4-mapped IPv6 addresses.
    pub fn of_ip(ip: &IpAddr) -> Family {
        match ip.to_canonical() {
            IpAddr::V4(_) => Family::V4,
            IpAddr::V6(_) => Family::V6,
        }
    }

    /// The other family.
    pub fn other(self) -> Family {
        match self {
            Family::V4 => Family::V6,
            Family::V6 => Family::V4,
        }
    }

    /// The label used in logs, JSON and metrics: `ipv4` or `ipv6`.
    pub fn as_str(self) -> &'static str {
        match self {
            Family::V4 => "ipv4",
            Family::V6 => "ipv6",
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Normalises an IPv4-mapped IPv6 socket address (`[::ffff:192.0.2.1]:80`) to plain IPv4.
pub fn normalize_addr(addr: SocketAddr) -> SocketAddr {
    SocketAddr::new(addr.ip().to_canonical(), addr.port())
}

/// How a target's address is chosen for a client of a given family.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
pub enum FamilyPolicy {
    /// The client's family first, then the other one (the default).
    #[default]
    PreferSameFamily,
    /// Only the client's family; targets lacking it are not candidates.
    RequireSameFamily,
    /// IPv4 first, then IPv6, whatever the client.
    #[serde(rename = "PreferIPv4")]
    PreferIpv4,
    /// IPv6 first, then IPv4, whatever the client.
    #[serde(rename = "PreferIPv6")]
    PreferIpv6,
}

impl FamilyPolicy {
    /// Every accepted spelling, for error messages.
    pub const NAMES: &'static str = "PreferSameFamily, RequireSameFamily, PreferIPv4, PreferIPv6";

    /// The families to try for a client, in order; `None` where the policy allows no second one.
    pub fn order(self, client: Family) -> [Option<Family>; 2] {
        match self {
            FamilyPolicy::PreferSameFamily => [Some(client), Some(client.other())],
            FamilyPolicy::RequireSameFamily => [Some(client), None],
            FamilyPolicy::PreferIpv4 => [Some(Family::V4), Some(Family::V6)],
            FamilyPolicy::PreferIpv6 => [Some(Family::V6), Some(Family::V4)],
        }
    }

    /// Whether a target is a candidate at all for this client under this policy.
    pub fn admits(self, target: &Target, client: Family) -> bool {
        self.order(client)
            .into_iter()
            .flatten()
            .any(|f| target.addr(f).is_some())
    }
}

impl FromStr for FamilyPolicy {
    type Err = UnknownName;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "PreferSameFamily" => Ok(FamilyPolicy::PreferSameFamily),
            "RequireSameFamily" => Ok(FamilyPolicy::RequireSameFamily),
            "PreferIPv4" => Ok(FamilyPolicy::PreferIpv4),
            "PreferIPv6" => Ok(FamilyPolicy::PreferIpv6),
            other => Err(UnknownName {
                what: "upstream family policy",
                given: other.to_owned(),
                expected: FamilyPolicy::NAMES,
            }),
        }
    }
}

/// A name that is not one of an enum's spellings.
#[derive(Debug, thiserror::Error)]
#[error("unknown {what} {given:?} (expected one of: {expected})")]
pub struct UnknownName {
    /// What kind of name it was.
    pub what: &'static str,
    /// What was given.
    pub given: String,
    /// The accepted names.
    pub expected: &'static str,
}

/// The load-balancing algorithm over a backend's targets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LbPolicy {
    /// Power of two choices over in-flight requests per target (the default).
    #[default]
    P2c,
    /// Round robin over the candidate targets.
    RoundRobin,
}

impl FromStr for LbPolicy {
    type Err = UnknownName;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "p2c" => Ok(LbPolicy::P2c),
            "round-robin" => Ok(LbPolicy::RoundRobin),
            other => Err(UnknownName {
                what: "load-balancing policy",
                given: other.to_owned(),
                expected: "p2c, round-robin",
            }),
        }
    }
}

/// The identity of one target, stable across snapshots (a pod uid, or a namespaced pod name, or
/// the address of an endpoint without a `targetRef`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct TargetId(pub TargetKey);

impl fmt::Display for TargetId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// ONE pod (or one endpoint without a `targetRef`): weighted once whatever its families. 88
/// bytes (an IPv4 address and port in 6, an IPv6 one in 18): a backend's ten targets and the
/// `Arc`'s counts fit jemalloc's 896-byte class.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Target {
    /// Stable identity; per-target balancer state is keyed by it.
    pub id: TargetId,
    /// The pod's IPv4 address and port, if it has one.
    pub v4: Option<SocketAddrV4>,
    /// The pod's IPv6 address and port, if it has one.
    pub v6: Option<TargetV6>,
    /// The topology zone, when the EndpointSlice gives it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub zone: Option<Arc<str>>,
}

impl Target {
    /// A target without an address yet (see [`Target::add_addr`]) or a zone.
    pub fn new(id: TargetId) -> Target {
        Target {
            id,
            v4: None,
            v6: None,
            zone: None,
        }
    }

    /// A target with these addresses (the first of each family is kept) and zone.
    pub fn with_addrs(
        id: TargetId,
        addrs: impl IntoIterator<Item = SocketAddr>,
        zone: Option<Arc<str>>,
    ) -> Target {
        let mut target = Target::new(id);
        for addr in addrs {
            target.add_addr(addr);
        }
        target.zone = zone;
        target
    }

    /// Sets the address of `addr`'s family (IPv4 or IPv6 as written, without normalising an
    /// IPv4-mapped IPv6 address) unless the target has one: the first one wins. Returns whether
    /// it was set. An IPv6 address keeps no flow information or scope (pod addresses carry none).
    pub fn add_addr(&mut self, addr: SocketAddr) -> bool {
        match addr {
            SocketAddr::V4(a) if self.v4.is_none() => self.v4 = Some(a),
            SocketAddr::V6(a) if self.v6.is_none() => self.v6 = Some(TargetV6::from(a)),
            _ => return false,
        }
        true
    }

    /// Whether the target has an address of either family.
    pub fn has_addr(&self) -> bool {
        self.v4.is_some() || self.v6.is_some()
    }

    /// The target's address of one family.
    pub fn addr(&self, family: Family) -> Option<SocketAddr> {
        match family {
            Family::V4 => self.v4.map(SocketAddr::V4),
            Family::V6 => self.v6.map(SocketAddr::from),
        }
    }
}

/// A target's IPv6 address and port in 18 bytes, where `SocketAddrV6` takes 28 with a flow label
/// and a scope id that pod addresses do not carry. Reads, compares, parses, prints and serialises
/// as the socket address `[ip]:port`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TargetV6 {
    ip: [u8; 16],
    port: [u8; 2],
}

impl TargetV6 {
    /// The address `[ip]:port`.
    pub fn new(ip: Ipv6Addr, port: u16) -> TargetV6 {
        TargetV6 {
            ip: ip.octets(),
            port: port.to_ne_bytes(),
        }
    }

    /// The IP address.
    pub fn ip(&self) -> Ipv6Addr {
        Ipv6Addr::from(self.ip)
    }

    /// The port.
    pub fn port(&self) -> u16 {
        u16::from_ne_bytes(self.port)
    }

    /// As a standard socket address (no flow information, no scope).
    pub fn socket_addr(&self) -> SocketAddrV6 {
        SocketAddrV6::new(self.ip(), self.port(), 0, 0)
    }
}

impl From<SocketAddrV6> for TargetV6 {
    /// Keeps the address and port (a flow label and a scope id are dropped).
    fn from(addr: SocketAddrV6) -> TargetV6 {
        TargetV6::new(*addr.ip(), addr.port())
    }
}

impl From<TargetV6> for SocketAddr {
    fn from(addr: TargetV6) -> SocketAddr {
        SocketAddr::V6(addr.socket_addr())
    }
}

/// An IPv6 socket address that does not parse, or carries a flow label or a scope id.
#[derive(Debug, thiserror::Error)]
#[error("{0:?} is not an IPv6 socket address without flow label or scope ([ip]:port)")]
pub struct TargetV6Error(String);

impl FromStr for TargetV6 {
    type Err = TargetV6Error;

    fn from_str(s: &str) -> Result<TargetV6, TargetV6Error> {
        match s.parse::<SocketAddrV6>() {
            Ok(a) if a.flowinfo() == 0 && a.scope_id() == 0 => Ok(TargetV6::from(a)),
            _ => Err(TargetV6Error(s.to_owned())),
        }
    }
}

impl fmt::Display for TargetV6 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.socket_addr(), f)
    }
}

impl fmt::Debug for TargetV6 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.socket_addr(), f)
    }
}

impl Serialize for TargetV6 {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.socket_addr().serialize(s)
    }
}

/// The identity of a backend: `namespace/service:port`, with its namespace and Service kept
/// apart (metrics label by them without taking the id apart again). One pointer wide; compared,
/// hashed, ordered and serialised as the whole id.
#[derive(Clone, Debug)]
pub struct BackendId(Arc<BackendName>);

/// The prefix of unresolved backend ids (no Service name starts with it).
const UNRESOLVED: &str = "!unresolved:";

#[derive(Debug)]
struct BackendName {
    id: Box<str>,
    namespace: Arc<str>,
    service: Arc<str>,
    /// The digest of `id` ([`backend_map::digest_of`]), computed once here: every map hashes
    /// it (and [`BackendMap`] picks a shard by it) without reading `id` again. At the 10k-Ingress
    /// size a full publish hashes each id several times, each time a cache miss away.
    digest: u64,
}

impl BackendId {
    /// The id `id` of the Service `namespace/service`.
    fn from_parts(id: Box<str>, namespace: Arc<str>, service: Arc<str>) -> BackendId {
        let digest = backend_map::digest_of(&id);
        BackendId(Arc::new(BackendName {
            id,
            namespace,
            service,
            digest,
        }))
    }
}

impl BackendId {
    /// The id of a Service port; `port` is the port's number or name as the Ingress wrote it.
    pub fn new(namespace: &str, service: &str, port: &str) -> BackendId {
        // Not `format!`: one allocation of the exact length (10,000 ids per full build at the
        // 10k-Ingress size; `format!` grew its guess and cost about 1,800 instructions each).
        BackendId::from_parts(
            [namespace, "/", service, ":", port].concat().into(),
            namespace.into(),
            service.into(),
        )
    }

    /// A backend that does not resolve (a Gateway API backendRef to a missing Service, a kind
    /// duet does not serve, a reference not granted): requests routed to it get 500.
    pub fn unresolved(what: &str) -> BackendId {
        BackendId::from_parts(format!("{UNRESOLVED}{what}").into(), "".into(), "".into())
    }

    /// Whether the id is an [`unresolved`](BackendId::unresolved) backend's.
    pub fn is_unresolved(&self) -> bool {
        self.0.id.starts_with(UNRESOLVED)
    }

    /// `namespace/service:port`.
    pub fn as_str(&self) -> &str {
        &self.0.id
    }

    /// The Service's namespace.
    pub fn namespace(&self) -> &Arc<str> {
        &self.0.namespace
    }

    /// The Service's name.
    pub fn service(&self) -> &Arc<str> {
        &self.0.service
    }

    /// Which id this is, as an address: the same for an id and its clones, different for ids
    /// made apart (even when equal). Lets a caller that holds clones of one set of ids match
    /// them without reading or hashing their text.
    pub fn identity(&self) -> usize {
        Arc::as_ptr(&self.0) as usize
    }

    /// Its [`BackendMap`] shard.
    fn shard(&self) -> usize {
        backend_map::shard_of(self.0.digest)
    }
}

impl FromStr for BackendId {
    type Err = std::convert::Infallible;

    /// Reads an id as written (tests, tools): the whole text is the id; the namespace is what
    /// comes before its `/` (none without one), the Service what follows, up to a last `:`.
    fn from_str(s: &str) -> Result<BackendId, Self::Err> {
        let (namespace, rest) = s.split_once('/').unwrap_or(("", s));
        let service = rest.rsplit_once(':').map_or(rest, |(service, _)| service);
        Ok(BackendId::from_parts(
            s.into(),
            namespace.into(),
            service.into(),
        ))
    }
}

impl PartialEq for BackendId {
    fn eq(&self, other: &BackendId) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self.0.id == other.0.id
    }
}

impl Eq for BackendId {}

impl std::hash::Hash for BackendId {
    /// The id's digest, equal for equal ids (one process-wide hasher made it), which the map's
    /// own seeded hasher mixes again.
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write_u64(self.0.digest);
    }
}

impl PartialOrd for BackendId {
    fn partial_cmp(&self, other: &BackendId) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for BackendId {
    fn cmp(&self, other: &BackendId) -> Ordering {
        self.0.id.cmp(&other.0.id)
    }
}

impl Serialize for BackendId {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0.id)
    }
}

impl fmt::Display for BackendId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.id)
    }
}

/// The protocol spoken to a backend's targets, from the Service port's `appProtocol`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum UpstreamProtocol {
    /// HTTP/1.1 over plain TCP (the default).
    #[default]
    Http1,
    /// HTTP/2 over plain TCP with prior knowledge (`kubernetes.io/h2c`).
    H2c,
    /// HTTP/1.1 over TLS (`https`).
    Https,
    /// HTTP/2 over TLS, ALPN `h2` (`h2`).
    H2,
}

impl UpstreamProtocol {
    /// Whether connections use TLS (the route's [`RouteAction::upstream_tls`] applies).
    pub fn is_tls(self) -> bool {
        matches!(self, UpstreamProtocol::Https | UpstreamProtocol::H2)
    }

    /// Whether requests go over one multiplexed HTTP/2 connection per address.
    pub fn is_h2(self) -> bool {
        matches!(self, UpstreamProtocol::H2c | UpstreamProtocol::H2)
    }

    /// The name in `/debug/routes` and the access log: `http1`, `h2c`, `https` or `h2`.
    pub fn as_str(self) -> &'static str {
        match self {
            UpstreamProtocol::Http1 => "http1",
            UpstreamProtocol::H2c => "h2c",
            UpstreamProtocol::Https => "https",
            UpstreamProtocol::H2 => "h2",
        }
    }
}

/// One Service port with its targets.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Backend {
    /// `namespace/service:port`.
    pub id: BackendId,
    /// One entry per pod; empty when no endpoint is ready.
    pub targets: Arc<[Target]>,
    /// The balancing algorithm.
    pub lb: LbPolicy,
    /// The protocol to the targets.
    pub protocol: UpstreamProtocol,
}

/// Where a matched request goes: a backend, and how a target address is chosen for it (the
/// family policy belongs to the route because the annotation that sets it is per Ingress, and two
/// Ingresses may share a Service).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RouteAction {
    /// The backend serving the route.
    pub backend: BackendId,
    /// The family policy of the Ingress that declared the route.
    pub policy: FamilyPolicy,
    /// The Ingress that declared the route (shared by its routes: one pointer per rule).
    pub origin: Arc<Origin>,
    /// Plain-HTTP requests get a 308 to `https://` (the Ingress lists the host under `spec.tls`
    /// and does not say `duet.dev/ssl-redirect: "false"`).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub redirect_https: bool,
    /// Largest request body accepted, in bytes (0: unlimited); larger declared bodies get 413.
    pub max_body_bytes: u64,
    /// How to speak TLS to the backend when its protocol is `https` or `h2` (server name, trust;
    /// per Ingress and Service); `None` for plain backends.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upstream_tls: Option<Arc<crate::upstream_tls::UpstreamTls>>,
    /// Upstream timeouts of the Ingress that declared the route, where it sets them.
    #[serde(skip_serializing_if = "RouteTimeouts::is_default")]
    pub timeouts: RouteTimeouts,
    /// The protocol to the backend's targets when the Ingress sets it
    /// (`nginx.ingress.kubernetes.io/backend-protocol`), in place of the backend's own.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub protocol: Option<UpstreamProtocol>,
    /// Answers given instead of proxying (ingress-nginx's redirect annotations).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redirect: Option<Arc<Redirect>>,
    /// The client addresses the route admits (ingress-nginx's source-range annotations).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source_ranges: Option<Arc<SourceRanges>>,
    /// The upstream path replacing the request's (ingress-nginx's `rewrite-target`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rewrite: Option<Arc<Rewrite>>,
    /// Limits and authentication checked before proxying (ingress-nginx's `limit-*`, `auth-*`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub access: Option<Arc<crate::access_policy::Access>>,
    /// Per-request choices: alternative backends, target pinning, upstream Host
    /// ([`crate::policy`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub choice: Option<Arc<crate::route_policy::Choice<BackendId>>>,
    /// Gateway API filters and timeouts of the rule ([`crate::filters`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub filters: Option<Arc<crate::filters::Filters>>,
    /// Client certificates asked for and verified (ingress-nginx's `auth-tls-*`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_auth: Option<Arc<crate::client_auth::ClientAuth>>,
}

/// ingress-nginx's `rewrite-target` on one path: nginx's `rewrite "(?i)<path>" <target> break;`.
/// The whole request path is replaced by the target, with `$1`..`$9` taken from the path regex's
/// capture groups and the query string kept; a target starting with `http://` or `https://`
/// answers 302 to it instead of proxying.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Rewrite {
    /// The target as written (validated: `^/?[A-Za-z0-9\-._~/:$]*$`).
    pub target: Arc<str>,
    /// `X-Forwarded-Prefix` sent upstream with rewritten requests (`x-forwarded-prefix`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub forwarded_prefix: Option<Arc<str>>,
}

/// What a [`Rewrite`] makes of a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Rewritten {
    /// Proxy with this origin-form target (path and query).
    Target(String),
    /// Answer 302 with this `Location` (a full-URL target, the query appended).
    Redirect(String),
}

impl Rewrite {
    /// Applies the rewrite to a request that `matcher` matched: `path` is the normalised request
    /// path, `query` its query string as received.
    pub fn apply(&self, matcher: &PathMatch, path: &str, query: Option<&str>) -> Rewritten {
        let captures = match matcher {
            PathMatch::Regex(r) => r.0.regex.captures(path),
            _ => None,
        };
        let mut out = String::with_capacity(self.target.len() + path.len());
        let mut chars = self.target.char_indices().peekable();
        while let Some((_, c)) = chars.next() {
            let group = chars.peek().and_then(|(_, d)| d.to_digit(10));
            match (c, group) {
                ('$', Some(n)) => {
                    chars.next();
                    let text = captures.as_ref().and_then(|c| c.get(n as usize));
                    out.push_str(text.map_or("", |m| m.as_str()));
                }
                _ => out.push(c),
            }
        }
        let redirect = out.starts_with("http://") || out.starts_with("https://");
        if !redirect && !out.starts_with('/') {
            out.insert(0, '/');
        }
        if let Some(q) = query {
            out.push(if out.contains('?') { '&' } else { '?' });
            out.push_str(q);
        }
        if redirect {
            Rewritten::Redirect(out)
        } else {
            Rewritten::Target(out)
        }
    }
}

/// Which client addresses a route admits: the peer (after PROXY protocol; IPv4-mapped IPv6
/// counts as IPv4), never a forwarded header.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SourceRanges {
    /// Refused (403), checked first.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub deny: Vec<crate::cidr::Cidr>,
    /// When set, only these are admitted; everyone else gets 403.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allow: Option<Vec<crate::cidr::Cidr>>,
    /// A list did not parse: the route answers 503 to everyone (fail closed).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub invalid: bool,
}

/// Why [`SourceRanges`] refuse a client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The client is denied, or not allowed (403).
    Forbidden,
    /// The lists are invalid: nobody is admitted (503).
    Misconfigured,
}

impl SourceRanges {
    /// Whether a client address is admitted.
    pub fn admit(&self, client: std::net::IpAddr) -> Result<(), Refusal> {
        if self.invalid {
            return Err(Refusal::Misconfigured);
        }
        if self.deny.iter().any(|c| c.contains(client)) {
            return Err(Refusal::Forbidden);
        }
        match &self.allow {
            Some(allow) if !allow.iter().any(|c| c.contains(client)) => Err(Refusal::Forbidden),
            _ => Ok(()),
        }
    }
}

/// Redirects a route answers with instead of proxying.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize)]
pub struct Redirect {
    /// Every request gets this status and `Location` (the request path is not appended).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub always: Option<(u16, Arc<str>)>,
    /// A request for exactly `/` gets 302 to this path on the request's scheme and Host.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub app_root: Option<Arc<str>>,
    /// Every request gets 308 to this host, the request's scheme, port and target kept
    /// (`from-to-www-redirect`, on the rules of the other spelling of the host).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub to_host: Option<Arc<str>>,
}

impl Redirect {
    /// The status and `Location` for a request, if it is redirected; `target` is the request's
    /// path and query, `scheme` and `host` the request's (the Host header as received, port and
    /// IPv6 brackets included).
    pub fn answer(&self, target: &str, scheme: &str, host: &str) -> Option<(u16, String)> {
        if let Some(to) = &self.to_host {
            let location = crate::route_policy::www_location(scheme, host, to, target);
            return Some((308, location));
        }
        let path = target.split_once('?').map_or(target, |(path, _)| path);
        if let (Some(root), "/") = (&self.app_root, path) {
            return Some((302, format!("{scheme}://{host}{root}")));
        }
        self.always
            .as_ref()
            .map(|(code, location)| (*code, location.to_string()))
    }
}

/// Upstream timeouts set per Ingress by annotation; `None` means the global flag's value.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
pub struct UpstreamTimeouts {
    /// TCP connect timeout per attempt (`duet.dev/proxy-connect-timeout`), in place of
    /// `--connect-timeout`.
    #[serde(
        rename = "connect_ms",
        skip_serializing_if = "Option::is_none",
        serialize_with = "millis"
    )]
    pub connect: Option<Duration>,
    /// Longest wait for the response head and between response body reads
    /// (`duet.dev/proxy-read-timeout`), in place of `--upstream-timeout`.
    #[serde(
        rename = "read_ms",
        skip_serializing_if = "Option::is_none",
        serialize_with = "millis"
    )]
    pub read: Option<Duration>,
    /// Longest the upstream may go without accepting more of the request body
    /// (`nginx.ingress.kubernetes.io/proxy-send-timeout`); none by default.
    #[serde(
        rename = "send_ms",
        skip_serializing_if = "Option::is_none",
        serialize_with = "millis"
    )]
    pub send: Option<Duration>,
}

impl UpstreamTimeouts {
    fn is_default(&self) -> bool {
        *self == UpstreamTimeouts::default()
    }
}

/// A route's [`UpstreamTimeouts`] in one pointer: a route setting none (the usual one) keeps no
/// allocation for them, where the three `Option<Duration>`s took 48 bytes of every path rule.
/// Reads as the timeouts (`Deref`); written through `DerefMut` (allocated on the first write) or
/// made `From` them.
#[derive(Clone, Default)]
pub struct RouteTimeouts(Option<Box<UpstreamTimeouts>>);

/// What a route without timeouts of its own reads.
static NO_TIMEOUTS: UpstreamTimeouts = UpstreamTimeouts {
    connect: None,
    read: None,
    send: None,
};

impl RouteTimeouts {
    fn is_default(&self) -> bool {
        self.as_ref().is_default()
    }
}

impl From<UpstreamTimeouts> for RouteTimeouts {
    fn from(timeouts: UpstreamTimeouts) -> RouteTimeouts {
        RouteTimeouts((!timeouts.is_default()).then(|| Box::new(timeouts)))
    }
}

impl AsRef<UpstreamTimeouts> for RouteTimeouts {
    fn as_ref(&self) -> &UpstreamTimeouts {
        self.0.as_deref().unwrap_or(&NO_TIMEOUTS)
    }
}

impl std::ops::Deref for RouteTimeouts {
    type Target = UpstreamTimeouts;

    fn deref(&self) -> &UpstreamTimeouts {
        self.as_ref()
    }
}

impl std::ops::DerefMut for RouteTimeouts {
    fn deref_mut(&mut self) -> &mut UpstreamTimeouts {
        self.0.get_or_insert_with(Box::default)
    }
}

impl PartialEq for RouteTimeouts {
    fn eq(&self, other: &RouteTimeouts) -> bool {
        self.as_ref() == other.as_ref()
    }
}

impl Eq for RouteTimeouts {}

impl PartialEq<UpstreamTimeouts> for RouteTimeouts {
    fn eq(&self, other: &UpstreamTimeouts) -> bool {
        self.as_ref() == other
    }
}

impl fmt::Debug for RouteTimeouts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_ref(), f)
    }
}

impl Serialize for RouteTimeouts {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.as_ref().serialize(s)
    }
}

fn millis<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        None => s.serialize_none(),
    }
}

/// The Ingress or Gateway API route a rule came from; its age decides conflicts.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Origin {
    /// The kind of object.
    pub kind: OriginKind,
    /// Namespace of the object.
    pub namespace: Arc<str>,
    /// Name of the object.
    pub name: Arc<str>,
    /// `metadata.creationTimestamp` in Unix seconds (0 when unset, e.g. in a manifest file).
    pub created: i64,
}

/// The kinds of object that declare routes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
pub enum OriginKind {
    /// `networking.k8s.io/v1` Ingress.
    #[default]
    Ingress,
    /// `gateway.networking.k8s.io/v1` HTTPRoute.
    #[serde(rename = "HTTPRoute")]
    HttpRoute,
    /// `gateway.networking.k8s.io/v1` GRPCRoute.
    #[serde(rename = "GRPCRoute")]
    GrpcRoute,
    /// `gateway.networking.k8s.io/v1` TLSRoute.
    #[serde(rename = "TLSRoute")]
    TlsRoute,
}

impl Origin {
    /// Older first, then namespace, then name.
    fn age_cmp(&self, other: &Origin) -> Ordering {
        self.created
            .cmp(&other.created)
            .then_with(|| self.namespace.cmp(&other.namespace))
            .then_with(|| self.name.cmp(&other.name))
    }
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// How a rule matches the request path.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(tag = "type", content = "path")]
pub enum PathMatch {
    /// The path equals this string exactly (case-sensitive).
    Exact(Box<str>),
    /// Element-wise prefix: `/foo` matches `/foo`, `/foo/` and `/foo/bar`, not `/foobar`; a
    /// trailing slash in the rule is ignored, and `/` matches everything.
    Prefix(Box<str>),
    /// What duet does with `ImplementationSpecific`: the same as `Prefix`.
    ImplementationSpecific(Box<str>),
    /// ingress-nginx's regex location `~* "^<path>"`: a case-insensitive regex anchored at the
    /// start of the path, not at its end (a prefix). Every path of a host becomes one when an
    /// Ingress of the host says `use-regex` or `rewrite-target`.
    Regex(RegexPath),
}

/// A compiled path regex, compared, hashed and serialised by its pattern. One pointer wide (a
/// path rule carries a [`PathMatch`] whether or not it is a regex; few are).
#[derive(Clone, Debug)]
pub struct RegexPath(Box<CompiledPath>);

#[derive(Clone, Debug)]
struct CompiledPath {
    pattern: Box<str>,
    regex: regex::Regex,
}

/// Bounds on a compiled path regex (the pattern comes from an Ingress: hostile input).
const REGEX_SIZE_LIMIT: usize = 1 << 20;

impl RegexPath {
    /// Compiles `pattern` as nginx's `~* "^<pattern>"` would match it (Rust's `regex` syntax:
    /// no lookaround, no backreferences).
    pub fn new(pattern: &str) -> Result<RegexPath, regex::Error> {
        // `^` then the pattern as nginx writes it: a top-level `|` is not anchored there either.
        let regex = regex::RegexBuilder::new(&format!("^{pattern}"))
            .case_insensitive(true)
            .size_limit(REGEX_SIZE_LIMIT)
            .dfa_size_limit(REGEX_SIZE_LIMIT)
            .build()?;
        Ok(RegexPath(Box::new(CompiledPath {
            pattern: pattern.into(),
            regex,
        })))
    }

    /// The pattern as written.
    pub fn pattern(&self) -> &str {
        &self.0.pattern
    }
}

impl PartialEq for RegexPath {
    fn eq(&self, other: &RegexPath) -> bool {
        self.pattern() == other.pattern()
    }
}

impl Eq for RegexPath {}

impl std::hash::Hash for RegexPath {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.pattern().hash(state);
    }
}

impl Serialize for RegexPath {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.pattern())
    }
}

impl PathMatch {
    /// A `Prefix` match, normalised (trailing slashes dropped, `/` kept).
    pub fn prefix(path: &str) -> PathMatch {
        PathMatch::Prefix(normalize_prefix(path).into())
    }

    /// An `ImplementationSpecific` match, normalised like a prefix.
    pub fn implementation_specific(path: &str) -> PathMatch {
        PathMatch::ImplementationSpecific(normalize_prefix(path).into())
    }

    /// An `Exact` match.
    pub fn exact(path: &str) -> PathMatch {
        PathMatch::Exact(path.into())
    }

    /// Whether the request path (without query) matches.
    pub fn matches(&self, path: &str) -> bool {
        match self {
            PathMatch::Exact(p) => path == &**p,
            PathMatch::Prefix(p) | PathMatch::ImplementationSpecific(p) => prefix_matches(p, path),
            PathMatch::Regex(r) => r.0.regex.is_match(path),
        }
    }

    /// Exact first, then Prefix, longer first; regex paths (alone on their host) as ingress-nginx
    /// orders locations: longer first, then the greater path (byte order) first.
    fn precedence(&self, other: &PathMatch) -> Ordering {
        let rank = |m: &PathMatch| match m {
            PathMatch::Exact(p) => (0, usize::MAX - p.len()),
            PathMatch::Prefix(p) | PathMatch::ImplementationSpecific(p) => {
                (1, usize::MAX - p.len())
            }
            PathMatch::Regex(r) => (2, usize::MAX - r.pattern().len()),
        };
        rank(self)
            .cmp(&rank(other))
            .then_with(|| match (self, other) {
                (PathMatch::Regex(a), PathMatch::Regex(b)) => b.pattern().cmp(a.pattern()),
                _ => Ordering::Equal,
            })
    }

    /// The path string of the rule.
    pub fn path(&self) -> &str {
        match self {
            PathMatch::Exact(p) | PathMatch::Prefix(p) | PathMatch::ImplementationSpecific(p) => p,
            PathMatch::Regex(r) => r.pattern(),
        }
    }

    /// The literal path of an `Exact` or prefix match (`None` for a regex): what a Gateway API
    /// `ReplacePrefixMatch` replaces.
    pub fn literal(&self) -> Option<&str> {
        match self {
            PathMatch::Regex(_) => None,
            other => Some(other.path()),
        }
    }
}

fn normalize_prefix(path: &str) -> &str {
    let trimmed = path.trim_end_matches('/');
    if trimmed.is_empty() {
        "/"
    } else {
        trimmed
    }
}

/// Element-wise prefix match of a normalised prefix (no trailing slash unless it is `/`).
fn prefix_matches(prefix: &str, path: &str) -> bool {
    if prefix == "/" {
        return true;
    }
    match path.strip_prefix(prefix) {
        Some(rest) => rest.is_empty() || rest.starts_with('/'),
        None => false,
    }
}

/// One path rule under a host, with where it sends the request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PathRule {
    /// The path match.
    #[serde(rename = "match")]
    pub matcher: PathMatch,
    /// Conditions beyond the path (Gateway API method, header and query matches), if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub when: Option<Arc<crate::request_match::RequestMatch>>,
    /// The route's destination.
    #[serde(flatten)]
    pub action: RouteAction,
}

impl PathRule {
    /// A rule without conditions beyond the path.
    pub fn new(matcher: PathMatch, action: RouteAction) -> PathRule {
        PathRule {
            matcher,
            when: None,
            action,
        }
    }

    /// Precedence: Exact before Prefix, longer before shorter, then the conditions (a method,
    /// more headers, more query parameters: [`crate::request_match::precedence`]), then the
    /// older Ingress or route (then namespace/name). `Less` means "wins".
    pub fn precedence(&self, other: &PathRule) -> Ordering {
        self.matcher
            .precedence(&other.matcher)
            .then_with(|| {
                crate::request_match::precedence(self.when.as_deref(), other.when.as_deref())
            })
            .then_with(|| self.action.origin.age_cmp(&other.action.origin))
    }

    /// Whether two rules claim the same requests (same match kind and path); the first in
    /// precedence wins and the other is a conflict.
    pub fn same_match(&self, other: &PathRule) -> bool {
        let kind = |m: &PathMatch| match m {
            PathMatch::Exact(_) => 0,
            PathMatch::Prefix(_) | PathMatch::ImplementationSpecific(_) => 1,
            PathMatch::Regex(_) => 2,
        };
        kind(&self.matcher) == kind(&other.matcher)
            && self.matcher.path() == other.matcher.path()
            && self.when == other.when
    }
}

/// The rules of one host (or of the host-less rules), sorted by precedence. Cloning shares the
/// rules: a rebuilt table keeps the entries of hosts that did not change as the same objects
/// ([`HostRules::same`]), so what the dataplane derives from a rule (metric handles, upstream TLS
/// configurations, keyed by the rule's address) carries over.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct HostRules {
    /// The host as the Ingress wrote it (`foo.example.com`, `*.example.com`), empty for the
    /// host-less rules.
    pub host: Arc<str>,
    /// Sorted: the first rule that matches wins.
    pub rules: Arc<[PathRule]>,
}

impl HostRules {
    /// Builds a host's rules: sorts by precedence and drops rules shadowed by an identical match
    /// of higher precedence, returning those as conflicts.
    pub fn new(host: &str, mut rules: Vec<PathRule>) -> (HostRules, Vec<PathRule>) {
        rules.sort_by(PathRule::precedence);
        let mut kept: Vec<PathRule> = Vec::with_capacity(rules.len());
        let mut conflicts = Vec::new();
        for rule in rules {
            if kept.last().is_some_and(|k| k.same_match(&rule)) {
                conflicts.push(rule);
            } else {
                kept.push(rule);
            }
        }
        (
            HostRules {
                host: host.into(),
                rules: kept.into(),
            },
            conflicts,
        )
    }

    /// Whether both are the same entry: their rules are the same objects (a clone, or an entry
    /// a rebuild reused), not only equal.
    pub fn same(&self, other: &HostRules) -> bool {
        Arc::ptr_eq(&self.rules, &other.rules) && self.host == other.host
    }

    /// The first rule matching the request's path and conditions.
    pub fn find(&self, req: &crate::request_match::RequestView<'_>) -> Option<&PathRule> {
        self.rules
            .iter()
            .find(|r| r.matcher.matches(req.path) && r.when.as_ref().is_none_or(|w| w.matches(req)))
    }
}

/// Hosts and their path rules, plus the default backend.
///
/// Matching: the Host header (port removed, case-insensitive, a trailing dot ignored) selects the
/// most specific host entry: an exact host, else a `*.suffix` wildcard covering exactly one DNS
/// label, else the host-less rules. The first path rule of that entry that matches wins; when none
/// does, the default backend (the oldest Ingress `defaultBackend`) serves; else nothing matches.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RouteTable {
    /// Exact hosts, lower case.
    pub exact: HashMap<Box<str>, HostRules>,
    /// Wildcard hosts keyed by the suffix after `*.` (`*.example.com` is `example.com`).
    pub wildcard: HashMap<Box<str>, HostRules>,
    /// Rules with no host: they apply to hosts without an entry of their own.
    pub any_host: HostRules,
    /// The fallback when no rule matched.
    pub default_backend: Option<RouteAction>,
    /// Hosts whose HTTPS connections are relayed unterminated (ingress-nginx's
    /// `ssl-passthrough`), by exact name.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub passthrough: passthrough::PassthroughHosts,
}

/// What a lookup matched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Matched<'a> {
    /// The destination.
    pub action: &'a RouteAction,
    /// The host entry that matched (`*.example.com` for a wildcard, `None` for host-less rules and
    /// the default backend): a bounded label, never raw client input.
    pub host: Option<&'a str>,
    /// The path match that matched (`None` for the default backend).
    pub matcher: Option<&'a PathMatch>,
}

impl RouteTable {
    /// Finds the route for a request. `host` is the Host header or `:authority` as received (a
    /// port and a trailing dot are ignored; case-insensitive); `path` excludes the query.
    /// Allocates nothing for hosts of up to 255 bytes.
    pub fn find<'a>(&'a self, host: &str, path: &str) -> Option<Matched<'a>> {
        self.find_request(host, &crate::request_match::RequestView::path(path))
    }

    /// Like [`RouteTable::find`], for a request whose method, headers and query the rules'
    /// conditions may look at.
    pub fn find_request<'a>(
        &'a self,
        host: &str,
        req: &crate::request_match::RequestView<'_>,
    ) -> Option<Matched<'a>> {
        let mut buf = [0u8; crate::host::MAX_NAME];
        let rules = crate::host::normalize_name(strip_port(host), &mut buf)
            .and_then(|name| crate::host::lookup(&self.exact, &self.wildcard, name));
        self.within(rules.unwrap_or(&self.any_host), req)
    }

    fn within<'a>(
        &'a self,
        rules: &'a HostRules,
        req: &crate::request_match::RequestView<'_>,
    ) -> Option<Matched<'a>> {
        match rules.find(req) {
            Some(rule) => Some(Matched {
                action: &rule.action,
                host: (!rules.host.is_empty()).then_some(&*rules.host),
                matcher: Some(&rule.matcher),
            }),
            None => self.default_backend.as_ref().map(|action| Matched {
                action,
                host: None,
                matcher: None,
            }),
        }
    }

    /// Every action of the table with its host entry as written (empty for the host-less rules
    /// and the default backend).
    pub fn actions(&self) -> impl Iterator<Item = (&str, &RouteAction)> {
        self.exact
            .values()
            .chain(self.wildcard.values())
            .chain(std::iter::once(&self.any_host))
            .flat_map(|h| h.rules.iter().map(move |r| (&*h.host, &r.action)))
            .chain(self.default_backend.iter().map(|a| ("", a)))
    }

    /// Every backend id the table refers to, the alternatives of per-request choices included.
    pub fn backend_ids(&self) -> impl Iterator<Item = &BackendId> {
        self.actions().flat_map(|(_, action)| action.backend_ids())
    }
}

pub use crate::host::strip_port;

/// One certificate chain with its signing key, ready for rustls, and where it came from.
#[derive(Clone, Debug)]
pub struct TlsCert {
    /// The Secret it was loaded from (`namespace/name`), for logs and `/debug/routes`.
    pub source: Arc<str>,
    /// The chain and key as rustls serves them.
    pub key: Arc<rustls::sign::CertifiedKey>,
}

impl PartialEq for TlsCert {
    /// Same Secret and same chain (the key is checked against the leaf when loading).
    fn eq(&self, other: &TlsCert) -> bool {
        self.source == other.source && self.key.cert == other.key.cert
    }
}

impl Eq for TlsCert {}

/// Certificates by SNI: exact host names, then `*.` wildcards (one label), then the default
/// certificate. Names are lower case without a trailing dot.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CertTable {
    exact: HashMap<Box<str>, Arc<TlsCert>>,
    /// Keyed by the suffix after `*.` (`example.com` for `*.example.com`).
    wildcard: HashMap<Box<str>, Arc<TlsCert>>,
    default: Option<Arc<TlsCert>>,
}

impl CertTable {
    /// Adds a certificate for a host (`foo.example.com` or `*.example.com`). The first one added
    /// for a host wins; returns `false` when the host already had one.
    pub fn insert(&mut self, host: &str, cert: Arc<TlsCert>) -> bool {
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        let (map, key) = self.map_mut(&host);
        match map.entry(key.into()) {
            std::collections::hash_map::Entry::Occupied(_) => false,
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(cert);
                true
            }
        }
    }

    /// The certificate of one host entry as [`insert`](Self::insert) keys it (`foo.example.com`
    /// or `*.example.com`, lower case): that entry alone, no wildcard or default fallback.
    pub fn host(&self, host: &str) -> Option<&Arc<TlsCert>> {
        match host.strip_prefix("*.") {
            Some(suffix) => self.wildcard.get(suffix),
            None => self.exact.get(host),
        }
    }

    /// Where the entry of `host` (normalised as [`insert`](Self::insert) keys it) is kept: a
    /// `*.` wildcard in the wildcard map under its suffix, any other host in the exact map.
    fn map_mut<'h>(&mut self, host: &'h str) -> (&mut HashMap<Box<str>, Arc<TlsCert>>, &'h str) {
        match host.strip_prefix("*.") {
            Some(suffix) => (&mut self.wildcard, suffix),
            None => (&mut self.exact, host),
        }
    }

    /// Sets (`Some`) or removes (`None`) the entry of one host, written as for
    /// [`host`](Self::host): an Ingress change rebuilds the certificates of its hosts only.
    pub fn set_host(&mut self, host: &str, cert: Option<Arc<TlsCert>>) {
        let (map, key) = self.map_mut(host);
        match cert {
            Some(cert) => {
                map.insert(key.into(), cert);
            }
            None => {
                map.remove(key);
            }
        }
    }

    /// Takes the host entries of `other` that this table lacks (as [`insert`](Self::insert):
    /// the entries already here win); `other`'s default certificate is not taken. For a table
    /// built in parts over disjoint hosts.
    pub fn absorb(&mut self, other: CertTable) {
        for (host, cert) in other.exact {
            self.exact.entry(host).or_insert(cert);
        }
        for (suffix, cert) in other.wildcard {
            self.wildcard.entry(suffix).or_insert(cert);
        }
    }

    /// Sets the certificate for clients whose SNI matches nothing (or who send none).
    pub fn set_default(&mut self, cert: Arc<TlsCert>) {
        self.default = Some(cert);
    }

    /// The default certificate, if one is configured.
    pub fn default_cert(&self) -> Option<&Arc<TlsCert>> {
        self.default.as_ref()
    }

    /// The certificate for a TLS client: the exact SNI name, then the wildcard covering its first
    /// label ([`crate::host::lookup`], as routes match), then the default. `None` SNI (an IP-literal client) gets the default.
    pub fn find(&self, sni: Option<&str>) -> Option<&Arc<TlsCert>> {
        let mut buf = [0u8; crate::host::MAX_NAME];
        sni.and_then(|name| crate::host::normalize_name(name, &mut buf))
            .and_then(|name| crate::host::lookup(&self.exact, &self.wildcard, name))
            .or(self.default.as_ref())
    }

    /// Every certificate of the table (one per host entry, plus the default).
    pub fn certs(&self) -> impl Iterator<Item = &Arc<TlsCert>> {
        self.exact
            .values()
            .chain(self.wildcard.values())
            .chain(self.default.iter())
    }

    /// Whether the table has no certificate at all.
    pub fn is_empty(&self) -> bool {
        self.exact.is_empty() && self.wildcard.is_empty() && self.default.is_none()
    }
}

impl Serialize for CertTable {
    /// Host -> Secret, sorted, plus the default's Secret; never key material.
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let hosts: std::collections::BTreeMap<String, &str> = self
            .exact
            .iter()
            .map(|(h, c)| (h.to_string(), &*c.source))
            .chain(
                self.wildcard
                    .iter()
                    .map(|(h, c)| (format!("*.{h}"), &*c.source)),
            )
            .collect();
        let mut st = s.serialize_struct("CertTable", 2)?;
        st.serialize_field("hosts", &hosts)?;
        st.serialize_field("default", &self.default.as_ref().map(|c| &*c.source))?;
        st.end()
    }
}

/// Everything the dataplane needs, immutable and published whole.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Snapshot {
    /// Increases by one with each published snapshot.
    pub version: u64,
    /// Hosts and paths; shared between snapshots when only endpoints changed.
    pub routes: Arc<RouteTable>,
    /// Backends by id; an endpoint-only change replaces one entry.
    #[serde(serialize_with = "sorted_backends")]
    pub backends: BackendMap<Arc<Backend>>,
    /// Certificates.
    pub certs: Arc<CertTable>,
    /// Gateway API listeners by pod port ([`gateway`]).
    pub gateways: Arc<gateway::GatewayTable>,
}

fn sorted_backends<S: Serializer>(
    backends: &BackendMap<Arc<Backend>>,
    s: S,
) -> Result<S::Ok, S::Error> {
    let sorted: std::collections::BTreeMap<&BackendId, &Arc<Backend>> = backends.iter().collect();
    sorted.serialize(s)
}

impl Snapshot {
    /// The backend of a route, if it exists.
    pub fn backend(&self, id: &BackendId) -> Option<&Arc<Backend>> {
        self.backends.get(id)
    }
}

impl RouteAction {
    /// The route's backend and those of its per-request choice's alternatives and mirrors.
    pub fn backend_ids(&self) -> impl Iterator<Item = &BackendId> {
        let alternatives = self.choice.iter().flat_map(|c| &c.alternatives);
        let mirrors = self.choice.iter().flat_map(|c| &c.mirrors);
        std::iter::once(&self.backend)
            .chain(alternatives.map(|alt| &alt.backend))
            .chain(mirrors.map(|m| &m.backend))
    }
}

impl RouteAction {
    /// A plain route to `backend` (an id as written) declared by the Ingress `ns/ing`, for the
    /// tests of every module and the metrics specimen.
    pub(crate) fn to(backend: &str) -> RouteAction {
        RouteAction {
            backend: backend.parse().unwrap_or_else(|never| match never {}),
            policy: FamilyPolicy::default(),
            origin: Origin {
                kind: OriginKind::Ingress,
                namespace: "ns".into(),
                name: "ing".into(),
                created: 0,
            }
            .into(),
            redirect_https: false,
            max_body_bytes: 0,
            upstream_tls: None,
            timeouts: RouteTimeouts::default(),
            protocol: None,
            redirect: None,
            source_ranges: None,
            rewrite: None,
            access: None,
            choice: None,
            filters: None,
            client_auth: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn origin(name: &str, created: i64) -> Origin {
        Origin {
            kind: OriginKind::Ingress,
            namespace: "default".into(),
            name: name.into(),
            created,
        }
    }

    #[test]
    fn a_pod_target_is_one_block_of_120_bytes() {
        // A pod uid is kept in the target itself: no allocation per target for its id.
        let uid = "0f8fad5b-d9cb-469f-a165-70867728950e";
        let target = Target {
            id: TargetId(uid.into()),
            v4: Some("10.0.0.1:80".parse().unwrap()),
            v6: Some("[2001:db8::1]:80".parse().unwrap()),
            zone: None,
        };
        assert!(target.id.0.is_inline());
        assert_eq!(target.id.to_string(), uid);
        assert_eq!(
            serde_json::to_value(&target).unwrap()["id"],
            serde_json::json!(uid)
        );
        let size = std::mem::size_of::<Target>();
        assert!(size <= 120, "{size} bytes");
    }

    #[test]
    fn a_target_keeps_each_family_compactly_and_reads_as_socket_addresses() {
        let uid = "0f8fad5b-d9cb-469f-a165-70867728950e";
        let v4: SocketAddr = "10.0.0.1:8080".parse().unwrap();
        let v6: SocketAddr = "[2001:db8::1]:443".parse().unwrap();
        let mut target = Target::new(TargetId(uid.into()));
        assert!(!target.has_addr());
        assert!(target.add_addr(v6));
        assert!(target.add_addr(v4));
        // The first address of a family wins.
        assert!(!target.add_addr("10.0.0.2:80".parse().unwrap()));
        assert!(!target.add_addr("[2001:db8::2]:80".parse().unwrap()));
        assert_eq!(target.addr(Family::V4), Some(v4));
        assert_eq!(target.addr(Family::V6), Some(v6));
        assert_eq!(
            target,
            Target::with_addrs(TargetId(uid.into()), [v4, v6], None)
        );
        // The JSON of `/debug/routes` is the socket addresses' text, as when they were kept whole.
        assert_eq!(
            serde_json::to_value(&target).unwrap(),
            serde_json::json!({"id": uid, "v4": "10.0.0.1:8080", "v6": "[2001:db8::1]:443"})
        );
        let only6 = Target::with_addrs(TargetId("b".into()), [v6], Some("z-1".into()));
        assert_eq!(only6.addr(Family::V4), None);
        assert_eq!(
            serde_json::to_value(&only6).unwrap(),
            serde_json::json!({"id": "b", "v4": null, "v6": "[2001:db8::1]:443", "zone": "z-1"})
        );
        // Parsed and printed as the socket address; a scope id is refused, not dropped.
        let parsed: TargetV6 = "[fd00::7]:80".parse().unwrap();
        assert_eq!(parsed.to_string(), "[fd00::7]:80");
        assert_eq!(format!("{parsed:?}"), "[fd00::7]:80");
        assert_eq!(
            (parsed.ip(), parsed.port()),
            ("fd00::7".parse().unwrap(), 80)
        );
        assert!("[fe80::1%2]:80".parse::<TargetV6>().is_err());
        assert!("10.0.0.1:80".parse::<TargetV6>().is_err());
        assert!("[fd00::7]".parse::<TargetV6>().is_err());
        let size = std::mem::size_of::<Target>();
        assert!(size <= 88, "{size} bytes");
    }

    fn rule(m: PathMatch, backend: &str, created: i64) -> PathRule {
        PathRule {
            matcher: m,
            when: None,
            action: RouteAction {
                origin: origin(backend, created).into(),
                ..RouteAction::to(backend)
            },
        }
    }

    #[test]
    fn prefix_is_element_wise() {
        let m = PathMatch::prefix("/foo/");
        assert!(m.matches("/foo"));
        assert!(m.matches("/foo/"));
        assert!(m.matches("/foo/bar"));
        assert!(!m.matches("/foobar"));
        assert!(!m.matches("/"));
        assert!(PathMatch::prefix("/").matches("/anything"));
        let e = PathMatch::exact("/foo");
        assert!(e.matches("/foo"));
        assert!(!e.matches("/foo/"));
    }

    fn regex(pattern: &str) -> PathMatch {
        PathMatch::Regex(RegexPath::new(pattern).unwrap())
    }

    #[test]
    fn regex_paths_are_case_insensitive_prefixes_anchored_at_the_start() {
        let m = regex("/api/v[0-9]+");
        assert!(m.matches("/api/v2"));
        assert!(m.matches("/API/V2/items"));
        assert!(m.matches("/api/v10x"));
        assert!(!m.matches("/x/api/v2"));
        // A plain path turned regex: `/foo` also matches `/foobar`, in any case.
        assert!(regex("/foo").matches("/FooBar"));
        // Lookaround is PCRE, not Rust's regex: it does not compile.
        assert!(RegexPath::new("/(?!admin)").is_err());
    }

    #[test]
    fn regex_rules_order_as_ingress_nginx_locations() {
        // ingress-nginx sorts locations by path (descending), then stably by length
        // (descending): the longest path first, among equal lengths the greater one.
        let rules = vec![
            rule(regex("/"), "root", 0),
            rule(regex("/a.c"), "dot", 0),
            rule(regex("/abc"), "abc", 0),
            rule(regex("/ab"), "ab", 0),
            rule(regex("/abcd/"), "long", 0),
        ];
        let (host, _) = HostRules::new("h", rules);
        let order: Vec<&str> = host.rules.iter().map(|r| r.matcher.path()).collect();
        assert_eq!(order, ["/abcd/", "/abc", "/a.c", "/ab", "/"]);
        let hit = |p: &str| {
            host.find(&crate::request_match::RequestView::path(p))
                .map(|r| r.action.backend.to_string())
        };
        assert_eq!(hit("/ABCD/x").as_deref(), Some("long"));
        assert_eq!(hit("/abcd").as_deref(), Some("abc"));
        // `/abc` sorts before `/a.c` (both match `/abc`); `/axc` is only `/a.c`'s.
        assert_eq!(hit("/axc").as_deref(), Some("dot"));
        assert_eq!(hit("/abx").as_deref(), Some("ab"));
        assert_eq!(hit("/zzz").as_deref(), Some("root"));
    }

    #[test]
    fn rewrite_substitutes_captures_and_keeps_the_query() {
        let rewrite = |target: &str| Rewrite {
            target: target.into(),
            forwarded_prefix: None,
        };
        let m = regex("/something(/|$)(.*)");
        let target = |r: Rewritten| match r {
            Rewritten::Target(t) => t,
            Rewritten::Redirect(l) => panic!("redirect to {l}"),
        };
        assert_eq!(
            target(rewrite("/$2").apply(&m, "/something/a/b", Some("x=1"))),
            "/a/b?x=1"
        );
        assert_eq!(target(rewrite("/$2").apply(&m, "/something", None)), "/");
        assert_eq!(
            target(rewrite("/new/$2$1").apply(&m, "/SOMETHING/a", None)),
            "/new/a/"
        );
        // `$21` is group 2 then `1`; a group that did not take part is empty; no group: `/`.
        assert_eq!(
            target(rewrite("/$21$9").apply(&m, "/something/z", None)),
            "/z1"
        );
        assert_eq!(
            target(rewrite("/").apply(&regex("/api"), "/api/x", None)),
            "/"
        );
        // A target without a leading slash still makes an origin-form path.
        assert_eq!(target(rewrite("$2").apply(&m, "/something/q", None)), "/q");
        assert_eq!(
            rewrite("https://new.example.com/$2").apply(&m, "/something/p", Some("a=b")),
            Rewritten::Redirect("https://new.example.com/p?a=b".into())
        );
    }

    #[test]
    fn host_entry_precedence_and_wildcards() {
        let mut t = RouteTable::default();
        t.exact.insert(
            "foo.bar.com".into(),
            HostRules::new(
                "foo.bar.com",
                vec![rule(PathMatch::prefix("/"), "exact", 0)],
            )
            .0,
        );
        t.wildcard.insert(
            "foo.com".into(),
            HostRules::new("*.foo.com", vec![rule(PathMatch::prefix("/"), "wild", 0)]).0,
        );
        let get = |h: &str| t.find(h, "/x").map(|m| m.action.backend.to_string());
        assert_eq!(get("Foo.Bar.com:8080").as_deref(), Some("exact"));
        assert_eq!(get("foo.bar.com.").as_deref(), Some("exact"));
        assert_eq!(get("bar.foo.com").as_deref(), Some("wild"));
        assert_eq!(get("baz.bar.foo.com"), None);
        assert_eq!(get("foo.com"), None);
        assert_eq!(get("subdomain.bar.com"), None);
    }

    #[test]
    fn strip_port_keeps_ipv6_brackets() {
        assert_eq!(strip_port("[2001:db8::1]:8080"), "[2001:db8::1]");
        assert_eq!(strip_port("[::1]"), "[::1]");
        assert_eq!(strip_port("example.com:80"), "example.com");
        assert_eq!(strip_port("example.com"), "example.com");
        assert_eq!(strip_port("192.0.2.1:80"), "192.0.2.1");
    }

    #[test]
    fn family_policy_order() {
        use Family::*;
        assert_eq!(
            FamilyPolicy::PreferSameFamily.order(V6),
            [Some(V6), Some(V4)]
        );
        assert_eq!(FamilyPolicy::RequireSameFamily.order(V4), [Some(V4), None]);
        assert_eq!(FamilyPolicy::PreferIpv6.order(V4), [Some(V6), Some(V4)]);
        assert_eq!(
            "PreferIPv4".parse::<FamilyPolicy>().unwrap(),
            FamilyPolicy::PreferIpv4
        );
        assert!("preferipv4".parse::<FamilyPolicy>().is_err());
    }

    #[test]
    fn mapped_addresses_are_ipv4() {
        let a: SocketAddr = "[::ffff:192.0.2.7]:4711".parse().unwrap();
        assert_eq!(Family::of(&a), Family::V4);
        assert_eq!(normalize_addr(a).to_string(), "192.0.2.7:4711");
    }
}
