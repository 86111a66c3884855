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
use crate::request_match::{RequestMatch, RequestView};

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

    /// Every action with the route hostname it is attached under (`""` for routes without
    /// hostnames), for per-route metrics.
    pub fn host_actions(&self) -> impl Iterator<Item = (&str, &RouteAction)> {
        self.ports
            .values()
            .flat_map(|p| &p.listeners)
            .flat_map(|l| {
                let routes = &l.routes;
                let exact = routes.exact.iter().map(|(h, r)| (&**h, r));
                let wild = routes.wildcard.iter().map(|(h, r)| (&**h, r));
                exact
                    .chain(wild)
                    .chain(std::iter::once(("", &routes.any_host)))
                    .flat_map(|(h, rules)| rules.iter().map(move |r| (h, &r.action)))
            })
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
    /// TLS listeners: connections are routed by SNI to TLSRoutes (rules matching every path)
    /// and relayed as TCP, unterminated (a listener without certificate, mode Passthrough) or
    /// decrypted with the listener's certificate (mode Terminate).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub tls_routes: bool,
    /// The listeners, most specific hostname first (see the module documentation).
    pub listeners: Vec<GatewayListener>,
    /// Client certificates on an HTTPS port (the Gateway's `tls.frontend` validation for this
    /// port): the handshake asks for one; with [`VerifyClient::On`] (`AllowValidOnly`) it fails
    /// without one the CA bundle verifies, with [`VerifyClient::OptionalNoCa`]
    /// (`AllowInsecureFallback`) it goes on with none or any.
    ///
    /// [`VerifyClient::On`]: crate::client_auth::VerifyClient::On
    /// [`VerifyClient::OptionalNoCa`]: crate::client_auth::VerifyClient::OptionalNoCa
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_auth: Option<Arc<crate::client_auth::ClientAuth>>,
    /// The port the listeners name, the one clients reach through the Gateway's Service (in
    /// `--manifests` mode the pod port itself): `Alt-Svc` advertises HTTP/3 there.
    pub listener_port: u16,
}

impl GatewayPort {
    /// The listener a Host (or SNI) selects: the most specific whose hostname matches.
    pub fn listener(&self, host: &str) -> Option<&GatewayListener> {
        let mut buf = [0u8; crate::host::MAX_NAME];
        let host = crate::host::normalize_name(strip_port(host), &mut buf)?;
        self.listener_of(host)
    }

