//! The live state of the dataplane: the current snapshot with balancer state, swapped atomically.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::{ArcSwap, Guard};

use crate::access_policy::AuthDestinations;
use crate::balance::LiveBackend;
use crate::metrics::LiveMetrics;
use crate::observe::Telemetry;
use crate::table::gateway::GatewayTable;
use crate::table::{BackendId, Family, RouteTable, Snapshot};
use crate::upstream::tls::UpstreamTlsConfigs;

mod delta;

/// Timeouts and limits of the proxy, parsed once at start.
#[derive(Clone, Debug)]
pub struct ProxyConfig {
    /// Upstream TCP connect timeout per attempt (nginx `proxy_connect_timeout`: 60 s; ours is
    /// shorter because another family or target can be tried).
    pub connect_timeout: Duration,
    /// Time to wait for the upstream's response head (nginx `proxy_read_timeout`: 60 s); 504
    /// after it.
    pub response_timeout: Duration,
    /// Time a client has to send a request head (nginx `client_header_timeout`: 60 s).
    pub header_read_timeout: Duration,
    /// Time a client connection may stay idle between requests (nginx `keepalive_timeout`:
    /// 75 s).
    pub keepalive_timeout: Duration,
    /// Idle time after which a pooled upstream connection is closed.
    pub upstream_idle_timeout: Duration,
    /// Idle keep-alive connections kept per upstream address (ingress-nginx's
    /// `upstream-keepalive-connections`: 320).
    pub upstream_idle_per_addr: usize,
    /// How many targets one request may try after connect failures.
    pub max_target_attempts: usize,
    /// How long draining waits for open connections on shutdown.
    pub drain_timeout: Duration,
    /// Time a client (a load balancer) has to send its PROXY protocol header, where expected.
    pub proxy_protocol_timeout: Duration,
    /// Time an `ssl-passthrough` relay may go without a byte either way before both sides are
    /// closed (nginx stream's `proxy_timeout`: 10 min).
    pub passthrough_idle_timeout: Duration,
    /// The bound HTTPS listener addresses; the HTTPS redirect names the port of the client's
    /// family (443 when there is none).
    pub https_listen: Vec<SocketAddr>,
    /// The addresses auth requests may reach (`--auth-allowed-destinations`).
    pub auth_destinations: AuthDestinations,
}

impl ProxyConfig {
    /// The HTTPS port for a client of a family: that family's HTTPS listener, else any, else 443.
    pub fn https_port(&self, family: Family) -> u16 {
        self.https_listen
            .iter()
            .find(|a| Family::of(a) == family)
            .or(self.https_listen.first())
            .map_or(443, |a| a.port())
    }
}

impl Default for ProxyConfig {
    fn default() -> Self {
        ProxyConfig {
            connect_timeout: Duration::from_secs(5),
            response_timeout: Duration::from_secs(60),
            header_read_timeout: Duration::from_secs(60),
            keepalive_timeout: Duration::from_secs(75),
            upstream_idle_timeout: Duration::from_secs(60),
            upstream_idle_per_addr: 320,
            max_target_attempts: 3,
            drain_timeout: Duration::from_secs(25),
            proxy_protocol_timeout: Duration::from_secs(5),
            passthrough_idle_timeout: Duration::from_secs(600),
            https_listen: Vec::new(),
            auth_destinations: AuthDestinations::Default,
        }
    }
}

/// Backends from which [`Runtime::apply`] makes the live backends on a second thread.
const PARALLEL_APPLY_BACKENDS: usize = 2048;

/// The live backends of `snapshot`: those of `old` whose backend is the same `Arc`, the others
/// built (carrying per-target state over by `TargetId`); on up to `threads` threads.
fn live_backends(old: &Live, snapshot: &Snapshot, threads: usize) -> crate::policy::Backends {
    snapshot.backends.map_on(threads, |id, backend| {
        let previous = old.backends.get(id);
        match previous {
            Some(p) if Arc::ptr_eq(&p.backend, backend) => p.clone(),
            _ => Arc::new(LiveBackend::new(backend.clone(), previous.map(|p| &**p))),
        }
    })
}

/// The route metric handles and upstream TLS configurations of `snapshot`, reusing `old`'s.
fn route_handles(
    metrics: &Arc<crate::metrics::Metrics>,
    snapshot: &Snapshot,
    old: &Live,
) -> (LiveMetrics, UpstreamTlsConfigs) {
    let route_metrics = LiveMetrics::build(metrics, snapshot, &old.metrics);
    let upstream_tls =
        UpstreamTlsConfigs::build(&snapshot.routes, &snapshot.gateways, &old.upstream_tls);
    (route_metrics, upstream_tls)
}

