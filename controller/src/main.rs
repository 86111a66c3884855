//! The `duet` binary: parses the command line, binds the dual-stack listeners, runs the control
//! loop over a manifest folder or the Kubernetes API and the dataplane in one process, and drains
//! on SIGTERM/SIGINT.

use std::io::IsTerminal as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context as _;
use controller::app::{App, AppConfig};
use controller::cluster;
use controller::config::{self, Config, ConfigError, Invocation, Listen, MigrateCheck, EXIT_USAGE};
use controller::metrics::ControllerMetrics;
use controller::resolve;
use controller::source::files;
use dataplane::access_log::{AccessLog, AccessLogFormat};
use dataplane::admin::DebugExtra;
use dataplane::listen::{self, BindError, ServeOptions};
use dataplane::metrics::Metrics;
use dataplane::observe::Telemetry;
use dataplane::proxy::Proxy;
use dataplane::Runtime;
use futures_util::future::join_all;
use tokio::sync::{mpsc, watch};
use tracing_subscriber::EnvFilter;

/// jemalloc rather than glibc's malloc: memory freed by parked idle connections and by snapshot
/// rebuilds goes back to the kernel (its background thread purges pages unused for 1 s; settings
/// in .cargo/config.toml) instead of staying with the process (README, Performance). Built
/// without the `jemalloc` feature, the binary keeps the system allocator (for heap profilers).
#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> ExitCode {
    let config = match config::parse_invocation(std::env::args_os()) {
        Ok(Invocation::Serve(config)) => *config,
        Ok(Invocation::MigrateCheck(check)) => return migrate_check(&check),
        Err(ConfigError::Info(info)) => {
            let _ = info.print();
            return ExitCode::SUCCESS;
        }
        Err(error @ ConfigError::Usage(_)) => {
            eprintln!("duet: {error}");
            return ExitCode::from(error.exit_code());
        }
    };
    let filter = std::env::var("DUET_LOG")
        .ok()
        .filter(|f| !f.trim().is_empty())
        .unwrap_or_else(|| "info".to_owned());
    let filter = match EnvFilter::builder().parse(&filter) {
        Ok(filter) => filter,
        Err(error) => {
            eprintln!("duet: invalid DUET_LOG value {filter:?}: {error}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let runtime = match async_runtime() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("duet: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let source = match config.manifests.clone() {
        Some(dir) => Source::Files(dir),
        None => match runtime.block_on(cluster::connect(&config.kube)) {
            Ok(cluster) => Source::Kube(cluster),
            Err(error) => {
                eprintln!("duet: {error}");
                return ExitCode::from(EXIT_USAGE);
            }
        },
    };
    match runtime.block_on(serve(config, source)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("duet: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// The async runtime: with one worker (`TOKIO_WORKER_THREADS=1`, as a one-core pod or the
/// benchmarks run duet) a current-thread one, whose task wakeups and parking skip the
/// multi-thread scheduler's bookkeeping (its one worker polled every task on one thread too);
/// otherwise Tokio's multi-thread runtime, one worker per core unless the variable says.
fn async_runtime() -> std::io::Result<tokio::runtime::Runtime> {
    let one_worker = std::env::var("TOKIO_WORKER_THREADS").is_ok_and(|n| n.trim() == "1");
    let mut builder = if one_worker {
        tokio::runtime::Builder::new_current_thread()
    } else {
        tokio::runtime::Builder::new_multi_thread()
    };
    builder.enable_all().build()
}

/// `duet migrate check`: 0 when every annotation is honoured, 1 when one is not, 64 on bad input.
fn migrate_check(check: &MigrateCheck) -> ExitCode {
    let stdout = std::io::stdout();
    match controller::migrate::check(check, &mut stdout.lock()) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(error) => {
            eprintln!("duet: {error}");
            ExitCode::from(EXIT_USAGE)
        }
    }
}

/// Binds every address of a listener kind; IPv6 defaults are skipped when IPv6 is disabled.
fn bind_all(
    what: &str,
    listen: &Listen,
) -> anyhow::Result<Vec<(SocketAddr, std::net::TcpListener)>> {
    let mut bound = Vec::new();
    for &addr in &listen.addrs {
        match listen::bind(addr) {
            Ok(listener) => {
                let local = listener.local_addr().unwrap_or(addr);
                bound.push((local, listener));
            }
            Err(error @ BindError::Ipv6Unavailable { .. }) if listen.defaulted => {
                tracing::warn!(listener = %addr, %error, "IPv6 unavailable; skipping a default {what} listener");
            }
            Err(error) => return Err(error).context(format!("{what} listener")),
        }
    }
    if bound.is_empty() {
        anyhow::bail!("no {what} listener could be bound");
    }
    Ok(bound)
}

/// Binds the `/debug/routes` listeners. A default address that cannot be bound (the port is taken
/// on a host-network node) is skipped with a warning: the proxy does not need it.
fn bind_debug(listen: &Listen) -> anyhow::Result<Vec<(SocketAddr, std::net::TcpListener)>> {
    let mut bound = Vec::new();
    for &addr in &listen.addrs {
        match listen::bind(addr) {
            Ok(listener) => bound.push((listener.local_addr().unwrap_or(addr), listener)),
            Err(error) if listen.defaulted => {
                tracing::warn!(listener = %addr, %error, "Skipping a default debug listener");
            }
            Err(error) => return Err(error).context("debug listener"),
        }
    }
    if let Some((addr, _)) = bound.iter().find(|(a, _)| !a.ip().is_loopback()) {
        tracing::warn!(listener = %addr, "/debug/routes (pod addresses, Secret names) is served beyond loopback");
    }
    Ok(bound)
}

fn list(bound: &[(SocketAddr, std::net::TcpListener)]) -> String {
    bound
        .iter()
        .map(|(a, _)| a.to_string())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Where objects come from.
enum Source {
    /// `--manifests DIR`.
    Files(PathBuf),
    /// The Kubernetes API.
    Kube(cluster::Cluster),
}

/// Every listener, bound.
struct Bound {
    http: Vec<(SocketAddr, std::net::TcpListener)>,
    https: Vec<(SocketAddr, std::net::TcpListener)>,
    admin: Vec<(SocketAddr, std::net::TcpListener)>,
    debug: Vec<(SocketAddr, std::net::TcpListener)>,
}

impl Bound {
    /// Binds every listener of the command line (before anything else starts: a bad address
    /// fails the start).
    fn new(config: &Config) -> anyhow::Result<Bound> {
        Ok(Bound {
            http: bind_all("HTTP", &config.http_listen)?,
            admin: bind_all("admin", &config.admin_listen)?,
            https: bind_all("HTTPS", &config.https_listen)?,
            debug: bind_debug(&config.debug_listen)?,
        })
    }
}

/// Runs duet until a signal and its drain: listeners bound, the dataplane runtime and the
/// control loop started, every listener served.
async fn serve(config: Config, source: Source) -> anyhow::Result<()> {
    let bound = Bound::new(&config)?;
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = Metrics::register(&mut registry);
    let controller_metrics = ControllerMetrics::register(&mut registry);
    let access_log = match config.access_log {
        AccessLogFormat::Json => {
            Some(AccessLog::stdout(metrics.clone()).context("cannot start the access log")?)
        }
        AccessLogFormat::Off => None,
    };
    let telemetry = Telemetry::new(registry, metrics.clone(), access_log);
    let mut proxy_config = config.proxy.clone();
    proxy_config.https_listen = bound.https.iter().map(|(addr, _)| *addr).collect();
    let runtime = Runtime::with_telemetry(proxy_config, telemetry);
    let proxy = Proxy::new(runtime.clone());
    let options = Options::new(&config, &runtime, &proxy)?;
    let (cluster, extra) = start_control(&config, source, &runtime, controller_metrics)?;
    // Registered before "Listening" is logged: a SIGTERM right after it drains, never kills.
    let mut signals = Signals::new()?;
    tracing::info!(http = %list(&bound.http), https = %list(&bound.https), admin = %list(&bound.admin), debug = %list(&bound.debug), "Listening");
    let tunnels = proxy.tunnels().clone();
    let (proxy_stop, proxy_stopped) = watch::channel(false);
    let http3 = controller::http3::serve(&config, options.http3(&metrics), proxy_stopped.clone());
    let listeners = serve_all(
        bound,
        options,
        proxy,
        &runtime,
        &metrics,
        extra,
        proxy_stopped,
    );
    let listeners = async move {
        tokio::join!(listeners, http3);
    };
    tokio::pin!(listeners);

    tokio::select! {
        _ = &mut listeners => anyhow::bail!("every listener stopped"),
        signal = signals.next() => tracing::info!(signal, delay = ?config.shutdown_delay, "Not ready; closing the listeners after the shutdown delay"),
    }
    runtime.start_draining();
    if let Some(cluster) = cluster {
        // Hand leadership over now rather than after the Lease expires, and before the
        // shutdown delay: writing status does not wait for the listeners to drain.
        cluster.shutdown().await;
    }
    // Load balancers and endpoints controllers see /readyz fail and stop sending new
    // connections while the listeners still serve.
    tokio::select! {
        () = tokio::time::sleep(config.shutdown_delay) => {}
        second = signals.next() => {
            tracing::warn!(signal = second, "Second signal; exiting without waiting");
            return Ok(());
        }
    }
    tracing::info!(timeout = ?config.proxy.drain_timeout, "Draining");
    let _ = proxy_stop.send(true);
    // WebSocket tunnels get the same drain as requests, then are closed.
    let drained = async {
        let (_, closed) = tokio::join!(&mut listeners, tunnels.drain(config.proxy.drain_timeout));
        if closed > 0 {
            tracing::info!(
                tunnels = closed,
                "Closed WebSocket tunnels at the end of the drain"
            );
        }
    };
    tokio::select! {
        () = drained => tracing::info!("Stopped"),
        second = signals.next() => {
            tracing::warn!(signal = second, "Second signal; exiting without waiting");
        }
    }
    flush_access_log(&runtime).await;
    Ok(())
}

/// How each kind of listener serves.
struct Options {
    /// The admin and debug listeners'.
    base: ServeOptions,
    /// The plain HTTP listeners' (PROXY protocol if `--proxy-protocol-http`).
    http: ServeOptions,
    /// The HTTPS listeners' (PROXY protocol if `--proxy-protocol-https`).
    tls: ServeOptions,
    /// `--proxy-protocol-from`, for every proxy listener.
    proxy_protocol_from: Option<Arc<dataplane::forwarded::TrustedProxies>>,
    /// `--max-connections`, shared by every proxy listener.
    limit: listen::ConnectionLimit,
    /// The Gateway API listeners' (bound as snapshots name their ports).
    gateway: dataplane::gateway_listen::GatewayServing,
}

impl Options {
    fn new(config: &Config, runtime: &Arc<Runtime>, proxy: &Arc<Proxy>) -> anyhow::Result<Options> {
        let base = ServeOptions {
            header_read_timeout: config.proxy.header_read_timeout,
            keepalive_timeout: config.proxy.keepalive_timeout,
            drain_timeout: config.proxy.drain_timeout,
            tls: None,
            proxy_protocol: None,
            trusted_proxies: Arc::new(config.edge.trusted_proxies.clone()),
            connections: None,
            proxy_protocol_from: None,
            max_connections: None,
            handshakes: None,
            gateway_port: None,
        };
        let edge = &config.edge;
        let proxy_protocol_from = if edge.proxy_protocol_from.0.is_empty() {
            if edge.proxy_protocol_http || edge.proxy_protocol_https {
                tracing::warn!("PROXY protocol headers are accepted from any peer; set --proxy-protocol-from to the load balancers' addresses");
            }
            None
        } else {
            Some(Arc::new(edge.proxy_protocol_from.clone()))
        };
        let pp_timeout = config.proxy.proxy_protocol_timeout;
        let http = ServeOptions {
            proxy_protocol: edge.proxy_protocol_http.then_some(pp_timeout),
            ..base.clone()
        };
        let fallback = dataplane::tls::self_signed().context("TLS fallback certificate")?;
        let tls_config = dataplane::tls::server_config(runtime.clone(), &fallback);
        let handshakes = dataplane::handshake::Handshakes::new(runtime.clone(), tls_config.clone())
            .limit_relays(config.max_passthrough_connections);
        let relays = handshakes.relay_places();
        let tls = ServeOptions {
            tls: Some(tls_config),
            handshakes: Some(Arc::new(handshakes)),
            proxy_protocol: edge.proxy_protocol_https.then_some(pp_timeout),
            ..base.clone()
        };
        let limit = listen::ConnectionLimit::new(config.max_connections);
        let gateway = dataplane::gateway_listen::GatewayServing {
            proxy: proxy.clone(),
            runtime: runtime.clone(),
            options: ServeOptions {
                max_connections: Some(limit.clone()),
                ..base.clone()
            },
            fallback: fallback.clone(),
            relays,
        };
        Ok(Options {
            gateway,
            base,
            http,
            tls,
            proxy_protocol_from,
            limit,
        })
    }
}

impl Options {
    /// What the HTTP/3 listeners share with the others: the proxy, the certificates, the
    /// connection limit.
    fn http3(&self, metrics: &Arc<Metrics>) -> controller::http3::Serving {
        controller::http3::Serving {
            proxy: self.gateway.proxy.clone(),
            runtime: self.gateway.runtime.clone(),
            fallback: self.gateway.fallback.clone(),
            limit: self.limit.clone(),
            metrics: metrics.clone(),
        }
    }
}

/// Starts the control loop over the source (in Kubernetes mode with leader election, status and
/// Events); returns the Kubernetes mode tasks, kept for the life of the process, and what
/// `/debug/routes` adds to the snapshot.
fn start_control(
    config: &Config,
    source: Source,
    runtime: &Arc<Runtime>,
    metrics: ControllerMetrics,
) -> anyhow::Result<(Option<cluster::Running>, DebugExtra)> {
    let (events_tx, events_rx) = mpsc::channel(64);
    let mut app = App::new(AppConfig::new(config.translate.clone()), runtime.clone())
        .with_metrics(metrics)
        .with_resolver(resolve::start(&config.resolv_conf));
    let mut extra = app.diagnostics().debug_extra();
    let cluster = match source {
        Source::Files(dir) => {
            files::spawn(dir, events_tx)?;
            None
        }
        Source::Kube(c) => {
            let running = c.start(&config.kube, events_tx, &mut app);
            extra = running.debug_extra(extra);
            Some(running)
        }
    };
    tokio::spawn(app.run(events_rx));
    Ok((cluster, extra))
}

/// Serves every listener, one task per accept loop on the worker threads (`listen::serve` spawns
/// every connection); ends when all have stopped. The admin endpoints stay up (answering
/// `/readyz` 503) until the proxies have drained.
fn serve_all(
    bound: Bound,
    options: Options,
    proxy: Arc<Proxy>,
    runtime: &Arc<Runtime>,
    metrics: &Metrics,
    extra: DebugExtra,
    proxy_stopped: watch::Receiver<bool>,
) -> impl std::future::Future<Output = ()> {
    let (admin_stop, admin_stopped) = watch::channel(false);
    let plain = bound.http.into_iter().map(|l| (l, options.http.clone()));
    let secure = bound.https.into_iter().map(|l| (l, options.tls.clone()));
    let proxies: Vec<_> = plain
        .chain(secure)
        .map(|((addr, listener), serve_options)| {
            let proxy = proxy.clone();
            let handler = move |req, conn| proxy.clone().handle(req, conn);
            let serve_options = ServeOptions {
                connections: Some(metrics.listener(addr)),
                proxy_protocol_from: options.proxy_protocol_from.clone(),
                max_connections: Some(options.limit.clone()),
                ..serve_options
            };
            let stopped = proxy_stopped.clone();
            ended(
                addr,
                tokio::spawn(listen::serve(listener, serve_options, handler, stopped)),
            )
        })
        .collect();
    let probes: Vec<_> = bound
        .admin
        .into_iter()
        .map(|(addr, listener)| {
            let runtime = runtime.clone();
            let handler = move |req, conn| dataplane::admin::handle(runtime.clone(), req, conn);
            let stopped = admin_stopped.clone();
            let serving = listen::serve(listener, options.base.clone(), handler, stopped);
            ended(addr, tokio::spawn(serving))
        })
        .collect();
    let debugs: Vec<_> = bound
        .debug
        .into_iter()
        .map(|(addr, listener)| {
            let runtime = runtime.clone();
            let extra = extra.clone();
            let handler = move |req, conn| {
                dataplane::admin::debug(runtime.clone(), Some(extra.clone()), req, conn)
            };
            let stopped = admin_stopped.clone();
            let serving = listen::serve(listener, options.base.clone(), handler, stopped);
            ended(addr, tokio::spawn(serving))
        })
        .collect();
    let gateways = tokio::spawn(dataplane::gateway_listen::run(
        options.gateway,
        proxy_stopped,
    ));
    let admins = async move { tokio::join!(join_all(probes), join_all(debugs)) };
    let proxies = async move {
        let _ = tokio::join!(join_all(proxies), gateways);
        let _ = admin_stop.send(true);
    };
    async move {
        tokio::join!(proxies, admins);
    }
}

/// Waits for one listener's accept loop to end, and reports how it ended.
async fn ended(addr: SocketAddr, task: tokio::task::JoinHandle<std::io::Result<()>>) {
    report(addr, task.await);
}

/// Flushes the access log's last lines (at most 2 s).
async fn flush_access_log(runtime: &Runtime) {
    if let Some(log) = runtime.telemetry().access_log() {
        let log = log.clone();
        let _ =
            tokio::task::spawn_blocking(move || log.flush(std::time::Duration::from_secs(2))).await;
    }
}

fn report(addr: SocketAddr, result: Result<std::io::Result<()>, tokio::task::JoinError>) {
    match result {
        Ok(Ok(())) => {}
        Ok(Err(error)) => tracing::error!(listener = %addr, %error, "Listener failed"),
        Err(error) => tracing::error!(listener = %addr, %error, "Listener task failed"),
    }
}

/// SIGTERM and SIGINT, caught from creation on.
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> anyhow::Result<Signals> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Signals {
            term: signal(SignalKind::terminate()).context("cannot listen for SIGTERM")?,
            int: signal(SignalKind::interrupt()).context("cannot listen for SIGINT")?,
        })
    }

    /// Waits for the next SIGTERM or SIGINT; returns its name.
    async fn next(&mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
        }
    }
}
