//! The internals of HTTPRoute and GRPCRoute rules, translated to the dataplane's route model:
//! pure functions (no I/O, no client) from the generated Gateway API types
//! ([`crate::gateway::api`], v1.6.3) to path matches, request conditions, filters and timeouts.
//! Attachment (parents, hostnames, listeners), backendRefs and their weights, and route status
//! are the caller's; what a rule cannot be served with comes back as a [`RuleRefusal`] whose
//! reason and message belong in the route's `Accepted=False` condition. Nothing here panics on
//! any input.
//!
//! For the caller:
//!
//! ```text
//! http_rule(&HttpRouteRules) -> Result<RuleRouting, RuleRefusal>
//! grpc_rule(&GrpcRouteRules) -> Result<RuleRouting, RuleRefusal>
//! http_backend_filters(&[HttpRouteRulesBackendRefsFilters]) -> Result<Option<Filters>, RuleRefusal>
//! grpc_protocol(app_protocol: Option<&str>) -> UpstreamProtocol
//! ```
//!
//! A [`RuleRouting`] holds one [`RuleMatch`] per match of the rule (their OR; a rule without
//! matches gets one, `PathPrefix /`) and the rule's [`Filters`] (header modifiers, redirect,
//! rewrite, timeouts), shared by them all. For each match and each hostname the rule attaches
//! under, the caller makes one `PathRule { matcher: m.path, when: m.when, action }` whose
//! `action.filters` is `routing.filters`; the table orders them as the spec says (path kind and
//! length, then method, then number of headers, then of query parameters, then the older
//! route, then namespace/name; rules of one route keep their order when the caller lists them
//! in order).

use std::sync::Arc;
use std::time::Duration;

use dataplane::filters::{Filters, HeaderModifier, PathModifier, RedirectFilter, UrlRewrite};
use dataplane::request_match::{
    escape, FullRegex, HeaderCondition, HeaderName, HeaderValue, Method, QueryCondition,
    RequestMatch, TextMatch,
};
use dataplane::table::{PathMatch, UpstreamProtocol};

use crate::gateway::api::grpcroutes::{
    GrpcRouteRules, GrpcRouteRulesFilters, GrpcRouteRulesFiltersType, GrpcRouteRulesMatches,
    GrpcRouteRulesMatchesHeadersType, GrpcRouteRulesMatchesMethodType,
};
use crate::gateway::api::httproutes::{
    HttpRouteRules, HttpRouteRulesBackendRefsFilters, HttpRouteRulesBackendRefsFiltersType,
    HttpRouteRulesFilters, HttpRouteRulesFiltersRequestRedirect,
    HttpRouteRulesFiltersRequestRedirectPathType, HttpRouteRulesFiltersRequestRedirectScheme,
    HttpRouteRulesFiltersType, HttpRouteRulesFiltersUrlRewrite,
    HttpRouteRulesFiltersUrlRewritePathType, HttpRouteRulesMatches,
    HttpRouteRulesMatchesHeadersType, HttpRouteRulesMatchesMethod, HttpRouteRulesMatchesPath,
    HttpRouteRulesMatchesPathType, HttpRouteRulesMatchesQueryParamsType, HttpRouteRulesTimeouts,
};

/// `Accepted=False` reason for a value duet does not support (an unknown filter, a bad regex).
pub const UNSUPPORTED_VALUE: &str = "UnsupportedValue";
/// `Accepted=False` reason for filters that cannot go together (`RequestRedirect` and
/// `URLRewrite`, or a filter type twice).
pub const INCOMPATIBLE_FILTERS: &str = "IncompatibleFilters";

/// Why a rule is not served: the route condition's reason and message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{reason}: {message}")]
pub struct RuleRefusal {
    /// [`UNSUPPORTED_VALUE`] or [`INCOMPATIBLE_FILTERS`].
    pub reason: &'static str,
    /// What is wrong, naming the field.
    pub message: String,
}

fn unsupported(message: impl Into<String>) -> RuleRefusal {
    RuleRefusal {
        reason: UNSUPPORTED_VALUE,
        message: message.into(),
    }
}

fn incompatible(message: impl Into<String>) -> RuleRefusal {
    RuleRefusal {
        reason: INCOMPATIBLE_FILTERS,
        message: message.into(),
    }
}

