//! Shared helpers of the `kube_*` tests: the real `duet` binary in Kubernetes mode against the
//! real control plane (`conformance::cluster`: etcd, kube-apiserver and kube-controller-manager
//! with the stand-in kubelet, in a network namespace), through a fault-injecting proxy
//! (`conformance::cluster::FaultProxy`) reached on 127.0.0.1 or [::1].
//!
//! One cluster per stack serves every test of a test binary ([`conformance::cluster::shared`]);
//! each test keeps to Kubernetes namespaces of its own and runs its duet with
//! `--watch-namespace` and `--election-namespace` set to its first one, so tests running at the
//! same time do not see each other. A test runs on a current-thread runtime: its thread joins
//! the cluster's network namespace, and so does every duet and echo server it starts.
//!
//! Needs root (namespaces) and Go (the first run builds the control plane). Nothing is skipped:
//! a missing piece fails the test.

#![allow(dead_code)] // each test binary uses a subset

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use conformance::client;
use conformance::cluster::{netns, FaultProxy, SharedCluster, Stack};
use conformance::echo::{EchoOptions, EchoServer, Identity};
use conformance::manifests::CONTROLLER;
use conformance::manifests::{endpoint_slice, ingress_class, service as selectorless, Endpoint};
use conformance::runner::kube_api::KubeApi;
use conformance::{Duet, DuetBuilder, Family};
use serde_json::{json, Value};

pub const DUET: &str = env!("CARGO_BIN_EXE_duet");

/// How long a change may take to go live on a loaded 2-core machine (the target is far less).
pub const LIVE: Duration = Duration::from_secs(20);

/// A test's share of a cluster: an admin client, its namespace and its own fault proxy.
pub struct Env {
    pub cluster: &'static SharedCluster,
    /// The admin client, straight to the API server (never through the proxy).
    pub api: KubeApi,
    /// The test's first namespace: duet's watch and election namespace.
    pub ns: String,
    /// Between duet and the API server.
    pub proxy: FaultProxy,
}

/// Joins the shared cluster of `stack` (starting it for the first test of the binary), creates
/// the namespaces `namespaces` (the first is the test's own), our IngressClass `duet` and a
/// fault proxy.
pub async fn env(stack: Stack, namespaces: &[&str]) -> anyhow::Result<Env> {
    let cluster = conformance::cluster::shared(stack)?;
    cluster.enter()?;
    println!("control plane: {} ({stack:?})", cluster.control_plane());
    let api = cluster.api().await?;
    api.apply(ingress_class("duet", CONTROLLER)).await?;
    for ns in namespaces {
        api.apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}))
            .await?;
    }
    let proxy = FaultProxy::start(cluster.kubeconfig())?;
    Ok(Env {
        cluster,
        api,
        ns: namespaces[0].to_owned(),
        proxy,
    })
}

impl Env {
    /// Creates or updates every object.
    pub async fn apply(&self, objects: &[Value]) -> anyhow::Result<()> {
        for object in objects {
            self.api.apply(object.clone()).await?;
        }
        Ok(())
    }

    /// The kubeconfig of the proxy over `family`.
    pub fn kubeconfig(&self, family: Family) -> &Path {
        self.proxy.kubeconfig(family)
    }

    /// `duet serve` through the proxy over `api_family`, watching and electing in the test's
    /// namespace, with extra flags; waits for /readyz.
    pub async fn duet(&self, api_family: Family, args: &[&str]) -> anyhow::Result<Duet> {
        self.builder(api_family, args).start().await
    }

    /// The [`DuetBuilder`] of [`Env::duet`].
    pub fn builder(&self, api_family: Family, args: &[&str]) -> DuetBuilder {
        DuetBuilder::kube(DUET, self.kubeconfig(api_family))
            .args([
                "--watch-namespace",
                &self.ns,
                "--election-namespace",
                &self.ns,
            ])
            .args(args.iter().copied())
            .die_with_parent()
    }

    /// A Deployment of echo pods and a `PreferDualStack` Service `name` (port `http` 80 to the
    /// pods' 8080) in `ns`.
    pub async fn web(&self, ns: &str, name: &str, replicas: u32) -> anyhow::Result<()> {
        self.apply(&[deployment(ns, name, replicas), service(ns, name)])
            .await
    }

