//! The control loop: source changes -> index -> debounce -> translate -> `Runtime::apply`.
//!
//! Nothing is published before the source's first full listing ([`SourceEvent::Synced`]); after
//! that, changes are debounced (publish once no change came for `holdoff`, and at the latest
//! `max_delay` after the first pending change). Every rebuild reads the whole store state. A
//! change touching only EndpointSlices reuses the previous route plan, so the new snapshot shares
//! the old `Arc<RouteTable>`; backends equal by value keep their `Arc` either way.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dataplane::admin::DebugExtra;
use dataplane::{Backend, BackendId, BackendMap, Runtime, Snapshot};
use serde::Serialize;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::index::{Change, Impact, Index};
use crate::metrics::ControllerMetrics;
use crate::object::NsName;
use crate::resolve::NameResolver;
use crate::source::SourceEvent;
use crate::translate::{self, AnnotationReport, Diagnostic, Resolved, RoutePlan};

/// How the loop runs.
#[derive(Clone, Debug)]
pub struct AppConfig {
    /// What translation needs.
    pub translate: translate::Config,
    /// Publish once no change came for this long.
    pub holdoff: Duration,
    /// Publish at the latest this long after the first pending change.
    pub max_delay: Duration,
}

impl AppConfig {
    /// The default debounce (holdoff 50 ms, max delay 500 ms) around a translation config.
    pub fn new(translate: translate::Config) -> AppConfig {
        AppConfig {
            translate,
            holdoff: Duration::from_millis(50),
            max_delay: Duration::from_millis(500),
        }
    }
}

/// A diagnostic with the manifest file of its object, when known.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Reported {
    /// The diagnostic.
    #[serde(flatten)]
    pub diagnostic: Diagnostic,
    /// The manifest file the object came from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file: Option<PathBuf>,
}

/// The diagnostics of the live snapshot, shared with the admin endpoint.
#[derive(Clone, Debug, Default)]
pub struct Diagnostics(Arc<Mutex<Vec<Reported>>>, Arc<Mutex<Vec<AnnotationReport>>>);

impl Diagnostics {
    /// The diagnostics of the last published snapshot.
    pub fn current(&self) -> Vec<Reported> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The ingress-nginx annotation reports of the last route build.
    pub fn annotations(&self) -> Vec<AnnotationReport> {
        self.1.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn set(&self, all: Vec<Reported>) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = all;
    }

    fn set_annotations(&self, all: Vec<AnnotationReport>) {
        *self.1.lock().unwrap_or_else(|e| e.into_inner()) = all;
    }

    /// The extra JSON for `/debug/routes`: `{"diagnostics": [...], "annotations": [...]}`.
    pub fn debug_extra(&self) -> DebugExtra {
        let this = self.clone();
        Arc::new(
            move || serde_json::json!({ "diagnostics": this.current(), "annotations": this.annotations() }),
        )
    }
}

/// The controller's state between publishes.
#[derive(Debug)]
pub struct App {
    config: AppConfig,
    runtime: Arc<Runtime>,
    index: Index,
    plan: Option<RoutePlan>,
    published: Option<Arc<Snapshot>>,
    version: u64,
    reported: BTreeSet<Diagnostic>,
    diagnostics: Diagnostics,
    pending: Impact,
    /// When the first of the pending changes reached the loop.
    pending_since: Option<std::time::Instant>,
    /// The backend phase's diagnostics of the live backends, by Service.
    backend_diagnostics: translate::ServiceDiagnostics,
    synced: bool,
    metrics: Option<ControllerMetrics>,
    observers: Observers,
    names: Option<NameResolver>,
    resolved: Arc<Resolved>,
}

/// Who hears about published Ingresses and new diagnostics (Kubernetes mode's status writer and
/// Event recorder).
#[derive(Debug, Default)]
struct Observers {
    live: Option<watch::Sender<Arc<BTreeSet<NsName>>>>,
    diagnostics: Option<watch::Sender<Arc<Vec<Diagnostic>>>>,
    gateways: Option<watch::Sender<Arc<crate::gateway_api::report::GatewayReport>>>,
}

impl App {
    /// A loop publishing to `runtime`.
    pub fn new(config: AppConfig, runtime: Arc<Runtime>) -> App {
        App {
            index: Index::new(config.translate.class.clone()),
            config,
            runtime,
            plan: None,
            published: None,
            version: 0,
            reported: BTreeSet::new(),
            diagnostics: Diagnostics::default(),
            pending: Impact::default(),
            pending_since: None,
            backend_diagnostics: translate::ServiceDiagnostics::new(),
            synced: false,
            observers: Observers::default(),
            metrics: None,
            names: None,
            resolved: Arc::default(),
        }
    }

    /// After every publish, sends our Ingresses whose routes are now live (applied in the
    /// runtime) to `live`, and the whole current set of diagnostics to `diagnostics` whenever it
    /// changed (a problem appeared or was resolved); the channel holds the latest set only.
    pub fn observe(
        &mut self,
        live: watch::Sender<Arc<BTreeSet<NsName>>>,
        diagnostics: watch::Sender<Arc<Vec<Diagnostic>>>,
    ) {
        self.observers.live = Some(live);
        self.observers.diagnostics = Some(diagnostics);
    }

    /// After every publish, sends what the Gateway API objects' status should say (route
    /// parents, attached routes) to `gateways`, when it changed.
    pub fn observe_gateways(
        &mut self,
        gateways: watch::Sender<Arc<crate::gateway_api::report::GatewayReport>>,
    ) {
        self.observers.gateways = Some(gateways);
    }

