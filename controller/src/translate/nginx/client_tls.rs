//! ingress-nginx's client-certificate annotations: `auth-tls-secret` (a Secret's `ca.crt`),
//! `auth-tls-verify-client`, `auth-tls-verify-depth`, `auth-tls-pass-certificate-to-upstream`
//! and `auth-tls-error-page`, into the route's [`ClientAuth`]. A CA Secret that is missing, in
//! another namespace or without a usable `ca.crt` fails closed: the Ingress's routes answer 503.

use std::collections::BTreeMap;
use std::sync::Arc;

use dataplane::client_auth::{CertificateDer, CertificateRevocationListDer};
use dataplane::client_auth::{ClientAuth, MatchCn, VerifyClient};
use k8s_openapi::api::core::v1::Secret;

use super::{Read, Status, PREFIX};
use crate::object::{NsName, ObjectKey};
use crate::translate::{Diagnostic, Reason, References};

/// ingress-nginx's CA Secret annotation (`namespace/name`): the source watches the Secret.
pub const AUTH_TLS_SECRET_ANNOTATION: &str = "nginx.ingress.kubernetes.io/auth-tls-secret";

/// The keys this module reads (after the prefix).
pub const KEYS: [&str; 6] = [
    "auth-tls-secret",
    "auth-tls-verify-client",
    "auth-tls-verify-depth",
    "auth-tls-pass-certificate-to-upstream",
    "auth-tls-error-page",
    "auth-tls-match-cn",
];

/// The client-certificate annotations of one Ingress, validated.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Annotations {
    secret: Option<String>,
    /// `None`: `off`.
    verify: Option<VerifyClient>,
    verify_written: bool,
    depth: Option<u8>,
    pass: bool,
    error_page: Option<String>,
    /// `auth-tls-match-cn`: the pattern, or why it is refused (the routes then answer 503).
    match_cn: Option<Result<String, String>>,
}

/// Whether this module reads a key.
pub fn reads(name: &str) -> bool {
    KEYS.contains(&name)
}

/// Applies one key's value, or says why it does not parse.
pub fn apply(name: &str, value: &str, a: &mut Annotations) -> Result<(), String> {
    let v = value.trim();
    match name {
        "auth-tls-secret" if !v.is_empty() => a.secret = Some(v.to_owned()),
        "auth-tls-secret" => return Err("empty; no client certificate is asked for".to_owned()),
        "auth-tls-verify-client" => {
            a.verify_written = true;
            a.verify = match v {
                "on" => Some(VerifyClient::On),
                "optional" => Some(VerifyClient::Optional),
                "optional_no_ca" => Some(VerifyClient::OptionalNoCa),
                "off" => None,
                _ => {
                    a.verify = Some(VerifyClient::On);
                    return Err(format!(
                        "{value:?} is not on, off, optional or optional_no_ca; on applies"
                    ));
                }
            }
        }
        "auth-tls-verify-depth" => {
            a.depth = Some(
                v.parse::<u8>()
                    .ok()
                    .filter(|d| *d >= 1)
                    .ok_or_else(|| format!("{value:?} is not a depth from 1 to 255; 1 applies"))?,
            );
        }
        "auth-tls-pass-certificate-to-upstream" => a.pass = super::parse_bool(v)?,
        "auth-tls-error-page" => a.error_page = Some(super::parse_url(v)?),
        "auth-tls-match-cn" => {
            // ingress-nginx accepts `CN=` followed by a regex; anything else fails closed.
            let checked = if !v.starts_with("CN=") {
                Err(format!("{value:?} does not start with CN="))
            } else {
                MatchCn::new(v)
                    .map(|_| v.to_owned())
                    .map_err(|e| format!("{value:?} is not a valid regular expression: {e}"))
            };
            a.match_cn = Some(checked.clone());
            checked.map_err(|e| format!("{e}; the Ingress's routes answer 503 (fail closed)"))?;
        }
        _ => return Err(format!("{name} has no parser")),
    }
    Ok(())
}

