//! End to end in `--manifests` mode, over real sockets on 127.0.0.1 and [::1]: HTTPRoute
//! `RequestMirror` filters. A mirrored request reaches the mirror backend over the client's
//! family (the other one when the pod has no working address of it), with the head the rule's
//! filters made; the client's answer is the primary's, whether the mirror answers, hangs or
//! refuses; `percent` 0 mirrors nothing; a request with a body is not mirrored (and counted).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use conformance::bytes::Bytes;
use conformance::client::{self, Conn};
use conformance::duet::free_port;
use conformance::fleet::{closed_port, silent_port, static_service};
use conformance::http::{Method, Request};
use conformance::http_body_util::Full;
use conformance::manifests::gateway_class;
use conformance::{DuetBuilder, Family, Fleet, ManifestDir, PodSpec};
use serde_json::{json, Value};
use tokio::sync::mpsc;

const DUET: &str = env!("CARGO_BIN_EXE_duet");
const NS: &str = "e2e";

fn gateway_docs(port: u16) -> Vec<Value> {
    vec![
        gateway_class(),
        json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
            "metadata": {"name": "gw", "namespace": NS},
            "spec": {"gatewayClassName": "duet",
                "listeners": [{"name": "http", "port": port, "protocol": "HTTP"}]}
        }),
    ]
}

/// A rule on `prefix` to the Service `primary`, mirrored to each of `mirrors` (Service name and
/// the `requestMirror` fields besides `backendRef`), with a request header set first.
fn rule(prefix: &str, primary: &str, mirrors: &[(&str, Value)]) -> Value {
    let mut filters = vec![json!({"type": "RequestHeaderModifier",
        "requestHeaderModifier": {"set": [{"name": "X-Mirror-Test", "value": "set"}]}})];
    for (name, extra) in mirrors {
        let mut m = json!({"backendRef": {"name": name, "port": 8080}});
        if let (Some(m), Some(extra)) = (m.as_object_mut(), extra.as_object()) {
            m.extend(extra.clone());
        }
        filters.push(json!({"type": "RequestMirror", "requestMirror": m}));
    }
    json!({
        "matches": [{"path": {"type": "PathPrefix", "value": prefix}}],
        "filters": filters,
        "backendRefs": [{"name": primary, "port": 8080}]
    })
}

fn route(rules: Vec<Value>) -> Value {
    json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
        "metadata": {"name": "mirrored", "namespace": NS},
        "spec": {"parentRefs": [{"name": "gw"}], "rules": rules}
    })
}

/// What a mirror backend saw of one request.
#[derive(Debug)]
struct Seen {
    target: String,
    family: Family,
    header: Option<String>,
}

/// A mirror backend on both loopbacks that reports every request it gets and answers 200.
struct Recorder {
    v4: SocketAddr,
    v6: SocketAddr,
    seen: mpsc::UnboundedReceiver<Seen>,
}

impl Recorder {
    async fn start() -> anyhow::Result<Recorder> {
        let (tx, seen) = mpsc::unbounded_channel();
        let mut addrs = Vec::new();
        for family in Family::BOTH {
            let listener =
                tokio::net::TcpListener::bind(SocketAddr::new(family.loopback(), 0)).await?;
            addrs.push(listener.local_addr()?);
            let tx = tx.clone();
            tokio::spawn(async move {
                while let Ok((tcp, _)) = listener.accept().await {
                    let tx = tx.clone();
                    let service = hyper::service::service_fn(move |req: Request<_>| {
                        let seen = Seen {
                            target: req.uri().to_string(),
                            family,
                            header: req
                                .headers()
                                .get("x-mirror-test")
                                .and_then(|v| v.to_str().ok())
                                .map(str::to_owned),
                        };
                        let _ = tx.send(seen);
                        async {
                            Ok::<_, std::convert::Infallible>(conformance::http::Response::new(
                                Full::new(Bytes::from_static(b"mirror")),
                            ))
                        }
                    });
                    tokio::spawn(
                        hyper::server::conn::http1::Builder::new()
                            .serve_connection(hyper_util::rt::TokioIo::new(tcp), service),
                    );
                }
            });
        }
        Ok(Recorder {
            v4: addrs[0],
            v6: addrs[1],
            seen,
        })
    }

    /// The next request seen, within a few seconds.
    async fn next(&mut self) -> anyhow::Result<Seen> {
        tokio::time::timeout(Duration::from_secs(5), self.seen.recv())
            .await
            .map_err(|_| anyhow::anyhow!("the mirror backend saw nothing"))?
            .ok_or_else(|| anyhow::anyhow!("recorder gone"))
    }

    /// Fails when a request arrives within `wait`.
    async fn none_within(&mut self, wait: Duration) -> anyhow::Result<()> {
        match tokio::time::timeout(wait, self.seen.recv()).await {
            Ok(Some(seen)) => anyhow::bail!("unexpected mirror: {seen:?}"),
            _ => Ok(()),
        }
    }
}

async fn connect(family: Family, port: u16) -> anyhow::Result<Conn> {
    client::eventually("Gateway listener bound", Duration::from_secs(10), || {
        Conn::http1(SocketAddr::new(family.loopback(), port))
    })
    .await
}

/// GET `path` on the Gateway: 200 from the primary Service `primary`, reached over the client's
/// family; returns how long the answer took.
async fn primary(conn: &mut Conn, path: &str, primary: &str) -> anyhow::Result<Duration> {
    let start = Instant::now();
    let reply = conn.get("mirror.test", path).await?;
    let took = start.elapsed();
    client::expect_status(&reply, 200)?;
    let echo = reply.echo()?;
    anyhow::ensure!(
        echo.service == primary,
        "{path}: served by {}",
        echo.service
    );
    anyhow::ensure!(
        echo.family == conn.family(),
        "{path}: primary over {}",
        echo.family
    );
    Ok(took)
}

