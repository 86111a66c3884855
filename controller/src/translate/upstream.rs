//! Upstream protocols in the route phase: the Service port's `appProtocol` selects the protocol
//! spoken to the pods, and for TLS protocols (`https`, `h2`) the Ingress's annotations select the
//! server name and the trust, built once per Ingress and Service into an [`UpstreamTls`].
//!
//! - `appProtocol`: absent, `http`, `kubernetes.io/ws` or `ws` -> HTTP/1.1; `kubernetes.io/h2c`,
//!   `h2c` or `grpc` -> HTTP/2 cleartext with prior knowledge; `https`, `kubernetes.io/wss` or
//!   `wss` -> HTTP/1.1 over TLS; `h2` or `grpcs` -> HTTP/2 over TLS (ALPN `h2`). Case-insensitive.
//!   Anything else is an `UnsupportedAppProtocol` diagnostic on the Service, served as HTTP/1.1.
//! - `duet.dev/backend-ca-secret: NAME`: the certificate is verified against `ca.crt` of that
//!   Secret (same namespace). Missing: `MissingSecret`; no usable certificate:
//!   `InvalidBackendTls`; either way the Ingress's TLS routes answer 502.
//! - `duet.dev/backend-tls-skip-verify: "true"`: no verification (`InsecureBackendTls` warning).
//! - Neither: verified against the system trust roots.
//! - `duet.dev/backend-tls-server-name`: the name sent as SNI and checked in the certificate;
//!   default `SERVICE.NAMESPACE.svc` (never the pod's IP address).

use std::collections::BTreeMap;
use std::sync::Arc;

use dataplane::table::UpstreamProtocol;
use dataplane::upstream_tls::{UpstreamTls, UpstreamTrust};
use k8s_openapi::api::core::v1::Secret;

use super::annotation::{annotation, Annotated};
use super::{Diagnostic, Reason, References};
use crate::object::{by_name, NsName, ObjectKey};
use crate::stored::StoredIngress;

/// The per-Ingress annotation naming the Secret (key `ca.crt`) that verifies TLS upstreams.
pub const BACKEND_CA_SECRET_ANNOTATION: &str = super::annotation::BACKEND_CA_SECRET.name;
/// The per-Ingress annotation that turns upstream certificate verification off (`"true"`).
pub const BACKEND_TLS_SKIP_VERIFY_ANNOTATION: &str =
    super::annotation::BACKEND_TLS_SKIP_VERIFY.name;
/// The per-Ingress annotation setting the TLS server name (SNI, and the name verified).
pub const BACKEND_TLS_SERVER_NAME_ANNOTATION: &str =
    super::annotation::BACKEND_TLS_SERVER_NAME.name;

/// The key of the CA bundle in the CA Secret.
const CA_KEY: &str = "ca.crt";

/// The upstream protocol of a Service port's `appProtocol`; `None` for a value duet does not
/// know.
pub fn app_protocol(value: Option<&str>) -> Option<UpstreamProtocol> {
    let Some(value) = value.map(str::trim).filter(|v| !v.is_empty()) else {
        return Some(UpstreamProtocol::Http1);
    };
    let value = value.to_ascii_lowercase();
    Some(match value.as_str() {
        "http" | "kubernetes.io/ws" | "ws" => UpstreamProtocol::Http1,
        "kubernetes.io/h2c" | "h2c" | "grpc" => UpstreamProtocol::H2c,
        "https" | "kubernetes.io/wss" | "wss" => UpstreamProtocol::Https,
        "h2" | "grpcs" => UpstreamProtocol::H2,
        _ => return None,
    })
}

/// The server name (`duet.dev/backend-tls-server-name`, else `SERVICE.NAMESPACE.svc`) and whether
/// verification is off (`duet.dev/backend-tls-skip-verify`) for routes of `obj` to `service`. An
/// empty value counts as absent.
fn verification(
    obj: &Annotated<'_>,
    service: &NsName,
    diagnostics: &mut Vec<Diagnostic>,
) -> (String, bool) {
    let default_name = format!("{}.{}.svc", service.name, service.namespace);
    let server_name = annotation(
        obj,
        BACKEND_TLS_SERVER_NAME_ANNOTATION,
        |v| match v.trim() {
            "" => Ok(default_name.clone()),
            name if dataplane::upstream_tls::valid_server_name(name) => Ok(name.to_owned()),
            name => Err(format!("{name:?} is neither a DNS name nor an IP address")),
        },
        (default_name.clone(), format_args!("using {default_name}")),
        diagnostics,
    );
    let skip = annotation(
        obj,
        BACKEND_TLS_SKIP_VERIFY_ANNOTATION,
        |v| match v.trim() {
            "" => Ok(false),
            v if v.eq_ignore_ascii_case("true") => Ok(true),
            v if v.eq_ignore_ascii_case("false") => Ok(false),
            v => Err(format!("{v:?} is not \"true\" or \"false\"")),
        },
        (false, "certificates are verified"),
        diagnostics,
    );
    (server_name, skip)
}

/// Builds the TLS settings of routes while the route phase walks the Ingresses.
pub(crate) struct UpstreamTlsBuilder<'a> {
    secrets: BTreeMap<NsName, &'a Secret>,
    built: BTreeMap<(NsName, NsName, bool), Arc<UpstreamTls>>,
}

