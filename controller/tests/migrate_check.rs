//! `duet migrate check` over a corpus of real-world-shaped manifests (Argo CD, oauth2-proxy,
//! cert-manager's HTTP-01 solver, Grafana on a sub-path, an Argo Rollouts canary pair, a homelab
//! app with snippets): every annotation's exact status, the class filter, the summary, and the
//! exit codes (0 all honoured, 1 something is not, 64 bad input).

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

const DUET: &str = env!("CARGO_BIN_EXE_duet");

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/migrate")
}

fn check(args: &[&str], stdin: Option<&str>) -> Output {
    let mut child = Command::new(DUET)
        .arg("migrate")
        .arg("check")
        .args(args)
        .current_dir(fixtures())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("duet runs");
    let mut input = child.stdin.take().expect("stdin");
    input
        .write_all(stdin.unwrap_or_default().as_bytes())
        .expect("stdin written");
    drop(input);
    child.wait_with_output().expect("duet ends")
}

/// `Ingress ns/name` -> key -> status, from the report's tables.
fn statuses(stdout: &str) -> BTreeMap<String, BTreeMap<String, String>> {
    let mut all: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    let mut current = None;
    for line in stdout.lines() {
        if let Some(name) = line.strip_prefix("Ingress ") {
            current = Some(name.to_owned());
            all.entry(name.to_owned()).or_default();
        } else if let (Some(ingress), Some(row)) = (&current, line.strip_prefix("  ")) {
            let mut cells = row.split_whitespace();
            let (Some(key), Some(status)) = (cells.next(), cells.next()) else {
                continue;
            };
            if key != "KEY" && !key.starts_with('(') {
                all.get_mut(ingress)
                    .unwrap()
                    .insert(key.to_owned(), status.to_owned());
            }
        }
    }
    all
}

const N: &str = "nginx.ingress.kubernetes.io/";

fn expected() -> BTreeMap<String, BTreeMap<String, String>> {
    let table: &[(&str, &[(&str, &str)])] = &[
        (
            "argocd/argocd-server-ingress",
            &[
                ("backend-protocol", "honoured-with-difference"),
                ("force-ssl-redirect", "honoured-with-difference"),
                ("ssl-passthrough", "ignored-unsupported"),
            ],
        ),
        (
            "home/wiki",
            &[
                ("configuration-snippet", "ignored-unsupported"),
                ("enable-websockets", "ignored-unknown"),
                ("secure-backends", "ignored-removed-upstream"),
                ("server-snippet", "ignored-unsupported"),
                (
                    "nignx.ingress.kubernetes.io/force-ssl-redirect",
                    "ignored-unknown",
                ),
            ],
        ),
        (
            "monitoring/grafana",
            &[
                ("proxy-body-szie", "ignored-unknown"),
                ("proxy-read-timeout", "invalid-value"),
                ("proxy-send-timeout", "honoured-with-difference"),
                ("rewrite-target", "honoured-with-difference"),
                ("use-regex", "honoured-with-difference"),
            ],
        ),
        (
            "shop/cm-acme-http-solver-x7k2p",
            &[
                ("ssl-redirect", "honoured-with-difference"),
                ("whitelist-source-range", "honoured-with-difference"),
            ],
        ),
        (
            "default/mtls-api",
            &[
                ("auth-tls-error-page", "honoured"),
                ("auth-tls-pass-certificate-to-upstream", "honoured"),
                ("auth-tls-secret", "honoured-with-difference"),
                ("auth-tls-verify-client", "honoured"),
                ("auth-tls-verify-depth", "honoured"),
            ],
        ),
        (
            "default/uploads",
            &[
                ("proxy-body-size", "honoured"),
                ("proxy-buffering", "ignored-unsupported"),
                ("proxy-request-buffering", "honoured"),
            ],
        ),
        ("shop/web", &[("proxy-connect-timeout", "honoured")]),
        (
            "shop/web-web-canary",
            &[
                ("canary", "honoured"),
                ("canary-by-header", "honoured"),
                ("canary-weight", "honoured"),
            ],
        ),
        (
            "tools/dashboard",
            &[
                ("auth-response-headers", "honoured"),
                ("auth-signin", "honoured-with-difference"),
                ("auth-url", "honoured-with-difference"),
                ("proxy-buffer-size", "honoured-with-difference"),
            ],
        ),
        ("tools/oauth2-proxy", &[("proxy-body-size", "honoured")]),
        (
            "web/site",
            &[
                ("rewrite-target", "invalid-value"),
                ("use-regex", "invalid-value"),
                ("x-forwarded-prefix", "honoured"),
            ],
        ),
    ];
    table
        .iter()
        .map(|(ingress, keys)| {
            let keys = keys
                .iter()
                .map(|(k, s)| {
                    let key = if k.contains('/') {
                        (*k).to_owned()
                    } else {
                        format!("{N}{k}")
                    };
                    (key, (*s).to_owned())
                })
                .collect();
            ((*ingress).to_owned(), keys)
        })
        .collect()
}

