//! Unit tests of the ingress-nginx catalogue and the per-key classification.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use super::*;

fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn nginx(pairs: &[(&str, &str)]) -> Read {
    let full: Vec<(String, &str)> = pairs
        .iter()
        .map(|(k, v)| (format!("{PREFIX}{k}"), *v))
        .collect();
    let refs: Vec<(&str, &str)> = full.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    read(&annotations(&refs))
}

fn status_of(read: &Read, name: &str) -> (Status, String) {
    let key = format!("{PREFIX}{name}");
    let f = read
        .findings
        .iter()
        .find(|f| f.key == key || f.key == name)
        .unwrap_or_else(|| panic!("no finding for {name}: {:?}", read.findings));
    (f.status, f.detail.clone())
}

#[test]
fn the_catalogue_holds_ingress_nginx_keys_once_each() {
    let names: BTreeSet<&str> = KEYS.iter().map(|k| k.name).collect();
    assert_eq!(names.len(), 137, "duplicates in KEYS");
    for (alias, canonical) in ALIASES {
        assert!(names.contains(canonical), "{alias} -> {canonical}");
        assert!(!names.contains(alias));
    }
    for (removed, _) in REMOVED.iter().chain(CONFIGMAP_ONLY.iter()) {
        assert!(
            !names.contains(removed),
            "{removed} is both current and removed"
        );
    }
    // Spot checks against ingress-nginx's annotations-risk.md.
    for name in [
        "rewrite-target",
        "session-cookie-partitioned",
        "proxy-busy-buffers-size",
        "relative-redirects",
        "modsecurity-snippet",
        "stream-snippet",
        "x-forwarded-prefix",
    ] {
        assert!(names.contains(name), "{name}");
    }
}

#[test]
fn every_honoured_key_has_a_parser() {
    let valid = |name: &str| match name {
        "proxy-body-size" => "8k",
        "proxy-connect-timeout" | "proxy-read-timeout" | "proxy-send-timeout" => "30",
        "backend-protocol" => "GRPCS",
        "permanent-redirect" | "temporal-redirect" => "https://example.com/",
        "permanent-redirect-code" | "temporal-redirect-code" => "307",
        "app-root" => "/app",
        "allowlist-source-range" | "denylist-source-range" => "10.0.0.0/8, 2001:db8::/32",
        "rewrite-target" => "/$2",
        "x-forwarded-prefix" => "/app",
        "auth-type" => "basic",
        "auth-secret" => "users",
        "auth-secret-type" => "auth-map",
        "auth-realm" => "Staff only",
        "auth-url" => "http://[fd00::1]:9000/auth",
        "auth-method" => "POST",
        "auth-signin" => "https://$host/start?rd=$escaped_request_uri",
        "auth-signin-redirect-param" => "next",
        "auth-response-headers" => "X-Auth-Request-User",
        "auth-request-redirect" => "/back",
        "limit-rps" | "limit-rpm" | "limit-connections" => "5",
        "limit-burst-multiplier" => "3",
        "limit-allowlist" => "10.0.0.0/8, 2001:db8::/32",
        "canary-by-header" | "canary-by-cookie" | "session-cookie-name" => "x-canary",
        "canary-by-header-value" | "canary-by-header-pattern" => "beta",
        "canary-weight" | "canary-weight-total" | "upstream-hash-by-subset-size" => "10",
        "session-cookie-max-age" | "session-cookie-expires" => "3600",
        "session-cookie-path" => "/app",
        "session-cookie-domain" => "example.com",
        "session-cookie-samesite" => "Lax",
        "affinity" => "cookie",
        "affinity-mode" => "persistent",
        "affinity-canary-behavior" => "sticky",
        "upstream-hash-by" => "$remote_addr",
        "upstream-vhost" => "api.example.com",
        "cors-allow-origin" => "https://app.example.com",
        "cors-allow-methods" => "GET, POST",
        "cors-allow-headers" | "cors-expose-headers" => "X-Total",
        "cors-max-age" => "600",
        "auth-tls-secret" => "ns/ca",
        "auth-tls-verify-client" => "optional",
        "auth-tls-verify-depth" => "2",
        "auth-tls-error-page" => "https://errors.example/cert",
        "auth-tls-match-cn" => "CN=(alice|bob)",
        "proxy-buffering" | "proxy-request-buffering" => "off",
        "proxy-buffer-size" => "16k",
        _ => "true",
    };
    // The key whose absence leaves a key without effect (as in ingress-nginx).
    let needs = |name: &str| match name {
        "auth-type" | "auth-realm" | "auth-secret-type" => Some("auth-secret"),
        "auth-secret" => Some("auth-type"),
        n if n.starts_with("auth-tls-") && n != "auth-tls-secret" => Some("auth-tls-secret"),
        n if n.starts_with("auth-") && n != "auth-url" && n != "auth-tls-secret" => {
            Some("auth-url")
        }
        "limit-burst-multiplier" | "limit-allowlist" => Some("limit-rps"),
        _ => None,
    };
    for key in KEYS
        .iter()
        .filter(|k| matches!(k.support, Support::Honoured | Support::Different(_)))
    {
        let mut pairs = vec![(key.name, valid(key.name))];
        if let Some(url) = key.name.strip_suffix("-code") {
            pairs.push((url, valid(url)));
        }
        if key.name == "x-forwarded-prefix" {
            pairs.push(("rewrite-target", valid("rewrite-target")));
        }
        if let Some(other) = needs(key.name) {
            pairs.push((other, valid(other)));
            if key.name == "auth-realm" || key.name == "auth-secret-type" {
                pairs.push(("auth-type", "basic"));
            }
        }
        if key.name.starts_with("canary-") {
            pairs.push(("canary", "true"));
        }
        let read = nginx(&pairs);
        let (status, detail) = status_of(&read, key.name);
        assert!(status.is_honoured(), "{}: {status} {detail}", key.name);
    }
}

