//! The Gateway API processor: our Gateways (their class names `--gateway-controller-name`),
//! the HTTPRoutes, GRPCRoutes and TLSRoutes attached to them and the ReferenceGrants they rely on, into the
//! [`Translation`]: a [`GatewayTable`] of listeners per pod port, the backends it uses, and a
//! [`GatewayReport`] that the status writers publish, so what is served and what status says
//! come from the same pure functions.
//!
//! - Listeners: those [`listeners::check`] finds valid, in a Gateway it accepts, with their
//!   certificates resolved ([`refs::problem`]) and, on HTTPS listeners, the client certificate
//!   validation of their port ([`frontend`]) resolved too; the pod port is the `targetPort` of the Gateway's
//!   Service `duet-NAME` (Kubernetes mode) or the listener port (`--manifests` mode).
//! - ListenerSets ([`listener_sets`]): those a Gateway admits add listeners, after its own, on
//!   its pod ports; routes reach them through parentRefs of kind `ListenerSet`.
//! - Attachment per parentRef ([`attach`]); routes oldest first (creationTimestamp, then
//!   namespace/name).
//! - Rules: per host entry of a listener, sorted by the spec's precedence: path Exact, then
//!   PathPrefix, then RegularExpression, longer first; then the older route, then
//!   namespace/name, then rule and match order. A match that also tests headers, query
//!   parameters or the method is not served here (those matches are `gateway_rule`'s); filters
//!   and timeouts are not applied here either.
//! - backendRefs ([`backends`]): Services, weighted, cross-namespace with a ReferenceGrant;
//!   one that does not resolve sends its share of requests to 500.
//! - TLSRoutes: on TLS listeners (a [`GatewayPort`] of `tls_routes`), each rule one
//!   `PathPrefix /` entry per intersected hostname, which the dataplane looks up by SNI; a
//!   listener in mode Terminate carries its certificate, one in mode Passthrough none.

mod attach;
pub mod backend_tls;
mod backends;
pub mod frontend;
pub mod listener_sets;
pub mod listeners;
pub mod refs;
mod routes;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use dataplane::table::gateway::{
    GatewayListener, GatewayPort, GatewayRule, GatewayTable, ListenerRoutes,
};
use dataplane::upstream_tls::UpstreamTls;
use dataplane::{FamilyPolicy, Origin, OriginKind};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};

use self::attach::{Attached, GatewayModel, ListenerModel};
use self::routes::RouteView;
use super::translation::{GatewayOutput, Translation};
use super::{Config, Inputs, Reason, UPSTREAM_FAMILY_ANNOTATION};
use crate::gateway_api::conditions::Cond;
use crate::gateway_api::gateways::GatewayListeners;
use crate::gateway_api::report::{GatewayReport, ParentReport, RouteReport};
use crate::gateway_api::{is_ours, names};
use crate::gateway_api::{
    BackendTlsPolicy, Gateway, GatewayClass, GrpcRoute, HttpRoute, ListenerSet, ReferenceGrant,
    TlsRoute,
};
use crate::object::{Kind, NsName, ObjectKey};

pub use attach::intersect;

/// The Gateway API objects (and Namespaces, whose labels select routes) to translate.
#[derive(Clone, Debug, Default)]
pub struct GatewayInputs<'a> {
    /// Every Namespace.
    pub namespaces: Vec<&'a Namespace>,
    /// Every GatewayClass.
    pub classes: Vec<&'a GatewayClass>,
    /// Every Gateway.
    pub gateways: Vec<&'a Gateway>,
    /// Every HTTPRoute.
    pub http_routes: Vec<&'a HttpRoute>,
    /// Every GRPCRoute.
    pub grpc_routes: Vec<&'a GrpcRoute>,
    /// Every TLSRoute.
    pub tls_routes: Vec<&'a TlsRoute>,
    /// Every ReferenceGrant.
    pub grants: Vec<&'a ReferenceGrant>,
    /// Every ListenerSet.
    pub listener_sets: Vec<&'a ListenerSet>,
    /// Every BackendTLSPolicy.
    pub backend_tls_policies: Vec<&'a BackendTlsPolicy>,
    /// Every ConfigMap (the CA certificates of BackendTLSPolicies).
    pub config_maps: Vec<&'a ConfigMap>,
}

/// Feeds the Gateway API objects into a translation.
pub(crate) struct GatewayProcessor<'a> {
    inputs: GatewayInputs<'a>,
    config: &'a Config,
}

/// A listener's client certificate settings and what is wrong with their references.
type FrontendOf = (
    Option<Arc<dataplane::client_auth::ClientAuth>>,
    Option<crate::gateway_api::report::FrontendProblem>,
);

/// A route's rule entries on one listener host, before sorting.
type Entries = BTreeMap<Option<String>, Vec<(SortKey, GatewayRule)>>;

/// The precedence of a rule entry within a host entry (smaller wins).
type SortKey = (backends::Rank, i64, NsName, usize, usize);