/// One match of a rule: its path match and the conditions beyond it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleMatch {
    /// The path match (`PathPrefix /` when the match names no path).
    pub path: PathMatch,
    /// Method, header, query and regex-path conditions; `None` when there are none.
    pub when: Option<Arc<RequestMatch>>,
}

/// What a rule routes: its matches and its filters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleRouting {
    /// One per match of the rule, in order.
    pub matches: Vec<RuleMatch>,
    /// The rule's filters and timeouts, if any.
    pub filters: Option<Arc<Filters>>,
}

/// Translates an HTTPRoute rule: its matches, filters and timeouts.
pub fn http_rule(rule: &HttpRouteRules) -> Result<RuleRouting, RuleRefusal> {
    let matches = match rule.matches.as_deref() {
        None | Some([]) => vec![http_match(&HttpRouteRulesMatches::default())?],
        Some(list) => list.iter().map(http_match).collect::<Result<_, _>>()?,
    };
    let mut filters = http_filters(rule.filters.as_deref().unwrap_or_default(), &matches)?;
    if let Some(t) = &rule.timeouts {
        set_timeouts(&mut filters, t)?;
    }
    Ok(RuleRouting {
        matches,
        filters: (filters != Filters::default()).then(|| Arc::new(filters)),
    })
}

/// Translates one HTTPRoute match.
pub fn http_match(m: &HttpRouteRulesMatches) -> Result<RuleMatch, RuleRefusal> {
    let (path, path_regex) = http_path(m.path.as_ref())?;
    let mut when = RequestMatch {
        method: m.method.as_ref().map(method),
        path: path_regex,
        ..RequestMatch::default()
    };
    for h in m.headers.iter().flatten() {
        let regex = matches!(
            h.r#type,
            Some(HttpRouteRulesMatchesHeadersType::RegularExpression)
        );
        push_header(&mut when.headers, &h.name, &h.value, regex)?;
    }
    for q in m.query_params.iter().flatten() {
        if q.name.is_empty() {
            return Err(unsupported("query parameter match with an empty name"));
        }
        if when.query.iter().any(|c| *c.name == *q.name) {
            continue; // Only the first condition on a name counts.
        }
        let regex = matches!(
            q.r#type,
            Some(HttpRouteRulesMatchesQueryParamsType::RegularExpression)
        );
        let value = text_match(&q.value, regex, "query parameter")?;
        when.query.push(QueryCondition {
            name: q.name.as_str().into(),
            value,
        });
    }
    Ok(RuleMatch {
        path,
        when: (!when.is_empty()).then(|| Arc::new(when)),
    })
}