#[test]
fn honoured_keys_set_their_settings() {
    let read = nginx(&[
        ("ssl-redirect", "false"),
        ("force-ssl-redirect", "True"),
        ("proxy-body-size", "8M"),
        ("proxy-connect-timeout", "3"),
        ("proxy-read-timeout", "120"),
    ]);
    assert_eq!(read.settings.ssl_redirect, Some(false));
    assert!(read.settings.force_ssl_redirect);
    assert_eq!(read.settings.body_size, Some(8 << 20));
    assert_eq!(read.settings.connect_timeout, Some(Duration::from_secs(3)));
    assert_eq!(read.settings.read_timeout, Some(Duration::from_secs(120)));
    assert_eq!(status_of(&read, "proxy-body-size").0, Status::Honoured);
    assert_eq!(
        status_of(&read, "ssl-redirect").0,
        Status::HonouredWithDifference
    );
    assert_eq!(
        nginx(&[("proxy-body-size", "0")]).settings.body_size,
        Some(0)
    );
}

#[test]
fn backend_protocols_as_ingress_nginx_names_them() {
    use dataplane::table::UpstreamProtocol as P;
    for (value, want) in [
        ("HTTP", P::Http1),
        ("https", P::Https),
        ("GRPC", P::H2c),
        ("grpcs", P::H2),
        ("H2C", P::H2c),
    ] {
        let read = nginx(&[("backend-protocol", value)]);
        assert_eq!(read.settings.backend_protocol, Some(want), "{value}");
    }
    for value in ["FCGI", "AJP", "AUTO_HTTP", "HTTP2", ""] {
        let read = nginx(&[("backend-protocol", value)]);
        assert_eq!(
            status_of(&read, "backend-protocol").0,
            Status::InvalidValue,
            "{value}"
        );
        assert_eq!(read.settings.backend_protocol, None);
    }
}

