//! HTTPRoute and GRPCRoute rule internals end to end, over real sockets on 127.0.0.1 and [::1]:
//! rules written as Gateway API YAML, translated by `controller::translate::gateway_rule`, put in
//! a route table and served by the real proxy on both families to real echo backends. Matches
//! (headers, query parameters, method, precedence across rules and routes), filters (header
//! modifiers, redirects with their exact `Location`, rewrites as the backend sees them), timeouts
//! (504) and GRPCRoute method and header matches to an h2c backend.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use conformance::bytes::Bytes;
use conformance::client::{self, Conn};
use conformance::http::{Method, StatusCode};
use conformance::http_body_util::Full;
use conformance::{EchoServer, Family, Identity, Reply};
use controller::gateway_api::grpcroutes::GrpcRouteRules;
use controller::gateway_api::httproutes::HttpRouteRules;
use controller::translate::gateway_rule::{
    grpc_rule, http_backend_filters, http_rule, RuleRouting,
};
use dataplane::listen::{self, ServeOptions};
use dataplane::proxy::Proxy;
use dataplane::route_policy::{Alternative, Choice, Pinning};
use dataplane::table::{
    Backend, BackendId, FamilyPolicy, HostRules, Origin, PathRule, RouteAction, RouteTable,
    Snapshot, Target, TargetId, UpstreamProtocol, UpstreamTimeouts,
};
use dataplane::{ProxyConfig, Runtime};
use tokio::sync::watch;

const HOST: &str = "gw.test";

/// A route: its name, creation time (seconds) and rules as YAML (`spec.rules` of an HTTPRoute or
/// a GRPCRoute).
struct Route {
    name: &'static str,
    created: i64,
    grpc: bool,
    rules: &'static str,
}

impl Route {
    fn http(name: &'static str, created: i64, rules: &'static str) -> Route {
        Route {
            name,
            created,
            grpc: false,
            rules,
        }
    }
}

/// The proxy on both families serving `routes` for every host, with backends `v1`, `v2` (echo
/// pods of both families) and `v3` (an h2c echo pod).
struct Gateway {
    v4: SocketAddr,
    v6: SocketAddr,
    _echo: Vec<EchoServer>,
    _stop: watch::Sender<bool>,
}

impl Gateway {
    fn at(&self, family: Family) -> SocketAddr {
        match family {
            Family::V4 => self.v4,
            Family::V6 => self.v6,
        }
    }
}

fn backend_id(name: &str) -> BackendId {
    BackendId::new("gw", name, "8080")
}

/// One rule's translation as path rules of the table, to `backends` (name, weight): the first is
/// the action's backend, the others weighted alternatives.
fn path_rules(route: &Route, routing: RuleRouting, backends: &[(String, u32)]) -> Vec<PathRule> {
    let backend = backends.first().map_or("none", |(name, _)| name.as_str());
    let choice = (backends.len() > 1).then(|| {
        Arc::new(Choice {
            alternatives: backends[1..]
                .iter()
                .map(|(name, weight)| Alternative {
                    backend: backend_id(name),
                    weight: *weight,
                    pinning: Pinning::None,
                })
                .collect(),
            weight_total: backends.iter().map(|(_, w)| w).sum(),
            ..Choice::default()
        })
    });
    routing
        .matches
        .into_iter()
        .map(|m| PathRule {
            matcher: m.path,
            when: m.when,
            action: RouteAction {
                backend: backend_id(backend),
                policy: FamilyPolicy::default(),
                origin: Origin {
                    kind: dataplane::table::OriginKind::HttpRoute,
                    namespace: "gw".into(),
                    name: route.name.into(),
                    created: route.created,
                }
                .into(),
                redirect_https: false,
                max_body_bytes: 0,
                upstream_tls: None,
                timeouts: UpstreamTimeouts::default().into(),
                protocol: None,
                redirect: None,
                source_ranges: None,
                rewrite: None,
                access: None,
                choice: choice.clone(),
                filters: routing.filters.clone(),
                client_auth: None,
            },
        })
        .collect()
}

