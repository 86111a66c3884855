//! The route phase split over threads by groups of Ingresses sharing no host
//! (`translate::plan_routes_in_parts`) makes the same plan as on one thread: same routes in the
//! same order, certificates, backends, references, diagnostics, annotation reports, footprints.
use controller::index::{Change, Index};
use controller::source::files;
use controller::translate::{plan_routes_in_parts, Config, RoutePlan};

fn tls_secret(name: &str, hosts: &[&str]) -> String {
    let cert = conformance::tls::cert(hosts);
    format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: {name}}}\ntype: kubernetes.io/tls\ndata: {{tls.crt: \"{}\", tls.key: \"{}\"}}\n",
        conformance::tls::base64(cert.cert_pem.as_bytes()),
        conformance::tls::base64(cert.key_pem.as_bytes()),
    )
}

const BASE: &str = r#"
apiVersion: networking.k8s.io/v1
kind: IngressClass
metadata: {name: duet}
spec: {controller: duet.dev/ingress-controller}
---
apiVersion: v1
kind: Service
metadata: {name: a}
spec: {ports: [{name: http, port: 80}]}
---
apiVersion: v1
kind: Service
metadata: {name: b}
spec: {ports: [{name: http, port: 80}]}
---
apiVersion: v1
kind: Service
metadata: {name: odd}
spec: {ports: [{name: http, port: 80, appProtocol: carrier-pigeon}]}
"#;

/// An Ingress `name`, created at second `created`, with `annotations` (a flow mapping's
/// entries), `spec` extra lines and `rules` (host, path, Service).
fn ingress(
    name: &str,
    created: u32,
    annotations: &str,
    extra: &str,
    rules: &[(&str, &str, &str)],
) -> String {
    let mut text = format!(
        "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {{name: {name}, creationTimestamp: \"2026-01-01T00:{:02}:{:02}Z\", annotations: {{{annotations}}}}}\nspec:\n  ingressClassName: duet\n{extra}  rules:\n",
        created / 60,
        created % 60
    );
    for (host, path, service) in rules {
        let host = if host.is_empty() {
            String::new()
        } else {
            format!("host: \"{host}\", ")
        };
        text.push_str(&format!(
            "    - {{{host}http: {{paths: [{{path: \"{path}\", pathType: Prefix, backend: {{service: {{name: {service}, port: {{name: http}}}}}}}}]}}}}\n"
        ));
    }
    text
}

fn index_of(yaml: &[String]) -> Index {
    let mut index = Index::new(Config::default().class);
    for doc in yaml {
        let parsed = files::parse(doc, &[]);
        assert!(parsed.problems.is_empty(), "{:?}", parsed.problems);
        for object in parsed.objects {
            index.apply(Change::Apply { object, file: None });
        }
    }
    index
}

fn assert_same(split: &RoutePlan, one: &RoutePlan, step: &str) {
    assert_eq!(*split.table, *one.table, "{step}: table");
    assert_eq!(split.backends, one.backends, "{step}: backends");
    assert_eq!(split.references, one.references, "{step}: references");
    assert_eq!(split.diagnostics, one.diagnostics, "{step}: diagnostics");
    assert_eq!(split.annotations, one.annotations, "{step}: annotations");
    assert_eq!(*split.certs, *one.certs, "{step}: certificates");
    assert_eq!(*split.footprints, *one.footprints, "{step}: footprints");
}

