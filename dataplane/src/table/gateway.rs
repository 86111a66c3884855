//! Gateway API listeners as plain snapshot data: for each pod port duet binds for Gateways, the
//! listeners bound there and each listener's own routes, plus the lookup a request on that port
//! goes through. No I/O here (the sockets are `gateway_listen`'s).
//!
//! Listener isolation: a request is matched against the most specific listener of its port whose
//! hostname matches the Host (an exact hostname, then `*.` wildcards longest first, then a
//! listener without hostname), and only against that listener's routes. Within a listener, rules
//! are tried host entry by host entry in the spec's precedence (the exact host, then wildcard
//! hosts longest first, then rules of routes without hostnames), each entry's rules in the order
//! translation sorted them; the first rule that matches wins. Gateway API wildcards (`*.x.com`)
//! match one label or more, unlike Ingress wildcards.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use serde::{Serialize, Serializer};

use super::{strip_port, Matched, PathMatch, RouteAction, TlsCert};

/// Every Gateway pod port duet serves, by port.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct GatewayTable {
    /// The listeners of each pod port.
    pub ports: BTreeMap<u16, Arc<GatewayPort>>,
}

impl GatewayTable {
    /// The listeners bound on a pod port.
    pub fn port(&self, port: u16) -> Option<&Arc<GatewayPort>> {
        self.ports.get(&port)
    }

    /// Every action of every listener (for the backends the table uses).
    pub fn actions(&self) -> impl Iterator<Item = &RouteAction> {
        self.ports
            .values()
            .flat_map(|p| &p.listeners)
            .flat_map(|l| l.routes.rules())
            .map(|r| &r.action)
    }
}

/// The listeners sharing one pod port (one protocol: the Gateway refuses mixes).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct GatewayPort {
    /// TLS is terminated on this port (HTTPS listeners).
    pub tls: bool,
    /// The listeners, most specific hostname first (see the module documentation).
    pub listeners: Vec<GatewayListener>,
}

impl GatewayPort {
    /// The listener a Host (or SNI) selects: the most specific whose hostname matches.
    pub fn listener(&self, host: &str) -> Option<&GatewayListener> {
        let mut buf = [0u8; crate::host::MAX_NAME];
        let host = crate::host::normalize_name(strip_port(host), &mut buf)?;
        self.listener_of(host)
    }

    /// The listener of a normalised host.
    fn listener_of(&self, host: &str) -> Option<&GatewayListener> {
        self.listeners
            .iter()
            .find(|l| l.hostname.as_deref().is_none_or(|h| host_matches(h, host)))
    }

    /// Sorts listeners by specificity: exact hostnames, then wildcards longest first, then none.
    pub fn sort(&mut self) {
        self.listeners
            .sort_by_key(|l| specificity(l.hostname.as_deref()));
    }

    /// Finds the route of a request on this port (`host` as received, `path` without query).
    /// Allocates nothing for hosts of up to 255 bytes.
    pub fn find<'a>(&'a self, host: &str, path: &str) -> Option<Matched<'a>> {
        let mut buf = [0u8; crate::host::MAX_NAME];
        let host = crate::host::normalize_name(strip_port(host), &mut buf)?;
        self.listener_of(host)?.routes.find(host, path)
    }
}

/// The sort key of a hostname: exact (0) before wildcard (1, longer first) before none (2).
fn specificity(hostname: Option<&str>) -> (u8, usize) {
    match hostname {
        Some(h) if h.starts_with("*.") => (1, usize::MAX - h.len()),
        Some(_) => (0, 0),
        None => (2, 0),
    }
}

/// Whether a Gateway API hostname (`a.example.com` or `*.example.com`, lower case) matches a
/// request host: a wildcard covers one label or more.
pub fn host_matches(pattern: &str, host: &str) -> bool {
    match pattern.strip_prefix('*') {
        Some(suffix) => host.len() > suffix.len() && host.ends_with(suffix),
        None => pattern == host,
    }
}

