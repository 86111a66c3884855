//! Gateway API control side on the real control plane (`conformance::cluster` with the Gateway
//! API v1.6.3 standard CRDs and the stand-in load balancer): GatewayClasses accepted by
//! controller name; each Gateway of our class gets a dual-stack LoadBalancer Service (owned by
//! it, gone with it) whose addresses become `status.addresses` in the cluster's family order, on
//! an IPv4-primary and an IPv6-primary cluster; pod port assignments survive a duet restart;
//! a TCP connection to the Gateway's IPv4 and IPv6 address on the listener port reaches a pod of
//! duet's selector at the assigned port.
//!
//! Needs root (namespaces), Go (the control plane and the CRD installer) and `nft` (package
//! nftables, the load balancer's forwarding). Nothing is skipped: a missing piece fails the test.

mod kube_support;

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use conformance::cluster::{loadbalancer, Cluster, Options, Stack};
use conformance::runner::kube_api::KubeApi;
use conformance::{client, tls};
use conformance::{Duet, DuetBuilder, Family};
use kube_support::{DUET, LIVE};
use serde_json::{json, Value};

static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const GW: &str = "gateway.networking.k8s.io/v1";
const NS: &str = "gw";
/// duet's namespace (its Lease and its pods).
const DUET_NS: &str = "duet";
const SELECTOR: &str = "app=duet-gw";

async fn start(stack: Stack) -> anyhow::Result<(Cluster, KubeApi)> {
    anyhow::ensure!(
        loadbalancer::nft_available(),
        "nft is missing (Debian package nftables): the stand-in load balancer cannot forward"
    );
    let cluster = Cluster::start(Options {
        stack,
        gateway_api: true,
        ..Options::default()
    })
    .await?;
    let api = cluster.api().await?;
    for ns in [NS, DUET_NS] {
        api.create(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}))
            .await?;
    }
    Ok((cluster, api))
}

async fn duet(kubeconfig: &Path) -> anyhow::Result<Duet> {
    duet_with(kubeconfig, &[]).await
}

/// duet with `extra` arguments after the common ones.
async fn duet_with(kubeconfig: &Path, extra: &[&str]) -> anyhow::Result<Duet> {
    DuetBuilder::kube(DUET, kubeconfig)
        .args([
            "--election-namespace",
            DUET_NS,
            "--election-lease-duration",
            "2s",
            "--gateway-pod-selector",
            SELECTOR,
        ])
        .args(extra.iter().copied())
        .die_with_parent()
        .start()
        .await
}

fn class(name: &str, controller: &str) -> Value {
    json!({"apiVersion": GW, "kind": "GatewayClass", "metadata": {"name": name},
           "spec": {"controllerName": controller}})
}

fn gateway(name: &str, listeners: Value) -> Value {
    gateway_in(NS, name, listeners)
}

fn gateway_in(ns: &str, name: &str, listeners: Value) -> Value {
    json!({"apiVersion": GW, "kind": "Gateway", "metadata": {"namespace": ns, "name": name},
           "spec": {"gatewayClassName": "duet", "listeners": listeners}})
}

fn condition<'a>(conditions: &'a Value, kind: &str) -> Option<&'a Value> {
    conditions.as_array()?.iter().find(|c| c["type"] == kind)
}

async fn get(api: &KubeApi, kind: &str, ns: Option<&str>, name: &str) -> anyhow::Result<Value> {
    let api_version = if kind == "Service" { "v1" } else { GW };
    api.get(api_version, kind, ns, name)
        .await?
        .with_context(|| format!("{kind} {name} does not exist"))
}

/// Waits until `check` passes on the object.
async fn until<F>(
    api: &KubeApi,
    kind: &str,
    ns: Option<&str>,
    name: &str,
    what: &str,
    check: F,
) -> anyhow::Result<Value>
where
    F: Fn(&Value) -> anyhow::Result<()>,
{
    client::eventually(what, LIVE, || async {
        let object = get(api, kind, ns, name).await?;
        check(&object).with_context(|| format!("{kind} {name}: status {:#}", object["status"]))?;
        Ok(object)
    })
    .await
}

fn accepted_at(object: &Value, generation: &Value) -> anyhow::Result<()> {
    let c = condition(&object["status"]["conditions"], "Accepted").context("no Accepted")?;
    anyhow::ensure!(
        c["status"] == "True" && c["observedGeneration"] == *generation,
        "not accepted at {generation}"
    );
    Ok(())
}

