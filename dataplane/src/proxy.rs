//! The reverse proxy: route lookup, target pick by family, pooled HTTP/1.1 upstream connections,
//! forwarding headers, upgrades.

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http::Response;
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use hyper::Request;

use crate::listen::ConnInfo;
use crate::runtime::Runtime;

/// The body of a proxied response: the upstream's stream, or a short local answer.
pub type ProxyBody = Either<Incoming, Full<Bytes>>;

/// The proxy: shared by every listener.
#[derive(Debug)]
pub struct Proxy {
    runtime: Arc<Runtime>,
}

impl Proxy {
    /// A proxy over a runtime.
    pub fn new(runtime: Arc<Runtime>) -> Arc<Proxy> {
        Arc::new(Proxy { runtime })
    }

    /// Handles one client request.
    pub async fn handle(
        self: Arc<Self>,
        _req: Request<Incoming>,
        _conn: Arc<ConnInfo>,
    ) -> Result<Response<ProxyBody>, Infallible> {
        let _ = &self.runtime;
        let mut res = Response::new(Either::Right(Full::new(Bytes::from_static(b"not yet\n"))));
        *res.status_mut() = http::StatusCode::SERVICE_UNAVAILABLE;
        Ok(res)
    }
}
