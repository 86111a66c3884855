//! kube-runtime's unmodified watcher and reflector against the test API server over 127.0.0.1
//! and [::1]: live events, selectors, bookmarks, streaming lists, 410 relists that hide deletes,
//! dropped watches that resume, and the server going away and coming back.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{ensure, Context};
use conformance::apiserver::{ApiServer, Options, RequestRecord};
use conformance::client::eventually;
use conformance::Family;
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, WatchEvent, WatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Client, Config, ResourceExt};
use serde_json::json;

use conformance::both_families;

both_families!(
    reflector_follows_adds_modifies_and_deletes,
    field_selected_watch_sees_only_tls_secrets,
    bookmarks_advance_the_resource_version,
    expired_history_relists_and_hides_the_delete,
    streaming_list_sends_initial_events,
    metadata_watcher_sees_partial_objects,
    watches_end_at_the_server_cap_and_events_arrive_promptly,
    dropped_watch_resumes_without_relisting,
);

const WAIT: Duration = Duration::from_secs(10);

fn start(family: Family) -> anyhow::Result<ApiServer> {
    let options = Options {
        bookmark_interval: Duration::from_millis(100),
        ..Options::default()
    };
    Ok(ApiServer::start_with(
        std::net::SocketAddr::new(family.loopback(), 0),
        options,
    )?)
}

async fn client(api: &ApiServer) -> anyhow::Result<Client> {
    let kubeconfig = Kubeconfig::read_from(api.kubeconfig())?;
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    Ok(Client::try_from(config)?)
}

fn cm(name: &str, app: &str, data: &str) -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": "demo", "labels": {"app": app}}, "data": {"v": data}})
}

/// What the watcher stream yielded, in order: `init`, `apply NAME`, `delete NAME`, `done`, `error`.
type Seen = Arc<Mutex<Vec<String>>>;

/// Runs a reflector over `api` with `config`; returns its store (ready) and the event log.
async fn reflect<K>(api: Api<K>, config: watcher::Config) -> anyhow::Result<(Store<K>, Seen)>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = reflector::store();
    let seen: Seen = Arc::default();
    let log = seen.clone();
    let stream = reflector::reflector(writer, watcher(api, config)).default_backoff();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(ev) = stream.next().await {
            let line = match ev {
                Ok(watcher::Event::Init) => "init".to_string(),
                Ok(watcher::Event::InitApply(o)) => format!("init-apply {}", o.name_any()),
                Ok(watcher::Event::InitDone) => "done".to_string(),
                Ok(watcher::Event::Apply(o)) => format!("apply {}", o.name_any()),
                Ok(watcher::Event::Delete(o)) => format!("delete {}", o.name_any()),
                Err(e) => format!("error {e}"),
            };
            log.lock().unwrap().push(line);
        }
    });
    tokio::time::timeout(WAIT, reader.wait_until_ready())
        .await
        .context("reflector never ready")??;
    Ok((reader, seen))
}

fn names<K: kube::Resource<DynamicType = ()> + Clone>(store: &Store<K>) -> Vec<String> {
    let mut names: Vec<String> = store.state().iter().map(|o| o.name_any()).collect();
    names.sort();
    names
}

fn seen(log: &Seen) -> Vec<String> {
    log.lock().unwrap().clone()
}

fn query_param(record: &RequestRecord, key: &str) -> Option<String> {
    record
        .query
        .split('&')
        .find_map(|p| p.strip_prefix(&format!("{key}=")).map(str::to_owned))
}

fn watches_of<'a>(records: &'a [RequestRecord], plural: &str) -> Vec<&'a RequestRecord> {
    records
        .iter()
        .filter(|r| r.is_watch() && r.path.ends_with(plural))
        .collect()
}

fn lists_of(records: &[RequestRecord], plural: &str) -> usize {
    records
        .iter()
        .filter(|r| r.method == "GET" && !r.is_watch() && r.path.ends_with(plural))
        .count()
}

