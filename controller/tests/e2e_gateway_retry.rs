//! End to end in `--manifests` mode, over real sockets on 127.0.0.1 and [::1]: an HTTPRoute
//! rule's `retry`. A request answered with a listed code is sent again, to the other pod of the
//! Service and over the client's family; a code not listed, or a request with a body, is not
//! retried.

use std::net::SocketAddr;
use std::time::Duration;

use conformance::bytes::Bytes;
use conformance::client::{self, Conn};
use conformance::duet::free_port;
use conformance::http::{Method, Request, Response};
use conformance::http_body_util::Full;
use conformance::manifests::gateway_class;
use conformance::manifests::{endpoint_slice, service, Endpoint};
use conformance::{DuetBuilder, Family, ManifestDir};
use serde_json::{json, Value};
use tokio::sync::mpsc;

const DUET: &str = env!("CARGO_BIN_EXE_duet");
const NS: &str = "e2e";

/// One request a pod answered: the pod and the family it came over.
type Seen = (&'static str, Family);

/// A pod of both families answering every request with `status` and its name.
async fn pod(
    name: &'static str,
    status: u16,
    seen: mpsc::UnboundedSender<Seen>,
) -> anyhow::Result<Vec<(Family, SocketAddr)>> {
    let mut addrs = Vec::new();
    for family in Family::BOTH {
        let listener = tokio::net::TcpListener::bind(SocketAddr::new(family.loopback(), 0)).await?;
        addrs.push((family, listener.local_addr()?));
        let seen = seen.clone();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let seen = seen.clone();
                let service = hyper::service::service_fn(move |_req: Request<_>| {
                    let _ = seen.send((name, family));
                    async move {
                        let mut res = Response::new(Full::new(Bytes::from_static(name.as_bytes())));
                        *res.status_mut() = status.try_into().expect("status");
                        Ok::<_, std::convert::Infallible>(res)
                    }
                });
                tokio::spawn(
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(tcp), service),
                );
            }
        });
    }
    Ok(addrs)
}

/// The Service `flaky` over the pods (one EndpointSlice per pod and family: ports differ).
fn flaky(pods: &[(&str, Vec<(Family, SocketAddr)>)]) -> Vec<Value> {
    let mut docs = vec![service(NS, "flaky", &[("http", 8080)])];
    for (name, addrs) in pods {
        for (family, addr) in addrs {
            let endpoint = Endpoint {
                pod: (*name).to_owned(),
                uid: format!("uid-{name}"),
                ip: addr.ip(),
                ready: true,
            };
            let slice = format!("flaky-{name}-{family}");
            docs.push(endpoint_slice(
                NS,
                "flaky",
                &slice,
                *family,
                "http",
                addr.port(),
                &[endpoint],
            ));
        }
    }
    docs
}

fn gateway_docs(port: u16, rules: Vec<Value>) -> Vec<Value> {
    vec![
        gateway_class(),
        json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
            "metadata": {"name": "gw", "namespace": NS},
            "spec": {"gatewayClassName": "duet",
                "listeners": [{"name": "http", "port": port, "protocol": "HTTP"}]}
        }),
        json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
            "metadata": {"name": "retried", "namespace": NS},
            "spec": {"parentRefs": [{"name": "gw"}], "rules": rules}
        }),
    ]
}

fn rule(prefix: &str, retry: Value) -> Value {
    json!({
        "matches": [{"path": {"type": "PathPrefix", "value": prefix}}],
        "retry": retry,
        "backendRefs": [{"name": "flaky", "port": 8080}]
    })
}

async fn connect(family: Family, port: u16) -> anyhow::Result<Conn> {
    client::eventually("Gateway listener bound", Duration::from_secs(10), || {
        Conn::http1(SocketAddr::new(family.loopback(), port))
    })
    .await
}

