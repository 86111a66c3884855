//! The real node (`conformance::cluster::node`): kubelet, containerd, runc, the CNI plugins and
//! kube-proxy v1.37 built from their Go modules. A Deployment of the echo image (built by
//! `images/build.sh echo`, imported into containerd without a registry) becomes containers with an
//! address of each family of the cluster; a Service's ClusterIPs of each family reach them through
//! kube-proxy's nftables rules, and every answer comes from a pod over the client's family; a
//! LoadBalancer Service's addresses of each family reach them from the namespace outside the node.
//! Dual-stack (IPv4 or IPv6 primary), IPv4-only and IPv6-only clusters. With MetalLB
//! (`LoadBalancerKind::MetalLb`) instead of the stand-in load balancer, a LoadBalancer Service
//! gets an address per family from MetalLB's pool in the uplink subnets, announced by ARP/NDP on
//! the node's eth0 only, and the outside namespace reaches the pods through each.
//!
//! Needs root (namespaces, cgroups, mounts), Go and gcc (the first run builds the node: see
//! `conformance/node/build.sh`), libseccomp, nftables, iproute2 and util-linux. Nothing is
//! skipped: a missing piece fails the test.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};
use conformance::client::Conn;
use conformance::cluster::{metallb, node, Cluster, LoadBalancerKind, Options, Stack};
use conformance::runner::kube_api::KubeApi;
use conformance::Family;
use serde_json::{json, Value};
use tokio::net::TcpStream;

/// One node at a time: two would share the machine's cgroups and two cores.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const NS: &str = "demo";
const ECHO_IMAGE: &str = "duet.local/duet-echo:test";
const WAIT: Duration = Duration::from_secs(90);

async fn start(
    stack: Stack,
    load_balancer: LoadBalancerKind,
) -> anyhow::Result<(Cluster, KubeApi)> {
    let cluster = Cluster::start(Options {
        stack,
        real_node: true,
        load_balancer,
        ..Options::default()
    })
    .await?;
    let node = cluster.node().context("no real node")?;
    println!("node: {}", node.versions());
    ensure!(
        node.versions().starts_with("kubelet v1.37.")
            && node.versions().contains("containerd v2.")
            && node.versions().ends_with("kube-proxy nftables"),
        "unexpected node: {}",
        node.versions()
    );
    let image = cluster.dir().join("echo.tar");
    let echo = env!("CARGO_BIN_EXE_duet-echo");
    node::build_image("echo", echo.as_ref(), &[ECHO_IMAGE], &image)?;
    cluster.import_image(&image)?;
    let api = cluster.api().await?;
    api.create(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}))
        .await?;
    Ok((cluster, api))
}

