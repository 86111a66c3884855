//! `duet-conformance node-scenarios`: duet as its users run it, on a real node, under load.
//!
//! A cluster with a real node ([`crate::cluster::node`]) gets duet's image and the echo image
//! (`images/build.sh`, from the debug binaries), `helm install` of `charts/duet` with default
//! values but the image (Helm's own CLI, built by `conformance/helm/build.sh`), a Deployment of
//! three echo pods and an Ingress to them. Clients of each family stand outside the node and
//! send requests without pause through the load-balancer address of their family
//! ([`super::node_load`]): once a second of it passes without a failed request (duet has every
//! echo pod of both families), a baseline without any change, then each scenario; each prints
//! `SCENARIO: N requests, F failed, longest T ms`, then `N passed, N failed`. The baseline and
//! every scenario pass with 0 failed requests, except `kill-9`, whose failures are measured and
//! reported (a process killed without warning drops what it holds) and which passes once requests
//! succeed again.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::{Parser, ValueEnum};
use http::Method;
use serde_json::{json, Value};

use super::kube_api::KubeApi;
use super::node_load::{Load, Stats};
use super::Profile;
use crate::cluster::{node, Cluster, LoadBalancerKind, Options, Stack};

const RELEASE: &str = "duet";
const DUET_NS: &str = "duet";
const APP_NS: &str = "demo";
const HOST: &str = "echo.test";
const DUET_IMAGE: &str = "duet.local/duet";
const ECHO_IMAGE: &str = "duet.local/duet-echo:dev";
/// How long a rollout or a recovery may take.
const WAIT: Duration = Duration::from_secs(300);

/// The command line.
#[derive(Debug, Parser)]
#[command(
    name = "duet-conformance node-scenarios",
    about = "Roll, kill and restart duet, its backends and the node under load, counting failed requests"
)]
pub struct NodeScenariosCli {
    /// The clients' families (and the cluster's: dual-stack for both).
    #[arg(long, value_enum, default_value = "both")]
    pub family: Profile,
    /// The duet binary packed into the image (default: `duet` next to this program).
    #[arg(long, value_name = "PATH")]
    pub duet: Option<PathBuf>,
    /// Only these scenarios, comma-separated (default: all, in order).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub only: Vec<Scenario>,
    /// Seconds of load after each scenario has settled.
    #[arg(long, value_name = "SECONDS", default_value = "5")]
    pub settle: u64,
    /// Clients per load-balancer address.
    #[arg(long, default_value = "2")]
    pub clients: usize,
}

/// What happens while the load runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Scenario {
    /// `helm upgrade` to a new image tag and a changed argument: both replicas roll.
    HelmUpgrade,
    /// The echo Deployment rolls: its pods terminate while duet still has them.
    BackendRoll,
    /// The pod holding duet's leader Lease is deleted: the other replica takes it over.
    LeaderDeleted,
    /// SIGKILL to a duet container's process.
    #[value(name = "kill-9")]
    Kill9,
    /// kube-apiserver killed and started again.
    ApiserverRestart,
    /// containerd killed and started again (containers keep running).
    ContainerdRestart,
    /// The kubelet killed and started again.
    KubeletRestart,
}

impl Scenario {
    const ALL: [Scenario; 7] = [
        Scenario::HelmUpgrade,
        Scenario::BackendRoll,
        Scenario::LeaderDeleted,
        Scenario::Kill9,
        Scenario::ApiserverRestart,
        Scenario::ContainerdRestart,
        Scenario::KubeletRestart,
    ];

    fn name(self) -> String {
        self.to_possible_value()
            .map(|v| v.get_name().to_owned())
            .unwrap_or_default()
    }
}

