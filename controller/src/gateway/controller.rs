//! The Gateway API controllers (kube-runtime), run on every replica; only the leader writes.
//!
//! - GatewayClasses ([`super::class`]): ours get `Accepted` and `supportedFeatures`.
//! - Gateways of our classes: the listeners are judged ([`crate::translate::gateway::listeners`]), pod ports are
//!   assigned over all our Gateways at once ([`super::ports`], concurrency 1 so two reconciles
//!   never assign at the same time), the Gateway's Service and its EndpointSlices are applied
//!   (server-side apply, field manager `duet-gateway`; [`super::service`]) and the status is
//!   written: `addresses` from the Service in its family order, `Accepted`, `Programmed`, and per
//!   listener `Accepted`, `Conflicted`, `Programmed`, `ResolvedRefs`, `supportedKinds` and
//!   `attachedRoutes` (from the translation's [`GatewayReport`]), every condition with the
//!   Gateway's `observedGeneration`. A Gateway that stops being ours loses its Service.
//!
//! `Programmed` turns `True` once addresses are assigned: every replica's dataplane binds the
//! assigned pod ports from the Service (`dataplane::gateway_listen`).
//!
//! Objects are watched as `DynamicObject` and decoded one by one: one the types refuse is
//! logged and skipped, never a failed list. Reconciles of non-leaders return at once; gaining
//! leadership reconciles everything.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Debug;
use std::hash::Hash;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::{Stream, StreamExt as _};
use k8s_openapi::api::core::v1::{Pod, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams};
use kube::runtime::controller::{Action, Config as ControllerConfig, Controller};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt as _};
use kube::{Client, Resource, ResourceExt as _};
use serde::de::DeserializeOwned;
use serde_json::json;
use tokio::sync::watch;

use super::ports::{self, Allocation, Claim, GatewayKey};
use super::scope::Stores;
use super::service::{self, Address, Owner, MANAGED_BY, MANAGED_BY_LABEL};
use super::{class, GatewayConfig};
use crate::gateway_api::conditions::{dated, Cond};
use crate::gateway_api::gateways::{
    GatewayStatus, GatewayStatusAddresses, GatewayStatusListeners,
    GatewayStatusListenersSupportedKinds,
};
use crate::gateway_api::report::GatewayReport;
use crate::gateway_api::{Gateway, GatewayClass, ReferenceGrant, GROUP};
use crate::namespaces;
use crate::object::NsName;
use crate::translate::gateway::listeners::{self, Verdict};
use crate::translate::gateway::{frontend, refs};

/// The field manager of duet's server-side applies.
pub const FIELD_MANAGER: &str = "duet-gateway";

/// How long a failed reconcile waits before the next try.
const RETRY: Duration = Duration::from_secs(5);

/// Why a reconcile failed (it is retried after [`RETRY`]).
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// The API refused a request or could not be reached.
    #[error("API request failed: {0}")]
    Api(#[from] kube::Error),
}

/// What the reconcilers share.
struct Ctx {
    client: Client,
    config: GatewayConfig,
    leading: watch::Receiver<bool>,
    gateways: Stores<DynamicObject>,
    classes: Stores<DynamicObject>,
    grants: Stores<DynamicObject>,
    services: Stores<Service>,
    pods: Stores<Pod>,
    /// Assignments this process wrote, which the Service store may not show yet.
    written: Mutex<HashMap<GatewayKey, BTreeMap<u16, u16>>>,
    /// Held through each Gateway reconcile: the controllers of several namespaces must not
    /// assign pod ports at the same time.
    one_at_a_time: tokio::sync::Mutex<()>,
    /// What the live snapshot serves: the routes attached to each listener.
    report: watch::Receiver<Arc<GatewayReport>>,
}

/// Starts the GatewayClass and Gateway controllers when the cluster serves the Gateway API (else
/// logs that Gateway support is off). `pod_namespace` holds duet's pods.
pub fn spawn(
    client: Client,
    config: GatewayConfig,
    pod_namespace: String,
    leading: watch::Receiver<bool>,
    report: watch::Receiver<Arc<GatewayReport>>,
) {
    tokio::spawn(async move {
        if installed(&client).await {
            super::route_status::spawn(
                client.clone(),
                config.controller_name.clone(),
                report.clone(),
                leading.clone(),
            );
            super::policy_status::spawn(
                client.clone(),
                config.controller_name.clone(),
                report.clone(),
                leading.clone(),
            );
            super::listener_set_status::spawn(client.clone(), report.clone(), leading.clone());
            start(client, config, pod_namespace, leading, report);
        } else {
            tracing::info!(
                "Gateway API (gateway.networking.k8s.io/v1 GatewayClass, Gateway) is not installed \
                 in this cluster: Gateway support is off until duet restarts"
            );
        }
    });
}

