//! The HTTP face of the test API server: path routing, discovery documents, LIST/WATCH/CRUD
//! handlers, the streaming watch body and the `/_test/` control endpoints.

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::selector::{FieldSelector, LabelSelector};
use super::store::{status_json, ApiError, Event, Filter, Opened, PatchKind, Store, WatchStart};
use super::{Options, RequestRecord};

/// A response body: a whole JSON document or a watch stream.
pub(crate) type Body = UnsyncBoxBody<Bytes, io::Error>;

/// State shared by the listener, every connection and the test handle.
#[derive(Debug)]
pub(crate) struct Shared {
    pub store: Mutex<Store>,
    pub options: Options,
    pub requests: Mutex<Vec<RequestRecord>>,
    pub addr: SocketAddr,
}

const MAX_RECORDS: usize = 10_000;

impl Shared {
    pub fn store(&self) -> MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn full(status: StatusCode, content_type: &'static str, body: impl Into<Bytes>) -> Response<Body> {
    let mut resp = Response::new(
        Full::new(body.into())
            .map_err(|never: Infallible| match never {})
            .boxed_unsync(),
    );
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp
}

fn json_response(status: StatusCode, value: &Value) -> Response<Body> {
    full(
        status,
        "application/json",
        serde_json::to_vec(value).unwrap_or_default(),
    )
}

fn error_response(err: &ApiError) -> Response<Body> {
    json_response(
        StatusCode::from_u16(err.code()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        &err.status(),
    )
}

/// Serves one request.
pub(crate) async fn handle(
    shared: Arc<Shared>,
    req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let query = req.uri().query().unwrap_or("").to_owned();
    let header = |name: header::HeaderName| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned()
    };
    let user_agent = header(header::USER_AGENT);
    let content_type = header(header::CONTENT_TYPE);
    let authorization = header(header::AUTHORIZATION);
    let accept = header(header::ACCEPT);
    let resp = if let Some(control) = path.strip_prefix("/_test/") {
        let body = match req.into_body().collect().await {
            Ok(body) => body.to_bytes(),
            Err(_) => Bytes::new(),
        };
        control_endpoint(&shared, &method, control, &query, &body)
    } else if shared
        .options
        .token
        .as_ref()
        .is_some_and(|t| authorization != format!("Bearer {t}"))
    {
        json_response(
            StatusCode::UNAUTHORIZED,
            &status_json(401, "Unauthorized", "Unauthorized"),
        )
    } else {
        match route(&shared, req, &method, &path, &query, &content_type, &accept).await {
            Ok(resp) => resp,
            Err(err) => error_response(&err),
        }
    };
    tracing::trace!(http.method = %method, http.path = %path, http.query = %query, http.status = resp.status().as_u16(), "Served");
    let mut records = shared.requests.lock().unwrap_or_else(|e| e.into_inner());
    if records.len() < MAX_RECORDS {
        records.push(RequestRecord {
            method: method.to_string(),
            path,
            query,
            status: resp.status().as_u16(),
            user_agent,
            content_type,
        });
    }
    Ok(resp)
}

/// The decoded query parameters.
struct Query(Vec<(String, String)>);

impl Query {
    fn parse(q: &str) -> Query {
        Query(
            q.split('&')
                .filter(|p| !p.is_empty())
                .map(|p| {
                    let (k, v) = p.split_once('=').unwrap_or((p, ""));
                    (decode(k), decode(v))
                })
                .collect(),
        )
    }

    fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    fn flag(&self, key: &str) -> bool {
        matches!(self.get(key), Some("true" | "1"))
    }
}

/// Percent-decoding of a query component (`+` is a space, as form encoding writes it).
fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = |c: u8| (c as char).to_digit(16);
                match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                    (Some(h), Some(l)) => {
                        out.push((h * 16 + l) as u8);
                        i += 2;
                    }
                    _ => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

async fn route(
    shared: &Arc<Shared>,
    req: Request<Incoming>,
    method: &Method,
    path: &str,
    query: &str,
    content_type: &str,
    accept: &str,
) -> Result<Response<Body>, ApiError> {
    let aggregated = accept.contains("as=APIGroupDiscoveryList");
    // kube's `Api<PartialObjectMeta<K>>` and client-go's metadata client ask for metadata only.
    let partial = accept.contains("as=PartialObjectMetadata");
    let segs: Vec<&str> = path
        .trim_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    let get_only = |v: Value| -> Result<Response<Body>, ApiError> {
        if method != Method::GET {
            return Err(ApiError::MethodNotAllowed(format!(
                "{method} is not allowed on {path}"
            )));
        }
        Ok(json_response(StatusCode::OK, &v))
    };
    match segs.as_slice() {
        ["version"] => get_only(json!({
            "major": "1", "minor": "37", "gitVersion": "v1.37.0-duet-test", "gitCommit": "",
            "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.25",
            "compiler": "gc", "platform": "linux/amd64"
        })),
        ["healthz" | "readyz" | "livez"] => Ok(full(StatusCode::OK, "text/plain", "ok")),
        ["api"] if aggregated => Ok(aggregated_discovery(&shared.store(), true)),
        ["apis"] if aggregated => Ok(aggregated_discovery(&shared.store(), false)),
        ["api"] => get_only(json!({
            "kind": "APIVersions", "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": shared.addr.to_string()}]
        })),
        ["apis"] => get_only(group_list(&shared.store())),
        ["api", version] => resource_list(&shared.store(), "", version).and_then(get_only),
        ["apis", group] => {
            let groups = group_list(&shared.store());
            let found = groups["groups"]
                .as_array()
                .and_then(|gs| gs.iter().find(|g| g["name"] == *group).cloned())
                .ok_or_else(|| {
                    ApiError::NotFound("the server could not find the requested resource".into())
                })?;
            let mut found = found;
            found["kind"] = "APIGroup".into();
            found["apiVersion"] = "v1".into();
            get_only(found)
        }
        ["apis", group, version] => {
            resource_list(&shared.store(), group, version).and_then(get_only)
        }
        ["api", version, rest @ ..] => {
            resource(
                shared,
                req,
                method,
                "",
                version,
                rest,
                query,
                content_type,
                partial,
            )
            .await
        }
        ["apis", group, version, rest @ ..] => {
            resource(
                shared,
                req,
                method,
                group,
                version,
                rest,
                query,
                content_type,
                partial,
            )
            .await
        }
        _ => Err(ApiError::NotFound(
            "the server could not find the requested resource".into(),
        )),
    }
}

fn group_list(store: &Store) -> Value {
    let mut groups: Vec<(String, Vec<String>)> = Vec::new();
    for r in store.resources().iter().filter(|r| !r.group.is_empty()) {
        match groups.iter_mut().find(|(g, _)| *g == r.group) {
            Some((_, versions)) if !versions.contains(&r.version) => {
                versions.push(r.version.clone())
            }
            Some(_) => {}
            None => groups.push((r.group.clone(), vec![r.version.clone()])),
        }
    }
    let groups: Vec<Value> = groups
        .into_iter()
        .map(|(g, versions)| {
            let vs: Vec<Value> = versions
                .iter()
                .map(|v| json!({"groupVersion": format!("{g}/{v}"), "version": v}))
                .collect();
            json!({"name": g, "versions": vs, "preferredVersion": vs[0]})
        })
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

const AGGREGATED: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";

/// Aggregated discovery (`apidiscovery.k8s.io/v2`) of the core group or of every named group.
fn aggregated_discovery(store: &Store, core: bool) -> Response<Body> {
    /// Group name, then each version with its resources.
    type Groups = Vec<(String, Vec<(String, Vec<Value>)>)>;
    let mut groups: Groups = Vec::new();
    for r in store
        .resources()
        .iter()
        .filter(|r| r.group.is_empty() == core)
    {
        let gvk = json!({"group": r.group, "version": r.version, "kind": r.kind});
        let mut resource = json!({
            "resource": r.plural, "responseKind": gvk, "singularResource": r.kind.to_lowercase(),
            "scope": if r.namespaced { "Namespaced" } else { "Cluster" },
            "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"],
        });
        if r.status {
            resource["subresources"] = json!([{"subresource": "status", "responseKind": gvk, "verbs": ["get", "patch", "update"]}]);
        }
        let group = match groups.iter_mut().find(|(g, _)| *g == r.group) {
            Some(group) => group,
            None => {
                groups.push((r.group.clone(), Vec::new()));
                groups.last_mut().expect("just pushed")
            }
        };
        match group.1.iter_mut().find(|(v, _)| *v == r.version) {
            Some((_, resources)) => resources.push(resource),
            None => group.1.push((r.version.clone(), vec![resource])),
        }
    }
    let items: Vec<Value> = groups
        .into_iter()
        .map(|(g, versions)| {
            let versions: Vec<Value> = versions
                .into_iter()
                .map(|(v, resources)| json!({"version": v, "resources": resources, "freshness": "Current"}))
                .collect();
            json!({"metadata": {"name": g}, "versions": versions})
        })
        .collect();
    let list = json!({"kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2", "metadata": {}, "items": items});
    let mut resp = json_response(StatusCode::OK, &list);
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(AGGREGATED));
    resp
}

