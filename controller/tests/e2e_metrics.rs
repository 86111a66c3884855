//! End to end, over real sockets on 127.0.0.1 and [::1]: `/metrics` on both admin listeners
//! (checked by Prometheus's own `promtool check metrics`), request counters by client and
//! upstream family, connect failures, family fallbacks and ejections when a pod's IPv6 port is
//! closed, series of a deleted Ingress leaving the exposition, the JSON access log for clients
//! of both families, and a real Prometheus server scraping duet over both families.

use std::io::Write as _;
use std::net::{SocketAddr, TcpListener};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{bail, ensure, Context};
use conformance::client::{self, eventually};
use conformance::{Duet, DuetBuilder, Family, Fleet, Ingress, ManifestDir, PodSpec, Port};
use serde_json::Value;

const DUET: &str = env!("CARGO_BIN_EXE_duet");

struct Setup {
    fleet: Fleet,
    duet: Duet,
    _dir: ManifestDir,
}

async fn setup(pods: &[PodSpec], args: &[&str]) -> anyhow::Result<Setup> {
    let fleet = Fleet::start("e2e", "echo", pods)?;
    let dir = ManifestDir::with_class()?;
    dir.write("echo.yaml", &fleet.manifests())?;
    dir.write(
        "ingress.yaml",
        &[Ingress::new("e2e", "web").host("m.test", "echo").build()],
    )?;
    let duet = DuetBuilder::new(DUET, dir.path())
        .args(args.iter().copied())
        .start()
        .await?;
    Ok(Setup {
        fleet,
        duet,
        _dir: dir,
    })
}

/// Sums the samples of `name` whose labels include every pair of `labels` (Prometheus text).
fn sum(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let mut found = None;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        let (label_part, value) = match rest.strip_prefix('{') {
            Some(r) => match r.rsplit_once("} ") {
                Some((l, v)) => (l, v),
                None => continue,
            },
            None => match rest.strip_prefix(' ') {
                Some(v) => ("", v),
                None => continue,
            },
        };
        if labels
            .iter()
            .all(|(k, v)| label_part.split(',').any(|p| p == format!("{k}=\"{v}\"")))
        {
            let v: f64 = value.trim().parse().ok()?;
            found = Some(found.unwrap_or(0.0) + v);
        }
    }
    found
}

async fn scrape(duet: &Duet, family: Family) -> anyhow::Result<String> {
    let reply = duet.admin_get(family, "/metrics").await?;
    client::expect_status(&reply, 200)?;
    ensure!(
        reply
            .header("content-type")
            .is_some_and(|c| c.starts_with("text/plain; version=0.0.4")),
        "content type {:?}",
        reply.header("content-type")
    );
    Ok(reply.text())
}

