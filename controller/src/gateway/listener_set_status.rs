//! The status of ListenerSets whose parent is one of our Gateways, written by the leader from
//! the [`GatewayReport`] of the live snapshot (so status and serving never disagree): `Accepted`
//! and `Programmed` with the ListenerSet's `observedGeneration`, and per listener its
//! `supportedKinds`, `attachedRoutes` and conditions (`lastTransitionTime` kept while a
//! condition holds). A ListenerSet is written only when its status changes; a failed write is
//! tried again after 5 s.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::Client;
use serde_json::{json, Value};
use tokio::sync::watch;

use crate::gateway_api::conditions::dated;
use crate::gateway_api::listenersets::{
    ListenerSetStatus, ListenerSetStatusListeners, ListenerSetStatusListenersSupportedKinds,
};
use crate::gateway_api::report::{GatewayReport, ListenerSetReport};
use crate::gateway_api::{ListenerSet, GROUP};
use crate::object::NsName;

/// How long a failed write waits before the next try.
const RETRY: Duration = Duration::from_secs(5);

/// Starts the writer: while this replica leads, each new report is written.
pub fn spawn(
    client: Client,
    mut report: watch::Receiver<Arc<GatewayReport>>,
    mut leading: watch::Receiver<bool>,
) {
    tokio::spawn(async move {
        loop {
            let mut failed = false;
            if *leading.borrow_and_update() {
                let current = report.borrow_and_update().clone();
                for (key, set) in &current.listener_sets {
                    if let Err(error) = write(&client, key, set).await {
                        tracing::warn!(%error, listener_set = %key, "ListenerSet status write failed; retrying");
                        failed = true;
                    }
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

/// Writes one ListenerSet's status, when it changed.
async fn write(client: &Client, key: &NsName, set: &ListenerSetReport) -> Result<(), kube::Error> {
    let api = Api::<ListenerSet>::namespaced(client.clone(), &key.namespace);
    let Some(object) = api.get_opt(&key.name).await? else {
        return Ok(());
    };
    let old = object.status.clone().unwrap_or_default();
    let status = status(set, &old, Timestamp::now());
    if object.status.as_ref() == Some(&status) {
        return Ok(());
    }
    let body: Value = json!({ "status": status });
    api.patch_status(&key.name, &PatchParams::default(), &Patch::Merge(body))
        .await?;
    tracing::info!(listener_set = %key, "ListenerSet status written");
    Ok(())
}

/// The ListenerSet's status from its report (`old`: the conditions' transition times).
pub fn status(
    set: &ListenerSetReport,
    old: &ListenerSetStatus,
    now: Timestamp,
) -> ListenerSetStatus {
    let old_conditions = old.conditions.clone().unwrap_or_default();
    let listeners = set
        .listeners
        .iter()
        .map(|l| {
            let previous: Vec<Condition> = old
                .listeners
                .iter()
                .flatten()
                .find(|o| o.name == l.name)
                .map(|o| o.conditions.clone())
                .unwrap_or_default();
            ListenerSetStatusListeners {
                attached_routes: l.attached,
                conditions: dated(&l.conditions, set.generation, &previous, now),
                name: l.name.clone(),
                supported_kinds: Some(
                    l.kinds
                        .iter()
                        .map(|k| ListenerSetStatusListenersSupportedKinds {
                            group: Some(GROUP.to_owned()),
                            kind: (*k).to_owned(),
                        })
                        .collect(),
                ),
            }
        })
        .collect();
    ListenerSetStatus {
        conditions: Some(dated(&set.conditions, set.generation, &old_conditions, now)),
        listeners: Some(listeners),
    }
}