fn resource_list(store: &Store, group: &str, version: &str) -> Result<Value, ApiError> {
    let mut resources = Vec::new();
    for r in store
        .resources()
        .iter()
        .filter(|r| r.group == group && r.version == version)
    {
        resources.push(json!({
            "name": r.plural, "singularName": r.kind.to_lowercase(), "namespaced": r.namespaced, "kind": r.kind,
            "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"],
        }));
        if r.status {
            resources.push(json!({
                "name": format!("{}/status", r.plural), "singularName": "", "namespaced": r.namespaced,
                "kind": r.kind, "verbs": ["get", "patch", "update"],
            }));
        }
    }
    if resources.is_empty() {
        return Err(ApiError::NotFound(
            "the server could not find the requested resource".into(),
        ));
    }
    let group_version = if group.is_empty() {
        version.to_owned()
    } else {
        format!("{group}/{version}")
    };
    Ok(
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": resources}),
    )
}

/// A resource request's target.
struct Target {
    res: usize,
    ns: Option<String>,
    name: Option<String>,
    status: bool,
}

fn parse_target(
    store: &Store,
    group: &str,
    version: &str,
    rest: &[&str],
) -> Result<Target, ApiError> {
    let missing = || ApiError::NotFound("the server could not find the requested resource".into());
    let (ns, rest) = if rest.len() >= 3
        && rest[0] == "namespaces"
        && !matches!(rest[2], "status" | "finalize")
    {
        (Some(rest[1].to_owned()), &rest[2..])
    } else {
        (None, rest)
    };
    let plural = rest.first().ok_or_else(missing)?;
    let res = store.by_path(group, version, plural).ok_or_else(missing)?;
    let r = &store.resources()[res];
    let name = rest.get(1).map(|s| (*s).to_owned());
    let status = match rest.get(2) {
        None => false,
        Some(&"status") if r.status => true,
        Some(_) => return Err(missing()),
    };
    if rest.len() > 3
        || (ns.is_some() && !r.namespaced)
        || (r.namespaced && ns.is_none() && name.is_some())
    {
        return Err(missing());
    }
    Ok(Target {
        res,
        ns,
        name,
        status,
    })
}

