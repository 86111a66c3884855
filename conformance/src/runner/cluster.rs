//! The cluster the runner tests against, always driven through the Kubernetes API: the runner
//! creates Namespaces, Deployments (`<ingress>-<service>`, the echo image, port 3000), Services
//! (port `http` 8080 → 3000), Secrets and Ingresses, waits for the Deployments to be available
//! and their EndpointSlices ready, and reads the Ingress status.
//!
//! - **Real control plane** (default): kube-apiserver, etcd and
//!   kube-controller-manager built from their Go modules with the stand-in kubelet
//!   ([`crate::cluster`]), in a network namespace the runner's thread joins; the real controllers
//!   make the pods (each [`PodShape`] of duet's features a Deployment of its own), and duet runs
//!   there, publishing the addresses of [`PUBLISH_SERVICE`] as Ingress status.
//! - **Real cluster** (`--kubeconfig`): the same requests against that cluster, whose own
//!   controllers run the echo image; the controller under test and its IngressClass are already
//!   there, and its status addresses are reached on `--http-port` / `--https-port`.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};
use serde_json::{json, Value};

use super::kube_api::KubeApi;
use super::pod_shape::PodShape;
use crate::duet::{Duet, DuetBuilder};
use crate::echo::Family;
use crate::fleet::{PodSpec, Port};

/// The IngressClass the upstream features use by default.
pub const INGRESS_CLASS: &str = "conformance";
/// duet's default `spec.controller`.
pub const CONTROLLER: &str = "duet.dev/ingress-controller";
/// The label on every namespace the runner creates.
pub const NAMESPACE_LABEL: (&str, &str) = ("app.kubernetes.io/name", "ingress-conformance");
/// The upstream suite's echo backend (NOTES.md §4.3): port 3000, `POD_NAME`, `NAMESPACE`,
/// `INGRESS_NAME` and `SERVICE_NAME` from the environment.
pub const ECHO_IMAGE: &str = "k8s.gcr.io/ingressconformance/echoserver:v0.0.1@sha256:9b34b17f391f87fb2155f01da2f2f90b7a4a5c1110ed84cb5379faa4f570dc52";
/// The Service port of every backend, as upstream: 8080, here always named `http`.
pub const SERVICE_PORT: (&str, u16) = ("http", 8080);
/// The echo container's port.
pub const ECHO_PORT: u16 = 3000;
/// The echo image on a real node: `duet-echo` packed by `images/build.sh echo`, imported into
/// the node's containerd (the upstream image's digest names an image this machine cannot pull).
pub const NODE_ECHO_IMAGE: &str = "duet.local/duet-echo:dev";

/// What the runner needs to reach a cluster.
#[derive(Clone, Debug)]
pub struct Options {
    /// `--kubeconfig`: a real cluster; `None` starts a control plane and duet.
    pub kubeconfig: Option<PathBuf>,
    /// The `duet` binary (not with `--kubeconfig`).
    pub duet: PathBuf,
    /// The IngressClass name Ingresses get by default.
    pub ingress_class: String,
    /// The IngressClass's `spec.controller`, duet's `--controller-name` (not with `--kubeconfig`).
    pub controller_name: String,
    /// The echo image of real Deployments.
    pub echo_image: String,
    /// Start a real node ([`crate::cluster::node`]) rather than the stand-in kubelet.
    pub real_node: bool,
    /// The port of the status addresses for `http` (real cluster).
    pub http_port: u16,
    /// The port of the status addresses for `https` (real cluster).
    pub https_port: u16,
    /// How long a Deployment may take to become available.
    pub ready_timeout: Duration,
    /// After scaling on a real cluster, how long the controller gets to pick up the endpoints
    /// (upstream sleeps 60 s); with the runner's own duet it asks `/debug/routes` instead.
    pub scale_settle: Duration,
}

/// What runs where.
#[derive(Debug)]
enum Mode {
    Local {
        duet: Box<Duet>,
        _cluster: Box<crate::cluster::Cluster>,
    },
    Real {
        http_port: u16,
        https_port: u16,
        scale_settle: Duration,
    },
}

/// The cluster under test.
#[derive(Debug)]
pub struct Cluster {
    /// The API client.
    pub kube: KubeApi,
    /// The IngressClass name Ingresses get by default.
    pub ingress_class: String,
    echo_image: String,
    ready_timeout: Duration,
    mode: Mode,
}

/// The Service in front of the runner's duet (namespace, name), which duet publishes
/// (`--publish-service`).
pub const PUBLISH_SERVICE: (&str, &str) = ("default", "duet");

