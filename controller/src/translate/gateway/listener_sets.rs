//! ListenerSets (GEP-1713), pure: which ListenerSets a Gateway admits, and the verdict on each
//! of their listeners once merged with the Gateway's.
//!
//! - Admission: the ListenerSet's `parentRef` names the Gateway, and the Gateway's
//!   `allowedListeners.namespaces.from` admits the ListenerSet's namespace (`None`, the
//!   default: none; `Same`; `All`; `Selector` over the namespace's labels). A ListenerSet not
//!   admitted is `Accepted=False`, reason `NotAllowed`.
//! - Precedence: the Gateway's own listeners first, then the ListenerSets oldest first
//!   (creationTimestamp, then namespace/name). A ListenerSet listener on a port an earlier
//!   listener serves with another protocol is `Conflicted` (`ProtocolConflict`); on the same
//!   port and hostname, `Conflicted` (`HostnameConflict`); either way not accepted, and the
//!   earlier listener keeps serving.
//! - A ListenerSet with no valid listener is `Accepted=False`, reason `ListenersNotValid`.

use std::collections::BTreeMap;

use super::attach::selects;
use super::listeners::{self, Verdict};
use crate::gateway_api::conditions::Cond;
use crate::gateway_api::gateways::{
    GatewayAllowedListenersNamespacesFrom, GatewayListeners,
    GatewayListenersAllowedRoutesNamespacesSelector, GatewaySpec,
};
use crate::gateway_api::report::{ListenerEntryReport, ListenerSetReport};
use crate::gateway_api::{Gateway, ListenerSet, GROUP};
use crate::object::NsName;

/// A ListenerSet admitted by a Gateway, with its listeners judged.
#[derive(Clone, Debug)]
pub struct Judged<'a> {
    /// The ListenerSet.
    pub set: &'a ListenerSet,
    /// Namespace and name.
    pub key: NsName,
    /// Its listeners, in the Gateway's listener type.
    pub listeners: Vec<GatewayListeners>,
    /// The verdict on each.
    pub verdicts: Vec<Verdict>,
}

/// The ListenerSets whose `parentRef` names `gateway`, oldest first.
pub fn of_gateway<'a>(gateway: &Gateway, sets: &[&'a ListenerSet]) -> Vec<&'a ListenerSet> {
    let key = NsName::of(&gateway.metadata);
    let mut out: Vec<&ListenerSet> = sets
        .iter()
        .copied()
        .filter(|s| {
            let p = &s.spec.parent_ref;
            let ns = p
                .namespace
                .as_deref()
                .or(s.metadata.namespace.as_deref())
                .unwrap_or_default();
            p.group.as_deref().unwrap_or(GROUP) == GROUP
                && p.kind.as_deref().unwrap_or("Gateway") == "Gateway"
                && p.name == key.name
                && ns == key.namespace
        })
        .collect();
    out.sort_by_key(|s| {
        let created = s.metadata.creation_timestamp.as_ref().map(|t| t.0);
        (created, NsName::of(&s.metadata))
    });
    out
}

/// Whether the Gateway's `allowedListeners` admits ListenerSets of namespace `set_ns`.
pub fn admits(
    gateway: &GatewaySpec,
    gateway_ns: &str,
    set_ns: &str,
    namespaces: &BTreeMap<String, BTreeMap<String, String>>,
) -> bool {
    let allowed = gateway
        .allowed_listeners
        .as_ref()
        .and_then(|a| a.namespaces.as_ref());
    match allowed.and_then(|a| a.from.as_ref()) {
        Some(GatewayAllowedListenersNamespacesFrom::All) => true,
        Some(GatewayAllowedListenersNamespacesFrom::Same) => gateway_ns == set_ns,
        Some(GatewayAllowedListenersNamespacesFrom::Selector) => {
            let selector = allowed.and_then(|a| a.selector.as_ref());
            let selector: GatewayListenersAllowedRoutesNamespacesSelector = selector
                .and_then(|s| serde_json::to_value(s).ok())
                .and_then(|v| serde_json::from_value(v).ok())
                .unwrap_or_default();
            let empty = BTreeMap::new();
            selects(&selector, namespaces.get(set_ns).unwrap_or(&empty))
        }
        _ => false,
    }
}

/// A ListenerSet's listeners as Gateway listeners (the two types have the same fields).
pub fn listeners_of(set: &ListenerSet) -> Vec<GatewayListeners> {
    set.spec
        .listeners
        .iter()
        .filter_map(|l| serde_json::to_value(l).ok())
        .filter_map(|v| serde_json::from_value(v).ok())
        .collect()
}

