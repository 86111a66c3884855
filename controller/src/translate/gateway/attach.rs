//! Route attachment, pure: which listeners of a Gateway a route's parentRef attaches to and the
//! `Accepted` condition that says so, as the Gateway API spec orders the checks:
//!
//! 1. `sectionName` and `port` select listeners (none: `NoMatchingParent`);
//! 2. the listener's `allowedRoutes` must admit the route's kind and namespace (`From` `Same`,
//!    `All` or `Selector` over the namespace's labels; none: `NotAllowedByListeners`);
//! 3. the route's hostnames must intersect the listener's (none: `NoMatchingListenerHostname`).
//!
//! Hostname intersection: a listener without hostname takes the route's; a route without
//! hostnames takes the listener's; an exact name and a wildcard intersect in the exact name when
//! the wildcard covers it (one label or more); two wildcards in the longer when it is covered.

use std::collections::BTreeMap;
use std::sync::Arc;

use dataplane::table::gateway::host_matches;
use dataplane::table::TlsCert;

use super::routes::{ParentRef, RouteView};
use crate::gateway_api::conditions::Cond;
use crate::gateway_api::gateways::{
    GatewayListenersAllowedRoutesNamespacesFrom, GatewayListenersAllowedRoutesNamespacesSelector,
};
use crate::gateway_api::GROUP;
use crate::object::NsName;

/// Which namespaces' routes a listener admits.
#[derive(Clone, Debug, PartialEq)]
pub enum FromNamespaces {
    /// The Gateway's own (the default).
    Same,
    /// Every namespace.
    All,
    /// Namespaces whose labels the selector matches.
    Selector(GatewayListenersAllowedRoutesNamespacesSelector),
}

/// One listener of one of our Gateways, as attachment and serving need it.
#[derive(Clone, Debug)]
pub struct ListenerModel {
    /// The listener's name.
    pub name: String,
    /// Its port.
    pub port: i32,
    /// The pod port duet serves it on (`None`: none assigned yet).
    pub pod_port: Option<u16>,
    /// Its hostname, lower case.
    pub hostname: Option<String>,
    /// HTTPS.
    pub tls: bool,
    /// Protocol TLS: TLSRoutes by SNI, relayed unterminated (mode Passthrough) or terminated
    /// with `cert` (mode Terminate).
    pub tls_routes: bool,
    /// The route kinds it admits.
    pub kinds: Vec<&'static str>,
    /// The namespaces whose routes it admits.
    pub from: FromNamespaces,
    /// Accepted and not conflicted, in an accepted Gateway: routes may attach.
    pub valid: bool,
    /// Its certificate references resolve (an HTTPS listener whose do not still takes routes,
    /// counted in `attachedRoutes` as the spec asks, but is not served).
    pub servable: bool,
    /// The certificate of an HTTPS listener.
    pub cert: Option<Arc<TlsCert>>,
    /// The client certificates an HTTPS listener's port verifies (its Gateway's `tls.frontend`).
    pub client_auth: Option<Arc<dataplane::client_auth::ClientAuth>>,
}

/// One of our Gateways.
#[derive(Clone, Debug)]
pub struct GatewayModel {
    /// `Gateway`, or `ListenerSet` for the listeners a Gateway admitted from one.
    pub kind: &'static str,
    /// Namespace and name.
    pub key: NsName,
    /// Its listeners, in spec order.
    pub listeners: Vec<ListenerModel>,
    /// The certificate it presents to TLS backends (`tls.backend.clientCertificateRef`), when
    /// it names one that resolves.
    pub client_cert: Option<dataplane::upstream_tls::ClientCert>,
}

/// A listener a parentRef attached to, with the hostnames the route serves there (`None`: every
/// host the listener takes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attached {
    /// The listener's index in its Gateway.
    pub listener: usize,
    /// The intersected hostnames.
    pub hostnames: Vec<Option<String>>,
}

