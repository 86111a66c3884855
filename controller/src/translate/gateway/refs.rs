//! Certificate references of HTTPS listeners: a Secret in another namespace needs a
//! ReferenceGrant there (from Gateways of the listener's namespace to that Secret, or to every
//! Secret), else `ResolvedRefs=False` with reason `RefNotPermitted`; a Secret that is missing,
//! not `kubernetes.io/tls`, or whose `tls.crt`/`tls.key` do not load as a certificate and its key
//! is `ResolvedRefs=False` with reason `InvalidCertificateRef`. Pure: the caller fetches the
//! Secrets ([`to_fetch`]) and passes what it found.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;

use crate::gateway_api::conditions::Cond;
use crate::gateway_api::gateways::{GatewayListeners, GatewaySpec};
use crate::gateway_api::{ReferenceGrant, GROUP};

/// `namespace/name` of a Secret.
pub type SecretKey = (String, String);

/// The Secrets a listener names (kind and group already checked by
/// [`crate::translate::gateway::listeners::check`]), with the Gateway's namespace as default.
pub fn certificate_refs(listener: &GatewayListeners, gateway_ns: &str) -> Vec<SecretKey> {
    let refs = listener
        .tls
        .as_ref()
        .and_then(|t| t.certificate_refs.as_ref());
    refs.into_iter()
        .flatten()
        .map(|r| {
            let ns = r.namespace.clone().unwrap_or_else(|| gateway_ns.to_owned());
            (ns, r.name.clone())
        })
        .collect()
}

/// Whether a ReferenceGrant lets Gateways of `from_ns` use the Secret `to`.
pub fn granted(grants: &[ReferenceGrant], from_ns: &str, to: &SecretKey) -> bool {
    granted_to(grants, "Gateway", from_ns, to)
}

/// Whether a ReferenceGrant lets objects of `from_kind` (`Gateway`, `ListenerSet`) in
/// `from_ns` use the Secret `to`.
pub fn granted_to(
    grants: &[ReferenceGrant],
    from_kind: &str,
    from_ns: &str,
    to: &SecretKey,
) -> bool {
    granted_kind(grants, from_kind, from_ns, "Secret", to)
}

/// Whether a ReferenceGrant lets objects of `from_kind` in `from_ns` use the core object of
/// kind `to_kind` (`Secret`, `ConfigMap`) named `to`.
pub fn granted_kind(
    grants: &[ReferenceGrant],
    from_kind: &str,
    from_ns: &str,
    to_kind: &str,
    to: &SecretKey,
) -> bool {
    if from_ns == to.0 {
        return true;
    }
    grants
        .iter()
        .filter(|g| g.metadata.namespace.as_deref() == Some(&*to.0))
        .any(|g| {
            let from = g
                .spec
                .from
                .iter()
                .any(|f| f.group == GROUP && f.kind == from_kind && f.namespace == from_ns);
            let to = g.spec.to.iter().any(|t| {
                t.group.is_empty()
                    && t.kind == to_kind
                    && t.name.as_deref().is_none_or(|n| n == to.1)
            });
            from && to
        })
}

/// The Secrets to read for a listener: those it may reference.
pub fn to_fetch(
    listener: &GatewayListeners,
    gateway_ns: &str,
    grants: &[ReferenceGrant],
) -> Vec<SecretKey> {
    certificate_refs(listener, gateway_ns)
        .into_iter()
        .filter(|k| granted(grants, gateway_ns, k))
        .collect()
}

/// What is wrong with a Secret as a certificate, if anything.
fn secret_problem(secret: &Secret) -> Option<String> {
    if secret.type_.as_deref() != Some("kubernetes.io/tls") {
        return Some("is not of type kubernetes.io/tls".to_owned());
    }
    let data = secret.data.as_ref();
    let field = |k: &str| data.and_then(|d| d.get(k)).map(|b| b.0.as_slice());
    let (Some(crt), Some(key)) = (field("tls.crt"), field("tls.key")) else {
        return Some("lacks tls.crt or tls.key".to_owned());
    };
    dataplane::tls::load_pem("gateway", crt, key)
        .err()
        .map(|e| format!("does not hold a usable certificate: {e}"))
}

/// The listener's `ResolvedRefs` problem, if any, given the Secrets fetched (a key absent from
/// `secrets`, or mapped to `None`, is a Secret that does not exist).
pub fn problem(
    listener: &GatewayListeners,
    gateway_ns: &str,
    grants: &[ReferenceGrant],
    secrets: &BTreeMap<SecretKey, Option<Secret>>,
) -> Option<Cond> {
    problem_of("Gateway", listener, gateway_ns, grants, secrets)
}

