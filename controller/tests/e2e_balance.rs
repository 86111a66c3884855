//! End to end, over real sockets on 127.0.0.1 and [::1]: balancing over pods (a dual-stack pod
//! counts once), the family a pod is reached over under each family policy, and fallback to a
//! pod's other family when one of its ports is closed; pooled upstream connections (kept after a
//! burst, not lost when pods restart).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use conformance::bytes::Bytes;
use conformance::client::{self, Conn, Reply};
use conformance::http::Method;
use conformance::http_body_util::Full;
use conformance::manifests::FAMILY_ANNOTATION;
use conformance::{Duet, DuetBuilder, Echo, Family, Fleet, Ingress, ManifestDir, PodSpec, Port};

const DUET: &str = env!("CARGO_BIN_EXE_duet");

/// Pods of the Service `echo` in namespace `e2e`: one dual-stack, one IPv4-only, one IPv6-only.
fn three_pods() -> Vec<PodSpec> {
    vec![
        PodSpec::dual("dual"),
        PodSpec::v4_only("v4only"),
        PodSpec::v6_only("v6only"),
    ]
}

struct Setup {
    fleet: Fleet,
    duet: Duet,
    _dir: ManifestDir,
}

async fn setup(pods: &[PodSpec], ingresses: &[Ingress], args: &[&str]) -> anyhow::Result<Setup> {
    let fleet = Fleet::start("e2e", "echo", pods)?;
    let dir = ManifestDir::with_class()?;
    dir.write("echo.yaml", &fleet.manifests())?;
    let docs: Vec<_> = ingresses.iter().map(Ingress::build).collect();
    dir.write("ingress.yaml", &docs)?;
    let duet = DuetBuilder::new(DUET, dir.path())
        .args(args.iter().copied())
        .start()
        .await?;
    Ok(Setup {
        fleet,
        duet,
        _dir: dir,
    })
}

/// Every reply must be a 200 echo; returns the echoes.
fn echoes(replies: &[Reply]) -> anyhow::Result<Vec<Echo>> {
    replies
        .iter()
        .map(|r| {
            client::expect_status(r, 200)?;
            r.echo()
        })
        .collect()
}

fn per_pod(echoes: &[Echo]) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for e in echoes {
        *counts.entry(e.pod.clone()).or_insert(0) += 1;
    }
    counts
}

/// Checks that every echo came from a pod over `expected(pod)` and to that pod's address of it.
fn check_families(
    fleet: &Fleet,
    client: Family,
    echoes: &[Echo],
    expected: impl Fn(&conformance::Pod) -> Family,
) {
    for e in echoes {
        let pod = fleet.pod(&e.pod);
        let want = expected(pod);
        assert_eq!(
            e.family, want,
            "{client} client reached pod {} over {} (want {want})",
            e.pod, e.family
        );
        assert_eq!(
            Some(e.local),
            pod.addr(want),
            "pod {} answered on an address it does not have",
            e.pod
        );
    }
}

/// The client's family when the pod has it, else the other one.
fn same_family_if_possible(client: Family) -> impl Fn(&conformance::Pod) -> Family {
    move |pod| {
        if pod.addr(client).is_some() {
            client
        } else {
            client.other()
        }
    }
}

