//! The Kubernetes API source: one kube-runtime watcher and reflector store per kind (and per
//! watched namespace), objects trimmed before caching, feeding the same [`Change`] stream as the
//! manifest folder.
//!
//! Watched: `networking.k8s.io/v1` Ingress and IngressClass, `v1` Service, `discovery.k8s.io/v1`
//! EndpointSlice (only those labelled `kubernetes.io/service-name`) and `v1` Secret (only
//! `type=kubernetes.io/tls` ones, and by name the CA Secrets Ingresses name: see
//! [`secrets`](super::secrets)). `managedFields` and the
//! `kubectl.kubernetes.io/last-applied-configuration` annotation are dropped before an object is
//! cached.
//!
//! Every (re)list of a kind ends in a [`Change::Replace`] carrying the whole reflector state of
//! that kind, so objects deleted while a watch was down (a relist after `410 Gone` reports no
//! deletes) disappear too. [`SourceEvent::Synced`] is sent once every watcher has listed once.
//! Watch errors are logged and retried with backoff ([`WatchBackoff`]: 0.5 s doubling to 5 s,
//! jittered, reset by the first good event); the index, and so the published snapshot, keeps the
//! last good state meanwhile.

use std::collections::BTreeSet;
use std::fmt::Debug;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt as _;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::{Ingress, IngressClass};
use k8s_openapi::NamespaceResourceScope;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt as _};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use tokio::sync::{mpsc, watch};

use super::SourceEvent;
use crate::index::{Change, Kind, Object, SERVICE_NAME_LABEL};

/// The annotation `kubectl apply` leaves on objects: a full copy of the object, dropped.
pub const LAST_APPLIED_ANNOTATION: &str = "kubectl.kubernetes.io/last-applied-configuration";

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

/// Drops what duet never reads and what makes objects large: `managedFields` and the
/// last-applied annotation.
pub fn trim<K: Resource>(object: &mut K) {
    let meta = object.meta_mut();
    meta.managed_fields = None;
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.remove(LAST_APPLIED_ANNOTATION);
        if annotations.is_empty() {
            meta.annotations = None;
        }
    }
}

/// The retry delays of a failing watch: 0.5 s doubling up to 5 s, each with up to 25 % jitter,
/// back to 0.5 s after a good event. Shorter than kube-runtime's default (up to 30 s), so routes
/// catch up within seconds once the API server is back; five watches at most every 5 s are
/// still gentle on a struggling API server.
#[derive(Clone, Debug)]
pub struct WatchBackoff {
    next: Duration,
}

impl WatchBackoff {
    /// The first delay.
    pub const MIN: Duration = Duration::from_millis(500);
    /// The longest delay (before jitter).
    pub const MAX: Duration = Duration::from_secs(5);
}

impl Default for WatchBackoff {
    fn default() -> Self {
        WatchBackoff { next: Self::MIN }
    }
}

impl Iterator for WatchBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let delay = self.next;
        self.next = (self.next * 2).min(Self::MAX);
        Some(delay + delay.mul_f64(fastrand::f64() * 0.25))
    }
}

impl kube::runtime::utils::Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.next = Self::MIN;
    }
}

/// A kind the source watches.
trait Watched:
    Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static
{
    const KIND: Kind;
    fn wrap(object: Arc<Self>) -> Object;
}

macro_rules! watched {
    ($($ty:ty => $kind:ident),* $(,)?) => {$(
        impl Watched for $ty {
            const KIND: Kind = Kind::$kind;
            fn wrap(object: Arc<Self>) -> Object {
                Object::$kind(object)
            }
        }
    )*};
}

watched!(
    Ingress => Ingress,
    IngressClass => IngressClass,
    Service => Service,
    EndpointSlice => EndpointSlice,
);

/// The reflector stores of the running source, for readers outside the control loop (the
/// status writer reads Ingresses from them).
#[derive(Clone)]
pub struct Stores {
    /// One store per watched namespace (one in all when unscoped).
    pub ingresses: Vec<Store<Ingress>>,
    /// Bumped after every Ingress event.
    pub ingress_changes: watch::Receiver<u64>,
}

