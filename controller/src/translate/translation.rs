//! One translation's shared state, in the spirit of Contour's `internal/dag` builder: what every
//! processor reads (the config, Services, Secrets) and what they all feed (diagnostics, the
//! objects routes reference, certificates, upstream TLS, the Service ports routes use and the
//! [`RouteModel`]). A processor ([`IngressProcessor`](super::ingress::IngressProcessor) today)
//! walks its API's objects and adds to it; [`Translation::finish`] turns it into a [`RoutePlan`].

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use dataplane::table::{RouteAction, UpstreamProtocol};
use dataplane::BackendId;
use k8s_openapi::api::core::v1::{Secret, ServicePort};

use super::certs::CertBuilder;
use super::external;
use super::routes::RouteModel;
use super::upstream::{app_protocol, UpstreamTlsBuilder};
use super::{
    AnnotationReport, BackendSpec, Config, Diagnostic, Inputs, Reason, References, RoutePlan,
};
use crate::object::{by_name, Kind, NsName, ObjectKey};
use crate::stored::ServiceView;
use crate::stored::StoredIngress;

/// A Service port as a route names it.
#[derive(Clone, Copy, Debug)]
pub(crate) enum PortRef<'a> {
    /// By number.
    Number(i32),
    /// By name.
    Name(&'a str),
    /// Not given.
    Missing,
}

/// The state of one translation; see the module documentation.
pub(crate) struct Translation<'a> {
    /// The command line's part.
    pub(crate) config: &'a Config,
    /// Every Service by namespace and name, borrowed from the inputs (no key allocated).
    services: Services<'a>,
    /// Every Secret, by name (for the Secrets routes name beyond certificates and upstream TLS).
    pub(crate) secrets: BTreeMap<NsName, &'a Secret>,
    /// Problems found so far.
    pub(crate) diagnostics: Vec<Diagnostic>,
    /// What the routes reference so far.
    pub(crate) references: References,
    /// The certificate table being built.
    pub(crate) certs: CertBuilder<'a>,
    upstream_tls: UpstreamTlsBuilder<'a>,
    backends: BTreeMap<BackendId, Arc<BackendSpec>>,
    /// The ids of `backends` by their text (`namespace/service:port`): a route to a Service
    /// port already seen shares its id instead of making one.
    ids: FastMap<Box<str>, BackendId>,
    /// Where an id's text is written before it is looked up in `ids`.
    scratch: String,
    /// Hosts, paths and the default backend so far.
    pub(crate) routes: RouteModel,
    /// The ingress-nginx annotation reports so far.
    pub(crate) annotations: Vec<AnnotationReport>,
    /// The Gateway API listeners and their status, once the gateway processor ran.
    pub(crate) gateways: GatewayOutput,
    /// What each Ingress contributes (hosts, references), for incremental route builds.
    pub(crate) footprints: super::incremental::Recorder,
}

