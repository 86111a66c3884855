//! ingress-nginx's access annotations: `auth-type: basic` with `auth-secret`,
//! `auth-secret-type` and `auth-realm`; external auth (`auth-url`, `auth-method`, `auth-signin`,
//! `auth-signin-redirect-param`, `auth-response-headers`, `auth-request-redirect`); and the rate
//! limits (`limit-rps`, `limit-rpm`, `limit-connections`, `limit-burst-multiplier`,
//! `limit-allowlist`), plus duet's `duet.dev/limit-ipv6-prefix`. They become the route's
//! [`Access`] (see `dataplane::policy`).
//!
//! Access control fails closed as ingress-nginx does: an auth or limit value that does not parse,
//! a missing Secret or one without htpasswd data, or `auth-type: digest` make the Ingress's
//! routes answer 503, with a diagnostic. Tuning values (`auth-method`, `auth-signin`,
//! `limit-burst-multiplier`, ...) fall back to their default with a diagnostic.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use dataplane::access_policy::{
    Access, AuthDestinations, BasicAuth, Credential, ExternalAuth, RateLimit,
};
use dataplane::cidr::Cidr;
use dataplane::policy::{basic_auth, ext_auth};
use k8s_openapi::api::core::v1::Secret;

use super::super::annotation::{annotation, Annotated};
use super::super::{Diagnostic, Reason, References};
use super::{Read, Settings, Status, PREFIX};
use crate::object::{NsName, ObjectKey};

/// The duet annotation setting the prefix length IPv6 clients are rate limited by (`1`..`128`;
/// 128 unless set, ingress-nginx's per-address keying; `64` keys an IPv6 host by the /64 it owns).
pub const LIMIT_IPV6_PREFIX_ANNOTATION: &str = super::super::annotation::LIMIT_IPV6_PREFIX.name;

/// ingress-nginx's basic-auth Secret annotation (`name` or `namespace/name`, the Ingress's own
/// namespace only): the source watches the Secret it names.
pub const AUTH_SECRET_ANNOTATION: &str = "nginx.ingress.kubernetes.io/auth-secret";

/// The keys this module reads (after the prefix).
pub const KEYS: [&str; 15] = [
    "auth-type",
    "auth-secret",
    "auth-secret-type",
    "auth-realm",
    "auth-url",
    "auth-method",
    "auth-signin",
    "auth-signin-redirect-param",
    "auth-response-headers",
    "auth-request-redirect",
    "limit-rps",
    "limit-rpm",
    "limit-connections",
    "limit-burst-multiplier",
    "limit-allowlist",
];

/// The access annotations of one Ingress, validated.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Annotations {
    /// `auth-type`: `Ok(())` for basic, `Err(reason)` when it fails closed.
    auth_type: Option<Result<(), String>>,
    auth_secret: Option<String>,
    auth_map: bool,
    auth_realm: Option<String>,
    /// `auth-url`: `Err(reason)` when it fails closed.
    auth_url: Option<Result<String, String>>,
    auth_method: Option<String>,
    auth_signin: Option<String>,
    redirect_param: Option<String>,
    response_headers: Vec<String>,
    request_redirect: Option<String>,
    rps: Option<u32>,
    rpm: Option<u32>,
    connections: Option<u32>,
    burst_multiplier: Option<u32>,
    limit_allow: Vec<Cidr>,
    /// A limit value that does not parse: the routes answer 503.
    limit_error: Option<String>,
}

impl Annotations {
    fn limited(&self) -> bool {
        self.limit_error.is_some()
            || [self.rps, self.rpm, self.connections]
                .iter()
                .any(|l| l.is_some_and(|n| n > 0))
    }
}

/// Whether this module reads a key.
pub fn reads(name: &str) -> bool {
    KEYS.contains(&name)
}

