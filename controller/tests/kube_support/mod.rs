//! Shared helpers of the `kube_*` tests: the real `duet` binary in Kubernetes mode against the
//! test API server, on 127.0.0.1 or [::1].

#![allow(dead_code)] // each test binary uses a subset

use std::collections::BTreeSet;
use std::time::Duration;

use conformance::apiserver::ApiServer;
use conformance::client;
use conformance::manifests::{ingress_class, CONTROLLER};
use conformance::{Duet, DuetBuilder, Family};
use serde_json::Value;

pub const DUET: &str = env!("CARGO_BIN_EXE_duet");

/// How long a change may take to go live on a loaded 2-core machine (the target is far less).
pub const LIVE: Duration = Duration::from_secs(15);

/// A test API server on the loopback address of `family`, with our IngressClass `duet`.
pub fn api(family: Family) -> anyhow::Result<ApiServer> {
    let api = ApiServer::start(family.loopback())?;
    api.apply(ingress_class("duet", CONTROLLER))?;
    Ok(api)
}

/// Creates or replaces every object.
pub fn apply(api: &ApiServer, objects: &[Value]) -> anyhow::Result<()> {
    for object in objects {
        api.apply(object.clone())
            .map_err(|e| anyhow::anyhow!("apply failed: {e:?}"))?;
    }
    Ok(())
}

/// The test-only flag every Kubernetes-mode test passes: the test pods (`Fleet`) listen on
/// 127.0.0.1 and ::1, which Kubernetes mode refuses to proxy to without it.
pub const LOOPBACK_PODS: &str = "--allow-loopback-endpoints";

/// `duet serve --kubeconfig` against `api` with [`LOOPBACK_PODS`] and extra flags; waits for
/// /readyz.
pub async fn duet(api: &ApiServer, args: &[&str]) -> anyhow::Result<Duet> {
    DuetBuilder::kube(DUET, api.kubeconfig())
        .args([LOOPBACK_PODS])
        .args(args.iter().copied())
        .start()
        .await
}

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
pub async fn until_pods(duet: &Duet, host: &str, pods: &[&str]) -> anyhow::Result<()> {
    let want: BTreeSet<String> = pods.iter().map(|p| (*p).to_owned()).collect();
    client::eventually(&format!("{host} served by {pods:?}"), LIVE, || async {
        let got = pods_serving(duet, host, 4 * pods.len()).await?;
        anyhow::ensure!(got == want, "served by {got:?}");
        Ok(())
    })
    .await
}

/// `status.loadBalancer.ingress` of an Ingress as the API holds it, as `ip`/`hostname` strings.
pub fn status_addresses(api: &ApiServer, namespace: &str, name: &str) -> Vec<String> {
    let Some(ingress) = api.get("networking.k8s.io/v1", "Ingress", Some(namespace), name) else {
        return Vec::new();
    };
    ingress["status"]["loadBalancer"]["ingress"]
        .as_array()
        .map(|entries| {
            entries
                .iter()
                .filter_map(|e| e["ip"].as_str().or_else(|| e["hostname"].as_str()))
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// Waits until an Ingress's status lists exactly `want`.
pub async fn until_status_addresses(
    api: &ApiServer,
    namespace: &str,
    name: &str,
    want: &[&str],
) -> anyhow::Result<()> {
    client::eventually(
        &format!("status of Ingress {namespace}/{name} is {want:?}"),
        LIVE,
        || async {
            let got = status_addresses(api, namespace, name);
            anyhow::ensure!(got == want, "status is {got:?}");
            Ok(())
        },
    )
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
