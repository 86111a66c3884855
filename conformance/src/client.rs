//! A small HTTP client for tests: connects from a chosen family's loopback address to a chosen
//! address, speaks HTTP/1.1 (keep-alive, upgrades) or HTTP/2 with prior knowledge, and returns
//! the whole response with the echo JSON parsed on demand.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{bail, Context};
use bytes::Bytes;
use http::{header, HeaderMap, Method, Request, StatusCode, Version};
use http_body_util::{BodyExt, Full};
use hyper::upgrade::Upgraded;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::{TcpSocket, TcpStream};
use tokio::task::JoinHandle;

use crate::echo::{Echo, Family};

/// How long one request (connect included) may take before the client gives up.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// A complete response.
#[derive(Clone, Debug)]
pub struct Reply {
    /// The status code.
    pub status: StatusCode,
    /// The protocol version of the response.
    pub version: Version,
    /// The response headers.
    pub headers: HeaderMap,
    /// The whole body.
    pub body: Bytes,
    /// The trailers that followed the body (empty when none).
    pub trailers: HeaderMap,
}

impl Reply {
    /// The body parsed as echo JSON, with the status and body in the error when it is not.
    pub fn echo(&self) -> anyhow::Result<Echo> {
        serde_json::from_slice(&self.body).with_context(|| {
            format!(
                "status {}, body is not echo JSON: {:?}",
                self.status,
                self.text()
            )
        })
    }

