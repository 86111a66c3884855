//! The Gateway API suite's echo pods on the test cluster: with `Options::echo_basic`, the stand-in
//! kubelet runs pods of `registry.k8s.io/gateway-api/echo-basic` as the real `echo-basic` (built
//! from the pinned suite module by `conformance/gateway/build.sh`), each in a network namespace
//! of its own joined to the cluster's by a veth pair, on a dual-stack cluster of each primary
//! family:
//! - an HTTP pod answers as itself (downward API `POD_NAME`, `NAMESPACE`) on its IPv4 and its
//!   IPv6 address, directly and through a LoadBalancer Service's addresses of both families;
//! - a gRPC pod (`GRPC_ECHO_SERVER`) listens on both addresses (`echo-basic` listens on
//!   `0.0.0.0:3000` with Go's network `tcp`, which Go opens as one dual-stack IPv6 socket);
//! - a pod with a secret volume waits for its Secret, then gets the Secret's files: its HTTPS
//!   port (which `echo-basic` opens only when it can read the certificate) accepts connections
//!   on both families;
//! - every other pod is still the in-process echo server;
//! - a deleted pod's program and network go (its address stops answering).
//!
//! Needs root, Go, iproute2, util-linux and nft. Nothing is skipped: a missing piece fails.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use anyhow::Context;
use conformance::cluster::{echo_basic, Cluster, Options, Stack};
use conformance::runner::kube_api::KubeApi;
use conformance::{client, tls, Echo};
use serde_json::{json, Value};
use tokio::net::TcpStream;

static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const NS: &str = "eb";
const IMAGE: &str = "registry.k8s.io/gateway-api/echo-basic:v1.5.1";
const WAIT: Duration = Duration::from_secs(60);

/// A Deployment of one pod of `image`, with the suite's downward API env plus `env`.
fn deployment(name: &str, image: &str, env: Value, extra: Value) -> Value {
    let mut container = json!({
        "name": name, "image": image,
        "env": [
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        ],
    });
    for e in env.as_array().into_iter().flatten() {
        container["env"].as_array_mut().unwrap().push(e.clone());
    }
    let mut spec = json!({"containers": [container]});
    if let Some(obj) = extra.as_object() {
        for (k, v) in obj {
            if k == "volumeMounts" {
                spec["containers"][0][k] = v.clone();
            } else {
                spec[k] = v.clone();
            }
        }
    }
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"namespace": NS, "name": name},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}}, "spec": spec}},
    })
}

/// The app's one pod once it runs and is ready: (name, addresses in podIPs order).
async fn running_pod(api: &KubeApi, app: &str) -> anyhow::Result<(String, Vec<IpAddr>)> {
    client::eventually(&format!("a ready pod of {app}"), WAIT, || async {
        let pods = api
            .list("v1", "Pod", Some(NS), &format!("app={app}"))
            .await?;
        let pod = pods
            .iter()
            .find(|p| p["metadata"]["deletionTimestamp"].is_null())
            .context("no pod")?;
        let ready = pod["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Ready" && c["status"] == "True");
        anyhow::ensure!(ready, "not ready: {}", pod["status"]);
        let ips = pod["status"]["podIPs"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|p| p["ip"].as_str()?.parse().ok())
            .collect();
        Ok((
            pod["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            ips,
        ))
    })
    .await
}

/// GET over a socket with no source chosen (the test client binds a loopback source, which
/// cannot leave the namespace over a pod's veth; duet's upstream sockets bind none either).
async fn get(to: SocketAddr, path: &str) -> anyhow::Result<Echo> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(to))
        .await
        .with_context(|| format!("connecting to {to} timed out"))??;
    let request = format!("GET {path} HTTP/1.1\r\nHost: echo.test\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut reply = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut reply)).await??;
    let text = String::from_utf8_lossy(&reply);
    let (head, body) = text.split_once("\r\n\r\n").context("no end of head")?;
    anyhow::ensure!(head.starts_with("HTTP/1.1 200"), "{to}: {head}");
    serde_json::from_str(body).with_context(|| format!("{to}: {body}"))
}

async fn accepts(addr: SocketAddr) -> bool {
    matches!(
        tokio::time::timeout(Duration::from_secs(2), TcpStream::connect(addr)).await,
        Ok(Ok(_))
    )
}