#[tokio::test(flavor = "current_thread")]
async fn gateway_classes_of_our_controller_are_accepted_others_untouched() {
    let _one = ONE_AT_A_TIME.lock().await;
    let run = async {
        let (cluster, api) = start(Stack::Dual).await?;
        let _duet = duet(cluster.kubeconfig()).await?;
        api.create(class("duet", "duet.dev/gateway-controller"))
            .await?;
        api.create(class("other", "example.com/other")).await?;
        let ours = until(
            &api,
            "GatewayClass",
            None,
            "duet",
            "our class accepted",
            |c| {
                accepted_at(c, &c["metadata"]["generation"])?;
                let features = c["status"]["supportedFeatures"].as_array();
                let named = |n: &str| features.is_some_and(|f| f.iter().any(|x| x["name"] == n));
                anyhow::ensure!(
                    named("HTTPRoute") && named("GRPCRoute") && named("GatewayPort8080")
                );
                Ok(())
            },
        )
        .await?;
        // A spec change: the condition follows the generation.
        api.merge_patch(
            GW,
            "GatewayClass",
            None,
            "duet",
            &json!({"spec": {"description": "bumped"}}),
        )
        .await?;
        let before = ours["metadata"]["generation"].as_i64().unwrap_or(0);
        until(
            &api,
            "GatewayClass",
            None,
            "duet",
            "observedGeneration follows",
            |c| {
                anyhow::ensure!(c["metadata"]["generation"].as_i64() > Some(before));
                accepted_at(c, &c["metadata"]["generation"])
            },
        )
        .await?;
        let other = get(&api, "GatewayClass", None, "other").await?;
        anyhow::ensure!(
            condition(&other["status"]["conditions"], "Accepted")
                .is_none_or(|c| c["reason"] == "Pending"),
            "another controller's class was touched: {other:#}"
        );
        anyhow::Ok(())
    };
    run.await.unwrap();
}

/// The LB addresses of a Service in its family order, and its families.
fn lb_ips(service: &Value) -> Vec<String> {
    service["status"]["loadBalancer"]["ingress"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|i| i["ip"].as_str().map(str::to_owned))
        .collect()
}

fn target_ports(service: &Value) -> Vec<(u64, u64)> {
    service["spec"]["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            (
                p["port"].as_u64().unwrap_or(0),
                p["targetPort"].as_u64().unwrap_or(0),
            )
        })
        .collect()
}

/// A dual-stack backend in [`NS`]: the pod `web-0` and the Service `web` (port 8080).
async fn backend(api: &KubeApi) -> anyhow::Result<()> {
    api.create(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"namespace": NS, "name": "web-0", "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "echo", "image": "duet.dev/echo",
                                 "ports": [{"name": "http", "containerPort": 8080}]}]},
    }))
    .await?;
    api.create(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"namespace": NS, "name": "web"},
        "spec": {"ipFamilyPolicy": "PreferDualStack", "selector": {"app": "web"},
                 "ports": [{"name": "http", "port": 8080, "targetPort": "http"}]},
    }))
    .await?;
    Ok(())
}

/// An HTTPRoute in `ns` for `gateway.test` on listener `section` of `gw/first`, to `gw/web`.
fn http_route(ns: &str, name: &str, section: &str) -> Value {
    json!({
        "apiVersion": GW, "kind": "HTTPRoute", "metadata": {"namespace": ns, "name": name},
        "spec": {
            "parentRefs": [{"name": "first", "namespace": NS, "sectionName": section}],
            "hostnames": ["gateway.test"],
            "rules": [{"backendRefs": [{"name": "web", "namespace": NS, "port": 8080}]}],
        },
    })
}

