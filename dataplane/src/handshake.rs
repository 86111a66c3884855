//! The TLS handshakes of the HTTPS listeners with client certificates (ingress-nginx's
//! `auth-tls-*`): the ClientHello is read first, then the server configuration is picked by SNI,
//! asking for a certificate only where a route of the host verifies them
//! ([`crate::client_auth`]), or the connection is relayed unterminated when the SNI names an
//! `ssl-passthrough` host ([`crate::passthrough`]). On a Gateway HTTPS port with client
//! certificate validation (the Gateway's `tls.frontend`), the same configurations ask for a
//! certificate, and in mode `AllowValidOnly` the handshake itself fails without one the port's
//! CA bundle verifies.

use std::sync::{Arc, Mutex, Weak};

use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::ResolvesServerCert;
use rustls::{DigitallySignedStruct, DistinguishedName, ServerConfig, SignatureScheme};
use rustls_pki_types::{CertificateDer, UnixTime};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;
use tokio_rustls::server::TlsStream;

use crate::client_auth::{algorithms, ClientAuth};
use crate::passthrough::Relay;
use crate::runtime::Runtime;
use crate::table::passthrough::Passthrough;

/// Asks for a certificate, hinting the CA subjects, and accepts any whose handshake signature
/// holds; the route verifies it. With `enforce`, a certificate is required and verified here
/// against its CA bundle ([`ClientAuth::decide`]), so that the handshake fails without a valid
/// one.
#[derive(Debug)]
struct RequestCertificate {
    hints: Vec<DistinguishedName>,
    algorithms: WebPkiSupportedAlgorithms,
    enforce: Option<Arc<ClientAuth>>,
}

impl ClientCertVerifier for RequestCertificate {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        self.enforce.is_some()
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &self.hints
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let Some(auth) = &self.enforce else {
            return Ok(ClientCertVerified::assertion());
        };
        let mut chain = Vec::with_capacity(1 + intermediates.len());
        chain.push(end_entity.clone());
        chain.extend(intermediates.iter().cloned());
        match auth.decide(&chain) {
            crate::client_auth::Decision::Pass(_) => Ok(ClientCertVerified::assertion()),
            _ => Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::UnknownIssuer,
            )),
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// A configuration asking for certificates: the settings it was made for (while the snapshot
/// holds them), whether its handshake enforces them, the configuration.
type Asking = (Weak<ClientAuth>, bool, Arc<ServerConfig>);

/// What became of a connection's ClientHello.
#[derive(Debug)]
pub enum Handshake {
    /// TLS terminated by duet.
    Tls(Box<TlsStream<TcpStream>>),
    /// A passthrough host's connection, to relay unterminated (or, on a Gateway TLS listener in
    /// mode Terminate, decrypted).
    Passthrough(Relay),
    /// A passthrough host's connection past `--max-passthrough-connections`: closed.
    Refused,
    /// A connection to a Gateway passthrough port whose SNI (or its absence) selects no
    /// TLSRoute: closed.
    Unrouted,
}

/// The TLS handshakes of the HTTPS listeners: the ClientHello is read first, then the server
/// configuration is picked by SNI: `base` (no client certificate asked for), or, when a route of
/// the SNI host verifies client certificates, a configuration asking for one (one per CA
/// bundle, kept while the snapshot uses it).
pub struct Handshakes {
    runtime: Arc<Runtime>,
    base: Arc<ServerConfig>,
    certs: Arc<dyn ResolvesServerCert>,
    /// The configurations asking for certificates, by settings and whether the handshake
    /// enforces them.
    asking: Mutex<Vec<Asking>>,
    /// Places for passthrough relays (`None`: only the listeners' own limit).
    relays: Option<Arc<Semaphore>>,
    /// A Gateway passthrough port: every connection is relayed by its SNI to the TLSRoute of
    /// that port's listeners, or closed; TLS is never terminated.
    gateway_port: Option<u16>,
    /// A Gateway HTTPS port: client certificates as that port's `client_auth` says.
    gateway_https: Option<u16>,
}