/// What [`Runtime::prepare_routes`] made for a route table: see [`Runtime::apply_prepared`].
#[derive(Debug)]
pub struct PreparedRoutes {
    /// The live state they were made from (whose handles they carry over).
    base: Arc<Live>,
    routes: Arc<RouteTable>,
    gateways: Arc<GatewayTable>,
    metrics: LiveMetrics,
    upstream_tls: UpstreamTlsConfigs,
}

/// Drops the replaced live state on a thread of its own when it is large (10,000 live backends
/// at the 10k-Ingress size): [`Runtime::apply`] returns without freeing it. Inline when small.
fn retire(old: Arc<Live>) {
    if old.backends.len() >= PARALLEL_APPLY_BACKENDS {
        drop_beside(old);
    }
}

/// Drops `value` on a thread of its own ("duet-retire"), so that the caller does not wait for
/// its frees (a replaced snapshot, plan or live state: tens of thousands of allocations at
/// scale). Inline when no thread can be started.
pub fn drop_beside<T: Send + 'static>(value: T) {
    let _ = std::thread::Builder::new()
        .name("duet-retire".into())
        .spawn(move || drop(value));
}

/// What a request sees: one snapshot and the live backends built from it.
#[derive(Debug, Default)]
pub struct Live {
    /// The snapshot as published.
    pub snapshot: Arc<Snapshot>,
    /// Backends with their balancer state.
    pub backends: crate::policy::Backends,
    /// Metric handles of the snapshot's routes.
    pub metrics: LiveMetrics,
    /// The TLS client configurations of the snapshot's upstream TLS settings.
    pub upstream_tls: UpstreamTlsConfigs,
}

/// The dataplane's shared state: the live snapshot, readiness and configuration.
#[derive(Debug)]
pub struct Runtime {
    live: ArcSwap<Live>,
    applied: AtomicBool,
    draining: AtomicBool,
    apply_lock: Mutex<()>,
    /// The version of the last applied snapshot, for those who act on each (Gateway listeners).
    applied_version: tokio::sync::watch::Sender<u64>,
    /// Proxy timeouts and limits.
    pub config: ProxyConfig,
    telemetry: Telemetry,
}

impl Runtime {
    /// A runtime with an empty table, not ready until the first [`Runtime::apply`].
    pub fn new(config: ProxyConfig) -> Arc<Runtime> {
        Runtime::with_telemetry(config, Telemetry::standalone())
    }

    /// A runtime recording metrics and access-log lines through `telemetry`.
    pub fn with_telemetry(config: ProxyConfig, telemetry: Telemetry) -> Arc<Runtime> {
        Arc::new(Runtime {
            live: ArcSwap::from_pointee(Live::default()),
            applied: AtomicBool::new(false),
            draining: AtomicBool::new(false),
            apply_lock: Mutex::new(()),
            applied_version: tokio::sync::watch::Sender::new(0),
            config,
            telemetry,
        })
    }

    /// Metrics and access log.
    pub fn telemetry(&self) -> &Telemetry {
        &self.telemetry
    }

    /// Publishes a snapshot. Backends whose `Arc` is unchanged keep their live state object;
    /// changed ones are rebuilt, carrying per-target state over by `TargetId`; upstream TLS
    /// settings get their client configurations, kept from the previous snapshot when equal.
    pub fn apply(&self, snapshot: Arc<Snapshot>) {
        self.apply_with(snapshot, None)
    }

    /// The route metric handles and upstream TLS configurations of a route table about to be
    /// applied (they depend on nothing else), made while the rest of its snapshot is built:
    /// [`Runtime::apply_prepared`] then only makes the live backends. Handles of routes the
    /// table drops are let go here, as [`Runtime::apply`] does shortly before the swap.
    pub fn prepare_routes(
        &self,
        routes: &Arc<RouteTable>,
        gateways: &Arc<GatewayTable>,
    ) -> PreparedRoutes {
        let base = self.live.load_full();
        let routes_only = Snapshot {
            routes: routes.clone(),
            gateways: gateways.clone(),
            ..Snapshot::default()
        };
        let (metrics, upstream_tls) = route_handles(self.telemetry.metrics(), &routes_only, &base);
        PreparedRoutes {
            base,
            routes: routes.clone(),
            gateways: gateways.clone(),
            metrics,
            upstream_tls,
        }
    }