/// Applies one key's value, or says why it does not parse.
pub fn apply(name: &str, value: &str, a: &mut Annotations) -> Result<(), String> {
    let v = value.trim();
    match name {
        "auth-type" => {
            a.auth_type = Some(match v {
                "basic" => Ok(()),
                "digest" => Err("auth-type digest is not supported by duet: the Ingress's routes answer 503 (fail closed)".to_owned()),
                _ => {
                    let reason = format!("{value:?} is not basic or digest: the Ingress's routes answer 503 (fail closed, as ingress-nginx)");
                    a.auth_type = Some(Err(reason.clone()));
                    return Err(reason);
                }
            });
        }
        "auth-secret" => a.auth_secret = Some(non_empty(v)?.to_owned()),
        "auth-secret-type" => {
            a.auth_map = match v {
                "auth-file" => false,
                "auth-map" => true,
                _ => {
                    return Err(format!(
                        "{value:?} is not auth-file or auth-map; auth-file applies"
                    ))
                }
            }
        }
        "auth-realm" => a.auth_realm = Some(realm(v)?),
        "auth-url" => {
            let url = url_template(v).map_err(|e| {
                let reason =
                    format!("{e}: the Ingress's routes answer 503 (fail closed, as ingress-nginx)");
                a.auth_url = Some(Err(reason.clone()));
                reason
            })?;
            a.auth_url = Some(Ok(url));
        }
        "auth-method" => a.auth_method = Some(method(v)?),
        "auth-signin" => {
            a.auth_signin =
                Some(url_template(v).map_err(|e| format!("{e}; a 401 is not redirected"))?)
        }
        "auth-signin-redirect-param" => a.redirect_param = Some(token(v)?),
        "auth-response-headers" => a.response_headers = header_names(v)?,
        "auth-request-redirect" => a.request_redirect = Some(printable(v)?),
        "limit-rps" | "limit-rpm" | "limit-connections" => {
            let n = count(v).inspect_err(|e| a.limit_error = Some(e.clone()))?;
            match name {
                "limit-rps" => a.rps = Some(n),
                "limit-rpm" => a.rpm = Some(n),
                _ => a.connections = Some(n),
            }
        }
        "limit-burst-multiplier" => {
            a.burst_multiplier = Some(count(v).ok().filter(|n| *n > 0).ok_or_else(|| {
                format!("{value:?} is not a whole number of at least 1; 5 applies")
            })?);
        }
        "limit-allowlist" => {
            a.limit_allow = cidrs(v).inspect_err(|e| a.limit_error = Some(e.clone()))?;
        }
        _ => return Err(format!("{name} has no parser")),
    }
    Ok(())
}

fn non_empty(v: &str) -> Result<&str, String> {
    if v.is_empty() {
        Err("empty; the annotation is ignored".to_owned())
    } else {
        Ok(v)
    }
}

fn realm(v: &str) -> Result<String, String> {
    if v.bytes().all(|b| b == b' ' || b.is_ascii_graphic()) && !v.contains(['"', '\\']) {
        Ok(v.to_owned())
    } else {
        Err(format!(
            "{v:?} has quotes, backslashes or non-ASCII characters; the realm is empty"
        ))
    }
}

/// An `http(s)://` URL, IPv6 literals in brackets welcome, using only the variables duet knows.
fn url_template(v: &str) -> Result<String, String> {
    if v.is_empty() || !v.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(format!("{v:?} is not a URL (empty, spaces or non-ASCII)"));
    }
    let mut rest = v;
    while let Some(at) = rest.find('$') {
        let tail = &rest[at..];
        let known = ext_auth::VARIABLES.iter().find(|n| tail.starts_with(**n));
        match known {
            Some(name) => rest = &tail[name.len()..],
            None if tail[1..].starts_with(|c: char| c.is_ascii_alphabetic() || c == '_') => {
                return Err(format!(
                    "{v:?} uses an nginx variable duet does not expand (it knows {})",
                    ext_auth::VARIABLES.join(", ")
                ))
            }
            None => rest = &tail[1..],
        }
    }
    let sample = ext_auth::Vars {
        scheme: "http",
        pass_scheme: "http",
        http_host: "example.test",
        request_uri: "/",
    };
    ext_auth::parse_url(&ext_auth::expand_url(v, &sample))
        .map(|_| v.to_owned())
        .ok_or_else(|| format!("{v:?} is not an absolute http:// or https:// URL"))
}

fn method(v: &str) -> Result<String, String> {
    const METHODS: [&str; 9] = [
        "GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "CONNECT", "OPTIONS", "TRACE",
    ];
    if METHODS.contains(&v) {
        Ok(v.to_owned())
    } else {
        Err(format!(
            "{v:?} is not one of {}; GET applies",
            METHODS.join(", ")
        ))
    }
}