#[test]
fn redirects_temporal_wins_codes_need_their_url() {
    let read = nginx(&[
        ("permanent-redirect", "https://new.example.com/x"),
        ("permanent-redirect-code", "308"),
        ("app-root", "/app"),
    ]);
    let r = read.settings.redirect().expect("a redirect");
    assert_eq!(r.always, Some((308, "https://new.example.com/x".into())));
    assert_eq!(r.app_root.as_deref(), Some("/app"));
    let read = nginx(&[
        ("permanent-redirect", "https://a.example/"),
        ("temporal-redirect", "http://[2001:db8::1]:8080/b"),
    ]);
    let r = read.settings.redirect().expect("a redirect");
    assert_eq!(r.always, Some((302, "http://[2001:db8::1]:8080/b".into())));
    // A code alone does nothing; a bad code keeps the default.
    let read = nginx(&[("temporal-redirect-code", "307")]);
    assert_eq!(read.settings.redirect(), None);
    assert_eq!(
        status_of(&read, "temporal-redirect-code").0,
        Status::IgnoredUnsupported
    );
    let read = nginx(&[
        ("permanent-redirect", "https://a.example/"),
        ("permanent-redirect-code", "309"),
    ]);
    assert_eq!(
        status_of(&read, "permanent-redirect-code").0,
        Status::InvalidValue
    );
    assert_eq!(
        read.settings.redirect().unwrap().always,
        Some((301, "https://a.example/".into()))
    );
    for bad in [
        "/relative",
        "ftp://x",
        "https://",
        "https://a b",
        "https:///x",
    ] {
        let read = nginx(&[("permanent-redirect", bad)]);
        assert_eq!(
            status_of(&read, "permanent-redirect").0,
            Status::InvalidValue,
            "{bad}"
        );
        assert_eq!(read.settings.redirect(), None, "{bad}");
    }
    for bad in ["app", "https://x/app", "//x", "/a b"] {
        assert_eq!(
            status_of(&nginx(&[("app-root", bad)]), "app-root").0,
            Status::InvalidValue,
            "{bad}"
        );
    }
}

#[test]
fn source_ranges_parse_both_families_and_fail_closed() {
    let read = nginx(&[
        (
            "allowlist-source-range",
            " 192.0.2.0/24 ,2001:db8::/32, 198.51.100.7,::1",
        ),
        ("denylist-source-range", "192.0.2.128/25"),
    ]);
    let ranges = read.settings.source_ranges().expect("ranges");
    assert_eq!(ranges.allow.as_ref().map(Vec::len), Some(4));
    assert!(!ranges.invalid);
    for (client, admitted) in [
        ("192.0.2.1", true),
        ("::ffff:192.0.2.1", true),
        ("192.0.2.200", false),
        ("2001:db8::5", true),
        ("2001:db9::5", false),
        ("198.51.100.7", true),
        ("198.51.100.8", false),
        ("::1", true),
    ] {
        assert_eq!(
            ranges.admit(client.parse().unwrap()).is_ok(),
            admitted,
            "{client}"
        );
    }
    for bad in ["10.0.0.0/8,", "10.0.0.0/33", "not-an-ip", "", "fe80::/129"] {
        let read = nginx(&[("allowlist-source-range", bad)]);
        let (status, detail) = status_of(&read, "allowlist-source-range");
        assert_eq!(status, Status::InvalidValue, "{bad:?}");
        assert!(detail.contains("503"), "{detail}");
        let ranges = read.settings.source_ranges().expect("fails closed");
        assert!(
            ranges.invalid && ranges.admit("127.0.0.1".parse().unwrap()).is_err(),
            "{bad:?}"
        );
    }
}

