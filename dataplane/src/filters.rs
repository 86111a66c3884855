//! Gateway API filters and timeouts of a rule, a leaf of the snapshot contract (plain data and
//! what it makes of a request; the proxy calls it at four points): `RequestHeaderModifier` and
//! `URLRewrite` shape the upstream request, `RequestRedirect` answers instead of proxying,
//! `ResponseHeaderModifier` shapes the response, and `timeouts.request` / `timeouts.backendRequest`
//! bound the wait for the response head (504).

use std::sync::Arc;
use std::time::Duration;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use serde::{Serialize, Serializer};

/// A rule's filters and timeouts; the proxy applies what is set.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Filters {
    /// `RequestHeaderModifier`: applied to the request sent upstream, after duet's own headers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_headers: Option<HeaderModifier>,
    /// `ResponseHeaderModifier`: applied to the upstream's response.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub response_headers: Option<HeaderModifier>,
    /// `RequestRedirect`: every request is answered with a redirect.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redirect: Option<RedirectFilter>,
    /// `URLRewrite`: the path and `Host` sent upstream.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rewrite: Option<UrlRewrite>,
    /// `timeouts.request`: from routing to the response head, over every attempt (504).
    #[serde(
        rename = "request_timeout_ms",
        skip_serializing_if = "Option::is_none",
        serialize_with = "millis"
    )]
    pub request_timeout: Option<Duration>,
    /// `timeouts.backendRequest`: from sending to the response head, per attempt (504).
    #[serde(
        rename = "backend_timeout_ms",
        skip_serializing_if = "Option::is_none",
        serialize_with = "millis"
    )]
    pub backend_timeout: Option<Duration>,
    /// backendRef filters: applied after the rule's when that backend serves the request.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub per_backend: Vec<(Arc<str>, BackendFilters)>,
}

/// The header modifiers of one backendRef (`HTTPRouteBackendRequestHeaderModification`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct BackendFilters {
    /// `RequestHeaderModifier`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_headers: Option<HeaderModifier>,
    /// `ResponseHeaderModifier`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub response_headers: Option<HeaderModifier>,
}

fn millis<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        None => s.serialize_none(),
    }
}

/// Header edits, in the order set, add, remove.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct HeaderModifier {
    /// Replace every value of the header with this one.
    #[serde(serialize_with = "pairs")]
    pub set: Vec<(HeaderName, HeaderValue)>,
    /// Add this value: joined to the existing ones with `,` (one field line; `Set-Cookie` gets
    /// a line of its own).
    #[serde(serialize_with = "pairs")]
    pub add: Vec<(HeaderName, HeaderValue)>,
    /// Remove the header.
    #[serde(serialize_with = "names")]
    pub remove: Vec<HeaderName>,
}

fn pairs<S: Serializer>(list: &[(HeaderName, HeaderValue)], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(
        list.iter()
            .map(|(n, v)| (n.as_str(), String::from_utf8_lossy(v.as_bytes()))),
    )
}

fn names<S: Serializer>(list: &[HeaderName], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(list.iter().map(HeaderName::as_str))
}

impl HeaderModifier {
    /// Applies the edits to a header map.
    pub fn apply(&self, headers: &mut HeaderMap) {
        for (name, value) in &self.set {
            headers.insert(name.clone(), value.clone());
        }
        for (name, value) in &self.add {
            add(headers, name, value);
        }
        for name in &self.remove {
            headers.remove(name);
        }
    }
}

fn add(headers: &mut HeaderMap, name: &HeaderName, value: &HeaderValue) {
    if *name == header::SET_COOKIE || !headers.contains_key(name) {
        headers.append(name.clone(), value.clone());
        return;
    }
    let mut joined = Vec::new();
    for old in headers.get_all(name) {
        joined.extend_from_slice(old.as_bytes());
        joined.push(b',');
    }
    joined.extend_from_slice(value.as_bytes());
    if let Ok(joined) = HeaderValue::from_bytes(&joined) {
        headers.insert(name.clone(), joined);
    }
}

/// How a path is replaced (`ReplaceFullPath`, `ReplacePrefixMatch`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PathModifier {
    /// The whole path becomes this.
    Full(Arc<str>),
    /// The part of the path the rule's prefix matched becomes this (the rest is kept).
    Prefix(Arc<str>),
}

