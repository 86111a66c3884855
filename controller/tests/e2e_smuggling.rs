//! End to end, over real sockets on 127.0.0.1 and [::1]: a request-smuggling corpus against the
//! real `duet`. A raw upstream records exactly the bytes duet sent; every hostile request is
//! either refused (4xx, a reset stream, a closed connection) or reaches the upstream as exactly
//! one well-framed HTTP/1.1 request. Also: the validated host (Host vs absolute-form and
//! `:authority`, no path injected through `Host` to h2c), path normalisation, WebSocket-only upgrades
//! with their idle timeout and drain, and upstream responses framed by both Transfer-Encoding and
//! Content-Length (relayed whole, and the pod's connection not used again, for HTTP/1.1 and
//! HTTP/2 clients alike).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use conformance::client::{self, Conn};
use conformance::fleet::static_service;
use conformance::raw::{self, Framed, H2Outcome, RawUpstream};
use conformance::tls;
use conformance::{
    Duet, DuetBuilder, Family, Fleet, Ingress, ManifestDir, PathType, PodSpec, PortRef,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const DUET: &str = env!("CARGO_BIN_EXE_duet");
const NS: &str = "smuggle";

const OK: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok";
/// Both framings: the chunked body is 11 bytes, the length says 5.
const TE_AND_CL: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\nb\r\nhello world\r\n0\r\n\r\n";
/// Switches protocols whatever was asked.
const SWITCH: &[u8] =
    b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n";

struct Setup {
    raw: RawUpstream,
    te_cl: RawUpstream,
    switch: RawUpstream,
    _fleets: Vec<Fleet>,
    _dir: ManifestDir,
    duet: Duet,
}

async fn setup() -> anyhow::Result<Setup> {
    let raw = RawUpstream::start(OK).await?;
    let te_cl = RawUpstream::start(TE_AND_CL).await?;
    let switch = RawUpstream::start(SWITCH).await?;
    let echo = Fleet::start(NS, "echo", &[PodSpec::dual("echo")])?;
    let h2c = Fleet::start(NS, "h2c", &[PodSpec::dual("h2c")])?;
    let dir = ManifestDir::with_class()?;
    let mut docs = static_service(NS, "raw", raw.addr(Family::V4), raw.addr(Family::V6));
    docs.extend(static_service(
        NS,
        "te-cl",
        te_cl.addr(Family::V4),
        te_cl.addr(Family::V6),
    ));
    docs.extend(static_service(
        NS,
        "switch",
        switch.addr(Family::V4),
        switch.addr(Family::V6),
    ));
    docs.extend(echo.manifests());
    docs.extend(h2c.manifests_with_app_protocol("kubernetes.io/h2c"));
    dir.write("services.yaml", &docs)?;
    let http = || PortRef::Name("http".into());
    let main = Ingress::new(NS, "main")
        .host("smuggle.test", "raw")
        .host("tecl.test", "te-cl")
        .host("switch.test", "switch")
        .path(
            Some("api.example.com"),
            PathType::Prefix,
            "/public",
            "h2c",
            http(),
        )
        .path(
            Some("paths.test"),
            PathType::Prefix,
            "/public",
            "echo",
            http(),
        );
    let cert = tls::cert(&["redir.test"]);
    dir.write("secret.yaml", &[tls::secret(NS, "redir-cert", &cert)])?;
    let redirected = Ingress::new(NS, "redir")
        .host("redir.test", "echo")
        .tls(&["redir.test"], "redir-cert");
    let ws = Ingress::new(NS, "ws")
        .annotation("duet.dev/proxy-read-timeout", "1s")
        .host("ws.test", "echo");
    dir.write(
        "ingress.yaml",
        &[main.build(), ws.build(), redirected.build()],
    )?;
    let duet = DuetBuilder::new(DUET, dir.path()).start().await?;
    Ok(Setup {
        raw,
        te_cl,
        switch,
        _fleets: vec![echo, h2c],
        _dir: dir,
        duet,
    })
}

/// What reached the raw upstream for one case: nothing, or exactly one well-framed request, or
/// a well-formed request whose body stops short (an aborted request; `settled` has seen its
/// connection closed). Returns the request when there was a complete one.
async fn upstream_saw(raw: &RawUpstream, what: &str) -> anyhow::Result<Option<raw::Request>> {
    let conns = raw.settled().await?;
    raw.clear();
    let used: Vec<_> = conns.into_iter().filter(|c| !c.bytes.is_empty()).collect();
    match used.as_slice() {
        [] => Ok(None),
        [one] => match raw::framed(&one.bytes) {
            Ok(Framed::One(req)) => Ok(Some(req)),
            Ok(Framed::Truncated) => Ok(None),
            Err(e) => panic!(
                "{what}: not one well-framed request: {e:#}\n{}",
                String::from_utf8_lossy(&one.bytes)
            ),
        },
        many => panic!("{what}: {} upstream connections: {many:?}", many.len()),
    }
}

/// HTTP/1.1 requests that must be refused with 400 or reach the upstream as exactly one
/// well-framed request; `refused` marks those that must be refused.
const H1_CORPUS: &[(&str, &[u8], bool)] = &[
    (
        "CL.TE",
        b"POST / HTTP/1.1\r\nHost: smuggle.test\r\nContent-Length: 6\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /admin HTTP/1.1\r\nHost: smuggle.test\r\n\r\n",
        false,
    ),
    (
        "TE.CL",
        b"POST / HTTP/1.1\r\nHost: smuggle.test\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n8\r\nSMUGGLED\r\n0\r\n\r\n",
        false,
    ),
    (
        "TE xchunked",
        b"POST / HTTP/1.1\r\nHost: smuggle.test\r\nTransfer-Encoding: xchunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n",
        true,
    ),
    (
        "TE tab before the value",
        b"POST / HTTP/1.1\r\nHost: smuggle.test\r\nTransfer-Encoding:\tchunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
        false,
    ),
    (
        "TE vertical tab",
        b"POST / HTTP/1.1\r\nHost: smuggle.test\r\nTransfer-Encoding: \x0bchunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n",
        true,
    ),
    (
        "TE space before the colon",
        b"POST / HTTP/1.1\r\nHost: smuggle.test\r\nTransfer-Encoding : chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n",
        true,
    ),
    (
        "TE duplicate, chunked twice",
        b"POST / HTTP/1.1\r\nHost: smuggle.test\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
        false,
    ),
    (
        "TE duplicate, identity last",
        b"POST / HTTP/1.1\r\nHost: smuggle.test\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\nContent-Length: 5\r\n\r\n0\r\n\r\n",
        true,
    ),
    (
        "TE chunked, identity",
        b"POST / HTTP/1.1\r\nHost: smuggle.test\r\nTransfer-Encoding: chunked, identity\r\nContent-Length: 5\r\n\r\n0\r\n\r\n",
        true,
    ),
    (
        "TE obs-fold",
        b"POST / HTTP/1.1\r\nHost: smuggle.test\r\nTransfer-Encoding:\r\n chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n",
        true,
    ),
    (
        "CL duplicate, different",
        b"POST / HTTP/1.1\r\nHost: smuggle.test\r\nContent-Length: 3\r\nContent-Length: 5\r\n\r\nabcde",
        true,
    ),
    (
        "CL duplicate, same",
        b"POST / HTTP/1.1\r\nHost: smuggle.test\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nabcde",
        false,
    ),
    (
        "CL comma-joined",
        b"POST / HTTP/1.1\r\nHost: smuggle.test\r\nContent-Length: 5, 5\r\n\r\nabcde",
        true,
    ),
    (
        "CL comma-joined, different",
        b"POST / HTTP/1.1\r\nHost: smuggle.test\r\nContent-Length: 3, 5\r\n\r\nabcde",
        true,
    ),
    (
        "CL with a sign",
        b"POST / HTTP/1.1\r\nHost: smuggle.test\r\nContent-Length: +5\r\n\r\nabcde",
        true,
    ),
    (
        "bare LF line ends",
        b"POST / HTTP/1.1\nHost: smuggle.test\nContent-Length: 3\n\nabc",
        false,
    ),
    (
        "bare LF in chunk framing",
        b"POST / HTTP/1.1\r\nHost: smuggle.test\r\nTransfer-Encoding: chunked\r\n\r\n3\nabc\n0\n\n",
        false,
    ),
    (
        "obs-fold in a header",
        b"GET / HTTP/1.1\r\nHost: smuggle.test\r\nX-A: 1\r\n X-B: 2\r\n\r\n",
        true,
    ),
    (
        "two Host headers",
        b"GET / HTTP/1.1\r\nHost: smuggle.test\r\nHost: other.test\r\n\r\n",
        true,
    ),
    (
        "absolute-form disagreeing with Host",
        b"GET http://smuggle.test/ HTTP/1.1\r\nHost: other.test\r\n\r\n",
        true,
    ),
    (
        "Host with a path",
        b"GET http://smuggle.test/ HTTP/1.1\r\nHost: smuggle.test/admin?\r\n\r\n",
        true,
    ),
    (
        "no Host",
        b"GET / HTTP/1.1\r\n\r\n",
        true,
    ),
    (
        "NUL in a header",
        b"GET / HTTP/1.1\r\nHost: smuggle.test\r\nX-A: a\0b\r\n\r\n",
        true,
    ),
];

async fn h1_corpus(family: Family) -> anyhow::Result<()> {
    let s = setup().await?;
    let to = s.duet.http(family);
    for (name, bytes, must_refuse) in H1_CORPUS {
        let what = format!("{family} {name}");
        let answer = raw::exchange(to, bytes).await?;
        let statuses = raw::statuses(&answer);
        let seen = upstream_saw(&s.raw, &what).await?;
        // One answer at most: nothing smuggled behind the first request came back.
        assert!(statuses.len() <= 1, "{what}: {statuses:?}");
        let refused = seen.is_none();
        if *must_refuse {
            assert!(refused, "{what}: reached the upstream: {seen:?}");
            assert!(
                statuses.iter().all(|s| (400..500).contains(s)),
                "{what}: {statuses:?}"
            );
        } else if let Some(req) = &seen {
            assert_eq!(req.values("host"), ["smuggle.test"], "{what}");
            assert_eq!(statuses, [200], "{what}");
        }
    }
    // The absolute form agreeing with Host is one origin-form request for the routed host.
    let answer = raw::exchange(
        to,
        b"GET http://SMUGGLE.test/a?b HTTP/1.1\r\nHost: smuggle.TEST\r\nConnection: close\r\n\r\n",
    )
    .await?;
    assert_eq!(raw::statuses(&answer), [200], "{family}");
    let req = upstream_saw(&s.raw, "absolute form")
        .await?
        .expect("forwarded");
    assert_eq!(req.target, "/a?b");
    assert_eq!(req.values("host"), ["SMUGGLE.test"]);
    assert_eq!(req.values("x-forwarded-host"), ["SMUGGLE.test"]);
    let forwarded = req.values("forwarded").join(",");
    assert!(
        forwarded.ends_with(";host=SMUGGLE.test;proto=http"),
        "{forwarded}"
    );
    Ok(())
}

/// An HTTP/2 case: its name, the header fields of stream 1 and its DATA frames.
type H2Case = (
    &'static str,
    Vec<(&'static [u8], &'static [u8])>,
    Vec<&'static [u8]>,
);

async fn h2_downgrade(family: Family) -> anyhow::Result<()> {
    let s = setup().await?;
    let to = s.duet.http(family);
    let base: [(&[u8], &[u8]); 4] = [
        (b":method", b"POST"),
        (b":scheme", b"http"),
        (b":authority", b"smuggle.test"),
        (b":path", b"/"),
    ];
    let with = |extra: &[(&'static [u8], &'static [u8])]| {
        let mut f = base.to_vec();
        f.extend_from_slice(extra);
        f
    };
    // A well-formed request goes through: the raw client works.
    let outcome = raw::h2_request(to, &with(&[(b"content-length", b"5")]), &[b"hello"]).await?;
    assert_eq!(outcome, H2Outcome::Response, "{family}");
    let req = upstream_saw(&s.raw, "h2 control")
        .await?
        .expect("forwarded");
    assert_eq!(req.body, b"hello");
    assert_eq!(req.values("content-length"), ["5"]);
    let cases: Vec<H2Case> = vec![
        (
            "content-length below the body",
            with(&[(b"content-length", b"5")]),
            vec![b"hello world"],
        ),
        (
            "content-length above the body",
            with(&[(b"content-length", b"50")]),
            vec![b"hello world"],
        ),
        (
            "transfer-encoding in h2",
            with(&[(b"transfer-encoding", b"chunked")]),
            vec![b"0\r\n\r\nGET /admin HTTP/1.1\r\nHost: smuggle.test\r\n\r\n"],
        ),
        (
            "CRLF in a header value",
            with(&[(b"x-a", b"1\r\nTransfer-Encoding: chunked")]),
            vec![b"0\r\n\r\n"],
        ),
        (
            "LF in a header value",
            with(&[(b"x-a", b"1\nHost: other.test")]),
            vec![],
        ),
        (
            "CRLF in :path",
            vec![
                (b":method", b"GET"),
                (b":scheme", b"http"),
                (b":authority", b"smuggle.test"),
                (b":path", b"/ HTTP/1.1\r\nHost: other.test\r\n\r\nGET /x"),
            ],
            vec![],
        ),
        (
            "host disagreeing with :authority",
            with(&[(b"host", b"other.test")]),
            vec![],
        ),
        (
            ":authority with a path",
            vec![
                (b":method", b"GET"),
                (b":scheme", b"http"),
                (b":authority", b"smuggle.test/admin?"),
                (b":path", b"/"),
            ],
            vec![],
        ),
        (
            "connection header in h2",
            with(&[(b"connection", b"keep-alive")]),
            vec![],
        ),
        (
            "upper-case header name",
            with(&[(b"Transfer-Encoding", b"chunked")]),
            vec![],
        ),
    ];
    for (name, fields, body) in cases {
        let what = format!("{family} h2 {name}");
        let outcome = raw::h2_request(to, &fields, &body).await?;
        let seen = upstream_saw(&s.raw, &what).await?;
        assert!(seen.is_none(), "{what}: reached the upstream: {seen:?}");
        // Host faults may be answered (400) rather than reset; framing faults are reset.
        if !name.contains("host") && !name.contains("authority") {
            assert_ne!(outcome, H2Outcome::Response, "{what}: answered");
        }
    }
    // Refused, or forwarded with one framing (the checker allows one Content-Length only).
    for (name, fields) in [
        (
            "content-length twice",
            with(&[(b"content-length", b"5"), (b"content-length", b"5")]),
        ),
        ("content-length 05", with(&[(b"content-length", b"05")])),
    ] {
        let what = format!("{family} h2 {name}");
        raw::h2_request(to, &fields, &[b"hello"]).await?;
        if let Some(req) = upstream_saw(&s.raw, &what).await? {
            assert_eq!(req.values("content-length"), ["5"], "{what}");
            assert_eq!(req.body, b"hello", "{what}");
        }
    }
    Ok(())
}

/// A path injected through `Host`: an absolute-form request with `Host: x/admin?` to an h2c
/// upstream must not reach the pod with `:path /admin?/public`.
async fn host_cannot_inject_a_path(family: Family) -> anyhow::Result<()> {
    let s = setup().await?;
    let to = s.duet.http(family);
    for host in [
        "x/admin?",
        "api.example.com/admin?",
        "x",
        "api.example.com:8080@evil",
    ] {
        let request = format!(
            "GET http://api.example.com/public HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
        );
        let answer = raw::exchange(to, request.as_bytes()).await?;
        assert_eq!(raw::statuses(&answer), [400], "{family} Host {host}");
    }
    let mut conn = Conn::http1(to).await?;
    let reply = conn.get("x/admin?", "/public").await?;
    assert_eq!(reply.status, 400, "{family}: {}", reply.text());
    // The agreeing form reaches the pod with the request's own path and the routed host.
    let answer = raw::exchange(
        to,
        b"GET http://api.example.com/public?q=1 HTTP/1.1\r\nHost: api.example.com\r\nConnection: close\r\n\r\n",
    )
    .await?;
    let text = String::from_utf8_lossy(&answer);
    assert_eq!(raw::statuses(&answer), [200], "{family}: {text}");
    assert!(
        text.contains("/public?q=1") && !text.contains("/admin"),
        "{family}: {text}"
    );
    let mut conn = Conn::http2(to).await?;
    let reply = conn.get("api.example.com", "/public/x?q=1").await?;
    assert_eq!(reply.status, 200, "{family}: {}", reply.text());
    let echo = reply.echo()?;
    assert_eq!(echo.path, "/public/x?q=1", "{family}");
    assert_eq!(echo.host, "api.example.com", "{family}");
    Ok(())
}

async fn paths_are_normalised(family: Family) -> anyhow::Result<()> {
    let s = setup().await?;
    let to = s.duet.http(family);
    let mut conn = Conn::http1(to).await?;
    for (path, status, forwarded) in [
        (
            "/public//a/./b/../c?x=/../",
            200,
            Some("/public/a/c?x=/../"),
        ),
        ("//public///", 200, Some("/public/")),
        ("/public/../admin", 404, None),
        ("/x/../public/y", 200, Some("/public/y")),
        ("/public/%2e%2e/admin", 400, None),
        ("/public/%2E%2E/admin", 400, None),
        ("/public/.%2e/admin", 400, None),
        ("/public/..%2Fadmin", 400, None),
        ("/public/a%2Fb", 200, Some("/public/a%2Fb")),
    ] {
        let reply = conn.get("paths.test", path).await?;
        assert_eq!(reply.status, status, "{family} {path}: {}", reply.text());
        if let Some(want) = forwarded {
            assert_eq!(reply.echo()?.path, want, "{family} {path}");
        }
        if conn.is_closed() {
            conn = Conn::http1(to).await?;
        }
    }
    Ok(())
}

async fn only_websocket_upgrades_tunnel(family: Family) -> anyhow::Result<()> {
    let s = setup().await?;
    let to = s.duet.http(family);
    for (upgrade, connection) in [("h2c", "Upgrade, HTTP2-Settings"), ("foo/1", "upgrade")] {
        let request = format!(
            "GET / HTTP/1.1\r\nHost: smuggle.test\r\nConnection: {connection}\r\nUpgrade: {upgrade}\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n"
        );
        let answer = raw::exchange(to, request.as_bytes()).await?;
        assert_eq!(raw::statuses(&answer), [200], "{family} {upgrade}");
        let req = upstream_saw(&s.raw, upgrade).await?.expect("forwarded");
        assert!(req.values("upgrade").is_empty(), "{family}: {req:?}");
        assert!(req.values("http2-settings").is_empty(), "{family}: {req:?}");
        assert!(
            req.values("connection")
                .iter()
                .all(|v| !v.to_ascii_lowercase().contains("upgrade")),
            "{family}: {req:?}"
        );
    }
    // An upstream switching protocols unasked is a bad gateway, not a tunnel.
    let answer = raw::exchange(
        to,
        b"GET / HTTP/1.1\r\nHost: switch.test\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n",
    )
    .await?;
    assert_eq!(raw::statuses(&answer), [502], "{family}");
    s.switch.clear();
    Ok(())
}

async fn tunnels_close_when_idle(family: Family) -> anyhow::Result<()> {
    let s = setup().await?;
    let (reply, io) = client::upgrade(s.duet.http(family), "ws.test", "/ws").await?;
    assert_eq!(reply.status, 101, "{family}");
    let mut io = io.expect("upgraded");
    // Busy for three times the 1 s idle timeout: stays open.
    let mut last = std::time::Instant::now();
    for _ in 0..10 {
        io.write_all(b"ping").await?;
        let mut back = [0u8; 4];
        tokio::time::timeout(client::REQUEST_TIMEOUT, io.read_exact(&mut back)).await??;
        assert_eq!(&back, b"ping");
        last = std::time::Instant::now();
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let metrics = s.duet.admin_get(family, "/metrics").await?.text();
    let active = format!("duet_tunnels_active{{client_family=\"{family}\"}} 1");
    assert!(metrics.contains(&active), "{family}: {metrics}");
    // Then idle: closed after the timeout (1 s after the last byte relayed).
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), io.read_to_end(&mut rest)).await??;
    assert!(last.elapsed() >= Duration::from_millis(800), "{family}");
    let metrics = s.duet.admin_get(family, "/metrics").await?.text();
    assert!(
        metrics.contains("duet_tunnels_closed_total{reason=\"idle\"} 1"),
        "{family}: {metrics}"
    );
    assert!(metrics.contains(&active.replace(" 1", " 0")), "{family}");
    Ok(())
}