impl<'a> UpstreamTlsBuilder<'a> {
    pub(crate) fn new(secrets: &[&'a Secret]) -> UpstreamTlsBuilder<'a> {
        let secrets = by_name(secrets);
        UpstreamTlsBuilder {
            secrets,
            built: BTreeMap::new(),
        }
    }

    /// The settings built so far, to be absorbed by another builder.
    pub(crate) fn into_built(self) -> BTreeMap<(NsName, NsName, bool), Arc<UpstreamTls>> {
        self.built
    }

    /// Takes the settings another builder made (for other Ingresses).
    pub(crate) fn absorb(&mut self, mut built: BTreeMap<(NsName, NsName, bool), Arc<UpstreamTls>>) {
        self.built.append(&mut built);
    }

    /// The TLS settings of a route of `ingress` to `service`, `None` for plain protocols. Built
    /// once per Ingress, Service and ALPN; problems become diagnostics of the Ingress. With
    /// `unverified_default` (the protocol comes from ingress-nginx's `backend-protocol`, whose
    /// `proxy-ssl-verify` defaults to off), certificates are not verified unless a CA Secret is
    /// given.
    pub(crate) fn route(
        &mut self,
        key: &ObjectKey,
        ingress: &StoredIngress,
        service: &NsName,
        (protocol, unverified_default): (UpstreamProtocol, bool),
        diagnostics: &mut Vec<Diagnostic>,
        references: &mut References,
    ) -> Option<Arc<UpstreamTls>> {
        if !protocol.is_tls() {
            return None;
        }
        let h2 = protocol.is_h2();
        let ingress_name = NsName::new(key.namespace.clone(), key.name.clone());
        let cache_key = (ingress_name, service.clone(), h2);
        if let Some(done) = self.built.get(&cache_key) {
            return Some(done.clone());
        }
        let obj = Annotated::ingress(key, ingress);
        let (server_name, skip) = verification(&obj, service, diagnostics);
        let ca = obj
            .get(BACKEND_CA_SECRET_ANNOTATION)
            .map(str::trim)
            .filter(|v| !v.is_empty());
        let trust = if skip {
            diagnostics.push(Diagnostic::new(
                key.clone(),
                Reason::InsecureBackendTls,
                format!(
                    "{BACKEND_TLS_SKIP_VERIFY_ANNOTATION} is \"true\": the certificates of Service {service} are not verified{}",
                    if ca.is_some() { " (the CA Secret is ignored)" } else { "" }
                ),
            ));
            Ok(UpstreamTrust::SkipVerify)
        } else {
            match ca {
                None if unverified_default => Ok(UpstreamTrust::SkipVerify),
                None => Ok(UpstreamTrust::SystemRoots),
                Some(name) => self.ca_trust(key, name, diagnostics, references),
            }
        };
        let built = match trust {
            Ok(trust) => match UpstreamTls::new(&server_name, &trust, h2) {
                Ok(tls) => tls,
                Err(error) => {
                    diagnostics.push(Diagnostic::new(
                        key.clone(),
                        Reason::InvalidBackendTls,
                        format!(
                            "upstream TLS to Service {service}: {error}; its routes answer 502"
                        ),
                    ));
                    UpstreamTls::unusable(&server_name, &trust, &error.to_string())
                }
            },
            Err((trust, reason)) => UpstreamTls::unusable(&server_name, &trust, &reason),
        };
        let built = Arc::new(built);
        self.built.insert(cache_key, built.clone());
        Some(built)
    }

    /// The trust of a CA Secret; a missing Secret or one without `ca.crt` is a diagnostic.
    fn ca_trust(
        &mut self,
        key: &ObjectKey,
        name: &str,
        diagnostics: &mut Vec<Diagnostic>,
        references: &mut References,
    ) -> Result<UpstreamTrust, (UpstreamTrust, String)> {
        let secret_name = NsName::new(key.namespace.clone(), name.to_owned());
        references.secrets.insert(secret_name.clone());
        let source: Arc<str> = secret_name.to_string().into();
        let failed = |reason: String| {
            let trust = UpstreamTrust::Ca {
                source: source.clone(),
                pem: Vec::new(),
            };
            (trust, reason)
        };
        let Some(secret) = self.secrets.get(&secret_name) else {
            let reason = format!("CA Secret {secret_name} does not exist");
            diagnostics.push(Diagnostic::new(
                key.clone(),
                Reason::MissingSecret,
                format!("{BACKEND_CA_SECRET_ANNOTATION}: {reason}; TLS routes answer 502"),
            ));
            return Err(failed(reason));
        };
        let pem = secret
            .data
            .as_ref()
            .and_then(|d| d.get(CA_KEY))
            .map(|b| b.0.clone())
            .or_else(|| {
                secret
                    .string_data
                    .as_ref()
                    .and_then(|d| d.get(CA_KEY))
                    .map(|s| s.clone().into_bytes())
            })
            .filter(|b| !b.is_empty());
        match pem {
            Some(pem) => Ok(UpstreamTrust::Ca { source, pem }),
            None => {
                let reason = format!("Secret {secret_name} has no {CA_KEY}");
                diagnostics.push(Diagnostic::new(
                    key.clone(),
                    Reason::InvalidBackendTls,
                    format!("{BACKEND_CA_SECRET_ANNOTATION}: {reason}; TLS routes answer 502"),
                ));
                Err(failed(reason))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn app_protocols() {
        use UpstreamProtocol::*;
        for (value, expected) in [
            (None, Some(Http1)),
            (Some(""), Some(Http1)),
            (Some("http"), Some(Http1)),
            (Some("kubernetes.io/ws"), Some(Http1)),
            (Some("kubernetes.io/h2c"), Some(H2c)),
            (Some("H2C"), Some(H2c)),
            (Some("grpc"), Some(H2c)),
            (Some("https"), Some(Https)),
            (Some("kubernetes.io/wss"), Some(Https)),
            (Some("h2"), Some(H2)),
            (Some("grpcs"), Some(H2)),
            (Some("tcp"), None),
            (Some("example.com/custom"), None),
        ] {
            assert_eq!(app_protocol(value), expected, "{value:?}");
        }
    }
}
