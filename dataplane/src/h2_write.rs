//! An HTTP/2 server connection's writes coalesced ([`Coalesced`]): the frames of several
//! responses go out in one write (one TLS record, one syscall) instead of one write each.
//!
//! h2 copies a DATA frame's payload into its write buffer only when it is smaller than its
//! "chain threshold" (256 bytes on a stream that says it writes vectored, 1,024 otherwise);
//! a larger payload is written on its own, behind the buffer, and nothing more is buffered
//! until it is, so every response with a body of 256 bytes or more cost a write (a TLS record
//! and a `sendmsg`) of its own. [`Coalesced`] says it does not write vectored, so payloads up to
//! 1,023 bytes join the buffer with the frames of the other streams answered in the same turn;
//! and it holds a small write (at most [`HOLD`] bytes: the buffer before a larger payload) until
//! the next write or the flush, so a larger payload and the frame head before it still leave in
//! one write, as with vectored writes.

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The largest write held back to go out with the next one.
pub const HOLD: usize = 1024;

/// A stream whose small writes are held until the next write or flush, and that tells its
/// writer it does not write vectored (h2 then buffers payloads under 1,024 bytes).
#[derive(Debug)]
pub struct Coalesced<S> {
    inner: S,
    /// A held write not yet handed to `inner` (at most [`HOLD`] bytes; released once written,
    /// so an idle connection holds no buffer here).
    held: Vec<u8>,
}

impl<S> Coalesced<S> {
    /// `inner`, its writes coalesced.
    pub fn new(inner: S) -> Coalesced<S> {
        Coalesced {
            inner,
            held: Vec::new(),
        }
    }
}

