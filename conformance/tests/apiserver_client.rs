//! The test API server driven by the unmodified kube 5 client over 127.0.0.1 and [::1]: CRUD,
//! selectors, paging, conflicts, status subresources, Leases, Events, retried 429/503 and the
//! `duet-apiserver` binary.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{ensure, Context};
use conformance::apiserver::ApiServer;
use conformance::Family;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, Service};
use k8s_openapi::api::networking::v1::Ingress;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use serde_json::json;

use conformance::both_families;

both_families!(
    kubeconfig_points_at_the_server,
    crud_and_conflicts,
    list_selectors_and_paging,
    status_subresource_merge_and_apply,
    lease_create_and_replace_conflict,
    events_in_both_apis,
    namespace_delete_takes_its_objects,
    discovery_and_dynamic_objects,
);

async fn client(api: &ApiServer) -> anyhow::Result<Client> {
    let kubeconfig = Kubeconfig::read_from(api.kubeconfig())?;
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    Ok(Client::try_from(config)?)
}

fn code(err: &kube::Error) -> Option<u16> {
    match err {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
}

fn meta(ns: &str, name: &str, labels: &[(&str, &str)]) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: Some(ns.into()),
        labels: Some(
            labels
                .iter()
                .map(|(k, v)| ((*k).into(), (*v).into()))
                .collect(),
        ),
        ..ObjectMeta::default()
    }
}

fn config_map(ns: &str, name: &str, labels: &[(&str, &str)]) -> ConfigMap {
    ConfigMap {
        metadata: meta(ns, name, labels),
        data: Some(BTreeMap::from([("k".to_string(), name.to_string())])),
        ..ConfigMap::default()
    }
}

async fn kubeconfig_points_at_the_server(family: Family) -> anyhow::Result<()> {
    let api = ApiServer::start(family.loopback())?;
    let text = std::fs::read_to_string(api.kubeconfig())?;
    let want = match family {
        Family::V4 => format!("server: http://127.0.0.1:{}", api.addr().port()),
        Family::V6 => format!("server: http://[::1]:{}", api.addr().port()),
    };
    ensure!(text.contains(&want), "kubeconfig lacks {want:?}:\n{text}");
    let client = client(&api).await?;
    let version = client.apiserver_version().await?;
    ensure!(version.major == "1", "{version:?}");
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let names: Vec<String> = namespaces
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .collect();
    ensure!(
        names.contains(&"default".to_string()) && names.contains(&"kube-system".to_string()),
        "{names:?}"
    );
    // Discovery documents parse as the client's own types.
    let groups = client.list_api_groups().await?;
    ensure!(
        groups.groups.iter().any(|g| g.name == "networking.k8s.io"),
        "{groups:?}"
    );
    let core = client.list_core_api_resources("v1").await?;
    ensure!(
        core.resources
            .iter()
            .any(|r| r.name == "services/status" && r.namespaced),
        "{core:?}"
    );
    let net = client
        .list_api_group_resources("networking.k8s.io/v1")
        .await?;
    ensure!(
        net.resources
            .iter()
            .any(|r| r.name == "ingressclasses" && !r.namespaced),
        "{net:?}"
    );
    Ok(())
}