/// One listener of a Gateway.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct GatewayListener {
    /// `namespace/gateway/listener`, for logs and `/debug/routes`.
    pub name: Arc<str>,
    /// The listener's hostname, lower case; `None` matches every host.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hostname: Option<Box<str>>,
    /// The certificate of an HTTPS listener (its first `certificateRef`).
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "cert_source"
    )]
    pub cert: Option<Arc<TlsCert>>,
    /// The routes attached to the listener.
    pub routes: ListenerRoutes,
}

fn cert_source<S: Serializer>(cert: &Option<Arc<TlsCert>>, s: S) -> Result<S::Ok, S::Error> {
    match cert {
        Some(c) => s.serialize_str(&c.source),
        None => s.serialize_none(),
    }
}

/// The rules attached to one listener, by route hostname.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ListenerRoutes {
    /// Rules of exact hostnames (lower case).
    pub exact: HashMap<Box<str>, Vec<GatewayRule>>,
    /// Rules of wildcard hostnames (`*.example.com`), longest first.
    pub wildcard: Vec<(Box<str>, Vec<GatewayRule>)>,
    /// Rules of routes whose hostnames are the listener's (none given).
    pub any_host: Vec<GatewayRule>,
}

impl ListenerRoutes {
    /// The first matching rule of the most specific host entries (see the module documentation).
    pub fn find<'a>(&'a self, host: &str, path: &str) -> Option<Matched<'a>> {
        let exact = self.exact.get_key_value(host).map(|(h, r)| (&**h, r));
        let wild = self
            .wildcard
            .iter()
            .filter(|(h, _)| host_matches(h, host))
            .map(|(h, r)| (&**h, r));
        let any = std::iter::once(("", &self.any_host));
        exact
            .into_iter()
            .chain(wild)
            .chain(any)
            .find_map(|(h, rules)| {
                let rule = rules.iter().find(|r| r.path.matches(path))?;
                Some(Matched {
                    action: &rule.action,
                    host: (!h.is_empty()).then_some(h),
                    matcher: rule.path.as_path_match(),
                })
            })
    }

    /// Sorts the wildcard entries longest first.
    pub fn sort(&mut self) {
        self.wildcard
            .sort_by(|a, b| b.0.len().cmp(&a.0.len()).then_with(|| a.0.cmp(&b.0)));
    }

    /// Every rule.
    pub fn rules(&self) -> impl Iterator<Item = &GatewayRule> {
        self.exact
            .values()
            .flatten()
            .chain(self.wildcard.iter().flat_map(|(_, r)| r))
            .chain(&self.any_host)
    }
}

/// One match of an HTTPRoute rule with where it sends the request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct GatewayRule {
    /// The path match.
    #[serde(rename = "match")]
    pub path: GatewayPath,
    /// The destination (weighted backendRefs are the action's choice).
    #[serde(flatten)]
    pub action: RouteAction,
}

/// An HTTPRoute path match.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum GatewayPath {
    /// `Exact` or `PathPrefix` (element-wise, as Ingress `Prefix`).
    Path(PathMatch),
    /// `RegularExpression`: the whole path matches (case-sensitive, Rust `regex` syntax).
    Regex(FullRegex),
}

impl GatewayPath {
    /// Whether the request path (without query) matches.
    pub fn matches(&self, path: &str) -> bool {
        match self {
            GatewayPath::Path(m) => m.matches(path),
            GatewayPath::Regex(r) => r.regex.is_match(path),
        }
    }

    fn as_path_match(&self) -> Option<&PathMatch> {
        match self {
            GatewayPath::Path(m) => Some(m),
            GatewayPath::Regex(_) => None,
        }
    }
}

/// A compiled whole-path regex, compared and serialised by its pattern.
#[derive(Clone, Debug)]
pub struct FullRegex {
    pattern: Box<str>,
    regex: regex::Regex,
}

/// Bounds on a compiled route regex (hostile input).
const REGEX_SIZE_LIMIT: usize = 1 << 20;

impl FullRegex {
    /// Compiles `pattern` to match whole paths.
    pub fn new(pattern: &str) -> Result<FullRegex, regex::Error> {
        let regex = regex::RegexBuilder::new(&format!("^(?:{pattern})$"))
            .size_limit(REGEX_SIZE_LIMIT)
            .dfa_size_limit(REGEX_SIZE_LIMIT)
            .build()?;
        Ok(FullRegex {
            pattern: pattern.into(),
            regex,
        })
    }

