//! An Ingress change planned host by host (`translate::incremental`) equals the full route phase
//! over the same objects, edit after edit, and so does a change of a Service or Secret that
//! Ingresses read (planned as a change of those Ingresses); and so does the route phase split over threads by
//! groups of Ingresses sharing no host (`translate::plan_routes_in_parts`).
use controller::index::{Change, Impact, Index};
use controller::object::{Kind, ObjectKey};
use controller::source::files;
use controller::translate::incremental::{changed_ingresses, plan_ingress_change};
use controller::translate::{plan_routes, plan_routes_in_parts, Config, RoutePlan};

const SERVICES: &str = r#"
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
kind: Secret
metadata: {name: cert}
type: kubernetes.io/tls
data: {tls.crt: "", tls.key: ""}
"#;

/// An Ingress named `name` created at second `created`, with `rules` (YAML list items) and
/// an optional `extra` spec part.
fn ingress(name: &str, created: u32, rules: &[(&str, &str, &str)], extra: &str) -> String {
    let mut text = format!(
        "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {{name: {name}, creationTimestamp: \"2026-01-01T00:00:{created:02}Z\"}}\nspec:\n  ingressClassName: duet\n{extra}  rules:\n"
    );
    for (host, path, service) in rules {
        let host = if host.is_empty() {
            String::new()
        } else {
            format!("host: \"{host}\", ")
        };
        text.push_str(&format!(
            "    - {{{host}http: {{paths: [{{path: {path}, pathType: Prefix, backend: {{service: {{name: {service}, port: {{name: http}}}}}}}}]}}}}\n"
        ));
    }
    text
}

fn apply(index: &mut Index, yaml: &str) -> Impact {
    let parsed = files::parse(yaml, &[]);
    assert!(parsed.problems.is_empty(), "{:?}", parsed.problems);
    let mut impact = Impact::default();
    for object in parsed.objects {
        impact.merge(index.apply(Change::Apply { object, file: None }));
    }
    impact
}

/// The plan after a change, as the app makes it: incremental when only Ingresses, and Services
/// and Secrets only Ingresses read, changed and it applies; whether it did.
fn plan_after(index: &Index, previous: &RoutePlan, impact: &Impact) -> (RoutePlan, bool) {
    let config = Config::default();
    let mut inputs = index.inputs();
    if !impact.all_routes {
        let changed = changed_ingresses(
            previous,
            &impact.ingresses,
            &impact.services,
            &impact.secrets,
        );
        if let Some(changed) = changed.filter(|c| !c.is_empty()) {
            if let Some(plan) = plan_ingress_change(previous, &mut inputs, &config, &changed) {
                return (plan, true);
            }
        }
    }
    (plan_routes(&inputs, &config), false)
}

fn assert_same(incremental: &RoutePlan, full: &RoutePlan, step: &str) {
    assert_eq!(*incremental.table, *full.table, "{step}: table");
    assert_eq!(incremental.backends, full.backends, "{step}: backends");
    assert_eq!(
        incremental.references, full.references,
        "{step}: references"
    );
    assert_eq!(
        incremental.diagnostics, full.diagnostics,
        "{step}: diagnostics"
    );
    assert_eq!(
        incremental.annotations, full.annotations,
        "{step}: annotations"
    );
    assert_eq!(*incremental.certs, *full.certs, "{step}: certificates");
    assert_eq!(
        *incremental.footprints, *full.footprints,
        "{step}: footprints"
    );
}