async fn echo_basic_pods(stack: Stack) -> anyhow::Result<()> {
    let bin = echo_basic::build()?;
    let cluster = Cluster::start(Options {
        stack,
        echo_basic: Some(bin.join("echo-basic")),
        ..Options::default()
    })
    .await?;
    let api = cluster.api().await?;
    api.create(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}))
        .await?;
    api.create(deployment("http", IMAGE, json!([]), json!({})))
        .await?;
    api.create(deployment(
        "grpc",
        IMAGE,
        json!([{"name": "GRPC_ECHO_SERVER", "value": "1"}]),
        json!({}),
    ))
    .await?;
    api.create(deployment(
        "tls",
        IMAGE,
        json!([{"name": "TLS_SERVER_CERT", "value": "/etc/secret-volume/crt"},
               {"name": "TLS_SERVER_PRIVKEY", "value": "/etc/secret-volume/key"}]),
        json!({
            "volumeMounts": [{"name": "secret-volume", "mountPath": "/etc/secret-volume"}],
            "volumes": [{"name": "secret-volume", "secret": {"secretName": "certs",
                "items": [{"key": "tls.crt", "path": "crt"}, {"key": "tls.key", "path": "key"}]}}],
        }),
    ))
    .await?;
    let mut inproc = deployment("inproc", "duet.dev/echo", json!([]), json!({}));
    inproc["spec"]["template"]["spec"]["containers"][0]["ports"] = json!([{"containerPort": 8080}]);
    api.create(inproc).await?;
    api.create(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"namespace": NS, "name": "http"},
        "spec": {"type": "LoadBalancer", "ipFamilyPolicy": "PreferDualStack",
                 "selector": {"app": "http"},
                 "ports": [{"name": "http", "port": 80, "targetPort": 3000}]},
    }))
    .await?;

    let (http_pod, http_ips) = running_pod(&api, "http").await?;
    let want_v4_first = stack.families()[0] == conformance::Family::V4;
    anyhow::ensure!(
        http_ips.len() == 2 && http_ips[0].is_ipv4() == want_v4_first,
        "pod addresses {http_ips:?}"
    );
    for ip in &http_ips {
        let echo = get(SocketAddr::new(*ip, 3000), "/x").await?;
        anyhow::ensure!(
            echo.pod == http_pod && echo.namespace == NS && echo.path == "/x",
            "{ip}: {echo:?}"
        );
    }
    // Through the load balancer, each family.
    let lb: Vec<IpAddr> = client::eventually("LB addresses", WAIT, || async {
        let s = api
            .get("v1", "Service", Some(NS), "http")
            .await?
            .context("no Service")?;
        let ips: Vec<IpAddr> = s["status"]["loadBalancer"]["ingress"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|i| i["ip"].as_str()?.parse().ok())
            .collect();
        anyhow::ensure!(ips.len() == 2, "{}", s["status"]);
        Ok(ips)
    })
    .await?;
    for ip in &lb {
        let to = SocketAddr::new(*ip, 80);
        let echo = client::eventually(&format!("{to} reaches the pod"), WAIT, || async {
            get(to, "/").await
        })
        .await?;
        anyhow::ensure!(echo.pod == http_pod, "{to}: {echo:?}");
    }

    let (_, grpc_ips) = running_pod(&api, "grpc").await?;
    for ip in &grpc_ips {
        // echo-basic's gRPC server listens on "0.0.0.0:3000" with network "tcp", which Go
        // opens as a dual-stack IPv6 socket: it serves both families.
        anyhow::ensure!(
            accepts(SocketAddr::new(*ip, 3000)).await,
            "gRPC echo-basic on {ip} refuses connections"
        );
    }
    // The TLS pod waits for its Secret (created after it, as the suite does), then runs.
    client::eventually("the TLS pod waits for its Secret", WAIT, || async {
        let pods = api.list("v1", "Pod", Some(NS), "app=tls").await?;
        let waiting = pods.iter().any(|p| {
            p["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| {
                    c["reason"] == "ContainerCreating" && c["message"] == "waiting for Secret certs"
                })
        });
        anyhow::ensure!(waiting, "{pods:?}");
        Ok(())
    })
    .await?;
    let cert = tls::cert(&["tls.example.com"]);
    api.create(tls::secret(NS, "certs", &cert)).await?;
    let (_, tls_ips) = running_pod(&api, "tls").await?;
    for ip in &tls_ips {
        let to = SocketAddr::new(*ip, 8443);
        client::eventually(&format!("HTTPS on {to}"), WAIT, || async {
            anyhow::ensure!(accepts(to).await, "refused");
            Ok(())
        })
        .await?;
    }
    let (inproc_pod, inproc_ips) = running_pod(&api, "inproc").await?;
    for ip in &inproc_ips {
        let echo = get(SocketAddr::new(*ip, 8080), "/").await?;
        // The in-process echo reports the socket it answered on; echo-basic does not.
        anyhow::ensure!(
            echo.pod == inproc_pod && echo.local.ip() == *ip,
            "{ip}: {echo:?}"
        );
    }

    // A deleted pod's program and network go.
    api.delete("apps/v1", "Deployment", Some(NS), "http")
        .await?;
    for ip in &http_ips {
        let to = SocketAddr::new(*ip, 3000);
        client::eventually(&format!("{to} stops answering"), WAIT, || async {
            anyhow::ensure!(!accepts(to).await, "still answers");
            Ok(())
        })
        .await?;
    }
    Ok(())
}

#[tokio::test(flavor = "current_thread")]
async fn echo_basic_pods_on_an_ipv4_primary_cluster() {
    let _one = ONE_AT_A_TIME.lock().await;
    echo_basic_pods(Stack::Dual).await.unwrap();
}

#[tokio::test(flavor = "current_thread")]
async fn echo_basic_pods_on_an_ipv6_primary_cluster() {
    let _one = ONE_AT_A_TIME.lock().await;
    echo_basic_pods(Stack::DualIpv6).await.unwrap();
}
