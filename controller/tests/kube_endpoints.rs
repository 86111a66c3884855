//! Kubernetes mode end to end: which EndpointSlice addresses duet proxies to. On the real
//! control plane: the pods of a real Deployment, listed by the real endpointslice controller, are
//! served to clients of both families without any test-only flag; global multicast endpoints
//! (239.255.255.250, ff05::2, which the real API server accepts) are refused, each a
//! `ForbiddenEndpointAddress` diagnostic on `/debug/routes` and a Warning Event regarding its
//! EndpointSlice; on an IPv4-only and on an IPv6-only cluster the Service gets the cluster's one
//! family, its one slice, and clients of both families reach the pods over that family.
//! The real API server refuses slices with loopback, link-local, link-local multicast and
//! unspecified addresses (422, asserted), so they never reach duet here; duet's own refusal of
//! them is tested in `--manifests` mode (`e2e_endpoints.rs`), which reads the same slices from
//! files. API server reached over 127.0.0.1 and [::1].

mod kube_support;

use std::collections::BTreeSet;

use anyhow::Context;

use conformance::client;
use conformance::cluster::Stack;
use conformance::manifests::{endpoint_slice, service as selectorless, Endpoint};
use conformance::{Duet, Family, Ingress};
use kube_support::*;
use serde_json::Value;

const REASON: &str = "ForbiddenEndpointAddress";

/// A ready endpoint of pod `pod` (uid `uid-POD`) at `ip`.
fn endpoint(pod: &str, ip: &str) -> Endpoint {
    Endpoint {
        pod: pod.to_owned(),
        uid: format!("uid-{pod}"),
        ip: ip.parse().unwrap(),
        ready: true,
    }
}

/// An EndpointSlice of a Service `meta` for each address the real API server refuses
/// (`ValidateEndpointIP`): loopback, link-local, unspecified and link-local multicast, both
/// families.
fn invalid_slices(ns: &str) -> Vec<Value> {
    let v4 = ["127.0.0.1", "169.254.169.254", "0.0.0.0", "224.0.0.1"];
    let v6 = ["::1", "fe80::1", "::", "ff02::1"];
    let slices = v4
        .iter()
        .map(|ip| (Family::V4, ip))
        .chain(v6.iter().map(|ip| (Family::V6, ip)));
    slices
        .enumerate()
        .map(|(n, (family, ip))| {
            let name = format!("meta-{n}");
            endpoint_slice(ns, "meta", &name, family, "http", 80, &[endpoint("p", ip)])
        })
        .collect()
}

/// The `ForbiddenEndpointAddress` diagnostics on `/debug/routes`, as `slice address`.
async fn refused(duet: &Duet) -> anyhow::Result<BTreeSet<String>> {
    let routes = duet.debug_routes().await?;
    Ok(routes["diagnostics"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|d| d["reason"] == REASON)
        .map(|d| {
            let message = d["message"].as_str().unwrap_or_default();
            let address = message
                .strip_prefix("address ")
                .and_then(|m| m.split(' ').next())
                .unwrap_or(message);
            format!(
                "{} {address}",
                d["object"]["name"].as_str().unwrap_or_default()
            )
        })
        .collect())
}

async fn until_refused(duet: &Duet, want: &[&str]) -> anyhow::Result<()> {
    let want: BTreeSet<String> = want.iter().map(|s| (*s).to_owned()).collect();
    client::eventually("the refused endpoints are listed", LIVE, || async {
        let got = refused(duet).await?;
        anyhow::ensure!(got == want, "refused {got:?}");
        Ok(())
    })
    .await
}

/// Global multicast endpoints (the real API server refuses only link-local multicast).
fn multicast(ns: &str) -> Vec<Value> {
    vec![
        selectorless(ns, "mcast", &[("http", 8080)]),
        endpoint_slice(
            ns,
            "mcast",
            "mcast-ipv4",
            Family::V4,
            "http",
            80,
            &[endpoint("ssdp", "239.255.255.250")],
        ),
        endpoint_slice(
            ns,
            "mcast",
            "mcast-ipv6",
            Family::V6,
            "http",
            80,
            &[endpoint("site", "ff05::2")],
        ),
    ]
}

