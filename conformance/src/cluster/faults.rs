//! A fault-injecting HTTP proxy in front of a real kube-apiserver: the client under test talks
//! plain HTTP to the proxy (on `127.0.0.1` and `[::1]`, a kubeconfig for each), the proxy
//! forwards every request to the API server with the cluster's admin credentials and streams the
//! answer back, and the test decides what goes wrong: answer chosen requests with an error status
//! (429 and 503 with `Retry-After`, 500) instead of forwarding them, hold requests unanswered,
//! cut every open watch mid-stream, or drop every connection and refuse new ones for a while.
//! Every request is recorded (method, path, query, status), and open watches are counted.
//!
//! The proxy runs on a thread of its own, started from the caller's thread, so it lives in the
//! caller's network namespace (the cluster's, once the caller joined it).

use std::convert::Infallible;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};

use crate::echo::Family;
use crate::runner::kube_api::KubeApi;

type Body = UnsyncBoxBody<Bytes, io::Error>;

/// One request the proxy answered or forwarded.
#[derive(Clone, Debug)]
pub struct Record {
    /// `GET`, `POST`, ...
    pub method: String,
    /// The path, e.g. `/api/v1/namespaces/kube/secrets`.
    pub path: String,
    /// The raw query string.
    pub query: String,
    /// The status answered (an injected one, or the API server's).
    pub status: u16,
    /// When it arrived.
    pub at: Instant,
}

impl Record {
    /// Whether it was a watch.
    pub fn is_watch(&self) -> bool {
        is_watch(&self.query)
    }

    /// One query parameter, percent-decoded.
    pub fn param(&self, name: &str) -> Option<String> {
        self.query
            .split('&')
            .find_map(|p| p.strip_prefix(name)?.strip_prefix('='))
            .map(percent_decode)
    }
}

fn is_watch(query: &str) -> bool {
    query
        .split('&')
        .any(|p| p == "watch=true" || p == "watch=1")
}