impl PathModifier {
    /// The new path for `path`, which the rule's path match matched: `matched` is that match's
    /// literal path (an `Exact` or prefix match; `None` for a regex). A prefix replacement of a
    /// path matched by a regex leaves it as is.
    pub fn apply(&self, matched: Option<&str>, path: &str) -> String {
        match (self, matched) {
            (PathModifier::Full(full), _) => full.to_string(),
            (PathModifier::Prefix(replacement), Some(prefix)) => {
                replace_prefix(prefix, replacement, path)
            }
            (PathModifier::Prefix(_), _) => path.to_owned(),
        }
    }
}

/// Gateway API's `ReplacePrefixMatch`: the matched prefix (element-wise, a trailing slash
/// ignored) replaced, the rest kept; `/foo/bar` with prefix `/foo` and `/xyz/` is `/xyz/bar`,
/// `/foo` with `/` is `/`.
pub fn replace_prefix(prefix: &str, replacement: &str, path: &str) -> String {
    let prefix = prefix.trim_end_matches('/');
    let rest = path.strip_prefix(prefix).unwrap_or(path);
    let mut out = String::with_capacity(replacement.len() + rest.len() + 1);
    out.push_str(replacement.trim_end_matches('/'));
    out.push_str(rest);
    if !out.starts_with('/') {
        out.insert(0, '/');
    }
    out
}

/// `RequestRedirect`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RedirectFilter {
    /// `http` or `https`; the request's when unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scheme: Option<Arc<str>>,
    /// The host of the `Location`; the request's (without its port) when unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hostname: Option<Arc<str>>,
    /// The port; when unset, the scheme's well-known port if the scheme is set, else the
    /// listener's port ([`RedirectFilter::listener_port`]; without it, the port of the
    /// request's `Host`, else its scheme's default).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// The port of the Gateway listener the rule is served on (translation sets it per
    /// listener): the redirect's port when neither `port` nor `scheme` is set, whatever port the
    /// client wrote in its `Host`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listener_port: Option<u16>,
    /// The path; the request's when unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<PathModifier>,
    /// 301, 302, 303, 307 or 308.
    pub status: u16,
}

/// The default port of a scheme, if it has one.
fn default_port(scheme: &str) -> Option<u16> {
    match scheme {
        "http" => Some(80),
        "https" => Some(443),
        _ => None,
    }
}

/// A host as a URL authority writes it: IPv6 literals in brackets.
fn bracketed(host: &str) -> std::borrow::Cow<'_, str> {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]").into()
    } else {
        host.into()
    }
}

/// Splits a `Host` value into name and port (IPv6 literals keep their brackets).
fn split_host(host: &str) -> (&str, Option<u16>) {
    let name = crate::host::strip_port(host);
    let port = host
        .get(name.len()..)
        .and_then(|rest| rest.strip_prefix(':'))
        .and_then(|p| p.parse().ok());
    (name, port)
}

impl RedirectFilter {
    /// The `Location` for a request: `scheme` and `host` are the request's (`host` as received,
    /// port and IPv6 brackets included), `matched` the literal path of the rule's match, `path` and `query`
    /// the request's (the query is kept).
    pub fn location(
        &self,
        scheme: &str,
        host: &str,
        matched: Option<&str>,
        path: &str,
        query: Option<&str>,
    ) -> String {
        let (name, host_port) = split_host(host);
        let to_scheme = self.scheme.as_deref().unwrap_or(scheme);
        let port = match (self.port, &self.scheme) {
            (Some(port), _) => Some(port),
            (None, Some(s)) => default_port(s).or(host_port),
            (None, None) => self.listener_port.or(host_port).or(default_port(scheme)),
        };
        let name = self.hostname.as_deref().map_or(name.into(), bracketed);
        let mut location = format!("{to_scheme}://{name}");
        if let Some(port) = port.filter(|p| default_port(to_scheme) != Some(*p)) {
            location.push_str(&format!(":{port}"));
        }
        match &self.path {
            Some(modifier) => location.push_str(&modifier.apply(matched, path)),
            None => location.push_str(path),
        }
        if let Some(query) = query {
            location.push('?');
            location.push_str(query);
        }
        location
    }
}

