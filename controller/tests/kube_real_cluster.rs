//! Kubernetes mode on the real control plane (`conformance::cluster`: kube-apiserver, etcd and
//! kube-controller-manager v1.37 with the stand-in kubelet, in a network namespace): the Ingress
//! status lists the addresses the real API server allocated to a dual-stack publish Service
//! (then its load balancer addresses, then the one family left after a downgrade to
//! SingleStack), and each rule of the IngressClass contract, with the API server reached over
//! IPv4 and over IPv6 and every route served to clients of both families.
//!
//! Needs root (namespaces) and Go (the first run builds the control plane), as
//! `conformance/tests/real_cluster.rs`. Nothing is skipped: a missing piece fails the test.
//! Each test runs on one thread: that thread joins the cluster's namespace, and so does the
//! `duet` it starts.

mod kube_support;

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use anyhow::Context;
use conformance::client;
use conformance::cluster::{Cluster, Options};
use conformance::manifests::{ingress_class, CONTROLLER};
use conformance::runner::kube_api::KubeApi;
use conformance::{Duet, DuetBuilder, Family, Ingress};
use kube_support::{until_status, DUET, LIVE};
use serde_json::{json, Value};

/// Clusters start one at a time: two API servers starting at once on two cores only slow each
/// other down.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The namespace of the backends and Ingresses.
const NS: &str = "kube";

/// A dual-stack cluster with our IngressClass `duet` and a Deployment `web` of one pod behind a
/// `PreferDualStack` Service, ready; the client reaches the API server over `api_family` (a
/// kubeconfig of its own for IPv6: the serving certificate names both loopbacks).
async fn start(api_family: Family) -> anyhow::Result<(Cluster, KubeApi, PathBuf)> {
    start_with(api_family, &[]).await
}

/// [`start`] with flags added to kube-apiserver's.
async fn start_with(
    api_family: Family,
    apiserver_flags: &[&str],
) -> anyhow::Result<(Cluster, KubeApi, PathBuf)> {
    let cluster = Cluster::start(Options {
        apiserver_flags: apiserver_flags.iter().map(|f| (*f).to_owned()).collect(),
        ..Options::default()
    })
    .await?;
    println!("control plane: {}", cluster.control_plane());
    let kubeconfig = kubeconfig_over(&cluster, api_family)?;
    let api = KubeApi::from_kubeconfig(&kubeconfig).await?;
    for ns in [NS, "duet"] {
        api.create(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}))
            .await?;
    }
    api.create(ingress_class("duet", CONTROLLER)).await?;
    api.create(deployment("web")).await?;
    api.create(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"namespace": NS, "name": "web"},
        "spec": {
            "ipFamilyPolicy": "PreferDualStack",
            "selector": {"app": "web"},
            "ports": [{"name": "http", "port": 80, "targetPort": "http"}],
        },
    }))
    .await?;
    Ok((cluster, api, kubeconfig))
}

/// The cluster's kubeconfig, pointing at `[::1]:6443` for IPv6.
fn kubeconfig_over(cluster: &Cluster, family: Family) -> anyhow::Result<PathBuf> {
    if family == Family::V4 {
        return Ok(cluster.kubeconfig().to_owned());
    }
    let text = std::fs::read_to_string(cluster.kubeconfig())?;
    anyhow::ensure!(text.contains("https://127.0.0.1:6443"), "{text}");
    let path = cluster.dir().join("kubeconfig-ipv6");
    std::fs::write(
        &path,
        text.replace("https://127.0.0.1:6443", "https://[::1]:6443"),
    )?;
    Ok(path)
}

fn deployment(name: &str) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"namespace": NS, "name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{
                    "name": "echo", "image": "duet.dev/echo",
                    "ports": [{"name": "http", "containerPort": 8080}],
                    "env": [{"name": "SERVICE_NAME", "value": name}],
                }]},
            },
        },
    })
}

/// `duet serve --kubeconfig` with a parent-death signal; waits for /readyz.
async fn duet(kubeconfig: &Path, args: &[&str]) -> anyhow::Result<Duet> {
    DuetBuilder::kube(DUET, kubeconfig)
        .args(args.iter().copied())
        .die_with_parent()
        .start()
        .await
}