    /// The body as text (lossy).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// A response header as text, if present.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// Opens a TCP connection to `to` from the loopback address of `to`'s family (`127.0.0.1` or
/// `::1`, ephemeral port).
pub async fn connect_tcp(to: SocketAddr) -> anyhow::Result<TcpStream> {
    let family = Family::of(&to);
    let socket = match family {
        Family::V4 => TcpSocket::new_v4()?,
        Family::V6 => TcpSocket::new_v6()?,
    };
    socket.bind(SocketAddr::new(family.loopback(), 0))?;
    let stream = tokio::time::timeout(REQUEST_TIMEOUT, socket.connect(to))
        .await
        .with_context(|| format!("connecting to {to} timed out"))?
        .with_context(|| format!("cannot connect to {to}"))?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

#[derive(Debug)]
enum Sender {
    H1(hyper::client::conn::http1::SendRequest<Full<Bytes>>),
    H2(hyper::client::conn::http2::SendRequest<Full<Bytes>>),
}

/// One client connection, kept alive across requests.
#[derive(Debug)]
pub struct Conn {
    sender: Sender,
    local: SocketAddr,
    peer: SocketAddr,
    task: JoinHandle<()>,
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Conn {
    /// An HTTP/1.1 connection to `to` from the loopback address of its family.
    pub async fn http1(to: SocketAddr) -> anyhow::Result<Conn> {
        let stream = connect_tcp(to).await?;
        let local = stream.local_addr()?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        let task = tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(Conn {
            sender: Sender::H1(sender),
            local,
            peer: to,
            task,
        })
    }

    /// An HTTP/2 connection with prior knowledge (h2c) to `to`.
    pub async fn http2(to: SocketAddr) -> anyhow::Result<Conn> {
        let stream = connect_tcp(to).await?;
        let local = stream.local_addr()?;
        let (sender, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
                .await?;
        let task = tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(Conn {
            sender: Sender::H2(sender),
            local,
            peer: to,
            task,
        })
    }

    /// A TLS connection to `to` (see [`crate::tls::handshake`]), speaking HTTP/2 when the
    /// server chose `h2` by ALPN, else HTTP/1.1; with the handshake's certificate and ALPN.
    pub async fn https(
        to: SocketAddr,
        sni: Option<&str>,
        alpn: &[&str],
    ) -> anyhow::Result<(Conn, crate::tls::Handshake)> {
        let (stream, hs) = crate::tls::handshake(to, sni, alpn, &[]).await?;
        let local = stream.get_ref().0.local_addr()?;
        let conn = Conn::over(stream, local, to, hs.alpn.as_deref() == Some("h2")).await?;
        Ok((conn, hs))
    }

    /// HTTP/1.1 or HTTP/2 over an established stream.
    pub async fn over<S>(
        stream: S,
        local: SocketAddr,
        peer: SocketAddr,
        h2: bool,
    ) -> anyhow::Result<Conn>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let (sender, task) = if h2 {
            let (sender, conn) =
                hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
                    .await?;
            (
                Sender::H2(sender),
                tokio::spawn(async move {
                    let _ = conn.await;
                }),
            )
        } else {
            let (sender, conn) =
                hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
            (
                Sender::H1(sender),
                tokio::spawn(async move {
                    let _ = conn.await;
                }),
            )
        };
        Ok(Conn {
            sender,
            local,
            peer,
            task,
        })
    }

    /// The client's own address on this connection (what the proxy sees as the peer).
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// The address connected to.
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer
    }

    /// The family of the connection.
    pub fn family(&self) -> Family {
        Family::of(&self.peer)
    }

    /// Whether the server has closed the connection.
    pub fn is_closed(&self) -> bool {
        match &self.sender {
            Sender::H1(s) => s.is_closed(),
            Sender::H2(s) => s.is_closed(),
        }
    }

    /// `GET path` with a Host (HTTP/1.1) or `:authority` (HTTP/2).
    pub async fn get(&mut self, host: &str, path: &str) -> anyhow::Result<Reply> {
        self.send(request(Method::GET, host, path).body(Full::new(Bytes::new()))?)
            .await
    }

    /// Sends a request built by [`request`] (origin-form target plus Host header) and reads the
    /// whole response. For HTTP/2 the Host header becomes the `:authority`.
    pub async fn send(&mut self, req: Request<Full<Bytes>>) -> anyhow::Result<Reply> {
        let fut = async {
            let res = match &mut self.sender {
                Sender::H1(s) => {
                    s.ready().await.context("connection is not usable")?;
                    s.send_request(req).await?
                }
                Sender::H2(s) => {
                    let req = to_h2(req)?;
                    s.ready().await.context("connection is not usable")?;
                    s.send_request(req).await?
                }
            };
            read_reply(res).await
        };
        tokio::time::timeout(REQUEST_TIMEOUT, fut)
            .await
            .with_context(|| format!("request to {} timed out", self.peer))?
    }
}

fn to_h2(mut req: Request<Full<Bytes>>) -> anyhow::Result<Request<Full<Bytes>>> {
    let host = req
        .headers_mut()
        .remove(header::HOST)
        .context("request has no Host")?;
    let path = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_else(|| "/".to_owned());
    *req.uri_mut() = format!("http://{}{}", host.to_str()?, path).parse()?;
    *req.version_mut() = Version::HTTP_2;
    Ok(req)
}

async fn read_reply(res: http::Response<hyper::body::Incoming>) -> anyhow::Result<Reply> {
    let (parts, body) = res.into_parts();
    let collected = body.collect().await.context("reading the response body")?;
    let trailers = collected.trailers().cloned().unwrap_or_default();
    Ok(Reply {
        status: parts.status,
        version: parts.version,
        headers: parts.headers,
        body: collected.to_bytes(),
        trailers,
    })
}

/// A request builder with an origin-form target and a Host header.
pub fn request(method: Method, host: &str, path_and_query: &str) -> http::request::Builder {
    Request::builder()
        .method(method)
        .uri(path_and_query)
        .header(header::HOST, host)
}

/// `GET path` over a fresh HTTP/1.1 connection to `to`.
pub async fn get(to: SocketAddr, host: &str, path: &str) -> anyhow::Result<Reply> {
    Conn::http1(to).await?.get(host, path).await
}

/// Sends a WebSocket-style upgrade request (`Connection: Upgrade`, `Upgrade: websocket`) over a
/// fresh HTTP/1.1 connection and returns the response with the upgraded byte stream (`None` when
/// the answer was not `101`).
pub async fn upgrade(
    to: SocketAddr,
    host: &str,
    path: &str,
) -> anyhow::Result<(Reply, Option<TokioIo<Upgraded>>)> {
    let stream = connect_tcp(to).await?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(async move {
        let _ = conn.with_upgrades().await;
    });
    let req = request(Method::GET, host, path)
        .header(header::CONNECTION, "Upgrade")
        .header(header::UPGRADE, "websocket")
        .header("sec-websocket-version", "13")
        .header("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==")
        .body(Full::new(Bytes::new()))?;
    let fut = async {
        let mut res = sender.send_request(req).await?;
        if res.status() != StatusCode::SWITCHING_PROTOCOLS {
            return Ok((read_reply(res).await?, None));
        }
        let upgraded = hyper::upgrade::on(&mut res).await.context("upgrading")?;
        let reply = Reply {
            status: res.status(),
            version: res.version(),
            headers: res.headers().clone(),
            body: Bytes::new(),
            trailers: HeaderMap::new(),
        };
        Ok((reply, Some(TokioIo::new(upgraded))))
    };
    tokio::time::timeout(REQUEST_TIMEOUT, fut)
        .await
        .with_context(|| format!("upgrade request to {to} timed out"))?
}

/// Sends `total` `GET` requests to `to` over `conns` concurrent keep-alive HTTP/1.1 connections
/// (reopened if the server closes one) and returns every reply; a transport error fails the lot.
pub async fn load(
    to: SocketAddr,
    host: &str,
    path: &str,
    total: usize,
    conns: usize,
) -> anyhow::Result<Vec<Reply>> {
    let conns = conns.clamp(1, total.max(1));
    let mut tasks = Vec::with_capacity(conns);
    for i in 0..conns {
        let n = total / conns + usize::from(i < total % conns);
        let host = host.to_owned();
        let path = path.to_owned();
        tasks.push(tokio::spawn(async move {
            let mut replies = Vec::with_capacity(n);
            let mut conn = Conn::http1(to).await?;
            for k in 0..n {
                if conn.is_closed() {
                    conn = Conn::http1(to).await?;
                }
                let reply = conn
                    .get(&host, &path)
                    .await
                    .with_context(|| format!("request {k} of connection {i} to {to}"))?;
                replies.push(reply);
            }
            anyhow::Ok(replies)
        }));
    }
    let mut all = Vec::with_capacity(total);
    for task in tasks {
        all.extend(task.await??);
    }
    Ok(all)
}

/// Polls `f` every 25 ms until it succeeds or `timeout` passes; then returns its last error.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        match f().await {
            Ok(v) => return Ok(v),
            Err(e) if tokio::time::Instant::now() >= deadline => {
                return Err(e.context(format!("{what}: still failing after {timeout:?}")));
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(25)).await,
        }
    }
}

/// Fails unless the reply has the expected status (with the body in the message).
pub fn expect_status(reply: &Reply, status: u16) -> anyhow::Result<()> {
    if reply.status.as_u16() != status {
        bail!(
            "expected status {status}, got {}: {:?}",
            reply.status,
            reply.text()
        );
    }
    Ok(())
}
