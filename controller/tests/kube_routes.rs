//! Kubernetes mode end to end on the real control plane: the real `duet` binary watching
//! kube-apiserver through the fault proxy (reached on 127.0.0.1 and on [::1]), clients of both
//! families, backends run by a real Deployment whose EndpointSlices come from the real
//! endpointslice controller. `/readyz` is 503 until every watch has listed; `--watch-namespace`
//! scopes the watches; routes go live after creating an Ingress (the time is printed, not
//! asserted); scaling the Deployment swaps targets without rebuilding routes. Faults: every
//! connection dropped and refused for 10 s; watches cut mid-stream with every request answered
//! `429 Too Many Requests` with `Retry-After: 2` (each retry waits as told), then `503`, then
//! `500` (which reaches duet's own watch back-off): duet keeps serving the last good routes to
//! both families all along, and once the API answers again it picks up what changed
//! meanwhile (an Ingress deleted, one created, the Deployment scaled). The real `410 Gone` relist
//! is in `kube_real_cluster.rs` (it needs kube-apiserver without its watch cache).

mod kube_support;

use std::time::{Duration, Instant};

use anyhow::Context;
use conformance::client;
use conformance::cluster::faults::Record;
use conformance::cluster::{Fault, Stack};
use conformance::{Duet, Family, Ingress};
use kube_support::*;