#[test]
fn ingress_changes_planned_by_host_equal_a_full_route_phase() {
    let mut index = Index::new(Config::default().class);
    apply(&mut index, SERVICES);
    let start = [
        ingress("one", 1, &[("a.test", "/", "a"), ("b.test", "/", "b")], ""),
        ingress("two", 2, &[("c.test", "/", "a")], ""),
        ingress(
            "three",
            3,
            &[("d.test", "/", "b"), ("*.wild.test", "/", "a")],
            "",
        ),
        ingress("four", 4, &[("e.test", "/", "a")], "  annotations: {}\n"),
    ];
    apply(&mut index, &start.join("---\n"));
    let mut plan = plan_routes(&index.inputs(), &Config::default());
    index.set_references(plan.references.clone());
    let tls = "  tls: [{hosts: [c.test], secretName: cert}]\n";
    let default = "  defaultBackend: {service: {name: b, port: {name: http}}}\n";
    let regex =
        "metadata: {name: two, annotations: {nginx.ingress.kubernetes.io/use-regex: \"true\"}";
    let steps: Vec<(&str, String, Option<ObjectKey>, bool)> = vec![
        (
            "a path added",
            ingress(
                "one",
                1,
                &[
                    ("a.test", "/", "a"),
                    ("a.test", "/x", "b"),
                    ("b.test", "/", "b"),
                ],
                "",
            ),
            None,
            true,
        ),
        (
            "host moved between Ingresses",
            ingress("two", 2, &[("c.test", "/", "a"), ("b.test", "/", "a")], ""),
            None,
            true,
        ),
        (
            "the same path from an older Ingress wins",
            ingress("four", 0, &[("e.test", "/", "a"), ("c.test", "/", "b")], ""),
            None,
            true,
        ),
        (
            "host removed",
            ingress("one", 1, &[("a.test", "/x", "b")], ""),
            None,
            true,
        ),
        (
            "a missing Service",
            ingress(
                "three",
                3,
                &[("d.test", "/", "nope"), ("*.wild.test", "/", "a")],
                "",
            ),
            None,
            true,
        ),
        (
            "host-less rules",
            ingress(
                "three",
                3,
                &[("", "/any", "a"), ("*.wild.test", "/", "a")],
                "",
            ),
            None,
            true,
        ),
        (
            "regex paths on a shared host",
            ingress("two", 2, &[("c.test", "/(x", "a")], "").replace("metadata: {name: two", regex),
            None,
            true,
        ),
        (
            "TLS hosts",
            ingress("two", 2, &[("c.test", "/", "a")], tls),
            None,
            true,
        ),
        (
            "TLS hosts removed",
            ingress("two", 2, &[("c.test", "/", "a")], ""),
            None,
            true,
        ),
        (
            "default backend",
            ingress("one", 1, &[("a.test", "/x", "b")], default),
            None,
            true,
        ),
        (
            "default backend removed",
            ingress("one", 1, &[("a.test", "/x", "b")], ""),
            None,
            true,
        ),
        (
            "Ingress deleted",
            String::new(),
            Some(ObjectKey::new(Kind::Ingress, "default", "four")),
            true,
        ),
        (
            "not ours any more",
            ingress("three", 3, &[("d.test", "/", "b")], "")
                .replace("ingressClassName: duet", "ingressClassName: other"),
            None,
            true,
        ),
    ];
    let mut used = 0;
    for (step, yaml, delete, expect_incremental) in steps {
        let impact = match delete {
            Some(key) => index.apply(Change::Delete(key)),
            None => apply(&mut index, &yaml),
        };
        assert!(impact.routes && !impact.all_routes, "{step}: {impact:?}");
        let (next, incremental) = plan_after(&index, &plan, &impact);
        assert_eq!(incremental, expect_incremental, "{step}: incremental");
        used += usize::from(incremental);
        let full = plan_routes(&index.inputs(), &Config::default());
        assert_same(&next, &full, step);
        index.set_references(next.references.clone());
        plan = next;
    }
    assert_eq!(used, 13);
    assert!(plan.table.exact.contains_key("c.test"));
}

/// A `kubernetes.io/tls` Secret `name` with a certificate for `hosts`.
fn tls_secret(name: &str, hosts: &[&str]) -> String {
    let cert = conformance::tls::cert(hosts);
    format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: {name}}}\ntype: kubernetes.io/tls\ndata: {{tls.crt: \"{}\", tls.key: \"{}\"}}\n",
        conformance::tls::base64(cert.cert_pem.as_bytes()),
        conformance::tls::base64(cert.key_pem.as_bytes()),
    )
}

/// The Service of the table's default backend (`""`: none).
fn default_service(plan: &RoutePlan) -> String {
    plan.table
        .default_backend
        .as_ref()
        .map(|a| a.backend.service().to_string())
        .unwrap_or_default()
}

