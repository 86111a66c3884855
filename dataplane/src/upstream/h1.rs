//! Idle HTTP/1.1 upstream connections, by address and TLS settings: a connection serves one
//! request at a time and goes back to the pool when its response body is done. hyper's
//! connections and those of duet's own client ([`super::client`]) are kept apart, under one cap
//! per key.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hyper::client::conn::http1::SendRequest;

use super::{PoolKey, PoolMap, UpstreamBody};

/// A pooled connection and when it went idle.
type IdleConn = (SendRequest<UpstreamBody>, Instant);

/// What the pool asks of an idle connection of duet's client (`C`, which the pool does not
/// otherwise look into: [`super::client`] builds on the pool, not the other way round).
pub(crate) trait ClientIdle {
    /// Whether the connection can take a request: the upstream neither closed it nor sent
    /// anything while it was idle.
    fn is_idle_open(&mut self) -> bool;
}

/// The idle connections of one key.
#[derive(Debug)]
struct Idle<C> {
    /// hyper's.
    hyper: Vec<IdleConn>,
    /// duet's client's.
    client: Vec<(C, Instant)>,
}

impl<C> Default for Idle<C> {
    fn default() -> Self {
        Idle {
            hyper: Vec::new(),
            client: Vec::new(),
        }
    }
}

impl<C> Idle<C> {
    fn len(&self) -> usize {
        self.hyper.len() + self.client.len()
    }
}

/// Idle upstream HTTP/1.1 connections by address and TLS settings; `C` is a connection of
/// duet's own client.
#[derive(Debug)]
pub(crate) struct Pool<C> {
    idle: Mutex<PoolMap<Idle<C>>>,
    /// How long a connection may stay idle.
    max_idle: Duration,
    /// Idle connections kept per key.
    max_per_key: usize,
}

impl<C: ClientIdle> Pool<C> {
    pub(super) fn new(max_idle: Duration, max_per_key: usize) -> Pool<C> {
        Pool {
            idle: Mutex::default(),
            max_idle,
            max_per_key,
        }
    }

    /// An idle connection ready for a request, if there is one.
    pub(super) fn take(&self, key: PoolKey) -> Option<SendRequest<UpstreamBody>> {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let list = &mut idle.get_mut(&key)?.hyper;
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
            list.hyper.push((sender, Instant::now()));
        }
    }

    /// An idle connection of duet's client, open and quiet, if there is one.
    pub(super) fn take_client(&self, key: PoolKey) -> Option<C> {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let list = &mut idle.get_mut(&key)?.client;
        while let Some((mut conn, since)) = list.pop() {
            if since.elapsed() < self.max_idle && conn.is_idle_open() {
                return Some(conn);
            }
        }
        None
    }

    /// A connection of duet's client whose response is done, back to the pool.
    pub(super) fn put_client(&self, key: PoolKey, conn: C) {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let list = idle.entry(key).or_default();
        if list.len() < self.max_per_key {
            list.client.push((conn, Instant::now()));
        }
    }

    /// Drops closed and expired connections, and keys with none left.
    pub(super) fn reap(&self) {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        idle.retain(|_, list| {
            let fresh = |since: &Instant| since.elapsed() < self.max_idle;
            list.hyper
                .retain(|(sender, since)| !sender.is_closed() && fresh(since));
            list.client
                .retain_mut(|(conn, since)| fresh(since) && conn.is_idle_open());
            list.len() > 0
        });
    }
}

/// An HTTP/1.1 upstream connection whose response is being relayed; dropped with the response
/// body, it goes back to the pool. By then the connection has almost always read the whole
/// response and is ready for the next request, so it is pooled at once; otherwise a task waits
/// until it is ready (or closed, and then it is not pooled).
#[derive(Debug)]
pub(crate) struct PoolReturn<C: ClientIdle + Send + 'static> {
    sender: Option<SendRequest<UpstreamBody>>,
    pool: Arc<Pool<C>>,
    key: PoolKey,
}

impl<C: ClientIdle + Send + 'static> PoolReturn<C> {
    pub(super) fn new(pool: Arc<Pool<C>>, key: PoolKey, sender: SendRequest<UpstreamBody>) -> Self {
        PoolReturn {
            sender: Some(sender),
            pool,
            key,
        }
    }
}

impl<C: ClientIdle + Send + 'static> Drop for PoolReturn<C> {
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
