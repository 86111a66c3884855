//! HTTPRoutes and GRPCRoutes seen one way ([`RouteView`]): what attachment, backend resolution
//! and the route table need of either kind.

use std::collections::BTreeMap;

use dataplane::table::gateway::{FullRegex, GatewayPath};
use dataplane::PathMatch;

use crate::gateway::api::grpcroutes::{GrpcRouteRules, GrpcRouteRulesMatchesMethodType};
use crate::gateway::api::httproutes::{HttpRouteRules, HttpRouteRulesMatchesPathType};
use crate::gateway::api::{GrpcRoute, HttpRoute};
use crate::gateway::report::WrittenRef;
use crate::object::{Kind, NsName};

/// A route's parentRef with the defaults of the spec filled in.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ParentRef {
    /// `group` (default `gateway.networking.k8s.io`).
    pub group: String,
    /// `kind` (default `Gateway`).
    pub kind: String,
    /// `namespace` (default: the route's).
    pub namespace: String,
    /// `name`.
    pub name: String,
    /// `sectionName`: the listener's name.
    pub section_name: Option<String>,
    /// `port`: the listener's port.
    pub port: Option<i32>,
    /// The parentRef as written (its status names it so).
    pub written: WrittenRef,
}

/// A backendRef with its defaults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackendRef {
    /// `group` (default core, `""`).
    pub group: String,
    /// `kind` (default `Service`).
    pub kind: String,
    /// The namespace (default: the route's).
    pub namespace: String,
    /// `name`.
    pub name: String,
    /// `port`.
    pub port: Option<i32>,
    /// `weight` (default 1).
    pub weight: i32,
}

/// One match of a rule: its path, and whether it asks for more than duet's path matching
/// serves here (headers, query parameters, a method; their matching is `gateway_rule`'s).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MatchView {
    /// The path match (`PathPrefix /` when none is given).
    pub path: Result<GatewayPath, String>,
    /// The path's rank in the spec's precedence: Exact, then PathPrefix, then
    /// RegularExpression, longer paths first.
    pub rank: (u8, usize),
    /// The match also tests headers, query parameters or the method.
    pub more: bool,
}

/// One rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleView {
    /// Its matches (one `PathPrefix /` when none are given).
    pub matches: Vec<MatchView>,
    /// Its backendRefs.
    pub backends: Vec<BackendRef>,
}

/// An HTTPRoute or a GRPCRoute.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteView {
    /// `HTTPRoute` or `GRPCRoute`.
    pub kind: Kind,
    /// Namespace and name.
    pub key: NsName,
    /// `metadata.creationTimestamp` in Unix seconds (0 when unset).
    pub created: i64,
    /// `metadata.generation`.
    pub generation: Option<i64>,
    /// The annotations (the family policy's).
    pub annotations: BTreeMap<String, String>,
    /// `spec.hostnames`, lower case.
    pub hostnames: Vec<String>,
    /// `spec.parentRefs`.
    pub parents: Vec<ParentRef>,
    /// `spec.rules`.
    pub rules: Vec<RuleView>,
}

impl RouteView {
    /// The kind's name: `HTTPRoute` or `GRPCRoute`.
    pub fn kind_name(&self) -> &'static str {
        self.kind.as_str()
    }
}

fn parent(
    route_ns: &str,
    group: &Option<String>,
    kind: &Option<String>,
    namespace: &Option<String>,
    name: &str,
    section_name: &Option<String>,
    port: Option<i32>,
) -> ParentRef {
    ParentRef {
        group: group
            .clone()
            .unwrap_or_else(|| crate::gateway::api::GROUP.to_owned()),
        kind: kind.clone().unwrap_or_else(|| "Gateway".to_owned()),
        namespace: namespace.clone().unwrap_or_else(|| route_ns.to_owned()),
        name: name.to_owned(),
        section_name: section_name.clone(),
        port,
        written: WrittenRef {
            group: group.clone(),
            kind: kind.clone(),
            namespace: namespace.clone(),
            name: name.to_owned(),
            section_name: section_name.clone(),
            port,
        },
    }
}

fn backend(
    route_ns: &str,
    group: &Option<String>,
    kind: &Option<String>,
    namespace: &Option<String>,
    name: &str,
    port: Option<i32>,
    weight: Option<i32>,
) -> BackendRef {
    BackendRef {
        group: group.clone().unwrap_or_default(),
        kind: kind.clone().unwrap_or_else(|| "Service".to_owned()),
        namespace: namespace.clone().unwrap_or_else(|| route_ns.to_owned()),
        name: name.to_owned(),
        port,
        weight: weight.unwrap_or(1),
    }
}

