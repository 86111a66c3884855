//! Differential: the same bytes, as a pod's answer to a GET (or a HEAD: the first byte's low
//! bit), to duet's response-head parser and framing (`dataplane/src/h1.rs`, what duet's own
//! HTTP/1.1 client reads heads with) and to hyper's HTTP/1.1 client (over an in-memory duplex).
//! Both must refuse the same heads, take the same ones with the same status, and frame the body
//! the same way (none, a length, chunked, until the close). Informational heads before the final
//! one are skipped by both. duet refuses one head hyper takes: an unasked 101 (a proxy must not
//! switch a connection nobody asked to), left out here.

#![no_main]

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::body::Body;
use hyper_util::rt::TokioIo;
use libfuzzer_sys::fuzz_target;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[allow(dead_code)]
#[path = "../../dataplane/src/h1.rs"]
mod h1;

/// A head's outcome on either side.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    Taken(u16, h1::Framing),
    Refused,
}

fuzz_target!(|data: &[u8]| {
    let Some((&flags, data)) = data.split_first() else {
        return;
    };
    if data.len() > 8 * 1024 {
        return;
    }
    let head_request = flags & 1 == 1;
    // duet's outcome, and the bytes hyper is given: through the end of the final head when
    // duet took it (so a body that needs more bytes fails where one read to the close does not),
    // all of them else.
    let (ours, given) = match duet(data, head_request) {
        Some((Outcome::Taken(101, _), _)) => return,
        Some((outcome, end)) => (outcome, &data[..end]),
        None => (Outcome::Refused, data),
    };
    let theirs = hyper_client(given, head_request);
    assert_eq!(ours, theirs, "{:?}", String::from_utf8_lossy(data));
});

/// duet's outcome and where the final head ends; `None` when refused or incomplete.
fn duet(data: &[u8], head_request: bool) -> Option<(Outcome, usize)> {
    let mut at = 0;
    loop {
        let mut slots = h1::header_slots();
        let head = h1::parse_response(&data[at..], &mut slots).ok()??;
        at += head.len;
        if head.status == 101 {
            // Refused by duet's client before its framing is read (hyper's switches).
            return Some((Outcome::Taken(101, h1::Framing::Empty), at));
        }
        if (100..200).contains(&head.status) {
            continue;
        }
        return match h1::response_framing(head.status, head.http11, &head.fields, head_request) {
            Ok((framing, _)) => Some((Outcome::Taken(head.status, framing), at)),
            Err(_) => None,
        };
    }
}

/// hyper's client sending a GET (or HEAD) and reading `data` as the answer, then the close.
fn hyper_client(data: &[u8], head_request: bool) -> Outcome {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    rt.block_on(async {
        let (client, mut server) = tokio::io::duplex(64 * 1024);
        let Ok((mut sender, conn)) =
            hyper::client::conn::http1::handshake::<_, Empty<Bytes>>(TokioIo::new(client)).await
        else {
            return Outcome::Refused;
        };
        tokio::spawn(conn);
        let data = data.to_vec();
        tokio::spawn(async move {
            let mut buf = [0u8; 1024];
            let _ = server.read(&mut buf).await;
            let _ = server.write_all(&data).await;
            let _ = server.shutdown().await;
            // Held open for reads until the client is done.
            while let Ok(n) = server.read(&mut buf).await {
                if n == 0 {
                    break;
                }
            }
        });
        let method = if head_request { "HEAD" } else { "GET" };
        let request = http::Request::builder()
            .method(method)
            .uri("/")
            .header("host", "pod")
            .body(Empty::new())
            .unwrap();
        let wait = Duration::from_secs(5);
        let Ok(Ok(response)) = tokio::time::timeout(wait, sender.send_request(request)).await
        else {
            return Outcome::Refused;
        };
        let status = response.status().as_u16();
        let mut body = response.into_body();
        let framing = if body.is_end_stream() {
            h1::Framing::Empty
        } else if let Some(n) = body.size_hint().exact() {
            h1::Framing::Length(n)
        } else {
            // Chunked coding fails at the close right after the head; a body read to the close
            // ends there.
            match tokio::time::timeout(wait, async {
                while let Some(frame) = body.frame().await {
                    frame?;
                }
                Ok::<_, hyper::Error>(())
            })
            .await
            {
                Ok(Ok(())) => h1::Framing::Close,
                _ => h1::Framing::Chunked,
            }
        };
        Outcome::Taken(status, framing)
    })
}