/// `status.loadBalancer.ingress` of an Ingress, as `ip`/`hostname` strings.
async fn status_addresses(api: &KubeApi, name: &str) -> anyhow::Result<Vec<String>> {
    let Some(ingress) = api
        .get("networking.k8s.io/v1", "Ingress", Some(NS), name)
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
async fn until_status_addresses(api: &KubeApi, name: &str, want: &[String]) -> anyhow::Result<()> {
    client::eventually(
        &format!("status of Ingress {NS}/{name} is {want:?}"),
        LIVE,
        || async {
            let got = status_addresses(api, name).await?;
            anyhow::ensure!(got == want, "status is {got:?}");
            Ok(())
        },
    )
    .await
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

/// The publish Service `duet/edge` as the real API server allocated it: its clusterIPs.
async fn create_publish_service(api: &KubeApi, families: &[&str]) -> anyhow::Result<Vec<String>> {
    let svc = api
        .create(json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"namespace": "duet", "name": "edge"},
            "spec": {
                "ipFamilyPolicy": "PreferDualStack",
                "ipFamilies": families,
                "selector": {"app.kubernetes.io/name": "duet"},
                "ports": [{"name": "http", "port": 80, "targetPort": 8080}],
            },
        }))
        .await?;
    let ips: Vec<String> = svc["spec"]["clusterIPs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|ip| ip.as_str().map(str::to_owned))
        .collect();
    let got: Vec<Family> = ips
        .iter()
        .map(|ip| {
            Ok(Family::of(&std::net::SocketAddr::new(
                ip.parse::<IpAddr>()?,
                0,
            )))
        })
        .collect::<anyhow::Result<_>>()?;
    let want: Vec<Family> = families
        .iter()
        .map(|f| if *f == "IPv4" { Family::V4 } else { Family::V6 })
        .collect();
    anyhow::ensure!(got == want, "clusterIPs {ips:?}");
    Ok(ips)
}

async fn status_from_a_real_service(api_family: Family, families: &[&str]) -> anyhow::Result<()> {
    let _one = ONE_AT_A_TIME.lock().await;
    let (mut cluster, api, kubeconfig) = start(api_family).await?;
    let cluster_ips = create_publish_service(&api, families).await?;
    api.create(Ingress::new(NS, "web").host("a.test", "web").build())
        .await?;
    let duet = duet(
        &kubeconfig,
        &[
            "--publish-service",
            "duet/edge",
            "--election-namespace",
            "duet",
        ],
    )
    .await?;
    until_status(&duet, "a.test", 200).await?;
    // A ClusterIP Service: the cluster IPs the API server allocated, both families, in order.
    until_status_addresses(&api, "web", &cluster_ips).await?;
    let routes = duet.debug_routes().await?;
    anyhow::ensure!(routes["status"]["leading"] == json!(true), "{routes}");
    anyhow::ensure!(routes["status"].get("warning").is_none(), "{routes}");

    // Downgraded to SingleStack: the API server drops the secondary cluster IP; status follows
    // and /debug/routes warns.
    api.merge_patch(
        "v1",
        "Service",
        Some("duet"),
        "edge",
        &json!({"spec": {"ipFamilyPolicy": "SingleStack", "ipFamilies": [families[0]]}}),
    )
    .await?;
    until_status_addresses(&api, "web", &cluster_ips[..1]).await?;
    client::eventually("the single-family warning", LIVE, || async {
        let routes = duet.debug_routes().await?;
        let warning = routes["status"]["warning"].as_str().unwrap_or_default();
        anyhow::ensure!(warning.contains("single IP family"), "{routes}");
        Ok(())
    })
    .await?;
    anyhow::ensure!(duet.logs().contains("Publish Service problem"));

    // A LoadBalancer whose status (written here in place of a load balancer controller) has an
    // address of each family and a host name: every entry, in order.
    api.merge_patch(
        "v1",
        "Service",
        Some("duet"),
        "edge",
        &json!({"spec": {"type": "LoadBalancer"}}),
    )
    .await?;
    let lb = strings(&["2001:db8::10", "192.0.2.10", "lb.example.com"]);
    api.merge_patch(
        "v1",
        "Service",
        Some("duet"),
        "edge/status",
        &json!({"status": {"loadBalancer": {"ingress": [
            {"ip": lb[0], "ipMode": "VIP"}, {"ip": lb[1], "ipMode": "VIP"},
            {"hostname": lb[2]},
        ]}}}),
    )
    .await?;
    until_status_addresses(&api, "web", &lb).await?;
    until_status(&duet, "a.test", 200).await?;
    cluster.check_running()
}

#[tokio::test]
async fn status_lists_the_allocated_addresses_api_on_ipv4() {
    status_from_a_real_service(Family::V4, &["IPv4", "IPv6"])
        .await
        .unwrap();
}