fn http_path(
    path: Option<&HttpRouteRulesMatchesPath>,
) -> Result<(PathMatch, Option<FullRegex>), RuleRefusal> {
    let value = path.and_then(|p| p.value.as_deref()).unwrap_or("/");
    let kind = path.and_then(|p| p.r#type.as_ref());
    if let Some(HttpRouteRulesMatchesPathType::RegularExpression) = kind {
        let regex = FullRegex::new(value)
            .map_err(|e| unsupported(format!("path regular expression {value:?}: {e}")))?;
        return Ok((PathMatch::prefix("/"), Some(regex)));
    }
    if !value.starts_with('/') || value.bytes().any(|b| b.is_ascii_control() || b == b' ') {
        return Err(unsupported(format!(
            "path {value:?} is not an absolute path"
        )));
    }
    Ok(match kind {
        Some(HttpRouteRulesMatchesPathType::Exact) => (PathMatch::exact(value), None),
        _ => (PathMatch::prefix(value), None),
    })
}

fn method(m: &HttpRouteRulesMatchesMethod) -> Method {
    use HttpRouteRulesMatchesMethod as M;
    match m {
        M::Get => Method::GET,
        M::Head => Method::HEAD,
        M::Post => Method::POST,
        M::Put => Method::PUT,
        M::Delete => Method::DELETE,
        M::Connect => Method::CONNECT,
        M::Options => Method::OPTIONS,
        M::Trace => Method::TRACE,
        M::Patch => Method::PATCH,
    }
}

fn header_name(name: &str, what: &str) -> Result<HeaderName, RuleRefusal> {
    HeaderName::from_bytes(name.as_bytes())
        .map_err(|_| unsupported(format!("{what} name {name:?} is not a header name")))
}

fn header_value(value: &str, what: &str) -> Result<HeaderValue, RuleRefusal> {
    HeaderValue::from_str(value)
        .map_err(|_| unsupported(format!("{what} value {value:?} is not a header value")))
}

fn text_match(value: &str, regex: bool, what: &str) -> Result<TextMatch, RuleRefusal> {
    if !regex {
        return Ok(TextMatch::Exact(value.into()));
    }
    FullRegex::new(value)
        .map(TextMatch::Regex)
        .map_err(|e| unsupported(format!("{what} regular expression {value:?}: {e}")))
}

/// Adds a header condition unless one on an equivalent name came first (the spec: only the
/// first counts).
fn push_header(
    list: &mut Vec<HeaderCondition>,
    name: &str,
    value: &str,
    regex: bool,
) -> Result<(), RuleRefusal> {
    let name = header_name(name, "header match")?;
    if list.iter().any(|c| c.name == name) {
        return Ok(());
    }
    let value = text_match(value, regex, "header match")?;
    list.push(HeaderCondition { name, value });
    Ok(())
}

/// The rule's filters; `matches` decides whether a prefix replacement is allowed.
fn http_filters(
    list: &[HttpRouteRulesFilters],
    matches: &[RuleMatch],
) -> Result<Filters, RuleRefusal> {
    let mut out = Filters::default();
    for f in list {
        match f.r#type {
            HttpRouteRulesFiltersType::RequestHeaderModifier => {
                let m = f.request_header_modifier.as_ref();
                let modifier = m.map(|m| {
                    modifier(
                        m.set.iter().flatten().map(|h| (&*h.name, &*h.value)),
                        m.add.iter().flatten().map(|h| (&*h.name, &*h.value)),
                        m.remove.iter().flatten(),
                    )
                });
                once(
                    &mut out.request_headers,
                    modifier.transpose()?,
                    "RequestHeaderModifier",
                )?;
            }
            HttpRouteRulesFiltersType::ResponseHeaderModifier => {
                let m = f.response_header_modifier.as_ref();
                let modifier = m.map(|m| {
                    modifier(
                        m.set.iter().flatten().map(|h| (&*h.name, &*h.value)),
                        m.add.iter().flatten().map(|h| (&*h.name, &*h.value)),
                        m.remove.iter().flatten(),
                    )
                });
                once(
                    &mut out.response_headers,
                    modifier.transpose()?,
                    "ResponseHeaderModifier",
                )?;
            }
            HttpRouteRulesFiltersType::RequestRedirect => {
                let r = f.request_redirect.as_ref().map(|r| redirect(r, matches));
                once(&mut out.redirect, r.transpose()?, "RequestRedirect")?;
            }
            HttpRouteRulesFiltersType::UrlRewrite => {
                let r = f.url_rewrite.as_ref().map(|r| rewrite(r, matches));
                once(&mut out.rewrite, r.transpose()?, "URLRewrite")?;
            }
            ref other => {
                return Err(unsupported(format!(
                    "filter type {other:?} is not supported"
                )));
            }
        }
    }
    if out.redirect.is_some() && out.rewrite.is_some() {
        return Err(incompatible("RequestRedirect and URLRewrite on one rule"));
    }
    Ok(out)
}

/// Sets a filter that must appear at most once per rule; a filter of its type without its field
/// is refused.
fn once<T>(slot: &mut Option<T>, value: Option<T>, kind: &str) -> Result<(), RuleRefusal> {
    let Some(value) = value else {
        return Err(unsupported(format!(
            "{kind} filter without its {kind} field"
        )));
    };
    if slot.is_some() {
        return Err(incompatible(format!("{kind} filter given twice")));
    }
    *slot = Some(value);
    Ok(())
}

fn modifier<'a>(
    set: impl Iterator<Item = (&'a str, &'a str)>,
    add: impl Iterator<Item = (&'a str, &'a str)>,
    remove: impl Iterator<Item = &'a String>,
) -> Result<HeaderModifier, RuleRefusal> {
    let pair = |(n, v): (&str, &str)| {
        Ok((
            header_name(n, "header modifier")?,
            header_value(v, "header modifier")?,
        ))
    };
    Ok(HeaderModifier {
        set: set.map(pair).collect::<Result<_, RuleRefusal>>()?,
        add: add.map(pair).collect::<Result<_, RuleRefusal>>()?,
        remove: remove
            .map(|n| header_name(n, "header modifier"))
            .collect::<Result<_, _>>()?,
    })
}