/// Whether the cluster serves `gateway.networking.k8s.io/v1` GatewayClasses and Gateways (the
/// CRDs are installed). Asked until the API answers: an error other than 404 is retried.
pub async fn installed(client: &Client) -> bool {
    let served = served(client).await;
    served.contains(&"gatewayclasses".to_owned()) && served.contains(&"gateways".to_owned())
}

/// The resources `gateway.networking.k8s.io/v1` serves (none when the group is not installed),
/// asked until the API answers: an error other than 404 is retried.
pub async fn served(client: &Client) -> Vec<String> {
    loop {
        match client
            .list_api_group_resources("gateway.networking.k8s.io/v1")
            .await
        {
            Ok(list) => return list.resources.into_iter().map(|r| r.name).collect(),
            Err(kube::Error::Api(status)) if status.code == 404 => return Vec::new(),
            Err(error) => {
                tracing::warn!(%error, "Cannot tell whether the Gateway API is installed; asking again in 5 s");
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
        }
    }
}

/// Starts the controllers (the Gateway API is installed). Gateways, ReferenceGrants and the
/// managed Services are watched in the `--watch-namespace` namespaces only (everywhere without
/// it; [`namespaces`]): one Gateway controller per namespace, reconciling one Gateway at a time over
/// all of them, since pod ports are assigned over every Gateway at once.
fn start(
    client: Client,
    config: GatewayConfig,
    pod_namespace: String,
    leading: watch::Receiver<bool>,
    report: watch::Receiver<Arc<GatewayReport>>,
) {
    let class_ar = ApiResource::erase::<GatewayClass>(&());
    let gateway_ar = ApiResource::erase::<Gateway>(&());
    let classes_api = Api::<DynamicObject>::all_with(client.clone(), &class_ar);
    let managed = watcher::Config::default().labels(&format!("{MANAGED_BY_LABEL}={MANAGED_BY}"));
    let (classes, _) = spawn_reflectors(
        vec![classes_api.clone()],
        watcher::Config::default(),
        class_ar.clone(),
    );
    let namespaces = config.namespaces.clone();
    let service_apis = namespaces::apis::<Service>(&client, &namespaces);
    let (services, _) = spawn_reflectors(service_apis.clone(), managed.clone(), ());
    let grant_ar = ApiResource::erase::<ReferenceGrant>(&());
    let grant_apis = namespaces::dynamic_apis(&client, &namespaces, &grant_ar);
    let (grants, grants_changed) =
        spawn_reflectors(grant_apis, watcher::Config::default(), grant_ar);
    let pods_wc = watcher::Config::default().labels(&config.selector_string());
    let pods_api = Api::<Pod>::namespaced(client.clone(), &pod_namespace);
    let (pods, pods_changed) = spawn_reflectors(vec![pods_api], pods_wc, ());

    let gateway_controllers: Vec<_> = namespaces::dynamic_apis(&client, &namespaces, &gateway_ar)
        .into_iter()
        .map(|api| {
            Controller::new_with(api, watcher::Config::default(), gateway_ar.clone())
                .with_config(ControllerConfig::default().concurrency(1))
        })
        .collect();
    let ctx = Arc::new(Ctx {
        client: client.clone(),
        config,
        leading: leading.clone(),
        gateways: Stores(gateway_controllers.iter().map(Controller::store).collect()),
        classes,
        grants,
        services,
        pods,
        written: Mutex::new(HashMap::new()),
        one_at_a_time: tokio::sync::Mutex::new(()),
        report: report.clone(),
    });
    for (controller, services_api) in gateway_controllers.into_iter().zip(service_apis) {
        let by_class = controller.store();
        let controller = controller
            .owns_with(services_api, (), managed.clone())
            .watches_with(
                classes_api.clone(),
                class_ar.clone(),
                watcher::Config::default(),
                move |c| gateways_of_class(&by_class, &c.name_any()),
            )
            .reconcile_all_on(changes(pods_changed.clone()))
            .reconcile_all_on(changes(grants_changed.clone()))
            .reconcile_all_on(reports(report.clone()))
            .reconcile_all_on(leadership_gained(leading.clone()))
            .run(reconcile_gateway, error_policy, ctx.clone());
        tokio::spawn(controller.for_each(log_result("Gateway")));
    }

    let class_controller = Controller::new_with(classes_api, watcher::Config::default(), class_ar)
        .reconcile_all_on(leadership_gained(leading))
        .run(reconcile_class, error_policy, ctx);
    tokio::spawn(class_controller.for_each(log_result("GatewayClass")));
}

/// Reflector stores fed by a watcher each, and one counter of their changes.
fn spawn_reflectors<K>(
    apis: Vec<Api<K>>,
    wc: watcher::Config,
    dyntype: K::DynamicType,
) -> (Stores<K>, watch::Receiver<u64>)
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Send + Sync,
{
    let (tx, rx) = watch::channel(0u64);
    let tx = Arc::new(tx);
    let kind = K::kind(&dyntype).into_owned();
    let stores = apis
        .into_iter()
        .map(|api| {
            let writer = reflector::store::Writer::new(dyntype.clone());
            let reader = writer.as_reader();
            let stream = reflector::reflector(writer, watcher(api, wc.clone()).default_backoff());
            let (tx, kind) = (tx.clone(), kind.clone());
            tokio::spawn(stream.for_each(move |event| {
                match event {
                    Ok(_) => tx.send_modify(|n| *n += 1),
                    Err(error) => {
                        tracing::debug!(kind = %kind, %error, "Gateway API watch failed")
                    }
                }
                async {}
            }));
            reader
        })
        .collect();
    (Stores(stores), rx)
}

/// One item per change of the counter.
fn changes(rx: watch::Receiver<u64>) -> impl Stream<Item = ()> + Send {
    futures_util::stream::unfold(rx, |mut rx| async move {
        rx.changed().await.ok()?;
        Some(((), rx))
    })
}

/// One item per change of the Gateway report.
fn reports(rx: watch::Receiver<Arc<GatewayReport>>) -> impl Stream<Item = ()> + Send {
    futures_util::stream::unfold(rx, |mut rx| async move {
        rx.changed().await.ok()?;
        Some(((), rx))
    })
}

/// One item each time this replica becomes the leader.
fn leadership_gained(rx: watch::Receiver<bool>) -> impl Stream<Item = ()> + Send {
    futures_util::stream::unfold(rx, |mut rx| async move {
        loop {
            rx.changed().await.ok()?;
            if *rx.borrow_and_update() {
                return Some(((), rx));
            }
        }
    })
}

/// Logs a controller's failures: the first one after a success as a warning (a cluster without
/// the Gateway API CRDs fails every few seconds), the rest at debug level.
fn log_result<T: Debug, E: std::fmt::Display>(
    what: &'static str,
) -> impl FnMut(Result<T, E>) -> std::future::Ready<()> {
    let mut failing = false;
    move |result| {
        match result {
            Ok(_) => failing = false,
            Err(error) if !failing => {
                failing = true;
                tracing::warn!(kind = what, %error, "Gateway API controller error");
            }
            Err(error) => tracing::debug!(kind = what, %error, "Gateway API controller error"),
        }
        std::future::ready(())
    }
}

fn error_policy(_object: Arc<DynamicObject>, error: &GatewayError, _ctx: Arc<Ctx>) -> Action {
    tracing::warn!(%error, "Gateway API reconcile failed; retrying");
    Action::requeue(RETRY)
}

/// Decodes one object; one the types refuse is logged and skipped.
fn decode<K: Resource + DeserializeOwned>(object: &DynamicObject) -> Option<K> {
    match object.clone().try_parse::<K>() {
        Ok(k) => Some(k),
        Err(error) => {
            tracing::warn!(
                object = %format!("{}/{}", object.namespace().unwrap_or_default(), object.name_any()),
                %error,
                "Gateway API object not understood; skipped"
            );
            None
        }
    }
}

fn gateways_of_class(store: &Store<DynamicObject>, class: &str) -> Vec<ObjectRef<DynamicObject>> {
    let ar = ApiResource::erase::<Gateway>(&());
    store
        .state()
        .iter()
        .filter(|g| g.data["spec"]["gatewayClassName"] == class)
        .map(|g| ObjectRef::from_obj_with(g.as_ref(), ar.clone()))
        .collect()
}

impl Ctx {
    fn leads(&self) -> bool {
        *self.leading.borrow()
    }

    /// Waits until every store has listed once. Before that, a reconcile would read the port
    /// assignments (and the Gateways competing for ports) from a partial cache and move ports
    /// that Services already hold, as a restarted duet did when its Service store was late.
    async fn synced(&self) {
        // A dropped writer (its watcher ended) never becomes ready: go on with what there is.
        let _ = futures_util::join!(
            self.gateways.wait_until_ready(),
            self.classes.wait_until_ready(),
            self.grants.wait_until_ready(),
            self.services.wait_until_ready(),
            self.pods.wait_until_ready(),
        );
    }

    /// Whether the Gateway is in a watched namespace and its class is one of ours.
    fn ours(&self, gateway: &Gateway) -> bool {
        if !self
            .config
            .watches(gateway.metadata.namespace.as_deref().unwrap_or_default())
        {
            return false;
        }
        let class = self
            .classes
            .state()
            .into_iter()
            .find(|c| c.name_any() == gateway.spec.gateway_class_name);
        let class = class.and_then(|c| decode::<GatewayClass>(&c));
        class.is_some_and(|c| class::is_ours(&c, &self.config.controller_name))
    }

    fn service_of(&self, namespace: &str, gateway: &str) -> Option<Arc<Service>> {
        let name = service::service_name(gateway);
        self.services.get(&ObjectRef::new(&name).within(namespace))
    }

    /// Pod ports for every Gateway of our classes.
    fn allocate(&self) -> Allocation {
        let mut gateways: Vec<Gateway> = self
            .gateways
            .state()
            .iter()
            .filter_map(|g| decode::<Gateway>(g))
            .filter(|g| self.ours(g))
            .collect();
        gateways.sort_by_key(|g| {
            (
                g.metadata.creation_timestamp.clone().map(|t| t.0),
                g.namespace(),
                g.name_any(),
            )
        });
        let written = self
            .written
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let claims: Vec<Claim> = gateways
            .iter()
            .map(|g| {
                let key = (g.namespace().unwrap_or_default(), g.name_any());
                let held = written.get(&key).cloned().or_else(|| {
                    let svc = self.service_of(&key.0, &key.1)?;
                    owned_by(&svc, g).then(|| service::held_ports(&svc))
                });
                let mut listener_ports = valid_ports(g);
                let report = self.report.borrow();
                let extra = report
                    .listener_set_ports
                    .get(&NsName::new(&*key.0, &*key.1));
                listener_ports.extend(extra.into_iter().flatten());
                Claim {
                    listener_ports,
                    held: held.unwrap_or_default(),
                    gateway: key,
                }
            })
            .collect();
        ports::allocate(&claims)
    }
}

/// The ports of a Gateway's valid listeners (none when the Gateway is not accepted).
fn valid_ports(gateway: &Gateway) -> std::collections::BTreeSet<u16> {
    let verdicts = listeners::check(&gateway.spec);
    if !listeners::gateway_accepted(&gateway.spec, &verdicts).status {
        return Default::default();
    }
    verdicts
        .iter()
        .filter(|v| v.valid())
        .filter_map(|v| u16::try_from(v.port).ok())
        .collect()
}

fn owned_by(service: &Service, gateway: &Gateway) -> bool {
    let uid = gateway.metadata.uid.as_deref();
    service
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| Some(o.uid.as_str()) == uid)
}