async fn crud_and_conflicts(family: Family) -> anyhow::Result<()> {
    let api = ApiServer::start(family.loopback())?;
    let client = client(&api).await?;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some("demo".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    namespaces.create(&PostParams::default(), &ns).await?;

    // A namespace must exist first, as in a real cluster.
    let elsewhere: Api<ConfigMap> = Api::namespaced(client.clone(), "nowhere");
    let err = elsewhere
        .create(&PostParams::default(), &config_map("nowhere", "a", &[]))
        .await
        .unwrap_err();
    ensure!(code(&err) == Some(404), "{err:?}");

    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "demo");
    let created = cms
        .create(&PostParams::default(), &config_map("demo", "a", &[]))
        .await?;
    let m = &created.metadata;
    ensure!(m.uid.as_deref().is_some_and(|u| u.len() == 36), "{m:?}");
    ensure!(
        m.creation_timestamp.is_some() && m.resource_version.is_some(),
        "{m:?}"
    );
    let err = cms
        .create(&PostParams::default(), &config_map("demo", "a", &[]))
        .await
        .unwrap_err();
    ensure!(code(&err) == Some(409), "duplicate create: {err:?}");
    ensure!(
        matches!(&err, kube::Error::Api(s) if s.reason == "AlreadyExists"),
        "{err:?}"
    );

    // Replace with the current resourceVersion succeeds; with a stale one it is a 409 Conflict.
    let mut changed = created.clone();
    changed.data = Some(BTreeMap::from([("k".to_string(), "v2".to_string())]));
    let replaced = cms.replace("a", &PostParams::default(), &changed).await?;
    ensure!(replaced.metadata.resource_version != created.metadata.resource_version);
    let err = cms
        .replace("a", &PostParams::default(), &changed)
        .await
        .unwrap_err();
    ensure!(
        matches!(&err, kube::Error::Api(s) if s.code == 409 && s.reason == "Conflict"),
        "{err:?}"
    );
    ensure!(cms.get("a").await?.data == changed.data);

    // generation moves with the spec only.
    let services: Api<Service> = Api::namespaced(client.clone(), "demo");
    let svc: Service = serde_json::from_value(json!({
        "metadata": {"name": "web"}, "spec": {"ports": [{"port": 80}]}
    }))?;
    let svc = services.create(&PostParams::default(), &svc).await?;
    ensure!(svc.metadata.generation == Some(1));
    let mut more = svc.clone();
    more.metadata.labels = Some(BTreeMap::from([("a".into(), "b".into())]));
    let more = services
        .replace("web", &PostParams::default(), &more)
        .await?;
    ensure!(more.metadata.generation == Some(1), "{:?}", more.metadata);
    let mut spec = more.clone();
    spec.spec
        .as_mut()
        .context("spec")?
        .ports
        .as_mut()
        .context("ports")?[0]
        .port = 81;
    let spec = services
        .replace("web", &PostParams::default(), &spec)
        .await?;
    ensure!(spec.metadata.generation == Some(2), "{:?}", spec.metadata);

    // Merge patch of the main resource; a patch carrying a stale resourceVersion conflicts.
    let patched = cms
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"x": "y"}})),
        )
        .await?;
    ensure!(
        patched.data.as_ref().is_some_and(|d| d.len() == 2),
        "{patched:?}"
    );
    let stale = Patch::Merge(
        json!({"metadata": {"resourceVersion": created.metadata.resource_version}, "data": {"x": "z"}}),
    );
    let err = cms
        .patch("a", &PatchParams::default(), &stale)
        .await
        .unwrap_err();
    ensure!(code(&err) == Some(409), "{err:?}");
    let err = cms.get("missing").await.unwrap_err();
    ensure!(
        matches!(&err, kube::Error::Api(s) if s.code == 404 && s.reason == "NotFound"),
        "{err:?}"
    );

    // Delete, then it is gone; a second delete is a 404.
    cms.delete("a", &DeleteParams::default()).await?;
    ensure!(code(&cms.get("a").await.unwrap_err()) == Some(404));
    ensure!(code(&cms.delete("a", &DeleteParams::default()).await.unwrap_err()) == Some(404));

    // Dry runs answer as the write would, and change nothing.
    let dry = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let rv_before = api.resource_version();
    let would = cms.create(&dry, &config_map("demo", "dry", &[])).await?;
    ensure!(would.metadata.uid.is_some(), "{would:?}");
    ensure!(code(&cms.get("dry").await.unwrap_err()) == Some(404));
    let survivor = cms
        .create(&PostParams::default(), &config_map("demo", "survivor", &[]))
        .await?;
    cms.delete(
        "survivor",
        &DeleteParams {
            dry_run: true,
            ..DeleteParams::default()
        },
    )
    .await?;
    let kept = cms.get("survivor").await?;
    ensure!(kept.metadata.resource_version == survivor.metadata.resource_version);
    ensure!(
        api.resource_version() == rv_before + 1,
        "only the real create moved the resourceVersion"
    );

    // Finalizers hold a deletion until they are removed.
    let mut held = config_map("demo", "held", &[]);
    held.metadata.finalizers = Some(vec!["duet.dev/test".into()]);
    cms.create(&PostParams::default(), &held).await?;
    cms.delete("held", &DeleteParams::default()).await?;
    let pending = cms.get("held").await?;
    ensure!(
        pending.metadata.deletion_timestamp.is_some(),
        "{:?}",
        pending.metadata
    );
    cms.patch(
        "held",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await?;
    ensure!(code(&cms.get("held").await.unwrap_err()) == Some(404));
    Ok(())
}