#[test]
fn tls_and_default_backend_edits_rebuild_only_the_hosts_they_touch() {
    let mut index = Index::new(Config::default().class);
    apply(&mut index, SERVICES);
    apply(&mut index, &tls_secret("ca", &["a.test", "shared.test"]));
    apply(
        &mut index,
        &tls_secret("cb", &["b.test", "shared.test", "*.wild.test"]),
    );
    let one_tls = |hosts: &str, secret: &str| {
        let extra = format!("  tls: [{{hosts: [{hosts}], secretName: {secret}}}]\n");
        ingress("one", 1, &[("a.test", "/", "a")], &extra)
    };
    let two_tls = "  tls: [{hosts: [b.test, shared.test], secretName: cb}]\n";
    let default_a = "  defaultBackend: {service: {name: a, port: {name: http}}}\n";
    let default_b = "  defaultBackend: {service: {name: b, port: {name: http}}}\n";
    let start = [
        one_tls("a.test", "ca"),
        ingress(
            "two",
            2,
            &[("b.test", "/", "b"), ("shared.test", "/", "b")],
            two_tls,
        ),
        ingress("three", 3, &[("c.test", "/", "a")], ""),
        ingress("four", 4, &[("d.test", "/", "b")], default_b),
        ingress("five", 5, &[("e.test", "/", "a")], ""),
    ];
    apply(&mut index, &start.join("---\n"));
    let mut plan = plan_routes(&index.inputs(), &Config::default());
    index.set_references(plan.references.clone());
    let source = |plan: &RoutePlan, host: &str| {
        plan.certs
            .host(host)
            .map(|c| c.source.to_string())
            .unwrap_or_default()
    };
    assert_eq!(source(&plan, "shared.test"), "default/cb");
    assert_eq!(default_service(&plan), "b");
    type Check = fn(&RoutePlan) -> bool;
    // Each step: its name, the Ingress written, whether it is planned by host, the hosts whose
    // entries it must not rebuild, and what a user sees after it.
    let steps: Vec<(&str, String, bool, &[&str], Check)> = vec![
        (
            "an older Ingress lists a host in its TLS: its certificate wins there",
            one_tls("a.test, shared.test", "ca"),
            true,
            &["c.test", "d.test", "e.test"],
            |p| p.certs.host("shared.test").unwrap().source.as_ref() == "default/ca",
        ),
        (
            "the host left its TLS: the younger Ingress's certificate again",
            one_tls("a.test", "ca"),
            true,
            &["c.test", "d.test", "e.test"],
            |p| p.certs.host("shared.test").unwrap().source.as_ref() == "default/cb",
        ),
        (
            "a missing Secret: the host has no certificate of its own",
            one_tls("a.test", "nope"),
            true,
            &["b.test", "shared.test", "c.test", "d.test", "e.test"],
            |p| p.certs.host("a.test").is_none() && p.certs.host("shared.test").is_some(),
        ),
        (
            "a TLS-only wildcard host",
            ingress(
                "five",
                5,
                &[("e.test", "/", "a")],
                "  tls: [{hosts: [\"*.wild.test\"], secretName: cb}]\n",
            ),
            true,
            &["a.test", "b.test", "shared.test", "c.test", "d.test"],
            |p| p.certs.host("*.wild.test").is_some() && p.certs.host("a.test").is_none(),
        ),
        (
            "TLS removed",
            ingress("one", 1, &[("a.test", "/", "a")], ""),
            true,
            &["b.test", "shared.test", "c.test", "d.test", "e.test"],
            |p| {
                p.certs.host("a.test").is_none()
                    && !p.table.exact["a.test"].rules[0].action.redirect_https
            },
        ),
        (
            "an older default backend wins",
            ingress("three", 3, &[("c.test", "/", "a")], default_a),
            true,
            &["a.test", "b.test", "shared.test", "e.test"],
            |p| default_service(p) == "a",
        ),
        (
            "the default backend given up: the younger one's again",
            ingress("three", 3, &[("c.test", "/", "a")], ""),
            true,
            &["a.test", "b.test", "shared.test", "e.test"],
            |p| default_service(p) == "b",
        ),
        (
            "a TLS host that is no host name: the full route phase",
            ingress(
                "five",
                5,
                &[("e.test", "/", "a")],
                "  tls: [{hosts: [\"bad host\"], secretName: cb}]\n",
            ),
            false,
            &[],
            |p| p.certs.host("*.wild.test").is_none(),
        ),
    ];
    for (step, yaml, expect_incremental, untouched, check) in steps {
        let impact = apply(&mut index, &yaml);
        assert!(impact.routes && !impact.all_routes, "{step}: {impact:?}");
        let (next, incremental) = plan_after(&index, &plan, &impact);
        assert_eq!(incremental, expect_incremental, "{step}: incremental");
        let full = plan_routes(&index.inputs(), &Config::default());
        assert_same(&next, &full, step);
        for host in untouched {
            assert!(
                next.table.exact[*host].same(&plan.table.exact[*host]),
                "{step}: {host} rebuilt"
            );
        }
        assert!(check(&next), "{step}: {:?}", next.certs);
        index.set_references(next.references.clone());
        plan = next;
    }
}