/// The route status and listener counts the server stores: `gw/web` accepted with its refs
/// resolved; `elsewhere/stray` not allowed (the listener admits its own namespace only); the
/// `http` listener counts one route, `alt` none; the Gateway and `http` are programmed.
async fn route_status(api: &KubeApi, duet: &Duet) -> anyhow::Result<()> {
    let parent = |route: &Value| -> anyhow::Result<Value> {
        let parents = route["status"]["parents"]
            .as_array()
            .context("no parents")?;
        anyhow::ensure!(parents.len() == 1, "{parents:?}");
        let p = parents[0].clone();
        anyhow::ensure!(p["controllerName"] == "duet.dev/gateway-controller", "{p}");
        // As the route's spec holds it (the CRD defaults group and kind).
        let want = json!({"group": "gateway.networking.k8s.io", "kind": "Gateway",
                          "name": "first", "namespace": NS, "sectionName": "http"});
        anyhow::ensure!(p["parentRef"] == want, "{p}");
        Ok(p)
    };
    let cond_is = |p: &Value, kind: &str, status: &str, reason: &str, generation: &Value| {
        let c = condition(&p["conditions"], kind).with_context(|| format!("no {kind}"))?;
        anyhow::ensure!(
            c["status"] == status
                && c["reason"] == reason
                && c["observedGeneration"] == *generation,
            "{kind}: {c}"
        );
        Ok(())
    };
    until(api, "HTTPRoute", Some(NS), "web", "web accepted", |r| {
        let p = parent(r)?;
        let generation = &r["metadata"]["generation"];
        cond_is(&p, "Accepted", "True", "Accepted", generation)?;
        cond_is(&p, "ResolvedRefs", "True", "ResolvedRefs", generation)
    })
    .await
    .map_err(|e| e.context(format!("duet's log:\n{}", duet.logs())))?;
    until(
        api,
        "HTTPRoute",
        Some("elsewhere"),
        "stray",
        "stray refused",
        |r| {
            let p = parent(r)?;
            cond_is(
                &p,
                "Accepted",
                "False",
                "NotAllowedByListeners",
                &r["metadata"]["generation"],
            )
        },
    )
    .await?;
    until(
        api,
        "Gateway",
        Some(NS),
        "first",
        "attachedRoutes and Programmed",
        |g| {
            let listeners = g["status"]["listeners"]
                .as_array()
                .context("no listeners")?;
            let count = |name: &str| {
                listeners
                    .iter()
                    .find(|l| l["name"] == name)
                    .map(|l| l["attachedRoutes"].clone())
            };
            anyhow::ensure!(
                count("http") == Some(json!(1)) && count("alt") == Some(json!(0)),
                "counts"
            );
            let programmed =
                condition(&g["status"]["conditions"], "Programmed").context("Programmed")?;
            anyhow::ensure!(programmed["status"] == "True", "{programmed}");
            let http = listener_condition(g, "http", "Programmed").context("http Programmed")?;
            anyhow::ensure!(http["status"] == "True", "{http}");
            Ok(())
        },
    )
    .await?;
    Ok(())
}

