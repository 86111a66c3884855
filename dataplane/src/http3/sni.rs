//! The TLS configuration of a QUIC handshake picked by its SNI, as on TCP
//! ([`Handshakes::config_by_sni`]): quinn takes one crypto configuration per endpoint, so this
//! one holds each new session's ClientHello until it is whole, reads its server name with
//! rustls' [`Acceptor`], then starts the session of the configuration that name selects (asking
//! for a client certificate where a route of the host verifies them, or as the Gateway port's
//! validation says) and hands it the bytes held.

use std::any::Any;
use std::sync::Arc;

use quinn::crypto::rustls::QuicServerConfig;
use quinn::crypto::ServerConfig as _;
use quinn::crypto::{
    self, ExportKeyingMaterialError, HeaderKey, KeyPair, Keys, PacketKey, UnsupportedVersion,
};
use quinn::{ConnectionId, Side};
use quinn_proto::transport_parameters::TransportParameters;
use quinn_proto::TransportError;
use rustls::server::Acceptor;

use crate::handshake::Handshakes;

/// The QUIC server crypto configuration choosing its TLS configuration per ClientHello.
pub struct BySni {
    handshakes: Arc<Handshakes>,
    base: Arc<QuicServerConfig>,
}

impl std::fmt::Debug for BySni {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BySni").finish_non_exhaustive()
    }
}

impl BySni {
    /// Handshakes as `handshakes` picks their configurations (its base one for no SNI, an
    /// unknown one, or a ClientHello that does not parse: rustls then refuses it itself).
    pub fn new(handshakes: Arc<Handshakes>) -> Result<BySni, String> {
        let base =
            QuicServerConfig::try_from(handshakes.base().clone()).map_err(|e| e.to_string())?;
        Ok(BySni {
            handshakes,
            base: Arc::new(base),
        })
    }

    /// The session of the configuration for `sni`.
    fn session(
        &self,
        sni: Option<&str>,
        version: u32,
        params: &TransportParameters,
    ) -> Box<dyn crypto::Session> {
        let config = self.handshakes.config_by_sni(sni);
        if Arc::ptr_eq(&config, self.handshakes.base()) {
            return self.base.clone().start_session(version, params);
        }
        match QuicServerConfig::try_from(config) {
            Ok(quic) => Arc::new(quic).start_session(version, params),
            Err(_) => self.base.clone().start_session(version, params),
        }
    }
}

impl crypto::ServerConfig for BySni {
    fn initial_keys(
        &self,
        version: u32,
        dst_cid: &ConnectionId,
    ) -> Result<Keys, UnsupportedVersion> {
        self.base.initial_keys(version, dst_cid)
    }

    fn retry_tag(&self, version: u32, orig_dst_cid: &ConnectionId, packet: &[u8]) -> [u8; 16] {
        self.base.retry_tag(version, orig_dst_cid, packet)
    }

    fn start_session(
        self: Arc<Self>,
        version: u32,
        params: &TransportParameters,
    ) -> Box<dyn crypto::Session> {
        // Fed nothing until the ClientHello is whole: it only answers for the keys of the
        // Initial packets meanwhile.
        let inner = self.base.clone().start_session(version, params);
        Box::new(SniSession {
            pending: Some(Pending {
                config: self,
                version,
                params: *params,
                hello: Vec::new(),
            }),
            inner,
        })
    }
}

/// A session whose ClientHello is not whole yet.
struct Pending {
    config: Arc<BySni>,
    version: u32,
    params: TransportParameters,
    hello: Vec<u8>,
}

/// A server session started once its ClientHello named the configuration.
struct SniSession {
    pending: Option<Pending>,
    inner: Box<dyn crypto::Session>,
}

/// Whether the handshake bytes `hello` hold a whole ClientHello: `None` while not, else the
/// server name it asks for (`Some(None)`: none, or not a ClientHello rustls can read).
fn server_name(hello: &[u8]) -> Option<Option<String>> {
    const CLIENT_HELLO: u8 = 1;
    let (&kind, rest) = hello.split_first()?;
    if kind != CLIENT_HELLO {
        return Some(None);
    }
    let len = rest.get(..3)?;
    let len = usize::from(len[0]) << 16 | usize::from(len[1]) << 8 | usize::from(len[2]);
    if len > crate::client_hello::MAX_HELLO {
        return Some(None);
    }
    let message = hello.get(..4 + len)?;
    Some(read_server_name(message))
}