fn token(v: &str) -> Result<String, String> {
    let ok = !v.is_empty()
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
    if ok {
        Ok(v.to_owned())
    } else {
        Err(format!("{v:?} is not a query parameter name; rd applies"))
    }
}

fn header_names(v: &str) -> Result<Vec<String>, String> {
    v.split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .map(|n| {
            let tchar = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
            if n.bytes().all(tchar) {
                Ok(n.to_ascii_lowercase())
            } else {
                Err(format!("{n:?} is not a header name; no header is copied"))
            }
        })
        .collect()
}

fn printable(v: &str) -> Result<String, String> {
    if !v.is_empty() && v.bytes().all(|b| b.is_ascii_graphic()) {
        Ok(v.to_owned())
    } else {
        Err(format!(
            "{v:?} is not printable ASCII without spaces; the request URI is sent"
        ))
    }
}

fn count(v: &str) -> Result<u32, String> {
    v.parse::<u32>()
        .ok()
        .filter(|_| v.bytes().all(|b| b.is_ascii_digit()))
        .ok_or_else(|| {
            format!("{v:?} is not a whole number: the Ingress's routes answer 503 (fail closed)")
        })
}

fn cidrs(v: &str) -> Result<Vec<Cidr>, String> {
    v.split(',')
        .map(|e| e.trim().parse::<Cidr>())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{e}: the Ingress's routes answer 503 (fail closed)"))
}

/// Marks the keys that have no effect without their main key (as in ingress-nginx), and an
/// `auth-type` whose Secret is not named, or that duet does not support, as failing closed.
pub fn settle(read: &mut Read) {
    let a = &read.settings.access;
    let basic = a.auth_type.is_some();
    let external = matches!(a.auth_url, Some(Ok(_)));
    let limited = a.limited();
    let no_secret = matches!(a.auth_type, Some(Ok(()))) && a.auth_secret.is_none();
    let digest = matches!(&a.auth_type, Some(Err(r)) if r.contains("digest"));
    for f in &mut read.findings {
        let Some(name) = f.key.strip_prefix(PREFIX) else {
            continue;
        };
        let name = super::catalogue::alias(name).unwrap_or(name);
        let needs = match name {
            "auth-secret" | "auth-secret-type" | "auth-realm" if !basic => "auth-type",
            "auth-method"
            | "auth-signin"
            | "auth-signin-redirect-param"
            | "auth-response-headers"
            | "auth-request-redirect"
                if !external =>
            {
                "a valid auth-url"
            }
            "limit-burst-multiplier" | "limit-allowlist" if !limited => {
                "limit-rps, limit-rpm or limit-connections"
            }
            "auth-type" if no_secret => {
                f.status = Status::InvalidValue;
                f.detail = "auth-secret is not set: the Ingress's routes answer 503 (fail closed, as ingress-nginx)".to_owned();
                continue;
            }
            "auth-type" if digest => {
                f.status = Status::IgnoredUnsupported;
                f.detail = "digest authentication is not supported: the Ingress's routes answer 503 (fail closed)".to_owned();
                continue;
            }
            _ => continue,
        };
        if f.status.is_honoured() {
            f.status = Status::IgnoredUnsupported;
            f.detail = format!("no effect without {needs} (as in ingress-nginx)");
        }
    }
}

/// The route's access policy: resolves the basic-auth Secret (recording the reference so its
/// changes are picked up) and reads `duet.dev/limit-ipv6-prefix`.
pub(crate) fn resolve(
    settings: &Settings,
    obj: &Annotated<'_>,
    secrets: &BTreeMap<NsName, &Secret>,
    destinations: &AuthDestinations,
    diagnostics: &mut Vec<Diagnostic>,
    references: &mut References,
) -> Option<Arc<Access>> {
    let a = &settings.access;
    if let Some(Ok(url)) = &a.auth_url {
        check_destination(url, obj.key, destinations, diagnostics);
    }
    let access = Access {
        rate_limit: a.limited().then(|| rate_limit(a, obj, diagnostics)),
        basic_auth: a
            .auth_type
            .as_ref()
            .map(|t| basic(a, t, obj.key, secrets, diagnostics, references)),
        external_auth: a.auth_url.as_ref().map(|url| external(a, url)),
    };
    (access != Access::default()).then(|| Arc::new(access))
}