impl<'a> Translation<'a> {
    /// An empty translation of `inputs`.
    pub(crate) fn new(inputs: &Inputs<'a>, config: &'a Config) -> Translation<'a> {
        Translation {
            config,
            services: Services::of(inputs),
            secrets: by_name(&inputs.secrets),
            diagnostics: Vec::new(),
            references: References::default(),
            certs: CertBuilder::new(&inputs.secrets),
            upstream_tls: UpstreamTlsBuilder::new(&inputs.secrets),
            backends: BTreeMap::new(),
            ids: FastMap::default(),
            scratch: String::new(),
            routes: RouteModel::default(),
            annotations: Vec::new(),
            gateways: Default::default(),
            footprints: Default::default(),
        }
    }

    /// What this translation made (routes, backends, certificates, diagnostics, footprints),
    /// without what it borrows from the inputs: a part of the route phase run on another
    /// thread, for [`absorb`](Self::absorb).
    pub(crate) fn into_part(self) -> Part {
        Part {
            diagnostics: self.diagnostics,
            references: self.references,
            certs: self.certs.finish(),
            upstream_tls: self.upstream_tls.into_built(),
            backends: self.backends,
            ids: self.ids,
            routes: self.routes,
            annotations: self.annotations,
            footprints: self.footprints,
        }
    }

    /// Takes a part made from other Ingresses over other hosts (see
    /// [`IngressProcessor`](super::ingress::IngressProcessor), which orders the annotation
    /// reports once every part is in).
    pub(crate) fn absorb(&mut self, mut part: Part) {
        self.diagnostics.append(&mut part.diagnostics);
        let References {
            ingresses,
            services,
            secrets,
        } = part.references;
        self.references.ingresses.extend(ingresses);
        self.references.services.extend(services);
        self.references.secrets.extend(secrets);
        self.certs.absorb(part.certs);
        self.upstream_tls.absorb(part.upstream_tls);
        for (id, spec) in part.backends {
            self.backends.entry(id).or_insert(spec);
        }
        for (text, id) in part.ids {
            self.ids.entry(text).or_insert(id);
        }
        self.routes.absorb(part.routes);
        self.annotations.append(&mut part.annotations);
        self.footprints.absorb(part.footprints);
    }

    /// The Ingress processor starts on `ingress`: what it references and touches from now on is
    /// its own (see [`incremental`](super::incremental)).
    pub(crate) fn begin_ingress(&mut self, origin: &dataplane::Origin, ingress: &StoredIngress) {
        let diagnostics = self.diagnostics.len();
        self.footprints
            .begin(origin, ingress, &mut self.references, diagnostics);
    }

    /// The Ingress processor is done with the Ingress it began.
    pub(crate) fn end_ingress(&mut self) {
        self.footprints.end(&mut self.references, &self.diagnostics);
    }

    /// The Service of a name, if it exists.
    pub(crate) fn service(&self, name: &NsName) -> Option<&'a dyn ServiceView> {
        self.services.get(&name.namespace, &name.name)
    }

    /// Records a problem of `object`.
    pub(crate) fn diagnose(&mut self, object: &ObjectKey, reason: Reason, message: String) {
        self.diagnostics
            .push(Diagnostic::new(object.clone(), reason, message));
    }

    /// Resolves a Service port that a route of `from` names (for messages, `what` the route is);
    /// a diagnostic and `None` when the Service, or the port, does not exist or cannot be served.
    pub(crate) fn service_port(
        &mut self,
        from: &ObjectKey,
        name: NsName,
        port: PortRef<'_>,
        what: &dyn fmt::Display,
    ) -> Option<BackendId> {
        if !self.references.services.contains(&name) {
            self.references.services.insert(name.clone());
        }
        let Some(service) = self.service(&name) else {
            let message = format!("{what}: Service {name} does not exist; skipped");
            self.diagnose(from, Reason::MissingService, message);
            return None;
        };
        if external::is_external(service) {
            return self.external_backend(from, name, port, what);
        }
        let ports = service.ports();
        let found = match port {
            PortRef::Number(number) => ports.iter().find(|p| p.port == number),
            PortRef::Name(port_name) => ports.iter().find(|p| p.name.as_deref() == Some(port_name)),
            PortRef::Missing => {
                let message = format!("{what}: no port given for Service {name}; skipped");
                self.diagnose(from, Reason::UnknownServicePort, message);
                return None;
            }
        };
        let Some(found) = found else {
            let written = Written(port);
            let message = format!("{what}: Service {name} has no port {written}; skipped");
            self.diagnose(from, Reason::UnknownServicePort, message);
            return None;
        };
        // `namespace/name:port`, written without `fmt` (25,000 of these per full build at the
        // 10k-Ingress size, most of them found in `ids`).
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.clear();
        scratch.push_str(&name.namespace);
        scratch.push('/');
        scratch.push_str(&name.name);
        scratch.push(':');
        let port_at = scratch.len();
        Written(port).push_to(&mut scratch);
        let id = match self.ids.get(scratch.as_str()) {
            Some(id) => id.clone(),
            None => self.new_backend(name, &scratch[port_at..], found),
        };
        self.scratch = scratch;
        Some(id)
    }

    /// The id of the Service port `found` of `name`, written `written` by the route, with its
    /// spec added (unless a route naming the same port differently added it).
    fn new_backend(&mut self, name: NsName, written: &str, found: &ServicePort) -> BackendId {
        let id = BackendId::new(&name.namespace, &name.name, written);
        if !self.backends.contains_key(&id) {
            let spec = self.backend_spec(name, written, found);
            self.backends.insert(id.clone(), Arc::new(spec));
        }
        self.ids.insert(id.as_str().into(), id.clone());
        id
    }

    /// The spec of a backend on a Service port; an `appProtocol` duet does not know is a
    /// diagnostic of the Service, and HTTP/1.1 applies.
    fn backend_spec(&mut self, service: NsName, written: &str, port: &ServicePort) -> BackendSpec {
        let protocol = app_protocol(port.app_protocol.as_deref()).unwrap_or_else(|| {
            self.diagnostics.push(Diagnostic::new(
                ObjectKey::new(Kind::Service, &*service.namespace, &*service.name),
                Reason::UnsupportedAppProtocol,
                format!(
                    "port {written}: appProtocol {:?} is not supported; served as HTTP/1.1",
                    port.app_protocol.as_deref().unwrap_or_default()
                ),
            ));
            UpstreamProtocol::Http1
        });
        BackendSpec {
            service,
            port_name: port.name.clone().unwrap_or_default(),
            port: port.port,
            protocol,
            cluster_ips: Vec::new(),
            external_name: None,
        }
    }

    /// The backend of an ExternalName Service (see [`external`]): its name, or its IP literal as
    /// the one target, at the port ingress-nginx would use; a diagnostic and `None` when the name
    /// or the port cannot be used.
    fn external_backend(
        &mut self,
        from: &ObjectKey,
        name: NsName,
        port: PortRef<'_>,
        what: &dyn fmt::Display,
    ) -> Option<BackendId> {
        let service = self.service(&name)?;
        let target = match external::external_name(service) {
            Ok(target) => target,
            Err(why) => {
                let message = format!("{what}: Service {name}: {why}; skipped");
                self.diagnose(from, Reason::UnsupportedBackend, message);
                return None;
            }
        };
        let ports = service.ports();
        let (written, found, number) = match port {
            PortRef::Number(n) => (n.to_string(), ports.iter().find(|p| p.port == n), Some(n)),
            PortRef::Name(n) => (
                n.to_owned(),
                ports.iter().find(|p| p.name.as_deref() == Some(n)),
                None,
            ),
            PortRef::Missing => (String::new(), None, None),
        };
        let Some(number) = external::external_port(found, number) else {
            let message = format!("{what}: ExternalName Service {name} has no usable port {written:?} (a numeric targetPort or port); skipped");
            self.diagnose(from, Reason::UnknownServicePort, message);
            return None;
        };
        let id = BackendId::new(&name.namespace, &name.name, &written);
        let default_port = ServicePort {
            port: number,
            ..ServicePort::default()
        };
        let mut spec = self.backend_spec(name, &written, found.unwrap_or(&default_port));
        spec.port = number;
        match target {
            external::ExternalName::Ip(ip) => spec.cluster_ips = vec![ip],
            external::ExternalName::Name(host) => spec.external_name = Some(host),
        }
        self.backends
            .entry(id.clone())
            .or_insert_with(|| Arc::new(spec));
        Some(id)
    }

    /// The backend sending the requests of the resolved backend `id` to its Service's cluster IPs
    /// (one target) instead of its pods: ingress-nginx's `service-upstream` on a route of `from`.
    /// A headless Service keeps its pods, with a diagnostic.
    pub(crate) fn cluster_ip_backend(&mut self, from: &ObjectKey, id: BackendId) -> BackendId {
        let Some(spec) = self.backends.get(&id) else {
            return id;
        };
        let ips = self
            .service(&spec.service)
            .map(cluster_ips)
            .unwrap_or_default();
        if ips.is_empty() {
            let message = format!(
                "nginx.ingress.kubernetes.io/service-upstream: Service {} has no cluster IP (headless); requests go to its pods",
                spec.service
            );
            self.diagnose(from, Reason::InvalidAnnotation, message);
            return id;
        }
        let written = id.as_str().rsplit_once(':').map_or("", |(_, port)| port);
        let (namespace, name) = (&spec.service.namespace, &spec.service.name);
        let cluster = BackendId::new(namespace, name, &format!("{written}/cluster-ip"));
        let spec = BackendSpec {
            cluster_ips: ips,
            ..BackendSpec::clone(spec)
        };
        self.backends
            .entry(cluster.clone())
            .or_insert_with(|| Arc::new(spec));
        cluster
    }

    /// The upstream TLS settings of a route of `ingress` to a resolved backend, spoken in
    /// `backend-protocol`'s protocol when the Ingress sets it (then unverified without a CA
    /// Secret, as in ingress-nginx).
    pub(crate) fn upstream_tls(
        &mut self,
        key: &ObjectKey,
        ingress: &StoredIngress,
        id: &BackendId,
        nginx_protocol: Option<UpstreamProtocol>,
    ) -> Option<Arc<dataplane::upstream_tls::UpstreamTls>> {
        let spec = self.backends.get(id)?;
        self.upstream_tls.route(
            key,
            ingress,
            &spec.service,
            (
                nginx_protocol.unwrap_or(spec.protocol),
                nginx_protocol.is_some(),
            ),
            &mut self.diagnostics,
            &mut self.references,
        )
    }

    /// The plan: the route table built from the model, the backends it uses, the certificates
    /// (with `--default-tls-secret`), and every diagnostic sorted, without duplicates.
    pub(crate) fn finish(mut self) -> RoutePlan {
        if let Some(name) = &self.config.default_tls_secret {
            self.certs
                .default_secret(name, &mut self.diagnostics, &mut self.references);
        }
        let recorder = std::mem::take(&mut self.footprints);
        let base = self.references.clone();
        let footprints = move || {
            let footprints = recorder.finish(base);
            let references = footprints.references();
            (Arc::new(footprints), Arc::new(references))
        };
        let routes = std::mem::take(&mut self.routes);
        let (diagnostics, annotations) = (&mut self.diagnostics, &mut self.annotations);
        // At scale the footprints and their references (20,000 names at the 10k-Ingress size) are
        // made on a second core while the table is built; they do not depend on each other.
        let ((footprints, references), table) = if self.backends.len() >= PARALLEL_FINISH {
            std::thread::scope(|scope| {
                let prints = scope.spawn(footprints);
                let table = routes.build(diagnostics, annotations);
                (prints.join().expect("the footprints"), table)
            })
        } else {
            (footprints(), routes.build(diagnostics, annotations))
        };
        let gateway_ids = self
            .gateways
            .table
            .actions()
            .flat_map(RouteAction::backend_ids);
        let mut backends = self.backends;
        retain_used(&mut backends, table.backend_ids().chain(gateway_ids));
        let mut diagnostics = self.diagnostics;
        diagnostics.sort();
        diagnostics.dedup();
        RoutePlan {
            table: Arc::new(table),
            backends,
            references,
            diagnostics,
            certs: Arc::new(self.certs.finish()),
            annotations: self.annotations,
            gateways: Arc::new(self.gateways.table),
            gateway_report: Arc::new(self.gateways.report),
            footprints,
        }
    }
}

