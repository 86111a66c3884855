//! Pure translation of stored objects into a dataplane [`Snapshot`]: deterministic (inputs are
//! sorted), never failing as a whole (a bad part becomes a [`Diagnostic`] and is skipped).
//!
//! Two phases, so that an endpoint-only change does not rebuild routes:
//!
//! 1. [`plan_routes`]: our Ingresses, their Services and Secrets -> a [`RoutePlan`] (the shared
//!    `Arc<RouteTable>`, the backends it uses, what it references, diagnostics);
//! 2. [`build_backends`]: the plan plus EndpointSlices -> one `Arc<Backend>` per used Service port,
//!    reusing a previous `Arc` whenever the new backend is equal by value, so the dataplane keeps
//!    its live balancer state for unchanged backends.
//!
//! [`build`] runs both for a one-shot translation.

mod annotation;
mod certs;
mod diagnostic;
mod endpoints;
mod external;
pub mod gateway;
pub mod gateway_rule;
pub mod incremental;
mod ingress;
pub mod nginx;
mod reuse;
mod routes;
mod timeouts;
mod translation;
mod upstream;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use dataplane::table::CertTable;
use dataplane::{Backend, BackendId, BackendMap, FamilyPolicy, LbPolicy, RouteTable, Snapshot};
use k8s_openapi::api::core::v1::{Secret, Service};

use crate::stored::{ServiceView, StoredIngress, StoredService};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::IngressClass;

pub use annotation::{DuetAnnotation, DUET_ANNOTATIONS};
pub use certs::SSL_REDIRECT_ANNOTATION;
pub use diagnostic::{Diagnostic, EventType as DiagnosticEventType, Reason};
pub use endpoints::{
    backends_of, build_backends, build_backends_by_service, build_backends_with, forbidden,
    join_targets, update_backends, update_backends_after_routes, ServiceDiagnostics,
};
pub use external::{wanted_names, Resolution, Resolved};
pub use ingress::{BODY_SIZE_ANNOTATION, UPSTREAM_FAMILY_ANNOTATION};
pub use reuse::{reuse_hosts, same_hosts};
pub use timeouts::{CONNECT_TIMEOUT_ANNOTATION, READ_TIMEOUT_ANNOTATION};
pub use upstream::{
    app_protocol, BACKEND_CA_SECRET_ANNOTATION, BACKEND_TLS_SERVER_NAME_ANNOTATION,
    BACKEND_TLS_SKIP_VERIFY_ANNOTATION,
};

use dataplane::access_policy::AuthDestinations;

use crate::class::ClassConfig;
use crate::compact::{Slice, SliceView};
use crate::object::NsName;

/// What translation needs from the command line.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Config {
    /// Which Ingresses are ours.
    pub class: ClassConfig,
    /// The family policy of routes whose Ingress has no `duet.dev/upstream-family` annotation.
    pub family_policy: FamilyPolicy,
    /// The balancing algorithm of every backend.
    pub lb: LbPolicy,
    /// `--default-tls-secret`: the certificate for clients whose SNI matches no host.
    pub default_tls_secret: Option<NsName>,
    /// `--max-body-size` in bytes (0: unlimited) for Ingresses without
    /// `duet.dev/proxy-body-size`.
    pub max_body_bytes: u64,
    /// Proxy to loopback endpoint addresses (`127.0.0.0/8`, `::1`): true in `--manifests` mode,
    /// false in Kubernetes mode unless `--allow-loopback-endpoints` (a test-only escape hatch).
    pub allow_loopback_endpoints: bool,
    /// `--strict-annotations`: refuse Ingresses carrying snippet annotations whole.
    pub strict_annotations: bool,
    /// `--enable-ssl-passthrough`: apply ingress-nginx's `ssl-passthrough` annotation.
    pub ssl_passthrough: bool,
    /// `--canary-scope`: which main Ingresses a canary Ingress may attach to.
    pub canary_scope: nginx::routing::CanaryScope,
    /// `--auth-allowed-destinations`: an `auth-url` naming another address gets a diagnostic.
    pub auth_destinations: AuthDestinations,
    /// How Gateway API objects are served.
    pub gateway: GatewaySettings,
}

