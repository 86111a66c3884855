//! End to end, HTTP/3 (`--http3`) over real UDP sockets on 127.0.0.1 and [::1], with aioquic as
//! the client (conformance/h3client/h3client.py, in a venv conformance/h3client/setup.sh makes on
//! demand): routing by host and path to the pod of the client's family, a POST body echoed, a
//! large response, an allow-list refusing the other family, Alt-Svc discovered over HTTPS/TCP
//! and then used, QUIC Retry, GOAWAY on shutdown, and a connection moving between families.

use std::time::Duration;

use conformance::h3client::{self, python};
use conformance::tls::{self, TestCert};
use conformance::{
    Duet, DuetBuilder, Echo, Family, Fleet, Ingress, ManifestDir, PathType, PodSpec, PortRef,
};
use serde_json::{json, Value};

const DUET: &str = env!("CARGO_BIN_EXE_duet");

/// Runs one plan through the aioquic client (see h3client.py) and returns its report.
async fn h3(plan: Value) -> anyhow::Result<Value> {
    h3client::run(&plan).await
}

/// A GET plan for `authority` + `path` to duet's HTTP/3 listener of `family`.
fn get(duet: &Duet, family: Family, authority: &str, path: &str) -> Value {
    json!({
        "connect": family.loopback().to_string(),
        "port": duet.https(family).port(),
        "sni": authority,
        "steps": [{"request": {"method": "GET", "authority": authority, "path": path}}],
    })
}

/// The echo JSON of a response of a report.
fn echo(response: &Value) -> anyhow::Result<Echo> {
    anyhow::ensure!(response["status"] == 200, "not 200: {response}");
    Ok(serde_json::from_str(
        response["text"].as_str().unwrap_or(""),
    )?)
}

