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
//! A port is bound on both families or not at all. A port that cannot be bound is tried again
//! with the next snapshot and on a timer, soon at first, then every [`RETRY_MAX`]: a port that
//! switches mode (or passes from a deleted Gateway to a new one) is released by its old listener
//! only when that listener's task next runs, a moment after the new one first tries to bind it;
//! a port taken by an Ingress listener or another process is logged once and bound when freed.
//! The other listeners are never disturbed.

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

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

/// The first retry of a port that could not be bound; each later one waits twice as long.
const RETRY_FIRST: Duration = Duration::from_millis(20);
/// The longest wait between two tries of a port that cannot be bound.
pub const RETRY_MAX: Duration = Duration::from_secs(2);
/// How long a port may fail to bind before a warning says so (a port switching mode is usually
/// bound on the first retry).
const WARN_AFTER: Duration = Duration::from_secs(1);

/// A wanted port not bound yet.
struct Unbound {
    since: Instant,
    next: Instant,
    wait: Duration,
    warned: bool,
}

/// Binds and closes Gateway listener sockets as snapshots are applied (and retries the ports that
/// could not be bound), until `shutdown` turns true; then stops every listener and waits for them
/// to drain.
pub async fn run(serving: GatewayServing, mut shutdown: watch::Receiver<bool>) {
    let mut applied = serving.runtime.applied();
    let mut bound: BTreeMap<u16, BoundPort> = BTreeMap::new();
    let mut unbound: BTreeMap<u16, Unbound> = BTreeMap::new();
    let mut closing: Vec<JoinHandle<std::io::Result<()>>> = Vec::new();
    loop {
        reconcile(&serving, &mut bound, &mut unbound, &mut closing);
        let retry = unbound.values().map(|u| u.next).min();
        tokio::select! {
            changed = applied.changed() => if changed.is_err() { break },
            _ = shutdown.wait_for(|stop| *stop) => break,
            _ = sleep_until(retry) => {}
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

/// Sleeps until `at`; forever when `None`.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Makes the bound ports those of the live snapshot.
fn reconcile(
    serving: &GatewayServing,
    bound: &mut BTreeMap<u16, BoundPort>,
    unbound: &mut BTreeMap<u16, Unbound>,
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
    unbound.retain(|port, _| wanted.contains_key(port));
    let now = Instant::now();
    for (port, mode) in wanted {
        if bound.contains_key(&port) {
            continue;
        }
        match bind_port(serving, port, mode) {
            Ok(b) => {
                if let Some(u) = unbound.remove(&port) {
                    tracing::info!(
                        port,
                        waited_ms = u.since.elapsed().as_millis() as u64,
                        "Gateway listener port free again"
                    );
                }
                bound.insert(port, b);
            }
            Err(error) => failed(unbound, port, &error, now),
        }
    }
}

/// Records a failed bind of `port`: when to try again, and a warning once it has failed for
/// [`WARN_AFTER`].
fn failed(unbound: &mut BTreeMap<u16, Unbound>, port: u16, error: &BindError, now: Instant) {
    let u = unbound.entry(port).or_insert(Unbound {
        since: now,
        next: now,
        wait: RETRY_FIRST / 2,
        warned: false,
    });
    u.wait = (u.wait * 2).min(RETRY_MAX);
    u.next = now + u.wait;
    if !u.warned && now.duration_since(u.since) >= WARN_AFTER {
        u.warned = true;
        tracing::warn!(%error, port, "Cannot bind a Gateway listener; trying again every {} s", RETRY_MAX.as_secs());
    } else {
        tracing::debug!(%error, port, "Cannot bind a Gateway listener yet; trying again");
    }
}

/// Binds a port on both families (IPv4 only where the host has no IPv6) and starts serving it;
/// nothing is bound when a family cannot be.
fn bind_port(serving: &GatewayServing, port: u16, mode: Mode) -> Result<BoundPort, BindError> {
    let mut listeners = Vec::new();
    for ip in [
        IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    ] {
        match listen::bind(SocketAddr::new(ip, port)) {
            Ok(listener) => listeners.push(listener),
            Err(error @ BindError::Ipv6Unavailable { .. }) => {
                tracing::warn!(%error, "IPv6 unavailable; Gateway listener on IPv4 only");
            }
            // The sockets bound so far close as `listeners` drops.
            Err(error) => return Err(error),
        }
    }
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
    for listener in listeners {
        addrs.push(
            listener
                .local_addr()
                .map(|a| a.to_string())
                .unwrap_or_default(),
        );
        let proxy = serving.proxy.clone();
        let handler = move |req, conn| proxy.clone().handle(req, conn);
        let serve = listen::serve(listener, options.clone(), handler, stopped.clone());
        tasks.push(tokio::spawn(serve));
    }
    tracing::info!(port, ?mode, listen = %addrs.join(" "), "Gateway listener bound");
    Ok(BoundPort { mode, stop, tasks })
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