/// 600 requests from each family over three keep-alive connections each.
///
/// Round robin is exact: 200 per pod and family. For P2C the bounds come from the binomial
/// distribution of uniform choice (what P2C does when the in-flight counts tie; its preference for
/// the less loaded pod only narrows the spread): per family a pod gets Bin(600, 1/3), mean 200, sd
/// 11.5, and falls outside 150..=250 with probability 1.23e-5, so the six per-family checks fail
/// a correct balancer with probability at most 7.4e-5; overall a pod gets Bin(1200, 1/3), outside
/// 330..=470 with probability 1.6e-5 (4.7e-5 for three pods). Together: once in about 8 300 runs
/// (computed exactly with the binomial sums). A 40/40/20 picker's small pod gets Bin(600, 0.2),
/// mean 120, and reaches 150 with probability 0.0017: it fails 998 runs in 1000.
async fn balanced_run(args: &[&str]) -> anyhow::Result<()> {
    let round_robin = args.contains(&"round-robin");
    let s = setup(
        &three_pods(),
        &[Ingress::new("e2e", "echo").host("lb.test", "echo")],
        args,
    )
    .await?;
    let mut all = Vec::new();
    for family in Family::BOTH {
        let replies = client::load(s.duet.http(family), "lb.test", "/", 600, 3).await?;
        let got = echoes(&replies)?;
        check_families(&s.fleet, family, &got, same_family_if_possible(family));
        // Per family each pod gets a third of 600.
        let counts = per_pod(&got);
        let per_family = if round_robin { 200..=200 } else { 150..=250 };
        for pod in ["dual", "v4only", "v6only"] {
            let n = counts.get(pod).copied().unwrap_or(0);
            assert!(
                per_family.contains(&n),
                "{family} clients: pod {pod} got {n} of 600: {counts:?}"
            );
        }
        all.extend(got);
    }
    // Overall each pod gets a third of 1200: the dual-stack pod is weighted once, not once per
    // family.
    let counts = per_pod(&all);
    let overall = if round_robin { 400..=400 } else { 330..=470 };
    for pod in ["dual", "v4only", "v6only"] {
        let n = counts.get(pod).copied().unwrap_or(0);
        assert!(
            overall.contains(&n),
            "pod {pod} got {n} of 1200: {counts:?}"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefer_same_family_spreads_over_pods_and_keeps_the_client_family() -> anyhow::Result<()> {
    balanced_run(&[]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_robin_spreads_over_pods_and_keeps_the_client_family() -> anyhow::Result<()> {
    balanced_run(&["--lb", "round-robin"]).await
}

/// Under RequireSameFamily each family's clients reach only the pods having that family, over it,
/// and both such pods share the load: 200 requests, Bin(200, 1/2) each (mean 100, sd 7.1), so a
/// correct P2C is outside 70..=130 with probability 1.4e-5 per family, 2.8e-5 per run (once in
/// 36 000, exact binomial sums); a 75/25 split fails almost always.
async fn check_required(duet: &Duet, fleet: &Fleet, host: &str) -> anyhow::Result<()> {
    for family in Family::BOTH {
        let replies = client::load(duet.http(family), host, "/", 200, 2).await?;
        let got = echoes(&replies)?;
        check_families(fleet, family, &got, |_| family);
        let counts = per_pod(&got);
        let (allowed, excluded) = match family {
            Family::V4 => (["dual", "v4only"], "v6only"),
            Family::V6 => (["dual", "v6only"], "v4only"),
        };
        assert!(
            !counts.contains_key(excluded),
            "{family} clients reached {excluded}: {counts:?}"
        );
        for pod in allowed {
            let n = counts.get(pod).copied().unwrap_or(0);
            assert!(
                (70..=130).contains(&n),
                "{family} clients: pod {pod} got {n} of 200: {counts:?}"
            );
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn require_same_family_flag_excludes_pods_lacking_the_client_family() -> anyhow::Result<()> {
    let s = setup(
        &three_pods(),
        &[Ingress::new("e2e", "echo").host("strict.test", "echo")],
        &["--upstream-family", "RequireSameFamily"],
    )
    .await?;
    check_required(&s.duet, &s.fleet, "strict.test").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn require_same_family_annotation_applies_to_its_ingress_only() -> anyhow::Result<()> {
    let s = setup(
        &three_pods(),
        &[
            Ingress::new("e2e", "strict")
                .annotation(FAMILY_ANNOTATION, "RequireSameFamily")
                .host("strict.test", "echo"),
            Ingress::new("e2e", "loose").host("loose.test", "echo"),
        ],
        &[],
    )
    .await?;
    check_required(&s.duet, &s.fleet, "strict.test").await?;
    // The other Ingress on the same Service keeps the default PreferSameFamily: every pod is
    // reached, single-family pods through their only family.
    for family in Family::BOTH {
        let replies = client::load(s.duet.http(family), "loose.test", "/", 90, 2).await?;
        let got = echoes(&replies)?;
        check_families(&s.fleet, family, &got, same_family_if_possible(family));
        let counts = per_pod(&got);
        assert_eq!(
            counts.len(),
            3,
            "{family} clients on loose.test: {counts:?}"
        );
    }
    Ok(())
}

fn other(family: Family) -> Family {
    match family {
        Family::V4 => Family::V6,
        Family::V6 => Family::V4,
    }
}

/// A dual-stack pod whose `closed` port refuses connections: 100 requests of `closed`-family
/// clients, half on fresh connections, all served over the other family; the other family's
/// clients are unaffected.
async fn closed_port_falls_back_to_the_same_pods_other_address(
    closed: Family,
) -> anyhow::Result<()> {
    let s = setup(
        &[PodSpec::dual("dual").with(closed, Port::Closed)],
        &[Ingress::new("e2e", "echo").host("fallback.test", "echo")],
        &[],
    )
    .await?;
    let open = other(closed);
    let mut got = echoes(&client::load(s.duet.http(closed), "fallback.test", "/", 50, 2).await?)?;
    for i in 0..50 {
        let reply =
            client::get(s.duet.http(closed), "fallback.test", &format!("/fresh/{i}")).await?;
        client::expect_status(&reply, 200)?;
        got.push(reply.echo()?);
    }
    assert_eq!(got.len(), 100);
    check_families(&s.fleet, closed, &got, |_| open);
    let got = echoes(&client::load(s.duet.http(open), "fallback.test", "/", 100, 2).await?)?;
    check_families(&s.fleet, open, &got, |_| open);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_ipv6_port_falls_back_to_the_same_pods_ipv4_address() -> anyhow::Result<()> {
    closed_port_falls_back_to_the_same_pods_other_address(Family::V6).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_ipv4_port_falls_back_to_the_same_pods_ipv6_address() -> anyhow::Result<()> {
    closed_port_falls_back_to_the_same_pods_other_address(Family::V4).await
}

/// The half-broken pod among an IPv4-only and an IPv6-only pod: 200 requests of `closed`-family
/// clients, none lost; the pod stays a candidate through its other address and keeps its third:
/// Bin(200, 1/3), mean 67, below 40 with probability 1.1e-5 (exact binomial sum). A fallback
/// that drops the pod after its first failures does not reach 40.
async fn closed_port_among_other_pods_loses_no_request(closed: Family) -> anyhow::Result<()> {
    let s = setup(
        &[
            PodSpec::dual("dual").with(closed, Port::Closed),
            PodSpec::v4_only("v4only"),
            PodSpec::v6_only("v6only"),
        ],
        &[Ingress::new("e2e", "echo").host("fallback.test", "echo")],
        &[],
    )
    .await?;
    let open = other(closed);
    let got = echoes(&client::load(s.duet.http(closed), "fallback.test", "/", 200, 2).await?)?;
    // The broken pod is served over its open family, the others over the family they have.
    check_families(&s.fleet, closed, &got, |pod| match pod.name.as_str() {
        "dual" => open,
        "v4only" => Family::V4,
        _ => Family::V6,
    });
    let counts = per_pod(&got);
    let dual = counts.get("dual").copied().unwrap_or(0);
    assert!(
        dual >= 40,
        "the pod with a closed {closed} port got {dual} of 200: {counts:?}"
    );
    let got = echoes(&client::load(s.duet.http(open), "fallback.test", "/", 100, 2).await?)?;
    check_families(&s.fleet, open, &got, same_family_if_possible(open));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_ipv6_port_among_other_pods_loses_no_request() -> anyhow::Result<()> {
    closed_port_among_other_pods_loses_no_request(Family::V6).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_ipv4_port_among_other_pods_loses_no_request() -> anyhow::Result<()> {
    closed_port_among_other_pods_loses_no_request(Family::V4).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarted_pods_lose_no_request_to_stale_pooled_connections() -> anyhow::Result<()> {
    let mut s = setup(
        &three_pods(),
        &[Ingress::new("e2e", "echo").host("restart.test", "echo")],
        &[],
    )
    .await?;
    for round in 0..30 {
        // Fill duet's upstream pool from both families, then restart every pod: the pooled
        // connections are closed by the pods, and the next requests must not fail on them.
        for family in Family::BOTH {
            echoes(&client::load(s.duet.http(family), "restart.test", "/", 12, 3).await?)?;
        }
        s.fleet.restart().await?;
        for family in Family::BOTH {
            let replies = client::load(s.duet.http(family), "restart.test", "/", 12, 3).await;
            let replies = replies.map_err(|e| e.context(format!("round {round}")))?;
            for r in &replies {
                assert_eq!(r.status, 200, "round {round}, {family}: {}", r.text());
            }
        }
    }
    Ok(())
}

/// `n` requests sent at once, each over its own client connection, that the pod holds for
/// `hold_ms` before answering: duet has them all in flight to the pod together.
async fn burst(duet: &Duet, family: Family, n: usize, hold_ms: u64) -> anyhow::Result<Vec<Echo>> {
    let mut tasks = Vec::with_capacity(n);
    for _ in 0..n {
        let to = duet.http(family);
        tasks.push(tokio::spawn(async move {
            let req = client::request(Method::GET, "pool.test", "/")
                .header("x-echo-delay-ms", hold_ms.to_string())
                .body(Full::new(Bytes::new()))?;
            Conn::http1(to).await?.send(req).await
        }));
    }
    let mut replies = Vec::with_capacity(n);
    for task in tasks {
        replies.push(task.await??);
    }
    echoes(&replies)
}

/// After a burst of 100 requests held by the pod at once (100 upstream connections), a second
/// burst finds all of them idle in duet's pool and opens none: 100 is within the 320 idle
/// connections kept per pod address (ingress-nginx's `upstream-keepalive-connections`); with 64,
/// 36 would be closed after the first burst and opened again for the second. Over both families,
/// each to the pod's address of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_burst_reuses_every_upstream_connection_of_the_first() -> anyhow::Result<()> {
    let s = setup(
        &[PodSpec::dual("dual")],
        &[Ingress::new("e2e", "echo").host("pool.test", "echo")],
        &[],
    )
    .await?;
    for family in Family::BOTH {
        let first = burst(&s.duet, family, 100, 1000).await?;
        let opened: BTreeSet<_> = first.iter().map(|e| e.peer).collect();
        assert_eq!(
            opened.len(),
            100,
            "{family}: the first burst was not in flight at once"
        );
        assert!(
            first.iter().all(|e| e.family == family),
            "{family}: {first:?}"
        );
        // The connections go back to the pool as their responses end; give the last ones a moment.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let second = burst(&s.duet, family, 100, 1000).await?;
        let new = second.iter().filter(|e| !opened.contains(&e.peer)).count();
        assert_eq!(
            new, 0,
            "{family}: {new} of 100 requests went over new upstream connections"
        );
    }
    Ok(())
}

/// A pod whose server reads each request and closes the connection unanswered on both families
/// (one exiting as it terminates while duet still lists it), beside two that serve.
async fn hangup_setup() -> anyhow::Result<Setup> {
    setup(
        &[
            PodSpec::dual("hangup")
                .with(Family::V4, Port::Hangup)
                .with(Family::V6, Port::Hangup),
            PodSpec::dual("a"),
            PodSpec::dual("b"),
        ],
        &[Ingress::new("e2e", "echo").host("hangup.test", "echo")],
        &[],
    )
    .await
}

/// Every bodyless GET of clients of both families to the pods of [`hangup_setup`] is answered
/// 200 by the others (duet's own HTTP/1.1 client), as nginx's default `proxy_next_upstream
/// error` does: the GETs that pick the hanging-up pod go on to the next one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_closing_unanswered_loses_no_get() -> anyhow::Result<()> {
    let s = hangup_setup().await?;
    for family in [Family::V4, Family::V6] {
        let got = echoes(&client::load(s.duet.http(family), "hangup.test", "/", 60, 2).await?)?;
        check_families(&s.fleet, family, &got, same_family_if_possible(family));
    }
    Ok(())
}

/// The same for bodyless DELETEs (idempotent; sent by hyper's client, not duet's own).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_closing_unanswered_loses_no_delete() -> anyhow::Result<()> {
    let s = hangup_setup().await?;
    for family in [Family::V4, Family::V6] {
        let mut conn = Conn::http1(s.duet.http(family)).await?;
        for _ in 0..12 {
            let delete = client::request(Method::DELETE, "hangup.test", "/item")
                .body(Full::new(Bytes::new()))?;
            let echo = echoes(&[conn.send(delete).await?])?.remove(0);
            assert_eq!((echo.method.as_str(), echo.family), ("DELETE", family));
        }
    }
    Ok(())
}
