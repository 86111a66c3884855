//! The mini cluster's stand-in deployment and endpoint controllers: a Deployment and its Service
//! created through the API become echo pods reachable over IPv4 and IPv6 at the addresses of
//! per-family EndpointSlices, scaling adds and removes pods, annotated pods get exactly their
//! families, and deleting the namespace stops the pods.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use conformance::apiserver::ApiServer;
use conformance::client::{self, Conn};
use conformance::runner::standin::{StandIn, PODS_ANNOTATION};
use conformance::Family;
use serde_json::{json, Value};

fn deployment(name: &str, replicas: u64, pods: Option<&str>) -> Value {
    let mut d = json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{
                    "name": "echo",
                    "image": "ignored",
                    "env": [{"name": "SERVICE_NAME", "value": "svc"}],
                }]},
            },
        },
    });
    if let Some(pods) = pods {
        d["metadata"]["annotations"] = json!({ PODS_ANNOTATION: pods });
    }
    d
}

fn service(selects: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "svc", "namespace": "ns"},
        "spec": {
            "selector": {"app": selects},
            "ports": [{"name": "http", "port": 8080, "targetPort": 3000}],
        },
    })
}

/// The (pod, address) pairs of the Service's slices.
fn endpoints(api: &ApiServer) -> BTreeSet<(String, SocketAddr)> {
    let mut out = BTreeSet::new();
    for slice in api.list("discovery.k8s.io/v1", "EndpointSlice") {
        if slice["metadata"]["labels"]["kubernetes.io/service-name"] != "svc" {
            continue;
        }
        assert_eq!(slice["ports"][0]["name"], "http", "{slice}");
        let port = slice["ports"][0]["port"].as_u64().unwrap() as u16;
        for e in slice["endpoints"].as_array().unwrap() {
            let ip: IpAddr = e["addresses"][0].as_str().unwrap().parse().unwrap();
            let family = Family::of(&SocketAddr::new(ip, 0));
            assert_eq!(
                slice["addressType"],
                if family == Family::V4 { "IPv4" } else { "IPv6" }
            );
            let pod = e["targetRef"]["name"].as_str().unwrap().to_owned();
            out.insert((pod, SocketAddr::new(ip, port)));
        }
    }
    out
}

/// Polls until the slices name `pods` pods and the Deployment reports them available.
async fn wait_pods(
    api: &ApiServer,
    name: &str,
    pods: usize,
) -> anyhow::Result<Vec<(String, SocketAddr)>> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let eps = endpoints(api);
        let names: BTreeSet<&String> = eps.iter().map(|(p, _)| p).collect();
        let d = api
            .get("apps/v1", "Deployment", Some("ns"), name)
            .context("no Deployment")?;
        if names.len() == pods && d["status"]["availableReplicas"] == pods {
            return Ok(eps.into_iter().collect());
        }
        if Instant::now() > deadline {
            bail!(
                "not {pods} pods after 10 s: {eps:?}, status {}",
                d["status"]
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The pod and family that answer at an address.
async fn echo_at(addr: SocketAddr) -> anyhow::Result<(String, Family)> {
    let reply = client::get(addr, "svc", "/").await?;
    let echo = reply.echo()?;
    assert_eq!(echo.service, "svc");
    Ok((echo.pod, echo.family))
}

#[tokio::test]
async fn deployments_become_reachable_pods_and_slices() -> anyhow::Result<()> {
    let api = Arc::new(ApiServer::start(Family::V6.loopback())?);
    let _standin = StandIn::start(api.clone());
    api.apply(service("web"))?;
    api.apply(deployment("web", 3, None))?;

    let eps = wait_pods(&api, "web", 3).await?;
    assert_eq!(eps.len(), 6, "one address per pod and family: {eps:?}");
    for (pod, addr) in &eps {
        assert_eq!(echo_at(*addr).await?, (pod.clone(), Family::of(addr)));
    }

    // Scale down to 1: the first pod stays, the others stop serving.
    let mut d = api.get("apps/v1", "Deployment", Some("ns"), "web").unwrap();
    d["spec"]["replicas"] = json!(1);
    api.apply(d)?;
    let left = wait_pods(&api, "web", 1).await?;
    let kept = &left[0].0;
    assert!(eps.iter().any(|(p, _)| p == kept));
    for (pod, addr) in &eps {
        if pod != kept {
            assert!(
                Conn::http1(*addr).await.is_err(),
                "{pod} still serves at {addr}"
            );
        }
    }

    // Pods of chosen families.
    api.apply(deployment(
        "shaped",
        2,
        Some(r#"[{"name":"only4","ipv4":"listen","ipv6":"absent"},{"name":"half","ipv4":"closed","ipv6":"listen"}]"#),
    ))?;
    let mut svc = service("shaped");
    svc["metadata"]["name"] = json!("svc");
    api.apply(svc)?;
    let eps = wait_pods(&api, "shaped", 2).await?;
    let addr = |pod: &str, family: Family| {
        eps.iter()
            .find(|(p, a)| p == pod && Family::of(a) == family)
            .map(|(_, a)| *a)
    };
    assert_eq!(addr("only4", Family::V6), None);
    assert_eq!(
        echo_at(addr("only4", Family::V4).unwrap()).await?,
        ("only4".into(), Family::V4)
    );
    assert_eq!(
        echo_at(addr("half", Family::V6).unwrap()).await?,
        ("half".into(), Family::V6)
    );
    assert!(
        Conn::http1(addr("half", Family::V4).unwrap())
            .await
            .is_err(),
        "a closed port must refuse connections"
    );

    // The namespace goes: its pods stop.
    api.delete("v1", "Namespace", None, "ns")?;
    let deadline = Instant::now() + Duration::from_secs(10);
    let v6 = addr("half", Family::V6).unwrap();
    while Conn::http1(v6).await.is_ok() {
        assert!(
            Instant::now() < deadline,
            "pod half still serves after its namespace went"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}