async fn forbidden_addresses_are_not_proxied_to(api_family: Family) -> anyhow::Result<()> {
    let env = env(Stack::Dual, &[&format!("ep-{api_family}")]).await?;
    let ns = env.ns.clone();
    env.web(&ns, "web", 1).await?;
    let web = env.ready_pods(&ns, "web", 1).await?;
    // What the real API server itself refuses never reaches duet: each slice of
    // `invalid_slices` is invalid (422).
    for slice in invalid_slices(&ns) {
        let refused = env.api.apply(slice.clone()).await;
        let message = format!("{:#}", refused.as_ref().err().context("accepted")?);
        anyhow::ensure!(message.contains("Invalid value"), "{slice}: {message}");
    }
    env.apply(&multicast(&ns)).await?;
    env.apply(&[Ingress::new(&ns, "web")
        .host("web.test", "web")
        .host("mcast.test", "mcast")
        .build()])
        .await?;

    // Kubernetes mode without the test-only flag: the real pods are served, multicast refused.
    let duet = env.duet(api_family, &[]).await?;
    let want = ["mcast-ipv4 239.255.255.250", "mcast-ipv6 ff05::2"];
    until_refused(&duet, &want).await?;
    until_pods(&duet, "web.test", &web).await?;
    until_status(&duet, "mcast.test", 503).await?;
    // The leader writes one Warning Event per refused endpoint, regarding its EndpointSlice.
    client::eventually("Events regard the EndpointSlices", LIVE, || async {
        let mut regarding: BTreeSet<String> = BTreeSet::new();
        for event in env.events(&ns).await? {
            if event["reason"] == REASON && event["regarding"]["kind"] == "EndpointSlice" {
                anyhow::ensure!(event["type"] == "Warning", "{event}");
                let name = event["regarding"]["name"].as_str().unwrap_or_default();
                let note = event["note"].as_str().unwrap_or_default();
                let address = note.split(' ').nth(1).unwrap_or_default();
                regarding.insert(format!("{name} {address}"));
            }
        }
        let want: BTreeSet<String> = want.iter().map(|s| (*s).to_owned()).collect();
        anyhow::ensure!(regarding == want, "Events for {regarding:?}");
        Ok(())
    })
    .await?;
    env.cluster.check_running()
}

#[tokio::test]
async fn forbidden_endpoint_addresses_are_dropped_api_on_ipv4() -> anyhow::Result<()> {
    forbidden_addresses_are_not_proxied_to(Family::V4).await
}

#[tokio::test]
async fn forbidden_endpoint_addresses_are_dropped_api_on_ipv6() -> anyhow::Result<()> {
    forbidden_addresses_are_not_proxied_to(Family::V6).await
}

/// On a single-stack cluster a `PreferDualStack` Service gets the cluster's family only, the
/// endpointslice controller writes a slice of that family only, and duet serves the pod to
/// clients of both families over it.
async fn single_stack_endpoints(stack: Stack) -> anyhow::Result<()> {
    let family = stack.families()[0];
    let env = env(stack, &[&format!("single-{family}")]).await?;
    let ns = env.ns.clone();
    env.web(&ns, "web", 2).await?;
    let pods = env.ready_pods(&ns, "web", 2).await?;
    let svc = env
        .api
        .get("v1", "Service", Some(&ns), "web")
        .await?
        .context("the Service")?;
    let want_family = match family {
        Family::V4 => "IPv4",
        Family::V6 => "IPv6",
    };
    anyhow::ensure!(
        svc["spec"]["ipFamilies"] == serde_json::json!([want_family]),
        "{}",
        svc["spec"]
    );
    let slices = env
        .api
        .list(
            "discovery.k8s.io/v1",
            "EndpointSlice",
            Some(&ns),
            "kubernetes.io/service-name=web",
        )
        .await?;
    let types: Vec<&str> = slices
        .iter()
        .filter_map(|s| s["addressType"].as_str())
        .collect();
    anyhow::ensure!(types == [want_family], "slices of {types:?}");
    env.apply(&[Ingress::new(&ns, "web").host("web.test", "web").build()])
        .await?;
    let duet = env.duet(family, &[]).await?;
    until_pods(&duet, "web.test", &pods).await?;
    for client_family in Family::BOTH {
        let echo = client::get(duet.http(client_family), "web.test", "/")
            .await?
            .echo()?;
        anyhow::ensure!(
            echo.family == family,
            "a {client_family} client reached the pod over {}",
            echo.family
        );
    }
    let refused = refused(&duet).await?;
    anyhow::ensure!(refused.is_empty(), "refused {refused:?}");
    env.cluster.check_running()
}

#[tokio::test]
async fn single_stack_ipv4_cluster_serves_the_ipv4_slice_to_both_families() -> anyhow::Result<()> {
    single_stack_endpoints(Stack::Ipv4).await
}

#[tokio::test]
async fn single_stack_ipv6_cluster_serves_the_ipv6_slice_to_both_families() -> anyhow::Result<()> {
    single_stack_endpoints(Stack::Ipv6).await
}
