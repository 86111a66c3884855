//! Lingering: a request answered before its body was read (a 404, 413, 403, a redirect) has its
//! HTTP/1.1 body read and discarded in the background, within bounds, as nginx's lingering close
//! does. Otherwise the connection closes while the client is still sending, its kernel answers
//! the unread bytes with a reset, and the reset can destroy the answer before the client reads
//! it: an upload over the size limit would see "connection reset" instead of 413.

use std::time::Duration;

use http::{Request, Version};
use http_body_util::BodyExt;
use hyper::body::Body;

use crate::client_body::ClientBody;

/// The most bytes read and discarded for one answered request (nginx has no byte bound, only
/// `lingering_time`; a bound keeps a refused upload from costing more than this much bandwidth).
pub(crate) const LINGER_BYTES: u64 = 16 * 1024 * 1024;

/// The longest a discarded body is read (nginx: `lingering_time` 30 s, `lingering_timeout` 5 s).
pub(crate) const LINGER_TIME: Duration = Duration::from_secs(5);

/// Passes `result` through; first, if `req` is HTTP/1.x with body still unread, reads and
/// discards that body in a background task (at most [`LINGER_BYTES`] for [`LINGER_TIME`]), so
/// that the answer reaches the client. HTTP/2 needs none of this: the stream is reset on its own.
pub(crate) fn unread<T>(req: Request<ClientBody>, result: T) -> T {
    let http1 = matches!(req.version(), Version::HTTP_10 | Version::HTTP_11);
    let body = req.into_body();
    if http1 && !body.is_end_stream() {
        tokio::spawn(discard(body, LINGER_BYTES, LINGER_TIME));
    }
    result
}

/// Reads `body` to its end, or until `max_bytes` or `time` are spent, dropping what it reads.
/// Returns how many bytes it read.
pub(crate) async fn discard<B: Body + Unpin>(mut body: B, max_bytes: u64, time: Duration) -> u64 {
    let mut read = 0u64;
    let _ = tokio::time::timeout(time, async {
        while read < max_bytes {
            match body.frame().await {
                Some(Ok(frame)) => {
                    if let Some(data) = frame.data_ref() {
                        read += bytes::Buf::remaining(data) as u64;
                    }
                }
                Some(Err(_)) | None => break,
            }
        }
    })
    .await;
    read
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use http_body_util::{Full, StreamBody};
    use hyper::body::Frame;

    #[tokio::test]
    async fn reads_a_body_to_its_end_within_the_byte_bound() {
        let body = Full::new(Bytes::from(vec![b'x'; 1000]));
        assert_eq!(discard(body, 4096, Duration::from_secs(1)).await, 1000);
    }

    #[tokio::test]
    async fn stops_at_the_byte_bound() {
        let chunks = (0..100)
            .map(|_| Ok::<_, std::convert::Infallible>(Frame::data(Bytes::from(vec![b'x'; 1024]))));
        let body = StreamBody::new(futures_util::stream::iter(chunks));
        assert_eq!(
            discard(body, 10 * 1024, Duration::from_secs(1)).await,
            10 * 1024
        );
    }

    #[tokio::test(start_paused = true)]
    async fn stops_at_the_time_bound() {
        let stalled = StreamBody::new(futures_util::stream::pending::<
            Result<Frame<Bytes>, std::convert::Infallible>,
        >());
        assert_eq!(discard(stalled, 1024, Duration::from_secs(5)).await, 0);
    }
}
