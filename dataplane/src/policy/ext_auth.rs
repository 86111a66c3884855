//! External authentication (ingress-nginx's `auth-url`, the oauth2-proxy pattern), as nginx's
//! `auth_request` does it: before proxying, a request without body goes to the auth URL with the
//! client's headers and ingress-nginx's `X-Original-URL`, `X-Original-Method`, `X-Real-IP`,
//! `X-Forwarded-For`, `X-Auth-Request-Redirect`, `X-Sent-From` and `X-Request-ID`. A 2xx admits
//! the request (copying `auth-response-headers` onto it), a 401 or 403 goes back to the client (a
//! 401 as a 302 to `auth-signin` with `rd=` when set), anything else, or no answer, is 500.
//!
//! The URL may be an IPv6 literal (`http://[::1]:9000/auth`) and may use the nginx variables
//! `$host`, `$http_host`, `$best_http_host`, `$scheme`, `$pass_access_scheme`, `$request_uri`
//! and `$escaped_request_uri`; names are resolved per request (A and AAAA, tried in order).

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt as _, Either, Empty};

use crate::access_policy::{AuthDestinations, ExternalAuth};
use crate::table::{Family, UpstreamProtocol};
use crate::upstream::tls::LiveTls;
use crate::upstream::{Peer, SendError, Sent, Upstream};
use crate::upstream_tls::{UpstreamTls, UpstreamTrust};

/// The auth request has no body.
type AuthBody = Empty<Bytes>;

/// The request values nginx variables stand for.
#[derive(Clone, Debug)]
pub struct Vars<'a> {
    /// `$scheme`: the connection's.
    pub scheme: &'a str,
    /// `$pass_access_scheme`: the scheme, or `X-Forwarded-Proto` from a trusted proxy.
    pub pass_scheme: &'a str,
    /// `$http_host`: the Host as received.
    pub http_host: &'a str,
    /// `$request_uri`: path and query as received.
    pub request_uri: &'a str,
}

impl Vars<'_> {
    /// `$host`: the Host without its port, lower case (IPv6 literals keep their brackets).
    pub fn host(&self) -> String {
        let h = self.http_host;
        let end = match h.rfind(']') {
            Some(close) => close + 1,
            None => h.find(':').unwrap_or(h.len()),
        };
        h[..end].to_ascii_lowercase()
    }
}

/// The nginx variables an auth URL or sign-in URL may use.
pub const VARIABLES: [&str; 7] = [
    "$escaped_request_uri",
    "$pass_access_scheme",
    "$best_http_host",
    "$request_uri",
    "$http_host",
    "$scheme",
    "$host",
];