/// `%XX` escapes and `+` decoded.
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b'+', _) => {
                out.push(b' ');
                i += 1;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Requests answered with an error status instead of being forwarded.
#[derive(Clone, Debug)]
pub struct Fault {
    status: u16,
    retry_after: Option<u32>,
    method: Option<Method>,
    path: Option<String>,
    query: Option<String>,
    watch: Option<bool>,
    remaining: Option<u32>,
    until: Option<Instant>,
}

impl Fault {
    /// Every request gets `status`, until [`FaultProxy::heal`].
    pub fn status(status: u16) -> Fault {
        Fault {
            status,
            retry_after: None,
            method: None,
            path: None,
            query: None,
            watch: None,
            remaining: None,
            until: None,
        }
    }

    /// With a `Retry-After: SECONDS` header.
    pub fn retry_after(mut self, seconds: u32) -> Fault {
        self.retry_after = Some(seconds);
        self
    }

    /// Only requests with this method.
    pub fn method(mut self, method: Method) -> Fault {
        self.method = Some(method);
        self
    }

    /// Only requests whose path contains `part`.
    pub fn path(mut self, part: &str) -> Fault {
        self.path = Some(part.to_owned());
        self
    }

    /// Only requests whose query, percent-decoded, contains `part` (e.g. `metadata.name=`).
    pub fn query(mut self, part: &str) -> Fault {
        self.query = Some(part.to_owned());
        self
    }

    /// Only watches (`true`) or only the other requests (`false`).
    pub fn watches(mut self, watch: bool) -> Fault {
        self.watch = Some(watch);
        self
    }

    /// Only the next `count` matching requests.
    pub fn times(mut self, count: u32) -> Fault {
        self.remaining = Some(count);
        self
    }

    /// Only for `duration` from now.
    pub fn lasting(mut self, duration: Duration) -> Fault {
        self.until = Some(Instant::now() + duration);
        self
    }

    fn matches(&self, method: &Method, path: &str, query: &str) -> bool {
        self.method.as_ref().is_none_or(|m| m == method)
            && self.path.as_deref().is_none_or(|p| path.contains(p))
            && self
                .query
                .as_deref()
                .is_none_or(|q| percent_decode(query).contains(q))
            && self.watch.is_none_or(|w| w == is_watch(query))
    }

    fn spent(&self) -> bool {
        self.remaining == Some(0) || self.until.is_some_and(|u| Instant::now() >= u)
    }
}

#[derive(Debug)]
struct State {
    upstream: PathBuf,
    faults: Mutex<Vec<Fault>>,
    stall_until: Mutex<Option<Instant>>,
    down_until: Mutex<Option<Instant>>,
    records: Mutex<Vec<Record>>,
    /// Paths (with query) of the watches streaming now.
    watches: Mutex<Vec<(u64, String)>>,
    next_watch: Mutex<u64>,
    /// Bumped to cut every open watch.
    cut_watches: watch::Sender<u64>,
    /// Bumped to drop every connection.
    cut_all: watch::Sender<u64>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl State {
    fn injected(&self, method: &Method, path: &str, query: &str) -> Option<Fault> {
        let mut faults = lock(&self.faults);
        faults.retain(|f| !f.spent());
        let fault = faults.iter_mut().find(|f| f.matches(method, path, query))?;
        if let Some(n) = fault.remaining.as_mut() {
            *n -= 1;
        }
        Some(fault.clone())
    }

    fn down(&self) -> bool {
        lock(&self.down_until).is_some_and(|u| Instant::now() < u)
    }

    fn record(&self, method: &Method, path: &str, query: &str, status: u16) {
        lock(&self.records).push(Record {
            method: method.to_string(),
            path: path.to_owned(),
            query: query.to_owned(),
            status,
            at: Instant::now(),
        });
    }
}

/// A running proxy; it stops when dropped.
#[derive(Debug)]
pub struct FaultProxy {
    state: Arc<State>,
    addrs: Vec<SocketAddr>,
    kubeconfigs: Vec<PathBuf>,
    _dir: tempfile::TempDir,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl FaultProxy {
    /// Starts a proxy to the API server of the kubeconfig `upstream` (its credentials are used
    /// for every forwarded request), listening on an ephemeral port of `127.0.0.1` and of `[::1]`.
    pub fn start(upstream: &Path) -> anyhow::Result<FaultProxy> {
        let (cut_watches, _) = watch::channel(0);
        let (cut_all, _) = watch::channel(0);
        let state = Arc::new(State {
            upstream: upstream.to_owned(),
            faults: Mutex::new(Vec::new()),
            stall_until: Mutex::new(None),
            down_until: Mutex::new(None),
            records: Mutex::new(Vec::new()),
            watches: Mutex::new(Vec::new()),
            next_watch: Mutex::new(0),
            cut_watches,
            cut_all,
        });
        let mut std_listeners = Vec::new();
        for ip in [
            IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(Ipv6Addr::LOCALHOST),
        ] {
            let listener = std::net::TcpListener::bind(SocketAddr::new(ip, 0))
                .with_context(|| format!("cannot bind the fault proxy on {ip}"))?;
            listener.set_nonblocking(true)?;
            std_listeners.push(listener);
        }
        let addrs = std_listeners
            .iter()
            .map(|l| l.local_addr())
            .collect::<io::Result<Vec<_>>>()?;
        let dir = tempfile::Builder::new().prefix("duet-faults-").tempdir()?;
        let kubeconfigs = addrs
            .iter()
            .map(|addr| {
                let path = dir.path().join(format!("kubeconfig-{}", Family::of(addr)));
                std::fs::write(&path, kubeconfig(*addr))?;
                Ok(path)
            })
            .collect::<io::Result<Vec<_>>>()?;
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let (ready, is_ready) = std::sync::mpsc::channel();
        let serving = state.clone();
        // A thread started here shares this thread's network namespace.
        let thread = std::thread::Builder::new()
            .name("fault-proxy".into())
            .spawn(move || serve_thread(serving, std_listeners, stopped, ready))?;
        is_ready
            .recv()
            .context("the fault proxy thread ended")?
            .context("the fault proxy cannot reach the API server")?;
        Ok(FaultProxy {
            state,
            addrs,
            kubeconfigs,
            _dir: dir,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// The proxy's address on `family`'s loopback.
    pub fn addr(&self, family: Family) -> SocketAddr {
        self.addrs[usize::from(family == Family::V6)]
    }

    /// A kubeconfig pointing at the proxy over `family` (plain HTTP, no credentials).
    pub fn kubeconfig(&self, family: Family) -> &Path {
        &self.kubeconfigs[usize::from(family == Family::V6)]
    }

    /// Answers the requests `fault` matches with its status instead of forwarding them.
    pub fn fail(&self, fault: Fault) {
        lock(&self.state.faults).push(fault);
    }

    /// Holds every request arriving in the next `duration` until it ends (a hung API server;
    /// open watches keep streaming).
    pub fn stall_for(&self, duration: Duration) {
        *lock(&self.state.stall_until) = Some(Instant::now() + duration);
    }

    /// Ends every open watch abruptly, mid-stream (the connection is dropped, no final chunk).
    pub fn cut_watches(&self) {
        self.state.cut_watches.send_modify(|n| *n += 1);
    }

    /// Drops every connection now and every new one for `duration`: the API server is gone.
    pub fn outage(&self, duration: Duration) {
        *lock(&self.state.down_until) = Some(Instant::now() + duration);
        self.state.cut_all.send_modify(|n| *n += 1);
    }

    /// Ends every fault, stall and outage.
    pub fn heal(&self) {
        lock(&self.state.faults).clear();
        *lock(&self.state.stall_until) = None;
        *lock(&self.state.down_until) = None;
    }

    /// Every request so far, oldest first.
    pub fn requests(&self) -> Vec<Record> {
        lock(&self.state.records).clone()
    }

    /// How many watches whose path contains `part` are streaming now.
    pub fn open_watches(&self, part: &str) -> usize {
        self.watches(part).len()
    }

    /// The watches whose path contains `part` streaming now, as `PATH?QUERY` (decoded).
    pub fn watches(&self, part: &str) -> Vec<String> {
        lock(&self.state.watches)
            .iter()
            .filter(|(_, path)| path.contains(part))
            .map(|(_, path)| percent_decode(path))
            .collect()
    }
}

/// A kubeconfig for a plain-HTTP server at `addr` (IPv6 bracketed), namespace `default`.
fn kubeconfig(addr: SocketAddr) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: faults\n  cluster:\n    server: http://{addr}\ncontexts:\n- name: faults\n  context:\n    cluster: faults\n    user: faults\n    namespace: default\ncurrent-context: faults\nusers:\n- name: faults\n  user: {{}}\n"
    )
}

fn serve_thread(
    state: Arc<State>,
    listeners: Vec<std::net::TcpListener>,
    stopped: tokio::sync::oneshot::Receiver<()>,
    ready: std::sync::mpsc::Sender<anyhow::Result<()>>,
) {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            let _ = ready.send(Err(e.into()));
            return;
        }
    };
    runtime.block_on(async move {
        let api = match KubeApi::from_kubeconfig(&state.upstream).await {
            Ok(api) => api,
            Err(e) => {
                let _ = ready.send(Err(e));
                return;
            }
        };
        let mut tasks = tokio::task::JoinSet::new();
        for listener in listeners {
            match TcpListener::from_std(listener) {
                Ok(listener) => {
                    tasks.spawn(accept_loop(state.clone(), api.clone(), listener));
                }
                Err(e) => {
                    let _ = ready.send(Err(e.into()));
                    return;
                }
            }
        }
        let _ = ready.send(Ok(()));
        let _ = stopped.await;
        tasks.abort_all();
    });
}

async fn accept_loop(state: Arc<State>, api: KubeApi, listener: TcpListener) {
    let mut conns = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                if state.down() {
                    drop(stream);
                    continue;
                }
                conns.spawn(connection(state.clone(), api.clone(), stream));
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

/// Serves one client connection until it ends or an outage drops it.
async fn connection(state: Arc<State>, api: KubeApi, stream: tokio::net::TcpStream) {
    let mut cut = state.cut_all.subscribe();
    let service_state = state.clone();
    let service = hyper::service::service_fn(move |req| {
        let state = service_state.clone();
        let api = api.clone();
        async move { Ok::<_, Infallible>(handle(state, api, req).await) }
    });
    let conn =
        hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service);
    tokio::select! {
        _ = conn => {}
        _ = cut.changed() => {}
    }
}

fn error_body(status: u16, message: &str) -> Body {
    let reason = match status {
        429 => "TooManyRequests",
        503 => "ServiceUnavailable",
        _ => "InternalError",
    };
    let status_json = serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message, "reason": reason, "code": status,
    });
    Full::new(Bytes::from(status_json.to_string()))
        .map_err(|never: Infallible| match never {})
        .boxed_unsync()
}