impl Cluster {
    /// Connects to the cluster (starting the real control plane unless
    /// `--kubeconfig` was given) and deletes namespaces an earlier run left behind.
    pub async fn start(opts: &Options) -> anyhow::Result<Cluster> {
        let (kube, mode) = match &opts.kubeconfig {
            Some(path) => {
                let kube = KubeApi::from_kubeconfig(path).await?;
                let class = kube
                    .get(
                        "networking.k8s.io/v1",
                        "IngressClass",
                        None,
                        &opts.ingress_class,
                    )
                    .await?;
                ensure!(
                    class.is_some(),
                    "the cluster has no IngressClass {:?}: create it for the controller under test",
                    opts.ingress_class
                );
                println!(
                    "cluster of {}: IngressClass {}, status addresses on ports {} and {}",
                    path.display(),
                    opts.ingress_class,
                    opts.http_port,
                    opts.https_port
                );
                let mode = Mode::Real {
                    http_port: opts.http_port,
                    https_port: opts.https_port,
                    scale_settle: opts.scale_settle,
                };
                (kube, mode)
            }
            None => {
                let cluster = crate::cluster::Cluster::start(crate::cluster::Options {
                    real_node: opts.real_node,
                    ..crate::cluster::Options::default()
                })
                .await?;
                println!("control plane: {}", cluster.control_plane());
                if let Some(node) = cluster.node() {
                    println!("node: {}, load balancer: stand-in", node.versions());
                    let image = cluster.dir().join("echo.tar");
                    let echo = opts.duet.with_file_name("duet-echo");
                    crate::cluster::node::build_image("echo", &echo, &[NODE_ECHO_IMAGE], &image)?;
                    cluster.import_image(&image)?;
                }
                let kube = cluster.api().await?;
                create_publish_service(&kube).await?;
                let duet = start_duet(opts, &kube, cluster.kubeconfig(), &[]).await?;
                println!(
                    "real control plane in {}: duet pid {} on {} and {}, folder {}",
                    cluster.netns_path().display(),
                    duet.pid(),
                    duet.http(Family::V4),
                    duet.http(Family::V6),
                    cluster.dir().display()
                );
                let mode = Mode::Local {
                    duet: Box::new(duet),
                    _cluster: Box::new(cluster),
                };
                (kube, mode)
            }
        };
        let echo_image = if opts.real_node {
            NODE_ECHO_IMAGE.to_owned()
        } else {
            opts.echo_image.clone()
        };
        let cluster = Cluster {
            kube,
            ingress_class: opts.ingress_class.clone(),
            echo_image,
            ready_timeout: opts.ready_timeout,
            mode,
        };
        cluster.delete_leftovers().await?;
        Ok(cluster)
    }

    /// Kills the `duet` the runner started, if any (from any thread, at any time). The real
    /// control plane's processes die with the runner's thread (parent-death signal).
    pub fn kill_children(&self) {
        if let Some(duet) = self.duet() {
            duet.kill_now();
        }
    }

    /// The `duet` the runner started, if any.
    fn duet(&self) -> Option<&Duet> {
        match &self.mode {
            Mode::Local { duet, .. } => Some(duet),
            Mode::Real { .. } => None,
        }
    }

    /// Where a client connects for a status address and scheme.
    pub fn listener(&self, ip: IpAddr, scheme: &str) -> SocketAddr {
        let https = scheme == "https";
        match &self.mode {
            Mode::Local { duet, .. } => {
                let family = Family::of(&SocketAddr::new(ip, 0));
                if https {
                    duet.https(family)
                } else {
                    duet.http(family)
                }
            }
            Mode::Real {
                http_port,
                https_port,
                ..
            } => SocketAddr::new(ip, if https { *https_port } else { *http_port }),
        }
    }

    async fn delete_leftovers(&self) -> anyhow::Result<()> {
        let selector = format!("{}={}", NAMESPACE_LABEL.0, NAMESPACE_LABEL.1);
        for ns in self.kube.list("v1", "Namespace", None, &selector).await? {
            if let Some(name) = ns["metadata"]["name"].as_str() {
                println!("deleting namespace {name} left by an earlier run");
                self.kube.delete("v1", "Namespace", None, name).await?;
            }
        }
        Ok(())
    }

    /// A namespace named `ingress-conformance-…` with the conformance label.
    pub async fn new_namespace(&self) -> anyhow::Result<String> {
        let ns = self
            .kube
            .create(json!({
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {
                    "generateName": "ingress-conformance-",
                    "labels": {NAMESPACE_LABEL.0: NAMESPACE_LABEL.1},
                },
            }))
            .await?;
        ns["metadata"]["name"]
            .as_str()
            .map(str::to_owned)
            .context("namespace without a name")
    }