#[tokio::test]
async fn status_lists_the_allocated_addresses_api_on_ipv6_service_ipv6_first() {
    status_from_a_real_service(Family::V6, &["IPv6", "IPv4"])
        .await
        .unwrap();
}

fn default_class(name: &str, controller: &str, default: bool) -> Value {
    let mut class = ingress_class(name, controller);
    class["metadata"]["annotations"] =
        json!({"ingressclass.kubernetes.io/is-default-class": default.to_string()});
    class
}

/// Sets whether IngressClass `name` is the cluster default.
async fn make_default(api: &KubeApi, name: &str, default: bool) -> anyhow::Result<()> {
    let patch = json!({"metadata": {"annotations":
        {"ingressclass.kubernetes.io/is-default-class": default.to_string()}}});
    api.merge_patch("networking.k8s.io/v1", "IngressClass", None, name, &patch)
        .await?;
    Ok(())
}

async fn class_rules(api_family: Family) -> anyhow::Result<()> {
    let _one = ONE_AT_A_TIME.lock().await;
    let (mut cluster, api, kubeconfig) = start(api_family).await?;
    api.create(default_class("nginx", "k8s.io/ingress-nginx", false))
        .await?;
    let legacy = "kubernetes.io/ingress.class";
    for ingress in [
        // spec.ingressClassName naming an IngressClass with our controller: ours.
        Ingress::new(NS, "by-class").host("by-class.test", "web"),
        // ... naming someone else's IngressClass: not ours.
        Ingress::new(NS, "foreign")
            .class(Some("nginx"))
            .host("foreign.test", "web"),
        // ... naming a class that has no IngressClass (even our --ingress-class): not ours.
        Ingress::new(NS, "no-object")
            .class(Some("edge"))
            .host("no-object.test", "web"),
        // The legacy annotation naming our --ingress-class: ours; naming another: not.
        Ingress::new(NS, "legacy")
            .class(None)
            .annotation(legacy, "edge")
            .host("legacy.test", "web"),
        Ingress::new(NS, "legacy-foreign")
            .class(None)
            .annotation(legacy, "nginx")
            .host("legacy-foreign.test", "web"),
        // No class at all: ours only once our IngressClass is the default.
        Ingress::new(NS, "classless")
            .class(None)
            .host("classless.test", "web"),
    ] {
        api.create(ingress.build()).await?;
    }
    let addresses = ["192.0.2.1", "2001:db8::1"];
    let duet = duet(
        &kubeconfig,
        &[
            "--ingress-class",
            "edge",
            "--election-namespace",
            "duet",
            "--publish-status-address",
            &addresses.join(","),
        ],
    )
    .await?;
    until_status(&duet, "by-class.test", 200).await?;
    until_status(&duet, "legacy.test", 200).await?;
    for host in [
        "foreign.test",
        "no-object.test",
        "legacy-foreign.test",
        "classless.test",
    ] {
        until_status(&duet, host, 404).await?;
    }
    until_status_addresses(&api, "by-class", &strings(&addresses)).await?;
    for name in ["foreign", "no-object", "legacy-foreign", "classless"] {
        let got = status_addresses(&api, name).await?;
        anyhow::ensure!(got.is_empty(), "{name} got status {got:?}");
    }

    // Our IngressClass becomes the cluster default: the classless Ingress is ours now.
    make_default(&api, "duet", true).await?;
    until_status(&duet, "classless.test", 200).await?;
    until_status_addresses(&api, "classless", &strings(&addresses)).await?;
    // Someone else's default class does not make it ours.
    make_default(&api, "duet", false).await?;
    make_default(&api, "nginx", true).await?;
    until_status(&duet, "classless.test", 404).await?;

    // An Ingress that stops being ours: routes gone, status cleared.
    api.merge_patch(
        "networking.k8s.io/v1",
        "Ingress",
        Some(NS),
        "by-class",
        &json!({"spec": {"ingressClassName": "nginx"}}),
    )
    .await?;
    until_status(&duet, "by-class.test", 404).await?;
    until_status_addresses(&api, "by-class", &[]).await?;
    until_status_addresses(&api, "classless", &[]).await?;
    // An IngressClass that is created later takes effect too.
    api.create(ingress_class("edge", CONTROLLER)).await?;
    until_status(&duet, "no-object.test", 200).await?;
    drop(duet);

    // --watch-ingress-without-class serves classless Ingresses, even while another
    // controller's class is the default.
    let all = self::duet(
        &kubeconfig,
        &[
            "--watch-ingress-without-class",
            "--election-namespace",
            "duet",
        ],
    )
    .await?;
    until_status(&all, "classless.test", 200).await?;
    until_status(&all, "foreign.test", 404).await?;
    cluster.check_running().context("the control plane")
}