async fn tunnels_drain_on_shutdown(family: Family) -> anyhow::Result<()> {
    let mut s = setup().await?;
    let (reply, io) = client::upgrade(s.duet.http(family), "ws.test", "/ws").await?;
    assert_eq!(reply.status, 101, "{family}");
    let mut io = io.expect("upgraded");
    let kill = tokio::process::Command::new("kill")
        .arg("-TERM")
        .arg(s.duet.pid().to_string())
        .status()
        .await?;
    assert!(kill.success());
    // Draining: the tunnel keeps working (the drain waits for it) ...
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        io.write_all(b"still").await?;
        let mut back = [0u8; 5];
        tokio::time::timeout(client::REQUEST_TIMEOUT, io.read_exact(&mut back)).await??;
        assert_eq!(&back, b"still", "{family}");
    }
    s.duet.check_running()?;
    // ... and once the client closes it, duet exits.
    io.shutdown().await?;
    drop(io);
    assert!(
        s.duet.terminate(Duration::from_secs(20))?,
        "{family}: exited"
    );
    Ok(())
}

async fn responses_with_te_lose_content_length(family: Family) -> anyhow::Result<()> {
    let s = setup().await?;
    let to = s.duet.http(family);
    let answer = raw::exchange(
        to,
        b"GET / HTTP/1.1\r\nHost: tecl.test\r\nConnection: close\r\n\r\n",
    )
    .await?;
    let text = String::from_utf8_lossy(&answer).to_ascii_lowercase();
    assert_eq!(raw::statuses(&answer), [200], "{family}: {text}");
    let head = &text[..text.find("\r\n\r\n").expect("a head")];
    assert!(!head.contains("content-length: 5"), "{family}: {text}");
    assert!(text.contains("hello world"), "{family}: {text}");
    // Over HTTP/2 too: the whole body, no stale length.
    let mut conn = Conn::http2(to).await?;
    let reply = conn.get("tecl.test", "/").await?;
    assert_eq!(reply.status, 200, "{family}");
    assert_eq!(&reply.body[..], b"hello world", "{family}");
    assert_ne!(reply.header("content-length"), Some("5"), "{family}");
    s.te_cl.clear();
    Ok(())
}