/// Replaces the variables of [`VARIABLES`] in `template`.
pub fn expand(template: &str, vars: &Vars<'_>) -> String {
    let mut out = String::with_capacity(template.len() + 32);
    let mut rest = template;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let tail = &rest[at..];
        let name = VARIABLES.iter().find(|v| tail.starts_with(**v));
        match name {
            Some(&name) => {
                match name {
                    "$escaped_request_uri" => out.push_str(&escape_uri(vars.request_uri)),
                    "$pass_access_scheme" => out.push_str(vars.pass_scheme),
                    "$best_http_host" | "$http_host" => out.push_str(vars.http_host),
                    "$request_uri" => out.push_str(vars.request_uri),
                    "$scheme" => out.push_str(vars.scheme),
                    _ => out.push_str(&vars.host()),
                }
                rest = &tail[name.len()..];
            }
            None => {
                out.push('$');
                rest = &tail[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// The scheme and authority of an auth URL template: up to the first `/`, `?` or `#` after
/// `://` (the whole template without one).
pub fn authority(template: &str) -> &str {
    let start = template.find("://").map_or(0, |i| i + 3);
    let end = template[start..]
        .find(['/', '?', '#'])
        .map_or(template.len(), |i| start + i);
    &template[..end]
}

/// Expands an auth URL template. In its authority `$http_host` and `$best_http_host` stand for
/// the routed host without the client's port (as `$host`): a variable naming the destination
/// never lets the client pick the port; the rest of the URL gets the Host as received.
pub fn expand_url(template: &str, vars: &Vars<'_>) -> String {
    let head = authority(template);
    let host = vars.host();
    let routed = Vars {
        http_host: &host,
        ..vars.clone()
    };
    let mut url = expand(head, &routed);
    url.push_str(&expand(&template[head.len()..], vars));
    url
}

/// nginx's `set_escape_uri`: every byte but `A-Z a-z 0-9 - . _ ~` percent-encoded.
pub fn escape_uri(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The `Location` of a 401 with `auth-signin` (ingress-nginx's `buildAuthSignURL`): the sign-in
/// URL plus `?rd=` (or `&rd=` after a query) and the original URL, unless it already has `rd`.
pub fn signin_location(signin: &str, param: &str, vars: &Vars<'_>) -> String {
    let query = signin.split_once('?').map(|(_, q)| q);
    let has_param = query.is_some_and(|q| {
        q.split('&')
            .any(|pair| pair.split_once('=').map_or(pair, |(k, _)| k) == param)
    });
    let url = expand(signin, vars);
    if has_param {
        return url;
    }
    let sep = if query.is_some_and(|q| !q.is_empty()) {
        '&'
    } else if query.is_some() {
        '\0'
    } else {
        '?'
    };
    let original = format!(
        "{}://{}{}",
        vars.pass_scheme,
        vars.http_host,
        escape_uri(vars.request_uri)
    );
    match sep {
        '\0' => format!("{url}{param}={original}"),
        sep => format!("{url}{sep}{param}={original}"),
    }
}

/// An auth URL, parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuthUrl {
    /// `https://`.
    pub tls: bool,
    /// The host: a name, or an IP address without brackets.
    pub host: String,
    /// The port (80 or 443 unless given).
    pub port: u16,
    /// The `Host` sent: the authority as written (brackets and port kept).
    pub authority: String,
    /// Path and query (`/` when absent).
    pub path_and_query: String,
}

/// Parses an absolute `http://` or `https://` URL; IPv6 literals in brackets.
pub fn parse_url(url: &str) -> Option<AuthUrl> {
    let uri: http::Uri = url.parse().ok()?;
    let tls = match uri.scheme_str()? {
        "http" => false,
        "https" => true,
        _ => return None,
    };
    let authority = uri.authority()?;
    if authority.as_str().contains('@') {
        return None;
    }
    let host = authority.host();
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    if host.starts_with('[') && bare.parse::<std::net::Ipv6Addr>().is_err() || bare.is_empty() {
        return None;
    }
    Some(AuthUrl {
        tls,
        host: bare.to_owned(),
        port: authority.port_u16().unwrap_or(if tls { 443 } else { 80 }),
        authority: authority.as_str().to_owned(),
        path_and_query: uri.path_and_query().map_or("/", |p| p.as_str()).to_owned(),
    })
}

/// What the auth service said.
#[derive(Debug)]
pub enum Outcome {
    /// Admit the request.
    Allow {
        /// Headers to set on it (`None` removes the header: the auth response did not carry it).
        headers: Vec<(HeaderName, Option<HeaderValue>)>,
        /// The auth response's `Set-Cookie` values, for the client's response.
        cookies: Vec<HeaderValue>,
    },
    /// Answer the client with this.
    Deny(Response<Bytes>),
}

static X_ORIGINAL_URL: HeaderName = HeaderName::from_static("x-original-url");
static X_ORIGINAL_METHOD: HeaderName = HeaderName::from_static("x-original-method");
static X_ORIGINAL_URI: HeaderName = HeaderName::from_static("x-original-uri");
static X_SCHEME: HeaderName = HeaderName::from_static("x-scheme");
static X_SENT_FROM: HeaderName = HeaderName::from_static("x-sent-from");
static X_REAL_IP: HeaderName = HeaderName::from_static("x-real-ip");
static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
static X_AUTH_REQUEST_REDIRECT: HeaderName = HeaderName::from_static("x-auth-request-redirect");
static X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Headers of the client request never passed to the auth URL (hop-by-hop, body framing) or
/// replaced there.
const NOT_PASSED: [&str; 11] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "content-length",
    "expect",
    "host",
    "x-forwarded-proto",
];

/// The request sent to the auth URL for a client request.
pub fn auth_request<B>(
    auth: &ExternalAuth,
    url: &AuthUrl,
    req: &Request<B>,
    client: IpAddr,
    vars: &Vars<'_>,
) -> Request<AuthBody> {
    let mut headers = HeaderMap::with_capacity(req.headers().len() + 10);
    for (name, value) in req.headers() {
        if !NOT_PASSED.contains(&name.as_str()) {
            headers.append(name.clone(), value.clone());
        }
    }
    let mut set = |name: &HeaderName, value: &str| {
        if let Ok(v) = HeaderValue::from_str(value) {
            headers.insert(name.clone(), v);
        }
    };
    set(&header::HOST, &url.authority);
    let original = format!("{}://{}{}", vars.scheme, vars.http_host, vars.request_uri);
    set(&X_ORIGINAL_URL, &original);
    set(&X_ORIGINAL_METHOD, req.method().as_str());
    set(&X_SENT_FROM, "nginx-ingress-controller");
    let client = client.to_canonical().to_string();
    set(&X_REAL_IP, &client);
    set(&X_FORWARDED_FOR, &client);
    let redirect = auth.request_redirect.as_deref().unwrap_or(vars.request_uri);
    set(&X_AUTH_REQUEST_REDIRECT, redirect);
    set(&X_REQUEST_ID, &request_id());
    if auth.method.is_some() {
        set(&X_ORIGINAL_URI, vars.request_uri);
        set(&X_SCHEME, vars.pass_scheme);
    }
    let method = auth
        .method
        .as_deref()
        .and_then(|m| Method::from_bytes(m.as_bytes()).ok())
        .unwrap_or(Method::GET);
    let mut out = Request::new(Empty::new());
    *out.method_mut() = method;
    *out.uri_mut() = url
        .path_and_query
        .parse()
        .unwrap_or_else(|_| "/".parse().expect("a path"));
    *out.headers_mut() = headers;
    out
}

/// A request id as ingress-nginx's `$req_id`: 16 random bytes in hex.
fn request_id() -> String {
    format!("{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..))
}

/// What an auth response means (nginx's `auth_request` and ingress-nginx's error pages).
pub fn decide<B>(auth: &ExternalAuth, res: &Response<B>, vars: &Vars<'_>) -> Outcome {
    let status = res.status();
    if status.is_success() {
        let copied = auth
            .response_headers
            .iter()
            .filter_map(|name| HeaderName::from_bytes(name.as_bytes()).ok())
            .map(|name| {
                let value = res.headers().get(&name).filter(|v| !v.is_empty()).cloned();
                (name, value)
            })
            .collect();
        let cookies = res
            .headers()
            .get_all(header::SET_COOKIE)
            .iter()
            .cloned()
            .collect();
        return Outcome::Allow {
            headers: copied,
            cookies,
        };
    }
    let mut out = match status {
        StatusCode::UNAUTHORIZED => match &auth.signin {
            Some(signin) => {
                let location = signin_location(signin, &auth.redirect_param, vars);
                let mut out = answer(StatusCode::FOUND);
                if let Ok(v) = HeaderValue::from_str(&location) {
                    out.headers_mut().insert(header::LOCATION, v);
                }
                out
            }
            None => {
                let mut out = answer(StatusCode::UNAUTHORIZED);
                if let Some(v) = res.headers().get(header::WWW_AUTHENTICATE) {
                    out.headers_mut()
                        .insert(header::WWW_AUTHENTICATE, v.clone());
                }
                out
            }
        },
        StatusCode::FORBIDDEN => answer(StatusCode::FORBIDDEN),
        _ => answer(StatusCode::INTERNAL_SERVER_ERROR),
    };
    if status == StatusCode::UNAUTHORIZED && auth.signin.is_some() {
        for cookie in res.headers().get_all(header::SET_COOKIE) {
            out.headers_mut().append(header::SET_COOKIE, cookie.clone());
        }
    }
    Outcome::Deny(out)
}

/// A short local answer.
pub fn answer(status: StatusCode) -> Response<Bytes> {
    let text = match status {
        StatusCode::UNAUTHORIZED => "401 authorization required\n",
        StatusCode::FORBIDDEN => "403 forbidden by the auth service\n",
        StatusCode::FOUND => "302 sign in first\n",
        StatusCode::SERVICE_UNAVAILABLE => "503 this route's access settings are invalid\n",
        _ => "500 the auth service did not answer 2xx, 401 or 403\n",
    };
    let mut res = Response::new(Bytes::from_static(text.as_bytes()));
    *res.status_mut() = status;
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    res
}

/// TLS settings kept by server name (all dropped when full: they are remade on demand).
const TLS_KEPT: usize = 64;

/// The most of an auth response's body read (and discarded, as nginx does) to keep its
/// connection; past it the connection is closed.
const DRAINED_BODY: usize = 64 * 1024;

/// How auth requests go out: over the upstream connection pools (by address and TLS settings,
/// as requests to pods), to the allowed destinations only.
#[derive(Debug)]
pub(crate) struct AuthClient {
    upstream: Arc<Upstream>,
    destinations: AuthDestinations,
    /// TLS settings of the `https://` auth hosts written out in auth URLs, by server name.
    tls: Mutex<HashMap<String, Arc<LiveTls>>>,
    connect_timeout: Duration,
    read_timeout: Duration,
}

impl AuthClient {
    /// A client over `upstream`'s pools, with these connect and response timeouts.
    pub(crate) fn new(
        upstream: Arc<Upstream>,
        destinations: AuthDestinations,
        (connect_timeout, read_timeout): (Duration, Duration),
    ) -> AuthClient {
        AuthClient {
            upstream,
            destinations,
            tls: Mutex::default(),
            connect_timeout,
            read_timeout,
        }
    }

    /// Asks the auth service about a request and says what to do with it. The connection is
    /// pooled when the URL's host and port are written out; when a variable names them (the
    /// client picks the host), it is closed after the answer.
    pub(crate) async fn check<B>(
        &self,
        auth: &ExternalAuth,
        req: &Request<B>,
        client: IpAddr,
        vars: &Vars<'_>,
    ) -> Outcome {
        let expanded = expand_url(&auth.url, vars);
        let Some(url) = parse_url(&expanded) else {
            tracing::debug!(url = %expanded, "The auth URL does not parse after expansion");
            return Outcome::Deny(answer(StatusCode::INTERNAL_SERVER_ERROR));
        };
        let pooled = !authority(&auth.url).contains('$');
        let mut request = auth_request(auth, &url, req, client, vars);
        if !pooled {
            let close = HeaderValue::from_static("close");
            request.headers_mut().insert(header::CONNECTION, close);
        }
        let sent = match self.send(&url, request, pooled).await {
            Ok(sent) => sent,
            Err(error) => {
                tracing::debug!(%error, url = %expanded, "The auth request failed");
                return Outcome::Deny(answer(StatusCode::INTERNAL_SERVER_ERROR));
            }
        };
        let outcome = decide(auth, &sent.response, vars);
        self.drain(sent).await;
        outcome
    }

    /// Sends the auth request to the first allowed address of its host that connects.
    async fn send(
        &self,
        url: &AuthUrl,
        request: Request<AuthBody>,
        pooled: bool,
    ) -> io::Result<Sent> {
        let tls = if url.tls {
            Some(self.tls_for(&url.host, pooled)?)
        } else {
            None
        };
        let mut slot = Some(request.map(Either::Right));
        let mut last = io::Error::new(io::ErrorKind::NotFound, "no address");
        for addr in self.addresses(url).await? {
            let peer = Peer {
                addr,
                family: Family::of(&addr),
                protocol: match tls {
                    Some(_) => UpstreamProtocol::Https,
                    None => UpstreamProtocol::Http1,
                },
                tls: tls.as_ref(),
                connect_timeout: self.connect_timeout,
                read_timeout: self.read_timeout,
                forwarding: None,
            };
            match self.upstream.send(&peer, &mut slot).await {
                Ok(sent) => return Ok(sent),
                Err(SendError::Unsent(error)) => last = error,
                Err(SendError::Failed(error)) => return Err(io::Error::other(error.to_string())),
            }
        }
        Err(last)
    }

    /// The addresses of an auth URL's host (the literal, or the name's A and AAAA records) that
    /// the destinations allow; refused ones are logged, and none allowed is an error.
    async fn addresses(&self, url: &AuthUrl) -> io::Result<Vec<SocketAddr>> {
        let found = resolve(url, self.connect_timeout).await?;
        let (allowed, refused): (Vec<SocketAddr>, Vec<SocketAddr>) = found
            .into_iter()
            .partition(|a| self.destinations.allows(a.ip()));
        if !refused.is_empty() {
            tracing::warn!(
                auth.host = %url.host,
                auth.refused = ?refused,
                "An auth request's destination is refused by --auth-allowed-destinations \
                 (loopback, link-local and unspecified addresses by default)"
            );
        }
        if allowed.is_empty() && !refused.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                "the destination is not allowed",
            ));
        }
        Ok(allowed)
    }

    /// The TLS settings of an auth host (SNI on, the certificate not verified, as ingress-nginx's
    /// auth location): kept by server name for pooled connections, made afresh otherwise.
    fn tls_for(&self, host: &str, pooled: bool) -> io::Result<Arc<LiveTls>> {
        let make = || {
            let settings = UpstreamTls::new(host, &UpstreamTrust::SkipVerify, false)
                .map_err(io::Error::other)?;
            Ok::<_, io::Error>(Arc::new(LiveTls::new(Arc::new(settings))))
        };
        if !pooled {
            return make();
        }
        let mut kept = self.tls.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(tls) = kept.get(host) {
            return Ok(tls.clone());
        }
        if kept.len() >= TLS_KEPT {
            kept.clear();
        }
        let tls = make()?;
        kept.insert(host.to_owned(), tls.clone());
        Ok(tls)
    }

    /// Reads the auth response's body to its end (at most [`DRAINED_BODY`], within the response
    /// timeout) and drops it, so its connection goes back to the pool.
    async fn drain(&self, sent: Sent) {
        let Sent {
            response,
            pool_return,
            ..
        } = sent;
        let mut body = response.into_body();
        let read_all = async {
            let mut read = 0;
            while let Some(Ok(frame)) = body.frame().await {
                read += frame.data_ref().map_or(0, |d| d.len());
                if read > DRAINED_BODY {
                    return;
                }
            }
        };
        let _ = tokio::time::timeout(self.read_timeout, read_all).await;
        drop(body);
        drop(pool_return);
    }
}

/// The addresses of an auth URL's host: the literal, or the name's A and AAAA records.
async fn resolve(url: &AuthUrl, timeout: Duration) -> io::Result<Vec<SocketAddr>> {
    if let Ok(ip) = url.host.parse::<IpAddr>() {
        return Ok(vec![SocketAddr::new(ip, url.port)]);
    }
    let found = tokio::time::timeout(timeout, tokio::net::lookup_host((&*url.host, url.port)))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "resolving timed out"))??;
    Ok(found.collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars() -> Vars<'static> {
        Vars {
            scheme: "http",
            pass_scheme: "https",
            http_host: "App.test:8080",
            request_uri: "/a b/?x=1&y=2",
        }
    }

    #[test]
    fn urls_parse_with_ipv6_literals() {
        let u = parse_url("http://[::1]:9000/auth?x=1").unwrap();
        assert_eq!(u.host, "::1");
        assert_eq!(u.port, 9000);
        assert_eq!(u.authority, "[::1]:9000");
        assert_eq!(u.path_and_query, "/auth?x=1");
        let u = parse_url("https://auth.example").unwrap();
        assert_eq!((u.tls, u.port, u.path_and_query.as_str()), (true, 443, "/"));
        for bad in [
            "ftp://x/",
            "/auth",
            "http://",
            "http://[nothex]/",
            "http://u@h/",
        ] {
            assert_eq!(parse_url(bad), None, "{bad}");
        }
    }

    #[test]
    fn variables_expand_as_nginx() {
        let v = vars();
        assert_eq!(v.host(), "app.test");
        assert_eq!(
            expand(
                "https://$host/oauth2/auth?u=$escaped_request_uri&$other",
                &v
            ),
            "https://app.test/oauth2/auth?u=%2Fa%20b%2F%3Fx%3D1%26y%3D2&$other"
        );
        let v6 = Vars {
            http_host: "[::1]:8080",
            ..vars()
        };
        assert_eq!(v6.host(), "[::1]");
    }

    #[test]
    fn the_client_never_picks_the_auth_destination_port() {
        for (sent, routed) in [("LocalHost:19999", "localhost"), ("[::1]:19999", "[::1]")] {
            let v = Vars {
                http_host: sent,
                ..vars()
            };
            for template in ["http://$http_host/probe", "http://$best_http_host/probe"] {
                let url = parse_url(&expand_url(template, &v)).unwrap();
                assert_eq!((url.authority.as_str(), url.port), (routed, 80), "{sent}");
            }
            // Elsewhere in the URL the Host is as received; a port written out stays.
            assert_eq!(
                expand_url("https://$http_host:8443/a?h=$http_host", &v),
                format!("https://{routed}:8443/a?h={sent}")
            );
        }
        assert_eq!(authority("http://a:1?x=/"), "http://a:1");
        assert_eq!(authority("http://$host"), "http://$host");
    }

    #[test]
    fn signin_gets_rd_as_ingress_nginx_builds_it() {
        let v = vars();
        let rd = "https://App.test:8080%2Fa%20b%2F%3Fx%3D1%26y%3D2";
        assert_eq!(
            signin_location("https://login/start", "rd", &v),
            format!("https://login/start?rd={rd}")
        );
        assert_eq!(
            signin_location("https://login/start?a=b", "rd", &v),
            format!("https://login/start?a=b&rd={rd}")
        );
        assert_eq!(
            signin_location("https://$host/start?rd=$escaped_request_uri", "rd", &v),
            "https://app.test/start?rd=%2Fa%20b%2F%3Fx%3D1%26y%3D2"
        );
        assert_eq!(
            signin_location("https://login/start", "next", &v),
            format!("https://login/start?next={rd}")
        );
    }

    #[test]
    fn auth_responses_decide_as_nginx() {
        let mut auth = ExternalAuth::new("http://a/");
        auth.response_headers = vec!["x-auth-request-user".into(), "x-missing".into()];
        let res = |status: u16| {
            let mut r = Response::new(());
            *r.status_mut() = StatusCode::from_u16(status).unwrap();
            r.headers_mut()
                .insert("x-auth-request-user", HeaderValue::from_static("alice"));
            r.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            r
        };
        match decide(&auth, &res(202), &vars()) {
            Outcome::Allow { headers, cookies } => assert_eq!(
                (headers, cookies.len()),
                (
                    vec![
                        (
                            HeaderName::from_static("x-auth-request-user"),
                            Some(HeaderValue::from_static("alice"))
                        ),
                        (HeaderName::from_static("x-missing"), None),
                    ],
                    0
                )
            ),
            other => panic!("{other:?}"),
        }
        for (status, want) in [(401, 401), (403, 403), (302, 500), (404, 500), (503, 500)] {
            match decide(&auth, &res(status), &vars()) {
                Outcome::Deny(r) => assert_eq!(r.status().as_u16(), want, "{status}"),
                other => panic!("{status}: {other:?}"),
            }
        }
        let Outcome::Deny(r) = decide(&auth, &res(401), &vars()) else {
            panic!()
        };
        assert_eq!(r.headers()[header::WWW_AUTHENTICATE], "Bearer");
        auth.signin = Some("https://login/".into());
        let Outcome::Deny(r) = decide(&auth, &res(401), &vars()) else {
            panic!()
        };
        assert_eq!(r.status(), 302);
        assert!(r.headers()[header::LOCATION]
            .to_str()
            .unwrap()
            .starts_with("https://login/?rd=https://App.test:8080%2Fa"));
        let Outcome::Deny(r) = decide(&auth, &res(403), &vars()) else {
            panic!()
        };
        assert_eq!(r.status(), 403, "a 403 is not redirected");
    }
}