#[tokio::test]
async fn class_rules_each_case_api_on_ipv4() {
    class_rules(Family::V4).await.unwrap();
}

#[tokio::test]
async fn class_rules_each_case_api_on_ipv6() {
    class_rules(Family::V6).await.unwrap();
}

/// Sends a signal to a process (`STOP`, `CONT`).
fn signal(pid: u32, name: &str) -> anyhow::Result<()> {
    let status = std::process::Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .status()?;
    anyhow::ensure!(status.success(), "kill -{name} {pid} failed");
    Ok(())
}

/// Waits until etcd has compacted away `resource_version`: a list at exactly that version is
/// answered `410 Gone` (with the watch cache off, reads at a version go to etcd).
async fn until_compacted(api: &KubeApi, resource_version: &str) -> anyhow::Result<()> {
    let path = format!(
        "/apis/networking.k8s.io/v1/namespaces/{NS}/ingresses?resourceVersion={resource_version}&resourceVersionMatch=Exact"
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        match api.get_path(&path).await {
            Err(kube::Error::Api(e)) if e.code == 410 => {
                println!(
                    "resourceVersion {resource_version} compacted: {}",
                    e.message
                );
                return Ok(());
            }
            Ok(_) => {}
            Err(e) => return Err(e).context("listing at an exact resourceVersion"),
        }
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "resourceVersion {resource_version} not compacted within 60 s"
        );
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
}

/// A real `410 Gone`: kube-apiserver without its watch cache, compacting etcd every second.
/// duet is frozen (SIGSTOP) while kube-apiserver restarts (its watches end) and an Ingress is
/// deleted and another created; once etcd has compacted past duet's last resourceVersion duet
/// resumes, its watches restart from that version and get `410 Gone`, and the relist converges:
/// the deleted Ingress (whose delete event it never saw) stops being served, the new one is
/// served, the untouched one still is, to clients of both families.
async fn relist_after_a_real_410(api_family: Family) -> anyhow::Result<()> {
    let _one = ONE_AT_A_TIME.lock().await;
    let (mut cluster, api, kubeconfig) = start_with(
        api_family,
        &["--watch-cache=false", "--etcd-compaction-interval=1s"],
    )
    .await?;
    for name in ["keep", "gone"] {
        api.create(
            Ingress::new(NS, name)
                .host(&format!("{name}.test"), "web")
                .build(),
        )
        .await?;
    }
    let duet = duet(&kubeconfig, &["--election-namespace", "duet"]).await?;
    until_status(&duet, "keep.test", 200).await?;
    until_status(&duet, "gone.test", 200).await?;
    let seen = api
        .get_path(&format!(
            "/apis/networking.k8s.io/v1/namespaces/{NS}/ingresses"
        ))
        .await?;
    let seen = seen["metadata"]["resourceVersion"]
        .as_str()
        .context("a list without resourceVersion")?
        .to_owned();

    signal(duet.pid(), "STOP")?;
    let changed = async {
        cluster
            .restart_apiserver(std::time::Duration::from_millis(200))
            .await?;
        api.delete("networking.k8s.io/v1", "Ingress", Some(NS), "gone")
            .await?;
        api.create(Ingress::new(NS, "new").host("new.test", "web").build())
            .await?;
        until_compacted(&api, &seen).await
    }
    .await;
    signal(duet.pid(), "CONT")?;
    changed?;

    until_status(&duet, "gone.test", 404).await?;
    until_status(&duet, "new.test", 200).await?;
    until_status(&duet, "keep.test", 200).await?;
    let logs = duet.logs();
    let gone = logs
        .lines()
        .find(|l| {
            l.contains("Watch failed")
                && l.contains("kind=Ingress ")
                && l.contains("resourceVersion for the provided watch is too old")
        })
        .with_context(|| format!("no 410 Gone for the Ingress watch in duet's log:\n{logs}"))?;
    println!("{gone}");
    cluster.check_running()
}

#[tokio::test]
async fn relist_after_a_real_410_gone_api_on_ipv4() {
    relist_after_a_real_410(Family::V4).await.unwrap();
}

#[tokio::test]
async fn relist_after_a_real_410_gone_api_on_ipv6() {
    relist_after_a_real_410(Family::V6).await.unwrap();
}