    /// Tells the observer which of our Ingresses the live snapshot serves.
    fn announce_live(&self) {
        self.announce_gateways();
        let Some(tx) = &self.observers.live else {
            return;
        };
        let ingresses = &self.index.references().ingresses;
        tx.send_if_modified(|old| {
            if **old != *ingresses {
                *old = Arc::new(ingresses.clone());
                true
            } else {
                false
            }
        });
    }

    /// Tells the Gateway API status writers what the live snapshot serves.
    fn announce_gateways(&self) {
        let (Some(tx), Some(plan)) = (&self.observers.gateways, &self.plan) else {
            return;
        };
        tx.send_if_modified(|old| {
            let changed = **old != *plan.gateway_report;
            if changed {
                *old = plan.gateway_report.clone();
            }
            changed
        });
    }

    /// Records build times and diagnostics in `metrics`.
    pub fn with_metrics(mut self, metrics: ControllerMetrics) -> App {
        self.metrics = Some(metrics);
        self
    }

    /// Looks up ExternalName Services' names with `names` (see [`crate::resolve`]).
    pub fn with_resolver(mut self, names: NameResolver) -> App {
        self.names = Some(names);
        self
    }

    /// Takes the resolver's new answers; returns whether the backends need a rebuild (they do
    /// when routes use ExternalName Services: an endpoint-only change of those Services).
    fn take_answers(&mut self, answers: Arc<Resolved>) -> bool {
        self.resolved = answers;
        let services = self.plan.iter().flat_map(|p| p.backends.values());
        let external = services.filter(|s| s.external_name.is_some());
        self.pending
            .endpoints
            .extend(external.map(|s| s.service.clone()));
        !self.pending.is_empty()
    }

    /// Tells the resolver the names the plan's ExternalName backends use.
    fn want_names(&self) {
        if let (Some(names), Some(plan)) = (&self.names, &self.plan) {
            let wanted = translate::wanted_names(plan);
            names.wanted.send_if_modified(|old| {
                let changed = *old != wanted;
                *old = wanted;
                changed
            });
        }
    }

    /// The diagnostics handle (for `/debug/routes`).
    pub fn diagnostics(&self) -> Diagnostics {
        self.diagnostics.clone()
    }

    /// The stored objects.
    pub fn index(&self) -> &Index {
        &self.index
    }

    /// Stores changes; returns whether they need a rebuild.
    pub fn ingest(&mut self, changes: Vec<Change>) -> bool {
        for change in changes {
            let impact = self.index.apply(change);
            self.pending.merge(impact);
        }
        if !self.pending.is_empty() {
            self.pending_since
                .get_or_insert_with(std::time::Instant::now);
        }
        !self.pending.is_empty()
    }

    /// Rebuilds from the stored state and publishes, unless nothing changed since the last
    /// publish. Returns the published snapshot.
    pub fn publish(&mut self) -> Option<Arc<Snapshot>> {
        let started = std::time::Instant::now();
        let pending = std::mem::take(&mut self.pending);
        let pending_since = self.pending_since.take();
        let rebuild_routes = self.plan.is_none() || pending.routes;
        let mut replaced = None;
        if rebuild_routes {
            replaced = self.plan_routes(&pending);
            self.want_names();
        }
        let by_host = replaced.is_some();
        let routes_done = std::time::Instant::now();
        let (built, prepared) = self.build(rebuild_routes, &pending, replaced);
        let (backends, changed) = built?;
        let backends_done = std::time::Instant::now();
        self.report_all(rebuild_routes)?;
        if self.unchanged(&backends, changed.as_deref()) {
            tracing::debug!(
                snapshot.version = self.version,
                routes.rebuilt = rebuild_routes,
                routes.by_host = by_host,
                build.ms = started.elapsed().as_secs_f64() * 1e3,
                "Nothing changed; snapshot kept"
            );
            if rebuild_routes {
                self.announce_live();
            }
            return None;
        }
        self.version += 1;
        let plan = self.plan.as_ref()?;
        let snapshot = Arc::new(translate::snapshot(plan, backends, self.version));
        let apply_started = std::time::Instant::now();
        self.apply(&snapshot, changed.as_deref(), prepared);
        let build = started.elapsed();
        if let Some(metrics) = &self.metrics {
            metrics.observe_build(build);
        }
        let phases = BuildPhases {
            routes: routes_done - started,
            backends: backends_done - routes_done,
            report: apply_started - backends_done,
            apply: apply_started.elapsed(),
        };
        let how = (rebuild_routes, by_host);
        self.log_applied(&snapshot, how, build, phases, pending_since);
        let old = self.published.replace(snapshot.clone());
        if rebuild_routes {
            // The last holder of the replaced route table and backends, most often.
            retire(old);
            // The live Ingresses and the Gateway report change only with the routes: after an
            // endpoint-only change, comparing the 10,000 names of the 10k-Ingress size again
            // cost as much as a third of the build.
            self.announce_live();
        }
        Some(snapshot)
    }