/// A Service `name` with one port (`http` unless `port_name` says otherwise) and `extra` spec.
fn service(name: &str, port_name: &str, port: u16, extra: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}}}\nspec: {{ports: [{{name: {port_name}, port: {port}}}]{extra}}}\n"
    )
}

#[test]
fn service_and_secret_changes_rebuild_only_the_hosts_of_the_ingresses_reading_them() {
    let mut index = Index::new(Config::default().class);
    apply(&mut index, SERVICES);
    apply(&mut index, &tls_secret("ct", &["c.test"]));
    apply(
        &mut index,
        &service("up", "http", 80, ", clusterIP: 10.96.0.1"),
    );
    let upstream = ingress("six", 6, &[("f.test", "/", "up")], "").replace(
        "metadata: {name: six",
        "metadata: {name: six, annotations: {nginx.ingress.kubernetes.io/service-upstream: \"true\"}",
    );
    let start = [
        ingress("one", 1, &[("a.test", "/", "a")], ""),
        ingress("two", 2, &[("b.test", "/", "b")], ""),
        ingress(
            "three",
            3,
            &[("c.test", "/", "a")],
            "  tls: [{hosts: [c.test], secretName: ct}]\n",
        ),
        ingress("four", 4, &[("d.test", "/", "b")], ""),
        ingress("five", 5, &[("e.test", "/", "c")], ""),
        upstream,
    ];
    apply(&mut index, &start.join("---\n"));
    let mut plan = plan_routes(&index.inputs(), &Config::default());
    index.set_references(plan.references.clone());
    let spec = |p: &RoutePlan, service: &str| {
        p.backends
            .values()
            .find(|s| s.service.name == service)
            .cloned()
    };
    let reported =
        |p: &RoutePlan, text: &str| p.diagnostics.iter().any(|d| d.message.contains(text));
    type Check = Box<dyn Fn(&RoutePlan) -> bool>;
    let delete = |name: &str| Some(ObjectKey::new(Kind::Service, "default", name));
    let delete_secret = Some(ObjectKey::new(Kind::Secret, "default", "ct"));
    // Each step: its name, the object written (or deleted), whether it is planned by host, the
    // hosts whose entries it must not rebuild, and what a user sees after it.
    type Step = (
        &'static str,
        String,
        Option<ObjectKey>,
        bool,
        &'static [&'static str],
        Check,
    );
    let steps: Vec<Step> = vec![
        (
            "a Service's port renumbered",
            service("b", "http", 81, ""),
            None,
            true,
            &["a.test", "c.test", "e.test", "f.test"],
            Box::new(move |p| spec(p, "b").is_some_and(|s| s.port == 81)),
        ),
        (
            "the port renamed: the routes naming it lose their backend",
            service("b", "web", 81, ""),
            None,
            true,
            &["a.test", "c.test", "e.test", "f.test"],
            Box::new(move |p| spec(p, "b").is_none() && reported(p, "has no port")),
        ),
        (
            "a missing Service created",
            service("c", "http", 80, ""),
            None,
            true,
            &["a.test", "b.test", "c.test", "d.test", "f.test"],
            Box::new(move |p| spec(p, "c").is_some()),
        ),
        (
            "a Service deleted",
            String::new(),
            delete("a"),
            true,
            &["b.test", "d.test", "e.test", "f.test"],
            Box::new(move |p| {
                spec(p, "a").is_none() && reported(p, "Service default/a does not exist")
            }),
        ),
        (
            "service-upstream: the cluster IPs changed",
            service(
                "up",
                "http",
                80,
                ", clusterIPs: [10.96.0.2, \"fd00:96::2\"]",
            ),
            None,
            true,
            &["b.test", "d.test", "e.test"],
            Box::new(move |p| {
                let ips = spec(p, "up")
                    .map(|s| s.cluster_ips.clone())
                    .unwrap_or_default();
                ips.len() == 2 && ips[1].is_ipv6()
            }),
        ),
        (
            "a Service turned ExternalName",
            service(
                "c",
                "http",
                80,
                ", type: ExternalName, externalName: backend.example",
            ),
            None,
            true,
            &["b.test", "d.test", "f.test"],
            Box::new(move |p| spec(p, "c").is_some_and(|s| s.external_name.is_some())),
        ),
        (
            "the TLS Secret renewed",
            tls_secret("ct", &["c.test", "www.c.test"]),
            None,
            true,
            &["b.test", "d.test", "e.test", "f.test"],
            Box::new(|p| p.certs.host("c.test").is_some()),
        ),
        (
            "the TLS Secret deleted",
            String::new(),
            delete_secret,
            true,
            &["b.test", "d.test", "e.test", "f.test"],
            Box::new(|p| p.certs.host("c.test").is_none()),
        ),
    ];
    for (step, yaml, delete, expect_incremental, untouched, check) in steps {
        let impact = match delete {
            Some(key) => index.apply(Change::Delete(key)),
            None => apply(&mut index, &yaml),
        };
        assert!(
            impact.routes && !impact.all_routes && impact.ingresses.is_empty(),
            "{step}: {impact:?}"
        );
        let (next, incremental) = plan_after(&index, &plan, &impact);
        assert_eq!(incremental, expect_incremental, "{step}: incremental");
        let full = plan_routes(&index.inputs(), &Config::default());
        assert_same(&next, &full, step);
        for host in untouched {
            // A host without a route (its only Service missing) has no entry before or after.
            let (now, before) = (next.table.exact.get(*host), plan.table.exact.get(*host));
            assert!(
                match (now, before) {
                    (Some(now), Some(before)) => now.same(before),
                    (now, before) => now.is_none() && before.is_none(),
                },
                "{step}: {host} rebuilt"
            );
        }
        assert!(check(&next), "{step}: {:?}", next.backends);
        index.set_references(next.references.clone());
        plan = next;
    }
    // Writes of what no route reads, or of nothing translation reads, plan nothing.
    assert!(apply(&mut index, &tls_secret("cert", &["x.test"])).is_empty());
    let labelled = service("b", "web", 81, "").replace("{name: b}", "{name: b, labels: {team: x}}");
    assert!(apply(&mut index, &labelled).is_empty());
}