/// Attaches one parentRef of `route` to `gateway`: the `Accepted` condition and the listeners.
pub fn attach(
    route: &RouteView,
    parent: &ParentRef,
    gateway: &GatewayModel,
    namespaces: &BTreeMap<String, BTreeMap<String, String>>,
) -> (Cond, Vec<Attached>) {
    let selected: Vec<(usize, &ListenerModel)> = gateway
        .listeners
        .iter()
        .enumerate()
        .filter(|(_, l)| l.valid)
        .filter(|(_, l)| parent.section_name.as_ref().is_none_or(|s| *s == l.name))
        .filter(|(_, l)| parent.port.is_none_or(|p| p == l.port))
        .collect();
    if selected.is_empty() {
        let message = "no valid listener of the Gateway has this sectionName and port";
        return (
            Cond::no("Accepted", "NoMatchingParent", message),
            Vec::new(),
        );
    }
    let allowed: Vec<(usize, &ListenerModel)> = selected
        .into_iter()
        .filter(|(_, l)| l.kinds.contains(&route.kind_name()))
        .filter(|(_, l)| {
            admits_namespace(l, &gateway.key.namespace, &route.key.namespace, namespaces)
        })
        .collect();
    if allowed.is_empty() {
        let message = format!(
            "no listener admits {}s of namespace {}",
            route.kind_name(),
            route.key.namespace
        );
        return (
            Cond::no("Accepted", "NotAllowedByListeners", message),
            Vec::new(),
        );
    }
    let attached: Vec<Attached> = allowed
        .into_iter()
        .filter_map(|(i, l)| {
            let hostnames = intersect(l.hostname.as_deref(), &route.hostnames);
            (!hostnames.is_empty()).then_some(Attached {
                listener: i,
                hostnames,
            })
        })
        .collect();
    if attached.is_empty() {
        let message = "no hostname of the route matches a listener's hostname";
        return (
            Cond::no("Accepted", "NoMatchingListenerHostname", message),
            Vec::new(),
        );
    }
    (Cond::yes("Accepted", "Accepted", ""), attached)
}

/// Whether a parentRef names a Gateway or a ListenerSet (`gateway.networking.k8s.io`).
pub fn names_a_gateway(parent: &ParentRef) -> bool {
    parent.group == GROUP && matches!(parent.kind.as_str(), "Gateway" | "ListenerSet")
}

/// Whether a listener of a Gateway in `gateway_ns` admits routes of `route_ns`.
fn admits_namespace(
    listener: &ListenerModel,
    gateway_ns: &str,
    route_ns: &str,
    namespaces: &BTreeMap<String, BTreeMap<String, String>>,
) -> bool {
    match &listener.from {
        FromNamespaces::Same => gateway_ns == route_ns,
        FromNamespaces::All => true,
        FromNamespaces::Selector(selector) => {
            let empty = BTreeMap::new();
            let labels = namespaces.get(route_ns).unwrap_or(&empty);
            selects(selector, labels)
        }
    }
}

/// A label selector's verdict on a label set (`In`, `NotIn`, `Exists`, `DoesNotExist`; an
/// unknown operator selects nothing).
pub fn selects(
    selector: &GatewayListenersAllowedRoutesNamespacesSelector,
    labels: &BTreeMap<String, String>,
) -> bool {
    let by_label = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let by_expression = selector.match_expressions.iter().flatten().all(|e| {
        let values = e.values.as_deref().unwrap_or_default();
        let value = labels.get(&e.key);
        match e.operator.as_str() {
            "In" => value.is_some_and(|v| values.contains(v)),
            "NotIn" => value.is_none_or(|v| !values.contains(v)),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            _ => false,
        }
    });
    by_label && by_expression
}

/// The `From` of a listener's `allowedRoutes.namespaces`.
pub fn from_namespaces(
    from: Option<&GatewayListenersAllowedRoutesNamespacesFrom>,
    selector: Option<&GatewayListenersAllowedRoutesNamespacesSelector>,
) -> FromNamespaces {
    match from {
        Some(GatewayListenersAllowedRoutesNamespacesFrom::All) => FromNamespaces::All,
        Some(GatewayListenersAllowedRoutesNamespacesFrom::Selector) => {
            FromNamespaces::Selector(selector.cloned().unwrap_or_default())
        }
        _ => FromNamespaces::Same,
    }
}

