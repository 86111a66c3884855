//! Connectors: a TCP connection within the connect timeout (`TCP_NODELAY` set), the TLS handshake
//! within what is left of it, then the HTTP/1.1 or HTTP/2 handshake, whose connection task runs
//! on its own.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use super::tls::LiveTls;
use super::UpstreamBody;
use crate::clock::deadline;

/// A client connection of one protocol, made by its handshake over any stream.
pub(super) trait Handshake: Sized {
    /// Whether TLS offers ALPN `h2` (and requires the server to choose it).
    const H2: bool;

    /// The protocol's handshake on a connected stream; the connection task is spawned.
    async fn handshake<S>(stream: S, addr: SocketAddr) -> io::Result<Self>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static;
}

impl Handshake for http1::SendRequest<UpstreamBody> {
    const H2: bool = false;

    async fn handshake<S>(stream: S, addr: SocketAddr) -> io::Result<Self>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let (sender, connection) = http1::Builder::new()
            .max_buf_size(crate::limits::UPSTREAM_H1_BUF)
            .handshake(TokioIo::new(stream))
            .await
            .map_err(io::Error::other)?;
        tokio::spawn(async move {
            if let Err(error) = connection.with_upgrades().await {
                tracing::trace!(%error, upstream.addr = %addr, "Upstream connection ended");
            }
        });
        Ok(sender)
    }
}

impl Handshake for http2::SendRequest<UpstreamBody> {
    const H2: bool = true;

    async fn handshake<S>(stream: S, addr: SocketAddr) -> io::Result<Self>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let (sender, connection) = http2::Builder::new(TokioExecutor::new())
            .timer(TokioTimer::new())
            .initial_stream_window_size(crate::limits::H2_UPSTREAM_STREAM_WINDOW)
            .initial_connection_window_size(crate::limits::H2_UPSTREAM_CONNECTION_WINDOW)
            .max_send_buf_size(crate::limits::H2_MAX_SEND_BUF)
            .keep_alive_interval(Duration::from_secs(30))
            .keep_alive_timeout(Duration::from_secs(10))
            .handshake(TokioIo::new(stream))
            .await
            .map_err(io::Error::other)?;
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::trace!(%error, upstream.addr = %addr, "Upstream HTTP/2 connection ended");
            }
        });
        Ok(sender)
    }
}

/// TCP connect within `timeout`, `TCP_NODELAY` set.
pub(super) async fn tcp(addr: SocketAddr, timeout: Duration) -> io::Result<TcpStream> {
    let stream = tokio::time::timeout(timeout, TcpStream::connect(addr))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "connect timed out"))??;
    let _ = stream.set_nodelay(true);
    Ok(stream)
}

/// A connection of protocol `C` to `addr`, over TLS when `tls` is given: TCP connect and TLS
/// handshake together within `timeout`.
pub(super) async fn connect<C: Handshake>(
    addr: SocketAddr,
    tls: Option<&LiveTls>,
    timeout: Duration,
) -> io::Result<C> {
    let started = tokio::time::Instant::now();
    let stream = tcp(addr, timeout).await?;
    let Some(tls) = tls else {
        return C::handshake(stream, addr).await;
    };
    let stream = tokio::time::timeout_at(deadline(started, timeout), tls.handshake(stream, C::H2))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "TLS handshake timed out"))??;
    C::handshake(stream, addr).await
}