async fn reconcile_class(
    object: Arc<DynamicObject>,
    ctx: Arc<Ctx>,
) -> Result<Action, GatewayError> {
    if !ctx.leads() {
        return Ok(Action::await_change());
    }
    let Some(gateway_class) = decode::<GatewayClass>(&object) else {
        return Ok(Action::await_change());
    };
    if !class::is_ours(&gateway_class, &ctx.config.controller_name) {
        return Ok(Action::await_change());
    }
    let status = class::status(&gateway_class, Timestamp::now());
    if gateway_class.status.as_ref() != Some(&status) {
        let api = Api::<GatewayClass>::all(ctx.client.clone());
        let patch = Patch::Merge(json!({ "status": status }));
        api.patch_status(&gateway_class.name_any(), &PatchParams::default(), &patch)
            .await?;
        tracing::info!(gatewayclass = %gateway_class.name_any(), "GatewayClass status written");
    }
    Ok(Action::await_change())
}

async fn reconcile_gateway(
    object: Arc<DynamicObject>,
    ctx: Arc<Ctx>,
) -> Result<Action, GatewayError> {
    if !ctx.leads() {
        return Ok(Action::await_change());
    }
    ctx.synced().await;
    let _one = ctx.one_at_a_time.lock().await;
    let Some(gateway) = decode::<Gateway>(&object) else {
        return Ok(Action::await_change());
    };
    let namespace = gateway.namespace().unwrap_or_default();
    let name = gateway.name_any();
    let key = (namespace.clone(), name.clone());
    let services = Api::<Service>::namespaced(ctx.client.clone(), &namespace);
    if !ctx.ours(&gateway) {
        if let Some(svc) = ctx
            .service_of(&namespace, &name)
            .filter(|s| owned_by(s, &gateway))
        {
            services
                .delete(&svc.name_any(), &DeleteParams::default())
                .await?;
            tracing::info!(gateway = %format!("{namespace}/{name}"), "Gateway no longer ours; its Service deleted");
        }
        return Ok(Action::await_change());
    }
    let mut verdicts = listeners::check(&gateway.spec);
    let mut unresolved = resolve_certificates(&ctx, &gateway, &mut verdicts).await?;
    frontend_problems(&ctx.report.borrow(), &gateway, &mut verdicts);
    let client_cert = client_certificate(&ctx, &gateway).await?;
    unresolved |= client_cert.as_ref().is_some_and(|c| !c.status);
    let accepted = listeners::gateway_accepted(&gateway.spec, &verdicts);
    let mut ports = ctx.allocate().remove(&key).unwrap_or_default();
    // Listeners whose certificates do not resolve keep their pod port but get no Service port;
    // the ports of the ListenerSets' valid listeners are kept.
    let set_ports = ctx
        .report
        .borrow()
        .listener_set_ports
        .get(&NsName::new(&*namespace, &*name))
        .cloned()
        .unwrap_or_default();
    ports.retain(|p, _| {
        set_ports.contains(p)
            || verdicts
                .iter()
                .any(|v| v.valid() && v.port == i32::from(*p))
    });
    let placed = place_service(&ctx, &gateway, &ports).await?;
    let report = ctx.report.borrow().clone();
    let now = Timestamp::now();
    let mut status = gateway_status(&gateway, &verdicts, accepted, &ports, &placed, &report, now);
    // The Gateway's own ResolvedRefs (its backend client certificate), and whether its
    // client certificate validation lets clients without a valid certificate through.
    let own: Vec<Cond> = client_cert
        .into_iter()
        .chain(frontend::insecure_mode(&gateway.spec))
        .collect();
    if !own.is_empty() {
        let old = gateway.status.as_ref().and_then(|s| s.conditions.clone());
        let dated = dated(
            &own,
            gateway.metadata.generation,
            &old.unwrap_or_default(),
            now,
        );
        status.conditions.get_or_insert_with(Vec::new).extend(dated);
    }
    if gateway.status.as_ref() != Some(&status) {
        write_status(&ctx, &gateway, &status).await?;
    }
    // Secrets are not watched: look again while a certificate does not resolve.
    Ok(if unresolved {
        Action::requeue(SECRET_RECHECK)
    } else {
        Action::await_change()
    })
}