#[allow(clippy::too_many_arguments)]
async fn resource(
    shared: &Arc<Shared>,
    req: Request<Incoming>,
    method: &Method,
    group: &str,
    version: &str,
    rest: &[&str],
    query: &str,
    content_type: &str,
    partial: bool,
) -> Result<Response<Body>, ApiError> {
    let target = parse_target(&shared.store(), group, version, rest)?;
    let q = Query::parse(query);
    let body = if matches!(
        *method,
        Method::POST | Method::PUT | Method::PATCH | Method::DELETE
    ) {
        req.into_body()
            .collect()
            .await
            .map_err(|e| ApiError::BadRequest(format!("cannot read the body: {e}")))?
            .to_bytes()
    } else {
        Bytes::new()
    };
    let json_body = || -> Result<Value, ApiError> {
        serde_json::from_slice(&body)
            .map_err(|e| ApiError::BadRequest(format!("the body is not valid JSON: {e}")))
    };
    let ns = target.ns.as_deref();
    // `dryRun=All`: the write runs against a throwaway copy of the store.
    // (DeleteOptions carry it in the body, as a list.)
    let dry_run = q.get("dryRun") == Some("All")
        || (*method == Method::DELETE
            && serde_json::from_slice::<Value>(&body)
                .ok()
                .and_then(|o| o.get("dryRun").and_then(Value::as_array).cloned())
                .is_some_and(|modes| modes.iter().any(|m| m == "All")));
    let write = |f: &mut dyn FnMut(&mut Store) -> Result<Value, ApiError>| {
        let mut store = shared.store();
        if dry_run {
            f(&mut store.scratch())
        } else {
            f(&mut store)
        }
    };
    match (method.clone(), target.name.as_deref()) {
        (Method::GET, None) if q.flag("watch") => watch(shared, &target, &q, partial),
        (Method::GET, None) => {
            list(shared, &target, &q, partial).map(|v| json_response(StatusCode::OK, &v))
        }
        (Method::GET, Some(name)) => shared
            .store()
            .get(target.res, ns, name)
            .map(|v| json_response(StatusCode::OK, &if partial { metadata_only(&v) } else { v })),
        (Method::POST, None) => {
            let mut obj = Some(json_body()?);
            write(&mut |s| s.create_in(target.res, ns, obj.take().unwrap_or_default()))
                .map(|v| json_response(StatusCode::CREATED, &v))
        }
        (Method::PUT, Some(name)) => {
            let mut obj = Some(json_body()?);
            write(&mut |s| {
                s.update(
                    target.res,
                    ns,
                    name,
                    obj.take().unwrap_or_default(),
                    target.status,
                )
            })
            .map(|v| json_response(StatusCode::OK, &v))
        }
        (Method::PATCH, Some(name)) => {
            let mime = content_type.split(';').next().unwrap_or("").trim();
            let (kind, patch) = match mime {
                "application/merge-patch+json" => (PatchKind::Merge, json_body()?),
                "application/strategic-merge-patch+json" => (PatchKind::Strategic, json_body()?),
                "application/apply-patch+yaml" => {
                    let patch = json_body().or_else(|_| {
                        serde_saphyr::from_slice::<Value>(&body)
                            .map_err(|e| ApiError::BadRequest(format!("the apply patch is neither JSON nor YAML: {e}")))
                    })?;
                    if q.get("fieldManager").is_none_or(str::is_empty) {
                        return Err(ApiError::BadRequest(
                            "PATCH requests with an apply patch require a fieldManager".into(),
                        ));
                    }
                    (PatchKind::Apply, patch)
                }
                other => {
                    return Err(ApiError::UnsupportedMediaType(format!(
                        "the body of the request was in an unknown format - accepted media types include: application/merge-patch+json, application/strategic-merge-patch+json, application/apply-patch+yaml (got {other:?})"
                    )))
                }
            };
            let existed = shared.store().get(target.res, ns, name).is_ok();
            let mut patch = Some(patch);
            let out = write(&mut |s| {
                let patch = patch.take().unwrap_or_default();
                s.patch(target.res, ns, name, kind, patch, target.status)
            })?;
            let code = if existed {
                StatusCode::OK
            } else {
                StatusCode::CREATED
            };
            Ok(json_response(code, &out))
        }
        (Method::DELETE, Some(name)) => {
            let options: Value = if body.is_empty() {
                json!({})
            } else {
                json_body()?
            };
            let precondition = |field: &str| {
                options
                    .pointer(&format!("/preconditions/{field}"))
                    .and_then(Value::as_str)
                    .map(str::to_owned)
            };
            let precondition = (precondition("uid"), precondition("resourceVersion"));
            write(&mut |s| s.delete(target.res, ns, name, precondition.clone()))
                .map(|v| json_response(StatusCode::OK, &v))
        }
        (Method::DELETE, None) => {
            let filter = filter_of(&shared.store(), &target, &q)?;
            let mut store = shared.store();
            let names: Vec<(String, String)> = store
                .list(target.res, &filter, None)
                .into_iter()
                .map(|(k, _)| k)
                .collect();
            let mut items = Vec::new();
            for (ns, name) in names {
                let ns = (!ns.is_empty()).then_some(ns);
                items.push(store.delete(target.res, ns.as_deref(), &name, (None, None))?);
            }
            let r = &store.resources()[target.res];
            let list = json!({
                "apiVersion": r.api_version(), "kind": format!("{}List", r.kind),
                "metadata": {"resourceVersion": store.resource_version().to_string()}, "items": items
            });
            Ok(json_response(StatusCode::OK, &list))
        }
        _ => Err(ApiError::MethodNotAllowed(format!(
            "{method} is not supported here"
        ))),
    }
}