/// The server name of a whole ClientHello message, through rustls' [`Acceptor`] (TLS records
/// carry it there; QUIC's CRYPTO frames carry the messages bare).
fn read_server_name(message: &[u8]) -> Option<String> {
    /// The largest record fragment (RFC 8446, 5.1).
    const MAX_FRAGMENT: usize = 1 << 14;
    let mut acceptor = Acceptor::default();
    for fragment in message.chunks(MAX_FRAGMENT) {
        let len = u16::try_from(fragment.len()).ok()?.to_be_bytes();
        let mut record = Vec::with_capacity(5 + fragment.len());
        record.extend_from_slice(&[0x16, 0x03, 0x01, len[0], len[1]]);
        record.extend_from_slice(fragment);
        let mut rd = &record[..];
        while !rd.is_empty() {
            if acceptor.read_tls(&mut rd).ok()? == 0 {
                return None;
            }
        }
    }
    let accepted = acceptor.accept().ok()??;
    accepted.client_hello().server_name().map(str::to_owned)
}

impl crypto::Session for SniSession {
    fn initial_keys(&self, dst_cid: &ConnectionId, side: Side) -> Keys {
        self.inner.initial_keys(dst_cid, side)
    }

    fn handshake_data(&self) -> Option<Box<dyn Any>> {
        self.inner.handshake_data()
    }

    fn peer_identity(&self) -> Option<Box<dyn Any>> {
        self.inner.peer_identity()
    }

    fn early_crypto(&self) -> Option<(Box<dyn HeaderKey>, Box<dyn PacketKey>)> {
        self.inner.early_crypto()
    }

    fn early_data_accepted(&self) -> Option<bool> {
        self.inner.early_data_accepted()
    }

    fn is_handshaking(&self) -> bool {
        self.pending.is_some() || self.inner.is_handshaking()
    }

    fn read_handshake(&mut self, buf: &[u8]) -> Result<bool, TransportError> {
        let Some(pending) = self.pending.as_mut() else {
            return self.inner.read_handshake(buf);
        };
        pending.hello.extend_from_slice(buf);
        let Some(sni) = server_name(&pending.hello) else {
            return Ok(false);
        };
        let Some(pending) = self.pending.take() else {
            return Ok(false);
        };
        self.inner = pending
            .config
            .session(sni.as_deref(), pending.version, &pending.params);
        self.inner.read_handshake(&pending.hello)
    }

    fn transport_parameters(&self) -> Result<Option<TransportParameters>, TransportError> {
        self.inner.transport_parameters()
    }

    fn write_handshake(&mut self, buf: &mut Vec<u8>) -> Option<Keys> {
        self.inner.write_handshake(buf)
    }

    fn next_1rtt_keys(&mut self) -> Option<KeyPair<Box<dyn PacketKey>>> {
        self.inner.next_1rtt_keys()
    }

    fn is_valid_retry(&self, orig_dst_cid: &ConnectionId, header: &[u8], payload: &[u8]) -> bool {
        self.inner.is_valid_retry(orig_dst_cid, header, payload)
    }

    fn export_keying_material(
        &self,
        output: &mut [u8],
        label: &[u8],
        context: &[u8],
    ) -> Result<(), ExportKeyingMaterialError> {
        self.inner.export_keying_material(output, label, context)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A TLS 1.3 ClientHello for `sni` as rustls writes it, without its record header.
    fn client_hello(sni: &str) -> Vec<u8> {
        let config = rustls::ClientConfig::builder_with_provider(crate::tls::provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth();
        let name = rustls_pki_types::ServerName::try_from(sni.to_owned()).unwrap();
        let mut conn = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
        let mut records = Vec::new();
        conn.write_tls(&mut records).unwrap();
        records[5..].to_vec()
    }

    #[test]
    fn the_server_name_is_read_once_the_client_hello_is_whole() {
        let hello = client_hello("a.example.test");
        for cut in [0, 1, 3, 4, hello.len() / 2, hello.len() - 1] {
            assert_eq!(server_name(&hello[..cut]), None, "{cut} bytes: not whole");
        }
        assert_eq!(server_name(&hello), Some(Some("a.example.test".to_owned())));
        // Not a ClientHello, or a broken one: no name, the base configuration refuses it.
        assert_eq!(server_name(&[2, 0, 0, 0]), Some(None));
        let mut broken = hello.clone();
        broken[38] = 0xff; // the legacy session id's length
        assert_eq!(server_name(&broken).map(|n| n.is_some()), Some(false));
    }
}