    /// The backends ([`Self::build_backends`]) and, for a new route table at scale, its metric
    /// handles, made on a thread of their own while the backends are built (they depend on
    /// nothing else, and the backend phase's threads share the cores with it).
    fn build(
        &mut self,
        rebuild_routes: bool,
        pending: &Impact,
        replaced: Option<RoutePlan>,
    ) -> (Option<Built>, Option<dataplane::PreparedRoutes>) {
        let prepare = self.plan.as_ref().filter(|plan| {
            let new_table = self.published.as_ref().is_none_or(|old| {
                !Arc::ptr_eq(&old.routes, &plan.table)
                    || !Arc::ptr_eq(&old.gateways, &plan.gateways)
            });
            rebuild_routes && new_table && plan.backends.len() >= PREPARE_ROUTES_FROM
        });
        let Some(plan) = prepare else {
            return (self.build_backends(rebuild_routes, pending, replaced), None);
        };
        let (runtime, table, gateways) = (
            self.runtime.clone(),
            plan.table.clone(),
            plan.gateways.clone(),
        );
        std::thread::scope(|scope| {
            let handles = scope.spawn(move || runtime.prepare_routes(&table, &gateways));
            let built = self.build_backends(rebuild_routes, pending, replaced);
            (built, Some(handles.join().expect("the route handles")))
        })
    }

    /// Reports the plan's and the backends' diagnostics (and, after a route rebuild, hands the
    /// plan's references to the index). `None` without a plan.
    fn report_all(&mut self, rebuild_routes: bool) -> Option<()> {
        let plan = self.plan.as_ref()?;
        let backend_diagnostics = self
            .backend_diagnostics
            .values()
            .flatten()
            .cloned()
            .collect();
        let all = translate::merge_diagnostics(&plan.diagnostics, backend_diagnostics);
        if rebuild_routes {
            // The plan's references are shared with the index (20,000 names at the 10k-Ingress
            // size, not cloned); the live Ingresses are read from there.
            self.index.set_references(plan.references.clone());
        }
        self.report(all);
        Some(())
    }

    /// Whether the published snapshot already is what the plan and `backends` would make: after
    /// an endpoint-only change (`changed`) only the changed Services' backends can differ.
    fn unchanged(&self, backends: &Backends, changed: Option<&[BackendId]>) -> bool {
        let (Some(old), Some(plan)) = (&self.published, &self.plan) else {
            return false;
        };
        Arc::ptr_eq(&old.routes, &plan.table)
            && Arc::ptr_eq(&old.certs, &plan.certs)
            && Arc::ptr_eq(&old.gateways, &plan.gateways)
            && old.backends.len() == backends.len()
            && match changed {
                None => same_backends(&old.backends, backends.iter()),
                Some(ids) => same_backends(
                    &old.backends,
                    ids.iter().filter_map(|id| backends.get_key_value(id)),
                ),
            }
    }

    /// Hands a new snapshot to the dataplane: only the changed backends after an endpoint-only
    /// change, with the prepared route handles when there are some.
    fn apply(
        &self,
        snapshot: &Arc<Snapshot>,
        changed: Option<&[BackendId]>,
        prepared: Option<dataplane::PreparedRoutes>,
    ) {
        match (changed, &self.published) {
            (Some(ids), Some(base)) => self.runtime.apply_changed(snapshot.clone(), base, ids),
            _ => match prepared {
                Some(prepared) => self.runtime.apply_prepared(snapshot.clone(), prepared),
                None => self.runtime.apply(snapshot.clone()),
            },
        }
    }

    /// The backends for the plan: after an endpoint-only change, those of the changed Services
    /// rebuilt and every other one the published `Arc` (with the ids rebuilt); else all of them
    /// (reusing `Arc`s equal by value).
    /// After an Ingress change planned host by host (`replaced`: the plan before it), only the
    /// backends whose spec or endpoints changed are built.
    fn build_backends(
        &mut self,
        rebuild_routes: bool,
        pending: &crate::index::Impact,
        replaced: Option<RoutePlan>,
    ) -> Option<Built> {
        let plan = self.plan.as_ref()?;
        let config = &self.config.translate;
        let empty = BackendMap::new();
        let previous = self.published.as_ref().map_or(&empty, |s| &s.backends);
        if let (Some(old), Some(_)) = (&replaced, &self.published) {
            let index = &self.index;
            let backends = translate::update_backends_after_routes(
                plan,
                old,
                &pending.endpoints,
                |service| index.slices_of(service),
                Some(&*self.resolved),
                config,
                previous,
                &mut self.backend_diagnostics,
            );
            retire(replaced);
            return Some((backends, None));
        }
        let updated = if rebuild_routes {
            None
        } else {
            let index = &self.index;
            translate::update_backends(
                plan,
                &pending.endpoints,
                |service| index.slices_of(service),
                Some(&*self.resolved),
                config,
                previous,
                &mut self.backend_diagnostics,
            )
        };
        if let Some(backends) = updated {
            let changed = translate::backends_of(plan, &pending.endpoints);
            return Some((backends, Some(changed)));
        }
        let index = &self.index;
        let (backends, by_service) = translate::build_backends_with(
            plan,
            |service| index.slices_of(service),
            Some(&*self.resolved),
            config,
            previous,
        );
        self.backend_diagnostics = by_service;
        Some((backends, None))
    }