fn deployment(name: &str, replicas: u32) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"namespace": NS, "name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{
                    "name": "echo", "image": ECHO_IMAGE, "imagePullPolicy": "Never",
                    "ports": [{"name": "http", "containerPort": 8080}],
                    "env": [
                        {"name": "HTTP_PORT", "value": "8080"},
                        {"name": "SERVICE_NAME", "value": name},
                        {"name": "NAMESPACE", "value": NS},
                        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    ],
                    "readinessProbe": {"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 1},
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

fn load_balancer(name: &str) -> Value {
    let mut svc = service(name);
    svc["metadata"]["name"] = json!(format!("{name}-lb"));
    svc["spec"]["type"] = json!("LoadBalancer");
    svc
}

/// The Service's load-balancer addresses once it has one per wanted family.
async fn lb_addresses(
    api: &KubeApi,
    name: &str,
    families: &[Family],
) -> anyhow::Result<Vec<IpAddr>> {
    let deadline = Instant::now() + WAIT;
    loop {
        let svc = api
            .get("v1", "Service", Some(NS), name)
            .await?
            .context("no Service")?;
        let got = ips(&svc["status"]["loadBalancer"]["ingress"], "ip");
        if got.iter().map(family_of).collect::<Vec<_>>() == families {
            return Ok(got);
        }
        if Instant::now() > deadline {
            bail!(
                "{name}: no load-balancer address per family within {WAIT:?}: {}",
                svc["status"]
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Runs `answers` from a thread in the namespace outside the node (a client of the cluster).
fn answers_from_outside(
    outside: &std::path::Path,
    to: SocketAddr,
    pods: &[String],
) -> anyhow::Result<String> {
    let outside = outside.to_owned();
    let pods = pods.to_vec();
    std::thread::spawn(move || {
        conformance::cluster::netns::enter_path(&outside)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        runtime.block_on(answers(to, &pods))
    })
    .join()
    .map_err(|_| anyhow::anyhow!("the outside client panicked"))?
}

fn family_of(ip: &IpAddr) -> Family {
    if ip.is_ipv4() {
        Family::V4
    } else {
        Family::V6
    }
}

fn ips(list: &Value, field: &str) -> Vec<IpAddr> {
    list.as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v[field].as_str().or(v.as_str())?.parse().ok())
        .collect()
}

/// The app's pods once `n` run, Ready (the kubelet's probe passed), with an address of each
/// family of the cluster.
async fn running_pods(
    api: &KubeApi,
    app: &str,
    n: usize,
    families: &[Family],
) -> anyhow::Result<Vec<Value>> {
    let deadline = Instant::now() + WAIT;
    loop {
        let pods = api
            .list("v1", "Pod", Some(NS), &format!("app={app}"))
            .await?;
        let ok = |p: &Value| {
            let ready = p["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Ready" && c["status"] == "True");
            let got: Vec<Family> = ips(&p["status"]["podIPs"], "ip")
                .iter()
                .map(family_of)
                .collect();
            ready && p["metadata"]["deletionTimestamp"].is_null() && got == families
        };
        if pods.len() == n && pods.iter().all(ok) {
            return Ok(pods);
        }
        if Instant::now() > deadline {
            let seen: Vec<&Value> = pods.iter().map(|p| &p["status"]).collect();
            bail!("{n} Ready pods of {app} not within {WAIT:?}; last seen: {seen:?}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// GET / at `to` answers 200 from one of `pods`, reached over the family of `to`.
async fn answers(to: SocketAddr, pods: &[String]) -> anyhow::Result<String> {
    // From the node's own address (not loopback: the pods are behind the bridge).
    let stream = tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(to))
        .await
        .with_context(|| format!("connecting to {to} timed out"))?
        .with_context(|| format!("cannot connect to {to}"))?;
    let local = stream.local_addr()?;
    let mut conn = Conn::over(stream, local, to, false).await?;
    let reply = conn
        .get("echo.test", "/")
        .await
        .with_context(|| format!("GET http://{to}/"))?;
    ensure!(reply.status == 200, "{to} answered {}", reply.status);
    let echo = reply.echo().with_context(|| format!("from {to}"))?;
    ensure!(pods.contains(&echo.pod), "{to} answered as {}", echo.pod);
    ensure!(
        echo.family == family_of(&to.ip()),
        "{to} reached the pod over {}",
        echo.family
    );
    Ok(echo.pod)
}

async fn containers_serve_through_kube_proxy(stack: Stack) -> anyhow::Result<()> {
    let _one = ONE_AT_A_TIME.lock().await;
    let (mut cluster, api) = start(stack, LoadBalancerKind::StandIn).await?;
    let families = stack.families();
    api.create(deployment("echo", 2)).await?;
    let svc = api.create(service("echo")).await?;
    let pods = running_pods(&api, "echo", 2, families).await?;
    let names: Vec<String> = pods
        .iter()
        .map(|p| {
            p["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
        .collect();
    for pod in &pods {
        for ip in ips(&pod["status"]["podIPs"], "ip") {
            answers(SocketAddr::new(ip, 8080), &names).await?;
        }
    }
    let cluster_ips = ips(&svc["spec"]["clusterIPs"], "");
    let got: Vec<Family> = cluster_ips.iter().map(family_of).collect();
    ensure!(got == families, "clusterIPs {}", svc["spec"]["clusterIPs"]);
    for ip in cluster_ips {
        let to = SocketAddr::new(ip, 80);
        let deadline = Instant::now() + WAIT;
        let mut seen = std::collections::BTreeSet::new();
        // kube-proxy picks a pod at random: both answer within a few tries.
        while seen.len() < 2 {
            match answers(to, &names).await {
                Ok(pod) => {
                    seen.insert(pod);
                }
                Err(e) if Instant::now() > deadline => return Err(e),
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
        println!("{to}: answered by {seen:?}");
    }
    api.create(load_balancer("echo")).await?;
    let outside = cluster.node().context("no node")?.outside().to_owned();
    for ip in lb_addresses(&api, "echo-lb", families).await? {
        let to = SocketAddr::new(ip, 80);
        let pod = answers_from_outside(&outside, to, &names)?;
        println!("{to} from outside the node: answered by {pod}");
    }
    cluster.check_running()
}

#[tokio::test]
async fn dual_stack_containers_serve_both_families_through_kube_proxy() {
    containers_serve_through_kube_proxy(Stack::Dual)
        .await
        .unwrap();
}

#[tokio::test]
async fn ipv6_primary_containers_serve_both_families_through_kube_proxy() {
    containers_serve_through_kube_proxy(Stack::DualIpv6)
        .await
        .unwrap();
}

#[tokio::test]
async fn ipv4_only_containers_serve_ipv4_through_kube_proxy() {
    containers_serve_through_kube_proxy(Stack::Ipv4)
        .await
        .unwrap();
}

#[tokio::test]
async fn ipv6_only_containers_serve_ipv6_through_kube_proxy() {
    containers_serve_through_kube_proxy(Stack::Ipv6)
        .await
        .unwrap();
}

/// The echo Deployment's pods' names once `n` run Ready.
async fn pod_names(api: &KubeApi, families: &[Family]) -> anyhow::Result<Vec<String>> {
    let pods = running_pods(api, "echo", 2, families).await?;
    Ok(pods
        .iter()
        .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_owned))
        .collect())
}

/// Inside MetalLB's pool: 10.255.0.100-199 or fd00:10:255::100-1ff.
fn in_metallb_pool(ip: &IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, c, d] = v4.octets();
            (a, b, c) == (10, 255, 0) && (100..=199).contains(&d)
        }
        IpAddr::V6(v6) => {
            let s = v6.segments();
            s[..7] == [0xfd00, 0x10, 0x255, 0, 0, 0, 0] && (0x100..=0x1ff).contains(&s[7])
        }
    }
}

/// `answers_from_outside`, retried while the first ARP/NDP exchange and kube-proxy's rules for
/// the new address settle.
fn answers_from_outside_soon(
    outside: &std::path::Path,
    to: SocketAddr,
    pods: &[String],
) -> anyhow::Result<String> {
    let deadline = Instant::now() + WAIT;
    loop {
        match answers_from_outside(outside, to, pods) {
            Ok(pod) => return Ok(pod),
            Err(e) if Instant::now() > deadline => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(500)),
        }
    }
}

/// The link-layer address the outside namespace holds for `ip` (`ip neigh`).
fn outside_neighbour(outside: &std::path::Path, ip: &IpAddr) -> anyhow::Result<String> {
    let out = std::process::Command::new("nsenter")
        .arg(format!("--net={}", outside.display()))
        .args(["ip", "neigh", "show", &ip.to_string()])
        .output()
        .context("cannot run nsenter ip neigh")?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let words: Vec<&str> = text.split_whitespace().collect();
    let mac = words.windows(2).find(|w| w[0] == "lladdr").map(|w| w[1]);
    mac.map(str::to_owned)
        .with_context(|| format!("the outside namespace has no neighbour entry for {ip}: {text:?}"))
}

/// The MAC of the node's eth0, from `ip link` run from this thread, which is in the node's (the
/// cluster's) network namespace (`/sys/class/net` shows the machine's: sysfs keeps the namespace
/// it was mounted in).
fn node_eth0_mac() -> anyhow::Result<String> {
    let out = std::process::Command::new("ip")
        .args(["-o", "link", "show", "eth0"])
        .output()
        .context("cannot run ip link")?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let words: Vec<&str> = text.split_whitespace().collect();
    let mac = words
        .windows(2)
        .find(|w| w[0] == "link/ether")
        .map(|w| w[1]);
    mac.map(str::to_owned)
        .with_context(|| format!("no MAC for the node's eth0: {text:?}"))
}

/// MetalLB's ServiceL2Status names eth0 as the one interface it announces the Service on, and
/// the outside namespace resolved every address to the node's eth0 MAC.
async fn announced_on_eth0_only(
    api: &KubeApi,
    outside: &std::path::Path,
    addresses: &[IpAddr],
) -> anyhow::Result<()> {
    let deadline = Instant::now() + WAIT;
    let interfaces = loop {
        let got = metallb::announcing_interfaces(api, "echo-lb").await?;
        if !got.is_empty() || Instant::now() > deadline {
            break got;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    ensure!(
        interfaces == [metallb::INTERFACE],
        "MetalLB announces echo-lb on {interfaces:?}"
    );
    let mac = node_eth0_mac()?;
    for ip in addresses {
        let neighbour = outside_neighbour(outside, ip)?;
        ensure!(
            neighbour == mac,
            "{ip} resolves to {neighbour} outside, not to the node's eth0 {mac}"
        );
        println!("{ip}: announced on eth0 ({neighbour})");
    }
    Ok(())
}

async fn metallb_serves_from_outside(stack: Stack) -> anyhow::Result<()> {
    let _one = ONE_AT_A_TIME.lock().await;
    let started = Instant::now();
    let (mut cluster, api) = start(stack, LoadBalancerKind::MetalLb).await?;
    println!("cluster with MetalLB up in {:?}", started.elapsed());
    let families = stack.families();
    api.create(deployment("echo", 2)).await?;
    let names = pod_names(&api, families).await?;
    api.create(load_balancer("echo")).await?;
    let outside = cluster.node().context("no node")?.outside().to_owned();
    let addresses = lb_addresses(&api, "echo-lb", families).await?;
    for ip in &addresses {
        ensure!(in_metallb_pool(ip), "{ip} is not from MetalLB's pool");
        let to = SocketAddr::new(*ip, 80);
        let pod = answers_from_outside_soon(&outside, to, &names)?;
        println!("{to} (MetalLB) from outside the node: answered by {pod}");
    }
    announced_on_eth0_only(&api, &outside, &addresses).await?;
    cluster.check_running()
}

#[tokio::test]
async fn dual_stack_metallb_serves_both_families_from_outside() {
    metallb_serves_from_outside(Stack::Dual).await.unwrap();
}

#[tokio::test]
async fn ipv4_only_metallb_serves_ipv4_from_outside() {
    metallb_serves_from_outside(Stack::Ipv4).await.unwrap();
}

#[tokio::test]
async fn ipv6_only_metallb_serves_ipv6_from_outside() {
    metallb_serves_from_outside(Stack::Ipv6).await.unwrap();
}