/// `URLRewrite`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct UrlRewrite {
    /// The `Host` sent upstream.
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "optional_value"
    )]
    pub hostname: Option<HeaderValue>,
    /// The path sent upstream.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<PathModifier>,
}

fn optional_value<S: Serializer>(v: &Option<HeaderValue>, s: S) -> Result<S::Ok, S::Error> {
    match v {
        Some(v) => s.serialize_str(&String::from_utf8_lossy(v.as_bytes())),
        None => s.serialize_none(),
    }
}

impl UrlRewrite {
    /// The origin-form target sent upstream when the path is rewritten (the query kept).
    pub fn target(&self, matched: Option<&str>, path: &str, query: Option<&str>) -> Option<String> {
        let mut target = self.path.as_ref()?.apply(matched, path);
        if let Some(query) = query {
            target.push('?');
            target.push_str(query);
        }
        Some(target)
    }
}

impl Filters {
    /// The upstream request's headers, last: the rewritten `Host`, then the rule's header
    /// modifier, then that of `backend` (the one serving the request).
    pub fn prepare_upstream(&self, backend: &str, headers: &mut HeaderMap) {
        if let Some(host) = self.rewrite.as_ref().and_then(|r| r.hostname.as_ref()) {
            headers.insert(header::HOST, host.clone());
        }
        let own = self
            .of_backend(backend)
            .and_then(|f| f.request_headers.as_ref());
        for modifier in self.request_headers.iter().chain(own) {
            modifier.apply(headers);
        }
    }

    /// The response's headers: the rule's modifier, then that of `backend`.
    pub fn respond(&self, backend: &str, headers: &mut HeaderMap) {
        let own = self
            .of_backend(backend)
            .and_then(|f| f.response_headers.as_ref());
        for modifier in self.response_headers.iter().chain(own) {
            modifier.apply(headers);
        }
    }

    fn of_backend(&self, backend: &str) -> Option<&BackendFilters> {
        let mut all = self.per_backend.iter();
        all.find(|(id, _)| &**id == backend).map(|(_, f)| f)
    }
}

