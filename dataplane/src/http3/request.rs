//! One HTTP/3 connection's requests: each made into the `http::Request` the proxy takes (its
//! body read from the request stream), and the proxy's response streamed back.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderMap, Request, Response, Version};
use http_body_util::BodyExt;
use tokio::sync::watch;

use crate::client_body::{ClientBody, H3Body};
use crate::conn::ConnInfo;
use crate::proxy::{Proxy, ProxyBody};

type H3Conn = h3::server::Connection<h3_quinn::Connection, Bytes>;
type Resolver = h3::server::RequestResolver<h3_quinn::Connection, Bytes>;
type SendHalf = h3::server::RequestStream<h3_quinn::SendStream<Bytes>, Bytes>;

/// Serves the requests of a connection until the client closes it or it idles out; once `drain`
/// turns true, sends GOAWAY and serves the requests already begun until they end.
pub(super) async fn serve_connection(
    conn: quinn::Connection,
    proxy: &Arc<Proxy>,
    info: Arc<ConnInfo>,
    mut drain: watch::Receiver<bool>,
) -> Result<(), h3::error::ConnectionError> {
    let mut h3: H3Conn = h3::server::builder()
        .max_field_section_size(super::MAX_FIELD_SECTION)
        .build(h3_quinn::Connection::new(conn.clone()))
        .await?;
    let ended = serve_requests(&mut h3, proxy, info, &mut drain).await;
    // Dropping the HTTP/3 connection closes the QUIC one, and closing drops what is not yet
    // acknowledged of the last responses: a few round trips for them (or for the client to
    // close first) before.
    let linger = (conn.rtt() * 3 + Duration::from_millis(100)).min(Duration::from_secs(1));
    let _ = tokio::time::timeout(linger, conn.closed()).await;
    drop(h3);
    ended
}

/// Serves requests until the connection ends or, once `drain` turned true and GOAWAY was
/// sent, the requests begun before have ended.
async fn serve_requests(
    h3: &mut H3Conn,
    proxy: &Arc<Proxy>,
    info: Arc<ConnInfo>,
    drain: &mut watch::Receiver<bool>,
) -> Result<(), h3::error::ConnectionError> {
    // The connection's requests in flight (a request outlives no connection).
    let mut requests = tokio::task::JoinSet::new();
    let mut draining = false;
    loop {
        if draining && requests.is_empty() {
            return Ok(());
        }
        let accepted = tokio::select! {
            accepted = h3.accept() => accepted,
            Some(_) = requests.join_next() => continue,
            () = super::stopped(drain), if !draining => {
                draining = true;
                // GOAWAY: no request after the ones already accepted.
                h3.shutdown(0).await?;
                continue;
            }
        };
        match accepted {
            Ok(Some(resolver)) => {
                requests.spawn(request(resolver, proxy.clone(), info.clone()));
            }
            Ok(None) => break,
            Err(error) if error.is_h3_no_error() => break,
            Err(error) => return Err(error),
        }
    }
    while requests.join_next().await.is_some() {}
    Ok(())
}

/// Answers one request stream.
async fn request(resolver: Resolver, proxy: Arc<Proxy>, info: Arc<ConnInfo>) {
    let (req, stream) = match resolver.resolve_request().await {
        Ok(resolved) => resolved,
        Err(error) => {
            tracing::trace!(%error, client.addr = %info.peer, "HTTP/3 request refused");
            return;
        }
    };
    let (mut send, recv) = stream.split();
    let length = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let (mut parts, ()) = req.into_parts();
    parts.version = Version::HTTP_3;
    let body = ClientBody::Http3(Box::new(H3Body::new(recv, length)));
    let Ok(response) = proxy
        .handle(Request::from_parts(parts, body), info.clone())
        .await;
    if let Err(error) = respond(&mut send, response).await {
        tracing::trace!(%error, client.addr = %info.peer, "HTTP/3 response not sent whole");
    }
}

/// Sends a response: its head without the connection-specific fields HTTP/3 forbids, its body
/// as it comes, its trailers; a body that fails midway resets the stream.
async fn respond(
    send: &mut SendHalf,
    response: Response<ProxyBody>,
) -> Result<(), h3::error::StreamError> {
    let (mut parts, mut body) = response.into_parts();
    strip_connection_fields(&mut parts.headers);
    send.send_response(Response::from_parts(parts, ())).await?;
    while let Some(frame) = body.frame().await {
        let frame = match frame {
            Ok(frame) => frame,
            Err(error) => {
                tracing::trace!(%error, "Upstream body failed; resetting the HTTP/3 stream");
                send.stop_stream(h3::error::Code::H3_INTERNAL_ERROR);
                return Ok(());
            }
        };
        match frame.into_data() {
            Ok(data) => {
                if !data.is_empty() {
                    send.send_data(data).await?;
                }
            }
            Err(frame) => {
                if let Ok(trailers) = frame.into_trailers() {
                    send.send_trailers(trailers).await?;
                }
            }
        }
    }
    send.finish().await
}

/// Removes the fields HTTP/3 forbids (RFC 9114, 4.2): `Connection` and those it names,
/// `Keep-Alive`, `Proxy-Connection`, `Transfer-Encoding`, `Upgrade`.
fn strip_connection_fields(headers: &mut HeaderMap) {
    let named: Vec<String> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|v| v.trim().to_ascii_lowercase())
        .filter(|v| !v.is_empty())
        .collect();
    for name in named {
        headers.remove(name.as_str());
    }
    for name in [
        header::CONNECTION,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
        header::HeaderName::from_static("keep-alive"),
        header::HeaderName::from_static("proxy-connection"),
    ] {
        headers.remove(name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strips_the_fields_http3_forbids() {
        let mut headers = HeaderMap::new();
        headers.insert(header::CONNECTION, "keep-alive, x-hop".parse().unwrap());
        headers.insert("x-hop", "1".parse().unwrap());
        headers.insert("keep-alive", "timeout=5".parse().unwrap());
        headers.insert(header::TRANSFER_ENCODING, "chunked".parse().unwrap());
        headers.insert(header::CONTENT_TYPE, "text/plain".parse().unwrap());
        strip_connection_fields(&mut headers);
        assert_eq!(headers.len(), 1, "{headers:?}");
        assert!(headers.contains_key(header::CONTENT_TYPE));
    }
}