    /// Logs a published snapshot: its size, whether routes were rebuilt (and whether host by
    /// host, for the hosts a change touched), how long the build and apply took, and how long
    /// after the first change it waited for it went live (the debounce holdoff included: the
    /// time from the change reaching the control loop).
    fn log_applied(
        &self,
        snapshot: &Snapshot,
        (rebuild_routes, by_host): (bool, bool),
        build: Duration,
        phases: BuildPhases,
        pending_since: Option<std::time::Instant>,
    ) {
        let targets: usize = snapshot.backends.values().map(|b| b.targets.len()).sum();
        let since_change = pending_since.map(|t| t.elapsed().as_secs_f64() * 1e3);
        tracing::info!(
            snapshot.version = self.version,
            hosts = snapshot.routes.exact.len() + snapshot.routes.wildcard.len(),
            backends = snapshot.backends.len(),
            targets,
            routes.rebuilt = rebuild_routes,
            routes.by_host = by_host,
            build.ms = build.as_secs_f64() * 1e3,
            build.routes_ms = phases.routes.as_secs_f64() * 1e3,
            build.backends_ms = phases.backends.as_secs_f64() * 1e3,
            build.report_ms = phases.report.as_secs_f64() * 1e3,
            build.apply_ms = phases.apply.as_secs_f64() * 1e3,
            change.age_ms = since_change,
            "Snapshot applied"
        );
    }

    /// The route phase from the whole stored state, or for a change of Ingresses (and of Services
    /// and Secrets that only Ingresses read) over just the hosts it touches
    /// ([`translate::incremental`]); the old table and certificates are kept
    /// (their `Arc`s) when the rebuild produced the same.
    /// Returns the replaced plan when the new one was planned host by host.
    fn plan_routes(&mut self, pending: &Impact) -> Option<RoutePlan> {
        let mut inputs = self.index.inputs();
        inputs.names = Some(&*self.resolved);
        let config = &self.config.translate;
        let incremental = match &self.plan {
            Some(old) if !pending.all_routes => translate::incremental::changed_ingresses(
                old,
                &pending.ingresses,
                &pending.services,
                &pending.secrets,
            )
            .filter(|changed| !changed.is_empty())
            .and_then(|changed| {
                translate::incremental::plan_ingress_change(old, &mut inputs, config, &changed)
            }),
            _ => None,
        };
        let by_host = incremental.is_some();
        tracing::debug!(incremental = by_host, "Route phase");
        let mut plan = incremental.unwrap_or_else(|| translate::plan_routes(&inputs, config));
        if let Some(old) = &self.plan {
            // A plan made by host shares what it did not replace, and the replaced entries that
            // came out equal ([`translate::incremental`]): only a full build is compared whole.
            if !by_host && translate::reuse_hosts(Arc::make_mut(&mut plan.table), &old.table) {
                plan.table = old.table.clone();
            }
            if *old.certs == *plan.certs {
                plan.certs = old.certs.clone();
            }
            if *old.gateways == *plan.gateways {
                plan.gateways = old.gateways.clone();
            }
        }
        self.diagnostics.set_annotations(plan.annotations.clone());
        if let Some(metrics) = &self.metrics {
            metrics.set_annotations(&plan.annotations);
        }
        let replaced = self.plan.replace(plan);
        if by_host {
            return replaced;
        }
        retire(replaced);
        None
    }

    /// Logs diagnostics not reported before (once per change) and shares the current set.
    fn report(&mut self, all: Vec<Diagnostic>) {
        let file_of = |d: &Diagnostic| self.index.file_of(&d.object).map(|f| f.to_path_buf());
        // A set, not `all.contains`: with thousands of diagnostics (every endpoint of a large
        // cluster refused, an annotation on every Ingress) a linear search per reported one
        // took seconds per publish.
        let current: BTreeSet<&Diagnostic> = all.iter().collect();
        let new: Vec<Diagnostic> = all
            .iter()
            .filter(|d| !self.reported.contains(*d))
            .cloned()
            .collect();
        if let Some(tx) = &self.observers.diagnostics {
            let resolved = self.reported.iter().any(|d| !current.contains(d));
            if !new.is_empty() || resolved {
                tx.send_replace(Arc::new(all.clone()));
            }
        }
        for d in &new {
            match file_of(d) {
                Some(file) => tracing::warn!(
                    object = %d.object,
                    reason = %d.reason,
                    file = %file.display(),
                    detail = %d.message,
                    "Configuration problem"
                ),
                None => tracing::warn!(
                    object = %d.object,
                    reason = %d.reason,
                    detail = %d.message,
                    "Configuration problem"
                ),
            }
        }
        for d in self.reported.iter().filter(|d| !current.contains(d)) {
            tracing::info!(object = %d.object, reason = %d.reason, "Configuration problem resolved");
        }
        let shared = all
            .iter()
            .map(|d| Reported {
                diagnostic: d.clone(),
                file: file_of(d),
            })
            .collect();
        self.diagnostics.set(shared);
        if let Some(metrics) = &self.metrics {
            metrics.set_diagnostics(&all);
        }
        self.reported = all.into_iter().collect();
    }

    /// Runs until the source channel closes: ingests changes, publishes once synced, debounced.
    pub async fn run(mut self, mut events: mpsc::Receiver<SourceEvent>) {
        let mut first_pending: Option<Instant> = None;
        let mut last_change = Instant::now();
        let mut answers = self.names.as_ref().map(|n| n.answers.clone());
        loop {
            let deadline = match first_pending {
                Some(first) if self.synced => {
                    Some((last_change + self.config.holdoff).min(first + self.config.max_delay))
                }
                _ => None,
            };
            tokio::select! {
                event = events.recv() => match event {
                    None => {
                        if self.synced && first_pending.is_some() {
                            self.publish();
                        }
                        return;
                    }
                    Some(SourceEvent::Changes(changes)) => {
                        if self.ingest(changes) {
                            let now = Instant::now();
                            first_pending.get_or_insert(now);
                            last_change = now;
                        }
                    }
                    Some(SourceEvent::Synced) => {
                        if !self.synced {
                            self.synced = true;
                            tracing::info!("Sources synced");
                            self.publish();
                            first_pending = None;
                        }
                    }
                },
                Some(new) = answers_changed(&mut answers) => {
                    if self.take_answers(new) {
                        let now = Instant::now();
                        first_pending.get_or_insert(now);
                        last_change = now;
                    }
                }
                () = sleep_until(deadline), if deadline.is_some() => {
                    self.publish();
                    first_pending = None;
                }
            }
        }
    }
}