#[test]
fn a_route_phase_split_over_threads_equals_one_on_one_thread() {
    let mut docs = vec![
        BASE.to_owned(),
        tls_secret("shared-cert", &["shared.test", "www.shared.test"]),
        tls_secret("other-cert", &["shared.test"]),
    ];
    // Many independent hosts, created newest-name-first so that age and name orders differ.
    for i in 0..40u32 {
        let service = if i % 3 == 0 { "b" } else { "a" };
        docs.push(ingress(
            &format!("app-{i}"),
            200 - i,
            "",
            "",
            &[
                (&format!("app-{i}.test"), "/api", service),
                (&format!("app-{i}.test"), "/", "a"),
            ],
        ));
    }
    // Hosts shared across Ingresses: conflicting paths (the older wins), TLS of the same host
    // from two Secrets (the older wins), a canary and its main Ingress, a `www.` twin.
    docs.push(ingress(
        "shared-new",
        50,
        "",
        "  tls: [{hosts: [shared.test], secretName: other-cert}]\n",
        &[("shared.test", "/", "b"), ("shared.test", "/new", "b")],
    ));
    docs.push(ingress(
        "shared-old",
        10,
        "",
        "  tls: [{hosts: [shared.test, www.shared.test], secretName: shared-cert}]\n",
        &[("shared.test", "/", "a")],
    ));
    docs.push(ingress(
        "canary",
        60,
        "nginx.ingress.kubernetes.io/canary: \"true\", nginx.ingress.kubernetes.io/canary-weight: \"30\"",
        "",
        &[("shared.test", "/", "b")],
    ));
    docs.push(ingress(
        "www",
        70,
        "nginx.ingress.kubernetes.io/from-to-www-redirect: \"true\"",
        "",
        &[("www-only.test", "/", "a")],
    ));
    docs.push(ingress(
        "www-twin",
        71,
        "",
        "",
        &[("www.www-only.test", "/x", "b")],
    ));
    // Default backends on unrelated hosts (the oldest wins), host-less and wildcard rules,
    // a missing Secret, a missing Service, an unknown appProtocol used from two groups, an
    // unsupported annotation, a regex host whose path does not compile, an invalid host.
    for (name, created) in [("default-new", 90), ("default-old", 80)] {
        docs.push(ingress(
            name,
            created,
            "",
            "  defaultBackend: {service: {name: a, port: {name: http}}}\n",
            &[(&format!("{name}.test"), "/", "a")],
        ));
    }
    docs.push(ingress("anyhost-1", 100, "", "", &[("", "/one", "a")]));
    docs.push(ingress(
        "anyhost-2",
        101,
        "",
        "",
        &[("", "/one", "b"), ("", "/two", "b")],
    ));
    docs.push(ingress("wild", 102, "", "", &[("*.wild.test", "/", "a")]));
    docs.push(ingress(
        "no-secret",
        103,
        "",
        "  tls: [{hosts: [nosecret.test], secretName: gone}]\n",
        &[("nosecret.test", "/", "a")],
    ));
    docs.push(ingress(
        "no-service",
        104,
        "",
        "",
        &[("nosvc.test", "/", "missing")],
    ));
    docs.push(ingress("odd-1", 105, "", "", &[("odd1.test", "/", "odd")]));
    docs.push(ingress("odd-2", 106, "", "", &[("odd2.test", "/", "odd")]));
    docs.push(ingress(
        "alias",
        107,
        "nginx.ingress.kubernetes.io/server-alias: other.test",
        "",
        &[("alias.test", "/", "a")],
    ));
    docs.push(ingress(
        "regex",
        108,
        "nginx.ingress.kubernetes.io/use-regex: \"true\"",
        "",
        &[("regex.test", "/ok", "a"), ("regex.test", "/bad[", "a")],
    ));
    docs.push(ingress(
        "bad-host",
        109,
        "",
        "",
        &[("bad host", "/", "a"), ("good.test", "/", "a")],
    ));
    let index = index_of(&docs);
    let config = Config {
        default_tls_secret: Some(controller::object::NsName::new("default", "shared-cert")),
        ..Config::default()
    };
    let inputs = index.inputs();
    let one = plan_routes_in_parts(&inputs, &config, 1, 1);
    assert!(one.table.exact.len() > 40, "the fixture's hosts are served");
    assert!(!one.diagnostics.is_empty() && !one.annotations.is_empty());
    for parts in [2, 3, 7] {
        let split = plan_routes_in_parts(&inputs, &config, parts, 1);
        assert_same(&split, &one, &format!("{parts} parts"));
    }
}