/// Removes from `backends` those no id of `used` names. The routes hold clones of the ids
/// resolved into `backends` (one allocation per id), so an id is matched by its
/// [`identity`](BackendId::identity): no id's text is read or hashed (20,000 route ids, each
/// a cache miss away, took a third of what the route table's build took at the 10k-Ingress size).
/// A route's id that is no key's clone (a Service resolved by both parts of a split route
/// phase) is matched by value.
fn retain_used<'b>(
    backends: &mut BTreeMap<BackendId, Arc<BackendSpec>>,
    used: impl Iterator<Item = &'b BackendId>,
) {
    let keys: FastSet<usize> = backends.keys().map(BackendId::identity).collect();
    let mut used_keys: FastSet<usize> =
        FastSet::with_capacity_and_hasher(keys.len(), Default::default());
    let mut used_values: FastSet<&BackendId> = FastSet::default();
    for id in used {
        if keys.contains(&id.identity()) {
            used_keys.insert(id.identity());
        } else {
            used_values.insert(id);
        }
    }
    backends.retain(|id, _| used_keys.contains(&id.identity()) || used_values.contains(id));
}

/// Backends from which [`Translation::finish`] builds the footprints beside the table.
const PARALLEL_FINISH: usize = 1024;

/// What a [`Translation`] made, apart from what it borrows: see [`Translation::into_part`].
pub(crate) struct Part {
    diagnostics: Vec<Diagnostic>,
    references: References,
    certs: dataplane::table::CertTable,
    upstream_tls: BTreeMap<(NsName, NsName, bool), Arc<dataplane::upstream_tls::UpstreamTls>>,
    backends: BTreeMap<BackendId, Arc<BackendSpec>>,
    ids: FastMap<Box<str>, BackendId>,
    routes: RouteModel,
    annotations: Vec<AnnotationReport>,
    footprints: super::incremental::Recorder,
}

