//! The upstream send timeout (ingress-nginx's `proxy-send-timeout`): the longest the upstream may
//! go without accepting more of the request body, as nginx's `proxy_send_timeout` (between two
//! successive writes, not for the whole request). The request body marks when the connection
//! asks it for more ([`crate::limits::Limited`]); while the body is waiting on the client, or is
//! done, the clock does not run. A leaf: no other module of the crate.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Progress of one request body towards the upstream.
#[derive(Debug)]
pub struct SendWatch {
    timeout: Duration,
    epoch: Instant,
    /// Milliseconds since `epoch` of the last time the connection asked for more.
    last: AtomicU64,
    /// The body is waiting for the client: not the upstream's fault.
    on_client: AtomicBool,
    /// The whole body is handed over.
    done: AtomicBool,
}

impl SendWatch {
    /// A watch allowing `timeout` between two requests for more of the body.
    pub fn new(timeout: Duration) -> Arc<SendWatch> {
        Arc::new(SendWatch {
            timeout,
            epoch: Instant::now(),
            last: AtomicU64::new(0),
            on_client: AtomicBool::new(false),
            done: AtomicBool::new(false),
        })
    }

    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// The connection asks for more of the body.
    pub fn asked(&self) {
        self.last.store(self.now(), Ordering::Relaxed);
    }

    /// The body answered: `pending` when it waits for the client.
    pub fn answered(&self, pending: bool) {
        self.on_client.store(pending, Ordering::Relaxed);
    }

    /// The whole body is handed over: the clock stops.
    pub fn finish(&self) {
        self.done.store(true, Ordering::Relaxed);
    }

    /// Completes once the upstream has not asked for more for the timeout while the body had
    /// some to give; never once the body is done.
    pub async fn stalled(&self) {
        loop {
            let waited =
                Duration::from_millis(self.now().saturating_sub(self.last.load(Ordering::Relaxed)));
            let idle = self.done.load(Ordering::Relaxed) || self.on_client.load(Ordering::Relaxed);
            if !idle && waited >= self.timeout {
                return;
            }
            let wait = if idle {
                self.timeout
            } else {
                self.timeout - waited
            };
            tokio::time::sleep(wait.max(Duration::from_millis(10))).await;
        }
    }
}

/// Runs `send` unless the watch sees the upstream stall first (`None` then).
pub async fn guard<F: Future>(watch: Option<Arc<SendWatch>>, send: F) -> Option<F::Output> {
    let Some(watch) = watch else {
        return Some(send.await);
    };
    watch.asked();
    tokio::select! {
        out = send => Some(out),
        () = watch.stalled() => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn only_the_upstream_stalling_counts() {
        let w = SendWatch::new(Duration::from_secs(1));
        // Waiting on the client does not count.
        w.asked();
        w.answered(true);
        let never = guard(Some(w.clone()), tokio::time::sleep(Duration::from_secs(5))).await;
        assert_eq!(never, Some(()));
        // The body had data but the upstream stopped asking: cut after the timeout.
        w.answered(false);
        let cut = guard(Some(w.clone()), std::future::pending::<()>()).await;
        assert_eq!(cut, None);
        // Done: the wait for the response is not the send timeout's business.
        w.finish();
        let done = guard(Some(w), tokio::time::sleep(Duration::from_secs(5))).await;
        assert_eq!(done, Some(()));
    }
}
