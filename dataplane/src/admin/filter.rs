//! The filters of `/debug/routes`: `?ingress=NAMESPACE/NAME`, `?httproute=NAMESPACE/NAME`,
//! `?grpcroute=NAMESPACE/NAME` (the routes that object declares), `?gateway=NAMESPACE/NAME` (the
//! listeners of that Gateway with their routes) and `?host=HOST` (the host entries written for
//! that host, `*.example.com` for a wildcard), each with only the backends those routes use.
//! The query is client input: at most [`MAX_QUERY`] bytes, one parameter, names checked as
//! Kubernetes checks them; anything else is a [`FilterError`] (a 400). An object or host duet
//! does not serve gives empty tables, not an error.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use serde::Serialize;

use crate::table::gateway::{GatewayListener, GatewayPort, GatewayRule, GatewayTable};
use crate::table::{
    Backend, BackendId, HostRules, OriginKind, PathRule, RouteAction, RouteTable, Snapshot,
};

/// The longest query string read, in bytes (a namespace, `/` and a name take at most 317).
pub const MAX_QUERY: usize = 1024;

/// What `/debug/routes` is asked to keep.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RouteFilter {
    /// The routes an Ingress, HTTPRoute or GRPCRoute declares.
    Route {
        /// Its kind.
        kind: OriginKind,
        /// Its namespace and name.
        key: ObjectName,
    },
    /// The listeners of one Gateway.
    Gateway(ObjectName),
    /// The host entries written for one host (lower case, no trailing dot).
    Host(String),
}

/// A namespaced object's namespace and name, both valid Kubernetes names.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ObjectName {
    /// A DNS-1123 label.
    pub namespace: String,
    /// A DNS-1123 subdomain.
    pub name: String,
}

/// Why a `/debug/routes` query was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FilterError {
    /// The query string is longer than [`MAX_QUERY`].
    #[error("the query is longer than {MAX_QUERY} bytes")]
    TooLong,
    /// More than one parameter.
    #[error("one filter at a time: ingress=, httproute=, grpcroute=, gateway= or host=")]
    Several,
    /// A parameter that is not a filter.
    #[error("unknown filter {0:?}: use ingress=, httproute=, grpcroute=, gateway= or host=")]
    Unknown(String),
    /// A value that is not `NAMESPACE/NAME`.
    #[error("{key}={value:?} is not NAMESPACE/NAME (a DNS-1123 label, `/`, a DNS-1123 subdomain)")]
    BadName {
        /// The parameter.
        key: &'static str,
        /// The value given.
        value: String,
    },
    /// A value that is not a host name.
    #[error("host={0:?} is not a DNS name (`app.example.com`, or `*.example.com`)")]
    BadHost(String),
}

/// The filter a query string asks for; `None` without one.
pub fn parse(query: Option<&str>) -> Result<Option<RouteFilter>, FilterError> {
    let Some(query) = query.filter(|q| !q.is_empty()) else {
        return Ok(None);
    };
    if query.len() > MAX_QUERY {
        return Err(FilterError::TooLong);
    }
    let mut pairs = form_urlencoded::parse(query.as_bytes());
    let Some((key, value)) = pairs.next() else {
        return Ok(None);
    };
    if pairs.next().is_some() {
        return Err(FilterError::Several);
    }
    let route = |kind, key| object(key, &value).map(|key| RouteFilter::Route { kind, key });
    match &*key {
        "ingress" => route(OriginKind::Ingress, "ingress"),
        "httproute" => route(OriginKind::HttpRoute, "httproute"),
        "grpcroute" => route(OriginKind::GrpcRoute, "grpcroute"),
        "tlsroute" => route(OriginKind::TlsRoute, "tlsroute"),
        "gateway" => object("gateway", &value).map(RouteFilter::Gateway),
        "host" => host(&value).ok_or_else(|| FilterError::BadHost(value.to_string())),
        other => Err(FilterError::Unknown(other.to_string())),
    }
    .map(Some)
}

fn object(key: &'static str, value: &str) -> Result<ObjectName, FilterError> {
    let bad = || FilterError::BadName {
        key,
        value: value.to_string(),
    };
    let (namespace, name) = value.split_once('/').ok_or_else(bad)?;
    if !is_label(namespace) || !is_subdomain(name) {
        return Err(bad());
    }
    Ok(ObjectName {
        namespace: namespace.to_string(),
        name: name.to_string(),
    })
}

/// A DNS-1123 label: 1 to 63 lower-case letters, digits and `-`, a letter or digit at each end.
fn is_label(s: &str) -> bool {
    let edge = |b: Option<&u8>| b.is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    s.len() <= 63
        && edge(s.as_bytes().first())
        && edge(s.as_bytes().last())
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// A DNS-1123 subdomain: at most 253 bytes of labels joined by `.`.
fn is_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_label)
}