fn filter_of(store: &Store, target: &Target, q: &Query) -> Result<Filter, ApiError> {
    let r = &store.resources()[target.res];
    Ok(Filter {
        namespace: target.ns.clone(),
        labels: LabelSelector::parse(q.get("labelSelector").unwrap_or(""))
            .map_err(ApiError::BadRequest)?,
        fields: FieldSelector::parse(q.get("fieldSelector").unwrap_or(""), r)
            .map_err(ApiError::BadRequest)?,
    })
}

/// The `meta.k8s.io/v1` `PartialObjectMetadata` of an object.
fn metadata_only(obj: &Value) -> Value {
    json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj["metadata"]})
}

fn list(shared: &Shared, target: &Target, q: &Query, partial: bool) -> Result<Value, ApiError> {
    let store = shared.store();
    let filter = filter_of(&store, target, q)?;
    let limit: usize = match q.get("limit") {
        None | Some("") => 0,
        Some(l) => l
            .parse()
            .map_err(|_| ApiError::BadRequest(format!("invalid limit {l:?}")))?,
    };
    // A continue token is "{rv}/{namespace}/{name}" of the last item served.
    let (list_rv, after) = match q.get("continue").filter(|c| !c.is_empty()) {
        None => (store.resource_version(), None),
        Some(token) => {
            let bad = || ApiError::BadRequest(format!("invalid continue token {token:?}"));
            let mut parts = token.splitn(3, '/');
            let rv: u64 = parts.next().and_then(|r| r.parse().ok()).ok_or_else(bad)?;
            let ns = parts.next().ok_or_else(bad)?.to_owned();
            let name = parts.next().ok_or_else(bad)?.to_owned();
            if rv < store.compacted() {
                return Err(ApiError::Expired(
                    "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.".into(),
                ));
            }
            (rv, Some((ns, name)))
        }
    };
    let mut items = store.list(target.res, &filter, after.as_ref());
    let mut metadata = json!({"resourceVersion": list_rv.to_string()});
    if limit > 0 && items.len() > limit {
        let remaining = items.len() - limit;
        items.truncate(limit);
        let (ns, name) = &items[limit - 1].0;
        metadata["continue"] = format!("{list_rv}/{ns}/{name}").into();
        metadata["remainingItemCount"] = remaining.into();
    }
    let r = &store.resources()[target.res];
    if partial {
        return Ok(json!({
            "apiVersion": "meta.k8s.io/v1",
            "kind": "PartialObjectMetadataList",
            "metadata": metadata,
            "items": items.iter().map(|(_, v)| metadata_only(v)).collect::<Vec<_>>(),
        }));
    }
    Ok(json!({
        "apiVersion": r.api_version(),
        "kind": format!("{}List", r.kind),
        "metadata": metadata,
        "items": items.into_iter().map(|(_, v)| v).collect::<Vec<_>>(),
    }))
}

