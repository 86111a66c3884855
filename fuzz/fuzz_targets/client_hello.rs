//! Fuzzes duet's reading of an HTTPS client's first bytes (`client_hello`, before
//! ssl-passthrough or the TLS handshake): any bytes, arriving in reads of any size, give a
//! ClientHello or an error, never a panic or a hang; at most `MAX_HELLO` bytes (plus one read)
//! are read; the copy kept for a passthrough replay is exactly the bytes read, and the upstream
//! reading that copy finds the same ClientHello (server name, ALPN) as duet did; keeping the copy
//! or not never changes the outcome; a refusal writes nothing but a TLS alert.
//!
//! Input: one byte choosing the size of each read (0: as much as the 4 KiB buffer takes), one
//! byte of flags (bit 0: the client then repeats its bytes without end, to reach the size
//! bound), then the client's bytes.

#![no_main]

use std::future::Future as _;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use libfuzzer_sys::fuzz_target;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

// The module's own source, compiled here with only its dependencies (rustls, tokio); it must
// stay free of `crate::` paths.
#[path = "../../dataplane/src/client_hello.rs"]
mod client_hello;

use client_hello::{read_client_hello, MAX_HELLO};

/// A client whose bytes are always ready: `data`, in reads of at most `step` bytes, repeated
/// without end when `repeat`; what duet writes is kept.
struct Client<'a> {
    data: &'a [u8],
    step: usize,
    repeat: bool,
    read: usize,
    written: Vec<u8>,
}

impl AsyncRead for Client<'_> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let at = if self.repeat {
            self.read % self.data.len().max(1)
        } else {
            self.read
        };
        let left = &self.data[at.min(self.data.len())..];
        let n = left.len().min(self.step).min(buf.remaining());
        buf.put_slice(&left[..n]);
        self.read += n;
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Client<'_> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        b: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.written.extend_from_slice(b);
        Poll::Ready(Ok(b.len()))
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// What duet (or an upstream) makes of a ClientHello: its server name and ALPN protocols.
type Seen = (Option<String>, Option<Vec<Vec<u8>>>);

/// What a read gave: what the ClientHello says, or the error kind; the copy kept; how many bytes
/// were read; what was written back.
#[derive(Debug, PartialEq)]
struct Outcome {
    hello: Result<Seen, io::ErrorKind>,
    bytes: Option<Vec<u8>>,
    read: usize,
    written: Vec<u8>,
}

fn read(data: &[u8], step: usize, repeat: bool, keep: bool) -> Outcome {
    let mut client = Client {
        data,
        step,
        repeat,
        read: 0,
        written: Vec::new(),
    };
    let result = {
        let future = std::pin::pin!(read_client_hello(&mut client, keep));
        match future.poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(result) => result,
            Poll::Pending => panic!("a read of ready bytes waited"),
        }
    };
    let (hello, bytes) = match result {
        Ok(hello) => {
            let ch = hello.accepted.client_hello();
            let alpn = ch.alpn().map(|a| a.map(<[u8]>::to_vec).collect());
            (Ok((ch.server_name().map(str::to_owned), alpn)), hello.bytes)
        }
        Err(error) => (Err(error.kind()), None),
    };
    Outcome {
        hello,
        bytes,
        read: client.read,
        written: client.written,
    }
}

fuzz_target!(|input: &[u8]| {
    let [step, flags, data @ ..] = input else {
        return;
    };
    let step = if *step == 0 {
        usize::MAX
    } else {
        usize::from(*step)
    };
    let repeat = flags & 1 == 1 && !data.is_empty();
    let kept = read(data, step, repeat, true);
    assert!(kept.read <= MAX_HELLO + 4096, "read {} bytes", kept.read);
    assert!(
        kept.written.is_empty() || kept.written[0] == 0x15,
        "not an alert: {kept:?}"
    );
    let not_kept = read(data, step, repeat, false);
    assert_eq!(
        not_kept.hello, kept.hello,
        "keeping the copy changed the outcome"
    );
    assert_eq!((not_kept.read, not_kept.bytes), (kept.read, None));
    let Some(bytes) = kept.bytes else {
        assert!(kept.hello.is_err(), "a ClientHello without its copy");
        return;
    };
    let stream: Vec<u8> = data.iter().copied().cycle().take(kept.read).collect();
    assert_eq!(bytes, stream, "the copy is not the bytes read");
    let replayed = read(&bytes, usize::MAX, false, false);
    assert_eq!(replayed.hello, kept.hello, "the replay reads differently");
});
