//! HTTP/3 on a Gateway in Kubernetes mode, on the real control plane (`conformance::cluster`
//! with the Gateway API CRDs and the stand-in load balancer, which forwards UDP ports as TCP
//! ones): with `--http3` the Gateway's Service lists its HTTPS listener port over UDP too, to
//! the same pod port, and its EndpointSlices the UDP port; aioquic (conformance/h3client)
//! reaches the route's pod over HTTP/3 at the Gateway's IPv4 and IPv6 load-balancer addresses on
//! the listener port, and the TCP answers there advertise that port (not the pod port).
//!
//! Needs root (namespaces), Go (the control plane and the CRD installer) and `nft` (package
//! nftables). Nothing is skipped: a missing piece fails the test.

mod kube_support;

use std::net::IpAddr;

use anyhow::Context;
use conformance::cluster::{loadbalancer, Cluster, Options, Stack};
use conformance::manifests::gateway_class;
use conformance::runner::kube_api::KubeApi;
use conformance::{client, h3client, tls, DuetBuilder, Echo, Family};
use kube_support::{DUET, LIVE};
use serde_json::{json, Value};

const GW: &str = "gateway.networking.k8s.io/v1";
const NS: &str = "gwh3";
const DUET_NS: &str = "duet";
const SELECTOR: &str = "app=duet-gw";
const HOST: &str = "gateway.test";

/// The cluster, its namespaces, the class, the certificate, the backend `web` (pod `web-0`), a
/// stand-in pod of duet's selector (its addresses are duet's: same network namespace), the
/// Gateway `first` with an HTTPS listener on 443 and a route to `web`.
async fn objects(api: &KubeApi, cert: &tls::TestCert) -> anyhow::Result<()> {
    for ns in [NS, DUET_NS] {
        api.create(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}))
            .await?;
    }
    let docs = [
        gateway_class(),
        tls::secret(NS, "cert", cert),
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"namespace": DUET_NS, "name": "duet-0", "labels": {"app": "duet-gw"}},
            "spec": {"containers": [{"name": "idle", "image": "duet.dev/echo",
                                     "ports": [{"containerPort": 9999}]}]},
        }),
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"namespace": NS, "name": "web-0", "labels": {"app": "web"}},
            "spec": {"containers": [{"name": "echo", "image": "duet.dev/echo",
                                     "ports": [{"name": "http", "containerPort": 8080}]}]},
        }),
        json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"namespace": NS, "name": "web"},
            "spec": {"ipFamilyPolicy": "PreferDualStack", "selector": {"app": "web"},
                     "ports": [{"name": "http", "port": 8080, "targetPort": "http"}]},
        }),
        json!({
            "apiVersion": GW, "kind": "Gateway", "metadata": {"namespace": NS, "name": "first"},
            "spec": {"gatewayClassName": "duet", "listeners": [
                {"name": "https", "port": 443, "protocol": "HTTPS",
                 "tls": {"certificateRefs": [{"name": "cert"}]}}]}
        }),
        json!({
            "apiVersion": GW, "kind": "HTTPRoute", "metadata": {"namespace": NS, "name": "web"},
            "spec": {"parentRefs": [{"name": "first"}], "hostnames": [HOST],
                     "rules": [{"backendRefs": [{"name": "web", "port": 8080}]}]},
        }),
    ];
    for doc in docs {
        api.create(doc).await?;
    }
    Ok(())
}

/// `(name, protocol, port, targetPort)` of the Service's ports.
fn service_ports(service: &Value) -> Vec<(String, String, u64, u64)> {
    let ports = service["spec"]["ports"].as_array().into_iter().flatten();
    ports
        .map(|p| {
            (
                p["name"].as_str().unwrap_or_default().to_owned(),
                p["protocol"].as_str().unwrap_or_default().to_owned(),
                p["port"].as_u64().unwrap_or(0),
                p["targetPort"].as_u64().unwrap_or(0),
            )
        })
        .collect()
}

fn lb_ips(service: &Value) -> Vec<IpAddr> {
    let ingress = service["status"]["loadBalancer"]["ingress"].as_array();
    ingress
        .into_iter()
        .flatten()
        .filter_map(|i| i["ip"].as_str()?.parse().ok())
        .collect()
}

