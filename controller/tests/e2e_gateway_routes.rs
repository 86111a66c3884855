//! End to end in `--manifests` mode, over real sockets on 127.0.0.1 and [::1]: HTTPRoute
//! behaviours the dataplane carries out itself. The `CORS` filter (preflights answered by duet,
//! Gateway API's wildcards); a `RequestRedirect` without port and scheme, which goes to the
//! listener's port whatever port the client's `Host` names (an IPv6 literal keeps its
//! brackets); HTTPS listeners sharing a port, where a `Host` of another listener than the TLS
//! server name chose is answered 421; and a parentRef's `port`, which attaches a route to the
//! listeners of that port only.

use std::net::SocketAddr;
use std::time::Duration;

use conformance::bytes::Bytes;
use conformance::client::{self, Conn, Reply};
use conformance::duet::free_port;
use conformance::http_body_util::Full;
use conformance::manifests::gateway_class;
use conformance::{DuetBuilder, Family, Fleet, ManifestDir, PodSpec};
use serde_json::{json, Value};

const DUET: &str = env!("CARGO_BIN_EXE_duet");
const NS: &str = "e2e";

fn gateway(listeners: Vec<Value>) -> Value {
    json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
        "metadata": {"name": "gw", "namespace": NS},
        "spec": {"gatewayClassName": "duet", "listeners": listeners}
    })
}

/// An HTTPRoute on `section` (every listener when `None`) of raw rules.
fn route(name: &str, section: Option<&str>, hostnames: &[&str], rules: Value) -> Value {
    let mut parent = json!({"name": "gw"});
    if let Some(s) = section {
        parent["sectionName"] = json!(s);
    }
    json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"parentRefs": [parent], "hostnames": hostnames, "rules": rules}
    })
}

/// Starts one dual-stack pod behind each Service of `services`, writes them and `docs`, starts
/// duet.
async fn setup(
    services: &[&str],
    docs: Vec<Value>,
) -> anyhow::Result<(Vec<Fleet>, ManifestDir, conformance::Duet)> {
    let dir = ManifestDir::new()?;
    let mut fleets = Vec::new();
    for service in services {
        let fleet = Fleet::start(NS, service, &[PodSpec::dual(&format!("{service}-pod"))])?;
        dir.write(&format!("svc-{service}.yaml"), &fleet.manifests())?;
        fleets.push(fleet);
    }
    dir.write("gateway.yaml", &docs)?;
    let duet = DuetBuilder::new(DUET, dir.path()).start().await?;
    Ok((fleets, dir, duet))
}

fn at(family: Family, port: u16) -> SocketAddr {
    SocketAddr::new(family.loopback(), port)
}

/// A connection to the Gateway port, once duet has bound it.
async fn connect(family: Family, port: u16) -> anyhow::Result<Conn> {
    client::eventually("Gateway listener bound", Duration::from_secs(10), || {
        Conn::http1(at(family, port))
    })
    .await
}