/// Where a TLSRoute rule sends one connection: its backend, or a weighted alternative's.
fn tls_route_target(action: &crate::table::RouteAction) -> Passthrough {
    let backend = action
        .choice
        .as_deref()
        .and_then(|c| {
            let arm = crate::policy::canary::arm(c, &http::HeaderMap::new());
            c.alternatives.get(arm.checked_sub(1)?)
        })
        .map_or(&action.backend, |a| &a.backend);
    Passthrough {
        backend: backend.clone(),
        policy: action.policy,
        origin: action.origin.clone(),
    }
}

impl std::fmt::Debug for Handshakes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handshakes").finish_non_exhaustive()
    }
}

impl Handshakes {
    /// Handshakes over `base` (its certificate resolver and ALPN are kept in the configurations
    /// asking for client certificates), looking routes up in `runtime`'s live snapshot.
    pub fn new(runtime: Arc<Runtime>, base: Arc<ServerConfig>) -> Handshakes {
        Handshakes {
            runtime,
            certs: base.cert_resolver.clone(),
            base,
            asking: Mutex::new(Vec::new()),
            relays: None,
            gateway_port: None,
            gateway_https: None,
        }
    }

    /// The handshakes of a Gateway HTTPS port: a client certificate is asked for (and, in mode
    /// `AllowValidOnly`, required) as the port's
    /// [`client_auth`](crate::table::gateway::GatewayPort::client_auth) in the live snapshot
    /// says.
    pub fn on_gateway_https_port(mut self, port: u16) -> Handshakes {
        self.gateway_https = Some(port);
        self
    }

    /// The handshakes of a Gateway passthrough port (see [`Handshakes::accept`]).
    pub fn on_gateway_port(mut self, port: u16) -> Handshakes {
        self.gateway_port = Some(port);
        self
    }

    /// The relay places (shared with other listeners by [`Handshakes::sharing_relays`]).
    pub fn relay_places(&self) -> Option<Arc<Semaphore>> {
        self.relays.clone()
    }

    /// Relays take their places from `relays` (the HTTPS listeners' own, so that
    /// `--max-passthrough-connections` bounds every passthrough relay together).
    pub fn sharing_relays(mut self, relays: Option<Arc<Semaphore>>) -> Handshakes {
        self.relays = relays;
        self
    }

    /// At most `n` passthrough relays open at once (each also holds its listener's connection
    /// place): silent passthrough clients cannot take every place the HTTP and HTTPS listeners
    /// share.
    pub fn limit_relays(mut self, n: usize) -> Handshakes {
        self.relays = Some(Arc::new(Semaphore::new(n)));
        self
    }

    /// Reads the ClientHello; when its SNI names a passthrough host (ingress-nginx's
    /// `ssl-passthrough`), returns the connection to relay unterminated, else completes the
    /// handshake with the configuration for its SNI.
    pub async fn accept(&self, mut stream: TcpStream) -> std::io::Result<Handshake> {
        if let Some(port) = self.gateway_port {
            return self.accept_gateway(stream, port).await;
        }
        if let Some(port) = self.gateway_https {
            let hello = crate::client_hello::read_client_hello(&mut stream, false).await?;
            let config = self.config_for_gateway(port);
            let start = tokio_rustls::StartHandshake::from_parts(hello.accepted, stream);
            return Ok(Handshake::Tls(Box::new(start.into_stream(config).await?)));
        }
        let keep = !self.runtime.load().snapshot.routes.passthrough.is_empty();
        let hello = crate::client_hello::read_client_hello(&mut stream, keep).await?;
        let sni = hello
            .accepted
            .client_hello()
            .server_name()
            .map(str::to_owned);
        if let (Some(bytes), Some(sni)) = (hello.bytes, sni.as_deref()) {
            let live = self.runtime.load();
            if let Some(to) =
                crate::table::passthrough::find(&live.snapshot.routes.passthrough, sni)
            {
                return Ok(self.relay(stream, bytes, to.clone()));
            }
        }
        let config = self.config_for(sni.as_deref());
        let start = tokio_rustls::StartHandshake::from_parts(hello.accepted, stream);
        Ok(Handshake::Tls(Box::new(start.into_stream(config).await?)))
    }

