//! Client certificate validation of a Gateway's HTTPS listeners (`spec.tls.frontend`): a port's
//! `perPort` entry, else the `default`, names CA bundles (`caCertificateRefs`: core ConfigMaps
//! or Secrets holding `ca.crt`) that the certificates clients present must chain to. Mode
//! `AllowValidOnly` (the default) refuses a handshake without such a certificate;
//! `AllowInsecureFallback` lets it go on with none or any, and the Gateway says so with
//! `InsecureFrontendValidationMode=True` (reason `ConfigurationChanged`).
//!
//! A reference that does not resolve puts `ResolvedRefs=False` on the port's HTTPS listeners:
//! `InvalidCACertificateKind` for a kind other than a core ConfigMap or Secret,
//! `RefNotPermitted` for an object of another namespace without a ReferenceGrant there,
//! `InvalidCACertificateRef` for one that is missing, has no `ca.crt`, or whose `ca.crt` holds no
//! usable CA certificate; when no reference gives a CA certificate, `Accepted=False` too
//! (`NoValidCACertificate`). Such listeners are not served (fail closed); the others are.
//!
//! Pure: the caller looks the referenced objects up.

use std::sync::Arc;

use dataplane::client_auth::{ClientAuth, VerifyClient};

use super::refs;
use crate::gateway_api::conditions::Cond;
use crate::gateway_api::gateways::{
    GatewaySpec, GatewayTlsFrontendDefaultValidationMode as DefaultMode,
    GatewayTlsFrontendPerPortTlsValidationMode as PortMode,
};
use crate::gateway_api::report::FrontendProblem;
use crate::gateway_api::ReferenceGrant;

/// The most CA certificates above a client's certificate (an intermediate CA sent by the client
/// and the root of the bundle fit in 2; the Gateway API leaves the depth to implementations).
pub const VERIFY_DEPTH: u8 = 8;

/// One `caCertificateRefs` entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CaRef {
    /// `group` (`""`: core).
    pub group: String,
    /// `kind`.
    pub kind: String,
    /// `name`.
    pub name: String,
    /// `namespace`, the Gateway's when absent.
    pub namespace: Option<String>,
}

/// The client certificate validation of one port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortValidation {
    /// The CA bundles.
    pub refs: Vec<CaRef>,
    /// Mode `AllowInsecureFallback`.
    pub insecure_fallback: bool,
}

/// The validation of the HTTPS listeners of `port`: its `perPort` entry when there is one (an
/// entry without `validation` turns validation off on that port), else the `default`.
pub fn validation(spec: &GatewaySpec, port: i32) -> Option<PortValidation> {
    let frontend = spec.tls.as_ref()?.frontend.as_ref()?;
    let per_port = frontend.per_port.iter().flatten().find(|p| p.port == port);
    if let Some(entry) = per_port {
        let v = entry.tls.validation.as_ref()?;
        let refs = v.ca_certificate_refs.iter().map(|r| CaRef {
            group: r.group.clone(),
            kind: r.kind.clone(),
            name: r.name.clone(),
            namespace: r.namespace.clone(),
        });
        return Some(PortValidation {
            refs: refs.collect(),
            insecure_fallback: v.mode == Some(PortMode::AllowInsecureFallback),
        });
    }
    let v = frontend.default.validation.as_ref()?;
    let refs = v.ca_certificate_refs.iter().map(|r| CaRef {
        group: r.group.clone(),
        kind: r.kind.clone(),
        name: r.name.clone(),
        namespace: r.namespace.clone(),
    });
    Some(PortValidation {
        refs: refs.collect(),
        insecure_fallback: v.mode == Some(DefaultMode::AllowInsecureFallback),
    })
}

/// The Gateway's `InsecureFrontendValidationMode` condition: present (and true) while its
/// default or a port's validation is in mode `AllowInsecureFallback`.
pub fn insecure_mode(spec: &GatewaySpec) -> Option<Cond> {
    let frontend = spec.tls.as_ref()?.frontend.as_ref()?;
    let default = frontend.default.validation.as_ref().map(|v| &v.mode)
        == Some(&Some(DefaultMode::AllowInsecureFallback));
    let ports: Vec<String> = frontend
        .per_port
        .iter()
        .flatten()
        .filter(|p| {
            p.tls.validation.as_ref().map(|v| &v.mode)
                == Some(&Some(PortMode::AllowInsecureFallback))
        })
        .map(|p| p.port.to_string())
        .collect();
    let message = match (default, ports.is_empty()) {
        (false, true) => return None,
        (true, true) => "the default client certificate validation is AllowInsecureFallback: \
                         clients without a valid certificate are let through"
            .to_owned(),
        (_, false) => format!(
            "client certificate validation is AllowInsecureFallback{} on port(s) {}: clients \
             without a valid certificate are let through",
            if default { " by default and" } else { "" },
            ports.join(", ")
        ),
    };
    Some(Cond::yes(
        "InsecureFrontendValidationMode",
        "ConfigurationChanged",
        message,
    ))
}

