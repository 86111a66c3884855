//! Kubernetes mode end to end: Event writes that fail are retried with back-off, and only the
//! latest set of problems is written: a problem resolved while the API refused Events is never
//! written, the one that replaced it is, once. The API server runs on 127.0.0.1 and [::1].

mod kube_support;

use std::time::Duration;

use conformance::apiserver::ApiServer;
use conformance::client;
use conformance::{Family, Fleet, Ingress, PodSpec};
use kube_support::*;

/// The `MissingService` Event notes about the Ingress `mixed`.
fn missing_service_notes(api: &ApiServer) -> Vec<String> {
    api.list("events.k8s.io/v1", "Event")
        .into_iter()
        .filter(|e| e["regarding"]["name"] == "mixed" && e["reason"] == "MissingService")
        .map(|e| e["note"].as_str().unwrap_or_default().to_owned())
        .collect()
}

fn refused_event_writes(api: &ApiServer) -> usize {
    api.requests()
        .iter()
        .filter(|r| r.method == "POST" && r.path.ends_with("/events") && r.status == 500)
        .count()
}

async fn failed_event_writes_are_retried(api_family: Family) -> anyhow::Result<()> {
    let api = api(api_family)?;
    let pods = Fleet::start("kube", "web", &[PodSpec::dual("only")])?;
    apply(&api, &pods.manifests())?;
    let mixed = |missing: &str| {
        Ingress::new("kube", "mixed")
            .host("good.test", "web")
            .host("bad.test", missing)
            .build()
    };
    apply(&api, &[mixed("gone")])?;
    // Every Event create is refused for a while; everything else is served. 500, which kube's
    // client does not retry by itself (it retries 429, 503 and 504), so the retries are duet's.
    let refusing = Duration::from_secs(6);
    api.fail_matching(500, refusing, "POST", "/events");
    let refused_from = std::time::Instant::now();
    let duet = duet(&api, &["--election-namespace", "default"]).await?;
    until_status(&duet, "good.test", 200).await?;
    client::eventually("the leader tried to write the Event", LIVE, || async {
        anyhow::ensure!(refused_event_writes(&api) >= 1, "no Event write yet");
        Ok(())
    })
    .await?;
    // While Events are refused, the problem changes: the old one is stale.
    apply(&api, &[mixed("absent")])?;
    client::eventually("the new problem is on /debug/routes", LIVE, || async {
        let routes = duet.debug_routes().await?.to_string();
        anyhow::ensure!(routes.contains("kube/absent"), "{routes}");
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
            let notes = missing_service_notes(&api);
            anyhow::ensure!(!notes.is_empty(), "no Event yet");
            Ok(())
        },
    )
    .await?;
    // Give a stray retry the chance to show.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let notes = missing_service_notes(&api);
    assert_eq!(notes.len(), 1, "one Event: {notes:?}");
    assert!(notes[0].contains("kube/absent"), "{notes:?}");
    let refused = refused_event_writes(&api);
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_event_writes_are_retried_latest_set_only_api_on_ipv4() -> anyhow::Result<()> {
    failed_event_writes_are_retried(Family::V4).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_event_writes_are_retried_latest_set_only_api_on_ipv6() -> anyhow::Result<()> {
    failed_event_writes_are_retried(Family::V6).await
}
