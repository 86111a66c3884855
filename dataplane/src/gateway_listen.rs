//! The sockets of Gateway API listeners: for each pod port the live snapshot's
//! [`GatewayTable`](crate::table::gateway::GatewayTable) names, one IPv4 and one IPv6 listening
//! socket (`0.0.0.0:PORT`, `[::]:PORT`, bound by [`crate::listen::bind`]), served by
//! [`crate::listen::serve`] with the connection marked with its port so the proxy routes it by that
//! port's listeners. An HTTPS port asks for client certificates as its Gateway's `tls.frontend`
//! validation says ([`crate::handshake::Handshakes::on_gateway_https_port`]). A port of TLS listeners (TLSRoutes) reads each ClientHello and relays the
//! connection, unterminated or decrypted as the listener's mode says, to the TLSRoute its SNI
//! selects ([`crate::handshake::Handshakes::on_gateway_port`], [`crate::passthrough`]), bounded
//! with the other relays by `--max-passthrough-connections`. Ports are bound when a snapshot names them and
//! closed (gracefully: open connections drain) when one no longer does, or when the port switches
//! between HTTP, HTTPS and passthrough.
//! A port that cannot be bound (taken by an Ingress listener or another process) is logged and
//! tried again with the next snapshot; the other listeners are never disturbed.

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::handshake::Handshakes;
use crate::listen::{self, BindError, ServeOptions};
use crate::proxy::Proxy;
use crate::runtime::Runtime;
use crate::table::gateway::GatewayPort;
use crate::table::TlsCert;

/// What the Gateway listeners are served with.
#[derive(Clone, Debug)]
pub struct GatewayServing {
    /// The proxy every listener hands requests to.
    pub proxy: Arc<Proxy>,
    /// The runtime whose snapshots name the ports.
    pub runtime: Arc<Runtime>,
    /// Options of plain listeners (TLS and the port are set per port).
    pub options: ServeOptions,
    /// The certificate of TLS clients no listener's certificate serves.
    pub fallback: TlsCert,
    /// The places of passthrough relays, shared with the HTTPS listeners' (`None`: unbounded
    /// but for the connection limit).
    pub relays: Option<Arc<tokio::sync::Semaphore>>,
}

/// How a port is served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Http,
    Https,
    TlsRoutes,
}

impl Mode {
    fn of(port: &GatewayPort) -> Mode {
        match (port.tls_routes, port.tls) {
            (true, _) => Mode::TlsRoutes,
            (false, true) => Mode::Https,
            (false, false) => Mode::Http,
        }
    }
}

/// One bound port.
struct BoundPort {
    mode: Mode,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<std::io::Result<()>>>,
}

/// Binds and closes Gateway listener sockets as snapshots are applied, until `shutdown` turns
/// true; then stops every listener and waits for them to drain.
pub async fn run(serving: GatewayServing, mut shutdown: watch::Receiver<bool>) {
    let mut applied = serving.runtime.applied();
    let mut bound: BTreeMap<u16, BoundPort> = BTreeMap::new();
    let mut closing: Vec<JoinHandle<std::io::Result<()>>> = Vec::new();
    loop {
        reconcile(&serving, &mut bound, &mut closing);
        tokio::select! {
            changed = applied.changed() => if changed.is_err() { break },
            _ = shutdown.wait_for(|stop| *stop) => break,
        }
    }
    for (_, port) in std::mem::take(&mut bound) {
        let _ = port.stop.send(true);
        closing.extend(port.tasks);
    }
    for task in closing {
        let _ = task.await;
    }
}

