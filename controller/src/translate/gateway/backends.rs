//! A route's rules into dataplane rules, with their backendRefs resolved: a core `Service` (the
//! only kind duet serves; another is `InvalidKind`) in the route's namespace, or in another one
//! that a ReferenceGrant opens to the route's kind (else `RefNotPermitted`), that exists with the
//! port named (else `BackendNotFound`). Weighted refs become a weighted
//! [`Choice`](dataplane::route_policy::Choice); a ref that does not resolve keeps its weight and
//! answers 500, as does a rule with no backendRef or only zero weights. One target per pod:
//! backends are the Services' pods joined across families, as for Ingress.

use std::sync::Arc;

use dataplane::route_policy::{Alternative, Choice, Pinning};
use dataplane::table::gateway::GatewayRule;
use dataplane::table::UpstreamProtocol;
use dataplane::{BackendId, FamilyPolicy, Origin, PathMatch, RouteAction};

use dataplane::upstream_tls::UpstreamTls;

use super::backend_tls::Policies;
use super::routes::{BackendRef, RouteView};
use crate::gateway_api::conditions::Cond;
use crate::gateway_api::{ReferenceGrant, GROUP};
use crate::object::{Kind, NsName, ObjectKey};
use crate::translate::gateway_rule::{RuleMatch, RuleRefusal};
use crate::translate::translation::{PortRef, Translation};
use crate::translate::Reason;

/// A match's precedence within a host entry (smaller wins), the spec's order: path `Exact`, then
/// `PathPrefix`, then `RegularExpression` (duet's choice; the spec leaves it open), longer paths
/// first; then a method condition; then more header conditions; then more query conditions.
pub type Rank = (u8, usize, bool, usize, usize);

/// A rule entry: its rank, rule index, match index, the rule.
pub type RuleEntry = (Rank, usize, usize, GatewayRule);

/// The route's dataplane rules, its `ResolvedRefs` condition, and the first refusal of a rule
/// that cannot be served (that rule is left out).
pub fn rules(
    t: &mut Translation<'_>,
    key: &ObjectKey,
    view: &RouteView,
    policy: FamilyPolicy,
    origin: &Origin,
    grants: &[&ReferenceGrant],
    tls: &mut Policies,
) -> (Vec<RuleEntry>, Cond, Option<RuleRefusal>) {
    let mut problem: Option<Cond> = None;
    let mut refused: Option<RuleRefusal> = None;
    let mut out = Vec::new();
    for (ri, rule) in view.rules.iter().enumerate() {
        let mut routing = match &rule.routing {
            Ok(routing) => routing.clone(),
            Err(refusal) => {
                let message = format!("rule {ri}: {refusal}; skipped");
                t.diagnose(key, Reason::InvalidPath, message);
                refused.get_or_insert_with(|| refusal.clone());
                continue;
            }
        };
        let mut arms: Vec<(BackendId, u32)> = Vec::new();
        let mut arm_tls: Vec<Option<Arc<UpstreamTls>>> = Vec::new();
        for b in &rule.backends {
            let id = match resolve(t, key, view, b, grants) {
                Ok(id) => {
                    arm_tls.push(backend_tls(t, view, b, tls));
                    id
                }
                Err(cond) => {
                    problem.get_or_insert(cond);
                    BackendId::unresolved(&format!("{}/{}", b.namespace, b.name))
                }
            };
            if let Some(filters) = &b.filters {
                routing.add_backend_filters(id.clone(), filters.clone());
            }
            let weight = u32::try_from(b.weight).unwrap_or(0);
            if weight > 0 {
                arms.push((id, weight));
            }
        }
        let mut action = action(arms, policy, origin, t.config.max_body_bytes);
        action.filters = routing.filters.clone();
        if let Some(cors) = &routing.cors {
            let mut choice = action.choice.as_deref().cloned().unwrap_or_default();
            choice.cors = Some(cors.clone());
            action.choice = Some(Arc::new(choice));
        }
        if view.kind == Kind::GrpcRoute {
            // gRPC is HTTP/2: cleartext unless the Service's appProtocol says TLS.
            action.protocol = Some(UpstreamProtocol::H2c);
        }
        if let Some(settings) = rule_tls(t, key, ri, arm_tls) {
            action.protocol = Some(match view.kind {
                Kind::GrpcRoute => UpstreamProtocol::H2,
                _ => UpstreamProtocol::Https,
            });
            action.upstream_tls = Some(settings);
        }
        for (mi, m) in routing.matches.iter().enumerate() {
            out.push((
                rank(m),
                ri,
                mi,
                GatewayRule {
                    path: m.path.clone(),
                    when: m.when.clone(),
                    name: rule.name.clone(),
                    action: action.clone(),
                },
            ));
        }
    }
    let resolved = problem.unwrap_or_else(|| Cond::yes("ResolvedRefs", "ResolvedRefs", ""));
    (out, resolved, refused)
}

/// The BackendTLSPolicy settings of a resolved backendRef (its Service port, by name).
fn backend_tls(
    t: &Translation<'_>,
    view: &RouteView,
    b: &BackendRef,
    tls: &mut Policies,
) -> Option<Arc<UpstreamTls>> {
    let name = NsName::new(b.namespace.clone(), b.name.clone());
    let port_name = t.service(&name).and_then(|s| {
        s.ports()
            .iter()
            .find(|p| Some(p.port) == b.port)
            .and_then(|p| p.name.clone())
    });
    tls.for_backend(&name, port_name.as_deref(), view.kind == Kind::GrpcRoute)
}