async fn list_selectors_and_paging(family: Family) -> anyhow::Result<()> {
    let api = ApiServer::start(family.loopback())?;
    let client = client(&api).await?;
    for (ns, name, labels) in [
        ("a", "web", vec![("app", "web"), ("tier", "front")]),
        ("a", "api", vec![("app", "api"), ("tier", "back")]),
        ("b", "web", vec![("app", "web")]),
        ("b", "db", vec![("tier", "back")]),
    ] {
        let labels: serde_json::Map<String, serde_json::Value> = labels
            .into_iter()
            .map(|(k, v)| (k.into(), v.into()))
            .collect();
        api.apply(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": ns, "labels": labels}}))?;
    }
    let all: Api<ConfigMap> = Api::all(client.clone());
    let names = |list: kube::core::ObjectList<ConfigMap>| -> Vec<String> {
        list.items
            .into_iter()
            .map(|c| {
                format!(
                    "{}/{}",
                    c.metadata.namespace.unwrap_or_default(),
                    c.metadata.name.unwrap_or_default()
                )
            })
            .collect()
    };
    let cases: [(&str, &[&str]); 8] = [
        ("app=web", &["a/web", "b/web"]),
        ("app==web,tier=front", &["a/web"]),
        ("app!=web", &["a/api", "b/db"]),
        ("tier", &["a/api", "a/web", "b/db"]),
        ("!tier", &["b/web"]),
        ("app in (api,web),tier", &["a/api", "a/web"]),
        ("app notin (web)", &["a/api", "b/db"]),
        ("app=nothing", &[]),
    ];
    for (selector, want) in cases {
        let list = all.list(&ListParams::default().labels(selector)).await?;
        ensure!(
            !list
                .metadata
                .resource_version
                .as_deref()
                .unwrap_or("")
                .is_empty(),
            "list without resourceVersion"
        );
        ensure!(names(list) == want, "labelSelector {selector}");
    }
    let list = all
        .list(&ListParams::default().fields("metadata.name=web"))
        .await?;
    ensure!(names(list) == ["a/web", "b/web"]);
    let list = all
        .list(&ListParams::default().fields("metadata.namespace=b,metadata.name!=web"))
        .await?;
    ensure!(names(list) == ["b/db"]);
    let in_b: Api<ConfigMap> = Api::namespaced(client.clone(), "b");
    ensure!(names(in_b.list(&ListParams::default().labels("app")).await?) == ["b/web"]);
    let err = all
        .list(&ListParams::default().fields("spec.nodeName=x"))
        .await
        .unwrap_err();
    ensure!(
        matches!(&err, kube::Error::Api(s) if s.code == 400 && s.reason == "BadRequest"),
        "{err:?}"
    );

    // Secrets are selectable by type.
    for (name, type_) in [("tls", "kubernetes.io/tls"), ("opaque", "Opaque")] {
        api.apply(json!({"apiVersion": "v1", "kind": "Secret", "type": type_, "metadata": {"name": name, "namespace": "a"}}))?;
    }
    let secrets: Api<Secret> = Api::all(client.clone());
    let tls = secrets
        .list(&ListParams::default().fields("type=kubernetes.io/tls"))
        .await?;
    ensure!(tls.items.len() == 1 && tls.items[0].metadata.name.as_deref() == Some("tls"));

    // limit/continue pages through everything, once each.
    let mut seen = Vec::new();
    let mut params = ListParams::default().limit(3);
    let mut pages = 0;
    loop {
        let page = all.list(&params).await?;
        pages += 1;
        let token = page.metadata.continue_.clone();
        seen.extend(names(page));
        match token {
            Some(t) if !t.is_empty() => params = params.continue_token(&t),
            _ => break,
        }
    }
    ensure!(
        pages == 2 && seen == ["a/api", "a/web", "b/db", "b/web"],
        "{pages} pages: {seen:?}"
    );
    Ok(())
}

async fn status_subresource_merge_and_apply(family: Family) -> anyhow::Result<()> {
    let api = ApiServer::start(family.loopback())?;
    let client = client(&api).await?;
    api.apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "demo"}}))?;
    let ingresses: Api<Ingress> = Api::namespaced(client.clone(), "demo");
    // Status in a create is dropped, as for every kind with a status subresource.
    let ing: Ingress = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {"ingressClassName": "duet", "defaultBackend": {"service": {"name": "web", "port": {"number": 80}}}},
        "status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.1"}]}}
    }))?;
    let ing = ingresses.create(&PostParams::default(), &ing).await?;
    ensure!(
        ing.status
            .as_ref()
            .and_then(|s| s.load_balancer.as_ref())
            .and_then(|l| l.ingress.as_ref())
            .is_none(),
        "{:?}",
        ing.status
    );

    let addresses =
        json!({"status": {"loadBalancer": {"ingress": [{"ip": "127.0.0.1"}, {"ip": "::1"}]}}});
    let patched = ingresses
        .patch_status("web", &PatchParams::default(), &Patch::Merge(&addresses))
        .await?;
    let ips = |i: &Ingress| -> Vec<String> {
        i.status
            .as_ref()
            .and_then(|s| s.load_balancer.as_ref())
            .and_then(|l| l.ingress.as_ref())
            .map(|v| v.iter().filter_map(|e| e.ip.clone()).collect())
            .unwrap_or_default()
    };
    ensure!(
        ips(&patched) == ["127.0.0.1", "::1"],
        "{:?}",
        patched.status
    );
    ensure!(
        patched.metadata.generation == Some(1),
        "status writes do not bump generation"
    );
    // The same patch again changes nothing: no new resourceVersion.
    let again = ingresses
        .patch_status("web", &PatchParams::default(), &Patch::Merge(&addresses))
        .await?;
    ensure!(again.metadata.resource_version == patched.metadata.resource_version);
    // A write to the main resource keeps the stored status; a status write keeps the spec.
    let mut spec_change = again.clone();
    spec_change.status = None;
    spec_change
        .spec
        .as_mut()
        .context("spec")?
        .ingress_class_name = Some("other".into());
    let replaced = ingresses
        .replace("web", &PostParams::default(), &spec_change)
        .await?;
    ensure!(ips(&replaced) == ["127.0.0.1", "::1"] && replaced.metadata.generation == Some(2));
    let spec_via_status = Patch::Merge(json!({"spec": {"ingressClassName": "sneaky"}}));
    let kept = ingresses
        .patch_status("web", &PatchParams::default(), &spec_via_status)
        .await?;
    ensure!(kept.spec.and_then(|s| s.ingress_class_name).as_deref() == Some("other"));

    // Server-side apply on the status subresource (kube sends JSON; a fieldManager is required).
    let apply = json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
        "status": {"loadBalancer": {"ingress": [{"ip": "::1"}]}}
    });
    let applied = ingresses
        .patch_status(
            "web",
            &PatchParams::apply("duet").force(),
            &Patch::Apply(&apply),
        )
        .await?;
    ensure!(ips(&applied) == ["::1"], "{:?}", applied.status);
    // Strategic merge is accepted too (treated as a merge).
    let strategic = Patch::Strategic(json!({"metadata": {"labels": {"s": "t"}}}));
    let labelled = ingresses
        .patch("web", &PatchParams::default(), &strategic)
        .await?;
    ensure!(labelled
        .metadata
        .labels
        .is_some_and(|l| l.get("s").is_some_and(|v| v == "t")));

    // Service status (LoadBalancer addresses) through the same subresource.
    let services: Api<Service> = Api::namespaced(client.clone(), "demo");
    let svc: Service = serde_json::from_value(
        json!({"metadata": {"name": "lb"}, "spec": {"type": "LoadBalancer"}}),
    )?;
    services.create(&PostParams::default(), &svc).await?;
    let lb = json!({"status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.7"}, {"ip": "2001:db8::7"}, {"hostname": "lb.example"}]}}});
    services
        .patch_status("lb", &PatchParams::default(), &Patch::Merge(&lb))
        .await?;
    let stored = api
        .get("v1", "Service", Some("demo"), "lb")
        .context("stored")?;
    ensure!(stored["status"] == lb["status"], "{stored}");
    // Server-side apply creates a missing object.
    let created = services
        .patch("applied", &PatchParams::apply("duet"), &Patch::Apply(json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "applied"}, "spec": {"ports": [{"port": 8080}]}})))
        .await?;
    ensure!(created.metadata.uid.is_some());
    let err = services
        .patch("applied", &PatchParams::default(), &Patch::Apply(json!({})))
        .await
        .unwrap_err();
    ensure!(
        code(&err) == Some(400),
        "apply without fieldManager: {err:?}"
    );
    Ok(())
}