/// Creates an Ingress and measures how long until both client families get 200 from it.
async fn route_latency(
    env: &Env,
    duet: &Duet,
    ingress: serde_json::Value,
    host: &str,
) -> anyhow::Result<Duration> {
    let start = Instant::now();
    env.apply(&[ingress]).await?;
    let mut live = [false, false];
    loop {
        for (i, family) in Family::BOTH.into_iter().enumerate() {
            if !live[i] {
                if let Ok(reply) = client::get(duet.http(family), host, "/").await {
                    live[i] = reply.status == 200;
                }
            }
        }
        if live == [true, true] {
            return Ok(start.elapsed());
        }
        anyhow::ensure!(start.elapsed() < LIVE, "{host} not live after {LIVE:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn routes_go_live_and_endpoint_changes_keep_the_routes(
    api_family: Family,
) -> anyhow::Result<()> {
    let env = env(Stack::Dual, &[&format!("routes-{api_family}")]).await?;
    let ns = env.ns.clone();
    env.web(&ns, "web", 1).await?;
    let first = env.ready_pods(&ns, "web", 1).await?;
    let duet = env.duet(api_family, &[]).await?;

    let latency = route_latency(
        &env,
        &duet,
        Ingress::new(&ns, "web").host("a.test", "web").build(),
        "a.test",
    )
    .await?;
    println!(
        "API on {api_family}: Ingress created -> served to IPv4 and IPv6 clients in {latency:?}"
    );
    // No speed goal here (that is for benchmarks): `route_latency` only fails after LIVE, many
    // times the sub-second this takes, as a hang guard.
    for family in Family::BOTH {
        let echo = client::get(duet.http(family), "a.test", "/")
            .await?
            .echo()?;
        anyhow::ensure!(first.contains(&echo.pod), "{} answered", echo.pod);
        anyhow::ensure!(echo.family == family, "{family} client reached {echo:?}");
    }

    // Scale up: the endpointslice controller adds the second pod to both slices. Only the
    // backend changes.
    let before = snapshot_lines(&duet).len();
    let start = Instant::now();
    env.scale(&ns, "web", 2).await?;
    let both = env.ready_pods(&ns, "web", 2).await?;
    until_pods(&duet, "a.test", &both).await?;
    println!(
        "API on {api_family}: Deployment scaled to 2 -> new pod served in {:?}",
        start.elapsed()
    );
    // Scale down: one pod goes, and leaves the slices.
    env.scale(&ns, "web", 1).await?;
    let left = env.ready_pods(&ns, "web", 1).await?;
    until_pods(&duet, "a.test", &left).await?;
    let changes = &snapshot_lines(&duet)[before..];
    anyhow::ensure!(
        !changes.is_empty(),
        "no snapshot after the endpoint changes"
    );
    for line in changes {
        anyhow::ensure!(
            line.contains("routes.rebuilt=false"),
            "an endpoint-only change rebuilt the routes: {line}"
        );
    }
    env.cluster.check_running()
}

#[tokio::test]
async fn routes_go_live_and_endpoint_changes_keep_the_routes_api_on_ipv4() -> anyhow::Result<()> {
    routes_go_live_and_endpoint_changes_keep_the_routes(Family::V4).await
}

#[tokio::test]
async fn routes_go_live_and_endpoint_changes_keep_the_routes_api_on_ipv6() -> anyhow::Result<()> {
    routes_go_live_and_endpoint_changes_keep_the_routes(Family::V6).await
}

#[tokio::test]
async fn readyz_is_503_until_every_watch_has_listed() -> anyhow::Result<()> {
    let env = env(Stack::Dual, &["readyz"]).await?;
    env.web("readyz", "web", 1).await?;
    env.ready_pods("readyz", "web", 1).await?;
    env.apply(&[Ingress::new("readyz", "a").host("a.test", "web").build()])
        .await?;
    env.proxy.fail(Fault::status(503));
    let duet = env
        .builder(Family::V6, &[])
        .without_waiting_for_ready()
        .start()
        .await?;
    let failing = Instant::now();
    while failing.elapsed() < Duration::from_millis(1500) {
        for family in Family::BOTH {
            let ready = duet.admin_get(family, "/readyz").await?;
            client::expect_status(&ready, 503)?;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    env.proxy.heal();
    client::eventually("ready once the API answers", LIVE, || async {
        client::expect_status(&duet.admin_get(Family::V4, "/readyz").await?, 200)
    })
    .await?;
    // The first snapshot is complete: the route works from the moment duet is ready.
    expect_now(&duet, "a.test", 200).await
}

#[tokio::test]
async fn watch_namespace_scopes_what_is_served() -> anyhow::Result<()> {
    let namespaces = ["ws-shop", "ws-blog", "ws-news"];
    let env = env(Stack::Dual, &namespaces).await?;
    for ns in namespaces {
        env.web(ns, "web", 1).await?;
        let host = format!("{ns}.test");
        env.apply(&[Ingress::new(ns, "web").host(&host, "web").build()])
            .await?;
    }
    let duet = conformance::DuetBuilder::kube(DUET, env.kubeconfig(Family::V4))
        .args([
            "--watch-namespace",
            "ws-shop",
            "--watch-namespace",
            "ws-news",
            "--election-namespace",
            "ws-shop",
        ])
        .die_with_parent()
        .start()
        .await?;
    for ns in ["ws-shop", "ws-news"] {
        let pods = env.ready_pods(ns, "web", 1).await?;
        until_pods(&duet, &format!("{ns}.test"), &pods).await?;
    }
    until_status(&duet, "ws-blog.test", 404).await?;
    // Watches are per namespace: nothing asks for the whole cluster's Ingresses.
    let cluster_wide = env
        .proxy
        .requests()
        .iter()
        .filter(|r| r.path == "/apis/networking.k8s.io/v1/ingresses")
        .count();
    anyhow::ensure!(
        cluster_wide == 0,
        "{cluster_wide} cluster-wide Ingress requests"
    );
    // A later change in a watched namespace still arrives.
    env.apply(&[Ingress::new("ws-news", "more")
        .host("more.test", "web")
        .build()])
        .await?;
    let news = env.ready_pods("ws-news", "web", 1).await?;
    until_pods(&duet, "more.test", &news).await
}

/// Checks every 250 ms until `until` that `hosts` answer 200 to both families and `/readyz` is
/// 200, while the API is still failing (`fault_ends`: an answer that comes after it may already
/// carry the changes made meanwhile, which `caught_up` checks); how many rounds passed.
async fn keeps_serving(
    duet: &Duet,
    hosts: &[&str],
    until: Instant,
    fault_ends: Instant,
) -> anyhow::Result<usize> {
    let mut rounds = 0;
    while Instant::now() < until {
        match serving_now(duet, hosts).await {
            Ok(()) => {}
            Err(_) if Instant::now() >= fault_ends => break,
            Err(error) => return Err(error.context("during the fault")),
        }
        rounds += 1;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Ok(rounds)
}

/// `hosts` answer 200 to both families and `/readyz` is 200.
async fn serving_now(duet: &Duet, hosts: &[&str]) -> anyhow::Result<()> {
    for host in hosts {
        expect_now(duet, host, 200).await?;
    }
    for family in Family::BOTH {
        client::expect_status(&duet.admin_get(family, "/readyz").await?, 200)?;
    }
    Ok(())
}

/// A test's namespace with the Deployment `web` (1 pod) and the Ingresses `a` and `b`, served.
async fn served(env: &Env, api_family: Family) -> anyhow::Result<Duet> {
    let ns = &env.ns;
    env.web(ns, "web", 1).await?;
    env.ready_pods(ns, "web", 1).await?;
    env.apply(&[
        Ingress::new(ns, "a").host("a.test", "web").build(),
        Ingress::new(ns, "b").host("b.test", "web").build(),
    ])
    .await?;
    let duet = env.duet(api_family, &[]).await?;
    until_status(&duet, "a.test", 200).await?;
    until_status(&duet, "b.test", 200).await?;
    Ok(duet)
}

/// Made while duet cannot reach the API: Ingress `b` deleted, `c` created, `web` scaled to 2.
async fn change_behind_its_back(env: &Env) -> anyhow::Result<()> {
    let ns = &env.ns;
    env.api
        .delete("networking.k8s.io/v1", "Ingress", Some(ns), "b")
        .await?;
    env.apply(&[Ingress::new(ns, "c").host("c.test", "web").build()])
        .await?;
    env.scale(ns, "web", 2).await
}

/// What [`change_behind_its_back`] did is served: `b` gone, `c` and both pods there.
async fn caught_up(env: &Env, duet: &Duet) -> anyhow::Result<()> {
    until_status(duet, "c.test", 200).await?;
    until_status(duet, "b.test", 404).await?;
    let both = env.ready_pods(&env.ns, "web", 2).await?;
    until_pods(duet, "a.test", &both).await
}

async fn api_outage_keeps_the_last_snapshot(api_family: Family) -> anyhow::Result<()> {
    let env = env(Stack::Dual, &[&format!("outage-{api_family}")]).await?;
    let mut duet = served(&env, api_family).await?;

    // Every connection to the API dropped, new ones closed at once, for 10 s.
    let outage = Duration::from_secs(10);
    env.proxy.outage(outage);
    let down = Instant::now();
    change_behind_its_back(&env).await?;
    // The old routes, served as they were: b is still there, c not yet.
    let ends = down + outage;
    let rounds = keeps_serving(&duet, &["a.test", "b.test"], ends, ends).await?;
    expect_now(&duet, "c.test", 404).await?;
    duet.check_running()?;
    anyhow::ensure!(rounds >= 10, "only {rounds} checks during the outage");
    anyhow::ensure!(
        duet.logs().contains("Watch failed"),
        "the outage was not noticed"
    );

    let back = Instant::now();
    caught_up(&env, &duet).await?;
    println!(
        "API on {api_family}: back after a 10 s outage -> changes made meanwhile served in {:?}",
        back.elapsed()
    );
    env.apply(&[Ingress::new(&env.ns, "d").host("d.test", "web").build()])
        .await?;
    until_status(&duet, "d.test", 200).await?;
    until_status(&duet, "a.test", 200).await
}

#[tokio::test]
async fn api_outage_of_10s_keeps_serving_and_recovers_api_on_ipv4() -> anyhow::Result<()> {
    api_outage_keeps_the_last_snapshot(Family::V4).await
}

#[tokio::test]
async fn api_outage_of_10s_keeps_serving_and_recovers_api_on_ipv6() -> anyhow::Result<()> {
    api_outage_keeps_the_last_snapshot(Family::V6).await
}

/// Watches cut mid-stream, then every request answered `fault`'s status for `span`: the routes
/// stay, and the changes made meanwhile are served once the API answers. The requests refused.
async fn cut_watches_then_refused(
    env: &Env,
    duet: &Duet,
    fault: Fault,
    status: u16,
) -> anyhow::Result<Vec<Record>> {
    let span = Duration::from_secs(6);
    // Serving the routes needs every list, not every watch: a watch may still be on its way
    // (or reconnecting after its server-side timeout). The cut must cut them all.
    watches_streaming(env).await?;
    let from = env.proxy.requests().len();
    // The fault ends `span` after it starts: the last good routes are checked until shortly
    // before that (a retry right after the fault ends may catch up at once).
    let start = Instant::now();
    env.proxy.fail(fault.lasting(span));
    env.proxy.cut_watches();
    change_behind_its_back(env).await?;
    let ends = start + span;
    let until = ends - Duration::from_millis(500);
    keeps_serving(duet, &["a.test", "b.test"], until, ends).await?;
    let refused: Vec<Record> = env.proxy.requests()[from..]
        .iter()
        .filter(|r| r.status == status)
        .cloned()
        .collect();
    anyhow::ensure!(
        !refused.is_empty(),
        "duet asked nothing during the fault: {:#?}",
        &env.proxy.requests()[from..]
    );
    println!("{} requests of duet answered {status}", refused.len());
    caught_up(env, duet).await?;
    watches_streaming(env).await?;
    undo_the_changes(env, duet).await?;
    Ok(refused)
}

/// Until duet's watches of the test namespace (Ingresses, Services, EndpointSlices) stream.
async fn watches_streaming(env: &Env) -> anyhow::Result<()> {
    client::eventually("duet's watches streaming", LIVE, || async {
        let open = env.proxy.open_watches(&format!("/namespaces/{}/", env.ns));
        anyhow::ensure!(open >= 3, "{open} watches open");
        Ok(())
    })
    .await
}

/// Back to the state before [`change_behind_its_back`], served.
async fn undo_the_changes(env: &Env, duet: &Duet) -> anyhow::Result<()> {
    let ns = &env.ns;
    env.api
        .delete("networking.k8s.io/v1", "Ingress", Some(ns), "c")
        .await?;
    env.apply(&[Ingress::new(ns, "b").host("b.test", "web").build()])
        .await?;
    env.scale(ns, "web", 1).await?;
    until_status(duet, "b.test", 200).await?;
    until_status(duet, "c.test", 404).await?;
    let one = env.ready_pods(ns, "web", 1).await?;
    until_pods(duet, "a.test", &one).await
}

/// The shortest time between two refusals of the same request (a retry), if any was retried.
fn shortest_retry(refused: &[Record]) -> Option<Duration> {
    let mut last: std::collections::HashMap<String, Instant> = Default::default();
    let mut shortest: Option<Duration> = None;
    for r in refused {
        let key = format!("{} {}?{}", r.method, r.path, r.query);
        if let Some(before) = last.insert(key, r.at) {
            let gap = r.at - before;
            shortest = Some(shortest.map_or(gap, |s| s.min(gap)));
        }
    }
    shortest
}

async fn cut_watches_429_503_500(api_family: Family) -> anyhow::Result<()> {
    let env = env(Stack::Dual, &[&format!("cut-{api_family}")]).await?;
    let duet = served(&env, api_family).await?;

    // 429 with Retry-After: 2. The client waits as told before each retry.
    let refused =
        cut_watches_then_refused(&env, &duet, Fault::status(429).retry_after(2), 429).await?;
    let shortest = shortest_retry(&refused);
    println!("429: shortest time between retries of one request {shortest:?}");
    let shortest = shortest.context("no request was retried after its 429")?;
    anyhow::ensure!(
        shortest >= Duration::from_millis(1900),
        "a request retried {shortest:?} after a 429 with Retry-After: 2"
    );

    // 503 (the client retries it by itself, backing off).
    cut_watches_then_refused(&env, &duet, Fault::status(503), 503).await?;

    // 500, which no client retries by itself: duet's own watch back-off, the errors in its log.
    let failed_before = duet.logs().matches("Watch failed").count();
    cut_watches_then_refused(&env, &duet, Fault::status(500), 500).await?;
    let failed = duet.logs().matches("Watch failed").count() - failed_before;
    anyhow::ensure!(failed >= 1, "no watch failure logged during the 500s");
    env.cluster.check_running()
}

#[tokio::test]
async fn cut_watches_429_503_500_keep_the_routes_and_catch_up_api_on_ipv4() -> anyhow::Result<()> {
    cut_watches_429_503_500(Family::V4).await
}

#[tokio::test]
async fn cut_watches_429_503_500_keep_the_routes_and_catch_up_api_on_ipv6() -> anyhow::Result<()> {
    cut_watches_429_503_500(Family::V6).await
}
