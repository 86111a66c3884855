//! End to end, over real sockets on 127.0.0.1 and [::1]: Ingresses written for ingress-nginx.
//! `ssl-redirect` (on for TLS hosts, 308; `"false"` turns it off), `force-ssl-redirect` (also
//! without TLS), `proxy-body-size` (nginx sizes, `0` unlimited, a `duet.dev/` annotation wins),
//! `proxy-connect-timeout` and `proxy-read-timeout` (whole seconds) and `backend-protocol` (HTTPS,
//! GRPC), the redirect keys, the source ranges, and `rewrite-target`, `use-regex` and
//! `x-forwarded-prefix` (host-wide case-insensitive regex prefixes) take effect; every
//! `nginx.ingress.kubernetes.io/` key is reported in `/debug/routes` and `/metrics`; snippet
//! annotations are never interpreted, and `--strict-annotations` refuses their Ingress whole.

use std::time::{Duration, Instant};

use conformance::bytes::Bytes;
use conformance::client::{self, Conn};
use conformance::echo::EchoOptions;
use conformance::fleet::{silent_port, static_service, unanswered_port};
use conformance::http::Method;
use conformance::http_body_util::Full;
use conformance::tls::{self, TestCa};
use conformance::{DuetBuilder, Family, Fleet, Ingress, ManifestDir, PathType, PodSpec, PortRef};
use serde_json::Value;

const DUET: &str = env!("CARGO_BIN_EXE_duet");
const N: &str = conformance::manifests::NGINX_ANNOTATION_PREFIX;