impl<S: AsyncWrite + Unpin> Coalesced<S> {
    /// Hands the held bytes to `inner`; ready once none is left.
    fn poll_write_held(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while !self.held.is_empty() {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &self.held))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.held.drain(..n);
        }
        if self.held.capacity() > 0 {
            self.held = Vec::new();
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Coalesced<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Coalesced<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if buf.len() <= HOLD && this.held.len() + buf.len() <= HOLD {
            if this.held.capacity() == 0 {
                // One allocation for what may be held until the next write or flush.
                this.held.reserve_exact(HOLD);
            }
            this.held.extend_from_slice(buf);
            return Poll::Ready(Ok(buf.len()));
        }
        // The held bytes and this write in one write, until the held ones are out.
        while !this.held.is_empty() {
            let both = [io::IoSlice::new(&this.held), io::IoSlice::new(buf)];
            let n = ready!(Pin::new(&mut this.inner).poll_write_vectored(cx, &both))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            if n > this.held.len() {
                let of_buf = n - this.held.len();
                this.held = Vec::new();
                return Poll::Ready(Ok(of_buf));
            }
            this.held.drain(..n);
        }
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn is_write_vectored(&self) -> bool {
        false
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_write_held(cx))?;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_write_held(cx))?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use tokio::io::AsyncWriteExt;

    /// A stream that records each write it is handed (a vectored one as one write) and accepts
    /// at most `max` bytes per write.
    #[derive(Clone, Default)]
    struct Recorder {
        writes: Arc<Mutex<Vec<Vec<u8>>>>,
        flushes: Arc<Mutex<usize>>,
        max: Option<usize>,
    }

    impl Recorder {
        fn writes(&self) -> Vec<Vec<u8>> {
            self.writes.lock().unwrap().clone()
        }
    }

    impl AsyncWrite for Recorder {
        fn poll_write(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            self.poll_write_vectored(cx, &[io::IoSlice::new(buf)])
        }

        fn poll_write_vectored(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            bufs: &[io::IoSlice<'_>],
        ) -> Poll<io::Result<usize>> {
            let mut all: Vec<u8> = bufs.iter().flat_map(|b| b.iter().copied()).collect();
            all.truncate(self.max.unwrap_or(usize::MAX));
            let n = all.len();
            self.writes.lock().unwrap().push(all);
            Poll::Ready(Ok(n))
        }

        fn is_write_vectored(&self) -> bool {
            true
        }

        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            *self.flushes.lock().unwrap() += 1;
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    impl AsyncRead for Recorder {
        fn poll_read(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            _: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    fn bytes(n: usize, of: u8) -> Vec<u8> {
        (0..n).map(|i| of.wrapping_add(i as u8)).collect()
    }

    #[tokio::test]
    async fn a_small_write_leaves_with_the_next_larger_one_in_one_write() {
        let recorder = Recorder::default();
        let mut io = Coalesced::new(recorder.clone());
        io.write_all(&bytes(9, 1)).await.unwrap();
        assert!(
            recorder.writes().is_empty(),
            "a 9-byte frame head went out alone"
        );
        io.write_all(&bytes(4000, 2)).await.unwrap();
        io.flush().await.unwrap();
        let expected = [bytes(9, 1), bytes(4000, 2)].concat();
        assert_eq!(recorder.writes(), vec![expected]);
        assert_eq!(*recorder.flushes.lock().unwrap(), 1);
    }

    #[tokio::test]
    async fn a_held_write_leaves_at_the_flush_or_shutdown() {
        let recorder = Recorder::default();
        let mut io = Coalesced::new(recorder.clone());
        io.write_all(&bytes(500, 3)).await.unwrap();
        io.flush().await.unwrap();
        assert_eq!(recorder.writes(), vec![bytes(500, 3)]);
        io.write_all(&bytes(HOLD, 4)).await.unwrap();
        io.shutdown().await.unwrap();
        assert_eq!(recorder.writes(), vec![bytes(500, 3), bytes(HOLD, 4)]);
    }

    #[tokio::test]
    async fn partial_writes_keep_every_byte_in_order() {
        let recorder = Recorder {
            max: Some(7),
            ..Recorder::default()
        };
        let mut io = Coalesced::new(recorder.clone());
        let sizes = [3, 700, 9, 2000, 1, 1024, 1025, 5, 16_000, 0, 40];
        let mut sent = Vec::new();
        for (i, n) in sizes.into_iter().enumerate() {
            let chunk = bytes(n, i as u8);
            io.write_all(&chunk).await.unwrap();
            sent.extend(chunk);
        }
        io.flush().await.unwrap();
        assert_eq!(recorder.writes().concat(), sent);
        assert!(recorder.writes().iter().all(|w| w.len() <= 7));
    }

    /// The responses of several HTTP/2 streams answered in the same turn of the connection
    /// leave in one write (one TLS record on a TLS connection), not one write per response.
    #[tokio::test]
    async fn responses_answered_together_leave_in_one_write() {
        use bytes::Bytes;
        use http_body_util::{BodyExt, Full};
        use hyper_util::rt::{TokioExecutor, TokioIo};

        const STREAMS: usize = 4;
        let (client_io, server_io) = tokio::io::duplex(1 << 20);
        let writes = Arc::new(Mutex::new(Vec::new()));
        let server_io = Tee {
            inner: server_io,
            writes: writes.clone(),
        };
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        let service_gate = gate.clone();
        let service = hyper::service::service_fn(move |_req| {
            let gate = service_gate.clone();
            async move {
                gate.acquire().await.unwrap().forget();
                let body = Full::new(Bytes::from(vec![b'x'; 600]));
                Ok::<_, std::convert::Infallible>(hyper::Response::new(body))
            }
        });
        let server = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
            .serve_connection(TokioIo::new(Coalesced::new(server_io)), service);
        tokio::spawn(server);
        let (sender, client) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(client_io))
                .await
                .unwrap();
        tokio::spawn(client);
        let mut answers = Vec::new();
        for _ in 0..STREAMS {
            let mut sender = sender.clone();
            let req = hyper::Request::get("http://a.test/")
                .body(http_body_util::Empty::<Bytes>::new())
                .unwrap();
            answers.push(tokio::spawn(async move { sender.send_request(req).await }));
        }
        // Every stream's handler waits at the gate (given time to get there); then all answer
        // in the same turn.
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        let before = writes.lock().unwrap().len();
        gate.add_permits(STREAMS);
        for answer in answers {
            let res = answer.await.unwrap().unwrap();
            assert_eq!(
                res.into_body().collect().await.unwrap().to_bytes().len(),
                600
            );
        }
        let after: Vec<usize> = writes.lock().unwrap()[before..].to_vec();
        assert_eq!(after.len(), 1, "writes after the answers: {after:?}");
        assert!(after[0] >= STREAMS * 600, "{after:?}");
    }

    /// A stream that records the size of each write handed to it.
    struct Tee {
        inner: tokio::io::DuplexStream,
        writes: Arc<Mutex<Vec<usize>>>,
    }

    impl AsyncRead for Tee {
        fn poll_read(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
        }
    }

    impl AsyncWrite for Tee {
        fn poll_write(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            let this = self.get_mut();
            let n = ready!(Pin::new(&mut this.inner).poll_write(cx, buf))?;
            this.writes.lock().unwrap().push(n);
            Poll::Ready(Ok(n))
        }

        fn poll_write_vectored(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            bufs: &[io::IoSlice<'_>],
        ) -> Poll<io::Result<usize>> {
            // One write of all the slices, as a TLS stream (one record) or `writev` makes it.
            let all: Vec<u8> = bufs.iter().flat_map(|b| b.iter().copied()).collect();
            self.poll_write(cx, &all)
        }

        fn is_write_vectored(&self) -> bool {
            true
        }

        fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.get_mut().inner).poll_flush(cx)
        }

        fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
        }
    }
}