impl<'a> GatewayProcessor<'a> {
    /// The processor of the Gateway API objects of `inputs`.
    pub(crate) fn new(inputs: &Inputs<'a>, config: &'a Config) -> GatewayProcessor<'a> {
        GatewayProcessor {
            inputs: inputs.gateway_api.clone(),
            config,
        }
    }

    /// Builds the listeners, attaches the routes, and writes the table and report into `t`.
    pub(crate) fn run(self, t: &mut Translation<'_>) {
        let namespaces: BTreeMap<String, BTreeMap<String, String>> = self
            .inputs
            .namespaces
            .iter()
            .map(|n| {
                let name = n.metadata.name.clone().unwrap_or_default();
                (name, n.metadata.labels.clone().unwrap_or_default())
            })
            .collect();
        let mut report = GatewayReport::default();
        let gateways = self.gateways(t, &namespaces, &mut report);
        if gateways.is_empty() {
            return;
        }
        let mut views: Vec<RouteView> = self
            .inputs
            .http_routes
            .iter()
            .map(|r| routes::http(r))
            .chain(self.inputs.grpc_routes.iter().map(|r| routes::grpc(r)))
            .chain(self.inputs.tls_routes.iter().map(|r| routes::tls(r)))
            .collect();
        views.sort_by(|a, b| (a.created, &a.key, a.kind).cmp(&(b.created, &b.key, b.kind)));
        for g in gateways.iter().filter(|g| g.kind == "Gateway") {
            for l in &g.listeners {
                report.attached.insert((g.key.clone(), l.name.clone()), 0);
            }
        }
        // Per (Gateway index, listener index): the rules by host.
        let mut entries: BTreeMap<(usize, usize), Entries> = BTreeMap::new();
        let mut tls =
            backend_tls::Policies::new(&self.inputs.backend_tls_policies, &self.inputs.config_maps);
        let mut out = RouteOut {
            report: &mut report,
            entries: &mut entries,
            tls: &mut tls,
            client_tls: BTreeMap::new(),
        };
        for view in &views {
            self.add_route(t, view, &gateways, &namespaces, &mut out);
        }
        report.policies = tls.report();
        t.gateways = GatewayOutput {
            table: table(&gateways, entries),
            report,
        };
    }

    /// Our Gateways with their listeners judged, each followed by the ListenerSets it admits
    /// (whose status goes into `report`).
    fn gateways(
        &self,
        t: &mut Translation<'_>,
        namespaces: &BTreeMap<String, BTreeMap<String, String>>,
        report: &mut GatewayReport,
    ) -> Vec<GatewayModel> {
        let name = &self.config.gateway.controller_name;
        let ours: BTreeSet<&str> = self
            .inputs
            .classes
            .iter()
            .filter(|c| is_ours(c, name))
            .filter_map(|c| c.metadata.name.as_deref())
            .collect();
        let grants: Vec<ReferenceGrant> = self.inputs.grants.iter().map(|g| (*g).clone()).collect();
        let mut gateways: Vec<&Gateway> = self
            .inputs
            .gateways
            .iter()
            .copied()
            .filter(|g| ours.contains(g.spec.gateway_class_name.as_str()))
            .collect();
        gateways.sort_by_key(|g| NsName::of(&g.metadata));
        let mut out = Vec::new();
        for g in gateways {
            let model = self.gateway(t, g, &grants, report);
            let sets = self.listener_sets(t, g, &model, namespaces, &grants, report);
            out.push(model);
            out.extend(sets);
        }
        out
    }

    /// One Gateway: its listeners, with their pod ports, certificates and client certificate
    /// validation (whose problems go into `report`).
    fn gateway(
        &self,
        t: &mut Translation<'_>,
        gateway: &Gateway,
        grants: &[ReferenceGrant],
        report: &mut GatewayReport,
    ) -> GatewayModel {
        let key = NsName::of(&gateway.metadata);
        let verdicts = listeners::check(&gateway.spec);
        let accepted = listeners::gateway_accepted(&gateway.spec, &verdicts).status;
        let ports = self.pod_ports(t, gateway, &key);
        let owner_ns = key.namespace.as_str();
        let front = self.frontend(t, &gateway.spec, owner_ns, &gateway.spec.listeners, grants);
        let listeners = gateway
            .spec
            .listeners
            .iter()
            .zip(&verdicts)
            .zip(front)
            .map(|((l, v), (auth, problem))| {
                let owner = ("Gateway", owner_ns);
                let mut model = listener_model(t, l, v, accepted, &ports, owner, grants);
                model.client_auth = auth;
                if let Some(problem) = problem {
                    model.servable = false;
                    report
                        .frontend
                        .insert((key.clone(), l.name.clone()), problem);
                }
                model
            })
            .collect();
        let client_cert = client_cert(t, gateway, &key.namespace, grants);
        GatewayModel {
            kind: "Gateway",
            key,
            listeners,
            client_cert,
        }
    }

    /// The ListenerSets naming `gateway`: the models of those it admits, on its pod ports, and
    /// every one's status in `report`.
    fn listener_sets(
        &self,
        t: &mut Translation<'_>,
        gateway: &Gateway,
        model: &GatewayModel,
        namespaces: &BTreeMap<String, BTreeMap<String, String>>,
        grants: &[ReferenceGrant],
        report: &mut GatewayReport,
    ) -> Vec<GatewayModel> {
        let candidates = listener_sets::of_gateway(gateway, &self.inputs.listener_sets);
        let (admitted, refused): (Vec<&ListenerSet>, Vec<&ListenerSet>) =
            candidates.into_iter().partition(|s| {
                let ns = s.metadata.namespace.as_deref().unwrap_or_default();
                listener_sets::admits(&gateway.spec, &model.key.namespace, ns, namespaces)
            });
        for set in refused {
            let report_entry = listener_sets::not_allowed(set);
            report
                .listener_sets
                .insert(NsName::of(&set.metadata), report_entry);
        }
        let verdicts = listeners::check(&gateway.spec);
        let accepted = listeners::gateway_accepted(&gateway.spec, &verdicts).status;
        let mut judged = listener_sets::judge(&gateway.spec.listeners, &admitted);
        let ports = self.set_pod_ports(t, gateway, &model.key, &judged, report);
        let mut out = Vec::new();
        for j in &mut judged {
            let owner = ("ListenerSet", j.key.namespace.as_str());
            for (l, v) in j.listeners.iter().zip(j.verdicts.iter_mut()) {
                if let Err(Some(problem)) = certificate_of(t, l, owner, grants) {
                    v.resolved = problem;
                }
            }
            // The Gateway's client certificate validation holds on its ports, whoever owns the
            // listener.
            let gateway_ns = model.key.namespace.as_str();
            let front = self.frontend(t, &gateway.spec, gateway_ns, &j.listeners, grants);
            let mut auths = Vec::new();
            for (v, (auth, problem)) in j.verdicts.iter_mut().zip(front) {
                if let Some(p) = problem {
                    p.apply(&mut v.accepted, &mut v.resolved);
                }
                auths.push(auth);
            }
            let listeners: Vec<ListenerModel> = j
                .listeners
                .iter()
                .zip(&j.verdicts)
                .zip(auths)
                .map(|((l, v), auth)| {
                    let mut m = listener_model(t, l, v, accepted, &ports, owner, grants);
                    m.client_auth = auth;
                    m
                })
                .collect();
            let servable: Vec<bool> = listeners.iter().map(|l| l.servable).collect();
            let entry = listener_sets::report(j, &servable);
            if entry.conditions[0].status {
                *report
                    .attached_listener_sets
                    .entry(model.key.clone())
                    .or_default() += 1;
            }
            report.listener_sets.insert(j.key.clone(), entry);
            out.push(GatewayModel {
                kind: "ListenerSet",
                key: j.key.clone(),
                listeners,
                client_cert: model.client_cert.clone(),
            });
        }
        report
            .attached_listener_sets
            .entry(model.key.clone())
            .or_default();
        out
    }

    /// Per listener of `listeners` (in order): the client certificates its port verifies
    /// (HTTPS listeners whose port has a `tls.frontend` validation in `spec`, the Gateway's,
    /// whose namespace is `owner_ns`), and what is wrong with its references, if anything.
    fn frontend(
        &self,
        t: &mut Translation<'_>,
        spec: &crate::gateway_api::gateways::GatewaySpec,
        owner_ns: &str,
        listeners: &[GatewayListeners],
        grants: &[ReferenceGrant],
    ) -> Vec<FrontendOf> {
        let mut by_port: BTreeMap<i32, FrontendOf> = BTreeMap::new();
        let config_maps = &self.inputs.config_maps;
        let mut fetch = |kind: &str, ns: &str, name: &str| -> frontend::Found {
            if kind == "ConfigMap" {
                let found = config_maps.iter().find(|c| {
                    c.metadata.namespace.as_deref() == Some(ns)
                        && c.metadata.name.as_deref() == Some(name)
                })?;
                let text = found.data.as_ref().and_then(|d| d.get("ca.crt"));
                let binary = found.binary_data.as_ref().and_then(|d| d.get("ca.crt"));
                return Some(
                    text.map(|s| s.as_bytes().to_vec())
                        .or_else(|| binary.map(|b| b.0.clone())),
                );
            }
            let key = NsName::new(ns, name);
            t.references.secrets.insert(key.clone());
            let secret = t.secrets.get(&key)?;
            Some(
                secret
                    .data
                    .as_ref()
                    .and_then(|d| d.get("ca.crt"))
                    .map(|b| b.0.clone()),
            )
        };
        listeners
            .iter()
            .map(|l| {
                if l.protocol != "HTTPS" {
                    return (None, None);
                }
                let resolved = by_port
                    .entry(l.port)
                    .or_insert_with(|| match frontend::validation(spec, l.port) {
                        Some(v) => frontend::resolve(&v, owner_ns, grants, &mut fetch),
                        None => (None, None),
                    });
                resolved.clone()
            })
            .collect()
    }

    /// listener port -> pod port for the listeners of the Gateway's ListenerSets (the Gateway's
    /// Service's in Kubernetes mode, the listener port itself in `--manifests` mode), noting in
    /// `report` the ports of their valid listeners, which the Service must cover.
    fn set_pod_ports(
        &self,
        t: &mut Translation<'_>,
        gateway: &Gateway,
        key: &NsName,
        judged: &[listener_sets::Judged<'_>],
        report: &mut GatewayReport,
    ) -> BTreeMap<u16, u16> {
        let valid = || {
            judged
                .iter()
                .flat_map(|j| j.listeners.iter().zip(&j.verdicts))
                .filter(|(_, v)| v.valid())
                .map(|(l, _)| l)
        };
        let wanted: BTreeSet<u16> = valid().filter_map(|l| u16::try_from(l.port).ok()).collect();
        let https: BTreeSet<u16> = valid()
            .filter(|l| l.protocol == "HTTPS")
            .filter_map(|l| u16::try_from(l.port).ok())
            .collect();
        if !https.is_empty() {
            report.listener_set_https_ports.insert(key.clone(), https);
        }
        let mut ports = self.pod_ports(t, gateway, key);
        if !self.config.gateway.ports_from_services {
            ports.extend(wanted.iter().map(|p| (*p, *p)));
        }
        if !wanted.is_empty() {
            report.listener_set_ports.insert(key.clone(), wanted);
        }
        ports
    }

    /// listener port -> pod port: the Gateway's Service's in Kubernetes mode, the listener port
    /// itself in `--manifests` mode.
    fn pod_ports(
        &self,
        t: &mut Translation<'_>,
        gateway: &Gateway,
        key: &NsName,
    ) -> BTreeMap<u16, u16> {
        if !self.config.gateway.ports_from_services {
            return gateway
                .spec
                .listeners
                .iter()
                .filter_map(|l| u16::try_from(l.port).ok())
                .map(|p| (p, p))
                .collect();
        }
        let name = NsName::new(key.namespace.clone(), names::service_name(&key.name));
        t.references.services.insert(name.clone());
        let uid = gateway.metadata.uid.as_deref();
        let owned = |s: &&dyn crate::stored::ServiceView| {
            s.owner_references()
                .iter()
                .any(|o| Some(o.uid.as_str()) == uid)
        };
        t.service(&name)
            .filter(owned)
            .map(|s| names::ports_held(s.ports()))
            .unwrap_or_default()
    }

    /// Attaches one route to our Gateways, resolves its backends and adds its rules.
    fn add_route(
        &self,
        t: &mut Translation<'_>,
        view: &RouteView,
        gateways: &[GatewayModel],
        namespaces: &BTreeMap<String, BTreeMap<String, String>>,
        out: &mut RouteOut<'_>,
    ) {
        let mut parents = Vec::new();
        let mut attached: Vec<(usize, Attached)> = Vec::new();
        for parent in view.parents.iter().filter(|p| attach::names_a_gateway(p)) {
            let Some(gi) = gateways.iter().position(|g| {
                g.kind == parent.kind
                    && g.key.namespace == parent.namespace
                    && g.key.name == parent.name
            }) else {
                continue;
            };
            let (accepted, listeners) = attach::attach(view, parent, &gateways[gi], namespaces);
            parents.push((parent.written.clone(), accepted));
            attached.extend(listeners.into_iter().map(|a| (gi, a)));
        }
        if parents.is_empty() {
            return;
        }
        let key = ObjectKey::new(view.kind, &*view.key.namespace, &*view.key.name);
        let policy = family_policy(t, &key, view);
        let origin = origin(view);
        let (rules, resolved, refused) =
            backends::rules(t, &key, view, policy, &origin, &self.inputs.grants, out.tls);
        let ancestors: BTreeSet<&NsName> =
            attached.iter().map(|(gi, _)| &gateways[*gi].key).collect();
        out.tls.used_by(ancestors.iter().copied());
        if let Some(refusal) = refused {
            // A rule duet cannot serve (an unsupported filter, a bad regex) is left out, and the
            // route says why on each parent that accepted it.
            for (_, accepted) in parents.iter_mut().filter(|(_, a)| a.status) {
                *accepted = Cond::no("Accepted", refusal.reason, refusal.message.clone());
            }
        }
        out.add_entries(view, gateways, attached, &rules);
        let parents = parents
            .into_iter()
            .map(|(parent_ref, accepted)| ParentReport {
                parent_ref,
                accepted,
                resolved: resolved.clone(),
            })
            .collect();
        let route_report = RouteReport {
            generation: view.generation,
            uid: view.uid.clone(),
            parents,
        };
        out.report
            .routes
            .insert((view.kind, view.key.clone()), route_report);
    }
}