/// A host name a redirect or rewrite may name: DNS characters only (no port, no scheme).
fn hostname(name: &str, what: &str) -> Result<Arc<str>, RuleRefusal> {
    let ok = !name.is_empty()
        && name.len() <= 253
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
    if !ok {
        return Err(unsupported(format!(
            "{what} hostname {name:?} is not a host name"
        )));
    }
    Ok(name.to_ascii_lowercase().into())
}

/// A path replacement; `ReplacePrefixMatch` needs every match of the rule to be a prefix.
fn path_modifier(
    prefix: bool,
    full: Option<&str>,
    replacement: Option<&str>,
    matches: &[RuleMatch],
    what: &str,
) -> Result<PathModifier, RuleRefusal> {
    let value = if prefix { replacement } else { full };
    let Some(value) = value else {
        return Err(unsupported(format!("{what} path without its replacement")));
    };
    if !(value.is_empty() && prefix) && !value.starts_with('/')
        || value
            .bytes()
            .any(|b| b.is_ascii_control() || b == b' ' || b == b'?' || b == b'#')
    {
        return Err(unsupported(format!(
            "{what} path {value:?} is not an absolute path"
        )));
    }
    if !prefix {
        return Ok(PathModifier::Full(value.into()));
    }
    let all_prefixes = matches.iter().all(|m| {
        matches!(m.path, PathMatch::Prefix(_)) && m.when.as_ref().is_none_or(|w| w.path.is_none())
    });
    if !all_prefixes {
        return Err(unsupported(format!(
            "{what} ReplacePrefixMatch needs PathPrefix matches only"
        )));
    }
    Ok(PathModifier::Prefix(value.into()))
}

fn redirect(
    r: &HttpRouteRulesFiltersRequestRedirect,
    matches: &[RuleMatch],
) -> Result<RedirectFilter, RuleRefusal> {
    let status = match r.status_code {
        None => 302,
        Some(code @ (301 | 302 | 303 | 307 | 308)) => code as u16,
        Some(code) => return Err(unsupported(format!("redirect status code {code}"))),
    };
    let port = match r.port {
        None => None,
        Some(p) => Some(
            u16::try_from(p)
                .ok()
                .filter(|p| *p != 0)
                .ok_or_else(|| unsupported(format!("redirect port {p}")))?,
        ),
    };
    let path = match &r.path {
        None => None,
        Some(p) => Some(path_modifier(
            p.r#type == HttpRouteRulesFiltersRequestRedirectPathType::ReplacePrefixMatch,
            p.replace_full_path.as_deref(),
            p.replace_prefix_match.as_deref(),
            matches,
            "redirect",
        )?),
    };
    Ok(RedirectFilter {
        scheme: r.scheme.as_ref().map(|s| match s {
            HttpRouteRulesFiltersRequestRedirectScheme::Http => "http".into(),
            HttpRouteRulesFiltersRequestRedirectScheme::Https => "https".into(),
        }),
        hostname: r
            .hostname
            .as_deref()
            .map(|h| hostname(h, "redirect"))
            .transpose()?,
        port,
        path,
        status,
    })
}

fn rewrite(
    r: &HttpRouteRulesFiltersUrlRewrite,
    matches: &[RuleMatch],
) -> Result<UrlRewrite, RuleRefusal> {
    let host = r
        .hostname
        .as_deref()
        .map(|h| hostname(h, "rewrite"))
        .transpose()?;
    let path = match &r.path {
        None => None,
        Some(p) => Some(path_modifier(
            p.r#type == HttpRouteRulesFiltersUrlRewritePathType::ReplacePrefixMatch,
            p.replace_full_path.as_deref(),
            p.replace_prefix_match.as_deref(),
            matches,
            "rewrite",
        )?),
    };
    Ok(UrlRewrite {
        hostname: host
            .map(|h| header_value(&h, "rewrite hostname"))
            .transpose()?,
        path,
    })
}