/// Hash maps keyed by names from the cluster's objects, hashed fast (foldhash, seeded per
/// process) rather than with SipHash: translation looks names up for every route.
pub(super) type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// A set hashed as [`FastMap`].
pub(super) type FastSet<K> = std::collections::HashSet<K, foldhash::fast::RandomState>;

/// Every Service of the inputs by namespace (`default` when unset) and name; of two with the
/// same name, the later one.
enum Services<'a> {
    /// The inputs' Services, in strictly increasing name order (as the index lists them: one
    /// per name, [`Inputs::sorted`]), looked up by binary search: a run by host over a few
    /// Ingresses makes no map of every Service (10,000 inserts at the 10k-Ingress size).
    Sorted(Vec<&'a dyn ServiceView>),
    /// Otherwise (the tests' and benches' API objects, in any order), hashed.
    Hashed(FastMap<(&'a str, &'a str), &'a dyn ServiceView>),
}

impl<'a> Services<'a> {
    fn of(inputs: &Inputs<'a>) -> Services<'a> {
        let all = inputs.all_services();
        if inputs.sorted && inputs.services.is_empty() {
            debug_assert!(all.is_sorted_by(|a, b| service_key(*a) < service_key(*b)));
            return Services::Sorted(all);
        }
        let mut map = FastMap::with_capacity_and_hasher(all.len(), Default::default());
        for service in all {
            map.insert(service_key(service), service);
        }
        Services::Hashed(map)
    }

    fn get(&self, namespace: &str, name: &str) -> Option<&'a dyn ServiceView> {
        match self {
            Services::Sorted(all) => all
                .binary_search_by(|s| service_key(*s).cmp(&(namespace, name)))
                .ok()
                .map(|at| all[at]),
            Services::Hashed(map) => map.get(&(namespace, name)).copied(),
        }
    }
}

/// A Service's namespace (`default` when unset) and name.
fn service_key(service: &dyn ServiceView) -> (&str, &str) {
    let namespace = service.namespace().unwrap_or("default");
    (namespace, service.name().unwrap_or_default())
}

/// A Service port as a route wrote it: its number or name (empty when not given).
struct Written<'p>(PortRef<'p>);

