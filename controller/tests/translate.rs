//! Table-driven translation tests over the YAML fixtures in `tests/fixtures/translate/`: each case
//! loads a manifest file the way `--manifests` does, translates it, and asserts where requests go
//! and which diagnostics come out.

use std::path::Path;
use std::time::Duration;

use controller::class::ClassConfig;
use controller::index::{Change, Index};
use controller::source::files;
use controller::translate::{self, Config, Diagnostic, Reason};
use dataplane::table::UpstreamTimeouts;
use dataplane::{FamilyPolicy, Snapshot, Target, TargetId};

fn load(fixture: &str) -> Index {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/translate")
        .join(fixture);
    let text = std::fs::read_to_string(&path).expect("fixture exists");
    let parsed = files::parse(&text, &[]);
    assert!(
        parsed.problems.is_empty(),
        "{fixture}: {:?}",
        parsed.problems
    );
    let mut index = Index::new(ClassConfig::default());
    for object in parsed.objects {
        index.apply(Change::Apply { object, file: None });
    }
    index
}

fn translate(fixture: &str, config: &Config) -> (Snapshot, Vec<Diagnostic>) {
    let index = load(fixture);
    translate::build(&index.inputs(), config)
}

/// The backend a request goes to, with the route's family policy.
fn route(snapshot: &Snapshot, host: &str, path: &str) -> Option<(String, FamilyPolicy)> {
    snapshot
        .routes
        .find(host, path)
        .map(|m| (m.action.backend.to_string(), m.action.policy))
}

struct Case {
    fixture: &'static str,
    config: fn() -> Config,
    /// (Host header, path, backend id or None for "no route").
    routes: &'static [(&'static str, &'static str, Option<&'static str>)],
    /// (reason, object) of every diagnostic expected, sorted like the output.
    diagnostics: &'static [(Reason, &'static str)],
}

fn default_config() -> Config {
    Config::default()
}

fn watch_all() -> Config {
    Config {
        class: ClassConfig {
            watch_without_class: true,
            ..ClassConfig::default()
        },
        ..Config::default()
    }
}

const CASES: &[Case] = &[
    Case {
        fixture: "basic.yaml",
        config: default_config,
        routes: &[
            ("shop.example.com", "/cart", Some("default/cart:80")),
            // Exact does not match a trailing slash; the ImplementationSpecific "/" does.
            ("Shop.Example.com:8080", "/cart/", Some("default/web:80")),
            ("shop.example.com", "/api", Some("default/api:http")),
            ("shop.example.com", "/api/v1", Some("default/api:http")),
            ("shop.example.com", "/apix", Some("default/web:80")),
            // A host with its own entry does not fall through to the host-less rules.
            ("shop.example.com", "/health", Some("default/web:80")),
            ("x.example.com", "/anything", Some("default/web:80")),
            // A wildcard covers exactly one label.
            ("a.b.example.com", "/", None),
            ("a.b.example.com", "/health/x", Some("default/api:http")),
            ("example.com", "/health", Some("default/api:http")),
            ("other.test", "/", None),
        ],
        diagnostics: &[],
    },
    Case {
        fixture: "precedence.yaml",
        config: default_config,
        routes: &[
            ("app.test", "/v1/users", Some("team/old:80")),
            ("app.test", "/v1/users/7", Some("team/young:80")),
            ("app.test", "/v1/x", Some("team/old:80")),
            ("app.test", "/", Some("team/old:80")),
            ("app.test", "/elsewhere", Some("team/old:80")),
        ],
        diagnostics: &[(Reason::ConflictingPath, "Ingress team/young")],
    },
    Case {
        fixture: "default_backend.yaml",
        config: default_config,
        routes: &[
            ("known.test", "/only", Some("default/two:80")),
            ("known.test", "/other", Some("default/one:80")),
            ("unknown.test", "/", Some("default/one:80")),
        ],
        diagnostics: &[(Reason::DuplicateDefaultBackend, "Ingress default/second")],
    },
    Case {
        fixture: "bad_references.yaml",
        config: default_config,
        routes: &[
            ("good.test", "/ok", Some("default/web:80")),
            ("good.test", "/no-service", None),
            ("good.test", "/no-port", None),
            ("good.test", "/no-port-name", None),
            ("good.test", "/regex", None),
            ("good.test", "/bucket", None),
            ("bad.x.test", "/", None),
        ],
        diagnostics: &[
            (Reason::MissingService, "Ingress default/mixed"),
            (Reason::UnknownServicePort, "Ingress default/mixed"),
            (Reason::UnknownServicePort, "Ingress default/mixed"),
            (Reason::MissingSecret, "Ingress default/mixed"),
            (Reason::InvalidPath, "Ingress default/mixed"),
            (Reason::InvalidPath, "Ingress default/mixed"),
            (Reason::InvalidHost, "Ingress default/mixed"),
            (Reason::InvalidAnnotation, "Ingress default/mixed"),
            (Reason::UnsupportedBackend, "Ingress default/mixed"),
        ],
    },
    Case {
        fixture: "classes.yaml",
        config: default_config,
        routes: &[
            ("by-class.test", "/", Some("default/web:80")),
            ("by-annotation.test", "/", Some("default/web:80")),
            ("by-flag-name.test", "/", Some("default/web:80")),
            ("theirs.test", "/", None),
            ("classless.test", "/", None),
        ],
        // Problems of other controllers' Ingresses are not ours to report.
        diagnostics: &[],
    },
    Case {
        fixture: "classes.yaml",
        config: watch_all,
        routes: &[
            ("by-class.test", "/", Some("default/web:80")),
            ("theirs.test", "/", None),
            ("classless.test", "/", Some("default/web:80")),
        ],
        diagnostics: &[],
    },
    Case {
        fixture: "dual_stack.yaml",
        config: default_config,
        routes: &[("web.test", "/", Some("default/web:80"))],
        diagnostics: &[(
            Reason::UnsupportedAddressType,
            "EndpointSlice default/web-fqdn",
        )],
    },
];

