//! Limits of the client side, with defaults comparable to nginx's: request head size (431),
//! request body size (413, declared or counted as it streams; per Ingress with
//! `duet.dev/proxy-body-size`), and HTTP/2 stream limits
//! against floods and rapid reset (CVE-2023-44487).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Buf;
use hyper::body::{Body, Frame, SizeHint};
use hyper::server::conn::{http1, http2};
use hyper_util::rt::TokioExecutor;

/// Largest request head (request line plus headers) on HTTP/1.1, and largest header list on
/// HTTP/2: 32 KiB, like nginx's `large_client_header_buffers 4 8k`. Larger heads get 431.
pub const MAX_HEADER_BYTES: usize = 32 * 1024;

/// Default largest request body: 1 MiB, like nginx's `client_max_body_size`. Larger declared
/// bodies (`Content-Length`) get 413.
pub const DEFAULT_MAX_BODY_BYTES: u64 = 1024 * 1024;

/// Concurrent streams per HTTP/2 connection (nginx `http2_max_concurrent_streams`: 128).
pub const H2_MAX_CONCURRENT_STREAMS: u32 = 128;

/// Streams a client may reset before the server has accepted them, per connection; more is a
/// rapid-reset attack and the connection is closed with GOAWAY.
pub const H2_MAX_PENDING_ACCEPT_RESET_STREAMS: usize = 20;

/// Streams the server may reset because of client protocol errors, per connection, before the
/// connection is closed.
pub const H2_MAX_LOCAL_ERROR_RESET_STREAMS: usize = 256;

/// Response bytes queued per HTTP/2 stream beyond what the peer's flow-control window lets
/// through (hyper's default is 1 MiB): 128 streams of a client that does not read hold at most
/// 128 x 32 KiB = 4 MiB. Also bounds request bodies queued towards an HTTP/2 upstream.
pub const H2_MAX_SEND_BUF: usize = 32 * 1024;

/// The receive window duet offers a client per HTTP/2 stream (request bodies not yet taken by
/// the upstream): 256 KiB.
pub const H2_STREAM_WINDOW: u32 = 256 * 1024;

/// The receive window duet offers a client per HTTP/2 connection: 1 MiB.
pub const H2_CONNECTION_WINDOW: u32 = 1024 * 1024;

/// The receive window duet offers an HTTP/2 upstream per stream (response bytes not yet taken by
/// the client): 128 KiB (hyper's default is 2 MiB).
pub const H2_UPSTREAM_STREAM_WINDOW: u32 = 128 * 1024;

/// The receive window duet offers an HTTP/2 upstream per connection, shared by every stream to
/// that address: 4 MiB (hyper's default is 5 MiB).
pub const H2_UPSTREAM_CONNECTION_WINDOW: u32 = 4 * 1024 * 1024;

/// Largest read buffer of an HTTP/1.1 upstream connection (hyper's default grows to 400 KiB):
/// 32 KiB, which bounds an upstream's response head too, like a client's (nginx
/// `proxy_buffer_size`: 4 or 8 KiB). A response body waiting for a slow client holds at most this
/// much per upstream connection.
pub const UPSTREAM_H1_BUF: usize = 32 * 1024;

/// Applies the head-size and HTTP/2 limits to a listener's connection builders.
pub fn apply(h1: &mut http1::Builder, h2: &mut http2::Builder<TokioExecutor>) {
    h1.max_buf_size(MAX_HEADER_BYTES);
    h2.max_header_list_size(MAX_HEADER_BYTES as u32)
        .max_concurrent_streams(H2_MAX_CONCURRENT_STREAMS)
        .max_pending_accept_reset_streams(H2_MAX_PENDING_ACCEPT_RESET_STREAMS)
        .max_local_error_reset_streams(H2_MAX_LOCAL_ERROR_RESET_STREAMS)
        .max_send_buf_size(H2_MAX_SEND_BUF)
        .initial_stream_window_size(H2_STREAM_WINDOW)
        .initial_connection_window_size(H2_CONNECTION_WINDOW);
}

