//! `duet-conformance gateway`: the upstream Gateway API conformance suite
//! (`conformance/gateway/run.sh`, unmodified) against duet on the real test cluster, once on a
//! dual-stack cluster whose primary family is IPv4 and once on one whose primary family is IPv6,
//! so that the suite's "first Gateway address" is each family in turn.
//!
//! Per run, on a thread of its own (every process it starts dies with that thread):
//! 1. a dual-stack cluster ([`crate::cluster`]) with the Gateway API CRDs, and either its
//!    stand-in kubelet running the suite's echo pods as the real `echo-basic` in pod network
//!    namespaces, or (`--real-node`) a real node running every pod of the suite as containers of
//!    the images its manifests name ([`super::gateway_images`], imported without a registry);
//!    the `node:` line names the node's kubelet, containerd and kube-proxy;
//! 2. a Pod `duet-0` in namespace [`DUET_NAMESPACE`], labelled with the `--gateway-pod-selector`
//!    duet is given, and duet as a process of the cluster namespace (the node's own network
//!    namespace on a real node). The stand-in kubelet gives `duet-0` an address of each family on
//!    the namespace's loopback and runs nothing on them; on a real node `duet-0` is a
//!    `hostNetwork` pod of the pause image, so its addresses are the node's. Either way the
//!    connections the load balancer (and kube-proxy) DNAT to `duet-0`'s addresses at the pod
//!    ports duet assigned reach duet's own sockets there (bound to those ports on a wildcard
//!    address or on the addresses of `POD_IPS`, which duet gets in its environment as the
//!    downward API gives it);
//! 3. duet in Kubernetes mode (`--election-namespace` and `POD_NAMESPACE` [`DUET_NAMESPACE`]);
//! 4. `run.sh KUBECONFIG REPORT_DIR ipv4|ipv6 -- FLAGS` inside the cluster namespace (where the
//!    Gateways' load-balancer addresses are), its output in `REPORT_DIR/NAME.log`, duet's in
//!    `REPORT_DIR/NAME-duet.log`, the report in `REPORT_DIR/NAME.yaml`;
//! 5. the report's counts printed, `PROFILE core|extended: N passed, N failed, N skipped`.
//!
//! Exit code: 1 when a test (core or extended) failed in any run (0 with `--allow-failures`), or
//! when a run could not happen or wrote no report (always).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Parser;
use serde_json::json;

use super::gateway_images::{self, SuiteImages};
use super::gateway_report::Report;
use crate::cluster::{self, echo_basic, Cluster, GatewayChannel, Stack};
use crate::duet::DuetBuilder;

/// duet's namespace: its Lease and its pod.
pub const DUET_NAMESPACE: &str = "duet-gateway";
/// duet's pod and the selector it is started with.
const DUET_POD: &str = "duet-0";
const POD_LABEL: (&str, &str) = ("app", "duet-gateway");
/// The profiles whose counts are printed.
const PROFILES: [&str; 3] = ["GATEWAY-HTTP", "GATEWAY-GRPC", "GATEWAY-TLS"];

/// Which runs: the primary family of the dual-stack cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Primary {
    /// A dual-stack cluster whose primary family is IPv4 (report ipv4.yaml).
    Ipv4,
    /// A dual-stack cluster whose primary family is IPv6 (report ipv6.yaml).
    Ipv6,
    /// Both, IPv4 first.
    Both,
}

/// Which runs: the release channel of the Gateway API CRDs installed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Channels {
    /// The standard channel's CRDs (reports ipv4.yaml, ipv6.yaml).
    Standard,
    /// The experimental channel's CRDs, which bring the experimental features' tests (reports
    /// ipv4-experimental.yaml, ipv6-experimental.yaml).
    Experimental,
    /// Both, standard first.
    Both,
}

