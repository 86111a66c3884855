//! Kubernetes mode: connects to the API, starts the watchers feeding the control loop, leader
//! election, the Ingress status writer and the Event recorder.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use dataplane::admin::DebugExtra;
use tokio::sync::{mpsc, watch};

use crate::app::App;
use crate::config::KubeConfig;
use crate::leader::{self, ElectionConfig, Elector};
use crate::source::kube::{self as kube_source, KubeError, Stores};
use crate::source::SourceEvent;
use crate::status::{self, StatusDebug, StatusInputs};

/// A connection to the cluster, made before anything is bound.
#[derive(Clone)]
pub struct Cluster {
    client: kube::Client,
    namespace: String,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

/// Finds the cluster (`--kubeconfig`, `KUBECONFIG`, `~/.kube/config`, in-cluster).
pub async fn connect(config: &KubeConfig) -> Result<Cluster, KubeError> {
    let (client, namespace) = kube_source::connect(&config.settings).await?;
    Ok(Cluster { client, namespace })
}

/// The running Kubernetes mode tasks.
#[derive(Debug)]
pub struct Running {
    /// The watchers' Ingress stores.
    pub stores: Stores,
    /// Leader election.
    elector: Elector,
    /// What `/debug/routes` shows about status.
    status: StatusDebug,
}

impl Running {
    /// Adds the status view (`"status"`) to the app's `/debug/routes` extra.
    pub fn debug_extra(&self, app: DebugExtra) -> DebugExtra {
        let status = self.status.clone();
        Arc::new(move || {
            let mut value = app();
            if let Some(object) = value.as_object_mut() {
                object.insert("status".to_owned(), status.json());
            }
            value
        })
    }

    /// Steps down from leadership, releasing the Lease so another replica takes over at once.
    pub async fn shutdown(self) {
        self.elector.release(Duration::from_secs(2)).await;
    }
}

impl Cluster {
    /// The namespace of the kubeconfig context (or the pod, in a cluster).
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// Starts the watchers (changes to `tx`), leader election, the status writer and the Event
    /// recorder, and hooks the latter two to `app`.
    pub fn start(
        self,
        config: &KubeConfig,
        tx: mpsc::Sender<SourceEvent>,
        app: &mut App,
    ) -> Running {
        let election_namespace = config
            .election_namespace
            .clone()
            .or_else(|| {
                std::env::var("POD_NAMESPACE")
                    .ok()
                    .filter(|n| !n.is_empty())
            })
            .unwrap_or_else(|| self.namespace.clone());
        let election = ElectionConfig {
            namespace: election_namespace,
            name: config.election_id.clone(),
            identity: leader::identity(),
            lease_duration: config.lease_duration,
        };
        tracing::info!(
            namespaces = ?config.settings.namespaces,
            lease = %format!("{}/{}", election.namespace, election.name),
            identity = %election.identity,
            "Watching the Kubernetes API"
        );
        let stores = kube_source::spawn(self.client.clone(), &config.settings.namespaces, tx);
        let identity = election.identity.clone();
        let gateway_pods_namespace = election.namespace.clone();
        let elector = leader::spawn(
            kube::Api::namespaced(self.client.clone(), &election.namespace),
            election,
        );

        let (report_tx, report_rx) = watch::channel(Arc::default());
        app.observe_gateways(report_tx);
        crate::gateway::spawn(
            self.client.clone(),
            config.gateway.clone(),
            gateway_pods_namespace,
            elector.leading(),
            report_rx,
        );
        let (live_tx, live) = watch::channel(Arc::new(BTreeSet::new()));
        let (diagnostics_tx, diagnostics_rx) = watch::channel(Arc::new(Vec::new()));
        app.observe(live_tx, diagnostics_tx);
        let status = status::spawn(StatusInputs {
            client: self.client.clone(),
            publish: config.publish.clone(),
            stores: stores.clone(),
            live,
            leading: elector.leading(),
        });
        crate::events::spawn(
            self.client,
            identity,
            stores.clone(),
            diagnostics_rx,
            elector.leading(),
        );
        Running {
            stores,
            elector,
            status,
        }
    }
}
