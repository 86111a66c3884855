//! The Kubernetes API source: one kube-runtime watcher and reflector store per kind (and per
//! watched namespace), objects trimmed before caching, feeding the same [`Change`] stream as the
//! manifest folder.
//!
//! Watched: `networking.k8s.io/v1` Ingress and IngressClass, the Gateway API kinds
//! (GatewayClass, Gateway, HTTPRoute, GRPCRoute, ReferenceGrant) and Namespaces when the cluster
//! serves `gateway.networking.k8s.io/v1` (asked once at start; they are not waited for before
//! the first snapshot), `v1` Service, `discovery.k8s.io/v1`
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
use std::path::PathBuf;
use std::sync::Arc;

use futures_util::stream::{BoxStream, SelectAll};
use futures_util::{FutureExt as _, StreamExt as _};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::networking::v1::{Ingress, IngressClass};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt as _};
use kube::{Api, Client};
use tokio::sync::{mpsc, watch};

use super::watch::{seen, Seen, SyncCountdown, Task, Watched};
pub use super::watch::{trim, Stores, WatchBackoff, LAST_APPLIED_ANNOTATION};
use super::SourceEvent;
use crate::compact::Slice;
use crate::gateway::api::{Gateway, GatewayClass, GrpcRoute, HttpRoute, ReferenceGrant};
use crate::index::Change;
use crate::namespaces;
use crate::object::SERVICE_NAME_LABEL;
use crate::stored::StoredService;

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
    let ingresses = watch_kind(
        namespaces::apis::<Ingress>(&client, &namespaces),
        vec![base.clone()],
        sync(Some(Arc::new(changed_tx))),
    );
    let stores = Stores {
        ingresses: ingresses.stores,
        ingress_changes: changed_rx,
    };
    let tasks: Vec<Task> = vec![
        ingresses.task,
        watch_kind(
            vec![Api::<IngressClass>::all(client.clone())],
            vec![base.clone()],
            sync(None),
        )
        .task,
        watch_kind(
            namespaces::apis::<StoredService>(&client, &namespaces),
            vec![base.clone()],
            sync(None),
        )
        .task,
        watch_kind(
            namespaces::apis::<Slice>(&client, &namespaces),
            vec![base.labels(SERVICE_NAME_LABEL)],
            sync(None),
        )
        .task,
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
        let tasks = gateway_watchers(&client, &namespaces, &gateway_sync);
        gateway_sync.countdown.expect(tasks.len());
        for task in tasks {
            tokio::spawn(task);
        }
    });
    stores
}

/// The watchers of the Gateway API kinds and of Namespaces (whose labels select routes), when
/// the cluster serves the Gateway API.
fn gateway_watchers(client: &Client, namespaces: &[String], sync: &Sync) -> Vec<Task> {
    let base = || vec![watcher::Config::default()];
    let each = || Sync {
        tx: sync.tx.clone(),
        countdown: sync.countdown.clone(),
        changed: None,
    };
    vec![
        watch_kind(vec![Api::<Namespace>::all(client.clone())], base(), each()).task,
        watch_kind(
            vec![Api::<GatewayClass>::all(client.clone())],
            base(),
            each(),
        )
        .task,
        watch_kind(
            namespaces::apis::<Gateway>(client, namespaces),
            base(),
            each(),
        )
        .task,
        watch_kind(
            namespaces::apis::<HttpRoute>(client, namespaces),
            base(),
            each(),
        )
        .task,
        watch_kind(
            namespaces::apis::<GrpcRoute>(client, namespaces),
            base(),
            each(),
        )
        .task,
        watch_kind(
            namespaces::apis::<ReferenceGrant>(client, namespaces),
            base(),
            each(),
        )
        .task,
    ]
}

/// One kind's watcher, built: its reflector stores and the task to run.
struct Watcher<K: Watched> {
    stores: Vec<Store<K>>,
    task: Task,
}

/// Where a kind's watcher reports.
struct Sync {
    tx: mpsc::Sender<SourceEvent>,
    countdown: Arc<SyncCountdown>,
    /// Bumped after every event (the Ingress watcher's, for the Secret watcher).
    changed: Option<Arc<watch::Sender<u64>>>,
}

/// Watches one kind: every API (namespace) with every config (field selector); a relist of any
/// of them replaces the kind with the union of all their stores. The watcher is built, not
/// started: the caller counts it, then spawns its task.
fn watch_kind<K: Watched>(
    apis: Vec<Api<K>>,
    configs: Vec<watcher::Config>,
    sync: Sync,
) -> Watcher<K> {
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
    let task = run_kind(readers, futures_util::stream::select_all(streams), sync);
    Watcher {
        stores,
        task: task.boxed(),
    }
}

/// The events of one kind's watches, each with the index of its watch.
type Events<K> = SelectAll<BoxStream<'static, (usize, Result<watcher::Event<K>, watcher::Error>)>>;

/// Runs one kind's watcher: its events become changes on `sync.tx`, and the kind counts as
/// listed once each of its watches has listed.
async fn run_kind<K: Watched>(readers: Vec<Store<K>>, mut events: Events<K>, sync: Sync) {
    let mut listed = vec![false; readers.len()];
    let mut synced = false;
    let mut failing = false;
    while let Some((i, event)) = events.next().await {
        let change = match event {
            Ok(event) => {
                if failing {
                    failing = false;
                    tracing::info!(kind = %K::KIND, "Watch recovered");
                }
                match seen(&readers[i], event) {
                    Seen::Change(change) => Some(change),
                    Seen::Nothing => None,
                    Seen::Listed => {
                        listed[i] = true;
                        Some(replace(&readers))
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

/// The whole state of a kind, from every namespace's store: what a relist no longer has is
/// deleted.
fn replace<K: Watched>(readers: &[Store<K>]) -> Change {
    let objects = readers
        .iter()
        .flat_map(|r| r.state())
        .map(|o| (K::wrap(o), None))
        .collect::<Vec<_>>();
    tracing::debug!(kind = %K::KIND, objects = objects.len(), "Listed");
    Change::Replace {
        kind: K::KIND,
        objects,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