#[test]
fn a_secret_or_service_read_outside_ingresses_runs_the_full_route_phase() {
    let mut index = Index::new(Config::default().class);
    apply(&mut index, SERVICES);
    apply(&mut index, &tls_secret("ct", &["c.test"]));
    apply(
        &mut index,
        &ingress(
            "one",
            1,
            &[("c.test", "/", "a")],
            "  tls: [{hosts: [c.test], secretName: ct}]\n",
        ),
    );
    let config = Config {
        default_tls_secret: Some(controller::object::NsName::new("default", "ct")),
        ..Config::default()
    };
    let plan = plan_routes(&index.inputs(), &config);
    let none = Default::default();
    let names = |name: &str| [controller::object::NsName::new("default", name)].into();
    // The default TLS Secret is read outside any Ingress (the certificate for unknown SNI).
    assert_eq!(changed_ingresses(&plan, &none, &none, &names("ct")), None);
    // Service a is read by Ingress one only.
    assert_eq!(
        changed_ingresses(&plan, &none, &names("a"), &none),
        Some(names("one"))
    );
    // Nothing reads Service b: the references and the footprints would disagree.
    assert_eq!(changed_ingresses(&plan, &none, &names("b"), &none), None);
}

/// A Service whose port's `appProtocol` duet does not know (a diagnostic of the Service).
const ODD_SERVICE: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: odd}
spec: {ports: [{name: http, port: 80, appProtocol: carrier-pigeon}]}
"#;

/// An Ingress `name`, created at second `created`, with `annotations` (a flow mapping's
/// entries), `spec` extra lines and `rules` (host, path, Service).
fn annotated_ingress(
    name: &str,
    created: u32,
    annotations: &str,
    extra: &str,
    rules: &[(&str, &str, &str)],
) -> String {
    // Paths quoted (a regex's `[`); the creation time in minutes and seconds.
    let quoted: Vec<(&str, String, &str)> = rules
        .iter()
        .map(|(host, path, service)| (*host, format!("\"{path}\""), *service))
        .collect();
    let rules: Vec<(&str, &str, &str)> = quoted
        .iter()
        .map(|(h, p, s)| (*h, p.as_str(), *s))
        .collect();
    let (minutes, seconds) = (created / 60, created % 60);
    ingress(name, 0, &rules, extra).replacen(
        "creationTimestamp: \"2026-01-01T00:00:00Z\"}",
        &format!("creationTimestamp: \"2026-01-01T00:{minutes:02}:{seconds:02}Z\", annotations: {{{annotations}}}}}"),
        1,
    )
}

