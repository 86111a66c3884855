//! Phase 2 of a request, admit: the route's request policies, run in order as a list of checks
//! ([`admit`]). Each may let the request go on, answer it (a redirect) or refuse it (an error).
//! The order is nginx's: its rewrite phase (redirect annotations, `rewrite-target`, the CORS
//! preflight, the HTTPS redirect), then its access phase (source ranges), then the body limit. A
//! new per-route policy (an annotation) is one more function in the list. Last, the route's
//! access policy ([`access`]: limits, basic and external auth), the one check that may wait (on
//! the auth service).

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode, Uri};

use super::body::ProxyBody;
use super::Routed;
use crate::conn::ConnInfo;
use crate::error::ProxyError;
use crate::observe::Exchange;
use crate::policy::{Client, Gate};
use crate::runtime::ProxyConfig;
use crate::table::{Refusal, Rewritten};

static X_FORWARDED_PREFIX: HeaderName = HeaderName::from_static("x-forwarded-prefix");

/// Why a check stops a request: it answers it (a redirect) or refuses it (an error).
#[derive(Debug)]
pub(crate) enum Stop {
    /// Answer with this (boxed: the request path moves only a pointer through the checks).
    Answer(Box<Response<ProxyBody>>),
    /// Refuse with this error.
    Refuse(ProxyError),
}

impl From<ProxyError> for Stop {
    fn from(error: ProxyError) -> Stop {
        Stop::Refuse(error)
    }
}

/// What a check decides: `Ok(())` lets the request go on.
pub(crate) type Verdict = Result<(), Stop>;

fn answer(response: Response<ProxyBody>) -> Verdict {
    Err(Stop::Answer(Box::new(response)))
}

/// What a check sees: the routed request (which it may change, as `rewrite-target` does), the
/// request headers, the connection and the proxy's settings.
pub(crate) struct Admission<'r, 'a> {
    /// The request and its route.
    pub routed: &'r mut Routed<'a>,
    /// The request headers.
    pub headers: &'r mut HeaderMap,
    /// The client connection.
    pub conn: &'r ConnInfo,
    /// The proxy's settings.
    pub config: &'r ProxyConfig,
}

/// Runs the route's checks in order until one answers or refuses: the list of request policies.
/// A new per-route policy is one more function, and one more line here.
pub(crate) fn admit(a: &mut Admission<'_, '_>) -> Verdict {
    strip_client_certificate_headers(a.headers);
    client_certificate(a)?;
    gateway_filters(a)?;
    redirect(a)?;
    rewrite_target(a)?;
    cors_preflight(a)?;
    https_redirect(a)?;
    source_ranges(a)?;
    body_limit(a)
}

/// Gateway API `RequestRedirect` (answers) and `URLRewrite`'s path (the upstream target); its
/// `Host` and the header modifiers apply to the upstream request ([`crate::filters::Filters`]).
fn gateway_filters(a: &mut Admission<'_, '_>) -> Verdict {
    let routed = &mut *a.routed;
    let Some(filters) = routed.matched.action.filters.as_deref() else {
        return Ok(());
    };
    let matched = routed
        .matched
        .matcher
        .and_then(crate::table::PathMatch::literal);
    let target = &routed.target;
    if let Some(r) = &filters.redirect {
        let scheme = crate::forwarded::request_scheme(a.headers, a.conn);
        let host = routed.host.as_str();
        let location = r.location(scheme, host, matched, target.path(), target.query());
        let status = StatusCode::from_u16(r.status).unwrap_or(StatusCode::FOUND);
        if HeaderValue::from_str(&location).is_err() {
            return Err(Stop::Refuse(ProxyError::BadRewrite));
        }
        return answer(ProxyBody::redirect(status, &location));
    }
    let rewrite = filters.rewrite.as_ref();
    if let Some(rewritten) = rewrite.and_then(|r| r.target(matched, target.path(), target.query()))
    {
        let uri = Uri::try_from(rewritten).map_err(|_| Stop::Refuse(ProxyError::BadRewrite))?;
        routed.upstream_target = Some(uri);
    }
    Ok(())
}

/// The names of the headers that carry a client certificate's facts upstream: only duet writes
/// them ([`client_certificate`]), from the connection's verified certificate.
const CLIENT_CERTIFICATE_PREFIX: &str = "ssl-client-";