#[test]
fn fixtures_route_as_specified() {
    for case in CASES {
        let (snapshot, diagnostics) = translate(case.fixture, &(case.config)());
        for (host, path, want) in case.routes {
            let got = route(&snapshot, host, path).map(|(b, _)| b);
            assert_eq!(got.as_deref(), *want, "{}: {host}{path}", case.fixture);
        }
        let mut got: Vec<(Reason, String)> = diagnostics
            .iter()
            .map(|d| (d.reason, d.object.to_string()))
            .collect();
        let mut want: Vec<(Reason, String)> = case
            .diagnostics
            .iter()
            .map(|(r, o)| (*r, (*o).to_owned()))
            .collect();
        got.sort();
        want.sort();
        assert_eq!(got, want, "{}: {diagnostics:#?}", case.fixture);
        // Every backend a route names exists in the snapshot.
        for id in snapshot.routes.backend_ids() {
            assert!(snapshot.backend(id).is_some(), "{}: {id}", case.fixture);
        }
    }
}

#[test]
fn diagnostics_say_what_and_where() {
    let (_, diagnostics) = translate("bad_references.yaml", &Config::default());
    let text: Vec<String> = diagnostics.iter().map(ToString::to_string).collect();
    let has = |needle: &str| text.iter().any(|t| t.contains(needle));
    assert!(has("Service default/ghost does not exist"), "{text:#?}");
    assert!(has("has no port 81"), "{text:#?}");
    assert!(has("has no port grpc"), "{text:#?}");
    assert!(has("\"relative\" does not start with \"/\""), "{text:#?}");
    assert!(has("pathType \"Regex\""), "{text:#?}");
    assert!(has("PreferIPv5"), "{text:#?}");
    assert!(
        has("TLS secret default/good-tls does not exist"),
        "{text:#?}"
    );
}

#[test]
fn invalid_annotation_falls_back_to_the_global_policy() {
    let config = Config {
        family_policy: FamilyPolicy::PreferIpv6,
        ..Config::default()
    };
    let (snapshot, _) = translate("bad_references.yaml", &config);
    assert_eq!(
        route(&snapshot, "good.test", "/ok"),
        Some(("default/web:80".to_owned(), FamilyPolicy::PreferIpv6))
    );
}

