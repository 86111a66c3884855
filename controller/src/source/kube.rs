//! The Kubernetes API source: one kube-runtime watcher per kind (and per watched namespace),
//! objects trimmed before caching, feeding the same [`Change`] stream as the manifest folder.
//! Every kind's watch keeps only its objects' `Arc`s, shared with the index ([`Listed`]); the
//! Ingresses' are shared with other tasks too ([`Stores`]: the status writer, the Secret watcher).
//!
//! Watched: `networking.k8s.io/v1` Ingress and IngressClass, the Gateway API kinds
//! (GatewayClass, Gateway, HTTPRoute, GRPCRoute, TLSRoute, ReferenceGrant, BackendTLSPolicy),
//! Namespaces and ConfigMaps (BackendTLSPolicy CA certificates) when the cluster
//! serves `gateway.networking.k8s.io/v1` (asked once at start; they are not waited for before
//! the first snapshot), `v1` Service, `discovery.k8s.io/v1`
//! EndpointSlice (only those labelled `kubernetes.io/service-name`) and `v1` Secret (only
//! `type=kubernetes.io/tls` ones, and by name the CA Secrets Ingresses name: see
//! [`secrets`](super::secrets)). Objects are decoded without `managedFields` ([`Lean`]: the
//! decoder skips it in the text), and the `kubectl.kubernetes.io/last-applied-configuration`
//! annotation is dropped before an object is cached.
//!
//! Every (re)list of a kind ends in a [`Change::Replace`] carrying the whole state of that kind
//! (every watch's), so objects deleted while a watch was down (a relist after `410 Gone` reports no
//! deletes) disappear too. [`SourceEvent::Synced`] is sent once every watcher has listed once.
//! Watch errors are logged and retried with backoff ([`WatchBackoff`]: 0.5 s doubling to 5 s,
//! jittered, reset by the first good event); the index, and so the published snapshot, keeps the
//! last good state meanwhile.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;

use futures_util::stream::{BoxStream, SelectAll};
use futures_util::{FutureExt as _, StreamExt as _};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::{Ingress, IngressClass};
use kube::runtime::{watcher, WatchStreamExt as _};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use std::fmt::Debug;
use tokio::sync::{mpsc, watch};

use super::lean::Lean;
pub use super::watch::{fit, trim, Stores, WatchBackoff, LAST_APPLIED_ANNOTATION};
use super::watch::{Listed, Seen, SharedIngresses, SyncCountdown, Task};
use super::SourceEvent;
use crate::compact::Slice;
use crate::gateway_api::{
    BackendTlsPolicy, Gateway, GatewayClass, GrpcRoute, HttpRoute, ListenerSet, ReferenceGrant,
    TlsRoute,
};
use crate::index::Change;
use crate::index::{Object, Stored};
use crate::namespaces;
use crate::object::SERVICE_NAME_LABEL;
use crate::stored::{StoredIngress, StoredService};

/// Where the cluster is and what to watch, from the command line.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KubeSettings {
    /// `--kubeconfig PATH`; otherwise `KUBECONFIG`, `~/.kube/config`, then in-cluster.
    pub kubeconfig: Option<PathBuf>,
    /// `--watch-namespace NS` (repeatable); empty means every namespace.
    pub namespaces: Vec<String>,
}

