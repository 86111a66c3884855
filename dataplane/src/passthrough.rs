//! ingress-nginx's `ssl-passthrough` on the HTTPS listeners: the ClientHello is read by
//! [`crate::client_hello`] while a copy of every byte is kept; when its server name (SNI) is a
//! passthrough host of the live table, a target of the host's backend is picked by the balancer
//! (the client's family first, the other as the family policy allows, as for HTTP), the bytes
//! read so far are replayed to it, and bytes are copied both ways until both sides have closed,
//! no byte has moved either way for `--passthrough-idle-timeout`, or one side has closed and the
//! other has sent nothing for [`FIN_TIMEOUT`]. TLS is not terminated: the client sees the
//! upstream's certificate. A Gateway TLS listener in mode Terminate relays the same way the
//! stream duet decrypted ([`Relay::terminated`]).

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::balance::{InFlight, LiveBackend};
use crate::runtime::Runtime;
use crate::table::passthrough::Passthrough;
use crate::table::Family;

/// The client side of a relay.
enum Client {
    /// Unterminated: its bytes as sent.
    Tcp(TcpStream),
    /// TLS terminated by duet: the decrypted stream.
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

/// A connection to relay: the client, the bytes it sent so far, and where to.
pub struct Relay {
    stream: Client,
    hello: Vec<u8>,
    to: Passthrough,
    runtime: Arc<Runtime>,
    /// Its place under `--max-passthrough-connections`, held until it ends.
    _place: Option<tokio::sync::OwnedSemaphorePermit>,
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
            stream: Client::Tcp(stream),
            hello,
            to,
            runtime,
            _place: None,
        }
    }

    /// A relay of a TLS connection duet terminated: its decrypted stream, to `to`.
    pub fn terminated(
        stream: tokio_rustls::server::TlsStream<TcpStream>,
        to: Passthrough,
        runtime: Arc<Runtime>,
    ) -> Relay {
        Relay {
            stream: Client::Tls(Box::new(stream)),
            hello: Vec::new(),
            to,
            runtime,
            _place: None,
        }
    }

    /// The relay, holding `place` until it ends.
    pub fn holding(mut self, place: Option<tokio::sync::OwnedSemaphorePermit>) -> Relay {
        self._place = place;
        self
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
        if !self.hello.is_empty() && upstream.write_all(&self.hello).await.is_err() {
            return;
        }
        self.hello = Vec::new();
        let idle = self.runtime.config.passthrough_idle_timeout;
        let ended = match &mut self.stream {
            Client::Tcp(client) => copy_until_idle(client, &mut upstream, idle).await,
            Client::Tls(client) => copy_until_idle(&mut **client, &mut upstream, idle).await,
        };
        tracing::trace!(client.addr = %peer, ?ended, "Passthrough ended");
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

/// How long a relay waits, once one side has closed, for the other side to send before closing
/// it too (HAProxy's `timeout client-fin`/`server-fin`): a client that sent its ClientHello and
/// went silent does not keep its place after the upstream hung up. Never longer than the idle
/// timeout.
pub const FIN_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a relay ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Ended {
    /// Both sides closed (bytes copied client to upstream, upstream to client).
    Closed(u64, u64),
    /// No byte moved for the idle timeout, or for [`FIN_TIMEOUT`] after one side closed.
    Idle,
    /// A read or write failed.
    Failed(io::ErrorKind),
}

/// Copies bytes both ways between `client` and `upstream`, passing on each side's close to the
/// other, until both have closed, or nothing moved for `idle` (for `min(idle, FIN_TIMEOUT)` once
/// one side has closed), or a side fails. Both connections are closed when it returns.
pub async fn copy_until_idle<C>(client: &mut C, upstream: &mut TcpStream, idle: Duration) -> Ended
where
    C: AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let start = Instant::now();
    let last = AtomicU64::new(0);
    let (client_in, mut client_out) = tokio::io::split(client);
    let (upstream_in, mut upstream_out) = upstream.split();
    let up = one_way(Stamped::new(client_in, &last, start), &mut upstream_out);
    let down = one_way(Stamped::new(upstream_in, &last, start), &mut client_out);
    tokio::pin!(up, down);
    let (mut sent, mut received) = (None, None);
    loop {
        let quiet = if sent.is_some() || received.is_some() {
            idle.min(FIN_TIMEOUT)
        } else {
            idle
        };
        let deadline = start + Duration::from_millis(last.load(Ordering::Relaxed)) + quiet;
        // A side's close counts as its last activity: the other's quiet time starts there.
        tokio::select! {
            done = &mut up, if sent.is_none() => {
                sent = Some(done);
                stamp(&last, start);
            }
            done = &mut down, if received.is_none() => {
                received = Some(done);
                stamp(&last, start);
            }
            () = tokio::time::sleep_until(deadline) => {
                if quiet_for(&last, start) >= quiet {
                    return Ended::Idle;
                }
            }
        }
        match (&sent, &received) {
            (Some(Err(e)), _) | (_, Some(Err(e))) => return Ended::Failed(e.kind()),
            (Some(Ok(up)), Some(Ok(down))) => return Ended::Closed(*up, *down),
            _ => {}
        }
    }
}