/// Makes the bound ports those of the live snapshot.
fn reconcile(
    serving: &GatewayServing,
    bound: &mut BTreeMap<u16, BoundPort>,
    closing: &mut Vec<JoinHandle<std::io::Result<()>>>,
) {
    let live = serving.runtime.load_full();
    let wanted: BTreeMap<u16, Mode> = live
        .snapshot
        .gateways
        .ports
        .iter()
        .map(|(port, p)| (*port, Mode::of(p)))
        .collect();
    let gone: Vec<u16> = bound
        .iter()
        .filter(|(port, b)| wanted.get(port) != Some(&b.mode))
        .map(|(port, _)| *port)
        .collect();
    for port in gone {
        if let Some(b) = bound.remove(&port) {
            let _ = b.stop.send(true);
            closing.extend(b.tasks);
            tracing::info!(port, "Gateway listener closed");
        }
    }
    closing.retain(|t| !t.is_finished());
    for (port, mode) in wanted {
        if bound.contains_key(&port) {
            continue;
        }
        if let Some(b) = bind_port(serving, port, mode) {
            bound.insert(port, b);
        }
    }
}

/// Binds a port on both families and starts serving it; `None` when no family could be bound.
fn bind_port(serving: &GatewayServing, port: u16, mode: Mode) -> Option<BoundPort> {
    let (stop, stopped) = watch::channel(false);
    let tls = (mode != Mode::Http).then(|| server_config(serving, port, mode == Mode::Https));
    let handshakes = match (&tls, mode) {
        (Some(config), Mode::TlsRoutes) => {
            let h = Handshakes::new(serving.runtime.clone(), config.clone())
                .on_gateway_port(port)
                .sharing_relays(serving.relays.clone());
            Some(Arc::new(h))
        }
        (Some(config), Mode::Https) => {
            let h = Handshakes::new(serving.runtime.clone(), config.clone())
                .on_gateway_https_port(port);
            Some(Arc::new(h))
        }
        _ => None,
    };
    let options = ServeOptions {
        tls,
        handshakes,
        gateway_port: Some(port),
        ..serving.options.clone()
    };
    let mut tasks = Vec::new();
    let mut addrs = Vec::new();
    for ip in [
        IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    ] {
        let addr = SocketAddr::new(ip, port);
        match listen::bind(addr) {
            Ok(listener) => {
                let proxy = serving.proxy.clone();
                let handler = move |req, conn| proxy.clone().handle(req, conn);
                let serve = listen::serve(listener, options.clone(), handler, stopped.clone());
                tasks.push(tokio::spawn(serve));
                addrs.push(addr.to_string());
            }
            Err(error @ BindError::Ipv6Unavailable { .. }) => {
                tracing::warn!(%error, "IPv6 unavailable; Gateway listener on IPv4 only");
            }
            Err(error) => {
                tracing::warn!(%error, port, "Cannot bind a Gateway listener; trying again with the next snapshot");
            }
        }
    }
    if tasks.is_empty() {
        return None;
    }
    tracing::info!(port, ?mode, listen = %addrs.join(" "), "Gateway listener bound");
    Some(BoundPort { mode, stop, tasks })
}

/// The TLS configuration of an HTTPS Gateway port (`http`: offering h2 and http/1.1 by ALPN) or
/// of a TLS one (no ALPN: the stream is relayed as it is): the certificate of the listener the
/// SNI selects, from the live snapshot.
fn server_config(serving: &GatewayServing, port: u16, http: bool) -> Arc<rustls::ServerConfig> {
    let resolver = PortCerts {
        runtime: serving.runtime.clone(),
        port,
        fallback: serving.fallback.key.clone(),
    };
    let mut config = rustls::ServerConfig::builder_with_provider(crate::tls::provider())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .expect("ring supports TLS 1.2 and 1.3")
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(resolver));
    if http {
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    }
    Arc::new(config)
}

/// Picks the certificate of the listener an SNI selects on one port.
struct PortCerts {
    runtime: Arc<Runtime>,
    port: u16,
    fallback: Arc<CertifiedKey>,
}

impl fmt::Debug for PortCerts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PortCerts")
            .field("port", &self.port)
            .finish()
    }
}

impl ResolvesServerCert for PortCerts {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let live = self.runtime.load();
        let sni = hello.server_name().unwrap_or("");
        let cert = live
            .snapshot
            .gateways
            .port(self.port)
            .and_then(|p| p.listener(sni))
            .and_then(|l| l.cert.as_ref())
            .map(|c| c.key.clone());
        Some(cert.unwrap_or_else(|| self.fallback.clone()))
    }
}
