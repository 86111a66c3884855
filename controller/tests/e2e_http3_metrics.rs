//! End to end, over real sockets on 127.0.0.1 and [::1]: one request over HTTP/1.1 and HTTP/2
//! (TLS, by ALPN) and HTTP/3 (aioquic, conformance/h3client/) from each family, then `/metrics`
//! counts each under its protocol and client family in `duet_requests_by_protocol_total`, and
//! the QUIC connection under the UDP listener's address in the connection metrics.

use std::time::Duration;

use conformance::client::{eventually, Conn};
use conformance::h3client;
use conformance::tls::{self, TestCert};
use conformance::{Duet, DuetBuilder, Family, Fleet, Ingress, ManifestDir, PodSpec};
use serde_json::{json, Value};

const DUET: &str = env!("CARGO_BIN_EXE_duet");

/// One GET of `authority` `/` over HTTP/3 to duet's UDP listener of `family`; its status.
async fn h3_get(duet: &Duet, family: Family, authority: &str) -> anyhow::Result<Value> {
    let plan = json!({
        "connect": family.loopback().to_string(),
        "port": duet.https(family).port(),
        "sni": authority,
        "steps": [{"request": {"method": "GET", "authority": authority, "path": "/"}}],
    });
    let report = h3client::run(&plan).await?;
    Ok(report["responses"][0]["status"].clone())
}

/// The value of the series `name{labels}` written exactly so (0 when absent).
fn value(text: &str, name: &str, labels: &str) -> u64 {
    let prefix = format!("{name}{{{labels}}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map_or(0, |v| v.trim().parse().expect("a counter value"))
}

async fn scrape(duet: &Duet) -> anyhow::Result<String> {
    Ok(duet.admin_get(Family::V4, "/metrics").await?.text())
}

struct Setup {
    _fleet: Fleet,
    _dir: ManifestDir,
    duet: Duet,
    _cert: TestCert,
}

/// Dual-stack echo pods behind `m.test` with a certificate, and duet with `--http3`.
async fn setup() -> anyhow::Result<Setup> {
    let fleet = Fleet::start("h3m", "echo", &[PodSpec::dual("web")])?;
    let dir = ManifestDir::with_class()?;
    dir.write("echo.yaml", &fleet.manifests())?;
    let cert = tls::cert(&["m.test"]);
    dir.write("secret.yaml", &[tls::secret("h3m", "cert", &cert)])?;
    let ingress = Ingress::new("h3m", "web")
        .host("m.test", "echo")
        .tls(&["m.test"], "cert");
    dir.write("ingress.yaml", &[ingress.build()])?;
    let duet = DuetBuilder::new(DUET, dir.path())
        .args(["--http3"])
        .start()
        .await?;
    Ok(Setup {
        _fleet: fleet,
        _dir: dir,
        duet,
        _cert: cert,
    })
}

/// One GET of m.test over TLS to the HTTPS listener of `family`, offering only `alpn`.
async fn tls_get(duet: &Duet, family: Family, alpn: &str) -> anyhow::Result<u16> {
    let (mut conn, hs) = Conn::https(duet.https(family), Some("m.test"), &[alpn]).await?;
    anyhow::ensure!(hs.alpn.as_deref() == Some(alpn), "{family}: ALPN {hs:?}");
    Ok(conn.get("m.test", "/").await?.status.as_u16())
}

const PROTOCOLS: [&str; 3] = ["HTTP/1.1", "HTTP/2", "HTTP/3"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_count_by_protocol_and_client_family() -> anyhow::Result<()> {
    let s = setup().await?;
    let duet = &s.duet;
    let before = scrape(duet).await?;
    for family in Family::BOTH {
        assert_eq!(tls_get(duet, family, "http/1.1").await?, 200, "{family}");
        assert_eq!(tls_get(duet, family, "h2").await?, 200, "{family}");
        assert_eq!(h3_get(duet, family, "m.test").await?, 200, "{family}");
    }
    let series = |protocol: &str, family: Family| {
        format!(r#"protocol="{protocol}",client_family="{family}""#)
    };
    // A request is counted once its response is done: the last may land a moment after the
    // client read it.
    let after = eventually("every request counted", Duration::from_secs(5), || async {
        let text = scrape(duet).await?;
        let name = "duet_requests_by_protocol_total";
        for protocol in PROTOCOLS {
            for family in Family::BOTH {
                let labels = series(protocol, family);
                let added = value(&text, name, &labels) - value(&before, name, &labels);
                anyhow::ensure!(added == 1, "{protocol} {family}: +{added}\n{text}");
            }
        }
        let labels = series("HTTP/1.0", Family::V4);
        anyhow::ensure!(
            value(&text, name, &labels) == 0,
            "no HTTP/1.0 request: {text}"
        );
        Ok(text)
    })
    .await?;
    // The QUIC connection of each family, under the UDP listener of its family only.
    for family in Family::BOTH {
        for listener_family in Family::BOTH {
            let labels = format!(
                r#"listener="{}/udp",family="{family}""#,
                duet.https(listener_family)
            );
            let accepted = value(&after, "duet_connections_total", &labels);
            let expected = u64::from(family == listener_family);
            assert_eq!(accepted, expected, "{labels}\n{after}");
        }
    }
    Ok(())
}