async fn put(to: std::net::SocketAddr, host: &str, size: usize) -> anyhow::Result<u16> {
    let mut conn = Conn::http1(to).await?;
    let req =
        client::request(Method::PUT, host, "/up").body(Full::new(Bytes::from(vec![b'b'; size])))?;
    Ok(conn.send(req).await?.status.as_u16())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nginx_annotations_take_effect_and_are_reported() -> anyhow::Result<()> {
    let fleet = Fleet::start("ngx", "echo", &[PodSpec::dual("dual")])?;
    let (silent4, _s4) = silent_port(Family::V4)?;
    let (silent6, _s6) = silent_port(Family::V6)?;
    let (hang4, _h4) = unanswered_port(Family::V4)?;
    let (hang6, _h6) = unanswered_port(Family::V6)?;
    let dir = ManifestDir::with_class()?;
    dir.write("echo.yaml", &fleet.manifests())?;
    dir.write(
        "silent.yaml",
        &static_service("ngx", "silent", silent4, silent6),
    )?;
    dir.write("hang.yaml", &static_service("ngx", "hang", hang4, hang6))?;
    let cert = tls::cert(&["tls.test", "notls-redirect.test"]);
    dir.write("secret.yaml", &[tls::secret("ngx", "cert", &cert)])?;
    let ingresses = [
        Ingress::new("ngx", "tls")
            .host("tls.test", "echo")
            .tls(&["tls.test"], "cert"),
        Ingress::new("ngx", "optout")
            .nginx_annotations(&[("ssl-redirect", "false")])
            .host("notls-redirect.test", "echo")
            .tls(&["notls-redirect.test"], "cert"),
        Ingress::new("ngx", "force")
            .nginx_annotations(&[("force-ssl-redirect", "true")])
            .host("force.test", "echo"),
        Ingress::new("ngx", "small")
            .nginx_annotations(&[("proxy-body-size", "4k")])
            .host("small.test", "echo"),
        Ingress::new("ngx", "unlimited")
            .nginx_annotations(&[("proxy-body-size", "0")])
            .host("unlimited.test", "echo"),
        Ingress::new("ngx", "duet-wins")
            .nginx_annotations(&[("proxy-body-size", "0")])
            .annotation("duet.dev/proxy-body-size", "4k")
            .host("duet-wins.test", "echo"),
        Ingress::new("ngx", "read")
            .nginx_annotations(&[("proxy-read-timeout", "1")])
            .host("read.test", "silent"),
        Ingress::new("ngx", "read-bad")
            .nginx_annotations(&[("proxy-read-timeout", "1s")])
            .host("read-bad.test", "echo"),
        Ingress::new("ngx", "connect")
            .nginx_annotations(&[("proxy-connect-timeout", "1")])
            .host("connect.test", "hang"),
        Ingress::new("ngx", "snippet")
            .nginx_annotations(&[
                ("configuration-snippet", "return 403;"),
                ("use-regexp", "true"),
            ])
            .host("snippet.test", "echo"),
    ];
    dir.write("ingress.yaml", &ingresses.map(|i| i.build()))?;
    let duet = DuetBuilder::new(DUET, dir.path())
        .args(["--upstream-timeout", "20s", "--connect-timeout", "20s"])
        .start()
        .await?;

    for family in Family::BOTH {
        let to = duet.http(family);
        let https_port = duet.https(family).port();
        // ssl-redirect: on by default for TLS hosts, off with "false"; force-ssl-redirect
        // redirects a host without TLS.
        let reply = client::get(to, "tls.test", "/a?b=c").await?;
        client::expect_status(&reply, 308)?;
        let reply = client::get(to, "notls-redirect.test", "/").await?;
        client::expect_status(&reply, 200)?;
        let reply = client::get(to, "force.test", "/x/?y=1").await?;
        client::expect_status(&reply, 308)?;
        assert_eq!(
            reply.header("location"),
            Some(format!("https://force.test:{https_port}/x/?y=1").as_str()),
            "{family}"
        );
        // proxy-body-size.
        for (host, size, want) in [
            ("small.test", 4096, 200),
            ("small.test", 4097, 413),
            ("unlimited.test", 3 << 20, 200),
            ("duet-wins.test", 4097, 413),
            ("snippet.test", 1 << 20, 200),
            ("snippet.test", (1 << 20) + 1, 413),
        ] {
            assert_eq!(put(to, host, size).await?, want, "{family} {host} {size}");
        }
        // The snippet is not interpreted: served, not 403.
        client::expect_status(&client::get(to, "snippet.test", "/").await?, 200)?;
        // Timeouts in whole seconds: 1 s, not the flags' 20 s (10 s bounds a hang, not a speed).
        for (host, status) in [("read.test", 504), ("connect.test", 502)] {
            let start = Instant::now();
            let reply = client::get(to, host, "/").await?;
            let took = start.elapsed();
            assert_eq!(reply.status, status, "{family} {host}: {}", reply.text());
            assert!(
                took >= Duration::from_secs(1) && took < Duration::from_secs(10),
                "{family} {host}: answered after {took:?}"
            );
        }
        client::expect_status(&client::get(to, "read-bad.test", "/").await?, 200)?;
    }

    // The report in /debug/routes.
    let routes = duet.debug_routes().await?;
    let status = |ingress: &str, key: &str| conformance::duet::nginx_status(&routes, ingress, key);
    for (ingress, key, want) in [
        ("optout", "ssl-redirect", "honoured-with-difference"),
        ("force", "force-ssl-redirect", "honoured-with-difference"),
        ("small", "proxy-body-size", "honoured"),
        ("duet-wins", "proxy-body-size", "honoured-with-difference"),
        ("read", "proxy-read-timeout", "honoured"),
        ("read-bad", "proxy-read-timeout", "invalid-value"),
        ("connect", "proxy-connect-timeout", "honoured"),
        ("snippet", "configuration-snippet", "ignored-unsupported"),
        ("snippet", "use-regexp", "ignored-unknown"),
    ] {
        assert_eq!(
            status(ingress, key).as_deref(),
            Some(want),
            "{ingress} {key}: {routes:#}"
        );
    }
    assert!(status("tls", "ssl-redirect").is_none());
    // One diagnostic (hence one Event in a cluster) per Ingress and problem.
    let reasons = diagnostics_of(&routes, "snippet");
    assert_eq!(
        reasons,
        ["IgnoredAnnotation", "SnippetAnnotation"],
        "{routes:#}"
    );
    assert_eq!(diagnostics_of(&routes, "read-bad"), ["InvalidAnnotation"]);
    assert!(diagnostics_of(&routes, "small").is_empty());

    // The metric by status.
    let metrics = duet.admin_get(Family::V6, "/metrics").await?.text();
    for line in [
        r#"duet_ingress_annotations{status="honoured"} 4"#,
        r#"duet_ingress_annotations{status="honoured-with-difference"} 3"#,
        r#"duet_ingress_annotations{status="ignored-unsupported"} 1"#,
        r#"duet_ingress_annotations{status="ignored-unknown"} 1"#,
        r#"duet_ingress_annotations{status="ignored-removed-upstream"} 0"#,
        r#"duet_ingress_annotations{status="invalid-value"} 1"#,
    ] {
        assert!(metrics.contains(line), "{line}\n{metrics}");
    }
    Ok(())
}

/// The diagnostic reasons of one Ingress in `/debug/routes`, sorted.
fn diagnostics_of(routes: &Value, ingress: &str) -> Vec<String> {
    let mut reasons: Vec<String> = routes["diagnostics"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|d| d["object"]["name"] == ingress)
        .map(|d| d["reason"].as_str().unwrap_or_default().to_owned())
        .collect();
    reasons.sort();
    reasons
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_annotations_refuse_snippet_ingresses_whole() -> anyhow::Result<()> {
    let fleet = Fleet::start("strict", "echo", &[PodSpec::dual("dual")])?;
    let dir = ManifestDir::with_class()?;
    dir.write("echo.yaml", &fleet.manifests())?;
    let ingresses = [
        Ingress::new("strict", "snippet")
            .nginx_annotations(&[("server-snippet", "return 200;")])
            .host("snippet.test", "echo")
            .host("shared.test", "echo"),
        Ingress::new("strict", "plain").host("plain.test", "echo"),
    ];
    dir.write("ingress.yaml", &ingresses.map(|i| i.build()))?;
    let lenient = DuetBuilder::new(DUET, dir.path()).start().await?;
    let strict = DuetBuilder::new(DUET, dir.path())
        .args(["--strict-annotations"])
        .start()
        .await?;
    for family in Family::BOTH {
        for host in ["snippet.test", "shared.test", "plain.test"] {
            let reply = client::get(lenient.http(family), host, "/").await?;
            client::expect_status(&reply, 200)?;
        }
        for (host, want) in [
            ("snippet.test", 404),
            ("shared.test", 404),
            ("plain.test", 200),
        ] {
            let reply = client::get(strict.http(family), host, "/").await?;
            assert_eq!(reply.status, want, "{family} {host}");
        }
    }
    let routes = strict.debug_routes().await?;
    let refused = routes["diagnostics"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|d| {
            d["reason"] == "SnippetAnnotation"
                && d["message"]
                    .as_str()
                    .is_some_and(|m| m.starts_with("refused whole (--strict-annotations)"))
        });
    assert!(refused, "{routes:#}");
    assert!(!diagnostics_of(&lenient.debug_routes().await?, "snippet").is_empty());
    Ok(())
}

/// `backend-protocol` picks the protocol to the pods over the Service port's (which has no
/// `appProtocol` here): HTTPS to TLS pods, unverified as in ingress-nginx unless a CA Secret is
/// given; GRPC as HTTP/2 cleartext.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_protocol_selects_the_upstream_protocol() -> anyhow::Result<()> {
    let ca = TestCa::new("a CA nobody trusts");
    let other_ca = TestCa::new("another CA");
    let cert = ca.issue(&["secure.bp.svc"]);
    let options = EchoOptions {
        tls: Some(tls::server_config(&cert, &["http/1.1"])),
        ..EchoOptions::default()
    };
    let secure = Fleet::start_with("bp", "secure", &[PodSpec::dual("a")], options)?;
    let plain = Fleet::start("bp", "plain", &[PodSpec::dual("b")])?;
    let dir = ManifestDir::with_class()?;
    dir.write(
        "services.yaml",
        &[secure.manifests(), plain.manifests()].concat(),
    )?;
    dir.write(
        "ca.yaml",
        &[tls::ca_secret("bp", "other-ca", &other_ca.cert_pem)],
    )?;
    let ingresses = [
        Ingress::new("bp", "https")
            .nginx_annotations(&[("backend-protocol", "HTTPS")])
            .host("https.test", "secure"),
        Ingress::new("bp", "verified")
            .nginx_annotations(&[("backend-protocol", "https")])
            .annotation("duet.dev/backend-ca-secret", "other-ca")
            .host("verified.test", "secure"),
        Ingress::new("bp", "no-annotation").host("no-annotation.test", "secure"),
        Ingress::new("bp", "grpc")
            .nginx_annotations(&[("backend-protocol", "GRPC")])
            .host("grpc.test", "plain"),
        Ingress::new("bp", "fcgi")
            .nginx_annotations(&[("backend-protocol", "FCGI")])
            .host("fcgi.test", "plain"),
    ];
    dir.write("ingress.yaml", &ingresses.map(|i| i.build()))?;
    let duet = DuetBuilder::new(DUET, dir.path()).start().await?;
    for family in Family::BOTH {
        let to = duet.http(family);
        let reply = client::get(to, "https.test", "/").await?;
        client::expect_status(&reply, 200)?;
        let echo = reply.echo()?;
        assert_eq!((echo.proto.as_str(), echo.family), ("HTTP/1.1", family));
        // A CA Secret turns verification on: this one did not sign the pod's certificate.
        client::expect_status(&client::get(to, "verified.test", "/").await?, 502)?;
        // Without the annotation the port is plain HTTP, which the TLS pod does not speak.
        client::expect_status(&client::get(to, "no-annotation.test", "/").await?, 502)?;
        let reply = client::get(to, "grpc.test", "/").await?;
        client::expect_status(&reply, 200)?;
        assert_eq!(reply.echo()?.proto, "HTTP/2.0", "{family}");
        // An unsupported value leaves the Service's protocol: HTTP/1.1.
        let reply = client::get(to, "fcgi.test", "/").await?;
        client::expect_status(&reply, 200)?;
        assert_eq!(reply.echo()?.proto, "HTTP/1.1", "{family}");
    }
    let routes = duet.debug_routes().await?;
    let text = routes["annotations"].to_string();
    assert!(text.contains(r#""key":"nginx.ingress.kubernetes.io/backend-protocol","status":"honoured-with-difference""#), "{text}");
    assert!(text.contains("FCGI is not supported by duet"), "{text}");
    Ok(())
}

/// `permanent-redirect` (301, or its `-code`), `temporal-redirect` (302, or its `-code`; wins over
/// permanent) answer every request of the Ingress without proxying and without appending the
/// path; `app-root` answers `/` with 302 to the path on the request's scheme and Host (IPv6
/// literal Hosts keep their brackets); they come before the HTTPS redirect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redirect_annotations_answer_without_proxying() -> anyhow::Result<()> {
    let fleet = Fleet::start("rd", "echo", &[PodSpec::dual("dual")])?;
    let dir = ManifestDir::with_class()?;
    dir.write("echo.yaml", &fleet.manifests())?;
    let cert = tls::cert(&["moved.test"]);
    dir.write("secret.yaml", &[tls::secret("rd", "cert", &cert)])?;
    let ingresses = [
        Ingress::new("rd", "moved")
            .nginx_annotations(&[("permanent-redirect", "https://new.example.com/landing")])
            .host("moved.test", "echo")
            .tls(&["moved.test"], "cert"),
        Ingress::new("rd", "moved-308")
            .nginx_annotations(&[
                ("permanent-redirect", "https://[2001:db8::1]:8443/x?y=1"),
                ("permanent-redirect-code", "308"),
            ])
            .host("moved-308.test", "echo"),
        Ingress::new("rd", "bad-code")
            .nginx_annotations(&[
                ("permanent-redirect", "https://new.example.com/"),
                ("permanent-redirect-code", "400"),
            ])
            .host("bad-code.test", "echo"),
        Ingress::new("rd", "temporal")
            .nginx_annotations(&[
                ("permanent-redirect", "https://permanent.example/"),
                ("temporal-redirect", "http://temporal.example/"),
                ("temporal-redirect-code", "307"),
            ])
            .host("temporal.test", "echo"),
        Ingress::new("rd", "bad-url")
            .nginx_annotations(&[("permanent-redirect", "/relative")])
            .host("bad-url.test", "echo"),
        Ingress::new("rd", "app")
            .nginx_annotations(&[("app-root", "/app/")])
            .host("app.test", "echo")
            .host("", "echo"),
    ];
    dir.write("ingress.yaml", &ingresses.map(|i| i.build()))?;
    let duet = DuetBuilder::new(DUET, dir.path()).start().await?;
    for family in Family::BOTH {
        let to = duet.http(family);
        for (host, path, code, location) in [
            // Before the HTTPS redirect of its TLS host; the path is not appended.
            (
                "moved.test",
                "/some/path?q=1",
                301,
                "https://new.example.com/landing",
            ),
            (
                "moved-308.test",
                "/",
                308,
                "https://[2001:db8::1]:8443/x?y=1",
            ),
            ("bad-code.test", "/", 301, "https://new.example.com/"),
            ("temporal.test", "/a", 307, "http://temporal.example/"),
            ("app.test:8080", "/", 302, "http://app.test:8080/app/"),
        ] {
            let reply = client::get(to, host, path).await?;
            assert_eq!(reply.status, code, "{family} {host}{path}");
            assert_eq!(
                reply.header("location"),
                Some(location),
                "{family} {host}{path}"
            );
        }
        // app-root redirects only `/`; an invalid URL leaves the Ingress proxied.
        client::expect_status(&client::get(to, "app.test", "/app/").await?, 200)?;
        client::expect_status(&client::get(to, "bad-url.test", "/").await?, 200)?;
        // An IP-literal Host (the host-less rule) keeps its brackets.
        let literal = match family {
            Family::V4 => to.to_string(),
            Family::V6 => format!("[::1]:{}", to.port()),
        };
        let reply = client::get(to, &literal, "/").await?;
        assert_eq!(reply.status, 302, "{family}");
        assert_eq!(
            reply.header("location"),
            Some(format!("http://{literal}/app/").as_str())
        );
    }
    let text = duet.debug_routes().await?["annotations"].to_string();
    for (key, status) in [
        ("permanent-redirect", "honoured"),
        ("permanent-redirect-code", "invalid-value"),
        ("temporal-redirect-code", "honoured"),
        ("app-root", "honoured"),
    ] {
        let want = format!(r#""key":"{N}{key}","status":"{status}""#);
        assert!(text.contains(&want), "{want}: {text}");
    }
    Ok(())
}

/// `allowlist-source-range` (and its alias `whitelist-source-range`) and `denylist-source-range`
/// with IPv4 and IPv6 ranges: a denied or not allowed client gets 403 (the deny list first), a
/// list that does not parse fails closed with 503, for that Ingress only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn source_ranges_admit_by_family_and_fail_closed() -> anyhow::Result<()> {
    let fleet = Fleet::start("acl", "echo", &[PodSpec::dual("dual")])?;
    let dir = ManifestDir::with_class()?;
    dir.write("echo.yaml", &fleet.manifests())?;
    let acl = |name: &str, pairs: &[(&str, &str)]| {
        Ingress::new("acl", name)
            .nginx_annotations(pairs)
            .host(&format!("{name}.test"), "echo")
            .build()
    };
    dir.write(
        "ingress.yaml",
        &[
            acl("v4-only", &[("allowlist-source-range", "127.0.0.0/8")]),
            acl("v6-only", &[("whitelist-source-range", "::1")]),
            acl(
                "both",
                &[("allowlist-source-range", "127.0.0.1/32, ::1/128")],
            ),
            acl("deny-v6", &[("denylist-source-range", "::/0")]),
            acl(
                "deny-first",
                &[
                    ("allowlist-source-range", "0.0.0.0/0,::/0"),
                    ("denylist-source-range", "127.0.0.1"),
                ],
            ),
            acl(
                "trailing-comma",
                &[("allowlist-source-range", "127.0.0.0/8,")],
            ),
            acl("bad-deny", &[("denylist-source-range", "localhost")]),
            acl("open", &[]),
        ],
    )?;
    let duet = DuetBuilder::new(DUET, dir.path()).start().await?;
    for family in Family::BOTH {
        let to = duet.http(family);
        let v4 = family == Family::V4;
        for (name, want) in [
            ("v4-only", if v4 { 200 } else { 403 }),
            ("v6-only", if v4 { 403 } else { 200 }),
            ("both", 200),
            ("deny-v6", if v4 { 200 } else { 403 }),
            ("deny-first", if v4 { 403 } else { 200 }),
            ("trailing-comma", 503),
            ("bad-deny", 503),
            ("open", 200),
        ] {
            let reply = client::get(to, &format!("{name}.test"), "/").await?;
            assert_eq!(reply.status, want, "{family} {name}: {}", reply.text());
            if want == 200 {
                assert_eq!(reply.echo()?.family, family, "{family} {name}");
            } else {
                assert_eq!(reply.header("server"), Some("duet"), "{family} {name}");
            }
        }
    }
    let text = duet.debug_routes().await?["annotations"].to_string();
    for (key, status) in [
        ("whitelist-source-range", "honoured-with-difference"),
        ("denylist-source-range", "invalid-value"),
    ] {
        let want = format!(r#""key":"{N}{key}","status":"{status}""#);
        assert!(text.contains(&want), "{want}: {text}");
    }
    Ok(())
}

/// Behind a load balancer that terminates TLS: `X-Forwarded-Proto: https` from a trusted proxy
/// (`--trusted-proxies`, both families) counts as HTTPS for `force-ssl-redirect` and the TLS
/// hosts' redirect, so there is no redirect loop; from an untrusted peer it is ignored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarded_https_from_trusted_proxies_is_not_redirected() -> anyhow::Result<()> {
    let fleet = Fleet::start("lb", "echo", &[PodSpec::dual("dual")])?;
    let dir = ManifestDir::with_class()?;
    dir.write("echo.yaml", &fleet.manifests())?;
    let cert = tls::cert(&["tls.test"]);
    dir.write("secret.yaml", &[tls::secret("lb", "cert", &cert)])?;
    let ingresses = [
        Ingress::new("lb", "force")
            .nginx_annotations(&[("force-ssl-redirect", "true"), ("app-root", "/app")])
            .host("force.test", "echo"),
        Ingress::new("lb", "tls")
            .host("tls.test", "echo")
            .tls(&["tls.test"], "cert"),
    ];
    dir.write("ingress.yaml", &ingresses.map(|i| i.build()))?;
    let trusting = DuetBuilder::new(DUET, dir.path())
        .args(["--trusted-proxies", "127.0.0.1,::1"])
        .start()
        .await?;
    let untrusting = DuetBuilder::new(DUET, dir.path()).start().await?;
    let get = |to, host: &'static str, proto: Option<&'static str>| async move {
        let mut req = client::request(Method::GET, host, "/x");
        if let Some(proto) = proto {
            req = req.header("x-forwarded-proto", proto);
        }
        let mut conn = Conn::http1(to).await?;
        conn.send(req.body(Full::new(Bytes::new()))?).await
    };
    for family in Family::BOTH {
        for host in ["force.test", "tls.test"] {
            let to = trusting.http(family);
            let reply = get(to, host, Some("https")).await?;
            assert_eq!(reply.status, 200, "{family} {host}");
            assert_eq!(
                reply.echo()?.header("x-forwarded-proto").as_deref(),
                Some("https")
            );
            assert_eq!(
                get(to, host, Some("http")).await?.status,
                308,
                "{family} {host}"
            );
            assert_eq!(get(to, host, None).await?.status, 308, "{family} {host}");
            let to = untrusting.http(family);
            assert_eq!(
                get(to, host, Some("https")).await?.status,
                308,
                "{family} {host} untrusted"
            );
        }
        // app-root keeps the forwarded scheme.
        let mut conn = Conn::http1(trusting.http(family)).await?;
        let req =
            client::request(Method::GET, "force.test", "/").header("x-forwarded-proto", "https");
        let reply = conn.send(req.body(Full::new(Bytes::new()))?).await?;
        assert_eq!(reply.status, 302, "{family}");
        assert_eq!(
            reply.header("location"),
            Some("https://force.test/app"),
            "{family}"
        );
    }
    Ok(())
}

/// `rewrite-target` and `use-regex` with ingress-nginx's semantics: the docs' canonical
/// `/something(/|$)(.*)` -> `/$2` (query kept, `X-Forwarded-Prefix` sent), over HTTP/1.1 and h2
/// upstreams; every path of the host, also of another Ingress, becomes a case-insensitive regex
/// prefix (a host without the annotations keeps case-sensitive element-wise Prefix); a path regex
/// that does not compile is skipped and reported while the host's other paths serve; a full-URL
/// target answers 302.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rewrite_target_and_use_regex_as_ingress_nginx() -> anyhow::Result<()> {
    let app = Fleet::start("rw", "app", &[PodSpec::dual("a")])?;
    let other = Fleet::start("rw", "other", &[PodSpec::dual("o")])?;
    let dir = ManifestDir::with_class()?;
    dir.write("svc.yaml", &[app.manifests(), other.manifests()].concat())?;
    let path = |i: Ingress, host: &str, kind: PathType, path: &str, svc: &str| {
        i.path(Some(host), kind, path, svc, PortRef::Name("http".into()))
    };
    use PathType::{ImplementationSpecific as Is, Prefix};
    let ingresses = [
        path(
            Ingress::new("rw", "rewrite").nginx_annotations(&[
                ("rewrite-target", "/$2"),
                ("use-regex", "true"),
                ("x-forwarded-prefix", "/something"),
            ]),
            "rw.test",
            Is,
            "/something(/|$)(.*)",
            "app",
        ),
        // No annotation, but on the same host: its Prefix path becomes `~* "^/Static"`.
        path(
            Ingress::new("rw", "plain"),
            "rw.test",
            Prefix,
            "/Static",
            "other",
        ),
        path(
            Ingress::new("rw", "elsewhere"),
            "case.test",
            Prefix,
            "/Static",
            "other",
        ),
        path(
            Ingress::new("rw", "h2")
                .nginx_annotations(&[("rewrite-target", "/v1/$1"), ("backend-protocol", "GRPC")]),
            "h2.test",
            Is,
            "/api/(.*)",
            "app",
        ),
        path(
            path(
                Ingress::new("rw", "bad").nginx_annotations(&[("use-regex", "true")]),
                "bad.test",
                Is,
                "/(?!admin)x",
                "app",
            ),
            "bad.test",
            Is,
            "/good",
            "other",
        ),
        path(
            Ingress::new("rw", "away")
                .nginx_annotations(&[("rewrite-target", "https://new.example.com/$1")]),
            "away.test",
            Is,
            "/old/(.*)",
            "app",
        ),
        path(
            Ingress::new("rw", "root").nginx_annotations(&[("rewrite-target", "/")]),
            "root.test",
            Prefix,
            "/api",
            "app",
        ),
    ];
    dir.write("ingress.yaml", &ingresses.map(|i| i.build()))?;
    let duet = DuetBuilder::new(DUET, dir.path()).start().await?;
    for family in Family::BOTH {
        let to = duet.http(family);
        // (host, request, service, upstream path and query)
        for (host, request, service, upstream) in [
            ("rw.test", "/something/a/b?x=1", "app", "/a/b?x=1"),
            ("rw.test", "/something", "app", "/"),
            ("rw.test", "/SomeThing/new?q", "app", "/new?q"),
            ("rw.test", "/static/x?y=2", "other", "/static/x?y=2"),
            ("rw.test", "/STATICfoo", "other", "/STATICfoo"),
            ("bad.test", "/GOOD/1", "other", "/GOOD/1"),
            ("root.test", "/api/v2/items?z=3", "app", "/?z=3"),
        ] {
            let reply = client::get(to, host, request).await?;
            assert_eq!(
                reply.status,
                200,
                "{family} {host}{request}: {}",
                reply.text()
            );
            let echo = reply.echo()?;
            assert_eq!(
                (echo.service.as_str(), echo.path.as_str(), echo.family),
                (service, upstream, family),
                "{host}{request}"
            );
            // Only where a rewrite happens.
            let prefix = echo.headers.get("X-Forwarded-Prefix").cloned();
            let rewritten = (host, service) == ("rw.test", "app");
            let want = rewritten.then(|| vec!["/something".to_owned()]);
            assert_eq!(prefix, want, "{host}{request}");
        }
        // Without the annotations on its host, Prefix stays case-sensitive and element-wise.
        for (host, request) in [
            ("case.test", "/static/x"),
            ("case.test", "/Staticfoo"),
            ("bad.test", "/x"),
            ("rw.test", "/elsewhere"),
        ] {
            let reply = client::get(to, host, request).await?;
            assert_eq!(reply.status, 404, "{family} {host}{request}");
        }
        let reply = client::get(to, "case.test", "/Static/x").await?;
        client::expect_status(&reply, 200)?;
        // An h2 upstream gets the rewritten path too.
        let reply = client::get(to, "h2.test", "/API/users/7?full=1").await?;
        client::expect_status(&reply, 200)?;
        let echo = reply.echo()?;
        assert_eq!(
            (echo.proto.as_str(), echo.path.as_str()),
            ("HTTP/2.0", "/v1/users/7?full=1"),
            "{family}"
        );
        // A full URL redirects with 302, captures substituted and the query appended.
        let reply = client::get(to, "away.test", "/old/page?x=1").await?;
        assert_eq!(reply.status, 302, "{family}");
        assert_eq!(
            reply.header("location"),
            Some("https://new.example.com/page?x=1"),
            "{family}"
        );
    }
    let routes = duet.debug_routes().await?;
    let text = routes["annotations"].to_string();
    for (ingress, key, status) in [
        ("rewrite", "rewrite-target", "honoured-with-difference"),
        ("rewrite", "use-regex", "honoured-with-difference"),
        ("rewrite", "x-forwarded-prefix", "honoured"),
        ("bad", "use-regex", "invalid-value"),
        ("away", "rewrite-target", "honoured-with-difference"),
    ] {
        let report = routes["annotations"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|r| r["ingress"]["name"] == ingress)
            .map(|r| r["annotations"].to_string())
            .unwrap_or_default();
        let want = format!(r#""key":"{N}{key}","status":"{status}""#);
        assert!(report.contains(&want), "{ingress}: {want}: {text}");
    }
    assert!(text.contains("look-around"), "{text}");
    assert_eq!(
        diagnostics_of(&routes, "bad"),
        ["InvalidPath"],
        "{routes:#}"
    );
    assert!(diagnostics_of(&routes, "rewrite").is_empty(), "{routes:#}");
    Ok(())
}
