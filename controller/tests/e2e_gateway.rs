//! End to end in `--manifests` mode, over real sockets on 127.0.0.1 and [::1]: a GatewayClass of
//! duet's, a Gateway and HTTPRoutes in a folder, served on the Gateway's own listener port (in
//! this mode the pod port is the listener port). Clients of each family reach the pods over their
//! own family; listener isolation; hostname intersection; path precedence; weighted backendRefs
//! with one target per pod; 500 for a backendRef that does not resolve.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use conformance::bytes::Bytes;
use conformance::client::{self, Conn};
use conformance::duet::free_port;
use conformance::http_body_util::Full;
use conformance::manifests::gateway_class;
use conformance::{DuetBuilder, Family, Fleet, ManifestDir, PodSpec};
use serde_json::{json, Value};

const DUET: &str = env!("CARGO_BIN_EXE_duet");
const NS: &str = "e2e";

fn gateway(port: u16, listeners: &[(&str, Option<&str>)]) -> Value {
    let listeners: Vec<Value> = listeners
        .iter()
        .map(|(name, host)| {
            let mut l = json!({"name": name, "port": port, "protocol": "HTTP"});
            if let Some(h) = host {
                l["hostname"] = json!(h);
            }
            l
        })
        .collect();
    json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
        "metadata": {"name": "gw", "namespace": NS},
        "spec": {"gatewayClassName": "duet", "listeners": listeners}
    })
}

/// A backendRef: `(kind, name, weight)`.
type Backend<'a> = (&'a str, &'a str, u32);

/// A rule: `(path type, path, backends)`.
type Rule<'a> = (&'a str, &'a str, &'a [Backend<'a>]);

/// An HTTPRoute of one rule per [`Rule`].
fn route(name: &str, section: Option<&str>, hostnames: &[&str], rules: &[Rule<'_>]) -> Value {
    let mut parent = json!({"name": "gw"});
    if let Some(s) = section {
        parent["sectionName"] = json!(s);
    }
    let rules: Vec<Value> = rules
        .iter()
        .map(|(kind, path, backends)| {
            let refs: Vec<Value> = backends
                .iter()
                .map(|(k, n, w)| json!({"kind": k, "name": n, "port": 8080, "weight": w}))
                .collect();
            json!({"matches": [{"path": {"type": kind, "value": path}}], "backendRefs": refs})
        })
        .collect();
    json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"parentRefs": [parent], "hostnames": hostnames, "rules": rules}
    })
}

fn svc(name: &str) -> Backend<'_> {
    ("Service", name, 1)
}

/// Starts the fleets (one Service each), writes them and `docs`, starts duet.
async fn setup(
    fleets: &[(&str, Vec<PodSpec>)],
    docs: Vec<Value>,
) -> anyhow::Result<(Vec<Fleet>, ManifestDir, conformance::Duet)> {
    let dir = ManifestDir::new()?;
    let mut started = Vec::new();
    for (name, pods) in fleets {
        let fleet = Fleet::start(NS, name, pods)?;
        dir.write(&format!("svc-{name}.yaml"), &fleet.manifests())?;
        started.push(fleet);
    }
    dir.write("gateway.yaml", &docs)?;
    let duet = DuetBuilder::new(DUET, dir.path()).start().await?;
    Ok((started, dir, duet))
}

fn at(family: Family, port: u16) -> SocketAddr {
    SocketAddr::new(family.loopback(), port)
}

/// The Service that answered `host` and `path` on the Gateway port (`Err` for a non-200), having
/// checked the pod was reached over the client's family.
async fn served_by(conn: &mut Conn, host: &str, path: &str) -> anyhow::Result<String> {
    let reply = conn.get(host, path).await?;
    client::expect_status(&reply, 200)?;
    let echo = reply.echo()?;
    anyhow::ensure!(
        echo.family == conn.family(),
        "{host}{path}: pod reached over {} by a {} client",
        echo.family,
        conn.family()
    );
    Ok(echo.service)
}