fn lease(holder: &str, meta: ObjectMeta, transitions: i32) -> Lease {
    let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
    Lease {
        metadata: meta,
        spec: Some(LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: Some(15),
            acquire_time: Some(now.clone()),
            renew_time: Some(now),
            lease_transitions: Some(transitions),
            ..LeaseSpec::default()
        }),
    }
}

async fn lease_create_and_replace_conflict(family: Family) -> anyhow::Result<()> {
    let api = ApiServer::start(family.loopback())?;
    api.apply(
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "duet-system"}}),
    )?;
    let a: Api<Lease> = Api::namespaced(client(&api).await?, "duet-system");
    let b: Api<Lease> = Api::namespaced(client(&api).await?, "duet-system");
    let named = ObjectMeta {
        name: Some("duet-leader".into()),
        ..ObjectMeta::default()
    };
    ensure!(a.get_opt("duet-leader").await?.is_none());
    // Both try to create: one wins, the other gets AlreadyExists.
    let won = a
        .create(&PostParams::default(), &lease("a", named.clone(), 0))
        .await?;
    let err = b
        .create(&PostParams::default(), &lease("b", named.clone(), 0))
        .await
        .unwrap_err();
    ensure!(
        matches!(&err, kube::Error::Api(s) if s.code == 409 && s.reason == "AlreadyExists"),
        "{err:?}"
    );
    // b reads the lease, a renews meanwhile, b's takeover with the old resourceVersion conflicts.
    let seen_by_b = b.get("duet-leader").await?;
    let renewed = a
        .replace(
            "duet-leader",
            &PostParams::default(),
            &lease("a", won.metadata.clone(), 0),
        )
        .await?;
    ensure!(renewed
        .spec
        .as_ref()
        .and_then(|s| s.renew_time.as_ref())
        .is_some());
    let err = b
        .replace(
            "duet-leader",
            &PostParams::default(),
            &lease("b", seen_by_b.metadata.clone(), 1),
        )
        .await
        .unwrap_err();
    ensure!(
        matches!(&err, kube::Error::Api(s) if s.code == 409 && s.reason == "Conflict"),
        "{err:?}"
    );
    // With a fresh read the takeover goes through, and the times round-trip as MicroTime.
    let fresh = b.get("duet-leader").await?;
    let taken = b
        .replace(
            "duet-leader",
            &PostParams::default(),
            &lease("b", fresh.metadata.clone(), 1),
        )
        .await?;
    let spec = taken.spec.context("spec")?;
    ensure!(spec.holder_identity.as_deref() == Some("b") && spec.lease_transitions == Some(1));
    let stored = api
        .get(
            "coordination.k8s.io/v1",
            "Lease",
            Some("duet-system"),
            "duet-leader",
        )
        .context("stored")?;
    let renew = stored["spec"]["renewTime"].as_str().context("renewTime")?;
    ensure!(
        renew.len() == "2026-01-01T00:00:00.000000Z".len(),
        "MicroTime has 6 fractional digits: {renew}"
    );
    Ok(())
}