async fn reflector_follows_adds_modifies_and_deletes(family: Family) -> anyhow::Result<()> {
    let api = start(family)?;
    for (name, app) in [("a", "web"), ("b", "web"), ("c", "other")] {
        api.apply(cm(name, app, "1"))?;
    }
    let cms: Api<ConfigMap> = Api::namespaced(client(&api).await?, "demo");
    let (store, log) = reflect(cms, watcher::Config::default().labels("app=web")).await?;
    ensure!(names(&store) == ["a", "b"], "{:?}", names(&store));
    api.apply(cm("d", "web", "1"))?;
    api.apply(cm("a", "web", "2"))?;
    api.apply(cm("b", "other", "1"))?; // leaves the selector: a DELETED for this watch
    api.apply(cm("c", "web", "1"))?; // enters it: an ADDED
    api.delete("v1", "ConfigMap", Some("demo"), "d")?;
    eventually("store follows", WAIT, || async {
        let a = store
            .get(&reflector::ObjectRef::new("a").within("demo"))
            .context("a")?;
        ensure!(
            a.data
                .as_ref()
                .and_then(|d| d.get("v"))
                .is_some_and(|v| v == "2"),
            "a not modified"
        );
        ensure!(names(&store) == ["a", "c"], "{:?}", names(&store));
        Ok(())
    })
    .await?;
    let log = seen(&log);
    for want in ["apply d", "apply a", "delete b", "apply c", "delete d"] {
        ensure!(log.iter().any(|l| l == want), "no {want:?} in {log:?}");
    }
    ensure!(!log.iter().any(|l| l.starts_with("error")), "{log:?}");
    Ok(())
}

async fn field_selected_watch_sees_only_tls_secrets(family: Family) -> anyhow::Result<()> {
    let api = start(family)?;
    let secret = |name: &str, type_: &str| json!({"apiVersion": "v1", "kind": "Secret", "type": type_, "metadata": {"name": name, "namespace": "demo"}});
    api.apply(secret("tls-1", "kubernetes.io/tls"))?;
    api.apply(secret("opaque-1", "Opaque"))?;
    let secrets: Api<Secret> = Api::all(client(&api).await?);
    let (store, _) = reflect(
        secrets,
        watcher::Config::default().fields("type=kubernetes.io/tls"),
    )
    .await?;
    ensure!(names(&store) == ["tls-1"]);
    api.apply(secret("opaque-2", "Opaque"))?;
    api.apply(secret("tls-2", "kubernetes.io/tls"))?;
    eventually("tls-2 arrives", WAIT, || async {
        ensure!(names(&store) == ["tls-1", "tls-2"], "{:?}", names(&store));
        Ok(())
    })
    .await
}

async fn bookmarks_advance_the_resource_version(family: Family) -> anyhow::Result<()> {
    let api = start(family)?;
    api.apply(cm("a", "web", "1"))?;
    let client = client(&api).await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "demo");
    // A raw watch sees BOOKMARKs carrying the global resourceVersion, even though no ConfigMap
    // changed: other kinds moved it.
    let start_rv = api.resource_version().to_string();
    let mut raw = cms
        .watch(&WatchParams::default().timeout(5), &start_rv)
        .await?
        .boxed();
    for i in 0..3 {
        api.apply(json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": format!("s{i}"), "namespace": "demo"}}))?;
    }
    let target = api.resource_version();
    let bookmark = tokio::time::timeout(WAIT, async {
        while let Some(ev) = raw.next().await {
            if let WatchEvent::Bookmark(b) = ev? {
                if b.metadata.resource_version.parse::<u64>()? >= target {
                    return anyhow::Ok(b.metadata.resource_version);
                }
            }
        }
        anyhow::bail!("watch ended without a bookmark")
    })
    .await??;
    ensure!(bookmark == target.to_string());

    // The watcher takes its resume point from bookmarks: with 1 s watches, its next watch
    // starts at the bookmarked resourceVersion although no ConfigMap event carried it.
    let (_store, _) = reflect(cms, watcher::Config::default().timeout(1)).await?;
    api.apply(json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "later", "namespace": "demo"}}))?;
    let target = api.resource_version();
    eventually("a watch resumes from the bookmark", WAIT, || async {
        let records = api.requests();
        let resumed = watches_of(&records, "configmaps")
            .into_iter()
            .filter_map(|r| query_param(r, "resourceVersion")?.parse::<u64>().ok())
            .any(|rv| rv >= target);
        ensure!(
            resumed,
            "no ConfigMap watch from resourceVersion {target} yet"
        );
        Ok(())
    })
    .await
}

