//! A client request's body as the proxy reads it: hyper's (HTTP/1.1 and HTTP/2) or an HTTP/3
//! request stream's receiving half.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use hyper::body::{Body, Frame, Incoming, SizeHint};

/// An error reading a client's body.
pub type BodyError = Box<dyn std::error::Error + Send + Sync>;

/// The receiving half of an HTTP/3 request stream.
pub type H3Recv = h3::server::RequestStream<h3_quinn::RecvStream, Bytes>;

/// A client request's body.
#[derive(Debug)]
pub enum ClientBody {
    /// Read by hyper's server (HTTP/1.1, HTTP/2).
    Hyper(Incoming),
    /// An HTTP/3 request stream's data frames, then its trailers.
    Http3(Box<H3Body>),
}

impl From<Incoming> for ClientBody {
    fn from(body: Incoming) -> ClientBody {
        ClientBody::Hyper(body)
    }
}

impl Body for ClientBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        match self.get_mut() {
            ClientBody::Hyper(body) => Pin::new(body).poll_frame(cx).map_err(Into::into),
            ClientBody::Http3(body) => body.poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ClientBody::Hyper(body) => body.is_end_stream(),
            ClientBody::Http3(body) => body.state == H3State::Done,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ClientBody::Hyper(body) => body.size_hint(),
            ClientBody::Http3(body) => body.size_hint(),
        }
    }
}

/// Where an HTTP/3 body is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum H3State {
    Data,
    Trailers,
    Done,
}

/// An HTTP/3 request body: the stream's DATA frames, then its trailers if any. The length a
/// `content-length` declared is its size hint.
pub struct H3Body {
    recv: H3Recv,
    state: H3State,
    length: Option<u64>,
    /// What was read while checking for an empty body (a stream that ended with its headers).
    first: Option<Bytes>,
}

impl std::fmt::Debug for H3Body {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("H3Body")
            .field("state", &self.state)
            .field("length", &self.length)
            .finish_non_exhaustive()
    }
}

impl H3Body {
    /// The body of a request stream, `length` its declared `content-length`. A stream whose end
    /// has already arrived (a request without a body: its FIN came with the headers) is an
    /// ended body at once, so that the upstream request goes without one.
    pub fn new(recv: H3Recv, length: Option<u64>) -> H3Body {
        let mut body = H3Body {
            recv,
            state: H3State::Data,
            length,
            first: None,
        };
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        if let Poll::Ready(Ok(first)) = body.recv.poll_recv_data(&mut cx) {
            match first {
                Some(mut data) => body.first = Some(data.copy_to_bytes(data.remaining())),
                None => body.state = H3State::Trailers,
            }
        }
        if body.state == H3State::Trailers {
            // Trailers, if any, came in the same packets: read them now too.
            if let Poll::Ready(Ok(None)) = body.recv.poll_recv_trailers(&mut cx) {
                body.state = H3State::Done;
            }
        }
        body
    }

    fn size_hint(&self) -> SizeHint {
        match (self.state, self.length) {
            (H3State::Done, _) => SizeHint::with_exact(0),
            (_, Some(n)) => SizeHint::with_exact(n),
            _ => SizeHint::default(),
        }
    }

    fn poll_frame(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        if let Some(first) = self.first.take() {
            return Poll::Ready(Some(Ok(Frame::data(first))));
        }
        loop {
            match self.state {
                H3State::Data => match self.recv.poll_recv_data(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Ok(Some(mut data))) => {
                        let data = data.copy_to_bytes(data.remaining());
                        return Poll::Ready(Some(Ok(Frame::data(data))));
                    }
                    Poll::Ready(Ok(None)) => self.state = H3State::Trailers,
                    Poll::Ready(Err(error)) => return self.failed(error),
                },
                H3State::Trailers => {
                    return match self.recv.poll_recv_trailers(cx) {
                        Poll::Pending => Poll::Pending,
                        Poll::Ready(Ok(trailers)) => {
                            self.state = H3State::Done;
                            Poll::Ready(trailers.map(|t| Ok(Frame::trailers(t))))
                        }
                        Poll::Ready(Err(error)) => self.failed(error),
                    };
                }
                H3State::Done => return Poll::Ready(None),
            }
        }
    }

    fn failed(
        &mut self,
        error: h3::error::StreamError,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        self.state = H3State::Done;
        Poll::Ready(Some(Err(Box::new(error))))
    }
}