/// Parses a size as nginx writes it: bytes, or a number with `k`, `m` or `g` (powers of 1024,
/// either case); `0` means unlimited.
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let (number, unit) = match s.char_indices().last()? {
        (i, c) if c.is_ascii_alphabetic() => (&s[..i], c.to_ascii_lowercase()),
        _ => (s, 'b'),
    };
    if number.is_empty() || !number.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = number.parse().ok()?;
    let factor: u64 = match unit {
        'b' => 1,
        'k' => 1024,
        'm' => 1024 * 1024,
        'g' => 1024 * 1024 * 1024,
        _ => return None,
    };
    n.checked_mul(factor)
}

/// The error a [`Limited`] body fails with once its limit is passed.
#[derive(Debug, thiserror::Error)]
#[error("request body larger than {limit} bytes")]
pub struct BodyTooLarge {
    /// The limit in bytes.
    pub limit: u64,
}

/// A request body that fails with [`BodyTooLarge`] once more than its limit has arrived, for
/// bodies that declare no length (chunked HTTP/1.1, HTTP/2 without `content-length`) or lie about
/// it. The upstream request is aborted then; the proxy answers 413 when no response has started.
#[derive(Debug)]
pub struct Limited<B> {
    inner: B,
    /// 0: unlimited.
    limit: u64,
    seen: u64,
    /// The send timeout's progress marks (`proxy-send-timeout`), when the route sets one.
    watch: Option<Arc<crate::send_watch::SendWatch>>,
}

impl<B> Limited<B> {
    /// `inner`, failing after `limit` bytes (0: unlimited).
    pub fn new(inner: B, limit: u64) -> Limited<B> {
        Limited {
            inner,
            limit,
            seen: 0,
            watch: None,
        }
    }

    /// Marks its progress for a send timeout, if one is given.
    pub fn watched(mut self, timeout: Option<std::time::Duration>) -> Limited<B> {
        self.watch = timeout.map(crate::send_watch::SendWatch::new);
        self
    }

    /// Its send-timeout watch, if any.
    pub fn watch(&self) -> Option<Arc<crate::send_watch::SendWatch>> {
        self.watch.clone()
    }
}

impl<B> Body for Limited<B>
where
    B: Body + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Data = B::Data;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, Self::Error>>> {
        let this = self.get_mut();
        if let Some(w) = &this.watch {
            w.asked();
        }
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        if let Some(w) = &this.watch {
            w.answered(polled.is_pending());
            if matches!(polled, Poll::Ready(None)) || this.inner.is_end_stream() {
                w.finish();
            }
        }
        match polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.seen = this.seen.saturating_add(data.remaining() as u64);
                    if this.limit > 0 && this.seen > this.limit {
                        let error = BodyTooLarge { limit: this.limit };
                        return Poll::Ready(Some(Err(Box::new(error))));
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(error))) => Poll::Ready(Some(Err(error.into()))),
            other => other.map(|_| None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Whether an upstream error came from a [`Limited`] body passing its limit.
pub fn body_too_large(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(error);
    while let Some(error) = next {
        if error.is::<BodyTooLarge>() {
            return true;
        }
        next = error.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_as_nginx_writes_them() {
        assert_eq!(parse_size("0"), Some(0));
        assert_eq!(parse_size("512"), Some(512));
        assert_eq!(parse_size("8k"), Some(8192));
        assert_eq!(parse_size("1m"), Some(1 << 20));
        assert_eq!(parse_size("2M"), Some(2 << 20));
        assert_eq!(parse_size(" 1g "), Some(1 << 30));
        for bad in ["", "m", "1.5m", "-1", "1t", "k1", "99999999999999999999g"] {
            assert_eq!(parse_size(bad), None, "{bad}");
        }
    }
}