    /// On a Gateway TLS port: reads the ClientHello and relays the connection to a backend of
    /// the TLSRoute its SNI selects (weighted backendRefs drawn per connection): unterminated on
    /// a listener in mode Passthrough, decrypted on one in mode Terminate (the handshake with
    /// the listener's certificate, from `base`'s resolver); closes it when no route takes it.
    async fn accept_gateway(&self, mut stream: TcpStream, port: u16) -> std::io::Result<Handshake> {
        let hello = crate::client_hello::read_client_hello(&mut stream, true).await?;
        let sni = hello
            .accepted
            .client_hello()
            .server_name()
            .map(str::to_owned);
        let (Some(bytes), Some(sni)) = (hello.bytes, sni) else {
            return Ok(Handshake::Unrouted);
        };
        let (to, terminate) = {
            let live = self.runtime.load();
            let port = live.snapshot.gateways.port(port).filter(|p| p.tls_routes);
            let Some((listener, action)) = port.and_then(|p| p.tls_route(&sni)) else {
                return Ok(Handshake::Unrouted);
            };
            (tls_route_target(action), listener.cert.is_some())
        };
        if !terminate {
            return Ok(self.relay(stream, bytes, to));
        }
        let start = tokio_rustls::StartHandshake::from_parts(hello.accepted, stream);
        let tls = start.into_stream(self.base.clone()).await?;
        let relay = Relay::terminated(tls, to, self.runtime.clone());
        Ok(self.place(relay))
    }

    /// A passthrough host's connection to relay, or refused when every relay place is taken.
    fn relay(&self, stream: TcpStream, hello: Vec<u8>, to: Passthrough) -> Handshake {
        self.place(Relay::new(stream, hello, to, self.runtime.clone()))
    }

    /// A relay holding a place, or refused when every relay place is taken.
    fn place(&self, relay: Relay) -> Handshake {
        let place = match &self.relays {
            None => None,
            Some(relays) => match relays.clone().try_acquire_owned() {
                Ok(place) => Some(place),
                Err(_) => return Handshake::Refused,
            },
        };
        Handshake::Passthrough(relay.holding(place))
    }

    /// The configuration every handshake starts from (no client certificate asked for).
    pub fn base(&self) -> &Arc<ServerConfig> {
        &self.base
    }

    /// The configuration of a handshake whose ClientHello names `sni`, on an HTTPS listener
    /// (Ingress) or a Gateway HTTPS port: `base`, or one asking for a client certificate as the
    /// routes of the host or the port's validation say. HTTP/3 picks its own configurations so
    /// ([`crate::http3`]).
    pub fn config_by_sni(&self, sni: Option<&str>) -> Arc<ServerConfig> {
        match self.gateway_https {
            Some(port) => self.config_for_gateway(port),
            None => self.config_for(sni),
        }
    }

    /// The configuration for a ClientHello naming `sni`.
    fn config_for(&self, sni: Option<&str>) -> Arc<ServerConfig> {
        let live = self.runtime.load();
        match sni.and_then(|host| host_client_auth(&live.snapshot.routes, host)) {
            Some(auth) => self.asking(auth, false),
            None => self.base.clone(),
        }
    }

    /// The configuration of a Gateway HTTPS port: asking for a certificate when the port
    /// validates them, enforcing it in the handshake unless the mode falls back.
    fn config_for_gateway(&self, port: u16) -> Arc<ServerConfig> {
        let live = self.runtime.load();
        let auth = live
            .snapshot
            .gateways
            .port(port)
            .and_then(|p| p.client_auth.as_ref());
        match auth {
            Some(auth) => {
                let enforce = auth.verify != crate::client_auth::VerifyClient::OptionalNoCa;
                self.asking(auth, enforce)
            }
            None => self.base.clone(),
        }
    }