/// Backends by id, as a snapshot holds them.
type Backends = BackendMap<Arc<Backend>>;

/// Built backends, and the Services whose backends changed after an endpoint-only change.
type Built = (Backends, Option<Vec<BackendId>>);

/// Where a publish's time went, for its "Snapshot applied" line: the route phase (with the
/// names it wants resolved), the backends (and, beside them at scale, a new route table's
/// metric handles), the diagnostics' report and the snapshot's assembly, and the dataplane's
/// apply (live backends, metric handles unless made before, the swap).
struct BuildPhases {
    routes: Duration,
    backends: Duration,
    report: Duration,
    apply: Duration,
}

/// Backends from which a new route table's metric handles are made beside the backend phase
/// ([`dataplane::Runtime::prepare_routes`]): below it a thread costs more than it saves.
const PREPARE_ROUTES_FROM: usize = 2048;

/// Drops what a route rebuild replaced (the previous plan and snapshot: at the 10k-Ingress size
/// tens of thousands of allocations) beside the publish instead of before it returns.
fn retire<T: Send + 'static>(value: Option<T>) {
    if let Some(value) = value {
        dataplane::runtime::drop_beside(value);
    }
}

/// Whether every backend in `new` is the same `Arc` as in `old`.
fn same_backends<'a>(
    old: &BackendMap<Arc<Backend>>,
    mut new: impl Iterator<Item = (&'a BackendId, &'a Arc<Backend>)>,
) -> bool {
    new.all(|(id, b)| old.get(id).is_some_and(|o| Arc::ptr_eq(o, b)))
}

/// The resolver's next answers; never, without a resolver or once it ended.
async fn answers_changed(
    answers: &mut Option<watch::Receiver<Arc<Resolved>>>,
) -> Option<Arc<Resolved>> {
    let Some(rx) = answers else {
        return std::future::pending().await;
    };
    if rx.changed().await.is_err() {
        *answers = None;
        return std::future::pending().await;
    }
    Some(rx.borrow_and_update().clone())
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::object::{Kind, ObjectKey};
    use crate::source::files;
    use crate::translate::Reason;
    use dataplane::ProxyConfig;

    const BASE: &str = r#"
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: web}
spec:
  ingressClassName: duet
  rules:
    - host: a.test
      http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: a, port: {number: 80}}}}]}
    - host: b.test
      http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: b, port: {number: 80}}}}]}
