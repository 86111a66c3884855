//! The certificate part of the route phase: `spec.tls` entries and the default TLS Secret become
//! the snapshot's [`CertTable`], and each Ingress learns which of its hosts redirect to HTTPS.
//!
//! - A `spec.tls` entry maps each of its `hosts` to its `secretName` (a `kubernetes.io/tls`
//!   Secret in the Ingress's namespace: PEM `tls.crt` chain, leaf first, and `tls.key`). Older
//!   Ingresses win a host claimed twice.
//! - A Secret that is missing, not `kubernetes.io/tls`, unparsable, or whose key does not match
//!   is a diagnostic; so is a certificate that does not cover a listed host. Only that host goes
//!   without its certificate (clients get the default one); routing is unaffected.
//! - An entry without `hosts` covers the Ingress's host-less rules (for redirects only).
//! - Hosts listed under `spec.tls` redirect plain HTTP to HTTPS with 308 unless the Ingress says
//!   `duet.dev/ssl-redirect: "false"`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use dataplane::table::{CertTable, TlsCert};
use k8s_openapi::api::core::v1::Secret;

use super::annotation::{annotation, parse_true_false, Annotated};
use super::{Diagnostic, Reason, References};
use crate::object::{by_name, Kind, NsName, ObjectKey};
use crate::stored::StoredIngress;

/// The per-Ingress annotation that turns the HTTPS redirect off (`"false"`).
pub const SSL_REDIRECT_ANNOTATION: &str = super::annotation::SSL_REDIRECT.name;

/// The Secret type of TLS certificates.
const TLS_SECRET_TYPE: &str = "kubernetes.io/tls";

/// The hosts of one Ingress that TLS covers, for the redirect decision.
#[derive(Debug, Default)]
pub(crate) struct TlsHosts {
    /// Lower-case hosts as written under `spec.tls[].hosts` (`*.example.com` included).
    hosts: BTreeSet<String>,
    /// An entry without hosts: the host-less rules are TLS too.
    hostless: bool,
    /// Redirect plain HTTP (the annotation is not `"false"`).
    redirect: bool,
}

impl TlsHosts {
    /// Whether plain-HTTP requests for a rule host (`""` for host-less rules) get a 308.
    pub(crate) fn redirects(&self, host: &str) -> bool {
        self.redirect
            && if host.is_empty() {
                self.hostless
            } else {
                self.hosts.contains(host)
            }
    }
}

/// Builds the certificate table while the route phase walks the Ingresses (oldest first).
pub(crate) struct CertBuilder<'a> {
    secrets: BTreeMap<NsName, &'a Secret>,
    loaded: BTreeMap<NsName, Result<Arc<TlsCert>, String>>,
    table: CertTable,
}

