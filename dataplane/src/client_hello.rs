//! The ClientHello of an HTTPS connection, read with rustls' [`Acceptor`] while a copy of every
//! byte is kept for [`crate::passthrough`] to replay. The first code to read an HTTPS client's
//! bytes; free of `crate::` paths so that `fuzz/` can compile it alone.

use std::io;

use rustls::server::{Accepted, Acceptor};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// The most ClientHello bytes read before giving up (rustls refuses larger handshake messages
/// itself; this bounds the copy kept for a replay).
pub(crate) const MAX_HELLO: usize = 64 * 1024;

/// A ClientHello read from a connection: what rustls made of it, and the bytes read (`None`
/// when no copy was kept because the table has no passthrough host).
pub struct Hello {
    /// The parsed ClientHello, to continue the handshake with.
    pub accepted: Accepted,
    /// Every byte read from the connection so far.
    pub bytes: Option<Vec<u8>>,
}

/// Reads a ClientHello from `stream`, keeping a copy of the bytes when `keep` (a connection
/// that may be passed through). A malformed one is answered with rustls' alert and an error.
pub async fn read_client_hello<S>(stream: &mut S, keep: bool) -> io::Result<Hello>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut acceptor = Acceptor::default();
    let mut bytes = keep.then(Vec::new);
    let mut buf = [0u8; 4096];
    let mut total = 0;
    loop {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        total += n;
        if total > MAX_HELLO {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "ClientHello too large",
            ));
        }
        if let Some(bytes) = bytes.as_mut() {
            bytes.extend_from_slice(&buf[..n]);
        }
        let mut chunk = &buf[..n];
        while !chunk.is_empty() {
            if acceptor.read_tls(&mut chunk)? == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "ClientHello too large",
                ));
            }
        }
        match acceptor.accept() {
            Ok(None) => continue,
            Ok(Some(accepted)) => return Ok(Hello { accepted, bytes }),
            Err((error, mut alert)) => {
                let mut out = Vec::new();
                let _ = alert.write_all(&mut out);
                let _ = stream.write_all(&out).await;
                return Err(io::Error::new(io::ErrorKind::InvalidData, error));
            }
        }
    }
}

impl std::fmt::Debug for Hello {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hello")
            .field("bytes", &self.bytes.as_ref().map(Vec::len))
            .finish_non_exhaustive()
    }
}
