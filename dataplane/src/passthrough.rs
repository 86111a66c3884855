//! ingress-nginx's `ssl-passthrough` on the HTTPS listeners: the ClientHello is read by
//! [`crate::client_hello`] while a copy of every byte is kept; when its server name (SNI) is a
//! passthrough host of the live table, a target of the host's backend is picked by the balancer
//! (the client's family first, the other as the family policy allows, as for HTTP), the bytes
//! read so far are replayed to it, and bytes are copied both ways until either side closes. TLS
//! is never terminated: the client sees the upstream's certificate.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::balance::{InFlight, LiveBackend};
use crate::runtime::Runtime;
use crate::table::passthrough::Passthrough;
use crate::table::Family;

/// A connection to relay unterminated: the client, the bytes it sent so far, and where to.
pub struct Relay {
    stream: TcpStream,
    hello: Vec<u8>,
    to: Passthrough,
    runtime: Arc<Runtime>,
}

impl std::fmt::Debug for Relay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay")
            .field("backend", &self.to.backend)
            .finish_non_exhaustive()
    }
}

impl Relay {
    /// A relay of `stream`, whose first bytes were `hello`, to `to`.
    pub fn new(stream: TcpStream, hello: Vec<u8>, to: Passthrough, runtime: Arc<Runtime>) -> Relay {
        Relay {
            stream,
            hello,
            to,
            runtime,
        }
    }

    /// Connects to a target of the backend for a client of `client`'s family, replays the
    /// ClientHello and copies both ways until a side closes; without a reachable target the
    /// client's connection is closed. Counted by client and upstream family.
    pub async fn run(mut self, client: Family, peer: SocketAddr) {
        let metrics = self.runtime.telemetry().metrics().clone();
        let Some((mut upstream, family, _in_flight)) = self.connect(client).await else {
            tracing::debug!(client.addr = %peer, backend = %self.to.backend, "Passthrough: no target reachable; closing");
            metrics.passthrough_connection(client, None);
            return;
        };
        metrics.passthrough_connection(client, Some(family));
        if upstream.write_all(&self.hello).await.is_err() {
            return;
        }
        self.hello = Vec::new();
        match tokio::io::copy_bidirectional(&mut self.stream, &mut upstream).await {
            Ok((up, down)) => {
                tracing::trace!(client.addr = %peer, up, down, "Passthrough ended");
            }
            Err(error) => tracing::trace!(%error, client.addr = %peer, "Passthrough ended"),
        }
    }

    /// A TCP connection to a target of the backend: targets picked by the balancer (up to
    /// `--max-target-attempts`), each one's addresses in family-policy order, failures recorded
    /// in the target's health as for HTTP.
    async fn connect(&self, client: Family) -> Option<(TcpStream, Family, InFlight)> {
        let live = self.runtime.load_full();
        let backend: &LiveBackend = live.backends.get(&self.to.backend)?;
        let timeout = self.runtime.config.connect_timeout;
        let mut tried = Vec::new();
        for _ in 0..self.runtime.config.max_target_attempts {
            let pick = backend.pick(client, self.to.policy, &tried)?;
            tried.push(pick.index);
            let state = &backend.states[pick.index];
            for (family, addr) in pick.addrs.into_iter().flatten() {
                match tokio::time::timeout(timeout, TcpStream::connect(addr)).await {
                    Ok(Ok(stream)) => {
                        let _ = stream.set_nodelay(true);
                        state.record_success(family);
                        return Some((stream, family, backend.states.start(pick.index)));
                    }
                    Ok(Err(error)) => {
                        tracing::trace!(%error, upstream.addr = %addr, "Passthrough connect failed");
                        state.record_failure(family);
                    }
                    Err(_) => {
                        tracing::trace!(upstream.addr = %addr, "Passthrough connect timed out");
                        state.record_failure(family);
                    }
                }
            }
        }
        None
    }
}
