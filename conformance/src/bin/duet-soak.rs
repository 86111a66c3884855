//! `duet-soak`: the soak bench (not a test). duet in Kubernetes mode on the real dual-stack
//! control plane (`conformance::cluster`) serves a Deployment of echo pods behind a Service and an
//! Ingress to clients of both families for `--seconds`, while:
//!
//! - every 100 ms one pod's `Ready` condition flips (not ready, then ready again, pod after pod),
//!   so the real endpointslice controller rewrites the Service's EndpointSlices; the pod keeps
//!   running, so a correct proxy answers every request;
//! - every second a second Ingress gains or loses a host (a full routing snapshot rebuild);
//! - once, at half time, kube-apiserver is killed and started again.
//!
//! It samples duet's RSS every second and prints requests and answers per family (and how many
//! reached a pod over the other family, by second), churn writes, EndpointSlice updates seen,
//! how long pods were listed ready in one family only, snapshots applied, duet's connect failures
//! and ejections, and RSS; it exits 1 when any answer was not 2xx or any request failed, 2 when
//! the setup failed. README section "Soak" has the figures.
//!
//! ```text
//! conformance/cluster/build.sh
//! cargo build -p controller --bin duet && cargo build -p conformance --bin duet-soak
//! target/debug/duet-soak --seconds 60
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Parser;
use conformance::cluster::{Cluster, Options, Stack};
use conformance::runner::kube_api::KubeApi;
use conformance::{Conn, Duet, Family};
use futures_util::StreamExt;
use http::Method;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::watcher;
use serde_json::{json, Value};

const NS: &str = "soak";
const HOST: &str = "soak.test";
const APP: &str = "echo";
/// How long setup steps may take.
const WAIT: Duration = Duration::from_secs(60);

#[derive(Debug, Parser)]
#[command(
    name = "duet-soak",
    about = "Load over both families on the real control plane under endpoint, Ingress and API server churn"
)]
struct Args {
    /// How long the load runs.
    #[arg(long, default_value_t = 60)]
    seconds: u64,
    /// Echo pods behind the Service.
    #[arg(long, default_value_t = 3)]
    pods: usize,
    /// Concurrent keep-alive clients per family.
    #[arg(long, default_value_t = 4)]
    clients: usize,
    /// How long kube-apiserver stays down.
    #[arg(long, default_value_t = 3)]
    apiserver_down_seconds: u64,
    /// The duet binary (default: `duet` beside this program).
    #[arg(long)]
    duet: Option<PathBuf>,
}

fn main() {
    let args = Args::parse();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a Tokio runtime");
    match rt.block_on(run(args)) {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(e) => {
            eprintln!("duet-soak: {e:#}");
            std::process::exit(2);
        }
    }
}

/// What the clients of one family saw.
#[derive(Debug, Default)]
struct Tally {
    by_status: BTreeMap<u16, u64>,
    /// 2xx answers from a pod reached over the other family.
    other_family: u64,
    /// The same, by second of the soak.
    other_family_by_second: BTreeMap<u64, u64>,
    failures: u64,
    first_failures: Vec<String>,
}

impl Tally {
    fn add(&mut self, other: Tally) {
        for (code, n) in other.by_status {
            *self.by_status.entry(code).or_default() += n;
        }
        self.other_family += other.other_family;
        for (second, n) in other.other_family_by_second {
            *self.other_family_by_second.entry(second).or_default() += n;
        }
        self.failures += other.failures;
        self.first_failures.extend(other.first_failures);
        self.first_failures.truncate(5);
    }

    fn total(&self) -> u64 {
        self.by_status.values().sum::<u64>() + self.failures
    }

    fn non_2xx(&self) -> u64 {
        self.by_status
            .iter()
            .filter(|(c, _)| !(200..300).contains(*c))
            .map(|(_, n)| n)
            .sum()
    }

    fn note_failure(&mut self, what: String) {
        self.failures += 1;
        if self.first_failures.len() < 5 {
            self.first_failures.push(what);
        }
    }
}

/// What the churn did.
#[derive(Debug, Default)]
struct Churn {
    readiness_writes: u64,
    ingress_writes: u64,
    refused_writes: u64,
}

