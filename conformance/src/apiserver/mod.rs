//! A test Kubernetes API server: real HTTP/1.1 on a loopback address (IPv4 or IPv6), faithful
//! enough that the unmodified kube 5 client and kube-runtime watcher cannot tell it from the
//! real one (see `shared/kube-api-notes.md` for what they rely on). It stays for what the real
//! kube-apiserver cannot do: store EndpointSlices its validation refuses (loopback, link-local,
//! unspecified addresses), and its own protocol tests (the chart's Helm install test runs on the
//! real control plane now; `duet-apiserver` stays for trying duet by hand). Faults on the
//! real control plane are the fault proxy's (`conformance::cluster::faults`).
//!
//! # Using it from a test
//!
//! ```no_run
//! # async fn t() -> anyhow::Result<()> {
//! use conformance::apiserver::ApiServer;
//! use serde_json::json;
//! // 127.0.0.1 or ::1, an ephemeral port; must be called inside a Tokio runtime.
//! let api = ApiServer::start("::1".parse()?)?;
//! // A kubeconfig whose server is `http://[::1]:PORT`: pass it to `duet --kubeconfig`, or load
//! // it with `kube::config::Kubeconfig::read_from(api.kubeconfig())`.
//! let _path = api.kubeconfig();
//! // Objects as JSON; `apply` creates or replaces (and creates the namespace when missing).
//! api.apply(json!({"apiVersion": "v1", "kind": "Service",
//!     "metadata": {"name": "echo", "namespace": "demo"}, "spec": {"ports": [{"port": 80}]}}))?;
//! let svc = api.get("v1", "Service", Some("demo"), "echo").expect("stored");
//! assert_eq!(svc["metadata"]["resourceVersion"], "6");
//! // Several changes no client can observe in between, e.g. a delete hidden by compaction:
//! api.with_store(|s| {
//!     s.drop_watches();
//!     s.delete_object("v1", "Service", Some("demo"), "echo").unwrap();
//!     s.expire_history();
//! });
//! # Ok(()) }
//! ```
//!
//! # What is modelled
//!
//! - Discovery: `/api`, `/apis`, `/api/v1`, `/apis/{group}`, `/apis/{group}/{version}`,
//!   aggregated discovery (`apidiscovery.k8s.io/v2`, by `Accept` header), `/version`,
//!   `/healthz`. No OpenAPI documents and no protobuf.
//! - One global resourceVersion; objects are stored as JSON per registered [`Resource`] (the
//!   defaults cover what duet uses and what an ingress-controller Helm chart installs;
//!   [`ApiServer::register`] adds more). The two `Event` APIs (`v1` and `events.k8s.io/v1`) are
//!   separate stores (no conversion).
//! - LIST with label selectors (`=`, `==`, `!=`, `k`, `!k`, `in`, `notin`), field selectors
//!   (`metadata.name`, `metadata.namespace`, per-kind fields such as a Secret's `type`; anything
//!   else is 400), `limit`/`continue` (later pages are read from the current state; a token
//!   older than the history is HTTP 410).
//! - WATCH with `resourceVersion` (history replay; older than the history = HTTP 200 with one
//!   `ERROR` event carrying a 410 `Expired` Status), `resourceVersion=0`/unset and
//!   `sendInitialEvents=true` (ADDED for every object, then a BOOKMARK annotated
//!   `k8s.io/initial-events-end`), `allowWatchBookmarks` (a BOOKMARK every
//!   [`Options::bookmark_interval`]), `timeoutSeconds` (capped by
//!   [`Options::max_watch_timeout`]). A change that moves an object into or out of a watch's
//!   selector is sent as ADDED or DELETED.
//! - Metadata-only reads (`Accept: ...;as=PartialObjectMetadata[List]`, kube's
//!   `Api<PartialObjectMeta<K>>`): GET, LIST and WATCH answer `meta.k8s.io/v1` partial objects.
//! - POST (201, uid, creationTimestamp, generation, `generateName`, 409 `AlreadyExists`, 404 for
//!   a missing namespace), GET, PUT (409 `Conflict` on a stale resourceVersion; `.status` kept
//!   on the main resource, only `.status` taken on `/status`; `generation` bumped on spec
//!   changes; a no-op write gets no new resourceVersion), PATCH (merge, strategic merge treated
//!   as merge, server-side apply treated as merge that may create; managedFields and list-map
//!   merging are not modelled), DELETE (finalizers honoured, preconditions checked; a Namespace
//!   takes its objects with it at once, without a Terminating phase), DELETE on a collection.
//!   `dryRun=All` runs the write on a throwaway copy (answered, not stored, no event).
//!
//! # Test controls
//!
//! Through the handle, or over HTTP on the same listener (for the `duet-apiserver` binary):
//!
//! | handle | HTTP | effect |
//! |---|---|---|
//! | [`ApiServer::drop_watches`] | `POST /_test/drop-watches` | every open watch response ends cleanly |
//! | [`ApiServer::expire_history`] | `POST /_test/expire[?drop=true]` | the next watch from an older RV gets the 410 ERROR event |
//! | [`ApiServer::requests`] | `GET /_test/requests` | what was asked and answered |
//! | [`ApiServer::apply_manifests`] | `POST /_test/apply` (YAML documents or JSON) | objects created or replaced, namespaces too |
//! | [`ApiServer::resource_version`] | `GET /_test/state` | latest and compacted resourceVersion, open watches |