/// Judges the admitted ListenerSets (oldest first) against the Gateway's listeners, each other
/// and their own earlier listeners.
pub fn judge<'a>(gateway: &[GatewayListeners], sets: &[&'a ListenerSet]) -> Vec<Judged<'a>> {
    // The (port, protocol, hostname) of every listener that takes precedence.
    let mut claimed: Vec<(i32, String, String)> = gateway
        .iter()
        .map(|l| (l.port, l.protocol.clone(), host(l)))
        .collect();
    let mut out = Vec::new();
    for set in sets {
        let listeners = listeners_of(set);
        let mut verdicts = Vec::new();
        // In spec order: a listener conflicts with the valid ones before it.
        for l in &listeners {
            let mut v = alone(l);
            if let Some(reason) = conflict(l, &claimed) {
                let message = format!(
                    "a listener of higher precedence on port {} {reason}",
                    l.port
                );
                let reason = if reason.starts_with("serves") {
                    "ProtocolConflict"
                } else {
                    "HostnameConflict"
                };
                v.conflicted = Cond::yes("Conflicted", reason, message.clone());
                v.accepted = Cond::no("Accepted", reason, message);
            }
            if v.valid() {
                claimed.push((l.port, l.protocol.clone(), host(l)));
            }
            verdicts.push(v);
        }
        out.push(Judged {
            set,
            key: NsName::of(&set.metadata),
            listeners,
            verdicts,
        });
    }
    out
}

/// The verdict on one listener by itself (conflicts are judged by [`judge`]).
fn alone(l: &GatewayListeners) -> Verdict {
    let spec = GatewaySpec {
        listeners: vec![l.clone()],
        ..GatewaySpec::default()
    };
    listeners::check(&spec).remove(0)
}

fn host(l: &GatewayListeners) -> String {
    l.hostname.clone().unwrap_or_default().to_ascii_lowercase()
}

/// How `l` conflicts with a listener of higher precedence, if it does.
fn conflict(l: &GatewayListeners, claimed: &[(i32, String, String)]) -> Option<&'static str> {
    let same_port = claimed.iter().filter(|c| c.0 == l.port);
    let mut hostname = false;
    for (_, protocol, h) in same_port {
        if *protocol != l.protocol {
            return Some("serves another protocol");
        }
        hostname |= *h == host(l);
    }
    hostname.then_some("has the same hostname")
}

/// A ListenerSet's report: its conditions and its listeners' (`servable`: per listener, its
/// certificates resolve).
pub fn report(judged: &Judged<'_>, servable: &[bool]) -> ListenerSetReport {
    let listeners: Vec<ListenerEntryReport> = judged
        .verdicts
        .iter()
        .zip(servable)
        .map(|(v, ok)| ListenerEntryReport {
            name: v.name.clone(),
            kinds: v.kinds.clone(),
            conditions: listener_conditions(v, *ok),
            attached: 0,
        })
        .collect();
    let valid = judged.verdicts.iter().any(Verdict::valid);
    let conditions = if valid {
        vec![
            Cond::yes("Accepted", "Accepted", ""),
            Cond::yes("Programmed", "Programmed", ""),
        ]
    } else {
        let message = "no listener of the ListenerSet is valid";
        vec![
            Cond::no("Accepted", "ListenersNotValid", message),
            Cond::no("Programmed", "ListenersNotValid", message),
        ]
    };
    ListenerSetReport {
        generation: judged.set.metadata.generation,
        conditions,
        listeners,
    }
}

/// The report of a ListenerSet its Gateway does not admit.
pub fn not_allowed(set: &ListenerSet) -> ListenerSetReport {
    let message = "the parent Gateway's allowedListeners does not admit this namespace";
    ListenerSetReport {
        generation: set.metadata.generation,
        conditions: vec![
            Cond::no("Accepted", "NotAllowed", message),
            Cond::no("Programmed", "NotAllowed", message),
        ],
        listeners: Vec::new(),
    }
}