impl Debug for Stores {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stores")
            .field("ingresses", &self.ingresses.len())
            .finish()
    }
}

impl Stores {
    /// Every cached Ingress.
    pub fn ingresses(&self) -> Vec<Arc<Ingress>> {
        self.ingresses.iter().flat_map(|s| s.state()).collect()
    }

    /// One cached Ingress.
    pub fn ingress(&self, namespace: &str, name: &str) -> Option<Arc<Ingress>> {
        let key = ObjectRef::new(name).within(namespace);
        self.ingresses.iter().find_map(|s| s.get(&key))
    }
}

/// Counts down the kinds still to list; the last one sends [`SourceEvent::Synced`].
#[derive(Debug)]
pub(super) struct SyncCountdown(pub(super) AtomicUsize);

/// Starts the watchers; returns their Ingress stores. Changes and [`SourceEvent::Synced`] go to
/// `tx`; the tasks end when `tx` closes.
pub fn spawn(client: Client, namespaces: &[String], tx: mpsc::Sender<SourceEvent>) -> Stores {
    let namespaces: Vec<String> = namespaces
        .iter()
        .cloned()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let countdown = Arc::new(SyncCountdown(AtomicUsize::new(5)));
    let (changed_tx, changed_rx) = watch::channel(0u64);
    let changed_tx = Arc::new(changed_tx);

    let base = watcher::Config::default();
    let ingresses = spawn_kind(
        namespaced::<Ingress>(&client, &namespaces),
        vec![base.clone()],
        tx.clone(),
        countdown.clone(),
        Some(changed_tx),
    );
    spawn_kind(
        vec![Api::<IngressClass>::all(client.clone())],
        vec![base.clone()],
        tx.clone(),
        countdown.clone(),
        None,
    );
    spawn_kind(
        namespaced::<Service>(&client, &namespaces),
        vec![base.clone()],
        tx.clone(),
        countdown.clone(),
        None,
    );
    spawn_kind(
        namespaced::<EndpointSlice>(&client, &namespaces),
        vec![base.clone().labels(SERVICE_NAME_LABEL)],
        tx.clone(),
        countdown.clone(),
        None,
    );
    let stores = Stores {
        ingresses,
        ingress_changes: changed_rx,
    };
    super::secrets::spawn(client, &namespaces, stores.clone(), tx, countdown);
    stores
}

pub(super) fn namespaced<K>(client: &Client, namespaces: &[String]) -> Vec<Api<K>>
where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope>,
{
    if namespaces.is_empty() {
        vec![Api::all(client.clone())]
    } else {
        namespaces
            .iter()
            .map(|ns| Api::namespaced(client.clone(), ns))
            .collect()
    }
}

