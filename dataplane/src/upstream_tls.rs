//! Upstream TLS settings as plain data: the server name sent as SNI and verified, the trust
//! (CA roots as parsed DER certificates, the system roots, or none) and the ALPN offered. A route
//! of the snapshot carries them; the dataplane turns them into rustls client configurations when
//! it applies a snapshot (`upstream::tls`), never per request, and keeps those across snapshots
//! while the settings are unchanged.

use std::sync::Arc;

use rustls::pki_types::{CertificateDer, ServerName};
use rustls::RootCertStore;
use serde::{Serialize, Serializer};

/// What an upstream certificate is verified against, as the controller reads it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum UpstreamTrust {
    /// The PEM certificates of a CA bundle (`ca.crt` of a Secret).
    Ca {
        /// Where the bundle came from (`namespace/name`), for logs and `/debug/routes`.
        source: Arc<str>,
        /// The PEM text.
        pem: Vec<u8>,
    },
    /// The system trust roots (the CA bundle of the machine or image duet runs on).
    SystemRoots,
    /// No verification at all (`duet.dev/backend-tls-skip-verify: "true"`).
    SkipVerify,
}

/// The trust of [`UpstreamTls`], parsed: the CA roots as DER certificates rustls accepts.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum TrustRoots {
    /// These roots, from the Secret `source`.
    Ca {
        /// Where the bundle came from (`namespace/name`).
        source: Arc<str>,
        /// The certificates, each accepted as a trust anchor.
        roots: Arc<[CertificateDer<'static>]>,
    },
    /// The system trust roots.
    SystemRoots,
    /// No verification.
    SkipVerify,
}

impl TrustRoots {
    fn label(&self) -> String {
        match self {
            TrustRoots::Ca { source, .. } => format!("secret {source}"),
            TrustRoots::SystemRoots => "system roots".to_owned(),
            TrustRoots::SkipVerify => "none (skip verify)".to_owned(),
        }
    }
}

/// A subject alternative name the upstream certificate must carry (BackendTLSPolicy's
/// `subjectAltNames`): when any is given, the certificate is checked for these instead of the
/// server name, which is then only sent as SNI.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum SubjectAltName {
    /// A DNS name (`dNSName`; a wildcard in the certificate matches as for server names).
    Hostname(Arc<str>),
    /// A URI (`uniformResourceIdentifier`), compared exactly (a SPIFFE ID, say).
    Uri(Arc<str>),
}

/// Why TLS settings for an upstream could not be built.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamTlsError {
    /// The server name is neither a DNS name nor an IP address.
    #[error("invalid TLS server name {0:?}")]
    ServerName(String),
    /// The CA bundle holds no certificate rustls accepts.
    #[error("no usable CA certificate in {source_name}: {reason}")]
    Ca {
        /// The Secret.
        source_name: Arc<str>,
        /// What went wrong.
        reason: String,
    },
}

/// How duet speaks TLS to the targets of one route: the server name sent as SNI and checked in
/// the certificate, the trust, and the ALPN (`h2` or `http/1.1`). Plain data, compared by value;
/// built once per Ingress and Service when the snapshot is translated. Settings that could not be
/// built (a missing or invalid CA Secret) carry the reason instead, and their routes answer 502.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct UpstreamTls {
    server_name: Arc<str>,
    trust: TrustRoots,
    h2: bool,
    subject_alt_names: Arc<[SubjectAltName]>,
    client_cert: Option<ClientCert>,
    error: Option<Arc<str>>,
}

/// The certificate duet presents to the upstream when asked (a Gateway's
/// `tls.backend.clientCertificateRef`): PEM, as in a `kubernetes.io/tls` Secret.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ClientCert {
    /// Where it came from (`namespace/name`), for logs and `/debug/routes`.
    pub source: Arc<str>,
    /// The certificate chain (`tls.crt`).
    pub cert_pem: Arc<[u8]>,
    /// The private key (`tls.key`).
    pub key_pem: Arc<[u8]>,
}

impl UpstreamTls {
    /// Checks and records the settings: `server_name` (DNS name or IP address) is sent as SNI and
    /// checked in the certificate, whatever address the target is reached at; `h2` offers ALPN
    /// `h2` (else `http/1.1`); a CA bundle must hold a certificate rustls accepts as a root.
    pub fn new(
        server_name: &str,
        trust: &UpstreamTrust,
        h2: bool,
    ) -> Result<UpstreamTls, UpstreamTlsError> {
        if !valid_server_name(server_name) {
            return Err(UpstreamTlsError::ServerName(server_name.to_owned()));
        }
        let trust = match trust {
            UpstreamTrust::SkipVerify => TrustRoots::SkipVerify,
            UpstreamTrust::SystemRoots => TrustRoots::SystemRoots,
            UpstreamTrust::Ca { source, pem } => TrustRoots::Ca {
                source: source.clone(),
                roots: ca_roots(pem).map_err(|reason| UpstreamTlsError::Ca {
                    source_name: source.clone(),
                    reason,
                })?,
            },
        };
        Ok(UpstreamTls {
            server_name: server_name.into(),
            trust,
            h2,
            subject_alt_names: Arc::new([]),
            client_cert: None,
            error: None,
        })
    }

