//! Upstream TLS as the dataplane uses it: the rustls client configuration of each TLS setting of
//! a snapshot ([`LiveTls`]), built when the snapshot is applied and carried over to the next one
//! while the settings are equal ([`UpstreamTlsConfigs`]), and the client handshake.

use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio::net::TcpStream;

use crate::ptr_key::{addr_of, AddrMap};
use crate::table::gateway::GatewayTable;
use crate::table::RouteTable;
use crate::upstream_tls::{SubjectAltName, TrustRoots, UpstreamTls};

/// The ready client side of one [`UpstreamTls`]: the rustls configuration (or why there is
/// none) and the pool key that keeps its connections apart from others to the same address.
#[derive(Debug)]
pub struct LiveTls {
    settings: Arc<UpstreamTls>,
    server_name: ServerName<'static>,
    config: Result<Arc<rustls::ClientConfig>, Arc<str>>,
    key: u64,
}

impl LiveTls {
    /// Builds the configuration of `settings`; unusable settings stay unusable with their reason.
    pub fn new(settings: Arc<UpstreamTls>) -> LiveTls {
        static NEXT_KEY: AtomicU64 = AtomicU64::new(1);
        let config = match settings.error() {
            Some(reason) => Err(reason.into()),
            None => client_config(&settings).map_err(|e| e.to_string().into()),
        };
        let server_name = ServerName::try_from(settings.server_name().to_owned())
            .unwrap_or_else(|_| ServerName::try_from("invalid.invalid").expect("a DNS name"));
        LiveTls {
            settings,
            server_name,
            config,
            key: NEXT_KEY.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// Why the settings are unusable, if they are.
    pub fn error(&self) -> Option<&str> {
        self.config.as_ref().err().map(|e| &**e)
    }

    /// The pool key of these settings (never 0, which is plain TCP).
    pub(crate) fn key(&self) -> u64 {
        self.key
    }

    /// Completes a TLS handshake on a connected socket; with `h2`, fails unless the server chose
    /// ALPN `h2`.
    pub(crate) async fn handshake(
        &self,
        tcp: TcpStream,
        h2: bool,
    ) -> io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
        let config = self
            .config
            .as_ref()
            .map_err(|reason| io::Error::other(reason.to_string()))?;
        let connector = tokio_rustls::TlsConnector::from(config.clone());
        let stream = connector.connect(self.server_name.clone(), tcp).await?;
        if h2 && stream.get_ref().1.alpn_protocol() != Some(b"h2") {
            return Err(io::Error::other("the upstream did not choose ALPN h2"));
        }
        Ok(stream)
    }
}

/// The rustls client configuration of settings: TLS 1.3 and 1.2 (ring), the trust, one ALPN.
fn client_config(settings: &UpstreamTls) -> Result<Arc<rustls::ClientConfig>, rustls::Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?;
    let roots = match settings.trust() {
        TrustRoots::SkipVerify => None,
        TrustRoots::SystemRoots => Some(system_roots()),
        TrustRoots::Ca { roots, .. } => {
            let mut store = RootCertStore::empty();
            // Each was accepted when the settings were made.
            store.add_parsable_certificates(roots.iter().cloned());
            Some(Arc::new(store))
        }
    };
    let sans = settings.subject_alt_names();
    let builder = match roots {
        None => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyServerCert::new(provider))),
        Some(roots) if !sans.is_empty() => {
            let verifier = SanVerifier {
                roots,
                names: sans.into(),
                signatures: AnyServerCert::new(provider),
            };
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(verifier))
        }
        Some(roots) => builder.with_root_certificates(roots),
    };
    let mut config = match settings.client_cert() {
        None => builder.with_no_client_auth(),
        Some(cert) => {
            use rustls::pki_types::pem::PemObject;
            use rustls::pki_types::PrivateKeyDer;
            let chain = CertificateDer::pem_slice_iter(&cert.cert_pem)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| rustls::Error::General(format!("{}: {e}", cert.source)))?;
            let key = PrivateKeyDer::from_pem_slice(&cert.key_pem)
                .map_err(|e| rustls::Error::General(format!("{}: {e}", cert.source)))?;
            builder.with_client_auth_cert(chain, key)?
        }
    };
    config.alpn_protocols = vec![if settings.h2() {
        b"h2".to_vec()
    } else {
        b"http/1.1".to_vec()
    }];
    Ok(Arc::new(config))
}

