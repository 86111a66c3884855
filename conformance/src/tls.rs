//! TLS for tests: certificates generated with rcgen, `kubernetes.io/tls` Secret manifests, and a
//! rustls client that records which certificate the server presented and which ALPN protocol it
//! chose (it accepts any certificate: the test asserts on the one it got).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use anyhow::Context as _;
use dataplane::upstream::tls::AnyServerCert;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use serde_json::{json, Value};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use crate::client::{connect_tcp, REQUEST_TIMEOUT};

/// A generated certificate and key.
#[derive(Clone, Debug)]
pub struct TestCert {
    /// PEM certificate (`tls.crt`).
    pub cert_pem: String,
    /// PEM PKCS#8 key (`tls.key`).
    pub key_pem: String,
    /// The certificate's DER, to compare with what a server presents.
    pub der: Vec<u8>,
}

/// A self-signed ECDSA P-256 certificate for `names` (DNS names, `*.` wildcards or IP literals).
pub fn cert(names: &[&str]) -> TestCert {
    let key = rcgen::KeyPair::generate().expect("key generation");
    let params =
        rcgen::CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
            .expect("valid names");
    let cert = params.self_signed(&key).expect("self-signed certificate");
    TestCert {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
        der: cert.der().to_vec(),
    }
}

/// A test certificate authority that issues server certificates (for TLS upstreams).
#[derive(Debug)]
pub struct TestCa {
    /// The CA certificate in PEM (what a `ca.crt` holds).
    pub cert_pem: String,
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
}

impl TestCa {
    /// A new self-signed CA named `name`.
    pub fn new(name: &str) -> TestCa {
        let key = rcgen::KeyPair::generate().expect("key generation");
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("no names");
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
        ];
        let cert = params.self_signed(&key).expect("CA certificate");
        TestCa {
            cert_pem: cert.pem(),
            issuer: rcgen::Issuer::new(params, key),
        }
    }

    /// A server certificate for `names` (DNS names or IP literals) signed by this CA.
    pub fn issue(&self, names: &[&str]) -> TestCert {
        let params =
            rcgen::CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .expect("valid names");
        self.sign(params)
    }

    /// A server certificate for the DNS names `names` and the URIs `uris` (SPIFFE IDs, say)
    /// as subject alternative names, signed by this CA.
    pub fn issue_with_uris(&self, names: &[&str], uris: &[&str]) -> TestCert {
        let mut params =
            rcgen::CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .expect("valid names");
        for uri in uris {
            let uri = rcgen::string::Ia5String::try_from(*uri).expect("an ASCII URI");
            params.subject_alt_names.push(rcgen::SanType::URI(uri));
        }
        self.sign(params)
    }

    /// A client certificate (`extendedKeyUsage: clientAuth`) for the user `common_name` in the
    /// groups `organizations`, as Kubernetes reads them (CN = user, O = group), signed by this CA.
    pub fn issue_client(&self, common_name: &str, organizations: &[&str]) -> TestCert {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("no names");
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, common_name);
        for org in organizations {
            params
                .distinguished_name
                .push(rcgen::DnType::OrganizationName, *org);
        }
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        self.sign(params)
    }

    /// A PEM X509 CRL of this CA (valid from 2020 to 2100) revoking `revoked`.
    pub fn crl(&self, revoked: &[&TestCert]) -> String {
        let when = rcgen::date_time_ymd(2020, 1, 1);
        let params = rcgen::CertificateRevocationListParams {
            this_update: when,
            next_update: rcgen::date_time_ymd(2100, 1, 1),
            crl_number: rcgen::SerialNumber::from(1u64),
            issuing_distribution_point: None,
            revoked_certs: revoked
                .iter()
                .map(|c| rcgen::RevokedCertParams {
                    serial_number: rcgen::SerialNumber::from_slice(serial_of(&c.der)),
                    revocation_time: when,
                    reason_code: Some(rcgen::RevocationReason::KeyCompromise),
                    invalidity_date: None,
                })
                .collect(),
            key_identifier_method: rcgen::KeyIdMethod::Sha256,
        };
        params
            .signed_by(&self.issuer)
            .expect("CRL")
            .pem()
            .expect("CRL PEM")
    }

    /// A certificate of `params` with a fresh key, signed by this CA.
    fn sign(&self, params: rcgen::CertificateParams) -> TestCert {
        let key = rcgen::KeyPair::generate().expect("key generation");
        let cert = params
            .signed_by(&key, &self.issuer)
            .expect("signed certificate");
        TestCert {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            der: cert.der().to_vec(),
        }
    }
}