#[test]
fn family_annotation_overrides_per_ingress_on_a_shared_service() {
    let config = Config {
        family_policy: FamilyPolicy::PreferIpv6,
        ..Config::default()
    };
    let (snapshot, diagnostics) = translate("family_annotation.yaml", &config);
    assert!(diagnostics.is_empty(), "{diagnostics:?}");
    assert_eq!(
        route(&snapshot, "strict.test", "/"),
        Some(("default/web:80".to_owned(), FamilyPolicy::RequireSameFamily))
    );
    assert_eq!(
        route(&snapshot, "plain.test", "/"),
        Some(("default/web:80".to_owned(), FamilyPolicy::PreferIpv6))
    );
    // One backend serves both routes.
    assert_eq!(snapshot.backends.len(), 1);
}

#[test]
fn dual_stack_pods_are_one_target_each() {
    let (snapshot, _) = translate("dual_stack.yaml", &Config::default());
    let backend = snapshot
        .backends
        .values()
        .next()
        .expect("one backend")
        .clone();
    assert_eq!(snapshot.backends.len(), 1);
    let target = |id: &str, v4: Option<&str>, v6: Option<&str>, zone: Option<&str>| Target {
        id: TargetId(id.into()),
        v4: v4.map(|a| a.parse().unwrap()),
        v6: v6.map(|a| a.parse().unwrap()),
        zone: zone.map(Into::into),
    };
    assert_eq!(
        &*backend.targets,
        &[
            // No targetRef: a single-family target named by its address.
            target("10.0.0.9:8080", Some("10.0.0.9:8080"), None, None),
            // Joined by uid; each family's port from its own slice's "http" port.
            target(
                "uid-dual",
                Some("10.0.0.1:8080"),
                Some("[fd00::1]:8081"),
                Some("zone-a")
            ),
            target("uid-v4only", Some("10.0.0.2:8080"), None, None),
            target("uid-v6only", None, Some("[fd00::5]:8081"), None),
        ]
    );
}

#[test]
fn build_is_deterministic_and_serialisable() {
    let (a, da) = translate("precedence.yaml", &Config::default());
    let (b, db) = translate("precedence.yaml", &Config::default());
    assert_eq!(da, db);
    assert_eq!(
        serde_json::to_string(&a).unwrap(),
        serde_json::to_string(&b).unwrap()
    );
    assert_eq!(a.version, 0);
}

#[test]
fn app_protocol_selects_the_upstream_protocol_and_annotations_the_tls() {
    use dataplane::table::UpstreamProtocol;
    let (snapshot, diagnostics) = translate("upstream_protocols.yaml", &Config::default());
    let protocol =
        |id: &str| snapshot.backends[&id.parse::<dataplane::BackendId>().unwrap()].protocol;
    assert_eq!(protocol("default/multi:plain"), UpstreamProtocol::Http1);
    assert_eq!(protocol("default/multi:h2c"), UpstreamProtocol::H2c);
    assert_eq!(protocol("default/multi:443"), UpstreamProtocol::Https);
    assert_eq!(protocol("default/multi:h2"), UpstreamProtocol::H2);
    assert_eq!(protocol("default/multi:odd"), UpstreamProtocol::Http1);

    let tls = |host: &str, path: &str| {
        let action = snapshot.routes.find(host, path).unwrap().action;
        action.upstream_tls.clone()
    };
    assert!(tls("a.test", "/plain").is_none());
    assert!(tls("a.test", "/h2c").is_none());
    let missing = tls("a.test", "/tls").unwrap();
    assert_eq!(missing.server_name(), "api.internal");
    assert!(missing.error().unwrap().contains("does not exist"));
    let skip = tls("b.test", "/tls").unwrap();
    assert_eq!(skip.server_name(), "multi.default.svc");
    assert_eq!(skip.error(), None);
    assert_ne!(*skip, *tls("b.test", "/h2").unwrap(), "ALPN differs");
    assert!(tls("c.test", "/").unwrap().error().is_some());

    let found: Vec<(Reason, String)> = diagnostics
        .iter()
        .map(|d| (d.reason, d.object.to_string()))
        .collect();
    for expected in [
        (Reason::MissingSecret, "Ingress default/verified"),
        (Reason::InsecureBackendTls, "Ingress default/skip"),
        (Reason::InvalidBackendTls, "Ingress default/bad-ca"),
        (Reason::InvalidAnnotation, "Ingress default/bad-ca"),
        (Reason::UnsupportedAppProtocol, "Service default/multi"),
    ] {
        assert!(
            found.contains(&(expected.0, expected.1.to_owned())),
            "{expected:?} in {found:?}"
        );
    }
    assert_eq!(found.len(), 5, "{found:?}");
}