/// The client configurations of one applied snapshot, by the address of their settings in its
/// route table: one lookup per TLS request, no hashing of certificates.
#[derive(Clone, Debug, Default)]
pub struct UpstreamTlsConfigs {
    by_settings: Arc<AddrMap<Arc<LiveTls>>>,
    /// The table the addresses belong to (kept alive, so they stay unique).
    table: Option<Arc<RouteTable>>,
    /// The Gateway listeners' table, likewise.
    gateways: Option<Arc<GatewayTable>>,
}

impl UpstreamTlsConfigs {
    /// The configurations of every TLS setting of `routes` and of the Gateway listeners'
    /// `gateways`, reusing those of `previous` whose settings are equal (and the whole map when
    /// both tables are shared), as `LiveBackend::new` carries balancer state over.
    pub fn build(
        routes: &Arc<RouteTable>,
        gateways: &Arc<GatewayTable>,
        previous: &UpstreamTlsConfigs,
    ) -> UpstreamTlsConfigs {
        if previous
            .table
            .as_ref()
            .is_some_and(|t| Arc::ptr_eq(t, routes))
            && previous
                .gateways
                .as_ref()
                .is_some_and(|g| Arc::ptr_eq(g, gateways))
        {
            return previous.clone();
        }
        let known: HashMap<&UpstreamTls, &Arc<LiveTls>> = previous
            .by_settings
            .values()
            .map(|live| (&*live.settings, live))
            .collect();
        let mut by_settings = AddrMap::default();
        let actions = routes.actions().map(|(_, a)| a).chain(gateways.actions());
        for action in actions {
            let Some(settings) = &action.upstream_tls else {
                continue;
            };
            by_settings.entry(addr_of(&**settings)).or_insert_with(|| {
                match known.get(&**settings) {
                    Some(live) => Arc::clone(live),
                    None => Arc::new(LiveTls::new(settings.clone())),
                }
            });
        }
        UpstreamTlsConfigs {
            by_settings: Arc::new(by_settings),
            table: Some(routes.clone()),
            gateways: Some(gateways.clone()),
        }
    }

    /// The configuration of settings of this snapshot's route table.
    pub fn get(&self, settings: &UpstreamTls) -> Option<&Arc<LiveTls>> {
        self.by_settings.get(&addr_of(settings))
    }
}

/// The system trust roots, loaded once per process (an empty store where there are none).
fn system_roots() -> Arc<RootCertStore> {
    static ROOTS: OnceLock<Arc<RootCertStore>> = OnceLock::new();
    ROOTS
        .get_or_init(|| {
            let found = rustls_native_certs::load_native_certs();
            let mut roots = RootCertStore::empty();
            let (added, _) = roots.add_parsable_certificates(found.certs);
            tracing::info!(
                roots = added,
                errors = found.errors.len(),
                "Loaded the system trust roots for upstream TLS"
            );
            Arc::new(roots)
        })
        .clone()
}

/// Accepts any server certificate (the handshake's signatures are still checked):
/// `backend-tls-skip-verify`, and the test clients that assert on the certificate they got.
#[derive(Debug)]
pub struct AnyServerCert(Arc<CryptoProvider>);

impl AnyServerCert {
    /// A verifier checking signatures with `provider`'s algorithms.
    pub fn new(provider: Arc<CryptoProvider>) -> Self {
        AnyServerCert(provider)
    }
}

impl ServerCertVerifier for AnyServerCert {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// Verifies the chain against the roots as for server names, then requires one of `names`
/// among the certificate's subject alternative names instead of the server name (which is only
/// sent as SNI): BackendTLSPolicy's `subjectAltNames`.
#[derive(Debug)]
struct SanVerifier {
    roots: Arc<RootCertStore>,
    names: Arc<[SubjectAltName]>,
    signatures: AnyServerCert,
}

impl ServerCertVerifier for SanVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let invalid = |e: webpki::Error| {
            rustls::Error::InvalidCertificate(rustls::CertificateError::Other(rustls::OtherError(
                Arc::new(e),
            )))
        };
        let cert = webpki::EndEntityCert::try_from(end_entity).map_err(invalid)?;
        cert.verify_for_usage(
            self.signatures.0.signature_verification_algorithms.all,
            &self.roots.roots,
            intermediates,
            now,
            webpki::KeyUsage::server_auth(),
            None,
            None,
        )
        .map_err(invalid)?;
        if self.names.iter().any(|n| carries(&cert, end_entity, n)) {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::NotValidForName,
            ))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.signatures.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.signatures.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.signatures.supported_verify_schemes()
    }
}