/// Counts a route attached to listener `li` of `g` (a Gateway's or a ListenerSet's).
fn count_attached(report: &mut GatewayReport, g: &GatewayModel, li: usize) {
    let name = &g.listeners[li].name;
    if g.kind == "ListenerSet" {
        let set = report.listener_sets.get_mut(&g.key);
        let entry = set.and_then(|s| s.listeners.iter_mut().find(|l| l.name == *name));
        if let Some(entry) = entry {
            entry.attached += 1;
        }
    } else {
        *report
            .attached
            .entry((g.key.clone(), name.clone()))
            .or_default() += 1;
    }
}

/// One listener's model: its pod port (from `ports`, listener port to pod port) and its
/// certificate.
fn listener_model(
    t: &mut Translation<'_>,
    l: &GatewayListeners,
    v: &listeners::Verdict,
    accepted: bool,
    ports: &BTreeMap<u16, u16>,
    owner: (&str, &str),
    grants: &[ReferenceGrant],
) -> ListenerModel {
    let cert = certificate_of(t, l, owner, grants).map_err(|_| ());
    let pod_port = u16::try_from(l.port)
        .ok()
        .and_then(|p| ports.get(&p).copied());
    let allowed = l.allowed_routes.as_ref();
    let namespaces = allowed.and_then(|a| a.namespaces.as_ref());
    ListenerModel {
        name: l.name.clone(),
        port: l.port,
        pod_port,
        hostname: l.hostname.as_ref().map(|h| h.to_ascii_lowercase()),
        tls: l.protocol == "HTTPS",
        tls_routes: l.protocol == "TLS",
        kinds: v.kinds.clone(),
        from: attach::from_namespaces(
            namespaces.and_then(|n| n.from.as_ref()),
            namespaces.and_then(|n| n.selector.as_ref()),
        ),
        valid: accepted && v.valid(),
        servable: cert.is_ok(),
        cert: cert.ok().flatten(),
        client_auth: None,
    }
}