/// Runs the scenarios; exit code 0 when every one passed.
pub async fn main(cli: NodeScenariosCli) -> anyhow::Result<i32> {
    let duet = match cli.duet.clone() {
        Some(path) => path,
        None => std::env::current_exe()?
            .with_file_name("duet")
            .canonicalize()
            .context("no duet binary next to this program (build it or give --duet)")?,
    };
    let stack = match cli.family {
        Profile::Both => Stack::Dual,
        Profile::Ipv4 => Stack::Ipv4,
        Profile::Ipv6 => Stack::Ipv6,
    };
    let mut cluster = Cluster::start(Options {
        stack,
        real_node: true,
        load_balancer: LoadBalancerKind::MetalLb,
        ..Options::default()
    })
    .await?;
    let node = cluster.node().context("no real node")?;
    println!("control plane: {}", cluster.control_plane());
    println!("node: {}, load balancer: MetalLB L2", node.versions());
    let helm = Helm::build(cluster.dir(), cluster.kubeconfig())?;
    import_images(&cluster, &duet)?;
    let api = cluster.api().await?;
    let started = Instant::now();
    helm.run(
        &[
            "install",
            RELEASE,
            &chart(),
            "--namespace",
            DUET_NS,
            "--create-namespace",
        ],
        &[],
    )?;
    rollout(&api, DUET_NS, RELEASE, 2).await?;
    println!(
        "helm install: 2 replicas Ready in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let targets = deploy_backend(&api, stack).await?;
    let outside = cluster.node().context("no node")?.outside().to_owned();
    let load = Load::start(&outside, &targets, HOST, cli.clients);
    run_all(&cli, &mut cluster, &api, &helm, &load).await
}

async fn run_all(
    cli: &NodeScenariosCli,
    cluster: &mut Cluster,
    api: &KubeApi,
    helm: &Helm,
    load: &Load,
) -> anyhow::Result<i32> {
    let settle = Duration::from_secs(cli.settle);
    warm_up(load).await?;
    tokio::time::sleep(settle).await;
    let baseline_ok = report("baseline", &load.take(), false);
    let scenarios = if cli.only.is_empty() {
        Scenario::ALL.to_vec()
    } else {
        cli.only.clone()
    };
    let (mut passed, mut failed) = if baseline_ok { (1, 0) } else { (0, 1) };
    for scenario in scenarios {
        let outcome = run_one(scenario, cluster, api, helm).await;
        tokio::time::sleep(settle).await;
        let stats = load.take();
        let kill = scenario == Scenario::Kill9;
        let ok = report(&scenario.name(), &stats, kill);
        match outcome {
            Ok(()) if ok && load.running() => passed += 1,
            Ok(()) => failed += 1,
            Err(e) => {
                println!("  {}: {e:#}", scenario.name());
                failed += 1;
            }
        }
    }
    println!("{passed} passed, {failed} failed");
    Ok(if failed == 0 { 0 } else { 1 })
}

/// Waits (at most 60 s) for a second of load without a failed request: duet learns the echo pods'
/// IPv4 and IPv6 EndpointSlices one after the other, and until both are in, a client of one family
/// can be answered 503 or by a pod over the other family (the fallback). The baseline starts after.
async fn warm_up(load: &Load) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    load.take();
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let stats = load.take();
        if stats.requests > 0 && stats.failed == 0 {
            return Ok(());
        }
        if Instant::now() > deadline {
            report("warm-up", &stats, false);
            bail!("the load still fails after 60 s");
        }
    }
}

/// Prints the scenario's line and its first failures; whether it passes (no failed request,
/// or for `kill-9` requests answered again at the end).
fn report(name: &str, stats: &Stats, failures_expected: bool) -> bool {
    println!(
        "{name}: {} requests, {} failed, longest {} ms (IPv4 {}, IPv6 {})",
        stats.requests,
        stats.failed,
        stats.longest.as_millis(),
        stats.by_family[0],
        stats.by_family[1]
    );
    for failure in &stats.failures {
        println!("  {failure}");
    }
    stats.requests > 0 && (stats.failed == 0 || failures_expected)
}

async fn run_one(
    scenario: Scenario,
    cluster: &mut Cluster,
    api: &KubeApi,
    helm: &Helm,
) -> anyhow::Result<()> {
    match scenario {
        Scenario::HelmUpgrade => helm_upgrade(api, helm).await,
        Scenario::BackendRoll => backend_roll(api).await,
        Scenario::LeaderDeleted => leader_deleted(api).await,
        Scenario::Kill9 => kill_9(api).await,
        Scenario::ApiserverRestart => {
            cluster.restart_apiserver(Duration::from_secs(5)).await?;
            rollout(api, DUET_NS, RELEASE, 2).await
        }
        Scenario::ContainerdRestart | Scenario::KubeletRestart => {
            let name = match scenario {
                Scenario::ContainerdRestart => "containerd",
                _ => "kubelet",
            };
            let node = cluster.node_mut().context("no node")?;
            node.restart(name, Duration::from_secs(2))?;
            tokio::time::sleep(Duration::from_secs(5)).await;
            cluster.check_running()?;
            rollout(api, DUET_NS, RELEASE, 2).await?;
            rollout(api, APP_NS, "echo", 3).await
        }
    }
}