async fn run(args: Args) -> anyhow::Result<bool> {
    let duet_bin = match args.duet.clone() {
        Some(p) => p,
        None => std::env::current_exe()?.with_file_name("duet"),
    };
    if !duet_bin.exists() {
        bail!(
            "{} is missing: `cargo build -p controller --bin duet`",
            duet_bin.display()
        );
    }
    let mut cluster = Cluster::start(Options {
        stack: Stack::Dual,
        ..Options::default()
    })
    .await?;
    println!("control plane: {}", cluster.control_plane());
    let api = cluster.api().await?;
    create_objects(&api, args.pods).await?;
    let pods = running_pods(&api, args.pods).await?;
    let mut duet = conformance::DuetBuilder::kube(&duet_bin, cluster.kubeconfig())
        .args(["--ingress-class", "duet", "--election-namespace", "default"])
        .die_with_parent()
        .start()
        .await?;
    wait_for_all_endpoints(&duet, args.pods).await?;
    println!(
        "duet {} (pid {}) serves {} pods; soak for {} s",
        duet_bin.display(),
        duet.pid(),
        args.pods,
        args.seconds
    );
    let measured = soak(&args, &mut cluster, &api, &duet, pods).await?;
    duet.check_running()?;
    cluster.check_running()?;
    Ok(report(&args, &measured))
}

/// Everything one soak measured.
#[derive(Debug, Default)]
struct Measured {
    /// IPv4 clients, IPv6 clients.
    tallies: [Tally; 2],
    churn: Churn,
    slices: SliceLog,
    snapshots: u64,
    /// duet's `duet_upstream_connect_failures_total`, all series.
    connect_failures: f64,
    /// duet's `duet_target_family_ejections_total`, all series.
    ejections: f64,
    /// VmRSS in KiB, one a second.
    rss: Vec<u64>,
}

/// Load, churn, the API server restart at half time, and the samples.
async fn soak(
    args: &Args,
    cluster: &mut Cluster,
    api: &KubeApi,
    duet: &Duet,
    pods: Vec<String>,
) -> anyhow::Result<Measured> {
    let started = Instant::now();
    let deadline = started + Duration::from_secs(args.seconds);
    let stop = Arc::new(AtomicBool::new(false));
    let version_before = snapshot_version(duet).await?;
    let slices = tokio::spawn(watch_slices(api.client().clone(), stop.clone()));
    let rss = tokio::spawn(sample_rss(duet.pid(), deadline));
    let mut load = Vec::new();
    for family in Family::BOTH {
        for _ in 0..args.clients {
            load.push((
                family,
                tokio::spawn(drive(duet.http(family), family, started, deadline)),
            ));
        }
    }
    let churn = tokio::spawn(churn(api.clone(), pods, deadline));
    tokio::time::sleep_until((started + Duration::from_secs(args.seconds / 2)).into()).await;
    let t = Instant::now();
    cluster
        .restart_apiserver(Duration::from_secs(args.apiserver_down_seconds))
        .await?;
    println!(
        "kube-apiserver killed at {:.1} s, ready again after {:.1} s",
        (t - started).as_secs_f64(),
        t.elapsed().as_secs_f64()
    );
    let mut measured = Measured::default();
    for (family, task) in load {
        measured.tallies[usize::from(family == Family::V6)].add(task.await?);
    }
    measured.churn = churn.await??;
    measured.rss = rss.await??;
    stop.store(true, Ordering::Relaxed);
    measured.snapshots = snapshot_version(duet).await? - version_before;
    let metrics = duet.admin_get(Family::V4, "/metrics").await?.text();
    measured.connect_failures = metric_sum(&metrics, "duet_upstream_connect_failures_total");
    measured.ejections = metric_sum(&metrics, "duet_target_family_ejections_total");
    measured.slices = slices.await?;
    Ok(measured)
}

fn deployment(replicas: usize) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"namespace": NS, "name": APP},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": APP}},
            "template": {
                "metadata": {"labels": {"app": APP}},
                "spec": {"containers": [{
                    "name": "echo", "image": "duet.dev/echo",
                    "ports": [{"name": "http", "containerPort": 8080}],
                    "env": [{"name": "SERVICE_NAME", "value": APP}],
                }]},
            },
        },
    })
}

