//! The mini cluster the runner tests against: the test API server, the real `duet` in
//! Kubernetes mode publishing its loopback listener addresses as Ingress status, the IngressClass
//! `conformance`, and "Deployments" realised as in-process echo pods whose Service and
//! per-family EndpointSlices the runner writes as the endpoint controller would.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::{json, Value};

use crate::apiserver::ApiServer;
use crate::duet::{Duet, DuetBuilder};
use crate::echo::Family;
use crate::fleet::{Fleet, PodSpec};

/// The IngressClass the upstream features use by default.
pub const INGRESS_CLASS: &str = "conformance";
/// duet's default `spec.controller`.
pub const CONTROLLER: &str = "duet.dev/ingress-controller";
/// The label on every namespace the runner creates.
pub const NAMESPACE_LABEL: (&str, &str) = ("app.kubernetes.io/name", "ingress-conformance");

/// One "Deployment": its pods, and the names of the slices written for them.
#[derive(Debug)]
struct Deployment {
    service: String,
    /// Held: dropping it stops the pods.
    _fleet: Fleet,
}

/// The running mini cluster.
#[derive(Debug)]
pub struct Cluster {
    /// The API server.
    pub api: ApiServer,
    /// duet, in Kubernetes mode.
    pub duet: Duet,
    deployments: Mutex<HashMap<(String, String), Deployment>>,
    counter: AtomicU64,
}

impl Cluster {
    /// Starts the API server on `127.0.0.1`, creates the IngressClass and starts duet with
    /// `--publish-status-address 127.0.0.1,::1`.
    pub async fn start(duet_bin: &Path) -> anyhow::Result<Cluster> {
        let api = ApiServer::start(Family::V4.loopback())?;
        api.create(json!({
            "apiVersion": "networking.k8s.io/v1",
            "kind": "IngressClass",
            "metadata": {"name": INGRESS_CLASS},
            "spec": {"controller": CONTROLLER},
        }))
        .context("cannot create the IngressClass")?;
        let duet = DuetBuilder::kube(duet_bin, api.kubeconfig())
            .args([
                "--publish-status-address",
                "127.0.0.1,::1",
                "--ingress-class",
                INGRESS_CLASS,
                "--election-namespace",
                "default",
            ])
            .start()
            .await?;
        Ok(Cluster {
            api,
            duet,
            deployments: Mutex::new(HashMap::new()),
            counter: AtomicU64::new(0),
        })
    }

    /// The listener a client of `family` reaches for `scheme`.
    pub fn listener(&self, family: Family, scheme: &str) -> SocketAddr {
        if scheme == "https" {
            self.duet.https(family)
        } else {
            self.duet.http(family)
        }
    }

    /// A namespace named `ingress-conformance-…` with the conformance label.
    pub fn new_namespace(&self) -> anyhow::Result<String> {
        let ns = self.api.create(json!({
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {
                "generateName": "ingress-conformance-",
                "labels": {NAMESPACE_LABEL.0: NAMESPACE_LABEL.1},
            },
        }))?;
        ns["metadata"]["name"]
            .as_str()
            .map(str::to_owned)
            .context("namespace without a name")
    }

    /// Deletes a namespace (its objects go with it) and stops its pods.
    pub fn delete_namespace(&self, ns: &str) {
        let _ = self.api.delete("v1", "Namespace", None, ns);
        let mut deployments = self.deployments.lock().expect("deployments lock");
        deployments.retain(|(dns, _), _| dns != ns);
    }

    /// Creates Deployment `<ingress>-<service>` with one pod, its Service and slices, unless that
    /// Deployment exists (as upstream: then nothing happens).
    pub fn ensure_backend(&self, ns: &str, ingress: &str, service: &str) -> anyhow::Result<()> {
        let name = format!("{ingress}-{service}");
        if self
            .deployments
            .lock()
            .expect("deployments lock")
            .contains_key(&(ns.to_owned(), name.clone()))
        {
            return Ok(());
        }
        let specs = self.pod_specs(&name, 1);
        let fleet = Fleet::start(ns, service, &specs)?;
        for doc in fleet.manifests() {
            self.api.apply(doc)?;
        }
        self.deployments.lock().expect("deployments lock").insert(
            (ns.to_owned(), name),
            Deployment {
                service: service.to_owned(),
                _fleet: fleet,
            },
        );
        Ok(())
    }

    fn pod_specs(&self, deployment: &str, replicas: usize) -> Vec<PodSpec> {
        (0..replicas)
            .map(|_| {
                let n = self.counter.fetch_add(1, Ordering::Relaxed);
                PodSpec::dual(&format!("{deployment}-{n:05x}"))
            })
            .collect()
    }

    /// Scales Deployment `name` to `replicas` pods: new pods and slices replace the old ones, then
    /// waits until duet routes to every new pod on both families.
    pub async fn scale(&self, ns: &str, name: &str, replicas: usize) -> anyhow::Result<()> {
        let service = {
            let deployments = self.deployments.lock().expect("deployments lock");
            let d = deployments
                .get(&(ns.to_owned(), name.to_owned()))
                .with_context(|| format!("no Deployment {ns}/{name}"))?;
            d.service.clone()
        };
        let specs = self.pod_specs(name, replicas);
        let fleet = Fleet::start(ns, &service, &specs)?;
        let new_slices = fleet.slices();
        let keep: Vec<String> = new_slices
            .iter()
            .filter_map(|s| s["metadata"]["name"].as_str().map(str::to_owned))
            .collect();
        for doc in new_slices {
            self.api.apply(doc)?;
        }
        for old in self.api.list("discovery.k8s.io/v1", "EndpointSlice") {
            let meta = &old["metadata"];
            let same_service =
                meta["labels"]["kubernetes.io/service-name"].as_str() == Some(service.as_str());
            let name = meta["name"].as_str().unwrap_or_default();
            if meta["namespace"].as_str() == Some(ns)
                && same_service
                && !keep.iter().any(|k| k == name)
            {
                let _ = self
                    .api
                    .delete("discovery.k8s.io/v1", "EndpointSlice", Some(ns), name);
            }
        }
        let addrs: Vec<SocketAddr> = fleet
            .pods()
            .iter()
            .flat_map(|p| Family::BOTH.into_iter().filter_map(|f| p.addr(f)))
            .collect();
        let old = self.deployments.lock().expect("deployments lock").insert(
            (ns.to_owned(), name.to_owned()),
            Deployment {
                service,
                _fleet: fleet,
            },
        );
        self.wait_routed(&addrs).await?;
        drop(old);
        Ok(())
    }

    /// Waits until `/debug/routes` names every address.
    async fn wait_routed(&self, addrs: &[SocketAddr]) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let routes = self
                .duet
                .debug_routes()
                .await
                .unwrap_or(Value::Null)
                .to_string();
            let missing: Vec<&SocketAddr> = addrs
                .iter()
                .filter(|a| !routes.contains(&a.to_string()))
                .collect();
            if missing.is_empty() {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("duet does not route to {missing:?} after 30 s");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}