/// Copies `from` to `to` until `from` closes, then closes `to`'s sending side.
async fn one_way<R, W>(mut from: R, to: &mut W) -> io::Result<u64>
where
    R: AsyncRead + Unpin,
    W: tokio::io::AsyncWrite + Unpin,
{
    let copied = tokio::io::copy(&mut from, to).await?;
    to.shutdown().await?;
    Ok(copied)
}

/// A reader that records when it last read bytes (milliseconds since `start`) in a clock both
/// directions of a relay share.
struct Stamped<'a, R> {
    inner: R,
    last: &'a AtomicU64,
    start: Instant,
}

impl<'a, R> Stamped<'a, R> {
    fn new(inner: R, last: &'a AtomicU64, start: Instant) -> Self {
        Stamped { inner, last, start }
    }
}

/// Records now in a relay's clock.
fn stamp(last: &AtomicU64, start: Instant) {
    let now = u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX);
    last.store(now, Ordering::Relaxed);
}

/// Time since a relay's clock was last stamped.
fn quiet_for(last: &AtomicU64, start: Instant) -> Duration {
    start
        .elapsed()
        .saturating_sub(Duration::from_millis(last.load(Ordering::Relaxed)))
}

impl<R: AsyncRead + Unpin> AsyncRead for Stamped<'_, R> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            stamp(this.last, this.start);
        }
        polled
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;
    use tokio::net::TcpListener;

    /// Two connected sockets on `ip`'s loopback: (the outside end, the relay's end).
    async fn pair(ip: &str) -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind((ip, 0)).await.unwrap();
        let outside = TcpStream::connect(listener.local_addr().unwrap());
        let (outside, accepted) = tokio::join!(outside, listener.accept());
        (outside.unwrap(), accepted.unwrap().0)
    }

    /// A relay between a client and an upstream on `ip`'s loopback, idle after `idle`: the
    /// client's end, the upstream's end, and the relay's outcome with the time it took.
    async fn relay(
        ip: &str,
        idle: Duration,
    ) -> (
        TcpStream,
        TcpStream,
        tokio::task::JoinHandle<(Ended, Duration)>,
    ) {
        let (client, mut from_client) = pair(ip).await;
        let (mut to_upstream, upstream) = pair(ip).await;
        let relay = tokio::spawn(async move {
            let start = Instant::now();
            let ended = copy_until_idle(&mut from_client, &mut to_upstream, idle).await;
            (ended, start.elapsed())
        });
        (client, upstream, relay)
    }

    #[tokio::test]
    async fn a_silent_client_is_closed_soon_after_its_upstream_hangs_up() {
        for ip in ["127.0.0.1", "::1"] {
            let (mut client, mut upstream, relay) = relay(ip, Duration::from_secs(60)).await;
            client.write_all(b"hello").await.unwrap();
            let mut got = [0u8; 5];
            upstream.read_exact(&mut got).await.unwrap();
            drop(upstream);
            let (ended, took) = tokio::time::timeout(FIN_TIMEOUT * 2, relay)
                .await
                .unwrap_or_else(|_| panic!("{ip}: relay still open"))
                .unwrap();
            assert_eq!(ended, Ended::Idle, "{ip}");
            assert!(
                took >= FIN_TIMEOUT - Duration::from_millis(100),
                "{ip}: {took:?}"
            );
            let mut rest = Vec::new();
            client.read_to_end(&mut rest).await.unwrap();
            assert!(rest.is_empty(), "{ip}: the client sees the close");
        }
    }

    #[tokio::test]
    async fn a_relay_moving_bytes_stays_and_a_silent_one_goes_after_the_idle_timeout() {
        let idle = Duration::from_millis(600);
        for ip in ["127.0.0.1", "::1"] {
            let (mut client, mut upstream, relay) = relay(ip, idle).await;
            for _ in 0..5 {
                tokio::time::sleep(idle / 3).await;
                client.write_all(b"x").await.unwrap();
                let mut got = [0u8; 1];
                upstream.read_exact(&mut got).await.unwrap();
            }
            assert!(!relay.is_finished(), "{ip}: closed while bytes moved");
            let (ended, took) = tokio::time::timeout(idle * 4, relay)
                .await
                .unwrap_or_else(|_| panic!("{ip}: idle relay still open"))
                .unwrap();
            assert_eq!(ended, Ended::Idle, "{ip}");
            assert!(took >= idle * 5 / 3 + idle, "{ip}: {took:?}");
        }
    }

    #[tokio::test]
    async fn both_sides_closing_ends_the_relay_with_its_counts() {
        for ip in ["127.0.0.1", "::1"] {
            let (mut client, mut upstream, relay) = relay(ip, Duration::from_secs(60)).await;
            client.write_all(b"ping").await.unwrap();
            client.shutdown().await.unwrap();
            let mut got = Vec::new();
            upstream.read_to_end(&mut got).await.unwrap();
            assert_eq!(got, b"ping", "{ip}");
            upstream.write_all(b"pong!").await.unwrap();
            drop(upstream);
            let (ended, _) = relay.await.unwrap();
            assert_eq!(ended, Ended::Closed(4, 5), "{ip}");
            let mut back = Vec::new();
            client.read_to_end(&mut back).await.unwrap();
            assert_eq!(back, b"pong!", "{ip}");
        }
    }
}