/// A Gateway's Service and status on a cluster of `stack`; traffic; restart; deletion.
async fn gateway_addresses(stack: Stack) -> anyhow::Result<()> {
    let (cluster, api) = start(stack).await?;
    let mut duet = duet(cluster.kubeconfig()).await?;
    api.create(class("duet", "duet.dev/gateway-controller"))
        .await?;
    let listeners = json!([
        {"name": "http", "port": 80, "protocol": "HTTP"},
        {"name": "alt", "port": 8080, "protocol": "HTTP"},
        {"name": "bad", "port": 1111, "protocol": "INVALID"},
    ]);
    api.create(gateway("first", listeners)).await?;
    let families: Vec<&str> = stack
        .families()
        .iter()
        .map(|f| if *f == Family::V4 { "IPv4" } else { "IPv6" })
        .collect();
    let service = until(
        &api,
        "Service",
        Some(NS),
        "duet-first",
        "the Gateway's Service has LB addresses",
        |s| {
            anyhow::ensure!(
                s["spec"]["type"] == "LoadBalancer"
                    && s["spec"]["ipFamilyPolicy"] == "PreferDualStack"
            );
            anyhow::ensure!(s["spec"]["ipFamilies"] == json!(families), "families");
            anyhow::ensure!(lb_ips(s).len() == 2, "no LB addresses yet");
            Ok(())
        },
    )
    .await?;
    let owner = &service["metadata"]["ownerReferences"][0];
    anyhow::ensure!(
        owner["kind"] == "Gateway" && owner["name"] == "first",
        "{owner}"
    );
    let ports = target_ports(&service);
    anyhow::ensure!(ports == [(80, 20000), (8080, 20001)], "ports {ports:?}");
    let ips = lb_ips(&service);
    // LB ingress in the Service's family order, which is the cluster's.
    let first_family = ips[0].parse::<IpAddr>()?.is_ipv4();
    anyhow::ensure!(
        first_family == (stack.families()[0] == Family::V4),
        "{ips:?}"
    );
    let want: Vec<Value> = ips
        .iter()
        .map(|ip| json!({"type": "IPAddress", "value": ip}))
        .collect();
    let gw = until(
        &api,
        "Gateway",
        Some(NS),
        "first",
        "status.addresses are the LB addresses",
        |g| {
            anyhow::ensure!(g["status"]["addresses"] == json!(want), "addresses");
            accepted_at(g, &g["metadata"]["generation"])
        },
    )
    .await
    .map_err(|e| e.context(format!("duet's log:\n{}", duet.logs())))?;
    let accepted = condition(&gw["status"]["conditions"], "Accepted").context("Accepted")?;
    anyhow::ensure!(accepted["reason"] == "ListenersNotValid", "{accepted}");
    let bad = gw["status"]["listeners"]
        .as_array()
        .and_then(|l| l.iter().find(|l| l["name"] == "bad"))
        .context("no status of listener bad")?;
    let bad_accepted = condition(&bad["conditions"], "Accepted").context("Accepted")?;
    anyhow::ensure!(
        bad_accepted["status"] == "False" && bad_accepted["reason"] == "UnsupportedProtocol",
        "{bad}"
    );
    anyhow::ensure!(bad["supportedKinds"] == json!([]), "{bad}");

    // Traffic: duet binds the assigned pod ports; the load balancer sends each family's traffic
    // to the ready pod of duet's selector (a stand-in pod whose addresses are duet's here: same
    // network namespace), and duet routes it by the Gateway's listeners to the backend pod.
    api.create(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"namespace": DUET_NS, "name": "duet-0", "labels": {"app": "duet-gw"}},
        "spec": {"containers": [{"name": "idle", "image": "duet.dev/echo", "ports": [{"containerPort": 9999}]}]},
    }))
    .await?;
    backend(&api).await?;
    api.create(http_route(NS, "web", "http")).await?;
    api.create(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "elsewhere"}}))
        .await?;
    api.create(http_route("elsewhere", "stray", "http")).await?;
    for ip in &ips {
        let to = SocketAddr::new(ip.parse()?, 80);
        let echo = client::eventually(&format!("{to} reaches the backend"), LIVE, || async {
            let reply = client::get(to, "gateway.test", "/").await?;
            client::expect_status(&reply, 200)?;
            reply.echo()
        })
        .await
        .map_err(|e| e.context(format!("duet's log:\n{}", duet.logs())))?;
        anyhow::ensure!(echo.pod == "web-0", "{echo:?}");
        anyhow::ensure!(
            echo.family == Family::of(&to),
            "{to} reached the pod over {echo:?}"
        );
        // Another host is no route of the listener's: duet's own 404.
        let reply = client::get(to, "other.test", "/").await?;
        anyhow::ensure!(
            reply.status == 404 && reply.header("server") == Some("duet"),
            "{to}"
        );
    }
    route_status(&api, &duet).await?;

    // Nothing is rewritten in a loop: the status written is the status read back.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let writes = duet
        .logs()
        .matches("Gateway status written gateway=gw/first ")
        .count();
    anyhow::ensure!(
        (1..10).contains(&writes),
        "{writes} status writes:\n{}",
        duet.logs()
    );

    // A second, younger Gateway; then duet stops, the first Gateway goes, duet starts again:
    // the second keeps its ports (a fresh allocation would give it 20000).
    api.create(gateway(
        "second",
        json!([{"name": "http", "port": 80, "protocol": "HTTP"}]),
    ))
    .await?;
    let second = until(
        &api,
        "Service",
        Some(NS),
        "duet-second",
        "second Service",
        |s| {
            anyhow::ensure!(
                target_ports(s) == [(80, 20002)],
                "ports {:?}",
                target_ports(s)
            );
            Ok(())
        },
    )
    .await?;
    anyhow::ensure!(
        duet.terminate(Duration::from_secs(10))?,
        "duet did not stop"
    );
    api.delete(GW, "Gateway", Some(NS), "first").await?;
    client::eventually(
        "the first Gateway's Service is deleted with it",
        LIVE,
        || async {
            let left = api.get("v1", "Service", Some(NS), "duet-first").await?;
            anyhow::ensure!(left.is_none(), "still there");
            Ok(())
        },
    )
    .await?;
    let _duet = self::duet(cluster.kubeconfig()).await?;
    api.merge_patch(GW, "Gateway", Some(NS), "second", &json!({"spec": {"listeners": [
        {"name": "http", "port": 80, "protocol": "HTTP"}, {"name": "more", "port": 81, "protocol": "HTTP"}]}}))
        .await?;
    until(
        &api,
        "Service",
        Some(NS),
        "duet-second",
        "second keeps 20002 and adds a port",
        |s| {
            anyhow::ensure!(
                target_ports(s) == [(80, 20002), (81, 20000)],
                "ports {:?}",
                target_ports(s)
            );
            Ok(())
        },
    )
    .await?;
    anyhow::ensure!(
        second["metadata"]["uid"]
            == get(&api, "Service", Some(NS), "duet-second").await?["metadata"]["uid"]
    );
    Ok(())
}