/// How often a Gateway whose certificates do not resolve is looked at again.
const SECRET_RECHECK: Duration = Duration::from_secs(10);

/// Checks the Secrets of HTTPS listeners ([`crate::translate::gateway::refs`]), marking those that do not resolve;
/// returns whether one did not.
async fn resolve_certificates(
    ctx: &Ctx,
    gateway: &Gateway,
    verdicts: &mut [Verdict],
) -> Result<bool, GatewayError> {
    let namespace = gateway.namespace().unwrap_or_default();
    let grants: Vec<ReferenceGrant> = ctx
        .grants
        .state()
        .iter()
        .filter_map(|g| decode(g))
        .collect();
    let mut unresolved = false;
    for (listener, verdict) in gateway.spec.listeners.iter().zip(verdicts.iter_mut()) {
        if !listeners::terminates(listener) || !verdict.resolved.status {
            continue;
        }
        let mut secrets = BTreeMap::new();
        for key in refs::to_fetch(listener, &namespace, &grants) {
            if !ctx.config.watches(&key.0) {
                // Outside --watch-namespace duet may not read Secrets: as if missing.
                secrets.insert(key, None);
                continue;
            }
            let api = Api::<Secret>::namespaced(ctx.client.clone(), &key.0);
            let secret = api.get_opt(&key.1).await?;
            secrets.insert(key, secret);
        }
        if let Some(problem) = refs::problem(listener, &namespace, &grants, &secrets) {
            verdict.resolved = problem;
            unresolved = true;
        }
    }
    Ok(unresolved)
}