fn meta_parts(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> (NsName, i64) {
    let created = meta
        .creation_timestamp
        .as_ref()
        .map_or(0, |t| t.0.as_second());
    (NsName::of(meta), created)
}

/// An HTTPRoute's view.
pub fn http(route: &HttpRoute) -> RouteView {
    let (key, created) = meta_parts(&route.metadata);
    let ns = key.namespace.clone();
    let spec = &route.spec;
    let parents = spec.parent_refs.iter().flatten();
    let parents = parents.map(|p| {
        parent(
            &ns,
            &p.group,
            &p.kind,
            &p.namespace,
            &p.name,
            &p.section_name,
            p.port,
        )
    });
    RouteView {
        kind: Kind::HttpRoute,
        created,
        generation: route.metadata.generation,
        annotations: route.metadata.annotations.clone().unwrap_or_default(),
        hostnames: hostnames(spec.hostnames.as_deref()),
        parents: parents.collect(),
        rules: spec
            .rules
            .iter()
            .flatten()
            .map(|r| http_rule(&ns, r))
            .collect(),
        key,
    }
}

fn http_rule(ns: &str, rule: &HttpRouteRules) -> RuleView {
    let backends = rule.backend_refs.iter().flatten();
    let backends = backends.map(|b| {
        backend(
            ns,
            &b.group,
            &b.kind,
            &b.namespace,
            &b.name,
            b.port,
            b.weight,
        )
    });
    let mut matches: Vec<MatchView> = rule
        .matches
        .iter()
        .flatten()
        .map(|m| {
            let (kind, value) = m
                .path
                .as_ref()
                .map_or((None, None), |p| (p.r#type.clone(), p.value.as_deref()));
            let more = m.headers.as_ref().is_some_and(|h| !h.is_empty())
                || m.query_params.as_ref().is_some_and(|q| !q.is_empty())
                || m.method.is_some();
            let mut view = http_path(kind, value.unwrap_or("/"));
            view.more = more;
            view
        })
        .collect();
    if matches.is_empty() {
        matches.push(http_path(None, "/"));
    }
    RuleView {
        matches,
        backends: backends.collect(),
    }
}

/// A path match of an HTTPRoute (`PathPrefix` when no type is given).
fn http_path(kind: Option<HttpRouteRulesMatchesPathType>, value: &str) -> MatchView {
    let path = match kind.unwrap_or(HttpRouteRulesMatchesPathType::PathPrefix) {
        HttpRouteRulesMatchesPathType::Exact => valid_path(value).map(|_| {
            (
                GatewayPath::Path(PathMatch::exact(value)),
                (0, usize::MAX - value.len()),
            )
        }),
        HttpRouteRulesMatchesPathType::PathPrefix => valid_path(value).map(|_| {
            let m = PathMatch::prefix(value);
            let len = m.path().len();
            (GatewayPath::Path(m), (1, usize::MAX - len))
        }),
        HttpRouteRulesMatchesPathType::RegularExpression => regex(value, 2),
    };
    match path {
        Ok((path, rank)) => MatchView {
            path: Ok(path),
            rank,
            more: false,
        },
        Err(e) => MatchView {
            path: Err(e),
            rank: (3, 0),
            more: false,
        },
    }
}

fn valid_path(value: &str) -> Result<(), String> {
    if value.starts_with('/') {
        Ok(())
    } else {
        Err(format!("path {value:?} does not start with \"/\""))
    }
}

fn regex(pattern: &str, rank: u8) -> Result<(GatewayPath, (u8, usize)), String> {
    FullRegex::new(pattern)
        .map(|r| (GatewayPath::Regex(r), (rank, usize::MAX - pattern.len())))
        .map_err(|e| format!("regular expression {pattern:?} does not compile: {e}"))
}

/// A GRPCRoute's view: a method match is a path match on `/SERVICE/METHOD`.
pub fn grpc(route: &GrpcRoute) -> RouteView {
    let (key, created) = meta_parts(&route.metadata);
    let ns = key.namespace.clone();
    let spec = &route.spec;
    let parents = spec.parent_refs.iter().flatten();
    let parents = parents.map(|p| {
        parent(
            &ns,
            &p.group,
            &p.kind,
            &p.namespace,
            &p.name,
            &p.section_name,
            p.port,
        )
    });
    RouteView {
        kind: Kind::GrpcRoute,
        created,
        generation: route.metadata.generation,
        annotations: route.metadata.annotations.clone().unwrap_or_default(),
        hostnames: hostnames(spec.hostnames.as_deref()),
        parents: parents.collect(),
        rules: spec
            .rules
            .iter()
            .flatten()
            .map(|r| grpc_rule(&ns, r))
            .collect(),
        key,
    }
}

fn grpc_rule(ns: &str, rule: &GrpcRouteRules) -> RuleView {
    let backends = rule.backend_refs.iter().flatten();
    let backends = backends.map(|b| {
        backend(
            ns,
            &b.group,
            &b.kind,
            &b.namespace,
            &b.name,
            b.port,
            b.weight,
        )
    });
    let mut matches: Vec<MatchView> = rule
        .matches
        .iter()
        .flatten()
        .map(|m| {
            let method = m.method.as_ref();
            let service = method.and_then(|m| m.service.as_deref());
            let name = method.and_then(|m| m.method.as_deref());
            let is_regex = method.and_then(|m| m.r#type.as_ref())
                == Some(&GrpcRouteRulesMatchesMethodType::RegularExpression);
            let mut view = grpc_path(service, name, is_regex);
            view.more = m.headers.as_ref().is_some_and(|h| !h.is_empty());
            view
        })
        .collect();
    if matches.is_empty() {
        matches.push(http_path(None, "/"));
    }
    RuleView {
        matches,
        backends: backends.collect(),
    }
}

/// `/SERVICE/METHOD` as a path match: exact with both, prefix with the service only, a regex
/// with the method only or with `RegularExpression`.
fn grpc_path(service: Option<&str>, method: Option<&str>, is_regex: bool) -> MatchView {
    let path = match (service, method, is_regex) {
        (None, None, _) => return http_path(None, "/"),
        (Some(s), Some(m), false) => Ok((
            GatewayPath::Path(PathMatch::exact(&format!("/{s}/{m}"))),
            (0, usize::MAX - s.len() - m.len() - 2),
        )),
        (Some(s), None, false) => Ok((
            GatewayPath::Path(PathMatch::prefix(&format!("/{s}"))),
            (1, usize::MAX - s.len() - 1),
        )),
        (s, m, true) => regex(
            &format!("/{}/{}", s.unwrap_or("[^/]+"), m.unwrap_or("[^/]+")),
            2,
        ),
        (None, Some(m), false) => regex(&format!("/[^/]+/{}", regex_syntax_escape(m)), 2),
    };
    match path {
        Ok((path, rank)) => MatchView {
            path: Ok(path),
            rank,
            more: false,
        },
        Err(e) => MatchView {
            path: Err(e),
            rank: (3, 0),
            more: false,
        },
    }
}

/// `s` with every regex metacharacter escaped.
fn regex_syntax_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if r"\.+*?()|[]{}^$#&-~".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

fn hostnames(written: Option<&[String]>) -> Vec<String> {
    written
        .unwrap_or_default()
        .iter()
        .map(|h| h.trim_end_matches('.').to_ascii_lowercase())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matches(view: &MatchView, path: &str) -> bool {
        view.path.as_ref().is_ok_and(|p| p.matches(path))
    }

    #[test]
    fn grpc_methods_are_paths() {
        let both = grpc_path(Some("pkg.Svc"), Some("Get"), false);
        assert!(matches(&both, "/pkg.Svc/Get"));
        assert!(!matches(&both, "/pkg.Svc/Put"));
        let service = grpc_path(Some("pkg.Svc"), None, false);
        assert!(matches(&service, "/pkg.Svc/Put"));
        assert!(!matches(&service, "/pkg.SvcX/Put"));
        let method = grpc_path(None, Some("Get.x"), false);
        assert!(matches(&method, "/a.B/Get.x"));
        assert!(!matches(&method, "/a.B/Getxx"));
        let regex = grpc_path(Some("pkg\\..*"), None, true);
        assert!(matches(&regex, "/pkg.Svc/Any"));
        assert!(!matches(&regex, "/other.Svc/Any"));
        // Exact before prefix before regex.
        assert!(both.rank < service.rank && service.rank < regex.rank);
    }
}
