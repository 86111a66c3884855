//! End to end, over real sockets on 127.0.0.1 and [::1]: host and path routing as the upstream
//! conformance features state it (host_rules, path_rules, default_backend), precedence across
//! Ingresses, 404/502/503 with short bodies, and the admin endpoints (probes on the admin listener,
//! `/debug/routes` only on the debug listener).

use conformance::client::{self, Conn, Reply};
use conformance::http::{self, Method};
use conformance::manifests::FAMILY_ANNOTATION;
use conformance::{
    Duet, DuetBuilder, Family, Fleet, Ingress, ManifestDir, PathType, PodSpec, Port, PortRef,
};
use serde_json::Value;

const DUET: &str = env!("CARGO_BIN_EXE_duet");

/// Error bodies are short: a line, not a page.
const SHORT: usize = 128;

fn http() -> PortRef {
    PortRef::Name("http".into())
}

fn port_8080() -> PortRef {
    PortRef::Number(8080)
}

/// Starts one dual-stack pod per Service (named after it), writes the Services, the Ingresses and
/// the class, and starts duet.
async fn setup(
    services: &[&str],
    ingresses: &[Ingress],
    args: &[&str],
) -> anyhow::Result<(Vec<Fleet>, ManifestDir, Duet)> {
    let dir = ManifestDir::with_class()?;
    let mut fleets = Vec::new();
    for svc in services {
        let fleet = Fleet::start("e2e", svc, &[PodSpec::dual(&format!("{svc}-pod"))])?;
        dir.write(&format!("svc-{svc}.yaml"), &fleet.manifests())?;
        fleets.push(fleet);
    }
    let docs: Vec<_> = ingresses.iter().map(Ingress::build).collect();
    dir.write("ingresses.yaml", &docs)?;
    let duet = DuetBuilder::new(DUET, dir.path())
        .args(args.iter().copied())
        .start()
        .await?;
    Ok((fleets, dir, duet))
}

/// Asserts a request is served by `service` (`None`: answered 404 with a short body).
async fn expect_route(
    conn: &mut Conn,
    host: &str,
    path: &str,
    service: Option<&str>,
) -> anyhow::Result<()> {
    let reply = conn.get(host, path).await?;
    let what = format!("{} GET http://{host}{path}", conn.family());
    match service {
        Some(svc) => {
            assert_eq!(reply.status, 200, "{what}: {}", reply.text());
            let echo = reply.echo()?;
            assert_eq!(echo.service, svc, "{what}");
            assert_eq!(echo.host, host, "{what}");
            assert_eq!(echo.path, path, "{what}");
        }
        None => expect_error(&reply, 404, &what),
    }
    Ok(())
}

