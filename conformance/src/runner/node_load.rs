//! Continuous load for the node scenarios: clients in the namespace outside the node send
//! `GET /` with one Host to each load-balancer address, each request on a connection of its own
//! (so every request meets whatever the load balancer, kube-proxy and duet's pods are doing at
//! that moment), and count what comes back. A request counts as answered only with a 200 from
//! an echo pod reached over the client's family; a refused or reset connection, a timeout or
//! any other status is a failure. The load stops when told, and by itself after [`MAX_RUN`].

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::client::Conn;
use crate::cluster::netns;
use crate::echo::Family;

/// The longest a load runs, whatever happens to the runner.
const MAX_RUN: Duration = Duration::from_secs(1800);
/// How long one request (connect included) may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// The pause between two requests of one client.
const PAUSE: Duration = Duration::from_millis(20);
/// Failures kept for the report.
const KEPT_FAILURES: usize = 5;

/// What the clients saw since the last [`Load::take`].
#[derive(Clone, Debug, Default)]
pub struct Stats {
    /// Requests sent.
    pub requests: u64,
    /// Requests not answered as they should be.
    pub failed: u64,
    /// The longest time to a complete answer (or a failure).
    pub longest: Duration,
    /// The first few failures, with the address and the error.
    pub failures: Vec<String>,
    /// Requests per family, IPv4 then IPv6.
    pub by_family: [u64; 2],
}

impl Stats {
    fn record(&mut self, family: Family, took: Duration, outcome: Result<(), String>) {
        self.requests += 1;
        self.by_family[usize::from(family == Family::V6)] += 1;
        self.longest = self.longest.max(took);
        if let Err(e) = outcome {
            self.failed += 1;
            if self.failures.len() < KEPT_FAILURES {
                self.failures.push(e);
            }
        }
    }
}

/// Clients running on a thread of their own in the outside namespace.
#[derive(Debug)]
pub struct Load {
    stop: Arc<AtomicBool>,
    stats: Arc<Mutex<Stats>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Load {
    /// Starts `clients` clients per target in the namespace at `outside`.
    pub fn start(outside: &Path, targets: &[SocketAddr], host: &str, clients: usize) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(Mutex::new(Stats::default()));
        let run = Run {
            outside: outside.to_owned(),
            targets: targets.to_vec(),
            host: host.to_owned(),
            clients,
            stop: stop.clone(),
            stats: stats.clone(),
        };
        let thread = std::thread::spawn(move || {
            if let Err(e) = run.run() {
                eprintln!("node-scenarios: the load stopped: {e:#}");
            }
        });
        Load {
            stop,
            stats,
            thread: Some(thread),
        }
    }

    /// What the clients saw since the last call, and a fresh count from now on.
    pub fn take(&self) -> Stats {
        std::mem::take(&mut *self.stats.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Whether the load thread still runs.
    pub fn running(&self) -> bool {
        self.thread.as_ref().is_some_and(|t| !t.is_finished())
    }
}

struct Run {
    outside: PathBuf,
    targets: Vec<SocketAddr>,
    host: String,
    clients: usize,
    stop: Arc<AtomicBool>,
    stats: Arc<Mutex<Stats>>,
}

impl Run {
    fn run(self) -> anyhow::Result<()> {
        netns::enter_path(&self.outside)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let this = Arc::new(self);
        runtime.block_on(async {
            let mut tasks = tokio::task::JoinSet::new();
            for &target in &this.targets {
                for _ in 0..this.clients {
                    let this = this.clone();
                    tasks.spawn(async move { this.client(target).await });
                }
            }
            while tasks.join_next().await.is_some() {}
        });
        Ok(())
    }

    async fn client(&self, target: SocketAddr) {
        let family = Family::of(&target);
        let started = Instant::now();
        while !self.stop.load(Ordering::Relaxed) && started.elapsed() < MAX_RUN {
            let t0 = Instant::now();
            let outcome = match tokio::time::timeout(REQUEST_TIMEOUT, self.request(target)).await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(format!("{target}: {e:#}")),
                Err(_) => Err(format!("{target}: no answer within {REQUEST_TIMEOUT:?}")),
            };
            let took = t0.elapsed();
            self.stats
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .record(family, took, outcome);
            tokio::time::sleep(PAUSE).await;
        }
    }

    async fn request(&self, target: SocketAddr) -> anyhow::Result<()> {
        let stream = tokio::net::TcpStream::connect(target)
            .await
            .context("connect")?;
        let local = stream.local_addr()?;
        let mut conn = Conn::over(stream, local, target, false).await?;
        let reply = conn.get(&self.host, "/").await?;
        anyhow::ensure!(reply.status == 200, "status {}", reply.status);
        let echo = reply.echo()?;
        let family = Family::of(&target);
        anyhow::ensure!(
            echo.family == family,
            "the pod was reached over {}, the client came over {family}",
            echo.family
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_count_each_family_and_keep_the_first_failures() {
        let mut stats = Stats::default();
        for i in 0..8 {
            let outcome = if i % 2 == 0 {
                Ok(())
            } else {
                Err(format!("e{i}"))
            };
            stats.record(Family::V6, Duration::from_millis(i), outcome);
        }
        stats.record(Family::V4, Duration::from_millis(2), Ok(()));
        assert_eq!((stats.requests, stats.failed), (9, 4));
        assert_eq!(stats.by_family, [1, 8]);
        assert_eq!(stats.longest, Duration::from_millis(7));
        assert_eq!(stats.failures, ["e1", "e3", "e5", "e7"]);
    }
}