#[tokio::test(flavor = "current_thread")]
async fn gateway_service_and_addresses_ipv4_primary() {
    let _one = ONE_AT_A_TIME.lock().await;
    gateway_addresses(Stack::Dual).await.unwrap();
}

#[tokio::test(flavor = "current_thread")]
async fn gateway_service_and_addresses_ipv6_primary() {
    let _one = ONE_AT_A_TIME.lock().await;
    gateway_addresses(Stack::DualIpv6).await.unwrap();
}

/// The condition `kind` of listener `name` of a Gateway.
fn listener_condition<'a>(gateway: &'a Value, name: &str, kind: &str) -> Option<&'a Value> {
    let listeners = gateway["status"]["listeners"].as_array()?;
    condition(
        &listeners.iter().find(|l| l["name"] == name)?["conditions"],
        kind,
    )
}

fn resolved_refs_reason(gateway: &Value, listener: &str, want: &str) -> anyhow::Result<()> {
    let c = listener_condition(gateway, listener, "ResolvedRefs").context("no ResolvedRefs")?;
    anyhow::ensure!(c["reason"] == want, "ResolvedRefs is {c}");
    Ok(())
}

#[tokio::test(flavor = "current_thread")]
async fn https_certificates_in_another_namespace_need_a_reference_grant() {
    let _one = ONE_AT_A_TIME.lock().await;
    let run = async {
        let (cluster, api) = start(Stack::Dual).await?;
        let _duet = duet(cluster.kubeconfig()).await?;
        api.create(class("duet", "duet.dev/gateway-controller"))
            .await?;
        api.create(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "certs"}}))
            .await?;
        api.create(tls::secret("certs", "cert", &tls::cert(&["example.org"])))
            .await?;
        api.create(tls::secret_raw(
            "certs",
            "garbage",
            b"not a certificate",
            b"nor a key",
        ))
        .await?;
        let https = |name: &str| {
            json!([
                {"name": "http", "port": 80, "protocol": "HTTP"},
                {"name": "https", "port": 443, "protocol": "HTTPS",
                 "tls": {"certificateRefs": [{"name": name, "namespace": "certs"}]}},
            ])
        };
        api.create(gateway("tls", https("cert"))).await?;
        until(
            &api,
            "Gateway",
            Some(NS),
            "tls",
            "RefNotPermitted without a grant",
            |g| resolved_refs_reason(g, "https", "RefNotPermitted"),
        )
        .await?;
        let service = get(&api, "Service", Some(NS), "duet-tls").await?;
        anyhow::ensure!(
            target_ports(&service) == [(80, 20000)],
            "{:?}",
            target_ports(&service)
        );
        // A grant for another Secret does not do; one for every Secret of the namespace does.
        let grant = |name: &str, to: Value| {
            json!({
                "apiVersion": GW, "kind": "ReferenceGrant",
                "metadata": {"namespace": "certs", "name": name},
                "spec": {"from": [{"group": "gateway.networking.k8s.io", "kind": "Gateway", "namespace": NS}],
                         "to": [to]},
            })
        };
        api.create(grant(
            "other",
            json!({"group": "", "kind": "Secret", "name": "other"}),
        ))
        .await?;
        api.create(gateway("tls-other", https("cert"))).await?;
        until(
            &api,
            "Gateway",
            Some(NS),
            "tls-other",
            "still RefNotPermitted",
            |g| resolved_refs_reason(g, "https", "RefNotPermitted"),
        )
        .await?;
        api.create(grant("all", json!({"group": "", "kind": "Secret"})))
            .await?;
        until(
            &api,
            "Gateway",
            Some(NS),
            "tls",
            "resolved with the grant",
            |g| resolved_refs_reason(g, "https", "ResolvedRefs"),
        )
        .await?;
        until(
            &api,
            "Service",
            Some(NS),
            "duet-tls",
            "port 443 served",
            |s| {
                anyhow::ensure!(
                    target_ports(s) == [(80, 20000), (443, 20001)],
                    "{:?}",
                    target_ports(s)
                );
                Ok(())
            },
        )
        .await?;
        for (gw, secret) in [("tls-garbage", "garbage"), ("tls-missing", "missing")] {
            api.create(gateway(gw, https(secret))).await?;
            until(
                &api,
                "Gateway",
                Some(NS),
                gw,
                "InvalidCertificateRef",
                |g| resolved_refs_reason(g, "https", "InvalidCertificateRef"),
            )
            .await?;
        }
        anyhow::Ok(())
    };
    run.await.unwrap();
}

