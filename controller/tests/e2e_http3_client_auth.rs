//! End to end with `--http3`, over UDP to 127.0.0.1 and [::1] with aioquic presenting
//! rcgen-made client certificates (conformance/h3client): client certificates answer over HTTP/3
//! as over TCP. ingress-nginx's `auth-tls-*`: a host whose Ingress verifies certificates asks
//! for one (a host without does not); `on` answers 400 without one or with one its CA did not
//! issue, `optional` admits none, `auth-tls-match-cn` answers 403 to another subject; what was
//! verified goes upstream. A Gateway's `tls.frontend` validation: in mode `AllowValidOnly` the
//! handshake fails without a certificate of the port's CA, in `AllowInsecureFallback` it goes on
//! with none or any.

use std::time::Duration;

use conformance::client::eventually;
use conformance::duet::free_port;
use conformance::h3client;
use conformance::manifests::gateway_class;
use conformance::tls::{self, TestCa, TestCert};
use conformance::{DuetBuilder, Echo, Family, Fleet, Ingress, ManifestDir, PodSpec};
use serde_json::{json, Value};

const DUET: &str = env!("CARGO_BIN_EXE_duet");

/// A GET of `/` for `host` over HTTP/3 to `port` of `family`, presenting `cert` when asked.
fn get(family: Family, port: u16, host: &str, cert: Option<&TestCert>) -> Value {
    let mut plan = json!({
        "connect": family.loopback().to_string(),
        "port": port,
        "sni": host,
        "connect_timeout": 3,
        "steps": [{"request": {"method": "GET", "authority": host, "path": "/",
                               "headers": {"ssl-client-verify": "SUCCESS"}}}],
    });
    if let Some(cert) = cert {
        plan["client_cert"] = json!(cert.cert_pem);
        plan["client_key"] = json!(cert.key_pem);
    }
    plan
}

/// The status and body of the first response of a report.
fn answer(report: &Value) -> anyhow::Result<(u64, &str)> {
    let response = &report["responses"][0];
    let status = response["status"]
        .as_u64()
        .ok_or_else(|| anyhow::anyhow!("no answer: {report}"))?;
    Ok((status, response["text"].as_str().unwrap_or("")))
}