/// A new image tag and a changed argument (the log level): a rolling update of both replicas.
async fn helm_upgrade(api: &KubeApi, helm: &Helm) -> anyhow::Result<()> {
    let sets = ["image.tag=next", "controller.logLevel=debug"];
    helm.run(
        &[
            "upgrade",
            RELEASE,
            &chart(),
            "--namespace",
            DUET_NS,
            "--reuse-values",
        ],
        &sets,
    )?;
    rollout(api, DUET_NS, RELEASE, 2).await?;
    let pods = api.list("v1", "Pod", Some(DUET_NS), "").await?;
    for pod in pods
        .iter()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
    {
        let image = pod["spec"]["containers"][0]["image"]
            .as_str()
            .unwrap_or_default();
        anyhow::ensure!(image.ends_with(":next"), "pod still runs {image}");
    }
    Ok(())
}

/// `kubectl rollout restart` of the echo Deployment.
async fn backend_roll(api: &KubeApi) -> anyhow::Result<()> {
    let stamp = format!("{:?}", std::time::SystemTime::now());
    let patch = json!({"spec": {"template": {"metadata": {"annotations": {
        "duet.dev/restarted-at": stamp}}}}});
    api.merge_patch("apps/v1", "Deployment", Some(APP_NS), "echo", &patch)
        .await?;
    rollout(api, APP_NS, "echo", 3).await
}

/// Deletes the leader's pod (graceful, as `kubectl delete pod`), waits for the other replica to
/// hold the Lease and for a new Ingress's status to be written.
async fn leader_deleted(api: &KubeApi) -> anyhow::Result<()> {
    let holder = lease_holder(api).await?;
    let pod = leader_pod(api, &holder).await?;
    let path = format!("/api/v1/namespaces/{DUET_NS}/pods/{pod}");
    let t0 = Instant::now();
    api.send(Method::DELETE, &path, "application/json", Vec::new())
        .await?;
    let new = wait("another replica to take the Lease", || async {
        let now = lease_holder(api).await?;
        // Released (empty) first, then held by the other replica.
        Ok((!now.is_empty() && !now.starts_with(&pod)).then_some(now))
    })
    .await?;
    let took_over = t0.elapsed();
    api.create(ingress("echo-after-leader")).await?;
    wait("the new Ingress's status", || async {
        Ok(status_ips(api, "echo-after-leader")
            .await?
            .filter(|ips| !ips.is_empty()))
    })
    .await?;
    println!(
        "  leader {pod} deleted: {new} took the Lease after {:.1} s, status written after {:.1} s",
        took_over.as_secs_f64(),
        t0.elapsed().as_secs_f64()
    );
    rollout(api, DUET_NS, RELEASE, 2).await
}

/// SIGKILL to the duet process of one pod; waits until the kubelet restarted it and it is Ready.
async fn kill_9(api: &KubeApi) -> anyhow::Result<()> {
    // The Deployment counts only pods not being deleted: the previous scenario's pod may still
    // be listed, terminating, its process gone. Kill one that serves.
    let pods = api.list("v1", "Pod", Some(DUET_NS), "").await?;
    let pod = pods
        .iter()
        .find(|p| serving(p))
        .context("no duet pod running and Ready")?;
    let uid = pod["metadata"]["uid"].as_str().unwrap_or_default();
    let pid = container_pid(uid, "duet")?;
    let status = Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()?;
    anyhow::ensure!(status.success(), "kill -9 {pid} failed");
    let name = pod["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    wait("the killed container to restart", || async {
        let pod = api.get("v1", "Pod", Some(DUET_NS), &name).await?;
        let restarts = pod
            .as_ref()
            .and_then(|p| p["status"]["containerStatuses"][0]["restartCount"].as_u64());
        Ok(restarts.filter(|n| *n > 0))
    })
    .await?;
    rollout(api, DUET_NS, RELEASE, 2).await
}