fn set_timeouts(filters: &mut Filters, t: &HttpRouteRulesTimeouts) -> Result<(), RuleRefusal> {
    let parse = |v: Option<&str>, what: &str| {
        v.map(|v| {
            gateway_duration(v)
                .ok_or_else(|| unsupported(format!("timeouts.{what} {v:?} is not a duration")))
        })
        .transpose()
        .map(|d| d.filter(|d| !d.is_zero())) // `0s`: no timeout.
    };
    filters.request_timeout = parse(t.request.as_deref(), "request")?;
    filters.backend_timeout = parse(t.backend_request.as_deref(), "backendRequest")?;
    if let (Some(request), Some(backend)) = (filters.request_timeout, filters.backend_timeout) {
        if backend > request {
            return Err(unsupported(
                "timeouts.backendRequest is longer than timeouts.request",
            ));
        }
    }
    Ok(())
}

/// A Gateway API duration (GEP-2257): 1 to 4 parts of 1 to 5 digits with a unit `h`, `m`, `s`
/// or `ms` (`1h30m`, `500ms`, `0s`).
pub fn gateway_duration(text: &str) -> Option<Duration> {
    let mut rest = text;
    let mut total = Duration::ZERO;
    let mut parts = 0;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 || digits > 5 {
            return None;
        }
        let n: u64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let (unit, len) = if rest.starts_with("ms") {
            (Duration::from_millis(1), 2)
        } else {
            match rest.as_bytes().first()? {
                b'h' => (Duration::from_secs(3600), 1),
                b'm' => (Duration::from_secs(60), 1),
                b's' => (Duration::from_secs(1), 1),
                _ => return None,
            }
        };
        rest = &rest[len..];
        total += unit * u32::try_from(n).ok()?;
        parts += 1;
    }
    (parts >= 1 && parts <= 4).then_some(total)
}

/// Per-backendRef filters (Extended: `RequestHeaderModifier`, `ResponseHeaderModifier`); the
/// others are refused.
pub fn http_backend_filters(
    list: &[HttpRouteRulesBackendRefsFilters],
) -> Result<Option<Filters>, RuleRefusal> {
    let mut out = Filters::default();
    for f in list {
        match f.r#type {
            HttpRouteRulesBackendRefsFiltersType::RequestHeaderModifier => {
                let m = f.request_header_modifier.as_ref().map(|m| {
                    modifier(
                        m.set.iter().flatten().map(|h| (&*h.name, &*h.value)),
                        m.add.iter().flatten().map(|h| (&*h.name, &*h.value)),
                        m.remove.iter().flatten(),
                    )
                });
                once(
                    &mut out.request_headers,
                    m.transpose()?,
                    "RequestHeaderModifier",
                )?;
            }
            HttpRouteRulesBackendRefsFiltersType::ResponseHeaderModifier => {
                let m = f.response_header_modifier.as_ref().map(|m| {
                    modifier(
                        m.set.iter().flatten().map(|h| (&*h.name, &*h.value)),
                        m.add.iter().flatten().map(|h| (&*h.name, &*h.value)),
                        m.remove.iter().flatten(),
                    )
                });
                once(
                    &mut out.response_headers,
                    m.transpose()?,
                    "ResponseHeaderModifier",
                )?;
            }
            ref other => {
                return Err(unsupported(format!(
                    "backendRef filter type {other:?} is not supported"
                )));
            }
        }
    }
    Ok((out != Filters::default()).then_some(out))
}

/// Translates a GRPCRoute rule: method matches become paths (`/service/method` exact, `/service`
/// prefix, or a whole-path regex), header matches conditions; header modifier filters.
pub fn grpc_rule(rule: &GrpcRouteRules) -> Result<RuleRouting, RuleRefusal> {
    let matches = match rule.matches.as_deref() {
        None | Some([]) => vec![grpc_match(&GrpcRouteRulesMatches::default())?],
        Some(list) => list.iter().map(grpc_match).collect::<Result<_, _>>()?,
    };
    let filters = grpc_filters(rule.filters.as_deref().unwrap_or_default())?;
    Ok(RuleRouting {
        matches,
        filters: (filters != Filters::default()).then(|| Arc::new(filters)),
    })
}