fn table(routes: &[Route]) -> anyhow::Result<RouteTable> {
    let mut rules = Vec::new();
    for route in routes {
        if route.grpc {
            let parsed: Vec<GrpcRouteRules> = serde_saphyr::from_str(route.rules)?;
            for rule in &parsed {
                let refs = rule.backend_refs.iter().flatten();
                let backends: Vec<_> = refs.map(|b| (b.name.clone(), 1)).collect();
                let routing = grpc_rule(rule).map_err(|e| anyhow::anyhow!("{e}"))?;
                rules.extend(path_rules(route, routing, &backends));
            }
        } else {
            let parsed: Vec<HttpRouteRules> = serde_saphyr::from_str(route.rules)?;
            for rule in &parsed {
                let mut routing = http_rule(rule).map_err(|e| anyhow::anyhow!("{e}"))?;
                let mut backends = Vec::new();
                for b in rule.backend_refs.iter().flatten() {
                    let filters = b.filters.as_deref().unwrap_or_default();
                    let own = http_backend_filters(filters).map_err(|e| anyhow::anyhow!("{e}"))?;
                    if let Some(own) = own {
                        routing.add_backend_filters(backend_id(&b.name), own);
                    }
                    let weight = u32::try_from(b.weight.unwrap_or(1)).unwrap_or(0);
                    backends.push((b.name.clone(), weight));
                }
                rules.extend(path_rules(route, routing, &backends));
            }
        }
    }
    // Host-less, so that clients naming the listener's address reach them too.
    let (any_host, conflicts) = HostRules::new("", rules);
    anyhow::ensure!(conflicts.is_empty(), "conflicting rules: {conflicts:?}");
    Ok(RouteTable {
        any_host,
        ..RouteTable::default()
    })
}

async fn echo(service: &str) -> anyhow::Result<EchoServer> {
    let identity = Identity {
        namespace: "gw".into(),
        ingress: String::new(),
        service: service.into(),
    };
    let pods = [(
        format!("{service}-pod"),
        vec!["127.0.0.1:0".parse()?, "[::1]:0".parse()?],
    )];
    Ok(EchoServer::bind(identity, &pods, Default::default())?)
}

fn backend(name: &str, server: &EchoServer, protocol: UpstreamProtocol) -> Backend {
    let addrs = &server.pods()[0].addrs;
    Backend {
        id: backend_id(name),
        targets: vec![Target::with_addrs(
            TargetId(format!("{name}-pod").into()),
            addrs.iter().copied(),
            None,
        )]
        .into(),
        lb: Default::default(),
        protocol,
    }
}

async fn gateway(routes: &[Route]) -> anyhow::Result<Gateway> {
    let servers = vec![echo("v1").await?, echo("v2").await?, echo("v3").await?];
    let backends = [
        backend("v1", &servers[0], UpstreamProtocol::Http1),
        backend("v2", &servers[1], UpstreamProtocol::Http1),
        backend("v3", &servers[2], UpstreamProtocol::H2c),
    ];
    let snapshot = Snapshot {
        version: 1,
        routes: Arc::new(table(routes)?),
        backends: backends
            .into_iter()
            .map(|b| (b.id.clone(), Arc::new(b)))
            .collect(),
        certs: Default::default(),
        gateways: Default::default(),
    };
    let runtime = Runtime::new(ProxyConfig::default());
    runtime.apply(Arc::new(snapshot));
    let proxy = Proxy::new(runtime);
    let (stop, stopped) = watch::channel(false);
    let mut bound = Vec::new();
    for addr in ["127.0.0.1:0", "[::1]:0"] {
        let listener = listen::bind(addr.parse()?)?;
        bound.push(listener.local_addr()?);
        let options = ServeOptions {
            header_read_timeout: Duration::from_secs(10),
            keepalive_timeout: Duration::from_secs(10),
            drain_timeout: Duration::from_secs(1),
            tls: None,
            proxy_protocol: None,
            trusted_proxies: Default::default(),
            connections: None,
            proxy_protocol_from: None,
            max_connections: None,
            handshakes: None,
            gateway_port: None,
            forwarded_port: None,
        };
        let proxy = proxy.clone();
        let handler = move |req, conn| proxy.clone().handle(req, conn);
        tokio::spawn(listen::serve(listener, options, handler, stopped.clone()));
    }
    Ok(Gateway {
        v4: bound[0],
        v6: bound[1],
        _echo: servers,
        _stop: stop,
    })
}