/// Not being deleted, and its first container running and Ready.
fn serving(pod: &Value) -> bool {
    let container = &pod["status"]["containerStatuses"][0];
    pod["metadata"]["deletionTimestamp"].is_null()
        && container["ready"] == json!(true)
        && container["state"]["running"].is_object()
}

/// The host pid of the process named `comm` in the pod of `uid` (the kubelet's cgroupfs layout
/// names the pod's cgroup `pod<uid>`).
fn container_pid(uid: &str, comm: &str) -> anyhow::Result<u32> {
    let needle = format!("pod{uid}");
    for entry in std::fs::read_dir("/proc")?.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let cgroup = std::fs::read_to_string(entry.path().join("cgroup")).unwrap_or_default();
        let name = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
        if cgroup.contains(&needle) && name.trim() == comm {
            return Ok(pid);
        }
    }
    bail!("no process {comm} in the cgroup of pod {uid}")
}

async fn lease_holder(api: &KubeApi) -> anyhow::Result<String> {
    let lease = api
        .get(
            "coordination.k8s.io/v1",
            "Lease",
            Some(DUET_NS),
            &format!("{RELEASE}-leader"),
        )
        .await?
        .context("no leader Lease")?;
    Ok(lease["spec"]["holderIdentity"]
        .as_str()
        .unwrap_or_default()
        .to_owned())
}

/// The pod whose name the holder identity (`POD-xxxxxxxx`) starts with.
async fn leader_pod(api: &KubeApi, holder: &str) -> anyhow::Result<String> {
    let pods = api.list("v1", "Pod", Some(DUET_NS), "").await?;
    pods.iter()
        .filter_map(|p| p["metadata"]["name"].as_str())
        .find(|name| {
            holder
                .strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('-'))
        })
        .map(str::to_owned)
        .with_context(|| format!("no pod holds the Lease ({holder:?})"))
}

/// Polls `f` every 250 ms until it returns `Some`, failing after [`WAIT`].
async fn wait<T, F, Fut>(what: &str, mut f: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<Option<T>>>,
{
    let deadline = Instant::now() + WAIT;
    loop {
        match f().await {
            Ok(Some(v)) => return Ok(v),
            Ok(None) | Err(_) if Instant::now() < deadline => {}
            Ok(None) => bail!("{what}: not within {WAIT:?}"),
            Err(e) => return Err(e.context(format!("{what}: not within {WAIT:?}"))),
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Waits until the Deployment has rolled out: `replicas` updated, available and no old pod
/// left (the controller saw the latest spec).
async fn rollout(api: &KubeApi, ns: &str, name: &str, replicas: u64) -> anyhow::Result<()> {
    wait(&format!("Deployment {ns}/{name} rolled out"), || async {
        let d = api.get("apps/v1", "Deployment", Some(ns), name).await?;
        let Some(d) = d else { return Ok(None) };
        let s = &d["status"];
        let done = s["observedGeneration"] == d["metadata"]["generation"]
            && [
                &s["updatedReplicas"],
                &s["availableReplicas"],
                &s["readyReplicas"],
                &s["replicas"],
            ]
            .iter()
            .all(|v| v.as_u64() == Some(replicas));
        Ok(done.then_some(()))
    })
    .await
}

/// The echo Deployment, its Service and an Ingress of the chart's class; returns the
/// load-balancer addresses (port 80) once the Ingress's status lists one per cluster family.
async fn deploy_backend(api: &KubeApi, stack: Stack) -> anyhow::Result<Vec<SocketAddr>> {
    api.create(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": APP_NS}}))
        .await?;
    api.create(echo_deployment()).await?;
    api.create(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"namespace": APP_NS, "name": "echo"},
        "spec": {"ipFamilyPolicy": "PreferDualStack", "selector": {"app": "echo"},
                 "ports": [{"name": "http", "port": 80, "targetPort": "http"}]},
    }))
    .await?;
    api.create(ingress("echo")).await?;
    rollout(api, APP_NS, "echo", 3).await?;
    let families = stack.families().len();
    let ips = wait(
        "the Ingress's status to list an address per family",
        || async {
            Ok(status_ips(api, "echo")
                .await?
                .filter(|ips| ips.len() == families))
        },
    )
    .await?;
    Ok(ips.into_iter().map(|ip| SocketAddr::new(ip, 80)).collect())
}

fn echo_deployment() -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"namespace": APP_NS, "name": "echo"},
        "spec": {
            "replicas": 3,
            "selector": {"matchLabels": {"app": "echo"}},
            "template": {
                "metadata": {"labels": {"app": "echo"}},
                "spec": {"containers": [{
                    "name": "echo", "image": ECHO_IMAGE, "imagePullPolicy": "Never",
                    "ports": [{"name": "http", "containerPort": 8080}],
                    "env": [
                        {"name": "HTTP_PORT", "value": "8080"},
                        {"name": "SERVICE_NAME", "value": "echo"},
                        {"name": "NAMESPACE", "value": APP_NS},
                        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    ],
                    "readinessProbe": {"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 1},
                }]},
            },
        },
    })
}