    /// Sets a Deployment's replicas.
    pub async fn scale(&self, ns: &str, name: &str, replicas: u32) -> anyhow::Result<()> {
        self.api
            .merge_patch(
                "apps/v1",
                "Deployment",
                Some(ns),
                name,
                &json!({"spec": {"replicas": replicas}}),
            )
            .await?;
        Ok(())
    }

    /// Waits until the Deployment `app` has exactly `count` running, ready pods; their names.
    pub async fn ready_pods(
        &self,
        ns: &str,
        app: &str,
        count: usize,
    ) -> anyhow::Result<BTreeSet<String>> {
        let deadline = std::time::Instant::now() + LIVE;
        loop {
            let pods = self
                .api
                .list("v1", "Pod", Some(ns), &format!("app={app}"))
                .await?;
            let names: BTreeSet<String> = pods
                .iter()
                .filter(|p| p["metadata"]["deletionTimestamp"].is_null() && is_ready(p))
                .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_owned))
                .collect();
            if names.len() == count && names.len() == pods.len() {
                return Ok(names);
            }
            anyhow::ensure!(
                std::time::Instant::now() < deadline,
                "not {count} ready pods of {ns}/{app} within {LIVE:?}: ready {names:?} of {}",
                pods.len()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The `events.k8s.io/v1` Events in `ns`.
    pub async fn events(&self, ns: &str) -> anyhow::Result<Vec<Value>> {
        self.api
            .list("events.k8s.io/v1", "Event", Some(ns), "")
            .await
    }

    /// `status.loadBalancer.ingress` of an Ingress, as `ip`/`hostname` strings.
    pub async fn status_addresses(&self, ns: &str, name: &str) -> anyhow::Result<Vec<String>> {
        let Some(ingress) = self
            .api
            .get("networking.k8s.io/v1", "Ingress", Some(ns), name)
            .await?
        else {
            return Ok(Vec::new());
        };
        Ok(ingress["status"]["loadBalancer"]["ingress"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|e| e["ip"].as_str().or_else(|| e["hostname"].as_str()))
            .map(str::to_owned)
            .collect())
    }

    /// Waits until an Ingress's status lists exactly `want`.
    pub async fn until_status_addresses(
        &self,
        ns: &str,
        name: &str,
        want: &[String],
    ) -> anyhow::Result<()> {
        client::eventually(
            &format!("status of Ingress {ns}/{name} is {want:?}"),
            LIVE,
            || async {
                let got = self.status_addresses(ns, name).await?;
                anyhow::ensure!(got == want, "status is {got:?}");
                Ok(())
            },
        )
        .await
    }
}

fn is_ready(pod: &Value) -> bool {
    pod["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Ready" && c["status"] == "True")
}

/// A Deployment of echo pods (port `http` 8080, `SERVICE_NAME` = `name`), label `app: name`.
pub fn deployment(ns: &str, name: &str, replicas: u32) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"namespace": ns, "name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "terminationGracePeriodSeconds": 0,
                    "containers": [{
                        "name": "echo", "image": "duet.dev/echo",
                        "ports": [{"name": "http", "containerPort": 8080}],
                        "env": [{"name": "SERVICE_NAME", "value": name}],
                    }],
                },
            },
        },
    })
}

/// A `PreferDualStack` Service selecting `app: name`, port `http` 80 to the pods' `http`.
pub fn service(ns: &str, name: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"namespace": ns, "name": name},
        "spec": {
            "ipFamilyPolicy": "PreferDualStack",
            "selector": {"app": name},
            "ports": [{"name": "http", "port": 80, "targetPort": "http"}],
        },
    })
}