#[test]
fn invalid_values_are_reported_and_leave_the_default() {
    for (name, value) in [
        ("proxy-read-timeout", "60s"),
        ("proxy-connect-timeout", "-1"),
        ("proxy-connect-timeout", "0"),
        ("proxy-body-size", "10MB"),
        ("proxy-body-size", ""),
        ("ssl-redirect", "yes"),
        ("force-ssl-redirect", "on"),
    ] {
        let read = nginx(&[(name, value)]);
        let (status, detail) = status_of(&read, name);
        assert_eq!(status, Status::InvalidValue, "{name}={value:?}: {detail}");
        assert!(detail.contains("default applies"), "{detail}");
        assert_eq!(read.settings, Settings::default(), "{name}={value:?}");
    }
}

#[test]
fn duet_annotations_win_over_nginx_ones() {
    let read = read(&annotations(&[
        ("duet.dev/proxy-body-size", "1k"),
        ("nginx.ingress.kubernetes.io/proxy-body-size", "0"),
        ("duet.dev/ssl-redirect", "true"),
        ("nginx.ingress.kubernetes.io/ssl-redirect", "false"),
    ]));
    assert_eq!(read.settings.body_size, None);
    assert_eq!(read.settings.ssl_redirect, None);
    let (status, detail) = status_of(&read, "proxy-body-size");
    assert_eq!(status, Status::HonouredWithDifference);
    assert_eq!(detail, "duet.dev/proxy-body-size is set too and wins");
}

#[test]
fn typos_name_the_nearest_key_within_two_edits() {
    for (typo, meant) in [
        ("proxy-body-szie", "proxy-body-size"),  // transposition
        ("ssl-redirects", "ssl-redirect"),       // insertion
        ("rewrite-targt", "rewrite-target"),     // deletion
        ("backend-protocl", "backend-protocol"), // deletion
        ("whitelist-source-rang", "whitelist-source-range"), // an alias
        ("force-ssl-redirekt", "force-ssl-redirect"),
    ] {
        let read = nginx(&[(typo, "x")]);
        let (status, detail) = status_of(&read, typo);
        assert_eq!(status, Status::IgnoredUnknown, "{typo}");
        assert!(
            detail.ends_with(&format!("did you mean {PREFIX}{meant}?")),
            "{typo}: {detail}"
        );
    }
    let (status, detail) = status_of(&nginx(&[("make-it-fast", "true")]), "make-it-fast");
    assert_eq!(status, Status::IgnoredUnknown);
    assert_eq!(detail, "not an ingress-nginx annotation");
    assert_eq!(edit_distance("abc", "acb"), 1);
    assert_eq!(edit_distance("", "abc"), 3);
    assert_eq!(edit_distance("kitten", "sitting"), 3);
}

#[test]
fn prefix_typos_are_reported_other_prefixes_are_not() {
    let read = read(&annotations(&[
        ("nignx.ingress.kubernetes.io/force-ssl-redirect", "true"),
        ("kubernetes.io/ingress.class", "nginx"),
        ("cert-manager.io/cluster-issuer", "letsencrypt"),
    ]));
    assert_eq!(read.findings.len(), 1, "{:?}", read.findings);
    let (status, detail) = status_of(&read, "nignx.ingress.kubernetes.io/force-ssl-redirect");
    assert_eq!(status, Status::IgnoredUnknown);
    assert!(
        detail.contains("did you mean nginx.ingress.kubernetes.io/force-ssl-redirect?"),
        "{detail}"
    );
    assert!(!read.settings.force_ssl_redirect);
}

#[test]
fn nginx_inc_keys_and_the_old_prefix_are_reported() {
    let read = read(&annotations(&[
        ("nginx.org/client-max-body-size", "10m"),
        ("ingress.kubernetes.io/ssl-redirect", "false"),
        ("ingress.kubernetes.io/backends", "{}"),
    ]));
    assert_eq!(read.findings.len(), 2, "{:?}", read.findings);
    assert_eq!(
        status_of(&read, "nginx.org/client-max-body-size").0,
        Status::IgnoredUnknown
    );
    let (status, detail) = status_of(&read, "ingress.kubernetes.io/ssl-redirect");
    assert_eq!(status, Status::IgnoredRemovedUpstream);
    assert!(
        detail.ends_with("did you mean nginx.ingress.kubernetes.io/ssl-redirect?"),
        "{detail}"
    );
    assert_eq!(read.settings, Settings::default());
}

