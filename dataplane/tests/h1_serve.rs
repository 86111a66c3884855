//! duet's own HTTP/1.1 server path (on unless `DUET_H1_SERVER=0`): a plain connection's bodyless
//! keep-alive requests reach the handler without hyper's server (their body is
//! `ClientBody::Empty`), pipelined requests are answered in order on one connection with the
//! response head hyper would write, and a request the path does not take (a body, an upgrade)
//! goes to hyper's server with the bytes already read, answered as before. Over real sockets on
//! 127.0.0.1 and [::1], a listener served by `listen::serve` with a handler that answers with the
//! request's method, target, body kind and client family.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use dataplane::client_body::ClientBody;
use dataplane::forwarded::TrustedProxies;
use dataplane::listen::{self, AnyBody, ConnInfo, ServeOptions};
use http_body_util::{BodyExt, Full};
use hyper::{Request, Response};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::watch;

/// Answers `method target body-kind family`; the body kind says which server read the request.
async fn answer(
    req: Request<ClientBody>,
    conn: Arc<ConnInfo>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let kind = match req.body() {
        ClientBody::Empty => "own",
        ClientBody::Hyper(_) => "hyper",
        _ => "other",
    };
    let method = req.method().clone();
    let target = req.uri().clone();
    let body = req.into_body().collect().await.map(|b| b.to_bytes());
    let read = body.map(|b| b.len()).unwrap_or(0);
    let text = format!("{method} {target} {kind} {read} {:?}", conn.family);
    let mut response = Response::new(Full::new(Bytes::from(text)));
    if target.path() == "/http10" {
        // As a pod's HTTP/1.0 answer is relayed.
        *response.version_mut() = http::Version::HTTP_10;
    }
    Ok(response)
}

/// A listener on `ip` (port 0) served with [`answer`], the path on (as by default, whatever
/// the environment says); stops on drop of the returned sender.
fn serve(ip: &str) -> (SocketAddr, watch::Sender<bool>) {
    std::env::set_var("DUET_H1_SERVER", "1");
    let listener = listen::bind(SocketAddr::new(ip.parse().unwrap(), 0)).unwrap();
    let addr = listener.local_addr().unwrap();
    let options = ServeOptions {
        header_read_timeout: Duration::from_secs(10),
        keepalive_timeout: Duration::from_secs(10),
        drain_timeout: Duration::from_secs(2),
        tls: None,
        proxy_protocol: None,
        trusted_proxies: Arc::new(TrustedProxies::default()),
        connections: None,
        proxy_protocol_from: None,
        max_connections: None,
        handshakes: None,
        gateway_port: None,
    };
    let (stop, stopped) = watch::channel(false);
    tokio::spawn(listen::serve(listener, options, AnyBody(answer), stopped));
    (addr, stop)
}

/// One response: its head (status line and fields, as sent) and its body (by `content-length`).
async fn response(reader: &mut BufReader<TcpStream>) -> (String, String) {
    let mut head = String::new();
    loop {
        let mut line = String::new();
        let n = tokio::time::timeout(Duration::from_secs(5), reader.read_line(&mut line))
            .await
            .expect("a response in time")
            .unwrap();
        assert!(n > 0, "connection closed after {head:?}");
        if line == "\r\n" {
            break;
        }
        head.push_str(&line);
    }
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length: "))
        .expect("content-length")
        .parse()
        .unwrap();
    let mut body = vec![0; length];
    reader.read_exact(&mut body).await.unwrap();
    (head, String::from_utf8(body).unwrap())
}

/// The head without its `date` field (checked for shape, then left out).
fn without_date(head: &str) -> String {
    let date = head
        .lines()
        .find_map(|l| l.strip_prefix("date: "))
        .expect("a date field");
    assert!(date.ends_with(" GMT") && date.len() == 29, "{date:?}");
    head.lines()
        .filter(|l| !l.starts_with("date: "))
        .map(|l| format!("{l}\r\n"))
        .collect()
}

async fn pipelined_requests_are_answered_in_order_by_the_own_path(ip: &str, family: &str) {
    let (addr, _stop) = serve(ip);
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET /one HTTP/1.1\r\nHost: a\r\n\r\nGET /two?x=1 HTTP/1.1\r\nHost: a\r\n\r\n")
        .await
        .unwrap();
    let mut reader = BufReader::new(stream);
    for (target, sent) in [("/one", 0), ("/two?x=1", 0)] {
        let (head, body) = response(&mut reader).await;
        let text = format!("GET {target} own {sent} {family}");
        assert_eq!(
            without_date(&head),
            format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n", text.len())
        );
        assert_eq!(body, text);
    }
    // Kept alive: a third request later on the same connection.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let stream = reader.get_mut();
    stream
        .write_all(b"HEAD /three HTTP/1.1\r\nHost: a\r\n\r\nGET /four HTTP/1.1\r\nHost: a\r\n\r\n")
        .await
        .unwrap();
    let mut head = String::new();
    while !head.ends_with("\r\n\r\n") {
        reader.read_line(&mut head).await.unwrap();
    }
    let text = format!("HEAD /three own 0 {family}");
    assert!(
        without_date(&head).starts_with(&format!(
            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n",
            text.len()
        )),
        "{head:?}"
    );
    let (_, body) = response(&mut reader).await;
    assert_eq!(body, format!("GET /four own 0 {family}"));
}

