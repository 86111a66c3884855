//! TLS termination: PEM chains and keys into rustls certified keys, SNI certificate selection
//! from the live snapshot, a self-signed fallback, and the server configuration (rustls with the
//! ring provider, TLS 1.2 and 1.3 only, ALPN `h2` and `http/1.1`).

use std::fmt;
use std::sync::Arc;

use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::ServerConfig;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};

use crate::runtime::Runtime;
use crate::table::TlsCert;

/// Why a certificate or key cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// `tls.crt` holds no PEM `CERTIFICATE` block.
    #[error("tls.crt holds no PEM certificate")]
    NoCertificate,
    /// `tls.crt` has a PEM block that does not decode.
    #[error("tls.crt is not valid PEM: {0}")]
    BadCertificatePem(#[source] rustls_pki_types::pem::Error),
    /// `tls.key` holds no usable private key (PKCS#1 RSA, SEC1 EC or PKCS#8).
    #[error("tls.key holds no usable private key: {0}")]
    BadKeyPem(#[source] rustls_pki_types::pem::Error),
    /// The key is of a kind rustls cannot sign with.
    #[error("tls.key is not a supported RSA, ECDSA or Ed25519 key: {0}")]
    UnsupportedKey(#[source] rustls::Error),
    /// The key does not belong to the first certificate of the chain.
    #[error("tls.key does not match the certificate in tls.crt")]
    KeyMismatch,
    /// The first certificate does not parse as X.509.
    #[error("tls.crt's first certificate is not valid X.509: {0}")]
    BadCertificate(webpki::Error),
    /// Generating the self-signed fallback failed.
    #[error("cannot generate a self-signed certificate: {0}")]
    Generate(#[source] rcgen::Error),
}

/// The crypto provider duet uses everywhere: ring.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Loads a PEM chain (leaf first) and its private key (RSA PKCS#1, ECDSA SEC1, or PKCS#8 of
/// RSA, ECDSA or Ed25519), checking that the key matches the leaf.
pub fn load_pem(source: &str, chain_pem: &[u8], key_pem: &[u8]) -> Result<TlsCert, TlsError> {
    let chain = CertificateDer::pem_slice_iter(chain_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(TlsError::BadCertificatePem)?;
    if chain.is_empty() {
        return Err(TlsError::NoCertificate);
    }
    webpki::EndEntityCert::try_from(&chain[0]).map_err(TlsError::BadCertificate)?;
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(TlsError::BadKeyPem)?;
    let signing = provider()
        .key_provider
        .load_private_key(key)
        .map_err(TlsError::UnsupportedKey)?;
    let certified = CertifiedKey::new(chain, signing);
    match certified.keys_match() {
        Ok(()) => {}
        // The provider cannot tell for this key type; the handshake will.
        Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => {}
        Err(_) => return Err(TlsError::KeyMismatch),
    }
    Ok(TlsCert {
        source: source.into(),
        key: Arc::new(certified),
    })
}

/// Whether the certificate's names cover `host` (`foo.example.com`, or `*.example.com`, which is
/// checked with a name one label under the suffix).
pub fn covers(cert: &TlsCert, host: &str) -> bool {
    let Some(leaf) = cert.key.cert.first() else {
        return false;
    };
    let Ok(leaf) = webpki::EndEntityCert::try_from(leaf) else {
        return false;
    };
    let probe = match host.strip_prefix("*.") {
        Some(suffix) => format!("duet-wildcard-probe.{suffix}"),
        None => host.to_owned(),
    };
    let Ok(name) = ServerName::try_from(probe) else {
        return false;
    };
    leaf.verify_is_valid_for_subject_name(&name).is_ok()
}

/// A self-signed ECDSA P-256 certificate for `duet.invalid`, for clients that match no
/// configured certificate when there is no `--default-tls-secret`.
pub fn self_signed() -> Result<TlsCert, TlsError> {
    let key = rcgen::KeyPair::generate().map_err(TlsError::Generate)?;
    let params = rcgen::CertificateParams::new(vec!["duet.invalid".to_owned()])
        .map_err(TlsError::Generate)?;
    let cert = params.self_signed(&key).map_err(TlsError::Generate)?;
    load_pem(
        "self-signed",
        cert.pem().as_bytes(),
        key.serialize_pem().as_bytes(),
    )
}

/// Picks the certificate for each handshake from the snapshot live at that moment; connections
/// keep the certificate they were given when the table changes.
pub struct SniResolver {
    runtime: Arc<Runtime>,
    fallback: Arc<CertifiedKey>,
}

impl fmt::Debug for SniResolver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SniResolver").finish_non_exhaustive()
    }
}

impl SniResolver {
    /// A resolver over a runtime's snapshots, with `fallback` for when no certificate (not
    /// even a default) matches.
    pub fn new(runtime: Arc<Runtime>, fallback: &TlsCert) -> SniResolver {
        SniResolver {
            runtime,
            fallback: fallback.key.clone(),
        }
    }
}

impl ResolvesServerCert for SniResolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let live = self.runtime.load();
        let found = live.snapshot.certs.find(hello.server_name());
        tracing::trace!(
            tls.sni = hello.server_name().unwrap_or(""),
            tls.cert = found.map_or("fallback", |c| &*c.source),
            "Certificate chosen"
        );
        Some(found.map_or_else(|| self.fallback.clone(), |c| c.key.clone()))
    }
}