/// Sends a request with extra headers over a fresh HTTP/1.1 connection.
async fn send(
    to: SocketAddr,
    method: Method,
    host: &str,
    target: &str,
    headers: &[(&str, &str)],
) -> anyhow::Result<Reply> {
    let mut builder = client::request(method, host, target);
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    let req = builder.body(Full::new(Bytes::new()))?;
    Conn::http1(to).await?.send(req).await
}

/// The service that answered, or the status when none did.
async fn served_by(
    to: SocketAddr,
    method: Method,
    target: &str,
    headers: &[(&str, &str)],
) -> anyhow::Result<String> {
    let reply = send(to, method, HOST, target, headers).await?;
    if reply.status != StatusCode::OK {
        return Ok(reply.status.as_str().to_owned());
    }
    Ok(reply.echo()?.service)
}

const HEADER_RULES: &str = r#"
- matches: [{headers: [{name: version, value: one}]}]
  backendRefs: [{name: v1, port: 8080}]
- matches: [{headers: [{name: version, value: two}]}]
  backendRefs: [{name: v2, port: 8080}]
- matches: [{headers: [{name: version, value: two}, {name: color, value: orange}]}]
  backendRefs: [{name: v1, port: 8080}]
- matches: [{headers: [{name: color, value: blue}]}, {headers: [{name: color, value: green}]}]
  backendRefs: [{name: v1, port: 8080}]
- matches: [{headers: [{name: color, value: red}]}, {headers: [{name: color, value: yellow}]}]
  backendRefs: [{name: v2, port: 8080}]
- matches: [{headers: [{name: X-Build, type: RegularExpression, value: "v[0-9]+"}]}]
  backendRefs: [{name: v2, port: 8080}]
"#;

const QUERY_METHOD_RULES: &str = r#"
- matches: [{path: {type: PathPrefix, value: /q}, queryParams: [{name: animal, value: whale}]}]
  backendRefs: [{name: v1, port: 8080}]
- matches: [{path: {type: PathPrefix, value: /q}, queryParams: [{name: animal, value: dolphin}]}]
  backendRefs: [{name: v2, port: 8080}]
- matches: [{path: {type: PathPrefix, value: /q}, queryParams: [{name: animal, value: dolphin}, {name: color, type: RegularExpression, value: "bl.e"}]}]
  backendRefs: [{name: v1, port: 8080}]
- matches: [{path: {type: PathPrefix, value: /m}, method: POST}]
  backendRefs: [{name: v1, port: 8080}]