/// `duet-conformance gateway`.
#[derive(Debug, Parser)]
#[command(
    name = "duet-conformance gateway",
    bin_name = "duet-conformance gateway",
    about = "Run the upstream Gateway API conformance suite against duet on the test cluster, \
             on an IPv4-primary and an IPv6-primary dual-stack cluster"
)]
pub struct GatewayCli {
    /// The primary family of the dual-stack cluster of each run.
    #[arg(long, value_enum, default_value = "both")]
    pub family: Primary,
    /// The release channel of the Gateway API CRDs of each run.
    #[arg(long, value_enum, default_value = "both")]
    pub channel: Channels,
    /// Where the reports (ipv4.yaml, ipv6.yaml) and the logs go.
    #[arg(long, value_name = "DIR")]
    pub report_dir: PathBuf,
    /// The duet binary (default: `duet` next to this program).
    #[arg(long, value_name = "PATH")]
    pub duet: Option<PathBuf>,
    /// Only this test (the suite's -run-test).
    #[arg(long, value_name = "NAME")]
    pub run_test: Option<String>,
    /// Tests to skip, comma-separated (-skip-tests).
    #[arg(long, value_name = "NAMES")]
    pub skip_tests: Option<String>,
    /// Profiles, comma-separated (-conformance-profiles; default GATEWAY-HTTP,GATEWAY-GRPC,GATEWAY-TLS).
    #[arg(long, value_name = "NAMES")]
    pub conformance_profiles: Option<String>,
    /// Features claimed, comma-separated (-supported-features; default: their Core features).
    #[arg(long, value_name = "NAMES")]
    pub supported_features: Option<String>,
    /// Exit 0 even when tests fail (still 1 when a run cannot happen or writes no report).
    #[arg(long, alias = "allow-core-failures")]
    pub allow_failures: bool,
    /// Run the suite's pods as containers on a real node (kubelet, containerd, CNI, kube-proxy:
    /// conformance/node/build.sh), from the images its manifests name, built by images/build.sh
    /// and imported without a registry, instead of the stand-in kubelet's host processes.
    #[arg(long)]
    pub real_node: bool,
    /// More upstream suite flags, after `--` (e.g. -- -debug -timeout-config-overrides=...).
    #[arg(last = true, value_name = "SUITE_FLAGS")]
    pub suite_flags: Vec<String>,
}

impl GatewayCli {
    /// The flags passed to the suite.
    fn flags(&self) -> Vec<String> {
        let mut flags = Vec::new();
        for (name, value) in [
            ("run-test", &self.run_test),
            ("skip-tests", &self.skip_tests),
            ("conformance-profiles", &self.conformance_profiles),
            ("supported-features", &self.supported_features),
        ] {
            if let Some(v) = value {
                flags.push(format!("-{name}={v}"));
            }
        }
        flags.extend(self.suite_flags.iter().cloned());
        flags
    }

    /// The runs: (name, stack, channel), in order: per channel, each family.
    fn runs(&self) -> Vec<(&'static str, Stack, GatewayChannel)> {
        let families: &[(&str, Stack)] = match self.family {
            Primary::Ipv4 => &[("ipv4", Stack::Dual)],
            Primary::Ipv6 => &[("ipv6", Stack::DualIpv6)],
            Primary::Both => &[("ipv4", Stack::Dual), ("ipv6", Stack::DualIpv6)],
        };
        let channels: &[GatewayChannel] = match self.channel {
            Channels::Standard => &[GatewayChannel::Standard],
            Channels::Experimental => &[GatewayChannel::Experimental],
            Channels::Both => &[GatewayChannel::Standard, GatewayChannel::Experimental],
        };
        let name = |family: &str, channel: GatewayChannel| match (family, channel) {
            ("ipv4", GatewayChannel::Standard) => "ipv4",
            ("ipv6", GatewayChannel::Standard) => "ipv6",
            ("ipv4", _) => "ipv4-experimental",
            _ => "ipv6-experimental",
        };
        channels
            .iter()
            .flat_map(|&c| {
                families
                    .iter()
                    .map(move |&(f, stack)| (name(f, c), stack, c))
            })
            .collect()
    }
}

/// What one run needs.
#[derive(Clone, Debug)]
struct Run {
    name: &'static str,
    stack: Stack,
    channel: GatewayChannel,
    duet: PathBuf,
    bin: PathBuf,
    report_dir: PathBuf,
    flags: Vec<String>,
    /// With a real node: the image archives to import, and what they hold (printed).
    images: Option<(Vec<PathBuf>, Vec<String>)>,
}