/// Puts into the listeners' verdicts what translation found wrong with their client
/// certificate validation ([`frontend`]; the ConfigMaps it reads are watched there).
fn frontend_problems(report: &GatewayReport, gateway: &Gateway, verdicts: &mut [Verdict]) {
    let key = NsName::of(&gateway.metadata);
    for (l, v) in gateway.spec.listeners.iter().zip(verdicts.iter_mut()) {
        if let Some(p) = report.frontend.get(&(key.clone(), l.name.clone())) {
            p.apply(&mut v.accepted, &mut v.resolved);
        }
    }
}

/// The Gateway's `ResolvedRefs` for `tls.backend.clientCertificateRef`, when it names one
/// ([`refs::client_certificate_condition`]), the Secret read when it may be.
async fn client_certificate(ctx: &Ctx, gateway: &Gateway) -> Result<Option<Cond>, GatewayError> {
    let namespace = gateway.namespace().unwrap_or_default();
    let Some((key, is_secret)) = refs::client_certificate_ref(&gateway.spec, &namespace) else {
        return Ok(None);
    };
    let grants: Vec<ReferenceGrant> = ctx
        .grants
        .state()
        .iter()
        .filter_map(|g| decode(g))
        .collect();
    let mut secrets = BTreeMap::new();
    if is_secret && refs::granted(&grants, &namespace, &key) && ctx.config.watches(&key.0) {
        let api = Api::<Secret>::namespaced(ctx.client.clone(), &key.0);
        let secret = api.get_opt(&key.1).await?;
        secrets.insert(key, secret);
    }
    Ok(refs::client_certificate_condition(
        &gateway.spec,
        &namespace,
        &grants,
        &secrets,
    ))
}