/// Removes every `ssl-client-*` header the client sent, on every route of every listener and
/// before any check may let the request go on, so that a backend can trust them whenever they
/// arrive. One pass over the names; the common request, which has none, allocates nothing.
fn strip_client_certificate_headers(headers: &mut HeaderMap) {
    let forged = |name: &&HeaderName| name.as_str().starts_with(CLIENT_CERTIFICATE_PREFIX);
    if !headers.keys().any(|name| forged(&name)) {
        return;
    }
    let names: Vec<HeaderName> = headers.keys().filter(forged).cloned().collect();
    for name in names {
        headers.remove(name);
    }
}

/// ingress-nginx's `auth-tls-*`, first (nginx checks the certificate before its phases): the
/// connection's client certificate against the route's CA ([`ClientAuth::decide`]); duet's
/// `ssl-client-*` headers go upstream (the client's own are gone already). A Host other than the TLS server name gets 421
/// (the certificate was asked for by that name's settings); plain HTTP counts as no certificate,
/// unless the HTTPS redirect answers it.
///
/// [`ClientAuth::decide`]: crate::client_auth::ClientAuth::decide
fn client_certificate(a: &mut Admission<'_, '_>) -> Verdict {
    use crate::client_auth::Decision;
    let Some(auth) = a.routed.matched.action.client_auth.as_deref() else {
        return Ok(());
    };
    if !a.conn.tls && a.routed.matched.action.redirect_https {
        return Ok(());
    }
    let host = crate::table::strip_port(a.routed.host.as_str());
    let host = host.strip_suffix('.').unwrap_or(host);
    if a.conn.tls
        && !a
            .conn
            .sni
            .as_deref()
            .is_some_and(|s| s.eq_ignore_ascii_case(host))
    {
        return local(StatusCode::MISDIRECTED_REQUEST, "421 Misdirected Request\n");
    }
    match auth.decide(&a.conn.client_certs) {
        Decision::Pass(headers) => {
            for (name, value) in headers {
                if let Ok(value) = HeaderValue::from_str(&value) {
                    a.headers.insert(HeaderName::from_static(name), value);
                }
            }
            Ok(())
        }
        Decision::BadRequest(text) => local(StatusCode::BAD_REQUEST, text),
        Decision::Forbidden => local(StatusCode::FORBIDDEN, crate::client_auth::FORBIDDEN),
        Decision::Redirect(page) => answer(ProxyBody::redirect(StatusCode::FOUND, &page)),
        Decision::Unavailable => local(
            StatusCode::SERVICE_UNAVAILABLE,
            "503 this route's client certificate settings are invalid\n",
        ),
    }
}

/// A plain-text answer of duet's own.
fn local(status: StatusCode, text: &'static str) -> Verdict {
    let mut res = Response::new(ProxyBody::full(Bytes::from_static(text.as_bytes())));
    *res.status_mut() = status;
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    answer(res)
}

/// ingress-nginx's redirect annotations (`permanent-redirect`, `app-root`, …).
fn redirect(a: &mut Admission<'_, '_>) -> Verdict {
    let Some(r) = a.routed.matched.action.redirect.as_deref() else {
        return Ok(());
    };
    let scheme = crate::forwarded::request_scheme(a.headers, a.conn);
    let host = a.routed.host.as_str();
    let target = a
        .routed
        .target
        .path_and_query()
        .map_or("/", |pq| pq.as_str());
    let Some((code, location)) = r.answer(target, scheme, host) else {
        return Ok(());
    };
    // A status or Location that cannot be sent redirects nothing.
    let (Ok(status), Ok(_)) = (StatusCode::from_u16(code), HeaderValue::from_str(&location)) else {
        return Ok(());
    };
    answer(ProxyBody::redirect(status, &location))
}