/// Everything the pods saw so far.
fn drain(seen: &mut mpsc::UnboundedReceiver<Seen>) -> Vec<Seen> {
    let mut all = Vec::new();
    while let Ok(s) = seen.try_recv() {
        all.push(s);
    }
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listed_codes_are_retried_on_the_other_pod_over_the_clients_family() -> anyhow::Result<()> {
    let port = free_port()?;
    let (tx, mut seen) = mpsc::unbounded_channel();
    let bad = pod("bad", 500, tx.clone()).await?;
    let good = pod("good", 200, tx).await?;
    let dir = ManifestDir::new()?;
    dir.write("flaky.yaml", &flaky(&[("bad", bad), ("good", good)]))?;
    let rules = vec![
        rule(
            "/retry",
            json!({"codes": [500], "attempts": 1, "backoff": "1ms"}),
        ),
        rule("/other-code", json!({"codes": [503], "attempts": 3})),
    ];
    dir.write("gateway.yaml", &gateway_docs(port, rules))?;
    let _duet = DuetBuilder::new(DUET, dir.path()).start().await?;
    for family in Family::BOTH {
        let mut conn = connect(family, port).await?;
        drain(&mut seen);
        for i in 0..12 {
            let reply = conn.get("retry.test", &format!("/retry/{i}")).await?;
            assert_eq!(reply.status, 200, "{family} request {i}: {}", reply.text());
            assert_eq!(reply.text(), "good");
        }
        let got = drain(&mut seen);
        let bad_seen = got.iter().filter(|(p, _)| *p == "bad").count();
        assert!(
            bad_seen > 0,
            "{family}: the balancer never picked the failing pod: {got:?}"
        );
        // One retry each, never to the pod that failed: every request reached `good` once.
        assert_eq!(got.len(), 12 + bad_seen, "{family}: {got:?}");
        assert!(got.iter().all(|(_, f)| *f == family), "{family}: {got:?}");
        // 500 is not among the codes listed: answered as it came.
        let mut statuses = Vec::new();
        for i in 0..12 {
            statuses.push(
                conn.get("retry.test", &format!("/other-code/{i}"))
                    .await?
                    .status,
            );
        }
        assert!(statuses.iter().any(|s| *s == 500), "{family}: {statuses:?}");
        let got = drain(&mut seen);
        assert_eq!(got.len(), 12, "{family}: a 500 was retried: {got:?}");
        // A request with a body is not retried.
        let mut statuses = Vec::new();
        for i in 0..12 {
            let post = Request::builder()
                .method(Method::POST)
                .uri(format!("/retry/post-{i}"))
                .header("host", "retry.test")
                .body(Full::new(Bytes::from_static(b"payload")))?;
            statuses.push(conn.send(post).await?.status);
        }
        assert!(statuses.iter().any(|s| *s == 500), "{family}: {statuses:?}");
        assert_eq!(
            drain(&mut seen).len(),
            12,
            "{family}: a request with a body was retried"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_past_its_backend_timeout_is_retried_on_the_other_pod() -> anyhow::Result<()> {
    let port = free_port()?;
    let (tx, mut seen) = mpsc::unbounded_channel();
    let good = pod("good", 200, tx).await?;
    // A pod whose connections are accepted by the kernel and never answered.
    let (silent_v4, _s4) = conformance::fleet::silent_port(Family::V4)?;
    let (silent_v6, _s6) = conformance::fleet::silent_port(Family::V6)?;
    let silent = vec![(Family::V4, silent_v4), (Family::V6, silent_v6)];
    let dir = ManifestDir::new()?;
    dir.write("flaky.yaml", &flaky(&[("silent", silent), ("good", good)]))?;
    let mut timed = rule("/timed", json!({"attempts": 1}));
    timed["timeouts"] = json!({"backendRequest": "200ms"});
    dir.write("gateway.yaml", &gateway_docs(port, vec![timed]))?;
    let _duet = DuetBuilder::new(DUET, dir.path()).start().await?;
    for family in Family::BOTH {
        let mut conn = connect(family, port).await?;
        for i in 0..6 {
            let reply = conn.get("retry.test", &format!("/timed/{i}")).await?;
            assert_eq!(reply.status, 200, "{family} request {i}: {}", reply.text());
        }
        let got = drain(&mut seen);
        assert_eq!(got.len(), 6, "{family}: {got:?}");
        assert!(got.iter().all(|(_, f)| *f == family), "{family}: {got:?}");
    }
    Ok(())
}