impl Written<'_> {
    /// Appends the port as [`Display`](fmt::Display) writes it, without `fmt`.
    fn push_to(&self, out: &mut String) {
        match self.0 {
            PortRef::Number(number) => out.push_str(itoa::Buffer::new().format(number)),
            PortRef::Name(name) => out.push_str(name),
            PortRef::Missing => {}
        }
    }
}

impl fmt::Display for Written<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            PortRef::Number(number) => write!(f, "{number}"),
            PortRef::Name(name) => f.write_str(name),
            PortRef::Missing => Ok(()),
        }
    }
}

/// The cluster IPs of a Service (`spec.clusterIPs`, else `spec.clusterIP`), parsed; none for a
/// headless Service.
fn cluster_ips(service: &dyn ServiceView) -> Vec<IpAddr> {
    service
        .cluster_ips()
        .into_iter()
        .filter_map(|ip| ip.trim().parse::<IpAddr>().ok())
        .map(|ip| ip.to_canonical())
        .collect()
}

/// The processor's output, kept by the translation.
#[derive(Clone, Debug, Default)]
pub struct GatewayOutput {
    /// Listeners by pod port.
    pub table: dataplane::table::gateway::GatewayTable,
    /// Status.
    pub report: crate::gateway_api::report::GatewayReport,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(service: &str) -> BackendSpec {
        BackendSpec {
            service: NsName::new("shop", service),
            port_name: String::new(),
            port: 80,
            protocol: UpstreamProtocol::Http1,
            cluster_ips: Vec::new(),
            external_name: None,
        }
    }

    #[test]
    fn backends_used_by_a_clone_or_an_equal_id_are_kept_the_rest_removed() {
        let [api, web, db] = ["api", "web", "db"].map(|s| BackendId::new("shop", s, "80"));
        let mut backends: BTreeMap<BackendId, Arc<BackendSpec>> = [&api, &web, &db]
            .into_iter()
            .map(|id| (id.clone(), Arc::new(spec(id.service()))))
            .collect();
        // `api` by a clone of its key; `web` by an id made apart (another part's resolution).
        let web_elsewhere = BackendId::new("shop", "web", "80");
        assert_ne!(web_elsewhere.identity(), web.identity());
        let routes = [api.clone(), web_elsewhere, api.clone()];
        retain_used(&mut backends, routes.iter());
        let kept: Vec<&str> = backends.keys().map(BackendId::as_str).collect();
        assert_eq!(kept, ["shop/api:80", "shop/web:80"]);

        retain_used(&mut backends, std::iter::empty());
        assert!(backends.is_empty(), "no route, no backend");
    }
}