async fn expired_history_relists_and_hides_the_delete(family: Family) -> anyhow::Result<()> {
    let api = start(family)?;
    for name in ["a", "b"] {
        api.apply(cm(name, "web", "1"))?;
    }
    let cms: Api<ConfigMap> = Api::namespaced(client(&api).await?, "demo");
    let (store, log) = reflect(cms, watcher::Config::default()).await?;
    ensure!(
        api.wait_for_watches(Some("configmaps"), 1, WAIT).await,
        "watch never opened"
    );
    // While no watch is connected: delete b, add c, and compact the history past both.
    api.with_store(|s| -> anyhow::Result<()> {
        s.drop_watches();
        s.delete_object("v1", "ConfigMap", Some("demo"), "b")?;
        s.apply(cm("c", "web", "1"))?;
        s.expire_history();
        Ok(())
    })?;
    eventually("relist converges", WAIT, || async {
        ensure!(names(&store) == ["a", "c"], "{:?}", names(&store));
        Ok(())
    })
    .await?;
    let log = seen(&log);
    ensure!(
        !log.iter().any(|l| l == "delete b"),
        "the gap's delete cannot be seen as an event: {log:?}"
    );
    ensure!(
        log.iter().filter(|l| *l == "init").count() == 2,
        "one relist expected: {log:?}"
    );
    // The expiry reached the client as a 200 watch (with the ERROR event), then a LIST.
    let records = api.requests();
    ensure!(lists_of(&records, "configmaps") >= 2, "{records:?}");
    ensure!(
        watches_of(&records, "configmaps")
            .iter()
            .all(|r| r.status == 200),
        "{records:?}"
    );
    Ok(())
}

async fn streaming_list_sends_initial_events(family: Family) -> anyhow::Result<()> {
    let api = start(family)?;
    for name in ["a", "b"] {
        api.apply(cm(name, "web", "1"))?;
    }
    let cms: Api<ConfigMap> = Api::namespaced(client(&api).await?, "demo");
    let (store, _) = reflect(cms, watcher::Config::default().streaming_lists()).await?;
    ensure!(names(&store) == ["a", "b"]);
    let records = api.requests();
    ensure!(
        lists_of(&records, "configmaps") == 0,
        "streaming lists do not LIST: {records:?}"
    );
    let watches = watches_of(&records, "configmaps");
    ensure!(
        watches
            .iter()
            .any(|r| query_param(r, "sendInitialEvents").as_deref() == Some("true")),
        "{records:?}"
    );
    api.apply(cm("c", "web", "1"))?;
    api.delete("v1", "ConfigMap", Some("demo"), "a")?;
    eventually("live events after the initial ones", WAIT, || async {
        ensure!(names(&store) == ["b", "c"], "{:?}", names(&store));
        Ok(())
    })
    .await
}

async fn metadata_watcher_sees_partial_objects(family: Family) -> anyhow::Result<()> {
    use kube::core::PartialObjectMeta;
    let api = start(family)?;
    api.apply(cm("a", "web", "1"))?;
    let cms: Api<ConfigMap> = Api::namespaced(client(&api).await?, "demo");
    let meta = cms.get_metadata("a").await?;
    ensure!(
        meta.types
            .as_ref()
            .is_some_and(|t| t.kind == "PartialObjectMetadata"),
        "{meta:?}"
    );
    ensure!(meta.metadata.labels.is_some_and(|l| l["app"] == "web"));
    let (reader, writer) = reflector::store::<PartialObjectMeta<ConfigMap>>();
    let metas: Api<PartialObjectMeta<ConfigMap>> = Api::namespaced(client(&api).await?, "demo");
    let stream =
        reflector::reflector(writer, watcher(metas, watcher::Config::default())).default_backoff();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while stream.next().await.is_some() {}
    });
    tokio::time::timeout(WAIT, reader.wait_until_ready())
        .await
        .context("never ready")??;
    api.apply(cm("b", "web", "1"))?;
    eventually("metadata of b arrives", WAIT, || async {
        let mut names: Vec<String> = reader.state().iter().map(|o| o.name_any()).collect();
        names.sort();
        ensure!(names == ["a", "b"], "{names:?}");
        Ok(())
    })
    .await
}

