//! What the Gateway API objects' status should say, as translation decided it from the same
//! attachment that decides what is served: route parents' conditions and the routes attached to
//! each listener. Translation writes it; the status writers read it.

use std::collections::{BTreeMap, BTreeSet};

use super::conditions::Cond;
use crate::object::{Kind, NsName};

/// What the Gateway API objects' status should say.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GatewayReport {
    /// Per route (kind, namespace/name): its parents' conditions.
    pub routes: BTreeMap<(Kind, NsName), RouteReport>,
    /// Per listener (Gateway, listener name) of our Gateways: the routes attached.
    pub attached: BTreeMap<(NsName, String), i32>,
    /// Per BackendTLSPolicy that applies to a backend of a route of our Gateways: its status.
    pub policies: BTreeMap<NsName, PolicyReport>,
    /// Per ListenerSet whose parent is one of our Gateways: its status.
    pub listener_sets: BTreeMap<NsName, ListenerSetReport>,
    /// Per Gateway of ours: the ListenerSets it accepted (`attachedListenerSets`).
    pub attached_listener_sets: BTreeMap<NsName, i32>,
    /// Per Gateway of ours: the ports of the valid listeners of the ListenerSets it accepted,
    /// which its Service and pod ports must cover too.
    pub listener_set_ports: BTreeMap<NsName, BTreeSet<u16>>,
    /// Per Gateway of ours: those of the HTTPS listeners (served over HTTP/3 too when it is on).
    pub listener_set_https_ports: BTreeMap<NsName, BTreeSet<u16>>,
    /// Per listener (Gateway, listener name) whose client certificate validation
    /// (`tls.frontend`) does not resolve: what its status says (the listener is not served).
    pub frontend: BTreeMap<(NsName, String), FrontendProblem>,
}

/// Why a listener's client certificate validation does not resolve.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FrontendProblem {
    /// `ResolvedRefs=False`.
    pub resolved: Cond,
    /// `Accepted=False` (`NoValidCACertificate`) when no CA certificate is usable.
    pub accepted: Option<Cond>,
}

impl FrontendProblem {
    /// Puts the problem into a listener's `Accepted` and `ResolvedRefs`, unless those already
    /// fail for another reason.
    pub fn apply(&self, accepted: &mut Cond, resolved: &mut Cond) {
        if resolved.status {
            *resolved = self.resolved.clone();
        }
        if let Some(a) = self.accepted.as_ref().filter(|_| accepted.status) {
            *accepted = a.clone();
        }
    }
}

/// The status of one BackendTLSPolicy: the same conditions for each of its ancestors (our
/// Gateways whose routes use a Service it targets).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PolicyReport {
    /// `metadata.generation`, the conditions' `observedGeneration`.
    pub generation: Option<i64>,
    /// The Gateways (`status.ancestors[].ancestorRef`).
    pub ancestors: std::collections::BTreeSet<NsName>,
    /// `Accepted`, then `ResolvedRefs`.
    pub conditions: Vec<Cond>,
}

/// The status of one ListenerSet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListenerSetReport {
    /// `metadata.generation`, the conditions' `observedGeneration`.
    pub generation: Option<i64>,
    /// `Accepted` and `Programmed`.
    pub conditions: Vec<Cond>,
    /// Its listeners, in spec order.
    pub listeners: Vec<ListenerEntryReport>,
}

/// The status of one listener of a ListenerSet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListenerEntryReport {
    /// The listener's name.
    pub name: String,
    /// `supportedKinds` (group `gateway.networking.k8s.io`).
    pub kinds: Vec<&'static str>,
    /// `Accepted`, `Conflicted`, `ResolvedRefs`, `Programmed`.
    pub conditions: Vec<Cond>,
    /// `attachedRoutes`.
    pub attached: i32,
}

/// The status of one route.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RouteReport {
    /// `metadata.generation`, the conditions' `observedGeneration`.
    pub generation: Option<i64>,
    /// `metadata.uid`: a route deleted and made again under its name (generation 1 again, the
    /// same parents) is a change of the report, so its status is written.
    pub uid: Option<String>,
    /// One entry per parentRef naming one of our Gateways.
    pub parents: Vec<ParentReport>,
}

/// A route's status for one parentRef.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParentReport {
    /// The parentRef as written.
    pub parent_ref: WrittenRef,
    /// `Accepted`.
    pub accepted: Cond,
    /// `ResolvedRefs`.
    pub resolved: Cond,
}

/// A parentRef as the route wrote it (for `status.parents[].parentRef`).
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct WrittenRef {
    /// `group` as written.
    pub group: Option<String>,
    /// `kind` as written.
    pub kind: Option<String>,
    /// `namespace` as written.
    pub namespace: Option<String>,
    /// `name`.
    pub name: String,
    /// `sectionName` as written.
    pub section_name: Option<String>,
    /// `port` as written.
    pub port: Option<i32>,
}
