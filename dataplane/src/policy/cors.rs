//! CORS as ingress-nginx does it (`enable-cors`): a request whose `Origin` is allowed (or any
//! request, when the origins are `*`) gets the `Access-Control-*` headers on its response; such a
//! request with method `OPTIONS` is a preflight answered by duet with `204`, not proxied. A
//! request whose `Origin` is not allowed gets no CORS header and is proxied as it is.

use http::{HeaderMap, HeaderName, HeaderValue, Method};

use crate::route_policy::Cors;

/// The CORS response headers for a request, when the route enables CORS and admits its origin.
pub fn headers_for(cors: &Cors, request: &HeaderMap) -> Option<HeaderMap> {
    let origin = match &cors.origins {
        None => HeaderValue::from_static("*"),
        Some(list) => {
            let origin = request.get(http::header::ORIGIN)?;
            let text = origin.to_str().ok()?;
            list.iter()
                .any(|p| p.matches(text))
                .then(|| origin.clone())?
        }
    };
    let mut out = HeaderMap::new();
    out.insert(http::header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
    if cors.credentials {
        out.insert(
            http::header::ACCESS_CONTROL_ALLOW_CREDENTIALS,
            HeaderValue::from_static("true"),
        );
    }
    let mut set = |name: HeaderName, value: &str| {
        if let Ok(v) = HeaderValue::from_str(value) {
            out.insert(name, v);
        }
    };
    set(http::header::ACCESS_CONTROL_ALLOW_METHODS, &cors.methods);
    set(http::header::ACCESS_CONTROL_ALLOW_HEADERS, &cors.headers);
    if let Some(expose) = &cors.expose {
        set(http::header::ACCESS_CONTROL_EXPOSE_HEADERS, expose);
    }
    set(
        http::header::ACCESS_CONTROL_MAX_AGE,
        &cors.max_age.to_string(),
    );
    Some(out)
}

/// Whether a request that got CORS headers is a preflight duet answers itself.
pub fn is_preflight(method: &Method) -> bool {
    method == Method::OPTIONS
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::route_policy::OriginPattern;

    fn cors(origins: Option<&[&str]>) -> Cors {
        Cors {
            origins: origins.map(|o| o.iter().filter_map(|p| OriginPattern::parse(p)).collect()),
            methods: "GET, PUT".into(),
            headers: "Content-Type".into(),
            expose: None,
            credentials: true,
            max_age: 1728000,
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
            assert_eq!(headers_for(&c, &origin(o)).is_some(), want, "{o}");
        }
        let echoed = headers_for(&c, &origin("https://app.example.com")).unwrap();
        assert_eq!(
            echoed["access-control-allow-origin"],
            "https://app.example.com"
        );
        assert_eq!(echoed["access-control-allow-credentials"], "true");
        assert_eq!(echoed["access-control-max-age"], "1728000");
        assert!(headers_for(&c, &HeaderMap::new()).is_none());
    }

    #[test]
    fn a_star_allows_everyone_without_echoing() {
        let any = headers_for(&cors(None), &HeaderMap::new()).unwrap();
        assert_eq!(any["access-control-allow-origin"], "*");
        assert!(OriginPattern::parse("https://exa mple.com").is_none());
        assert!(OriginPattern::parse("example.com").is_none());
        assert!(OriginPattern::parse("https://example.com/path").is_none());
    }
}
