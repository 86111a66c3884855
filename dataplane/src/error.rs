//! Why the proxy answers by itself: [`ProxyError`], each variant knowing its side, its status
//! and its short text.

use std::io;

use http::StatusCode;

use crate::host::HostError;
use crate::limits;
use crate::path::EncodedTraversal;
use crate::table::BackendId;

/// Why the proxy answered by itself; each variant knows its side and status.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// No host or path rule matched and there is no default backend (404).
    #[error("no route")]
    NoRoute,
    /// On a Gateway HTTPS port, the request's host selects another listener than the TLS
    /// server name did (421): the connection was made for that other listener.
    #[error("misdirected request")]
    Misdirected,
    /// The backend has no target that the family policy admits for this client (503).
    #[error("no ready target in {0}")]
    NoTarget(BackendId),
    /// The route's backend does not resolve (a Gateway API backendRef to a missing Service or
    /// of an unsupported kind; 500, as the Gateway API requires).
    #[error("backend does not resolve: {0}")]
    Unresolved(BackendId),
    /// Every connection attempt to the backend's targets failed (502).
    #[error("cannot connect to {backend}")]
    Connect {
        /// The backend.
        backend: BackendId,
        /// The last connect error.
        #[source]
        source: io::Error,
    },
    /// The request body is larger than the route allows (413): declared, or counted before any
    /// response.
    #[error("request body too large")]
    BodyTooLarge,
    /// The route's source ranges refuse the client's address (403).
    #[error("client address not allowed")]
    Forbidden,
    /// The route's source ranges do not parse, so it admits nobody (503).
    #[error("invalid source ranges")]
    InvalidSourceRanges,
    /// The upstream did not send a response head in time (504).
    #[error("upstream timed out")]
    Timeout,
    /// The upstream connection failed while the request was in flight (502).
    #[error("upstream failed")]
    Upstream(#[source] hyper::Error),
    /// duet's HTTP/1.1 client failed while the request was in flight, or the upstream's
    /// response head is invalid (502), as [`ProxyError::Upstream`].
    #[error("upstream failed")]
    Client(#[source] ClientError),
    /// The request's host is missing, repeated, contradictory or not a host (400).
    #[error("bad host: {0}")]
    Host(#[from] HostError),
    /// The path climbs through percent-encoded dots or slashes (400).
    #[error("bad path: {0}")]
    Path(#[from] EncodedTraversal),
    /// A `rewrite-target` made a request target that does not parse (500).
    #[error("rewritten request target does not parse")]
    BadRewrite,
    /// The upstream switched protocols (101) without a WebSocket upgrade asked for (502).
    #[error("upstream switched protocols unasked")]
    UnaskedUpgrade,
}

impl ProxyError {
    /// A failed upstream request whose body passed the limit as it streamed (no declared length)
    /// was aborted before any response: that is the client's 413, not a 502.
    pub(crate) fn body_limit_checked(self) -> ProxyError {
        match self {
            ProxyError::Upstream(e) if limits::body_too_large(&e) => ProxyError::BodyTooLarge,
            other => other,
        }
    }

    /// The status code the client sees.
    pub fn status(&self) -> StatusCode {
        match self {
            ProxyError::NoRoute => StatusCode::NOT_FOUND,
            ProxyError::Misdirected => StatusCode::MISDIRECTED_REQUEST,
            ProxyError::NoTarget(_) | ProxyError::InvalidSourceRanges => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            ProxyError::Forbidden => StatusCode::FORBIDDEN,
            ProxyError::Connect { .. }
            | ProxyError::Upstream(_)
            | ProxyError::Client(_)
            | ProxyError::UnaskedUpgrade => StatusCode::BAD_GATEWAY,
            ProxyError::Host(_) | ProxyError::Path(_) => StatusCode::BAD_REQUEST,
            ProxyError::Timeout => StatusCode::GATEWAY_TIMEOUT,
            ProxyError::BodyTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ProxyError::BadRewrite | ProxyError::Unresolved(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The short text of a local answer.
    pub fn body(&self) -> &'static str {
        match self {
            ProxyError::NoRoute => "404 no route for this host and path\n",
            ProxyError::Misdirected => "421 misdirected request: the host is another listener's\n",
            ProxyError::NoTarget(_) => "503 no ready upstream target\n",
            ProxyError::Unresolved(_) => "500 the route's backend does not resolve\n",
            ProxyError::Forbidden => "403 client address not allowed\n",
            ProxyError::InvalidSourceRanges => "503 this route's source ranges are invalid\n",
            ProxyError::Connect { .. } => "502 cannot connect to upstream\n",
            ProxyError::Upstream(_) | ProxyError::Client(_) => "502 upstream connection failed\n",
            ProxyError::Timeout => "504 upstream timed out\n",
            ProxyError::BodyTooLarge => "413 request body too large\n",
            ProxyError::Host(_) => "400 invalid host\n",
            ProxyError::Path(_) => "400 invalid path\n",
            ProxyError::UnaskedUpgrade => "502 upstream switched protocols unasked\n",
            ProxyError::BadRewrite => "500 the rewritten request target is invalid\n",
        }
    }
}

/// What went wrong on an upstream HTTP/1.1 connection of duet's own client
/// (`upstream::client`).
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The connection failed or closed before the whole request was written.
    #[error("writing the request: {0}")]
    Write(#[source] io::Error),
    /// The connection failed or closed before a response head came.
    #[error("reading the response head: {0}")]
    Read(#[source] io::Error),
    /// The response head is not valid HTTP/1.1.
    #[error("invalid response head: {0}")]
    Invalid(&'static str),
    /// The upstream switched protocols though the request asked for no upgrade.
    #[error("upstream switched protocols unasked")]
    Switched,
    /// The response head is larger than the connection's buffer.
    #[error("response head larger than {} bytes", limits::UPSTREAM_H1_BUF)]
    HeadTooLarge,
    /// The body's framing is broken (a bad chunk, an early close).
    #[error("invalid response body: {0}")]
    Body(&'static str),
}
