//! Idle HTTP/1.1 upstream connections, by address and TLS settings: a connection serves one
//! request at a time and goes back to the pool when its response body is done.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hyper::client::conn::http1::SendRequest;

use super::{PoolKey, PoolMap, UpstreamBody};

/// A pooled connection and when it went idle.
type IdleConn = (SendRequest<UpstreamBody>, Instant);

/// Idle upstream HTTP/1.1 connections by address and TLS settings.
#[derive(Debug)]
pub(super) struct Pool {
    idle: Mutex<PoolMap<Vec<IdleConn>>>,
    /// How long a connection may stay idle.
    max_idle: Duration,
    /// Idle connections kept per key.
    max_per_key: usize,
}

impl Pool {
    pub(super) fn new(max_idle: Duration, max_per_key: usize) -> Pool {
        Pool {
            idle: Mutex::default(),
            max_idle,
            max_per_key,
        }
    }

    /// An idle connection ready for a request, if there is one.
    pub(super) fn take(&self, key: PoolKey) -> Option<SendRequest<UpstreamBody>> {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let list = idle.get_mut(&key)?;
        while let Some((sender, since)) = list.pop() {
            if sender.is_ready() && since.elapsed() < self.max_idle {
                return Some(sender);
            }
        }
        None
    }

    fn put(&self, key: PoolKey, sender: SendRequest<UpstreamBody>) {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let list = idle.entry(key).or_default();
        if list.len() < self.max_per_key {
            list.push((sender, Instant::now()));
        }
    }

    /// Drops closed and expired connections, and keys with none left.
    pub(super) fn reap(&self) {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        idle.retain(|_, list| {
            list.retain(|(sender, since)| !sender.is_closed() && since.elapsed() < self.max_idle);
            !list.is_empty()
        });
    }
}

/// An HTTP/1.1 upstream connection whose response is being relayed; dropped with the response
/// body, it goes back to the pool. By then the connection has almost always read the whole
/// response and is ready for the next request, so it is pooled at once; otherwise a task waits
/// until it is ready (or closed, and then it is not pooled).
#[derive(Debug)]
pub(crate) struct PoolReturn {
    sender: Option<SendRequest<UpstreamBody>>,
    pool: Arc<Pool>,
    key: PoolKey,
}

impl PoolReturn {
    pub(super) fn new(pool: Arc<Pool>, key: PoolKey, sender: SendRequest<UpstreamBody>) -> Self {
        PoolReturn {
            sender: Some(sender),
            pool,
            key,
        }
    }
}

impl Drop for PoolReturn {
    fn drop(&mut self) {
        let Some(mut sender) = self.sender.take() else {
            return;
        };
        if sender.is_ready() {
            self.pool.put(self.key, sender);
        } else if !sender.is_closed() {
            let (pool, key) = (self.pool.clone(), self.key);
            tokio::spawn(async move {
                if sender.ready().await.is_ok() {
                    pool.put(key, sender);
                }
            });
        }
    }
}