fn watch(
    shared: &Arc<Shared>,
    target: &Target,
    q: &Query,
    partial: bool,
) -> Result<Response<Body>, ApiError> {
    let mut store = shared.store();
    let filter = filter_of(&store, target, q)?;
    let bookmarks = q.flag("allowWatchBookmarks");
    let initial_events = q.flag("sendInitialEvents");
    let start = match q.get("resourceVersion") {
        _ if initial_events => WatchStart::Current,
        None | Some("" | "0") => WatchStart::Current,
        Some(rv) => WatchStart::After(
            rv.parse()
                .map_err(|_| ApiError::BadRequest(format!("invalid resource version {rv:?}")))?,
        ),
    };
    let mut timeout = match q.get("timeoutSeconds") {
        None | Some("") => Duration::from_secs(1800),
        Some(t) => Duration::from_secs(
            t.parse()
                .map_err(|_| ApiError::BadRequest(format!("invalid timeoutSeconds {t:?}")))?,
        ),
    };
    if let Some(cap) = shared.options.max_watch_timeout {
        timeout = timeout.min(cap);
    }
    let r = store.resources()[target.res].clone();
    let opened = match store.watch(target.res, start) {
        Ok(opened) => opened,
        Err(err) => {
            drop(store);
            let line = watch_line("ERROR", &err.status());
            return Ok(full(StatusCode::OK, "application/json", line));
        }
    };
    drop(store);
    let (tx, rx) = mpsc::channel::<io::Result<Bytes>>(64);
    let spec = WatchSpec {
        filter,
        bookmarks,
        initial_events,
        timeout,
        api_version: if partial {
            "meta.k8s.io/v1".into()
        } else {
            r.api_version()
        },
        kind: if partial {
            "PartialObjectMetadata".into()
        } else {
            r.kind
        },
        partial,
    };
    tokio::spawn(run_watch(shared.clone(), spec, opened, tx));
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (b.map(Frame::data), rx))
    });
    let mut resp = Response::new(StreamBody::new(stream).boxed_unsync());
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Ok(resp)
}

fn watch_line(kind: &str, object: &Value) -> Bytes {
    let mut line = serde_json::to_vec(&json!({"type": kind, "object": object})).unwrap_or_default();
    line.push(b'\n');
    line.into()
}

struct WatchSpec {
    filter: Filter,
    bookmarks: bool,
    initial_events: bool,
    timeout: Duration,
    kind: String,
    api_version: String,
    partial: bool,
}

