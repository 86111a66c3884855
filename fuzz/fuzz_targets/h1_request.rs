//! Differential: the same bytes to duet's request-head parser (`dataplane/src/h1.rs`) and to
//! hyper's HTTP/1.1 server (over an in-memory duplex, on a current-thread runtime whose clock
//! advances when everything waits). For every request head in the bytes (pipelined ones too,
//! while the one before has no body and keeps the connection), both must decide the same: taken
//! by both (same method, target, fields, body framing, keep-alive and upgrade), refused by both
//! with the same status, or neither answering (a partial head, or a close without an answer).

#![no_main]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Empty;
use hyper::body::{Body, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use libfuzzer_sys::fuzz_target;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[allow(dead_code)]
#[path = "../../dataplane/src/h1.rs"]
mod h1;

/// Inputs at most this long: hyper's first reads stay under its buffer limit (duet's 32 KiB), so
/// the head-size limit is not what is compared.
const MAX_INPUT: usize = 8 * 1024;

/// What hyper's service saw of one request.
#[derive(Debug, PartialEq, Eq)]
struct Seen {
    method: String,
    uri: http::Uri,
    /// Fields but `Content-Length` (hyper drops repeated and overridden ones), sorted.
    fields: Vec<(String, Vec<u8>)>,
    framing: h1::Framing,
    upgrade: bool,
}

/// One request's outcome on either side.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    Taken(Seen, bool),
    Refused(u16),
    NoAnswer,
}

fuzz_target!(|data: &[u8]| {
    if data.len() > MAX_INPUT {
        return;
    }
    let ours = duet(data);
    let theirs = hyper_server(data);
    // Compared up to the first request that closes the connection, has a body or asks an
    // upgrade (what follows it is read by the body's or the upgrade's own framing).
    for (i, our) in ours.iter().enumerate() {
        let their = theirs.get(i).unwrap_or(&Outcome::NoAnswer);
        assert_eq!(
            our,
            their,
            "request {i} of {:?}",
            String::from_utf8_lossy(data)
        );
    }
});

/// duet's parser over the bytes: each head's outcome while the connection goes on.
fn duet(mut data: &[u8]) -> Vec<Outcome> {
    let mut out = Vec::new();
    loop {
        let mut slots = h1::header_slots();
        match h1::parse_request(data, &mut slots) {
            Ok(None) | Err(h1::Refused(None)) => {
                out.push(Outcome::NoAnswer);
                return out;
            }
            Err(h1::Refused(Some(status))) => {
                out.push(Outcome::Refused(status));
                return out;
            }
            Ok(Some(head)) => {
                let mut fields: Vec<_> = head
                    .headers
                    .iter()
                    .filter(|h| !h.name.eq_ignore_ascii_case("content-length"))
                    .map(|h| (h.name.to_ascii_lowercase(), h.value.to_vec()))
                    .collect();
                fields.sort();
                let seen = Seen {
                    method: head.method.to_owned(),
                    uri: http::Uri::try_from(head.target).expect("a target the parser took"),
                    fields,
                    framing: head.framing,
                    upgrade: head.upgrade,
                };
                let goes_on =
                    head.keep_alive && head.framing == h1::Framing::Empty && !head.upgrade;
                out.push(Outcome::Taken(seen, head.keep_alive));
                if !goes_on {
                    return out;
                }
                data = &data[head.len..];
            }
        }
    }
}

/// hyper's server over the bytes: each request its service saw, or the refusal it wrote.
fn hyper_server(data: &[u8]) -> Vec<Outcome> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    rt.block_on(async {
        let (mut client, server) = tokio::io::duplex(64 * 1024);
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let bodies: Arc<Mutex<Vec<Incoming>>> = Arc::default();
        let (record, keep) = (seen.clone(), bodies.clone());
        let service = hyper::service::service_fn(move |req: Request<Incoming>| {
            record.lock().unwrap().push(seen_of(&req));
            // Kept, not dropped: a dropped body makes hyper close the connection.
            keep.lock().unwrap().push(req.into_body());
            async { Ok::<_, std::convert::Infallible>(Response::new(Empty::<Bytes>::new())) }
        });
        let conn = hyper::server::conn::http1::Builder::new()
            .max_buf_size(32 * 1024)
            .serve_connection(TokioIo::new(server), service)
            .with_upgrades();
        tokio::spawn(conn);
        client.write_all(data).await.unwrap();
        let mut answer = Vec::new();
        let mut buf = [0u8; 4096];
        while let Ok(Ok(n)) =
            tokio::time::timeout(Duration::from_secs(5), client.read(&mut buf)).await
        {
            if n == 0 {
                break;
            }
            answer.extend_from_slice(&buf[..n]);
        }
        let seen = std::mem::take(&mut *seen.lock().unwrap());
        outcomes(seen, &answer)
    })
}

/// The outcomes from what the service saw and the responses written: a response to a request
/// the service saw says its keep-alive; one more is a refusal.
fn outcomes(seen: Vec<Seen>, mut answer: &[u8]) -> Vec<Outcome> {
    let mut out = Vec::new();
    let mut seen = seen.into_iter();
    while !answer.is_empty() {
        let mut headers = [httparse::EMPTY_HEADER; 16];
        let mut resp = httparse::Response::new(&mut headers);
        let Ok(httparse::Status::Complete(len)) = resp.parse(answer) else {
            panic!("hyper wrote {:?}", String::from_utf8_lossy(answer));
        };
        let status = resp.code.unwrap();
        let connection = |token: &str| {
            resp.headers.iter().any(|h| {
                h.name.eq_ignore_ascii_case("connection")
                    && String::from_utf8_lossy(h.value)
                        .split(',')
                        .any(|t| t.trim().eq_ignore_ascii_case(token))
            })
        };
        let http11 = resp.version == Some(1);
        let keep_alive = if http11 {
            !connection("close")
        } else {
            connection("keep-alive")
        };
        match seen.next() {
            Some(s) => out.push(Outcome::Taken(s, keep_alive)),
            None => out.push(Outcome::Refused(status)),
        }
        answer = &answer[len..];
    }
    // A request the service saw whose answer did not come (an upgrade): taken all the same.
    out.extend(seen.map(|s| Outcome::Taken(s, false)));
    out
}

/// What the service saw of a request.
fn seen_of(req: &Request<Incoming>) -> Seen {
    let body = req.body();
    let framing = if body.is_end_stream() {
        h1::Framing::Empty
    } else {
        match body.size_hint().exact() {
            Some(n) => h1::Framing::Length(n),
            None => h1::Framing::Chunked,
        }
    };
    let mut fields: Vec<_> = req
        .headers()
        .iter()
        .filter(|(name, _)| *name != http::header::CONTENT_LENGTH)
        .map(|(name, value)| (name.as_str().to_owned(), value.as_bytes().to_vec()))
        .collect();
    fields.sort();
    Seen {
        method: req.method().as_str().to_owned(),
        uri: req.uri().clone(),
        fields,
        framing,
        upgrade: req
            .extensions()
            .get::<hyper::upgrade::OnUpgrade>()
            .is_some(),
    }
}