#[test]
fn a_route_phase_split_over_threads_equals_one_on_one_thread() {
    let mut docs = vec![
        SERVICES.to_owned(),
        ODD_SERVICE.to_owned(),
        tls_secret("shared-cert", &["shared.test", "www.shared.test"]),
        tls_secret("other-cert", &["shared.test"]),
    ];
    // Many independent hosts, created newest-name-first so that age and name orders differ.
    for i in 0..40u32 {
        let service = if i % 3 == 0 { "b" } else { "a" };
        docs.push(annotated_ingress(
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
    docs.push(annotated_ingress(
        "shared-new",
        50,
        "",
        "  tls: [{hosts: [shared.test], secretName: other-cert}]\n",
        &[("shared.test", "/", "b"), ("shared.test", "/new", "b")],
    ));
    docs.push(annotated_ingress(
        "shared-old",
        10,
        "",
        "  tls: [{hosts: [shared.test, www.shared.test], secretName: shared-cert}]\n",
        &[("shared.test", "/", "a")],
    ));
    docs.push(annotated_ingress(
        "canary",
        60,
        "nginx.ingress.kubernetes.io/canary: \"true\", nginx.ingress.kubernetes.io/canary-weight: \"30\"",
        "",
        &[("shared.test", "/", "b")],
    ));
    docs.push(annotated_ingress(
        "www",
        70,
        "nginx.ingress.kubernetes.io/from-to-www-redirect: \"true\"",
        "",
        &[("www-only.test", "/", "a")],
    ));
    docs.push(annotated_ingress(
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
        docs.push(annotated_ingress(
            name,
            created,
            "",
            "  defaultBackend: {service: {name: a, port: {name: http}}}\n",
            &[(&format!("{name}.test"), "/", "a")],
        ));
    }
    docs.push(annotated_ingress(
        "anyhost-1",
        100,
        "",
        "",
        &[("", "/one", "a")],
    ));
    docs.push(annotated_ingress(
        "anyhost-2",
        101,
        "",
        "",
        &[("", "/one", "b"), ("", "/two", "b")],
    ));
    docs.push(annotated_ingress(
        "wild",
        102,
        "",
        "",
        &[("*.wild.test", "/", "a")],
    ));
    docs.push(annotated_ingress(
        "no-secret",
        103,
        "",
        "  tls: [{hosts: [nosecret.test], secretName: gone}]\n",
        &[("nosecret.test", "/", "a")],
    ));
    docs.push(annotated_ingress(
        "no-service",
        104,
        "",
        "",
        &[("nosvc.test", "/", "missing")],
    ));
    docs.push(annotated_ingress(
        "odd-1",
        105,
        "",
        "",
        &[("odd1.test", "/", "odd")],
    ));
    docs.push(annotated_ingress(
        "odd-2",
        106,
        "",
        "",
        &[("odd2.test", "/", "odd")],
    ));
    docs.push(annotated_ingress(
        "alias",
        107,
        "nginx.ingress.kubernetes.io/server-alias: other.test",
        "",
        &[("alias.test", "/", "a")],
    ));
    docs.push(annotated_ingress(
        "regex",
        108,
        "nginx.ingress.kubernetes.io/use-regex: \"true\"",
        "",
        &[("regex.test", "/ok", "a"), ("regex.test", "/bad[", "a")],
    ));
    docs.push(annotated_ingress(
        "bad-host",
        109,
        "",
        "",
        &[("bad host", "/", "a"), ("good.test", "/", "a")],
    ));
    let mut index = Index::new(Config::default().class);
    for doc in &docs {
        apply(&mut index, doc);
    }
    let config = Config {
        default_tls_secret: Some(controller::object::NsName::new("default", "shared-cert")),
        ..Config::default()
    };
    let inputs = index.inputs();
    // Every Ingress oldest first on one thread.
    let one = plan_routes_in_parts(&inputs, &config, 1, usize::MAX);
    assert!(one.table.exact.len() > 40, "the fixture's hosts are served");
    assert!(!one.diagnostics.is_empty() && !one.annotations.is_empty());
    for parts in [1, 2, 3, 7] {
        let split = plan_routes_in_parts(&inputs, &config, parts, 1);
        assert_same(&split, &one, &format!("{parts} parts"));
    }
}
