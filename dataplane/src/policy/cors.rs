//! CORS as ingress-nginx does it (`enable-cors`): a request whose `Origin` is allowed (or any
//! request, when the origins are `*`) gets the `Access-Control-*` headers on its response; such a
//! request with method `OPTIONS` is a preflight answered by duet with `204`, not proxied. A
//! request whose `Origin` is not allowed gets no CORS header and is proxied as it is. With a list
//! of origins every response also carries `Vary: Origin` (added to the upstream's `Vary`), so a
//! cache never serves one origin's answer to another.

use http::header::{ACCESS_CONTROL_ALLOW_ORIGIN, VARY};
use http::{HeaderMap, HeaderName, HeaderValue, Method};

use crate::route_policy::{Cors, OriginPattern};

/// The CORS response headers for a request on a route that enables CORS: `Vary: Origin` when
/// the answer depends on the origin, and the `Access-Control-*` headers when it is admitted.
pub fn headers_for(cors: &Cors, request: &HeaderMap) -> Option<HeaderMap> {
    let Some(list) = &cors.origins else {
        if cors.gateway && cors.credentials {
            // `*` cannot go with credentials: the request's own origin is echoed.
            let mut out = HeaderMap::new();
            out.insert(VARY, HeaderValue::from_static("Origin"));
            return Some(match request.get(http::header::ORIGIN) {
                Some(origin) => allowing(cors, origin.clone(), request, out),
                None => out,
            });
        }
        let star = HeaderValue::from_static("*");
        return Some(allowing(cors, star, request, HeaderMap::new()));
    };
    let mut out = HeaderMap::new();
    out.insert(VARY, HeaderValue::from_static("Origin"));
    Some(match allowed(cors, list, request) {
        Some(origin) => allowing(cors, origin, request, out),
        None => out,
    })
}

/// The request's `Origin`, when a pattern of the list admits it.
fn allowed(cors: &Cors, list: &[OriginPattern], request: &HeaderMap) -> Option<HeaderValue> {
    let origin = request.get(http::header::ORIGIN)?;
    let text = origin.to_str().ok()?;
    list.iter()
        .any(|p| p.matches_labels(text, cors.gateway))
        .then(|| origin.clone())
}

/// `out` with the `Access-Control-*` headers admitting `origin`.
fn allowing(
    cors: &Cors,
    origin: HeaderValue,
    request: &HeaderMap,
    mut out: HeaderMap,
) -> HeaderMap {
    out.insert(ACCESS_CONTROL_ALLOW_ORIGIN, origin);
    if cors.credentials {
        out.insert(
            http::header::ACCESS_CONTROL_ALLOW_CREDENTIALS,
            HeaderValue::from_static("true"),
        );
    }
    let mut set = |name: HeaderName, value: &str| {
        if value.is_empty() {
            return;
        }
        if let Ok(v) = HeaderValue::from_str(value) {
            out.insert(name, v);
        }
    };
    let requested = |name: HeaderName, configured: &str| match request.get(name) {
        Some(asked) if cors.gateway && configured == "*" => {
            asked.to_str().unwrap_or(configured).to_owned()
        }
        _ => configured.to_owned(),
    };
    let methods = requested(http::header::ACCESS_CONTROL_REQUEST_METHOD, &cors.methods);
    set(http::header::ACCESS_CONTROL_ALLOW_METHODS, &methods);
    let headers = requested(http::header::ACCESS_CONTROL_REQUEST_HEADERS, &cors.headers);
    set(http::header::ACCESS_CONTROL_ALLOW_HEADERS, &headers);
    if let Some(expose) = &cors.expose {
        set(http::header::ACCESS_CONTROL_EXPOSE_HEADERS, expose);
    }
    set(
        http::header::ACCESS_CONTROL_MAX_AGE,
        &cors.max_age.to_string(),
    );
    out
}

/// Whether a request with these CORS headers is a preflight duet answers itself: an `OPTIONS`
/// whose origin is admitted.
pub fn is_preflight(method: &Method, cors: &HeaderMap) -> bool {
    method == Method::OPTIONS && cors.contains_key(ACCESS_CONTROL_ALLOW_ORIGIN)
}

/// Whether a request is a CORS preflight, admitted or not: an `OPTIONS` with an `Origin` and an
/// `Access-Control-Request-Method` (Gateway API's CORS answers them all).
pub fn is_any_preflight(method: &Method, request: &HeaderMap) -> bool {
    method == Method::OPTIONS
        && request.contains_key(http::header::ORIGIN)
        && request.contains_key(http::header::ACCESS_CONTROL_REQUEST_METHOD)
}

/// Adds the CORS headers to a response: `Vary` after the upstream's own (unless it already
/// names `Origin` or is `*`), the others in place of the upstream's.
pub fn add_to(response: &mut HeaderMap, cors: &HeaderMap) {
    for (name, value) in cors {
        if name != VARY {
            response.insert(name, value.clone());
        } else if !varies_on_origin(response) {
            response.append(VARY, value.clone());
        }
    }
}