#[test]
fn timeout_annotations_set_per_ingress_and_bad_ones_fall_back() {
    let (snapshot, diagnostics) = translate("timeout_annotations.yaml", &Config::default());
    let timeouts = |host: &str| {
        snapshot
            .routes
            .find(host, "/")
            .map(|m| *m.action.timeouts)
            .expect("routed")
    };
    let ms = |n| Some(Duration::from_millis(n));
    assert_eq!(
        timeouts("fast.test"),
        UpstreamTimeouts {
            connect: ms(500),
            read: ms(120_000),
            send: None,
        }
    );
    assert_eq!(
        timeouts("bare.test"),
        UpstreamTimeouts {
            connect: None,
            read: ms(30_000),
            send: None,
        }
    );
    // Still served, with the globals.
    assert_eq!(timeouts("bad.test"), UpstreamTimeouts::default());
    assert_eq!(timeouts("plain.test"), UpstreamTimeouts::default());
    // Out of range (over 1 h, over 64 GiB): the globals too, never a value that overflows a
    // deadline.
    assert_eq!(timeouts("huge.test"), UpstreamTimeouts::default());
    let huge = snapshot.routes.find("huge.test", "/").expect("routed");
    assert_eq!(huge.action.max_body_bytes, Config::default().max_body_bytes);
    let (huge, bad): (Vec<_>, Vec<_>) = diagnostics
        .iter()
        .map(|d| (d.reason, d.object.to_string(), d.message.clone()))
        .partition(|(_, object, _)| object == "Ingress default/huge");
    assert_eq!(huge.len(), 3, "{huge:?}");
    for (reason, _, message) in &huge {
        assert_eq!(*reason, Reason::InvalidAnnotation);
        assert!(
            message.contains("maximum") || message.contains("at most 64g"),
            "{message}"
        );
    }
    assert_eq!(bad.len(), 2, "{bad:?}");
    for (reason, object, _) in &bad {
        assert_eq!(*reason, Reason::InvalidAnnotation);
        assert_eq!(object, "Ingress default/bad");
    }
    assert!(bad[0].2.contains("duet.dev/proxy-connect-timeout") && bad[0].2.contains("soon"));
    assert!(bad[1].2.contains("duet.dev/proxy-read-timeout") && bad[1].2.contains("-1"));
}

/// The canary backends attached to the route of `host` `/`.
fn canaries(snapshot: &Snapshot, host: &str) -> Vec<String> {
    let matched = snapshot.routes.find(host, "/").expect("routed");
    let choice = matched.action.choice.as_deref();
    let alternatives = choice
        .map(|c| c.alternatives.as_slice())
        .unwrap_or_default();
    alternatives.iter().map(|a| a.backend.to_string()).collect()
}

#[test]
fn canaries_attach_across_namespaces_only_with_canary_scope_cluster() {
    // Default (namespace): the canary of the main Ingress's own namespace attaches, another
    // namespace's does not; the main Ingress keeps serving, the refused canary is told why.
    let (snapshot, diagnostics) = translate("canary_scope.yaml", &Config::default());
    assert_eq!(canaries(&snapshot, "web.test"), ["shop/web-canary:80"]);
    assert!(canaries(&snapshot, "pay.test").is_empty());
    assert_eq!(
        route(&snapshot, "pay.test", "/").map(|r| r.0).as_deref(),
        Some("shop/web:80")
    );
    let refused: Vec<String> = diagnostics.iter().map(ToString::to_string).collect();
    assert_eq!(
        refused,
        ["Ingress intruder/canary: ConflictingPath: canary path / matches Ingress shop/pay of another namespace; not served (--canary-scope=namespace: a canary attaches to its own namespace's Ingresses only)"]
    );
    // ingress-nginx's behaviour: both attach, nothing to say.
    let cluster = Config {
        canary_scope: "cluster".parse().unwrap(),
        ..Config::default()
    };
    let (snapshot, diagnostics) = translate("canary_scope.yaml", &cluster);
    assert_eq!(canaries(&snapshot, "web.test"), ["shop/web-canary:80"]);
    assert_eq!(canaries(&snapshot, "pay.test"), ["intruder/collect:80"]);
    assert_eq!(diagnostics, []);
}
