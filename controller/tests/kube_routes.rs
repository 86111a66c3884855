//! Kubernetes mode end to end: the real `duet` binary watching the test API server (on
//! 127.0.0.1 and on [::1]), clients of both families. `/readyz` is 503 until every watch has
//! listed; `--watch-namespace` scopes the watches; routes go live after creating an Ingress (the time is
//! printed, not asserted); scaling EndpointSlices swaps targets without rebuilding routes; a relist after
//! `410 Gone` that hides a delete converges; an API outage of 10 s leaves traffic served from the
//! last snapshot and the controller catches up once the API is back.

mod kube_support;

use std::time::{Duration, Instant};

use conformance::client;
use conformance::{Family, Fleet, Ingress, PodSpec};
use kube_support::*;

/// Creates an Ingress and measures how long until both client families get 200 from it.
async fn route_latency(
    api: &conformance::apiserver::ApiServer,
    duet: &conformance::Duet,
    ingress: serde_json::Value,
    host: &str,
) -> anyhow::Result<Duration> {
    let start = Instant::now();
    apply(api, &[ingress])?;
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
    let api = api(api_family)?;
    let first = Fleet::start("kube", "web", &[PodSpec::dual("first")])?;
    apply(&api, &first.manifests())?;
    let duet = duet(&api, &[]).await?;

    let latency = route_latency(
        &api,
        &duet,
        Ingress::new("kube", "web").host("a.test", "web").build(),
        "a.test",
    )
    .await?;
    println!(
        "API on {api_family}: Ingress created -> served to IPv4 and IPv6 clients in {latency:?}"
    );
    // No speed goal here (that is for benchmarks): `route_latency` only fails after LIVE (15 s),
    // many times the sub-second this takes, as a hang guard.
    let echo = client::get(duet.http(Family::V6), "a.test", "/")
        .await?
        .echo()?;
    assert_eq!((echo.pod.as_str(), echo.family), ("first", Family::V6));

    // Scale up: a second pod's EndpointSlices. Only the backend changes.
    let before = snapshot_lines(&duet).len();
    let second = Fleet::start("kube", "web", &[PodSpec::dual("second")])?;
    let start = Instant::now();
    apply(&api, &second.slices())?;
    until_pods(&duet, "a.test", &["first", "second"]).await?;
    println!(
        "API on {api_family}: EndpointSlice added -> new pod served in {:?}",
        start.elapsed()
    );
    // Scale down: the first pod's slices go.
    for slice in first.slices() {
        let name = slice["metadata"]["name"].as_str().unwrap_or_default();
        api.delete("discovery.k8s.io/v1", "EndpointSlice", Some("kube"), name)
            .map_err(|e| anyhow::anyhow!("delete {name}: {e:?}"))?;
    }
    until_pods(&duet, "a.test", &["second"]).await?;
    let changes = &snapshot_lines(&duet)[before..];
    assert!(
        !changes.is_empty(),
        "no snapshot after the endpoint changes"
    );
    for line in changes {
        assert!(
            line.contains("routes.rebuilt=false"),
            "an endpoint-only change rebuilt the routes: {line}"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_go_live_and_endpoint_changes_keep_the_routes_api_on_ipv4() -> anyhow::Result<()> {
    routes_go_live_and_endpoint_changes_keep_the_routes(Family::V4).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_go_live_and_endpoint_changes_keep_the_routes_api_on_ipv6() -> anyhow::Result<()> {
    routes_go_live_and_endpoint_changes_keep_the_routes(Family::V6).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_is_503_until_every_watch_has_listed() -> anyhow::Result<()> {
    let api = api(Family::V6)?;
    let pods = Fleet::start("kube", "web", &[PodSpec::dual("only")])?;
    apply(&api, &pods.manifests())?;
    apply(
        &api,
        &[Ingress::new("kube", "a").host("a.test", "web").build()],
    )?;
    api.fail_for(503, Duration::from_secs(60));
    let duet = conformance::DuetBuilder::kube(DUET, api.kubeconfig())
        .args([LOOPBACK_PODS])
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
    api.heal();
    client::eventually("ready once the API answers", LIVE, || async {
        client::expect_status(&duet.admin_get(Family::V4, "/readyz").await?, 200)
    })
    .await?;
    // The first snapshot is complete: the route works from the moment duet is ready.
    for family in Family::BOTH {
        let reply = client::get(duet.http(family), "a.test", "/").await?;
        client::expect_status(&reply, 200)?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_namespace_scopes_what_is_served() -> anyhow::Result<()> {
    let api = api(Family::V4)?;
    let shop = Fleet::start("shop", "web", &[PodSpec::dual("shop-pod")])?;
    let blog = Fleet::start("blog", "web", &[PodSpec::dual("blog-pod")])?;
    let news = Fleet::start("news", "web", &[PodSpec::dual("news-pod")])?;
    for fleet in [&shop, &blog, &news] {
        apply(&api, &fleet.manifests())?;
        let ns = fleet.namespace();
        let host = format!("{ns}.test");
        apply(&api, &[Ingress::new(ns, "web").host(&host, "web").build()])?;
    }
    let duet = duet(
        &api,
        &["--watch-namespace", "shop", "--watch-namespace", "news"],
    )
    .await?;
    until_pods(&duet, "shop.test", &["shop-pod"]).await?;
    until_pods(&duet, "news.test", &["news-pod"]).await?;
    until_status(&duet, "blog.test", 404).await?;
    // Watches are per namespace: nothing asks for the whole cluster's Ingresses.
    let cluster_wide = api
        .requests()
        .iter()
        .filter(|r| r.path == "/apis/networking.k8s.io/v1/ingresses")
        .count();
    assert_eq!(cluster_wide, 0);
    // A later change in a watched namespace still arrives.
    apply(
        &api,
        &[Ingress::new("news", "more")
            .host("more.test", "web")
            .build()],
    )?;
    until_pods(&duet, "more.test", &["news-pod"]).await?;
    Ok(())
}

async fn relist_after_410_converges(api_family: Family) -> anyhow::Result<()> {
    let api = api(api_family)?;
    let pods = Fleet::start("kube", "web", &[PodSpec::dual("only")])?;
    apply(&api, &pods.manifests())?;
    apply(
        &api,
        &[
            Ingress::new("kube", "a").host("a.test", "web").build(),
            Ingress::new("kube", "b").host("b.test", "web").build(),
        ],
    )?;
    let duet = duet(&api, &[]).await?;
    until_status(&duet, "a.test", 200).await?;
    until_status(&duet, "b.test", 200).await?;

    // While no watch is open: delete b, add c, and compact the history. The watchers resume
    // from their last resourceVersion, get the 410 ERROR event and relist; the relist shows c
    // and lacks b, and no DELETED event for b ever arrives.
    api.with_store(|s| {
        s.drop_watches();
        s.delete_object("networking.k8s.io/v1", "Ingress", Some("kube"), "b")
            .map_err(|e| anyhow::anyhow!("delete: {e:?}"))?;
        s.apply(Ingress::new("kube", "c").host("c.test", "web").build())
            .map_err(|e| anyhow::anyhow!("apply: {e:?}"))?;
        s.expire_history();
        anyhow::Ok(())
    })?;
    until_status(&duet, "c.test", 200).await?;
    until_status(&duet, "b.test", 404).await?;
    until_status(&duet, "a.test", 200).await?;
    let relisted = api
        .requests()
        .iter()
        .filter(|r| r.path.ends_with("/ingresses") && !r.is_watch())
        .count();
    assert!(relisted >= 2, "Ingresses were listed {relisted} times");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relist_after_410_hiding_a_delete_converges_api_on_ipv4() -> anyhow::Result<()> {
    relist_after_410_converges(Family::V4).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relist_after_410_hiding_a_delete_converges_api_on_ipv6() -> anyhow::Result<()> {
    relist_after_410_converges(Family::V6).await
}

async fn api_outage_keeps_the_last_snapshot(api_family: Family) -> anyhow::Result<()> {
    let api = api(api_family)?;
    let pods = Fleet::start("kube", "web", &[PodSpec::dual("only")])?;
    apply(&api, &pods.manifests())?;
    apply(
        &api,
        &[Ingress::new("kube", "a").host("a.test", "web").build()],
    )?;
    let mut duet = duet(&api, &[]).await?;
    until_status(&duet, "a.test", 200).await?;

    api.stop();
    let outage = Instant::now();
    let mut checks = 0;
    while outage.elapsed() < Duration::from_secs(10) {
        for family in Family::BOTH {
            let reply = client::get(duet.http(family), "a.test", "/").await?;
            client::expect_status(&reply, 200)?;
            let ready = duet.admin_get(family, "/readyz").await?;
            client::expect_status(&ready, 200)?;
        }
        checks += 1;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    duet.check_running()?;
    assert!(checks >= 10, "only {checks} checks in 10 s");
    assert!(
        duet.logs().contains("Watch failed"),
        "the outage was not noticed"
    );

    api.restart()?;
    let back = Instant::now();
    apply(
        &api,
        &[Ingress::new("kube", "b").host("b.test", "web").build()],
    )?;
    until_status(&duet, "b.test", 200).await?;
    println!(
        "API on {api_family}: back after a 10 s outage -> new Ingress served in {:?}",
        back.elapsed()
    );
    until_status(&duet, "a.test", 200).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_outage_of_10s_keeps_serving_and_recovers_api_on_ipv4() -> anyhow::Result<()> {
    api_outage_keeps_the_last_snapshot(Family::V4).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_outage_of_10s_keeps_serving_and_recovers_api_on_ipv6() -> anyhow::Result<()> {
    api_outage_keeps_the_last_snapshot(Family::V6).await
}