/// Whether a response's `Vary` already covers `Origin` (names it, or is `*`).
fn varies_on_origin(response: &HeaderMap) -> bool {
    response
        .get_all(VARY)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .any(|f| f == "*" || f.eq_ignore_ascii_case("origin"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cors(origins: Option<&[&str]>) -> Cors {
        Cors {
            origins: origins.map(|o| o.iter().filter_map(|p| OriginPattern::parse(p)).collect()),
            methods: "GET, PUT".into(),
            headers: "Content-Type".into(),
            expose: None,
            credentials: true,
            max_age: 1728000,
            gateway: false,
        }
    }

    fn origin(o: &'static str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert("origin", HeaderValue::from_static(o));
        h
    }

    #[test]
    fn origins_match_exactly_or_one_wildcard_label() {
        let c = cors(Some(&[
            "https://*.example.com",
            "http://[2001:db8::1]:8080",
            "null",
        ]));
        for (o, want) in [
            ("https://app.example.com", true),
            ("HTTPS://App.Example.COM", true),
            ("https://a.b.example.com", false),
            ("https://example.com", false),
            ("http://app.example.com", false),
            ("https://app.example.com:8443", false),
            ("http://[2001:db8::1]:8080", true),
            ("http://[2001:db8::1]", false),
            ("null", true),
            ("https://evil.com/https://app.example.com", false),
        ] {
            let headers = headers_for(&c, &origin(o)).unwrap();
            assert_eq!(
                headers.contains_key("access-control-allow-origin"),
                want,
                "{o}"
            );
            assert_eq!(headers["vary"], "Origin", "{o}");
        }
        let echoed = headers_for(&c, &origin("https://app.example.com")).unwrap();
        assert_eq!(
            echoed["access-control-allow-origin"],
            "https://app.example.com"
        );
        assert_eq!(echoed["access-control-allow-credentials"], "true");
        assert_eq!(echoed["access-control-max-age"], "1728000");
        // Without an Origin: no CORS header, but the answer varies on it all the same.
        let none = headers_for(&c, &HeaderMap::new()).unwrap();
        assert_eq!(none.len(), 1);
        assert_eq!(none["vary"], "Origin");
    }

    #[test]
    fn a_star_allows_everyone_without_echoing() {
        let any = headers_for(&cors(None), &HeaderMap::new()).unwrap();
        assert_eq!(any["access-control-allow-origin"], "*");
        assert!(!any.contains_key("vary"), "the same for every origin");
        assert!(OriginPattern::parse("https://exa mple.com").is_none());
        assert!(OriginPattern::parse("example.com").is_none());
        assert!(OriginPattern::parse("https://example.com/path").is_none());
    }

    #[test]
    fn vary_origin_is_added_to_the_upstreams_vary_once() {
        let c = cors(Some(&["https://app.example.com"]));
        let cors = headers_for(&c, &origin("https://app.example.com")).unwrap();
        let vary = |upstream: &[&'static str]| {
            let mut res = HeaderMap::new();
            for v in upstream {
                res.append(VARY, HeaderValue::from_static(v));
            }
            add_to(&mut res, &cors);
            assert_eq!(res[ACCESS_CONTROL_ALLOW_ORIGIN], "https://app.example.com");
            let all = res.get_all(VARY).iter();
            all.map(|v| v.to_str().unwrap().to_owned())
                .collect::<Vec<_>>()
        };
        assert_eq!(vary(&[]), ["Origin"]);
        assert_eq!(vary(&["Accept-Encoding"]), ["Accept-Encoding", "Origin"]);
        assert_eq!(
            vary(&["Accept-Encoding, ORIGIN"]),
            ["Accept-Encoding, ORIGIN"]
        );
        assert_eq!(vary(&["Cookie", "origin"]), ["Cookie", "origin"]);
        assert_eq!(vary(&["*"]), ["*"]);
    }

    fn request(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (n, v) in pairs {
            h.insert(*n, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn gateway_wildcards_cover_labels_and_echo_what_was_asked() {
        let mut c = cors(Some(&["https://*.bar.com"]));
        c.gateway = true;
        c.methods = "*".into();
        c.headers = "*".into();
        let asked = |o: &'static str| {
            request(&[
                ("origin", o),
                ("access-control-request-method", "PUT"),
                ("access-control-request-headers", "x-a, x-b"),
            ])
        };
        let deep = headers_for(&c, &asked("https://a.www.bar.com")).unwrap();
        assert_eq!(deep["access-control-allow-origin"], "https://a.www.bar.com");
        assert_eq!(deep["access-control-allow-methods"], "PUT");
        assert_eq!(deep["access-control-allow-headers"], "x-a, x-b");
        for refused in ["https://bar.com", "https://evilbar.com", "http://a.bar.com"] {
            let h = headers_for(&c, &asked(refused)).unwrap();
            assert!(!h.contains_key("access-control-allow-origin"), "{refused}");
        }
        // Ingress keeps one label, and its `*` literally.
        c.gateway = false;
        let one = headers_for(&c, &asked("https://a.www.bar.com")).unwrap();
        assert!(!one.contains_key("access-control-allow-origin"));
        let lit = headers_for(&c, &asked("https://www.bar.com")).unwrap();
        assert_eq!(lit["access-control-allow-methods"], "*");
    }

    #[test]
    fn a_gateway_star_origin_echoes_the_origin_only_with_credentials() {
        let mut c = cors(None);
        c.gateway = true;
        c.credentials = true;
        let o = request(&[("origin", "https://x.test:8443")]);
        let with = headers_for(&c, &o).unwrap();
        assert_eq!(with["access-control-allow-origin"], "https://x.test:8443");
        assert_eq!(with["vary"], "Origin");
        assert_eq!(with["access-control-allow-credentials"], "true");
        c.credentials = false;
        let without = headers_for(&c, &o).unwrap();
        assert_eq!(without["access-control-allow-origin"], "*");
        assert!(!without.contains_key("access-control-allow-credentials"));
    }

    #[test]
    fn every_preflight_is_one_but_only_with_origin_and_requested_method() {
        let options = Method::OPTIONS;
        let full = request(&[
            ("origin", "https://x.test"),
            ("access-control-request-method", "GET"),
        ]);
        assert!(is_any_preflight(&options, &full));
        assert!(!is_any_preflight(&Method::GET, &full));
        assert!(!is_any_preflight(
            &options,
            &request(&[("origin", "https://x.test")])
        ));
    }
}