impl RouteOut<'_> {
    /// Adds a route's rules to the listeners it attached to (`(Gateway index, attachment)`),
    /// counting each listener once in the report.
    fn add_entries(
        &mut self,
        view: &RouteView,
        gateways: &[GatewayModel],
        attached: Vec<(usize, Attached)>,
        rules: &[backends::RuleEntry],
    ) {
        let mut counted: BTreeSet<(usize, usize)> = BTreeSet::new();
        for (gi, a) in attached {
            let g = &gateways[gi];
            if counted.insert((gi, a.listener)) {
                count_attached(self.report, g, a.listener);
            }
            let port = g.listeners[a.listener].port;
            let cert = g.client_cert.as_ref();
            let by_host = self.entries.entry((gi, a.listener)).or_default();
            for host in &a.hostnames {
                let list = by_host.entry(host.clone()).or_default();
                list.extend(rules.iter().map(|(rank, ri, mi, rule)| {
                    let rule = with_client_cert(rule, gi, cert, &mut self.client_tls);
                    (
                        (*rank, view.created, view.key.clone(), *ri, *mi),
                        at_listener_port(&rule, port),
                    )
                }));
            }
        }
    }
}

/// Where adding a route writes: the report, the rule entries per listener, and the
/// BackendTLSPolicies its backends use.
struct RouteOut<'a> {
    report: &'a mut GatewayReport,
    entries: &'a mut BTreeMap<(usize, usize), Entries>,
    tls: &'a mut backend_tls::Policies,
    /// Upstream TLS settings with a Gateway's client certificate, per setting and Gateway.
    client_tls: BTreeMap<(usize, usize), Arc<dataplane::upstream_tls::UpstreamTls>>,
}

/// A rule as served on a listener of port `port`: a `RequestRedirect` without port and scheme
/// redirects to the listener's port (the spec's rule), not to the one in the client's `Host`.
fn at_listener_port(rule: &GatewayRule, port: i32) -> GatewayRule {
    let mut rule = rule.clone();
    let filters = rule.action.filters.as_deref();
    let Some(redirect) = filters.and_then(|f| f.redirect.as_ref()) else {
        return rule;
    };
    let listener_port = u16::try_from(port).ok();
    if redirect.port.is_none()
        && redirect.scheme.is_none()
        && redirect.listener_port != listener_port
    {
        let mut filters = filters.cloned().unwrap_or_default();
        if let Some(r) = filters.redirect.as_mut() {
            r.listener_port = listener_port;
        }
        rule.action.filters = Some(Arc::new(filters));
    }
    rule
}

/// The route as the origin of its rules.
fn origin(view: &RouteView) -> Origin {
    Origin {
        kind: match view.kind {
            Kind::GrpcRoute => OriginKind::GrpcRoute,
            Kind::TlsRoute => OriginKind::TlsRoute,
            _ => OriginKind::HttpRoute,
        },
        namespace: view.key.namespace.as_str().into(),
        name: view.key.name.as_str().into(),
        created: view.created,
    }
}

/// The route's family policy: `duet.dev/upstream-family`, else `--upstream-family`.
fn family_policy(t: &mut Translation<'_>, key: &ObjectKey, view: &RouteView) -> FamilyPolicy {
    let global = t.config.family_policy;
    let Some(value) = view.annotations.get(UPSTREAM_FAMILY_ANNOTATION) else {
        return global;
    };
    match value.trim().parse::<FamilyPolicy>() {
        Ok(policy) => policy,
        Err(e) => {
            let message = format!("{UPSTREAM_FAMILY_ANNOTATION}: {e}; using {global:?}");
            t.diagnose(key, Reason::InvalidAnnotation, message);
            global
        }
    }
}