/// The value of `duet_request_mirrors_total{outcome}` on duet's admin listener.
async fn mirrors_counted(duet: &conformance::Duet, outcome: &str) -> anyhow::Result<u64> {
    let text = duet.admin_get(Family::V4, "/metrics").await?.text();
    let prefix = format!("duet_request_mirrors_total{{outcome=\"{outcome}\"}} ");
    let line = text.lines().find_map(|l| l.strip_prefix(&prefix));
    Ok(line.and_then(|v| v.trim().parse().ok()).unwrap_or(0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mirrors_reach_the_mirror_backend_over_the_clients_family() -> anyhow::Result<()> {
    let port = free_port()?;
    let mut recorder = Recorder::start().await?;
    // A mirror pod whose IPv4 address refuses: IPv4 clients' mirrors fall back to IPv6.
    let (closed_v4, _closed) = closed_port(Family::V4)?;
    let mut fallback = Recorder::start().await?;
    let dir = ManifestDir::new()?;
    let fleet = Fleet::start(NS, "primary", &[PodSpec::dual("primary-a")])?;
    dir.write("primary.yaml", &fleet.manifests())?;
    dir.write(
        "mirror.yaml",
        &static_service(NS, "mirror", recorder.v4, recorder.v6),
    )?;
    dir.write(
        "fallback.yaml",
        &static_service(NS, "fallback", closed_v4, fallback.v6),
    )?;
    let mut docs = gateway_docs(port);
    docs.push(route(vec![
        rule("/all", "primary", &[("mirror", json!({}))]),
        rule("/never", "primary", &[("mirror", json!({"percent": 0}))]),
        rule(
            "/fraction",
            "primary",
            &[(
                "mirror",
                json!({"fraction": {"numerator": 1, "denominator": 1}}),
            )],
        ),
        rule("/other-family", "primary", &[("fallback", json!({}))]),
    ]));
    dir.write("gateway.yaml", &docs)?;
    let duet = DuetBuilder::new(DUET, dir.path()).start().await?;
    for family in Family::BOTH {
        let mut conn = connect(family, port).await?;
        for path in [
            format!("/all?id={family}"),
            format!("/fraction?id={family}"),
        ] {
            primary(&mut conn, &path, "primary").await?;
            let seen = recorder.next().await?;
            assert_eq!(seen.target, path, "{family}");
            assert_eq!(
                seen.family, family,
                "{family}: the mirror went over the other family"
            );
            assert_eq!(
                seen.header.as_deref(),
                Some("set"),
                "{family}: filters before the mirror"
            );
        }
        primary(&mut conn, &format!("/never?id={family}"), "primary").await?;
        recorder.none_within(Duration::from_millis(300)).await?;
        primary(&mut conn, &format!("/other-family?id={family}"), "primary").await?;
        let seen = fallback.next().await?;
        assert_eq!(seen.target, format!("/other-family?id={family}"));
        assert_eq!(seen.family, Family::V6, "{family}: only IPv6 answers");
        // A request with a body is not mirrored; it is counted as skipped.
        let skipped = mirrors_counted(&duet, "skipped").await?;
        let post = Request::builder()
            .method(Method::POST)
            .uri("/all?body")
            .header("host", "mirror.test")
            .body(Full::new(Bytes::from_static(b"payload")))?;
        client::expect_status(&conn.send(post).await?, 200)?;
        recorder.none_within(Duration::from_millis(300)).await?;
        assert_eq!(
            mirrors_counted(&duet, "skipped").await?,
            skipped + 1,
            "{family}"
        );
    }
    assert!(mirrors_counted(&duet, "answered").await? >= 6);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_or_refusing_mirror_changes_nothing_for_the_client() -> anyhow::Result<()> {
    let port = free_port()?;
    let (silent_v4, _s4) = silent_port(Family::V4)?;
    let (silent_v6, _s6) = silent_port(Family::V6)?;
    let (closed_v4, _c4) = closed_port(Family::V4)?;
    let (closed_v6, _c6) = closed_port(Family::V6)?;
    let dir = ManifestDir::new()?;
    let fleet = Fleet::start(NS, "primary", &[PodSpec::dual("primary-a")])?;
    dir.write("primary.yaml", &fleet.manifests())?;
    dir.write(
        "hang.yaml",
        &static_service(NS, "hang", silent_v4, silent_v6),
    )?;
    dir.write(
        "down.yaml",
        &static_service(NS, "down", closed_v4, closed_v6),
    )?;
    let mut docs = gateway_docs(port);
    docs.push(route(vec![
        rule("/hang", "primary", &[("hang", json!({}))]),
        rule(
            "/down",
            "primary",
            &[("down", json!({})), ("hang", json!({}))],
        ),
    ]));
    dir.write("gateway.yaml", &docs)?;
    let duet = DuetBuilder::new(DUET, dir.path()).start().await?;
    for family in Family::BOTH {
        let mut conn = connect(family, port).await?;
        for path in ["/hang", "/down"] {
            for _ in 0..5 {
                let took = primary(&mut conn, path, "primary").await?;
                assert!(took < Duration::from_secs(1), "{family} {path}: {took:?}");
            }
        }
    }
    // The refused mirrors were tried (and counted), the hanging ones are still waiting.
    client::eventually(
        "refused mirrors counted",
        Duration::from_secs(5),
        || async {
            let failed = mirrors_counted(&duet, "failed").await?;
            anyhow::ensure!(failed >= 10, "{failed} failed mirrors");
            Ok(())
        },
    )
    .await?;
    Ok(())
}