/// A host as host entries are keyed: lower case, no trailing dot, an optional `*.` first; each
/// label 1 to 63 letters, digits, `-` or `_`.
fn host(value: &str) -> Option<RouteFilter> {
    let lower = value
        .strip_suffix('.')
        .unwrap_or(value)
        .to_ascii_lowercase();
    let name = lower.strip_prefix("*.").unwrap_or(&lower);
    let label = |l: &str| {
        (1..=63).contains(&l.len())
            && l.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    };
    (name.len() <= 253 && name.split('.').all(label)).then_some(RouteFilter::Host(lower))
}

/// The parts of a snapshot a filter keeps, as `/debug/routes` shows them.
#[derive(Debug, Serialize)]
pub struct Filtered<'a> {
    /// The snapshot's version.
    pub version: u64,
    /// The Ingress routes kept.
    pub routes: RouteTable,
    /// The backends the kept routes use.
    pub backends: BTreeMap<&'a BackendId, &'a Arc<Backend>>,
    /// The Gateway listeners kept, with the routes kept.
    pub gateways: GatewayTable,
}

impl RouteFilter {
    /// The query parameter and value, for the answer to say what it shows.
    pub fn describe(&self) -> (&'static str, String) {
        let key = |k: &ObjectName| format!("{}/{}", k.namespace, k.name);
        match self {
            RouteFilter::Route { kind, key: k } => match kind {
                OriginKind::Ingress => ("ingress", key(k)),
                OriginKind::HttpRoute => ("httproute", key(k)),
                OriginKind::GrpcRoute => ("grpcroute", key(k)),
                OriginKind::TlsRoute => ("tlsroute", key(k)),
            },
            RouteFilter::Gateway(k) => ("gateway", key(k)),
            RouteFilter::Host(h) => ("host", h.clone()),
        }
    }

    /// Whether a diagnostic's object (`kind`, `namespace`, `name` as the controller writes
    /// them) is the filtered object.
    pub fn names(&self, kind: &str, namespace: &str, name: &str) -> bool {
        let (want, key) = match self {
            RouteFilter::Route { kind, key } => (
                match kind {
                    OriginKind::Ingress => "Ingress",
                    OriginKind::HttpRoute => "HttpRoute",
                    OriginKind::GrpcRoute => "GrpcRoute",
                    OriginKind::TlsRoute => "TlsRoute",
                },
                key,
            ),
            RouteFilter::Gateway(key) => ("Gateway", key),
            RouteFilter::Host(_) => return false,
        };
        want == kind && key.namespace == namespace && key.name == name
    }

