//! The upstream read timeout after the response head (nginx `proxy_read_timeout`): a response
//! body that stalls longer than it between two reads is aborted, and the client sees the
//! response cut short rather than waiting forever.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};

/// The error a [`ReadTimeout`] body fails with.
#[derive(Debug, thiserror::Error)]
#[error("upstream sent no body data for {0:?}")]
pub struct BodyStalled(pub Duration);

/// A body that fails with [`BodyStalled`] when its inner body yields nothing for `timeout`.
#[derive(Debug)]
pub struct ReadTimeout<B> {
    inner: B,
    timeout: Duration,
    /// Armed on the first wait, re-armed after every frame.
    timer: Option<Pin<Box<Sleep>>>,
}

impl<B> ReadTimeout<B> {
    /// `inner`, allowed to wait at most `timeout` for each frame.
    pub fn new(inner: B, timeout: Duration) -> ReadTimeout<B> {
        ReadTimeout {
            inner,
            timeout,
            timer: None,
        }
    }
}

impl<B> Body for ReadTimeout<B>
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
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                // The next wait starts afresh.
                this.timer = None;
                Poll::Ready(frame.map(|f| f.map_err(Into::into)))
            }
            Poll::Pending => {
                let timeout = this.timeout;
                let timer = this
                    .timer
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
                match timer.as_mut().poll(cx) {
                    Poll::Ready(()) => {
                        timer
                            .as_mut()
                            .reset(crate::clock::deadline(Instant::now(), timeout));
                        Poll::Ready(Some(Err(Box::new(BodyStalled(timeout)))))
                    }
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use http_body_util::{BodyExt, StreamBody};

    #[tokio::test(start_paused = true)]
    async fn a_stalled_body_fails_and_a_steady_one_does_not() {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, std::io::Error>>(4);
        let stream = tokio_stream_from(rx);
        let mut body = ReadTimeout::new(StreamBody::new(stream), Duration::from_secs(60));
        // Frames 50 s apart: each wait is under the timeout.
        for _ in 0..3 {
            let tx = tx.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_secs(50)).await;
                let _ = tx.send(Ok(Frame::data(Bytes::from_static(b"x")))).await;
            });
            let frame = body.frame().await.unwrap().unwrap();
            assert_eq!(frame.into_data().unwrap(), "x");
        }
        // Then nothing: fails after 60 s.
        let start = Instant::now();
        let error = body.frame().await.unwrap().unwrap_err();
        assert!(error.is::<BodyStalled>(), "{error}");
        assert_eq!(start.elapsed(), Duration::from_secs(60));
        drop(tx);
    }

    /// A `Stream` over an mpsc receiver (no tokio-stream dependency).
    fn tokio_stream_from<T>(
        mut rx: tokio::sync::mpsc::Receiver<T>,
    ) -> impl futures_util::Stream<Item = T> + Unpin {
        futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
    }
}