/// The address an `auth-url` names literally (an IP address in an authority without variables)
/// when `destinations` refuse it: its auth requests are refused at connect time.
pub fn refused_destination(url: &str, destinations: &AuthDestinations) -> Option<IpAddr> {
    let head = ext_auth::authority(url);
    if head.contains('$') {
        return None;
    }
    let ip: IpAddr = ext_auth::parse_url(head)?.host.parse().ok()?;
    (!destinations.allows(ip)).then_some(ip)
}

/// Why `destinations` refuse an address, for users.
fn refusal(ip: IpAddr, destinations: &AuthDestinations) -> String {
    match destinations {
        AuthDestinations::Default => format!("{ip} is a loopback, link-local or unspecified address, which duet's auth requests may not reach unless --auth-allowed-destinations lists it"),
        AuthDestinations::Only(_) => format!("{ip} is outside --auth-allowed-destinations"),
    }
}

/// A diagnostic for an `auth-url` whose literal address the destinations refuse.
fn check_destination(
    url: &str,
    key: &ObjectKey,
    destinations: &AuthDestinations,
    diagnostics: &mut Vec<Diagnostic>,
) {
    if let Some(ip) = refused_destination(url, destinations) {
        let why = refusal(ip, destinations);
        diagnostics.push(Diagnostic::new(
            key.clone(),
            Reason::InvalidAnnotation,
            format!("{PREFIX}auth-url: {why}: the Ingress's routes answer 500, as when the auth service is unreachable"),
        ));
    }
}

/// `duet migrate check`: marks an `auth-url` whose literal address duet refuses by default.
pub fn settle_destination(read: &mut Read) {
    let Some(Ok(url)) = &read.settings.access.auth_url else {
        return;
    };
    let Some(ip) = refused_destination(url, &AuthDestinations::Default) else {
        return;
    };
    let own = format!("{PREFIX}auth-url");
    for f in read.findings.iter_mut().filter(|f| f.key == own) {
        f.status = Status::IgnoredUnsupported;
        let why = refusal(ip, &AuthDestinations::Default);
        f.detail = format!("{why}: the Ingress's routes answer 500");
    }
}

fn rate_limit(
    a: &Annotations,
    obj: &Annotated<'_>,
    diagnostics: &mut Vec<Diagnostic>,
) -> RateLimit {
    let ipv6_prefix = annotation(
        obj,
        LIMIT_IPV6_PREFIX_ANNOTATION,
        |v| match v.trim().parse::<u8>() {
            Ok(n) if (1..=128).contains(&n) => Ok(n),
            _ => Err(format!("{v:?} is not a prefix length from 1 to 128")),
        },
        (128, "per address (128) applies"),
        diagnostics,
    );
    let positive = |n: Option<u32>| n.filter(|n| *n > 0);
    RateLimit {
        rps: positive(a.rps),
        rpm: positive(a.rpm),
        connections: positive(a.connections),
        burst_multiplier: a.burst_multiplier.unwrap_or(5),
        allow: a.limit_allow.clone(),
        ipv6_prefix,
        error: a.limit_error.as_deref().map(Arc::from),
    }
}

fn external(a: &Annotations, url: &Result<String, String>) -> ExternalAuth {
    match url {
        Err(reason) => ExternalAuth {
            error: Some(reason.as_str().into()),
            ..ExternalAuth::new("")
        },
        Ok(url) => ExternalAuth {
            method: a.auth_method.as_deref().map(Arc::from),
            signin: a.auth_signin.as_deref().map(Arc::from),
            redirect_param: a.redirect_param.as_deref().unwrap_or("rd").into(),
            response_headers: a
                .response_headers
                .iter()
                .map(|h| Arc::from(h.as_str()))
                .collect(),
            request_redirect: a.request_redirect.as_deref().map(Arc::from),
            ..ExternalAuth::new(url)
        },
    }
}