/// The second Ingress, with one host or two: it changes every second.
fn flapping_rules(two: bool) -> Value {
    let mut ingress = conformance::Ingress::new(NS, "flap")
        .class(Some("duet"))
        .host("flap.test", APP);
    if two {
        ingress = ingress.host("flap2.test", APP);
    }
    ingress.build()["spec"]["rules"].clone()
}

async fn create_objects(api: &KubeApi, pods: usize) -> anyhow::Result<()> {
    api.create(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}))
        .await?;
    api.create(conformance::manifests::ingress_class(
        "duet",
        conformance::manifests::CONTROLLER,
    ))
    .await?;
    api.create(deployment(pods)).await?;
    api.create(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"namespace": NS, "name": APP},
        "spec": {
            "ipFamilyPolicy": "RequireDualStack",
            "selector": {"app": APP},
            "ports": [{"name": "http", "port": 80, "targetPort": "http"}],
        },
    }))
    .await?;
    api.create(
        conformance::Ingress::new(NS, "soak")
            .class(Some("duet"))
            .host(HOST, APP)
            .build(),
    )
    .await?;
    let mut flap = conformance::Ingress::new(NS, "flap")
        .class(Some("duet"))
        .build();
    flap["spec"]["rules"] = flapping_rules(false);
    api.create(flap).await?;
    Ok(())
}

fn is_ready(pod: &Value) -> bool {
    pod["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Ready" && c["status"] == "True")
}