impl<'a> CertBuilder<'a> {
    pub(crate) fn new(secrets: &[&'a Secret]) -> CertBuilder<'a> {
        let secrets = by_name(secrets);
        CertBuilder {
            secrets,
            loaded: BTreeMap::new(),
            table: CertTable::default(),
        }
    }

    /// The certificate of a Secret (parsed once per translation); `None` if it does not exist.
    fn load(&mut self, name: &NsName) -> Option<Result<Arc<TlsCert>, String>> {
        if let Some(done) = self.loaded.get(name) {
            return Some(done.clone());
        }
        let secret = self.secrets.get(name)?;
        let result = parse_secret(name, secret);
        self.loaded.insert(name.clone(), result.clone());
        Some(result)
    }

    /// The `--default-tls-secret`: served to clients whose SNI matches no host, or who send none.
    pub(crate) fn default_secret(
        &mut self,
        name: &NsName,
        diagnostics: &mut Vec<Diagnostic>,
        references: &mut References,
    ) {
        references.secrets.insert(name.clone());
        let key = ObjectKey::new(Kind::Secret, &*name.namespace, &*name.name);
        match self.load(name) {
            Some(Ok(cert)) => self.table.set_default(cert),
            Some(Err(message)) => diagnostics.push(Diagnostic::new(
                key,
                Reason::InvalidCertificate,
                format!("default TLS secret: {message}; the self-signed certificate is served"),
            )),
            None => diagnostics.push(Diagnostic::new(
                key,
                Reason::MissingSecret,
                format!(
                    "default TLS secret {name} does not exist; the self-signed certificate is served"
                ),
            )),
        }
    }

    /// Takes one Ingress's `spec.tls` into the table; returns its TLS hosts.
    pub(crate) fn ingress(
        &mut self,
        key: &ObjectKey,
        ingress: &StoredIngress,
        diagnostics: &mut Vec<Diagnostic>,
        references: &mut References,
    ) -> TlsHosts {
        let obj = Annotated::ingress(key, ingress);
        let redirect = annotation(
            &obj,
            SSL_REDIRECT_ANNOTATION,
            parse_true_false,
            (true, "redirecting"),
            diagnostics,
        );
        let mut out = TlsHosts {
            redirect,
            ..TlsHosts::default()
        };
        let entries = ingress.spec.as_ref().and_then(|s| s.tls.as_ref());
        for tls in entries.into_iter().flatten() {
            let hosts: Vec<String> = tls
                .hosts
                .iter()
                .flatten()
                .map(|h| h.trim().trim_end_matches('.').to_ascii_lowercase())
                .filter(|h| !h.is_empty())
                .collect();
            if hosts.is_empty() {
                out.hostless = true;
            }
            out.hosts.extend(hosts.iter().cloned());
            let Some(secret) = tls.secret_name.as_deref().filter(|s| !s.is_empty()) else {
                continue;
            };
            let name = NsName::new(&*key.namespace, secret);
            references.secrets.insert(name.clone());
            self.entry(key, &name, &hosts, diagnostics);
        }
        out
    }

    /// Takes the certificate of Secret `name` for `hosts` (those it covers), from one `spec.tls`
    /// entry of the Ingress `key`.
    fn entry(
        &mut self,
        key: &ObjectKey,
        name: &NsName,
        hosts: &[String],
        diagnostics: &mut Vec<Diagnostic>,
    ) {
        let cert = match self.load(name) {
            None => {
                diagnostics.push(Diagnostic::new(
                    key.clone(),
                    Reason::MissingSecret,
                    format!("TLS secret {name} does not exist"),
                ));
                return;
            }
            Some(Err(message)) => {
                diagnostics.push(Diagnostic::new(
                    key.clone(),
                    Reason::InvalidCertificate,
                    format!("{message}; its hosts get the default certificate"),
                ));
                return;
            }
            Some(Ok(cert)) => cert,
        };
        for host in hosts {
            if !dataplane::tls::covers(&cert, host) {
                diagnostics.push(Diagnostic::new(
                    key.clone(),
                    Reason::CertificateHostMismatch,
                    format!(
                        "the certificate in {name} does not cover host {host}; it gets the default certificate"
                    ),
                ));
                continue;
            }
            // Ingresses come oldest first: a host already claimed stays with its owner.
            self.table.insert(host, cert.clone());
        }
    }

    /// Takes the host entries of a builder that ran over other hosts ([`CertTable::absorb`]).
    pub(crate) fn absorb(&mut self, table: CertTable) {
        self.table.absorb(table);
    }

    pub(crate) fn finish(self) -> CertTable {
        self.table
    }
}

fn parse_secret(name: &NsName, secret: &Secret) -> Result<Arc<TlsCert>, String> {
    let kind = secret.type_.as_deref().unwrap_or("Opaque");
    if kind != TLS_SECRET_TYPE {
        return Err(format!(
            "Secret {name} has type {kind}, not {TLS_SECRET_TYPE}"
        ));
    }
    let field = |k: &str| {
        secret
            .data
            .as_ref()
            .and_then(|d| d.get(k))
            .map(|b| b.0.as_slice())
            .filter(|b| !b.is_empty())
            .ok_or_else(|| format!("Secret {name} has no {k}"))
    };
    let chain = field("tls.crt")?;
    let key = field("tls.key")?;
    dataplane::tls::load_pem(&name.to_string(), chain, key)
        .map(Arc::new)
        .map_err(|e| format!("Secret {name}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;

    fn secret(name: &str, kind: Option<&str>, data: &[(&str, &[u8])]) -> Secret {
        let mut s = Secret::default();
        s.metadata.namespace = Some("ns".into());
        s.metadata.name = Some(name.into());
        s.type_ = kind.map(str::to_owned);
        s.data = Some(
            data.iter()
                .map(|(k, v)| (k.to_string(), ByteString(v.to_vec())))
                .collect(),
        );
        s
    }

    fn ingress(tls: serde_json::Value, annotations: serde_json::Value) -> StoredIngress {
        serde_json::from_value(serde_json::json!({
            "metadata": {"namespace": "ns", "name": "web", "annotations": annotations},
            "spec": {"tls": tls},
        }))
        .unwrap()
    }

    #[test]
    fn bad_secrets_are_diagnostics_for_their_hosts_only() {
        let cert = conformance::tls::cert(&["good.test", "*.wild.test"]);
        let good = secret(
            "good",
            Some(TLS_SECRET_TYPE),
            &[
                ("tls.crt", cert.cert_pem.as_bytes()),
                ("tls.key", cert.key_pem.as_bytes()),
            ],
        );
        let opaque = secret(
            "opaque",
            Some("Opaque"),
            &[
                ("tls.crt", cert.cert_pem.as_bytes()),
                ("tls.key", cert.key_pem.as_bytes()),
            ],
        );
        let keyless = secret(
            "keyless",
            Some(TLS_SECRET_TYPE),
            &[("tls.crt", cert.cert_pem.as_bytes())],
        );
        let garbage = secret(
            "garbage",
            Some(TLS_SECRET_TYPE),
            &[("tls.crt", b"nope"), ("tls.key", b"nope")],
        );
        let secrets = [&good, &opaque, &keyless, &garbage];
        let mut b = CertBuilder::new(&secrets);
        let key = ObjectKey::new(Kind::Ingress, "ns", "web");
        let ing = ingress(
            serde_json::json!([
                {"hosts": ["good.test", "x.wild.test"], "secretName": "good"},
                {"hosts": ["other.test"], "secretName": "good"},
                {"hosts": ["opaque.test"], "secretName": "opaque"},
                {"hosts": ["keyless.test"], "secretName": "keyless"},
                {"hosts": ["garbage.test"], "secretName": "garbage"},
                {"hosts": ["missing.test"], "secretName": "missing"},
            ]),
            serde_json::json!({SSL_REDIRECT_ANNOTATION: "maybe"}),
        );
        let mut diagnostics = Vec::new();
        let mut references = References::default();
        let hosts = b.ingress(&key, &ing, &mut diagnostics, &mut references);
        let mut reasons: Vec<Reason> = diagnostics.iter().map(|d| d.reason).collect();
        reasons.sort();
        assert_eq!(
            reasons,
            [
                Reason::MissingSecret,
                Reason::InvalidAnnotation,
                Reason::InvalidCertificate,
                Reason::InvalidCertificate,
                Reason::InvalidCertificate,
                Reason::CertificateHostMismatch,
            ],
            "{diagnostics:#?}"
        );
        assert_eq!(references.secrets.len(), 5);
        assert!(hosts.redirects("good.test") && hosts.redirects("missing.test"));
        assert!(!hosts.redirects("plain.test") && !hosts.redirects(""));
        let table = b.finish();
        let source = |sni: &str| table.find(Some(sni)).map(|c| c.source.to_string());
        assert_eq!(source("good.test").as_deref(), Some("ns/good"));
        assert_eq!(source("x.wild.test").as_deref(), Some("ns/good"));
        for host in ["other.test", "opaque.test", "keyless.test", "missing.test"] {
            assert_eq!(source(host), None, "{host}");
        }
    }

    #[test]
    fn redirect_annotation_and_hostless_entries() {
        let secrets: [&Secret; 0] = [];
        let key = ObjectKey::new(Kind::Ingress, "ns", "web");
        let mut b = CertBuilder::new(&secrets);
        let (mut d, mut r) = (Vec::new(), References::default());
        let on = b.ingress(
            &key,
            &ingress(serde_json::json!([{}]), serde_json::json!({})),
            &mut d,
            &mut r,
        );
        assert!(on.redirects(""));
        let off = b.ingress(
            &key,
            &ingress(
                serde_json::json!([{"hosts": ["a.test"]}]),
                serde_json::json!({SSL_REDIRECT_ANNOTATION: "false"}),
            ),
            &mut d,
            &mut r,
        );
        assert!(!off.redirects("a.test"));
        assert!(d.is_empty(), "{d:?}");
    }
}
