//! Admin endpoints: `/healthz`, `/readyz` and `/metrics` (Prometheus) on the admin listener, where
//! the kubelet and Prometheus reach them; `/debug/routes` (the live table as JSON: pod addresses,
//! Secret names) only on the debug listener, loopback by default, whole or filtered to one
//! object's routes ([`filter`]).

pub mod filter;

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http::{header, Method, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::Request;

use crate::conn::ConnInfo;
use crate::runtime::Runtime;

/// Extra JSON that the controller adds to `/debug/routes` (diagnostics, warnings).
pub type DebugExtra = Arc<dyn Fn() -> serde_json::Value + Send + Sync>;

/// Answers one request on the admin listener: probes and metrics.
pub async fn handle(
    runtime: Arc<Runtime>,
    req: Request<Incoming>,
    _conn: Arc<ConnInfo>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    if let Some(refused) = refuse_method(&req) {
        return Ok(refused);
    }
    Ok(match req.uri().path() {
        "/healthz" => text(StatusCode::OK, "ok\n"),
        "/readyz" if runtime.is_ready() => text(StatusCode::OK, "ready\n"),
        "/readyz" => text(StatusCode::SERVICE_UNAVAILABLE, "not ready\n"),
        "/metrics" => metrics(&runtime, &req),
        _ => text(StatusCode::NOT_FOUND, "not found\n"),
    })
}

/// Answers one request on the debug listener: `/debug/routes`.
pub async fn debug(
    runtime: Arc<Runtime>,
    extra: Option<DebugExtra>,
    req: Request<Incoming>,
    _conn: Arc<ConnInfo>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    if let Some(refused) = refuse_method(&req) {
        return Ok(refused);
    }
    Ok(match req.uri().path() {
        "/debug/routes" => match filter::parse(req.uri().query()) {
            Ok(None) => routes(&runtime, extra),
            Ok(Some(f)) => filtered_routes(&runtime, extra, &f),
            Err(refused) => {
                let mut res = text(StatusCode::BAD_REQUEST, "");
                *res.body_mut() = Full::new(Bytes::from(format!("{refused}\n")));
                res
            }
        },
        _ => text(StatusCode::NOT_FOUND, "not found\n"),
    })
}

/// The whole live table, with the controller's extra (diagnostics, annotations, status).
fn routes(runtime: &Runtime, extra: Option<DebugExtra>) -> Response<Full<Bytes>> {
    let live = runtime.load_full();
    let mut doc = serde_json::json!({
        "ready": runtime.is_ready(),
        "snapshot": &*live.snapshot,
    });
    if let (Some(extra), Some(map)) = (extra, doc.as_object_mut()) {
        if let serde_json::Value::Object(more) = extra() {
            map.extend(more);
        }
    }
    json(&doc)
}

/// The routes one filter keeps, and the diagnostics of the filtered object.
fn filtered_routes(
    runtime: &Runtime,
    extra: Option<DebugExtra>,
    f: &filter::RouteFilter,
) -> Response<Full<Bytes>> {
    let live = runtime.load_full();
    let (key, value) = f.describe();
    let diagnostics: Vec<serde_json::Value> = match extra.map(|extra| extra()) {
        Some(serde_json::Value::Object(mut more)) => match more.remove("diagnostics") {
            Some(serde_json::Value::Array(all)) => {
                all.into_iter().filter(|d| names(f, d)).collect()
            }
            _ => Vec::new(),
        },
        _ => Vec::new(),
    };
    json(&serde_json::json!({
        "ready": runtime.is_ready(),
        "filter": { key: value },
        "snapshot": f.apply(&live.snapshot),
        "diagnostics": diagnostics,
    }))
}

/// Whether a diagnostic (`{"object": {"kind", "namespace", "name"}, ...}`) is of the filtered
/// object.
fn names(f: &filter::RouteFilter, diagnostic: &serde_json::Value) -> bool {
    let field = |k: &str| diagnostic["object"][k].as_str().unwrap_or_default();
    f.names(field("kind"), field("namespace"), field("name"))
}

fn json(doc: &serde_json::Value) -> Response<Full<Bytes>> {
    let body = serde_json::to_vec_pretty(doc).unwrap_or_default();
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::SERVER, "duet")
        .body(Full::new(Bytes::from(body)))
        .unwrap_or_default()
}

/// The 405 of a method other than GET and HEAD (both listeners answer only those).
fn refuse_method(req: &Request<Incoming>) -> Option<Response<Full<Bytes>>> {
    let allowed = req.method() == Method::GET || req.method() == Method::HEAD;
    (!allowed).then(|| text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n"))
}

/// The registry in the Prometheus text format (0.0.4), or in OpenMetrics when the scraper asks
/// for it (Prometheus does).
fn metrics(runtime: &Runtime, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    use prometheus_client::encoding::{prometheus_text, text};
    let openmetrics = req
        .headers()
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("application/openmetrics-text"));
    let registry = runtime.telemetry().registry();
    let mut body = String::with_capacity(16 * 1024);
    let (encoded, content_type) = if openmetrics {
        (
            text::encode(&mut body, registry),
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )
    } else {
        (
            prometheus_text::encode(&mut body, registry),
            prometheus_text::CONTENT_TYPE,
        )
    };
    if encoded.is_err() {
        return text(StatusCode::INTERNAL_SERVER_ERROR, "cannot encode metrics\n");
    }
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, content_type)
        .header(header::SERVER, "duet")
        .body(Full::new(Bytes::from(body)))
        .unwrap_or_default()
}

fn text(status: StatusCode, body: &'static str) -> Response<Full<Bytes>> {
    let mut res = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *res.status_mut() = status;
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    res.headers_mut()
        .insert(header::SERVER, header::HeaderValue::from_static("duet"));
    res
}