async fn events_in_both_apis(family: Family) -> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::ObjectReference;
    use kube::runtime::events::{Event, EventType, Recorder, Reporter};
    let api = ApiServer::start(family.loopback())?;
    api.apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "demo"}}))?;
    let client = client(&api).await?;
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "duet".into(),
            instance: Some("duet-0".into()),
        },
    );
    let reference = ObjectReference {
        api_version: Some("networking.k8s.io/v1".into()),
        kind: Some("Ingress".into()),
        name: Some("web".into()),
        namespace: Some("demo".into()),
        uid: Some("0e5f1a52-0000-4000-8000-000000000001".into()),
        ..ObjectReference::default()
    };
    let event = Event {
        type_: EventType::Warning,
        reason: "MissingService".into(),
        note: Some("service demo/web not found".into()),
        action: "Translate".into(),
        secondary: None,
    };
    recorder.publish(&event, &reference).await?;
    // The same event again becomes a series patch of the stored one.
    recorder.publish(&event, &reference).await?;
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), "demo");
    let list = events.list(&ListParams::default()).await?;
    ensure!(list.items.len() == 1, "{:?}", list.items);
    let ev = &list.items[0];
    ensure!(
        ev.reason.as_deref() == Some("MissingService")
            && ev.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("web")
    );
    ensure!(
        ev.series.as_ref().is_some_and(|s| s.count == 2),
        "{:?}",
        ev.series
    );
    let by_reason = events
        .list(&ListParams::default().fields("reason=MissingService,regarding.name=web"))
        .await?;
    ensure!(by_reason.items.len() == 1);

    // The core v1 Event API, with a generated name.
    let core: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(client, "demo");
    let ev: k8s_openapi::api::core::v1::Event = serde_json::from_value(json!({
        "metadata": {"generateName": "web."},
        "involvedObject": {"kind": "Ingress", "name": "web", "namespace": "demo"},
        "reason": "Sync", "message": "synced", "type": "Normal"
    }))?;
    let created = core.create(&PostParams::default(), &ev).await?;
    let name = created.metadata.name.context("name")?;
    ensure!(
        name.starts_with("web.") && name.len() == "web.".len() + 5,
        "{name}"
    );
    let listed = core
        .list(&ListParams::default().fields("involvedObject.name=web"))
        .await?;
    ensure!(listed.items.len() == 1);
    Ok(())
}