async fn watches_end_at_the_server_cap_and_events_arrive_promptly(
    family: Family,
) -> anyhow::Result<()> {
    let options = Options {
        bookmark_interval: Duration::from_secs(60),
        max_watch_timeout: Some(Duration::from_millis(300)),
        ..Options::default()
    };
    let api = ApiServer::start_with(std::net::SocketAddr::new(family.loopback(), 0), options)?;
    let cms: Api<ConfigMap> = Api::namespaced(client(&api).await?, "demo");
    let rv = api.resource_version().to_string();
    let opened = std::time::Instant::now();
    let mut stream = cms
        .watch(&WatchParams::default().timeout(290), &rv)
        .await?
        .boxed();
    ensure!(
        api.wait_for_watches(Some("configmaps"), 1, WAIT).await,
        "watch never opened"
    );
    let started = std::time::Instant::now();
    api.apply(cm("a", "web", "1"))?;
    let first = tokio::time::timeout(WAIT, stream.next())
        .await?
        .context("stream ended")??;
    let latency = started.elapsed();
    ensure!(
        matches!(&first, WatchEvent::Added(c) if c.name_any() == "a"),
        "{first:?}"
    );
    // The time is printed, not asserted: speed is for benchmarks. The event only has to come
    // on the open watch (within WAIT above), before the cap ends it.
    println!("{family}: apply to ADDED on the client in {latency:?}");
    // The client asked for 290 s; the server's 300 ms cap ends the response (cleanly) first:
    // not before the cap, and long before 290 s (the 10 s limit is 30 times the cap).
    let end = tokio::time::timeout(Duration::from_secs(10), stream.next())
        .await
        .context("watch outlived the cap")?;
    ensure!(end.is_none(), "{end:?}");
    let lasted = opened.elapsed();
    ensure!(
        lasted >= Duration::from_millis(300),
        "the watch ended before the 300 ms cap: {lasted:?}"
    );
    Ok(())
}

async fn dropped_watch_resumes_without_relisting(family: Family) -> anyhow::Result<()> {
    let api = start(family)?;
    api.apply(cm("a", "web", "1"))?;
    let cms: Api<ConfigMap> = Api::namespaced(client(&api).await?, "demo");
    let (store, log) = reflect(cms, watcher::Config::default()).await?;
    ensure!(
        api.wait_for_watches(Some("configmaps"), 1, WAIT).await,
        "watch never opened"
    );
    let last_rv = api.resource_version();
    api.drop_watches();
    api.apply(cm("b", "web", "1"))?;
    api.delete("v1", "ConfigMap", Some("demo"), "a")?;
    eventually("the resumed watch replays the history", WAIT, || async {
        ensure!(names(&store) == ["b"], "{:?}", names(&store));
        Ok(())
    })
    .await?;
    let records = api.requests();
    ensure!(
        lists_of(&records, "configmaps") == 1,
        "no relist after a dropped watch: {records:?}"
    );
    let resumed = watches_of(&records, "configmaps");
    ensure!(resumed.len() >= 2, "{records:?}");
    ensure!(
        query_param(resumed[1], "resourceVersion") == Some(last_rv.to_string()),
        "{:?}",
        resumed[1]
    );
    let log = seen(&log);
    ensure!(
        log.iter().any(|l| l == "delete a") && log.iter().any(|l| l == "apply b"),
        "{log:?}"
    );
    Ok(())
}