    /// Whether a request for `host` came over a TLS connection whose server name `sni` selected
    /// another listener than `host` selects (Gateway API's misdirected request, answered 421). A
    /// host no listener takes is not misdirected: it finds no route.
    pub fn misdirected(&self, sni: &str, host: &str) -> bool {
        let (Some(by_sni), Some(by_host)) = (self.listener(sni), self.listener(host)) else {
            return false;
        };
        !std::ptr::eq(by_sni, by_host)
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

    /// The listener and TLSRoute action of a TLS connection naming `sni` on a `tls_routes`
    /// port: the listener the SNI selects, and its rule for the route hostname that matches.
    pub fn tls_route(&self, sni: &str) -> Option<(&GatewayListener, &RouteAction)> {
        let mut buf = [0u8; crate::host::MAX_NAME];
        let host = crate::host::normalize_name(sni, &mut buf)?;
        let listener = self.listener_of(host)?;
        let found = listener.routes.find(host, "/")?;
        Some((listener, found.action))
    }

    /// Finds the route of a request on this port by path alone (`host` as received, `path`
    /// without query): only rules without conditions match.
    pub fn find<'a>(&'a self, host: &str, path: &str) -> Option<Matched<'a>> {
        self.find_request(host, &RequestView::path(path))
    }

    /// Finds the route of a request on this port (`host` as received). Allocates nothing for
    /// hosts of up to 255 bytes.
    pub fn find_request<'a>(&'a self, host: &str, req: &RequestView<'_>) -> Option<Matched<'a>> {
        let mut buf = [0u8; crate::host::MAX_NAME];
        let host = crate::host::normalize_name(strip_port(host), &mut buf)?;
        self.listener_of(host)?.routes.find_request(host, req)
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
    /// [`ListenerRoutes::find_request`] by path alone.
    pub fn find<'a>(&'a self, host: &str, path: &str) -> Option<Matched<'a>> {
        self.find_request(host, &RequestView::path(path))
    }

    /// The first matching rule of the most specific host entries (see the module documentation).
    pub fn find_request<'a>(&'a self, host: &str, req: &RequestView<'_>) -> Option<Matched<'a>> {
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
                let rule = rules.iter().find(|r| r.matches(req))?;
                Some(Matched {
                    action: &rule.action,
                    host: (!h.is_empty()).then_some(h),
                    matcher: Some(&rule.path),
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

/// One match of an HTTPRoute or GRPCRoute rule with where it sends the request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct GatewayRule {
    /// The path match (`PathPrefix /` when the match names none or is a regex).
    #[serde(rename = "match")]
    pub path: PathMatch,
    /// Method, header, query and whole-path regex conditions ([`crate::request_match`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub when: Option<Arc<RequestMatch>>,
    /// The rule's `name`, if it has one (shown in `/debug/routes`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<Arc<str>>,
    /// The destination (weighted backendRefs are the action's choice) and the rule's filters.
    #[serde(flatten)]
    pub action: RouteAction,
}

impl GatewayRule {
    /// Whether the request matches the path and every condition.
    pub fn matches(&self, req: &RequestView<'_>) -> bool {
        self.path.matches(req.path) && self.when.as_ref().is_none_or(|w| w.matches(req))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(path: PathMatch, backend: &str) -> GatewayRule {
        GatewayRule {
            path,
            when: None,
            name: None,
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
            any_host: vec![rule(PathMatch::prefix("/"), backend)],
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
            tls_routes: false,
            client_auth: None,
            listener_port: 443,
            listeners: vec![
                listener(None, any("empty")),
                listener(Some("*.example.com"), any("wild")),
                listener(Some("*.foo.example.com"), any("wilder")),
                listener(
                    Some("bar.example.com"),
                    ListenerRoutes {
                        any_host: vec![rule(PathMatch::exact("/only"), "bar")],
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
            vec![rule(PathMatch::exact("/exact"), "exact")],
        );
        routes.wildcard.push((
            "*.example.com".into(),
            vec![GatewayRule {
                when: Some(Arc::new(RequestMatch {
                    path: Some(crate::request_match::FullRegex::new("/v[0-9]+").unwrap()),
                    ..RequestMatch::default()
                })),
                ..rule(PathMatch::prefix("/"), "regex")
            }],
        ));
        routes.any_host = vec![rule(PathMatch::prefix("/"), "any")];
        routes.sort();
        let hit = |h: &str, p: &str| routes.find(h, p).map(|m| m.action.backend.to_string());
        assert_eq!(hit("a.example.com", "/exact").as_deref(), Some("exact"));
        assert_eq!(hit("a.example.com", "/v2").as_deref(), Some("regex"));
        assert_eq!(hit("a.example.com", "/v2/x").as_deref(), Some("any"));
        assert_eq!(hit("other.test", "/v2").as_deref(), Some("any"));
    }

    #[test]
    fn wildcards_cover_one_label_or_more() {
        assert!(host_matches("*.example.com", "a.example.com"));
        assert!(host_matches("*.example.com", "a.b.example.com"));
        assert!(!host_matches("*.example.com", "example.com"));
        assert!(!host_matches("*.example.com", "aexample.com"));
        assert!(host_matches("a.example.com", "a.example.com"));
    }

    #[test]
    fn a_host_of_another_listener_than_the_server_names_is_misdirected() {
        let mut port = GatewayPort {
            tls: true,
            tls_routes: false,
            client_auth: None,
            listener_port: 443,
            listeners: vec![
                listener(None, any("empty")),
                listener(Some("second.org"), any("second")),
                listener(Some("*.wild.org"), any("wild")),
                listener(Some("four.wild.org"), any("four")),
            ],
        };
        port.sort();
        for (sni, host, want) in [
            ("example.org", "example.org", false),
            ("example.org", "unknown.org:443", false),
            ("example.org", "second.org", true),
            ("second.org", "Example.org", true),
            ("second.org", "SECOND.org:443", false),
            ("three.wild.org", "five.wild.org", false),
            ("three.wild.org", "four.wild.org", true),
            ("four.wild.org", "five.wild.org", true),
        ] {
            assert_eq!(port.misdirected(sni, host), want, "{sni} {host}");
        }
        // Without a catch-all listener, a host no listener takes finds no route instead.
        let only = GatewayPort {
            tls: true,
            tls_routes: false,
            client_auth: None,
            listener_port: 443,
            listeners: vec![listener(Some("second.org"), any("second"))],
        };
        assert!(!only.misdirected("second.org", "other.org"));
    }
}