impl WatchSpec {
    fn bookmark(&self, rv: u64, initial_end: bool) -> Bytes {
        let mut metadata = json!({"resourceVersion": rv.to_string()});
        if initial_end {
            metadata["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        watch_line(
            "BOOKMARK",
            &json!({"kind": self.kind, "apiVersion": self.api_version, "metadata": metadata}),
        )
    }

    fn line(&self, ev: &Event) -> Option<Bytes> {
        self.filter.translate(ev).map(|(kind, obj)| {
            if self.partial {
                watch_line(kind, &metadata_only(obj))
            } else {
                watch_line(kind, obj)
            }
        })
    }
}

/// Feeds one watch response: backlog, the initial-events-end bookmark, then live events and
/// periodic bookmarks, until the timeout, the client leaving, or the server dropping watches.
async fn run_watch(
    shared: Arc<Shared>,
    spec: WatchSpec,
    opened: Opened,
    tx: mpsc::Sender<io::Result<Bytes>>,
) {
    let Opened {
        backlog,
        rv,
        mut live,
    } = opened;
    for ev in &backlog {
        if let Some(line) = spec.line(ev) {
            if tx.send(Ok(line)).await.is_err() {
                return;
            }
        }
    }
    if spec.initial_events && tx.send(Ok(spec.bookmark(rv, true))).await.is_err() {
        return;
    }
    let deadline = tokio::time::sleep(spec.timeout);
    tokio::pin!(deadline);
    let every = shared
        .options
        .bookmark_interval
        .max(Duration::from_millis(10));
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    loop {
        let lines: Vec<Bytes> = tokio::select! {
            _ = &mut deadline => break,
            _ = tx.closed() => break,
            ev = live.recv() => match ev {
                Some(ev) => spec.line(&ev).into_iter().collect(),
                None => break,
            },
            _ = tick.tick(), if spec.bookmarks => {
                let (pending, rv) = shared.store().drain(&mut live);
                let mut lines: Vec<Bytes> = pending.iter().filter_map(|ev| spec.line(ev)).collect();
                lines.push(spec.bookmark(rv, false));
                lines
            }
        };
        for line in lines {
            if tx.send(Ok(line)).await.is_err() {
                return;
            }
        }
    }
}

/// The objects of a `/_test/apply` body: JSON (an object, an array, or a `List`) or YAML (one
/// or more documents, each an object or a `List`).
pub(crate) fn objects_of(body: &[u8]) -> Result<Vec<Value>, String> {
    let docs: Vec<Value> = match serde_json::from_slice::<Value>(body) {
        Ok(Value::Array(items)) => items,
        Ok(v) => vec![v],
        Err(_) => {
            let text =
                std::str::from_utf8(body).map_err(|e| format!("the body is not UTF-8: {e}"))?;
            serde_saphyr::from_multiple::<Value>(text)
                .map_err(|e| format!("the body is neither JSON nor YAML: {e}"))?
        }
    };
    let mut out = Vec::new();
    for doc in docs {
        match doc {
            Value::Null => {}
            Value::Object(ref map)
                if map
                    .get("kind")
                    .and_then(Value::as_str)
                    .is_some_and(|k| k.ends_with("List")) =>
            {
                out.extend(
                    map.get("items")
                        .and_then(Value::as_array)
                        .cloned()
                        .unwrap_or_default(),
                );
            }
            Value::Object(_) => out.push(doc),
            other => return Err(format!("not an object: {other}")),
        }
    }
    Ok(out)
}

fn control_endpoint(
    shared: &Shared,
    method: &Method,
    what: &str,
    query: &str,
    body: &[u8],
) -> Response<Body> {
    let q = Query::parse(query);
    let ok = || json_response(StatusCode::OK, &json!({"ok": true}));
    let bad =
        |m: String| json_response(StatusCode::BAD_REQUEST, &status_json(400, "BadRequest", &m));
    match (method.clone(), what) {
        (Method::GET, "requests") => {
            let records = shared
                .requests
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone();
            json_response(
                StatusCode::OK,
                &serde_json::to_value(records).unwrap_or_default(),
            )
        }
        (Method::GET, "state") => {
            let mut store = shared.store();
            json_response(
                StatusCode::OK,
                &json!({"resourceVersion": store.resource_version(), "compacted": store.compacted(), "watches": store.open_watches(None)}),
            )
        }
        (Method::POST, "drop-watches") => {
            shared.store().drop_watches();
            ok()
        }
        (Method::POST, "expire") => {
            let mut store = shared.store();
            store.expire_history();
            if q.flag("drop") {
                store.drop_watches();
            }
            ok()
        }
        (Method::POST, "apply") => {
            let objects = match objects_of(body) {
                Ok(objects) => objects,
                Err(e) => return bad(e),
            };
            let mut store = shared.store();
            let mut applied = Vec::with_capacity(objects.len());
            for obj in objects {
                match store.apply(obj) {
                    Ok(obj) => applied.push(obj),
                    Err(e) => return error_response(&e),
                }
            }
            json_response(
                StatusCode::OK,
                &json!({"kind": "List", "apiVersion": "v1", "items": applied}),
            )
        }
        _ => json_response(
            StatusCode::NOT_FOUND,
            &status_json(404, "NotFound", "unknown control endpoint"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::decode;

    #[test]
    fn query_components_are_percent_decoded() {
        assert_eq!(decode("app%3Dweb%2Ctier+in+%28a%29"), "app=web,tier in (a)");
        assert_eq!(decode("100%"), "100%");
        assert_eq!(decode("%zz"), "%zz");
    }
}