    /// The pattern as written.
    pub fn pattern(&self) -> &str {
        &self.pattern
    }
}

impl PartialEq for FullRegex {
    fn eq(&self, other: &FullRegex) -> bool {
        self.pattern == other.pattern
    }
}

impl Eq for FullRegex {}

impl Serialize for FullRegex {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.pattern)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(path: GatewayPath, backend: &str) -> GatewayRule {
        GatewayRule {
            path,
            action: RouteAction::to(backend),
        }
    }

    fn listener(hostname: Option<&str>, routes: ListenerRoutes) -> GatewayListener {
        GatewayListener {
            name: "ns/gw/l".into(),
            hostname: hostname.map(Into::into),
            cert: None,
            routes,
        }
    }

    fn any(backend: &str) -> ListenerRoutes {
        ListenerRoutes {
            any_host: vec![rule(GatewayPath::Path(PathMatch::prefix("/")), backend)],
            ..ListenerRoutes::default()
        }
    }

    fn found(port: &GatewayPort, host: &str, path: &str) -> Option<String> {
        port.find(host, path).map(|m| m.action.backend.to_string())
    }

    #[test]
    fn the_most_specific_listener_takes_the_request_and_only_its_routes_apply() {
        let mut port = GatewayPort {
            tls: false,
            listeners: vec![
                listener(None, any("empty")),
                listener(Some("*.example.com"), any("wild")),
                listener(Some("*.foo.example.com"), any("wilder")),
                listener(
                    Some("bar.example.com"),
                    ListenerRoutes {
                        any_host: vec![rule(GatewayPath::Path(PathMatch::exact("/only")), "bar")],
                        ..ListenerRoutes::default()
                    },
                ),
            ],
        };
        port.sort();
        assert_eq!(
            found(&port, "Bar.Example.com:80", "/only").as_deref(),
            Some("bar")
        );
        // Isolation: the bar listener has no `/other`; the wildcard listener is not consulted.
        assert_eq!(found(&port, "bar.example.com", "/other"), None);
        assert_eq!(
            found(&port, "a.b.example.com", "/").as_deref(),
            Some("wild")
        );
        assert_eq!(
            found(&port, "x.foo.example.com", "/").as_deref(),
            Some("wilder")
        );
        assert_eq!(found(&port, "example.com", "/").as_deref(), Some("empty"));
        assert_eq!(found(&port, "[::1]:8080", "/").as_deref(), Some("empty"));
    }

    #[test]
    fn host_entries_fall_through_in_precedence_and_regexes_match_whole_paths() {
        let mut routes = ListenerRoutes::default();
        routes.exact.insert(
            "a.example.com".into(),
            vec![rule(GatewayPath::Path(PathMatch::exact("/exact")), "exact")],
        );
        routes.wildcard.push((
            "*.example.com".into(),
            vec![rule(
                GatewayPath::Regex(FullRegex::new("/v[0-9]+").unwrap()),
                "regex",
            )],
        ));
        routes.any_host = vec![rule(GatewayPath::Path(PathMatch::prefix("/")), "any")];
        routes.sort();
        let hit = |h: &str, p: &str| routes.find(h, p).map(|m| m.action.backend.to_string());
        assert_eq!(hit("a.example.com", "/exact").as_deref(), Some("exact"));
        assert_eq!(hit("a.example.com", "/v2").as_deref(), Some("regex"));
        assert_eq!(hit("a.example.com", "/v2/x").as_deref(), Some("any"));
        assert_eq!(hit("other.test", "/v2").as_deref(), Some("any"));
        assert!(FullRegex::new("(").is_err());
    }

    #[test]
    fn wildcards_cover_one_label_or_more() {
        assert!(host_matches("*.example.com", "a.example.com"));
        assert!(host_matches("*.example.com", "a.b.example.com"));
        assert!(!host_matches("*.example.com", "example.com"));
        assert!(!host_matches("*.example.com", "aexample.com"));
        assert!(host_matches("a.example.com", "a.example.com"));
    }
}