    /// Deletes a namespace (its objects go with it; its pods stop), without waiting. Its
    /// Ingresses go first, at once: a real cluster's namespace controller empties a namespace
    /// over seconds, and an Ingress left meanwhile would still claim its hosts and paths (the
    /// oldest Ingress wins a conflict) for the next scenario.
    pub async fn delete_namespace(&self, ns: &str) {
        let ingresses = self
            .kube
            .list("networking.k8s.io/v1", "Ingress", Some(ns), "")
            .await
            .unwrap_or_default();
        for ingress in ingresses {
            let name = ingress["metadata"]["name"].as_str().unwrap_or_default();
            if let Err(e) = self
                .kube
                .delete("networking.k8s.io/v1", "Ingress", Some(ns), name)
                .await
            {
                eprintln!("cannot delete Ingress {ns}/{name}: {e:#}");
            }
        }
        if let Err(e) = self.kube.delete("v1", "Namespace", None, ns).await {
            eprintln!("cannot delete namespace {ns}: {e:#}");
        }
    }

    /// Creates Deployment `<ingress>-<service>` (one replica) and its Service, and waits until
    /// it is available, unless that Deployment or that Service exists (as upstream: then
    /// nothing happens; a Service declared by an earlier step keeps its pods).
    pub async fn ensure_backend(
        &self,
        ns: &str,
        ingress: &str,
        service: &str,
    ) -> anyhow::Result<()> {
        let name = format!("{ingress}-{service}");
        if self
            .kube
            .get("apps/v1", "Deployment", Some(ns), &name)
            .await?
            .is_some()
            || self
                .kube
                .get("v1", "Service", Some(ns), service)
                .await?
                .is_some()
        {
            return Ok(());
        }
        self.kube
            .create(self.deployment(ns, &name, ingress, service, 1))
            .await?;
        self.kube
            .create(service_object(ns, service, &name, None))
            .await?;
        self.wait_available(ns, &name, service, 1).await?;
        Ok(())
    }

    /// Creates Service `service` with exactly these pods (on the real control plane the runner
    /// started: the stand-in kubelet gives each pod its families), its `ipFamilies` those of its
    /// pods.
    pub async fn service_with_pods(
        &self,
        ns: &str,
        service: &str,
        specs: &[PodSpec],
    ) -> anyhow::Result<()> {
        let families: Vec<Family> = Family::BOTH
            .into_iter()
            .filter(|f| specs.iter().any(|s| s.port(*f) != Port::Absent))
            .collect();
        ensure!(
            matches!(self.mode, Mode::Local { .. }),
            "a Service with pods of chosen families needs the real control plane the runner starts (not --kubeconfig)"
        );
        self.service_with_shaped_pods(ns, service, specs, &families)
            .await
    }