async fn handle(state: Arc<State>, api: KubeApi, req: Request<Incoming>) -> Response<Body> {
    // Subscribed on arrival: a cut while the request is on its way to the API server still ends
    // the watch it becomes (a receiver subscribed later would not see that cut).
    let cuts = Cuts {
        watches: state.cut_watches.subscribe(),
        all: state.cut_all.subscribe(),
    };
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let query = req.uri().query().unwrap_or_default().to_owned();
    let stall = *lock(&state.stall_until);
    if let Some(until) = stall {
        tokio::time::sleep_until(until.into()).await;
    }
    if let Some(fault) = state.injected(&method, &path, &query) {
        state.record(&method, &path, &query, fault.status);
        let mut reply = Response::new(error_body(fault.status, "injected by the fault proxy"));
        *reply.status_mut() =
            StatusCode::from_u16(fault.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        reply.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if let Some(seconds) = fault.retry_after {
            reply
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        return reply;
    }
    match forward(&api, req).await {
        Ok(reply) => {
            state.record(&method, &path, &query, reply.status().as_u16());
            if is_watch(&query) && reply.status().is_success() {
                return watched(&state, reply, format!("{path}?{query}"), cuts);
            }
            reply.map(|b| {
                b.map_err(|e| io::Error::other(e.to_string()))
                    .boxed_unsync()
            })
        }
        Err(e) => {
            state.record(&method, &path, &query, 502);
            let mut reply = Response::new(error_body(502, &format!("fault proxy: {e}")));
            *reply.status_mut() = StatusCode::BAD_GATEWAY;
            reply
        }
    }
}

/// Sends the request on to the API server with the admin credentials.
async fn forward(
    api: &KubeApi,
    req: Request<Incoming>,
) -> anyhow::Result<Response<kube::client::Body>> {
    let (parts, body) = req.into_parts();
    let body = body.collect().await?.to_bytes();
    let mut out = Request::builder()
        .method(parts.method)
        .uri(parts.uri.path_and_query().map_or("/", |p| p.as_str()));
    for (name, value) in &parts.headers {
        let skip = [
            header::HOST,
            header::CONNECTION,
            header::AUTHORIZATION,
            header::ACCEPT_ENCODING,
            header::CONTENT_LENGTH,
        ];
        if !skip.contains(name) {
            out = out.header(name, value);
        }
    }
    let reply = api
        .client()
        .send(out.body(kube::client::Body::from(body))?)
        .await?;
    let (mut parts, body) = reply.into_parts();
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.remove(header::TRANSFER_ENCODING);
    parts.headers.remove(header::CONNECTION);
    Ok(Response::from_parts(parts, body))
}

/// The cuts a request is subject to, subscribed when it arrived.
struct Cuts {
    watches: watch::Receiver<u64>,
    all: watch::Receiver<u64>,
}

/// Streams a watch through, counting it as open, until it ends or is cut (also by a cut made
/// after the request arrived and before the API server answered it).
fn watched(
    state: &Arc<State>,
    reply: Response<kube::client::Body>,
    path: String,
    cuts: Cuts,
) -> Response<Body> {
    let id = {
        let mut next = lock(&state.next_watch);
        *next += 1;
        *next
    };
    lock(&state.watches).push((id, path));
    let (tx, rx) = mpsc::channel::<Result<Frame<Bytes>, io::Error>>(16);
    let (parts, mut body) = reply.into_parts();
    let Cuts {
        watches: mut cut,
        all: mut cut_all,
    } = cuts;
    let state = state.clone();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                frame = body.frame() => match frame {
                    Some(Ok(frame)) => {
                        if tx.send(Ok(frame)).await.is_err() { break; }
                    }
                    Some(Err(e)) => {
                        let _ = tx.send(Err(io::Error::other(e.to_string()))).await;
                        break;
                    }
                    None => break,
                },
                _ = cut.changed() => {
                    let _ = tx.send(Err(io::Error::other("watch cut by the fault proxy"))).await;
                    break;
                }
                _ = cut_all.changed() => break,
                _ = tx.closed() => break,
            }
        }
        lock(&state.watches).retain(|(i, _)| *i != id);
    });
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    Response::from_parts(parts, StreamBody::new(stream).boxed_unsync())
}