/// Runs the suite per family; returns the exit code.
pub async fn main(cli: GatewayCli) -> anyhow::Result<i32> {
    let started = Instant::now();
    let duet = match &cli.duet {
        Some(p) => p.clone(),
        None => std::env::current_exe()?
            .parent()
            .context("no folder of this program")?
            .join("duet"),
    };
    anyhow::ensure!(duet.exists(), "no duet at {}", duet.display());
    anyhow::ensure!(
        cluster::loadbalancer::nft_available(),
        "nft is missing (Debian package nftables): the test cluster's load balancer cannot forward"
    );
    std::fs::create_dir_all(&cli.report_dir)?;
    let report_dir = cli.report_dir.canonicalize()?;
    cluster::build_control_plane()?;
    let bin = echo_basic::build()?;
    let images_dir = tempfile::Builder::new()
        .prefix("duet-gateway-images-")
        .tempdir()?;
    let images = if cli.real_node {
        Some(node_images(&bin, images_dir.path())?)
    } else {
        None
    };
    let mut failed_tests = Vec::new();
    let mut broken = Vec::new();
    for (name, stack, channel) in cli.runs() {
        let run = Run {
            name,
            stack,
            channel,
            duet: duet.clone(),
            bin: bin.clone(),
            report_dir: report_dir.clone(),
            flags: cli.flags(),
            images: images.clone(),
        };
        let t = Instant::now();
        let family = &name[..4];
        let channel = channel.name();
        println!(
            "== Gateway API conformance, {name}: dual-stack cluster, {family} primary, \
             {channel} channel"
        );
        match on_own_thread(run).await {
            Ok(report) => {
                let failed = print_counts(name, &report, &report_dir);
                failed_tests.extend(failed.into_iter().map(|t| format!("{name}: {t}")));
            }
            Err(e) => {
                println!("{name}: the run did not complete: {e:#}");
                broken.push(name);
            }
        }
        println!(
            "{name}: {:.1} s, report {}",
            t.elapsed().as_secs_f64(),
            report_dir.join(format!("{name}.yaml")).display()
        );
    }
    println!(
        "Gateway API conformance: {} failed tests (a failed setup counts one), {} runs \
         incomplete, {:.1} s",
        failed_tests.len(),
        broken.len(),
        started.elapsed().as_secs_f64()
    );
    if !broken.is_empty() || (!failed_tests.is_empty() && !cli.allow_failures) {
        return Ok(1);
    }
    Ok(0)
}

/// The suite's images for a real node, built into `out`: the archives and what they hold.
fn node_images(bin: &Path, out: &Path) -> anyhow::Result<(Vec<PathBuf>, Vec<String>)> {
    let images = SuiteImages::read(&gateway_images::module_dir()?)?;
    let archives = images.build(bin, &cluster::node::build()?, out)?;
    Ok((archives, images.describe()))
}

/// Prints a run's counts, the extended features it did not claim (and why its setup failed, if
/// it did); returns its failed tests, core and extended (`setup` for a failed setup).
fn print_counts(name: &str, report: &Report, report_dir: &Path) -> Vec<String> {
    for line in report
        .lines(&PROFILES)
        .into_iter()
        .chain(report.unsupported_lines())
    {
        println!("{line}");
    }
    let mut failed = report.failed();
    if !failed.is_empty() {
        println!("{name}: failed tests: {}", failed.join(", "));
    }
    if !report.ran() {
        let log = report_dir.join(format!("{name}.log"));
        let why = setup_failure(&std::fs::read_to_string(log).unwrap_or_default());
        println!("{name}: no test ran, the suite's setup failed: {why}");
        failed.push("setup".to_owned());
    }
    failed
}

/// One run on a thread of its own: the cluster's processes die with it.
async fn on_own_thread(run: Run) -> anyhow::Result<Report> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name(format!("gateway-{}", run.name))
        .spawn(move || {
            let result = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(anyhow::Error::from)
                .and_then(|rt| rt.block_on(one_run(&run)));
            let _ = tx.send(result);
        })
        .context("cannot start a run's thread")?;
    rx.await.context("the run's thread panicked")?
}