/// A connection to the Gateway port, once duet has bound it.
async fn connect(family: Family, port: u16) -> anyhow::Result<Conn> {
    client::eventually("Gateway listener bound", Duration::from_secs(10), || {
        Conn::http1(at(family, port))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listeners_isolate_intersect_hostnames_and_serve_both_families() -> anyhow::Result<()> {
    let port = free_port()?;
    let docs = vec![
        gateway_class(),
        gateway(
            port,
            &[
                ("exact", Some("foo.example.com")),
                ("wild", Some("*.example.com")),
                ("any", None),
            ],
        ),
        // Only on `exact`, only /exact: `foo.example.com/other` must not fall to `wild`'s routes.
        route(
            "r-exact",
            Some("exact"),
            &[],
            &[("Exact", "/exact", &[svc("gw-exact")])],
        ),
        route(
            "r-wild",
            Some("wild"),
            &[],
            &[("PathPrefix", "/", &[svc("gw-wild")])],
        ),
        // Intersected with `*.example.com`: only b.example.com; `other.test` is not served there.
        route(
            "r-host",
            Some("wild"),
            &["b.example.com", "other.test"],
            &[("PathPrefix", "/host", &[svc("gw-host")])],
        ),
        route(
            "r-any",
            Some("any"),
            &[],
            &[("PathPrefix", "/", &[svc("gw-any")])],
        ),
        // Precedence on one host: Exact before the longer prefix before the shorter one.
        route(
            "r-paths",
            Some("any"),
            &["paths.test"],
            &[
                ("PathPrefix", "/a", &[svc("gw-any")]),
                ("PathPrefix", "/a/b", &[svc("gw-wild")]),
                ("Exact", "/a/b/c", &[svc("gw-host")]),
                ("RegularExpression", "/re/[0-9]+", &[svc("gw-exact")]),
            ],
        ),
    ];
    let fleets: Vec<(&str, Vec<PodSpec>)> = ["gw-exact", "gw-wild", "gw-host", "gw-any"]
        .into_iter()
        .map(|s| (s, vec![PodSpec::dual(&format!("{s}-pod"))]))
        .collect();
    let (_fleets, _dir, duet) = setup(&fleets, docs).await?;
    for family in Family::BOTH {
        let mut conn = connect(family, port).await?;
        let got = served_by(&mut conn, "foo.example.com", "/exact").await?;
        assert_eq!(got, "gw-exact", "{family}");
        let other = conn.get("foo.example.com", "/other").await?;
        assert_eq!(
            other.status,
            404,
            "{family}: listener isolation: {}",
            other.text()
        );
        assert_eq!(
            served_by(&mut conn, "a.b.example.com", "/x").await?,
            "gw-wild"
        );
        assert_eq!(
            served_by(&mut conn, "b.example.com", "/host").await?,
            "gw-host"
        );
        assert_eq!(
            served_by(&mut conn, "c.example.com", "/host").await?,
            "gw-wild"
        );
        assert_eq!(served_by(&mut conn, "other.test", "/host").await?, "gw-any");
        assert_eq!(
            served_by(&mut conn, &format!("example.com:{port}"), "/").await?,
            "gw-any"
        );
        for (path, svc) in [
            ("/a", "gw-any"),
            ("/a/bx", "gw-any"),
            ("/a/b/x", "gw-wild"),
            ("/a/b/c", "gw-host"),
            ("/re/42", "gw-exact"),
            ("/re/42/x", "gw-any"),
        ] {
            assert_eq!(
                served_by(&mut conn, "paths.test", path).await?,
                svc,
                "{family} {path}"
            );
        }
    }
    // The Ingress listeners are untouched: no Ingress, no route.
    let reply = client::get(duet.http(Family::V4), "foo.example.com", "/exact").await?;
    assert_eq!(reply.status, 404);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weighted_backend_refs_count_each_pod_once_and_unresolved_ones_answer_500(
) -> anyhow::Result<()> {
    let port = free_port()?;
    let docs = vec![
        gateway_class(),
        gateway(port, &[("http", None)]),
        route(
            "weights",
            None,
            &[],
            &[
                (
                    "PathPrefix",
                    "/split",
                    &[("Service", "w-a", 3), ("Service", "w-b", 1)],
                ),
                ("PathPrefix", "/missing", &[svc("nope")]),
                ("PathPrefix", "/kind", &[("ConfigMap", "w-a", 1)]),
                (
                    "PathPrefix",
                    "/half",
                    &[("Service", "w-a", 1), ("Service", "nope", 1)],
                ),
            ],
        ),
    ];
    // w-a: one dual-stack pod and one IPv4-only pod; w-b: one dual-stack pod.
    let fleets = vec![
        (
            "w-a",
            vec![PodSpec::dual("a-dual"), PodSpec::v4_only("a-v4")],
        ),
        ("w-b", vec![PodSpec::dual("b-dual")]),
    ];
    let (_fleets, _dir, _duet) = setup(&fleets, docs).await?;
    const N: usize = 400;
    for family in Family::BOTH {
        let mut conn = connect(family, port).await?;
        let mut by_service: BTreeMap<String, usize> = BTreeMap::new();
        let mut by_pod: BTreeMap<String, usize> = BTreeMap::new();
        for _ in 0..N {
            let reply = conn.get("w.test", "/split").await?;
            client::expect_status(&reply, 200)?;
            let echo = reply.echo()?;
            *by_service.entry(echo.service).or_default() += 1;
            *by_pod.entry(echo.pod).or_default() += 1;
        }
        let a = by_service.get("w-a").copied().unwrap_or(0);
        // 3:1 of 400 is 300; a binomial's 6 sigma is about 52.
        assert!(
            (240..=360).contains(&a),
            "{family}: w-a got {a} of {N}: {by_service:?}"
        );
        // Within w-a each pod is one target: the dual-stack pod is not counted twice. IPv6
        // clients reach the IPv4-only pod over IPv4 (PreferSameFamily falls back).
        let dual = by_pod.get("a-dual").copied().unwrap_or(0);
        let v4 = by_pod.get("a-v4").copied().unwrap_or(0);
        // Counted per address, the dual-stack pod would get two shares in three.
        assert!(dual.abs_diff(v4) <= a / 4, "{family}: {by_pod:?}");
        for path in ["/missing", "/kind"] {
            let reply = conn.get("w.test", path).await?;
            assert_eq!(reply.status, 500, "{family} {path}: {}", reply.text());
        }
        let mut errors = 0;
        for _ in 0..200 {
            let reply = conn.get("w.test", "/half").await?;
            match reply.status.as_u16() {
                500 => errors += 1,
                200 => assert_eq!(reply.echo()?.service, "w-a"),
                other => anyhow::bail!("{family} /half: {other}"),
            }
        }
        assert!(
            (40..=160).contains(&errors),
            "{family}: {errors} of 200 answered 500"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_listeners_present_their_own_certificates_by_sni() -> anyhow::Result<()> {
    let port = free_port()?;
    let a = conformance::tls::cert(&["a.example.com"]);
    let wild = conformance::tls::cert(&["*.example.com"]);
    let https = |name: &str, host: &str, secret: &str| {
        json!({"name": name, "port": port, "protocol": "HTTPS", "hostname": host,
               "tls": {"certificateRefs": [{"name": secret}]}})
    };
    let docs = vec![
        gateway_class(),
        conformance::tls::secret(NS, "a", &a),
        conformance::tls::secret(NS, "wild", &wild),
        json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
            "metadata": {"name": "gw", "namespace": NS},
            "spec": {"gatewayClassName": "duet", "listeners": [
                https("a", "a.example.com", "a"), https("wild", "*.example.com", "wild")]}
        }),
        route(
            "r-a",
            Some("a"),
            &[],
            &[("PathPrefix", "/", &[svc("tls-a")])],
        ),
        route(
            "r-wild",
            Some("wild"),
            &[],
            &[("PathPrefix", "/", &[svc("tls-wild")])],
        ),
    ];
    let fleets: Vec<(&str, Vec<PodSpec>)> = ["tls-a", "tls-wild"]
        .into_iter()
        .map(|s| (s, vec![PodSpec::dual(&format!("{s}-pod"))]))
        .collect();
    let (_fleets, _dir, _duet) = setup(&fleets, docs).await?;
    for family in Family::BOTH {
        for (sni, cert, service) in [
            ("a.example.com", &a, "tls-a"),
            ("x.y.example.com", &wild, "tls-wild"),
        ] {
            let (mut conn, hs) =
                client::eventually("HTTPS listener", Duration::from_secs(10), || {
                    Conn::https(at(family, port), Some(sni), &["http/1.1"])
                })
                .await?;
            assert_eq!(hs.cert, cert.der, "{family} {sni}: wrong certificate");
            assert_eq!(
                served_by(&mut conn, sni, "/").await?,
                service,
                "{family} {sni}"
            );
        }
    }
    Ok(())
}

/// An HTTPRoute of raw rules (matches, filters and backendRefs as the API writes them).
fn raw_route(name: &str, rules: Value) -> Value {
    json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"parentRefs": [{"name": "gw"}], "hostnames": [format!("{name}.test")],
                 "rules": rules}
    })
}

/// A Gateway of one listener (any host) on `port` serving `routes`, with one Service of one
/// dual-stack pod per name of `services`.
async fn serve_routes(
    port: u16,
    services: &[&'static str],
    routes: Vec<Value>,
) -> anyhow::Result<(Vec<Fleet>, ManifestDir, conformance::Duet)> {
    let mut docs = vec![gateway_class(), gateway(port, &[("any", None)])];
    docs.extend(routes);
    let fleets: Vec<(&str, Vec<PodSpec>)> = services
        .iter()
        .map(|s| (*s, vec![PodSpec::dual(&format!("{s}-pod"))]))
        .collect();
    setup(&fleets, docs).await
}

/// Rule internals served on a Gateway's own port: header, query and method matches with their
/// precedence, a request header filter, a redirect; a route whose only rule asks for a filter
/// duet does not serve is not served, and the other routes keep working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_rules_match_headers_query_and_method_and_apply_filters() -> anyhow::Result<()> {
    let port = free_port()?;
    let to = |svc: &str| json!([{"name": svc, "port": 8080}]);
    let routes = vec![
        raw_route(
            "match",
            json!([
                {"matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
                 "backendRefs": to("gw-plain")},
                {"matches": [{"headers": [{"name": "x-version", "value": "2"}]}],
                 "filters": [{"type": "RequestHeaderModifier",
                              "requestHeaderModifier": {"set": [{"name": "x-by", "value": "duet"}]}}],
                 "backendRefs": to("gw-header")},
                {"matches": [{"queryParams": [{"name": "canary", "value": "yes"}]}],
                 "backendRefs": to("gw-query")},
                {"matches": [{"method": "POST"}], "backendRefs": to("gw-post")}
            ]),
        ),
        raw_route(
            "moved",
            json!([{"filters": [{"type": "RequestRedirect",
                                 "requestRedirect": {"hostname": "new.test", "statusCode": 301}}]}]),
        ),
        raw_route(
            "extension",
            json!([{"filters": [{"type": "ExtensionRef",
                                 "extensionRef": {"group": "example.com", "kind": "Filter", "name": "f"}}],
                    "backendRefs": to("gw-plain")}]),
        ),
    ];
    let services = ["gw-plain", "gw-header", "gw-query", "gw-post"];
    let (_fleets, _dir, duet) = serve_routes(port, &services, routes).await?;
    for family in Family::BOTH {
        let mut conn = connect(family, port).await?;
        assert_eq!(served_by(&mut conn, "match.test", "/a").await?, "gw-plain");
        let req = client::request(conformance::http::Method::GET, "match.test", "/a")
            .header("x-version", "2")
            .header("x-by", "client")
            .body(Default::default())?;
        let reply = conn.send(req).await?;
        client::expect_status(&reply, 200)?;
        let echo = reply.echo()?;
        assert_eq!(echo.service, "gw-header", "{family}: header match");
        assert_eq!(echo.family, family);
        assert_eq!(
            echo.headers.get("X-By").map(Vec::as_slice),
            Some(&["duet".to_owned()][..]),
            "{family}: RequestHeaderModifier set"
        );
        assert_eq!(
            served_by(&mut conn, "match.test", "/a?canary=yes").await?,
            "gw-query"
        );
        let post = client::request(conformance::http::Method::POST, "match.test", "/a")
            .body(Default::default())?;
        let reply = conn.send(post).await?;
        client::expect_status(&reply, 200)?;
        assert_eq!(reply.echo()?.service, "gw-post", "{family}: method match");
        let moved = conn.get("moved.test", "/x?y=1").await?;
        assert_eq!(moved.status, 301, "{family}: {}", moved.text());
        // Neither port nor scheme: the listener's port, as the spec asks.
        let location = format!("http://new.test:{port}/x?y=1");
        assert_eq!(moved.header("location"), Some(location.as_str()));
        let refused = conn.get("extension.test", "/").await?;
        assert_eq!(
            refused.status, 404,
            "{family}: a refused rule is not served"
        );
    }
    // Per-route metrics name the route (its namespace and name, the Service, the route host).
    let metrics = duet.admin_get(Family::V4, "/metrics").await?.text();
    let route =
        format!(r#"namespace="{NS}",ingress="match",service="gw-header",host="match.test""#);
    anyhow::ensure!(
        metrics
            .lines()
            .any(|l| l.starts_with("duet_requests_total{") && l.contains(&route)),
        "no duet_requests_total series with {route}"
    );
    Ok(())
}

/// A rule whose header modifier names a hop-by-hop or framing header, or `Host`, is refused at
/// translation (the route says why) and not served: its requests go to the route's other rule
/// with their own framing, and no smuggled `Transfer-Encoding`, `Connection` or `Host` reaches
/// the pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn modifiers_naming_framing_or_hop_by_hop_headers_are_not_served() -> anyhow::Result<()> {
    let port = free_port()?;
    let refused = |path: &str, name: &str, value: &str| {
        json!({"matches": [{"path": {"type": "PathPrefix", "value": path}}],
               "filters": [{"type": "RequestHeaderModifier",
                            "requestHeaderModifier": {"set": [{"name": name, "value": value}]}}],
               "backendRefs": [{"name": "gw-filtered", "port": 8080}]})
    };
    let route = raw_route(
        "smuggle",
        json!([
            {"backendRefs": [{"name": "gw-plain", "port": 8080}]},
            refused("/te", "Transfer-Encoding", "chunked"),
            refused("/conn", "Connection", "close"),
            refused("/host", "Host", "evil.test"),
        ]),
    );
    let services = ["gw-plain", "gw-filtered"];
    let (_fleets, _dir, duet) = serve_routes(port, &services, vec![route]).await?;
    for family in Family::BOTH {
        let mut conn = connect(family, port).await?;
        for path in ["/te", "/conn", "/host"] {
            let req = client::request(conformance::http::Method::POST, "smuggle.test", path)
                .body(Full::new(Bytes::from_static(b"hello")))?;
            let reply = conn.send(req).await?;
            client::expect_status(&reply, 200)?;
            let echo = reply.echo()?;
            assert_eq!(echo.service, "gw-plain", "{family} {path}: rule refused");
            assert_eq!(echo.family, family);
            assert_eq!(echo.body_length, 5, "{family} {path}");
            assert_eq!(echo.host, "smuggle.test", "{family} {path}");
            for name in ["Transfer-Encoding", "Connection"] {
                assert_eq!(echo.headers.get(name), None, "{family} {path}: {name}");
            }
        }
    }
    let routes = duet.debug_routes().await?;
    let said: Vec<&str> = routes["diagnostics"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|d| d["object"]["name"] == "smuggle")
        .filter_map(|d| d["message"].as_str())
        .collect();
    for name in ["transfer-encoding", "connection", "Host"] {
        anyhow::ensure!(
            said.iter()
                .any(|m| m.contains(&format!("cannot name {name}"))),
            "no diagnostic naming {name}: {said:?}"
        );
    }
    Ok(())
}

/// `/debug/routes` on the debug listener of each family, filtered: `?ingress=`, `?httproute=`,
/// `?gateway=` and `?host=` keep only that object's (or host's) routes and the backends they use,
/// with its diagnostics; an object duet does not serve gives empty tables; a malformed filter is
/// a 400 saying what is wrong.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debug_routes_filters_by_object_and_host_on_both_families() -> anyhow::Result<()> {
    let port = free_port()?;
    let dir = ManifestDir::with_class()?;
    let mut fleets = Vec::new();
    for name in ["web", "api", "gw-one", "gw-two"] {
        let fleet = Fleet::start(NS, name, &[PodSpec::dual(&format!("{name}-pod"))])?;
        dir.write(&format!("svc-{name}.yaml"), &fleet.manifests())?;
        fleets.push(fleet);
    }
    let (to_one, to_two) = ([svc("gw-one")], [svc("gw-two")]);
    let one: Rule<'_> = ("PathPrefix", "/", &to_one);
    let two: Rule<'_> = ("PathPrefix", "/", &to_two);
    let docs = vec![
        gateway_class(),
        gateway(port, &[("any", None)]),
        route("r-one", None, &["one.test"], &[one]),
        route("r-two", None, &["two.test"], &[two]),
        conformance::Ingress::new(NS, "web")
            .host("web.test", "web")
            .build(),
        conformance::Ingress::new(NS, "api")
            .host("api.test", "api")
            .build(),
        // Its Service does not exist: no route, one diagnostic.
        conformance::Ingress::new(NS, "broken")
            .host("broken.test", "ghost")
            .build(),
    ];
    dir.write("objects.yaml", &docs)?;
    let duet = DuetBuilder::new(DUET, dir.path()).start().await?;
    let hosts = ["web.test", "api.test", "one.test", "two.test"];
    for family in Family::BOTH {
        let whole = duet.debug_get(family, "/debug/routes").await?;
        client::expect_status(&whole, 200)?;
        let cases: [(&str, &[&str], &[&str]); 6] = [
            ("ingress=e2e/web", &["web.test"], &["e2e/web:"]),
            ("ingress=e2e%2Fapi", &["api.test"], &["e2e/api:"]),
            ("httproute=e2e/r-one", &["one.test"], &["e2e/gw-one:"]),
            (
                "gateway=e2e/gw",
                &["one.test", "two.test"],
                &["e2e/gw-one:", "e2e/gw-two:"],
            ),
            ("host=WEB.test", &["web.test"], &["e2e/web:"]),
            ("ingress=e2e/nothing-here", &[], &[]),
        ];
        for (query, shown, backends) in cases {
            let what = format!("{family} ?{query}");
            let reply = duet
                .debug_get(family, &format!("/debug/routes?{query}"))
                .await?;
            client::expect_status(&reply, 200).map_err(|e| e.context(what.clone()))?;
            assert!(reply.body.len() < whole.body.len(), "{what}");
            let doc: Value = serde_json::from_slice(&reply.body)?;
            let snapshot = doc["snapshot"].to_string();
            for host in hosts {
                let want = shown.contains(&host);
                assert_eq!(
                    snapshot.contains(host),
                    want,
                    "{what}: {host} in {snapshot}"
                );
            }
            let mut ids: Vec<&str> = doc["snapshot"]["backends"]
                .as_object()
                .map(|m| m.keys().map(String::as_str).collect())
                .unwrap_or_default();
            ids.sort();
            assert_eq!(ids.len(), backends.len(), "{what}: {ids:?}");
            for (id, prefix) in ids.iter().zip(backends) {
                assert!(id.starts_with(prefix), "{what}: {ids:?}");
            }
            assert_eq!(
                doc["filter"].as_object().map(|f| f.len()),
                Some(1),
                "{what}"
            );
            assert_eq!(doc["diagnostics"], json!([]), "{what}");
        }
        let reply = duet
            .debug_get(family, "/debug/routes?ingress=e2e/broken")
            .await?;
        let doc: Value = serde_json::from_slice(&reply.body)?;
        let diagnostics = doc["diagnostics"].as_array().cloned().unwrap_or_default();
        assert!(!diagnostics.is_empty(), "{family}: {doc}");
        assert!(
            diagnostics.iter().all(|d| d["object"]["name"] == "broken"),
            "{family}: {doc}"
        );
        let long = format!("/debug/routes?host={}", "a".repeat(2000));
        let refused: [(&str, &str); 5] = [
            ("/debug/routes?ingress=web", "NAMESPACE/NAME"),
            ("/debug/routes?ingress=E2E/web", "NAMESPACE/NAME"),
            ("/debug/routes?pod=e2e/web", "unknown filter"),
            (
                "/debug/routes?ingress=e2e/web&host=web.test",
                "one filter at a time",
            ),
            (&long, "longer than 1024 bytes"),
        ];
        for (path, says) in refused {
            let reply = duet.debug_get(family, path).await?;
            let what = format!("{family} {}", &path[..path.len().min(60)]);
            assert_eq!(reply.status, 400, "{what}: {}", reply.text());
            assert!(reply.text().contains(says), "{what}: {}", reply.text());
        }
    }
    drop(fleets);
    Ok(())
}