/// The hex SHA-256 of `n` bytes of the clients' and echo's pattern (byte i is `i % 251`).
fn pattern_sha256(n: usize) -> String {
    let script = format!(
        "import hashlib; print(hashlib.sha256(bytes(i % 251 for i in range({n}))).hexdigest())"
    );
    let out = std::process::Command::new(python())
        .arg("-c")
        .arg(script)
        .output()
        .expect("python runs");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

struct Setup {
    _fleets: (Fleet, Fleet),
    _dir: ManifestDir,
    duet: Duet,
    _cert: TestCert,
}

/// Two Services of dual-stack pods (`echo` for `/`, `api` for `/api` of a.test), a host whose
/// allow-list admits IPv4 only, one certificate for all, and duet with `--http3` plus `args`.
async fn setup(args: &[&str]) -> anyhow::Result<Setup> {
    let echo = Fleet::start("h3", "echo", &[PodSpec::dual("web")])?;
    let api = Fleet::start("h3", "api", &[PodSpec::dual("api")])?;
    let dir = ManifestDir::with_class()?;
    dir.write("echo.yaml", &echo.manifests())?;
    dir.write("api.yaml", &api.manifests())?;
    let cert = tls::cert(&["a.test", "v4only.test"]);
    dir.write("secret.yaml", &[tls::secret("h3", "cert", &cert)])?;
    let http = || PortRef::Name("http".into());
    let routes = Ingress::new("h3", "routes")
        .annotation("duet.dev/proxy-body-size", "16m")
        .host("a.test", "echo")
        .path(Some("a.test"), PathType::Prefix, "/api", "api", http())
        .tls(&["a.test"], "cert");
    let v4only = Ingress::new("h3", "v4only")
        .nginx_annotations(&[("allowlist-source-range", "127.0.0.0/8")])
        .host("v4only.test", "echo")
        .tls(&["v4only.test"], "cert");
    dir.write("ingress.yaml", &[routes.build(), v4only.build()])?;
    let duet = DuetBuilder::new(DUET, dir.path())
        .args(["--http3"])
        .args(args.iter().copied())
        .start()
        .await?;
    Ok(Setup {
        _fleets: (echo, api),
        _dir: dir,
        duet,
        _cert: cert,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_by_host_and_path_to_the_pod_of_the_clients_family() -> anyhow::Result<()> {
    let s = setup(&[]).await?;
    let duet = &s.duet;
    for family in Family::BOTH {
        for (path, service) in [("/", "echo"), ("/api/x", "api")] {
            let report = h3(get(duet, family, "a.test", path)).await?;
            let response = &report["responses"][0];
            let seen = echo(response).unwrap_or_else(|e| panic!("{family} {path}: {e}"));
            assert_eq!(seen.service, service, "{family} {path}: {response}");
            assert_eq!(
                seen.family, family,
                "{family} {path}: the pod's address of the client's family"
            );
            assert_eq!(seen.host, "a.test", "{family} {path}");
            assert_eq!(seen.path, path, "{family} {path}");
            assert_eq!(
                seen.header("x-forwarded-proto").as_deref(),
                Some("https"),
                "{family}"
            );
            let client_ip = seen.header("x-real-ip").unwrap_or_default();
            assert_eq!(
                client_ip,
                family.loopback().to_string(),
                "{family}: the client's address"
            );
            assert_eq!(response["headers"]["server"], "duet", "{family}");
        }
    }
    // The access log says HTTP/3 and the client of each family.
    let logs = duet.logs();
    for family in Family::BOTH {
        let ip = family.loopback().to_string();
        let line = logs
            .lines()
            .filter(|l| l.contains("\"protocol\":\"HTTP/3.0\""))
            .find(|l| {
                l.contains(&format!("\"client_addr\":\"{ip}\"")) || l.contains(&format!("\"{ip}\""))
            });
        assert!(
            line.is_some(),
            "{family}: no HTTP/3 access log line from {ip}:\n{logs}"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_post_body_is_echoed_and_a_large_response_streams() -> anyhow::Result<()> {
    let s = setup(&[]).await?;
    let (upload, download) = (300_000, 6 << 20);
    let (upload_sha, download_sha) = (pattern_sha256(upload), pattern_sha256(download));
    for family in Family::BOTH {
        let mut plan = get(&s.duet, family, "a.test", "/");
        plan["steps"] = json!([
            {"request": {"method": "POST", "authority": "a.test", "path": "/up",
                         "headers": {"x-echo-body": "1"}, "body_size": upload}},
            {"request": {"method": "GET", "authority": "a.test", "path": "/down",
                         "headers": {"x-echo-response-bytes": download.to_string()}}},
        ]);
        let report = h3(plan).await?;
        let (post, large) = (&report["responses"][0], &report["responses"][1]);
        assert_eq!(post["status"], 200, "{family}: {post}");
        assert_eq!(post["length"], upload, "{family}: the body came back whole");
        assert_eq!(
            post["sha256"],
            upload_sha.as_str(),
            "{family}: the body came back unchanged"
        );
        assert_eq!(
            post["headers"]["x-echo-family"],
            family.to_string(),
            "{family}"
        );
        assert_eq!(large["status"], 200, "{family}: {}", large["text"]);
        assert_eq!(
            large["length"], download,
            "{family}: the large response whole"
        );
        assert_eq!(large["sha256"], download_sha.as_str(), "{family}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allow_list_refuses_the_other_family_over_http3() -> anyhow::Result<()> {
    let s = setup(&[]).await?;
    for family in Family::BOTH {
        let report = h3(get(&s.duet, family, "v4only.test", "/")).await?;
        let response = &report["responses"][0];
        let want = if family == Family::V4 { 200 } else { 403 };
        assert_eq!(response["status"], want, "{family}: {response}");
        if family == Family::V4 {
            assert_eq!(echo(response)?.family, family);
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alt_svc_over_tcp_leads_to_http3_of_the_same_family() -> anyhow::Result<()> {
    let s = setup(&["--http3-alt-svc-max-age", "10m"]).await?;
    for family in Family::BOTH {
        let mut plan = get(&s.duet, family, "a.test", "/");
        plan["alt_svc_from_tcp"] = json!(true);
        let report = h3(plan).await?;
        let port = s.duet.https(family).port();
        assert_eq!(
            report["alt_svc"],
            format!("h3=\":{port}\"; ma=600"),
            "{family}: {report}"
        );
        let seen = echo(&report["responses"][0])?;
        assert_eq!(
            seen.family, family,
            "{family}: HTTP/3 to the port Alt-Svc named"
        );
    }
    // Without --http3, no Alt-Svc.
    let dir = ManifestDir::with_class()?;
    let fleet = Fleet::start("h3", "echo", &[PodSpec::dual("web")])?;
    dir.write("echo.yaml", &fleet.manifests())?;
    let cert = tls::cert(&["a.test"]);
    dir.write("secret.yaml", &[tls::secret("h3", "cert", &cert)])?;
    let ingress = Ingress::new("h3", "routes")
        .host("a.test", "echo")
        .tls(&["a.test"], "cert");
    dir.write("ingress.yaml", &[ingress.build()])?;
    let plain = DuetBuilder::new(DUET, dir.path()).start().await?;
    for family in Family::BOTH {
        let mut plan = get(&plain, family, "a.test", "/");
        plan["alt_svc_from_tcp"] = json!(true);
        let report = h3(plan).await?;
        assert_eq!(report["alt_svc"], Value::Null, "{family}: {report}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_prove_their_address_with_a_retry_past_the_handshake_limit() -> anyhow::Result<()> {
    // 0: every new client is sent a Retry first (as under a handshake flood).
    let s = setup(&["--http3-retry-above", "0"]).await?;
    for family in Family::BOTH {
        let report = h3(get(&s.duet, family, "a.test", "/")).await?;
        assert_eq!(report["retry"], true, "{family}: {report}");
        assert_eq!(echo(&report["responses"][0])?.family, family);
    }
    let s = setup(&[]).await?;
    for family in Family::BOTH {
        let report = h3(get(&s.duet, family, "a.test", "/")).await?;
        assert_eq!(
            report["retry"], false,
            "{family}: no Retry below the limit: {report}"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_sends_goaway_finishes_the_request_in_flight_and_closes() -> anyhow::Result<()> {
    for family in Family::BOTH {
        let mut s = setup(&["--shutdown-delay", "0", "--drain-timeout", "10s"]).await?;
        let mut plan = get(&s.duet, family, "a.test", "/");
        plan["steps"] = json!([
            {"request": {"method": "GET", "authority": "a.test", "path": "/first"}},
            {"request": {"method": "GET", "authority": "a.test", "path": "/slow",
                         "headers": {"x-echo-delay-ms": "3000"}}},
            {"wait_close": 10},
        ]);
        let client = tokio::spawn(h3(plan));
        // SIGTERM while the slow request is in flight: once the first was answered (logged).
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while !s.duet.logs().contains("\"path\":\"/first\"") {
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "{family}: no first request"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        let exited = tokio::task::block_in_place(|| s.duet.terminate(Duration::from_secs(15)))?;
        let report = client.await??;
        assert!(exited, "{family}: duet did not exit");
        assert_eq!(report["goaway"], true, "{family}: {report}");
        assert_eq!(
            report["responses"][1]["status"], 200,
            "{family}: the request in flight finished: {report}"
        );
        assert_eq!(
            report["closed"]["error_code"], 0x100,
            "{family}: closed with H3_NO_ERROR: {report}"
        );
    }
    Ok(())
}

/// Each family has its own UDP socket and QUIC endpoint, so a client that moves its connection
/// to the other family's address reaches an endpoint that does not know it: its packets are
/// dropped, the client's request goes unanswered until it gives up, duet logs nothing above
/// debug, and every other client (new connections of both families) is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_moving_to_the_other_family_is_refused_cleanly() -> anyhow::Result<()> {
    let s = setup(&[]).await?;
    for (from, to) in [(Family::V4, Family::V6), (Family::V6, Family::V4)] {
        let mut plan = get(&s.duet, from, "a.test", "/");
        plan["steps"] = json!([
            {"request": {"method": "GET", "authority": "a.test", "path": "/before"}},
            {"migrate": to.loopback().to_string(), "port": s.duet.https(to).port()},
            {"request": {"method": "GET", "authority": "a.test", "path": "/after", "timeout": 3}},
        ]);
        let report = h3(plan).await?;
        assert_eq!(
            echo(&report["responses"][0])?.family,
            from,
            "{from}: {report}"
        );
        let moved = &report["responses"][1];
        assert!(
            moved["status"].is_null(),
            "{from}->{to}: answered after the move: {moved}"
        );
        assert_eq!(moved["error"], "timeout", "{from}->{to}: {report}");
        for family in Family::BOTH {
            let fresh = h3(get(&s.duet, family, "a.test", "/fresh")).await?;
            assert_eq!(
                echo(&fresh["responses"][0])?.family,
                family,
                "{from}->{to}, then {family}"
            );
        }
    }
    let logs = s.duet.logs();
    let alarming: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
        .collect();
    assert!(alarming.is_empty(), "{alarming:#?}");
    assert!(
        !logs.contains("\"path\":\"/after\""),
        "a request after the move was served"
    );
    Ok(())
}