/// Sends `method path` with `headers` to `host`.
async fn send(
    conn: &mut Conn,
    method: &str,
    host: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> anyhow::Result<Reply> {
    let mut req = client::request(method.parse()?, host, path);
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    conn.send(req.body(Full::new(Bytes::new()))?).await
}

/// Checks the request reached the pod over the client's own family.
fn proxied(reply: &Reply, conn: &Conn, what: &str) -> anyhow::Result<()> {
    client::expect_status(reply, 200)?;
    let echo = reply.echo()?;
    anyhow::ensure!(
        echo.family == conn.family(),
        "{what}: pod reached over {} by a {} client",
        echo.family,
        conn.family()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cors_filter_answers_preflights_and_marks_responses() -> anyhow::Result<()> {
    let port = free_port()?;
    let cors = |path: &str, cors: Value| {
        json!({"matches": [{"path": {"type": "PathPrefix", "value": path}}],
               "filters": [{"type": "CORS", "cors": cors}],
               "backendRefs": [{"name": "cors", "port": 8080}]})
    };
    let rules = json!([
        cors(
            "/list",
            json!({"allowOrigins": ["https://www.foo.com", "https://*.bar.com"],
            "allowMethods": ["GET", "OPTIONS"], "allowHeaders": ["x-a", "x-b"],
            "exposeHeaders": ["x-c"], "allowCredentials": true, "maxAge": 3600})
        ),
        cors(
            "/any",
            json!({"allowOrigins": ["*"], "allowMethods": ["*"],
            "allowHeaders": ["*"], "allowCredentials": true})
        ),
    ]);
    let docs = vec![
        gateway_class(),
        gateway(vec![
            json!({"name": "http", "port": port, "protocol": "HTTP"}),
        ]),
        route("r-cors", None, &[], rules),
    ];
    let (_fleet, _dir, _duet) = setup(&["cors"], docs).await?;
    for family in Family::BOTH {
        let mut conn = connect(family, port).await?;
        let preflight = |origin| {
            [
                ("origin", origin),
                ("access-control-request-method", "PUT"),
                ("access-control-request-headers", "x-a"),
            ]
        };
        // A wildcard origin covers several labels; duet answers the preflight itself.
        let deep = preflight("https://a.www.bar.com");
        let ok = send(&mut conn, "OPTIONS", "cors.test", "/list", &deep).await?;
        client::expect_status(&ok, 204)?;
        assert_eq!(
            ok.header("access-control-allow-origin"),
            Some("https://a.www.bar.com"),
            "{family}"
        );
        assert_eq!(
            ok.header("access-control-allow-methods"),
            Some("GET, OPTIONS"),
            "{family}"
        );
        assert_eq!(
            ok.header("access-control-allow-headers"),
            Some("x-a, x-b"),
            "{family}"
        );
        assert_eq!(
            ok.header("access-control-expose-headers"),
            Some("x-c"),
            "{family}"
        );
        assert_eq!(
            ok.header("access-control-max-age"),
            Some("3600"),
            "{family}"
        );
        assert_eq!(
            ok.header("access-control-allow-credentials"),
            Some("true"),
            "{family}"
        );
        // An origin not allowed is answered too, without CORS headers, and never proxied.
        let other = preflight("https://bar.com");
        let refused = send(&mut conn, "OPTIONS", "cors.test", "/list", &other).await?;
        client::expect_status(&refused, 204)?;
        assert_eq!(
            refused.header("access-control-allow-origin"),
            None,
            "{family}"
        );
        // `*` with credentials echoes the origin, the method and the headers asked for.
        let any = preflight("http://[2001:db8::1]:8080");
        let echoed = send(&mut conn, "OPTIONS", "cors.test", "/any", &any).await?;
        client::expect_status(&echoed, 204)?;
        let origin = echoed.header("access-control-allow-origin");
        assert_eq!(origin, Some("http://[2001:db8::1]:8080"), "{family}");
        assert_eq!(
            echoed.header("access-control-allow-methods"),
            Some("PUT"),
            "{family}"
        );
        assert_eq!(
            echoed.header("access-control-allow-headers"),
            Some("x-a"),
            "{family}"
        );
        // A simple request is proxied, its response marked.
        let simple = [("origin", "https://www.foo.com")];
        let got = send(&mut conn, "GET", "cors.test", "/list", &simple).await?;
        proxied(&got, &conn, "simple CORS request")?;
        assert_eq!(
            got.header("access-control-allow-origin"),
            Some("https://www.foo.com"),
            "{family}"
        );
        assert_eq!(got.header("vary"), Some("Origin"), "{family}");
        let foreign = [("origin", "https://foobar.com")];
        let plain = send(&mut conn, "GET", "cors.test", "/list", &foreign).await?;
        proxied(&plain, &conn, "request of a foreign origin")?;
        assert_eq!(
            plain.header("access-control-allow-origin"),
            None,
            "{family}"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redirect_without_port_goes_to_the_listeners_port_not_the_hosts() -> anyhow::Result<()> {
    let port = free_port()?;
    let redirect = |path: &str, redirect: Value| {
        json!({"matches": [{"path": {"type": "PathPrefix", "value": path}}],
               "filters": [{"type": "RequestRedirect", "requestRedirect": redirect}]})
    };
    let rules = json!([
        redirect("/plain", json!({})),
        redirect("/named", json!({"hostname": "example.org"})),
        redirect("/port", json!({"port": 8443})),
        redirect("/scheme", json!({"scheme": "https"})),
    ]);
    let docs = vec![
        gateway_class(),
        gateway(vec![
            json!({"name": "http", "port": port, "protocol": "HTTP"}),
        ]),
        route("r-redirect", None, &[], rules),
    ];
    let (_fleet, _dir, _duet) = setup(&["redirect"], docs).await?;
    for family in Family::BOTH {
        let mut conn = connect(family, port).await?;
        // The client names another port than the listener's (a proxy in front, say).
        let literal = match family {
            Family::V4 => "127.0.0.1",
            Family::V6 => "[::1]",
        };
        let host = format!("{literal}:9999");
        for (path, want) in [
            (
                "/plain/a?q=1",
                format!("http://{literal}:{port}/plain/a?q=1"),
            ),
            ("/named", format!("http://example.org:{port}/named")),
            ("/port", format!("http://{literal}:8443/port")),
            ("/scheme", format!("https://{literal}/scheme")),
        ] {
            let reply = send(&mut conn, "GET", &host, path, &[]).await?;
            client::expect_status(&reply, 302)?;
            assert_eq!(
                reply.header("location"),
                Some(want.as_str()),
                "{family} {path}"
            );
        }
        // Without a port in the Host the listener's port is still the one.
        let reply = send(&mut conn, "GET", literal, "/plain", &[]).await?;
        let want = format!("http://{literal}:{port}/plain");
        assert_eq!(reply.header("location"), Some(want.as_str()), "{family}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_of_another_https_listener_than_the_sni_is_misdirected() -> anyhow::Result<()> {
    let port = free_port()?;
    let cert = conformance::tls::cert(&["*.example.com", "example.com", "second.test"]);
    let https = |name: &str, host: Option<&str>| {
        let mut l = json!({"name": name, "port": port, "protocol": "HTTPS",
                           "tls": {"certificateRefs": [{"name": "cert"}]}});
        if let Some(h) = host {
            l["hostname"] = json!(h);
        }
        l
    };
    let any = json!([{"backendRefs": [{"name": "tls", "port": 8080}]}]);
    let docs = vec![
        gateway_class(),
        conformance::tls::secret(NS, "cert", &cert),
        gateway(vec![
            https("any", None),
            https("second", Some("second.test")),
            https("wild", Some("*.example.com")),
        ]),
        route("r-any", Some("any"), &["example.com"], any.clone()),
        route("r-second", Some("second"), &[], any.clone()),
        route("r-wild", Some("wild"), &[], any),
    ];
    let (_fleet, _dir, _duet) = setup(&["tls"], docs).await?;
    for family in Family::BOTH {
        for (sni, host, status) in [
            ("second.test", "second.test", 200),
            ("second.test", "example.com", 421),
            ("second.test", "a.example.com", 421),
            ("a.example.com", "b.example.com", 200),
            ("a.example.com", "second.test", 421),
            ("example.com", "example.com", 200),
            ("example.com", "a.example.com", 421),
            ("example.com", "unknown.test", 404),
        ] {
            let (mut conn, _) =
                client::eventually("HTTPS listener", Duration::from_secs(10), || {
                    Conn::https(at(family, port), Some(sni), &["http/1.1"])
                })
                .await?;
            let reply = conn.get(host, "/").await?;
            assert_eq!(
                reply.status,
                status,
                "{family} SNI {sni}, Host {host}: {}",
                reply.text()
            );
            if status == 200 {
                proxied(&reply, &conn, host)?;
            }
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parent_ref_port_attaches_to_that_ports_listeners_only() -> anyhow::Result<()> {
    let (first, second) = (free_port()?, free_port()?);
    let http = |name: &str, port: u16| json!({"name": name, "port": port, "protocol": "HTTP"});
    let on = |name: &str, parent: Value, path: &str, service: &str| {
        json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"parentRefs": [parent], "rules": [{
                "matches": [{"path": {"type": "PathPrefix", "value": path}}],
                "backendRefs": [{"name": service, "port": 8080}]}]}
        })
    };
    let docs = vec![
        gateway_class(),
        gateway(vec![http("one", first), http("two", second)]),
        on(
            "r-one",
            json!({"name": "gw", "port": first}),
            "/",
            "port-one",
        ),
        on(
            "r-two",
            json!({"name": "gw", "port": second}),
            "/",
            "port-two",
        ),
        // Listener `one` is not on the second port: this route attaches nowhere.
        on(
            "r-none",
            json!({"name": "gw", "sectionName": "one", "port": second}),
            "/none",
            "port-none",
        ),
    ];
    let (_fleets, _dir, _duet) = setup(&["port-one", "port-two", "port-none"], docs).await?;
    for family in Family::BOTH {
        for (port, service) in [(first, "port-one"), (second, "port-two")] {
            let mut conn = connect(family, port).await?;
            let reply = conn.get("ports.test", "/x").await?;
            proxied(&reply, &conn, service)?;
            assert_eq!(reply.echo()?.service, service, "{family} port {port}");
            // `/none` falls to the port's own route, not to the unattached one.
            let none = conn.get("ports.test", "/none").await?;
            assert_eq!(none.echo()?.service, service, "{family} port {port} /none");
        }
    }
    Ok(())
}