/// Whether a verified certificate carries the subject alternative name: a DNS name as webpki
/// matches server names (wildcards included), a URI exactly.
fn carries(
    cert: &webpki::EndEntityCert<'_>,
    der: &CertificateDer<'_>,
    name: &SubjectAltName,
) -> bool {
    match name {
        SubjectAltName::Hostname(host) => ServerName::try_from(&**host)
            .is_ok_and(|n| cert.verify_is_valid_for_subject_name(&n).is_ok()),
        SubjectAltName::Uri(uri) => {
            use x509_parser::extensions::GeneralName;
            let Ok((_, parsed)) = x509_parser::parse_x509_certificate(der) else {
                return false;
            };
            let Ok(Some(san)) = parsed.subject_alternative_name() else {
                return false;
            };
            san.value
                .general_names
                .iter()
                .any(|g| matches!(g, GeneralName::URI(u) if *u == &**uri))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::{HostRules, Origin, PathMatch, PathRule, RouteAction};
    use crate::upstream_tls::UpstreamTrust;

    fn table(settings: &[Arc<UpstreamTls>]) -> Arc<RouteTable> {
        let rules = settings
            .iter()
            .enumerate()
            .map(|(i, tls)| PathRule {
                matcher: PathMatch::prefix(&format!("/{i}")),
                when: None,
                action: RouteAction {
                    origin: Origin {
                        kind: Default::default(),
                        namespace: "ns".into(),
                        name: format!("ing{i}").into(),
                        created: 0,
                    }
                    .into(),
                    upstream_tls: Some(tls.clone()),
                    ..RouteAction::to("ns/svc:443")
                },
            })
            .collect();
        let (any_host, _) = HostRules::new("", rules);
        Arc::new(RouteTable {
            any_host,
            ..RouteTable::default()
        })
    }

    fn no_gw() -> Arc<GatewayTable> {
        Arc::default()
    }

    fn settings(name: &str, h2: bool) -> Arc<UpstreamTls> {
        Arc::new(UpstreamTls::new(name, &UpstreamTrust::SkipVerify, h2).unwrap())
    }

    #[test]
    fn configs_are_built_per_setting_and_kept_while_equal() {
        let (a, b) = (settings("a.ns.svc", false), settings("b.ns.svc", true));
        let first = UpstreamTlsConfigs::build(
            &table(&[a.clone(), b.clone()]),
            &no_gw(),
            &Default::default(),
        );
        let (live_a, live_b) = (first.get(&a).unwrap(), first.get(&b).unwrap());
        assert_ne!(live_a.key(), 0);
        assert_ne!(
            live_a.key(),
            live_b.key(),
            "different settings, different pools"
        );
        assert!(live_a.error().is_none());
        // A new snapshot with equal settings in new Arcs keeps the built configurations.
        let (a2, c) = (settings("a.ns.svc", false), settings("c.ns.svc", false));
        let second = UpstreamTlsConfigs::build(&table(&[a2.clone(), c.clone()]), &no_gw(), &first);
        assert!(Arc::ptr_eq(second.get(&a2).unwrap(), live_a));
        assert!(!Arc::ptr_eq(second.get(&c).unwrap(), live_a));
        assert!(
            second.get(&b).is_none(),
            "settings of the old table are not found"
        );
    }

    #[test]
    fn unusable_settings_keep_their_reason() {
        let bad = Arc::new(UpstreamTls::unusable(
            "a.ns.svc",
            &UpstreamTrust::SystemRoots,
            "CA Secret ns/ca does not exist",
        ));
        let configs = UpstreamTlsConfigs::build(
            &table(std::slice::from_ref(&bad)),
            &no_gw(),
            &Default::default(),
        );
        assert_eq!(
            configs.get(&bad).unwrap().error(),
            Some("CA Secret ns/ca does not exist")
        );
    }
}