async fn one_run(run: &Run) -> anyhow::Result<Report> {
    let report = run.report_dir.join(format!("{}.yaml", run.name));
    let _ = std::fs::remove_file(&report);
    let cluster = Cluster::start(cluster::Options {
        stack: run.stack,
        gateway_api: true,
        gateway_channel: run.channel,
        echo_basic: run.images.is_none().then(|| run.bin.join("echo-basic")),
        real_node: run.images.is_some(),
        ..cluster::Options::default()
    })
    .await?;
    println!("control plane: {}", cluster.control_plane());
    if let (Some(node), Some((archives, what))) = (cluster.node(), &run.images) {
        println!("node: {}, load balancer: stand-in", node.versions());
        for archive in archives {
            cluster.import_image(archive)?;
        }
        what.iter().for_each(|line| println!("{line}"));
    }
    let api = cluster.api().await?;
    let pod_ips = duet_pod(&api, cluster.node().is_some()).await?;
    let mut duet = DuetBuilder::kube(&run.duet, cluster.kubeconfig())
        .args([
            "--election-namespace",
            DUET_NAMESPACE,
            "--gateway-pod-selector",
            &format!("{}={}", POD_LABEL.0, POD_LABEL.1),
        ])
        .env("POD_NAMESPACE", DUET_NAMESPACE)
        .env("POD_NAME", DUET_POD)
        .env("POD_IP", &pod_ips[0])
        .env("POD_IPS", &pod_ips.join(","))
        .die_with_parent()
        .start()
        .await?;
    let suite = run_suite(run, cluster.kubeconfig()).await;
    let duet_log = run.report_dir.join(format!("{}-duet.log", run.name));
    std::fs::write(&duet_log, duet.logs())?;
    duet.check_running()
        .with_context(|| format!("duet stopped during the run ({})", duet_log.display()))?;
    suite?;
    let yaml = std::fs::read_to_string(&report).with_context(|| {
        format!(
            "the suite wrote no report {} (its output: {})",
            report.display(),
            run.report_dir.join(format!("{}.log", run.name)).display()
        )
    })?;
    Report::parse(&yaml).with_context(|| format!("cannot read {}", report.display()))
}

/// Why the suite's setup failed, from its output: its assertion message and the last thing it
/// waited for (`... Gateway not Programmed yet`).
fn setup_failure(log: &str) -> String {
    let after = |line: &str, marker: &str| {
        line.split_once(marker)
            .map(|(_, rest)| rest.trim().to_owned())
    };
    let message = log
        .lines()
        .filter_map(|l| after(l, "Messages:"))
        .next_back()
        .unwrap_or_else(|| "no message in its output".to_owned());
    let waited = log
        .lines()
        .filter(|l| {
            l.contains("helpers.go") && (l.contains("not Programmed") || l.contains("not ready"))
        })
        .filter_map(|l| after(l, "Z: "))
        .next_back();
    match waited {
        Some(w) => format!("{message} (last: {w})"),
        None => message,
    }
}

/// Creates duet's namespace and pod and returns the pod's addresses, primary family first.
///
/// Stand-in kubelet: the pod gets an address of each family on the cluster namespace's loopback
/// and nothing runs in it. Real node: the pod is `hostNetwork` (its addresses are the node's,
/// where duet, a process of the node's network namespace, listens), its one container the
/// node's pause image.
async fn duet_pod(
    api: &crate::runner::kube_api::KubeApi,
    real_node: bool,
) -> anyhow::Result<Vec<String>> {
    api.create(json!({"apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": DUET_NAMESPACE}}))
        .await?;
    // No container ports: the kubelet listens on nothing of this pod (duet does).
    let spec = if real_node {
        json!({"hostNetwork": true, "containers": [{"name": "duet",
            "image": cluster::node::PAUSE_IMAGE, "imagePullPolicy": "Never"}]})
    } else {
        json!({"containers": [{"name": "duet", "image": "duet.dev/duet"}]})
    };
    api.create(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"namespace": DUET_NAMESPACE, "name": DUET_POD,
                     "labels": {POD_LABEL.0: POD_LABEL.1}},
        "spec": spec,
    }))
    .await?;
    crate::client::eventually("duet's pod runs", Duration::from_secs(60), || async {
        let pod = api
            .get("v1", "Pod", Some(DUET_NAMESPACE), DUET_POD)
            .await?
            .context("duet's pod is gone")?;
        let ips: Vec<String> = pod["status"]["podIPs"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|p| p["ip"].as_str().map(str::to_owned))
            .collect();
        anyhow::ensure!(!ips.is_empty(), "no podIPs yet");
        Ok(ips)
    })
    .await
}