/// The upstream TLS of a rule: its backends' BackendTLSPolicy, when they agree. A rule whose
/// backends differ (one with a policy, one without, or two policies) cannot be served safely
/// with one setting: its requests answer 502, with a diagnostic.
fn rule_tls(
    t: &mut Translation<'_>,
    key: &ObjectKey,
    ri: usize,
    arms: Vec<Option<Arc<UpstreamTls>>>,
) -> Option<Arc<UpstreamTls>> {
    let first = arms.first()?.clone();
    if arms.iter().all(|a| *a == first) {
        return first;
    }
    let reason = "the backends of one rule differ in BackendTLSPolicy";
    let message = format!("rule {ri}: {reason}; its requests answer 502");
    t.diagnose(key, Reason::InvalidBackendTls, message);
    Some(Arc::new(UpstreamTls::unusable(
        "invalid.invalid",
        &dataplane::upstream_tls::UpstreamTrust::SystemRoots,
        reason,
    )))
}

/// A match's [`Rank`].
fn rank(m: &RuleMatch) -> Rank {
    let (kind, len) = match (&m.path, m.when.as_ref().and_then(|w| w.path.as_ref())) {
        (_, Some(regex)) => (2, regex.pattern().len()),
        (PathMatch::Exact(p), None) => (0, p.len()),
        (other, None) => (1, other.path().len()),
    };
    let when = m.when.as_deref();
    (
        kind,
        usize::MAX - len,
        when.is_none_or(|w| w.method.is_none()),
        usize::MAX - when.map_or(0, |w| w.headers.len()),
        usize::MAX - when.map_or(0, |w| w.query.len()),
    )
}

/// One backendRef's backend, or the `ResolvedRefs` condition saying why it has none.
fn resolve(
    t: &mut Translation<'_>,
    key: &ObjectKey,
    view: &RouteView,
    b: &BackendRef,
    grants: &[&ReferenceGrant],
) -> Result<BackendId, Cond> {
    if !b.group.is_empty() || b.kind != "Service" {
        let message = format!(
            "backendRef {}: kind {} of group {:?} is not supported",
            b.name, b.kind, b.group
        );
        return Err(Cond::no("ResolvedRefs", "InvalidKind", message));
    }
    if b.namespace != view.key.namespace && !granted(grants, view, b) {
        let message = format!(
            "no ReferenceGrant in {} lets {}s of {} use Service {}",
            b.namespace,
            view.kind_name(),
            view.key.namespace,
            b.name
        );
        return Err(Cond::no("ResolvedRefs", "RefNotPermitted", message));
    }
    let name = NsName::new(b.namespace.clone(), b.name.clone());
    let not_found = |what: &str| {
        let message = format!("backendRef Service {name} {what}");
        Cond::no("ResolvedRefs", "BackendNotFound", message)
    };
    if t.service(&name).is_none() {
        t.references.services.insert(name.clone());
        return Err(not_found("does not exist"));
    }
    let port = b.port.map_or(PortRef::Missing, PortRef::Number);
    let what = format!("backendRef {name}");
    t.service_port(key, name.clone(), port, &what)
        .ok_or_else(|| not_found("has no such port"))
}

/// Whether a ReferenceGrant in the backend's namespace lets the route's kind in its namespace
/// use the Service.
fn granted(grants: &[&ReferenceGrant], view: &RouteView, b: &BackendRef) -> bool {
    grants
        .iter()
        .filter(|g| g.metadata.namespace.as_deref() == Some(&*b.namespace))
        .any(|g| {
            let from = g.spec.from.iter().any(|f| {
                f.group == GROUP && f.kind == view.kind_name() && f.namespace == view.key.namespace
            });
            let to = g.spec.to.iter().any(|t| {
                t.group.is_empty()
                    && t.kind == "Service"
                    && t.name.as_deref().is_none_or(|n| n == b.name)
            });
            from && to
        })
}

/// The action of a rule over its weighted arms (none: 500).
fn action(
    arms: Vec<(BackendId, u32)>,
    policy: FamilyPolicy,
    origin: &Origin,
    max_body_bytes: u64,
) -> RouteAction {
    let mut arms = arms.into_iter();
    let (backend, first_weight) = arms
        .next()
        .unwrap_or_else(|| (BackendId::unresolved("no backendRef"), 1));
    let alternatives: Vec<Alternative<BackendId>> = arms
        .map(|(backend, weight)| Alternative {
            backend,
            weight,
            pinning: Pinning::None,
        })
        .collect();
    let choice = (!alternatives.is_empty()).then(|| {
        let total = alternatives
            .iter()
            .fold(first_weight, |sum, a| sum.saturating_add(a.weight));
        Arc::new(Choice {
            alternatives,
            weight_total: total,
            ..Choice::default()
        })
    });
    RouteAction {
        backend,
        policy,
        origin: Arc::new(origin.clone()),
        redirect_https: false,
        max_body_bytes,
        upstream_tls: None,
        timeouts: Default::default(),
        protocol: None,
        redirect: None,
        source_ranges: None,
        rewrite: None,
        access: None,
        choice,
        filters: None,
        client_auth: None,
    }
}