/// The hostnames a route serves on a listener (see the module documentation); empty when they
/// do not intersect.
pub fn intersect(listener: Option<&str>, route: &[String]) -> Vec<Option<String>> {
    let mut out: Vec<Option<String>> = match (listener, route.is_empty()) {
        (None, true) => vec![None],
        (None, false) => route.iter().cloned().map(Some).collect(),
        (Some(l), true) => vec![Some(l.to_owned())],
        (Some(l), false) => route.iter().filter_map(|r| pair(l, r)).map(Some).collect(),
    };
    out.sort();
    out.dedup();
    out
}

fn pair(listener: &str, route: &str) -> Option<String> {
    let wild = |h: &str| h.starts_with("*.");
    let covered = match (wild(listener), wild(route)) {
        (false, false) => (listener == route).then_some(route),
        (true, false) => host_matches(listener, route).then_some(route),
        (false, true) => host_matches(route, listener).then_some(listener),
        (true, true) if listener == route || host_matches(listener, route) => Some(route),
        (true, true) => host_matches(route, listener).then_some(listener),
    };
    covered.map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(listener: Option<&str>, route: &[&str]) -> Vec<Option<String>> {
        let route: Vec<String> = route.iter().map(|s| s.to_string()).collect();
        intersect(listener, &route)
    }

    fn some(h: &str) -> Option<String> {
        Some(h.to_owned())
    }

    #[test]
    fn hostnames_intersect_as_the_spec_says() {
        assert_eq!(hosts(None, &[]), vec![None]);
        assert_eq!(hosts(None, &["a.com"]), vec![some("a.com")]);
        assert_eq!(hosts(Some("a.com"), &[]), vec![some("a.com")]);
        assert_eq!(
            hosts(Some("a.com"), &["b.com"]),
            Vec::<Option<String>>::new()
        );
        assert_eq!(
            hosts(
                Some("*.example.com"),
                &["foo.example.com", "foo.bar.example.com", "example.com"]
            ),
            vec![some("foo.bar.example.com"), some("foo.example.com")]
        );
        assert_eq!(
            hosts(Some("foo.example.com"), &["*.example.com"]),
            vec![some("foo.example.com")]
        );
        assert_eq!(
            hosts(Some("*.example.com"), &["*.foo.example.com"]),
            vec![some("*.foo.example.com")]
        );
        assert_eq!(
            hosts(Some("*.foo.example.com"), &["*.example.com"]),
            vec![some("*.foo.example.com")]
        );
        assert_eq!(
            hosts(Some("*.a.com"), &["*.b.com"]),
            Vec::<Option<String>>::new()
        );
    }

    #[test]
    fn selectors_match_labels_and_expressions() {
        let labels: BTreeMap<String, String> = [("env".to_owned(), "prod".to_owned())]
            .into_iter()
            .collect();
        let by = |labels_json: serde_json::Value| {
            let s: GatewayListenersAllowedRoutesNamespacesSelector =
                serde_json::from_value(labels_json).unwrap();
            selects(&s, &labels)
        };
        assert!(by(serde_json::json!({"matchLabels": {"env": "prod"}})));
        assert!(!by(serde_json::json!({"matchLabels": {"env": "dev"}})));
        assert!(by(
            serde_json::json!({"matchExpressions": [{"key": "env", "operator": "In", "values": ["prod", "x"]}]})
        ));
        assert!(!by(
            serde_json::json!({"matchExpressions": [{"key": "env", "operator": "DoesNotExist"}]})
        ));
        assert!(!by(
            serde_json::json!({"matchExpressions": [{"key": "env", "operator": "Bogus"}]})
        ));
    }
}