- matches: [{path: {type: PathPrefix, value: /m}, method: GET}]
  backendRefs: [{name: v2, port: 8080}]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_query_and_method_matches_choose_the_rule() -> anyhow::Result<()> {
    let gw = gateway(&[
        Route::http("headers", 1, HEADER_RULES),
        Route::http("query-method", 2, QUERY_METHOD_RULES),
    ])
    .await?;
    for family in Family::BOTH {
        let to = gw.at(family);
        let get = |target: &'static str, headers: &'static [(&'static str, &'static str)]| {
            served_by(to, Method::GET, target, headers)
        };
        // The upstream HTTPRouteHeaderMatching cases, header names in any case.
        assert_eq!(get("/", &[("Version", "one")]).await?, "v1", "{family}");
        assert_eq!(get("/", &[("version", "two")]).await?, "v2", "{family}");
        assert_eq!(
            get("/", &[("Version", "two"), ("Color", "orange")]).await?,
            "v1"
        );
        assert_eq!(
            get("/", &[("Version", "two"), ("Color", "blue")]).await?,
            "v2"
        );
        assert_eq!(get("/", &[("Color", "orange")]).await?, "404");
        assert_eq!(get("/", &[("Some-Other-Header", "one")]).await?, "404");
        assert_eq!(get("/", &[("COLOR", "green")]).await?, "v1");
        assert_eq!(get("/", &[("color", "yellow")]).await?, "v2");
        assert_eq!(get("/", &[("Color", "purple")]).await?, "404");
        // A regex matches whole values; a repeated header is matched as its joined value.
        assert_eq!(get("/", &[("x-build", "v12")]).await?, "v2");
        assert_eq!(get("/", &[("x-build", "v12-rc")]).await?, "404");
        assert_eq!(
            get("/", &[("version", "one"), ("version", "two")]).await?,
            "404"
        );
        // Query parameters: names case-sensitive, more conditions win, values whole.
        assert_eq!(get("/q?animal=whale", &[]).await?, "v1", "{family}");
        assert_eq!(get("/q?animal=dolphin", &[]).await?, "v2");
        assert_eq!(get("/q?animal=dolphin&color=blue", &[]).await?, "v1");
        assert_eq!(get("/q?animal=dolphin&color=yellow", &[]).await?, "v2");
        assert_eq!(get("/q?ANIMAL=whale", &[]).await?, "404");
        assert_eq!(get("/q?animal=whaledolphin", &[]).await?, "404");
        assert_eq!(get("/q?other=1&animal=whale", &[]).await?, "v1");
        assert_eq!(get("/q", &[]).await?, "404");
        // Method.
        assert_eq!(
            served_by(to, Method::POST, "/m", &[]).await?,
            "v1",
            "{family}"
        );
        assert_eq!(get("/m", &[]).await?, "v2");
        assert_eq!(served_by(to, Method::PUT, "/m", &[]).await?, "404");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn precedence_across_rules_and_routes_follows_the_spec() -> anyhow::Result<()> {
    // The newer route (listed first) holds the more specific rules to v2, the older one the less
    // specific to v1: precedence, not age or order, must pick the newer's.
    let newer = Route::http(
        "newer",
        20,
        r#"
- matches: [{path: {type: Exact, value: /p/x}}]
  backendRefs: [{name: v2, port: 8080}]
- matches: [{path: {type: PathPrefix, value: /p}, method: GET}]
  backendRefs: [{name: v2, port: 8080}]
- matches: [{path: {type: PathPrefix, value: /p}, headers: [{name: a, value: "1"}], queryParams: [{name: q, value: "1"}]}]
  backendRefs: [{name: v2, port: 8080}]
- matches: [{path: {type: PathPrefix, value: /tie}, headers: [{name: a, value: "1"}]}]
  backendRefs: [{name: v2, port: 8080}]
"#,
    );
    let older = Route::http(
        "older",
        10,
        r#"
- matches: [{path: {type: PathPrefix, value: /p}}]
  backendRefs: [{name: v1, port: 8080}]
- matches: [{path: {type: PathPrefix, value: /p}, headers: [{name: a, value: "1"}]}]
  backendRefs: [{name: v1, port: 8080}]
- matches: [{path: {type: PathPrefix, value: /p}, headers: [{name: a, value: "1"}, {name: b, value: "1"}]}]
  backendRefs: [{name: v1, port: 8080}]
- matches: [{path: {type: PathPrefix, value: /tie}, headers: [{name: b, value: "1"}]}]
  backendRefs: [{name: v1, port: 8080}]
"#,
    );
    let gw = gateway(&[newer, older]).await?;
    let (a, ab): (&[_], &[_]) = (&[("a", "1")], &[("a", "1"), ("b", "1")]);
    for family in Family::BOTH {
        let to = gw.at(family);
        let at = |m: Method, target: &'static str, h: &'static [(&'static str, &'static str)]| {
            served_by(to, m, target, h)
        };
        // Exact beats every prefix.
        assert_eq!(at(Method::POST, "/p/x", ab).await?, "v2", "{family}");
        // A method beats two headers.
        assert_eq!(at(Method::GET, "/p/y", ab).await?, "v2", "{family}");
        // Without a method: two headers beat one header and a query parameter...
        assert_eq!(at(Method::POST, "/p/y?q=1", ab).await?, "v1", "{family}");
        // ...which beat one header alone, which beats none.
        assert_eq!(at(Method::POST, "/p/y?q=1", a).await?, "v2", "{family}");
        assert_eq!(at(Method::POST, "/p/y", a).await?, "v1", "{family}");
        assert_eq!(at(Method::POST, "/p/z", &[]).await?, "v1", "{family}");
        // Equal rank: the older route wins.
        assert_eq!(at(Method::POST, "/tie", ab).await?, "v1", "{family}");
        assert_eq!(at(Method::POST, "/tie", a).await?, "v2", "{family}");
    }
    Ok(())
}

const MODIFIER_RULES: &str = r#"
- matches: [{path: {type: PathPrefix, value: /req}}]
  filters:
  - type: RequestHeaderModifier
    requestHeaderModifier:
      set: [{name: X-Header-Set, value: set-overwrites-values}]
      add: [{name: X-Header-Add, value: add-appends-values}]
      remove: [X-Header-Remove]
  backendRefs: [{name: v1, port: 8080}]
- matches: [{path: {type: PathPrefix, value: /res}}]
  filters:
  - type: ResponseHeaderModifier
    responseHeaderModifier:
      set: [{name: X-Header-Set, value: set-overwrites-values}]
      add: [{name: X-Header-Add, value: add-appends-values}]
      remove: [X-Header-Remove]
  backendRefs: [{name: v1, port: 8080}]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_modifiers_change_the_request_and_the_response() -> anyhow::Result<()> {
    let gw = gateway(&[Route::http("modifiers", 1, MODIFIER_RULES)]).await?;
    for family in Family::BOTH {
        let to = gw.at(family);
        let headers = [
            ("X-Header-Set", "some-other-value"),
            ("X-Header-Add", "some-other-value"),
            ("X-Header-Remove", "val"),
            ("Some-Other-Header", "val"),
        ];
        let seen = send(to, Method::GET, HOST, "/req", &headers)
            .await?
            .echo()?;
        assert_eq!(
            seen.header("X-Header-Set").as_deref(),
            Some("set-overwrites-values")
        );
        assert_eq!(
            seen.header("X-Header-Add").as_deref(),
            Some("some-other-value,add-appends-values"),
            "{family}"
        );
        assert_eq!(seen.header("X-Header-Remove"), None, "{family}");
        assert_eq!(seen.header("Some-Other-Header").as_deref(), Some("val"));
        let seen = send(to, Method::GET, HOST, "/req", &[]).await?.echo()?;
        assert_eq!(
            seen.header("X-Header-Add").as_deref(),
            Some("add-appends-values")
        );

        // The echo backend sets response headers named in X-Echo-Set-Header.
        let set = "X-Header-Set: backend, X-Header-Add: backend, X-Header-Remove: backend";
        let reply = send(to, Method::GET, HOST, "/res", &[("X-Echo-Set-Header", set)]).await?;
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(
            reply.header("x-header-set"),
            Some("set-overwrites-values"),
            "{family}"
        );
        assert_eq!(
            reply.header("x-header-add"),
            Some("backend,add-appends-values")
        );
        assert_eq!(reply.header("x-header-remove"), None, "{family}");
    }
    Ok(())
}

const REDIRECT_RULES: &str = r#"
- matches: [{path: {type: PathPrefix, value: /original-prefix}}]
  filters: [{type: RequestRedirect, requestRedirect: {path: {type: ReplacePrefixMatch, replacePrefixMatch: /replacement-prefix}}}]
- matches: [{path: {type: PathPrefix, value: /full}}]
  filters: [{type: RequestRedirect, requestRedirect: {path: {type: ReplaceFullPath, replaceFullPath: /full-path-replacement}, statusCode: 301}}]
- matches: [{path: {type: PathPrefix, value: /scheme}}]
  filters: [{type: RequestRedirect, requestRedirect: {scheme: https, hostname: example.org, statusCode: 303}}]
- matches: [{path: {type: PathPrefix, value: /port}}]
  filters: [{type: RequestRedirect, requestRedirect: {port: 8083, statusCode: 307}}]
- matches: [{path: {type: PathPrefix, value: /host}}]
  filters: [{type: RequestRedirect, requestRedirect: {hostname: example.org, statusCode: 308}}]
- matches: [{path: {type: PathPrefix, value: /http-80}}]
  filters: [{type: RequestRedirect, requestRedirect: {scheme: http, port: 80}}]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redirects_answer_with_the_exact_location() -> anyhow::Result<()> {
    let gw = gateway(&[Route::http("redirects", 1, REDIRECT_RULES)]).await?;
    for family in Family::BOTH {
        let to = gw.at(family);
        // The Host as the client wrote it: the listener's address and port.
        let literal = match family {
            Family::V4 => "127.0.0.1",
            Family::V6 => "[::1]",
        };
        let host = format!("{literal}:{}", to.port());
        let cases = [
            (
                "/original-prefix/lemon?x=1",
                302,
                format!("http://{host}/replacement-prefix/lemon?x=1"),
            ),
            (
                "/original-prefix",
                302,
                format!("http://{host}/replacement-prefix"),
            ),
            (
                "/full/path/original",
                301,
                format!("http://{host}/full-path-replacement"),
            ),
            ("/scheme", 303, "https://example.org/scheme".to_owned()),
            ("/port/a", 307, format!("http://{literal}:8083/port/a")),
            (
                "/host",
                308,
                format!("http://example.org:{}/host", to.port()),
            ),
            ("/http-80", 302, format!("http://{literal}/http-80")),
        ];
        for (target, status, location) in cases {
            let reply = send(to, Method::GET, &host, target, &[]).await?;
            assert_eq!(reply.status.as_u16(), status, "{family} {target}");
            assert_eq!(
                reply.header("location"),
                Some(&*location),
                "{family} {target}"
            );
        }
        // A Host without a port: the port of the request's scheme, left out.
        let reply = send(to, Method::GET, HOST, "/host", &[]).await?;
        assert_eq!(
            reply.header("location"),
            Some("http://example.org/host"),
            "{family}"
        );
    }
    Ok(())
}

const REWRITE_RULES: &str = r#"
- matches: [{path: {type: PathPrefix, value: /prefix/one}}]
  filters: [{type: URLRewrite, urlRewrite: {path: {type: ReplacePrefixMatch, replacePrefixMatch: /one}}}]
  backendRefs: [{name: v1, port: 8080}]
- matches: [{path: {type: PathPrefix, value: /strip-prefix}}]
  filters: [{type: URLRewrite, urlRewrite: {path: {type: ReplacePrefixMatch, replacePrefixMatch: /}}}]
  backendRefs: [{name: v1, port: 8080}]
- matches: [{path: {type: PathPrefix, value: /full/one}}]
  filters: [{type: URLRewrite, urlRewrite: {path: {type: ReplaceFullPath, replaceFullPath: /one}}}]
  backendRefs: [{name: v1, port: 8080}]
- matches: [{path: {type: PathPrefix, value: /host}}]
  filters: [{type: URLRewrite, urlRewrite: {hostname: one.example.org}}]
  backendRefs: [{name: v1, port: 8080}]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rewrites_change_what_the_backend_sees() -> anyhow::Result<()> {
    let gw = gateway(&[Route::http("rewrites", 1, REWRITE_RULES)]).await?;
    for family in Family::BOTH {
        let to = gw.at(family);
        for (target, path) in [
            ("/prefix/one/two", "/one/two"),
            ("/prefix/one", "/one"),
            ("/prefix/one/", "/one/"),
            ("/strip-prefix/three", "/three"),
            ("/strip-prefix", "/"),
            ("/strip-prefix/", "/"),
            ("/full/one/two?x=1", "/one?x=1"),
        ] {
            let seen = send(to, Method::GET, HOST, target, &[]).await?.echo()?;
            assert_eq!(seen.path, path, "{family} {target}");
            assert_eq!(seen.host, HOST, "{family} {target}");
        }
        let seen = send(to, Method::GET, HOST, "/host/x", &[]).await?.echo()?;
        assert_eq!(
            (seen.host.as_str(), seen.path.as_str()),
            ("one.example.org", "/host/x")
        );
        assert_eq!(seen.family, family);
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_ref_filters_apply_to_the_backend_that_serves() -> anyhow::Result<()> {
    // HTTPRouteRequestHeaderModifierBackendWeights: two weighted backends, each naming itself.
    let rules = r#"
- filters: [{type: ResponseHeaderModifier, responseHeaderModifier: {set: [{name: X-Rule, value: "yes"}]}}]
  backendRefs:
  - name: v1
    port: 8080
    weight: 10
    filters:
    - {type: RequestHeaderModifier, requestHeaderModifier: {set: [{name: Backend, value: v1}]}}
    - {type: ResponseHeaderModifier, responseHeaderModifier: {add: [{name: X-Served, value: v1}]}}
  - name: v2
    port: 8080
    weight: 10
    filters:
    - {type: RequestHeaderModifier, requestHeaderModifier: {set: [{name: Backend, value: v2}]}}
"#;
    let gw = gateway(&[Route::http("weights", 1, rules)]).await?;
    for family in Family::BOTH {
        let to = gw.at(family);
        let mut seen = std::collections::BTreeSet::new();
        // Both are drawn within 40 requests but for a chance of 2^-39.
        for _ in 0..40 {
            let reply = send(to, Method::GET, HOST, "/", &[("Backend", "client")]).await?;
            let echo = reply.echo()?;
            assert_eq!(
                echo.header("Backend"),
                Some(echo.service.clone()),
                "{family}"
            );
            let served = reply.header("x-served").map(str::to_owned);
            let expected = (echo.service == "v1").then(|| "v1".to_owned());
            assert_eq!(served, expected, "{family}");
            assert_eq!(reply.header("x-rule"), Some("yes"), "{family}");
            seen.insert(echo.service);
        }
        assert_eq!(seen.len(), 2, "{family}: {seen:?}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_and_backend_timeouts_answer_504() -> anyhow::Result<()> {
    let rules = r#"
- matches: [{path: {type: PathPrefix, value: /request-timeout}}]
  timeouts: {request: 500ms}
  backendRefs: [{name: v1, port: 8080}]
- matches: [{path: {type: PathPrefix, value: /disable-request-timeout}}]
  timeouts: {request: 0s}
  backendRefs: [{name: v1, port: 8080}]
- matches: [{path: {type: PathPrefix, value: /backend-timeout}}]
  timeouts: {backendRequest: 500ms}
  backendRefs: [{name: v1, port: 8080}]
"#;
    let gw = gateway(&[Route::http("timeouts", 1, rules)]).await?;
    for family in Family::BOTH {
        let to = gw.at(family);
        for path in ["/request-timeout", "/backend-timeout"] {
            let fast = send(to, Method::GET, HOST, path, &[]).await?;
            assert_eq!(fast.status, StatusCode::OK, "{family} {path}");
            let slow = send(to, Method::GET, HOST, path, &[("X-Echo-Delay-Ms", "1500")]).await?;
            assert_eq!(slow.status, StatusCode::GATEWAY_TIMEOUT, "{family} {path}");
        }
        let path = "/disable-request-timeout";
        let slow = send(to, Method::GET, HOST, path, &[("X-Echo-Delay-Ms", "1500")]).await?;
        assert_eq!(slow.status, StatusCode::OK, "{family}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_method_and_header_matches_reach_an_h2c_backend() -> anyhow::Result<()> {
    let rules = r#"
- matches: [{method: {service: grpc.Echo, method: Call}}]
  backendRefs: [{name: v3, port: 8080}]
- matches: [{method: {service: grpc.Echo}, headers: [{name: version, value: two}]}]
  filters: [{type: RequestHeaderModifier, requestHeaderModifier: {add: [{name: x-routed, value: by-header}]}}]
  backendRefs: [{name: v3, port: 8080}]
- matches: [{method: {type: RegularExpression, service: "grpc\\.Ot.*", method: "Get|Put"}}]
  backendRefs: [{name: v3, port: 8080}]
"#;
    let gw = gateway(&[Route {
        name: "grpc",
        created: 1,
        grpc: true,
        rules,
    }])
    .await?;
    for family in Family::BOTH {
        let to = gw.at(family);
        let call = |path: &'static str, version: Option<&'static str>| async move {
            let mut req = client::request(Method::POST, HOST, path)
                .header("content-type", "application/grpc")
                .header("te", "trailers");
            if let Some(v) = version {
                req = req.header("version", v);
            }
            let body = conformance::echo::grpc_frame(b"hi");
            Conn::http2(to)
                .await?
                .send(req.body(Full::new(body))?)
                .await
        };
        let reply = call("/grpc.Echo/Call", None).await?;
        assert_eq!(reply.status, StatusCode::OK, "{family}");
        assert_eq!(
            reply.trailers.get("grpc-status").map(|v| v.as_bytes()),
            Some(&b"0"[..])
        );
        assert_eq!(
            call("/grpc.Echo/Other", None).await?.status,
            StatusCode::NOT_FOUND
        );
        let by_header = call("/grpc.Echo/Other", Some("two")).await?;
        assert_eq!(by_header.status, StatusCode::OK, "{family}");
        let messages = conformance::echo::grpc_messages(&by_header.body).unwrap_or_default();
        let seen: conformance::Echo = serde_json::from_slice(&messages[0])?;
        assert_eq!(seen.header("x-routed").as_deref(), Some("by-header"));
        assert_eq!(seen.proto, "HTTP/2.0", "{family}");
        assert_eq!(call("/grpc.Other/Put", None).await?.status, StatusCode::OK);
        assert_eq!(
            call("/grpc.Other/Delete", None).await?.status,
            StatusCode::NOT_FOUND
        );
        assert_eq!(
            call("/grpc.Echo/Call/x", None).await?.status,
            StatusCode::NOT_FOUND
        );
    }
    Ok(())
}
