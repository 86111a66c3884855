//! Kubernetes mode end to end: Event writes that fail are retried with back-off, and only the
//! latest set of problems is written: a problem resolved while the API refused Events is never
//! written, the one that replaced it is, once. On the real control plane; the refusals are the
//! fault proxy's (reached on 127.0.0.1 and [::1]), the Events are read from kube-apiserver.

mod kube_support;

use std::time::Duration;

use conformance::client;
use conformance::cluster::{Fault, Stack};
use conformance::http::Method;
use conformance::{Family, Ingress};
use kube_support::*;

/// The `MissingService` Event notes about the Ingress `mixed`.
async fn missing_service_notes(env: &Env) -> anyhow::Result<Vec<String>> {
    Ok(env
        .events(&env.ns)
        .await?
        .into_iter()
        .filter(|e| e["regarding"]["name"] == "mixed" && e["reason"] == "MissingService")
        .map(|e| e["note"].as_str().unwrap_or_default().to_owned())
        .collect())
}

fn refused_event_writes(env: &Env) -> usize {
    env.proxy
        .requests()
        .iter()
        .filter(|r| r.method == "POST" && r.path.ends_with("/events") && r.status == 500)
        .count()
}

async fn failed_event_writes_are_retried(api_family: Family) -> anyhow::Result<()> {
    // (Not named "events-...": the refused paths are those containing "/events".)
    let env = env(Stack::Dual, &[&format!("ev-{api_family}")]).await?;
    let ns = env.ns.clone();
    env.web(&ns, "web", 1).await?;
    env.ready_pods(&ns, "web", 1).await?;
    let mixed = |missing: &str| {
        Ingress::new(&ns, "mixed")
            .host("good.test", "web")
            .host("bad.test", missing)
            .build()
    };
    env.apply(&[mixed("gone")]).await?;
    // Every Event create is refused for a while; everything else is served. 500, which kube's
    // client does not retry by itself (it retries 429, 503 and 504), so the retries are duet's.
    let refusing = Duration::from_secs(6);
    env.proxy.fail(
        Fault::status(500)
            .method(Method::POST)
            .path("/events")
            .lasting(refusing),
    );
    let refused_from = std::time::Instant::now();
    let duet = env.duet(api_family, &[]).await?;
    until_status(&duet, "good.test", 200).await?;
    client::eventually("the leader tried to write the Event", LIVE, || async {
        anyhow::ensure!(refused_event_writes(&env) >= 1, "no Event write yet");
        Ok(())
    })
    .await?;
    // While Events are refused, the problem changes: the old one is stale.
    env.apply(&[mixed("absent")]).await?;
    client::eventually("the new problem is on /debug/routes", LIVE, || async {
        let routes = duet.debug_routes().await?.to_string();
        anyhow::ensure!(routes.contains(&format!("{ns}/absent")), "{routes}");
        Ok(())
    })
    .await?;
    assert!(
        refused_from.elapsed() < refusing,
        "the machine is too slow for this test: the refusal ended before the change"
    );
    client::eventually(
        "the current problem is written once the API takes Events",
        3 * LIVE,
        || async {
            let notes = missing_service_notes(&env).await?;
            anyhow::ensure!(!notes.is_empty(), "no Event yet");
            Ok(())
        },
    )
    .await?;
    // Give a stray retry the chance to show.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let notes = missing_service_notes(&env).await?;
    assert_eq!(notes.len(), 1, "one Event: {notes:?}");
    assert!(notes[0].contains(&format!("{ns}/absent")), "{notes:?}");
    let refused = refused_event_writes(&env);
    assert!(
        refused >= 2,
        "retried with back-off: {refused} refused writes"
    );
    assert!(
        refused < 20,
        "back-off, not a busy loop: {refused} refused writes in {refusing:?}"
    );
    println!("API on {api_family}: {refused} Event writes refused before one went through");
    Ok(())
}

#[tokio::test]
async fn failed_event_writes_are_retried_latest_set_only_api_on_ipv4() -> anyhow::Result<()> {
    failed_event_writes_are_retried(Family::V4).await
}

#[tokio::test]
async fn failed_event_writes_are_retried_latest_set_only_api_on_ipv6() -> anyhow::Result<()> {
    failed_event_writes_are_retried(Family::V6).await
}
