//! The mini cluster's stand-ins for the deployment and endpoint controllers: they watch the
//! Deployments on the test API server and realise each as loopback echo pods (one per replica,
//! each with its own name, uid and ports), write the per-family EndpointSlices of every Service
//! selecting them, and report the Deployment available in its status. The runner creates
//! Deployments and Services through the API either way; against a real cluster (`--kubeconfig`)
//! the real controllers do this instead.
//!
//! A Deployment may say exactly which pods it has with the annotation [`PODS_ANNOTATION`]: a
//! JSON list of `{"name": POD, "ipv4": PORT, "ipv6": PORT}` where PORT is `listen`, `closed`
//! (listed in the EndpointSlice, refusing connections) or `absent`. duet's dual-stack features
//! use it for IPv4-only, IPv6-only and half-broken pods; without it a Deployment has
//! `spec.replicas` dual-stack pods.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::task::JoinHandle;

use crate::apiserver::ApiServer;
use crate::echo::Family;
use crate::fleet::{Fleet, PodSpec, Port};
use crate::manifests::{endpoint_slice, Endpoint};

/// The Deployment annotation listing its pods exactly (mini cluster only).
pub const PODS_ANNOTATION: &str = "conformance.duet.dev/pods";

/// How often the stand-ins look for changes (they act only when the resourceVersion moved).
const TICK: Duration = Duration::from_millis(20);

/// One pod of [`PODS_ANNOTATION`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodShape {
    /// The pod name.
    pub name: String,
    /// `listen`, `closed` or `absent`.
    pub ipv4: String,
    /// `listen`, `closed` or `absent`.
    pub ipv6: String,
}

/// The [`Port`] of a word of [`PodShape`]: `listen`, `closed` or `absent`.
pub fn port_of(word: &str) -> anyhow::Result<Port> {
    Ok(match word {
        "listen" => Port::Listen,
        "closed" => Port::Closed,
        "absent" => Port::Absent,
        other => bail!("{other:?} is not listen, closed or absent"),
    })
}

fn word_of(port: Port) -> &'static str {
    match port {
        Port::Listen => "listen",
        Port::Closed => "closed",
        Port::Absent => "absent",
    }
}

impl PodShape {
    /// The shape of a pod spec.
    pub fn of(spec: &PodSpec) -> PodShape {
        PodShape {
            name: spec.name.clone(),
            ipv4: word_of(spec.v4).into(),
            ipv6: word_of(spec.v6).into(),
        }
    }

    /// The pod spec of a shape.
    pub fn spec(&self) -> anyhow::Result<PodSpec> {
        Ok(PodSpec::dual(&self.name)
            .with(Family::V4, port_of(&self.ipv4)?)
            .with(Family::V6, port_of(&self.ipv6)?))
    }
}

/// The running stand-ins; they stop when dropped.
#[derive(Debug)]
pub struct StandIn {
    task: JoinHandle<()>,
}

impl Drop for StandIn {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl StandIn {
    /// Starts watching `api`; must be called inside a Tokio runtime.
    pub fn start(api: Arc<ApiServer>) -> StandIn {
        let task = tokio::spawn(async move {
            let mut state = State::default();
            let mut seen = None;
            loop {
                let rv = api.resource_version();
                if seen != Some(rv) {
                    if let Err(e) = state.reconcile(&api) {
                        tracing::warn!(error = %format!("{e:#}"), "Stand-in controllers failed a pass");
                    }
                    seen = Some(rv);
                }
                tokio::time::sleep(TICK).await;
            }
        });
        StandIn { task }
    }
}

/// One realised Deployment.
#[derive(Debug)]
struct Realised {
    uid: String,
    /// One fleet per pod, oldest first (scaling down drops the newest).
    pods: Vec<Fleet>,
}

#[derive(Debug, Default)]
struct State {
    deployments: HashMap<(String, String), Realised>,
    /// The slices last written per (namespace, Service).
    slices: HashMap<(String, String), Vec<Value>>,
    counter: u64,
}

fn str_at<'a>(v: &'a Value, key: &str) -> &'a str {
    v[key].as_str().unwrap_or_default()
}

