//! End to end, over real sockets on 127.0.0.1 and [::1] with real echo pods and a real HTTP
//! client: the ingress-nginx annotations that steer traffic. Canaries (by header, by cookie, by
//! weight, attached to the main Ingress of the same host and path), session affinity whose cookie
//! names the pod (a session started over IPv4 continues on the same pod over IPv6, and back),
//! `upstream-hash-by`, `service-upstream` (the Service's cluster IP of the client's family),
//! `upstream-vhost` and `from-to-www-redirect` (plain and TLS). Distributions are checked against
//! binomial bounds six standard deviations wide, computed from the draw count.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};

use conformance::bytes::Bytes;
use conformance::client::{self, Conn, Reply};
use conformance::duet::nginx_status;
use conformance::echo::{EchoOptions, EchoServer, Identity, PodListeners};
use conformance::http::Method;
use conformance::http_body_util::Full;
use conformance::tls;
use conformance::{DuetBuilder, Family, Fleet, Ingress, ManifestDir, PodSpec};
use serde_json::json;

const DUET: &str = env!("CARGO_BIN_EXE_duet");

/// `GET` with extra headers over a kept-alive connection.
async fn get(
    conn: &mut Conn,
    host: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> anyhow::Result<Reply> {
    let mut req = client::request(Method::GET, host, path);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    conn.send(req.body(Full::new(Bytes::new()))?).await
}

/// The serving pod's Service and name, from the echo body.
fn served_by(reply: &Reply) -> anyhow::Result<(String, String)> {
    client::expect_status(reply, 200)?;
    let echo = reply.echo()?;
    Ok((echo.service, echo.pod))
}

/// Bounds holding `n` Bernoulli(`p`) draws' successes except with probability below 1e-8: the
/// mean plus or minus six standard deviations.
fn binomial_bounds(n: u64, p: f64) -> (u64, u64) {
    let mean = n as f64 * p;
    let sd = (n as f64 * p * (1.0 - p)).sqrt();
    let lo = (mean - 6.0 * sd).floor().max(0.0) as u64;
    let hi = (mean + 6.0 * sd).ceil().min(n as f64) as u64;
    (lo, hi)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn canaries_by_header_cookie_and_weight() -> anyhow::Result<()> {
    let stable = Fleet::start("cn", "stable", &[PodSpec::dual("s1"), PodSpec::dual("s2")])?;
    let canary = Fleet::start("cn", "canary", &[PodSpec::dual("c1")])?;
    let dir = ManifestDir::with_class()?;
    dir.write(
        "fleets.yaml",
        &[stable.manifests(), canary.manifests()].concat(),
    )?;
    let main = |name: &str, host: &str| Ingress::new("cn", name).host(host, "stable");
    let ingresses = [
        main("main", "canary.test"),
        Ingress::new("cn", "canary")
            .nginx_annotations(&[
                ("canary", "true"),
                ("canary-by-header", "X-Canary"),
                ("canary-by-cookie", "canary_cookie"),
                ("canary-weight", "30"),
                // Ignored on a canary Ingress: the main Ingress's settings apply.
                ("proxy-body-size", "1k"),
            ])
            .host("canary.test", "canary"),
        main("main-value", "value.test"),
        Ingress::new("cn", "canary-value")
            .nginx_annotations(&[
                ("canary", "true"),
                ("canary-by-header", "X-Env"),
                ("canary-by-header-value", "beta"),
            ])
            .host("value.test", "canary"),
        // A second canary for the same host and path is refused (one canary per host and path):
        // were it attached, its weight would send everything to the canary.
        Ingress::new("cn", "canary-second")
            .nginx_annotations(&[("canary", "true"), ("canary-weight", "100")])
            .host("value.test", "canary")
            .created("2030-01-01T00:00:00Z"),
        main("main-pattern", "pattern.test"),
        Ingress::new("cn", "canary-pattern")
            .nginx_annotations(&[
                ("canary", "true"),
                ("canary-by-header", "X-User"),
                ("canary-by-header-pattern", "^(alice|bob)$"),
            ])
            .host("pattern.test", "canary"),
        main("main-total", "total.test"),
        Ingress::new("cn", "canary-total")
            .nginx_annotations(&[
                ("canary", "true"),
                ("canary-weight", "1"),
                ("canary-weight-total", "4"),
            ])
            .host("total.test", "canary"),
        Ingress::new("cn", "orphan")
            .nginx_annotations(&[("canary", "true")])
            .host("orphan.test", "canary"),
        Ingress::new("cn", "not-canary")
            .nginx_annotations(&[("canary-weight", "100")])
            .host("not-canary.test", "stable"),
    ];
    dir.write("ingress.yaml", &ingresses.map(|i| i.build()))?;
    let duet = DuetBuilder::new(DUET, dir.path()).start().await?;

    for family in Family::BOTH {
        let mut conn = Conn::http1(duet.http(family)).await?;
        let to = |r: &Reply| served_by(r).map(|(service, _)| service);
        // By header: always and never decide; another value falls through to the cookie.
        let r = get(&mut conn, "canary.test", "/", &[("x-canary", "always")]).await?;
        assert_eq!(to(&r)?, "canary", "{family}");
        for _ in 0..20 {
            let headers = [("x-canary", "never"), ("cookie", "canary_cookie=always")];
            let r = get(&mut conn, "canary.test", "/", &headers).await?;
            assert_eq!(
                to(&r)?,
                "stable",
                "{family}: the header wins over the cookie"
            );
        }
        let headers = [
            ("x-canary", "maybe"),
            ("cookie", "a=1; canary_cookie=always"),
        ];
        let r = get(&mut conn, "canary.test", "/", &headers).await?;
        assert_eq!(to(&r)?, "canary", "{family}");
        // By cookie: never keeps the stable pods whatever the weight.
        for _ in 0..20 {
            let r = get(
                &mut conn,
                "canary.test",
                "/",
                &[("cookie", "canary_cookie=never")],
            )
            .await?;
            assert_eq!(to(&r)?, "stable", "{family}");
        }
        // The canary Ingress's own proxy-body-size is ignored: a 2 KiB body passes.
        let req = client::request(Method::PUT, "canary.test", "/")
            .header("x-canary", "always")
            .body(Full::new(Bytes::from(vec![b'x'; 2048])))?;
        client::expect_status(&conn.send(req).await?, 200)?;
        // By weight: 30 of 100.
        let n = 400;
        let mut hits = 0;
        for _ in 0..n {
            if to(&get(&mut conn, "canary.test", "/", &[]).await?)? == "canary" {
                hits += 1;
            }
        }
        let (lo, hi) = binomial_bounds(n, 0.3);
        assert!(
            (lo..=hi).contains(&hits),
            "{family}: {hits} of {n} to the canary, want {lo}..={hi}"
        );
        // canary-weight-total: 1 of 4.
        let mut hits = 0;
        for _ in 0..n {
            if to(&get(&mut conn, "total.test", "/", &[]).await?)? == "canary" {
                hits += 1;
            }
        }
        let (lo, hi) = binomial_bounds(n, 0.25);
        assert!(
            (lo..=hi).contains(&hits),
            "{family}: {hits} of {n}, want {lo}..={hi}"
        );
        // A header value: only that value goes to the canary, no always/never.
        for (value, want) in [("beta", "canary"), ("always", "stable"), ("Beta", "stable")] {
            let r = get(&mut conn, "value.test", "/", &[("x-env", value)]).await?;
            assert_eq!(to(&r)?, want, "{family} {value}");
        }
        for _ in 0..20 {
            let r = get(&mut conn, "value.test", "/", &[]).await?;
            assert_eq!(
                to(&r)?,
                "stable",
                "{family}: the second canary is not attached"
            );
        }
        // A header pattern.
        for (value, want) in [("bob", "canary"), ("bobby", "stable"), ("alice", "canary")] {
            let r = get(&mut conn, "pattern.test", "/", &[("x-user", value)]).await?;
            assert_eq!(to(&r)?, want, "{family} {value}");
        }
        // A canary without a main Ingress is not served; canary keys without canary: "true" do
        // nothing.
        let r = get(&mut conn, "orphan.test", "/", &[]).await?;
        client::expect_status(&r, 404)?;
        for _ in 0..20 {
            let r = get(&mut conn, "not-canary.test", "/", &[]).await?;
            assert_eq!(to(&r)?, "stable", "{family}");
        }
    }
    let routes = duet.debug_routes().await?;
    for (ingress, key, want) in [
        ("canary", "canary", "honoured"),
        ("canary", "canary-weight", "honoured"),
        ("canary", "canary-by-header", "honoured"),
        ("canary", "proxy-body-size", "ignored-unsupported"),
        (
            "canary-pattern",
            "canary-by-header-pattern",
            "honoured-with-difference",
        ),
        ("not-canary", "canary-weight", "ignored-unsupported"),
    ] {
        assert_eq!(
            nginx_status(&routes, ingress, key).as_deref(),
            Some(want),
            "{ingress} {key}"
        );
    }
    let second = routes["diagnostics"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|d| {
            d["object"]["name"] == "canary-second"
                && d["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("already has a canary"))
        });
    assert!(second, "{routes:#}");
    let orphan = routes["diagnostics"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|d| d["object"]["name"] == "orphan" && d["reason"] == "ConflictingPath");
    assert!(orphan, "{routes:#}");
    Ok(())
}

/// A canary Ingress in another namespace than the main Ingress of its host and path takes none
/// of its traffic by default (`--canary-scope namespace`), and says why; the main Ingress keeps
/// serving. With `--canary-scope cluster` it attaches, as in ingress-nginx.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn canaries_of_another_namespace_attach_only_with_canary_scope_cluster() -> anyhow::Result<()>
{
    let stable = Fleet::start("shop", "pay", &[PodSpec::dual("p1")])?;
    let intruder = Fleet::start("intruder", "collect", &[PodSpec::dual("i1")])?;
    let dir = ManifestDir::with_class()?;
    dir.write(
        "fleets.yaml",
        &[stable.manifests(), intruder.manifests()].concat(),
    )?;
    let ingresses = [
        Ingress::new("shop", "pay").host("pay.test", "pay"),
        Ingress::new("intruder", "canary")
            .nginx_annotations(&[("canary", "true"), ("canary-weight", "100")])
            .host("pay.test", "collect"),
    ];
    dir.write("ingress.yaml", &ingresses.map(|i| i.build()))?;
    for (args, want) in [
        (&[][..], "pay"),
        (&["--canary-scope", "cluster"][..], "collect"),
    ] {
        let duet = DuetBuilder::new(DUET, dir.path())
            .args(args.iter().copied())
            .start()
            .await?;
        for family in Family::BOTH {
            let mut conn = Conn::http1(duet.http(family)).await?;
            for _ in 0..20 {
                let r = get(&mut conn, "pay.test", "/", &[]).await?;
                assert_eq!(served_by(&r)?.0, want, "{family} {args:?}");
            }
        }
        let routes = duet.debug_routes().await?;
        let refused = routes["diagnostics"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|d| {
                d["object"]["namespace"] == "intruder"
                    && d["reason"] == "ConflictingPath"
                    && d["message"]
                        .as_str()
                        .is_some_and(|m| m.contains("of another namespace"))
            });
        assert_eq!(refused, args.is_empty(), "{args:?}: {routes:#}");
    }
    Ok(())
}

/// The cookie's value in a `Set-Cookie` of `name`.
fn cookie_value<'a>(set_cookie: &'a str, name: &str) -> Option<&'a str> {
    set_cookie
        .split(';')
        .next()?
        .trim()
        .strip_prefix(name)?
        .strip_prefix('=')
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn affinity_cookie_names_the_pod_across_families() -> anyhow::Result<()> {
    let pods: Vec<PodSpec> = ["a", "b", "c", "d"].map(PodSpec::dual).to_vec();
    let fleet = Fleet::start("aff", "sticky", &pods)?;
    let dir = ManifestDir::with_class()?;
    dir.write("fleet.yaml", &fleet.manifests())?;
    let ingresses = [
        Ingress::new("aff", "sticky")
            .nginx_annotations(&[
                ("affinity", "cookie"),
                ("session-cookie-name", "route"),
                ("session-cookie-max-age", "3600"),
                ("session-cookie-samesite", "lax"),
                ("session-cookie-secure", "true"),
            ])
            .host("sticky.test", "sticky"),
        Ingress::new("aff", "plain").host("plain.test", "sticky"),
    ];
    dir.write("ingress.yaml", &ingresses.map(|i| i.build()))?;
    let duet = DuetBuilder::new(DUET, dir.path()).start().await?;
    let pod_addrs: Vec<String> = fleet
        .pods()
        .iter()
        .flat_map(|p| Family::BOTH.map(|f| p.addr(f)))
        .flatten()
        .map(|a| a.ip().to_string())
        .collect();

    for (start, then) in [(Family::V4, Family::V6), (Family::V6, Family::V4)] {
        for session in 0..4 {
            let mut first = Conn::http1(duet.http(start)).await?;
            let reply = get(&mut first, "sticky.test", "/", &[]).await?;
            let (_, pod) = served_by(&reply)?;
            assert_eq!(reply.echo()?.family, start);
            let set = reply
                .header("set-cookie")
                .expect("a session cookie")
                .to_owned();
            let value = cookie_value(&set, "route").expect("named route").to_owned();
            assert_eq!(
                set,
                format!("route={value}; Path=/; Max-Age=3600; HttpOnly; Secure; SameSite=Lax"),
            );
            assert!(
                value.len() == 16 && value.bytes().all(|b| b.is_ascii_hexdigit()),
                "{set}"
            );
            assert!(
                !pod_addrs.iter().any(|a| set.contains(a.as_str())),
                "{set} leaks an address"
            );
            // The session continues over the other family on the same pod, over its address of
            // that family, and the cookie is not sent again.
            let mut other = Conn::http1(duet.http(then)).await?;
            let cookie = format!("route={value}");
            for _ in 0..20 {
                let reply = get(
                    &mut other,
                    "sticky.test",
                    "/",
                    &[("cookie", cookie.as_str())],
                )
                .await?;
                assert_eq!(
                    served_by(&reply)?.1,
                    pod,
                    "{start}->{then} session {session}"
                );
                assert_eq!(reply.echo()?.family, then);
                assert_eq!(reply.header("set-cookie"), None);
            }
        }
    }
    // A cookie naming no pod (forged, or of a pod gone) gets a new one; without affinity no
    // cookie is set.
    for family in Family::BOTH {
        let mut conn = Conn::http1(duet.http(family)).await?;
        let reply = get(
            &mut conn,
            "sticky.test",
            "/",
            &[("cookie", "route=0123456789abcdef")],
        )
        .await?;
        let set = reply.header("set-cookie").expect("a new cookie");
        assert_ne!(cookie_value(set, "route"), Some("0123456789abcdef"));
        let reply = get(&mut conn, "plain.test", "/", &[]).await?;
        assert_eq!(reply.header("set-cookie"), None);
    }
    let routes = duet.debug_routes().await?;
    assert_eq!(
        nginx_status(&routes, "sticky", "affinity").as_deref(),
        Some("honoured-with-difference")
    );
    assert_eq!(
        nginx_status(&routes, "sticky", "session-cookie-max-age").as_deref(),
        Some("honoured")
    );
    Ok(())
}

/// The token duet writes for a pod (the test forges the cookie of a pod that refuses
/// connections).
fn token(backend: &str, uid: &str) -> String {
    format!(
        "{:016x}",
        dataplane::policy::stable_hash(&[backend.as_bytes(), uid.as_bytes()])
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn affinity_change_on_failure_repins_the_session() -> anyhow::Result<()> {
    use conformance::fleet::Port;
    let dead = PodSpec::dual("dead")
        .with(Family::V4, Port::Closed)
        .with(Family::V6, Port::Closed);
    let fleet = Fleet::start("cof", "web", &[dead, PodSpec::dual("live")])?;
    let dir = ManifestDir::with_class()?;
    dir.write("fleet.yaml", &fleet.manifests())?;
    let ingresses = [
        Ingress::new("cof", "keep")
            .nginx_annotations(&[("affinity", "cookie")])
            .host("keep.test", "web"),
        Ingress::new("cof", "change")
            .nginx_annotations(&[
                ("affinity", "cookie"),
                ("session-cookie-change-on-failure", "true"),
            ])
            .host("change.test", "web"),
    ];
    dir.write("ingress.yaml", &ingresses.map(|i| i.build()))?;
    let duet = DuetBuilder::new(DUET, dir.path()).start().await?;
    let dead_cookie = format!(
        "INGRESSCOOKIE={}",
        token("cof/web:http", "uid-cof-web-dead")
    );
    let live_token = token("cof/web:http", "uid-cof-web-live");
    for family in Family::BOTH {
        let mut conn = Conn::http1(duet.http(family)).await?;
        // The named pod refuses: the request is served by the other pod either way.
        let reply = get(
            &mut conn,
            "keep.test",
            "/",
            &[("cookie", dead_cookie.as_str())],
        )
        .await?;
        assert_eq!(served_by(&reply)?.1, "live", "{family}");
        assert_eq!(
            reply.header("set-cookie"),
            None,
            "{family}: kept without change-on-failure"
        );
        let reply = get(
            &mut conn,
            "change.test",
            "/",
            &[("cookie", dead_cookie.as_str())],
        )
        .await?;
        assert_eq!(served_by(&reply)?.1, "live", "{family}");
        let set = reply.header("set-cookie").expect("re-pinned");
        assert_eq!(
            cookie_value(set, "INGRESSCOOKIE"),
            Some(live_token.as_str()),
            "{family}"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_hash_by_pins_keys_to_pods() -> anyhow::Result<()> {
    let pods: Vec<PodSpec> = ["a", "b", "c", "d"].map(PodSpec::dual).to_vec();
    let fleet = Fleet::start("hash", "web", &pods)?;
    let dir = ManifestDir::with_class()?;
    dir.write("fleet.yaml", &fleet.manifests())?;
    let ingresses = [
        Ingress::new("hash", "user")
            .nginx_annotations(&[("upstream-hash-by", "$http_x_user")])
            .host("user.test", "web"),
        Ingress::new("hash", "addr")
            .nginx_annotations(&[("upstream-hash-by", "$remote_addr")])
            .host("addr.test", "web"),
        Ingress::new("hash", "subset")
            .nginx_annotations(&[
                ("upstream-hash-by", "$arg_room"),
                ("upstream-hash-by-subset", "true"),
                ("upstream-hash-by-subset-size", "2"),
            ])
            .host("subset.test", "web"),
    ];
    dir.write("ingress.yaml", &ingresses.map(|i| i.build()))?;
    let duet = DuetBuilder::new(DUET, dir.path()).start().await?;

    // A header key: the same user lands on the same pod over both families.
    let mut by_user: BTreeMap<String, String> = BTreeMap::new();
    for family in Family::BOTH {
        let mut conn = Conn::http1(duet.http(family)).await?;
        for user in 0..40 {
            let name = format!("user-{user}");
            for _ in 0..3 {
                let reply = get(&mut conn, "user.test", "/", &[("x-user", name.as_str())]).await?;
                let pod = served_by(&reply)?.1;
                assert_eq!(reply.echo()?.family, family);
                let first = by_user.entry(name.clone()).or_insert_with(|| pod.clone());
                assert_eq!(*first, pod, "{family} {name}");
            }
        }
    }
    let used: std::collections::BTreeSet<&String> = by_user.values().collect();
    // 40 keys over 4 pods all on one pod: probability 4 * 4^-40.
    assert!(used.len() >= 2, "{by_user:?}");

    // $remote_addr: one pod per client address; the IPv6 client hashes its full address.
    for family in Family::BOTH {
        let mut pods = std::collections::BTreeSet::new();
        for _ in 0..10 {
            let mut conn = Conn::http1(duet.http(family)).await?;
            pods.insert(served_by(&get(&mut conn, "addr.test", "/", &[]).await?)?.1);
        }
        assert_eq!(pods.len(), 1, "{family}: {pods:?}");
    }
    // Distinct IPv4 client addresses (127.0.0.0/8) spread over the pods.
    let mut pods = std::collections::BTreeSet::new();
    for k in 1..=40u8 {
        let stream = connect_from(IpAddr::from([127, 0, 1, k]), duet.http(Family::V4)).await?;
        let local = stream.local_addr()?;
        let mut conn = Conn::over(stream, local, duet.http(Family::V4), false).await?;
        let reply = get(&mut conn, "addr.test", "/", &[]).await?;
        assert_eq!(reply.echo()?.headers["X-Real-Ip"], [format!("127.0.1.{k}")]);
        pods.insert(served_by(&reply)?.1);
    }
    assert!(pods.len() >= 2, "{pods:?}");

    // A subset of 2: one key spreads over exactly 2 pods.
    for family in Family::BOTH {
        let mut conn = Conn::http1(duet.http(family)).await?;
        let mut pods = std::collections::BTreeSet::new();
        for _ in 0..60 {
            pods.insert(served_by(&get(&mut conn, "subset.test", "/doc?room=7", &[]).await?)?.1);
        }
        // Each draw picks one of 2 at random: missing one in 60 draws has probability 2^-59.
        assert_eq!(pods.len(), 2, "{family}: {pods:?}");
    }
    Ok(())
}

/// A TCP connection to `to` from `from`.
async fn connect_from(from: IpAddr, to: SocketAddr) -> anyhow::Result<tokio::net::TcpStream> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(from, 0))?;
    Ok(socket.connect(to).await?)
}

/// An echo "cluster IP": one pod listening on 127.0.0.77 and [::1] on one shared port.
fn cluster_ip_pod(namespace: &str, service: &str) -> anyhow::Result<(EchoServer, u16)> {
    for _ in 0..20 {
        let v4 = conformance::echo::bind(SocketAddr::from(([127, 0, 0, 77], 0)))?;
        let port = v4.local_addr()?.port();
        let Ok(v6) =
            conformance::echo::bind(SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, port)))
        else {
            continue;
        };
        let identity = Identity {
            namespace: namespace.into(),
            ingress: String::new(),
            service: service.into(),
        };
        let pod = PodListeners {
            name: "cluster-ip".into(),
            listeners: vec![v4, v6],
        };
        return Ok((
            EchoServer::serve(identity, vec![pod], EchoOptions::default())?,
            port,
        ));
    }
    anyhow::bail!("no port free on both 127.0.0.77 and ::1")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_upstream_proxies_to_the_cluster_ip_of_the_clients_family() -> anyhow::Result<()> {
    let (_cluster, port) = cluster_ip_pod("su", "web")?;
    let fleet = Fleet::start("su", "web", &[PodSpec::dual("pod")])?;
    let mut docs = fleet.manifests();
    docs[0]["spec"]["ports"][0]["port"] = json!(port);
    docs[0]["spec"]["clusterIP"] = json!("127.0.0.77");
    docs[0]["spec"]["clusterIPs"] = json!(["127.0.0.77", "::1"]);
    let mut headless = fleet.manifests()[0].clone();
    headless["metadata"]["name"] = json!("headless");
    headless["spec"]["ports"][0]["port"] = json!(port);
    headless["spec"]["clusterIP"] = json!("None");
    let dir = ManifestDir::with_class()?;
    dir.write("fleet.yaml", &docs)?;
    dir.write("headless.yaml", &[headless])?;
    let path = |i: Ingress, host: &str, svc: &str| {
        i.path(
            Some(host),
            conformance::PathType::Prefix,
            "/",
            svc,
            conformance::PortRef::Number(port),
        )
    };
    let ingresses = [
        path(Ingress::new("su", "pods"), "pods.test", "web"),
        path(
            Ingress::new("su", "cip").nginx_annotations(&[("service-upstream", "true")]),
            "cip.test",
            "web",
        ),
        path(
            Ingress::new("su", "headless").nginx_annotations(&[("service-upstream", "true")]),
            "headless.test",
            "headless",
        ),
    ];
    dir.write("ingress.yaml", &ingresses.map(|i| i.build()))?;
    let duet = DuetBuilder::new(DUET, dir.path()).start().await?;
    for family in Family::BOTH {
        let mut conn = Conn::http1(duet.http(family)).await?;
        for _ in 0..5 {
            let reply = get(&mut conn, "pods.test", "/", &[]).await?;
            assert_eq!(served_by(&reply)?.1, "pod", "{family}");
            let reply = get(&mut conn, "cip.test", "/", &[]).await?;
            assert_eq!(served_by(&reply)?.1, "cluster-ip", "{family}");
            let echo = reply.echo()?;
            let want: IpAddr = match family {
                Family::V4 => [127, 0, 0, 77].into(),
                Family::V6 => std::net::Ipv6Addr::LOCALHOST.into(),
            };
            assert_eq!(echo.local, SocketAddr::new(want, port), "{family}");
        }
    }
    let routes = duet.debug_routes().await?;
    assert_eq!(
        nginx_status(&routes, "cip", "service-upstream").as_deref(),
        Some("honoured-with-difference")
    );
    let headless = routes["diagnostics"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|d| {
            d["object"]["name"] == "headless"
                && d["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("no cluster IP (headless)"))
        });
    assert!(headless, "{routes:#}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_vhost_and_from_to_www_redirect() -> anyhow::Result<()> {
    let fleet = Fleet::start("www", "web", &[PodSpec::dual("pod")])?;
    let dir = ManifestDir::with_class()?;
    dir.write("fleet.yaml", &fleet.manifests())?;
    let cert = tls::cert(&["www.secure.test", "secure.test"]);
    dir.write("secret.yaml", &[tls::secret("www", "cert", &cert)])?;
    let www = |name: &str| {
        Ingress::new("www", name).nginx_annotations(&[("from-to-www-redirect", "true")])
    };
    let ingresses = [
        Ingress::new("www", "vhost")
            .nginx_annotations(&[("upstream-vhost", "internal.example:8080")])
            .host("vhost.test", "web"),
        www("shop").host("www.shop.test", "web"),
        www("blog").host("blog.test", "web"),
        www("taken").host("www.taken.test", "web"),
        Ingress::new("www", "taken-bare").host("taken.test", "web"),
        www("secure")
            .host("www.secure.test", "web")
            .tls(&["www.secure.test", "secure.test"], "cert"),
    ];
    dir.write("ingress.yaml", &ingresses.map(|i| i.build()))?;
    let duet = DuetBuilder::new(DUET, dir.path()).start().await?;
    for family in Family::BOTH {
        let to = duet.http(family);
        let port = to.port();
        let mut conn = Conn::http1(to).await?;
        let echo = get(&mut conn, "vhost.test", "/x", &[]).await?.echo()?;
        assert_eq!(echo.host, "internal.example:8080", "{family}");
        // The other spelling answers 308 to the configured one, path and query kept.
        for (host, want) in [
            (
                format!("shop.test:{port}"),
                format!("http://www.shop.test:{port}/a/b?c=d"),
            ),
            (
                format!("www.blog.test:{port}"),
                format!("http://blog.test:{port}/a/b?c=d"),
            ),
        ] {
            let reply = get(&mut conn, &host, "/a/b?c=d", &[]).await?;
            client::expect_status(&reply, 308)?;
            assert_eq!(
                reply.header("location"),
                Some(want.as_str()),
                "{family} {host}"
            );
        }
        // The configured spelling is served; another Ingress owning the other spelling wins.
        client::expect_status(&get(&mut conn, "www.shop.test", "/", &[]).await?, 200)?;
        client::expect_status(&get(&mut conn, "taken.test", "/", &[]).await?, 200)?;
        // Over TLS, with a certificate covering both names.
        let https = duet.https(family);
        let (mut tls_conn, _) = Conn::https(https, Some("secure.test"), &["http/1.1"]).await?;
        let host = format!("secure.test:{}", https.port());
        let reply = get(&mut tls_conn, &host, "/p", &[]).await?;
        client::expect_status(&reply, 308)?;
        let want = format!("https://www.secure.test:{}/p", https.port());
        assert_eq!(reply.header("location"), Some(want.as_str()), "{family}");
    }
    let routes = duet.debug_routes().await?;
    assert_eq!(
        nginx_status(&routes, "vhost", "upstream-vhost").as_deref(),
        Some("honoured-with-difference")
    );
    Ok(())
}

/// The `Vary` field lines of a response, in order.
fn vary(reply: &Reply) -> Vec<&str> {
    let lines = reply.headers.get_all("vary").iter();
    lines.filter_map(|v| v.to_str().ok()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cors_preflights_are_answered_and_responses_carry_the_headers() -> anyhow::Result<()> {
    let fleet = Fleet::start("cors", "web", &[PodSpec::dual("pod")])?;
    let dir = ManifestDir::with_class()?;
    dir.write("fleet.yaml", &fleet.manifests())?;
    let ingresses = [
        Ingress::new("cors", "list")
            .nginx_annotations(&[
                ("enable-cors", "true"),
                (
                    "cors-allow-origin",
                    "https://app.example.com, https://*.example.org, http://[2001:db8::1]:8080",
                ),
                ("cors-allow-credentials", "false"),
                ("cors-expose-headers", "X-Total"),
                ("cors-max-age", "600"),
            ])
            .host("list.test", "web"),
        Ingress::new("cors", "any")
            .nginx_annotations(&[("enable-cors", "true")])
            .host("any.test", "web"),
        Ingress::new("cors", "off").host("off.test", "web"),
    ];
    dir.write("ingress.yaml", &ingresses.map(|i| i.build()))?;
    let duet = DuetBuilder::new(DUET, dir.path()).start().await?;
    let options = |host: &str, origin: Option<&str>| {
        let mut req = client::request(Method::OPTIONS, host, "/api")
            .header("access-control-request-method", "PUT");
        if let Some(o) = origin {
            req = req.header("origin", o);
        }
        req.body(Full::new(Bytes::new()))
    };
    for family in Family::BOTH {
        let mut conn = Conn::http1(duet.http(family)).await?;
        // An allowed origin's preflight is answered by duet: 204, echoed origin, not proxied.
        for origin in [
            "https://app.example.com",
            "https://eu.example.org",
            "http://[2001:db8::1]:8080",
        ] {
            let reply = conn.send(options("list.test", Some(origin))?).await?;
            client::expect_status(&reply, 204)?;
            assert_eq!(
                reply.header("access-control-allow-origin"),
                Some(origin),
                "{family}"
            );
            assert_eq!(
                reply.header("access-control-allow-methods"),
                Some("GET, PUT, POST, DELETE, PATCH, OPTIONS")
            );
            assert_eq!(reply.header("access-control-max-age"), Some("600"));
            assert_eq!(reply.header("access-control-allow-credentials"), None);
            assert_eq!(
                reply.header("content-type"),
                Some("text/plain charset=UTF-8")
            );
            assert_eq!(vary(&reply), ["Origin"], "{family}");
            assert!(reply.body.is_empty());
        }
        // Other origins (one label too deep, another scheme) get no CORS header, and their
        // OPTIONS is proxied.
        for origin in [
            "https://a.b.example.org",
            "http://app.example.com",
            "https://evil.test",
        ] {
            let reply = conn.send(options("list.test", Some(origin))?).await?;
            assert_eq!(reply.echo()?.method, "OPTIONS", "{family} {origin}");
            assert_eq!(
                reply.header("access-control-allow-origin"),
                None,
                "{family} {origin}"
            );
            // The answer still depends on the origin: caches must not share it.
            assert_eq!(vary(&reply), ["Origin"], "{family} {origin}");
        }
        // A simple request from an allowed origin: proxied, the headers added, `Origin` added
        // to the upstream's `Vary` (once, whether or not the upstream named it).
        let reply = get(
            &mut conn,
            "list.test",
            "/api",
            &[
                ("origin", "https://app.example.com"),
                ("x-echo-set-header", "Vary: Accept-Encoding"),
            ],
        )
        .await?;
        assert_eq!(vary(&reply), ["Accept-Encoding", "Origin"], "{family}");
        let named = [
            ("origin", "https://app.example.com"),
            ("x-echo-set-header", "Vary: origin"),
        ];
        let again = get(&mut conn, "list.test", "/api", &named).await?;
        assert_eq!(vary(&again), ["origin"], "{family}");
        assert_eq!(reply.echo()?.family, family);
        assert_eq!(
            reply.header("access-control-allow-origin"),
            Some("https://app.example.com")
        );
        assert_eq!(
            reply.header("access-control-expose-headers"),
            Some("X-Total")
        );
        // The defaults: every request gets `*` and credentials true, every OPTIONS is answered.
        let reply = get(&mut conn, "any.test", "/", &[]).await?;
        client::expect_status(&reply, 200)?;
        assert_eq!(reply.header("access-control-allow-origin"), Some("*"));
        assert!(vary(&reply).is_empty(), "`*` is the same for every origin");
        assert_eq!(
            reply.header("access-control-allow-credentials"),
            Some("true")
        );
        assert_eq!(
            reply.header("access-control-allow-headers"),
            Some("DNT,Keep-Alive,User-Agent,X-Requested-With,If-Modified-Since,Cache-Control,Content-Type,Range,Authorization")
        );
        client::expect_status(&conn.send(options("any.test", None)?).await?, 204)?;
        // Without enable-cors nothing changes.
        let reply = conn
            .send(options("off.test", Some("https://app.example.com"))?)
            .await?;
        assert_eq!(reply.echo()?.method, "OPTIONS");
        assert_eq!(reply.header("access-control-allow-origin"), None);
    }
    let routes = duet.debug_routes().await?;
    assert_eq!(
        nginx_status(&routes, "list", "cors-max-age").as_deref(),
        Some("honoured")
    );
    assert_eq!(
        nginx_status(&routes, "list", "enable-cors").as_deref(),
        Some("honoured-with-difference")
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn affinity_keeps_sessions_on_their_side_of_a_canary() -> anyhow::Result<()> {
    let stable = Fleet::start("sc", "stable", &[PodSpec::dual("s1"), PodSpec::dual("s2")])?;
    let canary = Fleet::start("sc", "canary", &[PodSpec::dual("c1"), PodSpec::dual("c2")])?;
    let dir = ManifestDir::with_class()?;
    dir.write(
        "fleets.yaml",
        &[stable.manifests(), canary.manifests()].concat(),
    )?;
    let ingresses = [
        Ingress::new("sc", "main")
            .nginx_annotations(&[("affinity", "cookie")])
            .host("sc.test", "stable"),
        Ingress::new("sc", "canary")
            .nginx_annotations(&[
                ("canary", "true"),
                ("canary-weight", "50"),
                ("affinity", "cookie"),
            ])
            .host("sc.test", "canary"),
    ];
    dir.write("ingress.yaml", &ingresses.map(|i| i.build()))?;
    let duet = DuetBuilder::new(DUET, dir.path()).start().await?;
    let mut sides = std::collections::BTreeSet::new();
    for family in Family::BOTH {
        for _ in 0..8 {
            let mut conn = Conn::http1(duet.http(family)).await?;
            let reply = get(&mut conn, "sc.test", "/", &[]).await?;
            let first = served_by(&reply)?;
            let set = reply
                .header("set-cookie")
                .expect("a session cookie")
                .to_owned();
            let cookie = set.split(';').next().unwrap_or_default().to_owned();
            // The session stays on its backend and pod, over either family: the weight draw
            // (50%) is skipped for a request whose cookie names a pod of either side.
            for other in Family::BOTH {
                let mut conn = Conn::http1(duet.http(other)).await?;
                for _ in 0..10 {
                    let reply =
                        get(&mut conn, "sc.test", "/", &[("cookie", cookie.as_str())]).await?;
                    assert_eq!(served_by(&reply)?, first, "{family}->{other}");
                }
            }
            sides.insert(first.0);
        }
    }
    // 16 sessions at 50%: both sides seen except with probability 2^-15.
    assert_eq!(sides.len(), 2, "{sides:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_send_timeout_cuts_an_upstream_that_stops_reading() -> anyhow::Result<()> {
    use conformance::fleet::{silent_port, static_service};
    use std::time::{Duration, Instant};
    // Listeners that never accept: the kernel completes the handshake, then buffers fill.
    let (silent4, _s4) = silent_port(Family::V4)?;
    let (silent6, _s6) = silent_port(Family::V6)?;
    let fleet = Fleet::start("send", "web", &[PodSpec::dual("pod")])?;
    let dir = ManifestDir::with_class()?;
    dir.write("fleet.yaml", &fleet.manifests())?;
    dir.write(
        "silent.yaml",
        &static_service("send", "silent", silent4, silent6),
    )?;
    let ingresses = [
        Ingress::new("send", "stall")
            .nginx_annotations(&[("proxy-send-timeout", "1"), ("proxy-body-size", "0")])
            .host("stall.test", "silent"),
        // The same timeout on a healthy upstream and a slow client: not cut.
        Ingress::new("send", "slow-client")
            .nginx_annotations(&[("proxy-send-timeout", "1")])
            .host("slow.test", "web"),
    ];
    dir.write("ingress.yaml", &ingresses.map(|i| i.build()))?;
    let duet = DuetBuilder::new(DUET, dir.path())
        .args(["--upstream-timeout", "20s"])
        .start()
        .await?;
    for family in Family::BOTH {
        let mut conn = Conn::http2(duet.http(family)).await?;
        let req = client::request(Method::PUT, "stall.test", "/up")
            .body(Full::new(Bytes::from(vec![b'x'; 64 << 20])))?;
        let start = Instant::now();
        let reply = conn.send(req).await?;
        let took = start.elapsed();
        assert_eq!(reply.status, 504, "{family}: {}", reply.text());
        // 1 s of stall, not the 20 s response timeout (10 s bounds a hang, not a speed).
        assert!(
            took >= Duration::from_secs(1) && took < Duration::from_secs(10),
            "{family}: {took:?}"
        );
        // A client sending its body in pieces 1.5 s apart is not the upstream stalling.
        let stream = client::connect_tcp(duet.http(family)).await?;
        let slow = slow_put(stream, "slow.test").await?;
        assert!(slow.starts_with("HTTP/1.1 200"), "{family}: {slow}");
    }
    Ok(())
}

/// A chunked PUT whose two chunks are 1.5 s apart; the response head line.
async fn slow_put(mut stream: tokio::net::TcpStream, host: &str) -> anyhow::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let head = format!("PUT /up HTTP/1.1\r\nHost: {host}\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n");
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(b"5\r\nhello\r\n").await?;
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    stream.write_all(b"5\r\nworld\r\n0\r\n\r\n").await?;
    let mut out = Vec::new();
    tokio::time::timeout(
        std::time::Duration::from_secs(10),
        stream.read_to_end(&mut out),
    )
    .await??;
    Ok(String::from_utf8_lossy(&out)
        .lines()
        .next()
        .unwrap_or_default()
        .to_owned())
}
