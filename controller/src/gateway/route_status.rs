//! The status of HTTPRoutes, GRPCRoutes and TLSRoutes attached to our Gateways, written by the leader from
//! the [`GatewayReport`] of the live snapshot (so status and serving never disagree): one entry
//! of `status.parents` per parentRef naming one of our Gateways, `controllerName` ours, with
//! `Accepted` and `ResolvedRefs` carrying the route's `observedGeneration` (their
//! `lastTransitionTime` kept while a condition holds). Entries of other controllers are kept;
//! ours are removed from a route that no longer names our Gateways. A route is written only when
//! its entries change; a failed write is tried again after 5 s.

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
use crate::gateway_api::httproutes::HttpRouteStatusParentsParentRef;
use crate::gateway_api::report::{GatewayReport, ParentReport, RouteReport};
use crate::gateway_api::{GrpcRoute, HttpRoute, TlsRoute};
use crate::object::{Kind, NsName};

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
        let mut written: BTreeSet<(Kind, NsName)> = BTreeSet::new();
        loop {
            let mut failed = false;
            if *leading.borrow_and_update() {
                let current = report.borrow_and_update().clone();
                let writer = Writer {
                    client: &client,
                    controller_name: &controller_name,
                };
                if let Err(error) = writer.write_all(&current, &mut written).await {
                    tracing::warn!(%error, "Route status write failed; retrying");
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

struct Writer<'a> {
    client: &'a Client,
    controller_name: &'a str,
}

impl Writer<'_> {
    /// Writes every route of the report, and clears our entries from routes that left it.
    async fn write_all(
        &self,
        report: &GatewayReport,
        written: &mut BTreeSet<(Kind, NsName)>,
    ) -> Result<(), kube::Error> {
        for ((kind, key), route) in &report.routes {
            self.write(*kind, key, Some(route)).await?;
            written.insert((*kind, key.clone()));
        }
        let gone: Vec<(Kind, NsName)> = written
            .iter()
            .filter(|k| !report.routes.contains_key(k))
            .cloned()
            .collect();
        for (kind, key) in gone {
            self.write(kind, &key, None).await?;
            written.remove(&(kind, key));
        }
        Ok(())
    }

    /// Writes one route's entries (`None`: removes ours), when they changed.
    async fn write(
        &self,
        kind: Kind,
        key: &NsName,
        route: Option<&RouteReport>,
    ) -> Result<(), kube::Error> {
        let resource = match kind {
            Kind::GrpcRoute => ApiResource::erase::<GrpcRoute>(&()),
            Kind::TlsRoute => ApiResource::erase::<TlsRoute>(&()),
            _ => ApiResource::erase::<HttpRoute>(&()),
        };
        let api =
            Api::<DynamicObject>::namespaced_with(self.client.clone(), &key.namespace, &resource);
        let Some(object) = api.get_opt(&key.name).await? else {
            return Ok(());
        };
        let old: Vec<Value> = object.data["status"]["parents"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let parents = self.parents(&old, route, Timestamp::now());
        if parents == old {
            return Ok(());
        }
        let patch = Patch::Merge(json!({ "status": { "parents": parents } }));
        api.patch_status(&key.name, &PatchParams::default(), &patch)
            .await?;
        tracing::info!(kind = %kind, route = %key, "Route status written");
        Ok(())
    }

    /// `status.parents`: other controllers' entries as they are, then ours.
    fn parents(&self, old: &[Value], route: Option<&RouteReport>, now: Timestamp) -> Vec<Value> {
        let ours = |p: &Value| p["controllerName"] == self.controller_name;
        let mut parents: Vec<Value> = old.iter().filter(|p| !ours(p)).cloned().collect();
        for parent in route.into_iter().flat_map(|r| &r.parents) {
            let parent_ref = parent_ref(parent);
            let previous: Vec<Condition> = old
                .iter()
                .filter(|p| ours(p) && p["parentRef"] == parent_ref)
                .filter_map(|p| serde_json::from_value(p["conditions"].clone()).ok())
                .next()
                .unwrap_or_default();
            let conditions = dated(
                &[parent.accepted.clone(), parent.resolved.clone()],
                route.and_then(|r| r.generation),
                &previous,
                now,
            );
            parents.push(json!({
                "parentRef": parent_ref,
                "controllerName": self.controller_name,
                "conditions": conditions,
            }));
        }
        parents
    }
}

/// A parentRef as the route wrote it, as JSON.
fn parent_ref(parent: &ParentReport) -> Value {
    let w = &parent.parent_ref;
    serde_json::to_value(HttpRouteStatusParentsParentRef {
        group: w.group.clone(),
        kind: w.kind.clone(),
        name: w.name.clone(),
        namespace: w.namespace.clone(),
        port: w.port,
        section_name: w.section_name.clone(),
    })
    .unwrap_or(Value::Null)
}