/// What a referenced object holds, as the caller found it: `None` when it does not exist, else
/// its `ca.crt` (`None` without that key).
pub type Found = Option<Option<Vec<u8>>>;

/// The settings the port's handshakes verify client certificates with, and what is wrong with
/// the references, if anything. `owner` is the Gateway's namespace; `fetch(kind, namespace,
/// name)` looks up a ConfigMap or Secret the Gateway may read.
pub fn resolve(
    v: &PortValidation,
    owner: &str,
    grants: &[ReferenceGrant],
    fetch: &mut dyn FnMut(&str, &str, &str) -> Found,
) -> (Option<Arc<ClientAuth>>, Option<FrontendProblem>) {
    let mut ca = Vec::new();
    let mut sources = Vec::new();
    let mut problems: Vec<(&'static str, String)> = Vec::new();
    for r in &v.refs {
        let ns = r.namespace.as_deref().unwrap_or(owner);
        let (kind, name) = (r.kind.as_str(), r.name.as_str());
        if !r.group.is_empty() || !matches!(kind, "ConfigMap" | "Secret") {
            let message = format!(
                "caCertificateRef {name} is a {kind} of group {:?}; only core ConfigMaps and \
                 Secrets holding ca.crt are supported",
                r.group
            );
            problems.push(("InvalidCACertificateKind", message));
            continue;
        }
        let key = (ns.to_owned(), name.to_owned());
        if !refs::granted_kind(grants, "Gateway", owner, kind, &key) {
            let message =
                format!("no ReferenceGrant in {ns} lets Gateways of {owner} use {kind} {name}");
            problems.push(("RefNotPermitted", message));
            continue;
        }
        let why = match fetch(kind, ns, name) {
            None => "does not exist".to_owned(),
            Some(None) => "has no ca.crt".to_owned(),
            Some(Some(pem)) => match dataplane::client_auth::parse_ca(&pem) {
                Ok(certs) => {
                    ca.extend(certs);
                    sources.push(format!("{ns}/{name}"));
                    continue;
                }
                Err(e) => e,
            },
        };
        let message = format!("caCertificateRef {kind} {ns}/{name} {why}");
        problems.push(("InvalidCACertificateRef", message));
    }
    let problem = problems.first().map(|(reason, _)| {
        let message: Vec<&str> = problems.iter().map(|(_, m)| m.as_str()).collect();
        let accepted = ca.is_empty().then(|| {
            Cond::no(
                "Accepted",
                "NoValidCACertificate",
                "no caCertificateRef of the listener's client certificate validation gives a \
                 usable CA certificate",
            )
        });
        FrontendProblem {
            resolved: Cond::no("ResolvedRefs", reason, message.join("; ")),
            accepted,
        }
    });
    let auth = (!ca.is_empty()).then(|| {
        Arc::new(ClientAuth {
            source: sources.join(",").into(),
            ca: ca.into(),
            crls: Arc::from([]),
            verify: if v.insecure_fallback {
                VerifyClient::OptionalNoCa
            } else {
                VerifyClient::On
            },
            depth: VERIFY_DEPTH,
            pass_certificate: false,
            error_page: None,
            error: None,
            match_cn: None,
        })
    });
    (auth, problem)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn spec(frontend: &str) -> GatewaySpec {
        serde_saphyr::from_str(&format!(
            "{{gatewayClassName: duet, listeners: [{{name: a, port: 443, protocol: HTTPS}}], tls: {{frontend: {frontend}}}}}"
        ))
        .unwrap()
    }

    fn ca_pem() -> String {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.self_signed(&key).unwrap().pem()
    }

    fn grant(ns: &str, kind: &str) -> ReferenceGrant {
        serde_saphyr::from_str(&format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: ReferenceGrant\nmetadata: {{name: g, namespace: {ns}}}\nspec: {{from: [{{group: gateway.networking.k8s.io, kind: Gateway, namespace: gw}}], to: [{{group: '', kind: {kind}}}]}}"
        ))
        .unwrap()
    }

    #[test]
    fn a_port_entry_overrides_the_default_and_modes_are_read() {
        let s = spec(
            "{default: {validation: {caCertificateRefs: [{group: '', kind: ConfigMap, name: d}]}}, \
             perPort: [{port: 8443, tls: {validation: {mode: AllowInsecureFallback, caCertificateRefs: [{group: '', kind: ConfigMap, name: p}]}}}, \
                       {port: 9443, tls: {}}]}",
        );
        let on = |port| validation(&s, port).map(|v| (v.refs[0].name.clone(), v.insecure_fallback));
        assert_eq!(on(443), Some(("d".to_owned(), false)));
        assert_eq!(on(8443), Some(("p".to_owned(), true)));
        assert_eq!(
            validation(&s, 9443),
            None,
            "a port entry without validation"
        );
        let cond = insecure_mode(&s).unwrap();
        assert_eq!(
            (cond.kind, cond.status, cond.reason),
            (
                "InsecureFrontendValidationMode",
                true,
                "ConfigurationChanged"
            )
        );
        assert!(cond.message.contains("8443"), "{}", cond.message);
        let strict = spec("{default: {validation: {mode: AllowValidOnly, caCertificateRefs: [{group: '', kind: ConfigMap, name: d}]}}}");
        assert_eq!(insecure_mode(&strict), None);
        let none: GatewaySpec =
            serde_saphyr::from_str("{gatewayClassName: duet, listeners: []}").unwrap();
        assert_eq!(validation(&none, 443), None);
        assert_eq!(insecure_mode(&none), None);
    }

    /// The reasons of resolving `refs` (YAML) in namespace `gw`, with `objects` by
    /// (kind, namespace, name), and whether settings came out.
    fn outcome(
        refs: &str,
        grants: &[ReferenceGrant],
        objects: &BTreeMap<(&str, &str, &str), Option<Vec<u8>>>,
    ) -> (
        Option<&'static str>,
        Option<&'static str>,
        Option<VerifyClient>,
    ) {
        let s = spec(&format!(
            "{{default: {{validation: {{caCertificateRefs: {refs}}}}}}}"
        ));
        let v = validation(&s, 443).unwrap();
        let mut fetch = |k: &str, ns: &str, n: &str| objects.get(&(k, ns, n)).cloned();
        let (auth, problem) = resolve(&v, "gw", grants, &mut fetch);
        (
            problem.as_ref().map(|p| p.resolved.reason),
            problem.and_then(|p| p.accepted).map(|c| c.reason),
            auth.map(|a| a.verify),
        )
    }

    #[test]
    fn references_resolve_or_give_the_spec_reasons_and_never_panic() {
        let pem = ca_pem().into_bytes();
        let objects = BTreeMap::from([
            (("ConfigMap", "gw", "ca"), Some(pem.clone())),
            (("Secret", "gw", "ca-secret"), Some(pem.clone())),
            (("ConfigMap", "other", "ca"), Some(pem)),
            (("ConfigMap", "gw", "empty"), None),
            (
                ("ConfigMap", "gw", "junk"),
                Some(b"not a certificate".to_vec()),
            ),
            (
                ("ConfigMap", "gw", "truncated"),
                Some(b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n".to_vec()),
            ),
        ]);
        let on = Some(VerifyClient::On);
        let cm = |name: &str| format!("[{{group: '', kind: ConfigMap, name: {name}}}]");
        assert_eq!(outcome(&cm("ca"), &[], &objects), (None, None, on));
        let secret = "[{group: '', kind: Secret, name: ca-secret}]";
        assert_eq!(outcome(secret, &[], &objects), (None, None, on));
        let no_ca = (
            Some("InvalidCACertificateRef"),
            Some("NoValidCACertificate"),
            None,
        );
        for name in ["missing", "empty", "junk", "truncated"] {
            assert_eq!(outcome(&cm(name), &[], &objects), no_ca, "{name}");
        }
        let service = "[{group: '', kind: Service, name: ca}]";
        let other_group = "[{group: example.com, kind: ConfigMap, name: ca}]";
        for refs in [service, other_group] {
            assert_eq!(
                outcome(refs, &[], &objects),
                (
                    Some("InvalidCACertificateKind"),
                    Some("NoValidCACertificate"),
                    None
                )
            );
        }
        let across = "[{group: '', kind: ConfigMap, name: ca, namespace: other}]";
        assert_eq!(
            outcome(across, &[], &objects),
            (Some("RefNotPermitted"), Some("NoValidCACertificate"), None)
        );
        assert_eq!(
            outcome(across, &[grant("other", "Secret")], &objects).0,
            Some("RefNotPermitted"),
            "a grant to Secrets is not one to ConfigMaps"
        );
        assert_eq!(
            outcome(across, &[grant("other", "ConfigMap")], &objects),
            (None, None, on)
        );
        // One usable bundle among bad ones: ResolvedRefs says so; the listener stays accepted
        // (a CA is usable), and is not served while a reference does not resolve.
        let mixed =
            "[{group: '', kind: ConfigMap, name: ca}, {group: '', kind: ConfigMap, name: missing}]";
        assert_eq!(
            outcome(mixed, &[], &objects),
            (Some("InvalidCACertificateRef"), None, on)
        );
    }

    #[test]
    fn insecure_fallback_admits_clients_without_a_valid_certificate() {
        let s = spec("{default: {validation: {mode: AllowInsecureFallback, caCertificateRefs: [{group: '', kind: ConfigMap, name: ca}]}}}");
        let v = validation(&s, 443).unwrap();
        let pem = ca_pem().into_bytes();
        let mut fetch = |_: &str, _: &str, _: &str| Some(Some(pem.clone()));
        let (auth, problem) = resolve(&v, "gw", &[], &mut fetch);
        assert_eq!(problem, None);
        let auth = auth.unwrap();
        assert_eq!(auth.verify, VerifyClient::OptionalNoCa);
        assert!(matches!(
            auth.decide(&[]),
            dataplane::client_auth::Decision::Pass(_)
        ));
    }
}