    /// The same settings checking the certificate for one of `names` instead of the server
    /// name (none: the server name, as before).
    pub fn with_subject_alt_names(mut self, names: Vec<SubjectAltName>) -> UpstreamTls {
        self.subject_alt_names = names.into();
        self
    }

    /// Settings that cannot be used: requests of the route answer 502 and log `reason`.
    pub fn unusable(server_name: &str, trust: &UpstreamTrust, reason: &str) -> UpstreamTls {
        let trust = match trust {
            UpstreamTrust::SkipVerify => TrustRoots::SkipVerify,
            UpstreamTrust::SystemRoots => TrustRoots::SystemRoots,
            UpstreamTrust::Ca { source, .. } => TrustRoots::Ca {
                source: source.clone(),
                roots: Arc::new([]),
            },
        };
        UpstreamTls {
            server_name: server_name.into(),
            trust,
            h2: false,
            subject_alt_names: Arc::new([]),
            client_cert: None,
            error: Some(reason.into()),
        }
    }

    /// The server name sent as SNI and verified.
    pub fn server_name(&self) -> &str {
        &self.server_name
    }

    /// What the certificate is verified against.
    pub fn trust(&self) -> &TrustRoots {
        &self.trust
    }

    /// Whether ALPN offers `h2` (else `http/1.1`).
    pub fn h2(&self) -> bool {
        self.h2
    }

    /// The same settings presenting `cert` to the upstream when it asks for a certificate.
    pub fn with_client_cert(mut self, cert: ClientCert) -> UpstreamTls {
        self.client_cert = Some(cert);
        self
    }

    /// The certificate presented to the upstream, if any.
    pub fn client_cert(&self) -> Option<&ClientCert> {
        self.client_cert.as_ref()
    }

    /// The subject alternative names checked instead of the server name (empty: the server
    /// name is checked).
    pub fn subject_alt_names(&self) -> &[SubjectAltName] {
        &self.subject_alt_names
    }

    /// Why the settings are unusable, if they are.
    pub fn error(&self) -> Option<&str> {
        self.error.as_deref()
    }
}

impl Serialize for UpstreamTls {
    /// Server name, trust and the error if unusable; never key material.
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut st = s.serialize_struct("UpstreamTls", 4)?;
        st.serialize_field("server_name", &*self.server_name)?;
        st.serialize_field("trust", &self.trust.label())?;
        if !self.subject_alt_names.is_empty() {
            st.serialize_field("subject_alt_names", &*self.subject_alt_names)?;
        }
        if let Some(c) = &self.client_cert {
            st.serialize_field("client_cert", &*c.source)?;
        }
        st.serialize_field("error", &self.error())?;
        st.end()
    }
}

/// Whether a TLS server name is a DNS name or an IP address rustls accepts.
pub fn valid_server_name(name: &str) -> bool {
    ServerName::try_from(name).is_ok()
}

/// The certificates of a PEM bundle that rustls accepts as roots; an error when there is none.
fn ca_roots(pem: &[u8]) -> Result<Arc<[CertificateDer<'static>]>, String> {
    use rustls::pki_types::pem::PemObject;
    let mut store = RootCertStore::empty();
    let mut roots = Vec::new();
    let mut errors = Vec::new();
    for cert in CertificateDer::pem_slice_iter(pem) {
        match cert {
            Ok(cert) => match store.add(cert.clone()) {
                Ok(()) => roots.push(cert),
                Err(e) => errors.push(e.to_string()),
            },
            Err(e) => errors.push(e.to_string()),
        }
    }
    if roots.is_empty() {
        let reason = errors
            .first()
            .cloned()
            .unwrap_or_else(|| "no PEM certificate".to_owned());
        return Err(reason);
    }
    Ok(roots.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_compare_by_name_trust_and_alpn() {
        let a = UpstreamTls::new("web.shop.svc", &UpstreamTrust::SkipVerify, false).unwrap();
        let b = UpstreamTls::new("web.shop.svc", &UpstreamTrust::SkipVerify, false).unwrap();
        let c = UpstreamTls::new("web.shop.svc", &UpstreamTrust::SkipVerify, true).unwrap();
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert!(UpstreamTls::new("bad name!", &UpstreamTrust::SkipVerify, false).is_err());
        let ip = UpstreamTls::new("2001:db8::1", &UpstreamTrust::SystemRoots, false).unwrap();
        assert_eq!(ip.server_name(), "2001:db8::1");
    }

    #[test]
    fn garbage_ca_is_an_error() {
        let trust = UpstreamTrust::Ca {
            source: "ns/ca".into(),
            pem: b"not a certificate".to_vec(),
        };
        let error = UpstreamTls::new("a.b.svc", &trust, false).unwrap_err();
        assert!(error.to_string().contains("ns/ca"), "{error}");
    }
}
