//! End to end in `--manifests` mode with `--http3`, with aioquic as the client
//! (conformance/h3client): a Gateway's HTTPS listeners are also served over HTTP/3 on the same
//! port number over UDP, on 127.0.0.1 and [::1], with each listener's certificate by SNI and its
//! routes, to the pod of the client's family; the TCP answers of that port advertise it in
//! `Alt-Svc`. When the Gateway goes, its UDP sockets close. A UDP port another process holds
//! leaves TCP serving (without `Alt-Svc`), and is served once freed.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use conformance::client::eventually;
use conformance::duet::free_port;
use conformance::h3client::{self, hex};
use conformance::manifests::gateway_class;
use conformance::tls::{self, TestCert};
use conformance::{Duet, DuetBuilder, Echo, Family, Fleet, ManifestDir, PodSpec};
use serde_json::{json, Value};

const DUET: &str = env!("CARGO_BIN_EXE_duet");
const NS: &str = "gwh3";

/// A port free for TCP and UDP on both families.
fn free_tcp_and_udp_port() -> anyhow::Result<u16> {
    for _ in 0..20 {
        let port = free_port()?;
        let udp = |ip: IpAddr| dataplane::http3::bind(SocketAddr::new(ip, port));
        if udp(Ipv4Addr::UNSPECIFIED.into()).is_ok() && udp([0u16; 8].into()).is_ok() {
            return Ok(port);
        }
    }
    anyhow::bail!("no port free for TCP and UDP")
}

/// The GatewayClass, the certificates, Gateway `gw` with HTTPS listeners `a` (a.example.com)
/// and `wild` (*.example.com) on `port`, and a route to `gw-a` and `gw-wild` on each.
fn gateway(port: u16, a: &TestCert, wild: &TestCert) -> Vec<Value> {
    let https = |name: &str, host: &str| {
        json!({"name": name, "port": port, "protocol": "HTTPS", "hostname": host,
               "tls": {"certificateRefs": [{"name": name}]}})
    };
    let route = |listener: &str, service: &str| {
        json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
            "metadata": {"name": listener, "namespace": NS},
            "spec": {"parentRefs": [{"name": "gw", "sectionName": listener}],
                     "rules": [{"backendRefs": [{"name": service, "port": 8080}]}]}
        })
    };
    vec![
        gateway_class(),
        tls::secret(NS, "a", a),
        tls::secret(NS, "wild", wild),
        json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
            "metadata": {"name": "gw", "namespace": NS},
            "spec": {"gatewayClassName": "duet", "listeners": [
                https("a", "a.example.com"), https("wild", "*.example.com")]}
        }),
        route("a", "gw-a"),
        route("wild", "gw-wild"),
    ]
}

struct Setup {
    _fleets: Vec<Fleet>,
    dir: ManifestDir,
    duet: Duet,
    a: TestCert,
    wild: TestCert,
}

/// The two Services of dual-stack pods, the Gateway on `port`, duet with `--http3`.
async fn setup(port: u16) -> anyhow::Result<Setup> {
    let a = tls::cert(&["a.example.com"]);
    let wild = tls::cert(&["*.example.com"]);
    let dir = ManifestDir::new()?;
    let mut fleets = Vec::new();
    for service in ["gw-a", "gw-wild"] {
        let fleet = Fleet::start(NS, service, &[PodSpec::dual(&format!("{service}-pod"))])?;
        dir.write(&format!("svc-{service}.yaml"), &fleet.manifests())?;
        fleets.push(fleet);
    }
    dir.write("gateway.yaml", &gateway(port, &a, &wild))?;
    let duet = DuetBuilder::new(DUET, dir.path())
        .args(["--http3", "--http3-alt-svc-max-age", "10m"])
        .start()
        .await?;
    Ok(Setup {
        _fleets: fleets,
        dir,
        duet,
        a,
        wild,
    })
}

/// A GET of `/` for `sni` over HTTP/3 to `port` of `family`.
fn get(family: Family, port: u16, sni: &str) -> Value {
    json!({
        "connect": family.loopback().to_string(),
        "port": port,
        "sni": sni,
        "connect_timeout": 2,
        "steps": [{"request": {"method": "GET", "authority": sni, "path": "/"}}],
    })
}