    /// [`Runtime::apply`] with the route handles `prepared` made, when they were made from the
    /// live state and for `snapshot`'s routes and Gateway listeners; else they are made again.
    pub fn apply_prepared(&self, snapshot: Arc<Snapshot>, prepared: PreparedRoutes) {
        self.apply_with(snapshot, Some(prepared))
    }

    fn apply_with(&self, snapshot: Arc<Snapshot>, prepared: Option<PreparedRoutes>) {
        let _one_at_a_time = self.apply_lock.lock().unwrap_or_else(|e| e.into_inner());
        let old = self.live.load_full();
        let metrics = self.telemetry.metrics();
        let prepared = prepared.and_then(|p| {
            let fits = Arc::ptr_eq(&p.base, &old)
                && Arc::ptr_eq(&p.routes, &snapshot.routes)
                && Arc::ptr_eq(&p.gateways, &snapshot.gateways);
            // `base` is the live state `retire` lets go of below: not held beyond this.
            fits.then_some((p.metrics, p.upstream_tls))
        });
        // The live backends and the route metric handles do not depend on each other: at scale
        // (10,000 backends) they are made side by side, on a scoped thread and this one; with
        // the handles made before, the live backends take both threads.
        let large = snapshot.backends.len() >= PARALLEL_APPLY_BACKENDS;
        let backends = |threads: usize| live_backends(&old, &snapshot, threads);
        let (backends, (route_metrics, upstream_tls)) = if let Some(handles) = prepared {
            let cores = std::thread::available_parallelism().map_or(1, usize::from);
            (backends(if large { cores.min(2) } else { 1 }), handles)
        } else if large {
            std::thread::scope(|scope| {
                let backends = scope.spawn(|| backends(1));
                let handles = route_handles(metrics, &snapshot, &old);
                (backends.join().expect("live backends"), handles)
            })
        } else {
            (backends(1), route_handles(metrics, &snapshot, &old))
        };
        let certs_changed = !Arc::ptr_eq(&old.snapshot.certs, &snapshot.certs);
        metrics.snapshot_applied(&snapshot, certs_changed);
        metrics.set_backend_targets(&snapshot);
        let version = snapshot.version;
        self.live.store(Arc::new(Live {
            snapshot,
            backends,
            metrics: route_metrics,
            upstream_tls,
        }));
        self.applied.store(true, Ordering::Release);
        self.applied_version.send_replace(version);
        retire(old);
    }

    /// Publishes a snapshot built from `base` by replacing the backends `changed` and nothing
    /// else (routes, certificates, Gateway listeners and every other backend the same `Arc`s):
    /// the work is proportional to `changed`. When `base` is not the live snapshot, or its
    /// tables differ, this is [`Runtime::apply`].
    pub fn apply_changed(
        &self,
        snapshot: Arc<Snapshot>,
        base: &Arc<Snapshot>,
        changed: &[BackendId],
    ) {
        let _one_at_a_time = self.apply_lock.lock().unwrap_or_else(|e| e.into_inner());
        let old = self.live.load_full();
        if !delta::applies(&old, &snapshot, base) {
            drop(_one_at_a_time);
            return self.apply(snapshot);
        }
        let backends = delta::live_backends(&old, &snapshot, changed);
        let metrics = self.telemetry.metrics();
        metrics.snapshot_applied(&snapshot, false);
        metrics.set_backend_targets(&snapshot);
        let version = snapshot.version;
        self.live.store(Arc::new(Live {
            snapshot,
            backends,
            metrics: old.metrics.clone(),
            upstream_tls: old.upstream_tls.clone(),
        }));
        self.applied.store(true, Ordering::Release);
        self.applied_version.send_replace(version);
    }

    /// Changes each time a snapshot is applied.
    pub fn applied(&self) -> tokio::sync::watch::Receiver<u64> {
        self.applied_version.subscribe()
    }

    /// The live snapshot; one load per request, no lock.
    pub fn load(&self) -> Guard<Arc<Live>> {
        self.live.load()
    }

    /// The live snapshot as an owned `Arc`.
    pub fn load_full(&self) -> Arc<Live> {
        self.live.load_full()
    }

    /// Ready: a snapshot has been applied and the process is not draining.
    pub fn is_ready(&self) -> bool {
        self.applied.load(Ordering::Acquire) && !self.draining.load(Ordering::Acquire)
    }

    /// Marks the process as draining: `/readyz` answers 503 from now on.
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::Release);
    }
}
