//! WebSocket tunnels after a `101 Switching Protocols`: bytes relayed both ways until either side
//! closes, nothing moves either way for the idle timeout (the route's upstream read timeout, like
//! nginx's `proxy_read_timeout`), or the drain ends. Open tunnels are counted in metrics and the
//! drain waits for them.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{watch, Notify};
use tokio::time::Instant;

use crate::metrics::{Metrics, TunnelEnd};
use crate::table::Family;

/// The open tunnels of a proxy, and the signal that closes them.
#[derive(Debug)]
pub struct Tunnels {
    open: AtomicUsize,
    all_closed: Notify,
    close: watch::Sender<bool>,
    metrics: Arc<Metrics>,
}

impl Tunnels {
    /// No tunnels yet; counted in `metrics`.
    pub fn new(metrics: Arc<Metrics>) -> Tunnels {
        Tunnels {
            open: AtomicUsize::new(0),
            all_closed: Notify::new(),
            close: watch::Sender::new(false),
            metrics,
        }
    }

    /// Open tunnels.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Acquire)
    }

    /// Waits up to `timeout` for the open tunnels to end by themselves, then closes the rest and
    /// refuses new ones. Returns how many it had to close.
    pub async fn drain(&self, timeout: Duration) -> usize {
        let deadline = Instant::now() + timeout;
        loop {
            let closed = self.all_closed.notified();
            if self.open() == 0 {
                break;
            }
            if tokio::time::timeout_at(deadline, closed).await.is_err() {
                break;
            }
        }
        let left = self.open();
        self.close.send_replace(true);
        left
    }

    /// Relays between the two sides of an upgrade, in a task of its own, until a side closes,
    /// `idle` passes without a byte either way, or the drain closes it.
    pub(crate) fn spawn(
        self: &Arc<Self>,
        client: OnUpgrade,
        upstream: OnUpgrade,
        idle: Duration,
        family: Family,
    ) {
        let tunnels = self.clone();
        let mut close = self.close.subscribe();
        tokio::spawn(async move {
            let (client, upstream) = match tokio::try_join!(client, upstream) {
                Ok(pair) => pair,
                Err(error) => {
                    tracing::trace!(%error, "Upgrade failed");
                    return;
                }
            };
            if *close.borrow_and_update() {
                return;
            }
            let _open = tunnels.enter(family);
            let relay = relay(TokioIo::new(client), TokioIo::new(upstream), idle);
            let end = tokio::select! {
                end = relay => end,
                _ = close.wait_for(|c| *c) => TunnelEnd::Drain,
            };
            tracing::trace!(?end, "Tunnel ended");
            tunnels.metrics.tunnel_closed(end);
        });
    }

    fn enter(self: &Arc<Self>, family: Family) -> OpenTunnel {
        self.open.fetch_add(1, Ordering::AcqRel);
        self.metrics.tunnel_opened(family);
        OpenTunnel {
            tunnels: self.clone(),
            family,
        }
    }
}

/// Counts one tunnel as open while alive.
struct OpenTunnel {
    tunnels: Arc<Tunnels>,
    family: Family,
}

impl Drop for OpenTunnel {
    fn drop(&mut self) {
        self.tunnels.metrics.tunnel_left(self.family);
        if self.tunnels.open.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.tunnels.all_closed.notify_waiters();
        }
    }
}

/// Copies both ways until both directions ended (a side closed) or neither moved a byte for
/// `idle`.
async fn relay<A, B>(a: A, b: B, idle: Duration) -> TunnelEnd
where
    A: AsyncRead + AsyncWrite,
    B: AsyncRead + AsyncWrite,
{
    let last = Mutex::new(Instant::now());
    let (a_read, a_write) = tokio::io::split(a);
    let (b_read, b_write) = tokio::io::split(b);
    let both = async {
        let _ = tokio::join!(copy(a_read, b_write, &last), copy(b_read, a_write, &last));
    };
    let watchdog = async {
        loop {
            let since = *last.lock().unwrap_or_else(|e| e.into_inner());
            if since.elapsed() >= idle {
                return;
            }
            tokio::time::sleep_until(since + idle).await;
        }
    };
    tokio::select! {
        () = both => TunnelEnd::Closed,
        () = watchdog => TunnelEnd::Idle,
    }
}

/// Copies one direction, noting each transfer in `last`; at EOF (or an error) shuts the writer
/// down, so the other side sees the close.
async fn copy<R, W>(mut from: R, mut to: W, last: &Mutex<Instant>)
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        *last.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
        if to.write_all(&buf[..n]).await.is_err() || to.flush().await.is_err() {
            break;
        }
        *last.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
    }
    let _ = to.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn idle_tunnels_end_and_busy_ones_do_not() {
        let (a, mut a_peer) = tokio::io::duplex(64);
        let (b, mut b_peer) = tokio::io::duplex(64);
        let idle = Duration::from_secs(10);
        let relay = tokio::spawn(relay(a, b, idle));
        // Busy for three idle periods: one byte every 5 s keeps it open.
        for _ in 0..6 {
            tokio::time::sleep(Duration::from_secs(5)).await;
            a_peer.write_all(b"x").await.unwrap();
            let mut got = [0u8; 1];
            b_peer.read_exact(&mut got).await.unwrap();
        }
        assert!(!relay.is_finished());
        let ended = tokio::time::timeout(Duration::from_secs(11), relay).await;
        assert_eq!(ended.expect("ended when idle").unwrap(), TunnelEnd::Idle);
    }

    #[tokio::test(start_paused = true)]
    async fn a_closed_side_closes_the_other() {
        let (a, a_peer) = tokio::io::duplex(64);
        let (b, mut b_peer) = tokio::io::duplex(64);
        let relay = tokio::spawn(relay(a, b, Duration::from_secs(3600)));
        drop(a_peer);
        let mut rest = Vec::new();
        b_peer.read_to_end(&mut rest).await.unwrap();
        b_peer.shutdown().await.unwrap();
        drop(b_peer);
        assert_eq!(relay.await.unwrap(), TunnelEnd::Closed);
    }

    #[tokio::test(start_paused = true)]
    async fn drain_waits_then_closes() {
        let tunnels = Arc::new(Tunnels::new(Metrics::unregistered()));
        assert_eq!(tunnels.drain(Duration::from_secs(1)).await, 0, "none open");
        let tunnels = Arc::new(Tunnels::new(Metrics::unregistered()));
        let open = tunnels.enter(Family::V6);
        let mut close = tunnels.close.subscribe();
        let started = Instant::now();
        let closed_by = tokio::spawn(async move {
            let _ = close.wait_for(|c| *c).await;
            drop(open);
            Instant::now()
        });
        assert_eq!(tunnels.drain(Duration::from_secs(25)).await, 1);
        assert!(closed_by.await.unwrap() - started >= Duration::from_secs(25));
        assert_eq!(tunnels.open(), 0);
    }
}