#[tokio::test]
async fn pipelined_requests_are_answered_in_order_by_the_own_path_ipv4() {
    pipelined_requests_are_answered_in_order_by_the_own_path("127.0.0.1", "V4").await;
}

#[tokio::test]
async fn pipelined_requests_are_answered_in_order_by_the_own_path_ipv6() {
    pipelined_requests_are_answered_in_order_by_the_own_path("::1", "V6").await;
}

async fn a_request_with_a_body_goes_to_hyper_with_the_bytes_read(ip: &str, family: &str) {
    let (addr, _stop) = serve(ip);
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET /a HTTP/1.1\r\nHost: a\r\n\r\nPOST /b HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhelloGET /c HTTP/1.1\r\nHost: a\r\n\r\n")
        .await
        .unwrap();
    let mut reader = BufReader::new(stream);
    let expected = [
        format!("GET /a own 0 {family}"),
        format!("POST /b hyper 5 {family}"),
        // hyper keeps the connection once it has it.
        format!("GET /c hyper 0 {family}"),
    ];
    for text in expected {
        let (head, body) = response(&mut reader).await;
        assert_eq!(
            without_date(&head),
            format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n", text.len())
        );
        assert_eq!(body, text);
    }
}

#[tokio::test]
async fn a_request_with_a_body_goes_to_hyper_with_the_bytes_read_ipv4() {
    a_request_with_a_body_goes_to_hyper_with_the_bytes_read("127.0.0.1", "V4").await;
}

#[tokio::test]
async fn a_request_with_a_body_goes_to_hyper_with_the_bytes_read_ipv6() {
    a_request_with_a_body_goes_to_hyper_with_the_bytes_read("::1", "V6").await;
}

async fn a_refused_head_is_answered_by_hyper(ip: &str) {
    let (addr, _stop) = serve(ip);
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: a\r\nBad Field: x\r\n\r\n")
        .await
        .unwrap();
    let mut answer = String::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_string(&mut answer))
        .await
        .unwrap()
        .unwrap();
    assert!(
        answer.starts_with("HTTP/1.1 400 Bad Request\r\n"),
        "{answer:?}"
    );
}

#[tokio::test]
async fn a_refused_head_is_answered_by_hyper_ipv4() {
    a_refused_head_is_answered_by_hyper("127.0.0.1").await;
}

#[tokio::test]
async fn a_refused_head_is_answered_by_hyper_ipv6() {
    a_refused_head_is_answered_by_hyper("::1").await;
}

async fn heads_past_the_own_limit_go_to_hyper(ip: &str, family: &str) {
    let (addr, _stop) = serve(ip);
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let fits = format!(
        "GET /big HTTP/1.1\r\nHost: a\r\nX-Fits: {}\r\n\r\n",
        "x".repeat(20 * 1024)
    );
    stream.write_all(fits.as_bytes()).await.unwrap();
    let mut reader = BufReader::new(stream);
    let (_, body) = response(&mut reader).await;
    assert_eq!(body, format!("GET /big hyper 0 {family}"));
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let big = format!(
        "GET /big HTTP/1.1\r\nHost: a\r\nX-Big: {}\r\n\r\n",
        "x".repeat(40 * 1024)
    );
    stream.write_all(big.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer)).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.starts_with("HTTP/1.1 431 Request Header Fields Too Large\r\n"),
        "{answer:?}"
    );
}

#[tokio::test]
async fn heads_past_the_own_limit_go_to_hyper_ipv4() {
    heads_past_the_own_limit_go_to_hyper("127.0.0.1", "V4").await;
}

#[tokio::test]
async fn heads_past_the_own_limit_go_to_hyper_ipv6() {
    heads_past_the_own_limit_go_to_hyper("::1", "V6").await;
}

async fn an_http10_answer_keeps_its_version(ip: &str, family: &str) {
    let (addr, _stop) = serve(ip);
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET /http10 HTTP/1.1\r\nHost: a\r\n\r\n")
        .await
        .unwrap();
    let mut reader = BufReader::new(stream);
    let (head, body) = response(&mut reader).await;
    let text = format!("GET /http10 own 0 {family}");
    assert_eq!(
        without_date(&head),
        format!("HTTP/1.0 200 OK\r\ncontent-length: {}\r\n", text.len())
    );
    assert_eq!(body, text);
}

#[tokio::test]
async fn an_http10_answer_keeps_its_version_ipv4() {
    an_http10_answer_keeps_its_version("127.0.0.1", "V4").await;
}

#[tokio::test]
async fn an_http10_answer_keeps_its_version_ipv6() {
    an_http10_answer_keeps_its_version("::1", "V6").await;
}