/// [`problem`] for a listener of an object of `kind` (`Gateway`, `ListenerSet`) in `owner_ns`.
pub fn problem_of(
    kind: &str,
    listener: &GatewayListeners,
    owner_ns: &str,
    grants: &[ReferenceGrant],
    secrets: &BTreeMap<SecretKey, Option<Secret>>,
) -> Option<Cond> {
    for key in certificate_refs(listener, owner_ns) {
        let (ns, name) = &key;
        if !granted_to(grants, kind, owner_ns, &key) {
            return Some(Cond::no(
                "ResolvedRefs",
                "RefNotPermitted",
                format!("no ReferenceGrant in {ns} lets {kind}s of {owner_ns} use Secret {name}"),
            ));
        }
        let why = match secrets.get(&key).and_then(Option::as_ref) {
            None => Some("does not exist".to_owned()),
            Some(secret) => secret_problem(secret),
        };
        if let Some(why) = why {
            return Some(Cond::no(
                "ResolvedRefs",
                "InvalidCertificateRef",
                format!("Secret {ns}/{name} {why}"),
            ));
        }
    }
    None
}

/// The Secret of a Gateway's `tls.backend.clientCertificateRef` (the certificate duet presents
/// to TLS backends), with the Gateway's namespace as default, and whether its group and kind are
/// a core Secret's; `None` when the Gateway names none.
pub fn client_certificate_ref(spec: &GatewaySpec, gateway_ns: &str) -> Option<(SecretKey, bool)> {
    let r = spec
        .tls
        .as_ref()?
        .backend
        .as_ref()?
        .client_certificate_ref
        .as_ref()?;
    let ns = r.namespace.clone().unwrap_or_else(|| gateway_ns.to_owned());
    let secret = r.group.as_deref().unwrap_or("").is_empty()
        && r.kind.as_deref().unwrap_or("Secret") == "Secret";
    Some(((ns, r.name.clone()), secret))
}