/// The serial number's content octets of a DER certificate.
fn serial_of(der: &[u8]) -> &[u8] {
    // One DER TLV: (tag, content, rest); lengths of up to four octets.
    fn tlv(b: &[u8]) -> (u8, &[u8], &[u8]) {
        let (tag, first) = (b[0], b[1]);
        let (len, head) = if first < 0x80 {
            (usize::from(first), 2)
        } else {
            let n = usize::from(first & 0x7f);
            (
                b[2..2 + n].iter().fold(0, |l, o| l << 8 | usize::from(*o)),
                2 + n,
            )
        };
        (tag, &b[head..head + len], &b[head + len..])
    }
    let (_, cert, _) = tlv(der);
    let (_, tbs, _) = tlv(cert);
    let (tag, _, after) = tlv(tbs);
    let rest = if tag == 0xa0 { after } else { tbs };
    tlv(rest).1
}

/// A rustls server configuration serving `cert` with ALPN `alpn` that refuses clients without a
/// certificate issued by the CA `client_ca_pem` (an upstream checking the proxy's certificate).
pub fn server_config_requiring_clients(
    cert: &TestCert,
    client_ca_pem: &str,
    alpn: &[&str],
) -> Arc<rustls::ServerConfig> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::PrivateKeyDer;
    let chain = vec![CertificateDer::from(cert.der.clone())];
    let key = PrivateKeyDer::from_pem_slice(cert.key_pem.as_bytes()).expect("PEM key");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for ca in CertificateDer::pem_slice_iter(client_ca_pem.as_bytes()) {
        roots.add(ca.expect("PEM CA")).expect("a usable CA");
    }
    let verifier =
        rustls::server::WebPkiClientVerifier::builder_with_provider(roots.into(), provider.clone())
            .build()
            .expect("client verifier");
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .expect("certificate and key");
    config.alpn_protocols = alpn.iter().map(|p| p.as_bytes().to_vec()).collect();
    Arc::new(config)
}

/// A rustls server configuration serving `cert` with ALPN `alpn` (e.g. `["h2", "http/1.1"]`).
pub fn server_config(cert: &TestCert, alpn: &[&str]) -> Arc<rustls::ServerConfig> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::PrivateKeyDer;
    let chain = vec![CertificateDer::from(cert.der.clone())];
    let key = PrivateKeyDer::from_pem_slice(cert.key_pem.as_bytes()).expect("PEM key");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .expect("certificate and key");
    config.alpn_protocols = alpn.iter().map(|p| p.as_bytes().to_vec()).collect();
    Arc::new(config)
}

/// An `Opaque` Secret holding a CA bundle under `ca.crt` and revocation lists under `ca.crl`.
pub fn ca_crl_secret(namespace: &str, name: &str, ca_pem: &str, crl_pem: &[u8]) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {"namespace": namespace, "name": name},
        "data": {"ca.crt": base64(ca_pem.as_bytes()), "ca.crl": base64(crl_pem)},
    })
}

/// An `Opaque` Secret holding a CA bundle under `ca.crt`.
pub fn ca_secret(namespace: &str, name: &str, ca_pem: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {"namespace": namespace, "name": name},
        "data": {"ca.crt": base64(ca_pem.as_bytes())},
    })
}

/// A `kubernetes.io/tls` Secret manifest holding `cert`.
pub fn secret(namespace: &str, name: &str, cert: &TestCert) -> Value {
    secret_raw(
        namespace,
        name,
        cert.cert_pem.as_bytes(),
        cert.key_pem.as_bytes(),
    )
}