async fn namespace_delete_takes_its_objects(family: Family) -> anyhow::Result<()> {
    let api = ApiServer::start(family.loopback())?;
    let client = client(&api).await?;
    for ns in ["doomed", "kept"] {
        api.apply(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": ns}}))?;
    }
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .delete("doomed", &DeleteParams::default())
        .await?;
    ensure!(namespaces.get_opt("doomed").await?.is_none());
    let all: Api<ConfigMap> = Api::all(client);
    let left: Vec<_> = all
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter_map(|c| c.metadata.namespace)
        .collect();
    ensure!(left == ["kept"], "{left:?}");
    Ok(())
}

async fn discovery_and_dynamic_objects(family: Family) -> anyhow::Result<()> {
    use kube::api::DynamicObject;
    use kube::discovery::{Discovery, Scope};
    let api = ApiServer::start(family.loopback())?;
    let client = client(&api).await?;
    for aggregated in [false, true] {
        let discovery = Discovery::new(client.clone());
        let discovery = if aggregated {
            discovery.run_aggregated().await?
        } else {
            discovery.run().await?
        };
        let groups: Vec<String> = discovery.groups().map(|g| g.name().to_owned()).collect();
        for want in [
            "",
            "apps",
            "networking.k8s.io",
            "coordination.k8s.io",
            "rbac.authorization.k8s.io",
            "policy",
            "monitoring.coreos.com",
        ] {
            ensure!(
                groups.iter().any(|g| g == want),
                "aggregated={aggregated}: no group {want:?} in {groups:?}"
            );
        }
        let (ingress, caps) = discovery
            .groups()
            .flat_map(|g| g.resources_by_stability())
            .find(|(r, _)| r.kind == "Ingress")
            .context("Ingress discovered")?;
        ensure!(
            ingress.plural == "ingresses" && caps.scope == Scope::Namespaced,
            "{ingress:?} {caps:?}"
        );
        ensure!(
            caps.subresources
                .iter()
                .any(|(s, _)| s.plural == "ingresses/status" || s.plural == "status"),
            "{caps:?}"
        );
    }
    // Install what a chart renders through the dynamic API, as a Helm-style client would.
    let discovery = Discovery::new(client.clone()).run().await?;
    let manifests = [
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ingress-duet"}}),
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "duet", "namespace": "ingress-duet"}}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "duet"},
            "rules": [{"apiGroups": [""], "resources": ["services"], "verbs": ["get", "list", "watch"]}]}),
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "duet", "namespace": "ingress-duet"},
            "spec": {"selector": {"matchLabels": {"app": "duet"}}, "template": {"metadata": {"labels": {"app": "duet"}}, "spec": {"containers": [{"name": "duet", "image": "duet"}]}}}}),
        json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "duet", "namespace": "ingress-duet"}, "spec": {"minAvailable": 1}}),
        json!({"apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor", "metadata": {"name": "duet", "namespace": "ingress-duet"}, "spec": {}}),
    ];
    for manifest in manifests {
        let obj: DynamicObject = serde_json::from_value(manifest)?;
        let types = obj.types.clone().context("types")?;
        let (group, version) = types
            .api_version
            .rsplit_once('/')
            .unwrap_or(("", types.api_version.as_str()));
        let gvk = kube::core::GroupVersionKind::gvk(group, version, &types.kind);
        let (resource, caps) = discovery
            .resolve_gvk(&gvk)
            .with_context(|| format!("{gvk:?} not discovered"))?;
        let dynamic: Api<DynamicObject> = match caps.scope {
            Scope::Namespaced => Api::namespaced_with(
                client.clone(),
                obj.metadata.namespace.as_deref().context("ns")?,
                &resource,
            ),
            Scope::Cluster => Api::all_with(client.clone(), &resource),
        };
        let created = dynamic.create(&PostParams::default(), &obj).await?;
        ensure!(
            created.metadata.uid.is_some() && created.types == obj.types,
            "{created:?}"
        );
    }
    ensure!(api
        .get("apps/v1", "Deployment", Some("ingress-duet"), "duet")
        .is_some());
    // Collections can be deleted in one call.
    let accounts: Api<k8s_openapi::api::core::v1::ServiceAccount> =
        Api::namespaced(client.clone(), "ingress-duet");
    accounts
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await?;
    ensure!(accounts
        .list(&ListParams::default())
        .await?
        .items
        .is_empty());
    Ok(())
}