/// The certificate of a listener of `owner` (kind, namespace): `None` unless duet terminates
/// TLS there ([`listeners::terminates`]); `Err` when
/// it does not resolve, with the reason when references do not.
fn certificate_of(
    t: &mut Translation<'_>,
    listener: &GatewayListeners,
    owner: (&str, &str),
    grants: &[ReferenceGrant],
) -> Result<Option<Arc<dataplane::table::TlsCert>>, Option<Cond>> {
    if !listeners::terminates(listener) {
        return Ok(None);
    }
    let (kind, gateway_ns) = owner;
    let keys = refs::certificate_refs(listener, gateway_ns);
    for (namespace, name) in &keys {
        let key = NsName::new(namespace.clone(), name.clone());
        t.references.secrets.insert(key);
    }
    let secrets: BTreeMap<refs::SecretKey, Option<Secret>> = keys
        .iter()
        .map(|k| {
            let found = t.secrets.get(&NsName::new(k.0.clone(), k.1.clone()));
            (k.clone(), found.map(|s| (*s).clone()))
        })
        .collect();
    if let Some(problem) = refs::problem_of(kind, listener, gateway_ns, grants, &secrets) {
        return Err(Some(problem));
    }
    let Some(first) = keys.first() else {
        return Ok(None);
    };
    let Some(Some(secret)) = secrets.get(first) else {
        return Err(None);
    };
    let data = secret.data.as_ref();
    let field = |k: &str| data.and_then(|d| d.get(k)).map(|b| b.0.as_slice());
    let source = format!("{}/{}", first.0, first.1);
    match (field("tls.crt"), field("tls.key")) {
        (Some(crt), Some(key)) => dataplane::tls::load_pem(&source, crt, key)
            .map(|c| Some(Arc::new(c)))
            .map_err(|_| None),
        _ => Err(None),
    }
}

/// The certificate a Gateway presents to TLS backends: its `tls.backend.clientCertificateRef`,
/// when that resolves ([`refs::client_certificate_condition`]); else none is presented.
fn client_cert(
    t: &mut Translation<'_>,
    gateway: &Gateway,
    gateway_ns: &str,
    grants: &[ReferenceGrant],
) -> Option<dataplane::upstream_tls::ClientCert> {
    let (key, _) = refs::client_certificate_ref(&gateway.spec, gateway_ns)?;
    let name = NsName::new(key.0.clone(), key.1.clone());
    t.references.secrets.insert(name.clone());
    let secret = t.secrets.get(&name).map(|s| (*s).clone());
    let field = |k: &str| {
        let data = secret.as_ref()?.data.as_ref()?;
        data.get(k).map(|b| Arc::<[u8]>::from(b.0.as_slice()))
    };
    let (cert_pem, key_pem) = (field("tls.crt")?, field("tls.key")?);
    let secrets = BTreeMap::from([(key, secret)]);
    let cond = refs::client_certificate_condition(&gateway.spec, gateway_ns, grants, &secrets)?;
    cond.status.then(|| dataplane::upstream_tls::ClientCert {
        source: name.to_string().into(),
        cert_pem,
        key_pem,
    })
}

/// The rule as served on a Gateway: its upstream TLS presents the Gateway's client certificate
/// (settings made once per TLS setting and Gateway, in `made`).
fn with_client_cert(
    rule: &GatewayRule,
    gi: usize,
    cert: Option<&dataplane::upstream_tls::ClientCert>,
    made: &mut BTreeMap<(usize, usize), Arc<dataplane::upstream_tls::UpstreamTls>>,
) -> GatewayRule {
    let (Some(cert), Some(tls)) = (cert, &rule.action.upstream_tls) else {
        return rule.clone();
    };
    let settings = made
        .entry((Arc::as_ptr(tls) as usize, gi))
        .or_insert_with(|| Arc::new(UpstreamTls::clone(tls).with_client_cert(cert.clone())))
        .clone();
    let mut rule = rule.clone();
    rule.action.upstream_tls = Some(settings);
    rule
}

/// The listeners of every pod port, with their rules sorted.
fn table(
    gateways: &[GatewayModel],
    mut entries: BTreeMap<(usize, usize), Entries>,
) -> GatewayTable {
    let mut ports: BTreeMap<u16, GatewayPort> = BTreeMap::new();
    for (gi, g) in gateways.iter().enumerate() {
        for (li, l) in g.listeners.iter().enumerate() {
            let (Some(pod_port), true) = (l.pod_port, l.valid && l.servable) else {
                continue;
            };
            let routes = listener_routes(entries.remove(&(gi, li)).unwrap_or_default());
            let port = ports.entry(pod_port).or_default();
            port.tls |= l.tls;
            port.tls_routes |= l.tls_routes;
            // One listener port per pod port (assigned per Gateway and listener port).
            port.listener_port = u16::try_from(l.port).unwrap_or(pod_port);
            if l.client_auth.is_some() {
                port.client_auth = l.client_auth.clone();
            }
            port.listeners.push(GatewayListener {
                name: format!("{}/{}", g.key, l.name).into(),
                hostname: l.hostname.as_deref().map(Into::into),
                cert: l.cert.clone(),
                routes,
            });
        }
    }
    GatewayTable {
        ports: ports
            .into_iter()
            .map(|(p, mut port)| {
                port.sort();
                (p, Arc::new(port))
            })
            .collect(),
    }
}