/// On a cluster without the Gateway API (no CRDs), duet says Gateway support is off, instead of
/// watching kinds the API server does not serve and logging their failures forever.
#[tokio::test(flavor = "current_thread")]
async fn without_the_gateway_api_gateway_support_is_off() {
    let _one = ONE_AT_A_TIME.lock().await;
    let cluster = Cluster::start(Options::default()).await.unwrap();
    let api = cluster.api().await.unwrap();
    api.create(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": DUET_NS}}))
        .await
        .unwrap();
    let duet = duet(cluster.kubeconfig()).await.unwrap();
    client::eventually("Gateway support off, logged", LIVE, || async {
        anyhow::ensure!(
            duet.logs()
                .contains("Gateway support is off until duet restarts"),
            "not logged yet"
        );
        Ok(())
    })
    .await
    .unwrap();
    assert!(!duet.logs().contains("Gateway API watch failed"));
}

/// With `--watch-namespace`, a Gateway of duet's class in another namespace is not duet's: duet
/// serves none of its routes, so it must not get a Service, a status or pod ports that the
/// watched namespace's Gateways then lack. It is created first and its namespace sorts first, so
/// without the rule it would take pod port 20000.
#[tokio::test(flavor = "current_thread")]
async fn gateways_outside_the_watched_namespaces_are_left_alone() {
    let _one = ONE_AT_A_TIME.lock().await;
    let run = async {
        let (cluster, api) = start(Stack::Dual).await?;
        let outside = "another";
        api.create(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": outside}}))
            .await?;
        let duet = duet_with(cluster.kubeconfig(), &["--watch-namespace", NS]).await?;
        api.create(class("duet", "duet.dev/gateway-controller"))
            .await?;
        let listeners = json!([{"name": "http", "port": 80, "protocol": "HTTP"}]);
        api.create(gateway_in(outside, "stray", listeners.clone()))
            .await?;
        api.create(gateway("inside", listeners)).await?;
        let service = until(
            &api,
            "Service",
            Some(NS),
            "duet-inside",
            "the watched Gateway's Service has LB addresses",
            |s| {
                anyhow::ensure!(lb_ips(s).len() == 2, "no LB addresses yet");
                Ok(())
            },
        )
        .await
        .map_err(|e| e.context(format!("duet's log:\n{}", duet.logs())))?;
        let ports = target_ports(&service);
        anyhow::ensure!(ports == [(80, 20000)], "ports {ports:?}");
        until(&api, "Gateway", Some(NS), "inside", "accepted", |g| {
            accepted_at(g, &g["metadata"]["generation"])
        })
        .await?;
        // Reconciles run one at a time; give a late one for the stray Gateway time to show.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let stray = get(&api, "Gateway", Some(outside), "stray").await?;
        anyhow::ensure!(
            stray["status"]["addresses"].is_null()
                && condition(&stray["status"]["conditions"], "Accepted")
                    .is_none_or(|c| c["reason"] == "Pending"),
            "the unwatched Gateway got a status: {:#}",
            stray["status"]
        );
        let service = api
            .get("v1", "Service", Some(outside), "duet-stray")
            .await?;
        anyhow::ensure!(service.is_none(), "the unwatched Gateway got a Service");
        anyhow::Ok(())
    };
    run.await.unwrap();
}

/// `spec.addresses` with one IPv6 and one IPv4 address on an IPv4-primary cluster: the Service
/// asks the load balancer for both (IPv6 first, as the Gateway lists them), the Gateway's status
/// lists exactly those two and clients of each family reach the backend pod over their own
/// family through them. Asking for one IPv4 address instead gives the Gateway a single-stack
/// IPv4 Service (made again: a Service's primary family cannot change) and only that address.
#[tokio::test(flavor = "current_thread")]
async fn a_gateway_asking_for_an_address_of_each_family_gets_both() {
    let _one = ONE_AT_A_TIME.lock().await;
    let run = async {
        let (cluster, api) = start(Stack::Dual).await?;
        let duet = duet(cluster.kubeconfig()).await?;
        api.create(class("duet", "duet.dev/gateway-controller"))
            .await?;
        let mut gw = gateway(
            "first",
            json!([{"name": "http", "port": 80, "protocol": "HTTP"}]),
        );
        gw["spec"]["addresses"] = json!([
            {"type": "IPAddress", "value": "fd00:10:250::77"},
            {"value": "10.250.0.77"},
        ]);
        api.create(gw).await?;
        api.create(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"namespace": DUET_NS, "name": "duet-0", "labels": {"app": "duet-gw"}},
            "spec": {"containers": [{"name": "idle", "image": "duet.dev/echo", "ports": [{"containerPort": 9999}]}]},
        }))
        .await?;
        backend(&api).await?;
        api.create(http_route(NS, "web", "http")).await?;
        let service = until(&api, "Service", Some(NS), "duet-first", "both asked", |s| {
            anyhow::ensure!(
                s["spec"]["ipFamilies"] == json!(["IPv6", "IPv4"]),
                "families"
            );
            anyhow::ensure!(s["spec"]["ipFamilyPolicy"] == "RequireDualStack");
            anyhow::ensure!(
                lb_ips(s) == ["fd00:10:250::77", "10.250.0.77"],
                "not given yet"
            );
            Ok(())
        })
        .await
        .map_err(|e| e.context(format!("duet's log:\n{}", duet.logs())))?;
        let annotations = &service["metadata"]["annotations"];
        anyhow::ensure!(
            annotations["metallb.io/loadBalancerIPs"] == "fd00:10:250::77,10.250.0.77",
            "{annotations}"
        );
        let want = json!([
            {"type": "IPAddress", "value": "fd00:10:250::77"},
            {"type": "IPAddress", "value": "10.250.0.77"},
        ]);
        until(
            &api,
            "Gateway",
            Some(NS),
            "first",
            "status lists both",
            |g| {
                anyhow::ensure!(g["status"]["addresses"] == want, "addresses");
                let programmed = condition(&g["status"]["conditions"], "Programmed");
                anyhow::ensure!(
                    programmed.is_some_and(|c| c["status"] == "True"),
                    "programmed"
                );
                Ok(())
            },
        )
        .await?;
        for ip in ["fd00:10:250::77", "10.250.0.77"] {
            let to = SocketAddr::new(ip.parse()?, 80);
            let echo = client::eventually(&format!("{to} reaches the backend"), LIVE, || async {
                let reply = client::get(to, "gateway.test", "/").await?;
                client::expect_status(&reply, 200)?;
                reply.echo()
            })
            .await
            .map_err(|e| e.context(format!("duet's log:\n{}", duet.logs())))?;
            anyhow::ensure!(
                echo.family == Family::of(&to),
                "{to} reached the pod over {echo:?}"
            );
        }
        let first_uid = service["metadata"]["uid"].clone();
        api.merge_patch(
            GW,
            "Gateway",
            Some(NS),
            "first",
            &json!({"spec": {"addresses": [
            {"type": "IPAddress", "value": "10.250.0.78"}]}}),
        )
        .await?;
        until(
            &api,
            "Gateway",
            Some(NS),
            "first",
            "only the IPv4 address",
            |g| {
                let want = json!([{"type": "IPAddress", "value": "10.250.0.78"}]);
                anyhow::ensure!(g["status"]["addresses"] == want, "addresses");
                Ok(())
            },
        )
        .await
        .map_err(|e| e.context(format!("duet's log:\n{}", duet.logs())))?;
        let service = get(&api, "Service", Some(NS), "duet-first").await?;
        anyhow::ensure!(
            service["spec"]["ipFamilies"] == json!(["IPv4"]),
            "{service}"
        );
        anyhow::ensure!(
            service["metadata"]["uid"] != first_uid,
            "the Service was not made again"
        );
        anyhow::Ok(())
    };
    run.await.unwrap();
}