/// The suite flags of a run's family order: the report's mode (`ipv4-primary`,
/// `ipv6-primary`: the reports of the two orders differ in name and mode only), and the addresses
/// GatewayStaticAddresses asks a Gateway for, of the primary family: one in the test cluster's
/// load-balancer pool, which it gives, and one outside it, which it cannot. (Flags given after
/// `--` come later and win.)
fn family_flags(stack: Stack) -> [String; 3] {
    let (mode, usable, unusable) = match stack {
        Stack::DualIpv6 | Stack::Ipv6 => ("ipv6-primary", "fd00:10:250::200", "fd00:10:251::200"),
        _ => ("ipv4-primary", "10.250.0.200", "10.251.0.200"),
    };
    [
        format!("-mode={mode}"),
        format!("-usable-address={usable}"),
        format!("-unusable-address={unusable}"),
    ]
}

/// `run.sh` inside the cluster namespace (this thread's); fails if it cannot run at all (its
/// exit status is the suite's and says nothing the report does not).
async fn run_suite(run: &Run, kubeconfig: &Path) -> anyhow::Result<()> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("gateway/run.sh");
    let log_path = run.report_dir.join(format!("{}.log", run.name));
    let log = std::fs::File::create(&log_path)?;
    let mut args = vec![
        script.to_string_lossy().into_owned(),
        kubeconfig.to_string_lossy().into_owned(),
        run.report_dir.to_string_lossy().into_owned(),
        run.name.to_owned(),
        "--".to_owned(),
    ];
    args.extend(family_flags(run.stack));
    args.extend(run.flags.iter().cloned());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let t = Instant::now();
    let mut child = cluster::command("bash", &args)?
        .env("DUET_GATEWAY_BIN", &run.bin)
        .env("DUET_GATEWAY_CHANNEL", run.channel.name())
        // The namespace has no network: the CRD installer finds the module in the cache.
        .env("GOPROXY", "off")
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .context("cannot run conformance/gateway/run.sh")?;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    println!(
        "{}: suite exited ({status}) after {:.1} s, output {}",
        run.name,
        t.elapsed().as_secs_f64(),
        log_path.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_setup_is_explained_from_the_suite_output() {
        let log = "    helpers.go:285: 2026-12-01T11:22:52.1Z: ns/a Gateway not Programmed yet\n\
                   \tMessages:   \terror waiting for ns namespaces to be ready\n";
        assert_eq!(
            setup_failure(log),
            "error waiting for ns namespaces to be ready (last: ns/a Gateway not Programmed yet)"
        );
        assert_eq!(setup_failure(""), "no message in its output");
    }

    #[test]
    fn named_flags_and_raw_flags_reach_the_suite() {
        let cli = GatewayCli::try_parse_from([
            "x",
            "--report-dir",
            "r",
            "--run-test",
            "HTTPRouteWeight",
            "--supported-features",
            "Gateway,HTTPRoute",
            "--",
            "-debug",
        ])
        .unwrap();
        assert_eq!(
            cli.flags(),
            [
                "-run-test=HTTPRouteWeight",
                "-supported-features=Gateway,HTTPRoute",
                "-debug"
            ]
        );
        let runs: Vec<_> = cli.runs().iter().map(|r| (r.0, r.2)).collect();
        assert_eq!(
            runs,
            [
                ("ipv4", GatewayChannel::Standard),
                ("ipv6", GatewayChannel::Standard),
                ("ipv4-experimental", GatewayChannel::Experimental),
                ("ipv6-experimental", GatewayChannel::Experimental),
            ],
            "both channels, each on both family orders, by default"
        );
        let one = GatewayCli::try_parse_from([
            "x",
            "--report-dir",
            "r",
            "--family",
            "ipv6",
            "--channel",
            "experimental",
        ])
        .unwrap();
        let runs: Vec<_> = one.runs().iter().map(|r| r.0).collect();
        assert_eq!(runs, ["ipv6-experimental"]);
        assert!(!cli.real_node, "the stand-in kubelet unless --real-node");
        let real = GatewayCli::try_parse_from(["x", "--real-node", "--report-dir", "r"]).unwrap();
        assert!(
            real.real_node && real.flags().is_empty(),
            "not a suite flag"
        );
        assert!(
            GatewayCli::try_parse_from(["x", "--family", "ipv5", "--report-dir", "r"]).is_err()
        );
        assert!(
            GatewayCli::try_parse_from(["x"]).is_err(),
            "--report-dir is required"
        );
    }
}