/// A `kubernetes.io/tls` Secret with arbitrary `tls.crt` and `tls.key` bytes.
pub fn secret_raw(namespace: &str, name: &str, crt: &[u8], key: &[u8]) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/tls",
        "metadata": {"namespace": namespace, "name": name},
        "data": {"tls.crt": base64(crt), "tls.key": base64(key)},
    })
}

/// Standard base64 with padding.
pub fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i)) as usize & 63] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// What a finished TLS handshake negotiated.
#[derive(Clone, Debug)]
pub struct Handshake {
    /// The leaf certificate the server presented (DER).
    pub cert: Vec<u8>,
    /// The ALPN protocol the server chose.
    pub alpn: Option<String>,
    /// The TLS version, e.g. `TLSv1_3`.
    pub version: String,
}

/// Connects to `to` from its family's loopback address and completes a TLS handshake (the stream is ready for HTTP), sending
/// `sni` as the server name (`None`: the IP address is the server name, so no SNI is sent) and
/// offering `alpn`. `versions` limits the client's TLS versions (empty: 1.2 and 1.3).
pub async fn handshake(
    to: SocketAddr,
    sni: Option<&str>,
    alpn: &[&str],
    versions: &[&'static rustls::SupportedProtocolVersion],
) -> anyhow::Result<(TlsStream<TcpStream>, Handshake)> {
    let tcp = connect_tcp(to).await?;
    handshake_on(tcp, to, sni, alpn, versions).await
}

/// The first flight of a TLS client (its ClientHello) naming `sni`, to send on a raw socket.
pub fn client_hello(sni: &str) -> anyhow::Result<Vec<u8>> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyServerCert::new(provider)))
        .with_no_client_auth();
    let name = ServerName::try_from(sni.to_owned())?;
    let mut client = rustls::ClientConnection::new(Arc::new(config), name)?;
    let mut hello = Vec::new();
    client.write_tls(&mut hello)?;
    Ok(hello)
}

/// Like [`handshake`], on an already connected socket (e.g. after a PROXY protocol header).
pub async fn handshake_on(
    tcp: TcpStream,
    to: SocketAddr,
    sni: Option<&str>,
    alpn: &[&str],
    versions: &[&'static rustls::SupportedProtocolVersion],
) -> anyhow::Result<(TlsStream<TcpStream>, Handshake)> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let seen = Arc::new(Recorder {
        any: AnyServerCert::new(provider.clone()),
        cert: Mutex::new(None),
    });
    let versions = if versions.is_empty() {
        rustls::ALL_VERSIONS
    } else {
        versions
    };
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(versions)?
        .dangerous()
        .with_custom_certificate_verifier(seen.clone())
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.as_bytes().to_vec()).collect();
    let name = match sni {
        Some(host) => ServerName::try_from(host.to_owned())?,
        None => ServerName::IpAddress(to.ip().into()),
    };
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let stream = tokio::time::timeout(REQUEST_TIMEOUT, connector.connect(name, tcp))
        .await
        .context("TLS handshake timed out")?
        .context("TLS handshake failed")?;
    let (_, session) = stream.get_ref();
    let alpn = session
        .alpn_protocol()
        .map(|p| String::from_utf8_lossy(p).into_owned());
    let version = session
        .protocol_version()
        .map_or_else(|| "none".to_owned(), |v| format!("{v:?}"));
    let cert = seen
        .cert
        .lock()
        .unwrap()
        .clone()
        .context("no certificate seen")?;
    Ok((
        stream,
        Handshake {
            cert,
            alpn,
            version,
        },
    ))
}

/// Records the certificate the server presented and accepts it; signatures are checked by the
/// dataplane's [`AnyServerCert`].
#[derive(Debug)]
struct Recorder {
    any: AnyServerCert,
    cert: Mutex<Option<Vec<u8>>>,
}

impl ServerCertVerifier for Recorder {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        *self.cert.lock().unwrap() = Some(end_entity.to_vec());
        self.any
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.any.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.any.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.any.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_the_rfc_vectors() {
        for (plain, encoded) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(plain.as_bytes()), encoded);
        }
    }
}