fn ingress(name: &str) -> Value {
    json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
        "metadata": {"namespace": APP_NS, "name": name},
        "spec": {"ingressClassName": "duet", "rules": [{"host": HOST, "http": {"paths": [{
            "path": "/", "pathType": "Prefix",
            "backend": {"service": {"name": "echo", "port": {"name": "http"}}}}]}}]},
    })
}

async fn status_ips(api: &KubeApi, name: &str) -> anyhow::Result<Option<Vec<IpAddr>>> {
    let ing = api
        .get("networking.k8s.io/v1", "Ingress", Some(APP_NS), name)
        .await?;
    Ok(ing.map(|i| {
        i["status"]["loadBalancer"]["ingress"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|e| e["ip"].as_str()?.parse().ok())
            .collect()
    }))
}

/// duet's image under the tags `dev` and `next` (one archive) and the echo image, imported into
/// the node's containerd.
fn import_images(cluster: &Cluster, duet: &Path) -> anyhow::Result<()> {
    let dir = cluster.dir();
    let duet_tags = [format!("{DUET_IMAGE}:dev"), format!("{DUET_IMAGE}:next")];
    let duet_tags: Vec<&str> = duet_tags.iter().map(String::as_str).collect();
    node::build_image("duet", duet, &duet_tags, &dir.join("duet.tar"))?;
    let echo = duet.with_file_name("duet-echo");
    node::build_image("echo", &echo, &[ECHO_IMAGE], &dir.join("echo.tar"))?;
    cluster.import_image(&dir.join("duet.tar"))?;
    cluster.import_image(&dir.join("echo.tar"))
}

fn chart() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../charts/duet")
        .display()
        .to_string()
}

/// Helm's own CLI against the cluster, its state under the cluster's folder.
struct Helm {
    program: PathBuf,
    kubeconfig: PathBuf,
    home: PathBuf,
}

impl Helm {
    fn build(dir: &Path, kubeconfig: &Path) -> anyhow::Result<Helm> {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("helm/build.sh");
        let out = Command::new("bash")
            .arg(&script)
            .stderr(Stdio::inherit())
            .output()
            .with_context(|| format!("cannot run {}", script.display()))?;
        anyhow::ensure!(out.status.success(), "{} failed", script.display());
        let bin = String::from_utf8_lossy(&out.stdout);
        let bin = PathBuf::from(bin.lines().last().unwrap_or_default().trim());
        Ok(Helm {
            program: bin.join("helm"),
            kubeconfig: kubeconfig.to_owned(),
            home: dir.join("helm"),
        })
    }

    /// `helm ARGS --set image... --set SETS --wait`, failing with its output.
    fn run(&self, args: &[&str], sets: &[&str]) -> anyhow::Result<()> {
        let mut cmd = Command::new(&self.program);
        cmd.args(args)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(["--set", &format!("image.repository={DUET_IMAGE}")])
            .args(["--wait", "--timeout", "5m"]);
        if args[0] == "install" {
            cmd.args(["--set", "image.tag=dev"]);
        }
        for set in sets {
            cmd.args(["--set", set]);
        }
        for var in ["HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME"] {
            cmd.env(var, self.home.join(var));
        }
        let out = cmd
            .stdin(Stdio::null())
            .output()
            .context("cannot run helm")?;
        if !out.status.success() {
            bail!(
                "helm {} failed: {}{}",
                args.join(" "),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(())
    }
}
