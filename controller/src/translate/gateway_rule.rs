//! The internals of HTTPRoute and GRPCRoute rules, translated to the dataplane's route model:
//! pure functions (no I/O, no client) from the generated Gateway API types
//! ([`crate::gateway_api`], v1.6.3) to path matches, request conditions, filters and timeouts.
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
//! http_backend_filters(&[HttpRouteRulesBackendRefsFilters]) -> Result<Option<BackendFilters>, RuleRefusal>
//! RuleRouting::add_backend_filters(&mut self, BackendId, BackendFilters)
//! grpc_protocol(app_protocol: Option<&str>) -> UpstreamProtocol
//! ```
//!
//! A [`RuleRouting`] holds one [`RuleMatch`] per match of the rule (their OR; a rule without
//! matches gets one, `PathPrefix /`) and the rule's [`Filters`] (header modifiers, redirect,
//! rewrite, timeouts), shared by them all, and its `CORS` filter, which the caller puts in the
//! action's `choice`. For each match and each hostname the rule attaches
//! under, the caller makes one `PathRule { matcher: m.path, when: m.when, action }` whose
//! `action.filters` is `routing.filters`; the table orders them as the spec says (path kind and
//! length, then method, then number of headers, then of query parameters, then the older
//! route, then namespace/name; rules of one route keep their order when the caller lists them
//! in order).

use std::sync::Arc;
use std::time::Duration;

use dataplane::filters::{
    BackendFilters, Filters, HeaderModifier, PathModifier, RedirectFilter, UrlRewrite,
};
use dataplane::request_match::{
    escape, FullRegex, HeaderCondition, HeaderName, HeaderValue, Method, QueryCondition,
    RequestMatch, TextMatch,
};
use dataplane::route_policy::{Cors, OriginPattern};
use dataplane::table::{BackendId, PathMatch, UpstreamProtocol};

use crate::gateway_api::grpcroutes::{
    GrpcRouteRules, GrpcRouteRulesFilters, GrpcRouteRulesFiltersType, GrpcRouteRulesMatches,
    GrpcRouteRulesMatchesHeadersType, GrpcRouteRulesMatchesMethodType,
};
use crate::gateway_api::httproutes::{
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
    /// The rule's `CORS` filter, if any (the caller puts it in the action's `choice`).
    pub cors: Option<Arc<Cors>>,
}

impl RuleRouting {
    /// Adds the filters of a backendRef (from [`http_backend_filters`]), applied when `backend`
    /// serves the request.
    pub fn add_backend_filters(&mut self, backend: BackendId, filters: BackendFilters) {
        let mut all = self.filters.as_deref().cloned().unwrap_or_default();
        all.per_backend.push((backend.as_str().into(), filters));
        self.filters = Some(Arc::new(all));
    }
}