fn expect_error(reply: &Reply, status: u16, what: &str) {
    assert_eq!(reply.status, status, "{what}: {}", reply.text());
    assert!(
        !reply.body.is_empty() && reply.body.len() <= SHORT,
        "{what}: body {:?}",
        reply.text()
    );
    assert_eq!(reply.header("server"), Some("duet"), "{what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_rules_exact_wildcard_and_404() -> anyhow::Result<()> {
    // host_rules.feature: `*.foo.com` by port number, `foo.bar.com` by port name.
    let ing = Ingress::new("e2e", "host-rules")
        .path(
            Some("*.foo.com"),
            PathType::Prefix,
            "/",
            "wildcard-foo-com",
            port_8080(),
        )
        .path(
            Some("foo.bar.com"),
            PathType::Prefix,
            "/",
            "foo-bar-com",
            http(),
        );
    let (_fleets, _dir, duet) = setup(&["wildcard-foo-com", "foo-bar-com"], &[ing], &[]).await?;
    for family in Family::BOTH {
        let mut conn = Conn::http1(duet.http(family)).await?;
        expect_route(&mut conn, "foo.bar.com", "/", Some("foo-bar-com")).await?;
        expect_route(&mut conn, "subdomain.bar.com", "/", None).await?;
        expect_route(&mut conn, "bar.foo.com", "/", Some("wildcard-foo-com")).await?;
        expect_route(&mut conn, "baz.bar.foo.com", "/", None).await?;
        expect_route(&mut conn, "foo.com", "/", None).await?;
        // Host matching ignores case and the port.
        let port = duet.http(family).port();
        let reply = conn.get(&format!("FOO.Bar.com:{port}"), "/x").await?;
        assert_eq!(reply.echo()?.service, "foo-bar-com");
        // The 404 comes on a connection that stays usable.
        expect_route(&mut conn, "foo.bar.com", "/after-404", Some("foo-bar-com")).await?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn path_rules_exact_prefix_and_precedence() -> anyhow::Result<()> {
    // path_rules.feature, every scenario.
    let ing = Ingress::new("e2e", "path-rules")
        .path(
            Some("exact-path-rules"),
            PathType::Exact,
            "/foo",
            "foo-exact",
            port_8080(),
        )
        .path(
            Some("prefix-path-rules"),
            PathType::Prefix,
            "/foo",
            "foo-prefix",
            port_8080(),
        )
        .path(
            Some("prefix-path-rules"),
            PathType::Prefix,
            "/aaa/bbb",
            "aaa-slash-bbb-prefix",
            port_8080(),
        )
        .path(
            Some("prefix-path-rules"),
            PathType::Prefix,
            "/aaa",
            "aaa-prefix",
            port_8080(),
        )
        .path(
            Some("mixed-path-rules"),
            PathType::Prefix,
            "/foo",
            "foo-prefix",
            port_8080(),
        )
        .path(
            Some("mixed-path-rules"),
            PathType::Exact,
            "/foo",
            "foo-exact",
            port_8080(),
        )
        .path(
            Some("trailing-slash-path-rules"),
            PathType::Prefix,
            "/aaa/bbb/",
            "aaa-slash-bbb-slash-prefix",
            port_8080(),
        )
        .path(
            Some("trailing-slash-path-rules"),
            PathType::Exact,
            "/foo/",
            "foo-slash-exact",
            port_8080(),
        )
        .path(
            Some("impl-path-rules"),
            PathType::ImplementationSpecific,
            "/impl",
            "foo-prefix",
            port_8080(),
        );
    let services = [
        "foo-exact",
        "foo-prefix",
        "aaa-slash-bbb-prefix",
        "aaa-prefix",
        "aaa-slash-bbb-slash-prefix",
        "foo-slash-exact",
    ];
    let (_fleets, _dir, duet) = setup(&services, &[ing], &[]).await?;
    let table: &[(&str, &str, Option<&str>)] = &[
        ("exact-path-rules", "/foo", Some("foo-exact")),
        ("exact-path-rules", "/foo/", None),
        ("exact-path-rules", "/FOO", None),
        ("exact-path-rules", "/bar", None),
        ("prefix-path-rules", "/foo", Some("foo-prefix")),
        ("prefix-path-rules", "/foo/", Some("foo-prefix")),
        ("prefix-path-rules", "/FOO", None),
        (
            "prefix-path-rules",
            "/aaa/bbb",
            Some("aaa-slash-bbb-prefix"),
        ),
        (
            "prefix-path-rules",
            "/aaa/bbb/ccc",
            Some("aaa-slash-bbb-prefix"),
        ),
        ("prefix-path-rules", "/aaa/ccc", Some("aaa-prefix")),
        ("prefix-path-rules", "/aaaccc", None),
        ("mixed-path-rules", "/foo", Some("foo-exact")),
        ("mixed-path-rules", "/foo/bar", Some("foo-prefix")),
        (
            "trailing-slash-path-rules",
            "/aaa/bbb",
            Some("aaa-slash-bbb-slash-prefix"),
        ),
        (
            "trailing-slash-path-rules",
            "/aaa/bbb/",
            Some("aaa-slash-bbb-slash-prefix"),
        ),
        ("trailing-slash-path-rules", "/foo", None),
        (
            "trailing-slash-path-rules",
            "/foo/",
            Some("foo-slash-exact"),
        ),
        // ImplementationSpecific is documented as Prefix.
        ("impl-path-rules", "/impl/x", Some("foo-prefix")),
        ("impl-path-rules", "/implx", None),
        // The query is not part of the path match.
        ("exact-path-rules", "/foo?x=1", Some("foo-exact")),
    ];
    for family in Family::BOTH {
        let mut conn = Conn::http1(duet.http(family)).await?;
        for (host, path, service) in table {
            expect_route(&mut conn, host, path, *service).await?;
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_merge_across_ingresses_and_the_oldest_wins_a_conflict() -> anyhow::Result<()> {
    let ingresses = [
        // Same host in two Ingresses: their paths merge.
        Ingress::new("e2e", "merge-a").path(
            Some("merge.test"),
            PathType::Prefix,
            "/a",
            "one",
            http(),
        ),
        Ingress::new("e2e", "merge-b").path(
            Some("merge.test"),
            PathType::Prefix,
            "/b",
            "two",
            http(),
        ),
        // Same host and path: the older Ingress wins, whatever the names say.
        Ingress::new("e2e", "aaa-newer")
            .created("2025-06-01T00:00:00Z")
            .path(Some("conflict.test"), PathType::Prefix, "/", "one", http()),
        Ingress::new("e2e", "zzz-older")
            .created("2020-01-01T00:00:00Z")
            .path(Some("conflict.test"), PathType::Prefix, "/", "two", http()),
        // Same age: namespace/name decides.
        Ingress::new("e2e", "tie-b").path(Some("tie.test"), PathType::Prefix, "/", "two", http()),
        Ingress::new("e2e", "tie-a").path(Some("tie.test"), PathType::Prefix, "/", "one", http()),
    ];
    let (_fleets, _dir, duet) = setup(&["one", "two"], &ingresses, &[]).await?;
    for family in Family::BOTH {
        let mut conn = Conn::http1(duet.http(family)).await?;
        expect_route(&mut conn, "merge.test", "/a/x", Some("one")).await?;
        expect_route(&mut conn, "merge.test", "/b/x", Some("two")).await?;
        expect_route(&mut conn, "merge.test", "/c", None).await?;
        expect_route(&mut conn, "conflict.test", "/", Some("two")).await?;
        expect_route(&mut conn, "tie.test", "/", Some("one")).await?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_backend_serves_any_host_and_unmatched_paths() -> anyhow::Result<()> {
    // default_backend.feature: an Ingress with only a defaultBackend, every method.
    let ingresses = [
        Ingress::new("e2e", "default-backend").default_backend("echo-service", port_8080()),
        Ingress::new("e2e", "some-paths").path(
            Some("paths.test"),
            PathType::Exact,
            "/only",
            "other",
            http(),
        ),
    ];
    let (_fleets, _dir, duet) = setup(&["echo-service", "other"], &ingresses, &[]).await?;
    for family in Family::BOTH {
        let addr = duet.http(family);
        let mut conn = Conn::http1(addr).await?;
        let rows = [
            ("GET", "my-host".to_owned(), "/"),
            ("GET", "my-host".to_owned(), "/sub-path"),
            ("POST", "some-host".to_owned(), "/"),
            // No host given: the Host is the address connected to ([::1]:port for IPv6).
            ("PUT", addr.to_string(), "/resource"),
            ("DELETE", "some-host".to_owned(), "/resource"),
            ("PATCH", "my-host".to_owned(), "/resource"),
        ];
        for (method, host, path) in rows {
            let what = format!("{family} {method} http://{host}{path}");
            let mut req = client::request(Method::from_bytes(method.as_bytes())?, &host, path)
                .header("user-agent", "Go-http-client/1.1");
            if method != "GET" && method != "DELETE" {
                req = req.header("content-length", "0");
            }
            let reply = conn
                .send(req.body(conformance::http_body_util::Full::new(
                    conformance::bytes::Bytes::new(),
                ))?)
                .await?;
            assert_eq!(reply.status, 200, "{what}: {}", reply.text());
            assert_eq!(reply.version, http::Version::HTTP_11, "{what}");
            for header in ["content-length", "content-type", "date", "server"] {
                assert!(
                    reply.header(header).is_some(),
                    "{what}: response lacks {header}"
                );
            }
            let echo = reply.echo()?;
            assert_eq!(echo.service, "echo-service", "{what}");
            assert_eq!(echo.method, method, "{what}");
            assert_eq!(echo.path, path, "{what}");
            assert_eq!(echo.host, host, "{what}");
            assert_eq!(echo.proto, "HTTP/1.1", "{what}");
            assert_eq!(
                echo.header_values("user-agent"),
                ["Go-http-client/1.1"],
                "{what}"
            );
        }
        // A host with rules but no matching path falls back to the default backend.
        expect_route(&mut conn, "paths.test", "/only", Some("other")).await?;
        expect_route(&mut conn, "paths.test", "/else", Some("echo-service")).await?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_ready_endpoint_is_503_and_refused_targets_are_502() -> anyhow::Result<()> {
    let dir = ManifestDir::with_class()?;
    let ok = Fleet::start("e2e", "ok", &[PodSpec::v4_only("ok-pod")])?;
    let unready = Fleet::start(
        "e2e",
        "unready",
        &[PodSpec::dual("unready-pod").not_ready()],
    )?;
    let refused = Fleet::start(
        "e2e",
        "refused",
        &[
            PodSpec::dual("closed-dual")
                .with(Family::V4, Port::Closed)
                .with(Family::V6, Port::Closed),
            PodSpec::v4_only("closed-v4").with(Family::V4, Port::Closed),
            PodSpec::v6_only("closed-v6").with(Family::V6, Port::Closed),
        ],
    )?;
    for fleet in [&ok, &unready, &refused] {
        dir.write(&format!("{}.yaml", fleet.service()), &fleet.manifests())?;
    }
    // A Service with no EndpointSlice at all.
    dir.write(
        "bare.yaml",
        &[conformance::manifests::service(
            "e2e",
            "bare",
            &[conformance::fleet::SERVICE_PORT],
        )],
    )?;
    let ingresses = [
        Ingress::new("e2e", "errors")
            .host("unready.test", "unready")
            .host("bare.test", "bare")
            .host("refused.test", "refused")
            .host("ok.test", "ok"),
        // Only IPv4 pods and RequireSameFamily: no candidate for IPv6 clients.
        Ingress::new("e2e", "strict")
            .annotation(FAMILY_ANNOTATION, "RequireSameFamily")
            .host("strict.test", "ok"),
    ];
    let docs: Vec<_> = ingresses.iter().map(Ingress::build).collect();
    dir.write("ingresses.yaml", &docs)?;
    let duet = DuetBuilder::new(DUET, dir.path()).start().await?;
    for family in Family::BOTH {
        let mut conn = Conn::http1(duet.http(family)).await?;
        for (host, status) in [
            ("unready.test", 503),
            ("bare.test", 503),
            ("refused.test", 502),
        ] {
            // Twice: the second time the failing families may be ejected already.
            for attempt in 0..2 {
                if conn.is_closed() {
                    conn = Conn::http1(duet.http(family)).await?;
                }
                let reply = conn.get(host, "/").await?;
                expect_error(
                    &reply,
                    status,
                    &format!("{family} {host} attempt {attempt}"),
                );
            }
        }
        let strict = client::get(duet.http(family), "strict.test", "/").await?;
        match family {
            Family::V4 => assert_eq!(strict.echo()?.pod, "ok-pod"),
            Family::V6 => expect_error(
                &strict,
                503,
                "IPv6 client, IPv4-only pods, RequireSameFamily",
            ),
        }
        let fine = client::get(duet.http(family), "ok.test", "/").await?;
        assert_eq!(fine.echo()?.family, Family::V4);
    }
    Ok(())
}

/// Every JSON object in `doc` (recursively).
fn objects(doc: &Value) -> Vec<&serde_json::Map<String, Value>> {
    let mut out = Vec::new();
    let mut stack = vec![doc];
    while let Some(v) = stack.pop() {
        match v {
            Value::Object(m) => {
                out.push(m);
                stack.extend(m.values());
            }
            Value::Array(a) => stack.extend(a.iter()),
            _ => {}
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_on_admin_and_debug_routes_on_the_debug_listener_on_both_families(
) -> anyhow::Result<()> {
    let dir = ManifestDir::with_class()?;
    let fleet = Fleet::start(
        "e2e",
        "echo",
        &[
            PodSpec::dual("dual"),
            PodSpec::v4_only("v4only"),
            PodSpec::v6_only("v6only"),
        ],
    )?;
    dir.write("echo.yaml", &fleet.manifests())?;
    dir.write(
        "ingress.yaml",
        &[Ingress::new("e2e", "echo")
            .host("admin.test", "echo")
            .build()],
    )?;
    let duet = DuetBuilder::new(DUET, dir.path()).start().await?;
    for family in Family::BOTH {
        for path in ["/healthz", "/readyz"] {
            let reply = duet.admin_get(family, path).await?;
            assert_eq!(reply.status, 200, "{family} {path}: {}", reply.text());
        }
        // The admin listener (reached by the kubelet and Prometheus, often on a wildcard
        // address) does not show pod addresses and Secret names; the debug listener does.
        let hidden = duet.admin_get(family, "/debug/routes").await?;
        assert_eq!(hidden.status, 404, "{family}: {}", hidden.text());
        assert_eq!(duet.debug_get(family, "/metrics").await?.status, 404);
        let reply = duet.debug_get(family, "/debug/routes").await?;
        assert_eq!(reply.status, 200);
        assert!(reply
            .header("content-type")
            .is_some_and(|c| c.contains("json")));
        let doc: Value = serde_json::from_slice(&reply.body)?;
        let text = doc.to_string();
        assert!(
            text.contains("admin.test"),
            "/debug/routes lacks the host: {text}"
        );
        // One target per pod, each with its v4 and v6 address (null where it has none).
        let targets: Vec<_> = objects(&doc)
            .into_iter()
            .filter(|o| o.contains_key("v4") && o.contains_key("v6"))
            .collect();
        for pod in fleet.pods() {
            let show = |a: Option<std::net::SocketAddr>| {
                a.map(|a| Value::String(a.to_string()))
                    .unwrap_or(Value::Null)
            };
            let found = targets
                .iter()
                .any(|t| t["v4"] == show(pod.v4) && t["v6"] == show(pod.v6));
            assert!(
                found,
                "no target for pod {} (v4 {:?}, v6 {:?}) in {text}",
                pod.name, pod.v4, pod.v6
            );
        }
        // The dual-stack pod is one target, not one per family.
        let dual = fleet.pod("dual");
        let split = targets.iter().any(|t| {
            (t["v4"] == Value::String(dual.v4.unwrap().to_string()) && t["v6"].is_null())
                || (t["v6"] == Value::String(dual.v6.unwrap().to_string()) && t["v4"].is_null())
        });
        assert!(
            !split,
            "the dual-stack pod is split into single-family targets: {text}"
        );
    }
    assert_eq!(duet.admin_get(Family::V4, "/nope").await?.status, 404);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_upstreams_get_504_and_the_proxy_keeps_serving() -> anyhow::Result<()> {
    let ing = Ingress::new("e2e", "slow").host("slow.test", "slow");
    let (_fleets, _dir, duet) = setup(&["slow"], &[ing], &["--upstream-timeout", "500ms"]).await?;
    for family in Family::BOTH {
        let mut conn = Conn::http1(duet.http(family)).await?;
        let started = std::time::Instant::now();
        let req = client::request(Method::GET, "slow.test", "/")
            .header("x-echo-delay-ms", "10000")
            .body(conformance::http_body_util::Full::new(
                conformance::bytes::Bytes::new(),
            ))?;
        let reply = conn.send(req).await?;
        expect_error(&reply, 504, &format!("{family} slow upstream"));
        // Not before the 500 ms timeout; and duet gave up, the upstream did not answer (it
        // waits 10 s): the upper bound is 10 times the timeout, not a speed goal.
        let took = started.elapsed();
        assert!(
            took >= std::time::Duration::from_millis(500)
                && took < std::time::Duration::from_secs(5),
            "{family}: 504 took {took:?}"
        );
        let fast = client::get(duet.http(family), "slow.test", "/").await?;
        assert_eq!(fast.status, 200, "{family}: {}", fast.text());
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_ingresses_of_our_class_are_served() -> anyhow::Result<()> {
    let ingresses = [
        Ingress::new("e2e", "ours").host("ours.test", "svc"),
        // ingress_class.feature: a class that does not exist.
        Ingress::new("e2e", "invalid-class")
            .class(Some("some-invalid-class-name"))
            .host("invalid.test", "svc"),
        // No class, and our IngressClass is not the default one.
        Ingress::new("e2e", "no-class")
            .class(None)
            .host("noclass.test", "svc"),
        // The legacy annotation naming our class.
        Ingress::new("e2e", "legacy")
            .class(None)
            .annotation("kubernetes.io/ingress.class", "duet")
            .host("legacy.test", "svc"),
    ];
    let (_fleets, _dir, duet) = setup(&["svc"], &ingresses, &[]).await?;
    for family in Family::BOTH {
        let mut conn = Conn::http1(duet.http(family)).await?;
        expect_route(&mut conn, "ours.test", "/", Some("svc")).await?;
        expect_route(&mut conn, "legacy.test", "/", Some("svc")).await?;
        expect_route(&mut conn, "invalid.test", "/", None).await?;
        expect_route(&mut conn, "noclass.test", "/", None).await?;
    }
    // With --watch-ingress-without-class the class-less Ingress is served too.
    let (_fleets, _dir, duet) =
        setup(&["svc"], &ingresses, &["--watch-ingress-without-class"]).await?;
    for family in Family::BOTH {
        let mut conn = Conn::http1(duet.http(family)).await?;
        expect_route(&mut conn, "noclass.test", "/", Some("svc")).await?;
        expect_route(&mut conn, "invalid.test", "/", None).await?;
    }
    Ok(())
}
