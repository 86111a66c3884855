//! What serving a client connection over hyper's per-protocol servers needs around them: which
//! protocol a plain connection speaks (the HTTP/2 preface, as hyper-util's `auto` reads it), and
//! [`Rewind`], a stream that gives back bytes already read, so an HTTP/1.1 connection can be let
//! go of by one hyper server while idle ([`crate::idle`]'s parking) and taken up by a new one.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};

/// How an HTTP/2 connection with prior knowledge begins.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Reads the first bytes of a plain connection until they are the HTTP/2 preface or cannot be
/// (or the stream ends): whether the client speaks HTTP/2, and the stream with those bytes to be
/// read again. As hyper-util's `auto` server decides it.
pub async fn sniff_h2<S: AsyncRead + Unpin>(mut io: S) -> io::Result<(bool, Rewind<S>)> {
    let mut buf = [0u8; H2_PREFACE.len()];
    let mut filled = 0;
    let mut h2 = true;
    while filled < H2_PREFACE.len() {
        let n = io.read(&mut buf[filled..]).await?;
        if n == 0 || buf[filled..filled + n] != H2_PREFACE[filled..filled + n] {
            h2 = false;
            filled += n;
            break;
        }
        filled += n;
    }
    let read = Bytes::copy_from_slice(&buf[..filled]);
    Ok((h2, Rewind::new(io, read)))
}

/// A stream whose first reads return bytes read from it earlier.
#[derive(Debug)]
pub struct Rewind<S> {
    pre: Bytes,
    inner: S,
}

impl<S> Rewind<S> {
    /// `inner`, read from after `pre`.
    pub fn new(inner: S, pre: Bytes) -> Rewind<S> {
        Rewind { pre, inner }
    }

    /// Bytes still to be given back before the stream's own.
    pub fn has_pending(&self) -> bool {
        !self.pre.is_empty()
    }

    /// The stream.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The stream.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The same stream with `pre` (bytes an HTTP server had read and not used) put back in
    /// front of what is left.
    pub fn rewound(mut self, pre: Bytes) -> Rewind<S> {
        if !pre.is_empty() {
            let mut joined = Vec::with_capacity(pre.len() + self.pre.len());
            joined.extend_from_slice(&pre);
            joined.extend_from_slice(&self.pre);
            self.pre = Bytes::from(joined);
        }
        self
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Rewind<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.pre.is_empty() {
            let n = this.pre.len().min(buf.remaining());
            buf.put_slice(&this.pre[..n]);
            this.pre.advance(n);
            if this.pre.is_empty() {
                this.pre = Bytes::new();
            }
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Rewind<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn sniffed(input: &[u8]) -> (bool, Vec<u8>) {
        let (h2, mut io) = sniff_h2(input).await.unwrap();
        let mut all = Vec::new();
        io.read_to_end(&mut all).await.unwrap();
        (h2, all)
    }

    #[tokio::test]
    async fn the_preface_is_http2_and_every_byte_is_read_again() {
        let mut input = H2_PREFACE.to_vec();
        input.extend_from_slice(b"\x00\x00\x00\x04");
        assert_eq!(sniffed(&input).await, (true, input.clone()));
    }

    #[tokio::test]
    async fn anything_else_is_http1_and_every_byte_is_read_again() {
        for input in [
            &b"GET / HTTP/1.1\r\n\r\n"[..],
            b"PRI * HTTP/1.1\r\n",
            b"P",
            b"",
        ] {
            assert_eq!(sniffed(input).await, (false, input.to_vec()), "{input:?}");
        }
    }

    #[tokio::test]
    async fn rewound_bytes_come_before_the_rest() {
        let io = Rewind::new(&b"tail"[..], Bytes::from_static(b"mid-"));
        let mut io = io.rewound(Bytes::from_static(b"head-"));
        assert!(io.has_pending());
        let mut all = Vec::new();
        io.read_to_end(&mut all).await.unwrap();
        assert_eq!(all, b"head-mid-tail");
    }
}