/// The Gateway's `ResolvedRefs` for its client certificate, when it names one: `RefNotPermitted`
/// across namespaces without a ReferenceGrant, `InvalidClientCertificateRef` for another kind or
/// a Secret that is missing or holds no usable certificate and key (`secrets` as for
/// [`problem`]).
pub fn client_certificate_condition(
    spec: &GatewaySpec,
    gateway_ns: &str,
    grants: &[ReferenceGrant],
    secrets: &BTreeMap<SecretKey, Option<Secret>>,
) -> Option<Cond> {
    let (key, is_secret) = client_certificate_ref(spec, gateway_ns)?;
    let (ns, name) = &key;
    let invalid = |why: String| Cond::no("ResolvedRefs", "InvalidClientCertificateRef", why);
    if !is_secret {
        return Some(invalid(format!(
            "clientCertificateRef {name}: only core Secrets are supported"
        )));
    }
    if !granted(grants, gateway_ns, &key) {
        let message =
            format!("no ReferenceGrant in {ns} lets Gateways of {gateway_ns} use Secret {name}");
        return Some(Cond::no("ResolvedRefs", "RefNotPermitted", message));
    }
    let why = match secrets.get(&key).and_then(Option::as_ref) {
        None => Some("does not exist".to_owned()),
        Some(secret) => secret_problem(secret),
    };
    Some(match why {
        Some(why) => invalid(format!("clientCertificateRef Secret {ns}/{name} {why}")),
        None => Cond::yes("ResolvedRefs", "ResolvedRefs", ""),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;

    fn listener(refs: &str) -> GatewayListeners {
        serde_saphyr::from_str(&format!(
            "{{name: https, port: 443, protocol: HTTPS, tls: {{certificateRefs: {refs}}}}}"
        ))
        .unwrap()
    }

    fn grant(ns: &str, from_ns: &str, name: Option<&str>) -> ReferenceGrant {
        let to = match name {
            Some(n) => format!("{{group: '', kind: Secret, name: {n}}}"),
            None => "{group: '', kind: Secret}".to_owned(),
        };
        serde_saphyr::from_str(&format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: ReferenceGrant\nmetadata: {{name: g, namespace: {ns}}}\nspec: {{from: [{{group: gateway.networking.k8s.io, kind: Gateway, namespace: {from_ns}}}], to: [{to}]}}"
        ))
        .unwrap()
    }

    fn tls_secret(crt: &[u8], key: &[u8]) -> Secret {
        Secret {
            type_: Some("kubernetes.io/tls".to_owned()),
            data: Some(
                [
                    ("tls.crt".to_owned(), ByteString(crt.to_vec())),
                    ("tls.key".to_owned(), ByteString(key.to_vec())),
                ]
                .into(),
            ),
            ..Secret::default()
        }
    }

    #[test]
    fn cross_namespace_needs_a_grant_and_secrets_must_hold_a_certificate() {
        let cert = rcgen_pair();
        let l = listener("[{name: cert, namespace: web}]");
        let key: SecretKey = ("web".to_owned(), "cert".to_owned());
        let found = BTreeMap::from([(
            key.clone(),
            Some(tls_secret(cert.0.as_bytes(), cert.1.as_bytes())),
        )]);
        let reason = |grants: &[ReferenceGrant], secrets| {
            problem(&l, "gw", grants, secrets).map(|c| c.reason)
        };
        assert_eq!(reason(&[], &found), Some("RefNotPermitted"));
        assert_eq!(
            reason(&[grant("web", "gw", Some("other"))], &found),
            Some("RefNotPermitted")
        );
        assert_eq!(
            reason(&[grant("other", "gw", None)], &found),
            Some("RefNotPermitted")
        );
        assert_eq!(reason(&[grant("web", "gw", None)], &found), None);
        assert_eq!(reason(&[grant("web", "gw", Some("cert"))], &found), None);
        assert!(
            to_fetch(&l, "gw", &[]).is_empty(),
            "an ungranted Secret is not read"
        );
        let all = [grant("web", "gw", None)];
        let none = BTreeMap::new();
        assert_eq!(reason(&all, &none), Some("InvalidCertificateRef"));
        let bad = BTreeMap::from([(key.clone(), Some(tls_secret(b"not a cert", b"nor a key")))]);
        assert_eq!(reason(&all, &bad), Some("InvalidCertificateRef"));
        let mut opaque = tls_secret(cert.0.as_bytes(), cert.1.as_bytes());
        opaque.type_ = Some("Opaque".to_owned());
        let opaque = BTreeMap::from([(key, Some(opaque))]);
        assert_eq!(reason(&all, &opaque), Some("InvalidCertificateRef"));
    }

    /// A self-signed certificate and its key, PEM.
    fn rcgen_pair() -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["example.org".to_owned()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        (cert.pem(), key.serialize_pem())
    }

    fn backend_spec(client_ref: &str) -> GatewaySpec {
        serde_saphyr::from_str(&format!(
            "{{gatewayClassName: duet, listeners: [{{name: http, port: 80, protocol: HTTP}}], tls: {{backend: {{clientCertificateRef: {client_ref}}}}}}}"
        ))
        .unwrap()
    }

    #[test]
    fn backend_client_certificates_resolve_or_say_why_not() {
        let cert = rcgen_pair();
        let good = tls_secret(cert.0.as_bytes(), cert.1.as_bytes());
        let key = |ns: &str| (ns.to_owned(), "client".to_owned());
        let found = BTreeMap::from([
            (key("gw"), Some(good.clone())),
            (key("web"), Some(good)),
            (
                ("gw".to_owned(), "empty".to_owned()),
                Some(Secret::default()),
            ),
        ]);
        let reason = |r: &str, grants: &[ReferenceGrant]| {
            client_certificate_condition(&backend_spec(r), "gw", grants, &found)
                .map(|c| (c.status, c.reason))
        };
        assert_eq!(reason("{name: client}", &[]), Some((true, "ResolvedRefs")));
        let invalid = Some((false, "InvalidClientCertificateRef"));
        assert_eq!(reason("{name: missing}", &[]), invalid);
        assert_eq!(reason("{name: empty}", &[]), invalid);
        assert_eq!(reason("{kind: ConfigMap, name: client}", &[]), invalid);
        assert_eq!(reason("{group: example.com, name: client}", &[]), invalid);
        let across = "{name: client, namespace: web}";
        assert_eq!(reason(across, &[]), Some((false, "RefNotPermitted")));
        let grants = [grant("web", "gw", Some("client"))];
        assert_eq!(reason(across, &grants), Some((true, "ResolvedRefs")));
        let none: GatewaySpec =
            serde_saphyr::from_str("{gatewayClassName: duet, listeners: []}").unwrap();
        assert!(client_certificate_condition(&none, "gw", &[], &found).is_none());
    }
}