/// The names of the `n` pods once all run, ready, with an address of each family.
async fn running_pods(api: &KubeApi, n: usize) -> anyhow::Result<Vec<String>> {
    let deadline = Instant::now() + WAIT;
    loop {
        let pods = api
            .list("v1", "Pod", Some(NS), &format!("app={APP}"))
            .await?;
        let ok =
            |p: &Value| is_ready(p) && p["status"]["podIPs"].as_array().map_or(0, Vec::len) == 2;
        if pods.len() == n && pods.iter().all(ok) {
            return Ok(pods
                .iter()
                .map(|p| {
                    p["metadata"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned()
                })
                .collect());
        }
        if Instant::now() > deadline {
            bail!("{n} running pods: not within {WAIT:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until duet's metrics list every pod as a dual-stack target of the Service and it
/// answers over both families.
async fn wait_for_all_endpoints(duet: &Duet, pods: usize) -> anyhow::Result<()> {
    let want = format!(
        "duet_backend_targets{{namespace=\"{NS}\",service=\"{APP}\",kind=\"dual\"}} {pods}"
    );
    let deadline = Instant::now() + WAIT;
    loop {
        let metrics = duet.admin_get(Family::V4, "/metrics").await?.text();
        let mut served = metrics.contains(&want);
        for family in Family::BOTH {
            served &= conformance::client::get(duet.http(family), HOST, "/")
                .await
                .is_ok_and(|r| r.status == 200);
        }
        if served {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("duet does not serve {pods} dual-stack pods within {WAIT:?}: want `{want}`");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `duet_snapshot_version` from the metrics.
async fn snapshot_version(duet: &Duet) -> anyhow::Result<u64> {
    let metrics = duet.admin_get(Family::V4, "/metrics").await?.text();
    metrics
        .lines()
        .find_map(|l| l.strip_prefix("duet_snapshot_version "))
        .context("no duet_snapshot_version")?
        .trim()
        .parse()
        .context("duet_snapshot_version is not a number")
}

/// The sum of every series of a metric.
fn metric_sum(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|r| r.starts_with(['{', ' ']))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// One client: keep-alive HTTP/1.1 requests until the deadline, reconnecting when closed.
async fn drive(
    to: std::net::SocketAddr,
    family: Family,
    started: Instant,
    deadline: Instant,
) -> Tally {
    let mut tally = Tally::default();
    let mut conn: Option<Conn> = None;
    while Instant::now() < deadline {
        let c = match conn.take().filter(|c| !c.is_closed()) {
            Some(c) => c,
            None => match Conn::http1(to).await {
                Ok(c) => c,
                Err(e) => {
                    tally.note_failure(format!("connect to {to}: {e:#}"));
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
        };
        let mut c = c;
        match c.get(HOST, "/").await {
            Ok(reply) => {
                *tally.by_status.entry(reply.status.as_u16()).or_default() += 1;
                if reply.status.is_success() {
                    match reply.echo() {
                        Ok(echo) if echo.family != family => {
                            tally.other_family += 1;
                            let second = started.elapsed().as_secs();
                            *tally.other_family_by_second.entry(second).or_default() += 1;
                        }
                        Ok(_) => {}
                        Err(e) => tally.note_failure(format!("{e:#}")),
                    }
                } else if tally.first_failures.len() < 5 {
                    tally
                        .first_failures
                        .push(format!("{}: {}", reply.status, reply.text().trim()));
                }
                conn = Some(c);
            }
            Err(e) => tally.note_failure(format!("request to {to}: {e:#}")),
        }
    }
    tally
}

/// Marks a pod ready or not through the Pod status API (the kubelet's job; this kubelet
/// reports once and never overwrites it).
async fn set_ready(api: &KubeApi, pod: &str, ready: bool) -> anyhow::Result<()> {
    let status = if ready { "True" } else { "False" };
    let patch = json!({"status": {"conditions": [{"type": "Ready", "status": status}]}});
    api.send(
        Method::PATCH,
        &format!("/api/v1/namespaces/{NS}/pods/{pod}/status"),
        "application/strategic-merge-patch+json",
        serde_json::to_vec(&patch)?,
    )
    .await?;
    Ok(())
}

/// Every 100 ms a readiness write (pod k not ready, then ready again, k after k); every
/// 10th tick the flapping Ingress gains or loses its second host. Writes refused while
/// kube-apiserver is down are counted and skipped. At the end every pod is ready again.
async fn churn(api: KubeApi, pods: Vec<String>, deadline: Instant) -> anyhow::Result<Churn> {
    let mut churn = Churn::default();
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut i: usize = 0;
    while Instant::now() < deadline {
        tick.tick().await;
        let pod = &pods[(i / 2) % pods.len()];
        match set_ready(&api, pod, i % 2 == 1).await {
            Ok(()) => churn.readiness_writes += 1,
            Err(_) => churn.refused_writes += 1,
        }
        if i % 10 == 5 {
            let patch = json!({"spec": {"rules": flapping_rules((i / 10).is_multiple_of(2))}});
            match api
                .merge_patch("networking.k8s.io/v1", "Ingress", Some(NS), "flap", &patch)
                .await
            {
                Ok(_) => churn.ingress_writes += 1,
                Err(_) => churn.refused_writes += 1,
            }
        }
        i += 1;
    }
    for pod in &pods {
        set_ready(&api, pod, true).await?;
    }
    Ok(churn)
}

/// What the Service's EndpointSlices said over the soak (from a watch, resumed across the
/// restart).
#[derive(Debug, Default)]
struct SliceLog {
    /// Slice writes seen.
    updates: u64,
    /// Pod-seconds listed ready in both families, in the IPv4 slice only, in the IPv6 one only.
    ready_time: [f64; 3],
    /// Per slice name: its address type and the pods it lists ready.
    slices: BTreeMap<String, (String, BTreeSet<String>)>,
}

impl SliceLog {
    fn apply(&mut self, slice: &EndpointSlice) {
        let ready = slice
            .endpoints
            .iter()
            .flatten()
            .filter(|e| e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true))
            .filter_map(|e| e.target_ref.as_ref()?.name.clone())
            .collect();
        let name = slice.metadata.name.clone().unwrap_or_default();
        self.slices
            .insert(name, (slice.address_type.clone(), ready));
    }

    /// Adds `seconds` of the current listing to `ready_time`.
    fn account(&mut self, seconds: f64) {
        let of = |kind: &str| -> BTreeSet<&String> {
            self.slices
                .values()
                .filter(|(t, _)| t == kind)
                .flat_map(|(_, pods)| pods)
                .collect()
        };
        let (v4, v6) = (of("IPv4"), of("IPv6"));
        let counts = [
            v4.intersection(&v6).count(),
            v4.difference(&v6).count(),
            v6.difference(&v4).count(),
        ];
        for (t, n) in self.ready_time.iter_mut().zip(counts) {
            *t += seconds * n as f64;
        }
    }
}

/// Watches the Service's EndpointSlices until `stop`.
async fn watch_slices(client: kube::Client, stop: Arc<AtomicBool>) -> SliceLog {
    let slices: kube::Api<EndpointSlice> = kube::Api::namespaced(client, NS);
    let config = watcher::Config::default().labels(&format!("kubernetes.io/service-name={APP}"));
    let mut events = watcher::watcher(slices, config).boxed();
    let mut log = SliceLog::default();
    let mut last = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        let next = tokio::time::timeout(Duration::from_millis(200), events.next()).await;
        log.account(last.elapsed().as_secs_f64());
        last = Instant::now();
        match next {
            Ok(Some(Ok(watcher::Event::Apply(slice)))) => {
                log.updates += 1;
                log.apply(&slice);
            }
            Ok(Some(Ok(watcher::Event::InitApply(slice)))) => log.apply(&slice),
            Ok(Some(Ok(watcher::Event::Delete(slice)))) => {
                log.updates += 1;
                log.slices.remove(&slice.metadata.name.unwrap_or_default());
            }
            Ok(Some(Err(_))) => tokio::time::sleep(Duration::from_millis(200)).await,
            Ok(None) => break,
            _ => {}
        }
    }
    log
}

/// duet's VmRSS in KiB, once a second until the deadline.
async fn sample_rss(pid: u32, deadline: Instant) -> anyhow::Result<Vec<u64>> {
    let mut samples = Vec::new();
    loop {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .with_context(|| format!("duet (pid {pid}) is gone"))?;
        let kib = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .context("no VmRSS")?;
        samples.push(kib);
        if Instant::now() >= deadline {
            return Ok(samples);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Prints the summary; true when every request got a 2xx.
fn report(args: &Args, m: &Measured) -> bool {
    println!();
    println!(
        "| family | requests | 2xx | non-2xx | failed | 2xx from a pod over the other family |"
    );
    println!("|---|---|---|---|---|---|");
    let mut clean = true;
    for (family, t) in Family::BOTH.iter().zip(&m.tallies) {
        let ok = t.total() - t.non_2xx() - t.failures;
        println!(
            "| {family} | {} | {ok} | {} {:?} | {} | {} |",
            t.total(),
            t.non_2xx(),
            t.by_status
                .iter()
                .filter(|(c, _)| !(200..300).contains(*c))
                .collect::<BTreeMap<_, _>>(),
            t.failures,
            t.other_family
        );
        if t.other_family > 0 {
            println!(
                "  {family}: other family by second: {:?}",
                t.other_family_by_second
            );
        }
        for f in &t.first_failures {
            println!("  {family}: {f}");
        }
        clean &= t.non_2xx() == 0 && t.failures == 0;
    }
    let total: u64 = m.tallies.iter().map(Tally::total).sum();
    println!();
    println!(
        "{} s, {} clients per family: {:.0} requests/s",
        args.seconds,
        args.clients,
        total as f64 / args.seconds as f64
    );
    println!(
        "churn: {} readiness writes, {} Ingress writes, {} writes refused (API server down); \
         {} EndpointSlice updates seen; {} snapshots applied",
        m.churn.readiness_writes,
        m.churn.ingress_writes,
        m.churn.refused_writes,
        m.slices.updates,
        m.snapshots
    );
    println!(
        "duet: {} upstream connect failures, {} family ejections",
        m.connect_failures, m.ejections
    );
    let [both, v4, v6] = m.slices.ready_time;
    let all = (both + v4 + v6).max(f64::MIN_POSITIVE);
    println!(
        "ready pod-time listed in both families {:.1}%, in the IPv4 slice only {:.2}%, in the \
         IPv6 slice only {:.2}% (per-family slices are written one after the other)",
        100.0 * both / all,
        100.0 * v4 / all,
        100.0 * v6 / all
    );
    if let Some(max) = m.rss.iter().copied().max() {
        let mib = |kib: u64| format!("{:.1}", kib as f64 / 1024.0);
        let at = |q: usize| mib(m.rss[(m.rss.len() - 1) * q / 4]);
        println!(
            "RSS MiB: start {}, 1/4 {}, 1/2 {}, 3/4 {}, end {}, max {} ({} samples)",
            at(0),
            at(1),
            at(2),
            at(3),
            at(4),
            mib(max),
            m.rss.len()
        );
    }
    println!("{}", if clean { "PASS" } else { "FAIL" });
    clean
}