/// One listener's rules by host, each host's sorted by precedence.
fn listener_routes(entries: Entries) -> ListenerRoutes {
    let mut routes = ListenerRoutes::default();
    for (host, mut rules) in entries {
        rules.sort_by(|a, b| a.0.cmp(&b.0));
        let rules: Vec<GatewayRule> = rules.into_iter().map(|(_, r)| r).collect();
        match host {
            None => routes.any_host = rules,
            Some(h) if h.starts_with("*.") => routes.wildcard.push((h.into(), rules)),
            Some(h) => {
                routes.exact.insert(h.into(), rules);
            }
        }
    }
    routes.sort();
    routes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::object::Kind;
    use k8s_openapi::api::core::v1::Service;
    use serde_json::json;

    fn gateway() -> Gateway {
        serde_json::from_value(json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
            "metadata": {"namespace": "gw", "name": "g"},
            "spec": {"gatewayClassName": "duet", "listeners": [
                {"name": "a", "port": 80, "protocol": "HTTP", "hostname": "a.example.com"},
                {"name": "all", "port": 81, "protocol": "HTTP",
                 "allowedRoutes": {"namespaces": {"from": "All"}}},
                {"name": "sel", "port": 82, "protocol": "HTTP",
                 "allowedRoutes": {"namespaces": {"from": "Selector",
                                                   "selector": {"matchLabels": {"team": "x"}}}}},
            ]}
        }))
        .unwrap()
    }

    fn route(
        ns: &str,
        name: &str,
        parent: serde_json::Value,
        hosts: &[&str],
        backend: serde_json::Value,
    ) -> HttpRoute {
        serde_json::from_value(json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
            "metadata": {"namespace": ns, "name": name, "generation": 3},
            "spec": {"parentRefs": [parent], "hostnames": hosts,
                     "rules": [{"backendRefs": [backend]}]}
        }))
        .unwrap()
    }

    fn reasons(report: &GatewayReport, ns: &str, name: &str) -> (String, String) {
        let r = &report.routes[&(Kind::HttpRoute, NsName::new(ns, name))];
        assert_eq!(r.generation, Some(3));
        let p = &r.parents[0];
        (p.accepted.reason.to_owned(), p.resolved.reason.to_owned())
    }

    fn class() -> GatewayClass {
        serde_json::from_value(json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass",
            "metadata": {"name": "duet"}, "spec": {"controllerName": "duet.dev/gateway-controller"}
        }))
        .unwrap()
    }

    /// `gw/web`, port 8080.
    fn web_service() -> Service {
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Service", "metadata": {"namespace": "gw", "name": "web"},
            "spec": {"ports": [{"name": "http", "port": 8080}]}
        }))
        .unwrap()
    }

    #[test]
    fn attachment_and_references_give_the_spec_reasons() {
        let (class, svc) = (class(), web_service());
        let labelled: Namespace = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": "team", "labels": {"team": "x"}}
        }))
        .unwrap();
        let web = json!({"name": "web", "port": 8080});
        let routes = [
            route(
                "gw",
                "ok",
                json!({"name": "g", "sectionName": "a"}),
                &[],
                web.clone(),
            ),
            route(
                "gw",
                "no-section",
                json!({"name": "g", "sectionName": "zz"}),
                &[],
                web.clone(),
            ),
            route(
                "gw",
                "no-port",
                json!({"name": "g", "port": 9}),
                &[],
                web.clone(),
            ),
            // Listener `a` is on port 80: a sectionName and a port that disagree select nothing.
            route(
                "gw",
                "section-not-port",
                json!({"name": "g", "sectionName": "a", "port": 81}),
                &[],
                web.clone(),
            ),
            // The port alone selects listener `all` (81); its rule has a name.
            {
                let mut r = route(
                    "gw",
                    "by-port",
                    json!({"name": "g", "port": 81}),
                    &[],
                    web.clone(),
                );
                r.spec.rules.as_mut().unwrap()[0].name = Some("named".into());
                r
            },
            route(
                "other",
                "same-only",
                json!({"name": "g", "namespace": "gw", "sectionName": "a"}),
                &[],
                web.clone(),
            ),
            route(
                "other",
                "unselected",
                json!({"name": "g", "namespace": "gw", "sectionName": "sel"}),
                &[],
                web.clone(),
            ),
            route(
                "team",
                "selected",
                json!({"name": "g", "namespace": "gw", "sectionName": "sel"}),
                &[],
                json!({"name": "web", "namespace": "gw", "port": 8080}),
            ),
            route(
                "gw",
                "hosts",
                json!({"name": "g", "sectionName": "a"}),
                &["b.example.com"],
                web.clone(),
            ),
            route(
                "gw",
                "missing",
                json!({"name": "g", "sectionName": "all"}),
                &[],
                json!({"name": "nope", "port": 1}),
            ),
            route(
                "gw",
                "kind",
                json!({"name": "g", "sectionName": "all"}),
                &[],
                json!({"kind": "ConfigMap", "name": "web"}),
            ),
            route(
                "gw",
                "theirs",
                json!({"name": "elsewhere"}),
                &[],
                web.clone(),
            ),
            route(
                "granted",
                "cross",
                json!({"name": "g", "namespace": "gw", "sectionName": "all"}),
                &[],
                json!({"name": "web", "namespace": "gw", "port": 8080}),
            ),
        ];
        let gw = gateway();
        let grant: ReferenceGrant = serde_json::from_value(json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "ReferenceGrant",
            "metadata": {"namespace": "gw", "name": "from-granted"},
            "spec": {"from": [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "namespace": "granted"}],
                     "to": [{"group": "", "kind": "Service", "name": "web"}]}
        }))
        .unwrap();
        let inputs = Inputs {
            services: vec![&svc],
            gateway_api: GatewayInputs {
                namespaces: vec![&labelled],
                classes: vec![&class],
                gateways: vec![&gw],
                http_routes: routes.iter().collect(),
                grants: vec![&grant],
                ..GatewayInputs::default()
            },
            ..Inputs::default()
        };
        let plan = crate::translate::plan_routes(&inputs, &Config::default());
        let report = &plan.gateway_report;
        let r = |name: &str, ns: &str| reasons(report, ns, name);
        let s = |a: &str, b: &str| (a.to_owned(), b.to_owned());
        assert_eq!(r("ok", "gw"), s("Accepted", "ResolvedRefs"));
        assert_eq!(r("no-section", "gw"), s("NoMatchingParent", "ResolvedRefs"));
        assert_eq!(r("no-port", "gw"), s("NoMatchingParent", "ResolvedRefs"));
        assert_eq!(
            r("section-not-port", "gw"),
            s("NoMatchingParent", "ResolvedRefs")
        );
        assert_eq!(r("by-port", "gw"), s("Accepted", "ResolvedRefs"));
        // `web` without a namespace is `other/web`, which does not exist.
        assert_eq!(
            r("same-only", "other"),
            s("NotAllowedByListeners", "BackendNotFound")
        );
        assert_eq!(
            r("unselected", "other"),
            s("NotAllowedByListeners", "BackendNotFound")
        );
        // Selected by its namespace's labels; the Service in another namespace needs a grant.
        assert_eq!(r("selected", "team"), s("Accepted", "RefNotPermitted"));
        assert_eq!(
            r("hosts", "gw"),
            s("NoMatchingListenerHostname", "ResolvedRefs")
        );
        assert_eq!(r("missing", "gw"), s("Accepted", "BackendNotFound"));
        assert_eq!(r("cross", "granted"), s("Accepted", "ResolvedRefs"));
        assert_eq!(r("kind", "gw"), s("Accepted", "InvalidKind"));
        assert!(!report
            .routes
            .contains_key(&(Kind::HttpRoute, NsName::new("gw", "theirs"))));
        let attached = |l: &str| report.attached[&(NsName::new("gw", "g"), l.to_owned())];
        assert_eq!((attached("a"), attached("all"), attached("sel")), (1, 4, 1));
        // A rule's name comes along to /debug/routes.
        let on_81 = &plan.gateways.ports[&81].listeners[0].routes;
        let names: Vec<Option<&str>> = on_81.rules().map(|r| r.name.as_deref()).collect();
        assert!(names.contains(&Some("named")), "{names:?}");
        // Served on the listener ports themselves (manifests mode), each port its listener.
        assert_eq!(
            plan.gateways.ports.keys().copied().collect::<Vec<_>>(),
            [80, 81, 82]
        );
        // What clients reach (Alt-Svc names it): the listeners' port.
        assert_eq!(plan.gateways.ports[&81].listener_port, 81);
    }
    fn tls_route(ns: &str, name: &str, section: &str, hosts: &[&str], to: &str) -> TlsRoute {
        serde_json::from_value(json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "TLSRoute",
            "metadata": {"namespace": ns, "name": name, "generation": 3},
            "spec": {"parentRefs": [{"name": "g", "namespace": "gw", "sectionName": section}],
                     "hostnames": hosts,
                     "rules": [{"backendRefs": [{"name": to, "namespace": "gw", "port": 8080}]}]}
        }))
        .unwrap()
    }

    #[test]
    fn tlsroutes_attach_to_passthrough_listeners_and_are_served_by_sni() {
        let (class, svc) = (class(), web_service());
        let gw: Gateway = serde_json::from_value(json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
            "metadata": {"namespace": "gw", "name": "g"},
            "spec": {"gatewayClassName": "duet", "listeners": [
                {"name": "tls", "port": 443, "protocol": "TLS", "hostname": "*.example.com",
                 "tls": {"mode": "Passthrough"}, "allowedRoutes": {"namespaces": {"from": "All"}}},
                {"name": "http", "port": 80, "protocol": "HTTP"},
            ]}
        }))
        .unwrap();
        let tls_routes = [
            tls_route("gw", "ok", "tls", &["abc.example.com"], "web"),
            tls_route("gw", "elsewhere", "tls", &["abc.example.org"], "web"),
            tls_route("gw", "on-http", "http", &["abc.example.com"], "web"),
            tls_route("other", "cross", "tls", &["x.example.com"], "web"),
            tls_route("gw", "missing", "tls", &["m.example.com"], "nope"),
        ];
        let http = route(
            "gw",
            "http-on-tls",
            json!({"name": "g", "sectionName": "tls"}),
            &[],
            json!({"name": "web", "port": 8080}),
        );
        let inputs = Inputs {
            services: vec![&svc],
            gateway_api: GatewayInputs {
                classes: vec![&class],
                gateways: vec![&gw],
                http_routes: vec![&http],
                tls_routes: tls_routes.iter().collect(),
                ..GatewayInputs::default()
            },
            ..Inputs::default()
        };
        let plan = crate::translate::plan_routes(&inputs, &Config::default());
        let report = &plan.gateway_report;
        let r = |ns: &str, name: &str| {
            let p = &report.routes[&(Kind::TlsRoute, NsName::new(ns, name))].parents[0];
            (p.accepted.reason, p.resolved.reason)
        };
        assert_eq!(r("gw", "ok"), ("Accepted", "ResolvedRefs"));
        assert_eq!(
            r("gw", "elsewhere"),
            ("NoMatchingListenerHostname", "ResolvedRefs")
        );
        assert_eq!(
            r("gw", "on-http"),
            ("NotAllowedByListeners", "ResolvedRefs")
        );
        assert_eq!(r("other", "cross"), ("Accepted", "RefNotPermitted"));
        assert_eq!(r("gw", "missing"), ("Accepted", "BackendNotFound"));
        assert_eq!(
            reasons(report, "gw", "http-on-tls").0,
            "NotAllowedByListeners"
        );
        let attached = |l: &str| report.attached[&(NsName::new("gw", "g"), l.to_owned())];
        assert_eq!((attached("tls"), attached("http")), (3, 0));
        let port = plan.gateways.port(443).unwrap();
        assert!(port.tls_routes && !port.tls);
        let backend = |sni: &str| port.tls_route(sni).map(|(_, a)| a.backend.to_string());
        assert!(
            backend("ABC.example.com").is_some_and(|b| b.contains("gw/web")),
            "{:?}",
            backend("abc.example.com")
        );
        assert_eq!(backend("abc.example.org"), None);
        assert_eq!(backend("zzz.example.com"), None);
        assert!(!plan.gateways.port(80).unwrap().tls_routes);
    }

    /// Secret `gw/cert` (a server certificate) and ConfigMap `gw/ca` (a CA's `ca.crt`).
    fn server_cert_and_ca() -> (Secret, ConfigMap) {
        let key = rcgen::KeyPair::generate().unwrap();
        let server = rcgen::CertificateParams::new(vec!["a.test".to_owned()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let bytes = |s: String| k8s_openapi::ByteString(s.into_bytes());
        let secret = Secret {
            metadata: serde_json::from_value(json!({"namespace": "gw", "name": "cert"})).unwrap(),
            type_: Some("kubernetes.io/tls".to_owned()),
            data: Some(
                [
                    ("tls.crt".to_owned(), bytes(server.pem())),
                    ("tls.key".to_owned(), bytes(key.serialize_pem())),
                ]
                .into(),
            ),
            ..Secret::default()
        };
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca_pem = ca_params
            .self_signed(&rcgen::KeyPair::generate().unwrap())
            .unwrap()
            .pem();
        let ca = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"namespace": "gw", "name": "ca"}, "data": {"ca.crt": ca_pem}
        }))
        .unwrap();
        (secret, ca)
    }

    #[test]
    fn client_certificate_validation_is_served_per_port_and_a_bad_reference_is_reported() {
        let (class, svc) = (class(), web_service());
        let (secret, ca) = server_cert_and_ca();
        let https = |name: &str, port: u16| {
            json!({"name": name, "port": port, "protocol": "HTTPS", "hostname": format!("{name}.test"),
                   "tls": {"certificateRefs": [{"name": "cert"}]}})
        };
        let refs = |name: &str| json!([{"group": "", "kind": "ConfigMap", "name": name}]);
        // A ListenerSet's HTTPS listeners are checked as the Gateway's on their ports.
        let set: ListenerSet = serde_json::from_value(json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "ListenerSet",
            "metadata": {"namespace": "gw", "name": "s"},
            "spec": {"parentRef": {"name": "g"},
                     "listeners": [https("extra", 7443), https("extra-broken", 9443)]}
        }))
        .unwrap();
        let gw: Gateway = serde_json::from_value(json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
            "metadata": {"namespace": "gw", "name": "g"},
            "spec": {"gatewayClassName": "duet",
                "allowedListeners": {"namespaces": {"from": "Same"}},
                "tls": {"frontend": {
                    "default": {"validation": {"caCertificateRefs": refs("ca")}},
                    "perPort": [
                        {"port": 8443, "tls": {"validation": {"mode": "AllowInsecureFallback", "caCertificateRefs": refs("ca")}}},
                        {"port": 9443, "tls": {"validation": {"caCertificateRefs": refs("missing")}}},
                    ]}},
                "listeners": [https("strict", 443), https("fallback", 8443), https("broken", 9443),
                              {"name": "http", "port": 80, "protocol": "HTTP"}]}
        }))
        .unwrap();
        let inputs = Inputs {
            services: vec![&svc],
            secrets: vec![&secret],
            gateway_api: GatewayInputs {
                classes: vec![&class],
                gateways: vec![&gw],
                listener_sets: vec![&set],
                config_maps: vec![&ca],
                ..GatewayInputs::default()
            },
            ..Inputs::default()
        };
        let plan = crate::translate::plan_routes(&inputs, &Config::default());
        let verify = |port: u16| {
            let p = plan.gateways.port(port)?;
            p.client_auth.as_ref().map(|a| a.verify)
        };
        use dataplane::client_auth::VerifyClient;
        assert_eq!(verify(443), Some(VerifyClient::On));
        assert_eq!(verify(8443), Some(VerifyClient::OptionalNoCa));
        assert_eq!(verify(80), None, "HTTP listeners ask for nothing");
        // The ListenerSet's HTTPS ports, for the Service's UDP ports with HTTP/3.
        let sets = &plan.gateway_report.listener_set_https_ports;
        assert!(sets[&NsName::new("gw", "g")].contains(&7443), "{sets:?}");
        assert!(plan.gateways.port(80).is_some());
        // The listener whose CA does not resolve is not served, and its status says why.
        assert!(plan.gateways.port(9443).is_none());
        let problems = &plan.gateway_report.frontend;
        assert_eq!(problems.len(), 1, "{problems:?}");
        let p = &problems[&(NsName::new("gw", "g"), "broken".to_owned())];
        assert_eq!(p.resolved.reason, "InvalidCACertificateRef");
        assert_eq!(
            p.accepted.as_ref().map(|c| c.reason),
            Some("NoValidCACertificate")
        );
        assert_eq!(verify(7443), Some(VerifyClient::On), "the set's listener");
        let set_report = &plan.gateway_report.listener_sets[&NsName::new("gw", "s")];
        let broken = set_report
            .listeners
            .iter()
            .find(|l| l.name == "extra-broken");
        let reason = |kind: &str| {
            let conds = &broken.unwrap().conditions;
            conds.iter().find(|c| c.kind == kind).map(|c| c.reason)
        };
        assert_eq!(reason("ResolvedRefs"), Some("InvalidCACertificateRef"));
        assert_eq!(reason("Accepted"), Some("NoValidCACertificate"));
    }

    #[test]
    fn a_rule_whose_modifier_names_a_framing_header_is_refused_on_the_route() {
        let (class, svc) = (class(), web_service());
        let web = json!([{"name": "web", "port": 8080}]);
        let modifier = |kind: &str, field: &str, name: &str| json!([{"type": kind, field: {"set": [{"name": name, "value": "chunked"}]}}]);
        let mut route = route("gw", "smuggle", json!({"name": "g"}), &[], web[0].clone());
        route.spec.rules = serde_json::from_value(json!([
            {"matches": [{"path": {"type": "PathPrefix", "value": "/ok"}}], "backendRefs": web},
            {"matches": [{"path": {"type": "PathPrefix", "value": "/te"}}], "backendRefs": web,
             "filters": modifier("RequestHeaderModifier", "requestHeaderModifier", "Transfer-Encoding")},
            {"matches": [{"path": {"type": "PathPrefix", "value": "/conn"}}], "backendRefs": web,
             "filters": modifier("ResponseHeaderModifier", "responseHeaderModifier", "Connection")},
        ]))
        .unwrap();
        let gw = gateway();
        let inputs = Inputs {
            services: vec![&svc],
            gateway_api: GatewayInputs {
                classes: vec![&class],
                gateways: vec![&gw],
                http_routes: vec![&route],
                ..GatewayInputs::default()
            },
            ..Inputs::default()
        };
        let plan = crate::translate::plan_routes(&inputs, &Config::default());
        let r = &plan.gateway_report.routes[&(Kind::HttpRoute, NsName::new("gw", "smuggle"))];
        for p in &r.parents {
            assert!(!p.accepted.status, "{:?}", p.accepted);
            assert_eq!(p.accepted.reason, "UnsupportedValue");
            assert!(
                p.accepted.message.contains("cannot name transfer-encoding"),
                "{}",
                p.accepted.message
            );
        }
        // The refused rules are left out; the route's other rule is served, without filters.
        let port = plan.gateways.port(81).unwrap();
        assert!(port.find("any.test", "/ok").is_some());
        assert!(port.find("any.test", "/te").is_none());
        assert!(port.find("any.test", "/conn").is_none());
        assert!(plan.gateways.actions().all(|a| a.filters.is_none()));
        let said = plan
            .diagnostics
            .iter()
            .filter(|d| d.object.name == "smuggle");
        assert_eq!(said.count(), 2, "{:?}", plan.diagnostics);
    }
}