/// Translates an HTTPRoute rule: its matches, filters and timeouts.
pub fn http_rule(rule: &HttpRouteRules) -> Result<RuleRouting, RuleRefusal> {
    let matches = match rule.matches.as_deref() {
        None | Some([]) => vec![http_match(&HttpRouteRulesMatches::default())?],
        Some(list) => list.iter().map(http_match).collect::<Result<_, _>>()?,
    };
    let list = rule.filters.as_deref().unwrap_or_default();
    let mut filters = http_filters(list, &matches)?;
    if let Some(t) = &rule.timeouts {
        set_timeouts(&mut filters, t)?;
    }
    Ok(RuleRouting {
        matches,
        filters: (filters != Filters::default()).then(|| Arc::new(filters)),
        cors: http_cors(list)?,
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

/// One `RequestHeaderModifier` or `ResponseHeaderModifier` filter into `slot` (at most one of
/// each): the generated types give every place a filter can be written (rule, backendRef,
/// GRPCRoute) its own struct with the same fields, so this is a macro, not a function.
macro_rules! header_filter {
    ($slot:expr, $written:expr, $kind:literal) => {{
        let m = $written.as_ref().map(|m| {
            modifier(
                $kind,
                m.set.iter().flatten().map(|h| (&*h.name, &*h.value)),
                m.add.iter().flatten().map(|h| (&*h.name, &*h.value)),
                m.remove.iter().flatten(),
            )
        });
        once($slot, m.transpose()?, $kind)?;
    }};
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
                header_filter!(
                    &mut out.request_headers,
                    f.request_header_modifier,
                    "RequestHeaderModifier"
                );
            }
            HttpRouteRulesFiltersType::ResponseHeaderModifier => {
                header_filter!(
                    &mut out.response_headers,
                    f.response_header_modifier,
                    "ResponseHeaderModifier"
                );
            }
            HttpRouteRulesFiltersType::RequestRedirect => {
                let r = f.request_redirect.as_ref().map(|r| redirect(r, matches));
                once(&mut out.redirect, r.transpose()?, "RequestRedirect")?;
            }
            HttpRouteRulesFiltersType::UrlRewrite => {
                let r = f.url_rewrite.as_ref().map(|r| rewrite(r, matches));
                once(&mut out.rewrite, r.transpose()?, "URLRewrite")?;
            }
            // Translated by `http_cors`.
            HttpRouteRulesFiltersType::Cors => {}
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

/// The rule's `CORS` filter, with Gateway API's semantics ([`Cors::gateway`]): `maxAge`
/// defaults to 5 seconds; a `*` among the origins, methods or headers allows them all.
fn http_cors(list: &[HttpRouteRulesFilters]) -> Result<Option<Arc<Cors>>, RuleRefusal> {
    let mut slot = None;
    for f in list
        .iter()
        .filter(|f| f.r#type == HttpRouteRulesFiltersType::Cors)
    {
        once(&mut slot, f.cors.as_ref(), "CORS")?;
    }
    let Some(c) = slot else {
        return Ok(None);
    };
    let written = c.allow_origins.as_deref().unwrap_or_default();
    let origins = if written.iter().any(|o| o == "*") {
        None
    } else {
        let parse = |o: &String| {
            OriginPattern::parse(o).ok_or_else(|| {
                unsupported(format!(
                    "CORS allowOrigins {o:?} is not an origin like https://app.example.com or https://*.example.com"
                ))
            })
        };
        Some(written.iter().map(parse).collect::<Result<Vec<_>, _>>()?)
    };
    let max_age = match c.max_age {
        None => 5,
        Some(s) => {
            u64::try_from(s).map_err(|_| unsupported(format!("CORS maxAge {s} is negative")))?
        }
    };
    Ok(Some(Arc::new(Cors {
        origins,
        methods: cors_tokens("allowMethods", c.allow_methods.as_deref())?.into(),
        headers: cors_tokens("allowHeaders", c.allow_headers.as_deref())?.into(),
        expose: Some(cors_tokens("exposeHeaders", c.expose_headers.as_deref())?)
            .filter(|e| !e.is_empty())
            .map(Into::into),
        credentials: c.allow_credentials.unwrap_or(false),
        max_age,
        gateway: true,
    })))
}

/// A CORS list of methods or header names as a header value (`*` when the list has it).
fn cors_tokens(what: &str, values: Option<&[String]>) -> Result<String, RuleRefusal> {
    let values = values.unwrap_or_default();
    if values.iter().any(|v| v == "*") {
        return Ok("*".to_owned());
    }
    let token = |v: &String| {
        !v.is_empty()
            && v.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
    };
    if let Some(bad) = values.iter().find(|v| !token(v)) {
        return Err(unsupported(format!("CORS {what} {bad:?} is not a token")));
    }
    Ok(values.join(", "))
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
    kind: &str,
    set: impl Iterator<Item = (&'a str, &'a str)>,
    add: impl Iterator<Item = (&'a str, &'a str)>,
    remove: impl Iterator<Item = &'a String>,
) -> Result<HeaderModifier, RuleRefusal> {
    let pair = |(n, v): (&str, &str)| Ok((editable(n, kind)?, header_value(v, "header modifier")?));
    Ok(HeaderModifier {
        set: set.map(pair).collect::<Result<_, RuleRefusal>>()?,
        add: add.map(pair).collect::<Result<_, RuleRefusal>>()?,
        remove: remove
            .map(|n| editable(n, kind))
            .collect::<Result<_, _>>()?,
    })
}

/// A header name a modifier may set, add or remove: not `Host` (a rule changes it with
/// `URLRewrite`'s `hostname`, which is validated as a host name), nor a framing or hop-by-hop
/// header, which duet writes itself on each hop (a filter's `Transfer-Encoding` or
/// `Content-Length` would frame the body one way for duet and another for the peer).
fn editable(name: &str, kind: &str) -> Result<HeaderName, RuleRefusal> {
    let name = header_name(name, "header modifier")?;
    if name.as_str() == "host" {
        return Err(unsupported(format!(
            "{kind} cannot name Host: a URLRewrite filter's hostname sets the Host sent upstream"
        )));
    }
    if dataplane::upstream::is_hop_or_framing(name.as_str()) {
        return Err(unsupported(format!(
            "{kind} cannot name {name}: a hop-by-hop or framing header, which duet writes itself"
        )));
    }
    Ok(name)
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
    // An empty prefix replacement is allowed (it removes the prefix).
    let absolute = value.starts_with('/') || (prefix && value.is_empty());
    let clean = !value
        .bytes()
        .any(|b| b.is_ascii_control() || b == b' ' || b == b'?' || b == b'#');
    if !absolute || !clean {
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
        listener_port: None,
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
    (1..=4).contains(&parts).then_some(total)
}

/// Per-backendRef filters (Extended: `RequestHeaderModifier`, `ResponseHeaderModifier`); the
/// others are refused.
pub fn http_backend_filters(
    list: &[HttpRouteRulesBackendRefsFilters],
) -> Result<Option<BackendFilters>, RuleRefusal> {
    let mut out = BackendFilters::default();
    for f in list {
        match f.r#type {
            HttpRouteRulesBackendRefsFiltersType::RequestHeaderModifier => {
                header_filter!(
                    &mut out.request_headers,
                    f.request_header_modifier,
                    "RequestHeaderModifier"
                );
            }
            HttpRouteRulesBackendRefsFiltersType::ResponseHeaderModifier => {
                header_filter!(
                    &mut out.response_headers,
                    f.response_header_modifier,
                    "ResponseHeaderModifier"
                );
            }
            ref other => {
                return Err(unsupported(format!(
                    "backendRef filter type {other:?} is not supported"
                )));
            }
        }
    }
    Ok((out != BackendFilters::default()).then_some(out))
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
        cors: None,
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
                header_filter!(
                    &mut out.request_headers,
                    f.request_header_modifier,
                    "RequestHeaderModifier"
                );
            }
            GrpcRouteRulesFiltersType::ResponseHeaderModifier => {
                header_filter!(
                    &mut out.response_headers,
                    f.response_header_modifier,
                    "ResponseHeaderModifier"
                );
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

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(yaml: &str) -> HttpRouteRules {
        serde_saphyr::from_str(yaml).unwrap()
    }

    fn refused(yaml: &str) -> RuleRefusal {
        match http_rule(&rule(yaml)) {
            Ok(routing) => panic!("accepted {yaml}: {routing:?}"),
            Err(refusal) => refusal,
        }
    }

    #[test]
    fn a_named_rule_is_served_like_any_other() {
        let named = http_rule(&rule(
            "name: named-rule\nmatches: [{path: {type: PathPrefix, value: /named}}]",
        ));
        let routing = named.expect("a rule name is accepted");
        assert_eq!(routing.matches[0].path, PathMatch::prefix("/named"));
    }

    #[test]
    fn the_cors_filter_takes_gateway_api_semantics() {
        let cors = |yaml: &str| {
            let routing = http_rule(&rule(&format!("filters: [{{type: CORS, cors: {yaml}}}]")));
            routing.unwrap().cors.expect("a CORS filter")
        };
        let c = cors("{allowOrigins: ['https://www.foo.com', 'https://*.bar.com'], allowMethods: [GET, OPTIONS], allowHeaders: [x-a, x-b], exposeHeaders: [x-c], allowCredentials: true, maxAge: 3600}");
        assert!(c.gateway);
        assert_eq!(c.origins.as_ref().map(Vec::len), Some(2));
        assert_eq!((&*c.methods, &*c.headers), ("GET, OPTIONS", "x-a, x-b"));
        assert_eq!(c.expose.as_deref(), Some("x-c"));
        assert!(c.credentials);
        assert_eq!(c.max_age, 3600);
        // `*` allows every origin, method and header; maxAge defaults to 5 s; no credentials.
        let any = cors("{allowOrigins: ['*', 'https://a.test'], allowMethods: ['*'], allowHeaders: [x-a, '*']}");
        assert_eq!(any.origins, None);
        assert_eq!((&*any.methods, &*any.headers), ("*", "*"));
        assert_eq!(
            (any.expose.clone(), any.credentials, any.max_age),
            (None, false, 5)
        );
        // No origins: none is allowed.
        assert_eq!(cors("{}").origins, Some(Vec::new()));
    }

    #[test]
    fn matches_become_paths_and_conditions() {
        let routing = http_rule(&rule(
            r#"
matches:
- path: {type: Exact, value: /a}
  method: PATCH
  headers: [{name: X-A, value: "1"}, {name: x-a, value: "2"}, {name: B, type: RegularExpression, value: "b+"}]
  queryParams: [{name: q, value: "1"}, {name: q, value: "2"}]
- path: {type: RegularExpression, value: "/v[0-9]+/.*"}
- {}
"#,
        ))
        .unwrap();
        assert_eq!(routing.filters, None);
        let [first, regex, all] = &routing.matches[..] else {
            panic!("{routing:?}")
        };
        assert_eq!(first.path, PathMatch::exact("/a"));
        let when = first.when.as_deref().unwrap();
        assert_eq!(when.method, Some(Method::PATCH));
        // Only the first condition on a name counts (header names case-insensitive).
        assert_eq!(when.headers.len(), 2);
        assert_eq!(when.headers[0].value, TextMatch::Exact("1".into()));
        assert_eq!(when.query.len(), 1);
        assert_eq!(when.query[0].value, TextMatch::Exact("1".into()));
        assert_eq!(regex.path, PathMatch::prefix("/"));
        let path = regex.when.as_deref().and_then(|w| w.path.as_ref()).unwrap();
        assert!(path.is_match("/v2/x") && !path.is_match("/v2"));
        assert_eq!(
            *all,
            RuleMatch {
                path: PathMatch::prefix("/"),
                when: None
            }
        );
        // No matches at all: every path.
        let bare = http_rule(&rule("backendRefs: [{name: s, port: 80}]")).unwrap();
        assert_eq!(
            bare.matches,
            [RuleMatch {
                path: PathMatch::prefix("/"),
                when: None
            }]
        );
    }

    #[test]
    fn filters_and_timeouts_translate() {
        let routing = http_rule(&rule(
            r#"
matches: [{path: {type: PathPrefix, value: /p/}}]
filters:
- type: RequestHeaderModifier
  requestHeaderModifier: {set: [{name: X-S, value: s}], add: [{name: X-A, value: a}], remove: [X-R]}
- type: ResponseHeaderModifier
  responseHeaderModifier: {remove: [Server]}
- type: URLRewrite
  urlRewrite: {hostname: Example.ORG, path: {type: ReplacePrefixMatch, replacePrefixMatch: /q}}
timeouts: {request: 1m30s, backendRequest: 500ms}
"#,
        ))
        .unwrap();
        let f = routing.filters.as_deref().unwrap();
        let req = f.request_headers.as_ref().unwrap();
        assert_eq!(req.set[0].0.as_str(), "x-s");
        assert_eq!(req.remove[0].as_str(), "x-r");
        assert_eq!(
            f.response_headers.as_ref().unwrap().remove[0].as_str(),
            "server"
        );
        let rewrite = f.rewrite.as_ref().unwrap();
        assert_eq!(rewrite.hostname.as_ref().unwrap(), "example.org");
        assert_eq!(rewrite.path, Some(PathModifier::Prefix("/q".into())));
        assert_eq!(f.request_timeout, Some(Duration::from_secs(90)));
        assert_eq!(f.backend_timeout, Some(Duration::from_millis(500)));
        let redirect = http_rule(&rule(
            "filters: [{type: RequestRedirect, requestRedirect: {scheme: https, port: 8443}}]",
        ))
        .unwrap();
        let r = redirect
            .filters
            .as_deref()
            .unwrap()
            .redirect
            .clone()
            .unwrap();
        assert_eq!(
            (r.scheme.as_deref(), r.port, r.status),
            (Some("https"), Some(8443), 302)
        );
        // `0s` turns the timeout off.
        let off = http_rule(&rule("timeouts: {request: 0s}")).unwrap();
        assert_eq!(off.filters, None);
    }

    #[test]
    fn hostile_values_are_refused_with_a_reason() {
        for (yaml, reason, says) in [
            ("matches: [{headers: [{name: x, type: RegularExpression, value: '(['}]}]", UNSUPPORTED_VALUE, "regular expression"),
            ("matches: [{headers: [{name: x, type: RegularExpression, value: '(?!a)'}]}]", UNSUPPORTED_VALUE, "regular expression"),
            ("matches: [{headers: [{name: x, type: RegularExpression, value: 'a{1000}{1000}'}]}]", UNSUPPORTED_VALUE, "regular expression"),
            ("matches: [{queryParams: [{name: q, type: RegularExpression, value: '*'}]}]", UNSUPPORTED_VALUE, "regular expression"),
            ("matches: [{path: {type: RegularExpression, value: '/(a'}}]", UNSUPPORTED_VALUE, "path regular expression"),
            ("matches: [{path: {type: PathPrefix, value: 'no-slash'}}]", UNSUPPORTED_VALUE, "absolute path"),
            ("matches: [{headers: [{name: 'bad name', value: v}]}]", UNSUPPORTED_VALUE, "not a header name"),
            ("matches: [{headers: [{name: \"x\\r\\ny\", value: v}]}]", UNSUPPORTED_VALUE, "not a header name"),
            ("matches: [{queryParams: [{name: '', value: v}]}]", UNSUPPORTED_VALUE, "empty name"),
            ("filters: [{type: RequestHeaderModifier, requestHeaderModifier: {set: [{name: 'a:b', value: v}]}}]", UNSUPPORTED_VALUE, "not a header name"),
            ("filters: [{type: RequestHeaderModifier, requestHeaderModifier: {add: [{name: x, value: \"v\\nInjected: 1\"}]}}]", UNSUPPORTED_VALUE, "not a header value"),
            ("filters: [{type: ResponseHeaderModifier, responseHeaderModifier: {remove: ['']}}]", UNSUPPORTED_VALUE, "not a header name"),
            ("filters: [{type: RequestRedirect, requestRedirect: {statusCode: 200}}]", UNSUPPORTED_VALUE, "status code 200"),
            ("filters: [{type: RequestRedirect, requestRedirect: {statusCode: -301}}]", UNSUPPORTED_VALUE, "status code"),
            ("filters: [{type: RequestRedirect, requestRedirect: {statusCode: 9223372036854775807}}]", UNSUPPORTED_VALUE, "status code"),
            ("filters: [{type: RequestRedirect, requestRedirect: {port: 0}}]", UNSUPPORTED_VALUE, "port 0"),
            ("filters: [{type: RequestRedirect, requestRedirect: {port: 70000}}]", UNSUPPORTED_VALUE, "port 70000"),
            ("filters: [{type: RequestRedirect, requestRedirect: {hostname: 'evil.test/x'}}]", UNSUPPORTED_VALUE, "not a host name"),
            ("filters: [{type: URLRewrite, urlRewrite: {hostname: 'a b'}}]", UNSUPPORTED_VALUE, "not a host name"),
            ("filters: [{type: URLRewrite, urlRewrite: {path: {type: ReplaceFullPath, replaceFullPath: 'x'}}}]", UNSUPPORTED_VALUE, "absolute path"),
            ("filters: [{type: URLRewrite, urlRewrite: {path: {type: ReplaceFullPath, replaceFullPath: '/a?b'}}}]", UNSUPPORTED_VALUE, "absolute path"),
            ("filters: [{type: URLRewrite, urlRewrite: {path: {type: ReplaceFullPath}}}]", UNSUPPORTED_VALUE, "without its replacement"),
            ("filters: [{type: URLRewrite}]", UNSUPPORTED_VALUE, "without its URLRewrite"),
            ("matches: [{path: {type: Exact, value: /a}}]\nfilters: [{type: URLRewrite, urlRewrite: {path: {type: ReplacePrefixMatch, replacePrefixMatch: /b}}}]", UNSUPPORTED_VALUE, "PathPrefix matches only"),
            ("filters: [{type: RequestMirror, requestMirror: {backendRef: {name: m, port: 80}}}]", UNSUPPORTED_VALUE, "RequestMirror"),
            ("filters: [{type: ExtensionRef, extensionRef: {group: g, kind: K, name: n}}]", UNSUPPORTED_VALUE, "ExtensionRef"),
            ("filters: [{type: CORS}]", UNSUPPORTED_VALUE, "without its CORS"),
            ("filters: [{type: CORS, cors: {}}, {type: CORS, cors: {}}]", INCOMPATIBLE_FILTERS, "twice"),
            ("filters: [{type: CORS, cors: {allowOrigins: ['example.com']}}]", UNSUPPORTED_VALUE, "allowOrigins"),
            ("filters: [{type: CORS, cors: {allowOrigins: ['https://a.test/path']}}]", UNSUPPORTED_VALUE, "allowOrigins"),
            ("filters: [{type: CORS, cors: {allowHeaders: ['x y']}}]", UNSUPPORTED_VALUE, "allowHeaders"),
            ("filters: [{type: CORS, cors: {allowMethods: [\"GET\\r\\nX: 1\"]}}]", UNSUPPORTED_VALUE, "allowMethods"),
            ("filters: [{type: CORS, cors: {exposeHeaders: ['a,b']}}]", UNSUPPORTED_VALUE, "exposeHeaders"),
            ("filters: [{type: CORS, cors: {maxAge: -1}}]", UNSUPPORTED_VALUE, "maxAge"),
            ("filters: [{type: URLRewrite, urlRewrite: {hostname: a.test}}, {type: RequestRedirect, requestRedirect: {}}]", INCOMPATIBLE_FILTERS, "RequestRedirect and URLRewrite"),
            ("filters: [{type: ResponseHeaderModifier, responseHeaderModifier: {}}, {type: ResponseHeaderModifier, responseHeaderModifier: {}}]", INCOMPATIBLE_FILTERS, "twice"),
            ("timeouts: {request: 1x}", UNSUPPORTED_VALUE, "timeouts.request"),
            ("timeouts: {request: 100000s}", UNSUPPORTED_VALUE, "timeouts.request"),
            ("timeouts: {backendRequest: 1h1m1s1ms1h}", UNSUPPORTED_VALUE, "timeouts.backendRequest"),
            ("timeouts: {request: 1s, backendRequest: 2s}", UNSUPPORTED_VALUE, "longer"),
        ] {
            let refusal = refused(yaml);
            assert_eq!(refusal.reason, reason, "{yaml}: {refusal}");
            assert!(refusal.message.contains(says), "{yaml}: {refusal}");
        }
    }

    #[test]
    fn gateway_durations() {
        for (text, ms) in [
            ("0s", 0),
            ("500ms", 500),
            ("1h", 3_600_000),
            ("1m30s", 90_000),
            ("99999ms", 99_999),
            ("1h2m3s4ms", 3_723_004),
        ] {
            assert_eq!(
                gateway_duration(text),
                Some(Duration::from_millis(ms)),
                "{text}"
            );
        }
        for bad in [
            "",
            "1",
            "s",
            "1.5s",
            "-1s",
            "1d",
            "100000s",
            "1s1s1s1s1s",
            "1 s",
            "1S",
        ] {
            assert_eq!(gateway_duration(bad), None, "{bad:?}");
        }
    }

    fn grpc(yaml: &str) -> Result<RuleRouting, RuleRefusal> {
        grpc_rule(&serde_saphyr::from_str(yaml).unwrap())
    }

    #[test]
    fn grpc_methods_become_paths() {
        let routing = grpc(
            r#"
matches:
- method: {service: pkg.Svc, method: Get}
- method: {service: pkg.Svc}
- method: {method: Get}
- method: {type: RegularExpression, service: "pkg\\..*"}
- headers: [{name: version, value: two}]
filters: [{type: RequestHeaderModifier, requestHeaderModifier: {add: [{name: x, value: y}]}}]
"#,
        )
        .unwrap();
        let paths: Vec<&PathMatch> = routing.matches.iter().map(|m| &m.path).collect();
        assert_eq!(paths[0], &PathMatch::exact("/pkg.Svc/Get"));
        assert_eq!(paths[1], &PathMatch::prefix("/pkg.Svc"));
        let regex = |i: usize| {
            routing.matches[i]
                .when
                .as_deref()
                .and_then(|w| w.path.clone())
                .unwrap()
        };
        assert!(regex(2).is_match("/a.B/Get") && !regex(2).is_match("/a.B/GetX"));
        assert!(regex(3).is_match("/pkg.S/M") && !regex(3).is_match("/other.S/M"));
        assert_eq!(routing.matches[4].when.as_deref().unwrap().headers.len(), 1);
        assert!(routing
            .filters
            .as_deref()
            .unwrap()
            .request_headers
            .is_some());
        for bad in [
            "matches: [{method: {service: 'a/b', method: M}}]",
            "matches: [{method: {type: RegularExpression, method: '(('}}]",
            "matches: [{headers: [{name: 'x y', value: v}]}]",
            "filters: [{type: RequestMirror, requestMirror: {backendRef: {name: m, port: 80}}}]",
        ] {
            let refusal = grpc(bad).unwrap_err();
            assert_eq!(refusal.reason, UNSUPPORTED_VALUE, "{bad}");
        }
        assert_eq!(grpc_protocol(None), UpstreamProtocol::H2c);
        assert_eq!(
            grpc_protocol(Some("kubernetes.io/h2c")),
            UpstreamProtocol::H2c
        );
        assert_eq!(grpc_protocol(Some("h2")), UpstreamProtocol::H2);
        assert_eq!(grpc_protocol(Some("https")), UpstreamProtocol::H2);
        assert_eq!(grpc_protocol(Some("something-else")), UpstreamProtocol::H2c);
    }

    #[test]
    fn backend_ref_filters_allow_header_modifiers_only() {
        let parse = |yaml: &str| -> Vec<HttpRouteRulesBackendRefsFilters> {
            serde_saphyr::from_str(yaml).unwrap()
        };
        let ok = http_backend_filters(&parse(
            "[{type: RequestHeaderModifier, requestHeaderModifier: {set: [{name: x, value: y}]}}]",
        ))
        .unwrap()
        .unwrap();
        assert!(ok.request_headers.is_some());
        assert_eq!(http_backend_filters(&[]).unwrap(), None);
        let refusal = http_backend_filters(&parse(
            "[{type: RequestRedirect, requestRedirect: {hostname: a.test}}]",
        ))
        .unwrap_err();
        assert_eq!(refusal.reason, UNSUPPORTED_VALUE);
    }

    /// The headers no modifier may name, as users may spell them.
    const RESERVED: [&str; 10] = [
        "Transfer-Encoding",
        "content-length",
        "Connection",
        "Keep-Alive",
        "Proxy-Connection",
        "TE",
        "Trailer",
        "Upgrade",
        "HTTP2-Settings",
        "Host",
    ];

    #[test]
    fn modifiers_naming_hop_by_hop_framing_or_host_headers_are_refused() {
        let field = |op: &str, name: &str| match op {
            "remove" => format!("{{remove: [{name}]}}"),
            _ => format!("{{{op}: [{{name: {name}, value: x}}]}}"),
        };
        for name in RESERVED {
            let says = format!("cannot name {}", name.to_ascii_lowercase());
            let says = if name == "Host" {
                "cannot name Host"
            } else {
                &says
            };
            for op in ["set", "add", "remove"] {
                let f = field(op, name);
                let req = format!("[{{type: RequestHeaderModifier, requestHeaderModifier: {f}}}]");
                let res =
                    format!("[{{type: ResponseHeaderModifier, responseHeaderModifier: {f}}}]");
                for list in [&req, &res] {
                    let refusals = [
                        refused(&format!("filters: {list}")),
                        grpc(&format!("filters: {list}")).unwrap_err(),
                        http_backend_filters(&serde_saphyr::from_str::<Vec<_>>(list).unwrap())
                            .unwrap_err(),
                    ];
                    for refusal in refusals {
                        assert_eq!(refusal.reason, UNSUPPORTED_VALUE, "{list}");
                        assert!(refusal.message.contains(says), "{list}: {refusal}");
                    }
                }
            }
        }
        // End-to-end headers stay editable, Proxy-Authorization included (RFC 9110 lets a proxy
        // relay it).
        let ok = "filters: [{type: RequestHeaderModifier, requestHeaderModifier: {set: [{name: Proxy-Authorization, value: x}], add: [{name: X-Host, value: y}], remove: [Forwarded]}}]";
        assert!(http_rule(&rule(ok)).unwrap().filters.is_some());
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_strings_never_panic(name in ".{0,12}", value in ".{0,24}", number in proptest::num::i64::ANY) {
            let q = |s: &str| serde_json::to_string(s).unwrap();
            let yaml = format!(
                "matches: [{{path: {{type: RegularExpression, value: {v}}}, headers: [{{name: {n}, type: RegularExpression, value: {v}}}], queryParams: [{{name: {n}, value: {v}}}]}}]\n\
                 filters: [{{type: RequestRedirect, requestRedirect: {{hostname: {v}, statusCode: {number}, path: {{type: ReplaceFullPath, replaceFullPath: {v}}}}}}}, \
                 {{type: RequestHeaderModifier, requestHeaderModifier: {{set: [{{name: {n}, value: {v}}}]}}}}]\n\
                 timeouts: {{request: {v}}}",
                n = q(&name), v = q(&value),
            );
            if let Ok(r) = serde_saphyr::from_str::<HttpRouteRules>(&yaml) {
                let _ = http_rule(&r);
            }
            let grpc_yaml = format!(
                "matches: [{{method: {{type: RegularExpression, service: {v}, method: {n}}}}}, {{method: {{service: {n}, method: {v}}}}}]",
                n = q(&name), v = q(&value),
            );
            if let Ok(r) = serde_saphyr::from_str::<GrpcRouteRules>(&grpc_yaml) {
                let _ = grpc_rule(&r);
            }
        }
    }
}