/// What became of a Gateway's Service.
#[derive(Debug, Default)]
struct Placed {
    addresses: Vec<Address>,
    /// Why there is no Service, when that is a problem.
    problem: Option<String>,
    /// Which addresses of `spec.addresses` the load balancer has not given the Service.
    unusable: Option<String>,
}

/// Applies (or deletes, without ports) the Gateway's Service and its EndpointSlices.
async fn place_service(
    ctx: &Ctx,
    gateway: &Gateway,
    ports: &BTreeMap<u16, u16>,
) -> Result<Placed, GatewayError> {
    let namespace = gateway.namespace().unwrap_or_default();
    let gateway_name = gateway.name_any();
    let name = service::service_name(&gateway_name);
    let api = Api::<Service>::namespaced(ctx.client.clone(), &namespace);
    let existing = match ctx.service_of(&namespace, &gateway_name) {
        Some(svc) => Some(svc.as_ref().clone()),
        None => api.get_opt(&name).await?,
    };
    if let Some(svc) = existing.as_ref().filter(|s| !owned_by(s, gateway)) {
        let _ = svc;
        return Ok(Placed {
            problem: Some(format!(
                "Service {namespace}/{name} exists and is not this Gateway's"
            )),
            ..Placed::default()
        });
    }
    let key = (namespace.clone(), gateway_name.clone());
    if ports.is_empty() {
        if existing.is_some() {
            api.delete(&name, &DeleteParams::default()).await?;
        }
        ctx.written
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&key);
        return Ok(Placed::default());
    }
    let owner = Owner {
        namespace: namespace.clone(),
        name: gateway_name.clone(),
        uid: gateway.metadata.uid.clone().unwrap_or_default(),
    };
    let shape = service::Shape::of(&gateway.spec);
    let udp = udp_ports(ctx, gateway, ports);
    let desired = service::desired_service(&owner, ports, &udp, &shape);
    if existing
        .as_ref()
        .is_some_and(|s| primary_family_changes(s, &shape))
    {
        // A Service's primary family cannot change: it is made again.
        api.delete(&name, &DeleteParams::default()).await?;
    }
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let applied = api.patch(&name, &params, &Patch::Apply(&desired)).await?;
    ctx.written
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(key, ports.clone());
    apply_slices(ctx, &applied, (ports, &udp)).await?;
    // The store's copy may be newer (load-balancer status arrives after the apply).
    let latest = ctx
        .service_of(&namespace, &gateway_name)
        .filter(|s| s.metadata.uid == applied.metadata.uid && service::held_ports(s) == *ports)
        .map_or(applied, |s| s.as_ref().clone());
    Ok(placed(&latest, &shape.addresses))
}

