//! HTTPRoutes, GRPCRoutes and TLSRoutes seen one way ([`RouteView`]): what attachment, backend resolution
//! and the route table need of either kind.

use std::collections::BTreeMap;
use std::sync::Arc;

use dataplane::filters::BackendFilters;

use crate::gateway_api::grpcroutes::GrpcRouteRules;
use crate::gateway_api::httproutes::HttpRouteRules;
use crate::gateway_api::report::WrittenRef;
use crate::gateway_api::tlsroutes::TlsRouteRules;
use crate::gateway_api::{GrpcRoute, HttpRoute, TlsRoute};
use crate::object::{Kind, NsName};
use crate::translate::gateway_rule::{self, RuleMatch, RuleRefusal, RuleRouting};
use dataplane::PathMatch;

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
    /// The backendRef's own filters (HTTPRoute), applied when it serves the request.
    pub filters: Option<BackendFilters>,
}

/// One rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleView {
    /// Its matches, filters and timeouts ([`gateway_rule`]), or why it cannot be served.
    pub routing: Result<RuleRouting, RuleRefusal>,
    /// Its backendRefs.
    pub backends: Vec<BackendRef>,
    /// Its `name`, if any.
    pub name: Option<Arc<str>>,
}

/// An HTTPRoute, a GRPCRoute or a TLSRoute.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteView {
    /// `HTTPRoute`, `GRPCRoute` or `TLSRoute`.
    pub kind: Kind,
    /// Namespace and name.
    pub key: NsName,
    /// `metadata.creationTimestamp` in Unix seconds (0 when unset).
    pub created: i64,
    /// `metadata.generation`.
    pub generation: Option<i64>,
    /// `metadata.uid`: a route deleted and made again under its name is another route.
    pub uid: Option<String>,
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
    /// The kind's name: `HTTPRoute`, `GRPCRoute` or `TLSRoute`.
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
            .unwrap_or_else(|| crate::gateway_api::GROUP.to_owned()),
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
        filters: None,
    }
}

/// A [`ParentRef`] from a generated parentRef (HTTPRoute's and GRPCRoute's are distinct
/// generated types with the same fields).
macro_rules! parent_of {
    ($ns:expr, $p:expr) => {
        parent(
            $ns,
            &$p.group,
            &$p.kind,
            &$p.namespace,
            &$p.name,
            &$p.section_name,
            $p.port,
        )
    };
}

/// A [`BackendRef`] from a generated backendRef, as [`parent_of`] for parentRefs.
macro_rules! backend_of {
    ($ns:expr, $b:expr) => {
        backend(
            $ns,
            &$b.group,
            &$b.kind,
            &$b.namespace,
            &$b.name,
            $b.port,
            $b.weight,
        )
    };
}

/// A route's view from its metadata and hostnames; `parts` gives its parents and rules from
/// the route's namespace.
fn route_view(
    kind: Kind,
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    written_hostnames: Option<&[String]>,
    parts: impl FnOnce(&str) -> (Vec<ParentRef>, Vec<RuleView>),
) -> RouteView {
    let key = NsName::of(meta);
    let (parents, rules) = parts(&key.namespace);
    RouteView {
        kind,
        created: meta
            .creation_timestamp
            .as_ref()
            .map_or(0, |t| t.0.as_second()),
        generation: meta.generation,
        uid: meta.uid.clone(),
        annotations: meta.annotations.clone().unwrap_or_default(),
        hostnames: hostnames(written_hostnames),
        parents,
        rules,
        key,
    }
}

/// An HTTPRoute's view.
pub fn http(route: &HttpRoute) -> RouteView {
    let spec = &route.spec;
    route_view(
        Kind::HttpRoute,
        &route.metadata,
        spec.hostnames.as_deref(),
        |ns| {
            let parents = spec.parent_refs.iter().flatten();
            let rules = spec.rules.iter().flatten();
            (
                parents.map(|p| parent_of!(ns, p)).collect(),
                rules.map(|r| http_rule(ns, r)).collect(),
            )
        },
    )
}

fn http_rule(ns: &str, rule: &HttpRouteRules) -> RuleView {
    let mut routing = gateway_rule::http_rule(rule);
    let mut backends = Vec::new();
    for b in rule.backend_refs.iter().flatten() {
        let mut view = backend_of!(ns, b);
        match gateway_rule::http_backend_filters(b.filters.as_deref().unwrap_or_default()) {
            Ok(filters) => view.filters = filters,
            Err(refusal) => routing = Err(refusal),
        }
        backends.push(view);
    }
    RuleView {
        routing,
        backends,
        name: rule.name.as_deref().map(Arc::from),
    }
}

/// A GRPCRoute's view: a method match is a path match on `/SERVICE/METHOD`.
pub fn grpc(route: &GrpcRoute) -> RouteView {
    let spec = &route.spec;
    route_view(
        Kind::GrpcRoute,
        &route.metadata,
        spec.hostnames.as_deref(),
        |ns| {
            let parents = spec.parent_refs.iter().flatten();
            let rules = spec.rules.iter().flatten();
            (
                parents.map(|p| parent_of!(ns, p)).collect(),
                rules.map(|r| grpc_rule(ns, r)).collect(),
            )
        },
    )
}

fn grpc_rule(ns: &str, rule: &GrpcRouteRules) -> RuleView {
    let backends = rule.backend_refs.iter().flatten();
    RuleView {
        routing: gateway_rule::grpc_rule(rule),
        backends: backends.map(|b| backend_of!(ns, b)).collect(),
        name: rule.name.as_deref().map(Arc::from),
    }
}

/// A TLSRoute's view: each rule one match of every connection (`PathPrefix /`), chosen by the
/// server name alone.
pub fn tls(route: &TlsRoute) -> RouteView {
    let spec = &route.spec;
    route_view(
        Kind::TlsRoute,
        &route.metadata,
        Some(&spec.hostnames),
        |ns| {
            let parents = spec.parent_refs.iter().flatten();
            (
                parents.map(|p| parent_of!(ns, p)).collect(),
                spec.rules.iter().map(|r| tls_rule(ns, r)).collect(),
            )
        },
    )
}

fn tls_rule(ns: &str, rule: &TlsRouteRules) -> RuleView {
    let every = RuleMatch {
        path: PathMatch::prefix("/"),
        when: None,
    };
    RuleView {
        routing: Ok(RuleRouting {
            matches: vec![every],
            filters: None,
            cors: None,
        }),
        backends: rule
            .backend_refs
            .iter()
            .map(|b| backend_of!(ns, b))
            .collect(),
        name: rule.name.as_deref().map(Arc::from),
    }
}

fn hostnames(written: Option<&[String]>) -> Vec<String> {
    written
        .unwrap_or_default()
        .iter()
        .map(|h| h.trim_end_matches('.').to_ascii_lowercase())
        .collect()
}