/// The echo of a 200 answer from a pod reached over the client's family.
fn echo(report: &Value, family: Family) -> anyhow::Result<Echo> {
    let (status, text) = answer(report)?;
    anyhow::ensure!(status == 200, "{family}: {status} {text}");
    let echo: Echo = serde_json::from_str(text)?;
    anyhow::ensure!(
        echo.family == family,
        "{family}: reached over {}",
        echo.family
    );
    Ok(echo)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingress_nginx_client_certificates_over_http3() -> anyhow::Result<()> {
    let ca = TestCa::new("duet client CA");
    let alice = ca.issue_client("alice", &["duet"]);
    let bob = ca.issue_client("bob", &[]);
    let rogue = TestCa::new("rogue CA").issue_client("mallory", &[]);
    let hosts = ["on.test", "opt.test", "cn.test", "plain.test"];
    let server = tls::cert(&hosts);
    let fleet = Fleet::start("h3mtls", "web", &[PodSpec::dual("pod")])?;
    let dir = ManifestDir::with_class()?;
    dir.write("fleet.yaml", &fleet.manifests())?;
    dir.write(
        "secrets.yaml",
        &[
            tls::secret("h3mtls", "web-tls", &server),
            tls::ca_secret("h3mtls", "client-ca", &ca.cert_pem),
        ],
    )?;
    let ingress = |host: &str, extra: &[(&str, &str)]| {
        let mut pairs = vec![("auth-tls-secret", "h3mtls/client-ca")];
        pairs.extend_from_slice(extra);
        Ingress::new("h3mtls", host.trim_end_matches(".test"))
            .nginx_annotations(&pairs)
            .host(host, "web")
            .tls(&[host], "web-tls")
            .build()
    };
    dir.write(
        "ingress.yaml",
        &[
            ingress("on.test", &[]),
            ingress("opt.test", &[("auth-tls-verify-client", "optional")]),
            ingress("cn.test", &[("auth-tls-match-cn", "CN=bob$")]),
            Ingress::new("h3mtls", "plain")
                .host("plain.test", "web")
                .tls(&["plain.test"], "web-tls")
                .build(),
        ],
    )?;
    let duet = DuetBuilder::new(DUET, dir.path())
        .args(["--http3"])
        .start()
        .await?;
    for family in Family::BOTH {
        let port = duet.https(family).port();
        let run =
            |host: &str, cert: Option<&TestCert>| h3client::run(&get(family, port, host, cert));
        // on: a certificate of the CA passes; what was verified goes upstream (not the
        // client's own header).
        let report = run("on.test", Some(&alice)).await?;
        assert_eq!(report["cert_requested"], true, "{family}: {report}");
        let seen = echo(&report, family)?;
        assert_eq!(seen.header("ssl-client-verify").as_deref(), Some("SUCCESS"));
        assert_eq!(
            seen.header("ssl-client-subject-dn").as_deref(),
            Some("O=duet,CN=alice"),
            "{family}"
        );
        // on: none, or one of another CA: nginx's 400.
        let report = run("on.test", None).await?;
        assert_eq!(
            answer(&report)?,
            (400, "400 No required SSL certificate was sent\n"),
            "{family}"
        );
        let report = run("on.test", Some(&rogue)).await?;
        assert_eq!(
            answer(&report)?,
            (400, "400 The SSL certificate error\n"),
            "{family}"
        );
        // optional: none is fine, a bad one is not.
        let seen = echo(&run("opt.test", None).await?, family)?;
        assert_eq!(seen.header("ssl-client-verify").as_deref(), Some("NONE"));
        assert_eq!(
            answer(&run("opt.test", Some(&rogue)).await?)?.0,
            400,
            "{family}"
        );
        // auth-tls-match-cn: another subject gets 403.
        echo(&run("cn.test", Some(&bob)).await?, family)?;
        let report = run("cn.test", Some(&alice)).await?;
        assert_eq!(
            answer(&report)?,
            (403, "403 client certificate unauthorized\n"),
            "{family}"
        );
        // No auth-tls: no certificate asked for, none reported upstream.
        let report = run("plain.test", Some(&alice)).await?;
        assert_eq!(report["cert_requested"], false, "{family}: {report}");
        assert_eq!(echo(&report, family)?.header("ssl-client-verify"), None);
    }
    Ok(())
}

/// A Gateway's HTTPS listeners on `strict` (AllowValidOnly) and `fallback`
/// (AllowInsecureFallback), both with the CA of ConfigMap `ca`, and a route to `web`.
fn gateway(strict: u16, fallback: u16) -> Vec<Value> {
    let ns = "h3front";
    let https = |name: &str, port: u16| {
        json!({"name": name, "port": port, "protocol": "HTTPS",
               "tls": {"certificateRefs": [{"name": "server"}]}})
    };
    let validation = |mode: &str| {
        json!({"validation": {"mode": mode,
                              "caCertificateRefs": [{"group": "", "kind": "ConfigMap", "name": "ca"}]}})
    };
    vec![
        gateway_class(),
        json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
            "metadata": {"name": "gw", "namespace": ns},
            "spec": {
                "gatewayClassName": "duet",
                "tls": {"frontend": {
                    "default": validation("AllowValidOnly"),
                    "perPort": [{"port": fallback, "tls": validation("AllowInsecureFallback")}]
                }},
                "listeners": [https("strict", strict), https("fallback", fallback)]
            }
        }),
        json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
            "metadata": {"name": "web", "namespace": ns},
            "spec": {"parentRefs": [{"name": "gw"}],
                     "rules": [{"backendRefs": [{"name": "web", "port": 8080}]}]}
        }),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_client_certificate_validation_over_http3() -> anyhow::Result<()> {
    let ns = "h3front";
    let ca = TestCa::new("frontend CA");
    let alice = ca.issue_client("alice", &[]);
    let rogue = TestCa::new("rogue CA").issue_client("mallory", &[]);
    let server = tls::cert(&["*.example.test"]);
    let (strict, fallback) = (free_port()?, free_port()?);
    let fleet = Fleet::start(ns, "web", &[PodSpec::dual("pod")])?;
    let dir = ManifestDir::new()?;
    dir.write("fleet.yaml", &fleet.manifests())?;
    dir.write(
        "tls.yaml",
        &[
            tls::secret(ns, "server", &server),
            json!({"apiVersion": "v1", "kind": "ConfigMap",
                   "metadata": {"name": "ca", "namespace": ns},
                   "data": {"ca.crt": ca.cert_pem}}),
        ],
    )?;
    dir.write("gateway.yaml", &gateway(strict, fallback))?;
    let _duet = DuetBuilder::new(DUET, dir.path())
        .args(["--http3"])
        .start()
        .await?;
    let host = "a.example.test";
    for family in Family::BOTH {
        let run =
            |port: u16, cert: Option<&TestCert>| h3client::run(&get(family, port, host, cert));
        // AllowValidOnly: a certificate of the CA, once the port is bound.
        let report = eventually(
            "HTTP/3 on the Gateway port",
            Duration::from_secs(15),
            || {
                let plan = get(family, strict, host, Some(&alice));
                async move {
                    let report = h3client::run(&plan).await?;
                    answer(&report)?;
                    Ok(report)
                }
            },
        )
        .await?;
        assert_eq!(report["cert_requested"], true, "{family}: {report}");
        echo(&report, family)?;
        // Without one, or with another CA's: the handshake fails (a TLS alert, QUIC's
        // CRYPTO_ERROR 0x1XX, as TCP's handshake fails), nothing is answered.
        for (cert, what) in [(None, "none"), (Some(&rogue), "another CA's")] {
            let report = run(strict, cert).await?;
            assert!(
                report["responses"][0]["status"].is_null(),
                "{family}: {what} answered: {report}"
            );
            let code = report["closed"]["error_code"].as_u64().unwrap_or(0);
            assert!(
                (0x100..0x200).contains(&code),
                "{family} {what}: closed by a TLS alert: {report}"
            );
            assert_eq!(report["cert_requested"], true, "{family} {what}: {report}");
        }
        // AllowInsecureFallback: asked for, never refused.
        for cert in [Some(&alice), None, Some(&rogue)] {
            let report = run(fallback, cert).await?;
            assert_eq!(report["cert_requested"], true, "{family}: {report}");
            echo(&report, family)?;
        }
    }
    Ok(())
}
