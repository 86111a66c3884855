//! Kubernetes mode: connects to the API and starts the watchers feeding the control loop.

use tokio::sync::mpsc;

use crate::config::KubeConfig;
use crate::source::kube::{self as kube_source, KubeError, Stores};
use crate::source::SourceEvent;

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
}

impl Cluster {
    /// The client.
    pub fn client(&self) -> &kube::Client {
        &self.client
    }

    /// The namespace of the kubeconfig context (or the pod, in a cluster).
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// Starts the watchers, sending changes to `tx`.
    pub fn start(self, config: &KubeConfig, tx: mpsc::Sender<SourceEvent>) -> Running {
        tracing::info!(
            namespaces = ?config.settings.namespaces,
            "Watching the Kubernetes API"
        );
        let stores = kube_source::spawn(self.client, &config.settings.namespaces, tx);
        Running { stores }
    }
}