/// The binary: prints its URL, writes the kubeconfig where asked, serves the kube client and
/// a bad flag exits 64.
#[tokio::test]
async fn binary_serves_both_families() -> anyhow::Result<()> {
    use tokio::io::{AsyncBufReadExt, BufReader};
    for family in Family::BOTH {
        let dir = tempfile::tempdir()?;
        let kubeconfig = dir.path().join("kubeconfig");
        let listen = match family {
            Family::V4 => "127.0.0.1:0",
            Family::V6 => "[::1]:0",
        };
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_duet-apiserver"))
            .args(["--listen", listen, "--kubeconfig"])
            .arg(&kubeconfig)
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let mut lines = BufReader::new(child.stdout.take().context("stdout")?).lines();
        let first = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
            .await??
            .context("no output")?;
        let url = first
            .strip_prefix("listening on ")
            .context(first.clone())?
            .to_owned();
        ensure!(
            url.starts_with(if family == Family::V6 {
                "http://[::1]:"
            } else {
                "http://127.0.0.1:"
            }),
            "{url}"
        );
        let config = Config::from_custom_kubeconfig(
            Kubeconfig::read_from(&kubeconfig)?,
            &KubeConfigOptions::default(),
        )
        .await?;
        let client = Client::try_from(config)?;
        let namespaces: Api<Namespace> = Api::all(client.clone());
        namespaces.get("default").await?;
        child.kill().await?;
    }
    // A bad flag exits 64 with one line.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_duet-apiserver"))
        .args(["--listen", "nonsense"])
        .output()?;
    ensure!(out.status.code() == Some(64), "{out:?}");
    let stderr = String::from_utf8(out.stderr)?;
    ensure!(
        stderr.lines().count() == 1 && stderr.starts_with("duet-apiserver: "),
        "{stderr:?}"
    );
    Ok(())
}