    /// The routes, listeners and backends of `snapshot` this filter keeps.
    pub fn apply<'a>(&self, snapshot: &'a Snapshot) -> Filtered<'a> {
        let routes = self.routes(&snapshot.routes);
        let gateways = self.gateways(&snapshot.gateways);
        let used = routes
            .backend_ids()
            .chain(gateways.actions().flat_map(RouteAction::backend_ids));
        let backends = used
            .filter_map(|id| snapshot.backends.get_key_value(id))
            .collect();
        Filtered {
            version: snapshot.version,
            routes,
            backends,
            gateways,
        }
    }

    fn keeps(&self, action: &RouteAction) -> bool {
        match self {
            RouteFilter::Route { kind, key } => {
                let o = &action.origin;
                o.kind == *kind && *o.namespace == key.namespace && *o.name == key.name
            }
            RouteFilter::Gateway(_) | RouteFilter::Host(_) => false,
        }
    }

    fn routes(&self, table: &RouteTable) -> RouteTable {
        let entry = |h: &HostRules| {
            let rules: Vec<PathRule> = match self {
                RouteFilter::Host(host) if *host == *h.host => h.rules.to_vec(),
                _ => h
                    .rules
                    .iter()
                    .filter(|r| self.keeps(&r.action))
                    .cloned()
                    .collect(),
            };
            let host = h.host.clone();
            (!rules.is_empty()).then(|| HostRules {
                host,
                rules: rules.into(),
            })
        };
        let map = |m: &HashMap<Box<str>, HostRules>| {
            m.iter()
                .filter_map(|(k, h)| Some((k.clone(), entry(h)?)))
                .collect()
        };
        RouteTable {
            exact: map(&table.exact),
            wildcard: map(&table.wildcard),
            any_host: entry(&table.any_host).unwrap_or_default(),
            default_backend: table.default_backend.clone().filter(|a| self.keeps(a)),
            passthrough: table
                .passthrough
                .iter()
                .filter(|(host, p)| match self {
                    RouteFilter::Route { kind, key } => {
                        *kind == p.origin.kind
                            && *p.origin.namespace == key.namespace
                            && *p.origin.name == key.name
                    }
                    RouteFilter::Host(h) => &***host == h.as_str(),
                    RouteFilter::Gateway(_) => false,
                })
                .map(|(h, p)| (h.clone(), p.clone()))
                .collect(),
        }
    }

    fn gateways(&self, table: &GatewayTable) -> GatewayTable {
        let ports = table.ports.iter().filter_map(|(port, p)| {
            let listeners: Vec<GatewayListener> = p
                .listeners
                .iter()
                .filter_map(|l| self.listener(l))
                .collect();
            (!listeners.is_empty()).then(|| {
                let kept = GatewayPort {
                    tls: p.tls,
                    tls_routes: p.tls_routes,
                    client_auth: p.client_auth.clone(),
                    listener_port: p.listener_port,
                    listeners,
                };
                (*port, Arc::new(kept))
            })
        });
        GatewayTable {
            ports: ports.collect(),
        }
    }

    fn listener(&self, l: &GatewayListener) -> Option<GatewayListener> {
        if let RouteFilter::Gateway(key) = self {
            let prefix = format!("{}/{}/", key.namespace, key.name);
            return l.name.starts_with(&prefix).then(|| l.clone());
        }
        let keep = |host: &str, rules: &[GatewayRule]| -> Vec<GatewayRule> {
            match self {
                RouteFilter::Host(h) if h == host => rules.to_vec(),
                _ => rules
                    .iter()
                    .filter(|r| self.keeps(&r.action))
                    .cloned()
                    .collect(),
            }
        };
        let mut routes = l.routes.clone();
        routes.exact = routes
            .exact
            .iter()
            .map(|(h, r)| (h.clone(), keep(h, r)))
            .filter(|(_, r)| !r.is_empty())
            .collect();
        routes.wildcard = routes
            .wildcard
            .iter()
            .map(|(h, r)| (h.clone(), keep(h, r)))
            .filter(|(_, r)| !r.is_empty())
            .collect();
        routes.any_host = keep("", &routes.any_host);
        let empty = routes.rules().next().is_none();
        (!empty).then(|| GatewayListener {
            routes,
            ..l.clone()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(namespace: &str, name: &str) -> ObjectName {
        ObjectName {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    #[test]
    fn parses_each_filter() {
        let ingress = RouteFilter::Route {
            kind: OriginKind::Ingress,
            key: name("shop", "web.v2"),
        };
        assert_eq!(
            parse(Some("ingress=shop/web.v2")),
            Ok(Some(ingress.clone()))
        );
        assert_eq!(parse(Some("ingress=shop%2Fweb.v2")), Ok(Some(ingress)));
        assert_eq!(
            parse(Some("httproute=a/b")),
            Ok(Some(RouteFilter::Route {
                kind: OriginKind::HttpRoute,
                key: name("a", "b")
            }))
        );
        assert_eq!(
            parse(Some("gateway=gw/edge")),
            Ok(Some(RouteFilter::Gateway(name("gw", "edge"))))
        );
        assert_eq!(
            parse(Some("host=*.Example.COM.")),
            Ok(Some(RouteFilter::Host("*.example.com".into())))
        );
        assert_eq!(parse(None), Ok(None));
        assert_eq!(parse(Some("")), Ok(None));
        assert_eq!(parse(Some("&")), Ok(None));
    }

    #[test]
    fn refuses_what_is_not_a_filter() {
        let bad = |v: &str| FilterError::BadName {
            key: "ingress",
            value: v.into(),
        };
        for v in [
            "shop",
            "/web",
            "shop/",
            "Shop/web",
            "shop/web/x",
            "-a/b",
            "a/b..c",
            "a/b c",
        ] {
            let q = format!("ingress={}", v.replace(' ', "%20"));
            assert_eq!(parse(Some(&q)), Err(bad(v)), "{q}");
        }
        let long_ns = format!("ingress={}/a", "n".repeat(64));
        assert!(matches!(
            parse(Some(&long_ns)),
            Err(FilterError::BadName { .. })
        ));
        assert_eq!(parse(Some("ingress=a/b&host=x")), Err(FilterError::Several));
        assert_eq!(
            parse(Some("ingress=a/b&ingress=c/d")),
            Err(FilterError::Several)
        );
        assert_eq!(
            parse(Some("service=a/b")),
            Err(FilterError::Unknown("service".into()))
        );
        assert_eq!(
            parse(Some("host=a..b")),
            Err(FilterError::BadHost("a..b".into()))
        );
        assert_eq!(
            parse(Some("host=a/b")),
            Err(FilterError::BadHost("a/b".into()))
        );
        let huge = format!("host={}", "a".repeat(MAX_QUERY));
        assert_eq!(parse(Some(&huge)), Err(FilterError::TooLong));
        // Many pairs are never collected: the second one ends the parse.
        let pairs = "a=b&".repeat(200);
        assert_eq!(parse(Some(&pairs)), Err(FilterError::Several));
    }
}