---
apiVersion: v1
kind: Service
metadata: {name: a}
spec: {ports: [{port: 80}]}
---
apiVersion: v1
kind: Service
metadata: {name: b}
spec: {ports: [{port: 80}]}
"#;

    fn slice(service: &str, address: &str) -> String {
        format!(
            "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {service}-v4\n  labels: {{kubernetes.io/service-name: {service}}}\naddressType: IPv4\nports: [{{port: 8080}}]\nendpoints: [{{addresses: [\"{address}\"]}}]\n"
        )
    }

    fn changes(yaml: &str) -> Vec<Change> {
        let parsed = files::parse(yaml, &[]);
        assert!(parsed.problems.is_empty(), "{:?}", parsed.problems);
        parsed
            .objects
            .into_iter()
            .map(|object| Change::Apply { object, file: None })
            .collect()
    }

    fn app() -> (App, Arc<Runtime>) {
        let runtime = Runtime::new(ProxyConfig::default());
        let app = App::new(
            AppConfig::new(translate::Config::default()),
            runtime.clone(),
        );
        (app, runtime)
    }

    fn version(runtime: &Runtime) -> u64 {
        runtime.load().snapshot.version
    }

    #[test]
    fn endpoint_only_change_shares_routes_and_unchanged_backends() {
        let (mut app, runtime) = app();
        app.ingest(changes(BASE));
        app.ingest(changes(&slice("a", "10.0.0.1")));
        app.ingest(changes(&slice("b", "10.0.0.2")));
        let first = app.publish().expect("first publish");
        assert_eq!(first.version, 1);
        assert!(runtime.is_ready());

        let live_before = runtime.load_full();
        let impact_pending = app.ingest(changes(&slice("b", "10.0.0.3")));
        assert!(impact_pending);
        assert!(
            !app.pending.routes,
            "an EndpointSlice change is endpoint-only"
        );
        let second = app.publish().expect("second publish");
        assert_eq!(second.version, 2);
        assert!(
            Arc::ptr_eq(&first.routes, &second.routes),
            "routes are shared"
        );
        let id = |s: &str| dataplane::BackendId::new("default", s, "80");
        assert!(Arc::ptr_eq(
            &first.backends[&id("a")],
            &second.backends[&id("a")]
        ));
        assert!(!Arc::ptr_eq(
            &first.backends[&id("b")],
            &second.backends[&id("b")]
        ));
        assert_eq!(
            second.backends[&id("b")].targets[0].v4,
            Some("10.0.0.3:8080".parse().unwrap())
        );
        assert!(Arc::ptr_eq(&runtime.load().snapshot, &second));
        // The change copied the changed backend's shard of the snapshot's and the live maps; the
        // others are the previous ones (work proportional to the change, not to the backends).
        let shards = dataplane::table::backend_map::SHARDS;
        assert_eq!(second.backends.shared_shards(&first.backends), shards - 1);
        let live_after = runtime.load_full();
        assert_eq!(
            live_after.backends.shared_shards(&live_before.backends),
            shards - 1
        );
    }

    /// `n` Ingresses `i-K` (host `hK.test`) to Services `s-K` (port 80), from `first`.
    fn ingresses(first: usize, n: usize) -> String {
        (first..first + n)
            .map(|k| {
                format!(
                    "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {{name: i-{k}}}\nspec:\n  ingressClassName: duet\n  rules:\n  - host: h{k}.test\n    http: {{paths: [{{path: /, pathType: Prefix, backend: {{service: {{name: s-{k}, port: {{number: 80}}}}}}}}]}}\n---\napiVersion: v1\nkind: Service\nmetadata: {{name: s-{k}}}\nspec: {{ports: [{{port: 80}}]}}\n---\n"
                )
            })
            .collect()
    }

    /// Every route of the live snapshot has its metric handles; their count.
    fn routes_with_handles(runtime: &Runtime) -> usize {
        let live = runtime.load_full();
        for (host, action) in live.snapshot.routes.actions() {
            assert!(live.metrics.route(action).is_some(), "{host}: no handles");
        }
        live.metrics.routes()
    }

    #[test]
    fn route_handles_made_beside_the_backend_phase_serve_every_route() {
        let (mut app, runtime) = app();
        let n = PREPARE_ROUTES_FROM + 10;
        // A file holds at most 1,024 documents: 500 Ingresses and their Services per file.
        for first in (0..n).step_by(500) {
            app.ingest(changes(&ingresses(first, 500.min(n - first))));
        }
        let first = app.publish().expect("first publish");
        assert_eq!(first.backends.len(), n);
        assert_eq!(routes_with_handles(&runtime), n);
        let handles = |runtime: &Runtime, host: &str| {
            let live = runtime.load_full();
            let m = live.snapshot.routes.find(host, "/").expect("a route");
            live.metrics.route(m.action).expect("handles").clone()
        };
        let kept = handles(&runtime, "h7.test");

        // One Ingress more: a new table, its handles made beside the backends again, the
        // unchanged routes' carried over.
        app.ingest(changes(&ingresses(n, 1)));
        let second = app.publish().expect("second publish");
        assert!(!Arc::ptr_eq(&first.routes, &second.routes));
        assert_eq!(routes_with_handles(&runtime), n + 1);
        assert!(Arc::ptr_eq(&handles(&runtime, "h7.test"), &kept));
    }

    #[test]
    fn irrelevant_and_no_op_changes_publish_nothing() {
        let (mut app, _runtime) = app();
        app.ingest(changes(BASE));
        let first = app.publish().expect("first publish");
        // A slice of a Service no route uses.
        assert!(!app.ingest(changes(&slice("unused", "10.0.0.9"))));
        // The same objects again (a resync).
        assert!(!app.ingest(changes(BASE)));
        // A Service's labels are not stored (nothing reads them): relabelling changes nothing.
        let relabelled = BASE.replace(
            "metadata: {name: a}",
            "metadata: {name: a, labels: {tier: web}}",
        );
        assert!(!app.ingest(changes(&relabelled)));
        // A Service change that leaves routes and backends as they were: rebuilt, not published.
        let another_port = BASE.replacen(
            "spec: {ports: [{port: 80}]}",
            "spec: {ports: [{port: 80}, {port: 9090}]}",
            1,
        );
        assert!(app.ingest(changes(&another_port)));
        assert!(app.publish().is_none());
        assert_eq!(
            app.published.as_ref().map(|s| s.version),
            Some(first.version)
        );
    }

    #[test]
    fn route_change_rebuilds_and_diagnostics_follow_the_state() {
        let (mut app, runtime) = app();
        let without_b: Vec<Change> = changes(BASE)
            .into_iter()
            .filter(|c| !matches!(c, Change::Apply { object, .. } if object.key().name == "b"))
            .collect();
        app.ingest(without_b);
        app.publish();
        let diagnostics = app.diagnostics().current();
        assert_eq!(diagnostics.len(), 1);
        assert_eq!(diagnostics[0].diagnostic.reason, Reason::MissingService);
        assert!(runtime.load().snapshot.routes.find("b.test", "/").is_none());

        // The Service appears: a route change; the rule is served and the diagnostic is gone.
        app.ingest(changes(BASE));
        assert!(app.pending.routes);
        let snapshot = app.publish().expect("republished");
        assert!(snapshot.routes.find("b.test", "/").is_some());
        assert!(app.diagnostics().current().is_empty());
        let extra = (app.diagnostics().debug_extra())();
        assert_eq!(
            extra,
            serde_json::json!({ "diagnostics": [], "annotations": [] })
        );

        // Deleting the Ingress empties the table.
        app.ingest(vec![Change::Delete(ObjectKey::new(
            Kind::Ingress,
            "default",
            "web",
        ))]);
        let snapshot = app.publish().expect("republished");
        assert!(snapshot.routes.find("a.test", "/").is_none());
        assert!(snapshot.backends.is_empty());
        assert_eq!(snapshot.version, 3);
    }

    #[test]
    fn observers_hear_live_ingresses_after_apply_and_each_new_diagnostic_once() {
        let (mut app, runtime) = app();
        let (live_tx, live) = watch::channel(Arc::new(BTreeSet::new()));
        let (diag_tx, mut diag) = watch::channel(Arc::new(Vec::new()));
        app.observe(live_tx, diag_tx);
        let without_b: Vec<Change> = changes(BASE)
            .into_iter()
            .filter(|c| !matches!(c, Change::Apply { object, .. } if object.key().name == "b"))
            .collect();
        app.ingest(without_b);
        app.publish();
        assert!(runtime.is_ready());
        assert_eq!(
            live.borrow().iter().cloned().collect::<Vec<_>>(),
            [NsName::new("default", "web")]
        );
        assert!(
            diag.has_changed().unwrap(),
            "the missing Service is reported"
        );
        let first = diag.borrow_and_update().clone();
        assert_eq!(first.len(), 1);
        assert_eq!(first[0].reason, Reason::MissingService);
        // A rebuild with the same problem reports nothing new.
        app.ingest(changes(&slice("a", "10.0.0.1")));
        app.publish();
        assert!(!diag.has_changed().unwrap());
        // The Ingress stops being ours: it leaves the live set.
        let other = BASE.replace("ingressClassName: duet", "ingressClassName: nginx");
        app.ingest(changes(&other));
        app.publish();
        assert!(live.borrow().is_empty());
    }

    fn slice_named(name: &str, service: &str, address: &str) -> String {
        slice(service, address).replace(&format!("name: {service}-v4"), &format!("name: {name}"))
    }

    fn v4s(snapshot: &Snapshot, service: &str) -> Vec<String> {
        let id = dataplane::BackendId::new("default", service, "80");
        let mut v4: Vec<String> = snapshot.backends[&id]
            .targets
            .iter()
            .filter_map(|t| t.v4.map(|a| a.to_string()))
            .collect();
        v4.sort();
        v4
    }

    #[test]
    fn endpoint_only_changes_follow_moved_slices_and_keep_other_diagnostics() {
        let (mut app, runtime) = app();
        app.ingest(changes(BASE));
        app.ingest(changes(&slice("a", "169.254.169.254")));
        app.ingest(changes(&slice_named("extra", "a", "10.0.0.7")));
        app.ingest(changes(&slice("b", "10.0.0.2")));
        let first = app.publish().expect("first publish");
        assert_eq!(v4s(&first, "a"), ["10.0.0.7:8080"]);
        let forbidden = |app: &App| {
            app.diagnostics()
                .current()
                .iter()
                .filter(|d| d.diagnostic.reason == Reason::ForbiddenEndpointAddress)
                .count()
        };
        assert_eq!(forbidden(&app), 1);

        // b's slice changes: a's diagnostic stays reported, a's backend stays the same Arc.
        app.ingest(changes(&slice("b", "10.0.0.3")));
        assert!(!app.pending.routes);
        let second = app.publish().expect("second publish");
        assert_eq!(forbidden(&app), 1, "a's diagnostic is kept");
        assert_eq!(v4s(&second, "b"), ["10.0.0.3:8080"]);
        let id = dataplane::BackendId::new("default", "a", "80");
        assert!(Arc::ptr_eq(&first.backends[&id], &second.backends[&id]));
        let live_a = runtime.load().backends[&id].clone();
        app.ingest(changes(&slice("b", "10.0.0.4")));
        app.publish().expect("republished");
        assert!(
            Arc::ptr_eq(&live_a, &runtime.load().backends[&id]),
            "a keeps its live balancer state"
        );

        // The slice `extra` moves from a to b: it leaves a and joins b.
        app.ingest(changes(&slice_named("extra", "b", "10.0.0.7")));
        assert!(!app.pending.routes);
        let third = app.publish().expect("third publish");
        assert!(v4s(&third, "a").is_empty(), "{:?}", v4s(&third, "a"));
        assert_eq!(v4s(&third, "b"), ["10.0.0.4:8080", "10.0.0.7:8080"]);

        // And a deleted slice leaves its Service.
        app.ingest(vec![Change::Delete(ObjectKey::new(
            Kind::EndpointSlice,
            "default",
            "extra",
        ))]);
        let fourth = app.publish().expect("fourth publish");
        assert_eq!(v4s(&fourth, "b"), ["10.0.0.4:8080"]);
        assert_eq!(forbidden(&app), 1);
    }

    #[test]
    fn ingress_change_rebuilds_only_the_hosts_it_touches() {
        let (mut app, runtime) = app();
        app.ingest(changes(BASE));
        app.ingest(changes(&slice("a", "10.0.0.1")));
        app.ingest(changes(&slice("b", "10.0.0.2")));
        let first = app.publish().expect("first publish");
        let live_first = runtime.load_full();

        // A second Ingress adds a path on a.test: b.test is not touched.
        let extra = BASE
            .split("---")
            .next()
            .unwrap()
            .replace("name: web", "name: extra")
            .replace("path: /,", "path: /extra,");
        let extra = extra.split("    - host: b.test").next().unwrap();
        app.ingest(changes(extra));
        assert!(app.pending.routes);
        let second = app.publish().expect("second publish");
        assert!(second.routes.find("a.test", "/extra").is_some());
        assert!(!Arc::ptr_eq(&first.routes, &second.routes));
        let host = |s: &Snapshot, h: &str| s.routes.exact[h].clone();
        assert!(
            host(&second, "b.test").same(&host(&first, "b.test")),
            "the untouched host's rules are the same objects"
        );
        assert!(!host(&second, "a.test").same(&host(&first, "a.test")));
        for (id, backend) in &first.backends {
            assert!(Arc::ptr_eq(backend, &second.backends[id]), "{id}");
            assert!(Arc::ptr_eq(
                &live_first.backends[id],
                &runtime.load().backends[id]
            ));
        }

        // The same Ingress with an annotation duet does not read: a route rebuild that reuses
        // every host, so the table is the same and nothing is published.
        let annotated = extra.replace("name: extra", "name: extra, annotations: {note: x}");
        assert!(app.ingest(changes(&annotated)));
        assert!(app.publish().is_none(), "nothing to publish");
        assert!(Arc::ptr_eq(
            &app.plan.as_ref().unwrap().table,
            &second.routes
        ));
    }

    #[test]
    fn backends_after_a_change_planned_by_host_equal_a_full_build() {
        let (mut app, _runtime) = app();
        app.ingest(changes(BASE));
        app.ingest(changes(&slice("a", "10.0.0.1")));
        app.ingest(changes(&slice("b", "10.0.0.2")));
        app.publish().expect("first publish");
        let c = "apiVersion: v1\nkind: Service\nmetadata: {name: c}\nspec: {ports: [{port: 80}]}\n";
        app.ingest(changes(c));
        // A loopback pod: a diagnostic of the backend phase once c is used.
        app.ingest(changes(&slice("c", "127.0.0.1")));
        app.publish();
        let web = BASE.split("---").next().unwrap();
        let c81 = c.replace("port: 80", "port: 81");
        for (step, object) in [
            (
                "b.test moves to Service c",
                web.replace("name: b, port", "name: c, port"),
            ),
            // The route names port 80: gone with the Service's port, back with it.
            ("Service c's port renumbered", c81),
            ("Service c's port back", c.to_owned()),
            ("back to b", web.to_owned()),
        ] {
            app.ingest(changes(&object));
            let pending = &app.pending;
            assert!(
                !pending.all_routes && (pending.ingresses.len() + pending.services.len()) == 1,
                "{step}: {pending:?}"
            );
            let snapshot = app.publish().expect("published");
            let inputs = app.index().inputs();
            let (full, diagnostics) = translate::build(&inputs, &app.config.translate);
            let by_value = |s: &Snapshot| -> std::collections::HashMap<BackendId, Backend> {
                s.backends
                    .iter()
                    .map(|(k, v)| (k.clone(), (**v).clone()))
                    .collect()
            };
            assert_eq!(by_value(&snapshot), by_value(&full), "{step}");
            let reported: Vec<Diagnostic> = app
                .diagnostics()
                .current()
                .into_iter()
                .map(|r| r.diagnostic)
                .collect();
            assert_eq!(reported, diagnostics, "{step}");
        }
    }

    async fn settle() {
        // Lets the app task run; with paused time this advances the clock by 1 ms.
        tokio::time::sleep(Duration::from_millis(1)).await;
    }

    #[tokio::test(start_paused = true)]
    async fn publishes_only_after_sync_then_debounces() {
        let (app, runtime) = app();
        let (tx, rx) = mpsc::channel(16);
        let task = tokio::spawn(app.run(rx));
        tx.send(SourceEvent::Changes(changes(BASE))).await.unwrap();
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(
            !runtime.is_ready(),
            "nothing is published before the first full scan"
        );

        tx.send(SourceEvent::Synced).await.unwrap();
        settle().await;
        assert!(runtime.is_ready());
        assert_eq!(version(&runtime), 1);

        // A burst of changes 10 ms apart: one publish, holdoff after the last one.
        for i in 0..5 {
            let yaml = slice("a", &format!("10.0.1.{i}"));
            tx.send(SourceEvent::Changes(changes(&yaml))).await.unwrap();
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(version(&runtime), 1, "still within the holdoff");
        tokio::time::sleep(Duration::from_millis(45)).await;
        assert_eq!(version(&runtime), 2);
        let targets = runtime
            .load()
            .snapshot
            .backends
            .values()
            .map(|b| b.targets.len())
            .sum::<usize>();
        assert_eq!(targets, 1, "the last state of the burst is published");

        drop(tx);
        task.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn steady_changes_publish_by_the_max_delay() {
        let (app, runtime) = app();
        let (tx, rx) = mpsc::channel(16);
        let task = tokio::spawn(app.run(rx));
        tx.send(SourceEvent::Changes(changes(BASE))).await.unwrap();
        tx.send(SourceEvent::Synced).await.unwrap();
        settle().await;
        assert_eq!(version(&runtime), 1);

        // A change every 30 ms (shorter than the holdoff) for 1.2 s.
        let start = Instant::now();
        let mut published_at = Vec::new();
        let mut last = version(&runtime);
        for i in 0..40 {
            let yaml = slice("a", &format!("10.0.2.{i}"));
            tx.send(SourceEvent::Changes(changes(&yaml))).await.unwrap();
            tokio::time::sleep(Duration::from_millis(30)).await;
            let now = version(&runtime);
            if now != last {
                published_at.push(start.elapsed());
                last = now;
            }
        }
        assert!(
            published_at.len() >= 2,
            "the max delay forces publishes during a steady stream: {published_at:?}"
        );
        assert!(
            published_at[0] <= Duration::from_millis(540),
            "first publish after {:?}",
            published_at[0]
        );
        drop(tx);
        task.await.unwrap();
    }
}
