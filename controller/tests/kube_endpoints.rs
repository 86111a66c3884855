//! Kubernetes mode end to end: EndpointSlice addresses duet never proxies to. Loopback pods
//! (127.0.0.1, ::1) are dropped unless `--allow-loopback-endpoints` (the test-only flag);
//! unspecified, link-local (169.254.169.254, fe80::/10) and multicast addresses always. Each
//! dropped endpoint is a `ForbiddenEndpointAddress` diagnostic on `/debug/routes` and a Warning
//! Event regarding its EndpointSlice. Clients of both families, API server on 127.0.0.1 and [::1].

mod kube_support;

use std::collections::BTreeSet;

use conformance::client;
use conformance::manifests::{endpoint_slice, service, Endpoint};
use conformance::{Duet, DuetBuilder, Family, Fleet, Ingress, PodSpec};
use kube_support::*;
use serde_json::Value;

const REASON: &str = "ForbiddenEndpointAddress";

/// A Service `meta` whose slices list only addresses duet always refuses.
fn refused_everywhere() -> Vec<Value> {
    let endpoint = |pod: &str, ip: &str| Endpoint {
        pod: pod.to_owned(),
        uid: format!("uid-{pod}"),
        ip: ip.parse().unwrap(),
        ready: true,
    };
    vec![
        service("kube", "meta", &[("http", 8080)]),
        endpoint_slice(
            "kube",
            "meta",
            "meta-ipv4",
            Family::V4,
            "http",
            80,
            &[
                endpoint("metadata", "169.254.169.254"),
                endpoint("zero", "0.0.0.0"),
                endpoint("mcast4", "224.0.0.1"),
            ],
        ),
        endpoint_slice(
            "kube",
            "meta",
            "meta-ipv6",
            Family::V6,
            "http",
            80,
            &[
                endpoint("linklocal", "fe80::1"),
                endpoint("zero6", "::"),
                endpoint("mcast6", "ff02::1"),
            ],
        ),
    ]
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

/// Every endpoint address of the EndpointSlices among `manifests`, as `slice address`.
fn slice_endpoints(manifests: &[Value]) -> Vec<String> {
    manifests
        .iter()
        .filter(|m| m["kind"] == "EndpointSlice")
        .flat_map(|slice| {
            let name = slice["metadata"]["name"].as_str().unwrap_or_default();
            slice["endpoints"]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|e| e["addresses"].as_array().into_iter().flatten())
                .map(move |a| format!("{name} {}", a.as_str().unwrap_or_default()))
        })
        .collect()
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

const ALWAYS: [&str; 6] = [
    "meta-ipv4 0.0.0.0",
    "meta-ipv4 169.254.169.254",
    "meta-ipv4 224.0.0.1",
    "meta-ipv6 ::",
    "meta-ipv6 fe80::1",
    "meta-ipv6 ff02::1",
];

async fn forbidden_addresses_are_not_proxied_to(api_family: Family) -> anyhow::Result<()> {
    let api = api(api_family)?;
    let pods = Fleet::start("kube", "web", &[PodSpec::dual("only")])?;
    apply(&api, &pods.manifests())?;
    apply(&api, &refused_everywhere())?;
    apply(
        &api,
        &[Ingress::new("kube", "web")
            .host("web.test", "web")
            .host("meta.test", "meta")
            .build()],
    )?;

    // Kubernetes mode without the test-only flag: the loopback pod is refused too.
    let strict = DuetBuilder::kube(DUET, api.kubeconfig())
        .args(["--election-namespace", "default"])
        .start()
        .await?;
    // Every endpoint of the fleet's slices (its loopback pod, both families) is refused too.
    let loopback = slice_endpoints(&pods.manifests());
    assert_eq!(
        loopback.len(),
        2,
        "one loopback pod of each family: {loopback:?}"
    );
    let mut want: Vec<&str> = ALWAYS.to_vec();
    want.extend(loopback.iter().map(String::as_str));
    until_refused(&strict, &want).await?;
    until_status(&strict, "web.test", 503).await?;
    until_status(&strict, "meta.test", 503).await?;
    // The leader writes one Warning Event per refused endpoint, regarding its EndpointSlice.
    client::eventually("Events regard the EndpointSlices", LIVE, || async {
        let mut regarding: BTreeSet<String> = BTreeSet::new();
        for event in api.list("events.k8s.io/v1", "Event") {
            if event["reason"] == REASON && event["regarding"]["kind"] == "EndpointSlice" {
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
    drop(strict);

    // With the flag, loopback pods are served over both families; the rest is still refused.
    let lenient = duet(&api, &["--election-namespace", "default"]).await?;
    until_refused(&lenient, &ALWAYS).await?;
    until_status(&lenient, "web.test", 200).await?;
    until_status(&lenient, "meta.test", 503).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forbidden_endpoint_addresses_are_dropped_api_on_ipv4() -> anyhow::Result<()> {
    forbidden_addresses_are_not_proxied_to(Family::V4).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forbidden_endpoint_addresses_are_dropped_api_on_ipv6() -> anyhow::Result<()> {
    forbidden_addresses_are_not_proxied_to(Family::V6).await
}