/// What Gateway API translation needs from the command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GatewaySettings {
    /// `--gateway-controller-name`: GatewayClasses naming it are ours.
    pub controller_name: String,
    /// Kubernetes mode: each listener's pod port is the `targetPort` of the Gateway's Service
    /// `duet-NAME`; in `--manifests` mode (false) it is the listener port itself.
    pub ports_from_services: bool,
}

impl Default for GatewaySettings {
    fn default() -> GatewaySettings {
        GatewaySettings {
            controller_name: crate::gateway_api::DEFAULT_CONTROLLER_NAME.to_owned(),
            ports_from_services: false,
        }
    }
}

/// The `nginx.ingress.kubernetes.io/` annotations of one of our Ingresses and what duet does with
/// each.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct AnnotationReport {
    /// The Ingress.
    pub ingress: NsName,
    /// One finding per annotation, sorted by key.
    pub annotations: Vec<nginx::Finding>,
}

/// The objects to translate, in any order (translation sorts what it needs).
#[derive(Clone, Debug, Default)]
pub struct Inputs<'a> {
    /// Every Ingress; those that are not ours are ignored.
    pub ingresses: Vec<&'a StoredIngress>,
    /// Every IngressClass.
    pub ingress_classes: Vec<&'a IngressClass>,
    /// Every Service, as the API gives it (tests, benches).
    pub services: Vec<&'a Service>,
    /// Every Service, as the index stores it; translated together with `services`.
    pub stored_services: Vec<&'a StoredService>,
    /// Every EndpointSlice, as the API gives it (tests, benches).
    pub endpoint_slices: Vec<&'a EndpointSlice>,
    /// Every EndpointSlice, as the index stores it; translated together with `endpoint_slices`.
    pub stored_slices: Vec<&'a Slice>,
    /// Every Secret.
    pub secrets: Vec<&'a Secret>,
    /// The resolver's latest answers for ExternalName Services' names (`None`: no resolver).
    pub names: Option<&'a Resolved>,
    /// The Gateway API objects and Namespaces ([`gateway::GatewayProcessor`]).
    pub gateway_api: gateway::GatewayInputs<'a>,
    /// Whether `ingresses` and `stored_services` are each in strictly increasing order of
    /// namespace (`default` when unset) and name, as the index lists them, and `services` is
    /// empty: names are then found by binary search, with no map of every object made first.
    pub sorted: bool,
}

impl<'a> Inputs<'a> {
    /// Every Service, of either field.
    pub fn all_services(&self) -> Vec<&'a dyn ServiceView> {
        let api = self.services.iter().map(|s| *s as &dyn ServiceView);
        api.chain(self.stored_services.iter().map(|s| *s as &dyn ServiceView))
            .collect()
    }

    /// Every EndpointSlice, of either field.
    pub fn slices(&self) -> Vec<&'a dyn SliceView> {
        let api = self.endpoint_slices.iter().map(|s| *s as &dyn SliceView);
        api.chain(self.stored_slices.iter().map(|s| *s as &dyn SliceView))
            .collect()
    }
}

/// What the current routes use: set after each route build, so that the index can tell whether
/// a change matters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct References {
    /// Our Ingresses.
    pub ingresses: BTreeSet<NsName>,
    /// Services our Ingresses name, whether they exist or not.
    pub services: BTreeSet<NsName>,
    /// TLS Secrets our Ingresses name, whether they exist or not.
    pub secrets: BTreeSet<NsName>,
}

/// A Service port a route uses, resolved from the Ingress backend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackendSpec {
    /// The Service.
    pub service: NsName,
    /// The Service port's name (`""` when unnamed): EndpointSlice ports are matched by it.
    pub port_name: String,
    /// The Service port's number.
    pub port: i32,
    /// The protocol spoken to the pods, from the port's `appProtocol`.
    pub protocol: dataplane::table::UpstreamProtocol,
    /// `service-upstream`: the Service's cluster IPs, one target, instead of its pods.
    pub cluster_ips: Vec<std::net::IpAddr>,
    /// An ExternalName Service's DNS name: one target holding the name's addresses.
    pub external_name: Option<Arc<str>>,
}