    /// On the real control plane: a Deployment `<service>-<pod>` of one replica per pod, its
    /// template asking the stand-in kubelet for the pod's families
    /// ([`crate::cluster::POD_SHAPE_ANNOTATION`]) and naming the pod as the feature does
    /// (`POD_NAME`), all selected by the Service.
    async fn service_with_shaped_pods(
        &self,
        ns: &str,
        service: &str,
        specs: &[PodSpec],
        families: &[Family],
    ) -> anyhow::Result<()> {
        ensure!(
            specs.iter().all(|s| s.ready),
            "the real control plane has no not-ready pods yet"
        );
        for spec in specs {
            let shape = PodShape::of(spec);
            let name = format!("{service}-{}", spec.name);
            let mut d = self.deployment(ns, &name, "", service, 1);
            let template = &mut d["spec"]["template"];
            template["metadata"]["labels"] = json!({"app": service, "duet-pod": spec.name});
            template["metadata"]["annotations"] = json!({crate::cluster::POD_SHAPE_ANNOTATION:
                json!({"ipv4": shape.ipv4, "ipv6": shape.ipv6}).to_string()});
            template["spec"]["containers"][0]["env"][0] =
                json!({"name": "POD_NAME", "value": spec.name});
            d["spec"]["selector"]["matchLabels"] = json!({"app": service, "duet-pod": spec.name});
            self.kube.create(d).await?;
        }
        self.kube
            .create(service_object(ns, service, service, Some(families)))
            .await?;
        let deadline = Instant::now() + self.ready_timeout;
        let selector = format!("kubernetes.io/service-name={service}");
        loop {
            let slices = self
                .kube
                .list("discovery.k8s.io/v1", "EndpointSlice", Some(ns), &selector)
                .await?;
            let (pods, _) = ready_endpoints(&slices);
            if pods.len() == specs.len() {
                return Ok(());
            }
            ensure!(
                Instant::now() < deadline,
                "Service {ns}/{service}: {} of {} pods ready after {:?}",
                pods.len(),
                specs.len(),
                self.ready_timeout
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Scales Deployment `name` (of Service `service`) to `replicas` and waits until it is
    /// available with that many ready endpoints; then until duet routes to every one (mini
    /// cluster), or for the settle time (real cluster; upstream sleeps 60 s).
    pub async fn scale(
        &self,
        ns: &str,
        name: &str,
        service: &str,
        replicas: usize,
    ) -> anyhow::Result<()> {
        self.kube
            .merge_patch(
                "apps/v1",
                "Deployment",
                Some(ns),
                name,
                &json!({"spec": {"replicas": replicas}}),
            )
            .await?;
        let addrs = self.wait_available(ns, name, service, replicas).await?;
        match &self.mode {
            Mode::Local { duet, .. } => wait_routed(duet, &addrs).await,
            Mode::Real { scale_settle, .. } => {
                tokio::time::sleep(*scale_settle).await;
                Ok(())
            }
        }
    }

    fn deployment(
        &self,
        ns: &str,
        name: &str,
        ingress: &str,
        service: &str,
        replicas: usize,
    ) -> Value {
        let probe = json!({
            "httpGet": {"path": "/health", "port": ECHO_PORT, "scheme": "HTTP"},
            "initialDelaySeconds": 1, "periodSeconds": 1, "timeoutSeconds": 1,
            "successThreshold": 1, "failureThreshold": 10,
        });
        let field = |path: &str| json!({"fieldRef": {"fieldPath": path}});
        json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": name, "namespace": ns, "labels": {"app": name}},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": {"app": name}},
                "template": {
                    "metadata": {"labels": {"app": name}},
                    "spec": {"containers": [{
                        "name": "ingress-conformance-echo",
                        "image": self.echo_image,
                        "imagePullPolicy": "IfNotPresent",
                        "env": [
                            {"name": "POD_NAME", "valueFrom": field("metadata.name")},
                            {"name": "NAMESPACE", "valueFrom": field("metadata.namespace")},
                            {"name": "INGRESS_NAME", "value": ingress},
                            {"name": "SERVICE_NAME", "value": service},
                        ],
                        "ports": [{"name": SERVICE_PORT.0, "containerPort": ECHO_PORT}],
                        "readinessProbe": probe,
                        "livenessProbe": probe,
                    }]},
                },
            },
        })
    }

    /// Waits until Deployment `name` reports `replicas` available (for its current generation)
    /// and the EndpointSlices of `service` list exactly `replicas` ready pods; returns their
    /// addresses.
    async fn wait_available(
        &self,
        ns: &str,
        name: &str,
        service: &str,
        replicas: usize,
    ) -> anyhow::Result<Vec<SocketAddr>> {
        let deadline = Instant::now() + self.ready_timeout;
        // Quick at first (the API server often answers in milliseconds), then once a second.
        let mut poll = Duration::from_millis(20);
        let selector = format!("kubernetes.io/service-name={service}");
        loop {
            let last = match self
                .kube
                .get("apps/v1", "Deployment", Some(ns), name)
                .await?
            {
                None => bail!("Deployment {ns}/{name} is gone"),
                Some(d) => {
                    let status = &d["status"];
                    let generation = d["metadata"]["generation"].as_u64().unwrap_or(0);
                    let available = status["availableReplicas"].as_u64().unwrap_or(0) as usize;
                    let observed = status["observedGeneration"].as_u64().unwrap_or(0);
                    if available == replicas && observed >= generation {
                        let slices = self
                            .kube
                            .list("discovery.k8s.io/v1", "EndpointSlice", Some(ns), &selector)
                            .await?;
                        let (pods, addrs) = ready_endpoints(&slices);
                        if pods.len() == replicas {
                            return Ok(addrs);
                        }
                        format!("{} ready pods in the EndpointSlices", pods.len())
                    } else {
                        format!("{available} available replicas (generation {observed} of {generation})")
                    }
                }
            };
            if Instant::now() > deadline {
                bail!(
                    "Deployment {ns}/{name} not available with {replicas} replicas after {:?}: {last}",
                    self.ready_timeout
                );
            }
            tokio::time::sleep(poll).await;
            poll = (poll * 2).min(Duration::from_secs(1));
        }
    }
}