#[test]
fn removed_and_configmap_keys_are_named_as_such() {
    let read = nginx(&[
        ("secure-backends", "true"),
        ("grpc-backend", "true"),
        ("enable-websockets", "true"),
        ("large-client-header-buffers", "4 16k"),
    ]);
    let (status, detail) = status_of(&read, "secure-backends");
    assert_eq!(status, Status::IgnoredRemovedUpstream);
    assert!(detail.contains("backend-protocol: HTTPS"), "{detail}");
    assert_eq!(
        status_of(&read, "grpc-backend").0,
        Status::IgnoredRemovedUpstream
    );
    assert_eq!(
        status_of(&read, "enable-websockets").0,
        Status::IgnoredUnknown
    );
    let (status, detail) = status_of(&read, "large-client-header-buffers");
    assert_eq!(status, Status::IgnoredUnknown);
    assert!(detail.contains("ConfigMap option"), "{detail}");
}

#[test]
fn snippets_are_never_honoured_and_listed() {
    let read = nginx(&[
        ("configuration-snippet", "more_set_headers \"X-A: b\";"),
        ("server-snippet", "return 200;"),
        ("proxy-body-size", "1k"),
    ]);
    assert_eq!(
        read.settings.snippets,
        [
            format!("{PREFIX}configuration-snippet"),
            format!("{PREFIX}server-snippet")
        ]
    );
    assert_eq!(
        status_of(&read, "server-snippet").0,
        Status::IgnoredUnsupported
    );
    let object = ObjectKey::new(crate::object::Kind::Ingress, "a", "b");
    let diagnostics = diagnostics(&object, &read.findings);
    let reasons: Vec<Reason> = diagnostics.iter().map(|d| d.reason).collect();
    assert_eq!(
        reasons,
        [Reason::SnippetAnnotation, Reason::SnippetAnnotation]
    );
}

#[test]
fn aliases_apply_when_the_canonical_key_is_absent() {
    let read = nginx(&[("whitelist-source-range", "10.0.0.0/8")]);
    let (status, detail) = status_of(&read, "whitelist-source-range");
    assert_eq!(status, Status::HonouredWithDifference);
    assert_eq!(
        read.settings.allow_source,
        Some(vec!["10.0.0.0/8".parse().unwrap()])
    );
    assert!(
        detail.starts_with("alias of allowlist-source-range"),
        "{detail}"
    );
    let read = nginx(&[
        ("whitelist-source-range", "10.0.0.0/8"),
        ("allowlist-source-range", "::/0"),
    ]);
    assert!(status_of(&read, "whitelist-source-range")
        .1
        .contains("is set too and wins"));
}

#[test]
fn diagnostics_name_key_status_and_detail_and_skip_honoured_keys() {
    let read = nginx(&[
        ("proxy-body-size", "8k"),
        ("proxy-read-timeout", "60s"),
        ("mirror-target", "https://mirror.example.com/"),
        ("secure-backends", "true"),
    ]);
    let object = ObjectKey::new(crate::object::Kind::Ingress, "shop", "web");
    let d = diagnostics(&object, &read.findings);
    let got: Vec<(Reason, &str)> = d.iter().map(|d| (d.reason, d.message.as_str())).collect();
    assert_eq!(got.len(), 3, "{got:#?}");
    assert!(got.contains(&(
        Reason::InvalidAnnotation,
        "nginx.ingress.kubernetes.io/proxy-read-timeout: invalid-value: \"60s\" is not a whole number of seconds of at least 1 (ingress-nginx takes no unit); the default applies"
    )), "{got:#?}");
    assert!(got.iter().any(|(r, m)| *r == Reason::IgnoredAnnotation
        && m.starts_with("nginx.ingress.kubernetes.io/mirror-target: ignored-unsupported: ")));
    assert!(got.iter().any(|(r, m)| *r == Reason::IgnoredAnnotation
        && m.starts_with(
            "nginx.ingress.kubernetes.io/secure-backends: ignored-removed-upstream: "
        )));
    let counts = count_by_status(&read.findings);
    assert_eq!(counts[&Status::Honoured], 1);
    assert_eq!(counts[&Status::InvalidValue], 1);
    assert_eq!(counts[&Status::IgnoredUnknown], 0);
}

