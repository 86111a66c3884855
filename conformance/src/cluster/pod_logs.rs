//! The stand-in kubelet's log endpoint: what `kubectl logs` (and the Gateway API suite's mirror
//! tests, which read the mirror backend's `echo-basic` log) reach through the API server. The
//! API server proxies `pods/log` to `https://NODE_IP:KUBELET_PORT/containerLogs/NS/POD/CONTAINER`
//! (the Node's `daemonEndpoints`, over its `InternalIP`; with no kubelet CA given it does not
//! verify the certificate, a self-signed one here). The answer is the whole log of the pod's
//! `echo-basic` program (`sinceTime` and the other options are not applied: the suite's readers
//! look for lines naming a unique request id); a pod without such a log (an in-process echo
//! server) has an empty one.

use std::convert::Infallible;
use std::net::{Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;

/// The port the Node's `daemonEndpoints.kubeletEndpoint` names.
pub const KUBELET_PORT: u16 = 10250;

/// Serves pod logs from `dir/pods/NS_POD/echo-basic.log` on every address of the current network
/// namespace, port [`KUBELET_PORT`], until the task is dropped.
pub(super) async fn serve(dir: PathBuf) -> anyhow::Result<()> {
    let names = [super::NODE_IP_V4, super::NODE_IP_V6, super::NODE_NAME];
    let cert = crate::tls::cert(&names);
    let acceptor = tokio_rustls::TlsAcceptor::from(crate::tls::server_config(&cert, &["http/1.1"]));
    let socket = socket2::Socket::new(
        socket2::Domain::IPV6,
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )?;
    socket.set_only_v6(false)?;
    socket.set_reuse_address(true)?;
    socket.set_nonblocking(true)?;
    let addr = SocketAddr::from((Ipv6Addr::UNSPECIFIED, KUBELET_PORT));
    socket.bind(&addr.into())?;
    socket.listen(64)?;
    let listener = tokio::net::TcpListener::from_std(socket.into())?;
    let dir = Arc::new(dir);
    loop {
        let (tcp, _) = listener.accept().await?;
        let (acceptor, dir) = (acceptor.clone(), dir.clone());
        tokio::spawn(async move {
            let Ok(tls) = acceptor.accept(tcp).await else {
                return;
            };
            let service = hyper::service::service_fn(move |req| {
                let dir = dir.clone();
                async move { Ok::<_, Infallible>(answer(&dir, &req)) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tls), service)
                .await;
        });
    }
}

/// The answer to one request: the log of `/containerLogs/NS/POD/CONTAINER`, else 404.
fn answer(dir: &std::path::Path, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    let parts: Vec<&str> = req.uri().path().split('/').collect();
    let log = match parts.as_slice() {
        ["", "containerLogs", ns, pod, _container] if safe(ns) && safe(pod) => {
            let file = dir.join("pods").join(format!("{ns}_{pod}/echo-basic.log"));
            std::fs::read(file).unwrap_or_default()
        }
        _ => {
            let mut res = Response::new(Full::new(Bytes::from_static(b"not found\n")));
            *res.status_mut() = StatusCode::NOT_FOUND;
            return res;
        }
    };
    let mut res = Response::new(Full::new(Bytes::from(log)));
    res.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain"),
    );
    res
}

/// A namespace or pod name: DNS label characters only (no path of another folder).
fn safe(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
        && !name.starts_with('.')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_stay_in_the_pods_folder() {
        assert!(safe("gateway-conformance-infra") && safe("infra-backend-v2-abc.1"));
        assert!(!safe("..") && !safe("a/b") && !safe("") && !safe(".x"));
    }
}