/// The HTTPS redirect names the validated host and the normalised path.
async fn redirects_use_the_validated_host_and_path(family: Family) -> anyhow::Result<()> {
    let s = setup().await?;
    let to = s.duet.http(family);
    let port = s.duet.https(family).port();
    let mut conn = Conn::http1(to).await?;
    let reply = conn.get("redir.test", "/a/../b//c?q=/../").await?;
    assert_eq!(reply.status, 308, "{family}: {}", reply.text());
    assert_eq!(
        reply.header("location"),
        Some(format!("https://redir.test:{port}/b/c?q=/../").as_str()),
        "{family}"
    );
    for host in [
        "redir.test/evil?",
        "redir.test@evil.test",
        "evil.test/redir.test",
    ] {
        let mut conn = Conn::http1(to).await?;
        let reply = conn.get(host, "/").await?;
        assert_eq!(
            reply.status,
            400,
            "{family} {host}: {:?}",
            reply.header("location")
        );
    }
    Ok(())
}

/// Framed both ways, on a connection the pod keeps open.
const TE_AND_CL_KEPT: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\nb\r\nhello world\r\n0\r\n\r\n";

/// A pod on `ip` answering every request head of a connection with `answer`, keeping the
/// connection open; the number of connections it accepted.
async fn keep_alive_pod(
    ip: std::net::IpAddr,
    answer: &'static [u8],
) -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind((ip, 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let (mut seen, mut buf) = (Vec::new(), [0u8; 4096]);
                loop {
                    while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                        match stream.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => seen.extend_from_slice(&buf[..n]),
                        }
                    }
                    seen.clear();
                    if stream.write_all(answer).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, accepted)
}