/// When the response head of the attempt starting now must have come: the earlier of the
/// request's deadline and the backend timeout from now; `None` (no clock read) without either.
pub fn attempt_deadline(
    request_deadline: Option<tokio::time::Instant>,
    backend_timeout: Option<Duration>,
) -> Option<tokio::time::Instant> {
    let backend = backend_timeout.map(|t| tokio::time::Instant::now() + t);
    match (request_deadline, backend) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replace_prefix_follows_the_spec_table() {
        // Gateway API HTTPPathModifier: request path, prefix match, replacement, result.
        for (path, prefix, replacement, want) in [
            ("/foo/bar", "/foo", "/xyz", "/xyz/bar"),
            ("/foo/bar", "/foo", "/xyz/", "/xyz/bar"),
            ("/foo/bar", "/foo/", "/xyz", "/xyz/bar"),
            ("/foo/bar", "/foo/", "/xyz/", "/xyz/bar"),
            ("/foo", "/foo", "/xyz", "/xyz"),
            ("/foo/", "/foo", "/xyz", "/xyz/"),
            ("/foo/bar", "/foo", "", "/bar"),
            ("/foo/", "/foo", "", "/"),
            ("/foo", "/foo", "", "/"),
            ("/foo/", "/foo", "/", "/"),
            ("/foo", "/foo", "/", "/"),
            ("/strip-prefix/three", "/strip-prefix", "/", "/three"),
            ("/a/b", "/", "/x", "/x/a/b"),
        ] {
            assert_eq!(
                replace_prefix(prefix, replacement, path),
                want,
                "{path} {prefix} {replacement}"
            );
        }
    }

    fn redirect(scheme: Option<&str>, hostname: Option<&str>, port: Option<u16>) -> RedirectFilter {
        RedirectFilter {
            scheme: scheme.map(Into::into),
            hostname: hostname.map(Into::into),
            port,
            listener_port: None,
            path: None,
            status: 302,
        }
    }

    #[test]
    fn without_port_and_scheme_the_listeners_port_wins_over_the_hosts() {
        let on = |listener_port: Option<u16>, scheme, host: &str, target| {
            RedirectFilter {
                listener_port,
                ..redirect(scheme, target, None)
            }
            .location("http", host, None, "/p", None)
        };
        let host = Some("example.org");
        assert_eq!(
            on(Some(8080), None, "a.test:9999", host),
            "http://example.org:8080/p"
        );
        assert_eq!(
            on(Some(80), None, "a.test:9999", host),
            "http://example.org/p"
        );
        assert_eq!(
            on(Some(8080), None, "[::1]:9999", None),
            "http://[::1]:8080/p"
        );
        assert_eq!(
            on(Some(8080), None, "127.0.0.1:9999", None),
            "http://127.0.0.1:8080/p"
        );
        // A scheme brings its own well-known port.
        assert_eq!(
            on(Some(8080), Some("https"), "a.test:9999", host),
            "https://example.org/p"
        );
    }

    #[test]
    fn redirect_ports_follow_the_scheme_and_listener_rules() {
        let at = |r: RedirectFilter, scheme: &str, host: &str| {
            r.location(scheme, host, None, "/p", Some("q=1"))
        };
        let host = Some("example.org");
        assert_eq!(
            at(redirect(None, host, None), "http", "10.0.0.1:80"),
            "http://example.org/p?q=1"
        );
        assert_eq!(
            at(redirect(None, host, Some(8080)), "http", "10.0.0.1:80"),
            "http://example.org:8080/p?q=1"
        );
        assert_eq!(
            at(redirect(Some("https"), host, None), "http", "10.0.0.1:8080"),
            "https://example.org/p?q=1"
        );
        assert_eq!(
            at(redirect(None, host, None), "http", "10.0.0.1:8080"),
            "http://example.org:8080/p?q=1"
        );
        assert_eq!(
            at(redirect(None, host, Some(80)), "http", "10.0.0.1:8080"),
            "http://example.org/p?q=1"
        );
        assert_eq!(
            at(redirect(None, None, None), "https", "example.org"),
            "https://example.org/p?q=1"
        );
        assert_eq!(
            at(redirect(Some("http"), None, None), "https", "example.org"),
            "http://example.org/p?q=1"
        );
        assert_eq!(
            at(redirect(None, None, Some(8443)), "https", "example.org"),
            "https://example.org:8443/p?q=1"
        );
        // IPv6 literals keep (or get) their brackets.
        assert_eq!(
            at(redirect(None, None, Some(8083)), "http", "[::1]:8080"),
            "http://[::1]:8083/p?q=1"
        );
        assert_eq!(
            at(
                redirect(None, Some("2001:db8::1"), None),
                "http",
                "[::1]:80"
            ),
            "http://[2001:db8::1]/p?q=1"
        );
        assert_eq!(
            at(redirect(None, None, None), "http", "[::1]:8080"),
            "http://[::1]:8080/p?q=1"
        );
    }

    #[test]
    fn add_joins_values_and_set_replaces_them() {
        let modifier = HeaderModifier {
            set: vec![(
                HeaderName::from_static("x-set"),
                HeaderValue::from_static("s"),
            )],
            add: vec![
                (
                    HeaderName::from_static("x-add"),
                    HeaderValue::from_static("a"),
                ),
                (header::SET_COOKIE, HeaderValue::from_static("c=2")),
            ],
            remove: vec![HeaderName::from_static("x-gone")],
        };
        let mut h = HeaderMap::new();
        h.append("x-set", HeaderValue::from_static("1"));
        h.append("x-set", HeaderValue::from_static("2"));
        h.append("x-add", HeaderValue::from_static("old"));
        h.append("set-cookie", HeaderValue::from_static("c=1"));
        h.append("x-gone", HeaderValue::from_static("v"));
        modifier.apply(&mut h);
        assert_eq!(h.get_all("x-set").iter().collect::<Vec<_>>(), ["s"]);
        assert_eq!(h.get_all("x-add").iter().collect::<Vec<_>>(), ["old,a"]);
        assert_eq!(h.get_all("set-cookie").iter().count(), 2);
        assert!(!h.contains_key("x-gone"));
    }
}
