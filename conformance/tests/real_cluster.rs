//! The real control plane (`conformance::cluster`): kube-apiserver, etcd and
//! kube-controller-manager v1.37 built from their Go modules, in a network namespace, with the
//! stand-in kubelet. A Deployment and a Service created through the API become Pods (the real
//! deployment and replicaset controllers), which the kubelet runs on pod addresses of the
//! cluster's families, and EndpointSlices (the real endpointslice controller) per family; every
//! pod answers HTTP on every address. Dual-stack, IPv4-only and IPv6-only clusters.
//!
//! Needs root (namespaces), Go (the first run builds the control plane: see
//! `conformance/cluster/build.sh`), iproute2 and util-linux. Nothing is skipped: a missing piece
//! fails the test.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};
use conformance::cluster::{Cluster, Options, Stack, POD_SHAPE_ANNOTATION};
use conformance::runner::kube_api::KubeApi;
use conformance::Family;
use serde_json::{json, Value};

/// Clusters start one at a time: three API servers starting at once on two cores only slow
/// each other down.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const NS: &str = "demo";
const WAIT: Duration = Duration::from_secs(60);

fn deployment(name: &str, replicas: u32, shape: Option<&str>) -> Value {
    let mut annotations = json!({});
    if let Some(shape) = shape {
        annotations[POD_SHAPE_ANNOTATION] = json!(shape);
    }
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"namespace": NS, "name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}, "annotations": annotations},
                "spec": {"containers": [{
                    "name": "echo", "image": "duet.dev/echo",
                    "ports": [{"name": "http", "containerPort": 8080}],
                    "env": [{"name": "SERVICE_NAME", "value": name}],
                }]},
            },
        },
    })
}

fn service(name: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"namespace": NS, "name": name},
        "spec": {
            "ipFamilyPolicy": "PreferDualStack",
            "selector": {"app": name},
            "ports": [{"name": "http", "port": 80, "targetPort": "http"}],
        },
    })
}

fn family_of(ip: &str) -> anyhow::Result<Family> {
    let ip: IpAddr = ip.parse().with_context(|| format!("{ip:?} is not an IP"))?;
    Ok(if ip.is_ipv4() { Family::V4 } else { Family::V6 })
}