/// The server configuration of the HTTPS listeners: TLS 1.2 and 1.3, ALPN `h2` then
/// `http/1.1`, certificates by SNI from the live snapshot.
pub fn server_config(runtime: Arc<Runtime>, fallback: &TlsCert) -> Arc<ServerConfig> {
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .expect("ring supports TLS 1.2 and 1.3")
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(SniResolver::new(runtime, fallback)));
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Arc::new(config)
}

/// The `Location` of the HTTPS redirect for a plain-HTTP request: the request's host without
/// its port (IPv6 literals keep their brackets), `https_port` unless it is 443, then the path
/// and query.
pub fn redirect_location(host: &str, https_port: u16, path_and_query: &str) -> String {
    let host = crate::table::strip_port(host);
    if https_port == 443 {
        format!("https://{host}{path_and_query}")
    } else {
        format!("https://{host}:{https_port}{path_and_query}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::CertTable;

    fn generated(names: &[&str], alg: &'static rcgen::SignatureAlgorithm) -> (String, String) {
        let key = rcgen::KeyPair::generate_for(alg).unwrap();
        let params =
            rcgen::CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .unwrap();
        let cert = params.self_signed(&key).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    #[test]
    fn loads_ecdsa_and_ed25519_keys_and_checks_names() {
        for alg in [&rcgen::PKCS_ECDSA_P256_SHA256, &rcgen::PKCS_ED25519] {
            let (crt, key) = generated(&["a.test", "*.wild.test"], alg);
            let cert = load_pem("ns/s", crt.as_bytes(), key.as_bytes()).unwrap();
            assert!(covers(&cert, "a.test"));
            assert!(covers(&cert, "x.wild.test"));
            assert!(covers(&cert, "*.wild.test"));
            assert!(!covers(&cert, "b.test"));
            assert!(!covers(&cert, "*.test"));
        }
    }

    #[test]
    fn loads_rsa_keys_in_pkcs1_and_pkcs8() {
        let crt = include_str!("../tests/fixtures/rsa.crt");
        for key in [
            include_str!("../tests/fixtures/rsa-pkcs1.key"),
            include_str!("../tests/fixtures/rsa-pkcs8.key"),
        ] {
            let cert = load_pem("ns/rsa", crt.as_bytes(), key.as_bytes()).unwrap();
            assert!(covers(&cert, "rsa.test"));
        }
    }

    #[test]
    fn rejects_garbage_and_mismatched_keys() {
        let (crt, _) = generated(&["a.test"], &rcgen::PKCS_ECDSA_P256_SHA256);
        let (_, other_key) = generated(&["a.test"], &rcgen::PKCS_ECDSA_P256_SHA256);
        assert!(matches!(
            load_pem("x", crt.as_bytes(), other_key.as_bytes()),
            Err(TlsError::KeyMismatch)
        ));
        assert!(matches!(
            load_pem("x", b"hello", other_key.as_bytes()),
            Err(TlsError::NoCertificate)
        ));
        assert!(load_pem("x", crt.as_bytes(), b"").is_err());
        let broken = crt.replace("MII", "MIX");
        assert!(load_pem("x", broken.as_bytes(), other_key.as_bytes()).is_err());
    }

    #[test]
    fn sni_exact_then_wildcard_then_default() {
        let cert = |name: &str| {
            let (crt, key) = generated(&[name], &rcgen::PKCS_ECDSA_P256_SHA256);
            Arc::new(load_pem(name, crt.as_bytes(), key.as_bytes()).unwrap())
        };
        let mut table = CertTable::default();
        assert!(table.find(Some("a.test")).is_none());
        assert!(table.insert("A.Test", cert("exact")));
        assert!(!table.insert("a.test", cert("second")));
        assert!(table.insert("*.test", cert("wild")));
        fn source(table: &CertTable, sni: Option<&str>) -> Option<String> {
            table.find(sni).map(|c| c.source.to_string())
        }
        assert_eq!(source(&table, Some("a.test")).as_deref(), Some("exact"));
        assert_eq!(source(&table, Some("b.test")).as_deref(), Some("wild"));
        assert_eq!(
            source(&table, Some("x.b.test")),
            None,
            "a wildcard covers one label"
        );
        assert_eq!(source(&table, None), None);
        table.set_default(cert("default"));
        assert_eq!(source(&table, Some("x.b.test")).as_deref(), Some("default"));
        assert_eq!(source(&table, None).as_deref(), Some("default"));
        let json = serde_json::to_string(&table).unwrap();
        assert_eq!(
            json,
            r#"{"hosts":{"*.test":"wild","a.test":"exact"},"default":"default"}"#
        );
    }

    #[test]
    fn routes_and_certificates_find_the_same_host_entries() {
        use crate::table::{HostRules, PathMatch, PathRule, RouteAction, RouteTable};
        let (crt, key) = generated(&["*.example.com"], &rcgen::PKCS_ECDSA_P256_SHA256);
        let mut certs = CertTable::default();
        let wild = Arc::new(load_pem("ns/wild", crt.as_bytes(), key.as_bytes()).unwrap());
        assert!(certs.insert("*.example.com", wild.clone()));
        assert!(certs.insert("exact.example.com", wild));
        let mut routes = RouteTable::default();
        let rules = |host: &str, backend: &str| {
            let action = RouteAction::to(backend);
            let rule = PathRule {
                matcher: PathMatch::prefix("/"),
                when: None,
                action,
            };
            HostRules::new(host, vec![rule]).0
        };
        routes
            .wildcard
            .insert("example.com".into(), rules("*.example.com", "wild"));
        routes.exact.insert(
            "exact.example.com".into(),
            rules("exact.example.com", "exact"),
        );
        for (name, found) in [
            ("a.example.com", true),
            ("A.Example.COM", true),
            ("a.example.com.", true),
            ("exact.example.com", true),
            ("EXACT.example.com.", true),
            // An empty first label is no label: no wildcard covers it.
            (".example.com", false),
            ("example.com", false),
            ("a.b.example.com", false),
        ] {
            let route = routes.find(name, "/").is_some();
            let cert = certs.find(Some(name)).is_some();
            assert_eq!((route, cert), (found, found), "{name:?}");
        }
    }

    #[test]
    fn self_signed_fallback_loads() {
        let cert = self_signed().unwrap();
        assert!(covers(&cert, "duet.invalid"));
    }

    #[test]
    fn redirect_keeps_ipv6_brackets() {
        assert_eq!(
            redirect_location("[2001:db8::1]:8080", 8443, "/a?b"),
            "https://[2001:db8::1]:8443/a?b"
        );
        assert_eq!(
            redirect_location("Example.com:80", 443, "/"),
            "https://Example.com/"
        );
        assert_eq!(
            redirect_location("127.0.0.1", 8443, "/x"),
            "https://127.0.0.1:8443/x"
        );
    }
}