/// Runs `promtool check metrics` on an exposition; Ok(false) when promtool is not installed
/// outside CI.
fn promtool_check(text: &str) -> anyhow::Result<bool> {
    let child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && std::env::var_os("CI").is_none() => {
            eprintln!(
                "SKIPPED promtool check: promtool is not installed (apt-get install prometheus)"
            );
            return Ok(false);
        }
        Err(e) => return Err(e).context("cannot run promtool (apt-get install prometheus)"),
    };
    child
        .stdin
        .take()
        .context("promtool stdin")?
        .write_all(text.as_bytes())?;
    let out = child.wait_with_output()?;
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    ensure!(
        out.status.success() && said.trim().is_empty(),
        "promtool check metrics: {} {said}\n{text}",
        out.status
    );
    Ok(true)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_are_counted_by_client_and_upstream_family() -> anyhow::Result<()> {
    let s = setup(&[PodSpec::dual("dual")], &["--access-log", "off"]).await?;
    for family in Family::BOTH {
        for reply in client::load(s.duet.http(family), "m.test", "/x", 7, 2).await? {
            client::expect_status(&reply, 200)?;
        }
    }
    let reply = client::get(s.duet.http(Family::V6), "not-in-the-table.test", "/").await?;
    client::expect_status(&reply, 404)?;

    // Counted once the response is done: poll both admin listeners until all 15 are there.
    for admin in Family::BOTH {
        let text = eventually("request counters", Duration::from_secs(10), || async {
            let text = scrape(&s.duet, admin).await?;
            let n = sum(&text, "duet_requests_total", &[]).unwrap_or(0.0);
            ensure!(n == 15.0, "{n} requests counted");
            Ok(text)
        })
        .await?;
        for family in Family::BOTH {
            let f = family.as_str();
            let route = [
                ("namespace", "e2e"),
                ("ingress", "web"),
                ("service", "echo"),
                ("host", "m.test"),
                ("method", "GET"),
                ("client_family", f),
            ];
            let mut labels = route.to_vec();
            labels.extend([("code", "200"), ("upstream_family", f)]);
            assert_eq!(
                sum(&text, "duet_requests_total", &labels),
                Some(7.0),
                "{f}\n{text}"
            );
            let other = [
                ("client_family", f),
                ("upstream_family", family.other().as_str()),
            ];
            assert_eq!(sum(&text, "duet_requests_total", &other), None, "{text}");
            assert_eq!(
                sum(&text, "duet_request_duration_seconds_count", &route),
                Some(7.0),
                "{text}"
            );
            assert_eq!(
                sum(&text, "duet_upstream_response_seconds_count", &route),
                Some(7.0),
                "{text}"
            );
            let listener = s.duet.http(family).to_string();
            let conns = [("listener", listener.as_str()), ("family", f)];
            let accepted = sum(&text, "duet_connections_total", &conns).unwrap_or(0.0);
            assert!(accepted >= 2.0, "{f}: {accepted} connections\n{text}");
            assert!(
                sum(&text, "duet_connections_active", &conns).is_some(),
                "{text}"
            );
        }
        // No route: empty route labels, no upstream; the Host header never becomes a label.
        let unrouted = [
            ("host", ""),
            ("service", ""),
            ("code", "404"),
            ("client_family", "ipv6"),
            ("upstream_family", "none"),
        ];
        assert_eq!(
            sum(&text, "duet_requests_total", &unrouted),
            Some(1.0),
            "{text}"
        );
        assert!(!text.contains("not-in-the-table"), "{text}");
        let dual = [("namespace", "e2e"), ("service", "echo"), ("kind", "dual")];
        assert_eq!(
            sum(&text, "duet_backend_targets", &dual),
            Some(1.0),
            "{text}"
        );
        assert!(sum(&text, "duet_snapshot_version", &[]).unwrap_or(0.0) >= 1.0);
        assert!(sum(&text, "duet_snapshot_applied_timestamp_seconds", &[]).unwrap_or(0.0) > 1.7e9);
        assert!(sum(&text, "duet_snapshot_build_seconds_count", &[]).unwrap_or(0.0) >= 1.0);
        let missing = [("reason", "MissingService")];
        assert_eq!(
            sum(&text, "duet_config_diagnostics", &missing),
            Some(0.0),
            "{text}"
        );
        for help in [
            "duet_requests_total",
            "duet_request_duration_seconds",
            "duet_upstream_response_seconds",
            "duet_upstream_connect_failures_total",
            "duet_family_fallbacks_total",
            "duet_target_family_ejections_total",
            "duet_backend_targets",
            "duet_connections_active",
            "duet_connections_total",
            "duet_snapshot_version",
            "duet_snapshot_build_seconds",
            "duet_snapshot_applied_timestamp_seconds",
            "duet_config_diagnostics",
            "duet_rate_limit_evictions_total",
        ] {
            assert!(
                text.contains(&format!("# HELP {help} ")),
                "no HELP for {help}"
            );
        }
        // Rate-limit evictions are listed for both families and both bounds, none yet.
        for family in Family::BOTH {
            for bound in ["zone", "total"] {
                let labels = [("client_family", family.as_str()), ("bound", bound)];
                let evicted = sum(&text, "duet_rate_limit_evictions_total", &labels);
                assert_eq!(evicted, Some(0.0), "{text}");
            }
        }
        // No TLS certificate is served: that family has no series and is not listed.
        assert!(!text.contains("duet_tls_certificate_expiry"), "{text}");
        promtool_check(&text)?;
    }

    // OpenMetrics for scrapers that ask for it.
    let req = client::request(conformance::http::Method::GET, "localhost", "/metrics")
        .header("accept", "application/openmetrics-text;version=1.0.0")
        .body(Default::default())?;
    let mut conn = conformance::Conn::http1(s.duet.admin(Family::V6)).await?;
    let reply = conn.send(req).await?;
    assert!(
        reply
            .header("content-type")
            .is_some_and(|c| c.starts_with("application/openmetrics-text")),
        "{:?}",
        reply.headers
    );
    assert!(reply.text().ends_with("# EOF\n"));
    drop(s.fleet);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_ipv6_port_counts_failures_fallbacks_and_an_ejection() -> anyhow::Result<()> {
    let s = setup(
        &[PodSpec::dual("half").with(Family::V6, Port::Closed)],
        &["--access-log", "off"],
    )
    .await?;
    let mut conn = conformance::Conn::http1(s.duet.http(Family::V6)).await?;
    for _ in 0..5 {
        let reply = conn.get("m.test", "/").await?;
        client::expect_status(&reply, 200)?;
        assert_eq!(reply.echo()?.family, Family::V4, "served over IPv4");
    }
    let text = eventually("fallback counters", Duration::from_secs(10), || async {
        let text = scrape(&s.duet, Family::V4).await?;
        let n = sum(&text, "duet_requests_total", &[]).unwrap_or(0.0);
        ensure!(n == 5.0, "{n} requests counted");
        Ok(text)
    })
    .await?;
    let service = ("service", "echo");
    let v6 = [service, ("family", "ipv6")];
    let v4 = [service, ("family", "ipv4")];
    // Three consecutive failures eject the pod's IPv6 side; then IPv4 is tried first.
    assert_eq!(
        sum(&text, "duet_upstream_connect_failures_total", &v6),
        Some(3.0),
        "{text}"
    );
    assert_eq!(
        sum(&text, "duet_upstream_connect_failures_total", &v4),
        Some(0.0),
        "{text}"
    );
    assert_eq!(
        sum(&text, "duet_target_family_ejections_total", &v6),
        Some(1.0),
        "{text}"
    );
    let fell = [service, ("from", "ipv6"), ("to", "ipv4")];
    assert_eq!(
        sum(&text, "duet_family_fallbacks_total", &fell),
        Some(5.0),
        "{text}"
    );
    let served = [
        ("client_family", "ipv6"),
        ("upstream_family", "ipv4"),
        ("code", "200"),
    ];
    assert_eq!(
        sum(&text, "duet_requests_total", &served),
        Some(5.0),
        "{text}"
    );
    promtool_check(&text)?;
    Ok(())
}

/// The JSON access-log lines in duet's output (stdout and stderr share the log file; only the
/// access log writes JSON objects).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn series_of_a_deleted_ingress_leave_the_exposition() -> anyhow::Result<()> {
    let s = setup(&[PodSpec::dual("dual")], &["--access-log", "off"]).await?;
    s._dir.write(
        "other.yaml",
        &[Ingress::new("e2e", "gone").host("n.test", "echo").build()],
    )?;
    for (host, family) in [("m.test", Family::V4), ("n.test", Family::V6)] {
        eventually(
            &format!("{host} served"),
            Duration::from_secs(10),
            || async {
                let reply = client::get(s.duet.http(family), host, "/").await?;
                client::expect_status(&reply, 200)
            },
        )
        .await?;
    }
    let text = eventually("n.test counted", Duration::from_secs(10), || async {
        let text = scrape(&s.duet, Family::V4).await?;
        ensure!(
            sum(&text, "duet_requests_total", &[("ingress", "gone")]).is_some(),
            "{text}"
        );
        Ok(text)
    })
    .await?;
    ensure!(text.contains(r#"host="n.test""#), "{text}");

    s._dir.remove("other.yaml")?;
    for admin in Family::BOTH {
        let text = eventually("n.test series gone", Duration::from_secs(10), || async {
            let text = scrape(&s.duet, admin).await?;
            ensure!(!text.contains(r#"host="n.test""#), "{text}");
            Ok(text)
        })
        .await?;
        // The Ingress that stays keeps its series and counts.
        ensure!(
            sum(&text, "duet_requests_total", &[("host", "m.test")]).is_some_and(|n| n >= 1.0),
            "{text}"
        );
        promtool_check(&text)?;
    }
    Ok(())
}

fn access_lines(duet: &Duet) -> Vec<Value> {
    duet.logs()
        .lines()
        .filter(|l| l.starts_with('{'))
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn access_log_has_one_json_line_per_request_for_both_families() -> anyhow::Result<()> {
    let s = setup(&[PodSpec::dual("dual")], &[]).await?;
    let pod = s.fleet.pod("dual").clone();
    let mut sizes = Vec::new();
    for family in Family::BOTH {
        let mut conn = conformance::Conn::http1(s.duet.http(family)).await?;
        let reply = conn.get("m.test", &format!("/log/{family}?q=1")).await?;
        client::expect_status(&reply, 200)?;
        sizes.push((family, conn.local_addr(), reply.body.len()));
    }
    let reply = client::get(s.duet.http(Family::V6), "Nowhere.Test", "/missing").await?;
    client::expect_status(&reply, 404)?;

    let lines = eventually("access-log lines", Duration::from_secs(10), || async {
        let lines = access_lines(&s.duet);
        ensure!(
            lines.len() == 3,
            "{} lines:\n{}",
            lines.len(),
            s.duet.logs()
        );
        Ok(lines)
    })
    .await?;
    for (family, client_addr, bytes) in sizes {
        let path = format!("/log/{family}");
        let line = lines
            .iter()
            .find(|l| l["path"] == path.as_str())
            .with_context(|| format!("no line for {path}: {lines:?}"))?;
        let upstream = pod.addr(family).context("pod address")?;
        let want = [
            ("client_addr", Value::from(client_addr.ip().to_string())),
            ("client_port", Value::from(client_addr.port())),
            ("client_family", Value::from(family.as_str())),
            ("listener", Value::from(s.duet.http(family).to_string())),
            ("host", Value::from("m.test")),
            ("method", Value::from("GET")),
            ("protocol", Value::from("HTTP/1.1")),
            ("status", Value::from(200)),
            ("bytes", Value::from(bytes)),
            ("upstream_addr", Value::from(upstream.to_string())),
            ("upstream_family", Value::from(family.as_str())),
            ("namespace", Value::from("e2e")),
            ("ingress", Value::from("web")),
            ("service", Value::from("echo")),
        ];
        for (key, value) in want {
            assert_eq!(line[key], value, "{key} in {line}");
        }
        let duration = line["duration_seconds"].as_f64().context("duration")?;
        let upstream_time = line["upstream_response_seconds"]
            .as_f64()
            .context("upstream time")?;
        assert!(
            duration > 0.0 && upstream_time > 0.0 && upstream_time <= duration,
            "{line}"
        );
        let time = line["time"].as_str().context("time")?;
        assert!(
            time.len() == 24 && time.ends_with('Z') && time.starts_with("20"),
            "{time}"
        );
        assert!(line.get("tls_version").is_none(), "{line}");
    }
    let missing = lines
        .iter()
        .find(|l| l["path"] == "/missing")
        .context("no line for the 404")?;
    assert_eq!(missing["status"], 404);
    assert_eq!(missing["client_addr"], "::1");
    assert_eq!(missing["host"], "Nowhere.Test");
    assert_eq!(missing["upstream_addr"], Value::Null);
    assert_eq!(missing["upstream_family"], Value::Null);
    assert_eq!(missing["namespace"], Value::Null);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn access_log_off_writes_no_lines() -> anyhow::Result<()> {
    let s = setup(&[PodSpec::dual("dual")], &["--access-log", "off"]).await?;
    for family in Family::BOTH {
        client::expect_status(&client::get(s.duet.http(family), "m.test", "/").await?, 200)?;
    }
    // The requests are done (counted); a log line would have been written within ~10 ms.
    eventually("requests counted", Duration::from_secs(10), || async {
        let text = scrape(&s.duet, Family::V4).await?;
        ensure!(sum(&text, "duet_requests_total", &[]) == Some(2.0));
        Ok(())
    })
    .await?;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(access_lines(&s.duet).is_empty(), "{}", s.duet.logs());
    Ok(())
}

/// A Prometheus server on loopback, killed on drop.
struct Prometheus {
    child: Child,
    addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Prometheus {
    /// Starts `prometheus` scraping `targets` every second; `None` when it is not installed
    /// outside CI.
    fn start(targets: &[SocketAddr]) -> anyhow::Result<Option<Prometheus>> {
        let dir = tempfile::tempdir()?;
        let targets: Vec<String> = targets.iter().map(|t| format!("'{t}'")).collect();
        let config = format!(
            "global: {{scrape_interval: 1s, scrape_timeout: 1s, evaluation_interval: 1s}}\n\
             scrape_configs:\n  - job_name: duet\n    static_configs:\n      - targets: [{}]\n",
            targets.join(", ")
        );
        let config_path = dir.path().join("prometheus.yml");
        std::fs::write(&config_path, config)?;
        let addr = TcpListener::bind("127.0.0.1:0")?.local_addr()?;
        let log = std::fs::File::create(dir.path().join("prometheus.log"))?;
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config_path.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn();
        match child {
            Ok(child) => Ok(Some(Prometheus {
                child,
                addr,
                _dir: dir,
            })),
            Err(e)
                if e.kind() == std::io::ErrorKind::NotFound && std::env::var_os("CI").is_none() =>
            {
                eprintln!(
                    "SKIPPED: the prometheus binary is not installed (apt-get install prometheus)"
                );
                Ok(None)
            }
            Err(e) => Err(e).context("cannot run prometheus (apt-get install prometheus)"),
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self._dir.path().join("prometheus.log")).unwrap_or_default()
    }

    /// An instant query; returns the result vector.
    async fn query(&self, promql: &str) -> anyhow::Result<Vec<Value>> {
        let path = format!("/api/v1/query?query={}", percent_encode(promql));
        let reply = client::get(self.addr, "localhost", &path).await?;
        client::expect_status(&reply, 200)?;
        let body: Value = serde_json::from_slice(&reply.body)?;
        ensure!(body["status"] == "success", "{body}");
        Ok(body["data"]["result"]
            .as_array()
            .cloned()
            .unwrap_or_default())
    }
}

fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

fn value(sample: &Value) -> Option<f64> {
    sample["value"][1].as_str()?.parse().ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_scrapes_both_admin_listeners() -> anyhow::Result<()> {
    let s = setup(&[PodSpec::dual("dual")], &["--access-log", "off"]).await?;
    let targets = [s.duet.admin(Family::V4), s.duet.admin(Family::V6)];
    let Some(prometheus) = Prometheus::start(&targets)? else {
        return Ok(());
    };
    for reply in client::load(s.duet.http(Family::V6), "m.test", "/", 4, 1).await? {
        client::expect_status(&reply, 200)?;
    }
    let query = r#"duet_requests_total{client_family="ipv6",upstream_family="ipv6",host="m.test"}"#;
    let result = eventually(
        "Prometheus sees the IPv6 requests",
        Duration::from_secs(45),
        || async {
            let result = prometheus
                .query(query)
                .await
                .with_context(|| prometheus.log())?;
            // One series per scraped admin listener, each with the 4 requests.
            ensure!(result.len() == 2, "{result:?}");
            ensure!(result.iter().all(|r| value(r) == Some(4.0)), "{result:?}");
            Ok(result)
        },
    )
    .await?;
    let mut instances: Vec<String> = result
        .iter()
        .filter_map(|r| r["metric"]["instance"].as_str().map(str::to_owned))
        .collect();
    instances.sort();
    let mut want: Vec<String> = targets.iter().map(|t| t.to_string()).collect();
    want.sort();
    assert_eq!(instances, want, "scraped over 127.0.0.1 and [::1]");
    let up = prometheus.query(r#"up{job="duet"}"#).await?;
    assert_eq!(up.len(), 2, "{up:?}");
    for sample in &up {
        if value(sample) != Some(1.0) {
            bail!("a target is down: {sample}\n{}", prometheus.log());
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_requests_log_version_and_sni_and_certificates_expose_expiry() -> anyhow::Result<()> {
    let fleet = Fleet::start("e2e", "echo", &[PodSpec::dual("dual")])?;
    let dir = ManifestDir::with_class()?;
    dir.write("echo.yaml", &fleet.manifests())?;
    let cert = conformance::tls::cert(&["m.test"]);
    dir.write(
        "secret.yaml",
        &[conformance::tls::secret("e2e", "m-cert", &cert)],
    )?;
    let ingress = Ingress::new("e2e", "web")
        .host("m.test", "echo")
        .tls(&["m.test"], "m-cert");
    dir.write("ingress.yaml", &[ingress.build()])?;
    let duet = DuetBuilder::new(DUET, dir.path()).start().await?;
    for family in Family::BOTH {
        let (mut conn, _) =
            conformance::Conn::https(duet.https(family), Some("m.test"), &["http/1.1"]).await?;
        let reply = conn.get("m.test", &format!("/tls/{family}")).await?;
        client::expect_status(&reply, 200)?;
    }
    let lines = eventually("access-log lines", Duration::from_secs(10), || async {
        let lines: Vec<Value> = access_lines(&duet)
            .into_iter()
            .filter(|l| l["path"].as_str().is_some_and(|p| p.starts_with("/tls/")))
            .collect();
        ensure!(lines.len() == 2, "{} lines:\n{}", lines.len(), duet.logs());
        Ok(lines)
    })
    .await?;
    for family in Family::BOTH {
        let line = lines
            .iter()
            .find(|l| l["client_family"] == family.as_str())
            .with_context(|| format!("no {family} line: {lines:?}"))?;
        assert_eq!(line["path"], format!("/tls/{family}").as_str(), "{line}");
        assert_eq!(line["listener"], duet.https(family).to_string().as_str());
        assert_eq!(line["tls_version"], "TLSv1.3", "{line}");
        assert_eq!(line["sni"], "m.test", "{line}");
        assert_eq!(line["status"], 200, "{line}");
    }
    let text = scrape(&duet, Family::V6).await?;
    let expiry = sum(
        &text,
        "duet_tls_certificate_expiry_timestamp_seconds",
        &[("secret", "e2e/m-cert")],
    );
    let want = dataplane::x509::not_after(&cert.der)
        .context("test certificate has a notAfter")?
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs();
    assert_eq!(expiry, Some(want as f64), "{text}");
    promtool_check(&text)?;
    Ok(())
}