/// `env[name].value` of the Deployment's first container.
fn env_value(deployment: &Value, name: &str) -> Option<String> {
    deployment["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()?
        .iter()
        .find(|e| e["name"] == name)?["value"]
        .as_str()
        .map(str::to_owned)
}

fn selects(selector: &Value, labels: &Value) -> bool {
    match selector.as_object() {
        Some(sel) if !sel.is_empty() => sel.iter().all(|(k, v)| labels.get(k) == Some(v)),
        _ => false,
    }
}

impl State {
    fn reconcile(&mut self, api: &ApiServer) -> anyhow::Result<()> {
        let deployments = api.list("apps/v1", "Deployment");
        self.pods(&deployments)?;
        self.endpoints(api, &deployments)?;
        self.status(api, &deployments)
    }

    /// The deployment controller: pods per Deployment.
    fn pods(&mut self, deployments: &[Value]) -> anyhow::Result<()> {
        let mut live = Vec::new();
        for d in deployments {
            let meta = &d["metadata"];
            let key = (
                str_at(meta, "namespace").to_owned(),
                str_at(meta, "name").to_owned(),
            );
            live.push(key.clone());
            let uid = str_at(meta, "uid").to_owned();
            if self.deployments.get(&key).is_some_and(|r| r.uid != uid) {
                self.deployments.remove(&key);
            }
            let service = env_value(d, "SERVICE_NAME").unwrap_or_else(|| key.1.clone());
            let shapes = meta["annotations"][PODS_ANNOTATION].as_str();
            let realised = self.deployments.entry(key.clone()).or_insert(Realised {
                uid,
                pods: Vec::new(),
            });
            if let Some(shapes) = shapes {
                if realised.pods.is_empty() {
                    let shapes: Vec<PodShape> = serde_json::from_str(shapes)
                        .with_context(|| format!("bad {PODS_ANNOTATION} on {}/{}", key.0, key.1))?;
                    for shape in shapes {
                        realised
                            .pods
                            .push(Fleet::start(&key.0, &service, &[shape.spec()?])?);
                    }
                }
                continue;
            }
            let replicas = d["spec"]["replicas"].as_u64().unwrap_or(1) as usize;
            realised.pods.truncate(replicas);
            while realised.pods.len() < replicas {
                self.counter += 1;
                let name = format!("{}-{:05x}", key.1, self.counter);
                realised
                    .pods
                    .push(Fleet::start(&key.0, &service, &[PodSpec::dual(&name)])?);
            }
        }
        self.deployments.retain(|k, _| live.contains(k));
        Ok(())
    }

    /// The endpoint controller: one slice per pod and family for every Service with a selector,
    /// named `<service>-<pod>-<family>`, its port named as the Service's first port.
    fn endpoints(&mut self, api: &ApiServer, deployments: &[Value]) -> anyhow::Result<()> {
        let mut live = Vec::new();
        for svc in api.list("v1", "Service") {
            let meta = &svc["metadata"];
            let (ns, name) = (str_at(meta, "namespace"), str_at(meta, "name"));
            let selector = &svc["spec"]["selector"];
            if selector.as_object().is_none_or(|s| s.is_empty()) {
                continue;
            }
            let port_name = svc["spec"]["ports"][0]["name"].as_str().unwrap_or_default();
            let mut slices = Vec::new();
            for d in deployments {
                let dm = &d["metadata"];
                if str_at(dm, "namespace") != ns
                    || !selects(selector, &d["spec"]["template"]["metadata"]["labels"])
                {
                    continue;
                }
                let key = (ns.to_owned(), str_at(dm, "name").to_owned());
                let Some(realised) = self.deployments.get(&key) else {
                    continue;
                };
                for pod in realised.pods.iter().flat_map(|f| f.pods()) {
                    for family in Family::BOTH {
                        let Some(addr) = pod.addr(family) else {
                            continue;
                        };
                        slices.push(endpoint_slice(
                            ns,
                            name,
                            &format!("{name}-{}-{family}", pod.name),
                            family,
                            port_name,
                            addr.port(),
                            &[Endpoint {
                                pod: pod.name.clone(),
                                uid: pod.uid.clone(),
                                ip: addr.ip(),
                                ready: pod.ready,
                            }],
                        ));
                    }
                }
            }
            let key = (ns.to_owned(), name.to_owned());
            live.push(key.clone());
            if self.slices.get(&key) == Some(&slices) {
                continue;
            }
            let keep: Vec<&str> = slices
                .iter()
                .map(|s| s["metadata"]["name"].as_str().unwrap_or_default())
                .collect();
            api.with_store(|store| -> anyhow::Result<()> {
                for slice in &slices {
                    store.apply(slice.clone())?;
                }
                for old in store.list_objects("discovery.k8s.io/v1", "EndpointSlice") {
                    let m = &old["metadata"];
                    if str_at(m, "namespace") == ns
                        && m["labels"]["kubernetes.io/service-name"] == name
                        && !keep.contains(&str_at(m, "name"))
                    {
                        store.delete_object(
                            "discovery.k8s.io/v1",
                            "EndpointSlice",
                            Some(ns),
                            str_at(m, "name"),
                        )?;
                    }
                }
                Ok(())
            })?;
            self.slices.insert(key, slices);
        }
        self.slices.retain(|k, _| live.contains(k));
        Ok(())
    }

    /// Deployment status: every realised pod is ready and available at once.
    fn status(&self, api: &ApiServer, deployments: &[Value]) -> anyhow::Result<()> {
        for d in deployments {
            let meta = &d["metadata"];
            let key = (
                str_at(meta, "namespace").to_owned(),
                str_at(meta, "name").to_owned(),
            );
            let Some(realised) = self.deployments.get(&key) else {
                continue;
            };
            let n = realised.pods.len();
            let status = json!({
                "observedGeneration": meta["generation"].as_u64().unwrap_or(1),
                "replicas": n,
                "updatedReplicas": n,
                "readyReplicas": n,
                "availableReplicas": n,
                "conditions": [{"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable"}],
            });
            if d["status"] == status {
                continue;
            }
            api.with_store(|store| -> anyhow::Result<()> {
                // Read again under the lock: the runner may have scaled since the list.
                let Some(mut current) =
                    store.get_object("apps/v1", "Deployment", Some(&key.0), &key.1)
                else {
                    return Ok(());
                };
                if current["metadata"]["generation"] != meta["generation"] {
                    return Ok(());
                }
                current["status"] = status;
                store.apply(current)?;
                Ok(())
            })?;
        }
        Ok(())
    }
}