/// The Service of a backend: selects `app: <deployment>`, port `http` 8080 → 3000. Upstream
/// sets no family policy; duet's runner asks for both families where the cluster has them, or
/// exactly `families`.
fn service_object(ns: &str, service: &str, deployment: &str, families: Option<&[Family]>) -> Value {
    let mut spec = json!({
        "selector": {"app": deployment},
        "ports": [{
            "name": SERVICE_PORT.0, "port": SERVICE_PORT.1, "targetPort": ECHO_PORT,
            "protocol": "TCP",
        }],
        "ipFamilyPolicy": "PreferDualStack",
    });
    if let Some(families) = families {
        let names: Vec<&str> = families
            .iter()
            .map(|f| match f {
                Family::V4 => "IPv4",
                Family::V6 => "IPv6",
            })
            .collect();
        spec["ipFamilyPolicy"] = json!(if names.len() == 2 {
            "RequireDualStack"
        } else {
            "SingleStack"
        });
        spec["ipFamilies"] = json!(names);
    }
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": service, "namespace": ns},
        "spec": spec,
    })
}

/// The ready pods of EndpointSlices (by `targetRef.name`, else by address) and their addresses
/// with the slice's first port.
fn ready_endpoints(slices: &[Value]) -> (BTreeSet<String>, Vec<SocketAddr>) {
    let mut pods = BTreeSet::new();
    let mut addrs = Vec::new();
    for slice in slices {
        let port = slice["ports"][0]["port"].as_u64().unwrap_or(0) as u16;
        for e in slice["endpoints"].as_array().into_iter().flatten() {
            if e["conditions"]["ready"] == false {
                continue;
            }
            for a in e["addresses"].as_array().into_iter().flatten() {
                let Some(ip) = a.as_str().and_then(|a| a.parse::<IpAddr>().ok()) else {
                    continue;
                };
                addrs.push(SocketAddr::new(ip, port));
                pods.insert(
                    e["targetRef"]["name"]
                        .as_str()
                        .map_or_else(|| ip.to_string(), str::to_owned),
                );
            }
        }
    }
    (pods, addrs)
}

/// Waits until duet's `/debug/routes` names every address.
async fn wait_routed(duet: &Duet, addrs: &[SocketAddr]) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let routes = duet.debug_routes().await.unwrap_or(Value::Null).to_string();
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

/// Creates the IngressClass and starts duet in Kubernetes mode against `kubeconfig`, publishing
/// its loopback listeners as status.
async fn start_duet(
    opts: &Options,
    kube: &KubeApi,
    kubeconfig: &std::path::Path,
    extra: &[&str],
) -> anyhow::Result<Duet> {
    kube.create(crate::manifests::ingress_class(
        &opts.ingress_class,
        &opts.controller_name,
    ))
    .await?;
    let publish = format!("{}/{}", PUBLISH_SERVICE.0, PUBLISH_SERVICE.1);
    let mut args = vec![
        "--publish-service",
        &publish,
        "--ingress-class",
        &opts.ingress_class,
        "--controller-name",
        &opts.controller_name,
        "--election-namespace",
        "default",
    ];
    args.extend_from_slice(extra);
    DuetBuilder::kube(&opts.duet, kubeconfig)
        .args(args)
        .die_with_parent()
        .start()
        .await
}

/// The publish Service as a dual-stack cluster shows it: `PreferDualStack` with a cluster IP of
/// each family (the API server allocates them from its ranges) and a load balancer address of
/// each family, written through the status subresource as a load balancer controller would. The
/// load balancer addresses are the loopbacks duet listens on, so that scenarios connect to what
/// the status says ([`Cluster::listener`]).
async fn create_publish_service(kube: &KubeApi) -> anyhow::Result<()> {
    kube.create(json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": PUBLISH_SERVICE.1, "namespace": PUBLISH_SERVICE.0},
        "spec": {
            "type": "LoadBalancer",
            "ipFamilyPolicy": "PreferDualStack",
            "ipFamilies": ["IPv4", "IPv6"],
            "selector": {"app.kubernetes.io/name": "duet"},
            "ports": [
                {"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"},
                {"name": "https", "port": 443, "targetPort": "https", "protocol": "TCP"},
            ],
        },
    }))
    .await?;
    kube.merge_patch(
        "v1",
        "Service",
        Some(PUBLISH_SERVICE.0),
        &format!("{}/status", PUBLISH_SERVICE.1),
        &json!({"status": {"loadBalancer": {"ingress": [
            {"ip": "127.0.0.1", "ipMode": "VIP"},
            {"ip": "::1", "ipMode": "VIP"},
        ]}}}),
    )
    .await?;
    Ok(())
}