pub mod registry;
pub mod selector;
mod serve;
pub mod store;

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use serde::Serialize;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};

pub use registry::Resource;
pub use store::{ApiError, Store};

use serve::Shared;

/// Tunables of a test API server.
#[derive(Clone, Debug)]
pub struct Options {
    /// How often a watch that allows bookmarks gets a BOOKMARK (default 1 s).
    pub bookmark_interval: Duration,
    /// Upper bound of a watch's `timeoutSeconds` (default none: the client's value, or 30 min).
    pub max_watch_timeout: Option<Duration>,
    /// Events kept for resuming watches; older ones are compacted (default 100 000).
    pub history_limit: usize,
    /// Creating a namespaced object needs its Namespace to exist, as in a real cluster (default
    /// true; [`ApiServer::apply`] creates missing namespaces either way).
    pub require_namespaces: bool,
    /// When set, requests must carry `Authorization: Bearer TOKEN` (the kubeconfig has it).
    pub token: Option<String>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            bookmark_interval: Duration::from_secs(1),
            max_watch_timeout: None,
            history_limit: 100_000,
            require_namespaces: true,
            token: None,
        }
    }
}

/// One request the server answered.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RequestRecord {
    /// HTTP method.
    pub method: String,
    /// Path, e.g. `/apis/networking.k8s.io/v1/ingresses`.
    pub path: String,
    /// Raw query string.
    pub query: String,
    /// Status code answered (a watch: 200 when it started).
    pub status: u16,
    /// The `User-Agent` header.
    #[serde(rename = "userAgent")]
    pub user_agent: String,
    /// The `Content-Type` header.
    #[serde(rename = "contentType")]
    pub content_type: String,
}

impl RequestRecord {
    /// Whether this was a watch request.
    pub fn is_watch(&self) -> bool {
        self.method == "GET"
            && self
                .query
                .split('&')
                .any(|p| p == "watch=true" || p == "watch=1")
    }
}

/// A running test API server; it stops when dropped.
#[derive(Debug)]
pub struct ApiServer {
    shared: Arc<Shared>,
    addr: SocketAddr,
    kubeconfig: PathBuf,
    _dir: tempfile::TempDir,
    accept: Mutex<Option<JoinHandle<()>>>,
}

impl ApiServer {
    /// Starts a server with default [`Options`] on an ephemeral port of `ip` (use a loopback
    /// address: 127.0.0.1 or ::1). Must be called inside a Tokio runtime.
    pub fn start(ip: IpAddr) -> io::Result<ApiServer> {
        ApiServer::start_with(SocketAddr::new(ip, 0), Options::default())
    }