#[test]
fn the_corpus_reports_every_key_and_exits_1() {
    let out = check(&["--ingress-class", "nginx", "corpus"], None);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(statuses(&stdout), expected(), "{stdout}");
    assert!(
        stdout.contains("did you mean nginx.ingress.kubernetes.io/proxy-body-size?"),
        "{stdout}"
    );
    assert!(
        stdout.contains("\"3600s\" is not a whole number of seconds"),
        "{stdout}"
    );
    assert!(
        stdout.contains("path \"/site/((?!admin).*)\" is not a regex duet can compile"),
        "{stdout}"
    );
    let summary = stdout.lines().last().unwrap_or_default();
    assert_eq!(
        summary,
        "Summary: 11 Ingresses checked (1 of another class than nginx skipped), 6 fully honoured; \
         35 annotations: 13 honoured, 11 honoured-with-difference, 4 ignored-unsupported, \
         3 ignored-unknown, 1 ignored-removed-upstream, 3 invalid-value"
    );
}

#[test]
fn ssl_passthrough_needs_the_flag_as_in_ingress_nginx() {
    let key = format!("{N}ssl-passthrough");
    let without = check(&["corpus/argocd.yaml"], None);
    let stdout = String::from_utf8_lossy(&without.stdout);
    assert_eq!(without.status.code(), Some(1), "{stdout}");
    assert_eq!(
        statuses(&stdout)["argocd/argocd-server-ingress"][&key],
        "ignored-unsupported"
    );
    assert!(
        stdout.contains("no effect without duet's --enable-ssl-passthrough"),
        "{stdout}"
    );
    let with = check(&["--enable-ssl-passthrough", "corpus/argocd.yaml"], None);
    let stdout = String::from_utf8_lossy(&with.stdout);
    let got = statuses(&stdout);
    assert_eq!(
        got["argocd/argocd-server-ingress"][&key], "honoured-with-difference",
        "{stdout}"
    );
    assert!(
        stdout.contains("not applied to the HTTPS connections relayed by ssl-passthrough"),
        "{stdout}"
    );
    assert_eq!(with.status.code(), Some(0), "{stdout}");
}

/// A canary Ingress whose main Ingress is another namespace's.
const CROSS_NAMESPACE_CANARY: &str = r#"
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: pay, namespace: shop}
spec:
  rules:
    - host: pay.test
      http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: pay, port: {number: 80}}}}]}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: canary
  namespace: intruder
  annotations: {nginx.ingress.kubernetes.io/canary: "true", nginx.ingress.kubernetes.io/canary-weight: "100"}
spec:
  rules:
    - host: pay.test
      http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: collect, port: {number: 80}}}}]}
"#;