/// Polls `f` every 200 ms until it returns `Some`, failing after [`WAIT`] with what it last saw.
async fn wait_for<T, F, Fut>(what: &str, mut f: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<Result<T, String>>>,
{
    let deadline = Instant::now() + WAIT;
    loop {
        match f().await? {
            Ok(v) => return Ok(v),
            Err(seen) if Instant::now() > deadline => {
                bail!("{what}: not within {WAIT:?}; last seen: {seen}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// The app's pods once `n` of them run and are Ready with one address per wanted family.
async fn running_pods(
    api: &KubeApi,
    app: &str,
    n: usize,
    families: &[Family],
) -> anyhow::Result<Vec<Value>> {
    wait_for(&format!("{n} running pods of {app}"), || async {
        let pods = api
            .list("v1", "Pod", Some(NS), &format!("app={app}"))
            .await?;
        let ok = |p: &Value| -> anyhow::Result<bool> {
            let ready = p["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Ready" && c["status"] == "True");
            let mut got = Vec::new();
            for ip in p["status"]["podIPs"].as_array().into_iter().flatten() {
                got.push(family_of(ip["ip"].as_str().unwrap_or_default())?);
            }
            Ok(ready
                && p["status"]["phase"] == "Running"
                && p["metadata"]["deletionTimestamp"].is_null()
                && got == families)
        };
        let mut all = true;
        for p in &pods {
            all &= ok(p)?;
        }
        if pods.len() == n && all {
            Ok(Ok(pods))
        } else {
            Ok(Err(format!(
                "{:?}",
                pods.iter()
                    .map(|p| (
                        &p["metadata"]["name"],
                        &p["status"]["phase"],
                        &p["status"]["podIPs"]
                    ))
                    .collect::<Vec<_>>()
            )))
        }
    })
    .await
}

/// The ready endpoint addresses of the Service's slices, by address type.
async fn slice_addresses(api: &KubeApi, service: &str) -> anyhow::Result<Vec<(String, String)>> {
    let slices = api
        .list(
            "discovery.k8s.io/v1",
            "EndpointSlice",
            Some(NS),
            &format!("kubernetes.io/service-name={service}"),
        )
        .await?;
    let mut out = Vec::new();
    for slice in &slices {
        ensure!(
            slice["metadata"]["labels"]["endpointslice.kubernetes.io/managed-by"]
                == "endpointslice-controller.k8s.io",
            "a slice not written by the real endpointslice controller: {slice}"
        );
        let endpoints = slice["endpoints"].as_array().map_or(0, Vec::len);
        // A family without endpoints keeps an empty slice, without ports.
        ensure!(
            endpoints == 0
                || (slice["ports"][0]["port"] == 8080 && slice["ports"][0]["name"] == "http"),
            "slice ports: {}",
            slice["ports"]
        );
        let kind = slice["addressType"].as_str().unwrap_or_default();
        for ep in slice["endpoints"].as_array().into_iter().flatten() {
            if ep["conditions"]["ready"] == true {
                for addr in ep["addresses"].as_array().into_iter().flatten() {
                    out.push((
                        kind.to_owned(),
                        addr.as_str().unwrap_or_default().to_owned(),
                    ));
                }
            }
        }
    }
    out.sort();
    Ok(out)
}

/// `(addressType, ip)` of every address of `pods`, sorted.
fn pod_addresses(pods: &[Value]) -> anyhow::Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    for p in pods {
        for ip in p["status"]["podIPs"].as_array().into_iter().flatten() {
            let ip = ip["ip"].as_str().unwrap_or_default();
            let kind = match family_of(ip)? {
                Family::V4 => "IPv4",
                Family::V6 => "IPv6",
            };
            out.push((kind.to_owned(), ip.to_owned()));
        }
    }
    out.sort();
    Ok(out)
}

/// Every pod answers on each of its addresses as itself, over that address's family.
async fn every_pod_answers(pods: &[Value], service: &str) -> anyhow::Result<()> {
    for p in pods {
        let name = p["metadata"]["name"].as_str().unwrap_or_default();
        for ip in p["status"]["podIPs"].as_array().into_iter().flatten() {
            let ip: IpAddr = ip["ip"].as_str().unwrap_or_default().parse()?;
            let to = SocketAddr::new(ip, 8080);
            let reply = conformance::client::get(to, "echo.test", "/hello").await?;
            let echo = reply.echo().with_context(|| format!("from {to}"))?;
            ensure!(
                echo.pod == name,
                "{to} answered as {} instead of {name}",
                echo.pod
            );
            ensure!(
                echo.family == Family::of(&to),
                "{to} answered over {}",
                echo.family
            );
            ensure!(echo.local == to, "{to} answered on {}", echo.local);
            ensure!(echo.service == service && echo.namespace == NS, "{echo:?}");
        }
    }
    Ok(())
}

async fn start(stack: Stack) -> anyhow::Result<(Cluster, KubeApi)> {
    let cluster = Cluster::start(Options {
        stack,
        ..Options::default()
    })
    .await?;
    println!("control plane: {}", cluster.control_plane());
    ensure!(
        cluster.control_plane().starts_with("kube-apiserver v1.37.")
            && cluster
                .control_plane()
                .contains("kube-controller-manager v1.37."),
        "unexpected versions: {}",
        cluster.control_plane()
    );
    let api = cluster.api().await?;
    api.create(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}))
        .await?;
    Ok((cluster, api))
}

/// A Deployment of 2 and its Service: Pods from the real controllers, run by the kubelet on
/// addresses of the cluster's families, listed by per-family EndpointSlices, all answering; then
/// scaled to 1: the removed pod stops answering and leaves the slices.
async fn deployment_is_served(stack: Stack) -> anyhow::Result<()> {
    let _one = ONE_AT_A_TIME.lock().await;
    let (mut cluster, api) = start(stack).await?;
    let families = stack.families();
    api.create(deployment("echo", 2, None)).await?;
    let svc = api.create(service("echo")).await?;
    let cluster_ips: Vec<Family> = svc["spec"]["clusterIPs"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|ip| family_of(ip.as_str().unwrap_or_default()))
        .collect::<anyhow::Result<_>>()?;
    ensure!(
        cluster_ips == families,
        "clusterIPs {}",
        svc["spec"]["clusterIPs"]
    );

    let pods = running_pods(&api, "echo", 2, families).await?;
    for p in &pods {
        ensure!(
            p["metadata"]["ownerReferences"][0]["kind"] == "ReplicaSet",
            "pod not made by the replicaset controller: {}",
            p["metadata"]
        );
    }
    let want = pod_addresses(&pods)?;
    ensure!(want.len() == 2 * families.len(), "pod addresses {want:?}");
    wait_for("EndpointSlices listing every pod address", || async {
        let got = slice_addresses(&api, "echo").await?;
        Ok(if got == want {
            Ok(())
        } else {
            Err(format!("{got:?}, want {want:?}"))
        })
    })
    .await?;
    every_pod_answers(&pods, "echo").await?;

    api.merge_patch(
        "apps/v1",
        "Deployment",
        Some(NS),
        "echo",
        &json!({"spec": {"replicas": 1}}),
    )
    .await?;
    let left = running_pods(&api, "echo", 1, families).await?;
    let want = pod_addresses(&left)?;
    wait_for("EndpointSlices without the removed pod", || async {
        let got = slice_addresses(&api, "echo").await?;
        Ok(if got == want {
            Ok(())
        } else {
            Err(format!("{got:?}, want {want:?}"))
        })
    })
    .await?;
    let gone = pods
        .iter()
        .find(|p| p["metadata"]["name"] != left[0]["metadata"]["name"])
        .context("no removed pod")?;
    for ip in gone["status"]["podIPs"].as_array().into_iter().flatten() {
        let to = SocketAddr::new(ip["ip"].as_str().unwrap_or_default().parse()?, 8080);
        let refused = wait_for(
            &format!("{to} of the removed pod to stop answering"),
            || async {
                Ok(match conformance::client::get(to, "echo.test", "/").await {
                    Err(e) => Ok(e),
                    Ok(r) => Err(format!("still answers {}", r.status)),
                })
            },
        )
        .await?;
        println!("removed pod at {to}: {refused:#}");
    }
    every_pod_answers(&left, "echo").await?;
    cluster.check_running()
}

#[tokio::test]
async fn dual_stack_deployment_is_served_on_both_families() {
    deployment_is_served(Stack::Dual).await.unwrap();
}

#[tokio::test]
async fn ipv4_cluster_deployment_is_served_on_ipv4() {
    deployment_is_served(Stack::Ipv4).await.unwrap();
}

#[tokio::test]
async fn ipv6_cluster_deployment_is_served_on_ipv6() {
    deployment_is_served(Stack::Ipv6).await.unwrap();
}

/// The pod-shape annotation: on a dual-stack cluster an IPv6-only pod gets one IPv6 address and
/// appears only in the IPv6 slice. A pod with a bad annotation is refused with a reason, not run.
#[tokio::test]
async fn pod_shape_annotation_gives_a_pod_one_family() {
    async fn run() -> anyhow::Result<()> {
        let _one = ONE_AT_A_TIME.lock().await;
        let (_cluster, api) = start(Stack::Dual).await?;
        let shape = r#"{"ipv4": "absent", "ipv6": "listen"}"#;
        api.create(deployment("six", 1, Some(shape))).await?;
        api.create(service("six")).await?;
        let pods = running_pods(&api, "six", 1, &[Family::V6]).await?;
        let want = pod_addresses(&pods)?;
        wait_for("an IPv6 slice only", || async {
            let got = slice_addresses(&api, "six").await?;
            Ok(if got == want {
                Ok(())
            } else {
                Err(format!("{got:?}, want {want:?}"))
            })
        })
        .await?;
        every_pod_answers(&pods, "six").await?;

        api.create(deployment("bad", 1, Some(r#"{"ipv4": "sideways"}"#)))
            .await?;
        let refused = wait_for("the bad pod refused", || async {
            let pods = api.list("v1", "Pod", Some(NS), "app=bad").await?;
            let ready = pods.first().and_then(|p| {
                p["status"]["conditions"]
                    .as_array()?
                    .iter()
                    .find(|c| c["type"] == "Ready")
                    .cloned()
            });
            Ok(match ready {
                Some(c) if c["reason"] == "DuetKubeletRefused" => Ok(c),
                other => Err(format!("{other:?}")),
            })
        })
        .await?;
        ensure!(refused["status"] == "False", "{refused}");
        let message = refused["message"].as_str().unwrap_or_default();
        ensure!(message.contains("sideways"), "{message}");
        Ok(())
    }
    run().await.unwrap();
}

/// The `duet` binary beside the test's own binaries (`cargo test --workspace` builds it).
fn duet_bin() -> std::path::PathBuf {
    let exe = std::path::PathBuf::from(env!("CARGO_BIN_EXE_duet-cluster"));
    let duet = exe.with_file_name("duet");
    assert!(
        duet.exists(),
        "{} is missing: build it with `cargo build -p controller --bin duet`",
        duet.display()
    );
    duet
}

/// Waits until duet answers `host` over `family` with a pod of `service`, reached over that
/// family.
async fn served(
    duet: &conformance::Duet,
    family: Family,
    host: &str,
    service: &str,
) -> anyhow::Result<()> {
    wait_for(&format!("{host} served over {family}"), || async {
        Ok(
            match conformance::client::get(duet.http(family), host, "/").await {
                Ok(reply) if reply.status == 200 => {
                    let echo = reply.echo()?;
                    ensure!(echo.service == service, "{echo:?}");
                    ensure!(
                        echo.family == family,
                        "pod reached over {}: {echo:?}",
                        echo.family
                    );
                    Ok(())
                }
                Ok(reply) => Err(format!("status {}", reply.status)),
                Err(e) => Err(format!("{e:#}")),
            },
        )
    })
    .await
}

/// duet in Kubernetes mode against the real API server keeps serving while kube-apiserver is
/// killed, and after it is back it picks up an Ingress created since (its watches resumed).
#[tokio::test]
async fn duet_keeps_serving_across_an_api_server_restart() {
    async fn run() -> anyhow::Result<()> {
        let _one = ONE_AT_A_TIME.lock().await;
        let (mut cluster, api) = start(Stack::Dual).await?;
        api.create(conformance::manifests::ingress_class(
            "duet",
            conformance::manifests::CONTROLLER,
        ))
        .await?;
        for app in ["one", "two"] {
            api.create(deployment(app, 1, None)).await?;
            api.create(service(app)).await?;
        }
        let ingress = |name: &str| {
            conformance::Ingress::new(NS, name)
                .class(Some("duet"))
                .host(&format!("{name}.test"), name)
                .build()
        };
        api.create(ingress("one")).await?;
        let duet = conformance::DuetBuilder::kube(duet_bin(), cluster.kubeconfig())
            .args(["--ingress-class", "duet", "--election-namespace", "default"])
            .die_with_parent()
            .start()
            .await?;
        for family in Family::BOTH {
            served(&duet, family, "one.test", "one").await?;
        }
        // Down for 3 s: duet serves from what it has.
        let restart = cluster.restart_apiserver(Duration::from_secs(3));
        let during = async {
            tokio::time::sleep(Duration::from_millis(500)).await;
            for family in Family::BOTH {
                let reply = conformance::client::get(duet.http(family), "one.test", "/").await?;
                conformance::client::expect_status(&reply, 200)?;
            }
            anyhow::Ok(())
        };
        let (restarted, served_during) = tokio::join!(restart, during);
        restarted?;
        served_during.context("while kube-apiserver was down")?;
        api.create(ingress("two")).await?;
        for family in Family::BOTH {
            served(&duet, family, "two.test", "two").await?;
        }
        cluster.check_running()
    }
    run().await.unwrap();
}