/// Whether the addresses a Gateway asks for are of another primary family than its Service's.
fn primary_family_changes(existing: &Service, shape: &service::Shape) -> bool {
    let wanted = shape.families();
    let has = service::families(existing);
    !wanted.is_empty() && !has.is_empty() && wanted[0] != has[0]
}

/// The Gateway's addresses from its Service: every address the load balancer gave it, or, when
/// the Gateway asks for addresses, those of them it was given (and which it was not).
fn placed(service: &Service, requested: &[IpAddr]) -> Placed {
    if requested.is_empty() {
        return Placed {
            addresses: service::addresses(service),
            ..Placed::default()
        };
    }
    let given = service::load_balancer_ips(service);
    let (ok, missing): (Vec<&IpAddr>, Vec<&IpAddr>) =
        requested.iter().partition(|ip| given.contains(ip));
    let missing: Vec<String> = missing.iter().map(ToString::to_string).collect();
    Placed {
        addresses: ok.iter().map(|ip| ("IPAddress", ip.to_string())).collect(),
        problem: None,
        unusable: (!missing.is_empty()).then(|| {
            format!(
                "the load balancer has not given the Gateway's Service {} (asked with the {} \
                 annotation)",
                missing.join(", "),
                service::REQUESTED_IPS_ANNOTATION
            )
        }),
    }
}

/// The listener ports of the HTTPS listeners of the Gateway and its ListenerSets, served over
/// HTTP/3 too when it is on (`--http3`): its Service lists them over UDP as well.
fn udp_ports(
    ctx: &Ctx,
    gateway: &Gateway,
    ports: &BTreeMap<u16, u16>,
) -> std::collections::BTreeSet<u16> {
    if !ctx.config.http3 {
        return Default::default();
    }
    let key = NsName::new(gateway.namespace().unwrap_or_default(), gateway.name_any());
    let of_sets = ctx
        .report
        .borrow()
        .listener_set_https_ports
        .get(&key)
        .cloned()
        .unwrap_or_default();
    let listeners = gateway.spec.listeners.iter();
    listeners
        .filter(|l| l.protocol == "HTTPS")
        .filter_map(|l| u16::try_from(l.port).ok())
        .chain(of_sets)
        .filter(|p| ports.contains_key(p))
        .collect()
}

/// One EndpointSlice per family of the Service, listing duet's ready pods.
async fn apply_slices(
    ctx: &Ctx,
    svc: &Service,
    ports: (&BTreeMap<u16, u16>, &std::collections::BTreeSet<u16>),
) -> Result<(), GatewayError> {
    let pods: Vec<Pod> = ctx
        .pods
        .state()
        .iter()
        .map(|p| p.as_ref().clone())
        .collect();
    let namespace = svc.namespace().unwrap_or_default();
    let api = Api::<EndpointSlice>::namespaced(ctx.client.clone(), &namespace);
    let params = PatchParams::apply(FIELD_MANAGER).force();
    for family in service::families(svc) {
        if let Some(slice) = service::desired_slice(svc, &family, ports, &pods) {
            api.patch(&slice.name_any(), &params, &Patch::Apply(&slice))
                .await?;
        }
    }
    Ok(())
}

