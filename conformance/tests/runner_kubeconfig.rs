//! `duet-conformance --kubeconfig`: the runner against a cluster it did not start. Here the
//! cluster is the real control plane (`conformance::cluster::shared`, the stand-in kubelet
//! running the pods), reached through the fault proxy, which records the runner's requests, and
//! duet started by the test (as an operator would deploy it), listening on one port on both
//! families; the runner must create the Deployments and Services through the API, wait for
//! them, read the status duet writes and reach it on `--http-port`, over IPv4 and IPv6.
//!
//! Needs the `duet` binary beside `duet-conformance` (`cargo test --workspace` builds both) and
//! the upstream features at `../shared/conformance/upstream-ingress/features`.

use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::time::Duration;

use conformance::cluster::{FaultProxy, Stack};
use conformance::duet::DuetBuilder;
use conformance::manifests::ingress_class;
use conformance::runner::cluster::{CONTROLLER, NAMESPACE_LABEL};
use conformance::runner::kube_api::KubeApi;
use conformance::Family;

/// Joins the binary's shared dual-stack cluster (the real control plane) and starts a fault
/// proxy in front of it, which records what the runner asks.
async fn cluster() -> anyhow::Result<(KubeApi, FaultProxy)> {
    let cluster = conformance::cluster::shared(Stack::Dual)?;
    cluster.enter()?;
    let api = cluster.api().await?;
    let proxy = FaultProxy::start(cluster.kubeconfig())?;
    Ok((api, proxy))
}

fn upstream(feature: &str) -> PathBuf {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/conformance/upstream-ingress/features")
        .join(feature);
    assert!(path.exists(), "{} is missing", path.display());
    path
}

/// A port free on both `127.0.0.1` and `[::1]`, as a real cluster's status addresses share one.
fn port_on_both_families() -> u16 {
    for _ in 0..50 {
        let v4 = TcpListener::bind(SocketAddr::new(Family::V4.loopback(), 0)).expect("bind v4");
        let port = v4.local_addr().expect("addr").port();
        if TcpListener::bind(SocketAddr::new(Family::V6.loopback(), port)).is_ok() {
            return port;
        }
    }
    panic!("no port free on both loopback addresses");
}

#[tokio::test]
async fn kubeconfig_mode_runs_the_upstream_features_against_a_cluster() -> anyhow::Result<()> {
    let runner = PathBuf::from(env!("CARGO_BIN_EXE_duet-conformance"));
    let duet_bin = runner.with_file_name("duet");
    assert!(
        duet_bin.exists(),
        "build duet first: {}",
        duet_bin.display()
    );

    // The cluster: the real control plane, the IngressClass and duet, as an operator would
    // deploy it; the runner's requests go through the proxy.
    let (api, proxy) = cluster().await?;
    api.apply(ingress_class("conformance", CONTROLLER)).await?;
    let (http, https) = (port_on_both_families(), port_on_both_families());
    let mut args = vec![
        "--publish-status-address".to_owned(),
        "127.0.0.1,::1".to_owned(),
        "--ingress-class".to_owned(),
        "conformance".to_owned(),
        "--election-namespace".to_owned(),
        "default".to_owned(),
    ];
    for family in Family::BOTH {
        for (flag, port) in [("--http-listen", http), ("--https-listen", https)] {
            args.push(flag.to_owned());
            args.push(SocketAddr::new(family.loopback(), port).to_string());
        }
    }
    let _duet = DuetBuilder::kube(&duet_bin, proxy.kubeconfig(Family::V6))
        .args(args)
        .die_with_parent()
        .start()
        .await?;
    let from = proxy.requests().len();

    let out = tokio::process::Command::new(&runner)
        .arg(upstream("default_backend.feature"))
        .arg(upstream("load_balancing.feature"))
        .arg(upstream("ingress_class.feature"))
        .arg("--kubeconfig")
        .arg(proxy.kubeconfig(Family::V4))
        .args(["--http-port", &http.to_string()])
        .args(["--https-port", &https.to_string()])
        .args(["--ingress-class-wait", "2", "--scale-settle", "2"])
        .args(["--family", "both"])
        // No duet beside it: a runner that tried to start one would fail.
        .args(["--duet", "/nonexistent/duet"])
        .output()
        .await?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "runner failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    // 6 default-backend examples, the load-balancing scenario and the ingress-class one, per
    // family.
    assert_eq!(
        stdout.lines().last(),
        Some("16 passed, 0 failed"),
        "{stdout}"
    );
    assert!(!stdout.contains("mini cluster"), "{stdout}");

    // The backends went through the API as real Deployments and Services ...
    // (duet's own requests are all reads and status writes.)
    let requests = &proxy.requests()[from..];
    for plural in ["deployments", "services", "ingresses", "namespaces"] {
        assert!(
            requests
                .iter()
                .any(|r| r.method == "POST" && r.path.ends_with(&format!("/{plural}"))),
            "the runner created no {plural}"
        );
    }
    assert!(
        requests
            .iter()
            .any(|r| r.method == "PATCH"
                && r.path.contains("/deployments/load-balancing-echo-service")),
        "the runner did not scale the Deployment"
    );
    // ... and every namespace it created is deleted (the namespace controller finishes it).
    let label = format!("{}={}", NAMESPACE_LABEL.0, NAMESPACE_LABEL.1);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let left = api.list("v1", "Namespace", None, &label).await?;
        if left.is_empty() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "namespaces left behind: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Ok(())
}

#[tokio::test]
async fn kubeconfig_mode_needs_the_ingress_class() -> anyhow::Result<()> {
    let (_api, proxy) = cluster().await?;
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_duet-conformance"))
        .arg(upstream("default_backend.feature"))
        .arg("--kubeconfig")
        .arg(proxy.kubeconfig(Family::V6))
        .args(["--ingress-class", "missing"])
        .output()
        .await?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("the cluster has no IngressClass \"missing\""),
        "{stderr}"
    );
    // Nothing was created.
    let requests = proxy.requests();
    assert!(!requests.is_empty());
    assert!(requests.iter().all(|r| r.method == "GET"), "{requests:?}");
    Ok(())
}

#[test]
fn a_bad_flag_exits_64_with_one_line() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_duet-conformance"))
        .args(["--family", "ipv5"])
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(64));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("ipv5"), "{stderr}");
}