/// The output of the route phase.
#[derive(Clone, Debug, Default)]
pub struct RoutePlan {
    /// Hosts and paths, shared by every snapshot until routes change.
    pub table: Arc<RouteTable>,
    /// Every backend the table uses, with its Service port (shared: a plan made by host from
    /// the previous one copies 20,000 pointers, not 20,000 specs, at the 10k-Ingress size).
    pub backends: BTreeMap<BackendId, Arc<BackendSpec>>,
    /// What our Ingresses reference (for the index's relevance decisions).
    pub references: Arc<References>,
    /// Problems found in Ingresses.
    pub diagnostics: Vec<Diagnostic>,
    /// Certificates by SNI from `spec.tls` and the default TLS Secret.
    pub certs: Arc<CertTable>,
    /// The ingress-nginx annotations of our Ingresses (those having any), by Ingress.
    pub annotations: Vec<AnnotationReport>,
    /// Gateway API listeners by pod port.
    pub gateways: Arc<dataplane::table::gateway::GatewayTable>,
    /// What the Gateway API objects' status says (route parents, attached routes).
    pub gateway_report: Arc<crate::gateway_api::report::GatewayReport>,
    /// What each Ingress contributed, for [`incremental::plan_ingress_change`].
    pub footprints: Arc<incremental::Footprints>,
}

/// Assembles a snapshot from a plan and its backends.
pub fn snapshot(plan: &RoutePlan, backends: BackendMap<Arc<Backend>>, version: u64) -> Snapshot {
    Snapshot {
        version,
        routes: plan.table.clone(),
        backends,
        certs: plan.certs.clone(),
        gateways: plan.gateways.clone(),
    }
}

/// The route phase: builds the route table from our Ingresses. Never fails; every skipped part
/// becomes a diagnostic. Each processor feeds one [`Translation`](translation::Translation);
/// a `GatewayProcessor` will feed the same one.
pub fn plan_routes(inputs: &Inputs<'_>, config: &Config) -> RoutePlan {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    plan_routes_in_parts(inputs, config, cores, MIN_INGRESSES_PER_PART)
}

/// Our Ingresses per part below which the route phase stays on one thread (a thread and a
/// second translation's maps cost tens of microseconds; an Ingress a few).
const MIN_INGRESSES_PER_PART: usize = 1024;

/// [`plan_routes`] with the Ingress processor split over up to `parts` threads, each of at
/// least `min_per_part` Ingresses, by groups of Ingresses that share no host: the same plan as
/// on one thread (same routes in the same order, certificates, backends, diagnostics,
/// annotation reports and footprints), made on several cores. From two parts' worth of
/// Ingresses the groups are formed on one core too (`parts` 1), each part reading its groups in
/// name order; with fewer (`min_per_part` `usize::MAX`: always) every Ingress is read oldest
/// first on one thread. Public for the tests that hold the plans equal.
pub fn plan_routes_in_parts(
    inputs: &Inputs<'_>,
    config: &Config,
    parts: usize,
    min_per_part: usize,
) -> RoutePlan {
    let mut translation = translation::Translation::new(inputs, config);
    ingress::IngressProcessor::new(inputs, config).run_in_parts(
        &mut translation,
        inputs,
        config,
        parts,
        min_per_part,
    );
    gateway::GatewayProcessor::new(inputs, config).run(&mut translation);
    translation.finish()
}

/// Translates everything in one go: route phase, then backend phase, version 0 (the app numbers
/// what it publishes). Diagnostics are sorted and free of duplicates.
pub fn build(inputs: &Inputs<'_>, config: &Config) -> (Snapshot, Vec<Diagnostic>) {
    let plan = plan_routes(inputs, config);
    let (backends, backend_diagnostics) = build_backends(&plan, inputs, config, &BackendMap::new());
    let diagnostics = merge_diagnostics(&plan.diagnostics, backend_diagnostics);
    (snapshot(&plan, backends, 0), diagnostics)
}

/// Both phases' diagnostics, sorted, without duplicates.
pub fn merge_diagnostics(routes: &[Diagnostic], backends: Vec<Diagnostic>) -> Vec<Diagnostic> {
    let mut all: Vec<Diagnostic> = routes.iter().cloned().chain(backends).collect();
    all.sort();
    all.dedup();
    all
}