/// The echo of the first response of a report, having checked it is a 200 from a pod reached
/// over the client's family.
fn echo(report: &Value, family: Family) -> anyhow::Result<Echo> {
    let response = &report["responses"][0];
    anyhow::ensure!(response["status"] == 200, "not 200: {report}");
    let echo: Echo = serde_json::from_str(response["text"].as_str().unwrap_or(""))?;
    anyhow::ensure!(
        echo.family == family,
        "{family}: pod reached over {}",
        echo.family
    );
    Ok(echo)
}

/// The report of `plan` once it gets an answer (the listener may not be bound yet).
async fn answered(plan: &Value) -> anyhow::Result<Value> {
    eventually("HTTP/3 answer", Duration::from_secs(15), || async {
        let report = h3client::run(plan).await?;
        anyhow::ensure!(report["responses"][0]["status"].is_u64(), "{report}");
        Ok(report)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_listeners_answer_over_http3_with_their_certificates_and_routes_until_gone(
) -> anyhow::Result<()> {
    let port = free_tcp_and_udp_port()?;
    let s = setup(port).await?;
    for family in Family::BOTH {
        for (sni, cert, service) in [
            ("a.example.com", &s.a, "gw-a"),
            ("x.y.example.com", &s.wild, "gw-wild"),
        ] {
            let report = answered(&get(family, port, sni)).await?;
            let seen = echo(&report, family)?;
            assert_eq!(seen.service, service, "{family} {sni}: {report}");
            assert_eq!(seen.host, sni, "{family}");
            assert_eq!(
                report["server_cert"],
                hex(&cert.der),
                "{family} {sni}: the listener's certificate"
            );
        }
        // Over TCP, the port's answer advertises HTTP/3 on the same port, and that serves.
        let mut plan = get(family, port, "a.example.com");
        plan["alt_svc_from_tcp"] = json!(true);
        let report = h3client::run(&plan).await?;
        assert_eq!(
            report["alt_svc"],
            format!("h3=\":{port}\"; ma=600"),
            "{family}: {report}"
        );
        assert_eq!(echo(&report, family)?.service, "gw-a", "{family}");
    }
    // The Gateway removed: its UDP sockets close (the port can be bound again) and nothing
    // answers HTTP/3 there.
    s.dir.remove("gateway.yaml")?;
    for family in Family::BOTH {
        eventually("UDP socket closed", Duration::from_secs(15), || async {
            let report = h3client::run(&get(family, port, "a.example.com")).await?;
            anyhow::ensure!(report["responses"] == json!([]), "{family}: {report}");
            anyhow::ensure!(report["error"].is_string(), "{family}: {report}");
            dataplane::http3::bind(SocketAddr::new(family.loopback(), port))?;
            Ok(())
        })
        .await?;
    }
    assert!(
        s.duet.logs().contains("Gateway listener closed"),
        "{}",
        s.duet.logs()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_udp_port_leaves_tcp_serving_and_serves_http3_once_free() -> anyhow::Result<()> {
    let port = free_tcp_and_udp_port()?;
    let busy = dataplane::http3::bind(SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), port))?;
    let s = setup(port).await?;
    let tcp = |family: Family| {
        let mut plan = get(family, port, "a.example.com");
        plan["alt_svc_from_tcp"] = json!(true);
        plan
    };
    for family in Family::BOTH {
        // TCP serves, without advertising HTTP/3 (neither family's UDP socket is bound).
        let report = eventually("HTTPS over TCP", Duration::from_secs(15), || {
            h3client::run(&tcp(family))
        })
        .await?;
        assert_eq!(report["alt_svc"], Value::Null, "{family}: {report}");
    }
    eventually("a warning", Duration::from_secs(10), || async {
        let logs = s.duet.logs();
        anyhow::ensure!(
            logs.lines()
                .any(|l| l.contains(" WARN ") && l.contains("Gateway HTTP/3 socket")),
            "{logs}"
        );
        Ok(())
    })
    .await?;
    drop(busy);
    for family in Family::BOTH {
        let report = answered(&get(family, port, "a.example.com")).await?;
        assert_eq!(echo(&report, family)?.service, "gw-a", "{family}");
        let report = h3client::run(&tcp(family)).await?;
        assert_eq!(
            report["alt_svc"],
            format!("h3=\":{port}\"; ma=600"),
            "{family}: {report}"
        );
    }
    Ok(())
}
