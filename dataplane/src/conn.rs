//! Who is on the other end of a client connection ([`ConnInfo`]): addresses, family, TLS, trust,
//! and what forwarding headers say about the peer, formatted once per connection.

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};

use http::HeaderValue;

use crate::table::{normalize_addr, Family};

/// Who is on the other end of an accepted connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnInfo {
    /// The client's address, IPv4-mapped IPv6 normalised to IPv4.
    pub peer: SocketAddr,
    /// The local address the connection was accepted on.
    pub local: SocketAddr,
    /// The client's family (of `peer`).
    pub family: Family,
    /// Whether the connection is TLS (an HTTPS listener).
    pub tls: bool,
    /// Whether the peer is a trusted proxy (`--trusted-proxies`): its forwarding headers are
    /// appended to instead of replaced.
    pub trusted: bool,
    /// The negotiated TLS version (`TLSv1.3`), for TLS connections.
    pub tls_version: Option<&'static str>,
    /// The server name (SNI) the TLS client asked for.
    pub sni: Option<Arc<str>>,
    /// The certificate chain the TLS client presented (leaf first; empty for none).
    pub client_certs: Arc<[rustls_pki_types::CertificateDer<'static>]>,
    /// The Gateway pod port the connection was accepted on (`None`: an Ingress listener); its
    /// requests are routed by that port's Gateway listeners.
    pub gateway_port: Option<u16>,
    /// What every request of the connection forwards about `peer`, formatted once per
    /// connection rather than per request (by [`ConnInfo::new`], from the same address).
    pub(crate) forwarded: PeerHeaders,
    /// `X-Forwarded-Port`: the local port and its header value, formatted once per connection.
    pub(crate) local_port: (u16, HeaderValue),
}

impl ConnInfo {
    /// Describes a connection from its two addresses.
    pub fn new(peer: SocketAddr, local: SocketAddr) -> ConnInfo {
        let peer = normalize_addr(peer);
        ConnInfo {
            family: Family::of(&peer),
            peer,
            local: normalize_addr(local),
            tls: false,
            trusted: false,
            tls_version: None,
            sni: None,
            client_certs: Arc::new([]),
            gateway_port: None,
            forwarded: PeerHeaders::new(peer),
            local_port: (local.port(), HeaderValue::from(local.port())),
        }
    }

    /// The same connection with what its TLS handshake negotiated (version and SNI).
    pub fn with_tls_session(mut self, session: &rustls::ServerConnection) -> ConnInfo {
        self.tls_version = session.protocol_version().map(|v| match v {
            rustls::ProtocolVersion::TLSv1_3 => "TLSv1.3",
            rustls::ProtocolVersion::TLSv1_2 => "TLSv1.2",
            _ => "TLS",
        });
        self.sni = session.server_name().map(Arc::from);
        if let Some(chain) = session.peer_certificates() {
            self.client_certs = chain.iter().map(|c| c.clone().into_owned()).collect();
        }
        self
    }

    /// The same connection with `port` as its `X-Forwarded-Port`: the port clients reach when it
    /// is not the one accepted on (a Gateway listener's port in front of the pod port serving
    /// it). A PROXY protocol header's destination still wins (it makes a new `ConnInfo`).
    pub fn with_forwarded_port(mut self, port: u16) -> ConnInfo {
        self.local_port.1 = HeaderValue::from(port);
        self
    }

    /// The same connection, marked as TLS.
    pub fn with_tls(mut self, tls: bool) -> ConnInfo {
        self.tls = tls;
        self
    }

    /// The scheme the client used: `https` or `http`.
    pub fn scheme(&self) -> &'static str {
        if self.tls {
            "https"
        } else {
            "http"
        }
    }
}

/// The client address as forwarding headers carry it, formatted once per connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PeerHeaders {
    /// `192.0.2.1` or `2001:db8::1` (`X-Forwarded-For`, `X-Real-IP`).
    pub(crate) ip: HeaderValue,
    /// `for="192.0.2.1:4711"` or `for="[2001:db8::1]:4711"` (RFC 7239: quoted, IPv6 bracketed).
    pub(crate) for_node: String,
    /// The `Forwarded` value of the connection's first host, reused by its next requests.
    pub(crate) memo: ForwardedMemo,
}

impl PeerHeaders {
    pub(crate) fn new(peer: SocketAddr) -> PeerHeaders {
        let ip = HeaderValue::from_str(&peer.ip().to_string())
            .expect("an IP address is a valid header value");
        let for_node = match peer {
            SocketAddr::V4(a) => format!("for=\"{}:{}\"", a.ip(), a.port()),
            SocketAddr::V6(a) => format!("for=\"[{}]:{}\"", a.ip(), a.port()),
        };
        PeerHeaders {
            ip,
            for_node,
            memo: Default::default(),
        }
    }
}

/// The `Forwarded` value of the first host a connection's requests named (with the scheme it was
/// formatted for), kept so that the connection's next requests to that host share it instead of
/// formatting and allocating it again; and the six forwarding header lines duet's HTTP/1.1
/// client writes for that host ([`crate::forwarded::Forwarding::write`]), copied into the next
/// heads as one block. A cache: it takes no part in comparisons.
#[derive(Clone, Debug, Default)]
pub(crate) struct ForwardedMemo(
    pub(crate) OnceLock<(Box<str>, &'static str, HeaderValue)>,
    pub(crate) OnceLock<Box<[u8]>>,
);

impl PartialEq for ForwardedMemo {
    fn eq(&self, _: &ForwardedMemo) -> bool {
        true
    }
}

impl Eq for ForwardedMemo {}
