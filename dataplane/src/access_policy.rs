//! Plain data of a route's access policies, a leaf of the snapshot contract (no I/O): ingress-nginx's
//! rate limits, basic auth (htpasswd users) and external auth, as the controller translates them.
//! The checking, and its runtime state, is in [`crate::policy::access`]; `table` names these
//! types without importing the policies.

use std::net::IpAddr;
use std::sync::Arc;

use serde::{Serialize, Serializer};

use crate::cidr::Cidr;

/// What a route checks before proxying (ingress-nginx's `limit-*` and `auth-*` annotations).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Access {
    /// Per-client limits; over them, 503.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<RateLimit>,
    /// htpasswd users; a request without valid credentials gets 401.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub basic_auth: Option<BasicAuth>,
    /// An auth service asked about every request.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub external_auth: Option<ExternalAuth>,
}

/// The limits of a route.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RateLimit {
    /// Requests per second per client (`limit-rps`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rps: Option<u32>,
    /// Requests per minute per client (`limit-rpm`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rpm: Option<u32>,
    /// Requests in progress per client (`limit-connections`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub connections: Option<u32>,
    /// `burst = limit × burst_multiplier` (`limit-burst-multiplier`, default 5).
    pub burst_multiplier: u32,
    /// Clients never limited (`limit-allowlist`, alias `limit-whitelist`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub allow: Vec<Cidr>,
    /// The prefix length an IPv6 client is keyed by (64 unless set; 128 is ingress-nginx's).
    pub ipv6_prefix: u8,
    /// A value did not parse: the route answers 503 to everyone (fail closed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<Arc<str>>,
}

impl Default for RateLimit {
    fn default() -> RateLimit {
        RateLimit {
            rps: None,
            rpm: None,
            connections: None,
            burst_multiplier: 5,
            allow: Vec::new(),
            ipv6_prefix: 64,
            error: None,
        }
    }
}

/// Basic authentication of a route.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct BasicAuth {
    /// The realm sent in `WWW-Authenticate: Basic realm="…"` (`auth-realm`; empty by default).
    pub realm: Arc<str>,
    /// The users and their hashes, in file order (the first line of a user wins, as in nginx).
    pub users: Arc<[Credential]>,
    /// Why the route admits nobody (a missing Secret, a Secret without `auth`): every request
    /// gets 503, as ingress-nginx denies the location.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<Arc<str>>,
}

/// One htpasswd line: a user and the hash of their password.
#[derive(Clone, PartialEq, Eq)]
pub struct Credential {
    /// The user name.
    pub user: Arc<str>,
    /// The hash as written.
    pub hash: Arc<str>,
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:<{}>", self.user, scheme(&self.hash))
    }
}

impl Serialize for Credential {
    /// The user and the hash's scheme; never the hash.
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&format_args!("{}:{}", self.user, scheme(&self.hash)))
    }
}

/// The name of a hash's scheme: `bcrypt`, `apr1`, `md5-crypt`, `sha1`, `ssha`, `plain` or
/// `unsupported`.
pub fn scheme(hash: &str) -> &'static str {
    match hash {
        h if ["$2a$", "$2b$", "$2y$", "$2x$"]
            .iter()
            .any(|p| h.starts_with(p)) =>
        {
            "bcrypt"
        }
        h if h.starts_with("$apr1$") => "apr1",
        h if h.starts_with("$1$") => "md5-crypt",
        h if h.starts_with("{SHA}") => "sha1",
        h if h.starts_with("{SSHA}") => "ssha",
        h if h.starts_with("{PLAIN}") => "plain",
        _ => "unsupported",
    }
}

/// External authentication of a route.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ExternalAuth {
    /// The auth URL as written (`auth-url`), variables unexpanded.
    pub url: Arc<str>,
    /// The method of the auth request (`auth-method`); GET when unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub method: Option<Arc<str>>,
    /// Where a 401 redirects (`auth-signin`), variables unexpanded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signin: Option<Arc<str>>,
    /// The query parameter carrying the original URL (`auth-signin-redirect-param`, `rd`).
    pub redirect_param: Arc<str>,
    /// Headers of the auth response copied onto the upstream request (`auth-response-headers`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub response_headers: Vec<Arc<str>>,
    /// `X-Auth-Request-Redirect` sent to the auth URL (`auth-request-redirect`); the request URI
    /// when unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_redirect: Option<Arc<str>>,
    /// Why the route admits nobody (the URL does not parse): 503, as ingress-nginx denies the
    /// location.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<Arc<str>>,
}

impl ExternalAuth {
    /// Settings for an auth URL, everything else at ingress-nginx's defaults.
    pub fn new(url: &str) -> ExternalAuth {
        ExternalAuth {
            url: url.into(),
            method: None,
            signin: None,
            redirect_param: "rd".into(),
            response_headers: Vec::new(),
            request_redirect: None,
            error: None,
        }
    }
}

/// The addresses auth requests (`auth-url`) may reach, checked on every resolved address at
/// connect time (`--auth-allowed-destinations`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum AuthDestinations {
    /// Every address but loopback (`127.0.0.0/8`, `::1`), link-local (`169.254.0.0/16`,
    /// `fe80::/10`) and unspecified ones (`0.0.0.0/8`, `::`), IPv4-mapped forms included.
    #[default]
    Default,
    /// Only the addresses of these networks.
    Only(Vec<Cidr>),
}

impl AuthDestinations {
    /// The destinations a list of networks allows: the default when it is empty.
    pub fn from_list(networks: Vec<Cidr>) -> AuthDestinations {
        if networks.is_empty() {
            AuthDestinations::Default
        } else {
            AuthDestinations::Only(networks)
        }
    }

    /// Whether an auth request may connect to `ip` (IPv4-mapped IPv6 addresses count as IPv4).
    pub fn allows(&self, ip: IpAddr) -> bool {
        match self {
            AuthDestinations::Default => !refused_by_default(ip),
            AuthDestinations::Only(networks) => networks.iter().any(|n| n.contains(ip)),
        }
    }
}

/// Loopback, link-local or unspecified (`0.0.0.0/8`, which Linux connects to loopback, and `::`).
pub fn refused_by_default(ip: IpAddr) -> bool {
    match ip.to_canonical() {
        IpAddr::V4(a) => a.is_loopback() || a.is_link_local() || a.octets()[0] == 0,
        IpAddr::V6(a) => {
            a.is_loopback() || a.is_unspecified() || (a.segments()[0] & 0xffc0) == 0xfe80
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auth_destinations_refuse_loopback_link_local_and_unspecified_of_both_families() {
        let default = AuthDestinations::default();
        for refused in [
            "127.0.0.1",
            "127.9.9.9",
            "::1",
            "169.254.169.254",
            "fe80::1",
            "febf::1",
            "0.0.0.0",
            "::",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "::ffff:0.0.0.0",
        ] {
            assert!(!default.allows(refused.parse().unwrap()), "{refused}");
        }
        for allowed in ["10.0.0.1", "192.0.2.1", "fd00::1", "2001:db8::1", "fec0::1"] {
            assert!(default.allows(allowed.parse().unwrap()), "{allowed}");
        }
        let only = AuthDestinations::from_list(vec!["127.0.0.0/8".parse().unwrap()]);
        assert!(only.allows("::ffff:127.0.0.1".parse().unwrap()));
        assert!(!only.allows("10.0.0.1".parse().unwrap()));
        assert!(!only.allows("::1".parse().unwrap()));
        assert_eq!(AuthDestinations::from_list(Vec::new()), default);
    }
}