/// A ListenerSet listener's `Accepted`, `Conflicted`, `ResolvedRefs` and `Programmed`.
fn listener_conditions(v: &Verdict, servable: bool) -> Vec<Cond> {
    let programmed = if v.conflicted.status {
        Cond::no(
            "Programmed",
            v.conflicted.reason,
            v.conflicted.message.clone(),
        )
    } else if !v.valid() || !servable {
        Cond::no("Programmed", "Invalid", "the listener is not valid")
    } else {
        Cond::yes("Programmed", "Programmed", "")
    };
    vec![
        v.accepted.clone(),
        v.conflicted.clone(),
        v.resolved.clone(),
        programmed,
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn gateway(allowed: serde_json::Value) -> Gateway {
        serde_json::from_value(json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
            "metadata": {"namespace": "gw", "name": "g"},
            "spec": {"gatewayClassName": "duet", "allowedListeners": allowed, "listeners": [
                {"name": "a", "port": 80, "protocol": "HTTP", "hostname": "a.test"}]}
        }))
        .unwrap()
    }

    fn set(ns: &str, name: &str, created: &str, listeners: serde_json::Value) -> ListenerSet {
        serde_json::from_value(json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "ListenerSet",
            "metadata": {"namespace": ns, "name": name, "creationTimestamp": created},
            "spec": {"parentRef": {"name": "g", "namespace": "gw"}, "listeners": listeners}
        }))
        .unwrap()
    }

    fn http(name: &str, port: i32, host: &str, protocol: &str) -> serde_json::Value {
        json!({"name": name, "port": port, "protocol": protocol, "hostname": host})
    }

    #[test]
    fn allowed_listeners_admit_by_namespace() {
        let labels: BTreeMap<String, BTreeMap<String, String>> = [(
            "team".to_owned(),
            [("ls".to_owned(), "yes".to_owned())].into_iter().collect(),
        )]
        .into_iter()
        .collect();
        let admits_from = |allowed: serde_json::Value, ns: &str| {
            admits(&gateway(allowed).spec, "gw", ns, &labels)
        };
        // The default admits none, not even the Gateway's own namespace.
        assert!(!admits_from(json!(null), "gw"));
        assert!(!admits_from(json!({"namespaces": {"from": "None"}}), "gw"));
        assert!(admits_from(json!({"namespaces": {"from": "Same"}}), "gw"));
        assert!(!admits_from(
            json!({"namespaces": {"from": "Same"}}),
            "team"
        ));
        assert!(admits_from(json!({"namespaces": {"from": "All"}}), "team"));
        let selector = json!({"namespaces": {"from": "Selector",
                                             "selector": {"matchLabels": {"ls": "yes"}}}});
        assert!(admits_from(selector.clone(), "team"));
        assert!(!admits_from(selector, "gw"));
    }

    #[test]
    fn the_gateway_then_older_sets_win_conflicts() {
        let g = gateway(json!({"namespaces": {"from": "All"}}));
        let older = set(
            "gw",
            "older",
            "2026-01-01T00:00:00Z",
            json!([
                http("dup-gw", 80, "a.test", "HTTP"),
                http("fine", 80, "b.test", "HTTP"),
                http("tcp", 80, "t.test", "TCP"),
            ]),
        );
        let newer = set(
            "gw",
            "newer",
            "2026-01-02T00:00:00Z",
            json!([http("dup-set", 80, "B.test", "HTTP")]),
        );
        let other = set("gw", "other", "2026-01-01T00:00:00Z", json!([]));
        let mut theirs = other.clone();
        theirs.spec.parent_ref.name = "elsewhere".into();
        let sets = of_gateway(&g, &[&newer, &theirs, &older]);
        let names: Vec<_> = sets
            .iter()
            .map(|s| s.metadata.name.clone().unwrap())
            .collect();
        assert_eq!(names, ["older", "newer"]);
        let judged = judge(&g.spec.listeners, &sets);
        let reasons = |j: &Judged<'_>| -> Vec<(bool, &str)> {
            j.verdicts
                .iter()
                .map(|v| (v.valid(), v.conflicted.reason))
                .collect()
        };
        assert_eq!(
            reasons(&judged[0]),
            [
                (false, "HostnameConflict"),
                (true, "NoConflicts"),
                (false, "ProtocolConflict")
            ]
        );
        assert_eq!(reasons(&judged[1]), [(false, "HostnameConflict")]);
        let older_report = report(&judged[0], &[true, true, true]);
        assert_eq!(older_report.conditions[0].reason, "Accepted");
        let accepted = &older_report.listeners[0].conditions[0];
        assert_eq!(
            (accepted.status, accepted.reason),
            (false, "HostnameConflict")
        );
        let newer_report = report(&judged[1], &[true]);
        assert_eq!(
            (
                newer_report.conditions[0].status,
                newer_report.conditions[0].reason
            ),
            (false, "ListenersNotValid")
        );
        assert_eq!(not_allowed(&other).conditions[1].reason, "NotAllowed");
    }
}