fn basic(
    a: &Annotations,
    auth_type: &Result<(), String>,
    key: &ObjectKey,
    secrets: &BTreeMap<NsName, &Secret>,
    diagnostics: &mut Vec<Diagnostic>,
    references: &mut References,
) -> BasicAuth {
    let realm: Arc<str> = a.auth_realm.as_deref().unwrap_or_default().into();
    let closed = |reason: String| BasicAuth {
        realm: realm.clone(),
        users: Arc::new([]),
        error: Some(reason.into()),
    };
    if let Err(reason) = auth_type {
        return closed(reason.clone());
    }
    let Some(written) = a.auth_secret.as_deref() else {
        return closed("auth-secret is not set".to_owned());
    };
    let (namespace, name) = written.split_once('/').unwrap_or((&key.namespace, written));
    if namespace != &*key.namespace {
        let reason = format!("{PREFIX}auth-secret: {written:?} is in another namespace, which duet refuses (as ingress-nginx without allow-cross-namespace-resources): the Ingress's routes answer 503");
        diagnostics.push(Diagnostic::new(
            key.clone(),
            Reason::InvalidAnnotation,
            reason.clone(),
        ));
        return closed(reason);
    }
    let wanted = NsName::new(namespace, name);
    references.secrets.insert(wanted.clone());
    let Some(secret) = secrets.get(&wanted) else {
        let reason = format!("{PREFIX}auth-secret: Secret {wanted} does not exist: the Ingress's routes answer 503 (fail closed, as ingress-nginx)");
        diagnostics.push(Diagnostic::new(
            key.clone(),
            Reason::MissingSecret,
            reason.clone(),
        ));
        return closed(reason);
    };
    match users(secret, a.auth_map).and_then(|users| usable(users, &wanted, key, diagnostics)) {
        Ok(users) => BasicAuth {
            realm,
            users: users.into(),
            error: None,
        },
        Err(problem) => {
            let reason = format!("{PREFIX}auth-secret: Secret {wanted} {problem}: the Ingress's routes answer 503 (fail closed, as ingress-nginx)");
            diagnostics.push(Diagnostic::new(
                key.clone(),
                Reason::InvalidAnnotation,
                reason.clone(),
            ));
            closed(reason)
        }
    }
}

/// The users of an auth Secret, when they can be served: users whose hash is of no supported
/// scheme cannot sign in (a diagnostic names them); a bcrypt hash above
/// [`basic_auth::MAX_BCRYPT_COST`] refuses the Secret (each check would hold a core for seconds).
fn usable(
    users: Vec<Credential>,
    wanted: &NsName,
    key: &ObjectKey,
    diagnostics: &mut Vec<Diagnostic>,
) -> Result<Vec<Credential>, String> {
    let names = |keep: &dyn Fn(&str) -> bool| -> Vec<&str> {
        users
            .iter()
            .filter(|c| keep(&c.hash))
            .map(|c| &*c.user)
            .collect()
    };
    let max = basic_auth::MAX_BCRYPT_COST;
    let costly = names(&|h| basic_auth::bcrypt_cost(h).is_some_and(|cost| cost > max));
    if !costly.is_empty() {
        let users = costly.join(", ");
        return Err(format!("has bcrypt hashes of a cost above {max}, which duet refuses (each check would hold a core for seconds; users {users})"));
    }
    let unsupported = names(&|h| basic_auth::scheme(h) == "unsupported");
    if !unsupported.is_empty() {
        diagnostics.push(Diagnostic::new(
            key.clone(),
            Reason::InvalidAnnotation,
            format!("{PREFIX}auth-secret: Secret {wanted}: the hashes of {} are not bcrypt, apr1, $1$, {{SHA}}, {{SSHA}} or {{PLAIN}}; those users cannot sign in", unsupported.join(", ")),
        ));
    }
    Ok(users)
}