/// `rewrite-target`: a new upstream target (with `X-Forwarded-Prefix` when the route says so), or
/// a 302 for a full-URL target. It answers before the HTTPS redirect (nginx's rewrite module runs
/// before ingress-nginx's Lua redirect); that one keeps the path as received.
fn rewrite_target(a: &mut Admission<'_, '_>) -> Verdict {
    let routed = &mut *a.routed;
    let (Some(rewrite), Some(matcher)) = (&routed.matched.action.rewrite, routed.matched.matcher)
    else {
        return Ok(());
    };
    let target = &routed.target;
    match rewrite.apply(matcher, target.path(), target.query()) {
        Rewritten::Redirect(location) => answer(ProxyBody::redirect(StatusCode::FOUND, &location)),
        Rewritten::Target(rewritten) => {
            let uri = Uri::try_from(rewritten).map_err(|_| Stop::Refuse(ProxyError::BadRewrite))?;
            if let Some(v) = rewrite
                .forwarded_prefix
                .as_deref()
                .and_then(|p| HeaderValue::from_str(p).ok())
            {
                a.headers.insert(X_FORWARDED_PREFIX.clone(), v);
            }
            routed.upstream_target = Some(uri);
            Ok(())
        }
    }
}

/// A CORS preflight on a route with `enable-cors` is answered 204 with the CORS headers, before
/// the HTTPS redirect, source ranges and access policy (as ingress-nginx's `OPTIONS` block).
fn cors_preflight(a: &mut Admission<'_, '_>) -> Verdict {
    let Some(headers) = a.routed.preflight.take() else {
        return Ok(());
    };
    let mut res = Response::new(ProxyBody::full(Bytes::new()));
    *res.status_mut() = StatusCode::NO_CONTENT;
    *res.headers_mut() = *headers;
    answer(res)
}

/// The 308 to HTTPS of a plain-HTTP request for a TLS host, to the HTTPS port of the client's
/// family.
fn https_redirect(a: &mut Admission<'_, '_>) -> Verdict {
    let routed = &a.routed;
    if !routed.matched.action.redirect_https
        || crate::forwarded::request_scheme(a.headers, a.conn) == "https"
    {
        return Ok(());
    }
    let port = a.config.https_port(a.conn.family);
    let path = routed.target.path_and_query().map_or("/", |pq| pq.as_str());
    let location = crate::tls::redirect_location(routed.host.as_str(), port, path);
    answer(ProxyBody::redirect(
        StatusCode::PERMANENT_REDIRECT,
        &location,
    ))
}

/// The route's source ranges, after the redirects (nginx's access phase follows its rewrite
/// phase).
fn source_ranges(a: &mut Admission<'_, '_>) -> Verdict {
    let Some(ranges) = a.routed.matched.action.source_ranges.as_deref() else {
        return Ok(());
    };
    match ranges.admit(a.conn.peer.ip()) {
        Ok(()) => Ok(()),
        Err(Refusal::Forbidden) => Err(ProxyError::Forbidden.into()),
        Err(Refusal::Misconfigured) => Err(ProxyError::InvalidSourceRanges.into()),
    }
}

/// A declared `Content-Length` over the route's limit (0: no limit) is refused with 413.
fn body_limit(a: &mut Admission<'_, '_>) -> Verdict {
    let max = a.routed.matched.action.max_body_bytes;
    if max == 0 {
        return Ok(());
    }
    let declared = a
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    match declared {
        Some(len) if len > max => Err(ProxyError::BodyTooLarge.into()),
        _ => Ok(()),
    }
}

/// The route's access policy, after the checks: its limits, then basic auth, then external auth
/// ([`Gate::admit`]). A refused request gets the gate's answer; an admitted one may carry the
/// auth response's headers, and the exchange holds its admission (its `limit-connections` slot,
/// the auth response's cookies) until the response is done.
pub(crate) async fn access<B>(
    gate: &Gate,
    routed: &Routed<'_>,
    req: &mut Request<B>,
    conn: &ConnInfo,
    exchange: &mut Exchange,
) -> Verdict {
    let action = routed.matched.action;
    let client = Client {
        ip: conn.peer.ip(),
        scheme: conn.scheme(),
        pass_scheme: crate::forwarded::request_scheme(req.headers(), conn),
        host: routed.host.as_str(),
    };
    let zone = (&*action.origin.namespace, &*action.origin.name);
    match gate
        .admit(action.access.as_deref(), zone, req, client)
        .await
    {
        Ok(admission) => {
            exchange.hold(admission);
            Ok(())
        }
        Err(refusal) => answer((*refusal).map(ProxyBody::full)),
    }
}