#[test]
fn canaries_of_another_namespace_are_reported_by_canary_scope() {
    let key = format!("{N}canary");
    let out = check(&["-"], Some(CROSS_NAMESPACE_CANARY));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert_eq!(
        statuses(&stdout)["intruder/canary"][&key],
        "ignored-unsupported"
    );
    assert!(
        stdout.contains("not attached to pay.test/ of Ingress shop/pay: another namespace's"),
        "{stdout}"
    );
    let out = check(
        &["--canary-scope", "cluster", "-"],
        Some(CROSS_NAMESPACE_CANARY),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert_eq!(statuses(&stdout)["intruder/canary"][&key], "honoured");
    assert!(
        stdout.contains("attaches across namespaces to pay.test/ of Ingress shop/pay"),
        "{stdout}"
    );
}

#[test]
fn without_a_class_every_ingress_is_checked() {
    let out = check(&["corpus"], None);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1));
    let got = statuses(&stdout);
    assert_eq!(got.len(), 12, "{stdout}");
    assert_eq!(
        got["home/legacy"][&format!("{N}rewrite-target")],
        "honoured-with-difference"
    );
}

#[test]
fn all_honoured_exits_0_from_a_file_and_from_stdin() {
    let out = check(&["clean/honoured.yaml"], None);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    let got = statuses(&stdout);
    assert_eq!(got["shop/uploads"].len(), 4, "{stdout}");
    assert!(
        got["shop/uploads"]
            .values()
            .all(|s| s.starts_with("honoured")),
        "{stdout}"
    );

    let text = std::fs::read_to_string(fixtures().join("clean/honoured.yaml")).unwrap();
    let piped = check(&["-"], Some(&text));
    assert_eq!(piped.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&piped.stdout), stdout);

    let grafana = std::fs::read_to_string(fixtures().join("corpus/grafana.yaml")).unwrap();
    assert_eq!(check(&["-"], Some(&grafana)).status.code(), Some(1));
}

#[test]
fn bad_input_exits_64_with_one_line() {
    for (args, want) in [
        (&["broken.yaml"][..], "duet: broken.yaml: not valid YAML ("),
        (&["missing-dir"][..], "duet: cannot read missing-dir: "),
        (&[][..], "duet: "),
    ] {
        let out = check(args, None);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {stderr}");
        let lines: Vec<&str> = stderr.lines().collect();
        assert_eq!(lines.len(), 1, "{args:?}: {stderr}");
        assert!(lines[0].starts_with(want), "{args:?}: {stderr}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }
    let bad_ingress = "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {name: x, namespace: shop}\nspec: {rules: 7}\n";
    let out = check(&["-"], Some(bad_ingress));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{stderr}");
    assert!(
        stderr.starts_with("duet: -: Ingress shop/x: invalid Ingress: "),
        "{stderr}"
    );
}

#[test]
fn auth_urls_on_addresses_refused_by_default_are_reported() {
    let ingress = |name: &str, url: &str| {
        format!(
            "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata:\n  name: {name}\n  namespace: shop\n  annotations:\n    {N}auth-url: \"{url}\"\nspec: {{rules: [{{host: {name}.test}}]}}\n---\n"
        )
    };
    let text = [
        ingress("v4", "http://127.0.0.1:4180/oauth2/auth"),
        ingress("v6", "http://[::1]:4180/oauth2/auth"),
        ingress("metadata", "http://169.254.169.254/latest"),
        ingress("mapped", "http://[::ffff:127.0.0.1]/auth"),
        ingress("service", "http://oauth2-proxy.auth.svc:4180/oauth2/auth"),
        ingress("pod", "http://[fd00::7]:4180/oauth2/auth"),
    ]
    .concat();
    let out = check(&["-"], Some(&text));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    let got = statuses(&stdout);
    let key = format!("{N}auth-url");
    for (name, want) in [
        ("v4", "ignored-unsupported"),
        ("v6", "ignored-unsupported"),
        ("metadata", "ignored-unsupported"),
        ("mapped", "ignored-unsupported"),
        ("service", "honoured-with-difference"),
        ("pod", "honoured-with-difference"),
    ] {
        assert_eq!(got[&format!("shop/{name}")][&key], want, "{name}: {stdout}");
    }
    assert!(
        stdout.contains("unless --auth-allowed-destinations lists it"),
        "{stdout}"
    );
}