#[test]
fn rewrite_target_and_use_regex_as_ingress_nginx_validates_them() {
    let read = nginx(&[
        ("rewrite-target", "/$2"),
        ("x-forwarded-prefix", "/grafana"),
    ]);
    let s = &read.settings;
    assert_eq!(s.rewrite_target.as_deref(), Some("/$2"));
    // Regex host-wide unless the target is the path itself.
    assert!(s.forces_regex("/grafana(/|$)(.*)"));
    assert!(!nginx(&[("rewrite-target", "/api")])
        .settings
        .forces_regex("/api"));
    assert!(nginx(&[("use-regex", "true")])
        .settings
        .forces_regex("/api"));
    assert!(!nginx(&[("use-regex", "false")])
        .settings
        .forces_regex("/api"));
    let rewrite = s.rewrite_for("/grafana").expect("a rewrite");
    assert_eq!(rewrite.forwarded_prefix.as_deref(), Some("/grafana"));
    assert!(s.rewrite_for("/$2").is_none());
    // Full URLs pass ingress-nginx's validator; `?`, `&`, `=`, spaces do not.
    assert_eq!(
        status_of(
            &nginx(&[("rewrite-target", "https://x.example/$1")]),
            "rewrite-target"
        )
        .0,
        Status::HonouredWithDifference
    );
    for bad in ["/a?b=c", "/a b", "/{x}"] {
        let read = nginx(&[("rewrite-target", bad)]);
        assert_eq!(
            status_of(&read, "rewrite-target").0,
            Status::InvalidValue,
            "{bad}"
        );
        assert_eq!(read.settings.rewrite_target, None, "{bad}");
    }
    // X-Forwarded-Prefix is only sent on rewritten requests.
    let alone = nginx(&[("x-forwarded-prefix", "/grafana")]);
    assert_eq!(
        status_of(&alone, "x-forwarded-prefix"),
        (
            Status::IgnoredUnsupported,
            "no effect without a valid rewrite-target (as in ingress-nginx)".to_owned()
        )
    );
    // A Prefix path of an Ingress not asking for regexes loses its trailing slash.
    assert_eq!(regex_pattern("/foo/", "Prefix", false), "/foo");
    assert_eq!(regex_pattern("/", "Prefix", false), "/");
    assert_eq!(regex_pattern("/foo/", "Prefix", true), "/foo/");
    assert_eq!(
        regex_pattern("/a(.*)", "ImplementationSpecific", false),
        "/a(.*)"
    );
}

#[test]
fn a_path_regex_that_does_not_compile_makes_its_keys_invalid() {
    let mut read = nginx(&[("use-regex", "true"), ("rewrite-target", "/$1")]);
    let error = regex_error("/(?<=x)y").expect("lookbehind does not compile");
    assert!(error.contains("look-around"), "{error}");
    assert_eq!(regex_error("/ok(/|$)(.*)"), None);
    regex_failed(&mut read.findings, "/(?<=x)y", &error);
    for key in ["use-regex", "rewrite-target"] {
        let (status, detail) = status_of(&read, key);
        assert_eq!(status, Status::InvalidValue, "{key}");
        assert!(
            detail.starts_with("path \"/(?<=x)y\" is not a regex"),
            "{detail}"
        );
    }
}