    /// Starts a server on `addr` (port 0 for an ephemeral one) with `options`.
    pub fn start_with(addr: SocketAddr, options: Options) -> io::Result<ApiServer> {
        let listener = bind(addr)?;
        let addr = listener.local_addr()?;
        let store = Store::new(options.history_limit, options.require_namespaces);
        let shared = Arc::new(Shared {
            store: Mutex::new(store),
            options,
            requests: Mutex::new(Vec::new()),
            addr,
        });
        let dir = tempfile::tempdir()?;
        let kubeconfig = dir.path().join("kubeconfig");
        write_kubeconfig(&kubeconfig, addr, shared.options.token.as_deref())?;
        let accept = Mutex::new(Some(tokio::spawn(accept_loop(listener, shared.clone()))));
        tracing::debug!(listen.addr = %addr, "Test API server listening");
        Ok(ApiServer {
            shared,
            addr,
            kubeconfig,
            _dir: dir,
            accept,
        })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT` or `http://[::1]:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A kubeconfig file pointing at this server (context `duet-test`, namespace `default`),
    /// removed when the server is dropped.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// Runs `f` with the store locked: several changes no client can observe apart.
    pub fn with_store<R>(&self, f: impl FnOnce(&mut Store) -> R) -> R {
        f(&mut self.shared.store())
    }

    /// Registers another resource, e.g. a custom resource definition's kind.
    pub fn register(&self, resource: Resource) {
        self.with_store(|s| s.register(resource));
    }

    /// Creates an object (its `apiVersion`/`kind` pick the resource), as a POST would.
    pub fn create(&self, obj: Value) -> Result<Value, ApiError> {
        self.with_store(|s| s.create(obj))
    }

    /// Creates or unconditionally replaces an object, including its `status`, creating its
    /// namespace when missing.
    pub fn apply(&self, obj: Value) -> Result<Value, ApiError> {
        self.with_store(|s| s.apply(obj))
    }

    /// Applies every object of YAML documents or JSON (an object, an array, or a `List`), as
    /// [`ApiServer::apply`] does, all under one lock.
    pub fn apply_manifests(&self, text: &str) -> Result<Vec<Value>, ApiError> {
        let objects = serve::objects_of(text.as_bytes()).map_err(ApiError::BadRequest)?;
        self.with_store(|s| objects.into_iter().map(|o| s.apply(o)).collect())
    }

    /// One stored object.
    pub fn get(
        &self,
        api_version: &str,
        kind: &str,
        ns: Option<&str>,
        name: &str,
    ) -> Option<Value> {
        self.with_store(|s| s.get_object(api_version, kind, ns, name))
    }

    /// Every stored object of a kind.
    pub fn list(&self, api_version: &str, kind: &str) -> Vec<Value> {
        self.with_store(|s| s.list_objects(api_version, kind))
    }

    /// Deletes an object (finalizers honoured), as a DELETE would.
    pub fn delete(
        &self,
        api_version: &str,
        kind: &str,
        ns: Option<&str>,
        name: &str,
    ) -> Result<Value, ApiError> {
        self.with_store(|s| s.delete_object(api_version, kind, ns, name))
    }

    /// The latest resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.with_store(|s| s.resource_version())
    }

    /// Ends every open watch response; clients resume from their last resourceVersion.
    pub fn drop_watches(&self) {
        self.with_store(Store::drop_watches);
    }

    /// Forgets the event history: the next watch from an older resourceVersion gets the 410
    /// ERROR event and the client relists. Open watches keep streaming.
    pub fn expire_history(&self) {
        self.with_store(Store::expire_history);
    }

    /// Open watches on resources with this plural (`None`: all).
    pub fn open_watches(&self, plural: Option<&str>) -> usize {
        self.with_store(|s| s.open_watches(plural))
    }

    /// Waits until at least `n` watches are open on `plural`; false on timeout.
    pub async fn wait_for_watches(
        &self,
        plural: Option<&str>,
        n: usize,
        timeout: Duration,
    ) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if self.open_watches(plural) >= n {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Every request answered so far (at most 10 000 are kept).
    pub fn requests(&self) -> Vec<RequestRecord> {
        self.shared
            .requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Forgets the recorded requests.
    pub fn clear_requests(&self) {
        self.shared
            .requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        stop(&self.accept, &self.shared);
    }
}

fn stop(accept: &Mutex<Option<JoinHandle<()>>>, shared: &Shared) {
    if let Some(task) = accept.lock().unwrap_or_else(|e| e.into_inner()).take() {
        task.abort();
    }
    shared.store().drop_watches();
}

fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
    let std = crate::echo::bind(addr)
        .map_err(|e| io::Error::new(e.kind(), format!("cannot listen on {addr}: {e}")))?;
    TcpListener::from_std(std)
}

/// Accepts connections until aborted; aborting it drops (and so aborts) every connection.
async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let shared = shared.clone();
                    conns.spawn(async move {
                        let service = service_fn(move |req| serve::handle(shared.clone(), req));
                        let conn = hyper::server::conn::http1::Builder::new()
                            .timer(TokioTimer::new())
                            .serve_connection(TokioIo::new(stream), service);
                        if let Err(e) = conn.await {
                            tracing::trace!(client.addr = %peer, error = %e, "Connection ended");
                        }
                    });
                }
                Err(e) => {
                    tracing::debug!(error = %e, "Accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

/// Writes a kubeconfig for a server at `addr` (IPv6 bracketed), with a bearer token.
pub fn write_kubeconfig(path: &Path, addr: SocketAddr, token: Option<&str>) -> io::Result<()> {
    let token = token.unwrap_or("duet-test");
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: duet-test\n  cluster:\n    server: http://{addr}\ncontexts:\n- name: duet-test\n  context:\n    cluster: duet-test\n    user: duet-test\n    namespace: default\ncurrent-context: duet-test\nusers:\n- name: duet-test\n  user:\n    token: {token}\npreferences: {{}}\n"
    );
    std::fs::write(path, text)
}