/// Why the API cannot be reached at start.
#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    /// No kubeconfig and not in a cluster.
    #[error("no Kubernetes API configuration: not running in a cluster (KUBERNETES_SERVICE_HOST is unset) and no kubeconfig (--kubeconfig, KUBECONFIG or ~/.kube/config); use --manifests DIR to serve from files")]
    NoConfig,
    /// The kubeconfig given cannot be used.
    #[error("cannot use kubeconfig {}: {source}", path.display())]
    Kubeconfig {
        /// The file.
        path: PathBuf,
        /// What kube said.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// In a cluster, but the service account files cannot be read.
    #[error("cannot use the in-cluster configuration: {0}")]
    InCluster(#[source] kube::config::InClusterError),
    /// The configuration was found but no client can be built from it.
    #[error("cannot build a Kubernetes client: {0}")]
    Client(#[source] kube::Error),
}

/// A client for the cluster and the namespace it defaults to (the kubeconfig context's, or the
/// pod's in a cluster).
pub async fn connect(settings: &KubeSettings) -> Result<(Client, String), KubeError> {
    let config = match &settings.kubeconfig {
        Some(path) => {
            let bad = |source| KubeError::Kubeconfig {
                path: path.clone(),
                source,
            };
            let file = kube::config::Kubeconfig::read_from(path).map_err(bad)?;
            kube::Config::from_custom_kubeconfig(file, &Default::default())
                .await
                .map_err(bad)?
        }
        None => {
            let from_env = std::env::var_os("KUBECONFIG").filter(|v| !v.is_empty());
            let home = std::env::var_os("HOME")
                .map(|h| PathBuf::from(h).join(".kube").join("config"))
                .filter(|p| p.is_file());
            if let Some(path) = from_env.map(PathBuf::from).or(home) {
                kube::Config::from_kubeconfig(&Default::default())
                    .await
                    .map_err(|source| KubeError::Kubeconfig { path, source })?
            } else if std::env::var_os("KUBERNETES_SERVICE_HOST").is_some() {
                kube::Config::incluster().map_err(KubeError::InCluster)?
            } else {
                return Err(KubeError::NoConfig);
            }
        }
    };
    let namespace = config.default_namespace.clone();
    let client = Client::try_from(config).map_err(KubeError::Client)?;
    Ok((client, namespace))
}

/// Starts the watchers; returns their Ingress stores. Changes and [`SourceEvent::Synced`] go to
/// `tx`; the tasks end when `tx` closes. The source is synced once every watcher in the list
/// below has listed.
pub fn spawn(client: Client, namespaces: &[String], tx: mpsc::Sender<SourceEvent>) -> Stores {
    let namespaces: Vec<String> = namespaces
        .iter()
        .cloned()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let countdown = Arc::new(SyncCountdown::default());
    let (changed_tx, changed_rx) = watch::channel(0u64);
    let sync = |changed| Sync {
        tx: tx.clone(),
        countdown: countdown.clone(),
        changed,
    };
    let base = watcher::Config::default();
    let (listed_tx, listed_rx) = watch::channel(false);
    let (ingresses, ingress_task) = watch_ingresses(
        namespaces::apis::<Lean<Ingress>>(&client, &namespaces),
        vec![base.clone()],
        sync(Some(Arc::new(changed_tx))),
        listed_tx,
    );
    let stores = Stores {
        ingresses,
        ingress_changes: changed_rx,
        ingresses_listed: listed_rx,
    };
    let tasks: Vec<Task> = vec![
        ingress_task,
        watch_kind::<IngressClass, IngressClass>(
            vec![Api::all(client.clone())],
            vec![base.clone()],
            sync(None),
        ),
        watch_kind::<Service, StoredService>(
            namespaces::apis(&client, &namespaces),
            vec![base.clone()],
            sync(None),
        ),
        watch_kind::<EndpointSlice, Slice>(
            namespaces::apis(&client, &namespaces),
            vec![base.labels(SERVICE_NAME_LABEL)],
            sync(None),
        ),
        super::secrets::watch(
            client.clone(),
            &namespaces,
            stores.clone(),
            tx.clone(),
            countdown.clone(),
        ),
    ];
    countdown.expect(tasks.len());
    for task in tasks {
        tokio::spawn(task);
    }
    // Not part of the first sync: without the RBAC to read them, the Ingresses are still served.
    let gateway_sync = Sync {
        tx,
        countdown: Arc::new(SyncCountdown::default()),
        changed: None,
    };
    tokio::spawn(async move {
        if !crate::gateway::controller::installed(&client).await {
            return;
        }
        // ListenerSets are watched where their CRD is installed (Gateway API v1.5 and later).
        let listener_sets = crate::gateway::controller::served(&client)
            .await
            .contains(&"listenersets".to_owned());
        let tasks = gateway_watchers(&client, &namespaces, &gateway_sync, listener_sets);
        gateway_sync.countdown.expect(tasks.len());
        for task in tasks {
            tokio::spawn(task);
        }
    });
    stores
}

/// The watchers of the Gateway API kinds and of Namespaces (whose labels select routes), when
/// the cluster serves the Gateway API.
fn gateway_watchers(
    client: &Client,
    namespaces: &[String],
    sync: &Sync,
    listener_sets: bool,
) -> Vec<Task> {
    let base = || vec![watcher::Config::default()];
    let each = || Sync {
        tx: sync.tx.clone(),
        countdown: sync.countdown.clone(),
        changed: None,
    };
    let mut tasks = vec![
        watch_kind::<Namespace, Namespace>(vec![Api::all(client.clone())], base(), each()),
        watch_kind::<GatewayClass, GatewayClass>(vec![Api::all(client.clone())], base(), each()),
        watch_kind::<Gateway, Gateway>(namespaces::apis(client, namespaces), base(), each()),
        watch_kind::<HttpRoute, HttpRoute>(namespaces::apis(client, namespaces), base(), each()),
        watch_kind::<GrpcRoute, GrpcRoute>(namespaces::apis(client, namespaces), base(), each()),
        watch_kind::<TlsRoute, TlsRoute>(namespaces::apis(client, namespaces), base(), each()),
        watch_kind::<ReferenceGrant, ReferenceGrant>(
            namespaces::apis(client, namespaces),
            base(),
            each(),
        ),
        watch_kind::<BackendTlsPolicy, BackendTlsPolicy>(
            namespaces::apis(client, namespaces),
            base(),
            each(),
        ),
        watch_kind::<ConfigMap, ConfigMap>(namespaces::apis(client, namespaces), base(), each()),
    ];
    if listener_sets {
        tasks.push(watch_kind::<ListenerSet, ListenerSet>(
            namespaces::apis(client, namespaces),
            base(),
            each(),
        ));
    }
    tasks
}

/// Where a kind's watcher reports.
struct Sync {
    tx: mpsc::Sender<SourceEvent>,
    countdown: Arc<SyncCountdown>,
    /// Bumped after every event (the Ingress watcher's, for the Secret watcher).
    changed: Option<Arc<watch::Sender<u64>>>,
}

/// What a kind's watches keep of their objects, for the relists: what one watch event means,
/// and the whole state of the kind (what a relist no longer has is deleted).
trait Kept<K>: Send + 'static {
    /// What watch `i`'s event means, recorded.
    fn seen(&mut self, i: usize, event: watcher::Event<K>) -> Seen;
    /// Every object of every watch.
    fn replace(&self) -> Change;
    /// The number of watches.
    fn watches(&self) -> usize;
}

/// The Ingress watches' objects, shared with other tasks ([`Stores`]); `listed` is set once
/// every watch has listed.
struct SharedKept {
    ingresses: SharedIngresses,
    watches_listed: Vec<bool>,
    listed: watch::Sender<bool>,
}

impl Kept<StoredIngress> for SharedKept {
    fn seen(&mut self, i: usize, event: watcher::Event<StoredIngress>) -> Seen {
        let seen = match self.ingresses.write().get_mut(i) {
            Some(watch) => watch.seen(event),
            None => Seen::Nothing,
        };
        if matches!(seen, Seen::Listed) {
            self.watches_listed[i] = true;
            if self.watches_listed.iter().all(|l| *l) {
                self.listed.send_replace(true);
            }
        }
        seen
    }

    fn replace(&self) -> Change {
        let watches = self.ingresses.read();
        let objects = watches.iter().flat_map(Listed::objects);
        replace::<StoredIngress>(objects.map(|o| StoredIngress::wrap(o.clone())).collect())
    }

    fn watches(&self) -> usize {
        self.watches_listed.len()
    }
}

/// The objects' `Arc`s only ([`Listed`]), for every other kind.
impl<K: Stored> Kept<K> for Vec<Listed<K>> {
    fn seen(&mut self, i: usize, event: watcher::Event<K>) -> Seen {
        self[i].seen(event)
    }

    fn replace(&self) -> Change {
        let objects = self.iter().flat_map(Listed::objects);
        replace::<K>(objects.map(|o| K::wrap(o.clone())).collect())
    }

    fn watches(&self) -> usize {
        self.len()
    }
}

/// A relist's change.
fn replace<K: Stored>(objects: Vec<Object>) -> Change {
    tracing::debug!(kind = %K::KIND, objects = objects.len(), "Listed");
    Change::Replace {
        kind: K::KIND,
        objects: objects.into_iter().map(|o| (o, None)).collect(),
    }
}

/// Watches the Ingresses: every API (namespace) with every config; their objects are shared
/// with other tasks (the first value returned) and a relist of any watch replaces the kind with
/// the union of all of them. The watcher is built, not started: the caller counts it, then
/// spawns its task. `listed` is set once every watch has listed.
fn watch_ingresses(
    apis: Vec<Api<Lean<Ingress>>>,
    configs: Vec<watcher::Config>,
    sync: Sync,
    listed: watch::Sender<bool>,
) -> (SharedIngresses, Task) {
    let mut streams = Vec::new();
    for (i, (api, config)) in each_watch(&apis, &configs).enumerate() {
        let stream = watcher(api, config)
            .backoff(WatchBackoff::default())
            .map(move |event| (i, event.map(|event| lean(event, stored_ingress))));
        streams.push(stream.boxed());
    }
    let ingresses = SharedIngresses::new(streams.len());
    let kept = SharedKept {
        ingresses: ingresses.clone(),
        watches_listed: vec![false; streams.len()],
        listed,
    };
    let task = run_kind(kept, futures_util::stream::select_all(streams), sync);
    (ingresses, task.boxed())
}

/// Watches a kind no other task reads, received as `W` (the API type, decoded without its
/// managed fields: [`Lean`]) and stored as `K`: only the objects' `Arc`s are kept beside the
/// index ([`Listed`]); a relist of any watch replaces the kind with the union of all of them.
fn watch_kind<W, K>(apis: Vec<Api<Lean<W>>>, configs: Vec<watcher::Config>, sync: Sync) -> Task
where
    W: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + 'static,
    K: Stored + From<W>,
{
    let mut listed = Vec::new();
    let mut streams = Vec::new();
    for (i, (api, config)) in each_watch(&apis, &configs).enumerate() {
        listed.push(Listed::<K>::default());
        let stream = watcher(api, config)
            .backoff(WatchBackoff::default())
            .map(move |event| (i, event.map(|event| lean(event, stored::<W, K>))));
        streams.push(stream.boxed());
    }
    run_kind(listed, futures_util::stream::select_all(streams), sync).boxed()
}

/// Every API with every config.
fn each_watch<'a, W: Resource + Clone>(
    apis: &'a [Api<W>],
    configs: &'a [watcher::Config],
) -> impl Iterator<Item = (Api<W>, watcher::Config)> + 'a {
    apis.iter().flat_map(move |api| {
        configs
            .iter()
            .map(move |config| (api.clone(), config.clone()))
    })
}