#[test]
fn client_certificate_keys_need_their_secret_and_check_their_values() {
    let all = nginx(&[
        ("auth-tls-secret", "ns/ca"),
        ("auth-tls-verify-client", "optional_no_ca"),
        ("auth-tls-verify-depth", "2"),
        ("auth-tls-pass-certificate-to-upstream", "true"),
        ("auth-tls-error-page", "https://errors.example/cert"),
    ]);
    assert_eq!(
        status_of(&all, "auth-tls-secret").0,
        Status::HonouredWithDifference
    );
    let others = [
        "auth-tls-verify-client",
        "auth-tls-verify-depth",
        "auth-tls-pass-certificate-to-upstream",
        "auth-tls-error-page",
    ];
    for key in others {
        assert_eq!(status_of(&all, key).0, Status::Honoured, "{key}");
    }
    let bad = nginx(&[
        ("auth-tls-secret", "ns/ca"),
        ("auth-tls-verify-client", "maybe"),
        ("auth-tls-verify-depth", "0"),
        ("auth-tls-error-page", "/errors"),
    ]);
    for key in [
        "auth-tls-verify-client",
        "auth-tls-verify-depth",
        "auth-tls-error-page",
    ] {
        assert_eq!(status_of(&bad, key).0, Status::InvalidValue, "{key}");
    }
    let alone = nginx(&[
        ("auth-tls-verify-client", "on"),
        ("auth-tls-pass-certificate-to-upstream", "true"),
    ]);
    for key in [
        "auth-tls-verify-client",
        "auth-tls-pass-certificate-to-upstream",
    ] {
        let (status, detail) = status_of(&alone, key);
        assert_eq!(status, Status::IgnoredUnsupported, "{key}");
        assert!(detail.contains("auth-tls-secret"), "{detail}");
    }
    let off = nginx(&[
        ("auth-tls-secret", "ns/ca"),
        ("auth-tls-verify-client", "off"),
        ("auth-tls-verify-depth", "2"),
    ]);
    assert_eq!(
        status_of(&off, "auth-tls-verify-client").0,
        Status::Honoured
    );
    let (status, detail) = status_of(&off, "auth-tls-verify-depth");
    assert_eq!(status, Status::IgnoredUnsupported);
    assert!(detail.contains("off"), "{detail}");
}

#[test]
fn buffering_off_is_honoured_and_on_is_not() {
    let off = nginx(&[
        ("proxy-buffering", "off"),
        ("proxy-request-buffering", "off"),
        ("proxy-buffer-size", "16k"),
    ]);
    assert_eq!(status_of(&off, "proxy-buffering").0, Status::Honoured);
    assert_eq!(
        status_of(&off, "proxy-request-buffering").0,
        Status::Honoured
    );
    assert_eq!(
        status_of(&off, "proxy-buffer-size").0,
        Status::HonouredWithDifference
    );
    let on = nginx(&[
        ("proxy-buffering", "on"),
        ("proxy-request-buffering", "on"),
        ("proxy-buffer-size", "64k"),
    ]);
    for key in ["proxy-buffering", "proxy-request-buffering"] {
        let (status, detail) = status_of(&on, key);
        assert_eq!(status, Status::IgnoredUnsupported, "{key}");
        assert!(detail.contains("streams"), "{detail}");
    }
    let (status, detail) = status_of(&on, "proxy-buffer-size");
    assert_eq!(status, Status::HonouredWithDifference);
    assert!(
        detail.contains("up to 32 KiB, not up to this size"),
        "{detail}"
    );
    let bad = nginx(&[("proxy-buffering", "maybe"), ("proxy-buffer-size", "lots")]);
    assert_eq!(status_of(&bad, "proxy-buffering").0, Status::InvalidValue);
    assert_eq!(status_of(&bad, "proxy-buffer-size").0, Status::InvalidValue);
}