/// The other keys have no effect without `auth-tls-secret` (as in ingress-nginx).
pub fn settle(read: &mut Read) {
    let a = &read.settings.client_tls;
    if a.secret.is_some() && (a.verify.is_some() || !a.verify_written) {
        return;
    }
    let reason = if a.secret.is_some() {
        "auth-tls-verify-client is off"
    } else {
        "a valid auth-tls-secret"
    };
    for f in &mut read.findings {
        let Some(name) = f.key.strip_prefix(PREFIX) else {
            continue;
        };
        let off_itself = name == "auth-tls-verify-client" || name == "auth-tls-secret";
        if reads(name) && f.status.is_honoured() && !(a.secret.is_some() && off_itself) {
            f.status = Status::IgnoredUnsupported;
            f.detail = format!("no effect without {reason} (as in ingress-nginx)");
        }
    }
}

/// The route's client-certificate settings: reads the CA Secret (recording the reference so its
/// changes are picked up); `None` without `auth-tls-secret` or with `verify-client: off`.
pub(crate) fn resolve(
    a: &Annotations,
    key: &ObjectKey,
    secrets: &BTreeMap<NsName, &Secret>,
    diagnostics: &mut Vec<Diagnostic>,
    references: &mut References,
) -> Option<Arc<ClientAuth>> {
    let written = a.secret.as_deref()?;
    let verify = if a.verify_written {
        a.verify?
    } else {
        VerifyClient::On
    };
    let (namespace, name) = written.split_once('/').unwrap_or((&key.namespace, written));
    let wanted = NsName::new(namespace, name);
    let ca = if namespace != &*key.namespace {
        Err((Reason::InvalidAnnotation, format!("{written:?} is in another namespace, which duet refuses (as ingress-nginx without allow-cross-namespace-resources)")))
    } else {
        references.secrets.insert(wanted.clone());
        match secrets.get(&wanted) {
            None => Err((
                Reason::MissingSecret,
                format!("Secret {wanted} does not exist"),
            )),
            Some(secret) => ca_certificates(secret)
                .and_then(|ca| Ok((ca, revocation_lists(secret)?)))
                .map_err(|e| (Reason::InvalidAnnotation, format!("Secret {wanted}: {e}"))),
        }
    };
    let ca = match &a.match_cn {
        Some(Err(problem)) => ca.and(Err((
            Reason::InvalidAnnotation,
            format!("auth-tls-match-cn {problem}"),
        ))),
        _ => ca,
    };
    let ((ca, crls), error) = match ca {
        Ok(ca) => (ca, None),
        Err((reason, problem)) => {
            let message = format!("{PREFIX}auth-tls-secret: {problem}: the Ingress's routes answer 503 (fail closed, as ingress-nginx)");
            diagnostics.push(Diagnostic::new(key.clone(), reason, message.clone()));
            ((Vec::new(), Vec::new()), Some(Arc::from(message.as_str())))
        }
    };
    Some(Arc::new(ClientAuth {
        source: wanted.to_string().into(),
        ca: ca.into(),
        crls: crls.into(),
        verify,
        depth: a.depth.unwrap_or(1),
        pass_certificate: a.pass,
        error_page: a.error_page.as_deref().map(Arc::from),
        error,
        match_cn: a
            .match_cn
            .as_ref()
            .and_then(|m| m.as_ref().ok())
            .and_then(|p| MatchCn::new(p).ok()),
    }))
}

/// The revocation lists of a Secret's `ca.crl` (PEM), none when it has no such key.
fn revocation_lists(secret: &Secret) -> Result<Vec<CertificateRevocationListDer<'static>>, String> {
    match secret.data.as_ref().and_then(|d| d.get("ca.crl")) {
        None => Ok(Vec::new()),
        Some(pem) => dataplane::client_auth::parse_crl(&pem.0),
    }
}

/// The CA certificates of a Secret's `ca.crt` (PEM).
fn ca_certificates(secret: &Secret) -> Result<Vec<CertificateDer<'static>>, String> {
    let pem = secret
        .data
        .as_ref()
        .and_then(|d| d.get("ca.crt"))
        .ok_or("has no ca.crt")?;
    dataplane::client_auth::parse_ca(&pem.0)
}