/// A watch event of a [`Lean`] object with the API object made into `K` by `into`.
fn lean<W, K>(event: watcher::Event<Lean<W>>, into: impl Fn(W) -> K) -> watcher::Event<K> {
    match event {
        watcher::Event::Apply(object) => watcher::Event::Apply(into(object.0)),
        watcher::Event::Delete(object) => watcher::Event::Delete(into(object.0)),
        watcher::Event::Init => watcher::Event::Init,
        watcher::Event::InitApply(object) => watcher::Event::InitApply(into(object.0)),
        watcher::Event::InitDone => watcher::Event::InitDone,
    }
}

/// The API object trimmed ([`trim`]) and in stored form.
fn stored<W: Resource + 'static, K: From<W>>(mut object: W) -> K {
    trim(&mut object);
    object.into()
}

/// An Ingress trimmed ([`trim`]) and without spare list capacity ([`fit`]).
fn stored_ingress(mut ingress: Ingress) -> StoredIngress {
    trim(&mut ingress);
    fit(&mut ingress);
    ingress.into()
}

/// The events of one kind's watches, each with the index of its watch.
type Events<K> = SelectAll<BoxStream<'static, (usize, Result<watcher::Event<K>, watcher::Error>)>>;

/// Runs one kind's watcher: its events become changes on `sync.tx`, and the kind counts as
/// listed once each of its watches has listed.
async fn run_kind<K: Stored>(mut kept: impl Kept<K>, mut events: Events<K>, sync: Sync) {
    let mut listed = vec![false; kept.watches()];
    let mut synced = false;
    let mut failing = false;
    while let Some((i, event)) = events.next().await {
        let change = match event {
            Ok(event) => {
                if failing {
                    failing = false;
                    tracing::info!(kind = %K::KIND, "Watch recovered");
                }
                match kept.seen(i, event) {
                    Seen::Change(change) => Some(change),
                    Seen::Nothing => None,
                    Seen::Listed => {
                        listed[i] = true;
                        Some(kept.replace())
                    }
                }
            }
            Err(error) => {
                failing = true;
                tracing::warn!(kind = %K::KIND, %error, "Watch failed; retrying with backoff");
                None
            }
        };
        let Some(change) = change else { continue };
        if sync
            .tx
            .send(SourceEvent::Changes(vec![change]))
            .await
            .is_err()
        {
            return;
        }
        if let Some(changed) = &sync.changed {
            changed.send_modify(|n| *n += 1);
        }
        if !synced && listed.iter().all(|l| *l) {
            synced = true;
            tracing::info!(kind = %K::KIND, "Watch synced");
            if sync.countdown.listed(&sync.tx).await.is_err() {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stored::IngressMeta;

    fn ingress(namespace: &str, name: &str) -> StoredIngress {
        StoredIngress {
            metadata: IngressMeta {
                namespace: Some(namespace.to_owned()),
                name: Some(name.to_owned()),
                ..IngressMeta::default()
            },
            ..StoredIngress::default()
        }
    }

    fn names(ingresses: &[Arc<StoredIngress>]) -> Vec<String> {
        let name = |i: &Arc<StoredIngress>| i.metadata.name.clone().unwrap_or_default();
        ingresses.iter().map(name).collect()
    }

    #[test]
    fn the_shared_ingresses_are_listed_once_every_watch_has_listed() {
        let (listed_tx, listed_rx) = watch::channel(false);
        let (_changes_tx, changes_rx) = watch::channel(0u64);
        let ingresses = SharedIngresses::new(2);
        let mut kept = SharedKept {
            ingresses: ingresses.clone(),
            watches_listed: vec![false; 2],
            listed: listed_tx,
        };
        let stores = Stores {
            ingresses,
            ingress_changes: changes_rx,
            ingresses_listed: listed_rx.clone(),
        };
        let list = |kept: &mut SharedKept, i: usize, objects: Vec<StoredIngress>| {
            kept.seen(i, watcher::Event::Init);
            for object in objects {
                kept.seen(i, watcher::Event::InitApply(object));
            }
            matches!(kept.seen(i, watcher::Event::InitDone), Seen::Listed)
        };
        assert!(list(
            &mut kept,
            0,
            vec![ingress("a", "web"), ingress("a", "api")]
        ));
        assert!(!*listed_rx.borrow(), "one watch of two has listed");
        assert_eq!(names(&stores.ingresses()), ["api", "web"]);
        assert!(list(&mut kept, 1, vec![ingress("b", "shop")]));
        assert!(*listed_rx.borrow());
        assert_eq!(names(&stores.ingresses()), ["api", "web", "shop"]);
        let found = stores.ingress("b", "shop").map(|i| names(&[i]));
        assert_eq!(found, Some(vec!["shop".to_owned()]));
        assert!(stores.ingress("a", "shop").is_none());
        // A watch event changes what the readers see; a relist replaces the kind with all.
        kept.seen(0, watcher::Event::Delete(ingress("a", "web")));
        kept.seen(1, watcher::Event::Apply(ingress("b", "cart")));
        assert_eq!(names(&stores.ingresses()), ["api", "cart", "shop"]);
        let Change::Replace { objects, .. } = kept.replace() else {
            panic!("a relist replaces the kind");
        };
        assert_eq!(objects.len(), 3);
    }

    #[test]
    fn stored_ingresses_keep_no_spare_list_capacity() {
        let text = r#"{
            "apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
            "metadata": {"name": "web", "namespace": "a", "finalizers": ["x"]},
            "spec": {
                "tls": [{"hosts": ["web.example"], "secretName": "web"}],
                "rules": [{"host": "web.example", "http": {"paths": [
                    {"path": "/api", "pathType": "Prefix",
                     "backend": {"service": {"name": "api", "port": {"number": 80}}}},
                    {"path": "/", "pathType": "Prefix",
                     "backend": {"service": {"name": "web", "port": {"name": "http"}}}}
                ]}}]
            },
            "status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.1"}, {"ip": "2001:db8::1"}]}}
        }"#;
        let decoded: Lean<Ingress> = serde_json::from_str(text).unwrap();
        let as_decoded = decoded.0.clone();
        let ingress = stored_ingress(decoded.0);
        assert_eq!(ingress, as_decoded.into(), "fitting changes no value");
        let fits = |len: usize, capacity: usize| len == capacity;
        let spec = ingress.spec.as_ref().unwrap();
        let rules = spec.rules.as_ref().unwrap();
        assert!(fits(rules.len(), rules.capacity()), "{}", rules.capacity());
        let paths = &rules[0].http.as_ref().unwrap().paths;
        assert!(fits(paths.len(), paths.capacity()), "{}", paths.capacity());
        let tls = spec.tls.as_ref().unwrap();
        assert!(fits(tls.len(), tls.capacity()));
        let hosts = tls[0].hosts.as_ref().unwrap();
        assert!(fits(hosts.len(), hosts.capacity()));
        let status = ingress
            .status
            .as_ref()
            .and_then(|s| s.load_balancer.as_ref());
        let addresses = status.and_then(|b| b.ingress.as_ref()).unwrap();
        assert!(fits(addresses.len(), addresses.capacity()));
    }

    #[tokio::test]
    async fn no_kubeconfig_outside_a_cluster_is_a_clear_error() {
        // A kubeconfig path that does not exist names the file.
        let settings = KubeSettings {
            kubeconfig: Some(PathBuf::from("/nonexistent/duet-kubeconfig")),
            namespaces: Vec::new(),
        };
        let Err(error) = connect(&settings).await else {
            panic!("a missing kubeconfig connects");
        };
        assert!(matches!(error, KubeError::Kubeconfig { .. }), "{error}");
        assert!(error.to_string().contains("/nonexistent/duet-kubeconfig"));
    }
}
