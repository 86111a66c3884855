//! Kubernetes mode end to end: which Ingresses are ours, each rule of the IngressClass contract
//! against the test API server, and an Ingress that stops being ours leaving the table with its
//! status cleared.

mod kube_support;

use conformance::manifests::{ingress_class, CONTROLLER};
use conformance::{Family, Fleet, Ingress, PodSpec};
use kube_support::*;
use serde_json::json;

fn default_class(name: &str, controller: &str) -> serde_json::Value {
    let mut class = ingress_class(name, controller);
    class["metadata"]["annotations"] =
        json!({"ingressclass.kubernetes.io/is-default-class": "true"});
    class
}

async fn class_rules(api_family: Family) -> anyhow::Result<()> {
    let api = api(api_family)?; // IngressClass duet -> our controller
    let pods = Fleet::start("kube", "web", &[PodSpec::dual("only")])?;
    apply(&api, &pods.manifests())?;
    apply(&api, &[ingress_class("nginx", "k8s.io/ingress-nginx")])?;
    let legacy = "kubernetes.io/ingress.class";
    apply(
        &api,
        &[
            // spec.ingressClassName naming an IngressClass with our controller: ours.
            Ingress::new("kube", "by-class")
                .host("by-class.test", "web")
                .build(),
            // ... naming someone else's IngressClass: not ours.
            Ingress::new("kube", "foreign")
                .class(Some("nginx"))
                .host("foreign.test", "web")
                .build(),
            // ... naming a class that has no IngressClass (even our --ingress-class): not ours.
            Ingress::new("kube", "no-object")
                .class(Some("edge"))
                .host("no-object.test", "web")
                .build(),
            // The legacy annotation naming our --ingress-class: ours; naming another: not.
            Ingress::new("kube", "legacy")
                .class(None)
                .annotation(legacy, "edge")
                .host("legacy.test", "web")
                .build(),
            Ingress::new("kube", "legacy-foreign")
                .class(None)
                .annotation(legacy, "nginx")
                .host("legacy-foreign.test", "web")
                .build(),
            // No class at all: ours only once our IngressClass is the default.
            Ingress::new("kube", "classless")
                .class(None)
                .host("classless.test", "web")
                .build(),
        ],
    )?;
    let duet = duet(
        &api,
        &[
            "--ingress-class",
            "edge",
            "--publish-status-address",
            "192.0.2.1,2001:db8::1",
        ],
    )
    .await?;
    until_status(&duet, "by-class.test", 200).await?;
    until_status(&duet, "legacy.test", 200).await?;
    for host in [
        "foreign.test",
        "no-object.test",
        "legacy-foreign.test",
        "classless.test",
    ] {
        until_status(&duet, host, 404).await?;
    }
    until_status_addresses(&api, "kube", "by-class", &["192.0.2.1", "2001:db8::1"]).await?;
    for name in ["foreign", "no-object", "legacy-foreign", "classless"] {
        assert!(
            status_addresses(&api, "kube", name).is_empty(),
            "{name} got status"
        );
    }

    // Our IngressClass becomes the cluster default: the classless Ingress is ours now.
    apply(&api, &[default_class("duet", CONTROLLER)])?;
    until_status(&duet, "classless.test", 200).await?;
    until_status_addresses(&api, "kube", "classless", &["192.0.2.1", "2001:db8::1"]).await?;
    // Someone else's default class does not make it ours.
    apply(
        &api,
        &[
            ingress_class("duet", CONTROLLER),
            default_class("nginx", "k8s.io/ingress-nginx"),
        ],
    )?;
    until_status(&duet, "classless.test", 404).await?;

    // An Ingress that stops being ours: routes gone, status cleared.
    apply(
        &api,
        &[Ingress::new("kube", "by-class")
            .class(Some("nginx"))
            .host("by-class.test", "web")
            .build()],
    )?;
    until_status(&duet, "by-class.test", 404).await?;
    until_status_addresses(&api, "kube", "by-class", &[]).await?;
    until_status_addresses(&api, "kube", "classless", &[]).await?;
    // An IngressClass that is created later takes effect too.
    apply(&api, &[ingress_class("edge", CONTROLLER)])?;
    until_status(&duet, "no-object.test", 200).await?;
    drop(duet);

    // --watch-ingress-without-class serves classless Ingresses without a default class.
    let all = kube_support::duet(&api, &["--watch-ingress-without-class"]).await?;
    until_status(&all, "classless.test", 200).await?;
    until_status(&all, "foreign.test", 404).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn class_rules_each_case_api_on_ipv4() -> anyhow::Result<()> {
    class_rules(Family::V4).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn class_rules_each_case_api_on_ipv6() -> anyhow::Result<()> {
    class_rules(Family::V6).await
}