    /// The configuration asking for certificates of `auth` (`enforce`: in the handshake), made
    /// once while the snapshot holds `auth`.
    fn asking(&self, auth: &Arc<ClientAuth>, enforce: bool) -> Arc<ServerConfig> {
        let mut asking = self.asking.lock().unwrap_or_else(|e| e.into_inner());
        asking.retain(|(weak, _, _)| weak.strong_count() > 0);
        if let Some((_, _, config)) = asking
            .iter()
            .find(|(weak, e, _)| *e == enforce && std::ptr::eq(weak.as_ptr(), Arc::as_ptr(auth)))
        {
            return config.clone();
        }
        let config = self.asking_config(auth, enforce);
        asking.push((Arc::downgrade(auth), enforce, config.clone()));
        config
    }

    fn asking_config(&self, auth: &Arc<ClientAuth>, enforce: bool) -> Arc<ServerConfig> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add_parsable_certificates(auth.ca.iter().cloned());
        let verifier = RequestCertificate {
            hints: roots.subjects(),
            algorithms: algorithms(),
            enforce: enforce.then(|| auth.clone()),
        };
        let mut config = ServerConfig::builder_with_provider(crate::tls::provider())
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
            .expect("ring supports TLS 1.2 and 1.3")
            .with_client_cert_verifier(Arc::new(verifier))
            .with_cert_resolver(self.certs.clone());
        config.alpn_protocols = self.base.alpn_protocols.clone();
        Arc::new(config)
    }
}

/// The client-certificate settings of the first route of `host` that has some.
fn host_client_auth<'a>(
    routes: &'a crate::table::RouteTable,
    host: &str,
) -> Option<&'a Arc<ClientAuth>> {
    let mut buf = [0u8; crate::host::MAX_NAME];
    let name = crate::host::normalize_name(host, &mut buf)?;
    let rules = crate::host::lookup(&routes.exact, &routes.wildcard, name)?;
    rules
        .rules
        .iter()
        .find_map(|r| r.action.client_auth.as_ref())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client_auth::VerifyClient;
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};

    /// A CA's DER and issuer.
    fn ca() -> (CertificateDer<'static>, Issuer<'static, KeyPair>) {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let cert = params.self_signed(&key).unwrap();
        (cert.der().clone(), Issuer::new(params, key))
    }

    fn client(by: &Issuer<'static, KeyPair>) -> CertificateDer<'static> {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        params.signed_by(&key, by).unwrap().der().clone()
    }

    fn verifier(ca: &CertificateDer<'static>, enforce: bool) -> RequestCertificate {
        let auth = Arc::new(ClientAuth {
            source: "ns/ca".into(),
            ca: vec![ca.clone()].into(),
            crls: Arc::from([]),
            verify: VerifyClient::On,
            depth: 2,
            pass_certificate: false,
            error_page: None,
            error: None,
            match_cn: None,
        });
        RequestCertificate {
            hints: Vec::new(),
            algorithms: algorithms(),
            enforce: enforce.then_some(auth),
        }
    }

    #[test]
    fn an_enforcing_handshake_requires_a_certificate_of_the_bundle() {
        let (root, issuer) = ca();
        let (_, rogue) = ca();
        let (good, bad) = (client(&issuer), client(&rogue));
        let now = UnixTime::now();
        let strict = verifier(&root, true);
        assert!(strict.offer_client_auth() && strict.client_auth_mandatory());
        assert!(strict.verify_client_cert(&good, &[], now).is_ok());
        assert!(strict.verify_client_cert(&bad, &[], now).is_err());
        // Asking only (ingress-nginx's routes decide later): any certificate, or none.
        let asking = verifier(&root, false);
        assert!(asking.offer_client_auth() && !asking.client_auth_mandatory());
        assert!(asking.verify_client_cert(&bad, &[], now).is_ok());
    }
}