/// The Gateway's status.
fn gateway_status(
    gateway: &Gateway,
    verdicts: &[Verdict],
    accepted: Cond,
    ports: &BTreeMap<u16, u16>,
    placed: &Placed,
    report: &GatewayReport,
    now: Timestamp,
) -> GatewayStatus {
    let attached = &report.attached;
    let key = crate::object::NsName::of(&gateway.metadata);
    let generation = gateway.metadata.generation;
    let old = gateway.status.clone().unwrap_or_default();
    let programmed = if !accepted.status {
        Cond::no("Programmed", "Invalid", "the Gateway is not accepted")
    } else if let Some(problem) = &placed.problem {
        Cond::no("Programmed", "AddressNotAssigned", problem.clone())
    } else if let Some(why) = &placed.unusable {
        Cond::no("Programmed", "AddressNotUsable", why.clone())
    } else if placed.addresses.is_empty() {
        Cond::no(
            "Programmed",
            "AddressNotAssigned",
            "the Gateway's Service has no address yet",
        )
    } else {
        Cond::yes("Programmed", "Programmed", "")
    };
    let old_conditions = old.conditions.clone().unwrap_or_default();
    let conditions = dated(
        &[accepted.clone(), programmed],
        generation,
        &old_conditions,
        now,
    );
    let listeners = verdicts
        .iter()
        .map(|v| {
            let old = old
                .listeners
                .iter()
                .flatten()
                .find(|l| l.name == v.name)
                .map(|l| l.conditions.clone())
                .unwrap_or_default();
            let conds = listener_conditions(v, accepted.status, ports);
            let routes = attached.get(&(key.clone(), v.name.clone())).copied();
            GatewayStatusListeners {
                attached_routes: routes.unwrap_or(0),
                conditions: dated(&conds, generation, &old, now),
                name: v.name.clone(),
                supported_kinds: Some(
                    v.kinds
                        .iter()
                        .map(|k| GatewayStatusListenersSupportedKinds {
                            group: Some(GROUP.to_owned()),
                            kind: (*k).to_owned(),
                        })
                        .collect(),
                ),
            }
        })
        .collect();
    let addresses: Vec<GatewayStatusAddresses> = placed
        .addresses
        .iter()
        .map(|(kind, value)| GatewayStatusAddresses {
            r#type: Some((*kind).to_owned()),
            value: value.clone(),
        })
        .collect();
    GatewayStatus {
        addresses: (!addresses.is_empty()).then_some(addresses),
        attached_listener_sets: report.attached_listener_sets.get(&key).copied(),
        conditions: Some(conditions),
        listeners: Some(listeners),
    }
}

/// A listener's `Accepted`, `Conflicted`, `Programmed` and `ResolvedRefs`.
fn listener_conditions(
    v: &Verdict,
    gateway_accepted: bool,
    ports: &BTreeMap<u16, u16>,
) -> Vec<Cond> {
    let mut accepted = v.accepted.clone();
    let has_port = u16::try_from(v.port).is_ok_and(|p| ports.contains_key(&p));
    if v.valid() && gateway_accepted && !has_port {
        accepted = Cond::no(
            "Accepted",
            "PortUnavailable",
            "no free pod port is left for this listener",
        );
    }
    let programmed = if v.valid() && gateway_accepted && has_port {
        Cond::yes("Programmed", "Programmed", "")
    } else {
        Cond::no("Programmed", "Invalid", "the listener is not valid")
    };
    vec![
        accepted,
        v.conflicted.clone(),
        programmed,
        v.resolved.clone(),
    ]
}

/// Writes the status (a merge patch; absent addresses are cleared).
async fn write_status(
    ctx: &Ctx,
    gateway: &Gateway,
    status: &GatewayStatus,
) -> Result<(), GatewayError> {
    let namespace = gateway.namespace().unwrap_or_default();
    let api = Api::<Gateway>::namespaced(ctx.client.clone(), &namespace);
    let mut body = json!({ "status": status });
    if status.addresses.is_none() {
        body["status"]["addresses"] = serde_json::Value::Null;
    }
    api.patch_status(
        &gateway.name_any(),
        &PatchParams::default(),
        &Patch::Merge(body),
    )
    .await?;
    tracing::info!(gateway = %format!("{namespace}/{}", gateway.name_any()), addresses = status.addresses.as_ref().map_or(0, Vec::len), "Gateway status written");
    Ok(())
}
