//! The status of BackendTLSPolicies, written by the leader from the [`GatewayReport`] of the
//! live snapshot: one entry of `status.ancestors` per Gateway of ours whose routes use a Service
//! the policy targets, `controllerName` ours, with `Accepted` and `ResolvedRefs` carrying the
//! policy's `observedGeneration`. Entries of other controllers are kept; ours are removed from a
//! policy no route of ours uses any more. A policy is written only when its entries change; a
//! failed write is tried again after 5 s.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use kube::Client;
use serde_json::{json, Value};
use tokio::sync::watch;

use crate::gateway_api::conditions::dated;
use crate::gateway_api::report::{GatewayReport, PolicyReport};
use crate::gateway_api::{BackendTlsPolicy, GROUP};
use crate::object::NsName;

/// How long a failed write waits before the next try.
const RETRY: Duration = Duration::from_secs(5);

/// Starts the writer: while this replica leads, each new report is written.
pub fn spawn(
    client: Client,
    controller_name: String,
    mut report: watch::Receiver<Arc<GatewayReport>>,
    mut leading: watch::Receiver<bool>,
) {
    tokio::spawn(async move {
        let mut written: BTreeSet<NsName> = BTreeSet::new();
        loop {
            let mut failed = false;
            if *leading.borrow_and_update() {
                let current = report.borrow_and_update().clone();
                if let Err(error) =
                    write_all(&client, &controller_name, &current, &mut written).await
                {
                    tracing::warn!(%error, "BackendTLSPolicy status write failed; retrying");
                    failed = true;
                }
            }
            tokio::select! {
                changed = report.changed() => if changed.is_err() { return },
                changed = leading.changed() => if changed.is_err() { return },
                () = tokio::time::sleep(RETRY), if failed => {}
            }
        }
    });
}

/// Writes every policy of the report, and clears our entries from policies that left it.
async fn write_all(
    client: &Client,
    controller_name: &str,
    report: &GatewayReport,
    written: &mut BTreeSet<NsName>,
) -> Result<(), kube::Error> {
    for (key, policy) in &report.policies {
        write(client, controller_name, key, Some(policy)).await?;
        written.insert(key.clone());
    }
    let gone: Vec<NsName> = written
        .iter()
        .filter(|k| !report.policies.contains_key(k))
        .cloned()
        .collect();
    for key in gone {
        write(client, controller_name, &key, None).await?;
        written.remove(&key);
    }
    Ok(())
}

/// Writes one policy's entries (`None`: removes ours), when they changed.
async fn write(
    client: &Client,
    controller_name: &str,
    key: &NsName,
    policy: Option<&PolicyReport>,
) -> Result<(), kube::Error> {
    let resource = ApiResource::erase::<BackendTlsPolicy>(&());
    let api = Api::<DynamicObject>::namespaced_with(client.clone(), &key.namespace, &resource);
    let Some(object) = api.get_opt(&key.name).await? else {
        return Ok(());
    };
    let old: Vec<Value> = object.data["status"]["ancestors"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let ancestors = ancestors(controller_name, &old, policy, Timestamp::now());
    if ancestors == old {
        return Ok(());
    }
    let patch = Patch::Merge(json!({ "status": { "ancestors": ancestors } }));
    api.patch_status(&key.name, &PatchParams::default(), &patch)
        .await?;
    tracing::info!(policy = %key, "BackendTLSPolicy status written");
    Ok(())
}

/// `status.ancestors`: other controllers' entries as they are, then ours (the API allows 16).
pub fn ancestors(
    controller_name: &str,
    old: &[Value],
    policy: Option<&PolicyReport>,
    now: Timestamp,
) -> Vec<Value> {
    let ours = |p: &Value| p["controllerName"] == controller_name;
    let mut out: Vec<Value> = old.iter().filter(|p| !ours(p)).cloned().collect();
    for gateway in policy.into_iter().flat_map(|p| &p.ancestors) {
        if out.len() >= 16 {
            break;
        }
        let ancestor_ref = json!({
            "group": GROUP,
            "kind": "Gateway",
            "namespace": gateway.namespace,
            "name": gateway.name,
        });
        let previous: Vec<Condition> = old
            .iter()
            .filter(|p| ours(p) && p["ancestorRef"] == ancestor_ref)
            .filter_map(|p| serde_json::from_value(p["conditions"].clone()).ok())
            .next()
            .unwrap_or_default();
        let conditions = dated(
            policy.map_or(&[][..], |p| &p.conditions),
            policy.and_then(|p| p.generation),
            &previous,
            now,
        );
        out.push(json!({
            "ancestorRef": ancestor_ref,
            "controllerName": controller_name,
            "conditions": conditions,
        }));
    }
    out
}