/// The users of an auth Secret: its `auth` key as an htpasswd file, or (`auth-map`) one user per
/// key with the hash as value.
fn users(secret: &Secret, map: bool) -> Result<Vec<Credential>, String> {
    let data = secret.data.as_ref();
    if map {
        let users: Vec<Credential> = data
            .into_iter()
            .flatten()
            .filter_map(|(user, hash)| {
                let hash = std::str::from_utf8(&hash.0).ok()?.trim();
                Some(Credential {
                    user: user.as_str().into(),
                    hash: hash.into(),
                })
            })
            .collect();
        return if users.is_empty() {
            Err("has no user (auth-map: one key per user)".to_owned())
        } else {
            Ok(users)
        };
    }
    let file = data
        .and_then(|d| d.get("auth"))
        .ok_or("has no key \"auth\" (an htpasswd file)")?;
    let text = std::str::from_utf8(&file.0).map_err(|_| "has an \"auth\" key that is not text")?;
    Ok(basic_auth::parse_htpasswd(text))
}

#[cfg(test)]
mod tests {
    use k8s_openapi::ByteString;

    use super::super::Finding;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;
    use crate::object::{by_name, Kind};

    fn finding<'a>(findings: &'a [Finding], name: &str) -> Option<&'a Finding> {
        findings.iter().find(|f| f.key == format!("{PREFIX}{name}"))
    }

    fn read(pairs: &[(&str, &str)]) -> Read {
        let map: BTreeMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (format!("{PREFIX}{k}"), (*v).to_owned()))
            .collect();
        super::super::read(&map)
    }

    fn status(read: &Read, name: &str) -> Status {
        finding(&read.findings, name).expect(name).status
    }

    fn secret(name: &str, data: &[(&str, &str)]) -> Secret {
        Secret {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                namespace: Some("ns".into()),
                name: Some(name.into()),
                ..Default::default()
            },
            data: Some(
                data.iter()
                    .map(|(k, v)| ((*k).to_owned(), ByteString(v.as_bytes().to_vec())))
                    .collect(),
            ),
            ..Default::default()
        }
    }

    fn resolve_with(read: &Read, secrets: &[&Secret]) -> (Option<Arc<Access>>, Vec<Diagnostic>) {
        let key = ObjectKey::new(Kind::Ingress, "ns", "ing");
        let meta = ObjectMeta::default();
        let mut diagnostics = Vec::new();
        let mut references = References::default();
        let access = resolve(
            &read.settings,
            &Annotated::new(&key, &meta),
            &by_name(secrets),
            &AuthDestinations::Default,
            &mut diagnostics,
            &mut references,
        );
        (access, diagnostics)
    }

    #[test]
    fn basic_auth_reads_files_maps_and_fails_closed() {
        let r = read(&[
            ("auth-type", "basic"),
            ("auth-secret", "users"),
            ("auth-realm", "Staff only"),
        ]);
        assert_eq!(status(&r, "auth-type"), Status::HonouredWithDifference);
        assert_eq!(status(&r, "auth-realm"), Status::Honoured);
        let file = secret("users", &[("auth", "alice:{PLAIN}a\nbob:rqXexS6ZhobKA\n")]);
        let (access, diagnostics) = resolve_with(&r, &[&file]);
        let basic = access.unwrap().basic_auth.clone().unwrap();
        assert_eq!(basic.error, None);
        assert_eq!(&*basic.realm, "Staff only");
        assert_eq!(basic.users.len(), 2);
        assert!(diagnostics[0].message.contains("bob"), "{diagnostics:?}");
        // Missing Secret, Secret without `auth`, other namespace: fail closed with a diagnostic.
        for (secrets, reason) in [
            (vec![], Reason::MissingSecret),
            (
                vec![secret("users", &[("other", "x")])],
                Reason::InvalidAnnotation,
            ),
        ] {
            let refs: Vec<&Secret> = secrets.iter().collect();
            let (access, diagnostics) = resolve_with(&r, &refs);
            assert!(access.unwrap().basic_auth.as_ref().unwrap().error.is_some());
            assert_eq!(diagnostics[0].reason, reason, "{diagnostics:?}");
        }
        let other = read(&[("auth-type", "basic"), ("auth-secret", "elsewhere/users")]);
        let (access, _) = resolve_with(&other, &[&file]);
        assert!(access.unwrap().basic_auth.as_ref().unwrap().error.is_some());
        // auth-map: one user per key.
        let map = read(&[
            ("auth-type", "basic"),
            ("auth-secret", "ns/map"),
            ("auth-secret-type", "auth-map"),
        ]);
        let m = secret("map", &[("carol", "{PLAIN}c")]);
        let (access, _) = resolve_with(&map, &[&m]);
        let basic = access.unwrap().basic_auth.clone().unwrap();
        assert_eq!(basic.hash_of("carol").as_deref(), Some("{PLAIN}c"));
        // No secret named, bad or unsupported type: 503 for the routes.
        for pairs in [
            &[("auth-type", "basic")][..],
            &[("auth-type", "Basic"), ("auth-secret", "users")],
            &[("auth-type", "digest"), ("auth-secret", "users")],
        ] {
            let r = read(pairs);
            assert!(!status(&r, "auth-type").is_honoured(), "{pairs:?}");
            let (access, _) = resolve_with(&r, &[&file]);
            assert!(
                access.unwrap().basic_auth.as_ref().unwrap().error.is_some(),
                "{pairs:?}"
            );
        }
        // A bcrypt cost above 12 refuses the Secret: 503 with a diagnostic; 12 is served.
        let hash = |cost: &str| {
            format!(
                "${}${cost}$CCCCCCCCCCCCCCCCCCCCC.E5YPO9kmyuRGyh0XouQYb4YMJKvyOeW",
                "2y"
            )
        };
        for (cost, refused) in [("12", false), ("13", true), ("31", true)] {
            let htpasswd = format!("alice:{{PLAIN}}a\nslow:{}\n", hash(cost));
            let costly = secret("users", &[("auth", &htpasswd)]);
            let (access, diagnostics) = resolve_with(&r, &[&costly]);
            let error = access.unwrap().basic_auth.as_ref().unwrap().error.clone();
            assert_eq!(error.is_some(), refused, "cost {cost}: {error:?}");
            let said = diagnostics
                .iter()
                .any(|d| d.message.contains("cost above 12"));
            assert_eq!(said, refused, "cost {cost}: {diagnostics:?}");
        }
        // Without auth-type the other keys do nothing (as in ingress-nginx).
        let r = read(&[("auth-secret", "users"), ("auth-realm", "x")]);
        assert_eq!(status(&r, "auth-secret"), Status::IgnoredUnsupported);
        assert_eq!(resolve_with(&r, &[&file]).0, None);
    }

    #[test]
    fn external_auth_accepts_ipv6_literals_and_known_variables() {
        let r = read(&[
            ("auth-url", "http://[fd00::1]:9000/auth"),
            (
                "auth-signin",
                "https://$host/oauth2/start?rd=$escaped_request_uri",
            ),
            (
                "auth-response-headers",
                "X-Auth-Request-User, X-Auth-Request-Email",
            ),
            ("auth-method", "POST"),
        ]);
        for key in [
            "auth-url",
            "auth-signin",
            "auth-response-headers",
            "auth-method",
        ] {
            assert!(status(&r, key).is_honoured(), "{key}");
        }
        let (access, _) = resolve_with(&r, &[]);
        let ext = access.unwrap().external_auth.clone().unwrap();
        assert_eq!(ext.error, None);
        assert_eq!(&*ext.response_headers[1], "x-auth-request-email");
        assert_eq!(ext.method.as_deref(), Some("POST"));
        for bad in [
            "/auth",
            "http://$upstream/auth",
            "http://[fd00::1/auth",
            "http://a b/",
        ] {
            let r = read(&[("auth-url", bad), ("auth-signin", "https://login/")]);
            assert_eq!(status(&r, "auth-url"), Status::InvalidValue, "{bad}");
            assert_eq!(
                status(&r, "auth-signin"),
                Status::IgnoredUnsupported,
                "{bad}"
            );
            let (access, _) = resolve_with(&r, &[]);
            assert!(access
                .unwrap()
                .external_auth
                .as_ref()
                .unwrap()
                .error
                .is_some());
        }
        let r = read(&[("auth-url", "http://a/"), ("auth-method", "get")]);
        assert_eq!(status(&r, "auth-method"), Status::InvalidValue);
    }

    #[test]
    fn auth_urls_naming_refused_addresses_get_a_diagnostic() {
        let loopback = AuthDestinations::from_list(vec!["127.0.0.0/8".parse().unwrap()]);
        for (url, by_default, by_loopback) in [
            ("http://127.0.0.1:9000/auth", true, false),
            ("http://[::1]:9000/auth", true, true),
            ("http://169.254.169.254/latest", true, true),
            ("https://[fe80::1]/auth", true, true),
            ("http://0.0.0.0/auth", true, true),
            ("http://[::ffff:127.0.0.1]/auth?u=$host", true, false),
            ("http://10.0.0.1/auth", false, true),
            ("http://[fd00::1]/auth", false, true),
            ("http://oauth2-proxy.auth.svc/oauth2/auth", false, false),
            ("http://$host/auth", false, false),
        ] {
            for (destinations, want) in [
                (AuthDestinations::Default, by_default),
                (loopback.clone(), by_loopback),
            ] {
                let r = read(&[("auth-url", url)]);
                let key = ObjectKey::new(Kind::Ingress, "ns", "ing");
                let meta = ObjectMeta::default();
                let mut diagnostics = Vec::new();
                resolve(
                    &r.settings,
                    &Annotated::new(&key, &meta),
                    &BTreeMap::new(),
                    &destinations,
                    &mut diagnostics,
                    &mut References::default(),
                );
                assert_eq!(
                    diagnostics.len(),
                    usize::from(want),
                    "{url} {destinations:?}"
                );
                if want {
                    let message = &diagnostics[0].message;
                    assert!(
                        message.contains("auth-url") && message.contains("500"),
                        "{message}"
                    );
                }
            }
        }
    }

    #[test]
    fn limits_parse_and_fail_closed() {
        let r = read(&[
            ("limit-rps", "5"),
            ("limit-burst-multiplier", "2"),
            ("limit-whitelist", "10.0.0.0/8, 2001:db8::/32"),
        ]);
        assert_eq!(status(&r, "limit-rps"), Status::HonouredWithDifference);
        let (access, _) = resolve_with(&r, &[]);
        let limits = access.unwrap().rate_limit.clone().unwrap();
        assert_eq!(
            (limits.rps, limits.burst_multiplier, limits.ipv6_prefix),
            (Some(5), 2, 128)
        );
        assert_eq!(limits.allow.len(), 2);
        for pairs in [
            &[("limit-rps", "5/s")][..],
            &[("limit-rps", "5"), ("limit-allowlist", "10.0.0.0/33")],
        ] {
            let (access, _) = resolve_with(&read(pairs), &[]);
            assert!(
                access.unwrap().rate_limit.as_ref().unwrap().error.is_some(),
                "{pairs:?}"
            );
        }
        let r = read(&[("limit-rps", "0"), ("limit-burst-multiplier", "3")]);
        assert_eq!(
            status(&r, "limit-burst-multiplier"),
            Status::IgnoredUnsupported
        );
        assert_eq!(resolve_with(&r, &[]).0, None);
        let r = read(&[("limit-rpm", "60"), ("limit-burst-multiplier", "x")]);
        assert_eq!(status(&r, "limit-burst-multiplier"), Status::InvalidValue);
        let (access, _) = resolve_with(&r, &[]);
        assert_eq!(
            access
                .unwrap()
                .rate_limit
                .as_ref()
                .unwrap()
                .burst_multiplier,
            5
        );
        // duet.dev/limit-ipv6-prefix.
        let key = ObjectKey::new(Kind::Ingress, "ns", "ing");
        for (value, want, diagnosed) in [
            ("64", 64, false),
            ("48", 48, false),
            ("0", 128, true),
            ("x", 128, true),
        ] {
            let meta = ObjectMeta {
                annotations: Some(BTreeMap::from([(
                    LIMIT_IPV6_PREFIX_ANNOTATION.to_owned(),
                    value.to_owned(),
                )])),
                ..Default::default()
            };
            let mut diagnostics = Vec::new();
            let access = resolve(
                &read(&[("limit-rpm", "60")]).settings,
                &Annotated::new(&key, &meta),
                &BTreeMap::new(),
                &AuthDestinations::Default,
                &mut diagnostics,
                &mut References::default(),
            )
            .unwrap();
            assert_eq!(
                access.rate_limit.as_ref().unwrap().ipv6_prefix,
                want,
                "{value}"
            );
            assert_eq!(!diagnostics.is_empty(), diagnosed, "{value}");
        }
    }
}