/// Translates one GRPCRoute match.
pub fn grpc_match(m: &GrpcRouteRulesMatches) -> Result<RuleMatch, RuleRefusal> {
    let (path, path_regex) = grpc_path(m)?;
    let mut when = RequestMatch {
        path: path_regex,
        ..RequestMatch::default()
    };
    for h in m.headers.iter().flatten() {
        let regex = matches!(
            h.r#type,
            Some(GrpcRouteRulesMatchesHeadersType::RegularExpression)
        );
        push_header(&mut when.headers, &h.name, &h.value, regex)?;
    }
    Ok(RuleMatch {
        path,
        when: (!when.is_empty()).then(|| Arc::new(when)),
    })
}

fn grpc_path(m: &GrpcRouteRulesMatches) -> Result<(PathMatch, Option<FullRegex>), RuleRefusal> {
    let Some(method) = &m.method else {
        return Ok((PathMatch::prefix("/"), None));
    };
    let service = method.service.as_deref().filter(|s| !s.is_empty());
    let name = method.method.as_deref().filter(|s| !s.is_empty());
    let regex = matches!(
        method.r#type,
        Some(GrpcRouteRulesMatchesMethodType::RegularExpression)
    );
    if regex {
        let part = |p: Option<&str>| p.unwrap_or("[^/]+").to_owned();
        let pattern = format!("/(?:{})/(?:{})", part(service), part(name));
        let compiled = FullRegex::new(&pattern)
            .map_err(|e| unsupported(format!("method regular expression {pattern:?}: {e}")))?;
        return Ok((PathMatch::prefix("/"), Some(compiled)));
    }
    for part in [service, name].into_iter().flatten() {
        if part
            .bytes()
            .any(|b| b == b'/' || b.is_ascii_control() || b == b' ')
        {
            return Err(unsupported(format!(
                "method match {part:?} is not a gRPC name"
            )));
        }
    }
    Ok(match (service, name) {
        (Some(s), Some(n)) => (PathMatch::exact(&format!("/{s}/{n}")), None),
        (Some(s), None) => (PathMatch::prefix(&format!("/{s}/")), None),
        (None, Some(n)) => {
            let pattern = format!("/[^/]+/{}", escape(n));
            let compiled =
                FullRegex::new(&pattern).map_err(|e| unsupported(format!("method {n:?}: {e}")))?;
            (PathMatch::prefix("/"), Some(compiled))
        }
        (None, None) => (PathMatch::prefix("/"), None),
    })
}

fn grpc_filters(list: &[GrpcRouteRulesFilters]) -> Result<Filters, RuleRefusal> {
    let mut out = Filters::default();
    for f in list {
        match f.r#type {
            GrpcRouteRulesFiltersType::RequestHeaderModifier => {
                let m = f.request_header_modifier.as_ref().map(|m| {
                    modifier(
                        m.set.iter().flatten().map(|h| (&*h.name, &*h.value)),
                        m.add.iter().flatten().map(|h| (&*h.name, &*h.value)),
                        m.remove.iter().flatten(),
                    )
                });
                once(
                    &mut out.request_headers,
                    m.transpose()?,
                    "RequestHeaderModifier",
                )?;
            }
            GrpcRouteRulesFiltersType::ResponseHeaderModifier => {
                let m = f.response_header_modifier.as_ref().map(|m| {
                    modifier(
                        m.set.iter().flatten().map(|h| (&*h.name, &*h.value)),
                        m.add.iter().flatten().map(|h| (&*h.name, &*h.value)),
                        m.remove.iter().flatten(),
                    )
                });
                once(
                    &mut out.response_headers,
                    m.transpose()?,
                    "ResponseHeaderModifier",
                )?;
            }
            ref other => {
                return Err(unsupported(format!(
                    "filter type {other:?} is not supported"
                )));
            }
        }
    }
    Ok(out)
}

/// The protocol to a GRPCRoute backend: the Service port's `appProtocol` when it names one
/// duet knows (as for Ingress), else h2c (gRPC needs HTTP/2).
pub fn grpc_protocol(app_protocol: Option<&str>) -> UpstreamProtocol {
    let named = app_protocol.map(str::trim).filter(|v| !v.is_empty());
    match named.and_then(|v| super::app_protocol(Some(v))) {
        Some(UpstreamProtocol::Http1) | None => UpstreamProtocol::H2c,
        Some(UpstreamProtocol::Https) => UpstreamProtocol::H2,
        Some(other) => other,
    }
}