/// Watches one kind: every API (namespace) with every config (field selector); a relist of any
/// of them replaces the kind with the union of all their stores.
fn spawn_kind<K: Watched>(
    apis: Vec<Api<K>>,
    configs: Vec<watcher::Config>,
    tx: mpsc::Sender<SourceEvent>,
    countdown: Arc<SyncCountdown>,
    changed: Option<Arc<watch::Sender<u64>>>,
) -> Vec<Store<K>> {
    let mut readers = Vec::new();
    let mut streams = Vec::new();
    let watches = apis.iter().flat_map(|api| {
        configs
            .iter()
            .map(move |config| (api.clone(), config.clone()))
    });
    for (i, (api, config)) in watches.enumerate() {
        let (reader, writer) = reflector::store();
        readers.push(reader);
        let stream = watcher(api, config)
            .backoff(WatchBackoff::default())
            .modify(trim::<K>)
            .reflect(writer)
            .map(move |event| (i, event));
        streams.push(stream.boxed());
    }
    let stores = readers.clone();
    tokio::spawn(async move {
        let mut all = futures_util::stream::select_all(streams);
        let mut listed = vec![false; readers.len()];
        let mut synced = false;
        let mut failing = false;
        while let Some((i, event)) = all.next().await {
            let change = match event {
                Ok(event) => {
                    if failing {
                        failing = false;
                        tracing::info!(kind = %K::KIND, "Watch recovered");
                    }
                    match event {
                        watcher::Event::Apply(object) => {
                            let key = ObjectRef::from_obj(&object);
                            let shared = readers[i].get(&key).unwrap_or_else(|| Arc::new(object));
                            Some(Change::Apply {
                                object: K::wrap(shared),
                                file: None,
                            })
                        }
                        watcher::Event::Delete(object) => {
                            Some(Change::Delete(K::wrap(Arc::new(object)).key()))
                        }
                        watcher::Event::Init | watcher::Event::InitApply(_) => None,
                        watcher::Event::InitDone => {
                            listed[i] = true;
                            // The whole state of the kind, from every namespace's store: what
                            // the relist no longer has is deleted.
                            let objects = readers
                                .iter()
                                .flat_map(|r| r.state())
                                .map(|o| (K::wrap(o), None))
                                .collect::<Vec<_>>();
                            tracing::debug!(kind = %K::KIND, objects = objects.len(), "Listed");
                            Some(Change::Replace {
                                kind: K::KIND,
                                objects,
                            })
                        }
                    }
                }
                Err(error) => {
                    if !failing {
                        failing = true;
                    }
                    tracing::warn!(kind = %K::KIND, %error, "Watch failed; retrying with backoff");
                    None
                }
            };
            let Some(change) = change else { continue };
            if tx.send(SourceEvent::Changes(vec![change])).await.is_err() {
                return;
            }
            if let Some(changed) = &changed {
                changed.send_modify(|n| *n += 1);
            }
            if !synced && listed.iter().all(|l| *l) {
                synced = true;
                tracing::info!(kind = %K::KIND, "Watch synced");
                if countdown.0.fetch_sub(1, Ordering::AcqRel) == 1
                    && tx.send(SourceEvent::Synced).await.is_err()
                {
                    return;
                }
            }
        }
    });
    stores
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, ObjectMeta};

    #[test]
    fn trim_drops_managed_fields_and_last_applied() {
        let mut ingress = Ingress {
            metadata: ObjectMeta {
                name: Some("web".to_owned()),
                managed_fields: Some(vec![ManagedFieldsEntry::default()]),
                annotations: Some(
                    [
                        (LAST_APPLIED_ANNOTATION.to_owned(), "{...}".to_owned()),
                        (
                            "duet.dev/upstream-family".to_owned(),
                            "PreferIPv6".to_owned(),
                        ),
                    ]
                    .into_iter()
                    .collect(),
                ),
                ..Default::default()
            },
            ..Default::default()
        };
        trim(&mut ingress);
        assert_eq!(ingress.metadata.managed_fields, None);
        let annotations = ingress.metadata.annotations.as_ref().unwrap();
        assert_eq!(annotations.len(), 1);
        assert!(annotations.contains_key("duet.dev/upstream-family"));

        let mut only_last_applied = Service {
            metadata: ObjectMeta {
                annotations: Some(
                    [(LAST_APPLIED_ANNOTATION.to_owned(), "{}".to_owned())]
                        .into_iter()
                        .collect(),
                ),
                ..Default::default()
            },
            ..Default::default()
        };
        trim(&mut only_last_applied);
        assert_eq!(only_last_applied.metadata.annotations, None);
    }

    #[test]
    fn backoff_doubles_to_five_seconds_with_jitter_and_resets() {
        use kube::runtime::utils::Backoff as _;
        let mut b = WatchBackoff::default();
        let delays: Vec<Duration> = b.by_ref().take(6).collect();
        let bases = [500, 1000, 2000, 4000, 5000, 5000].map(Duration::from_millis);
        for (delay, base) in delays.iter().zip(bases) {
            assert!(
                *delay >= base && *delay <= base.mul_f64(1.25),
                "{delay:?} vs {base:?}"
            );
        }
        b.reset();
        assert!(b.next().unwrap() < Duration::from_millis(700));
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
