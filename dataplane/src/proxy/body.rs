//! The body of a proxied response ([`ProxyBody`]): the upstream's stream under the read timeout,
//! or a short local answer; it holds what must live as long as the response does.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Response, StatusCode};
use http_body_util::{Either, Full};
use hyper::body::{Body, Frame, SizeHint};

use crate::balance::InFlight;
use crate::error::ProxyError;
use crate::observe::Exchange;
use crate::read_timeout::ReadTimeout;
use crate::upstream::{PoolReturn, UpstreamIncoming};

/// The body of a proxied response: the upstream's stream or a short local answer. It holds the
/// target's in-flight mark until the body is done, so balancing sees streaming responses.
#[derive(Debug)]
pub struct ProxyBody {
    inner: Either<ReadTimeout<UpstreamIncoming>, Full<Bytes>>,
    _in_flight: Option<InFlight>,
    /// Records the request (metrics, access log) when the body is done or dropped.
    pub(super) exchange: Option<Exchange>,
    /// The HTTP/1.1 upstream connection, back to the pool once this body is done.
    _pool_return: Option<PoolReturn>,
}

impl ProxyBody {
    /// A local answer's body.
    pub(super) fn full(bytes: Bytes) -> ProxyBody {
        ProxyBody {
            inner: Either::Right(Full::new(bytes)),
            _in_flight: None,
            exchange: None,
            _pool_return: None,
        }
    }

    /// An upstream's body, read within `read_timeout` per read, holding the target's in-flight
    /// mark and the pooled connection until done.
    pub(super) fn upstream(
        body: UpstreamIncoming,
        read_timeout: Duration,
        in_flight: InFlight,
        pool_return: Option<PoolReturn>,
    ) -> ProxyBody {
        ProxyBody {
            inner: Either::Left(ReadTimeout::new(body, read_timeout)),
            _in_flight: Some(in_flight),
            exchange: None,
            _pool_return: pool_return,
        }
    }

    /// An empty answer with a status and, when it is a valid header value, a `Location`.
    pub(super) fn redirect(status: StatusCode, location: &str) -> Response<ProxyBody> {
        let mut res = Response::new(ProxyBody::full(Bytes::new()));
        *res.status_mut() = status;
        if let Ok(v) = HeaderValue::from_str(location) {
            res.headers_mut().insert(header::LOCATION, v);
        }
        res
    }

    /// The local answer to an error: its status and short text.
    pub(super) fn error(error: &ProxyError) -> Response<ProxyBody> {
        let body = ProxyBody::full(Bytes::from_static(error.body().as_bytes()));
        let mut res = Response::new(body);
        *res.status_mut() = error.status();
        res.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        res
    }
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        let polled = match &mut this.inner {
            Either::Left(incoming) => Pin::new(incoming).poll_frame(cx),
            Either::Right(full) => Pin::new(full)
                .poll_frame(cx)
                .map_err(|never| match never {}),
        };
        if let (Poll::Ready(Some(Ok(frame))), Some(exchange)) = (&polled, &mut this.exchange) {
            exchange.add_bytes(frame.data_ref().map_or(0, Bytes::len));
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