/// A GET of `/` over HTTP/3 to `ip:443` (over TCP first when `alt_svc`).
fn get(ip: IpAddr, alt_svc: bool) -> Value {
    json!({
        "connect": ip.to_string(), "port": 443, "sni": HOST, "connect_timeout": 3,
        "alt_svc_from_tcp": alt_svc,
        "steps": [{"request": {"method": "GET", "authority": HOST, "path": "/"}}],
    })
}

#[tokio::test(flavor = "current_thread")]
async fn a_gateway_https_listener_is_reached_over_http3_through_its_service() -> anyhow::Result<()>
{
    anyhow::ensure!(
        loadbalancer::nft_available(),
        "nft is missing (Debian package nftables): the stand-in load balancer cannot forward"
    );
    let cluster = Cluster::start(Options {
        stack: Stack::Dual,
        gateway_api: true,
        ..Options::default()
    })
    .await?;
    let api = cluster.api().await?;
    let duet = DuetBuilder::kube(DUET, cluster.kubeconfig())
        .args([
            "--election-namespace",
            DUET_NS,
            "--election-lease-duration",
            "2s",
        ])
        .args(["--gateway-pod-selector", SELECTOR, "--http3"])
        .die_with_parent()
        .start()
        .await?;
    let cert = tls::cert(&[HOST]);
    objects(&api, &cert).await?;
    let service = client::eventually("the Gateway's Service", LIVE, || async {
        let s = api
            .get("v1", "Service", Some(NS), "duet-first")
            .await?
            .context("no Service yet")?;
        anyhow::ensure!(
            lb_ips(&s).len() == 2,
            "no LB addresses yet: {}",
            s["status"]
        );
        Ok(s)
    })
    .await
    .map_err(|e| e.context(format!("duet's log:\n{}", duet.logs())))?;
    let tcp_then_udp = |name: &str, proto: &str| (name.to_owned(), proto.to_owned(), 443, 20000);
    assert_eq!(
        service_ports(&service),
        [
            tcp_then_udp("port-443", "TCP"),
            tcp_then_udp("udp-443", "UDP")
        ]
    );
    for ip in lb_ips(&service) {
        let family = Family::of(&std::net::SocketAddr::new(ip, 443));
        // Through the load balancer's UDP port to duet's pod port.
        let report = client::eventually(&format!("HTTP/3 at {ip}:443"), LIVE, || {
            let run = h3client::run(&get(ip, false));
            async move {
                let report = run.await?;
                anyhow::ensure!(report["responses"][0]["status"] == 200, "{report}");
                Ok(report)
            }
        })
        .await
        .map_err(|e| e.context(format!("duet's log:\n{}", duet.logs())))?;
        let echo: Echo = serde_json::from_str(report["responses"][0]["text"].as_str().unwrap())?;
        assert_eq!(echo.pod, "web-0", "{ip}");
        assert_eq!(
            echo.family, family,
            "{ip}: the pod reached over the client's family"
        );
        // The pod is told the port the client reached (the listener's), not duet's pod port.
        assert_eq!(
            echo.headers.get("X-Forwarded-Port"),
            Some(&vec!["443".to_owned()]),
            "{ip}: over HTTP/3"
        );
        let to = std::net::SocketAddr::new(ip, 443);
        let (mut tcp, _) = client::Conn::https(to, Some(HOST), &["http/1.1"]).await?;
        let over_tcp = tcp.get(HOST, "/").await?.echo()?;
        assert_eq!(
            over_tcp.headers.get("X-Forwarded-Port"),
            Some(&vec!["443".to_owned()]),
            "{ip}: over TCP"
        );
        // Over TCP, the answer names the listener port, which leads to HTTP/3 again.
        let report = h3client::run(&get(ip, true)).await?;
        assert_eq!(report["alt_svc"], "h3=\":443\"; ma=3600", "{ip}: {report}");
        assert_eq!(report["responses"][0]["status"], 200, "{ip}: {report}");
    }
    Ok(())
}
