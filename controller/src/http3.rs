//! The `duet` binary's HTTP/3 listeners (`--http3`): their UDP sockets bound, one QUIC endpoint
//! each, served with the proxy until shutdown. A socket that cannot be bound is logged and
//! skipped: the TCP listeners serve regardless.

use std::net::SocketAddr;
use std::sync::Arc;

use dataplane::handshake::Handshakes;
use dataplane::http3::{self, Http3Options};
use dataplane::listen::ConnectionLimit;
use dataplane::metrics::Metrics;
use dataplane::proxy::Proxy;
use dataplane::table::TlsCert;
use dataplane::Runtime;
use tokio::sync::watch;

use crate::config::{Config, Http3Config};

/// The HTTP/3 UDP sockets that could be bound.
pub type Bound = Vec<(SocketAddr, std::net::UdpSocket)>;

/// Binds the HTTP/3 sockets of the command line (none without `--http3`); a failure is a
/// warning, not an error.
pub fn bind(config: Option<&Http3Config>) -> Bound {
    let Some(config) = config else {
        return Vec::new();
    };
    let mut bound = Vec::new();
    for &addr in &config.listen.addrs {
        match http3::bind(addr) {
            Ok(socket) => bound.push((socket.local_addr().unwrap_or(addr), socket)),
            Err(error) => {
                tracing::warn!(listener = %addr, %error, "Cannot bind an HTTP/3 socket; HTTPS over TCP serves without it");
            }
        }
    }
    bound
}

/// What the HTTP/3 listeners are served with.
#[derive(Debug)]
pub struct Serving {
    /// The proxy every request goes through.
    pub proxy: Arc<Proxy>,
    /// The snapshots whose certificates are served by SNI.
    pub runtime: Arc<Runtime>,
    /// The certificate for clients whose SNI matches none.
    pub fallback: TlsCert,
    /// `--max-connections`, shared with the TCP listeners.
    pub limit: ConnectionLimit,
    /// The connection counters.
    pub metrics: Arc<Metrics>,
}

/// The settings of HTTP/3 listeners from the command line (no connection counters, not a
/// Gateway port's).
pub fn options(config: &Config, h3: &Http3Config, limit: &ConnectionLimit) -> Http3Options {
    Http3Options {
        idle_timeout: config.proxy.keepalive_timeout,
        max_streams: h3.max_streams,
        handshake_timeout: config.proxy.header_read_timeout,
        drain_timeout: config.proxy.drain_timeout,
        retry_above: h3.retry_above,
        alt_svc_max_age: h3.alt_svc_max_age,
        max_connections: Some(limit.clone()),
        connections: None,
        trusted_proxies: Arc::new(config.edge.trusted_proxies.clone()),
        gateway_port: None,
        forwarded_port: None,
    }
}

/// Binds and serves every HTTP/3 socket of the command line until `stopped` turns true and
/// their connections drained.
pub async fn serve(config: &Config, serving: Serving, stopped: watch::Receiver<bool>) {
    let Some(h3) = &config.http3 else {
        return;
    };
    let bound = bind(Some(h3));
    let resolver = Arc::new(dataplane::tls::SniResolver::new(
        serving.runtime.clone(),
        &serving.fallback,
    ));
    let handshakes = Arc::new(Handshakes::new(
        serving.runtime.clone(),
        http3::tls_config(resolver),
    ));
    let endpoint_config = http3::endpoint_config();
    let mut tasks = Vec::new();
    for (addr, socket) in bound {
        let options = Http3Options {
            connections: Some(serving.metrics.quic_listener(addr)),
            ..options(config, h3, &serving.limit)
        };
        let endpoint = http3::server_config(handshakes.clone(), &options)
            .map_err(std::io::Error::other)
            .and_then(|server| http3::endpoint(socket, endpoint_config.clone(), server));
        match endpoint {
            Ok(endpoint) => {
                tracing::info!(listener = %addr, "Serving HTTP/3");
                let serving =
                    http3::serve(endpoint, serving.proxy.clone(), options, stopped.clone());
                tasks.push(tokio::spawn(async move {
                    if let Err(error) = serving.await {
                        tracing::error!(listener = %addr, %error, "HTTP/3 listener failed");
                    }
                }));
            }
            Err(error) => {
                tracing::warn!(listener = %addr, %error, "Cannot start an HTTP/3 listener; HTTPS over TCP serves without it");
            }
        }
    }
    futures_util::future::join_all(tasks).await;
}