/// A pod serving TLS with `cert` on addresses of the pod CIDRs the kubelet does not hand out
/// (`10.244.250.N`, `fd00:10:244::fa:N`), behind a selector-less Service `secure` (port
/// `appProtocol: app_protocol`, named `http`) with a hand-written EndpointSlice per family: the real API
/// server takes these addresses (it refuses loopback ones), and no test-only flag is needed.
pub async fn tls_pod(
    env: &Env,
    n: u8,
    app_protocol: &str,
    options: EchoOptions,
) -> anyhow::Result<EchoServer> {
    let v4: IpAddr = format!("10.244.250.{n}").parse()?;
    let v6: IpAddr = format!("fd00:10:244::fa:{n}").parse()?;
    netns::ip(&["addr", "add", &format!("{v4}/32"), "dev", "lo"])?;
    netns::ip(&[
        "-6",
        "addr",
        "add",
        &format!("{v6}/128"),
        "dev",
        "lo",
        "nodad",
    ])?;
    let identity = Identity {
        namespace: env.ns.clone(),
        ingress: String::new(),
        service: "secure".into(),
    };
    let addrs = vec![SocketAddr::new(v4, 8443), SocketAddr::new(v6, 8443)];
    let server = EchoServer::bind(identity, &[("tls-pod".into(), addrs)], options)?;
    let mut svc = selectorless(&env.ns, "secure", &[("http", 8443)]);
    svc["spec"]["ports"][0]["appProtocol"] = app_protocol.into();
    let endpoint = |ip: IpAddr| Endpoint {
        pod: "tls-pod".into(),
        uid: "uid-tls-pod".into(),
        ip,
        ready: true,
    };
    env.apply(&[
        svc,
        endpoint_slice(
            &env.ns,
            "secure",
            "secure-ipv4",
            Family::V4,
            "http",
            8443,
            &[endpoint(v4)],
        ),
        endpoint_slice(
            &env.ns,
            "secure",
            "secure-ipv6",
            Family::V6,
            "http",
            8443,
            &[endpoint(v6)],
        ),
    ])
    .await?;
    Ok(server)
}

/// The test-only flag for pods on 127.0.0.1 and ::1 (`Fleet` echo servers), which Kubernetes
/// mode refuses to proxy to without it.
pub const LOOPBACK_PODS: &str = "--allow-loopback-endpoints";

/// Waits until `host` answers `status` to clients of both families.
pub async fn until_status(duet: &Duet, host: &str, status: u16) -> anyhow::Result<()> {
    for family in Family::BOTH {
        client::eventually(
            &format!("{host} answers {status} to {family} clients"),
            LIVE,
            || async {
                let reply = client::get(duet.http(family), host, "/").await?;
                client::expect_status(&reply, status)
            },
        )
        .await?;
    }
    Ok(())
}

/// Fails unless `host` answers `status` to a client of each family now.
pub async fn expect_now(duet: &Duet, host: &str, status: u16) -> anyhow::Result<()> {
    for family in Family::BOTH {
        let reply = client::get(duet.http(family), host, "/").await?;
        client::expect_status(&reply, status)
            .with_context(|| format!("{host}, {family} client"))?;
    }
    Ok(())
}

/// The pods answering `host` over `requests` requests from each family.
pub async fn pods_serving(
    duet: &Duet,
    host: &str,
    requests: usize,
) -> anyhow::Result<BTreeSet<String>> {
    let mut pods = BTreeSet::new();
    for family in Family::BOTH {
        for _ in 0..requests {
            let reply = client::get(duet.http(family), host, "/").await?;
            client::expect_status(&reply, 200)?;
            pods.insert(reply.echo()?.pod);
        }
    }
    Ok(pods)
}

/// Waits until exactly `pods` answer `host`.
pub async fn until_pods(duet: &Duet, host: &str, pods: &BTreeSet<String>) -> anyhow::Result<()> {
    client::eventually(&format!("{host} served by {pods:?}"), LIVE, || async {
        let got = pods_serving(duet, host, 4 * pods.len()).await?;
        anyhow::ensure!(&got == pods, "served by {got:?}");
        Ok(())
    })
    .await
}

/// The "Snapshot applied" log lines of a duet.
pub fn snapshot_lines(duet: &Duet) -> Vec<String> {
    duet.logs()
        .lines()
        .filter(|l| l.contains("Snapshot applied"))
        .map(str::to_owned)
        .collect()
}

/// Strings from `&str`s.
pub fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}