/// HTTP/2 GETs to a plain-HTTP pod go by duet's own HTTP/1.1 client, as HTTP/1.1 ones do: a
/// response framed by both Transfer-Encoding and Content-Length (a response-splitting attempt)
/// is relayed whole, and the connection it came on is not used again (hyper's client, which
/// other requests take, would reuse it). Two requests of each protocol: four pod connections.
async fn h2_and_h1_gets_do_not_reuse_a_connection_framed_both_ways(
    family: Family,
) -> anyhow::Result<()> {
    let (v4, v4_accepted) = keep_alive_pod(Family::V4.loopback(), TE_AND_CL_KEPT).await;
    let (v6, v6_accepted) = keep_alive_pod(Family::V6.loopback(), TE_AND_CL_KEPT).await;
    let dir = ManifestDir::with_class()?;
    dir.write("services.yaml", &static_service(NS, "kept", v4, v6))?;
    let ingress = Ingress::new(NS, "kept").host("kept.test", "kept");
    dir.write("ingress.yaml", &[ingress.build()])?;
    let duet = DuetBuilder::new(DUET, dir.path()).start().await?;
    let to = duet.http(family);
    let accepted = match family {
        Family::V4 => v4_accepted,
        Family::V6 => v6_accepted,
    };
    for (protocol, mut conn) in [
        ("h1", Conn::http1(to).await?),
        ("h2", Conn::http2(to).await?),
    ] {
        for i in 1..=2 {
            let reply = conn.get("kept.test", "/").await?;
            assert_eq!(reply.status, 200, "{family} {protocol} {i}");
            assert_eq!(&reply.body[..], b"hello world", "{family} {protocol} {i}");
        }
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 4, "{family}");
    Ok(())
}

conformance::both_families!(
    redirects_use_the_validated_host_and_path,
    h1_corpus,
    h2_downgrade,
    host_cannot_inject_a_path,
    paths_are_normalised,
    only_websocket_upgrades_tunnel,
    tunnels_close_when_idle,
    tunnels_drain_on_shutdown,
    responses_with_te_lose_content_length,
    h2_and_h1_gets_do_not_reuse_a_connection_framed_both_ways,
);
