//! What the Gateway API objects' status should say, as translation decided it from the same
//! attachment that decides what is served: route parents' conditions and the routes attached to
//! each listener. Translation writes it; the status writers read it.

use std::collections::BTreeMap;

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
